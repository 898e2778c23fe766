"""What a finished profile keeps alive: its result holds the tree, never the layers it called,
and dropped with the model it frees both by reference counting (a DistributedDataParallel model
left to the cyclic collector was torn down during the interpreter's exit, its process group's
threads with it)."""
from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import tracetorch  # noqa: E402


@pytest.fixture
def collector_off() -> Iterator[None]:
    # torch's first optimizer imports torch._dynamo, and what that import leaves holds the
    # frames that made the optimizer (and their locals): made once before anything is checked
    torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def _train(model: nn.Module, prof: tracetorch.profile, steps: int, step_marks: bool) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        if step_marks:
            prof.step()


class Opaque(nn.Module):
    """No FLOP rule: its operations are counted, then learned after two equal calls."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2 + 1).tanh()


@pytest.mark.parametrize("steps", [1, 2, 3, 6])  # 3 and more: learned counts are replayed
@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("ops", [True, False])
def test_a_dropped_profile_and_model_are_freed_at_once(collector_off, steps, grad, ops):
    model = nn.Sequential(_mlp(), Opaque())
    with torch.set_grad_enabled(grad), tracetorch.profile(model, ops=ops) as prof:
        for _ in range(steps):
            model(torch.randn(4, 8))
    gone = [weakref.ref(model), weakref.ref(prof._collector), weakref.ref(model[1])]
    del model, prof
    assert [ref() for ref in gone] == [None, None, None]


@pytest.mark.parametrize("step_marks", [True, False])
def test_a_training_loop_leaves_nothing_behind(collector_off, step_marks):
    model = nn.Sequential(_mlp(), Opaque())
    with tracetorch.profile(model) as prof:
        _train(model, prof, 4, step_marks)
    gone = [weakref.ref(model), weakref.ref(prof._collector)]
    del model, prof
    assert [ref() for ref in gone] == [None, None]


def test_a_kept_result_holds_no_layer_of_a_model_it_was_not_given(collector_off):
    # profile() without a model keeps only the tree: the layers go with the user's last reference
    model = nn.Sequential(_mlp(), Opaque())
    with torch.no_grad(), tracetorch.profile() as prof:
        for _ in range(4):
            model(torch.randn(4, 8))
    gone = [weakref.ref(model), weakref.ref(model[1])]
    del model
    assert [ref() for ref in gone] == [None, None]
    assert prof.find("1").calls == 4 and prof.find("1").flops == 4 * 4 * 3  # mul, add, tanh


def test_a_reopened_profile_learns_and_counts_as_the_first_opening(collector_off):
    model = nn.Sequential(_mlp(), Opaque())
    prof = tracetorch.profile(model)
    for _ in range(2):
        with torch.no_grad(), prof:
            for _ in range(4):
                model(torch.randn(4, 8))
    assert prof.find("1").calls == 8 and prof.find("1").flops == 8 * 4 * 3
    assert prof.find("0.0").flops == 8 * 2 * 4 * 8 * 16  # (the bias is not counted)


def test_a_count_frees_its_model_at_once(collector_off):
    model = nn.Sequential(_mlp(), Opaque())
    tracetorch.count_flops(model, (4, 8))
    gone = weakref.ref(model)
    del model
    assert gone() is None
