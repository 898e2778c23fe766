"""``tracetorch calibrate`` and ``tracetorch report --machine/--peak-flops`` (in-process)."""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracetorch
from support.calibration import fake_measurements
from tracetorch.cli.main import main


@pytest.fixture
def saved(tmp_path: Path) -> str:
    from tracetorch.core import Linear, Tensor

    layer, x = Linear(4096, 4096), Tensor(np.ones((1, 4096), dtype=np.float32))
    ticks = itertools.count(0, 1_000_000)
    with tracetorch.profile(layer, clock=lambda: next(ticks)) as prof:
        layer(x)
    path = str(tmp_path / "run.json")
    prof.save(path)
    return path


@pytest.fixture
def fake_measure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    return fake_measurements(monkeypatch, tmp_path / "cache", 1e12, 1e11)


def test_report_with_user_peaks(saved: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", saved, "--peak-flops", "1e12", "--bandwidth", "1e11",
                 "--call-overhead", "5000"]) == 0
    out = capsys.readouterr().out
    assert ("Peaks used: peak 1.00 TFLOP/s, bandwidth 100 GB/s, call overhead 5.00 us "
            "(--peak-flops, --bandwidth, --call-overhead); ridge 10 FLOP/B") in out
    assert "1. <model> (Linear): memory-bound, 328 us above its ceiling" in out


def test_report_with_the_calibrated_machine(saved: str, fake_measure: list[dict[str, Any]],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", saved, "--machine", "calibrate"]) == 0
    assert "Peaks used: peak 1.00 TFLOP/s" in capsys.readouterr().out
    assert [f["framework"] for f in fake_measure] == ["numpy"]


def test_calibrate_command_prints_and_refreshes(fake_measure: list[dict[str, Any]],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate"]) == 0
    assert main(["calibrate"]) == 0
    assert len(fake_measure) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tracetorch machine: peak 1.00 TFLOP/s")
    assert out[2].startswith("tracetorch machine: peak 1.00 TFLOP/s") and "cache (" in out[2]
    assert main(["calibrate", "--refresh"]) == 0 and len(fake_measure) == 2


@pytest.mark.parametrize("args, message", [
    (["calibrate", "--device", "tpu"], "--device: expected 'cpu', 'cuda' or 'cuda:N'"),
    (["calibrate", "--threads", "0"], "argument --threads: must be at least 1, got 0"),
    (["report", "RUN", "--peak-flops", "1e12"], "--peak-flops and --bandwidth go together"),
    (["report", "RUN", "--peak-flops", "-3", "--bandwidth", "1"],
     "argument --peak-flops: expected a positive number"),
    (["report", "RUN", "--machine", "calibrate", "--bandwidth", "1e9"],
     "--machine calibrate leaves out --peak-flops"),
])
def test_bad_machine_options(args: list[str], message: str, saved: str,
                             fake_measure: list[dict[str, Any]],
                             capsys: pytest.CaptureFixture[str]) -> None:
    args = [saved if a == "RUN" else a for a in args]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not fake_measure
