"""The benchmark scripts still run and print what the README quotes (numbers are not checked:
speed goals belong to the scripts, never to timed tests)."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, timeout: int = 300,
                  env: dict[str, str] | None = None) -> str:
    """What ``benchmarks/<script>`` prints with ``args`` (it must succeed)."""
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          check=True, env=env).stdout


def require_valgrind(script: str) -> None:
    """Skip without valgrind, except under CI, which installs it (then fail)."""
    if shutil.which("valgrind") is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs valgrind for benchmarks/{script}")
        pytest.skip("valgrind is missing")


HEADER = ("| work | bare wrapt | forward hooks | forward + full backward hooks | torch.profiler "
          "| DeepSpeed profiler | tracetorch | tracetorch ops=False "
          "| tracetorch backward_every=8 | torch.profiler shapes+FLOPs+modules | plain again |")


@pytest.mark.slow
@pytest.mark.usefixtures("torch_installed")
def test_peers_prints_the_overhead_table() -> None:
    out = run_benchmark("peers.py", "--quick", "--rows", "mlp", timeout=600)
    lines = out.splitlines()
    start = lines.index(HEADER)
    rows = [line.split(" | ") for line in lines[start + 2:start + 5]]
    assert [row[0] for row in rows] == [
        "| 50×(Linear(8,8),ReLU) batch 1, inference (`no_grad`)",
        "| same, forward with autograd on",
        "| same, **full training step** (forward, backward, SGD)"]
    number = re.compile(r"~-?[\d,]+")
    for row in rows:
        # DeepSpeed may be missing here (a blank cell with its reason); the rest are torch's
        cells = row[1:5] + [row[6], row[7], row[8], row[9], row[10].rstrip(" |")]
        assert all(number.fullmatch(cell) for cell in cells), row
    assert "% added to the plain step time" in out
    warm = lines[[i for i, line in enumerate(lines) if line == HEADER][-1] + 2:][:3]
    assert all(re.fullmatch(r"[+-]\d+\.\d\d", row.split(" | ")[6]) for row in warm), warm
    assert re.search(r"mlp-train: plain step [\d.]+ ms, 101 module calls", out)
    assert re.search(r"the plain step again [+-]\d+\.\d% ±\d+\.\d \(the method's null\)", out)


@pytest.mark.slow
def test_roofline_labels_the_three_cases(tmp_path: Path) -> None:
    # A fresh cache folder: the run calibrates for real (seconds), as a first run would.
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    out = run_benchmark("roofline.py", "--quick", timeout=600, env=env)
    assert "numpy: peak " in out and (tmp_path / "tracetorch" / "machine.json").is_file()
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| Linear")
            or line.startswith("| 100 x")]
    assert [(row[0], row[1], row[2]) for row in rows] == [
        ("| Linear(4096,4096) batch 1", "numpy", "memory-bound"),
        ("| Linear(4096,4096) batch 2048", "numpy", "compute-bound"),
        ("| 100 x Linear(4,4) batch 1", "numpy", "overhead-bound")]
    assert [row[4] for row in rows] == ["0.5", "512", "0.286"]  # intensities are exact


@pytest.mark.slow
def test_html_load_prints_the_load_table() -> None:
    if importlib.util.find_spec("playwright") is None or not Path("/usr/bin/chromium").exists():
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs playwright and /usr/bin/chromium for benchmarks/html_load.py")
        pytest.skip("playwright or /usr/bin/chromium is missing")
    out = run_benchmark("html_load.py", "--quick")
    assert "| tree | file size | table + icicle drawn | page ready |" in out
    assert re.search(r"\| 2,000 nodes \| [\d.]+ MB \| \d+ ms \| \d+ ms \|", out)
    assert re.search(r"2,000 nodes: ready in \d+ ms, [\d.]+x the 10-node page", out)


@pytest.mark.slow
def test_merge_ranks_prints_cost_per_rank_and_node() -> None:
    out = run_benchmark("merge_ranks.py", "--quick")
    assert "merging 20 ranks' trees" in out
    assert re.search(r"60 nodes: merge [\d.]+ ms per rank \([\d.]+ us per node per rank", out)
    assert re.search(r"60 nodes, as a tree: peak [\d.]+ MiB traced", out)
    assert re.search(r"gather payload per rank: [\d.]+ KiB pickled", out)


@pytest.mark.slow
@pytest.mark.usefixtures("torch_installed")
@pytest.mark.parametrize("model", ["mlp", "bert"])
def test_train_phases_prints_a_row_per_phase(model: str) -> None:
    out = run_benchmark("train_phases.py", "--quick", "--model", model)
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    assert [row[0] for row in rows[1:]] == ["forward", "loss", "backward", "step", "zero_grad",
                                          "prof.step"]
    assert all(re.fullmatch(r"-?[\d,]+\.\d", cell) for row in rows[1:] for cell in row[1:])
    reached = re.search(r"function mode in steps 1-5: \[(\d+), (\d+), (\d+), (\d+), (\d+)\]",
                        out)
    assert reached is not None, out
    first, *later = (int(n) for n in reached.groups())
    assert first > later[-1] == later[-2]  # counted, then learned: a steady few at the root


@pytest.mark.slow
@pytest.mark.usefixtures("torch_installed")
def test_torch_call_costs_prints_its_three_tables() -> None:
    out = run_benchmark("torch_call_costs.py", "--quick")
    rows = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    names = [re.split(r"\s{2,}", row)[0] for row in rows]
    assert names == ["nothing (the loop)", "out.grad_fn", "+ metadata entry",
                     "grad_fn + the carrier's hook dict", "the mark (all three)",
                     "grad_fn + a hook dict on the output", "grad_fn.register_prehook",
                     "empty TorchFunctionMode", "tracetorch.profile",
                     "Linear(8, 8) on 1x8", "Linear(256, 256) on 1x128x256"]
    assert all(re.search(r"-?[\d,]+ ns", row) for row in rows)
    assert all("bare wrapt +" in row and "tracetorch +" in row for row in rows[-2:])


@pytest.mark.slow
@pytest.mark.usefixtures("torch_installed")
def test_ab_builds_times_two_builds_in_one_process() -> None:
    # The checkout's own build given as the other: an A/A run, both builds' lines and the pair
    out = run_benchmark("ab_builds.py", str(ROOT), "--quick", "--rows", "mlp-infer")
    lines = out.splitlines()
    assert re.fullmatch(r"mlp-infer: plain step [\d.]+ ms, 101 module calls, 2 rounds, "
                        r"\d+ steps/sample, \d+ s", lines[1]), lines
    builds = ((lines[2], r"A \(this checkout's build\)"), (lines[3], r"B \(.*_hotpath.*\)"))
    for line, name in builds:
        assert re.fullmatch(rf"  {name}: -?[\d,]+ ns a call, [+-][\d.]+% ±[\d.]+ of the step",
                            line), line
    assert re.fullmatch(r"  B - A, paired by round: [+-][\d,]+ ns a call \(quartiles "
                        r"[+-][\d,]+ \.\. [+-][\d,]+\); B the cheaper in [012] of 2 rounds",
                        lines[4]), lines[4]


#: A callgrind dump in little: names given once with their number and then by number alone, code
#: inlined from a header (fi=, fe=), a call's inclusive cost (after calls=, not the caller's
#: own), a recursive function's level (Wrapper_call'2), cost lines that leave out their zeros.
DUMP = """# callgrind format
version: 1
positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw

ob=(1) /usr/lib/libpython3.11.so.1.0
fl=(1) Objects/dictobject.c
fn=(1) lookup
10 100 5 5 2 1 0 1
fi=(2) Include/object.h
+2 20 0 0 1
fe=(1)
fn=(2) caller
cfn=(1)
calls=3 10
-1 999 9 9 9 9 9 9 9 9
* 7 0 0 0 3 0 0 2
ob=(2) /x/_hotpath.so
fl=(3) _hotpath.c
fn=(3) Wrapper_call'2
5 50 0 0 4 4 0 3 3
jump=2 +3

fn=(4) Wrapper_call
5 1
ob=(1)
fn=(1)
3 1
totals: 179 10 5 2 7 0 4 5 3
"""


@pytest.mark.usefixtures("torch_installed")
def test_instructions_reads_each_functions_own_counts(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from instructions import BREAKDOWN_EVENTS, callgrind_functions

    assert BREAKDOWN_EVENTS == ("Ir", "I1mr", "D1mr", "ILmr", "DLmr")
    dump = tmp_path / "callgrind.out.1"
    dump.write_text(DUMP)
    expected = {
        ("libpython3.11.so.1.0", "lookup"): [121, 3, 1, 1, 0],
        ("libpython3.11.so.1.0", "caller"): [7, 0, 3, 0, 2],
        ("_hotpath.so", "Wrapper_call"): [51, 4, 4, 3, 3],
    }
    assert callgrind_functions(dump) == expected
    # positions given by instruction address too (--dump-instr=yes): one more column first
    addressed = "\n".join(
        "positions: instr line" if line == "positions: line"
        else "0x10 " + line if line[:1].isdigit() or line[:1] in ("+", "-", "*") else line
        for line in DUMP.splitlines())
    dump.write_text(addressed)
    assert callgrind_functions(dump) == expected


@pytest.mark.slow
@pytest.mark.usefixtures("torch_installed")
def test_instructions_counts_each_variant_of_a_row() -> None:
    # (with the cache simulation: its table is checked at the end, from the same run)
    require_valgrind("instructions.py")
    out = run_benchmark("instructions.py", "--rows", "mlp-infer", "--steps", "2",
                        "--columns", "forward hooks,tracetorch", "--cache-sim", "--breakdown", "3",
                        timeout=900)
    lines = out.splitlines()
    start = lines.index(HEADER)
    row = lines[start + 2].split(" | ")
    assert row[0] == "| 50×(Linear(8,8),ReLU) batch 1, inference (`no_grad`)"
    assert [row[1], row[3], row[4], row[5]] == ["–"] * 4  # the columns not asked for
    added = {name: row[index] for name, index in (("forward hooks", 2), ("tracetorch", 6))}
    # Counted inside the steps only: each wrapper adds thousands of instructions per call.
    assert all(re.fullmatch(r"~[\d,]+", cell) and int(cell[1:].replace(",", "")) > 1000
               for cell in added.values()), row
    assert re.search(r"mlp-infer: plain step [\d,]+ instructions, 101 module calls "
                     r"\(counted again: [+-]\d\.\d{3}%\), tracetorch [\d.]+x forward hooks; "
                     r"tracetorch \+[\d.]+% of the step", out)
    start = next(i for i, line in enumerate(lines) if line.startswith("cache misses added"))
    assert lines[start + 2] == lines[lines.index(HEADER)]  # the same columns
    misses = lines[start + 4].split(" | ")
    assert misses[0] == row[0] and [misses[1], misses[3], misses[4], misses[5]] == ["–"] * 4
    for name, index in (("forward hooks", 2), ("tracetorch", 6)):
        cell = re.fullmatch(r"(-?[\d,]+)\+(-?[\d,]+) / (-?[\d,]+)\+(-?[\d,]+)", misses[index])
        # a wrapper touches code and data the plain step does not: first-level misses of both
        assert cell is not None and int(cell[1].replace(",", "")) > 0, (name, misses)
        assert int(cell[2].replace(",", "")) > 0, (name, misses)
    # --breakdown: per variant, by shared object, then its 3 functions adding the most misses
    start = lines.index("where tracetorch adds, mlp-infer, per module call over the plain step:")
    by_object = {}
    for line in lines[start + 4:]:
        if not line.startswith("| "):
            break
        shared_object, instructions, first, last = line[2:-2].split(" | ")
        assert re.fullmatch(r"-?[\d,]+\.\d \+ -?[\d,]+\.\d", first), line
        by_object[shared_object] = int(instructions.replace(",", ""))
    # the C wrapper's own code and CPython's (its library, or the interpreter where it is
    # linked in), which the wrapper calls, run on every recorded call
    assert sum(n for name, n in by_object.items() if name.startswith("_hotpath.")) > 100, by_object
    assert sum(n for name, n in by_object.items()
               if name.startswith(("libpython", "python"))) > 100, by_object
    # the objects' parts add up to the table above's count, a float's rounding apart
    assert abs(sum(by_object.values()) - int(added["tracetorch"][1:].replace(",", ""))) < 50
    start = lines.index("the 3 functions adding the most first-level misses (their own code):",
                        start)
    assert len([line for line in lines[start + 4:start + 8] if line.startswith("| ")]) == 3
    assert "where forward hooks adds, mlp-infer, per module call over the plain step:" in lines


@pytest.mark.slow
@pytest.mark.usefixtures("torch_installed")
def test_one_shot_instructions_counts_each_way() -> None:
    require_valgrind("one_shot_instructions.py")
    out = run_benchmark("one_shot_instructions.py", "--models", "cnn", "--counts", "1",
                        "--classes", "10", "--pieces", timeout=900)
    found = dict(re.findall(r"^    (plain forward|FlopCounterMode|count_flops|profile\(model\))"
                            r"\s+([\d.]+) M", out, re.MULTILINE))
    assert out.count("ResNet-18-shaped CNN") == 1 and "transformer" not in out
    assert len(found) == 4, out
    # Counted inside the calls only: every way runs the forward's ~20 M instructions, and
    # counting FLOPs adds to them.
    assert all(float(found[way]) > float(found["plain forward"]) > 1
               for way in ("FlopCounterMode", "count_flops", "profile(model)")), out
    assert re.search(r"count_flops .* [\d.]+x FlopCounterMode's \([\d.]+x its added\)", out)
    assert re.search(r"count_flops's block, garbage collector off: [\d.]+ M entering and "
                     r"leaving; the first forward \+[\d.]+ M over a plain one:\n      its 77 "
                     r"module calls -?[\d.]+ M \(-?[\d,]+ each; -?[\d,]+ each again in a "
                     r"loop\), wrapping the classes at their first calls -?[\d.]+ M", out), out
    assert re.search(r"count_flops with the garbage collector off [\d.]+ M \(-?[\d.]+ M less "
                     r"than with it on\); with one piece off at a time: the FLOP rules [+-][\d.]+ "
                     r"M, each call's end \(its rule, its share of the total\) [+-][\d.]+ M$",
                     out, re.MULTILINE), out
