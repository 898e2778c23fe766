"""What a torch profile does at each layer call on CUDA: NVTX ranges and allocator readings.

``profile(nvtx=True)`` pushes an NVTX range named by the call's path (``encoder.layer.0.attn``)
at each layer call and pops it at the end, so Nsight Systems shows the layers on its timeline;
without CUDA it does nothing. With CUDA initialised and ``profile(memory=True)`` (the default),
each call reads the caching allocator's allocated bytes before and after it
(``torch.cuda.memory_allocated``, a host-side counter: no synchronisation) and its high-water
mark after it: the change goes to ``node.memory.device_delta_bytes``, the highest reading to
``device_peak_bytes`` (see :mod:`tracetorch.records.memory`: torch's peak is never reset, so a
call's peak is known where it set a new one, else its end's reading stands for it).

Example:
    >>> from tracetorch.records.tree import CallNode
    >>> class Fake:  # what torch.cuda.nvtx looks like to the hooks
    ...     def __init__(self): self.log = []
    ...     def range_push(self, name): self.log.append(("push", name))
    ...     def range_pop(self): self.log.append(("pop",))
    >>> nvtx, node = Fake(), CallNode.root().child("fc", "Linear", "m0")
    >>> enter, exit = nvtx_hooks(nvtx)
    >>> enter(node); exit(node); nvtx.log
    [('push', 'fc'), ('pop',)]
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from tracetorch.records.tree import CallNode

__all__ = ("configure_call_hooks", "nvtx_hooks", "memory_hooks")

Hook = Callable[[CallNode], None]


def nvtx_hooks(nvtx: Any) -> tuple[Hook, Hook]:
    """Enter and exit hooks pushing and popping one NVTX range per call (``nvtx`` is
    ``torch.cuda.nvtx``, or a fake in tests), named by the call's path (by its type for the
    profiled model itself)."""
    names: dict[CallNode, str] = {}

    def enter(node: CallNode) -> None:
        name = names.get(node)
        if name is None:
            name = names[node] = node.path or node.type_name
        nvtx.range_push(name)

    def exit(node: CallNode) -> None:
        nvtx.range_pop()

    return enter, exit


def memory_hooks(allocated: Callable[[], int], peak: Callable[[], int]) -> tuple[Hook, Hook]:
    """Enter and exit hooks charging each call's allocator change and peak to its node
    (``allocated``/``peak``: ``torch.cuda.memory_allocated``/``max_memory_allocated``)."""
    local = threading.local()

    def enter(node: CallNode) -> None:
        stack = getattr(local, "stack", None)
        if stack is None:
            stack = local.stack = []
        stack.append((allocated(), peak()))

    def exit(node: CallNode) -> None:
        before, peak_before = local.stack.pop()
        after, peak_after = allocated(), peak()
        memory = node.memory
        memory.device_delta_bytes += after - before
        highest = peak_after if peak_after > peak_before else after
        if highest > memory.device_peak_bytes:
            memory.device_peak_bytes = highest

    return enter, exit


def configure_call_hooks(collector: Any, nvtx: bool) -> None:
    """Give a profile being entered its NVTX and device-memory hooks, where CUDA is in use."""
    try:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    except Exception:  # pragma: no cover - a broken CUDA install: nothing to read
        cuda = False
    if not cuda:
        return
    if nvtx:
        collector.add_call_hook(*nvtx_hooks(torch.cuda.nvtx))
    if collector.memory:
        collector.add_call_hook(*memory_hooks(torch.cuda.memory_allocated,
                                              torch.cuda.max_memory_allocated))
