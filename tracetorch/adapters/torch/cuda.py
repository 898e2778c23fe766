"""Device time on CUDA, without a device synchronisation at every layer.

**Policy.** When a profile is entered and CUDA is initialised in the process (the model or its
data has been put on a GPU), every layer call is timed with a pair of CUDA events recorded on
the current stream at its start and end, instead of the host clock. Nothing waits for the GPU
while the model runs: the events are read when the profile folds — at each ``prof.step()`` and
at the end of the block — after one ``synchronize()`` of the last event. A call's time is then
the span of the GPU timeline between its two events: the device time of the work it launched,
plus any gap in which the GPU waited for the host. Work that runs on the host only while the
GPU idles is timed at about its host duration. Step times and the timeline's start points stay
on the host clock.

Backward passes of such a profile are timed the same way: an event where the autograd node
being executed changes layer, read once when the pass returns (one synchronisation per backward
pass). A profile timed on the host (``TRACETORCH_CUDA_TIMING=host``, an injected ``clock``,
``timing=False``) times its backward passes with that same clock.

A block that never calls ``prof.step()`` folds early, with one wait, whenever 200,000 events
are pending. Each event costs a few µs of host time to record, so small layers cost more to
profile on GPU than on CPU. The CPU path pays nothing for any of this: without CUDA
initialised no event is ever made and the engine only checks that no device clock is set.
``TRACETORCH_CUDA_TIMING=host`` keeps the host clock on a GPU machine (the times are then launch
times, as for any Python profiler).

Example:
    >>> cuda_timing_wanted()  # no GPU initialised here
    False
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from typing import Any, Callable

import torch

__all__ = ("EventClock", "BackwardEventTimer", "cuda_timing_wanted", "backward_timer",
           "configure")

EventFactory = Callable[[], Any]


def _cuda_event() -> Any:
    return torch.cuda.Event(enable_timing=True)


def cuda_timing_wanted() -> bool:
    """Whether calls should be timed with CUDA events (see the module docstring)."""
    if os.environ.get("TRACETORCH_CUDA_TIMING", "").lower() == "host":
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # pragma: no cover - a broken CUDA install means host timing
        return False


class EventClock:
    """A clock whose readings are handles of recorded device events.

    ``event_factory`` makes an event with ``record()`` and ``elapsed_time(other)`` (in ms) and
    ``synchronize()``; CUDA events by default, a fake one in tests.
    """

    #: Events held before the clock asks its profile to fold times early (one wait then).
    MAX_PENDING = 200_000

    def __init__(self, event_factory: EventFactory | None = None,
                 on_full: Callable[[], None] | None = None) -> None:
        self._factory = event_factory or _cuda_event
        self._events: dict[int, tuple[Any, int]] = {}
        self._pool: list[Any] = []
        self._next = 0
        self._lock = threading.Lock()
        self._last: Any = None
        self.on_full = on_full

    def __call__(self) -> int:
        event = self._pool.pop() if self._pool else self._factory()
        event.record()
        with self._lock:
            handle = self._next
            self._next = handle + 1
            self._events[handle] = (event, time.perf_counter_ns())
            self._last = event
        if len(self._events) > self.MAX_PENDING and self.on_full is not None:
            self.on_full()  # a block that never steps: bound the events held
        return handle

    def resolve(self, spans: Iterable[tuple[Any, int, int]]) -> list[tuple[Any, int, int]]:
        """``(node, elapsed_ns, host_start_ns)`` for each ``(node, start, end)`` span, after
        waiting once for the last event recorded."""
        spans = list(spans)
        if not spans:
            return []
        with self._lock:
            last = self._last
        if last is not None:
            last.synchronize()
        out = []
        events = self._events
        for node, start, end in spans:
            first, second = events.pop(start, None), events.pop(end, None)
            if first is None or second is None:
                continue
            try:
                elapsed = int(round(first[0].elapsed_time(second[0]) * 1e6))
            except Exception:  # events of two devices: fall back to the host duration
                elapsed = second[1] - first[1]
            out.append((node, max(0, elapsed), first[1]))
            self._pool.append(first[0])
            self._pool.append(second[0])
        return out


class BackwardEventTimer:
    """Spans of a backward pass: an event each time the executing node changes layer."""

    def __init__(self, event_factory: EventFactory | None = None) -> None:
        self._factory = event_factory or _cuda_event
        self._spans: dict[int, list[tuple[Any, Any]]] = {}

    def mark(self, tag: Any) -> None:
        """An operation of layer call ``tag`` is about to run (on this thread's stream)."""
        spans = self._spans.setdefault(threading.get_ident(), [])
        if spans and spans[-1][0] is tag:
            return
        event = self._factory()
        event.record()
        spans.append((tag, event))

    def resolve(self) -> list[tuple[Any, int]]:
        """``(tag, elapsed_ns)`` per span, after one synchronisation at the end of the pass."""
        out: list[tuple[Any, int]] = []
        for spans in self._spans.values():
            if not spans:
                continue
            end = self._factory()
            end.record()
            end.synchronize()
            stops = [event for _, event in spans[1:]] + [end]
            for (tag, start), stop in zip(spans, stops):
                try:
                    out.append((tag, max(0, int(round(start.elapsed_time(stop) * 1e6)))))
                except Exception:
                    continue
        self._spans.clear()
        return out


def backward_timer(collector: Any) -> BackwardEventTimer | None:
    """A device timer for one backward pass of a profile that times its calls on the device
    (see :func:`configure`), else ``None``: the pass is then timed with the profile's own clock.
    """
    return BackwardEventTimer() if getattr(collector, "device_clock", None) is not None else None


def configure(collector: Any, event_factory: EventFactory | None = None) -> bool:
    """Give a profile being entered an event clock, if CUDA timing applies and the profile
    times calls with the real host clock (``timing=False`` and injected clocks are left alone).
    Returns whether it did."""
    if getattr(collector, "device_clock", None) is not None:
        return True
    if collector.clock is not time.perf_counter_ns:
        return False
    if event_factory is None and not cuda_timing_wanted():
        return False
    collector.use_device_clock(EventClock(event_factory, on_full=collector.resolve_times))
    return True
