"""Tensor API: construction, shape facts, arithmetic values, backward rules, grad mode."""
import numpy as np
import pytest

from tracetorch.core import Tensor, no_grad
from tracetorch.core.autograd import enable_grad, is_grad_enabled


def test_construction_defaults_to_float32():
    assert Tensor([1, 2, 3]).dtype == np.float32
    assert Tensor(np.arange(4.0)).dtype == np.float32
    assert Tensor([1.0], dtype=np.float64).dtype == np.float64
    assert Tensor([[1, 2]], dtype=np.int64).dtype == np.int64
    stacked = Tensor([Tensor([1.0, 2.0]), Tensor([3.0, 4.0])])
    assert stacked.shape == (2, 2)
    arr = np.ones(3, dtype=np.float32)
    assert Tensor(arr).data is arr  # float32 arrays are shared, not copied


def test_shape_follows_data():
    t = Tensor(np.zeros((2, 3)))
    assert (t.shape, t.size, t.ndim) == ((2, 3), 6, 2)
    t.data = np.zeros((4, 5, 6), dtype=np.float32)
    assert (t.shape, t.size, t.ndim) == ((4, 5, 6), 120, 3)
    assert t.numpy() is t.data and t.numel() == 120 and t.memory_footprint() == 480


def test_arithmetic_values_and_reflected_ops():
    a = Tensor([1.0, 2.0, 4.0])
    np.testing.assert_allclose((a + 1).data, [2, 3, 5])
    np.testing.assert_allclose((1 + a).data, [2, 3, 5])
    np.testing.assert_allclose((1 - a).data, [0, -1, -3])
    np.testing.assert_allclose((a - 1).data, [0, 1, 3])
    np.testing.assert_allclose((2 * a).data, [2, 4, 8])
    np.testing.assert_allclose((4 / a).data, [4, 2, 1])
    np.testing.assert_allclose((a / 2).data, [0.5, 1, 2])
    np.testing.assert_allclose((-a).data, [-1, -2, -4])
    np.testing.assert_allclose((a ** 2).data, [1, 4, 16])
    out = np.ones(3) + a  # numpy defers to Tensor.__radd__
    assert isinstance(out, Tensor) and out.dtype == np.float32
    assert (a * np.float64(2.0)).dtype == np.float32  # numpy scalars do not upcast


def test_matmul_operator_and_method():
    a, b = Tensor(np.ones((2, 3))), Tensor(np.ones((3, 4)))
    np.testing.assert_allclose((a @ b).data, np.full((2, 4), 3.0))
    np.testing.assert_allclose(a.matmul(b).data, np.full((2, 4), 3.0))
    np.testing.assert_allclose((np.ones((1, 2)) @ a).data, np.full((1, 3), 2.0))


def test_reshape_forms_and_transpose_default():
    t = Tensor(np.arange(6.0))
    assert t.reshape(2, 3).shape == (2, 3)
    assert t.reshape((3, 2)).shape == (3, 2)
    assert t.reshape([3, -1]).shape == (3, 2)
    assert t.reshape(-1, 1).shape == (6, 1)
    m = Tensor(np.zeros((2, 3, 4)))
    assert m.transpose().shape == (2, 4, 3)
    assert m.transpose(0, 2).shape == (4, 3, 2)
    assert m.permute(1, 2, 0).shape == (3, 4, 2)
    assert Tensor([1.0, 2.0]).transpose().shape == (2,)


def test_reductions_values():
    t = Tensor([[1.0, 5.0], [3.0, 2.0]])
    assert t.sum().item() == 11.0
    np.testing.assert_allclose(t.sum(axis=0).data, [4, 7])
    np.testing.assert_allclose(t.mean(axis=1, keepdims=True).data, [[3], [2.5]])
    np.testing.assert_allclose(t.max(axis=1).data, [5, 3])
    np.testing.assert_allclose(t.max(dim=0).data, [3, 5])
    assert t.sum().shape == ()


def test_backward_fills_grads_and_accumulates():
    w = Tensor([1.0, 2.0], requires_grad=True)
    (w * w).sum().backward()
    np.testing.assert_allclose(w.grad.data, [2, 4])
    (w * 3.0).sum().backward()
    np.testing.assert_allclose(w.grad.data, [5, 7])
    w.zero_grad()
    assert w.grad is None


def test_shared_subexpression_gets_both_paths():
    x = Tensor([3.0], requires_grad=True)
    y = x * 2.0
    (y * y + y).sum().backward()  # d/dx (4x^2 + 2x) = 8x + 2
    np.testing.assert_allclose(x.grad.data, [26.0])


def test_grads_of_different_leaves_never_alias():
    a = Tensor([1.0], requires_grad=True)
    b = Tensor([1.0], requires_grad=True)
    (a + b).sum().backward()
    assert a.grad.data is not b.grad.data
    a.grad.data += 5
    np.testing.assert_allclose(b.grad.data, [1.0])


def test_backward_needs_gradient_for_non_scalar():
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    y = x * 2.0
    with pytest.raises(RuntimeError, match="gradient argument"):
        y.backward()
    with pytest.raises(ValueError, match=r"gradient has shape \(3,\)"):
        y.backward(np.ones(3))
    y.backward(np.ones((2, 3)))
    np.testing.assert_allclose(x.grad.data, np.full((2, 3), 2.0))
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor([1.0]).backward()


def test_retain_grad_and_leaf_flags():
    x = Tensor([2.0], requires_grad=True)
    h = (x * 3.0).retain_grad()
    (h * h).sum().backward()
    np.testing.assert_allclose(h.grad.data, [12.0])
    assert x.is_leaf and not h.is_leaf
    assert h.detach().requires_grad is False


def test_no_grad_builds_no_graph():
    x = Tensor([1.0], requires_grad=True)
    with no_grad():
        assert not is_grad_enabled()
        y = x * 2.0
        with enable_grad():
            z = x * 2.0
    assert is_grad_enabled()
    assert not y.requires_grad and y._grad_fn is None
    assert z.requires_grad


def test_getitem_and_masked_fill_values():
    t = Tensor(np.arange(12.0).reshape(3, 4))
    np.testing.assert_allclose(t[1].data, [4, 5, 6, 7])
    np.testing.assert_allclose(t[:, 1].data, [1, 5, 9])
    np.testing.assert_allclose(t[Tensor([2.0, 0.0])].data[:, 0], [8, 0])
    filled = t.masked_fill(t.data > 9, 0.0)
    assert filled.data.max() == 9.0 and filled.dtype == np.float32


def test_repr_and_scalars():
    t = Tensor([1.0, 2.0], requires_grad=True)
    assert "requires_grad=True" in repr(t)
    assert float(Tensor([3.5])) == 3.5 and len(t) == 2 and t.tolist() == [1.0, 2.0]
    assert np.asarray(t).dtype == np.float32
