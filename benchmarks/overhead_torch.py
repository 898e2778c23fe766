"""What tracetorch adds per ``torch.nn`` module call, against the cheapest ways to time modules.

Model: 50 x (nn.Linear(8, 8), nn.ReLU) in an nn.Sequential at batch 1 (101 module calls per
forward, each a few µs, so per-call cost dominates). Four variants, interleaved round by round
in one process, each timed as a median over rounds:

* ``plain``       the model with nothing installed;
* ``bare wrapt``  wrapt ``FunctionWrapper``\\ s on ``Linear.forward``, ``ReLU.forward`` and
                  ``Sequential.forward`` that only read ``perf_counter_ns`` around each call;
* ``hooks``       ``register_forward_pre_hook`` + ``register_forward_hook`` on every module,
                  timing each call with ``perf_counter_ns``;
* ``tracetorch``  the model inside ``with tracetorch.profile():`` (entered once, steady state).

Both under ``torch.no_grad()`` (inference) and with autograd recording (a training forward,
where tracetorch also tags the graph for backward attribution). Printed: ns added per module
call over ``plain`` and tracetorch's added cost as a ratio of each baseline's (goals: at most
1.5x the bare wrapper's, at most 0.6x the hooks'). Then the cost of entering and leaving a
profile block, which wraps every ``nn.Module`` class defining ``forward``.

Run: ``python benchmarks/overhead_torch.py [--rounds 15] [--forwards 200]``
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from typing import Callable, Dict, Iterator, List, Optional

import torch
import wrapt

import tracetorch

PAIRS = 50
CALLS = 2 * PAIRS + 1  # every Linear and ReLU, plus the Sequential


def build_model() -> torch.nn.Sequential:
    layers: List[torch.nn.Module] = []
    for _ in range(PAIRS):
        layers += [torch.nn.Linear(8, 8), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def time_forwards(model: torch.nn.Module, x: torch.Tensor, forwards: int) -> float:
    """ns per forward over ``forwards`` back-to-back calls."""
    start = time.perf_counter_ns()
    for _ in range(forwards):
        model(x)
    return (time.perf_counter_ns() - start) / forwards


@contextlib.contextmanager
def bare_wrapt(classes: List[type]) -> Iterator[List[int]]:
    """The floor of the mechanism: a wrapt wrapper that only times the call."""
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
def timing_hooks(model: torch.nn.Module) -> Iterator[Dict[int, int]]:
    """Plain forward pre/post hooks on every module, timing each call."""
    starts: Dict[int, int] = {}
    totals: Dict[int, int] = {}
    clock = time.perf_counter_ns

    def pre(module: torch.nn.Module, args: tuple) -> None:
        starts[id(module)] = clock()

    def post(module: torch.nn.Module, args: tuple, output: object) -> None:
        key = id(module)
        totals[key] = totals.get(key, 0) + clock() - starts[key]

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    try:
        yield totals
    finally:
        for handle in handles:
            handle.remove()


def measure(rounds: int, forwards: int, grad: bool) -> Dict[str, float]:
    """Median ns per forward of each variant."""
    model = build_model()
    x = torch.randn(1, 8)
    classes = [torch.nn.Linear, torch.nn.ReLU, torch.nn.Sequential]
    samples: Dict[str, List[float]] = {"plain": [], "bare wrapt": [], "hooks": [],
                                       "tracetorch": []}
    with torch.set_grad_enabled(grad):
        for _ in range(5):
            model(x)
        gc.disable()
        try:
            for _ in range(rounds):
                samples["plain"].append(time_forwards(model, x, forwards))
                with bare_wrapt(classes):
                    samples["bare wrapt"].append(time_forwards(model, x, forwards))
                with timing_hooks(model):
                    samples["hooks"].append(time_forwards(model, x, forwards))
                with tracetorch.profile(model):
                    samples["tracetorch"].append(time_forwards(model, x, forwards))
        finally:
            gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def report(medians: Dict[str, float], label: str) -> Dict[str, float]:
    plain = medians["plain"]
    added = {name: (ns - plain) / CALLS for name, ns in medians.items()}
    print(f"  {label}")
    for name, ns in medians.items():
        print(f"    {name:<11} {ns / 1000:9.1f} us/forward   +{added[name]:6.0f} ns/module call")
    ratios = {"bare": added["tracetorch"] / added["bare wrapt"],
              "hooks": added["tracetorch"] / added["hooks"]}
    print(f"    tracetorch added / bare wrapt added = {ratios['bare']:.2f}x (goal <= 1.5x)")
    print(f"    tracetorch added / hooks added      = {ratios['hooks']:.2f}x (goal <= 0.6x)")
    return ratios


def block_cost(repeats: int = 5) -> float:
    """Median ms to enter and leave an empty profile block (wrapping every module class)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        with tracetorch.profile():
            pass
        times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times)


def wrapped_class_count() -> int:
    """How many ``nn.Module`` classes a profile block wraps (those defining ``forward``)."""
    from tracetorch.engine.patches import BOARD

    with tracetorch.profile():
        return sum(1 for cls, attr in BOARD.patched()
                   if attr == "forward" and issubclass(cls, torch.nn.Module))


class _PassThrough(torch.overrides.TorchFunctionMode):
    """The cheapest function mode: what routing every torch call through Python costs."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        return func(*args, **(kwargs or {}))


def op_costs(calls: int = 20_000) -> Dict[str, float]:
    """ns added per torch op: an empty TorchFunctionMode on every op (``relu``), and tracetorch's
    counting wrapper on a counted op (``mm``) called outside any layer."""
    x, a = torch.randn(1, 8), torch.randn(8, 8)

    def per_call(fn: Callable[[], object]) -> float:
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        return (time.perf_counter_ns() - start) / calls

    samples: Dict[str, List[float]] = {"function mode": [], "counted op": []}
    for _ in range(7):
        plain_relu, plain_mm = per_call(lambda: torch.relu(x)), per_call(lambda: torch.mm(x, a))
        with _PassThrough():
            samples["function mode"].append(per_call(lambda: torch.relu(x)) - plain_relu)
        with tracetorch.profile():
            samples["counted op"].append(per_call(lambda: torch.mm(x, a)) - plain_mm)
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--forwards", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 50 x (nn.Linear(8,8), nn.ReLU), batch 1, {CALLS} module "
          f"calls/forward, median of {args.rounds} rounds x {args.forwards} forwards")
    report(measure(args.rounds, args.forwards, grad=False), "inference (torch.no_grad)")
    report(measure(args.rounds, args.forwards, grad=True), "training forward (autograd on)")
    print(f"  entering + leaving a profile block: {block_cost():.1f} ms "
          f"({wrapped_class_count()} nn.Module classes wrapped)")
    costs = op_costs()
    print(f"  an empty TorchFunctionMode adds {costs['function mode']:.0f} ns to every torch op; "
          f"tracetorch's counting of a counted op (torch.mm) adds {costs['counted op']:.0f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
