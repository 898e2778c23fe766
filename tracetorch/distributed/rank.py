"""Facts about this process's place in a ``torch.distributed`` job: rank, world size, host,
device and backend.

Read from an initialized default process group when there is one, else from the environment
``torchrun`` (and most launchers) set: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``. Never imports
torch: a job that has a process group has imported ``torch.distributed`` already.

Example:
    >>> facts = rank_facts({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    >>> facts["rank"], facts["world_size"], facts["local_rank"], facts["backend"]
    (1, 4, 1, None)
"""
from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ("rank_facts", "group_alive", "launched_distributed")


def group_alive() -> bool:
    """Whether ``torch.distributed``'s default process group is initialized (torch unimported:
    no)."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def launched_distributed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a launcher (``torchrun``...) started this process as one rank of several.

    Example:
        >>> launched_distributed({"RANK": "0", "WORLD_SIZE": "2"}), launched_distributed({})
        (True, False)
    """
    env = os.environ if environ is None else environ
    return "RANK" in env and _int(env.get("WORLD_SIZE"), 1) > 1


def rank_facts(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Rank, world size, local rank, host, process id, device and backend of this process
    (rank 0 of 1 outside any job)."""
    env = os.environ if environ is None else environ
    facts: dict[str, Any] = {
        "rank": _int(env.get("RANK"), 0), "world_size": _int(env.get("WORLD_SIZE"), 1),
        "local_rank": _int(env.get("LOCAL_RANK"), 0), "host": socket.gethostname(),
        "pid": os.getpid(), "backend": None, "device": "cpu",
    }
    if environ is None and group_alive():
        dist = sys.modules["torch.distributed"]
        facts.update(rank=dist.get_rank(), world_size=dist.get_world_size(),
                     backend=str(dist.get_backend()))
        facts["device"] = _device(str(facts["backend"]))
    return facts


def _device(backend: str) -> str:
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    if cuda is not None and "nccl" in backend and cuda.is_available():
        return f"cuda:{cuda.current_device()}"
    return "cpu"


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
