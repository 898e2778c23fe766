"""A scheduled profile holds one step's worth of nodes however many steps run (issue 29).

Warm-up steps, and the steps of a profile opened inside another, are recorded apart from the
profile's tree and then dropped or merged; each such step used to build a tree of its own that
stayed alive until the profile closed (``repeat=0``: for ever). The node counts here are of
every :class:`CallNode` alive, so a tree kept anywhere (the profile, its collector, the nodes
remembered between openings) is counted.
"""
from __future__ import annotations

import gc
import os
from typing import Any, Callable

import numpy as np
import pytest

import tracetorch as tt
from tracetorch.core import Linear, ReLU, Sequential, Tensor
from tracetorch.records.tree import CallNode

torch = (pytest.importorskip("torch") if os.environ.get("CI") != "true"
         else __import__("torch"))

SCHEDULES = [
    tt.schedule(warmup=1, active=1),                    # the case of the issue
    tt.schedule(wait=1, warmup=2, active=1),
    tt.schedule(active=1),
    tt.schedule(wait=2, warmup=1, active=3, repeat=0),
    tt.schedule(wait=1, warmup=1, active=1, repeat=400),
]
FEW, MANY = 50, 2000


def alive_nodes() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is CallNode)


def core_model() -> tuple[Any, Any]:
    model = Sequential(Linear(4, 8), ReLU(), Linear(8, 2))
    return model, Tensor(np.ones((3, 4)))


def active_steps(plan: tt.schedule, steps: int) -> int:
    return sum(plan(step) == "active" for step in range(steps))


def run_with_block(plan: tt.schedule, run: Callable[[], None], steps: int,
                   enclosing: bool = False) -> tuple[int, tt.profile]:
    """Run ``steps`` steps in one ``with`` block; the live nodes at the end, and the profile."""
    outer = tt.profile() if enclosing else None
    if outer is not None:
        outer.__enter__()
    try:
        with tt.profile(schedule=plan) as prof:
            for _ in range(steps):
                run()
                prof.step()
            during = alive_nodes()
    finally:
        if outer is not None:
            outer.__exit__(None, None, None)
    return during, prof


@pytest.mark.parametrize("plan", SCHEDULES, ids=repr)
@pytest.mark.parametrize("enclosing", [False, True], ids=["alone", "nested"])
def test_a_long_scheduled_run_holds_one_steps_nodes(plan: tt.schedule, enclosing: bool) -> None:
    model, x = core_model()
    few = run_with_block(plan, lambda: model(x), FEW, enclosing)[0]  # its profile freed here
    many, prof = run_with_block(plan, lambda: model(x), MANY, enclosing)
    assert many == few
    # Nothing recorded is lost: each active step's call of the model, and no other step's.
    assert prof.find("").calls == active_steps(plan, MANY)
    assert prof.find("layers.0").flops == active_steps(plan, MANY) * 2 * 4 * 8 * 3


@pytest.mark.parametrize("plan", SCHEDULES[:2], ids=repr)
def test_a_decorated_scheduled_step_holds_one_steps_nodes(plan: tt.schedule) -> None:
    # One opening per call: the nodes kept between openings must not pile up either.
    model, x = core_model()

    def run(steps: int) -> tuple[int, tt.profile]:
        prof = tt.profile(schedule=plan)
        step = prof(lambda: model(x))
        for _ in range(steps):
            step()
        return alive_nodes(), prof

    few = run(FEW)[0]
    many, prof = run(MANY)
    assert many == few
    assert prof.find("").calls == active_steps(plan, MANY)


def test_a_torch_training_loop_with_warm_up_holds_one_steps_nodes() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.ones(3, 4)

    def train_step() -> None:
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    plan = tt.schedule(wait=1, warmup=1, active=1)
    few = run_with_block(plan, train_step, 30)[0]
    many, prof = run_with_block(plan, train_step, 600)
    assert many == few
    # 2 * 4 * 8 * 3 forward FLOPs of the first Linear per active step, nothing from warm-ups.
    assert prof.find("0").flops == active_steps(plan, 600) * 2 * 4 * 8 * 3
