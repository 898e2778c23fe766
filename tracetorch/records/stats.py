"""Bounded per-node timing statistics: count, sum, min, max, mean/std and quantiles.

A million calls must cost O(1) memory per node, so durations are not kept (except, on request,
the first ``exact_limit`` of them, which gives exact interpolated quantiles for small sets such as
a run's training steps, where a sketch's nearest-rank answer would be coarse). The hot path only
appends an integer to a short buffer; every :data:`FLUSH_EVERY` samples the buffer is folded,
vectorised, into exact moments (Chan's parallel variance update) and into a log-bucketed
histogram whose buckets are ``GROWTH`` apart, so any quantile it reports is within about 1% of a
true sample (DDSketch's idea: relative, not absolute, error, which is what timings need).

Example:
    >>> s = TimeStats()
    >>> for ns in (100, 200, 300):
    ...     s.add(ns)
    >>> s.count, s.total_ns, s.min_ns, s.max_ns
    (3, 600, 100, 300)
    >>> round(s.quantile(0.5) / 200, 2)
    1.0
"""
from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

__all__ = ("TimeStats", "FLUSH_EVERY", "GROWTH")

#: Samples buffered before they are folded into the moments and the histogram.
FLUSH_EVERY = 512
#: Ratio between neighbouring histogram buckets (1% relative accuracy at the bucket centre).
GROWTH = 1.02
_LOG_GROWTH = math.log(GROWTH)
#: Batches at least this long are folded with numpy; shorter ones in plain Python.
_VECTORISE_FROM = 64
# Flushes are rare (one per FLUSH_EVERY samples), so one lock for all of them costs nothing.
_FLUSH_LOCK = threading.Lock()


class TimeStats:
    """Streaming statistics of non-negative integer durations in nanoseconds.

    ``add`` is the only method on the hot path; everything else folds the pending buffer first.

    Example:
        >>> s = TimeStats(); s.add(5); s.add(7)
        >>> s.mean_ns, s.std_ns
        (6.0, 1.0)
        >>> s
        TimeStats(count=2, total_ns=12, mean_ns=6.0, min_ns=5, max_ns=7)
    """

    __slots__ = ("pending", "_count", "_total", "_min", "_max", "_mean", "_m2", "_buckets",
                 "exact_limit", "_exact")

    def __init__(self, exact_limit: int = 0) -> None:
        self.pending: list[int] = []
        self.exact_limit = exact_limit
        self._reset()

    def _reset(self) -> None:
        # (Unlocked at __init__: a new instance is nobody else's yet, and every node makes one.)
        # Every sample while there are at most exact_limit of them, then None for good.
        self._exact: list[int] | None = [] if self.exact_limit else None
        self._count = 0
        self._total = 0
        self._min = 0
        self._max = 0
        self._mean = 0.0
        self._m2 = 0.0
        self._buckets: dict[int, int] = {}

    def clear(self) -> None:
        """Forget every sample. The pending buffer stays the same list, emptied: the hot path
        may hold it (a node that keeps recording after its samples were handed on).

        Example:
            >>> s = TimeStats(); s.add(5); s.clear()
            >>> s.count
            0
        """
        with _FLUSH_LOCK:
            del self.pending[:]
            self._reset()

    def __repr__(self) -> str:
        if self.count == 0:
            return "TimeStats(count=0)"
        return (f"TimeStats(count={self.count}, total_ns={self.total_ns}, "
                f"mean_ns={self.mean_ns:.1f}, min_ns={self.min_ns}, max_ns={self.max_ns})")

    def add(self, ns: int) -> None:
        """Record one duration (hot path: an append, a fold every FLUSH_EVERY samples)."""
        pending = self.pending
        pending.append(ns)
        if len(pending) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Fold the buffered samples into the moments and the histogram.

        Safe against other threads: the buffer is never replaced (a writer may hold it), only
        emptied of the samples taken, under a lock, so a sample is neither lost nor counted
        twice when two threads flush the same node (``profile(all_threads=True)``).
        """
        pending = self.pending
        if not pending:
            return
        with _FLUSH_LOCK:
            taken = len(pending)
            if not taken:
                return
            samples = pending[:taken]
            del pending[:taken]
            self._fold(samples)

    def _fold(self, samples: list[int]) -> None:
        if self._exact is not None:
            self._exact.extend(samples)
            if len(self._exact) > self.exact_limit:
                self._exact = None
        n = len(samples)
        buckets = self._buckets
        if n < _VECTORISE_FROM:
            # A few samples (a block or a step's worth): plain Python beats numpy's fixed cost
            # per call, which a decorated step would pay per node on every call.
            total = sum(samples)
            mean = total / n
            m2 = sum((ns - mean) ** 2 for ns in samples)
            lo, hi = min(samples), max(samples)
            for ns in samples:
                key = math.ceil(math.log(ns) / _LOG_GROWTH) if ns > 1 else 0
                buckets[key] = buckets.get(key, 0) + 1
        else:
            batch = np.asarray(samples, dtype=np.int64)
            total = int(batch.sum())
            mean = float(batch.mean())
            m2 = float(((batch - mean) ** 2).sum())
            lo, hi = int(batch.min()), int(batch.max())
            keys, counts = np.unique(_bucket_index(batch), return_counts=True)
            for key, cnt in zip(keys.tolist(), counts.tolist()):
                buckets[key] = buckets.get(key, 0) + cnt
        if self._count == 0:
            self._min, self._max = lo, hi
            self._mean, self._m2 = mean, m2
        else:
            self._min, self._max = min(self._min, lo), max(self._max, hi)
            self._merge_moments(n, mean, m2)
        self._count += n
        self._total += total

    def _merge_moments(self, n: int, mean: float, m2: float) -> None:
        total = self._count + n
        delta = mean - self._mean
        self._mean += delta * n / total
        self._m2 += m2 + delta * delta * self._count * n / total

    def merge(self, other: TimeStats) -> None:
        """Add every sample of ``other`` to this one (used for by-module and by-type views)."""
        self.flush()
        other.flush()
        if other._count == 0:
            return
        if self._count == 0:
            self._min, self._max = other._min, other._max
            self._mean, self._m2 = other._mean, other._m2
        else:
            self._min, self._max = min(self._min, other._min), max(self._max, other._max)
            self._merge_moments(other._count, other._mean, other._m2)
        self._count += other._count
        self._total += other._total
        for key, cnt in other._buckets.items():
            self._buckets[key] = self._buckets.get(key, 0) + cnt
        if self._exact is not None and other._exact is not None \
                and len(self._exact) + len(other._exact) <= self.exact_limit:
            self._exact.extend(other._exact)
        else:
            self._exact = None

    @property
    def count(self) -> int:
        """Number of samples."""
        self.flush()
        return self._count

    @property
    def total_ns(self) -> int:
        """Sum of all samples."""
        self.flush()
        return self._total

    @property
    def min_ns(self) -> int:
        """Smallest sample (0 when empty)."""
        self.flush()
        return self._min

    @property
    def max_ns(self) -> int:
        """Largest sample (0 when empty)."""
        self.flush()
        return self._max

    @property
    def mean_ns(self) -> float:
        """Arithmetic mean (0.0 when empty)."""
        self.flush()
        return self._mean

    @property
    def std_ns(self) -> float:
        """Population standard deviation (0.0 when empty)."""
        self.flush()
        return math.sqrt(self._m2 / self._count) if self._count else 0.0

    def quantile(self, q: float) -> float:
        """The ``q``-quantile (0 ≤ q ≤ 1): exact (linear interpolation, as ``numpy.percentile``)
        while every sample is kept, else within about 1% relative error; exact min/max."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be within [0, 1], got {q!r}")
        self.flush()
        if self._count == 0:
            return 0.0
        if self._exact is not None:
            return float(np.quantile(np.asarray(self._exact, dtype=np.float64), q))
        if q == 0.0:
            return float(self._min)
        if q == 1.0:
            return float(self._max)
        rank = q * (self._count - 1)
        seen = 0
        for key in sorted(self._buckets):
            seen += self._buckets[key]
            if seen > rank:
                return min(max(_bucket_value(key), float(self._min)), float(self._max))
        return float(self._max)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form that :meth:`from_dict` restores exactly."""
        self.flush()
        return {
            "count": self._count, "total_ns": self._total, "min_ns": self._min,
            "max_ns": self._max, "mean_ns": self._mean, "m2": self._m2,
            "buckets": [[k, v] for k, v in sorted(self._buckets.items())],
            "exact_limit": self.exact_limit,
            "exact": self._exact,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimeStats:
        """Rebuild statistics saved by :meth:`to_dict`."""
        stats = cls(int(data.get("exact_limit", 0)))
        exact = data.get("exact")
        stats._exact = [int(v) for v in exact] if exact is not None else None
        stats._count = int(data["count"])
        stats._total = int(data["total_ns"])
        stats._min = int(data["min_ns"])
        stats._max = int(data["max_ns"])
        stats._mean = float(data["mean_ns"])
        stats._m2 = float(data["m2"])
        stats._buckets = {int(k): int(v) for k, v in data["buckets"]}
        return stats


def _bucket_index(ns: np.ndarray) -> np.ndarray:
    # Bucket 0 holds durations of 0 and 1 ns; the rest are log-spaced by GROWTH.
    return np.ceil(np.log(np.maximum(ns, 1)) / _LOG_GROWTH).astype(np.int64)


def _bucket_value(key: int) -> float:
    # The geometric middle of bucket (GROWTH**(key-1), GROWTH**key].
    return GROWTH ** (key - 0.5) if key > 0 else 1.0
