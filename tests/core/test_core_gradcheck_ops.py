"""Finite-difference gradient checks (float64) for every core tensor op."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from tracetorch.core import functional as F
from tracetorch.core.gradcheck import gradcheck
from tracetorch.core.tensor import Tensor


def t64(*shape, seed=0, low=None):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal(shape)
    if low is not None:
        data = np.abs(data) + low
    return Tensor(data, requires_grad=True, dtype=np.float64)


@pytest.mark.parametrize(
    "op",
    [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b],
    ids=["add", "sub", "mul", "div"],
)
def test_binary_ops_with_broadcasting(op):
    a = t64(3, 1, 4, seed=1)
    b = t64(2, 1, low=0.5, seed=2)  # positive: keeps div away from zero
    assert gradcheck(lambda: op(a, b), [a, b])


@pytest.mark.parametrize(
    "op",
    [
        lambda a: a + 2.0,
        lambda a: 2.0 + a,
        lambda a: 3.0 - a,
        lambda a: a * 0.5,
        lambda a: 1.5 / a,
        lambda a: a / 4.0,
        lambda a: -a,
        lambda a: a ** 3,
        lambda a: a ** 0.5,
        lambda a: a.exp(),
        lambda a: a.log(),
        lambda a: a.sqrt(),
        lambda a: a - np.ones((2, 3)),
        lambda a: np.ones(3) * a,
    ],
)
def test_unary_and_scalar_ops(op):
    a = t64(2, 3, low=0.5)
    assert gradcheck(lambda: op(a), [a])


@settings(max_examples=25, deadline=None)
@given(mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3))
def test_broadcast_grads_match_finite_differences(shapes):
    sa, sb = shapes.input_shapes
    a = t64(*sa, seed=3)
    b = t64(*sb, seed=4)
    assert gradcheck(lambda: a * b + a, [a, b])
    assert a.grad.shape == sa and b.grad.shape == sb


@pytest.mark.parametrize(
    "sa,sb",
    [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((4,), (4, 5)),
     ((3, 4), (4,)), ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5))],
)
def test_matmul_shapes(sa, sb):
    a, b = t64(*sa, seed=5), t64(*sb, seed=6)
    assert gradcheck(lambda: a @ b, [a, b])
    np.testing.assert_allclose((a @ b).data, np.matmul(a.data, b.data))


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("name", ["sum", "mean", "max"])
def test_reductions(name, axis, keepdims):
    a = t64(2, 3, 4, seed=7)
    f = lambda: getattr(a, name)(axis=axis, keepdims=keepdims)  # noqa: E731
    assert gradcheck(f, [a])
    np.testing.assert_allclose(f().data, getattr(np, name)(a.data, axis=axis, keepdims=keepdims))


def test_max_ties_share_gradient():
    a = Tensor([1.0, 3.0, 3.0], requires_grad=True)
    a.max().backward()
    np.testing.assert_allclose(a.grad.data, [0.0, 0.5, 0.5])


@pytest.mark.parametrize(
    "op",
    [
        lambda a: a.reshape(4, 6),
        lambda a: a.reshape((-1,)),
        lambda a: a.transpose(),
        lambda a: a.transpose(0, 2),
        lambda a: a.permute(2, 0, 1),
        lambda a: a[1],
        lambda a: a[:, 1:3, ::2],
        lambda a: a[np.array([0, 1, 0])],
        lambda a: a[:, [2, 2, 0]],
        lambda a: a[a.data > 0],
        lambda a: a[Tensor([1.0, 0.0])],
        lambda a: a.flatten(1),
        lambda a: a.masked_fill(np.array([True, False, True, False]), -3.0),
    ],
)
def test_shape_ops(op):
    a = t64(2, 3, 4, seed=8)
    assert gradcheck(lambda: op(a), [a])


@pytest.mark.parametrize(
    "fn", [F.relu, F.sigmoid, F.tanh, F.gelu, lambda x: F.softmax(x, 0),
           lambda x: F.softmax(x, -1), lambda x: F.log_softmax(x, 1)],
)
def test_activation_ops(fn):
    a = t64(3, 5, seed=9)
    assert gradcheck(lambda: fn(a), [a])


def test_sigmoid_is_stable_for_large_inputs():
    out = F.sigmoid(Tensor([-1000.0, 0.0, 1000.0])).data
    np.testing.assert_allclose(out, [0.0, 0.5, 1.0])


def test_cross_entropy_op():
    logits = t64(4, 3, seed=10)
    targets = np.array([0, 2, 1, 2])
    assert gradcheck(lambda: F.cross_entropy(logits, targets), [logits])
    p = np.exp(logits.data) / np.exp(logits.data).sum(1, keepdims=True)
    expected = -np.mean(np.log(p[np.arange(4), targets]))
    np.testing.assert_allclose(F.cross_entropy(logits, targets).item(), expected)


def test_embedding_op_accumulates_repeated_ids():
    w = t64(5, 3, seed=11)
    ids = np.array([[0, 4, 0], [2, 0, 1]])
    assert gradcheck(lambda: F.embedding(w, ids), [w])


def test_conv2d_op_with_bias_stride_padding():
    x, w, b = t64(2, 3, 6, 5, seed=12), t64(4, 3, 3, 2, seed=13), t64(4, seed=14)
    assert gradcheck(lambda: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2)), [x, w, b])


@pytest.mark.parametrize("kernel,stride,padding",
                         [(2, None, 0), (3, 2, 1), ((2, 3), (1, 2), (1, 1))])
def test_pool_ops(kernel, stride, padding):
    x = t64(2, 2, 6, 7, seed=15)
    assert gradcheck(lambda: F.max_pool2d(x, kernel, stride, padding), [x])
    assert gradcheck(lambda: F.avg_pool2d(x, kernel, stride, padding), [x])


def test_norm_ops():
    x, w, b = t64(3, 4, 5, seed=16), t64(4, 5, seed=17), t64(4, 5, seed=18)
    assert gradcheck(lambda: F.layer_norm(x, w, b, 2), [x, w, b])
    x4, g, h = t64(3, 2, 4, 4, seed=19), t64(2, seed=20), t64(2, seed=21)
    rm, rv = np.zeros(2), np.ones(2)
    assert gradcheck(lambda: F.batch_norm(x4, g, h, rm.copy(), rv.copy(), True), [x4, g, h])
    assert gradcheck(lambda: F.batch_norm(x4, g, h, rm + 0.3, rv * 2, False), [x4, g, h])


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4))
def test_composite_chain(n, m, k):
    a, b = t64(n, m, seed=22), t64(m, k, seed=23)
    assert gradcheck(lambda: ((a @ b).tanh() * 2.0 - a.sum()).mean(axis=0), [a, b])


def test_gradcheck_catches_a_wrong_backward():
    from tracetorch.core.autograd import Node

    x = t64(3, seed=24)

    def wrong_square():  # backward forgets the factor 2
        node = Node((x,), lambda g: (g * x.data,), "sq", None, False, 0)
        return Tensor._from_op(x.data ** 2, node)

    with pytest.raises(AssertionError, match="gradcheck: input 0"):
        gradcheck(wrong_square, [x])
