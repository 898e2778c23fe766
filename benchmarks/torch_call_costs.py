"""What torch itself charges the steps tracetorch cannot do without, measured in isolation.

Three tables, each a median over interleaved rounds (one thread, process CPU time):

* ``marking``: torch's own cost, per layer output and freeing it included, of what the torch
  exit observer does so that the backward pass can be timed per layer — create the Python
  object of the output's autograd node (``out.grad_fn``), its ``metadata`` dict, and add the
  hook to the node through the hook dict of a tensor of our own
  (``grad_fn._register_hook_dict(carrier)``, ``marks._HOOK_CARRIER``) — against a hook dict
  set on the output itself (its ``_backward_hooks``, which makes torch add a second hook to the
  tensor) and ``grad_fn.register_prehook``, the public way;
* ``mode``: what one ``p.grad`` read or write costs at a profile's root, under an empty
  ``TorchFunctionMode`` and under ``tracetorch.profile`` (``zero_grad`` makes two per parameter);
* ``between products``: what a bare wrapt wrapper and tracetorch add per call of a
  ``Linear(8, 8)`` on one row and of a ``Linear(256, 256)`` on 128 rows (a BERT-sized layer):
  the same Python steps cost more between large matrix products than between small ones.

Run: ``python benchmarks/torch_call_costs.py [--rounds 9] [--quick]``
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch_peers import bare_wrapt, forward_classes

import tracetorch

_clock = time.process_time_ns


def _median_ns(samples: list[float]) -> str:
    return f"{statistics.median(samples):,.0f} ns"


def marking_costs(rounds: int, outputs: int) -> dict[str, list[float]]:
    """ns per layer output of each marking step (torch's side only), freeing included."""
    layer, x = torch.nn.Linear(8, 8), torch.randn(1, 8)

    def hook(*_: Any) -> None:
        return None

    carrier = torch.empty(0)
    carrier._backward_hooks = {0: hook}

    def metadata(out: torch.Tensor) -> None:
        out.grad_fn.metadata["mark"] = (1, 2, 3)

    def own_hook_dict(out: torch.Tensor) -> None:
        node = out.grad_fn
        out._backward_hooks = {0: hook}
        node._register_hook_dict(out)

    def the_mark(out: torch.Tensor) -> None:
        node = out.grad_fn
        node.metadata["mark"] = (1, 2, 3)
        node._register_hook_dict(carrier)

    steps: dict[str, Callable[[torch.Tensor], object]] = {
        "nothing (the loop)": lambda out: None,
        "out.grad_fn": lambda out: out.grad_fn,
        "+ metadata entry": metadata,
        "grad_fn + the carrier's hook dict": lambda out: out.grad_fn._register_hook_dict(carrier),
        "the mark (all three)": the_mark,
        "grad_fn + a hook dict on the output": own_hook_dict,
        "grad_fn.register_prehook": lambda out: out.grad_fn.register_prehook(hook),
    }
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            fresh = [layer(x) for _ in range(outputs)]
            gc.collect()
            start = _clock()
            for out in fresh:
                step(out)
            del fresh  # (the graph, and with it what marking made, freed)
            samples[name].append((_clock() - start) / outputs)
    return samples


class _EmptyMode(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        return func(*args, **(kwargs or {}))


def mode_costs(rounds: int, accesses: int) -> dict[str, list[float]]:
    """ns added per ``p.grad`` access at the top level, by what is on the mode stack."""
    param = torch.nn.Parameter(torch.randn(4))
    grad = torch.zeros(4)
    layer = torch.nn.Linear(2, 2)

    def loop() -> float:
        start = _clock()
        for _ in range(accesses):
            param.grad = grad
            _ = param.grad
        return (_clock() - start) / (2 * accesses)

    ways: dict[str, Callable[[], Any]] = {
        "no mode": contextlib.nullcontext, "empty TorchFunctionMode": _EmptyMode,
        "tracetorch.profile": lambda: tracetorch.profile(layer)}
    raw: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            with way():
                loop()
                raw[name].append(loop())
    return {name: [v - b for v, b in zip(values, raw["no mode"])]
            for name, values in raw.items() if name != "no mode"}


def wrapper_costs(rounds: int, calls: int) -> dict[str, dict[str, list[float]]]:
    """ns added per layer call by bare wrapt and tracetorch, on small and BERT-sized layers."""
    shapes = {"Linear(8, 8) on 1x8": (8, 1), "Linear(256, 256) on 1x128x256": (256, 128)}
    out: dict[str, dict[str, list[float]]] = {}
    for label, (width, rows) in shapes.items():
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(10)])
        x = torch.randn(1, rows, width)
        ways: dict[str, Callable[[], Any]] = {
            "plain": contextlib.nullcontext,
            "bare wrapt": lambda model=model: bare_wrapt(forward_classes(model)),
            "tracetorch": lambda model=model: tracetorch.profile(model)}
        raw: dict[str, list[float]] = {name: [] for name in ways}
        with torch.no_grad():
            for _ in range(rounds):
                for name, way in ways.items():
                    with way():
                        model(x)
                        gc.collect()
                        start = _clock()
                        for _ in range(calls):
                            model(x)
                        raw[name].append((_clock() - start) / (calls * 11))  # 11 calls each
        out[label] = {name: [v - b for v, b in zip(values, raw["plain"])]
                      for name, values in raw.items() if name != "plain"}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="2 short rounds (a smoke run)")
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    scale = 10 if args.quick else 1
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, medians of {rounds} rounds")
    print("marking one layer output for the backward (torch's side), ns per output, freeing "
          "it included:")
    for name, samples in marking_costs(rounds, 5000 // scale).items():
        print(f"  {name:36} {_median_ns(samples):>10}")
    print("one p.grad read or write at the top level, ns added:")
    for name, samples in mode_costs(rounds, 5000 // scale).items():
        print(f"  {name:28} {_median_ns(samples):>10}")
    print("added per layer call between products (no_grad), ns:")
    for label, ways in wrapper_costs(rounds, 50 // scale).items():
        cells = ", ".join(f"{name} +{_median_ns(samples)}" for name, samples in ways.items())
        print(f"  {label:32} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
