"""Bottlenecks in one command: the calibration fits the profile (framework, device, dtype,
threads), ``tracetorch run`` shows the section when a fitting calibration is cached, and a
damaged machine entry is said once, alike, by every view.

The measurement is a fake that records what it was asked (no timing), except in the test of
the child process, which measures for real on tiny sizes. Every test has its own cache folder.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracetorch
from support.calibration import fake_measurements
from tracetorch.analysis import machine_cache
from tracetorch.cli.main import main
from tracetorch.report.html import page_data
from tracetorch.report.summary import summary_lines
from tracetorch.tools import calibrate as calibration

SCRIPT = """\
import numpy as np
from tracetorch.core import Linear, ReLU, Sequential, Tensor
model = Sequential(Linear(64, 64), ReLU(), Linear(64, 8))
x = Tensor(np.ones((8, 64), dtype=np.float32))
for _ in range(3):
    model(x)
"""


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """The facts each measurement was asked for (a fake measurement, in a fresh cache)."""
    return fake_measurements(monkeypatch, tmp_path / "cache", 1e10, 1e9)


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return str(path)


def _profiled_torch(torch: Any, threads: int) -> tracetorch.profile:
    layer = torch.nn.Linear(8, 8).double()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with tracetorch.profile(layer) as prof:
            layer(torch.ones(4, 8, dtype=torch.float64))
    finally:
        torch.set_num_threads(before)
    return prof


# ------------------------------------------------------------------ the calibration that fits
def test_a_profile_records_the_framework_and_dtype_of_its_arithmetic(torch: Any) -> None:
    from tracetorch.core import Linear, Tensor

    layer = Linear(4, 4)  # a numpy model (Tensor holds float32), although torch is imported
    with tracetorch.profile(layer) as prof:
        layer(Tensor(np.ones((2, 4))))
    assert (prof.meta["framework"], prof.meta["dtype"]) == ("numpy", "float32")
    prof = _profiled_torch(torch, threads=1)
    assert {k: prof.meta[k] for k in ("framework", "device", "dtype", "threads")} == {
        "framework": "torch", "device": "cpu", "dtype": "float64", "threads": 1}
    with tracetorch.profile() as prof:  # no call: no dtype to say
        pass
    assert "dtype" not in prof.meta


def test_report_calibrates_for_the_profiles_framework_dtype_and_threads(
        torch: Any, tmp_path: Path, measured: list[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    # Before: numpy's float32 calibration at this process's threads, whatever the profile.
    path = str(tmp_path / "run.json")
    _profiled_torch(torch, threads=1).save(path)
    assert main(["report", path, "--machine", "calibrate"]) == 0
    [facts] = measured
    assert (facts["framework"], facts["device"], facts["dtype"], facts["threads"]) == (
        "torch", "cpu", "float64", 1)
    captured = capsys.readouterr()
    assert "(measured now; torch, cpu, float64, 1 thread); ridge 10 FLOP/B" in captured.out
    assert "calibrating this machine for torch, cpu, float64, 1 thread" in captured.err
    assert main(["report", path, "--machine", "calibrate"]) == 0  # cached: measured once
    assert len(measured) == 1
    assert main(["report", path, "--machine", "calibrate", "--dtype", "float32"]) == 0
    assert measured[-1]["dtype"] == "float32"  # an option overrides the profile's fact


def test_profile_target_reads_what_a_profile_recorded() -> None:
    assert machine_cache.profile_target({"framework": "torch", "dtype": "int64"})["dtype"] == \
        "float32"  # no calibration runs in an integer dtype
    for meta, key in (({"framework": "jax"}, "framework"), ({"threads": 0}, "threads"),
                      ({"device": 3}, "device")):
        with pytest.raises(ValueError, match=rf'^meta\["{key}"\]: '):
            machine_cache.profile_target(meta)


@pytest.mark.slow
def test_numpy_at_another_thread_count_is_measured_in_a_child(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # numpy's BLAS fixes its threads when numpy loads: a profile recorded at another count is
    # measured by a child started with it (tiny sizes here; the child is given them).
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name, value in (("CPU_SIZES", (16, 32)), ("CPU_COPY_BYTES", 2**16),
                        ("MATMUL_SECONDS", 0.005), ("COPY_SECONDS", 0.005),
                        ("OVERHEAD_CALLS", 20)):
        monkeypatch.setattr(calibration, name, value)
    other = machine_cache.machine_facts()["threads"] + 1
    machine = calibration.resolve_machine("calibrate", meta={"framework": "numpy",
                                                             "threads": other})
    assert machine is not None and machine.source.startswith("measured ")
    assert machine.facts["threads"] == other and machine.peak_flops > 0
    assert set(machine.facts["matmul_flops_by_size"]) == {"16", "32"}
    again = machine_cache.cached_machine("numpy", threads=other)
    assert again is not None and again.peak_flops == machine.peak_flops
    assert machine_cache.cached_machine("numpy") is None  # this process's count: not measured


# ------------------------------------------------------------------ tracetorch run
def test_run_prints_the_bottlenecks_when_a_fitting_calibration_is_cached(
        script: str, tmp_path: Path, measured: list[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", script]) == 0
    err = capsys.readouterr().err
    assert "Bottlenecks" not in err and "no calibration of this machine for numpy, cpu, " \
        "float32" in err
    tracetorch.calibrate("numpy", dtype="float64", verbose=False)  # not the run's dtype
    assert main(["run", script]) == 0
    assert "Bottlenecks" not in capsys.readouterr().err
    tracetorch.calibrate("numpy", dtype="float32", verbose=False)
    saved = str(tmp_path / "run.json")
    assert main(["run", "-o", saved, script]) == 0
    err = capsys.readouterr().err
    assert "Bottlenecks (roofline per layer)" in err and "Where to look first" in err
    assert "(cache (measured now); numpy, cpu, float32" in err and "  MFU " in err
    loaded = tracetorch.load(saved)  # the outputs carry the machine the report used
    assert loaded.machine is not None and loaded.machine.facts["dtype"] == "float32"
    assert main(["run", "--machine", "none", script]) == 0
    err = capsys.readouterr().err
    assert "Bottlenecks" not in err and "no calibration" not in err
    assert len(measured) == 2  # run measured nothing without --machine calibrate


def test_run_machine_calibrate_measures_once(script: str, measured: list[dict[str, Any]],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(2):
        assert main(["run", "--machine", "calibrate", script]) == 0
        assert "Bottlenecks (roofline per layer)" in capsys.readouterr().err
    assert [(f["framework"], f["dtype"]) for f in measured] == [("numpy", "float32")]


def test_run_with_user_peaks_and_bad_options(script: str, tmp_path: Path,
                                             measured: list[dict[str, Any]],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--peak-flops", "1e12", "--bandwidth", "1e11", script]) == 0
    assert "call overhead not measured (--peak-flops, --bandwidth); ridge 10 FLOP/B" in \
        capsys.readouterr().err
    marker = tmp_path / "ran"
    Path(script).write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert main(["run", "--peak-flops", "1e12", script]) == 2  # before the script runs
    assert "--peak-flops and --bandwidth go together" in capsys.readouterr().err
    assert not marker.exists() and not measured


# ------------------------------------------------------------------ tracetorch calibrate
def test_calibrate_measures_torch_when_installed_or_both(
        torch: Any, measured: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate"]) == 0
    assert [f["framework"] for f in measured] == ["torch"]
    assert main(["calibrate", "--framework", "both"]) == 0  # torch's is cached by now
    assert [f["framework"] for f in measured] == ["torch", "numpy"]
    out = capsys.readouterr().out
    assert out.count("tracetorch machine: ") == 3 and "torch, cpu, float32" in out


def test_report_notes_a_profile_from_another_cpu(tmp_path: Path, measured: list[dict[str, Any]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from tracetorch.core import Linear, Tensor

    layer = Linear(4, 4)
    with tracetorch.profile(layer) as prof:
        layer(Tensor(np.ones((2, 4), dtype=np.float32)))
    prof.meta["cpu"] = "Some Other CPU"
    path = str(tmp_path / "run.json")
    prof.save(path)
    assert main(["report", path, "--machine", "calibrate"]) == 0
    assert "the profile ran on 'Some Other CPU'; these peaks are this machine's" in \
        capsys.readouterr().err


# ------------------------------------------------------------------ a damaged machine entry
def test_a_damaged_machine_entry_is_said_once_alike_by_every_view(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: table() (and so `tracetorch report` and print) raised, the HTML said nothing
    # in its summary, the summary said it as a "Bottlenecks:" line.
    from tracetorch.core import Linear, Tensor

    layer = Linear(4, 4)
    with tracetorch.profile(layer) as prof:
        layer(Tensor(np.ones((2, 4), dtype=np.float32)))
    prof.meta["machine"] = {"peak_flops": 1e12}
    path = str(tmp_path / "run.json")
    prof.save(path)
    loaded = tracetorch.load(path)
    said = ("entry set aside, no bottleneck section: meta[\"machine\"]: missing field "
            "'bandwidth_bytes_per_s'")
    views = {"table": loaded.table(), "str": str(loaded),
             "summary": "\n".join(summary_lines(loaded))}
    _, report = page_data(loaded)
    views["html"] = json.dumps(report)
    assert ["Machine", said] in report["summary"] and "bottleneck" not in report
    assert main(["report", path]) == 0
    views["report"] = capsys.readouterr().out
    for name, text in views.items():
        assert text.replace('\\"', '"').count(said) == 1, name
        assert "Bottlenecks" not in text, name
    assert loaded.machine is None
    with pytest.raises(ValueError, match=r"^machine: its machine entry is set aside \(meta"):
        loaded.analyze()
    assert os.path.exists(path)
