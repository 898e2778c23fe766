"""Learned operation counts under autograd for calls that run products
(tracetorch.adapters.torch.product_paths): after two agreeing calls the layer runs without the
function mode, each product's autograd node is found again from the call's outputs and marked as
the mode would have, and every figure (backward FLOPs, op tables, boundaries) stays what the
mode counts on every call (``TRACETORCH_LEARN_OPS=0``)."""
from __future__ import annotations

import os
import warnings

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from test_learned_ops import _run  # noqa: E402
from tracetorch.adapters.torch.backward import MARKS  # noqa: E402
from tracetorch.adapters.torch.product_paths import WATCHED  # noqa: E402

torch.set_num_threads(1)
sdpa = torch.nn.functional.scaled_dot_product_attention


class SelfAttention(torch.nn.Module):
    """Heads split by views and transposes, fused attention, then a product of its own: the
    shape of a transformers self-attention, with ``mm`` besides."""

    def __init__(self, width=8, heads=2, dropout=0.0):
        super().__init__()
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.mix = torch.nn.Parameter(torch.randn(width, width))
        self.heads, self.dropout = heads, dropout

    def forward(self, x, mask=None):
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        out = sdpa(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        out = out.transpose(1, 2).reshape(batch * length, width)
        return out.mm(self.mix).view(batch, length, width)


class Model(torch.nn.Module):
    def __init__(self, **options):
        super().__init__()
        torch.manual_seed(0)
        self.attention = SelfAttention(**options)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x, mask=None):
        return self.norm(self.attention(x, mask) + x)


def _unseen():
    # A change made between two calls, as a training loop would: not an operation of the layer
    # (the mode would count it in the call it falls in, which learned counts cannot).
    return torch._C.DisableTorchFunction()


def _inputs():
    torch.manual_seed(1)
    return {"x": torch.randn(2, 4, 8, requires_grad=True)}


def test_a_layers_products_are_learned_and_charged_as_the_mode_charges(monkeypatch):
    reference, reference_calls = _run(monkeypatch, False, Model(), _inputs(), grad=True)
    learned, learned_calls = _run(monkeypatch, True, Model(), _inputs(), grad=True)
    assert learned == reference
    attention = reference["attention"]
    # sdpa's gradient (q·kᵀ recomputed, dP, dV, dQ, dK) and mm's (both operands) on 6 calls
    scores = 2 * 2 * 2 * 4 * 4 * 4  # 2·batch·heads·L·L·head width
    assert attention[5] == attention[6] == 6 * (5 * scores + 2 * (2 * 8 * 8 * 8))
    assert learned_calls[:2] == reference_calls[:2]
    assert learned_calls[2:] == [2] * 4  # the loop's sum and backward, at the root
    assert not WATCHED  # nothing watched once the profile closed


def test_a_math_kernels_products_are_learned_too(monkeypatch):
    # Dropout in training: torch runs the attention as plain products, whose node is the last
    # of several it made; the operands are found through them.
    reference, _ = _run(monkeypatch, False, Model(dropout=0.5), _inputs(), grad=True)
    torch.manual_seed(2)
    learned, learned_calls = _run(monkeypatch, True, Model(dropout=0.5), _inputs(), grad=True)
    assert learned == reference
    assert learned_calls[2:] == [2] * 4


class Freezing(Model):
    """Calls 1-3 with everything trained; from call 4 on, the parameters named in ``frozen``
    need no gradient, nor (``detach``) the input."""

    def __init__(self, frozen, detach):
        super().__init__()
        self.frozen, self.detach, self.call = frozen, detach, 0

    def forward(self, x, mask=None):
        self.call += 1
        if self.call == 4:
            with _unseen():
                for name in self.frozen:
                    self.get_parameter(name).requires_grad_(False)
        if self.detach and self.call >= 4:
            with _unseen():
                x = x.detach()
        return super().forward(x, mask)


@pytest.mark.parametrize("frozen, detach", [
    (["attention.mix"], False),  # mm's part for its weight goes, the attention's stay
    (["attention.qkv.weight", "attention.qkv.bias"], True),  # q, k, v need none: nor sdpa's
])
def test_an_operand_that_stops_needing_a_gradient_is_charged_as_the_mode_charges(
        monkeypatch, frozen, detach):
    # Learned while every operand needed a gradient; after, a part whose operands need none is
    # not charged, exactly as the mode resolves it at each call.
    reference, _ = _run(monkeypatch, False, Freezing(frozen, detach), _inputs(), grad=True)
    learned, learned_calls = _run(monkeypatch, True, Freezing(frozen, detach), _inputs(),
                                  grad=True)
    assert learned == reference
    assert learned_calls[2:] == [2] * 4
    every_part = 5 * 2 * 2 * 2 * 4 * 4 * 4 + 2 * 2 * 8 * 8 * 8
    assert 3 * every_part < reference["attention"][5] < 6 * every_part


class Aside(torch.nn.Module):
    """A product kept aside (not on the output's graph) besides one returned."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        self.kept = x.mm(self.weight)  # a later step's loss could reach it
        return x.mm(self.weight.t())


def test_a_product_off_the_outputs_graph_is_counted_by_the_mode(monkeypatch):
    x = {"x": torch.randn(4, 8, requires_grad=True)}
    reference, reference_calls = _run(monkeypatch, False, Aside(), x, grad=True)
    learned, learned_calls = _run(monkeypatch, True, Aside(), x, grad=True)
    assert learned == reference
    assert learned_calls == reference_calls


class Masked(Model):
    """An attention mask that comes to need a gradient at call ``at`` (a learned bias): the
    same key, but torch runs the attention as plain products from then on."""

    def __init__(self, at=4):
        super().__init__()
        self.mask = torch.zeros(4, 4)
        self.at, self.call = at, 0

    def forward(self, x, mask=None):
        self.call += 1
        if self.call == self.at:
            with _unseen():
                self.mask.requires_grad_(True)
        return super().forward(x, self.mask)


def test_a_product_run_by_another_kernel_stops_the_replay_with_a_warning(monkeypatch):
    reference, reference_calls = _run(monkeypatch, False, Masked(), _inputs(), grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        learned, learned_calls = _run(monkeypatch, True, Masked(), _inputs(), grad=True)
    assert [str(w.message) for w in caught if "another autograd graph" in str(w.message)]
    # Call 3 replayed, call 4 replayed and found another graph, calls 5 and 6 the mode's (the
    # model's own add, learned apart, stays learned).
    assert learned_calls[2:4] == [2, 2] and learned_calls[4:] == [reference_calls[4] - 1] * 2
    def forward(figures):  # (the backward passes' node holds their FLOPs as its own)
        return {path: row[:5] for path, row in figures.items() if path != "backward"}

    assert forward(learned) == forward(reference)
    # What is missing is the attention's gradient in call 4 alone.
    missing = reference["attention"][5] - learned["attention"][5]
    assert 0 < missing < reference["attention"][5] / 6


class Passing(torch.nn.Module):
    """A layer without a rule that hands its input back: it marks the node it gets."""

    def forward(self, x):
        return x


class ReturnsThroughAChild(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8))
        self.passing = Passing()

    def forward(self, x):
        return self.passing(x.mm(self.weight))


def _chain(tensor):
    # The layers that marked a tensor's node, outermost first.
    mark, paths = tensor.grad_fn.metadata.get(MARKS), []
    while mark is not None:
        frame, parts, mark = mark
        paths.append((frame.node.path, bool(parts)))
    return paths


@pytest.mark.parametrize("learn", [False, True])
def test_a_placed_products_mark_sits_where_the_modes_would(monkeypatch, learn):
    # The mode marks a product while it runs, before a layer returning it marks it on exit;
    # placed after a replayed call, the product's mark goes to the innermost end all the same.
    monkeypatch.setenv("TRACETORCH_LEARN_OPS", "1" if learn else "0")
    model, x = ReturnsThroughAChild(), torch.randn(4, 8, requires_grad=True)
    with tracetorch.profile(model):
        for _ in range(4):
            out = model(x)
    assert _chain(out) == [("", False), ("passing", False), ("", True)]


def test_sampled_steps_learn_and_place_as_the_mode(monkeypatch):
    # Between the steps backward_every samples nothing is marked: those calls teach nothing,
    # and a replay there places nothing.
    reference, _ = _run(monkeypatch, False, Model(), _inputs(), steps=9, grad=True,
                        backward_every=2)
    learned, learned_calls = _run(monkeypatch, True, Model(), _inputs(), steps=9, grad=True,
                                  backward_every=2)
    assert learned == reference
    assert learned_calls[-1] == 2


F = torch.nn.functional


def _product_layers():
    """name: (forward(layer, x), the layer's parameters' shapes, the input's shape): a layer
    around each product the function mode counts, with an operation after it."""
    bmm_x = (2, 4, 8)
    return {
        "linear": (lambda m, x: F.linear(x, m.w, m.b), {"w": (6, 8), "b": (6,)}, (4, 8)),
        "matmul": (lambda m, x: torch.matmul(x, m.w), {"w": (8, 6)}, (4, 8)),
        "matmul-batched": (lambda m, x: x @ m.w, {"w": (8, 6)}, bmm_x),
        "rmatmul": (lambda m, x: m.w.__rmatmul__(x), {"w": (8, 6)}, (4, 8)),
        "linalg.matmul": (lambda m, x: torch.linalg.matmul(x, m.w), {"w": (8, 6)}, (4, 8)),
        "mm": (lambda m, x: x.mm(m.w), {"w": (8, 6)}, (4, 8)),
        "addmm": (lambda m, x: torch.addmm(m.b, x, m.w), {"w": (8, 6), "b": (6,)}, (4, 8)),
        "addmm_": (lambda m, x: (m.b * 1).expand(4, 6).clone().addmm_(x, m.w),
                   {"w": (8, 6), "b": (6,)}, (4, 8)),
        "bmm": (lambda m, x: torch.bmm(x, m.w), {"w": (2, 8, 6)}, bmm_x),
        "baddbmm": (lambda m, x: torch.baddbmm(m.c, x, m.w), {"w": (2, 8, 6), "c": (2, 4, 6)},
                    bmm_x),
        "baddbmm_": (lambda m, x: (m.c * 1).baddbmm_(x, m.w), {"w": (2, 8, 6), "c": (2, 4, 6)},
                     bmm_x),
        "bilinear": (lambda m, x: F.bilinear(x, x * 2, m.w, m.b), {"w": (6, 8, 8), "b": (6,)},
                     (4, 8)),
        "einsum": (lambda m, x: torch.einsum("bij,jk->bik", x, m.w), {"w": (8, 6)}, bmm_x),
        "conv1d": (lambda m, x: F.conv1d(x, m.w, m.b), {"w": (4, 3, 3), "b": (4,)}, (2, 3, 10)),
        "conv2d": (lambda m, x: F.conv2d(x, m.w, stride=2), {"w": (4, 3, 3, 3)}, (2, 3, 8, 8)),
        "conv3d": (lambda m, x: F.conv3d(x, m.w), {"w": (3, 2, 2, 2, 2)}, (1, 2, 4, 4, 4)),
        "conv_transpose1d": (lambda m, x: F.conv_transpose1d(x, m.w), {"w": (3, 4, 3)},
                             (2, 3, 10)),
        "conv_transpose2d": (lambda m, x: F.conv_transpose2d(x, m.w, groups=1),
                             {"w": (3, 4, 3, 3)}, (2, 3, 6, 6)),
        "conv_transpose3d": (lambda m, x: F.conv_transpose3d(x, m.w), {"w": (2, 3, 2, 2, 2)},
                             (1, 2, 3, 3, 3)),
        "sdpa": (lambda m, x: sdpa(x @ m.w, x, x * 2, is_causal=True), {"w": (8, 8)},
                 (2, 2, 4, 8)),
    }


class Product(torch.nn.Module):
    """A layer around one product; from call ``freeze_at`` on, its parameters need no gradient
    (learned while they did)."""

    def __init__(self, forward, shapes, freeze_at=None):
        super().__init__()
        torch.manual_seed(3)
        for name, shape in shapes.items():
            self.register_parameter(name, torch.nn.Parameter(torch.randn(*shape) * 0.1))
        self.product, self.freeze_at, self.call = forward, freeze_at, 0

    def forward(self, x):
        self.call += 1
        if self.call == self.freeze_at:
            with _unseen():
                for parameter in self.parameters():
                    parameter.requires_grad_(False)
        return torch.tanh(self.product(self, x)) * 2


@pytest.mark.parametrize("name", list(_product_layers()))
def test_every_counted_product_is_learned_or_counted_with_the_modes_figures(monkeypatch, name):
    # Whatever the product (a decomposed one, an in-place one, two operands from one input),
    # the learned figures are the mode's; where the places are found the mode sees only the
    # loop's sum and backward from the third step on.
    forward, shapes, shape = _product_layers()[name]
    torch.manual_seed(4)
    x = {"x": torch.randn(*shape, requires_grad=True)}
    reference, reference_calls = _run(monkeypatch, False, Product(forward, shapes), x, grad=True)
    learned, learned_calls = _run(monkeypatch, True, Product(forward, shapes), x, grad=True)
    assert learned == reference
    assert reference[""][5] > 0  # backward FLOPs of the product
    assert learned_calls[2:] == [2] * 4, learned_calls


@pytest.mark.parametrize("name", list(_product_layers()))
def test_every_counted_product_whose_weights_freeze_after_learning_keeps_the_modes_figures(
        monkeypatch, name):
    # The weights' parts stop counting from call 4, the input's stay: resolved per call from
    # the graph, as the mode resolves them.
    forward, shapes, shape = _product_layers()[name]
    torch.manual_seed(4)
    x = {"x": torch.randn(*shape, requires_grad=True)}
    reference, _ = _run(monkeypatch, False, Product(forward, shapes, 4), x, grad=True)
    learned, _ = _run(monkeypatch, True, Product(forward, shapes, 4), x, grad=True)
    assert learned == reference
