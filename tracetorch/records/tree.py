"""The call tree: one :class:`CallNode` per call path (parent node + child name).

A module shared by three parents appears under each of them with its own counts; the
``module_key`` each node carries lets by-module views fold those call sites back into one row
without counting anything twice.

Example:
    >>> root = CallNode.root()
    >>> child = root.child("layers.0", "Linear", "m1")
    >>> child.path, child.depth
    ('layers.0', 1)
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable, Generic, Literal, NamedTuple, Optional, TypeVar, overload

from tracetorch.records.memory import MemoryStats
from tracetorch.records.stats import TimeStats

__all__ = ("CallNode", "Completeness", "ENTRY_FIELDS", "MAX_SHAPES", "NodeKind", "OpRow",
           "NOT_FORWARD_KINDS", "RuleState", "Shape", "SubtreeSums", "new_entry",
           "set_engine_state",
           "ShapeSignature", "TimelineEvent",
           "CALLS", "FLOPS", "GEMM_FLOPS", "MACS", "INPUT_BYTES", "OUTPUT_BYTES", "SAVED_BYTES",
           "LEARNED", "REPLAYED", "BUDGET",
           "KEY")

#: What a node stands for: a layer call, an instrumented function, a backward pass, an optimizer
#: step, another thread's calls (``profile(all_threads=True)``), a layer run again in backward,
#: batches taken from a data loader, or the tree's root.
NodeKind = Literal["root", "module", "function", "backward", "optimizer", "thread", "recompute",
                   "data"]
#: Node kinds whose FLOPs are no forward work: a backward pass's node (a summary of work its
#: layers hold) and a layer run again inside one (activation checkpointing's recomputation).
NOT_FORWARD_KINDS = frozenset({"backward", "recompute"})
#: Where a node's FLOPs come from: a registered rule, ``instrument(flops=...)``, a rule of
#: ``None`` (declared free) or no rule (its counted tensor operations).
RuleState = Literal["rule", "user", "free", "none"]
#: How much of a node's inclusive FLOPs is known: all of it; a lower bound (a layer below ran
#: with no FLOP rule and no counted operation); or nothing (this layer itself is such a layer).
Completeness = Literal["complete", "partial", "unknown"]

#: The slots of a per-shape counter in a node's ``engine.flops_cache``: calls since the last
#: fold, the rule's inclusive FLOPs (``None``: the node's FLOPs come from counted operations),
#: its GEMM FLOPs and MACs, one call's input, output and saved-for-backward bytes, the call
#: key they were measured for (:func:`tracetorch.engine.hotpath.call_key`), what is learned
#: of the operations such a call runs (``None`` until an adapter learns something: see
#: :func:`tracetorch.engine.hotpath.set_op_replay`), how many calls since the last fold
#: its learned counts stand in for (added to the node at the fold), and how many more calls
#: they may stand in for before the adapter checks them again (spent by the calls replayed,
#: set by the adapter; 0 for a counter with nothing learned). An adapter may keep
#: what it derives once per key after these (torch: the call's gradient parts).
#:
#: A list rather than an object with attributes: the hot path bumps ``calls`` on every layer
#: call, in C as well (``engine/_hotpath.c``), where a list's item is one memory read. Code
#: reads the slots by name, through the indices below; the C finds them in this tuple by name
#: when it starts (``tests/test_c_contract.py`` checks the names it asks for).
ENTRY_FIELDS = ("calls", "flops", "gemm_flops", "macs", "input_bytes", "output_bytes",
                "saved_bytes", "key", "learned", "replayed", "budget")
CALLS = ENTRY_FIELDS.index("calls")
FLOPS = ENTRY_FIELDS.index("flops")
GEMM_FLOPS = ENTRY_FIELDS.index("gemm_flops")
MACS = ENTRY_FIELDS.index("macs")
INPUT_BYTES = ENTRY_FIELDS.index("input_bytes")
OUTPUT_BYTES = ENTRY_FIELDS.index("output_bytes")
SAVED_BYTES = ENTRY_FIELDS.index("saved_bytes")
KEY = ENTRY_FIELDS.index("key")
LEARNED = ENTRY_FIELDS.index("learned")
REPLAYED = ENTRY_FIELDS.index("replayed")
BUDGET = ENTRY_FIELDS.index("budget")
#: A counter with nothing counted yet: no call, no rule's FLOPs, no bytes, no key, nothing learned.
_EMPTY_ENTRY = [None if name in ("flops", "key", "learned") else 0 for name in ENTRY_FIELDS]


def new_entry() -> list[Any]:
    """A per-shape counter with nothing counted yet (see :data:`ENTRY_FIELDS`).

    Example:
        >>> entry = new_entry()
        >>> entry[CALLS], entry[FLOPS], entry[SAVED_BYTES]
        (0, None, 0)
    """
    return _EMPTY_ENTRY.copy()


#: How many distinct input/output shape signatures a node keeps.
MAX_SHAPES = 4

Shape = tuple[int, ...]
#: The shapes of one call's tensor arguments (``None`` for a non-tensor argument).
ShapeSignature = tuple[Optional[Shape], ...]


_Field = TypeVar("_Field")


def _no_engine_state() -> None:
    return None


# Makes each new node's engine state (CallNode.engine); the engine sets its own when it loads
# (set_engine_state), so this layer never names the engine's types.
_make_engine_state: Callable[[], Any] = _no_engine_state


def set_engine_state(make: Callable[[], Any]) -> None:
    """Have every node made from now on carry ``make()`` as its :attr:`CallNode.engine` (the
    recording engine registers its per-node state here when it is imported).

    Example:
        >>> import tracetorch.engine.node_state  # registers the engine's
        >>> type(CallNode.root().engine).__name__
        'NodeState'
    """
    global _make_engine_state
    _make_engine_state = make


class _MadeOnFirstUse(Generic[_Field]):
    """A node's field made by ``make()`` when it is first read, kept in the slot of the same
    name with a leading underscore (``None`` until then). A layer's first call makes its node
    inside the forward, where every allocation costs several times what it costs later.

    Example:
        >>> node = CallNode.root()
        >>> node._memory is None, node.memory.saved_bytes, node._memory is node.memory
        (True, 0, True)
    """

    def __init__(self, make: Callable[[], _Field]) -> None:
        self.make = make
        self.slot = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    @overload
    def __get__(self, node: None, owner: type) -> _MadeOnFirstUse[_Field]: ...

    @overload
    def __get__(self, node: CallNode, owner: type) -> _Field: ...

    def __get__(self, node: CallNode | None, owner: type) -> Any:
        if node is None:
            return self
        value = getattr(node, self.slot)
        if value is None:
            value = self.make()
            setattr(node, self.slot, value)
        return value

    def __set__(self, node: CallNode, value: _Field) -> None:
        setattr(node, self.slot, value)


class CallNode:
    """Aggregated calls of one layer (or instrumented function) at one call path.

    Attributes:
        name: the name under the parent (``"0"``, ``"q_proj"``; the type name when unnamed).
        type_name: the class (or function) name.
        kind: ``"module"``, ``"function"``, ``"backward"``, ``"optimizer"``, ``"recompute"`` (a
            layer run again inside a backward pass: activation checkpointing), ``"thread"`` (the
            calls of another thread, with ``profile(all_threads=True)``) or ``"root"``.
        module_key: identifies the instance, shared by every call site of one module.
        depth: 0 for the root, 1 for top-level calls (0 again once :meth:`unlink` ran).
        time: inclusive forward time per call.
        flops: forward FLOPs of all calls; ``gemm_flops`` the matmul/convolution part of it.
        flops_source: ``"rule"`` (an analytical rule), ``"ops"`` (counted tensor operations),
            ``"user"`` (``instrument(flops=...)``), ``"uncounted"`` (its calls ran an
            operation that computes but has no formula: a fused LSTM, a solver) or ``"none"``.
        macs: multiply-accumulates where defined (``None`` where not).
        params: the module's parameters (its whole subtree, shared tensors once).
        backward_time / backward_flops / backward_gemm_flops: gradient computation attributed
            to this node's forward calls.
        errors: calls that raised.
        memory: bytes read, written, held as parameters and saved for backward
            (:class:`~tracetorch.records.memory.MemoryStats`).
        ops: the tensor operations run directly in this node's calls (not in layers below):
            ``{name: [calls, FLOPs, time ns]}`` (time with ``profile(op_timing=True)``); see
            :meth:`op_table`.
        engine: the recording engine's working state for this node
            (:class:`tracetorch.engine.node_state.NodeState`: per-key counters, children by
            caller, the open-call record); only the engine and its adapters read it.
    """

    __slots__ = (
        "name", "type_name", "kind", "module_key", "parent", "children", "time",
        "flops", "gemm_flops", "macs", "flops_source", "params", "input_shapes",
        "output_shapes", "_backward_time", "backward_flops", "backward_gemm_flops", "errors",
        "_memory", "ops", "engine", "depth",
    )

    def __init__(self, name: str, type_name: str, module_key: str, kind: NodeKind = "module",
                 parent: CallNode | None = None) -> None:
        self.name = name
        self.type_name = type_name
        self.kind = kind
        self.module_key = module_key
        self.parent = parent
        # (Kept, not walked: the engine asks at each node it makes.)
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.children: dict[str, CallNode] = {}
        self.time = TimeStats()
        self.flops = 0
        self.gemm_flops = 0
        self.macs: int | None = None
        self.flops_source = "none"
        self.params = 0
        self.input_shapes: list[ShapeSignature] = []
        self.output_shapes: list[ShapeSignature] = []
        # backward_time and memory, made at their first use (see _MadeOnFirstUse):
        self._backward_time: TimeStats | None = None
        self.backward_flops = 0
        self.backward_gemm_flops = 0
        self.errors = 0
        self._memory: MemoryStats | None = None
        self.ops: dict[str, list[int]] = {}
        # What the engine keeps for this node while a profile records it (its per-key
        # counters, children by caller, open-call record...): the engine's own type, opaque here.
        self.engine = _make_engine_state()

    # (the forward-only nodes of count_flops never use them)
    backward_time = _MadeOnFirstUse(TimeStats)
    memory = _MadeOnFirstUse(MemoryStats)

    @classmethod
    def root(cls) -> CallNode:
        """An empty root whose children are the top-level calls."""
        return cls("", "", "", kind="root")

    def child(self, name: str, type_name: str, module_key: str,
              kind: NodeKind = "module") -> CallNode:
        """The child called ``name``, created on first use."""
        node = self.children.get(name)
        if node is None:
            node = CallNode(name, type_name, module_key, kind, parent=self)
            self.children[name] = node
        return node

    # ----------------------------------------------------------------- derived quantities
    @property
    def calls(self) -> int:
        """How many times this call path ran forward."""
        return self.time.count

    @property
    def total_ns(self) -> int:
        """Inclusive forward time of all calls (for a ``thread`` group: its calls' total)."""
        if self.kind == "thread":
            return sum(c.total_ns for c in self.children.values())
        return self.time.total_ns

    @property
    def self_ns(self) -> int:
        """Inclusive time minus the children's inclusive time (never negative)."""
        return max(0, self.time.total_ns - sum(c.time.total_ns for c in self.children.values()))

    @property
    def flops_per_call(self) -> float:
        """Mean forward FLOPs per call."""
        return self.flops / self.calls if self.calls else 0.0

    @property
    def flops_unknown(self) -> bool:
        """Whether this layer's own FLOPs are unknown: it ran, has no FLOP rule, and neither
        counted operations nor calls below it explain its work (see :attr:`completeness`); an
        optimizer step with no rule, whatever ran below it (LBFGS's closure); a call that ran
        an operation with no formula (its count is a lower bound)."""
        source = self.flops_source
        return source == "uncounted" or (
            source == "none" and self.calls > 0
            and (self.kind == "optimizer" or (self.kind == "module" and not self.children)))

    @property
    def completeness(self) -> Completeness:
        """``"complete"`` when every FLOP of this subtree is known; ``"partial"`` when some
        layer below it has unknown FLOPs (the inclusive count is a lower bound); ``"unknown"``
        for such a layer itself.

        Example:
            >>> root = CallNode.root()
            >>> block = root.child("block", "Block", "m0"); block.time.add(5)
            >>> fc, odd = block.child("fc", "Linear", "m1"), block.child("odd", "Odd", "m2")
            >>> fc.time.add(2); fc.flops_source = "rule"; odd.time.add(1)
            >>> block.completeness, fc.completeness, odd.completeness
            ('partial', 'complete', 'unknown')
        """
        if self.flops_unknown:
            return "unknown"
        if any(node.flops_unknown for node in self.walk()):
            return "partial"
        return "complete"

    def subtree_sum(self, field: str) -> int:
        """``field`` (``"flops"``, ``"gemm_flops"``, ``"backward_flops"``...) summed over this
        node and every descendant."""
        return sum(getattr(node, field) for node in self.walk())

    @property
    def subtree_flops(self) -> int:
        """This node's FLOPs plus every descendant's (what the node cost, inclusive)."""
        return self.subtree_sum("flops")

    @property
    def subtree_gemm_flops(self) -> int:
        """Matmul/convolution FLOPs of this node and every descendant."""
        return self.subtree_sum("gemm_flops")

    @property
    def subtree_backward_flops(self) -> int:
        """Backward FLOPs of this node and every descendant."""
        return self.subtree_sum("backward_flops")

    @property
    def bytes_moved(self) -> int:
        """Bytes this node's calls read and wrote: inputs, outputs, and its parameters once per
        call (the convention of :mod:`tracetorch.records.memory`)."""
        return self.memory.bytes_moved(self.calls)

    @property
    def subtree_saved_bytes(self) -> int:
        """Bytes saved for backward by this node's calls and every call below them."""
        return sum(node.memory.saved_bytes for node in self.walk())

    @property
    def path(self) -> str:
        """Dotted call path from the top (``""`` for the root)."""
        names = []
        node: CallNode | None = self
        while node is not None and node.kind != "root":
            if node.name:  # the profiled model's own node is unnamed, like named_modules()
                names.append(node.name)
            node = node.parent
        return ".".join(reversed(names))

    def walk(self) -> Iterator[CallNode]:
        """This node and its descendants, depth first, in call order."""
        # A stack, not recursion: a deep tree (a 1,000-layer chain) costs its size, not its
        # depth squared, and no recursion limit applies.
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            children = node.children
            if children:  # (most nodes are leaves: nothing to copy)
                # (copied in one step: another thread may add one meanwhile, a live profile
                # read from a monitor thread)
                stack.extend(reversed(tuple(children.values())))

    def unlink(self) -> None:
        """Drop the parent links of this subtree, which make every tree a reference cycle: a
        tree nobody keeps is then freed by reference counting as soon as it is dropped, not at a
        later pass of the cyclic garbage collector. Each node's ``path`` then names only itself
        (and its ``depth`` is 0).

        Example:
            >>> root = CallNode.root()
            >>> child = root.child("fc", "Linear", "m1")
            >>> root.unlink()
            >>> child.parent is None, child.path
            (True, 'fc')
        """
        for node in self.walk():
            node.parent = None
            node.depth = 0

    def find(self, path: str) -> CallNode:
        """The first descendant (depth first) whose dotted path is ``path``; ``""`` is the
        profiled model's own node."""
        for node in self.walk():
            if node is not self and node.path == path:
                return node
        raise KeyError(f"no call path {path!r} in this profile")

    def note_shapes(self, inputs: ShapeSignature, output: ShapeSignature) -> None:
        """Keep the first MAX_SHAPES distinct input and output signatures."""
        if inputs not in self.input_shapes and len(self.input_shapes) < MAX_SHAPES:
            self.input_shapes.append(inputs)
        if output not in self.output_shapes and len(self.output_shapes) < MAX_SHAPES:
            self.output_shapes.append(output)

    def note_op(self, name: str, calls: int, flops: int = 0, elapsed_ns: int = 0) -> None:
        """Add ``calls`` calls of the operation ``name`` to :attr:`ops`."""
        row = self.ops.get(name)
        if row is None:
            self.ops[name] = [calls, flops, elapsed_ns]
        else:
            row[0] += calls
            row[1] += flops
            row[2] += elapsed_ns

    def op_table(self) -> list[OpRow]:
        """The operations run directly in this node's calls, most time (then FLOPs, calls)
        first.

        Example:
            >>> node = CallNode.root().child("attn", "Attention", "m0")
            >>> node.note_op("matmul", 2, 512); node.note_op("softmax", 1, 80)
            >>> [(op.name, op.calls, op.flops) for op in node.op_table()]
            [('matmul', 2, 512), ('softmax', 1, 80)]
        """
        rows = [OpRow(name, calls, flops, ns) for name, (calls, flops, ns) in self.ops.items()]
        rows.sort(key=lambda op: (-op.time_ns, -op.flops, -op.calls, op.name))
        return rows

    def __repr__(self) -> str:
        return f"CallNode({self.path or '<root>'!r}, {self.type_name}, calls={self.calls})"


class SubtreeSums:
    """Every node's subtree sums and completeness, keyed by ``id(node)``, computed once, bottom
    up, instead of once per node per ancestor (``CallNode.subtree_flops`` and
    ``CallNode.completeness`` each walk the subtree): what reports and files read.

    Example:
        >>> root = CallNode.root()
        >>> block = root.child("block", "Block", "m0"); block.flops = 5
        >>> fc = block.child("fc", "Linear", "m1"); fc.flops = 8; fc.flops_source = "rule"
        >>> sums = SubtreeSums(root)
        >>> sums.flops[id(block)], sums.completeness[id(block)]
        (13, 'complete')
    """

    def __init__(self, root: CallNode) -> None:
        self.flops: dict[int, int] = {}
        self.gemm_flops: dict[int, int] = {}
        self.macs: dict[int, int | None] = {}
        self.backward_flops: dict[int, int] = {}
        # Backward time of the subtree, or None where no backward pass was timed at all.
        self.backward_ns: dict[int, int | None] = {}
        self.completeness: dict[int, Completeness] = {}
        order = list(root.walk())
        for node in reversed(order):
            kids = list(node.children.values())
            self.flops[id(node)] = int(node.flops) + sum(self.flops[id(c)] for c in kids)
            self.gemm_flops[id(node)] = (int(node.gemm_flops)
                                         + sum(self.gemm_flops[id(c)] for c in kids))
            self.backward_flops[id(node)] = (int(node.backward_flops)
                                             + sum(self.backward_flops[id(c)] for c in kids))
            timed = [node.backward_time.total_ns] if node.backward_time.count else []
            timed += [t for t in (self.backward_ns[id(c)] for c in kids) if t is not None]
            self.backward_ns[id(node)] = sum(timed) if timed else None
            # MACs are only defined for some layers; a subtree has MACs if any part of it does.
            parts = [node.macs] + [self.macs[id(c)] for c in kids]
            known = [int(m) for m in parts if m is not None]
            self.macs[id(node)] = sum(known) if known else None
            # CallNode.completeness, for every node in one pass.
            below = {self.completeness[id(c)] for c in kids}
            self.completeness[id(node)] = (
                "unknown" if node.flops_unknown
                else "partial" if below & {"unknown", "partial"} else "complete")



class OpRow(NamedTuple):
    """One operation of :meth:`CallNode.op_table`: its name (``matmul``, ``__add__``...), calls,
    FLOPs and time in nanoseconds (0 unless timed: ``profile(op_timing=True)``)."""

    name: str
    calls: int
    flops: int
    time_ns: int


#: One recorded call of a per-call timeline (``profile(timeline=True)``): the node, its start and
#: end on the profile's clock in nanoseconds, and the id of the thread that made it.
TimelineEvent = tuple[CallNode, int, int, int]
