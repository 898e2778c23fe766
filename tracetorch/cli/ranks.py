"""What the ``tracetorch`` command does differently in a distributed job.

``tracetorch run`` launched by ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set, several ranks) is
one rank of the job: its profile gathers at the end (:func:`run_gather_path` is where the ranks
meet: ``-o`` when given, else a folder in the temporary directory named after the run, which
only ranks of one machine share), rank 0 prints and saves the merged report, the others one
line. ``tracetorch report job.json`` prints a merged profile's ranks under its tree, and
``--rank N`` prints rank N's own profile, read from beside the merged one.

Example:
    >>> run_gather_path("job.json", {}) is None           # not launched as a rank of a job
    True
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping

from tracetorch.distributed.gather import saved_rank_files
from tracetorch.distributed.merged import META_KEY
from tracetorch.distributed.rank import launched_distributed
from tracetorch.records.result import ProfileResult

__all__ = ("run_gather_path", "rank_profile", "ranks_text")


def run_gather_path(output: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """Where the ranks of a ``torchrun`` job meet (``None`` outside one).

    Example:
        >>> env = {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc"}
        >>> run_gather_path(None, env).endswith(os.path.join("tracetorch-abc", "job.json"))
        True
    """
    env = os.environ if environ is None else environ
    if not launched_distributed(env):
        return None
    if output is not None:
        return os.path.abspath(output)
    run = env.get("TORCHELASTIC_RUN_ID") or env.get("MASTER_PORT") or "job"
    folder = os.path.join(tempfile.gettempdir(), f"tracetorch-{run}")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, "job.json")


def rank_profile(merged: ProfileResult, path: str, rank: int) -> ProfileResult:
    """Rank ``rank``'s own profile, of the merged profile saved at ``path``.

    Raises:
        ValueError: ``merged`` is no merged profile, or has no file for that rank.
    """
    files = saved_rank_files(merged, path)
    if not files:
        raise ValueError(f"--rank: {path} is not a merged profile saved with its ranks' files")
    name = files.get(str(rank))
    if name is None:
        raise ValueError(f"--rank: no rank {rank} in {path} (ranks: {', '.join(files)})")
    return ProfileResult.load(name)


def ranks_text(result: ProfileResult) -> str | None:
    """The ranks section of a merged profile's report (``None`` for any other profile)."""
    facts = result.meta.get(META_KEY)
    if not isinstance(facts, dict) or not facts.get("merged"):
        return None
    from tracetorch.report.ranks import render_ranks

    return render_ranks(result)
