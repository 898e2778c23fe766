"""Functional form of every core tensor op, in one namespace (``import ... as F``).

Example::

    >>> from tracetorch.core import functional as F
    >>> F.relu(Tensor([-1.0, 1.0])).data
    array([0., 1.], dtype=float32)
"""
from __future__ import annotations

from .ops_conv import conv2d
from .ops_linalg import matmul
from .ops_math import add, div, exp, log, masked_fill, mul, neg, pow, sqrt, sub
from .ops_nn import cross_entropy, embedding, gelu, log_softmax, relu, sigmoid, softmax, tanh
from .ops_norm import batch_norm, layer_norm
from .ops_pool import avg_pool2d, max_pool2d
from .ops_reduce import max, mean, sum
from .ops_shape import getitem, permute, reshape, transpose
from .tensor import Tensor

__all__ = (
    "add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "masked_fill",
    "matmul",
    "sum", "mean", "max",
    "reshape", "transpose", "permute", "getitem",
    "relu", "sigmoid", "tanh", "gelu", "softmax", "log_softmax", "cross_entropy", "embedding",
    "conv2d", "max_pool2d", "avg_pool2d",
    "layer_norm", "batch_norm",
    "Tensor",
)
