"""Argument checks the text reports share: each returns the value it was given, or raises a
:class:`ValueError` that names the argument and what it accepts.

Example:
    >>> check_choice("view", "module", ("type", "module"))
    'module'
    >>> check_positive_int("depth", 0)
    Traceback (most recent call last):
    ...
    ValueError: depth must be None or an integer >= 1; got 0
"""
from __future__ import annotations

from collections.abc import Sequence

__all__ = ("check_choice", "check_percent", "check_positive_int")


def check_choice(arg: str, value: object, allowed: Sequence[str]) -> str:
    """``value`` if it is one of the strings ``allowed``; else a ValueError naming ``arg``.

    Example:
        >>> from tracetorch.report.table import SORT_KEYS
        >>> check_choice("sort_by", "self", SORT_KEYS)
        'self'
    """
    if not isinstance(value, str) or value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{arg} must be one of {choices}; got {value!r}")
    return value


def check_positive_int(arg: str, value: object) -> int | None:
    """``value`` if it is ``None`` or an int >= 1 (not a bool); else a ValueError naming
    ``arg``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{arg} must be None or an integer >= 1; got {value!r}")
    return value


def check_percent(arg: str, value: object) -> float:
    """``value`` as a float if it is a number from 0 to 100; else a ValueError naming ``arg``."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0.0 <= float(value) <= 100.0):
        raise ValueError(f"{arg} must be a number between 0 and 100; got {value!r}")
    return float(value)
