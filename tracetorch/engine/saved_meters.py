"""What a call saves for backward, measured by its framework's meter.

Each framework's adapter registers, for its tensor class, a meter that finds the storages a
call's autograd graph keeps alive (:mod:`tracetorch.adapters.torch.saved` for torch, the core
adapter for ``tracetorch.core``), with the framework's grad mode, which then keys every call's
cached figures (:func:`tracetorch.engine.hotpath.call_key`): a call made without gradients
saves nothing, the same call made with them does. The collector asks :func:`saved_by_call` once
per node and call key, as it runs FLOP rules, and keeps the storages already charged since the
last step (:data:`SeenStorages`) so that a tensor kept by several calls counts once.

Example:
    >>> from tracetorch.records.tree import CallNode
    >>> saved_by_call((), {}, object(), {}, CallNode.root())   # no meter for an object
    0
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

from tracetorch.engine.hotpath import set_grad_mode
from tracetorch.records.tree import CallNode

__all__ = ("SavedMeter", "SeenStorages", "first_sighting", "register_saved_meter",
           "saved_by_call")

#: The storages charged already: each one's key (its address, its ``id``) and a weak reference
#: to it, so that a storage made later at the address of one freed since is not taken for it (a
#: block without ``prof.step()`` keeps them for the whole run).
SeenStorages = dict[int, Any]

#: ``meter(args, kwargs, output, seen, node) -> bytes`` saved for backward by one call of
#: ``node`` (see :mod:`tracetorch.records.memory`), counting only the storages
#: :func:`first_sighting` finds new in ``seen``.
SavedMeter = Callable[[tuple[Any, ...], dict[str, Any], Any, SeenStorages, CallNode], int]

# A framework's saved-bytes meter, by its tensor class (registered by its adapter).
_SAVED_METERS: dict[type, SavedMeter] = {}

# A framework's grad-mode reader, by its tensor class.
_GRAD_MODES: dict[type, Callable[[], bool]] = {}


def register_saved_meter(tensor_type: type, meter: SavedMeter,
                         grad_mode: Callable[[], bool] | None = None) -> None:
    """Measure what calls returning ``tensor_type`` tensors save for backward with ``meter``;
    ``grad_mode()`` says whether the framework records gradients now (``torch.is_grad_enabled``).
    """
    _SAVED_METERS[tensor_type] = meter
    if grad_mode is not None:
        _GRAD_MODES[tensor_type] = grad_mode
        readers = tuple(dict.fromkeys(_GRAD_MODES.values()))
        # One framework's reader as it is (a builtin, for torch); several read together.
        set_grad_mode(readers[0] if len(readers) == 1 else _AllGradModes(readers))


class _AllGradModes:
    """The grad modes of several frameworks, read together: one bit each, in a small int (a
    singleton, as a bool is, which the hot path's key check compares by identity)."""

    def __init__(self, readers: tuple[Callable[[], bool], ...]) -> None:
        self.readers = readers

    def __call__(self) -> int:
        return sum(1 << bit for bit, read in enumerate(self.readers) if read())


def first_sighting(seen: SeenStorages, key: int, storage: Any) -> bool:
    """Whether ``storage``, whose address is ``key``, is charged for the first time (noted in
    ``seen`` if so): not while the storage ``seen`` holds under ``key`` is alive and is it.

    Example:
        >>> import numpy as np
        >>> seen, array = {}, np.ones(3)
        >>> first_sighting(seen, id(array), array), first_sighting(seen, id(array), array)
        (True, False)
        >>> first_sighting(seen, id(array), np.ones(3))      # another array at that key
        True
    """
    known = seen.get(key)
    if known is not None and known() is storage:
        return False
    seen[key] = weakref.ref(storage)
    return True


def saved_by_call(args: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
                  seen: SeenStorages, node: CallNode) -> int:
    """Bytes one call of ``node`` saves for backward that are not in ``seen`` yet (which notes
    them), by the meter of its output's tensor class; 0 where none is registered."""
    sample = output
    while isinstance(sample, (tuple, list)) and sample:
        sample = sample[0]
    meter = _SAVED_METERS.get(type(sample))
    if meter is None:
        return 0
    try:
        return meter(args, kwargs, output, seen, node)
    except Exception:  # a tensor with no storage (meta, fake): nothing measurable
        return 0
