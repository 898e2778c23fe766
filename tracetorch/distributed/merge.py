"""One profile for the whole job: the per-rank trees reduced into mergeable per-node statistics.

:class:`RankMerge` is the state of a merge. Each node of its tree holds what the engine's nodes
hold, summed over ranks (calls, FLOPs, per-call :class:`~tracetorch.records.stats.TimeStats`), plus
a :class:`~tracetorch.distributed.spread.Spread` of the node's per-rank inclusive and self time
(min / median / max across ranks, the slowest rank). Beside the tree it keeps a few numbers per
rank (step times, compute time, time in collectives, calls and FLOPs) and the collectives, one
site per (call path, operation). So the state costs O(nodes) plus O(1) per rank, never
O(ranks × nodes), and :meth:`RankMerge.merge` is associative: ranks can be merged one at a time,
or pairwise up a tree (:func:`tree_merge`), with the same result.

Nodes are matched across ranks by call path *and* type: a rank whose layer at ``0`` is a
``Conv1d`` where another's is a ``Linear`` keeps both, the second named ``0#2`` as a profile
names two layers called at one name. Profiles of different runs (their ``job`` ids differ: see
:func:`~tracetorch.distributed.meet.job_id`) are refused.

A merged profile is a normal profile (``tt.load`` and ``tracetorch report`` read it); what is
only true of a merge lives under ``result.meta["distributed"]`` (``"merged": True``): the rank
rows under ``"ranks"``, the nodes' spreads under ``"nodes"`` (one per node, in the order of a
depth-first walk of the saved tree; the root's is ``None``) and the collective sites.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> def rank_profile(rank, ns):
    ...     root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(ns)
    ...     return ProfileResult(root, meta={"distributed": {"rank": rank, "world_size": 2}})
    >>> merged = merge_profiles([rank_profile(0, 100), rank_profile(1, 300)])
    >>> fc = merged.find("fc")
    >>> fc.calls, fc.total_ns
    (2, 400)
    >>> from tracetorch.distributed.merged import node_spreads
    >>> spread = node_spreads(merged)[fc].total
    >>> spread.min_ns, spread.max_ns, spread.slowest_rank
    (100, 300, 1)
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tracetorch.distributed.merged import META_KEY, CollectiveSite, NodeSpread
from tracetorch.distributed.straggler import find_straggler
from tracetorch.engine.fold import merge_below
from tracetorch.records.result import EXACT_STEPS, ProfileResult
from tracetorch.records.stats import TimeStats
from tracetorch.records.tree import CallNode

__all__ = ("RankMerge", "merge_profiles", "tree_merge")


#: Per-rank numbers copied from a rank's own facts into its row of the merge.
_FACTS = ("host", "device", "backend", "local_rank", "pid", "aligned_by", "aligned_at_ns",
          "compute_ns",
          "collective_ns", "elapsed_ns")


class RankMerge:
    """The state of a merge of rank profiles (see the module docstring).

    Example:
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> state = RankMerge()
        >>> for rank in (0, 1):
        ...     root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(10 + rank)
        ...     state.add(ProfileResult(root), rank=rank)
        >>> sorted(state.ranks), state.result().find("fc").calls
        ([0, 1], 2)
    """

    def __init__(self) -> None:
        self.root = CallNode.root()
        self.nodes: dict[CallNode, NodeSpread] = {}
        self.ranks: dict[int, dict[str, Any]] = {}
        self.collectives: dict[tuple[str, str], CollectiveSite] = {}
        self.step_times = TimeStats(EXACT_STEPS)
        self.unsupported: dict[str, int] = {}
        self.dropped_events = 0
        self.world_size = 0
        #: The run the merged profiles belong to (``None``: not recorded).
        self.job: str | None = None
        #: Run facts of the lowest rank merged (tracetorch's, the clock's), for the result.
        self.meta: dict[str, Any] = {}
        self._meta_rank: int | None = None

    # ------------------------------------------------------------------ building
    def add(self, result: ProfileResult, rank: int | None = None) -> None:
        """Merge one rank's profile (its rank from ``meta["distributed"]["rank"]`` unless given)
        or an earlier merge's result.

        Raises:
            ValueError: the rank is neither given nor recorded, or was merged already.
        """
        self.merge(RankMerge.of(result, rank))

    @classmethod
    def of(cls, result: ProfileResult, rank: int | None = None, *,
           adopt: bool = False) -> RankMerge:
        """The merge state of one profile: a rank's own, or a merged one (which it restores).

        ``adopt=True`` takes a rank's tree itself rather than a copy (half the work, for a
        profile read only to be merged: the merge then changes it).

        Raises:
            ValueError: a rank's profile without a rank (``rank`` not given either).
        """
        facts = result.meta.get(META_KEY)
        facts = dict(facts) if isinstance(facts, dict) else {}
        state = cls()
        state.step_times.merge(_copy_stats(result.step_times))
        state.unsupported = dict(result.unsupported)
        state.dropped_events = int(result.dropped_events)
        state.meta = {k: v for k, v in result.meta.items() if k not in (META_KEY, "pid")}
        job = facts.get("job")
        state.job = str(job) if job is not None else None
        if facts.get("merged"):
            state._restore(result, facts)
            return state
        if rank is None:
            rank = facts.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be a non-negative int (given, or recorded in "
                             f"meta['distributed']['rank']), got {rank!r}")
        state._meta_rank = rank
        state.world_size = max(int(facts.get("world_size", 0) or 0), rank + 1)
        if adopt:
            state.root = result.root
            pairs = [(node, node) for node in result.root.walk() if node is not result.root]
        else:
            pairs = _merge_below(result.root, state.root)
        for source, node in pairs:
            state.nodes[node] = spread = NodeSpread()
            spread.add(rank, source)
        state.ranks[rank] = _rank_row(result, facts)
        for data in facts.get("collectives", ()):
            site = CollectiveSite.from_dict(data, rank)
            state.collectives[(site.path, site.op)] = site
        return state

    def _restore(self, result: ProfileResult, facts: dict[str, Any]) -> None:
        """Take back the state a merged result saved (see :meth:`result`)."""
        self.world_size = int(facts.get("world_size", 0))
        self._meta_rank = facts.get("meta_rank")
        self.ranks = {int(r): dict(row) for r, row in facts.get("ranks", {}).items()}
        saved = list(facts.get("nodes", ()))
        order = list(result.root.walk())
        if len(saved) != len(order):
            raise ValueError(f"merged profile: {len(saved)} node spreads for {len(order)} nodes")
        spreads = {id(node): data for node, data in zip(order, saved)}
        for source, node in _merge_below(result.root, self.root):
            data = spreads[id(source)]
            self.nodes[node] = NodeSpread.from_dict(data) if data else NodeSpread()
        for data in facts.get("collectives", ()):
            site = CollectiveSite.from_dict(data)
            self.collectives[(site.path, site.op)] = site

    def merge(self, other: RankMerge) -> None:
        """Fold ``other`` (disjoint ranks) into this state; ``other`` is left spent.

        Raises:
            ValueError: a rank is in both; the two are of different runs (``job``).
        """
        both = self.ranks.keys() & other.ranks.keys()
        if both:
            raise ValueError(f"rank {min(both)} is merged twice")
        if self.job is not None and other.job is not None and self.job != other.job:
            raise ValueError(f"rank {_listed(other.ranks)} of run {other.job} cannot be merged "
                             f"with rank {_listed(self.ranks)} of run {self.job}: profiles of "
                             f"different runs of the job")
        if self.job is None:
            self.job = other.job
        for source, node in _merge_below(other.root, self.root):
            mine = self.nodes.get(node)
            theirs = other.nodes.get(source)
            if mine is None:
                self.nodes[node] = theirs if theirs is not None else NodeSpread()
            elif theirs is not None:
                mine.merge(theirs)
        self.ranks.update(other.ranks)
        for key, site in other.collectives.items():
            known = self.collectives.get(key)
            if known is None:
                self.collectives[key] = site
            else:
                known.merge(site)
        self.step_times.merge(other.step_times)
        for name, calls in other.unsupported.items():
            self.unsupported[name] = self.unsupported.get(name, 0) + calls
        self.dropped_events += other.dropped_events
        self.world_size = max(self.world_size, other.world_size)
        if other._meta_rank is not None and (self._meta_rank is None
                                             or other._meta_rank < self._meta_rank):
            self.meta, self._meta_rank = other.meta, other._meta_rank
        elif not self.meta:
            self.meta = other.meta

    # ------------------------------------------------------------------ the result
    def result(self) -> ProfileResult:
        """The merged profile: a normal :class:`~tracetorch.records.result.ProfileResult`."""
        order = list(self.root.walk())
        facts: dict[str, Any] = {
            "merged": True,
            "job": self.job,
            "world_size": max(self.world_size, max(self.ranks, default=-1) + 1),
            "meta_rank": self._meta_rank,
            "ranks": {str(r): self.ranks[r] for r in sorted(self.ranks)},
            "missing_ranks": [],
            "nodes": [None] + [self.nodes[n].to_dict() if n in self.nodes else None
                               for n in order[1:]],
            "collectives": [site.to_dict() for _, site in sorted(self.collectives.items())],
        }
        facts["missing_ranks"] = [r for r in range(facts["world_size"]) if r not in self.ranks]
        result = ProfileResult(self.root, unsupported=dict(self.unsupported),
                               dropped_events=self.dropped_events,
                               step_times=_copy_stats(self.step_times),
                               meta={**self.meta, META_KEY: facts})
        straggler = find_straggler(result)
        facts["straggler"] = straggler.to_dict() if straggler is not None else None
        return result


def merge_profiles(results: Iterable[ProfileResult],
                   ranks: Sequence[int] | None = None) -> ProfileResult:
    """Merge rank profiles (or merged ones) into one profile of the job.

    Args:
        results: each rank's profile, as recorded under ``torch.distributed`` (its rank is in
            ``meta["distributed"]``) or loaded with ``tt.load``; merged profiles may be mixed in.
        ranks: the ranks of ``results`` in order, for profiles that do not record theirs.

    Raises:
        ValueError: a rank is missing or repeated; ``ranks`` does not match ``results``.
    """
    items = list(results)
    if ranks is not None and len(ranks) != len(items):
        raise ValueError(f"ranks must give one rank per result: {len(ranks)} ranks for "
                         f"{len(items)} results")
    states = [RankMerge.of(r, None if ranks is None else ranks[i]) for i, r in enumerate(items)]
    return tree_merge(states).result()


def tree_merge(states: Sequence[RankMerge]) -> RankMerge:
    """Reduce merge states pairwise, as a binary tree (what a reduction over ranks does):
    ``log2(len(states))`` rounds, each merging neighbours.

    Example:
        >>> len(tree_merge([RankMerge(), RankMerge(), RankMerge()]).ranks)
        0
    """
    level = list(states)
    if not level:
        return RankMerge()
    while len(level) > 1:
        merged = []
        for i in range(0, len(level) - 1, 2):
            level[i].merge(level[i + 1])
            merged.append(level[i])
        if len(level) % 2:
            merged.append(level[-1])
        level = merged
    return level[0]


# ---------------------------------------------------------------------- helpers
def _merge_below(source: CallNode, target: CallNode) -> list[tuple[CallNode, CallNode]]:
    """Add every node below ``source`` into ``target``'s tree, matched by call path and
    type: a child goes to the child of the same name, kind and type, else to a ``name#k`` one
    of that kind and type, else to a new ``name#k`` (the first free ``k`` from 2); no two
    children of one parent go to the same node. The (source, target) pairs, parents first.

    Example:
        >>> mine, theirs = CallNode.root(), CallNode.root()
        >>> _ = mine.child("0", "Linear", "a"), theirs.child("0", "Conv1d", "b")
        >>> [(t.name, t.type_name) for _, t in _merge_below(theirs, mine)]
        [('0#2', 'Conv1d')]
    """
    return merge_below(source, target, _counterpart)


def _counterpart(parent: CallNode, child: CallNode, taken: set[str]) -> CallNode:
    """The child of ``parent`` that ``child`` (of another rank's tree) merges into."""
    name, suffix = child.name, 2
    while True:
        node = parent.children.get(name)
        if node is None:
            return parent.child(name, child.type_name, child.module_key, child.kind)
        if (name not in taken and node.type_name == child.type_name
                and node.kind == child.kind):
            return node
        name, suffix = f"{child.name}#{suffix}", suffix + 1


def _listed(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _rank_row(result: ProfileResult, facts: dict[str, Any]) -> dict[str, Any]:
    """The few numbers a rank contributes: its facts, totals and step times."""
    row = {key: facts[key] for key in _FACTS if key in facts}
    steps = result.step_times
    layers = [n for n in result.nodes() if n.kind == "module"]
    sites = facts.get("collectives", ())
    row.update(
        layer_calls=sum(n.calls for n in layers),
        forward_flops=result.forward_flops, backward_flops=result.backward_flops,
        flops=result.total_flops, steps=steps.count, step_total_ns=steps.total_ns,
        step_median_ns=steps.quantile(0.5), step_max_ns=steps.max_ns,
        collective_calls=sum(int(s["calls"]) for s in sites),
        collective_bytes=sum(int(s["bytes"]) for s in sites),
        time_ns=result.total_time_ns)
    return row


def _copy_stats(stats: TimeStats) -> TimeStats:
    copy = TimeStats(stats.exact_limit)
    copy.merge(stats)
    return copy
