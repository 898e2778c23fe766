"""A recording that keeps only a running FLOP total: what ``count_flops`` reads, and nothing else.

A profile keeps a node per call path, a counter per input key and folds them into each node's
own FLOPs when it stops; a one-shot count reads one number from all that. :class:`TallyCollector`
speaks the same protocol to the wrappers (each call gets a :class:`~tracetorch.engine.hotpath.
Frame` from :meth:`~TallyCollector.new_child` and ends in :meth:`~TallyCollector.first_entry`)
but makes a :class:`Tally` per call instead of a node (one per caller's call: a layer called in
a loop of one call takes up its tally again), makes no per-key counter (so every call's end
is a first one), and at each call's end adds the call's own share to the total, as the fold
would add it to the call's node:

- a call with a rule costs what its rule says (its own operations were the rule's subject),
  plus its calls beside the rule (a parametrization computing its weight); one whose rule says
  it costs nothing, what its children cost; any other, its own counted operations plus its
  children;
- its own share is that minus what its children's calls cost, never below 0.

A backward pass run inside a counted call (a forward computing gradients), and every layer it
runs again (activation checkpointing), counts nothing, as backward and recompute nodes count
nothing in ``forward_flops``. The shares are per call where a profile's are per node: the two
differ only where a rule smaller than its children's rules clamps some calls of one node and
not others.

Example (``count_forward`` opens the engine with one):
    >>> import numpy as np
    >>> from tracetorch.core import Linear, ReLU, Sequential, Tensor
    >>> from tracetorch.profiler import profile
    >>> from tracetorch.profiler.counting import count_forward
    >>> model, x = Sequential(Linear(4, 3), ReLU()), Tensor(np.ones((2, 4)))
    >>> with profile(model) as named:
    ...     _ = model(x)
    >>> count_forward(model, lambda: model(x))[0], named.forward_flops
    (54, 54)
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Callable

from tracetorch.engine.collector import RULED_KINDS, RULED_STATES, Collector, call_type_name
from tracetorch.engine.hotpath import NO_COUNTERS, Frame
from tracetorch.engine.unsupported import warn_unsupported
from tracetorch.flops.registry import (
    NO_RULE,
    FlopCount,
    FlopRegistry,
    default_registry,
    hooks_run_inside,
)
from tracetorch.models.introspect import (
    bound_inputs,
    computes_a_weight,
    is_torch_module,
    only_calls_children,
    returns_an_input,
    runs_compiled_graph,
    runs_sequential_forward,
)
from tracetorch.records.tree import CALLS, CallNode, NodeKind, new_entry

__all__ = ("Tally", "TallyCollector")

_new_tuple = tuple.__new__
# What a call's end hands the wrappers: a counter counted already (no fold is to take it up).
_COUNTED = new_entry()
_COUNTED[CALLS] = 1


#: Which instances of a class the facts cached for it hold for (see _reach):
#: every one; those whose children have no forward hooks; those with none below them; none.
_EVERY_INSTANCE, _HOOKLESS_CHILDREN, _HOOKLESS_BELOW, _NO_INSTANCE = range(4)


ClassFacts = tuple[tuple[str, str, Any, bool, bool | None, bool], int]

#: The facts of the layer classes counted with the process-wide rules (see
#: TallyCollector.new_child), kept from one count to the next: per the rules' generation and
#: whether operations are counted, and at most :data:`_KEPT_CLASSES` classes (those a loop
#: makes afresh are not all kept alive).
_KEPT: dict[tuple[int, bool], dict[type, ClassFacts]] = {}
_KEPT_CLASSES = 4096


def _class_facts_kept(registry: FlopRegistry, count_ops: bool) -> dict[type, ClassFacts]:
    # The facts kept for counts with ``registry`` (a profile's own rules: kept for its count only).
    if registry is not default_registry:
        return {}
    key = (registry.generation, count_ops)
    kept = _KEPT.get(key)
    if kept is None or len(kept) > _KEPT_CLASSES:
        if kept is None:
            _KEPT.clear()  # (the facts of older rules are found no more)
        kept = _KEPT[key] = {}
    return kept


def _reach(owner: Any, rule: Any, registry: FlopRegistry) -> int:
    # Which other instances of ``owner``'s class the facts found for it (its ``rule``) hold for
    # (asked once per class and count): a Sequential's counting depends on its children's
    # hooks, a built-in rule's cover of a layer with sublayers on their hooks
    # (only_calls_children, FlopRegistry.lookup), or on the layer's settings where the rule
    # says which it covers. (The class's rule, not this instance's: a hooked one has none.)
    if runs_sequential_forward(owner):
        return _HOOKLESS_CHILDREN
    if not (getattr(owner, "__dict__", None) or {}).get("_modules"):
        return _EVERY_INSTANCE
    if rule is NO_RULE:
        rule = registry.lookup(type(owner))
    if rule is NO_RULE or rule is None:
        return _EVERY_INSTANCE
    return _NO_INSTANCE if registry.covers_some(type(owner)) else _HOOKLESS_BELOW


def _holds(owner: Any, reach: int) -> bool:
    # Whether facts of ``reach`` hold for ``owner``.
    if reach == _EVERY_INSTANCE:
        return True
    if reach == _NO_INSTANCE:
        return False
    return not hooks_run_inside(owner, deep=reach == _HOOKLESS_BELOW)


class Tally:
    """One open call of a :class:`TallyCollector`: what its frame's ``node`` is.

    It answers what the wrappers and the operation counters ask of a node during a forward
    call (``engine.op_flops``, ``note_op``, ``flops_source``, ``rule_state``, ``kind``,
    ``type_name``) and holds what the call's end needs: the FLOPs its children's calls
    reported, and whether it saw any operation or child at all (an unsupported layer's test).

    Example:
        >>> call = Tally(None, "Attention", "module", "none", None, True, True)
        >>> call.note_op("matmul", 1, 8); call.engine.op_flops, call.saw_ops
        (0, True)
    """

    __slots__ = ("parent", "type_name", "kind", "rule_state", "rule", "counts", "counts_ops",
                 "beside_rule", "op_flops", "op_gemm", "below", "beside", "saw_ops",
                 "saw_children", "flops_source")

    def __init__(self, parent: Tally | CallNode | None, type_name: str, kind: NodeKind,
                 rule_state: str, rule: Callable[..., Any] | None, counts: bool,
                 counts_ops: bool, beside_rule: bool = False) -> None:
        self.parent = parent
        self.type_name = type_name
        self.kind = kind
        self.rule_state = rule_state
        #: The registered rule (``"rule"``) or ``instrument(flops=...)``'s function (``"user"``).
        self.rule = rule
        #: Whether its share goes to the total (not inside a backward pass).
        self.counts = counts
        #: Whether the operations run directly in it are counted.
        self.counts_ops = counts_ops
        #: Whether its cost adds to its caller's rule (see NodeState.beside_rule).
        self.beside_rule = beside_rule
        self.op_flops = 0
        self.op_gemm = 0
        #: FLOPs its children's calls reported (each one's inclusive count), and of them those
        #: beside a rule (a parametrization's, at any depth below).
        self.below = 0
        self.beside = 0
        self.saw_ops = False
        self.saw_children = False
        self.flops_source = "none"

    #: A tally keeps no children (their calls report to :attr:`below`): a backward pass run
    #: inside a counted call finds none to subtract.
    children: Mapping[str, Any] = MappingProxyType({})

    @property
    def engine(self) -> Tally:
        """Itself: a node keeps these counts in its engine state, a tally in itself."""
        return self

    def note_op(self, name: str, calls: int, flops: int = 0, elapsed_ns: int = 0) -> None:
        """An operation ran directly in this call (its FLOPs are charged to ``op_flops``)."""
        self.saw_ops = True


class TallyCollector(Collector):
    """A collector for one forward call whose only reading is :attr:`total` (see the module
    docstring); its tree stays empty but for the operations run outside every layer, which
    its root counts as a profile's root does.

    Everything a profile would keep for a report (times, failures, backward work, a node's
    counters) is dropped: nobody reads it.
    """

    records_tree = False

    def __init__(self, root: CallNode, model: Any, **settings: Any) -> None:
        super().__init__(root, model, **settings)
        self._total = 0
        # Per layer class, what new_child decides from the class alone (see _class_facts).
        self._classes = _class_facts_kept(self.registry, self.count_ops)

    @property
    def total(self) -> int:
        """Forward FLOPs of the calls recorded so far: each call's own share, and the root's
        own operations (those run outside every layer)."""
        return self._total + self.root.engine.op_flops

    def new_child(self, frame: Frame, owner: Any, kind: NodeKind, label: str | None,
                  flops_fn: Callable[..., int] | None) -> Frame:
        """The frame of this one call of ``owner`` under ``frame``: whether its operations are
        counted is decided as :meth:`Collector.adopt` decides it."""
        parent = frame.node
        # (a layer's facts depend on its class alone, looked up once per class, but for one
        # with a forward assigned on it, and for the classes whose instances decide them: see
        # _reach)
        by_class = (kind == "module" and flops_fn is None
                    and "forward" not in (getattr(owner, "__dict__", None) or ()))
        cached = self._classes.get(owner.__class__) if by_class else None
        # (the common case, facts for every instance, asked without a call: count_flops's goal)
        if cached is not None and (cached[1] == _EVERY_INSTANCE or _holds(owner, cached[1])):
            facts = cached[0]
        else:
            facts = self._class_facts(owner, kind, label, flops_fn)
            if by_class and cached is None:
                reach = _reach(owner, facts[2], self.registry)
                if _holds(owner, reach):  # (the facts of a hookless instance: its class's)
                    self._classes[owner.__class__] = (facts, reach)
        type_name, rule_state, rule, torch_module, ops, beside_rule = facts
        # (a backward pass, and every layer it runs again, is no forward work)
        counts = kind != "backward" and (parent.__class__ is not Tally or parent.counts)
        if ops is None:  # as its caller
            ops = frame.ops
        call = Tally(parent, type_name, kind, rule_state, rule, counts, ops, beside_rule)
        # Its counters are hotpath's NO_COUNTERS: no key is made for its calls, and each call's
        # end is a first_entry. Kept under its caller's frame, as a node's is, for the calls of
        # one layer in a loop of one call (an RNN's cell): the same frame and tally again,
        # emptied at each call's end.
        child = _new_tuple(Frame, (self, call, owner, ops, torch_module, [], NO_COUNTERS, [None],
                                   {}))
        frame.child_frames[id(owner)] = child
        return child

    def _class_facts(self, owner: Any, kind: NodeKind, label: str | None,
                     flops_fn: Callable[..., int] | None
                     ) -> tuple[str, str, Any, bool, bool | None, bool]:
        # A call's type name, rule state and rule, whether it is a torch module, whether its
        # operations are counted (None: as its caller's are) and whether it is beside its
        # caller's rule, as Collector.adopt decides.
        rule: Any = flops_fn
        if flops_fn is not None:
            rule_state = "user"
        elif kind in RULED_KINDS:
            rule = self.registry.lookup(type(owner), owner)
            rule_state = "none" if rule is NO_RULE else ("free" if rule is None else "rule")
        else:
            rule_state = "none"
        torch_module = is_torch_module(owner)
        ops: bool | None = None
        if torch_module:
            ops = (self.count_ops and rule_state not in RULED_STATES
                   and not only_calls_children(owner))
        elif kind == "optimizer":
            ops = False
        return (call_type_name(owner, kind, label), rule_state, rule, torch_module, ops,
                torch_module and computes_a_weight(owner))

    def first_entry(self, node: Any, owner: Any, key: Any, shape: Any,
                    args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> list[Any]:
        """The end of one call (``node``, its :class:`Tally`): its own share to the total, its
        inclusive FLOPs to its parent's; a counter that is kept nowhere."""
        state = node.rule_state
        below = node.below
        if state == "rule":
            # (keyword arguments go where the forward takes them: rules read positions)
            try:
                result = node.rule(owner, bound_inputs(owner, args, kwargs) if kwargs else args,
                                   output)
            except Exception as error:
                self.rule_failed(node, node.rule, error)
                result = node.below  # (its own FLOPs unknown: what its children counted)
            inclusive = int(result.flops if result.__class__ is FlopCount else result) + node.beside
        elif state == "user":
            inclusive = int(node.rule(*args, **kwargs)) + node.beside
        elif state == "free":
            inclusive = below
        else:
            inclusive = node.op_flops + below
            if (not inclusive and not node.saw_children and node.kind == "module"
                    and node.flops_source == "none" and self.warn_unsupported
                    and not (not node.saw_ops and is_torch_module(owner)
                             and (node.counts_ops or only_calls_children(owner))
                             and returns_an_input(args, kwargs, output))):
                # (a torch module that ran nothing, or runs none of its own (an empty
                # nn.Sequential), and handed back its input costs a known 0)
                warn_unsupported(node.type_name, runs_compiled_graph(owner), stacklevel=2)
        if node.counts and inclusive > below:
            self._total += inclusive - below
        parent = node.parent
        if parent.__class__ is Tally:
            parent.below += inclusive
            # (beside every ruled layer above: all of it, or what of it was beside below)
            parent.beside += inclusive if node.beside_rule else node.beside
            parent.saw_children = True
        # (empty for its next call, if its frame is called again from its caller's call)
        node.below = node.beside = node.op_flops = node.op_gemm = 0
        node.saw_ops = node.saw_children = False
        return _COUNTED.copy()

    def stop(self) -> None:
        """Stop recording: nothing to fold (the total is kept as calls end, the root's own
        operations read where they are); the root frame and the top-level calls' frames (and
        the user's objects they hold) are dropped."""
        self.set_active(False)
        self.root_frame = None
        self.root.engine.child_frames.clear()

    def record_failure(self, node: Any, start: int, end: int) -> None:
        """Nothing: the count fails with the call."""

    def add_duration(self, node: Any, start: int, end: int) -> None:
        """Nothing: a count times nothing."""

    def add_backward(self, node: Any, flops: int, gemm: bool, elapsed_ns: int) -> None:
        """Nothing: backward work is no forward FLOPs."""

    def add_backward_pass(self, spent: dict[Any, int], flops: dict[Any, int]) -> None:
        """Nothing: backward work is no forward FLOPs."""

    def flush_backward(self, pass_node: Any = None) -> None:
        """Nothing: backward work is no forward FLOPs."""

    def touch(self, node: Any) -> None:
        """Nothing: no node waits for a fold."""
