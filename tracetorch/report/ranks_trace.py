"""One Chrome / Perfetto trace for the job: one process row per rank, on aligned clocks.

Each rank's own profile (written beside the merged one, ``job.rank3.json``) holds its timeline
when recorded with ``profile(timeline=True)``. Its events are shifted by the rank's clock reading
at alignment (``meta["distributed"]["aligned_at_ns"]``: a barrier, or the first collective the
ranks completed together), so the same moment lines up across ranks; then all by one amount, so
the earliest event of the job starts at 0.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> def rank(r, start):
    ...     root = CallNode.root(); fc = root.child("fc", "Linear", "m0"); fc.time.add(5)
    ...     facts = {"rank": r, "aligned_at_ns": start - 10}
    ...     return ProfileResult(root, timeline=[(fc, start, start + 5, 1)],
    ...                          meta={"distributed": facts})
    >>> trace = ranks_chrome_trace([rank(0, 1_000), rank(1, 90_000)])
    >>> sorted((e["pid"], e["ts"]) for e in trace["traceEvents"] if e["ph"] == "X")
    [(0, 0.0), (1, 0.0)]
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tracetorch.distributed.gather import load_rank_profiles
from tracetorch.distributed.merged import META_KEY
from tracetorch.report.chrome import chrome_trace_events

if TYPE_CHECKING:
    from tracetorch.records.result import ProfileResult

__all__ = ("ranks_chrome_trace", "export_ranks_chrome_trace")


def ranks_chrome_trace(results: Iterable[ProfileResult]) -> dict[str, Any]:
    """The trace-event document of several ranks' profiles, one process (``pid`` = rank) each.

    Raises:
        ValueError: a profile without a timeline or without a rank.
    """
    ranks = []
    for result in results:
        facts = result.meta.get(META_KEY) or {}
        if "rank" not in facts:
            raise ValueError("ranks_chrome_trace: a profile without meta['distributed']['rank']")
        if not result.timeline:
            raise ValueError(f"rank {facts['rank']} has no timeline: record one with "
                             f"tracetorch.profile(timeline=True)")
        first = min(start for _, start, _, _ in result.timeline)
        aligned = facts.get("aligned_at_ns")
        ranks.append((int(facts["rank"]), result, first if aligned is None else int(aligned),
                      first))
    lead = max((aligned - first for _, _, aligned, first in ranks), default=0)
    events: list[dict[str, Any]] = []
    for rank, result, aligned, _ in sorted(ranks, key=lambda item: item[0]):
        meta = result.meta
        result.meta = {**meta, "pid": rank, "name": f"rank {rank}"}
        try:
            events.extend(chrome_trace_events(result, origin=aligned - lead)["traceEvents"])
        finally:
            result.meta = meta
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"producer": "tracetorch", "ranks": [r for r, *_ in sorted(ranks)]}}


def export_ranks_chrome_trace(merged: str, path: str) -> None:
    """Write the trace of every rank of the merged profile at ``merged`` (its ranks' own files,
    found beside it) to ``path``.

    Raises:
        ValueError: ``merged`` is not a merged profile saved with its rank files.
    """
    document = ranks_chrome_trace(load_rank_profiles(merged))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(document, f, separators=(",", ":"))
