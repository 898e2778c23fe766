"""The engine's working state lives beside the call tree's records, not among them.

A ``CallNode`` is what users read; per-key counters, children's frames, the rule's standing and
the operations charged since the last fold are the engine's (``node.engine``, a
``tracetorch.engine.node_state.NodeState``), and nothing of them holds a user's object once a
profile stops.
"""
from __future__ import annotations

import numpy as np

import tracetorch
from tracetorch import core
from tracetorch.engine.node_state import NodeState
from tracetorch.records.tree import CallNode

#: What a node records, and nothing else (the engine's state is the one slot ``engine``).
RECORDED = {"name", "type_name", "kind", "module_key", "parent", "children", "time", "flops",
            "gemm_flops", "macs", "flops_source", "params", "input_shapes", "output_shapes",
            "_backward_time", "backward_flops", "backward_gemm_flops", "errors", "_memory", "ops",
            "depth"}


def test_a_node_holds_its_records_and_one_engine_state():
    assert set(CallNode.__slots__) == RECORDED | {"engine"}
    assert isinstance(CallNode.root().engine, NodeState)


def _model() -> core.Sequential:
    core.manual_seed(0)
    return core.Sequential(core.Linear(4, 8), core.ReLU(), core.Linear(8, 2))


def test_a_stopped_profile_keeps_no_frame_and_no_callers():
    model = _model()
    with tracetorch.profile(model) as prof:
        model(core.Tensor(np.ones((3, 4))))
    for node in prof.nodes():
        assert node.engine.frame is None and not node.engine.child_frames, node.path
        assert node.engine.op_flops == node.engine.op_gemm == 0, node.path


def test_each_key_of_a_step_is_folded_once_whatever_its_calls():
    # A node called with two shapes in a step is listed for the fold at each key's first call
    # since the last fold, and folded once: its FLOPs are each call's, counted once.
    model = _model()
    small, large = core.Tensor(np.ones((1, 4))), core.Tensor(np.ones((5, 4)))
    with tracetorch.profile(model) as prof:
        for _ in range(3):
            model(small)
            model(large)
            model(large)
            prof.step()
    first = prof.find("layers.0")
    assert first.calls == 9
    assert first.flops == 3 * (2 * 1 * 4 * 8) + 6 * (2 * 5 * 4 * 8)
