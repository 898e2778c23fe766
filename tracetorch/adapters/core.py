"""The adapter for ``tracetorch.core``, the numpy reference framework.

It wraps the ``forward`` of every :class:`~tracetorch.core.layers.Module` subclass,
``Tensor.backward`` and every optimizer's ``step`` (also of classes defined while a profile is
open: the board watches both base classes), and makes the profiler core's tensor-operation
observer, so that operations run inside a layer are counted and backward passes are timed per
layer.

Example:
    >>> adapter = CoreAdapter()
    >>> adapter.module_name
    'tracetorch.core'
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Callable

import numpy as np

from tracetorch.adapters.base import all_subclasses
from tracetorch.engine.hotpath import OpCounter
from tracetorch.engine.patches import PatchBoard, PatchTarget
from tracetorch.engine.saved_meters import SeenStorages, first_sighting, register_saved_meter
from tracetorch.models.tensors import ndarray_of, tensors_in
from tracetorch.records.tree import NodeKind

__all__ = ("CoreAdapter", "saved_bytes")


class CoreAdapter:
    """Profiles ``tracetorch.core`` layers, backward passes and optimizers."""

    module_name = "tracetorch.core"

    def patch_targets(self) -> Iterator[PatchTarget]:
        """Every core class that defines ``forward``, ``Tensor.backward`` and optimizer steps."""
        from tracetorch.core.layers import Module
        from tracetorch.core.optim import Optimizer
        from tracetorch.core.tensor import Tensor

        for cls in all_subclasses(Module):
            yield PatchTarget(cls, "forward", "module")
        yield PatchTarget(Tensor, "backward", "backward")
        for cls in all_subclasses(Optimizer):
            yield PatchTarget(cls, "step", "optimizer")

    def class_targets(self, cls: type) -> Iterable[PatchTarget] | None:
        """Nothing more for a core layer class (:meth:`patch_targets` names them all)."""
        from tracetorch.core.layers import Module

        return () if issubclass(cls, Module) else None

    def start(self, board: PatchBoard, counter: OpCounter) -> list[Callable[[], None]]:
        """Observe tensor operations and patch classes created from now on."""
        from tracetorch.core import autograd
        from tracetorch.core.layers import Module
        from tracetorch.core.optim import Optimizer
        from tracetorch.core.tensor import Tensor
        from tracetorch.flops.core_rules import register_core_rules

        register_core_rules()
        register_saved_meter(Tensor, saved_bytes, autograd.is_grad_enabled)
        previous = autograd.set_op_observer(counter)
        board.watch_subclasses(Module, _patcher(board, "forward", "module"))
        board.watch_subclasses(Optimizer, _patcher(board, "step", "optimizer"))

        def stop() -> None:
            autograd.set_op_observer(previous)

        return [stop]


def _patcher(board: PatchBoard, attr: str, kind: NodeKind) -> Callable[[type], None]:
    """Wraps ``attr`` of each new class that defines it."""
    return lambda cls: board.patch(PatchTarget(cls, attr, kind))


def saved_bytes(args: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
                seen: SeenStorages, node: Any = None) -> int:
    """Bytes of the arrays the graph nodes between a call's inputs and its ``output`` keep for
    backward (what their backward closures hold), leaving out those in ``seen`` (which notes
    the new ones) and the arrays of leaves that need a gradient (parameters): each array once.
    (``node``, the call's node, is not needed: reading an array has no side effect.)

    Example:
        >>> from tracetorch.core import Linear, Tensor
        >>> x = Tensor(np.ones((64, 1024)))
        >>> saved_bytes((x,), {}, Linear(1024, 1024)(x), {})   # its input, not its weight
        262144
    """
    stop = {id(t._grad_fn) for t in _core_tensors((args, kwargs)) if t._grad_fn is not None}
    pending = [t._grad_fn for t in _core_tensors(output)
               if t._grad_fn is not None and id(t._grad_fn) not in stop]
    visited = {id(node) for node in pending}
    total = 0
    while pending:
        node = pending.pop()
        held = {id(_root(p.data)) for p in node.parents
                if p is not None and p.requires_grad and p._grad_fn is None}
        for cell in node.backward.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
            array = _root(ndarray_of(value))
            if (isinstance(array, np.ndarray) and id(array) not in held
                    and first_sighting(seen, id(array), array)):
                total += array.nbytes
        for parent in node.parents:
            fn = getattr(parent, "_grad_fn", None)
            if fn is not None and id(fn) not in visited and id(fn) not in stop:
                visited.add(id(fn))
                pending.append(fn)
    return total


def _root(value: Any) -> Any:
    # The array owning the memory of a view (``w.T`` of a weight is its weight).
    while isinstance(value, np.ndarray) and isinstance(value.base, np.ndarray):
        value = value.base
    return value


def _core_tensors(value: Any) -> list[Any]:
    from tracetorch.core.tensor import Tensor

    return [t for t in tensors_in(value) if isinstance(t, Tensor)]
