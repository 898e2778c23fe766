"""Profiles and threads: exits in another thread, every thread under forced switching,
contexts copied inside a call and run elsewhere, and owners that cannot be weakly
referenced."""
from __future__ import annotations

import asyncio
import contextvars
import sys
import threading

import numpy as np
import pytest

import tracetorch
from tracetorch.core import Linear, Module, ReLU, Sequential, Tensor
from tracetorch.engine.hotpath import current_frame
from tracetorch.engine.native import accelerated
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


class Fanout(Module):
    """A layer whose forward runs its ``worker`` layer in a copy of its context, in another
    thread (``asyncio.to_thread`` does the same), while running its own ``local`` layer."""

    def __init__(self, calls: int, use_asyncio: bool = False) -> None:
        super().__init__()
        self.worker = Sequential(Linear(2, 2), ReLU())
        self.local = Sequential(Linear(2, 2), ReLU())
        self.calls = calls
        self.use_asyncio = use_asyncio

    def work(self, x):
        for _ in range(self.calls):
            self.worker(x)

    def forward(self, x):
        if self.use_asyncio:
            async def both():
                task = asyncio.to_thread(self.work, x)
                self.work_locally(x)
                await task
            asyncio.run(both())
            return x
        thread = threading.Thread(target=contextvars.copy_context().run, args=(self.work, x))
        thread.start()
        self.work_locally(x)
        thread.join()
        return x

    def work_locally(self, x):
        for _ in range(self.calls):
            self.local(x)


def paths_and_calls(prof):
    return {node.path: node.calls for node in prof.nodes()}


@pytest.mark.parametrize("use_asyncio", [False, True])
def test_a_context_copied_into_a_thread_records_under_a_call_that_encloses_the_copy(
        use_asyncio):
    # Both threads run nested calls at once under forced switching: each call is recorded
    # exactly once, the caller's under the call whose context was copied, the copy's under
    # that call or, with C, one enclosing it, and the caller's stack is intact after. (The C wrapper
    # keeps nested frames in a cell that only the thread that made it swaps: another thread
    # reads the cell's first frame, the model's call here; the Python wrapper sets the
    # context variable at each call, which the copy holds.)
    model = Sequential(Fanout(calls=300, use_asyncio=use_asyncio), Linear(2, 2))
    x = Tensor(np.ones((1, 2)))
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with tracetorch.profile(model) as prof:
            for _ in range(3):
                model(x)
    finally:
        sys.setswitchinterval(previous)
    assert paths_and_calls(prof) == {
        "": 3, "layers.0": 3,
        "layers.0.worker": 900, "layers.0.worker.layers.0": 900, "layers.0.worker.layers.1": 900,
        "layers.0.local": 900, "layers.0.local.layers.0": 900, "layers.0.local.layers.1": 900,
        "layers.1": 3}
    parents = {node.path: parent.path
               for parent in prof.nodes() for node in parent.children.values()}
    assert parents["layers.0.local"] == "layers.0"
    assert parents["layers.0.worker"] == ("" if accelerated() else "layers.0")
    assert parents["layers.0.worker.layers.0"] == "layers.0.worker"
    assert current_frame() is None


class Failing(Module):
    def forward(self, x):
        raise ValueError("inside")


class Recovering(Module):
    """Calls a layer that raises, then another: the second is its child, not the failed
    one's."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = Failing()
        self.after = Linear(2, 2)

    def forward(self, x):
        try:
            self.failing(x)
        except ValueError:
            pass
        return self.after(x)


def test_a_nested_call_that_raises_gives_its_caller_back_its_frame():
    model = Sequential(Recovering(), ReLU())
    x = Tensor(np.ones((1, 2)))
    with tracetorch.profile(model) as prof:
        for _ in range(4):
            model(x)
    assert paths_and_calls(prof) == {"": 4, "layers.0": 4, "layers.0.failing": 4,
                                     "layers.0.after": 4, "layers.1": 4}
    assert current_frame() is None
