"""The command line's machine: ``tracetorch calibrate`` and ``report --machine/--peak-flops``.

::

    tracetorch calibrate [--framework numpy|torch] [--device cpu|cuda] [--dtype float32]
                         [--threads N] [--refresh]
    tracetorch report run.json --machine calibrate          # this machine's cached peaks
    tracetorch report run.json --peak-flops 989e12 --bandwidth 3.35e12 [--call-overhead 5000]

Either way the report gains its bottleneck section (roofline per layer, where to look first,
MFU), which names the peaks it used.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_machine_options(parser)
    >>> opts = parser.parse_args(["--peak-flops", "2e12", "--bandwidth", "1e11"])
    >>> machine_from_options(opts).describe()
    'peak 2.00 TFLOP/s, bandwidth 100 GB/s, call overhead not measured (--peak-flops, --bandwidth)'
"""
from __future__ import annotations

import argparse
from typing import Any

from tracetorch.analysis.calibrate import (
    DTYPES,
    FRAMEWORKS,
    cache_path,
    calibrate,
    measurement_lines,
)
from tracetorch.analysis.machine import Machine
from tracetorch.cli.argtypes import int_at_least, positive_number

__all__ = ("add_calibrate_command", "add_machine_options", "machine_from_options")


def _add_target(parser: argparse.ArgumentParser) -> None:
    # What a calibration is for; the defaults are tt.calibrate()'s.
    parser.add_argument("--framework", choices=FRAMEWORKS, default="numpy",
                        help="the framework whose matmul and copy are timed (default: numpy)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument("--dtype", default="float32", choices=sorted(set().union(
        *DTYPES.values())), help="default: float32")
    parser.add_argument("--threads", type=int_at_least(1), metavar="N",
                        help="torch only: threads while measuring (default: torch's)")


def add_calibrate_command(commands: Any) -> None:
    """Add ``calibrate`` to the subparsers ``commands``."""
    cal = commands.add_parser(
        "calibrate", help="measure this machine's peak matmul FLOP/s, memory bandwidth and "
        "one layer call's cost (seconds; cached)",
        description="Measure the roofline of this machine, print it and cache it in "
        f"{cache_path()} (XDG_CACHE_HOME moves it). Later calls print the cached numbers.")
    _add_target(cal)
    cal.add_argument("--refresh", action="store_true", help="measure again, replacing the cache")
    cal.set_defaults(handler=_cmd_calibrate)


def add_machine_options(parser: argparse.ArgumentParser) -> None:
    """Add the options that give a report its machine (``--machine`` or the peaks)."""
    group = parser.add_argument_group(
        "bottlenecks", "label each layer against a machine's roofline and print MFU")
    group.add_argument("--machine", choices=("calibrate",),
                       help="this machine's cached (else measured) peaks for --framework, "
                            "--device, --dtype")
    group.add_argument("--peak-flops", type=positive_number, metavar="FLOP/s",
                       help="your own peak, e.g. a datasheet's dense number for the dtype")
    group.add_argument("--bandwidth", type=positive_number, metavar="BYTES/s",
                       help="your own memory bandwidth (with --peak-flops)")
    group.add_argument("--call-overhead", type=positive_number, metavar="NS",
                       help="one layer call's fixed cost in ns (with --peak-flops; without it "
                            "no layer is labelled overhead-bound)")
    _add_target(group)  # type: ignore[arg-type]  # an argument group adds arguments alike


def machine_from_options(opts: argparse.Namespace) -> Machine | None:
    """The machine the options name, else ``None``.

    Raises:
        ValueError: ``--machine`` with peaks, or only one of ``--peak-flops``/``--bandwidth``.
    """
    peaks = (opts.peak_flops, opts.bandwidth)
    if opts.machine is not None:
        if any(p is not None for p in peaks) or opts.call_overhead is not None:
            raise ValueError("--machine calibrate measures the peaks: leave out --peak-flops, "
                             "--bandwidth and --call-overhead")
        return calibrate(opts.framework, opts.device, opts.dtype, opts.threads)
    if all(p is None for p in peaks):
        if opts.call_overhead is not None:
            raise ValueError("--call-overhead needs --peak-flops and --bandwidth")
        return None
    if any(p is None for p in peaks):
        raise ValueError("--peak-flops and --bandwidth go together (a roofline needs both)")
    return Machine(peak_flops=opts.peak_flops, bandwidth_bytes_per_s=opts.bandwidth,
                   call_overhead_ns=opts.call_overhead or 0.0,
                   source="--peak-flops, --bandwidth"
                   + (", --call-overhead" if opts.call_overhead else ""))


def _cmd_calibrate(opts: argparse.Namespace) -> int:
    from tracetorch.cli.main import CliError  # main imports this module

    try:
        machine = calibrate(opts.framework, opts.device, opts.dtype, opts.threads,
                            refresh=opts.refresh, verbose=False)
    except ValueError as err:
        raise CliError(f"--{err}") from None
    print("\n".join(measurement_lines(machine) + [f"  cache: {cache_path()}"]))
    return 0
