"""``profile(clock=...)`` and ``timing=False`` govern the backward times of tracetorch.core."""
from __future__ import annotations

import numpy as np
import pytest

import tracetorch
from support.clocks import TICK, Ticks
from tracetorch.core import Linear, ReLU, Sequential, Tensor, autograd


def _model() -> Sequential:
    return Sequential(Linear(4, 3), ReLU(), Linear(3, 2))


def _train_steps(model: Sequential, steps: int) -> None:
    x = Tensor(np.ones((5, 4), dtype=np.float32))  # no grad: each Linear has matmul and add nodes
    for _ in range(steps):
        model(x).sum().backward()


def test_fake_clock_times_every_gradient_op() -> None:
    model = _model()
    with tracetorch.profile(model, clock=Ticks()) as prof:
        _train_steps(model, steps=2)
    # A graph node's closure is timed by two consecutive reads: exactly one step each. Per pass,
    # a Linear owns two nodes (matmul, bias add) and ReLU one; each pass is one sample.
    expected = {"layers.0": 2 * TICK, "layers.1": TICK, "layers.2": 2 * TICK}
    for path, per_pass in expected.items():
        stats = prof.find(path).backward_time
        assert (stats.count, stats.total_ns, stats.min_ns, stats.max_ns) == (
            2, 2 * per_pass, per_pass, per_pass), path
    assert all(n.time.total_ns % TICK == 0 for n in prof.nodes())


def test_timing_off_gives_zero_backward_time_everywhere() -> None:
    model = _model()
    with tracetorch.profile(model, timing=False) as prof:
        _train_steps(model, steps=2)
    assert prof.backward_flops > 0 and prof.find("layers.0").backward_time.count == 2
    assert all(n.backward_time.total_ns == 0 and n.time.total_ns == 0 for n in prof.nodes())
    assert sum(row.backward_ns for row in prof.by_type().values()) == 0


class _Observer:
    """Records (tag, elapsed) per gradient op; optionally brings its own clock."""

    def __init__(self, clock: Ticks | None) -> None:
        self.clock = clock
        self.clock_tags: list[object] = []
        self.seen: list[tuple[object, str, int]] = []

    def forward_op(self, name: str, flops: int, gemm: bool) -> object:
        return f"{name}-tag"

    def backward_op(self, tag: object, name: str, flops: int, gemm: bool,
                    elapsed_ns: int) -> None:
        self.seen.append((tag, name, elapsed_ns))


class _ClockedObserver(_Observer):
    def backward_clock(self, tag: object) -> Ticks:
        self.clock_tags.append(tag)
        assert self.clock is not None
        return self.clock


@pytest.fixture
def installed():
    installed: list[object] = []

    def install(observer: object) -> None:
        installed.append(autograd.set_op_observer(observer))  # type: ignore[arg-type]

    yield install
    for previous in installed:
        autograd.set_op_observer(previous)  # type: ignore[arg-type]


def test_observer_clock_is_asked_per_node_with_its_tag(installed) -> None:
    observer = _ClockedObserver(Ticks())
    installed(observer)
    w = Tensor(np.ones((3, 2), dtype=np.float32), requires_grad=True)
    (Tensor(np.ones((4, 3), dtype=np.float32)) @ w).sum().backward()
    assert observer.clock_tags == ["sum-tag", "matmul-tag"]
    assert observer.seen == [("sum-tag", "sum", TICK), ("matmul-tag", "matmul", TICK)]


def test_observer_without_clock_gets_host_time(installed) -> None:
    observer = _Observer(clock=None)
    installed(observer)
    w = Tensor(np.ones((3, 2), dtype=np.float32), requires_grad=True)
    (Tensor(np.ones((4, 3), dtype=np.float32)) @ w).sum().backward()
    assert [(tag, name) for tag, name, _ in observer.seen] == [
        ("sum-tag", "sum"), ("matmul-tag", "matmul")]
    assert all(isinstance(ns, int) and ns >= 0 for _, _, ns in observer.seen)
