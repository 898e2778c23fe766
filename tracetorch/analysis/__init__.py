"""Bottleneck analysis: the machine's roofline, each layer's bound, the step's utilization.

Modules by concern: :mod:`~tracetorch.analysis.machine` (the peaks, :class:`Machine`),
:mod:`~tracetorch.analysis.machine_cache` (this machine's facts and the calibrations cached for
them; measuring is :mod:`tracetorch.tools.calibrate`),
:mod:`~tracetorch.analysis.roofline` (each layer labelled compute-, memory- or overhead-bound),
:mod:`~tracetorch.analysis.utilization` (MFU, HFU, achieved FLOP/s by phase) and
:mod:`~tracetorch.analysis.bottlenecks` (all of it for one profile).

The package registers its views with :mod:`tracetorch.records.views` (a result's machine, its
analysis), so ``ProfileResult`` reaches them without importing a layer above its own.
"""
from __future__ import annotations

from importlib import import_module

from tracetorch.records.views import register_view

__all__: tuple[str, ...] = ()

register_view("machine", lambda: lambda meta: import_module(
    "tracetorch.analysis.machine").machine_entry(meta)[0])
register_view("analyze", lambda: import_module("tracetorch.analysis.bottlenecks").analyze_profile)
