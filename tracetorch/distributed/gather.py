"""Every rank's profile to rank 0, over the job's own process group or through shared files.

Each rank contributes its profile as the versioned dict of :mod:`tracetorch.report.jsonio`
(its timeline left out: merging does not read it). With a process group alive they travel by
``gather_object`` to rank 0, which folds them into a :class:`~.merge.RankMerge` one at a time;
with ``tree=True`` (the default beyond :data:`TREE_FROM` ranks) they are reduced up a binomial
tree instead, each rank merging its subtree's partial merge before passing it on, so no rank
ever holds more than two merges (O(nodes) each). Given a ``path``, every rank first writes its own
profile (timeline included) next to it, ``job.json`` -> ``job.rank3.json``, before any
collective: a rank that crashes later leaves the others' files behind. Without a process group
(the script destroyed it), those files are the way: rank 0 waits for them (``timeout``), merges
those it finds and names the missing ranks. Rank 0 writes the merged profile to ``path``.

Example:
    >>> rank_file("out/job.json", 3)
    'out/job.rank3.json'
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from tracetorch.distributed.merge import META_KEY, RankMerge
from tracetorch.distributed.rank import group_alive, rank_facts
from tracetorch.report.jsonio import deep_recursion, save_result
from tracetorch.result import ProfileResult

__all__ = ("gather_profiles", "rank_file", "saved_rank_files", "TREE_FROM")

#: World sizes from which ``gather_profiles`` reduces up a tree by default.
TREE_FROM = 16


def rank_file(path: str, rank: int) -> str:
    """Where rank ``rank``'s own profile is written beside the merged profile at ``path``."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext or '.json'}"


def saved_rank_files(merged: ProfileResult, path: str) -> dict[str, str]:
    """The ranks' own files of the merged profile ``merged`` saved at ``path``, by rank (a
    string, as saved), as paths; empty for any other profile.

    Example:
        >>> from tracetorch.distributed.merge import merge_profiles
        >>> from tracetorch.tree import CallNode
        >>> merged = merge_profiles([ProfileResult(CallNode.root())], ranks=[0])
        >>> merged.meta["distributed"]["rank_files"] = {"0": "job.rank0.json"}
        >>> saved_rank_files(merged, "out/job.json") == {"0": os.path.abspath("out/job.rank0.json")}
        True
    """
    facts = merged.meta.get(META_KEY) or {}
    files = facts.get("rank_files") if facts.get("merged") else None
    folder = os.path.dirname(os.path.abspath(path))
    return {rank: os.path.join(folder, name) for rank, name in (files or {}).items()}


def gather_profiles(result: ProfileResult, path: str | None = None, *, tree: bool | None = None,
                    timeout: float = 60.0) -> ProfileResult | None:
    """Merge every rank's profile on rank 0; the merged profile there, ``None`` elsewhere.

    Every rank must call it (it is a collective when a process group is alive).

    Args:
        result: this rank's profile (its rank facts in ``meta["distributed"]``, as a profile
            records them in a distributed job).
        path: where rank 0 writes the merged profile; each rank writes its own beside it
            (:func:`rank_file`) first. Required without a live process group.
        tree: reduce up a binomial tree rather than gather to rank 0 (default: from
            :data:`TREE_FROM` ranks).
        timeout: seconds rank 0 waits for the other ranks' files without a process group.

    Raises:
        RuntimeError: several ranks, no process group and no ``path`` to meet at.
    """
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
    facts = result.meta.get(META_KEY)
    if not isinstance(facts, dict) or "rank" not in facts:
        facts = result.meta[META_KEY] = rank_facts()
    rank, world = int(facts["rank"]), int(facts.get("world_size", 1))
    payload = result.to_dict()
    if path is not None:
        _write(rank_file(path, rank), payload)
    payload["timeline"] = None
    if group_alive() and world > 1:
        use_tree = tree if tree is not None else world >= TREE_FROM
        state = (_tree_reduce if use_tree else _gather_to_zero)(payload, rank, world)
    elif path is not None:
        state = _from_files(path, world, timeout) if rank == 0 else None
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


def _of(payload: dict[str, Any]) -> RankMerge:
    return RankMerge.of(ProfileResult.from_dict(payload), adopt=True)


def _gather_to_zero(payload: dict[str, Any], rank: int, world: int) -> RankMerge | None:
    dist = sys.modules["torch.distributed"]
    received: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(payload, received, dst=0)
    if received is None:
        return None
    state = RankMerge()
    for i, item in enumerate(received):
        received[i] = None  # each rank's dict is dropped once merged
        state.merge(_of(item))
    return state


def _tree_reduce(payload: dict[str, Any], rank: int, world: int) -> RankMerge | None:
    dist = sys.modules["torch.distributed"]
    state = _of(payload)
    step = 1
    while step < world:
        if rank % (2 * step) == step:
            dist.send_object_list([state.result().to_dict()], dst=rank - step)
            return None
        if rank + step < world:
            box: list[Any] = [None]
            dist.recv_object_list(box, src=rank + step)
            state.merge(_of(box[0]))
        step *= 2
    return state


def _from_files(path: str, world: int, timeout: float) -> RankMerge:
    deadline = time.monotonic() + timeout
    files = [rank_file(path, r) for r in range(world)]
    while not all(os.path.exists(f) for f in files) and time.monotonic() < deadline:
        time.sleep(0.05)  # the other ranks are still finishing their runs
    state = RankMerge()
    for name in files:
        if os.path.exists(name):
            state.merge(RankMerge.of(ProfileResult.load(name), adopt=True))
    return state


def _write(path: str, payload: dict[str, Any]) -> None:
    # Written whole, then renamed: a reader polling for it never sees half a file.
    partial = f"{path}.partial{os.getpid()}"
    with deep_recursion(), open(partial, "w", encoding="utf-8") as f:
        json.dump(payload, f)
        f.write("\n")
    os.replace(partial, path)
