"""Duck-typed models: any object with a ``forward``, its layers in attributes, lists or dicts.

The classes of the model passed to ``profile(model)`` and of every layer found below it get
their ``forward`` wrapped where they define it (builtins and already-wrapped classes excepted).
A layer whose own ``__dict__`` holds a ``forward`` (assigned on the instance, as accelerate's
mixed precision does, hiding the class's) gets that one wrapped on the instance instead.

Example:
    >>> class Net:
    ...     def forward(self, x):
    ...         return x
    >>> [t.cls.__name__ for t in duck_targets(Net())]
    ['Net']
"""
from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from tracetorch.engine.patches import PatchTarget, defining_class, is_instrumented
from tracetorch.models.introspect import layer_classes, named_submodules

__all__ = ("duck_targets", "instance_forwards")


def duck_targets(model: Any) -> Iterator[PatchTarget]:
    """Patch targets for ``model``'s own class and the classes of its layers."""
    for cls in layer_classes(model):
        owner = defining_class(cls, "forward")
        if owner is not None and owner.__module__ != "builtins":
            yield PatchTarget(owner, "forward", "module")


def instance_forwards(model: Any) -> Iterator[Any]:
    """``model`` and the layers below it whose own ``__dict__`` holds a callable ``forward``
    (one tracetorch did not install): a call of the layer runs that one, not its class's.

    Asked at each opening (such a ``forward`` comes and goes with the code that sets it): a
    look at each layer's ``__dict__``. The layers are found by one walk per model, remembered
    weakly (a layer added to the model later is recorded through its class's ``forward``).

    Example:
        >>> class Net:
        ...     def forward(self, x):
        ...         return x
        >>> net = Net()
        >>> list(instance_forwards(net))
        []
        >>> net.forward = lambda x: 2 * x
        >>> list(instance_forwards(net)) == [net]
        True
    """
    # (asked at each opening for every layer: one comprehension, the rare hit checked after)
    found = [layer for layer in _layers_of(model)
             if layer is not None and "forward" in getattr(layer, "__dict__", _NO_DICT)]
    for layer in found:
        own = vars(layer)["forward"]
        if callable(own) and not is_instrumented(own) and _hashable(layer):
            yield layer


_NO_DICT: dict[str, Any] = {}

#: Per model: weak references to it and the layers below it (those that take one: a layer
#: without a ``__dict__`` can have no forward of its own).
_LAYERS: weakref.WeakKeyDictionary[Any, list[weakref.ref]] = weakref.WeakKeyDictionary()


def _layers_of(model: Any) -> Iterable[Any]:
    # The layers of ``model`` (None for one no longer alive), from the model's remembered walk.
    try:
        refs = _LAYERS.get(model)
    except TypeError:  # unhashable, or no weak reference: walked each time
        return [model, *(layer for _, layer in named_submodules(model))]
    if refs is None:
        refs = []
        for layer in [model] + [layer for _, layer in named_submodules(model)]:
            try:
                refs.append(weakref.ref(layer))
            except TypeError:
                pass
        _LAYERS[model] = refs
    return map(_dereference, refs)


_dereference = weakref.ref.__call__


def _hashable(layer: Any) -> bool:
    # (the patch board keys its patches by the object)
    try:
        hash(layer)
    except TypeError:
        return False
    return True
