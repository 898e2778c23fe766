"""Optimizer steps as nodes, through torch's own global step hooks: no ``step`` is patched.

``torch.optim.Optimizer`` runs the hooks registered with ``register_optimizer_step_pre_hook``
and ``register_optimizer_step_post_hook`` around every ``step()`` (torch wraps each optimizer
class's ``step`` with its hook runner when the first optimizer of the class is built). While a
profile is open, the pre-hook opens an ``optimizer`` node named ``"{type}.step"`` (``SGD.step``)
as a wrapped layer call would, the post-hook closes it, and the hooks are removed when the last
profile closes. Nothing of an optimizer, its own class or an LR scheduler (which wraps
``optimizer.step`` on the instance) is touched, so objects created inside a block run no
tracetorch code after it.

A step's FLOPs come from the rule registered for the optimizer's class (the ``torch.optim``
ones: :mod:`tracetorch.flops.optimizers`), run in the pre-hook, before the step: which
parameters have a gradient and which branch the step takes (SGD's first momentum step, RAdam's
rectification) are read then, at every step. An optimizer class with no rule (a user's,
``LBFGS``) is counted by its tensor operations, as a layer without one is, under the profile's
function mode; where it runs none (or under ``ops=False``) its FLOPs are unknown (``?``, listed
in ``prof.unsupported``), never a silent 0.

``zero_grad`` runs without the profiles' function mode: while a profile is open,
``torch.optim.Optimizer.zero_grad`` is :func:`quiet_zero_grad` of torch's own (installed on the
class through the patch board, put back when the last profile closes). It reads and writes each
parameter's ``.grad``, and through the mode each of those costs about 2 µs and counts nothing
(no FLOPs, at the profile's root no op table): on the 50×(Linear, ReLU) training step (100
parameters) 29% of tracetorch's instructions went there (``benchmarks/instructions.py``).
Popping the mode from inside it is not possible (torch takes the mode off its stack while its
handler runs and puts it back after), hence the class's function; an optimizer whose class
overrides ``zero_grad`` without calling torch's runs it with the mode on, as before. So does
``torch.nn.Module.zero_grad`` (``model.zero_grad()``): it warns for a DataParallel replica,
naming its caller's line, which a Python function around it would become.

A step that raises never reaches its post-hook. The profile notices at the next step in the
same context (the torch call of the failed step is no longer on the stack): the step counts as
a call that raised (``errors``), timed to that moment — an upper bound, which still covers what
was recorded under it meanwhile. ``profile.step()`` and the end of the block reopen the
profile's root, so later calls do not land under a failed step.

Example:
    >>> import torch
    >>> import tracetorch
    >>> weight = torch.nn.Parameter(torch.ones(2))
    >>> opt = torch.optim.SGD([weight], lr=0.1)
    >>> with tracetorch.profile() as prof:
    ...     weight.grad = torch.ones(2)
    ...     opt.step()
    >>> step = prof.find("SGD.step")
    >>> (step.kind, step.calls, step.flops)          # param - lr·grad: 2 per element
    ('optimizer', 1, 4)
"""
from __future__ import annotations

import functools
import sys
from contextvars import ContextVar
from types import FrameType
from typing import Any, Callable

from torch._C import DisableTorchFunction
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from tracetorch.adapters.torch.ops import mode_off
from tracetorch.adapters.torch.tracing import skip_frames, tracing
from tracetorch.engine.hotpath import (
    Frame,
    all_threads_collector,
    close_root,
    count_call,
    current_frame,
    open_root,
)
from tracetorch.engine.unsupported import warn_unsupported
from tracetorch.flops.optimizers import register_torch_optimizer_rules, sparse_gradients
from tracetorch.flops.registry import FlopCount
from tracetorch.models.tensors import signature, tensor_bytes
from tracetorch.records.tree import FLOPS, GEMM_FLOPS, INPUT_BYTES, MACS, CallNode, new_entry

__all__ = ("quiet_zero_grad", "start_step_hooks")

# The rules of torch.optim's classes go into the registry once, when the first profile opens.
_RULES_REGISTERED = False

# The user's frame, counted from _first_entry: close, _post_step, torch's hook runner, the user.
_USER_FRAME = 5


class _OpenStep:
    """One ``step()`` between its hooks: torch's frame running it, the node it opened and its
    FLOPs as the rule counted them before the step (``frame`` is ``None`` when it records
    nothing: no profile, or the same optimizer's step called again from its own, as
    ``super().step()`` does; ``counted`` is ``None`` when the FLOPs are unknown)."""

    __slots__ = ("outer", "caller", "frame", "opened", "start", "counted")

    def __init__(self, outer: _OpenStep | None, caller: FrameType) -> None:
        self.outer = outer
        self.caller = caller
        self.frame: Frame | None = None
        self.opened: Any = None
        self.start = 0
        self.counted: int | FlopCount | None = None

    def open(self, parent: Frame, optimizer: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> None:
        """Open the optimizer's node under ``parent``, the innermost open call, and count the
        step's FLOPs before it runs."""
        collector = parent.collector
        frame = parent.child_frames.get(id(optimizer))
        if frame is None:
            frame = collector.new_child(parent, optimizer, "optimizer", None, None)
        node = frame.node
        rule_state = node.engine.rule_state
        if rule_state == "rule":
            rule = collector.registry.lookup(type(optimizer), method="step")
            # Outside the profile's function mode: each p.grad it reads would go through it
            # (~2 µs a parameter), and a rule's own operations are no operations of the step.
            try:
                with DisableTorchFunction():
                    self.counted = rule(optimizer, args + tuple(kwargs.values()), None)
            except Exception as error:  # (a built-in rule's: a sparse gradient)
                collector.rule_failed(node, rule, error)
                self.counted = 0  # the node's FLOPs unknown, a lower bound
        elif rule_state == "free":
            self.counted = 0
        elif frame.ops and sparse_gradients(optimizer):
            # Counted by its operations, a sparse gradient's would be counted over the
            # parameter's elements, not the stored ones: unknown instead, nothing counted.
            node.flops_source = "uncounted"
            if collector.warn_unsupported:
                warn_unsupported(node.type_name, False, stacklevel=_USER_FRAME - 1,
                                 uncounted="updates with sparse gradients")
            frame = frame._replace(ops=False)
        self.frame = frame
        self.opened = open_root(frame)
        self.start = collector.clock()

    def close(self, args: tuple[Any, ...], kwargs: dict[str, Any], failed: bool) -> None:
        """Close the node: a step that returned, or one that raised (noticed later)."""
        frame = self.frame
        if frame is None:
            return
        collector, node = frame[:2]
        end = collector.clock()
        if current_frame() is frame:  # not when the profile reopened its root meanwhile
            close_root(collector, self.opened)
        if not collector.active:
            return
        if failed:
            collector.record_failure(node, self.start, end)
            return
        collector.add_duration(node, self.start, end)
        # Per count as well as per shape: a step's FLOPs change with the gradients present and
        # the branch it took, and each distinct count is one counter.
        key = (signature(args, kwargs), self.counted)
        entry = frame.flops_cache.get(key)
        if entry is None:
            entry = frame.flops_cache[key] = _first_entry(collector, node, args, kwargs,
                                                          self.counted)
        count_call(collector, node, entry)


def _first_entry(collector: Any, node: CallNode, args: tuple[Any, ...],
                 kwargs: dict[str, Any], counted: int | FlopCount | None) -> list[Any]:
    """The counter of a step's first call with these arguments and this count (see
    :data:`~tracetorch.records.tree.ENTRY_FIELDS`): what ``Collector.first_entry`` makes for a
    layer, with the FLOPs counted before the step instead of a rule run after it."""
    node.note_shapes(signature(args, kwargs), signature((None,)))
    entry = new_entry()
    if collector.memory:
        entry[INPUT_BYTES] = tensor_bytes(args) + tensor_bytes(kwargs)  # a closure: nothing
    if isinstance(counted, FlopCount):
        macs = counted.macs if counted.macs is not None else counted.gemm // 2
        entry[FLOPS], entry[GEMM_FLOPS], entry[MACS] = (
            int(counted.flops), int(counted.gemm), int(macs))
    elif counted is not None:
        entry[FLOPS] = int(counted)
    elif (node.engine.rule_state == "none" and not node.engine.op_flops
          and node.flops_source != "uncounted" and collector.warn_unsupported):
        # (a step with no rule counts its operations: unknown only where it ran none; one
        # with a sparse gradient was warned of at its start)
        warn_unsupported(node.type_name, False, stacklevel=_USER_FRAME,
                         ops_counted=collector.count_ops)
    return entry


#: The steps open in this context, innermost first (a linked list through ``outer``).
_OPEN: ContextVar[_OpenStep | None] = ContextVar("tracetorch_open_step", default=None)


def _pre_step(optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if tracing():  # a compiled step: nothing to time, and Dynamo cannot trace what follows
        return
    caller = sys._getframe(1)  # torch's hook runner, on the stack until the step ends
    outer = _close_failed(_OPEN.get(), caller)
    step = _OpenStep(outer, caller)
    parent = current_frame()
    if parent is None:
        watcher = all_threads_collector()
        parent = watcher.thread_frame() if watcher is not None else None
    if parent is not None and parent.owner is not optimizer and parent.collector.active:
        step.open(parent, optimizer, args[1:], kwargs)
    _OPEN.set(step)


def _post_step(optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if tracing():
        return
    caller = sys._getframe(1)
    inner = []  # steps opened inside this one that raised (the post-hook runs in its caller)
    step = _OPEN.get()
    while step is not None and step.caller is not caller:
        inner.append(step)
        step = step.outer
    if step is None:
        return  # began before the hooks were registered
    for failed in inner:
        failed.close((), {}, failed=True)
    _OPEN.set(step.outer)
    step.close(args[1:], kwargs, failed=False)


def _close_failed(step: _OpenStep | None, caller: FrameType) -> _OpenStep | None:
    """Close, as failed, the open steps whose torch frame has left the stack (a step that
    raised skips its post-hook); returns the innermost step still running."""
    if step is None:
        return None
    live = set()
    frame: FrameType | None = caller
    while frame is not None:
        live.add(id(frame))
        frame = frame.f_back
    while step is not None and id(step.caller) not in live:
        step.close((), {}, failed=True)
        step = step.outer
    return step


def start_step_hooks() -> Callable[[], None]:
    """Register the step hooks (and, the first time, the ``torch.optim`` FLOP rules); returns
    the function that removes them (and forgets the steps this context still holds open)."""
    global _RULES_REGISTERED
    if not _RULES_REGISTERED:
        register_torch_optimizer_rules()
        _RULES_REGISTERED = True
    handles = [register_optimizer_step_pre_hook(_pre_step),
               register_optimizer_step_post_hook(_post_step)]

    def stop() -> None:
        for handle in handles:
            handle.remove()
        _OPEN.set(None)

    return stop


def quiet_zero_grad(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (torch's ``Optimizer.zero_grad``) run with the profiles' function modes off
    the top of the calling thread's stack, pushed back after (:func:`~.ops.mode_off`): its
    ``.grad`` reads and writes are not operations of the model.

    Example:
        >>> import torch
        >>> from tracetorch.adapters.torch.ops import OpCountingMode
        >>> from tracetorch.engine.hotpath import OpCounter
        >>> seen = []
        >>> quiet = quiet_zero_grad(lambda opt: seen.append(torch._C._len_torch_function_stack()))
        >>> torch._C._push_on_torch_function_stack(OpCountingMode(OpCounter()))
        >>> quiet(None), seen, torch._C._len_torch_function_stack()
        (None, [0], 1)
        >>> _ = torch._C._pop_torch_function_stack()
    """
    def zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        if tracing():  # Dynamo sees torch's function, which it does not trace
            return original(self, *args, **kwargs)
        with mode_off():
            return original(self, *args, **kwargs)

    # Under a compiled function's frame callback Dynamo starts at torch's function, as outside.
    skip_frames(zero_grad.__code__)
    return functools.update_wrapper(zero_grad, original)
