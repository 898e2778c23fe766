"""FLOPs of the functions behind ``torch.nn``'s pooling, resampling, bag and weight-norm layers,
where a ``forward`` calls them itself (``F.max_pool2d``, ``F.adaptive_avg_pool2d``,
``F.interpolate``, ``F.grid_sample``, ``F.embedding_bag``, ``F.normalize``,
``torch._weight_norm``): each costs what its layer's rule (:mod:`tracetorch.flops.torch_rules`)
counts for the same call, by the shape formulas below, which the rules use too.

==========================================  =================================================
pooling (max, average, LP, fractional)       one comparison or add per window element per
                                             output element
adaptive pooling                             the same, the window ⌈input/output⌉ per dimension
interpolation, ``grid_sample``               per output element: nearest 0, linear 3, bilinear
                                             7, trilinear 15, bicubic 31; ``area`` as adaptive
                                             average pooling
``embedding_bag``                            one add (sum, mean) or comparison (max) per looked-
                                             up element, a multiply more with per-sample
                                             weights, a divide per output element for mean
``normalize``                                3 per input element (square and add for the norm,
                                             divide)
``_weight_norm`` (old-style ``weight_norm``)  3 per element of v, 2 per element of g
==========================================  =================================================

Example:
    >>> window_flops(outputs=16, kernel=(2, 2))
    64
    >>> interpolation_flops("bilinear", (4, 4), (8, 8), output_elements=64)
    448
"""
from __future__ import annotations

from collections.abc import Sequence
from math import ceil, prod
from typing import Any, Callable

__all__ = ("INTERPOLATION_PER_OUTPUT", "window_flops", "adaptive_window", "interpolation_flops",
           "embedding_bag_flops", "weight_norm_flops", "layer_function_table")

#: FLOPs per output element of each interpolation mode (2^d multiplies and 2^d−1 adds for the
#: (bi/tri)linear ones, 31 for bicubic's 16 taps); nearest, nearest-exact: 0.
INTERPOLATION_PER_OUTPUT = {"linear": 3, "bilinear": 7, "trilinear": 15, "bicubic": 31}

Shape = Sequence[int]
CallFormula = Callable[[tuple[Any, ...], dict[str, Any], Any], int]


def window_flops(outputs: int, kernel: Shape) -> int:
    """Pooling: one comparison or add per window element per output element.

    Example:
        >>> window_flops(10, (3, 3))
        90
    """
    return outputs * prod(kernel)


def adaptive_window(inputs: Shape, outputs: Shape) -> int:
    """The window of adaptive pooling from ``inputs`` to ``outputs`` (the pooled dimensions):
    about input/output elements per dimension, rounded up.

    Example:
        >>> adaptive_window((7, 7), (1, 1)), adaptive_window((5,), (2,))
        (49, 3)
    """
    return prod(ceil(size / max(out, 1)) for size, out in zip(inputs, outputs))


def interpolation_flops(mode: str, inputs: Shape, outputs: Shape, output_elements: int) -> int:
    """Interpolation from the spatial shape ``inputs`` to ``outputs`` (``output_elements`` in
    all): per output element as :data:`INTERPOLATION_PER_OUTPUT` says; ``area`` is adaptive
    average pooling.

    Example:
        >>> interpolation_flops("area", (8, 8), (4, 4), 32)
        128
        >>> interpolation_flops("nearest", (2,), (4,), 4)
        0
    """
    if mode == "area":
        return output_elements * adaptive_window(inputs, outputs)
    return output_elements * INTERPOLATION_PER_OUTPUT.get(mode, 0)


def embedding_bag_flops(looked_up: int, weighted: bool, mode: str, outputs: int) -> int:
    """An embedding bag over ``looked_up`` elements (indices x embedding width).

    Example:
        >>> embedding_bag_flops(24, weighted=True, mode="mean", outputs=6)
        54
    """
    return looked_up * (2 if weighted else 1) + (outputs if mode == "mean" else 0)


def weight_norm_flops(direction: int, magnitude: int) -> int:
    """g·v/‖v‖ over ``direction`` elements of v and ``magnitude`` of g: the norm (square, add),
    a root and a division per norm, the scaling.

    Example:
        >>> weight_norm_flops(12, 4)
        44
    """
    return 3 * direction + 2 * magnitude


# ----------------------------------------------------------------------------- call formulas
def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str,
         default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def _pooled(result: Any) -> Any:
    # A pooling function returns the pooled tensor, or (pooled, indices).
    return result[0] if isinstance(result, (tuple, list)) else result


def _kernel(value: Any, dims: int) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)):
        return tuple(int(size) for size in value)
    return (int(value),) * dims


def _pool(dims: int, kernel_at: int) -> CallFormula:
    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        kernel = _kernel(_arg(args, kwargs, kernel_at, "kernel_size"), dims)
        return window_flops(int(_pooled(result).numel()), kernel)
    return formula


def _adaptive_pool(dims: int) -> CallFormula:
    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        pooled = _pooled(result)
        inputs = tuple(_arg(args, kwargs, 0, "input").shape[-dims:])
        return int(pooled.numel()) * adaptive_window(inputs, tuple(pooled.shape[-dims:]))
    return formula


def _interpolate(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    signal = _arg(args, kwargs, 0, "input")
    mode = _arg(args, kwargs, 3, "mode", "nearest")
    dims = signal.dim() - 2
    return interpolation_flops(mode, tuple(signal.shape[2:]), tuple(result.shape[-dims:]),
                               int(result.numel()))


def _grid_sample(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    # "bilinear" samples a volume trilinearly (a 5-D input).
    mode = _arg(args, kwargs, 2, "mode", "bilinear")
    if mode == "bilinear" and result.dim() == 5:
        mode = "trilinear"
    return interpolation_flops(mode, (), (), int(result.numel()))


def _embedding_bag(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    indices, weight = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")
    weights = _arg(args, kwargs, 8, "per_sample_weights")
    return embedding_bag_flops(int(indices.numel()) * int(weight.shape[-1]), weights is not None,
                               _arg(args, kwargs, 6, "mode", "mean"), int(result.numel()))


def _normalize(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    return 3 * int(_arg(args, kwargs, 0, "input").numel())


def _weight_norm(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    return weight_norm_flops(int(_arg(args, kwargs, 0, "v").numel()),
                             int(_arg(args, kwargs, 1, "g").numel()))


def layer_function_table(torch: Any) -> list[tuple[Any, str, str, CallFormula]]:
    """``(owner, attribute, name, formula)`` for every spelling of the functions above that
    ``torch`` has (pooling in 1-3 dimensions, with and without indices).

    Example:
        >>> import torch
        >>> names = {name for _, _, name, _ in layer_function_table(torch)}
        >>> {"max_pool2d", "interpolate", "embedding_bag"} <= names
        True
    """
    functional = torch.nn.functional
    table: list[tuple[Any, str, str, CallFormula]] = []
    for dims in (1, 2, 3):
        for kind in ("max", "avg"):
            name = f"{kind}_pool{dims}d"
            formula = _pool(dims, kernel_at=1)
            table += [(functional, name, name, formula), (torch, name, name, formula),
                      (functional, name + "_with_indices", name, formula)]
            adaptive = f"adaptive_{kind}_pool{dims}d"
            table += [(functional, adaptive, adaptive, _adaptive_pool(dims)),
                      (torch, adaptive, adaptive, _adaptive_pool(dims)),
                      (functional, adaptive + "_with_indices", adaptive, _adaptive_pool(dims))]
        table.append((functional, f"lp_pool{dims}d", f"lp_pool{dims}d", _pool(dims, kernel_at=2)))
        fractional = f"fractional_max_pool{dims}d"
        table += [(functional, fractional, fractional, _pool(dims, kernel_at=1)),
                  (functional, fractional + "_with_indices", fractional, _pool(dims, kernel_at=1))]
    table += [
        (functional, "interpolate", "interpolate", _interpolate),
        (functional, "upsample", "interpolate", _interpolate),
        (functional, "grid_sample", "grid_sample", _grid_sample),
        (functional, "embedding_bag", "embedding_bag", _embedding_bag),
        (functional, "normalize", "normalize", _normalize),
        (torch, "_weight_norm", "weight_norm", _weight_norm),
    ]
    return table
