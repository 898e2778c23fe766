"""What each rank of the real-process tests runs (spawned with ``torch.multiprocessing``, gloo on
CPU): a small model trained with DDP under ``tracetorch.profile``, one rank slowed on purpose by
a layer whose forward waits (the injected delay the straggler analysis must find)."""
from __future__ import annotations

import os
import socket
import time
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


def _join(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=20))


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
