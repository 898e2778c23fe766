"""Optimizers: exact updates against hand-written formulas."""
import numpy as np
import pytest

from tracetorch.core import SGD, Adam, Linear, Optimizer, Tensor


def param(values, grad):
    p = Tensor(np.array(values, dtype=np.float64), requires_grad=True, dtype=np.float64)
    p.grad = Tensor(np.array(grad, dtype=np.float64), dtype=np.float64)
    return p


def test_sgd_plain():
    p = param([1.0, -2.0], [0.5, 0.5])
    SGD([p], lr=0.1).step()
    np.testing.assert_allclose(p.data, [0.95, -2.05])


def test_sgd_momentum_and_weight_decay():
    p = param([1.0], [0.5])
    opt = SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01)
    g1 = 0.5 + 0.01 * 1.0
    opt.step()
    x1 = 1.0 - 0.1 * g1
    np.testing.assert_allclose(p.data, [x1])
    g2 = 0.5 + 0.01 * x1
    opt.step()
    np.testing.assert_allclose(p.data, [x1 - 0.1 * (0.9 * g1 + g2)])
    assert opt.momentum_buffers[0] is not None


def test_adam_one_step_exact():
    p = param([1.0, 2.0], [0.3, -0.4])
    lr, (b1, b2), eps, wd = 0.01, (0.8, 0.9), 1e-6, 0.1
    Adam([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd).step()
    g = np.array([0.3, -0.4]) + wd * np.array([1.0, 2.0])
    m, v = (1 - b1) * g, (1 - b2) * g * g
    expected = np.array([1.0, 2.0]) - lr * (m / (1 - b1)) / (np.sqrt(v / (1 - b2)) + eps)
    np.testing.assert_allclose(p.data, expected, rtol=1e-12)


def test_adam_two_steps_bias_correction():
    p = param([0.0], [1.0])
    opt = Adam([p], lr=0.1)
    opt.step()
    opt.step()
    assert opt.step_count == 2
    # constant gradient: bias-corrected m/sqrt(v) is 1 at every step
    np.testing.assert_allclose(p.data, [-0.2], rtol=1e-6)


def test_skips_missing_grads_zero_grad_and_dedup():
    lin = Linear(2, 2)
    opt = SGD(list(lin.parameters()) + [lin.weight], lr=1.0)
    assert len(opt.params) == 2
    before = lin.weight.data.copy()
    opt.step()  # no grads yet: nothing moves
    np.testing.assert_array_equal(lin.weight.data, before)
    lin(Tensor(np.ones((3, 2)))).sum().backward()
    opt.step()
    assert not np.allclose(lin.weight.data, before)
    opt.zero_grad()
    assert lin.weight.grad is None


def test_bad_optimizer_args():
    p = param([1.0], [1.0])
    with pytest.raises(ValueError, match="lr"):
        SGD([p], lr=-1.0)
    with pytest.raises(ValueError, match="betas"):
        Adam([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="empty"):
        SGD([], lr=0.1)
    with pytest.raises(NotImplementedError):
        Optimizer([p]).step()
    assert "step" in vars(SGD) and "step" in vars(Adam)
