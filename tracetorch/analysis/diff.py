"""Two profiles compared layer by layer: what changed, what is noise, what regressed.

``tracetorch.diff(base, new)`` matches the call nodes of two runs by call path (a path met twice
in one run, as under two thread nodes, is matched by its order of appearance) and gives, per
layer, the change in calls, FLOPs (inclusive, per call and in all), self and total time,
backward time and FLOPs, and bytes moved where memory was measured. Layers found in only one run
are listed apart.

**When a time change counts (the noise rule).** Each run measured every call of a layer, so it
knows the spread of that layer's per-call (inclusive) time: its standard deviation ``std`` over
``n`` calls, hence the standard error of its mean, ``std / sqrt(n)``. A change in the mean time
per call is *flagged* only when it exceeds ``sigmas`` (default 3) standard errors of **both**
runs::

    |mean_new - mean_base| > sigmas * max(std_base / sqrt(n_base), std_new / sqrt(n_new))

A layer called once in a run has no measured spread there (its standard error is 0), so the
other run's decides; two single calls flag any change. FLOPs are counted, not measured: any FLOP
change is real and is never "noise".

**Regressions** (``ProfileDiff.regressions(percent)``, ``tracetorch diff --fail-above 10%``): a
layer present in both runs whose mean time per call grew by more than ``percent`` percent *and*
is flagged, or whose FLOPs per call grew by more than ``percent`` percent. Layers only in the
new run are listed, not counted as regressions (they have no baseline).

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> def run(ns):
    ...     root = CallNode.root(); fc = root.child("fc", "Linear", "m")
    ...     for t in ns: fc.time.add(t)
    ...     return ProfileResult(root)
    >>> d = diff(run([100, 110, 90]), run([200, 210, 190]))
    >>> row = d.layers[0]
    >>> row.path, row.mean_change_percent, row.flagged
    ('fc', 100.0, True)
    >>> [r.path for r in d.regressions(10)]
    ['fc']
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Union

from tracetorch.records.result import ProfileResult
from tracetorch.records.rows import to_rows
from tracetorch.records.views import view
from tracetorch.text.checks import check_choice

__all__ = ("diff", "ProfileDiff", "LayerDiff", "DIFF_SORT_KEYS", "DEFAULT_SIGMAS", "DEFAULT_TOP")

#: Layers the text and notebook views show (the JSON and the HTML page hold every one).
DEFAULT_TOP = 25
#: Standard errors a change in mean time per call must exceed, in both runs, to be flagged.
DEFAULT_SIGMAS = 3.0
#: Accepted ``sort`` values: the largest absolute change first (``"path"``: the base's order).
DIFF_SORT_KEYS: tuple[str, ...] = ("time", "self", "mean", "flops", "calls", "backward", "path")

PathLike = Union[str, "os.PathLike[str]"]
Source = Union[ProfileResult, PathLike]


def _percent(base: float, new: float) -> float:
    """Relative change in percent; 0 when equal, infinite when only the base is 0."""
    if base == new:
        return 0.0
    if base == 0:
        return math.inf if new > 0 else -math.inf
    return 100.0 * (new - base) / base


@dataclass
class LayerDiff:
    """One call path in the two runs. ``base``/``new`` are :func:`~tracetorch.records.rows.to_rows`
    records (``None`` where the layer did not run); the rest is derived from them."""

    path: str
    type_name: str
    base: dict[str, Any] | None
    new: dict[str, Any] | None
    order: int
    noise_ns: float = 0.0
    flagged: bool = False

    @property
    def status(self) -> str:
        """``"both"``, ``"only_base"`` or ``"only_new"``."""
        return "both" if self.base and self.new else "only_base" if self.base else "only_new"

    def change(self, field: str) -> float:
        """``new[field] - base[field]``, a missing side (or field, or ``None``) counting as 0."""
        return self._side(self.new, field) - self._side(self.base, field)

    @staticmethod
    def _side(side: dict[str, Any] | None, field: str) -> float:
        return (side or {}).get(field) or 0

    @property
    def mean_change_ns(self) -> float:
        """Change in mean (inclusive) time per call."""
        return self.change("mean_ns")

    @property
    def mean_change_percent(self) -> float:
        """Change in mean time per call relative to the base, in percent."""
        return _percent(self._side(self.base, "mean_ns"), self._side(self.new, "mean_ns"))

    def _flops_per_call(self, side: dict[str, Any] | None) -> float:
        calls = self._side(side, "calls")
        return self._side(side, "subtree_flops") / calls if calls else 0.0

    @property
    def flops_change_percent(self) -> float:
        """Change in (inclusive) FLOPs per call relative to the base, in percent."""
        return _percent(self._flops_per_call(self.base), self._flops_per_call(self.new))

    def regressed(self, percent: float) -> bool:
        """Whether this layer is a regression beyond ``percent`` (see the module's rule)."""
        if self.status != "both":
            return False
        return ((self.flagged and self.mean_change_percent > percent)
                or self.flops_change_percent > percent)


def _key_rows(result: ProfileResult) -> dict[tuple[str, int], tuple[str, dict[str, Any]]]:
    """Each node's record keyed by (call path, occurrence of that path), with a display path."""
    keyed: dict[tuple[str, int], tuple[str, dict[str, Any]]] = {}
    seen: dict[str, int] = {}
    for row in to_rows(result):
        # The profiled model's own node has the empty path: its type names it in reports.
        path = row["path"] or f"({row['type']})"
        count = seen[path] = seen.get(path, 0) + 1
        keyed[(path, count)] = (path if count == 1 else f"{path}#{count}", row)
    return keyed


def _noise(base: dict[str, Any], new: dict[str, Any], sigmas: float) -> tuple[float, bool]:
    if not base["calls"] or not new["calls"]:
        return 0.0, False
    errors = [side["std_ns"] / math.sqrt(side["calls"]) for side in (base, new)]
    noise = sigmas * max(errors)
    return noise, abs(new["mean_ns"] - base["mean_ns"]) > noise


def _load(source: Source, arg: str) -> tuple[ProfileResult, str]:
    if isinstance(source, ProfileResult):
        return source, arg
    if isinstance(source, (str, os.PathLike)):
        return ProfileResult.load(source), os.fspath(source)
    raise TypeError(f"{arg} must be a ProfileResult or the path of a saved profile; "
                    f"got {type(source).__name__}")


class ProfileDiff:
    """The comparison :func:`diff` returns. ``print()`` it for the text report.

    Attributes:
        base_name, new_name: where the runs came from (a file name, or ``"base"``/``"new"``).
        layers: call paths found in both runs, sorted by ``sort``.
        only_base, only_new: call paths found in one run only, in that run's order.
        sigmas: the noise rule's factor.
        totals: ``{"time_ns": (base, new), "flops": ..., "backward_flops": ...}``.
    """

    def __init__(self, base: ProfileResult, new: ProfileResult, base_name: str = "base",
                 new_name: str = "new", sort: str = "time",
                 sigmas: float = DEFAULT_SIGMAS) -> None:
        if (isinstance(sigmas, bool) or not isinstance(sigmas, (int, float))
                or not sigmas >= 0 or math.isinf(sigmas)):
            raise ValueError(f"sigmas must be a finite number >= 0; got {sigmas!r}")
        self.sort = check_choice("sort", sort, DIFF_SORT_KEYS)
        self.sigmas = float(sigmas)
        self.base_name, self.new_name = base_name, new_name
        a, b = _key_rows(base), _key_rows(new)
        entries: list[LayerDiff] = []
        for order, (key, (path, row)) in enumerate(a.items()):
            other = b.get(key)
            entries.append(LayerDiff(path, row["type"], row, other[1] if other else None, order))
        entries += [LayerDiff(path, row["type"], None, row, len(a) + order)
                    for order, (key, (path, row)) in enumerate(b.items()) if key not in a]
        for entry in entries:
            if entry.base and entry.new:
                entry.noise_ns, entry.flagged = _noise(entry.base, entry.new, self.sigmas)
        self.layers = [e for e in entries if e.status == "both"]
        self.only_base = [e for e in entries if e.status == "only_base"]
        self.only_new = [e for e in entries if e.status == "only_new"]
        self.layers.sort(key=self._sort_key)
        self.totals: dict[str, tuple[int, int]] = {
            "time_ns": (base.total_time_ns, new.total_time_ns),
            "forward_flops": (base.forward_flops, new.forward_flops),
            "backward_flops": (base.backward_flops, new.backward_flops),
            "top_level_calls": (sum(c.calls for c in base.root.children.values()),
                                sum(c.calls for c in new.root.children.values())),
        }

    def _sort_key(self, layer: LayerDiff) -> tuple[float, int]:
        field = {"time": "total_ns", "self": "self_ns", "mean": "mean_ns", "flops":
                 "subtree_flops", "calls": "calls", "backward": "backward_ns"}.get(self.sort)
        return (0.0 if field is None else -abs(layer.change(field)), layer.order)

    def regressions(self, percent: float) -> list[LayerDiff]:
        """Layers that regressed by more than ``percent`` percent: a flagged rise in mean time
        per call, or a rise in FLOPs per call (see :mod:`tracetorch.analysis.diff`).

        Raises:
            ValueError: ``percent`` is not a number >= 0.
        """
        if isinstance(percent, bool) or not isinstance(percent, (int, float)) or not percent >= 0:
            raise ValueError(f"percent must be a number >= 0; got {percent!r}")
        return [layer for layer in self.layers if layer.regressed(float(percent))]

    def table(self, top: int | None = DEFAULT_TOP, width: int | None = None,
              color: bool | None = None) -> str:
        """The text report: totals, the ``top`` largest changes, one-run layers, the rule."""
        return str(view("diff_text")(self, top=top, width=width, color=color))

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: totals, every layer with both runs' numbers and the changes."""
        return dict(view("diff_dict")(self))

    def _repr_html_(self) -> str:
        return str(view("diff_html")(self, top=DEFAULT_TOP))

    def save_json(self, path: PathLike) -> None:
        """Write :meth:`to_dict` as JSON."""
        view("diff_save_json")(self, path)

    def save_html(self, path: PathLike) -> None:
        """Write the comparison as one static HTML page (every layer)."""
        view("diff_save_html")(self, path)


def diff(base: Source, new: Source, sort: str = "time",
         sigmas: float = DEFAULT_SIGMAS) -> ProfileDiff:
    """Compare two profiles (results or saved files) layer by layer; see
    :mod:`tracetorch.analysis.diff`.

    Args:
        base, new: the reference run and the run to check.
        sort: order of the layers, largest absolute change first: ``"time"`` (total time),
            ``"self"``, ``"mean"`` (time per call), ``"flops"``, ``"calls"``, ``"backward"``;
            ``"path"`` keeps the base's call order.
        sigmas: the noise rule's factor (default 3).

    Raises:
        TypeError: ``base`` or ``new`` is neither a result nor a path.
        ValueError: a bad ``sort``/``sigmas``, or a file that is not a tracetorch profile.
        FileNotFoundError: a path that does not exist.

    Example:
        >>> from tracetorch.records.tree import CallNode
        >>> root = CallNode.root(); root.child("fc", "Linear", "m").time.add(100)
        >>> print(diff(ProfileResult(root), ProfileResult(root)).layers[0].mean_change_ns)
        0.0
    """
    a, a_name = _load(base, "base")
    b, b_name = _load(new, "new")
    return ProfileDiff(a, b, a_name, b_name, sort=sort, sigmas=sigmas)
