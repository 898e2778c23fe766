"""Embedding: a lookup table from integer ids to learned vectors.

Example::

    >>> emb = Embedding(10, 4)
    >>> emb([[1, 2, 3]]).shape
    (1, 3, 4)
"""
from __future__ import annotations

import math
from typing import Any

from . import init
from .layers import Module, check_positive_int
from .ops_nn import embedding
from .tensor import Tensor

__all__ = ("Embedding",)


class Embedding(Module):
    """``weight`` (num_embeddings, embedding_dim); ``forward(ids)`` -> ids.shape + (dim,).

    Ids may be ints, an int array, or a Tensor of whole numbers (TinyTorch stores token
    ids as float32).  Weights start as U(-a, a) with a = sqrt(6 / (num + dim)).

    Example::

        >>> Embedding(5, 2)(Tensor([0.0, 4.0])).shape
        (2, 2)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = check_positive_int(num_embeddings, "num_embeddings", "Embedding")
        self.embedding_dim = check_positive_int(embedding_dim, "embedding_dim", "Embedding")
        limit = math.sqrt(6.0 / (self.num_embeddings + self.embedding_dim))
        self.weight = init.uniform((self.num_embeddings, self.embedding_dim), limit)

    def forward(self, indices: Any) -> Tensor:
        return embedding(self.weight, indices)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
