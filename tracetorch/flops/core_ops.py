"""FLOP costs of the tensor operations of :mod:`tracetorch.core`, forward and backward.

This is the one home of these formulas: each core op reports its cost from here (to the op
observer of :mod:`tracetorch.core.autograd`), the core layer rules
(:mod:`tracetorch.flops.core_rules`) and the TinyTorch facade's static estimates
(:mod:`tracetorch.compat.tinytorch.analytic`) are built from the same functions, so a layer costs
the same whichever of them counts it.

Conventions (exact; ``n`` = elements of the op's output, ``N_in`` = elements of its input, "per
grad input" = counted once for each input that requires grad, ``R`` = broadcast-reduction adds
= ``n - input.size`` for every grad input that was broadcast, i.e. summing ``n`` gradient values
down to the input's size costs one add per value removed)::

    op name          forward                  gemm  backward
    ---------------  -----------------------  ----  ----------------------------------------
    add, sub         1*n                      no    1*n per grad input + R
    mul, div         1*n                      no    2*n per grad input + R
    neg              1*n                      no    1*n
    pow (scalar p)   1*n                      no    3*n
    exp, log         1*n                      no    1*n
    sqrt             1*n                      no    2*n
    masked_fill      1*n                      no    1*n + R
    relu             1*n                      no    1*n
    sigmoid          4*n  (neg, exp, add, div) no   3*n
    tanh             1*n                      no    3*n
    gelu             6*n  (x*sigmoid(1.702x))  no   6*n
    softmax          5*n  (max,sub,exp,sum,div) no  4*n
    log_softmax      5*n                      no    4*n
    sum, mean, max   N_in                     no    N_in
    reshape, transpose, permute  0            no    0
    getitem          0                        no    n  (scatter-add into the input's shape)
    embedding        0                        no    n  (scatter-add into the weight rows)
    matmul           2*B*m*k*n_cols           yes   2*B*m*k*n_cols per grad input + R
    conv2d           2*kh*kw*Cin*Cout*OH*OW*N yes   2*kh*kw*Cin*Cout*OH*OW*N for the weight
                                                    grad + the same for the input grad
    max_pool2d       kh*kw*n                  no    1*n
    avg_pool2d       kh*kw*n                  no    kh*kw*n
    layer_norm       7*N_in                   no    8*N_in (input) + 2*N_in (weight) + 1*N_in (bias)
    batch_norm train 7*N_in                   no    8*N_in (input) + 2*N_in (weight) + 1*N_in (bias)
    batch_norm eval  4*N_in                   no    2*N_in (input) + 2*N_in (weight) + 1*N_in (bias)
    cross_entropy    5*N*C + N                no    3*N*C

(matmul: ``B`` = product of the broadcast batch dims, (m, k) @ (k, n_cols); for 1-D operands
m or n_cols is 1; ``R`` only arises when a batch dimension was broadcast.  conv2d: the bias
add, the bias gradient and the sum of per-image weight gradients are not counted; the bias
is fused into the op.  Norms: the per-row/per-channel ``1/sqrt(var + eps)`` is not counted;
weight/bias terms only apply when they exist and require grad.  Optimizer updates work on
raw arrays and are not tensor ops, so they are not reported.)

The per-element costs are :class:`OpCost` constants, which an op multiplies by its element count
(no call: they sit on the path of every core op); shaped costs are plain functions of numbers
the op already has, each called once per op.

Example:
    >>> SIGMOID.forward * 10, SIGMOID.backward * 10
    (40, 30)
    >>> gemm_flops(4 * 3, 5)          # (4, 5) @ (5, 3)
    120
    >>> gemm_backward_flops(120, grads=2)
    240
"""
from __future__ import annotations

import math

__all__ = (
    "OpCost", "ADD", "SUB", "MUL", "DIV", "NEG", "POW", "EXP", "LOG", "SQRT", "MASKED_FILL",
    "RELU", "SIGMOID", "TANH", "GELU", "SOFTMAX", "LOG_SOFTMAX", "REDUCTION", "VIEW", "GATHER",
    "broadcast_adds", "grad_input_flops", "binary_backward_flops",
    "gemm_flops", "linear_flops", "conv2d_flops", "gemm_backward_flops",
    "pool2d_flops", "max_pool2d_backward_flops",
    "norm_flops", "norm_backward_flops", "cross_entropy_flops", "cross_entropy_backward_flops",
)


class OpCost:
    """FLOPs per element of an elementwise op (read-only by convention).

    ``forward`` is per output element; ``backward`` per output element for each input that
    requires grad (reductions: per input element, both ways). A plain slotted class: reading a
    slot costs a third of a NamedTuple field, and every core op reads one.

    Example:
        >>> OpCost(4, 3)
        OpCost(forward=4, backward=3)
    """

    __slots__ = ("forward", "backward")

    def __init__(self, forward: int, backward: int) -> None:
        self.forward = forward
        self.backward = backward

    def __repr__(self) -> str:
        return f"OpCost(forward={self.forward}, backward={self.backward})"


ADD = OpCost(1, 1)
SUB = OpCost(1, 1)
MUL = OpCost(1, 2)
DIV = OpCost(1, 2)
NEG = OpCost(1, 1)
POW = OpCost(1, 3)
EXP = OpCost(1, 1)
LOG = OpCost(1, 1)
SQRT = OpCost(1, 2)
MASKED_FILL = OpCost(1, 1)
RELU = OpCost(1, 1)
#: neg, exp, add, divide forward; ``g * s * (1 - s)`` backward.
SIGMOID = OpCost(4, 3)
#: One library call per element forward; ``g * (1 - t * t)`` backward.
TANH = OpCost(1, 3)
#: ``x * sigmoid(1.702 x)`` (TinyTorch's approximation): a scale, a multiply and the sigmoid.
GELU = OpCost(6, 6)
#: max, subtract, exp, sum, divide forward.
SOFTMAX = OpCost(5, 4)
LOG_SOFTMAX = OpCost(5, 4)
#: sum, mean, max: per *input* element, forward and backward.
REDUCTION = OpCost(1, 1)
#: reshape, transpose, permute: data movement only.
VIEW = OpCost(0, 0)
#: getitem, embedding: a free gather forward, a scatter-add of the gradient backward.
GATHER = OpCost(0, 1)


def broadcast_adds(n: int, in_shape: tuple[int, ...]) -> int:
    """Adds that sum ``n`` gradient values down to ``in_shape`` (undoing a broadcast).

    Example:
        >>> broadcast_adds(12, (1, 3))      # a (4, 3) gradient summed to a (1, 3) bias
        9
    """
    return n - math.prod(in_shape)


def grad_input_flops(per_element: int, n: int, in_shape: tuple[int, ...]) -> int:
    """Backward FLOPs for one input that requires grad: ``per_element`` per output element, plus
    the :func:`broadcast_adds` when that input was broadcast.

    Example:
        >>> grad_input_flops(MASKED_FILL.backward, 12, (4, 3))
        12
    """
    # broadcast_adds written out: this runs for every recorded binary op, and a call costs more
    # than the arithmetic.
    return (per_element + 1) * n - math.prod(in_shape)


def binary_backward_flops(per_element: int, n: int, a_grad: bool, a_shape: tuple[int, ...],
                          b_grad: bool, b_shape: tuple[int, ...]) -> int:
    """Backward FLOPs of a broadcasting binary op: :func:`grad_input_flops` for each input that
    requires grad.

    Example:
        >>> binary_backward_flops(ADD.backward, 12, True, (4, 3), True, (3,))
        33
    """
    flops = grad_input_flops(per_element, n, a_shape) if a_grad else 0
    if b_grad:
        flops += grad_input_flops(per_element, n, b_shape)
    return flops


def gemm_flops(outputs: int, inner: int) -> int:
    """2 FLOPs per multiply-add: each of ``outputs`` results sums ``inner`` products.

    Example:
        >>> gemm_flops(2 * 7 * 3, 5)      # (2, 7, 5) @ (5, 3)
        420
    """
    return 2 * outputs * inner


def linear_flops(rows: int, in_features: int, out_features: int) -> int:
    """``2 * rows * in * out``: a (rows, in) @ (in, out) product, bias add not counted.

    Example:
        >>> linear_flops(1, 1024, 512)
        1048576
    """
    return gemm_flops(rows * out_features, in_features)


def conv2d_flops(outputs: int, in_channels: int, kh: int, kw: int) -> int:
    """``2 * kh * kw * Cin`` per output element (N·Cout·OH·OW of them), bias add not counted.

    ``in_channels`` are those each output sees (``Cin / groups`` for a grouped convolution).

    Example:
        >>> conv2d_flops(1 * 16 * 30 * 30, 3, 3, 3)
        777600
    """
    return gemm_flops(outputs, in_channels * kh * kw)


def gemm_backward_flops(forward: int, grads: int, adds: int = 0) -> int:
    """Backward of a matrix product or convolution: one product of the forward's size for each
    of ``grads`` inputs that require grad, plus ``adds`` broadcast-reduction adds.

    Example:
        >>> gemm_backward_flops(420, grads=1, adds=15)
        435
    """
    return forward * grads + adds


def pool2d_flops(window: int, outputs: int) -> int:
    """Pooling forward (and average-pooling backward): each of ``window`` elements of every
    output's window compared (max) or added (average) once.

    Example:
        >>> pool2d_flops(2 * 2, 2 * 3 * 4 * 4)
        384
    """
    return window * outputs


def max_pool2d_backward_flops(outputs: int) -> int:
    """Max-pooling backward: one gradient value routed per output element.

    Example:
        >>> max_pool2d_backward_flops(96)
        96
    """
    return outputs


def norm_flops(n: int, batch_stats: bool = True) -> int:
    """Normalization forward over ``n`` input elements: mean 1, variance 2, normalize 2, affine 2
    with batch statistics; 4 with fixed (running) statistics.

    Example:
        >>> norm_flops(100), norm_flops(100, batch_stats=False)
        (700, 400)
    """
    return (7 if batch_stats else 4) * n


def norm_backward_flops(n: int, batch_stats: bool, x_grad: bool, weight_grad: bool,
                        bias_grad: bool) -> int:
    """Normalization backward: 8 per element for the input (2 with fixed statistics), 2 for the
    weight, 1 for the bias, each only when it requires grad.

    Example:
        >>> norm_backward_flops(100, True, True, True, True)
        1100
    """
    flops = ((8 if batch_stats else 2) * n) if x_grad else 0
    return flops + (2 * n if weight_grad else 0) + (n if bias_grad else 0)


def cross_entropy_flops(rows: int, classes: int) -> int:
    """Log-softmax over every logit, then one pick-and-accumulate per row.

    Example:
        >>> cross_entropy_flops(4, 10)
        204
    """
    return LOG_SOFTMAX.forward * rows * classes + rows


def cross_entropy_backward_flops(rows: int, classes: int) -> int:
    """``exp(logp)``, the target subtraction and the scale: 3 per logit.

    Example:
        >>> cross_entropy_backward_flops(4, 10)
        120
    """
    return 3 * rows * classes
