"""Data-parallel training with DDP on CPU (gloo), one rank slowed on purpose, profiled as one job.

Run it with torchrun, under tracetorch (the script itself knows nothing of tracetorch)::

    torchrun --standalone --nproc_per_node 2 -m tracetorch run -o job.json examples/ddp_train.py

Rank 0 prints the merged report on stderr (the tree, each rank's step and compute times, the
straggler and the layers that make it one, the collectives with their bytes and bandwidth) and
writes ``job.json`` with every rank's own profile beside it (``job.rank1.json``).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist


class Augment(torch.nn.Module):
    """Stands for per-rank work that differs (data loading, augmentation): it takes
    ``seconds`` per call on the slowed rank, nothing elsewhere."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--slow-rank", type=int, default=1, help="the rank to slow down")
    parser.add_argument("--delay", type=float, default=0.02, help="its extra seconds per step")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # rank, world size and address from torchrun
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                Augment(args.delay if rank == args.slow_rank else 0.0),
                                torch.nn.Linear(64, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(args.steps):
        opt.zero_grad()
        ddp(torch.randn(16, 32)).square().mean().backward()
        opt.step()
    print(f"rank {rank}: trained {args.steps} steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
