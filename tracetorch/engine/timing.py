"""How a profile times calls: the host clock, a device clock read later, and the timeline.

The hot path reads ``collector.clock`` twice per call and, in the common case (host clock, no
timeline, no call hooks: ``plain_timing``; the C wrapper reads ``plain_clock``), appends the
duration itself. Everything else goes through :meth:`CallTiming.add_duration`: a device clock's
readings are handles resolved at the next fold (one synchronisation, see
:mod:`tracetorch.adapters.torch.cuda`), and a timeline keeps one capped event per call for the
Chrome trace. Either way the call's counter is bumped after (see
:func:`tracetorch.engine.hotpath.count_call`), which lists the node in
:attr:`CallTiming.touched` at its key's first call since the last fold, so that a step folds the
nodes that ran and no others.

Example:
    >>> from tracetorch.records.tree import CallNode
    >>> timing = CallTiming(clock=lambda: 0, timeline=True, max_events=1)
    >>> node = CallNode.root().child("fc", "Linear", "m0")
    >>> timing.add_duration(node, 10, 25); timing.add_duration(node, 30, 40)
    >>> node.time.count, len(timing.events), timing.dropped_events
    (2, 1, 1)
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from tracetorch.records.tree import CallNode

__all__ = ("CallTiming", "CallHooks", "Clock")

#: An integer-nanosecond clock (``time.perf_counter_ns`` unless a profile is given another).
Clock = Callable[[], int]


class CallTiming:
    """The clocks, deferred device readings and timeline events of one profile."""

    def __init__(self, clock: Clock | None = None, timeline: bool = False,
                 max_events: int = 100_000) -> None:
        self.clock: Clock = clock if clock is not None else time.perf_counter_ns
        #: The clock of steps, backward passes and the timeline (host time even when calls use a
        #: device clock).
        self.host_clock: Clock = self.clock
        #: ``(node, start, end)`` readings of a device clock, turned into times by
        #: :meth:`resolve_times` at each fold; ``None`` while calls are timed on the host.
        self.deferred: list[tuple[CallNode, int, int]] | None = None
        self.device_clock: Any = None
        self.events: list[tuple[CallNode, int, int, int]] | None = [] if timeline else None
        #: With a timeline, the spans of backward work charged to each layer (host clock), in
        #: the same form: the node is the layer whose forward made the gradients.
        self.backward_events: list[tuple[CallNode, int, int, int]] | None = (
            [] if timeline else None)
        #: The name of each thread whose calls are in :attr:`events`, by ident.
        self.thread_names: dict[int, str] = {}
        # Host clock, no timeline and no call hooks: the wrapper appends durations itself (the
        # common case).
        self.plain_timing = self.events is None
        #: Whether the profile takes calls now (:meth:`set_active`).
        self.active = False
        #: What the C hot path reads first on each call: ``clock`` while the profile takes calls
        #: and times them plainly, else ``None`` (the call then goes the Python way).
        self.plain_clock: Clock | None = None
        self.max_events = max_events
        self.dropped_events = 0
        #: Whether gradient work is charged to layers now (and its spans kept): off between the
        #: sampled steps of ``profile(backward_every=K)`` (:mod:`~tracetorch.engine.
        #: backward_sampling`).
        self.backward_on = True
        #: The nodes that ran (or were charged backward work) since the last fold, each once.
        self.touched: list[CallNode] = []
        #: What runs right before and after each layer call's clock readings (NVTX ranges,
        #: device memory readings: :class:`CallHooks`); ``None`` costs the hot path one test.
        self.call_hooks: CallHooks | None = None

    def add_call_hook(self, enter: Callable[[CallNode], None],
                      exit: Callable[[CallNode], None]) -> None:
        """Run ``enter(node)`` before each layer call's start is read and ``exit(node)`` after
        its end is read, so their own cost stays out of the call's time."""
        if self.call_hooks is None:
            self.call_hooks = CallHooks()
        self.call_hooks.add(enter, exit)
        self.plain_timing = False
        self._refresh_plain_clock()

    def use_device_clock(self, device_clock: Any) -> None:
        """Time calls with ``device_clock`` (see :mod:`tracetorch.adapters.torch.cuda`): its
        readings are handles, ``device_clock.resolve(spans)`` later yields
        ``(node, elapsed_ns, host_start_ns)`` for each ``(node, start, end)`` span."""
        if self.device_clock is None:
            self.device_clock = device_clock
            self.clock = device_clock
            self.deferred = []
            self.plain_timing = False
            self._refresh_plain_clock()

    def set_active(self, active: bool) -> None:
        """Take calls from now on, or stop taking them."""
        self.active = active
        self._refresh_plain_clock()

    def _refresh_plain_clock(self) -> None:
        # Derived from active, plain_timing and clock; kept as one attribute for the C wrapper.
        self.plain_clock = self.clock if self.active and self.plain_timing else None

    def resolve_times(self) -> None:
        """Fold the device-timed calls recorded since the last fold into their nodes."""
        deferred = self.deferred
        if not deferred:
            return
        self.deferred = []
        for node, elapsed, host_start in self.device_clock.resolve(deferred):
            node.time.add(elapsed)
            if self.events is not None:
                self.add_event(node, host_start, host_start + elapsed)

    def add_event(self, node: CallNode, start: int, end: int) -> None:
        """Keep one call for the Chrome trace, up to ``max_events``."""
        events = self.events
        assert events is not None
        if len(events) < self.max_events:
            thread = threading.get_ident()
            events.append((node, start, end, thread))
            if thread not in self.thread_names:  # named as the trace's rows will be
                self.thread_names[thread] = threading.current_thread().name
        else:
            self.dropped_events += 1

    def add_backward_span(self, node: CallNode, start: int, end: int) -> None:
        """Keep one span of ``node``'s backward work for the Chrome trace (with a timeline, up to
        ``max_events`` with the calls); a span that continues the last one of the same layer in
        this thread extends it."""
        spans = self.backward_events
        if spans is None or end <= start or not self.backward_on:
            return
        thread = threading.get_ident()
        if spans:
            last = spans[-1]
            if last[0] is node and last[3] == thread and last[2] <= start:
                spans[-1] = (node, last[1], end, thread)
                return
        if len(spans) + len(self.events or ()) < self.max_events:
            spans.append((node, start, end, thread))
        else:
            self.dropped_events += 1

    def move_events(self, source: CallNode, mapping: dict[CallNode, CallNode] | None) -> None:
        """Point the timeline events of the recording ``source`` at the nodes ``mapping`` merged
        them into, or drop them (``None``: the recording was not kept, a schedule's wait or
        warm-up step): every event of the profile's timeline names a node of its tree."""
        if not self.events and not self.backward_events:
            return
        moved = mapping if mapping is not None else dict.fromkeys(source.walk())
        for events in (self.events, self.backward_events):
            if not events:
                continue
            kept = []
            for event in events:
                if event[0] in moved:
                    target = moved[event[0]]
                    if target is not None:
                        kept.append((target, event[1], event[2], event[3]))
                else:
                    kept.append(event)
            events[:] = kept  # in place: the profile holds these lists as its timelines

    def touch(self, node: CallNode) -> None:
        """Have the next fold fold ``node`` (and its ancestors): it ran, or was charged work,
        since the last one. The hot path touches a node at the first call of each of its keys
        since the last fold (its counter leaves 0), so a node may be listed more than once:
        the fold takes each once."""
        self.touched.append(node)

    def take_touched(self) -> list[CallNode]:
        """The nodes touched since the last call, and a fresh list for the next ones."""
        touched, self.touched = self.touched, []
        return touched

    def add_duration(self, node: CallNode, start: int, end: int) -> None:
        """Time one call: a device clock's readings wait for the next fold, a timeline keeps
        the event. (Without either, the wrapper inlines the plain case: ``plain_timing``.)"""
        if self.deferred is not None:
            self.deferred.append((node, start, end))
            return
        node.time.add(end - start)
        if self.events is not None:
            self.add_event(node, start, end)

    def record_failure(self, node: CallNode, start: int, end: int) -> None:
        """A call that raised: it counts with its time and the operations it completed (no rule
        runs without an output)."""
        node.errors += 1
        self.touch(node)  # (no counter of a call that raised is bumped)
        self.add_duration(node, start, end)


class CallHooks:
    """Functions run at the start and end of every layer call of one profile, in order (their
    ends in reverse), e.g. an NVTX range and a device memory reading.

    Example:
        >>> hooks, seen = CallHooks(), []
        >>> hooks.add(lambda n: seen.append(("in", n)), lambda n: seen.append(("out", n)))
        >>> hooks.enter("fc"); hooks.exit("fc"); seen
        [('in', 'fc'), ('out', 'fc')]
    """

    def __init__(self) -> None:
        self._enters: list[Callable[[Any], None]] = []
        self._exits: list[Callable[[Any], None]] = []

    def add(self, enter: Callable[[Any], None], exit: Callable[[Any], None]) -> None:
        """Run ``enter`` at each call's start and ``exit`` at its end."""
        self._enters.append(enter)
        self._exits.insert(0, exit)

    def enter(self, node: Any) -> None:
        """A call of ``node`` starts."""
        for enter in self._enters:
            enter(node)

    def exit(self, node: Any) -> None:
        """A call of ``node`` ended (returned or raised)."""
        for exit in self._exits:
            exit(node)
