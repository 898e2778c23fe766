"""Counting torch's matrix products, convolutions and attention where they run.

Inside a profile the functions below are replaced, in their modules, by thin counting wrappers
that call the original and report its FLOPs with ``counter.forward_op(name, flops, gemm)``, so
they land on the innermost layer running (and a layer with a rule of its own discards them:
``nn.Linear`` calling ``F.linear`` is counted once). On exit every attribute is put back as it
was (an attribute the class did not own, such as ``torch.Tensor.__matmul__``, is deleted again).

Counted, with FLOPs = 2 x MACs for the product (``gemm=True``); a bias or added input fused
into the call is not counted, as in the layer rules and in PyTorch's own counter:

============================================  ==================================================
``torch.matmul``, ``@``, ``Tensor.matmul``    2·batch·M·K·N (broadcast batch; 1-D operands too)
``mm`` / ``bmm``                              2·M·K·N / 2·B·M·K·N
``addmm`` / ``baddbmm``                       as mm / bmm
``einsum``                                    2 x product of all distinct index sizes for two
                                              operands; more operands are contracted left to
                                              right, each pair costed the same way; one operand 0
``F.linear`` / ``F.bilinear``                 2·rows·in·out / 2·rows·out·in1·in2
``conv1d/2d/3d``                              2·N·C_out·prod(out spatial)·C_in/groups·prod(k)
``conv_transpose1d/2d/3d``                    2·N·prod(in spatial)·C_in·C_out/groups·prod(k)
``F.scaled_dot_product_attention``            2·batch·L·S·(E + E_v): the two products; the
                                              causal mask is not discounted (as FlopCounterMode)
============================================  ==================================================

Why patching, not a ``TorchFunctionMode``: a function mode routes *every* torch call (``relu``,
``view``, ``add``, every op inside every layer) through Python; ``benchmarks/overhead_torch.py``
measures an empty one at about 0.7 µs per op on torch 2.13 CPU, before any counting. Patching
costs nothing for ops that are not counted; a counted op outside a layer with a rule costs about
1.5 µs (shape arithmetic and the charge to the open call), and inside one (``nn.Linear`` calling
``F.linear``) it returns after one check. The price: a function bound to
a name *before* the block (``from torch import matmul``) is not seen. Tensor methods, ``@``,
``torch.*`` and ``torch.nn.functional.*`` looked up at call time are.

Example:
    >>> matmul_flops((8, 4, 16), (16, 32))     # 8 x (4x16 @ 16x32)
    32768
    >>> einsum_flops("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)])
    240
"""
from __future__ import annotations

import functools
import threading
from math import prod
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

from tracetorch.engine.hotpath import OpCounter, current_frame

__all__ = ("matmul_flops", "einsum_flops", "conv_flops", "sdpa_flops", "OpPatches",
           "FORWARD_FORMULAS", "suspended")

Shape = Tuple[int, ...]
# The matmul/convolution FLOPs of one call, from its arguments and result.
Formula = Callable[[Tuple[Any, ...], Dict[str, Any], Any], int]

# Set while a backward pass runs in this thread: its (recomputed) forward ops are backward work,
# counted by the backward counter, not here.
_STATE = threading.local()


def suspended() -> bool:
    """Whether forward op counting is paused in this thread (during a backward pass)."""
    return getattr(_STATE, "suspended", False)


def set_suspended(value: bool) -> bool:
    """Pause (or resume) forward op counting in this thread; returns the previous setting."""
    previous = getattr(_STATE, "suspended", False)
    _STATE.suspended = value
    return previous


# ----------------------------------------------------------------------------- shape formulas
def matmul_flops(a: Shape, b: Shape) -> int:
    """FLOPs of ``torch.matmul`` on operands of these shapes (broadcast batch dimensions)."""
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
    contraction, operands contracted left to right; a single operand counts 0."""
    if len(shapes) < 2:
        return 0
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(shapes):
        return 0
    sizes: Dict[str, int] = {}
    terms: List[str] = []
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
        counts: Dict[str, int] = {}
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
    position meets a whole filter, for every pair of channels in a group. Bias not included."""
    spatial = (x if transposed else out)[2:]
    return 2 * x[0] * prod(spatial) * w[0] * w[1] * prod(w[2:])


def sdpa_flops(q: Shape, k: Shape, v: Shape) -> int:
    """FLOPs of the two products of attention: ``q @ k^T`` and ``scores @ v``."""
    batch = prod(q[:-2])
    return 2 * batch * q[-2] * k[-2] * (q[-1] + v[-1])


# ----------------------------------------------------------------------------- call formulas
def _shape(value: Any) -> Shape:
    return tuple(value.shape)


def _arg(args: Tuple[Any, ...], kwargs: Dict[str, Any], index: int, name: str) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name)


def _f_matmul(args, kwargs, result):
    return matmul_flops(_shape(_arg(args, kwargs, 0, "input")),
                        _shape(_arg(args, kwargs, 1, "other")))


def _product(first: int, names: Tuple[str, str]) -> Formula:
    """mm/bmm and their ``add`` forms: operands ``(…, m, k)`` and ``(…, k, n)`` at positions
    ``first`` and ``first + 1`` cost 2·batch·m·k·n (the added input is not counted)."""
    def formula(args, kwargs, result):
        a = _shape(_arg(args, kwargs, first, names[0]))
        b = _shape(_arg(args, kwargs, first + 1, names[1]))
        return 2 * prod(a) * b[-1]
    return formula


_MM = _product(0, ("input", "mat2"))


def _f_einsum(args, kwargs, result):
    if not args or not isinstance(args[0], str):
        return 0  # the sublist form einsum(op, [0, 1], ...) is not costed
    operands = args[1:]
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return einsum_flops(args[0], [_shape(t) for t in operands])


def _f_linear(args, kwargs, result):
    weight = _arg(args, kwargs, 1, "weight")
    return 2 * result.numel() * weight.shape[-1]


def _f_bilinear(args, kwargs, result):
    weight = _arg(args, kwargs, 2, "weight")
    return 2 * result.numel() * weight.shape[1] * weight.shape[2]


def _conv_formula(transposed: bool) -> Formula:
    def formula(args, kwargs, result):
        x = _shape(_arg(args, kwargs, 0, "input"))
        w = _shape(_arg(args, kwargs, 1, "weight"))
        out = _shape(result)
        if len(x) == len(w) - 1:  # unbatched input
            x, out = (1,) + x, (1,) + out
        if transposed:  # weight is (C_in, C_out/groups, k...): the FLOPs are the same product
            return 2 * x[0] * prod(x[2:]) * w[0] * w[1] * prod(w[2:])
        return conv_flops(x, w, out, False)
    return formula


def _f_sdpa(args, kwargs, result):
    q = _shape(_arg(args, kwargs, 0, "query"))
    k = _shape(_arg(args, kwargs, 1, "key"))
    v = _shape(_arg(args, kwargs, 2, "value"))
    return sdpa_flops(q, k, v)


_CONV = _conv_formula(False)
_CONV_T = _conv_formula(True)

#: Formulas by the name a counted function is reported under.
FORWARD_FORMULAS: Dict[str, Formula] = {
    "matmul": _f_matmul, "mm": _MM, "bmm": _MM, "addmm": _product(1, ("mat1", "mat2")),
    "baddbmm": _product(1, ("batch1", "batch2")),
    "einsum": _f_einsum, "linear": _f_linear, "bilinear": _f_bilinear,
    "conv1d": _CONV, "conv2d": _CONV, "conv3d": _CONV,
    "conv_transpose1d": _CONV_T, "conv_transpose2d": _CONV_T, "conv_transpose3d": _CONV_T,
    "scaled_dot_product_attention": _f_sdpa,
}


def _targets() -> List[Tuple[Any, str, str]]:
    """(namespace, attribute, formula name) of every function wrapped while profiling."""
    functional = torch.nn.functional
    targets: List[Tuple[Any, str, str]] = []
    for name in ("matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "bilinear", "conv1d",
                 "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
        targets.append((torch, name, name))
    for name in ("linear", "bilinear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                 "conv_transpose2d", "conv_transpose3d", "scaled_dot_product_attention"):
        targets.append((functional, name, name))
    # Tensor methods live on the C base class; a Python attribute on torch.Tensor shadows them
    # (and is deleted again on exit). __rmatmul__ already calls torch.matmul, so it is left.
    for name, formula in (("__matmul__", "matmul"), ("matmul", "matmul"), ("mm", "mm"),
                          ("bmm", "bmm"), ("addmm", "addmm"), ("baddbmm", "baddbmm")):
        targets.append((torch.Tensor, name, formula))
    return [t for t in targets if hasattr(t[0], t[1])]


# Nodes whose FLOPs come from a rule (or are declared free): their operations are not needed.
_RULED = frozenset({"rule", "user", "free"})


def _counting(original: Callable[..., Any], name: str, formula: Formula,
              forward_op: Callable[[str, int, bool], Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        frame = current_frame()
        if frame is None or frame.node.rule_state in _RULED or result is NotImplemented \
                or getattr(_STATE, "suspended", False):
            return result  # outside every profile, or inside a layer whose rule says it all
        try:
            flops = formula(args, kwargs, result)
        except Exception:  # an unusual call signature is not worth breaking the model for
            return result
        if flops:
            forward_op(name, flops, True)
        return result

    try:
        functools.update_wrapper(counted, original)
    except (AttributeError, TypeError):  # pragma: no cover - builtins without a __dict__
        pass
    counted._tracetorch_original = original  # type: ignore[attr-defined]
    return counted


class OpPatches:
    """The counting wrappers of one profiling session: :meth:`install`, then :meth:`restore`."""

    def __init__(self) -> None:
        self._saved: List[Tuple[Any, str, bool, Any]] = []

    def install(self, counter: OpCounter) -> None:
        """Wrap every counted function, reporting to ``counter``."""
        forward_op = counter.forward_op
        for owner, attr, formula_name in _targets():
            own = attr in vars(owner)
            original = getattr(owner, attr)
            if getattr(original, "_tracetorch_original", None) is not None:
                continue  # already wrapped (should not happen: one session at a time)
            wrapper = _counting(original, formula_name, FORWARD_FORMULAS[formula_name], forward_op)
            saved = vars(owner)[attr] if own else None
            setattr(owner, attr, wrapper)
            self._saved.append((owner, attr, own, saved))

    def restore(self) -> None:
        """Put back every original exactly (delete what was only inherited)."""
        errors: List[BaseException] = []
        while self._saved:
            owner, attr, own, saved = self._saved.pop()
            try:
                if own:
                    setattr(owner, attr, saved)
                else:
                    delattr(owner, attr)
            except BaseException as exc:  # keep restoring the rest
                errors.append(exc)
        if errors:
            raise errors[0]
