"""Layers whose FLOPs nothing counted: listed per profile, warned about once per process.

A leaf layer with no FLOP rule that ran no countable tensor operation has unknown FLOPs, never a
silent zero: :func:`unsupported_calls` lists such layers' calls by type for
``prof.unsupported``, and :func:`warn_unsupported` warns once per type in the whole process (a
training loop of a million steps warns once), saying how to add a rule, or that the layer runs
a compiled graph that cannot be looked into.

Example:
    >>> from tracetorch.records.tree import CallNode
    >>> unsupported_calls(CallNode.root())
    {}
"""
from __future__ import annotations

import warnings

from tracetorch.records.tree import CallNode
from tracetorch.text.units import printable

__all__ = ("unsupported_calls", "warn_unsupported")

# Types already warned about as unsupported, process-wide, so a training loop warns once.
_WARNED: set[str] = set()


def unsupported_calls(root: CallNode) -> dict[str, int]:
    """Calls of leaf layers below ``root`` with no FLOP rule whose FLOPs nothing counted, by
    type."""
    counts: dict[str, int] = {}
    for node in root.walk():
        if node.flops_unknown:
            counts[node.type_name] = counts.get(node.type_name, 0) + node.calls
    return counts


def warn_unsupported(type_name: str, compiled: bool, stacklevel: int) -> None:
    """Warn that ``type_name``'s FLOPs are unknown, unless this process warned about it already
    (``compiled``: the layer runs a compiled graph). ``stacklevel`` is ``warnings.warn``'s, from
    the caller's point of view."""
    if type_name in _WARNED:
        return
    _WARNED.add(type_name)
    shown = printable(type_name)  # a class name with ESC or U+202E must not reach the terminal
    unknown = ("its FLOPs are unknown, shown as '?', and the FLOP counts that include it "
               "are lower bounds, marked '+'")
    if compiled:
        advice = (f"{shown} runs a compiled graph, which tracetorch cannot look "
                  f"into: {unknown}. Profile the module before compiling it for FLOPs; its "
                  f"time is measured either way.")
    else:
        advice = (f"tracetorch has no FLOP rule for {shown} and saw no countable "
                  f"tensor operations in it: {unknown}. Register one "
                  f"with @tracetorch.flop_rule({shown}).")
    warnings.warn(advice, stacklevel=stacklevel + 1)
