"""Across-rank statistics that merge: one number per rank folded into O(1) state.

A :class:`Spread` holds, for one quantity (a layer's time on each rank, a rank's compute time),
the ranks' values as a :class:`~tracetorch.records.stats.TimeStats` — exact while there are at most
:data:`EXACT_RANKS` of them, a bounded quantile sketch beyond — and which rank is slowest and
fastest. Merging two spreads is associative and commutative (ties go to the lower rank), so a
job's spreads can be reduced in any order, pairwise up a tree.

Example:
    >>> a, b = Spread(), Spread()
    >>> a.add(0, 10); a.add(1, 30); b.add(2, 20)
    >>> a.merge(b)
    >>> a.ranks, a.min_ns, a.median_ns, a.max_ns, a.slowest_rank, a.fastest_rank
    (3, 10, 20.0, 30, 1, 0)
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from tracetorch.records.stats import TimeStats

__all__ = ("EXACT_RANKS", "Spread", "median")

#: Ranks whose values are kept exactly (exact medians) before a sketch (about 1%) takes over.
EXACT_RANKS = 64


def median(values: Iterable[int]) -> float:
    """The exact median of a few ranks' values.

    Example:
        >>> median([30, 10, 20, 40])
        25.0
    """
    return float(np.median(np.asarray(list(values), dtype=np.float64)))


class Spread:
    """The values of one quantity across ranks: min / median / max and who is slowest."""

    __slots__ = ("stats", "slowest_rank", "slowest_ns", "fastest_rank", "fastest_ns")

    def __init__(self) -> None:
        self.stats = TimeStats(EXACT_RANKS)
        self.slowest_rank = -1
        self.slowest_ns = 0
        self.fastest_rank = -1
        self.fastest_ns = 0

    def add(self, rank: int, ns: int) -> None:
        """Record rank ``rank``'s value ``ns`` (non-negative nanoseconds)."""
        self.stats.add(int(ns))
        self._note(rank, int(ns), rank, int(ns))

    def _note(self, slow_rank: int, slow_ns: int, fast_rank: int, fast_ns: int) -> None:
        if self.slowest_rank < 0 or (slow_ns, -slow_rank) > (self.slowest_ns, -self.slowest_rank):
            self.slowest_rank, self.slowest_ns = slow_rank, slow_ns
        if self.fastest_rank < 0 or (fast_ns, fast_rank) < (self.fastest_ns, self.fastest_rank):
            self.fastest_rank, self.fastest_ns = fast_rank, fast_ns

    def merge(self, other: Spread) -> None:
        """Fold ``other``'s ranks into this spread."""
        if other.slowest_rank < 0:
            return
        self.stats.merge(other.stats)
        self._note(other.slowest_rank, other.slowest_ns, other.fastest_rank, other.fastest_ns)

    @property
    def ranks(self) -> int:
        """How many ranks reported a value."""
        return self.stats.count

    @property
    def min_ns(self) -> int:
        """The smallest rank's value."""
        return self.stats.min_ns

    @property
    def max_ns(self) -> int:
        """The largest rank's value."""
        return self.stats.max_ns

    @property
    def median_ns(self) -> float:
        """The median over ranks (exact up to :data:`EXACT_RANKS` ranks, else within ~1%)."""
        return self.stats.quantile(0.5)

    def median_of_others(self) -> float:
        """The median over every rank but the slowest: what the slowest rank is compared with
        (exact while the values are kept; beyond, one rank of many hardly moves the median).

        Example:
            >>> s = Spread(); s.add(0, 10); s.add(1, 50)
            >>> s.median_of_others()
            10.0
        """
        samples = self.stats._exact  # the kept values, None once the sketch took over
        if samples is None or self.ranks < 2:
            return self.median_ns
        others = list(samples)
        others.remove(self.slowest_ns)
        return median(others)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form :meth:`from_dict` restores exactly."""
        return {"stats": self.stats.to_dict(), "slowest": [self.slowest_rank, self.slowest_ns],
                "fastest": [self.fastest_rank, self.fastest_ns]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Spread:
        """Rebuild a spread saved by :meth:`to_dict`.

        Raises:
            ValueError: ``data`` is not such a dict (the message names the missing part).
        """
        try:
            spread = cls()
            spread.stats = TimeStats.from_dict(data["stats"])
            spread.slowest_rank, spread.slowest_ns = (int(v) for v in data["slowest"])
            spread.fastest_rank, spread.fastest_ns = (int(v) for v in data["fastest"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a saved rank spread ({err!r})") from None
        return spread
