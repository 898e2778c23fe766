"""torch.compile, torch._dynamo.explain and compiled training steps inside a profile block.

A block must not change what Dynamo compiles: a model compiled outside is not compiled again
inside, nor again after; one compiled inside is not compiled again after. transformers layers
(whose ``forward`` is read from the class and carries closures Dynamo guards on) compile inside
a block as outside. A compiled step's backward FLOPs are counted, as ``FlopCounterMode`` counts
them on the eager model.
"""
from __future__ import annotations

import os
from typing import Any

import pytest

import tracetorch
from support.dynamo import fresh_dynamo  # noqa: F401 - the fixture, used by pytestmark

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")
transformers = (pytest.importorskip("transformers") if os.environ.get("CI") != "true"
                else __import__("transformers"))


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def graphs() -> int:
    """How many graphs Dynamo has compiled since the last reset."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x: Any) -> Any:
        return self.b(torch.relu(self.a(x)))


def bert() -> Any:
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=100,
                                     max_position_embeddings=32)
    return transformers.BertModel(config).eval()


def gpt2() -> Any:
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100,
                                     n_positions=32)
    return transformers.GPT2Model(config).eval()


@pytest.mark.parametrize("models", ["profile()", "profile(model)"])
def test_a_model_compiled_outside_is_compiled_once(models: str) -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(3, 16)
    compiled = torch.compile(model, backend="eager")
    expected = compiled(x)
    assert graphs() == 1
    with tracetorch.profile(model if models == "profile(model)" else None) as prof:
        inside = compiled(x)
        model(x)  # an eager call wraps the classes the compiled code was compiled from
        again = compiled(x)
    after = compiled(x)
    assert graphs() == 1
    assert torch.equal(inside, expected) and torch.equal(again, expected)
    assert torch.equal(after, expected)
    # The compiled module's row is typed as the model it compiled; the eager call is another.
    assert sorted(n.calls for n in prof.nodes() if n.type_name == "Net") == [1, 2]
    assert [region["calls"] for region in prof.meta["compiled"]["regions"].values()] == [2]
    assert torch._C._len_torch_function_stack() == 0


def test_a_model_compiled_inside_a_block_is_not_compiled_again_after() -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(3, 16)
    expected = model(x)
    with tracetorch.profile(model):
        model(x)
        compiled = torch.compile(model, backend="aot_eager")
        inside = compiled(x)
    compiled_graphs = graphs()
    after = compiled(x)
    assert graphs() == compiled_graphs == 1
    assert torch.allclose(inside, expected) and torch.allclose(after, expected)


@pytest.mark.parametrize("make", [bert, gpt2])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_transformers_models_compile_inside_a_block_as_outside(make: Any, backend: str) -> None:
    torch.manual_seed(0)
    model, ids = make(), torch.randint(0, 100, (2, 8))
    expected = model(ids).last_hidden_state
    with tracetorch.profile(model) as prof:  # every class wrapped before Dynamo traces
        model(ids)
        compiled = torch.compile(model, backend=backend)
        inside = compiled(ids).last_hidden_state
    compiled_graphs = graphs()
    after = compiled(ids).last_hidden_state
    assert graphs() == compiled_graphs
    assert torch.allclose(inside, expected, atol=1e-5) and torch.allclose(after, expected,
                                                                         atol=1e-5)
    assert [region["calls"] for region in prof.meta["compiled"]["regions"].values()] == [1]


@pytest.mark.parametrize("make", [bert, gpt2])
def test_a_transformers_model_compiled_outside_is_compiled_once(make: Any) -> None:
    torch.manual_seed(0)
    model, ids = make(), torch.randint(0, 100, (2, 8))
    compiled = torch.compile(model, backend="eager")
    expected = compiled(ids).last_hidden_state
    compiled_graphs = graphs()
    with tracetorch.profile(model):  # its classes wrapped: Dynamo guards on their forward
        inside = compiled(ids).last_hidden_state
        model(ids)
    after = compiled(ids).last_hidden_state
    assert graphs() == compiled_graphs
    assert torch.equal(inside, expected) and torch.equal(after, expected)


def test_a_compiled_function_runs_a_models_wrapped_layers_without_error() -> None:
    torch.manual_seed(0)
    model, ids = bert(), torch.randint(0, 100, (2, 8))
    expected = model(ids).last_hidden_state
    # No OptimizedModule to suspend the patches for: Dynamo meets the wrapped forwards (and
    # may compile again for them), and must not take them for functions.
    with tracetorch.profile(model):
        compiled = torch.compile(lambda t: model(t).last_hidden_state, backend="eager")
        inside = compiled(ids)
    assert torch.allclose(inside, expected, atol=1e-5)
    assert torch.allclose(compiled(ids), expected, atol=1e-5)


@pytest.mark.parametrize("make", [bert, gpt2])
def test_dynamo_explain_inside_a_block_as_outside(make: Any) -> None:
    torch.manual_seed(0)
    model, ids = make(), torch.randint(0, 100, (2, 8))
    outside = torch._dynamo.explain(model)(ids)
    torch._dynamo.reset()
    with tracetorch.profile(model):
        model(ids)
        inside = torch._dynamo.explain(model)(ids)
    assert (inside.graph_count, inside.graph_break_count, inside.op_count) == (
        outside.graph_count, outside.graph_break_count, outside.op_count)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_training_step_counts_the_flops_flop_counter_counts(backend: str) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model, x = Net(), torch.randn(8, 16)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    compiled = torch.compile(model, backend=backend)
    compiled(x).sum().backward()  # compiled (and its backward) before the block
    with tracetorch.profile() as prof:
        compiled(x).sum().backward()
    node = prof.find("")
    # Forward 2·8·16·32 + 2·8·32·4 in products (and 8·32 for the relu, which FlopCounterMode
    # leaves out); backward: the weights' gradients of both layers and the input gradient of the
    # second (x needs none): 2·8·16·32 + 2·(2·8·32·4). Charged to the layers, as in eager.
    assert node.subtree_gemm_flops == 2 * 8 * 16 * 32 + 2 * 8 * 32 * 4
    assert node.subtree_backward_flops == 2 * 8 * 16 * 32 + 2 * (2 * 8 * 32 * 4)
    assert node.subtree_gemm_flops + node.subtree_backward_flops == counter.get_total_flops()
    assert graphs() == 1


def test_a_layers_forward_read_from_its_class_is_the_original_function() -> None:
    model = bert()
    layer_type = type(model.encoder.layer[0])
    original = vars(layer_type)["forward"]
    with tracetorch.profile(model):
        assert layer_type.forward is original
        # transformers checkpoints a layer only where type(self).forward is its own wrapper
        model.gradient_checkpointing_enable()
        model.train()
        checkpointed = []
        for layer in model.encoder.layer:
            inner = layer._gradient_checkpointing_func

            def counting(*args: Any, inner: Any = inner, **kwargs: Any) -> Any:
                checkpointed.append(1)
                return inner(*args, **kwargs)

            layer._gradient_checkpointing_func = counting
        model(torch.randint(0, 100, (2, 8))).last_hidden_state.sum().backward()
    assert len(checkpointed) == 2


@pytest.mark.slow  # inductor compiles C++ (and may start compile workers): about 15 s
def test_an_inductor_compiled_step_counts_its_products_forward_and_backward() -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(8, 16, requires_grad=True)
    compiled = torch.compile(model)  # inductor: its kernels call aten's mm/addmm for products
    compiled(x).sum().backward()
    with tracetorch.profile() as prof:
        compiled(x).sum().backward()
    node = prof.find("")
    forward = 2 * 8 * 16 * 32 + 2 * 8 * 32 * 4
    assert node.subtree_gemm_flops == forward
    assert node.subtree_backward_flops == 2 * forward  # x and both weights need gradients
    assert graphs() == 1
