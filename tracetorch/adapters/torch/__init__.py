"""The PyTorch adapter: what is wrapped while a profile is open, and how it is undone.

**Layers.** ``forward`` is wrapped on every ``torch.nn.Module`` subclass that defines it, found
by walking ``torch.nn.Module.__subclasses__()`` (user classes included), so modules of any
model are recorded whether or not it is passed to ``profile``. Wrapping ``forward`` (not
``Module.__call__``) keeps the user's hooks outside the measured call and untouched, and leaves
classes that only inherit ``forward`` alone. ``benchmarks/overhead_torch.py`` counts the classes
wrapped (246 on torch 2.13) and times entering plus leaving a block (about 1.3 ms on CPU) —
once per block, not per call, so wrapping every class beats guessing which ones a model will
call.
TorchScript modules (their ``forward`` is not a Python function) and ``torch.fx.GraphModule``
classes (which regenerate ``forward`` on ``recompile()``) are not wrapped; the modules they
call still are.

**Classes defined inside the block.** ``torch.nn.Module.__init_subclass__`` and
``torch.optim.Optimizer.__init_subclass__`` are set while profiling (neither class defines its
own, so on exit the attribute is deleted again; one that did would be put back): a class created
in the block gets its ``forward`` (or ``step``) wrapped at once, and unwrapped on exit.

**Optimizers and backward.** ``step`` of every ``torch.optim.Optimizer`` subclass (kind
``optimizer``) and ``torch.Tensor.backward`` (kind ``backward``). If the first optimizer of a
class is built inside the block, torch's own step hook (``Optimizer._patch_step_function``)
wraps ours; on exit that class gets torch's hook around its original ``step``, exactly what it
would have had without the profiler.

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
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch
import wrapt

from tracetorch.adapters.base import all_subclasses
from tracetorch.adapters.torch.backward import AutogradPatches, tag_call
from tracetorch.adapters.torch.cuda import backward_timer_factory, configure as cuda_configure
from tracetorch.adapters.torch.ops import OpPatches
from tracetorch.engine.patches import PatchBoard, PatchTarget, mark_instrumented
from tracetorch.engine.hotpath import OpCounter, make_wrapper, set_exit_observer

__all__ = ("TorchAdapter", "wraps_forward")

_RULES_REGISTERED = False


def wraps_forward(cls: type) -> bool:
    """Whether ``cls`` gets its ``forward`` wrapped: it defines one, as a Python function."""
    if cls is torch.nn.Module or not isinstance(vars(cls).get("forward"), types.FunctionType):
        return False
    fx = sys.modules.get("torch.fx")
    graph_module = getattr(fx, "GraphModule", None)
    return not (graph_module is not None and issubclass(cls, graph_module))


class TorchAdapter:
    """Profiles ``torch.nn`` modules, backward passes, optimizer steps and tensor operations."""

    module_name = "torch"

    def __init__(self) -> None:
        self._steps = _OptimizerSteps()

    def patch_targets(self) -> Iterator[PatchTarget]:
        """Every module class defining ``forward``, and ``torch.Tensor.backward``."""
        for cls in all_subclasses(torch.nn.Module):
            if wraps_forward(cls):
                yield PatchTarget(cls, "forward", "module")
        yield PatchTarget(torch.Tensor, "backward", "backward")

    def configure(self, collector: Any) -> None:
        """A profile is being entered: on CUDA, time its calls with events (see .cuda)."""
        cuda_configure(collector)

    def start(self, board: PatchBoard, counter: OpCounter) -> List[Callable[[], None]]:
        """Start counting operations and gradients and watching for new classes; returns the
        cleanups, run in reverse order when the last profile closes."""
        global _RULES_REGISTERED
        if not _RULES_REGISTERED:
            from tracetorch.flops.torch_rules import register_torch_rules

            register_torch_rules()
            _RULES_REGISTERED = True
        cleanups: List[Callable[[], None]] = []
        try:
            ops = OpPatches()
            cleanups.append(ops.restore)
            ops.install(counter)
            autograd = AutogradPatches(counter, backward_timer_factory)
            cleanups.append(autograd.restore)
            autograd.install()
            previous = set_exit_observer(tag_call)
            cleanups.append(lambda: set_exit_observer(previous))
            steps = self._steps
            cleanups.append(steps.restore)
            for cls in all_subclasses(torch.optim.Optimizer):
                steps.patch(cls)

            def new_module_class(cls: type) -> None:
                if wraps_forward(cls):
                    board.patch(PatchTarget(cls, "forward", "module"))

            cleanups.append(_watch_subclasses(torch.nn.Module, new_module_class))
            cleanups.append(_watch_subclasses(torch.optim.Optimizer, steps.patch))
        except BaseException:
            for cleanup in reversed(cleanups):
                cleanup()
            raise
        return cleanups


def _watch_subclasses(base: type, on_new: Callable[[type], None]) -> Callable[[], None]:
    """Call ``on_new(cls)`` for every subclass of ``base`` created from now on; returns the
    function that puts ``base.__init_subclass__`` back exactly as it was."""
    had_own = "__init_subclass__" in vars(base)
    saved = vars(base).get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if had_own:
            saved.__get__(None, cls)(**kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
        try:
            on_new(cls)
        except Exception:  # a class the profiler cannot wrap is still a valid class
            pass

    base.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]

    def restore() -> None:
        if had_own:
            base.__init_subclass__ = saved  # type: ignore[assignment]
        elif "__init_subclass__" in vars(base):
            delattr(base, "__init_subclass__")

    return restore


class _OptimizerSteps:
    """``step`` wrappers on optimizer classes, undone the way torch's own step hook needs."""

    def __init__(self) -> None:
        self._saved: Dict[type, Tuple[Any, Any]] = {}
        engine = make_wrapper("optimizer")

        def step_wrapper(wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
                         kwargs: Dict[str, Any]) -> Any:
            if instance is None and args:  # called through torch's hook, unbound
                instance, args = args[0], args[1:]
                wrapped = wrapped.__get__(instance, type(instance))
            return engine(wrapped, instance, args, kwargs)

        self._wrapper = step_wrapper

    def patch(self, cls: type) -> None:
        """Wrap ``cls.step`` if ``cls`` defines it (the abstract base's is left alone)."""
        original = vars(cls).get("step")
        if (cls is torch.optim.Optimizer or cls in self._saved
                or not isinstance(original, types.FunctionType)):
            return
        wrapper = mark_instrumented(wrapt.FunctionWrapper(original, self._wrapper))
        setattr(cls, "step", wrapper)
        self._saved[cls] = (original, wrapper)

    def restore(self) -> None:
        """Put every original back (re-hooked the way torch would have, where needed)."""
        saved, self._saved = self._saved, {}
        for cls, (original, wrapper) in saved.items():
            current = vars(cls).get("step")
            inner = getattr(current, "__wrapped__", None)  # torch's hook wraps cls.step as read
            if current is not wrapper and getattr(current, "hooked", False) and (
                    inner is wrapper or getattr(inner, "_self_parent", None) is wrapper):
                hooked = torch.optim.Optimizer.profile_hook_step(original)
                hooked.hooked = True  # type: ignore[attr-defined]
                setattr(cls, "step", hooked)
            else:
                setattr(cls, "step", original)

