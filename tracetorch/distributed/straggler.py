"""Who everybody waits for: the straggler of a merged profile, with its evidence.

A straggler is not the rank with the longest backward pass: gradient all-reduces end together on
every rank, so they make backward (and step) times equal, the fast ranks' share being spent
waiting. What differs is the **compute** before those collectives: each rank records
(``meta["distributed"]["compute_ns"]``) the time it spent with no collective in flight, from the
moment the ranks' clocks were aligned (a barrier, or the first collective they completed
together) to the end of the profile. The straggler is the rank whose compute is longest; the
evidence is by how much it exceeds the median of the other ranks, how much less it waits in
collectives than they do, and the layers whose self time on it exceeds the other ranks'
median most (from the merged nodes' spreads, so it costs O(nodes) at any scale).

Example:
    >>> from tracetorch.distributed.merge import merge_profiles
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> def rank_profile(rank, compute):
    ...     root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(compute)
    ...     facts = {"rank": rank, "world_size": 3, "compute_ns": compute, "collective_ns": 0}
    ...     return ProfileResult(root, meta={"distributed": facts})
    >>> merged = merge_profiles([rank_profile(r, c) for r, c in enumerate((100, 400, 120))])
    >>> s = find_straggler(merged)
    >>> s.rank, s.excess_ns, [layer.path for layer in s.layers]
    (1, 290.0, ['fc'])
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tracetorch.distributed.spread import median

if TYPE_CHECKING:
    from tracetorch.records.result import ProfileResult

__all__ = ("Straggler", "LayerExcess", "find_straggler", "MAX_LAYERS")

#: Layers listed as the straggler's evidence.
MAX_LAYERS = 5


@dataclass
class LayerExcess:
    """A layer where the straggler spends longer than the other ranks (self time, ns)."""

    path: str
    rank_ns: int
    others_median_ns: float

    @property
    def excess_ns(self) -> float:
        """The straggler's self time minus the other ranks' median."""
        return self.rank_ns - self.others_median_ns


@dataclass
class Straggler:
    """The rank the others wait for, and by how much (nanoseconds)."""

    rank: int
    compute_ns: int
    others_median_ns: float
    wait_ns: int
    others_wait_median_ns: float
    layers: list[LayerExcess] = field(default_factory=list)

    @property
    def excess_ns(self) -> float:
        """The straggler's compute minus the other ranks' median compute."""
        return self.compute_ns - self.others_median_ns

    @property
    def excess_ratio(self) -> float:
        """:attr:`excess_ns` over the other ranks' median (0.25: 25% slower)."""
        return self.excess_ns / self.others_median_ns if self.others_median_ns else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (saved in a merged profile's ``meta["distributed"]["straggler"]``)."""
        data = asdict(self)
        data["excess_ns"] = self.excess_ns
        return data


def find_straggler(result: ProfileResult) -> Straggler | None:
    """The straggler of a merged profile (``None`` with fewer than two ranks that report their
    compute time).

    Raises:
        ValueError: ``result`` is not a merged profile.
    """
    from tracetorch.distributed.merged import collective_sites, node_spreads, rank_rows

    rows = {r: row for r, row in rank_rows(result).items() if "compute_ns" in row}
    if len(rows) < 2:
        return None
    rank = max(rows, key=lambda r: (int(rows[r]["compute_ns"]), -r))
    others = [row for r, row in rows.items() if r != rank]
    straggler = Straggler(
        rank=rank, compute_ns=int(rows[rank]["compute_ns"]),
        others_median_ns=median([int(row["compute_ns"]) for row in others]),
        wait_ns=int(rows[rank].get("collective_ns", 0)),
        others_wait_median_ns=median([int(row.get("collective_ns", 0)) for row in others]))
    collectives = {site.label for site in collective_sites(result)}
    evidence = []
    for node, spread in node_spreads(result).items():
        own = spread.self
        if (node.kind not in ("module", "function") or node.path in collectives
                or own.ranks < 2 or own.slowest_rank != rank):
            continue
        layer = LayerExcess(node.path or node.type_name, own.slowest_ns, own.median_of_others())
        if layer.excess_ns > 0:
            evidence.append(layer)
    evidence.sort(key=lambda layer: -layer.excess_ns)
    straggler.layers = evidence[:MAX_LAYERS]
    return straggler
