"""Every FLOP formula, one home each: the rule registry and its conventions (:mod:`.registry`),
the costs of ``tracetorch.core``'s tensor operations (:mod:`.core_ops`), the layer rules built on
them (:mod:`.core_rules`) and those for torch (:mod:`.torch_rules`).

Example:
    >>> from tracetorch.flops import FlopCount
    >>> FlopCount(10, gemm=8)
    FlopCount(flops=10, gemm=8, macs=None)
"""
from __future__ import annotations

from tracetorch.flops.registry import (
    NO_RULE,
    FlopCount,
    FlopRegistry,
    FlopRule,
    default_registry,
    flop_rule,
)

__all__ = ("NO_RULE", "FlopCount", "FlopRegistry", "FlopRule", "default_registry", "flop_rule")
