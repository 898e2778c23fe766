"""A ``torch.compile``\\ d module inside a block: called as outside it, its layers as in eager.

A compiled module (``OptimizedModule``) is a row of its own, the **region**, typed as the module
it compiled (so that an eager and a compiled profile diff row for row): its forward time (and,
from the backward pass's sweep, its backward time) is measured. Its layers run as a
graph, not as Python, so no wrapper sees them; the rows under the region come from
:mod:`~.compiled_layers`: once per distinct call the original module runs eagerly on fake
tensors through tracetorch's own recording, so the rows (call paths), forward FLOPs and
backward FLOPs are the eager ones by construction. Each compiled call charges them: the FLOPs as
they are, and **estimated** times — the region's measured time (less any compiling) shared by
the layers' inclusive FLOPs, forward and backward alike — listed as such in
``meta["compiled"]["estimated"]`` and said so in the report, never presented as measured.

Three things make the call itself differ from the eager calls around it:

* **Dynamo guards on the torch-function-mode stack.** Code compiled outside a block found the
  stack empty; the profile's :class:`~tracetorch.adapters.torch.ops.OpCountingMode` on top of it
  would fail that guard and recompile the model. So the mode is off for the call.
* **Dynamo guards on the classes it traced.** The board's patches are suspended for the call
  (:meth:`~tracetorch.engine.patches.PatchBoard.suspended`), so the compiled code runs, and
  compiles, against the classes as they are outside a block.
* **The replay runs outside the measured call**: the function installed on
  ``OptimizedModule.__call__`` replays a new call first, then calls the recording wrapper.

A module compiled in place (``module.compile()``: ``Module.__call__`` runs its compiled
``_call_impl``) is recorded the same way when it belongs to ``profile(model)``'s model
(:func:`wrap_compiled_in_place`); its replay calls its ``_call_impl`` eagerly.

Backward estimates are given at the end of a pass the function mode saw (the pass's sweep
charges the region's measured time after it); with ``profile(ops=False)`` the layers get their
backward FLOPs and the region keeps its whole backward time.

Where the replay cannot run (an operation fake tensors cannot run, such as a value read from
data), the region stays one row whose FLOPs are what its graph dispatched (:class:`DispatchedFlops`:
the products of the eager and AOT backends, the ``mm``/``addmm``/convolution kernels inductor
calls, forward and backward), and ``meta["compiled"]`` says why.

**Compilations are facts of the region**: the graphs and frames Dynamo compiled during its
calls, the graph breaks (with their reasons), the compile time (Dynamo's own measure), and the
recompilations (compilations in any call after the region's first in the profile), read from
``torch._dynamo.utils.counters`` around each call.

Example:
    >>> import torch, tracetorch
    >>> model = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 2)), backend="eager")
    >>> x = torch.ones(3, 4, requires_grad=True)
    >>> with tracetorch.profile() as prof:
    ...     model(x).sum().backward()
    >>> layer = prof.find("0")
    >>> layer.flops, layer.backward_flops        # 2·3·4·2; its input's and weight's gradients
    (48, 96)
    >>> prof.meta["compiled"]["regions"][""]["graphs"]
    1
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tracetorch.adapters.torch.backward import collect_tensors
from tracetorch.adapters.torch.compiled_layers import Replay
from tracetorch.adapters.torch.higher_order import REGION_NODE, aten_flops
from tracetorch.adapters.torch.ops import mode_off
from tracetorch.adapters.torch.tracing import skip_frames, tracing
from tracetorch.engine.collector import Collector
from tracetorch.engine.hotpath import Frame, OpCounter, call_key, current_frame
from tracetorch.engine.notes import register_note
from tracetorch.engine.patches import PatchBoard, is_instrumented, reusable_wrapper
from tracetorch.records.tree import CallNode

__all__ = ("DispatchedFlops", "RegionFacts", "compiled_call", "compiled_facts",
           "start_compiled_counting", "wrap_compiled", "wrap_compiled_in_place")

_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
#: Dynamo's own timer of one frame's compilation (seconds, one entry per compilation).
_COMPILE_TIMER = "_compile.compile_inner"


class DispatchedFlops(TorchDispatchMode):
    """Counts the FLOPs of the operations dispatched while it is on, with
    ``torch.utils.flop_counter``'s formulas (as :func:`~.higher_order.aten_flops` corrects
    them); torch.compile compiles as if it were not there.

    Example:
        >>> with DispatchedFlops() as counted:
        ...     _ = torch.ones(2, 3) @ torch.ones(3, 4)
        >>> counted.flops                       # 2·2·3·4
        48
    """

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Dynamo compiles (and runs its guards) as without the mode: it is off while Dynamo
        traces and on while what was compiled runs."""
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.flops += aten_flops(func, args, kwargs, out)
        return out


def _dynamo_counters() -> Any:
    # Imported at a compiled call (Dynamo is loaded by then): importing it when a profile
    # opens would change torch's namespace (torch._dynamo, a wrapped torch.manual_seed).
    from torch._dynamo import utils

    return utils


def _dynamo_state() -> tuple[int, int, int, int, float]:
    # What Dynamo has compiled so far: graphs, frames, graph breaks, distinct break reasons,
    # and the compile time in seconds.
    utils = _dynamo_counters()
    counters, compilation_time_metrics = utils.counters, utils.compilation_time_metrics
    breaks = counters["graph_break"]
    return (int(counters["stats"]["unique_graphs"]), int(counters["frames"]["ok"]),
            int(sum(breaks.values())), len(breaks),
            float(sum(compilation_time_metrics.get(_COMPILE_TIMER, ()))))


class RegionFacts:
    """What the calls of one compiled region did besides running: compilations, graph breaks
    and their cost, and how its layers were found.

    Example:
        >>> facts = RegionFacts("Net")
        >>> facts.note_call((0, 0, 0, 0, 0.0), (1, 1, 0, 0, 0.5))
        0.5
        >>> facts.to_dict()["graphs"], facts.to_dict()["compile_ns"], facts.recompiles
        (1, 500000000, 0)
    """

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name
        self.calls = 0
        self.graphs = self.frames = self.graph_breaks = self.recompiles = 0
        self.compile_ns = 0
        self.break_reasons: list[str] = []
        #: ``"replayed"`` (layers from an eager replay) or ``"dispatched"`` (one row).
        self.layers = "replayed"
        self.why_not: str | None = None

    def note_call(self, before: tuple[int, int, int, int, float],
                  after: tuple[int, int, int, int, float]) -> float:
        """Count one call, given :func:`_dynamo_state` before and after it; returns the seconds
        it spent compiling."""
        graphs, frames, breaks = after[0] - before[0], after[1] - before[1], after[2] - before[2]
        seconds = max(0.0, after[4] - before[4])
        if frames and self.calls:
            self.recompiles += frames
        self.calls += 1
        self.graphs += graphs
        self.frames += frames
        self.graph_breaks += breaks
        self.compile_ns += int(seconds * 1e9)
        if after[3] > before[3]:
            reasons = list(_dynamo_counters().counters["graph_break"])[before[3]:after[3]]
            self.break_reasons += [reason.splitlines()[0] for reason in reasons]
        return seconds

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (one region of ``meta["compiled"]["regions"]``)."""
        facts: dict[str, Any] = {
            "type": self.type_name, "calls": self.calls, "graphs": self.graphs,
            "frames": self.frames, "recompiles": self.recompiles,
            "graph_breaks": self.graph_breaks, "break_reasons": list(self.break_reasons),
            "compile_ns": self.compile_ns, "layers": self.layers}
        if self.why_not:
            facts["why_not"] = self.why_not
        return facts


class _Session:
    """The compiled calls of one opening of the board: replays by call, facts by region."""

    def __init__(self, counter: OpCounter, board: PatchBoard) -> None:
        self.counter = counter
        self.board = board
        # (id(original module), call key) -> (module, its replay or the reason there is none)
        self.replays: dict[tuple[int, Any], tuple[Any, Replay | str]] = {}
        self.regions: dict[CallNode, RegionFacts] = {}
        # region node -> the root of the profile recording it (its node may be in a scratch
        # tree that the profile merges into its own: a nested profile's, a schedule's)
        self.profiles: dict[CallNode, CallNode] = {}
        # (region node, id(replay)) -> the region's node for each layer of the replay
        self.targets: dict[tuple[CallNode, int], list[CallNode]] = {}

    def replay(self, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               make: bool) -> Replay | str:
        """The replay of this call of ``original``, the module compiled (made now when
        ``make`` and new), or why there is none."""
        key = (id(original), call_key(args, kwargs, original))
        known = self.replays.get(key)
        if known is not None and known[0] is original:
            return known[1]
        if not make:
            return "not replayed"
        try:
            found: Replay | str = Replay.of(original, args, kwargs, torch.is_grad_enabled(),
                                            _eager_call(original))
        except Exception as error:  # the module cannot run on fake tensors: one row instead
            found = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        self.replays[key] = (original, found)
        return found

    def nodes(self, frame: Frame, replay: Replay) -> list[CallNode]:
        """The profile's node of each layer of ``replay`` under the region ``frame``."""
        region = frame.node
        known = self.targets.get((region, id(replay)))
        if known is not None:
            return known
        collector = frame.collector
        nodes = [region]
        for layer in replay.layers[1:]:
            parent = nodes[layer.parent]
            key = (collector.module_key(layer.owner) if layer.owner is not None
                   else layer.type_name)
            node = parent.child(layer.name, layer.type_name, key, layer.kind)
            node.params = max(node.params, layer.params)
            if node.engine.rule_state == "none":
                node.engine.rule_state = layer.rule_state
            for inputs, output in zip(layer.input_shapes, layer.output_shapes):
                node.note_shapes(inputs, output)
            nodes.append(node)
        region.params = max(region.params, replay.layers[0].params)
        if region.flops_source == "none":  # known before its first call's end (no warning)
            region.flops_source = replay.layers[0].flops_source
        self.targets[(region, id(replay))] = nodes
        return nodes

    def charge_forward(self, frame: Frame, replay: Replay, run_ns: int) -> None:
        """One call of the region: each layer's forward FLOPs, and its time estimated as its
        share of the FLOPs of ``run_ns`` (the region's own time stays as measured)."""
        nodes = self.nodes(frame, replay)
        whole = replay.inclusive_flops[0]
        for index, (node, layer) in enumerate(zip(nodes, replay.layers)):
            node.flops += layer.flops
            node.gemm_flops += layer.gemm_flops
            if layer.macs is not None:
                node.macs = (node.macs or 0) + layer.macs
            if node.flops_source == "none" and layer.flops_source != "none":
                node.flops_source = layer.flops_source
            if index:
                # Bytes read and written as in eager; what is saved for backward is the
                # compiled graph's, on the region's own row (its call records its own bytes).
                memory, replayed = node.memory, layer.memory
                memory.input_bytes += replayed.input_bytes
                memory.output_bytes += replayed.output_bytes
                memory.param_bytes = max(memory.param_bytes, replayed.param_bytes)
                share = run_ns * replay.inclusive_flops[index] // whole if whole else 0
                for _ in range(layer.calls):
                    node.time.add(share // max(layer.calls, 1))

    def charge_backward_flops(self, frame: Frame, replay: Replay) -> None:
        """The region's backward started: each layer's backward FLOPs (charged while the pass
        runs, so that the pass's own total counts them)."""
        collector = frame.collector
        for node, layer in zip(self.nodes(frame, replay), replay.layers):
            other = layer.backward_flops - layer.backward_gemm_flops
            if other:
                collector.add_backward(node, other, False, 0)
            if layer.backward_gemm_flops:
                collector.add_backward(node, layer.backward_gemm_flops, True, 0)

    def charge_backward_time(self, frame: Frame, replay: Replay, elapsed_ns: int) -> None:
        """The region's backward ended, ``elapsed_ns`` after it started: each layer gets its
        share of it by backward FLOPs, an estimate taken out of the region's own time (which the
        pass's sweep measures; the table adds the layers' back up). Only where the pass is
        flushed after this (a pass the function mode saw): with ``profile(ops=False)`` the
        pass's end came first, and the region keeps its whole time."""
        collector = frame.collector
        if not collector.count_ops:
            return
        nodes = self.nodes(frame, replay)
        whole = replay.inclusive_backward_flops[0]
        given = 0
        for node, layer in zip(nodes[1:], replay.layers[1:]):
            # Own time: the inclusive share less the children's (the table adds them up).
            share = elapsed_ns * layer.backward_flops // whole if whole else 0
            collector.add_backward(node, 0, False, share)
            given += share
        if given:
            collector.add_backward(nodes[0], 0, False, -given)

    def facts(self, node: CallNode, original: Any, collector: Collector) -> RegionFacts:
        """The facts of the region ``node`` (made at its first call), which compiled
        ``original``, recorded by ``collector``."""
        facts = self.regions.get(node)
        if facts is None:
            facts = self.regions[node] = RegionFacts(type(original).__name__)
            self.profiles[node] = collector.root
            model = collector.model
            # The row stands for the module compiled: typed as in an eager profile, so that
            # the two diff row for row (meta["compiled"] says it ran compiled); called at the
            # top, compiled from profile(model)'s model, it is that model's row, "".
            node.type_name = facts.type_name
            parent = node.parent
            if (node.name and parent is not None and parent.kind == "root"
                    and original is model and "" not in parent.children):
                del parent.children[node.name]
                node.name = ""
                parent.children[""] = node
        return facts


#: The session of the open board (see :func:`start_compiled_counting`).
_SESSIONS: list[_Session] = []
#: The function made for each original ``__call__``: the same one at each opening of a profile.
_CALLS: dict[Any, Callable[..., Any]] = {}


def _is_optimized(cls: type) -> bool:
    """Whether ``cls`` is ``torch.compile``'s ``OptimizedModule`` (by name: the subclass watcher
    sees it before its module binds it)."""
    return cls.__module__ == "torch._dynamo.eval_frame" and cls.__qualname__ == "OptimizedModule"


def _compiled_module(module: Any) -> Any:
    # The module a compiled call compiled: an OptimizedModule's original, or the module itself
    # (compiled in place, module.compile()).
    return module._orig_mod if _is_optimized(type(module)) else module


def _eager_call(module: Any) -> Callable[..., Any]:
    # How the replay calls ``module`` eagerly: through __call__, or, for a module compiled in
    # place (whose __call__ runs the compiled code), through _call_impl.
    return module._call_impl if vars(module).get("_compiled_call_impl") is not None else module


def _region_autograd_nodes(output: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                           ) -> list[Any]:
    # The autograd nodes between the call's outputs and its inputs: a compiled graph's
    # CompiledFunctionBackward (one per graph), or each operation's with the eager backend;
    # each marked as the region's, whose backward the region charges (no pass counts it).
    outputs: list[Any] = []
    collect_tensors(output, outputs)
    inputs: list[Any] = []
    collect_tensors((args, kwargs), inputs)
    stop = {t.grad_fn for t in inputs if t.grad_fn is not None}
    pending = [t.grad_fn for t in outputs if t.grad_fn is not None and t.grad_fn not in stop]
    seen = set(pending)
    found = []
    while pending:
        fn = pending.pop()
        if type(fn).__name__ == "AccumulateGrad":
            # A parameter's accumulator outlives the call (kept by whatever holds the
            # parameter's hooks): a hook put there would run again in every later pass.
            continue
        found.append(fn)
        fn.metadata[REGION_NODE] = True
        for parent, _ in fn.next_functions:
            if parent is not None and parent not in seen and parent not in stop:
                seen.add(parent)
                pending.append(parent)
    return found


def _count_dispatched_backward(frame: Frame, counter: OpCounter, nodes: list[Any]) -> None:
    # Without a replay: each autograd node of the region runs its backward with the mode on.
    mode = DispatchedFlops()

    def before(grad_outputs: Any) -> None:
        mode.__enter__()

    def after(grad_inputs: Any, grad_outputs: Any) -> None:
        mode.__exit__(None, None, None)
        if mode.flops:
            counter.backward_op(frame, "compiled", mode.flops, True, 0)
            mode.flops = 0

    for fn in nodes:
        fn.register_prehook(before)
        fn.register_hook(after)


def _charge_replayed_backward(frame: Frame, session: _Session, replay: Replay,
                              nodes: list[Any]) -> None:
    # The layers' backward is charged once per pass that runs the region's nodes: their FLOPs
    # at its first node, their estimated times at the end of the pass, from the time between
    # the first node's start and the last node's end.
    clock = session.counter.backward_clock(frame)
    span = [0, 0, False]  # start, end, charged this pass

    def before(grad_outputs: Any) -> None:
        if not span[2]:
            span[0], span[2] = clock(), True
            session.charge_backward_flops(frame, replay)
            _queue_callback(finish)

    def after(grad_inputs: Any, grad_outputs: Any) -> None:
        span[1] = clock()

    def finish() -> None:
        span[2] = False
        session.charge_backward_time(frame, replay, max(0, span[1] - span[0]))

    for fn in nodes:
        fn.register_prehook(before)
        fn.register_hook(after)


def compiled_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """``OptimizedModule.__call__`` as the profile records it: ``original`` called without the
    profile's function mode and with the board's patches suspended; its layers charged from
    the call's replay (made beforehand by :func:`wrap_compiled`'s function), or, without one,
    its FLOPs counted by :class:`DispatchedFlops`.

    Example:
        >>> call = compiled_call(lambda module, x: x * 2)
        >>> call(None, 21)                      # no profile open: only calls through
        42
    """
    known = _CALLS.get(original)
    if known is not None:
        return known

    def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807 - its real name
        frame = current_frame()
        if frame is None or frame.owner is not module or not _SESSIONS:
            return original(module, *args, **kwargs)
        session = _SESSIONS[-1]
        # What the call costs comes from its replay (or its dispatched operations): the rule of
        # a layer compiled in place (module.compile()) would count it again at its node.
        frame.node.engine.rule_state = "none"
        inner = _compiled_module(module)
        replay = session.replay(inner, args, kwargs, make=False)
        counting = DispatchedFlops() if isinstance(replay, str) else contextlib.nullcontext()
        clock = frame.collector.host_clock
        before = _dynamo_state()
        start = clock()
        with mode_off(), session.board.suspended(), counting:
            output = original(module, *args, **kwargs)
        elapsed = clock() - start
        if not frame.collector.records_tree:
            # A running total (count_flops) keeps no rows: the region's FLOPs, its layers'
            # included, are operations of its own call.
            if isinstance(replay, str):
                assert isinstance(counting, DispatchedFlops)
                flops = counting.flops
            else:
                flops = replay.inclusive_flops[0]
            if flops:
                session.counter.charge("compiled", flops, True, 1)
            return output
        facts = session.facts(frame.node, inner, frame.collector)
        compiling = facts.note_call(before, _dynamo_state())
        grad = torch.is_grad_enabled()
        if isinstance(replay, str):
            facts.layers, facts.why_not = "dispatched", replay
            assert isinstance(counting, DispatchedFlops)
            if counting.flops:
                session.counter.charge("compiled", counting.flops, True, 1)
                if frame.node.flops_source == "none":
                    frame.node.flops_source = "ops"
            if grad:
                _count_dispatched_backward(frame, session.counter,
                                           _region_autograd_nodes(output, args, kwargs))
            return output
        if grad and replay.inclusive_backward_flops[0]:
            _charge_replayed_backward(frame, session, replay,
                                      _region_autograd_nodes(output, args, kwargs))
        # Charged once the recording wrapper has timed the call (see _charge_after), so that
        # the region's measured time holds no bookkeeping of its layers; the rows exist before
        # (the wrapper's end of a first call takes a layer without rows for unsupported).
        session.nodes(frame, replay)
        _AFTER.charge = (session, frame, replay, max(0, elapsed - int(compiling * 1e9)))
        return output

    _CALLS[original] = __call__
    return __call__


#: The function installed on ``OptimizedModule.__call__`` for each recording wrapper.
_PREPARED: dict[Any, Callable[..., Any]] = {}
#: Per thread, the layers' forward charge of the compiled call just timed (see compiled_call).
_AFTER = threading.local()


def _charge_after() -> None:
    # The compiled call the recording wrapper has just timed: its layers' FLOPs and times.
    charge = getattr(_AFTER, "charge", None)
    if charge is not None:
        _AFTER.charge = None
        session, frame, replay, run_ns = charge
        session.charge_forward(frame, replay, run_ns)


def _prepared(measured: Any, cls: type) -> Callable[..., Any]:
    # Replays a new call of the compiled module before the recording wrapper times it.
    known = _PREPARED.get(measured)
    if known is not None:
        return known
    bind = measured.__get__

    def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807 - its real name
        if not _SESSIONS or tracing() or current_frame() is None:
            return bind(module, cls)(*args, **kwargs)
        _SESSIONS[-1].replay(_compiled_module(module), args, kwargs, make=True)
        output = bind(module, cls)(*args, **kwargs)
        _charge_after()
        return output

    skip_frames(__call__.__code__)
    _PREPARED[measured] = __call__
    return __call__


def _in_place(measured: Any, cls: type, original: Callable[..., Any]) -> Callable[..., Any]:
    # For a class with an instance compiled in place: that instance's calls are replayed and
    # recorded as a compiled module's; any other call goes on as without the profile.
    bind = measured.__get__

    def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N807 - its real name
        if (vars(module).get("_compiled_call_impl") is None or not _SESSIONS or tracing()
                or current_frame() is None):
            return original(module, *args, **kwargs)
        _SESSIONS[-1].replay(module, args, kwargs, make=True)
        output = bind(module, cls)(*args, **kwargs)
        _charge_after()
        return output

    skip_frames(__call__.__code__)
    return __call__


def wrap_compiled_in_place(model: Any) -> None:
    """``profile(model)``: record the modules of ``model`` compiled in place
    (``module.compile()``, which compiles the module's ``_call_impl`` into an attribute of its
    own that ``Module.__call__`` runs) as compiled modules. Their classes get a ``__call__`` of
    their own until the profile closes (removed then: they only inherited it), which calls the
    inherited one for every other instance; ``torch.nn.Module`` itself is never touched.

    Example:
        >>> wrap_compiled_in_place(torch.nn.Linear(2, 2))    # none compiled in place: nothing
    """
    if (not _SESSIONS or not isinstance(model, torch.nn.Module)
            or "torch._dynamo" not in sys.modules):
        # (Compiling in place goes through torch.compile, which imports dynamo: without it
        # loaded there is nothing to find, and the walk costs a call per module.)
        return
    board = _SESSIONS[-1].board
    done: set[type] = set()
    for module in model.modules():
        cls = type(module)
        if cls in done or vars(module).get("_compiled_call_impl") is None:
            continue
        done.add(cls)
        original = cls.__call__
        if is_instrumented(original) or "__call__" in vars(cls):
            continue  # a class with a __call__ of its own is left as it is
        measured = reusable_wrapper(cls, "__call__", compiled_call(original), "module", tracing)
        board.install(cls, "__call__", _in_place(measured, cls, original))


def wrap_compiled(board: PatchBoard, cls: type) -> None:
    """Record the calls of ``torch.compile``'s module class ``cls`` as the calls of
    :func:`compiled_call`, each new call replayed first (see the module docstring).

    Example:
        >>> board = PatchBoard()
        >>> wrap_compiled(board, torch._dynamo.eval_frame.OptimizedModule)   # no profile open
        >>> dict(board.patched())
        {}
    """
    original = vars(cls).get("__call__", torch.nn.Module.__call__)
    if is_instrumented(original) or original in _PREPARED.values():
        return
    measured = reusable_wrapper(cls, "__call__", compiled_call(original), "module", tracing)
    board.install(cls, "__call__", _prepared(measured, cls))


def start_compiled_counting(counter: OpCounter, board: PatchBoard) -> Callable[[], None]:
    """Charge compiled calls' FLOPs to ``counter``, and suspend ``board``'s patches during
    them, until the returned cleanup runs.

    Example:
        >>> stop = start_compiled_counting(OpCounter(), PatchBoard())
        >>> stop()
    """
    session = _Session(counter, board)
    _SESSIONS.append(session)

    def stop() -> None:
        _SESSIONS.remove(session)

    return stop


def compiled_facts(root: CallNode, meta: dict[str, Any]) -> None:
    """Add the compiled regions of the tree ``root`` to ``meta["compiled"]``: each region's
    :class:`RegionFacts` by path (added to what an earlier entry of the profile noted), and the
    paths whose times are estimated (the layers under replayed regions).

    Example:
        >>> meta = {}
        >>> compiled_facts(CallNode.root(), meta)
        >>> meta
        {}
    """
    if not _SESSIONS:
        return
    session = _SESSIONS[-1]
    regions = [(node, facts) for node, facts in session.regions.items()
               if session.profiles[node] is root]
    if not regions:
        return
    noted = meta.setdefault("compiled", {"regions": {}, "estimated": []})
    estimated = set(noted["estimated"])
    for node, facts in regions:
        path = node.path
        entry = facts.to_dict()
        earlier = noted["regions"].get(path)
        if earlier is not None:
            for name in ("calls", "graphs", "frames", "recompiles", "graph_breaks", "compile_ns"):
                entry[name] += earlier[name]
            entry["break_reasons"] = earlier["break_reasons"] + entry["break_reasons"]
        noted["regions"][path] = entry
        if facts.layers == "replayed":
            estimated.update(child.path for child in node.walk() if child is not node)
    noted["estimated"] = sorted(estimated)


register_note(compiled_facts)
