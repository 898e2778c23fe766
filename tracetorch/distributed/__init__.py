"""Profiling ``torch.distributed`` jobs as one: rank facts, collectives, gathering, merging and
the straggler. Their views are renderers like any other: :mod:`tracetorch.report.ranks` (text)
and :mod:`tracetorch.report.ranks_trace` (one Chrome trace, a process per rank).

Nothing here imports torch: the parts that need ``torch.distributed`` import it when a profile
runs under an initialized process group (or under ``torchrun``), which implies it is loaded.

Example:
    >>> from tracetorch.distributed import merge_profiles, find_straggler
    >>> merge_profiles([]).meta["distributed"]["world_size"]
    0
"""
from __future__ import annotations

from tracetorch.distributed.gather import gather_profiles, rank_file
from tracetorch.distributed.merge import RankMerge, merge_profiles, tree_merge
from tracetorch.distributed.merged import (
    CollectiveSite,
    NodeSpread,
    collective_sites,
    node_spreads,
    rank_rows,
)
from tracetorch.distributed.spread import EXACT_RANKS, Spread
from tracetorch.distributed.straggler import LayerExcess, Straggler, find_straggler

__all__ = ("CollectiveSite", "EXACT_RANKS", "LayerExcess", "NodeSpread", "RankMerge", "Spread",
           "Straggler", "collective_sites", "find_straggler", "gather_profiles", "merge_profiles",
           "node_spreads", "rank_file", "rank_rows", "tree_merge")
