"""The footer every text report ends with: FLOP totals, time, step statistics, warnings.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> print("\\n".join(summary_lines(ProfileResult(CallNode.root()))))
    Forward FLOPs: 0 FLOPs (GEMM/conv 0 FLOPs, other 0 FLOPs)
    Total time:    0 ns in 0 top-level calls
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tracetorch.analysis.machine import machine_entry
from tracetorch.records.phases import input_bound
from tracetorch.text.units import (
    format_bytes,
    format_count,
    format_flops,
    format_time_ns,
    printable,
)

if TYPE_CHECKING:  # reports only read results, a result never imports a report
    from tracetorch.records.result import ProfileResult

__all__ = ("summary_lines", "NOISY_SPREAD", "MAX_UNSUPPORTED_LISTED")

#: Step-time spread (std/mean) above which the footer flags the steps as noisy, as
#: torch.utils.benchmark warns when IQR/median passes 0.1.
NOISY_SPREAD = 0.10
#: Unsupported types named in the footer before the rest are summed up as "+N more".
MAX_UNSUPPORTED_LISTED = 8


def _plural(n: int, word: str) -> str:
    return f"{format_count(n)} {word}{'' if n == 1 else 's'}"


#: What the forward FLOPs line adds when it is not the whole count (see ``Unsupported``).
_LOWER_BOUND = {"partial": "; a lower bound (layers with unknown FLOPs ran)",
                "unknown": "; unknown (no layer that ran has a FLOP rule)"}


def _split_flops(total: int, gemm: int) -> str:
    return (f"{format_flops(total)} (GEMM/conv {format_flops(gemm)}, "
            f"other {format_flops(total - gemm)})")


def _sampling_line(result: ProfileResult) -> str:
    # profile(backward_every=K): which steps the backward figures come from, and how scaled.
    sampling = result.backward_sampling
    if sampling is None:
        return ""
    every, steps, taken = sampling
    return (f"sampled 1 step in {every} ({taken} of {_plural(steps, 'step')}): Backward and "
            f"Total FLOPs scaled to all steps; the rows' Bwd and backward FLOPs are the sampled "
            f"steps'")


def _phases_line(result: ProfileResult) -> str:
    # Per step: each phase's share and mean time, where any step was split into phases.
    phases = result.step_phases
    whole = sum(stats.total_ns for stats in phases.values())
    if not whole:
        return ""
    return ", ".join(f"{name} {100.0 * stats.total_ns / whole:.1f}% "
                     f"(mean {format_time_ns(stats.mean_ns)})"
                     for name, stats in phases.items() if stats.total_ns)


def _memory_line(result: ProfileResult) -> str:
    parts = []
    saved = result.saved_bytes
    if saved:
        steps = result.step_times.count
        per_step = f", {format_bytes(saved / steps)} per step" if steps > 1 else ""
        parts.append(f"activations saved for backward {format_bytes(saved)}{per_step}")
    if result.peak_bytes:
        parts.append(f"device peak {format_bytes(result.peak_bytes)} (allocated, at layer calls)")
    return "; ".join(parts)


def _compiled_line(result: ProfileResult) -> str:
    # torch.compile'd regions (meta["compiled"]: see tracetorch.adapters.torch.compiled).
    noted = result.meta.get("compiled")
    if not noted:
        return ""
    parts = []
    for path, region in noted["regions"].items():
        where = f"{region['type']} at {path}" if path else region["type"]
        text = (f"{where} ({_plural(region['calls'], 'call')}): "
                f"{_plural(region['graphs'], 'graph')} compiled in "
                f"{format_time_ns(region['compile_ns'])}, "
                f"{_plural(region['recompiles'], 'recompilation')}, "
                f"{_plural(region['graph_breaks'], 'graph break')}")
        if region["break_reasons"]:
            text += f" ({'; '.join(region['break_reasons'])})"
        if region["layers"] == "dispatched":
            text += f"; its layers unseen ({region.get('why_not', '')}): one row"
        parts.append(text)
    if noted["estimated"]:
        parts.append(f"the times of the {_plural(len(noted['estimated']), 'layer')} inside are "
                     "estimated (~: the region's measured time shared by FLOPs)")
    return "; ".join(parts)


def _vmap_line(result: ProfileResult) -> str:
    # vmaps run in the profile (meta["vmap"]: see tracetorch.adapters.torch.vmapped).
    noted = result.meta.get("vmap")
    if not noted:
        return ""
    sizes = noted["batch_sizes"]
    return (f"{_plural(len(sizes), 'vmap')} (batch sizes {', '.join(map(str, sizes))}): the "
            "FLOPs, sizes and op counts of what ran under them are one example's of each batch")


def _forward_ad_line(result: ProfileResult) -> str:
    # Dual tensors made in the profile (meta["forward_ad"]: see
    # tracetorch.adapters.torch.forward_mode).
    noted = result.meta.get("forward_ad")
    if not noted:
        return ""
    return (f"{_plural(noted['dual_tensors'], 'dual tensor')} made: the tangents computed "
            "beside the values are not counted, only the values' FLOPs")


def summary_lines(result: ProfileResult) -> list[str]:
    """Totals and notes for the end of a report, one ``"Label: value"`` line each.

    Always: forward FLOPs split into GEMM/conv and other, and the total time. When present:
    backward and total FLOPs, memory, the phases of the steps (with an input-bound label) or the
    data/forward/backward/optimizer shares of the time, step statistics,
    unsupported types, calls that raised, a note when the timeline was capped, and the bottleneck
    section (:mod:`tracetorch.report.bottleneck`) when the profile has a machine, or a
    ``Machine:`` line saying why its machine entry was set aside.

    Example:
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> root = CallNode.root(); node = root.child("fc", "Linear", "m0")
        >>> node.time.add(2_000); node.flops = node.gemm_flops = 4_000; node.flops_source = "rule"
        >>> summary_lines(ProfileResult(root))[0]
        'Forward FLOPs: 4.00 KFLOPs (GEMM/conv 4.00 KFLOPs, other 0 FLOPs)'
    """
    nodes = result.nodes()
    forward_gemm = result.forward_gemm_flops
    backward_gemm = result.backward_gemm_flops
    has_backward = any(n.backward_flops or n.backward_time.count for n in nodes)
    top_calls = sum(c.calls for c in result.root.children.values())

    rows: list[tuple[str, str]] = [
        ("Forward FLOPs", _split_flops(result.forward_flops, forward_gemm)
         + _LOWER_BOUND.get(result.completeness, ""))]
    recompute = result.recompute_flops
    if recompute:
        rows.append(("Recompute FLOPs", f"{format_flops(recompute)} (layers run again in "
                     "backward: activation checkpointing; not in the forward count)"))
    if has_backward:
        rows.append(("Backward FLOPs", _split_flops(result.backward_flops, backward_gemm)))
        rows.append(("Total FLOPs", _split_flops(result.total_flops, forward_gemm + backward_gemm)))
    sampled = _sampling_line(result)
    if sampled:
        rows.append(("Backward", sampled))
    compiled = _compiled_line(result)
    if compiled:
        rows.append(("Compiled", compiled))
    vmapped = _vmap_line(result)
    if vmapped:
        rows.append(("Under vmap", vmapped))
    dual = _forward_ad_line(result)
    if dual:
        rows.append(("Forward-mode AD", dual))
    total_time = format_time_ns(result.total_time_ns)
    rows.append(("Total time", f"{total_time} in {_plural(top_calls, 'top-level call')}"))

    memory = _memory_line(result)
    if memory:
        rows.append(("Memory", memory))

    phases = _phases_line(result)
    if phases:
        rows.append(("Step phases", phases))
        bound = input_bound(result.step_phases)
        if bound:
            rows.append(("Bottleneck", bound))
    shares = result.time_by_kind()
    if (shares["backward"] or shares["optimizer"] or shares["data"]) and not phases:
        whole = sum(shares.values()) or 1
        rows.append(("Step shares", ", ".join(
            f"{kind} {100.0 * ns / whole:.1f}% ({format_time_ns(ns)})"
            for kind, ns in shares.items())))

    steps = result.step_times
    if steps.count:
        spread = steps.std_ns / steps.mean_ns if steps.mean_ns else 0.0
        note = ", noisy" if spread > NOISY_SPREAD else ""
        rows.append(("Steps", (
            f"{_plural(steps.count, 'step')}, mean {format_time_ns(steps.mean_ns)}, "
            f"p50 {format_time_ns(steps.quantile(0.5))}, "
            f"p90 {format_time_ns(steps.quantile(0.9))}, "
            f"spread {100.0 * spread:.1f}% (std/mean{note})")))

    if result.unsupported:
        ranked = sorted(result.unsupported.items(), key=lambda kv: (-kv[1], kv[0]))
        named = [f"{name} ({_plural(calls, 'call')})"
                 for name, calls in ranked[:MAX_UNSUPPORTED_LISTED]]
        if len(ranked) > MAX_UNSUPPORTED_LISTED:
            named.append(f"+{len(ranked) - MAX_UNSUPPORTED_LISTED} more")
        rows.append(("Unsupported", ", ".join(named) + "; no FLOP rule and no counted "
                     "operation: unknown FLOPs (marked ? in the table, + above them)"))

    failed = [n for n in nodes if n.errors]
    if failed:
        raised = sum(n.errors for n in failed)
        where = ", ".join(n.path or n.type_name for n in failed[:MAX_UNSUPPORTED_LISTED])
        rows.append(("Errors", f"{_plural(raised, 'call')} raised ({where})"))

    machine, problem = machine_entry(result.meta)
    if problem:  # said here only, so that every view of the profile says it once, alike
        rows.append(("Machine", f"entry set aside, no bottleneck section: {problem}"))

    width = max(len(label) for label, _ in rows) + 2
    lines = [f"{label + ':':<{width}}{value}" for label, value in rows]
    if result.dropped_events > 0:
        lines.append(f"Timeline capped: {format_count(result.dropped_events)} events dropped "
                     "(max_events reached)")
    if machine is not None:
        # Imported here: the analysis imports report modules, which import this one.
        from tracetorch.report.bottleneck import bottleneck_lines

        lines += [""] + bottleneck_lines(result)
    # Unsupported types, the paths that raised and the bottleneck's layers are the user's names.
    return [printable(line) for line in lines]
