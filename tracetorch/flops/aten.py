"""FLOPs of the aten operations a backward pass runs: products, convolutions, attention kernels.

These are what ``torch.utils.flop_counter`` counts, so tracetorch's backward totals agree with
``FlopCounterMode``; every other operation counts 0. Keys are aten overload packets
(``torch.ops.aten.mm``): a ``TorchDispatchMode`` receives an overload (``aten.mm.default``), whose
``overloadpacket`` is looked up. FLOPs = 2 x MACs, as everywhere in tracetorch:

==========================================  ================================================
``mm``, ``addmm``, ``bmm``, ``baddbmm``      2·(batch)·M·K·N (an added input is not counted)
``convolution`` and its backend variants     as ``torch_functions.conv_flops``
``convolution_backward``                     the input gradient (a transposed convolution of
                                             the output gradient) and the weight gradient (the
                                             input convolved with the output gradient), as
                                             requested
attention forward kernels                    q·kᵀ and scores·v
attention backward kernels                   scores recomputed, then dS, dV, dQ, dK:
                                             2·batch·L·S·(3·E + 2·E_v)
==========================================  ================================================

Example:
    >>> import torch
    >>> backward_flops(torch.ops.aten.mm.default, (torch.zeros(2, 3), torch.zeros(3, 4)), {}, None)
    48
"""
from __future__ import annotations

from math import prod
from typing import Any, Callable

import torch

from tracetorch.flops.torch_functions import Shape, conv_flops, sdpa_flops

__all__ = ("BACKWARD_FORMULAS", "backward_flops")

_aten = torch.ops.aten


def _s(value: Any) -> Shape:
    return tuple(value.shape)


def _t(shape: Shape) -> Shape:
    return (shape[1], shape[0]) + tuple(shape[2:])


def _mm(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    a, b = _s(args[0]), _s(args[1])
    return 2 * a[0] * a[1] * b[1]


def _addmm(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    return _mm(args[1:], kwargs, out)


def _bmm(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    a, b = _s(args[0]), _s(args[1])
    return 2 * a[0] * a[1] * a[2] * b[2]


def _baddbmm(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    return _bmm(args[1:], kwargs, out)


def _convolution(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    x, w, transposed = _s(args[0]), _s(args[1]), bool(args[6])
    return conv_flops(x, w, _s(out), transposed)


def _conv_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    grad_out, x, w = _s(args[0]), _s(args[1]), _s(args[2])
    transposed, mask = bool(args[7]), args[10]
    flops = 0
    if mask[0] and out[0] is not None:  # grad_input: the transposed convolution of grad_out
        flops += conv_flops(grad_out, w, _s(out[0]), not transposed)
    if mask[1] and out[1] is not None:  # grad_weight: a convolution of the input by grad_out
        grad_w = _t(_s(out[1]))
        if transposed:
            flops += conv_flops(_t(grad_out), _t(x), grad_w, False)
        else:
            flops += conv_flops(_t(x), _t(grad_out), grad_w, False)
    return flops


def _sdpa(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    return sdpa_flops(_s(args[0]), _s(args[1]), _s(args[2]))


def _sdpa_backward_count(q: Shape, k: Shape, v: Shape) -> int:
    # Scores recomputed (q·kᵀ), then d(scores) = dO·vᵀ, dV = Pᵀ·dO, dQ = dS·k, dK = dSᵀ·q.
    return 2 * prod(q[:-2]) * q[-2] * k[-2] * (3 * q[-1] + 2 * v[-1])


def _sdpa_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    return _sdpa_backward_count(_s(args[1]), _s(args[2]), _s(args[3]))


def _bshd(shape: Shape) -> Shape:
    # The raw flash/efficient kernels take (batch, sequence, heads, dim).
    return (shape[0], shape[2], shape[1], shape[3])


def _raw_attention(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    return sdpa_flops(_bshd(_s(args[0])), _bshd(_s(args[1])), _bshd(_s(args[2])))


def _raw_attention_backward(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    return _sdpa_backward_count(_bshd(_s(args[1])), _bshd(_s(args[2])), _bshd(_s(args[3])))


def _packets(*names: str) -> list[Any]:
    return [getattr(_aten, n) for n in names if hasattr(_aten, n)]


#: FLOP formulas by aten overload packet, for the operations a backward pass runs.
BACKWARD_FORMULAS: dict[Any, Callable[[tuple[Any, ...], dict[str, Any], Any], int]] = {}
for _names, _formula in (
        (("mm",), _mm), (("addmm",), _addmm), (("bmm",), _bmm), (("baddbmm",), _baddbmm),
        (("convolution", "_convolution", "cudnn_convolution", "convolution_overrideable",
          "_slow_conv2d_forward"), _convolution),
        (("convolution_backward",), _conv_backward),
        (("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
          "_scaled_dot_product_cudnn_attention",
          "_scaled_dot_product_flash_attention_for_cpu"), _sdpa),
        (("_scaled_dot_product_efficient_attention_backward",
          "_scaled_dot_product_flash_attention_backward",
          "_scaled_dot_product_cudnn_attention_backward",
          "_scaled_dot_product_flash_attention_for_cpu_backward"), _sdpa_backward),
        (("_flash_attention_forward", "_efficient_attention_forward"), _raw_attention),
        (("_flash_attention_backward", "_efficient_attention_backward"),
         _raw_attention_backward)):
    for _op in _packets(*_names):
        BACKWARD_FORMULAS[_op] = _formula


def backward_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """FLOPs of one aten operation (0 for operations without a formula, or arguments a formula
    cannot read).

    Example:
        >>> import torch
        >>> x, w = torch.zeros(1, 3, 8, 8), torch.zeros(16, 3, 3, 3)
        >>> out = torch.ops.aten.convolution.default(x, w, None, [1, 1], [0, 0], [1, 1],
        ...                                          False, [0, 0], 1)
        >>> backward_flops(torch.ops.aten.convolution.default,
        ...                (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), {}, out)
        31104
    """
    formula = BACKWARD_FORMULAS.get(getattr(func, "overloadpacket", None))
    if formula is None:
        return 0
    try:
        return int(formula(args, kwargs, out))
    except Exception:  # an unusual call is not worth breaking the backward pass for
        return 0
