"""Normalization ops: layer norm and 2-D batch norm, each one fused autograd node.

Both normalize ``x`` over some axes, ``xhat = (x - mean) / sqrt(var + eps)`` with the
biased variance, then apply an optional per-feature affine ``xhat * weight + bias``.  The
backward for normalization with batch statistics is the closed form::

    gx = rstd * (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat))      (means over the axes)

FLOPs (``N`` = input elements, :mod:`tracetorch.flops.core_ops`): with batch statistics
forward ``7*N``, backward ``8*N`` for the input, ``2*N`` for the weight, ``1*N`` for the bias;
batch norm in eval mode (running statistics, no dependence on the batch) forward ``4*N``,
backward ``2*N`` for the input.

Example::

    >>> y = layer_norm(Tensor([[1.0, 2.0, 3.0]]), None, None, 1)
    >>> np.round(y.data, 3)
    array([[-1.225,  0.   ,  1.225]], dtype=float32)
"""
from __future__ import annotations

import numpy as np

from tracetorch.flops.core_ops import norm_backward_flops, norm_flops

from . import autograd as _ag
from .autograd import Node
from .tensor import Tensor

__all__ = ("layer_norm", "batch_norm")


def _affine_grads(
    g: np.ndarray, xhat: np.ndarray, reduce_axes: tuple, param_shape: tuple, rw: bool, rb: bool
) -> tuple:
    gw = (g * xhat).sum(axis=reduce_axes).reshape(param_shape) if rw else None
    gb = g.sum(axis=reduce_axes).reshape(param_shape) if rb else None
    return gw, gb


def _normalize(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    axes: tuple,
    param_view: tuple,
    name: str,
    eps: float,
    stats: tuple | None = None,
) -> Tensor:
    """Shared body: ``stats`` = (mean, var) fixes the statistics (eval batch norm)."""
    xd = x.data
    if stats is None:
        mean = xd.mean(axis=axes, keepdims=True)
        centered = xd - mean
        var = (centered * centered).mean(axis=axes, keepdims=True)
    else:
        mean, var = stats
        centered = xd - mean
    rstd = (1.0 / np.sqrt(var + eps)).astype(xd.dtype, copy=False)
    xhat = centered * rstd
    out = xhat
    wv = weight.data.reshape(param_view) if weight is not None else None
    if wv is not None:
        out = out * wv
    if bias is not None:
        out = out + bias.data.reshape(param_view)
    fixed = stats is not None
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op(name, norm_flops(xd.size, not fixed), False)
    rx = x.requires_grad
    rw = weight is not None and weight.requires_grad
    rb = bias is not None and bias.requires_grad
    if not ((rx or rw or rb) and _ag._grad_enabled):
        return Tensor._wrap(out)
    # The parameter axes are the ones not normalized over, e.g. (0, 2, 3) for batch norm.
    reduce_axes = tuple(i for i in range(xd.ndim) if param_view[i] == 1)
    param_shape = weight.shape if weight is not None else (bias.shape if bias is not None else ())

    def backward(g: np.ndarray) -> tuple:
        gx = None
        if rx:
            gxhat = g * wv if wv is not None else g
            if fixed:
                gx = gxhat * rstd
            else:
                gx = rstd * (
                    gxhat
                    - gxhat.mean(axis=axes, keepdims=True)
                    - xhat * (gxhat * xhat).mean(axis=axes, keepdims=True)
                )
        gw, gb = _affine_grads(g, xhat, reduce_axes, param_shape, rw, rb)
        return gx, gw, gb

    bflops = norm_backward_flops(xd.size, not fixed, rx, rw, rb)
    node = Node((x, weight, bias), backward, name, tag, False, bflops)
    return Tensor._from_op(out, node)


def layer_norm(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    normalized_ndim: int,
    eps: float = 1e-5,
) -> Tensor:
    """Normalize over the last ``normalized_ndim`` dims; weight/bias have those dims' shape."""
    nd = x.data.ndim
    axes = tuple(range(nd - normalized_ndim, nd))
    param_view = (1,) * (nd - normalized_ndim) + x.data.shape[nd - normalized_ndim :]
    return _normalize(x, weight, bias, axes, param_view, "layer_norm", eps)


def batch_norm(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    training: bool,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Batch norm of NCHW ``x`` per channel.

    In training the batch statistics are used and ``running_mean``/``running_var`` are
    updated in place (``(1 - momentum) * running + momentum * batch``, unbiased variance);
    in eval the running statistics are used.
    """
    xd = x.data
    c = xd.shape[1]
    axes = (0, 2, 3)
    view = (1, c, 1, 1)
    if not training:
        stats = (running_mean.reshape(view), running_var.reshape(view))
        return _normalize(x, weight, bias, axes, view, "batch_norm", eps, stats)
    out = _normalize(x, weight, bias, axes, view, "batch_norm", eps)
    count = xd.size // c
    batch_mean = xd.mean(axis=axes)
    batch_var = xd.var(axis=axes) * (count / max(count - 1, 1))
    running_mean *= 1.0 - momentum
    running_mean += momentum * batch_mean
    running_var *= 1.0 - momentum
    running_var += momentum * batch_var
    return out
