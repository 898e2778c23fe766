"""Parameter counts on torch models: tied tensors once, buffers apart, frozen split out."""
import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from test_torch_models import Shared, resnet18  # noqa: E402

nn = torch.nn


class TiedLM(nn.Module):
    """Input embedding and output head share one weight, as in GPT-2."""

    def __init__(self, vocab=50, dim=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.BatchNorm1d(dim)  # buffers: running mean/var, batch count
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.scale = nn.Parameter(torch.ones(dim))  # held directly by the root


def test_resnet18():
    model = resnet18()
    assert tracetorch.count_parameters(model) == 11_689_512
    table = tracetorch.parameter_table(model)
    assert table.total == 11_689_512 and table.trainable == 11_689_512
    assert table.buffers == sum(b.numel() for b in model.buffers())


def test_tied_weights_counted_once_buffers_apart():
    model = TiedLM()
    assert tracetorch.count_parameters(model) == 50 * 8 + 2 * 8 + 8
    table = tracetorch.parameter_table(model)
    assert table.total == 50 * 8 + 2 * 8 + 8
    assert table.buffers == 8 + 8 + 1
    assert sum(r.total for r in table) == table.total


def test_shared_module_and_frozen_parameters():
    model = Shared()
    assert tracetorch.count_parameters(model) == 10_000
    model.a.lin.weight.requires_grad_(False)
    table = tracetorch.parameter_table(model)
    assert (table.total, table.trainable, table.frozen) == (10_000, 0, 10_000)


def test_profile_tree_reports_parameters_per_node():
    model = Shared()
    with tracetorch.profile(model) as prof:
        model(torch.randn(1, 100))
    assert prof.find("").params == 10_000
    assert prof.find("b.lin").params == 10_000


def test_lazy_modules_are_counted_once_their_weights_have_shapes():
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.LazyLinear(2))
    pass_through = torch.randn(3, 5)
    with tracetorch.profile(model) as prof:
        model(pass_through)
    assert [(n.path, n.params) for n in prof.nodes()] == [
        ("", 5 * 8 + 8 + 8 * 2 + 2), ("0", 5 * 8 + 8), ("1", 0), ("2", 8 * 2 + 2)]
    with tracetorch.profile(model) as again:  # initialized now: counted on entry
        model(pass_through)
    assert again.find("").params == tracetorch.count_parameters(model) == 66


@pytest.mark.parametrize("count", [tracetorch.count_parameters, tracetorch.parameter_table])
def test_counting_a_lazy_model_before_its_first_call_says_what_to_do(count):
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU())
    with pytest.raises(ValueError, match="^model: a parameter of a lazy module .* call the "
                                         "model once on an example input"):
        count(model)
    model(torch.randn(3, 5))
    assert tracetorch.count_parameters(model) == 5 * 8 + 8


def test_params_false_never_walks_the_model_and_counts_the_same_flops(monkeypatch):
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.LazyLinear(2))
    x = torch.randn(3, 4)
    with tracetorch.profile(model) as counted:
        model(x)

    def no_walk(*args, **kwargs):
        raise AssertionError("parameters were counted")

    monkeypatch.setattr("tracetorch.engine.identities.subtree_parameter_counts", no_walk)
    with tracetorch.profile(model, params=False) as prof:
        model(x)
    assert [(n.path, n.params, n.memory.param_bytes) for n in prof.nodes()] == [
        ("", 0, 0), ("0", 0, 0), ("1", 0, 0), ("2", 0, 0)]
    # Matmuls 2 x rows x in x out; ReLU one per element.
    assert prof.total_flops == counted.total_flops == 2 * 3 * (4 * 8 + 8 * 2) + 3 * 8
    # A one-shot count reads only FLOPs: it never walks the parameters either.
    assert tracetorch.count_flops(model, (3, 4)) == counted.total_flops
