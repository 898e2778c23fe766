"""Number humanizers: exact strings for known values, properties for the rest."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracetorch.text.units import (
    COUNT_PREFIXES,
    TIME_UNITS,
    format_count,
    format_flops,
    format_macs,
    format_percent,
    format_rate,
    format_shape,
    format_time_ns,
)


@pytest.mark.parametrize("value, text", [
    (0, "0"),
    (7, "7"),
    (999, "999"),
    (1000, "1.00 K"),
    (1234, "1.23 K"),
    (12_345, "12.3 K"),
    (123_456, "123 K"),
    (999_499, "999 K"),
    (999_500, "1.00 M"),       # rounds up into the next prefix, not "1000 K"
    (1_234_567, "1.23 M"),
    (3_630_000_000, "3.63 G"),
    (2_500_000_000_000, "2.50 T"),
    (4.2e15, "4.20 P"),
    (1.5e18, "1.50 E"),
    (1.234e21, "1234 E"),      # past the last prefix: whole units
    (-1234, "-1.23 K"),
    (12.5, "12.5"),
    (0.5, "0.5"),
    (1000.0, "1.00 K"),
    (np.int64(1500), "1.50 K"),
    (float("nan"), "nan"),
    (float("inf"), "inf"),
])
def test_format_count(value: float, text: str) -> None:
    assert format_count(value) == text


@pytest.mark.parametrize("value, text", [
    (3_630_000_000, "3.63 GFLOPs"),
    (512, "512 FLOPs"),
    (0, "0 FLOPs"),
    (1_000_000, "1.00 MFLOPs"),
    (1e15, "1.00 PFLOPs"),
])
def test_format_flops(value: float, text: str) -> None:
    assert format_flops(value) == text


@pytest.mark.parametrize("value, text", [
    (1_810_000_000, "1.81 GMACs"),
    (0, "0 MACs"),
    (None, "-"),
])
def test_format_macs(value: float, text: str) -> None:
    assert format_macs(value) == text


@pytest.mark.parametrize("ns, text", [
    (0, "0 ns"),
    (999, "999 ns"),
    (1000, "1.00 us"),
    (12_345, "12.3 us"),
    (999_999, "1.00 ms"),
    (1_500_000, "1.50 ms"),
    (2_500_000_000, "2.50 s"),
    (3_600_000_000_000, "3600 s"),
    (12.5, "12.5 ns"),
    (1234.6, "1.23 us"),
])
def test_format_time_ns(ns: float, text: str) -> None:
    assert format_time_ns(ns) == text


@pytest.mark.parametrize("flops, ns, text", [
    (2_000_000_000, 1_000_000, "2.00 TFLOP/s"),
    (1_000_000_000, 1_000_000_000, "1.00 GFLOP/s"),
    (0, 10, "0 FLOP/s"),
    (5, 0, "-"),
])
def test_format_rate(flops: float, ns: float, text: str) -> None:
    assert format_rate(flops, ns) == text


@pytest.mark.parametrize("part, whole, text", [
    (1, 3, "33.3%"), (3, 3, "100.0%"), (0, 7, "0.0%"), (1, 0, "-"),
])
def test_format_percent(part: float, whole: float, text: str) -> None:
    assert format_percent(part, whole) == text


@pytest.mark.parametrize("sig, text", [
    ((64, 784), "[64, 784]"),
    ([3], "[3]"),
    ((), "[]"),
    (None, "-"),
    (((64, 784),), "[64, 784]"),
    (((64, 784), (784, 256)), "[64, 784], [784, 256]"),
    (((2, 3), None, ()), "[2, 3], -, []"),
    ((np.int64(4), np.int64(5)), "[4, 5]"),
])
def test_format_shape(sig: object, text: str) -> None:
    assert format_shape(sig) == text


# ----------------------------------------------------------------------------- properties
_COUNT = re.compile(r"^(-?[0-9.]+)(?: ([KMGTPE]))?$")
_TIME = re.compile(r"^(-?[0-9.]+) (ns|us|ms|s)$")


def _parse_count(text: str) -> float:
    match = _COUNT.match(text)
    assert match, text
    return float(match.group(1)) * 1000.0 ** COUNT_PREFIXES.index(match.group(2) or "")


def _prefix_index(text: str) -> int:
    match = _COUNT.match(text)
    assert match, text
    return COUNT_PREFIXES.index(match.group(2) or "")


counts = st.integers(min_value=0, max_value=10**20)


@given(counts)
def test_format_count_is_never_empty_and_parses_back(n: int) -> None:
    text = format_count(n)
    assert text and text == text.strip()
    if n < 1000:
        assert text == str(n)
    # Three significant figures: at most half a unit of the third digit off.
    assert math.isclose(_parse_count(text), n, rel_tol=5e-3, abs_tol=0.5)


@given(counts, counts)
def test_format_count_prefix_is_monotonic(a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert _prefix_index(format_count(low)) <= _prefix_index(format_count(high))


@given(st.floats(min_value=0, max_value=9.99e20, allow_nan=False))  # below "1000 E"
def test_format_count_mantissa_has_three_significant_figures(x: float) -> None:
    if x >= 1000:
        mantissa = _COUNT.match(format_count(x)).group(1)  # type: ignore[union-attr]
        assert len(mantissa.replace(".", "")) == 3 and 1 <= float(mantissa) < 1000


@given(counts)
def test_flops_and_macs_always_carry_their_unit(n: int) -> None:
    assert format_flops(n).endswith("FLOPs") and "flops" not in format_flops(n)
    assert format_macs(n).endswith("MACs")
    count = format_count(n)
    # The unit joins the prefix ("1.00 KFLOPs") or follows a plain number ("512 FLOPs").
    assert format_flops(n) == count + ("FLOPs" if count[-1].isalpha() else " FLOPs")


@given(st.integers(min_value=0, max_value=10**15))
def test_format_time_parses_back_with_a_unit(ns: int) -> None:
    text = format_time_ns(ns)
    match = _TIME.match(text)
    assert match, text
    value = float(match.group(1)) * 1000.0 ** TIME_UNITS.index(match.group(2))
    assert math.isclose(value, ns, rel_tol=5e-3, abs_tol=0.5)


@given(st.integers(min_value=0, max_value=10**15), st.integers(min_value=0, max_value=10**15))
def test_format_time_unit_is_monotonic(a: int, b: int) -> None:
    low, high = sorted((a, b))
    unit = [TIME_UNITS.index(_TIME.match(format_time_ns(v)).group(2))  # type: ignore[union-attr]
            for v in (low, high)]
    assert unit[0] <= unit[1]


@given(st.integers(min_value=0, max_value=10**18), st.integers(min_value=1, max_value=10**12))
def test_format_rate_is_flops_per_second(flops: int, ns: int) -> None:
    text = format_rate(flops, ns)
    assert text.endswith("FLOP/s")
    value = _parse_count(text[: -len("FLOP/s")].rstrip())
    assert math.isclose(value, flops * 1e9 / ns, rel_tol=5e-3, abs_tol=0.5)


def test_a_tie_at_the_third_figure_rounds_up_as_the_html_page_does():
    # JavaScript's toPrecision (the HTML report) rounds an exact tie up; the text must agree.
    from tracetorch.text.units import format_bytes, format_time_ns

    assert format_time_ns(398_500) == "399 us" and format_time_ns(398_499) == "398 us"
    assert format_time_ns(2_125) == "2.13 us"  # 2.125 is exact in binary: a tie
    assert format_bytes(int(1.125 * 1024)) == "1.13 KiB"
    # FLOPs per byte, both tables: three figures below 1000, whole from 1000, ties up
    from tracetorch.text.units import format_intensity

    assert [format_intensity(v) for v in (2.125, 0.5, 999.6, 1000.5, 0.015625, 4096.0)] == [
        "2.13", "0.5", "1000", "1001", "0.0156", "4096"]
