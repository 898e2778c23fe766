"""What one profile collects, and everything the hot path leaves for later.

The hot path (:mod:`tracetorch.engine.hotpath`) only appends a duration and bumps a per-shape
counter. The rest happens here: naming and creating a node on its first call under a parent,
running the FLOP rule once per distinct input shape, charging backward operations, and
:meth:`Collector.fold`, which turns the counters into each node's own FLOPs at every step and at
exit. Timing and the timeline live in :mod:`tracetorch.engine.timing`, folding and grafting trees
in :mod:`tracetorch.engine.fold`, what a call saves for backward in
:mod:`tracetorch.engine.saved_meters`, the layers with unknown FLOPs in
:mod:`tracetorch.engine.unsupported`.

Example:
    >>> from tracetorch.records.tree import CallNode
    >>> collector = Collector(CallNode.root(), model=None)
    >>> collector.root.children
    {}
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from tracetorch.engine.fold import fold_touched, fold_tree, graft
from tracetorch.engine.hotpath import Frame, structure_changed, structure_generation
from tracetorch.engine.identities import Identities
from tracetorch.engine.saved_meters import SeenStorages, saved_by_call
from tracetorch.engine.stack_room import STACK_ROOM
from tracetorch.engine.timing import CallTiming, Clock
from tracetorch.engine.unsupported import unsupported_calls, warn_rule_failed, warn_unsupported
from tracetorch.engine.warm import WarmNodes
from tracetorch.engine.wrappers import is_wrapper, naming_through_wrappers, wrapper_name
from tracetorch.flops.optimizers import optimizer_scope
from tracetorch.flops.registry import NO_RULE, FlopCount, FlopRegistry, default_registry
from tracetorch.models.introspect import (
    bound_inputs,
    computes_a_weight,
    is_stateless,
    is_torch_module,
    only_calls_children,
    returns_an_input,
    runs_compiled_graph,
)
from tracetorch.models.tensors import parameter_ids, signature, tensor_bytes
from tracetorch.records.tree import (
    FLOPS,
    GEMM_FLOPS,
    INPUT_BYTES,
    KEY,
    MACS,
    NOT_FORWARD_KINDS,
    OUTPUT_BYTES,
    SAVED_BYTES,
    CallNode,
    NodeKind,
    new_entry,
)

__all__ = ("Collector", "FOLD_EVERY_TOUCHED", "RULED_KINDS", "RULED_STATES", "call_type_name")

#: Touched nodes a step may leave unfolded (see :meth:`Collector.end_step`).
FOLD_EVERY_TOUCHED = 4096

#: Node kinds whose FLOPs may come from a registered rule (backward FLOPs are always counted).
RULED_KINDS = frozenset({"module", "optimizer"})
#: Rule states under which a call's own tensor operations are not needed (the rule says it all).
RULED_STATES = frozenset({"rule", "user", "free"})

# How a node is named when its parent holds no attribute naming it.
_DEFAULT_NAMES = {"optimizer": "{}.step", "backward": "backward", "data": "data"}

# Marks a paused root frame (a schedule's wait steps): other threads are not recorded then.
_PAUSED = object()


class Collector(CallTiming):
    """The tree of one profile plus the caches that keep the hot path cheap."""

    #: Whether calls are recorded in nodes of the tree (what the adapters may add rows to, learn
    #: a node's operation counts in); a running total keeps none (see
    #: :class:`tracetorch.engine.tally.TallyCollector`).
    records_tree = True

    def __init__(self, root: CallNode, model: Any, *, registry: FlopRegistry | None = None,
                 clock: Clock | None = None, timeline: bool = False,
                 max_events: int = 100_000, warn_unsupported: bool = True,
                 count_ops: bool = True, memory: bool = True, params: bool = True,
                 op_timing: bool = False, nvtx: bool = False) -> None:
        super().__init__(clock, timeline, max_events)
        self.root = root
        self.model = model
        self.registry = registry if registry is not None else default_registry
        self.warn_unsupported = warn_unsupported
        #: Count tensor operations run inside layers without a rule (``profile(ops=...)``).
        self.count_ops = count_ops
        #: Record bytes read, written and saved for backward (``profile(memory=...)``).
        self.memory = memory
        #: Count each module's parameters (``profile(params=...)``).
        self.count_params = params
        #: Time each tensor operation in the layers' op tables (``profile(op_timing=...)``).
        self.op_timing = op_timing
        #: Push an NVTX range per layer call on CUDA (``profile(nvtx=...)``).
        self.nvtx = nvtx
        self._through_wrappers = naming_through_wrappers()
        # Storages already charged as saved for backward since the last fold: each once.
        self._saved_storages: SeenStorages = {}
        #: The frame of the profile's top-level calls while it records (made by :meth:`start`);
        #: ``None`` otherwise, for it refers to this collector: kept, it would leave a stopped
        #: collector, and the model it holds, to the cyclic garbage collector once the profile
        #: is dropped.
        self.root_frame: Frame | None = None
        self.owner_thread = threading.get_ident()
        self._lock = threading.Lock()
        self._user_rules: dict[CallNode, Callable[..., int]] = {}
        #: Keys, names and parameter counts of the objects called (see .identities).
        self.ids = Identities(measure_bytes=memory)
        self._pending_backward: dict[CallNode, int] = {}
        # The nodes given a frame since the last stop, which drops their frames again; what
        # the next opening needs to take each up again without naming, counting or a rule's
        # first call (weakly: a profile between openings keeps no model alive).
        self._adopted: list[CallNode] = []
        # Modules whose parameters could not be counted before their first call (lazy ones).
        self._uncounted: dict[CallNode, Any] = {}
        # Each module's forward node (its first), by module key, and for each "recompute" node
        # the forward node it runs again: a backward pass charges the latter.
        self._originals: dict[str, CallNode] = {}
        self.recompute_of: dict[CallNode, CallNode] = {}
        self._warm = WarmNodes()
        # Each torch module node's parameter_ids(owner) when it was last adopted or taken up
        # (see _check_parameters), and the structure generation when this opening started.
        self._parameter_ids: dict[CallNode, tuple[int, ...]] = {}
        self._generation = structure_generation()
        # The structure generation the parameters were last counted at (_count_parameters_again).
        self._params_generation = self._generation
        self._other_threads = False
        # Two folds at once (the tree read by another thread while a step or the stop folds)
        # would each take a counter's calls: one at a time.
        self._folding = threading.Lock()
        # The deepest node made so far: each opening makes room on the stack for its calls.
        self._deepest = 0
        # FLOPs of the backward pass in progress, for its Tensor.backward node's summary.
        self._pass_flops = self._pass_gemm = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self, target: CallNode) -> Frame:
        """Begin recording top-level calls under ``target``; returns the root frame."""
        self.set_active(True)
        STACK_ROOM.make_room(self._deepest)
        self._generation = structure_generation()
        # With ``ops=False`` nothing counts operations, the profile's root included: no function
        # mode is pushed at all (torch backward passes are then found at their first node).
        root = self.root_frame = Frame.of(self, target, None, self.count_ops)
        self.owner_thread = threading.get_ident()
        return root

    def thread_frame(self) -> Frame | None:
        """For ``profile(all_threads=True)``: the frame of the calling thread, whose calls go
        under a ``thread <name>`` node of their own (``None`` in the profiling thread itself,
        or while the profile is paused by its schedule)."""
        root = self.root_frame  # (read once: the profiling thread may stop meanwhile)
        if root is None or root.owner is not None or self.owner_thread == threading.get_ident():
            return None
        thread = threading.current_thread()
        target = root.node
        threads = target.engine.child_frames
        frame = threads.get(id(thread))
        if frame is None:
            with self._lock:
                frame = threads.get(id(thread))
                if frame is None:
                    node = target.child(f"thread {thread.name}", "thread",
                                        self.module_key(thread), kind="thread")
                    # No function mode is on this thread's stack: layers that count their
                    # operations push it themselves.
                    frame = self._install_frame(node, Frame.of(self, node, thread, False))
                    threads[id(thread)] = frame
        self._other_threads = True
        return frame

    def pause(self) -> None:
        """Stop taking calls from other threads until the next :meth:`start`."""
        root = self.root_frame
        if root is not None:
            self.root_frame = Frame.of(self, root.node, _PAUSED, self.count_ops)

    def stop(self) -> None:
        """Stop recording, fold the counters and drop every reference to the user's objects."""
        self.set_active(False)
        self.fold()
        # The whole tree once more: a call another thread counted while a step was folding its
        # node (after the node left the list of those to fold) is folded here at the latest.
        if self._other_threads:
            with self._folding:
                fold_tree(self.root)
        self.touched.clear()
        self.root_frame = None
        # Only the nodes this opening adopted hold frames (and so the user's objects).
        self.root.engine.child_frames.clear()
        warm, generation = self._warm, self.registry.generation
        # A layer's structure changed while this opening ran: the counters made for the
        # generations before it are never found again (their counts are folded above).
        stale = structure_generation() != self._generation
        for node in self._adopted:
            state = node.engine
            frame = state.frame
            if ((frame is not None and node.parent is not None
                    and not warm.remember(node, frame, generation)) or stale):
                state.drop_counters()
            state.child_frames.clear()
            state.frame = None
        self._adopted.clear()
        self._uncounted.clear()
        self._originals.clear()
        self.recompute_of.clear()
        self._other_threads = False
        self._user_rules.clear()
        self.ids.forget()

    def release(self) -> None:
        """Break the reference cycles of a stopped recording that nobody will read again (its
        nodes' links to their parents; the root frame's to this collector went at the stop), so
        that dropping it frees it at once, by reference counting, instead of leaving ~18
        objects per layer to the cyclic garbage collector (``count_flops`` run in a loop).
        Nothing may record into this collector afterwards.

        Raises:
            RuntimeError: the collector is still recording.
        """
        if self.active:
            raise RuntimeError("release: the recording is still active; stop it first")
        self.root.unlink()

    # ------------------------------------------------------------------ tree building
    def new_child(self, frame: Frame, owner: Any, kind: NodeKind, label: str | None,
                  flops_fn: Callable[..., int] | None) -> Frame:
        """Name and create the node for the first call of ``owner`` under ``frame``; return the
        frame of its calls (listed in ``frame.child_frames``, where later calls find it)."""
        parent_node, parent_owner = frame.node, frame.owner
        taken = (self._warm.take(parent_node, owner, flops_fn, self.registry.generation)
                 if self._warm.nodes else None)
        if taken is not None:  # made by an earlier opening: ready again at the cost of a frame
            node, ops, observe = taken
            if observe:  # a torch module
                self._check_parameters(node, owner)
            child = self._install_frame(node, Frame.of(self, node, owner, ops, observe))
            frame.child_frames[id(owner)] = child
            return child
        type_name = call_type_name(owner, kind, label)
        default = label or (_DEFAULT_NAMES[kind].format(type_name) if kind in _DEFAULT_NAMES
                            else type_name)
        if kind == "optimizer" and label is None:
            default += self._scope_of(owner)
        if parent_owner is None or parent_node.kind in ("thread", "optimizer"):
            # One naming however the profile was opened: the model is "", as named_modules()
            # names it; without one given, the first layer called at the top stands for it. A
            # layer of it called from outside every layer (model.encoder(x) in the loop, or in
            # the closure an optimizer's step calls: LBFGS's) is named by its path in it all
            # the same.
            model = parent_node.children.get("")
            first = self.model is None and kind == "module" and (
                model is None or model.module_key == self.ids.known_key(owner))
            if first or owner is self.model:
                name = ""
            elif kind == "module":
                name = self.ids.top_level_name(owner, self.model, (
                    (node.name, node.module_key) for node in parent_node.children.values()
                    if node.kind == "module")) or default
            else:
                name = default
        else:
            name = self.ids.name_in(parent_owner, owner) or default
        if kind == "module" and self._through_wrappers:
            # DDP/FSDP: the user's module names
            name = wrapper_name(name, owner, parent_owner, self.model)
        existing = parent_node.children.get(name)
        if (existing is not None and name == default and kind == "module"
                and existing.type_name == type_name and not existing.params
                and existing.module_key != self.ids.known_key(owner) and is_stateless(owner)):
            # A layer made afresh at each call, with nothing of its own (transformers builds a
            # new CrossEntropyLoss per step): one node for all of them, and no reference kept
            # to each (nor a node per step). Each call finds it here again.
            found = existing.engine.frame
            return found if found is not None else self.adopt(existing, owner, kind, flops_fn,
                                                              frame.ops)
        key = self.ids.module_key(owner)
        if existing is not None and existing.module_key != key:
            if kind == "module":
                # The parent holds another module under this name now (model.fc = ..., between
                # two openings, when no registration hook watched): its own figures, and its
                # callers', may depend on it, so all are measured again.
                structure_changed()
            suffix = 2
            while f"{name}#{suffix}" in parent_node.children:
                suffix += 1
            name = f"{name}#{suffix}"
        # A layer called inside a backward pass, or below such a call, runs again to rebuild
        # what activation checkpointing threw away: a "recompute" node, apart from the forward.
        recompute = kind == "module" and parent_node.kind in NOT_FORWARD_KINDS
        node = parent_node.child(name, type_name, key, "recompute" if recompute else kind)
        depth = node.depth
        if depth > self._deepest:  # the profiler's frames per level must fit on the stack
            self._deepest = depth
            STACK_ROOM.make_room(depth)
        child = self.adopt(node, owner, kind, flops_fn, frame.ops)
        if recompute:
            original = self._originals.get(key)
            if original is not None:
                self.recompute_of[node] = original
        frame.child_frames[id(owner)] = child
        return child

    def _scope_of(self, optimizer: Any) -> str:
        # Several optimizers of one class (a GAN's) are told apart by what they update: the
        # module of the profiled model holding all their parameters, as "[netG]" ("" when they
        # span the model, or without one; the "#2" of a name taken then tells them apart).
        model = self.model
        while model is not None and is_wrapper(model):  # DDP's parameters are "module.<path>"
            model = model.module
        scope = optimizer_scope(optimizer, model) if model is not None else ""
        return f"[{scope}]" if scope else ""

    def _check_parameters(self, node: CallNode, owner: Any) -> None:
        # A torch module's parameters replaced between two openings, when no registration hook
        # watched (layer.weight = nn.Parameter(...)): every cached figure may depend on them,
        # its callers' too (their outputs), so all are measured again. (By identity: a
        # replacement landing on the address of the one recorded, two replacements apart, goes
        # unseen. A replaced submodule is seen where its node is named: see new_child.)
        ids = parameter_ids(owner)
        if ids != self._parameter_ids.get(node):
            self._parameter_ids[node] = ids
            structure_changed()

    def _count_parameters_again(self, node: CallNode, owner: Any) -> None:
        # A layer's weights were replaced or converted since this opening began (a larger
        # one, model.to(torch.bfloat16)): its parameters are counted again at its next first
        # call, all of a model's once per structure generation.
        generation = structure_generation()
        if generation != self._params_generation:
            self._params_generation = generation
            self.ids.forget_parameter_counts()
        params = self.ids.params_of(owner)
        if params is not None:
            node.params, node.memory.param_bytes = params

    def _install_frame(self, node: CallNode, frame: Frame) -> Frame:
        # Every node given a frame is listed for stop() to drop it again; a forward module node
        # is the one its module's recomputation (activation checkpointing) charges.
        node.engine.frame = frame
        self._adopted.append(node)
        if node.kind == "module":
            self._originals.setdefault(node.module_key, node)
        return frame

    def adopt(self, node: CallNode, owner: Any, kind: NodeKind,
              flops_fn: Callable[..., int] | None, parent_ops: bool) -> Frame:
        """Make ``node`` ready to record calls of ``owner``: its rule, parameters and frame
        (returned).

        Only a torch module changes whether operations are counted inside it (off under a rule,
        where they would be dropped): torch's function mode costs per operation, so it is
        switched off there. Any other call keeps its caller's setting, so that switching costs
        nothing where it gains nothing (a ``tracetorch.core`` layer runs no torch operations).
        """
        if kind == "module" and self.count_params:
            params = self.ids.params_of(owner)
            if params is None:
                self._uncounted[node] = owner  # counted after its first call
            node.params, node.memory.param_bytes = params or (0, 0)
        state = node.engine
        if flops_fn is not None:
            state.rule_state = "user"
            self._user_rules[node] = flops_fn
        elif kind in RULED_KINDS:
            # (an optimizer runs its class's step: the one an LR scheduler wraps on the
            # instance is not read)
            rule = (self.registry.lookup(type(owner), method="step") if kind == "optimizer"
                    else self.registry.lookup(type(owner), owner))
            state.rule_state = "none" if rule is NO_RULE else ("free" if rule is None else "rule")
        counts_ops = parent_ops
        torch_module = is_torch_module(owner)
        state.beside_rule = torch_module and computes_a_weight(owner)
        if torch_module:
            # (read when a next opening takes the node up)
            self._parameter_ids[node] = parameter_ids(owner)
            # A plain nn.Sequential runs no operation of its own: counting off inside it spares
            # switching torch's function mode around each of its (ruled) children.
            counts_ops = (self.count_ops and state.rule_state not in RULED_STATES
                          and not only_calls_children(owner))
        elif kind == "optimizer":
            # An update with a rule is counted by it before the step (torch's function mode
            # would cost each of its operations microseconds); one without (a user's class,
            # LBFGS, whose line search runs as long as the loss asks) is counted by its
            # operations, as a layer without a rule is: else its FLOPs would be unknown.
            counts_ops = self.count_ops and state.rule_state == "none"
        return self._install_frame(node, Frame.of(self, node, owner, counts_ops, torch_module))

    def module_key(self, owner: Any) -> str:
        """The key naming ``owner`` in this profile (stable across entries of the profile)."""
        return self.ids.module_key(owner)

    # ------------------------------------------------------------------ FLOPs
    def first_entry(self, node: CallNode, owner: Any, key: Any, shape: Any,
                    args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> list[Any]:
        """The counter of the first call of ``node`` with ``key`` (input shapes and dtypes, grad
        mode, layer structures: see :func:`~tracetorch.engine.hotpath.call_key`), made and kept
        in the node's ``flops_cache``: note the shapes, run the rule, measure the sizes. The
        wrappers call it at such a call's end.

        The counter (:data:`~tracetorch.records.tree.ENTRY_FIELDS`; ``None`` FLOPs when the
        node's FLOPs come from counted operations instead of a rule; bytes 0 with
        ``profile(memory=False)``) is kept under the call's ``shape`` (one tensor's, or ``None``)
        while no other key of that shape is, else under ``key``: each counter under one key
        only, as the fold counts them.
        """
        node.note_shapes(signature(args, kwargs), signature((output,)))
        if self._uncounted and node in self._uncounted:
            del self._uncounted[node]
            # Its lazy weights have shapes now.
            node.params, node.memory.param_bytes = self.ids.params_of(owner) or (0, 0)
        elif (self.count_params and node.kind == "module"
              and structure_generation() != self._generation):
            self._count_parameters_again(node, owner)
        entry = new_entry()
        if self.memory:
            entry[INPUT_BYTES] = tensor_bytes(args) + tensor_bytes(kwargs)
            entry[OUTPUT_BYTES] = tensor_bytes(output)
            # Measured once per input shape, like FLOPs: the graph a call builds depends on them.
            entry[SAVED_BYTES] = saved_by_call(args, kwargs, output, self._saved_storages, node)
        engine = node.engine
        state = engine.rule_state
        if state == "user":
            entry[FLOPS] = int(self._user_rules[node](*args, **kwargs))
        elif state == "rule":
            rule = self.registry.lookup(type(owner), owner)
            try:
                entry[FLOPS], entry[GEMM_FLOPS], entry[MACS] = _rule_flops(
                    rule, owner, args, kwargs, output)
            except Exception as error:
                self.rule_failed(node, rule, error)
                entry[FLOPS] = entry[GEMM_FLOPS] = entry[MACS] = 0
        elif (state == "none" and node.kind == "module" and not engine.op_flops
              and not node.children and node.flops_source == "none"):
            if (not node.ops and engine.frame is not None and is_torch_module(owner)
                    and (engine.frame.ops or only_calls_children(owner))
                    and returns_an_input(args, kwargs, output)):
                # A torch module whose operations were counted (or that runs none of its own:
                # an empty nn.Sequential) ran none and handed back what it was given (a
                # DropPath in eval): it costs a known 0.
                node.flops_source = "ops"
            elif self.warn_unsupported:
                warn_unsupported(node.type_name, runs_compiled_graph(owner), stacklevel=2,
                                 ops_counted=self.count_ops)
        entry[KEY] = key
        cache = engine.flops_cache
        cache[shape if shape is not None and shape not in cache else key] = entry
        return entry

    def rule_failed(self, node: Any, rule: Any, error: Exception) -> None:
        """``rule`` raised ``error`` on a call of ``node``: a user's rule's error is theirs to
        see (raised again); a built-in rule that cannot read the call (a nested tensor it has no
        sizes for) leaves the node's own FLOPs unknown, a lower bound, with a warning, and the
        model running."""
        if not self.registry.is_builtin(rule):
            raise error
        node.flops_source = "uncounted"  # (stays: see fold)
        if self.warn_unsupported:
            warn_rule_failed(node.type_name, error, stacklevel=3)

    def fold(self, root: CallNode | None = None) -> None:
        """End a step and fold its counters now (a scratch tree about to be merged, the stop):
        see :meth:`fold_counts`."""
        self._settle()
        self.fold_counts(root)

    def end_step(self) -> None:
        """End a step of the profile's own tree: its counters wait for whoever reads the tree
        (:meth:`fold_counts`), unless the list of touched nodes grew past
        :data:`FOLD_EVERY_TOUCHED` (failed calls and backward passes touch their node each
        time): folded then, so that it stays bounded."""
        self._settle()
        if len(self.touched) > FOLD_EVERY_TOUCHED:
            self.fold_counts()

    def _settle(self) -> None:
        # What every step's end settles, folded or not: the device-timed calls, the backward
        # pass's per-layer samples, the saved tensors seen.
        self.resolve_times()
        self.flush_backward()

    def fold_counts(self, root: CallNode | None = None) -> None:
        """Fold the counters of the nodes touched since the last fold (and the recording
        ``root``'s operations, the profile's tree by default) into their FLOPs and bytes.

        Only the nodes touched since (see :meth:`touch`) and their ancestors are folded: a fold
        costs the nodes that ran, not the whole tree. Counters only add up, so folding many
        steps at once gives each node what folding them one by one would have.
        """
        if threading.get_ident() != self.owner_thread:
            # Read beside the recording thread: a node it touches while the list is taken may
            # miss this fold and every later one (its counter never leaves 0 again), so the
            # stop folds the whole tree, as after other threads' calls.
            self._other_threads = True
        with self._folding:
            touched = self.take_touched()
            touched.append(self.root if root is None else root)
            fold_touched(touched)

    @property
    def counts_pending(self) -> bool:
        """Whether calls were counted into the tree since its last fold (its nodes' FLOPs and
        bytes then lag behind until :meth:`fold_counts`)."""
        engine = self.root.engine
        return bool(self.touched or engine.op_flops or engine.op_gemm)

    def unsupported(self) -> dict[str, int]:
        """Calls of leaf layers with no FLOP rule whose FLOPs nothing counted, by type."""
        return unsupported_calls(self.root)

    # ------------------------------------------------------------------ backward
    def add_backward(self, node: CallNode, flops: int, gemm: bool, elapsed_ns: int) -> None:
        """Attribute one gradient operation to the layer whose forward created it (ignored once
        this profile has stopped: the graph outlived the block, or between sampled steps)."""
        if not self.active or not self.backward_on:
            return
        node.backward_flops += flops
        if gemm:
            node.backward_gemm_flops += flops
        pending = self._pending_backward
        pending[node] = pending.get(node, 0) + elapsed_ns
        self._pass_flops += flops
        if gemm:
            self._pass_gemm += flops

    def add_backward_pass(self, spent: dict[CallNode, int], flops: dict[CallNode, int]) -> None:
        """One backward pass's attribution at once, as :meth:`add_backward` for each layer then
        :meth:`flush_backward` would: ``spent``, the host ns of every layer the pass reached
        (each gets one backward sample), ``flops``, the GEMM FLOPs charged to each layer (one
        the pass did not reach, its own node, gets a sample of 0 ns). A large model's pass
        reaches hundreds of layers: one loop, not a method call per layer."""
        if not self.active or not self.backward_on:
            self.flush_backward()
            return
        total = 0
        times = dict.fromkeys(flops, 0)  # (the pass's own node: FLOPs, no time of its own)
        times.update(spent)
        # Into the pending times: what was charged before the end of the pass (a compiled
        # graph's shares) makes one sample per layer with the pass's own.
        pending = self._pending_backward
        for node, elapsed in times.items():
            charged = flops.get(node, 0)
            if charged:
                node.backward_flops += charged
                node.backward_gemm_flops += charged
                total += charged
            pending[node] = pending.get(node, 0) + elapsed
        self._pass_flops += total
        self._pass_gemm += total
        self.flush_backward()

    def flush_backward(self, pass_node: CallNode | None = None) -> None:
        """End of a backward pass: each layer it touched gets one backward sample.

        The pass's own node (``Tensor.backward``), when given, gets the pass's FLOPs as its
        ``flops``: a summary of work charged to the layers, which totals leave out (see
        :attr:`tracetorch.records.result.ProfileResult.forward_flops`).
        """
        for node, elapsed in self._pending_backward.items():
            node.backward_time.add(elapsed)
        self._pending_backward.clear()
        # The graph the pass ran is freed: a storage a later forward saves is charged to it
        # again (an input reused at every step), once a pass as within one.
        self._saved_storages.clear()
        if pass_node is not None:
            pass_node.flops += self._pass_flops
            pass_node.gemm_flops += self._pass_gemm
            if self._pass_gemm or pass_node.macs is not None:
                pass_node.macs = (pass_node.macs or 0) + self._pass_gemm // 2
            self._pass_flops = self._pass_gemm = 0


    # ------------------------------------------------------------------ nesting
    def owners_by_key(self) -> dict[str, Any]:
        """The objects called, by module key, as far as they are still known (for grafting)."""
        return self.ids.owners_by_key()

    def graft_into(self, source: CallNode, frame: Frame) -> None:
        """Hand the folded recording ``source`` to another profile, under its open call
        ``frame`` (call before :meth:`stop`, while the owners are still known)."""
        if not frame.collector.records_tree:
            # A running total keeps no rows: what the inner recording counted forward is work
            # of the call open there, as its own operations are (under a rule: covered by it).
            frame.node.engine.op_flops += sum(node.flops for node in source.walk()
                                              if node.kind not in NOT_FORWARD_KINDS)
            return
        mapping = graft(source, self.owners_by_key(), frame)
        outer = frame.collector
        if outer.events is not None and self.events:
            for node, start, end, thread in self.events:
                target = mapping.get(node)
                if target is None:
                    continue  # an event of another recording of this profile
                if len(outer.events) < outer.max_events:
                    outer.events.append((target, start, end, thread))
                else:
                    outer.dropped_events += 1
        outer.dropped_events += self.dropped_events


def call_type_name(owner: Any, kind: str, label: str | None) -> str:
    """The type name of a call of ``owner`` recorded as ``kind`` (``label``: a function's).

    Example:
        >>> call_type_name(len, "function", None), call_type_name(3, "module", None)
        ('len', 'int')
    """
    if kind == "backward":
        return "backward"
    if kind == "data":
        return "DataLoader"
    if kind == "function":
        return str(label or getattr(owner, "__qualname__", type(owner).__name__))
    return type(owner).__name__


def _rule_flops(rule: Callable[..., Any], owner: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any], output: Any) -> tuple[int, int, int]:
    """What a FLOP rule says of one call of ``owner``: its FLOPs, their matrix-product part and
    its MACs (a rule returning a plain number counts no product).

    Example:
        >>> _rule_flops(lambda layer, inputs, output: 2 * inputs[0], None, (3,), {}, None)
        (6, 0, 0)
    """
    # Rules read positional inputs: keyword arguments go where the forward takes them.
    result = rule(owner, bound_inputs(owner, args, kwargs), output)
    if isinstance(result, FlopCount):
        macs = result.macs if result.macs is not None else result.gemm // 2
        return int(result.flops), int(result.gemm), int(macs)
    return int(result), 0, 0
