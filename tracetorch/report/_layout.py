"""Plain-text column layout shared by the tree table and the flat views.

A column is a header, an alignment and a function from a row to its cell text; the layout pads
every cell to its column's widest entry. Output is ASCII apart from the user's own names, so it
survives any console encoding.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

__all__ = ("Column", "layout")

Row = TypeVar("Row")

#: Spaces between two columns.
GAP = "  "


@dataclass(frozen=True)
class Column(Generic[Row]):
    """One column: ``cell(row)`` gives the text; ``right`` aligns numbers on the right."""

    header: str
    cell: Callable[[Row], str]
    right: bool = True


def layout(columns: Sequence[Column[Row]], rows: Sequence[Row]) -> list[str]:
    """The header, a rule and one line per row, every column padded to a common width.

    Example:
        >>> cols = [Column("Name", lambda r: r[0], right=False), Column("N", lambda r: r[1])]
        >>> print("\\n".join(layout(cols, [("a", "1"), ("bb", "22")])))
        Name   N
        ----  --
        a      1
        bb    22
    """
    cells = [[col.cell(row) for col in columns] for row in rows]
    widths = [len(col.header) for col in columns]
    for line in cells:
        widths = [max(w, len(text)) for w, text in zip(widths, line)]

    def join(texts: Sequence[str]) -> str:
        padded = [
            text.rjust(width) if col.right else text.ljust(width)
            for col, text, width in zip(columns, texts, widths)
        ]
        return GAP.join(padded).rstrip()

    lines = [join([col.header for col in columns]), GAP.join("-" * w for w in widths)]
    lines.extend(join(line) for line in cells)
    return lines
