"""count_parameters and parameter_table: core, duck-typed and torch models, sharing, freezing."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from support.torch_models import shared_model
from tracetorch.models.introspect import is_torch_module
from tracetorch.models.params import count_parameters, parameter_table
from tracetorch.models.tensors import numel


class Dense:
    """A TinyTorch-style layer: plain arrays in weight and bias, no base class."""

    def __init__(self, n_in, n_out, bias=True):
        self.weight = np.zeros((n_in, n_out), dtype=np.float32)
        self.bias = np.zeros(n_out, dtype=np.float32) if bias else None

    def forward(self, x):
        return x @ self.weight


class Stack:
    def __init__(self, *layers):
        self.layers = list(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer.forward(x)
        return x


# ---------------------------------------------------------------- TinyTorch's cases
def test_weight_and_bias_count_55():
    assert count_parameters(Dense(10, 5)) == 55


def test_weight_alone():
    assert count_parameters(Dense(8, 4, bias=False)) == 32


def test_object_whose_parameters_come_from_a_core_linear():
    from tracetorch.core import Linear

    class Wrapper:
        def __init__(self):
            self.inner = Linear(10, 5)

        def parameters(self):
            return self.inner.parameters()

    assert count_parameters(Wrapper()) == 55


@pytest.mark.parametrize("obj", [object(), [], {}])
def test_objects_without_parameters_count_zero(obj):
    assert count_parameters(obj) == 0


@pytest.mark.parametrize("obj", [3, "text", 2.5, True, b"x", lambda x: x, print, len])
def test_what_is_never_a_model_is_refused(obj):
    with pytest.raises(TypeError, match="model: expected a model"):
        count_parameters(obj)


def test_duck_typed_arrays_count_under_any_name():
    class Affine:
        def __init__(self):
            self.W = np.ones((4, 3))
            self.b = np.zeros(3)
            self.index = np.arange(5)  # integers: an index, not a weight

        def forward(self, x):
            return x @ self.W + self.b

    class Net:
        def __init__(self):
            self.first, self.second = Affine(), Affine()
            self.scale = np.float32(2.0) * np.ones(2, np.float32)

        def forward(self, x):
            return x

    assert count_parameters(Affine()) == 15
    assert count_parameters(Net()) == 2 * 15 + 2


def test_bare_tensor_counts_zero():
    from tracetorch.core import Tensor

    assert count_parameters(Tensor(np.ones((4, 8)))) == 0


def test_none_is_a_type_error_naming_model():
    with pytest.raises(TypeError, match="model"):
        count_parameters(None)


def test_a_class_is_a_type_error():
    with pytest.raises(TypeError, match="model.*instance"):
        count_parameters(Dense)


# ---------------------------------------------------------------- layers, sharing
def test_layers_are_summed_recursively():
    assert count_parameters(Stack(Dense(4, 3), Stack(Dense(3, 2), Dense(2, 2)))) == 15 + 8 + 6


def test_tied_array_counted_once_across_the_whole_model():
    first, second = Dense(6, 6, bias=False), Dense(6, 6, bias=False)
    second.weight = first.weight
    assert count_parameters(Stack(first, Stack(second))) == 36


def test_self_containing_layer_list_terminates():
    stack = Stack(Dense(2, 2))
    stack.layers.append(stack)
    assert count_parameters(stack) == 6


def test_layers_and_own_parameters_are_united():
    class Embedded(Stack):
        def __init__(self):
            super().__init__(Dense(4, 4))
            self.embedding = np.zeros((10, 4))

        def parameters(self):
            return [self.embedding] + [t for layer in self.layers for t in (layer.weight,
                                                                           layer.bias)]

    assert count_parameters(Embedded()) == 40 + 20


def test_attribute_layers_of_a_duck_model_are_counted():
    class MLP:
        """No layers list, no parameters(): TinyTorch would count 0."""

        def __init__(self):
            self.fc1, self.fc2 = Dense(4, 8), Dense(8, 2)
            self.fc3 = self.fc1  # reused, counted once

        def forward(self, x):
            return self.fc2.forward(self.fc1.forward(x))

    assert count_parameters(MLP()) == 40 + 18
    assert {row.path: row.total for row in parameter_table(MLP())} == {"fc1": 40, "fc2": 18}


def test_capstone_simple_mlp_counts_283():
    from tracetorch.core import Linear

    class SimpleMLP:
        def __init__(self):
            self.fc1, self.fc2 = Linear(10, 20), Linear(20, 3)

        def forward(self, x):
            return self.fc2(self.fc1(x))

        def parameters(self):
            return self.fc1.parameters() + self.fc2.parameters()

    assert count_parameters(SimpleMLP()) == 283
    assert {row.path: row.total for row in parameter_table(SimpleMLP())} == {"fc1": 220,
                                                                             "fc2": 63}


def test_core_models():
    from tracetorch.core import Linear, ReLU, Sequential

    assert count_parameters(Linear(1024, 512)) == 524_800
    model = Sequential(Linear(784, 256), ReLU(), Linear(256, 10))
    assert count_parameters(model) == 203_530


def test_core_tied_weights_counted_once():
    from tracetorch.core import Linear, Sequential

    a, b = Linear(8, 8, bias=False), Linear(8, 8, bias=False)
    b.weight = a.weight
    assert count_parameters(Sequential(a, b)) == 64
    assert parameter_table(Sequential(a, b)).total == 64


# ---------------------------------------------------------------- torch
def _conventions_model(torch):
    nn = torch.nn

    class Conventions(nn.Module):
        """peers.md section 4 item 7: a custom parameter, a frozen and an unused Linear."""

        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(100))
            self.fc = nn.Linear(100, 100)
            self.frozen = nn.Linear(100, 100)
            self.frozen.requires_grad_(False)
            self.unused = nn.Linear(100, 100)

        def forward(self, x):
            return self.frozen(self.fc(x)) * self.scale

    return Conventions()


def test_torch_total_trainable_frozen(torch):
    model = _conventions_model(torch)
    assert count_parameters(model) == 30_400
    table = parameter_table(model)
    assert (table.total, table.trainable, table.frozen, table.buffers) == (
        30_400, 20_300, 10_100, 0)
    rows = {row.path: row for row in table}
    assert rows[""].total == 100 and rows[""].type_name == "Conventions"
    assert (rows["frozen"].trainable, rows["frozen"].frozen) == (0, 10_100)
    assert rows["unused"].total == 10_100


def test_torch_shared_module_under_three_parents(torch):
    model = shared_model(torch)
    assert count_parameters(model) == 10_000
    table = parameter_table(model)
    assert table.total == 10_000
    assert [row.path for row in table] == ["a.lin"]


def test_torch_tied_embedding_counted_once(torch):
    nn = torch.nn

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 8)
            self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
            self.head = nn.Linear(8, 50, bias=False)
            self.head.weight = self.embed.weight

    # The ``layers`` ModuleList must not hide the embedding and head.
    assert count_parameters(TinyLM()) == 400 + 2 * 72
    assert parameter_table(TinyLM()).total == 400 + 2 * 72


def test_torch_buffers_are_counted_apart(torch):
    model = torch.nn.Sequential(torch.nn.Linear(4, 10), torch.nn.BatchNorm1d(10))
    table = parameter_table(model)
    assert count_parameters(model) == 50 + 20
    assert (table.total, table.buffers) == (70, 21)  # running mean, var, num_batches_tracked
    assert {row.path: row.buffers for row in table} == {"0": 0, "1": 21}


@pytest.mark.slow
def test_count_parameters_never_imports_torch():
    code = ("import sys, numpy as np\n"
            "from tracetorch.models.params import count_parameters, parameter_table\n"
            "class L:\n"
            "    weight = np.zeros((3, 3))\n"
            "    def forward(self, x): return x\n"
            "assert count_parameters(L()) == 9 and parameter_table(L()).total == 9\n"
            "assert 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- tables
def test_table_renders_thousands_separators_and_totals():
    from tracetorch.core import Linear, ReLU, Sequential

    table = parameter_table(Sequential(Linear(784, 256), ReLU(), Linear(256, 10)))
    text = str(table)
    assert [row.path for row in table] == ["layers.0", "layers.2"]
    assert "200,960" in text and "2,570" in text
    last = text.splitlines()[-1].split()
    assert last == ["Total", "203,530", "203,530", "0", "0"]


def test_core_frozen_parameter():
    from tracetorch.core import Linear, Sequential

    model = Sequential(Linear(4, 4), Linear(4, 2))
    model.layers[0].weight.requires_grad = False
    table = parameter_table(model)
    assert (table.total, table.trainable, table.frozen) == (30, 14, 16)


def test_duck_table_paths_from_attributes_and_layer_lists():
    class Net:
        def __init__(self):
            self.fc = Dense(4, 4)
            self.blocks = Stack(Dense(4, 2), Dense(2, 2, bias=False))

        def forward(self, x):
            return self.blocks.forward(self.fc.forward(x))

    table = parameter_table(Net())
    assert {row.path: row.total for row in table} == {"fc": 20, "blocks.layers.0": 10,
                                                       "blocks.layers.1": 4}
    assert table.total == count_parameters(Net()) == 34


def test_duck_table_container_parameters_not_double_counted():
    class Holder:
        """A container without forward whose parameters() repeats its layers' tensors."""

        def __init__(self):
            self.layers = [Dense(3, 3)]
            self.extra = np.zeros(5)

        def parameters(self):
            return [self.layers[0].weight, self.layers[0].bias, self.extra]

    table = parameter_table(Holder())
    assert {row.path: row.total for row in table} == {"": 5, "layers.0": 12}
    assert table.total == count_parameters(Holder()) == 17


def test_numel_of_arrays_core_tensors_and_scalars():
    from tracetorch.core import Tensor

    stale = Tensor(np.zeros((2, 3)))
    stale.data = np.zeros(10)  # TinyTorch-style: .data is the truth, not a cached shape
    assert (numel(np.zeros((2, 3))), numel(stale), numel(2.5), numel([1, 2, 3])) == (6, 10, 1, 3)


def test_numel_and_is_torch_module_for_torch(torch):
    layer = torch.nn.Linear(3, 2)
    assert numel(layer.weight) == 6 and is_torch_module(layer)
    assert not is_torch_module(layer.weight) and not is_torch_module(object())
