"""Reverse-mode autograd engine and the op-observer hook the profiler relies on.

Every tensor operation in :mod:`tracetorch.core` computes its forward result with numpy,
reports it to the op observer (when one is installed), and -- when an input requires a
gradient and grad mode is on -- records a :class:`Node` holding a backward closure.
:func:`run_backward` walks those nodes in reverse topological order.

Observer contract (used by the tracetorch profiler engine)::

    class MyObserver:
        def forward_op(self, name, flops, gemm):            # after each op's forward
            return tag                                       # stored on the graph node
        def backward_op(self, tag, name, flops, gemm, elapsed_ns):  # after each node's backward
            ...
        def backward_clock(self, tag):                       # optional
            return clock                                     # integer-ns clock for that node

    prev = set_op_observer(MyObserver())   # returns the previous observer (or None)
    ...
    set_op_observer(prev)

With no observer installed an op pays exactly one ``_observer is not None`` check.
``forward_op`` is called in inference too (no grad), because the profiler attributes
op FLOPs to the innermost layer that ran them.  ``backward_op`` is called once per graph
node processed by ``backward()``; ``elapsed_ns`` is the duration of that node's backward
closure (which includes its broadcast reductions), read from the clock the observer's
``backward_clock(tag)`` returns -- so a profiler's injected clock, or its "no timing" clock
that always reads 0, governs backward times too -- or from ``time.perf_counter_ns`` for an
observer without ``backward_clock``.

FLOPs: each op's forward and backward cost, and the conventions behind them (2 FLOPs per
multiply-add, broadcast-reduction adds, what fused ops leave out), are in
:mod:`tracetorch.flops.core_ops`, the one home of those formulas.

Gradient storage: ``.grad`` of a leaf tensor is a ``Tensor`` (``requires_grad=False``) whose
``.data`` is a fresh ndarray of the leaf's dtype; gradients accumulate across backward calls
(``grad = grad + new``, never in place) until ``zero_grad()`` sets ``.grad`` to ``None``.
Non-leaf tensors get ``.grad`` only after ``retain_grad()``.  The graph is kept after
``backward()`` so it may be called again (grads add up).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .tensor import Tensor

__all__ = (
    "OpObserver",
    "TimedOpObserver",
    "set_op_observer",
    "get_op_observer",
    "no_grad",
    "enable_grad",
    "is_grad_enabled",
    "Node",
    "unbroadcast",
    "run_backward",
)


class OpObserver(Protocol):
    """What the profiler installs with :func:`set_op_observer`.

    An observer may also have ``backward_clock(tag)`` (see :class:`TimedOpObserver`); without
    it, backward times are read from ``time.perf_counter_ns``.

    Example::

        class Count:
            def __init__(self): self.flops = 0
            def forward_op(self, name, flops, gemm): self.flops += flops
            def backward_op(self, tag, name, flops, gemm, elapsed_ns): pass
    """

    # The tag is opaque to the core (Any): an observer chooses what it returns and gets back.
    def forward_op(self, name: str, flops: int, gemm: bool) -> Any: ...

    def backward_op(
        self, tag: Any, name: str, flops: int, gemm: bool, elapsed_ns: int
    ) -> None: ...


class TimedOpObserver(OpObserver, Protocol):
    """An observer that also chooses the clock timing each graph node's backward closure.

    ``backward_clock(tag)`` gets the tag ``forward_op`` returned for the node's op and returns
    an integer-nanosecond clock; ``elapsed_ns`` of that node is the difference of two readings.

    Example:

        >>> class Ticks:
        ...     now = 0
        ...     def forward_op(self, name, flops, gemm):
        ...         return name
        ...     def backward_op(self, tag, name, flops, gemm, elapsed_ns):
        ...         print(tag, elapsed_ns)
        ...     def backward_clock(self, tag):
        ...         return self.tick
        ...     def tick(self):
        ...         self.now += 1000
        ...         return self.now
        >>> prev = set_op_observer(Ticks())
        >>> (Tensor([1.0, 2.0], requires_grad=True) * 3.0).sum().backward()
        sum 1000
        mul 1000
        >>> _ = set_op_observer(prev)
    """

    def backward_clock(self, tag: Any) -> Callable[[], int]: ...


# Read by every op as ``_ag._observer`` (module attribute, so swapping it takes effect at once).
_observer: OpObserver | None = None
# Global grad mode; a plain flag (not thread-local) so that checking it costs one lookup.
_grad_enabled: bool = True


def set_op_observer(observer: OpObserver | None) -> OpObserver | None:
    """Install ``observer`` (or ``None`` to remove it) and return the previous one.

    Example:

        >>> class Printer:
        ...     def forward_op(self, name, flops, gemm):
        ...         print(name, flops, gemm)
        ...     def backward_op(self, tag, name, flops, gemm, elapsed_ns):
        ...         print("backward", name, flops)
        >>> prev = set_op_observer(Printer())
        >>> w = Tensor(np.ones((3, 2)), requires_grad=True)
        >>> y = Tensor(np.ones((4, 3))) @ w
        matmul 48 True
        >>> y.backward(np.ones((4, 2)))
        backward matmul 48
        >>> set_op_observer(prev) is not None
        True
    """
    global _observer
    previous = _observer
    _observer = observer
    return previous


def get_op_observer() -> OpObserver | None:
    """Return the installed op observer, or ``None``."""
    return _observer


def is_grad_enabled() -> bool:
    """True when ops record graph nodes for backward."""
    return _grad_enabled


@contextmanager
def _grad_mode(enabled: bool) -> Iterator[None]:
    global _grad_enabled
    previous = _grad_enabled
    _grad_enabled = enabled
    try:
        yield
    finally:
        _grad_enabled = previous


def no_grad() -> AbstractContextManager[None]:
    """Context manager that stops ops from building a graph (inference is cheaper).

    Example:

        >>> w = Tensor([1.0], requires_grad=True)
        >>> with no_grad():
        ...     y = w * 2.0
        >>> y.requires_grad
        False
    """
    return _grad_mode(False)


def enable_grad() -> AbstractContextManager[None]:
    """Context manager that turns graph building back on (e.g. inside ``no_grad``)."""
    return _grad_mode(True)


class Node:
    """One recorded op: its inputs, backward closure, and what to tell the observer.

    ``backward(grad_out)`` returns one gradient (or ``None``) per entry of ``parents``;
    a parent is ``None`` for a constant (non-Tensor) operand.
    """

    __slots__ = ("parents", "backward", "name", "tag", "gemm", "flops")

    def __init__(
        self,
        parents: Sequence[Tensor | None],
        backward: Callable[[np.ndarray], Sequence[np.ndarray | None]],
        name: str,
        tag: object,
        gemm: bool,
        flops: int,
    ) -> None:
        self.parents = parents
        self.backward = backward
        self.name = name
        self.tag = tag
        self.gemm = gemm
        self.flops = flops

    def __repr__(self) -> str:
        return f"<Node {self.name} flops={self.flops}>"


def unbroadcast(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``grad`` down to ``shape`` (undo numpy broadcasting).

    It costs ``grad.size - prod(shape)`` adds (:func:`tracetorch.flops.core_ops.broadcast_adds`).
    """
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    # A full reduction yields a numpy scalar; keep the engine working with arrays.
    return grad if isinstance(grad, np.ndarray) else np.asarray(grad)


def _topological_order(root: Tensor) -> list:
    """Tensors reachable from ``root`` through grad-requiring inputs, inputs first."""
    order: list = []
    seen = {id(root)}
    stack = [(root, 0)]
    while stack:
        tensor, index = stack[-1]
        node = tensor._grad_fn
        parents = node.parents if node is not None else ()
        while index < len(parents):
            parent = parents[index]
            index += 1
            if parent is not None and parent.requires_grad and id(parent) not in seen:
                seen.add(id(parent))
                stack[-1] = (tensor, index)
                stack.append((parent, 0))
                break
        else:
            stack.pop()
            order.append(tensor)
    return order


def run_backward(root: Tensor, grad: np.ndarray) -> None:
    """Back-propagate ``grad`` (already shaped like ``root``) into every reachable leaf."""
    from .tensor import Tensor  # local: tensor.py imports this module

    observer = _observer
    # Looked up once per pass: the profiler's clock (injected, or zero with timing off) must
    # time backward work as it times forward calls.
    clock_for = getattr(observer, "backward_clock", None)
    order = _topological_order(root)
    grads: dict = {id(root): grad}
    # Arrays already stored in some .grad: a second owner must get a copy, because add and
    # reshape pass the same array on to several inputs.
    handed_out: set = set()
    for tensor in reversed(order):
        g = grads.pop(id(tensor), None)
        if g is None:
            continue
        node = tensor._grad_fn
        if node is None or tensor._retains_grad:
            _store_grad(tensor, g, handed_out, Tensor)
        if node is None:
            continue
        if observer is not None:
            clock = time.perf_counter_ns if clock_for is None else clock_for(node.tag)
            start = clock()
            input_grads = node.backward(g)
            elapsed = clock() - start
            observer.backward_op(node.tag, node.name, node.flops, node.gemm, elapsed)
        else:
            input_grads = node.backward(g)
        for parent, pg in zip(node.parents, input_grads):
            if pg is None or parent is None or not parent.requires_grad:
                continue
            key = id(parent)
            previous = grads.get(key)
            grads[key] = pg if previous is None else previous + pg


def _store_grad(tensor: Tensor, g: np.ndarray, handed_out: set, tensor_cls: type[Tensor]) -> None:
    dtype = tensor.data.dtype
    if g.dtype != dtype:
        g = g.astype(dtype)
    elif not g.flags.writeable or id(g) in handed_out:
        g = g.copy()
    if g.shape != tensor.data.shape:  # e.g. a 0-d gradient for a (1,) leaf
        g = np.broadcast_to(g, tensor.data.shape).copy()
    handed_out.add(id(g))
    current = tensor.grad
    if current is None:
        tensor.grad = tensor_cls._wrap(g)
    elif isinstance(current, tensor_cls):
        current.data = current.data + g
    else:  # a user stored a raw array in .grad; keep working with it
        tensor.grad = tensor_cls._wrap(np.asarray(current) + g)
