"""A fake clock for timing tests: no sleeps, every duration a whole number of ticks."""
from __future__ import annotations

#: Nanoseconds per read of :class:`Ticks`.
TICK = 1_000


class Ticks:
    """An integer-ns clock that advances one :data:`TICK` per read."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += TICK
        return self.now
