"""How much of the machine's peak a profile used: MFU, HFU and achieved FLOP/s by phase.

The formulas (as PaLM's appendix B and the field's loggers define them, with FLOPs measured per
layer rather than estimated from a parameter count):

- **model FLOPs** = forward + backward FLOPs the profile counted (optimizer steps left out, as
  every MFU convention leaves them out);
- **MFU** (model FLOPs utilization) = model FLOPs / time / peak FLOP/s;
- **HFU** (hardware FLOPs utilization) = (model FLOPs + recomputed FLOPs) / time / peak: the
  work activation checkpointing runs again inside backward is real work, but not the model's;
  shown only when something was recomputed.

The time is the steps' (``prof.step()``: the whole loop body, data loading included) when steps
were marked, else the top-level calls' time. Per step, each step is taken to do the profile's
mean FLOPs per step, so a step's MFU is ``(model FLOPs / steps) / step time / peak``, at the
median, fastest and slowest step. Achieved FLOP/s per phase divide each phase's FLOPs by its
time (:meth:`~tracetorch.records.result.ProfileResult.time_by_kind`).

Example:
    >>> from tracetorch.analysis.machine import Machine
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root(); fc = root.child("fc", "Linear", "m0")
    >>> fc.time.add(1_000_000); fc.flops = 500_000_000          # 0.5 GFLOPs in 1 ms
    >>> use = utilization(ProfileResult(root), Machine(1e12, 1e11))
    >>> f"{use.mfu:.1%}", use.hfu                                 # 0.5 TFLOP/s of 1 TFLOP/s
    ('50.0%', None)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tracetorch.analysis.machine import Machine
from tracetorch.records.tree import CallNode

if TYPE_CHECKING:  # reports read results, a result never imports a report
    from tracetorch.records.result import ProfileResult

__all__ = ("Utilization", "PhaseRate", "utilization", "PHASES")

#: The phases of a step whose FLOP/s are shown apart (as ``time_by_kind`` splits the time).
PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class PhaseRate:
    """One phase's FLOPs and time; :attr:`flops_per_s` is ``None`` when it took no time."""

    phase: str
    flops: int
    time_ns: int

    @property
    def flops_per_s(self) -> float | None:
        """Achieved FLOP/s of the phase."""
        return self.flops * 1e9 / self.time_ns if self.time_ns > 0 else None


@dataclass(frozen=True)
class Utilization:
    """The profile's use of ``peak_flops`` (see the module docstring for the formulas).

    Attributes:
        model_flops: forward + backward FLOPs; ``recompute_flops``: run again in backward.
        time_ns: what MFU divides by; ``time_source`` says which time it is.
        steps: steps marked (0: none); ``step_ns``: the median, fastest and slowest step.
        phases: forward, backward and optimizer FLOPs and time.
    """

    peak_flops: float
    model_flops: int
    recompute_flops: int
    time_ns: int
    time_source: str
    steps: int = 0
    step_ns: dict[str, float] = field(default_factory=dict)
    phases: tuple[PhaseRate, ...] = ()

    def _of(self, flops: float, ns: float) -> float | None:
        return flops * 1e9 / ns / self.peak_flops if ns > 0 else None

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization of the whole profile (``None`` without time)."""
        return self._of(self.model_flops, self.time_ns)

    @property
    def hfu(self) -> float | None:
        """Hardware FLOPs utilization, counting recomputed FLOPs; ``None`` when nothing was
        recomputed (it would equal MFU) or without time."""
        if not self.recompute_flops:
            return None
        return self._of(self.model_flops + self.recompute_flops, self.time_ns)

    def step_mfu(self, which: str = "median") -> float | None:
        """MFU of one step: ``"median"``, ``"fastest"`` or ``"slowest"`` (``None`` without
        steps)."""
        if which not in self.step_ns:
            if self.steps:
                raise ValueError(f"which: expected one of {sorted(self.step_ns)}, got {which!r}")
            return None
        return self._of(self.model_flops / self.steps, self.step_ns[which])


def _optimizer_flops(root: CallNode) -> int:
    # Optimizer nodes hold the counted FLOPs of their step (their own and below them).
    return sum(node.subtree_flops for node in root.walk() if node.kind == "optimizer")


def utilization(result: ProfileResult, machine: Machine) -> Utilization:
    """MFU, HFU and FLOP/s by phase of ``result`` against ``machine.peak_flops``.

    Example:
        >>> from tracetorch.analysis.machine import Machine
        >>> from tracetorch.records.result import ProfileResult
        >>> from tracetorch.records.tree import CallNode
        >>> utilization(ProfileResult(CallNode.root()), Machine(1e12, 1e11)).mfu is None
        True
    """
    optimizer = _optimizer_flops(result.root)
    forward = result.forward_flops - optimizer
    backward = result.backward_flops
    steps = result.step_times
    if steps.count:
        time_ns, source = steps.total_ns, f"{steps.count} steps"
        step_ns = {"median": steps.quantile(0.5), "fastest": float(steps.min_ns),
                   "slowest": float(steps.max_ns)}
    else:
        time_ns, source, step_ns = result.total_time_ns, "top-level calls", {}
    shares = result.time_by_kind()
    flops = {"forward": forward, "backward": backward, "optimizer": optimizer}
    return Utilization(
        peak_flops=machine.peak_flops, model_flops=forward + backward,
        recompute_flops=result.recompute_flops, time_ns=time_ns, time_source=source,
        steps=steps.count, step_ns=step_ns,
        phases=tuple(PhaseRate(p, flops[p], shares[p]) for p in PHASES))
