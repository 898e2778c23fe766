"""``profile(backward_every=K)``: backward work attributed on one recorded step in K (steps 0, K,
2K...), forward exact on every step, backward totals scaled by steps / sampled steps."""
from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import tracetorch
from support.clocks import TICK, Ticks
from tracetorch.core import Linear, ReLU, Sequential, Tensor


def _core_run(backward_every: int, steps: int) -> tracetorch.profile:
    model = Sequential(Linear(4, 3), ReLU(), Linear(3, 2))
    x = Tensor(np.ones((5, 4), dtype=np.float32))
    with tracetorch.profile(model, clock=Ticks(), backward_every=backward_every) as prof:
        for _ in range(steps):
            model(x).sum().backward()
            prof.step()
    return prof


def _torch_run(torch: ModuleType, backward_every: int, steps: int) -> tracetorch.profile:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.ones(3, 4)
    with tracetorch.profile(model, backward_every=backward_every) as prof:
        for _ in range(steps):
            model(x).sum().backward()
            prof.step()
    return prof


def test_core_layers_get_backward_on_sampled_steps_only_with_an_injected_clock() -> None:
    exact, sampled = _core_run(1, 8), _core_run(4, 8)
    assert sampled.meta["backward_sampling"] == {"every": 4, "steps": 8, "sampled_steps": 2}
    # Per pass, a Linear's two graph nodes (matmul, bias add) are each timed by two consecutive
    # reads (one tick each), ReLU's one: only the sampled steps 0 and 4 are charged.
    for path, per_pass in {"layers.0": 2 * TICK, "layers.1": TICK, "layers.2": 2 * TICK}.items():
        stats = sampled.find(path).backward_time
        assert (stats.count, stats.total_ns) == (2, 2 * per_pass), path
        assert sampled.find(path).backward_flops * 4 == exact.find(path).backward_flops, path
    # Forward and the passes themselves are recorded on every step.
    for node in exact.nodes():
        assert sampled.find(node.path).calls == node.calls
        assert sampled.find(node.path).flops == node.flops or node.kind == "backward"
    assert sampled.step_phases["backward"].count == 8
    # The totals are scaled to all steps: 8 steps / 2 sampled, exact here.
    assert sampled.backward_flops == exact.backward_flops > 0
    assert sampled.backward_gemm_flops == exact.backward_gemm_flops
    assert sampled.total_flops == exact.total_flops
    assert "backward_sampling" not in exact.meta  # exact: nothing changes


def test_torch_backward_flops_scaled_equal_the_exact_run(torch: ModuleType) -> None:
    exact, sampled = _torch_run(torch, 1, 8), _torch_run(torch, 4, 8)
    # Per step (batch 3): Linear(4, 8) weight gradient 2*3*4*8 = 192 (its input needs none),
    # Linear(8, 2) weight 2*3*8*2 = 96 and input 2*3*2*8 = 96: 384 FLOPs a step, 3,072 in 8.
    assert exact.backward_flops == 8 * 384 == 3_072
    assert sampled.backward_flops == 3_072 and sampled.total_flops == exact.total_flops
    assert sampled.find("0").backward_flops == 2 * 192  # steps 0 and 4
    assert sampled.find("0").backward_time.count == 2
    assert sampled.find("backward").calls == 8  # every pass is timed
    assert sampled.forward_flops == exact.forward_flops


def test_uneven_steps_scale_by_steps_over_sampled_steps(torch: ModuleType) -> None:
    # 10 steps, 1 in 4: steps 0, 4 and 8 sampled; 3 * 384 * 10 // 3.
    prof = _torch_run(torch, 4, 10)
    assert prof.meta["backward_sampling"] == {"every": 4, "steps": 10, "sampled_steps": 3}
    assert prof.root.subtree_sum("backward_flops") == 3 * 384
    assert prof.backward_flops == 10 * 384


def test_a_block_without_steps_is_one_sampled_step(torch: ModuleType) -> None:
    model = torch.nn.Linear(4, 8)
    with tracetorch.profile(model, backward_every=8) as prof:
        model(torch.ones(3, 4)).sum().backward()
    assert prof.meta["backward_sampling"] == {"every": 8, "steps": 1, "sampled_steps": 1}
    assert prof.backward_flops == 2 * 3 * 4 * 8  # the weight's gradient


def test_outputs_are_marked_on_sampled_steps_only(torch: ModuleType) -> None:
    from tracetorch.adapters.torch.backward import MARKS

    class Product(torch.nn.Module):  # no FLOP rule: its matmul is marked by the op counter
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4, 4))

        def forward(self, x: Any) -> Any:
            return x @ self.w

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Product())
    marked: list[tuple[bool, bool]] = []
    with tracetorch.profile(model, backward_every=3) as prof:
        for _ in range(7):
            hidden = model[0](torch.ones(2, 4))
            out = model[1](hidden)
            marked.append((MARKS in hidden.grad_fn.metadata, MARKS in out.grad_fn.metadata))
            out.sum().backward()
            prof.step()
    assert marked == [(step % 3 == 0,) * 2 for step in range(7)]
    # (2, 4) @ (4, 4) gradients: 2*2*4*4 = 64 for x, 64 for w; Linear(4, 4)'s weight 64.
    assert prof.root.subtree_sum("backward_flops") == 3 * (64 + 128)


def test_sampling_leaves_the_framework_gate_alone(torch: ModuleType) -> None:
    # Skipping is the collector's flag, read by the wrapper: the observer and its gate (torch's
    # grad mode) stay what torch installed, on every step.
    from tracetorch.engine import hotpath

    model = torch.nn.Linear(4, 4)
    with tracetorch.profile(model, backward_every=2) as prof:
        gates = []
        for _ in range(3):
            gates.append((hotpath._observe_now, prof._collector.backward_on))
            model(torch.ones(2, 4)).sum().backward()
            prof.step()
    assert gates == [(torch.is_grad_enabled, True), (torch.is_grad_enabled, False),
                     (torch.is_grad_enabled, True)]
    assert hotpath._observe_now is not torch.is_grad_enabled  # back to no observer at all


def test_the_sampling_line_and_a_json_round_trip(torch: ModuleType, tmp_path: Path) -> None:
    prof = _torch_run(torch, 4, 8)
    line = "sampled 1 step in 4 (2 of 8 steps)"
    assert line in str(prof)
    path = tmp_path / "run.json"
    prof.save(str(path))
    assert json.loads(path.read_text())["meta"]["backward_sampling"]["sampled_steps"] == 2
    loaded = tracetorch.load(str(path))
    assert loaded.backward_flops == prof.backward_flops == 3_072
    assert loaded.total_flops == prof.total_flops
    assert line in str(loaded)
    assert loaded.find("0").backward_flops == prof.find("0").backward_flops == 384
    html = tmp_path / "run.html"
    prof.save_html(str(html))
    assert line in html.read_text()


@pytest.mark.parametrize("value, error", [(0, ValueError), (-2, ValueError), (2.0, TypeError),
                                          (True, TypeError), ("8", TypeError), (None, TypeError)])
def test_bad_backward_every_is_refused(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="backward_every"):
        tracetorch.profile(backward_every=value)


def test_mfu_counts_the_scaled_backward_flops(torch: ModuleType) -> None:
    from tracetorch.analysis.machine import Machine
    from tracetorch.analysis.utilization import utilization

    machine = Machine(1e12, 1e11)
    exact, sampled = _torch_run(torch, 1, 8), _torch_run(torch, 4, 8)
    assert utilization(sampled, machine).model_flops == utilization(exact, machine).model_flops


def test_a_schedule_samples_among_its_active_steps(torch: ModuleType) -> None:
    model = torch.nn.Linear(4, 8)
    every = tracetorch.schedule(wait=1, warmup=1, active=4, repeat=1)
    with tracetorch.profile(model, schedule=every, backward_every=2) as prof:
        for _ in range(8):  # wait, warmup, 4 active (the 1st and 3rd sampled), done, done
            model(torch.ones(3, 4)).sum().backward()
            prof.step()
    assert prof.meta["backward_sampling"] == {"every": 2, "steps": 4, "sampled_steps": 2}
    weight = 2 * 3 * 4 * 8  # the weight's gradient per step
    assert prof.find("").backward_flops == 2 * weight and prof.backward_flops == 4 * weight


def test_the_innermost_profile_decides_what_is_marked(torch: ModuleType) -> None:
    model = torch.nn.Linear(4, 8)
    weight = 2 * 3 * 4 * 8
    with tracetorch.profile(model) as outer:
        with tracetorch.profile(model, backward_every=2) as inner:
            for _ in range(4):
                model(torch.ones(3, 4)).sum().backward()
                inner.step()
        with tracetorch.profile(model, backward_every=2) as stepped_once:
            stepped_once.step()  # its step 1 skips; one exact profile inside it marks again
            with tracetorch.profile(model) as innermost:
                model(torch.ones(3, 4)).sum().backward()
    assert inner.backward_flops == 4 * weight and inner.find("").backward_flops == 2 * weight
    assert innermost.backward_flops == weight
    assert outer.find("").calls == 5


def test_core_timeline_keeps_the_sampled_steps_backward_spans() -> None:
    model = Sequential(Linear(4, 3), ReLU(), Linear(3, 2))
    x = Tensor(np.ones((5, 4), dtype=np.float32))
    spans = []
    for every in (1, 4):
        with tracetorch.profile(model, timeline=True, backward_every=every) as prof:
            for _ in range(8):
                model(x).sum().backward()
                prof.step()
        spans.append(len(prof.backward_timeline))
    assert spans[0] == 4 * spans[1] > 0  # steps 0 and 4 of 8
