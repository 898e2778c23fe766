"""Roofline labels for real on this machine: the three cases the tests fix with injected numbers.

For each framework, ``tracetorch.calibrate`` measures (or reads from its cache) the peak matmul
FLOP/s, the copy bandwidth and one layer call's cost; then each case runs under
``profile(machine=...)`` after one warm-up call, and the bottleneck analysis labels it:

* ``Linear(4096, 4096)`` at batch 1: 64 MiB of weights for 33.6 MFLOPs, expected memory-bound
  (weight loading);
* the same at batch 2048: 68.7 GFLOPs, expected compute-bound;
* ``Sequential`` of 100 ``Linear(4, 4)`` at batch 1: 32 FLOPs a call, expected overhead-bound.

For the stack, the row gives the labels of its 100 layers and the median intensity, % of
ceiling and time per call. Inference only (``torch.no_grad``), float32, on the CPU.

Run: ``python benchmarks/roofline.py [--framework numpy|torch|both] [--calls N] [--refresh]
[--quick]`` (``--quick``: numpy only, one call per case).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
from collections import Counter
from typing import Any, Callable

import numpy as np

import tracetorch
from tracetorch.analysis.roofline import LayerBound
from tracetorch.text.units import format_time_ns

CASES: tuple[tuple[str, str, int, int, int], ...] = (
    # name, expected label, features, batch, layers
    ("Linear(4096,4096) batch 1", "memory-bound", 4096, 1, 1),
    ("Linear(4096,4096) batch 2048", "compute-bound", 4096, 2048, 1),
    ("100 x Linear(4,4) batch 1", "overhead-bound", 4, 1, 100),
)


def build(framework: str, features: int, batch: int, layers: int) -> tuple[Any, Any]:
    """The model and its input: one Linear, or a Sequential of ``layers`` of them."""
    if framework == "numpy":
        from tracetorch.core import Linear, Sequential, Tensor

        x = Tensor(np.ones((batch, features), dtype=np.float32))
        if layers == 1:
            return Linear(features, features), x
        return Sequential(*[Linear(features, features) for _ in range(layers)]), x
    import torch

    x = torch.ones(batch, features)
    if layers == 1:
        return torch.nn.Linear(features, features), x
    return torch.nn.Sequential(*[torch.nn.Linear(features, features) for _ in range(layers)]), x


def _inference(framework: str) -> contextlib.AbstractContextManager[Any]:
    if framework == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def run_case(framework: str, machine: tracetorch.Machine, features: int, batch: int,
             layers: int, calls: int) -> list[LayerBound]:
    """The labelled layers of ``calls`` profiled calls (one warm-up call first)."""
    model, x = build(framework, features, batch, layers)
    with _inference(framework):
        model(x)
        with tracetorch.profile(model, machine=machine, warn_unsupported=False) as prof:
            for _ in range(calls):
                model(x)
    return list(prof.analyze().layers)


def _median(bounds: list[LayerBound], value: Callable[[LayerBound], float]) -> float:
    return statistics.median(value(b) for b in bounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=("numpy", "torch", "both"), default="both")
    parser.add_argument("--calls", type=int, default=5, help="profiled calls per case")
    parser.add_argument("--refresh", action="store_true", help="calibrate again")
    parser.add_argument("--quick", action="store_true", help="numpy only, one call per case")
    args = parser.parse_args()
    frameworks = ["numpy"] if args.quick else (
        ["numpy", "torch"] if args.framework == "both" else [args.framework])
    calls = 1 if args.quick else args.calls
    rows = []
    for framework in frameworks:
        machine = tracetorch.calibrate(framework, refresh=args.refresh)
        print(f"{framework}: {machine.describe()}")
        for name, expected, features, batch, layers in CASES:
            bounds = run_case(framework, machine, features, batch, layers, calls)
            labels = Counter(b.bound for b in bounds)
            got = ", ".join(f"{label} x{n}" if n > 1 else label for label, n in labels.items())
            rows.append((name, framework, expected, got,
                         f"{_median(bounds, lambda b: b.intensity):.3g}",
                         f"{100 * _median(bounds, lambda b: b.fraction_of_ceiling):.1f}%",
                         format_time_ns(
                             _median(bounds, lambda b: b.time_ns / b.calls)),
                         "yes" if set(labels) == {expected} else "NO"))
    print()
    print("| case | framework | expected | label | FLOP/B | % of ceiling | time per call "
          "| as expected |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
