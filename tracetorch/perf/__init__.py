"""TinyTorch-compatible profiling facade (``tinytorch.perf`` with ``tinytorch`` -> ``tracetorch``).

The package exports exactly the public names of :mod:`tracetorch.perf.profiling`.

Example:
    >>> from tracetorch.perf import Profiler
    >>> Profiler().measurements
    {}
"""
from __future__ import annotations

from tracetorch.perf import profiling
from tracetorch.perf.profiling import *  # noqa: F403 - the names in profiling.__all__

__all__ = profiling.__all__
