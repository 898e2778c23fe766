"""What entering and leaving a profile block costs, and one-shot FLOP counts against torch's.

Printed, each a median over repeats measured in this one process:

* ``empty block``: µs to enter and leave ``with tracetorch.profile(): pass`` with torch alone
  imported, then again after ``--classes`` synthetic ``nn.Module`` subclasses (each defining
  ``forward``) are created, as a library such as timm does on import (1,172 classes); with timm
  installed, once more after ``import timm``. Goal: at most 1 ms each.
* ``decorator``: what a ``@tracetorch.profile(model)``-decorated inference step costs per call
  beyond the same step run inside one open block (the block it opens and closes, the lazily
  wrapped classes and the nodes taken up again), for a 3-module and a 101-module model.
* ``one-shot``: ``tracetorch.count_flops(model, shape)`` and a single ``with
  tracetorch.profile(model): model(x)`` against ``torch.utils.flop_counter.FlopCounterMode``
  around one forward, on a ResNet-style CNN and a small transformer encoder at batch 1 (so that
  the counting machinery, not the arithmetic, dominates), all under ``torch.no_grad()``, with
  the layer classes above still defined. Shown:
  each one's total time and time added over a plain forward, and tracetorch's as a ratio of
  FlopCounterMode's (goal: at most 0.5x).

Run: ``python benchmarks/enter_exit.py [--repeats 200] [--classes 1200] [--rounds 15]``
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import time
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import tracetorch


def median_us(fn: Callable[[], object], repeats: int) -> float:
    """Median µs of ``fn()`` over ``repeats`` calls (after two warm-up calls)."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000


def empty_block() -> None:
    with tracetorch.profile():
        pass


def synthetic_classes(count: int) -> list[type]:
    """``count`` ``nn.Module`` subclasses defining ``forward``, a third of them two levels deep
    (as a library's layers derive from its own base classes)."""
    def forward(self: nn.Module, x: Any) -> Any:
        return x

    classes: list[type] = []
    for i in range(count):
        base = classes[i - 1] if i % 3 == 2 else nn.Module
        classes.append(type(f"Synthetic{i}", (base,), {"forward": forward}))
    return classes


class BasicBlock(nn.Module):
    def __init__(self, channels: int, stride: int = 1) -> None:
        super().__init__()
        out = channels * stride
        self.conv1 = nn.Conv2d(channels, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU()
        self.down = (nn.Sequential(nn.Conv2d(channels, out, 1, stride, bias=False),
                                   nn.BatchNorm2d(out)) if stride != 1 else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + self.down(x))


def resnet() -> nn.Module:
    """A ResNet-18-shaped CNN (8 basic blocks, 4 stages) for 32x32 inputs."""
    layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                               nn.ReLU()]
    channels = 16
    for stage in range(4):
        stride = 1 if stage == 0 else 2
        layers += [BasicBlock(channels, stride), BasicBlock(channels * stride)]
        channels *= stride
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10)]
    return nn.Sequential(*layers).eval()


def transformer() -> nn.Module:
    """A 4-layer transformer encoder, width 64, 4 heads, in training mode without dropout: in
    eval mode under ``no_grad`` torch runs each layer as one fused kernel, whose FLOPs
    FlopCounterMode does not count, so there would be nothing to compare."""
    layer = nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, batch_first=True,
                                       dropout=0.0)
    return nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).train()


def one_shot_ways(model: nn.Module, shape: tuple[int, ...]) -> dict[str, Callable[[], None]]:
    """Each way of counting one forward of ``model`` on an input of ``shape`` (run under
    ``torch.no_grad()``), and the plain forward they are compared with."""
    x = torch.randn(shape)

    def plain() -> None:
        model(x)

    def flop_counter() -> None:
        with FlopCounterMode(display=False):
            model(x)

    def count_flops() -> None:
        tracetorch.count_flops(model, shape)

    def profiled() -> None:
        with tracetorch.profile(model, warn_unsupported=False):
            model(x)

    return {"plain forward": plain, "FlopCounterMode": flop_counter,
            "count_flops": count_flops, "profile(model)": profiled}


def one_shot(model: nn.Module, shape: tuple[int, ...], rounds: int) -> dict[str, float]:
    """Median µs of each way of counting one forward, interleaved round by round."""
    ways = one_shot_ways(model, shape)
    samples: dict[str, list[float]] = {name: [] for name in ways}
    with torch.no_grad():
        for _ in range(rounds):
            for name, fn in ways.items():
                samples[name].append(median_us(fn, 3))
    return {name: statistics.median(values) for name, values in samples.items()}


def report_one_shot(label: str, medians: dict[str, float]) -> None:
    plain, reference = medians["plain forward"], medians["FlopCounterMode"]
    print(f"  {label}")
    for name, us in medians.items():
        line = f"    {name:<16} {us:9.0f} us   +{us - plain:8.0f} us over a plain forward"
        if name in ("count_flops", "profile(model)"):
            line += (f"   {us / reference:.2f}x FlopCounterMode's time "
                     f"({(us - plain) / (reference - plain):.2f}x its added time)")
        print(line)


def decorator_cost(repeats: int, pairs: int) -> tuple[int, float, float, float]:
    """Module calls per step, and median µs per call of an inference step of ``pairs`` x
    (Linear(8, 8), ReLU): plain, inside one open block, and decorated (a block per call)."""
    layers: list[nn.Module] = []
    for _ in range(pairs):
        layers += [nn.Linear(8, 8), nn.ReLU()]
    model = nn.Sequential(*layers)
    x = torch.randn(1, 8)

    def step() -> None:
        with torch.no_grad():
            model(x)

    decorated = tracetorch.profile(model, warn_unsupported=False)(step)
    plain = median_us(step, repeats)
    with tracetorch.profile(model, warn_unsupported=False):
        inside = median_us(step, repeats)
    return 2 * pairs + 1, plain, inside, median_us(decorated, repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--classes", type=int, default=1200)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    gc.collect()
    print(f"torch {torch.__version__}, medians of {args.repeats} blocks")
    print(f"  empty block, torch alone:            {median_us(empty_block, args.repeats):7.0f} us")
    keep = synthetic_classes(args.classes)
    print(f"  empty block, +{len(keep)} layer classes:     "
          f"{median_us(empty_block, args.repeats):7.0f} us")
    if importlib.util.find_spec("timm") is not None:
        import timm  # noqa: F401  - imported for its layer classes

        print(f"  empty block, timm imported too:      "
              f"{median_us(empty_block, args.repeats):7.0f} us")
    for pairs in (1, 50):
        calls, plain, inside, decorated = decorator_cost(args.repeats, pairs)
        print(f"  decorator, {calls:3d} module calls: {plain:6.0f} us plain, {inside:6.0f} us in "
              f"one block, {decorated:6.0f} us decorated: +{decorated - inside:5.0f} us per "
              f"call for its block ({(decorated - inside) / calls:.1f} us per module)")
    print(f"one-shot counts, batch 1, median of {args.rounds} rounds (each a median of 3):")
    report_one_shot("ResNet-18-shaped CNN, 1x3x32x32", one_shot(resnet(), (1, 3, 32, 32),
                                                                 args.rounds))
    report_one_shot("transformer encoder, 4 layers, 1x16x64",
                    one_shot(transformer(), (1, 16, 64), args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
