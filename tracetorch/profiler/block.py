"""``tracetorch.profile``: the context manager (and decorator) users wrap their code in.

Example:
    >>> import numpy as np
    >>> import tracetorch
    >>> from tracetorch.core import Linear, ReLU, Sequential, Tensor
    >>> model = Sequential(Linear(4, 8), ReLU(), Linear(8, 2))
    >>> with tracetorch.profile(model) as prof:
    ...     _ = model(Tensor(np.ones((3, 4))))
    >>> prof.find("layers.0").flops          # 2 * 4 * 8 * 3 rows
    192
"""
from __future__ import annotations

import time
from contextvars import Token
from typing import Any, Callable, TypeVar

from tracetorch.adapters import AdapterSet
from tracetorch.analysis.machine import Machine
from tracetorch.engine import backward_sampling
from tracetorch.engine.collector import Collector
from tracetorch.engine.fold import clear_recorded, merge_tree
from tracetorch.engine.hotpath import (
    Frame,
    all_threads_collector,
    close_root,
    current_frame,
    open_root,
    record_all_threads,
)
from tracetorch.engine.notes import add_notes
from tracetorch.engine.patches import BOARD
from tracetorch.flops.registry import FlopRegistry, default_registry
from tracetorch.models.introspect import is_layer
from tracetorch.profiler.runinfo import run_facts
from tracetorch.profiler.schedule import Phase, schedule
from tracetorch.records.phases import StepPhases
from tracetorch.records.result import ProfileResult
from tracetorch.records.tree import CallNode
from tracetorch.records.views import view

__all__ = ("ADAPTERS", "profile")

F = TypeVar("F", bound=Callable[..., Any])

#: The framework adapters each opening starts on the process's one patch board (a profile's,
#: a count's: see .counting).
ADAPTERS = AdapterSet(BOARD)


class profile(ProfileResult):
    """Record every layer call made inside the block: calls, FLOPs and time, as a tree.

    Args:
        model: optional; its path names the tree (``layers.0``) and, for a duck-typed model,
            its classes are the ones wrapped. ``tracetorch.core`` and torch layers are wrapped
            whether or not a model is given.
        timing: ``False`` records calls and FLOPs without reading the clock.
        timeline: keep one event per call (capped at ``max_events``) for
            :meth:`export_chrome_trace`.
        max_events: the cap on timeline events; calls beyond it are counted as dropped.
        flop_rules: ``{LayerType: rule}`` overrides for this profile only.
        clock: an integer-nanosecond clock (tests inject a fake one).
        warn_unsupported: warn once per layer type that has no FLOP rule.
        schedule: a :class:`tracetorch.profiler.schedule` choosing which steps (marked with
            :meth:`step`) are recorded; without one every step is.
        all_threads: also record calls made in other threads (each thread under a
            ``thread <name>`` node); by default a profile sees only its own thread/context.
        isolated: opened inside another profile, keep what this one records to itself
            (``count_flops`` uses it); by default the enclosing profile receives it on exit.
        ops: count the tensor operations run inside layers that have no FLOP rule (custom
            layers, functional code). ``False`` keeps rules only, for the lowest overhead: no
            torch function mode is active inside layers (see ``benchmarks/overhead_torch.py``).
        memory: record each layer's bytes read, written and saved for backward (``node.memory``,
            :mod:`tracetorch.records.memory`); ``False`` skips it (no sizes, no graph reading).
        params: count each layer's parameters (``node.params``, one walk of the model per
            opening); ``False`` leaves them 0 (``count_flops``, which reads only FLOPs).
        op_timing: also time each tensor operation of the layers' op tables
            (``prof.find(path).op_table()``; torch operations, in layers without a FLOP rule).
        nvtx: on CUDA, push an NVTX range named by its call path around each layer call, so
            Nsight Systems shows the layers (nothing without CUDA).
        machine: the peaks the bottleneck report measures layers against: a
            :class:`tracetorch.Machine`, or ``"calibrate"`` for this machine's cached (else
            measured, a few seconds) peaks for the model's framework, device and dtype. Kept in
            ``meta["machine"]``, so a saved profile keeps the peaks it used.
        gather: in a ``torch.distributed`` job, merge every rank's profile on rank 0 when the
            block exits (every rank must exit it): ``True`` over the process group, or a path
            where rank 0 writes the merged profile and each rank its own beside it (the way
            when the group is gone by then). The clocks are aligned by a barrier on entry.
            The merged profile is ``prof.merged`` on rank 0; see :mod:`tracetorch.distributed`.
        collectives: in a distributed job, record collectives (bytes, time, bandwidth) through
            a dispatch mode, which costs every tensor operation microseconds; ``False`` skips it.
        backward_every: attribute backward work to layers on one recorded step in this many
            (the first, then every K-th: 0, K, 2K...), which spares torch's marking of layer
            outputs on the others; 1 (the default) is exact. A step ends at :meth:`step` (call
            it at the end of each step); a block without one is one step. Forward figures and
            backward passes' own times stay exact; layers' backward figures come from the
            sampled steps, and the backward totals (``backward_flops``, ``total_flops``, MFU)
            are scaled by steps / sampled steps, which ``meta["backward_sampling"]`` records.

    On exit every patched attribute is restored exactly, also when the block raises; the
    exception passes through unchanged and what ran before it stays recorded. A profile may be
    entered again after it exits and keeps accumulating; used as a decorator, each call of the
    decorated function is one step.

    Example:
        >>> import tracetorch
        >>> with tracetorch.profile() as prof:
        ...     pass
        >>> prof.total_flops
        0
    """

    def __init__(self, model: Any = None, *, timing: bool = True, timeline: bool = False,
                 max_events: int = 100_000,
                 flop_rules: dict[type, Any] | None = None,
                 clock: Callable[[], int] | None = None,
                 warn_unsupported: bool = True,
                 schedule: schedule | None = None, all_threads: bool = False,
                 isolated: bool = False, ops: bool = True, memory: bool = True,
                 params: bool = True, op_timing: bool = False, nvtx: bool = False,
                 machine: Machine | str | None = None, gather: bool | str | None = None,
                 collectives: bool = True, backward_every: int = 1) -> None:
        if model is not None and not (is_layer(model) or callable(model)):
            raise TypeError(f"model must be a layer (an object with a forward method) or None, "
                            f"got {type(model).__name__}")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be a positive int, got {max_events!r}")
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be a callable returning nanoseconds, got {clock!r}")
        if isinstance(backward_every, bool) or not isinstance(backward_every, int):
            raise TypeError(f"backward_every must be an int (attribute backward work on one "
                            f"step in that many), got {backward_every!r}")
        if backward_every < 1:
            raise ValueError(f"backward_every must be at least 1 (1: every step), "
                             f"got {backward_every!r}")
        super().__init__(CallNode.root(), timeline=[] if timeline else None,
                         meta={"timing": bool(timing)})
        peaks = view("resolve_machine")(machine, model)  # tools.calibrate: it runs a profile
        if peaks is not None:
            self.meta["machine"] = peaks.to_dict()
        self.model = model
        # What every collector of this profile is made with: the first, and a fresh one after a
        # stale exit (_renew_collector).
        self._settings: dict[str, Any] = dict(
            model=model, registry=_registry_with(flop_rules),
            # int() is 0: a clock that never advances and costs no Python frame per call.
            clock=(clock or time.perf_counter_ns) if timing else int,
            timeline=timeline, max_events=max_events, warn_unsupported=warn_unsupported,
            count_ops=bool(ops), memory=bool(memory), params=bool(params),
            op_timing=bool(op_timing), nvtx=bool(nvtx))
        self._collector = Collector(self.root, **self._settings)
        self.timeline = self._collector.events
        self.backward_timeline = self._collector.backward_events
        if schedule is not None and not callable(schedule):
            raise TypeError(f"schedule must be a tracetorch.schedule(...), got {schedule!r}")
        self.schedule = schedule
        self.all_threads = bool(all_threads)
        self.isolated = bool(isolated)
        self.step_count = 0
        self._entries: list[_Entry] = []
        # Scratch trees no entry holds now (see _open_segment): one per entry open at a time,
        # kept across entries, so that their nodes are taken up again like the tree's own.
        self._scratches: list[CallNode] = []
        self._phases = StepPhases()
        self.step_phases = self._phases.times  # filled step by step, in place
        self._stale = False
        if gather is not None and not isinstance(gather, (bool, str)):
            raise TypeError(f"gather must be True, False or a path, got {gather!r}")
        self._gather = gather
        self._collectives = bool(collectives)
        self._distributed: Any = None  # a tracetorch.distributed Session, in a distributed job
        #: The job's merged profile, on rank 0 after a gather (``gather=`` or :meth:`gather`).
        self.merged: ProfileResult | None = None
        self._step_start: int | None = None
        self.backward_every = backward_every
        # Recorded steps so far, those whose backward work was attributed (sampled), and the
        # step_count of the last one counted (a generator's block is entered many times in one).
        self._steps = self._sampled_steps = 0
        self._counted = -1
        # step_count when the block was entered: a block without step() is one step.
        self._entry_step = 0

    # ---------------------------------------------------------------- context manager
    def __enter__(self) -> profile:
        frame = current_frame()
        if self._entries and frame is not None and frame.collector is self._collector:
            # Entered again inside itself (a recursive decorated function): recorded once.
            self._entries.append(_Entry(None, reentrant=True))
            return self
        if self._stale and not self._entries:
            self._renew_collector()
        BOARD.acquire(ADAPTERS.targets(self.model), on_first=ADAPTERS.open)
        enclosing = None
        if not self.isolated and frame is not None and frame.collector.active:
            enclosing = frame
        entry = _Entry(enclosing)
        first = not self._entries
        self._entries.append(entry)
        try:
            if first:
                ADAPTERS.configure(self._collector)
                if self.all_threads:
                    self._watch_all_threads()
                self._open_distributed()
            self._open_segment(entry)
        except BaseException:
            self._entries.remove(entry)
            if first and self.all_threads and all_threads_collector() is self._collector:
                record_all_threads(None)
            self._close_segment(entry)
            BOARD.release()
            raise
        if first:
            self._step_start = self._collector.host_clock()
            self._entry_step = self.step_count
        return self

    def __exit__(self, *exc_info: Any) -> None:
        entry = self._entries.pop()
        if entry.reentrant:
            return
        try:
            self._close_segment(entry)
        finally:
            if entry.scratch is not None:
                self._scratches.append(entry.scratch)
            try:
                if not self._entries:
                    if self.step_count == self._entry_step and self.phase == "active":
                        self._count_step()  # a block without step(): one step
                    if self.backward_every > 1:
                        self.meta["backward_sampling"] = {
                            "every": self.backward_every, "steps": self._steps,
                            "sampled_steps": self._sampled_steps}
                    if self.all_threads and all_threads_collector() is self._collector:
                        record_all_threads(None)
                    self._collector.stop()
                    for scratch in self._scratches:  # its nodes' frames are gone with the stop
                        scratch.engine.child_frames.clear()
                    self._note_run()
                    if self._distributed is not None:
                        self._distributed.exit(self, exc_info[1])
            finally:
                BOARD.release()

    def _note_run(self) -> None:
        """What a reader of the closed profile finds beside the tree: the layers nothing
        counted, the adapters' facts, the trace's thread names, the run's facts."""
        self.unsupported = self._collector.unsupported()
        add_notes(self.root, self.meta)  # the adapters' facts (compiled regions)
        self.dropped_events = self._collector.dropped_events
        if self._collector.thread_names:  # the trace's rows, by their names
            self.meta["thread_names"] = dict(self._collector.thread_names)
        if "date" not in self.meta:  # when, how and on what it ran: once
            self.meta.update(run_facts(self.root))

    def __call__(self, fn: F) -> F:
        """Use the profile as a decorator: every call runs inside it and counts as one step.

        The decorated function keeps the profile as ``fn.profile``. Coroutine functions are
        profiled per call (the profile follows the task across awaits); generator functions
        are profiled while they run, not while their consumer does.

        Example:
            >>> import tracetorch
            >>> @tracetorch.profile()
            ... def train_step():
            ...     pass
            >>> train_step(); train_step()
            >>> train_step.profile.step_count
            2
        """
        from tracetorch.profiler.decorator import profiled

        return profiled(self, fn)

    # ---------------------------------------------------------------- recordings
    def _open_segment(self, entry: _Entry) -> None:
        """Start recording this entry's calls for the current step, as its phase says."""
        phase = self.phase
        if phase in ("wait", "done"):
            # Nothing recorded here: calls fall through to an enclosing profile, if any.
            self._collector.pause()
            return
        entry.active = phase == "active"
        if entry.active and self._ordinal() % self.backward_every:  # between sampled steps
            entry.skipping = True
            backward_sampling.skip(self._collector)
        # Recorded straight into the tree only when nobody else needs this step's calls apart;
        # else into the entry's scratch tree, emptied after each step (_close_segment), whose
        # nodes are found again step after step: a run of any length holds one step's tree.
        if entry.active and entry.enclosing is None:
            entry.target = self._tree
        else:
            if entry.scratch is None:
                entry.scratch = self._scratches.pop() if self._scratches else CallNode.root()
            entry.target = entry.scratch
        entry.opened = open_root(self._collector.start(entry.target))

    def _close_segment(self, entry: _Entry) -> None:
        """Stop recording the entry's current step and hand its calls to whoever keeps them."""
        if entry.skipping:
            entry.skipping = False
            backward_sampling.resume(self._collector)
        target, opened = entry.target, entry.opened
        entry.target = entry.opened = None
        if target is None or opened is None:
            return
        if not close_root(self._collector, opened):
            self._stale = True  # exited in another context: its frames must never record again
        collector = self._collector
        if target is self._tree:
            # The tree's own counters are folded when it is read (``root``) or at the block's
            # end: folding every layer at every step costs ~2 µs per node, more than the
            # step's calls of a small layer.
            collector.end_step()
            return
        collector.fold(target)
        mapping = merge_tree(target, self._tree) if entry.active else None
        enclosing = entry.enclosing
        if enclosing is not None and enclosing.collector.active:
            collector.graft_into(target, enclosing)
        collector.move_events(target, mapping)  # after the graft, which reads them as they were
        clear_recorded(target)

    def _renew_collector(self) -> None:
        # A frame of the old collector may survive in the context it was entered in; a fresh
        # collector (same tree, same settings) keeps that frame from ever recording again.
        self._collector = Collector(self.root, **self._settings)
        self.timeline = self._collector.events
        self.backward_timeline = self._collector.backward_events
        self._stale = False

    # ---------------------------------------------------------------- steps
    def step(self) -> None:
        """Mark the end of a training step: the time since the previous mark is one step.

        With a ``schedule``, only active steps count, and the next step's phase starts here.
        The step's FLOPs and bytes are added to its nodes when the tree is next read
        (:attr:`root`, and everything reading through it) or the block ends: a step costs the
        same whatever the model's size.
        """
        now = self._collector.host_clock()
        duration = None
        if self.phase == "active":
            self._count_step()
            if self._step_start is not None:
                duration = now - self._step_start
                self.step_times.add(duration)
        entry = self._recording_entry()
        if entry is not None:
            self._close_segment(entry)
        else:
            self._collector.fold()
        if duration is not None:
            self._phases.close_step(self._tree, duration)
        else:
            self._phases.skip_step(self._tree)
        self.step_count += 1
        if entry is not None:
            self._open_segment(entry)
        self._step_start = self._collector.host_clock()

    def _ordinal(self) -> int:
        # The current step's place among the recorded steps (0: the first).
        return self._steps - 1 if self._counted == self.step_count else self._steps

    def _count_step(self) -> None:
        # The current recorded step ends (once); it was sampled if backward work was
        # attributed in it.
        if self._counted == self.step_count:
            return
        if self._ordinal() % self.backward_every == 0:
            self._sampled_steps += 1
        self._steps += 1
        self._counted = self.step_count

    def _recording_entry(self) -> _Entry | None:
        for entry in reversed(self._entries):
            if not entry.reentrant:
                return entry
        return None

    @property
    def phase(self) -> Phase:
        """The current step's phase: ``"active"`` unless a schedule says otherwise."""
        return self.schedule(self.step_count) if self.schedule is not None else "active"

    def _open_distributed(self) -> None:
        from tracetorch.distributed.session import Session, wanted

        if self._distributed is None and wanted():
            self._distributed = Session(self._gather, self._collectives)
        if self._distributed is not None:
            self._distributed.enter(self)

    def gather(self, path: str | None = None, *, tree: bool | None = None,
               timeout: float = 60.0) -> ProfileResult | None:
        """Merge every rank's profile on rank 0 now (every rank must call it): the merged
        profile on rank 0, ``None`` elsewhere; see
        :func:`tracetorch.distributed.gather.gather_profiles` for ``path``, ``tree`` and
        ``timeout``. Outside a distributed job, the merge of this one profile.

        Example:
            >>> import tracetorch
            >>> with tracetorch.profile() as prof:
            ...     pass
            >>> list(prof.gather().meta["distributed"]["ranks"])
            ['0']
        """
        from tracetorch.distributed.gather import gather_profiles

        if self.running:
            self._collector.fold()
        self.merged = gather_profiles(self, path, tree=tree, timeout=timeout)
        return self.merged

    def _watch_all_threads(self) -> None:
        watcher = all_threads_collector()
        if watcher is not None and watcher is not self._collector:
            raise RuntimeError("another profile already records all threads; only one "
                               "profile(all_threads=True) may be open at a time")
        record_all_threads(self._collector)

    @property
    def root(self) -> CallNode:
        """The call tree, its figures up to date.

        A step's end leaves the counters of its calls to whoever reads the tree: read here
        while the block runs, they are folded into the nodes' FLOPs and bytes first. (A node
        kept from an earlier read shows its figures as of that read until the tree is read
        again or the block ends.)

        Example:
            >>> import numpy as np
            >>> import tracetorch
            >>> from tracetorch.core import Linear, Tensor
            >>> layer = Linear(4, 3)
            >>> with tracetorch.profile(layer) as prof:
            ...     _ = layer(Tensor(np.ones((2, 4)))); prof.step()
            ...     prof.root.subtree_flops
            48
        """
        collector = getattr(self, "_collector", None)  # (None while __init__ sets the tree)
        if collector is not None and collector.active and collector.counts_pending:
            collector.fold_counts()
        return self._tree

    @root.setter
    def root(self, tree: CallNode) -> None:
        self._tree = tree

    @property
    def running(self) -> bool:
        """Whether the block is currently open."""
        return bool(self._entries)

    @property
    def reentered(self) -> bool:
        """Whether the current context is already inside this profile (a recursive call)."""
        frame = current_frame()
        return bool(self._entries) and frame is not None and frame.collector is self._collector


class _Entry:
    """One entry into a profile: the recording of its current step and who else receives it."""

    __slots__ = ("enclosing", "reentrant", "active", "target", "opened", "scratch", "skipping")

    def __init__(self, enclosing: Frame | None, reentrant: bool = False) -> None:
        #: Another profile's open call, which gets every call recorded here as well.
        self.enclosing = enclosing
        self.reentrant = reentrant
        self.active = False
        self.target: CallNode | None = None
        self.opened: tuple[Token, bool] | None = None
        #: The tree recording the steps that do not go straight into the profile's.
        self.scratch: CallNode | None = None
        #: Whether this recording attributes no backward work (between sampled steps).
        self.skipping = False


def _registry_with(flop_rules: dict[type, Any] | None) -> FlopRegistry:
    if not flop_rules:
        return default_registry
    if not isinstance(flop_rules, dict):
        raise TypeError(f"flop_rules must be a dict {{LayerType: rule}}, got {flop_rules!r}")
    registry = default_registry.copy()
    for layer_type, rule in flop_rules.items():
        registry.register(layer_type)(rule)
    return registry
