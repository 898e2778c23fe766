"""MFU, HFU and achieved FLOP/s by phase, equal to hand-computed values from injected times."""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import tracetorch
from tracetorch.analysis.utilization import utilization
from tracetorch.records.stats import TimeStats
from tracetorch.records.tree import CallNode
from tracetorch.report.bottleneck import utilization_lines

PEAK = tracetorch.Machine(peak_flops=1e12, bandwidth_bytes_per_s=1e11, source="test peak")
MS = 1_000_000


def training_result(steps: tuple[int, ...] = (10 * MS, 20 * MS, 30 * MS)) -> Any:
    """Three steps: 6 GFLOPs forward and 12 GFLOPs backward per step in all, 2 GFLOPs
    recomputed in backward, 1 GFLOP in the optimizer; forward 10 ms, backward 20 ms,
    optimizer 5 ms, and the steps (data loading included) 60 ms."""
    root = CallNode.root()
    model = root.child("", "Net", "m0")
    model.time.add(10 * MS)
    model.flops, model.backward_flops, model.flops_source = 18 * 10**9, 36 * 10**9, "rule"
    backward = root.child("backward", "backward", "b", kind="backward")
    backward.time.add(20 * MS)
    again = backward.child("block", "Block", "m1", kind="recompute")
    again.time.add(2 * MS)
    again.flops = 6 * 10**9
    sgd = root.child("SGD.step", "SGD", "o", kind="optimizer")
    sgd.time.add(5 * MS)
    sgd.flops = 3 * 10**9
    times = TimeStats(100)
    for ns in steps:
        times.add(ns)
    return tracetorch.ProfileResult(root, step_times=times)


def test_mfu_hfu_and_per_step_values() -> None:
    use = utilization(training_result(), PEAK)
    assert use.model_flops == 54 * 10**9 and use.recompute_flops == 6 * 10**9
    assert (use.time_ns, use.time_source, use.steps) == (60 * MS, "3 steps", 3)
    assert use.mfu == pytest.approx(54e9 / 0.060 / 1e12)            # 90%
    assert use.hfu == pytest.approx(60e9 / 0.060 / 1e12)            # 100%
    # 18 GFLOPs per step; steps of 20 (median), 10 (fastest) and 30 ms (slowest)
    assert use.step_mfu("median") == pytest.approx(18e9 / 0.020 / 1e12)
    assert use.step_mfu("fastest") == pytest.approx(18e9 / 0.010 / 1e12)
    assert use.step_mfu("slowest") == pytest.approx(18e9 / 0.030 / 1e12)
    rates = {p.phase: p.flops_per_s for p in use.phases}
    assert rates == {"forward": pytest.approx(18e9 / 0.010),
                     "backward": pytest.approx(36e9 / 0.020),
                     "optimizer": pytest.approx(3e9 / 0.005)}


def test_without_steps_the_top_level_time_is_used() -> None:
    use = utilization(training_result(steps=()), PEAK)
    assert (use.time_ns, use.time_source) == (35 * MS, "top-level calls")
    assert use.mfu == pytest.approx(54e9 / 0.035 / 1e12)
    assert use.step_mfu() is None


def test_the_utilization_lines_name_the_peak() -> None:
    lines = utilization_lines(utilization(training_result(), PEAK), PEAK)
    assert lines == [
        "Utilization against peak 1.00 TFLOP/s (test peak):",
        "  MFU 90.0%: 54.0 GFLOPs forward + backward in 60.0 ms (3 steps)",
        "  HFU 100.0%: with 6.00 GFLOPs recomputed in backward (activation checkpointing)",
        "  MFU per step: median 90.0% (20.0 ms), fastest 180.0% (10.0 ms), slowest 60.0% "
        "(30.0 ms)",
        "  Achieved: forward 1.80 TFLOP/s, backward 1.80 TFLOP/s, optimizer 600 GFLOP/s"]


def test_no_hfu_without_recompute_and_a_bad_step_name() -> None:
    root = CallNode.root()
    root.child("fc", "Linear", "m0").time.add(MS)
    use = utilization(tracetorch.ProfileResult(root), PEAK)
    assert use.hfu is None and use.mfu == 0.0
    use = utilization(training_result(), PEAK)
    with pytest.raises(ValueError, match="^which: expected one of"):
        use.step_mfu("p99")


def test_a_real_training_loop_with_an_injected_clock(torch: Any) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(8, 16)
    ticks = itertools.count(0, 1_000)
    with tracetorch.profile(model, clock=lambda: next(ticks), machine=PEAK) as prof:
        for _ in range(4):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    use = prof.analyze().utilization
    # SGD's steps: 2 per parameter element (16·32 + 32 + 32 + 1 = 577), 4 steps; MFU leaves
    # them out of the model's FLOPs.
    assert prof.find("SGD.step").flops == 4 * 2 * 577
    model_flops = prof.forward_flops - prof.find("SGD.step").flops + prof.backward_flops
    assert use.model_flops == model_flops and use.steps == 4
    assert use.mfu == pytest.approx(model_flops / (prof.step_times.total_ns / 1e9) / 1e12)
    assert f"MFU {use.mfu:.1%}:" in str(prof)


def test_core_forward_only_mfu() -> None:
    from tracetorch.core import Linear, Tensor

    layer, x = Linear(64, 32), Tensor(np.ones((8, 64), dtype=np.float32))
    ticks = itertools.count(0, 2_000)
    with tracetorch.profile(layer, clock=lambda: next(ticks)) as prof:
        layer(x)
    use = prof.analyze(PEAK).utilization
    assert use.time_ns == 2_000 and use.model_flops == 2 * 8 * 64 * 32
    assert use.mfu == pytest.approx(2 * 8 * 64 * 32 / 2e-6 / 1e12)
