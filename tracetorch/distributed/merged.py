"""Reading a merged profile: each node's spread across ranks, the per-rank rows, the collective
sites (what :mod:`tracetorch.distributed.merge` writes into ``meta["distributed"]``).

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> rank_rows(ProfileResult(CallNode.root(), meta={META_KEY: {"merged": True}}))
    {}
"""
from __future__ import annotations

from typing import Any

from tracetorch.distributed.spread import Spread
from tracetorch.records.result import ProfileResult
from tracetorch.records.stats import TimeStats
from tracetorch.records.tree import CallNode

__all__ = ("META_KEY", "NodeSpread", "CollectiveSite", "node_spreads", "rank_rows",
           "collective_sites")

#: The key of ``result.meta`` under which per-rank facts and merge results live.
META_KEY = "distributed"


class NodeSpread:
    """Across-rank statistics of one node: its per-rank inclusive time (``total``), self time
    (``self``) and the fewest and most calls a rank made of it."""

    __slots__ = ("total", "self", "calls_min", "calls_max")

    def __init__(self) -> None:
        self.total = Spread()
        self.self = Spread()
        self.calls_min = self.calls_max = -1

    def add(self, rank: int, node: CallNode) -> None:
        """Record rank ``rank``'s own ``node``."""
        self.total.add(rank, node.total_ns)
        self.self.add(rank, node.self_ns)
        self._calls(node.calls, node.calls)

    def _calls(self, low: int, high: int) -> None:
        self.calls_min = low if self.calls_min < 0 else min(self.calls_min, low)
        self.calls_max = max(self.calls_max, high)

    def merge(self, other: NodeSpread) -> None:
        """Fold ``other``'s ranks in."""
        self.total.merge(other.total)
        self.self.merge(other.self)
        if other.calls_min >= 0:
            self._calls(other.calls_min, other.calls_max)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; :meth:`from_dict` restores it."""
        return {"total": self.total.to_dict(), "self": self.self.to_dict(),
                "calls": [self.calls_min, self.calls_max]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeSpread:
        """Rebuild a node spread saved by :meth:`to_dict`."""
        spread = cls()
        spread.total = Spread.from_dict(data["total"])
        spread.self = Spread.from_dict(data["self"])
        spread.calls_min, spread.calls_max = (int(v) for v in data["calls"])
        return spread


class CollectiveSite:
    """One collective operation at one call path, over every rank: calls, bytes (the sizes
    convention of :mod:`tracetorch.distributed.collectives`), the per-operation time from issue
    to completion, and the spread of each rank's total time in it."""

    __slots__ = ("path", "op", "calls", "bytes", "async_calls", "time", "ranks")

    def __init__(self, path: str, op: str) -> None:
        self.path, self.op = path, op
        self.calls = self.bytes = self.async_calls = 0
        self.time = TimeStats()
        self.ranks = Spread()

    @property
    def label(self) -> str:
        """The site as its tree node is named: ``backward.all_reduce`` (the op alone at the
        top level)."""
        return f"{self.path}.{self.op}" if self.path else self.op

    def merge(self, other: CollectiveSite) -> None:
        """Fold ``other`` (the same site on other ranks) in."""
        self.calls += other.calls
        self.bytes += other.bytes
        self.async_calls += other.async_calls
        self.time.merge(other.time)
        self.ranks.merge(other.ranks)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; :meth:`from_dict` restores it."""
        return {"path": self.path, "op": self.op, "calls": self.calls, "bytes": self.bytes,
                "async_calls": self.async_calls, "time": self.time.to_dict(),
                "ranks": self.ranks.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], rank: int | None = None) -> CollectiveSite:
        """A site from a merge (``rank`` ``None``) or from one rank's own record."""
        site = cls(str(data["path"]), str(data["op"]))
        site.calls, site.bytes = int(data["calls"]), int(data["bytes"])
        site.async_calls = int(data.get("async_calls", 0))
        site.time = TimeStats.from_dict(data["time"])
        if rank is None:
            site.ranks = Spread.from_dict(data["ranks"])
        else:
            site.ranks.add(rank, site.time.total_ns)
        return site


def _merged_facts(result: ProfileResult) -> dict[str, Any]:
    facts = result.meta.get(META_KEY)
    if not isinstance(facts, dict) or not facts.get("merged"):
        raise ValueError("not a merged profile: meta['distributed']['merged'] is not set "
                         "(merge rank profiles with tracetorch.distributed.merge_profiles)")
    return facts


def node_spreads(result: ProfileResult) -> dict[CallNode, NodeSpread]:
    """Each node's across-rank statistics in a merged profile.

    Raises:
        ValueError: ``result`` is not a merged profile.
    """
    facts = _merged_facts(result)
    order = list(result.root.walk())
    saved = facts.get("nodes") or []
    return {node: NodeSpread.from_dict(data) for node, data in zip(order, saved) if data}


def rank_rows(result: ProfileResult) -> dict[int, dict[str, Any]]:
    """The per-rank rows of a merged profile, by rank: the rank's facts (host, device,
    backend...), ``layer_calls``, ``flops``, step times, ``compute_ns`` and ``collective_ns``."""
    return {int(r): row for r, row in _merged_facts(result).get("ranks", {}).items()}


def collective_sites(result: ProfileResult) -> list[CollectiveSite]:
    """The collective sites of a merged profile, by call path and operation."""
    return [CollectiveSite.from_dict(d) for d in _merged_facts(result).get("collectives", ())]
