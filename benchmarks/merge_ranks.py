"""What merging a job's profiles costs: 1,000 ranks' synthetic trees merged in one process.

Each rank's tree is made as a rank would send it (a versioned dict, timeline left out), then
merged on "rank 0" the two ways ``tracetorch.distributed`` does: one at a time (``gather_object``
to rank 0) and up a binary tree (here a binary counter of partial merges, which holds what the
ranks on one path of the tree hold: O(log ranks) merges of O(nodes) each). Reported: merge time
per rank and per node, peak memory of the merge (tracemalloc; the trees are made one at a time
inside the loop, so that peak is what rank 0 holds), and the payload a rank sends at the end of
its run (its dict, pickled, and the time to make it). With torch installed it also prints what
the collectives mode costs every tensor operation under a process group.

    python benchmarks/merge_ranks.py            # 1,000 ranks, trees of 100 and 300 nodes
    python benchmarks/merge_ranks.py --quick    # 20 ranks, smaller trees (the smoke test)
"""
from __future__ import annotations

import argparse
import pickle
import random
import statistics
import time
import tracemalloc
from typing import Any

from tracetorch.distributed import RankMerge, find_straggler
from tracetorch.records.result import ProfileResult
from tracetorch.records.stats import TimeStats
from tracetorch.records.tree import CallNode


def rank_tree(rank: int, nodes: int, calls: int, rng: random.Random) -> ProfileResult:
    """A model of ``nodes`` layers (blocks of 8 under a root module), ``calls`` calls each."""
    root = CallNode.root()
    model = root.child("model", "Model", "m0")
    block = model
    for i in range(nodes - 1):
        if i % 9 == 0:
            block = model.child(f"block{i // 9}", "Block", f"b{i}")
            node = block
        else:
            node = block.child(f"fc{i % 9}", "Linear", f"m{i}")
            node.flops = 2_000 * calls
            node.flops_source = "rule"
        slow = 1.5 if rank == 7 and i == 5 else 1.0
        for _ in range(calls):
            node.time.add(int(rng.uniform(900, 1_100) * slow))
    for _ in range(calls):
        model.time.add(nodes * 1_200)
    steps = TimeStats(10_000)
    for _ in range(calls):
        steps.add(nodes * 1_300)
    facts = {"rank": rank, "world_size": 0, "host": f"node{rank // 8}", "device": "cuda:0",
             "backend": "nccl", "compute_ns": int(rng.uniform(9e8, 1e9)),
             "collective_ns": 1_000_000, "elapsed_ns": 2_000_000_000}
    return ProfileResult(root, step_times=steps, meta={"distributed": facts})


def payload(rank: int, nodes: int, calls: int, world: int) -> dict[str, Any]:
    result = rank_tree(rank, nodes, calls, random.Random(rank))
    result.meta["distributed"]["world_size"] = world
    return result.to_dict()


def merge_one_by_one(world: int, nodes: int, calls: int) -> RankMerge:
    state = RankMerge()
    for rank in range(world):
        state.merge(RankMerge.of(ProfileResult.from_dict(payload(rank, nodes, calls, world)),
                                    adopt=True))
    return state


def merge_as_tree(world: int, nodes: int, calls: int) -> RankMerge:
    partial: list[tuple[int, RankMerge]] = []  # (ranks held, merge): a binary counter
    for rank in range(world):
        size, state = 1, RankMerge.of(ProfileResult.from_dict(payload(rank, nodes, calls, world)),
                                    adopt=True)
        while partial and partial[-1][0] == size:
            other_size, other = partial.pop()
            other.merge(state)
            size, state = size + other_size, other
        partial.append((size, state))
    while len(partial) > 1:
        size, state = partial.pop()
        partial[-1][1].merge(state)
    return partial[0][1]


def timed(merge: Any, world: int, nodes: int, calls: int) -> tuple[float, RankMerge]:
    start = time.perf_counter()
    state = merge(world, nodes, calls)
    return time.perf_counter() - start, state


def peak_memory(merge: Any, world: int, nodes: int, calls: int) -> int:
    """Peak bytes traced while merging (a separate run: tracemalloc slows every allocation)."""
    tracemalloc.start()
    merge(world, nodes, calls)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def making_cost(world: int, nodes: int, calls: int) -> float:
    """Seconds spent making the ranks' dicts alone (the ranks' share, which the merge loops
    include; reading each dict back is rank 0's, and counts as merging)."""
    start = time.perf_counter()
    for rank in range(world):
        payload(rank, nodes, calls, world)
    return time.perf_counter() - start


def mode_cost(repeats: int) -> str:
    try:
        import torch

        from tracetorch.distributed.mode import CollectiveMode
    except ImportError:
        return "collectives mode: torch not installed"
    x = torch.ones(8)

    def per_op() -> float:
        start = time.perf_counter_ns()
        for _ in range(repeats):
            x.add(x)
        return (time.perf_counter_ns() - start) / repeats

    plain, moded = [], []
    for _ in range(5):
        plain.append(per_op())
        with CollectiveMode(time.perf_counter_ns):
            moded.append(per_op())
    p, m = statistics.median(plain), statistics.median(moded)
    return (f"collectives mode: a tensor op (torch.add, 8 floats, CPU) {p / 1000:.2f} us plain, "
            f"{m / 1000:.2f} us under the mode: +{(m - p) / 1000:.2f} us per op (medians of 5)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 ranks, small trees")
    args = parser.parse_args()
    world, sizes, calls = (20, (20, 60), 3) if args.quick else (1_000, (100, 300), 10)
    print(f"merging {world} ranks' trees ({calls} calls per node), one process")
    for nodes in sizes:
        making = making_cost(world, nodes, calls)
        seconds, state = timed(merge_one_by_one, world, nodes, calls)
        merging = max(seconds - making, 0.0)
        straggler = find_straggler(state.result())
        print(f"{nodes:>5} nodes: merge {merging / world * 1e3:.2f} ms per rank "
              f"({merging / world / nodes * 1e6:.1f} us per node per rank; {seconds:.1f} s in "
              f"all, {making:.1f} s of it making the ranks' dicts); {len(state.ranks)} ranks, "
              f"straggler rank {straggler.rank if straggler else '-'}")
        for name, merge in (("one by one", merge_one_by_one), ("as a tree", merge_as_tree)):
            peak = peak_memory(merge, world, nodes, calls)
            print(f"{nodes:>5} nodes, {name}: peak {peak / 2**20:.1f} MiB traced "
                  f"({peak / nodes / 1024:.1f} KiB per node)")
        start = time.perf_counter()
        data = payload(0, nodes, calls, world)
        made = time.perf_counter() - start
        size = len(pickle.dumps(data))
        print(f"{nodes:>5} nodes, gather payload per rank: {size / 1024:.1f} KiB pickled "
              f"({size / nodes:.0f} B per node), {made * 1e3:.1f} ms to make; gather_object "
              f"hands rank 0 all {world} at once: {world * size / 2**20:.1f} MiB")
    print(mode_cost(2_000 if args.quick else 20_000))


if __name__ == "__main__":
    main()
