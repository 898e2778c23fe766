"""NVTX ranges and device-memory readings at each layer call, on a CUDA faked for the test."""
from __future__ import annotations

import pytest

import tracetorch


class FakeCuda:
    """What the hooks read of ``torch.cuda``: NVTX calls are logged, the allocator is a counter
    the model's layers move."""

    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []
        self.allocated = 1_000
        self.peak = 1_000

    def range_push(self, name: str) -> None:
        self.log.append(("push", name))

    def range_pop(self) -> None:
        self.log.append(("pop",))

    def grow(self, kept: int, transient: int) -> None:
        self.peak = max(self.peak, self.allocated + kept + transient)
        self.allocated += kept


@pytest.fixture
def cuda(torch, monkeypatch):
    fake = FakeCuda()
    monkeypatch.setenv("TRACETORCH_CUDA_TIMING", "host")  # no CUDA events on this machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")  # the run's facts
    monkeypatch.setattr(torch.cuda, "nvtx", fake)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: fake.allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: fake.peak)
    return fake


def model_on(torch, cuda):
    class Grow(torch.nn.Module):
        def __init__(self, kept, transient):
            super().__init__()
            self.kept, self.transient = kept, transient

        def forward(self, x):
            cuda.grow(self.kept, self.transient)
            return x

    return torch.nn.Sequential(Grow(100, 50), torch.nn.Sequential(Grow(10, 0)))


def test_nvtx_ranges_are_named_by_call_path_and_balanced(torch, cuda):
    model = model_on(torch, cuda)
    with tracetorch.profile(model, nvtx=True):
        model(torch.ones(1))
    assert cuda.log == [("push", "Sequential"), ("push", "0"), ("pop",), ("push", "1"),
                        ("push", "1.0"), ("pop",), ("pop",), ("pop",)]


def test_nvtx_is_off_unless_asked_and_pops_when_a_layer_raises(torch, cuda):
    class Fails(torch.nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    model = torch.nn.Sequential(Fails())
    with tracetorch.profile(model):
        model_on(torch, cuda)(torch.ones(1))
    assert cuda.log == []
    with pytest.raises(ValueError, match="boom"), tracetorch.profile(model, nvtx=True):
        model(torch.ones(1))
    assert cuda.log == [("push", "Sequential"), ("push", "0"), ("pop",), ("pop",)]


def test_nothing_without_cuda(torch, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(name))
    layer = torch.nn.Linear(2, 2)
    with tracetorch.profile(layer, nvtx=True) as prof:
        layer(torch.ones(1, 2))
    assert calls == [] and prof.find("").memory.device_peak_bytes == 0


def test_device_memory_change_and_peak_per_call(torch, cuda):
    model = model_on(torch, cuda)
    with tracetorch.profile(model) as prof:
        model(torch.ones(1))
        model(torch.ones(1))
    first, inner = prof.find("0"), prof.find("1.0")
    assert first.memory.device_delta_bytes == 2 * 100
    # Each of its calls set a new high-water mark: 1,000 + 100 + 50, then 1,110 + 100 + 50.
    assert first.memory.device_peak_bytes == 1_260
    # Its calls never did: their ends' readings (1,110, then 1,220) are all that is known.
    assert inner.memory.device_delta_bytes == 2 * 10
    assert inner.memory.device_peak_bytes == 1_220
    assert prof.find("").memory.device_delta_bytes == 2 * 110
    assert prof.peak_bytes == 1_260
    assert "device peak 1.23 KiB" in str(prof)


def test_memory_false_reads_no_allocator(torch, cuda):
    model = model_on(torch, cuda)
    with tracetorch.profile(model, memory=False) as prof:
        model(torch.ones(1))
    assert prof.peak_bytes == 0
