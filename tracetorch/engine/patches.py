"""Installing and removing the wrapt wrappers, exactly and under a lock.

Patches go in when the first profile starts and come out when the last one ends, so code run
outside every profile pays nothing. Only a class that *defines* the attribute is patched (found
through its MRO), and restoring puts back the very object that was there, so afterwards
``vars(cls)["forward"] is original`` holds and a subclass that merely inherited ``forward``
never gains a copy of it.

Example:
    >>> class Layer:
    ...     def forward(self, x):
    ...         return x
    >>> original = vars(Layer)["forward"]
    >>> board = PatchBoard()
    >>> board.acquire([PatchTarget(Layer, "forward", "module")])
    >>> vars(Layer)["forward"] is original
    False
    >>> board.release()
    >>> vars(Layer)["forward"] is original
    True
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

import wrapt

from tracetorch.engine.hotpath import make_wrapper

__all__ = ("BOARD", "PatchTarget", "PatchBoard", "defining_class", "is_instrumented", "mark_instrumented")


class PatchTarget(NamedTuple):
    """An attribute to wrap: ``cls.attr`` recorded as a node of ``kind``."""

    cls: type
    attr: str
    kind: str


def defining_class(cls: type, attr: str) -> Optional[type]:
    """The class in ``cls``'s MRO whose own ``__dict__`` holds ``attr`` (``None`` if none)."""
    for klass in cls.__mro__:
        if attr in vars(klass):
            return None if klass is object else klass
    return None


def mark_instrumented(wrapper: wrapt.FunctionWrapper) -> wrapt.FunctionWrapper:
    """Tag a wrapper as tracetorch's so that nothing wraps it a second time."""
    wrapper._self_tracetorch = True
    return wrapper


def is_instrumented(value: Any) -> bool:
    """Whether ``value`` is already a tracetorch wrapper (installed here or by ``instrument``)."""
    return isinstance(value, wrapt.FunctionWrapper) and getattr(value, "_self_tracetorch", False)


class PatchBoard:
    """Reference-counted patches: the first :meth:`acquire` opens, the last :meth:`release`
    restores every original and runs the registered cleanups."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._users = 0
        self._originals: Dict[Tuple[type, str], Any] = {}
        self._cleanups: List[Callable[[], None]] = []

    @property
    def active(self) -> bool:
        """Whether any profile currently holds the patches."""
        return self._users > 0

    def acquire(self, targets: Iterable[PatchTarget],
                on_first: Optional[Callable[[], List[Callable[[], None]]]] = None) -> None:
        """Register one more user and wrap ``targets`` not wrapped yet.

        ``on_first`` runs when this is the first user; the callables it returns run when the last
        user releases (in reverse order). If anything fails, everything done here is undone.
        """
        with self._lock:
            self._users += 1
            try:
                if self._users == 1 and on_first is not None:
                    self._cleanups.extend(on_first())
                for target in targets:
                    self.patch(target)
            except BaseException:
                self.release()
                raise

    def patch(self, target: PatchTarget) -> None:
        """Wrap one attribute now (a no-op if it is wrapped or no profile is active)."""
        with self._lock:
            if not self._users:
                return
            cls, attr, kind = target
            key = (cls, attr)
            if key in self._originals or attr not in vars(cls):
                return
            original = vars(cls)[attr]
            if is_instrumented(original) or not callable(original):
                return
            wrapper = mark_instrumented(wrapt.FunctionWrapper(original, make_wrapper(kind)))
            setattr(cls, attr, wrapper)
            self._originals[key] = original

    def add_cleanups(self, cleanups: List[Callable[[], None]]) -> None:
        """Run ``cleanups`` when the last user releases (for adapters started late)."""
        with self._lock:
            if self._users:
                self._cleanups.extend(cleanups)
            else:
                for cleanup in reversed(cleanups):
                    cleanup()

    def release(self) -> None:
        """One user fewer; the last one puts every original back and runs the cleanups."""
        with self._lock:
            if self._users == 0:
                return
            self._users -= 1
            if self._users:
                return
            errors: List[BaseException] = []
            for (cls, attr), original in reversed(list(self._originals.items())):
                try:
                    setattr(cls, attr, original)
                except BaseException as exc:  # keep restoring the rest, report after
                    errors.append(exc)
            self._originals.clear()
            cleanups, self._cleanups = self._cleanups, []
            for cleanup in reversed(cleanups):
                try:
                    cleanup()
                except BaseException as exc:
                    errors.append(exc)
            if errors:
                raise errors[0]

    def patched(self) -> Dict[Tuple[type, str], Any]:
        """A snapshot of what is wrapped now, with the originals (for tests and debugging)."""
        with self._lock:
            return dict(self._originals)


#: The one board every profile in the process shares.
BOARD = PatchBoard()
