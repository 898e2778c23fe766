"""The TinyTorch-compatible facade (tracetorch.perf) and tracetorch.tools.flop_count."""
from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

from support.torch_models import shared_model
from tracetorch.compat.tinytorch.profiling import _count_conv_flops, _count_linear_flops
from tracetorch.core import Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential, Tensor
from tracetorch.perf import (
    BYTES_PER_FLOAT32,
    KB_TO_BYTES,
    MB_TO_BYTES,
    Profiler,
    analyze_weight_distribution,
    arithmetic_intensity,
    quick_profile,
)
from tracetorch.tools.flop_count import count_flops


@pytest.fixture
def profiler():
    return Profiler()


def conv(in_c, out_c, k, stride=None, padding=None):
    """A duck-typed convolution: only the attributes the formula reads."""
    attrs = {"in_channels": in_c, "out_channels": out_c, "kernel_size": k}
    if stride is not None:
        attrs["stride"] = stride
    if padding is not None:
        attrs["padding"] = padding
    return SimpleNamespace(**attrs)


def test_constants():
    assert (BYTES_PER_FLOAT32, KB_TO_BYTES, MB_TO_BYTES) == (4, 1024, 1024 * 1024)


# ---------------------------------------------------------------- parameters
def test_layer_parameter_checks_are_independent(profiler):
    w, b = np.zeros((10, 5)), np.zeros(5)
    assert profiler._count_layer_parameters(SimpleNamespace(weight=w, bias=b)) == 55
    assert profiler._count_layer_parameters(SimpleNamespace(weight=np.zeros((8, 4)))) == 32
    assert profiler._count_layer_parameters(SimpleNamespace(bias=b)) == 5
    assert profiler._count_layer_parameters(SimpleNamespace(weight=w, bias=None)) == 50
    assert profiler._count_layer_parameters(object()) == 0


def test_count_parameters_counts_the_call(profiler):
    assert profiler.count_parameters(Linear(1024, 512)) == 524_800
    assert profiler.count_parameters(SimpleNamespace()) == 0
    assert profiler.operation_counts["count_parameters"] == 2


# ---------------------------------------------------------------- linear FLOPs
@pytest.mark.parametrize("layer, shape, expected", [
    (Linear(128, 64), (1, 128), 16_384),
    (Linear(128, 64), (32, 128), 524_288),        # whole batch
    (Linear(256, 256), (1, 256), 131_072),
    (Linear(4, 3), (7, 5, 4), 840),               # every leading dimension
    (Linear(1024, 512), (1, 1024), 1_048_576),    # the guide's example
    (SimpleNamespace(weight=np.zeros((128, 64))), (1, 128), 16_384),  # (in, out) weight
])
def test_linear_flops(profiler, layer, shape, expected):
    assert profiler._count_linear_flops(layer, input_shape=shape) == expected
    assert _count_linear_flops(layer, shape) == expected


def test_linear_flops_rejects_bad_shapes(profiler):
    with pytest.raises(ValueError, match="input_shape"):
        profiler._count_linear_flops(Linear(4, 3), (0, 4))


# ---------------------------------------------------------------- conv FLOPs
@pytest.mark.parametrize("layer, shape, expected", [
    (conv(3, 16, 3), (1, 3, 32, 32), 777_600),
    (conv(3, 64, 7, stride=2), (1, 3, 224, 224), 223_552_896),
    (conv(3, 10, 3, stride=1, padding=3), (1, 3, 28, 28), 552_960),
    (conv(3, 16, (3, 3), stride=(1, 1), padding=(0, 0)), (1, 3, 32, 32), 777_600),
    (conv(3, 16, 3), (4, 3, 32, 32), 4 * 777_600),  # whole batch
    (conv(3, 16, 3), (3, 32, 32), 777_600),         # unbatched image
    (conv(3, 16, (3, 1), padding=(1, 0)), (1, 3, 8, 8), 2 * 3 * 1 * 3 * 16 * 8 * 8),
    (SimpleNamespace(kernel_size=3), (1, 3, 32, 32), 0),  # attributes missing
])
def test_conv_flops(profiler, layer, shape, expected):
    assert profiler._count_conv_flops(layer, shape) == expected
    assert _count_conv_flops(layer, shape) == expected


def test_conv_flops_groups_and_torch_padding_strings():
    depthwise = SimpleNamespace(in_channels=8, out_channels=8, kernel_size=3, groups=8,
                                padding="same")
    assert _count_conv_flops(depthwise, (1, 8, 10, 10)) == 2 * 9 * 1 * 8 * 100
    valid = SimpleNamespace(in_channels=1, out_channels=1, kernel_size=3, padding="valid")
    assert _count_conv_flops(valid, (1, 1, 5, 5)) == 2 * 9 * 9


def test_conv_flops_of_a_core_conv2d(profiler):
    assert profiler._count_conv_flops(Conv2d(3, 16, 3, padding=1), (4, 3, 32, 32)) == (
        2 * 9 * 3 * 16 * 32 * 32 * 4)


def test_conv_input_too_small_is_a_value_error():
    with pytest.raises(ValueError, match="input_shape"):
        _count_conv_flops(conv(1, 1, 5), (1, 1, 3, 3))


# ---------------------------------------------------------------- count_flops dispatch
def test_sequential_of_linears(profiler):
    model = Sequential(Linear(128, 64), Linear(64, 10))
    assert profiler._count_sequential_flops(model, (1, 128)) == 17_664
    assert profiler.count_flops(model, (1, 128)) == 17_664


def test_sequential_with_activation_covers_the_whole_batch(profiler):
    model = Sequential(Linear(4, 3), ReLU(), Linear(3, 2))
    # 24 + 3 (one comparison per ReLU output) + 12 per row, for 1 and for 7 rows.
    assert profiler.count_flops(model, (1, 4)) == 39
    assert profiler.count_flops(model, (7, 4)) == 7 * 39


def test_sequential_of_convolutions_propagates_shapes(profiler):
    model = Sequential(Conv2d(1, 2, 3), Conv2d(2, 3, 3))
    per_image = 6 * 6 * 9 * 1 * 2 * 2 + 4 * 4 * 9 * 2 * 3 * 2
    assert per_image == 3024
    assert profiler.count_flops(model, (5, 1, 8, 8)) == 5 * per_image


def test_shapes_flow_through_pooling_and_flatten(profiler):
    model = Sequential(Conv2d(1, 2, 3), MaxPool2d(2), Flatten(), Linear(2 * 3 * 3, 4))
    conv_flops = 2 * 9 * 1 * 2 * 6 * 6 * 2
    pool_flops = count_flops(MaxPool2d(2), (2, 2, 6, 6))
    linear_flops = 2 * 18 * 4 * 2
    assert profiler.count_flops(model, (2, 1, 8, 8)) == conv_flops + pool_flops + linear_flops


def test_subclasses_keep_their_parents_formula(profiler):
    class QuantizedLinear(Linear):
        pass

    assert profiler.count_flops(QuantizedLinear(128, 64), (2, 128)) == 2 * 16_384


def test_a_class_named_linear_is_not_dispatched_by_name(profiler):
    class Linear:
        def forward(self, x):
            return x * 2.0

    # Runs under the engine instead: one multiply per element, no 2*in*out formula.
    assert profiler.count_flops(Linear(), (2, 3)) == count_flops(Linear(), (2, 3))


def test_other_models_fall_back_to_the_engine(profiler):
    relu = ReLU()
    assert profiler.count_flops(relu, (4, 8)) == count_flops(relu, (4, 8)) == 32
    assert profiler.operation_counts["count_flops"] == 1


@pytest.mark.parametrize("shape", [(), (0, 3), (2, -1), "2,3", None, (2.0, 3), (True, 3)])
def test_count_flops_validates_input_shape(profiler, shape):
    with pytest.raises(ValueError, match="input_shape"):
        profiler.count_flops(Linear(3, 3), shape)


@pytest.mark.parametrize("shape", [(), (0, 3), (2, -1), (2.0, 3), (True, 3)])
def test_count_flops_validates_what_looks_like_a_shape(shape):
    # Anything else is the model's input (tests/test_count_flops_inputs.py).
    with pytest.raises(ValueError, match="inputs: expected a non-empty tuple of positive ints"):
        count_flops(Linear(3, 3), shape)


# ---------------------------------------------------------------- static_flops
def test_static_count_flops_agrees_with_the_closed_forms(profiler):
    # The engine's rules count GEMM/convolution FLOPs without the bias add, as the facade does.
    assert count_flops(Linear(4, 3), (7, 5, 4)) == 840
    for model, shape in [(Linear(4, 3), (7, 5, 4)), (Conv2d(3, 4, 3, padding=1), (2, 3, 6, 6)),
                         (Sequential(Conv2d(1, 2, 3), MaxPool2d(2), Flatten(), Linear(18, 4)),
                          (2, 1, 8, 8))]:
        assert profiler.count_flops(model, shape) == count_flops(model, shape)


def test_static_count_flops_rejects_non_models():
    with pytest.raises(TypeError, match="model"):
        count_flops(42, (2, 3))


def test_static_count_flops_of_a_torch_model_keeps_its_mode(torch):
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Dropout(0.5)).eval()
    flops = count_flops(model, (4, 16))
    assert flops >= 2 * 16 * 8 * 4
    assert not model.training
    assert all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------- latency and memory
def test_measure_latency_in_seconds(profiler):
    latency = profiler.measure_latency(Linear(8, 4), Tensor(np.ones((4, 8))), warmup=2,
                                       iterations=5)
    assert 0 < latency < 1.0
    with pytest.raises(ValueError, match="iterations"):
        profiler.measure_latency(Linear(4, 3), Tensor(np.ones((1, 4))), iterations=0)


def test_measure_memory_keys_and_values(profiler):
    small = profiler.measure_memory(Linear(5, 5), (5, 5))
    large = profiler.measure_memory(Linear(50, 50), (50, 50))
    assert list(large) == ["parameter_memory_mb", "activation_memory_mb", "peak_memory_mb",
                           "memory_efficiency"]
    assert large["parameter_memory_mb"] == 2550 * 4 / MB_TO_BYTES
    assert large["activation_memory_mb"] == 2 * 2500 * 4 / MB_TO_BYTES
    assert large["activation_memory_mb"] >= small["activation_memory_mb"]
    assert large["peak_memory_mb"] >= large["parameter_memory_mb"] + large["activation_memory_mb"]
    assert 0 <= large["memory_efficiency"] <= 1


class Boom:
    def forward(self, x):
        raise ValueError("boom")


@pytest.mark.parametrize("model", [Linear(4, 4), Boom()])
def test_measure_memory_leaves_tracing_off_when_it_was_off(profiler, model):
    assert not tracemalloc.is_tracing()
    try:
        profiler.measure_memory(model, (2, 4))
    except ValueError as error:
        assert str(error) == "boom"
    assert not tracemalloc.is_tracing()


@pytest.mark.parametrize("model", [Linear(4, 4), Boom()])
def test_measure_memory_keeps_a_callers_tracing_on(profiler, model):
    tracemalloc.start()
    try:
        try:
            profiler.measure_memory(model, (2, 4))
        except ValueError as error:
            assert str(error) == "boom"
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()


# ---------------------------------------------------------------- reports
def test_profile_forward_pass_report(profiler):
    model, x = Linear(256, 128), Tensor(np.ones((64, 256), dtype=np.float32))
    report = profiler.profile_forward_pass(model, x)
    for key in ("parameters", "flops", "latency_ms", "gflops_per_second",
                "memory_bandwidth_mbs", "bottleneck", "is_memory_bound", "is_compute_bound",
                "computational_efficiency", "assumed_peak_gflops"):
        assert key in report
    assert report["parameters"] == 32_896
    assert report["flops"] == report["batch_flops"] == 2 * 256 * 128 * 64
    assert report["gflops_per_second"] == pytest.approx(
        report["flops"] / 1e9 / (report["latency_ms"] / 1e3), rel=1e-9)
    touched = (32_896 + 64 * 256 + 64 * 128) * 4
    assert report["arithmetic_intensity"] == pytest.approx(report["flops"] / touched)
    assert report["is_memory_bound"] != report["is_compute_bound"]
    assert 0 <= report["computational_efficiency"] <= 1


def test_measurements_are_keyed_by_unique_names(profiler):
    first, second = Linear(4, 3), Linear(4, 3)
    profiler.profile_forward_pass(first, Tensor(np.ones((2, 4))))
    profiler.profile_forward_pass(second, Tensor(np.ones((2, 4))))
    profiler.profile_layer(Linear(8, 4), (4, 8))
    assert list(profiler.measurements) == ["Linear", "Linear_2", "Linear_3"]


def test_profile_layer_throughput_uses_whole_batch_flops(profiler, monkeypatch):
    monkeypatch.setattr(profiler, "measure_latency", lambda *args, **kwargs: 0.002)
    report = profiler.profile_layer(Linear(4, 3), (7, 4))
    assert report["flops"] == 7 * 24
    assert report["gflops_per_second"] == pytest.approx(7 * 24 / 1e9 / 0.002)
    assert report["latency_ms"] == pytest.approx(2.0)


def test_profile_backward_pass_measures_real_autograd(profiler):
    model, x = Linear(8, 4), Tensor(np.ones((4, 8)))
    earlier = Tensor(np.full((8, 4), 3.0))
    model.weight.grad = earlier
    report = profiler.profile_backward_pass(model, x)
    assert report["backward_measured"] is True
    assert report["backward_flops_source"] == "measured"
    assert list(profiler.measurements) == ["Linear", "Linear (backward)"]
    assert report["forward_flops"] == 2 * 8 * 4 * 4
    assert report["backward_flops"] > 0
    assert report["total_flops"] == report["forward_flops"] + report["backward_flops"]
    assert report["total_latency_ms"] > 0
    assert report["gradient_memory_mb"] == 36 * 4 / MB_TO_BYTES
    assert report["optimizer_memory_estimates"]["adam"] == 2 * report["gradient_memory_mb"]
    # Gradients the caller had are back, untouched.
    assert model.weight.grad is earlier and model.bias.grad is None


def test_profile_backward_pass_estimates_without_autograd(profiler):
    class Doubler:
        weight = np.ones(3)

        def forward(self, x):
            return x * 2.0

    report = profiler.profile_backward_pass(Doubler(), Tensor(np.ones((2, 3))))
    assert report["backward_measured"] is False
    assert report["backward_flops"] == 2 * report["forward_flops"]
    assert report["backward_flops_source"] == "estimated (2x forward)"


def test_context_manager_counts_layer_calls(profiler):
    model = Sequential(Linear(4, 8), ReLU(), Linear(8, 2))
    with profiler as p:
        for _ in range(3):
            model(Tensor(np.ones((2, 4))))
    assert p is profiler
    assert profiler.operation_counts["Linear"] == 6
    assert profiler.operation_counts["ReLU"] == 3
    assert profiler.operation_counts["Sequential"] == 3
    assert profiler.elapsed > 0
    assert profiler.result is profiler.prof
    assert profiler.prof.forward_flops > 0


def test_context_manager_propagates_exceptions_and_records_elapsed(profiler):
    with pytest.raises(KeyError):
        with profiler:
            Linear(2, 2)(Tensor(np.ones((1, 2))))
            raise KeyError("stop")
    assert profiler.elapsed is not None
    assert profiler.operation_counts["Linear"] == 1


def test_quick_profile_prints_labelled_units(capsys):
    report = quick_profile(Linear(16, 8), (8, 16))
    out = capsys.readouterr().out
    assert "Parameters:  136" in out
    assert f"FLOPs:       {2 * 16 * 8 * 8:,}" in out
    assert " ms " in out and "GFLOP/s" in out and "MiB" in out
    assert "Heuristic bottleneck (not hardware measured)" in out
    assert "assumed 100 GFLOP/s peak (heuristic)" in out
    assert {"parameters", "flops", "latency_ms"} <= set(report)


def test_quick_profile_reuses_a_given_profiler(profiler):
    quick_profile(Linear(4, 2), Tensor(np.ones((1, 4))), profiler=profiler)
    assert list(profiler.measurements) == ["Linear"]


def test_torch_model_through_the_facade(torch, profiler):
    model = torch.nn.Linear(1024, 512)
    assert profiler.count_parameters(model) == 524_800
    assert profiler._count_linear_flops(model, (1, 1024)) == 1_048_576
    assert profiler.measure_latency(model, torch.ones(1, 1024), warmup=1, iterations=3) > 0


# ---------------------------------------------------------------- weights, intensity
def test_weight_distribution():
    stats = analyze_weight_distribution(SimpleNamespace(weight=np.full((10, 5), -0.1)))
    assert stats["total_weights"] == 50
    assert stats["mean"] == pytest.approx(0.1) and stats["std"] == pytest.approx(0.0)
    assert stats["below_threshold_01"] == 0.0  # |w| = 0.1 is not strictly below 0.1


def test_weight_distribution_covers_biases_and_percentiles():
    stats = analyze_weight_distribution(Linear(4, 2), percentiles=(50,))
    assert stats["total_weights"] == 10
    assert "percentile_50" in stats and "percentile_10" not in stats
    assert stats["below_threshold_0001"] >= 20.0  # the two zero biases


def test_weight_distribution_without_weights():
    assert analyze_weight_distribution(SimpleNamespace()) == {"error": "No weights found"}


@pytest.mark.parametrize("flops, moved, ridge, intensity, regime", [
    (1e6, 2e6, 19.5e12 / 2039e9, 0.5, "memory"),
    (32e6, 2e6, 19.5e12 / 2039e9, 16.0, "compute"),
    (96, 10.0, 9.6, 9.6, "compute"),  # a tie is compute-bound
    (0, 0.0, 9.6, 0.0, "memory"),
])
def test_arithmetic_intensity(flops, moved, ridge, intensity, regime):
    result = arithmetic_intensity(flops, moved, ridge)
    assert result["intensity"] == pytest.approx(intensity)
    assert result["regime"] == regime


def test_torch_models_fall_back_to_the_engine(torch, profiler):
    assert count_flops(shared_model(torch), (1, 100)) == 3 * 2 * 100 * 100
    assert profiler.count_flops(shared_model(torch), (1, 100)) == 60_000


def test_torch_backward_pass_is_measured_and_leaves_gradients_alone(torch, profiler):
    nn = torch.nn
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))
    earlier = torch.full((8, 16), 3.0)
    model[0].weight.grad = earlier
    report = profiler.profile_backward_pass(model, torch.ones(4, 16))
    assert report["backward_measured"] is True
    assert report["backward_flops_source"] == "measured" and report["backward_flops"] > 0
    assert report["gradient_memory_mb"] == (16 * 8 + 8 + 8 * 2 + 2) * 4 / MB_TO_BYTES
    assert model[0].weight.grad is earlier and model[2].weight.grad is None


def test_context_manager_counts_torch_layer_calls(torch, profiler):
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with profiler:
        model(torch.ones(2, 16))
        model(torch.ones(2, 16))
    counts = profiler.operation_counts
    assert (counts["Sequential"], counts["Linear"], counts["ReLU"]) == (2, 4, 2)
