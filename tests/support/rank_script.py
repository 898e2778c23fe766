"""A training script for ``tracetorch run`` on each rank of a job launched through
torch.distributed's environment variables: DDP over gloo on CPU.

Usage: ``rank_script.py STEPS FAIL_RANK LATE_RANK``: rank ``FAIL_RANK`` raises at the second
step; rank ``LATE_RANK`` ends its script a second after destroying the group (the ranks then
meet through files, and it is the last to write its own)."""
from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

steps, fail, late = (int(a) for a in sys.argv[1:4])
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=120))  # a wait for it fails a test
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 4)))
for step in range(steps):
    if rank == fail and step == 1:
        raise RuntimeError(f"rank {rank} fails mid-training")
    model(torch.ones(2, 8)).sum().backward()
dist.destroy_process_group()
if rank == late:
    time.sleep(1.0)  # the late rank's remaining work, not a timing assertion
print(f"rank {rank}: trained {steps} steps")
