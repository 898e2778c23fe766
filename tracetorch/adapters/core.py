"""The adapter for ``tracetorch.core``, the numpy reference framework.

It wraps the ``forward`` of every :class:`~tracetorch.core.layers.Module` subclass (also those
defined while a profile is open, through ``Module.__init_subclass__``), ``Tensor.backward`` and
every optimizer's ``step``, and makes the profiler core's tensor-operation observer, so that
operations run inside a layer are counted and backward passes are timed per layer.

Example:
    >>> adapter = CoreAdapter()
    >>> adapter.module_name
    'tracetorch.core'
"""
from __future__ import annotations

from typing import Callable, Iterator, List

from tracetorch.adapters.base import all_subclasses
from tracetorch.engine.patches import PatchBoard, PatchTarget
from tracetorch.engine.hotpath import OpCounter

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
            if "forward" in vars(cls):
                yield PatchTarget(cls, "forward", "module")
        yield PatchTarget(Tensor, "backward", "backward")
        for cls in all_subclasses(Optimizer):
            if "step" in vars(cls):
                yield PatchTarget(cls, "step", "optimizer")

    def start(self, board: PatchBoard, counter: OpCounter) -> List[Callable[[], None]]:
        """Observe tensor operations and patch classes created from now on."""
        from tracetorch.core import autograd, layers
        from tracetorch.flops.core_rules import register_core_rules

        register_core_rules()
        previous = autograd.set_op_observer(counter)

        def patch_new_class(cls: type) -> None:
            board.patch(PatchTarget(cls, "forward", "module"))

        layers.subclass_listeners.append(patch_new_class)
        return [lambda: autograd.set_op_observer(previous),
                lambda: layers.subclass_listeners.remove(patch_new_class)]
