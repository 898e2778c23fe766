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

* ``ops=False``   the same with ``tracetorch.profile(model, ops=False)``: rules only, the
                  function mode off inside every layer (no switch around each ruled layer).

Both under ``torch.no_grad()`` (inference) and with autograd recording (a training forward,
where tracetorch also tags the graph for backward attribution). Printed: ns added per module
call over ``plain`` and tracetorch's added cost as a ratio of each baseline's (goals: at most
1.5x the bare wrapper's, at most 0.6x the hooks'). Then the cost of entering and leaving a
profile block, which wraps every ``nn.Module`` class defining ``forward``.

Then what operation counting costs (tracetorch's ``TorchFunctionMode``, see
``tracetorch/adapters/torch/ops.py``), each a median over rounds of the difference to a baseline
timed in the same round: per uncounted op (``torch.relu``) with the mode on the stack, against
an empty mode; per counted op (``torch.mm`` at a profile's root); per ruled layer call made
where operations are counted (the switch that pops the mode for the layer and pushes it back),
against the same layer called where no switch is needed; and the switch pair alone.

Run: ``python benchmarks/overhead_torch.py [--rounds 15] [--forwards 200]``
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import Callable

import torch
from torch_peers import PAIRS, bare_wrapt, build_mlp, timing_hooks

import tracetorch

CALLS = 2 * PAIRS + 1  # every Linear and ReLU, plus the Sequential


def time_forwards(model: torch.nn.Module, x: torch.Tensor, forwards: int) -> float:
    """ns per forward over ``forwards`` back-to-back calls."""
    start = time.perf_counter_ns()
    for _ in range(forwards):
        model(x)
    return (time.perf_counter_ns() - start) / forwards


def measure(rounds: int, forwards: int, grad: bool) -> dict[str, float]:
    """Median ns per forward of each variant."""
    model = build_mlp()
    x = torch.randn(1, 8)
    classes = [torch.nn.Linear, torch.nn.ReLU, torch.nn.Sequential]
    samples: dict[str, list[float]] = {"plain": [], "bare wrapt": [], "hooks": [],
                                       "tracetorch": [], "ops=False": []}
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
                with tracetorch.profile(model, ops=False):
                    samples["ops=False"].append(time_forwards(model, x, forwards))
        finally:
            gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def report(medians: dict[str, float], label: str) -> dict[str, float]:
    plain = medians["plain"]
    added = {name: (ns - plain) / CALLS for name, ns in medians.items()}
    print(f"  {label}")
    for name, ns in medians.items():
        print(f"    {name:<11} {ns / 1000:9.1f} us/forward   +{added[name]:6.0f} ns/module call")
    ratios = {"bare": added["tracetorch"] / added["bare wrapt"],
              "hooks": added["tracetorch"] / added["hooks"],
              "ops": added["ops=False"] / added["tracetorch"]}
    print(f"    tracetorch added / bare wrapt added = {ratios['bare']:.2f}x (goal <= 1.5x)")
    print(f"    tracetorch added / hooks added      = {ratios['hooks']:.2f}x (goal <= 0.6x)")
    print(f"    ops=False added / tracetorch added  = {ratios['ops']:.2f}x")
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


def _per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls


def op_costs(rounds: int = 7, calls: int = 20_000) -> dict[str, float]:
    """Median ns added per op or per layer call by operation counting (see the docstring)."""
    from tracetorch.adapters.torch.ops import OpCountingMode, make_switch
    from tracetorch.engine.hotpath import OpCounter

    x, a = torch.randn(1, 8), torch.randn(8, 8)
    switch = make_switch(OpCountingMode(OpCounter()))
    relu, mm = (lambda: torch.relu(x)), (lambda: torch.mm(x, a))
    ruled = torch.nn.Linear(8, 8)

    class RuledParent(torch.nn.Module):
        """Given a rule below, so its child runs without a switch; calls it ``n`` times."""

        def forward(self, n: int) -> None:
            for _ in range(n):
                ruled(x)

    parent = RuledParent()
    rules = {RuledParent: lambda module, inputs, output: 0}
    samples: dict[str, list[float]] = {name: [] for name in (
        "empty mode", "fast path", "fast path vs empty", "counted op", "switch per layer",
        "switch pair")}
    with torch.no_grad():
        for _ in range(rounds):
            plain_relu, plain_mm = _per_call(relu, calls), _per_call(mm, calls)
            with _PassThrough():
                empty = _per_call(relu, calls)
            switch(True)
            try:
                fast = _per_call(relu, calls)
            finally:
                switch(False)
            samples["empty mode"].append(empty - plain_relu)
            samples["fast path"].append(fast - plain_relu)
            samples["fast path vs empty"].append(fast - empty)
            with tracetorch.profile(flop_rules=rules):
                samples["counted op"].append(_per_call(mm, calls) - plain_mm)
                at_root = _per_call(lambda: ruled(x), calls // 10)  # pops and pushes per call
                start = time.perf_counter_ns()
                parent(calls // 10)  # the same calls where counting is off already
                nested = (time.perf_counter_ns() - start) / (calls // 10)
            samples["switch per layer"].append(at_root - nested)
            samples["switch pair"].append(_per_call(lambda: (switch(True), switch(False)), calls))
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
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
    costs = op_costs(rounds=max(3, args.rounds // 2))
    print("  operation counting (torch function mode), ns added, medians:")
    print(f"    per uncounted op (torch.relu), mode on the stack: {costs['fast path']:.0f} "
          f"(an empty TorchFunctionMode: {costs['empty mode']:.0f}; the fast path adds "
          f"{costs['fast path vs empty']:.0f} to it)")
    print(f"    per counted op (torch.mm at a profile's root):   {costs['counted op']:.0f}")
    print(f"    per ruled layer call where ops are counted (switch off and on again): "
          f"{costs['switch per layer']:.0f} (the switch pair alone: {costs['switch pair']:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
