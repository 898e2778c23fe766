"""Chrome/Perfetto export: well-formed events, correct nesting, honest notes."""
from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import pytest

import tracetorch
from support.trees import encoder_tree
from tracetorch.core import Linear, ReLU, Sequential, Tensor
from tracetorch.records.result import ProfileResult
from tracetorch.records.tree import CallNode, TimelineEvent
from tracetorch.report.chrome import chrome_trace_events, export_chrome_trace

MAIN, WORKER = 140_234_567_890_123, 140_234_567_999_999  # threading.get_ident()-sized ids


def build(dropped: int = 0) -> ProfileResult:
    """Two forward passes on the main thread and one on a worker, in completion order.

    Pass 1 at t=10 000 ns:  model [0, 1000]; encoder [100, 700]; encoder.0 [100, 500]
    (same start as its parent, shorter); encoder.1 [500, 700]; head [700, 1000] (same end).
    """
    root, model, encoder, fc, relu, head = encoder_tree()
    spans = [(fc, 100, 500), (relu, 500, 700), (encoder, 100, 700), (head, 700, 1000),
             (model, 0, 1000)]
    timeline: list[TimelineEvent] = []
    for base, tid in ((10_000, MAIN), (12_000, MAIN), (10_500, WORKER)):
        for node, start, end in spans:
            node.time.add(end - start)
            timeline.append((node, base + start, base + end, tid))
    fc.flops = fc.gemm_flops = 3 * 2000
    relu.flops = 3 * 64
    fc.note_shapes(((64, 784),), ((64, 256),))
    return ProfileResult(root, timeline=timeline, dropped_events=dropped)


def complete(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_document_shape() -> None:
    trace = chrome_trace_events(build())
    assert trace["displayTimeUnit"] == "ns"
    assert trace["otherData"]["origin_ns"] == 10_000
    events = complete(trace)
    assert len(events) == 15
    for event in events:
        assert {"ph", "ts", "dur", "pid", "tid", "name", "cat", "args"} <= set(event)
        assert isinstance(event["ts"], float) and isinstance(event["dur"], float)
        assert event["dur"] >= 0 and event["ts"] >= 0
    for event in trace["traceEvents"]:
        assert {"ph", "pid", "tid", "name"} <= set(event)
    json.dumps(trace)  # plain JSON types only


def test_times_are_microseconds_from_the_first_call() -> None:
    first = complete(chrome_trace_events(build()))[0]
    assert (first["name"], first["ts"], first["dur"]) == ("Sequential", 0.0, 1.0)
    worker_head = [e for e in complete(chrome_trace_events(build()))
                   if e["name"] == "head" and e["tid"] == 2]
    assert [(e["ts"], e["dur"]) for e in worker_head] == [(1.2, 0.3)]


def test_names_categories_and_args() -> None:
    events = complete(chrome_trace_events(build()))
    names = {e["name"] for e in events}
    assert names == {"Sequential", "encoder", "encoder.0", "encoder.1", "head"}
    fc = next(e for e in events if e["name"] == "encoder.0")
    assert fc["cat"] == "module"
    assert fc["args"] == {"type": "Linear", "path": "encoder.0", "flops": 2000,
                          "subtree_flops": 2000, "input_shapes": ["[64, 784]"],
                          "output_shapes": ["[64, 256]"]}
    model = next(e for e in events if e["name"] == "Sequential")
    assert model["args"]["subtree_flops"] == 2064 and model["args"]["flops"] == 0


def test_sorted_by_start_then_longest_first() -> None:
    events = complete(chrome_trace_events(build()))
    keys = [(e["ts"], -e["dur"]) for e in events]
    assert keys == sorted(keys)


def _check_nesting(events: list[dict[str, Any]]) -> int:
    """Replay each thread's events as a viewer does; every one must sit inside its parent."""
    checked = 0
    for tid in {e["tid"] for e in events}:
        stack: list[tuple[float, float, str]] = []
        for e in (e for e in events if e["tid"] == tid):
            start, end = round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)
            while stack and stack[-1][1] <= start and not (stack[-1][0] == start == end):
                stack.pop()
            path = e["args"]["path"]
            parent = path.rsplit(".", 1)[0] if "." in path else ("" if path else None)
            if stack:
                top_start, top_end, top_path = stack[-1]
                assert top_start <= start and end <= top_end, (e, stack)
                assert top_path == parent, (path, top_path)
                checked += 1
            else:
                assert parent in (None, ""), path
            stack.append((start, end, path))
    return checked


def test_children_nest_within_parents() -> None:
    events = complete(chrome_trace_events(build()))
    assert _check_nesting(events) == 12  # every non-top-level event found its parent


def test_equal_intervals_put_the_parent_first() -> None:
    root = CallNode.root()
    outer = root.child("outer", "Wrapper", "w")
    inner = outer.child("inner", "Linear", "l")
    # Completion order: the child finishes (at the same clock tick) before the parent.
    result = ProfileResult(root, timeline=[(inner, 50, 80, 1), (outer, 50, 80, 1)])
    events = complete(chrome_trace_events(result))
    assert [e["name"] for e in events] == ["outer", "outer.inner"]
    assert _check_nesting(events) == 1


def test_threads_are_renumbered_and_named() -> None:
    trace = chrome_trace_events(build())
    assert {e["tid"] for e in complete(trace)} == {1, 2}
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {1: f"thread {MAIN}", 2: f"thread {WORKER}"}
    process = [e for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert process[0]["args"] == {"name": "tracetorch"}


def test_meta_names_threads_and_process() -> None:
    result = build()
    result.meta.update(pid=77, name="train.py", thread_names={str(MAIN): "MainThread"})
    trace = chrome_trace_events(result)
    assert {e["pid"] for e in trace["traceEvents"]} == {77}
    labels = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert labels == ["MainThread", f"thread {WORKER}"]
    assert trace["traceEvents"][0]["args"]["name"] == "train.py"


def test_dropped_events_are_reported() -> None:
    trace = chrome_trace_events(build(dropped=42))
    notes = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert len(notes) == 1
    assert notes[0]["name"] == "42 events dropped (max_events reached)"
    assert notes[0]["ts"] == max(e["ts"] + e["dur"] for e in complete(trace))
    labels = [e for e in trace["traceEvents"] if e["name"] == "process_labels"]
    assert "timeline capped: 42 events dropped" in labels[0]["args"]["labels"]
    assert trace["otherData"]["dropped_events"] == 42


def test_no_note_when_nothing_dropped() -> None:
    trace = chrome_trace_events(build())
    assert not [e for e in trace["traceEvents"] if e["ph"] == "i" or "dropped" in e["name"]]


def test_no_timeline_raises_with_advice() -> None:
    result = build()
    result.timeline = None
    with pytest.raises(ValueError, match=r"timeline=True"):
        chrome_trace_events(result)
    with pytest.raises(ValueError, match=r"timeline=True"):
        export_chrome_trace(result, "never-written.trace.json")


def test_empty_timeline_gives_metadata_only() -> None:
    trace = chrome_trace_events(ProfileResult(CallNode.root(), timeline=[]))
    assert complete(trace) == [] and trace["traceEvents"][0]["name"] == "process_name"


def test_export_writes_the_same_document(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "run.trace.json"
    export_chrome_trace(build(dropped=1), path)
    assert json.loads(path.read_text()) == chrome_trace_events(build(dropped=1))
    assert "\n" not in path.read_text()  # compact: traces are the big files


def test_a_recorded_profile_names_its_threads_as_python_does(tmp_path: pathlib.Path) -> None:
    import threading

    import numpy as np

    import tracetorch
    from tracetorch.core import Linear, Tensor

    layer, x = Linear(2, 2), Tensor(np.ones((1, 2)))
    with tracetorch.profile(timeline=True, all_threads=True) as prof:
        layer(x)
        worker = threading.Thread(target=lambda: layer(x), name="loader-1")
        worker.start()
        worker.join()
    path = tmp_path / "run.json"
    prof.save(path)
    for result in (prof, tracetorch.load(path)):
        names = [e["args"]["name"] for e in chrome_trace_events(result)["traceEvents"]
                 if e["name"] == "thread_name"]
        assert names == [threading.main_thread().name, "loader-1"]


def test_a_timeline_recorded_inside_another_profile_saves_and_exports(
        tmp_path: pathlib.Path) -> None:
    import numpy as np

    import tracetorch
    from tracetorch.core import Linear, Tensor

    layer, x = Linear(2, 2), Tensor(np.ones((1, 2)))
    inner = tracetorch.profile(timeline=True, schedule=tracetorch.schedule(wait=1, active=1))
    with tracetorch.profile(timeline=True) as outer:
        for _ in range(2):  # a waiting step, then an active one
            with inner:
                layer(x)
            inner.step()
    assert len(inner.timeline) == 1  # the active step's call only
    assert len(outer.timeline) == 2
    for result in (inner, outer):
        path = tmp_path / "run.json"
        result.save(path)
        names = [e["name"] for e in chrome_trace_events(tracetorch.load(path))["traceEvents"]
                 if e["ph"] == "X"]
        assert names and set(names) == {"Linear"}


def test_backward_spans_per_layer_nest_in_the_pass(torch: Any) -> None:
    ticks = iter(range(0, 10**9, 1_000))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                torch.nn.Sequential(torch.nn.Linear(8, 2)))
    with tracetorch.profile(model, timeline=True, clock=lambda: next(ticks)) as prof:
        model(torch.ones(4, 8)).sum().backward()
    spans = {event[0].path: event for event in prof.backward_timeline}
    assert set(spans) == {"", "0", "1", "2", "2.0"}
    passes = [e for e in prof.timeline if e[0].kind == "backward"]
    assert len(passes) == 1
    _, pass_start, pass_end, _ = passes[0]
    for node, start, end, _ in prof.backward_timeline:
        assert pass_start <= start < end <= pass_end  # inside the pass
        parent = spans.get(node.parent.path) if node.parent.kind != "root" else None
        if parent is not None:
            assert parent[1] <= start and end <= parent[2]  # inside its parent's span
    # Gradients flow from the last layer to the first.
    assert spans["2.0"][1] < spans["1"][1] < spans["0"][1]
    trace = chrome_trace_events(prof)
    names = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "backward"]
    assert "0 (backward)" in names and "2.0 (backward)" in names


def test_backward_spans_of_core_layers_survive_save(tmp_path: Any) -> None:
    model = Sequential(Linear(4, 3), ReLU(), Linear(3, 2))
    with tracetorch.profile(model, timeline=True) as prof:
        model(Tensor(np.ones((2, 4)))).sum().backward()
    assert {e[0].path for e in prof.backward_timeline} == {"layers.0", "layers.1", "layers.2"}
    prof.save(str(tmp_path / "run.json"))
    again = tracetorch.load(str(tmp_path / "run.json"))
    assert [(e[0].path, e[1], e[2]) for e in again.backward_timeline] == [
        (e[0].path, e[1], e[2]) for e in prof.backward_timeline]
