"""The command line's machine: ``tracetorch calibrate``, and ``--machine``/``--peak-flops`` of
``run`` and ``report``.

::

    tracetorch calibrate [--framework numpy|torch|both] [--device cpu|cuda] [--dtype float32]
                         [--threads N] [--refresh]
    tracetorch run train.py                           # + bottlenecks when a calibration fits
    tracetorch run --machine calibrate train.py       # measured once if none fits yet
    tracetorch report run.json --machine calibrate    # this machine, fitted to the profile
    tracetorch report run.json --peak-flops 989e12 --bandwidth 3.35e12 [--call-overhead 5000]
    tracetorch run --machine none train.py            # no bottleneck section

The calibration a profile is measured against fits what the profile recorded: its framework,
device, dtype and thread count (:func:`tracetorch.analysis.machine_cache.profile_target`;
``--framework``, ``--device``, ``--dtype``, ``--threads`` override each). ``run`` looks it up in
the cache after the script and, when it is there, the report gains its bottleneck section
(roofline per layer, where to look first, MFU), which names the peaks it used. ``calibrate``
measures torch when it is installed, else numpy (``--framework both``: each).

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_machine_options(parser, "report")
    >>> opts = parser.parse_args(["--peak-flops", "2e12", "--bandwidth", "1e11"])
    >>> user_machine(opts).describe()
    'peak 2.00 TFLOP/s, bandwidth 100 GB/s, call overhead not measured (--peak-flops, --bandwidth)'
"""
from __future__ import annotations

import argparse
import importlib.util
from typing import Any, TextIO

from tracetorch.analysis.machine import Machine
from tracetorch.analysis.machine_cache import (
    DTYPES,
    FRAMEWORKS,
    cache_path,
    cached_machine,
    machine_facts,
    profile_target,
)
from tracetorch.cli.argtypes import CliError, int_at_least, positive_number
from tracetorch.records.result import ProfileResult
from tracetorch.text.units import printable
from tracetorch.tools.calibrate import calibrate, measurement_lines

__all__ = ("add_calibrate_command", "add_machine_options", "user_machine", "attach_machine",
           "default_frameworks")

_MACHINE_HELP = {
    "report": "calibrate: this machine's cached (else measured, once) peaks for the profile's "
              "framework, device, dtype and threads; none: no bottleneck section (default: the "
              "profile's own machine, if it has one)",
    "run": "calibrate: this machine's cached peaks for the run's framework, device, dtype and "
           "threads, measured after the script (seconds, once) when none is cached; none: no "
           "bottleneck section (default: the cached peaks when there are some)",
}


def default_frameworks() -> tuple[str, ...]:
    """What ``tracetorch calibrate`` measures by default: torch when it is installed (the
    framework a PyTorch user profiles), else numpy; torch is not imported to find out.

    Example:
        >>> default_frameworks()[0] in ("torch", "numpy")
        True
    """
    return ("torch",) if importlib.util.find_spec("torch") is not None else ("numpy",)


def add_calibrate_command(commands: Any) -> None:
    """Add ``calibrate`` to the subparsers ``commands``."""
    cal = commands.add_parser(
        "calibrate", help="measure this machine's peak matmul FLOP/s, memory bandwidth and "
        "one layer call's cost (seconds; cached)",
        description="Measure the roofline of this machine, print it and cache it in "
        f"{cache_path()} (XDG_CACHE_HOME moves it). Later calls print the cached numbers.")
    cal.add_argument("--framework", choices=(*FRAMEWORKS, "both"),
                     help="the framework whose matmul and copy are timed (default: torch when "
                          "it is installed, else numpy)")
    cal.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    cal.add_argument("--dtype", default="float32", choices=sorted(set().union(*DTYPES.values())),
                     help="default: float32")
    cal.add_argument("--threads", type=int_at_least(1), metavar="N",
                     help="threads while measuring (default: those this process runs)")
    cal.add_argument("--refresh", action="store_true", help="measure again, replacing the cache")
    cal.set_defaults(handler=_cmd_calibrate)


def add_machine_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Add the options that give ``command``'s (``run`` or ``report``) report its machine."""
    group = parser.add_argument_group(
        "bottlenecks", "label each layer against a machine's roofline and print MFU")
    group.add_argument("--machine", choices=("calibrate", "none"), help=_MACHINE_HELP[command])
    group.add_argument("--peak-flops", type=positive_number, metavar="FLOP/s",
                       help="your own peak, e.g. a datasheet's dense number for the dtype")
    group.add_argument("--bandwidth", type=positive_number, metavar="BYTES/s",
                       help="your own memory bandwidth (with --peak-flops)")
    group.add_argument("--call-overhead", type=positive_number, metavar="NS",
                       help="one layer call's fixed cost in ns (with --peak-flops; without it "
                            "no layer is labelled overhead-bound)")
    group.add_argument("--framework", choices=FRAMEWORKS,
                       help="the calibration's framework (default: the profile's)")
    group.add_argument("--device", help="the calibration's device: cpu, cuda or cuda:N "
                                        "(default: the profile's)")
    group.add_argument("--dtype", choices=sorted(set().union(*DTYPES.values())),
                       help="the calibration's dtype (default: the one the profile's FLOPs "
                            "ran in)")
    group.add_argument("--threads", type=int_at_least(1), metavar="N",
                       help="the calibration's threads (default: the profile's)")


def user_machine(opts: argparse.Namespace) -> Machine | None:
    """The machine ``--peak-flops``/``--bandwidth`` give, else ``None``; also checks that the
    machine options go together (``run`` calls it before the script runs).

    Raises:
        ValueError: ``--machine`` with peaks, or only one of ``--peak-flops``/``--bandwidth``
            (the message starts with the option).
    """
    peaks = (opts.peak_flops, opts.bandwidth)
    given = any(p is not None for p in peaks) or opts.call_overhead is not None
    if opts.machine is not None and given:
        raise ValueError(f"--machine {opts.machine} leaves out --peak-flops, --bandwidth and "
                         "--call-overhead (calibrate measures the peaks)")
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


def attach_machine(result: ProfileResult, opts: argparse.Namespace, stream: TextIO,
                   command: str) -> None:
    """Put the machine the options name into ``result.meta["machine"]``, so that every output
    (the report's bottleneck section, ``-o``, ``--html``) measures against it; notes go to
    ``stream``. Without ``--machine``, ``report`` keeps the profile's own machine and ``run``
    takes the cached calibration that fits the run, if there is one. ``run`` never fails here
    (its script has run): what went wrong is one line on ``stream``.

    Raises:
        ValueError: (``report`` only) bad machine options, or a calibration that cannot be
            made for the profile (the message names the option or the profile's fact).
    """
    try:
        machine = _machine_for(result, opts, stream, command)
    except (ValueError, RuntimeError) as err:
        if command != "run":
            raise ValueError(str(err)) from None
        _say(f"tracetorch: no bottleneck section: {err}", stream)
        return
    if opts.machine == "none":
        result.meta.pop("machine", None)
    elif machine is not None:
        result.meta["machine"] = machine.to_dict()


def _target(result: ProfileResult, opts: argparse.Namespace) -> dict[str, Any]:
    # The profile's facts, each overridden by its option.
    target = profile_target(result.meta)
    for name in target:
        if getattr(opts, name) is not None:
            target[name] = getattr(opts, name)
    return target


def _machine_for(result: ProfileResult, opts: argparse.Namespace, stream: TextIO,
                 command: str) -> Machine | None:
    user = user_machine(opts)
    if user is not None or opts.machine == "none":
        return user
    if opts.machine is None and command != "run":
        return None  # the profile's own machine, if any, stays
    target = _target(result, opts)
    machine = cached_machine(**target)
    what = _described(target)
    if machine is None and opts.machine is None:
        _say(f"tracetorch: no calibration of this machine for {what} is cached; "
             "`tracetorch run --machine calibrate ...` measures it once (seconds) and adds the "
             "bottleneck section and MFU", stream)
        return None
    if machine is None:
        _say(f"tracetorch: calibrating this machine for {what} (seconds, once: cached)", stream)
        machine = calibrate(**target, verbose=False)
        _say("\n".join(measurement_lines(machine) + [f"  cached in {cache_path()}"]), stream)
    ran_on, here = result.meta.get("cpu"), machine_facts()["cpu"]
    if isinstance(ran_on, str) and ran_on != here:
        _say(f"tracetorch: note: the profile ran on {printable(ran_on)!r}; these peaks are "
             f"this machine's ({here!r})", stream)
    return machine


def _described(target: dict[str, Any]) -> str:
    threads = target["threads"]
    return (f"{target['framework']}, {printable(target['device'])}, {target['dtype']}"
            + (f", {threads} thread{'' if threads == 1 else 's'}" if threads else ""))


def _say(text: str, stream: TextIO) -> None:
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):  # the stream is gone: nowhere left to say it
        pass


def _cmd_calibrate(opts: argparse.Namespace) -> int:

    frameworks = (FRAMEWORKS if opts.framework == "both" else (opts.framework,)
                  if opts.framework else default_frameworks())
    for framework in frameworks:
        try:
            machine = calibrate(framework, opts.device, opts.dtype, opts.threads,
                                refresh=opts.refresh, verbose=False)
        except ValueError as err:
            raise CliError(f"--{err}") from None
        print("\n".join(measurement_lines(machine) + [f"  cache: {cache_path()}"]))
    return 0
