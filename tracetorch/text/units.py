"""Humanizers shared by every renderer: counts, FLOPs, MACs, times, rates, shapes and names.

Every number a report prints goes through this module, so units are decided once:

* counts use SI suffixes ``K M G T P E`` (powers of 1000) with three significant figures;
  integers below 1000 print exactly;
* FLOPs and MACs carry their unit on every number (``"3.63 GFLOPs"``, ``"1.81 GMACs"``), never a
  bare "flops": one multiply-add is 1 MAC and 2 FLOPs;
* times are integer nanoseconds inside tracetorch and print as ``ns``, ``us``, ``ms`` or ``s``.
  Microseconds are spelled ``us`` (as ``torch.utils.benchmark`` does) so that a report can be
  printed to any console or log file, whatever its encoding;
* names (module paths, class names, file names) go through :func:`printable` before any text
  output shows them, so no name can drive a terminal or reorder the text around it.

Example:
    >>> format_flops(3_630_000_000), format_time_ns(12_345), format_count(999)
    ('3.63 GFLOPs', '12.3 us', '999')
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

__all__ = (
    "COUNT_PREFIXES",
    "TIME_UNITS",
    "MISSING",
    "format_count",
    "format_flops",
    "format_macs",
    "format_time_ns",
    "format_rate",
    "format_per_second",
    "format_percent",
    "format_shape",
    "format_bytes",
    "format_intensity",
    "round_half_up",
    "BYTE_UNITS",
    "printable",
)

#: SI prefixes for counts, one per factor of 1000 (K, not k, as FLOP counters conventionally print).
COUNT_PREFIXES: tuple[str, ...] = ("", "K", "M", "G", "T", "P", "E")
#: Time units, one per factor of 1000 from nanoseconds.
TIME_UNITS: tuple[str, ...] = ("ns", "us", "ms", "s")
#: Memory units, one per factor of 1024 (binary prefixes, as allocators and torch report).
BYTE_UNITS: tuple[str, ...] = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
#: What a cell shows when a quantity is undefined (no MACs rule, a rate over zero time).
MISSING = "-"


def round_half_up(value: float, exponent: int) -> float:
    """``value`` rounded to a multiple of ``10**exponent`` from its exact value, a tie away from
    zero: as JavaScript's ``toPrecision`` and ``toFixed`` round, which the HTML report uses in
    the browser for the same cells (Python's own formatting rounds a tie to even: 398,500 ns was
    "398 us" in the text and "399 us" on the page).

    Example:
        >>> round_half_up(398.5, 0), round_half_up(2.675, -2), round_half_up(1250.0, 1)
        (399.0, 2.67, 1250.0)
    """
    exact = Decimal(value)  # (2.675 is 2.67499999999999982236431605997495353221893310546875)
    return float(exact.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_HALF_UP))


def _three_figures(magnitude: float) -> float:
    # ``magnitude`` (not negative) to three significant figures, as toPrecision(3) gives them.
    return round_half_up(magnitude, Decimal(magnitude).adjusted() - 2) if magnitude else 0.0


def format_intensity(value: float) -> str:
    """FLOPs per byte: three significant figures, whole from 1000 (never an exponent there),
    rounded as the HTML report rounds them.

    Example:
        >>> format_intensity(2.125), format_intensity(0.5), format_intensity(1000.5)
        ('2.13', '0.5', '1001')
    """
    if value >= 1000:
        return f"{round_half_up(value, 0):.0f}"
    return f"{_three_figures(value):g}"


def _split(value: float, steps: int, base: int = 1000) -> tuple[str, int]:
    """``value`` as three significant figures and the index of the power of ``base`` it was
    scaled by.

    Integers below ``base`` stay exact. Rounding happens before the scale is final, so 999_999
    is ``("1.00", 2)`` rather than ``("1000", 1)``.
    """
    if isinstance(value, float) and value.is_integer() and abs(value) < base:
        value = int(value)
    if isinstance(value, int) and abs(value) < base:
        return str(value), 0
    sign = "-" if value < 0 else ""
    magnitude = abs(float(value))
    index = 0
    while magnitude >= base and index < steps - 1:
        magnitude /= base
        index += 1
    rounded = _three_figures(magnitude)
    if rounded >= 1000 and index < steps - 1:  # four digits: the next unit reads better
        rounded, index = _three_figures(magnitude / base), index + 1
    if rounded >= 1000:
        # Past the largest prefix (hours in seconds, zettaFLOPs): whole units, every digit.
        return sign + f"{magnitude:.0f}", index
    if rounded < 1:
        # Only a fractional value below 1000 gets here (a mean of 0.5 FLOPs per call).
        return sign + f"{rounded:.3g}", index
    decimals = 2 if rounded < 10 else 1 if rounded < 100 else 0
    return sign + f"{rounded:.{decimals}f}", index


def _not_finite(value: float) -> str | None:
    # nan/inf have no magnitude to scale; print them as Python does.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return None


def format_count(n: float) -> str:
    """A count with a K/M/G/T/P/E suffix and three significant figures; exact below 1000.

    Example:
        >>> format_count(1_234_567), format_count(3_630_000_000), format_count(42)
        ('1.23 M', '3.63 G', '42')
    """
    odd = _not_finite(n)
    if odd is not None:
        return odd
    text, index = _split(n, len(COUNT_PREFIXES))
    prefix = COUNT_PREFIXES[index]
    return f"{text} {prefix}" if prefix else text


def _scaled(n: float, units: Sequence[str], base: int = 1000) -> str:
    # ``n`` in the unit of ``units`` (one per factor of ``base``) that gives three figures.
    odd = _not_finite(n)
    if odd is not None:
        return f"{odd} {units[0]}"
    text, index = _split(n, len(units), base)
    return f"{text} {units[index]}"


def _with_unit(n: float, unit: str) -> str:
    return _scaled(n, [prefix + unit for prefix in COUNT_PREFIXES])


def format_flops(n: float) -> str:
    """Floating-point operations with their unit (1 multiply-add = 2 FLOPs).

    Example:
        >>> format_flops(3_630_000_000), format_flops(512)
        ('3.63 GFLOPs', '512 FLOPs')
    """
    return _with_unit(n, "FLOPs")


def format_macs(n: float | None) -> str:
    """Multiply-accumulates with their unit; :data:`MISSING` when undefined (``None``).

    Example:
        >>> format_macs(1_815_000_000), format_macs(None)
        ('1.81 GMACs', '-')
    """
    if n is None:
        return MISSING
    return _with_unit(n, "MACs")


def format_time_ns(ns: float) -> str:
    """A duration given in nanoseconds, in ns, us, ms or s with three significant figures.

    Example:
        >>> format_time_ns(950), format_time_ns(12_345), format_time_ns(2_500_000_000)
        ('950 ns', '12.3 us', '2.50 s')
    """
    return _scaled(ns, TIME_UNITS)


def format_rate(flops: float, ns: float) -> str:
    """Achieved throughput, ``flops`` done in ``ns`` nanoseconds; :data:`MISSING` for no time.

    Example:
        >>> format_rate(2_000_000_000, 1_000_000)
        '2.00 TFLOP/s'
    """
    if not ns or ns < 0:
        return MISSING
    return _with_unit(flops * 1e9 / ns, "FLOP/s")


def format_per_second(value: float, unit: str) -> str:
    """A rate of ``unit`` per second with an SI prefix (bytes per second, FLOPs per second).

    Example:
        >>> format_per_second(12_345_678_901, "B"), format_per_second(512, "FLOP")
        ('12.3 GB/s', '512 FLOP/s')
    """
    return _with_unit(value, unit + "/s")


def format_bytes(n: float) -> str:
    """A size in bytes with a binary unit (KiB = 1024 B) and three significant figures.

    Example:
        >>> format_bytes(262_144), format_bytes(1_395_864_371), format_bytes(512)
        ('256 KiB', '1.30 GiB', '512 B')
    """
    return _scaled(n, BYTE_UNITS, base=1024)


def format_percent(part: float, whole: float) -> str:
    """``part`` as a percentage of ``whole`` with one decimal; :data:`MISSING` when whole is 0.

    Example:
        >>> format_percent(1, 3)
        '33.3%'
    """
    if not whole:
        return MISSING
    return f"{100.0 * part / whole:.1f}%"


def _format_one_shape(shape: Sequence[Any] | None) -> str:
    if shape is None:
        return MISSING
    return "[" + ", ".join(str(d) for d in shape) + "]"


def format_shape(sig: Any) -> str:
    """A tensor shape (``(64, 784)`` → ``"[64, 784]"``) or a call's signature, shape by shape.

    In a signature, an argument that is not a tensor prints as :data:`MISSING`.

    Example:
        >>> format_shape((64, 784)), format_shape(((64, 784), None, ()))
        ('[64, 784]', '[64, 784], -, []')
    """
    if sig is None:
        return MISSING
    items = list(sig)
    if all(isinstance(d, (int, str)) and not isinstance(d, bool) for d in items) and items:
        return _format_one_shape(items)
    if not items:
        return "[]"
    # A shape's dimensions may be numpy integers; anything not a sequence is a dimension.
    if all(not isinstance(d, (tuple, list)) and d is not None for d in items):
        return _format_one_shape(items)
    return ", ".join(_format_one_shape(s) for s in items)


def printable(text: str) -> str:
    r"""``text`` with every character Python does not call printable written as its escape.

    That is the C0 and C1 controls (ESC, BEL, NUL, newline...), the format characters (among
    them the bidirectional overrides and isolates such as U+202E, which reorder the text shown
    after them), separators other than the space, surrogates and unassigned code points: a
    module or class name can then neither move a terminal's cursor, recolour it or ring its bell,
    nor make a line read differently from what it holds. Every text output (tables, diff,
    bottleneck report, warnings, status lines) passes names through this one function; the
    saved JSON keeps them exact.

    Example:
        >>> printable("head\x1b[2J\x07\x00"), printable("fc\u202eexe.txt")
        ('head\\x1b[2J\\x07\\x00', 'fc\\u202eexe.txt')
        >>> printable("encoder.layer.0 (Linear)")
        'encoder.layer.0 (Linear)'
    """
    if text.isprintable():  # the common case, checked in C
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
