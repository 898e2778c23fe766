"""Duck-typed models: any object with a ``forward``, its layers in attributes, lists or dicts.

The classes of the model passed to ``profile(model)`` and of every layer found below it get
their ``forward`` wrapped where they define it (builtins and already-wrapped classes excepted).

Example:
    >>> class Net:
    ...     def forward(self, x):
    ...         return x
    >>> [t.cls.__name__ for t in duck_targets(Net())]
    ['Net']
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tracetorch.engine.patches import PatchTarget, defining_class
from tracetorch.introspect import layer_classes

__all__ = ("duck_targets",)


def duck_targets(model: Any) -> Iterator[PatchTarget]:
    """Patch targets for ``model``'s own class and the classes of its layers."""
    for cls in layer_classes(model):
        owner = defining_class(cls, "forward")
        if owner is not None and owner.__module__ != "builtins":
            yield PatchTarget(owner, "forward", "module")
