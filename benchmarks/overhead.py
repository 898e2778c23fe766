"""What the profiler adds per layer call, against the floor of the mechanism, and its memory.

Model: 50 x (Linear(8, 8), ReLU) from ``tracetorch.core`` at batch 1, so fixed per-call cost
dominates (101 layer calls per forward). Three variants run interleaved, in the same process:

* ``plain``      the model with nothing installed;
* ``bare wrapt`` a wrapt ``FunctionWrapper`` on ``Linear.forward`` and ``ReLU.forward`` that only
                 reads ``perf_counter_ns`` before and after each call (the floor of the mechanism);
* ``tracetorch`` the model inside ``with tracetorch.profile():`` (entered once, steady state).

Reported: median ns per forward, ns added per layer call over ``plain``, and the ratio of
tracetorch's added cost to the bare wrapper's. Then the memory held after 1,000,000 recorded calls
(tracemalloc), and an identity check that no patched attribute survives the block. With torch
installed, the core comparison runs again once torch is imported (core layers must cost the
same), then ``benchmarks/overhead_torch.py`` runs the same comparison on ``torch.nn`` modules.

Run: ``python benchmarks/overhead.py [--rounds 15] [--calls 1000000]``
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Callable

import numpy as np
import wrapt

import tracetorch
from tracetorch.adapters.base import all_subclasses
from tracetorch.core import Linear, Module, ReLU, Sequential, Tensor

PAIRS = 50
CALLS_PER_FORWARD = 2 * PAIRS + 1  # every Linear and ReLU, plus the Sequential itself


def build_model() -> Sequential:
    layers: list[Module] = []
    for _ in range(PAIRS):
        layers += [Linear(8, 8), ReLU()]
    return Sequential(*layers)


def time_forwards(model: Sequential, x: Tensor, forwards: int) -> float:
    """Median-free single reading: ns per forward over ``forwards`` back-to-back calls."""
    start = time.perf_counter_ns()
    for _ in range(forwards):
        model(x)
    return (time.perf_counter_ns() - start) / forwards


class BareWrapper:
    """wrapt wrappers that only time each call: the cheapest possible instrumentation."""

    def __init__(self, classes: list[type]) -> None:
        self.classes = classes
        self.total_ns = 0

    def _timed(self, wrapped: Callable, instance: object, args: tuple, kwargs: dict) -> object:
        start = time.perf_counter_ns()
        try:
            return wrapped(*args, **kwargs)
        finally:
            self.total_ns += time.perf_counter_ns() - start

    def __enter__(self) -> BareWrapper:
        self.originals = {cls: vars(cls)["forward"] for cls in self.classes}
        for cls, original in self.originals.items():
            cls.forward = wrapt.FunctionWrapper(original, self._timed)
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, original in self.originals.items():
            cls.forward = original


def measure_overhead(rounds: int, forwards: int) -> dict[str, float]:
    model = build_model()
    x = Tensor(np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32))
    samples: dict[str, list[float]] = {"plain": [], "bare wrapt": [], "tracetorch": []}
    bare = BareWrapper([Linear, ReLU, Sequential])
    for _ in range(3):  # warm caches and the rule cache
        model(x)
    gc.disable()
    try:
        for _ in range(rounds):
            samples["plain"].append(time_forwards(model, x, forwards))
            with bare:
                samples["bare wrapt"].append(time_forwards(model, x, forwards))
            with tracetorch.profile(model, timeline=False):
                samples["tracetorch"].append(time_forwards(model, x, forwards))
    finally:
        gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def measure_memory(calls: int) -> float:
    """MiB held by a profile after ``calls`` recorded layer calls."""
    model = build_model()
    x = Tensor(np.zeros((1, 8), dtype=np.float32))
    forwards = calls // CALLS_PER_FORWARD + 1
    tracemalloc.start()
    try:
        with tracetorch.profile(model) as prof:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(forwards):
                model(x)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    recorded = sum(n.calls for n in prof.nodes())
    print(f"memory: {recorded:,} calls recorded, {held / 2**20:.2f} MiB held by the profile")
    return held / 2**20


def measure_real_model(rounds: int) -> None:
    """The demo CNN's training step (batch 32, 28x28), plain against profiled: overhead where
    layers do real work."""
    from tracetorch.cli.demo import build_cnn, make_dataset, train_step
    from tracetorch.core import SGD, CrossEntropyLoss

    model, loss_fn = build_cnn(), CrossEntropyLoss()
    optimizer = SGD(model.parameters(), lr=0.01)
    images, labels = make_dataset(32)
    x = Tensor(images)
    samples: dict[str, list[float]] = {"plain": [], "tracetorch": []}
    prof = tracetorch.profile(model)

    def timed_steps(into: list[float], steps: int = 5) -> None:
        for _ in range(steps):
            start = time.perf_counter_ns()
            train_step(model, loss_fn, optimizer, x, labels)
            into.append(time.perf_counter_ns() - start)

    train_step(model, loss_fn, optimizer, x, labels)
    for _ in range(rounds):  # blocks of steps, alternating, the profile kept across blocks
        timed_steps(samples["plain"])
        with prof:
            timed_steps(samples["tracetorch"])
    plain, profiled = (statistics.median(samples[k]) for k in ("plain", "tracetorch"))
    print(f"real model: demo CNN training step, median of {5 * rounds}: "
          f"plain {plain / 1e6:.2f} ms, profiled {profiled / 1e6:.2f} ms ({profiled / plain:.3f}x)")


def check_restored() -> bool:
    classes = list(all_subclasses(Module))
    before = {cls: vars(cls).get("forward") for cls in classes}
    model = build_model()
    with tracetorch.profile(model):
        model(Tensor(np.zeros((1, 8), dtype=np.float32)))
    after = {cls: vars(cls).get("forward") for cls in classes}
    same = all(after[cls] is before[cls] for cls in classes)
    print(f"identity: {len(classes)} core classes checked, every forward restored: {same}")
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--forwards", type=int, default=200)
    parser.add_argument("--calls", type=int, default=1_000_000)
    args = parser.parse_args(argv)

    medians = measure_overhead(args.rounds, args.forwards)
    plain = medians["plain"]
    print(f"tracetorch.core, 50 x (Linear(8,8), ReLU), batch 1, {CALLS_PER_FORWARD} calls/forward,"
          f" median of {args.rounds} rounds x {args.forwards} forwards")
    added = {}
    for name, ns in medians.items():
        added[name] = (ns - plain) / CALLS_PER_FORWARD
        print(f"  {name:<11} {ns / 1000:9.1f} us/forward   +{added[name]:7.0f} ns/call")
    ratio = added["tracetorch"] / added["bare wrapt"]
    print(f"  tracetorch added cost / bare wrapt added cost = {ratio:.2f}x (goal <= 1.5x)")
    measure_real_model(args.rounds)
    memory = measure_memory(args.calls)
    print(f"  memory goal < 20 MB for 1e6 calls: {'met' if memory < 20 else 'NOT met'}")
    restored = check_restored()

    if importlib.util.find_spec("torch") is None:
        print("torch not installed: skipping the torch comparison")
    else:
        import torch  # noqa: F401  core layers must cost the same once torch is imported

        again = measure_overhead(args.rounds, args.forwards)
        with_torch = (again["tracetorch"] - again["plain"]) / CALLS_PER_FORWARD
        print(f"  tracetorch.core with torch imported: +{with_torch:.0f} ns/call "
              f"({with_torch / added['tracetorch']:.2f}x the cost without)")
        sys.path.insert(0, str(Path(__file__).parent))
        import overhead_torch

        overhead_torch.main([f"--rounds={args.rounds}"])
    return 0 if restored else 1


if __name__ == "__main__":
    sys.exit(main())
