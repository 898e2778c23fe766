"""The compact HTML a notebook shows for a profile (``ProfileResult._repr_html_``).

Jupyter renders an object's ``_repr_html_`` inline, so this is the summary lines and the top rows
of the call tree as one small HTML table: the text report's cells exactly (the same
:data:`~tracetorch.report.table.TREE_COLUMNS`), inline styles only, no script, so it is light
enough for any output cell and survives a notebook viewer that strips scripts. Every text is
HTML-escaped. The full interactive page is :func:`tracetorch.report.html.save_html`;
``print(prof)`` stays the text table.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root(); root.child("<fc>", "Linear", "m0").time.add(1_000)
    >>> snippet = render_notebook(ProfileResult(root))
    >>> "&lt;fc&gt; (Linear)" in snippet, "<script" in snippet
    (True, False)
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING

from tracetorch.report.summary import summary_lines
from tracetorch.report.table import TREE_COLUMNS, node_label, tree_context, tree_rows
from tracetorch.text.layout import pick_columns
from tracetorch.text.units import printable

if TYPE_CHECKING:  # reports only read results, a result never imports a report
    from tracetorch.records.result import ProfileResult

__all__ = ("render_notebook", "NOTEBOOK_ROWS")

#: Rows of the call tree a notebook shows by default (the heaviest first, children under parents).
NOTEBOOK_ROWS = 15

_CELL = "padding:2px 10px;border-bottom:1px solid #e6e9ee;white-space:nowrap;"
_NUM = _CELL + "text-align:right;font-variant-numeric:tabular-nums;"
_HEAD = "padding:3px 10px;border-bottom:2px solid #cfd5dd;white-space:nowrap;"


def render_notebook(result: ProfileResult, rows: int = NOTEBOOK_ROWS) -> str:
    """An HTML fragment: the top ``rows`` rows of the call tree (sorted by total time, as
    ``print(prof)``) and the summary lines.

    Raises:
        ValueError: ``rows`` is not an integer >= 1.

    Example:
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> render_notebook(ProfileResult(CallNode.root())).count("<tr")
        1
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be an integer >= 1; got {rows!r}")
    ctx = tree_context(result)
    # The text table's default columns; the name is laid out apart (indented by padding).
    specs = [s for s in pick_columns(TREE_COLUMNS, ctx, None)[0] if s.key != "name"]
    tree = tree_rows(result, sums=ctx.inc)
    head = "".join(f'<th style="{_HEAD}text-align:{"right" if s.right else "left"}">'
                   f"{html.escape(s.header)}</th>" for s in specs)
    body = []
    for node, level in tree[:rows]:
        name = (f'<td style="{_CELL}padding-left:{4 + 14 * (level - 1)}px" '
                f'title="{html.escape(printable(node.path))}">{html.escape(node_label(node))}</td>')
        cells = "".join(f'<td style="{_NUM if s.right else _CELL}">'
                        f"{html.escape(s.cell(ctx, (node, level)))}</td>" for s in specs)
        body.append(f"<tr>{name}{cells}</tr>")
    more = len(tree) - len(body)
    rows_left = f"{more} more {'row' if more == 1 else 'rows'}"
    note = (f"<p style=\"margin:4px 0;color:#5d6675\">{rows_left}: "
            f"<code>prof.save_html(\"report.html\")</code> shows them all.</p>" if more > 0 else "")
    summary = "".join(f"<div>{html.escape(line)}</div>" for line in summary_lines(result))
    return ('<div class="tracetorch-profile" style="font-family:system-ui,sans-serif;'
            'font-size:13px;color:#1f2430">'
            '<table style="border-collapse:collapse;margin:0 0 6px">'
            f'<thead><tr><th style="{_HEAD}text-align:left">Name</th>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>{note}"
            f'<div style="font-family:ui-monospace,monospace;font-size:12px;'
            f'white-space:pre-wrap;color:#3b4350">{summary}</div></div>')
