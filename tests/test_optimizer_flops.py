"""Optimizer steps are counted (tracetorch.flops.optimizers): exact FLOPs per optimizer and
setting, checked against the operations torch runs; optimizers without a rule are counted by
their operations (unknown under ``ops=False``); sparse gradients leave a step unknown; several
optimizers of one class get names a user can tell apart.

Every case updates a (3, 4) and a (5,) parameter, 17 elements, next to a (7,) parameter whose
gradient stays None (torch does not update it, and it is not counted). The independent check
counts, under a TorchDispatchMode, every aten operation the single-tensor path (foreach=False)
runs on a tensor of at least one dimension, times its elements, by the convention of the
module: 1 per elementwise operation; add/sub 1 more with an ``alpha`` other than ±1;
addcmul/addcdiv 2, 1 more with a ``value`` other than ±1; lerp 2, 1 more with a weight other
than ±1; clamp 1 per bound; copies and new buffers 0. 0-dim tensors (the step counters) are
bookkeeping, left out by the convention.
"""
from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import tracetorch
from tracetorch.flops.optimizers import TORCH_STEP_FLOPS, torch_step_rule

ELEMENTS = 3 * 4 + 5  # the parameters with a gradient

# (class, settings, FLOPs per element at each step); the hand formula in the comment.
CASES: list[tuple[str, dict[str, Any], list[int]]] = [
    ("SGD", {"lr": 0.1}, [2] * 3),  # p - lr·g: add with alpha (2)
    ("SGD", {"lr": 1.0}, [1] * 3),  # alpha -1: a plain subtraction
    # first step copies g into the buffer; then buf·m (1) + g (1), update (2)
    ("SGD", {"lr": 0.1, "momentum": 0.9}, [2, 4, 4]),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1}, [2, 5, 5]),  # + (1-d)·g: 2
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}, [4, 6, 6]),  # g + m·buf: 2
    ("SGD", {"lr": 0.1, "weight_decay": 0.1, "maximize": True}, [5] * 3),  # -g 1, g + wd·p 2
    # lerp 3, mul + addcmul 4, sqrt ÷ +eps 3, addcdiv 3
    ("Adam", {}, [13] * 3),
    ("Adam", {"amsgrad": True, "weight_decay": 0.1, "maximize": True}, [17] * 3),  # +1 +2 +1
    ("Adam", {"weight_decay": 0.1, "decoupled_weight_decay": True}, [14] * 3),  # p·(1-lr·wd)
    ("AdamW", {}, [14] * 3),
    ("AdamW", {"amsgrad": True}, [15] * 3),
    ("Adamax", {}, [10] * 3),  # lerp 3, exp_inf·b2 |g| +eps max 4, addcdiv 3
    ("Adamax", {"weight_decay": 0.1, "maximize": True}, [13] * 3),
    ("NAdam", {}, [16] * 3),  # moments 7, ÷ sqrt +eps 3, two addcdiv 6
    ("NAdam", {"weight_decay": 0.1}, [18] * 3),
    ("NAdam", {"weight_decay": 0.1, "decoupled_weight_decay": True}, [17] * 3),
    # moments 7, m ÷ bc1 1; unrectified ·lr and subtract 2; rectified sqrt +eps, c/x as a
    # reciprocal and a multiply, three multiplies and subtract 8 (rho_t > 5 from step 6)
    ("RAdam", {}, [10] * 5 + [16] * 2),
    ("RAdam", {"weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True},
     [12] * 5 + [18] * 2),
    ("RMSprop", {}, [9] * 3),  # mul + addcmul 4, sqrt 1, +eps 1, addcdiv 3
    ("RMSprop", {"centered": True}, [14] * 3),  # lerp 3, addcmul with value -1 2
    ("RMSprop", {"momentum": 0.9}, [11] * 3),  # buf·m + addcdiv 3, p - lr·buf 2
    ("RMSprop", {"centered": True, "momentum": 0.9, "weight_decay": 0.1, "maximize": True},
     [19] * 3),
    ("Adagrad", {}, [7] * 3),  # addcmul with value 1 2, sqrt +eps 2, addcdiv 3
    ("Adagrad", {"lr_decay": 0.1, "weight_decay": 0.1, "maximize": True}, [10] * 3),
    # mul + addcmul 4, sqrt(+eps) twice 4, ÷ · 2, mul + addcmul 4, p - lr·delta (lr 1) 1
    ("Adadelta", {}, [15] * 3),
    ("Adadelta", {"lr": 0.5, "weight_decay": 0.1, "maximize": True}, [19] * 3),
    # p·(1-λη) 1, p - η·g 2; averaging (mu != 1 from step t0 + 3) ax + mu·(p - ax) 3
    ("ASGD", {}, [3] * 3),
    ("ASGD", {"t0": 1.0, "weight_decay": 0.1, "maximize": True}, [6, 6, 6, 9, 9]),
    # sign(g·prev) 2, three compare-and-selects 6, ·factor + clamp 3, compare-and-select 2,
    # sign 1, addcmul with value -1 2
    ("Rprop", {}, [16] * 3),
    ("Rprop", {"maximize": True}, [17] * 3),
]
IDS = [f"{name}-{'-'.join(f'{k}={v}' for k, v in settings.items()) or 'default'}"
       for name, settings, _ in CASES]
FUSED = ("SGD", "Adam", "AdamW", "Adagrad")  # the classes with a fused path on CPU

_FREE = frozenset({
    "copy", "clone", "detach", "alias", "lift_fresh", "lift_fresh_copy", "_to_copy",
    "empty_like", "zeros_like", "ones_like", "full_like", "fill", "zero", "view", "empty",
    "zeros", "_local_scalar_dense", "scalar_tensor", "empty_strided", "new_empty", "new_zeros"})
_ONE = frozenset({
    "add", "sub", "mul", "div", "neg", "sqrt", "abs", "sign", "reciprocal", "maximum",
    "minimum", "gt", "lt", "eq", "ge", "le", "where", "masked_fill", "index_put"})


def _factor(value: Any) -> int:
    return 0 if type(value) in (int, float) and abs(value) == 1 else 1


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str,
              default: Any) -> Any:
    return kwargs.get(name, args[index] if len(args) > index else default)


def _op_counter(torch: ModuleType) -> Any:
    """A dispatch mode counting, by the module's convention, the FLOPs of the operations run
    under it on tensors of at least one dimension."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.flops = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func.overloadpacket.__name__.rstrip("_")
            target = args[0] if name == "index_put" else out  # a masked write: its target
            if not isinstance(target, torch.Tensor) or target.dim() == 0 or name in _FREE:
                return out
            if name in ("add", "sub"):
                cost = 1 + _factor(_argument(args, kwargs, 2, "alpha", 1))
            elif name in ("addcmul", "addcdiv"):
                cost = 2 + _factor(_argument(args, kwargs, 3, "value", 1))
            elif name == "lerp":
                weight = args[2]
                cost = 3 if isinstance(weight, torch.Tensor) else 2 + _factor(weight)
            elif name == "clamp":
                cost = sum(_argument(args, kwargs, index, bound, None) is not None
                           for index, bound in ((1, "min"), (2, "max")))
            elif name in _ONE:
                cost = 1
            else:
                raise AssertionError(f"no cost for {func}: extend the counter")
            self.flops += cost * target.numel()
            return out

    return OpCounter


def _parameters(torch: ModuleType) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    return (torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5)),
            torch.nn.Parameter(torch.randn(7)))


def _set_grads(torch: ModuleType, params: tuple[Any, Any, Any], step: int) -> None:
    generator = torch.Generator().manual_seed(step)
    params[0].grad = torch.randn(3, 4, generator=generator)
    params[1].grad = torch.randn(5, generator=generator)


@pytest.mark.parametrize(("name", "settings", "per_step"), CASES, ids=IDS)
def test_formula_matches_the_operations_torch_runs(torch: ModuleType, name: str,
                                                   settings: dict[str, Any],
                                                   per_step: list[int]) -> None:
    params = _parameters(torch)
    optimizer = getattr(torch.optim, name)(params, foreach=False, **settings)
    rule = torch_step_rule(TORCH_STEP_FLOPS[name])
    counter = _op_counter(torch)
    ruled, counted = [], []
    for step in range(len(per_step)):
        _set_grads(torch, params, step)
        ruled.append(rule(optimizer, (), None))  # before the step, as the profiler runs it
        with counter() as ops:
            optimizer.step()
        counted.append(ops.flops)
    expected = [flops * ELEMENTS for flops in per_step]
    assert (ruled, counted) == (expected, expected)


@pytest.mark.parametrize(("name", "settings", "per_step"), CASES, ids=IDS)
def test_profiled_step_flops_on_every_path(torch: ModuleType, name: str,
                                          settings: dict[str, Any],
                                          per_step: list[int]) -> None:
    paths: list[dict[str, Any]] = [{"foreach": False}, {"foreach": True}]
    if name in FUSED:
        paths.append({"fused": True})
    totals = []
    for path in paths:
        params = _parameters(torch)
        optimizer = getattr(torch.optim, name)(params, **path, **settings)
        with tracetorch.profile() as prof:
            for step in range(len(per_step)):
                _set_grads(torch, params, step)
                optimizer.step()
        node = prof.find(f"{name}.step")
        assert (node.calls, node.flops_source, node.completeness) == (
            len(per_step), "rule", "complete")
        assert prof.unsupported == {} and prof.completeness == "complete"
        totals.append(node.flops)
    assert totals == [sum(per_step) * ELEMENTS] * len(paths)


def test_only_parameters_with_a_gradient_count(torch: ModuleType) -> None:
    params = _parameters(torch)
    optimizer = torch.optim.Adam([{"params": params[:2]}, {"params": params[2:], "lr": 0.1}])
    with tracetorch.profile() as prof:
        _set_grads(torch, params, 0)
        optimizer.step()  # the (7,) parameter has no gradient: 17 elements
        params[2].grad = torch.ones(7)
        optimizer.step()  # now all three: 24 elements
    # Adam: 13 per element
    assert prof.find("Adam.step").flops == 13 * ELEMENTS + 13 * (ELEMENTS + 7)


def _sign_step(torch: ModuleType) -> type:
    class SignStep(torch.optim.Optimizer):  # a user's optimizer, with no rule
        def __init__(self, params: Any) -> None:
            super().__init__(params, {"lr": 0.1})

        @torch.no_grad()
        def step(self, closure: Any = None) -> None:
            for group in self.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        param.add_(param.grad.sign(), alpha=-group["lr"])

    return SignStep


def test_an_optimizer_without_a_rule_is_counted_by_its_operations(torch: ModuleType) -> None:
    # sign, then p - lr·sign (an add with alpha): 3 per element with a gradient, as the
    # convention's counter counts what torch runs
    params = _parameters(torch)
    optimizer = _sign_step(torch)(params)
    counted = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # counted: nothing to warn of
        with tracetorch.profile() as prof:
            for step in range(2):
                _set_grads(torch, params, step)
                with _op_counter(torch)() as ops:
                    optimizer.step()
                counted.append(ops.flops)
    node = prof.find("SignStep.step")
    assert counted == [3 * ELEMENTS] * 2
    assert (node.calls, node.flops, node.flops_source) == (2, 6 * ELEMENTS, "ops")
    assert node.completeness == "complete" and prof.unsupported == {}


def test_an_optimizer_written_with_foreach_functions_counts_as_its_single_tensor_twin(
        torch: ModuleType) -> None:
    class ForeachSignStep(torch.optim.Optimizer):
        def __init__(self, params: Any) -> None:
            super().__init__(params, {"lr": 0.1})

        @torch.no_grad()
        def step(self, closure: Any = None) -> None:
            for group in self.param_groups:
                params = [param for param in group["params"] if param.grad is not None]
                signs = torch._foreach_sign([param.grad for param in params])
                torch._foreach_add_(params, signs, alpha=-group["lr"])

    params = _parameters(torch)
    optimizer = ForeachSignStep(params)
    with tracetorch.profile() as prof:
        for step in range(2):
            _set_grads(torch, params, step)
            optimizer.step()
    node = prof.find("ForeachSignStep.step")
    assert (node.flops, node.flops_source, node.completeness) == (6 * ELEMENTS, "ops", "complete")


def test_without_counted_operations_an_optimizer_without_a_rule_is_unknown(
        torch: ModuleType) -> None:
    params = _parameters(torch)
    optimizer = _sign_step(torch)(params)
    with pytest.warns(UserWarning, match="no FLOP rule for SignStep.*ops=False") as caught:
        with tracetorch.profile(ops=False) as prof:
            for step in range(2):
                _set_grads(torch, params, step)
                optimizer.step()
    assert caught[0].filename == __file__  # pointed at the step() call
    node = prof.find("SignStep.step")
    assert (node.calls, node.flops, node.flops_source) == (2, 0, "none")
    assert node.flops_unknown and node.completeness == "unknown"
    assert prof.unsupported == {"SignStep": 2} and prof.completeness == "unknown"
    row = next(line for line in prof.table().splitlines() if line.startswith("SignStep.step"))
    assert row.split()[2:4] == ["2", "?"]  # its calls, and FLOPs shown unknown

    def sign_step_flops(opt: Any, inputs: tuple[Any, ...], output: Any) -> int:
        # sign, then p - lr·sign: 3 per element with a gradient, counted before the step
        return 3 * sum(p.numel() for g in opt.param_groups for p in g["params"]
                       if p.grad is not None)

    with tracetorch.profile(ops=False, flop_rules={type(optimizer): sign_step_flops}) as prof:
        _set_grads(torch, params, 0)
        optimizer.step()
    node = prof.find("SignStep.step")
    assert (node.flops, node.completeness, prof.unsupported) == (3 * ELEMENTS, "complete", {})


def _muon_counter(torch: ModuleType) -> Any:
    """The convention's counter, with Muon's and Adafactor's operations besides: their
    products (2·M·K·N; addmm's scaled add by the convention, 1 more for each factor other than
    ±1), a norm (2 per element: square, add), a mean (1 per element), a square and a reciprocal
    root (1), and the copy to bfloat16 and the transposes (free)."""
    elementwise = _op_counter(torch)

    class MuonCounter(elementwise):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.gemm = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__.rstrip("_")
            if name not in ("mm", "bmm", "addmm", "linalg_vector_norm", "permute", "expand",
                            "_unsafe_view", "mean", "pow", "rsqrt"):
                return super().__torch_dispatch__(func, types, args, kwargs)
            out = func(*args, **kwargs)
            if name == "linalg_vector_norm":
                self.flops += 2 * args[0].numel()
            elif name in ("mean", "pow", "rsqrt"):
                self.flops += args[0].numel()
            elif name in ("mm", "bmm", "addmm"):
                left, right = args[-2:]
                product = 2 * left.numel() * right.shape[-1]
                self.gemm += product
                self.flops += product
                if name == "addmm":
                    self.flops += out.numel() * (1 + _factor(kwargs.get("beta", 1))
                                                 + _factor(kwargs.get("alpha", 1)))
            return out

    return MuonCounter


def _counted_steps(torch: ModuleType, optimizer: Any, params: tuple[Any, ...]
                   ) -> tuple[list[int], list[int]]:
    # Three steps on fresh gradients, each step's FLOPs and GEMM FLOPs as _muon_counter counts.
    counter = _muon_counter(torch)
    counted, gemm = [], []
    for _ in range(3):
        for param in params:
            param.grad = torch.randn(param.shape)
        with counter() as ops:
            optimizer.step()
        counted.append(ops.flops)
        gemm.append(ops.gemm)
    return counted, gemm


@pytest.mark.parametrize("settings", [{}, {"nesterov": False, "weight_decay": 0.0},
                                      {"ns_steps": 2, "momentum": 0.9}])
def test_muon_counts_its_newton_schulz_products_and_its_elementwise_steps(
        torch: ModuleType, settings: dict[str, Any]) -> None:
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon came with torch 2.9")
    torch.manual_seed(0)
    wide, tall = torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(torch.randn(7, 3))
    params = (wide, tall)
    optimizer = torch.optim.Muon(params, **settings)
    counted, gemm = _counted_steps(torch, optimizer, params)
    for param in params:
        param.grad = torch.randn(param.shape)
    with tracetorch.profile() as prof:
        for _ in range(3):
            optimizer.step()
    node = prof.find("Muon.step")
    assert (node.calls, node.flops_source, node.completeness) == (3, "rule", "complete")
    assert (node.flops, node.gemm_flops) == (sum(counted), sum(gemm))
    # Each Newton-Schulz step of an m x n weight (m ≤ n): 4·m²·n + 2·m³ of products
    steps = settings.get("ns_steps", 5)
    assert gemm[0] == steps * ((4 * 16 * 6 + 2 * 64) + (4 * 9 * 7 + 2 * 27))


@pytest.mark.parametrize("settings", [{}, {"weight_decay": 0.1, "maximize": True}])
def test_adafactor_counts_its_factored_moments_and_their_outer_product(
        torch: ModuleType, settings: dict[str, Any]) -> None:
    torch.manual_seed(0)
    params = (torch.nn.Parameter(torch.randn(3, 5)), torch.nn.Parameter(torch.randn(2, 4, 3)),
              torch.nn.Parameter(torch.randn(6)))
    counted, gemm = _counted_steps(
        torch, torch.optim.Adafactor(params, foreach=False, **settings), params)
    for foreach in (False, True):
        optimizer = torch.optim.Adafactor([torch.nn.Parameter(p.detach().clone()) for p in params],
                                          foreach=foreach, **settings)
        with tracetorch.profile() as prof:
            for _ in range(3):
                for param in optimizer.param_groups[0]["params"]:
                    param.grad = torch.randn(param.shape)
                optimizer.step()
        node = prof.find("Adafactor.step")
        assert (node.flops_source, node.completeness) == ("rule", "complete")
        assert (node.flops, node.gemm_flops) == (sum(counted), sum(gemm))
    # the outer products of the row and column means: 2 per element of each matrix
    assert gemm == [2 * (15 + 24)] * 3


def test_a_subclass_whose_step_does_more_is_counted_by_its_operations(torch: ModuleType) -> None:
    # SGD's rule covers a subclass that keeps SGD's step (an LR scheduler wrapping the
    # instance's changes nothing), not one whose own step does more: it read SGD's 2 per
    # element, "complete"
    class Lookahead(torch.optim.SGD):
        @torch.no_grad()
        def step(self, closure: Any = None) -> None:
            super().step(closure)
            for group in self.param_groups:
                for param in group["params"]:
                    slow = self.state[param].setdefault("slow", param.detach().clone())
                    slow.add_(param - slow, alpha=0.5)  # subtract 1, scaled add 2
                    param.copy_(slow)

    class Renamed(torch.optim.SGD):
        pass

    for optimizer_class, per_element, source in ((Lookahead, 2 + 3, "ops"),
                                                 (Renamed, 2, "rule"),
                                                 (torch.optim.SGD, 2, "rule")):
        params = _parameters(torch)
        optimizer = optimizer_class(params[:2], lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
        with tracetorch.profile() as prof:
            for step in range(2):
                _set_grads(torch, params, step)
                optimizer.step()
                scheduler.step()
        node = prof.find(f"{optimizer_class.__name__}.step")
        assert (node.flops, node.flops_source, node.completeness) == (
            2 * per_element * ELEMENTS, source, "complete"), optimizer_class


def test_lbfgs_is_counted_by_its_operations_with_the_closures_calls_under_it(
        torch: ModuleType) -> None:
    # LBFGS has no formula (its line search runs as long as the loss asks): its own operations
    # are counted, and the model calls and backward passes its closure runs are its children
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=3)
    inputs, targets = torch.randn(8, 4), torch.randn(8, 1)
    evaluations = []

    def closure() -> Any:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        evaluations.append(1)
        return loss

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # counted: nothing to warn of
        with tracetorch.profile(model) as prof:
            for _ in range(2):
                optimizer.step(closure)
    step = prof.find("LBFGS.step")
    assert (step.calls, step.flops_source, step.completeness) == (2, "ops", "complete")
    assert step.flops > 0 and prof.completeness == "complete" and prof.unsupported == {}
    forward = step.children[""]
    assert forward.calls == len(evaluations) > 2
    # each evaluation: the two Linears (2·in·out per row, the bias in the product's adds:
    # 8·24 and 8·6) and Tanh (24)
    assert forward.subtree_flops == len(evaluations) * (8 * 24 + 24 + 8 * 6)


@pytest.mark.parametrize("name", ["SGD", "Adagrad", "SparseAdam"])
def test_a_step_with_a_sparse_gradient_is_unknown_not_counted_over_the_table(
        torch: ModuleType, name: str) -> None:
    # nn.Embedding(sparse=True): torch updates the rows looked up (3 of 1,000 here, 2·3·8 = 48
    # FLOPs for SGD); counted over the table, SGD's step read the dense table's 16,000
    table = torch.nn.Embedding(1000, 8, sparse=True)
    optimizer = getattr(torch.optim, name)(table.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match=f"{name}.*sparse"):
        with tracetorch.profile(table) as prof:
            for _ in range(2):
                table(torch.tensor([1, 5, 7])).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
    step = prof.find(f"{name}.step")
    assert (step.calls, step.flops, step.flops_source) == (2, 0, "uncounted")
    assert step.completeness == "unknown" and prof.completeness == "partial"
    dense = torch.nn.Embedding(1000, 8)
    if name != "SparseAdam":  # (which takes sparse gradients only)
        optimizer = getattr(torch.optim, name)(dense.parameters(), lr=0.1)
        with tracetorch.profile(dense) as prof:
            dense(torch.tensor([1, 5, 7])).sum().backward()
            optimizer.step()
        step = prof.find(f"{name}.step")
        assert step.completeness == "complete"
        if name == "SGD":
            assert step.flops == 2 * 1000 * 8


def test_profiling_leaves_the_optimizer_and_torch_as_they_were(torch: ModuleType) -> None:
    from torch.optim import optimizer as optimizer_module

    hooks = (dict(optimizer_module._global_optimizer_pre_hooks),
             dict(optimizer_module._global_optimizer_post_hooks))
    plain, profiled = _parameters(torch), _parameters(torch)
    optimizers = [torch.optim.SGD(params, lr=0.1, momentum=0.9) for params in (plain, profiled)]
    attributes = dict(vars(optimizers[1]))
    step_function = torch.optim.SGD.step
    for step in range(3):
        _set_grads(torch, plain, step)
        optimizers[0].step()
    with tracetorch.profile():
        for step in range(3):
            _set_grads(torch, profiled, step)
            optimizers[1].step()
    assert torch.optim.SGD.step is step_function and vars(optimizers[1]) == attributes
    assert (dict(optimizer_module._global_optimizer_pre_hooks),
            dict(optimizer_module._global_optimizer_post_hooks)) == hooks
    assert profiled[2] not in optimizers[1].state  # reading the state added no entry
    for mine, theirs in zip(profiled, plain):
        assert torch.equal(mine, theirs)  # the same updates


def _gan(torch: ModuleType) -> Any:
    class GAN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.netG = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
            self.netD = torch.nn.Linear(4, 1)

    return GAN()


def _train_gan(torch: ModuleType, gan: Any, steps: int) -> tuple[Any, Any]:
    opt_g = torch.optim.Adam(gan.netG.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(gan.netD.parameters(), lr=1e-3)
    noise = torch.randn(2, 4)
    for _ in range(steps):
        opt_d.zero_grad()
        gan.netD(gan.netG(noise).detach()).mean().backward()
        opt_d.step()
        opt_g.zero_grad()
        gan.netD(gan.netG(noise)).mean().backward()
        opt_g.step()
    return opt_g, opt_d


def test_two_optimizers_of_one_class_are_named_by_what_they_update(torch: ModuleType) -> None:
    gan = _gan(torch)
    with tracetorch.profile(gan) as prof:
        _train_gan(torch, gan, 2)
    steps = [node.path for node in prof.nodes() if node.kind == "optimizer"]
    assert steps == ["Adam.step[netD]", "Adam.step[netG]"]
    # Adam: 13 per element; netD 4 + 1 elements, netG 4·8 + 8 + 8·4 + 4 = 76, two steps each.
    assert prof.find("Adam.step[netD]").flops == 2 * 13 * 5
    assert prof.find("Adam.step[netG]").flops == 2 * 13 * 76


def test_without_the_model_they_are_told_apart_by_order(torch: ModuleType) -> None:
    gan = _gan(torch)
    with tracetorch.profile() as prof:
        _train_gan(torch, gan, 2)
    steps = [(node.path, node.flops) for node in prof.nodes() if node.kind == "optimizer"]
    assert steps == [("Adam.step", 2 * 13 * 5), ("Adam.step#2", 2 * 13 * 76)]


def test_one_optimizer_of_the_whole_model_is_plain(torch: ModuleType) -> None:
    gan = _gan(torch)
    optimizer = torch.optim.SGD(gan.parameters(), lr=0.1)
    with tracetorch.profile(gan) as prof:
        gan.netD(gan.netG(torch.randn(2, 4))).mean().backward()
        optimizer.step()
    # SGD: 2 per element of all 81 parameters
    assert [n.path for n in prof.nodes() if n.kind == "optimizer"] == ["SGD.step"]
    assert prof.find("SGD.step").flops == 2 * 81


def test_core_optimizers_follow_the_same_formulas() -> None:
    from tracetorch.core import Tensor
    from tracetorch.core.optim import SGD, Adam

    def parameters() -> list[Tensor]:
        return [Tensor(np.ones(shape, dtype=np.float32), requires_grad=True)
                for shape in ((3, 4), (5,), (7,))]

    for optimizer_class, settings, per_element in (
            (SGD, {"lr": 0.1}, 2),  # p -= lr·g
            (SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.1}, 6),  # +wd·p 2, buf 2
            (Adam, {}, 13),  # m 3, v 4, v/c2 sqrt +eps 3, scale ÷ subtract 3
            (Adam, {"weight_decay": 0.1}, 15)):
        params = parameters()
        optimizer = optimizer_class(params, **settings)
        with tracetorch.profile() as prof:
            for _ in range(2):
                for param in params[:2]:  # the (7,) one has no gradient: skipped, not counted
                    param.grad = Tensor(np.ones(param.data.shape, dtype=np.float32))
                optimizer.step()
        node = prof.find(f"{optimizer_class.__name__}.step")
        assert (node.flops, node.completeness) == (2 * per_element * ELEMENTS, "complete")
