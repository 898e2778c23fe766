"""The ``tracetorch`` command (also ``python -m tracetorch``).

::

    tracetorch run [options] script.py [args...]    profile an unmodified script
    tracetorch script.py [args...]                  the same: a first word that is no command
    tracetorch report run.json [options]            print a profile saved with -o
    tracetorch demo [--steps N] [options]           profile a small CNN training run
    tracetorch calibrate [--framework F] [--refresh] measure this machine's roofline (cached)

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
import runpy
import sys
import traceback
from collections.abc import Sequence
from typing import Callable, NoReturn, TextIO

import tracetorch
from tracetorch.cli.demo import run_demo
from tracetorch.cli.machine import (
    add_calibrate_command,
    add_machine_options,
    machine_from_options,
)
from tracetorch.cli.progress import ProgressLine
from tracetorch.profiler import profile
from tracetorch.report.chrome import export_chrome_trace
from tracetorch.report.jsonio import save_result
from tracetorch.report.table import FLAT_VIEWS, SORT_KEYS, render_flat, render_table
from tracetorch.result import ProfileResult

__all__ = ("main", "run_script", "CliError", "COMMANDS")

#: The subcommands; any other first argument is taken as the script to ``run``.
COMMANDS = ("run", "report", "demo", "calibrate")

#: Exit status of a script stopped with Ctrl-C, as a POSIX shell reports it (128 + SIGINT).
EXIT_INTERRUPTED = 130
#: Exit status for errors of the command itself, as argparse uses.
EXIT_USAGE = 2

_RUN_EPILOG = """\
The script runs as `python script.py args...` would run it (__name__ == "__main__", sys.argv,
sys.path[0] = its folder), with every tracetorch.core and torch.nn layer call recorded; torch may
be imported by the script itself. The report goes to stderr when the script ends, also when it
raises, calls sys.exit or is interrupted; the script's stdout is left untouched. The exit status
is the script's: its sys.exit code, 1 after an uncaught exception (whose traceback is printed),
130 after Ctrl-C."""


class CliError(Exception):
    """A usage error: printed as one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, raised rather than printed."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see '{self.prog} --help')")


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def _parser() -> _Parser:
    view = _Parser(add_help=False)
    view.add_argument("--depth", type=_at_least(1), metavar="N",
                      help="show the tree down to this level (1 = top-level calls only)")
    view.add_argument("--sort", choices=SORT_KEYS, default="total",
                      help="order of sibling rows (default: total time)")
    view.add_argument("--top", type=_at_least(1), metavar="N", help="show at most N rows")
    output = _Parser(add_help=False)
    output.add_argument("-o", "--output", metavar="RUN.json",
                        help="also save the profile as JSON (read it with `tracetorch report`)")
    output.add_argument("--chrome", metavar="TRACE.json",
                        help="also record every call and write a Chrome/Perfetto trace")

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
    run.set_defaults(handler=_cmd_run)

    report = commands.add_parser("report", parents=[view],
                                 help="print a profile saved with -o/--output to stdout")
    report.add_argument("profile", metavar="RUN.json", help="a profile saved with -o/--output")
    report.add_argument("--flat", choices=FLAT_VIEWS,
                        help="one row per layer type or per module instead of the tree")
    add_machine_options(report)
    report.set_defaults(handler=_cmd_report)

    demo = commands.add_parser("demo", parents=[view, output],
                               help="train a small tracetorch.core CNN on synthetic data under "
                                    "the profiler; report on stdout")
    demo.add_argument("--steps", type=_at_least(2), default=20, metavar="N",
                      help="training steps, the first one a warm-up that is not recorded "
                           "(default: 20)")
    demo.set_defaults(handler=_cmd_demo)
    add_calibrate_command(commands)
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
        print(f"tracetorch: error: {err}", file=sys.stderr)
        return EXIT_USAGE


def _script_args(argv: list[str], script: str, parsed: list[str]) -> list[str]:
    # argparse drops a "--" right after the script name; the script must see it, as under python.
    tail = len(argv) - len(parsed)
    if tail >= 2 and argv[tail - 1] == "--" and argv[tail - 2] == script:
        return argv[tail - 1:]
    return parsed


# ------------------------------------------------------------------------------------ report
def _render(result: ProfileResult, opts: argparse.Namespace) -> str:
    flat = getattr(opts, "flat", None)
    if flat is not None:
        return render_flat(result, view=flat, sort_by=opts.sort)
    return render_table(result, sort_by=opts.sort, depth=opts.depth, row_limit=opts.top)


def _check_outputs(opts: argparse.Namespace) -> None:
    # Checked before anything runs, so a typo in a path does not cost the whole run.
    for option, path in (("--output", opts.output), ("--chrome", opts.chrome)):
        if path is None:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise CliError(f"{option}: folder {folder!r} does not exist")
        if os.path.isdir(path):
            raise CliError(f"{option}: {path!r} is a folder")


def _write_outputs(result: ProfileResult, opts: argparse.Namespace,
                   stream: TextIO | None = None, folder: str = "") -> None:
    for option, path, write in (("--output", opts.output, save_result),
                                ("--chrome", opts.chrome, export_chrome_trace)):
        if path is None:
            continue
        try:
            write(result, os.path.join(folder, path))
        except OSError as err:
            raise CliError(f"{option}: cannot write {path!r}: {err.strerror}") from None
        _say(f"tracetorch: wrote {path}", stream or sys.stderr)


# ------------------------------------------------------------------------------------ commands
def _cmd_run(opts: argparse.Namespace) -> int:
    if opts.script is None:
        raise CliError("run: which script? usage: tracetorch run [options] script.py [args...]")
    if not _runnable(opts.script):
        raise CliError(f"cannot open script {opts.script!r}: no such file (or folder with a "
                       f"__main__.py)")
    _check_outputs(opts)
    folder = os.getcwd()  # -o and --chrome are relative to it, wherever the script goes
    report = _report_stream()  # the script may close or replace sys.stderr
    try:
        prof = profile(timeline=opts.chrome is not None)
        started_in = os.getpid()
        status = run_script(prof, opts.script, opts.args)
        if os.getpid() != started_in:
            return status  # a child the script forked: the parent reports, once
        _write_outputs(prof, opts, report, folder)
        _flush(sys.stdout)  # the script's output first, then the report
        lines = [f"\ntracetorch: {opts.script} exited with status {status}"]
        if not prof.root.children:
            lines.append("tracetorch: no layer call was recorded (tracetorch.core and torch.nn "
                         "layers are, and code decorated with @tracetorch.instrument)")
        lines.append(_render(prof, opts))
        _say("\n".join(lines), report)
        return status
    finally:
        if report is not sys.stderr:
            report.close()


def _runnable(script: str) -> bool:
    # What ``python script`` runs: a file, or a folder (or zip) with a __main__.py.
    return os.path.isfile(script) or os.path.isfile(os.path.join(script, "__main__.py"))


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


def run_script(prof: profile, path: str, args: Sequence[str] = ()) -> int:
    """Run the script at ``path`` as ``python path args...`` would, inside ``prof``.

    Returns the exit status Python would give: the ``sys.exit`` code, 1 after an uncaught
    exception (its traceback printed to stderr, as Python prints it), 130 after Ctrl-C.
    ``sys.argv`` and ``sys.path[0]`` are restored afterwards.

    Example:
        >>> import os, tempfile
        >>> script = os.path.join(tempfile.mkdtemp(), "hello.py")
        >>> _ = open(script, "w").write("import sys; sys.exit(len(sys.argv))")
        >>> run_script(tracetorch.profile(), script, ["a", "b"])
        3
    """
    saved_argv, saved_path = sys.argv, sys.path[0]
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    try:
        with prof:
            runpy.run_path(path, run_name="__main__")
        return 0
    except SystemExit as exc:
        return _exit_status(exc.code)
    except KeyboardInterrupt:
        _print_traceback(path)
        return EXIT_INTERRUPTED
    except BaseException:  # noqa: B902 - anything the script raises ends it, as under python
        _print_traceback(path)
        return 1
    finally:
        sys.argv = saved_argv
        sys.path[0] = saved_path


def _exit_status(code: object) -> int:
    # What the interpreter does with SystemExit's argument.
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print_traceback(script: str) -> None:
    """Print the current exception as Python would, without tracetorch's and runpy's frames."""
    exc_type, exc, tb = sys.exc_info()
    target = os.path.abspath(script)
    start = tb
    while start is not None and os.path.abspath(start.tb_frame.f_code.co_filename) != target:
        start = start.tb_next
    if start is None and not isinstance(exc, SyntaxError):
        start = tb  # raised before the script's first line ran: keep every frame
    traceback.print_exception(exc_type, exc, start)


def _cmd_report(opts: argparse.Namespace) -> int:
    if opts.flat is not None and (opts.depth is not None or opts.top is not None):
        raise CliError("--depth and --top apply to the tree, not to --flat views")
    try:
        result = ProfileResult.load(opts.profile)
    except FileNotFoundError:
        raise CliError(f"cannot open {opts.profile!r}: no such file") from None
    except OSError as err:
        raise CliError(f"cannot read {opts.profile!r}: {err.strerror}") from None
    except ValueError as err:
        raise CliError(str(err)) from None
    try:
        machine = machine_from_options(opts)
    except ValueError as err:
        raise CliError(str(err) if str(err).startswith("--") else f"--{err}") from None
    if machine is not None:  # the summary then appends the bottleneck section
        result.meta["machine"] = machine.to_dict()
    print(_render(result, opts))
    return 0


def _cmd_demo(opts: argparse.Namespace) -> int:
    _check_outputs(opts)
    run = run_demo(steps=opts.steps, progress=ProgressLine(), timeline=opts.chrome is not None)
    print(run.headline() + "\n")
    print(_render(run.profile, opts))
    _write_outputs(run.profile, opts)
    return 0
