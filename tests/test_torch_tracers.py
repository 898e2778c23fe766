"""torch's compilers and tracers inside and after a profile block, each in a fresh process.

Each case runs a compiler outside any block (the reference), inside one, and again after it in
the same process, and compares outputs and, where the compiler has one, the generated code: a
profiler that ran inside the trace would show up there. Compiling records nothing; the compiled
or scripted module called inside the block is one node with its time.
"""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from support.processes import run_captured

ROOT = Path(__file__).resolve().parent.parent

PRELUDE = """
import json, sys, torch, tracetorch
torch.manual_seed(0)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

model, x = Net(), torch.randn(3, 4)
expected = model(x)
with tracetorch.profile():
    model(x)                      # the class has been wrapped once before anything is compiled

def rows(prof):
    return [[n.path, n.calls, n.flops_source, n.flops, n.type_name] for n in prof.nodes()]

def same(a, b):
    return bool(torch.allclose(a, b, atol=1e-6))

def run(compile_, call, code=lambda c: ""):
    before = compile_()
    with tracetorch.profile(warn_unsupported=False) as prof:
        inside = compile_()
        recorded_compiling = rows(prof)
        out = call(inside)
    torch._dynamo.reset()
    after = compile_()
    print(json.dumps({
        "outputs": [same(call(before), expected), same(out, expected), same(call(after), expected),
                    same(call(inside), expected)],
        "code_same": [code(inside) == code(before), code(after) == code(before)],
        "compiling": recorded_compiling, "rows": rows(prof),
        "unsupported": prof.unsupported,
    }))
"""

CASES = {
    "jit.script": "run(lambda: torch.jit.script(model), lambda m: m(x), lambda m: m.code)",
    # Compared by the operations of the graph: value names and source lines may differ.
    "jit.trace": ("run(lambda: torch.jit.trace(model, x), lambda m: m(x), "
                  "lambda m: [n.kind() for n in m.inlined_graph.nodes()])"),
    "fx.symbolic_trace": ("run(lambda: torch.fx.symbolic_trace(model), lambda m: m(x), "
                          "lambda m: m.code)"),
    "export": ("run(lambda: torch.export.export(model, (x,)), lambda p: p.module()(x), "
               "lambda p: str(p.graph))"),
    "compile(fullgraph)": ("run(lambda: torch.compile(model, backend='eager', fullgraph=True), "
                           "lambda m: m(x))"),
    "compile(function)": ("fn = lambda t: model(t) * 2\n"
                          "run(lambda: torch.compile(fn, backend='aot_eager', fullgraph=True), "
                          "lambda f: f(x) / 2)"),
    "compile(inductor)": "run(lambda: torch.compile(model), lambda m: m(x))",
}

LINEARS = 2 * 3 * 4 * 8 + 2 * 3 * 8 * 2  # the two Linear layers at batch 3


def run_case(code: str, tmp_path: Path) -> object:
    """Run PRELUDE + ``code`` as a script file (TorchScript reads the source) in a fresh
    interpreter; returns what its last line printed, as JSON."""
    script = tmp_path / "case.py"
    script.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(code) + "\n")
    done = run_captured([sys.executable, str(script)], ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_compilers_give_the_same_results_inside_and_after_a_block(case, torch_installed,
                                                                 tmp_path):
    result = run_case(CASES[case], tmp_path)
    assert result["outputs"] == [True, True, True, True]
    assert result["code_same"] == [True, True]  # no trace of the profiler in generated code
    rows = result["rows"]
    if case == "jit.script":
        assert result["compiling"] == []
        # The module called first at the top is the model, "". TorchScript runs unseen.
        assert rows == [["", 1, "none", 0, "RecursiveScriptModule"]]
        assert result["unsupported"] == {"RecursiveScriptModule": 1}  # its FLOPs: unknown
    elif case == "jit.trace":
        # The tracer's own check runs the model once more, for real; the traced module is one
        # node whose graph runs unseen. Net, called first, is the model: "".
        assert [row[:2] for row in rows] == [["", 1], ["a", 1], ["b", 1],
                                             ["TopLevelTracedModule", 1]]
    elif case == "fx.symbolic_trace":
        assert result["compiling"] == []
        # The GraphModule itself is not wrapped; the layers it calls are, at the top: the first
        # stands for the model (""), the other is named by its type.
        assert rows == [["", 1, "rule", 2 * 3 * 4 * 8, "Linear"],
                        ["Linear", 1, "rule", 2 * 3 * 8 * 2, "Linear"]]
    elif case == "export":
        assert result["compiling"] == []
    elif case in ("compile(fullgraph)", "compile(inductor)"):
        if case == "compile(fullgraph)":
            assert result["compiling"] == []
        # The compiled module's row, typed as the model, and its layers as in eager (from a
        # replay on fake tensors: tracetorch.adapters.torch.compiled), the relu (3·8, one per
        # element) on the model's own row.
        assert rows == [["", 1, "ops", 3 * 8, "Net"], ["a", 1, "rule", 2 * 3 * 4 * 8, "Linear"],
                        ["b", 1, "rule", 2 * 3 * 8 * 2, "Linear"]]
    else:
        assert result["compiling"] == []


@pytest.mark.slow
def test_jit_script_after_a_block_that_wrapped_the_class(torch_installed, tmp_path):
    code = """
class Fresh(torch.nn.Module):
    def forward(self, x):
        return x * 2

with tracetorch.profile():
    Fresh()(torch.ones(2))
print(json.dumps([torch.jit.script(Fresh())(torch.ones(2)).tolist(),
                  torch.jit.script(Net())(x).shape[1]]))
"""
    assert run_case(code, tmp_path) == [[2.0, 2.0], 2]


def test_jit_trace_inside_a_block_records_the_users_source_lines(torch):
    import os
    import re

    import tracetorch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 8)
            self.b = torch.nn.Linear(8, 2)

        def forward(self, x):
            hidden = torch.relu(self.a(x))
            return self.b(hidden) @ torch.ones(2, 2)

    def graph(model, x) -> str:
        text = str(torch.jit.trace(model, x, check_trace=False).inlined_graph)
        return re.sub(r"___torch_mangle_\d+\.", "", text)  # a class traced again is renamed

    model, x = Net(), torch.randn(3, 4)
    outside = graph(model, x)
    with tracetorch.profile() as prof:
        before_any_call = graph(model, x)
        model(x)
        after_a_call = graph(model, x)
    assert before_any_call == outside and after_a_call == outside  # lines, scopes, names
    package = os.path.dirname(tracetorch.__file__)  # no source line of ours, wherever it lies
    assert package not in outside and "test_torch_tracers.py" in outside
    assert prof.gemm_flops == 2 * 3 * 4 * 8 + 2 * 3 * 8 * 2 + 2 * 3 * 2 * 2  # the eager call's
