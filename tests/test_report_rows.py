"""Flat records of a profile: to_rows, CSV and a pandas DataFrame."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from support.trees import add_flops, encoder_tree
from tracetorch.records.result import ProfileResult
from tracetorch.records.rows import ROW_FIELDS, row_fields, to_rows
from tracetorch.records.tree import CallNode


def built() -> ProfileResult:
    tree = root, model, encoder, fc, relu, head = encoder_tree()
    for node, times in ((model, [1_000, 3_000]), (encoder, [600, 1_800]), (fc, [400, 1_200]),
                        (relu, [100, 300]), (head, [300, 900])):
        for ns in times:
            node.time.add(ns)
    add_flops(tree)
    fc.params = 20
    fc.backward_time.add(800)
    fc.backward_flops = 4000
    fc.note_shapes(((2, 8),), ((2, 4),))
    fc.note_shapes(((3, 8),), ((3, 4),))
    fc.memory.input_bytes, fc.memory.output_bytes, fc.memory.param_bytes = 160, 80, 96
    return ProfileResult(root)


def test_one_row_per_node_parents_first_with_every_statistic() -> None:
    rows = to_rows(built())
    assert [r["path"] for r in rows] == ["", "encoder", "encoder.0", "encoder.1", "head"]
    assert [r["parent"] for r in rows] == [None, "", "encoder", "encoder", ""]
    assert [r["depth"] for r in rows] == [1, 2, 3, 3, 2]
    model, encoder, fc = rows[0], rows[1], rows[2]
    assert (model["type"], model["kind"], model["name"]) == ("Sequential", "module", "")
    assert (model["flops"], model["subtree_flops"], model["subtree_gemm_flops"]) == (0, 2700, 2600)
    assert (encoder["self_ns"], encoder["total_ns"]) == (400, 2400)
    assert fc == {
        **fc, "calls": 2, "flops": 2000, "gemm_flops": 2000, "macs": 1000, "params": 20,
        "mean_ns": 800.0, "min_ns": 400, "max_ns": 1200, "std_ns": 400.0,
        "backward_calls": 1, "backward_ns": 800, "backward_flops": 4000,
        "subtree_backward_flops": 4000, "completeness": "complete", "flops_source": "rule",
        "input_shapes": "[2, 8] | [3, 8]", "output_shapes": "[2, 4] | [3, 4]", "errors": 0,
        "input_bytes": 160, "output_bytes": 80, "param_bytes": 96, "bytes_moved": 160 + 80 + 2 * 96}
    assert rows[3]["macs"] is None and encoder["subtree_backward_flops"] == 4000
    time = built().find("encoder.0").time  # the sketch's quantiles, as the node answers them
    assert [fc[f"p{q}_ns"] for q in (50, 90, 99)] == [time.quantile(q / 100) for q in (50, 90, 99)]
    assert list(fc)[:len(ROW_FIELDS)] == list(ROW_FIELDS)


def test_an_empty_profile_has_no_rows() -> None:
    assert to_rows(ProfileResult(CallNode.root())) == []
    assert row_fields([]) == list(ROW_FIELDS)


def test_csv_has_a_stable_header_and_reads_back(tmp_path: Path) -> None:
    result = built()
    result.to_csv(str(tmp_path / "run.csv"))
    with open(tmp_path / "run.csv", newline="") as handle:
        read = list(csv.DictReader(handle))
    assert list(read[0]) == row_fields(to_rows(result))
    assert list(read[0])[:7] == ["path", "name", "type", "kind", "depth", "parent", "calls"]
    assert [r["path"] for r in read] == ["", "encoder", "encoder.0", "encoder.1", "head"]
    assert read[0]["parent"] == "" and read[3]["macs"] == ""  # None is an empty cell
    assert read[2]["total_ns"] == "1600" and read[2]["input_shapes"] == "[2, 8] | [3, 8]"


def test_dataframe() -> None:
    pandas = pytest.importorskip("pandas", reason="pip install pandas (in the test extra)")
    frame = built().to_dataframe()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns) == row_fields(to_rows(built()))
    assert frame.set_index("path").loc["encoder.0", "subtree_flops"] == 2000
    assert int(frame["flops"].sum()) == built().forward_flops


def test_dataframe_without_pandas_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # what an uninstalled module looks like
    with pytest.raises(ImportError, match="pip install pandas"):
        built().to_dataframe()


@pytest.mark.slow
def test_import_tracetorch_does_not_import_pandas() -> None:
    code = ("import sys, tracetorch; tracetorch.ProfileResult; "
            "print('pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"
