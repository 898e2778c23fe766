"""The ``tracetorch`` command end to end, in subprocesses: exit codes, output streams, files."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from support.processes import run_captured
from tracetorch.cli.main import main
from tracetorch.cli.progress import ProgressLine

MODEL_SCRIPT = """\
import sys
import numpy as np
from tracetorch.core import Linear, ReLU, Sequential, Tensor

print("args", sys.argv[1:])
print("name", __name__)
model = Sequential(Linear(4, 8), ReLU(), Linear(8, 2))
for _ in range(3):
    model(Tensor(np.ones((2, 4))))
{ending}
"""


def _tracetorch(*args: str, cwd: Path, command: Sequence[str] = (sys.executable, "-m",
                                                                  "tracetorch"),
                timeout: float = 120) -> subprocess.CompletedProcess:
    return run_captured([*command, *args], cwd, timeout)


def _script(tmp_path: Path, ending: str = "", name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(MODEL_SCRIPT.format(ending=textwrap.dedent(ending)))
    return path


def _one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tracetorch: error: ")
    return lines[0]


# ------------------------------------------------------------------------------------ run
@pytest.mark.slow
@pytest.mark.parametrize("prefix", [["run"], []])
def test_run_profiles_an_unmodified_script(tmp_path: Path, prefix: list[str]) -> None:
    _script(tmp_path)
    result = _tracetorch(*prefix, "train.py", "--lr", "0.1", "-o", "x", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # stdout is the script's alone; the report is on stderr.
    assert result.stdout == "args ['--lr', '0.1', '-o', 'x']\nname __main__\n"
    assert "train.py exited with status 0" in result.stderr
    assert "layers.0 (Linear)" in result.stderr
    assert "Forward FLOPs:" in result.stderr
    assert not (tmp_path / "x").exists()  # the script's -o is the script's


@pytest.mark.slow
def test_run_passes_a_double_dash_through(tmp_path: Path) -> None:
    _script(tmp_path)
    result = _tracetorch("train.py", "--", "-v", cwd=tmp_path)
    assert result.stdout.splitlines()[0] == "args ['--', '-v']"


@pytest.mark.slow
def test_run_sets_sys_path_to_the_script_folder(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "helper.py").write_text("VALUE = 42\n")
    (tmp_path / "scripts" / "main.py").write_text("import helper\nprint(helper.VALUE)\n")
    result = _tracetorch("scripts/main.py", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, "42\n")
    assert "No calls were recorded." in result.stderr


@pytest.mark.slow
def test_run_options_save_json_and_chrome_trace(tmp_path: Path) -> None:
    _script(tmp_path)
    result = _tracetorch("run", "-o", "run.json", "--chrome", "trace.json", "--depth", "1",
                         "train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "layers.0" not in result.stderr  # --depth 1
    assert "wrote run.json" in result.stderr and "wrote trace.json" in result.stderr
    trace = json.loads((tmp_path / "trace.json").read_text())
    names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert sum(name.endswith("layers.0") for name in names) == 3

    report = _tracetorch("report", "run.json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert report.stderr == ""
    assert "layers.0 (Linear)" in report.stdout
    row = next(line for line in report.stdout.splitlines() if "layers.2 (Linear)" in line)
    assert row.split()[2] == "3"  # Calls column

    flat = _tracetorch("report", "run.json", "--flat", "type", "--sort", "name", cwd=tmp_path)
    assert flat.returncode == 0, flat.stderr
    assert flat.stdout.splitlines()[0].startswith("Type")
    top = _tracetorch("report", "run.json", "--top", "2", cwd=tmp_path)
    assert "2 more rows not shown" in top.stdout


@pytest.mark.slow
def test_failing_script_is_reported_with_status_1(tmp_path: Path) -> None:
    _script(tmp_path, ending="raise RuntimeError('boom')")
    result = _tracetorch("-o", "run.json", "train.py", cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback (most recent call last):" in result.stderr
    assert "RuntimeError: boom" in result.stderr
    # The traceback starts at the script, as Python's would, without tracetorch's frames.
    assert "runpy" not in result.stderr and "cli.py" not in result.stderr
    assert "train.py exited with status 1" in result.stderr
    assert "layers.0 (Linear)" in result.stderr
    assert (tmp_path / "run.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("ending, status, message", [
    ("sys.exit(3)", 3, None),
    ("sys.exit()", 0, None),
    ("sys.exit('stopped early')", 1, "stopped early"),
    ("raise KeyboardInterrupt", 130, "KeyboardInterrupt"),
])
def test_exit_status_is_the_scripts(tmp_path: Path, ending: str, status: int,
                                    message: Any) -> None:
    _script(tmp_path, ending=ending)
    result = _tracetorch("train.py", cwd=tmp_path)
    assert result.returncode == status
    assert f"exited with status {status}" in result.stderr
    assert "layers.0 (Linear)" in result.stderr
    if message:
        assert message in result.stderr


@pytest.mark.slow
def test_missing_script_is_a_usage_error(tmp_path: Path) -> None:
    line = _one_line_error(_tracetorch("missing.py", cwd=tmp_path))
    assert "missing.py" in line and "no such file" in line


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ["run", "--depth", "0", "x.py"],
    ["run", "--sort", "biggest", "x.py"],
    ["run", "--top", "many", "x.py"],
    ["demo", "--steps", "1"],
    ["report"],
    [],
    ["-o", "/no/such/folder/run.json", "x.py"],
])
def test_bad_arguments_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "x.py").write_text("print('must not run')\n")
    result = _tracetorch(*args, cwd=tmp_path)
    _one_line_error(result)
    assert result.stdout == ""


# ------------------------------------------------------------------------------------ report
@pytest.mark.slow
@pytest.mark.parametrize("content, expected", [
    ("{not json", "not valid JSON"),
    ('{"format": "something-else"}', "not a tracetorch profile"),
    ("[1, 2, 3]", "bad.json"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
])
def test_corrupt_or_foreign_json_is_a_usage_error(tmp_path: Path, content: Any,
                                                  expected: str) -> None:
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    line = _one_line_error(_tracetorch("report", "bad.json", cwd=tmp_path))
    assert expected in line and "bad.json" in line


@pytest.mark.slow
def test_report_of_a_missing_file_or_a_folder(tmp_path: Path) -> None:
    assert "no such file" in _one_line_error(_tracetorch("report", "nope.json", cwd=tmp_path))
    assert "nope.json" in _one_line_error(_tracetorch("report", "nope.json", cwd=tmp_path))
    _one_line_error(_tracetorch("report", ".", cwd=tmp_path))


@pytest.mark.slow
def test_flat_report_refuses_tree_options(tmp_path: Path, capsys: Any) -> None:
    _script(tmp_path)
    assert _tracetorch("-o", "run.json", "train.py", cwd=tmp_path).returncode == 0
    status = main(["report", str(tmp_path / "run.json"), "--flat", "module", "--depth", "2"])
    assert status == 2
    assert "--flat" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ demo
@pytest.mark.slow
def test_demo_shows_forward_backward_optimizer_and_steps(tmp_path: Path) -> None:
    result = _tracetorch("demo", "--steps", "4", "-o", "demo.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "4 steps (step 1 is warm-up, not recorded)" in out
    for row in ("layers.0 (Conv2d)", "layers.7 (Linear)", "CrossEntropyLoss", "backward",
                "SGD.step"):
        assert row in out
    steps = next(line for line in out.splitlines() if line.startswith("Steps:"))
    assert "3 steps" in steps and "p50" in steps and "p90" in steps and "spread" in steps
    phases = next(line for line in out.splitlines() if line.startswith("Step phases:"))
    assert "forward" in phases and "backward" in phases and "optimizer" in phases
    # Not a terminal: no progress line, only the note about the saved file.
    assert result.stderr == "tracetorch: wrote demo.json\n"
    report = _tracetorch("report", "demo.json", "--sort", "call_order", cwd=tmp_path)
    assert "Step phases:" in report.stdout


# ------------------------------------------------------------------------------------ misc
@pytest.mark.slow
def test_console_script(tmp_path: Path) -> None:
    exe = shutil.which("tracetorch")
    if exe is None:
        pytest.skip("the tracetorch console script is not on PATH")
    _script(tmp_path, ending="sys.exit(4)")
    result = _tracetorch("train.py", "a", cwd=tmp_path, command=[exe])
    assert result.returncode == 4
    assert result.stdout.startswith("args ['a']")
    version = _tracetorch("--version", cwd=tmp_path, command=[exe])
    assert version.returncode == 0 and version.stdout.startswith("tracetorch ")


def test_run_restores_sys_argv_and_path_in_process(tmp_path: Path, capsys: Any) -> None:
    script = _script(tmp_path, ending="sys.exit(5)")
    argv, path0 = list(sys.argv), sys.path[0]
    assert main(["run", str(script), "x"]) == 5
    assert (sys.argv, sys.path[0]) == (argv, path0)
    captured = capsys.readouterr()
    assert "args ['x']" in captured.out
    assert "exited with status 5" in captured.err


@pytest.mark.slow
def test_run_profiles_a_script_that_imports_torch(tmp_path: Path,
                                                  torch_installed: None) -> None:
    (tmp_path / "torch_script.py").write_text(textwrap.dedent("""\
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        model(torch.ones(2, 4)).sum().backward()
        print("done")
    """))
    result = _tracetorch("torch_script.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert "0 (Linear)" in result.stderr


# ------------------------------------------------------------------------------------ progress
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_draws_only_on_a_terminal() -> None:
    terminal, pipe = _Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        line = ProgressLine(stream)
        line.show("step 1/10  loss 2.303")
        line.show("step 2/10")
        line.clear()
    assert pipe.getvalue() == ""
    drawn = terminal.getvalue()
    assert drawn.startswith("\rstep 1/10  loss 2.303\rstep 2/10 ")
    assert drawn.endswith("\r" + " " * len("step 1/10  loss 2.303") + "\r")


# ----------------------------------------------------------------------- run: what scripts do
@pytest.mark.slow
@pytest.mark.parametrize("closing", ["sys.stdout.close()", "sys.stderr.close()",
                                     "sys.stdout.close(); sys.stderr.close()"])
def test_a_script_that_closes_its_streams_keeps_its_report_and_file(tmp_path: Path,
                                                                    closing: str) -> None:
    _script(tmp_path, ending=closing)
    result = _tracetorch("run", "-o", "run.json", "train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "layers.0 (Linear)" in result.stderr and "wrote run.json" in result.stderr
    assert tracetorch_load(tmp_path / "run.json").find("layers.0").calls == 3


@pytest.mark.slow
def test_a_forking_script_is_reported_by_the_parent_only(tmp_path: Path) -> None:
    _script(tmp_path, ending="""
        import os
        pid = os.fork()
        if pid:
            os.waitpid(pid, 0)
            model(Tensor(np.ones((2, 4))))  # a fourth call, in the parent only
        """)
    result = _tracetorch("run", "-o", "run.json", "train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("exited with status") == 1
    assert tracetorch_load(tmp_path / "run.json").find("layers.0").calls == 4


@pytest.mark.slow
def test_a_relative_output_is_written_where_the_command_started(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    _script(tmp_path, ending="import os; os.chdir('elsewhere')")
    result = _tracetorch("run", "-o", "run.json", "--chrome", "trace.json", "train.py",
                         cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run.json").is_file() and (tmp_path / "trace.json").is_file()
    assert not (tmp_path / "elsewhere" / "run.json").exists()


@pytest.mark.slow
def test_a_folder_with_a_main_runs_as_python_runs_it(tmp_path: Path) -> None:
    package = tmp_path / "app"
    package.mkdir()
    _script(package, name="__main__.py")
    result = _tracetorch("run", "app", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "name __main__" in result.stdout and "layers.0 (Linear)" in result.stderr


@pytest.mark.slow
def test_run_without_a_script_says_how_to_call_it(tmp_path: Path) -> None:
    line = _one_line_error(_tracetorch("run", cwd=tmp_path))
    assert "which script?" in line and "tracetorch run [options] script.py" in line


def tracetorch_load(path: Path) -> Any:
    import tracetorch

    return tracetorch.load(path)
