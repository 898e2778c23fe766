"""Normalization layers: LayerNorm and BatchNorm2d.

Example::

    >>> LayerNorm(4)(Tensor(np.arange(8.0).reshape(2, 4))).shape
    (2, 4)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import init
from .layers import Module, as_tensor, check_positive_int
from .ops_norm import batch_norm, layer_norm
from .tensor import Tensor

__all__ = ("LayerNorm", "BatchNorm2d")


class LayerNorm(Module):
    """Normalize over the trailing ``normalized_shape`` dims, then scale and shift.

    ``weight`` (ones) and ``bias`` (zeros) have shape ``normalized_shape``.

    Example::

        >>> ln = LayerNorm((2, 3))
        >>> ln(Tensor(np.ones((5, 2, 3)))).shape, ln.weight.shape
        ((5, 2, 3), (2, 3))
    """

    def __init__(
        self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, (int, np.integer)):
            dims: tuple = (normalized_shape,)
        else:
            dims = tuple(normalized_shape)
        if not dims:
            raise ValueError("LayerNorm: normalized_shape must have at least one dimension")
        self.normalized_shape = tuple(
            check_positive_int(d, "normalized_shape", "LayerNorm") for d in dims
        )
        if eps <= 0:
            raise ValueError(f"LayerNorm: eps must be positive, got {eps!r}")
        self.eps = float(eps)
        self.weight = init.ones(self.normalized_shape) if elementwise_affine else None
        self.bias = init.zeros(self.normalized_shape) if elementwise_affine else None

    def forward(self, x: Any) -> Tensor:
        x = as_tensor(x)
        nd = len(self.normalized_shape)
        if x.data.ndim < nd or x.data.shape[x.data.ndim - nd :] != self.normalized_shape:
            raise ValueError(
                f"LayerNorm(normalized_shape={self.normalized_shape}): expected input whose "
                f"trailing dims are {self.normalized_shape}, got shape {x.data.shape}"
            )
        return layer_norm(x, self.weight, self.bias, nd, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class BatchNorm2d(Module):
    """Per-channel batch norm of NCHW input.

    Training uses the batch statistics and updates ``running_mean``/``running_var``
    (ndarrays, not parameters; ``momentum`` weighs the new batch); eval uses the running
    statistics.

    Example::

        >>> bn = BatchNorm2d(3)
        >>> bn(Tensor(np.random.randn(4, 3, 5, 5))).shape
        (4, 3, 5, 5)
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.num_features = check_positive_int(num_features, "num_features", "BatchNorm2d")
        if eps <= 0:
            raise ValueError(f"BatchNorm2d: eps must be positive, got {eps!r}")
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"BatchNorm2d: momentum must be in [0, 1], got {momentum!r}")
        self.eps = float(eps)
        self.momentum = float(momentum)
        self.weight = init.ones((self.num_features,))
        self.bias = init.zeros((self.num_features,))
        self.running_mean = np.zeros(self.num_features, dtype=np.float32)
        self.running_var = np.ones(self.num_features, dtype=np.float32)

    def forward(self, x: Any) -> Tensor:
        x = as_tensor(x)
        shape = x.data.shape
        if len(shape) != 4 or shape[1] != self.num_features:
            raise ValueError(
                f"BatchNorm2d(num_features={self.num_features}): expected 4-D input "
                f"(N, {self.num_features}, H, W), got shape {shape}"
            )
        return batch_norm(
            x,
            self.weight,
            self.bias,
            self.running_mean,
            self.running_var,
            self.training,
            self.momentum,
            self.eps,
        )

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"
