"""Calling a ``torch.compile``\\ d module inside a block as outside it, and counting its FLOPs.

A compiled module (``OptimizedModule``) is one node, its layers unseen (see the package
docstring). Two things make its call differ from the eager calls around it:

* **Dynamo guards on the torch-function-mode stack.** Code compiled outside a block found the
  stack empty; the profile's :class:`~tracetorch.adapters.torch.ops.OpCountingMode` on top of it
  would fail that guard and recompile the model (and compile it again for outside, once the
  cache holds both). So the mode is off for the call: popped while it is the top, pushed back
  after.
* **Dynamo guards on the classes it traced.** A layer's ``forward`` read from its class
  (``type(self).__dict__["forward"]``, its closure) must be the function Dynamo saw when it
  compiled: the board's patches are suspended for the call (:meth:`~tracetorch.engine.patches.\
PatchBoard.suspended`), so the compiled code runs, and compiles, against the classes as they
  are outside a block. Layers that another thread calls meanwhile are not recorded.
* **Its operations run as a graph.** A ``TorchDispatchMode`` that lets Dynamo compile without it
  (``ignore_compile_internals``) is on instead: it sees what the compiled graph dispatches —
  the products of the eager and AOT backends, the ``mm``/``addmm``/convolution kernels inductor
  calls — and counts them with the formulas of ``torch.utils.flop_counter``, the forward's on
  the call's node. The autograd nodes between the call's outputs and its inputs (a compiled
  graph's ``CompiledFunctionBackward``; each operation's with the eager backend) run their
  backward with the same mode on: their products are the node's backward FLOPs, exactly what
  ``FlopCounterMode`` counts for an eager run of the same step. Elementwise operations are not
  counted there (``FlopCounterMode`` has no formula for them; inductor fuses them into kernels).

Example:
    >>> import torch, tracetorch
    >>> model = torch.compile(torch.nn.Linear(4, 2), backend="eager")
    >>> x = torch.ones(3, 4, requires_grad=True)
    >>> with tracetorch.profile() as prof:
    ...     model(x).sum().backward()
    >>> node = prof.find("")
    >>> node.flops, node.backward_flops        # 2·3·4·2; its input's and weight's gradients
    (48, 96)
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from tracetorch.adapters.torch.backward import collect_tensors
from tracetorch.adapters.torch.ops import mode_off
from tracetorch.engine.hotpath import Frame, OpCounter, current_frame
from tracetorch.engine.patches import PatchBoard

__all__ = ("DispatchedFlops", "compiled_call", "start_compiled_counting")

#: The counter and patch board of the open profiles (see :func:`start_compiled_counting`).
_COUNTER: list[tuple[OpCounter, PatchBoard]] = []
#: The function made for each original ``__call__``: the same one at each opening of a profile.
_CALLS: dict[Any, Callable[..., Any]] = {}


class DispatchedFlops(TorchDispatchMode):
    """Counts the FLOPs of the operations dispatched while it is on, with
    ``torch.utils.flop_counter``'s formulas; torch.compile compiles as if it were not there.

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
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            try:
                self.flops += int(formula(*args, **kwargs, out_val=out))
            except Exception:  # a formula that cannot read these arguments: left uncounted
                pass
        return out


def _count_backward(frame: Frame, counter: OpCounter, output: Any, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> None:
    # Each autograd node between the call's outputs and its inputs (a compiled graph's one
    # CompiledFunctionBackward, or each operation's with the eager backend) runs its backward
    # with the mode on.
    outputs: list[Any] = []
    collect_tensors(output, outputs)
    inputs: list[Any] = []
    collect_tensors((args, kwargs), inputs)
    stop = {t.grad_fn for t in inputs if t.grad_fn is not None}
    pending = [t.grad_fn for t in outputs if t.grad_fn is not None and t.grad_fn not in stop]
    seen = set(pending)
    mode = DispatchedFlops()

    def before(grad_outputs: Any) -> None:
        mode.__enter__()

    def after(grad_inputs: Any, grad_outputs: Any) -> None:
        mode.__exit__(None, None, None)
        if mode.flops:
            counter.backward_op(frame, "compiled", mode.flops, True, 0)
            mode.flops = 0

    while pending:
        fn = pending.pop()
        fn.register_prehook(before)
        fn.register_hook(after)
        for parent, _ in fn.next_functions:
            if parent is not None and parent not in seen and parent not in stop:
                seen.add(parent)
                pending.append(parent)


def compiled_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """``OptimizedModule.__call__`` as the profile wraps it: ``original`` called without the
    profile's function mode and with :class:`DispatchedFlops`, its FLOPs charged to the call.

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
        if frame is None or frame.owner is not module or not _COUNTER:
            return original(module, *args, **kwargs)
        counter, board = _COUNTER[-1]
        with mode_off(), board.suspended(), DispatchedFlops() as counted:
            output = original(module, *args, **kwargs)
        if counted.flops:
            counter.charge("compiled", counted.flops, True, 1)
            node = frame.node
            if node.flops_source == "none":
                node.flops_source = "ops"
        if torch.is_grad_enabled():
            _count_backward(frame, counter, output, args, kwargs)
        return output

    _CALLS[original] = __call__
    return __call__


def start_compiled_counting(counter: OpCounter, board: PatchBoard) -> Callable[[], None]:
    """Charge compiled calls' FLOPs to ``counter``, and suspend ``board``'s patches during
    them, until the returned cleanup runs.

    Example:
        >>> stop = start_compiled_counting(OpCounter(), PatchBoard())
        >>> stop()
    """
    entry = (counter, board)
    _COUNTER.append(entry)

    def stop() -> None:
        _COUNTER.remove(entry)

    return stop
