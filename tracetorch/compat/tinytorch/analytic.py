"""The TinyTorch facade's static estimates: FLOPs and parameters of layers from shapes.

These are the TinyTorch profiler's hand formulas, kept for its API: GEMM/convolution FLOPs only
(2 FLOPs per multiply-add; bias adds are not counted) and always for the whole batch. The
formulas themselves are those of :mod:`tracetorch.flops.core_ops`; here they get their numbers
from a layer's attributes and an input shape. :func:`flops_and_output_shape` walks a layer list
with them. For a count of everything a model executes, use
:func:`tracetorch.tools.flop_count.count_flops`.

Example:
    >>> class Linear:
    ...     in_features, out_features = 1024, 512
    >>> linear_layer_flops(Linear(), (1, 1024))
    1048576
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tracetorch.core import Conv2d, Linear, Sequential
from tracetorch.flops.core_ops import conv2d_flops, linear_flops
from tracetorch.models.introspect import is_layer
from tracetorch.models.tensors import check_shape, dummy_input, numel
from tracetorch.tools.flop_count import forward_flops_and_output

__all__ = ("layer_parameter_count", "linear_layer_flops", "linear_output_shape",
           "conv2d_layer_flops", "conv2d_output_shape", "flops_and_output_shape", "walk_layers")

Shape = tuple[int, ...]


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


def linear_layer_flops(model: Any, input_shape: Sequence[int]) -> int:
    """``2 * in * out * rows``, where ``rows`` is the product of every leading dimension.

    ``in`` is the input's last dimension; ``out`` is ``model.out_features``, else the second
    axis of ``model.weight`` (TinyTorch stores weights as (in, out)), else 1 as in TinyTorch.

    Example:
        >>> class Linear:
        ...     out_features = 3
        >>> linear_layer_flops(Linear(), (7, 5, 4))   # 35 rows x 2 x 4 x 3
        840
    """
    shape = check_shape(input_shape)
    return linear_flops(math.prod(shape[:-1]), shape[-1], _out_features(model))


def linear_output_shape(model: Any, input_shape: Sequence[int]) -> tuple[int, ...]:
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


def conv2d_layer_flops(model: Any, input_shape: Sequence[int]) -> int:
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
        >>> conv2d_layer_flops(Conv(), (1, 3, 32, 32))   # 30 x 30 outputs x 2 x 9 x 3 x 16
        777600
    """
    if not all(hasattr(model, a) for a in ("kernel_size", "in_channels", "out_channels")):
        return 0
    shape = check_shape(input_shape)
    kh, kw = _pair(model.kernel_size)
    outputs = math.prod(_conv_geometry(model, shape))
    groups = getattr(model, "groups", 1) or 1
    return conv2d_flops(outputs, model.in_channels // groups, kh, kw)


def conv2d_output_shape(model: Any, input_shape: Sequence[int]) -> tuple[int, ...]:
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


def flops_and_output_shape(layer: Any, shape: Shape) -> tuple[int, Shape]:
    """FLOPs of one forward pass on an input of ``shape``, and the output's shape.

    ``tracetorch.core`` ``Linear`` and ``Conv2d`` (and their subclasses) use the closed forms
    above; a ``Sequential``, or a forward-less object with a ``layers`` list, is walked with
    :func:`walk_layers`; anything else runs once on a zero input under the engine.

    Example:
        >>> from tracetorch.core import Linear, ReLU, Sequential
        >>> flops_and_output_shape(Sequential(Linear(4, 3), ReLU()), (7, 4))
        (189, (7, 3))
    """
    # isinstance, so subclasses (a QuantizedLinear) keep their parent's formula.
    if isinstance(layer, Linear):
        return linear_layer_flops(layer, shape), linear_output_shape(layer, shape)
    if isinstance(layer, Conv2d):
        return conv2d_layer_flops(layer, shape), conv2d_output_shape(layer, shape)
    if isinstance(layer, Sequential) or (
            isinstance(getattr(layer, "layers", None), (list, tuple)) and not is_layer(layer)):
        return walk_layers(layer, shape)
    # Pooling, flatten, activations, custom layers: run them, exactly once, on zeros.
    flops, out = forward_flops_and_output(layer, dummy_input(layer, shape))
    return flops, tuple(out.shape)


def walk_layers(model: Any, shape: Shape) -> tuple[int, Shape]:
    """Summed FLOPs over ``model.layers``, each layer seeing the shape its predecessor produced,
    and the last output shape.

    Example:
        >>> from tracetorch.core import Linear, Sequential
        >>> walk_layers(Sequential(Linear(128, 64), Linear(64, 10)), (1, 128))
        (17664, (1, 10))
    """
    total = 0
    for layer in model.layers:
        flops, shape = flops_and_output_shape(layer, shape)
        total += flops
    return total, shape


def _conv_geometry(model: Any, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
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


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)
