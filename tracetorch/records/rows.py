"""A profile as flat records for analysis: one dict per call node, or a pandas DataFrame.

Every node of the tree (the root excepted) is one row, parents before children, in call order.
Times are integer nanoseconds (the time statistics are floats: means and quantiles of per-call
inclusive time), FLOPs and bytes plain integers, so a spreadsheet or a DataFrame computes with
them directly. ``flops`` is the node's own share (children excluded), ``subtree_flops`` what the
call cost with its children, as in the text table; ``macs`` is empty where a layer has none.
Memory columns (``input_bytes``... from :mod:`tracetorch.records.memory`, zeros where memory was not
measured) come after the others. :mod:`tracetorch.report.csv` writes them as a CSV file.

pandas is imported by :func:`to_dataframe` alone, never by ``import tracetorch``.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root(); fc = root.child("fc", "Linear", "m0"); fc.time.add(2_000)
    >>> row = to_rows(ProfileResult(root))[0]
    >>> row["path"], row["type"], row["calls"], row["total_ns"], row["parent"]
    ('fc', 'Linear', 1, 2000, None)
"""
from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any, Union

from tracetorch.records.tree import CallNode, SubtreeSums
from tracetorch.text.units import format_shape

if TYPE_CHECKING:  # reports only read results, a result never imports a report
    from tracetorch.records.result import ProfileResult

__all__ = ("ROW_FIELDS", "to_rows", "row_fields", "to_dataframe", "memory_fields")

#: The columns of every row, in this order (the CSV header); memory columns follow when present.
ROW_FIELDS: tuple[str, ...] = (
    "path", "name", "type", "kind", "depth", "parent", "calls",
    "flops", "subtree_flops", "gemm_flops", "subtree_gemm_flops", "macs", "flops_source",
    "completeness", "self_ns", "total_ns",
    "mean_ns", "p50_ns", "p90_ns", "p99_ns", "min_ns", "max_ns", "std_ns",
    "backward_calls", "backward_ns", "backward_flops", "subtree_backward_flops",
    "params", "errors", "input_shapes", "output_shapes",
)

PathLike = Union[str, "os.PathLike[str]"]

#: Between a node's distinct shape signatures in the ``input_shapes``/``output_shapes`` cells.
SHAPE_SEPARATOR = " | "
def memory_fields(node: CallNode) -> dict[str, int]:
    """The node's memory statistics as ``{field: bytes}`` plus ``bytes_moved`` (all zeros when
    memory was not measured)."""
    fields = {key: int(value) for key, value in node.memory.to_dict().items()}
    fields["bytes_moved"] = int(node.bytes_moved)
    return fields


def _shapes(signatures: list[Any]) -> str:
    return SHAPE_SEPARATOR.join(format_shape(sig) for sig in signatures)


def _row(node: CallNode, sums: SubtreeSums) -> dict[str, Any]:
    time = node.time
    parent = node.parent
    key = id(node)
    row: dict[str, Any] = {
        "path": node.path, "name": node.name, "type": node.type_name, "kind": node.kind,
        "depth": node.depth,
        "parent": parent.path if parent is not None and parent.kind != "root" else None,
        "calls": node.calls, "flops": int(node.flops), "subtree_flops": sums.flops[key],
        "gemm_flops": int(node.gemm_flops), "subtree_gemm_flops": sums.gemm_flops[key],
        "macs": None if node.macs is None else int(node.macs),
        "flops_source": node.flops_source, "completeness": sums.completeness[key],
        "self_ns": node.self_ns, "total_ns": node.total_ns,
        "mean_ns": time.mean_ns, "p50_ns": time.quantile(0.5), "p90_ns": time.quantile(0.9),
        "p99_ns": time.quantile(0.99), "min_ns": time.min_ns, "max_ns": time.max_ns,
        "std_ns": time.std_ns,
        "backward_calls": node.backward_time.count, "backward_ns": node.backward_time.total_ns,
        "backward_flops": int(node.backward_flops),
        "subtree_backward_flops": sums.backward_flops[key],
        "params": int(node.params), "errors": int(node.errors),
        "input_shapes": _shapes(node.input_shapes), "output_shapes": _shapes(node.output_shapes),
    }
    row.update(memory_fields(node))
    return row


def to_rows(result: ProfileResult) -> list[dict[str, Any]]:
    """One dict per node (root excepted), parents first, in call order; keys as
    :func:`row_fields` lists them."""
    sums = SubtreeSums(result.root)  # one bottom-up pass, not a subtree walk per node
    return [_row(node, sums) for node in result.nodes()]


def row_fields(rows: list[dict[str, Any]]) -> list[str]:
    """The header for ``rows``: :data:`ROW_FIELDS`, then any memory field in first-seen order."""
    extra = [key for row in rows for key in row if key not in ROW_FIELDS]
    return list(ROW_FIELDS) + list(dict.fromkeys(extra))


def to_dataframe(result: ProfileResult) -> Any:
    """:func:`to_rows` as a ``pandas.DataFrame``, columns in :func:`row_fields` order.

    Raises:
        ImportError: pandas is not installed (``pip install pandas``).
    """
    try:
        # By name: the optional dependency stays out of the import graph and of mypy's view.
        pandas = importlib.import_module("pandas")
    except ImportError as err:
        raise ImportError("to_dataframe() needs pandas, which is not installed: "
                          "pip install pandas (or use to_rows() / to_csv())") from err
    rows = to_rows(result)
    return pandas.DataFrame(rows, columns=row_fields(rows))
