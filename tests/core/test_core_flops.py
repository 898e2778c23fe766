"""One formula, one home: core ops, core layer rules and the TinyTorch facade's static estimates
all count with tracetorch.flops.core_ops, so the three agree exactly."""
from __future__ import annotations

import numpy as np
import pytest

import tracetorch
from tracetorch.compat.tinytorch.analytic import conv2d_layer_flops, linear_layer_flops
from tracetorch.core import AvgPool2d, Conv2d, LayerNorm, Linear, MaxPool2d, Tensor, autograd
from tracetorch.core import functional as F
from tracetorch.flops import core_ops


class _Costs:
    """Op observer keeping (name, forward FLOPs) and (name, backward FLOPs)."""

    def __init__(self) -> None:
        self.forward: list[tuple[str, int]] = []
        self.backward: list[tuple[str, int]] = []

    def forward_op(self, name: str, flops: int, gemm: bool) -> None:
        self.forward.append((name, flops))

    def backward_op(self, tag: object, name: str, flops: int, gemm: bool,
                    elapsed_ns: int) -> None:
        self.backward.append((name, flops))


@pytest.fixture
def costs():
    observer = _Costs()
    previous = autograd.set_op_observer(observer)
    yield observer
    autograd.set_op_observer(previous)


def _grad(shape: tuple[int, ...]) -> Tensor:
    return Tensor(np.random.default_rng(0).standard_normal(shape), requires_grad=True)


def _rule_flops(layer: object, x: Tensor) -> int:
    with tracetorch.profile(layer) as prof:
        layer(x)  # type: ignore[operator]
    assert prof.find("").flops_source == "rule"
    return prof.find("").flops


@pytest.mark.parametrize("shape", [(1, 1024), (7, 5, 4)])
def test_linear_facade_rule_and_op_agree(costs, shape):
    layer = Linear(shape[-1], 3, bias=False)
    x = Tensor(np.ones(shape))
    rows = int(np.prod(shape[:-1]))
    expected = core_ops.linear_flops(rows, shape[-1], 3)
    assert linear_layer_flops(layer, shape) == expected
    layer(x)
    assert costs.forward == [("matmul", expected)]
    assert _rule_flops(layer, x) == expected


@pytest.mark.parametrize("stride, padding", [(1, 0), (1, 1), (2, 1)])
def test_conv2d_facade_rule_and_op_agree(costs, stride, padding):
    layer = Conv2d(3, 4, 3, stride=stride, padding=padding)
    x = Tensor(np.ones((2, 3, 9, 8)))
    out = layer(x)
    expected = core_ops.conv2d_flops(out.data.size, 3, 3, 3)
    assert costs.forward == [("conv2d", expected)]
    assert conv2d_layer_flops(layer, (2, 3, 9, 8)) == expected
    assert _rule_flops(layer, x) == expected


@pytest.mark.parametrize("layer", [MaxPool2d(2), AvgPool2d(3, stride=1, padding=1)],
                         ids=lambda v: type(v).__name__)
def test_pool_rule_and_op_agree(costs, layer):
    x = Tensor(np.ones((2, 3, 8, 8)))
    out = layer(x)
    kh, kw = layer.kernel_size
    expected = core_ops.pool2d_flops(kh * kw, out.data.size)
    assert [flops for _, flops in costs.forward] == [expected]
    assert _rule_flops(layer, x) == expected


def test_norm_rule_and_op_agree(costs):
    layer = LayerNorm(6)
    x = Tensor(np.ones((4, 6)))
    layer(x)
    assert costs.forward == [("layer_norm", core_ops.norm_flops(24))]
    assert _rule_flops(layer, x) == core_ops.norm_flops(24)


@pytest.mark.parametrize("op, cost", [
    (F.relu, core_ops.RELU), (F.sigmoid, core_ops.SIGMOID), (F.tanh, core_ops.TANH),
    (F.gelu, core_ops.GELU), (F.softmax, core_ops.SOFTMAX), (F.log_softmax, core_ops.LOG_SOFTMAX),
    (F.exp, core_ops.EXP), (F.sqrt, core_ops.SQRT), (F.neg, core_ops.NEG),
], ids=lambda v: getattr(v, "__name__", ""))
def test_elementwise_ops_report_their_costs(costs, op, cost):
    x = Tensor(np.full((3, 4), 0.5), requires_grad=True)
    op(x).backward(np.ones((3, 4)))
    assert costs.forward == [(op.__name__, cost.forward * 12)]
    assert costs.backward == [(op.__name__, cost.backward * 12)]


def test_broadcast_binary_backward_counts_the_reduction(costs):
    a, b = _grad((4, 3)), _grad((3,))
    F.mul(a, b).backward(np.ones((4, 3)))
    expected = core_ops.binary_backward_flops(core_ops.MUL.backward, 12, True, (4, 3), True, (3,))
    assert expected == 2 * 12 + 2 * 12 + (12 - 3)
    assert costs.backward == [("mul", expected)]


def test_batched_matmul_backward_counts_broadcast_adds(costs):
    a, w = _grad((2, 5, 4)), _grad((1, 4, 3))  # w is broadcast over the batch of 2
    F.matmul(a, w).backward(np.ones((2, 5, 3)))
    forward = core_ops.gemm_flops(2 * 5 * 3, 4)
    assert costs.forward == [("matmul", forward)]
    adds = core_ops.broadcast_adds(2 * 4 * 3, (1, 4, 3))
    assert costs.backward == [("matmul", core_ops.gemm_backward_flops(forward, 2, adds))]


def test_cross_entropy_costs(costs):
    logits = _grad((4, 10))
    F.cross_entropy(logits, np.arange(4)).backward()
    assert costs.forward == [("cross_entropy", core_ops.cross_entropy_flops(4, 10))]
    assert costs.backward == [("cross_entropy", core_ops.cross_entropy_backward_flops(4, 10))]
