"""Reports of a profile: text tables, versioned JSON and Chrome/Perfetto traces.

One module per format: :mod:`~tracetorch.text.units` (number humanizers every renderer uses),
:mod:`~tracetorch.report.table` (the call tree as text), :mod:`~tracetorch.report.flat_table`
(the flat views), :mod:`~tracetorch.records.jsonio` (save), :mod:`~tracetorch.records.jsonread`
(load), :mod:`~tracetorch.report.chrome` (trace export). ``ProfileResult`` methods (``table()``,
``to_dict()``, ``save()``, ``export_chrome_trace()``, ``from_dict()``, ``load()``) and
``tracetorch.load`` call these functions.

The dependency goes one way: :mod:`tracetorch.records.result` imports this package, and no module
here imports :mod:`tracetorch.records.result` at run time (it appears only in annotations, under
``TYPE_CHECKING``). Renderers only read a result; reading a saved file yields its parts
(:class:`~tracetorch.records.jsonread.SavedProfile`), which ``ProfileResult`` assembles.

Example:
    >>> from tracetorch.records.result import ProfileResult
    >>> from tracetorch.records.tree import CallNode
    >>> root = CallNode.root(); root.child("fc", "Linear", "m0").time.add(1_500)
    >>> "fc (Linear)" in render_table(ProfileResult(root))
    True
"""
from __future__ import annotations

from tracetorch.records.jsonio import FORMAT_NAME, FORMAT_VERSION, result_to_dict, save_result
from tracetorch.records.jsonread import SavedProfile, parse_profile, read_profile
from tracetorch.report.chrome import chrome_trace_events, export_chrome_trace
from tracetorch.report.flat_table import render_flat
from tracetorch.report.summary import summary_lines
from tracetorch.report.table import render_table
from tracetorch.text.units import (
    format_count,
    format_flops,
    format_macs,
    format_percent,
    format_rate,
    format_shape,
    format_time_ns,
)

__all__ = (
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SavedProfile",
    "chrome_trace_events",
    "export_chrome_trace",
    "format_count",
    "format_flops",
    "format_macs",
    "format_percent",
    "format_rate",
    "format_shape",
    "format_time_ns",
    "parse_profile",
    "read_profile",
    "render_flat",
    "render_table",
    "result_to_dict",
    "save_result",
    "summary_lines",
)
