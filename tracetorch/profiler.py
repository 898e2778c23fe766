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

import functools
import time
from contextvars import Token
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar

from tracetorch.adapters import AdapterSet
from tracetorch.flops.registry import FlopRegistry, default_registry
from tracetorch.introspect import is_layer
from tracetorch.engine.patches import BOARD
from tracetorch.engine.collector import Collector
from tracetorch.engine.hotpath import (
    Frame,
    all_threads_collector,
    close_root,
    current_frame,
    open_root,
    record_all_threads,
)
from tracetorch.result import ProfileResult
from tracetorch.schedule import Phase, schedule
from tracetorch.tree import CallNode

__all__ = ("profile",)

F = TypeVar("F", bound=Callable[..., Any])

# One set of adapters for the one patch board of the process.
_ADAPTERS = AdapterSet(BOARD)


def _zero_clock() -> int:
    return 0


class profile(ProfileResult):  # noqa: N801 - named like torch.profiler.profile, used like a function
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
        schedule: a :class:`tracetorch.schedule` choosing which steps (marked with
            :meth:`step`) are recorded; without one every step is.
        all_threads: also record calls made in other threads (each thread under a
            ``thread <name>`` node); by default a profile sees only its own thread/context.
        isolated: opened inside another profile, keep what this one records to itself
            (``count_flops`` uses it); by default the enclosing profile receives it on exit.
        ops: count the tensor operations run inside layers that have no FLOP rule (custom
            layers, functional code). ``False`` keeps rules only, for the lowest overhead: no
            torch function mode is active inside layers (see ``benchmarks/overhead_torch.py``).

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
                 flop_rules: Optional[Dict[type, Any]] = None,
                 clock: Optional[Callable[[], int]] = None,
                 warn_unsupported: bool = True,
                 schedule: Optional[schedule] = None, all_threads: bool = False,
                 isolated: bool = False, ops: bool = True) -> None:
        if model is not None and not (is_layer(model) or callable(model)):
            raise TypeError(f"model must be a layer (an object with a forward method) or None, "
                            f"got {type(model).__name__}")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be a positive int, got {max_events!r}")
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be a callable returning nanoseconds, got {clock!r}")
        super().__init__(CallNode.root(), timeline=[] if timeline else None,
                         meta={"timing": bool(timing)})
        self.model = model
        self._collector = Collector(
            self.root, model, registry=_registry_with(flop_rules),
            clock=(clock or time.perf_counter_ns) if timing else _zero_clock,
            timeline=timeline, max_events=max_events, warn_unsupported=warn_unsupported,
            count_ops=bool(ops))
        self.timeline = self._collector.events
        if schedule is not None and not callable(schedule):
            raise TypeError(f"schedule must be a tracetorch.schedule(...), got {schedule!r}")
        self.schedule = schedule
        self.all_threads = bool(all_threads)
        self.isolated = bool(isolated)
        self.step_count = 0
        self._running = False
        self._token: Optional[Tuple[Token, bool]] = None
        self._enclosing: Optional[Frame] = None
        self._step_start: Optional[int] = None

    # ---------------------------------------------------------------- context manager
    def __enter__(self) -> "profile":
        if self._running:
            raise RuntimeError("this profile is already running; use a new tracetorch.profile() "
                               "to nest profiles")
        BOARD.acquire(_ADAPTERS.targets(self.model), on_first=_ADAPTERS.open)
        # A profile opened inside another records alone and hands its calls over on exit.
        self._enclosing = None if self.isolated else current_frame()
        try:
            _ADAPTERS.configure(self._collector)
            self._running = True
            self._apply_phase()
            if self.all_threads:
                self._watch_all_threads()
        except BaseException:
            self._running = False
            self._close_root()
            BOARD.release()
            raise
        self._step_start = self._collector.host_clock()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._running = False
        try:
            if self.all_threads:
                record_all_threads(None)
            self._close_root()
        finally:
            try:
                enclosing, self._enclosing = self._enclosing, None
                if enclosing is not None and enclosing.collector.active:
                    self._collector.fold()
                    self._collector.graft_into(enclosing)
                self._collector.stop()
                self.unsupported = self._collector.unsupported()
                self.dropped_events = self._collector.dropped_events
            finally:
                BOARD.release()

    def __call__(self, fn: F) -> F:
        """Use the profile as a decorator: every call runs inside it and counts as one step."""
        if not callable(fn):
            raise TypeError(f"profile() decorates a callable, got {type(fn).__name__}")

        @functools.wraps(fn)
        def run_profiled(*args: Any, **kwargs: Any) -> Any:
            with self:
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.step()

        return run_profiled  # type: ignore[return-value]

    # ---------------------------------------------------------------- steps
    def step(self) -> None:
        """Mark the end of a training step: the time since the previous mark is one step.

        With a ``schedule``, only active steps count, and the next step's phase starts here.
        """
        now = self._collector.host_clock()
        if self._step_start is not None and self.phase == "active":
            self.step_times.add(now - self._step_start)
        self._collector.fold()
        self.step_count += 1
        if self._running:
            self._apply_phase()
        self._step_start = self._collector.host_clock()

    @property
    def phase(self) -> Phase:
        """The current step's phase: ``"active"`` unless a schedule says otherwise."""
        return self.schedule(self.step_count) if self.schedule is not None else "active"

    def _apply_phase(self) -> None:
        self._close_root()
        phase = self.phase
        if phase in ("wait", "done"):
            self._collector.pause()
            return
        # Warm-up steps run recorded, into a scratch tree that the next step throws away.
        target = self.root if phase == "active" else CallNode.root()
        self._token = open_root(self._collector.start(target))

    def _watch_all_threads(self) -> None:
        watcher = all_threads_collector()
        if watcher is not None and watcher is not self._collector:
            raise RuntimeError("another profile already records all threads; only one "
                               "profile(all_threads=True) may be open at a time")
        record_all_threads(self._collector)

    def _close_root(self) -> None:
        token, self._token = self._token, None
        if token is not None:
            close_root(self._collector, token)

    @property
    def running(self) -> bool:
        """Whether the block is currently open."""
        return self._running


def _registry_with(flop_rules: Optional[Dict[type, Any]]) -> FlopRegistry:
    if not flop_rules:
        return default_registry
    if not isinstance(flop_rules, dict):
        raise TypeError(f"flop_rules must be a dict {{LayerType: rule}}, got {flop_rules!r}")
    registry = default_registry.copy()
    for layer_type, rule in flop_rules.items():
        registry.register(layer_type)(rule)
    return registry
