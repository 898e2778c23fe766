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
flipped, transposed kernel), so it reuses the same kernel.  Outputs (and so input gradients)
are strided (N, O, OH, OW) views of (O, N, OH, Wp) arrays, and the forward saves only the
padded stream; the weight gradient rebuilds R from it.

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


def _zero_border(a: np.ndarray, ph: int, pw: int) -> None:
    """Zero the ``ph`` top/bottom rows and ``pw`` left/right columns of (..., Hp, Wp) ``a``."""
    if ph:
        a[..., :ph, :] = 0.0
        a[..., a.shape[-2] - ph :, :] = 0.0
    if pw:
        a[..., ph : a.shape[-2] - ph, :pw] = 0.0
        a[..., ph : a.shape[-2] - ph, a.shape[-1] - pw :] = 0.0


def _stream(x: np.ndarray, pad: tuple[int, int], dtype: np.dtype, tail: int) -> np.ndarray:
    """Zero-padded NCHW ``x`` as a (C, N*Hp*Wp + tail) stream (channel-major).

    Only the padding and the tail are zeroed (``np.zeros`` would zero-fill it all, a pass
    as long as the copy, since freed buffers of this size are usually reused).
    """
    n, c, h, w = x.shape
    ph, pw = pad
    hp, wp = h + 2 * ph, w + 2 * pw
    total = n * hp * wp
    stream = np.empty((c, total + tail), dtype=dtype)
    image = stream[:, :total].reshape(c, n, hp, wp)
    image[:, :, ph : ph + h, pw : pw + w] = x.transpose(1, 0, 2, 3)
    _zero_border(image, ph, pw)
    stream[:, total:] = 0.0
    return stream


def _shifted_rows(stream: np.ndarray, kw: int, ones_row: bool) -> np.ndarray:
    """R (C*kw [+ 1], T) with ``R[(c, j), t] = X[c, t + j]``.

    One strided copy from the stream (long contiguous runs; writing the stream straight
    into R's j = 0 block and shifting it within R measured ~2x slower).  ``ones_row``
    appends a row of ones so the GEMM can add the bias.
    """
    c, total = stream.shape[0], stream.shape[1] - (kw - 1)
    item = stream.itemsize
    r = np.empty((c * kw + ones_row, total), dtype=stream.dtype)
    np.copyto(
        r[: c * kw].reshape(c, kw, total),
        as_strided(stream, (c, kw, total), (stream.strides[0], item, item)),
    )
    if ones_row:
        r[-1] = 1.0
    return r


def stream_forward(
    x: np.ndarray, w: np.ndarray, pad: tuple[int, int], bias: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Stride-1 convolution of NCHW ``x`` with ``w`` (O, C, kh, kw), plus ``bias`` (O,).

    Returns (output (N, O, OH, OW), the padded stream that :func:`stream_weight_grad`
    needs).  Saving the stream rather than R costs the backward one rebuild of R (~0.7 ms
    on the benchmark shape) but keeps about 1x rather than kw x the input alive.  The bias
    rides along in the GEMM: R gets a row of ones and the first kernel row's block of
    ``W_all`` a bias column, saving a pass.

    The output is a strided view (of an (O, N, OH, Wp) array), not a contiguous array:
    summing the kernel-row blocks over long contiguous runs and skipping the batch/channel
    transpose is about twice as fast as writing an (N, O, OH, OW) array; numpy ops accept
    such views.
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
    r = _shifted_rows(stream, kw, bias is not None)
    # Row i of the kernel becomes rows [i*O, (i+1)*O) of W_all, columns ordered (c, j) like R.
    w_all = np.zeros((kh * o, r.shape[0]), dtype=dtype)
    w_all[:, :k] = w.transpose(2, 0, 1, 3).reshape(kh * o, k)
    if bias is not None:
        w_all[:o, k] = bias
    y = (w_all @ r).reshape(kh, o, total)
    # Kernel row i reads the stream i rows further down: block i is added shifted by i*Wp.
    # Blocks 1..kh-2 are added into block 0 in place; the last add writes only the OH output
    # rows of each image (all Wp columns, so each image is one contiguous run of OH*Wp
    # values) into a fresh (O, N, OH, Wp) array, and the view crops the OW kept columns
    # and swaps N and O.  Cropping columns in the add itself (32-value runs) or writing an
    # (N, O, OH, OW) array measured ~1 ms slower here; returning a view of block 0 instead
    # of a fresh array is ~1 ms faster but keeps the kh x larger Y alive with the output.
    span = total - (kh - 1) * wp
    y0 = y[0, :, :span]
    for i in range(1, kh - 1):
        np.add(y0, y[i, :, i * wp : i * wp + span], out=y0)
    if kh == 1:
        rows = y[0].reshape(o, n, hp, wp)  # nothing to add; Y is no larger than the output
    else:
        rows = np.empty((o, n, oh, wp), dtype=dtype)
        first = y[0].reshape(o, n, hp * wp)[:, :, : oh * wp]
        last = y[kh - 1].reshape(o, n, hp * wp)[:, :, (kh - 1) * wp : (kh - 1 + oh) * wp]
        np.add(first, last, out=rows.reshape(o, n, oh * wp))
    out = rows[:, :, :, :ow].transpose(1, 0, 2, 3)
    return out, stream


def stream_weight_grad(
    g: np.ndarray, stream: np.ndarray, w_shape: tuple, padded_hw: tuple[int, int]
) -> np.ndarray:
    """Weight gradient of :func:`stream_forward` from the output gradient ``g`` and the
    padded stream it saved: rebuild R, then one GEMM per kernel row."""
    n, o, oh, ow = g.shape
    _, c, kh, kw = w_shape
    hp, wp = padded_hw
    total = n * hp * wp
    r = _shifted_rows(stream, kw, False)
    # The gradient in stream layout, pixel-major (N*Hp*Wp, O): zero wherever the forward
    # computed a dropped column.  Pixel-major makes each GEMM R_i @ G (C*kw x T) @ (T x O),
    # which OpenBLAS runs faster than G^T @ R_i^T for such a long inner dimension (4.5 vs
    # 6.4 ms here), more than paying for the transposing copy.
    gt = np.empty((n, hp, wp, o), dtype=r.dtype)
    gt[:, :oh, :ow, :] = g.transpose(0, 2, 3, 1)
    gt[:, :oh, ow:, :] = 0.0
    gt[:, oh:, :, :] = 0.0
    gt = gt.reshape(total, o)
    grad = np.empty((o, c, kh, kw), dtype=r.dtype)
    for i in range(kh):
        span = total - i * wp  # the last i rows of the stream only hold zeros of gt
        part = r[:, i * wp : i * wp + span] @ gt[:span]  # (C*kw, O)
        grad[:, :, i, :] = part.T.reshape(o, c, kw)
    return grad


def stream_input_grad(g: np.ndarray, w: np.ndarray, pad: tuple[int, int]) -> np.ndarray:
    """Input gradient of a stride-1 convolution with padding ``pad`` (each <= k - 1):
    the gradient convolved (padding k-1-p) with the flipped kernel, channels swapped."""
    kh, kw = w.shape[2:]
    flipped = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
    out, _ = stream_forward(g, flipped, (kh - 1 - pad[0], kw - 1 - pad[1]))
    return out


def im2col_forward(
    x: np.ndarray, w: np.ndarray, stride: tuple[int, int], pad: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
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
    g: np.ndarray, w: np.ndarray, x_shape: tuple, stride: tuple[int, int], pad: tuple[int, int]
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
