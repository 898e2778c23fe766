"""tracetorch: per-layer call counts, FLOPs and timings for numpy, PyTorch and duck-typed models."""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ("__version__",)
