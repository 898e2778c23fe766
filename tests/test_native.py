"""The hot path's C accelerator: built where a compiler is (always in CI), equivalent to the
Python wrapper it speeds up, and switched off by ``TRACETORCH_PURE_PYTHON=1``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import tracetorch
from tracetorch.core import Linear, ReLU, Sequential, Tensor
from tracetorch.engine import native

ROOT = Path(__file__).resolve().parent.parent

#: The test modules that exercise the engine's wrapper in every way it is called.
ENGINE_TESTS = ["tests/test_engine.py", "tests/test_nesting.py", "tests/test_threads.py",
                "tests/test_profile_core.py", "tests/test_first_calls.py",
                "tests/test_reopening.py", "tests/test_call_hooks.py", "tests/test_phases.py",
                "tests/test_training.py", "tests/test_call_forms.py", "tests/test_patches.py",
                "tests/test_torch_adapter.py", "tests/test_torch_backward.py",
                "tests/test_torch_ops_mode.py", "tests/test_memory.py", "tests/core",
                "tests/test_learned_checks.py", "tests/test_inplace_outputs.py",
                "tests/test_higher_order_backward.py"]


def _built(module: str, name: str) -> Any:
    """The C type ``name`` of ``module``; the test skips where it is not built (fails in CI)."""
    found = native.native_type(module, name)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module.replace('.', '/')}.c was not built by pip install")
        pytest.skip("the C accelerator is not built here")
    return found


def test_the_accelerator_is_built_where_a_compiler_is():
    if os.environ.get("CI") == "true":
        assert native.accelerated(), "tracetorch/engine/_hotpath.c was not built by pip install"
    elif not native.accelerated():
        pytest.skip("the C accelerator is not built here")
    from tracetorch.engine.hotpath import make_wrapper

    wrapper_type = native.native_type("tracetorch.engine._hotpath", "Wrapper")
    assert type(make_wrapper("module")) is wrapper_type


def test_recorded_calls_hold_no_reference_they_should_not():
    # A reference counting slip in C would show as counts that grow with the calls. (Counted
    # after the calls that learn what a call's key runs: the learned state holds the layer.)
    model = Sequential(Linear(3, 3), ReLU())
    x = Tensor(np.ones((2, 3)))
    with tracetorch.profile(model) as prof:
        for _ in range(4):
            model(x)
        before = [sys.getrefcount(obj) for obj in (model, x, model.layers[0])]
        for _ in range(500):
            model(x)
        after = [sys.getrefcount(obj) for obj in (model, x, model.layers[0])]
    assert before == after
    assert prof.find("layers.0").calls == 504


def test_a_failing_call_releases_what_it_held():
    class Boom(Exception):
        pass

    class Failing(ReLU):
        def forward(self, x):
            raise Boom("from the layer")

    layer, x = Failing(), Tensor(np.ones((1, 2)))
    with tracetorch.profile(layer) as prof:
        for _ in range(3):
            with pytest.raises(Boom, match="from the layer"):
                layer(x)
        before = sys.getrefcount(x)
        for _ in range(200):
            with pytest.raises(Boom):
                layer(x)
        assert sys.getrefcount(x) == before
    assert prof.find("").calls == 203 and prof.find("").errors == 203


@pytest.mark.slow
def test_the_switch_keeps_the_python_wrapper():
    code = ("from tracetorch.engine import native, hotpath\n"
            "print(native.accelerated(), type(hotpath.make_wrapper('module')).__name__)")
    env = dict(os.environ, **{native.PURE_PYTHON_ENV: "1"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.split()
    assert out == ["False", "function"]


@pytest.mark.slow
def test_the_python_wrapper_passes_the_engine_tests():
    env = dict(os.environ, **{native.PURE_PYTHON_ENV: "1"})
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow",
                          "-p", "no:cacheprovider", *ENGINE_TESTS],
                         env=env, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout


def test_torch_marks_and_backward_boundaries_hold_nothing_after_the_pass(torch):
    # The C marker and boundary hook take references to frames, nodes and tensors: a slip
    # would show as counts that grow with the steps.
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    x = torch.ones(2, 3)
    with tracetorch.profile(model) as prof:
        model(x).sum().backward()
        watched = (model, model[0].weight, x, prof.find("0").engine.frame, prof.find("1"))
        model(x).sum().backward()  # (the read above folded the counters: they start again)
        before = [sys.getrefcount(obj) for obj in watched]
        for _ in range(200):
            model(x).sum().backward()
        after = [sys.getrefcount(obj) for obj in watched]
    assert before == after
    assert prof.find("0").backward_time.count == 202
    assert prof.find("0").backward_flops == 202 * 2 * 2 * 3 * 3  # dW only: x needs no grad


def test_the_c_marker_takes_the_observer_arguments_or_hands_them_to_python(torch):
    marker_type = _built("tracetorch.adapters.torch._marks", "Marker")
    from tracetorch.adapters.torch import marks

    handed: list[tuple[object, ...]] = []
    marker = marker_type(lambda *args: handed.append(args), vars(marks))
    with pytest.raises(TypeError, match=r"tag_call\(\) takes 5 positional arguments"):
        marker(1, 2, 3)
    with pytest.raises(TypeError, match="5 positional"):
        marker(1, (), {}, torch.ones(1), [], extra=1)
    # What it does not mark itself (not a tensor output, arguments of other types) is Python's.
    entry = [0] * (marks._PARTS + 1)  # long enough to hold the call's parts
    odd = [(None, (), {}, "text", entry), (None, [], {}, torch.ones(1), entry),
           (None, (), None, torch.ones(1), entry)]
    for args in odd:
        marker(*args)
    assert handed == odd


def test_the_c_finds_the_fields_it_reads_by_name_when_it_is_made(torch):
    from tracetorch.adapters.torch import backward, marks
    from tracetorch.engine import hotpath

    wrapper = _built("tracetorch.engine._hotpath", "Wrapper")
    marker = _built("tracetorch.adapters.torch._marks", "Marker")
    boundary = _built("tracetorch.adapters.torch._marks", "Boundary")
    # A record the C reads without one of its fields, or gone: refused when the type is made,
    # not misread on a call.
    renamed = NamedTuple("Frame", [(name if name != "owner" else "instance", Any)
                                   for name in hotpath.Frame._fields])
    made = [(marker, marks, {"Frame": renamed}), (marker, marks, {"_PARTS": -1}),
            (boundary, backward, {"Frame": renamed}), (boundary, backward, {"_Hot": renamed}),
            (wrapper, hotpath, {"Frame": renamed}),
            (wrapper, hotpath, {"_ENTRY_FIELDS": ("calls", "flops")}),
            (wrapper, hotpath, {"_SETTING_NAMES": ("_grad_mode",)})]
    for kind, module, changed in made:
        arguments = (None, {**vars(module), **changed})
        with pytest.raises(ValueError):
            kind(*arguments) if kind is not wrapper else kind(*arguments, None, None, 0, 0)
    namespace = dict(vars(hotpath))
    del namespace["Frame"]
    with pytest.raises(NameError, match="Frame"):
        wrapper(None, namespace, None, None, 0, 0)
    # Each reads where its own namespace's records say: a counter keeping its parts first.
    handed: list[object] = []
    first = marker(lambda *args: handed.append(args), {**vars(marks), "_PARTS": 0})
    output = torch.ones(2, requires_grad=True) * 2
    frame = hotpath.Frame(*[None] * len(hotpath.Frame._fields))
    first(frame, (), {}, output, [()])  # (no parts: the call's gradient is no product)
    assert handed == [] and output.grad_fn.metadata[marks.MARKS] == (frame, (), None)
    entry: list[Any] = [0] * marks._PARTS  # too short to hold parts where they are: Python's
    marker(lambda *args: handed.append(args), vars(marks))(frame, (), {}, output, entry)
    assert len(handed) == 1


def test_every_setter_leaves_the_settings_the_c_reads_equal_to_the_globals():
    # The C wrapper reads the settings from hotpath._SETTINGS, the Python wrapper from the
    # module's globals: each setter must publish what it set.
    from tracetorch.engine import hotpath

    def published() -> bool:
        return hotpath._SETTINGS == [vars(hotpath)[name] for name in hotpath._SETTING_NAMES]

    def replay(*args: Any) -> Any:
        return args[0]

    assert published()
    changes = [(hotpath.set_grad_mode, (lambda: False,)), (hotpath.set_op_switch, (bool,)),
               (hotpath.set_op_replay, (replay, (bool,), {})),
               (hotpath.set_exit_observer, (print, bool))]
    for setter, arguments in changes:
        previous = setter(*arguments)
        assert published() and arguments[0] in hotpath._SETTINGS
        setter(*previous) if isinstance(previous, tuple) else setter(previous)
        assert published() and arguments[0] not in hotpath._SETTINGS
    generation = hotpath.structure_generation()
    hotpath.structure_changed()
    assert published() and generation + 1 in hotpath._SETTINGS


def test_calls_are_timed_on_perf_counter_ns_whoever_reads_it(torch):
    # With the default clock the C wrapper reads the clock perf_counter_ns reads itself: the
    # readings of a call lie between perf_counter_ns's around it (a failing call hands them
    # to record_failure), and its duration is theirs.
    import time

    class Failing(torch.nn.Module):
        def forward(self, x):
            raise ValueError("no")

    layer, seen = Failing(), []
    with tracetorch.profile(layer) as prof:
        collector = prof._collector
        recorded = collector.record_failure
        collector.record_failure = lambda node, start, end: (seen.append((start, end)),
                                                             recorded(node, start, end))
        around = []
        for _ in range(2):  # (the first call makes the node; the second finds it)
            before = time.perf_counter_ns()
            with pytest.raises(ValueError):
                layer(torch.ones(2))
            around.append((before, time.perf_counter_ns()))
    assert len(seen) == 2
    for (start, end), (before, after) in zip(seen, around):
        assert before <= start <= end <= after
    assert prof.find("").time.total_ns == sum(end - start for start, end in seen)


def test_the_c_wrapper_makes_a_first_call_node_itself_given_what_names_it():
    from tracetorch.engine import hotpath

    wrapper_type = _built("tracetorch.engine._hotpath", "Wrapper")
    handed: list[object] = []

    def python_wrapper(*arguments: object) -> None:
        handed.append(arguments)

    def rule(x: int) -> int:
        return 3 * x

    named = wrapper_type(python_wrapper, vars(hotpath), None, None, 0, 0,
                         ("function", "scaled", rule))
    unnamed = wrapper_type(python_wrapper, vars(hotpath), None, None, 0, 0)
    def double(x: int) -> int:
        return 2 * x

    with tracetorch.profile() as prof:
        assert [named(double, None, (x,), {}) for x in (1, 2, 2)] == [2, 4, 4]
        unnamed(lambda: None, None, (), {})  # without them: the Python wrapper's call
    node = prof.find("scaled")
    assert (node.kind, node.calls, node.flops, node.flops_source) == ("function", 3, 15, "user")
    assert len(handed) == 1
    with pytest.raises(TypeError, match="child must be"):
        wrapper_type(python_wrapper, vars(hotpath), None, None, 0, 0, ("function",))


def _native_guard_holds(native_guard: object):
    """``holds()``: whether the C wrapper, given ``native_guard``, lets a call through
    unrecorded (its Python guard always says no, so only the C test can hold)."""
    _built("tracetorch.engine._hotpath", "Wrapper")
    from tracetorch.engine.hotpath import make_wrapper

    def python_guard() -> bool:
        return False

    python_guard.native_guard = native_guard  # type: ignore[attr-defined]
    wrapper = make_wrapper("function", "guarded", None, python_guard)

    def holds() -> bool:
        with tracetorch.profile() as prof:
            wrapper(lambda: None, None, (), {})
        return [node.calls for node in prof.nodes()] == []

    return holds


def test_a_guard_holds_while_a_flag_is_true_or_a_call_returns_true():
    class Flags:
        compiling = False
        tracing = 0

    answers = [False]
    holds = _native_guard_holds((((Flags, "compiling"), (Flags, "tracing")),
                                 (lambda: answers[-1],)))
    assert holds() is False
    Flags.tracing = 1
    assert holds() is True
    Flags.tracing = 0
    answers.append(True)
    assert holds() is True
    answers.append(False)
    Flags.compiling = True
    assert holds() is True
    del Flags.compiling  # a flag gone is the user's error to see, not a silent "no"
    with pytest.raises(AttributeError):
        holds()


def test_a_module_flag_is_read_as_getattr_reads_it():
    # A plain module's flag comes from its __dict__; a name it lacks from its __getattr__ (or
    # the AttributeError), and a ModuleType subclass's own attribute wins over the __dict__.
    flags = types.ModuleType("flags")
    flags.compiling = False
    holds = _native_guard_holds((((flags, "compiling"),), ()))
    assert holds() is False
    flags.compiling = True
    assert holds() is True
    del flags.compiling
    with pytest.raises(AttributeError):
        holds()
    flags.__getattr__ = lambda name: name == "compiling"
    assert holds() is True

    class Overriding(types.ModuleType):
        compiling = property(lambda module: True)

    special = Overriding("special")
    special.__dict__["compiling"] = False
    assert _native_guard_holds((((special, "compiling"),), ()))() is True


@pytest.mark.parametrize("flags, calls", [([], ()), ((("x",),), ()), (((object, 3),), ()),
                                          ((), (42,))])
def test_a_guard_rejects_what_it_cannot_ask(flags, calls):
    with pytest.raises(TypeError, match="guard tuple"):
        _native_guard_holds((flags, calls))


def test_the_c_tracer_test_agrees_with_the_python_one(torch, monkeypatch):
    from torch.fx import _symbolic_trace

    from tracetorch.adapters.torch.tracing import tracing

    c_holds = _native_guard_holds(tracing.native_guard)
    assert (tracing(), c_holds()) == (False, False)
    monkeypatch.setattr(_symbolic_trace, "_is_fx_tracing_flag", True)
    assert (tracing(), c_holds()) == (True, True)
    monkeypatch.setattr(_symbolic_trace, "_is_fx_tracing_flag", False)
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert (tracing(), c_holds()) == (True, True)


def test_the_plain_clock_is_there_only_while_calls_are_taken_and_timed_plainly():
    from tracetorch.engine.timing import CallTiming

    def clock() -> int:
        return 0

    timing = CallTiming(clock)
    assert timing.plain_clock is None  # not taking calls yet
    timing.set_active(True)
    assert timing.plain_clock is clock
    timing.add_call_hook(lambda node: None, lambda node: None)
    assert (timing.plain_timing, timing.plain_clock) == (False, None)  # hooks run in Python
    with_timeline = CallTiming(clock, timeline=True)
    with_timeline.set_active(True)
    assert with_timeline.plain_clock is None
    plain = CallTiming(clock)
    plain.set_active(True)
    plain.set_active(False)
    assert plain.plain_clock is None


#: A training loop whose backward attribution the C hook and the Python one must agree on, to
#: the tick: nested containers, a layer with an inclusive rule (TransformerEncoderLayer), a
#: Linear shared by two places, one called twice in a loop, passes into every leaf and passes
#: limited by ``inputs`` (the Python ``_charge``'s in both), on a clock that ticks once a read.
_ATTRIBUTION = """
import json, torch, tracetorch
from torch import nn

torch.manual_seed(0)
shared = nn.Linear(6, 6)

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(4, 6), nn.ReLU())
        self.a, self.b = shared, nn.Sequential(nn.Tanh(), shared)
        self.twice = nn.Linear(6, 6)
        self.enc = nn.TransformerEncoderLayer(6, 2, 12, dropout=0.0, batch_first=True)
        self.out = nn.Linear(6, 1)

    def forward(self, x):
        h = self.b(self.a(self.inp(x)))
        for _ in range(2):
            h = torch.relu(self.twice(h))
        return self.out(self.enc(h.unsqueeze(0))).sum() + h.sum()

model, x = Model(), torch.randn(3, 4, requires_grad=True)
ticks = iter(range(10**9))
with tracetorch.profile(model, timeline=True, clock=lambda: next(ticks)) as prof:
    for _ in range(3):
        model(x).backward()
    torch.autograd.grad(model(x), [shared.weight])
    model(x).backward(inputs=[x])
rows = [[n.path, n.kind, n.backward_flops, n.backward_gemm_flops, n.backward_time.count,
         n.backward_time.total_ns, n.flops] for n in prof.nodes()]
print(json.dumps([rows, [[n.path, start, end] for n, start, end, _ in prof.backward_timeline]]))
"""


@pytest.mark.slow
def test_the_c_boundary_hook_attributes_backward_as_the_python_one(torch_installed):
    _built("tracetorch.adapters.torch._marks", "Boundary")

    def attribution(pure: bool) -> list[object]:
        env = {k: v for k, v in os.environ.items() if k != native.PURE_PYTHON_ENV}
        if pure:
            env[native.PURE_PYTHON_ENV] = "1"
        out = subprocess.run([sys.executable, "-c", _ATTRIBUTION], env=env, capture_output=True,
                             text=True, check=True, cwd=ROOT).stdout
        return json.loads(out)

    c_rows, python_rows = attribution(False), attribution(True)
    assert c_rows == python_rows
    rows = {row[0]: row for row in c_rows[0]}
    assert rows["a"][4] == 5 and rows["a"][2] > 0  # shared: one node per place, each pass
    assert rows["twice"][2] > 0 and rows["enc.linear1"][2] > 0 and c_rows[1]
