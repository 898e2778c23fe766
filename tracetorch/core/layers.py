"""``Module`` (the one base class of every layer) and the basic layers.

Parameters and children are found by looking at a module's attributes, so subclasses need
no registration calls:

* every ``Tensor`` held in an attribute, or in a list/tuple attribute, is a parameter
  (frozen ones too: keep non-parameter state such as running statistics as ndarrays);
* every ``Module`` held in an attribute, or in a list/tuple/dict attribute, is a child,
  named by its dotted path (``layers.0``, ``attention.q_proj``).

Example::

    >>> model = Sequential(Linear(4, 8), ReLU(), Linear(8, 2))
    >>> [name for name, _ in model.named_modules()]
    ['', 'layers.0', 'layers.1', 'layers.2']
    >>> len(model.parameters())
    4
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import init
from .ops_linalg import matmul
from .ops_math import add, mul
from .tensor import Tensor

__all__ = (
    "Module",
    "Layer",
    "Linear",
    "Dropout",
    "Flatten",
    "Sequential",
    "as_tensor",
    "check_positive_int",
)


def as_tensor(x: Any) -> Tensor:
    """``x`` if it already is a Tensor, else ``Tensor(x)`` (float32)."""
    return x if isinstance(x, Tensor) else Tensor(x)


def check_positive_int(value: Any, name: str, owner: str) -> int:
    """Raise ``ValueError`` naming ``owner`` and ``name`` unless ``value`` is an int > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")
    return int(value)


def _children_of(value: Any, name: str) -> Iterator[tuple[str, Module]]:
    if isinstance(value, Module):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if isinstance(item, Module):
                yield f"{name}.{i}", item
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, Module):
                yield f"{name}.{key}", item


class Module:
    """Base class of every layer, activation and loss.

    Subclasses implement ``forward``; calling the module calls ``forward``.

    Example::

        >>> class Scale(Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.alpha = Tensor([2.0], requires_grad=True)
        ...     def forward(self, x):
        ...         return x * self.alpha
        >>> Scale()(Tensor([1.0, 3.0])).data
        array([2., 6.], dtype=float32)
    """

    #: Class-level default so subclasses that skip ``super().__init__()`` still work.
    training: bool = True

    def __init__(self) -> None:
        self.training = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # -- structure --------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        """Direct sub-modules as (attribute path, module), in attribute order."""
        for name, value in vars(self).items():
            yield from _children_of(value, name)

    def children(self) -> Iterator[Module]:
        for _, child in self.named_children():
            yield child

    def named_modules(
        self, prefix: str = "", memo: set | None = None
    ) -> Iterator[tuple[str, Module]]:
        """This module (path ``prefix``) and all descendants, each module once."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def _own_parameters(self) -> Iterator[tuple[str, Tensor]]:
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Tensor):
                        yield f"{name}.{i}", item

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """(dotted name, parameter) for this module and its descendants, each tensor once."""
        seen: set = set()
        for path, module in self.named_modules(prefix):
            for name, tensor in module._own_parameters():
                if id(tensor) not in seen:
                    seen.add(id(tensor))
                    yield (f"{path}.{name}" if path else name), tensor

    def parameters(self) -> list[Tensor]:
        """All parameters, de-duplicated by identity (a shared/tied tensor appears once).

        Children are asked through their own ``parameters()``, so a subclass that overrides
        it (TinyTorch style) is respected.
        """
        seen: set = set()
        out: list[Tensor] = []
        for _, tensor in self._own_parameters():
            if id(tensor) not in seen:
                seen.add(id(tensor))
                out.append(tensor)
        for child in self.children():
            for tensor in child.parameters():
                if id(tensor) not in seen:
                    seen.add(id(tensor))
                    out.append(tensor)
        return out

    # -- modes and gradients ----------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Set ``training`` on this module and every descendant; returns ``self``."""
        for module in self.modules():
            module.training = bool(mode)
        return self

    def eval(self) -> Module:
        """Inference mode: dropout off, batch norm uses running statistics."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Set ``grad`` of every parameter to ``None``."""
        for tensor in self.parameters():
            tensor.grad = None

    # -- printing ---------------------------------------------------------------------
    def extra_repr(self) -> str:
        """Constructor arguments shown inside ``ClassName(...)``."""
        return ""

    def __repr__(self) -> str:
        head = f"{type(self).__name__}({self.extra_repr()}"
        children = list(self.named_children())
        if not children:
            return head + ")"
        lines = [head]
        for name, child in children:
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        return "\n".join(lines) + "\n)"


#: TinyTorch calls its base class ``Layer``.
Layer = Module


class Linear(Module):
    """``y = x @ weight + bias`` over any leading dims; weight is (in, out), bias (out,).

    Weights start as N(0, 1/in_features) (TinyTorch's scheme), bias as zeros.

    Example::

        >>> Linear(4, 3)(Tensor(np.ones((2, 4)))).shape
        (2, 3)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = check_positive_int(in_features, "in_features", "Linear")
        self.out_features = check_positive_int(out_features, "out_features", "Linear")
        self.weight = init.normal(
            (self.in_features, self.out_features), std=math.sqrt(1.0 / self.in_features)
        )
        self.bias = init.zeros((self.out_features,)) if bias else None

    def forward(self, x: Any) -> Tensor:
        x = as_tensor(x)
        shape = x.data.shape
        if not shape or shape[-1] != self.in_features:
            raise ValueError(
                f"Linear(in_features={self.in_features}, out_features={self.out_features}): "
                f"expected input with last dimension {self.in_features}, got shape {shape}"
            )
        y = matmul(x, self.weight)
        return y if self.bias is None else add(y, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )


class Dropout(Module):
    """Inverted dropout: in training zero each element with probability ``p`` and scale the
    rest by ``1/(1-p)``; identity in eval mode (or when ``p == 0``).

    Example::

        >>> Dropout(0.5).eval()(Tensor([1.0, 2.0])).data
        array([1., 2.], dtype=float32)
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be a probability in [0, 1], got p={p!r}")
        self.p = float(p)

    def forward(self, x: Any, training: bool | None = None) -> Tensor:
        """``training`` overrides ``self.training`` for this call (TinyTorch's signature)."""
        x = as_tensor(x)
        active = self.training if training is None else training
        if not active or self.p == 0.0:
            return x
        if self.p == 1.0:
            return mul(x, 0.0)
        keep = init.get_rng().random(x.shape, dtype=np.float32) >= self.p
        mask = keep.astype(x.dtype) * (1.0 / (1.0 - self.p))
        return mul(x, mask)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Flatten(Module):
    """Collapse dims ``start_dim..`` into one: (N, C, H, W) -> (N, C*H*W).

    Example::

        >>> Flatten()(Tensor(np.ones((2, 3, 4)))).shape
        (2, 12)
    """

    def __init__(self, start_dim: int = 1) -> None:
        super().__init__()
        self.start_dim = int(start_dim)

    def forward(self, x: Any) -> Tensor:
        x = as_tensor(x)
        shape = x.data.shape
        start = self.start_dim % len(shape) if shape else 0
        return x.reshape(shape[:start] + (-1,))

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}"


_TAKES_TRAINING: dict = {}


def _takes_training(layer: Any) -> bool:
    """Whether ``layer.forward`` accepts ``training=`` (cached per class)."""
    cls = type(layer)
    known = _TAKES_TRAINING.get(cls)
    if known is None:
        try:
            known = "training" in inspect.signature(layer.forward).parameters
        except (TypeError, ValueError, AttributeError):
            known = False
        _TAKES_TRAINING[cls] = known
    return known


class Sequential(Module):
    """Apply layers in order; ``Sequential(a, b)`` or ``Sequential([a, b])``.

    Example::

        >>> net = Sequential([Linear(2, 2), ReLU()])
        >>> len(net), type(net[0]).__name__
        (2, 'Linear')
    """

    def __init__(self, *layers: Any) -> None:
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        self.layers = list(layers)

    def forward(self, x: Any, training: bool | None = None) -> Any:
        """Chain the layers.  ``training`` (TinyTorch's signature) is passed on to the
        layers whose ``forward`` takes a ``training`` argument, such as Dropout."""
        if training is None:
            for layer in self.layers:
                x = layer(x)
            return x
        for layer in self.layers:
            x = layer(x, training=training) if _takes_training(layer) else layer(x)
        return x

    def append(self, layer: Any) -> Sequential:
        self.layers.append(layer)
        return self

    def __getitem__(self, index: int) -> Any:
        return self.layers[index]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.layers)
