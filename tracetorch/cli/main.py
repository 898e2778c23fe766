"""The ``tracetorch`` command (also ``python -m tracetorch``).

::

    tracetorch run [options] script.py [args...]    profile an unmodified script
    tracetorch script.py [args...]                  the same: a first word that is no command
    tracetorch report run.json [options]            print a profile saved with -o
    tracetorch demo [--steps N] [options]           profile a small CNN training run
    tracetorch diff base.json new.json [--fail-above 10%]   compare two runs layer by layer
    tracetorch calibrate [--framework F] [--refresh] measure this machine's roofline (cached)

With a cached calibration that fits the run (``tracetorch calibrate``, or once
``--machine calibrate``), ``run``'s report ends with the bottleneck section and MFU
(``--machine none`` leaves it out); see :mod:`tracetorch.cli.machine`.

``run`` prints its report to **stderr** once the script ends, so the script's stdout stays
exactly its own and can be piped as usual; ``report`` and ``demo`` print to stdout, as the report
is what they are for. Errors in the command itself (a missing script, a corrupt profile, a bad
option value) print one line on stderr and exit with status 2.

Example:
    >>> main(["report", "/no/such/run.json"])
    2
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn, TextIO

import tracetorch
from tracetorch.cli.argtypes import CliError, int_at_least
from tracetorch.cli.demo import run_demo
from tracetorch.cli.diff_command import add_diff_command
from tracetorch.cli.machine import (
    add_calibrate_command,
    add_machine_options,
    attach_machine,
    user_machine,
)
from tracetorch.cli.outputs import check_outputs, write_outputs
from tracetorch.cli.progress import ProgressLine
from tracetorch.cli.ranks import rank_profile, ranks_text, run_gather_path
from tracetorch.cli.script import die_of_signal, run_script, runnable, signal_name
from tracetorch.distributed.gather import rank_file
from tracetorch.profiler import profile
from tracetorch.records.result import ProfileResult
from tracetorch.report.flat_table import FLAT_COLUMNS, FLAT_VIEWS, render_flat
from tracetorch.report.ops import render_op_table
from tracetorch.report.ranks_trace import export_ranks_chrome_trace
from tracetorch.report.table import SORT_KEYS, TREE_COLUMNS, render_table
from tracetorch.text.layout import color_enabled, terminal_width
from tracetorch.text.units import printable

__all__ = ("main", "COMMANDS")

#: The subcommands; any other first argument is taken as the script to ``run``.
COMMANDS = ("run", "report", "demo", "calibrate", "diff")

#: Exit status for errors of the command itself, as argparse uses.
EXIT_USAGE = 2

_SPEEDSCOPE_HELP = ("also write the tree for https://www.speedscope.app (flame graphs weighted by "
                    "self time and by FLOPs)")
_CSV_HELP = "also write one CSV line per call node (the columns of ProfileResult.to_rows())"
_HTML_HELP = ("also write the interactive report as one offline HTML file (icicle chart, "
              "sortable table, summary)")

_RUN_EPILOG = """\
The script runs as `python script.py args...` would run it (__name__ == "__main__", sys.argv,
sys.path[0] = its folder, an absolute __file__), with every tracetorch.core and torch.nn layer
call recorded; torch may be imported by the script itself. The report goes to stderr when the
script ends, also when it raises, calls sys.exit or is interrupted; the script's stdout is left
untouched. The exit status is the script's: its sys.exit code, 1 after an uncaught exception
(whose traceback is printed), 130 after Ctrl-C; stopped by SIGTERM or SIGHUP, the report and
files are written and tracetorch then dies of the same signal. Output paths are checked before
the script runs (none may be a folder, the script, or another output); one that fails to be
written after it is reported, the others are written, and the status stays the script's."""


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, raised rather than printed."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')")


def _parser() -> _Parser:
    view = _Parser(add_help=False)
    view.add_argument("--depth", type=int_at_least(1), metavar="N",
                      help="show the tree down to this level (1 = top-level calls only)")
    view.add_argument("--sort", choices=SORT_KEYS, default="total",
                      help="order of sibling rows (default: total time)")
    view.add_argument("--top", type=int_at_least(1), metavar="N", help="show at most N rows")
    view.add_argument("--columns", type=_column_list, metavar="A,B,...",
                      help="the table's columns, comma-separated, or 'all' (default: those that "
                           "fit the width, by priority); names: "
                           + ", ".join(s.key for s in TREE_COLUMNS))
    view.add_argument("--width", type=int_at_least(20), metavar="N",
                      help="fit the table to N characters (default: the terminal's width, "
                           "else $COLUMNS, else 120)")
    output = _Parser(add_help=False)
    output.add_argument("-o", "--output", metavar="RUN.json",
                        help="also save the profile as JSON (read it with `tracetorch report`)")
    output.add_argument("--chrome", metavar="TRACE.json",
                        help="also record every call and write a Chrome/Perfetto trace")
    output.add_argument("--html", metavar="REPORT.html", help=_HTML_HELP)
    output.add_argument("--speedscope", metavar="OUT.json", help=_SPEEDSCOPE_HELP)
    output.add_argument("--csv", metavar="OUT.csv", help=_CSV_HELP)

    parser = _Parser(prog="tracetorch", description="Per-layer calls, FLOPs and time of "
                     "numpy (tracetorch.core), PyTorch and duck-typed models.",
                     epilog="`tracetorch script.py ...` is short for `tracetorch run script.py "
                     "...`. Run `tracetorch COMMAND --help` for a command's options.")
    parser.add_argument("--version", action="version",
                        version=f"tracetorch {tracetorch.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)

    run = commands.add_parser("run", parents=[view, output], epilog=_RUN_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              help="run a Python script with every layer call profiled; "
                                   "report on stderr")
    run.add_argument("script", nargs="?", help="the script to run (a file, or a folder with a "
                     "__main__.py)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    add_machine_options(run, "run")
    run.set_defaults(handler=_cmd_run)

    report = commands.add_parser("report", parents=[view],
                                 help="print a profile saved with -o/--output to stdout")
    report.add_argument("profile", metavar="RUN.json", help="a profile saved with -o/--output")
    report.add_argument("--flat", choices=FLAT_VIEWS,
                        help="one row per layer type or per module instead of the tree")
    report.add_argument("--rank", type=int_at_least(0), metavar="N",
                        help="of a merged distributed profile: rank N's own profile")
    report.add_argument("--ops", metavar="PATH",
                        help="print the operations run directly in the layer at call path PATH "
                             "(calls, FLOPs, time with profile(op_timing=True)); '' is the model")
    report.add_argument("--html", metavar="REPORT.html", help=_HTML_HELP)
    report.add_argument("--speedscope", metavar="OUT.json", help=_SPEEDSCOPE_HELP)
    report.add_argument("--csv", metavar="OUT.csv", help=_CSV_HELP)
    # The profile exists already: -o and --chrome (which needs a timeline) do not apply.
    add_machine_options(report, "report")
    report.set_defaults(handler=_cmd_report, output=None, chrome=None)

    demo = commands.add_parser("demo", parents=[view, output],
                               help="train a small tracetorch.core CNN on synthetic data under "
                                    "the profiler; report on stdout")
    demo.add_argument("--steps", type=int_at_least(2), default=20, metavar="N",
                      help="training steps, the first one a warm-up that is not recorded "
                           "(default: 20)")
    demo.set_defaults(handler=_cmd_demo)
    add_calibrate_command(commands)
    add_diff_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tracetorch`` command with ``argv`` (default: ``sys.argv[1:]``); return its status.

    Example:
        >>> main(["demo", "--steps", "1"])
        2
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in COMMANDS and args[0] not in ("-h", "--help", "--version"):
        args.insert(0, "run")
    try:
        opts = _parser().parse_args(args)
        if opts.command == "run":
            opts.args = _script_args(args, opts.script, opts.args)
        return int(opts.handler(opts))
    except CliError as err:
        print(f"tracetorch: error: {printable(str(err))}", file=sys.stderr)
        return EXIT_USAGE


def _script_args(argv: list[str], script: str, parsed: list[str]) -> list[str]:
    # argparse drops a "--" right after the script name; the script must see it, as under python.
    tail = len(argv) - len(parsed)
    if tail >= 2 and argv[tail - 1] == "--" and argv[tail - 2] == script:
        return argv[tail - 1:]
    return parsed


# ------------------------------------------------------------------------------------ report
def _column_list(text: str) -> str | list[str]:
    # Checked here, before a run, against every view's names; each view checks its own later.
    if text == "all":
        return text
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = {s.key for s in TREE_COLUMNS} | {s.key for v in FLAT_COLUMNS.values() for s in v}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown column {(unknown or [text])[0]!r}; choose from {', '.join(sorted(known))} "
            "or 'all'")
    return names


def _render(result: ProfileResult, opts: argparse.Namespace, stream: TextIO | None = None) -> str:
    # Width and colour follow the stream the report goes to (stderr for `run`).
    stream = sys.stdout if stream is None else stream
    shape = {"columns": opts.columns, "color": color_enabled(stream),
             "width": opts.width or terminal_width(stream)}
    try:
        flat = getattr(opts, "flat", None)
        if flat is not None:
            return render_flat(result, view=flat, sort_by=opts.sort, **shape)
        return render_table(result, sort_by=opts.sort, depth=opts.depth, row_limit=opts.top,
                            **shape)
    except ValueError as err:  # an unknown --columns name: the message lists the choices
        raise CliError(f"--{err}") from None


def _check_outputs(opts: argparse.Namespace, *inputs: tuple[str, str]) -> None:
    # Checked before anything runs, so a typo in a path does not cost the whole run, and no
    # output overwrites an input (see tracetorch.cli.outputs).
    try:
        check_outputs(opts, inputs)
    except ValueError as err:
        raise CliError(str(err)) from None


def _write_outputs(result: ProfileResult, opts: argparse.Namespace,
                   stream: TextIO | None = None, folder: str = "") -> bool:
    # Each output written or its failure said; False when one failed.
    return write_outputs(result, opts, stream or sys.stderr, folder)


def _ended(status: int) -> str:
    # How the script ended, for the status line (run_script's -N: stopped by signal N).
    if status < 0:
        return f"was stopped by {signal_name(-status)}"
    return f"exited with status {status}"


def _exit_as(status: int) -> int:
    # The script's status, or the death by the signal that stopped it, as without tracetorch
    # (the profile and its reports are saved by then).
    return die_of_signal(-status) if status < 0 else status


# ------------------------------------------------------------------------------------ commands
def _cmd_run(opts: argparse.Namespace) -> int:
    if opts.script is None:
        raise CliError("run: which script? usage: tracetorch run [options] script.py [args...]")
    if not runnable(opts.script):
        raise CliError(f"cannot open script {opts.script!r}: no such file (or folder with a "
                       f"__main__.py)")
    script_file = opts.script
    if os.path.isdir(script_file):
        script_file = os.path.join(script_file, "__main__.py")
    _check_outputs(opts, ("the script", script_file))
    try:  # machine options that do not go together fail before the script runs
        user_machine(opts)
    except ValueError as err:
        raise CliError(str(err)) from None
    folder = os.getcwd()  # -o and --chrome are relative to it, wherever the script goes
    report = _report_stream()  # the script may close or replace sys.stderr
    try:
        gather = run_gather_path(opts.output)  # one rank of a torchrun job: where ranks meet
        prof = profile(timeline=opts.chrome is not None, gather=gather)
        started_in = os.getpid()
        status = run_script(prof, opts.script, opts.args)
        if os.getpid() != started_in:
            return _exit_as(status)  # a child the script forked: the parent reports, once
        if gather is not None:
            return _exit_as(_report_job(prof, opts, status, report, folder, gather))
        attach_machine(prof, opts, report, "run")  # after the script, as every output's
        _write_outputs(prof, opts, report, folder)
        _flush(sys.stdout)  # the script's output first, then the report
        lines = [f"\ntracetorch: {printable(opts.script)} {_ended(status)}"]
        if not prof.root.children:
            lines.append("tracetorch: no layer call was recorded (tracetorch.core and torch.nn "
                         "layers are, and code decorated with @tracetorch.instrument)")
        lines.append(_render(prof, opts, report))
        _say("\n".join(lines), report)
        return _exit_as(status)
    finally:
        if report is not sys.stderr:
            report.close()


def _report_job(prof: profile, opts: argparse.Namespace, status: int, report: TextIO,
                folder: str, gather: str) -> int:
    """One rank of a torchrun job, after its script: rank 0 reports and writes the merged
    profile (``-o`` is where the gather saved it; ``--chrome``: one process per rank), the
    other ranks say where their own profile went."""
    merged = prof.merged
    if merged is None:
        rank = prof.meta.get("distributed", {}).get("rank", "?")
        _say(f"tracetorch: rank {rank}: profile saved to "
             f"{printable(rank_file(gather, int(rank)))}"
             if isinstance(rank, int) else "tracetorch: no merged profile", report)
        return status
    if opts.chrome is not None:
        export_ranks_chrome_trace(gather, os.path.join(folder, opts.chrome))
        _say(f"tracetorch: wrote {printable(opts.chrome)}", report)
    attach_machine(merged, opts, report, "run")  # the job's report measures as one process's
    # The gather saved -o already; it is saved again only to carry the machine.
    output = opts.output if "machine" in merged.meta else None
    _write_outputs(merged, argparse.Namespace(**{**vars(opts), "output": output, "chrome": None}),
                   report, folder)
    _flush(sys.stdout)
    lines = [f"\ntracetorch: {printable(opts.script)} {_ended(status)} on rank 0; "
             f"merged profile of the job: {printable(opts.output or gather)}",
             _render(merged, opts, report)]
    lines.append(ranks_text(merged) or "")
    _say("\n".join(lines), report)
    return status


def _report_stream() -> TextIO:
    # Our own handle on the stderr the command started with: a script that closes sys.stderr
    # (or sys.stdout) must not cost the report.
    try:
        return open(os.dup(sys.stderr.fileno()), "w", encoding="utf-8", errors="replace",
                    closefd=True)
    except (AttributeError, OSError, ValueError):  # no real file behind it (a test's capture)
        return sys.stderr


def _flush(stream: TextIO | None) -> None:
    try:
        if stream is not None:
            stream.flush()
    except (OSError, ValueError):  # closed by the script
        pass


def _say(text: str, stream: TextIO) -> None:
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):  # even our own handle is gone: nowhere left to report
        pass


def _cmd_report(opts: argparse.Namespace) -> int:
    if opts.flat is not None and (opts.depth is not None or opts.top is not None):
        raise CliError("--depth and --top apply to the tree, not to --flat views")
    _check_outputs(opts, ("the profile read", opts.profile))
    try:
        result = ProfileResult.load(opts.profile)
    except FileNotFoundError:
        raise CliError(f"cannot open {opts.profile!r}: no such file") from None
    except OSError as err:
        raise CliError(f"cannot read {opts.profile!r}: {err.strerror}") from None
    except ValueError as err:
        raise CliError(str(err)) from None
    merged = ranks_text(result) if opts.rank is None else None
    if opts.rank is not None:
        try:
            result = rank_profile(result, opts.profile, opts.rank)
        except (OSError, ValueError) as err:
            raise CliError(str(err)) from None
    try:  # the summary then appends the bottleneck section
        attach_machine(result, opts, sys.stderr, "report")
    except ValueError as err:
        raise CliError(str(err)) from None
    if opts.ops is not None:
        try:
            print(render_op_table(result.find(opts.ops)))
        except KeyError as err:
            raise CliError(f"--ops: {err.args[0]}") from None
        return 0
    print(_render(result, opts))
    if merged is not None:
        print("\n" + merged)
    return 0 if _write_outputs(result, opts) else EXIT_USAGE


def _cmd_demo(opts: argparse.Namespace) -> int:
    _check_outputs(opts)
    run = run_demo(steps=opts.steps, progress=ProgressLine(), timeline=opts.chrome is not None)
    print(run.headline() + "\n")
    print(_render(run.profile, opts))
    return 0 if _write_outputs(run.profile, opts) else EXIT_USAGE
