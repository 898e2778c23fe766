"""A profile's distributed side: rank facts, the collectives mode, clock alignment, gathering.

A profile opens a :class:`Session` when it is entered in a distributed job: a default process
group is initialized, or a launcher (``torchrun``) set ``RANK`` and ``WORLD_SIZE`` — then
torch may not even be imported yet (``tracetorch run`` under ``torchrun``: the script imports
torch and creates its group inside the profile), and the collectives mode is pushed the moment
it is. Outside such a job no session is opened and nothing here runs.

**Clocks** are aligned once per profile: on entry when the profile gathers at exit
(``profile(gather=...)``), the ranks meeting in the process group's store (:mod:`~.meet`), which
lets them go together; a rank not there within :data:`~.meet.ENTER_S` costs that alignment, not
a hang: the clocks are then aligned at the first collective the ranks complete together (DDP's
initial parameter broadcast, typically), as they are without ``gather``. Compute and collective
time count from there (see :mod:`~tracetorch.distributed.collectives`).

On exit the rank's facts (the job's identity among them: :func:`~.meet.job_id`), compute time and
collectives go to ``prof.meta["distributed"]``; with ``gather=`` set, every rank's profile then
goes to rank 0 (:func:`~.gather.gather_profiles`), whose merged profile is ``prof.merged``; a
block that raised gathers nothing (the other ranks are told not to wait), and a rank that never
entered the profile is not waited for at its exit.

Example:
    >>> wanted({"RANK": "0", "WORLD_SIZE": "1"})       # one process, no process group
    False
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

import wrapt

from tracetorch.distributed.collectives import CollectiveLog
from tracetorch.distributed.meet import ENTER_S, Meeting, job_id, meet
from tracetorch.distributed.merged import META_KEY
from tracetorch.distributed.rank import group_alive, launched_distributed, rank_facts

if TYPE_CHECKING:
    from tracetorch.distributed.mode import CollectiveMode
    from tracetorch.profiler import profile

__all__ = ("DRAIN_S", "Session", "failed", "wanted")

#: Seconds an exit waits for collectives' completions still to arrive.
DRAIN_S = 1.0

#: Sessions waiting for torch to be imported, to push their mode then.
_WAITING: list[Session] = []
_HOOKED = False


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a profile entered now is part of a distributed job."""
    return group_alive() or launched_distributed(environ)


class Session:
    """The distributed side of one profile (kept across its openings)."""

    def __init__(self, gather: bool | str | None, collectives: bool) -> None:
        self.gather = gather
        self.collectives = collectives
        self.log = CollectiveLog()
        self.facts: dict[str, Any] = {}
        self._mode: CollectiveMode | None = None
        self._clock: Callable[[], int] | None = None
        self._thread = 0
        self.job: str | None = None
        self._entry: Meeting | None = None  # how the ranks met on entry, with gather

    def enter(self, prof: profile) -> None:
        """The profile's first entry of an opening: align, push the mode."""
        clock = self._clock = prof._collector.host_clock
        self.facts = rank_facts()
        self._agree_job()
        if self.log.aligned_at is None and self.gather and group_alive():
            self._entry = meet("enter", int(self.facts["rank"]), int(self.facts["world_size"]),
                               ENTER_S)
        if self._entry is not None and self._entry.go and self.log.aligned_at is None:
            self.log.align(clock(), "barrier")  # every rank leaves the meeting together
        else:
            self.log.start(clock())
        if self.collectives:
            self._thread = threading.get_ident()
            if "torch" in sys.modules:
                self.push()
            else:
                _wait_for_import(self)

    def push(self) -> None:
        """Start recording collectives in this thread."""
        from tracetorch.distributed.mode import CollectiveMode

        if self._mode is None and self._clock is not None:
            self._mode = CollectiveMode(self._clock, self.log, on_first=self._group_facts)
            self._mode.push()

    def _group_facts(self) -> None:
        # A group created inside the profile (``tracetorch run``) may be gone by its exit.
        if group_alive():
            self.facts = rank_facts()
            self._agree_job()

    def _agree_job(self) -> None:
        # Once per session, while a group is alive to agree through (or from the launcher).
        if self.job is None:
            self.job = job_id()

    def exit(self, prof: profile, error: BaseException | None = None) -> None:
        """The profile's last exit of an opening: stop, record the facts, gather if asked
        (not if the block raised ``error``: the other ranks are told instead)."""
        if self in _WAITING:
            _WAITING.remove(self)
        if self._mode is not None:
            self._mode.pop()
            self._mode = None
        self.log.drain(DRAIN_S)
        if self._clock is not None:
            self.log.stop(self._clock())
        if group_alive():
            self.facts = rank_facts()
            self._agree_job()
        prof.meta[META_KEY] = {**self.facts, **self.log.facts(), "job": self.job}
        if self.gather:
            from tracetorch.distributed.gather import GATHER_S, gather_without

            path = self.gather if isinstance(self.gather, str) else None
            # A rank that had not entered when this one met the others on entry, and still has
            # not, is outside the profile: not waited for (its collectives were never ours).
            absent = self._entry.absent() if self._entry and not self._entry.go else []
            prof.merged = gather_without(prof, path, None, GATHER_S, failed(error), absent)


def failed(error: BaseException | None) -> bool:
    """Whether a block that ended with ``error`` failed: any exception but a successful
    ``sys.exit()`` (a script under ``tracetorch run`` ending normally).

    Example:
        >>> failed(None), failed(SystemExit(0)), failed(SystemExit(2)), failed(KeyError())
        (False, False, True, True)
    """
    if isinstance(error, SystemExit):
        return error.code not in (None, 0)
    return error is not None


def _wait_for_import(session: Session) -> None:
    global _HOOKED
    _WAITING.append(session)
    if not _HOOKED:  # once per process; does nothing while no session waits
        # On torch, not torch.distributed: torch imports that half-way through its own import.
        wrapt.register_post_import_hook(_imported, "torch")
        _HOOKED = True


def _imported(_module: Any) -> None:
    here = threading.get_ident()
    for session in list(_WAITING):
        if session._thread == here:  # a dispatch mode is per thread: the profile's own
            _WAITING.remove(session)
            session.push()
