"""Text shared by every view: number and unit formatting, column layout, argument checks.

* :mod:`.units` — times, counts, FLOPs, bytes, shapes; ``printable`` for names from models.
* :mod:`.layout` — columns fitted to a terminal width, colour on or off.
* :mod:`.checks` — the checks of a view's arguments, each error naming the argument.
"""
from __future__ import annotations

__all__: tuple[str, ...] = ()
