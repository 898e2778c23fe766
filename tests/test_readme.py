"""Every code block of the README runs as a new user would copy it: each ``python`` block on its
own in a fresh interpreter, each ``bash`` line as a command (the install and test commands of
the set-up block excepted: CI has just run them), in a folder holding a copy of ``examples/``."""
from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from support.processes import run_captured

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def _blocks(language: str) -> list[tuple[int, str]]:
    text = README.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(2))
            for m in _BLOCK.finditer(text) if m.group(1) == language]


def _commands() -> list[tuple[int, str]]:
    commands = []
    for line_no, block in _blocks("bash"):
        for offset, line in enumerate(block.splitlines()):
            command = line.split("  #")[0].strip()
            parts = [p.strip() for p in command.split("&&")]
            kept = [p for p in parts if p and not p.startswith(("pip install", "python -m pytest"))]
            if kept:
                commands.append((line_no + 1 + offset, " && ".join(kept)))
    return commands


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One folder for the module, as for a user typing the commands in turn: `tracetorch report
    # run.json` reads what the `run -o run.json` line before it wrote.
    folder = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "examples", folder / "examples")
    return folder


def test_the_readme_has_code_to_run():
    assert len(_blocks("python")) >= 4 and len(_commands()) >= 4


@pytest.mark.slow
@pytest.mark.parametrize("line_no,code", _blocks("python"), ids=lambda v: str(v)[:12])
def test_python_block_runs(line_no: int, code: str, workdir: Path, torch_installed: None):
    script = workdir / f"readme_block_{line_no}.py"
    script.write_text(code)
    done = run_captured([sys.executable, str(script)], workdir, timeout=300)
    assert done.returncode == 0, f"README.md line {line_no}:\n{done.stdout}\n{done.stderr}"


@pytest.mark.slow
@pytest.mark.parametrize("line_no,command", _commands(), ids=lambda v: str(v)[:40])
def test_command_runs(line_no: int, command: str, workdir: Path, torch_installed: None):
    for part in command.split(" && "):
        argv = shlex.split(part)
        if argv[0] == "python":
            argv[0] = sys.executable
        elif argv[0] == "tracetorch":
            argv[:1] = [sys.executable, "-m", "tracetorch"]
        done = run_captured(argv, workdir, timeout=300)
        assert done.returncode == 0, (
            f"README.md line {line_no}: {part}\n{done.stdout}\n{done.stderr}")
