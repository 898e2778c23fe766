"""Parameter counts: one total for a model, or a per-module table of total, trainable and frozen.

Works for ``tracetorch.core`` modules, ``torch.nn.Module`` (torch is never imported here: a
torch model can only exist once the user has imported torch) and duck-typed models that keep
their tensors in ``layers``, ``parameters()`` or ``weight``/``bias``. A tensor shared by several
layers (tied embeddings, a block reused by three parents) is counted once, by identity. The
profiler's per-module counts, every subtree in one pass, are in
:mod:`tracetorch.models.subtree_params`.

Example:
    >>> import numpy as np
    >>> class Layer:
    ...     def __init__(self):
    ...         self.weight, self.bias = np.zeros((10, 5)), np.zeros(5)
    >>> count_parameters(Layer())
    55
"""
from __future__ import annotations

import functools
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracetorch.models.introspect import (
    declared_attribute,
    is_layer,
    is_torch_module,
    named_submodules,
)
from tracetorch.models.tensors import numel

__all__ = ("count_parameters", "parameter_table", "ParameterTable", "ParameterRow",
           "iter_parameters", "check_model")


def count_parameters(model: Any) -> int:
    """Number of distinct parameter elements in ``model``.

    Where the numbers come from, in the order of the TinyTorch guide: the model's ``layers``
    (each counted by these same rules), then its ``parameters()``, and only when it has neither,
    its ``weight`` and ``bias``, the layers it keeps in attributes (``self.fc1``; TinyTorch
    would say 0 there) and, for a layer (an object with ``forward``), its floating-point arrays
    under any name (``self.W``). A torch module is asked for ``parameters()`` alone, which is
    complete for torch (a ``layers`` ModuleList would miss embeddings and heads). Every tensor is
    counted once across the whole model, however many layers hold it. Objects with none of these
    (a bare Tensor, an activation) have 0 parameters, as in TinyTorch.

    Raises:
        TypeError: ``model`` is ``None``, a class rather than an instance, or never a model
            (a number, a string, a function).

    Example:
        >>> import numpy as np
        >>> class Shared:
        ...     def __init__(self):
        ...         w = np.zeros((4, 4))
        ...         self.layers = [Tied(w), Tied(w)]
        >>> class Tied:
        ...     def __init__(self, w):
        ...         self.weight = w
        >>> count_parameters(Shared())
        16
    """
    return sum(numel(p) for p in iter_parameters(model))


def iter_parameters(model: Any) -> Iterator[Any]:
    """Each distinct parameter object of ``model`` once, by the rules of :func:`count_parameters`.

    Example:
        >>> import numpy as np
        >>> class Layer:
        ...     weight = np.ones(3)
        >>> [p.tolist() for p in iter_parameters(Layer())]
        [[1.0, 1.0, 1.0]]
    """
    check_model(model)
    found: dict[int, Any] = {}
    _collect(model, found, set())
    return iter(found.values())


#: What is never a model: a count of its parameters would be a silent 0.
_NOT_MODELS = (bool, int, float, complex, str, bytes, np.number, types.FunctionType,
               types.BuiltinFunctionType, types.MethodType, functools.partial)


def check_model(model: Any) -> None:
    """Raise ``TypeError`` unless ``model`` can be a model whose parameters are counted.

    Example:
        >>> check_model(None)
        Traceback (most recent call last):
        ...
        TypeError: model: expected a model (layers, parameters() or weight/bias), got None
    """
    if model is None:
        raise TypeError("model: expected a model (layers, parameters() or weight/bias), got None")
    if isinstance(model, type):
        raise TypeError(f"model: expected a model instance, got the class {model.__name__}; "
                        "instantiate it first")
    if isinstance(model, _NOT_MODELS):
        raise TypeError(f"model: expected a model (an object with forward, layers, "
                        f"parameters() or arrays of weights), got {type(model).__name__}")


def _collect(obj: Any, found: dict[int, Any], visited: set[int]) -> None:
    # ``visited`` guards against containers that (directly or not) list themselves.
    if obj is None or id(obj) in visited:
        return
    visited.add(id(obj))
    if is_torch_module(obj):
        _add_all(obj.parameters(), found)
        return
    # (as the class or the object itself defines them: a catch-all __getattr__ is no answer)
    layers = declared_attribute(obj, "layers")
    parameters = declared_attribute(obj, "parameters")
    has_layers = isinstance(layers, (list, tuple))
    for layer in layers if isinstance(layers, (list, tuple)) else ():
        _collect(layer, found, visited)
    if callable(parameters):
        # Union with the layers' tensors: the dedup makes it safe, and a container that also
        # holds tensors of its own (an embedding beside its layer list) loses nothing.
        _add_all(parameters(), found)
    if not has_layers and not callable(parameters):
        _add_all((declared_attribute(obj, "weight"), declared_attribute(obj, "bias")), found)
        # Beyond TinyTorch, which says 0 here: a duck-typed model that keeps its layers in
        # attributes (``self.fc1 = Linear(...)``) is counted through them, and a layer's own
        # arrays under any name (``self.W``, ``self.b``) count as its weights.
        if is_layer(obj):
            _add_all(_attribute_arrays(obj), found)
        for _, layer in _attribute_layers(obj):
            _collect(layer, found, visited)


def _attribute_arrays(obj: Any) -> list[Any]:
    # Floating-point arrays (numpy, or a ``tracetorch.core`` Tensor's) held in the object's own
    # attributes: integer arrays are indices and masks, not weights.
    found = []
    for value in getattr(obj, "__dict__", {}).values():
        data = getattr(value, "data", None) if not isinstance(value, np.ndarray) else value
        if isinstance(data, np.ndarray) and np.issubdtype(data.dtype, np.floating):
            found.append(value)
    return found


def _attribute_layers(obj: Any) -> Iterator[tuple[str, Any]]:
    # The engine's walker names layers (objects with ``forward``) held in attributes, lists and
    # dicts, so the table's paths match the profile tree's.
    return named_submodules(obj)


def _add_all(params: Any, found: dict[int, Any]) -> None:
    for p in params:
        if p is not None:
            found.setdefault(id(p), p)


@dataclass(frozen=True)
class ParameterRow:
    """The tensors one module holds directly (tensors of its submodules have their own rows)."""

    path: str
    type_name: str
    total: int
    trainable: int
    buffers: int

    @property
    def frozen(self) -> int:
        """Parameters that do not require a gradient."""
        return self.total - self.trainable


@dataclass(frozen=True)
class ParameterTable:
    """Per-module parameter counts; ``str()`` renders it with a totals row.

    Buffers (torch running statistics and the like) are counted apart and are not in ``total``.
    """

    rows: tuple[ParameterRow, ...]

    @property
    def total(self) -> int:
        """All distinct parameters."""
        return sum(r.total for r in self.rows)

    @property
    def trainable(self) -> int:
        """Parameters that require a gradient."""
        return sum(r.trainable for r in self.rows)

    @property
    def frozen(self) -> int:
        """Parameters that do not require a gradient."""
        return sum(r.frozen for r in self.rows)

    @property
    def buffers(self) -> int:
        """Buffer elements, not included in :attr:`total`."""
        return sum(r.buffers for r in self.rows)

    def __iter__(self) -> Iterator[ParameterRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __str__(self) -> str:
        header = ("Module", "Type", "Total", "Trainable", "Frozen", "Buffers")
        lines = [(r.path or "(root)", r.type_name, r.total, r.trainable, r.frozen, r.buffers)
                 for r in self.rows]
        lines.append(("Total", "", self.total, self.trainable, self.frozen, self.buffers))
        cells = [header] + [(p, t) + tuple(f"{n:,}" for n in nums) for p, t, *nums in lines]
        widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
        rendered = []
        for row in cells:
            text = [row[i].ljust(widths[i]) for i in range(2)]
            text += [row[i].rjust(widths[i]) for i in range(2, len(header))]
            rendered.append("  ".join(text).rstrip())
        rendered.insert(1, "-" * len(rendered[0]))
        rendered.insert(len(rendered) - 1, "-" * len(rendered[0]))
        return "\n".join(rendered)


def parameter_table(model: Any) -> ParameterTable:
    """Total, trainable, frozen and buffer counts per module path, and their totals.

    Only modules that hold a tensor directly get a row, so the rows add up to the totals.
    Paths come from ``named_modules()`` when the model has it (torch, ``tracetorch.core``),
    otherwise from its attributes and ``layers`` lists. A shared tensor belongs to the first
    path that holds it. A parameter is trainable when its ``requires_grad`` is true (a plain
    array, which has no such flag, counts as trainable).

    Raises:
        TypeError: ``model`` is ``None`` or a class rather than an instance.

    Example:
        >>> import numpy as np
        >>> class Layer:
        ...     def __init__(self):
        ...         self.weight, self.bias = np.zeros((10, 5)), np.zeros(5)
        ...     def forward(self, x):
        ...         return x
        >>> table = parameter_table(Layer())
        >>> table.total, table.trainable, [r.path for r in table]
        (55, 55, [''])
    """
    check_model(model)
    if callable(getattr(model, "named_modules", None)):
        holders = _named_holders(model)
    else:
        holders = _duck_holders(model)
    rows = []
    for path, type_name, params, buffers in holders:
        if params or buffers:
            trainable = sum(numel(p) for p in params if getattr(p, "requires_grad", True))
            rows.append(ParameterRow(path, type_name, sum(numel(p) for p in params), trainable,
                                     sum(numel(b) for b in buffers)))
    return ParameterTable(tuple(rows))


# (path, type name, parameters held directly, buffers held directly)
_Holder = tuple[str, str, list[Any], list[Any]]


def _named_holders(model: Any) -> list[_Holder]:
    holders: dict[str, _Holder] = {"": ("", type(model).__name__, [], [])}
    for path, module in model.named_modules():
        holders.setdefault(path, (path, type(module).__name__, [], []))
    seen: set[int] = set()
    for method, is_buffer in (("named_parameters", False), ("named_buffers", True)):
        named = getattr(model, method, None)
        if not callable(named):
            continue
        for name, tensor in named():
            if tensor is None or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            holder = holders[_owner(name, holders)]
            (holder[3] if is_buffer else holder[2]).append(tensor)
    return list(holders.values())


def _owner(name: str, holders: dict[str, _Holder]) -> str:
    # The longest module path that prefixes the name: "blocks.0.ws.1" held in a list
    # attribute ``ws`` of module "blocks.0" belongs to that module.
    path = name
    while path:
        path = path.rpartition(".")[0]
        if path in holders:
            return path
    return ""


def _duck_holders(model: Any) -> list[_Holder]:
    # A duck-typed model names nothing itself. Its parameters are those count_parameters finds;
    # each goes to the deepest layer (from attributes or ``layers`` lists) holding it directly,
    # else to the root, so the table's total always equals count_parameters.
    wanted = {id(p): p for p in iter_parameters(model)}
    modules: list[tuple[str, Any]] = [("", model)] + list(_attribute_layers(model))
    modules += list(_layer_lists(model, "", {id(o) for _, o in modules}, set()))
    owner: dict[int, str] = {}
    for path, obj in sorted(modules, key=lambda item: -item[0].count(".") - bool(item[0])):
        for tensor in _direct_tensors(obj):
            if id(tensor) in wanted:
                owner.setdefault(id(tensor), path)
    held: dict[str, list[Any]] = {path: [] for path, _ in modules}
    for key, tensor in wanted.items():
        held[owner.get(key, "")].append(tensor)
    return [(path, type(obj).__name__, held[path], []) for path, obj in modules]


def _layer_lists(obj: Any, prefix: str, seen: set[int],
                 visited: set[int]) -> Iterator[tuple[str, Any]]:
    # Layers without a ``forward`` (plain weight holders) are invisible to the engine's walker.
    layers = getattr(obj, "layers", None)
    if not isinstance(layers, (list, tuple)) or id(obj) in visited:
        return
    visited.add(id(obj))
    for i, layer in enumerate(layers):
        path = f"{prefix}layers.{i}"
        if layer is not None and id(layer) not in seen:
            seen.add(id(layer))
            yield path, layer
        yield from _layer_lists(layer, path + ".", seen, visited)


def _direct_tensors(obj: Any) -> list[Any]:
    tensors = [getattr(obj, "weight", None), getattr(obj, "bias", None)]
    parameters: Any | None = getattr(obj, "parameters", None)
    if callable(parameters):
        tensors += list(parameters())
    return [t for t in tensors if t is not None]
