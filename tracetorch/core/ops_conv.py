"""2-D convolution as one fused autograd op (im2col + batched GEMM).

Forward: the padded input is viewed as sliding windows
(``numpy.lib.stride_tricks.sliding_window_view``), copied once into a column matrix of
shape (N, Cin*kh*kw, OH*OW), and multiplied by the (Cout, Cin*kh*kw) weight matrix in one
batched ``np.matmul`` that lands directly in NCHW order.  Backward:

* weight grad: ``g @ cols^T`` per image (batched GEMM) summed over the batch;
* input grad: for each of the kh*kw kernel offsets, one batched GEMM ``W[:, :, i, j]^T @ g``
  scattered into the strided input positions (col2im; the Python loop is over kernel
  offsets only, never over images, channels or pixels);
* bias grad: ``g.sum((0, 2, 3))``.

FLOPs (see :mod:`tracetorch.core.autograd`): forward ``2*kh*kw*Cin*Cout*OH*OW*N`` (gemm;
bias add not counted); backward that amount for the weight grad plus the same for the input
grad when the input requires grad (gemm; bias grad and batch sum not counted).

Example::

    >>> x = Tensor(np.ones((1, 1, 4, 4)))
    >>> w = Tensor(np.ones((2, 1, 3, 3)))
    >>> conv2d(x, w, padding=1).shape
    (1, 2, 4, 4)
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from . import autograd as _ag
from .autograd import Node
from .tensor import Tensor

__all__ = ("conv2d", "to_pair", "conv_output_size", "pad2d")


def to_pair(value: Any, name: str, minimum: int = 1) -> tuple:
    """``3 -> (3, 3)``; ``(2, 3)`` stays; each entry must be an int >= ``minimum``."""
    pair = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(pair) != 2 or not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= minimum
        for v in pair
    ):
        raise ValueError(
            f"{name} must be an int >= {minimum} or a pair of them, got {value!r}"
        )
    return int(pair[0]), int(pair[1])


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length of a sliding window: ``(size + 2*padding - kernel) // stride + 1``."""
    return (size + 2 * padding - kernel) // stride + 1


def pad2d(x: np.ndarray, ph: int, pw: int, value: float = 0.0) -> np.ndarray:
    """Pad the last two dims of an NCHW array (no copy when there is no padding)."""
    if not (ph or pw):
        return x
    n, c, h, w = x.shape
    out = np.full((n, c, h + 2 * ph, w + 2 * pw), value, dtype=x.dtype)
    out[:, :, ph : ph + h, pw : pw + w] = x
    return out


def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    stride: Any = 1,
    padding: Any = 0,
) -> Tensor:
    """Cross-correlate NCHW ``x`` with ``weight`` (Cout, Cin, kh, kw), add ``bias`` (Cout,).

    Example::

        >>> conv2d(Tensor(np.ones((2, 3, 8, 8))), Tensor(np.ones((4, 3, 3, 3))), stride=2).shape
        (2, 4, 3, 3)
    """
    xd, wd = x.data, weight.data
    if xd.ndim != 4 or wd.ndim != 4:
        raise ValueError(
            f"conv2d: expected 4-D input (N, C, H, W) and 4-D weight, got shapes "
            f"{xd.shape} and {wd.shape}"
        )
    sh, sw = to_pair(stride, "conv2d: stride")
    ph, pw = to_pair(padding, "conv2d: padding", minimum=0)
    n, c, h, w = xd.shape
    cout, cin, kh, kw = wd.shape
    if c != cin:
        raise ValueError(
            f"conv2d: input has {c} channels (shape {xd.shape}) but weight {wd.shape} "
            f"expects {cin}"
        )
    oh, ow = conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw)
    if oh <= 0 or ow <= 0:
        raise ValueError(
            f"conv2d: input {xd.shape} with padding {(ph, pw)} is smaller than the kernel "
            f"{(kh, kw)}"
        )
    xp = pad2d(xd, ph, pw)
    windows = sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    dtype = np.result_type(xd, wd)
    cols = np.empty((n, c, kh, kw, oh, ow), dtype=dtype)
    np.copyto(cols, windows.transpose(0, 1, 4, 5, 2, 3))
    cols = cols.reshape(n, c * kh * kw, oh * ow)
    out = np.matmul(wd.reshape(cout, -1), cols)
    if bias is not None:
        out += bias.data.reshape(cout, 1)
    out = out.reshape(n, cout, oh, ow)
    flops = 2 * kh * kw * cin * cout * oh * ow * n
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("conv2d", flops, True)
    rx = x.requires_grad
    rw = weight.requires_grad
    rb = bias is not None and bias.requires_grad
    if not ((rx or rw or rb) and _ag._grad_enabled):
        return Tensor._wrap(out)
    saved_cols = cols if rw else None  # the input grad does not need them

    def backward(g: np.ndarray) -> tuple:
        g3 = g.reshape(n, cout, oh * ow)
        gx = gw = gb = None
        if rw:
            gw = np.matmul(g3, saved_cols.transpose(0, 2, 1)).sum(axis=0).reshape(wd.shape)
        if rb:
            gb = g3.sum(axis=(0, 2))
        if rx:
            gx = _input_grad(g3, wd, xp.shape, (oh, ow), (sh, sw))
            if ph or pw:
                gx = np.ascontiguousarray(gx[:, :, ph : ph + h, pw : pw + w])
        return gx, gw, gb

    bflops = flops * (rx + rw)
    node = Node((x, weight, bias), backward, "conv2d", tag, True, bflops)
    return Tensor._from_op(out, node)


def _input_grad(
    g3: np.ndarray, wd: np.ndarray, padded_shape: tuple, out_hw: tuple, stride: tuple
) -> np.ndarray:
    """col2im: scatter ``W^T g`` back onto the padded input, one kernel offset at a time."""
    n, c, hp, wp = padded_shape
    cout, _, kh, kw = wd.shape
    oh, ow = out_hw
    sh, sw = stride
    dtype = np.result_type(g3, wd)
    grad = np.zeros(padded_shape, dtype=dtype)
    part = np.empty((n, c, oh * ow), dtype=dtype)
    w_t = wd.transpose(2, 3, 1, 0).astype(dtype, copy=False)  # (kh, kw, Cin, Cout)
    g3 = g3.astype(dtype, copy=False)
    for i in range(kh):
        for j in range(kw):
            np.matmul(w_t[i, j], g3, out=part)
            grad[:, :, i : i + sh * oh : sh, j : j + sw * ow : sw] += part.reshape(n, c, oh, ow)
    return grad
