"""A module's forward hooks (pruning's mask, old-style ``weight_norm`` and ``spectral_norm``, a
hook of the user's) run around its forward, in its caller's call: their operations are counted
there inside a plain ``nn.Sequential`` and inside a ruled layer (which is counted by its
operations then) as inside any other caller, each equal to the unhooked model's FLOPs plus the
hook's hand count.
"""
from __future__ import annotations

import os
import warnings

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

from torch.nn.utils import prune  # noqa: E402

import tracetorch  # noqa: E402
from tracetorch.flops.registry import hooks_run_inside  # noqa: E402

nn = torch.nn
pytestmark = pytest.mark.filterwarnings("ignore:torch.nn.utils.weight_norm is deprecated",
                                        "ignore:enable_nested_tensor")


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _pruned(layer: nn.Module) -> int:
    prune.l1_unstructured(layer, "weight", amount=0.5)
    return layer.weight.numel()  # the mask's multiply


def _old_weight_norm(layer: nn.Module) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nn.utils.weight_norm(layer)
    return 3 * layer.weight_v.numel() + 2 * layer.weight_g.numel()


def _old_spectral_norm(layer: nn.Module) -> int:
    nn.utils.spectral_norm(layer)  # one power iteration while training, as the rule counts
    m, n = layer.weight_orig.shape
    return (4 * m * n + 3 * (m + n)) + 3 * m * n + 2 * m


def _scaling_hooks(layer: nn.Module) -> int:
    layer.register_forward_pre_hook(lambda module, inputs: (inputs[0] + 1,))
    layer.register_forward_hook(lambda module, inputs, output: output * 2)
    return 4 * layer.in_features + 4 * layer.out_features  # (batch 4)


HOOKED = {"prune": _pruned, "weight_norm": _old_weight_norm,
          "spectral_norm": _old_spectral_norm, "hooks": _scaling_hooks}


class Block(nn.Module):
    """The same layers as the Sequential, in a forward of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act, self.out = nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.fc(x)))


def _sequential() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _first(model: nn.Module) -> nn.Module:
    return model.fc if isinstance(model, Block) else model[0]


@pytest.mark.parametrize("parent", [_sequential, Block])
@pytest.mark.parametrize("hooked", HOOKED)
def test_a_layers_forward_hooks_are_counted_in_its_caller(parent, hooked):
    x = r(4, 16)
    plain = parent()
    with tracetorch.profile(plain) as before:
        plain(x)
    model = parent()
    extra = HOOKED[hooked](_first(model))
    with tracetorch.profile(model) as prof:
        model(x)
    assert prof.forward_flops == before.forward_flops + extra
    assert prof.completeness == "complete"
    assert tracetorch.count_flops(model, x) == prof.forward_flops


@pytest.mark.parametrize("training", [False, True])
def test_a_ruled_layer_with_a_pruned_sublayer_counts_the_mask(training):
    x = r(2, 5, 16)

    def layer() -> nn.Module:
        torch.manual_seed(0)
        return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).train(training)

    plain = layer()
    with torch.no_grad(), tracetorch.profile(plain) as before:
        plain(x)
    pruned = layer()
    mask = _pruned(pruned.linear1)
    with torch.no_grad(), tracetorch.profile(pruned) as prof:
        pruned(x)
    assert prof.forward_flops == before.forward_flops + mask == 47_500 + 16 * 32
    assert prof.completeness == "complete"


def test_hooks_run_inside_a_layer_are_its_sublayers_and_every_modules():
    block = _sequential()
    assert not hooks_run_inside(block, deep=False)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:  # hooks for every module run inside every call
        assert hooks_run_inside(block, deep=False)
    finally:
        handle.remove()
    nested = nn.Sequential(_sequential())
    _pruned(nested[0][0])
    assert not hooks_run_inside(nested, deep=False) and hooks_run_inside(nested, deep=True)


def test_count_flops_tells_a_hooked_instance_from_its_twins():
    # One count meets two Sequentials and two encoder layers, one of each hooked: each is
    # counted as its own instance is, not as the first of its class met.
    def encoder() -> nn.Module:
        torch.manual_seed(0)
        # (in eval: one without hooks runs torch's fused fast path, which only its rule costs)
        return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()

    plain = nn.Sequential(nn.Sequential(nn.Linear(16, 16)), encoder())
    hooked = nn.Sequential(nn.Sequential(nn.Linear(16, 16)), encoder())
    mask = _pruned(hooked[0][0]) + _pruned(hooked[1].linear1)
    x = r(2, 5, 16)
    with torch.no_grad():
        alone = tracetorch.count_flops(plain, x)
        for model in (nn.Sequential(plain, hooked), nn.Sequential(hooked, plain)):
            assert tracetorch.count_flops(model, x) == 2 * alone + mask
            with tracetorch.profile(model) as prof:
                model(x)
            assert prof.forward_flops == 2 * alone + mask
            assert prof.completeness == "complete"
