"""Framework-neutral looks at models: what is a layer, submodules' names, and a call's
arguments bound to its layer's ``forward``. Shapes, sizes and inputs of tensors are in
:mod:`tracetorch.models.tensors`.

Everything here works on ``tracetorch.core`` modules, ``torch.nn.Module`` and duck-typed models
(objects with a ``forward`` and layers kept in attributes or lists), without importing torch: a
torch model can only exist once the user has imported it.

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

import inspect
import sys
import weakref
from collections.abc import Iterator
from typing import Any

from tracetorch.flops.registry import hooks_run_inside

__all__ = ("computes_a_weight", "declared_attribute", "is_layer", "is_torch_module",
           "is_stateless",
           "only_calls_children", "runs_sequential_forward", "runs_compiled_graph",
           "bound_inputs", "returns_an_input",
           "named_submodules", "named_children_of", "layer_classes")

# Attributes never worth descending into when walking a duck-typed model.
_SKIP_ATTRS = frozenset({"__dict__", "__weakref__", "__class__"})


def declared_attribute(obj: Any, name: str) -> Any:
    """``obj.name`` where its class (through the MRO) or its own ``__dict__`` defines it, else
    ``None``: never a value a catch-all ``__getattr__`` makes up for any name asked.

    Probing a model with ``getattr``/``hasattr`` would take such an object's answer for every
    attribute as real (a ``named_modules`` that returns anything at all). For methods and
    plain attributes: what a framework keeps elsewhere and serves through its own
    ``__getattr__`` (a torch module's registered submodules and parameters) is not seen.

    Example:
        >>> class Anything:
        ...     def forward(self, x):
        ...         return x
        ...     def __getattr__(self, name):
        ...         return lambda *args: 1
        >>> declared_attribute(Anything(), "named_modules") is None
        True
        >>> declared_attribute(Anything(), "forward")(3)
        3
    """
    if hasattr(type(obj), name):  # looked up on the class: no instance __getattr__ runs
        return getattr(obj, name, None)
    try:
        return vars(obj).get(name)
    except TypeError:  # no __dict__ (__slots__, builtins)
        return None


def is_layer(obj: Any) -> bool:
    """Whether ``obj`` looks like a layer: an instance (not a class) with a callable ``forward``
    that its class or its own ``__dict__`` defines (see :func:`declared_attribute`)."""
    return not isinstance(obj, type) and callable(declared_attribute(obj, "forward"))


def computes_a_weight(obj: Any) -> bool:
    """Whether ``obj`` computes a parametrized layer's weight when the layer reads it (torch's
    ``ParametrizationList``: ``weight_norm``, ``orthogonal``, a LoRA written with
    ``torch.nn.utils.parametrize``), without importing torch. A FLOP rule counts what the layer
    does with its weight: what computing the weight costs adds to that.

    Example:
        >>> computes_a_weight(object())
        False
    """
    parametrize = sys.modules.get("torch.nn.utils.parametrize")
    lists = getattr(parametrize, "ParametrizationList", None)
    return lists is not None and isinstance(obj, lists)


def is_torch_module(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.nn.Module``, without importing torch.

    A torch module cannot exist unless torch was imported, so checking ``sys.modules`` is enough.

    Example:
        >>> is_torch_module(object())
        False
    """
    torch = sys.modules.get("torch")
    nn = getattr(torch, "nn", None)
    return nn is not None and isinstance(obj, nn.Module)


def is_stateless(obj: Any) -> bool:
    """Whether a torch or ``tracetorch.core`` module holds nothing of its own: no parameters,
    buffers or submodules (a loss, an activation). Anything else is not.

    Example:
        >>> from tracetorch.core import Linear, ReLU
        >>> is_stateless(ReLU()), is_stateless(Linear(2, 2)), is_stateless(object())
        (True, False, False)
    """
    if is_torch_module(obj):
        # (a loss keeps ``weight=None`` as a registered buffer: None holds nothing)
        return not (obj._modules or any(t is not None for t in obj._parameters.values())
                    or any(t is not None for t in obj._buffers.values()))
    core = sys.modules.get("tracetorch.core.layers")
    if core is not None and isinstance(obj, core.Module):
        return not (list(obj.parameters()) or list(obj.children()))
    return False


def runs_compiled_graph(obj: Any) -> bool:
    """Whether ``obj`` is a torch module whose calls run a compiled graph (``torch.jit.script``
    or ``trace``, ``torch.compile``), which no Python-level counting can look into.

    Example:
        >>> import torch
        >>> runs_compiled_graph(torch.jit.script(torch.nn.ReLU())), runs_compiled_graph(object())
        (True, False)
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.nn.Module):
        return False
    cls = type(obj)
    return isinstance(obj, torch.jit.ScriptModule) or (
        cls.__module__ == "torch._dynamo.eval_frame" and cls.__qualname__ == "OptimizedModule")


def runs_sequential_forward(obj: Any) -> bool:
    """Whether ``obj`` is a torch container whose ``forward`` is ``nn.Sequential``'s own: it
    runs its children one after the other and no operation of its own.

    Example:
        >>> import torch
        >>> class Block(torch.nn.Sequential):
        ...     def forward(self, x):
        ...         return super().forward(x) + x       # an operation of its own
        >>> runs_sequential_forward(torch.nn.Sequential()), runs_sequential_forward(Block())
        (True, False)
    """
    torch = sys.modules.get("torch")
    nn = getattr(torch, "nn", None)
    if nn is None or not isinstance(obj, nn.Sequential):
        return False
    for klass in type(obj).__mro__:  # the class that defines forward, wrapped or not
        if "forward" in vars(klass):
            return klass is nn.Sequential
    return False


def only_calls_children(obj: Any) -> bool:
    """Whether ``obj`` runs no operation in its own call: a container with ``nn.Sequential``'s
    ``forward`` (:func:`runs_sequential_forward`) none of whose children has forward hooks,
    which torch runs in its call (see :func:`~tracetorch.flops.registry.hooks_run_inside`).

    Example:
        >>> import torch
        >>> block = torch.nn.Sequential(torch.nn.ReLU())
        >>> handle = block[0].register_forward_hook(lambda *args: None)
        >>> runs_sequential_forward(block), only_calls_children(block)
        (True, False)
        >>> handle.remove()
    """
    return runs_sequential_forward(obj) and not hooks_run_inside(obj, deep=False)


def named_submodules(model: Any) -> Iterator[tuple[str, Any]]:
    """Every layer below ``model`` with its dotted path, each object once, in definition order.

    Frameworks that name their own submodules (``named_modules()``) are asked; other objects
    are walked through their attributes, lists, tuples and dicts. The walks keep a stack of
    their own (as torch's ``named_modules`` is walked, where a class keeps it as torch has it),
    not Python's: a model nested deeper than the recursion limit allows is walked all the same,
    and a walk begun deep in a call (naming a layer at its first call) needs no stack either.
    """
    if isinstance(model, type):
        return
    if _plain_named_modules(model):
        yield from _walk_torch(model)
        return
    named_modules = declared_attribute(model, "named_modules")
    if callable(named_modules):
        for name, module in named_modules():
            if module is not model:
                yield name, module
        return
    yield from _walk_attributes(model)


def _plain_named_modules(obj: Any) -> bool:
    # A torch module whose class keeps named_modules() as nn.Module has it: its walk is the one
    # of ``_modules`` below, made without recursion.
    return is_torch_module(obj) and _plain_torch_class(type(obj))


#: Per torch module class: whether it keeps ``named_modules`` as ``nn.Module`` has it.
_PLAIN_WALKS: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _plain_torch_class(cls: type) -> bool:
    plain = _PLAIN_WALKS.get(cls)
    if plain is None:
        plain = _PLAIN_WALKS[cls] = (
            getattr(cls, "named_modules", None) is sys.modules["torch"].nn.Module.named_modules)
    return plain


def _walk_torch(model: Any) -> Iterator[tuple[str, Any]]:
    # What named_modules() yields below ``model``, in its order (depth first, each module once,
    # ``None`` entries skipped); a module whose class walks itself otherwise is asked for its
    # own walk. (Everything in ``_modules`` is a torch module: add_module checks.)
    seen = {id(model)}
    stack = [(name, child) for name, child in reversed(model._modules.items())
             if child is not None]
    plain = _PLAIN_WALKS
    while stack:
        path, module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        yield path, module
        if not (plain.get(type(module)) or _plain_torch_class(type(module))):
            for name, below in module.named_modules(prefix=path):
                if id(below) not in seen:
                    seen.add(id(below))
                    yield name, below
            continue
        children = module._modules
        if not children:
            continue
        prefix = path + "."
        for name, child in reversed(children.items()):
            if child is not None:
                stack.append((prefix + name, child))


def _walk_attributes(model: Any) -> Iterator[tuple[str, Any]]:
    # Depth first, each layer once, under the first path that reaches it: one iterator per open
    # level on a stack of its own.
    seen = {id(model)}
    stack = [_layers_below(model, "")]
    while stack:
        for path, layer in stack[-1]:
            if id(layer) not in seen:
                seen.add(id(layer))
                yield path, layer
                stack.append(_layers_below(layer, path + "."))
                break
        else:
            stack.pop()


def _layers_below(obj: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    for name, value in _attribute_items(obj):
        yield from _layers_in(value, prefix + name)


def _attribute_items(obj: Any) -> list[tuple[str, Any]]:
    try:
        items = vars(obj)
    except TypeError:  # objects with __slots__ and no __dict__
        return []
    return [(k, v) for k, v in items.items() if k not in _SKIP_ATTRS and not k.startswith("__")]


def _layers_in(value: Any, path: str) -> Iterator[tuple[str, Any]]:
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


def layer_classes(model: Any) -> list[type]:
    """The classes of ``model`` and of every layer below it, each once."""
    classes: dict[type, None] = {type(model): None} if is_layer(model) else {}
    for _, layer in named_submodules(model):
        classes.setdefault(type(layer), None)
    return list(classes)


def named_children_of(model: Any) -> Iterator[tuple[str, Any]]:
    """The layers directly below ``model``, named as :func:`named_submodules` names them: the
    first level of the same walk, for finding a layer under its caller without walking the
    caller's whole subtree.

    Frameworks that name their children (``named_children()``: torch, ``tracetorch.core``) are
    asked; other objects are scanned one level deep (attributes, lists, tuples, dicts). An object
    that names its modules only through ``named_modules()`` yields nothing: walk it with
    :func:`named_submodules`.

    Example:
        >>> class Leaf:
        ...     def forward(self, x):
        ...         return x
        >>> class Net:
        ...     def __init__(self):
        ...         self.head, self.blocks = Leaf(), [Leaf(), Leaf()]
        ...     def forward(self, x):
        ...         return x
        >>> [name for name, _ in named_children_of(Net())]
        ['head', 'blocks.0', 'blocks.1']
    """
    if isinstance(model, type):
        return
    named_modules = declared_attribute(model, "named_modules")
    if callable(named_modules):
        named_children = declared_attribute(model, "named_children")
        if callable(named_children):
            yield from ((name, child) for name, child in named_children() if child is not model)
        return
    seen = {id(model)}
    for name, value in _attribute_items(model):
        for path, layer in _layers_in(value, name):
            if id(layer) not in seen:
                seen.add(id(layer))
                yield path, layer


#: Each layer class's ``forward`` signature (``None`` where it has none to read).
_SIGNATURES: weakref.WeakKeyDictionary[type, inspect.Signature | None] = (
    weakref.WeakKeyDictionary())


def _forward_signature(cls: type) -> inspect.Signature | None:
    try:
        return _SIGNATURES[cls]
    except KeyError:
        pass
    try:
        found: inspect.Signature | None = inspect.signature(cls.forward)  # type: ignore[attr-defined]
    except (TypeError, ValueError, AttributeError):
        found = None
    try:
        _SIGNATURES[cls] = found
    except TypeError:  # a class that cannot be weakly referenced: read again next time
        pass
    return found


def returns_an_input(args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> bool:
    """Whether a call handed back one of its own arguments (an identity, a DropPath in eval).

    Example:
        >>> x = [1]
        >>> returns_an_input((x,), {}, x), returns_an_input((x,), {}, [1])
        (True, False)
    """
    return any(output is value for value in args) or any(
        output is value for value in kwargs.values())


def bound_inputs(layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """A call's arguments as the positional inputs its FLOP rule reads: ``args`` as they are
    when there are no keyword arguments; otherwise every parameter of ``layer``'s ``forward``
    in order, keyword arguments in their place and defaults applied (``*args`` spread, then
    ``**kwargs`` values), so ``lstm(input=x)`` is ruled like ``lstm(x)``. Arguments the
    signature does not take are appended as given.

    Example:
        >>> class Layer:
        ...     def forward(self, x, offsets=None, weights=None):
        ...         return x
        >>> bound_inputs(Layer(), (1,), {"weights": 3})
        (1, None, 3)
        >>> bound_inputs(Layer(), (), {"x": 1})
        (1, None, None)
    """
    if not kwargs:
        return args
    signature = _forward_signature(type(layer))
    if signature is None:
        return args + tuple(kwargs.values())
    try:
        bound = signature.bind(layer, *args, **kwargs)
    except TypeError:
        return args + tuple(kwargs.values())
    bound.apply_defaults()
    values: list[Any] = []
    for index, (name, parameter) in enumerate(signature.parameters.items()):
        if index == 0:
            continue  # self
        value = bound.arguments.get(name)
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            values.extend(value or ())
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            values.extend((value or {}).values())
        else:
            values.append(value)
    return tuple(values)
