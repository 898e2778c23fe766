"""TinyTorch's profiler, API-compatible: the guide's ``tinytorch.perf.profiling.Profiler``.

The guide imports it as ``tracetorch.perf.profiling`` (``tinytorch`` -> ``tracetorch``); that path
re-exports :mod:`.profiling`, and the pieces behind it live here, named for what they hold:
static estimates (:mod:`.analytic`), a measured training step (:mod:`.backward`), derived rates
(:mod:`.derived`), memory (:mod:`.memory`) and weight statistics (:mod:`.weights`).
"""
from __future__ import annotations

__all__: tuple[str, ...] = ()
