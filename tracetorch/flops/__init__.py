"""FLOP rules: the registry and its conventions (see :mod:`tracetorch.flops.registry`)."""
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
