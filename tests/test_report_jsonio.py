"""Saving and loading profiles: an exact round trip, and clear errors for anything else.

``ProfileResult.from_dict`` / ``ProfileResult.load`` / ``tracetorch.load`` assemble a result from
the parts that ``report.jsonread`` checks and returns (``parse_profile`` / ``read_profile``).
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracetorch
from tracetorch.records.jsonio import (
    FORMAT_NAME,
    FORMAT_VERSION,
    deep_recursion,
    result_to_dict,
    save_result,
)
from tracetorch.records.jsonread import SavedProfile, parse_profile, read_profile
from tracetorch.records.result import ProfileResult
from tracetorch.records.stats import TimeStats
from tracetorch.records.tree import CallNode
from tracetorch.report.chrome import chrome_trace_events
from tracetorch.report.flat_table import render_flat
from tracetorch.report.table import render_table


def build() -> ProfileResult:
    """A profile using every field: shapes, MACs and none, backward, errors, steps, a timeline."""
    root = CallNode.root()
    model = root.child("", "Net", "net")
    block = model.child("blocks.0", "Block", "b0")  # a name with a dot in it
    attn = block.child("attn", "Attention", "attn", kind="module")
    matmul = attn.child("matmul", "matmul", "fn:matmul", kind="function")
    head = model.child("head", "Linear", "head")
    opt = root.child("optimizer", "SGD", "opt", kind="optimizer")
    rng = np.random.default_rng(0)
    timeline = []
    clock = 1_000_000
    for _ in range(700):  # more than TimeStats.FLUSH_EVERY, so the histogram is exercised
        spans = {n: int(rng.integers(1, 50)) * 100 for n in (matmul, head)}
        spans[attn] = spans[matmul] + 300
        spans[block] = spans[attn] + 200
        spans[model] = spans[block] + spans[head] + 100
        for node, ns in spans.items():
            node.time.add(ns)
        timeline.append((matmul, clock + 100, clock + 100 + spans[matmul], 11))
        timeline.append((model, clock, clock + spans[model], 11))
        clock += spans[model] + 10
    opt.time.add(5_000)
    matmul.flops = matmul.gemm_flops = np.int64(700 * 2 * 8 * 16 * 16)
    matmul.flops_source = "ops"
    head.flops = head.gemm_flops = 700 * 2 * 8 * 16 * 4
    head.macs = 700 * 8 * 16 * 4
    head.flops_source = "rule"
    attn.flops = 700 * 8 * 16  # softmax etc.
    head.params, model.params = 68, 1234
    head.note_shapes(((8, 16),), ((8, 4),))
    matmul.note_shapes(((8, 16), (16, 16), None), ((8, 16),))
    head.backward_time.add(9_000)
    head.backward_flops, head.backward_gemm_flops = 2 * head.flops, 2 * head.gemm_flops
    head.errors = 1
    steps = TimeStats()
    for ns in (10_000, 12_000, 11_000):
        steps.add(ns)
    return ProfileResult(root, unsupported={"Dropout": 700}, timeline=timeline,
                         dropped_events=3, step_times=steps,
                         meta={"version": "0.1.0", "clock": "perf_counter_ns",
                               "pid": np.int32(4242), "shape": (1, 2), "obj": object})


def node_facts(node: CallNode) -> dict[str, Any]:
    return {
        "path": node.path, "name": node.name, "type": node.type_name, "kind": node.kind,
        "module_key": node.module_key, "time": node.time.to_dict(), "flops": int(node.flops),
        "gemm_flops": int(node.gemm_flops), "macs": node.macs, "source": node.flops_source,
        "params": node.params, "in": node.input_shapes, "out": node.output_shapes,
        "bwd_time": node.backward_time.to_dict(), "bwd_flops": node.backward_flops,
        "bwd_gemm": node.backward_gemm_flops, "errors": node.errors,
        "children": list(node.children),
    }


def assert_equivalent(a: ProfileResult, b: ProfileResult) -> None:
    assert [node_facts(n) for n in a.root.walk()] == [node_facts(n) for n in b.root.walk()]
    for total in ("forward_flops", "backward_flops", "total_flops", "gemm_flops",
                  "other_flops", "total_time_ns"):
        assert getattr(a, total) == getattr(b, total), total
    assert a.unsupported == b.unsupported and a.dropped_events == b.dropped_events
    assert a.step_times.to_dict() == b.step_times.to_dict()
    assert render_table(a) == render_table(b)
    assert render_flat(a, view="module") == render_flat(b, view="module")


def test_round_trip_through_json_text() -> None:
    original = build()
    data = json.loads(json.dumps(result_to_dict(original)))
    loaded = ProfileResult.from_dict(data)
    assert_equivalent(original, loaded)
    assert [(n.path, s, e, t) for n, s, e, t in loaded.timeline or []] == \
        [(n.path, s, e, t) for n, s, e, t in original.timeline or []]
    assert chrome_trace_events(loaded) == chrome_trace_events(original)
    assert loaded.find("blocks.0.attn.matmul").input_shapes == [((8, 16), (16, 16), None)]
    assert loaded.step_times.quantile(0.5) == original.step_times.quantile(0.5)


def test_document_layout() -> None:
    data = result_to_dict(build())
    assert data["format"] == FORMAT_NAME == "tracetorch-profile"
    assert data["version"] == FORMAT_VERSION == 1
    assert set(data) == {"format", "version", "meta", "root", "unsupported", "step_times",
                         "step_phases", "dropped_events", "timeline", "backward_timeline"}
    # Metadata is made JSON-safe rather than failing the save.
    assert data["meta"]["pid"] == 4242 and data["meta"]["shape"] == [1, 2]
    assert isinstance(data["meta"]["obj"], str)
    matmul = data["root"]["children"][0]["children"][0]["children"][0]["children"][0]
    assert matmul["name"] == "matmul" and type(matmul["flops"]) is int
    assert matmul["input_shapes"] == [[[8, 16], [16, 16], None]]
    assert "flops_cache" not in matmul
    # Timeline rows: [node index in depth-first order, start, end, thread].
    order = [n.path for n in build().root.walk()]
    assert order[data["timeline"][0][0]] == "blocks.0.attn.matmul"
    assert all(len(row) == 4 for row in data["timeline"])


def test_save_and_load_files(tmp_path: pathlib.Path) -> None:
    original = build()
    for path in (tmp_path / "run.json", str(tmp_path / "run2.json")):
        save_result(original, path)
        assert_equivalent(original, ProfileResult.load(path))


def test_no_timeline_round_trips_as_none(tmp_path: pathlib.Path) -> None:
    original = build()
    original.timeline = None
    save_result(original, tmp_path / "run.json")
    assert ProfileResult.load(tmp_path / "run.json").timeline is None


def test_empty_profile_round_trips(tmp_path: pathlib.Path) -> None:
    save_result(ProfileResult(CallNode.root()), tmp_path / "empty.json")
    loaded = ProfileResult.load(tmp_path / "empty.json")
    assert loaded.nodes() == [] and loaded.total_flops == 0


def test_missing_file_raises_file_not_found(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError):
        ProfileResult.load(tmp_path / "nope.json")


def test_every_entry_point_reads_the_same_parts(tmp_path: pathlib.Path) -> None:
    """The methods and ``tracetorch.load`` are the report functions plus assembly, no more."""
    original = build()
    assert original.to_dict() == result_to_dict(original)
    original.save(str(tmp_path / "run.json"))
    parts = read_profile(tmp_path / "run.json")
    assert isinstance(parts, SavedProfile)
    assert parts._fields == ("root", "unsupported", "timeline", "dropped_events", "step_times",
                             "meta", "step_phases", "backward_timeline")
    assert parts.unsupported == {"Dropout": 700} and parts.dropped_events == 3
    assert parse_profile(original.to_dict()).meta == parts.meta
    for loaded in (ProfileResult(*parts), ProfileResult.load(tmp_path / "run.json"),
                   tracetorch.load(str(tmp_path / "run.json")),
                   ProfileResult.from_dict(original.to_dict())):
        assert type(loaded) is ProfileResult
        assert_equivalent(original, loaded)


def test_a_profiler_rebuilds_a_result_not_a_profiler() -> None:
    # ``profile`` extends ProfileResult with its own constructor; from_dict still works on it.
    with tracetorch.profile() as prof:
        pass
    again = tracetorch.profile.from_dict(prof.to_dict())
    assert type(again) is ProfileResult and again.total_flops == 0


# ------------------------------------------------------------------------ damaged files
def _valid() -> dict[str, Any]:
    return json.loads(json.dumps(result_to_dict(build())))


def _first_child(data: dict[str, Any]) -> dict[str, Any]:
    return data["root"]["children"][0]["children"][0]  # type: ignore[no-any-return]


Edit = Callable[[dict[str, Any]], Any]

DAMAGE: list[Any] = [
    ("foreign format", lambda d: d.update(format="something-else"), "not a tracetorch profile"),
    ("no format", lambda d: d.pop("format"), "no 'format' key"),
    ("newer version", lambda d: d.update(version=FORMAT_VERSION + 1), "newer tracetorch"),
    ("version as text", lambda d: d.update(version="1"), "version"),
    ("version zero", lambda d: d.update(version=0), "version"),
    ("missing root", lambda d: d.pop("root"), "missing key 'root'"),
    ("missing meta", lambda d: d.pop("meta"), "missing key 'meta'"),
    ("missing steps", lambda d: d.pop("step_times"), "missing key 'step_times'"),
    ("nested missing key", lambda d: _first_child(d).pop("flops"),
     "root.children[0].children[0]: missing key 'flops'"),
    ("wrong type", lambda d: _first_child(d).update(flops="many"),
     "root.children[0].children[0].flops: expected an integer, got str"),
    ("bool is not a count", lambda d: _first_child(d).update(errors=True), ".errors"),
    ("children not a list", lambda d: _first_child(d).update(children={}), ".children"),
    ("bad stats", lambda d: _first_child(d)["time"].pop("buckets"), "missing key 'buckets'"),
    ("negative count", lambda d: _first_child(d)["time"].update(count=-1), ">= 0"),
    ("bad bucket", lambda d: _first_child(d)["time"]["buckets"].append([1]), "pair"),
    ("bad shape", lambda d: _first_child(d).update(input_shapes=[[[8, 1.5]]]),
     "input_shapes[0][0][1]"),
    ("duplicate child", lambda d: d["root"]["children"].append(d["root"]["children"][0]),
     "both named"),
    ("timeline index", lambda d: d["timeline"].append([999, 0, 1, 1]), "timeline[1400]"),
    ("timeline backwards", lambda d: d["timeline"].append([1, 5, 1, 1]), "before it starts"),
    ("timeline row", lambda d: d["timeline"].append([1, 5]), "timeline[1400]"),
    ("dropped negative", lambda d: d.update(dropped_events=-2), "dropped_events"),
    ("unsupported counts", lambda d: d.update(unsupported={"X": "3"}), "unsupported"),
    ("meta not an object", lambda d: d.update(meta=[]), "meta"),
]


@pytest.mark.parametrize("what, edit, message", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_documents_raise_value_error_naming_file(
        tmp_path: pathlib.Path, what: str, edit: Edit, message: str) -> None:
    data = _valid()
    edit(data)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(data))
    for load in (ProfileResult.load, tracetorch.load, read_profile):
        with pytest.raises(ValueError) as info:
            load(path)
        assert str(path) in str(info.value)
        assert message in str(info.value)
    # The same check without a file names the given source.
    for parse in (ProfileResult.from_dict, parse_profile):
        with pytest.raises(ValueError, match="^memory:"):
            parse(data, source="memory")


@pytest.mark.parametrize("content, message", [
    (b"", "not valid JSON"),
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    (b"[1, 2, 3]", "expected a JSON object, got list"),
    (b"null", "expected a JSON object"),
    (b'{"traceEvents": []}', "looks like a Chrome trace"),
])
def test_unreadable_files_raise_value_error_naming_file(
        tmp_path: pathlib.Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        ProfileResult.load(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_truncated_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.json"
    save_result(build(), path)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match="not valid JSON"):
        ProfileResult.load(path)


def test_newer_version_message_says_to_upgrade(tmp_path: pathlib.Path) -> None:
    data = _valid()
    data["version"] = 7
    path = tmp_path / "future.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"version 7; this one reads up to 1\); upgrade"):
        ProfileResult.load(path)


def test_default_source_is_dict() -> None:
    with pytest.raises(ValueError, match="^<dict>: not a tracetorch profile"):
        ProfileResult.from_dict({"format": "x"})


# ------------------------------------------------------------------- property: any tree
names = st.sampled_from(["0", "1", "fc", "attn", "layers.2", "", "é"])


@st.composite
def trees(draw: st.DrawFn) -> ProfileResult:
    root = CallNode.root()
    frontier = [root]
    for _ in range(draw(st.integers(0, 12))):
        parent = draw(st.sampled_from(frontier))
        node = parent.child(draw(names), draw(st.sampled_from(["Linear", "ReLU", "f"])),
                            draw(st.sampled_from(["a", "b", "c"])))
        for ns in draw(st.lists(st.integers(0, 10**9), max_size=5)):
            node.time.add(ns)
        node.flops = draw(st.integers(0, 10**15))
        node.macs = draw(st.one_of(st.none(), st.integers(0, 10**12)))
        frontier.append(node)
    return ProfileResult(root, dropped_events=draw(st.integers(0, 10)))


@settings(max_examples=60, deadline=None)
@given(trees())
def test_any_tree_round_trips(result: ProfileResult) -> None:
    assert_equivalent(result, ProfileResult.from_dict(json.loads(json.dumps(result.to_dict()))))


@pytest.mark.parametrize("number, message", [
    ("Infinity", "Infinity is not a number a profile holds"),
    ("-Infinity", "-Infinity is not a number a profile holds"),
    ("NaN", "NaN is not a number a profile holds"),
    ("1e400", "1e400 is out of range"),
    ("9" * 5000, "an integer of 5000 digits"),
])
def test_numbers_no_profile_holds_are_refused_naming_the_file(
        tmp_path: pathlib.Path, number: str, message: str) -> None:
    path = tmp_path / "odd.json"
    save_result(build(), path)
    text = path.read_text()
    field = '"total_ns": '
    start = text.index(field) + len(field)
    end = start + len(text[start:]) - len(text[start:].lstrip("0123456789"))
    path.write_text(text[:start] + number + text[end:])
    with pytest.raises(ValueError) as info:
        tracetorch.load(path)
    assert str(info.value).startswith(f"{path}: corrupt tracetorch profile: ")
    assert message in str(info.value)


def test_a_deep_tree_saves_loads_and_renders(tmp_path: pathlib.Path) -> None:
    # 2,000 levels: a walk, the completeness of every node and the JSON encoder all cost the
    # tree's size, not its depth squared (this took minutes when they did).
    root = CallNode.root()
    node = root
    for level in range(2_000):
        node = node.child(f"l{level}", "Block", f"m{level}")
        node.time.add(1000 + level)
    result = ProfileResult(root)
    path = tmp_path / "deep.json"
    save_result(result, path)
    loaded = tracetorch.load(path)
    assert len(list(loaded.root.walk())) == 2_001
    with deep_recursion():  # comparing two 4,000-level dicts recurses too
        assert loaded.to_dict() == result.to_dict()
    assert "Block" in render_table(loaded, depth=3)
