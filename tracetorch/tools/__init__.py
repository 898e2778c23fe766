"""The tools beside the profiler: a careful latency benchmark and one-shot FLOP counting.

* :mod:`.bench` — warm-up, blocked timing, median and spread of a whole model's latency.
* :mod:`.flop_count` — ``count_flops``: FLOPs of one forward pass (it runs a profile).
"""
from __future__ import annotations

__all__: tuple[str, ...] = ()
