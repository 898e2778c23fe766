"""Elementwise arithmetic ops: add, sub, mul, div, neg, pow, exp, log, sqrt, masked_fill.

Each op follows the same pattern: compute with numpy, report to the op observer (only if
one is installed), and record a graph node only when an input requires grad.  Binary ops
broadcast like numpy; their backward sums gradients back to each input's shape
(``unbroadcast``).  FLOP costs come from :mod:`tracetorch.flops.core_ops`.

Example::

    >>> from tracetorch.core.ops_math import add
    >>> add(Tensor([1.0, 2.0]), 1.0).data
    array([2., 3.], dtype=float32)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tracetorch.flops.core_ops import (
    ADD,
    DIV,
    EXP,
    LOG,
    MASKED_FILL,
    MUL,
    NEG,
    POW,
    SQRT,
    SUB,
    binary_backward_flops,
    grad_input_flops,
)

from . import autograd as _ag
from .autograd import Node, unbroadcast
from .tensor import Tensor

__all__ = (
    "add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "masked_fill",
)

_wrap = Tensor._wrap
_from_op = Tensor._from_op


def _operand(x: Any, dtype: np.dtype) -> np.ndarray | float | int:
    """Data of a non-Tensor operand: Python numbers stay weakly typed (keep float32),
    everything else becomes an array of the Tensor operand's float dtype."""
    if type(x) is float or type(x) is int:
        return x
    arr = np.asarray(x)
    if dtype.kind == "f" and arr.dtype != dtype:
        arr = arr.astype(dtype)
    return arr


def _binary(a: Any, b: Any) -> tuple:
    """(a_data, b_data, a_tensor_or_None, b_tensor_or_None); at least one is a Tensor."""
    if isinstance(a, Tensor):
        ad = a.data
        if isinstance(b, Tensor):
            return ad, b.data, a, b
        return ad, _operand(b, ad.dtype), a, None
    bd = b.data
    return _operand(a, bd.dtype), bd, None, b


def _shape(x: Any) -> tuple:
    return x.shape if type(x) is np.ndarray else ()


def _broadcast_error(name: str, ad: Any, bd: Any) -> ValueError:
    return ValueError(
        f"{name}: cannot broadcast shapes {np.shape(ad)} and {np.shape(bd)} together"
    )


def _needs(t: Tensor | None) -> bool:
    return t is not None and t.requires_grad


def add(a: Any, b: Any) -> Tensor:
    """``a + b`` with broadcasting; either side may be a number or array."""
    ad, bd, ta, tb = _binary(a, b)
    try:
        out = ad + bd
    except ValueError:
        raise _broadcast_error("add", ad, bd) from None
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("add", ADD.forward * out.size, False)
    ra, rb = _needs(ta), _needs(tb)
    if (ra or rb) and _ag._grad_enabled:
        sa, sb = _shape(ad), _shape(bd)

        def backward(g: np.ndarray) -> tuple:
            return (unbroadcast(g, sa) if ra else None, unbroadcast(g, sb) if rb else None)

        flops = binary_backward_flops(ADD.backward, out.size, ra, sa, rb, sb)
        return _from_op(out, Node((ta, tb), backward, "add", tag, False, flops))
    return _wrap(out)


def sub(a: Any, b: Any) -> Tensor:
    """``a - b`` with broadcasting."""
    ad, bd, ta, tb = _binary(a, b)
    try:
        out = ad - bd
    except ValueError:
        raise _broadcast_error("sub", ad, bd) from None
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("sub", SUB.forward * out.size, False)
    ra, rb = _needs(ta), _needs(tb)
    if (ra or rb) and _ag._grad_enabled:
        sa, sb = _shape(ad), _shape(bd)

        def backward(g: np.ndarray) -> tuple:
            return (unbroadcast(g, sa) if ra else None, unbroadcast(-g, sb) if rb else None)

        flops = binary_backward_flops(SUB.backward, out.size, ra, sa, rb, sb)
        return _from_op(out, Node((ta, tb), backward, "sub", tag, False, flops))
    return _wrap(out)


def mul(a: Any, b: Any) -> Tensor:
    """``a * b`` with broadcasting."""
    ad, bd, ta, tb = _binary(a, b)
    try:
        out = ad * bd
    except ValueError:
        raise _broadcast_error("mul", ad, bd) from None
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("mul", MUL.forward * out.size, False)
    ra, rb = _needs(ta), _needs(tb)
    if (ra or rb) and _ag._grad_enabled:
        sa, sb = _shape(ad), _shape(bd)

        def backward(g: np.ndarray) -> tuple:
            return (
                unbroadcast(g * bd, sa) if ra else None,
                unbroadcast(g * ad, sb) if rb else None,
            )

        flops = binary_backward_flops(MUL.backward, out.size, ra, sa, rb, sb)
        return _from_op(out, Node((ta, tb), backward, "mul", tag, False, flops))
    return _wrap(out)


def div(a: Any, b: Any) -> Tensor:
    """``a / b`` with broadcasting."""
    ad, bd, ta, tb = _binary(a, b)
    try:
        out = ad / bd
    except ValueError:
        raise _broadcast_error("div", ad, bd) from None
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("div", DIV.forward * out.size, False)
    ra, rb = _needs(ta), _needs(tb)
    if (ra or rb) and _ag._grad_enabled:
        sa, sb = _shape(ad), _shape(bd)

        def backward(g: np.ndarray) -> tuple:
            # d(a/b)/db = -a/b^2 = -out/b, reusing the forward result.
            return (
                unbroadcast(g / bd, sa) if ra else None,
                unbroadcast(-(g * out) / bd, sb) if rb else None,
            )

        flops = binary_backward_flops(DIV.backward, out.size, ra, sa, rb, sb)
        return _from_op(out, Node((ta, tb), backward, "div", tag, False, flops))
    return _wrap(out)


def neg(a: Tensor) -> Tensor:
    """``-a``."""
    out = -a.data
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("neg", NEG.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:
        flops = NEG.backward * out.size
        return _from_op(out, Node((a,), lambda g: (-g,), "neg", tag, False, flops))
    return _wrap(out)


def pow(a: Tensor, exponent: float) -> Tensor:
    """``a ** exponent`` for a number ``exponent``."""
    if not isinstance(exponent, (int, float, np.number)):
        raise TypeError(f"pow: exponent must be a number, got {type(exponent).__name__}")
    p = float(exponent)
    ad = a.data
    out = ad**p
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("pow", POW.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:

        def backward(g: np.ndarray) -> tuple:
            return (g * (p * ad ** (p - 1.0)),)

        return _from_op(out, Node((a,), backward, "pow", tag, False, POW.backward * out.size))
    return _wrap(out)


def exp(a: Tensor) -> Tensor:
    """Elementwise ``e ** a``."""
    out = np.exp(a.data)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("exp", EXP.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:
        flops = EXP.backward * out.size
        return _from_op(out, Node((a,), lambda g: (g * out,), "exp", tag, False, flops))
    return _wrap(out)


def log(a: Tensor) -> Tensor:
    """Elementwise natural logarithm."""
    ad = a.data
    out = np.log(ad)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("log", LOG.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:
        flops = LOG.backward * out.size
        return _from_op(out, Node((a,), lambda g: (g / ad,), "log", tag, False, flops))
    return _wrap(out)


def sqrt(a: Tensor) -> Tensor:
    """Elementwise square root."""
    out = np.sqrt(a.data)
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("sqrt", SQRT.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:

        def backward(g: np.ndarray) -> tuple:
            return (g / (2.0 * out),)

        return _from_op(out, Node((a,), backward, "sqrt", tag, False, SQRT.backward * out.size))
    return _wrap(out)


def masked_fill(a: Tensor, mask: Any, value: float) -> Tensor:
    """Entries of ``a`` where ``mask`` (broadcastable, truthy) holds become ``value``.

    Example::

        >>> masked_fill(Tensor([1.0, 2.0]), np.array([True, False]), 0.0).data
        array([0., 2.], dtype=float32)
    """
    mask = np.asarray(mask.data if isinstance(mask, Tensor) else mask, dtype=bool)
    ad = a.data
    try:
        out = np.where(mask, float(value), ad).astype(ad.dtype, copy=False)
    except ValueError:
        raise _broadcast_error("masked_fill", ad, mask) from None
    tag = None
    if _ag._observer is not None:
        tag = _ag._observer.forward_op("masked_fill", MASKED_FILL.forward * out.size, False)
    if a.requires_grad and _ag._grad_enabled:
        shape = ad.shape

        def backward(g: np.ndarray) -> tuple:
            return (unbroadcast(np.where(mask, 0.0, g).astype(g.dtype, copy=False), shape),)

        flops = grad_input_flops(MASKED_FILL.backward, out.size, shape)
        return _from_op(out, Node((a,), backward, "masked_fill", tag, False, flops))
    return _wrap(out)
