"""Profiles and threads: exits in another thread, every thread under forced switching, and
owners that cannot be weakly referenced."""
from __future__ import annotations

import sys
import threading

import numpy as np

import tracetorch
from tracetorch.core import Linear, ReLU, Sequential, Tensor
from tracetorch.engine.hotpath import current_frame
from tracetorch.engine.patches import BOARD


def test_a_profile_exited_in_another_thread_leaves_nothing_behind():
    model = Sequential(Linear(4, 4))
    x = Tensor(np.ones((2, 4)))
    original = vars(Linear)["forward"]
    prof = tracetorch.profile(model)
    prof.__enter__()
    model(x)
    exiter = threading.Thread(target=prof.__exit__, args=(None, None, None))
    exiter.start()
    exiter.join()
    assert vars(Linear)["forward"] is original
    assert not BOARD.active
    model(x)  # after the exit: must not land in the finished profile
    assert current_frame() is None
    assert prof.find("layers.0").calls == 1
    with prof:  # entered again: the frame left behind in this thread records nothing
        model(x)
    assert prof.find("layers.0").calls == 2
    with tracetorch.profile(model) as fresh:
        model(x)
    assert fresh.find("layers.0").calls == 1


def test_all_threads_counts_every_call_once_under_forced_switching():
    threads, calls_each = 6, 2_000
    model = Sequential(Linear(2, 2), ReLU())
    x = Tensor(np.ones((1, 2)))
    barrier = threading.Barrier(threads)

    def work():
        barrier.wait()
        for _ in range(calls_each):
            model(x)

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with tracetorch.profile(model, all_threads=True) as prof:
            workers = [threading.Thread(target=work) for _ in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
    finally:
        sys.setswitchinterval(previous)
    relus = [n for n in prof.nodes() if n.type_name == "ReLU"]
    assert sum(n.calls for n in relus) == threads * calls_each
    assert sum(n.calls for n in prof.nodes() if n.type_name == "Sequential") == threads * calls_each
    assert prof.forward_flops == threads * calls_each * (2 * 2 * 2 + 2)


class SlotLayer:
    """A duck-typed layer whose instances cannot be weakly referenced."""

    __slots__ = ("weight",)

    def __init__(self) -> None:
        self.weight = np.ones((2, 2))

    def forward(self, x):
        return x @ self.weight

    def __call__(self, x):
        return self.forward(x)


def test_owners_without_weak_references_reuse_their_node_on_every_entry():
    layer = SlotLayer()
    prof = tracetorch.profile(layer, warn_unsupported=False)
    for _ in range(2_000):
        with prof:
            layer(np.ones((1, 2)))
    assert [n.name for n in prof.nodes()] == [""]
    assert prof.root.children[""].calls == 2_000
    assert len(prof._collector.ids._keys) == 1


def test_instrumented_builtin_function_reuses_its_node():
    matmul = tracetorch.instrument(np.matmul)
    prof = tracetorch.profile()
    for _ in range(500):
        with prof:
            matmul(np.ones((2, 2)), np.ones((2, 2)))
    assert len(prof.root.children) == 1
    assert next(iter(prof.root.children.values())).calls == 500
