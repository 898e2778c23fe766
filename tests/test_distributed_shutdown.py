"""Issue 29 (a rank hung at shutdown): nothing of tracetorch runs on a c10d backend's thread.

gloo runs a ``Work`` future's callbacks on its worker thread, a Python callback taking the GIL
there (to run, and again to be freed), and DDP's reducer resumes once the future is marked
complete, before its callbacks have run; a teardown that then holds the GIL while joining the
backend's workers (the process group's last reference dropped, at the latest at interpreter
exit) waits for the worker, which waits for the GIL: the rank hung, past SIGTERM. Whether a run
hangs depends on how the threads are scheduled (2 of 3 on a loaded machine, none of 25 on a
quieter one), so these tests check its cause instead, which is deterministic: the thread that
records each collective's completion is never one that Python did not start (a backend's worker
shows up as a ``threading._DummyThread``).
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture
def group(torch: ModuleType) -> Any:
    """A one-rank gloo process group for the test (the gloo worker threads are real)."""
    dist = torch.distributed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def completing_threads(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """The thread of each collective's completion, as a collective log records it."""
    from tracetorch.distributed.collectives import CollectiveLog

    threads: list[threading.Thread] = []
    completed = CollectiveLog.completed

    def seen(self: CollectiveLog, *args: Any) -> None:
        threads.append(threading.current_thread())
        completed(self, *args)

    monkeypatch.setattr(CollectiveLog, "completed", seen)
    return threads


def _foreign(threads: list[threading.Thread]) -> list[str]:
    return [t.name for t in threads if isinstance(t, threading._DummyThread)]


def test_asynchronous_collectives_complete_on_a_thread_of_ours(torch, group, completing_threads):
    from tracetorch.distributed.collectives import CollectiveLog
    from tracetorch.distributed.mode import CollectiveMode

    log = CollectiveLog()
    with CollectiveMode(time.perf_counter_ns, log):
        # 4 MiB each: gloo completes them on its worker well after they are issued.
        works = [group.all_reduce(torch.ones(1 << 20), async_op=True) for _ in range(5)]
        for work in works:
            work.wait()
    assert log.drain(60)
    assert len(completing_threads) == 5 and _foreign(completing_threads) == []
    (site,) = log.facts()["collectives"]
    assert (site["op"], site["calls"], site["async_calls"]) == ("all_reduce", 5, 5)
    assert site["time"]["count"] == 5 and site["time"]["min_ns"] > 0


def test_ddp_torn_down_inside_a_profile_completes_on_a_thread_of_ours(torch, group,
                                                                      completing_threads):
    import tracetorch as tt

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    with tt.profile(model) as prof:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for _ in range(3):
            ddp(torch.randn(16, 32)).square().mean().backward()
        group.destroy_process_group()  # as examples/ddp_train.py does, inside the block
        del ddp
    assert completing_threads and _foreign(completing_threads) == []
    sites = {site["op"]: site for site in prof.meta["distributed"]["collectives"]}
    assert sites["all_reduce"]["calls"] == sites["all_reduce"]["time"]["count"] == 3


def test_a_collective_completing_first_is_stamped_without_waiting_for_earlier_ones(torch):
    from tracetorch.distributed.mode import _WATCHER, WATCHERS

    first, second = torch.futures.Future(), torch.futures.Future()
    stamped: list[str] = []
    first_done, second_done = threading.Event(), threading.Event()
    _WATCHER.watch(first, lambda: (stamped.append("first"), first_done.set()))
    _WATCHER.watch(second, lambda: (stamped.append("second"), second_done.set()))
    second.set_result(None)  # an all-reduce of a later bucket, done before an earlier one
    assert second_done.wait(30) and stamped == ["second"]
    first.set_result(None)
    assert first_done.wait(30) and stamped == ["second", "first"]
    for _ in range(20):  # one at a time: the threads already started take them
        future, done = torch.futures.Future(), threading.Event()
        _WATCHER.watch(future, done.set)
        future.set_result(None)
        assert done.wait(30)
    watchers = [t for t in threading.enumerate() if t.name == "tracetorch-collectives"]
    assert 2 <= len(watchers) <= WATCHERS


def test_the_watchers_end_before_the_interpreter_finalizes(torch):
    # Run at exit (atexit): a daemon thread found inside torch's C++ (a future's done(), which
    # releases the GIL) when the interpreter finalizes is ended inside a noexcept destructor,
    # and the rank aborts (SIGABRT, "terminate called without an active exception").
    from tracetorch.distributed.mode import _Watcher

    watcher, stamped = _Watcher(), []
    pending, finished, done = torch.futures.Future(), torch.futures.Future(), threading.Event()
    watcher.watch(pending, lambda: stamped.append("pending"))  # never completes before the stop
    watcher.watch(finished, done.set)
    finished.set_result(None)
    assert done.wait(30)
    watcher.stop(timeout=30)
    assert watcher._workers and not any(worker.is_alive() for worker in watcher._workers)
    pending.set_result(None)
    watcher.watch(torch.futures.Future(), lambda: stamped.append("late"))  # stopped: ignored
    assert stamped == [] and not any(worker.is_alive() for worker in watcher._workers)


@pytest.mark.slow
def test_the_processs_watcher_is_stopped_at_its_exit(torch_installed):
    script = ("import tracetorch.distributed.mode as mode\n"
              "mode._WATCHER.stop = lambda timeout=2.0: print('stopped at exit')\n")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert (ran.returncode, ran.stdout) == (0, "stopped at exit\n"), ran.stderr


def test_an_object_gather_leaves_each_of_its_tensors_to_the_calling_thread(group, monkeypatch):
    # gloo's worker destroying a gather's work dropped the last reference to its Python
    # tensors, taking the GIL on its own thread: during the interpreter's exit, an abort.
    from tracetorch.distributed import objects

    counts: list[list[int]] = []
    let_go = objects._let_go

    def checked(tensors):
        let_go(tensors)
        counts.append([tensor._use_count() for tensor in tensors])

    monkeypatch.setattr(objects, "_let_go", checked)
    payload = {"rank": 0, "tree": [{"path": "0", "calls": 3}] * 50}
    for _ in range(20):
        assert objects.gather_objects(payload, 0, 1) == [payload]
    # each gather's tensors: the payload, its size, the sizes and received payloads of the one
    # rank, the padded payload
    assert counts and all(count == [1] * 5 for count in counts)
    assert objects._STILL_HELD == []


def test_the_calling_thread_waits_until_the_backend_lets_go(torch):
    from tracetorch.distributed import objects

    tensor = torch.zeros(3)
    backend = [tensor.view(3)]  # a reference another thread drops a moment later
    dropping = threading.Timer(0.05, backend.clear)
    dropping.start()
    began = time.monotonic()
    objects._let_go([tensor])
    waited = time.monotonic() - began
    dropping.join()
    assert tensor._use_count() == 1 and waited >= 0.04 and objects._STILL_HELD == []


def test_a_tensor_the_backend_keeps_holding_is_kept_for_good(monkeypatch, torch):
    from tracetorch.distributed import objects

    monkeypatch.setattr(objects, "LET_GO_S", 0.01)
    monkeypatch.setattr(objects, "_STILL_HELD", [])
    free, held = torch.zeros(3), torch.zeros(3)
    holder = held.view(3)  # another reference to it: "the backend's", never dropped
    objects._let_go([free, held])
    assert objects._STILL_HELD == [held] and holder is not None
