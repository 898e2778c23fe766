"""Each layer against the roofline: compute-bound, memory-bound or overhead-bound, with evidence.

A layer's own numbers decide its label, with a :class:`~tracetorch.analysis.machine.Machine`'s
peaks (``P`` FLOP/s, ``B`` bytes/s, one call's fixed cost ``c``):

- **intensity** ``I = FLOPs / bytes moved`` (inclusive forward FLOPs; bytes as
  :mod:`tracetorch.records.memory` counts them: inputs and outputs, and the parameters once per
  call);
- **ceiling** ``min(P, B * I)``: the most FLOP/s a layer of that intensity can reach;
- **predicted time** ``max(FLOPs / P, bytes / B)``: the roofline's time for the work; the
  measured time beyond it is the **time above the ceiling** (the headroom), and
  ``predicted / measured`` is the layer's **fraction of its ceiling** (achieved / ceiling).

The label, one rule each (the guide's three interpretation rules are the explanations):

1. **overhead-bound** when the roofline's time for one call is below the calibrated cost of one
   call (``predicted / calls < c``): a call takes about ``c + predicted``, so its fixed cost
   (Python, dispatch, kernel launch) is the larger part even at the ceiling. "Latency out of
   proportion to the FLOPs". Never with an unmeasured ``c`` (0).
2. else **compute-bound** when ``I`` reaches the machine's ridge ``P / B``: "high FLOPs relative
   to latency", arithmetic sets the time.
3. else **memory-bound**: bytes set the time; when parameters are most of the bytes moved, "many
   parameters and few FLOPs: weight loading dominates".

A compute- or memory-bound layer below :data:`FAR_BELOW_CEILING` of its ceiling also gets the
third rule in its explanation (overhead or poor memory access).

Which nodes are labelled: layer and instrumented-function calls that ran, were timed, have
known FLOPs and recorded bytes, and either have no children or do at least :data:`OWN_SHARE` of
their FLOPs in their own operations (a custom attention layer doing its matmuls itself). FLOPs,
not time, decide it, so the choice never depends on timing noise. Other containers are
summarised (:func:`container_summaries`): the time of the labelled layers inside them, by
bound. A labelled node inside a labelled one is ``nested``; the time by bound counts the
outermost only, so nothing is counted twice.

Example:
    >>> from tracetorch.analysis.machine import Machine
    >>> machine = Machine(peak_flops=1e12, bandwidth_bytes_per_s=1e11, call_overhead_ns=1_000)
    >>> weights = 4096 * 4096 * 4                       # a Linear(4096, 4096) at batch 1
    >>> bound = layer_bound(flops=2 * 4096 * 4096, bytes_moved=weights + 2 * 4096 * 4,
    ...                     time_ns=1_000_000, calls=1, machine=machine, param_bytes=weights)
    >>> bound.bound, round(bound.intensity, 3), f"{bound.fraction_of_ceiling:.0%}"
    ('memory-bound', 0.5, '67%')
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tracetorch.analysis.machine import Machine
from tracetorch.records.tree import CallNode
from tracetorch.text.units import format_percent, format_time_ns

__all__ = ("Bound", "BOUNDS", "LayerBound", "ContainerSummary", "layer_bound", "labelled_nodes",
           "unlabelled_reasons", "where_to_look_first", "time_by_bound", "container_summaries",
           "node_bytes", "OWN_SHARE", "FAR_BELOW_CEILING", "LOOK_FIRST", "SUMMARY_DEPTH")

Bound = Literal["compute-bound", "memory-bound", "overhead-bound"]
BOUNDS: tuple[Bound, ...] = ("compute-bound", "memory-bound", "overhead-bound")

#: A node with children is labelled when its own operations do at least this share of its FLOPs.
OWN_SHARE = 0.5
#: Below this fraction of its ceiling, a layer's time is out of proportion to its work.
FAR_BELOW_CEILING = 0.10
#: How many layers "Where to look first" names.
LOOK_FIRST = 3
#: Containers down to this depth are summarised (1 = top-level calls).
SUMMARY_DEPTH = 2


def _row_label(path: str, type_name: str) -> str:
    name = path or "<model>"
    return f"{name} ({type_name})" if type_name else name


@dataclass(frozen=True)
class LayerBound:
    """One layer's roofline evidence and label (every time in ns, rates per second).

    ``flops`` are inclusive forward FLOPs (``complete`` is False when they are a lower bound);
    ``param_bytes`` is the parameters' share of ``bytes_moved`` (once per call).
    """

    path: str
    type_name: str
    calls: int
    time_ns: int
    flops: int
    bytes_moved: int
    param_bytes: int
    bound: Bound
    intensity: float
    achieved_flops: float
    achieved_bytes: float
    ceiling_flops: float
    fraction_of_ceiling: float
    predicted_ns: float
    excess_ns: float
    explanation: str
    complete: bool = True
    nested: bool = False

    @property
    def label(self) -> str:
        """``"path (Type)"``, as the tree table names a row."""
        return _row_label(self.path, self.type_name)


def layer_bound(flops: int, bytes_moved: int, time_ns: int, calls: int, machine: Machine, *,
                param_bytes: int = 0, path: str = "", type_name: str = "",
                complete: bool = True, nested: bool = False) -> LayerBound:
    """Label work of ``flops`` FLOPs and ``bytes_moved`` bytes done in ``calls`` calls taking
    ``time_ns`` in all (see the module docstring for the rules).

    Raises:
        ValueError: a negative count, no calls, or no time (the message names it).

    Example:
        >>> from tracetorch.analysis.machine import Machine
        >>> m = Machine(peak_flops=1e12, bandwidth_bytes_per_s=1e11, call_overhead_ns=1_000)
        >>> tiny = layer_bound(flops=36, bytes_moved=112, time_ns=2_000, calls=1, machine=m)
        >>> tiny.bound, tiny.explanation.split(":")[0]
        ('overhead-bound', 'latency out of proportion to its FLOPs')
    """
    for name, value in (("flops", flops), ("bytes_moved", bytes_moved),
                        ("param_bytes", param_bytes)):
        if value < 0:
            raise ValueError(f"{name}: expected a count >= 0, got {value!r}")
    if calls < 1:
        raise ValueError(f"calls: expected at least 1, got {calls!r}")
    if time_ns <= 0:
        raise ValueError(f"time_ns: expected a positive time, got {time_ns!r}")
    seconds = time_ns / 1e9
    intensity = flops / bytes_moved if bytes_moved else float("inf")
    predicted = machine.predicted_ns(flops, bytes_moved)
    fraction = predicted / time_ns  # = achieved FLOP/s / ceiling, also when there are no FLOPs
    overhead = machine.call_overhead_ns
    bound: Bound
    if overhead and predicted / calls < overhead:
        bound = "overhead-bound"
        why = (f"latency out of proportion to its FLOPs: at the roofline a call needs "
               f"{format_time_ns(predicted / calls)}, less than one call's fixed cost "
               f"({format_time_ns(overhead)}: Python, dispatch, launches); fewer, larger calls "
               "(batching, fusing) are the remedy")
    elif intensity >= machine.ridge_intensity:
        bound = "compute-bound"
        why = (f"high FLOPs relative to bytes ({intensity:.3g} FLOP/B, at or above the ridge "
               f"{machine.ridge_intensity:.3g}): arithmetic sets its time; faster matmul "
               "hardware or a lower precision helps")
    else:
        bound = "memory-bound"
        ridge = f"{intensity:.3g} FLOP/B, below the ridge {machine.ridge_intensity:.3g}"
        moved = param_bytes * calls
        if bytes_moved and 2 * moved >= bytes_moved:
            why = (f"many parameters and few FLOPs: weight loading dominates (parameters are "
                   f"{format_percent(moved, bytes_moved)} of the bytes moved; {ridge})")
        else:
            why = (f"few FLOPs per byte: reading and writing activations dominates ({ridge})")
    if bound != "overhead-bound" and fraction < FAR_BELOW_CEILING:
        why += (f"; at {fraction:.1%} of its ceiling, though, its latency is out of "
                "proportion to its FLOPs: overhead or poor memory access")
    return LayerBound(
        path=path, type_name=type_name, calls=calls, time_ns=time_ns, flops=flops,
        bytes_moved=bytes_moved, param_bytes=param_bytes * calls, bound=bound,
        intensity=intensity, achieved_flops=flops / seconds, achieved_bytes=bytes_moved / seconds,
        ceiling_flops=machine.ceiling(intensity), fraction_of_ceiling=fraction,
        predicted_ns=predicted, excess_ns=max(0.0, time_ns - predicted), explanation=why,
        complete=complete, nested=nested)


def node_bytes(node: CallNode) -> tuple[int, int]:
    """``(bytes moved, parameter bytes)`` of a node's calls; ``(0, 0)`` when no memory was
    recorded (``profile(memory=False)``, or a profile saved before memory was).

    Example:
        >>> node_bytes(CallNode.root())
        (0, 0)
    """
    memory: Any = getattr(node, "memory", None)
    if not memory:
        return 0, 0
    return int(memory.bytes_moved(node.calls)), int(memory.param_bytes)


def _why_unlabelled(node: CallNode) -> str | None:
    # The one labelling rule (see the module docstring): None when the node gets a label.
    if node.kind not in ("module", "function"):
        return "not a layer call"
    if node.calls < 1 or node.total_ns <= 0:
        return "no time recorded"
    if node.flops_unknown:
        return "FLOPs unknown"
    if not node_bytes(node)[0]:
        return "no bytes recorded"
    if node.children and not (node.flops > 0 and node.flops >= OWN_SHARE * node.subtree_flops):
        return "a container"
    return None


def unlabelled_reasons(root: CallNode) -> dict[str, int]:
    """Why the layer calls under ``root`` left without a label have none, counted by reason
    (leaves only: containers are summarised, not labelled).

    Example:
        >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(1_000)
        >>> unlabelled_reasons(root)
        {'FLOPs unknown': 1}
    """
    reasons: dict[str, int] = {}
    for node in root.walk():
        if node.kind in ("module", "function") and not node.children:
            why = _why_unlabelled(node)
            if why is not None:
                reasons[why] = reasons.get(why, 0) + 1
    return reasons


def labelled_nodes(root: CallNode, machine: Machine) -> list[tuple[CallNode, LayerBound]]:
    """Every labelled node under ``root`` with its :class:`LayerBound`, in call order.

    Example:
        >>> from tracetorch.analysis.machine import Machine
        >>> labelled_nodes(CallNode.root(), Machine(1e12, 1e11))
        []
    """
    found: list[tuple[CallNode, LayerBound]] = []
    # A stack, not recursion, as CallNode.walk: a 1,000-layer chain is within reach.
    stack = [(root, False)]
    while stack:
        node, inside = stack.pop()
        here = _why_unlabelled(node) is None
        if here:
            moved, params = node_bytes(node)
            found.append((node, layer_bound(
                node.subtree_flops, moved, node.total_ns, node.calls, machine,
                param_bytes=params, path=node.path, type_name=node.type_name,
                complete=node.completeness == "complete", nested=inside)))
        stack.extend((child, inside or here) for child in reversed(node.children.values()))
    return found


def where_to_look_first(bounds: list[LayerBound], top: int = LOOK_FIRST) -> list[LayerBound]:
    """The ``top`` layers with the most time above their ceiling (the largest headroom).

    Example:
        >>> where_to_look_first([])
        []
    """
    ranked = sorted((b for b in bounds if b.excess_ns > 0), key=lambda b: -b.excess_ns)
    return ranked[:top]


def time_by_bound(bounds: list[LayerBound]) -> dict[Bound, int]:
    """Measured time of the outermost labelled layers, by label (nested ones are inside them).

    Example:
        >>> time_by_bound([])
        {'compute-bound': 0, 'memory-bound': 0, 'overhead-bound': 0}
    """
    shares: dict[Bound, int] = {bound: 0 for bound in BOUNDS}
    for b in bounds:
        if not b.nested:
            shares[b.bound] += b.time_ns
    return shares


@dataclass(frozen=True)
class ContainerSummary:
    """An unlabelled container: its time and the time of the labelled layers inside it, by
    bound (what is left is time no label explains: its own glue, unlabelled children)."""

    path: str
    type_name: str
    time_ns: int
    by_bound: dict[Bound, int]

    @property
    def label(self) -> str:
        """``"path (Type)"``."""
        return _row_label(self.path, self.type_name)


def container_summaries(root: CallNode, labelled: list[tuple[CallNode, LayerBound]],
                        depth: int = SUMMARY_DEPTH) -> list[ContainerSummary]:
    """One summary per unlabelled container down to ``depth`` that holds labelled layers, in
    call order; ``labelled`` is :func:`labelled_nodes` of ``root``.

    Example:
        >>> container_summaries(CallNode.root(), [])
        []
    """
    outer = {id(node): bound for node, bound in labelled if not bound.nested}
    found = []
    for node in root.walk():
        if node.kind not in ("module", "function") or node.depth > depth \
                or id(node) in outer or not node.children:
            continue
        shares: dict[Bound, int] = {bound: 0 for bound in BOUNDS}
        for below in node.walk():
            inner = outer.get(id(below))
            if inner is not None:
                shares[inner.bound] += inner.time_ns
        if any(shares.values()):
            found.append(ContainerSummary(node.path, node.type_name, node.total_ns, shares))
    return found
