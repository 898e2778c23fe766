"""Module API: parameter discovery and de-duplication, paths, modes, zero_grad, repr, hooks."""
import numpy as np
import pytest

from tracetorch.core import (
    BatchNorm2d,
    Dropout,
    Layer,
    Linear,
    Module,
    ReLU,
    Sequential,
    Tensor,
    TransformerBlock,
    activations,
    attention,
    embeddings,
    losses,
    normalization,
    spatial,
)
from tracetorch.core import layers as core_layers


def test_all_layers_subclass_module():
    for mod in (core_layers, activations, spatial, normalization, embeddings, attention, losses):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if isinstance(obj, type) and name not in ("Module", "Layer"):
                assert issubclass(obj, Module), name
    assert Layer is Module


def test_parameters_deduplicated_by_identity():
    shared = Linear(3, 3)
    net = Sequential(shared, ReLU(), shared)
    assert len(net.parameters()) == 2
    assert [n for n, _ in net.named_parameters()] == ["layers.0.weight", "layers.0.bias"]
    tied = Sequential(Linear(3, 3), Linear(3, 3))
    tied.layers[1].weight = tied.layers[0].weight
    assert len(tied.parameters()) == 3


def test_named_modules_paths():
    net = Sequential(Linear(2, 4), ReLU(), Sequential([Linear(4, 4), Dropout(0.1)]))
    names = [n for n, _ in net.named_modules()]
    assert names == ["", "layers.0", "layers.1", "layers.2", "layers.2.layers.0",
                     "layers.2.layers.1"]
    assert [n for n, _ in net.named_children()] == ["layers.0", "layers.1", "layers.2"]
    block = TransformerBlock(8, 2, 16)
    paths = dict(block.named_modules())
    assert isinstance(paths["attention.q_proj"], Linear)
    assert isinstance(paths["mlp.linear1"], Linear) and isinstance(paths["mlp.linear2"], Linear)
    assert {"ln1", "ln2", "attention.out_proj"} <= set(paths)


def test_train_eval_propagates():
    net = Sequential(Linear(2, 2), Sequential(Dropout(0.5)))
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())


def test_zero_grad_and_buffers_are_not_parameters():
    net = Sequential(Linear(2, 3), BatchNorm2d(3))
    assert len(net.parameters()) == 4  # running stats are ndarrays, not parameters
    loss = net.layers[0](Tensor(np.ones((4, 2)))).sum()
    loss.backward()
    assert net.layers[0].weight.grad is not None
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_repr_and_subclass_with_list_and_override():
    class Custom(Module):
        def __init__(self):
            super().__init__()
            self.blocks = [Linear(2, 2), Linear(2, 2)]
            self.scale = Tensor([1.0], requires_grad=True)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x * self.scale

    class TinyStyle(Module):  # TinyTorch style: parameters() written by hand, no super().__init__
        def __init__(self):
            self.w = Tensor([1.0], requires_grad=True)
            self.extra = Tensor([2.0])

        def parameters(self):
            return [self.w]

    c = Custom()
    assert [n for n, _ in c.named_parameters()][0] == "scale"  # own parameters first
    assert len(c.parameters()) == 5
    assert "(blocks.0): Linear(in_features=2, out_features=2, bias=True)" in repr(c)
    assert repr(Linear(4, 3)) == "Linear(in_features=4, out_features=3, bias=True)"
    outer = Sequential(TinyStyle())
    assert len(outer.parameters()) == 1 and outer.layers[0].training
    assert Custom()(Tensor(np.ones((1, 2)))).shape == (1, 2)


def test_call_passes_args_and_kwargs_to_forward():
    class Echo(Module):
        def forward(self, a, b=0, *, c=0):
            return a + b + c
    assert Echo()(1, 2, c=3) == 6
    with pytest.raises(NotImplementedError):
        Module()(1)


def test_sequential_accepts_list_and_indexing():
    a, b = Linear(2, 3), ReLU()
    for net in (Sequential(a, b), Sequential([a, b])):
        assert net.layers == [a, b] and net[0] is a and len(net) == 2 and list(net) == [a, b]


def test_sequential_passes_training_flag_tinytorch_style():
    net = Sequential(Linear(3, 3), Dropout(0.5))
    x = Tensor(np.ones((4, 3)))
    np.testing.assert_array_equal(net(x, training=False).data, net.layers[0](x).data)
    assert np.any(net(Tensor(np.ones((64, 3))), training=True).data == 0)
