"""Activation layers: ReLU, Sigmoid, Tanh, GELU, Softmax (all ``Module`` subclasses).

Each wraps one fused op of :mod:`tracetorch.core.ops_nn`.

Example::

    >>> ReLU()(Tensor([-1.0, 2.0])).data
    array([0., 2.], dtype=float32)
"""
from __future__ import annotations

from typing import Any

from . import ops_nn
from .layers import Module, as_tensor
from .tensor import Tensor

__all__ = ("ReLU", "Sigmoid", "Tanh", "GELU", "Softmax")


class ReLU(Module):
    """``max(x, 0)``.

    Example::

        >>> ReLU()(Tensor([-2.0, 3.0])).data
        array([0., 3.], dtype=float32)
    """

    def forward(self, x: Any) -> Tensor:
        return ops_nn.relu(as_tensor(x))


class Sigmoid(Module):
    """``1 / (1 + exp(-x))``.

    Example::

        >>> Sigmoid()(Tensor([0.0])).data
        array([0.5], dtype=float32)
    """

    def forward(self, x: Any) -> Tensor:
        return ops_nn.sigmoid(as_tensor(x))


class Tanh(Module):
    """Hyperbolic tangent.

    Example::

        >>> Tanh()(Tensor([0.0])).data
        array([0.], dtype=float32)
    """

    def forward(self, x: Any) -> Tensor:
        return ops_nn.tanh(as_tensor(x))


class GELU(Module):
    """``x * sigmoid(1.702 x)`` (TinyTorch's GELU approximation).

    Example::

        >>> GELU()(Tensor([0.0])).data
        array([0.], dtype=float32)
    """

    def forward(self, x: Any) -> Tensor:
        return ops_nn.gelu(as_tensor(x))


class Softmax(Module):
    """Softmax along ``dim`` (default the last); ``forward(x, dim=...)`` may override it.

    Example::

        >>> Softmax()(Tensor([[0.0, 0.0]])).data
        array([[0.5, 0.5]], dtype=float32)
    """

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Any, dim: int | None = None) -> Tensor:
        return ops_nn.softmax(as_tensor(x), self.dim if dim is None else dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
