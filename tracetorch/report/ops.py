"""The op table of one call node: the tensor operations that ran directly in its calls.

Example:
    >>> from tracetorch.records.tree import CallNode
    >>> node = CallNode.root().child("gate", "Gate", "m0")
    >>> node.note_op("matmul", 2, 1_024, 3_000); node.note_op("sigmoid", 2, 256, 1_000)
    >>> print(render_op_table(node))
    Operations run directly in gate (Gate)
    Operation  Calls        FLOPs     Time  % time
    ---------  -----  -----------  -------  ------
    matmul         2  1.02 KFLOPs  3.00 us   75.0%
    sigmoid        2    256 FLOPs  1.00 us   25.0%
"""
from __future__ import annotations

from tracetorch.records.tree import CallNode, OpRow
from tracetorch.text.layout import Column, layout
from tracetorch.text.units import (
    MISSING,
    format_count,
    format_flops,
    format_percent,
    format_time_ns,
)

__all__ = ("render_op_table",)


def render_op_table(node: CallNode) -> str:
    """``node``'s op table as text: calls, FLOPs and (when timed) time per operation.

    Torch operations are seen in layers without a FLOP rule (a rule's layer runs without
    torch's function mode); ``tracetorch.core`` operations everywhere. Times need
    ``profile(op_timing=True)``.
    """
    title = f"Operations run directly in {node.path or '<model>'} ({node.type_name})"
    ops = node.op_table()
    if not ops:
        return f"{title}: none recorded"
    timed = any(op.time_ns for op in ops)
    total = sum(op.time_ns for op in ops)
    columns: list[Column[OpRow]] = [
        Column("Operation", lambda op: op.name, right=False),
        Column("Calls", lambda op: format_count(op.calls)),
        Column("FLOPs", lambda op: format_flops(op.flops) if op.flops else MISSING)]
    if timed:
        columns += [Column("Time", lambda op: format_time_ns(op.time_ns)),
                    Column("% time", lambda op: format_percent(op.time_ns, total))]
    lines = [title, *layout(columns, ops)]
    if not timed:
        lines.append("(time each operation with profile(op_timing=True))")
    return "\n".join(lines)
