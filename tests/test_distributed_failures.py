"""A distributed job that fails ends as it would without tracetorch, never hangs: real gloo ranks
on localhost where one raises, is killed, or never enters ``profile(gather=...)``; each case ends
well within 30 s (the process group's timeout is 120 s: a wait for it fails the bound), every
surviving rank's own profile is written and the missing ranks are named. And ``tracetorch run``
on each rank of a job launched through torch.distributed's environment variables, the way
torchrun launches it: a rank raising, and a run's files next to an earlier run's."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

import tracetorch as tt
from tracetorch.distributed import rank_rows

pytestmark = pytest.mark.slow

#: Every case must be over within this many seconds (the issue's bound).
BOUND_S = 30.0


@pytest.fixture
def ranks(torch):
    """The worker module (torch.distributed with gloo, required under CI)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        if os.environ.get("CI") == "true":
            pytest.fail("torch.distributed with gloo must be available in CI")
        pytest.skip("torch.distributed with gloo is not available")
    from support import ranks as module

    return module


def _spawn(ranks, world: int, *args) -> list[int | None]:
    """Run ``failing_job`` on ``world`` ranks; their exit codes (``None``: still running after
    :data:`BOUND_S`, then killed)."""
    import torch.multiprocessing as mp

    start = time.monotonic()
    context = mp.spawn(ranks.failing_job, args=(world, ranks.free_port(), *args), nprocs=world,
                       join=False)
    codes = []
    for process in context.processes:
        process.join(max(0.0, BOUND_S - (time.monotonic() - start)))
        codes.append(process.exitcode)
    for process in context.processes:
        if process.exitcode is None:
            process.kill()
            process.join()
    return codes


def _warned(path: str, rank: int) -> str:
    with open(f"{path}.rank{rank}.warnings", encoding="utf-8") as f:
        return f.read()


def test_a_rank_raising_mid_training_ends_the_job_with_every_profile_written(ranks, tmp_path):
    path = str(tmp_path / "job.json")
    codes = _spawn(ranks, 3, path, 1, "raise")
    # as without tracetorch: rank 1 raises, the others' next collective fails
    assert codes == [1, 1, 1]
    for rank in range(3):
        own = tt.load(str(tmp_path / f"job.rank{rank}.json"))
        assert own.meta["distributed"]["rank"] == rank
        assert own.find("0").calls >= 1
    assert "rank 1: profiles not gathered: rank 1 failed" in _warned(path, 1)


def test_a_rank_killed_mid_training_ends_the_job_with_the_survivors_profiles(ranks, tmp_path):
    path = str(tmp_path / "job.json")
    codes = _spawn(ranks, 2, path, 1, "kill")
    assert codes == [1, -9]
    assert tt.load(str(tmp_path / "job.rank0.json")).meta["distributed"]["rank"] == 0
    assert not (tmp_path / "job.rank1.json").exists()


def test_a_rank_that_never_enters_the_gathering_profile_is_named_not_waited_for(ranks, tmp_path):
    path = str(tmp_path / "job.json")
    assert _spawn(ranks, 2, path, 1, "absent") == [0, 0]
    merged = tt.load(path)
    facts = merged.meta["distributed"]
    assert facts["missing_ranks"] == [1] and sorted(rank_rows(merged)) == [0]
    assert merged.find("0").calls == ranks.STEPS
    assert tt.load(str(tmp_path / "job.rank0.json")).find("0").calls == ranks.STEPS
    warned = _warned(path, 0)
    assert "rank 1 never entered the profile" in warned and "missing 1" in warned


def _launch(tmp_path, world: int, *script_args: int) -> list[subprocess.CompletedProcess]:
    """``python -m tracetorch run -o job.json rank_script.py ARGS`` on ``world`` ranks, launched
    as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)."""
    from support.ranks import free_port

    script = os.path.join(os.path.dirname(__file__), "support", "rank_script.py")
    port = str(free_port())
    processes = [subprocess.Popen(
        [sys.executable, "-m", "tracetorch", "run", "-o", "job.json", script,
         *(str(a) for a in script_args)],
        cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
                        "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": port}) for rank in range(world)]
    start, done = time.monotonic(), []
    try:
        for process in processes:
            out, err = process.communicate(timeout=max(1.0, BOUND_S - (time.monotonic() - start)))
            done.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    return done


def test_tracetorch_run_on_ranks_where_one_raises_ends_as_the_script_would(ranks, tmp_path):
    first, second = _launch(tmp_path, 2, 3, 1, -1)
    assert (first.returncode, second.returncode) == (1, 1), first.stderr + second.stderr
    assert "rank 1 fails mid-training" in second.stderr
    assert tt.load(str(tmp_path / "job.rank0.json")).meta["distributed"]["rank"] == 0
    assert tt.load(str(tmp_path / "job.rank1.json")).meta["distributed"]["rank"] == 1


def test_a_late_rank_is_waited_for_not_replaced_by_an_earlier_runs_file(ranks, tmp_path):
    # the first run: 2 steps per rank, its files left in the folder
    assert [p.returncode for p in _launch(tmp_path, 2, 2, -1, -1)] == [0, 0]
    earlier = tt.load(str(tmp_path / "job.rank1.json")).meta["distributed"]["job"]
    assert earlier is not None
    # the same command with 3 steps; rank 1 writes its file last
    runs = _launch(tmp_path, 2, 3, -1, 1)
    assert [p.returncode for p in runs] == [0, 0], runs[0].stderr
    merged = tt.load(str(tmp_path / "job.json"))
    assert sorted(rank_rows(merged)) == [0, 1]
    assert merged.meta["distributed"]["job"] != earlier
    assert merged.find("0").calls == 2 * 3  # not 3 + 2: the earlier run's rank 1


def test_torchrun_with_a_rank_raising_fails_as_fast_as_without_tracetorch(ranks, tmp_path):
    from support.processes import run_captured

    script = os.path.join(os.path.dirname(__file__), "support", "rank_script.py")
    start = time.monotonic()
    try:
        done = run_captured(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             "2", "-m", "tracetorch", "run", "-o", "job.json", script, "3", "1", "-1"],
            tmp_path, timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job still ran after {time.monotonic() - start:.0f} s")
    assert done.returncode == 1, done.stderr  # torchrun's status for a failed worker
    assert "rank 1 fails mid-training" in done.stderr
    # the failed rank's own profile, of this launch: torchrun's run id (a fresh uuid with
    # --standalone) and restart count (rank 0 may be stopped by torchrun before it writes its)
    own = tt.load(str(tmp_path / "job.rank1.json")).meta["distributed"]
    assert own["rank"] == 1 and re.fullmatch(r"[0-9a-f-]{36}\.0", own["job"])
