"""Backward passes through gradients taken with ``create_graph=True`` count their FLOPs.

A gradient penalty, a Hessian-vector product or MAML differentiates a gradient: the second
pass runs the nodes the first pass created (its gradient computation), which belong to no
layer. It counted 0 FLOPs there (a penalty on two Linears: 9,216 of 19,456 missing), and less
than ran where it entered a layer's graph through an activation (an RNN's steps). The reference
is torch's own formulas on every operation dispatched (what ``FlopCounterMode`` counts; its
module tracker cannot follow ``autograd.grad`` into an input), corrected as the layer sweep
corrects it.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

from torch.utils import _python_dispatch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import test_torch_layer_sweep as sweep  # noqa: E402
import tracetorch  # noqa: E402
from tracetorch.adapters.torch import higher_order  # noqa: E402

nn = torch.nn
pytestmark = sweep.pytestmark


class DispatchedReference(_python_dispatch.TorchDispatchMode):
    """Every dispatched operation's FLOPs by FlopCounterMode's formulas (those of the layer
    sweep: CPU's flash attention added)."""

    def __init__(self) -> None:
        super().__init__()
        self.formulas = FlopCounterMode(display=False,
                                        custom_mapping=sweep._CPU_FLASH).flop_registry
        self.flops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self.formulas.get(func._overloadpacket)
        if formula is not None:
            self.flops += int(formula(*args, **kwargs, out_val=out))
        return out


def _penalty_step(layer: nn.Module, inputs: tuple[Any, ...]) -> None:
    """A gradient penalty: the gradients of the output into the inputs and parameters, taken
    with ``create_graph=True``, then the backward pass of their squared sum."""
    torch.manual_seed(1)
    loss = sweep._scalar(layer(*inputs))
    leaves = [value for value in inputs if isinstance(value, torch.Tensor)
              and value.requires_grad] + [p for p in layer.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, leaves, create_graph=True, allow_unused=True)
    terms = [grad.pow(2).sum() for grad in grads if grad is not None and grad.requires_grad]
    if terms:
        sum(terms).backward()


#: Layers whose gradient torch cannot differentiate (the step raises without tracetorch).
NO_SECOND_DERIVATIVE = {
    "Hardsigmoid": "hardsigmoid_backward", "CrossMapLRN2d": "an out= argument",
    "EmbeddingBag-weighted": "_embedding_bag_per_sample_weights_backward",
    "CTCLoss": "_ctc_loss_backward", "MultiLabelMarginLoss": "multilabel_margin_loss_backward",
    "MultiMarginLoss": "multi_margin_loss_backward",
    **{name: "CPU's flash attention backward" for name in (
        "MultiheadAttention-fused", "TransformerEncoderLayer", "TransformerDecoderLayer",
        "TransformerEncoder", "TransformerDecoder", "Transformer",
        "LoRA-TransformerEncoderLayer")},
}


def _expected(case: sweep.Case, base: tuple[Any, ...]) -> int:
    # The dispatched FLOPs of the step, corrected where the layer sweep corrects a plain step's
    # (Bilinear's products, a grouped convolution's weight gradient): the penalty's first pass
    # computes the gradients a plain step's backward computes.
    plain_forward, plain_backward = sweep._fcm(sweep._build(case), sweep._fresh(base, case.grad))
    forward, backward = sweep._reference(sweep._build(case), sweep._fresh(base, case.grad))
    layer = sweep._build(case)  # (built outside: a parametrization runs once when registered)
    with DispatchedReference() as reference:
        _penalty_step(layer, sweep._fresh(base, case.grad))
    return reference.flops + (forward + backward) - (plain_forward + plain_backward)


@pytest.mark.parametrize("name", [name for name in sweep.CASES
                                  if name not in NO_SECOND_DERIVATIVE])
def test_every_layers_gradient_penalty_counts_what_torch_dispatches(name):
    case = sweep.CASES[name]
    base = sweep._inputs(case)
    # CPU's fused oneDNN RNN kernels have no formula; ATen's own products run here.
    with torch.backends.mkldnn.flags(enabled=False):
        expected = _expected(case, base)
        layer = sweep._build(case)
        with tracetorch.profile(layer) as prof:
            _penalty_step(layer, sweep._fresh(base, case.grad))
    assert prof.forward_gemm_flops + prof.backward_gemm_flops == expected
    assert prof.completeness == "complete"


@pytest.mark.parametrize("name", sorted(NO_SECOND_DERIVATIVE))
def test_the_layers_left_out_cannot_be_differentiated_twice_by_torch(name):
    case = sweep.CASES[name]
    with pytest.raises(RuntimeError):
        _penalty_step(sweep._build(case), sweep._fresh(sweep._inputs(case), case.grad))


class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16, bias=False), nn.Linear(16, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_the_second_pass_charges_the_gradient_graph_to_itself_and_layers_keep_theirs():
    model, x = TwoLinears(), torch.randn(8, 16, requires_grad=True)
    with tracetorch.profile(model) as prof:
        out = model(x).sum()
        (grad,) = torch.autograd.grad(out, x, create_graph=True)
        grad.pow(2).sum().backward()
    a, b = 2 * 8 * 16 * 16, 2 * 8 * 16 * 4
    # The first pass: each layer's input gradient (its weights are no input of the pass).
    assert prof.find("autograd.grad").flops == a + b
    assert (prof.find("a").backward_flops, prof.find("b").backward_flops) == (a, b)
    # The second differentiates grad = (1·Wb)·Wa, two products of the first pass: the
    # gradients of the outer one's operands (1·Wb and Wa, 8x16·16x16 each) and of Wb in the
    # inner one (its ones need none).
    second = prof.find("backward")
    assert second.backward_flops == second.flops == 2 * (2 * 8 * 16 * 16) + 2 * 8 * 4 * 16
    assert prof.backward_gemm_flops == a + b + second.flops


def _hessian_vector_product(model: nn.Module, x: torch.Tensor) -> None:
    params = list(model.parameters())
    loss = model(x).pow(2).mean()
    grads = torch.autograd.grad(loss, params, create_graph=True)
    torch.autograd.grad(sum((grad * torch.ones_like(grad)).sum() for grad in grads), params)


def _backward_twice(model: nn.Module, x: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    with warnings.catch_warnings():  # (torch's note on the reference cycle through .grad)
        warnings.simplefilter("ignore", UserWarning)
        model(x).pow(2).mean().backward(create_graph=True)
    sum(p.grad.pow(2).sum() for p in model.parameters()).backward()
    model.zero_grad(set_to_none=True)


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Softplus(), nn.Conv2d(8, 4, 3),
                         nn.Flatten(), nn.Linear(4 * 6 * 6, 1))


@pytest.mark.parametrize("program", [_hessian_vector_product, _backward_twice])
@pytest.mark.parametrize("make, shape", [
    (lambda: nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)), (8, 16)),
    (_cnn, (2, 3, 8, 8))])
def test_second_derivatives_of_the_parameters_count_what_torch_dispatches(program, make, shape):
    torch.manual_seed(0)
    model, x = make(), torch.randn(*shape)
    with DispatchedReference() as reference:
        program(model, x)
    with tracetorch.profile(model) as prof:
        program(model, x)
    assert prof.forward_gemm_flops + prof.backward_gemm_flops == reference.flops


def test_a_training_loop_with_a_penalty_counts_every_step_alike():
    torch.manual_seed(0)
    critic = nn.Sequential(nn.Linear(8, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(critic.parameters())
    real = torch.randn(16, 8)

    def step() -> None:
        optimizer.zero_grad()
        x = real.clone().requires_grad_()
        out = critic(x)
        (grad,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        (out.mean() + 10 * (grad.norm(dim=1) - 1).pow(2).mean()).backward()
        optimizer.step()

    with DispatchedReference() as reference:
        step()
    with tracetorch.profile(critic) as prof:
        for _ in range(3):
            step()
    assert prof.forward_gemm_flops + prof.backward_gemm_flops == 3 * reference.flops
    assert prof.find("backward").calls == prof.find("autograd.grad").calls == 3


def test_only_passes_after_one_building_a_graph_run_under_a_dispatch_mode():
    modes: list[int] = []
    layer, x = nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)

    def backward(**kwargs: Any) -> None:
        out = layer(x)
        stack = _python_dispatch._get_current_dispatch_mode_stack
        out.register_hook(lambda grad: modes.append(len(stack())))
        torch.autograd.grad(out.sum(), x, **kwargs)

    with tracetorch.profile(layer):
        backward()
        backward()
        backward(create_graph=True)  # (notes the nodes it creates, under the mode)
        backward()                   # may reach them: counts what they run
    assert modes == [0, 0, 1, 1]


def test_under_ops_false_a_pass_building_a_graph_is_warned_of():
    layer, x = nn.Linear(4, 4), torch.randn(2, 4, requires_grad=True)
    with tracetorch.profile(layer, ops=False):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            layer(x).sum().backward()  # an ordinary pass: no warning
        with pytest.warns(RuntimeWarning, match="create_graph=True ran under profile"):
            torch.autograd.grad(layer(x).sum(), x, create_graph=True)


# ----------------------------------------------------------------------------- the parts
@pytest.mark.parametrize("func, args, kwargs, builds", [
    (torch.autograd.grad, ("out", "x"), {"create_graph": True}, True),
    (torch.autograd.grad, ("out", "x", None, None, True), {}, True),
    (torch.autograd.grad, ("out", "x", None, True), {}, False),  # retain_graph only
    (torch.Tensor.backward, ("loss", None, None, True), {}, True),
    (torch.Tensor.backward, ("loss",), {"create_graph": False}, False),
    (torch.autograd.backward, ("loss", None, True), {}, False),
    (torch.autograd.backward, ("loss", None, None, True), {}, True),
])
def test_create_graph_is_read_from_each_entry_points_arguments(func, args, kwargs, builds):
    assert higher_order.builds_graph(func, args, kwargs) is builds


def test_gradient_graphs_hold_their_numbers_per_thread():
    graphs = higher_order.GradientGraphs()
    graphs.add(1, 10, 20)
    graphs.add(1, 30, 31)
    graphs.add(1, 40, 40)  # (an empty interval: no node)
    graphs.add(2, 0, 5)
    assert [n for n in range(45) if graphs.holds(1, n)] == [*range(10, 20), 30]
    assert [n for n in range(45) if graphs.holds(2, n)] == [0, 1, 2, 3, 4]
    assert not graphs.holds(3, 10)


def test_a_grouped_convolutions_weight_gradient_costs_its_forward():
    x, weight = torch.randn(2, 8, 10, 10), torch.randn(8, 2, 3, 3)
    out = nn.functional.conv2d(x, weight, groups=4)
    forward = 2 * out.numel() * 2 * 3 * 3  # each output: 2·3·3 inputs of its group
    backward = torch.ops.aten.convolution_backward.default
    for mask, parts in (([True, True, False], 2), ([False, True, False], 1),
                        ([True, False, False], 1)):
        args = (torch.ones_like(out), x, weight, [8], [1, 1], [0, 0], [1, 1], False, [0, 0], 4,
                mask)
        assert higher_order.aten_flops(backward, args, {}, backward(*args)) == parts * forward
    assert higher_order.aten_flops(torch.ops.aten.convolution.default,
                      (x, weight, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 4), {},
                      out) == forward
