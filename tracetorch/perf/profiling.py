"""The guide's import path for TinyTorch's ``Profiler``: ``from tracetorch.perf.profiling import
Profiler`` (``tinytorch`` replaced by ``tracetorch``); the implementation is
:mod:`tracetorch.compat.tinytorch.profiling`.

Example:
    >>> from tracetorch.perf.profiling import Profiler
    >>> Profiler().measurements
    {}
"""
from __future__ import annotations

from tracetorch.compat.tinytorch import profiling as _implementation
from tracetorch.compat.tinytorch.profiling import *  # noqa: F403 - the names in its __all__

__all__ = _implementation.__all__
