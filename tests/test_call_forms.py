"""A rule sees a call's arguments however they were passed: positional or keyword, defaults
applied; an argument whose ``.shape`` is not a shape never breaks the call (issue 10, item 1)."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import tracetorch
from tracetorch.core import CrossEntropyLoss, Linear, Tensor

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")
nn = torch.nn


def flops(layer, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracetorch.profile(layer) as prof:
            layer(*args, **kwargs)
    return prof.find("").flops


def test_torch_layers_called_with_keywords_count_as_positional():
    x = torch.randn(5, 3, 4)
    lstm = nn.LSTM(4, 6)
    expected = 5 * 3 * (2 * 4 * 6 * (4 + 6) + 9 * 6)  # steps x (gate products + gate maths)
    assert flops(lstm, x) == flops(lstm, input=x) == expected
    up = nn.ConvTranspose2d(3, 4, 3)
    image = torch.randn(1, 3, 8, 8)
    assert flops(up, image) == flops(up, input=image) == 2 * 3 * 4 * 9 * 8 * 8


def test_cells_count_every_row_of_the_batch():
    cell, x = nn.GRUCell(4, 6), torch.randn(32, 4)
    expected = 2 * 32 * 3 * 6 * (4 + 6) + 32 * 7 * 6
    assert flops(cell, x) == flops(cell, input=x) == flops(cell, x, torch.zeros(32, 6)) == expected


def test_adaptive_pooling_to_one_reduces_every_spatial_element():
    assert flops(nn.AdaptiveAvgPool2d(1), torch.randn(1, 512, 7, 7)) == 512 * 7 * 7
    assert flops(nn.AdaptiveMaxPool1d(1), torch.randn(2, 3, 10)) == 2 * 3 * 10


def test_embedding_bag_weights_given_by_keyword_are_counted():
    bag = nn.EmbeddingBag(10, 3, mode="sum")
    ids, offsets, weights = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2]), torch.ones(4)
    assert flops(bag, ids, offsets, weights) == flops(
        bag, ids, offsets=offsets, per_sample_weights=weights) == 2 * 4 * 3
    assert flops(bag, ids, offsets) == 4 * 3


def test_core_layers_called_with_keywords():
    layer, x = Linear(4, 3), Tensor(np.ones((2, 4)))
    assert flops(layer, x=x) == flops(layer, x) == 2 * 2 * 4 * 3
    loss = CrossEntropyLoss()
    logits, targets = Tensor(np.zeros((2, 5))), np.array([1, 3])
    assert flops(loss, logits=logits, targets=targets) == flops(loss, logits, targets) == (
        5 * 2 * 5 + 2)


class _Holder:
    def __init__(self, shape):
        self.shape = shape


@pytest.mark.parametrize("shape", [[2, 3], {"a": 1}, "abc", (None,), 7])
def test_an_argument_whose_shape_is_not_a_shape_is_recorded(shape):
    class Anything(nn.Module):
        def forward(self, value):
            return value

    layer = Anything()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracetorch.profile(layer) as prof:
            for _ in range(2):
                assert layer(_Holder(shape)).shape == shape
    assert prof.find("").calls == 2
