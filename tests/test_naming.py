"""One naming rule (issue 28): a layer's node is named by its path in the model, however it is
called — by its parent, from a plain method of the model, or directly from the training loop —
and a model nested deeper than the recursion limit leaves room for is profiled, printed, saved
and loaded again."""
from __future__ import annotations

import os
import sys

import pytest

import tracetorch

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")
nn = torch.nn


class VAE(nn.Module):
    """An autoencoder whose training loop may call its parts directly."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
        self.fc3 = nn.Linear(3, 4)

    def decode(self, z):
        return self.fc3(z)  # a plain method: no layer call of the model around it

    def forward(self, x):
        return self.decode(self.encoder(x))


def _paths(prof):
    return [(node.path, node.type_name, node.calls) for node in prof.nodes()]


@pytest.mark.parametrize("with_model", [True, False])
def test_parts_called_directly_are_named_by_their_path_in_the_model(with_model):
    model, x = VAE(), torch.randn(2, 4)
    with tracetorch.profile(model if with_model else None) as prof:
        model(x)  # (without a model given, the first layer called stands for it)
        z = model.encoder(x)
        model.decode(z)
    # The model's own calls, then the loop's: each part under its path, not "Linear#2".
    assert _paths(prof) == [
        ("", "VAE", 1), ("encoder", "Sequential", 1), ("encoder.0", "Linear", 1),
        ("encoder.1", "ReLU", 1), ("fc3", "Linear", 1),
        ("encoder", "Sequential", 1), ("encoder.0", "Linear", 1), ("encoder.1", "ReLU", 1),
        ("fc3", "Linear", 1)]
    # The same layer called from two places is one module, its calls summed.
    by_module = prof.by_module()
    assert by_module["fc3"].calls == by_module["encoder.0"].calls == 2
    assert by_module["fc3"].paths == ["fc3", "fc3"]


def test_parts_of_the_profiled_model_called_alone_are_named_by_path():
    model, x = VAE(), torch.randn(2, 4)
    with tracetorch.profile(model) as prof:
        model.decode(model.encoder(x))  # the model itself never called
    assert [node.path for node in prof.nodes()] == ["encoder", "encoder.0", "encoder.1", "fc3"]


def test_a_second_top_level_model_names_its_parts_under_its_own_name():
    generator, critic = VAE(), VAE()
    x = torch.randn(2, 4)
    with tracetorch.profile() as prof:
        generator(x)
        critic(x)
        critic.fc3(torch.randn(2, 3))  # a part of the second model, called directly
        nn.Linear(4, 4)(x)  # part of nothing called before: its type
    top = [(node.name, node.type_name) for node in prof.root.children.values()]
    assert top == [("", "VAE"), ("VAE", "VAE"), ("VAE.fc3", "Linear"), ("Linear", "Linear")]


@pytest.mark.parametrize("given", ["wrapper", "model", "none"])
def test_parts_called_directly_are_named_through_a_data_parallel_wrapper(given):
    model = VAE()
    wrapper = nn.DataParallel(model)  # on CPU it calls the model itself
    with tracetorch.profile({"wrapper": wrapper, "model": model, "none": None}[given]) as prof:
        wrapper(torch.randn(2, 4))
        model.fc3(torch.randn(2, 3))
    # The paths of the model run in one process: "fc3", not "module.fc3".
    assert [node.path for node in prof.root.children.values()] == ["", "fc3"]


def _nest(depth: int):
    model = nn.Linear(2, 2)
    for _ in range(depth):
        model = nn.Sequential(model)
    return model


def test_a_model_250_modules_deep_is_profiled_printed_saved_and_loaded(tmp_path):
    depth = 250
    model, x = _nest(depth), torch.randn(1, 2)
    limit = sys.getrecursionlimit()
    # What the plain forward needs (~4 frames a level), as its user would have set it.
    sys.setrecursionlimit(max(limit, 1100))
    try:
        plain = sys.getrecursionlimit()
        model(x)
        with tracetorch.profile(model) as prof:
            model(x)
            model(x)
        assert sys.getrecursionlimit() == plain  # the room lent to the profile given back
    finally:
        sys.setrecursionlimit(limit)
    nodes = list(prof.nodes())
    assert len(nodes) == depth + 1 and all(node.calls == 2 for node in nodes)
    leaf = ".".join(["0"] * depth)
    assert nodes[-1].path == leaf and nodes[-1].flops == 2 * 2 * 2 * 2  # 2 calls x 2*in*out
    assert prof.find("").params == 6
    assert "Sequential" in str(prof) and "in 2 top-level calls" in str(prof)
    prof.save(tmp_path / "deep.json")
    loaded = tracetorch.load(tmp_path / "deep.json")
    assert [(n.path, n.calls, n.flops) for n in loaded.nodes()] == [
        (n.path, n.calls, n.flops) for n in nodes]
    loaded.table()


def test_room_is_lent_only_for_deep_trees_and_given_back():
    limit = sys.getrecursionlimit()
    shallow = _nest(3)
    with tracetorch.profile(shallow):
        shallow(torch.randn(1, 2))
        assert sys.getrecursionlimit() == limit
    deep = _nest(60)
    with tracetorch.profile(deep):
        deep(torch.randn(1, 2))
        assert sys.getrecursionlimit() > limit
    assert sys.getrecursionlimit() == limit


def test_a_limit_the_user_sets_inside_the_block_stays():
    limit = sys.getrecursionlimit()
    deep = _nest(60)
    try:
        with tracetorch.profile(deep):
            deep(torch.randn(1, 2))
            sys.setrecursionlimit(limit + 7)
        assert sys.getrecursionlimit() == limit + 7
    finally:
        sys.setrecursionlimit(limit)
