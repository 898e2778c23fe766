"""The engine on duck-typed models: tree shape, counts, FLOPs, timing, cleanup, concurrency."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import tracetorch
from tracetorch.engine.patches import BOARD


class FakeClock:
    """Advances by ``step`` ns on every reading, so each call's duration is exact."""

    def __init__(self, step: int = 10) -> None:
        self.now = 0
        self.step = step

    def __call__(self) -> int:
        self.now += self.step
        return self.now


class Dense:
    def __init__(self, n_in: int, n_out: int) -> None:
        self.weight = np.ones((n_in, n_out))

    def forward(self, x):
        return x @ self.weight

    def __call__(self, x):
        return self.forward(x)


class Relu:
    def forward(self, x):
        return np.maximum(x, 0)

    def __call__(self, x):
        return self.forward(x)


class Stack:
    def __init__(self) -> None:
        self.layers = [Dense(4, 8), Relu(), Dense(8, 2)]

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __call__(self, x):
        return self.forward(x)


@pytest.fixture
def dense_rules():
    return {Dense: lambda layer, inputs, out: 2 * inputs[0].shape[0] * layer.weight.size,
            Relu: lambda layer, inputs, out: out.size}


def test_tree_shape_calls_and_flops(dense_rules):
    model = Stack()
    with tracetorch.profile(model, flop_rules=dense_rules) as prof:
        for _ in range(3):
            model(np.ones((5, 4)))
    assert [n.path for n in prof.nodes()] == ["", "layers.0", "layers.1", "layers.2"]
    assert [n.calls for n in prof.nodes()] == [3, 3, 3, 3]
    assert prof.find("layers.0").flops == 3 * 2 * 5 * 32
    assert prof.find("layers.0").flops_per_call == 2 * 5 * 32
    assert prof.find("layers.1").flops == 3 * 5 * 8
    assert prof.find("layers.2").flops == 3 * 2 * 5 * 16
    assert prof.find("").flops == 0  # a container owns nothing itself
    assert prof.find("").subtree_flops == prof.forward_flops == 3 * (320 + 40 + 160)
    assert prof.find("layers.0").input_shapes == [((5, 4),)]
    assert prof.find("layers.0").output_shapes == [((5, 8),)]
    assert prof.find("layers.0").params == 32
    assert prof.unsupported == {}


def test_fake_clock_self_and_total_time(dense_rules):
    model = Stack()
    with tracetorch.profile(model, flop_rules=dense_rules, clock=FakeClock(10)) as prof:
        model(np.ones((1, 4)))
    top = prof.find("")
    # Each clock reading advances 10 ns; a leaf spans one reading (10 ns), the parent spans
    # its own two readings plus the six of its three children.
    assert [prof.find(f"layers.{i}").total_ns for i in range(3)] == [10, 10, 10]
    assert top.total_ns == 70
    assert top.self_ns == 40
    for node in prof.nodes():
        assert node.self_ns <= node.total_ns
    assert prof.total_time_ns == 70


def test_unsupported_layer_is_listed_and_warned_once():
    class Mystery:
        def forward(self, x):
            return x

    model = Mystery()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tracetorch.profile(model) as prof:
            for _ in range(4):
                model.forward(np.ones(3))
    assert prof.unsupported == {"Mystery": 4}
    assert sum("no FLOP rule for Mystery" in str(w.message) for w in caught) == 1


class Block:
    def __init__(self, shared: Dense) -> None:
        self.lin = shared

    def forward(self, x):
        return self.lin(x)

    def __call__(self, x):
        return self.forward(x)


class SharedNet:
    def __init__(self) -> None:
        shared = Dense(100, 100)
        self.a, self.b, self.c = Block(shared), Block(shared), Block(shared)

    def forward(self, x):
        return self.c(self.b(self.a(x)))

    def __call__(self, x):
        return self.forward(x)


def test_shared_module_three_call_sites_one_module_row(dense_rules):
    model = SharedNet()
    with tracetorch.profile(model, flop_rules=dense_rules) as prof:
        model(np.ones((1, 100)))
    sites = [n for n in prof.nodes() if n.type_name == "Dense"]
    assert [n.path for n in sites] == ["a.lin", "b.lin", "c.lin"]
    assert [n.flops for n in sites] == [20_000, 20_000, 20_000]
    assert prof.forward_flops == 60_000
    rows = [row for row in prof.by_module().values() if row.type_name == "Dense"]
    assert len(rows) == 1
    assert rows[0].calls == 3 and rows[0].flops == 60_000 and rows[0].params == 10_000
    assert rows[0].paths == ["a.lin", "b.lin", "c.lin"]
    assert prof.by_type()["Dense"].calls == 3


def test_super_forward_and_self_recursion_add_no_levels(dense_rules):
    class Doubling(Dense):
        def forward(self, x):
            return super().forward(x) * 2

    class Countdown:
        def forward(self, x, depth=3):
            return x if depth == 0 else self.forward(x + 1, depth - 1)

    class Pair:
        def __init__(self) -> None:
            self.plain, self.doubling, self.countdown = Dense(2, 2), Doubling(2, 2), Countdown()

        def forward(self, x):
            return self.countdown.forward(self.doubling(self.plain(x)))

    model = Pair()
    rules = {**dense_rules, Countdown: None}
    with tracetorch.profile(model, flop_rules=rules) as prof:
        model.forward(np.ones((1, 2)))
    # Dense.forward and Doubling.forward are both wrapped; super() re-enters the same call.
    assert [(n.path, n.calls) for n in prof.nodes()] == [
        ("", 1), ("plain", 1), ("doubling", 1), ("countdown", 1)]
    assert prof.find("doubling").flops == 8
    assert prof.find("doubling").children == {}


class Boom(Exception):
    pass


def test_exception_propagates_unchanged_everything_restored_and_recorded(dense_rules):
    class Exploding:
        def forward(self, x):
            raise error

    class Net:
        def __init__(self) -> None:
            self.first = Dense(2, 2)
            self.second = Exploding()

        def forward(self, x):
            return self.second(self.first(x))

    error = Boom("bang")
    Exploding.__call__ = lambda self, x: self.forward(x)
    model = Net()
    originals = {cls: vars(cls)["forward"] for cls in (Dense, Exploding, Net)}
    with pytest.raises(Boom) as raised:
        with tracetorch.profile(model, flop_rules=dense_rules) as prof:
            model.forward(np.ones((1, 2)))
    assert raised.value is error
    assert {cls: vars(cls)["forward"] for cls in originals} == originals
    assert all(vars(cls)["forward"] is fn for cls, fn in originals.items())
    assert not BOARD.active and BOARD.patched() == {}
    assert prof.find("first").calls == 1 and prof.find("first").flops == 8
    assert prof.find("second").errors == 1 and prof.find("").errors == 1


def test_inherited_forward_gets_no_copy():
    class Base:
        def forward(self, x):
            return x

    class Child(Base):
        pass

    with tracetorch.profile(Child(), warn_unsupported=False) as prof:
        Child().forward(1)
    assert "forward" not in vars(Child)
    assert vars(Base)["forward"] is Base.__dict__["forward"]
    assert prof.find("Child").calls == 1


def test_calls_after_the_block_are_not_recorded(dense_rules):
    model = Stack()
    with tracetorch.profile(model, flop_rules=dense_rules) as prof:
        model(np.ones((1, 4)))
    model(np.ones((1, 4)))
    assert prof.find("").calls == 1


def test_nested_profiles_each_see_their_own_calls(dense_rules):
    model = Stack()
    with tracetorch.profile(model, flop_rules=dense_rules) as outer:
        model(np.ones((1, 4)))
        with tracetorch.profile(model, flop_rules=dense_rules) as inner:
            model(np.ones((1, 4)))
        model(np.ones((1, 4)))
    assert outer.find("").calls == 3
    assert inner.find("").calls == 1
    assert inner.forward_flops * 3 == outer.forward_flops


def test_two_threads_profile_different_models_at_once(dense_rules):
    barrier = threading.Barrier(2)
    results = {}

    def work(name: str, batch: int) -> None:
        model = Stack()
        with tracetorch.profile(model, flop_rules=dense_rules) as prof:
            barrier.wait()
            for _ in range(50):
                model(np.ones((batch, 4)))
            barrier.wait()
        results[name] = prof

    threads = [threading.Thread(target=work, args=(n, b)) for n, b in (("a", 1), ("b", 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["a"].find("").calls == 50 and results["b"].find("").calls == 50
    assert results["b"].forward_flops == 3 * results["a"].forward_flops
    assert not BOARD.active


def test_other_threads_calls_are_not_recorded(dense_rules):
    model = Stack()
    with tracetorch.profile(model, flop_rules=dense_rules) as prof:
        worker = threading.Thread(target=model, args=(np.ones((1, 4)),))
        worker.start()
        worker.join()
        model(np.ones((1, 4)))
    assert prof.find("").calls == 1


def test_decorator_records_one_step_per_call(dense_rules):
    model = Stack()
    prof = tracetorch.profile(model, flop_rules=dense_rules, clock=FakeClock(10))

    @prof
    def train_step(x):
        return model(x)

    for _ in range(4):
        train_step(np.ones((1, 4)))
    assert prof.step_times.count == 4
    assert prof.find("").calls == 4


def test_schedule_records_only_active_steps(dense_rules):
    model = Stack()
    plan = tracetorch.schedule(wait=1, warmup=1, active=2, repeat=1)
    with tracetorch.profile(model, flop_rules=dense_rules, schedule=plan) as prof:
        for _ in range(6):
            model(np.ones((1, 4)))
            model(np.ones((1, 4)))
            prof.step()
    assert prof.find("").calls == 4
    assert prof.step_times.count == 2


def test_instrumented_function_with_flops():
    @tracetorch.instrument(flops=lambda a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1])
    def gemm(a, b):
        return a @ b

    with tracetorch.profile() as prof:
        gemm(np.ones((2, 3)), np.ones((3, 4)))
        gemm(np.ones((2, 3)), np.ones((3, 4)))
    node = prof.find("test_instrumented_function_with_flops.<locals>.gemm")
    assert node.calls == 2 and node.flops == 96 and node.flops_source == "user"
    assert gemm(np.ones((1, 1)), np.ones((1, 1))).shape == (1, 1)  # works outside too


def test_timeline_events_capped(dense_rules):
    model = Stack()
    with tracetorch.profile(model, flop_rules=dense_rules, timeline=True, max_events=5) as prof:
        for _ in range(3):
            model(np.ones((1, 4)))
    assert len(prof.timeline) == 5
    assert prof.dropped_events == 12 - 5


@pytest.mark.parametrize("kwargs, error", [
    ({"max_events": 0}, ValueError),
    ({"clock": 3}, TypeError),
    ({"flop_rules": [1]}, TypeError),
    ({"schedule": 5}, TypeError),
])
def test_bad_arguments(kwargs, error):
    with pytest.raises(error, match=next(iter(kwargs))):
        tracetorch.profile(**kwargs)


def test_non_model_is_a_type_error():
    with pytest.raises(TypeError, match="model"):
        tracetorch.profile(42)


def test_all_threads_records_other_threads_under_their_own_node(dense_rules):
    model = Stack()
    with tracetorch.profile(model, flop_rules=dense_rules, all_threads=True) as prof:
        worker = threading.Thread(target=model, args=(np.ones((1, 4)),), name="loader")
        worker.start()
        worker.join()
        model(np.ones((1, 4)))
    group = prof.find("thread loader")
    assert group.kind == "thread" and group.children[""].calls == 1
    assert prof.find("").calls == 1  # the profiling thread's own call
    assert prof.forward_flops == 2 * (320 + 40 + 160) // 5
    assert group.total_ns == group.children[""].total_ns
    assert tracetorch.engine.hotpath.all_threads_collector() is None


def test_only_one_profile_may_watch_all_threads(dense_rules):
    model = Stack()
    with tracetorch.profile(model, flop_rules=dense_rules, all_threads=True) as outer:
        with pytest.raises(RuntimeError, match="all threads"):
            with tracetorch.profile(all_threads=True):
                pass
        model(np.ones((1, 4)))  # the refused profile left nothing open in this context
    assert outer.find("").calls == 1
    assert tracetorch.engine.hotpath.current_frame() is None and not BOARD.active


def test_isolated_profile_keeps_its_calls_from_the_enclosing_one(dense_rules):
    model = Stack()
    with tracetorch.profile(model, flop_rules=dense_rules) as outer:
        with tracetorch.profile(model, flop_rules=dense_rules, isolated=True) as inner:
            model(np.ones((1, 4)))
        model(np.ones((1, 4)))
    assert inner.find("").calls == 1 and outer.find("").calls == 1


def test_count_flops_inside_a_profile_does_not_leak_into_it():
    from tracetorch.core import Linear, Tensor

    layer = Linear(4, 4)
    with tracetorch.profile(layer) as prof:
        assert tracetorch.count_flops(layer, (2, 4)) == 64
        layer(Tensor(np.ones((1, 4), dtype=np.float32)))
    assert prof.find("").calls == 1 and prof.forward_flops == 32


def test_step_times_exact_quantiles_survive_a_round_trip(tmp_path):
    ticks = iter(range(0, 10**9, 1000))
    with tracetorch.profile(clock=lambda: next(ticks)) as prof:
        for pause in (1, 2, 3, 4, 10):
            for _ in range(pause):
                prof._collector.clock()  # let the fake clock run: steps of 1..10 ticks
            prof.step()
    expected = float(np.quantile([2000, 3000, 4000, 5000, 11000], 0.9))
    assert prof.step_times.quantile(0.9) == expected
    prof.save(str(tmp_path / "run.json"))
    assert tracetorch.load(str(tmp_path / "run.json")).step_times.quantile(0.9) == expected


def test_sketch_takes_over_past_the_exact_limit():
    from tracetorch.records.stats import TimeStats

    stats = TimeStats(exact_limit=3)
    for ns in (100, 200, 300):
        stats.add(ns)
    assert stats.quantile(0.5) == 200.0
    stats.add(10_000)
    assert stats.quantile(1.0) == 10_000 and stats.quantile(0.5) == pytest.approx(200, rel=0.02)
    assert stats.to_dict()["exact"] is None


class Permissive(Stack):
    """A duck model whose catch-all ``__getattr__`` answers any name (a config-like object):
    ``named_modules``, ``parameters``, ``weight`` all "exist" for ``hasattr``."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: 1


def test_a_duck_model_answering_every_attribute_is_walked_by_what_it_defines(dense_rules):
    model = Permissive()
    with tracetorch.profile(model, flop_rules=dense_rules) as prof:
        model(np.ones((5, 4)))
    assert [n.path for n in prof.nodes()] == ["", "layers.0", "layers.1", "layers.2"]
    assert prof.find("").params == tracetorch.count_parameters(model) == 32 + 16
    assert prof.find("").subtree_flops == 320 + 40 + 160
