"""Profiles inside profiles, re-entered profiles and decorated functions of every kind: each
call is recorded once in every profile that encloses it."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

import tracetorch
from tracetorch.core import Linear, ReLU, Sequential, Tensor


@pytest.fixture
def model():
    return Sequential(Linear(4, 8), ReLU(), Linear(8, 2))


@pytest.fixture
def x():
    return Tensor(np.ones((3, 4)))


def calls(prof, path="layers.0"):
    return prof.find(path).calls


def test_decorated_step_inside_an_outer_profile_counts_each_call_once(model, x):
    # 0.1.0 handed everything seen so far to the outer profile on every exit: 10 calls read 55.
    @tracetorch.profile(model)
    def train_step():
        model(x)

    with tracetorch.profile(model) as outer:
        for _ in range(10):
            train_step()
    assert calls(outer) == 10
    assert calls(train_step.profile) == 10
    assert train_step.profile.step_count == 10


def test_three_nested_blocks_each_see_every_call_once(model, x):
    outer, middle, inner = (tracetorch.profile(model) for _ in range(3))
    with outer:
        model(x)
        with middle:
            model(x)
            with inner:
                model(x)
    assert (calls(outer), calls(middle), calls(inner)) == (3, 2, 1)
    assert outer.forward_flops == 3 * inner.forward_flops


def test_the_same_profile_entered_twice_in_turn_accumulates(model, x):
    prof = tracetorch.profile(model)
    for _ in range(2):
        with prof:
            model(x)
    assert calls(prof) == 2


def test_a_profile_entered_inside_itself_records_each_call_once(model, x):
    prof = tracetorch.profile(model)
    with prof:
        model(x)
        with prof:
            model(x)
        model(x)
    assert calls(prof) == 3
    assert not prof.running


def test_inner_schedule_steps_in_wait_and_warmup_still_reach_the_outer_profile(model, x):
    inner = tracetorch.profile(model, schedule=tracetorch.schedule(wait=2, warmup=2, active=4))
    with tracetorch.profile(model) as outer:
        with inner:
            for _ in range(8):
                model(x)
                inner.step()
    assert calls(outer) == 8
    assert calls(inner) == 4
    assert inner.step_times.count == 4


def test_isolated_inner_profile_keeps_its_calls(model, x):
    with tracetorch.profile(model) as outer:
        model(x)
        with tracetorch.profile(model, isolated=True) as inner:
            model(x)
    assert (calls(outer), calls(inner)) == (1, 1)


def test_recursive_decorated_function_is_one_step_per_outer_call(model, x):
    @tracetorch.profile(model)
    def run(depth):
        model(x)
        return depth if depth == 0 else run(depth - 1)

    assert run(3) == 0
    assert run(2) == 0
    assert calls(run.profile) == 7
    assert run.profile.step_count == 2


def test_coroutine_function_is_recorded_per_call(model, x):
    @tracetorch.profile(model)
    async def infer():
        await asyncio.sleep(0)
        model(x)
        await asyncio.sleep(0)
        return "done"

    async def main():
        return await asyncio.gather(infer(), infer(), infer())

    assert asyncio.run(main()) == ["done"] * 3
    assert calls(infer.profile) == 3
    assert infer.profile.step_count == 3
    assert not infer.profile.running


def test_generator_function_records_its_own_calls_not_its_consumers(model, x):
    other = Sequential(Linear(4, 4))

    @tracetorch.profile(model)
    def batches(n):
        for _ in range(n):
            yield model(x)

    seen = 0
    for _ in batches(4):
        other(x)  # the consumer's work, between items: not the generator's
        seen += 1
    assert seen == 4
    prof = batches.profile
    assert calls(prof) == 4
    assert prof.step_count == 1
    assert all(node.type_name != "Sequential" or node.calls == 4 for node in prof.nodes())
    assert len([n for n in prof.nodes() if n.type_name == "Linear"]) == 2


def test_generator_closed_early_leaves_the_profile_closed(model, x):
    @tracetorch.profile(model)
    def batches():
        while True:
            yield model(x)

    gen = batches()
    next(gen)
    next(gen)
    gen.close()
    assert not batches.profile.running
    assert calls(batches.profile) == 2


def test_exception_thrown_into_a_profiled_generator_reaches_it(model, x):
    @tracetorch.profile(model)
    def batches():
        try:
            yield model(x)
        except KeyError:
            yield "handled"

    gen = batches()
    next(gen)
    assert gen.throw(KeyError("k")) == "handled"
    gen.close()
    assert not batches.profile.running


def test_async_generators_are_refused_with_a_clear_error():
    async def stream():
        yield 1

    with pytest.raises(TypeError, match="async generator"):
        tracetorch.profile()(stream)


def test_decorating_a_non_callable_is_a_type_error():
    with pytest.raises(TypeError, match="decorates a callable"):
        tracetorch.profile()(42)


DECORATED_SCRIPT = """\
import numpy as np
import tracetorch
from tracetorch.core import Linear, Sequential, Tensor

model = Sequential(Linear(4, 2))

@tracetorch.profile(model)
def train_step():
    model(Tensor(np.ones((1, 4))))

for _ in range(10):
    train_step()
print("inner calls", train_step.profile.find("layers.0").calls)
"""


@pytest.mark.slow
def test_decorated_step_under_tracetorch_run_counts_each_call_once(tmp_path):
    import sys

    from support.processes import run_captured

    script = tmp_path / "train.py"
    script.write_text(DECORATED_SCRIPT)
    done = run_captured([sys.executable, "-m", "tracetorch", "run", "-o", "run.json",
                         str(script)], tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "inner calls 10" in done.stdout
    outer = tracetorch.load(str(tmp_path / "run.json"))
    assert sum(n.calls for n in outer.nodes() if n.type_name == "Linear") == 10
