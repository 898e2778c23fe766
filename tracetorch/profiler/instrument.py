"""``@tracetorch.instrument``: make a class or a plain function a node of the call tree.

Layers of ``tracetorch.core``, torch and a model passed to ``profile(model)`` are found without
it; ``instrument`` is for the rest: a helper function worth its own row, or a duck-typed layer
class used without passing its model. Outside a profile the wrapper calls straight through.

Example:
    >>> import numpy as np
    >>> import tracetorch
    >>> @tracetorch.instrument(flops=lambda a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1])
    ... def gemm(a, b):
    ...     return a @ b
    >>> with tracetorch.profile() as prof:
    ...     _ = gemm(np.ones((2, 3)), np.ones((3, 4)))
    >>> prof.find("gemm").flops
    48
"""
from __future__ import annotations

import sys
from typing import Any, Callable, TypeVar, overload

from tracetorch.engine.patches import Guard, Patch, is_instrumented, recording_wrapper
from tracetorch.flops.registry import default_registry

__all__ = ("instrument",)

T = TypeVar("T")


@overload
def instrument(target: T) -> T: ...


@overload
def instrument(target: None = None, *, flops: Callable[..., int] | None = None,
               name: str | None = None) -> Callable[[T], T]: ...


def instrument(target: Any = None, *, flops: Callable[..., int] | None = None,
               name: str | None = None) -> Any | Callable[[Any], Any]:
    """Record every call of a function, or of a class's ``forward``, as a tree node.

    Args:
        target: the function or class (when used without arguments: ``@instrument``).
        flops: for a function, ``flops(*args, **kwargs) -> int`` computed per distinct input
            shapes; for a class, a FLOP rule ``flops(layer, inputs, output) -> int`` registered
            for it (as :func:`tracetorch.flop_rule` would).
        name: the node's name for a function (default: its qualified name).

    A class gets its ``forward`` wrapped where it is looked up (its own, or the inherited one
    set on the class), or ``__call__`` if it has no ``forward``. The wrapper stays (it calls
    straight through outside a profile); with torch imported, it also steps aside while a torch
    compiler or tracer runs the code.
    """
    if flops is not None and not callable(flops):
        raise TypeError(f"flops must be a callable returning an int, got {flops!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")

    def decorate(obj: Any) -> Any:
        if isinstance(obj, type):
            return _instrument_class(obj, flops)
        if not callable(obj):
            raise TypeError(f"instrument() takes a class or a function, got {type(obj).__name__}")
        if is_instrumented(obj):
            return obj
        label = name or getattr(obj, "__qualname__", None) or type(obj).__name__
        return recording_wrapper(obj, "function", label=label, flops_fn=flops,
                                 guard=_compiler_guard())

    return decorate if target is None else decorate(target)


def _instrument_class(cls: type, rule: Callable[..., int] | None) -> type:
    attr = "forward" if callable(getattr(cls, "forward", None)) else "__call__"
    if not is_instrumented(vars(cls).get(attr)):
        # Set for good (the decorator's purpose), so the Patch that could undo it is dropped.
        original = vars(cls).get(attr, getattr(cls, attr))
        Patch.apply(cls, attr, recording_wrapper(original, "module", guard=_compiler_guard()))
    if rule is not None:
        default_registry.register(cls)(rule)
    return cls


def _compiler_guard() -> Guard | None:
    """The torch compiler/tracer guard when torch is loaded (never importing it)."""
    if "torch" not in sys.modules:
        return None
    from tracetorch.adapters.torch.tracing import tracing

    return tracing
