"""Which training steps a profile records: skip the first steps, warm up, record, repeat.

Modelled on ``torch.profiler.schedule``: each cycle is ``wait`` steps ignored, ``warmup`` steps
run under the profiler but thrown away (caches, lazy initialisation and allocator growth settle
there), then ``active`` steps recorded; ``repeat`` cycles (0 = for ever). Memory stays bounded
however long the run, because everything is aggregated per node and warm-up data is dropped.

Example:
    >>> s = schedule(wait=1, warmup=1, active=2, repeat=1)
    >>> [s(step) for step in range(6)]
    ['wait', 'warmup', 'active', 'active', 'done', 'done']
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ("schedule", "Phase")

#: ``"wait"`` (not recorded), ``"warmup"`` (recorded, discarded), ``"active"`` or ``"done"``.
Phase = str


@dataclass(frozen=True)
class schedule:  # spelled like torch.profiler.schedule
    """Maps a step index (0 = the first step) to its :data:`Phase`."""

    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 0

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "active", "repeat"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"schedule {name} must be a non-negative int, got {value!r}")
        if self.active < 1:
            raise ValueError(f"schedule active must be at least 1, got {self.active!r}")

    def __call__(self, step: int) -> Phase:
        cycle = self.wait + self.warmup + self.active
        if self.repeat and step >= cycle * self.repeat:
            return "done"
        position = step % cycle
        if position < self.wait:
            return "wait"
        if position < self.wait + self.warmup:
            return "warmup"
        return "active"
