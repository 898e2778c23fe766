"""Calls under ``torch.vmap``: said, not silently counted short.

Inside ``torch.vmap`` (``torch.func.vmap``, ``functorch.vmap``: one implementation) the function
runs on batched tensors that show one example's shape: where the batch holds five rows of 8,
``x.shape`` is ``(8,)``. The layers and operations run there are recorded with those shapes, so
their FLOPs, sizes and op counts are one example's of each batch (``FlopCounterMode``, below
the batching, counts the whole batch). Telling a batched tensor from another on every call
would cost every call, so instead torch's ``_flat_vmap`` — through which every vmap, and every
chunk of a chunked one, runs — is watched while a profile is open: the first vmap of a profiling
session warns, with its batch size, :func:`vmap_batch_sizes` lists every batch size seen, and a
profile in which a vmap ran says so in ``meta["vmap"]`` (``{"batch_sizes": [...]}``, kept in a
saved profile) and in its report's summary.

Example:
    >>> import warnings, torch, tracetorch
    >>> layer = torch.nn.Linear(8, 4)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     with tracetorch.profile(layer) as prof:
    ...         _ = torch.vmap(layer)(torch.ones(5, 8))
    >>> prof.total_flops                               # one example's: 2·8·4, not 5 times it
    64
    >>> "torch.vmap" in str(caught[0].message), prof.meta["vmap"]
    (True, {'batch_sizes': [5]})
"""
from __future__ import annotations

import sys
import warnings
from typing import Any, Callable

from tracetorch.adapters.torch.tracing import tracing
from tracetorch.engine.hotpath import innermost_frame
from tracetorch.engine.notes import register_note
from tracetorch.engine.patches import PatchBoard
from tracetorch.records.tree import CallNode

__all__ = ("start_vmap_watch", "vmap_batch_sizes", "vmap_facts")

#: Each vmap (and chunk of one) run since the profiles opened (the last session's, once closed):
#: the ``id`` of the node of the call it ran in (a profile's root at its top level: the node
#: itself is not kept alive) and its batch size.
_SEEN: list[tuple[int, int]] = []


def vmap_batch_sizes() -> list[int]:
    """The batch size of every vmap (and chunk of one) run while profiles were open, in order:
    those of the profiling session open now, or of the last one.

    Example:
        >>> isinstance(vmap_batch_sizes(), list)
        True
    """
    return [size for _, size in _SEEN]


def vmap_facts(root: CallNode, meta: dict[str, Any]) -> None:
    """``meta["vmap"]`` of a closing profile whose tree ``root`` a vmap ran in: its batch sizes
    (a note: :mod:`tracetorch.engine.notes`).

    Example:
        >>> meta = {}
        >>> vmap_facts(CallNode.root(), meta)
        >>> meta
        {}
    """
    inside = {id(node) for node in root.walk()}
    sizes = [size for node, size in _SEEN if node in inside]
    if sizes:
        meta["vmap"] = {"batch_sizes": sizes}


def start_vmap_watch(board: PatchBoard) -> None:
    """Watch torch's vmap while ``board`` is open (it puts torch's own back when it closes):
    a profiling session starts with no batch size seen."""
    _SEEN.clear()
    module = sys.modules.get("torch._functorch.vmap")
    original = vars(module).get("_flat_vmap") if module is not None else None
    if callable(original):  # (a torch without it: nothing to watch)
        board.install(module, "_flat_vmap", _watched(original))


def _watched(original: Callable[..., Any]) -> Callable[..., Any]:
    def _flat_vmap(func: Any, batch_size: int, *args: Any, **kwargs: Any) -> Any:
        frame = innermost_frame()
        if frame is not None and frame.collector.active and not tracing():
            # (not in a compiler's trace of the vmap: no Python side effect in its graph)
            if not _SEEN:
                warnings.warn(
                    f"tracetorch: torch.vmap ran inside a profile (batch size {batch_size}): "
                    "layers and operations under it see one example's shapes, so their FLOPs, "
                    "sizes and op counts are one example's of each batch", RuntimeWarning,
                    stacklevel=4)
            _SEEN.append((id(frame.node), batch_size))
        return original(func, batch_size, *args, **kwargs)

    return _flat_vmap


register_note(vmap_facts)
