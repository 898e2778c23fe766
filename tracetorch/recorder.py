"""The hot path: what runs on every wrapped call while a profile is active.

The stack of open calls lives in a :class:`~contextvars.ContextVar` holding one :class:`Frame`
per active recorder, so threads and asyncio tasks keep separate stacks and a profile never sees
another thread's calls. Nested profiles each get a frame, so each sees its own calls.

Per call the wrapper does: look up (or once, name and create) the child node, time the call,
and on the way out fold the duration into the node, evaluate the FLOP rule (cached per input
shape), and hand its inclusive FLOPs to the parent frame. Nothing is allocated per call but the
frame itself.

Example:
    >>> from tracetorch.tree import CallNode
    >>> rec = Recorder(CallNode.root(), model=None)
    >>> rec.root.children
    {}
"""
from __future__ import annotations

import threading
import time
import warnings
from contextvars import ContextVar, Token
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from tracetorch.flops.registry import NO_RULE, FlopCount, FlopRegistry, default_registry
from tracetorch.introspect import named_submodules, signature
from tracetorch.tree import CallNode

__all__ = ("Frame", "Recorder", "make_wrapper", "current_frames", "open_root", "close_root",
           "OpCounter", "FAILED")

#: The open calls of this context: one frame per active recorder, outermost recorder first.
_FRAMES: ContextVar[Optional[Tuple["Frame", ...]]] = ContextVar("tracetorch_frames", default=None)

#: Passed to :meth:`Frame.close` instead of an output when the call raised.
FAILED: Any = object()

# Node kinds whose FLOPs may come from a registered rule (backward FLOPs are always counted).
_RULED_KINDS = frozenset({"module", "optimizer"})

# Types already warned about as unsupported, process-wide, so a training loop warns once.
_WARNED_UNSUPPORTED: Set[str] = set()

Clock = Callable[[], int]


def current_frames() -> Optional[Tuple["Frame", ...]]:
    """The innermost open calls of this context (``None`` outside every profile)."""
    return _FRAMES.get()


def open_root(recorder: "Recorder") -> Token:
    """Make ``recorder`` see the calls of this context from now on (nested in any open ones)."""
    return _FRAMES.set((_FRAMES.get() or ()) + (recorder.root_frame,))


def close_root(recorder: "Recorder", token: Token) -> None:
    """Undo :func:`open_root`. A token made in another context (a generator finalised
    elsewhere) cannot be reset, so then only ``recorder``'s frames are dropped from this one."""
    try:
        _FRAMES.reset(token)
    except ValueError:
        frames = tuple(f for f in (_FRAMES.get() or ()) if f.recorder is not recorder)
        _FRAMES.set(frames or None)


class Frame:
    """One open call of one recorder, collecting what its body does until it returns."""

    __slots__ = ("recorder", "node", "owner", "parent", "op_flops", "op_gemm",
                 "child_flops", "child_gemm", "child_calls", "flops_fn")

    def __init__(self, recorder: "Recorder", node: CallNode, owner: Any,
                 parent: Optional["Frame"], flops_fn: Optional[Callable[..., int]] = None) -> None:
        self.recorder = recorder
        self.node = node
        self.owner = owner
        self.parent = parent
        self.op_flops = 0
        self.op_gemm = 0
        self.child_flops = 0
        self.child_gemm = 0
        self.child_calls = 0
        self.flops_fn = flops_fn

    def enter(self, owner: Any, kind: str, label: Optional[str],
              flops_fn: Optional[Callable[..., int]]) -> "Frame":
        """The frame of a call of ``owner`` made from inside this one."""
        child = self.node.children_by_owner.get(id(owner))
        if child is None:
            child = self.recorder.new_child(self, owner, kind, label)
        return Frame(self.recorder, child, owner, self, flops_fn)

    def close(self, start: int, end: int, args: Tuple[Any, ...], kwargs: Dict[str, Any],
              output: Any) -> None:
        """Fold the finished call into its node and report its FLOPs to the parent."""
        node = self.node
        recorder = self.recorder
        node.time.add(end - start)
        if recorder.events is not None:
            recorder.add_event(node, start, end)
        if output is FAILED:
            node.errors += 1
            flops, gemm, macs = self._counted()
        else:
            key = args[0].shape if len(args) == 1 and not kwargs and hasattr(args[0], "shape") \
                else signature(args, kwargs)
            cached = node.flops_cache.get(key)
            if cached is None:
                cached = node.flops_cache[key] = self._evaluate(args, kwargs, output)
            flops, gemm, macs = cached if cached[0] is not None else self._counted()
        own = flops - self.child_flops
        node.flops += own
        node.gemm_flops += gemm - self.child_gemm
        if macs is not None:
            node.macs = (node.macs or 0) + macs
        parent = self.parent
        if parent is not None:
            parent.child_flops += flops
            parent.child_gemm += gemm
            parent.child_calls += 1
        if node.kind == "backward":
            recorder.flush_backward()

    def _counted(self) -> Tuple[int, int, Optional[int]]:
        # Inclusive FLOPs from what ran: tensor operations here plus what the children reported.
        gemm = self.op_gemm + self.child_gemm
        if self.op_flops:
            self.node.flops_source = "ops"
        return self.op_flops + self.child_flops, gemm, (self.op_gemm // 2 if self.op_gemm else None)

    def _evaluate(self, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                  output: Any) -> Tuple[Optional[int], int, Optional[int]]:
        """First call with these input shapes: note the shapes and run the rule, if any.

        Returns ``(None, 0, None)`` when FLOPs must come from counted operations instead.
        """
        node = self.node
        node.note_shapes(signature(args, kwargs), signature((output,)))
        if self.flops_fn is not None:
            node.flops_source = "user"
            return int(self.flops_fn(*args, **kwargs)), 0, None
        rule = self.recorder.rule_for(type(self.owner)) if node.kind in _RULED_KINDS else None
        if rule is NO_RULE:
            if not self.op_flops and not self.child_calls:
                self.recorder.note_ruleless(node)
            return None, 0, None
        if rule is None:
            return None, 0, None
        result = rule(self.owner, args, output)
        node.flops_source = "rule"
        if isinstance(result, FlopCount):
            return int(result.flops), int(result.gemm), result.macs
        return int(result), 0, None


class Recorder:
    """Everything one profile collects, plus the caches that make the hot path cheap."""

    def __init__(self, root: CallNode, model: Any, *, registry: Optional[FlopRegistry] = None,
                 clock: Optional[Clock] = None, timeline: bool = False,
                 max_events: int = 100_000, warn_unsupported: bool = True) -> None:
        self.root = root
        self.model = model
        self.registry = registry if registry is not None else default_registry
        self.clock: Clock = clock if clock is not None else time.perf_counter_ns
        self.events: Optional[List[Tuple[CallNode, int, int, int]]] = [] if timeline else None
        self.max_events = max_events
        self.dropped_events = 0
        self.warn_unsupported = warn_unsupported
        self.active = False
        self.root_frame = Frame(self, root, None, None)
        self._rules: Dict[type, Any] = {}
        self._names: Dict[int, Dict[int, str]] = {}
        self._keys: Dict[int, str] = {}
        self._owners: List[Any] = []  # strong references keep the ids above unambiguous
        self._param_counts: Dict[int, int] = {}
        self._pending_backward: Dict[CallNode, int] = {}
        self._ruleless: Set[CallNode] = set()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Begin (or resume) recording; a fresh root frame collects top-level operations."""
        self.root_frame = Frame(self, self.root, None, None)
        self.active = True

    def stop(self) -> None:
        """Stop recording and drop the caches that hold references to the user's objects."""
        self.active = False
        self.flush_backward()
        self.retarget(self.root)
        for node in self.root.walk():
            node.children_by_owner.clear()
            node.time.flush()
        self.root_frame = Frame(self, self.root, None, None)
        self._names.clear()
        self._owners.clear()
        self._param_counts.clear()
        self._rules.clear()

    def retarget(self, node: CallNode) -> None:
        """Send top-level calls to ``node`` from now on (a scratch root during warm-up steps)."""
        frame = self.root_frame
        # Operations run outside every layer (a loss written with tensor math) belong to the root.
        frame.node.flops += frame.op_flops
        frame.node.gemm_flops += frame.op_gemm
        frame.op_flops = frame.op_gemm = 0
        frame.node = node

    # ------------------------------------------------------------------ tree building
    def new_child(self, frame: Frame, owner: Any, kind: str, label: Optional[str]) -> CallNode:
        """Name and create the node for the first call of ``owner`` under ``frame``."""
        parent_node = frame.node
        key = self._module_key(owner)
        type_name = _type_name(owner, kind, label)
        default = label or _DEFAULT_NAMES.get(kind, "{}").format(type_name)
        if frame.owner is None:
            name = "" if owner is self.model else default
        else:
            name = self._name_in(frame.owner, owner) or default
        existing = parent_node.children.get(name)
        if existing is not None and existing.module_key != key:
            suffix = 2
            while f"{name}#{suffix}" in parent_node.children:
                suffix += 1
            name = f"{name}#{suffix}"
        node = parent_node.child(name, type_name, key, kind)
        if kind == "module":
            node.params = self._params_of(owner)
        parent_node.children_by_owner[id(owner)] = node
        return node

    def _module_key(self, owner: Any) -> str:
        key = self._keys.get(id(owner))
        if key is None:
            # Keys outlive the recording (by_module uses them), so they must not be raw ids.
            key = self._keys[id(owner)] = f"m{len(self._keys)}"
            self._owners.append(owner)
        return key

    def _name_in(self, parent: Any, child: Any) -> Optional[str]:
        names = self._names.get(id(parent))
        if names is None or id(child) not in names:
            # Scanned once per parent, again only when a child appears that was not there yet.
            names = {}
            for path, module in named_submodules(parent):
                names.setdefault(id(module), path)
            self._names[id(parent)] = names
            self._owners.append(parent)
        return names.get(id(child))

    def _params_of(self, owner: Any) -> int:
        count = self._param_counts.get(id(owner))
        if count is None:
            from tracetorch.params import count_parameters

            try:
                count = count_parameters(owner)
            except (TypeError, AttributeError, ValueError):
                count = 0
            self._param_counts[id(owner)] = count
        return count

    # ------------------------------------------------------------------ FLOPs
    def rule_for(self, layer_type: type) -> Any:
        """The FLOP rule for ``layer_type``, looked up once per profile."""
        try:
            return self._rules[layer_type]
        except KeyError:
            rule = self._rules[layer_type] = self.registry.lookup(layer_type)
            return rule

    def unsupported(self) -> Dict[str, int]:
        """Calls of leaf layers that have no FLOP rule and whose FLOPs nothing counted, by type."""
        counts: Dict[str, int] = {}
        for node in self._ruleless:
            # A later call may have run countable operations or children after all.
            if node.flops_source == "none" and not node.children:
                counts[node.type_name] = counts.get(node.type_name, 0) + node.calls
        return counts

    def note_ruleless(self, node: CallNode) -> None:
        """A layer with no rule ran without countable operations: remember it, warn once."""
        self._ruleless.add(node)
        type_name = node.type_name
        if self.warn_unsupported and type_name not in _WARNED_UNSUPPORTED:
            _WARNED_UNSUPPORTED.add(type_name)
            warnings.warn(
                f"tracetorch has no FLOP rule for {type_name} and saw no countable tensor "
                f"operations in it; its FLOPs are reported as 0. Register one with "
                f"@tracetorch.flop_rule({type_name}).", stacklevel=5)

    # ------------------------------------------------------------------ timeline, backward
    def add_event(self, node: CallNode, start: int, end: int) -> None:
        """Keep one call for the Chrome trace, up to ``max_events``."""
        events = self.events
        assert events is not None
        if len(events) < self.max_events:
            events.append((node, start, end, threading.get_ident()))
        else:
            self.dropped_events += 1

    def add_backward(self, node: CallNode, flops: int, gemm: bool, elapsed_ns: int) -> None:
        """Attribute one gradient operation to the layer whose forward created it."""
        node.backward_flops += flops
        if gemm:
            node.backward_gemm_flops += flops
        pending = self._pending_backward
        pending[node] = pending.get(node, 0) + elapsed_ns

    def flush_backward(self) -> None:
        """End of a backward pass: each layer it touched gets one backward sample."""
        for node, elapsed in self._pending_backward.items():
            node.backward_time.add(elapsed)
        self._pending_backward.clear()


class OpCounter:
    """Receives tensor operations from a framework and charges them to the innermost open call.

    It implements ``tracetorch.core.autograd.OpObserver``; the torch adapter calls the same two
    methods from its function mode.
    """

    def forward_op(self, name: str, flops: int, gemm: bool) -> Optional[Tuple[Frame, ...]]:
        """Charge a forward operation; the frames returned tag its autograd node."""
        frames = _FRAMES.get()
        if frames is None:
            return None
        for frame in frames:
            frame.op_flops += flops
            if gemm:
                frame.op_gemm += flops
        return frames

    def backward_op(self, tag: Optional[Tuple[Frame, ...]], name: str, flops: int, gemm: bool,
                    elapsed_ns: int) -> None:
        """Charge a gradient operation to the layer call whose forward created it."""
        frames = tag if tag is not None else _FRAMES.get()
        if frames is None:
            return
        for frame in frames:
            if frame.recorder.active:
                frame.recorder.add_backward(frame.node, flops, gemm, elapsed_ns)


def make_wrapper(kind: str, label: Optional[str] = None,
                 flops_fn: Optional[Callable[..., int]] = None) -> Callable[..., Any]:
    """The wrapt wrapper for one patched callable.

    ``kind`` names what the node is (``"module"``, ``"function"``, ``"backward"``,
    ``"optimizer"``); ``label`` names function nodes; ``flops_fn`` is ``instrument(flops=...)``.
    """

    # Every backward pass is the same node whichever tensor it starts from.
    shared_owner = _BackwardPass() if kind == "backward" else None

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
                kwargs: Dict[str, Any]) -> Any:
        frames = _FRAMES.get()
        if frames is None:
            return wrapped(*args, **kwargs)
        owner = shared_owner or (wrapped if instance is None else instance)
        if frames[0].owner is owner:
            # super().forward() or a layer calling itself: the same call, not a new level.
            return wrapped(*args, **kwargs)
        inner = tuple([frame.enter(owner, kind, label, flops_fn) for frame in frames])
        token = _FRAMES.set(inner)
        clock = inner[0].recorder.clock
        start = clock()
        try:
            output = wrapped(*args, **kwargs)
        except BaseException:
            end = clock()
            _FRAMES.reset(token)
            for frame in inner:
                frame.close(start, end, args, kwargs, FAILED)
            raise
        end = clock()
        _FRAMES.reset(token)
        for frame in inner:
            frame.close(start, end, args, kwargs, output)
        return output

    return wrapper


class _BackwardPass:
    """Stands for "a backward pass" as the owner of backward nodes."""


# How a node is named when its parent holds no attribute naming it.
_DEFAULT_NAMES = {"optimizer": "{}.step", "backward": "backward"}


def _type_name(owner: Any, kind: str, label: Optional[str]) -> str:
    if kind == "backward":
        return "backward"
    if kind == "function":
        return label or getattr(owner, "__qualname__", type(owner).__name__)
    return type(owner).__name__
