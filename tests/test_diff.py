"""tracetorch.diff and `tracetorch diff`: layers matched by call path, the noise rule, CI exits."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import tracetorch as tt
from support.trees import encoder_tree
from tracetorch.analysis.diff import ProfileDiff
from tracetorch.cli.main import main
from tracetorch.core import Linear, ReLU, Sequential, Tensor
from tracetorch.records.result import ProfileResult
from tracetorch.records.tree import CallNode


class Ticks:
    """A clock that moves ``step`` ns per read: every layer's time is a whole number of steps."""

    def __init__(self, step: int) -> None:
        self.now, self.step = 0, step

    def __call__(self) -> int:
        self.now += self.step
        return self.now


def recorded(step: int, width: int = 16, calls: int = 4) -> ProfileResult:
    model = Sequential(Linear(8, width), ReLU(), Linear(width, 2))
    with tt.profile(model, clock=Ticks(step)) as prof:
        for _ in range(calls):
            model(Tensor(np.ones((3, 8))))
    return prof


def one_layer(times: list[int], flops_per_call: int = 100, name: str = "fc") -> ProfileResult:
    root = CallNode.root()
    node = root.child(name, "Linear", "m")
    for ns in times:
        node.time.add(ns)
    node.flops = flops_per_call * len(times)
    return ProfileResult(root)


def test_a_clock_half_again_as_slow_is_a_flagged_50_percent_everywhere() -> None:
    d = tt.diff(recorded(1000), recorded(1500))
    assert [layer.path for layer in d.layers] == ["(Sequential)", "layers.0", "layers.1",
                                                  "layers.2"]  # by total time change
    for layer in d.layers:
        assert layer.mean_change_percent == 50.0 and layer.flagged  # no spread: any change
        assert layer.change("calls") == 0 and layer.flops_change_percent == 0.0
        assert layer.change("total_ns") == layer.base["total_ns"] // 2  # type: ignore[index]
    assert [x.path for x in d.regressions(49.9)] == [x.path for x in d.layers]
    assert d.regressions(50) == []
    base, new = d.totals["time_ns"]
    assert new * 2 == base * 3
    assert d.only_base == d.only_new == []


def test_the_noise_rule_is_three_standard_errors_of_both_runs() -> None:
    base = one_layer([90, 110])  # mean 100, std 10, n 2: standard error 10/sqrt(2)
    noise = 3 * 10 / math.sqrt(2)  # 21.21 ns
    under = tt.diff(base, one_layer([111, 131])).layers[0]  # +21 ns
    over = tt.diff(base, one_layer([112, 132])).layers[0]  # +22 ns
    assert under.noise_ns == pytest.approx(noise) and over.noise_ns == pytest.approx(noise)
    assert (under.flagged, over.flagged) == (False, True)
    # The noisier run decides: new's std 40 over 2 calls -> 3 * 40 / sqrt(2) = 84.9 ns.
    noisy = tt.diff(base, one_layer([140, 220])).layers[0]  # +80 ns
    assert noisy.noise_ns == pytest.approx(3 * 40 / math.sqrt(2)) and not noisy.flagged
    # More calls, smaller standard errors: the same +22% is now beyond noise.
    many = tt.diff(one_layer([90, 110] * 8), one_layer([112, 132] * 8)).layers[0]
    assert many.noise_ns == pytest.approx(3 * 10 / 4) and many.flagged
    assert tt.diff(base, one_layer([111, 131]), sigmas=2).layers[0].flagged


def test_regressions_need_the_flag_for_time_but_not_for_flops() -> None:
    base = one_layer([90, 110])
    assert tt.diff(base, one_layer([111, 131])).regressions(10) == []  # +21%, within noise
    assert [r.path for r in tt.diff(base, one_layer([112, 132])).regressions(10)] == ["fc"]
    heavier = tt.diff(base, one_layer([90, 110], flops_per_call=120)).layers[0]
    assert heavier.flops_change_percent == pytest.approx(20.0) and not heavier.flagged
    assert heavier.regressed(10) and not heavier.regressed(20)
    faster = tt.diff(one_layer([200, 200]), one_layer([100, 100])).layers[0]
    assert faster.flagged and faster.mean_change_percent == -50.0 and not faster.regressed(0)


def test_layers_in_one_run_only_are_listed_not_regressions() -> None:
    root, model, encoder, fc, relu, head = encoder_tree()
    for node in (model, encoder, fc, relu, head):
        node.time.add(100)
    other = CallNode.root()
    m2 = other.child("", "Sequential", "m0")
    m2.time.add(100)
    m2.child("encoder", "Encoder", "m1").time.add(50)
    m2.child("extra", "Dropout", "m9").time.add(10)
    d = tt.diff(ProfileResult(root), ProfileResult(other))
    assert [x.path for x in d.only_base] == ["encoder.0", "encoder.1", "head"]
    assert [x.path for x in d.only_new] == ["extra"]
    assert {x.status for x in d.only_base} == {"only_base"}
    assert d.regressions(0) == [] or all(x.status == "both" for x in d.regressions(0))
    text = str(d)
    assert "Only in base (3): encoder.0, encoder.1, head" in text
    assert "Only in new (1): extra" in text


def test_a_path_met_twice_is_matched_by_order() -> None:
    def run(first: int, second: int) -> ProfileResult:
        root = CallNode.root()
        for thread, ns in (("thread a", first), ("thread b", second)):
            group = root.child(thread, "thread", "", kind="thread")
            group.child("fc", "Linear", "m").time.add(ns)
        return ProfileResult(root)
    d = tt.diff(run(100, 200), run(100, 300), sort="path")
    assert [(x.path, x.change("total_ns")) for x in d.layers] == [
        ("thread a", 0), ("thread a.fc", 0), ("thread b", 100), ("thread b.fc", 100)]


@pytest.mark.parametrize("sort, first", [("time", "b"), ("calls", "c"), ("flops", "a"),
                                         ("path", "a"), ("mean", "b")])
def test_sort_puts_the_largest_change_first(sort: str, first: str) -> None:
    def run(scale: int) -> ProfileResult:
        root = CallNode.root()
        for name, ns, calls, flops in (("a", 10, 1, 100 * scale), ("b", 100 * scale, 1, 1),
                                       ("c", 10, scale, 1)):
            node = root.child(name, "Linear", name)
            for _ in range(calls):
                node.time.add(ns)
            node.flops = flops
        return ProfileResult(root)
    assert tt.diff(run(1), run(5), sort=sort).layers[0].path == first


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="sort must be one of 'time'"):
        tt.diff(one_layer([1]), one_layer([1]), sort="size")
    with pytest.raises(ValueError, match="sigmas"):
        tt.diff(one_layer([1]), one_layer([1]), sigmas=-1)
    with pytest.raises(TypeError, match="new must be a ProfileResult or the path"):
        tt.diff(one_layer([1]), 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="percent"):
        tt.diff(one_layer([1]), one_layer([1])).regressions(-1)
    with pytest.raises(FileNotFoundError):
        tt.diff("/no/such/base.json", one_layer([1]))


def test_text_json_and_html(tmp_path: Path) -> None:
    d = tt.diff(one_layer([90, 110], name="<b>fc</b>"), one_layer([112, 132], name="<b>fc</b>"))
    assert isinstance(d, ProfileDiff)
    text = d.table(width=120, color=False)
    row = next(line for line in text.splitlines() if line.startswith("<b>fc</b>"))
    assert row.split()[1:5] == ["2", "100", "ns", "122"] and "+22.0% *" in row
    assert "Total time:    200 ns -> 244 ns (+22.0%)" in text
    assert "1 layers in both runs, 1 with a time change beyond noise." in text
    data = json.loads(json.dumps(d.to_dict(), allow_nan=False))
    layer = data["layers"][0]
    assert (data["format"], layer["path"], layer["flagged"]) == ("tracetorch-diff", "<b>fc</b>",
                                                                True)
    assert layer["change"]["mean_ns"] == 22.0 and layer["base"]["calls"] == 2
    page = d._repr_html_()
    assert "&lt;b&gt;fc&lt;/b&gt;" in page and "<b>fc" not in page and "<script" not in page
    d.save_html(str(tmp_path / "d.html"))
    assert (tmp_path / "d.html").read_text().startswith("<!DOCTYPE html>")
    grew = tt.diff(one_layer([10], flops_per_call=0), one_layer([10], flops_per_call=5))
    assert grew.to_dict()["layers"][0]["change"]["flops_per_call_percent"] is None  # from 0
    assert "new" in grew.table(width=120)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    one_layer([90, 110]).save(str(tmp_path / "base.json"))
    one_layer([112, 132]).save(str(tmp_path / "slower.json"))  # +22%, beyond noise
    one_layer([111, 131]).save(str(tmp_path / "noisy.json"))  # +21%, within noise
    return tmp_path


@pytest.mark.parametrize("new, args, status", [
    ("slower", ["--fail-above", "10%"], 1),
    ("slower", ["--fail-above", "25"], 0),
    ("noisy", ["--fail-above", "10%"], 0),
    ("noisy", ["--fail-above", "10%", "--sigmas", "2"], 1),
    ("slower", [], 0),
    ("slower", ["--fail-above", "ten"], 2),
    ("slower", ["--sort", "size"], 2),
    ("missing", [], 2),
])
def test_cli_exit_status(runs: Path, new: str, args: list[str], status: int,
                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diff", str(runs / "base.json"), str(runs / f"{new}.json"), *args])
    out, err = capsys.readouterr()
    assert code == status, (out, err)
    if status == 1:
        grew = "+22.0%" if new == "slower" else "+21.0%"
        assert f"tracetorch: 1 layer regressed more than 10%: fc (time/call {grew}" in out
    if status == 2:
        assert err.startswith("tracetorch: error:")


def test_cli_writes_json_and_html(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs / "base.json"), str(runs / "slower.json"), "--json",
                 str(runs / "d.json"), "--html", str(runs / "d.html"), "--top", "all"]) == 0
    assert json.loads((runs / "d.json").read_text())["layers"][0]["flagged"] is True
    assert "<table" in (runs / "d.html").read_text()
    assert "wrote" in capsys.readouterr().err
    assert main(["diff", str(runs / "base.json"), str(runs / "slower.json"), "--json",
                 str(runs / "no" / "d.json")]) == 2
