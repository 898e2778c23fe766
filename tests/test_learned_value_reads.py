"""Learned operation counts and tensor values (tracetorch.adapters.torch.value_reads): a layer
whose work follows its tensors' values — a value read into Python that its code branches on, a
tensor whose shape the values decide — is counted by the function mode at every call, and so
are the layers around it, so every figure stays what the mode counts (``TRACETORCH_LEARN_OPS=0``)
however many calls of one key agreed before."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from test_learned_ops import Caller, _both, _figures, _run  # noqa: E402
from tracetorch.adapters.torch.value_reads import reads_values  # noqa: E402

torch.set_num_threads(1)

#: Signs of the calls: the first two agree, then the values change under the same key.
SIGNS = (1, 1, -1, 1, -1, -1)
#: Three positive items in a call of sign 1, one in a call of sign -1.
VALUES = (1.0, 2.0, 3.0, -0.5)


def _signed(call, x):
    return (x * SIGNS[(call - 1) % len(SIGNS)],)


def _adds(times, x):
    for _ in range(times):
        x = x + 1
    return x


#: Layers whose additions follow the values: by a branch on a value read into Python...
BRANCHES = {
    "bool": lambda x: 3 if x.sum() < 0 else 1,
    "item": lambda x: 3 if x.sum().item() < 0 else 1,
    "float": lambda x: 3 if float(x.sum()) < 0 else 1,
    "int": lambda x: 1 + 2 * int(x.sum() < 0),
    "index": lambda x: [1, 3][(x.sum() < 0).long()],
    "tolist": lambda x: 3 if x.tolist()[0] < 0 else 1,
    "numpy": lambda x: 3 if x.numpy()[0] < 0 else 1,
    "equal": lambda x: 1 if torch.equal(x[:1], x[:1].abs()) else 3,
    "allclose": lambda x: 1 if torch.allclose(x[:1], x[:1].abs()) else 3,
    "contains": lambda x: 3 if -1.0 in x else 1,
}
#: ... or on a tensor whose size the values decide.
SHAPES = {
    "mask index": lambda x: x[x > 0],
    "mask in an index tuple": lambda x: x[(x > 0,)],
    "nonzero": lambda x: x[torch.nonzero(x > 0).squeeze(1)],
    "argwhere": lambda x: x[torch.argwhere(x > 0).squeeze(1)],
    "masked_select": lambda x: torch.masked_select(x, x > 0),
    "where": lambda x: x[torch.where(x > 0)],
    "unique": lambda x: torch.unique(x.clamp(min=0)),
    "unique_consecutive": lambda x: torch.unique_consecutive(x.clamp(min=0)),
    "repeat_interleave": lambda x: torch.repeat_interleave(x, (x > 0).long()),
    "bincount": lambda x: torch.bincount((x > 2.5).long() * 3).float(),
}


class Branching(torch.nn.Module):
    def __init__(self, decide):
        super().__init__()
        self.decide = decide

    def forward(self, x):
        return _adds(self.decide(x), x)


class Selecting(torch.nn.Module):
    def __init__(self, select):
        super().__init__()
        self.select = select

    def forward(self, x):
        return _adds(2, self.select(x))


def _layers():
    return ([pytest.param(Branching(decide), id=name) for name, decide in BRANCHES.items()]
            + [pytest.param(Selecting(select), id=name) for name, select in SHAPES.items()])


@pytest.mark.parametrize("layer", _layers())
def test_a_layer_following_values_is_counted_at_every_call(monkeypatch, layer):
    reference, learned = _both(monkeypatch, layer, _signed, {"x": torch.tensor(VALUES)})
    assert learned == reference
    # (the case is one: the calls of one key added different numbers of elements)
    adds = dict((name, flops) for name, _, flops in reference["layer"][-1])["add"]
    first = _figures_of_one_call(layer)
    assert adds != len(SIGNS) * first


def _figures_of_one_call(layer):
    with torch.no_grad(), tracetorch.profile(layer) as prof:
        layer(torch.tensor(VALUES))
    return dict((op.name, op.flops) for op in prof.find("").op_table())["add"]


class Scaling(torch.nn.Module):
    """Its own products follow the size of what its child hands back."""

    def __init__(self):
        super().__init__()
        self.child = Selecting(lambda x: x[x > 0])
        self.weight = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.child(x) * self.weight * 2


def test_the_layers_around_one_following_values_are_counted_at_every_call(monkeypatch):
    reference, learned = _both(monkeypatch, Scaling(), _signed, {"x": torch.tensor(VALUES)})
    assert learned == reference
    mul = dict((name, calls) for name, calls, _ in reference["layer"][-1])
    assert mul["mul"] == 2 * len(SIGNS)


class Looping(torch.nn.Module):
    """Multiplies by its weight as many times as the input's sign says: products under
    autograd, their number decided by a value."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.eye(4))

    def forward(self, x):
        for _ in range(3 if x.sum() < 0 else 1):
            x = x @ self.weight
        return x


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
def test_products_counted_by_a_value_are_counted_at_every_call(monkeypatch, grad):
    def run(learn):
        monkeypatch.setenv("TRACETORCH_LEARN_OPS", "1" if learn else "0")
        model = Caller(Looping(), _signed)
        with torch.set_grad_enabled(grad), tracetorch.profile(model) as prof:
            for _ in SIGNS:
                out = model(torch.tensor(VALUES))
                if grad:
                    out.sum().backward()
        return _figures(prof), prof.forward_gemm_flops, prof.backward_gemm_flops

    reference, learned = run(False), run(True)
    assert learned == reference
    # 3 calls of one product and 3 of three, each 2·4·4 FLOPs; backward: the weight's gradient
    # of each, and the input's of each product after a call's first (the input needs none)
    assert reference[1] == (3 * 1 + 3 * 3) * 2 * 4 * 4
    assert reference[2] == ((3 * 1 + 3 * 3) + 3 * 2) * 2 * 4 * 4 if grad else reference[2] == 0


def test_a_padded_attention_mask_is_counted_as_it_comes(monkeypatch):
    # A transformers model reads its mask's values (all ones: no mask to build): batches padded
    # and not padded, in one key, each counted as the mode counts it.
    if os.environ.get("CI") != "true":
        pytest.importorskip("transformers")
    from test_transformers_models import build

    def run(learn, masks):
        monkeypatch.setenv("TRACETORCH_LEARN_OPS", "1" if learn else "0")
        model, inputs = build("gpt2")
        with torch.no_grad(), tracetorch.profile(model) as prof:
            for mask in masks:
                model(input_ids=inputs["input_ids"], attention_mask=mask)
        return _figures(prof), prof.forward_flops

    ones = torch.ones(2, 16, dtype=torch.long)
    padded = ones.clone()
    padded[0, -3:] = 0
    masks = [ones, ones, padded, ones, padded, padded]
    reference, learned = run(False, masks), run(True, masks)
    assert learned == reference
    alone = {name: run(True, [mask])[1] for name, mask in (("ones", ones), ("padded", padded))}
    assert alone["ones"] != alone["padded"]
    assert reference[1] == 3 * alone["ones"] + 3 * alone["padded"]


def test_a_layer_reading_no_values_is_still_learned(monkeypatch):
    reference, learned = _both(monkeypatch, Branching(lambda x: 2), _signed,
                               {"x": torch.tensor(VALUES)})
    assert learned == reference
    _, calls = _run(monkeypatch, True, Caller(Branching(lambda x: 2), _signed),
                    {"x": torch.tensor(VALUES)})
    assert calls[2:] == [0] * 4


@pytest.mark.parametrize("name, own", [("gpt2", 29), ("bert", 12), ("llama-gqa", 19)])
def test_a_model_reading_its_attention_mask_keeps_the_mode_for_its_own_operations(
        monkeypatch, name, own):
    # What docs/pytorch.md quotes: a transformers model handed an attention mask reads it (all
    # ones: no mask to build), so its own call is counted by the mode at every step (``own``
    # operations a step); the layers below it, which read no value, are replayed.
    if os.environ.get("CI") != "true":
        pytest.importorskip("transformers")
    from test_transformers_models import build

    model, inputs = build(name)
    masked = {"input_ids": inputs["input_ids"],
              "attention_mask": torch.ones_like(inputs["input_ids"])}
    reference, reference_calls = _run(monkeypatch, False, model, masked, steps=4)
    learned, learned_calls = _run(monkeypatch, True, model, masked, steps=4)
    assert learned == reference
    assert learned_calls[2:] == [own] * 2 and reference_calls[2] > 2 * own


@pytest.mark.parametrize("func, args, kwargs, expected", [
    (torch.Tensor.__getitem__, (torch.ones(3), torch.tensor([True, False, True])), {}, True),
    (torch.Tensor.__getitem__, (torch.ones(3), torch.tensor([1, 0, 1], dtype=torch.uint8)), {},
     True),
    (torch.Tensor.__getitem__, (torch.ones(2, 3), (slice(None), [torch.ones(3) > 0])), {}, True),
    (torch.Tensor.__getitem__, (torch.ones(3), torch.tensor([0, 2])), {}, False),
    (torch.Tensor.__getitem__, (torch.ones(3), (slice(None), None)), {}, False),
    (torch.where, (torch.ones(3) > 0,), {}, True),
    (torch.where, (torch.ones(3) > 0, torch.ones(3), torch.zeros(3)), {}, False),
    (torch.repeat_interleave, (torch.ones(3), 2), {}, False),
    (torch.repeat_interleave, (torch.ones(3), torch.tensor([1, 2, 3])), {}, True),
    (torch.repeat_interleave, (torch.tensor([1, 2]),), {}, True),
    (torch.repeat_interleave, (torch.ones(3), torch.tensor([1, 2, 3])), {"output_size": 6},
     False),
    (torch.Tensor.repeat_interleave, (torch.ones(3),), {"repeats": torch.tensor(2)}, True),
    (torch.Tensor.item, (torch.ones(()),), {}, True),
    (torch.nonzero, (torch.ones(3),), {}, True),
    (torch.matmul, (torch.ones(2, 2), torch.ones(2, 2)), {}, False),
    (torch.Tensor.__setitem__, (torch.ones(3), torch.ones(3) > 0, 0.0), {}, False),
])
def test_which_calls_follow_values(func, args, kwargs, expected):
    assert reads_values(func, args, kwargs) is expected
