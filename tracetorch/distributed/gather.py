"""Every rank's profile to rank 0, over the job's own process group or through shared files.

Each rank contributes its profile as the versioned dict of :mod:`tracetorch.records.jsonio`
(its timeline left out: merging does not read it). With a process group alive they travel by
a gather to rank 0 (:mod:`~.objects`), which folds them into a :class:`~.merge.RankMerge` one
at a time; with ``tree=True`` (the default beyond :data:`TREE_FROM` ranks) they are reduced up a
binomial tree instead, each rank merging its subtree's partial merge before passing it on, so no
rank ever holds more than two merges (O(nodes) each). Given a ``path``, every rank first writes its
own profile (timeline included) next to it, ``job.json`` -> ``job.rank3.json``, before any
collective: a rank that crashes later leaves the others' files behind. Without a process group
(the script destroyed it), those files are the way: rank 0 waits for them (``timeout``), merges
those it finds of the same job (:func:`~.meet.job_id`; a file left by an earlier launch is not
one) and names the missing ranks. Rank 0 writes the merged profile to ``path``.

Nothing here waits past ``timeout``: with a process group the ranks first meet in its store
(:func:`~.meet.meet`), and go on to the collective only if every one arrived in time and none
failed. Otherwise (or if the collective fails: a rank died in it) no rank gathers; each keeps
its own file, and rank 0 merges the files of the job already written and names the ranks
missing.

Example:
    >>> rank_file("out/job.json", 3)
    'out/job.rank3.json'
"""
from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

from tracetorch.distributed.meet import job_id, meet
from tracetorch.distributed.merge import RankMerge
from tracetorch.distributed.merged import META_KEY
from tracetorch.distributed.objects import gather_objects, recv_object, send_object
from tracetorch.distributed.rank import group_alive, rank_facts
from tracetorch.records.jsonio import deep_recursion, save_result
from tracetorch.records.result import ProfileResult

__all__ = ("GATHER_S", "gather_profiles", "gather_without", "rank_file", "saved_rank_files",
           "load_rank_profiles", "TREE_FROM")

#: World sizes from which ``gather_profiles`` reduces up a tree by default.
TREE_FROM = 16

#: Seconds a gather waits for the other ranks by default.
GATHER_S = 60.0


def rank_file(path: str, rank: int) -> str:
    """Where rank ``rank``'s own profile is written beside the merged profile at ``path``."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext or '.json'}"


def saved_rank_files(merged: ProfileResult, path: str) -> dict[str, str]:
    """The ranks' own files of the merged profile ``merged`` saved at ``path``, by rank (a
    string, as saved), as paths; empty for any other profile.

    Example:
        >>> from tracetorch.distributed.merge import merge_profiles
        >>> from tracetorch.records.tree import CallNode
        >>> merged = merge_profiles([ProfileResult(CallNode.root())], ranks=[0])
        >>> merged.meta["distributed"]["rank_files"] = {"0": "job.rank0.json"}
        >>> saved_rank_files(merged, "out/job.json") == {"0": os.path.abspath("out/job.rank0.json")}
        True
    """
    facts = merged.meta.get(META_KEY) or {}
    files = facts.get("rank_files") if facts.get("merged") else None
    folder = os.path.dirname(os.path.abspath(path))
    return {rank: os.path.join(folder, name) for rank, name in (files or {}).items()}


def load_rank_profiles(merged: str) -> list[ProfileResult]:
    """The ranks' own profiles of the merged profile saved at ``merged``, in rank order.

    Raises:
        ValueError: ``merged`` is not a merged profile saved with its rank files.
    """
    files = saved_rank_files(ProfileResult.load(merged), merged)
    if not files:
        raise ValueError(f"{merged}: not a merged profile saved with its ranks' files "
                         f"(gather with a path: profile(gather='job.json'))")
    return [ProfileResult.load(files[rank]) for rank in sorted(files, key=int)]


def gather_profiles(result: ProfileResult, path: str | None = None, *, tree: bool | None = None,
                    timeout: float = GATHER_S, failed: bool = False) -> ProfileResult | None:
    """Merge every rank's profile on rank 0; the merged profile there, ``None`` elsewhere.

    Every rank must call it (it is a collective when a process group is alive), but none waits
    more than ``timeout`` for the others: see the module docstring.

    Args:
        result: this rank's profile (its rank facts in ``meta["distributed"]``, as a profile
            records them in a distributed job).
        path: where rank 0 writes the merged profile; each rank writes its own beside it
            (:func:`rank_file`) first. Required without a live process group.
        tree: reduce up a binomial tree rather than gather to rank 0 (default: from
            :data:`TREE_FROM` ranks).
        timeout: seconds to wait for the other ranks (in the store, or for their files).
        failed: this rank's profiled work raised: it writes its own file, tells the others
            not to wait for it, and gathers nothing (``None``).

    Raises:
        RuntimeError: several ranks, no process group and no ``path`` to meet at.
    """
    return gather_without(result, path, tree, timeout, failed, ())


def gather_without(result: ProfileResult, path: str | None, tree: bool | None, timeout: float,
                   failed: bool, absent: Sequence[int]) -> ProfileResult | None:
    """:func:`gather_profiles` without the ranks that are ``absent`` (they never entered the
    profile: the session learnt so when the ranks met, and none is waited for)."""
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
    facts = result.meta.get(META_KEY)
    if not isinstance(facts, dict) or "rank" not in facts:
        facts = result.meta[META_KEY] = rank_facts()
    if "job" not in facts:
        facts["job"] = job_id()
    rank, world, job = int(facts["rank"]), int(facts.get("world_size", 1)), facts["job"]
    payload = result.to_dict()
    if path is not None:
        _write(rank_file(path, rank), payload)
    payload["timeline"] = None
    if group_alive() and world > 1:
        give_up = (f"rank{'s' if len(absent) > 1 else ''} {_listed(absent)} never entered "
                   f"the profile (every rank must enter profile(gather=...))") if absent else None
        meeting = meet("gather", rank, world, timeout, failed=failed, give_up=give_up)
        state, reason = None, meeting.reason
        if meeting.go:
            use_tree = tree if tree is not None else world >= TREE_FROM
            try:
                state = (_tree_reduce if use_tree else _gather_to_zero)(payload, rank, world)
            except RuntimeError as err:  # a rank died in the collective
                reason = f"the gather failed: {str(err).strip().splitlines()[0]}"
        if reason:
            state = _skipped(result, path, world, job, rank, reason, failed)
    elif path is not None:
        state = _from_files(path, world, timeout, job) if rank == 0 and not failed else None
    elif world > 1:
        raise RuntimeError("gather: no process group is alive and no path was given for the "
                           "ranks to meet at: pass gather_profiles(..., path='shared/job.json')")
    else:
        state = RankMerge.of(result)
    if state is None:
        return None
    merged = state.result()
    if path is not None:
        merged.meta[META_KEY]["rank_files"] = {
            str(r): os.path.basename(rank_file(path, r)) for r in sorted(state.ranks)}
        save_result(merged, path)
    return merged


def _skipped(result: ProfileResult, path: str | None, world: int, job: str | None, rank: int,
             reason: str, failed: bool) -> RankMerge | None:
    """No gather: say why; rank 0 (unless it failed) merges what it has at once, its own
    profile and the job's rank files already written, and names the ranks missing."""
    where = f"; its own profile is in {rank_file(path, rank)}" if path is not None else ""
    if rank != 0 or failed:
        warnings.warn(f"tracetorch: rank {rank}: profiles not gathered: {reason}{where}",
                      RuntimeWarning, stacklevel=4)
        return None
    state = _from_files(path, world, 0.0, job) if path is not None else RankMerge()
    if 0 not in state.ranks:
        state.merge(RankMerge.of(result))
    missing = [r for r in range(world) if r not in state.ranks]
    warnings.warn(f"tracetorch: rank 0: profiles not gathered: {reason}; merged the ranks "
                  f"{_listed(sorted(state.ranks))} only, missing {_listed(missing) or 'none'}",
                  RuntimeWarning, stacklevel=4)
    return state


def _listed(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _of(payload: dict[str, Any]) -> RankMerge:
    return RankMerge.of(ProfileResult.from_dict(payload), adopt=True)


def _gather_to_zero(payload: dict[str, Any], rank: int, world: int) -> RankMerge | None:
    received = gather_objects(payload, rank, world)
    if received is None:
        return None
    state = RankMerge()
    for i, item in enumerate(received):
        received[i] = None  # each rank's dict is dropped once merged
        state.merge(_of(item))
    return state


def _tree_reduce(payload: dict[str, Any], rank: int, world: int) -> RankMerge | None:
    state = _of(payload)
    step = 1
    while step < world:
        if rank % (2 * step) == step:
            send_object(state.result().to_dict(), rank - step)
            return None
        if rank + step < world:
            state.merge(_of(recv_object(rank + step)))
        step *= 2
    return state


def _from_files(path: str, world: int, timeout: float, job: str | None) -> RankMerge:
    """Merge the ranks' files of job ``job`` beside ``path``, waiting up to ``timeout`` seconds
    for them: a file of another job (an earlier launch's, in the same folder) is not merged."""
    deadline = time.monotonic() + timeout
    files = {r: rank_file(path, r) for r in range(world)}
    found: dict[int, ProfileResult] = {}
    seen: dict[int, tuple[int, int]] = {}  # a file's (mtime, size) when it was of another job
    while True:
        for r, name in files.items():
            if r in found:
                continue
            try:
                stat = os.stat(name)
            except OSError:
                continue
            if seen.get(r) == (stat.st_mtime_ns, stat.st_size):
                continue  # read already: of another job
            loaded = ProfileResult.load(name)
            if (loaded.meta.get(META_KEY) or {}).get("job") == job:
                found[r] = loaded
            else:
                seen[r] = (stat.st_mtime_ns, stat.st_size)
        if len(found) == world or time.monotonic() >= deadline:
            break
        time.sleep(0.05)  # the other ranks are still finishing their runs
    stale = sorted(seen.keys() - found.keys())
    if stale:
        warnings.warn(f"tracetorch: not merged, of another run than this one (job {job}): "
                      f"{', '.join(files[r] for r in stale)}", RuntimeWarning, stacklevel=4)
    state = RankMerge()
    for r in sorted(found):
        state.merge(RankMerge.of(found.pop(r), adopt=True))
    return state


def _write(path: str, payload: dict[str, Any]) -> None:
    # Written whole, then renamed: a reader polling for it never sees half a file.
    partial = f"{path}.partial{os.getpid()}"
    with deep_recursion(), open(partial, "w", encoding="utf-8") as f:
        json.dump(payload, f)
        f.write("\n")
    os.replace(partial, path)
