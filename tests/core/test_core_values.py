"""Exact forward values: conv and pooling against naive loops, layers against formulas."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tracetorch.core import (
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    LayerNorm,
    Linear,
    MaxPool2d,
    MultiHeadAttention,
    Tensor,
)
from tracetorch.core import functional as F


def naive_conv(x, w, b, stride, padding):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    (sh, sw), (ph, pw) = stride, padding
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]
            out[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return out + (0 if b is None else b[None, :, None, None])


def naive_pool(x, k, s, p, reduce, fill):
    (kh, kw), (sh, sw), (ph, pw) = k, s, p
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    oh, ow = (x.shape[2] + 2 * ph - kh) // sh + 1, (x.shape[3] + 2 * pw - kw) // sw + 1
    out = np.zeros(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = reduce(xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw], axis=(2, 3))
    return out


@pytest.mark.parametrize(
    "stride,padding,kernel",
    [(1, 0, 3), (1, 1, 3), (1, 3, 2), (1, (0, 1), (1, 3)), (2, 1, 3), ((1, 2), (2, 0), (3, 2)),
     (3, 0, 1)],
)
def test_conv_matches_naive(stride, padding, kernel):
    conv = Conv2d(3, 4, kernel, stride=stride, padding=padding)
    conv.bias.data = np.random.default_rng(0).standard_normal(4).astype(np.float32)
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 8)).astype(np.float32)
    pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    expected = naive_conv(x.astype(np.float64), conv.weight.data.astype(np.float64),
                          conv.bias.data.astype(np.float64), pair(stride), pair(padding))
    out = conv(Tensor(x))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.data, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k,s,p", [(2, None, 0), (3, 2, 1), ((2, 3), (1, 2), (1, 1))])
def test_pools_match_naive(k, s, p):
    x = np.random.default_rng(2).standard_normal((2, 3, 7, 6)).astype(np.float32)
    pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    kk, ss, pp = pair(k), pair(k if s is None else s), pair(p)
    np.testing.assert_allclose(MaxPool2d(k, s, p)(Tensor(x)).data,
                               naive_pool(x, kk, ss, pp, np.max, -np.inf), rtol=1e-6)
    np.testing.assert_allclose(AvgPool2d(k, s, p)(Tensor(x)).data,
                               naive_pool(x, kk, ss, pp, np.mean, 0.0), rtol=1e-5, atol=1e-6)


def test_maxpool_routes_gradient_to_first_maximum():
    x = Tensor(np.zeros((1, 1, 2, 2)), requires_grad=True)
    F.max_pool2d(x, 2).sum().backward()
    np.testing.assert_array_equal(x.grad.data[0, 0], [[1, 0], [0, 0]])


def test_linear_over_leading_dims():
    lin = Linear(4, 3)
    x = np.random.default_rng(3).standard_normal((2, 5, 4)).astype(np.float32)
    np.testing.assert_allclose(lin(Tensor(x)).data, x @ lin.weight.data + lin.bias.data, rtol=1e-5)
    assert lin.weight.shape == (4, 3) and lin.bias.shape == (3,)


def test_layernorm_and_batchnorm_values():
    x = np.random.default_rng(4).standard_normal((4, 3, 2, 2)).astype(np.float32)
    ln = LayerNorm(2)(Tensor(x)).data
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ln, ref, rtol=1e-4, atol=1e-5)
    bn = BatchNorm2d(3, momentum=0.5)
    out = bn(Tensor(x)).data
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    ref = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.running_mean, 0.5 * mean, rtol=1e-5)
    np.testing.assert_allclose(bn.running_var, 0.5 + 0.5 * var * 16 / 15, rtol=1e-5)
    bn.eval()
    ref_eval = (x - bn.running_mean[None, :, None, None]) / np.sqrt(
        bn.running_var[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(bn(Tensor(x)).data, ref_eval, rtol=1e-4, atol=1e-5)


def test_causal_attention_ignores_future_tokens():
    mha = MultiHeadAttention(8, 2, causal=True)
    x = np.random.default_rng(5).standard_normal((1, 5, 8)).astype(np.float32)
    changed = x.copy()
    changed[:, 3:] += 10.0  # change only the future of positions 0..2
    a, b = mha(Tensor(x)).data, mha(Tensor(changed)).data
    np.testing.assert_allclose(a[:, :3], b[:, :3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(a[:, 3:], b[:, 3:])
    # the forward kwarg overrides the constructor flag
    assert not np.allclose(mha(Tensor(x), causal=False).data[:, :3], a[:, :3])
    # a 2-D (seq, embed) input is a batch of one
    np.testing.assert_allclose(mha(Tensor(x[0])).data, a[0], rtol=1e-5, atol=1e-6)


def test_attention_matches_reference_formula():
    mha = MultiHeadAttention(4, 2)
    x = np.random.default_rng(6).standard_normal((2, 3, 4))
    lin = lambda layer, v: v @ layer.weight.data + layer.bias.data  # noqa: E731
    def heads(v):
        return v.reshape(2, 3, 2, 2).transpose(0, 2, 1, 3)
    q, k, v = (heads(lin(p, x)) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(2)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    ctx = (w @ v).transpose(0, 2, 1, 3).reshape(2, 3, 4)
    np.testing.assert_allclose(mha(Tensor(x)).data, lin(mha.out_proj, ctx), rtol=1e-4, atol=1e-5)


TORCH_CHECK = """
import numpy as np, torch
from tracetorch.core import Conv2d, Tensor
conv = Conv2d(3, 5, 3, stride=2, padding=1)
x = np.random.default_rng(7).standard_normal((2, 3, 9, 9)).astype(np.float32)
xt = Tensor(x, requires_grad=True)
out = conv(xt)
g = np.random.default_rng(8).standard_normal(out.shape).astype(np.float32)
out.backward(g)
tx = torch.tensor(x, requires_grad=True)
tw = torch.tensor(conv.weight.data, requires_grad=True)
tb = torch.tensor(conv.bias.data, requires_grad=True)
tout = torch.nn.functional.conv2d(tx, tw, tb, stride=2, padding=1)
tout.backward(torch.tensor(g))
pairs = [(out.data, tout), (xt.grad.data, tx.grad), (conv.weight.grad.data, tw.grad),
         (conv.bias.grad.data, tb.grad)]
print(max(float(np.max(np.abs(a - b.detach().numpy()))) for a, b in pairs))
"""


@pytest.mark.slow
def test_against_torch_when_available(torch_installed):
    """Conv2d forward and all three gradients match torch (in a subprocess, so that torch
    is not left imported for other tests that check it stays unimported; CI must have torch)."""
    result = subprocess.run([sys.executable, "-c", TORCH_CHECK], capture_output=True,
                            text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    assert float(result.stdout.strip().splitlines()[-1]) < 1e-3
