"""What a machine can do: the peaks a roofline is drawn from.

A :class:`Machine` holds three numbers and where they came from:

- ``peak_flops``: the highest matrix-multiply rate, FLOP/s (1 multiply-add = 2 FLOPs);
- ``bandwidth_bytes_per_s``: the memory bandwidth, bytes read plus bytes written per second;
- ``call_overhead_ns``: the fixed cost one layer call shows in a profile when it does almost no
  work (0 when not measured: then no layer is labelled overhead-bound).

:func:`tracetorch.calibrate` measures them; a user may pass a datasheet's numbers instead (dense
peaks, for the dtype the model runs in). Every report that uses a machine prints
:meth:`Machine.describe`, so a ratio never travels without its denominator.

Example:
    >>> m = Machine(peak_flops=989e12, bandwidth_bytes_per_s=3.35e12,
    ...             source="H100 SXM datasheet, dense bf16")
    >>> round(m.ridge_intensity, 1)             # FLOPs per byte where the two roofs meet
    295.2
    >>> m.ceiling(10.0) == 10.0 * 3.35e12       # below the ridge: bandwidth bounds
    True
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tracetorch.text.units import format_per_second, format_time_ns

__all__ = ("Machine", "machine_entry", "MACHINE_WHERE")

#: How every message about a profile's machine entry names it.
MACHINE_WHERE = 'meta["machine"]'


def _check_rate(value: Any, name: str, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        wanted = "a finite number >= 0" if allow_zero else "a positive finite number"
        raise ValueError(f"{name}: expected {wanted}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Machine:
    """The peaks of one machine (framework, device, dtype, threads) and their source.

    Attributes:
        peak_flops: matmul FLOP/s; the roof of compute-bound layers.
        bandwidth_bytes_per_s: bytes moved (read + written) per second; the slope of the roof.
        call_overhead_ns: what a profile records for one call of a layer with no work to do
            (0: not measured).
        source: ``"measured <date>"``, ``"cache (measured <date>)"`` or the user's own words
            (``"H100 SXM datasheet, dense bf16"``).
        facts: what the numbers are for: host, cpu, framework, device, dtype, threads, and the
            sizes that gave them.

    Raises:
        ValueError: a peak that is not a positive finite number (the message names it).
    """

    peak_flops: float
    bandwidth_bytes_per_s: float
    call_overhead_ns: float = 0.0
    source: str = "user"
    facts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_flops", _check_rate(self.peak_flops, "peak_flops"))
        object.__setattr__(self, "bandwidth_bytes_per_s", _check_rate(
            self.bandwidth_bytes_per_s, "bandwidth_bytes_per_s"))
        object.__setattr__(self, "call_overhead_ns", _check_rate(
            self.call_overhead_ns, "call_overhead_ns", allow_zero=True))
        if not isinstance(self.source, str):
            raise TypeError(f"source: expected a string, got {self.source!r}")
        if not isinstance(self.facts, dict):
            raise TypeError(f"facts: expected a dict, got {self.facts!r}")

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte at which the bandwidth roof meets the compute roof."""
        return self.peak_flops / self.bandwidth_bytes_per_s

    def ceiling(self, intensity: float) -> float:
        """The roofline's FLOP/s at ``intensity`` FLOPs per byte: ``min(peak, bandwidth * I)``.

        Example:
            >>> Machine(100.0, 10.0).ceiling(2.0), Machine(100.0, 10.0).ceiling(50.0)
            (20.0, 100.0)
        """
        return min(self.peak_flops, self.bandwidth_bytes_per_s * intensity)

    def predicted_ns(self, flops: float, bytes_moved: float) -> float:
        """The roofline's time for the work: ``max(flops / peak, bytes / bandwidth)``, in ns.

        Example:
            >>> Machine(1e9, 1e9).predicted_ns(flops=2_000, bytes_moved=500)
            2000.0
        """
        return 1e9 * max(flops / self.peak_flops, bytes_moved / self.bandwidth_bytes_per_s)

    def describe(self) -> str:
        """One line: the peaks, the call overhead and where they came from.

        Example:
            >>> Machine(2.5e11, 1.2e10, 3_100, source="user").describe()
            'peak 250 GFLOP/s, bandwidth 12.0 GB/s, call overhead 3.10 us (user)'
        """

        overhead = (format_time_ns(self.call_overhead_ns) if self.call_overhead_ns
                    else "not measured")
        what = ", ".join(f"{self.facts[k]}" for k in ("framework", "device", "dtype")
                         if k in self.facts)
        if "threads" in self.facts:
            threads = self.facts["threads"]
            what += f", {threads} thread{'' if threads == 1 else 's'}"
        where = f"{self.source}; {what}" if what else self.source
        return (f"peak {format_per_second(self.peak_flops, 'FLOP')}, bandwidth "
                f"{format_per_second(self.bandwidth_bytes_per_s, 'B')}, call overhead {overhead} "
                f"({where})")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``meta["machine"]`` of a saved profile holds)."""
        return asdict(self)

    @staticmethod
    def from_dict(data: Any, where: str = "machine") -> Machine:
        """The machine :meth:`to_dict` wrote.

        Raises:
            ValueError: ``data`` is not such a dict; the message starts with ``where``.

        Example:
            >>> m = Machine(1e12, 1e11, 2_000, source="measured 2026-01-01")
            >>> Machine.from_dict(m.to_dict()) == m
            True
        """
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a dict with peak_flops and "
                             f"bandwidth_bytes_per_s, got {type(data).__name__}")
        try:
            return Machine(peak_flops=data["peak_flops"],
                           bandwidth_bytes_per_s=data["bandwidth_bytes_per_s"],
                           call_overhead_ns=data.get("call_overhead_ns", 0.0),
                           source=data.get("source", "user"), facts=dict(data.get("facts", {})))
        except KeyError as err:
            raise ValueError(f"{where}: missing field {err.args[0]!r}") from None
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where}: {err}") from None


def machine_entry(meta: Mapping[str, Any]) -> tuple[Machine | None, str]:
    """The machine a profile's ``meta["machine"]`` holds, and ``""`` or why the entry was set
    aside: the one reading of "the machine of a result" that every view (table, summary, HTML,
    the report command, ``ProfileResult.machine``) shares, so a damaged entry is reported the
    same way everywhere and makes none of them raise. No entry (or ``None``) is no machine.

    Example:
        >>> machine_entry({})
        (None, '')
        >>> print(machine_entry({"machine": {"peak_flops": 1e12}})[1])
        meta["machine"]: missing field 'bandwidth_bytes_per_s'
        >>> machine_entry({"machine": Machine(1e12, 1e11).to_dict()})[0].peak_flops
        1000000000000.0
    """
    data = meta.get("machine")
    if data is None:
        return None, ""
    try:
        return Machine.from_dict(data, where=MACHINE_WHERE), ""
    except ValueError as err:
        return None, str(err)
