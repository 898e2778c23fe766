"""A layer's output written in place after the layer returns keeps the layer's backward FLOPs.

A Linear on a 3-D input returns a view (``addmm``, then a view back to three dimensions); a
write in place on a view (``h += x``, ``h[mask] = e``, ``h.mul_(2)``) has autograd rebuild the
view's node over its base's, so a mark on the view's node never runs: WavLM's SpecAugment
(``hidden_states[mask] = masked_spec_embed`` after its feature projection, whose dropout of 0
hands back the Linear's output) lost the projection's backward. The marks go on the node that
stays (:func:`tracetorch.adapters.torch.marks._lasting_node`); references: the same model
without the write, and FlopCounterMode.
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402

nn = torch.nn

WRITES = {
    "none": lambda h, x: h,
    "iadd": lambda h, x: h.add_(x),
    "mul_": lambda h, x: h.mul_(2),
    "setitem": lambda h, x: h.__setitem__(0, 0.0),
    "masked_fill_": lambda h, x: h.masked_fill_(x > 0, 0.0),
}


class Written(nn.Module):
    """A Linear, handed back through ``between`` (a layer that may return its input), then
    written in place by its caller."""

    def __init__(self, write: str, between: nn.Module | None) -> None:
        super().__init__()
        self.fc, self.between, self.write = nn.Linear(8, 8), between, write

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.between is not None:
            h = self.between(h)
        WRITES[self.write](h, x)
        return h * 1


@pytest.mark.parametrize("between", ["none", "Identity", "Dropout(0)", "Dropout(0.5)"])
@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 8)])
@pytest.mark.parametrize("write", WRITES)
def test_a_linear_output_written_in_place_keeps_its_backward(write, shape, between):
    layer = {"none": None, "Identity": nn.Identity(), "Dropout(0)": nn.Dropout(0.0),
             "Dropout(0.5)": nn.Dropout(0.5)}[between]
    model = Written(write, layer).train()
    x = torch.randn(*shape)
    with tracetorch.profile(model) as prof:
        model(x).sum().backward()
    rows = x.numel() // 8
    assert prof.find("fc").backward_gemm_flops == 2 * rows * 8 * 8  # the weight's gradient
    assert prof.backward_gemm_flops == 2 * rows * 8 * 8


def test_a_view_of_its_input_is_not_charged_to_the_layer_before():
    # A layer handing back a view of what it was given marks its own (view) node, not the node
    # of the layer before: that node carries the first Linear's mark alone.
    from tracetorch.adapters.torch.backward import MARKS

    class Reshape(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(-1, 8)

    made: list[torch.Tensor] = []

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.reshape, self.last = nn.Linear(8, 8), Reshape(), nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            made.append(self.first(x))
            return self.last(self.reshape(made[0]))

    model = Chain()
    with tracetorch.profile(model) as prof:
        out = model(torch.randn(2, 3, 8))
        marked, chain = [], made[0]._base.grad_fn.metadata.get(MARKS)
        while chain is not None:
            frame, _, chain = chain
            marked.append(frame.node.path)
        out.add_(1)
        out.sum().backward()
    assert marked == ["first"]
    assert prof.find("first").backward_gemm_flops == 2 * 6 * 8 * 8
    assert prof.find("reshape").backward_gemm_flops == 0
    assert prof.find("last").backward_gemm_flops == 2 * 6 * 8 * 4 * 2


def test_wavlm_spec_augment_keeps_the_feature_projections_backward():
    transformers = pytest.importorskip("transformers") if os.environ.get("CI") != "true" else (
        __import__("transformers"))
    from torch.utils.flop_counter import FlopCounterMode

    from test_transformers_models import corrected_formulas

    config = transformers.WavLMConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, mask_time_prob=0.05)

    def run(model: nn.Module, counter: object) -> None:
        torch.manual_seed(1)  # the same SpecAugment masks in both runs
        with counter:  # type: ignore[attr-defined]
            model(torch.randn(2, 400)).last_hidden_state.sum().backward()

    torch.manual_seed(0)
    model = transformers.WavLMModel(config).train()
    reference = FlopCounterMode(display=False, custom_mapping=corrected_formulas())
    run(model, reference)
    model.zero_grad()
    prof = tracetorch.profile(model)
    run(model, prof)
    assert prof.forward_gemm_flops + prof.backward_gemm_flops == reference.get_total_flops()
    assert prof.find("feature_projection.projection").backward_gemm_flops > 0
    assert prof.completeness == "complete"


def test_an_attention_output_written_in_place_keeps_its_backward():
    # MultiheadAttention returns (output, weights): each output tensor's lasting node is marked.
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x: torch.Tensor, in_place: bool) -> torch.Tensor:
            out, _ = self.attention(x, x, x)
            if in_place:
                out += x
            else:
                out = out + x
            return out * 1

    figures = []
    for in_place in (False, True):
        torch.manual_seed(0)
        model = Residual()
        x = torch.randn(2, 3, 8, requires_grad=True)
        with tracetorch.profile(model) as prof:
            model(x, in_place).sum().backward()
        figures.append(prof.find("attention").backward_gemm_flops)
    assert figures[0] == figures[1] > 0
