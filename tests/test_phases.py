"""The phases of a training step: data loading, forward, backward, optimizer, other."""
from __future__ import annotations

import numpy as np

import tracetorch
from tracetorch.core import Linear, ReLU, Sequential, Tensor


def test_a_data_loader_is_the_data_phase(torch):
    from torch.utils.data import DataLoader, TensorDataset

    ticks = iter(range(0, 10**9, 1_000))
    loader = DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=2)
    model = torch.nn.Linear(2, 1)
    with tracetorch.profile(model, clock=lambda: next(ticks)) as prof:
        for (x,) in loader:
            model(x)
            prof.step()
    data = prof.find("data")
    assert data.kind == "data" and data.type_name == "DataLoader"
    assert data.calls == 4 and data.errors == 0  # the exhausted iterator is no failed call
    assert prof.step_phases["data"].count == 4
    assert prof.time_by_kind()["data"] == data.total_ns
    assert "Step phases:" in str(prof)
    assert vars(torch.utils.data.dataloader._BaseDataLoaderIter)["__next__"].__module__ == (
        "torch.utils.data.dataloader")


def test_step_phases_survive_save(tmp_path):
    ticks = iter(range(0, 10**9, 1_000))
    model = Sequential(Linear(2, 2), ReLU())
    with tracetorch.profile(model, clock=lambda: next(ticks)) as prof:
        for _ in range(3):
            model(Tensor(np.ones((1, 2))))
            prof.step()
    prof.save(str(tmp_path / "run.json"))
    again = tracetorch.load(str(tmp_path / "run.json"))
    assert {k: v.to_dict() for k, v in again.step_phases.items()} == {
        k: v.to_dict() for k, v in prof.step_phases.items()}
    assert again.step_phases["forward"].count == 3


def test_a_loop_whose_data_loader_sleeps_is_input_bound(torch):
    from torch.utils.data import DataLoader, Dataset

    now = [0]

    def clock():
        now[0] += 100  # every reading: a layer call takes 100 ns
        return now[0]

    class Sleepy(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            now[0] += 50_000  # "sleeps" 50 us per sample, on the profile's clock
            return torch.ones(2)

    model = torch.nn.Linear(2, 1)
    with tracetorch.profile(model, clock=clock) as prof:
        for x in DataLoader(Sleepy(), batch_size=2):
            model(x)
            prof.step()
    assert prof.step_phases["data"].count == 4
    assert prof.step_phases["data"].total_ns > 0.9 * sum(
        stats.total_ns for stats in prof.step_phases.values())
    bound = next(line for line in str(prof).splitlines() if line.startswith("Bottleneck:"))
    assert "input-bound" in bound and "in the DataLoader" in bound


def test_an_optimizer_step_running_the_model_splits_into_its_phases(torch):
    # Lightning's automatic optimization: forward and backward inside optimizer.step(closure).
    ticks = iter(range(0, 10**9, 1_000))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure():
        optimizer.zero_grad()
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        return loss

    with tracetorch.profile(model, clock=lambda: next(ticks)) as prof:
        for _ in range(2):
            optimizer.step(closure)
            prof.step()
    step = prof.find("SGD.step")
    inside = {child.kind: child.total_ns for child in step.children.values()}
    assert set(inside) == {"module", "backward"}
    phases = prof.time_by_kind()
    assert phases["forward"] == inside["module"] and phases["backward"] == inside["backward"]
    assert phases["optimizer"] == step.total_ns - inside["module"] - inside["backward"]
    assert prof.step_phases["forward"].total_ns == inside["module"]


def test_a_layer_made_afresh_at_each_call_is_one_node(torch):
    # transformers makes a new CrossEntropyLoss at each call: one node, not one per step.
    model = torch.nn.Linear(4, 3)
    with tracetorch.profile(model) as prof:
        for _ in range(5):
            loss = torch.nn.CrossEntropyLoss()(model(torch.ones(2, 4)), torch.tensor([0, 1]))
            loss.backward()
            prof.step()
    names = list(prof.root.children)
    assert names == ["", "CrossEntropyLoss", "backward"]
    assert prof.find("CrossEntropyLoss").calls == 5
    assert prof.find("CrossEntropyLoss").flops == 5 * (5 * 2 * 3 + 2)  # 5NC + N per call
    # A layer with weights of its own stays apart per instance.
    with tracetorch.profile() as other:
        for _ in range(2):
            torch.nn.Linear(2, 2)(torch.ones(1, 2))
    assert list(other.root.children) == ["", "Linear"]


def test_a_core_layer_made_afresh_at_each_call_is_one_node():
    with tracetorch.profile(Linear(2, 2)) as prof:
        for _ in range(3):
            ReLU()(Tensor(np.ones((1, 2))))
    assert list(prof.root.children) == ["ReLU"] and prof.find("ReLU").calls == 3
