"""Bottleneck analysis: the machine's roofline, each layer's bound, the step's utilization.

Modules by concern: :mod:`~tracetorch.analysis.machine` (the peaks, :class:`Machine`),
:mod:`~tracetorch.analysis.calibrate` (measuring and caching them, with the kernels of
:mod:`~tracetorch.analysis.kits`),
:mod:`~tracetorch.analysis.roofline` (each layer labelled compute-, memory- or overhead-bound),
:mod:`~tracetorch.analysis.utilization` (MFU, HFU, achieved FLOP/s by phase) and
:mod:`~tracetorch.analysis.bottlenecks` (all of it for one profile).

This package's ``__init__`` imports nothing: ``calibrate`` runs a profile (it imports
:mod:`tracetorch.profiler`, hence :mod:`tracetorch.records.result`), while the reports import the
other modules and must never reach ``tracetorch.records.result`` (see ``tests/test_layering.py``).
"""
from __future__ import annotations

__all__: tuple[str, ...] = ()
