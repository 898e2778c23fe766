"""The PyTorch adapter: what is wrapped while a profile is open, and how it is undone.

**Layers.** ``forward`` is wrapped on every ``torch.nn.Module`` subclass that defines it, found
by walking ``torch.nn.Module.__subclasses__()`` (user classes included), so modules of any
model are recorded whether or not it is passed to ``profile``. Wrapping ``forward`` (not
``Module.__call__``) keeps the user's hooks outside the measured call and untouched, and leaves
classes that only inherit ``forward`` alone. ``benchmarks/overhead_torch.py`` counts the classes
wrapped (246 on torch 2.13) and times entering plus leaving a block (about 1.3 ms on CPU) —
once per block, not per call, so wrapping every class beats guessing which ones a model will
call. ``torch.fx.GraphModule`` classes (which regenerate ``forward`` on ``recompile()``) are
not wrapped; the modules they call still are.

**Compilers and tracers.** Every torch wrapper's guard is :func:`~.tracing.tracing`: while
Dynamo (``torch.compile``, ``torch.export``), ``torch.fx`` or the TorchScript tracer runs a
layer, the wrapper only calls it, so they see the model as it is and nothing is recorded.
Compiled and scripted modules are recorded where Python calls them: ``__call__`` of
``OptimizedModule`` (``torch.compile(module)``) and of ``torch.jit.ScriptModule`` (whose
``forward`` is TorchScript, not Python) is wrapped, so each is one node with its time; the
layers inside run as a graph and are not seen (its FLOPs are those of the operations the
function mode sees, else unknown: ``unsupported`` lists it). ``module.compile()``, in place,
compiles ``Module.__call__`` itself: such a module's calls are not nodes, and the operations the
function mode sees count toward the enclosing call.

**Classes defined inside the block.** ``torch.nn.Module.__init_subclass__`` is set while
profiling (and deleted again on exit): a class created in the block is wrapped at once.

**Optimizers.** No ``step`` is patched: torch's global optimizer step hooks open and close the
``"{type}.step"`` node (see :mod:`~tracetorch.adapters.torch.steps`), so optimizers and LR
schedulers created in a block are exactly what torch alone makes of them.

**Operations and gradients.** :mod:`~tracetorch.adapters.torch.ops` counts matrix products,
convolutions and attention in functional code; :mod:`~tracetorch.adapters.torch.backward` tags
autograd nodes with the layer call that made them and measures backward FLOPs and times per
layer; :mod:`~tracetorch.adapters.torch.cuda` times CUDA work with events.

Example:
    >>> import torch
    >>> adapter = TorchAdapter()
    >>> any(t.cls is torch.nn.Linear for t in adapter.patch_targets())
    True
"""
from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any, Callable

import torch

from tracetorch.adapters.base import all_subclasses
from tracetorch.adapters.torch.cuda import configure as cuda_configure
from tracetorch.adapters.torch.ops import start_op_counting
from tracetorch.adapters.torch.steps import start_step_hooks
from tracetorch.adapters.torch.tracing import tracing
from tracetorch.engine.hotpath import OpCounter
from tracetorch.engine.patches import PatchBoard, PatchTarget

__all__ = ("TorchAdapter", "wraps_forward", "targets_for")

_RULES_REGISTERED = False


def wraps_forward(cls: type) -> bool:
    """Whether ``cls`` gets its ``forward`` wrapped: it defines one, as a Python function, and
    is neither a TorchScript module (recorded at ``__call__``) nor an fx ``GraphModule``."""
    if cls is torch.nn.Module or not isinstance(vars(cls).get("forward"), types.FunctionType):
        return False
    if issubclass(cls, torch.jit.ScriptModule):
        return False
    fx = sys.modules.get("torch.fx")
    graph_module = getattr(fx, "GraphModule", None)
    return not (graph_module is not None and issubclass(cls, graph_module))


def _runs_a_graph(cls: type) -> bool:
    """A module class whose calls run a compiled graph: scripted, traced, or compiled."""
    # By name: OptimizedModule is seen by the subclass watcher before its module binds it.
    return cls is torch.jit.ScriptModule or (
        cls.__module__ == "torch._dynamo.eval_frame" and cls.__qualname__ == "OptimizedModule")


def targets_for(cls: type) -> Iterator[PatchTarget]:
    """What to wrap on one ``torch.nn.Module`` class (nothing for most classes).

    Example:
        >>> import torch
        >>> [(t.cls.__name__, t.attr) for t in targets_for(torch.jit.ScriptModule)]
        [('ScriptModule', '__call__')]
    """
    if wraps_forward(cls):
        yield PatchTarget(cls, "forward", "module", tracing)
    elif _runs_a_graph(cls):
        # ScriptModule inherits __call__ from Module: the copy set on it is deleted on exit.
        yield PatchTarget(cls, "__call__", "module", tracing, inherited=True)


class TorchAdapter:
    """Profiles ``torch.nn`` modules, backward passes, optimizer steps and tensor operations."""

    module_name = "torch"

    def patch_targets(self) -> Iterator[PatchTarget]:
        """Every module class defining ``forward``, and compiled and scripted modules'
        ``__call__`` (backward passes reach the function mode of .ops)."""
        for cls in all_subclasses(torch.nn.Module):
            yield from targets_for(cls)

    def configure(self, collector: Any) -> None:
        """A profile is being entered: on CUDA, time its calls with events (see .cuda)."""
        cuda_configure(collector)

    def start(self, board: PatchBoard, counter: OpCounter) -> list[Callable[[], None]]:
        """Start counting operations and gradients, timing optimizer steps and watching for new
        classes; returns the cleanups, run in reverse order when the last profile closes."""
        global _RULES_REGISTERED
        if not _RULES_REGISTERED:
            from tracetorch.flops.torch_rules import register_torch_rules

            register_torch_rules()
            _RULES_REGISTERED = True
        cleanups: list[Callable[[], None]] = []
        try:
            cleanups.append(start_op_counting(counter))
            cleanups.append(start_step_hooks())

            def new_module_class(cls: type) -> None:
                for target in targets_for(cls):
                    board.patch(target)

            board.watch_subclasses(torch.nn.Module, new_module_class)
        except BaseException:
            for cleanup in reversed(cleanups):
                cleanup()
            raise
        return cleanups
