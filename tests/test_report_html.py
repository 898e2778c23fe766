"""The HTML report as a file (no browser): self-contained, its data exact and safely embedded,
written by every entry point; the notebook snippet. tests/test_report_html_browser.py checks
what a browser draws from it."""
from __future__ import annotations

import configparser
import fnmatch
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.trees import encoder_tree
from tracetorch.cli.main import main
from tracetorch.core import Linear, ReLU, Sequential, Tensor
from tracetorch.profiler import profile
from tracetorch.records.jsonio import deep_recursion, result_to_dict
from tracetorch.records.result import ProfileResult
from tracetorch.records.tree import CallNode
from tracetorch.report.html import ASSETS, PROFILE_ID, REPORT_ID, render_html, save_html
from tracetorch.report.notebook import render_notebook
from tracetorch.report.summary import summary_lines

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ["</script><script>alert(1)</script>", "say \"hi\" & 'bye'", "<!-- x", "a\u2028b",
           "<img src=x onerror=alert(2)>"]


def embedded(page: str, element_id: str) -> Any:
    match = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>',
                      page, re.S)
    assert match, element_id
    with deep_recursion():
        return json.loads(match.group(1))


def recorded() -> ProfileResult:
    model = Sequential(Linear(6, 5), ReLU(), Linear(5, 3))
    with profile(model, timeline=True) as prof:
        for _ in range(3):
            model(Tensor(np.ones((4, 6))))
    return prof


def hand_made() -> ProfileResult:
    root, model, encoder, fc, relu, head = encoder_tree()
    for node, ns in ((model, 9_000), (encoder, 6_000), (fc, 4_000), (relu, 1_000), (head, 2_000)):
        node.time.add(ns)
    fc.flops = fc.gemm_flops = 2 * 784 * 256 * 64
    fc.macs = 784 * 256 * 64
    return ProfileResult(root, meta={"name": "encoder run", "device": "cpu"})


def test_the_page_is_one_offline_file() -> None:
    page = render_html(recorded())
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # Nothing is fetched: no external script, style, image, frame or font; the policy forbids it.
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert not re.search(r"<(?:link|iframe|img|object|embed)\b", page, re.I)
    assert "@import" not in page and not re.search(r"url\(\s*['\"]?(?!data:)", page)
    assert "default-src 'none'" in page
    # Three scripts: the profile, the extras and the page's own code, all inline.
    assert len(re.findall(r"<script\b", page)) == 3 == page.count("</script>")
    assert "<script src" not in page


def test_the_embedded_profile_round_trips() -> None:
    result = recorded()
    page = render_html(result)
    data = embedded(page, PROFILE_ID)
    expected = result_to_dict(result)
    assert expected["timeline"] is not None and data["timeline"] is None  # not drawn, not kept
    expected["timeline"] = None
    assert data == expected
    again = ProfileResult.from_dict(data)
    assert [(n.path, n.calls, n.flops, n.total_ns) for n in again.nodes()] == [
        (n.path, n.calls, n.flops, n.total_ns) for n in result.nodes()]


def test_the_summary_is_the_text_reports() -> None:
    result = hand_made()
    report = embedded(render_html(result), REPORT_ID)
    lines = summary_lines(result)
    assert [f"{label}: {value}" for label, value in report["summary"]] == [
        re.sub(r":\s+", ": ", line, count=1) for line in lines]
    assert report["notes"] == ""


def test_a_bottleneck_section_is_kept_verbatim_with_its_labels() -> None:
    result = hand_made()
    result.meta["machine"] = {"peak_flops": 1e11, "bandwidth_bytes_per_s": 1e10,
                              "call_overhead_ns": 0.0, "source": "test", "facts": {}}
    report = embedded(render_html(result), REPORT_ID)
    text = "\n".join(summary_lines(result))
    assert report["notes"] and report["notes"] in text
    assert report["notes"].startswith("Bottlenecks")
    assert report["bottleneck"]["labels"] == {b.path: b.bound for b in result.analyze().layers}
    assert report["title"] == "tracetorch profile: encoder run"


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_stay_data(name: str) -> None:
    root = CallNode.root()
    root.child(name, name, "m0").time.add(10)
    result = ProfileResult(root, meta={"name": name, name: name})
    page = render_html(result, title=name)
    assert len(re.findall(r"<script\b", page)) == 3 == page.count("</script>")
    assert "<!--" not in page and "<img" not in page
    assert f"<title>{__import__('html').escape(name)}</title>" in page
    data = embedded(page, PROFILE_ID)
    assert data["root"]["children"][0]["name"] == name and data["meta"][name] == name
    assert name in embedded(page, REPORT_ID)["title"]


def test_save_html_writes_utf8(tmp_path: Path) -> None:
    root = CallNode.root()
    root.child("größe", "Linear", "m0").time.add(5)
    path = tmp_path / "report.html"
    save_html(ProfileResult(root), path)
    assert embedded(path.read_text(encoding="utf-8"), PROFILE_ID)["root"]["children"][0][
        "name"] == "größe"
    ProfileResult(root).save_html(tmp_path / "method.html", title="t")
    assert "<title>t</title>" in (tmp_path / "method.html").read_text(encoding="utf-8")


def test_a_bad_title_names_the_argument() -> None:
    with pytest.raises(TypeError, match="title must be a string"):
        render_html(hand_made(), title=3)  # type: ignore[arg-type]


def test_a_deep_tree_is_written() -> None:
    root = node = CallNode.root()
    for i in range(600):  # past Python's default recursion limit in a recursive writer
        node = node.child(f"l{i}", "Block", f"m{i}")
        node.time.add(600 - i)
    data = embedded(render_html(ProfileResult(root)), PROFILE_ID)
    depth, item = 0, data["root"]
    while item["children"]:
        depth, item = depth + 1, item["children"][0]
    assert depth == 600


def test_assets_ship_with_the_package() -> None:
    folder = resources.files("tracetorch.report").joinpath("assets")
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert names == sorted(ASSETS)
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    patterns = [p.strip() for p in config["options.package_data"]["tracetorch.report"].split(",")]
    assert all(any(fnmatch.fnmatch(f"assets/{n}", p) for p in patterns) for n in names)


# ------------------------------------------------------------------------------------ CLI
def test_report_html_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = hand_made()
    result.save(str(tmp_path / "run.json"))
    out = tmp_path / "run.html"
    assert main(["report", str(tmp_path / "run.json"), "--html", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    assert embedded(out.read_text(encoding="utf-8"), PROFILE_ID)["meta"]["name"] == "encoder run"


def test_report_html_into_a_missing_folder_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hand_made().save(str(tmp_path / "run.json"))
    assert main(["report", str(tmp_path / "run.json"), "--html", str(tmp_path / "no" / "x.html")
                 ]) == 2
    assert "--html: folder" in capsys.readouterr().err


def test_run_and_demo_html_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("import numpy as np\nfrom tracetorch.core import Linear, Tensor\n"
                      "Linear(3, 2)(Tensor(np.ones((1, 3))))\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--html", "run.html", str(script)]) == 0
    data = embedded((tmp_path / "run.html").read_text(encoding="utf-8"), PROFILE_ID)
    assert [c["type"] for c in data["root"]["children"]] == ["Linear"]
    assert main(["demo", "--steps", "2", "--html", "demo.html"]) == 0
    demo = embedded((tmp_path / "demo.html").read_text(encoding="utf-8"), PROFILE_ID)
    assert {c["kind"] for c in demo["root"]["children"]} >= {"module", "backward", "optimizer"}
    capsys.readouterr()


# ------------------------------------------------------------------------------------ notebook
def test_repr_html_is_a_compact_table() -> None:
    result = hand_made()
    snippet = result._repr_html_()
    assert snippet == render_notebook(result)
    assert "<script" not in snippet and "<style" not in snippet
    assert snippet.count("<tr>") == 1 + 5  # header + every row of this small tree
    assert "encoder (Encoder)" in snippet and snippet.count("25.7 MFLOPs") == 5  # 3 rows, summary
    assert "Forward FLOPs:" in snippet
    assert "<" not in str(result).replace("<=", "")  # print stays the text table


def test_repr_html_shows_the_top_rows_and_escapes() -> None:
    root = CallNode.root()
    for i in range(30):
        root.child(f"<layer{i}>", "Linear", f"m{i}").time.add(100 + i)
    snippet = render_notebook(ProfileResult(root), rows=10)
    assert snippet.count("<tr>") == 11 and "20 more rows" in snippet
    assert "&lt;layer29&gt; (Linear)" in snippet and "<layer" not in snippet
    assert "1 more row:" in render_notebook(ProfileResult(root), rows=29)
    with pytest.raises(ValueError, match="rows must be an integer"):
        render_notebook(ProfileResult(root), rows=0)
