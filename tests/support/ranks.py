"""What each rank of the real-process tests runs (spawned with ``torch.multiprocessing``, gloo on
CPU): a small model trained with DDP under ``tracetorch.profile``, one rank slowed on purpose by
a layer whose forward waits (the injected delay the straggler analysis must find)."""
from __future__ import annotations

import os
import signal
import socket
import time
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import tracetorch as tt

STEPS = 3
BATCH = 8
#: The injected delay of the slowed rank's forward, per call.
DELAY_S = 0.04


class Delay(torch.nn.Module):
    """Identity, after waiting ``seconds`` (0 on every rank but the slowed one)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)  # the straggler's extra work, not a timing assertion
        return x


tt.flop_rule(Delay)(None)  # free: it computes nothing


def build_model(delay: float = 0.0) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), Delay(delay),
                               torch.nn.Linear(32, 4))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train(model: torch.nn.Module, prof: Any, steps: int = STEPS) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(BATCH, 16)).sum().backward()
        opt.step()
        prof.step()


def _join(rank: int, world: int, port: int, timeout: float = 20.0) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout))


def ddp_job(rank: int, world: int, port: int, path: str, slow: int, bucket_cap_mb: Any,
            tree: bool) -> None:
    """Train with DDP, all-reduce one tensor asynchronously, gather the profiles to ``path``."""
    torch.set_num_threads(1)
    _join(rank, world, port)
    model = build_model(DELAY_S if rank == slow else 0.0)
    kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    ddp = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
    if tree:  # gathered explicitly, up a tree
        with tt.profile(timeline=True) as prof:
            train(ddp, prof)
            dist.all_reduce(torch.ones(10), async_op=True).wait()
        prof.gather(path, tree=True)
    else:  # gathered on exit, over the group
        with tt.profile(gather=path, timeline=True) as prof:
            train(ddp, prof)
            dist.all_reduce(torch.ones(10), async_op=True).wait()
    dist.destroy_process_group()


def files_job(rank: int, world: int, port: int, path: str, crash: int) -> None:
    """The script destroys its group inside the profile: the ranks meet through files. Rank
    ``crash`` (if any) dies before its profile ends."""
    torch.set_num_threads(1)
    _join(rank, world, port)
    with tt.profile() as prof:
        ddp = torch.nn.parallel.DistributedDataParallel(build_model())
        train(ddp, prof)
        dist.destroy_process_group()
        if rank == crash:
            os._exit(3)
    prof.gather(path, timeout=10.0 if crash < 0 else 0.5)


def _steps(model: torch.nn.Module, prof: Any, rank: int, fail: int, how: str) -> None:
    """Train; rank ``fail`` fails at the second step: ``how`` is "raise" or "kill" (SIGKILL)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        if rank == fail and step == 1:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"rank {rank} fails mid-training")
        opt.zero_grad()
        model(torch.ones(BATCH, 16)).sum().backward()
        opt.step()
        prof.step()


def failing_job(rank: int, world: int, port: int, path: str, fail: int, how: str) -> None:
    """Train with DDP in ``profile(gather=path)``; rank ``fail`` fails mid-training (``how``:
    "raise", "kill"), or never enters the profile (``how``: "absent": it trains without one).
    What the profile warns goes to ``<path>.rank<N>.warnings``."""
    torch.set_num_threads(1)
    _join(rank, world, port, timeout=120.0)  # waiting for the group's timeout fails the test
    ddp = torch.nn.parallel.DistributedDataParallel(build_model())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if rank == fail and how == "absent":
                _steps(ddp, tt.profile(), rank, -1, how)
            else:
                with tt.profile(gather=path) as prof:
                    _steps(ddp, prof, rank, fail, how)
        finally:
            with open(f"{path}.rank{rank}.warnings", "w", encoding="utf-8") as out:
                out.write("\n".join(str(w.message) for w in caught))
            _let_gloo_finish()
    dist.destroy_process_group()


def _let_gloo_finish() -> None:
    """Release the GIL a moment before the rank ends. torch's backward stashes a Python object
    (a copy of the context) in thread-local state, which every collective issued in it keeps,
    and gloo's worker frees it after the collective completes, taking the GIL: a rank ending
    right after its last backward (one that trains without a profile, whose exit would meet the
    others first) may be finalizing by then, and aborts ("terminate called without an active
    exception"; a core shows ~AsyncAllreduceWork freeing that context on the worker). torch's
    race, with or without tracetorch: waited out here, in the job, not in the library."""
    time.sleep(0.05)
