"""Your own layers in the profile: counted from their tensor ops, by a rule, or instrumented.

Four ways a layer of your own shows up with the right FLOPs:

1. ``GatedUnit`` is written with plain ``Tensor`` math (``@``, ``sigmoid``, ``*``): no rule is
   needed, tracetorch counts the operations it runs and charges them to the layer.
2. ``BilinearMix`` computes on raw numpy arrays, which no profiler can see, so
   ``@tracetorch.flop_rule(BilinearMix)`` states its cost (with its MACs).
3. ``standardize`` is a plain function: ``@tracetorch.instrument(flops=...)`` makes it a row.
4. ``Temperature`` is a duck-typed class (a ``forward``, no base class), used without passing
   it to ``profile(model)``: ``@tracetorch.instrument`` makes its calls rows.

    python examples/custom_layer.py
"""
from __future__ import annotations

from typing import Any

import numpy as np

import tracetorch as tt
from tracetorch.core import Linear, Module, Sequential, Tensor, init

ROWS, FEATURES, HIDDEN, CLASSES = 32, 16, 24, 4


class GatedUnit(Module):
    """``(x @ W_value) * sigmoid(x @ W_gate)``, a GLU-style block built from Tensor operations."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        scale = 1.0 / np.sqrt(in_features)
        self.w_value = init.normal((in_features, out_features), std=scale)
        self.w_gate = init.normal((in_features, out_features), std=scale)

    def forward(self, x: Tensor) -> Tensor:
        return (x @ self.w_value) * (x @ self.w_gate).sigmoid()


class BilinearMix(Module):
    """``y[:, k] = x W_k x^T`` per row, computed with ``np.einsum`` on raw arrays."""

    def __init__(self, features: int, out_features: int) -> None:
        super().__init__()
        self.weight = init.normal((out_features, features, features), std=1.0 / features)

    def forward(self, x: Tensor) -> Tensor:
        return Tensor(np.einsum("ni,kij,nj->nk", x.data, self.weight.data, x.data))


@tt.flop_rule(BilinearMix)
def bilinear_flops(layer: BilinearMix, inputs: tuple[Any, ...], output: Any) -> tt.FlopCount:
    """Per row and output: ``x W_k`` (features² MACs), then a dot with x (features MACs)."""
    rows, features = inputs[0].shape
    macs = rows * layer.weight.shape[0] * (features * features + features)
    return tt.FlopCount(flops=2 * macs, gemm=2 * macs, macs=macs)


@tt.instrument(flops=lambda batch: 3 * batch.size)  # subtract, square (for std), divide
def standardize(batch: np.ndarray) -> np.ndarray:
    """Zero mean, unit variance per feature."""
    return (batch - batch.mean(axis=0)) / (batch.std(axis=0) + 1e-6)


@tt.instrument(flops=lambda layer, inputs, output: output.size)  # one divide per element
class Temperature:
    """Divides logits by a temperature (not a Module: any class with ``forward`` works)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def forward(self, logits: Tensor) -> Tensor:
        return Tensor(logits.data / self.t)

    def __call__(self, logits: Tensor) -> Tensor:
        return self.forward(logits)


def main() -> None:
    model = Sequential(GatedUnit(FEATURES, HIDDEN), BilinearMix(HIDDEN, HIDDEN),
                       Linear(HIDDEN, CLASSES))
    temperature = Temperature(2.0)
    raw = np.random.default_rng(0).standard_normal((ROWS, FEATURES)).astype(np.float32)

    with tt.profile(model) as prof:
        logits = model(Tensor(standardize(raw)))
        temperature(logits)
    print(prof)

    # Every number below is derived by hand and checked against what the profile recorded.
    gemm = 2 * ROWS * FEATURES * HIDDEN
    n = ROWS * HIDDEN
    expected = {
        "layers.0": (2 * gemm + 4 * n + n, "ops"),  # two matmuls, sigmoid (4/elem), multiply
        "layers.1": (2 * ROWS * HIDDEN * (HIDDEN * HIDDEN + HIDDEN), "rule"),
        "layers.2": (2 * ROWS * HIDDEN * CLASSES, "rule"),  # the built-in Linear rule
        "standardize": (3 * ROWS * FEATURES, "user"),
        "Temperature": (ROWS * CLASSES, "rule"),
    }
    print("\nWhere each layer's FLOPs come from:")
    for path, (flops, source) in expected.items():
        node = prof.find(path)
        assert (node.flops, node.flops_source) == (flops, source), (path, node.flops,
                                                                     node.flops_source)
        print(f"  {path:<12} {node.flops:>9,} FLOPs  from {source}")
    assert not prof.unsupported


if __name__ == "__main__":
    main()
