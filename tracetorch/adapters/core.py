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
from typing import Callable

from tracetorch.adapters.base import all_subclasses
from tracetorch.engine.hotpath import OpCounter
from tracetorch.engine.patches import PatchBoard, PatchTarget
from tracetorch.tree import NodeKind

__all__ = ("CoreAdapter",)


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
        from tracetorch.flops.core_rules import register_core_rules

        register_core_rules()
        previous = autograd.set_op_observer(counter)
        board.watch_subclasses(Module, _patcher(board, "forward", "module"))
        board.watch_subclasses(Optimizer, _patcher(board, "step", "optimizer"))

        def stop() -> None:
            autograd.set_op_observer(previous)

        return [stop]


def _patcher(board: PatchBoard, attr: str, kind: NodeKind) -> Callable[[type], None]:
    """Wraps ``attr`` of each new class that defines it."""
    return lambda cls: board.patch(PatchTarget(cls, attr, kind))
