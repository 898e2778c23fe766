"""TinyTorch-compatible profiling facade (``tinytorch.perf`` with ``tinytorch`` -> ``tracetorch``).

Example:
    >>> from tracetorch.perf import Profiler
    >>> Profiler().measurements
    {}
"""
from __future__ import annotations

from tracetorch.perf.profiling import (ASSUMED_PEAK_GFLOPS, ASSUMED_RIDGE_FLOPS_PER_BYTE,
                                       BYTES_PER_FLOAT32, KB_TO_BYTES, MB_TO_BYTES, Profiler,
                                       analyze_weight_distribution, arithmetic_intensity,
                                       quick_profile)

__all__ = (
    "BYTES_PER_FLOAT32",
    "KB_TO_BYTES",
    "MB_TO_BYTES",
    "ASSUMED_PEAK_GFLOPS",
    "ASSUMED_RIDGE_FLOPS_PER_BYTE",
    "Profiler",
    "quick_profile",
    "analyze_weight_distribution",
    "arithmetic_intensity",
)
