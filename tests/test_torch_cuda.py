"""Device timing policy, checked on CPU with a simulated GPU timeline and fake events.

The fake device has its own clock that only kernels advance; events read it when recorded,
like CUDA events read the GPU timeline. So a layer's recorded time must be the device time of
the kernels it launched, exactly, and nothing may wait for the device before a fold.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from tracetorch.adapters.torch import cuda as torch_cuda  # noqa: E402

nn = torch.nn
pytestmark = pytest.mark.filterwarnings("ignore:tracetorch has no FLOP rule")
ROOT = Path(__file__).resolve().parents[1]


class FakeDevice:
    now_ns = 0
    syncs = 0


class FakeEvent:
    def __init__(self):
        self.t = None

    def record(self):
        self.t = FakeDevice.now_ns

    def synchronize(self):
        FakeDevice.syncs += 1

    def elapsed_time(self, other):
        return (other.t - self.t) / 1e6  # milliseconds, as torch.cuda.Event


class Launch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, forward_ns, backward_ns):
        ctx.backward_ns = backward_ns
        FakeDevice.now_ns += forward_ns
        return x * 1

    @staticmethod
    def backward(ctx, grad):
        out = grad.clone()  # the first operation of the node marks its start
        FakeDevice.now_ns += ctx.backward_ns
        return out, None, None


class Kernel(nn.Module):
    def __init__(self, forward_ns, backward_ns=0):
        super().__init__()
        self.forward_ns, self.backward_ns = forward_ns, backward_ns

    def forward(self, x):
        return Launch.apply(x, self.forward_ns, self.backward_ns)


@pytest.fixture
def fake_gpu(monkeypatch):
    FakeDevice.now_ns = 0
    FakeDevice.syncs = 0
    monkeypatch.setattr(torch_cuda, "_cuda_event", FakeEvent)
    monkeypatch.setattr(torch_cuda, "cuda_timing_wanted", lambda: True)
    yield FakeDevice


def test_no_gpu_here_means_host_timing():
    assert torch_cuda.cuda_timing_wanted() is False or torch.cuda.is_initialized()
    with tracetorch.profile() as prof:
        nn.Linear(2, 2)(torch.ones(1, 2))
    assert prof._collector.device_clock is None
    assert prof._collector.deferred is None


def test_layer_times_are_device_times_read_only_at_folds(fake_gpu):
    model = nn.Sequential(Kernel(5_000_000), Kernel(2_000_000), Kernel(1_000_000))
    x = torch.ones(4)
    with tracetorch.profile(model, timeline=True) as prof:
        for _ in range(3):
            model(x)
            assert fake_gpu.syncs == 0  # nothing waited for the device inside the step
            prof.step()
            assert fake_gpu.syncs == 1  # one wait per step
            fake_gpu.syncs = 0
        model(x)
    assert [prof.find(p).time.total_ns for p in ("0", "1", "2")] == [
        4 * 5_000_000, 4 * 2_000_000, 4 * 1_000_000]
    assert prof.find("0").calls == 4
    assert prof.find("").time.total_ns == 4 * 8_000_000
    assert prof.find("").time.max_ns == 8_000_000
    assert len(prof.timeline) == 16
    assert prof.step_times.count == 3  # steps stay on the host clock
    assert prof.step_times.max_ns < 10**9


def test_backward_spans_are_device_times(fake_gpu):
    model = nn.Sequential(Kernel(1_000, 30_000), Kernel(1_000, 70_000))
    x = torch.ones(3, requires_grad=True)
    with tracetorch.profile(model) as prof:
        model(x).sum().backward()
    assert prof.find("0").backward_time.total_ns == 30_000
    assert prof.find("1").backward_time.total_ns == 70_000
    assert prof.find("0").backward_time.count == 1


def test_backward_follows_the_profiles_timing_setting_on_a_gpu(fake_gpu):
    model = nn.Sequential(Kernel(1_000, 30_000))
    x = torch.ones(3, requires_grad=True)
    with tracetorch.profile(model, timing=False) as prof:
        model(x).sum().backward()
    assert prof._collector.device_clock is None
    assert (prof.find("0").backward_time.count, prof.find("0").backward_time.total_ns) == (1, 0)
    ticks = iter(range(0, 10**12, 1_000))
    with tracetorch.profile(model, clock=lambda: next(ticks)) as prof:
        model(x).sum().backward()
    assert prof.find("0").backward_time.total_ns % 1_000 == 0  # the injected clock, not events
    assert fake_gpu.syncs == 0


def test_failing_call_is_timed_on_the_device_too(fake_gpu):
    class Fails(nn.Module):
        def forward(self, x):
            FakeDevice.now_ns += 3_000
            raise ValueError("no")

    model = Fails()
    with pytest.raises(ValueError):
        with tracetorch.profile(model) as prof:
            model(torch.ones(1))
    assert prof.find("").errors == 1
    assert prof.find("").time.total_ns == 3_000


def test_host_override_and_injected_clocks_are_respected(fake_gpu, monkeypatch):
    ticks = iter(range(0, 10**9, 10))
    with tracetorch.profile(clock=lambda: next(ticks)) as prof:
        Kernel(5_000)(torch.ones(1))
    assert prof._collector.device_clock is None
    assert prof.find("").time.total_ns == 10


def test_event_clock_resolves_only_its_spans():
    FakeDevice.now_ns = 0
    clock = torch_cuda.EventClock(FakeEvent)
    a = clock()
    FakeDevice.now_ns += 50
    b = clock()
    c = clock()  # a call still open at the fold
    assert [r[:2] for r in clock.resolve([("node", a, b)])] == [("node", 50)]
    FakeDevice.now_ns += 7
    d = clock()
    assert clock.resolve([("later", c, d)])[0][:2] == ("later", 7)


@pytest.mark.slow
def test_gpu_check_exits_cleanly_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: run benchmarks/gpu_check.py itself")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "CUDA is not available" in out.stdout


def test_a_block_that_never_steps_folds_when_events_pile_up(fake_gpu, monkeypatch):
    monkeypatch.setattr(torch_cuda.EventClock, "MAX_PENDING", 10)
    model = nn.Sequential(Kernel(1_000), Kernel(1_000))
    with tracetorch.profile(model) as prof:
        for _ in range(10):
            model(torch.ones(1))
        assert fake_gpu.syncs >= 2
        assert len(prof._collector.device_clock._events) <= 12
    assert prof.find("0").time.total_ns == 10_000
    assert prof.find("").calls == 10
