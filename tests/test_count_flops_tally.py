"""count_flops keeps a running total (tracetorch.engine.tally) instead of a profile's tree: on
each kind of call a tree treats apart, it counts what a profile of the same forward counts."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import tracetorch
from tracetorch.core import Linear, ReLU, Sequential, Tensor
from tracetorch.engine.patches import BOARD

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")
nn = torch.nn


def _profiled(model, *args):
    """What a profile with count_flops's settings counts of ``model(*args)`` (no_grad, as a
    count of a torch model runs)."""
    with torch.no_grad(), tracetorch.profile(model, timing=False, memory=False,
                                             params=False) as prof:
        model(*args)
    return prof.forward_flops


class _Small(nn.Module):
    """A layer with a rule smaller than its child's: its own share is 0, not negative."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x)


class _Shared(nn.Module):
    """Two layers called three times each, in a loop."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act = nn.Linear(8, 8), nn.Tanh()

    def forward(self, x):
        for _ in range(3):
            x = self.act(self.fc(x))
        return x * 2


def test_a_rule_smaller_than_its_childrens_counts_its_children_as_a_profile_does():
    tracetorch.flop_rule(_Small)(lambda layer, inputs, output: 10)
    model, x = nn.Sequential(_Small(), nn.ReLU()), torch.ones(4, 8)
    # The child's 2·4·8·8 product, then the ReLU; the parent's 10 lies under it: adds nothing.
    expected = 2 * 4 * 8 * 8 + 4 * 8
    assert tracetorch.count_flops(model, x) == _profiled(model, x) == expected


def test_a_layer_called_many_times_counts_every_call():
    model, x = _Shared(), torch.ones(4, 8)
    assert tracetorch.count_flops(model, x) == _profiled(model, x)
    once = tracetorch.count_flops(nn.Sequential(model.fc, model.act), x)
    assert tracetorch.count_flops(model, x) == 3 * once + 4 * 8


def test_a_layer_that_fails_once_and_is_called_again_counts_as_in_a_profile():
    class Flaky(nn.Module):  # its first call of each forward raises after its product ran
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.failed = nn.Linear(8, 8), False

        def forward(self, x):
            y = self.fc(x)
            if not self.failed:
                self.failed = True
                raise RuntimeError("transient")
            return y

    class Retrying(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.flaky = Flaky()

        def forward(self, x):
            self.flaky.failed = False
            try:
                return self.flaky(x)
            except RuntimeError:
                return self.flaky(x)

    model, x = Retrying(), torch.ones(4, 8)
    # both products ran (the failed call's too, as a profile counts a failed call's work)
    assert tracetorch.count_flops(model, x) == _profiled(model, x) == 2 * (2 * 4 * 8 * 8)


def test_a_gradient_taken_inside_the_forward_is_no_forward_work():
    class Energy(nn.Module):  # forces as minus the gradient of an energy, as physics models do
        def __init__(self) -> None:
            super().__init__()
            self.energy = nn.Linear(8, 1)

        def forward(self, x):
            with torch.enable_grad():
                x = x.detach().requires_grad_(True)
                (grad,) = torch.autograd.grad(self.energy(x).sum(), x)
            return -grad

    model, x = Energy(), torch.ones(4, 8)
    assert tracetorch.count_flops(model, x) == _profiled(model, x) >= 2 * 4 * 8
    assert tracetorch.count_flops(model, x) < 2 * (2 * 4 * 8 + 4)  # no backward work in it


def test_user_rules_of_layers_and_functions_count_as_in_a_profile():
    @tracetorch.instrument(flops=lambda x: 7 * x.numel())
    def scaled(x):
        return x * 7

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return scaled(self.fc(x))

    model, x = Net(), torch.ones(4, 8)
    assert tracetorch.count_flops(model, x) == _profiled(model, x) == 2 * 4 * 8 * 8 + 7 * 32


def test_operations_outside_every_layer_count_at_the_root():
    def product(a, b):
        return a @ b + 1

    a, b = torch.ones(3, 5), torch.ones(5, 2)
    assert tracetorch.count_flops(product, (a, b)) == 2 * 3 * 5 * 2 + 3 * 2


def test_core_and_duck_typed_models_count_as_in_a_profile():
    core = Sequential(Linear(6, 4), ReLU(), Linear(4, 2))
    x = Tensor(np.ones((3, 6), dtype=np.float32))
    with tracetorch.profile(core, timing=False) as prof:
        core(x)
    assert tracetorch.count_flops(core, (3, 6)) == prof.forward_flops > 2 * 3 * 6 * 4

    class Duck:  # a forward and layers kept in attributes
        def __init__(self) -> None:
            self.first, self.second = Linear(6, 4), Linear(4, 2)

        def forward(self, x):
            return self.second(self.first(x))

        __call__ = forward

    duck = Duck()
    with tracetorch.profile(duck, timing=False) as prof:
        duck(x)
    assert tracetorch.count_flops(duck, x) == prof.forward_flops == 2 * 3 * 6 * 4 + 2 * 3 * 4 * 2


def test_an_unsupported_layer_warns_once_and_an_identity_costs_a_known_zero():
    class Opaque(nn.Module):  # no rule, and an operation no formula counts
        def forward(self, x):
            return x.sort().values

    class PassThrough(nn.Module):  # no rule, runs nothing, hands back its input
        def forward(self, x):
            return x

    x = torch.ones(4, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tracetorch.count_flops(nn.Sequential(PassThrough(), nn.ReLU()), x) == 32
    assert not [w for w in caught if "FLOP" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = nn.Sequential(Opaque(), Opaque(), nn.ReLU())
        assert tracetorch.count_flops(model, x) == 32  # a lower bound: the ReLU alone
    assert len([w for w in caught if "Opaque" in str(w.message)]) == 1


def test_a_failing_forward_passes_its_exception_and_leaves_nothing_patched():
    class Broken(nn.Module):
        def forward(self, x):
            raise KeyError("the user's own")

    forward = vars(nn.Linear)["forward"]
    model = nn.Sequential(nn.Linear(8, 8), Broken())
    with pytest.raises(KeyError, match="the user's own"):
        tracetorch.count_flops(model, (2, 8))
    assert vars(nn.Linear)["forward"] is forward and not BOARD.active
    assert tracetorch.count_flops(nn.Linear(8, 8), (2, 8)) == 2 * 2 * 8 * 8


def test_a_count_inside_a_profile_adds_nothing_to_it():
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.ones(4, 8)
    with torch.no_grad(), tracetorch.profile(model, timing=False) as outer:
        model(x)
        inner = tracetorch.count_flops(model, x)
        model(x)
    assert inner == _profiled(model, x)
    assert outer.forward_flops == 2 * inner
    assert outer.find("0").calls == 2


def test_a_profile_opened_inside_the_forward_hands_its_flops_to_the_count():
    class Watched(nn.Module):  # a model that profiles a part of its own forward
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.head = nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x):
            with tracetorch.profile(timing=False) as self.inner:
                x = torch.relu(self.fc(x))
            return self.head(x)

    model, x = Watched(), torch.ones(4, 8)
    expected = 2 * 4 * 8 * 8 + 4 * 8 + 2 * 4 * 8 * 2
    assert tracetorch.count_flops(model, x) == _profiled(model, x) == expected
    assert model.inner.forward_flops == 2 * 4 * 8 * 8 + 4 * 8  # its own record, as ever


def test_a_compiled_model_counts_what_the_eager_one_counts():
    model, x = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval(), \
        torch.ones(2, 8)
    eager = tracetorch.count_flops(model, x)
    assert eager == 2 * 2 * 8 * 16 + 2 * 16 + 2 * 2 * 16 * 4  # (a ReLU: 1 per element)
    assert tracetorch.count_flops(torch.compile(model, backend="eager"), x) == eager
    in_place = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    in_place[0].compile(backend="eager")  # one ruled layer compiled in place: counted once
    assert tracetorch.count_flops(in_place, x) == eager
