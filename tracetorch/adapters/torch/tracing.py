"""Knowing when torch compiles or traces the code a layer runs, so the profiler stays out of it.

A compiler or tracer must see the model exactly as it is: ``torch.compile`` (Dynamo) cannot
trace the engine's ``ContextVar``, ``torch.fx.symbolic_trace`` hands layers ``Proxy`` objects
whose shapes cannot be read, and ``torch.jit.trace`` records every tensor operation a FLOP rule
would run. :func:`tracing` is the ``guard`` of every torch layer wrapper: while it is true the
wrapper only calls the layer. It runs on every layer call, so it is ordered for both worlds:
Dynamo constant-folds :func:`torch.compiler.is_dynamo_compiling` to ``True`` (the traced code is
just the layer's own), and in eager code it returns ``False`` at the cost of a call; then come
two flag reads (``torch.export`` and the rest of a compile session; fx) and one C call (the
TorchScript tracer). ``benchmarks/overhead_torch.py`` reports its cost.

Where the engine's C wrapper is built, it asks ``tracing.native_guard`` instead: the same
two flags and tracer call written as data, ``(flags, calls)``, which it reads without a Python
frame. ``is_dynamo_compiling()`` is left out there because it is ``False`` wherever C code
runs: Dynamo traces Python bytecode, never the C wrapper.

Example:
    >>> tracing()
    False
"""
from __future__ import annotations

from torch import compiler as _compiler
from torch._C import _is_tracing
from torch.fx import _symbolic_trace as _fx

__all__ = ("tracing",)

_dynamo_compiling = _compiler.is_dynamo_compiling


def tracing() -> bool:
    """Whether a torch compiler or tracer (Dynamo, export, fx, TorchScript's tracer) is running
    the current code instead of executing it."""
    return (_dynamo_compiling() or _compiler._is_compiling_flag or _fx._is_fx_tracing_flag
            or _is_tracing())


# What the C wrapper asks instead (see make_wrapper in tracetorch.engine.hotpath).
tracing.native_guard = (  # type: ignore[attr-defined]
    ((_compiler, "_is_compiling_flag"), (_fx, "_is_fx_tracing_flag")), (_is_tracing,))
