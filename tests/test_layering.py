"""Imports run one way: every module sits in a layer, and imports only from its layer or below.

The layers, lowest first (:data:`LAYERS`; ARCHITECTURE.md draws them): shared text; the records
(the call tree, the result as data); the FLOP formulas; the numpy framework; what tracetorch
knows about models; the engine (with the core framework's FLOP rules); the adapters; distributed
jobs; the analyses; the reports; the profiler; the tools beside it (and the TinyTorch facade);
the entry points. A module's layer is that of the longest prefix naming it.

What proves it is the import graph read from the source: every ``import`` statement that can run
counts, including one inside a function (a lazy import still runs the module it names), and
only the body of ``if TYPE_CHECKING:`` does not. Importing ``a.b.c`` runs ``a/b/__init__``, so
the graph has that edge too, except into the root package ``tracetorch``: its ``__init__`` is
the public facade, run by every import of anything inside it. Naming the root explicitly
(``import tracetorch``) does count: only the entry points may.

A layer below reaches one above only through a registration, never an import: the reports and
analyses register their formats and views with :mod:`tracetorch.records.views`, and the
calibration (which runs a profile) registers the machine resolver that ``profile(machine=
"calibrate")`` uses. No module imports upward, and no modules import each other in a cycle,
with one documented exception inside the numpy framework (:data:`CORE_TENSOR_CYCLE`).
"""
from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable
from pathlib import Path

import tracetorch

PACKAGE = Path(tracetorch.__file__).parent
ROOT = "tracetorch"

#: Lowest first; a module belongs to the layer of the longest prefix that names it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tracetorch.version", "tracetorch.text"),
    ("tracetorch.records",),
    ("tracetorch.flops",),
    ("tracetorch.core",),
    ("tracetorch.models",),
    ("tracetorch.engine", "tracetorch.flops.core_rules"),
    ("tracetorch.adapters",),
    ("tracetorch.distributed",),
    ("tracetorch.analysis",),
    ("tracetorch.report",),
    ("tracetorch.profiler",),
    ("tracetorch.tools", "tracetorch.compat", "tracetorch.perf"),
    ("tracetorch.cli", "tracetorch.integrations", "tracetorch.__main__", ROOT),
)


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


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the longest prefix naming ``module``."""
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and \
                    (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    if best is None:
        raise LookupError(f"{module} is in no layer: add it to LAYERS (and ARCHITECTURE.md)")
    return best[0]


def _without_own_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # A package's __init__ has run before any of its modules can: an edge from a module to its
    # own enclosing package is not a dependency that could close a cycle.
    return {module: {t for t in targets if not module.startswith(t + ".")}
            for module, targets in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_is_in_a_layer_and_imports_only_downward() -> None:
    graph = import_graph()
    upward = [f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
              for module, targets in sorted(graph.items()) for target in sorted(targets)
              if layer_of(target) > layer_of(module)]
    assert upward == []


#: The one documented exception: the numpy framework's Tensor and its operations import each
#: other (TinyTorch's design: a Tensor's methods are its operations, which return Tensors).
CORE_TENSOR_CYCLE = ["tracetorch.core.autograd", "tracetorch.core.ops_linalg",
                     "tracetorch.core.ops_math", "tracetorch.core.ops_nn",
                     "tracetorch.core.ops_reduce", "tracetorch.core.ops_shape",
                     "tracetorch.core.tensor"]


def test_no_import_cycle_between_modules_but_the_core_tensor() -> None:
    assert cycles(_without_own_packages(import_graph())) == [CORE_TENSOR_CYCLE]


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_report_never_constructs_a_result_and_the_result_imports_no_view() -> None:
    graph = import_graph()
    result = "tracetorch.records.result"
    for module in graph:
        if module.startswith("tracetorch.report"):
            assert result not in graph[module], f"{module} imports the result at run time"
    assert not {t for t in graph[result]
                if t.startswith(("tracetorch.report", "tracetorch.analysis"))}


def test_the_layers_name_real_packages() -> None:
    for prefixes in LAYERS:
        for prefix in prefixes:
            assert prefix in MODULES, f"LAYERS names {prefix}, which is no module"


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
            from ..records.stats import TimeStats
            import importlib
            importlib.import_module("tracetorch.profiler.schedule")
            return ""
        class Lazy:
            def table(self) -> str:
                from tracetorch.report.table import render_table
                return render_table(self)
    """)
    found = imported_names(source, "tracetorch.text.layout",
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
    assert "tracetorch.records.result" in graph[ROOT]


def private_imports(source: str) -> list[str]:
    """The private names ``source`` imports from a tracetorch module (``from m import _x``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(ROOT) \
                and not node.level:
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    assert private_imports("from tracetorch.engine.hotpath import _switch, Frame") == \
        ["tracetorch.engine.hotpath._switch"]
    assert private_imports("from tracetorch.version import __version__") == []
    found = {name: private_imports(path.read_text(encoding="utf-8"))
             for name, path in MODULES.items()}
    assert {name: names for name, names in found.items() if names} == {}
