"""Optimizer steps: FLOPs per parameter element from the optimizer's class and settings, and
what an optimizer updates (which also names its node).

One step costs, for each parameter with a gradient (``p.grad is not None``: what torch
updates), its element count times the per-element cost of the algorithm under the settings of
its parameter group. The per-element costs count the operations torch's single-tensor
implementation (``foreach=False``) runs on each element, by this convention:

* every elementwise operation on one element is 1 FLOP: add, subtract, multiply (by a tensor
  or a scalar), divide, negate, square root, absolute value, sign, reciprocal, maximum, a
  comparison, a masked select (``x[mask] = v``); ``clamp`` with both bounds is 2;
* a scalar factor torch folds into an operation (``add``'s ``alpha``, ``addcmul`` and
  ``addcdiv``'s ``value``, ``lerp``'s weight) is a multiply, so 1 more, unless it is 1 or -1:
  ``x.add(y, alpha=a)`` is 2, ``x.add(y)`` 1; ``addcmul``/``addcdiv`` are 3 (2 with a value of
  ±1); ``lerp(end, w)`` is 3 (``end - x``, times ``w``, plus ``x``). A factor that changes with
  the step (bias corrections, ASGD's eta) is always counted;
* copies, clones and new state buffers are 0, and so is the bookkeeping on 0-dim tensors (step
  counters, NAdam's mu product, ASGD's eta and mu): not per element;
* the branch a step takes is the one torch takes at that step: SGD's first momentum step
  copies the gradient (no momentum arithmetic), RAdam rectifies once its rho_t exceeds 5,
  ASGD averages once the step passes t0. It is read from the state of the group's first
  parameter with a gradient, before the step (RAdam and ASGD read its step counter: a device
  synchronisation where ``capturable`` keeps the counter on the GPU).

Per element, with torch's default settings (``maximize`` adds 1, a negation, to each)::

    optimizer  default  settings that change it
    ---------  -------  ---------------------------------------------------------------
    SGD        2        momentum +2 (+1 with dampening, 0 on the first step), nesterov
                        +2, weight_decay +2, lr of ±1: -1
    Adam       13       weight_decay +2 (L2: grad + wd·p), decoupled (AdamW) +1, amsgrad +1
    AdamW      14       (default weight_decay=0.01, decoupled)
    Adamax     10       weight_decay +2
    NAdam      16       weight_decay +2, decoupled +1
    RAdam      10 / 16  10 before rectification, 16 after; weight_decay +2, decoupled +1
    RMSprop    9        centered +5, momentum +2, weight_decay +2
    Adagrad    7        weight_decay +2
    Adadelta   15       weight_decay +2, an lr other than ±1 +1
    ASGD       3        averaging (step > t0 + 2) +3, weight_decay +2
    Rprop      16       (three compare-and-selects, clamp 2)
    Muon       12       (nesterov; 9 without) and per Newton-Schulz step of an m x n weight
                        (m ≤ n) 4·m²·n + 2·m³ of products and 3·m² + 2·m·n of scaled adds
    Adafactor  13       a vector (12 at the first step); a matrix R x C (factored): 16 per
                        element (2 its outer product's, GEMM), 6 per row and 5 per column (one
                        less each at the first step), 1 per matrix

Every ``foreach`` and ``fused`` path gets the same count: the same algorithm, organised in
fewer kernels (RAdam's foreach path even runs the rectified arithmetic at every step and masks
it, 14 per element; the count follows the algorithm's branch). ``capturable`` and
``differentiable`` paths fold a few scalars differently and are counted as the default path.
A complex parameter counts as one element per complex number. A step with a sparse gradient
raises :class:`SparseGradientError` (its FLOPs are unknown: see there). Optimizers not listed
(``LBFGS``, any other class, a subclass whose own ``step`` does more) have no rule: a profile
counts their operations, and :func:`tracetorch.flop_rule` can register one; an optimizer's
rule runs before each step as ``rule(optimizer, step_args, None)``, so it can read which
parameters have gradients.

``tracetorch.core``'s optimizers use the same formulas (:mod:`tracetorch.flops.core_rules`).

Example:
    >>> adam_flops(), adam_flops(weight_decay=0.01, decoupled_weight_decay=True)
    (13, 14)
    >>> sgd_flops(momentum=0.9), sgd_flops(momentum=0.9, first_step=True)
    (4, 2)
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from math import prod
from typing import Any, Callable

from tracetorch.flops.elementwise import scalar_factor
from tracetorch.flops.registry import FlopCount, FlopRegistry, FlopRule, default_registry

__all__ = (
    "sgd_flops", "adam_flops", "adamax_flops", "nadam_flops", "radam_flops", "radam_rectifies",
    "rmsprop_flops", "adagrad_flops", "adadelta_flops", "asgd_flops", "asgd_averages",
    "rprop_flops", "muon_flops", "adafactor_flops", "TORCH_STEP_FLOPS", "torch_step_rule",
    "register_torch_optimizer_rules", "updated_parameters", "optimizer_scope",
    "SparseGradientError", "sparse_gradients",
)

#: Stands for a scalar factor that changes with the step: always counted as a multiply.
_VARIES: Any = None

#: A parameter without state yet (its first step).
_NO_STATE: Mapping[str, Any] = {}


def _axpy(alpha: Any) -> int:
    """``x.add(y, alpha=alpha)``: the add, and the multiply by ``alpha``."""
    return 1 + scalar_factor(alpha)


def _fused(value: Any) -> int:
    """``x.addcmul(y, z, value=v)`` or ``addcdiv``: the product or quotient, the add, and the
    multiply by ``value``."""
    return 2 + scalar_factor(value)


def _lerp(weight: Any) -> int:
    """``x.lerp(end, weight)``: ``end - x``, times ``weight``, plus ``x``."""
    return 2 + scalar_factor(weight)


def _gradient(maximize: bool, weight_decay: Any, decoupled: bool = False) -> int:
    """The gradient's preparation: negated under ``maximize``; weight decay as L2
    (``grad + wd·param``) or decoupled (``param·(1 - lr·wd)``, one multiply)."""
    flops = 1 if maximize else 0
    if weight_decay:
        flops += 1 if decoupled else _axpy(weight_decay)
    return flops


def sgd_flops(*, lr: Any = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
              nesterov: bool = False, weight_decay: Any = 0.0, maximize: bool = False,
              first_step: bool = False) -> int:
    """SGD per element: ``buf·momentum + (1 - dampening)·grad`` (not on the ``first_step``,
    which copies the gradient), ``grad + momentum·buf`` with Nesterov, ``param - lr·update``.

    Example:
        >>> sgd_flops(), sgd_flops(momentum=0.9, dampening=0.1), sgd_flops(lr=1.0)
        (2, 5, 1)
    """
    flops = _gradient(maximize, weight_decay)
    if momentum:
        if not first_step:
            flops += 1 + _axpy(1 - dampening)
        if nesterov:
            flops += _axpy(momentum)
    return flops + _axpy(-lr)


def adam_flops(*, beta1: Any = 0.9, beta2: Any = 0.999, weight_decay: Any = 0.0,
               decoupled_weight_decay: bool = False, amsgrad: bool = False,
               maximize: bool = False) -> int:
    """Adam and AdamW per element: both moments (``lerp`` 3; ``mul`` and ``addcmul`` 4), the
    running maximum with ``amsgrad`` (1), the denominator (sqrt, divide by the second bias
    correction's root, add eps: 3) and ``param.addcdiv(m, denom, value=-step_size)`` (3).

    Example:
        >>> adam_flops(amsgrad=True), adam_flops(weight_decay=0.1)
        (14, 15)
    """
    return (_gradient(maximize, weight_decay, decoupled_weight_decay)
            + _lerp(1 - beta1) + 1 + _fused(1 - beta2) + (1 if amsgrad else 0)
            + 3 + _fused(_VARIES))


def adamax_flops(*, beta1: Any = 0.9, weight_decay: Any = 0.0, maximize: bool = False) -> int:
    """Adamax per element: the first moment (``lerp`` 3), the infinity norm (``exp_inf·beta2``,
    ``|grad|``, ``+ eps``, maximum: 4) and ``addcdiv`` with the bias-corrected lr (3).

    Example:
        >>> adamax_flops()
        10
    """
    return _gradient(maximize, weight_decay) + _lerp(1 - beta1) + 4 + _fused(_VARIES)


def nadam_flops(*, beta1: Any = 0.9, beta2: Any = 0.999, weight_decay: Any = 0.0,
                decoupled_weight_decay: bool = False, maximize: bool = False) -> int:
    """NAdam per element: both moments (7), the denominator (divide by the second bias
    correction, sqrt, add eps: 3) and two ``addcdiv`` (gradient and momentum terms: 6).

    Example:
        >>> nadam_flops(), nadam_flops(weight_decay=0.1, decoupled_weight_decay=True)
        (16, 17)
    """
    return (_gradient(maximize, weight_decay, decoupled_weight_decay)
            + _lerp(1 - beta1) + 1 + _fused(1 - beta2) + 3 + 2 * _fused(_VARIES))


def radam_rectifies(beta2: float, step: float) -> bool:
    """Whether RAdam's step number ``step`` (1 for the first) takes the rectified branch: its
    rho_t, computed as torch computes it, exceeds 5.

    Example:
        >>> [radam_rectifies(0.999, step) for step in (1, 5, 6)]
        [False, False, True]
    """
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * (beta2**step) / (1 - beta2**step)
    return rho_t > 5.0


def radam_flops(*, step: float, beta1: Any = 0.9, beta2: Any = 0.999, weight_decay: Any = 0.0,
                decoupled_weight_decay: bool = False, maximize: bool = False) -> int:
    """RAdam per element at step number ``step``: both moments (7) and the first's bias
    correction (1); rectified, the adaptive lr (sqrt, + eps, then ``c / x``, which torch runs as
    a reciprocal and a multiply: 4), three multiplies (lr, adaptive lr, rectification) and the
    subtraction (8 in all); before that, times lr and the subtraction (2).

    Example:
        >>> radam_flops(step=1), radam_flops(step=6)
        (10, 16)
    """
    base = (_gradient(maximize, weight_decay, decoupled_weight_decay)
            + _lerp(1 - beta1) + 1 + _fused(1 - beta2) + 1)
    return base + (8 if radam_rectifies(float(beta2), step) else 2)


def rmsprop_flops(*, lr: Any = 1e-2, alpha: Any = 0.99, weight_decay: Any = 0.0,
                  momentum: float = 0.0, centered: bool = False, maximize: bool = False) -> int:
    """RMSprop per element: the square average (``mul`` and ``addcmul`` 4); centered, the
    gradient average (``lerp`` 3) and its square taken off (``addcmul`` with value -1: 2);
    sqrt and eps (2); then ``addcdiv`` into the parameter (3), or with momentum into the
    buffer (``mul`` and ``addcdiv`` 3) and ``param - lr·buf`` (2).

    Example:
        >>> rmsprop_flops(), rmsprop_flops(centered=True), rmsprop_flops(momentum=0.9)
        (9, 14, 11)
    """
    flops = _gradient(maximize, weight_decay) + 1 + _fused(1 - alpha)
    if centered:
        flops += _lerp(1 - alpha) + _fused(-1)
    flops += 2
    if momentum > 0:
        return flops + 1 + _fused(1) + _axpy(-lr)
    return flops + _fused(-lr)


def adagrad_flops(*, lr: Any = 1e-2, lr_decay: float = 0.0, weight_decay: Any = 0.0,
                  maximize: bool = False) -> int:
    """Adagrad per element: the sum of squares (``addcmul`` with value 1: 2), sqrt and eps (2)
    and ``addcdiv`` with the decayed lr (3).

    Example:
        >>> adagrad_flops(), adagrad_flops(weight_decay=0.1)
        (7, 9)
    """
    step_lr = -lr if not lr_decay else _VARIES
    return _gradient(maximize, weight_decay) + _fused(1) + 2 + _fused(step_lr)


def adadelta_flops(*, lr: Any = 1.0, rho: Any = 0.9, weight_decay: Any = 0.0,
                   maximize: bool = False) -> int:
    """Adadelta per element: the square average (4), ``sqrt(avg + eps)`` twice (4), the delta
    (divide, times grad: 2), the delta average (4) and ``param - lr·delta`` (1 at lr 1, else 2).

    Example:
        >>> adadelta_flops(), adadelta_flops(lr=0.5)
        (15, 16)
    """
    return (_gradient(maximize, weight_decay) + 1 + _fused(1 - rho) + 4 + 2
            + 1 + _fused(1 - rho) + _axpy(-lr))


def asgd_averages(step: float, t0: float) -> bool:
    """Whether ASGD's step number ``step`` (1 for the first) updates its average (a mu other
    than 1: the one set by the previous step, ``1 / max(1, step - 1 - t0)``).

    Example:
        >>> asgd_averages(1, 0.0), asgd_averages(2, 0.0), asgd_averages(4, 0.0)
        (False, False, True)
    """
    return step > 1 and step - 1 - t0 > 1


def asgd_flops(*, weight_decay: Any = 0.0, maximize: bool = False,
               averaging: bool = False) -> int:
    """ASGD per element: the decay (``param·(1 - lambd·eta)``: 1), ``param - eta·grad`` (2)
    and, while ``averaging``, ``ax + mu·(param - ax)`` (3; else a copy).

    Example:
        >>> asgd_flops(), asgd_flops(averaging=True)
        (3, 6)
    """
    return _gradient(maximize, weight_decay) + 1 + _axpy(_VARIES) + (3 if averaging else 0)


def rprop_flops(*, maximize: bool = False) -> int:
    """Rprop per element: ``sign(grad·prev)`` (2), three compare-and-selects making it a factor
    (6), the step size times it and clamped (3), the gradient zeroed where the sign flipped
    (compare and select: 2), ``param - sign(grad)·step_size`` (``addcmul`` with value -1 and
    the sign: 3).

    Example:
        >>> rprop_flops()
        16
    """
    return _gradient(maximize, 0) + 2 + 6 + 3 + 2 + 1 + _fused(-1)


def muon_flops(rows: int, columns: int, *, momentum: Any = 0.95, nesterov: bool = True,
               ns_coefficients: tuple[Any, Any, Any] = (3.4445, -4.775, 2.0315),
               ns_steps: int = 5) -> FlopCount:
    """Muon's step on one (rows, columns) weight, m x n with m the smaller side: per element
    the momentum (``lerp`` 3; Nesterov's look-ahead ``lerp`` 3 more), the norm (2) and the
    division by it (1), ``param·(1 - lr·wd)`` (1, run whatever the decay) and ``param - lr·O``
    (2); then each Newton-Schulz step's three products, X·Xᵀ (2·m·n·m), ``addmm(A, A, A,
    beta=b, alpha=c)`` (2·m³, and per m² element the scaled add: 1, +1 for each factor other
    than ±1) and ``addmm(X, B, X, beta=a)`` (2·m·m·n, and per m·n element 1 + 1 for ``a``):
    4·m²·n + 2·m³ of products (GEMM) a step.

    Example:
        >>> muon_flops(6, 4, ns_steps=1)        # 24 elements; m = 4, n = 6
        FlopCount(flops=896, gemm=512, macs=256)
    """
    a, b, c = ns_coefficients
    m, n = sorted((rows, columns))
    elements = m * n
    per_element = _lerp(1 - momentum) + (_lerp(momentum) if nesterov else 0) + 2 + 1 + 1 + 2
    products = ns_steps * (4 * m * m * n + 2 * m ** 3)
    scaled_adds = ns_steps * (m * m * (1 + scalar_factor(b) + scalar_factor(c))
                              + elements * (1 + scalar_factor(a)))
    return FlopCount(elements * per_element + scaled_adds + products, products, products // 2)


def adafactor_flops(shape: tuple[int, ...], *, step: float, beta2_decay: float = -0.8,
                    weight_decay: Any = 0.0, maximize: bool = False) -> FlopCount:
    """Adafactor's step number ``step`` on one parameter of ``shape``: per element the
    parameter's norm (2), the update (clamp, rsqrt, times the gradient: 3), its norm (2) and
    ``param - alpha·update`` (2); a matrix (its last two dimensions, R x C, factored) the row
    and column norms of the gradient (2 each per element), each squared, divided and averaged
    into its running mean (``lerp`` by step^beta2_decay: 3, 2 where that is 1) per row or
    column, their outer product (2 per element, GEMM), its division by the rows' mean (the
    mean 1 per row, its clamp, 1 per element); a vector, the gradient squared (1) and averaged
    (3).

    Example:
        >>> adafactor_flops((3, 5), step=1), adafactor_flops((5,), step=2)
        (FlopCount(flops=276, gemm=30, macs=15), FlopCount(flops=65, gemm=0, macs=None))
    """
    elements = prod(shape)
    average = _lerp(float(step) ** beta2_decay)  # (a weight of 1 at the first step)
    flops = elements * (2 + (1 if weight_decay else 0) + (1 if maximize else 0) + 3 + 2 + 2)
    if len(shape) < 2:
        return FlopCount(flops + elements * (1 + average), 0, None)
    matrices = prod(shape[:-2])
    rows, columns = matrices * shape[-2], matrices * shape[-1]
    product = 2 * elements  # each matrix's outer product of its row and column means
    flops += (2 * elements + rows * (2 + average)) + (2 * elements + columns * (2 + average))
    return FlopCount(flops + product + rows + matrices + elements, product, product // 2)


class SparseGradientError(ValueError):
    """A step updates a parameter with a sparse gradient (``nn.Embedding(sparse=True)``): torch
    then updates only the stored rows, and a per-element formula over the parameter's elements
    would overcount it (an embedding table of 1,000 rows, 3 of them looked up: 16,000 FLOPs for
    SGD's 48), so its FLOPs are unknown."""


def _sparse(grad: Any) -> bool:
    return getattr(grad, "is_sparse", False)  # (tracetorch.core's tensors have no layouts)


def _updated(param: Any) -> bool:
    # Whether the step updates ``param`` (it has a gradient), raising for a sparse gradient.
    grad = param.grad
    if grad is None:
        return False
    if _sparse(grad):
        raise SparseGradientError("a parameter's gradient is sparse: no formula counts its "
                                  "stored elements")
    return True


def sparse_gradients(optimizer: Any) -> bool:
    """Whether a parameter ``optimizer`` updates has a sparse gradient (see
    :class:`SparseGradientError`).

    Example:
        >>> import torch
        >>> table = torch.nn.Parameter(torch.ones(4, 2))
        >>> table.grad = torch.ones(1, 2).to_sparse().sparse_resize_((4, 2), 2, 0)
        >>> sparse_gradients(torch.optim.SGD([table], lr=0.1))
        True
    """
    return any(_sparse(param.grad)
               for group in optimizer.param_groups for param in group["params"])


def _per_parameter(
        count: Callable[[Any, Mapping[str, Any], Mapping[str, Any]], FlopCount]) -> FlopRule:
    # The rule of an optimizer whose step on a parameter depends on its shape:
    # ``count(param, group, state)`` for each parameter with a gradient, summed.
    def rule(optimizer: Any, inputs: tuple[Any, ...], output: Any) -> FlopCount:
        total = gemm = 0
        for group in optimizer.param_groups:
            for param in group["params"]:
                if _updated(param):
                    found = count(param, group, optimizer.state.get(param, _NO_STATE))
                    total += found.flops
                    gemm += found.gemm
        return FlopCount(total, gemm, gemm // 2)

    return rule


def _torch_adafactor(param: Any, group: Mapping[str, Any],
                     state: Mapping[str, Any]) -> FlopCount:
    # Its shape decides what is factored, its step the running averages' weight.
    return adafactor_flops(tuple(param.shape), step=_step_number(state),
                           beta2_decay=group["beta2_decay"],
                           weight_decay=group["weight_decay"], maximize=group["maximize"])


def _torch_muon(param: Any, group: Mapping[str, Any], state: Mapping[str, Any]) -> FlopCount:
    # Its shape decides its products (Muon updates 2-D weights only: it raises on others).
    return muon_flops(*param.shape, momentum=group["momentum"], nesterov=group["nesterov"],
                      ns_coefficients=group["ns_coefficients"], ns_steps=group["ns_steps"])


def _step_number(state: Mapping[str, Any]) -> float:
    """The number of the step about to run, from a parameter's state (1 for the first)."""
    done = state.get("step")
    return float(done) + 1 if done is not None else 1.0


def _torch_sgd(group: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    return sgd_flops(lr=group["lr"], momentum=group["momentum"],
                     dampening=group["dampening"], nesterov=group.get("nesterov", False),
                     weight_decay=group["weight_decay"], maximize=group.get("maximize", False),
                     first_step=state.get("momentum_buffer") is None)


def _torch_adam(group: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    beta1, beta2 = group["betas"]
    return adam_flops(beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                      decoupled_weight_decay=group.get("decoupled_weight_decay", False),
                      amsgrad=group.get("amsgrad", False), maximize=group.get("maximize", False))


def _torch_adamw(group: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    beta1, beta2 = group["betas"]
    return adam_flops(beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                      decoupled_weight_decay=True, amsgrad=group.get("amsgrad", False),
                      maximize=group.get("maximize", False))


def _torch_adamax(group: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    return adamax_flops(beta1=group["betas"][0], weight_decay=group["weight_decay"],
                        maximize=group.get("maximize", False))


def _torch_nadam(group: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    beta1, beta2 = group["betas"]
    return nadam_flops(beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                       decoupled_weight_decay=group.get("decoupled_weight_decay", False),
                       maximize=group.get("maximize", False))


def _torch_radam(group: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    beta1, beta2 = group["betas"]
    return radam_flops(step=_step_number(state), beta1=beta1, beta2=beta2,
                       weight_decay=group["weight_decay"],
                       decoupled_weight_decay=group.get("decoupled_weight_decay", False),
                       maximize=group.get("maximize", False))


def _torch_rmsprop(group: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    return rmsprop_flops(lr=group["lr"], alpha=group["alpha"], weight_decay=group["weight_decay"],
                         momentum=group.get("momentum", 0), centered=group.get("centered", False),
                         maximize=group.get("maximize", False))


def _torch_adagrad(group: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    return adagrad_flops(lr=group["lr"], lr_decay=group["lr_decay"],
                         weight_decay=group["weight_decay"], maximize=group.get("maximize", False))


def _torch_adadelta(group: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    return adadelta_flops(lr=group["lr"], rho=group["rho"], weight_decay=group["weight_decay"],
                          maximize=group.get("maximize", False))


def _torch_asgd(group: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    return asgd_flops(weight_decay=group["weight_decay"], maximize=group.get("maximize", False),
                      averaging=asgd_averages(_step_number(state), group["t0"]))


def _torch_rprop(group: Mapping[str, Any], state: Mapping[str, Any]) -> int:
    return rprop_flops(maximize=group.get("maximize", False))


#: Per-element cost of one step of each ``torch.optim`` class, by class name, from a parameter
#: group's settings and the state of its first parameter with a gradient.
TORCH_STEP_FLOPS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], int]] = {
    "SGD": _torch_sgd, "Adam": _torch_adam, "AdamW": _torch_adamw, "Adamax": _torch_adamax,
    "NAdam": _torch_nadam, "RAdam": _torch_radam, "RMSprop": _torch_rmsprop,
    "Adagrad": _torch_adagrad, "Adadelta": _torch_adadelta, "ASGD": _torch_asgd,
    "Rprop": _torch_rprop,
}


def torch_step_rule(
        per_element: Callable[[Mapping[str, Any], Mapping[str, Any]], int]) -> FlopRule:
    """The FLOP rule of a torch optimizer whose per-element cost is ``per_element(group,
    state)``: each group's cost times its elements with a gradient, read before the step.

    Example:
        >>> import torch
        >>> weights = torch.nn.Parameter(torch.ones(3, 4))
        >>> frozen = torch.nn.Parameter(torch.ones(5))        # no gradient: not updated
        >>> weights.grad = torch.ones(3, 4)
        >>> rule = torch_step_rule(TORCH_STEP_FLOPS["Adam"])
        >>> rule(torch.optim.Adam([weights, frozen]), (), None)   # 13 per element, 12 elements
        156
    """
    def rule(optimizer: Any, inputs: tuple[Any, ...], output: Any) -> int:
        flops = 0
        state = optimizer.state
        for group in optimizer.param_groups:
            elements = 0
            first = None
            for param in group["params"]:
                if _updated(param):
                    elements += param.numel()
                    if first is None:
                        first = param
            if first is not None:
                flops += elements * per_element(group, state.get(first, _NO_STATE))
        return flops

    rule.__doc__ = f"FLOPs of one step: {per_element.__name__[len('_torch_'):]} per element."
    return rule


def register_torch_optimizer_rules(registry: FlopRegistry = default_registry) -> None:
    """Register the rules of :data:`TORCH_STEP_FLOPS` for the ``torch.optim`` classes (built-in
    rules: a user's :func:`~tracetorch.flop_rule` wins; registering again replaces them)."""
    import torch.optim

    for name, per_element in TORCH_STEP_FLOPS.items():
        optimizer_class = getattr(torch.optim, name, None)
        if optimizer_class is not None:
            registry.register(optimizer_class, builtin=True)(torch_step_rule(per_element))
    for name, count in (("Muon", _torch_muon), ("Adafactor", _torch_adafactor)):
        optimizer_class = getattr(torch.optim, name, None)  # (torch 2.9, 2.5 and later)
        if optimizer_class is not None:
            registry.register(optimizer_class, builtin=True)(_per_parameter(count))


def updated_parameters(optimizer: Any) -> Iterator[Any]:
    """The parameters ``optimizer`` updates: those of its ``param_groups`` (torch) or its
    ``params`` (``tracetorch.core``).

    Example:
        >>> class Plain:
        ...     params = ["w", "b"]
        >>> list(updated_parameters(Plain()))
        ['w', 'b']
    """
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        yield from getattr(optimizer, "params", ())
        return
    for group in groups:
        yield from group["params"]


def optimizer_scope(optimizer: Any, model: Any) -> str:
    """The path of the module of ``model`` that holds every parameter ``optimizer`` updates:
    ``""`` when it updates them all, when they span the model's top level, or when some are not
    the model's parameters.

    Example:
        >>> import torch
        >>> gan = torch.nn.ModuleDict({"netG": torch.nn.Linear(2, 2),
        ...                            "netD": torch.nn.Linear(2, 1)})
        >>> optimizer_scope(torch.optim.Adam(gan["netG"].parameters()), gan)
        'netG'
        >>> optimizer_scope(torch.optim.Adam(gan.parameters()), gan)
        ''
    """
    named = getattr(model, "named_parameters", None)
    if named is None:
        return ""
    names = {id(param): name for name, param in named()}
    common: list[str] | None = None
    updated = 0
    for param in updated_parameters(optimizer):
        updated += 1
        name = names.get(id(param))
        if name is None:
            return ""
        module_path = name.split(".")[:-1]
        if common is None:
            common = module_path
        else:
            size = 0
            for mine, theirs in zip(common, module_path):
                if mine != theirs:
                    break
                size += 1
            del common[size:]
        if not common:
            return ""
    if updated >= len(names):  # the whole model, whose parameters all sit in one attribute
        return ""
    return ".".join(common or ())
