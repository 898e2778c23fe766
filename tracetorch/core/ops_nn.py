"""Neural-network ops: activations, softmax, cross-entropy and embedding lookup.

These are fused ops (one graph node each) with hand-written backward passes; their FLOP
costs come from :mod:`tracetorch.flops.core_ops`.  GELU uses TinyTorch's
approximation ``x * sigmoid(1.702 * x)``.

Example::

    >>> relu(Tensor([-1.0, 2.0])).data
    array([0., 2.], dtype=float32)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tracetorch.flops.core_ops import (
    GATHER,
    GELU,
    LOG_SOFTMAX,
    RELU,
    SIGMOID,
    SOFTMAX,
    TANH,
    cross_entropy_backward_flops,
    cross_entropy_flops,
)

from . import autograd as _ag
from .autograd import Node
from .tensor import Tensor

__all__ = (
    "relu",
    "sigmoid",
    "tanh",
    "gelu",
    "softmax",
    "log_softmax",
    "cross_entropy",
    "embedding",
    "as_index",
)

_wrap = Tensor._wrap
_from_op = Tensor._from_op


def _stable_sigmoid(x: np.ndarray) -> np.ndarray:
    # exp(-|x|) never overflows; pick the algebraically equal branch per sign.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def relu(a: Tensor) -> Tensor:
    """``max(a, 0)`` elementwise."""
    ad = a.data
    out = np.maximum(ad, 0)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("relu", RELU.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:
        flops = RELU.backward * out.size
        return _from_op(out, Node((a,), lambda g: (g * (ad > 0),), "relu", tag, False, flops))
    return _wrap(out)


def sigmoid(a: Tensor) -> Tensor:
    """``1 / (1 + exp(-a))`` elementwise, computed without overflow."""
    out = _stable_sigmoid(a.data)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("sigmoid", SIGMOID.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:

        def backward(g: np.ndarray) -> tuple:
            return (g * out * (1.0 - out),)

        flops = SIGMOID.backward * out.size
        return _from_op(out, Node((a,), backward, "sigmoid", tag, False, flops))
    return _wrap(out)


def tanh(a: Tensor) -> Tensor:
    """Hyperbolic tangent elementwise."""
    out = np.tanh(a.data)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("tanh", TANH.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:

        def backward(g: np.ndarray) -> tuple:
            return (g * (1.0 - out * out),)

        return _from_op(out, Node((a,), backward, "tanh", tag, False, TANH.backward * out.size))
    return _wrap(out)


def gelu(a: Tensor) -> Tensor:
    """GELU as ``x * sigmoid(1.702 x)`` (TinyTorch's approximation)."""
    ad = a.data
    s = _stable_sigmoid(1.702 * ad)
    out = ad * s
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("gelu", GELU.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:

        def backward(g: np.ndarray) -> tuple:
            return (g * (s * (1.0 + 1.702 * ad * (1.0 - s))),)

        return _from_op(out, Node((a,), backward, "gelu", tag, False, GELU.backward * out.size))
    return _wrap(out)


def softmax(a: Tensor, dim: int = -1) -> Tensor:
    """Softmax along ``dim`` (max-shifted for stability)."""
    ad = a.data
    z = np.exp(ad - ad.max(axis=dim, keepdims=True))
    out = z / z.sum(axis=dim, keepdims=True)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("softmax", SOFTMAX.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:

        def backward(g: np.ndarray) -> tuple:
            return (out * (g - (g * out).sum(axis=dim, keepdims=True)),)

        flops = SOFTMAX.backward * out.size
        return _from_op(out, Node((a,), backward, "softmax", tag, False, flops))
    return _wrap(out)


def log_softmax(a: Tensor, dim: int = -1) -> Tensor:
    """``log(softmax(a))`` along ``dim``, computed stably."""
    ad = a.data
    shifted = ad - ad.max(axis=dim, keepdims=True)
    out = shifted - np.log(np.exp(shifted).sum(axis=dim, keepdims=True))
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("log_softmax", LOG_SOFTMAX.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:

        def backward(g: np.ndarray) -> tuple:
            return (g - np.exp(out) * g.sum(axis=dim, keepdims=True),)

        flops = LOG_SOFTMAX.backward * out.size
        return _from_op(out, Node((a,), backward, "log_softmax", tag, False, flops))
    return _wrap(out)


def as_index(x: Any, op: str, upper: int) -> np.ndarray:
    """Integer array from ids given as ints, integral floats (TinyTorch's float32 Tensors)
    or a Tensor; every id must lie in ``[0, upper)``."""
    arr = x.data if isinstance(x, Tensor) else np.asarray(x)
    if arr.dtype.kind == "f":
        ids = arr.astype(np.int64)
        if not np.array_equal(ids, arr):
            raise ValueError(f"{op}: indices must be whole numbers, got non-integral values")
        arr = ids
    elif arr.dtype.kind not in "iu":
        raise TypeError(f"{op}: indices must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= upper):
        raise IndexError(
            f"{op}: index out of range [0, {upper}): got min {arr.min()}, max {arr.max()}"
        )
    return arr


def cross_entropy(logits: Tensor, targets: Any) -> Tensor:
    """Mean negative log-likelihood of integer ``targets`` (N,) under ``logits`` (N, C).

    Example::

        >>> cross_entropy(Tensor(np.zeros((2, 4))), np.array([0, 3])).item()  # log(4)
        1.3862943649291992
    """
    ld = logits.data
    if ld.ndim != 2:
        raise ValueError(f"cross_entropy: expected logits of shape (N, C), got {ld.shape}")
    n, c = ld.shape
    t = as_index(targets, "cross_entropy", c)
    if t.shape != (n,):
        raise ValueError(
            f"cross_entropy: targets must have shape ({n},) for logits {ld.shape}, "
            f"got {t.shape}"
        )
    shifted = ld - ld.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    rows = np.arange(n)
    out = np.asarray(-logp[rows, t].mean(), dtype=ld.dtype)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("cross_entropy", cross_entropy_flops(n, c), False)
    if logits.requires_grad and _ag._grad_enabled:

        def backward(g: np.ndarray) -> tuple:
            grad = np.exp(logp)
            grad[rows, t] -= 1.0
            return (grad * (g / n),)

        flops = cross_entropy_backward_flops(n, c)
        return _from_op(out, Node((logits,), backward, "cross_entropy", tag, False, flops))
    return _wrap(out)


def embedding(weight: Tensor, indices: Any) -> Tensor:
    """Rows of ``weight`` (V, D) picked by integer ``indices`` of any shape -> shape + (D,)."""
    wd = weight.data
    idx = as_index(indices, "embedding", wd.shape[0])
    out = wd[idx]
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("embedding", GATHER.forward * out.size, False)
    if weight.requires_grad and _ag._grad_enabled:

        def backward(g: np.ndarray) -> tuple:
            grad = np.zeros_like(wd, dtype=g.dtype)
            # add.at accumulates repeated ids (plain fancy assignment would drop them)
            np.add.at(grad, idx.ravel(), g.reshape(-1, wd.shape[1]))
            return (grad,)

        flops = GATHER.backward * out.size
        return _from_op(out, Node((weight,), backward, "embedding", tag, False, flops))
    return _wrap(out)
