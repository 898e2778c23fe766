"""Numeric kernels behind the ``conv2d`` op: two vectorized ways to run a convolution.

**Stream kernels (stride 1, the common case).**  The padded batch is laid out channel-major
as one long "stream" ``X`` of shape (C, N*Hp*Wp): image after image, row after row.  In that
layout, moving the kernel down one row is a shift of the stream by ``Wp`` and moving it right
is a shift by 1.  So only the kw horizontal shifts are materialised,
``R[(c, j), t] = X[c, t + j]`` (kw copies of the input rather than im2col's kh*kw), and one
GEMM ``Y = W_all @ R`` with ``W_all`` the kh kernel rows stacked (kh*Cout, Cin*kw) gives every
kernel row's partial sums at once; the output is the sum of the kh row blocks of ``Y``, each
read at its vertical shift.  Positions that straddle a row or image edge are computed and
dropped (about (Hp*Wp - OH*OW) / (Hp*Wp) of the columns).  The input gradient of a stride-1
convolution is itself a stride-1 convolution (of the gradient, padded by k-1-p, with the
flipped, transposed kernel), so it reuses the same kernel.

**im2col kernels (any stride).**  ``sliding_window_view`` exposes every window; one copy
makes the (N, Cin*kh*kw, OH*OW) column tensor and a batched GEMM gives the output; the input
gradient is scattered back one kernel offset at a time.

Python loops here run over kernel rows/offsets only, never over images, channels or pixels.

Example::

    >>> x = np.random.rand(2, 3, 6, 6).astype(np.float32)
    >>> w = np.random.rand(4, 3, 3, 3).astype(np.float32)
    >>> a, _ = stream_forward(x, w, (1, 1))
    >>> b, _ = im2col_forward(x, w, (1, 1), (1, 1))
    >>> bool(np.allclose(a, b, atol=1e-5))
    True
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from numpy.lib.stride_tricks import as_strided, sliding_window_view

__all__ = (
    "stream_forward",
    "stream_weight_grad",
    "stream_input_grad",
    "im2col_forward",
    "im2col_weight_grad",
    "im2col_input_grad",
)


def _stream(x: np.ndarray, pad: Tuple[int, int], dtype: np.dtype, tail: int) -> np.ndarray:
    """Zero-padded NCHW ``x`` as a (C, N*Hp*Wp + tail) stream (channel-major)."""
    n, c, h, w = x.shape
    ph, pw = pad
    hp, wp = h + 2 * ph, w + 2 * pw
    total = n * hp * wp
    stream = np.zeros((c, total + tail), dtype=dtype)
    stream[:, :total].reshape(c, n, hp, wp)[:, :, ph : ph + h, pw : pw + w] = x.transpose(
        1, 0, 2, 3
    )
    return stream


def stream_forward(
    x: np.ndarray, w: np.ndarray, pad: Tuple[int, int], bias: Optional[np.ndarray] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """Stride-1 convolution of NCHW ``x`` with ``w`` (O, C, kh, kw), plus ``bias`` (O,).

    Returns (output (N, O, OH, OW), the row-shift matrix R whose first C*kw rows
    :func:`stream_weight_grad` needs).  The bias rides along in the GEMM: R gets a row of
    ones and the first kernel row's block of ``W_all`` a bias column, saving a pass.
    """
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    ph, pw = pad
    hp, wp = h + 2 * ph, wd + 2 * pw
    oh, ow = hp - kh + 1, wp - kw + 1
    total = n * hp * wp
    k = c * kw
    dtype = np.result_type(x, w)
    stream = _stream(x, pad, dtype, kw - 1)
    item = stream.itemsize
    r = np.empty((k + (bias is not None), total), dtype=dtype)
    np.copyto(
        r[:k].reshape(c, kw, total),
        as_strided(stream, (c, kw, total), (stream.strides[0], item, item)),
    )
    # Row i of the kernel becomes rows [i*O, (i+1)*O) of W_all, columns ordered (c, j) like R.
    w_all = np.zeros((kh * o, r.shape[0]), dtype=dtype)
    w_all[:, :k] = w.transpose(2, 0, 1, 3).reshape(kh * o, k)
    if bias is not None:
        r[k] = 1.0
        w_all[:o, k] = bias
    y = (w_all @ r).reshape(kh, o, n, hp, wp)
    out = np.empty((n, o, oh, ow), dtype=dtype)
    # Kernel row i reads the stream i rows further down: its block is sliced at row offset i.
    first = y[0, :, :, 0:oh, 0:ow].transpose(1, 0, 2, 3)
    if kh == 1:
        out[...] = first
    else:
        np.add(first, y[1, :, :, 1 : 1 + oh, 0:ow].transpose(1, 0, 2, 3), out=out)
        for i in range(2, kh):
            out += y[i, :, :, i : i + oh, 0:ow].transpose(1, 0, 2, 3)
    return out, r


def stream_weight_grad(
    g: np.ndarray, r: np.ndarray, w_shape: tuple, padded_hw: Tuple[int, int]
) -> np.ndarray:
    """Weight gradient of :func:`stream_forward` from the output gradient ``g`` and its ``R``."""
    n, o, oh, ow = g.shape
    _, c, kh, kw = w_shape
    hp, wp = padded_hw
    total = n * hp * wp
    r = r[: c * kw]  # drop the bias row of ones
    # The gradient in stream layout, pixel-major (N*Hp*Wp, O): zero wherever the forward
    # computed a dropped column.  Pixel-major makes each GEMM R_i @ G (C*kw x T) @ (T x O),
    # which OpenBLAS runs faster than G^T @ R_i^T for such a long inner dimension.
    gt = np.zeros((n, hp, wp, o), dtype=r.dtype)
    gt[:, :oh, :ow, :] = g.transpose(0, 2, 3, 1)
    gt = gt.reshape(total, o)
    grad = np.empty((o, c, kh, kw), dtype=r.dtype)
    for i in range(kh):
        span = total - i * wp  # the last i rows of the stream only hold zeros of gt
        part = r[:, i * wp : i * wp + span] @ gt[:span]  # (C*kw, O)
        grad[:, :, i, :] = part.T.reshape(o, c, kw)
    return grad


def stream_input_grad(g: np.ndarray, w: np.ndarray, pad: Tuple[int, int]) -> np.ndarray:
    """Input gradient of a stride-1 convolution with padding ``pad`` (each <= k - 1):
    the gradient convolved (padding k-1-p) with the flipped kernel, channels swapped."""
    kh, kw = w.shape[2:]
    flipped = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
    out, _ = stream_forward(g, flipped, (kh - 1 - pad[0], kw - 1 - pad[1]))
    return out


def im2col_forward(
    x: np.ndarray, w: np.ndarray, stride: Tuple[int, int], pad: Tuple[int, int]
) -> Tuple[np.ndarray, np.ndarray]:
    """Any-stride convolution via one im2col copy and a batched GEMM.

    Returns (output (N, O, OH, OW), columns (N, C*kh*kw, OH*OW)).
    """
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    (sh, sw), (ph, pw) = stride, pad
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    dtype = np.result_type(x, w)
    xp = x
    if ph or pw:
        xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), dtype=x.dtype)
        xp[:, :, ph : ph + h, pw : pw + wd] = x
    windows = sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
    cols = np.empty((n, c, kh, kw, oh, ow), dtype=dtype)
    np.copyto(cols, windows.transpose(0, 1, 4, 5, 2, 3))
    cols = cols.reshape(n, c * kh * kw, oh * ow)
    out = np.matmul(w.reshape(o, -1).astype(dtype, copy=False), cols)
    return out.reshape(n, o, oh, ow), cols


def im2col_weight_grad(g: np.ndarray, cols: np.ndarray, w_shape: tuple) -> np.ndarray:
    """Weight gradient from the saved columns: per-image GEMMs summed over the batch."""
    n, o = g.shape[:2]
    g3 = g.reshape(n, o, -1)
    return np.matmul(g3, cols.transpose(0, 2, 1)).sum(axis=0).reshape(w_shape)


def im2col_input_grad(
    g: np.ndarray, w: np.ndarray, x_shape: tuple, stride: Tuple[int, int], pad: Tuple[int, int]
) -> np.ndarray:
    """col2im: scatter ``W^T g`` back onto the padded input, one kernel offset at a time."""
    n, c, h, wd = x_shape
    o, _, kh, kw = w.shape
    (sh, sw), (ph, pw) = stride, pad
    oh, ow = g.shape[2:]
    dtype = np.result_type(g, w)
    grad = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), dtype=dtype)
    part = np.empty((n, c, oh * ow), dtype=dtype)
    w_t = w.transpose(2, 3, 1, 0).astype(dtype, copy=False)  # (kh, kw, Cin, Cout)
    g3 = g.reshape(n, o, oh * ow).astype(dtype, copy=False)
    for i in range(kh):
        for j in range(kw):
            np.matmul(w_t[i, j], g3, out=part)
            grad[:, :, i : i + sh * oh : sh, j : j + sw * ow : sw] += part.reshape(n, c, oh, ow)
    if ph or pw:
        grad = np.ascontiguousarray(grad[:, :, ph : ph + h, pw : pw + wd])
    return grad
