"""Every code block of the README runs as a new user would copy it (``support/docblocks.py``
says how), writes nothing a clone's ``git status`` would show, and the PyTorch sample table is
what its code prints."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.docblocks import (
    ROOT,
    DocBlock,
    block_id,
    blocks,
    commands,
    new_files,
    not_ignored,
    run_command,
    run_python,
)
from test_report_table import cells

README = ROOT / "README.md"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One folder for the page, as for a user typing the commands in turn.
    folder = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "examples", folder / "examples")
    return folder


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readme-scripts")


def test_the_readme_has_code_to_run():
    assert len(blocks(README, "python")) >= 2 and len(commands(README)) >= 1


def test_the_readme_fits_a_few_screens():
    # Issue 31: the set-up commands first, the whole page under ~250 lines; the rest is docs/.
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    assert lines[2:6] == [
        "```bash",
        "pip install -e . && tracetorch demo                         # the main job: train and "
        "profile a numpy CNN",
        "pip install -e '.[test]' && python -m pytest -q             # the tests",
        "```"]


@pytest.mark.slow
@pytest.mark.parametrize("block", blocks(README, "python"), ids=block_id)
def test_python_block_runs(block: DocBlock, workdir: Path, scripts: Path,
                           torch_installed: None) -> None:
    before = set(workdir.rglob("*"))
    run_python(block, workdir, scripts)
    assert not_ignored(new_files(workdir, before)) == []


@pytest.mark.slow
@pytest.mark.parametrize("block", commands(README), ids=block_id)
def test_command_runs(block: DocBlock, workdir: Path, torch_installed: None) -> None:
    before = set(workdir.rglob("*"))
    run_command(block, workdir)
    assert not_ignored(new_files(workdir, before)) == []


@pytest.mark.slow
def test_torch_sample_table_is_what_the_code_prints(tmp_path: Path, torch_installed: None,
                                                    monkeypatch: pytest.MonkeyPatch):
    # The PyTorch training loop and the table pasted under it: same columns, rows, calls and
    # counts (FLOPs, MACs, backward FLOPs are exact); the times are the machine's. Printed to a
    # pipe, as the sample was: the default width. os.environ is passed explicitly: under pytest
    # a child started without env= was seen to get COLUMNS=80, set outside os.environ.
    monkeypatch.delenv("COLUMNS", raising=False)
    text = README.read_text()
    found = re.search(r"^```python\n(import torch\n.*?)^```\n[^`]*^```text\n(.*?)^```", text,
                      re.S | re.M)
    assert found is not None
    script = tmp_path / "loop.py"
    script.write_text(found.group(1))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    counted = ("Name", "Calls", "FLOPs", "MACs", "Bwd FLOPs")
    printed, sample = cells(done.stdout), cells(found.group(2))
    assert list(printed[0]) == list(sample[0]), done.stdout  # the headers
    # Rows are sorted by time, which is the machine's: compare them as sets.
    assert sorted([r[c] for c in counted] for r in printed) == sorted(
        [r[c] for c in counted] for r in sample)
