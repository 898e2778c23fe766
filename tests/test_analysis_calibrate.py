"""``tracetorch.calibrate`` and ``Machine``: the cache, refresh, user peaks and bad input.

The measurement itself is replaced by a fake here (no timing in tests); one test runs the real
one on tiny sizes and checks only what must hold whatever the machine (positive rates, facts).
``benchmarks/roofline.py`` measures for real.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tracetorch
from tracetorch.analysis import machine_cache
from tracetorch.analysis.machine import Machine
from tracetorch.tools import calibrate as calibration


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "tracetorch"


class FakeMeasure:
    """Stands in for the timing: each measurement returns the next peak, 1e9, 2e9, ..."""

    def __init__(self) -> None:
        self.facts: list[dict[str, Any]] = []

    def __call__(self, facts: dict[str, Any]) -> Machine:
        self.facts.append(facts)
        return Machine(peak_flops=1e9 * len(self.facts), bandwidth_bytes_per_s=1e8,
                       call_overhead_ns=2_000, source="measured today", facts=facts)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, cache_dir: Path) -> FakeMeasure:
    measure = FakeMeasure()
    monkeypatch.setattr(calibration, "measure", measure)
    return measure


def test_first_call_measures_prints_and_caches(fake: FakeMeasure, cache_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    machine = tracetorch.calibrate()
    assert machine.peak_flops == 1e9 and machine.source == "measured today"
    out = capsys.readouterr().out
    assert out.startswith("tracetorch machine: peak 1.00 GFLOP/s, bandwidth 100 MB/s, "
                          "call overhead 2.00 us (measured today; numpy, cpu, float32")
    assert f"cached in {cache_dir / 'machine.json'}" in out
    saved = json.loads((cache_dir / "machine.json").read_text())
    assert (saved["format"], saved["version"]) == machine_cache.CACHE_FORMAT
    [entry] = saved["machines"].values()
    assert entry["peak_flops"] == 1e9 and entry["facts"]["framework"] == "numpy"


def test_the_cache_answers_until_refresh(fake: FakeMeasure,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    tracetorch.calibrate(verbose=False)
    again = tracetorch.calibrate()
    assert len(fake.facts) == 1 and capsys.readouterr().out == ""
    assert again.peak_flops == 1e9 and again.source == "cache (measured today)"
    fresh = tracetorch.calibrate(refresh=True, verbose=False)
    assert len(fake.facts) == 2 and fresh.peak_flops == 2e9
    assert tracetorch.calibrate().peak_flops == 2e9  # refresh replaced the entry


def test_each_dtype_is_its_own_entry(fake: FakeMeasure, cache_dir: Path) -> None:
    tracetorch.calibrate(dtype="float32", verbose=False)
    tracetorch.calibrate(dtype="float64", verbose=False)
    tracetorch.calibrate(dtype="float32", verbose=False)
    assert [f["dtype"] for f in fake.facts] == ["float32", "float64"]
    keys = json.loads((cache_dir / "machine.json").read_text())["machines"]
    assert len(keys) == 2 and all("|numpy|cpu|" in key for key in keys)


def test_without_xdg_cache_home_the_cache_is_under_home(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert machine_cache.cache_path() == tmp_path / ".cache" / "tracetorch" / "machine.json"


def test_a_damaged_cache_is_ignored_with_a_warning(fake: FakeMeasure, cache_dir: Path) -> None:
    cache_dir.mkdir(parents=True)
    (cache_dir / "machine.json").write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable machine cache"):
        machine = tracetorch.calibrate(verbose=False)
    assert machine.peak_flops == 1e9
    assert json.loads((cache_dir / "machine.json").read_text())["machines"]  # rewritten


def test_a_foreign_cache_file_is_ignored(fake: FakeMeasure, cache_dir: Path) -> None:
    cache_dir.mkdir(parents=True)
    (cache_dir / "machine.json").write_text(json.dumps({"format": "other", "machines": {}}))
    with pytest.warns(UserWarning, match="not a tracetorch-machine-cache file"):
        tracetorch.calibrate(verbose=False)


def test_a_user_machine_with_datasheet_peaks() -> None:
    h100 = tracetorch.Machine(peak_flops=989e12, bandwidth_bytes_per_s=3.35e12,
                              source="H100 SXM datasheet, dense bf16")
    assert h100.call_overhead_ns == 0.0 and h100.ceiling(1e6) == 989e12
    assert h100.describe() == ("peak 989 TFLOP/s, bandwidth 3.35 TB/s, call overhead not "
                               "measured (H100 SXM datasheet, dense bf16)")
    assert Machine.from_dict(json.loads(json.dumps(h100.to_dict()))) == h100


@pytest.mark.parametrize("kwargs, argument", [
    ({"framework": "jax"}, "framework"),
    ({"device": "tpu"}, "device"),
    ({"device": "cuda"}, "device"),       # numpy has no GPU
    ({"dtype": "int8"}, "dtype"),
    ({"dtype": "bfloat16"}, "dtype"),     # not a numpy dtype
    ({"threads": 0}, "threads"),
    ({"threads": 2.0}, "threads"),
    ({"refresh": "yes"}, "refresh"),
])
def test_bad_calibrate_arguments_are_named(fake: FakeMeasure, kwargs: dict[str, Any],
                                           argument: str) -> None:
    with pytest.raises(ValueError, match=f"^{argument}: "):
        tracetorch.calibrate(**kwargs)
    assert not fake.facts


@pytest.mark.parametrize("kwargs, argument", [
    ({"peak_flops": 0, "bandwidth_bytes_per_s": 1e9}, "peak_flops"),
    ({"peak_flops": float("inf"), "bandwidth_bytes_per_s": 1e9}, "peak_flops"),
    ({"peak_flops": "fast", "bandwidth_bytes_per_s": 1e9}, "peak_flops"),
    ({"peak_flops": 1e12, "bandwidth_bytes_per_s": -1.0}, "bandwidth_bytes_per_s"),
    ({"peak_flops": 1e12, "bandwidth_bytes_per_s": 1e9, "call_overhead_ns": -5},
     "call_overhead_ns"),
])
def test_bad_machine_numbers_are_named(kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=f"^{argument}: "):
        tracetorch.Machine(**kwargs)


def test_a_saved_machine_missing_a_field_is_reported() -> None:
    with pytest.raises(ValueError, match=r"^meta: missing field 'bandwidth_bytes_per_s'"):
        Machine.from_dict({"peak_flops": 1e12}, where="meta")


def test_resolve_machine(monkeypatch: pytest.MonkeyPatch, torch: Any) -> None:
    from tracetorch.core import Linear

    asked: list[tuple[Any, ...]] = []
    monkeypatch.setattr(calibration, "calibrate",
                        lambda *args, **kwargs: asked.append(args + tuple(kwargs.items()))
                        or Machine(1.0, 1.0))
    user = Machine(1e12, 1e11)
    assert calibration.resolve_machine(user) is user
    assert calibration.resolve_machine(None) is None
    calibration.resolve_machine("calibrate", Linear(2, 2))
    calibration.resolve_machine("calibrate")  # no model, torch imported: as the run facts say
    calibration.resolve_machine("calibrate", torch.nn.Linear(2, 2).double())
    # A recorded profile: its own facts, whatever this process runs.
    calibration.resolve_machine("calibrate", meta={"framework": "torch", "device": "cpu",
                                                   "dtype": "bfloat16", "threads": 1})
    assert asked == [(), ("torch",), ("torch", "cpu", "float64"),
                     (("framework", "torch"), ("device", "cpu"), ("dtype", "bfloat16"),
                      ("threads", 1))]
    with pytest.raises(TypeError, match="^machine: expected a tracetorch.Machine"):
        calibration.resolve_machine("fast")


def test_the_real_measurement_on_tiny_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only what holds on any machine: the timing's numbers belong to benchmarks/roofline.py.
    for name, value in (("CPU_SIZES", (16, 32)), ("CPU_COPY_BYTES", 2**16),
                        ("MATMUL_SECONDS", 0.005), ("COPY_SECONDS", 0.005),
                        ("OVERHEAD_CALLS", 20)):
        monkeypatch.setattr(calibration, name, value)
    machine = calibration.measure(machine_cache.machine_facts("numpy"))
    assert machine.peak_flops > 0 and machine.bandwidth_bytes_per_s > 0
    assert machine.call_overhead_ns > 0 and machine.source.startswith("measured ")
    assert set(machine.facts["matmul_flops_by_size"]) == {"16", "32"}
    assert machine.peak_flops == max(machine.facts["matmul_flops_by_size"].values())
