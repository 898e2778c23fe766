"""speedscope export: the file format's required fields, and weights that add up to the totals."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracetorch
from support.trees import encoder_tree
from tracetorch.cli.main import main
from tracetorch.core import Linear, ReLU, Sequential, Tensor
from tracetorch.records.result import ProfileResult
from tracetorch.records.tree import CallNode
from tracetorch.report.speedscope import BACKWARD_FRAME, SCHEMA_URL, speedscope_document

# What https://www.speedscope.app/file-format-schema.json requires (jlfwong/speedscope,
# src/lib/file-format-spec.ts): the file, each frame, each sampled profile.
FILE_REQUIRED = {"$schema": str, "shared": dict, "profiles": list}
FRAME_REQUIRED = {"name": str}
SAMPLED_REQUIRED = {"type": str, "name": str, "unit": str, "startValue": (int, float),
                    "endValue": (int, float), "samples": list, "weights": list}
UNITS = {"none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes"}


def check_schema(doc: dict[str, Any]) -> None:
    for key, kind in FILE_REQUIRED.items():
        assert isinstance(doc[key], kind), key
    assert doc["$schema"] == SCHEMA_URL
    frames = doc["shared"]["frames"]
    assert isinstance(frames, list)
    for frame in frames:
        assert all(isinstance(frame[k], t) for k, t in FRAME_REQUIRED.items())
        assert set(frame) <= {"name", "file", "line", "col"}
    for profile in doc["profiles"]:
        for key, kind in SAMPLED_REQUIRED.items():
            assert isinstance(profile[key], kind), key
        assert profile["type"] == "sampled" and profile["unit"] in UNITS
        assert len(profile["samples"]) == len(profile["weights"])
        assert profile["startValue"] <= profile["endValue"]
        for stack in profile["samples"]:
            assert stack and all(isinstance(i, int) and 0 <= i < len(frames) for i in stack)
    if "activeProfileIndex" in doc:
        assert 0 <= doc["activeProfileIndex"] < len(doc["profiles"])
    json.dumps(doc, allow_nan=False)  # plain JSON


def trained() -> ProfileResult:
    """encoder_tree with times that nest, FLOPs, and backward FLOPs on two layers and a pass."""
    root, model, encoder, fc, relu, head = encoder_tree()
    for node, ns in ((model, 1_000_000), (encoder, 600_000), (fc, 400_000), (relu, 100_000),
                     (head, 300_000)):
        node.time.add(ns)
    fc.flops, relu.flops, head.flops = 2000, 100, 600
    fc.backward_flops, head.backward_flops = 4000, 1200
    backward = root.child("backward", "backward", "", kind="backward")
    backward.time.add(700_000)
    backward.flops = 5200  # a pass's own FLOPs summarise what the layers hold
    return ProfileResult(root)


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in doc["profiles"]}


def test_required_fields_and_units() -> None:
    doc = speedscope_document(trained())
    check_schema(doc)
    profiles = by_name(doc)
    assert (profiles["Time"]["unit"], profiles["FLOPs"]["unit"]) == ("nanoseconds", "none")


def test_weights_add_up_to_the_totals_exactly() -> None:
    result = trained()
    profiles = by_name(speedscope_document(result))
    assert sum(profiles["Time"]["weights"]) == profiles["Time"]["endValue"] == \
        result.total_time_ns == 1_700_000
    assert sum(profiles["FLOPs"]["weights"]) == profiles["FLOPs"]["endValue"] == \
        result.total_flops == 2700 + 5200


def test_stacks_follow_the_tree_with_self_weights() -> None:
    doc = speedscope_document(trained())
    names = [f["name"] for f in doc["shared"]["frames"]]
    time = by_name(doc)["Time"]
    stacks = {" / ".join(names[i] for i in s): w for s, w in zip(time["samples"],
                                                                   time["weights"])}
    assert stacks == {
        "Sequential": 100_000, "Sequential / encoder (Encoder)": 100_000,
        "Sequential / encoder (Encoder) / 0 (Linear)": 400_000,
        "Sequential / encoder (Encoder) / 1 (ReLU)": 100_000,
        "Sequential / head (Linear)": 300_000, "backward": 700_000}
    flops = by_name(doc)["FLOPs"]
    stacks = {" / ".join(names[i] for i in s): w for s, w in zip(flops["samples"],
                                                                   flops["weights"])}
    assert stacks == {
        "Sequential / encoder (Encoder) / 0 (Linear)": 2000,
        f"Sequential / encoder (Encoder) / 0 (Linear) / {BACKWARD_FRAME}": 4000,
        "Sequential / encoder (Encoder) / 1 (ReLU)": 100,
        "Sequential / head (Linear)": 600, f"Sequential / head (Linear) / {BACKWARD_FRAME}": 1200}


def test_one_frame_per_call_path() -> None:
    root = CallNode.root()
    for parent in ("enc", "dec"):
        node = root.child(parent, "Block", parent)
        node.time.add(10)
        node.child("0", "Linear", "shared").time.add(4)
    frames = speedscope_document(ProfileResult(root))["shared"]["frames"]
    assert [(f["name"], f["file"]) for f in frames] == [
        ("enc (Block)", "enc"), ("0 (Linear)", "enc.0"), ("dec (Block)", "dec"),
        ("0 (Linear)", "dec.0")]


def test_an_empty_profile_is_a_valid_file() -> None:
    doc = speedscope_document(ProfileResult(CallNode.root()))
    check_schema(doc)
    assert [p["weights"] for p in doc["profiles"]] == [[], []]


def test_a_recorded_profile_with_an_injected_clock(tmp_path: Path) -> None:
    ticks = iter(range(0, 10**9, 1000))
    model = Sequential(Linear(8, 4), ReLU(), Linear(4, 2))
    with tracetorch.profile(model, clock=lambda: next(ticks)) as prof:
        for _ in range(3):
            model(Tensor(np.ones((5, 8))))
    prof.export_speedscope(str(tmp_path / "run.speedscope.json"))
    doc = json.loads((tmp_path / "run.speedscope.json").read_text())
    check_schema(doc)
    profiles = by_name(doc)
    assert sum(profiles["Time"]["weights"]) == prof.total_time_ns > 0
    assert sum(profiles["FLOPs"]["weights"]) == prof.total_flops > 0


@pytest.mark.parametrize("option, suffix", [("--speedscope", "json"), ("--csv", "csv")])
def test_cli_report_writes_it(tmp_path: Path, option: str, suffix: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    trained().save(str(tmp_path / "run.json"))
    out = tmp_path / f"out.{suffix}"
    assert main(["report", str(tmp_path / "run.json"), option, str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    if suffix == "json":
        check_schema(json.loads(out.read_text()))
    else:
        assert out.read_text().startswith("path,name,type,kind,depth,parent,calls,")
    assert main(["report", str(tmp_path / "run.json"), option, str(tmp_path / "no" / "x")]) == 2
