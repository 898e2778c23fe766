"""The pages under docs/ are run as the README is (``support/docblocks.py``: every ``python``
block, every command line, each page in its own folder, nothing left that ``git status`` would
show), and every page, the README included, refers only to what the repository holds."""
from __future__ import annotations

import ast
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
# A module or a name in one: tracetorch.records.jsonread.MAX_PROFILE_BYTES.
_DOTTED = re.compile(r"\btracetorch(?:\.[A-Za-z_]\w*)+")
# What points outside the clone: a sibling folder, this machine's own paths.
_OUTSIDE = re.compile(r"\.\./shared|(?<![\w.])/(?:work|tmp|home|root)/")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", page.read_text(), re.M)}


def _source(dotted: str) -> Path | None:
    """The file of the package's module ``dotted``, if it is one."""
    base = ROOT.joinpath(*dotted.split("."))
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)


def _module_defines(source: Path, name: str) -> bool:
    """Whether the module at ``source`` binds ``name`` at its top level (read, not imported:
    some modules import torch, which the fast tests must not), a star import followed."""
    bound: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.names[0].name == "*":
            star = _source(node.module or "")
            if star is not None and _module_defines(star, name):
                return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound.update(t.id for t in targets if isinstance(t, ast.Name))
    return name in bound


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module of the package, or a name its longest module prefix binds
    (``tracetorch.engine.native.accelerated``); attributes of that name are not followed."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        source = _source(".".join(parts[:k]))
        if source is not None:
            return k == len(parts) or _module_defines(source, parts[k])
    return False


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


def test_the_readme_links_every_page():
    linked = {(ROOT / target.partition("#")[0]).resolve()
              for target in _LINK.findall((ROOT / "README.md").read_text())
              if target.startswith("docs/")}
    assert [page for page in DOCS if page not in linked] == []


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
    unknown = [n for n in _DOTTED.findall(text) if not _resolves(n)]
    assert unknown == []
