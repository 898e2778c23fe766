"""The phases of a training step: fetching data, forward, backward, optimizer, and the rest.

A step (the time between two ``prof.step()`` marks) is split by what its top-level calls were:
``data`` (batches from a torch ``DataLoader`` iterator, one node per call site), ``backward``
(backward passes), ``optimizer`` (optimizer steps), ``forward`` (every other top-level call:
the model's layers, instrumented functions) and ``other``: the rest of the step, spent outside
every recorded call (data fetched by the user's own code, logging, Python between calls).

A step is **input-bound** when fetching data takes at least half of it: the ``data`` phase, or,
where no ``DataLoader`` was seen, the time outside the model (``other``), which is where a
hand-written loader spends it. The processor then waits for data; the usual cures are more
loader workers, pinned memory and prefetching.

Example:
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root()
    >>> root.child("data", "DataLoader", "d", kind="data").time.add(600)
    >>> root.child("model", "Net", "m").time.add(300)
    >>> steps = StepPhases()
    >>> steps.close_step(root, 1_000)
    >>> {name: stats.total_ns for name, stats in steps.times.items()}
    {'data': 600, 'forward': 300, 'backward': 0, 'optimizer': 0, 'other': 100}
    >>> input_bound(steps.times) is not None
    True
"""
from __future__ import annotations

from tracetorch.records.stats import TimeStats
from tracetorch.records.tree import CallNode

__all__ = ("PHASES", "StepPhases", "phase_of", "top_level_totals", "input_bound",
           "INPUT_BOUND_SHARE")

#: The phases, in the order reports list them.
PHASES = ("data", "forward", "backward", "optimizer", "other")
#: The share of a step spent fetching data from which it is labelled input-bound.
INPUT_BOUND_SHARE = 0.5


def phase_of(node: CallNode) -> str:
    """The phase a top-level call belongs to."""
    return node.kind if node.kind in ("data", "backward", "optimizer") else "forward"


def top_level_totals(root: CallNode) -> dict[str, int]:
    """Time of the top-level calls under ``root`` by phase (``other`` is left at 0: it is what
    a step's duration leaves). An optimizer step that runs the model itself (a closure, as
    Lightning's automatic optimization passes ``step(closure)``) has its forward and backward
    calls counted as forward and backward, and only the rest as optimizer time.

    Example:
        >>> root = CallNode.root()
        >>> step = root.child("SGD.step", "SGD", "o", kind="optimizer"); step.time.add(900)
        >>> step.child("", "Net", "m").time.add(500)
        >>> step.child("backward", "backward", "b", kind="backward").time.add(300)
        >>> top_level_totals(root)
        {'data': 0, 'forward': 500, 'backward': 300, 'optimizer': 100, 'other': 0}
    """
    totals = dict.fromkeys(PHASES, 0)
    for node in root.children.values():
        phase = phase_of(node)
        if phase == "optimizer":
            inside = 0
            for child in node.children.values():
                if phase_of(child) != "optimizer":
                    totals[phase_of(child)] += child.total_ns
                    inside += child.total_ns
            totals[phase] += max(0, node.total_ns - inside)
        else:
            totals[phase] += node.total_ns
    return totals


class StepPhases:
    """Per-step time of each phase: at each step mark, what each phase's top-level calls added
    since the previous mark, and the rest of the step as ``other``."""

    def __init__(self) -> None:
        self.times: dict[str, TimeStats] = {phase: TimeStats() for phase in PHASES}
        self._last = dict.fromkeys(PHASES, 0)

    def close_step(self, root: CallNode, step_ns: int) -> None:
        """A step of ``step_ns`` ended; ``root`` holds every call recorded so far."""
        totals = top_level_totals(root)
        inside = 0
        for phase in PHASES[:-1]:
            spent = max(0, totals[phase] - self._last[phase])
            self.times[phase].add(spent)
            inside += spent
        self.times["other"].add(max(0, step_ns - inside))
        self._last = totals

    def skip_step(self, root: CallNode) -> None:
        """A step that is not counted (a schedule's wait or warm-up) ended."""
        self._last = top_level_totals(root)


def input_bound(times: dict[str, TimeStats]) -> str | None:
    """Why the steps are input-bound (``None`` when they are not); see the module docstring."""
    whole = sum(stats.total_ns for stats in times.values())
    if not whole:
        return None
    data, other = times["data"].total_ns, times["other"].total_ns
    if data:
        share, where = data / whole, "in the DataLoader"
    else:
        share, where = other / whole, "outside the model (no DataLoader seen: its own loading?)"
    if share < INPUT_BOUND_SHARE:
        return None
    return (f"input-bound: {100.0 * share:.0f}% of the step is spent fetching data {where}; "
            "the processor waits for data (try more loader workers, pinned memory, prefetching)")
