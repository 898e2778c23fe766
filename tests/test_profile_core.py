"""The profiler on tracetorch.core models: exact FLOPs per node, rules vs counted ops, cleanup,
classes defined inside the block, reports from a real run."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tracetorch
from tracetorch.adapters.base import all_subclasses
from tracetorch.core import (
    Conv2d,
    Flatten,
    Linear,
    MaxPool2d,
    Module,
    MultiHeadAttention,
    ReLU,
    Sequential,
    Tensor,
)
from tracetorch.engine.patches import BOARD


def forwards_of_every_core_class():
    return {cls: vars(cls).get("forward") for cls in all_subclasses(Module)}


def test_mlp_flops_per_node_whole_batch():
    model = Sequential(Linear(784, 256), ReLU(), Linear(256, 10))
    x = Tensor(np.zeros((64, 784), dtype=np.float32))
    with tracetorch.profile(model) as prof:
        for _ in range(3):
            model(x)
    first, relu, last = (prof.find(f"layers.{i}") for i in range(3))
    assert (first.calls, relu.calls, last.calls) == (3, 3, 3)
    assert first.flops == 3 * 2 * 64 * 784 * 256 and first.flops_source == "rule"
    assert first.macs == 3 * 64 * 784 * 256
    assert relu.flops == 3 * 64 * 256 and relu.gemm_flops == 0 and relu.macs is None
    assert last.flops == 3 * 2 * 64 * 256 * 10
    assert prof.gemm_flops == 3 * 2 * 64 * (784 * 256 + 256 * 10)
    assert prof.forward_flops == prof.gemm_flops + 3 * 64 * 256
    assert prof.other_flops == 3 * 64 * 256
    assert prof.find("").params == 203_530 and first.params == 200_960
    assert first.input_shapes == [((64, 784),)] and first.output_shapes == [((64, 256),)]
    assert tracetorch.count_flops(model, (64, 784)) == prof.forward_flops // 3


def test_cnn_conv_and_pool_rules():
    model = Sequential(Conv2d(3, 8, 3, padding=1), ReLU(), MaxPool2d(2), Flatten(),
                       Linear(8 * 16 * 16, 10))
    with tracetorch.profile(model) as prof:
        model(Tensor(np.zeros((2, 3, 32, 32), dtype=np.float32)))
    assert prof.find("layers.0").flops == 2 * 3 * 3 * 3 * 8 * 32 * 32 * 2
    assert prof.find("layers.2").flops == 2 * 2 * 2 * 8 * 16 * 16  # 4 compares per output
    assert prof.find("layers.3").flops == 0 and prof.unsupported == {}
    assert prof.find("layers.4").flops == 2 * 2 * 2048 * 10


def test_attention_rule_counts_projections_once():
    mha = MultiHeadAttention(16, 4)
    with tracetorch.profile(mha) as prof:
        mha(Tensor(np.zeros((2, 5, 16), dtype=np.float32)))
    projection = 2 * 2 * 5 * 16 * 16
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert prof.find(name).flops == projection
    top = prof.find("")
    scores = 2 * 4 * 5 * 5
    assert top.subtree_flops == 4 * projection + 2 * 2 * 2 * 5 * 5 * 16 + 2 * 5 * 16 + 5 * scores
    assert top.flops == top.subtree_flops - 4 * projection
    assert prof.forward_flops == top.subtree_flops


def test_custom_layer_with_tensor_math_is_counted_from_ops():
    class Affine(Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = Tensor(np.ones((4, 3), dtype=np.float32), requires_grad=True)
            self.b = Tensor(np.zeros(3, dtype=np.float32), requires_grad=True)

        def forward(self, x):
            return x @ self.w + self.b

    layer = Affine()
    with tracetorch.profile(layer) as prof:
        layer(Tensor(np.ones((5, 4), dtype=np.float32)))
    node = prof.find("")
    assert node.flops_source == "ops"
    assert node.flops == 2 * 5 * 4 * 3 + 5 * 3 and node.gemm_flops == 2 * 5 * 4 * 3
    assert prof.unsupported == {}


def test_class_defined_inside_the_block_is_recorded_and_restored():
    before = forwards_of_every_core_class()
    with tracetorch.profile() as prof:
        class Late(Module):
            def forward(self, x):
                return x * 2

        Late()(Tensor(np.ones(3, dtype=np.float32)))
    assert prof.find("").calls == 1 and prof.find("").flops == 3
    assert "forward" in vars(Late)
    assert not tracetorch.engine.patches.is_instrumented(vars(Late)["forward"])
    after = forwards_of_every_core_class()
    assert all(after[cls] is before[cls] for cls in before)


def test_every_patched_attribute_is_restored_after_an_exception():
    class Faulty(Module):
        def forward(self, x):
            raise KeyError("user error")

    model = Sequential(Linear(2, 2), Faulty())
    before = forwards_of_every_core_class()
    with pytest.raises(KeyError, match="user error"):
        with tracetorch.profile(model) as prof:
            model(Tensor(np.ones((1, 2), dtype=np.float32)))
    after = forwards_of_every_core_class()
    assert all(after[cls] is before[cls] for cls in before)
    assert not BOARD.active
    assert prof.find("layers.0").flops == 8 and prof.find("layers.1").errors == 1


def test_per_profile_rule_overrides_builtin_without_touching_others():
    model = Sequential(Linear(4, 4))
    x = Tensor(np.ones((1, 4), dtype=np.float32))
    with tracetorch.profile(model, flop_rules={Linear: lambda layer, inputs, out: 7}) as custom:
        model(x)
    with tracetorch.profile(model) as default:
        model(x)
    assert custom.find("layers.0").flops == 7
    assert default.find("layers.0").flops == 32


def test_user_flop_rule_for_a_subclass_wins_over_the_builtin():
    class CheapLinear(Linear):
        pass

    tracetorch.flop_rule(CheapLinear)(lambda layer, inputs, out: 1)
    model = Sequential(CheapLinear(4, 4), Linear(4, 4))
    with tracetorch.profile(model) as prof:
        model(Tensor(np.ones((1, 4), dtype=np.float32)))
    assert prof.find("layers.0").flops == 1 and prof.find("layers.1").flops == 32


def test_json_round_trip_of_a_real_profile(tmp_path):
    model = Sequential(Linear(8, 8), ReLU(), Linear(8, 2))
    with tracetorch.profile(model) as prof:
        for _ in range(4):
            model(Tensor(np.ones((3, 8), dtype=np.float32)))
    path = tmp_path / "run.json"
    prof.save(str(path))
    loaded = tracetorch.load(str(path))
    assert [n.path for n in loaded.nodes()] == [n.path for n in prof.nodes()]
    assert loaded.total_flops == prof.total_flops and loaded.total_time_ns == prof.total_time_ns
    assert [n.calls for n in loaded.nodes()] == [n.calls for n in prof.nodes()]
    assert str(loaded) == str(prof)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="run.json"):
        tracetorch.load(str(path))


def test_chrome_trace_of_a_real_profile_is_nested(tmp_path):
    model = Sequential(Linear(8, 8), ReLU(), Linear(8, 2))
    with tracetorch.profile(model, timeline=True) as prof:
        for _ in range(2):
            model(Tensor(np.ones((3, 8), dtype=np.float32)))
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 2 * 4
    parents = [e for e in events if e["name"] in ("Sequential", "")]
    children = [e for e in events if e not in parents]
    assert len(parents) == 2
    for child in children:
        assert any(p["ts"] <= child["ts"] and child["ts"] + child["dur"] <= p["ts"] + p["dur"]
                   for p in parents)


def test_guide_style_static_and_dynamic_numbers_agree():
    model = Linear(1024, 512)
    with tracetorch.profile(model) as prof:
        model(Tensor(np.zeros((1, 1024), dtype=np.float32)))
    assert prof.forward_flops == tracetorch.count_flops(model, (1, 1024)) == 1_048_576
    assert tracetorch.count_parameters(model) == 524_800


def test_training_step_shares_and_optimizer_node():
    from tracetorch.core import SGD, CrossEntropyLoss

    ticks = iter(range(0, 10**9, 5))
    model = Sequential(Linear(4, 8), ReLU(), Linear(8, 3))
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = Tensor(np.ones((16, 4), dtype=np.float32))
    y = np.zeros(16, dtype=int)
    criterion = CrossEntropyLoss()
    with tracetorch.profile(model, clock=lambda: next(ticks)) as prof:
        for _ in range(2):
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            prof.step()
    assert [n.path for n in prof.root.children.values()] == [
        "", "CrossEntropyLoss", "backward", "SGD.step"]
    assert prof.find("SGD.step").kind == "optimizer" and prof.find("SGD.step").calls == 2
    # SGD with momentum: 4 FLOPs per parameter element (4*8+8 + 8*3+3 = 67 elements).
    assert prof.find("SGD.step").flops == 2 * 4 * 67
    assert prof.find("layers.0").backward_time.count == 2
    shares = prof.time_by_kind()
    assert shares["backward"] == prof.find("backward").total_ns > 0
    assert shares["optimizer"] == prof.find("SGD.step").total_ns > 0
    assert sum(shares.values()) == prof.total_time_ns
    assert "Step phases:" in prof.table()
    # The backward row summarises its passes; totals count that work once, on the layers.
    assert prof.find("backward").flops == prof.backward_flops > 0
    assert prof.forward_flops == sum(n.flops for n in prof.nodes() if n.kind != "backward")


def _training_step_parts(framework, request):
    """A model, its loss, an SGD optimizer and a step running the three, in ``framework``."""
    if framework == "torch":
        torch = request.getfixturevalue("torch")
        nn = torch.nn
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        criterion, optimizer = nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.ones(16, 4), torch.zeros(16, dtype=torch.long)
        layers = ["0", "1", "2"]
    else:
        from tracetorch.core import SGD, CrossEntropyLoss

        model = Sequential(Linear(4, 8), ReLU(), Linear(8, 3))
        criterion, optimizer = CrossEntropyLoss(), SGD(model.parameters(), lr=0.1)
        x, y = Tensor(np.ones((16, 4), dtype=np.float32)), np.zeros(16, dtype=int)
        layers = ["layers.0", "layers.1", "layers.2"]

    def step():
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()

    return model, step, layers


@pytest.mark.parametrize("framework", ["core", "torch"])
def test_every_way_of_opening_a_profile_gives_the_same_call_paths(framework, request):
    model, step, layers = _training_step_parts(framework, request)
    with tracetorch.profile() as bare:  # no model: the first top-level layer stands for it
        for _ in range(2):
            step()
    with tracetorch.profile(model) as given:
        for _ in range(2):
            step()
    decorated = tracetorch.profile()(step)
    for _ in range(2):
        decorated()

    def paths(prof):
        return [(n.path, n.type_name, n.kind, n.calls) for n in prof.nodes()]

    assert paths(bare) == paths(given) == paths(decorated.profile)
    # The model is "" and its layers as named_modules() names them; the loss, called after
    # it at the top level, by its type.
    assert [n.path for n in given.nodes()] == [
        "", *layers, "CrossEntropyLoss", "backward", "SGD.step"]
    assert given.find("").type_name == "Sequential" and given.find("").calls == 2


class _OpSum:
    """An op observer summing forward FLOPs, to compare rules with counted operations."""

    def __init__(self) -> None:
        self.flops = 0

    def forward_op(self, name, flops, gemm):
        self.flops += flops

    def backward_op(self, tag, name, flops, gemm, elapsed_ns):
        pass


def _layer_cases():
    from tracetorch.core import (
        GELU,
        AvgPool2d,
        BatchNorm2d,
        CrossEntropyLoss,
        LayerNorm,
        MSELoss,
        Sigmoid,
        Softmax,
        Tanh,
    )

    image = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    rows = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    return [
        (ReLU(), (rows,)), (Sigmoid(), (rows,)), (Tanh(), (rows,)), (GELU(), (rows,)),
        (Softmax(), (rows,)), (MaxPool2d(2), (image,)), (AvgPool2d(2), (image,)),
        (LayerNorm(6), (rows,)), (BatchNorm2d(3), (image,)), (Conv2d(3, 4, 3), (image,)),
        (MultiHeadAttention(6, 2), (rows.reshape(1, 4, 6),)),
        (MSELoss(), (rows, rows)), (CrossEntropyLoss(), (rows, np.arange(4) % 6)),
    ]


@pytest.mark.parametrize("layer, inputs", _layer_cases(), ids=lambda v: type(v).__name__)
def test_core_rules_match_the_counted_operations(layer, inputs):
    from tracetorch.core import autograd

    with tracetorch.profile(layer) as prof:
        layer(*[Tensor(a) if a.dtype == np.float32 else a for a in inputs])
    counter = _OpSum()
    previous = autograd.set_op_observer(counter)
    try:
        layer(*[Tensor(a) if a.dtype == np.float32 else a for a in inputs])
    finally:
        autograd.set_op_observer(previous)
    # Linear's rule leaves out the bias add (2·in·out·rows), so attention's projections do too.
    bias_adds = 4 * 4 * 6 if isinstance(layer, MultiHeadAttention) else 0
    assert prof.find("").flops_source == "rule"
    assert prof.find("").subtree_flops == counter.flops - bias_adds


def test_keyboard_interrupt_and_generator_close_restore_everything():
    class Interrupted(Module):
        def forward(self, x):
            raise KeyboardInterrupt

    before = forwards_of_every_core_class()
    model = Sequential(Linear(2, 2), Interrupted())
    with pytest.raises(KeyboardInterrupt):
        with tracetorch.profile(model):
            model(Tensor(np.ones((1, 2), dtype=np.float32)))
    assert not BOARD.active

    def profiled_batches():
        with tracetorch.profile(model) as prof:
            for _ in range(10):
                yield prof
                model.layers[0](Tensor(np.ones((1, 2), dtype=np.float32)))

    batches = profiled_batches()
    prof = next(batches)
    next(batches)
    batches.close()  # GeneratorExit inside the block
    assert not BOARD.active and not prof.running
    assert prof.find("layers.0").calls == 1  # called alone, named by its path in the model
    after = forwards_of_every_core_class()
    assert all(after[cls] is before[cls] for cls in before)
