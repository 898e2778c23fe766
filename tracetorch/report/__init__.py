"""Reports of a profile, one module per format, each a function over a result.

Text: :mod:`~tracetorch.report.table` (the call tree), :mod:`~tracetorch.report.flat_table` (flat
views), :mod:`~tracetorch.report.summary`, :mod:`~tracetorch.report.ops` (operator tables),
:mod:`~tracetorch.report.bottleneck` (the roofline report), :mod:`~tracetorch.report.ranks`
(distributed jobs), :mod:`~tracetorch.report.diff_report` (two runs). Files:
:mod:`~tracetorch.report.chrome` and :mod:`~tracetorch.report.ranks_trace` (Chrome/Perfetto),
:mod:`~tracetorch.report.speedscope`, :mod:`~tracetorch.report.html`,
:mod:`~tracetorch.report.csv`, :mod:`~tracetorch.report.notebook` (Jupyter), and the saved JSON
(:mod:`tracetorch.records.jsonio`, data rather than a view).

Reports read a result and never construct one: ``ProfileResult`` appears in their annotations
only. This package registers its formats and views with :mod:`tracetorch.records.views`, each
with a loader, so ``import tracetorch`` loads no renderer and ``result.export("html", path)``
loads only the HTML one.

Example:
    >>> from tracetorch.records.views import exporter
    >>> exporter("speedscope").__name__
    'export_speedscope'
"""
from __future__ import annotations

from importlib import import_module
from typing import Any, Callable

from tracetorch.records.views import register_exporter, register_view

__all__: tuple[str, ...] = ()


def _function(module: str, name: str) -> Callable[[], Callable[..., Any]]:
    # Resolved when first used: the renderer's module loads then, not with the package.
    return lambda: getattr(import_module(f"tracetorch.report.{module}"), name)


# The formats, by the name prof.export() takes: the versioned profile (tracetorch.load reads it),
# the per-call timeline for Perfetto, flame graphs for speedscope.app, one row per node, the
# interactive offline page, the call-tree table.
register_exporter("json", lambda: import_module("tracetorch.records.jsonio").save_result)
register_exporter("chrome", _function("chrome", "export_chrome_trace"))
register_exporter("speedscope", _function("speedscope", "export_speedscope"))
register_exporter("csv", _function("csv", "write_csv"))
register_exporter("html", _function("html", "save_html"))
register_exporter("text", _function("table", "save_table"))

register_view("table", _function("table", "render_table"))
register_view("notebook", _function("notebook", "render_notebook"))
register_view("bottleneck_report", _function("bottleneck", "render_analysis"))
register_view("diff_text", _function("diff_report", "render_diff_text"))
register_view("diff_dict", _function("diff_report", "diff_to_dict"))
register_view("diff_html", _function("diff_report", "render_diff_html"))
register_view("diff_save_json", _function("diff_report", "save_diff_json"))
register_view("diff_save_html", _function("diff_report", "save_diff_html"))
