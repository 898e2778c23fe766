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
from collections.abc import Iterable
from typing import Any

from tracetorch.engine.wrappers import is_wrapper, naming_through_wrappers
from tracetorch.models.introspect import is_layer, named_children_of, named_submodules
from tracetorch.models.subtree_params import subtree_parameter_counts
from tracetorch.models.tensors import nbytes

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
        # key -> a weak reference to its owner (the owner itself, until forget(), where it
        # takes none): the roots a top-level call is named under.
        self._by_key: dict[str, Any] = {}
        # id(root) -> {id(module): its path}: every layer below a root, walked once.
        self._paths: dict[int, dict[int, str]] = {}
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
            self._by_key.setdefault(known_key, owner)  # (a strong one, dropped by forget())
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
        self._by_key[key] = ref if ref is not None else owner
        return key

    def owner_of(self, key: str) -> Any:
        """The object ``key`` names, while it is still alive and known (else ``None``)."""
        held = self._by_key.get(key)
        return held() if isinstance(held, weakref.ref) else held

    def top_level_name(self, owner: Any, model: Any, roots: Iterable[tuple[str, str]]
                       ) -> str | None:
        """The name of a layer called outside every other layer's call (``model.encoder(x)``
        in a training loop, or from a plain method, ``model.decode(z)``): its path in
        ``model`` (the profiled one, if any), else in the first of ``roots`` — ``(name, key)``
        of the layers called at the top level before it, in order — that holds it, after that
        root's own name; ``None`` when none holds it.

        Each root's layers are named by one walk of it, at the first such call of the
        profile's opening (a layer added to it later is named by its type).
        """
        if model is not None:
            path = self._path_in(model, owner)
            if path is not None:
                return path
        for name, key in roots:
            root = self.owner_of(key)
            if root is None or root is owner or root is model:
                continue
            path = self._path_in(root, owner)
            if path is not None:
                return f"{name}.{path}" if name else path
        return None

    def _path_in(self, root: Any, owner: Any) -> str | None:
        paths = self._paths.get(id(root))
        if paths is None:
            paths = self._paths[id(root)] = {}
            self._owners.append(root)
            # Through data-parallel wrappers, paths are the wrapped model's (see .wrappers).
            model = root
            while naming_through_wrappers() and is_wrapper(model):
                model = model.module
            for path, module in named_submodules(model):
                paths.setdefault(id(module), path)
        return paths.get(id(owner))

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

    def forget_parameter_counts(self) -> None:
        """Count every module's parameters again when next asked (weights replaced or
        converted: :meth:`params_of`)."""
        self._param_counts.clear()

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
        self._paths.clear()
        self._owners.clear()
        for key, held in list(self._by_key.items()):
            if not isinstance(held, weakref.ref):
                del self._by_key[key]
        self.forget_parameter_counts()
