"""Training loops under the profiler: schedules, step statistics, the decorator, backward FLOPs.

Expected FLOPs are derived by hand from the conventions in ``tracetorch.core.autograd``'s
docstring (FLOPs = 2 x MACs; the whole batch) and, for torch, from FlopCounterMode's.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import tracetorch
from tracetorch.cli.demo import run_demo
from tracetorch.core import (
    SGD,
    Adam,
    Conv2d,
    CrossEntropyLoss,
    Linear,
    Module,
    Optimizer,
    ReLU,
    Sequential,
    Tensor,
    manual_seed,
)

ROWS, IN, OUT = 4, 5, 3


class FakeClock:
    """An integer-nanosecond clock that only moves when the test says so."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


def _mlp() -> Sequential:
    manual_seed(0)
    return Sequential(Linear(IN, 8), ReLU(), Linear(8, OUT))


def _training_step(model: Sequential, optimizer: Optimizer) -> Callable[[], None]:
    x = Tensor(np.ones((ROWS, IN), dtype=np.float32))
    y = np.arange(ROWS) % OUT
    loss_fn = CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

    return step


# ------------------------------------------------------------------------------------ schedules
@pytest.mark.parametrize("wait, warmup, active, repeat, steps, recorded", [
    (1, 1, 2, 1, 6, 2),   # wait, warm-up, 2 active, then done
    (0, 1, 3, 1, 6, 3),
    (1, 0, 1, 2, 6, 2),   # two cycles of (wait, active)
    (0, 2, 1, 0, 9, 3),   # repeat=0: cycles for ever
])
def test_schedule_records_only_active_steps(wait: int, warmup: int, active: int, repeat: int,
                                            steps: int, recorded: int) -> None:
    model = _mlp()
    optimizer = SGD(model.parameters(), lr=0.1)
    train = _training_step(model, optimizer)
    sched = tracetorch.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
    with tracetorch.profile(model, schedule=sched) as prof:
        for _ in range(steps):
            train()
            prof.step()
    # One call per step of every layer, the loss, the backward pass and the optimizer.
    for path in ("layers.0", "layers.1", "layers.2"):
        assert prof.find(path).calls == recorded
    assert prof.find("CrossEntropyLoss").calls == recorded
    assert prof.find("backward").calls == recorded
    assert prof.find("SGD.step").calls == recorded
    assert prof.find("layers.0").backward_time.count == recorded
    assert prof.step_times.count == recorded


def test_schedule_scales_exactly_with_calls_per_step() -> None:
    model = _mlp()
    x = Tensor(np.ones((ROWS, IN), dtype=np.float32))
    sched = tracetorch.schedule(wait=1, warmup=1, active=2, repeat=1)
    with tracetorch.profile(model, schedule=sched) as prof:
        for _ in range(6):
            for _ in range(3):  # three forward calls per step
                model(x)
            prof.step()
    assert prof.find("layers.2").calls == 2 * 3
    # Warm-up and waiting steps leave nothing behind: FLOPs are those of the 6 recorded calls.
    assert prof.find("layers.0").flops == 6 * 2 * ROWS * IN * 8


# ------------------------------------------------------------------------------------ steps
def test_step_statistics_with_a_fake_clock() -> None:
    clock = FakeClock()
    durations_ms = [10, 20, 30, 40, 50]
    with tracetorch.profile(clock=clock) as prof:
        for ms in durations_ms:
            clock.advance(ms * 1_000_000)
            prof.step()
    steps = prof.step_times
    assert steps.count == 5
    assert steps.mean_ns == 30_000_000
    assert steps.total_ns == 150_000_000
    assert (steps.min_ns, steps.max_ns) == (10_000_000, 50_000_000)
    # Step times are kept exactly (up to EXACT_STEPS), so quantiles interpolate linearly
    # between samples as numpy.percentile does: p90 of 10..50 ms is 46 ms.
    assert steps.quantile(0.5) == 30_000_000
    assert steps.quantile(0.9) == pytest.approx(46_000_000)


def test_equal_steps_give_exact_quantiles() -> None:
    clock = FakeClock()
    with tracetorch.profile(clock=clock) as prof:
        for _ in range(4):
            clock.advance(7_000_000)
            prof.step()
    assert prof.step_times.mean_ns == 7_000_000
    assert prof.step_times.quantile(0.5) == 7_000_000
    assert prof.step_times.quantile(0.9) == 7_000_000
    assert prof.step_times.std_ns == 0


def test_warmup_steps_are_not_timed() -> None:
    clock = FakeClock()
    with tracetorch.profile(clock=clock, schedule=tracetorch.schedule(warmup=2, active=2,
                                                                      repeat=1)) as prof:
        for ms in (100, 100, 3, 5, 100):  # two slow warm-ups, two steps, one after "done"
            clock.advance(ms * 1_000_000)
            prof.step()
    assert prof.step_times.count == 2
    assert prof.step_times.mean_ns == 4_000_000


def test_decorator_records_one_step_per_call() -> None:
    clock = FakeClock()
    model = _mlp()
    prof = tracetorch.profile(model, clock=clock)
    x = Tensor(np.ones((ROWS, IN), dtype=np.float32))

    @prof
    def train_step(ms: int) -> str:
        model(x)
        clock.advance(ms * 1_000_000)
        return "done"

    assert [train_step(ms) for ms in (2, 4, 6)] == ["done"] * 3
    assert prof.step_times.count == 3
    assert prof.step_times.mean_ns == 4_000_000
    assert prof.find("layers.0").calls == 3
    assert not prof.running
    model(x)  # outside the decorated function nothing is recorded
    assert prof.find("layers.0").calls == 3


def test_decorator_with_a_schedule_skips_warmup_calls() -> None:
    model = _mlp()
    x = Tensor(np.ones((ROWS, IN), dtype=np.float32))
    prof = tracetorch.profile(model, schedule=tracetorch.schedule(warmup=1, active=2, repeat=1))

    @prof
    def forward() -> None:
        model(x)

    for _ in range(5):
        forward()
    assert prof.find("layers.0").calls == 2
    assert prof.step_times.count == 2


# ------------------------------------------------------------------------------------ kinds
def test_optimizer_steps_are_nodes() -> None:
    model = _mlp()
    for optimizer, name in ((SGD(model.parameters(), lr=0.1), "SGD.step"),
                            (Adam(model.parameters()), "Adam.step")):
        train = _training_step(model, optimizer)
        with tracetorch.profile(model) as prof:
            train()
            train()
        node = prof.find(name)
        assert (node.kind, node.calls) == ("optimizer", 2)


def test_step_shares_with_a_fake_clock() -> None:
    clock = FakeClock()

    class SlowLayer(Module):
        def forward(self, x: Tensor) -> Tensor:
            clock.advance(3_000)
            return x * 2.0

    class SlowSGD(SGD):
        def step(self) -> None:
            clock.advance(2_000)
            super().step()

    layer = SlowLayer()
    weight = Tensor(np.ones((ROWS, IN), dtype=np.float32), requires_grad=True)
    optimizer = SlowSGD([weight], lr=0.1)
    with tracetorch.profile(clock=clock) as prof:
        for _ in range(2):
            layer(weight).sum().backward()
            optimizer.step()
            prof.step()
    assert prof.time_by_kind() == {"data": 0, "forward": 6_000, "backward": 0,
                                   "optimizer": 4_000}
    # Per step: 3 us forward, 2 us optimizer, nothing outside the recorded calls.
    assert {name: stats.total_ns for name, stats in prof.step_phases.items()} == {
        "data": 0, "forward": 6_000, "backward": 0, "optimizer": 4_000, "other": 0}
    assert prof.step_phases["forward"].count == 2
    phases = next(line for line in str(prof).splitlines() if line.startswith("Step phases:"))
    assert phases.endswith("forward 60.0% (mean 3.00 us), optimizer 40.0% (mean 2.00 us)")
    assert "Bottleneck:" not in str(prof)
    assert prof.step_times.mean_ns == 5_000


def test_a_loop_waiting_for_its_data_is_input_bound() -> None:
    clock = FakeClock()
    layer = _mlp()
    x = Tensor(np.ones((ROWS, IN), dtype=np.float32))
    with tracetorch.profile(layer, clock=clock) as prof:
        for _ in range(3):
            clock.advance(7_000)  # a hand-written loader, outside every recorded call
            layer(x)
            prof.step()
    other = prof.step_phases["other"]
    assert other.count == 3 and other.mean_ns == 7_000
    bound = next(line for line in str(prof).splitlines() if line.startswith("Bottleneck:"))
    assert "input-bound: 100% of the step is spent fetching data outside the model" in bound


def test_forward_only_run_has_no_step_shares() -> None:
    model = _mlp()
    with tracetorch.profile(model) as prof:
        model(Tensor(np.ones((ROWS, IN), dtype=np.float32)))
    assert "Step shares:" not in str(prof)


def test_demo_run_shows_forward_backward_and_optimizer() -> None:
    run = run_demo(steps=4, batch_size=8, image_size=8)
    prof = run.profile
    assert len(run.losses) == 4
    assert prof.step_times.count == 3
    assert prof.find("layers.0").calls == 3
    assert prof.find("layers.0").backward_flops > 0
    assert {"backward", "SGD.step"} <= set(prof.root.children)
    shares = prof.time_by_kind()
    assert shares.pop("data") == 0 and all(ns > 0 for ns in shares.values())


# ------------------------------------------------------------------------------------ core FLOPs
@pytest.mark.parametrize("input_grad", [False, True])
def test_core_linear_backward_flops(input_grad: bool) -> None:
    layer = Linear(IN, OUT)
    x = Tensor(np.ones((ROWS, IN), dtype=np.float32), requires_grad=input_grad)
    with tracetorch.profile() as prof:
        layer(x).sum().backward()
    node = prof.find("")
    gemm = 2 * ROWS * IN * OUT
    n = ROWS * OUT
    # Forward: the Linear rule counts the product (bias add not counted, as in the guide).
    assert node.flops == gemm
    # Backward: matmul, 2*m*k*n per input that needs a gradient (the weight; x if asked);
    # bias add, 1*n for the product's gradient + (1*n + R) for the bias, where
    # R = n - bias.size adds reduce the broadcast gradient down to the bias.
    bias_add = n + (n + (n - OUT))
    expected_gemm = gemm * (2 if input_grad else 1)
    assert node.backward_gemm_flops == expected_gemm
    assert node.backward_flops == expected_gemm + bias_add
    assert node.backward_time.count == 1
    assert prof.find("backward").kind == "backward"
    assert prof.find("backward").calls == 1


@pytest.mark.parametrize("input_grad", [False, True])
def test_core_conv2d_backward_flops(input_grad: bool) -> None:
    n, cin, cout, k, size = 2, 2, 3, 3, 5
    layer = Conv2d(cin, cout, kernel_size=k, padding=1)
    x = Tensor(np.ones((n, cin, size, size), dtype=np.float32), requires_grad=input_grad)
    with tracetorch.profile() as prof:
        layer(x).sum().backward()
    node = prof.find("")
    out_hw = size  # padding 1 keeps 5x5
    conv = 2 * k * k * cin * cout * out_hw * out_hw * n
    assert node.flops == conv
    # Weight gradient costs one convolution, the input gradient another (bias not counted).
    expected = conv * (2 if input_grad else 1)
    assert node.backward_flops == node.backward_gemm_flops == expected


def test_backward_flops_add_up_per_pass() -> None:
    layer = Linear(IN, OUT)
    x = Tensor(np.ones((ROWS, IN), dtype=np.float32))
    with tracetorch.profile() as prof:
        for _ in range(3):
            layer(x).sum().backward()
            prof.step()
    node = prof.find("")
    assert node.backward_time.count == 3
    assert node.backward_gemm_flops == 3 * 2 * ROWS * IN * OUT


# ------------------------------------------------------------------------------------ torch
def _flop_counter_total(fn: Callable[[], object]) -> int:  # requires torch
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("input_grad", [False, True])
def test_torch_linear_backward_flops(torch: Any, input_grad: bool) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(IN, OUT)
    x = torch.ones(ROWS, IN, requires_grad=input_grad)
    with tracetorch.profile() as prof:
        layer(x).sum().backward()
    node = prof.find("")
    gemm = 2 * ROWS * IN * OUT
    assert node.gemm_flops == gemm
    # FlopCounterMode's count: one GEMM for the weight gradient, one more for the input's.
    assert node.backward_gemm_flops == gemm * (2 if input_grad else 1)
    reference = _flop_counter_total(lambda: layer(x).sum().backward())
    assert node.gemm_flops + node.backward_gemm_flops == reference


@pytest.mark.parametrize("input_grad", [False, True])
def test_torch_conv2d_backward_flops(torch: Any, input_grad: bool) -> None:
    torch.manual_seed(0)
    n, cin, cout, k, size = 2, 2, 3, 3, 5
    layer = torch.nn.Conv2d(cin, cout, k, padding=1)
    x = torch.ones(n, cin, size, size, requires_grad=input_grad)
    with tracetorch.profile() as prof:
        layer(x).sum().backward()
    node = prof.find("")
    conv = 2 * k * k * cin * cout * size * size * n
    assert node.gemm_flops == conv
    assert node.backward_gemm_flops == conv * (2 if input_grad else 1)
    reference = _flop_counter_total(lambda: layer(x).sum().backward())
    assert node.gemm_flops + node.backward_gemm_flops == reference


def test_torch_training_loop_nodes(torch: Any) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN, 8), torch.nn.ReLU(), torch.nn.Linear(8, OUT))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.ones(ROWS, IN), torch.arange(ROWS) % OUT
    with tracetorch.profile(model, schedule=tracetorch.schedule(warmup=1, active=2,
                                                                repeat=1)) as prof:
        for _ in range(4):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            prof.step()
    assert prof.find("0").calls == 2
    assert prof.find("0").backward_gemm_flops == 2 * 2 * ROWS * IN * 8
    kinds = {node.kind for node in prof.root.children.values()}
    assert {"module", "optimizer"} <= kinds
    assert prof.step_times.count == 2
