"""2-D convolution as one fused autograd op.

The numeric work lives in :mod:`tracetorch.core.conv_impl`: stride-1 convolutions use the
"stream" kernels (kw shifted copies of the input and one GEMM for all kernel rows; the input
gradient is the same kernel run on the gradient with the flipped weight; the output and the
input gradient are strided views, not contiguous arrays), other strides use
im2col (``sliding_window_view`` + one copy + batched GEMM, col2im per kernel offset).  The
bias is added inside the op; its gradient is ``g.sum((0, 2, 3))``.

FLOPs (see :mod:`tracetorch.flops.core_ops`): forward ``2*kh*kw*Cin*Cout*OH*OW*N`` (gemm;
bias add not counted); backward that amount for the weight grad plus the same for the input
grad when the input requires grad (gemm; bias grad not counted).  These are the analytic
counts: the stream kernels also compute, then drop, outputs at row/image edges.

Example::

    >>> x = Tensor(np.ones((1, 1, 4, 4)))
    >>> w = Tensor(np.ones((2, 1, 3, 3)))
    >>> conv2d(x, w, padding=1).shape
    (1, 2, 4, 4)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tracetorch.flops.core_ops import conv2d_flops, gemm_backward_flops

from . import autograd as _ag
from . import conv_impl
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
    bias: Tensor | None = None,
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
    stream = sh == 1 and sw == 1
    if stream:
        out, saved = conv_impl.stream_forward(
            xd, wd, (ph, pw), None if bias is None else bias.data
        )
    else:
        out, saved = conv_impl.im2col_forward(xd, wd, (sh, sw), (ph, pw))
        if bias is not None:
            out += bias.data.reshape(1, cout, 1, 1)
    flops = conv2d_flops(out.size, cin, kh, kw)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("conv2d", flops, True)
    rx = x.requires_grad
    rw = weight.requires_grad
    rb = bias is not None and bias.requires_grad
    if not ((rx or rw or rb) and _ag._grad_enabled):
        return Tensor._wrap(out)
    # Only the weight gradient reads the padded stream / unfolded input.
    kept = saved if rw else None
    # The stream input-gradient needs padding <= k - 1 (it pads the gradient by k-1-p).
    stream_dx = stream and ph <= kh - 1 and pw <= kw - 1

    def backward(g: np.ndarray) -> tuple:
        gx = gw = gb = None
        if kept is not None:  # the weight requires grad
            if stream:
                gw = conv_impl.stream_weight_grad(g, kept, wd.shape, (h + 2 * ph, w + 2 * pw))
            else:
                gw = conv_impl.im2col_weight_grad(g, kept, wd.shape)
        if rb:
            gb = g.sum(axis=(0, 2, 3))
        if rx:
            if stream_dx:
                gx = conv_impl.stream_input_grad(g, wd, (ph, pw))
            else:
                gx = conv_impl.im2col_input_grad(g, wd, xd.shape, (sh, sw), (ph, pw))
        return gx, gw, gb

    bflops = gemm_backward_flops(flops, rx + rw)
    node = Node((x, weight, bias), backward, "conv2d", tag, True, bflops)
    return Tensor._from_op(out, node)
