"""Running the code of a Markdown page as a new user would copy it (the README and docs/*.md).

Each ``python`` block runs on its own in a fresh interpreter; each line of a ``bash`` block is a
command (``pip install`` and ``python -m pytest`` parts excepted: CI has just run them; ``  #``
starts a comment); other blocks are not run: ``text`` and unnamed ones are printed output,
``sh`` ones are commands on the clone itself (lint, types, the suite), which CI runs. The blocks
of one page run in turn in one folder holding a copy of ``examples/``, so a ``tracetorch report
run.json`` reads what the page's ``run -o run.json`` line before it wrote.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from support.processes import run_captured

__all__ = ("ROOT", "DocBlock", "block_id", "blocks", "commands", "run_python", "run_command",
           "new_files", "not_ignored")

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_SKIPPED = ("pip install", "python -m pytest")

DocBlock = tuple[str, int, str]  # (page relative to ROOT, line of its first code line, code)


def block_id(block: DocBlock) -> str:
    """A test id naming the page and line: ``docs/flops.md:12``."""
    return f"{block[0]}:{block[1]}"


def blocks(page: Path, language: str) -> list[DocBlock]:
    """The ``language`` blocks of ``page``, each with the line number of its first code line."""
    text = page.read_text()
    name = page.relative_to(ROOT).as_posix()
    return [(name, text[:m.start()].count("\n") + 2, m.group(2))
            for m in _BLOCK.finditer(text) if m.group(1) == language]


def commands(page: Path) -> list[DocBlock]:
    """The shell commands of ``page``'s ``bash`` blocks, one per line, as a user types them."""
    found = []
    for name, line_no, block in blocks(page, "bash"):
        for offset, line in enumerate(block.splitlines()):
            parts = [p.strip() for p in line.split("  #")[0].split("&&")]
            kept = [p for p in parts if p and not p.startswith(_SKIPPED)]
            if kept:
                found.append((name, line_no + offset, " && ".join(kept)))
    return found


def run_python(block: DocBlock, workdir: Path, scripts: Path) -> None:
    """Run a ``python`` block in ``workdir`` from a script kept outside it."""
    name, line_no, code = block
    script = scripts / f"{name.replace('/', '_')}_{line_no}.py"
    script.write_text(code)
    done = run_captured([sys.executable, str(script)], workdir, timeout=300)
    assert done.returncode == 0, f"{name} line {line_no}:\n{done.stdout}\n{done.stderr}"


def run_command(block: DocBlock, workdir: Path) -> None:
    """Run a command line (``a && b``) in ``workdir``: ``python`` and ``tracetorch`` are this
    interpreter's, as in the environment the tests run in."""
    name, line_no, command = block
    for part in command.split(" && "):
        argv = shlex.split(part)
        if argv[0] == "python":
            argv[0] = sys.executable
        elif argv[0] == "tracetorch":
            argv[:1] = [sys.executable, "-m", "tracetorch"]
        done = run_captured(argv, workdir, timeout=300)
        assert done.returncode == 0, (
            f"{name} line {line_no}: {part}\n{done.stdout}\n{done.stderr}")


def new_files(workdir: Path, before: set[Path]) -> list[str]:
    """Files under ``workdir`` that are not in ``before``, relative to it."""
    return sorted(p.relative_to(workdir).as_posix() for p in workdir.rglob("*")
                  if p.is_file() and p not in before)


def not_ignored(paths: list[str]) -> list[str]:
    """Those of ``paths`` (relative to the repository root) that its ``.gitignore`` does not
    ignore: what a user running the same code in the clone would see in ``git status``."""
    if not paths:
        return []
    done = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT,
                          input="\n".join(paths), capture_output=True, text=True, timeout=60)
    ignored = set(done.stdout.splitlines())
    return [p for p in paths if p not in ignored]
