"""The text a merged profile adds to its table: the ranks, the straggler, the layers across
ranks and the collectives (``tracetorch report`` prints it under the tree).

Example:
    >>> from tracetorch.distributed.merge import merge_profiles
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(1_000)
    >>> merged = merge_profiles([ProfileResult(root)], ranks=[0])
    >>> print(render_ranks(merged).splitlines()[0])
    Ranks: 1 of 1
"""
from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any

from tracetorch.distributed.collectives import bus_factor
from tracetorch.distributed.merged import collective_sites, node_spreads, rank_rows
from tracetorch.text.layout import Column, layout
from tracetorch.text.units import (
    format_bytes,
    format_count,
    format_flops,
    format_per_second,
    format_time_ns,
    printable,
)

if TYPE_CHECKING:
    from tracetorch.records.result import ProfileResult
    from tracetorch.records.tree import CallNode

__all__ = ("render_ranks", "LAYER_ROWS")

#: Layers listed in the across-ranks table (the largest by their slowest rank's time).
LAYER_ROWS = 10


def _grid(header: list[str], rows: list[list[str]]) -> list[str]:
    # The reports' layout: the first column (a name) on the left, the numbers on the right.
    columns = [Column(title, itemgetter(i), right=i > 0) for i, title in enumerate(header)]
    return layout(columns, rows)


def _label(node: CallNode) -> str:
    # An unnamed node (a profiled model, a wrapped one) shares its parent's path: say its type.
    if node.name and node.path:
        return node.path
    return f"{node.path} ({node.type_name})" if node.path else node.type_name


def _ns(value: Any) -> str:
    return format_time_ns(float(value)) if value is not None else "-"


def render_ranks(result: ProfileResult, layers: int = LAYER_ROWS) -> str:
    """The per-rank rows, the straggler with its evidence, the ``layers`` layers with the
    largest slowest-rank time (min / median / max across ranks) and the collectives, as text.

    Raises:
        ValueError: ``result`` is not a merged profile.
    """
    rows = rank_rows(result)
    facts = result.meta["distributed"]
    world = int(facts.get("world_size", len(rows)))
    lines = [f"Ranks: {len(rows)} of {world}"
             + (f" (missing: {', '.join(map(str, facts['missing_ranks']))})"
                if facts.get("missing_ranks") else "")]
    lines += _grid(
        ["rank", "host", "device", "backend", "steps", "step p50", "compute", "in collectives",
         "layer calls", "FLOPs"],
        [[str(r), str(row.get("host", "-")), str(row.get("device", "-")),
          str(row.get("backend") or "-"), str(row.get("steps", 0)),
          _ns(row.get("step_median_ns")), _ns(row.get("compute_ns")),
          _ns(row.get("collective_ns")), format_count(row.get("layer_calls", 0)),
          format_flops(row.get("flops", 0))] for r, row in sorted(rows.items())])
    straggler = facts.get("straggler")
    if straggler:
        lines.append("")
        lines.append(
            f"straggler: rank {straggler['rank']}: compute {_ns(straggler['compute_ns'])}, "
            f"{_ns(straggler['excess_ns'])} over the other ranks' median "
            f"({_ns(straggler['others_median_ns'])}); it waits {_ns(straggler['wait_ns'])} in "
            f"collectives, they wait {_ns(straggler['others_wait_median_ns'])}")
        for layer in straggler["layers"]:
            excess = layer["rank_ns"] - layer["others_median_ns"]
            lines.append(f"  {layer['path']}: +{_ns(excess)} self time "
                         f"({_ns(layer['rank_ns'])} against {_ns(layer['others_median_ns'])})")
        lines.append("  (compute: time with no collective in flight, from aligned clocks)")
    spreads = sorted(node_spreads(result).items(), key=lambda item: -item[1].total.max_ns)
    table = [[_label(node), str(s.total.ranks), _ns(s.total.min_ns),
              _ns(s.total.median_ns), _ns(s.total.max_ns), str(s.total.slowest_rank)]
             for node, s in spreads[:layers] if node.kind in ("module", "function")]
    if table:
        lines += ["", "Layers across ranks (each rank's total time):"]
        lines += _grid(["path", "ranks", "min", "median", "max", "slowest rank"], table)
    sites = collective_sites(result)
    if sites:
        lines += ["", "Collectives (time from issue to completion; busbw: nccl-tests' factors):"]
        table = []
        for site in sites:
            total = site.time.total_ns
            algbw = site.bytes * 1e9 / total if total else 0.0
            table.append([site.label,
                          format_count(site.calls), format_bytes(site.bytes), _ns(total),
                          _ns(site.ranks.min_ns), _ns(site.ranks.max_ns),
                          format_per_second(algbw, "B"),
                          format_per_second(algbw * bus_factor(site.op, max(world, 1)), "B")])
        lines += _grid(["collective", "calls", "bytes", "time", "rank min", "rank max",
                        "algbw", "busbw"], table)
    # The straggler's layer paths and the hosts are the job's own names (tables escape theirs).
    return "\n".join(printable(line) for line in lines)
