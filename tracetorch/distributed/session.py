"""A profile's distributed side: rank facts, the collectives mode, clock alignment, gathering.

A profile opens a :class:`Session` when it is entered in a distributed job: a default process
group is initialized, or a launcher (``torchrun``) set ``RANK`` and ``WORLD_SIZE`` — then
torch may not even be imported yet (``tracetorch run`` under ``torchrun``: the script imports
torch and creates its group inside the profile), and the collectives mode is pushed the moment
it is. Outside such a job no session is opened and nothing here runs.

**Clocks** are aligned once per profile: by a barrier on entry when the profile gathers at exit
(``profile(gather=...)``: every rank enters it, so the barrier cannot hang), else at the first
collective the ranks complete together (DDP's initial parameter broadcast, typically). Compute
and collective time count from there (see :mod:`~tracetorch.distributed.collectives`).

On exit the rank's facts, compute time and collectives go to ``prof.meta["distributed"]``; with
``gather=`` set, every rank's profile then goes to rank 0 (:func:`~.gather.gather_profiles`),
whose merged profile is ``prof.merged``.

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
from tracetorch.distributed.merge import META_KEY
from tracetorch.distributed.rank import group_alive, launched_distributed, rank_facts

if TYPE_CHECKING:
    from tracetorch.distributed.mode import CollectiveMode
    from tracetorch.profiler import profile

__all__ = ("DRAIN_S", "Session", "wanted")

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

    def enter(self, prof: profile) -> None:
        """The profile's first entry of an opening: align, push the mode."""
        clock = self._clock = prof._collector.host_clock
        self.facts = rank_facts()
        if self.log.aligned_at is None and self.gather and group_alive():
            sys.modules["torch.distributed"].barrier()
            self.log.align(clock(), "barrier")
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

    def exit(self, prof: profile) -> None:
        """The profile's last exit of an opening: stop, record the facts, gather if asked."""
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
        prof.meta[META_KEY] = {**self.facts, **self.log.facts()}
        if self.gather:
            from tracetorch.distributed.gather import gather_profiles

            path = self.gather if isinstance(self.gather, str) else None
            prof.merged = gather_profiles(prof, path)


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
