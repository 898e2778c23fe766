"""Framework-neutral looks at models: their submodules' names and the shapes of call arguments.

Everything here works on ``tracetorch.core`` modules, ``torch.nn.Module`` and duck-typed models
(objects with a ``forward`` and layers kept in attributes or lists), without importing torch.

Example:
    >>> class Net:
    ...     def __init__(self):
    ...         self.layers = [Leaf(), Leaf()]
    ...     def forward(self, x):
    ...         return x
    >>> class Leaf:
    ...     def forward(self, x):
    ...         return x
    >>> [name for name, _ in named_submodules(Net())]
    ['layers.0', 'layers.1']
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from tracetorch.tree import ShapeSignature

__all__ = ("is_layer", "named_submodules", "shape_of", "signature", "layer_classes")

# Attributes never worth descending into when walking a duck-typed model.
_SKIP_ATTRS = frozenset({"__dict__", "__weakref__", "__class__"})


def is_layer(obj: Any) -> bool:
    """Whether ``obj`` looks like a layer: an instance (not a class) with a callable ``forward``."""
    return not isinstance(obj, type) and callable(getattr(obj, "forward", None))


def named_submodules(model: Any) -> Iterator[Tuple[str, Any]]:
    """Every layer below ``model`` with its dotted path, each object once, in definition order.

    Frameworks that name their own submodules (``named_modules()``) are asked; other objects
    are walked through their attributes, lists, tuples and dicts.
    """
    named_modules = getattr(model, "named_modules", None)
    if callable(named_modules) and not isinstance(model, type):
        for name, module in named_modules():
            if module is not model:
                yield name, module
        return
    yield from _walk_attributes(model, "", {id(model)})


def _walk_attributes(obj: Any, prefix: str, seen: Set[int]) -> Iterator[Tuple[str, Any]]:
    for name, value in _attribute_items(obj):
        for path, layer in _layers_in(value, prefix + name):
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            yield path, layer
            yield from _walk_attributes(layer, path + ".", seen)


def _attribute_items(obj: Any) -> List[Tuple[str, Any]]:
    try:
        items = vars(obj)
    except TypeError:  # objects with __slots__ and no __dict__
        return []
    return [(k, v) for k, v in items.items() if k not in _SKIP_ATTRS and not k.startswith("__")]


def _layers_in(value: Any, path: str) -> Iterator[Tuple[str, Any]]:
    if is_layer(value):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if is_layer(item):
                yield f"{path}.{i}", item
    elif isinstance(value, dict):
        for key, item in value.items():
            if is_layer(item):
                yield f"{path}.{key}", item


def layer_classes(model: Any) -> List[type]:
    """The classes of ``model`` and of every layer below it, each once."""
    classes: Dict[type, None] = {type(model): None} if is_layer(model) else {}
    for _, layer in named_submodules(model):
        classes.setdefault(type(layer), None)
    return list(classes)


def shape_of(value: Any) -> Optional[Tuple[int, ...]]:
    """The shape of a tensor-like value as a plain tuple, or ``None`` for anything else."""
    shape = getattr(value, "shape", None)
    if shape is None or isinstance(value, type):
        return None
    try:
        return tuple(int(d) for d in shape)
    except TypeError:
        return None


def signature(args: Tuple[Any, ...], kwargs: Optional[Dict[str, Any]] = None) -> ShapeSignature:
    """Shapes of a call's tensor arguments: one entry per argument, tensors inside tuples,
    lists and dicts flattened in order, ``None`` for a non-tensor argument.

    Example:
        >>> import numpy as np
        >>> signature((np.zeros((2, 3)), 5), {"mask": np.zeros(4)})
        ((2, 3), None, (4,))
    """
    shapes: List[Optional[Tuple[int, ...]]] = []
    for value in args:
        _collect_shapes(value, shapes)
    if kwargs:
        for value in kwargs.values():
            _collect_shapes(value, shapes)
    return tuple(shapes)


def _collect_shapes(value: Any, out: List[Optional[Tuple[int, ...]]]) -> None:
    shape = shape_of(value)
    if shape is not None:
        out.append(shape)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_shapes(item, out)
    elif isinstance(value, dict):
        for item in value.values():
            _collect_shapes(item, out)
    else:
        out.append(None)
