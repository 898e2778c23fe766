"""The bottleneck section: roofline table, time by bound, "Where to look first", utilization.

:func:`render_analysis` prints a :class:`~tracetorch.analysis.bottlenecks.Analysis` (what
``print(prof.analyze(machine))`` shows); :func:`bottleneck_lines` is the same section for a
profile recorded with ``profile(machine=...)``, which the summary appends. The first line always
names the peaks used and where they came from, so no percentage is read without its denominator.

Reading the table: ``FLOP/B`` is the layer's arithmetic intensity (a ``+`` marks a lower bound:
some FLOPs below it are unknown); ``% of ceiling`` is achieved FLOP/s over the roofline at that
intensity (the same as predicted time over measured time); ``Above ceiling`` is the time a layer
took beyond the roofline's prediction, the most it could gain.

Example:
    >>> from tracetorch.analysis.bottlenecks import analyze
    >>> from tracetorch.analysis.machine import Machine
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> text = render_analysis(analyze(ProfileResult(CallNode.root()), Machine(1e12, 1e11)))
    >>> print(text.splitlines()[1].replace(", call overhead", "\\n  call overhead"))
    Peaks used: peak 1.00 TFLOP/s, bandwidth 100 GB/s
      call overhead not measured (user); ridge 10 FLOP/B
"""
from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tracetorch.analysis.bottlenecks import Analysis, analyze
from tracetorch.analysis.machine import Machine, machine_entry
from tracetorch.analysis.roofline import Bound, LayerBound
from tracetorch.analysis.utilization import Utilization
from tracetorch.text.layout import Column, layout
from tracetorch.text.units import (
    format_count,
    format_flops,
    format_intensity,
    format_per_second,
    format_percent,
    format_time_ns,
    printable,
)

if TYPE_CHECKING:  # reports only read results, a result never imports a report
    from tracetorch.records.result import ProfileResult

__all__ = ("render_analysis", "bottleneck_lines", "utilization_lines", "ROWS", "WIDTH")

#: Labelled layers the table shows, the longest first (every one is in ``Analysis.layers``).
ROWS = 15
#: Where the section's sentences wrap.
WIDTH = 100

_COLUMNS: list[Column[LayerBound]] = [
    Column("Layer", lambda b: b.label, right=False),
    Column("Bound", lambda b: b.bound, right=False),
    Column("Calls", lambda b: format_count(b.calls)),
    Column("FLOP/B", lambda b: format_intensity(b.intensity) + ("" if b.complete else "+")),
    Column("Achieved", lambda b: format_per_second(b.achieved_flops, "FLOP")),
    Column("Bytes/s", lambda b: format_per_second(b.achieved_bytes, "B")),
    Column("% of ceiling", lambda b: f"{100.0 * b.fraction_of_ceiling:.1f}%"),
    Column("Time", lambda b: format_time_ns(b.time_ns)),
    Column("Above ceiling", lambda b: format_time_ns(b.excess_ns)),
]


def _peaks(machine: Machine) -> str:
    return f"Peaks used: {machine.describe()}; ridge {machine.ridge_intensity:.3g} FLOP/B"


def _shares(parts: Mapping[Bound, int], whole: int) -> str:
    return ", ".join(f"{name} {format_percent(ns, whole)} ({format_time_ns(ns)})"
                     for name, ns in parts.items() if ns)


def _look_first(analysis: Analysis) -> list[str]:
    if not analysis.look_first:
        return ["Where to look first: no labelled layer took time above its ceiling"]
    lines = ["Where to look first (the most time above the roofline):"]
    for rank, b in enumerate(analysis.look_first, 1):
        share = format_percent(b.excess_ns, analysis.total_ns)
        lines += _wrapped(f"{rank}. {b.label}: {b.bound}, {format_time_ns(b.excess_ns)} above "
                          f"its ceiling ({share} of the profile's time; "
                          f"{format_time_ns(b.time_ns)} measured, "
                          f"{format_time_ns(b.predicted_ns)} at the ceiling)", "  ", "     ")
        lines += _wrapped(b.explanation, "     ", "     ")
    return lines


def _wrapped(text: str, first: str, rest: str) -> list[str]:
    # Prose lines wrap at WIDTH; the table above them is as wide as its columns.
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False)


def utilization_lines(use: Utilization, machine: Machine) -> list[str]:
    """MFU, HFU, per-step MFU and the phases' achieved FLOP/s, with the peak they divide by.

    Example:
        >>> from tracetorch.analysis.machine import Machine
        >>> from tracetorch.analysis.utilization import Utilization
        >>> use = Utilization(peak_flops=1e12, model_flops=10**9, recompute_flops=0,
        ...                   time_ns=4_000_000, time_source="top-level calls")
        >>> print("\\n".join(utilization_lines(use, Machine(1e12, 1e11))))
        Utilization against peak 1.00 TFLOP/s (user):
          MFU 25.0%: 1.00 GFLOPs forward + backward in 4.00 ms (top-level calls)
    """
    lines = [f"Utilization against peak {format_per_second(use.peak_flops, 'FLOP')} "
             f"({machine.source}):"]
    mfu = use.mfu
    if mfu is None:
        return lines + ["  MFU: no time recorded"]
    lines.append(f"  MFU {mfu:.1%}: {format_flops(use.model_flops)} forward + backward in "
                 f"{format_time_ns(use.time_ns)} ({use.time_source})")
    hfu = use.hfu
    if hfu is not None:
        lines.append(f"  HFU {hfu:.1%}: with {format_flops(use.recompute_flops)} recomputed "
                     "in backward (activation checkpointing)")
    if use.steps:
        lines.append("  MFU per step: " + ", ".join(
            f"{which} {use.step_mfu(which):.1%} ({format_time_ns(use.step_ns[which])})"
            for which in ("median", "fastest", "slowest")))
    rates = [f"{p.phase} {format_per_second(rate, 'FLOP')}" for p in use.phases
             if p.time_ns and (rate := p.flops_per_s) is not None]
    if rates:
        lines.append("  Achieved: " + ", ".join(rates))
    return lines


def render_analysis(analysis: Analysis, rows: int = ROWS) -> str:
    """The bottleneck section as text (see the module docstring for how to read it)."""
    lines = ["Bottlenecks (roofline per layer)", _peaks(analysis.machine)]
    layers = sorted(analysis.layers, key=lambda b: -b.time_ns)
    if layers:
        lines += [""] + layout(_COLUMNS, layers[:rows])
        if len(layers) > rows:
            lines.append(f"... {len(layers) - rows} more labelled layers "
                         "(prof.analyze(...).layers)")
        by_bound = analysis.time_by_bound
        labelled = sum(by_bound.values())
        lines.append("")
        lines += _wrapped(f"Time by bound: {_shares(by_bound, labelled)} of the labelled "
                          f"layers' {format_time_ns(labelled)} "
                          f"({format_percent(labelled, analysis.total_ns)} of the profile's "
                          "time)", "", "  ")
    else:
        lines.append("No layer labelled: a layer needs time, known FLOPs and recorded bytes "
                     "(profile(memory=True))")
    if analysis.containers:
        lines.append("Inside containers (time of their labelled layers, by bound):")
    for box in analysis.containers:
        lines.append(f"  {box.label} {format_time_ns(box.time_ns)}: "
                     f"{_shares(box.by_bound, box.time_ns)}")
    if analysis.unlabelled:
        lines.append("Not labelled: " + ", ".join(
            f"{count} {'layer' if count == 1 else 'layers'} ({why})"
            for why, count in sorted(analysis.unlabelled.items())))
    lines += [""] + _look_first(analysis)
    lines += [""] + utilization_lines(analysis.utilization, analysis.machine)
    # Layer labels, container labels and the explanations name the user's modules.
    return "\n".join(printable(line) for line in lines)


def bottleneck_lines(result: ProfileResult) -> list[str]:
    """The bottleneck section of a profile recorded (or reported) with a machine, as lines;
    none without one or with a damaged one (the summary's ``Machine:`` line says why).

    Example:
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> bottleneck_lines(ProfileResult(CallNode.root()))
        []
    """
    machine = machine_entry(result.meta)[0]
    if machine is None:
        return []
    return render_analysis(analyze(result, machine)).splitlines()
