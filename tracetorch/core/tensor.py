"""The ``Tensor`` class: an ndarray plus the autograd bookkeeping.

The arithmetic lives in the ``ops_*`` modules; the methods here only delegate, so this file
stays a readable list of what a Tensor can do.  Choices (TinyTorch-compatible):

* ``Tensor(data)`` stores float32 unless ``dtype=`` is given (pass ``np.float64`` for
  finite-difference checks, or an integer dtype for ids).  Integer class targets and token
  ids may stay float32 Tensors: Embedding and CrossEntropyLoss accept integral floats.
* A float32 ndarray is stored without a copy (like ``torch.from_numpy``); optimizers update
  ``.data`` in place.
* ``shape``/``size``/``ndim``/``dtype`` are properties of ``.data``, so they stay right
  when ``.data`` is reassigned.
* ``.grad`` is ``None`` or a ``Tensor`` (so ``p.grad.data`` is the ndarray).
"""
from __future__ import annotations

from typing import Any, Union

import numpy as np

from . import autograd as _ag

__all__ = ("Tensor", "ArrayLike")

ArrayLike = Union["Tensor", np.ndarray, float, int, list, tuple]

_new = object.__new__


class Tensor:
    """An n-dimensional float array that records operations for reverse-mode autograd.

    Example::

        >>> x = Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
        >>> y = (x * x).sum()
        >>> y.backward()
        >>> x.grad.data
        array([[2., 4.],
               [6., 8.]], dtype=float32)
    """

    # numpy must hand ``ndarray + Tensor`` to Tensor.__radd__ instead of looping over it.
    __array_ufunc__ = None
    _retains_grad = False

    def __init__(self, data: Any, requires_grad: bool = False, dtype: Any = None) -> None:
        if isinstance(data, Tensor):
            data = data.data
        elif isinstance(data, (list, tuple)) and data and isinstance(data[0], Tensor):
            data = np.stack([t.data for t in data])
        if dtype is None:
            dtype = np.float32
        if not (type(data) is np.ndarray and data.dtype == dtype):
            data = np.asarray(data, dtype=dtype)
        self.data: np.ndarray = data
        self.requires_grad: bool = bool(requires_grad)
        self.grad: Tensor | None = None
        self._grad_fn: _ag.Node | None = None

    # -- cheap constructors used by the ops (no validation: they pass ndarrays) ----------
    @staticmethod
    def _wrap(data: np.ndarray) -> Tensor:
        if type(data) is not np.ndarray:  # 0-d results come back as numpy scalars
            data = np.asarray(data)
        t = _new(Tensor)
        t.data = data
        t.requires_grad = False
        t.grad = None
        t._grad_fn = None
        return t

    @staticmethod
    def _from_op(data: np.ndarray, node: _ag.Node) -> Tensor:
        if type(data) is not np.ndarray:
            data = np.asarray(data)
        t = _new(Tensor)
        t.data = data
        t.requires_grad = True
        t.grad = None
        t._grad_fn = node
        return t

    # -- array facts ----------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def size(self) -> int:
        return self.data.size

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def is_leaf(self) -> bool:
        """True for tensors not produced by a recorded op (parameters, inputs)."""
        return self._grad_fn is None

    def numel(self) -> int:
        return self.data.size

    def memory_footprint(self) -> int:
        """Bytes held by ``data``."""
        return self.data.nbytes

    def numpy(self) -> np.ndarray:
        return self.data

    def item(self) -> float:
        return self.data.item()

    def tolist(self) -> Any:
        return self.data.tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.data if dtype is None else self.data.astype(dtype)

    def __len__(self) -> int:
        return len(self.data)

    def __float__(self) -> float:
        return float(self.data.item())  # numpy 2 refuses float() of 1-element arrays

    def __repr__(self) -> str:
        body = np.array2string(self.data, precision=4, threshold=20, separator=", ")
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({body}{grad})"

    # -- autograd -------------------------------------------------------------------------
    def backward(self, gradient: Any = None) -> None:
        """Accumulate d(self)/d(leaf) into ``leaf.grad`` for every leaf that requires grad.

        A non-scalar tensor needs ``gradient`` (same shape as ``self``).

        Example::

            >>> w = Tensor([1.0, 2.0], requires_grad=True)
            >>> (w * 3.0).backward(gradient=np.ones(2))
            >>> w.grad.data
            array([3., 3.], dtype=float32)
        """
        if not self.requires_grad:
            raise RuntimeError(
                "backward(): this tensor does not require grad and has no graph; "
                "create the inputs/parameters with requires_grad=True"
            )
        if gradient is None:
            if self.data.size != 1:
                raise RuntimeError(
                    f"backward(): tensor of shape {self.shape} is not a scalar, so a gradient "
                    f"argument is needed (an array of shape {self.shape}), "
                    "e.g. y.backward(gradient=np.ones(y.shape))"
                )
            grad = np.ones_like(self.data)
        else:
            grad = gradient.data if isinstance(gradient, Tensor) else gradient
            # Copied: the engine may hand this very array to a leaf's .grad.
            grad = np.array(grad, dtype=self.data.dtype)
            if grad.shape != self.shape:
                raise ValueError(
                    f"backward(): gradient has shape {grad.shape} but the tensor has shape "
                    f"{self.shape}"
                )
        _ag.run_backward(self, grad)

    def zero_grad(self) -> None:
        """Drop the accumulated gradient (``grad = None``)."""
        self.grad = None

    def retain_grad(self) -> Tensor:
        """Keep ``.grad`` on this non-leaf tensor during ``backward()``."""
        self._retains_grad = True
        return self

    def detach(self) -> Tensor:
        """The same data, cut from the graph."""
        return Tensor._wrap(self.data)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        self.requires_grad = requires_grad
        return self

    # -- arithmetic (see ops_math) --------------------------------------------------------
    def __add__(self, other: Any) -> Tensor:
        return _math.add(self, other)

    def __radd__(self, other: Any) -> Tensor:
        return _math.add(other, self)

    def __sub__(self, other: Any) -> Tensor:
        return _math.sub(self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return _math.sub(other, self)

    def __mul__(self, other: Any) -> Tensor:
        return _math.mul(self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return _math.mul(other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return _math.div(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return _math.div(other, self)

    def __neg__(self) -> Tensor:
        return _math.neg(self)

    def __pow__(self, exponent: float) -> Tensor:
        return _math.pow(self, exponent)

    def __matmul__(self, other: Any) -> Tensor:
        return _linalg.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return _linalg.matmul(other, self)

    def add(self, other: Any) -> Tensor:
        return _math.add(self, other)

    def sub(self, other: Any) -> Tensor:
        return _math.sub(self, other)

    def mul(self, other: Any) -> Tensor:
        return _math.mul(self, other)

    def div(self, other: Any) -> Tensor:
        return _math.div(self, other)

    def matmul(self, other: Any) -> Tensor:
        return _linalg.matmul(self, other)

    def pow(self, exponent: float) -> Tensor:
        return _math.pow(self, exponent)

    def exp(self) -> Tensor:
        return _math.exp(self)

    def log(self) -> Tensor:
        return _math.log(self)

    def sqrt(self) -> Tensor:
        return _math.sqrt(self)

    def masked_fill(self, mask: Any, value: float) -> Tensor:
        """Replace entries where ``mask`` is true by ``value`` (no gradient flows there)."""
        return _math.masked_fill(self, mask, value)

    # -- activations (see ops_nn) ---------------------------------------------------------
    def relu(self) -> Tensor:
        return _nn.relu(self)

    def sigmoid(self) -> Tensor:
        return _nn.sigmoid(self)

    def tanh(self) -> Tensor:
        return _nn.tanh(self)

    def softmax(self, dim: int = -1) -> Tensor:
        return _nn.softmax(self, dim)

    def log_softmax(self, dim: int = -1) -> Tensor:
        return _nn.log_softmax(self, dim)

    # -- reductions (see ops_reduce) ------------------------------------------------------
    def sum(self, axis: Any = None, keepdims: bool = False, *, dim: Any = None) -> Tensor:
        return _reduce.sum(self, axis if dim is None else dim, keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False, *, dim: Any = None) -> Tensor:
        return _reduce.mean(self, axis if dim is None else dim, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False, *, dim: Any = None) -> Tensor:
        return _reduce.max(self, axis if dim is None else dim, keepdims)

    # -- shape (see ops_shape) ------------------------------------------------------------
    def reshape(self, *shape: Any) -> Tensor:
        """``reshape(2, 3)`` or ``reshape((2, 3))``; one dimension may be -1."""
        return _shape.reshape(self, shape[0] if len(shape) == 1 else shape)

    view = reshape

    def transpose(self, dim0: int | None = None, dim1: int | None = None) -> Tensor:
        """Swap two dimensions (the last two when none are given)."""
        return _shape.transpose(self, dim0, dim1)

    def permute(self, *dims: Any) -> Tensor:
        return _shape.permute(self, dims[0] if len(dims) == 1 else dims)

    def contiguous(self) -> Tensor:
        return self

    def flatten(self, start_dim: int = 0) -> Tensor:
        start = start_dim % max(self.data.ndim, 1)
        return _shape.reshape(self, self.data.shape[:start] + (-1,))

    def __getitem__(self, index: Any) -> Tensor:
        return _shape.getitem(self, index)


# Imported last on purpose: these modules import Tensor from here (a deliberate cycle that
# keeps each op family in its own file while the methods above stay one-liners).
from . import ops_linalg as _linalg  # noqa: E402
from . import ops_math as _math  # noqa: E402
from . import ops_nn as _nn  # noqa: E402
from . import ops_reduce as _reduce  # noqa: E402
from . import ops_shape as _shape  # noqa: E402
