"""What torch's autograd keeps for the backward pass of one layer call.

Read from the graph the call built, once per input shape (from
:meth:`~tracetorch.engine.collector.Collector.first_entry`): from the call's outputs back to its
inputs, each graph node's saved tensors (the ``_saved_*`` attributes torch's generated nodes
expose, ``saved_tensors`` of a Python ``autograd.Function``), stopping at the nodes a layer
called inside it made (marked by that layer's call: measured there, and possibly packed by
saved-tensor hooks that must not run). Parameters, and other leaves that need a gradient, are
held anyway and are left out.

Why not ``torch.autograd.graph.saved_tensors_hooks``: a default hook installed for the whole
block makes every ``torch.func`` transform (``grad``, ``vjp``, ``jacrev``) raise inside it,
and a profiler must leave the program as it was. Reading the graph costs nothing per call.
While other saved-tensor hooks are active (activation checkpointing, CPU offloading), what
autograd keeps is theirs to decide, and reading it could run them (a checkpoint's unpack
recomputes the forward): nothing is read there.

Example:
    >>> import torch
    >>> layer, x = torch.nn.Linear(1024, 1024), torch.ones(64, 1024)
    >>> saved_bytes((x,), {}, layer(x), {})         # its input, not its weight
    262144
"""
from __future__ import annotations

from typing import Any

import torch

from tracetorch.adapters.torch.backward import MARKS, collect_tensors
from tracetorch.engine.saved_meters import SeenStorages, first_sighting

__all__ = ("saved_bytes",)

_Tensor = torch.Tensor
_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_no_subclass_dispatch = torch._C.DisableTorchFunctionSubclass

#: Per graph-node class, the names of its saved attributes (``dir`` once per class).
_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def saved_bytes(args: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
                seen: SeenStorages, node: Any = None) -> int:
    """Bytes of the storages saved for backward by the graph nodes between a call's inputs
    and its ``output``, leaving out those in ``seen`` (which notes the new ones): each storage
    counts once, for the first call that saved it. ``node`` is the call's own call node: graph
    nodes another call node marked are that one's."""
    if not torch.is_grad_enabled() or _top_hooks(False) is not None:
        return 0
    with _no_subclass_dispatch():  # a tensor subclass's __torch_function__ sees no read here
        return _saved_bytes(args, kwargs, output, seen, node)


def _saved_bytes(args: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
                 seen: SeenStorages, node: Any) -> int:
    outputs: list[Any] = []
    collect_tensors(output, outputs)
    stop = set()
    inputs: list[Any] = []
    collect_tensors((args, kwargs), inputs)
    for tensor in inputs:
        if tensor.grad_fn is not None:
            stop.add(tensor.grad_fn)
    pending = [t.grad_fn for t in outputs if t.grad_fn is not None and t.grad_fn not in stop]
    visited = set(pending)
    total = 0
    while pending:
        fn = pending.pop()
        mark = fn.metadata.get(MARKS)
        if mark is not None and mark[0].node is not node:
            continue  # a layer called inside this one made it: measured at that layer's call
        for tensor in _saved_tensors(fn):
            total += _new_storage(tensor, seen)
        for parent, _ in fn.next_functions:
            if parent is not None and parent not in visited and parent not in stop:
                visited.add(parent)
                pending.append(parent)
    return total


def _saved_tensors(fn: Any) -> list[Any]:
    names = _SAVED_NAMES.get(type(fn))
    if names is None:
        names = _SAVED_NAMES[type(fn)] = tuple(
            name for name in dir(fn) if name.startswith("_saved_") or name == "saved_tensors")
    found: list[Any] = []
    for name in names:
        try:
            collect_tensors(getattr(fn, name), found)
        except RuntimeError:  # freed already, or not a tensor this node kept
            continue
    return found


def _new_storage(tensor: Any, seen: SeenStorages) -> int:
    base = tensor._base if tensor._base is not None else tensor
    if base.requires_grad and base.is_leaf:
        return 0  # a parameter, or the user's own leaf: held whether or not it is saved
    storage = tensor.untyped_storage()
    key = storage.data_ptr()
    if not key or not first_sighting(seen, key, storage):
        return 0
    return int(storage.nbytes())
