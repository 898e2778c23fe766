"""Roofline labels with an injected machine and an injected clock: exact, no timing.

The machine: 1 TFLOP/s, 100 GB/s (ridge 10 FLOP/B), one call costs 5 us. The clock advances a
fixed step per read, so a leaf layer's call takes exactly one step.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np
import pytest

import tracetorch
from tracetorch.analysis.bottlenecks import analyze
from tracetorch.analysis.roofline import layer_bound, time_by_bound
from tracetorch.records.tree import CallNode

MACHINE = tracetorch.Machine(peak_flops=1e12, bandwidth_bytes_per_s=1e11, call_overhead_ns=5_000,
                             source="test machine")
WEIGHTS = 4096 * 4096 * 4 + 4096 * 4  # Linear(4096, 4096) in float32, bias included


def ticks(step: int) -> Callable[[], int]:
    count = itertools.count(0, step)
    return lambda: next(count)


def core_linear(batch: int) -> tuple[Any, Any]:
    from tracetorch.core import Linear, Tensor

    return Linear(4096, 4096), Tensor(np.ones((batch, 4096), dtype=np.float32))


def torch_linear(torch: Any, batch: int, device: str = "cpu") -> tuple[Any, Any]:
    # On the meta device torch computes shapes only: batch 2048 costs nothing to run.
    return (torch.nn.Linear(4096, 4096, device=device),
            torch.ones(batch, 4096, device=device))


def profiled(model: Any, x: Any, step: int, **kwargs: Any) -> tracetorch.profile:
    with tracetorch.profile(model, clock=ticks(step), machine=MACHINE, **kwargs) as prof:
        model(x)
    return prof


# ------------------------------------------------------------------ the rules on exact numbers
def test_weight_loading_at_batch_1_is_memory_bound() -> None:
    moved = WEIGHTS + 2 * 4096 * 4
    b = layer_bound(flops=2 * 4096 * 4096, bytes_moved=moved, time_ns=1_000_000, calls=1,
                    machine=MACHINE, param_bytes=WEIGHTS)
    assert b.bound == "memory-bound"
    assert b.intensity == 2 * 4096 * 4096 / moved
    assert b.predicted_ns == pytest.approx(1e9 * moved / 1e11)       # bytes / bandwidth
    assert b.fraction_of_ceiling == pytest.approx(moved / 1e11 / 1e-3)
    assert b.excess_ns == pytest.approx(1_000_000 - 1e9 * moved / 1e11)
    assert b.ceiling_flops == pytest.approx(1e11 * b.intensity)
    assert b.achieved_flops == pytest.approx(2 * 4096 * 4096 / 1e-3)
    assert b.achieved_bytes == pytest.approx(moved / 1e-3)
    assert b.explanation.startswith("many parameters and few FLOPs: weight loading dominates")


def test_batch_2048_is_compute_bound() -> None:
    flops, moved = 2 * 2048 * 4096 * 4096, WEIGHTS + 2 * 2048 * 4096 * 4
    b = layer_bound(flops=flops, bytes_moved=moved, time_ns=100_000_000, calls=1,
                    machine=MACHINE, param_bytes=WEIGHTS)
    assert b.bound == "compute-bound" and b.ceiling_flops == 1e12
    assert b.predicted_ns == pytest.approx(flops / 1e3)              # flops / peak, in ns
    assert b.fraction_of_ceiling == pytest.approx(flops / 1e12 / 0.1)
    assert b.explanation.startswith("high FLOPs relative to bytes")


def test_a_tiny_layer_is_overhead_bound_only_with_a_measured_call_cost() -> None:
    tiny = dict(flops=32, bytes_moved=112, time_ns=10_000, calls=1, param_bytes=80)
    b = layer_bound(machine=MACHINE, **tiny)
    assert b.bound == "overhead-bound" and b.predicted_ns == pytest.approx(1.12)
    assert b.explanation.startswith("latency out of proportion to its FLOPs: at the roofline "
                                    "a call needs 1.12 ns, less than one call's fixed cost "
                                    "(5.00 us")
    unmeasured = tracetorch.Machine(peak_flops=1e12, bandwidth_bytes_per_s=1e11)
    b = layer_bound(machine=unmeasured, **tiny)
    assert b.bound == "memory-bound"      # no call cost known: the roofline side alone
    assert "out of proportion" in b.explanation  # 0.01% of its ceiling: the guide's third rule


def test_activations_not_weights_can_dominate_the_bytes() -> None:
    b = layer_bound(flops=10**6, bytes_moved=8 * 10**6, time_ns=10**6, calls=1, machine=MACHINE)
    assert b.bound == "memory-bound"
    assert b.explanation.startswith("few FLOPs per byte: reading and writing activations")


@pytest.mark.parametrize("kwargs, argument", [
    ({"calls": 0}, "calls"), ({"time_ns": 0}, "time_ns"), ({"flops": -1}, "flops"),
    ({"bytes_moved": -1}, "bytes_moved")])
def test_bad_layer_numbers_are_named(kwargs: dict[str, Any], argument: str) -> None:
    numbers = dict(flops=1, bytes_moved=1, time_ns=1, calls=1) | kwargs
    with pytest.raises(ValueError, match=f"^{argument}: "):
        layer_bound(machine=MACHINE, **numbers)


# ------------------------------------------------------------------ real profiles, fake clock
def test_core_linear_batch_1_memory_bound() -> None:
    prof = profiled(*core_linear(1), step=1_000_000)
    b = prof.analyze().find("")
    assert (b.bound, b.flops, b.bytes_moved) == ("memory-bound", 2 * 4096 * 4096,
                                                 WEIGHTS + 2 * 4096 * 4)
    assert b.fraction_of_ceiling == pytest.approx((WEIGHTS + 2 * 4096 * 4) / 1e11 / 1e-3)
    assert "weight loading dominates" in b.explanation


def test_core_linear_batch_2048_compute_bound() -> None:
    prof = profiled(*core_linear(2048), step=100_000_000)
    b = prof.analyze().find("")
    assert b.bound == "compute-bound"
    assert b.fraction_of_ceiling == pytest.approx(2 * 2048 * 4096 * 4096 / 1e12 / 0.1)


def test_torch_linear_batch_1_and_2048(torch: Any) -> None:
    small = profiled(*torch_linear(torch, 1), step=1_000_000).analyze().find("")
    assert small.bound == "memory-bound" and small.bytes_moved == WEIGHTS + 2 * 4096 * 4
    large = profiled(*torch_linear(torch, 2048, "meta"), step=100_000_000).analyze().find("")
    assert large.bound == "compute-bound"
    assert (large.flops, large.bytes_moved) == (2 * 2048 * 4096 * 4096,
                                                WEIGHTS + 2 * 2048 * 4096 * 4)


def _stack_of_100(framework: str, torch: Any = None) -> tracetorch.profile:
    if framework == "core":
        from tracetorch.core import Linear, Sequential, Tensor

        model, x = (Sequential(*[Linear(4, 4) for _ in range(100)]),
                    Tensor(np.ones((1, 4), dtype=np.float32)))
    else:
        model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(100)])
        x = torch.ones(1, 4)
    return profiled(model, x, step=10_000)


@pytest.mark.parametrize("framework", ["core", "torch"])
def test_a_stack_of_100_tiny_linears_is_overhead_bound(framework: str, request: Any) -> None:
    torch = request.getfixturevalue("torch") if framework == "torch" else None
    found = _stack_of_100(framework, torch).analyze()
    assert len(found.layers) == 100                   # the Sequential itself is a container
    assert {b.bound for b in found.layers} == {"overhead-bound"}
    assert {(b.flops, b.bytes_moved, b.time_ns) for b in found.layers} == {(32, 112, 10_000)}
    [box] = found.containers
    assert box.type_name == "Sequential" and box.time_ns == 201 * 10_000
    assert box.by_bound == {"compute-bound": 0, "memory-bound": 0, "overhead-bound": 1_000_000}
    assert [b.excess_ns for b in found.look_first] == [pytest.approx(10_000 - 1.12)] * 3


# ------------------------------------------------------------------ which nodes get labels
def _node(parent: CallNode, name: str, flops: int, time_ns: int, moved: int) -> CallNode:
    node = parent.child(name, name.capitalize(), name)
    node.time.add(time_ns)
    node.flops, node.flops_source = flops, "rule"
    node.memory.input_bytes = moved
    return node


def test_a_layer_doing_its_own_matmuls_is_labelled_with_its_children_nested() -> None:
    root = CallNode.root()
    attention = _node(root, "attention", flops=9_000_000, time_ns=500_000, moved=40_000)
    _node(attention, "proj", flops=1_000_000, time_ns=100_000, moved=8_000)
    bounds = analyze(tracetorch.ProfileResult(root), MACHINE).layers
    assert [(b.path, b.nested, b.flops) for b in bounds] == [
        ("attention", False, 10_000_000), ("attention.proj", True, 1_000_000)]
    assert time_by_bound(list(bounds))["compute-bound"] == 500_000  # the outer one only


def test_layers_without_bytes_time_or_flops_are_counted_not_labelled() -> None:
    root = CallNode.root()
    _node(root, "norecord", flops=100, time_ns=1_000, moved=0)
    _node(root, "untimed", flops=100, time_ns=0, moved=100)
    odd = root.child("odd", "Odd", "odd")
    odd.time.add(1_000)
    odd.memory.input_bytes = 10
    found = analyze(tracetorch.ProfileResult(root), MACHINE)
    assert found.layers == ()
    assert found.unlabelled == {"FLOPs unknown": 1, "no bytes recorded": 1,
                                "no time recorded": 1}
    assert "Not labelled: 1 layer (FLOPs unknown)" in str(found)


def test_a_chain_deeper_than_the_recursion_limit_is_labelled() -> None:
    import sys

    root = parent = CallNode.root()
    depth = sys.getrecursionlimit() + 100
    for i in range(depth):
        parent = _node(parent, f"b{i}", flops=0, time_ns=1_000, moved=8)
    _node(parent, "leaf", flops=1_000, time_ns=1_000, moved=8)
    found = analyze(tracetorch.ProfileResult(root), MACHINE)
    assert [b.flops for b in found.layers] == [1_000]   # the containers do none themselves
    assert found.layers[0].path.endswith(f"b{depth - 1}.leaf")


def test_memory_false_leaves_nothing_to_label() -> None:
    prof = profiled(*core_linear(1), step=1_000, memory=False)
    assert prof.analyze().unlabelled == {"no bytes recorded": 1}


# ------------------------------------------------------------------ results and reports
def test_the_machine_is_saved_with_the_profile_and_reports_after_loading(tmp_path: Any) -> None:
    prof = profiled(*core_linear(1), step=1_000_000)
    path = str(tmp_path / "run.json")
    prof.save(path)
    loaded = tracetorch.load(path)
    assert loaded.machine == MACHINE
    assert loaded.analyze().find("") == prof.analyze().find("")
    text = str(loaded)
    assert "Peaks used: peak 1.00 TFLOP/s, bandwidth 100 GB/s, call overhead 5.00 us " \
           "(test machine); ridge 10 FLOP/B" in text
    assert "1. <model> (Linear): memory-bound, 328 us above its ceiling" in text


def test_a_machine_given_after_the_fact() -> None:
    with tracetorch.profile(clock=ticks(1_000_000)) as prof:
        model, x = core_linear(1)
        model(x)
    assert "Bottlenecks" not in str(prof) and prof.machine is None
    with pytest.raises(ValueError, match="^machine: this profile has no machine"):
        prof.analyze()
    [first] = prof.bottlenecks(MACHINE, top=1)
    assert first.bound == "memory-bound"
    report = prof.bottleneck_report(MACHINE)
    assert report.startswith("Bottlenecks (roofline per layer)\nPeaks used: peak 1.00 TFLOP/s")
    with pytest.raises(TypeError, match="^machine: expected a tracetorch.Machine"):
        prof.analyze(machine=5)
    with pytest.raises(ValueError, match="^top: expected a positive int"):
        prof.analyze(MACHINE, top=0)


def test_the_report_table_rows() -> None:
    text = str(profiled(*core_linear(1), step=1_000_000).analyze())
    header = next(line for line in text.splitlines() if line.startswith("Layer"))
    assert header.split() == ["Layer", "Bound", "Calls", "FLOP/B", "Achieved", "Bytes/s", "%",
                              "of", "ceiling", "Time", "Above", "ceiling"]
    row = next(line for line in text.splitlines() if line.startswith("<model> (Linear)"))
    assert row.split()[2:] == ["memory-bound", "1", "0.5", "33.6", "GFLOP/s", "67.2", "GB/s",
                               "67.2%", "1.00", "ms", "328", "us"]
    assert "Time by bound: memory-bound 100.0% (1.00 ms)" in text
