"""Loss layers: MSELoss and CrossEntropyLoss (``Module`` subclasses, mean reduction).

Example::

    >>> MSELoss()(Tensor([1.0, 3.0]), Tensor([1.0, 1.0])).item()
    2.0
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import ops_nn
from .layers import Module, as_tensor
from .ops_math import mul, sub
from .ops_reduce import mean
from .tensor import Tensor

__all__ = ("MSELoss", "CrossEntropyLoss")


class MSELoss(Module):
    """Mean squared error ``mean((predictions - targets) ** 2)``.

    Built from the sub, mul and mean ops, so its FLOPs are theirs.

    Example::

        >>> MSELoss()(Tensor([0.0, 2.0]), [0.0, 0.0]).item()
        2.0
    """

    def forward(self, predictions: Any, targets: Any) -> Tensor:
        predictions = as_tensor(predictions)
        if not isinstance(targets, Tensor):
            targets = Tensor(targets, dtype=predictions.dtype)
        if predictions.shape != targets.shape:
            raise ValueError(
                f"MSELoss: predictions shape {predictions.shape} != targets shape "
                f"{targets.shape}"
            )
        diff = sub(predictions, targets)
        return mean(mul(diff, diff))


class CrossEntropyLoss(Module):
    """Softmax cross-entropy of logits (N, C) against integer class ids (N,).

    Targets may be an int array, a list, or a Tensor of whole numbers (TinyTorch keeps ids
    as float32).  Extra leading dims are flattened: logits (B, T, C) with targets (B, T).

    Example::

        >>> round(CrossEntropyLoss()(Tensor([[0.0, 0.0]]), [1]).item(), 4)
        0.6931
    """

    def forward(self, logits: Any, targets: Any) -> Tensor:
        logits = as_tensor(logits)
        if logits.ndim > 2:
            logits = logits.reshape(-1, logits.shape[-1])
            ids = targets.data if isinstance(targets, Tensor) else targets
            targets = np.asarray(ids).reshape(-1)
        return ops_nn.cross_entropy(logits, targets)
