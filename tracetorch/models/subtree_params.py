"""Parameter counts of a model and of every module below it, in one bottom-up pass: each
layer's ``params`` (and, measured in bytes, its ``param_bytes``) in a profile.

Calling :func:`~tracetorch.models.params.count_parameters` on each module would walk every subtree
again; here a parent's tensors are grown from its children's, so shared and tied tensors still
count once, by identity, and each module is visited once.

Example:
    >>> from tracetorch.core import Linear, Sequential
    >>> model = Sequential(Linear(4, 8), Linear(8, 2))
    >>> [n for _, n in subtree_parameter_counts(model)]
    [40, 18, 58]
"""
from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Callable

from tracetorch.models.introspect import is_torch_module
from tracetorch.models.params import check_model, iter_parameters
from tracetorch.models.tensors import numel

__all__ = ("subtree_parameter_counts",)


def subtree_parameter_counts(model: Any, size: Callable[[Any], int] = numel
                             ) -> list[tuple[Any, int]]:
    """``(module, count_parameters(module))`` for ``model`` and the modules below it, in one
    bottom-up pass, instead of walking each module's subtree again (``d**2`` at depth ``d``).
    ``size`` measures one tensor: elements (the default) or, with :func:`~tracetorch.\
tensors.nbytes`, bytes.

    A torch or ``tracetorch.core`` module holds its own tensors plus its children's, merged
    smaller into larger, so shared and tied tensors still count once. A module outside these
    rules (duck-typed, or with a ``parameters()`` of its own) is counted by
    :func:`~tracetorch.models.params.count_parameters`, and what is below it is not listed.

    Raises:
        TypeError: ``model`` is ``None`` or a class rather than an instance.

    Example:
        >>> from tracetorch.core import Linear, ReLU, Sequential
        >>> model = Sequential(Linear(4, 8), ReLU(), Linear(8, 2))
        >>> [(type(m).__name__, n) for m, n in subtree_parameter_counts(model)]
        [('Linear', 40), ('ReLU', 0), ('Linear', 18), ('Sequential', 58)]
    """
    check_model(model)
    counts: list[tuple[Any, int]] = []
    _Subtrees(counts, size).tensors(model)
    return counts


# A module's distinct tensors, ``{id: numel}``, and their total (in a list, to grow in place).
_Held = tuple[dict[int, int], list[int]]


class _Subtrees:
    """One pass of :func:`subtree_parameter_counts`: a parent's tensors are its largest
    child's, grown in place by the others' and its own (each tensor moves O(log n) times)."""

    def __init__(self, counts: list[tuple[Any, int]], size: Callable[[Any], int]) -> None:
        self.counts = counts
        self.size = size
        # Each module's tensors and total; None once a parent grew its own from them.
        self.held: dict[int, _Held | None] = {}
        # Modules counted by count_parameters' own rules, and those being counted right now.
        self.flat: set[int] = set()
        self.open: set[int] = set()

    def tensors(self, model: Any) -> _Held:
        """``model``'s tensors, every module below it counted on the way: depth first, on a
        stack of its own (a model nested deeper than Python's recursion limit is counted
        too)."""
        # Each open module: (module, its own tensors, its children, their tensors so far).
        stack: list[tuple[Any, list[Any], list[Any], list[_Held]]] = []
        done = self._enter(model, stack)
        while stack:
            module, own, children, below = stack[-1]
            if done is not None:
                below.append(done)
                done = None
            if len(below) < len(children):
                done = self._enter(children[len(below)], stack)
                continue
            stack.pop()
            done = self._leave(module, own, children, below)
        assert done is not None
        return done

    def _enter(self, module: Any, stack: list[tuple[Any, list[Any], list[Any], list[_Held]]]
               ) -> _Held | None:
        # ``module``'s tensors when they need no walk below it; else None, and it is opened.
        key = id(module)
        known = self.held.get(key)
        if known is not None:
            return known
        if key in self.held or key in self.open:
            # Under a second parent after the first took its tensors, or inside itself:
            # collected whole (this costs its subtree, only where modules are shared).
            return _grow(({}, [0]), _sized(iter_parameters(module), self.size))
        parts = _parts(module)
        if parts is None:
            return self._leave(module, None, None, None)
        self.open.add(key)
        stack.append((module, parts[0], parts[1], []))
        return None

    def _leave(self, module: Any, own: list[Any] | None, children: list[Any] | None,
               below: list[_Held] | None) -> _Held:
        # ``module``'s tensors from its children's (``below``) and its own, or by
        # count_parameters' rules (``children`` None).
        key = id(module)
        found: _Held | None = None
        if children is not None and own is not None and below is not None:
            self.open.discard(key)
            # What count_parameters sees of a child counted by other rules may differ from
            # what its parent's parameters() does: then the parent goes by those rules too.
            if not any(id(child) in self.flat for child in children):
                found = ({}, [0])
                if below:
                    largest = max(range(len(below)), key=lambda i: len(below[i][0]))
                    found = below[largest]
                    self.held[id(children[largest])] = None
                for other in below:
                    if other is not found:
                        _grow(found, other[0].items())
                _grow(found, _sized(own, self.size))
        if found is None:
            found = _grow(({}, [0]), _sized(iter_parameters(module), self.size))
            self.flat.add(key)
        self.held[key] = found
        self.counts.append((module, found[1][0]))
        return found


def _grow(found: _Held, sizes: Iterable[tuple[int, int]]) -> _Held:
    known, total = found
    for key, size in sizes:
        if key not in known:
            known[key] = size
            total[0] += size
    return found


def _sized(tensors: Iterable[Any], size: Callable[[Any], int]) -> Iterator[tuple[int, int]]:
    return ((id(t), size(t)) for t in tensors if t is not None)


def _parts(module: Any) -> tuple[list[Any], list[Any]] | None:
    """``(own tensors, children)`` when ``module``'s count is its own tensors plus its
    children's (torch and ``tracetorch.core`` modules that keep ``parameters()`` as it is)."""
    if is_torch_module(module):
        plain = _PLAIN_TORCH_CLASSES.get(type(module))
        if plain is None:
            base = sys.modules["torch"].nn.Module
            plain = _PLAIN_TORCH_CLASSES[type(module)] = _inherits(
                module, base, ("parameters", "named_parameters", "named_modules", "children"))
        if not plain:
            return None
        # What parameters(recurse=False) and children() yield, read from the dicts they walk
        # (a model is counted at the first call of each profile: their generators cost more
        # than the counting).
        own = [tensor for tensor in module._parameters.values() if tensor is not None]
        children: list[Any] = []
        seen: set[int] = set()
        for child in module._modules.values():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                children.append(child)
        return own, children
    base = getattr(sys.modules.get("tracetorch.core.layers"), "Module", None)
    if base is None or not isinstance(module, base) or not _inherits(module, base,
                                                                       ("parameters",)):
        return None
    children = list(module.children())
    # count_parameters also collects the items of a ``layers`` list: nothing new when they are
    # children, whose tensors parameters() has already.
    layers = getattr(module, "layers", None)
    if isinstance(layers, (list, tuple)) and not {id(c) for c in layers} <= {
            id(c) for c in children}:
        return None
    return [tensor for _, tensor in module._own_parameters()], children


#: Whether a torch module class keeps ``parameters()`` and its children as ``nn.Module`` has them.
_PLAIN_TORCH_CLASSES: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _inherits(module: Any, base: type, names: tuple[str, ...]) -> bool:
    return all(getattr(type(module), name) is getattr(base, name) for name in names)
