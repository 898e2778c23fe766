"""What ``prof.step()`` costs as the tree grows, and what a layer's first call costs as it nests.

Two measurements on ``torch.nn`` modules, in one process:

* **step**: a tree of ``N`` leaves (``nn.Sequential`` of ``N`` ``nn.Identity``), built once by a
  full forward. Then, per round, either the whole model runs (``all ran``) or one leaf is called
  on its own (``1 ran``), and only the following ``prof.step()`` is timed. A step folds no
  counter (the tree's reader does): both should be flat in ``N``, ``all ran`` included.
* **first call**: a chain ``Sequential(Sequential(...(Linear)))`` of depth ``D``. Per round a
  fresh profile is entered (patching is not timed) and another small chain runs in it first (what
  the first layer call of a profile costs, once, is not per module); then the model's first
  forward is timed, then a second one: ``(first - second) / modules`` is what creating a node
  costs. It should not grow with ``D``.

Medians over rounds; the ratios compare each row with the smallest size in the same run.

Run: ``python benchmarks/step_cost.py [--rounds 60]``
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import tracetorch

SIZES = (10, 100, 1000)
DEPTHS = (1, 10, 100)


def step_ns(leaves: int, rounds: int, all_ran: bool) -> float:
    """Median ns of one ``prof.step()`` after one leaf or the whole model ran."""
    model = torch.nn.Sequential(*[torch.nn.Identity() for _ in range(leaves)])
    x = torch.zeros(1)
    samples = []
    with tracetorch.profile(model) as prof:
        model(x)
        model[0](x)  # its top-level node exists before timing starts
        prof.step()
        for _ in range(rounds):
            if all_ran:
                model(x)
            else:
                model[0](x)
            start = time.perf_counter_ns()
            prof.step()
            samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples)


def chain(depth: int) -> torch.nn.Module:
    """``depth`` nested ``nn.Sequential`` around one ``nn.Linear`` (``depth + 1`` modules)."""
    model: torch.nn.Module = torch.nn.Linear(4, 4)
    for _ in range(depth):
        model = torch.nn.Sequential(model)
    return model


def first_call_ns(depth: int, rounds: int) -> float:
    """Median ns added per module by the first forward of a fresh profile over the second."""
    model, warm = chain(depth), chain(1)
    x = torch.zeros(1, 4)
    samples = []
    with torch.no_grad():
        for _ in range(rounds):
            with tracetorch.profile(model, ops=False):
                warm(x)  # what a profile's first call of any layer costs is not per module
                start = time.perf_counter_ns()
                model(x)
                first = time.perf_counter_ns() - start
                start = time.perf_counter_ns()
                model(x)
                second = time.perf_counter_ns() - start
            samples.append((first - second) / (depth + 1))
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    print("prof.step() after one leaf ran / after all ran (median ns per step)")
    print(f"{'nodes':>6} {'1 ran':>10} {'x N=10':>7} {'all ran':>10} {'ns/node':>8} {'x N=10':>7}")
    base_one = base_all = 0.0
    for leaves in SIZES:
        one = step_ns(leaves, args.rounds, all_ran=False)
        full = step_ns(leaves, args.rounds, all_ran=True) / (leaves + 1)
        base_one, base_all = base_one or one, base_all or full
        print(f"{leaves:>6} {one:>10,.0f} {one / base_one:>7.2f} {full * (leaves + 1):>10,.0f} "
              f"{full:>8,.0f} {full / base_all:>7.2f}")
    print("\nfirst call of a nested Sequential chain (median ns added per module)")
    print(f"{'depth':>6} {'ns/module':>10} {'x D=1':>7}")
    base = 0.0
    for depth in DEPTHS:
        cost = first_call_ns(depth, max(5, args.rounds // 4))
        base = base or cost
        print(f"{depth:>6} {cost:>10,.0f} {cost / base:>7.2f}")


if __name__ == "__main__":
    main()
