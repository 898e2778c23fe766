"""FLOPs of the torch functions counted where they run: matrix products, convolutions, attention,
and the elementwise maths, reductions, normalizations and losses of
:mod:`tracetorch.flops.elementwise` (every spelling: ``torch.add``, ``Tensor.add``, ``+``,
``add_``, ``F.gelu``...).

The torch adapter counts these calls through a ``TorchFunctionMode`` (see
:mod:`tracetorch.adapters.torch.ops`), which receives each call as a function object: the one a
user reaches by any spelling. :func:`torch_function_formulas` maps exactly those objects to a
report name and a formula of the call's arguments and result. What arrives, on torch 2.13:

=====================================================  ==========================================
called as                                              ``func`` the mode receives
=====================================================  ==========================================
``torch.matmul(a, b)``                                 ``torch.matmul``
``a @ b``, ``a.matmul(b)``, ``Tensor.__matmul__``      ``torch.Tensor.matmul``
``b.__rmatmul__(a)`` (``a`` not a tensor)              ``torch.Tensor.__rmatmul__``
``torch.mm`` / ``a.mm`` (``bmm``, ``addmm``,           the ``torch.*`` function / the
``baddbmm`` and the in-place ``addmm_``, ``baddbmm_``)  ``torch.Tensor`` method
``torch.einsum``                                       ``torch.functional.einsum`` (the same)
``F.linear``                                           ``torch._C._nn.linear`` (the same)
``F.bilinear``, ``F.conv2d``, ``F.conv_transpose2d``…  ``torch.bilinear``, ``torch.conv2d``…
                                                       (the same objects)
``F.scaled_dot_product_attention``                     ``torch._C._nn.scaled_dot_product_attention``
=====================================================  ==========================================

Counted with FLOPs = 2 x MACs for the product; a bias or added input fused into the call is not
counted, as in the layer rules and in PyTorch's own counter:

============================================  ==================================================
``matmul``, ``@``, ``linalg.matmul``          2·batch·M·K·N (broadcast batch; 1-D operands too)
``mm`` / ``bmm``                              2·M·K·N / 2·B·M·K·N
``addmm`` / ``baddbmm``                       as mm / bmm
``einsum``                                    2 x product of all distinct index sizes for two
                                              operands; more operands are contracted left to
                                              right, each pair costed the same way; one operand 0
``linear`` / ``bilinear``                     2·rows·in·out / 2·rows·out·in1·in2
``linear_cross_entropy``                      as ``linear`` to the logits it never returns; the
                                              cross entropy of those apart (``cross_entropy``)
``conv1d/2d/3d``                              2·N·C_out·prod(out spatial)·C_in/groups·prod(k)
``conv_transpose1d/2d/3d``                    2·N·prod(in spatial)·C_in·C_out/groups·prod(k)
``scaled_dot_product_attention``              2·batch·L·S·(E + E_v): the two products; the
                                              causal mask is not discounted (as FlopCounterMode)
``tensordot``, ``inner``                      2 x result elements x contracted size
``linalg.multi_dot``, ``chain_matmul``        the products in the cheapest order (torch's)
``multi_head_attention_forward``              as ``nn.MultiheadAttention``'s products
``grouped_mm`` (MoE experts)                  2·M·K·N over the groups (rows past ``offs[-1]``
                                              included: reading ``offs`` would synchronize)
``_int_mm``, ``_scaled_mm`` (int8, float8)    as ``mm`` (the float product of the same shapes)
``_weight_int8pack_mm``, ``int4pack_mm``      as ``linear``
============================================  ==================================================

Products of vectors are counted apart from the matrix products (``torch.utils.flop_counter``
counts none of them): ``mv``, ``addmv``, ``dot``, ``vdot`` 2 per element of the matrix or
vector, ``linalg.vecdot`` 2 per product summed, ``addbmm`` as ``bmm``, ``outer``/``ger``,
``addr`` and ``kron`` 1 per output element, ``cdist`` 3 per pair of points and coordinate and a
root per pair. ``torch._foreach_<f>`` (and its in-place ``_foreach_<f>_``), which optimizers'
foreach paths and ``clip_grad_norm_`` run over lists of tensors, costs ``<f>``'s FLOPs over
every element of the first list (``_foreach_norm`` a norm's 2 per element). The functions of
torch's pooling, resampling, bag and weight-norm layers cost
what the layers' rules count (:mod:`tracetorch.flops.layer_functions`); the functions of
:func:`uncounted_functions` compute with no formula here, and leave their layer's FLOPs
unknown.

A product of complex tensors counts its real arithmetic: a complex multiply-add is 4 real
multiplies and 4 real adds, 4 x the FLOPs above (``FlopCounterMode`` counts it as a real one).
Fourier transforms (``torch.fft``) are no products: 5·N·log2(N) per complex transform of N
points and 2.5·N·log2(N) per transform with a real side (``rfft``, ``irfft``, ``hfft``,
``ihfft`` and their 2-D and n-D forms), N the product of the transformed lengths (the padded or
trimmed ones), the radix-2 count that FFTW's benchmarks use; a transform of 1 point costs 0.
``stft`` is a transform of ``n_fft`` points per frame (a real one while one-sided), plus the
window's ``n_fft`` multiplies where one is given and one scale per output bin where
``normalized``; ``istft`` a transform per frame, the window's multiplies and the overlap-add's
adds (``n_fft`` each), one more scale per bin where ``normalized``, and a division per output
sample by the windows' sum.

Example:
    >>> matmul_flops((8, 4, 16), (16, 32))     # 8 x (4x16 @ 16x32)
    32768
    >>> einsum_flops("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)])
    240
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from math import isqrt, log2, prod
from typing import Any, Callable

from tracetorch.flops.elementwise import (
    CRITERIA,
    DATA_MOVEMENT,
    FOLDED_FACTORS,
    NORMALIZATIONS,
    PER_ELEMENT,
    PER_INPUT_ELEMENT,
    criterion_flops,
    loss_flops,
    normalization_flops,
    scalar_factor,
)
from tracetorch.flops.layer_functions import layer_function_table

__all__ = ("Shape", "CallFormula", "COMPANIONS", "CRITERION_PARAMETERS", "matmul_flops",
           "einsum_flops", "linear_cross_entropy_flops",
           "conv_flops", "sdpa_flops", "fft_flops", "chain_products", "chain_operands",
           "ATTENTION_PARAMETERS", "attention_products", "bound_attention",
           "real_arithmetic", "torch_function_formulas", "data_movement_functions",
           "uncounted_functions")

Shape = tuple[int, ...]
#: The FLOPs of one call, from its positional arguments, keyword arguments and result.
CallFormula = Callable[[tuple[Any, ...], dict[str, Any], Any], int]


# ----------------------------------------------------------------------------- shape formulas
def matmul_flops(a: Shape, b: Shape) -> int:
    """FLOPs of ``torch.matmul`` on operands of these shapes (broadcast batch dimensions).

    Example:
        >>> matmul_flops((5,), (5,)), matmul_flops((3, 5), (5,))
        (10, 30)
    """
    if not a or not b:
        return 0
    if len(a) == 1 and len(b) == 1:
        return 2 * a[0]
    m = 1 if len(a) == 1 else a[-2]
    k = a[-1]
    n = 1 if len(b) == 1 else b[-1]
    batch_a = a[:-2] if len(a) > 2 else ()
    batch_b = b[:-2] if len(b) > 2 else ()
    return 2 * _broadcast_numel(batch_a, batch_b) * m * k * n


def _broadcast_numel(a: Shape, b: Shape) -> int:
    size = 1
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else 1
        db = b[-i] if i <= len(b) else 1
        size *= max(da, db)
    return size


def einsum_flops(equation: str, shapes: Sequence[Shape]) -> int:
    """FLOPs of ``torch.einsum``: 2 x (product of the distinct index sizes) per pairwise
    contraction, operands contracted left to right; a single operand counts 0.

    Example:
        >>> einsum_flops("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)])   # (2x3x4) then (2x4x5)
        128
    """
    if len(shapes) < 2:
        return 0
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(shapes):
        return 0
    sizes: dict[str, int] = {}
    terms: list[str] = []
    ellipsis_rank = max((len(s) - (len(t) - 3) for t, s in zip(inputs, shapes) if "..." in t),
                        default=0)
    batch_letters = [chr(0x100 + i) for i in range(ellipsis_rank)]  # never clash with a-zA-Z
    for term, shape in zip(inputs, shapes):
        if "..." in term:
            head, tail = term.split("...")
            n_ell = len(shape) - len(head) - len(tail)
            term = head + "".join(batch_letters[ellipsis_rank - n_ell:]) + tail
        for letter, size in zip(term, shape):
            sizes[letter] = max(sizes.get(letter, 1), int(size))
        terms.append(term)
    if arrow:
        out = rhs.replace("...", "".join(batch_letters))
    else:  # implicit output: the letters used once, alphabetically, after the broadcast dims
        counts: dict[str, int] = {}
        for term in terms:
            for letter in term:
                counts[letter] = counts.get(letter, 0) + 1
        out = "".join(batch_letters) + "".join(
            sorted(c for c, n in counts.items() if n == 1 and c not in batch_letters))
    flops = 0
    current = terms[0]
    for i in range(1, len(terms)):
        other = terms[i]
        letters = set(current) | set(other)
        flops += 2 * prod(sizes[c] for c in letters)
        needed = set(out).union(*[set(t) for t in terms[i + 1:]])
        current = "".join(c for c in dict.fromkeys(current + other) if c in needed)
    return flops


def conv_flops(x: Shape, w: Shape, out: Shape, transposed: bool) -> int:
    """FLOPs (2 x MACs) of a batched convolution: every output (or, transposed, every input)
    position meets a whole filter, for every pair of channels in a group. Bias not included.

    Example:
        >>> conv_flops((1, 3, 8, 8), (16, 3, 3, 3), (1, 16, 6, 6), transposed=False)
        31104
    """
    spatial = (x if transposed else out)[2:]
    return 2 * x[0] * prod(spatial) * w[0] * w[1] * prod(w[2:])


def sdpa_flops(q: Shape, k: Shape, v: Shape) -> int:
    """FLOPs of the two products of attention: ``q @ k^T`` and ``scores @ v``.

    Example:
        >>> sdpa_flops((1, 2, 8, 4), (1, 2, 8, 4), (1, 2, 8, 4))
        2048
    """
    batch = prod(q[:-2])
    return 2 * batch * q[-2] * k[-2] * (q[-1] + v[-1])


# ----------------------------------------------------------------------------- call formulas
def _shape(value: Any) -> Shape:
    return tuple(value.shape)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _matmul(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    return matmul_flops(_shape(_arg(args, kwargs, 0, "input")),
                        _shape(_arg(args, kwargs, 1, "other")))


def _rmatmul(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    # Tensor.__rmatmul__(self, other) is other @ self.
    return matmul_flops(_shape(_arg(args, kwargs, 1, "other")), _shape(args[0]))


def _product(first: int, names: tuple[str, str]) -> CallFormula:
    """mm/bmm and their ``add`` forms: operands ``(…, m, k)`` and ``(…, k, n)`` at positions
    ``first`` and ``first + 1`` cost 2·batch·m·k·n (the added input is not counted)."""
    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        a = _shape(_arg(args, kwargs, first, names[0]))
        b = _shape(_arg(args, kwargs, first + 1, names[1]))
        return 2 * prod(a) * b[-1]
    return formula


def _contracted(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    # tensordot, inner: the result holds the free elements of both operands, each the sum of K
    # products; a·b = free_a·K·K·free_b, so K² = a·b / result (a 0-d operand: plain multiplies).
    a, b = _arg(args, kwargs, 0, "a"), _arg(args, kwargs, 1, "b")
    if a is None or b is None:  # (inner names them input, other)
        a, b = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "other")
    outputs = int(result.numel())
    if not outputs or not a.dim() or not b.dim():
        return outputs
    return 2 * outputs * isqrt(int(a.numel()) * int(b.numel()) // outputs)


def chain_products(shapes: Sequence[Shape]) -> list[tuple[int, range, range]]:
    """The products ``torch.linalg.multi_dot`` (and ``chain_matmul``) computes for matrices of
    these shapes, in the cheapest order (torch's): each one's FLOPs and the operands (ranges of
    positions) whose product its two factors are. A 1-D first or last operand is a row or
    column vector.

    Example:
        >>> chain_products([(10, 100), (100, 5), (5, 50)])    # (AB)C
        [(10000, range(0, 1), range(1, 2)), (5000, range(0, 2), range(2, 3))]
    """
    count = len(shapes)
    dims = [shapes[0][0] if len(shapes[0]) == 2 else 1]
    dims += [shape[-1] if len(shape) == 2 or i < count - 1 else 1
             for i, shape in enumerate(shapes)]
    cheapest = [[0] * count for _ in range(count)]
    split_at = [[0] * count for _ in range(count)]
    for span in range(1, count):
        for first in range(count - span):
            last = first + span
            cheapest[first][last], split_at[first][last] = min(
                (cheapest[first][split] + cheapest[split + 1][last]
                 + dims[first] * dims[split + 1] * dims[last + 1], split)
                for split in range(first, last))
    products: list[tuple[int, range, range]] = []

    def multiply(first: int, last: int) -> None:
        if first == last:
            return
        split = split_at[first][last]
        multiply(first, split)
        multiply(split + 1, last)
        products.append((2 * dims[first] * dims[split + 1] * dims[last + 1],
                         range(first, split + 1), range(split + 1, last + 1)))

    multiply(0, count - 1)
    return products


def chain_operands(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The matrices of a ``multi_dot(tensors)`` or ``chain_matmul(*matrices)`` call."""
    matrices = _arg(args, kwargs, 0, "tensors")
    return list(matrices) if isinstance(matrices, (list, tuple)) else list(args)


def _chain(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    return sum(flops for flops, _, _ in chain_products(
        [_shape(matrix) for matrix in chain_operands(args, kwargs)]))


def _rows_by_inputs(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    # A product whose weight is packed (int4): 2 per output element and input feature.
    return 2 * int(result.numel()) * int(args[0].shape[-1])


#: The parameters of ``F.multi_head_attention_forward``, in order.
ATTENTION_PARAMETERS = (
    "query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight",
    "in_proj_bias", "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight",
    "out_proj_bias", "training", "key_padding_mask", "need_weights", "attn_mask",
    "use_separate_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "static_k",
    "static_v", "average_attn_weights", "is_causal")


def attention_products(embed: int, kdim: int, vdim: int, n: int, length: int,
                       source: int, added_keys: int = 0) -> int:
    """The products of multi-head attention over ``n`` sequences of ``length`` queries and
    ``source`` keys: the q/k/v projections, the scores and the weighted sum, the output
    projection (``nn.MultiheadAttention``'s rule adds its softmax and scaling). ``added_keys``
    are attended to but not projected: ``bias_k``/``bias_v``'s row, ``add_zero_attn``'s zeros.

    Example:
        >>> attention_products(8, 8, 8, n=1, length=4, source=4)   # 3·512 + 2·256 + 512
        2560
        >>> attention_products(8, 8, 8, n=1, length=4, source=4, added_keys=2)  # + 2·2·64
        2816
    """
    projections = 2 * n * (length * embed * embed + source * kdim * embed + source * vdim * embed)
    attended = source + added_keys
    return projections + 2 * 2 * n * length * attended * embed + 2 * n * length * embed * embed


def bound_attention(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call of ``F.multi_head_attention_forward``'s arguments by name."""
    return {**dict(zip(ATTENTION_PARAMETERS, args)), **kwargs}


def _attention(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    # F.multi_head_attention_forward, (L, N, E) or unbatched (L, E): its products, as the layer's
    # rule counts them (its softmax and scaling, elementwise, are the layer rule's only).
    bound = bound_attention(args, kwargs)
    query, key, value = bound["query"], bound["key"], bound["value"]
    added = (bound.get("bias_k") is not None) + bool(bound.get("add_zero_attn"))
    return attention_products(int(bound["embed_dim_to_check"]), int(key.shape[-1]),
                              int(value.shape[-1]), int(query.shape[1]) if query.dim() == 3 else 1,
                              int(query.shape[0]), int(key.shape[0]), added)


def _grouped(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    # grouped_mm: a (groups of rows) x b (one matrix a group), or two 3-D batches: 2 per row of
    # the result, column and reduced element; two 2-D operands split the reduced dimension
    # into groups instead (the result one matrix a group): 2·M·K·N over all of them. (Rows
    # beyond offs[-1] are counted: reading offs would wait for the device.)
    a, b = _arg(args, kwargs, 0, "mat_a"), _arg(args, kwargs, 1, "mat_b")
    if a.dim() == 2 and b.dim() == 2:
        return 2 * int(a.numel()) * int(b.shape[-1])
    return 2 * int(result.numel()) * int(a.shape[-1])


def _vector_product(at: int, name: str) -> CallFormula:
    """mv, addmv, dot, vdot: one multiply-add per element of the operand at ``at`` (the matrix,
    or either vector)."""
    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        return 2 * int(_arg(args, kwargs, at, name).numel())
    return formula


def _vecdot(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    x, dim = _arg(args, kwargs, 0, "x"), _arg(args, kwargs, 2, "dim")
    return 2 * int(result.numel()) * int(x.shape[-1 if dim is None else dim])


def _cdist(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    # Per pair of points and coordinate a difference, its power and an add; a root per pair.
    pairs = int(result.numel())
    return pairs * (3 * int(_arg(args, kwargs, 0, "x1").shape[-1]) + 1)


def _einsum(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    if not args or not isinstance(args[0], str):
        return 0  # the sublist form einsum(op, [0, 1], ...) is not costed
    operands = args[1:]
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return einsum_flops(args[0], [_shape(t) for t in operands])


def _linear(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    weight = _arg(args, kwargs, 1, "weight")
    return 2 * result.numel() * weight.shape[-1]


def linear_cross_entropy_flops(inputs: int, in_features: int, classes: int
                               ) -> tuple[int, int]:
    """``(product, cross entropy)`` of a linear layer to ``classes`` logits fed to a cross
    entropy (``F.linear_cross_entropy``, ``nn.LinearCrossEntropyLoss``), on ``inputs`` input
    elements of ``in_features`` each: the logits' product, 2·rows·in·classes, and their cross
    entropy, as ``F.cross_entropy`` of them costs.

    Example:
        >>> linear_cross_entropy_flops(6 * 8, 8, 10)    # 6 rows: 2·6·8·10; 5·60 + 6
        (960, 306)
    """
    logits = inputs // max(in_features, 1) * classes
    return 2 * logits * in_features, loss_flops("cross_entropy", logits, classes)


def _linear_cross_entropy(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
                          part: int = 0) -> int:
    # F.linear_cross_entropy's product (part 0) or its logits' cross entropy (part 1): the
    # logits it never returns (its result is the loss), input (..., in) by linear_weight
    # (classes, in).
    classes, in_features = _arg(args, kwargs, 1, "linear_weight").shape
    return linear_cross_entropy_flops(_arg(args, kwargs, 0, "input").numel(), in_features,
                                      classes)[part]


#: Functions whose products come with other arithmetic, charged apart under another name (so
#: GEMM FLOPs stay products): that name and its formula, by the function's formula name.
COMPANIONS: dict[str, tuple[str, CallFormula]] = {
    "linear_cross_entropy": ("cross_entropy", functools.partial(_linear_cross_entropy, part=1)),
}


def _bilinear(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    weight = _arg(args, kwargs, 2, "weight")
    return 2 * result.numel() * weight.shape[1] * weight.shape[2]


def _conv(transposed: bool) -> CallFormula:
    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        x = _shape(_arg(args, kwargs, 0, "input"))
        w = _shape(_arg(args, kwargs, 1, "weight"))
        out = _shape(result)
        if len(x) == len(w) - 1:  # unbatched input
            x, out = (1,) + x, (1,) + out
        if transposed:  # weight is (C_in, C_out/groups, k...): the FLOPs are the same product
            return 2 * x[0] * prod(x[2:]) * w[0] * w[1] * prod(w[2:])
        return conv_flops(x, w, out, False)
    return formula


def _sdpa(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    return sdpa_flops(_shape(_arg(args, kwargs, 0, "query")),
                      _shape(_arg(args, kwargs, 1, "key")),
                      _shape(_arg(args, kwargs, 2, "value")))


def real_arithmetic(result: Any) -> int:
    """Real FLOPs per FLOP of a product's count that returned ``result``: 4 for a complex tensor
    (a complex multiply-add is 4 real multiplies and 4 real adds), else 1.

    Example:
        >>> import torch
        >>> real_arithmetic(torch.ones(2, dtype=torch.complex64)), real_arithmetic(torch.ones(2))
        (4, 1)
    """
    is_complex = getattr(result, "is_complex", None)
    return 4 if is_complex is not None and is_complex() else 1


def _complex_aware(formula: CallFormula) -> CallFormula:
    """``formula`` of a product, in real FLOPs (see :func:`real_arithmetic`)."""
    def counted(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        return formula(args, kwargs, result) * real_arithmetic(result)
    return counted


#: The Fourier transforms of ``torch.fft``: per function, FLOPs per point and log2 point (5 for
#: a complex transform, 2.5 with a real side), the transformed dimensions by default (``None``:
#: all, or the last ``len(s)``), and which side is real (``"in"``: the input, ``"out"``: the
#: result, ``None``: neither).
_FFTS: dict[str, tuple[float, tuple[int, ...] | None, str | None]] = {
    "fft": (5.0, (-1,), None), "ifft": (5.0, (-1,), None),
    "fft2": (5.0, (-2, -1), None), "ifft2": (5.0, (-2, -1), None),
    "fftn": (5.0, None, None), "ifftn": (5.0, None, None),
    "rfft": (2.5, (-1,), "in"), "rfft2": (2.5, (-2, -1), "in"), "rfftn": (2.5, None, "in"),
    "ihfft": (2.5, (-1,), "in"), "ihfft2": (2.5, (-2, -1), "in"), "ihfftn": (2.5, None, "in"),
    "irfft": (2.5, (-1,), "out"), "irfft2": (2.5, (-2, -1), "out"), "irfftn": (2.5, None, "out"),
    "hfft": (2.5, (-1,), "out"), "hfft2": (2.5, (-2, -1), "out"), "hfftn": (2.5, None, "out"),
}


def fft_flops(per_point: float, shape: Shape, dims: Sequence[int],
              lengths: Sequence[int] | None = None) -> int:
    """FLOPs of the transforms of a tensor of ``shape`` over ``dims`` (``lengths``: the
    transformed lengths where they differ from the shape's, padded or trimmed): per_point·
    N·log2(N) for each of the transforms, N the product of the transformed lengths.

    Example:
        >>> fft_flops(5.0, (4, 8), (-1,))          # four complex transforms of 8 points
        480
        >>> fft_flops(2.5, (2, 6), (-1,), [8])     # two real ones, padded to 8 points
        120
    """
    rank = len(shape)
    axes = sorted({dim % rank for dim in dims}) if rank else []
    sizes = list(lengths) if lengths is not None else [shape[axis] for axis in axes]
    points = prod(sizes)
    if points <= 1:
        return 0
    transforms = prod(size for axis, size in enumerate(shape) if axis not in axes)
    return round(per_point * transforms * points * log2(points))


def _fft(name: str) -> CallFormula:
    per_point, default_dims, real_side = _FFTS[name]
    one_dim = default_dims == (-1,)

    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        signal = _arg(args, kwargs, 0, "input")
        sizes = _arg(args, kwargs, 1, "n" if one_dim else "s")
        dims = _arg(args, kwargs, 2, "dim")
        if sizes is not None and one_dim:
            sizes = (sizes,)
        if dims is None:
            dims = default_dims
        elif isinstance(dims, int):
            dims = (dims,)
        real = result if real_side == "out" or real_side is None else signal
        rank = real.dim()
        if dims is None:  # every dimension, or the last len(s)
            dims = tuple(range(rank - len(sizes), rank)) if sizes is not None else tuple(
                range(rank))
        lengths = None
        if real_side == "in" and sizes is not None:
            lengths = [size if size != -1 else real.shape[dim]
                       for size, dim in zip(sizes, dims)]
        return fft_flops(per_point, _shape(real), dims, lengths)
    return formula


def _spectrogram_shape(spectrum: Any) -> tuple[int, int, int]:
    # (signals, frequency bins, frames) of a spectrogram: complex (..., bins, frames), or its
    # real view (..., bins, frames, 2).
    shape = _shape(spectrum)
    if not spectrum.is_complex():
        shape = shape[:-1]
    bins, frames = shape[-2], shape[-1]
    return prod(shape[:-2]), bins, frames


def _stft(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    signal, n_fft = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "n_fft")
    window = _arg(args, kwargs, 4, "window")
    normalized, onesided = _arg(args, kwargs, 7, "normalized"), _arg(args, kwargs, 8, "onesided")
    signals, bins, frames = _spectrogram_shape(result)
    real = not signal.is_complex() and (window is None or not window.is_complex()) and (
        onesided is None or onesided)
    per_frame = fft_flops(2.5 if real else 5.0, (n_fft,), (0,)) + (
        n_fft if window is not None else 0) + (bins if normalized else 0)
    return signals * frames * per_frame


def _istft(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
    spectrum, n_fft = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "n_fft")
    normalized, onesided = _arg(args, kwargs, 6, "normalized"), _arg(args, kwargs, 7, "onesided")
    signals, bins, frames = _spectrogram_shape(spectrum)
    real = onesided if onesided is not None else bins != n_fft
    per_frame = fft_flops(2.5 if real else 5.0, (n_fft,), (0,)) + 2 * n_fft + (
        n_fft if normalized else 0)
    return signals * frames * per_frame + int(result.numel())


def _per_output(per_element: int) -> CallFormula:
    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        return per_element * int(result.numel())
    return formula


def _per_element_cost(name: str, per_element: int
                      ) -> Callable[[tuple[Any, ...], dict[str, Any]], int]:
    # The FLOPs per element of a call of the elementwise function ``name``: its own, and a
    # multiply for the scalar factor it folds in, if any (FOLDED_FACTORS). The factor's position
    # counts the tensor (or list) called on: torch.add(x, y, alpha=a), x.add(y, alpha=a) and
    # torch._foreach_add(xs, ys, alpha=a) reach a mode alike.
    folded = FOLDED_FACTORS.get(name)
    if folded is None:
        return lambda args, kwargs: per_element
    at, keyword, default = folded

    def cost(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        return per_element + scalar_factor(args[at] if len(args) > at
                                           else kwargs.get(keyword, default))
    return cost


def _folding(name: str, per_element: int) -> CallFormula:
    cost = _per_element_cost(name, per_element)

    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        return cost(args, kwargs) * int(result.numel())
    return formula


def _foreach(name: str, per_element: int) -> CallFormula:
    # torch._foreach_<name>(tensors, ...): <name> on each tensor of the list
    cost = _per_element_cost(name, per_element)

    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        return cost(args, kwargs) * sum(int(tensor.numel()) for tensor in args[0])
    return formula


def _per_input(per_element: int) -> CallFormula:
    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        return per_element * int(_arg(args, kwargs, 0, "input").numel())
    return formula


def _normalization(name: str) -> CallFormula:
    # Positions of ``training`` (batch_norm) and ``weight`` in F.<name>'s signature.
    training_at = {"batch_norm": 5}.get(name)
    weight_at = {"rms_norm": 2, "layer_norm": 2, "group_norm": 2, "batch_norm": 3,
                 "instance_norm": 3}[name]

    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        training = (bool(_arg(args, kwargs, training_at, "training"))
                    if training_at is not None else True)
        affine = _arg(args, kwargs, weight_at, "weight") is not None
        return normalization_flops(name, int(_arg(args, kwargs, 0, "input").numel()),
                                   training=training, affine=affine)
    return formula


_TWO = ("input", "target")
_PAIRED = ("input1", "input2", "target")
#: The leading parameters of each function of :data:`~tracetorch.flops.elementwise.CRITERIA`,
#: as ``torch.nn.functional`` names them, up to the last one its formula reads (a layer's
#: ``forward`` takes the same tensors in the same order).
CRITERION_PARAMETERS: dict[str, tuple[str, ...]] = {
    **{name: _TWO for name in CRITERIA},
    "binary_cross_entropy_with_logits": _TWO + ("weight", "size_average", "reduce",
                                                "reduction", "pos_weight"),
    "poisson_nll_loss": _TWO + ("log_input", "full"),
    "gaussian_nll_loss": _TWO + ("var", "full"),
    "multi_margin_loss": _TWO + ("p",),
    "margin_ranking_loss": _PAIRED, "cosine_embedding_loss": _PAIRED,
    "cosine_similarity": ("x1", "x2", "dim"), "pairwise_distance": ("x1", "x2"),
    "triplet_margin_loss": ("anchor", "positive", "negative", "margin", "p", "eps", "swap"),
    "ctc_loss": ("log_probs", "targets", "input_lengths", "target_lengths"),
    "local_response_norm": ("input", "size"), "fold": ("input",),
}


def _criterion(name: str) -> CallFormula:
    parameters = CRITERION_PARAMETERS[name]

    def formula(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> int:
        return criterion_flops(name, {**dict(zip(parameters, args)), **kwargs})
    return formula


def _elementwise_table(torch: Any) -> list[tuple[Any, str, str, CallFormula]]:
    """Every spelling of the functions of :mod:`tracetorch.flops.elementwise`: ``torch.<f>``,
    ``Tensor.<f>`` and its in-place ``<f>_``, ``F.<f>``, the reflected operators and the
    foreach forms ``torch._foreach_<f>`` and ``_foreach_<f>_``."""
    functional, tensor = torch.nn.functional, torch.Tensor
    table: list[tuple[Any, str, str, CallFormula]] = []
    for name, per in PER_ELEMENT.items():
        formula = _per_output(per) if name not in FOLDED_FACTORS else _folding(name, per)
        for owner, attr in ((torch, name), (tensor, name), (tensor, name + "_"),
                            (functional, name)):
            table.append((owner, attr, name, formula))
    for dunder, name in (("__rsub__", "sub"), ("__rtruediv__", "div"), ("__rdiv__", "div"),
                         ("__rpow__", "pow")):
        table.append((tensor, dunder, name, _per_output(PER_ELEMENT[name])))
    for name, per in PER_INPUT_ELEMENT.items():
        formula = _per_input(per)
        table += [(torch, name, name, formula), (tensor, name, name, formula)]
    for name, per in (*PER_ELEMENT.items(), ("norm", PER_INPUT_ELEMENT["norm"])):
        formula = _foreach(name, per)
        table += [(torch, f"_foreach_{name}", f"_foreach_{name}", formula),
                  (torch, f"_foreach_{name}_", f"_foreach_{name}", formula)]
    for name in NORMALIZATIONS:
        table.append((functional, name, name, _normalization(name)))
    for name in CRITERIA:
        table.append((functional, name, name, _criterion(name)))
    return table


@functools.cache
def data_movement_functions() -> frozenset[Callable[..., Any]]:
    """The objects a ``TorchFunctionMode`` receives for the functions of
    :data:`~tracetorch.flops.elementwise.DATA_MOVEMENT` (``torch.<f>``, ``Tensor.<f>``,
    ``F.<f>``): 0 FLOPs each.

    Example:
        >>> import torch
        >>> torch.Tensor.permute in data_movement_functions()
        True
    """
    import torch

    owners = (torch, torch.Tensor, torch.nn.functional)
    return frozenset(getattr(owner, name) for name in DATA_MOVEMENT for owner in owners
                     if hasattr(owner, name))


#: Functions that do arithmetic this module has no formula for, by owner: the fused recurrent
#: layers and cells, the fused attention and transformer kernels behind
#: ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` (whose layer rules count them
#: where the layer is called as itself), sparse products and the linear-algebra solvers and
#: decompositions. A layer that calls one has unknown FLOPs (a
#: lower bound), not a silent 0.
_UNCOUNTED: dict[str, tuple[str, ...]] = {
    "torch": ("lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell",
              "rnn_relu_cell", "_native_multi_head_attention", "_transformer_encoder_layer_fwd",
              # sparse products: their cost follows the values (the stored elements)
              "spmm", "smm", "hspmm", "sspaddmm", "_cslt_sparse_mm",
              "_sparse_semi_structured_mm", "_sparse_semi_structured_addmm",
              "_sparse_semi_structured_linear", "_sparse_mm",
              "inverse", "det", "logdet", "slogdet", "svd", "qr", "cholesky", "cholesky_solve",
              "cholesky_inverse", "triangular_solve", "lu", "lu_solve", "pinverse",
              "matrix_exp", "matrix_power", "geqrf", "ormqr", "lobpcg"),
    "sparse": ("mm", "addmm", "sampled_addmm"),
    "linalg": ("solve", "solve_ex", "solve_triangular", "inv", "inv_ex", "pinv", "cholesky",
               "cholesky_ex", "qr", "svd", "svdvals", "eig", "eigvals", "eigh", "eigvalsh",
               "det", "slogdet", "lstsq", "lu", "lu_factor", "lu_factor_ex", "lu_solve",
               "ldl_factor", "ldl_solve", "matrix_exp", "matrix_power", "matrix_rank", "cond",
               "tensorinv", "tensorsolve", "householder_product"),
}


@functools.cache
def uncounted_functions() -> frozenset[Callable[..., Any]]:
    """The objects a ``TorchFunctionMode`` receives for the functions of :data:`_UNCOUNTED`
    (``torch.<f>`` and ``Tensor.<f>``, ``F.<f>``, ``torch.linalg.<f>``).

    Example:
        >>> import torch
        >>> torch.lstm in uncounted_functions(), torch.matmul in uncounted_functions()
        (True, False)
    """
    import torch

    owners = {"torch": (torch, torch.Tensor), "functional": (torch.nn.functional,),
              "linalg": (torch.linalg,), "sparse": (torch.sparse,)}
    return frozenset(getattr(owner, name) for key, names in _UNCOUNTED.items()
                     for owner in owners[key] for name in names if hasattr(owner, name))


@functools.cache
def torch_function_formulas() -> dict[Callable[..., Any], tuple[str, CallFormula, bool]]:
    """``{function: (name, formula, gemm)}`` for every counted torch function, keyed by the
    object a ``TorchFunctionMode`` receives for it (see the module docstring); ``gemm`` tells the
    products (matrix, convolution, attention) from elementwise maths. Functions this torch
    version lacks are left out. Built once (it imports torch).

    Example:
        >>> import torch
        >>> name, formula, gemm = torch_function_formulas()[torch.Tensor.matmul]   # ``@``
        >>> a, b = torch.zeros(4, 5), torch.zeros(5, 6)
        >>> name, formula((a, b), {}, a @ b), gemm
        ('matmul', 240, True)
        >>> name, formula, gemm = torch_function_formulas()[torch.Tensor.add]      # ``+``
        >>> name, formula((a, a), {}, a + a), gemm
        ('add', 20, False)
    """
    import torch

    mm = _product(0, ("input", "mat2"))
    addmm = _product(1, ("mat1", "mat2"))
    baddbmm = _product(1, ("batch1", "batch2"))
    conv, conv_t = _conv(False), _conv(True)
    functional = torch.nn.functional
    tensor = torch.Tensor
    table: list[tuple[Any, str, str, CallFormula]] = [
        (torch, "matmul", "matmul", _matmul), (tensor, "matmul", "matmul", _matmul),
        (torch.linalg, "matmul", "matmul", _matmul),
        (tensor, "__rmatmul__", "matmul", _rmatmul),
        (torch, "mm", "mm", mm), (tensor, "mm", "mm", mm),
        (torch, "bmm", "bmm", mm), (tensor, "bmm", "bmm", mm),
        (torch, "addmm", "addmm", addmm), (tensor, "addmm", "addmm", addmm),
        (tensor, "addmm_", "addmm", addmm),
        (torch, "baddbmm", "baddbmm", baddbmm), (tensor, "baddbmm", "baddbmm", baddbmm),
        (tensor, "baddbmm_", "baddbmm", baddbmm),
        (torch, "einsum", "einsum", _einsum),
        (functional, "linear", "linear", _linear),
        (functional, "linear_cross_entropy", "linear_cross_entropy", _linear_cross_entropy),
        (functional, "bilinear", "bilinear", _bilinear),
        (functional, "scaled_dot_product_attention", "scaled_dot_product_attention", _sdpa),
        (functional, "multi_head_attention_forward", "multi_head_attention_forward",
         _attention),
        (torch, "tensordot", "tensordot", _contracted), (torch, "inner", "inner", _contracted),
        (tensor, "inner", "inner", _contracted),
        # the integer and float8 products of quantized inference (torchao, gpt-fast): as the
        # float product of the same shapes
        (torch, "_int_mm", "int_mm", mm), (torch, "_scaled_mm", "scaled_mm", mm),
        (torch, "_scaled_mm_v2", "scaled_mm", mm),
        (torch, "_weight_int8pack_mm", "int8pack_mm", _linear),
        (torch, "_weight_int4pack_mm", "int4pack_mm", _rows_by_inputs),
        (torch, "_weight_int4pack_mm_for_cpu", "int4pack_mm", _rows_by_inputs),
        (torch, "_weight_int4pack_mm_with_scales_and_zeros", "int4pack_mm", _rows_by_inputs),
        (torch, "_grouped_mm", "grouped_mm", _grouped),
        (torch, "_scaled_grouped_mm", "grouped_mm", _grouped),
        (torch, "_scaled_grouped_mm_v2", "grouped_mm", _grouped),
        (functional, "grouped_mm", "grouped_mm", _grouped),
        (torch.linalg, "multi_dot", "multi_dot", _chain),
        (torch, "chain_matmul", "multi_dot", _chain),
    ]
    # Products of vectors, and of a matrix with a vector: not matrix products
    # (torch.utils.flop_counter leaves them out too), complex ones 4 x as products are.
    vectors: list[tuple[Any, str, str, CallFormula]] = [
        (torch, "addbmm", "addbmm", _product(1, ("batch1", "batch2"))),
        (torch, "mv", "mv", _vector_product(0, "input")),
        (torch, "addmv", "addmv", _vector_product(1, "mat")),
        (torch, "dot", "dot", _vector_product(0, "input")),
        (torch, "vdot", "vdot", _vector_product(0, "input")),
        (torch.linalg, "vecdot", "vecdot", _vecdot),
        (torch, "outer", "outer", _per_output(1)), (torch, "ger", "outer", _per_output(1)),
        (torch, "addr", "addr", _per_output(1)), (torch, "kron", "kron", _per_output(1)),
        (torch, "cdist", "cdist", _cdist),
    ]
    vectors += [(tensor, attr, name, formula) for owner, attr, name, formula in list(vectors)
                if owner is torch for attr in (attr, attr + "_")]
    for dims in ("1d", "2d", "3d"):
        table.append((functional, "conv" + dims, "conv" + dims, conv))
        table.append((functional, "conv_transpose" + dims, "conv_transpose" + dims, conv_t))
    formulas: dict[Callable[..., Any], tuple[str, CallFormula, bool]] = {}
    for owner, attr, name, formula in _elementwise_table(torch):
        if hasattr(owner, attr):  # F.tanh is Tensor.tanh: the same function once
            formulas.setdefault(getattr(owner, attr), (name, formula, False))
    for owner, attr, name, formula in layer_function_table(torch):
        if hasattr(owner, attr):
            formulas.setdefault(getattr(owner, attr), (name, formula, False))
    for name in _FFTS:
        if hasattr(torch.fft, name):
            formulas[getattr(torch.fft, name)] = ("fft_" + name, _fft(name), False)
    for owner in (torch, tensor):
        formulas[owner.stft] = ("stft", _stft, False)
        formulas[owner.istft] = ("istft", _istft, False)
    for owner, attr, name, formula in table:
        if hasattr(owner, attr):
            formulas[getattr(owner, attr)] = (name, _complex_aware(formula), True)
    for owner, attr, name, formula in vectors:
        if hasattr(owner, attr):
            formulas[getattr(owner, attr)] = (name, _complex_aware(formula), False)
    return formulas
