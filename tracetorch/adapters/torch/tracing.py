"""Knowing when torch compiles or traces the code a layer runs, so the profiler stays out of it.

A compiler or tracer must see the model exactly as it is: ``torch.compile`` (Dynamo) cannot
trace the engine's ``ContextVar``, ``torch.fx.symbolic_trace`` hands layers ``Proxy`` objects
whose shapes cannot be read, and ``torch.jit.trace`` records every tensor operation a FLOP rule
would run. :func:`tracing` is the ``guard`` of every torch layer wrapper: while it is true the
wrapper only calls the layer. It runs on every layer call, so it is ordered for both worlds:
Dynamo constant-folds :func:`torch.compiler.is_dynamo_compiling` to ``True`` (the traced code is
just the layer's own), and in eager code it returns ``False`` at the cost of a call; then come
two flag reads (``torch.export`` and the rest of a compile session; fx) and two C calls (the
TorchScript tracer; Dynamo's frame callback, set while a compiled function runs: what runs eagerly
under it, a graph break's callee, is the compiled function's, and a layer recorded there would
make Dynamo compile the profiler's frames). ``benchmarks/overhead_torch.py`` reports its cost.

**Frames Dynamo starts at.** A compiled function runs with Dynamo's frame callback set, which
compiles the first frame that its rules do not skip. Torch skips its own (``Module._call_impl``)
and so starts at the user's ``forward``; :func:`skip_frames` gives the profiler's functions that
run between a compiled call and the user's code (the first-call function, the engine's Python
wrapper) the same treatment, so Dynamo compiles, and its cache keeps, the very frames it would
outside a block: no recompilation on entering or leaving one. Dynamo still inlines them where it
traces a caller (``self.layer(x)`` in a traced ``forward``).

Where the engine's C wrapper is built, it asks ``tracing.native_guard`` instead: the same
two flags and tracer call written as data, ``(flags, calls)``, which it reads without a Python
frame. ``is_dynamo_compiling()`` is left out there because it is ``False`` wherever C code
runs: Dynamo traces Python bytecode, never the C wrapper.

Example:
    >>> tracing()
    False
"""
from __future__ import annotations

from types import CodeType

from torch import compiler as _compiler
from torch._C import _is_tracing
from torch._C._dynamo import eval_frame as _eval_frame
from torch.fx import _symbolic_trace as _fx

__all__ = ("tracing", "skip_frames")

_dynamo_compiling = _compiler.is_dynamo_compiling
_frame_callback = _eval_frame.get_eval_frame_callback
#: Skip the frame itself, treat the frames it calls as usual (what torch does for its own files).
_SKIP_FRAME = _eval_frame._FrameExecStrategy(_eval_frame._FrameAction.SKIP,
                                              _eval_frame._FrameAction.DEFAULT)


def tracing() -> bool:
    """Whether a torch compiler or tracer (Dynamo, export, fx, TorchScript's tracer) is running
    the current code instead of executing it."""
    return (_dynamo_compiling() or _compiler._is_compiling_flag or _fx._is_fx_tracing_flag
            or _is_tracing() or bool(_frame_callback()))


def skip_frames(*codes: CodeType) -> None:
    """Dynamo compiles no frame that runs one of ``codes``: a compiled function starts at the
    frames they call, and Dynamo still inlines them into a traced caller.

    Example:
        >>> skip_frames(tracing.__code__)
    """
    for code in codes:
        _eval_frame.set_code_exec_strategy(code, _SKIP_FRAME)


# What the C wrapper asks instead (see make_wrapper in tracetorch.engine.hotpath).
tracing.native_guard = (  # type: ignore[attr-defined]
    ((_compiler, "_is_compiling_flag"), (_fx, "_is_fx_tracing_flag")),
    (_is_tracing, _frame_callback))
skip_frames(tracing.__code__)
