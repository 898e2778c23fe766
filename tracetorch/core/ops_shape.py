"""Shape ops: reshape, transpose, permute and indexing.

reshape/transpose/permute move no arithmetic (0 FLOPs forward and backward, still
reported to the observer so the op is visible).  ``getitem`` costs 0 forward and ``n``
(output elements) backward: the scatter-add of the gradient into the input's shape (costs
from :mod:`tracetorch.flops.core_ops`).

Example::

    >>> t = Tensor(np.arange(6.0))
    >>> t.reshape(2, -1).transpose().shape, t[1:3].data
    ((3, 2), array([1., 2.], dtype=float32))
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tracetorch.flops.core_ops import GATHER, VIEW

from . import autograd as _ag
from .autograd import Node
from .tensor import Tensor

__all__ = ("reshape", "transpose", "permute", "getitem")


def reshape(a: Tensor, shape: Any) -> Tensor:
    """View ``a`` with a new shape (one entry may be -1)."""
    ad = a.data
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    try:
        out = ad.reshape(shape)
    except ValueError:
        raise ValueError(
            f"reshape: cannot reshape a tensor of shape {ad.shape} ({ad.size} elements) "
            f"into shape {shape}"
        ) from None
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("reshape", VIEW.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:
        in_shape = ad.shape
        flops = VIEW.backward * out.size
        return Tensor._from_op(
            out, Node((a,), lambda g: (g.reshape(in_shape),), "reshape", tag, False, flops)
        )
    return Tensor._wrap(out)


def _dim(d: int, ndim: int, op: str) -> int:
    if not -ndim <= d < ndim:
        raise ValueError(f"{op}: dimension {d} is out of range for a tensor with {ndim} dims")
    return d % ndim


def transpose(a: Tensor, dim0: int | None = None, dim1: int | None = None) -> Tensor:
    """Swap ``dim0`` and ``dim1`` (default: the last two; a 0-D/1-D tensor is unchanged)."""
    ad = a.data
    if dim0 is None and dim1 is None:
        if ad.ndim < 2:
            d0 = d1 = 0
        else:
            d0, d1 = ad.ndim - 2, ad.ndim - 1
    elif dim0 is None or dim1 is None:
        raise ValueError("transpose: give both dim0 and dim1, or neither")
    else:
        d0, d1 = _dim(dim0, ad.ndim, "transpose"), _dim(dim1, ad.ndim, "transpose")
    out = np.swapaxes(ad, d0, d1) if ad.ndim >= 2 else ad
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("transpose", VIEW.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:
        flops = VIEW.backward * out.size
        if ad.ndim < 2:
            return Tensor._from_op(out, Node((a,), lambda g: (g,), "transpose", tag, False, flops))
        return Tensor._from_op(
            out,
            Node((a,), lambda g: (np.swapaxes(g, d0, d1),), "transpose", tag, False, flops),
        )
    return Tensor._wrap(out)


def permute(a: Tensor, dims: Any) -> Tensor:
    """Reorder all dimensions, e.g. ``permute(x, (0, 2, 1, 3))``."""
    ad = a.data
    dims = tuple(_dim(int(d), ad.ndim, "permute") for d in dims)
    if sorted(dims) != list(range(ad.ndim)):
        raise ValueError(f"permute: {dims} is not a permutation of the {ad.ndim} dims")
    out = ad.transpose(dims)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("permute", VIEW.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:
        inverse = tuple(np.argsort(dims))
        flops = VIEW.backward * out.size
        return Tensor._from_op(
            out, Node((a,), lambda g: (g.transpose(inverse),), "permute", tag, False, flops)
        )
    return Tensor._wrap(out)


def _plain_index(index: Any) -> Any:
    """Replace Tensors inside an index by integer/bool arrays numpy understands."""
    if isinstance(index, Tensor):
        data = index.data
        return data if data.dtype.kind in "biu" else data.astype(np.int64)
    if isinstance(index, tuple):
        return tuple(_plain_index(i) for i in index)
    return index


def _has_int_array(index: Any) -> bool:
    """True when an integer array/list appears: repeated positions then need np.add.at."""
    items = index if isinstance(index, tuple) else (index,)
    for item in items:
        if isinstance(item, (list, np.ndarray)) and np.asarray(item).dtype.kind != "b":
            return True
    return False


def getitem(a: Tensor, index: Any) -> Tensor:
    """``a[index]`` with numpy basic or advanced indexing."""
    ad = a.data
    index = _plain_index(index)
    out = ad[index]
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("getitem", GATHER.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:
        scatter = _has_int_array(index)

        def backward(g: np.ndarray) -> tuple:
            grad = np.zeros(ad.shape, dtype=g.dtype)
            if scatter:
                np.add.at(grad, index, g)
            else:  # basic slicing/bool masks select each element at most once
                grad[index] = g
            return (grad,)

        flops = GATHER.backward * out.size
        return Tensor._from_op(out, Node((a,), backward, "getitem", tag, False, flops))
    return Tensor._wrap(out)
