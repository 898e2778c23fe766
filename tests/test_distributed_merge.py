"""Merging rank profiles, with hand-built trees: every number is exact."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracetorch as tt
from tracetorch.distributed import (
    RankMerge,
    collective_sites,
    find_straggler,
    merge_profiles,
    node_spreads,
    rank_rows,
    tree_merge,
)
from tracetorch.records.result import ProfileResult
from tracetorch.records.stats import TimeStats
from tracetorch.records.tree import CallNode


def _site(path: str, op: str, calls: int, nbytes: int, each_ns: int) -> dict:
    time = TimeStats()
    for _ in range(calls):
        time.add(each_ns)
    return {"path": path, "op": op, "calls": calls, "bytes": nbytes, "async_calls": calls,
            "time": time.to_dict()}


def rank_profile(rank: int, fc1_ns: int = 100, *, world: int = 3, calls: int = 2,
                 extra: bool = False, compute_ns: int = 1_000, wait_ns: int = 50,
                 steps: tuple[int, ...] = (10, 20)) -> ProfileResult:
    """net(fc1, act, fc2) called ``calls`` times; fc1 takes ``fc1_ns`` per call."""
    root = CallNode.root()
    net = root.child("net", "Net", "m0")
    parts = [("fc1", "Linear", fc1_ns, 64), ("act", "ReLU", 10, 8), ("fc2", "Linear", 30, 32)]
    if extra:
        parts.append(("extra", "Dropout", 5, 0))
    for name, type_name, ns, flops in parts:
        node = net.child(name, type_name, f"m{name}")
        for _ in range(calls):
            node.time.add(ns)
        node.flops = flops * calls
        node.flops_source = "rule"
        node.backward_flops = 2 * flops * calls
    for _ in range(calls):
        net.time.add(sum(p[2] for p in parts) + 7)
    step_times = TimeStats(10_000)
    for ns in steps:
        step_times.add(ns)
    facts = {"rank": rank, "world_size": world, "host": f"host{rank // 2}", "device": "cpu",
             "backend": "gloo", "compute_ns": compute_ns, "collective_ns": wait_ns,
             "collectives": [_site("backward", "all_reduce", calls, 400 * calls, wait_ns // calls)]}
    return ProfileResult(root, step_times=step_times, meta={"timing": True, "distributed": facts})


def test_sums_over_ranks_and_spreads_across_them():
    merged = merge_profiles([rank_profile(0, 100), rank_profile(1, 400), rank_profile(2, 130)])
    fc1 = merged.find("net.fc1")
    assert (fc1.calls, fc1.total_ns, fc1.time.min_ns, fc1.time.max_ns) == (6, 1260, 100, 400)
    assert (fc1.flops, fc1.backward_flops) == (3 * 128, 3 * 256)
    spread = node_spreads(merged)[fc1]
    assert (spread.total.min_ns, spread.total.median_ns, spread.total.max_ns) == (200, 260, 800)
    assert (spread.total.slowest_rank, spread.total.fastest_rank) == (1, 0)
    assert (spread.calls_min, spread.calls_max, spread.total.ranks) == (2, 2, 3)
    assert merged.step_times.count == 6 and merged.step_times.total_ns == 90
    assert merged.meta["distributed"]["world_size"] == 3
    assert merged.meta["distributed"]["missing_ranks"] == []
    assert merged.meta["timing"] is True


def test_rank_rows_hold_each_ranks_own_totals():
    merged = merge_profiles([rank_profile(0, calls=2), rank_profile(1, calls=3, extra=True)])
    rows = rank_rows(merged)
    assert sorted(rows) == [0, 1]
    assert rows[0]["layer_calls"] == 2 * 4 and rows[1]["layer_calls"] == 3 * 5  # net + layers
    assert rows[0]["forward_flops"] == 2 * (64 + 8 + 32)
    assert rows[1]["flops"] == 3 * 3 * (64 + 8 + 32)  # forward + backward (twice forward)
    assert rows[1]["steps"] == 2 and rows[1]["step_median_ns"] == 15.0
    assert rows[0]["host"] == "host0" and rows[1]["backend"] == "gloo"
    assert rows[1]["collective_calls"] == 3 and rows[1]["collective_bytes"] == 1200


def test_a_node_some_ranks_lack_counts_only_the_ranks_that_ran_it():
    merged = merge_profiles([rank_profile(0), rank_profile(1, extra=True), rank_profile(2)])
    extra = merged.find("net.extra")
    assert extra.calls == 2
    assert node_spreads(merged)[extra].total.ranks == 1
    assert [c for c in merged.find("net").children] == ["fc1", "act", "fc2", "extra"]


def test_collective_sites_sum_bytes_and_spread_the_wait():
    merged = merge_profiles([rank_profile(r, wait_ns=w) for r, w in enumerate((60, 20, 90))])
    (site,) = collective_sites(merged)
    assert (site.path, site.op, site.calls, site.bytes) == ("backward", "all_reduce", 6, 2400)
    assert (site.ranks.min_ns, site.ranks.max_ns, site.ranks.fastest_rank) == (20, 90, 1)
    assert site.time.count == 6 and site.time.total_ns == 2 * (30 + 10 + 45)


def test_the_straggler_is_the_rank_with_most_compute_with_its_layers():
    ranks = [rank_profile(0, 100, compute_ns=1_000, wait_ns=500),
             rank_profile(1, 900, compute_ns=2_600, wait_ns=40),
             rank_profile(2, 120, compute_ns=1_200, wait_ns=450)]
    straggler = find_straggler(merge_profiles(ranks))
    assert straggler is not None and straggler.rank == 1
    assert (straggler.compute_ns, straggler.others_median_ns, straggler.excess_ns) == (
        2_600, 1_100.0, 1_500.0)
    assert (straggler.wait_ns, straggler.others_wait_median_ns) == (40, 475.0)
    assert [layer.path for layer in straggler.layers] == ["net.fc1"]
    # fc1's self time: 1800 on rank 1 against 200 and 240 on the others
    assert straggler.layers[0].excess_ns == 1_800 - 220
    assert pytest.approx(straggler.excess_ratio) == 1_500 / 1_100


def test_the_saved_merge_names_the_straggler_and_loads_back(tmp_path):
    merged = merge_profiles([rank_profile(0, compute_ns=5), rank_profile(1, compute_ns=9)])
    path = tmp_path / "job.json"
    merged.save(str(path))
    loaded = tt.load(str(path))
    assert loaded.meta["distributed"]["straggler"]["rank"] == 1
    assert loaded.find("net.fc1").calls == 4
    assert node_spreads(loaded)[loaded.find("net.fc1")].total.max_ns == 200


def test_one_rank_has_no_straggler():
    assert find_straggler(merge_profiles([rank_profile(0)])) is None


def test_a_saved_merge_merges_on_with_more_ranks(tmp_path):
    whole = merge_profiles([rank_profile(r, 100 + 50 * r) for r in range(4)])
    path = tmp_path / "half.json"
    merge_profiles([rank_profile(0, 100), rank_profile(1, 150)]).save(str(path))
    rest = merge_profiles([tt.load(str(path)), rank_profile(2, 200), rank_profile(3, 250)])
    assert _projection(rest) == _projection(whole)


def test_missing_ranks_are_named():
    merged = merge_profiles([rank_profile(0, world=4), rank_profile(2, world=4)])
    assert merged.meta["distributed"]["missing_ranks"] == [1, 3]


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="rank 1 is merged twice"):
        merge_profiles([rank_profile(1), rank_profile(1)])
    with pytest.raises(ValueError, match="rank must be a non-negative int"):
        merge_profiles([ProfileResult(CallNode.root())])
    with pytest.raises(ValueError, match="one rank per result"):
        merge_profiles([ProfileResult(CallNode.root())], ranks=[0, 1])
    with pytest.raises(ValueError, match="not a merged profile"):
        node_spreads(ProfileResult(CallNode.root()))


def test_plain_profiles_merge_with_ranks_given():
    roots = []
    for ns in (5, 7):
        root = CallNode.root()
        root.child("fc", "Linear", "m0").time.add(ns)
        roots.append(ProfileResult(root))
    merged = merge_profiles(roots, ranks=[3, 4])
    assert sorted(rank_rows(merged)) == [3, 4]
    assert node_spreads(merged)[merged.find("fc")].total.slowest_rank == 4


def test_merging_leaves_the_rank_profiles_as_they_were():
    ranks = [rank_profile(0), rank_profile(1)]
    before = [r.to_dict() for r in ranks]
    merge_profiles(ranks)
    assert [r.to_dict() for r in ranks] == before


def _projection(result: ProfileResult) -> dict:
    """What a merge must agree on whatever its order (float moments aside)."""
    spreads = node_spreads(result)
    out: dict = {}
    for node in result.nodes():
        sp = spreads[node]
        out[node.path] = (node.calls, node.total_ns, node.time.min_ns, node.time.max_ns,
                          node.flops, node.backward_flops, sp.total.min_ns, sp.total.median_ns,
                          sp.total.max_ns, sp.total.slowest_rank, sp.self.slowest_rank,
                          sp.calls_min, sp.calls_max)
    facts = result.meta["distributed"]
    out["ranks"] = facts["ranks"]
    out["straggler"] = facts["straggler"]
    out["steps"] = (result.step_times.count, result.step_times.total_ns,
                    result.step_times.quantile(0.5))
    out["sites"] = [(s.calls, s.bytes, s.ranks.slowest_rank) for s in collective_sites(result)]
    return out


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 1_000), min_size=1, max_size=9), st.randoms())
def test_any_order_and_grouping_gives_the_same_merge(times: list[int], rnd: random.Random):
    ranks = [rank_profile(r, t, world=len(times), compute_ns=t, extra=bool(r % 3 == 1))
             for r, t in enumerate(times)]
    reference = _projection(merge_profiles(ranks))
    shuffled = list(ranks)
    rnd.shuffle(shuffled)
    one_by_one = RankMerge()
    for result in shuffled:
        one_by_one.add(result)
    assert _projection(one_by_one.result()) == reference
    states = [RankMerge.of(r) for r in shuffled]
    assert _projection(tree_merge(states).result()) == reference


def _one_layer(rank: int, type_name: str, flops: int, ns: int, job: str | None = "j1"):
    """A rank whose only layer, at path ``0``, is a ``type_name`` costing ``flops`` per call."""
    root = CallNode.root()
    node = root.child("0", type_name, f"m{rank}")
    node.time.add(ns)
    node.flops, node.flops_source = flops, "rule"
    return ProfileResult(root, meta={"timing": True, "distributed": {
        "rank": rank, "world_size": 2, "job": job}})


def test_different_layer_types_at_one_path_stay_apart_in_the_tree_and_the_html():
    from tracetorch.report.html import page_data

    # rank 0: Linear(16, 32) on 8 rows at "0", 2*8*16*32 = 8192 FLOPs; rank 1: a Conv1d there
    # costing 3000 (hand-set): two nodes, each its own rank's call and FLOPs, none summed
    merged = merge_profiles([_one_layer(0, "Linear", 8192, 100),
                             _one_layer(1, "Conv1d", 3000, 300)])
    rows = {(n.name, n.type_name): (n.calls, n.flops) for n in merged.root.children.values()}
    assert rows == {("0", "Linear"): (1, 8192), ("0#2", "Conv1d"): (1, 3000)}
    spreads = node_spreads(merged)
    assert spreads[merged.find("0")].total.slowest_rank == 0
    assert spreads[merged.find("0#2")].total.slowest_rank == 1
    shown = page_data(merged)[1]["ranks"]["spreads"]
    assert shown["0"] == [100, 100, 100, 0] and shown["0#2"] == [300, 300, 300, 1]
    # the same merge again (saved and loaded, or merged on) keeps them apart, not a third node
    again = merge_profiles([merged, _one_layer(2, "Conv1d", 3000, 200)])
    assert sorted((n.name, n.calls) for n in again.root.children.values()) == [
        ("0", 1), ("0#2", 2)]


def test_profiles_of_another_run_are_refused_and_the_job_is_kept():
    assert merge_profiles([_one_layer(0, "Linear", 1, 1), _one_layer(1, "Linear", 1, 1)]
                          ).meta["distributed"]["job"] == "j1"
    with pytest.raises(ValueError, match="rank 1 of run j0 cannot be merged with rank 0 of run "
                                         "j1"):
        merge_profiles([_one_layer(0, "Linear", 1, 1), _one_layer(1, "Linear", 1, 1, "j0")])


def test_a_gather_through_files_skips_an_earlier_runs_rank_file(tmp_path):
    from tracetorch.distributed import gather_profiles, rank_file

    path = str(tmp_path / "job.json")
    _one_layer(1, "Linear", 5, 5, job="earlier").save(rank_file(path, 1))
    with pytest.warns(RuntimeWarning, match=r"of another run than this one \(job j1\)"):
        merged = gather_profiles(_one_layer(0, "Linear", 5, 5), path, timeout=0.0)
    assert merged is not None and merged.meta["distributed"]["missing_ranks"] == [1]
    assert sorted(rank_rows(merged)) == [0]
