"""What a profile holds once recorded: the call tree, its totals and its aggregated views.

:class:`ProfileResult` is what ``with tracetorch.profile() as prof`` yields (``profile`` extends
it) and what :func:`tracetorch.load` returns, so a saved run answers the same questions as a
live one.

The result is data. It imports no renderer and no analysis: :meth:`export` and the convenience
methods (:meth:`table`, :meth:`save_html`, :meth:`analyze`...) are one-line calls through
:mod:`tracetorch.records.views`, where the report and analysis packages register what they
make. Reports only read a result (``ProfileResult`` is a name in their annotations); the JSON
reader returns the parts of a saved profile, which :meth:`ProfileResult.from_dict` and
:meth:`ProfileResult.load` assemble here.

Example:
    >>> from tracetorch.records.tree import CallNode, Completeness
    >>> result = ProfileResult(CallNode.root())
    >>> result.total_flops, result.unsupported
    (0, {})
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tracetorch.records import jsonio, jsonread, rows
from tracetorch.records.phases import PHASES, top_level_totals
from tracetorch.records.stats import TimeStats
from tracetorch.records.tree import NOT_FORWARD_KINDS, CallNode, Completeness, TimelineEvent
from tracetorch.records.views import exporter, view

if TYPE_CHECKING:  # the analyses and their machine are a layer above: annotations only
    from tracetorch.analysis.bottlenecks import Analysis
    from tracetorch.analysis.machine import Machine
    from tracetorch.analysis.roofline import LayerBound

__all__ = ("ProfileResult", "AggregateRow", "TimelineEvent", "EXACT_STEPS")

#: Step durations kept exactly (for interpolated p50/p90) before a sketch takes over.
EXACT_STEPS = 10_000


@dataclass
class AggregateRow:
    """One row of :meth:`ProfileResult.by_type` or :meth:`ProfileResult.by_module`.

    ``paths`` lists every call site folded into the row; ``time`` merges their per-call timings.
    """

    key: str
    type_name: str
    paths: list[str] = field(default_factory=list)
    calls: int = 0
    flops: int = 0
    gemm_flops: int = 0
    macs: int | None = None
    self_ns: int = 0
    params: int = 0
    backward_flops: int = 0
    backward_ns: int = 0
    time: TimeStats = field(default_factory=TimeStats)

    @property
    def total_ns(self) -> int:
        """Inclusive time summed over the folded call sites."""
        return self.time.total_ns


class ProfileResult:
    """A recorded (or loaded) profile.

    Attributes:
        root: the tree; its children are the top-level calls.
        unsupported: layer types with no FLOP rule and no countable operations, with call counts.
        timeline: per-call events when recorded with ``timeline=True`` (else ``None``).
        dropped_events: calls left out of the timeline because ``max_events`` was reached.
        step_times: :class:`TimeStats` of the steps marked with ``step()``.
        step_phases: per-step :class:`TimeStats` of each phase of those steps.
        meta: free-form facts about the run (tracetorch version, clock, date).
    """

    def __init__(self, root: CallNode, unsupported: dict[str, int] | None = None,
                 timeline: list[TimelineEvent] | None = None, dropped_events: int = 0,
                 step_times: TimeStats | None = None,
                 meta: dict[str, Any] | None = None,
                 step_phases: dict[str, TimeStats] | None = None,
                 backward_timeline: list[TimelineEvent] | None = None) -> None:
        self.root = root
        self.unsupported: dict[str, int] = dict(unsupported or {})
        self.timeline = timeline
        self.dropped_events = dropped_events
        self.step_times = step_times if step_times is not None else TimeStats(EXACT_STEPS)
        self.meta: dict[str, Any] = dict(meta or {})
        #: Per-step time of each phase (data, forward, backward, optimizer, other), one sample
        #: per step marked with ``step()``; see :mod:`tracetorch.records.phases`.
        self.step_phases: dict[str, TimeStats] = dict(step_phases or {})
        #: With ``timeline=True``, the spans of each layer's backward work (events naming the
        #: layer's node), for the Chrome trace.
        self.backward_timeline = backward_timeline

    # ---------------------------------------------------------------- totals
    def nodes(self) -> list[CallNode]:
        """Every node but the root, depth first in call order."""
        return [n for n in self.root.walk() if n is not self.root]

    def find(self, path: str) -> CallNode:
        """The node at a dotted call path, e.g. ``prof.find("layers.0")``."""
        return self.root.find(path)

    def _forward_nodes(self) -> list[CallNode]:
        # A backward node's FLOPs summarise its passes, whose work the layers already hold.
        return [n for n in self.root.walk() if n.kind not in NOT_FORWARD_KINDS]

    @property
    def forward_flops(self) -> int:
        """FLOPs of every forward call (each node's own share, so nothing counts twice)."""
        return sum(n.flops for n in self._forward_nodes())

    @property
    def recompute_flops(self) -> int:
        """FLOPs of layers run again inside backward passes (activation checkpointing's
        recomputation): hardware work that :attr:`forward_flops`, the model's, leaves out."""
        return sum(n.flops for n in self.root.walk() if n.kind == "recompute")

    @property
    def completeness(self) -> Completeness:
        """How complete :attr:`forward_flops` is: ``"complete"``; ``"partial"`` (a lower bound:
        the layer types in :attr:`unsupported` ran with unknown FLOPs); ``"unknown"`` when every
        layer that ran is one of those."""
        forward = [n for n in self._forward_nodes()
                   if n.kind in ("module", "function", "optimizer")]
        unknown = [n for n in forward if n.flops_unknown]
        if not unknown:
            return "complete"
        return "unknown" if len(unknown) == len(forward) else "partial"

    @property
    def backward_flops(self) -> int:
        """FLOPs of gradient computation recorded inside the profile (with
        ``profile(backward_every=K)``: the sampled steps' scaled to all steps)."""
        return self._all_steps(self.root.subtree_sum("backward_flops"))

    @property
    def backward_sampling(self) -> tuple[int, int, int] | None:
        """``(every, steps, sampled_steps)`` of ``profile(backward_every=K)``, read from
        ``meta["backward_sampling"]``; ``None`` for an exact profile (or a saved entry that says
        nothing usable)."""
        sampling = self.meta.get("backward_sampling")
        if not isinstance(sampling, dict):
            return None
        every, steps, taken = (sampling.get(key) for key in ("every", "steps", "sampled_steps"))
        if type(every) is int and type(steps) is int and type(taken) is int and 0 < taken <= steps:
            return every, steps, taken
        return None

    def _all_steps(self, sampled: int) -> int:
        # A backward total measured on the sampled steps, estimated for every step recorded.
        sampling = self.backward_sampling
        return sampled if sampling is None else sampled * sampling[1] // sampling[2]

    @property
    def total_flops(self) -> int:
        """Forward plus backward FLOPs."""
        return self.forward_flops + self.backward_flops

    @property
    def forward_gemm_flops(self) -> int:
        """Matmul and convolution FLOPs of the forward calls."""
        return sum(n.gemm_flops for n in self._forward_nodes())

    @property
    def backward_gemm_flops(self) -> int:
        """Matmul and convolution FLOPs of the gradient computation (scaled as
        :attr:`backward_flops`)."""
        return self._all_steps(self.root.subtree_sum("backward_gemm_flops"))

    @property
    def gemm_flops(self) -> int:
        """Matmul and convolution FLOPs, forward and backward (compare with FlopCounterMode)."""
        return self.forward_gemm_flops + self.backward_gemm_flops

    @property
    def other_flops(self) -> int:
        """Everything but matmul/convolution (elementwise, norms, pooling...)."""
        return self.total_flops - self.gemm_flops

    @property
    def saved_bytes(self) -> int:
        """Bytes saved for backward by the recorded forward calls (activations autograd kept;
        each storage once, see :mod:`tracetorch.records.memory`)."""
        return sum(n.memory.saved_bytes for n in self._forward_nodes())

    @property
    def peak_bytes(self) -> int:
        """The highest device memory allocated seen at a layer call (CUDA; 0 elsewhere)."""
        return max((n.memory.device_peak_bytes for n in self.root.walk()), default=0)

    @property
    def total_time_ns(self) -> int:
        """Time spent in top-level calls, in nanoseconds."""
        return sum(c.total_ns for c in self.root.children.values())

    @property
    def total_time(self) -> float:
        """Time spent in top-level calls, in seconds."""
        return self.total_time_ns / 1e9

    def time_by_kind(self) -> dict[str, int]:
        """Top-level time split into ``data`` (batches from a torch ``DataLoader``), ``forward``
        (layers and instrumented functions), ``backward`` and ``optimizer``, in nanoseconds:
        the shares of a training loop (per step, with the rest of each step, in
        :attr:`step_phases`)."""
        totals = top_level_totals(self.root)
        return {phase: totals[phase] for phase in PHASES if phase != "other"}

    # ---------------------------------------------------------------- reports
    def table(self, sort_by: str = "total", depth: int | None = None,
              row_limit: int | None = None, min_percent: float = 0.0,
              columns: str | list[str] | None = None, width: int | None = None,
              color: bool | None = None) -> str:
        """The call tree as text: calls, FLOPs, MACs, self/total time, % of time, GFLOP/s.

        ``sort_by`` is one of ``total``, ``self``, ``flops``, ``calls``, ``name``,
        ``call_order`` (siblings are sorted, children stay under their parents). The table fits
        ``width`` (default: the terminal's, else ``COLUMNS``, else 120) by leaving out the least
        important columns; ``columns=["calls", "total", ...]`` or ``"all"`` chooses them
        (names in :func:`tracetorch.report.table.render_table`); ``color`` defaults to a
        terminal without ``NO_COLOR``.
        """
        return str(view("table")(self, sort_by=sort_by, depth=depth, row_limit=row_limit,
                                 min_percent=min_percent, columns=columns, width=width,
                                 color=color))

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        # Jupyter's rich display: the summary and top rows as a small HTML table (print stays text).
        return str(view("notebook")(self))

    def export(self, format: str, path: jsonio.PathLike, **options: Any) -> None:
        """Write the profile to ``path`` in ``format``: ``"json"`` (reload with
        :func:`tracetorch.load`), ``"chrome"`` (Chrome/Perfetto timeline), ``"speedscope"``,
        ``"csv"``, ``"html"``, ``"text"`` (the table), or any format registered with
        :func:`tracetorch.records.views.register_exporter`. ``options`` go to the writer
        (``title=`` for HTML, ``table()``'s arguments for text).

        Raises:
            ValueError: an unknown ``format`` (the message lists the known ones).

        Example:
            >>> import os, tempfile
            >>> from tracetorch.records.tree import CallNode
            >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(1_000)
            >>> path = os.path.join(tempfile.mkdtemp(), "run.csv")
            >>> ProfileResult(root).export("csv", path)
            >>> open(path).readline().startswith("path,name,type")
            True
        """
        exporter(format)(self, path, **options)

    def to_dict(self) -> dict[str, Any]:
        """A versioned, JSON-ready form that :meth:`from_dict` and :func:`tracetorch.load`
        read back."""
        return jsonio.result_to_dict(self)

    def save(self, path: jsonio.PathLike) -> None:
        """Write the profile as versioned JSON (reload with :func:`tracetorch.load`)."""
        self.export("json", path)

    def export_chrome_trace(self, path: jsonio.PathLike) -> None:
        """Write the per-call timeline (``profile(timeline=True)``) as Chrome/Perfetto JSON."""
        self.export("chrome", path)

    def export_speedscope(self, path: jsonio.PathLike) -> None:
        """Write the tree for https://www.speedscope.app: a flame graph weighted by self time
        (ns) and one by FLOPs; see :mod:`tracetorch.report.speedscope`."""
        self.export("speedscope", path)

    def to_rows(self) -> list[dict[str, Any]]:
        """One dict per node: path, type, depth, calls, FLOPs, times and their statistics,
        backward, params, shapes (and memory when measured); see :mod:`tracetorch.records.rows`.
        """
        return rows.to_rows(self)

    def to_csv(self, path: jsonio.PathLike) -> None:
        """Write :meth:`to_rows` as CSV, one header line then a line per node."""
        self.export("csv", path)

    def to_dataframe(self) -> Any:
        """:meth:`to_rows` as a ``pandas.DataFrame`` (pandas is imported here, only here).

        Raises:
            ImportError: pandas is not installed; the message says ``pip install pandas``.
        """
        return rows.to_dataframe(self)

    def save_html(self, path: jsonio.PathLike, title: str | None = None) -> None:
        """Write the interactive report (icicle, sortable table, summary) as one offline HTML
        file; see :mod:`tracetorch.report.html`."""
        self.export("html", path, title=title)

    # ------------------------------------------------------------- bottlenecks
    @property
    def machine(self) -> Machine | None:
        """The peaks this profile is measured against (``profile(machine=...)``, kept in
        ``meta["machine"]`` and in saved files), else ``None``: also for an entry that does not
        parse, which every report names in its ``Machine:`` line instead of raising (see
        :func:`tracetorch.analysis.machine.machine_entry`)."""
        machine: Machine | None = view("machine")(self.meta)
        return machine

    def analyze(self, machine: Machine | str | None = None, top: int | None = None) -> Analysis:
        """Each layer labelled compute-, memory- or overhead-bound against ``machine`` (default:
        the profile's own; ``"calibrate"``: this machine's cached or measured peaks for the
        framework, device, dtype and threads the profile ran with), the ``top`` layers to look
        at first (default :data:`tracetorch.analysis.roofline.LOOK_FIRST`), MFU/HFU; ``print()``
        it for the report.

        Raises:
            ValueError: no machine given and the profile has none (or a damaged one).
        """
        analysis: Analysis = view("analyze")(self, machine, top)
        return analysis

    def bottlenecks(self, machine: Machine | str | None = None,
                    top: int | None = None) -> list[LayerBound]:
        """The ``top`` layers with the most time above their roofline ceiling, largest first
        ("Where to look first"; see :meth:`analyze`)."""
        return list(self.analyze(machine, top).look_first)

    def bottleneck_report(self, machine: Machine | str | None = None) -> str:
        """The bottleneck report as text: the peaks used, the roofline table, where to look
        first and utilization (see :meth:`analyze`)."""
        return str(self.analyze(machine))

    # ------------------------------------------------------------- rebuilding
    # Static rather than class methods: ``profile`` extends this class with another constructor,
    # and what a saved profile rebuilds is a result, not a profiler.
    @staticmethod
    def from_dict(data: Any, source: str = "<dict>") -> ProfileResult:
        """The result :meth:`to_dict` described; the inverse of :meth:`to_dict`.

        Raises:
            ValueError: ``data`` is not a tracetorch profile, is from a newer version, or has a
                missing or mistyped field; the message starts with ``source`` and names the
                JSON location of the problem.

        Example:
            >>> from tracetorch.records.tree import CallNode
            >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(1_000)
            >>> again = ProfileResult.from_dict(ProfileResult(root).to_dict())
            >>> again.find("fc").calls, again.total_time_ns
            (1, 1000)
        """
        return ProfileResult(**jsonread.parse_profile(data, source=source)._asdict())

    @staticmethod
    def load(path: jsonio.PathLike) -> ProfileResult:
        """Read a profile written by :meth:`save` (what :func:`tracetorch.load` does).

        Raises:
            FileNotFoundError: ``path`` does not exist.
            ValueError: the file is not a tracetorch profile, is from a newer version, or is
                damaged; the message names the file and the problem.
        """
        return ProfileResult(**jsonread.read_profile(path)._asdict())

    # ---------------------------------------------------------------- views
    def by_type(self) -> dict[str, AggregateRow]:
        """One row per layer type, every call site and instance folded in."""
        return self._aggregate(lambda n: n.type_name)

    def by_module(self) -> dict[str, AggregateRow]:
        """One row per module instance; a module called from three parents is one row.

        Rows are keyed by the module's first call path.
        """
        rows = self._aggregate(lambda n: n.module_key)
        return {row.paths[0]: row for row in rows.values()}

    def _aggregate(self, key_of: Any) -> dict[str, AggregateRow]:
        rows: dict[str, AggregateRow] = {}
        for node in self.nodes():
            key = key_of(node)
            row = rows.get(key)
            if row is None:
                row = rows[key] = AggregateRow(key=key, type_name=node.type_name)
            row.paths.append(node.path)
            row.calls += node.calls
            row.flops += node.flops
            row.gemm_flops += node.gemm_flops
            if node.macs is not None:
                row.macs = (row.macs or 0) + node.macs
            row.self_ns += node.self_ns
            # A module reached through several call sites is still one set of parameters.
            row.params = max(row.params, node.params)
            row.backward_flops += node.backward_flops
            row.backward_ns += node.backward_time.total_ns
            row.time.merge(node.time)
        return rows
