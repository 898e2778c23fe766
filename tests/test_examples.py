"""Each example runs as a script, in a subprocess, and prints what it promises."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from support.processes import run_captured

pytestmark = pytest.mark.slow  # every test runs an example in a fresh interpreter

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
    done = run_captured([sys.executable, *args], cwd, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def test_profile_mlp(tmp_path: Path) -> None:
    out = _run([str(EXAMPLES / "profile_mlp.py"), "--out", "mlp.json"], tmp_path).stdout
    assert "Parameters:      203,530" in out
    assert f"Forward FLOPs:   {2 * 64 * (784 * 256 + 256 * 10) + 64 * 256:,}" in out
    assert "Mean latency:" in out and "GFLOP/s" in out
    assert "layers.0 (Linear)" in out
    assert "and read back: 10 calls of layers.0" in out
    assert (tmp_path / "mlp.json").exists()


def test_custom_layer(tmp_path: Path) -> None:
    out = _run([str(EXAMPLES / "custom_layer.py")], tmp_path).stdout
    for row in ("layers.0 (GatedUnit)", "layers.1 (BilinearMix)", "standardize", "Temperature"):
        assert row in out
    for source in ("from ops", "from rule", "from user"):
        assert source in out
    assert "Unsupported" not in out


def test_torch_cnn(tmp_path: Path, torch_installed: None) -> None:
    out = _run([str(EXAMPLES / "torch_cnn.py"), "--steps", "3", "--out", "cnn.json"],
               tmp_path).stdout
    assert "step 3/3" in out
    for row in ("0 (Conv2d)", "7 (Linear)", "SGD.step"):
        assert row in out
    assert "Steps:          2 steps" in out
    assert "Step phases:" in out
    assert (tmp_path / "cnn.json").exists()


def test_torch_cnn_without_torch(tmp_path: Path) -> None:
    # sys.modules["torch"] = None makes `import torch` fail, as if it were not installed.
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = [sys.argv[1]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    out = _run(["-c", code, str(EXAMPLES / "torch_cnn.py")], tmp_path).stdout
    assert "needs PyTorch" in out
