"""Python objects between ranks through the process group, each tensor handed to a collective
kept until the backend has let go of it.

torch's ``gather_object`` and ``send_object_list`` make their tensors in Python and drop them
as they return, while gloo's worker thread may still hold the collective's work: the worker
then drops the last reference to a Python tensor, which takes the GIL. At the end of a script
the profile's gather is the last collective, and the interpreter may be finalizing by then: the
worker, taking the GIL, is ended inside a C++ destructor and the process aborts ("terminate
called without an active exception"; one rank in about a hundred runs of the distributed
guide's example, its core showing ``AsyncGatherWork``'s destructor on gloo's worker thread).
Here the tensors stay referenced until their use count says that only this side holds them
(:func:`_let_go`), so the last reference is always dropped by the calling thread. (On GPUs,
NCCL's works keep their tensors for its watchdog, which frees them on its own schedule: there
they are dropped as torch's own object collectives drop them.)

Example:
    >>> import torch                        # (what a rank has imported: it runs a process group)
    >>> payload = _to_tensor({"rank": 3})
    >>> _from_tensor(payload, payload.numel())
    {'rank': 3}
"""
from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ("gather_objects", "recv_object", "send_object")

#: Seconds :func:`_let_go` waits for the backend to drop its references (it takes microseconds
#: once its thread runs; the wait only covers a thread not scheduled yet on a busy machine).
LET_GO_S = 2.0

#: Tensors the backend still held when :func:`_let_go` stopped waiting: kept for the process's
#: life, so that the backend's thread, not this one, never drops their last reference late.
_STILL_HELD: list[Any] = []


def gather_objects(obj: Any, rank: int, world: int) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0, in rank order (``None`` on the other ranks); every rank
    calls it, as ``torch.distributed.gather_object(obj, ..., dst=0)``."""
    torch, dist, device = _group()
    mine, size = _sized(obj, device)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(sizes, size)
    lengths = [int(one.item()) for one in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    padded[:mine.numel()] = mine
    received = ([torch.empty(max(lengths), dtype=torch.uint8, device=device)
                 for _ in range(world)] if rank == 0 else None)
    dist.gather(padded, received, dst=0)
    _let_go([mine, size, *sizes, padded, *(received or ())])
    if received is None:
        return None
    return [_from_tensor(tensor, length) for tensor, length in zip(received, lengths)]


def send_object(obj: Any, dst: int) -> None:
    """Send ``obj`` to rank ``dst`` (which calls :func:`recv_object` with this rank)."""
    _, dist, device = _group()
    payload, size = _sized(obj, device)
    dist.send(size, dst)
    dist.send(payload, dst)
    _let_go([payload, size])


def recv_object(src: int) -> Any:
    """The object rank ``src`` sends with :func:`send_object`."""
    torch, dist, device = _group()
    size = torch.zeros(1, dtype=torch.long, device=device)
    dist.recv(size, src)
    payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.recv(payload, src)
    _let_go([size, payload])
    return _from_tensor(payload, payload.numel())


def _group() -> tuple[Any, Any, Any]:
    # torch, torch.distributed and where the group's collectives take tensors: NCCL's on the
    # current GPU, gloo's (and a "cpu:gloo,cuda:nccl" group's) on the CPU, as torch's own
    # object collectives choose.
    torch, dist = sys.modules["torch"], sys.modules["torch.distributed"]
    backend = str(dist.get_backend()).lower()
    if "gloo" in backend or "mpi" in backend or not torch.cuda.is_available():
        return torch, dist, torch.device("cpu")
    return torch, dist, torch.device("cuda", torch.cuda.current_device())


def _sized(obj: Any, device: Any) -> tuple[Any, Any]:
    # ``obj`` pickled into a tensor on ``device``, and its length as a one-item tensor there.
    torch = sys.modules["torch"]
    payload = _to_tensor(obj).to(device)
    return payload, torch.tensor([payload.numel()], dtype=torch.long, device=device)


def _to_tensor(obj: Any) -> Any:
    torch = sys.modules["torch"]
    data = bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    return torch.frombuffer(data, dtype=torch.uint8).clone()  # (owning its memory)


def _from_tensor(tensor: Any, length: int) -> Any:
    return pickle.loads(tensor[:length].cpu().numpy().tobytes())


def _let_go(tensors: Sequence[Any]) -> None:
    # Wait, the GIL released, until the backend holds none of ``tensors`` (each one's use count
    # down to this side's one reference); any it still holds after LET_GO_S is kept for good.
    if not tensors or tensors[0].device.type != "cpu":
        return
    deadline = time.monotonic() + LET_GO_S
    held = [tensor for tensor in tensors if tensor._use_count() > 1]
    while held and time.monotonic() < deadline:
        time.sleep(0.0005)
        held = [tensor for tensor in held if tensor._use_count() > 1]
    _STILL_HELD.extend(held)
