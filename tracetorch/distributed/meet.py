"""Ranks agreeing with a deadline, through the process group's store rather than a collective.

A collective that one rank never joins (it raised, was killed, or never entered the profile)
waits until the process group's timeout (half an hour by default) or fails with the backend's
own error. So before anything collective, the ranks *meet* in the group's key-value store:
each says it is ready (or that it failed) and waits, for at most a deadline, for one decision
that every rank reads the same: ``"go"``, set by the last rank to arrive, or a reason to skip,
set by a rank that failed or whose deadline passed first. The store's compare-and-set makes the
first decision the only one, so either every rank goes on to the collective or none does.

The same store agrees on the job's identity (:func:`job_id`): the rank files of one launch
carry it, and a merge refuses files of another.

Example:
    >>> job_id({"TORCHELASTIC_RUN_ID": "5f0c", "TORCHELASTIC_RESTART_COUNT": "1"})
    '5f0c.1'
    >>> job_id({}) is None        # no launcher's run id and no process group
    True
"""
from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from tracetorch.distributed.rank import group_alive

__all__ = ("ENTER_S", "Meeting", "job_id", "meet")

#: Seconds a rank entering ``profile(gather=...)`` waits for the others to align clocks; a rank
#: later than that costs the alignment only (by the first collective instead), never a hang.
ENTER_S = 10.0

#: How many meetings of each kind this process held: the ranks hold them in the same order, so
#: the n-th of a kind has the same keys on every rank.
_HELD: dict[str, int] = {}


class Meeting:
    """The outcome of one meeting: ``go`` (every rank ready) or the ``reason`` to skip."""

    def __init__(self, decision: str, store: Any = None, world: int = 0) -> None:
        self.go = decision == "go"
        self.reason = "" if self.go else decision.removeprefix("skip:")
        self._store, self._world = store, world

    def absent(self) -> list[int]:
        """The ranks that never said they were ready or failed (asked of the store: one round
        trip per rank, so only where a skip is reported)."""
        if self._store is None:
            return []
        try:
            return [r for r in range(self._world) if not self._store.check([f"rank{r}"])]
        except RuntimeError:  # the store's host died meanwhile
            return []


def meet(kind: str, rank: int, world: int, timeout: float, *, failed: bool = False,
         give_up: str | None = None) -> Meeting:
    """Meet the other ranks (every rank calls it, in the same order per ``kind``).

    Args:
        kind: which meeting (``"enter"``, ``"gather"``): counted apart.
        timeout: seconds to wait for the decision.
        failed: this rank failed: decide to skip now, and do not wait.
        give_up: a reason to skip known before waiting (ranks that never entered).
    """
    held = _HELD[kind] = _HELD.get(kind, 0) + 1
    dist = sys.modules["torch.distributed"]
    try:
        store = dist.PrefixStore(f"tracetorch/{kind}{held}", _default_store())
        if failed:
            store.set(f"rank{rank}", "failed")
            return Meeting(_decide(store, f"skip:rank {rank} failed (its profiled block raised)"))
        store.set(f"rank{rank}", "ready")
        if give_up is not None:
            return Meeting(_decide(store, f"skip:{give_up}"), store, world)
        if store.add("ready", 1) >= world:
            _decide(store, "go")
        try:
            store.wait(["decision"], timedelta(seconds=timeout))
        except RuntimeError:  # the deadline passed (or the store went): this rank gives up
            return Meeting(_decide(store, f"skip:not every rank arrived within {timeout:g} s"),
                           store, world)
        return Meeting(store.get("decision").decode(), store, world)
    except RuntimeError as err:  # the store is unreachable: its host rank is gone
        return Meeting(f"skip:the job's store is unreachable ({_first_line(err)})")


def job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The identity of this launch of the job, the same on every rank: the launcher's run id
    (``torchrun`` sets ``TORCHELASTIC_RUN_ID``, a fresh one per standalone launch) with its
    restart count; else one drawn once per launch and agreed through the process group's store;
    else ``None``."""
    env = os.environ if environ is None else environ
    run = env.get("TORCHELASTIC_RUN_ID")
    if run and run != "none":  # "none": torchrun's default --rdzv-id, the same every launch
        return f"{run}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if environ is not None or not group_alive():
        return None
    dist = sys.modules["torch.distributed"]
    try:
        store = dist.PrefixStore("tracetorch", _default_store())
        return str(store.compare_set("job", "", uuid.uuid4().hex).decode())
    except RuntimeError:
        return None


def _default_store() -> Any:
    return sys.modules["torch.distributed"].distributed_c10d._get_default_store()


def _decide(store: Any, decision: str) -> str:
    # The first decision set stays; every rank reads that one.
    return str(store.compare_set("decision", "", decision).decode())


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
