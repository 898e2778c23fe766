"""tracetorch.core: a small, fast numpy deep-learning framework with autograd.

TinyTorch-compatible (``Tensor``, ``Linear`` with (in, out) weights, ``Conv2d`` with tuple
``kernel_size``, ``Layer`` alias, ``Sequential.layers``), vectorized (im2col convolution,
strided pooling, GEMM-backed Linear), and instrumented: every tensor op reports its FLOPs
to an optional observer (:mod:`tracetorch.core.autograd`), which the tracetorch profiler uses.

Example::

    >>> import numpy as np
    >>> from tracetorch.core import Sequential, Linear, ReLU, Tensor, CrossEntropyLoss, SGD
    >>> model = Sequential(Linear(4, 16), ReLU(), Linear(16, 3))
    >>> loss = CrossEntropyLoss()(model(Tensor(np.ones((8, 4)))), np.zeros(8, dtype=int))
    >>> loss.backward()
    >>> SGD(model.parameters(), lr=0.1).step()
"""
from __future__ import annotations

from .activations import GELU, ReLU, Sigmoid, Softmax, Tanh
from .attention import MLP, MultiHeadAttention, TransformerBlock
from .autograd import OpObserver, get_op_observer, no_grad, set_op_observer
from .embeddings import Embedding
from .gradcheck import gradcheck
from .init import manual_seed
from .layers import Dropout, Flatten, Layer, Linear, Module, Sequential
from .losses import CrossEntropyLoss, MSELoss
from .normalization import BatchNorm2d, LayerNorm
from .optim import SGD, Adam, Optimizer
from .spatial import AvgPool2d, Conv2d, MaxPool2d
from .tensor import Tensor

__all__ = (
    "Tensor",
    "Module",
    "Layer",
    "Linear",
    "Dropout",
    "Flatten",
    "Sequential",
    "ReLU",
    "Sigmoid",
    "Tanh",
    "GELU",
    "Softmax",
    "Conv2d",
    "MaxPool2d",
    "AvgPool2d",
    "LayerNorm",
    "BatchNorm2d",
    "Embedding",
    "MultiHeadAttention",
    "MLP",
    "TransformerBlock",
    "MSELoss",
    "CrossEntropyLoss",
    "Optimizer",
    "SGD",
    "Adam",
    "OpObserver",
    "set_op_observer",
    "get_op_observer",
    "no_grad",
    "manual_seed",
    "gradcheck",
)
