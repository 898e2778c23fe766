"""Forward FLOPs of elementwise maths, reductions, normalizations and losses: one convention for
torch's functions, torch's layers and ``tracetorch.core``.

Each elementary operation on one element is 1 FLOP; a function costs the operations it is made
of, per output element. Where ``tracetorch.core`` has the same operation, the number is core's
own (:mod:`tracetorch.flops.core_ops`, which its autograd reports), so a model costs the same in
both frameworks::

    per output element                                   FLOPs
    ---------------------------------------------------  --------------------------------------
    add sub mul div neg abs exp log sqrt rsqrt pow ...   1 (one elementary operation; also
    sin asin sinh atan2 fmin frac erfinv lgamma ...      their aliases: multiply, divide,
                                                         subtract, absolute, arctan...)
    addcmul addcdiv lerp xlogy                           2
    (a scalar factor folded in: add's and sub's alpha,   +1, unless it is 1 or -1 (a tensor
    addcmul's and addcdiv's value, lerp's weight)        weight always: FOLDED_FACTORS)
    logit (log(x / (1 - x))) / sinc (sin(πx) / πx)       3 / 3
    hypot / logaddexp, logaddexp2                        4 (two squares, add, root) / 4
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
    quantize_per_tensor, _per_channel / dequantize       5 (divide by the scale, add the zero
                                                         point, round, clamp at both ends) / 2
                                                         (subtract, multiply)
    fake_quantize_per_tensor_affine, _per_channel_       7 (both)
    fused_moving_avg_obs_fake_quant                      9 (its observer's min and max, both
                                                         taken as on)

    per input element
    ---------------------------------------------------  --------------------------------------
    sum mean amax amin max min argmax prod cumsum ...     1; aminmax 2
    norm (p = 2) / var, std, var_mean / logsumexp        2 / 3 / 4

    Comparisons, logical operations, sorting and selection (eq, lt, logical_and, sort, topk,
    median) count 0, as in torch.utils.flop_counter and fvcore.
    layer_norm group_norm instance_norm                  7 (mean 1, variance 2, normalize 2,
                                                         affine 2; core's norm_flops)
    batch_norm                                           7 in training, 4 with running stats
    rms_norm                                             3 (square, mean, scale), +1 with weight

    losses, per input element (the reduction's sum included; LOSS_PER_ELEMENT)
    ---------------------------------------------------  --------------------------------------
    mse_loss l1_loss                                     3 (difference, square or abs, sum)
    smooth_l1_loss / huber_loss                          7 / 8 (difference, abs, both branches:
                                                         square and scale, abs minus half of
                                                         beta (times delta); select, sum)
    binary_cross_entropy                                 11 (log x, log(1 - x), each clamped
                                                         at -100, 1 - x, 1 - y, two products,
                                                         add, negate, sum)
    binary_cross_entropy_with_logits                     10 ((1 - y)·x, |x|, negate, exp, log1p,
                                                         max(-x, 0), two adds, sum); +4 with
                                                         pos_weight ((p - 1)·y + 1, multiply)
    kl_div                                               4 (log target or exp, subtract,
                                                         multiply, sum)
    poisson_nll_loss                                     4 (exp(x) - y·x, sum); 5 without
                                                         log_input (x - y·log(x + eps)); +9
                                                         with full (Stirling's term, masked)
    gaussian_nll_loss                                    8 (clamp var, log, difference, square,
                                                         divide, add, halve, sum); +1 with full
    soft_margin_loss                                     6 (y·x, negate, softplus 3, sum)
    multilabel_soft_margin_loss                          15 (two logsigmoids 4 each, negate x,
                                                         1 - y, two products, add, negate,
                                                         sum)
    hinge_embedding_loss margin_ranking_loss             6 (margin - x, clamp, two selects, add,
                                                         sum / difference, times -y, add
                                                         margin, clamp, sum)
    multi_margin_loss                                    4 (margin - x[y] + x[i], clamp, sum);
                                                         +1 with p = 2; +1 per sample (mean)

    losses and distances by rows (criterion_flops; n input elements, R rows of D elements)
    ---------------------------------------------------  --------------------------------------
    cross_entropy / nll_loss                             5·n + R (core's) / R
    cosine_similarity                                    6·n (three dot products) + 4·R
                                                         (product of the norms, clamp, sqrt,
                                                         divide)
    pairwise_distance                                    4·n (difference, + eps, square, add)
                                                         + R (root)
    cosine_embedding_loss                                cosine_similarity + 5·R (1 - cos,
                                                         cos - margin, clamp, select, sum)
    triplet_margin_loss                                  2 pairwise distances (3 with swap)
                                                         + 4·R (difference, margin, clamp, sum)
    multilabel_margin_loss                               4·R·D² (every target slot against
                                                         every class: the target count is data)
                                                         + R
    ctc_loss                                             13·N·T·(2S + 1): per time step and
                                                         state of the blank-extended target, a
                                                         log-sum-exp of 3 predecessors (12) and
                                                         the log-probability's add; + N
    local_response_norm                                  (5 + size) per element (square, a sum
                                                         of size neighbours, scale, add k, pow,
                                                         divide)
    fold                                                 1 per input element (overlapping blocks
                                                         are summed)

A scalar factor an operation folds in is a multiply per element (``x.add(y, alpha=0.5)`` is 2,
``x.add(y)`` 1; ``x.lerp(y, 0.1)`` 3), the convention of the optimizer rules
(:mod:`tracetorch.flops.optimizers`), so a step counted by its operations costs what its rule
says.

Data movement (views, permutes, copies, indexing, concatenation: :data:`DATA_MOVEMENT`) costs 0;
a layer that runs nothing but it is known to cost 0, not unknown.

Example:
    >>> PER_ELEMENT["silu"], PER_ELEMENT["softmax"], PER_INPUT_ELEMENT["mean"]
    (5, 5, 1)
    >>> normalization_flops("batch_norm", 100, training=False, affine=True)
    400
"""
from __future__ import annotations

from collections.abc import Mapping
from math import ceil, prod
from typing import Any

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

__all__ = ("PER_ELEMENT", "FOLDED_FACTORS", "scalar_factor", "PER_INPUT_ELEMENT",
           "DATA_MOVEMENT", "NORMALIZATIONS",
           "LOSS_PER_ELEMENT", "CRITERIA", "normalization_flops", "loss_flops",
           "criterion_flops")

_ONE = 1  # one elementary operation per element
_SOFTPLUS = EXP.forward + ADD.forward + LOG.forward
#: Quantizing: divide by the scale, add the zero point, round, clamp at both ends; and back:
#: subtract the zero point, multiply by the scale.
_QUANTIZE, _DEQUANTIZE = 5, 2

#: FLOPs per output element of each elementwise function, by its torch name.
PER_ELEMENT: dict[str, int] = {
    **{name: _ONE for name in (
        "abs", "reciprocal", "exp2", "expm1", "log2", "log10", "log1p", "rsqrt", "square",
        "sin", "cos", "tan", "erf", "erfc", "floor", "ceil", "round", "trunc", "sign", "clamp",
        "clip", "maximum", "minimum", "fmod", "remainder", "floor_divide", "where",
        "masked_fill", "rsub", "true_divide",
        "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "atan2", "arcsin",
        "arccos", "arctan", "arcsinh", "arccosh", "arctanh", "arctan2", "frac", "fmin", "fmax",
        "clamp_min", "clamp_max", "sgn", "copysign", "nan_to_num", "deg2rad", "rad2deg",
        "float_power", "erfinv", "lgamma", "digamma", "i0", "heaviside", "nextafter", "ldexp",
        "absolute", "fix")},
    "add": ADD.forward, "sub": SUB.forward, "mul": MUL.forward, "div": DIV.forward,
    "subtract": SUB.forward, "multiply": MUL.forward, "divide": DIV.forward,
    "neg": NEG.forward, "negative": NEG.forward, "exp": EXP.forward, "log": LOG.forward,
    "sqrt": SQRT.forward, "pow": POW.forward,
    "addcmul": 2, "addcdiv": 2, "lerp": 2, "xlogy": 2, "logit": 3, "sinc": 3, "hypot": 4,
    "logaddexp": 4, "logaddexp2": 4,
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
    # quantizing, clamp(round(x / s + z)), and back, (q - z)·s; quantization-aware training's
    # fake quantization does both
    "quantize_per_tensor": _QUANTIZE, "quantize_per_channel": _QUANTIZE,
    "quantize_per_tensor_dynamic": _QUANTIZE, "dequantize": _DEQUANTIZE,
    **dict.fromkeys(("fake_quantize_per_tensor_affine", "fake_quantize_per_channel_affine",
                     "_fake_quantize_learnable_per_tensor_affine",
                     "_fake_quantize_learnable_per_channel_affine"), _QUANTIZE + _DEQUANTIZE),
    # its observer's running min and max as well (both on, as they are while training)
    "fused_moving_avg_obs_fake_quant": _QUANTIZE + _DEQUANTIZE + 2 * REDUCTION.forward,
}

#: The elementwise functions that fold a scalar factor into their arithmetic, by torch name:
#: where the factor is among the arguments (its position, counting the tensor called on, and
#: its keyword) and its default. See :func:`scalar_factor`.
FOLDED_FACTORS: dict[str, tuple[int, str, Any]] = {
    "add": (2, "alpha", 1), "sub": (2, "alpha", 1), "subtract": (2, "alpha", 1),
    "addcmul": (3, "value", 1), "addcdiv": (3, "value", 1), "lerp": (2, "weight", None),
}


def scalar_factor(value: Any) -> int:
    """The FLOPs per element of multiplying by a factor an operation folds in: 0 for 1 or -1
    (a copy or a negation of what is added), 1 otherwise (a tensor factor included).

    Example:
        >>> scalar_factor(1), scalar_factor(-1.0), scalar_factor(0.9)
        (0, 0, 1)
    """
    return 0 if type(value) in (int, float) and abs(value) == 1 else 1


#: FLOPs per input element of each reduction.
PER_INPUT_ELEMENT: dict[str, int] = {
    **{name: REDUCTION.forward for name in ("sum", "mean", "amax", "amin", "prod", "cumsum",
                                            "nansum", "nanmean", "max", "min", "argmax",
                                            "argmin", "cumprod", "cummax", "cummin")},
    "norm": 2, "var": 3, "std": 3, "var_mean": 3, "std_mean": 3, "logsumexp": 4,
    "logcumsumexp": 4, "aminmax": 2 * REDUCTION.forward,
}

#: Functions that only move or reinterpret data, by torch name: 0 FLOPs.
DATA_MOVEMENT = (
    "view", "view_as", "reshape", "reshape_as", "permute", "transpose", "t", "contiguous",
    "flatten", "unflatten", "unsqueeze", "squeeze", "expand", "expand_as", "narrow", "select",
    "split", "chunk", "unbind", "cat", "concat", "stack", "clone", "detach", "to", "type",
    "movedim", "swapaxes", "repeat", "repeat_interleave", "roll", "flip", "index_select",
    "gather", "embedding", "pad", "dropout", "__getitem__", "masked_select", "tril", "triu",
    "zeros_like", "ones_like", "full_like", "arange", "zeros", "ones", "full", "empty",
    # the functions of torch.nn's data-movement layers (Unfold, PixelShuffle, ChannelShuffle,
    # MaxUnpool, the channel and alpha dropouts)
    "unfold", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle", "native_channel_shuffle",
    "max_unpool1d", "max_unpool2d", "max_unpool3d", "dropout1d", "dropout2d", "dropout3d",
    "alpha_dropout", "feature_alpha_dropout", "one_hot")

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
    return LOSS_PER_ELEMENT[name] * logits_elements


#: FLOPs per input element of the elementwise losses, the reduction's sum included (options
#: add to some: see the module docstring and :func:`criterion_flops`).
LOSS_PER_ELEMENT: dict[str, int] = {
    "mse_loss": 3, "l1_loss": 3, "smooth_l1_loss": 7, "huber_loss": 8,
    "binary_cross_entropy": 11, "binary_cross_entropy_with_logits": 10, "kl_div": 4,
    "poisson_nll_loss": 4, "gaussian_nll_loss": 8, "soft_margin_loss": 6,
    "multilabel_soft_margin_loss": 15, "hinge_embedding_loss": 6, "margin_ranking_loss": 6,
    "multi_margin_loss": 4,
}


def _numel(value: Any) -> int:
    return prod(value.shape) if hasattr(value, "shape") else 0


def _rows(value: Any, dim: int = -1) -> tuple[int, int]:
    """(elements, rows) of ``value`` reduced along ``dim``."""
    shape = tuple(getattr(value, "shape", ()))
    if not shape:
        return 1, 1
    return prod(shape), prod(shape) // max(shape[dim], 1)


def _cosine(first: Any, second: Any, dim: int) -> int:
    elements = max(_numel(first), _numel(second))  # broadcast operands
    shape = first.shape if _numel(first) >= _numel(second) else second.shape
    width = shape[dim] if shape else 1
    return 6 * elements + 4 * (elements // max(width, 1))


def _distance(first: Any, second: Any) -> int:
    elements, rows = _rows(first if _numel(first) >= _numel(second) else second)
    return 4 * elements + rows


def _options(name: str, arguments: Mapping[str, Any]) -> int:
    """FLOPs per input element that an elementwise loss's options add."""
    if name == "binary_cross_entropy_with_logits":
        return 4 if arguments.get("pos_weight") is not None else 0
    if name == "poisson_nll_loss":
        return (0 if arguments.get("log_input", True) else 1) + (9 if arguments.get("full") else 0)
    if name == "gaussian_nll_loss":
        return 1 if arguments.get("full") else 0
    if name == "multi_margin_loss":
        return 1 if arguments.get("p", 1) == 2 else 0
    return 0


def _ctc(arguments: Mapping[str, Any]) -> int:
    log_probs, targets = arguments["log_probs"], arguments["targets"]
    shape, target_shape = tuple(log_probs.shape), tuple(targets.shape)
    steps, batch = shape[0], (shape[1] if len(shape) == 3 else 1)
    # Padded targets (N, S) give S; concatenated ones (sum of lengths,) their mean length.
    length = target_shape[-1] if len(target_shape) == 2 or len(shape) == 2 else ceil(
        _numel(targets) / max(batch, 1))
    return 13 * batch * steps * (2 * length + 1) + batch


def criterion_flops(name: str, arguments: Mapping[str, Any]) -> int:
    """FLOPs of a loss, distance or other function of :data:`CRITERIA` called with
    ``arguments`` by the names of its ``torch.nn.functional`` parameters (tensors are read for
    their ``shape`` only): the formulas of the module docstring.

    Example:
        >>> class T:
        ...     def __init__(self, *shape): self.shape = shape
        >>> criterion_flops("binary_cross_entropy", {"input": T(4, 5), "target": T(4, 5)})
        220
        >>> criterion_flops("cosine_similarity", {"x1": T(3, 8), "x2": T(3, 8)})
        156
    """
    if name in LOSS_PER_ELEMENT:
        first = arguments.get("input", arguments.get("input1"))
        return (LOSS_PER_ELEMENT[name] + _options(name, arguments)) * _numel(first) + (
            _rows(first)[1] if name == "multi_margin_loss" else 0)
    if name in ("cross_entropy", "nll_loss"):
        logits = arguments["input"]
        classes = logits.shape[1] if len(logits.shape) > 1 else logits.shape[0]
        return loss_flops(name, _numel(logits), classes)
    if name == "cosine_similarity":
        return _cosine(arguments["x1"], arguments["x2"], arguments.get("dim", 1))
    if name == "pairwise_distance":
        return _distance(arguments["x1"], arguments["x2"])
    if name == "cosine_embedding_loss":
        first = arguments["input1"]
        rows = _rows(first)[1]
        return _cosine(first, arguments["input2"], -1) + 5 * rows
    if name == "triplet_margin_loss":
        anchor = arguments["anchor"]
        distances = 3 if arguments.get("swap") else 2
        return distances * _distance(anchor, arguments["positive"]) + 4 * _rows(anchor)[1]
    if name == "multilabel_margin_loss":
        elements, rows = _rows(arguments["input"])
        return 4 * elements * (elements // max(rows, 1)) + rows
    if name == "ctc_loss":
        return _ctc(arguments)
    if name == "local_response_norm":
        return (5 + int(arguments["size"])) * _numel(arguments["input"])
    if name == "fold":
        return _numel(arguments["input"])
    raise KeyError(f"criterion_flops: no formula for {name!r}")


#: The functions :func:`criterion_flops` costs, by ``torch.nn.functional`` name.
CRITERIA = (*LOSS_PER_ELEMENT, "cross_entropy", "nll_loss", "cosine_similarity",
            "pairwise_distance", "cosine_embedding_loss", "triplet_margin_loss",
            "multilabel_margin_loss", "ctc_loss", "local_response_norm", "fold")
