"""The pages under docs/ are run as the README is (``support/docblocks.py``: every ``python``
block, every command line, each page in its own folder, nothing left that ``git status`` would
show), and every page, the README included, refers only to what the repository holds."""
from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
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

DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A file named in backquotes or a link: tracetorch/flops/elementwise.py, benchmarks/peers.py.
_NAMED = re.compile(r"(?<![\w./-])((?:tracetorch|tests|benchmarks|examples|docs)/[\w./-]*\w)")
# What points outside the clone: a sibling folder, this machine's own paths.
_OUTSIDE = re.compile(r"\.\./shared|(?<![\w.])/(?:work|tmp|home|root)/")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", page.read_text(), re.M)}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Path]]:
    # One folder per page, holding a copy of examples/, as for a user reading that page.
    folders: dict[str, Path] = {}

    def folder(page: str) -> Path:
        if page not in folders:
            folders[page] = tmp_path_factory.mktemp(Path(page).stem)
            shutil.copytree(ROOT / "examples", folders[page] / "examples")
        return folders[page]

    yield folder


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("docs-scripts")


def test_docs_exist_and_have_code():
    assert len(DOCS) >= 10
    assert sum(len(blocks(page, "python")) for page in DOCS) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for page in DOCS for b in blocks(page, "python")],
                         ids=block_id)
def test_python_block_runs(block: DocBlock, workdir: Callable[[str], Path], scripts: Path,
                           torch_installed: None) -> None:
    folder = workdir(block[0])
    before = set(folder.rglob("*"))
    run_python(block, folder, scripts)
    assert not_ignored(new_files(folder, before)) == []


@pytest.mark.slow
@pytest.mark.parametrize("block", [c for page in DOCS for c in commands(page)], ids=block_id)
def test_command_runs(block: DocBlock, workdir: Callable[[str], Path],
                      torch_installed: None) -> None:
    folder = workdir(block[0])
    before = set(folder.rglob("*"))
    run_command(block, folder)
    assert not_ignored(new_files(folder, before)) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve_inside_the_repository(page: Path) -> None:
    for target in _LINK.findall(page.read_text()):
        if re.match(r"https?://", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.is_relative_to(ROOT) and resolved.exists(), (page.name, target)
        if anchor:
            assert anchor in _anchors(resolved), (page.name, target)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_named_files_exist_and_nothing_points_outside(page: Path) -> None:
    text = page.read_text()
    assert _OUTSIDE.findall(text) == []
    missing = [n for n in _NAMED.findall(text) if not (ROOT / n).exists()]
    assert missing == []
