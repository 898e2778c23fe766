"""tracetorch: per-layer call counts, FLOPs and timings for numpy, PyTorch and duck-typed models.

Example:
    >>> import numpy as np
    >>> import tracetorch
    >>> from tracetorch.core import Linear, ReLU, Sequential, Tensor
    >>> model = Sequential(Linear(784, 256), ReLU(), Linear(256, 10))
    >>> tracetorch.count_parameters(model)
    203530
    >>> with tracetorch.profile(model) as prof:
    ...     _ = model(Tensor(np.zeros((64, 784))))
    >>> prof.forward_flops == 2 * 64 * (784 * 256 + 256 * 10) + 64 * 256
    True
"""
from __future__ import annotations

# Registers the report formats and views every result reaches through tracetorch.records.views.
import tracetorch.report  # noqa: F401
from tracetorch.analysis.diff import ProfileDiff, diff
from tracetorch.analysis.machine import Machine
from tracetorch.flops.registry import FlopCount, flop_rule
from tracetorch.models.params import count_parameters, parameter_table
from tracetorch.profiler import profile
from tracetorch.profiler.instrument import instrument
from tracetorch.profiler.schedule import schedule
from tracetorch.records.result import ProfileResult
from tracetorch.tools.bench import Measurement, benchmark, measure_latency
from tracetorch.tools.calibrate import calibrate
from tracetorch.tools.flop_count import count_flops
from tracetorch.version import __version__

__all__ = (
    "__version__",
    "FlopCount",
    "Machine",
    "Measurement",
    "ProfileDiff",
    "ProfileResult",
    "benchmark",
    "calibrate",
    "count_flops",
    "count_parameters",
    "diff",
    "flop_rule",
    "instrument",
    "load",
    "measure_latency",
    "parameter_table",
    "profile",
    "schedule",
)


def load(path: str) -> ProfileResult:
    """Read a profile saved with ``prof.save(path)``; a corrupt or foreign file raises ValueError.

    Example:
        >>> import tracetorch
        >>> with tracetorch.profile() as prof:
        ...     pass
        >>> prof.save("/tmp/empty-run.json")
        >>> tracetorch.load("/tmp/empty-run.json").total_flops
        0
    """
    return ProfileResult.load(path)
