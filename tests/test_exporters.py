"""``result.export(format, path)``: every registered format, from a plain ``import tracetorch``.

The result reaches its writers through the registry of :mod:`tracetorch.records.views`, filled
when the package loads; a fresh interpreter that imports nothing else must find them all.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tracetorch
from tracetorch.records.views import exporter_names

SCRIPT = """
import sys, tracetorch
from tracetorch.core import Linear, Tensor
layer = Linear(4, 2)
with tracetorch.profile(timeline=True) as prof:
    layer(Tensor([[1.0, 2.0, 3.0, 4.0]]))
for name, path in zip(sys.argv[1::2], sys.argv[2::2]):
    prof.export(name, path)
"""


@pytest.mark.slow
def test_every_format_is_written_from_a_fresh_import_tracetorch(tmp_path: Path) -> None:
    names = exporter_names()
    assert {"json", "chrome", "speedscope", "csv", "html", "text"} <= set(names)
    args = [item for name in names for item in (name, str(tmp_path / f"run.{name}"))]
    subprocess.run([sys.executable, "-c", SCRIPT, *args], check=True, timeout=120)
    for name in names:
        assert (tmp_path / f"run.{name}").stat().st_size > 0, name
    assert tracetorch.load(tmp_path / "run.json").find("").calls == 1
    assert json.loads((tmp_path / "run.chrome").read_text())["traceEvents"]
    assert "Linear" in (tmp_path / "run.text").read_text(encoding="utf-8")
    assert (tmp_path / "run.csv").read_text().startswith("path,name,type")


def test_the_methods_write_what_export_writes(tmp_path: Path) -> None:
    from tracetorch.core import Linear, Tensor

    layer = Linear(3, 3)
    with tracetorch.profile() as prof:
        layer(Tensor([[1.0, 2.0, 3.0]]))
    prof.to_csv(tmp_path / "method.csv")
    prof.export("csv", tmp_path / "export.csv")
    assert (tmp_path / "method.csv").read_text() == (tmp_path / "export.csv").read_text()


def test_an_unknown_format_names_the_argument_and_the_formats(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"format: expected one of 'json', .*got 'xml'"):
        tracetorch.ProfileResult(tracetorch.profile().root).export("xml", tmp_path / "x")
    assert not (tmp_path / "x").exists()
