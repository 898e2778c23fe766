"""The contract between the C accelerators and the Python they stand for.

The C files read Python names (a module's settings, the fields and methods of the objects they
are handed) and positions in the tuples and lists they share with Python. Nothing but these
tests ties them together, so they check, from the C sources themselves:

- every name a C file reads is listed in :data:`tracetorch.engine.native.C_NAMES`, every listed
  name is read, and each exists where it is listed (a module's global, a record's field, an
  object's attribute); the C looks nothing up by a C string that would escape that list;
- the same workloads run with the C and with ``TRACETORCH_PURE_PYTHON=1`` give the same profile,
  everything but the times;
- what the C files' comments name in Python (modules, functions, fields, files) exists.
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracetorch.engine import hotpath, native
from tracetorch.records.tree import ENTRY_FIELDS, CallNode, NodeKind

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tracetorch"


def _source(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".c")


def _comments_and_strings(text: str) -> list[str]:
    return re.findall(r'/\*.*?\*/|"(?:[^"\\\n]|\\.)*"', text, re.DOTALL)


def _code(text: str) -> str:
    """The C source without its comments."""
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.DOTALL)


#: How a C file makes the Python names it reads: ``INTERN(var, "name")``, or directly.
_NAME = re.compile(r'(?:\bINTERN\(\s*\w+\s*,|\bPyUnicode_(?:Intern)?FromString\()\s*"([^"]*)"')
#: Lookups by a C string, which would read a name the test cannot see as one (``...String``
#: getters, ``PyObject_CallMethod`` with a format) and imports by dotted name, which break
#: silently when a module moves: the C is handed objects instead.
_HIDDEN_LOOKUP = re.compile(
    r"\b(\w*(?:GetAttrString|HasAttrString|GetItemString)|PyObject_CallMethod|"
    r"_PyUnicode_FromId|_Py_IDENTIFIER|PyImport_\w+)\s*\(")


def names_read(text: str) -> set[str]:
    """The Python names a C source reads.

    Example:
        >>> sorted(names_read('INTERN(s_a, "alpha"); /* INTERN(s_b, "beta") */'))
        ['alpha']
    """
    return set(_NAME.findall(_code(text)))


# ----------------------------------------------------------------------------- (a) names
def test_every_c_file_of_the_package_is_listed_and_built_by_setup():
    files = {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.c")}
    listed = {_source(module).relative_to(ROOT).as_posix() for module in native.C_NAMES}
    assert files == listed
    setup = (ROOT / "setup.py").read_text()
    for module in native.C_NAMES:
        assert f'Extension("{module}", ["{_source(module).relative_to(ROOT).as_posix()}"]' in setup


@pytest.mark.parametrize("module", sorted(native.C_NAMES))
def test_each_c_file_reads_exactly_the_names_listed(module):
    listed = set().union(*native.C_NAMES[module].values())
    assert names_read(_source(module).read_text()) == listed


@pytest.mark.parametrize("module", sorted(native.C_NAMES))
def test_the_c_reads_no_name_the_list_cannot_see(module):
    assert _HIDDEN_LOOKUP.findall(_code(_source(module).read_text())) == []


def test_the_scan_sees_a_lookup_by_c_string():
    # (what the test above would catch if someone wrote it)
    hidden = 'PyObject_GetAttrString(o, "x"); PyImport_ImportModule("tracetorch.tree");'
    assert _HIDDEN_LOOKUP.findall(hidden) == ["PyObject_GetAttrString", "PyImport_ImportModule"]


def _has(obj: Any, name: str) -> bool:
    # An attribute, or for a class one that its methods or a base's set on every instance
    # (``self.name = ...``).
    if hasattr(obj, name):
        return True
    assigned = re.compile(rf"\bself\.{name}\b(?:\s*:[^=\n]*)?\s*=(?!=)")
    return inspect.isclass(obj) and any(
        assigned.search(inspect.getsource(cls)) for cls in obj.__mro__
        if cls.__module__.startswith("tracetorch."))


def _places(torch: Any) -> dict[str, Any]:
    """What each place of ``C_NAMES`` names: a test of one name."""
    import wrapt

    from tracetorch.adapters.torch import backward, marks, ops
    from tracetorch.engine.collector import Collector
    from tracetorch.engine.node_state import NodeState
    from tracetorch.records.stats import TimeStats

    tensor = torch.ones(2, requires_grad=True) * 2  # a tensor with an autograd node
    layer = torch.nn.Linear(2, 2)
    method = wrapt.FunctionWrapper(layer.forward, lambda wrapped, instance, args, kwargs: None)
    node = CallNode.root()
    return {
        "hotpath": vars(hotpath).__contains__,
        "marks": vars(marks).__contains__,
        "backward": vars(backward).__contains__,
        "ops": vars(ops).__contains__,
        "Frame": hotpath.Frame._fields.__contains__,
        "ENTRY_FIELDS": ENTRY_FIELDS.__contains__,
        "_Hot": backward._Hot._fields.__contains__,
        "NamedTuple": lambda name: hasattr(hotpath.Frame, name) and hasattr(backward._Hot, name),
        "NodeKind": typing.get_args(NodeKind).__contains__,
        "Collector": lambda name: _has(Collector, name),
        "CallNode": lambda name: _has(node, name),
        "TimeStats": lambda name: _has(TimeStats, name),
        "NodeState": lambda name: _has(NodeState, name),
        "BackwardPass": lambda name: _has(backward.BackwardPass, name),
        "tensor": lambda name: hasattr(tensor, name) and (
            name not in ("shape", "dtype") or hasattr(np.zeros(1), name)),
        "autograd node": lambda name: hasattr(tensor.grad_fn, name),
        "torch module": lambda name: hasattr(layer, name),
        "layer method": lambda name: hasattr(method, name),
    }


def test_every_name_the_c_reads_exists_where_it_is_listed(torch):
    places = _places(torch)
    unknown = {place for names in native.C_NAMES.values() for place in names} - set(places)
    assert not unknown, f"places the test cannot check: {unknown}"
    missing = [(module, place, name) for module, names in native.C_NAMES.items()
               for place, listed in names.items() for name in listed if not places[place](name)]
    assert missing == []


def test_a_name_renamed_in_python_is_missing(torch):
    # (the check above is not vacuous: a name no module defines is reported)
    places = _places(torch)
    assert not places["hotpath"]("_op_toggle") and not places["Frame"]("parent")
    assert not places["BackwardPass"]("heat") and places["BackwardPass"]("hot")


# ----------------------------------------------------------------------------- (c) comments
#: The modules the C stands in for, by the short names its comments use (``hotpath.call_key``);
#: the classes they define are named alone (``BackwardPass.reach``).
_MODULES = {"hotpath": "tracetorch.engine.hotpath", "patches": "tracetorch.engine.patches",
            "marks": "tracetorch.adapters.torch.marks",
            "backward": "tracetorch.adapters.torch.backward",
            "ops": "tracetorch.adapters.torch.ops",
            "tensors": "tracetorch.models.tensors", "stats": "tracetorch.records.stats",
            "timing": "tracetorch.engine.timing", "collector": "tracetorch.engine.collector"}


def _resolve(dotted: str, spaces: dict[str, Any] | None = None) -> Any:
    """What a dotted name in a comment names: from the package (``tracetorch.a.b``) or, with
    ``spaces``, from a short name there; AttributeError or ImportError where nothing is."""
    first, *rest = dotted.split(".")
    if spaces is not None:
        found = spaces[first]
    else:
        for cut in range(len(rest), -1, -1):
            try:
                found = importlib.import_module(".".join([first, *rest[:cut]]))
            except ImportError:
                continue
            rest = rest[cut:]
            break
        else:
            raise ImportError(dotted)
    for part in rest:
        if not _has(found, part):
            raise AttributeError(f"{dotted}: no {part!r}")
        found = getattr(found, part, None)
    return found


def _short_names() -> dict[str, Any]:
    spaces: dict[str, Any] = {}
    for short, full in _MODULES.items():
        spaces[short] = module = importlib.import_module(full)
        spaces.update({name: value for name, value in vars(module).items()
                       if inspect.isclass(value) and value.__module__ == full})
    return spaces


@pytest.mark.parametrize("module", sorted(native.C_NAMES))
def test_what_the_c_comments_name_in_python_exists(module, torch):
    pieces = _comments_and_strings(_source(module).read_text())
    # The header says what the file stands for: a function or class of the package, in full.
    header = re.findall(r"\btracetorch(?:\.\w+)+", pieces[0])
    assert any(callable(_resolve(dotted)) for dotted in header if not dotted.startswith(module))
    text = " ".join(pieces)
    # Files: by their path from the repository's root, or by name alone.
    for path in re.findall(r"\b((?:tracetorch|tests)/[\w/]+\.(?:py|c))\b", text):
        assert (ROOT / path).is_file(), path
    for name in re.findall(r"(?<![\w/])(\w+\.(?:py|c))\b", text):
        assert list(PACKAGE.rglob(name)) or (ROOT / "tests" / name).is_file(), name
    # The package's names in full; the modules above and their classes by short name.
    for dotted in set(re.findall(r"\btracetorch(?:\.\w+)+", text)):
        if dotted != module and not dotted.startswith(module + "."):  # (not its own types)
            _resolve(dotted)
    spaces = _short_names()
    for dotted in set(re.findall(r"(?<![\w./])[A-Za-z_]\w*(?:\.\w+)+", text)):
        if dotted.split(".")[0] in spaces and not dotted.endswith((".py", ".c")):
            _resolve(dotted, spaces)


def test_a_stale_name_in_a_comment_is_found(torch):
    with pytest.raises(AttributeError):
        _resolve("tracetorch.engine.hotpath.no_such_function")
    with pytest.raises(AttributeError):
        _resolve("BackwardPass.heat", _short_names())
    assert _resolve("BackwardPass.hot", _short_names()) is None  # set by __init__
    assert _resolve("Collector.plain_clock", _short_names()) is None  # set by CallTiming


# ----------------------------------------------------------------------------- (b) both ways
#: Four workloads, run in a fresh interpreter; prints every node of each profile, as JSON, with
#: everything a node holds but its times (a TimeStats becomes its count; an operation row loses
#: its time). The engine's transient fields (the counters, the frame, the children by owner)
#: are left out: they are how a node is recorded, not what it recorded.
_WORKLOADS = r'''
import json, math, sys
import numpy as np
import torch
from torch import nn
import tracetorch
from tracetorch import core
from tracetorch.engine import native
from tracetorch.records.memory import MemoryStats
from tracetorch.records.stats import TimeStats
from tracetorch.records.tree import CallNode

ENGINE = {"parent", "children", "engine"}


def value(field, item):
    if isinstance(item, TimeStats):
        return item.count
    if isinstance(item, MemoryStats):
        return item.to_dict()
    if field == "ops":
        return {name: row[:2] for name, row in item.items()}
    return item


def rows(prof):
    out = []
    for node in prof.nodes():
        row = {"path": node.path}
        for field in CallNode.__slots__:
            if field not in ENGINE:
                row[field] = value(field, getattr(node, field))
        state = node.engine  # (what outlives a recording: the rule's standing, no leftovers)
        row["engine"] = (state.rule_state, state.op_flops, state.op_gemm)
        out.append(row)
    return out


def numpy_mlp():
    core.manual_seed(0)
    model = core.Sequential(core.Linear(8, 16), core.ReLU(), core.Linear(16, 4))
    opt, loss_fn = core.SGD(model.parameters(), lr=0.1), core.CrossEntropyLoss()
    x, y = core.Tensor(np.ones((5, 8))), np.arange(5) % 4
    with tracetorch.profile(model) as prof:
        for _ in range(3):
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return prof


def torch_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 8), torch.arange(5) % 4
    with tracetorch.profile(model) as prof:
        for _ in range(3):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return prof


class Attention(nn.Module):  # no FLOP rule: its tensor operations are counted, then learned
    def __init__(self, width, heads):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = (t.reshape(batch, length, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        weights = (q @ k.transpose(-2, -1) / math.sqrt(width // self.heads)).softmax(dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm1, self.attention = nn.LayerNorm(width), Attention(width, 2)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Bert(nn.Module):
    def __init__(self, vocabulary=50, width=16, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return x


def bert_inference():
    torch.manual_seed(0)
    model, ids = Bert().eval(), torch.arange(12).reshape(2, 6)
    with torch.no_grad(), tracetorch.profile(model) as prof:
        for _ in range(4):  # calls 3 and 4 replay what 1 and 2 counted
            model(ids)
    return prof


def scheduled():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(3, 4)
    plan = tracetorch.schedule(wait=1, warmup=1, active=2, repeat=1)
    with tracetorch.profile(model, schedule=plan) as prof:
        for _ in range(6):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return prof


accelerated = [native.native_type(module, name) is not None for module, name in (
    ("tracetorch.engine._hotpath", "Wrapper"), ("tracetorch.adapters.torch._marks", "Marker"),
    ("tracetorch.adapters.torch._marks", "Boundary"), ("tracetorch.engine._binding",
                                                        "layer_binding"))]
profiles = {work.__name__: rows(work()) for work in (numpy_mlp, torch_mlp, bert_inference,
                                                     scheduled)}
print(json.dumps({"accelerated": accelerated, "profiles": profiles}))
'''


def _run_workloads(pure: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != native.PURE_PYTHON_ENV}
    if pure:
        env[native.PURE_PYTHON_ENV] = "1"
    run = subprocess.run([sys.executable, "-c", _WORKLOADS], env=env, capture_output=True,
                         text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.mark.slow
def test_the_same_workloads_give_the_same_profiles_with_and_without_the_c(torch_installed):
    with_c, python = _run_workloads(pure=False), _run_workloads(pure=True)
    assert python["accelerated"] == [False] * 4
    if with_c["accelerated"] != [True] * 4:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the C accelerators were not all built: {with_c['accelerated']}")
        pytest.skip("the C accelerators are not built here")
    for work, rows in with_c["profiles"].items():
        assert rows == python["profiles"][work], work
    # The workloads exercise what the comparison is for: FLOPs, backward FLOPs, bytes, learned
    # operations, a schedule's recorded steps only.
    profiles = with_c["profiles"]
    torch_rows = {row["path"]: row for row in profiles["torch_mlp"]}
    assert torch_rows["0"]["time"] == 3 and torch_rows["0"]["backward_flops"] > 0
    assert torch_rows["0"]["_memory"]["input_bytes"] > 0
    assert {row["path"]: row["time"] for row in profiles["scheduled"]}["0"] == 2
    attention = {row["path"]: row for row in profiles["bert_inference"]}["blocks.0.attention"]
    # Two products per call (q @ k^T, weights @ v: 2 * 2 heads * 6 * 6 * 8 FLOPs each, for a
    # batch of 2), on 4 calls: 2 counted, 2 replayed.
    assert attention["ops"]["matmul"] == [8, 4 * 2 * (2 * 2 * 2 * 6 * 6 * 8)]
    assert any(row["flops"] for row in profiles["numpy_mlp"])
