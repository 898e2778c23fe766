"""Watching, while a profile is open, for the attributes a layer's calls may follow being changed.

A layer's figures are measured once per call key (its FLOPs by rule, its sizes) or learned from
two agreeing calls (its counted operations: :mod:`~tracetorch.adapters.torch.learned`), and a
key holds the call's tensors and plain arguments, not the Python state the layer reads:
``conv.stride = (2, 2)`` or ``layer.active_width = 64`` (a slimmable network's subnet) changes
what the next call of the same shapes returns, ``model.set_attn_implementation("eager")``
(which sets the transformers config's ``_attn_implementation``) what it runs. While a profile is
open, the ``__setattr__`` of each module class called in it (put on the class at its first call, as
its ``forward`` is wrapped: put on ``torch.nn.Module`` itself, it would cost each opening and
closing of a block ~125 µs, torch updating the slot of each of its subclasses) and of each
transformers config class defined when the profile opens (transformers gives each its own, which
calls its base's directly, not through the class) are watched. An attribute that held one value (on
the object, or on its class) set to another has every layer measured again at its next call, as a
replaced weight does (:func:`~tracetorch.engine.hotpath.structure_changed`: figures and learned
counts alike), for the first :data:`REMEASURED` changes of that attribute of that class in a
profiling session; after that it is taken for bookkeeping (a training engine's step counter, DDP's
``require_backward_grad_sync`` under ``no_sync``), and its changes only have every learned key
counted by the function mode again at its next call and compared
(:func:`~tracetorch.adapters.torch.learned.check_learned_again`): no call after a change replays
counts learned before it, and a key whose calls now run something else learns that anew.

A module given another class (``torch.nn.utils.parametrize.register_parametrization``, which
makes the weight a property computed by submodules at each call, and its removal) has every
layer measured again at each change.

Not watched, each for a reason: a module's names starting with ``_`` (a framework's own bookkeeping:
Lightning sets ``_current_fx_name`` at each of its hooks, several times a step; a config's are
watched, since transformers keeps its attention choice there); tensors and modules (parameters,
buffers and submodules: :mod:`~tracetorch.adapters.torch.structure`); ``training`` (in the call
key); an attribute set for the first time (a model built inside the block); an attribute of a module
none of whose class's instances was called yet in this opening of the profile (nothing of it
measured in it); a module's attribute set by its own call (``self.calls += 1`` in its ``forward``:
its bookkeeping, and a change it makes to its own path it made in calls that agreed before); state
no module or config holds (a global, an item of a dict). What is not watched is caught by the
learned counts' periodic check (:data:`~tracetorch.adapters.torch.learned.FIRST_BUDGET`), later and
with a warning; a size measured once per key is not measured again for it.

Example:
    >>> import torch, tracetorch
    >>> class Gate(torch.nn.Module):
    ...     double = False
    ...     def forward(self, x):
    ...         return x * 2 if self.double else x + 1
    >>> gate = Gate()
    >>> with torch.no_grad(), tracetorch.profile(gate) as prof:
    ...     for step in range(6):
    ...         gate.double = step >= 3              # learned from calls 1 and 2, then changed
    ...         _ = gate(torch.ones(4))
    >>> sorted((op.name, op.calls) for op in prof.find("").op_table())
    [('add', 3), ('mul', 3)]
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch

from tracetorch.adapters.base import all_subclasses
from tracetorch.adapters.torch.learned import check_learned_again
from tracetorch.engine.hotpath import innermost_frame, structure_changed
from tracetorch.engine.patches import PatchBoard

__all__ = ("REMEASURED", "start_path_watch", "watch_module_class")

#: A module's attributes that are not its own path's state, or that other watches cover.
_KEYED = frozenset({"training"})
#: How many changes of one attribute of one class have every layer measured again in a
#: profiling session; later ones have the learned counts checked only.
REMEASURED = 4
#: The changes seen so far this session, by class and attribute name.
_CHANGES: dict[tuple[type, str], int] = {}


def start_path_watch(board: PatchBoard) -> None:
    """Watch transformers-config attributes while ``board`` is open (it puts the originals back
    when it closes); module classes are watched from their first calls (:func:`watch_module_class`).

    Example:
        >>> board = PatchBoard()
        >>> start_path_watch(board)                  # (no profile open: nothing installed)
    """
    _CHANGES.clear()
    configuration = sys.modules.get("transformers.configuration_utils")
    config = getattr(configuration, "PreTrainedConfig", None) or getattr(
        configuration, "PretrainedConfig", None)
    if isinstance(config, type):
        for klass in all_subclasses(config):
            own = vars(klass).get("__setattr__")
            if own is not None:
                board.install(klass, "__setattr__", _watched(own, private=True))


def watch_module_class(board: PatchBoard, cls: type) -> None:
    """Watch the attributes of ``cls``'s instances while ``board`` is open (an instance of it is
    called for the first time in this opening), unless a base class is watched already.

    Example:
        >>> board = PatchBoard()
        >>> watch_module_class(board, torch.nn.ReLU)  # (no profile open: nothing installed)
        >>> "__setattr__" in vars(torch.nn.ReLU)
        False
    """
    current: Callable[[Any, str, Any], None] = cls.__setattr__  # type: ignore[assignment]
    if not getattr(current, "watches_paths", False):
        board.install(cls, "__setattr__", _watched(current, private=False))


def _watched(original: Callable[[Any, str, Any], None], private: bool
             ) -> Callable[[Any, str, Any], None]:
    # ``private``: whether names starting with "_" are watched too.
    def watched_setattr(self: Any, name: str, value: Any) -> None:
        if ((private or name[:1] != "_") and name not in _KEYED
                and not isinstance(value, (torch.Tensor, torch.nn.Module))
                and _changes(self, name, value)):
            frame = innermost_frame()
            if frame is None or frame.owner is not self:  # (not its own call's bookkeeping)
                _changed(type(self), name)
        elif name == "__class__" and value is not type(self):
            # Another class for the object (torch's parametrize makes a module a subclass that
            # computes its weight in submodules at each call; removing it makes it the old one):
            # another layer, measured again whatever it was.
            structure_changed()
        original(self, name, value)

    watched_setattr.__wrapped__ = original  # type: ignore[attr-defined]
    watched_setattr.watches_paths = True  # type: ignore[attr-defined]
    return watched_setattr


def _changed(klass: type, name: str) -> None:
    # Another value for ``klass``'s attribute ``name``: every layer measured again, or, once
    # that attribute changed often enough to be bookkeeping, the learned counts checked.
    seen = _CHANGES.get((klass, name), 0)
    if seen < REMEASURED:
        _CHANGES[(klass, name)] = seen + 1
        structure_changed()
    else:
        check_learned_again()


def _changes(holder: Any, name: str, value: Any) -> bool:
    # Whether setting ``name`` to ``value`` changes what ``holder.name`` read before (its own
    # attribute, its class's, a config's mapped name): an attribute new to both is not.
    try:
        old = getattr(holder, name)
    except Exception:  # (none yet, or one that cannot be read now: no change to see)
        return False
    if old is value:
        return False
    if type(old) is not type(value):
        return True
    try:
        return bool(old != value)
    except Exception:  # (an object whose comparison has no truth value: taken as changed)
        return True
