"""Backward FLOPs and times per layer, from the forward calls' formulas and autograd's own hooks.

Nothing runs per operation of a backward pass. Instead:

**Marking, during forward** (:mod:`~tracetorch.adapters.torch.marks`). After each torch layer
call returns, the ``grad_fn`` of its output is marked with a :data:`Mark`: the call's frame and
its gradient parts. A node marked for the first time gets this module's hook
(``MARKED_NODE_HOOK``, below).

**Sweeping, during backward.** ``Tensor.backward``, ``torch.autograd.backward`` and
``torch.autograd.grad`` reach the operation-counting function mode of
:mod:`~tracetorch.adapters.torch.ops` (torch hands them to modes; none of them is replaced).
:func:`pass_recorder` runs such a pass as a node of kind ``backward`` and keeps a
:class:`BackwardPass` open meanwhile. Autograd runs a layer's nodes together (it orders ready
nodes by creation, newest first), so each marked node's pre-hook is a boundary: the time since
the previous boundary goes to the innermost layer open then, and the layer owning the marked
node — with its enclosing layers, from the tree — becomes the open one. Each call's gradient
parts are charged when its output's node is reached, counting a part only if the pass computes
one of its tensors' gradients (``torch._C._will_engine_execute_node`` for a non-leaf; for a
leaf, the pass accumulates into every leaf, or ``inputs=`` names it). When the pass ends each
layer it reached gets one backward sample, and a layer with inclusive parts (a rule's, which
count its children's) keeps what its children did not charge themselves. Time before the first
boundary and after a layer's last node (a loss written with tensor maths) stays on the pass's
own node; products at the profile's root charge their gradients to it as well.

**Passes no mode saw.** With ``profile(ops=False)`` no function mode is pushed at all, and
inside a layer with a rule it is popped: a pass started there is found at its first marked node
(:func:`implicit_pass`), timed from it, and closed by autograd's own end-of-pass callback
(``queue_callback``); which leaves it computes is asked of autograd
(``_will_engine_execute_node`` on each leaf's gradient accumulator), so ``autograd.grad`` and
``backward(inputs=...)`` are exact there too.

So a layer's backward time is its own share (children have theirs; the table adds them up),
including the accumulation of its parameters' gradients. A graph whose forward ran outside the
profile has no marks: its pass is timed as a whole, with no FLOPs. A graph built inside a block
and differentiated after it calls one no-op hook per marked node. Nothing is recorded while a
compiler or tracer runs the code (AOT autograd traces a backward graph under ``torch.compile``:
no pass ran).

Example:
    >>> import torch, tracetorch
    >>> lin = torch.nn.Linear(4, 3)
    >>> with tracetorch.profile() as prof:
    ...     lin(torch.ones(2, 4)).sum().backward()
    >>> prof.find("").backward_flops, prof.find("backward").flops   # "": the Linear, called first
    (48, 48)
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import torch

from tracetorch.adapters.torch.cuda import backward_timer
from tracetorch.adapters.torch.higher_order import gradient_graph_mode, warn_unseen_graph
from tracetorch.adapters.torch.tracing import tracing
from tracetorch.engine.hotpath import BackwardPassOwner, Frame, current_frame, make_wrapper
from tracetorch.engine.native import native_type
from tracetorch.records.tree import CallNode

if TYPE_CHECKING:
    from tracetorch.engine.collector import Collector

__all__ = ("ASK_AUTOGRAD", "MARKS", "Mark", "ResolvedPart", "collect_tensors",
           "BackwardPass", "implicit_pass", "forget_passes", "pass_recorder",
           "PassRecorder", "MARKED_NODE_HOOK")

#: The key under which a node's marks are kept in ``grad_fn.metadata``.
MARKS = "tracetorch.marks"

_current_node = torch._C._current_autograd_node
_will_execute = torch._C._will_engine_execute_node
_gradient_edge = torch.autograd.graph.get_gradient_edge
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_thread_id = threading.get_ident

#: ``BackwardPass(leaves=ASK_AUTOGRAD)``: which leaves the pass accumulates into is unknown.
ASK_AUTOGRAD = object()
_Tensor = torch.Tensor

#: A gradient part resolved for one call: FLOPs, and the tensors needing a gradient whose
#: gradients it computes (the work is done if the pass computes any of them).
ResolvedPart = tuple[int, tuple[Any, ...]]


#: What one call left on an autograd node, a plain tuple (made on every layer call that records
#: autograd, so no class to construct): ``(frame, parts, inner)`` — the call's frame, its gradient
#: parts (on one of its output nodes only, so each call is charged once) and the mark of a call
#: that returned the same node earlier (a parent returning its child's output marks it after the
#: child), or ``None``.
Mark = tuple[Frame, Sequence[ResolvedPart], Any]


def collect_tensors(value: Any, out: list[torch.Tensor], depth: int = 0) -> None:
    """Append the tensors in ``value`` (itself, or inside tuples, lists and dicts, three levels
    deep) to ``out``."""
    if isinstance(value, _Tensor):
        out.append(value)
    elif depth < 3:
        if isinstance(value, (tuple, list)):
            for item in value:
                collect_tensors(item, out, depth + 1)
        elif isinstance(value, dict):
            for item in value.values():
                collect_tensors(item, out, depth + 1)


# ----------------------------------------------------------------------------- sweeping
class _Hot(NamedTuple):
    """What the C boundary hook (``_marks.c``) reads of a :class:`BackwardPass` at each marked
    node, in one tuple: one attribute read instead of seven. The C finds each field's position
    by its name here when the hook is made."""

    clock: Callable[[], int]
    collector: Collector
    recompute_of: dict[CallNode, CallNode]
    boundaries: list[Any]
    leaves: set[int] | None
    flops: dict[CallNode, int]
    pass_node: CallNode


class BackwardPass:
    """One recorded backward pass: the boundaries it crossed, and what each layer got.

    ``leaves`` is ``None`` when the pass accumulates into every leaf (``backward()`` without
    ``inputs``), the ids of the tensors it computes gradients for, or :data:`ASK_AUTOGRAD` for a
    pass no entry point announced (see :func:`implicit_pass`): each leaf is then asked of
    autograd once.

    While the pass runs, each marked node only notes a boundary (which layer runs from now on,
    and when) and charges its calls' gradient parts, which must be asked of autograd then; the
    time between boundaries is shared out among the layers once, when the pass ends
    (:meth:`finish`).
    """

    def __init__(self, frame: Frame, leaves: set[int] | None | object) -> None:
        self.frame = frame
        self.collector = frame.collector
        self.ask = leaves is ASK_AUTOGRAD
        self.leaves: set[int] | None = set() if self.ask else leaves  # type: ignore[assignment]
        self._asked: dict[int, bool] = {}
        self.timer = backward_timer(self.collector)
        self.clock = self.collector.host_clock
        #: At each marked node, one after the other, the layer whose work starts there (``None``:
        #: a node of another profile's call, which moves no layer) and the host ns.
        self.boundaries: list[Any] = []
        self.flops: dict[CallNode, int] = {}
        #: What the C boundary hook reads at each node (``None`` with a device timer:
        #: :meth:`reach` records that pass).
        self.hot = None if self.timer is not None else _Hot(
            clock=self.clock, collector=self.collector,
            recompute_of=self.collector.recompute_of, boundaries=self.boundaries,
            leaves=self.leaves, flops=self.flops, pass_node=frame.node)
        #: What a pass that gradient graphs concern ran, counted by dispatch (see
        #: :meth:`note_dispatched`).
        self.dispatched: tuple[int, int] | None = None
        self.start = self.clock()
        if self.timer is not None:
            self.timer.mark(frame)

    def note_dispatched(self, gradient_graphs: int, forward_graph: int) -> None:
        """The FLOPs the pass ran, counted by dispatch (:mod:`.higher_order`): on the nodes of
        gradient graphs, and on all others. The layers' marks charge the latter in part only
        when the pass entered a layer's graph in its middle (from a gradient graph, through the
        activations its nodes saved), so what the marks did not charge is the pass's own, with
        the gradient graphs' work."""
        self.dispatched = (gradient_graphs, forward_graph)

    def accumulates(self, leaf: Any) -> bool:
        """Whether this pass computes a leaf's gradient, asked of autograd (cached per leaf)."""
        known = self._asked
        answer = known.get(id(leaf))
        if answer is None:
            try:
                answer = bool(_will_execute(_accumulator(leaf)))
            except RuntimeError:
                # Raised only under ``autograd.grad``, for a leaf its ``inputs`` name (whose
                # gradient it captures); for other leaves it answers False.
                answer = True
            known[id(leaf)] = answer  # the leaf is alive: the graph holds it
        return answer

    def reach(self, mark: Mark | None) -> None:
        """The pass reached a marked node: charge the calls' parts, note the boundary.

        This runs once per layer call of every backward pass, so it does only what cannot wait
        for the end of the pass."""
        now = self.clock()
        collector = self.collector
        recompute_of = collector.recompute_of
        innermost = None
        while mark is not None:  # the outermost call heads the chain, the innermost ends it
            frame, parts, mark = mark
            if frame.collector is collector:
                # A layer run again by activation checkpointing: its gradients are the layer's.
                innermost = recompute_of.get(frame.node, frame.node) if recompute_of \
                    else frame.node
                if parts:
                    self._charge(frame, innermost, parts)
        self.boundaries += (innermost, now)
        if self.timer is not None and innermost is not None:
            self.timer.mark(innermost.engine.frame if _opens(innermost) else self.frame)

    def _charge(self, frame: Frame, node: CallNode, parts: Sequence[ResolvedPart]) -> None:
        # Each part's FLOPs count if this pass computes a gradient of one of its tensors.
        leaves = self.leaves
        flops = 0
        for part_flops, tensors in parts:
            for tensor in tensors:
                # Named in ``inputs``; a leaf, when it accumulates into every leaf; a node the
                # pass will run.
                if leaves is not None and id(tensor) in leaves:
                    break
                fn = tensor.grad_fn
                if fn is None:
                    if leaves is None or (self.ask and self.accumulates(tensor)):
                        break
                    continue
                try:
                    if _will_execute(fn):
                        break
                except RuntimeError:  # not a node of this pass's graph
                    pass
            else:
                continue
            flops += part_flops
        if flops:
            # Products outside every layer (at the profile's root) are the pass's own.
            if frame.owner is None or node.kind == "thread":
                node = self.frame.node
            self.flops[node] = self.flops.get(node, 0) + flops

    def finish(self) -> None:
        """End of the pass: share the time between boundaries out to the layers open in each
        stretch (the innermost one), with device spans or a timeline's spans, then one sample
        per layer reached."""
        boundaries = self.boundaries  # the same list to the end: ``hot`` holds it
        targets = tuple(boundaries[0::2])
        plan = _PLANS.get(targets)
        if plan is None:
            if len(_PLANS) >= _MAX_PLANS:  # passes of ever new shapes: keep the newest
                _PLANS.clear()
            plan = _PLANS[targets] = _plan(targets)
        entered, runs, spans, open_at_end = plan
        spent = entered.copy()  # every layer reached: its host ns
        if self.timer is None:
            # times[0] is the pass's start, times[k] the k-th boundary's, the last its end.
            times: list[int] = [self.start, *boundaries[1::2]]
            if open_at_end:
                times.append(self.clock())
            for node, begin, end in runs:
                spent[node] += times[end] - times[begin]
            if self.collector.backward_events is not None:  # a timeline: the layers' spans
                add_span = self.collector.add_backward_span
                for node, begin, end in spans:
                    add_span(node, times[begin], times[end])
        else:  # a device timer charges its spans
            for frame, elapsed in self.timer.resolve():
                if frame is not None and frame.node in spent:
                    spent[frame.node] += elapsed
        boundaries.clear()
        flops = self.flops
        _exclude_descendants(flops)
        if self.dispatched is not None:
            gradient_graphs, forward_graph = self.dispatched
            unmarked = gradient_graphs + max(0, forward_graph - sum(flops.values()))
            if unmarked:
                node = self.frame.node
                flops[node] = flops.get(node, 0) + unmarked
        self.collector.add_backward_pass(spent, flops)
        self.flops.clear()


def _exclude_descendants(flops: dict[CallNode, int]) -> None:
    """A layer's gradient parts are inclusive, like its forward rule (a TransformerEncoderLayer's
    count its Linears'), and its children that ran in the pass charged their own: as the fold
    does with forward FLOPs, each such layer keeps what its subtree was not charged in this pass
    (never less than 0), innermost layers first; what the children beside its rule charged (a
    parametrization computing its weight) is not its rule's, and stays out of that. Only a layer
    with a FLOP rule charges inclusive parts; one without charges its own products, which are no
    child's."""
    composite = [node for node in flops if node.children and node.engine.rule_state == "rule"]
    if not composite:
        return
    depth = {node: node.depth for node in composite}
    for node in sorted(composite, key=depth.__getitem__, reverse=True):
        flops[node] = max(0, flops[node] - _charged_below(node, flops))


def _charged_below(node: CallNode, flops: dict[CallNode, int]) -> int:
    # What ``node``'s descendants charged, but for the subtrees beside a rule (at any depth: no
    # ruled layer's parts count a parametrization's).
    charged = 0
    pending = [child for child in node.children.values() if not child.engine.beside_rule]
    while pending:
        inner = pending.pop()
        charged += flops.get(inner, 0)
        pending.extend(child for child in inner.children.values()
                       if not child.engine.beside_rule)
    return charged


#: What a pass's sequence of boundary layers means for its times, worked out once per sequence
#: (a training loop repeats the same one each step): ``(entered, runs, spans, open_at_end)`` —
#: the layers it opens, in order, each with 0 (a copy is a pass's ns per layer, to add to:
#: copying a dict costs less than building one); ``(layer, i, j)`` runs, the layer innermost
#: from ``times[i]`` to ``times[j]`` (``times``: the pass's start, each boundary's time, its
#: end); each layer's span, in the order they end; whether a layer is open at the end.
_Plan = tuple[dict[CallNode, int], list[tuple[CallNode, int, int]],
              list[tuple[CallNode, int, int]], bool]

#: The plans by sequence of boundary layers (``None``: another profile's node), dropped when the
#: last profile closes (:func:`forget_passes`) or when there are too many.
_PLANS: dict[tuple[CallNode | None, ...], _Plan] = {}
_MAX_PLANS = 64


def _plan(targets: tuple[CallNode | None, ...]) -> _Plan:
    # At each boundary the stretch since the previous one goes to the innermost layer open; the
    # target and its enclosing layers become the open ones, and layers not enclosing it end.
    entered: dict[CallNode, int] = {}
    runs: list[tuple[CallNode, int, int]] = []
    spans: list[tuple[CallNode, int, int]] = []
    since: dict[CallNode, int] = {}  # each open layer: where its span began
    open_: list[CallNode] = []  # the innermost last
    for at, target in enumerate(targets, 1):
        if open_:
            _run(runs, open_[-1], at)
        if target is None or (open_ and open_[-1] is target):
            continue
        path = []
        node: CallNode | None = target
        while node is not None and _opens(node) and node not in since:
            path.append(node)
            node = node.parent
        while open_ and open_[-1] is not node:
            ended = open_.pop()
            spans.append((ended, since.pop(ended), at))
        for node in reversed(path):
            open_.append(node)
            entered[node] = 0
            since[node] = at
    end = len(targets) + 1
    if open_:
        _run(runs, open_[-1], end)
        for node in reversed(open_):  # inner spans end first, as calls do
            spans.append((node, since.pop(node), end))
    return entered, runs, spans, bool(open_)


def _run(runs: list[tuple[CallNode, int, int]], node: CallNode, end: int) -> None:
    # The stretch ending at ``end`` is ``node``'s: one run with the stretch before, if its too.
    if runs and runs[-1][0] is node and runs[-1][2] == end - 1:
        runs[-1] = (node, runs[-1][1], end)
    else:
        runs.append((node, end - 1, end))


def _opens(node: CallNode) -> bool:
    # Whether a boundary at ``node`` opens it (a layer), or closes every layer (the root, a
    # thread's node: the profile's own work).
    return node.parent is not None and node.kind != "thread"


#: Each leaf's gradient accumulator, found once (``get_gradient_edge`` builds a view to find it)
#: and held with the leaf itself, so that its id is not reused, until the last profile closes
#: (:func:`forget_passes`).
_ACCUMULATORS: dict[int, tuple[Any, Any]] = {}


def _accumulator(leaf: Any) -> Any:
    known = _ACCUMULATORS.get(id(leaf))
    if known is None or known[0] is not leaf:
        known = _ACCUMULATORS[id(leaf)] = (leaf, _gradient_edge(leaf).node)
    return known[1]


def forget_passes() -> None:
    """The last profile closed: drop the leaves and accumulators :func:`implicit_pass` kept,
    and any pass it opened whose end-of-pass callback never came (autograd runs none after a
    backward pass that raised)."""
    _ACCUMULATORS.clear()
    _PASSES.clear()
    _PLANS.clear()


#: The passes being recorded, by the thread that started them. Changed in place, never bound
#: again: the C boundary hook keeps the dict it read first (as every global it reads).
_PASSES: dict[int, BackwardPass] = {}


def _on_marked_node(grad_outputs: Any) -> None:
    try:
        node = _current_node()
        mark = node.metadata.get(MARKS) if node is not None else None
        if mark is None:
            return
        state = _PASSES.get(_thread_id()) if _PASSES else None
        if state is None:
            if len(_PASSES) == 1:  # autograd's device threads run the hooks
                state = next(iter(_PASSES.values()))
            elif mark[0].collector.active:  # else: a graph that outlived its profile
                state = implicit_pass(mark)
            if state is None:
                return
        state.reach(mark)
    except Exception:  # attribution is best effort; the user's gradients are not
        pass


#: The hook on marked nodes: :func:`_on_marked_node`, or its C version where it is built (see
#: tracetorch.engine.native), which hands it every case but a host-clock pass of this thread.
#: The C version reads this module's globals by name (``_current_node``, ``_PASSES``...: every
#: name it reads is in :data:`tracetorch.engine.native.C_NAMES`).
_BOUNDARY = native_type("tracetorch.adapters.torch._marks", "Boundary")
MARKED_NODE_HOOK: Callable[[Any], None] = (
    _on_marked_node if _BOUNDARY is None else _BOUNDARY(_on_marked_node, globals()))


def implicit_pass(mark: Mark) -> BackwardPass | None:
    """Open a pass that no entry point announced, at its first marked node: one started where
    no function mode saw it (``profile(ops=False)``, or inside a layer with a rule). It is a
    ``backward`` node under the call that is open (the profile's root from autograd's device
    threads), timed from this node to the end of the pass (autograd's own end-of-pass callback
    closes it); ``None`` when the mark's profile has ended or a compiler traces the pass.

    Example:
        >>> import tracetorch
        >>> lin = torch.nn.Linear(4, 3)
        >>> with tracetorch.profile(ops=False) as prof:      # no function mode at all
        ...     lin(torch.ones(2, 4)).sum().backward()
        >>> prof.find("backward").calls, prof.find("").backward_flops
        (1, 48)
    """
    collector = mark[0].collector
    if not collector.active or tracing():
        return None
    parent = current_frame()
    if parent is None or parent.collector is not collector:
        parent = collector.root_frame
        if parent is None:  # stopped meanwhile, by another thread
            return None
    owner = _PASS_OWNERS[None]
    frame = parent.child_frames.get(id(owner))
    if frame is None:
        frame = collector.new_child(parent, owner, "backward", None, None)
    node = frame.node
    if torch.is_grad_enabled():  # (autograd turns it on in a pass only for create_graph=True)
        warn_unseen_graph()
    state = BackwardPass(frame, ASK_AUTOGRAD)
    key = _thread_id()
    _PASSES[key] = state
    start = collector.clock()

    def end_of_pass() -> None:
        if _PASSES.get(key) is state:
            del _PASSES[key]
        state.finish()
        if collector.active:
            collector.touch(node)  # (a pass counts no call key)
            collector.add_duration(node, start, collector.clock())
            collector.flush_backward(node)

    _queue_callback(end_of_pass)
    return state


# ----------------------------------------------------------------------------- passes
#: Runs one pass: ``recorder(func, args, kwargs)`` with the entry point torch handed the mode.
PassRecorder = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


def _leaves_of(func: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> set[int] | None:
    if func is torch.autograd.grad:
        inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
    else:
        inputs = kwargs.get("inputs")
        if inputs is None and func is torch.autograd.backward and len(args) > 4:
            inputs = args[4]
    if inputs is None:
        return None
    tensors: list[torch.Tensor] = []
    collect_tensors(inputs, tensors)
    return {id(t) for t in tensors}


def pass_recorder(label: str | None = None) -> PassRecorder:
    """What the function mode calls for a backward entry point: the pass, recorded as a node of
    kind ``backward`` (named ``label``, by default ``backward``) whose marked nodes charge their
    layers; the pass runs unrecorded while compiling or tracing, and inside another pass (a
    gradient taken in a custom ``backward``).

    Example:
        >>> run = pass_recorder()
        >>> x = torch.ones(2, requires_grad=True)
        >>> run(torch.autograd.grad, ((x * x).sum(), x), {})   # outside a profile: just runs
        (tensor([2., 2.]),)
    """
    record = _pass_wrapper(label)

    def recorded(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if tracing() or _current_node() is not None:
            return func(*args, **kwargs)

        def counted() -> Any:
            frame = current_frame()  # the pass's own node, unless the engine passed it through
            if frame is None or not frame.collector.active or frame.node.kind != "backward":
                return func(*args, **kwargs)
            thread = threading.get_ident()
            state = BackwardPass(frame, _leaves_of(func, args, kwargs))
            _PASSES[thread] = state
            graphs = gradient_graph_mode(frame.collector, func, args, kwargs,
                                         state.note_dispatched)
            try:
                if graphs is None:
                    return func(*args, **kwargs)
                with graphs:
                    return func(*args, **kwargs)
            finally:
                del _PASSES[thread]
                state.finish()

        return record(counted, None, (), {})

    return recorded


@functools.cache
def _pass_wrapper(label: str | None) -> Callable[..., Any]:
    # One engine wrapper per kind of pass for the whole process: its passes are one node, also
    # in a profile entered again after the last one closed (a new wrapper would be a new node).
    return make_wrapper("backward", label,
                        owner=_PASS_OWNERS.setdefault(label, BackwardPassOwner()))


#: The owner of each kind of pass's node: the passes a function mode recorded and those opened
#: at their first node (:func:`implicit_pass`) are the same ``backward`` node.
_PASS_OWNERS: dict[str | None, BackwardPassOwner] = {None: BackwardPassOwner()}
