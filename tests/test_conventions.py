"""One FLOP convention for tracetorch.core, torch's layers and torch's functions
(tracetorch.flops.elementwise): the same model costs the same, layer by layer, however it is
written."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import tracetorch
from tracetorch import core

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")
nn, F = torch.nn, torch.nn.functional


def _flops(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad(), tracetorch.profile(model) as prof:
            model(x)
    return prof


def test_core_and_torch_layers_cost_the_same_per_layer():
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    in_core = _flops(core.Sequential(core.Linear(8, 16), core.GELU(), core.LayerNorm(16),
                                     core.Linear(16, 4), core.ReLU(), core.Softmax()),
                     core.Tensor(x))
    in_torch = _flops(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16),
                                    nn.Linear(16, 4), nn.ReLU(), nn.Softmax(-1)),
                      torch.from_numpy(x))
    per_layer = [2 * 5 * 8 * 16, 6 * 80, 7 * 80, 2 * 5 * 16 * 4, 20, 5 * 20]
    assert [n.flops for n in in_core.nodes()][1:] == per_layer
    assert [n.flops for n in in_torch.nodes()][1:] == per_layer


class Functional(nn.Module):
    """The same maths as the layers above, written with torch functions and operators."""

    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(16, 8)), nn.Parameter(torch.randn(4, 16))

    def forward(self, x):
        h = F.layer_norm(F.gelu(x @ self.w1.t()), (16,))
        return torch.softmax(torch.relu(h @ self.w2.t()), dim=-1)


def test_a_layer_written_with_torch_functions_costs_what_the_layers_do():
    prof = _flops(Functional(), torch.randn(5, 8))
    assert prof.find("").flops == sum([2 * 5 * 8 * 16, 6 * 80, 7 * 80, 2 * 5 * 16 * 4, 20,
                                       5 * 20])
    assert prof.find("").flops_source == "ops" and prof.unsupported == {}


@pytest.mark.parametrize("spelling, flops", [
    (lambda x, y: x + y, 12), (lambda x, y: torch.add(x, y), 12), (lambda x, y: x.add(y), 12),
    (lambda x, y: x.clone().add_(y), 12), (lambda x, y: 1 - x, 12), (lambda x, y: 2 / x, 12),
    (lambda x, y: x * y - y, 24), (lambda x, y: torch.sigmoid(x), 48),
    (lambda x, y: x.sigmoid(), 48), (lambda x, y: F.silu(x), 60),
    (lambda x, y: x.mean(), 12), (lambda x, y: x.sum(-1), 12), (lambda x, y: x.var(0), 36),
    (lambda x, y: F.softmax(x, -1), 60), (lambda x, y: F.rms_norm(x, (4,)), 36),
    (lambda x, y: F.cross_entropy(x, torch.tensor([0, 1, 2])), 5 * 12 + 3),
    (lambda x, y: x.view(12).permute(0), 0),
])
def test_every_spelling_of_an_elementwise_function_is_counted(spelling, flops):
    class Custom(nn.Module):
        def forward(self, x, y):
            return spelling(x, y)

    layer = Custom()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracetorch.profile(layer) as prof:
            layer(torch.randn(3, 4), torch.randn(3, 4))
    assert prof.find("").flops == flops


def test_a_layer_that_only_moves_data_costs_a_known_zero():
    class Permute(nn.Module):  # torchvision's ConvNeXt and Swin have one
        def forward(self, x):
            return x.permute(0, 2, 1)

    class Slice(nn.Module):
        def forward(self, x):
            return x[..., :2].contiguous().view(-1)

    model = nn.Sequential(Permute(), Slice())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither is unsupported
        with tracetorch.profile(model) as prof:
            model(torch.randn(2, 3, 4))
    assert [(n.path, n.flops, n.completeness) for n in prof.nodes()] == [
        ("", 0, "complete"), ("0", 0, "complete"), ("1", 0, "complete")]
    assert prof.unsupported == {}
