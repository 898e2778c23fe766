"""Real ranks: 2 and 3 processes spawned with torch.multiprocessing, gloo on CPU, training a small
model with DDP under tracetorch.profile; one rank is slowed on purpose (a layer whose forward
waits) and must be named the straggler. The ranks write files; the assertions run here."""
from __future__ import annotations

import json
import os

import pytest

import tracetorch as tt
from tracetorch.cli.main import main
from tracetorch.distributed import collective_sites, node_spreads, rank_rows
from tracetorch.report.ranks_trace import export_ranks_chrome_trace

pytestmark = pytest.mark.slow


@pytest.fixture
def ranks(torch):
    """The worker module (imports torch and torch.distributed), skipped where gloo is missing
    locally, never under CI."""
    import torch.distributed as dist
    import torch.multiprocessing  # noqa: F401

    if not dist.is_available() or not dist.is_gloo_available():
        if os.environ.get("CI") == "true":
            pytest.fail("torch.distributed with gloo must be available in CI")
        pytest.skip("torch.distributed with gloo is not available")
    from support import ranks as module

    return module


def _spawn(ranks, job, world: int, *args) -> list[int]:
    """Run ``job`` on ``world`` ranks and wait for every one (a rank that dies does not take
    the others down, as ``mp.spawn(join=True)`` would); their exit codes."""
    import torch.multiprocessing as mp

    context = mp.spawn(job, args=(world, ranks.free_port(), *args), nprocs=world, join=False)
    for process in context.processes:
        process.join(120)
    return [process.exitcode for process in context.processes]


def _reference(ranks):
    """The same model's steps in one process: the calls and FLOPs each rank must have."""
    with tt.profile() as prof:
        ranks.train(ranks.build_model(), prof)
    return prof


def _params(ranks) -> list[int]:
    return [p.numel() * p.element_size() for p in ranks.build_model().parameters()]


def test_two_ranks_are_one_report_that_names_the_slowed_rank(ranks, tmp_path):
    path = str(tmp_path / "job.json")
    assert _spawn(ranks, ranks.ddp_job, 2, path, 1, None, False) == [0, 0]
    merged = tt.load(path)
    facts = merged.meta["distributed"]
    assert facts["world_size"] == 2 and facts["missing_ranks"] == []
    rows = rank_rows(merged)
    assert sorted(rows) == [0, 1]
    reference = _reference(ranks)
    layer_calls = sum(n.calls for n in reference.nodes() if n.kind == "module")
    for row in rows.values():
        assert (row["backend"], row["device"], row["aligned_by"]) == ("gloo", "cpu", "barrier")
        # the DDP wrapper's node is the one call more per step than the model alone makes
        assert row["layer_calls"] == layer_calls + ranks.STEPS
        assert (row["forward_flops"], row["backward_flops"]) == (
            reference.forward_flops, reference.backward_flops)
        assert row["steps"] == ranks.STEPS
    # the layers keep the model's own names, the model "" as named_modules() has it: no
    # "module." level
    assert {n.path for n in merged.nodes() if n.kind == "module"} >= {"", "0", "1", "2", "3"}
    assert not any(".module" in n.path for n in merged.nodes())
    layer = merged.find("0")
    assert layer.calls == 2 * ranks.STEPS
    assert node_spreads(merged)[layer].total.ranks == 2
    # DDP's default buckets: the whole model (far below 25 MiB) in one bucket per step
    sites = {(s.path, s.op): s for s in collective_sites(merged)}
    bucket = sites[("backward", "all_reduce")]
    assert bucket.calls == 2 * ranks.STEPS
    assert bucket.bytes == 2 * ranks.STEPS * sum(_params(ranks))
    mine = sites[("", "all_reduce")]
    assert (mine.calls, mine.bytes, mine.async_calls) == (2, 2 * 10 * 4, 2)
    assert merged.find("backward.all_reduce").calls == 2 * ranks.STEPS
    straggler = facts["straggler"]
    assert straggler["rank"] == 1
    assert straggler["layers"][0]["path"] == "2"
    # The HTML report shows the ranks side by side and each layer across them.
    from tracetorch.report.html import page_data

    shown = page_data(merged)[1]["ranks"]
    assert sorted(shown["ranks"]) == ["0", "1"] and shown["straggler"]["rank"] == 1
    slowest = shown["spreads"]["2"]
    assert slowest[3] == 1 and slowest[0] <= slowest[1] <= slowest[2]
    # each rank's own profile, beside the merge, for `report --rank N`
    assert facts["rank_files"] == {"0": "job.rank0.json", "1": "job.rank1.json"}
    one = tt.load(str(tmp_path / "job.rank1.json"))
    assert one.meta["distributed"]["rank"] == 1
    assert one.find("0").calls == ranks.STEPS


def test_three_ranks_up_a_tree_with_a_bucket_per_parameter(ranks, tmp_path, capsys):
    path = str(tmp_path / "job.json")
    tiny = 1e-6  # a cap below every parameter: after the first step each is its own bucket
    assert _spawn(ranks, ranks.ddp_job, 3, path, 2, tiny, True) == [0, 0, 0]
    merged = tt.load(path)
    assert sorted(rank_rows(merged)) == [0, 1, 2]
    sites = {(s.path, s.op): s for s in collective_sites(merged)}
    bucket = sites[("backward", "all_reduce")]
    params = _params(ranks)
    # step 1: one bucket of everything (DDP buckets by size only once it knows the order)
    assert bucket.calls == 3 * (1 + (ranks.STEPS - 1) * len(params))
    assert bucket.bytes == 3 * ranks.STEPS * sum(params)
    assert bucket.ranks.ranks == 3
    assert merged.meta["distributed"]["straggler"]["rank"] == 2
    spread = node_spreads(merged)[merged.find("2")]
    assert spread.self.slowest_rank == 2
    # the report: the merged tree and the ranks; --rank N: one rank's own profile
    assert main(["report", path]) == 0
    out = capsys.readouterr().out
    assert "Ranks: 3 of 3" in out and "straggler: rank 2:" in out
    assert main(["report", path, "--rank", "1"]) == 0
    out = capsys.readouterr().out
    assert "0 (Linear)" in out and "Ranks:" not in out  # one rank's tree, no ranks section
    assert main(["report", path, "--rank", "7"]) == 2
    # one Chrome trace with one process per rank
    trace = str(tmp_path / "job.trace.json")
    export_ranks_chrome_trace(path, trace)
    events = json.load(open(trace))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}


def test_ranks_meet_through_files_when_the_group_is_gone(ranks, tmp_path):
    path = str(tmp_path / "job.json")
    assert _spawn(ranks, ranks.files_job, 2, path, -1) == [0, 0]
    merged = tt.load(path)
    assert sorted(rank_rows(merged)) == [0, 1]
    assert all(row["aligned_by"] == "first collective" for row in rank_rows(merged).values())


def test_a_crashed_rank_leaves_the_others_profiles(ranks, tmp_path):
    path = str(tmp_path / "job.json")
    assert _spawn(ranks, ranks.files_job, 2, path, 1) == [0, 3]
    assert os.path.exists(tmp_path / "job.rank0.json")
    assert not os.path.exists(tmp_path / "job.rank1.json")
    merged = tt.load(path)
    assert merged.meta["distributed"]["missing_ranks"] == [1]
    assert sorted(rank_rows(merged)) == [0]


def test_torchrun_runs_tracetorch_run_on_every_rank(ranks, tmp_path):
    import sys

    from support.processes import run_captured

    script = os.path.join(os.path.dirname(__file__), "..", "examples", "ddp_train.py")
    done = run_captured(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "tracetorch", "run", "-o", "job.json", "--peak-flops", "1e12", "--bandwidth",
         "1e11", script, "--steps", "3"],
        tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "rank 0: trained 3 steps" in done.stdout and "rank 1: trained 3 steps" in done.stdout
    assert "Ranks: 2 of 2" in done.stderr and "straggler: rank 1:" in done.stderr
    assert "Bottlenecks" in done.stderr  # the job's report measures against the machine given
    merged = tt.load(str(tmp_path / "job.json"))
    assert merged.machine is not None and merged.machine.peak_flops == 1e12
    assert sorted(rank_rows(merged)) == [0, 1]
    assert merged.find("0").calls == 2 * 3
    assert (tmp_path / "job.rank1.json").exists()
