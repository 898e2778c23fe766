"""The HTML report in a real browser: headless Debian Chromium, JavaScript on, driven by
playwright (its Python package only; the browser is the system's, nothing is downloaded).

What the page draws is checked against the profile it was written from: every table row and
cell equals the text report's, a header click sorts, an icicle click zooms, the filter filters,
hovering shows a node's numbers, the roofline has one point per layer, and nothing is logged to
the console. Missing Chromium or playwright skips here with the reason, and fails under CI.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tracetorch.cli.demo import run_demo
from tracetorch.core import Linear, ReLU, Sequential, Tensor
from tracetorch.profiler import profile
from tracetorch.records.result import ProfileResult
from tracetorch.records.tree import CallNode
from tracetorch.report.table import TREE_COLUMNS, tree_context

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
#: No network, no first-run work, no GPU: the browser only opens the local file.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}: CI must run the browser tests (.ci/run installs chromium)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[test]')")
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        _missing(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM if os.path.exists(CHROMIUM)
                                      else shutil.which("chromium"), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class Report:
    """One opened report page, with everything it logged."""

    def __init__(self, browser: Any, result: ProfileResult, path: Path) -> None:
        result.save_html(path)
        self.result = result
        self.page = browser.new_page(viewport={"width": 1280, "height": 1000})
        self.problems: list[str] = []
        self.page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}")
                     if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("dialog", lambda d: (self.problems.append(f"dialog: {d.message}"),
                                          d.dismiss()))
        self.page.on("request", lambda r: None if r.url.startswith("file://") else
                     self.problems.append(f"request: {r.url}"))
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("html[data-tt-ready]", timeout=10_000)

    def rows(self) -> list[dict[str, Any]]:
        """The table's rows as the page shows them: id, depth, name text and every cell."""
        return self.page.eval_on_selector_all("#tt-table tbody tr[data-id]", """rows =>
            rows.map(tr => ({id: Number(tr.dataset.id), depth: Number(tr.dataset.depth),
              name: tr.querySelector('.tt-label').textContent,
              cells: Object.fromEntries([...tr.querySelectorAll('td[data-key]')].map(td =>
                [td.dataset.key, {text: td.textContent, value: td.dataset.value}]))}))""")

    def boxes(self) -> list[dict[str, Any]]:
        return self.page.evaluate("window.tracetorchReport.icicle.boxes.map(b => "
                                  "({id: b.id, x: b.x, y: b.y, w: b.w}))")

    def click_box(self, box: dict[str, Any]) -> None:
        canvas = self.page.locator("#tt-icicle").bounding_box()
        self.page.mouse.click(canvas["x"] + box["x"] + box["w"] / 2, canvas["y"] + box["y"] + 8)

    def zoomed(self) -> str:
        return self.page.inner_text("#tt-crumbs button[aria-current=true]")

    def close(self) -> None:
        self.page.close()
        assert self.problems == []


def core_training() -> ProfileResult:
    """The demo CNN: forward, backward and optimizer steps of tracetorch.core."""
    return run_demo(steps=3).profile


def torch_model(torch: ModuleType) -> ProfileResult:
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.act = nn.Linear(16, 16), nn.GELU()

        def forward(self, x: Any) -> Any:
            return self.act(self.fc(x)) + x

    model = nn.Sequential(nn.Linear(8, 16), Block(), Block(), nn.LayerNorm(16), nn.Linear(16, 4))
    with profile(model) as prof:
        for _ in range(3):
            model(torch.randn(5, 8)).sum().backward()
    return prof


@pytest.fixture(params=["core", "torch"])
def recorded(request: pytest.FixtureRequest) -> ProfileResult:
    if request.param == "torch":
        return torch_model(request.getfixturevalue("torch"))
    return core_training()


def text_cells(result: ProfileResult) -> dict[int, dict[str, str]]:
    """The text report's cell for every node (by depth-first position) and column key."""
    # Every column the text report can show for this profile, memory ones included.
    ctx = tree_context(result)
    specs = [s for s in TREE_COLUMNS if s.applies(ctx) and s.key not in ("name", "bound")]
    return {i: {s.key: s.cell(ctx, (node, node.depth)) for s in specs}
            for i, node in enumerate(result.root.walk()) if i}


def test_rows_and_values_are_the_profiles(browser: Any, recorded: ProfileResult,
                                          tmp_path: Path) -> None:
    report = Report(browser, recorded, tmp_path / "report.html")
    nodes = list(recorded.root.walk())
    rows = report.rows()
    assert sorted(r["id"] for r in rows) == list(range(1, len(nodes)))  # every node, once
    expected = text_cells(recorded)
    from tracetorch.report.table import node_label
    for row in rows:
        node = nodes[row["id"]]
        assert row["name"] == node_label(node) and row["depth"] == node.depth
        assert int(row["cells"]["calls"]["value"]) == node.calls
        assert int(row["cells"]["flops"]["value"]) == node.subtree_flops  # exact, inclusive
        assert {k: c["text"] for k, c in row["cells"].items() if k in expected[row["id"]]} \
            == expected[row["id"]], node.path
        assert set(expected[row["id"]]) <= set(row["cells"])  # every text-report column
    report.close()


def test_a_header_click_sorts_siblings(browser: Any, tmp_path: Path) -> None:
    report = Report(browser, core_training(), tmp_path / "report.html")

    def top_level(key: str) -> list[float]:
        return [float(r["cells"][key]["value"]) for r in report.rows() if r["depth"] == 1]

    totals = top_level("total")
    assert totals == sorted(totals, reverse=True)  # the text report's default order
    report.page.click("#tt-table th[data-key=calls]")
    assert report.page.get_attribute("#tt-table th[data-key=calls]", "aria-sort") == "descending"
    calls = top_level("calls")
    assert calls == sorted(calls, reverse=True)
    report.page.click("#tt-table th[data-key=self]")
    report.page.click("#tt-table th[data-key=self]")
    selfs = top_level("self")
    assert selfs == sorted(selfs) and selfs != sorted(selfs, reverse=True)
    report.page.click("#tt-table th[data-key=name]")
    children = [r for r in report.rows() if r["depth"] == 2]
    assert [r["name"] for r in children][:3] == ["layers.0 (Conv2d)", "layers.1 (ReLU)",
                                                 "layers.2 (MaxPool2d)"]
    report.close()


def test_an_icicle_click_zooms_and_the_path_zooms_out(browser: Any, tmp_path: Path) -> None:
    result = core_training()
    report = Report(browser, result, tmp_path / "report.html")
    nodes = list(result.root.walk())
    boxes = report.boxes()
    full = boxes[0]["w"]
    assert boxes[0]["id"] == 0 and report.zoomed() == "all"
    model = next(b for b in boxes if nodes[b["id"]].type_name == "Sequential")
    assert 0 < model["w"] < full
    # Widths are shares of total time: the model's box is its share of the root's.
    assert model["w"] / full == pytest.approx(nodes[model["id"]].total_ns / result.total_time_ns,
                                              rel=1e-6)
    report.click_box(model)
    assert report.zoomed() == "Sequential"
    zoomed = report.boxes()
    assert zoomed[0]["id"] == model["id"] and zoomed[0]["w"] == full
    assert {nodes[b["id"]].parent is nodes[model["id"]] for b in zoomed[1:]} == {True}
    conv = next(b for b in zoomed if nodes[b["id"]].name == "layers.3")
    report.click_box(conv)
    assert report.zoomed() == "layers.3 (Conv2d)"
    report.click_box(report.boxes()[0])  # the zoomed bar itself: one level out
    assert report.zoomed() == "Sequential"
    report.page.click("#tt-crumbs button[data-id='0']")
    assert report.zoomed() == "all" and report.boxes()[0]["id"] == 0
    report.close()


def test_widths_switch_and_hover_tells_the_numbers(browser: Any, tmp_path: Path) -> None:
    result = core_training()
    report = Report(browser, result, tmp_path / "report.html")
    nodes = list(result.root.walk())
    report.page.click(".tt-switch button[data-metric=flops]")
    assert report.page.get_attribute(".tt-switch button[data-metric=flops]",
                                     "aria-pressed") == "true"
    boxes = report.boxes()
    conv = next(b for b in boxes if nodes[b["id"]].name == "layers.3")
    assert conv["w"] / boxes[0]["w"] == pytest.approx(
        nodes[conv["id"]].subtree_flops / result.root.subtree_flops, rel=1e-6)
    canvas = report.page.locator("#tt-icicle").bounding_box()
    report.page.mouse.move(canvas["x"] + conv["x"] + conv["w"] / 2, canvas["y"] + conv["y"] + 8)
    tip = report.page.inner_text("#tt-tooltip")
    assert tip.startswith("layers.3 (Conv2d)") and "calls 2" in tip
    assert report.page.is_visible("#tt-tooltip")
    report.close()


def test_the_filter_and_the_depth_control(browser: Any, tmp_path: Path) -> None:
    result = core_training()
    report = Report(browser, result, tmp_path / "report.html")
    report.page.fill("#tt-filter", "conv")
    rows = report.rows()
    paths = {n.path for n in result.nodes() if "conv" in f"{n.path} {n.type_name}".lower()}
    assert {r["name"].split(" (")[0] for r in rows} == paths == {"layers.0", "layers.3"}
    assert "2 of" in report.page.inner_text(".tt-count")
    report.page.fill("#tt-filter", "")
    assert len(report.rows()) == len(result.nodes())
    report.page.select_option("#tt-depth", "1")
    assert {r["depth"] for r in report.rows()} == {1}
    report.page.click("#tt-table tr[data-depth='1'] .tt-toggle:not([disabled])")
    assert {r["depth"] for r in report.rows()} == {1, 2}
    report.close()


def test_the_roofline_and_labels_are_the_bottleneck_analysis(browser: Any,
                                                             tmp_path: Path) -> None:
    result = core_training()
    result.meta["machine"] = {"peak_flops": 2e11, "bandwidth_bytes_per_s": 2e10,
                              "call_overhead_ns": 5_000.0, "source": "test peaks", "facts": {}}
    labelled = [b for b in result.analyze().layers if b.intensity > 0 and b.achieved_flops > 0]
    assert labelled
    report = Report(browser, result, tmp_path / "report.html")
    assert report.page.locator("#tt-roofline circle.tt-point").count() == len(labelled)
    assert "test peaks" in report.page.inner_text("#tt-roof")
    shown = {r["id"]: r["cells"]["label"]["text"] for r in report.rows()}
    nodes = list(result.root.walk())
    for bound in result.analyze().layers:
        node_id = next(i for i, n in enumerate(nodes) if n.path == bound.path and i)
        assert shown[node_id] == bound.bound
    assert "Where to look first" in report.page.inner_text("#tt-summary pre.tt-notes")
    report.close()
    plain = Report(browser, core_training(), tmp_path / "plain.html")
    assert plain.page.locator("#tt-roofline").count() == 0  # no machine: no view, no error
    assert plain.page.locator("#tt-table th[data-key=label]").count() == 0
    plain.close()


def test_hostile_names_and_an_untimed_profile_render_as_text(browser: Any,
                                                             tmp_path: Path) -> None:
    root = CallNode.root()
    name = "</script><img src=x onerror=alert(1)>\"'&"
    parent = root.child(name, "Evil<b>", "m0")
    parent.child("<i>", "T", "m1").time.add(0)
    parent.time.add(0)
    report = Report(browser, ProfileResult(root, meta={"name": name}), tmp_path / "evil.html")
    assert report.rows()[0]["name"] == f"{name} (Evil<b>)"
    assert report.page.title() == f"tracetorch profile: {name}"
    assert report.page.locator("img").count() == 0
    report.close()


def test_a_core_model_without_training(browser: Any, tmp_path: Path) -> None:
    model = Sequential(Linear(6, 5), ReLU(), Linear(5, 3))
    with profile(model) as prof:
        model(Tensor(np.ones((4, 6))))
    report = Report(browser, prof, tmp_path / "inference.html")
    keys = report.page.eval_on_selector_all("#tt-table th", "ths => ths.map(t => t.dataset.key)")
    assert "bwd_time" not in keys and {"calls", "flops", "macs", "self", "total"} <= set(keys)
    report.close()


def test_a_merged_distributed_profile_shows_its_ranks(browser: Any, tmp_path: Path) -> None:
    from tracetorch.distributed import merge_profiles

    def rank_profile(rank: int, ns: int) -> ProfileResult:
        root = CallNode.root()
        fc = root.child("fc", "Linear", "m0")
        fc.time.add(ns)
        fc.flops_source = "rule"
        return ProfileResult(root, meta={"distributed": {"rank": rank, "world_size": 3}})

    merged = merge_profiles([rank_profile(0, 100), rank_profile(1, 300), rank_profile(2, 200)])
    report = Report(browser, merged, tmp_path / "ranks.html")
    (row,) = report.rows()
    cells = {key: cell["text"] for key, cell in row["cells"].items()}
    assert (cells["rank_min"], cells["rank_median"], cells["rank_max"],
            cells["slowest_rank"]) == ("100 ns", "200 ns", "300 ns", "1")
    ranks = report.page.eval_on_selector_all(
        "#tt-ranks tbody tr", "rows => rows.map(r => r.cells[0].textContent)")
    assert ranks == ["0", "1", "2"]
    assert "3 of 3 ranks" in report.page.inner_text("#tt-ranks")
    assert "distributed" not in report.page.inner_text("#tt-meta")  # shown above, not as a blob
    report.close()
