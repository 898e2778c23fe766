"""count_flops takes what users have: a shape, or the model's real inputs (a tensor, token ids,
a tuple of arguments, a dict of keyword arguments); a bad input is reported without printing a
tensor's contents."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tracetorch
from tracetorch.core import Linear, Tensor

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")
nn = torch.nn


def test_a_shape_and_a_real_input_count_the_same():
    layer = nn.Linear(3, 2)
    assert tracetorch.count_flops(layer, (4, 3)) == tracetorch.count_flops(
        layer, torch.ones(4, 3)) == tracetorch.count_flops(layer, [4, 3]) == 2 * 4 * 3 * 2
    core = Linear(3, 2)
    assert tracetorch.count_flops(core, Tensor(np.ones((4, 3)))) == 2 * 4 * 3 * 2


def test_token_ids_positional_and_keyword_arguments():
    class Lookup(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(10, 4), nn.Linear(4, 6)

        def forward(self, ids, scale=None):
            out = self.head(self.embed(ids))
            return out if scale is None else out * scale

    model, ids = Lookup(), torch.tensor([[1, 2, 3]])
    gemm = 2 * 3 * 4 * 6
    assert tracetorch.count_flops(model, ids) == gemm
    assert tracetorch.count_flops(model, {"ids": ids}) == gemm
    scaled = tracetorch.count_flops(model, (ids, torch.ones(1)))
    assert scaled == tracetorch.count_flops(model, {"ids": ids, "scale": torch.ones(1)}) >= gemm


def test_a_bad_shape_names_the_argument_and_never_prints_a_tensor():
    with pytest.raises(ValueError, match=r"inputs: expected a non-empty tuple of positive ints, "
                                         r"got \(0, 3\)"):
        tracetorch.count_flops(nn.Linear(3, 2), (0, 3))
    from tracetorch.introspect import check_shape

    with pytest.raises(ValueError) as caught:
        check_shape(torch.ones(100, 100))
    assert str(caught.value) == ("input_shape: expected a non-empty tuple of positive ints, "
                                 "got a Tensor of shape (100, 100)")
    with pytest.raises(TypeError, match="inputs: expected a shape"):
        tracetorch.count_flops(nn.Linear(3, 2), None)
