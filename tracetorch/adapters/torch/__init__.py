"""The PyTorch adapter: what is wrapped while a profile is open, and how it is undone.

**Layers, wrapped at their first call.** ``forward`` is wrapped on the ``torch.nn.Module``
classes whose instances are called inside the block (user classes included), so entering a
block costs the same (about 50 µs, ``benchmarks/enter_exit.py``) with torch alone or with a
library of a thousand layer classes (timm) imported. While a profile is open,
``torch.nn.Module._call_impl`` — which every module call runs, after ``__call__`` and before
hooks and ``forward`` — is a first-call function (:class:`FirstCalls`): the first time an
instance of a class is called, it wraps ``forward`` on that class and every class of its MRO and
gives the class torch's own ``_call_impl`` back as an attribute of its own, so its later calls
never pass that way again (once per class per block). Classes of a model given to
``profile(model)`` are wrapped on entry, so a submodule whose ``forward`` is called directly
(``self.block.forward(x)``) is recorded too; without a model, only classes called through
``module(...)`` are. ``Module.__call__`` is never touched, so ``torch.fx`` and quantization
tools that patch it see every call. Wrapping ``forward`` keeps the user's hooks outside the
measured call and untouched, and leaves classes that only inherit ``forward`` alone.
``torch.fx.GraphModule`` classes (which regenerate ``forward`` on ``recompile()``) are not
wrapped; the modules they call still are. A class whose own ``_call_impl`` replaces torch's
(``torch.compiler.disable`` on a class) is recorded only as a class of ``profile(model)``'s model.

**Compilers and tracers.** Every torch wrapper's guard is :func:`~.tracing.tracing`: while
Dynamo (``torch.compile``, ``torch.export``), ``torch.fx`` or the TorchScript tracer runs a
layer, or a compiled function runs, the wrapper only calls it, so they see the model as it is
and nothing is recorded; the first-call function then only calls through, and Dynamo never
starts a compiled frame at the profiler's functions (:func:`~.tracing.skip_frames`). A layer's
``forward`` read from its class is the original function (:class:`~tracetorch.engine.patches.\
LayerMethod`). Compiled and scripted modules are recorded where Python calls them: ``__call__``
of ``OptimizedModule`` (``torch.compile(module)``, see :mod:`~.compiled`: it runs with the
patches suspended and without the function mode, so Dynamo compiles and guards as outside a
block; its node is typed as the module compiled and its layers are the eager ones, from a
replay on fake tensors, with estimated times) and of ``torch.jit.ScriptModule`` (whose
``forward`` is TorchScript, not Python; its FLOPs unknown: ``unsupported`` lists it, one node
with its time). While the TorchScript tracer runs a module (``Module._slow_forward``, installed
while profiling) the function mode is off, so the traced graph records the user's source lines.
``module.compile()``, in place, compiles the module's ``_call_impl`` itself: the modules of
``profile(model)``'s model compiled so are recorded as ``torch.compile(module)`` is (their
classes get a ``__call__`` of their own while profiling); elsewhere such a module's calls are
not nodes, and the operations the function mode sees count toward the enclosing call.

**Classes defined inside the block.** ``torch.nn.Module.__init_subclass__`` is set while
profiling (and deleted again on exit): a class created in the block is wrapped at once, as its
first call would.

**Optimizers.** No ``step`` is patched: torch's global optimizer step hooks open and close the
``"{type}.step"`` node (see :mod:`~tracetorch.adapters.torch.steps`), so optimizers and LR
schedulers created in a block are exactly what torch alone makes of them. Only
``Optimizer.zero_grad`` of torch's base class is replaced while profiling, by one that runs
torch's without the function mode (its ``.grad`` accesses count nothing, and through the mode
cost over a quarter of a small training step's overhead).

**torch.vmap.** Under a vmap layers see one example's shapes: torch's ``_flat_vmap`` is watched
while profiling, and the first vmap of a session warns that what it ran is counted for one
example of each batch (:mod:`~tracetorch.adapters.torch.vmapped`).

**Operations and gradients.** :mod:`~tracetorch.adapters.torch.ops` counts matrix products,
convolutions and attention in functional code; :mod:`~tracetorch.adapters.torch.marks` tags
autograd nodes with the layer call that made them and :mod:`~tracetorch.adapters.torch.backward`
measures backward FLOPs and times per layer from them; :mod:`~tracetorch.adapters.torch.cuda`
times CUDA work with events.

Example:
    >>> import torch
    >>> adapter = TorchAdapter()
    >>> [(t.cls.__name__, t.attr) for t in adapter.class_targets(torch.nn.Linear)]
    [('Linear', 'forward')]
"""
from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any, Callable

import torch
from torch._C._dynamo.eval_frame import get_eval_frame_callback as frame_callback

from tracetorch.adapters.torch.call_context import start_context_watch
from tracetorch.adapters.torch.call_hooks import configure_call_hooks
from tracetorch.adapters.torch.compiled import (
    start_compiled_counting,
    wrap_compiled,
    wrap_compiled_in_place,
)
from tracetorch.adapters.torch.cuda import configure as cuda_configure
from tracetorch.adapters.torch.forward_mode import start_forward_ad_watch
from tracetorch.adapters.torch.ops import start_op_counting, traced_forward
from tracetorch.adapters.torch.path_watch import start_path_watch, watch_module_class
from tracetorch.adapters.torch.saved import saved_bytes
from tracetorch.adapters.torch.steps import quiet_zero_grad, start_step_hooks
from tracetorch.adapters.torch.structure import start_structure_hooks
from tracetorch.adapters.torch.tracing import skip_frames, tracing
from tracetorch.adapters.torch.vmapped import start_vmap_watch
from tracetorch.engine.hotpath import OpCounter, current_frame, make_wrapper
from tracetorch.engine.patches import PatchBoard, PatchTarget
from tracetorch.engine.saved_meters import register_saved_meter
from tracetorch.models.tensors import (
    register_int_shaped,
    register_irregular_sizes,
    register_quiet_reads,
)

__all__ = ("TorchAdapter", "FirstCalls", "wraps_forward", "targets_for", "quiet_tensor_reads")

_RULES_REGISTERED = False

# The engine's Python wrapper (a layer's first call runs it, under the C wrapper too): a frame
# Dynamo must not start at, as the first-call function (see tracing.skip_frames).
skip_frames(*(code for code in make_wrapper.__code__.co_consts if isinstance(code, types.CodeType)))


def quiet_tensor_reads(cls: type) -> Any:
    """How the profiler reads a ``cls`` instance's ``.shape`` and ``.dtype``: with subclass
    dispatch off for a tensor subclass whose ``__torch_function__`` is live (its own, or
    torch's default, which a subclass inherits), so that it sees no call the profiler makes
    (``None``: read as it is — torch.Tensor itself, ``Parameter``, anything not a tensor).

    Example:
        >>> class Logged(torch.Tensor):
        ...     pass
        >>> quiet_tensor_reads(torch.Tensor), quiet_tensor_reads(torch.nn.Parameter)
        (None, None)
        >>> quiet_tensor_reads(Logged) is torch._C.DisableTorchFunctionSubclass
        True
    """
    if (cls is torch.Tensor or not issubclass(cls, torch.Tensor)
            or getattr(cls, "__torch_function__", None) is torch._C._disabled_torch_function_impl):
        return None
    return torch._C.DisableTorchFunctionSubclass


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


def _is_compiled(cls: type) -> bool:
    """Whether ``cls`` is ``torch.compile``'s ``OptimizedModule``."""
    # By name: OptimizedModule is seen by the subclass watcher before its module binds it.
    return cls.__module__ == "torch._dynamo.eval_frame" and cls.__qualname__ == "OptimizedModule"


def targets_for(cls: type) -> Iterator[PatchTarget]:
    """What to wrap on one ``torch.nn.Module`` class (nothing for most classes).

    Example:
        >>> import torch
        >>> [(t.cls.__name__, t.attr) for t in targets_for(torch.jit.ScriptModule)]
        [('ScriptModule', '__call__')]
    """
    if wraps_forward(cls):
        yield PatchTarget(cls, "forward", "module", tracing)
    elif cls is torch.jit.ScriptModule:
        # ScriptModule inherits __call__ from Module: the copy set on it is deleted on exit.
        yield PatchTarget(cls, "__call__", "module", tracing, inherited=True)


class FirstCalls:
    """Wraps each ``torch.nn.Module`` class at the first call of one of its instances, for one
    opening of the board (see the module docstring).

    The first-call function sits in ``torch.nn.Module._call_impl`` and, once a class has been
    seen, in each of that class's direct subclasses; the class itself gets torch's own
    ``_call_impl`` back as an attribute of its own. So every class whose calls skip the
    first-call function has been seen, or derives from a seen class through one that was not
    (and so still passes the first-call function), or was created inside the block (and was
    wrapped then).

    Example:
        >>> import torch
        >>> from tracetorch.engine.patches import PatchBoard
        >>> board = PatchBoard()
        >>> board.acquire([])
        >>> FirstCalls(board).install()
        >>> _ = torch.nn.ReLU()(torch.ones(1))      # wraps ReLU.forward, once
        >>> sorted(attr for cls, attr in board.patched() if cls is torch.nn.ReLU)
        ['__setattr__', '_call_impl', 'forward']
        >>> board.release()
        >>> "_call_impl" in vars(torch.nn.ReLU), "_call_impl" in vars(torch.nn.ReLU6)
        (False, False)
    """

    def __init__(self, board: PatchBoard) -> None:
        self.board = board
        self.original = original = vars(torch.nn.Module)["_call_impl"]
        seen = self.seen
        is_compiling = torch.compiler.is_compiling

        def _call_impl(module: Any, *args: Any, **kwargs: Any) -> Any:
            # Dynamo folds is_compiling() and traces only the call below; a compiled function
            # running (its frame callback set) is one call, its layers unseen.
            if not (is_compiling() or frame_callback()):
                seen(type(module))
            return original(module, *args, **kwargs)

        skip_frames(_call_impl.__code__)
        self.first_call = _call_impl
        #: Classes whose own targets are wrapped in this opening (only ever grows while open).
        self._wrapped: set[type] = set()

    def install(self) -> None:
        """Put the first-call function in ``torch.nn.Module._call_impl`` until the last
        release."""
        self.board.install(torch.nn.Module, "_call_impl", self.first_call)

    def seen(self, cls: type) -> None:
        """An instance of ``cls`` is being called: wrap the ``forward``\\ s it may run, watch its
        instances' attributes (:func:`~tracetorch.adapters.torch.path_watch.watch_module_class`),
        pass the first-call function on to its direct subclasses, and let its own calls skip
        it."""
        if cls is torch.nn.Module:
            return
        self.wrap(cls)
        frame = current_frame()
        if frame is None or frame.collector.records_tree:  # (a one-shot count keeps no figures)
            watch_module_class(self.board, cls)
        install = self.board.install
        subclasses: list[type] = cls.__subclasses__()
        for sub in subclasses:  # first: none may inherit the original meanwhile
            if "_call_impl" not in vars(sub):
                install(sub, "_call_impl", self.first_call)
        if vars(cls).get("_call_impl", self.first_call) is self.first_call:  # not the user's
            install(cls, "_call_impl", self.original)

    def wrap(self, cls: type) -> None:
        """Wrap what :func:`targets_for` names on ``cls`` and every module class of its MRO."""
        wrapped = self._wrapped
        if cls in wrapped:
            return
        for klass in cls.__mro__:
            if klass not in wrapped and issubclass(klass, torch.nn.Module):
                if _is_compiled(klass):
                    wrap_compiled(self.board, klass)
                for target in targets_for(klass):
                    self.board.patch(target)
                wrapped.add(klass)  # after patching: another thread never skips it too early


class TorchAdapter:
    """Profiles ``torch.nn`` modules, backward passes, optimizer steps and tensor operations."""

    module_name = "torch"

    def patch_targets(self) -> Iterator[PatchTarget]:
        """What is wrapped on entry: ``__call__`` of scripted modules (layers are wrapped at their
        first call, compiled modules at the start: see .compiled; backward passes reach the
        function mode of .ops) and the ``DataLoader`` iterators' ``__next__``."""
        yield from targets_for(torch.jit.ScriptModule)
        loader = sys.modules.get("torch.utils.data.dataloader")
        iterator = getattr(loader, "_BaseDataLoaderIter", None)
        if iterator is not None and "__next__" in vars(iterator):
            # Each batch a DataLoader hands out: the step's data phase (tracetorch.records.phases).
            yield PatchTarget(iterator, "__next__", "data", tracing)

    def class_targets(self, cls: type) -> list[PatchTarget] | None:
        """For a class of the model given to ``profile(model)``: ``forward`` of it and of the
        module classes of its MRO (``None``: not a torch module)."""
        if not issubclass(cls, torch.nn.Module):
            return None
        return [target for klass in cls.__mro__ if issubclass(klass, torch.nn.Module)
                for target in targets_for(klass)]

    def configure(self, collector: Any) -> None:
        """A profile is being entered: on CUDA, time its calls with events (see .cuda), read
        the allocator and push NVTX ranges around them (see .call_hooks)."""
        cuda_configure(collector)
        configure_call_hooks(collector, collector.nvtx)
        wrap_compiled_in_place(collector.model)  # module.compile(): see .compiled

    def start(self, board: PatchBoard, counter: OpCounter) -> list[Callable[[], None]]:
        """Start counting operations and gradients, timing optimizer steps and watching for new
        classes; returns the cleanups, run in reverse order when the last profile closes."""
        global _RULES_REGISTERED
        from tracetorch.flops.torch_rules import nested_sizes, register_torch_rules

        if not _RULES_REGISTERED:
            register_torch_rules()
            _RULES_REGISTERED = True
        cleanups: list[Callable[[], None]] = []
        try:
            register_saved_meter(torch.Tensor, saved_bytes, torch.is_grad_enabled)
            register_int_shaped(torch.Tensor)
            register_quiet_reads(quiet_tensor_reads)
            register_irregular_sizes(nested_sizes)
            cleanups.append(start_op_counting(counter))
            cleanups.append(start_step_hooks())
            cleanups.append(start_structure_hooks(board))

            cleanups.append(start_compiled_counting(counter, board))
            module = torch.nn.Module
            board.install(module, "_slow_forward", traced_forward(vars(module)["_slow_forward"]))
            optimizer = torch.optim.Optimizer
            board.install(optimizer, "zero_grad", quiet_zero_grad(vars(optimizer)["zero_grad"]))
            start_vmap_watch(board)
            start_forward_ad_watch(board)
            start_path_watch(board)
            cleanups.append(start_context_watch(board))
            eval_frame = sys.modules.get("torch._dynamo.eval_frame")
            compiled = getattr(eval_frame, "OptimizedModule", None)
            if compiled is not None:  # else imported later: the subclass watcher wraps it
                wrap_compiled(board, compiled)

            first_calls = FirstCalls(board)
            board.watch_subclasses(torch.nn.Module, first_calls.wrap)
            first_calls.install()
        except BaseException:
            for cleanup in reversed(cleanups):
                cleanup()
            raise
        return cleanups
