"""Flat text views of a profile: :func:`render_flat`, one row per layer type or module instance.

A row folds every call site of one type or one module, and FLOPs, MACs and
FLOP/s are the row's **own** (children excluded): rows never overlap, so FLOPs add up to the
forward total and ``% time`` (of Self time) adds up to 100%. The columns are laid out as the
tree's (:func:`~tracetorch.report.table.render_table`), with its sort keys, width and colour.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root()
    >>> for name in ("a", "b"): root.child(name, "ReLU", name).time.add(1_000)
    >>> text = render_flat(ProfileResult(root), columns=["sites", "calls", "total"])
    >>> for line in text.splitlines()[:3]: print(line)
    Type  Sites  Calls  Total time
    ----  -----  -----  ----------
    ReLU      2      2     2.00 us
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from tracetorch.report.summary import summary_lines
from tracetorch.report.table import (
    SORT_KEYS,
    SortKey,
    dropped_note,
    has_backward,
    hot_style,
    natural_key,
    width_and_color,
)
from tracetorch.text.checks import check_choice
from tracetorch.text.layout import ColumnChoice, ColumnSpec, fit, layout, pick_columns
from tracetorch.text.units import (
    MISSING,
    format_count,
    format_flops,
    format_macs,
    format_percent,
    format_rate,
    format_time_ns,
)

if TYPE_CHECKING:  # reports only read results, a result never imports a report
    from tracetorch.records.result import AggregateRow, ProfileResult

__all__ = ("FLAT_VIEWS", "FLAT_COLUMNS", "FlatContext", "render_flat")

_FlatRow = tuple[str, "AggregateRow"]  # a type or module name and its totals

#: Accepted ``view`` values of :func:`render_flat`.
FLAT_VIEWS: tuple[str, ...] = ("type", "module")

LEGEND_FLAT = ("FLOPs, MACs and FLOP/s are each row's own, children excluded.\n"
               "FLOP/s = FLOPs / Self time; % time = Self time / profile total.")


def _flat_rows(result: ProfileResult, view: str) -> list[_FlatRow]:
    if view == "type":
        return [(key or MISSING, row) for key, row in result.by_type().items()]
    # A top-level model has the empty path; its type names it better than nothing.
    return [(path or row.type_name, row) for path, row in result.by_module().items()]


@dataclass(frozen=True)
class FlatContext:
    """What a flat view's cells read: the profile's total time and whether it has backward."""

    total: int
    backward: bool


_FlatSpec = ColumnSpec[FlatContext, _FlatRow]
_FLAT_SHARED: tuple[_FlatSpec, ...] = (
    _FlatSpec("sites", "Sites", lambda c, r: format_count(len(r[1].paths)), priority=8),
    _FlatSpec("calls", "Calls", lambda c, r: format_count(r[1].calls), priority=5),
    _FlatSpec("flops", "FLOPs", lambda c, r: format_flops(r[1].flops), priority=3),
    _FlatSpec("macs", "MACs", lambda c, r: format_macs(r[1].macs), priority=10),
    _FlatSpec("self", "Self time", lambda c, r: format_time_ns(r[1].self_ns), priority=1),
    _FlatSpec("total", "Total time", lambda c, r: format_time_ns(r[1].total_ns), priority=4),
    _FlatSpec("percent", "% time", lambda c, r: format_percent(r[1].self_ns, c.total),
              priority=2, style=lambda c, r: hot_style(r[1].self_ns, c.total)),
    _FlatSpec("rate", "FLOP/s", lambda c, r: format_rate(r[1].flops, r[1].self_ns), priority=7),
    _FlatSpec("bwd_time", "Bwd time", lambda c, r: format_time_ns(r[1].backward_ns)
              if r[1].backward_ns else MISSING, priority=6, applies=lambda c: c.backward),
    _FlatSpec("bwd_flops", "Bwd FLOPs", lambda c, r: format_flops(r[1].backward_flops),
              priority=9, applies=lambda c: c.backward),
)
#: The flat views' columns, per view, in display order (keys and priorities as in
#: :data:`~tracetorch.report.table.TREE_COLUMNS`).
FLAT_COLUMNS: dict[str, tuple[_FlatSpec, ...]] = {
    "type": (_FlatSpec("name", "Type", lambda c, r: r[0], right=False, elide=True),
             *_FLAT_SHARED),
    "module": (_FlatSpec("name", "Module", lambda c, r: r[0], right=False,
                         elide=True),
               _FlatSpec("type", "Type", lambda c, r: r[1].type_name, right=False,
                         priority=3),
               *_FLAT_SHARED),
}


def render_flat(result: ProfileResult, view: str = "type", sort_by: str = "total",
                show_backward: bool | None = None, columns: ColumnChoice = None,
                width: int | None = None, color: bool | None = None) -> str:
    """One row per layer type (``view="type"``) or per module instance (``view="module"``).

    A module called from several places is one row (its Sites column counts them), so nothing
    is counted twice; each row's FLOPs are its own, so the FLOPs column sums to the forward total.

    Args:
        result: a recorded or loaded profile.
        view: ``"type"`` or ``"module"``.
        sort_by: one of :data:`~tracetorch.report.table.SORT_KEYS` (``"call_order"`` is
            first-call order).
        show_backward, columns, width, color: as in
            :func:`~tracetorch.report.table.render_table` (column names in :data:`FLAT_COLUMNS`).

    Raises:
        ValueError: an argument outside the accepted values.

    Example:
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> root = CallNode.root(); fc = root.child("fc", "Linear", "m0"); fc.time.add(500)
        >>> print(render_flat(ProfileResult(root)).splitlines()[2])
        Linear      1      1  0 FLOPs     -     500 ns      500 ns  100.0%  0 FLOP/s
    """
    view = check_choice("view", view, FLAT_VIEWS)
    sort_by = check_choice("sort_by", sort_by, SORT_KEYS)
    if show_backward is None:
        show_backward = has_backward(result)
    rows = _flat_rows(result, view)
    keys: dict[str, Callable[[_FlatRow], SortKey]] = {
        "total": lambda r: -r[1].total_ns,
        "self": lambda r: -r[1].self_ns,
        "flops": lambda r: -r[1].flops,
        "calls": lambda r: -r[1].calls,
        "name": lambda r: natural_key(r[0]),
    }
    if sort_by != "call_order":
        rows.sort(key=keys[sort_by])
    total = result.total_time_ns

    ctx = FlatContext(total, show_backward)
    specs, chosen = pick_columns(FLAT_COLUMNS[view], ctx, columns)
    width, color = width_and_color(width, color)
    fitted, dropped = fit(specs, ctx, rows, width, chosen)
    lines = layout(fitted, rows, width, color) if rows else ["No calls were recorded."]
    notes = [dropped_note(dropped, width)] if dropped and rows else []
    lines += [""] + notes + ([LEGEND_FLAT] if rows else []) + summary_lines(result)
    return "\n".join(lines)
