"""Finite-difference gradient checking for core ops and layers.

:func:`gradcheck` compares the gradients that ``backward()`` produces with central
differences ``(f(x + eps) - f(x - eps)) / (2 eps)`` of a random projection of the output,
so non-scalar outputs are checked in every direction at once.  Use float64 inputs (and
float64 parameters: :func:`to_float64`) for tight tolerances.

Example::

    >>> x = Tensor(np.random.randn(3, 4), requires_grad=True, dtype=np.float64)
    >>> gradcheck(lambda: (x * x).sum(), [x])
    True
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Callable, TypeVar, Union

import numpy as np

from .autograd import no_grad
from .layers import Module
from .tensor import Tensor

__all__ = ("gradcheck", "numerical_grad", "to_float64")


_Cast = TypeVar("_Cast", bound=Union[Module, Iterable[Tensor]])


def to_float64(module_or_tensors: _Cast) -> _Cast:
    """Cast every parameter of a Module (or each Tensor in a list) to float64, in place."""
    tensors: Iterable[Tensor]
    if isinstance(module_or_tensors, Module):
        tensors = module_or_tensors.parameters()
        for module in module_or_tensors.modules():
            for name, value in vars(module).items():  # buffers such as running stats
                if isinstance(value, np.ndarray) and value.dtype == np.float32:
                    setattr(module, name, value.astype(np.float64))
    else:
        tensors = module_or_tensors
    for t in tensors:
        t.data = t.data.astype(np.float64)
    return module_or_tensors


def numerical_grad(
    f: Callable[[], Tensor], x: Tensor, projection: np.ndarray, eps: float = 1e-6
) -> np.ndarray:
    """d(sum(f() * projection)) / dx by central differences (mutates and restores x.data)."""
    grad = np.zeros_like(x.data, dtype=np.float64)
    flat = x.data.reshape(-1)  # a view: writing into it perturbs x
    with no_grad():
        for i in range(flat.size):
            original = flat[i]
            flat[i] = original + eps
            plus = float(np.sum(f().data * projection))
            flat[i] = original - eps
            minus = float(np.sum(f().data * projection))
            flat[i] = original
            grad.reshape(-1)[i] = (plus - minus) / (2 * eps)
    return grad


def gradcheck(
    f: Callable[[], Tensor],
    inputs: Sequence[Tensor],
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    seed: int = 0,
) -> bool:
    """Assert that backward() of ``f()`` matches finite differences for each of ``inputs``.

    ``f`` takes no arguments and reads the inputs (so layers can close over themselves).
    Raises ``AssertionError`` naming the input and the worst element; returns True.
    """
    out = f()
    projection = np.random.default_rng(seed).standard_normal(out.shape)
    for t in inputs:
        t.grad = None
    out.backward(gradient=projection.astype(out.dtype))
    for k, t in enumerate(inputs):
        if not t.data.flags.c_contiguous:
            t.data = np.ascontiguousarray(t.data)
        analytic = np.zeros(t.shape) if t.grad is None else np.asarray(t.grad.data, np.float64)
        numeric = numerical_grad(f, t, projection, eps)
        if not np.allclose(analytic, numeric, atol=atol, rtol=rtol):
            worst = tuple(
                int(i) for i in np.unravel_index(np.argmax(np.abs(analytic - numeric)), t.shape)
            )
            raise AssertionError(
                f"gradcheck: input {k} (shape {t.shape}) differs at {worst}: analytic "
                f"{analytic[worst]:.6g} vs numeric {numeric[worst]:.6g}; max abs diff "
                f"{np.max(np.abs(analytic - numeric)):.3g}"
            )
    return True
