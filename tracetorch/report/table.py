"""The call tree as a text table: :func:`render_table`, with the cells other tree views share.

In the tree, a row stands for a call path and **includes its children**: the FLOPs, MACs and
FLOP/s columns are inclusive (the subtree's), like Total time, so every row answers "what did
this call cost"; Self time is what is left once the children are taken out. ``% time`` is Total time
over the whole profile, so a row's share already holds its children's.

The flat views (one row per type or per module) live in :mod:`tracetorch.report.flat_table`,
and the argument checks both use in :mod:`tracetorch.text.checks`.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root()
    >>> fc = root.child("fc", "Linear", "m0"); fc.flops_source = "rule"
    >>> fc.time.add(2_000); fc.flops = fc.gemm_flops = 4_000; fc.macs = 2_000
    >>> print(render_table(ProfileResult(root)).splitlines()[2])
    fc (Linear)      1  4.00 KFLOPs  2.00 KMACs    2.00 us     2.00 us  100.0%  2.00 GFLOP/s
"""
from __future__ import annotations

import os
import re
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Union

from tracetorch.records.tree import CallNode, Completeness, SubtreeSums
from tracetorch.report.summary import summary_lines
from tracetorch.text.checks import check_choice, check_percent, check_positive_int
from tracetorch.text.layout import (
    RED,
    YELLOW,
    ColumnChoice,
    ColumnSpec,
    color_enabled,
    fit,
    layout,
    pick_columns,
    terminal_width,
)
from tracetorch.text.units import (
    MISSING,
    format_bytes,
    format_count,
    format_flops,
    format_intensity,
    format_macs,
    format_percent,
    format_rate,
    format_time_ns,
    printable,
)

if TYPE_CHECKING:  # reports only read results, a result never imports a report
    from tracetorch.records.result import ProfileResult

__all__ = ("SORT_KEYS", "TREE_COLUMNS", "TreeContext", "SubtreeSums", "tree_context", "tree_rows",
           "render_table", "node_label", "SortKey", "natural_key", "has_backward",
           "hot_style", "dropped_note", "width_and_color", "save_table")

_TreeRow = tuple[CallNode, int]  # a node and its depth
SortKey = Union[int, float, list[tuple[int, int, str]]]

#: Accepted ``sort_by`` values. Siblings are sorted; children always stay under their parent.
SORT_KEYS: tuple[str, ...] = ("total", "self", "flops", "calls", "name", "call_order")

LEGEND_TREE = ("FLOPs, MACs, FLOP/s, Total time and the Bwd columns include children; "
               "Self time excludes them.\n"
               "FLOP/s = FLOPs / Total time; % time = Total time / profile total.")
LEGEND_MARKS = ("FLOPs+ = a lower bound (a layer below has unknown FLOPs); ? = unknown FLOPs "
                "(no FLOP rule and no counted operation).")
LEGEND_ESTIMATED = ("~ = an estimated time (a layer inside a torch.compile'd region: the "
                    "region's measured time shared by FLOPs).")


def _estimated(result: ProfileResult, node: CallNode) -> bool:
    # A layer of a compiled region (meta["compiled"]: tracetorch.adapters.torch.compiled).
    return node.path in result.meta.get("compiled", {}).get("estimated", ())


def _time_cell(c: TreeContext, node: CallNode, ns: int | None) -> str:
    cell = _time_or_missing(ns)
    return cell + "~" if ns is not None and _estimated(c.result, node) else cell

def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def natural_key(name: str) -> list[tuple[int, int, str]]:
    """The sort key of ``name`` with its digit runs compared as numbers ("layers.2" before
    "layers.10")."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part.lower())
            for part in re.split(r"(\d+)", name) if part]


def node_label(node: CallNode) -> str:
    """``"name (Type)"``; the type alone for an unnamed node or one named after its type.

    Example:
        >>> root = CallNode.root()
        >>> model, fc = root.child("", "Sequential", "m"), root.child("0", "Linear", "l")
        >>> node_label(model), node_label(fc)
        ('Sequential', '0 (Linear)')
    """
    if not node.name or node.name == node.type_name:
        return printable(node.type_name or node.name)
    return printable(f"{node.name} ({node.type_name})" if node.type_name else node.name)


#: FLOPs cells of nodes whose count is not whole: ``+`` a lower bound, ``?`` unknown.
_MARKS: dict[str, str] = {"complete": "", "partial": "+", "unknown": "?"}


def _marked(cell: str, completeness: Completeness) -> str:
    mark = _MARKS[completeness]
    return "?" if mark == "?" else cell + mark


def _sorted_children(node: CallNode, sort_by: str, inc: SubtreeSums) -> list[CallNode]:
    kids = list(node.children.values())
    keys: dict[str, Callable[[CallNode], SortKey]] = {
        "total": lambda n: -n.total_ns,
        "self": lambda n: -n.self_ns,
        "flops": lambda n: -inc.flops[id(n)],
        "calls": lambda n: -n.calls,
        "name": lambda n: natural_key(n.name or n.type_name),
    }
    if sort_by == "call_order":
        return kids
    # sorted() is stable, so ties keep call order.
    return sorted(kids, key=keys[sort_by])


def _select(result: ProfileResult, sort_by: str, depth: int | None, min_percent: float,
            inc: SubtreeSums) -> tuple[list[tuple[CallNode, int]], int, int]:
    """Visible (node, level) pairs in display order; counts hidden by depth and min_percent."""
    total = result.total_time_ns
    rows: list[tuple[CallNode, int]] = []
    below_depth = below_percent = 0

    def subtree_size(node: CallNode, level: int) -> int:
        if depth is not None and level > depth:
            return 0
        return 1 + sum(subtree_size(c, level + 1) for c in node.children.values())

    stack: list[tuple[CallNode, int]] = [
        (c, 1) for c in reversed(_sorted_children(result.root, sort_by, inc))]
    while stack:
        node, level = stack.pop()
        if depth is not None and level > depth:
            below_depth += sum(1 for _ in node.walk())
            continue
        # With no recorded time every share is undefined, so nothing is hidden.
        if total and min_percent and 100.0 * node.total_ns / total < min_percent:
            below_percent += subtree_size(node, level)
            continue
        rows.append((node, level))
        stack.extend((c, level + 1) for c in reversed(_sorted_children(node, sort_by, inc)))
    return rows, below_depth, below_percent


def _time_or_missing(ns: int | None) -> str:
    return MISSING if ns is None else format_time_ns(ns)


def has_backward(result: ProfileResult) -> bool:
    """Whether any node of ``result`` has backward time or FLOPs (the Bwd columns apply)."""
    return any(n.backward_time.count or n.backward_flops for n in result.nodes())


@dataclass(frozen=True)
class TreeContext:
    """What the tree's cells read: the result, its subtree sums, the total time, whether the
    profile has backward data and memory figures, and each labelled layer's roofline bound."""

    result: ProfileResult
    inc: SubtreeSums
    total: int
    backward: bool
    memory: bool = False
    bounds: dict[str, str] = field(default_factory=dict)


def tree_context(result: ProfileResult, show_backward: bool | None = None) -> TreeContext:
    """What :data:`TREE_COLUMNS`' cells read for ``result`` (other views of the tree, the
    notebook's and the HTML report's, render the same cells from it); ``show_backward``
    ``None`` means "when the profile has backward data".

    Example:
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(500)
        >>> ctx = tree_context(ProfileResult(root))
        >>> ctx.total, ctx.backward, [s.key for s in TREE_COLUMNS if s.applies(ctx)][:3]
        (500, False, ['name', 'calls', 'flops'])
    """
    backward = has_backward(result) if show_backward is None else show_backward
    bounds: dict[str, str] = ({layer.path: layer.bound for layer in result.analyze().layers}
                              if result.machine is not None else {})
    return TreeContext(result, SubtreeSums(result.root), result.total_time_ns, backward,
                       any(n.memory for n in result.nodes()), bounds)


def tree_rows(result: ProfileResult, sort_by: str = "total",
              sums: SubtreeSums | None = None) -> list[tuple[CallNode, int]]:
    """Every node with its depth, in the table's order (siblings sorted by ``sort_by``);
    ``sums``, when the caller has them (``tree_context(result).inc``), are not computed again."""
    inc = SubtreeSums(result.root) if sums is None else sums
    return _select(result, check_choice("sort_by", sort_by, SORT_KEYS), None, 0.0, inc)[0]


def _bwd_time(c: TreeContext, r: _TreeRow) -> str:
    # "-" = no backward pass timed here, which is not the same as one that took 0 ns. A pass's
    # own row is all backward: its time and the FLOPs it charged to the layers.
    node = r[0]
    return (format_time_ns(node.total_ns) if node.kind == "backward"
            else _time_cell(c, node, c.inc.backward_ns[id(node)]))


def hot_style(part: int, whole: int) -> str:
    """The colour of a row whose own time ``part`` is a large share of ``whole`` ("" when it is
    not): colour marks where the time goes."""
    share = part / whole if whole else 0.0
    return RED if share >= HOT_SHARE else YELLOW if share >= WARM_SHARE else ""


#: Self time share coloured red and yellow (with ``color=True``).
HOT_SHARE, WARM_SHARE = 0.30, 0.10

_Spec = ColumnSpec[TreeContext, _TreeRow]

#: The tree's columns in display order. ``key`` is the name ``columns=`` / ``--columns`` take;
#: ``priority`` decides which stay when the width is short (0: always; then lowest first);
#: ``applies`` whether a column is shown by default for this profile. A new column is one entry.
TREE_COLUMNS: tuple[_Spec, ...] = (
    _Spec("name", "Name", lambda c, r: "  " * (r[1] - 1) + node_label(r[0]), right=False,
          elide=True),
    _Spec("calls", "Calls", lambda c, r: format_count(r[0].calls), priority=5),
    _Spec("flops", "FLOPs", lambda c, r: _marked(format_flops(c.inc.flops[id(r[0])]),
                                                 c.inc.completeness[id(r[0])]), priority=3,
          style=lambda c, r: YELLOW if c.inc.completeness[id(r[0])] != "complete" else ""),
    _Spec("macs", "MACs", lambda c, r: format_macs(c.inc.macs[id(r[0])]), priority=9),
    _Spec("self", "Self time", lambda c, r: _time_cell(c, r[0], r[0].self_ns), priority=4,
          style=lambda c, r: hot_style(r[0].self_ns, c.total)),
    _Spec("total", "Total time", lambda c, r: _time_cell(c, r[0], r[0].total_ns), priority=1),
    _Spec("percent", "% time", lambda c, r: format_percent(r[0].total_ns, c.total), priority=2),
    _Spec("rate", "FLOP/s", lambda c, r: format_rate(c.inc.flops[id(r[0])], r[0].total_ns),
          priority=7),
    _Spec("bwd_time", "Bwd time", _bwd_time, priority=6, applies=lambda c: c.backward),
    _Spec("bwd_flops", "Bwd FLOPs", lambda c, r: format_flops(
        r[0].flops if r[0].kind == "backward" else c.inc.backward_flops[id(r[0])]), priority=8,
        applies=lambda c: c.backward),
    # Memory (tracetorch.records.memory), asked for by name: bytes the calls moved (inputs, outputs,
    # parameters once per call), arithmetic intensity, activations saved for backward (the
    # subtree's), parameter bytes; and the roofline label when the profile has a machine.
    _Spec("bytes", "Bytes moved", lambda c, r: _bytes_or_missing(r[0].bytes_moved), priority=10,
          applies=lambda c: c.memory, optional=True),
    _Spec("intensity", "FLOPs/B", lambda c, r: _intensity(c.inc.flops[id(r[0])],
                                                         r[0].bytes_moved), priority=11,
          applies=lambda c: c.memory, optional=True),
    _Spec("saved", "Saved", lambda c, r: _bytes_or_missing(r[0].subtree_saved_bytes),
          priority=12, applies=lambda c: c.memory, optional=True),
    _Spec("param_bytes", "Param bytes", lambda c, r: _bytes_or_missing(r[0].memory.param_bytes),
          priority=13, applies=lambda c: c.memory, optional=True),
    _Spec("bound", "Bound", lambda c, r: c.bounds.get(r[0].path, MISSING), priority=14,
          right=False, applies=lambda c: bool(c.bounds), optional=True),
)


def _bytes_or_missing(n: int) -> str:
    return format_bytes(n) if n else MISSING


def _intensity(flops: int, moved: int) -> str:
    return format_intensity(flops / moved) if moved and flops else MISSING


def dropped_note(headers: list[str], width: int) -> str:
    """The note under a table that left the columns ``headers`` out to fit ``width``."""
    return textwrap.fill(f"Left out to fit {width} characters: {', '.join(headers)} "
                         "(choose with columns= or --columns; 'all' shows every one).", width,
                         break_long_words=False, break_on_hyphens=False)


def width_and_color(width: int | None, color: bool | None) -> tuple[int, bool]:
    """The table's width and colour: as given, or the terminal's where ``None``."""
    if width is not None:
        width = check_positive_int("width", width)
    return (terminal_width() if width is None else width,
            color_enabled() if color is None else bool(color))


def render_table(result: ProfileResult, sort_by: str = "total", depth: int | None = None,
                 row_limit: int | None = None, min_percent: float = 0.0,
                 show_backward: bool | None = None, columns: ColumnChoice = None,
                 width: int | None = None, color: bool | None = None) -> str:
    """The call tree as an indented text table, followed by totals and notes.

    Args:
        result: a recorded or loaded profile.
        sort_by: how siblings are ordered: ``"total"`` / ``"self"`` time, ``"flops"``,
            ``"calls"`` (largest first), ``"name"`` (natural order) or ``"call_order"``.
        depth: deepest level shown (1 = top-level calls only); ``None`` shows all.
        row_limit: at most this many rows; the footer says how many were left out.
        min_percent: hide calls (with their subtrees) under this share of total time.
        show_backward: add Bwd time / Bwd FLOPs columns; ``None`` adds them when any node
            has backward data.
        columns: ``None`` shows the columns that fit ``width``, by priority (see
            :data:`TREE_COLUMNS`; a note names those left out); ``"all"`` every one; a list of
            names (``["calls", "total", "flops"]``) exactly those, after Name.
        width: the line width to fit; ``None`` is the terminal's (see
            :func:`~tracetorch.text.layout.terminal_width`: ``COLUMNS``, else the terminal,
            else 120). Names too long for it are shortened in the middle (``enc...q_proj``).
        color: ANSI colour (bold headers, hot self times); ``None`` colours only when stdout
            is a terminal and ``NO_COLOR`` is not set.

    Raises:
        ValueError: an argument outside the accepted values (the message lists them).

    Example:
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> root = CallNode.root(); fc = root.child("fc", "Linear", "m0"); fc.time.add(500)
        >>> fc.flops_source = "rule"
        >>> print(render_table(ProfileResult(root), depth=1).splitlines()[0])
        Name         Calls    FLOPs  MACs  Self time  Total time  % time    FLOP/s
    """
    sort_by = check_choice("sort_by", sort_by, SORT_KEYS)
    depth = check_positive_int("depth", depth)
    row_limit = check_positive_int("row_limit", row_limit)
    min_percent = check_percent("min_percent", min_percent)
    ctx = tree_context(result, show_backward)
    inc = ctx.inc
    rows, below_depth, below_percent = _select(result, sort_by, depth, min_percent, inc)
    shown = rows[:row_limit] if row_limit is not None else rows
    specs, chosen = pick_columns(TREE_COLUMNS, ctx, columns)
    width, color = width_and_color(width, color)
    fitted, dropped = fit(specs, ctx, shown, width, chosen)
    lines = layout(fitted, shown, width, color) if rows else ["No calls were recorded."]
    notes = [dropped_note(dropped, width)] if dropped and rows else []
    if len(shown) < len(rows):
        left_out = len(rows) - len(shown)
        notes.append(f"{left_out} more {'row' if left_out == 1 else 'rows'} not shown "
                     f"(row_limit={row_limit}).")
    if below_percent:
        notes.append(f"{_rows(below_percent)} under {min_percent:g}% of total time hidden "
                     f"(min_percent={min_percent:g}).")
    if below_depth:
        notes.append(f"{_rows(below_depth)} deeper than depth={depth} folded into their parents.")
    legend = [LEGEND_TREE] if rows else []
    if any(inc.completeness[id(node)] != "complete" for node, _ in shown):
        legend.append(LEGEND_MARKS)
    if any(_estimated(result, node) for node, _ in shown):
        legend.append(LEGEND_ESTIMATED)
    lines += [""] + notes + legend + summary_lines(result)
    return "\n".join(lines)


#: The width of a table written to a file, where no terminal says how wide to be.
FILE_WIDTH = 120


def save_table(result: ProfileResult, path: str | os.PathLike[str], **options: object) -> None:
    """Write :func:`render_table` (``options`` are its arguments) to ``path`` as UTF-8 text,
    :data:`FILE_WIDTH` wide and without colour unless ``options`` say otherwise.

    Example:
        >>> import os, tempfile
        >>> from tracetorch.records.result import ProfileResult
        >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(500)
        >>> path = os.path.join(tempfile.mkdtemp(), "run.txt")
        >>> save_table(ProfileResult(root), path)
        >>> "fc (Linear)" in open(path, encoding="utf-8").read()
        True
    """
    options = {"width": FILE_WIDTH, "color": False, **options}
    text = render_table(result, **options)  # type: ignore[arg-type]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
