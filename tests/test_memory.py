"""Per-layer memory: bytes read, written, held as parameters and saved for backward, exact."""
from __future__ import annotations

import os

import numpy as np
import pytest

import tracetorch
from tracetorch.core import Linear, ReLU, Sequential, Tensor, no_grad
from tracetorch.text.units import format_bytes

F32 = 4


def test_core_linear_reads_writes_and_saves_its_input():
    model = Sequential(Linear(784, 256), ReLU(), Linear(256, 10))
    x = Tensor(np.ones((64, 784), dtype=np.float32))
    with tracetorch.profile(model) as prof:
        for _ in range(3):
            model(x).sum().backward()
    first, relu, last = (prof.find(f"layers.{i}") for i in range(3))
    assert first.memory.input_bytes == 3 * 64 * 784 * F32
    assert first.memory.output_bytes == 3 * 64 * 256 * F32
    assert first.memory.param_bytes == (784 * 256 + 256) * F32
    assert first.memory.saved_bytes == 3 * 64 * 784 * F32  # its input; its weight is held anyway
    assert first.bytes_moved == 3 * (64 * 784 + 64 * 256) * F32 + 3 * (784 * 256 + 256) * F32
    assert relu.memory.param_bytes == 0 and relu.memory.saved_bytes == 3 * 64 * 256 * F32
    assert last.memory.saved_bytes == 3 * 64 * 256 * F32
    model_node = prof.find("")
    assert model_node.memory.saved_bytes == 0  # its calls saved nothing of their own
    assert model_node.subtree_saved_bytes == prof.saved_bytes == 3 * 64 * (784 + 2 * 256) * F32


def test_inference_saves_nothing_but_still_moves_bytes():
    from tracetorch.core import no_grad

    model = Linear(8, 4)
    with tracetorch.profile(model) as prof, no_grad():
        model(Tensor(np.ones((2, 8), dtype=np.float32)))
    node = prof.find("")
    assert node.memory.saved_bytes == 0
    assert node.memory.input_bytes == 2 * 8 * F32 and node.memory.output_bytes == 2 * 4 * F32


def test_memory_false_records_no_bytes():
    model = Linear(8, 4)
    with tracetorch.profile(model, memory=False) as prof:
        model(Tensor(np.ones((2, 8), dtype=np.float32))).sum().backward()
    node = prof.find("")
    assert not node.memory and node.bytes_moved == 0 and prof.saved_bytes == 0
    assert "Memory:" not in str(prof)


def test_memory_survives_save_and_load(tmp_path):
    model = Linear(8, 4)
    with tracetorch.profile(model) as prof:
        model(Tensor(np.ones((2, 8), dtype=np.float32))).sum().backward()
    prof.save(str(tmp_path / "run.json"))
    again = tracetorch.load(str(tmp_path / "run.json"))
    assert again.find("").memory.to_dict() == prof.find("").memory.to_dict()
    assert again.saved_bytes == prof.saved_bytes == 2 * 8 * F32


def test_a_file_without_memory_reads_as_zeros(tmp_path):
    with tracetorch.profile() as prof:
        Linear(2, 2)(Tensor(np.ones((1, 2))))
    data = prof.to_dict()
    for node in data["root"]["children"]:
        del node["memory"]
    assert not tracetorch.ProfileResult.from_dict(data).nodes()[0].memory


def test_summary_states_saved_activations():
    model = Linear(1024, 1024)
    with tracetorch.profile(model) as prof:
        model(Tensor(np.ones((64, 1024), dtype=np.float32))).sum().backward()
    assert "Memory:" in str(prof)
    assert "activations saved for backward 256 KiB" in str(prof)


@pytest.mark.parametrize("value, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"),
                                         (1_048_575, "1.00 MiB"), (1_048_576 * 412, "412 MiB")])
def test_bytes_print_with_binary_units(value, text):
    assert format_bytes(value) == text


# ----------------------------------------------------------------------------- torch
def saved_by_hooks(torch, run):
    """What autograd saves while ``run()`` builds its graph, seen through torch's own
    saved-tensor hooks: each storage once, leaves that need a gradient left out."""
    seen: dict[int, int] = {}

    def pack(tensor):
        base = tensor._base if tensor._base is not None else tensor
        if not (base.requires_grad and base.is_leaf):
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return out, sum(seen.values())


def test_torch_linear_saves_its_input_exactly(torch):
    layer = torch.nn.Linear(1024, 1024)
    x = torch.ones(64, 1024)
    with tracetorch.profile(layer) as prof:
        layer(x).sum().backward()
    node = prof.find("")
    assert node.memory.saved_bytes == 262_144
    assert node.memory.input_bytes == node.memory.output_bytes == 262_144
    assert node.memory.param_bytes == (1024 * 1024 + 1024) * F32


def test_torch_conv_saves_its_input(torch):
    conv = torch.nn.Conv2d(3, 8, 3)
    x = torch.ones(2, 3, 16, 16)
    with tracetorch.profile(conv) as prof:
        conv(x).sum().backward()
    node = prof.find("")
    assert node.memory.saved_bytes == 2 * 3 * 16 * 16 * F32
    assert node.memory.output_bytes == 2 * 8 * 14 * 14 * F32
    assert node.memory.param_bytes == (8 * 3 * 9 + 8) * F32


def test_a_module_shared_by_two_parents_saves_under_each_and_each_storage_once(torch):
    shared = torch.nn.Linear(16, 16)
    model = torch.nn.Sequential(torch.nn.Sequential(shared, torch.nn.ReLU()),
                                torch.nn.Sequential(shared))
    x = torch.ones(4, 16)
    with tracetorch.profile(model) as prof:
        model(x).sum().backward()
    # Under the first parent it saves x; ReLU saves its output, which the shared layer saves
    # again under the second parent (counted once, for ReLU, which saved it first).
    assert prof.find("0.0").memory.saved_bytes == 4 * 16 * F32
    assert prof.find("0.1").memory.saved_bytes == 4 * 16 * F32
    assert prof.find("1.0").memory.saved_bytes == 0
    _, expected = saved_by_hooks(torch, lambda: model(x))
    assert prof.saved_bytes == expected == 2 * 4 * 16 * F32


def test_attention_block_matches_what_autograd_saves(torch):
    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0,
                                             batch_first=True)
    x = torch.randn(2, 10, 32)
    _, expected = saved_by_hooks(torch, lambda: block(x))
    with tracetorch.profile(block) as prof:
        block(x).sum().backward()
    assert expected > 0 and prof.saved_bytes == expected


def test_checkpointed_blocks_save_nothing_inside(torch):
    from torch.utils.checkpoint import checkpoint

    inner = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)

    model = Outer()
    x = torch.ones(4, 16, requires_grad=True)
    with tracetorch.profile(model) as prof:
        model(x).sum().backward()
    # Checkpointing keeps no activations of the block: only what it recomputes from.
    assert prof.find("inner").subtree_saved_bytes == 0


@pytest.mark.parametrize("hooked_first", [True, False])
def test_a_step_under_saved_tensor_hooks_leaves_the_others_their_saved_bytes(torch,
                                                                             hooked_first):
    # What autograd keeps under saved-tensor hooks (CPU offloading here) is theirs: nothing is
    # read there, and the calls of the same shapes without hooks keep their own figures (a
    # first step under save_on_cpu gave every later one 0 bytes saved).
    import contextlib

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.ones(8, 16)
    with tracetorch.profile(model) as prof:
        for hooked in (hooked_first, not hooked_first):
            with torch.autograd.graph.save_on_cpu() if hooked else contextlib.nullcontext():
                model(x).sum().backward()
            prof.step()
    # One step's: Linear 0 its input (8x16 floats), ReLU its output (8x32).
    assert [prof.find(path).memory.saved_bytes for path in ("0", "1", "2")] == [
        8 * 16 * 4, 8 * 32 * 4, 0]


def test_torch_func_transforms_still_work_inside_a_profile(torch):
    layer = torch.nn.Linear(4, 1)
    with tracetorch.profile(layer):
        grads = torch.func.grad(lambda x: layer(x).sum())(torch.ones(3, 4))
    assert torch.equal(grads, layer.weight.detach().expand(3, 4))


def test_transformers_bert_saved_bytes_match_autograd(torch):
    transformers = pytest.importorskip("transformers") if os.environ.get("CI") != "true" else (
        __import__("transformers"))
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertModel(config)
    ids = torch.randint(0, 100, (2, 16))
    _, expected = saved_by_hooks(torch, lambda: model(ids).last_hidden_state)
    with tracetorch.profile(model) as prof:
        model(ids).last_hidden_state.sum().backward()
    assert expected > 0 and prof.saved_bytes == expected


@pytest.mark.parametrize("framework", ["core", "torch"])
def test_the_facade_agrees_with_the_profile(framework, request):
    from tracetorch.perf.profiling import Profiler

    if framework == "torch":
        torch = request.getfixturevalue("torch")
        model = torch.nn.Sequential(torch.nn.Linear(20, 10), torch.nn.ReLU())
        x = torch.randn(10, 20)
    else:
        model = Sequential(Linear(20, 10), ReLU())
        x = Tensor(np.random.randn(10, 20).astype(np.float32))
    facade = Profiler().measure_memory(model, (10, 20))
    with tracetorch.profile(model) as prof:
        model(x)
    node = prof.find("")
    assert facade["parameter_memory_mb"] * 2**20 == node.memory.param_bytes == 840
    assert facade["activation_memory_mb"] * 2**20 == (
        node.memory.input_bytes + node.memory.output_bytes) == (200 + 100) * F32


def test_memory_columns_show_when_asked_for():
    model = Sequential(Linear(1024, 1024), ReLU())
    with tracetorch.profile(model) as prof:
        model(Tensor(np.ones((64, 1024), dtype=np.float32))).sum().backward()
    assert "Bytes moved" not in prof.table()  # the default table stays as it was
    # In call order: sorted by time, the backward row can come first on a loaded machine.
    text = prof.table(columns=["bytes", "intensity", "saved", "param_bytes"], sort_by="call_order")
    header, _, model_row, linear, relu = text.splitlines()[:5]
    assert header.split()[1:] == ["Bytes", "moved", "FLOPs/B", "Saved", "Param", "bytes"]
    # Linear: 256 KiB in, 256 KiB out, 4 MiB (+4 KiB bias) of weights; it saved its input.
    # Intensity: (2·64·1024·1024 + 64·1024 bias) FLOPs over 4,722,688 bytes.
    assert linear.split()[2:] == ["4.50", "MiB", "28.4", "256", "KiB", "4.00", "MiB"]
    assert relu.split()[2:] == ["512", "KiB", "0.125", "256", "KiB", "-"]


@pytest.mark.parametrize("padding", [0, 1])
def test_core_conv_keeps_its_input_and_its_padded_stream(padding):
    from tracetorch.core import Conv2d
    from tracetorch.core.conv_impl import stream_forward

    conv = Conv2d(3, 8, 3, padding=padding)
    x = Tensor(np.ones((2, 3, 16, 16), dtype=np.float32))
    with tracetorch.profile(conv) as prof:
        conv(x).sum().backward()
    # What its backward closure holds: the input (its shape is read there) and the padded
    # stream its weight gradient reads, as conv_impl builds it; the weight is held anyway.
    _, stream = stream_forward(x.data, conv.weight.data, (padding, padding))
    assert prof.find("").memory.saved_bytes == x.data.nbytes + stream.nbytes


def test_a_core_module_shared_by_two_parents_saves_under_each():
    shared = Linear(16, 16)
    model = Sequential(Sequential(shared, ReLU()), Sequential(shared))
    with tracetorch.profile(model) as prof:
        model(Tensor(np.ones((4, 16), dtype=np.float32))).sum().backward()
    # Each call keeps its own input; core's ReLU keeps its input, the first call's output.
    assert prof.find("layers.0.layers.0").memory.saved_bytes == 4 * 16 * F32
    assert prof.find("layers.0.layers.1").memory.saved_bytes == 4 * 16 * F32
    assert prof.find("layers.1.layers.0").memory.saved_bytes == 4 * 16 * F32


def test_a_core_call_without_gradients_leaves_the_later_calls_their_saved_bytes():
    # Measured once per key, which holds core's grad mode: the first call saves nothing.
    layer, x = Linear(4, 3), Tensor(np.ones((2, 4)))
    with tracetorch.profile(layer) as prof:
        with no_grad():
            layer(x)
        layer(x)
    assert prof.root.children[""].memory.saved_bytes == 2 * 4 * F32  # its input


def _saved_per_node(prof):
    return {node.path: node.memory.saved_bytes for node in prof.root.walk() if node.parent}


def _core_step(model, rows):
    model(Tensor(np.ones((rows, 6), dtype=np.float32))).sum().backward()


def _torch_step(model, rows):
    import torch

    model(torch.ones(rows, 6)).sum().backward()


@pytest.mark.parametrize("framework", ["core", "torch"])
def test_a_keys_first_call_late_in_a_run_without_steps_keeps_its_saved_bytes(framework):
    # Saved bytes are measured at each key's first call, counting a storage once a pass: a
    # freed storage whose address a later one reuses, or a storage each pass saves again (an
    # input used at every step), is charged again in a later pass, with or without
    # prof.step(). The run's figures are those of one profile per batch size, summed.
    if framework == "core":
        def make():
            return Sequential(Linear(6, 8), ReLU(), Linear(8, 2))
        step = _core_step
    else:
        torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" \
            else __import__("torch")
        torch.manual_seed(0)

        def make():
            return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(),
                                       torch.nn.Linear(8, 2))
        step = _torch_step
    model, sizes = make(), (4, 4, 4, 3, 3, 3, 4, 3)
    with tracetorch.profile(model) as prof:
        for rows in sizes:
            step(model, rows)
    together = _saved_per_node(prof)
    apart: dict[str, int] = {}
    for rows in sizes:
        with tracetorch.profile(model) as single:
            step(model, rows)
        for path, saved in _saved_per_node(single).items():
            apart[path] = apart.get(path, 0) + saved
    assert together == apart
    # the first Linear keeps its input; the ReLU its output (torch) or input (core); the last
    # Linear its input
    assert together["layers.0" if framework == "core" else "0"] == sum(sizes) * 6 * F32
