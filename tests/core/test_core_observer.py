"""The op-observer contract the profiler depends on: names, exact FLOPs, tags, timing."""
import numpy as np
import pytest

from tracetorch.core import Conv2d, Linear, MaxPool2d, Tensor, autograd, no_grad
from tracetorch.core import functional as F


class Recorder:
    def __init__(self):
        self.forward = []
        self.backward = []

    def forward_op(self, name, flops, gemm):
        tag = ("tag", len(self.forward))
        self.forward.append((name, flops, gemm, tag))
        return tag

    def backward_op(self, tag, name, flops, gemm, elapsed_ns):
        assert isinstance(elapsed_ns, int) and elapsed_ns >= 0
        self.backward.append((tag, name, flops, gemm))


@pytest.fixture
def rec():
    recorder = Recorder()
    previous = autograd.set_op_observer(recorder)
    yield recorder
    assert autograd.set_op_observer(previous) is recorder


def test_set_and_get_observer():
    assert autograd.get_op_observer() is None
    r = Recorder()
    assert autograd.set_op_observer(r) is None
    assert autograd.get_op_observer() is r
    assert autograd.set_op_observer(None) is r
    assert autograd.get_op_observer() is None


def test_no_observer_means_no_calls():
    r = Recorder()
    autograd.set_op_observer(r)
    autograd.set_op_observer(None)
    w = Tensor(np.ones((3, 2)), requires_grad=True)
    (Tensor(np.ones((4, 3))) @ w).sum().backward()
    assert r.forward == [] and r.backward == []


def test_linear_forward_and_backward_flops_exact(rec):
    rows, fin, fout = 5, 4, 3
    lin = Linear(fin, fout)
    y = lin(Tensor(np.ones((rows, fin))))  # the input does not require grad
    assert [f[:3] for f in rec.forward] == [
        ("matmul", 2 * rows * fin * fout, True),
        ("add", rows * fout, False),
    ]
    y.backward(np.ones((rows, fout)))
    mm_tag, add_tag = rec.forward[0][3], rec.forward[1][3]
    assert rec.backward == [
        # add: 1 per element for each of its two grad inputs + (rows-1)*out bias reduction adds
        (add_tag, "add", 2 * rows * fout + (rows - 1) * fout, False),
        # matmul: only the weight needs a gradient
        (mm_tag, "matmul", 2 * rows * fin * fout, True),
    ]


def test_linear_backward_flops_with_input_grad(rec):
    lin = Linear(4, 3, bias=False)
    lin(Tensor(np.ones((2, 6, 4)), requires_grad=True)).backward(np.ones((2, 6, 3)))
    assert rec.backward[0][1:] == ("matmul", 2 * 2 * 2 * 6 * 4 * 3, True)


@pytest.mark.parametrize("x_grad", [False, True])
def test_conv2d_flops_exact(rec, x_grad):
    n, cin, cout, h, w, k = 2, 3, 4, 8, 7, 3
    conv = Conv2d(cin, cout, k, stride=2, padding=1)
    out = conv(Tensor(np.ones((n, cin, h, w)), requires_grad=x_grad))
    oh, ow = (h + 2 - k) // 2 + 1, (w + 2 - k) // 2 + 1
    assert out.shape == (n, cout, oh, ow)
    fwd = 2 * k * k * cin * cout * oh * ow * n
    assert [f[:3] for f in rec.forward] == [("conv2d", fwd, True)]
    out.backward(np.ones(out.shape))
    assert rec.backward == [(rec.forward[0][3], "conv2d", fwd * (2 if x_grad else 1), True)]


def test_forward_ops_reported_in_inference(rec):
    with no_grad():
        out = MaxPool2d(2)(Tensor(np.ones((1, 2, 4, 4))))
    assert not out.requires_grad
    assert rec.forward[0][:3] == ("max_pool2d", 4 * 8, False)
    Tensor([1.0]) * 2.0  # no grad anywhere: still observed
    assert rec.forward[-1][:3] == ("mul", 1, False)
    assert rec.backward == []


def test_every_op_family_reports(rec):
    x = Tensor(np.random.rand(2, 3) + 0.5, requires_grad=True)
    ops = [
        ("add", lambda: x + 1, 6), ("sub", lambda: x - x, 6), ("mul", lambda: x * x, 6),
        ("div", lambda: x / 2, 6), ("neg", lambda: -x, 6), ("pow", lambda: x ** 2, 6),
        ("exp", x.exp, 6), ("log", x.log, 6), ("sqrt", x.sqrt, 6),
        ("relu", x.relu, 6), ("sigmoid", x.sigmoid, 24), ("tanh", x.tanh, 6),
        ("gelu", lambda: F.gelu(x), 36), ("softmax", x.softmax, 30),
        ("log_softmax", x.log_softmax, 30), ("sum", x.sum, 6), ("mean", x.mean, 6),
        ("max", x.max, 6), ("reshape", lambda: x.reshape(3, 2), 0),
        ("transpose", x.transpose, 0), ("permute", lambda: x.permute(1, 0), 0),
        ("getitem", lambda: x[0], 0), ("masked_fill", lambda: x.masked_fill(x.data > 1, 0), 6),
        ("matmul", lambda: x @ x.transpose(), 2 * 2 * 2 * 3),
        ("cross_entropy", lambda: F.cross_entropy(x, [0, 2]), 5 * 6 + 2),
        ("embedding", lambda: F.embedding(x, [1, 0, 1]), 0),
    ]
    for name, fn, flops in ops:
        rec.forward.clear()
        fn()
        assert rec.forward[-1][:3] == (name, flops, name == "matmul"), name


def test_elementwise_backward_rules(rec):
    a = Tensor(np.ones((4, 3)), requires_grad=True)
    b = Tensor(np.ones(3), requires_grad=True)
    for op, per in [(lambda: a * b, 2), (lambda: a - b, 1), (lambda: a / b, 2)]:
        rec.backward.clear()
        op().backward(np.ones((4, 3)))
        # both inputs need grad; b was broadcast from 3 to 12 elements (9 reduction adds)
        assert rec.backward[0][2] == per * 12 * 2 + 9
    rec.backward.clear()
    F.softmax(a).sum().backward()
    assert [r[1:3] for r in rec.backward] == [("sum", 12), ("softmax", 48)]


def test_backward_tag_is_none_when_observer_arrives_late():
    w = Tensor(np.ones(3), requires_grad=True)
    y = (w * 2.0).sum()
    r = Recorder()
    previous = autograd.set_op_observer(r)
    try:
        y.backward()
    finally:
        autograd.set_op_observer(previous)
    assert [(t, n) for t, n, _, _ in r.backward] == [(None, "sum"), (None, "mul")]
