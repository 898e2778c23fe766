"""Seeing collectives without replacing anything of torch: a dispatch mode for c10d operations.

Every ``torch.distributed`` collective, those a user calls (``dist.all_reduce``...) and those
DDP's reducer issues from C++ during backward (its bucket all-reduces), goes through torch's
dispatcher as a ``c10d`` operation (``torch.ops.c10d.allreduce_``...). :class:`CollectiveMode`,
a ``TorchDispatchMode`` on the thread's dispatch-mode stack, is handed each of them: it records
the call as a tree node (under the innermost open layer call or backward pass, named as users
know it: ``all_reduce``), its bytes, and its time from issue to the completion of its ``Work``
future (see :mod:`~tracetorch.distributed.collectives` for what that measures on each backend).
Every other operation takes the fast path: one dictionary lookup, then the call.

**Completions are seen by threads of ours**, never by a callback on the future: the backend
runs a future's callbacks on its own worker thread, a Python one needing the GIL there (to run,
and again to be freed after every callback has run), and a waiter such as DDP's reducer resumes
as soon as the future is marked complete, before its callbacks. A teardown that then holds the
GIL while joining the backend's workers (the group's last reference dropped, at the latest when
the interpreter exits) waits for a worker that waits for the GIL: the rank hung, past SIGTERM
(issue 29). So a thread of ours (:class:`_Watcher`) looks at each future until it is done,
sleeping between looks (at most :data:`POLL_MAX_S`), and stamps its completion then: nothing of
ours runs on a backend's thread, and none of our threads sits in torch's C++ wait when the
interpreter exits (a thread woken there by the group's teardown is ended inside C++, which
aborts the process).

**Cost.** A dispatch mode costs every aten operation the Python dispatch round trip, several µs
on CPU (``benchmarks/merge_ranks.py`` prints it), so the mode is pushed only while a profile is
open in a distributed job (a process group is initialized, or a launcher set ``WORLD_SIZE``),
and ``profile(collectives=False)`` keeps it off. It is popped on exit only while it is on top of
the stack; under a user's own mode pushed later it is switched off instead.

Example:
    >>> import torch
    >>> mode = CollectiveMode(lambda: 0)
    >>> with mode:
    ...     _ = torch.ones(2) + 1                 # not a collective: straight through
    >>> mode.log.sites
    {}
"""
from __future__ import annotations

import atexit
import os
import queue
import threading
import time
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from tracetorch.adapters.torch.tracing import tracing
from tracetorch.distributed.collectives import OPS, CollectiveLog
from tracetorch.engine.hotpath import current_frame
from tracetorch.engine.patches import recording_wrapper
from tracetorch.models.tensors import tensor_bytes

__all__ = ("CollectiveMode", "WATCHERS", "POLL_MAX_S")

_Work = torch._C._distributed_c10d.Work if torch.distributed.is_available() else None


#: What the mode knows of one c10d operation: its name, the argument holding its bytes, the
#: wrapper that records its calls as tree nodes and the position of its ``async_op`` argument.
_Spec = tuple[str, Optional[int], Callable[..., Any], Optional[int]]


def _specs() -> dict[Any, _Spec]:
    """Each c10d operation's overload -> its :data:`_Spec`."""
    specs: dict[Any, _Spec] = {}
    for op_name, (label, index) in OPS.items():
        packet = getattr(torch.ops.c10d, op_name, None)
        overload = getattr(packet, "default", None)
        if overload is None:
            continue
        names = [a.name for a in overload._schema.arguments]
        flag = names.index("async_op") if "async_op" in names else None
        wrapper = recording_wrapper(overload, "function", label=label, guard=tracing)
        specs[overload] = (label, index, wrapper, flag)
    return specs


_SPECS: dict[Any, _Spec] = {}


#: The most threads waiting for collectives' futures at once: futures in flight beyond that
#: many wait in a queue, and one completing before the futures ahead of it is stamped late.
WATCHERS = 8


class _Watcher:
    """Daemon threads stamping futures' completions, one thread per future in flight (up to
    :data:`WATCHERS`), started as needed and kept for the next ones; a forked child starts
    afresh, and :meth:`stop` ends them before the interpreter finalizes.

    Example:
        >>> import threading, torch
        >>> future, stamped = torch.futures.Future(), threading.Event()
        >>> _WATCHER.watch(future, stamped.set)
        >>> future.set_result(None)
        >>> stamped.wait(5.0)
        True
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Any, Callable[[], None]] | None] = (
            queue.SimpleQueue())
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._free = 0     # threads not waiting for a future
        self._queued = 0   # futures handed over that no thread has taken yet
        self.stopping = False

    def watch(self, future: Any, done: Callable[[], None]) -> None:
        """Call ``done`` (on a watcher thread) once ``future`` has completed or failed (unless
        the watchers stop first, at the interpreter's exit)."""
        with self._lock:
            if self.stopping:
                return
            self._queued += 1
            if self._queued > self._free and len(self._workers) < WATCHERS:
                worker = threading.Thread(target=self._run, name="tracetorch-collectives",
                                          daemon=True)
                worker.start()
                self._workers.append(worker)
                self._free += 1
        self._queue.put((future, done))

    def stop(self, timeout: float = 2.0) -> None:
        """End every watcher thread (waiting at most ``timeout`` seconds in all); the futures
        still in flight are stamped no more.

        Run at the interpreter's exit (atexit), before it finalizes: a daemon thread found
        inside torch's C++ then (a future's ``done()`` releases the GIL) is ended from inside a
        noexcept destructor, which aborts the process ("terminate called without an active
        exception", a rank of a finished job killed by SIGABRT).
        """
        with self._lock:
            self.stopping = True
            workers = list(self._workers)
        for _ in workers:
            self._queue.put(None)  # (a thread waiting for work takes one and ends)
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, done = item
            with self._lock:
                self._queued -= 1
                self._free -= 1
            if _wait_for(future, self):
                done()
            del item, future, done  # not kept alive while the next one is waited for
            with self._lock:
                self._free += 1


#: The longest pause between two looks at a future in flight (seconds): the most a completion's
#: stamp can be late, beyond the thread's wake-up.
POLL_MAX_S = 100e-6


def _wait_for(future: Any, watcher: _Watcher) -> bool:
    """Whether ``future`` completed (False: ``watcher`` stopped first)."""
    # Looks, then sleeps, rather than Future.wait(): a thread blocked in torch's C++ wait when the
    # interpreter finalizes is woken by the process group's teardown and ended by Python inside
    # C++ (pthread_exit through a noexcept destructor), which aborts the process. A thread in
    # time.sleep is ended cleanly. The pauses start short, for short collectives.
    pause = 5e-6
    while not future.done():
        if watcher.stopping:
            return False
        time.sleep(pause)
        pause = min(2 * pause, POLL_MAX_S)
    return True


_WATCHER = _Watcher()


def _forked() -> None:
    # A forked child has no watcher thread, and its parent's futures are not its own.
    global _WATCHER
    _WATCHER = _Watcher()


def _stop_watching() -> None:
    # (the watcher of this process, a forked child's its own)
    _WATCHER.stop()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
atexit.register(_stop_watching)


def _work_of(output: Any) -> Any:
    if isinstance(output, tuple) and output:
        output = output[-1]
    return output if isinstance(output, torch.ScriptObject) else None


class CollectiveMode(TorchDispatchMode):
    """Records the c10d collectives run while it is on the stack into :attr:`log`, timed with
    ``clock`` (integer nanoseconds)."""

    def __init__(self, clock: Callable[[], int], log: CollectiveLog | None = None,
                 on_first: Callable[[], None] | None = None) -> None:
        super().__init__()
        #: Called at the first collective (the process group surely exists then).
        self.on_first = on_first
        if not _SPECS:
            _SPECS.update(_specs())
        self.clock = clock
        self.log = log if log is not None else CollectiveLog()
        self.on = True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        spec = _SPECS.get(func)
        if spec is None or not self.on:
            return func(*args, **(kwargs or {}))
        return self._collective(spec, args, kwargs or {})

    def _collective(self, spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        label, index, wrapper, flag = spec
        if self.on_first is not None:
            first, self.on_first = self.on_first, None
            first()
        frame = current_frame()
        path = frame.node.path if frame is not None else ""
        nbytes = tensor_bytes(args[index]) if index is not None and index < len(args) else 0
        # async_op defaults to True in every c10d schema; a synchronous caller passes False.
        asynchronous = flag is not None and bool(
            kwargs.get("async_op", args[flag] if flag < len(args) else True))
        log, clock = self.log, self.clock
        issued = clock()
        log.issued(issued, path, label, nbytes, asynchronous)

        def done(_: Any = None) -> None:
            log.completed(path, label, issued, clock())

        try:
            output = wrapper(*args, **kwargs)
        except BaseException:
            done()
            raise
        work = _work_of(output)
        future = None
        if work is not None and _Work is not None:
            try:
                future = _Work.unbox(work).get_future()
            except RuntimeError:  # a backend without futures: complete as it returns
                future = None
        if future is None:
            done()
        else:
            _WATCHER.watch(future, done)
        return output

    def push(self) -> None:
        """Put the mode on this thread's dispatch-mode stack."""
        self.on = True
        self.__enter__()

    def pop(self) -> None:
        """Take the mode off the stack if it is on top; else switch it off where it is (a
        user's mode pushed after it is never moved)."""
        self.on = False
        if _get_current_dispatch_mode() is self:
            self.__exit__(None, None, None)
