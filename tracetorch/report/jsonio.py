"""Versioned JSON for profiles: :func:`save_result` writes one, :func:`read_profile` reads it back.

The document is one object::

    {"format": "tracetorch-profile", "version": 1,
     "meta": {...}, "root": {node}, "unsupported": {"Type": calls},
     "step_times": {TimeStats}, "step_phases": {"data": {TimeStats}, ...},
     "dropped_events": 0, "timeline": null}

A node holds its fields under the names :class:`~tracetorch.tree.CallNode` uses (``type`` for
``type_name``), its two :class:`~tracetorch.stats.TimeStats` in their own ``to_dict`` form (so
quantiles survive the trip exactly), shapes as lists (``null`` for a non-tensor argument),
``memory`` (:class:`~tracetorch.memory.MemoryStats` fields), ``ops`` as ``[name, calls, flops,
time_ns]`` rows and ``children`` as a list in call order. The transient FLOP-rule cache is not
saved. ``step_phases``, ``memory`` and ``ops`` may be absent (files of earlier releases).

The timeline, when one was recorded, is saved as ``[node, start_ns, end_ns, thread_id]`` rows
(and ``backward_timeline``, the spans of each layer's backward work, the same way),
where ``node`` is the node's position in a depth-first, call-order walk of the saved tree (the
root is 0). Indices rather than dotted paths, because a name may itself contain dots, and because
the timeline is the bulky part of a file. It is capped when recorded, so the file stays bounded.

Reading is strict: anything but a version-1 profile raises :class:`ValueError` naming the file
and the problem (the JSON location of a bad field). A missing file raises the usual
:class:`FileNotFoundError`, unchanged, as ``open`` would.

This module only reads results and never builds one: :func:`parse_profile` and
:func:`read_profile` return the validated parts as a :class:`SavedProfile`, which
:meth:`ProfileResult.from_dict() <tracetorch.result.ProfileResult.from_dict>`,
:meth:`ProfileResult.load() <tracetorch.result.ProfileResult.load>` and :func:`tracetorch.load`
assemble. So ``tracetorch.result`` imports ``report/`` and nothing here imports it back.

Example:
    >>> from tracetorch.result import ProfileResult
    >>> from tracetorch.tree import CallNode
    >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(1_000)
    >>> parts = parse_profile(result_to_dict(ProfileResult(root)))
    >>> parts.root.find("fc").calls, parts.timeline, parts.dropped_events
    (1, None, 0)
"""
from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, Union, cast, get_args

from tracetorch.memory import FIELDS as MEMORY_FIELDS
from tracetorch.stats import TimeStats
from tracetorch.tree import (
    CallNode,
    Completeness,
    NodeKind,
    ShapeSignature,
    SubtreeSums,
    TimelineEvent,
)

if TYPE_CHECKING:  # reports only read results: tracetorch.result imports report/, not the reverse
    from tracetorch.result import ProfileResult

__all__ = (
    "FORMAT_NAME", "FORMAT_VERSION", "SavedProfile", "result_to_dict", "parse_profile",
    "save_result", "read_profile",
)

#: The ``"format"`` value every saved profile carries.
FORMAT_NAME = "tracetorch-profile"
#: The newest layout this module writes and reads; bumped on any incompatible change.
FORMAT_VERSION = 1

PathLike = Union[str, "os.PathLike[str]"]
_NODE_KINDS: tuple[str, ...] = get_args(NodeKind)
_STATS_KEYS = ("count", "total_ns", "min_ns", "max_ns", "mean_ns", "m2", "buckets")


# ------------------------------------------------------------------------------------ writing
def _number(value: Any) -> int | float:
    # Rules may hand back numpy integers or floats; JSON wants plain numbers, ints when exact.
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
        "flops": _number(node.flops),
        "gemm_flops": _number(node.gemm_flops),
        "macs": None if node.macs is None else _number(node.macs),
        "flops_source": node.flops_source,
        # Derived (from flops_source and the tree), written for readers of the file itself.
        "completeness": completeness[id(node)],
        "params": int(node.params),
        "input_shapes": [_signature_to_json(s) for s in node.input_shapes],
        "output_shapes": [_signature_to_json(s) for s in node.output_shapes],
        "backward_time": node.backward_time.to_dict(),
        "backward_flops": _number(node.backward_flops),
        "backward_gemm_flops": _number(node.backward_gemm_flops),
        "errors": int(node.errors),
        "memory": node.memory.to_dict(),
        "ops": [[name, *row] for name, row in node.ops.items()],
        "children": [_node_to_dict(c, completeness) for c in node.children.values()],
    }


def result_to_dict(result: ProfileResult) -> dict[str, Any]:
    """A JSON-ready dict of ``result``; :func:`parse_profile` reads it back.

    Raises:
        ValueError: a timeline event refers to a node that is not in ``result.root``'s tree.

    Example:
        >>> from tracetorch.result import ProfileResult
        >>> from tracetorch.tree import CallNode
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
        >>> from tracetorch.result import ProfileResult
        >>> from tracetorch.tree import CallNode
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


# ------------------------------------------------------------------------------------ reading
class SavedProfile(NamedTuple):
    """The validated parts of a saved profile, named and ordered as ``ProfileResult``'s
    constructor takes them (``ProfileResult(*parts)`` rebuilds the result)."""

    root: CallNode
    unsupported: dict[str, int]
    timeline: list[TimelineEvent] | None
    dropped_events: int
    step_times: TimeStats
    meta: dict[str, Any]
    step_phases: dict[str, TimeStats]
    backward_timeline: list[TimelineEvent] | None


class _Reader:
    """Typed field access that fails with the file name and the JSON location of the problem."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str) -> NoReturn:
        raise ValueError(f"{self.source}: corrupt tracetorch profile: {where}: {problem}")

    def field(self, obj: dict[str, Any], key: str, where: str) -> Any:
        if key not in obj:
            self.fail(where or "top level", f"missing key {key!r}")
        return obj[key]

    def _expect(self, ok: bool, value: Any, where: str, expected: str) -> None:
        if not ok:
            self.fail(where, f"expected {expected}, got {type(value).__name__} {value!r:.60}")

    def obj(self, value: Any, where: str) -> dict[str, Any]:
        self._expect(isinstance(value, dict), value, where, "an object")
        return value

    def lst(self, value: Any, where: str) -> list[Any]:
        self._expect(isinstance(value, list), value, where, "a list")
        return value

    def text(self, value: Any, where: str) -> str:
        self._expect(isinstance(value, str), value, where, "a string")
        return value

    def integer(self, value: Any, where: str, minimum: int | None = None) -> int:
        self._expect(isinstance(value, int) and not isinstance(value, bool), value, where,
                     "an integer")
        if minimum is not None and value < minimum:
            self.fail(where, f"expected an integer >= {minimum}, got {value!r}")
        return int(value)

    def number(self, value: Any, where: str) -> int | float:
        self._expect(isinstance(value, (int, float)) and not isinstance(value, bool), value,
                     where, "a number")
        return _number(value)

    def stats(self, value: Any, where: str) -> TimeStats:
        data = self.obj(value, where)
        for key in ("count", "total_ns", "min_ns", "max_ns"):
            self.integer(self.field(data, key, where), f"{where}.{key}", minimum=0)
        for key in ("mean_ns", "m2"):
            self.number(self.field(data, key, where), f"{where}.{key}")
        for i, pair in enumerate(self.lst(self.field(data, "buckets", where), f"{where}.buckets")):
            at = f"{where}.buckets[{i}]"
            pair = self.lst(pair, at)
            if len(pair) != 2:
                self.fail(at, f"expected a [bucket, count] pair, got {len(pair)} items")
            self.integer(pair[0], f"{at}[0]")
            self.integer(pair[1], f"{at}[1]", minimum=0)
        fields = {key: data[key] for key in _STATS_KEYS}
        # Kept samples (small sets such as step times) are optional: older files lack them.
        if data.get("exact") is not None:
            limit = self.integer(self.field(data, "exact_limit", where), f"{where}.exact_limit",
                                 minimum=0)
            samples = self.lst(data["exact"], f"{where}.exact")
            for i, sample in enumerate(samples):
                self.integer(sample, f"{where}.exact[{i}]", minimum=0)
            if len(samples) != data["count"] or len(samples) > limit:
                self.fail(f"{where}.exact", f"expected {data['count']} samples (at most "
                                            f"{limit}), got {len(samples)}")
            fields.update(exact=samples, exact_limit=limit)
        return TimeStats.from_dict(fields)

    def signature(self, value: Any, where: str) -> ShapeSignature | None:
        if value is None:
            return None
        shapes: list[tuple[Any, ...] | None] = []
        for i, shape in enumerate(self.lst(value, where)):
            if shape is None:
                shapes.append(None)
                continue
            dims = self.lst(shape, f"{where}[{i}]")
            for j, d in enumerate(dims):
                self._expect(isinstance(d, (int, str)) and not isinstance(d, bool), d,
                             f"{where}[{i}][{j}]", "an integer dimension")
            shapes.append(tuple(dims))
        return tuple(shapes)

    def node(self, data: Any, where: str, parent: CallNode | None) -> CallNode:
        data = self.obj(data, where)

        def get(key: str) -> Any:
            return self.field(data, key, where)

        def at(key: str) -> str:
            return f"{where}.{key}"

        name, type_name = self.text(get("name"), at("name")), self.text(get("type"), at("type"))
        kind = self.text(get("kind"), at("kind"))
        if kind not in _NODE_KINDS:
            self.fail(at("kind"), f"expected one of {', '.join(_NODE_KINDS)}, got {kind!r}")
        module_key = self.text(get("module_key"), at("module_key"))
        if parent is None:
            # The root is rebuilt as saved, so a hand-made tree with an odd root survives too.
            node = CallNode(name, type_name, module_key, cast(NodeKind, kind))
        else:
            if name in parent.children:
                self.fail(at("name"), f"two children of one node are both named {name!r}")
            node = parent.child(name, type_name, module_key, cast(NodeKind, kind))
        node.time = self.stats(get("time"), at("time"))
        node.flops = self.integer(get("flops"), at("flops"), minimum=0)
        node.gemm_flops = self.integer(get("gemm_flops"), at("gemm_flops"), minimum=0)
        macs = get("macs")
        node.macs = None if macs is None else int(self.number(macs, at("macs")))
        node.flops_source = self.text(get("flops_source"), at("flops_source"))
        node.params = self.integer(get("params"), at("params"), minimum=0)
        for key in ("input_shapes", "output_shapes"):
            sigs = self.lst(get(key), at(key))
            setattr(node, key, [self.signature(s, f"{at(key)}[{i}]") for i, s in enumerate(sigs)])
        node.backward_time = self.stats(get("backward_time"), at("backward_time"))
        node.backward_flops = self.integer(get("backward_flops"), at("backward_flops"), minimum=0)
        node.backward_gemm_flops = self.integer(get("backward_gemm_flops"),
                                                at("backward_gemm_flops"), minimum=0)
        node.errors = self.integer(get("errors"), at("errors"), minimum=0)
        memory = data.get("memory")
        if memory is not None:  # files written before per-layer memory have none
            memory = self.obj(memory, at("memory"))
            node.memory.update({key: self.integer(memory.get(key, 0), f"{at('memory')}.{key}",
                                                  minimum=0) for key in MEMORY_FIELDS})
        for i, op in enumerate(self.lst(data.get("ops", []), at("ops"))):
            where_op = f"{at('ops')}[{i}]"
            op = self.lst(op, where_op)
            if len(op) != 4:
                self.fail(where_op, f"expected [name, calls, flops, time_ns], got {len(op)} items")
            node.note_op(self.text(op[0], f"{where_op}[0]"),
                         *(self.integer(v, f"{where_op}[{j}]", minimum=0)
                           for j, v in enumerate(op[1:], 1)))
        for i, child in enumerate(self.lst(get("children"), at("children"))):
            self.node(child, f"{at('children')}[{i}]", node)
        return node

    def timeline(self, value: Any, nodes: list[CallNode],
                 key: str = "timeline") -> list[TimelineEvent] | None:
        if value is None:
            return None
        events: list[TimelineEvent] = []
        for i, row in enumerate(self.lst(value, key)):
            where = f"{key}[{i}]"
            row = self.lst(row, where)
            if len(row) != 4:
                self.fail(where, "expected [node, start_ns, end_ns, thread_id], "
                                 f"got {len(row)} items")
            index, start, end, tid = (self.integer(v, f"{where}[{j}]") for j, v in enumerate(row))
            if not 0 <= index < len(nodes):
                self.fail(f"{where}[0]", f"node index {index} is not in the tree "
                                         f"({len(nodes)} nodes)")
            if end < start:
                self.fail(where, f"ends ({end}) before it starts ({start})")
            events.append((nodes[index], start, end, tid))
        return events


def parse_profile(data: Any, source: str = "<dict>") -> SavedProfile:
    """Check :func:`result_to_dict`'s output field by field and return its parts.

    ``ProfileResult.from_dict(data)`` is ``ProfileResult(*parse_profile(data))``.

    Args:
        data: the parsed JSON document.
        source: where ``data`` came from, for error messages (``read_profile`` passes the path).

    Raises:
        ValueError: ``data`` is not a tracetorch profile, is a newer version, or has a missing or
            mistyped field; the message starts with ``source``.

    Example:
        >>> parse_profile({"format": "chrome"}, source="x.json")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: x.json: not a tracetorch profile (format is 'chrome', expected ...)
    """
    if not isinstance(data, dict):
        raise ValueError(f"{source}: not a tracetorch profile (expected a JSON object, "
                         f"got {type(data).__name__})")
    if "format" not in data:
        hint = " (it looks like a Chrome trace)" if "traceEvents" in data else ""
        raise ValueError(f"{source}: not a tracetorch profile{hint}: no 'format' key")
    if data["format"] != FORMAT_NAME:
        raise ValueError(f"{source}: not a tracetorch profile (format is {data['format']!r}, "
                         f"expected {FORMAT_NAME!r})")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{source}: corrupt tracetorch profile: version must be an integer >= 1, "
                         f"got {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(f"{source}: written by a newer tracetorch (profile format version "
                         f"{version}; this one reads up to {FORMAT_VERSION}); upgrade tracetorch "
                         "to load it")
    read = _Reader(source)
    meta = read.obj(read.field(data, "meta", ""), "meta")
    root = read.node(read.field(data, "root", ""), "root", None)
    unsupported = {
        read.text(k, "unsupported"): read.integer(v, f"unsupported[{k!r}]", minimum=0)
        for k, v in read.obj(read.field(data, "unsupported", ""), "unsupported").items()
    }
    step_times = read.stats(read.field(data, "step_times", ""), "step_times")
    phases = {read.text(name, "step_phases"): read.stats(stats, f"step_phases.{name}")
              for name, stats in read.obj(data.get("step_phases", {}), "step_phases").items()}
    dropped = read.integer(read.field(data, "dropped_events", ""), "dropped_events", minimum=0)
    nodes = list(root.walk())
    timeline = read.timeline(data.get("timeline"), nodes)
    backward_timeline = read.timeline(data.get("backward_timeline"), nodes, "backward_timeline")
    return SavedProfile(root, unsupported=unsupported, timeline=timeline, dropped_events=dropped,
                        step_times=step_times, meta=dict(meta), step_phases=phases,
                        backward_timeline=backward_timeline)


def read_profile(path: PathLike) -> SavedProfile:
    """Read and check a profile written by :func:`save_result`; its parts, as
    :func:`parse_profile` returns them (``ProfileResult.load(path)`` assembles the result).

    Raises:
        FileNotFoundError: ``path`` does not exist (as ``open`` raises it).
        ValueError: the file is not valid UTF-8 JSON, not a tracetorch profile, from a newer
            version, or damaged; the message names the file and the problem.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "bad.json")
        >>> _ = open(path, "w").write("{not json")
        >>> read_profile(path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: .../bad.json: not valid JSON (...)...
    """
    source = os.fspath(path)
    try:
        with deep_recursion():
            with open(path, encoding="utf-8") as f:
                data = json.load(f, parse_constant=_no_constant, parse_float=_finite_float,
                                 parse_int=_bounded_int)
            return parse_profile(data, source=source)
    except UnicodeDecodeError as err:
        raise ValueError(f"{source}: not a tracetorch profile (not UTF-8 text: {err.reason} "
                         f"at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{source}: not valid JSON ({err.msg} at line {err.lineno}, column "
                         f"{err.colno}); the file is truncated, corrupt or not a profile") from None
    except RecursionError:
        raise ValueError(f"{source}: JSON nested too deeply to read") from None
    except _BadNumberError as err:
        raise ValueError(f"{source}: corrupt tracetorch profile: {err}") from None
    except (OverflowError, ValueError) as err:
        message = str(err)
        if message.startswith(source):
            raise
        raise ValueError(f"{source}: corrupt tracetorch profile: {message}") from None

#: Digits of the largest integer a profile holds (FLOPs of a long run stay far below 10**40).
_MAX_INT_DIGITS = 40


class _BadNumberError(ValueError):
    """A number no profile writes: NaN, an infinity, or an integer of absurd length."""


def _no_constant(name: str) -> NoReturn:
    raise _BadNumberError(f"{name} is not a number a profile holds (save() writes finite "
                          f"values)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumberError(f"{text[:20]} is out of range for a finite number")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise _BadNumberError(f"an integer of {len(text)} digits is longer than any count a "
                              f"profile holds")
    return int(text)
