"""``tracetorch diff base.json new.json``: two saved profiles compared layer by layer, for CI.

The report goes to stdout. The exit status is 1 when ``--fail-above`` is given and a layer
regressed by more than it (a time change beyond noise, or FLOPs per call; see
:mod:`tracetorch.analysis.diff`), 0 otherwise, 2 for a usage error (a missing or corrupt file, a bad
option value).

Example:
    >>> import argparse
    >>> parse_percent("10%"), parse_percent("2.5")
    (10.0, 2.5)
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tracetorch.analysis.diff import DEFAULT_SIGMAS, DEFAULT_TOP, DIFF_SORT_KEYS, ProfileDiff, diff
from tracetorch.text.units import format_time_ns, printable

__all__ = ("add_diff_command", "parse_percent", "EXIT_REGRESSED")

#: Exit status when a layer regressed beyond ``--fail-above``.
EXIT_REGRESSED = 1
_EXIT_USAGE = 2


def parse_percent(text: str) -> float:
    """``"10%"`` or ``"10"`` as 10.0 (percent); argparse's error for anything else."""
    try:
        value = float(text[:-1] if text.endswith("%") else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage such as 10%, got {text!r}") \
            from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite percentage >= 0, got {text!r}")
    return value


def _sigmas(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _top(text: str) -> int | None:
    if text == "all":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'all', got {text!r}")
    return int(text)


def add_diff_command(commands: Any) -> None:
    """Add ``diff`` to the subparsers ``commands``."""
    cmd = commands.add_parser(
        "diff", help="compare two saved profiles layer by layer; with --fail-above, exit 1 on "
        "a regression (for CI)",
        description="Match the layers of two profiles saved with -o by call path and print the "
        "change in calls, time per call, total and self time, FLOPs, backward and bytes moved. "
        f"A time change is marked * only beyond noise: more than --sigmas (default "
        f"{DEFAULT_SIGMAS:g}) standard errors (std/sqrt(calls)) of both runs.")
    cmd.add_argument("base", metavar="BASE.json", help="the reference profile")
    cmd.add_argument("new", metavar="NEW.json", help="the profile to check")
    cmd.add_argument("--fail-above", type=parse_percent, metavar="PCT",
                     help="exit with status 1 when a layer's time per call grew by more than "
                          "PCT (e.g. 10%%) beyond noise, or its FLOPs per call by more than PCT")
    cmd.add_argument("--sort", choices=DIFF_SORT_KEYS, default="time",
                     help="order of the layers, largest change first (default: total time)")
    cmd.add_argument("--top", type=_top, default=DEFAULT_TOP, metavar="N",
                     help=f"print the N largest changes (default {DEFAULT_TOP}; 'all')")
    cmd.add_argument("--sigmas", type=_sigmas, default=DEFAULT_SIGMAS, metavar="K",
                     help=f"the noise rule's factor (default {DEFAULT_SIGMAS:g})")
    cmd.add_argument("--width", type=int, metavar="N",
                     help="fit the table to N characters (default: the terminal, $COLUMNS, 120)")
    cmd.add_argument("--json", metavar="OUT.json", help="also write every layer's change as JSON")
    cmd.add_argument("--html", metavar="OUT.html", help="also write a static HTML page")
    cmd.set_defaults(handler=_cmd_diff)


def _error(message: str) -> int:
    print(f"tracetorch: error: {printable(message)}", file=sys.stderr)
    return _EXIT_USAGE


def _cmd_diff(opts: argparse.Namespace) -> int:
    for option, path in (("--json", opts.json), ("--html", opts.html)):
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            return _error(f"{option}: folder of {path!r} does not exist")
    if opts.width is not None and opts.width < 20:
        return _error(f"--width: must be at least 20, got {opts.width}")
    try:
        result = diff(opts.base, opts.new, sort=opts.sort, sigmas=opts.sigmas)
    except FileNotFoundError as err:
        return _error(f"cannot open {err.filename or opts.base!r}: no such file")
    except OSError as err:
        return _error(f"cannot read {err.filename!r}: {err.strerror}")
    except ValueError as err:
        return _error(str(err))
    print(result.table(top=opts.top, width=opts.width))  # None: the terminal's width and colour
    for option, path, write in (("--json", opts.json, ProfileDiff.save_json),
                                ("--html", opts.html, ProfileDiff.save_html)):
        if path is None:
            continue
        try:
            write(result, path)
        except OSError as err:
            return _error(f"{option}: cannot write {path!r}: {err.strerror}")
        print(f"tracetorch: wrote {printable(path)}", file=sys.stderr)
    if opts.fail_above is None:
        return 0
    regressed = result.regressions(opts.fail_above)
    if not regressed:
        print(f"tracetorch: no layer regressed more than {opts.fail_above:g}%")
        return 0
    named = ", ".join(
        f"{printable(layer.path)} (time/call {layer.mean_change_percent:+.1f}%, "
        f"{format_time_ns(layer.base['mean_ns'] if layer.base else 0)} -> "
        f"{format_time_ns(layer.new['mean_ns'] if layer.new else 0)}; "
        f"FLOPs/call {layer.flops_change_percent:+.1f}%)" for layer in regressed)
    print(f"tracetorch: {len(regressed)} layer{'s' if len(regressed) != 1 else ''} regressed "
          f"more than {opts.fail_above:g}%: {named}")
    return EXIT_REGRESSED
