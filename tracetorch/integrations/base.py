"""What every training-framework callback does, free of any framework: open a profile of the
model when training starts, mark each optimizer step, close it and report when training ends.

The framework modules (:mod:`~tracetorch.integrations.huggingface`,
:mod:`~tracetorch.integrations.lightning`) only map their framework's events onto
:meth:`ProfilingCallback.start`, :meth:`~ProfilingCallback.step`,
:meth:`~ProfilingCallback.finish` and :meth:`~ProfilingCallback.close`; a training loop of any
other framework with hooks can call them the same way.

The profile is entered in the thread and context that start training (the frameworks call
their callbacks from the training loop itself), so the context variable that routes layer calls
to it stays set for the whole loop, as inside a ``with`` block.

Example:
    >>> import numpy as np
    >>> from tracetorch.core import Linear, Tensor
    >>> model = Linear(4, 2)
    >>> callback = ProfilingCallback(print_report=False)
    >>> callback.start(model)
    >>> for _ in range(3):
    ...     _ = model(Tensor(np.ones((5, 4))))
    ...     callback.step()
    >>> callback.finish().step_count, callback.profile.find("").calls
    (3, 3)
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Union

from tracetorch.cli.ranks import ranks_text
from tracetorch.distributed.merged import META_KEY
from tracetorch.distributed.rank import group_alive
from tracetorch.profiler import profile
from tracetorch.profiler.schedule import schedule as Schedule
from tracetorch.records.result import ProfileResult

__all__ = ("ProfilingCallback",)

PathLike = Union[str, "os.PathLike[str]"]

#: What ``profile`` accepts, less what the callback sets itself.
_PROFILE_OPTIONS = frozenset(inspect.signature(profile).parameters) - {"model", "schedule",
                                                                        "gather"}


class ProfilingCallback:
    """A per-layer profile of one training run, driven by a framework's events.

    Args:
        schedule: which optimizer steps are recorded (a :class:`tracetorch.profiler.schedule`, e.g.
            ``schedule(wait=1, warmup=1, active=5, repeat=1)``); ``None`` records every step.
        print_report: print the report when training ends.
        output: save the profile there as JSON when training ends (``tracetorch.load`` and
            ``tracetorch report`` read it).
        html: also write the HTML report there.
        gather: in a ``torch.distributed`` job: ``None`` (default) merges every rank's profile
            on rank 0 when a process group is initialized as training starts; ``False`` keeps
            each rank's own; ``True`` or a path is passed to ``profile(gather=...)``. Only rank
            0 prints and writes ``output`` and ``html`` (the merged profile when gathered).
        **profile_options: passed to :class:`tracetorch.profile` (``timeline``, ``memory``,
            ``ops``, ``machine``...).

    After training, :attr:`profile` is this process's profile (``profile.merged`` the job's on
    rank 0, when gathered).
    """

    def __init__(self, schedule: Schedule | None = None, *, print_report: bool = True,
                 output: PathLike | None = None, html: PathLike | None = None,
                 gather: bool | str | None = None, **profile_options: Any) -> None:
        if schedule is not None and not isinstance(schedule, Schedule):
            raise TypeError(f"schedule must be a tracetorch.schedule(...) or None, "
                            f"got {schedule!r}")
        unknown = sorted(set(profile_options) - _PROFILE_OPTIONS)
        if unknown:
            raise TypeError(f"profile_options: unknown option(s) {', '.join(unknown)}; the "
                            f"trainer's model is profiled, and tracetorch.profile accepts "
                            f"{', '.join(sorted(_PROFILE_OPTIONS))}")
        for name, path in (("output", output), ("html", html)):
            if path is not None and not isinstance(path, (str, os.PathLike)):
                raise TypeError(f"{name} must be a path or None, got {path!r}")
        if gather is not None and not isinstance(gather, (bool, str)):
            raise TypeError(f"gather must be None, True, False or a path, got {gather!r}")
        self.schedule = schedule
        self.print_report = bool(print_report)
        self.output = output
        self.html = html
        self.gather = gather
        self.profile_options = profile_options
        #: The profile of the latest training run (``None`` before one starts).
        self.profile: profile | None = None
        self._open = False
        # Undo what a framework module installed for one run (its exception guard).
        self._cleanups: list[Callable[[], None]] = []

    def start(self, model: Any) -> None:
        """Training starts: open a fresh profile of ``model`` (one left open is closed first)."""
        self.close()
        gather = group_alive() if self.gather is None else self.gather
        prof = profile(model, schedule=self.schedule, gather=gather, **self.profile_options)
        prof.__enter__()
        self.profile, self._open = prof, True

    def step(self) -> None:
        """An optimizer step ended (no-op outside a run)."""
        if self._open and self.profile is not None:
            self.profile.step()

    def finish(self) -> profile | None:
        """Training ended: close the profile, then print and save the report as configured."""
        prof = self.close()
        if prof is not None:
            self._report(prof)
        return prof

    def close(self, exception: BaseException | None = None) -> profile | None:
        """Close the open profile, restoring every patched layer; ``exception`` is the one
        training raised, if any (recorded as a ``with`` block would). Idempotent; returns the
        profile. Frameworks that skip the end-of-training event when training raises are
        covered by the framework module; call it yourself in a ``finally`` where one is not.
        """
        prof = self.profile
        if not self._open or prof is None:
            return prof
        self._open = False
        try:
            if exception is None:
                prof.__exit__(None, None, None)
            else:
                prof.__exit__(type(exception), exception, exception.__traceback__)
        finally:
            cleanups, self._cleanups = self._cleanups, []
            for cleanup in cleanups:
                cleanup()
        return prof

    @property
    def running(self) -> bool:
        """Whether a training run is being profiled now."""
        return self._open

    def _report(self, prof: profile) -> None:
        if (prof.meta.get(META_KEY) or {}).get("rank", 0) != 0:
            return  # rank 0 reports for the job
        result: ProfileResult = prof.merged if prof.merged is not None else prof
        if self.output is not None:
            result.save(os.fspath(self.output))
        if self.html is not None:
            result.save_html(self.html)
        if self.print_report:
            print(_report_text(result))


def _report_text(result: ProfileResult) -> str:
    # The table, and under a merged profile's table its ranks, as `tracetorch report` prints.
    ranks = ranks_text(result)
    return str(result) if ranks is None else f"{result}\n\n{ranks}"
