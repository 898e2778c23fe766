"""Forward FLOPs of elementwise maths, reductions, normalizations and losses: one convention for
torch's functions, torch's layers and ``tracetorch.core``.

Each elementary operation on one element is 1 FLOP; a function costs the operations it is made
of, per output element. Where ``tracetorch.core`` has the same operation, the number is core's
own (:mod:`tracetorch.flops.core_ops`, which its autograd reports), so a model costs the same in
both frameworks::

    per output element                                   FLOPs
    ---------------------------------------------------  --------------------------------------
    add sub mul div neg abs exp log sqrt rsqrt pow ...   1 (one elementary operation)
    addcmul addcdiv lerp                                 2
    relu relu6 leaky_relu hardtanh threshold prelu ...   1 (compare and select)
    sigmoid                                              4 (negate, exp, add, divide)
    tanh                                                 1 (one library call, as core)
    gelu                                                 6 (core's x·sigmoid(1.702x))
    silu (x·sigmoid x)                                   5
    softplus log(1 + e^x) / mish x·tanh(softplus x)      3 / 5
    elu / selu, celu / hardsigmoid / hardswish           3 / 4 / 3 / 4
    logsigmoid / softsign / tanhshrink                   4 / 3 / 2
    glu (a·sigmoid b)                                    5
    softmax, log_softmax, softmin                        5 (max, subtract, exp, sum, divide)

    per input element
    ---------------------------------------------------  --------------------------------------
    sum mean amax amin prod cumsum                       1
    norm (p = 2) / var, std / logsumexp                  2 / 3 / 4
    layer_norm group_norm instance_norm                  7 (mean 1, variance 2, normalize 2,
                                                         affine 2; core's norm_flops)
    batch_norm                                           7 in training, 4 with running stats
    rms_norm                                             3 (square, mean, scale), +1 with weight

    losses: cross_entropy 5·N·C + N (core's), nll_loss N, mse_loss and l1_loss 3 per element

Data movement (views, permutes, copies, indexing, concatenation: :data:`DATA_MOVEMENT`) costs 0;
a layer that runs nothing but it is known to cost 0, not unknown.

Example:
    >>> PER_ELEMENT["silu"], PER_ELEMENT["softmax"], PER_INPUT_ELEMENT["mean"]
    (5, 5, 1)
    >>> normalization_flops("batch_norm", 100, training=False, affine=True)
    400
"""
from __future__ import annotations

from tracetorch.flops.core_ops import (
    ADD,
    DIV,
    EXP,
    GELU,
    LOG,
    LOG_SOFTMAX,
    MUL,
    NEG,
    POW,
    REDUCTION,
    RELU,
    SIGMOID,
    SOFTMAX,
    SQRT,
    SUB,
    TANH,
    cross_entropy_flops,
    norm_flops,
)

__all__ = ("PER_ELEMENT", "PER_INPUT_ELEMENT", "DATA_MOVEMENT", "NORMALIZATIONS",
           "normalization_flops", "loss_flops")

_ONE = 1  # one elementary operation per element
_SOFTPLUS = EXP.forward + ADD.forward + LOG.forward

#: FLOPs per output element of each elementwise function, by its torch name.
PER_ELEMENT: dict[str, int] = {
    **{name: _ONE for name in (
        "abs", "reciprocal", "exp2", "expm1", "log2", "log10", "log1p", "rsqrt", "square",
        "sin", "cos", "tan", "erf", "erfc", "floor", "ceil", "round", "trunc", "sign", "clamp",
        "clip", "maximum", "minimum", "fmod", "remainder", "floor_divide", "where",
        "masked_fill", "rsub", "true_divide")},
    "add": ADD.forward, "sub": SUB.forward, "mul": MUL.forward, "div": DIV.forward,
    "neg": NEG.forward, "exp": EXP.forward, "log": LOG.forward, "sqrt": SQRT.forward,
    "pow": POW.forward,
    "addcmul": 2, "addcdiv": 2, "lerp": 2,
    **{name: RELU.forward for name in (
        "relu", "relu6", "leaky_relu", "hardtanh", "threshold", "hardshrink", "softshrink",
        "prelu", "rrelu")},
    "sigmoid": SIGMOID.forward, "tanh": TANH.forward, "gelu": GELU.forward,
    "silu": SIGMOID.forward + MUL.forward,
    "softplus": _SOFTPLUS, "mish": _SOFTPLUS + TANH.forward + MUL.forward,
    "elu": 3, "selu": 4, "celu": 4, "hardsigmoid": 3, "hardswish": 4,
    "logsigmoid": _SOFTPLUS + NEG.forward, "softsign": 3, "tanhshrink": 2,
    "glu": SIGMOID.forward + MUL.forward,
    "softmax": SOFTMAX.forward, "log_softmax": LOG_SOFTMAX.forward, "softmin": SOFTMAX.forward,
}

#: FLOPs per input element of each reduction.
PER_INPUT_ELEMENT: dict[str, int] = {
    **{name: REDUCTION.forward for name in ("sum", "mean", "amax", "amin", "prod", "cumsum",
                                            "nansum", "nanmean")},
    "norm": 2, "var": 3, "std": 3, "logsumexp": 4,
}

#: Functions that only move or reinterpret data, by torch name: 0 FLOPs.
DATA_MOVEMENT = (
    "view", "view_as", "reshape", "reshape_as", "permute", "transpose", "t", "contiguous",
    "flatten", "unflatten", "unsqueeze", "squeeze", "expand", "expand_as", "narrow", "select",
    "split", "chunk", "unbind", "cat", "concat", "stack", "clone", "detach", "to", "type",
    "movedim", "swapaxes", "repeat", "repeat_interleave", "roll", "flip", "index_select",
    "gather", "embedding", "pad", "dropout", "__getitem__", "masked_select", "tril", "triu",
    "zeros_like", "ones_like", "full_like", "arange", "zeros", "ones", "full", "empty")

#: The normalizations :func:`normalization_flops` knows, by torch name.
NORMALIZATIONS = ("layer_norm", "group_norm", "instance_norm", "batch_norm", "rms_norm")


def normalization_flops(name: str, elements: int, *, training: bool = True,
                        affine: bool = True) -> int:
    """FLOPs of a normalization over ``elements`` input elements (see the module docstring):
    core's :func:`~tracetorch.flops.core_ops.norm_flops` for the statistics-computing ones,
    with fixed statistics for ``batch_norm`` outside training.

    Example:
        >>> normalization_flops("layer_norm", 10), normalization_flops("rms_norm", 10)
        (70, 40)
    """
    if name == "rms_norm":
        return elements * (3 + int(affine))
    return norm_flops(elements, batch_stats=training or name != "batch_norm")


def loss_flops(name: str, logits_elements: int, classes: int) -> int:
    """FLOPs of a loss on ``logits_elements`` input elements (``classes`` of them per row for
    the classification losses).

    Example:
        >>> loss_flops("cross_entropy", 4 * 10, 10), loss_flops("mse_loss", 12, 1)
        (204, 36)
    """
    if name == "cross_entropy":
        return cross_entropy_flops(logits_elements // max(classes, 1), classes)
    if name == "nll_loss":
        return logits_elements // max(classes, 1)
    return 3 * logits_elements  # mse_loss, l1_loss: difference, square or abs, sum
