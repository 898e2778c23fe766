"""Versioned JSON for profiles, the writing side: :func:`save_result` writes one to a file.

The document is one object::

    {"format": "tracetorch-profile", "version": 1,
     "meta": {...}, "root": {node}, "unsupported": {"Type": calls},
     "step_times": {TimeStats}, "step_phases": {"data": {TimeStats}, ...},
     "dropped_events": 0, "timeline": null}

A node holds its fields under the names :class:`~tracetorch.records.tree.CallNode` uses (``type``
for ``type_name``), its two :class:`~tracetorch.records.stats.TimeStats` in their own ``to_dict``
form (so quantiles survive the trip exactly), shapes as lists (``null`` for a non-tensor argument),
``memory`` (:class:`~tracetorch.records.memory.MemoryStats` fields), ``ops`` as ``[name, calls,
flops, time_ns]`` rows and ``children`` as a list in call order. The transient FLOP-rule cache is
not saved. ``step_phases``, ``memory`` and ``ops`` may be absent (files of earlier releases).

The timeline, when one was recorded, is saved as ``[node, start_ns, end_ns, thread_id]`` rows
(and ``backward_timeline``, the spans of each layer's backward work, the same way),
where ``node`` is the node's position in a depth-first, call-order walk of the saved tree (the
root is 0). Indices rather than dotted paths, because a name may itself contain dots, and because
the timeline is the bulky part of a file. It is capped when recorded, so the file stays bounded.

Reading a file back, strictly, is :mod:`tracetorch.records.jsonread`'s
(:func:`~tracetorch.records.jsonread.read_profile`,
:func:`~tracetorch.records.jsonread.parse_profile`). What both sides share lives here: the
format's name and version, :func:`deep_recursion` and the plain-number conversion.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(1_000)
    >>> node = result_to_dict(ProfileResult(root))["root"]["children"][0]
    >>> node["name"], node["type"], node["time"]["total_ns"], node["children"]
    ('fc', 'Linear', 1000, [])
"""
from __future__ import annotations

import contextlib
import json
import numbers
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Union

from tracetorch.records.tree import (
    CallNode,
    Completeness,
    ShapeSignature,
    SubtreeSums,
    TimelineEvent,
)

if TYPE_CHECKING:  # reports only read results, a result never imports a report
    from tracetorch.records.result import ProfileResult

__all__ = ("FORMAT_NAME", "FORMAT_VERSION", "PathLike", "deep_recursion", "plain_number",
           "result_to_dict", "save_result")

#: The ``"format"`` value every saved profile carries.
FORMAT_NAME = "tracetorch-profile"
#: The newest layout this module writes and :mod:`~tracetorch.records.jsonread` reads; bumped
#: on any incompatible change.
FORMAT_VERSION = 1

PathLike = Union[str, "os.PathLike[str]"]


# ------------------------------------------------------------------------------------ writing
def plain_number(value: Any) -> int | float:
    """``value`` as a plain int (when exact) or float: rules may hand back numpy integers or
    floats, and JSON wants plain numbers."""
    if isinstance(value, numbers.Integral):
        return int(value)
    as_float = float(value)
    return int(as_float) if as_float.is_integer() else as_float


def _jsonable(value: Any) -> Any:
    """Free-form metadata made JSON-safe: containers recurse, numpy scalars unwrap, rest is str."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return str(value)


def _dim(d: Any) -> int | str:
    # A symbolic dimension (a traced size) is kept as its text rather than failing the save.
    return int(d) if isinstance(d, numbers.Integral) else str(d)


def _signature_to_json(sig: ShapeSignature | None) -> list[list[Any] | None] | None:
    if sig is None:
        return None
    return [None if shape is None else [_dim(d) for d in shape] for shape in sig]


def _node_to_dict(node: CallNode, completeness: dict[int, Completeness]) -> dict[str, Any]:
    return {
        "name": node.name,
        "type": node.type_name,
        "kind": node.kind,
        "module_key": node.module_key,
        "time": node.time.to_dict(),
        "flops": plain_number(node.flops),
        "gemm_flops": plain_number(node.gemm_flops),
        "macs": None if node.macs is None else plain_number(node.macs),
        "flops_source": node.flops_source,
        # Derived (from flops_source and the tree), written for readers of the file itself.
        "completeness": completeness[id(node)],
        "params": int(node.params),
        "input_shapes": [_signature_to_json(s) for s in node.input_shapes],
        "output_shapes": [_signature_to_json(s) for s in node.output_shapes],
        "backward_time": node.backward_time.to_dict(),
        "backward_flops": plain_number(node.backward_flops),
        "backward_gemm_flops": plain_number(node.backward_gemm_flops),
        "errors": int(node.errors),
        "memory": node.memory.to_dict(),
        "ops": [[name, *row] for name, row in node.ops.items()],
        "children": [_node_to_dict(c, completeness) for c in node.children.values()],
    }


def result_to_dict(result: ProfileResult) -> dict[str, Any]:
    """A JSON-ready dict of ``result``; :func:`~tracetorch.records.jsonread.parse_profile`
    reads it back.

    Raises:
        ValueError: a timeline event refers to a node that is not in ``result.root``'s tree.

    Example:
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> data = result_to_dict(ProfileResult(CallNode.root()))
        >>> data["format"], data["version"], data["timeline"]
        ('tracetorch-profile', 1, None)
    """
    index = {id(node): i for i, node in enumerate(result.root.walk())}
    timeline = _events_to_rows(result.timeline, index)
    backward_timeline = _events_to_rows(result.backward_timeline, index)
    with deep_recursion():
        root = _node_to_dict(result.root, SubtreeSums(result.root).completeness)
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "meta": _jsonable(result.meta),
        "root": root,
        "unsupported": {str(k): int(v) for k, v in result.unsupported.items()},
        "step_times": result.step_times.to_dict(),
        "step_phases": {name: stats.to_dict() for name, stats in result.step_phases.items()},
        "dropped_events": int(result.dropped_events),
        "timeline": timeline,
        "backward_timeline": backward_timeline,
    }


def _events_to_rows(events: list[TimelineEvent] | None,
                    index: dict[int, int]) -> list[list[int]] | None:
    if events is None:
        return None
    rows = []
    for node, start, end, tid in events:
        if id(node) not in index:
            raise ValueError(f"timeline event for {node!r} refers to a node outside the tree")
        rows.append([index[id(node)], int(start), int(end), int(tid)])
    return rows


def save_result(result: ProfileResult, path: PathLike) -> None:
    """Write ``result`` to ``path`` as JSON (see the module docstring for the layout).

    Example:
        >>> import os, tempfile
        >>> from tracetorch.records.jsonread import read_profile
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> path = os.path.join(tempfile.mkdtemp(), "run.json")
        >>> save_result(ProfileResult(CallNode.root()), path)
        >>> read_profile(path).root.children
        {}
    """
    with deep_recursion():
        data = result_to_dict(result)
        # dumps, not dump: dump streams through Python generators, one per JSON level, which
        # costs a deep tree its depth squared; dumps runs the C encoder.
        text = json.dumps(data)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")


@contextlib.contextmanager
def deep_recursion() -> Iterator[None]:
    """Let a tree hundreds of levels deep be written, read and checked (each level is two JSON
    levels and a few frames): Python's recursion limit is raised inside, restored after."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, _DEEP_RECURSION_LIMIT))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


#: Enough for trees a few thousand levels deep.
_DEEP_RECURSION_LIMIT = 50_000
