"""Running a user's script as ``python script.py args...`` would: ``__name__ == "__main__"``,
``sys.argv``, ``sys.path[0]`` its folder, an absolute ``__file__``, and Python's exit status and
traceback when it ends.

SIGTERM and SIGHUP (how batch schedulers, ``torchrun`` and a closed terminal stop a job) end
the script the way Ctrl-C does, so that the profile records what ran and its reports are
written; the caller then dies of the same signal (:func:`die_of_signal`), so that whoever sent
it sees the exit status it expects.

Example:
    >>> runnable("/no/such/script.py")
    False
"""
from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from tracetorch.profiler import profile

__all__ = ("run_script", "runnable", "die_of_signal", "signal_name", "EXIT_INTERRUPTED",
           "STOP_SIGNALS")

#: Exit status of a script stopped with Ctrl-C, as a POSIX shell reports it (128 + SIGINT).
EXIT_INTERRUPTED = 130

#: The signals that stop a script with its profile saved (those this platform has).
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class _Stopped(BaseException):
    """Raised in the script by a stop signal: as KeyboardInterrupt, no ``except Exception``
    of the script catches it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def runnable(script: str) -> bool:
    """What ``python script`` runs: a file, or a folder (or zip) with a __main__.py."""
    return os.path.isfile(script) or os.path.isfile(os.path.join(script, "__main__.py"))


def run_script(prof: profile, path: str, args: Sequence[str] = ()) -> int:
    """Run the script at ``path`` as ``python path args...`` would, inside ``prof``.

    Returns the exit status Python would give: the ``sys.exit`` code, 1 after an uncaught
    exception (its traceback printed to stderr, as Python prints it), 130 after Ctrl-C; and
    ``-N`` when signal N of :data:`STOP_SIGNALS` stopped it (where the script left that signal
    to its default action), which the caller passes to :func:`die_of_signal` once the profile
    is saved. ``sys.argv`` and ``sys.path[0]`` are restored afterwards.

    Example:
        >>> import os, tempfile, tracetorch
        >>> script = os.path.join(tempfile.mkdtemp(), "hello.py")
        >>> _ = open(script, "w").write("import sys; sys.exit(len(sys.argv))")
        >>> run_script(tracetorch.profile(), script, ["a", "b"])
        3
    """
    saved_argv, saved_path = sys.argv, sys.path[0]
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    try:
        with _stop_signals_raise(), prof:
            # An absolute path, as Python gives __main__ its __file__ (3.9 and later): a script
            # that changes folder still finds its files beside itself.
            runpy.run_path(os.path.abspath(path), run_name="__main__")
        return 0
    except _Stopped as stop:
        return -stop.signum
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


@contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """While the block runs, a stop signal left to its default action (not ignored, as
    ``nohup`` ignores SIGHUP, nor handled by the caller) raises :class:`_Stopped` in it; a
    second one, while the block unwinds, is held back (the caller dies of the first)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers are the main thread's to set
        return
    stopping: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        if not stopping:
            stopping.append(signum)
            raise _Stopped(signum)

    installed = [(signum, signal.signal(signum, stop)) for signum in STOP_SIGNALS
                 if signal.getsignal(signum) is signal.SIG_DFL]
    try:
        yield
    finally:
        for signum, previous in installed:
            if signal.getsignal(signum) is stop:  # the script's own handler stays its own
                signal.signal(signum, previous)


def die_of_signal(signum: int) -> int:
    """End this process by signal ``signum`` with its default action, as it would have ended
    without tracetorch; returns the shell's status for it (128 + N) where the signal is blocked
    and the process lives on.
    """
    for stream in (sys.stdout, sys.stderr):  # what is buffered would die with the process
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed or replaced by the script
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return 128 + signum


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15: the name a shell prints.

    Example:
        >>> signal_name(signal.SIGTERM)
        'SIGTERM'
    """
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
