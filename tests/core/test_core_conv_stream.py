"""conv2d forward and all gradients against a float64 reference, over the code paths of the
stride-1 "stream" kernels: kernel/padding combos (1xk, kx1, padding > k-1), bias or not,
frozen weight and no_grad (stream not kept), strided (view) outputs and
per-thread work buffers that must not leak into earlier results."""
import numpy as np
import pytest

from tracetorch.core import Tensor, no_grad
from tracetorch.core.ops_conv import conv2d


def reference(x, w, b, stride, pad, g):
    """Output and (dx, dw, db) in float64, one kernel offset at a time."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    (sh, sw), (ph, pw) = stride, pad
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    out = np.zeros((n, o, oh, ow))
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w)
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i:i + sh * oh:sh, j:j + sw * ow:sw]
            out += np.einsum("nchw,oc->nohw", win, w[:, :, i, j])
            dw[:, :, i, j] = np.einsum("nohw,nchw->oc", g, win)
            dxp[:, :, i:i + sh * oh:sh, j:j + sw * ow:sw] += np.einsum(
                "nohw,oc->nchw", g, w[:, :, i, j])
    if b is not None:
        out += b[None, :, None, None]
    return out, dxp[:, :, ph:ph + h, pw:pw + wd], dw, g.sum((0, 2, 3))


CASES = [  # (Cin, Cout, kernel, stride, padding, H, W)
    (3, 4, (3, 3), (1, 1), (1, 1), 7, 6),
    (2, 5, (1, 1), (1, 1), (0, 0), 5, 4),
    (3, 2, (1, 3), (1, 1), (0, 1), 4, 6),
    (2, 3, (3, 1), (1, 1), (2, 0), 5, 3),
    (4, 3, (2, 3), (1, 1), (0, 2), 6, 5),
    (2, 2, (3, 3), (1, 1), (3, 2), 4, 4),  # padding > k-1: input grad falls back to col2im
    (3, 4, (5, 5), (1, 1), (2, 2), 8, 9),
    (3, 4, (3, 3), (2, 1), (1, 0), 7, 6),  # im2col path
    (2, 3, (3, 1), (1, 1), (1, 0), 5, 4),
    (3, 2, (5, 3), (1, 1), (2, 1), 6, 5),
    (1, 2, (3, 3), (1, 1), (1, 1), 1, 1),
]


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_conv_forward_and_grads_match_reference(case, with_bias):
    dtype = np.float32  # Tensor stores float32
    cin, cout, k, stride, pad, h, w = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, cin, h, w)).astype(dtype)
    wt = rng.standard_normal((cout, cin) + k).astype(dtype)
    b = rng.standard_normal(cout).astype(dtype) if with_bias else None
    xt, wtt = Tensor(x, requires_grad=True), Tensor(wt, requires_grad=True)
    bt = Tensor(b, requires_grad=True) if with_bias else None
    out = conv2d(xt, wtt, bt, stride, pad)
    g = rng.standard_normal(out.shape).astype(dtype)
    ref, dx, dw, db = reference(x.astype(np.float64), wt.astype(np.float64),
                                None if b is None else b.astype(np.float64), stride, pad,
                                g.astype(np.float64))
    tol = dict(rtol=1e-4, atol=1e-4)
    assert out.data.dtype == dtype
    np.testing.assert_allclose(out.data, ref, **tol)
    out.backward(g)
    np.testing.assert_allclose(xt.grad.data, dx, **tol)
    np.testing.assert_allclose(wtt.grad.data, dw, **tol)
    if with_bias:
        np.testing.assert_allclose(bt.grad.data, db, **tol)
    with no_grad():
        np.testing.assert_allclose(conv2d(xt, wtt, bt, stride, pad).data, ref, **tol)


def test_frozen_weight_input_grad_and_buffer_reuse():
    """Results of earlier calls survive later calls (work buffers are reused)."""
    rng = np.random.default_rng(1)
    x1, x2 = (rng.standard_normal((2, 3, 6, 6)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    wt = Tensor(w)  # frozen: the forward keeps nothing for a weight gradient
    a, b = Tensor(x1, requires_grad=True), Tensor(x2, requires_grad=True)
    out1 = conv2d(a, wt, padding=1)
    first = out1.data.copy()
    out1.backward(g)
    grad1 = a.grad.data.copy()
    out2 = conv2d(b, wt, padding=1)
    out2.backward(g * 2)
    np.testing.assert_array_equal(out1.data, first)
    np.testing.assert_array_equal(a.grad.data, grad1)
    ref1, dx1, _, _ = reference(x1.astype(np.float64), w.astype(np.float64), None, (1, 1),
                                (1, 1), g.astype(np.float64))
    np.testing.assert_allclose(first, ref1, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grad1, dx1, rtol=1e-4, atol=1e-4)
    assert wt.grad is None
