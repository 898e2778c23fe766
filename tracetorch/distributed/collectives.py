"""What one rank records of its collectives: per site bytes and times, and its compute time.

**What is timed.** A collective is timed from its issue (the c10d operation is called) to its
completion as torch lets the host see it: the moment the operation's ``Work`` future completes
(for gloo, when the data has arrived; a synchronous call waits for it before returning). With
NCCL the future completes when the operation is enqueued on the GPU stream, so the time is the
host's share, a lower bound of the transfer. DDP's bucket all-reduces are issued from C++ during
backward and waited for at its end: each is timed from issue to completion too.

**Bytes** follow nccl-tests: the tensor of ``all_reduce``, ``broadcast``, ``reduce``, ``send``
and ``recv``; the whole output of ``all_gather``; the whole input of ``reduce_scatter`` and
``all_to_all``; nothing for barriers. Achieved bandwidth (``algbw``) is bytes / time; bus
bandwidth (``busbw``) multiplies it by :func:`bus_factor` (``2(n-1)/n`` for ``all_reduce``,
``(n-1)/n`` for ``all_gather``, ``reduce_scatter`` and ``all_to_all``, 1 otherwise), the
figure comparable with a link's speed.

**Compute time** is the time with no collective in flight, from the moment the ranks' clocks
are aligned (:meth:`CollectiveLog.align`) to the end of the profile: on a rank the others wait
for, it is long; on a rank that waits, short (its waiting is time a collective is in flight).
The straggler analysis (:mod:`tracetorch.distributed.straggler`) compares it across ranks.

Example:
    >>> log = CollectiveLog()
    >>> log.align(0, "barrier")
    >>> log.issued(100, "backward", "all_reduce", 4096)  # 100 ns of compute, then an all-reduce
    >>> log.completed("backward", "all_reduce", 100, 150)
    >>> log.stop(400)                         # 250 ns more compute
    >>> facts = log.facts()
    >>> facts["compute_ns"], facts["collective_ns"], facts["collectives"][0]["bytes"]
    (350, 50, 4096)
"""
from __future__ import annotations

import threading
from typing import Any

from tracetorch.records.stats import TimeStats

__all__ = ("CollectiveLog", "OPS", "bus_factor")

#: c10d operation -> (the name users know it by, the positional argument holding the tensors
#: whose sizes are its bytes, ``None`` for none).
OPS: dict[str, tuple[str, int | None]] = {
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce_coalesced", 0),
    "allgather_": ("all_gather", 0),
    "_allgather_base_": ("all_gather_into_tensor", 0),
    "allgather_coalesced_": ("all_gather_coalesced", 0),
    "allgather_into_tensor_coalesced_": ("all_gather_into_tensor_coalesced", 0),
    "reduce_scatter_": ("reduce_scatter", 1),
    "_reduce_scatter_base_": ("reduce_scatter_tensor", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor_coalesced", 1),
    "broadcast_": ("broadcast", 0),
    "reduce_": ("reduce", 0),
    "gather_": ("gather", 1),
    "scatter_": ("scatter", 0),
    "alltoall_": ("all_to_all", 1),
    "alltoall_base_": ("all_to_all_single", 1),
    "send": ("send", 0),
    "recv_": ("recv", 0),
    "recv_any_source_": ("recv", 0),
    "barrier": ("barrier", None),
    "monitored_barrier_": ("monitored_barrier", None),
}

_ALL_REDUCE = ("all_reduce", "all_reduce_coalesced")
_SHARED = ("all_gather", "all_gather_into_tensor", "all_gather_coalesced",
           "all_gather_into_tensor_coalesced", "reduce_scatter", "reduce_scatter_tensor",
           "reduce_scatter_tensor_coalesced", "all_to_all", "all_to_all_single")


def bus_factor(op: str, world_size: int) -> float:
    """What algorithm bandwidth is multiplied by to give bus bandwidth (nccl-tests' factors).

    Example:
        >>> bus_factor("all_reduce", 4), bus_factor("all_gather", 4), bus_factor("broadcast", 4)
        (1.5, 0.75, 1.0)
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size!r}")
    if op in _ALL_REDUCE:
        return 2 * (world_size - 1) / world_size
    if op in _SHARED:
        return (world_size - 1) / world_size
    return 1.0


class _Site:
    __slots__ = ("calls", "bytes", "async_calls", "time")

    def __init__(self) -> None:
        self.calls = self.bytes = self.async_calls = 0
        self.time = TimeStats()


class CollectiveLog:
    """One rank's collectives (per call path and operation) and its compute/collective split.

    Thread-safe: completions arrive on the collectives mode's watcher thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.sites: dict[tuple[str, str], _Site] = {}
        self.aligned_at: int | None = None
        self.aligned_by = "none"
        self.compute_ns = self.collective_ns = self.elapsed_ns = 0
        self._in_flight = 0
        self._idle_since: int | None = None  # compute runs since then (aligned, none in flight)
        self._busy_since: int | None = None  # a collective has been in flight since then
        self._open_since: int | None = None  # the profile has been open since then (aligned)

    def align(self, now: int, how: str) -> None:
        """The ranks' clocks agree at ``now`` (a barrier's end, ``how`` says which): counting
        compute and collective time starts here."""
        with self._lock:
            self.aligned_at, self.aligned_by = now, how
            self._open(now)

    def start(self, now: int) -> None:
        """The profile is entered again: compute counts from ``now`` (once aligned)."""
        with self._lock:
            if self.aligned_at is not None:
                self._open(now)

    def _open(self, now: int) -> None:
        # The profile is open (and the clocks aligned) from ``now``; compute runs from then
        # unless a collective is in flight. Called with the lock held.
        self._open_since = now
        if self._in_flight == 0:
            self._idle_since = now

    def stop(self, now: int) -> None:
        """The profile is exited: close the open compute span."""
        with self._lock:
            if self._idle_since is not None:
                self.compute_ns += max(0, now - self._idle_since)
                self._idle_since = None
            if self._open_since is not None:
                self.elapsed_ns += max(0, now - self._open_since)
                self._open_since = None

    def issued(self, now: int, path: str = "", op: str = "", nbytes: int = 0,
               asynchronous: bool = False) -> None:
        """A collective ``op`` of ``nbytes`` was issued at ``now`` under call path ``path``
        (counted now: its completion may be seen later, on another thread)."""
        with self._lock:
            if op:
                site = self.sites.get((path, op))
                if site is None:
                    site = self.sites[(path, op)] = _Site()
                site.calls += 1
                site.bytes += int(nbytes)
                site.async_calls += int(asynchronous)
            if self._in_flight == 0:
                if self._idle_since is not None:
                    self.compute_ns += max(0, now - self._idle_since)
                    self._idle_since = None
                self._busy_since = now if self.aligned_at is not None else None
            self._in_flight += 1

    def completed(self, path: str, op: str, issued_ns: int, done_ns: int) -> None:
        """The collective ``op`` issued at ``issued_ns`` under call path ``path`` completed at
        ``done_ns``; the first completion aligns the clocks if nothing did before."""
        with self._lock:
            site = self.sites.get((path, op))
            if site is not None:
                site.time.add(max(0, done_ns - issued_ns))
            self._in_flight = max(0, self._in_flight - 1)
            if self._in_flight:
                return
            self._lock.notify_all()
            if self._busy_since is not None:
                self.collective_ns += max(0, done_ns - self._busy_since)
                self._busy_since = None
            if self.aligned_at is None:
                self.aligned_at, self.aligned_by = done_ns, "first collective"
                self._open(done_ns)
            elif self._open_since is not None:
                self._idle_since = done_ns

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the completions still to be seen (the mode's
        watcher may stamp one just after its waiter has returned); whether none is left."""
        with self._lock:
            return self._lock.wait_for(lambda: self._in_flight == 0, timeout)

    def facts(self) -> dict[str, Any]:
        """The JSON-ready record a rank's ``meta["distributed"]`` holds."""
        with self._lock:
            sites = [{"path": path, "op": op, "calls": s.calls, "bytes": s.bytes,
                      "async_calls": s.async_calls, "time": s.time.to_dict()}
                     for (path, op), s in sorted(self.sites.items())]
            return {"aligned_by": self.aligned_by, "aligned_at_ns": self.aligned_at,
                    "compute_ns": self.compute_ns,
                    "collective_ns": self.collective_ns, "elapsed_ns": self.elapsed_ns,
                    "collectives": sites}
