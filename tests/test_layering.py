"""The layers import one way: ``tracetorch.records.result`` uses ``tracetorch.report``, never the
reverse.

Reports only read a result, so ``report/`` names ``ProfileResult`` in annotations alone (under
``TYPE_CHECKING``); the JSON reader returns a saved profile's parts, which ``ProfileResult``
assembles. What proves "no cycle" is the import graph read from the source: every ``import``
statement that can run counts, including one inside a function (a lazy import still closes a
cycle the first time it runs), and only the body of ``if TYPE_CHECKING:`` does not. No module of
``report/`` may reach ``tracetorch.records.result`` through that graph, while
``tracetorch.records.result`` reaches ``report/``: the edge exists, and it points one way.

Importing ``a.b.c`` runs ``a/b/__init__``, so the graph has that edge too, except into the root
package: ``tracetorch/__init__`` is the public facade, run by every import of anything inside
it. Naming the root explicitly (``import tracetorch``, ``from tracetorch import load``) does
count, since the facade imports ``tracetorch.records.result``.
"""
from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable
from pathlib import Path

import tracetorch

PACKAGE = Path(tracetorch.__file__).parent
ROOT = "tracetorch"
RESULT = "tracetorch.records.result"
REPORT = "tracetorch.report"


def _module_files() -> dict[str, Path]:
    files = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


MODULES = _module_files()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_names(source: str, module: str = "tracetorch.x", is_package: bool = False,
                   known: Iterable[str] = ()) -> set[str]:
    """Every module an ``import`` in ``source`` can load at run time, wherever it sits."""
    known = set(known)
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # only the body is for the type checker
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node)
            found.add(target)
            # `from pkg import sub` loads the submodule; `from pkg import name` needs only pkg.
            found.update(f"{target}.{alias.name}" for alias in node.names
                         if f"{target}.{alias.name}" in known)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name)
                       and node.func.id in ("import_module", "__import__")))):
            found.add(node.args[0].value)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def _with_parents(name: str) -> set[str]:
    # Importing a.b.c runs a.b's __init__; the root facade is left out (see the module docstring).
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(2, len(parts) + 1)}


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        edges: set[str] = set()
        for target in imported_names(path.read_text(encoding="utf-8"), name,
                                     path.name == "__init__.py", MODULES):
            if target == ROOT:
                edges.add(ROOT)  # named explicitly: the facade, which imports everything
            elif target.startswith(ROOT + "."):
                edges.update(m for m in _with_parents(target) if m in MODULES)
        edges.discard(name)
        graph[name] = edges
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module ``start`` reaches, each with the module that first imported it."""
    seen: dict[str, str] = {}
    stack = [start]
    while stack:
        here = stack.pop()
        for target in graph.get(here, ()):
            if target not in seen and target != start:
                seen[target] = here
                stack.append(target)
    return seen


def _path(seen: dict[str, str], start: str, end: str) -> str:
    chain = [end]
    while chain[-1] != start:
        chain.append(seen[chain[-1]])
    return " -> ".join(reversed(chain))


def test_no_report_module_reaches_result_at_run_time() -> None:
    graph = import_graph()
    report_modules = [m for m in graph if m == REPORT or m.startswith(REPORT + ".")]
    assert {"tracetorch.records.jsonio", "tracetorch.records.jsonread", "tracetorch.report.table",
            "tracetorch.report.flat_table", "tracetorch.report.chrome"} <= set(report_modules)
    for module in report_modules:
        seen = reachable(graph, module)
        assert RESULT not in seen, f"import cycle: {_path(seen, module, RESULT)} -> report"
        assert ROOT not in seen, f"{_path(seen, module, ROOT)}: the facade imports result"


def test_result_uses_report_one_way() -> None:
    graph = import_graph()
    seen = reachable(graph, RESULT)
    # The renderers, the writer and the reader are report's; result only assembles.
    assert {"tracetorch.report.table", "tracetorch.records.jsonio", "tracetorch.records.jsonread",
            "tracetorch.report.chrome"} <= set(seen)
    assert RESULT not in seen


def test_import_scanner_counts_lazy_imports_and_skips_type_checking_only() -> None:
    source = textwrap.dedent("""
        from __future__ import annotations
        import typing
        from typing import TYPE_CHECKING
        from . import units
        if TYPE_CHECKING:
            from tracetorch.records.result import ProfileResult
        else:
            from tracetorch.records.tree import CallNode
        if typing.TYPE_CHECKING:
            import tracetorch.profiler
        def render(result: ProfileResult) -> str:
            from ..stats import TimeStats
            import importlib
            importlib.import_module("tracetorch.profiler.schedule")
            return ""
        class Lazy:
            def table(self) -> str:
                from tracetorch.report.table import render_table
                return render_table(self)
    """)
    found = imported_names(source, "tracetorch.records.jsonio",
                           known={"tracetorch.text.units"})
    assert {"tracetorch.text.units", "tracetorch.records.tree", "tracetorch.records.stats",
            "tracetorch.profiler.schedule", "tracetorch.report.table"} <= found
    assert "tracetorch.records.result" not in found and "tracetorch.profiler" not in found
    # In a package's __init__, a relative import is relative to the package itself.
    assert imported_names("from .table import x", "tracetorch.report", is_package=True) == \
        {"tracetorch.report.table"}


def test_graph_sees_the_known_edges() -> None:
    graph = import_graph()
    assert "tracetorch.records.tree" in graph["tracetorch.records.jsonio"]
    assert "tracetorch.report" in graph["tracetorch.report.table"]  # via the package __init__
    assert RESULT in graph[ROOT]
