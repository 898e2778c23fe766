"""TimeStats folds short batches in plain Python and long ones with numpy: the same numbers."""
from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from tracetorch.records import stats
from tracetorch.records.stats import TimeStats

durations = st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=200)


def folded(samples: list[int], vectorise_from: int) -> TimeStats:
    saved = stats._VECTORISE_FROM
    stats._VECTORISE_FROM = vectorise_from
    try:
        s = TimeStats()
        for ns in samples:
            s.add(ns)
        s.flush()
        return s
    finally:
        stats._VECTORISE_FROM = saved


@given(durations)
def test_python_and_numpy_folds_agree(samples: list[int]) -> None:
    python, vectorised = folded(samples, 10**9), folded(samples, 1)
    assert (python.count, python.total_ns, python.min_ns, python.max_ns) == (
        vectorised.count, vectorised.total_ns, vectorised.min_ns, vectorised.max_ns) == (
        len(samples), sum(samples), min(samples), max(samples))
    assert math.isclose(python.mean_ns, vectorised.mean_ns, rel_tol=1e-12)
    assert math.isclose(python.std_ns, vectorised.std_ns, rel_tol=1e-9, abs_tol=1e-6)
    # Bucket keys may differ by one only where log() rounds differently on a boundary.
    for q in (0.0, 0.5, 0.99, 1.0):
        assert math.isclose(python.quantile(q), vectorised.quantile(q), rel_tol=0.021)


def test_small_batches_bucket_exactly_like_the_vectorised_path() -> None:
    samples = [0, 1, 2, 100, 1_000, 12_345, 10**9]
    assert folded(samples, 10**9)._buckets == folded(samples, 1)._buckets
