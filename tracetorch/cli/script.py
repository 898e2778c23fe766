"""Running a user's script as ``python script.py args...`` would: ``__name__ == "__main__"``,
``sys.argv``, ``sys.path[0]`` its folder, and Python's exit status and traceback when it ends.

Example:
    >>> runnable("/no/such/script.py")
    False
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback
from collections.abc import Sequence

from tracetorch.profiler import profile

__all__ = ("run_script", "runnable", "EXIT_INTERRUPTED")

#: Exit status of a script stopped with Ctrl-C, as a POSIX shell reports it (128 + SIGINT).
EXIT_INTERRUPTED = 130


def runnable(script: str) -> bool:
    """What ``python script`` runs: a file, or a folder (or zip) with a __main__.py."""
    return os.path.isfile(script) or os.path.isfile(os.path.join(script, "__main__.py"))


def run_script(prof: profile, path: str, args: Sequence[str] = ()) -> int:
    """Run the script at ``path`` as ``python path args...`` would, inside ``prof``.

    Returns the exit status Python would give: the ``sys.exit`` code, 1 after an uncaught
    exception (its traceback printed to stderr, as Python prints it), 130 after Ctrl-C.
    ``sys.argv`` and ``sys.path[0]`` are restored afterwards.

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
