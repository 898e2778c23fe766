"""Closed-form FLOP and parameter formulas for single layers, from shapes alone.

These are the TinyTorch profiler's hand formulas, kept for its API: GEMM/convolution FLOPs only
(2 FLOPs per multiply-add; bias adds are not counted) and always for the whole batch. For a
count of everything a model executes, use :func:`tracetorch.flop_count.count_flops`.

Example:
    >>> class Linear:
    ...     in_features, out_features = 1024, 512
    >>> linear_flops(Linear(), (1, 1024))
    1048576
"""
from __future__ import annotations

import math
from typing import Any, Sequence, Tuple

from tracetorch.params import numel
from tracetorch.flop_count import check_shape

__all__ = ("layer_parameter_count", "linear_flops", "linear_output_shape", "conv2d_flops",
           "conv2d_output_shape")


def layer_parameter_count(layer: Any) -> int:
    """Elements of ``layer.weight`` plus elements of ``layer.bias``, each counted if present.

    Example:
        >>> import numpy as np
        >>> class Layer:
        ...     weight, bias = np.zeros((10, 5)), np.zeros(5)
        >>> layer_parameter_count(Layer())
        55
    """
    return sum(numel(t) for t in (getattr(layer, "weight", None), getattr(layer, "bias", None))
               if t is not None)


def linear_flops(model: Any, input_shape: Sequence[int]) -> int:
    """``2 * in * out * rows``, where ``rows`` is the product of every leading dimension.

    ``in`` is the input's last dimension; ``out`` is ``model.out_features``, else the second
    axis of ``model.weight`` (TinyTorch stores weights as (in, out)), else 1 as in TinyTorch.

    Example:
        >>> class Linear:
        ...     out_features = 3
        >>> linear_flops(Linear(), (7, 5, 4))   # 35 rows x 2 x 4 x 3
        840
    """
    shape = check_shape(input_shape)
    return 2 * shape[-1] * _out_features(model) * math.prod(shape[:-1])


def linear_output_shape(model: Any, input_shape: Sequence[int]) -> Tuple[int, ...]:
    """The input shape with its last dimension replaced by the layer's output features.

    Example:
        >>> class Linear:
        ...     out_features = 3
        >>> linear_output_shape(Linear(), (7, 5, 4))
        (7, 5, 3)
    """
    return check_shape(input_shape)[:-1] + (_out_features(model),)


def _out_features(model: Any) -> int:
    out = getattr(model, "out_features", None)
    if isinstance(out, int):
        return out
    weight = getattr(model, "weight", None)
    if weight is not None and len(getattr(weight, "shape", ())) == 2:
        return int(weight.shape[1])
    return 1


def conv2d_flops(model: Any, input_shape: Sequence[int]) -> int:
    """``2 * kh * kw * (in / groups) * out * oh * ow * batch`` for a 2-D convolution.

    ``input_shape`` is (N, C, H, W), or (C, H, W) for one unbatched image. ``kernel_size``,
    ``stride``, ``padding`` and ``dilation`` may each be an int or a pair; ``padding`` may also
    be ``"valid"`` or ``"same"`` (as torch allows). Returns 0 for a model without
    ``kernel_size``, ``in_channels`` and ``out_channels``, as TinyTorch does.

    Raises:
        ValueError: ``input_shape`` is not 3-D or 4-D, or too small for the kernel.

    Example:
        >>> class Conv:
        ...     in_channels, out_channels, kernel_size = 3, 16, 3
        >>> conv2d_flops(Conv(), (1, 3, 32, 32))   # 30 x 30 outputs x 2 x 9 x 3 x 16
        777600
    """
    if not all(hasattr(model, a) for a in ("kernel_size", "in_channels", "out_channels")):
        return 0
    shape = check_shape(input_shape)
    batch = shape[0] if len(shape) == 4 else 1
    kh, kw = _pair(model.kernel_size)
    _, _, oh, ow = _conv_geometry(model, shape)
    groups = getattr(model, "groups", 1) or 1
    return 2 * kh * kw * (model.in_channels // groups) * model.out_channels * oh * ow * batch


def conv2d_output_shape(model: Any, input_shape: Sequence[int]) -> Tuple[int, ...]:
    """The output shape of a 2-D convolution: (N, out_channels, oh, ow), or unbatched (C, oh, ow).

    Example:
        >>> class Conv:
        ...     in_channels, out_channels, kernel_size, stride, padding = 3, 64, 7, 2, 3
        >>> conv2d_output_shape(Conv(), (8, 3, 224, 224))
        (8, 64, 112, 112)
    """
    shape = check_shape(input_shape)
    batch, channels, oh, ow = _conv_geometry(model, shape)
    return (batch, channels, oh, ow) if len(shape) == 4 else (channels, oh, ow)


def _conv_geometry(model: Any, shape: Tuple[int, ...]) -> Tuple[int, int, int, int]:
    if len(shape) not in (3, 4):
        raise ValueError(f"input_shape: expected (N, C, H, W) or (C, H, W), got {shape}")
    kernel = _pair(model.kernel_size)
    stride = _pair(getattr(model, "stride", 1))
    dilation = _pair(getattr(model, "dilation", 1))
    padding = getattr(model, "padding", 0)
    out = []
    for axis in range(2):
        size = shape[-2 + axis]
        if padding == "same":
            out.append(size)
            continue
        pad = 0 if padding == "valid" else _pair(padding)[axis]
        span = dilation[axis] * (kernel[axis] - 1) + 1
        out.append((size + 2 * pad - span) // stride[axis] + 1)
    if min(out) <= 0:
        raise ValueError(f"input_shape: {shape} is smaller than the kernel {kernel} "
                         "(after padding)")
    return (shape[0] if len(shape) == 4 else 1), int(model.out_channels), out[0], out[1]


def _pair(value: Any) -> Tuple[int, int]:
    if isinstance(value, (tuple, list)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)
