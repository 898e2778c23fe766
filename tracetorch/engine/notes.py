"""Facts an adapter adds to a profile's ``meta`` when the profile closes.

The profile (a layer above the adapters) reads what the adapters registered here, so that an
adapter never imports it: :func:`register_note` adds a function ``note(root, meta)``, and
:func:`add_notes` runs every one of them on a closing profile's tree and ``meta``. The torch
adapter notes its compiled regions (``meta["compiled"]``: see
:mod:`tracetorch.adapters.torch.compiled`).

Example:
    >>> from tracetorch.records.tree import CallNode
    >>> def count_children(root, meta):
    ...     meta["children"] = len(root.children)
    >>> register_note(count_children)
    >>> meta = {}
    >>> add_notes(CallNode.root(), meta)
    >>> meta["children"]
    0
    >>> unregister_note(count_children)
"""
from __future__ import annotations

from typing import Any, Callable

from tracetorch.records.tree import CallNode

__all__ = ("Note", "add_notes", "register_note", "unregister_note")

#: ``note(root, meta)``: adds what it knows of the tree ``root`` to ``meta``.
Note = Callable[[CallNode, dict[str, Any]], None]

_NOTES: list[Note] = []


def register_note(note: Note) -> None:
    """Run ``note`` on every profile that closes from now on (once however often it is
    registered)."""
    if note not in _NOTES:
        _NOTES.append(note)


def unregister_note(note: Note) -> None:
    """Stop running ``note`` (nothing if it is not registered)."""
    if note in _NOTES:
        _NOTES.remove(note)


def add_notes(root: CallNode, meta: dict[str, Any]) -> None:
    """Let every registered note add its facts about the tree ``root`` to ``meta``."""
    for note in list(_NOTES):
        note(root, meta)
