"""Careful whole-model latency: warm-up, blocked timing, median and spread.

:func:`benchmark` follows the method of ``torch.utils.benchmark``'s ``blocked_autorange``: run
the callable a few times untimed, grow the number of calls per timed block until the clock's own
cost is under 0.1% of a block, then time blocks until ``min_run_time`` has passed. The garbage
collector is off while timing (a collection landing in one block would show up as noise) and is
put back as it was afterwards, even when the callable raises. :func:`measure_latency` is the
TinyTorch guide's simpler API: the mean seconds per call over a fixed number of calls.

Example:
    >>> m = benchmark(sum, [1, 2, 3], min_run_time=0.01)
    >>> m.median > 0 and m.n >= 1
    True
"""
from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tracetorch.models.tensors import dummy_input
from tracetorch.text.units import format_time_ns

__all__ = ("Measurement", "benchmark", "measure_latency", "as_callable",
           "SPREAD_WARNING_THRESHOLD")

#: IQR / median above which a measurement is flagged as noisy.
SPREAD_WARNING_THRESHOLD = 0.1
# A block must be long enough that reading the clock costs < 0.1% of it...
_MAX_RELATIVE_OVERHEAD = 1e-3
# ...and no block grows beyond this many calls (a callable that takes no measurable time).
_MAX_NUMBER_PER_BLOCK = 10 ** 8
# Fewer timed blocks than this give no trustworthy spread.
_MIN_BLOCKS_FOR_SPREAD = 4


@dataclass(frozen=True)
class Measurement:
    """Timings of one benchmark, in seconds per call.

    Attributes:
        times_s: per-call seconds of each timed block (block time / ``number_per_block``).
        number_per_block: calls per timed block.
        median, mean, iqr, p10, p90: statistics of ``times_s`` (linear-interpolated percentiles).
        n: number of timed blocks.
        warnings: human-readable doubts about the result (large spread, too few blocks).
    """

    times_s: tuple[float, ...]
    number_per_block: int
    median: float
    mean: float
    iqr: float
    p10: float
    p90: float
    n: int
    warnings: tuple[str, ...]

    @classmethod
    def from_times(cls, times_s: tuple[float, ...], number_per_block: int) -> Measurement:
        """Statistics and warnings for per-call block times.

        Example:
            >>> m = Measurement.from_times((1.0, 2.0, 3.0, 4.0, 5.0), 10)
            >>> m.median, m.iqr, m.warnings
            (3.0, 2.0, ('large spread: IQR is 67% of the median',))
        """
        if not times_s:
            raise ValueError("times_s: expected at least one block time, got none")
        values = np.asarray(times_s, dtype=np.float64)
        p10, p25, median, p75, p90 = (float(v) for v in np.percentile(values, [10, 25, 50, 75, 90]))
        iqr = p75 - p25
        warnings = []
        if len(values) < _MIN_BLOCKS_FOR_SPREAD:
            warnings.append(f"only {len(values)} timed block(s): the spread is not meaningful")
        if median > 0 and iqr / median > SPREAD_WARNING_THRESHOLD:
            warnings.append(f"large spread: IQR is {iqr / median:.0%} of the median")
        return cls(tuple(float(t) for t in times_s), number_per_block, median,
                   float(values.mean()), iqr, p10, p90, len(values), tuple(warnings))

    def __str__(self) -> str:
        lines = [
            f"median {_seconds(self.median)} per call "
            f"(IQR {_seconds(self.iqr)}, p10 {_seconds(self.p10)}, p90 {_seconds(self.p90)}, "
            f"mean {_seconds(self.mean)})",
            f"{self.n:,} blocks of {self.number_per_block:,} calls",
        ]
        lines += [f"WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)


def _seconds(value: float) -> str:
    # Per-call times can be fractions of a nanosecond; format_time_ns rounds to 3 digits anyway.
    return format_time_ns(value * 1e9)


def benchmark(fn_or_model: Any, *inputs: Any, warmup: int = 3, min_run_time: float = 0.2,
              max_blocks: int = 10_000, clock: Callable[[], int] = time.perf_counter_ns,
              sync: Callable[[], Any] | None = None) -> Measurement:
    """Time ``fn_or_model(*inputs)`` in blocks and summarise the per-call seconds.

    Args:
        fn_or_model: a callable, or a model with a ``forward`` (called through ``__call__``
            when it is callable, so framework hooks run as they normally would).
        inputs: positional arguments for every call.
        warmup: untimed calls first (caches, lazy initialisation, allocator pools).
        min_run_time: seconds of timed blocks to collect (after calibration).
        max_blocks: stop after this many timed blocks even if ``min_run_time`` is not reached.
        clock: integer-nanosecond clock; inject a fake one in tests.
        sync: called before every clock read, e.g. ``torch.cuda.synchronize`` so that queued
            device work is inside the block it belongs to.

    Raises:
        TypeError: ``fn_or_model`` is neither callable nor has a ``forward``.
        ValueError: ``warmup``, ``min_run_time`` or ``max_blocks`` out of range.

    Example:
        >>> m = benchmark(lambda: sum(range(100)), min_run_time=0.01)
        >>> m.number_per_block >= 1 and m.median > 0
        True
    """
    fn = as_callable(fn_or_model, "fn_or_model")
    _check_count(warmup, "warmup", minimum=0)
    _check_count(max_blocks, "max_blocks", minimum=1)
    if not isinstance(min_run_time, (int, float)) or not min_run_time > 0:
        raise ValueError("min_run_time: expected a positive number of seconds, "
                         f"got {min_run_time!r}")

    def run_block(number: int) -> int:
        if sync is not None:
            sync()
        start = clock()
        for _ in range(number):
            fn(*inputs)
        if sync is not None:
            sync()
        return clock() - start

    for _ in range(warmup):
        fn(*inputs)
    budget_ns = min_run_time * 1e9
    with _gc_disabled():
        # The cost of an empty block: two clock reads (and two syncs).
        overhead_ns = float(np.median([run_block(0) for _ in range(5)]))
        number = 1
        while True:
            block_ns = run_block(number)
            # Like blocked_autorange, a calibrated block must also be a useful slice of the budget.
            long_enough = (overhead_ns <= _MAX_RELATIVE_OVERHEAD * block_ns
                           and block_ns >= budget_ns / 1000)
            if long_enough or block_ns >= budget_ns or number >= _MAX_NUMBER_PER_BLOCK:
                break
            number *= 10
        times_ns: list[int] = []
        elapsed_ns = 0
        while elapsed_ns < budget_ns and len(times_ns) < max_blocks:
            block_ns = run_block(number)
            times_ns.append(block_ns)
            elapsed_ns += block_ns
    return Measurement.from_times(tuple(t / number / 1e9 for t in times_ns), number)


def measure_latency(model: Any, x: Any, warmup: int = 10, iterations: int = 100) -> float:
    """Mean seconds per call of ``model(x)``, as the TinyTorch guide's ``measure_latency``.

    ``x`` may be a tensor (``tracetorch.core``, torch, numpy) or a shape tuple, for which a
    seeded random input is made in the model's framework
    (:func:`tracetorch.models.tensors.dummy_input`).
    The ``iterations`` calls are timed as one block with ``time.perf_counter_ns`` (one pair of
    clock reads, not one per call) with the garbage collector off. For medians and spread, use
    :func:`benchmark`.

    Raises:
        TypeError: ``model`` is neither callable nor has a ``forward``.
        ValueError: ``iterations`` is not a positive int, or ``warmup`` not an int >= 0.

    Example:
        >>> import numpy as np
        >>> measure_latency(np.tanh, np.zeros(8), warmup=1, iterations=5) > 0
        True
    """
    fn = as_callable(model, "model")
    _check_count(iterations, "iterations", minimum=1)
    _check_count(warmup, "warmup", minimum=0)
    if _is_shape(x):
        x = dummy_input(model, x, seed=0)
    for _ in range(warmup):
        fn(x)
    with _gc_disabled():
        start = time.perf_counter_ns()
        for _ in range(iterations):
            fn(x)
        elapsed_ns = time.perf_counter_ns() - start
    return elapsed_ns / iterations / 1e9


def _is_shape(x: Any) -> bool:
    return (isinstance(x, tuple) and len(x) > 0
            and all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in x))


def as_callable(obj: Any, name: str) -> Callable[..., Any]:
    """``obj`` itself when callable, else its ``forward``; a TypeError naming ``name`` otherwise.

    Calling through ``__call__`` keeps framework hooks and train/eval handling as in real use.

    Example:
        >>> as_callable(len, "fn") is len
        True
    """
    if isinstance(obj, type):
        raise TypeError(f"{name}: expected a model instance or a function, got the class "
                        f"{obj.__name__}")
    if callable(obj):
        return obj
    forward = getattr(obj, "forward", None)
    if callable(forward):
        return forward
    raise TypeError(f"{name}: expected a callable or a model with a forward method, "
                    f"got {type(obj).__name__}")


def _check_count(value: Any, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        expected = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name}: expected {expected}, got {value!r}")


@contextmanager
def _gc_disabled() -> Iterator[None]:
    """Collect now, then keep the collector off; restore its previous state on any exit."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
