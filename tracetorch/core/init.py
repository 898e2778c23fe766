"""Random state and parameter initialisers for the core layers.

One module-level generator (seeded with 0) makes model construction and dropout masks
reproducible run to run; :func:`manual_seed` resets it.

Example::

    >>> manual_seed(42)
    >>> w = normal((3, 2), std=0.1)      # float32 Tensor, requires_grad=True
    >>> w.shape, w.requires_grad
    ((3, 2), True)
"""
from __future__ import annotations

import numpy as np

from .tensor import Tensor

__all__ = ("manual_seed", "get_rng", "normal", "uniform", "zeros", "ones")

_rng = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Reseed the generator used by layer initialisation and dropout."""
    global _rng
    _rng = np.random.default_rng(seed)


def get_rng() -> np.random.Generator:
    """The shared generator (read it at call time: ``manual_seed`` replaces it)."""
    return _rng


def normal(shape: tuple, std: float) -> Tensor:
    """Parameter drawn from N(0, std^2), float32."""
    data = _rng.standard_normal(shape, dtype=np.float32)
    data *= np.float32(std)
    return Tensor(data, requires_grad=True)


def uniform(shape: tuple, limit: float) -> Tensor:
    """Parameter drawn from U(-limit, limit), float32."""
    data = _rng.uniform(-limit, limit, size=shape).astype(np.float32)
    return Tensor(data, requires_grad=True)


def zeros(shape: tuple) -> Tensor:
    """Zero-filled float32 parameter."""
    return Tensor(np.zeros(shape, dtype=np.float32), requires_grad=True)


def ones(shape: tuple) -> Tensor:
    """One-filled float32 parameter."""
    return Tensor(np.ones(shape, dtype=np.float32), requires_grad=True)
