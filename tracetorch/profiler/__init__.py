"""What users wrap their code in: ``profile`` (a block, a decorator, a schedule of steps) and
``@instrument`` for functions that are not layers.

* :mod:`~tracetorch.profiler.block` — ``profile``, the context manager: opens the engine, the
  adapters and the phases, and hands back a :class:`~tracetorch.records.result.ProfileResult`.
* :mod:`~tracetorch.profiler.decorator` — ``@profile(...)`` on a function, each call one step.
* :mod:`~tracetorch.profiler.schedule` — which training steps are recorded.
* :mod:`~tracetorch.profiler.instrument` — ``@instrument`` makes a class or function a node.
* :mod:`~tracetorch.profiler.runinfo` — the facts a profile notes about its run, in ``meta``.

Example:
    >>> from tracetorch.profiler import profile
    >>> with profile() as prof:
    ...     pass
    >>> prof.nodes()
    []
"""
from __future__ import annotations

from tracetorch.profiler.block import profile

__all__ = ("profile",)
