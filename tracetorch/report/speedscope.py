"""The call tree in speedscope's file format (https://www.speedscope.app), weighted by time, FLOPs.

speedscope draws flame graphs of "sampled" profiles: a list of stacks (frame indices, outermost
first) with a weight each. The tree maps onto that directly, as aggregated samples: every node is
one stack, weighted by what the node itself spent, so speedscope's own sums rebuild the
inclusive numbers. Two profiles share one frame table:

* ``Time``: each node's self time in nanoseconds. The weights add up to ``total_time_ns``
  (self times partition a recorded tree's time).
* ``FLOPs``: each forward call's own FLOPs, and the backward FLOPs charged to a layer on a
  ``[backward]`` frame under it, unit ``none``. The weights add up to ``total_flops`` (a backward
  pass's own node and recomputed layers only summarise work the layers hold, as in the totals).

A frame is one call path (``name (Type)`` as the table labels it, the path as its ``file``), so
speedscope's sandwich view keeps ``encoder.0`` and ``decoder.0`` apart; both are shown with their
control and bidi characters escaped, as the text table shows them. Stacks of weight 0 are
left out. Open the file at https://www.speedscope.app or with ``speedscope file.json``.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root(); fc = root.child("fc", "Linear", "m0"); fc.time.add(2_000)
    >>> fc.flops = 300
    >>> doc = speedscope_document(ProfileResult(root))
    >>> [(p["name"], p["unit"], p["weights"]) for p in doc["profiles"]]
    [('Time', 'nanoseconds', [2000]), ('FLOPs', 'none', [300])]
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Union

from tracetorch.records.tree import NOT_FORWARD_KINDS, CallNode
from tracetorch.report.table import node_label
from tracetorch.text.units import printable

if TYPE_CHECKING:  # reports only read results, a result never imports a report
    from tracetorch.records.result import ProfileResult

__all__ = ("SCHEMA_URL", "BACKWARD_FRAME", "speedscope_document", "export_speedscope")

#: The ``$schema`` value speedscope recognises its files by.
SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"
#: The frame a layer's backward FLOPs are drawn on, under the layer's own frame.
BACKWARD_FRAME = "[backward]"

PathLike = Union[str, "os.PathLike[str]"]


class _Frames:
    """The shared frame table: one entry per (label, path), indices handed out in order."""

    def __init__(self) -> None:
        self.frames: list[dict[str, str]] = []
        self._index: dict[tuple[str, str], int] = {}

    def of(self, name: str, file: str) -> int:
        key = (name, file)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.frames)
            # The viewer shows both: escaped as the text reports escape them (the label already is).
            self.frames.append({"name": name, "file": printable(file)})
        return index


def _sampled(name: str, unit: str, samples: list[list[int]], weights: list[int]) -> dict[str, Any]:
    return {"type": "sampled", "name": name, "unit": unit, "startValue": 0,
            "endValue": sum(weights), "samples": samples, "weights": weights}


def speedscope_document(result: ProfileResult, name: str = "tracetorch profile") -> dict[str, Any]:
    """The speedscope JSON document of ``result`` (see the module's description)."""
    frames = _Frames()
    time_samples: list[list[int]] = []
    time_weights: list[int] = []
    flop_samples: list[list[int]] = []
    flop_weights: list[int] = []
    stack: list[tuple[CallNode, list[int]]] = [
        (c, []) for c in reversed(list(result.root.children.values()))]
    while stack:
        node, above = stack.pop()
        label = node_label(node)
        here = above + [frames.of(label, node.path or label)]
        if node.self_ns:
            time_samples.append(here)
            time_weights.append(int(node.self_ns))
        if node.flops and node.kind not in NOT_FORWARD_KINDS:
            flop_samples.append(here)
            flop_weights.append(int(node.flops))
        if node.backward_flops:
            flop_samples.append(here + [frames.of(BACKWARD_FRAME, node.path or label)])
            flop_weights.append(int(node.backward_flops))
        stack.extend((c, here) for c in reversed(list(node.children.values())))
    return {
        "$schema": SCHEMA_URL,
        "shared": {"frames": frames.frames},
        "profiles": [_sampled("Time", "nanoseconds", time_samples, time_weights),
                     _sampled("FLOPs", "none", flop_samples, flop_weights)],
        "name": name,
        "activeProfileIndex": 0,
        "exporter": "tracetorch",
    }


def export_speedscope(result: ProfileResult, path: PathLike,
                      name: str = "tracetorch profile") -> None:
    """Write :func:`speedscope_document` to ``path`` as JSON.

    Example:
        >>> import os, tempfile
        >>> from tracetorch.records.result import ProfileResult
        >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(2_000)
        >>> path = os.path.join(tempfile.mkdtemp(), "run.speedscope.json")
        >>> export_speedscope(ProfileResult(root), path)
        >>> json.load(open(path))["profiles"][0]["endValue"]
        2000
    """
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(speedscope_document(result, name), handle, separators=(",", ":"))
