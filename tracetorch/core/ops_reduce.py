"""Reductions: sum, mean, max over an axis (int, tuple or None) with ``keepdims``.

FLOPs (:mod:`tracetorch.flops.core_ops`): forward = input size, backward = input size (the
gradient is spread back over every input element).  ``max`` splits the gradient evenly
between tied maxima.

Example::

    >>> t = Tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> t.sum(axis=0).data, t.mean().item(), t.max(axis=1, keepdims=True).shape
    (array([4., 6.], dtype=float32), 2.5, (2, 1))
"""
from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from tracetorch.flops.core_ops import REDUCTION

from . import autograd as _ag
from .autograd import Node
from .tensor import Tensor

__all__ = ("sum", "mean", "max", "normalize_axes")


def normalize_axes(axis: Any, ndim: int, op: str = "reduction") -> tuple | None:
    """Turn ``axis`` (None, int, or sequence; negatives allowed) into a sorted tuple."""
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for ax in axes:
        if not -ndim <= ax < builtins.max(ndim, 1):
            raise ValueError(f"{op}: axis {ax} is out of range for a tensor with {ndim} dims")
        out.append(int(ax) % builtins.max(ndim, 1))
    return tuple(sorted(set(out)))


def _expand(g: np.ndarray, axes: tuple | None, keepdims: bool, shape: tuple) -> np.ndarray:
    """Broadcast a reduced gradient back to the input's shape (a read-only view)."""
    if axes is None:
        g = np.reshape(g, (1,) * len(shape)) if not keepdims else g
    elif not keepdims:
        g = np.expand_dims(g, axes)
    return np.broadcast_to(g, shape)


def sum(a: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Sum of elements over ``axis`` (all when None)."""
    ad = a.data
    axes = normalize_axes(axis, ad.ndim, "sum")
    out = np.sum(ad, axis=axes, keepdims=keepdims)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("sum", REDUCTION.forward * ad.size, False)
    if a.requires_grad and _ag._grad_enabled:
        shape = ad.shape

        def backward(g: np.ndarray) -> tuple:
            return (_expand(g, axes, keepdims, shape),)

        flops = REDUCTION.backward * ad.size
        return Tensor._from_op(out, Node((a,), backward, "sum", tag, False, flops))
    return Tensor._wrap(out)


def mean(a: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Mean of elements over ``axis`` (all when None)."""
    ad = a.data
    axes = normalize_axes(axis, ad.ndim, "mean")
    out = np.mean(ad, axis=axes, keepdims=keepdims)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("mean", REDUCTION.forward * ad.size, False)
    if a.requires_grad and _ag._grad_enabled:
        shape = ad.shape
        count = ad.size // builtins.max(int(np.size(out)), 1)
        scale = 1.0 / builtins.max(count, 1)

        def backward(g: np.ndarray) -> tuple:
            return (_expand(g * scale, axes, keepdims, shape),)

        flops = REDUCTION.backward * ad.size
        return Tensor._from_op(out, Node((a,), backward, "mean", tag, False, flops))
    return Tensor._wrap(out)


def max(a: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Maximum over ``axis`` (all when None); ties share the gradient equally."""
    ad = a.data
    axes = normalize_axes(axis, ad.ndim, "max")
    kept = np.max(ad, axis=axes, keepdims=True)
    out = kept if keepdims else (kept.reshape(()) if axes is None else np.squeeze(kept, axes))
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("max", REDUCTION.forward * ad.size, False)
    if a.requires_grad and _ag._grad_enabled:

        def backward(g: np.ndarray) -> tuple:
            hit = ad == kept
            share = hit / np.sum(hit, axis=axes, keepdims=True)
            gk = g if keepdims else np.reshape(g, kept.shape)
            return ((share * gk).astype(ad.dtype, copy=False),)

        flops = REDUCTION.backward * ad.size
        return Tensor._from_op(out, Node((a,), backward, "max", tag, False, flops))
    return Tensor._wrap(out)
