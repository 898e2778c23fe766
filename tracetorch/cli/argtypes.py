"""Argument types of the command line: parse one option's text, or say what was expected
(a :class:`CliError`, printed as one line).

Example:
    >>> int_at_least(2)("3"), positive_number("0.5")
    (3, 0.5)
"""
from __future__ import annotations

import argparse
import math
from typing import Callable

__all__ = ("CliError", "int_at_least", "positive_number")


class CliError(Exception):
    """A usage error: printed as one line on stderr, exit status 2."""


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` taking an integer of at least ``minimum``.

    Example:
        >>> int_at_least(1)("0")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: must be at least 1, got 0
    """
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def positive_number(text: str) -> float:
    """An argparse ``type`` taking a finite number above 0.

    Example:
        >>> positive_number("inf")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: expected a positive number, got 'inf'
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value
