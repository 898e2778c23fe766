"""Multi-head self-attention, the transformer MLP, and a pre-norm transformer block.

Attention is composed from core ops (Linear projections, reshape/transpose, matmul,
masked_fill, softmax), so each of them is reported to the op observer and differentiated
by the tape.

Masks: ``mask`` is truthy where a query may attend to a key (1/True = keep, 0/False =
blocked), broadcastable to (batch, heads, seq, seq); a 3-D mask (batch, seq, seq) applies to
every head.  ``causal=True`` additionally blocks keys after the query.  Blocked scores are
set to -1e9 before the softmax (a fully blocked row becomes uniform rather than NaN).

Example::

    >>> block = TransformerBlock(embed_dim=16, num_heads=4, mlp_hidden_dim=32, causal=True)
    >>> block(Tensor(np.random.randn(2, 5, 16))).shape
    (2, 5, 16)
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .activations import GELU
from .layers import Linear, Module, as_tensor, check_positive_int
from .normalization import LayerNorm
from .ops_linalg import matmul
from .ops_math import add, masked_fill, mul
from .ops_nn import softmax
from .tensor import Tensor

__all__ = ("MultiHeadAttention", "MLP", "TransformerBlock", "causal_mask")

_BLOCKED = -1e9


def causal_mask(seq_len: int) -> np.ndarray:
    """Boolean (seq, seq) mask, True where query i may attend key j (j <= i)."""
    return np.tril(np.ones((seq_len, seq_len), dtype=bool))


class MultiHeadAttention(Module):
    """Scaled dot-product self-attention with ``num_heads`` heads over (batch, seq, embed).

    Children ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` are ``Linear(embed, embed)``.
    A 2-D input (seq, embed) is treated as a batch of one.

    Example::

        >>> mha = MultiHeadAttention(8, 2)
        >>> mha(Tensor(np.random.randn(3, 4, 8)), causal=True).shape
        (3, 4, 8)
    """

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = False) -> None:
        super().__init__()
        self.embed_dim = check_positive_int(embed_dim, "embed_dim", "MultiHeadAttention")
        self.num_heads = check_positive_int(num_heads, "num_heads", "MultiHeadAttention")
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"MultiHeadAttention: embed_dim ({embed_dim}) must be divisible by "
                f"num_heads ({num_heads})"
            )
        self.head_dim = self.embed_dim // self.num_heads
        self.causal = bool(causal)
        self.q_proj = Linear(self.embed_dim, self.embed_dim)
        self.k_proj = Linear(self.embed_dim, self.embed_dim)
        self.v_proj = Linear(self.embed_dim, self.embed_dim)
        self.out_proj = Linear(self.embed_dim, self.embed_dim)

    def _blocked(self, mask: Any, causal: bool, seq: int) -> np.ndarray | None:
        """Boolean array, True where a score must be blocked (or None)."""
        blocked = None
        if mask is not None:
            keep = np.asarray(mask.data if isinstance(mask, Tensor) else mask).astype(bool)
            if keep.ndim == 3:  # (batch, seq, seq): same mask for every head
                keep = keep[:, None]
            blocked = ~keep
        if causal:
            future = ~causal_mask(seq)
            blocked = future if blocked is None else (blocked | future)
        return blocked

    def forward(self, x: Any, mask: Any = None, causal: bool | None = None) -> Tensor:
        x = as_tensor(x)
        single = x.ndim == 2
        if single:
            x = x.reshape((1,) + x.shape)
        if x.ndim != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"MultiHeadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}):"
                f" expected input (batch, seq, {self.embed_dim}), got shape {x.shape}"
            )
        b, t, d = x.shape
        h, hd = self.num_heads, self.head_dim

        def split(proj: Tensor) -> Tensor:  # (b, t, d) -> (b, h, t, hd)
            return proj.reshape(b, t, h, hd).transpose(1, 2)

        q = mul(split(self.q_proj(x)), 1.0 / math.sqrt(hd))
        k = split(self.k_proj(x))
        v = split(self.v_proj(x))
        scores = matmul(q, k.transpose(-2, -1))
        blocked = self._blocked(mask, self.causal if causal is None else causal, t)
        if blocked is not None:
            try:
                scores = masked_fill(scores, blocked, _BLOCKED)
            except ValueError:
                raise ValueError(
                    f"MultiHeadAttention: mask of shape {np.shape(mask)} does not broadcast "
                    f"to the scores' shape {(b, h, t, t)}"
                ) from None
        weights = softmax(scores, -1)
        context = matmul(weights, v).transpose(1, 2).reshape(b, t, d)
        out = self.out_proj(context)
        return out.reshape(t, d) if single else out

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, causal={self.causal}"


class MLP(Module):
    """Position-wise feed-forward: ``linear2(GELU(linear1(x)))``.

    Example::

        >>> MLP(8, 32)(Tensor(np.ones((2, 8)))).shape
        (2, 8)
    """

    def __init__(self, embed_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.linear1 = Linear(embed_dim, hidden_dim)
        self.activation = GELU()
        self.linear2 = Linear(hidden_dim, embed_dim)

    def forward(self, x: Any) -> Tensor:
        return self.linear2(self.activation(self.linear1(x)))


class TransformerBlock(Module):
    """Pre-norm block: ``x + attention(ln1(x))``, then ``+ mlp(ln2(.))``.

    ``mlp_hidden_dim`` defaults to ``4 * embed_dim``.

    Example::

        >>> blk = TransformerBlock(8, 2, 16)
        >>> [name for name, _ in blk.named_children()]
        ['attention', 'ln1', 'ln2', 'mlp']
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        mlp_hidden_dim: int | None = None,
        causal: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int(embed_dim, "embed_dim", "TransformerBlock")
        hidden = 4 * embed_dim if mlp_hidden_dim is None else mlp_hidden_dim
        check_positive_int(hidden, "mlp_hidden_dim", "TransformerBlock")
        self.embed_dim = embed_dim
        self.attention = MultiHeadAttention(embed_dim, num_heads, causal=causal)
        self.ln1 = LayerNorm(embed_dim)
        self.ln2 = LayerNorm(embed_dim)
        self.mlp = MLP(embed_dim, hidden)

    def forward(self, x: Any, mask: Any = None) -> Tensor:
        x = as_tensor(x)
        x = add(x, self.attention(self.ln1(x), mask=mask))
        return add(x, self.mlp(self.ln2(x)))
