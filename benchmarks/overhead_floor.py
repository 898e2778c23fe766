"""How much per-call bookkeeping costs in pure Python, step by step, against a bare wrapper.

Each variant is a wrapt wrapper on a trivial duck-typed layer (100 calls per round), adding one
piece of what a call-tree profiler must do per call:

* ``bare``        read ``perf_counter_ns`` before and after the call (the floor of the mechanism);
* ``+contextvar`` keep the open call in a ``ContextVar`` (set before, reset after), which is what
                  keeps threads and asyncio tasks apart;
* ``+node``       find the child node of the open call and append the duration to it;
* ``+shape``      count the call under its input shape (so FLOP rules run once per shape);
* ``tracetorch``  the real thing: the layers inside ``tracetorch.profile()``.

This is the floor under ``tracetorch.profile``'s hot path (``tracetorch/engine/hotpath.py``): it
shows how close a pure-Python design can get to the goal of 1.5x the bare wrapper's added cost.

Run: ``python benchmarks/overhead_floor.py [--rounds 11]``
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from contextvars import ContextVar
from typing import Any, Callable

import wrapt

import tracetorch

CALLS = 100
_clock = time.perf_counter_ns
_open: ContextVar[Any] = ContextVar("open_call", default=None)


class Layer:
    def forward(self, x: Any) -> Any:
        return x

    def __call__(self, x: Any) -> Any:
        return self.forward(x)


class Input:
    shape = (1, 8)


class Holder:
    """A duck-typed model holding the layers, so ``profile(model)`` wraps ``Layer.forward``."""

    def __init__(self, layers: list[Layer]) -> None:
        self.layers = layers

    def forward(self, x: Any) -> Any:
        return x


class Node:
    def __init__(self) -> None:
        self.children: dict[int, Node] = {}
        self.durations: list[int] = []
        self.per_shape: dict[Any, list[int]] = {}


def bare(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    start = _clock()
    try:
        return wrapped(*args, **kwargs)
    finally:
        bare.total += _clock() - start  # type: ignore[attr-defined]


bare.total = 0  # type: ignore[attr-defined]


def make_variant(node_step: bool, shape_step: bool) -> Callable:
    def wrapper(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
        parent = _open.get()
        if parent is None:
            return wrapped(*args, **kwargs)
        node = parent
        if node_step:
            node = parent.children.get(id(instance))
            if node is None:
                node = parent.children[id(instance)] = Node()
        token = _open.set(node)
        start = _clock()
        try:
            output = wrapped(*args, **kwargs)
        finally:
            end = _clock()
            _open.reset(token)
        if node_step:
            durations = node.durations
            durations.append(end - start)
            if len(durations) >= 512:
                durations.clear()
        if shape_step:
            key = getattr(args[0], "shape", None) if len(args) == 1 and not kwargs else None
            counter = node.per_shape.get(key)
            if counter is None:
                counter = node.per_shape[key] = [0]
            counter[0] += 1
        return output

    return wrapper


VARIANTS: dict[str, Callable | None] = {
    "plain": None,
    "bare": bare,
    "+contextvar": make_variant(False, False),
    "+node": make_variant(True, False),
    "+shape": make_variant(True, True),
}


def run(rounds: int) -> dict[str, float]:
    layers, x = [Layer() for _ in range(CALLS)], Input()
    original = vars(Layer)["forward"]
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    _open.set(Node())
    gc.disable()
    def timed() -> float:
        start = _clock()
        for _ in range(300):
            for layer in layers:
                layer(x)
        return (_clock() - start) / (300 * CALLS)

    samples["tracetorch"] = []
    try:
        for _ in range(rounds):
            for name, wrapper in VARIANTS.items():
                Layer.forward = original if wrapper is None else wrapt.FunctionWrapper(original,
                                                                                      wrapper)
                samples[name].append(timed())
            Layer.forward = original
            with tracetorch.profile(Holder(layers), flop_rules={Layer: None}):
                samples["tracetorch"].append(timed())
    finally:
        Layer.forward = original
        gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)
    medians = run(args.rounds)
    plain = medians["plain"]
    floor = medians["bare"] - plain
    print(f"ns added per call over a plain call, median of {args.rounds} rounds")
    for name, ns in medians.items():
        added = ns - plain
        print(f"  {name:<12} +{added:6.0f} ns   {added / floor:4.2f}x the bare wrapper")
    return 0


if __name__ == "__main__":
    sys.exit(main())
