"""Room on Python's stack for the profiler's own frames, so a deep model that runs plainly also
runs inside a profile.

Every recorded layer call passes through wrapt's wrapper and tracetorch's (and, at the layer's
first call, the Python code that names its node): a few frames more per level of nesting than
the plain call, which Python's recursion limit counts. A model nested 200 modules deep, which
runs plainly under the default limit of 1,000, would hit it inside a profile. So, once the call
tree reaches :data:`LEND_FROM_DEPTH` levels, the recursion limit is raised by
:data:`FRAMES_PER_LEVEL` per level (plus :data:`MARGIN`), and put back when the last profile
closes, unless someone else changed it meanwhile (then theirs stays). Shallower models never
touch it.

Example:
    >>> import sys
    >>> room = StackRoom(PatchBoard())
    >>> before = sys.getrecursionlimit()
    >>> room.make_room(3)          # shallow: nothing lent
    >>> sys.getrecursionlimit() == before
    True
"""
from __future__ import annotations

import sys
import threading

from tracetorch.engine.patches import BOARD, PatchBoard

__all__ = ("FRAMES_PER_LEVEL", "LEND_FROM_DEPTH", "MARGIN", "STACK_ROOM", "StackRoom")

#: Frames lent per level of the call tree: the most tracetorch adds to one layer call (wrapt's
#: wrapper, tracetorch's, its Python fallback at a first call, a re-entered ``super().forward``).
FRAMES_PER_LEVEL = 4
#: The depth from which room is lent: below it the profiler's frames fit in any stack that has
#: room for the model at all.
LEND_FROM_DEPTH = 32
#: Frames lent once, for the naming and counting a layer's first call runs at the deepest level.
MARGIN = 64


class StackRoom:
    """The recursion limit lent to the open profiles: raised as their trees deepen, put back
    by :meth:`give_back`."""

    def __init__(self, board: PatchBoard) -> None:
        #: Gives the limit back when its last profile closes.
        self.board = board
        self._lock = threading.Lock()
        self._base: int | None = None  # the limit before the first loan
        self._set: int | None = None  # the limit set by the last loan

    def make_room(self, depth: int) -> None:
        """Make room for recorded calls ``depth`` levels deep (while a profile is open: the
        board gives the limit back when the last one closes)."""
        if depth < LEND_FROM_DEPTH:
            return
        with self._lock:
            current = sys.getrecursionlimit()
            if self._set is not None and current != self._set:
                return  # changed by someone else since our loan: theirs, untouched
            base = current if self._base is None else self._base
            wanted = base + FRAMES_PER_LEVEL * depth + MARGIN
            if wanted <= current:
                return
            sys.setrecursionlimit(wanted)
            first = self._base is None
            self._base, self._set = base, wanted
        if first:
            self.board.add_cleanups([self.give_back])

    def give_back(self) -> None:
        """Put the limit back as it was before the loan (unless changed since by someone else)."""
        with self._lock:
            base, lent = self._base, self._set
            self._base = self._set = None
            if base is None or sys.getrecursionlimit() != lent:
                return
            try:
                sys.setrecursionlimit(base)
            except RecursionError:  # the stack is deeper than the old limit right now: keep it
                pass


#: The one loan of the process (the recursion limit is the interpreter's).
STACK_ROOM = StackRoom(BOARD)
