"""The ways of timing ``torch.nn`` modules that tracetorch is compared with, and the models.

Shared by ``overhead_torch.py`` and ``peers.py`` (both run as scripts, so this directory is on
``sys.path``). Every timing variant is a context manager that installs itself on entry and
leaves the model and torch exactly as they were on exit; none of them prints anything.

* ``bare_wrapt``      wrapt ``FunctionWrapper``\\ s on ``forward`` that only read
                      ``perf_counter_ns`` around each call: the floor of tracetorch's mechanism;
* ``timing_hooks``    forward pre/post hooks on every module timing each call, optionally with
                      ``register_full_backward_pre_hook``/``register_full_backward_hook`` timing
                      each module's backward too;
* ``torch_profiler``  ``torch.profiler.profile`` on CPU, recording every op (no shapes, no FLOPs);
* ``deepspeed_profiler``  DeepSpeed's ``FlopsProfiler`` between ``start_profile`` and
                      ``stop_profile``.
"""
from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Iterator
from typing import Callable

import torch
import wrapt

__all__ = ["PAIRS", "bare_wrapt", "build_mlp", "deepspeed_profiler", "forward_classes",
           "import_deepspeed", "module_calls", "timing_hooks", "torch_profiler",
           "torch_profiler_detailed"]

PAIRS = 50


def build_mlp() -> torch.nn.Sequential:
    """50 x (Linear(8, 8), ReLU) in a Sequential: 101 module calls per forward, each tiny."""
    layers: list[torch.nn.Module] = []
    for _ in range(PAIRS):
        layers += [torch.nn.Linear(8, 8), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def forward_classes(model: torch.nn.Module) -> list[type]:
    """The classes whose ``forward`` the model's modules run (the first definer in each MRO)."""
    classes: dict[type, None] = {}
    for module in model.modules():
        owner = next(cls for cls in type(module).__mro__ if "forward" in vars(cls))
        classes[owner] = None
    return list(classes)


@contextlib.contextmanager
def bare_wrapt(classes: list[type]) -> Iterator[list[int]]:
    """The floor of the mechanism: a wrapt wrapper on each class's ``forward`` that only times
    the call; yields the running total of ns spent inside."""
    total = [0]
    clock = time.perf_counter_ns

    def timed(wrapped: Callable, instance: object, args: tuple, kwargs: dict) -> object:
        start = clock()
        try:
            return wrapped(*args, **kwargs)
        finally:
            total[0] += clock() - start

    originals = {cls: vars(cls)["forward"] for cls in classes}
    for cls, original in originals.items():
        cls.forward = wrapt.FunctionWrapper(original, timed)
    try:
        yield total
    finally:
        for cls, original in originals.items():
            cls.forward = original


@contextlib.contextmanager
def timing_hooks(model: torch.nn.Module, backward: bool = False) -> Iterator[dict[int, int]]:
    """Forward pre/post hooks on every module timing each call (and, with ``backward``, full
    backward pre/post hooks timing each module's backward); yields ns totals by module id."""
    starts: dict[int, int] = {}
    totals: dict[int, int] = {}
    clock = time.perf_counter_ns

    def start(module: torch.nn.Module, *_: object) -> None:
        starts[id(module)] = clock()

    def stop(module: torch.nn.Module, *_: object) -> None:
        key = id(module)
        totals[key] = totals.get(key, 0) + clock() - starts[key]

    handles = []
    for module in model.modules():
        handles += [module.register_forward_pre_hook(start), module.register_forward_hook(stop)]
        if backward:
            handles += [module.register_full_backward_pre_hook(start),
                        module.register_full_backward_hook(stop)]
    try:
        yield totals
    finally:
        for handle in handles:
            handle.remove()


def torch_profiler(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """``torch.profiler`` on CPU as most people run it: every op recorded, no shapes or FLOPs
    (``model`` is unused: the profiler sees everything)."""
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  record_shapes=False, with_flops=False)


def torch_profiler_detailed(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """``torch.profiler`` as a user wanting per-layer FLOPs runs it: shapes, FLOPs and module
    hierarchy recorded (``model`` is unused)."""
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  record_shapes=True, with_flops=True, with_modules=True)


def import_deepspeed() -> None:
    """Import DeepSpeed's flops profiler, silencing the accelerator warning it prints to stdout
    (its logger keeps the silenced stream, so later DeepSpeed logging stays quiet too)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import deepspeed.profiling.flops_profiler  # noqa: F401


@contextlib.contextmanager
def deepspeed_profiler(model: torch.nn.Module) -> Iterator[None]:
    """DeepSpeed's ``FlopsProfiler`` between ``start_profile`` and ``stop_profile``; the
    attributes it leaves on modules are removed by ``end_profile``."""
    import_deepspeed()
    from deepspeed.profiling.flops_profiler import FlopsProfiler

    profiler = FlopsProfiler(model)
    profiler.start_profile()
    try:
        yield
    finally:
        profiler.stop_profile()
        profiler.end_profile()


def module_calls(model: torch.nn.Module, step: Callable[[], object]) -> int:
    """How many module forwards one ``step()`` makes, counted with forward pre hooks."""
    count = [0]

    def tick(module: torch.nn.Module, args: tuple) -> None:
        count[0] += 1

    handles = [module.register_forward_pre_hook(tick) for module in model.modules()]
    try:
        step()
    finally:
        for handle in handles:
            handle.remove()
    return count[0]
