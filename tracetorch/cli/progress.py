"""A one-line progress display on stderr, rewritten in place, silent when stderr is not a terminal.

Progress must never end up in a log file or a pipe, where ``\\r`` rewrites turn into one long
garbled line, so the line is only drawn when the stream is an interactive terminal.

Example:
    >>> import io
    >>> line = ProgressLine(io.StringIO())   # not a terminal: nothing is written
    >>> line.show("step 1/8  loss 2.303")
    >>> line.clear()
    >>> line.enabled
    False
"""
from __future__ import annotations

import sys
from typing import TextIO

from tracetorch.text.units import printable

__all__ = ("ProgressLine",)


class ProgressLine:
    """A status line that each :meth:`show` overwrites and :meth:`clear` erases.

    Args:
        stream: where to draw; ``sys.stderr`` (looked up at construction) by default.
        enabled: force drawing on or off; by default, drawn only when ``stream.isatty()``.

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> line = ProgressLine(out, enabled=True)
        >>> line.show("step 1/2"); line.show("step 2/2"); line.clear()
        >>> out.getvalue() == "\\rstep 1/2\\rstep 2/2\\r        \\r"
        True
    """

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self._width = 0

    def show(self, text: str) -> None:
        """Replace the current line with ``text`` (its control and bidi characters escaped)."""
        if not self.enabled:
            return
        text = printable(text)
        # Pad with spaces so a shorter line fully covers the longer one it replaces.
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = max(self._width, len(text))

    def clear(self) -> None:
        """Erase the line, leaving the cursor at its start for whatever is printed next."""
        if not self.enabled or not self._width:
            return
        self.stream.write("\r" + " " * self._width + "\r")
        self.stream.flush()
        self._width = 0
