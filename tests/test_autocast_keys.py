"""The autocast state in every call's key (tracetorch.adapters.torch.call_context): calls of the
same shapes under float32 and under ``torch.autocast`` keep their own sizes and counts, in one
profile as in two, whatever their order, and a state entered again finds its keys again."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from test_learned_ops import _figures  # noqa: E402
from tracetorch.adapters.torch.call_context import autocast_state  # noqa: E402

torch.set_num_threads(1)

BF16 = {"device_type": "cpu", "dtype": torch.bfloat16}


def _sums(profiles):
    """Each node's calls, FLOPs, op table and memory bytes, summed over ``profiles``."""
    sums = {}
    for prof in profiles:
        for path, figures in _figures(prof).items():
            node = prof.find(path) if path else prof.find("")
            memory = (node.memory.input_bytes, node.memory.output_bytes,
                      node.memory.saved_bytes)
            calls, flops, ops = figures[0], figures[1], dict((op[0], op[1:]) for op in figures[-1])
            if path in sums:
                old_calls, old_flops, old_ops, old_memory = sums[path]
                for name, (op_calls, op_flops) in old_ops.items():
                    new = ops.get(name, (0, 0))
                    ops[name] = (new[0] + op_calls, new[1] + op_flops)
                calls, flops = calls + old_calls, flops + old_flops
                memory = tuple(a + b for a, b in zip(memory, old_memory))
            sums[path] = (calls, flops, ops, memory)
    return sums


def _models():
    transformers = pytest.importorskip("transformers") if os.environ.get("CI") != "true" \
        else __import__("transformers")
    config = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64)
    return {
        "mlp": (lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                            torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)),
                lambda: torch.randn(8, 16)),
        "conv": (lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                                             torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                             torch.nn.Linear(8, 2)),
                 lambda: torch.randn(2, 3, 12, 12)),
        "bert": (lambda: transformers.BertModel(config).eval(),
                 lambda: torch.randint(0, 60, (2, 10))),
    }


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
@pytest.mark.parametrize("states", [(False, True), (True, False), (False, True, False, True)],
                         ids=["float32 first", "autocast first", "alternating"])
@pytest.mark.parametrize("name", ["mlp", "conv", "bert"])
def test_each_autocast_state_keeps_its_own_figures(monkeypatch, name, states, grad):
    make, inputs = _models()[name]
    torch.manual_seed(0)
    model, x = make(), inputs()
    steps = 3  # per state: its first two calls learn, the third is replayed

    def run(prof_states):
        with torch.set_grad_enabled(grad), tracetorch.profile(model) as prof:
            for on in prof_states:
                for _ in range(steps):
                    with torch.autocast(**BF16, enabled=on):
                        out = model(x)
                    out = out if isinstance(out, torch.Tensor) else out[0]
                    if grad:
                        out.float().sum().backward()
        return prof

    together = _sums([run(states)])
    apart = _sums([run((on,)) for on in states])
    assert together == apart
    top = together[""][3]
    assert top[1] > 0  # (memory measured)


def test_a_state_entered_again_finds_its_keys():
    layer = torch.nn.Linear(8, 8)
    x = torch.ones(2, 8)
    with torch.no_grad(), tracetorch.profile(layer) as prof:
        for _ in range(5):
            layer(x)
            with torch.autocast(**BF16):
                layer(x)
                with torch.autocast("cpu", enabled=False):  # (as rotary embeddings do)
                    layer(x)
    node = prof.find("")
    assert len(node.engine.flops_cache) == 2  # float32 twice per step, bfloat16 once
    assert node.memory.output_bytes == 5 * (2 * 2 * 8 * 4 + 2 * 8 * 2)


def test_a_layer_branching_on_the_autocast_state_is_learned_per_state(monkeypatch):
    class Branching(torch.nn.Module):
        def forward(self, x):
            return x * 2 if torch.is_autocast_enabled("cpu") else x + 1

    def run(learn):
        layer, x = Branching(), torch.ones(4)
        monkeypatch.setenv("TRACETORCH_LEARN_OPS", "1" if learn else "0")
        with torch.no_grad(), tracetorch.profile(layer) as prof:
            for step in range(8):
                with torch.autocast(**BF16, enabled=step % 2 == 1):
                    layer(x)
        return _figures(prof)

    assert run(True) == run(False)
    assert run(True)[""][-1] == [("add", 4, 16), ("mul", 4, 16)]


def test_the_state_is_read_at_the_profiles_opening_and_left_out_after():
    from tracetorch.engine.hotpath import call_key, structure_generation

    layer = torch.nn.Linear(4, 4)
    with torch.autocast(**BF16):
        with torch.no_grad(), tracetorch.profile(layer) as prof:
            assert call_key((), {})[0][1] == (structure_generation(), autocast_state())
            layer(torch.ones(1, 4))
    assert prof.find("").memory.output_bytes == 4 * 2  # bfloat16
    assert call_key((), {})[0][1] == structure_generation()
    assert autocast_state() is None
