"""Backward attribution on sampled steps only: ``profile(backward_every=K)``.

Between its sampled steps such a profile turns its collector's ``backward_on`` off: the
collector then charges no gradient work to layers (:meth:`~tracetorch.engine.collector.
Collector.add_backward`, which every framework's backward goes through), and, while any profile
is between sampled steps, the engine's exit observer (torch's marking of autograd nodes, the
per-call cost of backward attribution) is gated by :func:`_marking_now`: a call is marked only
if the profile recording it attributes backward work now. The innermost profile decides, in
its own context; other threads' profiles keep marking. When no profile skips, the framework's
own gate (torch's grad mode, read by the engine anyway) is back and sampling costs nothing.

Example:
    >>> from tracetorch.engine.collector import Collector
    >>> from tracetorch.records.tree import CallNode
    >>> collector = Collector(CallNode.root(), model=None)
    >>> skip(collector); collector.backward_on
    False
    >>> resume(collector); collector.backward_on
    True
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

from tracetorch.engine.hotpath import innermost_frame, set_exit_observer

if TYPE_CHECKING:
    from tracetorch.engine.collector import Collector

__all__ = ("skip", "resume")

#: Collectors between sampled steps now (one count per open recording that skips).
_skipping = 0
#: The framework's own gate, put back when no profile skips any more.
_framework_gate: Callable[[], bool] | None = None
# Profiles in several threads may step at once (once per step: the lock costs nothing).
_lock = threading.Lock()


def _marking_now() -> bool:
    # Called by the engine before its exit observer; the frame is the caller's: the profile
    # that records the call decides.
    frame = innermost_frame()
    if frame is not None and not frame.collector.backward_on:
        return False
    return _framework_gate() if _framework_gate is not None else True


def skip(collector: Collector) -> None:
    """Stop attributing backward work to ``collector``'s layers until :func:`resume`."""
    global _skipping, _framework_gate
    collector.backward_on = False
    with _lock:
        _skipping += 1
        if _skipping == 1:
            observer, gate = set_exit_observer(None)
            if observer is not None:
                _framework_gate = gate
                set_exit_observer(observer, _marking_now)
            else:  # nothing marks (no torch): keep it that way
                set_exit_observer(observer, gate)


def resume(collector: Collector) -> None:
    """Attribute backward work to ``collector``'s layers again."""
    global _skipping, _framework_gate
    collector.backward_on = True
    with _lock:
        _skipping = max(0, _skipping - 1)
        if _skipping == 0:
            observer, gate = set_exit_observer(None)
            # Put the framework's gate back unless someone installed their own since.
            set_exit_observer(observer, _framework_gate if gate is _marking_now else gate)
            _framework_gate = None
