"""Statistics of a model's weight magnitudes (for pruning and quantisation decisions).

Example:
    >>> import numpy as np
    >>> class Layer:
    ...     weight = np.full((10, 5), -0.1)
    >>> stats = analyze_weight_distribution(Layer())
    >>> stats["total_weights"], round(stats["mean"], 6)
    (50, 0.1)
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tracetorch.models.params import iter_parameters

__all__ = ("analyze_weight_distribution",)

# |w| below these is reported as a share of all weights (candidates for pruning).
_THRESHOLDS = (0.001, 0.01, 0.1)


def analyze_weight_distribution(model: Any, percentiles: Sequence[float] = (10, 25, 50, 75, 90)
                                ) -> dict[str, int | float | str]:
    """Mean, std, min, max and percentiles of |w| over every distinct parameter (biases too).

    Also ``below_threshold_0001``, ``below_threshold_001`` and ``below_threshold_01``: the
    percentage (0-100) of |w| strictly below 0.001, 0.01 and 0.1. A model with no parameters
    gets ``{"error": "No weights found"}`` (TinyTorch's answer) rather than an exception.

    Raises:
        TypeError: ``model`` is ``None`` or a class.

    Example:
        >>> import numpy as np
        >>> class Layer:
        ...     weight = np.array([0.0005, 0.5, -2.0, 1.0])
        >>> analyze_weight_distribution(Layer(), percentiles=(50,))["percentile_50"]
        0.75
    """
    arrays = [np.abs(_as_array(p)).ravel() for p in iter_parameters(model)]
    values = np.concatenate(arrays).astype(np.float64) if arrays else np.empty(0)
    if values.size == 0:
        return {"error": "No weights found"}
    stats: dict[str, int | float | str] = {
        "total_weights": int(values.size),
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "max": float(values.max()),
    }
    for p in percentiles:
        stats[f"percentile_{p}"] = float(np.percentile(values, p))
    for t in _THRESHOLDS:
        stats[f"below_threshold_{str(t).replace('.', '')}"] = float((values < t).mean() * 100)
    return stats


def _as_array(tensor: Any) -> np.ndarray:
    data = getattr(tensor, "data", None)
    # A core Tensor keeps its array in ``.data``; an ndarray's own ``.data`` is a memoryview.
    if isinstance(data, np.ndarray) or isinstance(tensor, np.ndarray):
        return np.asarray(data if isinstance(data, np.ndarray) else tensor)
    detach = getattr(tensor, "detach", None)
    if callable(detach):  # torch: leave autograd and the device before numpy sees it
        return detach().cpu().numpy()
    return np.asarray(tensor)
