"""The torch adapter: what gets wrapped, how paths come out, and that nothing is left behind."""
import importlib
import os
import subprocess
import sys
import threading
import types
import warnings

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from support.torch_models import raising_in_backward  # noqa: E402
from test_torch_models import Attn, Block, BoomNet, Shared  # noqa: E402
from tracetorch.adapters.base import all_subclasses  # noqa: E402
from tracetorch.engine.patches import BOARD  # noqa: E402

nn = torch.nn
F = torch.nn.functional
torch.set_num_threads(2)


def snapshot():
    """Every attribute the adapter may touch, by identity."""
    classes = list(all_subclasses(nn.Module)) + list(all_subclasses(torch.optim.Optimizer))
    state = {("class", cls): dict(vars(cls)) for cls in classes}
    state[("class", torch.Tensor)] = dict(vars(torch.Tensor))
    for namespace in (torch, F, torch.autograd):
        state[("module", namespace.__name__)] = {k: v for k, v in vars(namespace).items()
                                                 if callable(v)}
    return state


def assert_same(before, after):
    for key, attrs in before.items():
        now = after[key]
        assert set(now) == set(attrs), (key, set(now) ^ set(attrs))
        for name, value in attrs.items():
            assert now[name] is value, (key, name)


@pytest.mark.slow
def test_import_tracetorch_does_not_import_torch():
    code = "import sys, tracetorch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_torch_imported_inside_an_open_block_is_profiled_from_then_on():
    code = """
import sys, types, tracetorch
prof = tracetorch.profile()
prof.__enter__()
import torch
torch.nn.Linear(2, 3)(torch.ones(4, 2))
wrapped = vars(torch.nn.Linear)['forward']  # wrapped at its first call
prof.__exit__(None, None, None)
import torch.nn as nn
restored = vars(nn.Linear)['forward']
print(prof.find('').calls, prof.forward_flops,
      restored is not wrapped and isinstance(restored, types.FunctionType),
      '__init_subclass__' in vars(nn.Module))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["1", str(2 * 4 * 2 * 3), "True", "False"]


def test_a_module_class_is_wrapped_at_its_first_call_and_only_inside():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    original = vars(nn.Linear)["forward"]
    with tracetorch.profile() as prof:
        assert vars(nn.Linear)["forward"] is original  # entering wraps no layer class
        model(torch.zeros(2, 3))
        assert vars(nn.Linear)["forward"] is not original
        assert "forward" not in vars(nn.LazyLinear)  # inherits: gets no copy
        assert (nn.Linear, "forward") in BOARD.patched()
        assert (nn.Conv2d, "forward") not in BOARD.patched()
    assert vars(nn.Linear)["forward"] is original
    assert "_call_impl" not in vars(nn.Linear)
    assert not BOARD.patched()
    assert prof.find("0").calls == 1


def test_profile_model_wraps_its_classes_on_entry():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    with tracetorch.profile(model):
        assert (nn.Linear, "forward") in BOARD.patched()
        assert (nn.ReLU, "forward") in BOARD.patched()
    assert not BOARD.patched()


def test_nothing_stays_patched_after_training_with_new_classes():
    import torch._dynamo

    before = snapshot()
    assert_same(before, snapshot())
    with tracetorch.profile() as prof:
        class Inner(nn.Module):  # defined inside the block
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)

            def forward(self, x):
                return torch.relu(self.lin(x)) @ torch.ones(4, 2)

        class MySGD(torch.optim.SGD):  # a new optimizer class, first built inside the block
            def step(self, closure=None):
                return super().step(closure)

        model = Inner()
        opt = MySGD(model.parameters(), lr=0.1)
        loss = model(torch.randn(3, 4)).sum()
        loss.backward()
        opt.step()
        prof.step()
    assert prof.find("").calls == 1  # the model, called first at the top
    assert prof.find("lin").calls == 1
    assert prof.find("MySGD.step").calls == 1
    assert prof.find("backward").calls == 1
    # Inner and MySGD exist only now: compare them with what they were defined as.
    assert isinstance(vars(Inner)["forward"], types.FunctionType)
    assert "__init_subclass__" not in vars(nn.Module)
    assert "__init_subclass__" not in vars(torch.optim.Optimizer)
    after = snapshot()
    for key in list(after):
        if key[0] == "class" and key[1] in (Inner, MySGD):
            del after[key]
    before_step = before.pop(("class", MySGD), None)
    assert before_step is None
    assert_same(before, after)
    assert torch._C._len_torch_dispatch_stack() == 0


def test_optimizer_built_inside_is_what_torch_alone_makes_of_it():
    class Fresh(torch.optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    original = vars(Fresh)["step"]
    param = nn.Parameter(torch.ones(2))
    with tracetorch.profile() as prof:
        opt = Fresh([param], lr=0.5)  # torch hooks Fresh.step now; tracetorch patches no step
        param.grad = torch.ones(2)
        opt.step()
        opt.step()
    assert prof.find("Fresh.step").calls == 2  # super().step() is the same call, no new level
    assert not prof.find("Fresh.step").children
    step = vars(Fresh)["step"]
    assert step.__wrapped__ is original and step.hooked  # what torch itself would have left
    hooks = importlib.import_module("torch.optim.optimizer")
    assert not hooks._global_optimizer_pre_hooks and not hooks._global_optimizer_post_hooks
    seen = []
    opt.register_step_pre_hook(lambda *a: seen.append(1))
    opt.step()
    assert seen  # torch's own hooks still run (twice if SGD.step, reached by super(), is hooked)


def test_a_step_that_raises_is_closed_at_the_next_step():
    class Flaky(torch.optim.SGD):
        fail = True

        def step(self, closure=None):
            if self.fail:
                raise RuntimeError("flaky")
            return super().step(closure)

    lin = nn.Linear(2, 2)
    opt = Flaky(lin.parameters(), lr=0.1)
    with tracetorch.profile() as prof:
        lin(torch.ones(1, 2)).sum().backward()
        with pytest.raises(RuntimeError, match="flaky"):
            opt.step()
        Flaky.fail = False
        opt.step()
        lin(torch.ones(1, 2))
    node = prof.find("Flaky.step")
    assert (node.calls, node.errors) == (2, 1)
    assert [n.path for n in prof.nodes()] == ["", "backward", "Flaky.step"]
    assert prof.find("").calls == 2  # after the failed step: at the top, not under it


def test_a_step_that_raised_inside_another_step_is_closed_with_it():
    class Broken(torch.optim.SGD):
        def step(self, closure=None):
            raise RuntimeError("broken")

    class Outer(torch.optim.SGD):
        def __init__(self, params, inner):
            super().__init__(params, lr=0.1)
            self.inner = inner

        def step(self, closure=None):
            try:
                self.inner.step()
            except RuntimeError:
                pass
            return super().step(closure)

    param = nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    opt = Outer([param], Broken([nn.Parameter(torch.ones(1))], lr=0.1))
    with tracetorch.profile() as prof:
        opt.step()
        nn.Linear(2, 2)(torch.ones(1, 2))
    assert [n.path for n in prof.nodes()] == ["Outer.step", "Outer.step.Broken.step", ""]
    assert (prof.find("Outer.step").errors, prof.find("Outer.step.Broken.step").errors) == (0, 1)
    assert torch.equal(param.detach(), torch.full((2,), 0.9))


def test_optimizer_and_scheduler_made_inside_run_no_tracetorch_code_after():
    model = Block(nn.Linear(3, 3))
    x = torch.randn(2, 3)
    with tracetorch.profile() as prof:
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        model(x).sum().backward()
        opt.step()
        sched.step()
    assert prof.find("Adam.step").calls == 1
    package = os.path.dirname(tracetorch.__file__)
    ran = set()
    sys.setprofile(lambda frame, event, arg: ran.add(frame.f_code.co_filename))
    try:
        model(x).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    finally:
        sys.setprofile(None)
    assert sorted(f for f in ran if f.startswith(package)) == []
    assert any("optim" in f for f in ran)  # the profiler did see torch's own code


def test_users_forward_assigned_inside_the_block_is_kept():
    original = vars(nn.Linear)["forward"]

    def forward(self, x):
        return x

    lin = nn.Linear(2, 2)
    try:
        with tracetorch.profile():
            nn.Linear.forward = forward
        assert vars(nn.Linear)["forward"] is forward
        assert torch.equal(lin(torch.ones(1, 2)), torch.ones(1, 2))
    finally:
        nn.Linear.forward = original


def test_the_same_after_the_model_raises():
    before = snapshot()
    model = BoomNet()
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="boom") as info:
        with tracetorch.profile(model) as prof:
            model(x)
    assert str(info.value) == "boom"
    assert_same(before, snapshot())
    assert prof.find("lin").calls == 1
    assert prof.find("lin").flops == 2 * 2 * 8 * 8
    assert prof.find("boom").errors == 1
    assert torch._C._len_torch_dispatch_stack() == 0
    assert not model._forward_hooks and not model.lin._forward_hooks


def test_keyboard_interrupt_in_backward_restores_everything():
    interrupt = raising_in_backward(torch, KeyboardInterrupt())
    before = snapshot()
    lin = nn.Linear(2, 2)
    with pytest.raises(KeyboardInterrupt):
        with tracetorch.profile():
            interrupt.apply(lin(torch.ones(1, 2))).sum().backward()
    assert_same(before, snapshot())
    assert torch._C._len_torch_dispatch_stack() == 0
    assert not BOARD.patched()


def test_paths_through_module_list_and_dict():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
            self.blocks = nn.ModuleDict({"attn": nn.Linear(4, 4), "mlp": nn.ReLU()})

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.blocks["mlp"](self.blocks["attn"](x))

    model = Net()
    with tracetorch.profile(model) as prof:
        model(torch.randn(1, 4))
    paths = [n.path for n in prof.nodes()]
    assert paths == ["", "layers.0", "layers.1", "blocks.attn", "blocks.mlp"]
    with tracetorch.profile() as unnamed:  # no model given: the first top-level layer is ""
        model(torch.randn(1, 4))
    assert [n.path for n in unnamed.nodes()] == paths


def test_sequential_children_and_user_subclass_with_super_forward():
    class Scaled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    model = nn.Sequential(Scaled(3, 5), nn.Sequential(nn.ReLU(), nn.Linear(5, 2)))
    with tracetorch.profile(model) as prof:
        model(torch.randn(4, 3))
    assert [n.path for n in prof.nodes()] == ["", "0", "1", "1.0", "1.1"]
    assert prof.find("0").calls == 1 and not prof.find("0").children  # super() is no new level
    # its own forward: its operations, the product run through super() and its scale (the
    # Linear rule counts a Linear's forward, not another one)
    assert prof.find("0").flops == 2 * 4 * 3 * 5 + 4 * 5
    assert prof.find("0").flops_source == "ops"


def test_hooks_state_dict_and_outputs_are_identical():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(),
                          nn.Linear(2 * 4 * 4, 3))
    calls = []
    model[0].register_forward_pre_hook(lambda m, a: calls.append("pre"))
    model[4].register_forward_hook(lambda m, a, o: calls.append("post"))
    model[4].register_full_backward_hook(lambda m, gi, go: calls.append("back"))
    hooks = [(dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._backward_hooks))
             for m in model.modules()]
    x = torch.randn(2, 1, 6, 6)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    expected = model(x)
    calls.clear()
    with tracetorch.profile(model):
        got = model(x)
    assert torch.equal(got, expected)
    assert calls == ["pre", "post"]
    assert [(dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._backward_hooks))
            for m in model.modules()] == hooks
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    model.train()
    calls.clear()
    with tracetorch.profile(model) as prof:
        model(x).sum().backward()
    assert calls == ["pre", "post", "back"]
    assert prof.find("4").backward_time.count == 1


def test_inputs_as_dicts_tuples_kwargs_and_non_tensor_outputs():
    class DictIn(nn.Module):
        def forward(self, batch):
            return {"y": batch["x"] * 2, "n": 3}

    class TupleIn(nn.Module):
        def forward(self, pair, scale=1.0, *, mask=None):
            a, b = pair
            return (a @ b) * scale if mask is None else None

    class Text(nn.Module):
        def forward(self, x):
            return "done"

    model_d, model_t, text = DictIn(), TupleIn(), Text()
    with tracetorch.profile(warn_unsupported=False) as prof:
        out = model_d({"x": torch.ones(2, 3)})
        model_t((torch.ones(2, 3), torch.ones(3, 4)), scale=2.0)
        model_t(pair=(torch.ones(2, 3), torch.ones(3, 4)), mask=torch.ones(1))
        assert text(torch.ones(1)) == "done"
        assert text(None) == "done"
    assert out["n"] == 3
    node = prof.find("TupleIn")
    assert node.calls == 2
    assert node.gemm_flops == 2 * 2 * 3 * 4  # the call given a mask ran no product
    assert ((2, 3), (3, 4), None) in node.input_shapes
    assert prof.find("").input_shapes == [((2, 3),)]  # DictIn, called first: the model
    assert prof.find("Text").calls == 2


def test_shared_linear_three_call_sites_one_module_row():
    model = Shared()
    with tracetorch.profile(model) as prof:
        model(torch.randn(1, 100))
    assert prof.forward_flops == 60_000 and prof.gemm_flops == 60_000
    sites = [n for n in prof.nodes() if n.type_name == "Linear"]
    assert [n.path for n in sites] == ["a.lin", "b.lin", "c.lin"]
    assert [n.flops for n in sites] == [20_000] * 3
    rows = [r for r in prof.by_module().values() if r.type_name == "Linear"]
    assert len(rows) == 1 and rows[0].calls == 3 and rows[0].flops == 60_000
    assert rows[0].params == 10_000


def test_other_threads_are_not_recorded():
    model = Attn()
    q = torch.randn(1, 64, 32)
    with tracetorch.profile() as prof:
        worker = threading.Thread(target=lambda: [model(q) for _ in range(3)])
        worker.start()
        worker.join()
        model(q)
    assert prof.find("").calls == 1
    assert prof.gemm_flops == 524_288


def test_repeated_blocks_give_the_same_numbers_and_leave_no_state():
    model = Shared()
    x = torch.randn(1, 100)
    results = []
    for _ in range(3):
        with tracetorch.profile(model) as prof:
            model(x)
        results.append(prof.forward_flops)
    assert results == [60_000] * 3
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_block_defined_class_calls_are_named_from_the_parent():
    with tracetorch.profile() as prof:
        class Holder(nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = Block(nn.Linear(2, 2))

            def forward(self, x):
                return self.inner(x)

        Holder()(torch.ones(1, 2))
    assert [n.path for n in prof.nodes()] == ["", "inner", "inner.lin"]


def test_no_warning_for_containers_and_ruled_layers():
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(), nn.Flatten(), nn.Identity())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tracetorch.profile(model) as prof:
            model(torch.ones(1, 2))
    assert prof.unsupported == {}


@pytest.mark.parametrize("name", ["tracetorch.adapters.torch", "tracetorch.adapters.torch.ops",
                                  "tracetorch.adapters.torch.backward",
                                  "tracetorch.adapters.torch.marks",
                                  "tracetorch.adapters.torch.cuda",
                                  "tracetorch.flops.torch_rules"])
def test_docstring_examples(name):
    import doctest
    import importlib

    failures, tried = doctest.testmod(importlib.import_module(name))
    assert tried > 0 and failures == 0


class _Streaming(nn.Module):
    """A layer whose forward is a generator: it runs while its consumer iterates."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, chunks):
        for chunk in chunks:
            yield self.lin(chunk)


def _fake_clock():
    ticks = iter(range(0, 10**9, 10))
    return lambda: next(ticks)


def test_a_generator_forward_returns_at_once_and_its_calls_run_where_it_is_consumed():
    layer = _Streaming()
    chunks = [torch.randn(2, 4) for _ in range(3)]
    with tracetorch.profile(layer, clock=_fake_clock(), warn_unsupported=False) as prof:
        outs = list(layer(chunks))
    assert len(outs) == 3
    # The generator is handed back as it is (issue 28): its consumer, at the top, runs "lin".
    assert [(n.path, n.depth, n.calls) for n in prof.nodes()] == [("", 1, 1), ("lin", 1, 3)]
    assert prof.find("").total_ns == 10  # two clock readings around making the generator
    assert prof.find("lin").flops == 3 * 2 * 2 * 4 * 4


def test_a_generator_forward_closed_early_or_thrown_into_behaves_as_without_the_profiler():
    class Guarded(nn.Module):
        def forward(self, n):
            try:
                yield from range(n)
            except KeyError:
                yield "handled"

    layer = Guarded()
    with tracetorch.profile(layer, warn_unsupported=False) as prof:
        stream = layer(5)
        assert next(stream) == 0
        assert stream.throw(KeyError("x")) == "handled"
        stream.close()
        assert list(layer(2)) == [0, 1]
    assert prof.find("").calls == 2


@pytest.mark.parametrize("with_model", [True, False])
def test_a_shared_module_is_named_by_each_parents_attribute(torch, with_model):
    shared = torch.nn.Linear(2, 2)

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = shared

        def forward(self, x):
            return self.inner(x)

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.direct = Inner(), shared

        def forward(self, x):
            return self.direct(self.q(x))

    model = Outer()
    with tracetorch.profile(model if with_model else None) as prof:
        model(torch.ones(1, 2))
    assert [n.path for n in prof.nodes()] == ["", "q", "q.inner", "direct"]
    assert prof.find("q.inner").module_key == prof.find("direct").module_key


def test_shapes_of_torch_tensors_are_plain_int_tuples_on_both_paths():
    with tracetorch.profile():  # the adapter registers torch.Tensor's shapes as plain ints
        pass
    from tracetorch.models.tensors import shape_of

    class Lying(torch.Tensor):  # a subclass is never trusted: its sizes are converted
        @property
        def shape(self):
            return (torch.tensor(2), 3)

    plain, parameter = torch.zeros(2, 3), nn.Parameter(torch.zeros(4))
    lying = torch.zeros(2, 3).as_subclass(Lying)
    assert [shape_of(t) for t in (plain, parameter, lying)] == [(2, 3), (4,), (2, 3)]
    assert all(type(shape_of(t)) is tuple and all(type(d) is int for d in shape_of(t))
               for t in (plain, parameter, lying))
