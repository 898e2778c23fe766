"""The text table in a terminal: fitted to a width, columns by priority or by name, long names
shortened in the middle, colour only where asked."""
from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest

import tracetorch as tt
from support.trees import encoder_tree
from test_report_table import build, cells, rows
from tracetorch.cli.main import main
from tracetorch.core import Linear, ReLU, Sequential, Tensor
from tracetorch.records.result import ProfileResult
from tracetorch.report.flat_table import FLAT_COLUMNS, render_flat
from tracetorch.report.table import TREE_COLUMNS, render_table
from tracetorch.text.layout import DEFAULT_WIDTH, color_enabled, elide_middle, terminal_width

README = Path(__file__).resolve().parent.parent / "README.md"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def headers(text: str) -> list[str]:
    return re.split(r"\s{2,}", text.splitlines()[0].strip())


def table_lines(text: str) -> list[str]:
    return text.splitlines()[:2] + rows(text)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_wide_terminal_shows_every_column() -> None:
    assert headers(render_table(build(), width=200)) == [
        "Name", "Calls", "FLOPs", "MACs", "Self time", "Total time", "% time", "FLOP/s"]


@pytest.mark.parametrize("width, kept", [
    (96, ["Name", "Calls", "FLOPs", "MACs", "Self time", "Total time", "% time", "FLOP/s"]),
    (95, ["Name", "Calls", "FLOPs", "Self time", "Total time", "% time", "FLOP/s"]),
    (80, ["Name", "Calls", "FLOPs", "Self time", "Total time", "% time"]),
    (60, ["Name", "Calls", "FLOPs", "Total time", "% time"]),
    (40, ["Name", "Total time", "% time"]),
    (10, ["Name"]),
])
def test_columns_are_dropped_by_priority_to_fit(width: int, kept: list[str]) -> None:
    text = render_table(build(), width=width)
    assert headers(text) == kept
    if len(kept) > 1:
        assert max(len(line) for line in table_lines(text)) <= width
    left_out = [c for c in headers(render_table(build(), width=200)) if c not in kept]
    after = text.split("\n\n")[1].splitlines()
    legend = next(i for i, line in enumerate(after) if line.startswith("FLOPs, MACs, FLOP/s,"))
    note = " ".join(after[:legend])
    assert (note.startswith(f"Left out to fit {width} characters: {', '.join(left_out)}")
            if left_out else "Left out" not in text)


def test_the_numbers_do_not_change_with_the_width() -> None:
    wide, narrow = cells(render_table(build(), width=200)), cells(render_table(build(), width=60))
    assert [{k: row[k] for k in narrow_row} for row, narrow_row in zip(wide, narrow)] == narrow


def test_named_columns_in_declared_order_whatever_the_width() -> None:
    text = render_table(build(), columns=["total", "calls"], width=20)
    assert headers(text) == ["Name", "Calls", "Total time"]
    assert "Left out" not in text
    # "all": every column that applies (no backward, memory or machine in this profile).
    assert headers(render_table(build(), columns="all", width=20)) == [
        c.header for c in TREE_COLUMNS if c.key not in (
            "bwd_time", "bwd_flops", "bytes", "intensity", "saved", "param_bytes", "bound")]
    # A backward column asked for by name shows, with "-" where nothing was timed.
    text = render_table(build(), columns=["bwd_time"])
    assert headers(text) == ["Name", "Bwd time"] and {c["Bwd time"] for c in cells(text)} == {"-"}


@pytest.mark.parametrize("columns", [["calls", "bogus"], "Calls", [3]])
def test_unknown_columns_raise_listing_the_choices(columns: object) -> None:
    with pytest.raises(ValueError, match="columns") as info:
        render_table(build(), columns=columns)  # type: ignore[arg-type]
    if columns != [3]:
        assert "calls, flops, macs, self, total, percent, rate, bwd_time, bwd_flops" in str(
            info.value)


@pytest.mark.parametrize("width", [0, -5, 2.5, "80"])
def test_a_bad_width_raises(width: object) -> None:
    with pytest.raises(ValueError, match="width"):
        render_table(build(), width=width)  # type: ignore[arg-type]


def deep() -> ProfileResult:
    root, model, encoder, fc, relu, head = encoder_tree()
    layer = fc.child("encoder.layer.11.attention.self.q_proj", "Linear", "q")
    for node, ns in ((model, 1_000_000), (encoder, 600_000), (fc, 400_000), (layer, 300_000),
                     (relu, 100_000), (head, 300_000)):
        node.time.add(ns)
    return ProfileResult(root)


def test_long_names_are_shortened_in_the_middle_keeping_the_indent() -> None:
    text = render_table(deep(), width=80)
    assert max(len(line) for line in table_lines(text)) <= 80
    name = next(line for line in rows(text) if "..." in line)[:32].rstrip()
    assert name.startswith("      encoder.") and name.endswith(".q_proj (Linear)")
    # Wide enough, the name is whole.
    assert "encoder.layer.11.attention.self.q_proj (Linear)" in render_table(deep(), width=200)


def test_elide_middle() -> None:
    assert elide_middle("abcdefghijkl", 9) == "ab...ijkl"  # the end keeps two thirds
    assert elide_middle("    abcdefghij", 11) == "    a...hij"
    assert elide_middle("abc", 3) == "abc"
    assert len(elide_middle("x" * 100, 24)) == 24


def test_colour_only_when_asked_or_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = render_table(build(), width=200, color=False)
    coloured = render_table(build(), width=200, color=True)
    assert not ANSI.search(plain)
    assert "\x1b[1mName" in coloured and "\x1b[31m" in coloured  # bold header, a hot self time
    assert ANSI.sub("", coloured) == plain  # colour never moves a column
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    monkeypatch.setattr("sys.stdout", _Terminal())
    assert color_enabled() and ANSI.search(render_table(build(), width=200))
    monkeypatch.setenv("NO_COLOR", "")  # any value, even empty
    assert not color_enabled() and not ANSI.search(render_table(build(), width=200))
    assert ANSI.search(render_table(build(), width=200, color=True))  # the override wins


def test_width_comes_from_columns_else_the_terminal_else_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert terminal_width(io.StringIO()) == DEFAULT_WIDTH == 120
    monkeypatch.setattr("os.get_terminal_size", lambda fd: type("S", (), {"columns": 77})())
    terminal = _Terminal()
    monkeypatch.setattr(terminal, "fileno", lambda: 1)
    assert terminal_width(terminal) == 77
    monkeypatch.setenv("COLUMNS", "64")
    assert terminal_width(terminal) == terminal_width(io.StringIO()) == 64
    assert headers(render_table(build())) == headers(render_table(build(), width=64))


def test_flat_views_fit_and_take_columns_too() -> None:
    assert headers(render_flat(build(), width=200))[:3] == ["Type", "Sites", "Calls"]
    text = render_flat(build(), view="module", columns=["type", "self"], width=200)
    assert headers(text) == ["Module", "Type", "Self time"]
    narrow = render_flat(build(), width=50)
    assert max(len(line) for line in table_lines(narrow)) <= 50
    assert [c.key for c in FLAT_COLUMNS["type"]][:2] == ["name", "sites"]
    with pytest.raises(ValueError, match="sites"):
        render_flat(build(), columns=["nope"])


def test_profile_table_passes_the_options_on() -> None:
    prof = build()
    assert prof.table(columns=["calls"], width=50, color=False) == render_table(
        prof, columns=["calls"], width=50, color=False)


def test_cli_columns_and_width(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build().save(str(tmp_path / "run.json"))
    assert main(["report", str(tmp_path / "run.json"), "--columns", "total,calls"]) == 0
    assert headers(capsys.readouterr().out) == ["Name", "Calls", "Total time"]
    assert main(["report", str(tmp_path / "run.json"), "--width", "40"]) == 0
    assert headers(capsys.readouterr().out) == ["Name", "Total time", "% time"]
    assert main(["report", str(tmp_path / "run.json"), "--flat", "module", "--columns",
                 "all"]) == 0
    assert "Sites" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "run.json"), "--columns", "calls,nope"]) == 2
    assert "unknown column 'nope'" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "run.json"), "--flat", "type", "--columns",
                 "type"]) == 2  # a module view's column
    assert "choose from name, sites" in capsys.readouterr().err


def test_readme_sample_table_is_what_the_code_prints() -> None:
    # The quick start's model, run as the README runs it: headers, names and exact counts (not
    # the times, which are the machine's) match the sample block, and so do the legends.
    sample = re.search(r"^```\n(Name .*?)^```", README.read_text(), re.S | re.M)
    assert sample is not None
    model = Sequential(Linear(784, 256), ReLU(), Linear(256, 10))
    with tt.profile(model) as prof:
        for _ in range(10):
            model(Tensor(np.random.randn(64, 784)))
    printed = str(prof)
    assert headers(sample.group(1)) == headers(printed)
    counted = ("Name", "Calls", "FLOPs", "MACs")
    key = {r["Name"]: [r[c] for c in counted] for r in cells(printed)}
    assert all(key[r["Name"]] == [r[c] for c in counted] for r in cells(sample.group(1)))
    assert len(cells(sample.group(1))) == len(key)
    legend = [line for line in printed.splitlines() if line.startswith(("FLOPs,", "FLOP/s ="))]
    assert all(line in sample.group(1) for line in legend) and len(legend) == 2
