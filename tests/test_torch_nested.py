"""Nested tensors (strided and jagged) through a profile block: the same results as outside,
FLOPs counted where the layer's rule can read the sizes, never a crash on a shape that has no
plain ints (a strided nested tensor's ``.shape`` raises, a jagged one's holds a symbolic size).
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

import tracetorch

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")


def step(layer: Any, parts: list[Any], layout: Any) -> tuple[list[Any], Any]:
    """One forward and backward of ``layer`` on a fresh nested tensor of ``parts``: the
    output's components and the weight's gradient."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the nested tensor API is a prototype: it warns
        x = torch.nested.nested_tensor(parts, layout=layout, requires_grad=True)
    out = layer(x)
    dense = out.values() if layout is torch.jagged else torch.nested.to_padded_tensor(out, 0.0)
    dense.sum().backward()
    grad = layer.weight.grad.clone()
    layer.weight.grad = None
    return [t.detach() for t in out.unbind()], grad


@pytest.mark.parametrize("layout", ["strided", "jagged"])
def test_a_linear_on_a_nested_tensor_runs_in_a_block_as_outside(layout: str) -> None:
    nested_layout = getattr(torch, layout)
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    parts = [torch.randn(2, 4), torch.randn(5, 4)]
    expected_out, expected_grad = step(layer, parts, nested_layout)
    with tracetorch.profile() as prof:
        out, grad = step(layer, parts, nested_layout)
    assert all(torch.equal(a, b) for a, b in zip(out, expected_out))
    assert torch.equal(grad, expected_grad)
    node = prof.find("")
    assert node.flops == 2 * (2 + 5) * 4 * 3  # the rows of both components, 4 -> 3
    assert node.backward_flops == 2 * (2 * (2 + 5) * 4 * 3)  # the input's and weight's grads
