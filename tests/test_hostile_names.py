"""Hostile module and class names through every output: nothing reaches a terminal, a
spreadsheet or a viewer as a command.

The names carry ESC (``\\x1b[31m`` recolours a terminal, ``\\x1b[2J`` clears it), BEL, NUL and
U+202E (right-to-left override: what follows it is shown reversed), and one starts with
``=cmd|`` (a spreadsheet runs it as a formula). Text outputs (tables, diff, bottleneck report,
the unsupported-layer warning, CLI status lines) and the viewers' files (Chrome trace,
speedscope, HTML) show each such character as the escape ``tracetorch.text.units.printable``
writes; the CSV prefixes a formula cell with ``'``; the JSON profile keeps every name exactly.
"""
from __future__ import annotations

import collections
import csv
import itertools
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import tracetorch
from test_report_html_browser import Report, browser  # noqa: F401 - the fixture, for pytest
from tracetorch.analysis.machine import Machine
from tracetorch.cli.main import main
from tracetorch.cli.progress import ProgressLine
from tracetorch.records.result import ProfileResult
from tracetorch.records.tree import CallNode
from tracetorch.report.bottleneck import render_analysis
from tracetorch.report.csv import csv_cell
from tracetorch.report.flat_table import render_flat
from tracetorch.report.table import node_label
from tracetorch.text.units import printable

#: Characters that must never reach a terminal or a viewer as they are.
RAW = ("\x1b", "\x07", "\x00", "\u202e")
#: A class name: ESC, BEL and U+202E (Python refuses NUL in a class name).
TYPE = "Evil\x1b[31m\x07\u202eKls"
#: A module name (a path part): NUL, a screen-clearing ESC sequence, U+202E.
NAME = "e\x00\x1b[2J\u202etxtexe"
#: A module name a spreadsheet would run as a formula.
FORMULA = "=cmd|' /C calc'!A0"

_classes = itertools.count()


def assert_clean(text: str) -> None:
    found = [repr(c) for c in RAW if c in text]
    assert not found, f"raw {', '.join(found)} in {text!r}"


def strings(value: Any) -> Iterator[str]:
    """Every string (keys included) of a JSON document."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def test_printable_escapes_controls_and_bidi_and_keeps_the_rest() -> None:
    assert printable(TYPE) == "Evil\\x1b[31m\\x07\\u202eKls"
    assert printable(NAME) == "e\\x00\\x1b[2J\\u202etxtexe"
    # Every bidi embedding, override, isolate and mark, C1 controls, line separators.
    for c in "\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u200e\u200f\u061c\x85\x9b\u2028":
        assert printable(c) == repr(c)[1:-1] and printable(c).isascii()
    kept = "encoder.layer.0 (Linear) Übersetzer 注意力 =cmd|"
    assert printable(kept) == kept
    assert printable(printable(TYPE)) == printable(TYPE)  # escaping twice changes nothing


# ------------------------------------------------------------------ a recorded torch model
def hostile_model(torch: ModuleType) -> tuple[Any, str]:
    """A model with a layer named FORMULA and an unsupported one named NAME, of a class named
    like TYPE (unique per call: the unsupported warning comes once per class and process)."""
    nn = torch.nn
    out = torch.zeros(2, 4)
    type_name = f"{TYPE}{next(_classes)}"
    # Runs no tensor operation and returns no input: its FLOPs are unknown, so it is warned of.
    evil = type(type_name, (nn.Module,), {"forward": lambda self, x: out})
    model = nn.Sequential(collections.OrderedDict([(FORMULA, nn.Linear(4, 4)), (NAME, evil())]))
    return model, type_name


@pytest.fixture
def recorded(torch: ModuleType) -> ProfileResult:
    model, _ = hostile_model(torch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracetorch.profile(model, timeline=True) as prof:
            for _ in range(2):
                model(torch.ones(2, 4))
    return prof


def test_the_unsupported_warning_escapes_the_class_name(torch: ModuleType) -> None:
    model, type_name = hostile_model(torch)
    with pytest.warns(UserWarning, match="no FLOP rule") as caught:
        with tracetorch.profile(model):
            model(torch.ones(2, 4))
    (message,) = [str(w.message) for w in caught if "no FLOP rule" in str(w.message)]
    assert_clean(message)
    assert f"no FLOP rule for {printable(type_name)} " in message


@pytest.mark.parametrize("color", [False, True])
def test_text_tables_escape_names(recorded: ProfileResult, color: bool) -> None:
    for text in (recorded.table(color=color, width=200),
                 render_flat(recorded, view="type", color=color, width=200),
                 render_flat(recorded, view="module", color=color, width=200)):
        # With colour, the only ESC left is the table's own SGR codes, never the name's.
        assert "\x07" not in text and "\x00" not in text and "\u202e" not in text
        assert printable(TYPE) in text
        if not color:
            assert_clean(text)
    assert_clean(recorded._repr_html_())  # the notebook's table: labels, tooltips, summary
    tree = recorded.table(color=False, width=200)
    assert f"{printable(NAME)} ({printable(recorded.find(NAME).type_name)})" in tree
    assert "Unsupported:   " + printable(recorded.find(NAME).type_name) in tree  # the summary


def test_the_json_profile_keeps_names_exactly(recorded: ProfileResult, tmp_path: Path) -> None:
    recorded.save(str(tmp_path / "run.json"))
    loaded = tracetorch.load(str(tmp_path / "run.json"))
    assert [(n.path, n.type_name) for n in loaded.root.walk()] == \
        [(n.path, n.type_name) for n in recorded.root.walk()]
    assert loaded.find(NAME).type_name.startswith(TYPE)


def test_chrome_trace_and_speedscope_show_escaped_names(recorded: ProfileResult,
                                                        tmp_path: Path) -> None:
    recorded.export_chrome_trace(str(tmp_path / "run.trace.json"))
    recorded.export_speedscope(tmp_path / "run.speedscope.json")
    trace = json.loads((tmp_path / "run.trace.json").read_text(encoding="utf-8"))
    speedscope = json.loads((tmp_path / "run.speedscope.json").read_text(encoding="utf-8"))
    for document in (trace, speedscope):
        for text in strings(document):
            assert_clean(text)
    slices = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {printable(NAME), FORMULA} <= slices
    node = recorded.find(NAME)
    assert {"name": node_label(node), "file": printable(NAME)} in speedscope["shared"]["frames"]


def test_csv_escapes_formulas_and_keeps_numbers(recorded: ProfileResult, tmp_path: Path) -> None:
    recorded.to_csv(tmp_path / "run.csv")
    with open(tmp_path / "run.csv", newline="", encoding="utf-8") as handle:
        rows = {row["path"]: row for row in csv.DictReader(handle)}
    formula = rows["'" + FORMULA]
    assert formula["name"] == "'" + FORMULA and formula["type"] == "Linear"
    # 2 calls of Linear(4, 4) on 2 rows: 2 * (2 * 2*4*4) FLOPs; numbers stay numbers.
    assert formula["flops"] == "128" and float(formula["mean_ns"]) > 0
    assert NAME in rows  # not a formula: exact (the CSV is data; a spreadsheet shows no ESC)
    cells = ["=1+1", "+1", "-1", "@SUM(A1)", "\t=1", "\r=1", "-", "-, [2, 4]"]
    assert [csv_cell(c) for c in cells] == ["'" + c for c in cells]
    assert [csv_cell(v) for v in (-1.5, -3, 0, None, "fc", "a=b")] == [-1.5, -3, 0, None, "fc",
                                                                        "a=b"]


def hostile_tree(ns: int, extra: bool = False) -> ProfileResult:
    """One layer named NAME of type TYPE taking ``ns`` per call, with FLOPs and bytes (so the
    bottleneck analysis labels it); ``extra`` adds a layer only this run has."""
    root = CallNode.root()
    layer = root.child(NAME, TYPE, "m0")
    layer.flops_source = "rule"
    for _ in range(4):
        layer.time.add(ns)
    layer.flops = layer.gemm_flops = 4 * 10**6
    layer.memory.input_bytes = layer.memory.output_bytes = 4 * 10**5
    if extra:
        root.child(FORMULA + "\x1b]0;title\x07", "New\u202e", "m1").time.add(ns)
    return ProfileResult(root)


def test_the_diff_text_html_and_cli_escape_names(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    base_file, new_file = tmp_path / "base\x1b[2J.json", tmp_path / "new\u202e.json"
    hostile_tree(1_000).save(str(base_file))
    hostile_tree(5_000, extra=True).save(str(new_file))
    result = tracetorch.diff(str(base_file), str(new_file))
    text = result.table(width=200, color=False)
    assert_clean(text)
    assert printable(NAME) in text and printable(str(base_file)) in text
    assert "Only in new (1): " + printable(FORMULA + "\x1b]0;title\x07") in text
    assert_clean(result._repr_html_())  # the notebook's view
    result.save_html(str(tmp_path / "diff.html"))
    assert_clean((tmp_path / "diff.html").read_text(encoding="utf-8"))

    status = main(["diff", str(base_file), str(new_file), "--fail-above", "10",
                   "--width", "200", "--json", str(tmp_path / "wrote\x07.json")])
    out, err = capsys.readouterr()
    assert status != 0 and "regressed more than 10%: " + printable(NAME) in out
    assert_clean(out)
    assert_clean(err)
    assert "wrote " + printable(str(tmp_path / "wrote\x07.json")) in err


def test_the_bottleneck_report_escapes_layer_names() -> None:
    result = hostile_tree(10**6)
    analysis = result.analyze(Machine(1e12, 1e10))
    assert analysis.look_first  # the layer is listed under "Where to look first"
    text = render_analysis(analysis)
    assert_clean(text)
    assert f"1. {printable(NAME)}" in text
    result.meta["machine"] = Machine(1e12, 1e10).to_dict()
    table = result.table(width=200, color=False)  # the summary appends the same section
    assert_clean(table)
    assert f"1. {printable(NAME)}" in table


def test_the_progress_line_escapes_what_it_shows() -> None:
    import io

    out = io.StringIO()
    line = ProgressLine(out, enabled=True)
    line.show(f"step 1/2  {NAME}")
    assert out.getvalue() == f"\rstep 1/2  {printable(NAME)}"


def test_run_status_lines_and_report_escape_names(torch: ModuleType, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "train\x1b[31m\u202e.py"
    script.write_text(
        "import collections, torch\n"
        f"Evil = type({TYPE + 'Run'!r}, (torch.nn.Module,), "
        "{'forward': lambda self, x: torch.zeros(2, 4)})\n"
        f"model = torch.nn.Sequential(collections.OrderedDict([({FORMULA!r}, "
        f"torch.nn.Linear(4, 4)), ({NAME!r}, Evil())]))\n"
        "model(torch.ones(2, 4))\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warning itself: test_the_unsupported_warning_...
        status = main(["run", "-o", "out\x07.json", "--csv", "rows\x1b[2J.csv",
                       "--width", "200", script.name])
    out, err = capsys.readouterr()
    assert status == 0
    assert_clean(out)
    assert_clean(err)
    assert f"tracetorch: {printable(script.name)} exited with status 0" in err
    assert "tracetorch: wrote out\\x07.json" in err and "wrote rows\\x1b[2J.csv" in err
    assert printable(NAME) in err
    assert tracetorch.load(str(tmp_path / "out\x07.json")).find(NAME).type_name == TYPE + "Run"


@pytest.mark.slow
def test_the_html_report_shows_escaped_names_in_chromium(
        browser: Any, recorded: ProfileResult, tmp_path: Path) -> None:  # noqa: F811
    recorded.meta["name"] = "run\x1b[2J\u202e"
    report = Report(browser, recorded, tmp_path / "hostile.html")
    nodes = list(recorded.root.walk())
    for row in report.rows():
        assert row["name"] == node_label(nodes[row["id"]])
    assert report.page.title() == "tracetorch profile: " + printable("run\x1b[2J\u202e")
    # Every text and attribute value of the page, the tooltips' titles included.
    shown = report.page.evaluate("""() => {
        const out = [document.title, document.body.innerText];
        for (const el of document.querySelectorAll('#tt-app *'))
          for (const a of el.attributes) out.push(a.value);
        return out; }""")
    for text in shown:
        assert_clean(text)
    assert printable(NAME) in shown[1] and FORMULA in shown[1]
    report.page.fill("#tt-filter", "txtexe")  # the filter shows paths: escaped as well
    filtered = report.rows()
    assert [r["name"] for r in filtered] == [
        f"{printable(NAME)} ({printable(recorded.find(NAME).type_name)})"]
    report.close()


def test_the_ranks_section_escapes_the_stragglers_layers() -> None:
    from test_distributed_merge import rank_profile
    from tracetorch.distributed import merge_profiles
    from tracetorch.report.ranks import render_ranks

    merged = merge_profiles([rank_profile(0, 100, compute_ns=1_000),
                             rank_profile(1, 900, compute_ns=2_600)])
    # What a saved merge of a model with such a layer holds (the helper's layers are net.*).
    merged.meta["distributed"]["straggler"]["layers"][0]["path"] = NAME
    text = render_ranks(merged)
    assert_clean(text)
    assert f"  {printable(NAME)}: +" in text


@pytest.mark.slow
def test_the_html_ranks_section_shows_escaped_hosts_and_layers(
        browser: Any, tmp_path: Path) -> None:  # noqa: F811
    from test_distributed_merge import rank_profile
    from tracetorch.distributed import merge_profiles

    ranks = [rank_profile(0, 100, compute_ns=1_000), rank_profile(1, 900, compute_ns=2_600)]
    ranks[1].meta["distributed"]["host"] = "host\x1b[2J\u202e"
    merged = merge_profiles(ranks)
    merged.meta["distributed"]["straggler"]["layers"][0]["path"] = NAME  # as in the text test
    report = Report(browser, merged, tmp_path / "ranks.html")
    text = report.page.inner_text("#tt-ranks")
    assert_clean(text)
    assert printable("host\x1b[2J\u202e") in text and printable(NAME) + ": +" in text
    report.close()
