"""Counting torch's matrix products, convolutions and attention where they run, through a mode.

Nothing of torch is replaced: while a profile counts operations, :class:`OpCountingMode` (a
``torch.overrides.TorchFunctionMode``) sits on the calling thread's torch-function-mode stack,
so torch itself hands it every call — ``torch.matmul``, ``@``, ``F.linear``, a function bound
before the block (``from torch import matmul``) — as the very objects a tensor subclass's
``__torch_function__`` sees. Counted functions (:func:`~tracetorch.flops.torch_functions.\
torch_function_formulas`) report their FLOPs with ``counter.forward_op(name, flops, gemm=True)``
to the innermost open call; everything else takes a fast path (one dict lookup, then the call).
``Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad`` arrive the same way
and run as recorded backward passes (:mod:`~tracetorch.adapters.torch.backward`).

**Where the mode is on the stack.** A function mode costs every call that reaches it, about
1.5 µs on torch 2.13 CPU (``benchmarks/overhead_torch.py``): every op (``relu``, ``view``…) and
every tensor attribute read (``.shape``, ``.grad_fn``), the fast path adding little to what an
empty mode costs. So it is on the stack only where its counts are used: at a profile's root and
inside torch modules without a FLOP rule (custom layers, containers); other calls
(instrumented functions, backward passes) keep their caller's setting. A module whose rule says
it all (``nn.Linear``, ``ReLU``…) runs without it: where that changes between a call and its
caller, the engine calls the switch of :func:`make_switch`, which pops the mode or pushes it
back (about 0.2 µs each). With ``profile(ops=False)`` no torch module counts, so the mode stays
only outside them, for the backward entry points (a backward pass started inside a torch module
is then not recorded), and counts nothing. A user's own modes are never moved: the mode is
pushed on top and popped only while it is the top.

**Compilers and tracers.** While ``torch.compile``/``torch.export`` trace
(``torch.compiler.is_compiling()``, tested first so Dynamo folds it and traces a plain call),
while ``torch.jit.trace`` or ``torch.fx.symbolic_trace`` run, inside a backward pass (forward
operations recomputed there are backward work), or when the result is not a tensor (an fx
``Proxy``, ``NotImplemented``), nothing is counted or inspected: reading ``.shape`` there would
add nodes to the traced graph.

Example:
    >>> import torch, tracetorch
    >>> from torch import matmul                     # bound before the block: still counted
    >>> a = torch.ones(4, 5)
    >>> with tracetorch.profile() as prof:
    ...     _ = matmul(a, a.T) + a @ a.T
    >>> prof.gemm_flops                               # 2 x (2·4·5·4)
    320
    >>> torch._C._len_torch_function_stack()          # nothing left on the stack
    0
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any, Callable, cast

import torch
from torch.overrides import TorchFunctionMode

from tracetorch.adapters.torch import marks as marks_module
from tracetorch.adapters.torch.backward import forget_passes, pass_recorder
from tracetorch.adapters.torch.learned import (
    OpLearner,
    disturb,
    learning_enabled,
    note_marked,
)
from tracetorch.adapters.torch.marks import mark_operation, operation_tensors, tag_call
from tracetorch.adapters.torch.product_paths import WATCHED
from tracetorch.adapters.torch.tracing import tracing
from tracetorch.adapters.torch.value_reads import VALUE_READS, DependsOnValues
from tracetorch.engine.hotpath import (
    Frame,
    OpCounter,
    current_frame,
    innermost_frame,
    set_exit_observer,
    set_op_replay,
    set_op_switch,
)
from tracetorch.engine.native import native_type
from tracetorch.engine.unsupported import warn_unsupported
from tracetorch.flops.gradients import function_gradient_parts
from tracetorch.flops.torch_functions import (
    COMPANIONS,
    CallFormula,
    data_movement_functions,
    torch_function_formulas,
    uncounted_functions,
)

__all__ = ("OpCountingMode", "drop_retired", "make_switch", "mode_off", "start_op_counting",
           "traced_forward")

#: ``entry(func, args, kwargs) -> result`` for a function the mode does more than call.
Entry = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]

# ``torch.compiler.is_compiling()`` without its two inner Python calls: Dynamo folds
# ``is_dynamo_compiling()`` to True while it traces, and the flag is set for the rest of a
# compile or export session (TorchScript never runs a Python mode).
_dynamo_compiling = torch.compiler.is_dynamo_compiling
_compiler = torch.compiler
_innermost = innermost_frame
_current_node = torch._C._current_autograd_node
_Tensor = torch.Tensor
_no_subclass_dispatch = torch._C.DisableTorchFunctionSubclass
_stack_len = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_push = torch._C._push_on_torch_function_stack
_pop = torch._C._pop_torch_function_stack


def _moving_data(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # 0 FLOPs, but seen: a layer that runs nothing else costs a known 0, not an unknown. (Not
    # inside a backward pass, where a layer recomputed for checkpointing counts nothing: see
    # the module docstring.)
    result = func(*args, **kwargs)
    frame = current_frame()
    if (frame is not None and frame.owner is not None and frame.ops
            and _current_node() is None):
        node = frame.node
        if node.flops_source == "none":
            node.flops_source = "ops"
    return result


def _uncounted_arithmetic(func: Callable[..., Any], args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Any:
    # Arithmetic with no formula (a fused LSTM, a solver): the layer's own FLOPs are unknown,
    # a lower bound, whatever else it counted (see torch_functions.uncounted_functions).
    result = func(*args, **kwargs)
    frame = current_frame()
    if (frame is not None and frame.owner is not None and frame.ops
            and _current_node() is None and not tracing()):
        node = frame.node
        if node.flops_source != "uncounted":
            node.flops_source = "uncounted"
            if frame.collector.warn_unsupported:
                warn_unsupported(node.type_name, compiled=False, stacklevel=4,
                                 uncounted=_op_name(func))
    return result


#: The namespaces of ``torch.ops`` whose operators add nothing to a model's FLOPs (profiler ranges,
#: collectives, compiler plumbing) or are torch's own (aten, prims: reached through torch.ops in
#: export and compiler code, and counted, where they are, through the functions above).
_TORCH_NAMESPACES = frozenset({"aten", "prims", "profiler", "_c10d_functional",
                               "c10d_functional", "c10d", "_dtensor", "higher_order", "inductor"})


def _library_operator(func: Any) -> bool:
    """Whether ``func`` is an operator a library registered with ``torch.library`` or a C++
    extension (``torch.ops.transformers.grouped_mm_fallback``, ``torch.ops.torchvision.nms``),
    whose arithmetic no formula here knows.

    Example:
        >>> _library_operator(torch.ops.aten.mm), _library_operator(torch.matmul)
        (False, False)
    """
    if isinstance(func, torch._ops.OpOverload):
        namespace = func.namespace
    elif isinstance(func, torch._ops.OpOverloadPacket):
        namespace = func._qualified_op_name.partition("::")[0]
    else:
        return False
    return namespace not in _TORCH_NAMESPACES


def _mark_product(frame: Frame, func: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any], result: Any) -> None:
    # Products carry their gradients' cost to the backward pass (elementwise gradients are not
    # counted for torch); a call watched for learning notes each (see .product_paths).
    fn = result.grad_fn
    parts = (function_gradient_parts(func, args, kwargs, result) if fn is not None else None) or ()
    marked = False
    if parts:
        note_marked()  # (only the mode can: see .learned)
        marked = mark_operation(frame, result, parts, args, kwargs)
    watch = WATCHED.get(frame.node) if WATCHED else None
    if watch is not None:
        watch.note(fn if marked else None, parts, operation_tensors(args, kwargs),
                   marking=frame.collector.backward_on)


def _reading_values(mode: OpCountingMode, test: DependsOnValues, entry: Entry | None) -> Entry:
    # A call whose later work can follow tensor values (see .value_reads): the keys of the calls
    # watched for learning around it (its layer's and its callers') are never learned.
    def run(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        learner = mode.learner
        if learner is not None and _current_node() is None and test(args, kwargs):
            frame = _innermost()
            if frame is not None and frame.owner is not None:
                learner.saw_values(frame.node)
        return func(*args, **kwargs) if entry is None else entry(func, args, kwargs)

    return run


def _computed(result: Any, args: tuple[Any, ...]) -> Any:
    # The tensor a counted call computed: its result, or the first of the values and indices
    # it returns (torch.max(x, dim), F.max_pool2d(..., return_indices=True)), or of the list a
    # foreach function returns (an in-place one returns None: its first tensor, updated); None
    # for anything else (an fx Proxy, NotImplemented).
    if isinstance(result, _Tensor):
        return result
    if result is None and args and isinstance(args[0], list):
        result = args[0]
    if isinstance(result, (tuple, list)) and result and isinstance(result[0], _Tensor):
        return result[0]
    return None


def _counting(name: str, formula: CallFormula, gemm: bool,
              charge: Callable[..., Any]) -> Entry:
    companion = COMPANIONS.get(name)

    def count(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = func(*args, **kwargs)
        frame = current_frame()
        if (frame is None or not frame.ops or not frame.collector.count_ops
                or _current_node() is not None or tracing()):
            return result  # outside a counting call, or in a backward pass or a trace
        computed = _computed(result, args)
        if computed is None:
            return result  # nothing real ran (see the module docstring)
        try:
            with _no_subclass_dispatch():  # a subclass's __torch_function__ sees no .shape read
                flops = formula(args, kwargs, result)
                if flops:
                    charge(name, flops, gemm, 0)  # the mode counted the call itself
                    if gemm:  # (of values and weights, the values carry the gradient)
                        _mark_product(frame, func, args, kwargs, computed)
                    if companion is not None:  # (its arithmetic besides the product)
                        charge(companion[0], companion[1](args, kwargs, result), False, 0)
                elif frame.owner is not None and frame.node.flops_source == "none":
                    # (counted, and it did nothing: an empty batch, a transform of one point)
                    frame.node.flops_source = "ops"  # a known 0, as data movement is
        except Exception:  # an unusual call signature is not worth breaking the model for
            return result
        return result

    return count


#: Per counter: the entries of the counted, data-movement and uncounted functions, built once,
#: not at every opening of the first profile (a few hundred closures); the entries of the
#: functions its modes met so far (:data:`_PLAIN` for a function that only runs), which each
#: new mode starts from (a copy of the functions a model uses, not of every function known);
#: and what each function is called in a node's op table (a counted one: its formula's name,
#: under which it reports its FLOPs).
_COUNTING: weakref.WeakKeyDictionary[
    OpCounter, tuple[dict[Any, Entry], dict[Any, Entry], dict[Any, str]]] = (
    weakref.WeakKeyDictionary())

#: The entry of a function that only runs, nothing to count or record in it: a marker compared
#: by identity, never called.
_PLAIN = cast(Entry, object())


def _counting_entries(counter: OpCounter
                      ) -> tuple[dict[Any, Entry], dict[Any, Entry], dict[Any, str]]:
    known = _COUNTING.get(counter)
    if known is None:
        entries: dict[Any, Entry] = dict.fromkeys(data_movement_functions(), _moving_data)
        entries.update(dict.fromkeys(uncounted_functions(), _uncounted_arithmetic))
        names: dict[Any, str] = {}
        for func, (name, formula, gemm) in torch_function_formulas().items():
            entries[func] = _counting(name, formula, gemm, counter.charge)
            names[func] = name
        known = _COUNTING[counter] = (entries, {}, names)
    return known


#: What torch hands a function mode for a tensor attribute read or written (``x.shape``,
#: ``p.grad = g``): a property's getter or setter, named ``__get__``/``__set__``.
_ATTRIBUTE_ACCESS = frozenset({"__get__", "__set__"})


def _op_name(func: Any) -> str:
    """The name of ``func`` in an op table; ``""`` for a tensor attribute read or written, which
    runs no operation (it would be listed as ``__get__``).

    Example:
        >>> _op_name(torch.matmul), _op_name(torch.Tensor.shape.__get__)
        ('matmul', '')
    """
    name = getattr(func, "__name__", None) or repr(func)
    return "" if name in _ATTRIBUTE_ACCESS else name


def _disturbing(entry: Entry) -> Entry:
    # A backward pass recorded inside a layer's call: no call running it is learned from. (One
    # at the root, a training loop's, adds to no layer's op table: the calls watched across it,
    # until their node's next call, still teach.)
    def run(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        frame = _innermost()
        if frame is not None and frame.owner is not None:
            disturb()
        return entry(func, args, kwargs)

    return run


class OpCountingMode(TorchFunctionMode):
    """The function mode of one profiling session: counts the functions of
    :func:`~tracetorch.flops.torch_functions.torch_function_formulas` and records backward
    passes; every other call goes straight through. :meth:`retire` makes it a pass-through."""

    def __init__(self, counter: OpCounter) -> None:
        super().__init__()
        self._known, self._met, self._names = _counting_entries(counter)
        entries = dict(self._met)
        backward = _disturbing(pass_recorder())
        entries[torch.Tensor.backward] = backward
        entries[torch.autograd.backward] = backward
        entries[torch.autograd.grad] = _disturbing(pass_recorder("autograd.grad"))
        for func, test in VALUE_READS.items():
            entries[func] = _reading_values(self, test, self._known.get(func))
        self._entries = entries
        self.retired = False
        #: What learns this session's calls (set by :func:`start_op_counting`): told of each
        #: call that lets a layer's work follow tensor values.
        self.learner: OpLearner | None = None

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if _dynamo_compiling() or _compiler._is_compiling_flag:
            # first: Dynamo folds it and traces the plain call below
            return func(*args, **(kwargs or {}))
        try:
            entry = self._entries.get(func)
        except TypeError:  # an unhashable callable handed to modes: nothing to count in it
            entry = _PLAIN
        if entry is None:
            entry = self._first_met(func)
        frame = _innermost()
        # Inside a layer (not a backward pass, not a profile that ended): in its op table.
        if (frame is not None and frame.owner is not None and frame.collector.active
                and _current_node() is None):
            name = self._names.get(func)
            if name is None:
                name = self._names[func] = _op_name(func)
            if name:  # ("": a tensor attribute read or written, no operation of the layer's)
                if frame.collector.op_timing:
                    clock = frame.collector.host_clock
                    start = clock()
                    result = (func(*args, **(kwargs or {})) if entry is _PLAIN
                              else entry(func, args, kwargs or {}))
                    frame.node.note_op(name, 1, 0, clock() - start)
                    return result
                frame.node.note_op(name, 1)
        if entry is _PLAIN:
            return func(*args, **kwargs) if kwargs else func(*args)
        return entry(func, args, kwargs or {})

    def _first_met(self, func: Any) -> Entry:
        # A function this mode meets for the first time: its entry, kept for this mode and the
        # next ones of its counter (an operator a library registered is arithmetic with no
        # formula; a function nothing knows only runs). A retired mode keeps nothing.
        entry = self._known.get(func)
        if entry is None:
            entry = _uncounted_arithmetic if _library_operator(func) else _PLAIN
        if not self.retired:
            self._entries[func] = self._met[func] = entry
        return entry

    def retire(self) -> None:
        """Count and record nothing from now on: a mode left on a thread's stack by a profile
        exited in another thread only passes calls through, until the next switch in that
        thread removes it."""
        self._entries = {}
        self.retired = True


def make_switch(mode: OpCountingMode) -> Callable[[bool], bool]:
    """The engine's operation-counting switch for ``mode`` (see
    :func:`tracetorch.engine.hotpath.set_op_switch`): ``switch(True)`` pushes ``mode`` on the
    calling thread's function-mode stack unless it is the top already, ``switch(False)`` pops it
    only if it is the top; each returns whether it changed anything.

    Example:
        >>> switch = make_switch(OpCountingMode(OpCounter()))
        >>> switch(True), switch(True), torch._C._len_torch_function_stack()
        (True, False, 1)
        >>> switch(False), switch(False), torch._C._len_torch_function_stack()
        (True, False, 0)
    """
    native = _NATIVE_SWITCH
    if native is not None:  # the same steps in C (_marks.c), reading this module's globals
        made: Callable[[bool], bool] = native(mode, globals())
        return made

    def switch(on: bool) -> bool:
        depth = _stack_len()
        if not on:
            if not depth:
                return False
            top = _pop()  # (popped first, put back if it is another's: one call fewer)
            if top is mode:
                return True
            _push(top)
            return False
        if depth:
            if _stack_at(depth - 1) is mode:
                return False
            # A retired mode was left by a profile exited in another thread: drop it now.
            # (Asked only below something: the usual push is onto an empty stack, and this
            # scan was two thirds of a switch's cost.)
            drop_retired()
        _push(mode)
        return True

    return switch


#: The C version of make_switch's closure, where it is built (see tracetorch.engine.native).
_NATIVE_SWITCH = native_type("tracetorch.adapters.torch._marks", "Switch")


def drop_retired(mode: OpCountingMode | None = None) -> None:
    """Take the retired profiles' modes (and ``mode``) off the calling thread's function-mode
    stack, wherever they are: the modes above one are popped and pushed back in their order,
    so a user's own mode entered after the profile's stays where it is among the user's modes
    and its own exit still pops it.

    Example:
        >>> retired = OpCountingMode(OpCounter())
        >>> retired.retire()
        >>> torch._C._push_on_torch_function_stack(retired)
        >>> drop_retired(), torch._C._len_torch_function_stack()
        (None, 0)
    """
    for below in range(_stack_len()):  # (a loop, not any() over a generator: asked per push)
        if _dropped(_stack_at(below), mode):
            break
    else:
        return  # the usual case: one pass of reads, nothing moved
    above: list[Any] = []
    while _stack_len():
        top = _pop()
        if not _dropped(top, mode):
            above.append(top)
        if not any(_dropped(_stack_at(i), mode) for i in range(_stack_len())):
            break
    for kept in reversed(above):
        _push(kept)


def _dropped(candidate: Any, mode: OpCountingMode | None) -> bool:
    return candidate is mode or (isinstance(candidate, OpCountingMode) and candidate.retired)


@contextlib.contextmanager
def mode_off() -> Iterator[None]:
    """For the duration, the profiles' modes on top of the function-mode stack are off it
    (pushed back after, in their order): for code that must find the stack as outside a block.

    Example:
        >>> mode = OpCountingMode(OpCounter())
        >>> torch._C._push_on_torch_function_stack(mode)
        >>> with mode_off():
        ...     torch._C._len_torch_function_stack()
        0
        >>> torch._C._pop_torch_function_stack() is mode
        True
    """
    popped: list[Any] = []
    while _stack_len() and isinstance(_stack_at(_stack_len() - 1), OpCountingMode):
        popped.append(_pop())
    try:
        yield
    finally:
        for mode in reversed(popped):
            _push(mode)


def traced_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.nn.Module._slow_forward`` (what ``_call_impl`` calls instead of ``forward``
    while the TorchScript tracer runs) with the profiles' modes off: the tracer records, for
    each operation, the Python frame that called it and names values after that frame's
    variables, which would be the mode's own frame.

    Example:
        >>> slow = traced_forward(lambda module, x: x + 1)
        >>> slow(None, 1)
        2
    """
    def _slow_forward(module: Any, *args: Any, **kwargs: Any) -> Any:
        with mode_off():
            return original(module, *args, **kwargs)

    return _slow_forward


def _exit_observer() -> Callable[..., None]:
    # tag_call, or its C version where it is built (tracetorch.engine.native).
    marker = native_type("tracetorch.adapters.torch._marks", "Marker")
    return tag_call if marker is None else marker(tag_call, vars(marks_module))


def start_op_counting(counter: OpCounter) -> Callable[[], None]:
    """Count operations and backward passes for the engine from now on: installs the switch
    and the exit observer that tags autograd nodes (:func:`~tracetorch.adapters.torch.marks.
    tag_call`); a profile already open in this thread (torch imported inside the block) gets
    the mode at once. Returns the cleanup that undoes exactly that.

    Example:
        >>> stop = start_op_counting(OpCounter())
        >>> stop()
        >>> torch._C._len_torch_function_stack()
        0
    """
    mode = OpCountingMode(counter)
    switch = make_switch(mode)
    previous_switch = set_op_switch(switch)
    # Calls whose counts are learned run without the mode (see .learned).
    learner = mode.learner = OpLearner(mode) if learning_enabled() else None
    replay = learner.replay if learner is not None else None
    previous_replay = (set_op_replay(replay, learner.HOLD, learner.observing)
                       if learner is not None else set_op_replay(None))
    # Marking autograd nodes has nothing to do under no_grad/inference mode: asked of torch
    # before the observer is called at all.
    observer = _exit_observer()
    previous_observer = set_exit_observer(observer, torch.is_grad_enabled)
    frame = current_frame()
    if frame is not None and frame.ops:
        switch(True)

    def stop() -> None:
        # Put back what was there, unless someone installed their own since.
        current = set_op_switch(previous_switch)
        if current is not switch:
            set_op_switch(current)
        current_replay = set_op_replay(*previous_replay)
        if current_replay[0] is not replay:
            set_op_replay(*current_replay)
        if learner is not None:
            learner.forget()
        installed = set_exit_observer(*previous_observer)
        if installed[0] is not observer:
            set_exit_observer(*installed)
        mode.retire()
        drop_retired(mode)  # also from under a user's mode entered inside the block
        forget_passes()

    return stop
