"""A step folds nothing: reading the tree folds the nodes that ran since the last read, not the
whole tree; a layer's first call does not walk its model again. Work is counted, never timed:
every node folded goes through ``fold._fold_node``, and the walks that name layers and count
parameters are wrapped to count what they visit.
"""
from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
import pytest

import tracetorch
from tracetorch.core import Linear, Module, ReLU, Sequential, Tensor
from tracetorch.engine import fold, identities
from tracetorch.models.params import count_parameters
from tracetorch.models.subtree_params import subtree_parameter_counts
from tracetorch.records.tree import CALLS, FLOPS, GEMM_FLOPS, MACS, CallNode, new_entry

LINEAR_FLOPS = 2 * 2 * 2  # Linear(2, 2) on one row


@pytest.fixture
def folded(monkeypatch: pytest.MonkeyPatch) -> list[CallNode]:
    """The nodes folded, in order, from now on."""
    seen: list[CallNode] = []
    original = fold._fold_node

    def counting(node: CallNode, *counts: int) -> tuple[int, int, int]:
        seen.append(node)
        return original(node, *counts)

    monkeypatch.setattr(fold, "_fold_node", counting)
    return seen


def paths(nodes: list[CallNode]) -> list[str]:
    return sorted("<root>" if n.kind == "root" else n.path or "<model>" for n in nodes)


def wide(leaves: int = 20) -> Sequential:
    return Sequential(*[Linear(2, 2) for _ in range(leaves)])


# ----------------------------------------------------------------------------- steps
def test_reading_the_tree_folds_the_nodes_that_ran_since_and_their_callers_only(folded):
    model = wide()
    x = Tensor(np.ones((1, 2)))
    with tracetorch.profile(model) as prof:
        model(x)
        prof.step()
        assert folded == []  # a step leaves its counters to whoever reads the tree
        assert prof.find("layers.0").flops == LINEAR_FLOPS
        assert len(folded) == 20 + 2  # every leaf, the model, the root
        folded.clear()
        model.layers[3](x)  # on its own: a top-level node beside the model's, the same path
        prof.step()
        model.layers[3](x)
        prof.step()
        assert prof.root.children["layers.3"].flops == 2 * LINEAR_FLOPS  # both steps at once
        assert paths(folded) == ["<root>", "layers.3"]
        folded.clear()
        prof.step()  # nothing ran: nothing to fold
        assert prof.root is not None and folded == []
        model(x)
        model.layers[3](x)
    assert prof.find("layers.3").flops == 2 * LINEAR_FLOPS
    assert prof.root.children["layers.3"].flops == 3 * LINEAR_FLOPS
    assert prof.forward_flops == 2 * 20 * LINEAR_FLOPS + 3 * LINEAR_FLOPS


def test_steps_read_at_once_or_one_by_one_give_the_same_figures():
    # Counters only add up: the tree read after every step and read once after all of them
    # hold the same numbers, in and after the block.
    x = Tensor(np.ones((3, 2)))

    def run(read_each_step: bool) -> list[tuple[Any, ...]]:
        model = Sequential(Linear(2, 4), ReLU(), Linear(4, 2))
        with tracetorch.profile(model) as prof:
            for step in range(5):
                model(x if step % 2 else Tensor(np.ones((step + 1, 2))))
                prof.step()
                if read_each_step:
                    prof.nodes()
            inside = [(n.path, n.calls, n.flops, n.memory.input_bytes) for n in prof.nodes()]
        after = [(n.path, n.calls, n.flops, n.memory.input_bytes) for n in prof.nodes()]
        assert inside == after
        return after

    assert run(read_each_step=True) == run(read_each_step=False)


def test_touched_nodes_left_by_steps_stay_bounded(monkeypatch: pytest.MonkeyPatch):
    # A failed call touches its node each time: a long run of them is folded by the steps once
    # the list passes its bound, and every call is still counted.
    from tracetorch.engine import collector

    monkeypatch.setattr(collector, "FOLD_EVERY_TOUCHED", 8)

    class Boom(Module):
        def forward(self, x):
            raise RuntimeError("boom")

    boom = Boom()
    with tracetorch.profile(boom) as prof:
        for _ in range(100):
            with pytest.raises(RuntimeError):
                boom(Tensor(np.ones((1, 2))))
            prof.step()
            assert len(prof._collector.touched) <= 8 + 1
    assert prof.find("").errors == 100 and prof.find("").calls == 100


def test_untouched_nodes_are_not_visited():
    root = CallNode.root()
    block = root.child("block", "Block", "m0")
    ran, idle = block.child("ran", "Custom", "m1"), block.child("idle", "Custom", "m2")
    ran.engine.op_flops, ran.engine.op_gemm = 10, 8
    idle.engine.op_flops = 5  # counters a fold that visited it would take
    fold.fold_touched([ran])
    assert (ran.flops, ran.gemm_flops, ran.macs, ran.flops_source) == (10, 8, 4, "ops")
    assert (block.flops, block.subtree_flops) == (0, 10)
    assert (idle.engine.op_flops, idle.flops) == (5, 0)


def _counter(calls: int, flops: int, gemm: int, macs: int) -> list[Any]:
    entry = new_entry()
    entry[CALLS], entry[FLOPS], entry[GEMM_FLOPS], entry[MACS] = calls, flops, gemm, macs
    return entry


def _mixed_tree() -> CallNode:
    """Rules under counted operations under a free container, with pending counters."""
    root = CallNode.root()
    free = root.child("seq", "Sequential", "m0")
    free.engine.rule_state = "free"
    ruled = free.child("attn", "Attention", "m1")
    ruled.engine.rule_state = "rule"
    ruled.engine.flops_cache = {(2, 4): _counter(3, 100, 64, 32), (1, 4): _counter(1, 50, 32, 16)}
    inner = ruled.child("proj", "Custom", "m2")
    # more than the rule leaves: clamped, never negative
    inner.engine.op_flops, inner.engine.op_gemm = 30, 20
    ops = free.child("act", "Custom", "m3")
    ops.engine.op_flops = 7
    user = root.child("fn", "fn", "m4", kind="function")
    user.engine.rule_state = "user"
    user.engine.flops_cache = {None: _counter(2, 9, 0, 0)}
    root.engine.op_flops = 1  # an operation outside every layer
    return root


def _state(root: CallNode) -> list[tuple[Any, ...]]:
    return [(n.path, n.flops, n.gemm_flops, n.macs, n.flops_source, n.engine.op_flops,
             [entry[0] for entry in n.engine.flops_cache.values()]) for n in root.walk()]


def test_folding_the_touched_nodes_equals_folding_the_tree():
    whole, touched = _mixed_tree(), _mixed_tree()
    fold.fold_tree(whole)
    leaves = [n for n in touched.walk() if not n.children]
    fold.fold_touched(reversed(leaves))
    assert _state(touched) == _state(whole)
    assert whole.find("seq.attn").flops == 3 * 100 + 50 - 30
    assert whole.subtree_flops == 3 * 100 + 50 + 7 + 2 * 9 + 1


def test_a_node_touched_without_running_is_folded_at_the_next_read(folded):
    """What backward attribution does: it charges nodes whose forward ran steps ago."""
    model = wide(3)
    x = Tensor(np.ones((1, 2)))
    with tracetorch.profile(model) as prof:
        model(x)
        prof.step()
        node = prof.find("layers.1")
        next(iter(node.engine.flops_cache.values()))[0] += 1  # one more call, as a counter
        prof._collector.touch(node)
        folded.clear()
        prof.step()
        prof.nodes()  # a read of the tree
        assert paths(folded) == ["<model>", "<root>", "layers.1"]
    assert node.flops == 2 * LINEAR_FLOPS


def test_timeline_and_failed_calls_are_folded_too(folded):
    class Boom(Module):
        def forward(self, x):
            (x @ Tensor(np.ones((2, 2)))).sum()  # counted before it raises: 2 x 2 x 2 FLOPs
            raise RuntimeError("boom")

    model, boom = wide(3), Boom()
    x = Tensor(np.ones((1, 2)))
    with tracetorch.profile(model, timeline=True) as prof:
        model(x)
        prof.step()
        prof.nodes()  # a read of the tree
        folded.clear()
        model.layers[0](x)
        with pytest.raises(RuntimeError):
            boom(x)
        prof.step()
        prof.nodes()  # a read of the tree
        assert paths(folded) == ["<root>", "Boom", "layers.0"]
    assert prof.find("Boom").flops >= 8 and prof.find("Boom").errors == 1
    assert prof.root.children["layers.0"].flops == LINEAR_FLOPS


def test_calls_of_another_thread_are_folded_at_the_next_read(folded):
    model = wide(2)
    x = Tensor(np.ones((1, 2)))
    with tracetorch.profile(model, all_threads=True) as prof:
        model(x)
        prof.step()
        prof.nodes()  # a read of the tree
        folded.clear()
        worker = threading.Thread(target=model.layers[1], args=(x,), name="w")
        worker.start()
        worker.join()
        prof.step()
        prof.nodes()  # a read of the tree
        assert paths(folded) == ["<root>", "thread w", "thread w.layers.1"]
    assert prof.forward_flops == 3 * LINEAR_FLOPS


# ----------------------------------------------------------------------------- first calls
@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many modules the engine's naming and parameter counting visit from now on."""
    counts = {"children": 0, "subtree": 0, "params": 0}

    def counted(name: str, walker: Any) -> Any:
        def walk(model: Any) -> Any:
            for item in walker(model):
                counts[name] += 1
                yield item
        return walk

    monkeypatch.setattr(identities, "named_children_of",
                        counted("children", identities.named_children_of))
    monkeypatch.setattr(identities, "named_submodules",
                        counted("subtree", identities.named_submodules))
    from tracetorch.models import subtree_params

    original = subtree_params._parts

    def parts(module: Any) -> Any:
        counts["params"] += 1
        return original(module)

    monkeypatch.setattr(subtree_params, "_parts", parts)
    return counts


def chain(nn: Any, depth: int) -> Any:
    model = nn.Linear(4, 4)
    for _ in range(depth):
        model = nn.Sequential(model)
    return model


@pytest.mark.parametrize("depth", [1, 10, 100])
def test_first_calls_visit_each_module_once_at_any_depth(torch, walks, depth):
    model = chain(torch.nn, depth)
    with tracetorch.profile(model, ops=False) as prof:
        model(torch.zeros(1, 4))
    # Each child is named once from its parent's direct children, each module counted once
    # for its parameters and once for their bytes.
    assert walks == {"children": depth, "subtree": 0, "params": 2 * (depth + 1)}
    deepest = prof.find(".".join(["0"] * depth))
    assert deepest.type_name == "Linear" and deepest.params == 20
    assert all(node.params == 20 for node in prof.nodes())


def test_a_layer_called_through_an_attribute_path_is_named_by_the_deep_walk(torch, walks):
    nn = torch.nn

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

        def forward(self, x):
            return self.block[1](self.block[0](x))  # the block itself never runs

    model = Outer()
    with tracetorch.profile(model, ops=False) as prof:
        model(torch.zeros(1, 4))
        model(torch.zeros(1, 4))
    assert [n.path for n in prof.nodes()] == ["", "block.0", "block.1"]
    assert walks["subtree"] == 3  # the outer model walked once: it names both layers
    assert prof.find("block.0").params == 20


def _check_counts(model: Any) -> None:
    counts = subtree_parameter_counts(model)
    assert counts[-1][0] is model
    assert [n for _, n in counts] == [count_parameters(m) for m, _ in counts]


def test_subtree_counts_equal_count_parameters_torch(torch):
    from support.torch_models import shared_model

    nn = torch.nn

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 8)
            self.blocks = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8)))
            self.head = nn.Linear(8, 50, bias=False)
            self.head.weight = self.embed.weight
            self.again = self.blocks[1]  # one module under two parents
            self.scale = nn.Parameter(torch.ones(8))

    class OwnParameters(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def parameters(self, recurse=True):
            return iter([self.fc.weight])

    for model in (Tied(), shared_model(torch), chain(nn, 30),
                  nn.Sequential(OwnParameters(), nn.Linear(2, 2))):
        _check_counts(model)
    assert dict((type(m).__name__, n) for m, n in subtree_parameter_counts(Tied()))["Tied"] \
        == 50 * 8 + 2 * (8 * 8 + 8) + 8


def test_subtree_counts_equal_count_parameters_core_and_duck():
    class Holder:  # duck-typed, weights in attributes and a layer list
        def __init__(self, shared):
            self.weight = np.zeros((3, 3))
            self.layers = [Linear(3, 3), shared]

        def forward(self, x):
            return x

    class Custom(Module):
        def __init__(self):
            super().__init__()
            self.fc = Linear(2, 2)

        def parameters(self):  # TinyTorch style: only what it says
            return [self.fc.weight]

    shared = Linear(3, 3)
    nested = Sequential(Linear(2, 2), Sequential(ReLU(), Linear(2, 2)), Custom())
    deep = Sequential(Linear(2, 2))
    for _ in range(30):
        deep = Sequential(deep)
    for model in (nested, deep, Holder(shared), Sequential(Holder(shared), shared)):
        _check_counts(model)
    assert subtree_parameter_counts(deep)[-1][1] == 6


def test_merging_a_tree_deeper_than_the_recursion_limit():
    # (a schedule's or a nested profile's recording is merged into the profile's tree)
    source = node = CallNode.root()
    depth = sys.getrecursionlimit() + 500
    for level in range(depth):
        node = node.child(f"l{level}", "Block", f"m{level}")
        node.time.add(level + 1)
    target = CallNode.root()
    mapping = fold.merge_tree(source, target)
    assert len(mapping) == depth + 1 and mapping[source] is target
    deepest = mapping[node]
    assert deepest.depth == depth and deepest.calls == 1 and deepest.time.total_ns == depth
    assert [s.path for s, _ in fold.merge_below(source, CallNode.root())][:2] == ["l0", "l0.l1"]


def test_a_read_from_another_thread_has_the_stop_fold_the_whole_tree():
    # A reader beside the recording thread may take the touched list while a node is added to
    # it: the block's end then folds every node, so nothing counted is left out.
    model = wide(3)
    x = Tensor(np.ones((1, 2)))
    with tracetorch.profile(model) as prof:
        for _ in range(3):
            model(x)
            prof.step()
        reader = threading.Thread(target=prof.nodes)
        reader.start()
        reader.join()
        assert prof._collector._other_threads
        model(x)
    assert prof.forward_flops == 4 * 3 * LINEAR_FLOPS
    assert [node.calls for node in prof.nodes()] == [4, 4, 4, 4]


def test_reads_from_another_thread_while_recording_keep_every_count():
    # Two monitors reading the tree over and over while the loop records and steps: every call
    # counted once, none twice (folds are taken one at a time).
    model = wide(4)
    x = Tensor(np.ones((1, 2)))
    done = threading.Event()
    failures: list[BaseException] = []

    def monitor(prof: tracetorch.profile) -> None:
        try:
            while not done.is_set():
                prof.nodes()
        except BaseException as error:  # (a thread's exception would not reach the test)
            failures.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns as often as they can
    with tracetorch.profile(model) as prof:
        readers = [threading.Thread(target=monitor, args=(prof,)) for _ in range(2)]
        for reader in readers:
            reader.start()
        try:
            for _ in range(300):
                model(x)
                prof.step()
        finally:
            done.set()
            for reader in readers:
                reader.join()
            sys.setswitchinterval(interval)
    assert failures == []
    assert prof.forward_flops == 300 * 4 * LINEAR_FLOPS
    assert [node.calls for node in prof.nodes()] == [300] * 5
