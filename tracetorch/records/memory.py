"""Per-layer memory: what a node's calls read, wrote and left saved for backward.

One :class:`MemoryStats` per call node (``node.memory``). The conventions, stated once:

- ``input_bytes`` / ``output_bytes``: the bytes of the tensors a call took as arguments and
  returned (inside tuples, lists and dicts too), summed over calls. They are measured once per
  input shape, as FLOPs are: a layer called again with the same shapes in another dtype keeps
  the first dtype's sizes.
- ``param_bytes``: the layer's parameters (its whole subtree, shared or tied tensors once;
  buffers such as running statistics left out), for the node, not per call.
- ``bytes_moved``: every call reads its inputs and its parameters once and writes its outputs
  once: ``input_bytes + output_bytes + param_bytes * calls``. A roofline's memory traffic, as
  a layer is seen from outside (traffic inside a fused kernel or between the layers it calls
  is not there).
- ``saved_bytes``: the activations autograd keeps for the backward pass, as it saves them
  (torch: ``saved_tensors_hooks``; ``tracetorch.core``: the arrays its graph nodes hold), each
  storage once even when several operations save it, charged to the innermost layer whose call
  saved it first. Parameters and the user's own leaf tensors that need a gradient are left
  out: they are held anyway. Recomputation inside a backward pass (activation checkpointing)
  saves nothing here.
- ``device_delta_bytes`` / ``device_peak_bytes``: on CUDA, the caching allocator's change in
  allocated bytes over each call (summed) and the highest allocated bytes seen at a call's end
  or as a new high-water mark during it (a lower bound of the true peak: torch keeps one
  process-wide maximum, which tracetorch never resets). 0 elsewhere.

Example:
    >>> stats = MemoryStats()
    >>> stats.input_bytes, stats.output_bytes, stats.param_bytes = 400, 800, 1_000
    >>> stats.bytes_moved(calls=2)
    3200
"""
from __future__ import annotations

from typing import Any

__all__ = ("MemoryStats", "FIELDS")

#: The recorded fields, in the order reports and files list them.
FIELDS = ("input_bytes", "output_bytes", "param_bytes", "saved_bytes", "device_delta_bytes",
          "device_peak_bytes")


class MemoryStats:
    """The memory figures of one call node (see the module docstring for each field)."""

    __slots__ = FIELDS

    def __init__(self) -> None:
        self.input_bytes = 0
        self.output_bytes = 0
        self.param_bytes = 0
        self.saved_bytes = 0
        self.device_delta_bytes = 0
        self.device_peak_bytes = 0

    def bytes_moved(self, calls: int) -> int:
        """Bytes ``calls`` calls read and wrote: inputs, outputs, and the parameters once per
        call."""
        return self.input_bytes + self.output_bytes + self.param_bytes * calls

    def merge(self, other: MemoryStats) -> None:
        """Add ``other``'s calls (the same layer recorded elsewhere: a nested profile)."""
        self.input_bytes += other.input_bytes
        self.output_bytes += other.output_bytes
        self.param_bytes = max(self.param_bytes, other.param_bytes)
        self.saved_bytes += other.saved_bytes
        self.device_delta_bytes += other.device_delta_bytes
        self.device_peak_bytes = max(self.device_peak_bytes, other.device_peak_bytes)

    def __bool__(self) -> bool:
        return any(getattr(self, name) for name in FIELDS)

    def to_dict(self) -> dict[str, int]:
        """The fields as a JSON-ready dict (what saved profiles hold)."""
        return {name: getattr(self, name) for name in FIELDS}

    def update(self, values: dict[str, Any]) -> None:
        """Set the fields present in ``values`` (a dict :meth:`to_dict` wrote)."""
        for name in FIELDS:
            if name in values:
                setattr(self, name, values[name])

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)}" for name in FIELDS if getattr(self, name))
        return f"MemoryStats({shown})"
