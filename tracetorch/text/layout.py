"""Plain-text column layout shared by the text reports: columns, width fitting, eliding, colour.

A column is a header, an alignment and a function from a row to its cell text; the layout pads
every cell to its column's widest entry. Reports declare their columns as :class:`ColumnSpec`
entries (a name for ``columns=``, a priority, whether it applies to this profile); :func:`fit`
keeps the columns that fit a width, most important first, and shortens over-long names in the
middle. Output is ASCII apart from the user's own names (the elision mark too), so it survives
any console encoding; colour is ANSI SGR codes, added only when asked. Every cell passes through
:func:`~tracetorch.text.units.printable` before it is measured, so a name's control or bidi
characters show as escapes and cannot break the alignment, move the cursor or recolour a column.
"""
from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Generic, TextIO, TypeVar, Union

from tracetorch.text.units import printable

__all__ = ("Column", "ColumnSpec", "layout", "fit", "pick_columns", "elide_middle",
           "terminal_width", "color_enabled", "DEFAULT_WIDTH", "NAME_MIN", "ELLIPSIS",
           "BOLD", "RED", "YELLOW", "DIM")

Row = TypeVar("Row")
Ctx = TypeVar("Ctx")

#: Spaces between two columns.
GAP = "  "
#: Width used when the output is not a terminal and ``COLUMNS`` is not set.
DEFAULT_WIDTH = 120
#: A name column is not shortened below this many characters to make room for more columns.
NAME_MIN = 32
#: What replaces the middle of a name too long for its column.
ELLIPSIS = "..."
#: ANSI SGR codes the reports use.
BOLD, RED, YELLOW, DIM = "1", "31", "33", "2"

#: ``columns=`` as the reports accept it: ``None`` (the defaults that fit), ``"all"`` or names.
ColumnChoice = Union[None, str, Sequence[str]]


@dataclass(frozen=True)
class Column(Generic[Row]):
    """One column: ``cell(row)`` gives the text; ``right`` aligns numbers on the right.

    ``elide`` marks a name column, whose over-long cells :func:`layout` shortens in the middle
    when given a width; ``style(row)`` is an ANSI SGR code for the cell (``""`` for none).
    """

    header: str
    cell: Callable[[Row], str]
    right: bool = True
    elide: bool = False
    style: Callable[[Row], str] | None = None


@dataclass(frozen=True)
class ColumnSpec(Generic[Ctx, Row]):
    """A report's column before it is bound to one report's context (its totals, its tree).

    Attributes:
        key: the name ``columns=`` and ``--columns`` use.
        header: the header printed.
        cell: ``cell(ctx, row)``, the text of one cell.
        priority: 0 for a column always shown; otherwise columns with lower numbers are kept
            first when the width is short.
        applies: whether the column belongs in this report by default (``Bwd time`` only with
            backward data); naming it in ``columns=`` shows it anyway.
        optional: shown only when asked for, by name or with ``"all"`` (the memory columns:
            the default table stays readable).
    """

    key: str
    header: str
    cell: Callable[[Ctx, Row], str]
    priority: int = 0
    right: bool = True
    elide: bool = False
    applies: Callable[[Ctx], bool] = lambda ctx: True
    style: Callable[[Ctx, Row], str] | None = None
    optional: bool = False

    def bind(self, ctx: Ctx) -> Column[Row]:
        """The column of one report, its cells reading ``ctx``."""
        cell, style = self.cell, self.style
        return Column(self.header, lambda row: cell(ctx, row), self.right, self.elide,
                      None if style is None else (lambda row: style(ctx, row)))


def pick_columns(specs: Sequence[ColumnSpec[Ctx, Row]], ctx: Ctx,
                 columns: ColumnChoice) -> tuple[list[ColumnSpec[Ctx, Row]], bool]:
    """The specs a report shows, in their declared order, and whether the user chose them.

    ``None`` gives the applicable ones but the optional ones (to be fitted to the width);
    ``"all"`` every applicable one, never dropped; a list of keys exactly those, plus the
    always-shown (priority 0) ones.

    Raises:
        ValueError: ``columns`` is not ``None``, ``"all"`` or a list of known keys.

    Example:
        >>> specs = [ColumnSpec("name", "Name", lambda c, r: r), ColumnSpec("n", "N",
        ...          lambda c, r: r, priority=1)]
        >>> [s.key for s in pick_columns(specs, None, ["n"])[0]]
        ['name', 'n']
    """
    if columns is None:
        return [s for s in specs if s.applies(ctx) and not s.optional], False
    if columns == "all":
        return [s for s in specs if s.applies(ctx)], True
    keys = [s.key for s in specs]
    names = [columns] if isinstance(columns, str) else columns
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"columns must be None, 'all' or a list of column names; "
                         f"got {columns!r}")
    unknown = [n for n in names if n not in keys]
    if unknown:
        raise ValueError(f"columns: unknown column {unknown[0]!r}; choose from "
                         f"{', '.join(keys)} (or 'all')")
    return [s for s in specs if s.priority == 0 or s.key in names], True


def elide_middle(text: str, width: int) -> str:
    """``text`` shortened to ``width`` characters by replacing its middle with ``...``; leading
    spaces (a tree's indentation) are kept, and the end (the layer's own name and type) gets two
    thirds of what is left.

    Example:
        >>> elide_middle("encoder.layer.0.attention.self.q_proj", 24)
        'encoder...on.self.q_proj'
        >>> elide_middle("  short", 24)
        '  short'
    """
    if len(text) <= width:
        return text
    body = text.lstrip(" ")
    indent = text[: len(text) - len(body)]
    # Keep at least a few characters on each side, even if the indentation has to overflow.
    room = max(width - len(indent) - len(ELLIPSIS), 4)
    head = room // 3
    return indent + body[:head] + ELLIPSIS + body[len(body) - (room - head):]


def fit(specs: Sequence[ColumnSpec[Ctx, Row]], ctx: Ctx, rows: Sequence[Row], width: int,
        chosen: bool) -> tuple[list[Column[Row]], list[str]]:
    """The columns to lay out within ``width`` and the headers of those left out for it.

    Columns are added by priority while the line, with name columns shortened to at most
    :data:`NAME_MIN`, still fits; the kept ones stay in their declared order. ``chosen`` (the
    user named the columns) keeps every one of them.

    Example:
        >>> specs = [ColumnSpec("name", "Name", lambda c, r: r, right=False, elide=True),
        ...          ColumnSpec("a", "Wide column", lambda c, r: "1", priority=1)]
        >>> cols, dropped = fit(specs, None, ["x" * 30], 30, chosen=False)
        >>> [c.header for c in cols], dropped
        (['Name'], ['Wide column'])
    """
    widths = {s.key: max([len(s.header)] + [len(printable(s.cell(ctx, r))) for r in rows])
              for s in specs}

    def need(spec: ColumnSpec[Ctx, Row]) -> int:
        natural = widths[spec.key]
        return min(natural, max(NAME_MIN, len(spec.header))) if spec.elide else natural

    kept = {s.key for s in specs if chosen or s.priority == 0}
    used = sum(need(s) for s in specs if s.key in kept) + len(GAP) * (len(kept) - 1)
    dropped: list[str] = []
    for spec in sorted((s for s in specs if s.key not in kept), key=lambda s: s.priority):
        extra = need(spec) + len(GAP)
        if used + extra <= width:
            kept.add(spec.key)
            used += extra
        else:
            dropped.append(spec.key)
    return ([s.bind(ctx) for s in specs if s.key in kept],
            [s.header for s in specs if s.key in dropped])


def layout(columns: Sequence[Column[Row]], rows: Sequence[Row], width: int | None = None,
           color: bool = False) -> list[str]:
    """The header, a rule and one line per row, every column padded to a common width.

    With ``width``, name columns (``elide=True``) give up what the line needs to fit, down to
    :data:`NAME_MIN` characters, their cells shortened in the middle. With ``color``, headers are
    bold and cells get their column's style.

    Example:
        >>> cols = [Column("Name", lambda r: r[0], right=False), Column("N", lambda r: r[1])]
        >>> print("\\n".join(layout(cols, [("a", "1"), ("bb", "22")])))
        Name   N
        ----  --
        a      1
        bb    22
    """
    cells = [[printable(col.cell(row)) for col in columns] for row in rows]
    widths = [len(col.header) for col in columns]
    for line in cells:
        widths = [max(w, len(text)) for w, text in zip(widths, line)]
    if width is not None:
        cells, widths = _shorten(columns, cells, widths, width)

    def join(texts: Sequence[str], styles: Sequence[str]) -> str:
        padded = [
            text.rjust(w) if col.right else text.ljust(w)
            for col, text, w in zip(columns, texts, widths)
        ]
        if color:
            padded = [f"\x1b[{s}m{p}\x1b[0m" if s else p for p, s in zip(padded, styles)]
        return GAP.join(padded).rstrip()

    plain = [""] * len(columns)
    lines = [join([col.header for col in columns], [BOLD] * len(columns) if color else plain),
             GAP.join("-" * w for w in widths)]
    for row, line in zip(rows, cells):
        styles = [col.style(row) if color and col.style else "" for col in columns]
        lines.append(join(line, styles))
    return lines


def _shorten(columns: Sequence[Column[Row]], cells: list[list[str]], widths: list[int],
             width: int) -> tuple[list[list[str]], list[int]]:
    over = sum(widths) + len(GAP) * (len(widths) - 1) - width
    for i, col in enumerate(columns):
        if over <= 0 or not col.elide:
            continue
        target = max(widths[i] - over, NAME_MIN, len(col.header))
        if target >= widths[i]:
            continue
        for line in cells:
            line[i] = elide_middle(line[i], target)
        # An indentation deeper than the target keeps a few characters: take the real widest.
        new = max([len(col.header)] + [len(line[i]) for line in cells])
        over -= widths[i] - new
        widths[i] = new
    return cells, widths


def _columns_env() -> int | None:
    try:
        value = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return None
    return value if value > 0 else None


def _is_tty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


def terminal_width(stream: TextIO | None = None) -> int:
    """The width a report printed to ``stream`` (default ``sys.stdout``) should fit.

    ``COLUMNS`` when set to a positive integer; else the terminal's width when ``stream`` is a
    terminal; else :data:`DEFAULT_WIDTH` (120: pipes, files, notebooks, captured output).

    Example:
        >>> import io
        >>> terminal_width(io.StringIO()) == (_columns_env() or DEFAULT_WIDTH)
        True
    """
    stream = sys.stdout if stream is None else stream
    columns = _columns_env()
    if columns is not None:
        return columns
    if _is_tty(stream):
        try:
            return os.get_terminal_size(stream.fileno()).columns or DEFAULT_WIDTH
        except (AttributeError, ValueError, OSError):
            return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return DEFAULT_WIDTH


def color_enabled(stream: TextIO | None = None) -> bool:
    """Whether a report printed to ``stream`` (default ``sys.stdout``) is coloured: only on a
    terminal, never when ``NO_COLOR`` is set (to any value, https://no-color.org) or
    ``TERM=dumb``.

    Example:
        >>> import io
        >>> color_enabled(io.StringIO())
        False
    """
    if "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb":
        return False
    return _is_tty(sys.stdout if stream is None else stream)
