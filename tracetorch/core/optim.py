"""Optimizers: the ``Optimizer`` base, SGD (momentum, weight decay) and Adam.

Updates work in place on ``param.data`` with the ndarray in ``param.grad.data``;
parameters whose ``grad`` is ``None`` are skipped.  Attribute names follow TinyTorch
(``momentum_buffers``; ``m_buffers``, ``v_buffers``, ``step_count``).

Example::

    >>> w = Tensor([1.0], requires_grad=True)
    >>> opt = SGD([w], lr=0.1)
    >>> (w * w).sum().backward(); opt.step()
    >>> w.data
    array([0.8], dtype=float32)
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from .tensor import Tensor

__all__ = ("Optimizer", "SGD", "Adam")


def _grad_array(param: Tensor) -> np.ndarray | None:
    grad = param.grad
    if grad is None:
        return None
    return grad.data if isinstance(grad, Tensor) else np.asarray(grad)


def _decayed_grads(params: list[Tensor],
                   weight_decay: float) -> Iterator[tuple[int, Tensor, np.ndarray]]:
    """``(index, param, grad + weight_decay * param.data)`` for each param that has a grad.

    With ``weight_decay == 0`` the grad array itself comes back (no copy): callers must not
    write into it.
    """
    for i, p in enumerate(params):
        g = _grad_array(p)
        if g is None:
            continue
        if weight_decay:
            g = g + weight_decay * p.data
        yield i, p, g


class Optimizer:
    """Holds ``params`` (de-duplicated by identity); subclasses implement ``step()``.

    Example::

        >>> class Halve(Optimizer):
        ...     def step(self):
        ...         for p in self.params: p.data *= 0.5
    """

    def __init__(self, params: Iterable[Tensor]) -> None:
        if isinstance(params, Tensor):
            raise TypeError("Optimizer: params must be an iterable of Tensors, got a Tensor")
        unique: list[Tensor] = []
        seen: set = set()
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"Optimizer: params must be Tensors, got {type(p).__name__}")
            if id(p) not in seen:
                seen.add(id(p))
                unique.append(p)
        if not unique:
            raise ValueError("Optimizer: got an empty parameter list")
        self.params = unique

    def step(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement step()")

    def zero_grad(self) -> None:
        """Set ``grad`` of every parameter to ``None``."""
        for p in self.params:
            p.grad = None


def _check_hyper(owner: str, **values: Any) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{owner}: {name} must be >= 0, got {value!r}")


class SGD(Optimizer):
    """SGD: ``g = grad + weight_decay * p``; with momentum ``v = momentum * v + g`` (v = g
    on the first step) and ``p -= lr * v``, else ``p -= lr * g``.

    Example::

        >>> w = Tensor([2.0], requires_grad=True)
        >>> opt = SGD([w], lr=0.5, momentum=0.9)
        >>> w.grad = Tensor([1.0]); opt.step(); opt.step()
        >>> w.data        # 2 - 0.5*1 - 0.5*1.9
        array([0.55], dtype=float32)
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 0.01,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params)
        _check_hyper("SGD", lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.momentum_buffers: list[np.ndarray | None] = [None] * len(self.params)

    def step(self) -> None:
        for i, p, g in _decayed_grads(self.params, self.weight_decay):
            if self.momentum:
                buf = self.momentum_buffers[i]
                if buf is None:
                    buf = np.array(g, dtype=p.data.dtype)
                else:
                    buf *= self.momentum
                    buf += g
                self.momentum_buffers[i] = buf
                g = buf
            p.data -= self.lr * g


class Adam(Optimizer):
    """Adam with bias correction; ``weight_decay`` adds ``weight_decay * p`` to the grad (L2).

    ``m = b1*m + (1-b1)*g``; ``v = b2*v + (1-b2)*g^2``;
    ``p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``.

    Example::

        >>> w = Tensor([1.0], requires_grad=True)
        >>> opt = Adam([w], lr=0.1)
        >>> w.grad = Tensor([3.0]); opt.step()
        >>> np.round(w.data, 4)     # the first step moves by ~lr
        array([0.9], dtype=float32)
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params)
        beta1, beta2 = betas
        _check_hyper("Adam", lr=lr, eps=eps, weight_decay=weight_decay)
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"Adam: betas must be in [0, 1), got {betas!r}")
        self.lr = float(lr)
        self.betas = (float(beta1), float(beta2))
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        self.step_count = 0
        self.m_buffers: list[np.ndarray | None] = [None] * len(self.params)
        self.v_buffers: list[np.ndarray | None] = [None] * len(self.params)

    def step(self) -> None:
        self.step_count += 1
        beta1, beta2 = self.betas
        correction1 = 1.0 - beta1**self.step_count
        correction2 = 1.0 - beta2**self.step_count
        for i, p, g in _decayed_grads(self.params, self.weight_decay):
            m = self.m_buffers[i]
            v = self.v_buffers[i]
            if m is None or v is None:
                m = self.m_buffers[i] = np.zeros_like(p.data)
                v = self.v_buffers[i] = np.zeros_like(p.data)
            m *= beta1
            m += (1.0 - beta1) * g
            v *= beta2
            v += (1.0 - beta2) * (g * g)
            p.data -= (self.lr / correction1) * m / (np.sqrt(v / correction2) + self.eps)
