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
