"""Operation counting through torch's function-mode stack: nothing of torch is replaced."""
from __future__ import annotations

import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from support.processes import run_captured

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:tracetorch has no FLOP rule")


def stack_depth(torch: Any) -> int:
    return torch._C._len_torch_function_stack()


def matmul_layer(torch: Any, width: int = 4) -> Any:
    """A layer without a FLOP rule whose forward is one ``x @ w``."""
    class MatMul(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(width, width))
            self.depths: list[int] = []

        def forward(self, x: Any) -> Any:
            self.depths.append(stack_depth(torch))
            return x @ self.w

    return MatMul()


# ----------------------------------------------------------------------------- identity
@pytest.mark.slow
def test_every_torch_attribute_is_the_same_object_during_and_after_a_block(torch_installed):
    code = textwrap.dedent("""
        import torch, tracetorch
        import torch.nn.functional as F

        def snapshot():
            spaces = {"torch": torch, "F": F, "Tensor": torch.Tensor,
                      "autograd": torch.autograd}
            return {name: ({k: v for k, v in vars(space).items()}, sorted(dir(space)))
                    for name, space in spaces.items()}

        def differences(a, b):
            out = []
            for name, (attrs, names) in a.items():
                now, now_names = b[name]
                if names != now_names:
                    out.append((name, sorted(set(names) ^ set(now_names))))
                out += [(name, k) for k, v in attrs.items() if now.get(k, object()) is not v]
            return out

        lin = torch.nn.Linear(4, 4)
        before = snapshot()
        with tracetorch.profile() as prof:
            loss = lin(torch.ones(2, 4)).sum()
            loss.backward()
            during = snapshot()
        after = snapshot()
        print(differences(before, during), differences(before, after),
              prof.find("backward").calls, torch._C._len_torch_function_stack())
    """)
    out = run_captured([sys.executable, "-c", code], cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "[]", "1", "0"]


# ----------------------------------------------------------------------------- what is counted
def test_a_function_bound_before_the_block_is_counted(torch):
    from torch import matmul  # bound before any profile opens: no replacement could reach it

    class Bound(torch.nn.Module):
        def forward(self, a: Any, b: Any) -> Any:
            return matmul(a, b)

    import tracetorch

    layer = Bound()
    with tracetorch.profile(layer) as prof:
        layer(torch.ones(3, 4, 5), torch.ones(5, 6))
    assert prof.find("").flops_source == "ops"
    assert prof.gemm_flops == prof.forward_flops == 2 * 3 * 4 * 5 * 6


def test_tensor_attribute_reads_and_writes_are_no_operations(torch):
    # torch hands a function mode each tensor property read or written (``x.shape``,
    # ``p.grad = g``) as the property's ``__get__``/``__set__``: none is a row of the op table.
    import tracetorch

    class Reads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4, 4))

        def forward(self, x: Any) -> Any:
            rows, width = x.shape
            self.w.grad = torch.zeros(4, 4) if x.dtype == torch.float32 else None
            return (x @ self.w).transpose(0, 1) if x.device.type == "cpu" else x

    layer = Reads()
    with tracetorch.profile(layer) as prof:
        layer(torch.ones(3, 4))
    node = prof.find("")
    assert set(node.ops) == {"zeros", "matmul", "transpose"}
    assert node.flops == 2 * 3 * 4 * 4


def test_a_layer_that_only_reads_its_input_costs_a_known_zero(torch):
    import warnings

    import tracetorch

    class ShapeCheck(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            if x.shape[-1] != 4 or x.dtype != torch.float32:
                raise ValueError("x: expected (..., 4) float32")
            return x

    layer = ShapeCheck()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no FLOP rule" warning: it ran nothing
        with tracetorch.profile(layer) as prof:
            layer(torch.ones(2, 4))
    node = prof.find("")
    assert (node.flops, node.flops_source, dict(node.ops)) == (0, "ops", {})


def test_every_spelling_of_a_product_is_counted_once(torch):
    import tracetorch

    a, b = torch.ones(4, 5), torch.ones(5, 6)
    one = 2 * 4 * 5 * 6
    spellings = {
        "torch.matmul": lambda: torch.matmul(a, b), "@": lambda: a @ b,
        "Tensor.matmul": lambda: a.matmul(b), "Tensor.__matmul__": lambda: a.__matmul__(b),
        "linalg.matmul": lambda: torch.linalg.matmul(a, b),
        "__rmatmul__": lambda: b.__rmatmul__(a), "mm": lambda: a.mm(b),
        "addmm_": lambda: torch.zeros(4, 6).addmm_(a, b),
        "baddbmm_": lambda: torch.zeros(1, 4, 6).baddbmm_(a[None], b[None]),
        "F.linear": lambda: torch.nn.functional.linear(a, b.T),
        "einsum": lambda: torch.einsum("ik,kj->ij", [a, b]),
        "kwargs": lambda: torch.mm(input=a, mat2=b),
    }
    for name, spelling in spellings.items():
        with tracetorch.profile() as prof:
            spelling()
        assert prof.gemm_flops == one, name


def test_a_scalar_factor_folded_into_an_operation_is_a_multiply_more(torch):
    # add's and sub's alpha, addcmul's and addcdiv's value, lerp's weight: +1 per element
    # unless ±1 (a tensor weight always), the optimizer rules' convention
    import tracetorch

    x, y = torch.ones(10), torch.full((10,), 2.0)
    spellings = {
        "x + y": (lambda: x + y, 1), "add": (lambda: x.add(y), 1),
        "add alpha -1": (lambda: torch.add(x, y, alpha=-1), 1),
        "add alpha 0.5": (lambda: x.add(y, alpha=0.5), 2),
        "add_ alpha 2": (lambda: x.clone().add_(y, alpha=2), 2),
        "sub alpha 3": (lambda: torch.sub(x, y, alpha=3), 2),
        "addcmul": (lambda: x.addcmul(y, y), 2),
        "addcmul value 0.1": (lambda: torch.addcmul(x, y, y, value=0.1), 3),
        "addcdiv_ value -1": (lambda: x.clone().addcdiv_(y, y, value=-1), 2),
        "lerp 0.1": (lambda: x.lerp(y, 0.1), 3), "lerp 1": (lambda: torch.lerp(x, y, 1.0), 2),
        "lerp_ tensor": (lambda: x.clone().lerp_(y, torch.full((10,), 0.5)), 3),
    }
    for name, (spelling, per_element) in spellings.items():
        with tracetorch.profile() as prof:
            spelling()
        assert prof.forward_flops == 10 * per_element, name


def test_a_foreach_function_costs_its_single_tensor_form_over_every_tensor(torch):
    # optimizers' foreach paths and clip_grad_norm_ run these over lists of tensors: they
    # counted nothing
    import tracetorch

    def tensors():
        return [torch.ones(3, 4), torch.ones(5)]

    others = tensors()
    elements = 3 * 4 + 5
    spellings = {
        "_foreach_add_ alpha": (lambda: torch._foreach_add_(tensors(), others, alpha=0.1), 2),
        "_foreach_add scalar": (lambda: torch._foreach_add(tensors(), 1.0), 1),
        "_foreach_mul_": (lambda: torch._foreach_mul_(tensors(), 0.5), 1),
        "_foreach_lerp_": (lambda: torch._foreach_lerp_(tensors(), others, 0.9), 3),
        "_foreach_addcmul_ value": (
            lambda: torch._foreach_addcmul_(tensors(), others, others, value=2), 3),
        "_foreach_sqrt": (lambda: torch._foreach_sqrt(tensors()), 1),
        "_foreach_norm": (lambda: torch._foreach_norm(tensors()), 2),
    }
    for name, (spelling, per_element) in spellings.items():
        with tracetorch.profile() as prof:
            spelling()
        assert prof.forward_flops == elements * per_element, name


def test_a_torch_function_subclass_sees_the_same_func_inside_and_outside(torch):
    import tracetorch

    class Logged(torch.Tensor):
        seen: list[tuple[bool, str]] = []

        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            cls.seen.append((func is torch.matmul, getattr(func, "__name__", "")))
            return super().__torch_function__(func, types, args, kwargs or {})

    x = torch.ones(2, 2).as_subclass(Logged)

    def run() -> list[tuple[bool, str]]:
        Logged.seen = []
        torch.matmul(x, x)
        x @ x
        return Logged.seen

    outside = run()
    with tracetorch.profile() as prof:
        inside = run()
    assert inside == outside
    assert outside[0] == (True, "matmul")
    assert prof.gemm_flops == 2 * (2 * 2 * 2 * 2)


def _logged_step(torch: Any) -> tuple[Any, Any]:
    """A model with and without FLOP rules, and a step that runs it forward and backward on a
    tensor subclass logging every ``__torch_function__`` call (a getter as ``attr.__get__``)."""
    class Logged(torch.Tensor):
        log: list[str] = []

        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            owner = getattr(func, "__self__", None)
            name = getattr(func, "__name__", "")
            cls.log.append(f"{owner.__name__}.{name}" if hasattr(owner, "__name__") else name)
            return super().__torch_function__(func, types, args, kwargs or {})

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), matmul_layer(torch),
                                torch.nn.Linear(4, 2))

    def step() -> list[str]:
        x = torch.randn(3, 4).as_subclass(Logged).requires_grad_()
        Logged.log = []  # (a new list: the next step's requires_grad_ lands in this one's log)
        model(x).sum().backward()
        return list(Logged.log)

    return model, step


def test_a_torch_function_subclass_sees_no_autograd_read_or_write_of_the_profiler(torch):
    import tracetorch

    model, step = _logged_step(torch)
    step()
    outside = step()
    with tracetorch.profile(model):
        step()  # first calls: FLOP rules, gradient parts, saved tensors
        inside = step()
    reads = ("grad_fn.", "_backward_hooks.", "requires_grad.")
    assert [c for c in inside if c.startswith(reads)] == [c for c in outside if c.startswith(reads)]


def test_a_torch_function_subclass_logs_the_same_calls_inside_and_outside(torch):
    # The engine's key reads each layer input's .shape and .dtype quietly (tensors.QUIET_READS).
    import tracetorch

    model, step = _logged_step(torch)
    step()
    outside = step()
    with tracetorch.profile(model):
        step()
        inside = step()
    assert inside == outside


def test_ops_false_counts_rules_only_and_keeps_the_mode_off_inside_layers(torch):
    import tracetorch

    custom, lin = matmul_layer(torch), torch.nn.Linear(4, 4)
    x = torch.ones(3, 4)
    with tracetorch.profile(ops=False) as prof:
        custom(x)
        lin(x)
    assert custom.depths == [0]
    assert prof.find("").flops == 0
    assert prof.find("Linear").flops == 2 * 3 * 4 * 4
    with tracetorch.profile() as prof:
        custom(x)
    assert custom.depths == [0, 1]
    assert prof.find("").flops == 2 * 3 * 4 * 4


def test_a_layer_with_a_rule_runs_without_the_mode(torch):
    import tracetorch

    depths: list[int] = []

    class Recording(torch.nn.Linear):  # a rule of its own: its operations are not needed
        def forward(self, x: Any) -> Any:
            depths.append(stack_depth(torch))
            return super().forward(x)

    def product(layer: Any, inputs: Any, output: Any) -> int:
        return 2 * inputs[0].shape[0] * layer.in_features * layer.out_features

    layer = Recording(4, 4)
    with tracetorch.profile(flop_rules={Recording: product}) as prof:
        layer(torch.ones(2, 4))
        depths.append(stack_depth(torch))
    assert depths == [0, 1]
    assert prof.find("").flops == 2 * 2 * 4 * 4


@pytest.mark.filterwarnings("ignore:`torch.jit.trace")
def test_tracing_inside_a_block_counts_nothing_and_reads_no_proxy(torch):
    import tracetorch

    layer = matmul_layer(torch)
    x = torch.ones(2, 4)
    with tracetorch.profile() as prof:
        graph = torch.fx.symbolic_trace(layer)
        traced = torch.jit.trace(layer, x, check_trace=False)  # a check would really run it
    assert prof.gemm_flops == 0
    assert torch.equal(graph(x), layer(x)) and torch.equal(traced(x), layer(x))


# ----------------------------------------------------------------------------- the stack
def test_the_mode_is_gone_after_the_block_also_after_an_exception(torch):
    import tracetorch

    layer = matmul_layer(torch)
    with tracetorch.profile():
        layer(torch.ones(1, 4))
        assert stack_depth(torch) == 1
    assert stack_depth(torch) == 0
    with pytest.raises(ValueError, match="boom"):
        with tracetorch.profile():
            layer(torch.ones(1, 4))
            raise ValueError("boom")
    assert stack_depth(torch) == 0
    assert layer.depths == [1, 1]


def test_a_users_own_modes_are_left_where_they_are(torch):
    from torch.overrides import TorchFunctionMode

    import tracetorch

    class Counting(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            self.calls += 1
            return func(*args, **(kwargs or {}))

    lin, x = torch.nn.Linear(4, 4), torch.ones(2, 4)
    outer = Counting()
    with outer:
        with tracetorch.profile() as prof:
            lin(x)
            assert torch.overrides._get_current_function_mode_stack()[0] is outer
            inner = Counting()
            with inner:  # pushed on top of the profiler's mode, popped by its own exit
                lin(x)
                x @ x.T
            assert inner.calls > 0
        assert torch.overrides._get_current_function_mode_stack() == [outer]
    assert stack_depth(torch) == 0
    assert outer.calls > 0
    assert prof.find("").calls == 2
    assert prof.gemm_flops == 2 * (2 * 2 * 4 * 4) + 2 * 2 * 4 * 2


@pytest.mark.parametrize("in_c", [True, False])
def test_the_switch_moves_only_its_own_mode_and_only_from_the_top(torch, monkeypatch, in_c):
    from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

    from tracetorch.adapters.torch import ops
    from tracetorch.engine.hotpath import OpCounter

    if in_c and ops._NATIVE_SWITCH is None:
        pytest.skip("the C accelerator is not built here")
    if not in_c:
        monkeypatch.setattr(ops, "_NATIVE_SWITCH", None)

    class Mine(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            return func(*args, **(kwargs or {}))

    mode, mine = ops.OpCountingMode(OpCounter()), Mine()
    switch = ops.make_switch(mode)
    assert (switch(False), switch(True), switch(True)) == (False, True, False)
    torch._C._push_on_torch_function_stack(mine)  # the user's, above the profile's
    assert (switch(False), switch(True)) == (False, True)  # put back; pushed on top of it
    assert _get_current_function_mode_stack() == [mode, mine, mode]
    assert switch(False) is True
    assert _get_current_function_mode_stack() == [mode, mine]
    torch._C._pop_torch_function_stack()
    assert switch(False) is True and stack_depth(torch) == 0


def test_a_profile_exited_in_another_thread_leaves_a_pass_through_until_the_next(torch):
    import tracetorch

    layer = matmul_layer(torch)
    prof = tracetorch.profile()
    prof.__enter__()
    layer(torch.ones(1, 4))
    exiting = threading.Thread(target=prof.__exit__, args=(None, None, None))
    exiting.start()
    exiting.join()
    assert prof.gemm_flops == 2 * 4 * 4
    layer(torch.ones(1, 4))  # counted nowhere; the mode left here only passes it through
    assert prof.gemm_flops == 2 * 4 * 4
    with tracetorch.profile() as later:
        layer(torch.ones(1, 4))
    assert later.gemm_flops == 2 * 4 * 4
    assert stack_depth(torch) == 0


def test_profiles_exited_out_of_order_around_a_users_mode_leave_only_that_mode(torch):
    from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

    import tracetorch

    class Mine(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            return func(*args, **(kwargs or {}))

    layer, x = matmul_layer(torch), torch.ones(1, 4)
    first, second, mine = tracetorch.profile(), tracetorch.profile(), Mine()
    first.__enter__()
    layer(x)
    mine.__enter__()  # the user's mode, on top of the profile's
    second.__enter__()
    layer(x)
    first.__exit__(None, None, None)  # not the last entered: A, B exited A, B
    layer(x)
    second.__exit__(None, None, None)
    assert _get_current_function_mode_stack() == [mine]  # the profile's mode taken from under it
    mine.__exit__(None, None, None)  # pops the user's own mode, as without a profile
    assert stack_depth(torch) == 0


# ----------------------------------------------------------------------------- backward
def test_backward_is_timed_with_the_profiles_clock(torch):
    import tracetorch

    second = 10**9
    ticks = iter(range(0, 10**15, second))  # every reading one second on: no host time fits
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    with tracetorch.profile(model, clock=lambda: next(ticks)) as prof:
        model(torch.ones(3, 4)).sum().backward()
    for path in ("0", "1", "2"):
        node = prof.find(path)
        assert node.backward_time.count == 1
        assert node.backward_time.total_ns >= second and node.backward_time.total_ns % second == 0
    assert prof.find("0").backward_flops == 2 * 3 * 4 * 8
    assert prof.find("2").backward_flops == 2 * (2 * 3 * 8 * 2)


def test_timing_false_gives_no_backward_time_but_all_the_flops(torch):
    import tracetorch

    lin = torch.nn.Linear(4, 4)
    with tracetorch.profile(timing=False) as prof:
        lin(torch.ones(2, 4, requires_grad=True)).sum().backward()
    node = prof.find("")
    assert (node.backward_time.count, node.backward_time.total_ns) == (1, 0)
    assert node.backward_flops == 2 * (2 * 2 * 4 * 4)
    assert prof.find("backward").time.total_ns == 0


def test_autograd_grad_and_autograd_backward_are_recorded_passes(torch):
    import tracetorch

    lin = torch.nn.Linear(4, 4)
    x = torch.ones(3, 4, requires_grad=True)
    with tracetorch.profile() as prof:
        (grad,) = torch.autograd.grad(lin(x).sum(), x)
        torch.autograd.backward(lin(x).sum())
        lin(x).sum().backward()
    assert grad.shape == x.shape
    both = 2 * (2 * 3 * 4 * 4)  # input and weight gradients
    grad_pass = prof.find("autograd.grad")
    assert (grad_pass.kind, grad_pass.calls, grad_pass.flops) == ("backward", 1, 2 * 3 * 4 * 4)
    backward = prof.find("backward")
    assert (backward.kind, backward.calls, backward.flops) == ("backward", 2, 2 * both)
    assert prof.find("").backward_flops == 2 * 3 * 4 * 4 + 2 * both
    assert prof.find("").backward_time.count == 3


def test_passes_are_one_node_across_entries_of_a_profile(torch):
    import tracetorch

    lin = torch.nn.Linear(2, 2)
    prof = tracetorch.profile()
    for _ in range(3):
        with prof:
            lin(torch.ones(1, 2)).sum().backward()
    assert [(n.path, n.calls) for n in prof.nodes()] == [("", 3), ("backward", 3)]


def test_a_gradient_taken_inside_a_custom_backward_is_part_of_the_pass(torch):
    import tracetorch

    class Penalised(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            ctx.save_for_backward(x)
            return x * 1

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                y = x.detach().requires_grad_()
                (inner,) = torch.autograd.grad((y @ y.T).sum(), y)
            return grad + inner

    lin = torch.nn.Linear(4, 4)
    with tracetorch.profile() as prof:
        Penalised.apply(lin(torch.ones(2, 4))).sum().backward()
    assert [n.path for n in prof.nodes() if n.kind == "backward"] == ["backward"]
    assert prof.find("backward").calls == 1


def test_a_compiled_function_reports_no_backward_unless_one_ran(torch):
    import tracetorch

    def loss_of(a: Any, w: Any) -> Any:
        return torch.relu(a @ w).sum()

    a, w = torch.ones(3, 4), torch.ones(4, 5, requires_grad=True)
    with tracetorch.profile() as prof:
        compiled = torch.compile(loss_of, backend="aot_eager", fullgraph=True)
        loss = compiled(a, w)  # AOT autograd traces a backward graph here: no pass runs
    assert prof.backward_flops == 0
    assert "backward" not in [n.path for n in prof.nodes()]
    with tracetorch.profile() as prof:
        loss.backward()
    assert prof.find("backward").calls == 1
    # Gradient FLOPs come from recorded forward calls; a compiled graph's are not known.
    assert prof.backward_flops == 0
    assert stack_depth(torch) == 0


def test_a_scripted_module_is_a_node_with_unknown_flops_and_says_why(torch):
    import warnings

    import tracetorch
    from tracetorch.engine import unsupported

    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    unsupported._WARNED.discard("RecursiveScriptModule")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tracetorch.profile() as prof:
            scripted(torch.ones(2, 4))
    (node,) = [n for n in prof.nodes() if n.type_name == "RecursiveScriptModule"]
    assert node.calls == 1 and node.flops == 0
    messages = [str(w.message) for w in caught if "RecursiveScriptModule" in str(w.message)]
    assert len(messages) == 1 and "compiled graph" in messages[0]
    assert "flop_rule" not in messages[0]


def test_ops_false_says_it_did_not_count_and_a_counting_profile_still_warns(torch):
    import warnings

    import tracetorch
    from tracetorch.engine import unsupported

    class Opaque(torch.nn.Module):  # no rule; its one operation counted only with ops on
        def forward(self, x):
            return x.exp()

    layer = Opaque()
    messages = []
    for ops in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with tracetorch.profile(layer, ops=ops) as prof:
                layer(torch.ones(2, 3))
        messages.append([str(w.message) for w in caught if "Opaque" in str(w.message)])
        if not ops:
            assert prof.find("").flops_unknown
    (uncounted,), counted = messages
    assert "ops=False" in uncounted and "ops=True" in uncounted
    # The counting profile saw the operation: its FLOPs are known, nothing to warn about.
    assert counted == [] and prof.find("").flops == 6

    class Silent(torch.nn.Module):  # returns a kept tensor: no operation, no rule
        def __init__(self):
            super().__init__()
            self.kept = torch.zeros(())

        def forward(self, x):
            return self.kept

    silent = Silent()
    for ops in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with tracetorch.profile(silent, ops=ops):
                silent(torch.ones(2))
        said = [str(w.message) for w in caught if "Silent" in str(w.message)]
        # each reason is said once per process, the first does not hide the second
        assert len(said) == 1 and ("ops=False" in said[0]) is (not ops)
    unsupported._WARNED.discard("Silent")
