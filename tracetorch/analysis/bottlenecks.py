"""One profile's bottleneck analysis: every labelled layer, where to look first, utilization.

:func:`analyze` is what ``prof.analyze(machine)`` returns; printing it gives the bottleneck
report (:mod:`tracetorch.report.bottleneck`), which always starts with the peaks it used.

Example:
    >>> from tracetorch.analysis.machine import Machine
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> found = analyze(ProfileResult(CallNode.root()), Machine(1e12, 1e11))
    >>> found.layers, found.look_first
    ((), ())
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tracetorch.analysis.machine import Machine, machine_entry
from tracetorch.analysis.roofline import (
    LOOK_FIRST,
    Bound,
    ContainerSummary,
    LayerBound,
    container_summaries,
    labelled_nodes,
    time_by_bound,
    unlabelled_reasons,
    where_to_look_first,
)
from tracetorch.analysis.utilization import Utilization, utilization
from tracetorch.records.views import view

if TYPE_CHECKING:  # reports read results, a result never imports a report
    from tracetorch.records.result import ProfileResult

__all__ = ("Analysis", "analyze", "analyze_profile")


@dataclass(frozen=True)
class Analysis:
    """The bottleneck analysis of one profile against one machine.

    Attributes:
        machine: the peaks used (printed first by every report).
        layers: each labelled layer's evidence, in call order.
        look_first: the layers with the most time above their ceiling, largest first.
        containers: the unlabelled containers, with their labelled layers' time by bound.
        utilization: MFU, HFU and the phases' FLOP/s.
        total_ns: the profile's time (top-level calls), for shares.
        unlabelled: layer calls that got no label, by reason.
    """

    machine: Machine
    layers: tuple[LayerBound, ...]
    look_first: tuple[LayerBound, ...]
    containers: tuple[ContainerSummary, ...]
    utilization: Utilization
    total_ns: int
    unlabelled: dict[str, int]

    @property
    def time_by_bound(self) -> dict[Bound, int]:
        """Time of the outermost labelled layers, by bound."""
        return time_by_bound(list(self.layers))

    def find(self, path: str) -> LayerBound:
        """The labelled layer at ``path``.

        Raises:
            KeyError: no labelled layer has that path.
        """
        for layer in self.layers:
            if layer.path == path:
                return layer
        raise KeyError(f"no labelled layer at {path!r} (labelled: "
                       f"{', '.join(repr(b.path) for b in self.layers) or 'none'})")

    def __str__(self) -> str:
        return str(view("bottleneck_report")(self))  # the report layer renders analyses


def analyze(result: ProfileResult, machine: Machine, top: int = LOOK_FIRST) -> Analysis:
    """Label ``result``'s layers against ``machine`` and measure its utilization.

    Raises:
        TypeError: ``machine`` is not a :class:`Machine`.
        ValueError: ``top`` is not a positive int.
    """
    if not isinstance(machine, Machine):
        raise TypeError(f"machine: expected a tracetorch.Machine, got {machine!r}")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top: expected a positive int, got {top!r}")
    labelled = labelled_nodes(result.root, machine)
    bounds = [bound for _, bound in labelled]
    return Analysis(
        machine=machine, layers=tuple(bounds), look_first=tuple(where_to_look_first(bounds, top)),
        containers=tuple(container_summaries(result.root, labelled)),
        utilization=utilization(result, machine), total_ns=result.total_time_ns,
        unlabelled=unlabelled_reasons(result.root))


def analyze_profile(result: ProfileResult, machine: Machine | str | None = None,
                    top: int | None = None) -> Analysis:
    """:func:`analyze` against ``machine``, or the profile's own when ``None`` (what
    ``ProfileResult.analyze`` does); ``"calibrate"`` is resolved by the calibration, which
    registers itself as the view ``"resolve_machine"`` (it runs a profile, a layer above).

    Raises:
        ValueError: no machine given and the profile has none (or a damaged one).
    """
    if machine is not None:
        peaks, problem = view("resolve_machine")(machine, meta=result.meta), ""
    else:
        peaks, problem = machine_entry(result.meta)
    if peaks is None:
        have = f"its machine entry is set aside ({problem})" if problem else \
            "this profile has no machine"
        raise ValueError(f"machine: {have}; pass machine=tracetorch.calibrate(...), a "
                         "tracetorch.Machine(...) or 'calibrate'")
    return analyze(result, peaks, LOOK_FIRST if top is None else top)
