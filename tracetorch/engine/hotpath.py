"""The hot path: what runs on every wrapped call while a profile is active.

The innermost open call lives in a :class:`~contextvars.ContextVar`, so threads and asyncio
tasks keep separate stacks and a profile never sees another thread's calls. (Where the C
wrapper runs, the calls nested in one entered from C swap the frame in a cell the variable
holds instead of setting the variable, which costs far more: a context copied inside such a
call and run in another thread records under the cell's first call, one enclosing the copy;
see ``FrameCell`` in ``_hotpath.c``.) An open call is a
:class:`Frame`, made once per node when a profile takes the node up (``node.engine.frame``),
so a call costs no allocation. Only the innermost profile of a context records; a nested
profile hands what it saw to the enclosing one when it exits (see :mod:`tracetorch.engine.fold`),
so each sees its own calls and the hot path handles exactly one frame.

Per call the wrapper finds the child's frame (created once per caller and callee), reads the
clock twice, appends the duration and bumps the counter of the call's key (:func:`call_key`: its
inputs' shapes and dtypes, the grad mode, the generation of layer structures). Everything else —
rules, naming, folding FLOPs into the tree — happens once per key, per node or per step.

A call lasts until its function returns, and what it returns is handed back untouched: a
``forward`` that returns a generator is a call that returns at once (the time to make the
generator), and the layers the generator calls while its consumer iterates it are recorded
where it is iterated, as they run.

Where ``pip install`` could compile it, the per-call function wrapt calls is the C version of
the Python ``wrapper`` below (``_hotpath.c``; see :mod:`tracetorch.engine.native`): the same
steps, reading this module's settings on each call, with a node's first call and every other
uncommon case handed to the Python ``wrapper``.

Example:
    >>> current_frame() is None      # outside every profile
    True
"""
from __future__ import annotations

import time
from collections.abc import Collection, Hashable
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from tracetorch.engine.native import native_type
from tracetorch.engine.node_state import NodeState
from tracetorch.models.tensors import (
    INT_SHAPED,
    QUIET_READS,
    SHAPELESS,
    quiet_reads,
    typed_signature,
)
from tracetorch.records.stats import FLUSH_EVERY
from tracetorch.records.tree import (
    BUDGET,
    CALLS,
    ENTRY_FIELDS,
    KEY,
    LEARNED,
    REPLAYED,
    CallNode,
    NodeKind,
)

if TYPE_CHECKING:
    from tracetorch.engine.collector import Collector

__all__ = ("BackwardPassOwner", "Frame", "make_wrapper", "count_call", "current_frame",
           "innermost_frame", "open_root", "close_root",
           "OpCounter", "set_exit_observer", "set_op_switch", "set_op_replay", "replay_learned",
           "settle_replayed",
           "counter_of", "record_all_threads",
           "all_threads_collector", "call_key", "training_flag", "set_grad_mode",
           "structure_changed", "structure_generation", "set_call_context", "NO_COUNTERS")


class Frame(NamedTuple):
    """One open call: the profile recording it, its node, the instance (or function) called,
    whether tensor operations are counted while it runs, and whether the framework's exit
    observer looks at its output (torch modules only: a ``tracetorch.core`` layer's output has
    no autograd node for it to tag).

    ``ops`` is False inside a call whose FLOPs come from a rule (its operations would be thrown
    away) and everywhere with ``profile(ops=False)``; a framework whose operation counting has a
    cost per operation (torch's function mode) turns it off there through :func:`set_op_switch`.

    The last four fields are the node's own containers that every call touches
    (``node.time.pending``, and its engine state's ``flops_cache``, ``last_counter`` and
    ``child_frames``; none is ever replaced while the node records): a tuple's item costs the hot
    path less than two attribute reads. :meth:`of` fills them in.
    """

    collector: Collector
    node: CallNode
    owner: Any
    ops: bool
    observe: bool
    pending: list[int]
    flops_cache: dict[Any, list[Any]]
    last_counter: list[list[Any] | None]
    child_frames: dict[int, Frame]

    @classmethod
    def of(cls, collector: Collector, node: CallNode, owner: Any, ops: bool,
           observe: bool = False) -> Frame:
        """The frame of ``node``'s calls."""
        # tuple.__new__ directly: NamedTuple's own __new__ is a Python function, a frame more
        # on every node's first call.
        state: NodeState = node.engine
        return _new_tuple(cls, (collector, node, owner, ops, observe, node.time.pending,
                                state.flops_cache, state.last_counter, state.child_frames))


_new_tuple = tuple.__new__


#: The innermost open call of this context.
_FRAME: ContextVar[Frame | None] = ContextVar("tracetorch_frame", default=None)

#: Called as ``observer(frame, args, kwargs, output, entry)`` after each call of a frame with
#: ``observe`` that returned, while a framework adapter has set one (the torch adapter tags the
#: autograd nodes the call created); ``entry`` is the call's per-shape counter, where the
#: observer may keep what it derives once per input shape.
_exit_observer: Callable[[Frame, tuple[Any, ...], dict[str, Any], Any, list[Any]], None] | None = (
    None)

#: Whether the exit observer has anything to do now, asked before calling it: a builtin such as
#: ``torch.is_grad_enabled`` costs less than a Python call that returns at once.
def _always() -> bool:
    return True


_observe_now: Callable[[], bool] = _always

#: ``switch(on) -> changed``: turns a framework's operation counting on or off in this thread,
#: returning whether it changed anything (then the wrapper switches back when the call ends).
_op_switch: Callable[[bool], bool] | None = None

#: ``replay(frame, args, kwargs, owner, entry) -> frame``: asked before a call of a frame that
#: counts operations (unless its counts are replayed from its counter); may hand back a copy of
#: it with ``ops`` off, for a call whose operation counts it has added already (see
#: :func:`set_op_replay`).
OpReplay = Callable[[Frame, tuple[Any, ...], dict[str, Any], Any, "list[Any] | None"], Frame]
_op_replay: OpReplay | None = None
#: Callables of no arguments, each returning something false while learned counts may stand in
#: for a call (see :func:`set_op_replay`).
_op_hold: tuple[Callable[[], Any], ...] = ()
#: The nodes whose current call is being watched by the replay: their calls all go to it.
_op_observing: Collection[CallNode] = frozenset()

#: Reads the grad mode of the frameworks in use (``None``: none has one), a part of every
#: call's key: what a call saves for backward depends on it. See :func:`set_grad_mode`.
_grad_mode: Callable[[], Any] | None = None

#: Bumped whenever a layer's parameters or sublayers may have changed their shapes (see
#: :func:`structure_changed`): a layer's output, and so its FLOPs and sizes, depend on them.
_generation = 0
#: What an adapter says decides, besides a call's arguments, what its layers run and return
#: (torch: the autocast state), ``None`` where nothing does: see :func:`set_call_context`.
_context: Hashable = None
#: What every call's key holds of the two: the generation alone while the context is ``None``,
#: else one tuple ``(generation, context)`` per pair, made once (the C wrapper compares the
#: key's item with this by identity), so a context entered again finds its keys again.
_structure: Any = 0
_STRUCTURES: dict[tuple[int, Hashable], tuple[int, Hashable]] = {}

#: The profile recording every thread's calls (``profile(all_threads=True)``), if any.
_all_threads: Collector | None = None

#: The settings above that the C wrapper reads on every call, by name, and their values in one
#: list it holds (an item by position costs it less than a lookup in this module's globals,
#: memory that the products run between two calls evict). Each setter below ends with
#: :func:`_publish`, which copies the globals of these names into the list.
_SETTING_NAMES = ("_grad_mode", "_structure", "_op_switch", "_op_replay", "_op_hold",
                  "_op_observing", "_exit_observer", "_observe_now")
_SETTINGS: list[Any] = []


def _publish() -> None:
    _SETTINGS[:] = [globals()[name] for name in _SETTING_NAMES]


_publish()


def all_threads_collector() -> Collector | None:
    """The profile currently recording every thread's calls, if any."""
    return _all_threads


def record_all_threads(collector: Collector | None) -> None:
    """Let ``collector`` record calls made in threads where no profile is open (``None``: stop)."""
    global _all_threads
    _all_threads = collector


def set_exit_observer(observer: Callable[..., None] | None,
                      when: Callable[[], bool] | None = None
                      ) -> tuple[Callable[..., None] | None, Callable[[], bool] | None]:
    """Install (or with ``None`` remove) the exit observer, called after a call only while
    ``when()`` is true (by default: always); returns the previous ``(observer, when)``, which
    ``set_exit_observer(*previous)`` puts back."""
    global _exit_observer, _observe_now
    previous = (_exit_observer, _observe_now)
    _exit_observer, _observe_now = observer, when or _always
    _publish()
    return previous


def set_op_switch(switch: Callable[[bool], bool] | None) -> Callable[[bool], bool] | None:
    """Install (or with ``None`` remove) the operation-counting switch; returns the previous."""
    global _op_switch
    previous, _op_switch = _op_switch, switch
    _publish()
    return previous


def set_op_replay(replay: OpReplay | None, hold: tuple[Callable[[], Any], ...] = (),
                  observing: Collection[CallNode] = frozenset()
                  ) -> tuple[OpReplay | None, tuple[Callable[[], Any], ...], Collection[CallNode]]:
    """Install (or with ``None`` remove) the replay of learned operation counts (the torch
    adapter's: see :mod:`tracetorch.adapters.torch.learned`); returns the previous
    ``(replay, hold, observing)``, which ``set_op_replay(*previous)`` puts back.

    Before each call of a frame with ``ops``, while every callable of ``hold`` returns something
    false, the call's counter is looked up (as after the call: :func:`call_key`) and
    where its ``learned`` slot holds ``(op FLOPs, GEMM FLOPs, rows, frame, quiet frame, ...)``
    made for this very frame, the node is not in ``observing`` and the counter's ``replayed``
    slot is below its ``budget``, the ``replayed`` slot counts the call (its counts are added
    to the node at the fold, which spends as much of the budget: :func:`settle_replayed`) and
    the call runs with the quiet frame (``ops`` off); otherwise ``replay(frame, args, kwargs,
    owner, counter or None)`` hands back the frame to run the call with, having added what it
    replays itself. The replay decides what goes in the slots; the engine only reads them and
    counts the calls it replays.
    """
    global _op_replay, _op_hold, _op_observing
    previous = (_op_replay, _op_hold, _op_observing)
    _op_replay, _op_hold, _op_observing = replay, hold, observing
    _publish()
    return previous


def replay_learned(node: CallNode, learned: tuple[Any, ...], times: int = 1) -> None:
    """Add ``times`` calls' learned operation counts, ``(op FLOPs, GEMM FLOPs, rows, ...)``
    with rows of ``(name, calls, FLOPs)`` for one call, to ``node``, as the operations' own
    counting would have.

    Example:
        >>> node = CallNode.root().child("att", "Attention", "m0")
        >>> replay_learned(node, (12, 8, (("matmul", 1, 8), ("add", 1, 4))), times=2)
        >>> node.engine.op_flops, node.engine.op_gemm, node.ops["matmul"][:2]
        (24, 16, [2, 16])
    """
    counted = node.engine
    counted.op_flops += times * learned[0]
    counted.op_gemm += times * learned[1]
    ops = node.ops
    for name, calls, flops in learned[2]:
        row = ops.get(name)
        if row is None:
            ops[name] = [times * calls, times * flops, 0]
        else:
            row[0] += times * calls
            row[1] += times * flops


def settle_replayed(node: CallNode, entry: list[Any]) -> None:
    """Add to ``node`` the calls since the last fold that ``entry``'s learned counts stand in
    for (its ``replayed`` slot, emptied). A replayed call only counts itself in its counter —
    the node's operation counts and op-table rows, in memory the layer's other calls do not
    touch, would cost each call their cache misses between a model's large products — so this
    runs where the node is folded, and before the learned counts are dropped or changed.

    Example:
        >>> from tracetorch.records.tree import new_entry
        >>> node = CallNode.root().child("att", "Attention", "m0")
        >>> entry = new_entry()
        >>> entry[LEARNED], entry[REPLAYED], entry[BUDGET] = (12, 8, (("matmul", 1, 8),)), 3, 32
        >>> settle_replayed(node, entry)
        >>> node.engine.op_flops, node.ops["matmul"][:2], entry[REPLAYED], entry[BUDGET]
        (36, [3, 24], 0, 29)
    """
    replayed = entry[REPLAYED]
    if replayed:
        # (not "= 0": another thread may replay a call meanwhile)
        entry[REPLAYED] -= replayed
        entry[BUDGET] -= replayed
        replay_learned(node, entry[LEARNED], replayed)


def _held() -> bool:
    # Whether learned counts may not stand in for a call now (set_op_replay's ``hold``).
    for hold in _op_hold:
        if hold():
            return True
    return False


def set_grad_mode(reader: Callable[[], Any] | None) -> Callable[[], Any] | None:
    """Install (or with ``None`` remove) the grad-mode reader; returns the previous (see
    :func:`tracetorch.engine.saved_meters.register_saved_meter`, which installs the readers of
    the frameworks in use).

    Example:
        >>> import numpy as np
        >>> previous = set_grad_mode(lambda: False)
        >>> call_key((np.zeros(2),), {})[2][0]       # (shape, dtype, (grad mode, generation))
        False
        >>> _ = set_grad_mode(previous)
    """
    global _grad_mode
    previous, _grad_mode = _grad_mode, reader
    _publish()
    return previous


def structure_changed() -> None:
    """Say that some layer's parameters or sublayers changed shape, dtype or identity: every
    per-shape counter made before is found no more, and each layer's next call measures its
    figures again (the counts already made stay, for the next fold)."""
    global _generation
    _generation += 1
    _STRUCTURES.clear()  # (the pairs of earlier generations are found no more)
    _restructure()


def set_call_context(context: Hashable) -> Hashable:
    """Say what, besides a call's arguments, decides what its layers run and return from now
    on (``None``: nothing), a part of every call's key; returns the previous context.

    Example:
        >>> previous = set_call_context(("cpu", "bfloat16"))
        >>> call_key((), {})[0][1] == (structure_generation(), ("cpu", "bfloat16"))
        True
        >>> set_call_context(previous)
        ('cpu', 'bfloat16')
    """
    global _context
    previous, _context = _context, context
    _restructure()
    return previous


def _restructure() -> None:
    global _structure
    if _context is None:
        _structure = _generation
    else:
        pair = (_generation, _context)
        _structure = _STRUCTURES.setdefault(pair, pair)
    _publish()


def structure_generation() -> int:
    """How many times :func:`structure_changed` was called: a part of every call's key.

    Example:
        >>> before = structure_generation()
        >>> structure_changed()
        >>> structure_generation() == before + 1
        True
    """
    return _generation


def training_flag(owner: Any) -> bool | None:
    """The ``training`` flag of a call's owner (a layer in training or eval mode), or ``None``
    where it has none that is a bool: a part of the call's key, since a rule may depend on it
    (BatchNorm's batch statistics, attention's dropout and so its kernel, spectral norm's power
    iteration).

    Example:
        >>> class Layer:
        ...     training = False
        >>> training_flag(Layer()), training_flag(len)
        (False, None)
    """
    flag = getattr(owner, "training", None)
    return flag if flag is True or flag is False else None


def call_key(args: tuple[Any, ...], kwargs: dict[str, Any], owner: Any = None
             ) -> tuple[Any, ...]:
    """The key of a call's counter in ``node.engine.flops_cache``: everything its cached figures
    depend on besides the layer's type: its tensors' shapes and dtypes, then its context — the
    grad mode, the generation of layer structures (with the adapter's call context, where it
    set one: :func:`set_call_context`) and the owner's :func:`training_flag` — as one tuple
    (so that no key is a tuple of ints only, as a shape is: see :func:`make_wrapper`). A
    one-tensor call's key is ``(shape, dtype, (grad mode, generation, training))``.

    Example:
        >>> import numpy as np
        >>> key = call_key((np.zeros(3, np.float32),), {})
        >>> key[:2], key[2][1] == structure_generation()   # key[2][0]: the grad mode
        (((3,), dtype('float32')), True)
    """
    return typed_signature(args, kwargs, ((_grad_mode() if _grad_mode is not None else None,
                                           _structure, training_flag(owner)),))


# (the C wrapper reads these by these names; what they hold: see tracetorch.models.tensors)
_QUIET_READS = QUIET_READS
_INT_SHAPED = INT_SHAPED
_SHAPELESS = SHAPELESS
#: The profiles' default clock: where a profile times calls with it, the C wrapper reads the
#: clock it reads itself (on Linux: CLOCK_MONOTONIC), with no Python call.
_PERF_COUNTER_NS = time.perf_counter_ns
#: Where the C wrapper finds a per-shape counter's slots by name, as it finds a frame's in
#: :class:`Frame` (every name it reads: :data:`tracetorch.engine.native.C_NAMES`).
_ENTRY_FIELDS = ENTRY_FIELDS

#: The innermost open call of this context as it is held, with no check that its profile is
#: still recording (a caller on a per-operation path checks ``frame.collector.active`` itself).
#: Where the C wrapper runs, calls nested in C keep their frames in a cell the variable holds
#: (see ``FrameCell`` in _hotpath.c), read through by the C reader; every read of ``_FRAME``
#: goes through this.
_FRAME_READER = native_type("tracetorch.engine._hotpath", "FrameReader")
innermost_frame: Callable[[], Frame | None] = (
    _FRAME.get if _FRAME_READER is None else _FRAME_READER(_FRAME))


def current_frame() -> Frame | None:
    """The innermost open call of this context (``None`` outside every profile).

    A frame left behind by a profile that was exited in another thread is dropped here: it
    belongs to no running profile.
    """
    frame = innermost_frame()
    if frame is not None and not frame.collector.active:
        _FRAME.set(None)
        return None
    return frame


def open_root(frame: Frame) -> tuple[Token, bool]:
    """Make a profile record this context's calls from now on; returns what
    :func:`close_root` needs to undo it."""
    previous = innermost_frame()
    switched = _switch(previous.ops if previous is not None else False, frame.ops)
    return _FRAME.set(frame), switched


def close_root(collector: Collector, opened: tuple[Token, bool]) -> bool:
    """Undo :func:`open_root`; returns False when that was not possible here.

    A token made in another context (a profile exited in another thread, a generator finalised
    elsewhere) cannot be reset: this context merely stops recording into ``collector``, and the
    frame left in the other context is ignored once ``collector`` is inactive.
    """
    token, switched = opened
    try:
        _FRAME.reset(token)
    except ValueError:
        frame = innermost_frame()
        if frame is not None and frame.collector is collector:
            _FRAME.set(None)
        return False
    if switched and _op_switch is not None:
        frame = innermost_frame()
        _op_switch(frame.ops if frame is not None else False)
    return True


def _switch(current: bool, wanted: bool) -> bool:
    return current is not wanted and _op_switch is not None and _op_switch(wanted)


class OpCounter:
    """Receives tensor operations from a framework and charges them to the innermost open call.

    It implements ``tracetorch.core.autograd.OpObserver``; the torch adapter calls the same
    methods. The frame returned by :meth:`forward_op` tags the operation's autograd node, so its
    gradient is later charged to the layer call that created it.
    """

    def forward_op(self, name: str, flops: int, gemm: bool) -> Frame | None:
        """Charge a forward operation to the innermost open call."""
        return self.charge(name, flops, gemm, 1)

    def charge(self, name: str, flops: int, gemm: bool, calls: int) -> Frame | None:
        """Charge ``flops`` of the operation ``name`` and ``calls`` calls of it (0: counted
        elsewhere, as torch's function mode does) to the innermost open call."""
        frame = innermost_frame()
        if frame is None or not frame.collector.active:
            return None
        node = frame.node
        state = node.engine
        state.op_flops += flops
        if gemm:
            state.op_gemm += flops
        node.note_op(name, calls, flops)
        return frame

    def backward_op(self, tag: Frame | None, name: str, flops: int, gemm: bool,
                    elapsed_ns: int) -> None:
        """Charge a gradient operation to the layer call whose forward created it."""
        frame = tag if tag is not None else innermost_frame()
        if frame is not None:
            collector = frame.collector
            collector.add_backward(frame.node, flops, gemm, elapsed_ns)
            if collector.backward_events is not None and frame.owner is not None:
                end = collector.host_clock()  # (the root's own work is the pass's, no layer's)
                collector.add_backward_span(frame.node, end - elapsed_ns, end)

    def backward_clock(self, tag: Frame | None) -> Callable[[], int]:
        """The clock that times gradient operations charged to ``tag``: the profile's own
        (``profile(clock=...)``; a clock that always reads 0 with ``timing=False``)."""
        frame = tag if tag is not None else innermost_frame()
        return frame.collector.host_clock if frame is not None else _no_clock


def _no_clock() -> int:
    return 0


class BackwardPassOwner:
    """Stands for "a backward pass" as the owner of backward nodes: every pass of one kind is
    the same node whichever tensor it starts from."""


def make_wrapper(kind: NodeKind, label: str | None = None,
                 flops_fn: Callable[..., int] | None = None,
                 guard: Callable[[], bool] | None = None,
                 owner: Any = None) -> Callable[..., Any]:
    """The wrapt wrapper for one patched callable.

    ``kind`` names what the node is (``"module"``, ``"function"``, ``"backward"``,
    ``"optimizer"``); ``label`` names function nodes; ``flops_fn`` is ``instrument(flops=...)``;
    ``guard() -> True`` sends the call straight through unrecorded (torch: while a compiler or
    tracer runs the code, which must see the model exactly as it is); a guard may carry the
    same test as data in its ``native_guard`` attribute, ``(flags, calls)`` — true while an
    ``(object, attribute name)`` flag is true or a call returns true — which the C wrapper
    asks instead, without a Python frame. ``owner``, when given, owns every call instead of the
    object called (a :class:`BackwardPassOwner`).
    """
    # Every backward pass (every batch of a data loader) is one node, whichever tensor (which
    # iterator) it comes from.
    shared_owner = BackwardPassOwner() if owner is None and kind in ("backward", "data") else owner

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
        if guard is not None and guard():
            return wrapped(*args, **kwargs)
        frame = innermost_frame()
        if frame is None:
            # Only a profile asked to watch every thread looks further; others pay one test.
            frame = _all_threads.thread_frame() if _all_threads is not None else None
            if frame is None:
                return wrapped(*args, **kwargs)
        owner = (shared_owner if shared_owner is not None
                 else wrapped if instance is None else instance)
        collector, parent, parent_owner, ops = frame[:4]
        if parent_owner is owner or not collector.active:
            # super().forward() or a layer calling itself is the same call, not a new level; a
            # frame left by a profile that ended elsewhere (another thread) records nothing.
            return wrapped(*args, **kwargs)
        inner = frame.child_frames.get(id(owner))
        if inner is None:
            inner = collector.new_child(frame, owner, kind, label, flops_fn)
        node = inner.node
        found = looked = None
        grad = _grad_mode() if _grad_mode is not None else None
        if inner.ops and _op_replay is not None:  # its counts learned: a frame with ops off
            # (what makes the key is read before the call, reaching no mode: a caller that
            # counts has the profile's own on the stack, taken off for the reads where that
            # leaves nothing to hold the replay; the call runs with it off anyway once replayed)
            held = _held()
            lifted = held and ops and _op_switch is not None and _op_switch(False)
            if lifted:
                held = _held()
            try:
                if not held:
                    found = _lookup(inner.flops_cache, args, kwargs, owner, grad)
                    looked = _structure
            finally:
                if lifted:
                    _op_switch(True)  # type: ignore[misc]
            counter = found[0] if found is not None else None
            learned = counter[LEARNED] if counter is not None else None
            if (counter is not None and learned.__class__ is tuple and learned[3] is inner
                    and node not in _op_observing and counter[REPLAYED] < counter[BUDGET]):
                counter[REPLAYED] += 1  # (added to the node at its fold: settle_replayed)
                inner = learned[4]
            else:
                inner = _op_replay(inner, args, kwargs, owner, counter)
        switched = ops is not inner.ops and _op_switch is not None and _op_switch(inner.ops)
        token = _FRAME.set(inner)
        clock = collector.clock
        hooks = collector.call_hooks
        if hooks is not None:
            hooks.enter(node)
        start = clock()
        try:
            output = wrapped(*args, **kwargs)
        except BaseException as error:
            end = clock()
            if hooks is not None:
                hooks.exit(node)
            _FRAME.reset(token)
            if switched:
                _op_switch(ops)  # type: ignore[misc]
            if kind != "data" or not isinstance(error, StopIteration):
                # (a data loader running out of batches is the loop's end, not a failed call)
                collector.record_failure(node, start, end)
            raise
        end = clock()
        if hooks is not None:
            hooks.exit(node)
        _FRAME.reset(token)
        # What follows reads a torch module's tensor attributes (``.shape``, ``.grad_fn``): with
        # torch's function mode on the stack each read costs microseconds, so counting stays off
        # until the end, where the caller's setting comes back. Other layers' tensors (core's)
        # never reach the mode: switching would only cost them.
        quiet = inner.observe and inner.ops and _op_switch is not None and _op_switch(False)
        if collector.plain_timing:
            pending = inner.pending  # TimeStats.add, inlined: this runs on every call
            pending.append(end - start)
            if len(pending) >= FLUSH_EVERY:
                node.time.flush()
        else:
            collector.add_duration(node, start, end)
        # The call's counter, by its key (call_key), unless found before the call with the
        # structure generation still current (the call may have found a layer replaced since
        # the last opening, which changes its key: see structure_changed).
        entry, key, shape = (found if found is not None and looked is _structure
                             else _lookup(inner.flops_cache, args, kwargs, owner, grad))
        if entry is None:
            entry = collector.first_entry(node, owner, key, shape, args, kwargs, output)
        calls = entry[CALLS]  # count_call, inlined
        entry[CALLS] = calls + 1
        if not calls:
            collector.touch(node)
        # (torch's gate is its grad mode, read above already; a profile between the steps it
        # samples, backward_every, marks nothing)
        if (inner.observe and _exit_observer is not None
                and (grad if _observe_now is _grad_mode else _observe_now())
                and collector.backward_on):
            _exit_observer(inner, args, kwargs, output, entry)
        if kind == "backward":
            collector.flush_backward(node)
        if ops and (quiet or switched):
            _op_switch(True)  # type: ignore[misc]
        return output

    native = _NATIVE_WRAPPER
    if native is None:
        return wrapper
    # The same steps in C (tracetorch/engine/_hotpath.c), reading this module's settings on
    # each call; the collector makes a node at its first call (new_child, with these three),
    # and the uncommon cases run ``wrapper`` above.
    native_guard = getattr(guard, "native_guard", None) or guard
    return native(wrapper, globals(), native_guard, shared_owner, kind == "backward",
                  kind == "data", (kind, label, flops_fn))


#: The C version of ``make_wrapper``'s wrapper, where it is built (see tracetorch.engine.native).
_NATIVE_WRAPPER = native_type("tracetorch.engine._hotpath", "Wrapper")


def count_call(collector: Collector, node: CallNode, entry: list[Any]) -> None:
    """Count one call of ``node`` in its counter ``entry``; the counter's first call since the
    last fold has the next fold fold the node (the only call of a step that needs to).

    Example:
        >>> from tracetorch.engine.collector import Collector
        >>> from tracetorch.records.tree import new_entry
        >>> collector = Collector(CallNode.root(), model=None)
        >>> node, entry = collector.root.child("fc", "Linear", "m0"), new_entry()
        >>> count_call(collector, node, entry); count_call(collector, node, entry)
        >>> entry[CALLS], collector.touched == [node]
        (2, True)
    """
    calls = entry[CALLS]
    entry[CALLS] = calls + 1
    if not calls:
        collector.touch(node)


#: The per-key counters of a frame that keeps none (a running total's: see
#: :mod:`tracetorch.engine.tally`): always empty, and the wrappers make no key for its calls
#: (its collector's ``first_entry`` is handed ``None`` for the key and the shape). Never
#: replaced: the C wrapper reads it once, when it is made.
NO_COUNTERS: dict[Any, list[Any]] = {}


def _lookup(cache: dict[Any, list[Any]], args: tuple[Any, ...], kwargs: dict[str, Any],
            owner: Any, grad: Any) -> tuple[list[Any] | None, Any, Any]:
    """A call's counter in ``cache`` (``None`` where there is none yet), the key it is (or is
    to be) kept for, and its one tensor's shape (``None``: not a one-tensor call).

    A one-tensor call's first key is kept under its shape alone, and a call with that shape
    checks the rest of the key by identity first (dtypes, bools and small ints are
    singletons): the common call builds no key (the key handed back is then ``None``).
    """
    if cache is NO_COUNTERS:
        return None, None, None
    training = getattr(owner, "training", None)  # training_flag, inlined
    if training is not True and training is not False:
        training = None
    shape = None
    if len(args) == 1 and not kwargs:
        cls = args[0].__class__
        # A class read quietly (a torch subclass with its own __torch_function__) goes
        # through call_key, which reads it so; QUIET_READS is filled at a class's first sight.
        if (_QUIET_READS[cls] if cls in _QUIET_READS else quiet_reads(cls)) is None:
            try:
                shape = getattr(args[0], "shape", None)
            except Exception:  # a shape that cannot be read (a strided nested tensor)
                shape = None
    entry = key = None
    if shape is not None:
        dtype = getattr(args[0], "dtype", None)
        try:
            entry = cache.get(shape)
        except TypeError:  # a ``.shape`` that cannot key a dict (a list...): call_key's can
            shape = None
        if entry is not None:
            made = entry[KEY]
            context = made[2]  # (grad, structure, training)
            if (made[1] is not dtype or context[0] is not grad
                    or context[1] is not _structure or context[2] is not training):
                key = (shape, dtype, (grad, _structure, training))
                if made != key:
                    entry = None
    if entry is None:
        if key is None:
            key = (call_key(args, kwargs, owner) if shape is None
                   else (shape, dtype, (grad, _structure, training)))
        entry = cache.get(key)
    return entry, key, shape


def counter_of(cache: dict[Any, list[Any]], key: Any) -> list[Any] | None:
    """The counter kept for ``key`` (:func:`call_key`) in a node's ``cache``, if any: under the
    key, or for a one-tensor call's key under its shape.

    Example:
        >>> import numpy as np
        >>> from tracetorch.records.tree import new_entry
        >>> key = call_key((np.zeros(3),), {})
        >>> entry = new_entry(); entry[KEY] = key
        >>> counter_of({(3,): entry}, key) is entry, counter_of({}, key)
        (True, None)
    """
    entry = cache.get(key)
    if entry is None and len(key) == 3:
        entry = cache.get(key[0])
        if entry is not None and entry[KEY] != key:
            entry = None
    return entry
