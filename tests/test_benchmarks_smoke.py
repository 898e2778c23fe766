"""The benchmark scripts still run and print what the README quotes (numbers are not checked:
speed goals belong to the scripts, never to timed tests)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADER = ("| work | bare wrapt | forward hooks | forward + full backward hooks | torch.profiler "
          "| DeepSpeed profiler | tracetorch | tracetorch ops=False |")


@pytest.mark.slow
@pytest.mark.usefixtures("torch_installed")
def test_peers_prints_the_overhead_table() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--quick", "--rows", "mlp"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, check=True).stdout
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
        cells = row[1:5] + [row[6], row[7].rstrip(" |")]
        assert all(number.fullmatch(cell) for cell in cells), row
    assert "% added to the plain step time" in out
    assert re.search(r"mlp-train: plain step [\d.]+ ms, 101 module calls", out)
