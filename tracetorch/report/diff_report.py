"""How a :class:`~tracetorch.analysis.diff.ProfileDiff` reads: text, JSON and a static HTML table.

The text report is the fitted table of :mod:`~tracetorch.text.layout` (columns by priority,
long paths shortened in the middle): per layer the calls, the mean time per call in both runs
and its change (``*`` when the change is beyond the noise rule of :mod:`tracetorch.analysis.diff`),
the changes in total and self time, in FLOPs per call, in backward time and FLOPs, and in bytes
moved when memory was measured. Unchanged numbers print as ``=``.

This module only reads a diff (``ProfileDiff`` is a name in its annotations), as the other
reports only read a result.

Example:
    >>> signed_time(-1500), signed_percent(12.345), signed_percent(0.0)
    ('-1.50 us', '+12.3%', '=')
"""
from __future__ import annotations

import html
import json
import math
import os
from typing import TYPE_CHECKING, Any, Callable, Union

from tracetorch.analysis.diff import DEFAULT_TOP
from tracetorch.text.layout import (
    RED,
    ColumnSpec,
    color_enabled,
    fit,
    layout,
    pick_columns,
    terminal_width,
)
from tracetorch.text.units import format_count, format_flops, format_time_ns, printable

if TYPE_CHECKING:  # reports only read what they render
    from tracetorch.analysis.diff import LayerDiff, ProfileDiff

__all__ = ("DIFF_COLUMNS", "FORMAT_NAME", "render_diff_text", "diff_to_dict",
           "render_diff_html", "save_diff_json", "save_diff_html", "signed_time",
           "signed_percent")

#: The ``format`` field of a diff's JSON.
FORMAT_NAME = "tracetorch-diff"
FORMAT_VERSION = 1

PathLike = Union[str, "os.PathLike[str]"]


def _signed(value: float, fmt: Callable[[float], str]) -> str:
    if value == 0:
        return "="
    return ("+" if value > 0 else "-") + fmt(abs(value))


def signed_time(ns: float) -> str:
    """A time change: ``+1.20 ms``, ``-300 ns``, ``=`` for none."""
    return _signed(ns, format_time_ns)


def signed_percent(percent: float) -> str:
    """A relative change: ``+12.3%``, ``-4.0%``, ``new`` from nothing, ``=`` for none."""
    if math.isinf(percent):
        return "new" if percent > 0 else "gone"
    return _signed(percent, lambda p: f"{p:.1f}%") if round(percent, 1) else (
        "=" if percent == 0 else "~0%")


def _both(layer: LayerDiff, field: str, fmt: Callable[[Any], str]) -> str:
    base = (layer.base or {}).get(field) or 0
    new = (layer.new or {}).get(field) or 0
    return fmt(new) if base == new else f"{fmt(base)} -> {fmt(new)}"


def _mean_change(diff: ProfileDiff, layer: LayerDiff) -> str:
    return signed_percent(layer.mean_change_percent) + (" *" if layer.flagged else "  ")


def _has(diff: ProfileDiff, field: str) -> bool:
    return any(side and side.get(field) for layer in diff.layers + diff.only_base + diff.only_new
               for side in (layer.base, layer.new))


_Spec = ColumnSpec["ProfileDiff", "LayerDiff"]

#: The diff table's columns in display order (keys, priorities and ``applies`` as in
#: :data:`tracetorch.report.table.TREE_COLUMNS`).
DIFF_COLUMNS: tuple[_Spec, ...] = (
    _Spec("name", "Layer", lambda d, r: r.path, right=False, elide=True),
    _Spec("calls", "Calls", lambda d, r: _both(r, "calls", format_count), priority=5),
    _Spec("base", "Base/call", lambda d, r: format_time_ns((r.base or {}).get("mean_ns", 0)),
          priority=2),
    _Spec("new", "New/call", lambda d, r: format_time_ns((r.new or {}).get("mean_ns", 0)),
          priority=2),
    _Spec("mean", "Change", _mean_change, priority=1,
          style=lambda d, r: RED if r.flagged and r.mean_change_ns > 0 else ""),
    _Spec("total", "Total", lambda d, r: signed_time(r.change("total_ns")), priority=3),
    _Spec("self", "Self", lambda d, r: signed_time(r.change("self_ns")), priority=6),
    _Spec("flops", "FLOPs/call", lambda d, r: signed_percent(r.flops_change_percent),
          priority=4, style=lambda d, r: RED if r.flops_change_percent > 0 else ""),
    _Spec("bwd_time", "Bwd time", lambda d, r: signed_time(r.change("backward_ns")),
          priority=7, applies=lambda d: _has(d, "backward_ns")),
    _Spec("bwd_flops", "Bwd FLOPs", lambda d, r: _signed(r.change("subtree_backward_flops"),
                                                         format_flops),
          priority=8, applies=lambda d: _has(d, "subtree_backward_flops")),
    _Spec("bytes", "Bytes moved", lambda d, r: _signed(r.change("bytes_moved"), format_count),
          priority=9, applies=lambda d: _has(d, "bytes_moved")),
)


def _total_line(label: str, pair: tuple[int, int], fmt: Callable[[float], str]) -> str:
    base, new = pair
    from_to = f"{fmt(base)} -> {fmt(new)}"
    change = signed_percent(100.0 * (new - base) / base if base else
                            (0.0 if new == base else math.inf))
    return f"{label:<15}{from_to} ({change})"


def _rule(diff: ProfileDiff) -> str:
    return (f"* = beyond noise: |change in mean time per call| > {diff.sigmas:g} x the larger "
            "standard error (std/sqrt(calls)) of the two runs.")


def _paths(layers: list[LayerDiff]) -> str:
    return ", ".join(printable(layer.path) for layer in layers)


def _header_lines(diff: ProfileDiff) -> list[str]:
    """Where the runs came from and their totals: the text report's first lines."""
    totals = diff.totals
    lines = [f"Base: {printable(diff.base_name)}", f"New:  {printable(diff.new_name)}",
             _total_line("Total time:", totals["time_ns"], format_time_ns),
             _total_line("Forward FLOPs:", totals["forward_flops"], format_flops)]
    if any(totals["backward_flops"]):
        lines.append(_total_line("Backward FLOPs:", totals["backward_flops"], format_flops))
    return lines


def render_diff_text(diff: ProfileDiff, top: int | None = DEFAULT_TOP, width: int | None = None,
                     color: bool | None = None) -> str:
    """The text report of ``diff``: totals, the ``top`` layers (``None``: all), then the layers
    found in one run only and the noise rule."""
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise ValueError(f"top must be None or an integer >= 1; got {top!r}")
    width = terminal_width() if width is None else width
    color = color_enabled() if color is None else color
    lines = _header_lines(diff) + [""]
    shown = diff.layers if top is None else diff.layers[:top]
    if shown:
        specs = pick_columns(DIFF_COLUMNS, diff, None)[0]
        columns, dropped = fit(specs, diff, shown, width, chosen=False)
        lines += layout(columns, shown, width, color)
        if len(shown) < len(diff.layers):
            lines.append(f"... {len(diff.layers) - len(shown)} more layers (top={top}; "
                         "the JSON and HTML hold every one)")
        if dropped:
            lines.append(f"Left out to fit {width} characters: {', '.join(dropped)}")
    else:
        lines.append("No layer ran in both profiles.")
    for label, layers in (("Only in base", diff.only_base), ("Only in new", diff.only_new)):
        if layers:
            lines.append(f"{label} ({len(layers)}): " + _paths(layers))
    flagged = sum(layer.flagged for layer in diff.layers)
    lines += ["", f"{len(diff.layers)} layers in both runs, {flagged} with a time change beyond "
              "noise.", _rule(diff)]
    return "\n".join(lines)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _layer_dict(layer: LayerDiff) -> dict[str, Any]:
    return {
        "path": layer.path, "type": layer.type_name, "status": layer.status,
        "flagged": layer.flagged, "noise_ns": layer.noise_ns,
        "change": {
            "calls": layer.change("calls"), "mean_ns": layer.mean_change_ns,
            "mean_percent": _finite(layer.mean_change_percent),
            "total_ns": layer.change("total_ns"), "self_ns": layer.change("self_ns"),
            "flops": layer.change("subtree_flops"),
            "flops_per_call_percent": _finite(layer.flops_change_percent),
            "backward_ns": layer.change("backward_ns"),
            "backward_flops": layer.change("subtree_backward_flops"),
            "bytes_moved": layer.change("bytes_moved"),
        },
        "base": layer.base, "new": layer.new,
    }


def diff_to_dict(diff: ProfileDiff) -> dict[str, Any]:
    """Every layer of ``diff`` with both runs' records and the changes, JSON-ready (an infinite
    relative change, from nothing, is ``null``)."""
    return {
        "format": FORMAT_NAME, "version": FORMAT_VERSION,
        "base": diff.base_name, "new": diff.new_name,
        "rule": {"sigmas": diff.sigmas, "statistic": "mean inclusive time per call",
                 "flagged_when": "|mean_new - mean_base| > sigmas * max(std/sqrt(calls))"},
        "sort": diff.sort,
        "totals": {key: {"base": a, "new": b} for key, (a, b) in diff.totals.items()},
        "layers": [_layer_dict(layer) for layer in diff.layers],
        "only_in_base": [_layer_dict(layer) for layer in diff.only_base],
        "only_in_new": [_layer_dict(layer) for layer in diff.only_new],
    }


def save_diff_json(diff: ProfileDiff, path: PathLike) -> None:
    """Write :func:`diff_to_dict` to ``path``."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(diff_to_dict(diff), handle, indent=1, allow_nan=False)


_STYLE = ("table.tt-diff{border-collapse:collapse;font:12px ui-monospace,monospace}"
          ".tt-diff th,.tt-diff td{padding:2px 8px;text-align:right;border-bottom:1px solid #ddd}"
          ".tt-diff th:first-child,.tt-diff td:first-child{text-align:left}"
          ".tt-diff .up{color:#b00020;font-weight:bold}.tt-diff .down{color:#1b5e20}")


def render_diff_html(diff: ProfileDiff, top: int | None = DEFAULT_TOP) -> str:
    """A compact, static HTML fragment: the totals and a table of the ``top`` layers (every
    column of the text report; no script). Every name is escaped."""
    specs = pick_columns(DIFF_COLUMNS, diff, None)[0]
    shown = diff.layers if top is None else diff.layers[:top]
    head = "".join(f"<th>{html.escape(s.header)}</th>" for s in specs)
    body = []
    for layer in shown:
        mark = (" class='up'" if layer.flagged and layer.mean_change_ns > 0
                else " class='down'" if layer.flagged else "")
        cells = [f"<td{mark if s.key == 'mean' else ''}>"
                 f"{html.escape(printable(s.cell(diff, layer)))}</td>" for s in specs]
        body.append("<tr>" + "".join(cells) + "</tr>")
    totals = "<br>".join(html.escape(line) for line in _header_lines(diff))
    notes = [f"{len(diff.layers) - len(shown)} more layers not shown."] \
        if len(shown) < len(diff.layers) else []
    for label, layers in (("Only in base", diff.only_base), ("Only in new", diff.only_new)):
        if layers:
            notes.append(f"{label}: " + _paths(layers))
    notes.append(_rule(diff))
    return (f"<div class='tt-diff'><style>{_STYLE}</style><p>{totals}</p>"
            f"<table class='tt-diff'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}"
            f"</tbody></table><p>{'<br>'.join(html.escape(n) for n in notes)}</p></div>")


def save_diff_html(diff: ProfileDiff, path: PathLike) -> None:
    """Write one self-contained HTML page with every layer of ``diff``."""
    title = html.escape(f"tracetorch diff: {printable(diff.base_name)} -> "
                        f"{printable(diff.new_name)}")
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}"
            f"</title></head><body><h1>{title}</h1>{render_diff_html(diff, top=None)}"
            "</body></html>\n")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
