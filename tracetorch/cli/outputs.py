"""The files a command writes besides its report (``-o``, ``--chrome``, ``--html``,
``--speedscope``, ``--csv``): checked before anything runs, written after.

:func:`check_outputs` refuses, before the script runs, every path that cannot be written: a
folder (also a name ending in ``/``), a folder that does not exist, a place without write
permission, a path given twice, and a path that is one of the command's inputs (the script,
the profile read), which writing would destroy. What no check can know beforehand (a full disk,
``/dev/full``) fails when written: :func:`write_outputs` then says so and writes the others, and
the command keeps its status (``run``: the script's).

Example:
    >>> import argparse
    >>> opts = argparse.Namespace(output="run.json", chrome=None, html=None, speedscope=None,
    ...                           csv="run.json")
    >>> check_outputs(opts, [])
    Traceback (most recent call last):
    ...
    ValueError: --csv: 'run.json' is also the --output file
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Sequence
from typing import TextIO

from tracetorch.records.result import ProfileResult
from tracetorch.text.units import printable

__all__ = ("OUTPUTS", "check_outputs", "write_outputs")

#: Each output option, its attribute on the parsed options, and the format it writes
#: (:meth:`ProfileResult.export`'s name for it).
OUTPUTS: tuple[tuple[str, str, str], ...] = (
    ("--output", "output", "json"),
    ("--chrome", "chrome", "chrome"),
    ("--html", "html", "html"),
    ("--speedscope", "speedscope", "speedscope"),
    ("--csv", "csv", "csv"),
)


def _given(opts: argparse.Namespace) -> Iterator[tuple[str, str, str]]:
    for option, attribute, format in OUTPUTS:
        path = getattr(opts, attribute, None)
        if path is not None:
            yield option, path, format


def check_outputs(opts: argparse.Namespace, inputs: Sequence[tuple[str, str]]) -> None:
    """Refuse the output paths of ``opts`` that cannot be written, or must not be: each a
    file in an existing, writable folder, none a folder, none given twice, none one of the
    ``inputs`` (``(what, path)`` pairs: ``("the script", "train.py")``).

    Raises:
        ValueError: naming the option, the path and the problem.
    """
    seen: list[tuple[str, str]] = []
    for option, path, _ in _given(opts):
        shown = repr(printable(path))
        if not path or path.endswith(("/", os.sep)) or os.path.isdir(path):
            raise ValueError(f"{option}: {shown} is a folder; give a file name")
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ValueError(f"{option}: folder {printable(folder)!r} does not exist")
        if os.path.exists(path):
            if not os.access(path, os.W_OK):
                raise ValueError(f"{option}: cannot write {shown}: permission denied")
        elif not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(f"{option}: cannot create {shown}: folder "
                             f"{printable(folder)!r} is not writable")
        for what, other in inputs:
            if _same_file(path, other):
                raise ValueError(f"{option}: {shown} is {what}; writing it would overwrite it")
        for other_option, other in seen:
            if _same_file(path, other):
                raise ValueError(f"{option}: {shown} is also the {other_option} file")
        seen.append((option, path))


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): compare the names they resolve to
        return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def write_outputs(result: ProfileResult, opts: argparse.Namespace, stream: TextIO,
                  folder: str = "") -> bool:
    """Write every output of ``opts`` (relative paths under ``folder``), saying on ``stream``
    what was written and what could not be; False when one could not (the others are written
    all the same)."""
    written = True
    for option, path, format in _given(opts):
        try:
            result.export(format, os.path.join(folder, path))
        except OSError as err:
            written = False
            _say(f"tracetorch: error: {option}: cannot write {printable(path)!r}: "
                 f"{err.strerror or err}", stream)
        else:
            _say(f"tracetorch: wrote {printable(path)}", stream)
    return written


def _say(text: str, stream: TextIO) -> None:
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):  # the stream is gone: nowhere left to say it
        pass
