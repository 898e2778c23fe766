"""Matrix multiplication (``@``) with numpy's broadcasting rules and a fast path for weights.

FLOPs (:mod:`tracetorch.flops.core_ops`): forward ``2 * out.size * k`` (= 2*B*m*k*n), gemm;
backward the same per input that requires grad, plus broadcast-reduction adds when a batch
dimension was broadcast.

The common layer case -- an N-D input times a 2-D weight -- is run as one 2-D GEMM on the
flattened leading dims, forward and backward, so the weight gradient is a single
``x2d.T @ g2d`` (no per-batch products summed afterwards).

Example::

    >>> matmul(Tensor(np.ones((2, 3))), Tensor(np.ones((3, 4)))).shape
    (2, 4)
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from tracetorch.flops.core_ops import broadcast_adds, gemm_backward_flops, gemm_flops

from . import autograd as _ag
from .autograd import Node, unbroadcast
from .ops_math import _binary
from .tensor import Tensor

__all__ = ("matmul",)

Backward = Callable[[np.ndarray], tuple]


def _check(ad: np.ndarray, bd: np.ndarray) -> None:
    if ad.ndim == 0 or bd.ndim == 0:
        raise ValueError(
            f"matmul: operands must have at least 1 dimension, got shapes {ad.shape} and "
            f"{bd.shape} (use * to scale by a number)"
        )
    k_left = ad.shape[-1]
    k_right = bd.shape[-2] if bd.ndim >= 2 else bd.shape[0]
    if k_left != k_right:
        raise ValueError(
            f"matmul: shapes {ad.shape} and {bd.shape} are not aligned: last dimension of "
            f"the left operand ({k_left}) != {'second-to-last' if bd.ndim >= 2 else 'only'} "
            f"dimension of the right operand ({k_right})"
        )


def matmul(a: Any, b: Any) -> Tensor:
    """Matrix product ``a @ b`` (1-D operands, batches and broadcasting as in numpy).

    Example::

        >>> x = Tensor(np.ones((5, 2, 3)), requires_grad=True)
        >>> w = Tensor(np.ones((3, 4)), requires_grad=True)
        >>> (x @ w).shape
        (5, 2, 4)
    """
    ad, bd, ta, tb = _binary(a, b)
    if type(ad) is not np.ndarray or type(bd) is not np.ndarray:  # a Python number
        ad, bd = np.asarray(ad), np.asarray(bd)
    _check(ad, bd)
    k = ad.shape[-1]
    # Fast path: stack all leading dims of ``a`` into rows of one GEMM.
    flat = bd.ndim == 2 and ad.ndim > 2
    if flat:
        out = (ad.reshape(-1, k) @ bd).reshape(ad.shape[:-1] + (bd.shape[1],))
    else:
        try:
            out = ad @ bd
        except ValueError:
            raise ValueError(
                f"matmul: batch dimensions of shapes {ad.shape} and {bd.shape} cannot be "
                "broadcast together"
            ) from None
    ra = ta is not None and ta.requires_grad
    rb = tb is not None and tb.requires_grad
    grad = (ra or rb) and _ag._grad_enabled
    observer = _ag._observer
    if observer is None and not grad:
        return Tensor._wrap(out)  # nobody needs the cost: plain inference pays nothing for it
    flops = gemm_flops(out.size if type(out) is np.ndarray else 1, k)
    tag = None if observer is None else observer.forward_op("matmul", flops, True)
    if not grad:
        return Tensor._wrap(out)
    if flat or (ad.ndim == 2 and bd.ndim == 2):
        backward = _backward_2d(ad, bd, ra, rb)
        bflops = gemm_backward_flops(flops, ra + rb)
    else:
        backward, adds = _backward_general(ad, bd, ra, rb)
        bflops = gemm_backward_flops(flops, ra + rb, adds)
    return Tensor._from_op(out, Node((ta, tb), backward, "matmul", tag, True, bflops))


def _backward_2d(ad: np.ndarray, bd: np.ndarray, ra: bool, rb: bool) -> Backward:
    """Backward for (rows..., k) @ (k, n): two plain GEMMs on 2-D views."""
    a_shape = ad.shape
    k = a_shape[-1]

    def backward(g: np.ndarray) -> tuple:
        g2 = g.reshape(-1, g.shape[-1])
        ga = (g2 @ bd.T).reshape(a_shape) if ra else None
        gb = ad.reshape(-1, k).T @ g2 if rb else None
        return ga, gb

    return backward


def _backward_general(ad: np.ndarray, bd: np.ndarray, ra: bool,
                      rb: bool) -> tuple[Backward, int]:
    """Backward for batched/broadcast/1-D operands; returns (closure, reduction adds)."""
    # Promote 1-D operands to matrices so one formula covers every case.
    a2 = ad[None, :] if ad.ndim == 1 else ad
    b2 = bd[:, None] if bd.ndim == 1 else bd
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    g_shape = batch + (a2.shape[-2], b2.shape[-1])
    adds = 0
    if ra:
        adds += broadcast_adds(math.prod(batch + a2.shape[-2:]), a2.shape)
    if rb:
        adds += broadcast_adds(math.prod(batch + b2.shape[-2:]), b2.shape)

    def backward(g: np.ndarray) -> tuple:
        g2 = g.reshape(g_shape)
        ga = gb = None
        if ra:
            ga = unbroadcast(g2 @ np.swapaxes(b2, -1, -2), a2.shape).reshape(ad.shape)
        if rb:
            gb = unbroadcast(np.swapaxes(a2, -1, -2) @ g2, b2.shape).reshape(bd.shape)
        return ga, gb

    return backward, adds
