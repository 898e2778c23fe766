"""``tracetorch.load`` and ``tracetorch report`` refuse what is no regular file, and files too
large to be a profile, with a ValueError naming the file, at once (issue 29).

``/dev/zero`` was read for ever (and into memory), a FIFO with no writer blocked ``open``.
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import tracetorch as tt
from tracetorch.records import jsonread
from tracetorch.records.result import ProfileResult
from tracetorch.records.tree import CallNode

needs_posix = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs or /dev here")


def load_in_time(path: str, seconds: float = 20) -> BaseException | None:
    """What ``tt.load(path)`` raised, failing the test when it has not returned in time (a
    thread, not this one: a load that blocks must not block the test run)."""
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            tt.load(path)
        except BaseException as err:  # noqa: B902 - handed to the test
            outcome.append(err)
        else:
            outcome.append(None)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(seconds)
    assert outcome, f"tt.load({path!r}) did not return within {seconds} s"
    return outcome[0]


@needs_posix
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    err = load_in_time(str(fifo))
    assert isinstance(err, ValueError)
    assert str(fifo) in str(err) and "FIFO" in str(err)


def test_a_folder_is_refused_as_no_profile(tmp_path: Path) -> None:
    err = load_in_time(str(tmp_path))
    assert isinstance(err, ValueError)
    assert str(tmp_path) in str(err) and "folder" in str(err)


def test_a_file_over_the_size_limit_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "run.json"
    ProfileResult(CallNode.root()).save(str(path))
    size = path.stat().st_size
    monkeypatch.setattr(jsonread, "MAX_PROFILE_BYTES", size)
    assert tt.load(str(path)).total_flops == 0  # exactly at the limit: read
    monkeypatch.setattr(jsonread, "MAX_PROFILE_BYTES", size - 1)
    with pytest.raises(ValueError, match="larger than") as caught:
        tt.load(str(path))
    assert str(path) in str(caught.value)


def _memory_cap() -> None:  # a load that reads /dev/zero into memory fails instead of swapping
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.slow
@needs_posix
@pytest.mark.parametrize("command", [
    "import tracetorch; tracetorch.load('/dev/zero')",
    "from tracetorch.cli.main import main; raise SystemExit(main(['report', '/dev/zero']))",
])
def test_dev_zero_is_refused_at_once(command: str) -> None:
    result = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL, preexec_fn=_memory_cap)
    assert "/dev/zero: not a tracetorch profile: a character device" in result.stderr
    assert "MemoryError" not in result.stderr
    if "main(" in command:  # the command's usage error: one line, status 2
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1
    else:
        assert "ValueError" in result.stderr
