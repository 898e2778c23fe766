"""Backward FLOPs of torch layers and counted torch functions, as *gradient parts* of calls.

A forward call knows what its gradient will cost: each product it ran has one backward product
per operand that needs a gradient. A :data:`GradientPart` ``(flops, needs)`` is one such piece:
the pass does it when ANY tensor named in ``needs`` needs a gradient. An ``int`` names a
positional argument (every tensor inside it if it is a tuple or list: an LSTM's ``(h0, c0)``,
einsum's operand list); a ``str`` a layer's parameter as ``named_parameters`` spells it
(``"self_attn.in_proj_weight"``) or a function's keyword argument. Parts are *inclusive*, like
the forward rules (a TransformerEncoderLayer's include its children's): a backward pass charges
such a layer what its children did not charge themselves, as the fold does with forward FLOPs.

What is counted is what ``torch.utils.flop_counter.FlopCounterMode`` counts in a backward pass
(mm/addmm/bmm/baddbmm, convolution and attention backward; FLOPs = 2 x MACs). Not ``mv`` or
``dot``: ``matmul`` run as one has no parts. Where FlopCounterMode is wrong or blind, the work
the kernel does: a grouped convolution's weight gradient costs the forward's FLOPs (it counts
``groups`` times that); Bilinear's ``_trilinear``, CPU oneDNN LSTMs and CPU flash attention run
products it cannot see.

============================  ==================================================================
Linear, Conv(Transpose),      one part per operand (input, weight, bilinear's second input),
Bilinear, mm, bmm, addmm,     each the forward product's FLOPs; a bias gradient is a sum, not
baddbmm, matmul, functions,   counted
LinearCrossEntropyLoss
einsum                        per pairwise ``bmm`` ATen runs, one part per side
scaled_dot_product_attention  the fused kernels: scores recomputed, dP = dO·vᵀ, dV, dQ, dK,
                              all once any of q, k, v needs a gradient (the kernel computes
                              all three); the math kernel: dP (q or k), dV (v), dQ (q), dK (k)
MultiheadAttention and its    projections per operand; the attention as the kernel that runs:
function (F.multi_head_       as scaled_dot_product_attention's where a fused one does
attention_forward)            (``need_weights=False``, no dropout), else dP, dV, dQ, dK (the
                              weights are kept: ``need_weights``' bmm, the math kernel); the
                              output projection
RNN, LSTM, GRU, cells         per layer and direction: input projection (input; weight); hidden
                              product: weight over all steps, hidden gradient after the first
                              step (anything upstream) and at it (``hx``); LSTM projection alike
============================  ==================================================================

Example:
    >>> import torch
    >>> layer = torch.nn.Linear(4, 3)
    >>> x = torch.zeros(2, 4)
    >>> layer_gradient_parts(layer, (x,), layer(x))
    [(48, (0,)), (48, ('weight',))]
"""
from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence
from math import prod
from typing import Any, Callable, NamedTuple, Union

import torch
from torch import nn

from tracetorch.flops import torch_rules
from tracetorch.flops.torch_functions import (
    ATTENTION_PARAMETERS,
    CallFormula,
    Shape,
    bound_attention,
    chain_operands,
    chain_products,
    real_arithmetic,
    torch_function_formulas,
)

__all__ = ("Needs", "GradientPart", "layer_gradient_parts", "function_gradient_parts",
           "einsum_contractions")

Needs = tuple[Union[int, str], ...]
#: FLOPs of one piece of gradient work, and what must need a gradient for the pass to do it:
#: the work is done when ANY of the named tensors needs a gradient.
GradientPart = tuple[int, Needs]
LayerFormula = Callable[[Any, tuple[Any, ...], Any], list[GradientPart]]
PartsFormula = Callable[[tuple[Any, ...], dict[str, Any], Any], Union[list[GradientPart], None]]


def _union(*groups: Needs) -> Needs:
    return tuple(dict.fromkeys(need for group in groups for need in group))


def _params(layer: nn.Module, prefix: str) -> Needs:
    return tuple(name for name, _ in layer.named_parameters() if name.startswith(prefix))


def _has(layer: nn.Module, name: str) -> bool:
    # Whether a layer has the tensor ``name``, without computing a parametrized one
    # (torch.nn.utils.parametrize), which would run its parametrization.
    return (layer._parameters.get(name) is not None
            or nn.utils.parametrize.is_parametrized(layer, name)
            or getattr(layer, name, None) is not None)


def _kept(parts: list[GradientPart]) -> list[GradientPart]:
    return [(flops, needs) for flops, needs in parts if flops and needs]


# ----------------------------------------------------------------------------- layers
def _per_operand(rule: Callable[..., Any], operands: Needs) -> LayerFormula:
    """Layers whose every operand's gradient is one product the size of the forward one (the
    weight gradient of a grouped convolution included, where FlopCounterMode counts more)."""
    def formula(layer: nn.Module, inputs: tuple[Any, ...], output: Any) -> list[GradientPart]:
        flops = rule(layer, inputs, output).gemm
        return [(flops, (need,)) for need in operands]
    return formula


def _stand_in(like: torch.Tensor, shape: tuple[int, ...], requires_grad: bool) -> torch.Tensor:
    # What the attention kernel choice reads of a tensor of ``shape`` (sizes, dtype, device, a
    # last stride of 1) without its memory: one row, expanded.
    row = like.new_empty(shape[-1:]).requires_grad_(requires_grad)
    return row.expand(shape)


class _Attention(NamedTuple):
    """What the gradient parts of one multi-head attention call depend on, from the layer
    (nn.MultiheadAttention) or from the arguments of F.multi_head_attention_forward: its sizes,
    whether torch's fused kernel ran (it recomputes the scores in backward), and what makes a
    tensor of it need a gradient (``where(name)``: the need naming that weight or bias, empty
    where there is none; names as the layer's parameters, ``out_proj.weight`` included)."""

    embed: int
    kdim: int
    vdim: int
    dims: tuple[int, int, int]  # sequences, queries, source positions
    keys: int  # positions each query attends to: the source, bias_k's, add_zero_attn's
    recompute: bool
    where: Callable[[str], Needs]


def _fused_kernel(like: torch.Tensor, heads: int, embed: int, dims: tuple[int, int, int],
                  keys: int, dropout: float, need_weights: bool, padding: Any, mask: Any,
                  causal: bool) -> bool:
    """Whether an attention call's attention is a fused kernel's, which recomputes the scores in
    backward (as :func:`_sdpa` counts them): not with ``need_weights`` (plain ``bmm`` products
    that keep the weights), nor where torch picks the math kernel (dropout, a mask that needs a
    gradient...). The kernel is asked as F.multi_head_attention_forward calls it: (N, heads,
    L or S, head size), the padding and attention masks merged into one of the query's dtype."""
    if need_weights or not isinstance(like, torch.Tensor):
        return False
    if causal and padding is None:
        mask = None  # the causal hint goes to the kernel as is
    else:
        causal = False  # a padding mask merged into the attention mask: no longer causal
    masks = [m for m in (mask, padding) if isinstance(m, torch.Tensor)]
    n, length, _ = dims
    q, k, v = (_stand_in(like, (n, heads, rows, embed // heads), True)
               for rows in (length, keys, keys))
    merged = (_stand_in(like, (n, heads, length, keys), any(m.requires_grad for m in masks))
              if masks else None)
    return not _math_kernel(q, k, v, merged, dropout, causal)


def _layer_attention(mha: nn.MultiheadAttention, prefix: str, inputs: tuple[Any, ...],
                     dims: tuple[int, int, int]) -> _Attention:
    """A layer's attention; ``inputs`` as its ``forward`` takes them, parameter names with
    ``prefix``."""
    def argument(index: int, default: Any) -> Any:
        return inputs[index] if len(inputs) > index else default

    def where(name: str) -> Needs:
        return (prefix + name,) if name == "out_proj.weight" or _has(mha, name) else ()

    keys = dims[2] + _has(mha, "bias_k") + mha.add_zero_attn
    recompute = _fused_kernel(
        inputs[0], mha.num_heads, mha.embed_dim, dims, keys,
        float(mha.dropout) if mha.training else 0.0, argument(4, True), argument(3, None),
        argument(5, None), bool(argument(7, False)))
    return _Attention(mha.embed_dim, mha.kdim, mha.vdim, dims, keys, recompute, where)


def _mha_parts(attention: _Attention, operands: tuple[Needs, Needs, Needs]
               ) -> list[GradientPart]:
    """Multi-head attention off the fast path: projections, attention, output projection; the
    scores recomputed first where a fused kernel ran. ``operands``: what makes query, key and
    value need a gradient."""
    n, length, source = attention.dims
    e, where = attention.embed, attention.where
    packed = bool(where("in_proj_weight"))
    weights = (("in_proj_weight",) * 3 if packed
               else ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
    bias = where("in_proj_bias")
    q = _union(operands[0], where(weights[0]), bias)
    k = _union(operands[1], where(weights[1]), bias, where("bias_k"))
    v = _union(operands[2], where(weights[2]), bias, where("bias_v"))
    parts: list[GradientPart] = []
    for rows, width, needs, weight in ((length, e, operands[0], weights[0]),
                                       (source, attention.kdim, operands[1], weights[1]),
                                       (source, attention.vdim, operands[2], weights[2])):
        projection = 2 * n * rows * width * e
        parts += [(projection, needs), (projection, where(weight))]
    attend = 2 * n * length * attention.keys * e  # each of dP = dO·vᵀ, dV = Pᵀ·dO, dQ = dS·k,
    out = 2 * n * length * e * e                   # dK = dSᵀ·q
    qkv = _union(q, k, v)
    if attention.recompute:  # a fused kernel computes all of dQ, dK and dV once any is needed
        parts += [(attend, qkv)] * 5
    else:
        parts += [(attend, _union(q, k)), (attend, v), (attend, q), (attend, k)]
    return parts + [(out, qkv), (out, where("out_proj.weight"))]


#: The argument of F.multi_head_attention_forward holding each weight and bias of the layer,
#: by the layer's parameter name (the q/k/v weights are used with separate projections only).
_ATTENTION_ARGUMENTS = {"in_proj_bias": "in_proj_bias", "bias_k": "bias_k", "bias_v": "bias_v",
                        "out_proj.weight": "out_proj_weight"}


def _attention_function(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
                        ) -> list[GradientPart]:
    """F.multi_head_attention_forward: as nn.MultiheadAttention's parts, each weight and bias
    named by its argument."""
    bound = bound_attention(args, kwargs)
    query, key, value = bound["query"], bound["key"], bound["value"]
    separate = bool(bound.get("use_separate_proj_weight", False))
    arguments = dict(_ATTENTION_ARGUMENTS)
    for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight") if separate else (
            "in_proj_weight",):
        arguments[name] = name

    def where(name: str) -> Needs:
        argument = arguments.get(name)
        if argument is None or bound.get(argument) is None:
            return ()
        return (_where(args, kwargs, ATTENTION_PARAMETERS.index(argument), argument),)

    dims = (int(query.shape[1]) if query.dim() == 3 else 1, int(query.shape[0]),
            int(key.shape[0]))
    keys = dims[2] + (bound.get("bias_k") is not None) + bool(bound.get("add_zero_attn"))
    embed = int(bound["embed_dim_to_check"])
    dropout = float(bound.get("dropout_p") or 0.0) if bound.get("training", True) else 0.0
    recompute = _fused_kernel(query, int(bound["num_heads"]), embed, dims, keys, dropout,
                              bool(bound.get("need_weights", True)),
                              bound.get("key_padding_mask"), bound.get("attn_mask"),
                              bool(bound.get("is_causal", False)))
    attention = _Attention(embed, int(key.shape[-1]), int(value.shape[-1]), dims, keys,
                           recompute, where)
    return _mha_parts(attention, ((_where(args, kwargs, 0, "query"),),
                                  (_where(args, kwargs, 1, "key"),),
                                  (_where(args, kwargs, 2, "value"),)))


def _mha(layer: nn.MultiheadAttention, inputs: tuple[Any, ...], output: Any
         ) -> list[GradientPart]:
    key = inputs[1] if len(inputs) > 1 and isinstance(inputs[1], torch.Tensor) else None
    dims = torch_rules._mha_dims(layer, inputs[0], key)
    return _mha_parts(_layer_attention(layer, "", inputs, dims), ((0,), (1,), (2,)))


def _encoder_layer(layer: nn.TransformerEncoderLayer, inputs: tuple[Any, ...], output: Any
                   ) -> list[GradientPart]:
    """Training path: self-attention (``need_weights=False``, with the layer's masks), then
    linear1, linear2; the norms decide what feeds what (``norm_first``)."""
    n, length, _ = torch_rules._mha_dims(layer.self_attn, inputs[0], None)
    x, mask, padding, causal = (*inputs, None, None, False)[:4]
    self_attention = _layer_attention(layer.self_attn, "self_attn.",
                                      (x, x, x, padding, False, mask, False, causal),
                                      (n, length, length))
    attention, norm1, norm2 = (_params(layer, p) for p in ("self_attn.", "norm1.", "norm2."))
    into_attention: Needs = _union((0,), norm1) if layer.norm_first else (0,)
    into_ffn = _union(into_attention, attention, norm2 if layer.norm_first else norm1)
    ffn = 2 * n * length * layer.linear1.in_features * layer.linear1.out_features
    return _mha_parts(self_attention, (into_attention,) * 3) + [
        (ffn, into_ffn), (ffn, ("linear1.weight",)),
        (ffn, _union(into_ffn, _params(layer, "linear1."))), (ffn, ("linear2.weight",))]


def _sequence(layer: nn.RNNBase, x: Any) -> tuple[int, tuple[int, int]]:
    """Rows over all steps, and rows at the first step of each direction (a packed sequence's
    reverse direction starts with its shortest batch)."""
    if isinstance(x, nn.utils.rnn.PackedSequence):
        sizes = x.batch_sizes.tolist()
        return sum(sizes), (sizes[0], sizes[-1])
    if x.dim() == 2:  # unbatched (L, H_in)
        return x.shape[0], (1, 1)
    batch = x.shape[0 if layer.batch_first else 1]
    return x.shape[0] * x.shape[1], (batch, batch)


def _recurrent(layer: nn.RNNBase, inputs: tuple[Any, ...], output: Any) -> list[GradientPart]:
    """RNN/LSTM/GRU as ATen runs them on CPU: per layer and direction, one input projection over
    all steps, then per step the hidden product (and an LSTM's projection). A step's hidden
    gradient is needed once anything upstream needs one; the first step's only for ``hx``."""
    rows, firsts = _sequence(layer, inputs[0])
    h, proj = layer.hidden_size, layer.proj_size
    gates = {"LSTM": 4, "GRU": 3}.get(layer.mode, 1)  # not read off a weight: see _has
    hx: Needs = (1,) if len(inputs) > 1 and inputs[1] is not None else ()
    into: Needs = (0,)  # what makes this layer's input need a gradient
    parts: list[GradientPart] = []
    for index in range(layer.num_layers):
        width = layer.input_size if index == 0 else (proj or h) * (1 + layer.bidirectional)
        below = into
        for direction, first in enumerate(firsts[:1 + layer.bidirectional]):
            suffix = f"_l{index}" + ("_reverse" if direction else "")
            own = tuple(name + suffix for name in ("weight_ih", "bias_ih", "weight_hh", "bias_hh",
                                                   "weight_hr")
                        if _has(layer, name + suffix))
            upstream = _union(below, hx, own)
            ih = 2 * rows * width * gates * h
            hh = 2 * gates * h * (proj or h)
            parts += [(ih, below), (ih, ("weight_ih" + suffix,)),
                      (rows * hh, ("weight_hh" + suffix,)),
                      ((rows - first) * hh, upstream), (first * hh, hx)]
            if proj:  # h_t = W_hr·h'_t: h'_0 does not depend on W_hr
                hr = 2 * h * proj
                parts += [(rows * hr, ("weight_hr" + suffix,)), ((rows - first) * hr, upstream),
                          (first * hr, tuple(n for n in upstream if n != "weight_hr" + suffix))]
            into = _union(into, hx, own)
    return parts


def _cell(layer: nn.RNNCellBase, inputs: tuple[Any, ...], output: Any) -> list[GradientPart]:
    """RNNCell/LSTMCell/GRUCell: the input and hidden products of one step."""
    x = inputs[0]
    rows = 1 if x.dim() == 1 else x.shape[0]
    ih = 2 * rows * layer.input_size * layer.weight_ih.shape[0]
    hh = 2 * rows * layer.hidden_size * layer.weight_hh.shape[0]
    hx: Needs = (1,) if len(inputs) > 1 and inputs[1] is not None else ()
    return [(ih, (0,)), (ih, ("weight_ih",)), (hh, hx), (hh, ("weight_hh",))]


_LAYERS: dict[type, LayerFormula] = {
    nn.Linear: _per_operand(torch_rules.linear_rule, (0, "weight")),
    nn.Bilinear: _per_operand(torch_rules.bilinear_rule, (0, 1, "weight")),
    **({nn.LinearCrossEntropyLoss: _per_operand(torch_rules.linear_cross_entropy_rule,
                                                (0, "linear.weight"))}
       if hasattr(nn, "LinearCrossEntropyLoss") else {}),  # torch 2.13 and later
    nn.MultiheadAttention: _mha,
    nn.TransformerEncoderLayer: _encoder_layer,
    nn.RNNBase: _recurrent,
    nn.RNNCellBase: _cell,
    **dict.fromkeys((nn.Conv1d, nn.Conv2d, nn.Conv3d),
                    _per_operand(torch_rules.conv_rule, (0, "weight"))),
    **dict.fromkeys((nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d),
                    _per_operand(torch_rules.conv_transpose_rule, (0, "weight"))),
}


def layer_gradient_parts(layer: Any, inputs: tuple[Any, ...], output: Any
                         ) -> list[GradientPart] | None:
    """The gradient parts of one call of a torch layer with a built-in FLOP rule (looked up along
    the layer type's MRO, as the rules are); ``None`` for a type without a formula (elementwise
    layers: their gradients are no GEMM work). Takes what the rule takes.

    Example:
        >>> import torch
        >>> conv = torch.nn.Conv1d(4, 4, 3, groups=2, bias=False)
        >>> x = torch.zeros(1, 4, 10)
        >>> layer_gradient_parts(conv, (x,), conv(x))   # weight: as the forward, 2·1·4·2·3·8
        [(384, (0,)), (384, ('weight',))]
        >>> layer_gradient_parts(torch.nn.ReLU(), (x,), x) is None
        True
    """
    for klass in type(layer).__mro__:
        formula = _LAYERS.get(klass)
        if formula is not None:
            return _kept(formula(layer, inputs, output))
    return None


# ----------------------------------------------------------------------------- functions
def _where(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> int | str:
    return index if len(args) > index else name


def _value(args: tuple[Any, ...], kwargs: dict[str, Any], where: int | str) -> Any:
    return args[where] if isinstance(where, int) else kwargs[where]


def _operands(forward: CallFormula, operands: Sequence[tuple[int, str]]) -> PartsFormula:
    """Functions whose every operand's gradient is one product the size of the forward one."""
    def parts(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> list[GradientPart]:
        flops = forward(args, kwargs, result)
        return [(flops, (_where(args, kwargs, i, name),)) for i, name in operands]
    return parts


def _chain(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> list[GradientPart]:
    """multi_dot / chain_matmul: per product of the chain, each factor's gradient is one product
    the size of it, done where some operand inside that factor needs a gradient. ``multi_dot``'s
    operands are one list (one need): a part is kept where its factor holds an operand that
    requires a gradient at this call."""
    matrices = chain_operands(args, kwargs)
    listed = len(args) == 1 or "tensors" in kwargs
    real = real_arithmetic(result)
    parts: list[GradientPart] = []
    for product, *factors in chain_products([tuple(m.shape) for m in matrices]):
        flops = real * product
        for factor in factors:
            if listed:
                if any(matrices[i].requires_grad for i in factor):
                    parts.append((flops, (_where(args, kwargs, 0, "tensors"),)))
            else:
                parts.append((flops, tuple(factor)))
    return parts


def _matrix_vector(t1: torch.Tensor, t2: torch.Tensor) -> bool:
    """Whether ``torch.matmul(t1, t2)`` runs as ``dot``/``mv`` (uncounted) rather than ``mm``/
    ``bmm``: ATen's choice (``should_fold``), which looks at ``requires_grad`` and strides."""
    if t1.dim() <= 2 and t2.dim() <= 2:
        return t2.dim() == 1  # dot or mv; a 1-D first operand is unsqueezed into mm
    big, small = (t1, t2) if t1.dim() >= t2.dim() else (t2.mT, t1)
    if small.dim() != 1:
        return False  # folded into mm, or bmm
    if small.requires_grad or big.numel() == 0:
        return True
    # folded into mv only if the batch dimensions flatten without a copy, else bmm
    return all(big.stride(i) == big.stride(i + 1) * big.shape[i + 1]
               for i in range(big.dim() - 2))


def _matmul(forward: CallFormula, reflected: bool) -> PartsFormula:
    def parts(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> list[GradientPart]:
        where = [_where(args, kwargs, 0, "input"), _where(args, kwargs, 1, "other")]
        if reflected:  # Tensor.__rmatmul__(self, other) is other @ self
            where.reverse()
        if _matrix_vector(*(_value(args, kwargs, w) for w in where)):
            return []
        flops = forward(args, kwargs, result)
        return [(flops, (w,)) for w in where]
    return parts


def einsum_contractions(equation: str, shapes: Sequence[Shape],
                        path: Sequence[int] | None = None
                        ) -> list[tuple[int, frozenset[int], frozenset[int]]]:
    """The ``bmm`` products ``torch.einsum`` runs, as ATen pairs the operands: left to right, or
    along ``path`` (opt_einsum's, flattened); an index only one operand still has is summed
    first, and a pair with nothing to contract is multiplied without a product. Each as
    ``(FLOPs, operands feeding the left side, operands feeding the right side)``.

    Example:
        >>> einsum_contractions("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)])
        [(240, frozenset({0}), frozenset({1}))]
        >>> einsum_contractions("ij,jk->i", [(2, 3), (3, 4)])   # k is summed before the product
        [(12, frozenset({0}), frozenset({1}))]
    """
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = [term.replace("...", ".") for term in lhs.split(",")]  # "." stands for the ellipsis
    ellipsis = max((len(s) - len(t) + 1 for t, s in zip(terms, shapes) if "." in t), default=0)
    letters = "".join(terms)
    output: set[Any] = set(rhs.replace("...", "") if arrow
                           else (c for c in letters if letters.count(c) == 1))
    if not arrow or "..." in rhs:
        output.update(range(ellipsis))  # the ellipsis's dimensions are keyed 0, 1, ...
    ops: deque[tuple[dict[Any, int], frozenset[int]]] = deque()
    counts: dict[Any, int] = {}  # operands where an index has a size other than 1
    for i, (term, shape) in enumerate(zip(terms, shapes)):
        sizes: dict[Any, int] = {}
        dims = iter(shape)
        for label in term:
            if label == ".":
                covered = len(shape) - len(term) + 1
                sizes.update((j, next(dims)) for j in range(ellipsis - covered, ellipsis))
            else:
                sizes.setdefault(label, next(dims))  # a repeated label takes the diagonal
        for key, size in sizes.items():
            counts[key] = counts.get(key, 0) + (size != 1)
        ops.append((sizes, frozenset({i})))
    contracted = [key for key in counts if key not in output]
    steps = iter(path or ())
    found = []
    while len(ops) > 1:
        i, j = sorted((next(steps), next(steps))) if path else (0, 1)
        (a, left), (b, right) = ops[i], ops[j]
        del ops[j], ops[i]
        a, b = dict(a), dict(b)
        summed = []
        for key in contracted:
            size_a, size_b = a.get(key, 1), b.get(key, 1)
            if size_a != 1 and size_b != 1:
                counts[key] -= 1
                if counts[key] == 1:  # no other operand has it: contract it in this product
                    summed.append(key)
                    counts[key] = 0
            elif counts[key] == 1 and size_a * size_b != 1:  # only one side has it: sum it now
                (a if size_a != 1 else b)[key] = 1
                counts[key] = 0
        merged = {key: max(a.get(key, 1), b.get(key, 1)) for key in a.keys() | b.keys()}
        if summed:
            found.append((2 * prod(merged.values()), left, right))
            merged.update(dict.fromkeys(summed, 1))
        (ops.append if path else ops.appendleft)((merged, left | right))  # as ATen places it
    return found


def _einsum_path(equation: str, operands: Sequence[Any]) -> list[int] | None:
    # torch.einsum hands ATen opt_einsum's order for more than two operands, when it can.
    backend = torch.backends.opt_einsum
    if len(operands) <= 2 or not backend.enabled or not backend.is_available():
        return None
    steps = backend.get_opt_einsum().contract_path(equation, *operands,
                                                   optimize=backend.strategy)[0]
    return [index for step in steps for index in step]


def _einsum(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
            ) -> list[GradientPart] | None:
    if not args or not isinstance(args[0], str):
        return None  # the sublist form is not costed, as in the forward formula
    operands = args[1:]
    listed = len(operands) == 1 and isinstance(operands[0], (list, tuple))
    if listed:
        operands = tuple(operands[0])
    contractions = einsum_contractions(args[0], [tuple(t.shape) for t in operands],
                                       _einsum_path(args[0], operands))
    real = real_arithmetic(result)
    return [(real * flops, tuple(sorted({1 if listed else i + 1 for i in side})))
            for flops, *sides in contractions for side in sides]


_SDPA_OPTIONS: tuple[tuple[str, int, Any], ...] = (
    ("attn_mask", 3, None), ("dropout_p", 4, 0.0), ("is_causal", 5, False))


def _math_kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any,
                 dropout: float, causal: bool, scale: float | None = None, gqa: bool = False
                 ) -> bool:
    """Whether torch runs this attention as plain products (the math kernel: a mask that needs
    a gradient, dropout or an unusual head size on CPU...), which keep the weights and need no
    recompute."""
    try:
        choice = torch._fused_sdp_choice(query, key, value, mask, dropout, causal, scale=scale,
                                         enable_gqa=gqa)
    except (RuntimeError, TypeError, AttributeError):  # no answer: the fused kernels' formula
        return False
    return int(choice) == int(torch.nn.attention.SDPBackend.MATH)


def _runs_math_kernel(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    mask, dropout, causal = (kwargs.get(name, args[index] if len(args) > index else default)
                             for name, index, default in _SDPA_OPTIONS)
    q, k, v = (_value(args, kwargs, _where(args, kwargs, i, name))
               for i, name in enumerate(("query", "key", "value")))
    return _math_kernel(q, k, v, mask, float(dropout), bool(causal), scale=kwargs.get("scale"),
                        gqa=bool(kwargs.get("enable_gqa", False)))


def _sdpa(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> list[GradientPart]:
    """The kernel's backward: dP = dO·vᵀ, dV, dQ, dK, and for the fused kernels (flash,
    memory-efficient: FlopCounterMode's formula) the scores q·kᵀ recomputed first."""
    q, k, v = (_where(args, kwargs, i, name) for i, name in enumerate(("query", "key", "value")))
    qs, ks, vs = (_value(args, kwargs, w).shape for w in (q, k, v))
    scores = 2 * prod(qs[:-2]) * qs[-2] * ks[-2]
    e, ev = scores * qs[-1], scores * vs[-1]
    if _runs_math_kernel(args, kwargs):  # plain products: each gradient where it is needed
        return [(ev, (q, k)), (ev, (v,)), (e, (q,)), (e, (k,))]
    # A fused kernel's backward computes all of dQ, dK and dV once any is needed.
    return [(flops, (q, k, v)) for flops in (e, ev, ev, e, e)]


_OPERANDS: dict[str, tuple[tuple[int, str], ...]] = {
    "mm": ((0, "input"), (1, "mat2")), "bmm": ((0, "input"), (1, "mat2")),
    "addmm": ((1, "mat1"), (2, "mat2")), "baddbmm": ((1, "batch1"), (2, "batch2")),
    "linear": ((0, "input"), (1, "weight")),
    "linear_cross_entropy": ((0, "input"), (1, "linear_weight")),
    "tensordot": ((0, "a"), (1, "b")), "inner": ((0, "input"), (1, "other")),
    "grouped_mm": ((0, "mat_a"), (1, "mat_b")),
    "bilinear": ((0, "input1"), (1, "input2"), (2, "weight")),
    **{f"conv{t}{d}d": ((0, "input"), (1, "weight")) for t in ("", "_transpose") for d in "123"},
}


@functools.cache
def _function_formulas() -> dict[Callable[..., Any], PartsFormula]:
    table: dict[Callable[..., Any], PartsFormula] = {}
    for func, (name, forward, gemm) in torch_function_formulas().items():
        if not gemm:
            continue  # elementwise gradients are not counted for torch
        if name == "matmul":
            table[func] = _matmul(forward, func is torch.Tensor.__rmatmul__)
        elif name == "einsum":
            table[func] = _einsum
        elif name == "multi_dot":
            table[func] = _chain
        elif name == "multi_head_attention_forward":
            table[func] = _attention_function
        elif name == "scaled_dot_product_attention":
            table[func] = _sdpa
        elif name in _OPERANDS:
            table[func] = _operands(forward, _OPERANDS[name])
    return table


def function_gradient_parts(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                            result: Any) -> list[GradientPart] | None:
    """The gradient parts of one call of a function of
    :func:`~tracetorch.flops.torch_functions.torch_function_formulas` (the same arguments as its
    formula); ``None`` for another function, or a call form that is not costed.

    Example:
        >>> import torch
        >>> a, b = torch.zeros(4, 5), torch.zeros(5, 6)
        >>> function_gradient_parts(torch.mm, (a,), {"mat2": b}, a @ b)
        [(240, (0,)), (240, ('mat2',))]
        >>> function_gradient_parts(torch.matmul, (a, b[:, 0]), {}, a @ b[:, 0])   # mv: uncounted
        []
    """
    formula = _function_formulas().get(func)
    parts = formula(args, kwargs, result) if formula is not None else None
    return None if parts is None else _kept(parts)
