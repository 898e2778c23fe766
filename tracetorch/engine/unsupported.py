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

__all__ = ("unsupported_calls", "warn_unsupported", "warn_rule_failed")

# Types already warned about as unsupported, process-wide, so a training loop warns once; kept
# apart for profiles that count no operations (``ops=False``), whose reason and advice differ.
_WARNED: set[str] = set()
_WARNED_UNCOUNTED: set[str] = set()


def unsupported_calls(root: CallNode) -> dict[str, int]:
    """Calls of leaf layers below ``root`` with no FLOP rule whose FLOPs nothing counted, by
    type."""
    counts: dict[str, int] = {}
    for node in root.walk():
        if node.flops_unknown:
            counts[node.type_name] = counts.get(node.type_name, 0) + node.calls
    return counts


def warn_unsupported(type_name: str, compiled: bool, stacklevel: int,
                     ops_counted: bool = True, uncounted: str | None = None) -> None:
    """Warn that ``type_name``'s FLOPs are unknown, unless this process warned about it already
    (``compiled``: the layer runs a compiled graph; ``ops_counted``: false for a profile with
    ``ops=False``, which did not look for its operations; ``uncounted``: the name of an
    operation it ran that computes with no formula). ``stacklevel`` is ``warnings.warn``'s,
    from the caller's point of view.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_unsupported("MyDocLayer", compiled=False, stacklevel=1, ops_counted=False)
        >>> "ops=False" in str(caught[0].message)
        True
    """
    warned = _WARNED if ops_counted or compiled else _WARNED_UNCOUNTED
    if type_name in warned:
        return
    warned.add(type_name)
    shown = printable(type_name)  # a class name with ESC or U+202E must not reach the terminal
    unknown = ("its FLOPs are unknown, shown as '?', and the FLOP counts that include it "
               "are lower bounds, marked '+'")
    if compiled:
        advice = (f"{shown} runs a compiled graph, which tracetorch cannot look "
                  f"into: {unknown}. Profile the module before compiling it for FLOPs; its "
                  f"time is measured either way.")
    elif uncounted is not None:
        advice = (f"{shown} runs {printable(uncounted)}, which tracetorch has no FLOP formula "
                  f"for: {unknown}. Register a rule with @tracetorch.flop_rule({shown}).")
    elif not ops_counted:
        advice = (f"tracetorch has no FLOP rule for {shown}, and this profile counts no tensor "
                  f"operations (ops=False): {unknown}. Profile with ops=True to count its "
                  f"operations, or register a rule with @tracetorch.flop_rule({shown}).")
    else:
        advice = (f"tracetorch has no FLOP rule for {shown} and saw no countable "
                  f"tensor operations in it: {unknown}. Register one "
                  f"with @tracetorch.flop_rule({shown}).")
    warnings.warn(advice, stacklevel=stacklevel + 1)


def warn_rule_failed(type_name: str, error: Exception, stacklevel: int) -> None:
    """Warn that tracetorch's own FLOP rule for ``type_name`` could not read a call (it raised
    ``error``): that call's FLOPs are unknown, and the model runs on (an error in a built-in
    rule is tracetorch's, never the model's). Once per type in the process.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_rule_failed("MyRuledLayer", ValueError("odd input"), stacklevel=1)
        >>> "MyRuledLayer" in str(caught[0].message) and "odd input" in str(caught[0].message)
        True
    """
    if type_name in _WARNED_FAILED:
        return
    _WARNED_FAILED.add(type_name)
    shown = printable(type_name)
    warnings.warn(
        f"tracetorch's FLOP rule for {shown} could not read a call ({printable(repr(error))}): "
        f"the FLOPs of such calls are unknown, and the counts that include them are lower "
        f"bounds, marked '+'. Register a rule with @tracetorch.flop_rule({shown}).",
        stacklevel=stacklevel + 1)


#: Types whose built-in rule raised on a call, warned about once per process.
_WARNED_FAILED: set[str] = set()
