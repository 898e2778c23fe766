"""Reading a saved profile back: :func:`read_profile` (a file), :func:`parse_profile` (a dict).

The layout is the one :mod:`tracetorch.records.jsonio` writes (its module docstring describes it);
this module checks a document field by field and returns its parts.

Reading is strict: anything but a version-1 profile raises :class:`ValueError` naming the file
and the problem (the JSON location of a bad field). A missing file raises the usual
:class:`FileNotFoundError`, unchanged, as ``open`` would. Numbers no profile writes (NaN, an
infinity, an integer of absurd length) are refused while the JSON is parsed. Only a regular file
of at most :data:`MAX_PROFILE_BYTES` is read: a device (``/dev/zero``), a FIFO or a folder is
refused with a :class:`ValueError` before anything is read from it, never read for ever.

This module only reads results and never builds one: :func:`parse_profile` and
:func:`read_profile` return the validated parts as a :class:`SavedProfile`, which
:meth:`ProfileResult.from_dict() <tracetorch.records.result.ProfileResult.from_dict>`,
:meth:`ProfileResult.load() <tracetorch.records.result.ProfileResult.load>` and
:func:`tracetorch.load` assemble. So ``tracetorch.records.result`` imports ``report/`` and nothing
here imports it back.

Example:
    >>> from tracetorch.records.jsonio import result_to_dict
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(1_000)
    >>> parts = parse_profile(result_to_dict(ProfileResult(root)))
    >>> parts.root.find("fc").calls, parts.timeline, parts.dropped_events
    (1, None, 0)
"""
from __future__ import annotations

import json
import math
import os
import stat
from typing import Any, NamedTuple, NoReturn, cast, get_args

from tracetorch.records.jsonio import (
    FORMAT_NAME,
    FORMAT_VERSION,
    PathLike,
    deep_recursion,
    plain_number,
)
from tracetorch.records.memory import FIELDS as MEMORY_FIELDS
from tracetorch.records.stats import TimeStats
from tracetorch.records.tree import CallNode, NodeKind, ShapeSignature, TimelineEvent

__all__ = ("SavedProfile", "parse_profile", "read_profile", "MAX_PROFILE_BYTES")

#: The largest file :func:`read_profile` reads (a profile of a big model with a full timeline
#: is tens of MB; parsing JSON takes several times its size in memory).
MAX_PROFILE_BYTES = 1 << 30

_NODE_KINDS: tuple[str, ...] = get_args(NodeKind)
_STATS_KEYS = ("count", "total_ns", "min_ns", "max_ns", "mean_ns", "m2", "buckets")


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
        return plain_number(value)

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
    """Check :func:`~tracetorch.records.jsonio.result_to_dict`'s output field by field and return
    its parts.

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
    """Read and check a profile written by :func:`~tracetorch.records.jsonio.save_result`; its
    parts, as :func:`parse_profile` returns them (``ProfileResult.load(path)`` assembles the
    result).

    Raises:
        FileNotFoundError: ``path`` does not exist (as ``open`` raises it).
        ValueError: the file is not valid UTF-8 JSON, not a tracetorch profile, from a newer
            version, or damaged; or not a regular file (a device, a FIFO, a folder), or larger
            than :data:`MAX_PROFILE_BYTES`; the message names the file and the problem.

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
        text = _read_regular_file(source).decode("utf-8")
        with deep_recursion():
            data = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float,
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

def _read_regular_file(source: str) -> bytes:
    """The bytes of the regular file ``source``, at most :data:`MAX_PROFILE_BYTES` of them.

    Opened without blocking (a FIFO with no writer would wait for one) and checked on the open
    descriptor, so the file read is the file checked; read with a bound, so a file that grows,
    or claims no size (``/proc``), cannot be read for ever either.
    """
    fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{source}: not a tracetorch profile: {_file_kind(mode)}, not a "
                             f"regular file")
        file = open(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise
    with file:
        data = file.read(MAX_PROFILE_BYTES + 1)
    if len(data) > MAX_PROFILE_BYTES:
        raise ValueError(f"{source}: not read: larger than {MAX_PROFILE_BYTES:,} bytes, the "
                         f"most a profile is read from (tracetorch.records.jsonread."
                         f"MAX_PROFILE_BYTES)")
    return data


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


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
