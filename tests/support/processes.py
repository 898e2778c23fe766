"""Running a command in a subprocess the way the end-to-end tests do."""
from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ("run_captured",)


def run_captured(argv: Sequence[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``argv`` in ``cwd`` with text stdout and stderr captured and stdin closed.

    A closed stdin keeps a command that would prompt from waiting on the test runner.
    """
    return subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
