"""``tracetorch run`` keeps the user's data (issue 29): outputs checked before the script runs,
no input overwritten, failures after the run reported with the script's status kept, an
absolute ``__file__``, and the profile saved when SIGTERM or SIGHUP stops the script."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tracetorch as tt
from support.processes import run_captured
from tracetorch.cli.outputs import check_outputs

SCRIPT = """\
import os, sys
import numpy as np
from tracetorch.core import Linear, Sequential, Tensor
print("script ran", flush=True)
model = Sequential(Linear(4, 8), Linear(8, 2))
model(Tensor(np.ones((2, 4))))
{ending}
"""


def tracetorch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_captured([sys.executable, "-m", "tracetorch", *args], cwd, 120)


def script(tmp_path: Path, ending: str = "", name: str = "s.py") -> Path:
    path = tmp_path / name
    path.write_text(SCRIPT.format(ending=ending))
    return path


def outputs(**paths: str) -> argparse.Namespace:
    names = ("output", "chrome", "html", "speedscope", "csv")
    return argparse.Namespace(**{name: paths.get(name) for name in names})


# ------------------------------------------------------------------ checked before the run
@pytest.mark.parametrize("path, problem", [
    ("sub/", "is a folder"),           # a folder's name, though no such folder exists
    ("here/", "is a folder"),
    ("here", "is a folder"),
    ("sub/run.csv", "does not exist"),
    ("", "is a folder"),
])
def test_an_output_that_names_a_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  path: str, problem: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()
    with pytest.raises(ValueError, match=problem) as caught:
        check_outputs(outputs(csv=path), [])
    assert str(caught.value).startswith("--csv: ")


def test_an_output_that_is_an_input_or_another_output_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("")
    with pytest.raises(ValueError, match="'s.py' is the script"):
        check_outputs(outputs(output="s.py"), [("the script", "s.py")])
    with pytest.raises(ValueError, match="is the script"):  # the same file by another name
        check_outputs(outputs(html=str(tmp_path / "." / "s.py")), [("the script", "s.py")])
    with pytest.raises(ValueError, match="--html: './r.json' is also the --output file"):
        check_outputs(outputs(output="r.json", html="./r.json"), [])
    check_outputs(outputs(output="r.json", html="r.html"), [("the script", "s.py")])


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["--csv", "sub/"],
    ["-o", "s.py"],
    ["--html", "./s.py"],
])
def test_run_refuses_bad_outputs_before_the_script_runs(tmp_path: Path, args: list[str]) -> None:
    path = script(tmp_path)
    before = path.read_text()
    result = tracetorch("run", *args, "s.py", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "script ran" not in result.stdout
    assert result.stderr.startswith("tracetorch: error: ")
    assert path.read_text() == before  # the user's script is still theirs


@pytest.mark.slow
def test_report_refuses_to_overwrite_the_profile_it_reads(tmp_path: Path) -> None:
    script(tmp_path)
    assert tracetorch("-o", "r.json", "s.py", cwd=tmp_path).returncode == 0
    saved = (tmp_path / "r.json").read_text()
    result = tracetorch("report", "r.json", "--csv", "r.json", cwd=tmp_path)
    assert result.returncode == 2 and "is the profile read" in result.stderr
    assert (tmp_path / "r.json").read_text() == saved


# ------------------------------------------------------------------ failures after the run
@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_an_output_that_fails_keeps_the_scripts_status_and_the_other_outputs(
        tmp_path: Path) -> None:
    script(tmp_path, "sys.exit(4)")
    result = tracetorch("run", "-o", "/dev/full", "--html", "r.html", "--csv", "r.csv", "s.py",
                        cwd=tmp_path)
    assert result.returncode == 4, result.stderr
    assert ("tracetorch: error: --output: cannot write '/dev/full': No space left on device"
            in result.stderr)
    assert (tmp_path / "r.html").stat().st_size > 0
    assert "layers.0" in (tmp_path / "r.csv").read_text()
    assert "s.py exited with status 4" in result.stderr
    assert "layers.0 (Linear)" in result.stderr  # the report itself


# ------------------------------------------------------------------ the script as Python runs it
@pytest.mark.slow
def test_file_is_absolute_so_a_script_that_changes_folder_finds_its_data(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "data.txt").write_text("the data\n")
    script(tmp_path / "job", ending="""
print("file", __file__)
os.chdir(os.path.dirname(os.path.dirname(__file__)) + "/..")
print(open(os.path.join(os.path.dirname(__file__), "data.txt")).read().strip())
""")
    result = tracetorch("run", "job/s.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"file {tmp_path / 'job' / 's.py'}" in result.stdout  # as `python job/s.py` says
    assert "the data" in result.stdout


# ------------------------------------------------------------------ stopped by a signal
WAIT_FOR_INPUT = 'print("ready", flush=True)\nsys.stdin.read()\n'


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_saves_the_profile_and_ends_with_that_signal(
        tmp_path: Path, stop: signal.Signals) -> None:
    script(tmp_path, WAIT_FOR_INPUT)
    # The signal at its default in the child, as in a terminal: a test run under nohup
    # ignores SIGHUP, and an ignored signal is left ignored (as Python itself would).
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracetorch", "run", "-o", "r.json", "--html", "r.html", "s.py"],
        cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=lambda: signal.signal(stop, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        while proc.stdout.readline().strip() != "ready":  # the model has run: stop it now
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -stop, err  # died of the signal, as without tracetorch
    assert f"s.py was stopped by {stop.name}" in err
    assert tt.load(str(tmp_path / "r.json")).find("layers.1").calls == 1
    assert (tmp_path / "r.html").stat().st_size > 0


@pytest.mark.slow
def test_a_scripts_own_sigterm_handler_is_left_to_it(tmp_path: Path) -> None:
    script(tmp_path, "import signal\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
           + WAIT_FOR_INPUT)
    proc = subprocess.Popen([sys.executable, "-m", "tracetorch", "run", "s.py"], cwd=tmp_path,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        while proc.stdout.readline().strip() != "ready":
            assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 7, err
    assert "s.py exited with status 7" in err
