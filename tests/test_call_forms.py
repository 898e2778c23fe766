"""A rule sees a call's arguments however they were passed: positional or keyword, defaults
applied; an argument whose ``.shape`` is not a shape never breaks the call (issue 10, item 1).
A ``forward`` assigned on the instance is the layer's call, and a ``forward`` that returns a
generator hands back that very generator (issue 28)."""
from __future__ import annotations

import functools
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


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 3), nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(self.fc1(x))


def _fp32_outputs(forward):
    """Stands for a mixed-precision wrapper set on the instance: the bound original inside."""
    @functools.wraps(forward)
    def wrapped(*args, **kwargs):
        return forward(*args, **kwargs).float()
    return wrapped


def _accelerate_forward(model):
    """What accelerate's mixed precision sets: ``convert_outputs_to_fp32`` of the class's
    function, bound to the model (``Accelerator.prepare_model``)."""
    operations = pytest.importorskip("accelerate.utils.operations") if os.environ.get(
        "CI") != "true" else __import__("accelerate.utils.operations").utils.operations
    import types

    return types.MethodType(operations.convert_outputs_to_fp32(type(model).forward), model)


@pytest.mark.parametrize("assign", [
    lambda model: _fp32_outputs(model.forward),
    lambda model: functools.partial(type(model).forward, model),
    _accelerate_forward,
], ids=["wraps", "partial", "accelerate"])
def test_a_forward_assigned_on_the_instance_is_the_layers_call(assign):
    model, x = _Net(), torch.randn(5, 4)
    model.forward = assign(model)
    own, names = vars(model), list(vars(model))
    forward = own["forward"]
    with tracetorch.profile(model) as prof:
        assert model(x).shape == (5, 2)
        assert vars(model)["forward"] is not forward  # recorded on the instance meanwhile
    assert [(n.path, n.depth, n.calls) for n in prof.nodes()] == [
        ("", 1, 1), ("fc1", 2, 1), ("fc2", 2, 1)]
    assert prof.find("").subtree_flops == 2 * 5 * 4 * 3 + 2 * 5 * 3 * 2
    # Put back exactly: the same dict, the same keys in their order, the very object.
    assert vars(model) is own and list(own) == names and own["forward"] is forward
    model(x)  # and calls after the block are not recorded
    assert prof.find("").calls == 1


def test_an_instance_forward_assigned_inside_the_block_is_the_users():
    model, x = _Net(), torch.randn(5, 4)
    with tracetorch.profile(model) as prof:
        model(x)
        model.forward = _fp32_outputs(model.forward)  # the recorded forward, bound
        model(x)
        mine = model.forward
    assert vars(model)["forward"] is mine
    assert prof.find("").calls == 2 and prof.find("fc1").calls == 2


def test_a_forward_returning_a_generator_hands_back_that_generator():
    class Chunks(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, chunks):
            self.made = (self.lin(chunk) for chunk in chunks)
            return self.made

    layer, chunks = Chunks(), [torch.randn(2, 4) for _ in range(3)]
    with tracetorch.profile(layer, warn_unsupported=False) as prof:
        out = layer(chunks)
        assert out is layer.made
        assert len(list(out)) == 3
    # The call returned at once; the layer it calls runs as its consumer iterates, recorded
    # there (at the top here), under its path in the model.
    assert [(n.path, n.depth, n.calls) for n in prof.nodes()] == [("", 1, 1), ("lin", 1, 3)]
    assert prof.find("lin").flops == 3 * 2 * 2 * 4 * 4
