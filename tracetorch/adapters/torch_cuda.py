"""Device timing for CUDA (placeholder while the CPU path is built)."""
from __future__ import annotations

from typing import Any, Optional

__all__ = ("backward_timer_factory",)


def backward_timer_factory() -> Optional[Any]:
    """No device timer yet."""
    return None
