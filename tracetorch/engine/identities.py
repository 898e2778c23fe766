"""Who was called: a key per object, its name under its caller, its parameter count and bytes.

A profile's nodes are keyed by call path; what stands behind a node is the object called. This
module gives each object a key (stable across entries of the profile, checked through weak
references so a recycled id is never mistaken for the object), finds the name under which a
parent holds a child (the parent's direct children scanned once per parent, its whole subtree
only for a child reached through an attribute path), and counts parameters once per model
(every module below it in the same pass).

Example:
    >>> from tracetorch.core import Linear, Sequential
    >>> model = Sequential(Linear(2, 3), Linear(3, 1))
    >>> ids = Identities()
    >>> ids.name_in(model, model.layers[1]), ids.params_of(model.layers[0])
    ('layers.1', (9, 36))
    >>> ids.module_key(model) == ids.module_key(model) != ids.module_key(model.layers[0])
    True
"""
from __future__ import annotations

import weakref
from typing import Any

from tracetorch.introspect import is_layer, named_children_of, named_submodules
from tracetorch.subtree_params import subtree_parameter_counts
from tracetorch.tensors import nbytes

__all__ = ("Identities",)


class Identities:
    """The keys, names and parameter counts of the objects one profile has seen called."""

    def __init__(self, measure_bytes: bool = True) -> None:
        #: Count parameter bytes too (``profile(memory=...)``).
        self.measure_bytes = measure_bytes
        self._names: dict[int, dict[int, str]] = {}
        self._keys: dict[int, tuple[weakref.ref | None, str, type]] = {}
        self._next_key = 0
        self._owners: list[Any] = []  # strong references keep the ids above unambiguous
        # id -> (module, parameters, bytes): the module itself proves the id is not recycled.
        self._param_counts: dict[int, tuple[Any, int, int]] = {}

    def known_key(self, owner: Any) -> str | None:
        """``owner``'s key if this profile has given it one already (else ``None``)."""
        known = self._keys.get(id(owner))
        if known is None:
            return None
        known_ref, known_key, known_type = known
        return known_key if ((known_ref() is owner) if known_ref is not None
                             else type(owner) is known_type) else None

    def module_key(self, owner: Any) -> str:
        """The key naming ``owner`` in this profile (stable across entries of the profile)."""
        # Without a weak reference (``__slots__`` classes, builtins) the same id and type stand
        # for the same owner: a profile entered again must find its nodes again.
        known_key = self.known_key(owner)
        if known_key is not None:
            return known_key
        # Keys outlive a recording (by_module folds call sites by them, and a profile entered
        # again must find the same module), so they are counters checked through weak refs.
        key = f"m{self._next_key}"
        self._next_key += 1
        try:
            ref: weakref.ref | None = weakref.ref(owner)
        except TypeError:
            ref = None
        self._keys[id(owner)] = (ref, key, type(owner))
        self._owners.append(owner)
        return key

    def name_in(self, parent: Any, child: Any) -> str | None:
        names = self._names.get(id(parent))
        if names is not None and id(child) in names:
            return names[id(child)]
        if not is_layer(child):
            return None  # a function, an optimizer: no walk of a model finds one
        if names is None:
            self._owners.append(parent)
        # The parent's direct children, scanned once per parent, name nearly every call: naming
        # a whole model costs its size, not its size times its depth. Its whole subtree is
        # walked only for a layer called through an attribute path (``self.block.conv(x)``), or
        # added since the last scan.
        names = {}
        for path, module in named_children_of(parent):
            names.setdefault(id(module), path)
        if id(child) not in names:
            for path, module in named_submodules(parent):
                names.setdefault(id(module), path)
        self._names[id(parent)] = names
        return names.get(id(child))

    def params_of(self, owner: Any) -> tuple[int, int] | None:
        """``owner``'s parameter count and bytes; ``None`` while they cannot be counted yet (a
        lazy module, whose weights take their shape at its first call)."""
        known = self._param_counts.get(id(owner))
        if known is None or known[0] is not owner:
            # Once per model: every module below ``owner`` is counted in the same pass.
            try:
                counts = subtree_parameter_counts(owner)
                sizes = subtree_parameter_counts(owner, nbytes) if self.measure_bytes else []
            except ValueError:  # torch's uninitialized parameters have no size yet
                return None
            except (TypeError, AttributeError):
                counts, sizes = [(owner, 0)], []
            size_of = {id(module): size for module, size in sizes}
            for module, count in counts:
                self._param_counts[id(module)] = (module, count, size_of.get(id(module), 0))
            known = self._param_counts[id(owner)]
        return known[1], known[2]

    def owners_by_key(self) -> dict[str, Any]:
        """The objects called, by key, as far as they are still known (for grafting)."""
        found: dict[str, Any] = {}
        for owner in self._owners:
            known = self._keys.get(id(owner))
            if known is not None:
                found[known[1]] = owner
        for ref, key, _ in list(self._keys.values()):
            owner = ref() if ref is not None else None
            if owner is not None:
                found.setdefault(key, owner)
        return found

    def forget(self) -> None:
        """Drop every reference to the user's objects (a profile stops); keys stay, checked
        through their weak references, so a profile entered again finds its nodes again."""
        self._names.clear()
        self._owners.clear()
        self._param_counts.clear()
