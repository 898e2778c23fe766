"""The flat rows of a profile (:mod:`tracetorch.records.rows`) as a CSV file.

The CSV is meant for spreadsheets, which run a cell that starts with ``=``, ``+``, ``-`` or ``@``
(or a tab or carriage return before one) as a formula: a module named ``=cmd|' /C calc'!A0``
would run a command when the file is opened. So, as OWASP's guidance on CSV injection advises,
:func:`write_csv` prefixes such text cells with ``'``, which spreadsheets show as text and do not
display; numbers (``-1.5``) stay numbers. The records, the DataFrame and the JSON keep the exact
names.

Example:
    >>> csv_cell("=SUM(A1:A2)")
    "'=SUM(A1:A2)"
"""
from __future__ import annotations

import csv
from typing import TYPE_CHECKING, Any

from tracetorch.records.rows import PathLike, row_fields, to_rows

if TYPE_CHECKING:
    from tracetorch.records.result import ProfileResult

__all__ = ("FORMULA_PREFIXES", "csv_cell", "write_csv")

#: What a text cell may start with for a spreadsheet to read it as a formula (OWASP).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """``value`` as :func:`write_csv` writes it: a text cell a spreadsheet would run as a
    formula gets a leading ``'``; numbers and other text are unchanged.

    Example:
        >>> csv_cell("=cmd|' /C calc'!A0"), csv_cell("-"), csv_cell(-1.5), csv_cell("fc")
        ("'=cmd|' /C calc'!A0", "'-", -1.5, 'fc')
    """
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def write_csv(result: ProfileResult, path: PathLike) -> None:
    """Write :func:`to_rows` as CSV with a header; an empty cell stands for ``None``.

    Example:
        >>> import os, tempfile
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(2_000)
        >>> path = os.path.join(tempfile.mkdtemp(), "run.csv")
        >>> write_csv(ProfileResult(root), path)
        >>> open(path).readline().split(",")[:4]
        ['path', 'name', 'type', 'kind']
    """
    rows = to_rows(result)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=row_fields(rows), restval="")
        writer.writeheader()
        writer.writerows({key: csv_cell(value) for key, value in row.items()} for row in rows)
