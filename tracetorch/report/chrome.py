"""Chrome / Perfetto trace export of a profile's timeline (ui.perfetto.dev, chrome://tracing).

Each recorded call becomes one complete event (``"ph": "X"``) with ``ts`` and ``dur`` in
microseconds (floats, so nanoseconds survive), ``cat`` the node's kind and ``args`` holding the
type, the call path, the node's FLOPs per call (own and inclusive) and the input/output shapes
it was seen with. Times are shifted so the first call starts at 0; the original clock reading is
kept under ``otherData.origin_ns``.

Events are sorted by start, then longest first, then shallowest first, so a viewer that nests
slices by order sees every child inside its parent. Thread ids are renumbered 1, 2, ... in
order of first activity (raw ``threading`` idents are 15-digit numbers) and named after the
original id by thread-name metadata. When the timeline was capped, an instant event and a
process label say how many calls were dropped.

Every name a viewer shows (slices, ``args``, process and thread names) has its control and bidi
characters escaped as the text reports escape them (:func:`~tracetorch.text.units.printable`);
the saved JSON profile is where names are kept exactly.

The file is written without indentation: traces are the large artefact users complain about.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root(); fc = root.child("fc", "Linear", "m0"); fc.time.add(3_000)
    >>> trace = chrome_trace_events(ProfileResult(root, timeline=[(fc, 10_000, 13_000, 7)]))
    >>> [(e["name"], e["ts"], e["dur"]) for e in trace["traceEvents"] if e["ph"] == "X"]
    [('fc', 0.0, 3.0)]
"""
from __future__ import annotations

import json
import numbers
import os
from typing import TYPE_CHECKING, Any, Union

from tracetorch.records.tree import CallNode, SubtreeSums
from tracetorch.text.units import format_shape, printable

if TYPE_CHECKING:  # reports only read results, a result never imports a report
    from tracetorch.records.result import ProfileResult

__all__ = ("chrome_trace_events", "export_chrome_trace", "PROCESS_NAME")

#: The process row's name in the viewer unless ``result.meta["name"]`` gives one.
PROCESS_NAME = "tracetorch"

PathLike = Union[str, "os.PathLike[str]"]


def _us(ns: int) -> float:
    # Three decimals of a microsecond is exactly the nanosecond clock's resolution.
    return round(ns / 1000.0, 3)


def _per_call(total: int | float, calls: int) -> int | float:
    if not calls:
        return 0
    value = total / calls
    return int(value) if float(value).is_integer() else value


def _args(node: CallNode, subtree_flops: int) -> dict[str, Any]:
    return {
        "type": printable(node.type_name),
        "path": printable(node.path),
        "flops": _per_call(node.flops, node.calls),
        "subtree_flops": _per_call(subtree_flops, node.calls),
        "input_shapes": [format_shape(s) for s in node.input_shapes],
        "output_shapes": [format_shape(s) for s in node.output_shapes],
    }


def chrome_trace_events(result: ProfileResult, origin: int | None = None) -> dict[str, Any]:
    """The trace-event document for ``result``'s timeline, ready for ``json.dump``.

    ``origin`` is the clock reading shown as time 0 (default: the first call's start); traces
    of several processes put side by side share one (``tracetorch.distributed``'s ranks).

    Raises:
        ValueError: the profile was recorded without a timeline.

    Example:
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> chrome_trace_events(ProfileResult(CallNode.root()))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: this profile has no timeline: record one with ...
    """
    if result.timeline is None:
        raise ValueError("this profile has no timeline: record one with "
                         "tracetorch.profile(timeline=True) to export a Chrome trace")
    meta_pid = result.meta.get("pid")
    # meta may hold a numpy integer (os.getpid() passed through an array, a loaded file's int).
    pid = int(meta_pid) if isinstance(meta_pid, numbers.Integral) and not isinstance(
        meta_pid, bool) else 1
    # Depth, inclusive FLOPs and args once per node, not once per call.
    order = list(result.root.walk())
    subtree = SubtreeSums(result.root).flops
    depth: dict[int, int] = {id(result.root): 0}
    for node in order[1:]:
        depth[id(node)] = depth.get(id(node.parent), node.depth - 1) + 1
    args: dict[int, dict[str, Any]] = {}

    def args_of(node: CallNode) -> dict[str, Any]:
        key = id(node)
        if key not in args:
            args[key] = _args(node, subtree.get(key, int(node.flops)))
        return args[key]

    def depth_of(node: CallNode) -> int:
        return depth[id(node)] if id(node) in depth else node.depth

    # Same start and length: the shallower call is the parent, so it must come first.
    calls = sorted(result.timeline, key=lambda e: (e[1], -(e[2] - e[1]), depth_of(e[0])))
    if origin is None:
        origin = calls[0][1] if calls else 0
    backward = list(result.backward_timeline or ())
    tids: dict[int, int] = {}
    for _, _, _, raw in calls + backward:
        tids.setdefault(raw, len(tids) + 1)

    names = result.meta.get("thread_names")
    names = names if isinstance(names, dict) else {}
    events: list[dict[str, Any]] = [{
        "ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
        "args": {"name": printable(str(result.meta.get("name", PROCESS_NAME)))},
    }]
    for raw, tid in tids.items():
        label = names.get(raw, names.get(str(raw), f"thread {raw}"))
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                       "args": {"name": printable(str(label))}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": 0,
                       "args": {"sort_index": tid}})
    for node, start, end, raw in calls:
        shown = args_of(node)
        events.append({
            "ph": "X", "name": shown["path"] or shown["type"], "cat": node.kind,
            "ts": _us(start - origin), "dur": _us(end - start), "pid": pid, "tid": tids[raw],
            "args": shown,
        })
    # Each layer's backward work, inside the backward pass's span on the same thread's row.
    for node, start, end, raw in sorted(backward, key=lambda e: (e[1], -(e[2] - e[1]))):
        shown = args_of(node)
        events.append({
            "ph": "X", "name": f"{shown['path'] or shown['type']} (backward)", "cat": "backward",
            "ts": _us(start - origin), "dur": _us(end - start), "pid": pid,
            "tid": tids.setdefault(raw, len(tids) + 1), "args": shown,
        })
    if result.dropped_events > 0:
        note = f"{result.dropped_events} events dropped (max_events reached)"
        last = max((end for _, _, end, _ in calls), default=origin)
        events.append({"ph": "i", "s": "p", "name": note, "cat": "tracetorch",
                       "ts": _us(last - origin), "pid": pid, "tid": 0,
                       "args": {"dropped_events": result.dropped_events}})
        events.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "ts": 0,
                       "args": {"labels": f"timeline capped: {note}"}})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {"origin_ns": origin, "dropped_events": int(result.dropped_events),
                      "producer": "tracetorch"},
    }


def export_chrome_trace(result: ProfileResult, path: PathLike) -> None:
    """Write ``result``'s timeline to ``path`` as a Chrome/Perfetto trace.

    Raises:
        ValueError: the profile was recorded without ``timeline=True``.

    Example:
        >>> import json, os, tempfile
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> root = CallNode.root(); fc = root.child("fc", "Linear", "m0"); fc.time.add(5)
        >>> path = os.path.join(tempfile.mkdtemp(), "run.trace.json")
        >>> export_chrome_trace(ProfileResult(root, timeline=[(fc, 0, 5, 1)]), path)
        >>> json.load(open(path))["displayTimeUnit"]
        'ns'
    """
    document = chrome_trace_events(result)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(document, f, separators=(",", ":"))
