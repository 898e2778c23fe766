"""benchmark (blocked timing under a fake clock), Measurement statistics, measure_latency."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from tracetorch.models.tensors import dummy_input
from tracetorch.tools.bench import Measurement, benchmark, measure_latency


class FakeClock:
    """Integer nanoseconds: each read costs ``read_ns``; ``work`` advances time by hand."""

    def __init__(self, read_ns=1):
        self.now = 0
        self.read_ns = read_ns
        self.reads = 0

    def __call__(self):
        self.reads += 1
        self.now += self.read_ns
        return self.now

    def work(self, ns):
        self.now += ns


# ---------------------------------------------------------------- Measurement
def test_measurement_statistics_are_exact():
    m = Measurement.from_times((1.0, 2.0, 3.0, 4.0, 5.0), number_per_block=10)
    assert (m.median, m.mean, m.iqr, m.n, m.number_per_block) == (3.0, 3.0, 2.0, 5, 10)
    assert m.p10 == pytest.approx(1.4) and m.p90 == pytest.approx(4.6)
    assert m.warnings == ("large spread: IQR is 67% of the median",)


def test_measurement_warns_on_large_spread_with_the_percentage():
    m = Measurement.from_times((0.9, 0.9, 1.0, 1.13, 1.2), 1)
    assert (m.median, m.iqr) == (1.0, pytest.approx(0.23))
    assert m.warnings == ("large spread: IQR is 23% of the median",)


def test_measurement_without_spread_has_no_warnings():
    m = Measurement.from_times((2e-6,) * 10, 100)
    assert m.iqr == 0.0 and m.warnings == ()


def test_measurement_flags_too_few_blocks():
    assert "only 2 timed block(s)" in Measurement.from_times((1.0, 1.0), 1).warnings[0]


def test_measurement_needs_a_time():
    with pytest.raises(ValueError, match="times_s"):
        Measurement.from_times((), 1)


def test_measurement_str_picks_human_units():
    text = str(Measurement.from_times((1.5e-6,) * 8, 1000))
    assert "median 1.50 us per call" in text
    assert "8 blocks of 1,000 calls" in text
    text = str(Measurement.from_times((0.25,) * 8, 1))
    assert "median 250 ms" in text


def test_measurement_is_frozen():
    m = Measurement.from_times((1.0,) * 4, 1)
    with pytest.raises(AttributeError):
        m.median = 2.0


# ---------------------------------------------------------------- benchmark
def test_benchmark_with_a_fake_clock_gives_exact_numbers():
    clock = FakeClock(read_ns=1)
    calls = []

    def fn(x):
        calls.append(x)
        clock.work(1000)

    m = benchmark(fn, 7, warmup=2, min_run_time=0.2, clock=clock)
    # Calibration: an empty block costs 1 ns of clock reads; blocks of 1, 10 and 100 calls are
    # below min_run_time / 1000 = 200 us, 1000 calls (1,000,001 ns) is long enough.
    assert m.number_per_block == 1000
    # Then 200 blocks of 1,000,001 ns reach 0.2 s.
    assert m.n == 200
    assert m.times_s == (1_000_001 / 1000 / 1e9,) * 200
    assert (m.median, m.mean, m.iqr) == (1.000001e-6, pytest.approx(1.000001e-6), 0.0)
    assert m.warnings == ()
    assert set(calls) == {7}
    assert len(calls) == 2 + 1 + 10 + 100 + 1000 + 200 * 1000


def test_benchmark_max_blocks_caps_the_run():
    clock = FakeClock()
    m = benchmark(lambda: clock.work(10_000_000), warmup=0, max_blocks=3, clock=clock)
    assert m.number_per_block == 1 and m.n == 3


def test_benchmark_syncs_before_every_clock_read():
    clock = FakeClock()
    events = []

    def sync():
        events.append(("sync", clock.reads))

    benchmark(lambda: clock.work(10_000_000), warmup=0, max_blocks=2, clock=clock, sync=sync)
    # Every read is preceded by a sync that happened after the previous read.
    assert len(events) == clock.reads
    assert [reads for _, reads in events] == list(range(clock.reads))


def test_benchmark_calls_a_model_with_forward_only():
    class Model:
        def __init__(self):
            self.seen = []

        def forward(self, x):
            self.seen.append(x)

    model = Model()
    benchmark(model, "input", warmup=1, min_run_time=0.001)
    assert model.seen and set(model.seen) == {"input"}


def test_benchmark_real_clock_smoke():
    m = benchmark(np.dot, np.ones(64), np.ones(64), min_run_time=0.02)
    assert m.median > 0 and m.n >= 1
    assert m.number_per_block >= 1


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_state_restored_after_exception_inside_the_benchmarked_fn(enabled):
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        calls = []

        def boom():
            calls.append(1)
            if len(calls) > 1:  # warm-up passes, the first timed call raises
                assert not gc.isenabled()
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            benchmark(boom, warmup=1)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("kwargs, name", [
    ({"warmup": -1}, "warmup"),
    ({"max_blocks": 0}, "max_blocks"),
    ({"min_run_time": 0}, "min_run_time"),
])
def test_benchmark_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        benchmark(len, "x", **kwargs)


def test_benchmark_rejects_non_callables():
    with pytest.raises(TypeError, match="fn_or_model"):
        benchmark(42)


# ---------------------------------------------------------------- measure_latency
def test_measure_latency_returns_mean_seconds():
    def slow(x):
        # Busy-wait about 200 us so the mean is clearly in seconds, not ms.
        import time

        end = time.perf_counter() + 2e-4
        while time.perf_counter() < end:
            pass

    latency = measure_latency(slow, None, warmup=1, iterations=5)
    assert 1.5e-4 < latency < 0.05


def test_measure_latency_builds_a_core_tensor_from_a_shape():
    from tracetorch.core import Linear

    for _ in range(3):
        latency = measure_latency(Linear(8, 4), (4, 8), warmup=2, iterations=5)
        assert 0 < latency < 1.0


def test_measure_latency_builds_a_torch_tensor_for_a_torch_model(torch):
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(type(x))
            return x

    measure_latency(Probe(), (2, 3), warmup=0, iterations=1)
    assert seen == [torch.Tensor]


def test_dummy_input_is_zeros_or_seeded_in_the_models_framework():
    class Tokens:
        vocab_size = 7

    zeros = dummy_input(object(), (2, 3))
    assert zeros.data.dtype == np.float32 and not zeros.data.any()
    first, again = dummy_input(object(), (2, 3), seed=1), dummy_input(object(), (2, 3), seed=1)
    assert first.data.dtype == np.float32 and first.data.any()
    np.testing.assert_array_equal(first.data, again.data)
    ids = dummy_input(Tokens(), (50,), seed=0)
    assert ids.data.dtype == np.int64 and 0 <= ids.data.min() and ids.data.max() < 7
    assert not dummy_input(Tokens(), (3,)).data.any()


def test_dummy_input_takes_a_torch_models_dtype(torch):
    model = torch.nn.Linear(3, 2).double()
    assert dummy_input(model, (4, 3)).dtype == torch.float64
    x = dummy_input(model, (4, 3), seed=0)
    assert x.dtype == torch.float64 and bool(x.abs().sum() > 0)
    assert measure_latency(model, (4, 3), warmup=0, iterations=1) > 0


@pytest.mark.parametrize("iterations", [0, -3, 2.5, True, "10"])
def test_measure_latency_rejects_bad_iterations(iterations):
    with pytest.raises(ValueError, match="iterations"):
        measure_latency(len, [1], iterations=iterations)


@pytest.mark.parametrize("warmup", [-1, 1.0, None])
def test_measure_latency_rejects_bad_warmup(warmup):
    with pytest.raises(ValueError, match="warmup"):
        measure_latency(len, [1], warmup=warmup)


@pytest.mark.parametrize("model", [None, 3, "model", object()])
def test_measure_latency_rejects_non_models(model):
    with pytest.raises(TypeError, match="model"):
        measure_latency(model, [1])


def test_measure_latency_restores_gc_when_the_model_raises():
    assert gc.isenabled()

    def boom(x):
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        measure_latency(boom, 1, warmup=0)
    assert gc.isenabled()
