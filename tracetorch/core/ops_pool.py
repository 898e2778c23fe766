"""2-D max and average pooling as fused autograd ops.

Both work on strided views of the (padded) input: the Python loop runs over the kh*kw
kernel offsets only, each step handling every image, channel and output pixel at once.
Max pooling pads with -inf and routes each output's gradient to the first maximum of its
window (row-major order, as PyTorch does); average pooling pads with zeros and always
divides by kh*kw (``count_include_pad=True``).

FLOPs (``n`` = output elements, :mod:`tracetorch.flops.core_ops`): max forward ``kh*kw*n``
comparisons, backward ``n``; avg forward ``kh*kw*n``, backward ``kh*kw*n``.

Example::

    >>> max_pool2d(Tensor(np.arange(16.0).reshape(1, 1, 4, 4)), 2).data[0, 0]
    array([[ 5.,  7.],
           [13., 15.]], dtype=float32)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tracetorch.flops.core_ops import max_pool2d_backward_flops, pool2d_flops

from . import autograd as _ag
from .autograd import Node
from .ops_conv import conv_output_size, pad2d, to_pair
from .tensor import Tensor

__all__ = ("max_pool2d", "avg_pool2d", "pool_geometry")


def pool_geometry(
    shape: tuple, kernel_size: Any, stride: Any, padding: Any, op: str
) -> tuple:
    """Validate a pooling call; return ((kh, kw), (sh, sw), (ph, pw), (oh, ow))."""
    if len(shape) != 4:
        raise ValueError(f"{op}: expected 4-D input (N, C, H, W), got shape {shape}")
    kh, kw = to_pair(kernel_size, f"{op}: kernel_size")
    sh, sw = to_pair(kernel_size if stride is None else stride, f"{op}: stride")
    ph, pw = to_pair(padding, f"{op}: padding", minimum=0)
    if ph > kh // 2 or pw > kw // 2:
        raise ValueError(
            f"{op}: padding {(ph, pw)} must be at most half the kernel size {(kh, kw)}"
        )
    oh = conv_output_size(shape[2], kh, sh, ph)
    ow = conv_output_size(shape[3], kw, sw, pw)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"{op}: input {shape} is smaller than the kernel {(kh, kw)}")
    return (kh, kw), (sh, sw), (ph, pw), (oh, ow)


def _window(xp: np.ndarray, i: int, j: int, stride: tuple, out_hw: tuple) -> np.ndarray:
    """Strided view of the input element at offset (i, j) of every pooling window."""
    sh, sw = stride
    oh, ow = out_hw
    return xp[:, :, i : i + sh * oh : sh, j : j + sw * ow : sw]


def _crop(grad: np.ndarray, padding: tuple, shape: tuple) -> np.ndarray:
    ph, pw = padding
    if not (ph or pw):
        return grad
    return np.ascontiguousarray(grad[:, :, ph : ph + shape[2], pw : pw + shape[3]])


def max_pool2d(
    x: Tensor, kernel_size: Any, stride: Any | None = None, padding: Any = 0
) -> Tensor:
    """Maximum over each kh x kw window of NCHW ``x``."""
    xd = x.data
    kernel, strides, pads, out_hw = pool_geometry(
        xd.shape, kernel_size, stride, padding, "max_pool2d"
    )
    kh, kw = kernel
    xp = pad2d(xd, pads[0], pads[1], value=-np.inf)
    out = _window(xp, 0, 0, strides, out_hw).copy()
    for i in range(kh):
        for j in range(kw):
            if i or j:
                np.maximum(out, _window(xp, i, j, strides, out_hw), out=out)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("max_pool2d", pool2d_flops(kh * kw, out.size), False)
    if not (x.requires_grad and _ag._grad_enabled):
        return Tensor._wrap(out)

    def backward(g: np.ndarray) -> tuple:
        grad = np.zeros(xp.shape, dtype=g.dtype)
        unclaimed = np.ones(out.shape, dtype=bool)
        for i in range(kh):
            for j in range(kw):
                hit = _window(xp, i, j, strides, out_hw) == out
                hit &= unclaimed  # only the first maximum of each window gets the gradient
                unclaimed &= ~hit
                _window(grad, i, j, strides, out_hw)[...] += g * hit
        return (_crop(grad, pads, xd.shape),)

    bflops = max_pool2d_backward_flops(out.size)
    return Tensor._from_op(out, Node((x,), backward, "max_pool2d", tag, False, bflops))


def avg_pool2d(
    x: Tensor, kernel_size: Any, stride: Any | None = None, padding: Any = 0
) -> Tensor:
    """Mean over each kh x kw window of NCHW ``x`` (zero padding counts in the mean)."""
    xd = x.data
    kernel, strides, pads, out_hw = pool_geometry(
        xd.shape, kernel_size, stride, padding, "avg_pool2d"
    )
    kh, kw = kernel
    xp = pad2d(xd, pads[0], pads[1], value=0.0)
    out = _window(xp, 0, 0, strides, out_hw).copy()
    for i in range(kh):
        for j in range(kw):
            if i or j:
                out += _window(xp, i, j, strides, out_hw)
    out *= 1.0 / (kh * kw)
    per_window = pool2d_flops(kh * kw, out.size)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("avg_pool2d", per_window, False)
    if not (x.requires_grad and _ag._grad_enabled):
        return Tensor._wrap(out)

    def backward(g: np.ndarray) -> tuple:
        grad = np.zeros(xp.shape, dtype=g.dtype)
        share = g * (1.0 / (kh * kw))
        for i in range(kh):
            for j in range(kw):
                _window(grad, i, j, strides, out_hw)[...] += share
        return (_crop(grad, pads, xd.shape),)

    return Tensor._from_op(out, Node((x,), backward, "avg_pool2d", tag, False, per_window))
