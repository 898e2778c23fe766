"""A layer's recording method read from the layer (``layer.forward`` in a block) stands for the
bound method everywhere users and libraries look at it, in C and in Python alike.

Both bindings are tested side by side: the Python
:class:`~tracetorch.engine.patches.BoundLayerMethod` and its C twin in
``tracetorch/engine/_binding.c`` (where it is built), each made directly from a
:class:`~tracetorch.engine.patches.LayerMethod`; what a profile hands out is tested through
``layer.forward``, and once more in a process with ``TRACETORCH_PURE_PYTHON=1``.
"""
from __future__ import annotations

import copy
import functools
import gc
import inspect
import os
import pickle
import subprocess
import sys
import types
import weakref
from pathlib import Path
from typing import Any, Callable

import pytest

import tracetorch
from tracetorch.engine import native
from tracetorch.engine.patches import BoundLayerMethod, LayerMethod, recording_wrapper

ROOT = Path(__file__).resolve().parent.parent


class Layer:
    """A layer of no framework (module level: its instances pickle)."""

    def __init__(self, scale: int = 2) -> None:
        self.scale = scale

    def forward(self, x: int, *, shift: int = 0) -> int:
        """Scale, then shift."""
        return self.scale * x + shift

    __call__ = forward


ORIGINAL = vars(Layer)["forward"]


def _c_type() -> Any:
    built = native.native_type("tracetorch.engine._binding", "BoundLayerMethod")
    if built is None:
        if os.environ.get("CI") == "true" and os.environ.get(native.PURE_PYTHON_ENV) != "1":
            pytest.fail("tracetorch/engine/_binding.c was not built")
        pytest.skip("the C binding is not built here (or TRACETORCH_PURE_PYTHON=1)")
    return built


@pytest.fixture(params=["python", "c"])
def bound_type(request: pytest.FixtureRequest) -> Any:
    """Each binding's bound type: ``bound_type(method, layer)``."""
    return BoundLayerMethod if request.param == "python" else _c_type()


@pytest.fixture
def method() -> LayerMethod:
    """A recording method of ``Layer.forward`` (outside a profile it only calls through)."""
    return recording_wrapper(ORIGINAL, "module")


def _spying(calls: list[tuple[Any, ...]]) -> Callable[..., Any]:
    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        calls.append((wrapped, instance, args, kwargs))
        return wrapped(*args, **kwargs)

    return wrapper


# ----------------------------------------------------------------------------- calls
def test_a_call_reaches_the_wrapper_as_wrapts_bound_wrapper_calls_it(bound_type):
    calls: list[tuple[Any, ...]] = []
    layer = Layer()
    bound = bound_type(LayerMethod(ORIGINAL, _spying(calls)), layer)
    assert bound(3) == 6 and bound(3, shift=1) == 7 and bound(x=1) == 2
    (wrapped, instance, args, kwargs), *_ = calls
    assert wrapped == types.MethodType(ORIGINAL, layer) and instance is layer
    assert args == (3,) and kwargs == {} and type(kwargs) is dict  # a dict even with none
    assert calls[1][2:] == ((3,), {"shift": 1}) and calls[2][2:] == ((), {"x": 1})


def test_a_partial_and_an_exception_go_through(bound_type, method):
    bound = bound_type(method, Layer())
    assert functools.partial(bound, shift=5)(1) == 7
    with pytest.raises(TypeError):
        bound()  # the original's own error


# ----------------------------------------------------------------------------- attributes
def test_it_answers_as_the_bound_method(bound_type, method):
    layer = Layer()
    bound, plain = bound_type(method, layer), types.MethodType(ORIGINAL, layer)
    assert bound.__wrapped__ == plain and type(bound.__wrapped__) is types.MethodType
    assert bound.__self__ is layer and bound.__func__ is ORIGINAL
    for name in ("__name__", "__qualname__", "__doc__", "__module__", "__annotations__",
                 "__defaults__", "__kwdefaults__", "__code__"):
        assert getattr(bound, name) == getattr(plain, name), name
    assert bound.__doc__ == "Scale, then shift." and bound.__module__ == __name__
    assert inspect.signature(bound) == inspect.signature(plain)
    assert str(inspect.signature(bound)) == "(x: 'int', *, shift: 'int' = 0) -> 'int'"
    assert dir(bound) == dir(plain)


def test_any_other_attribute_is_the_functions_then_wrapts_own_the_recording_methods(
        bound_type, method):
    ORIGINAL.tag = "mine"  # type: ignore[attr-defined]
    try:
        bound = bound_type(method, Layer())
        assert bound.tag == "mine"
    finally:
        del ORIGINAL.tag  # type: ignore[attr-defined]
    assert bound._self_tracetorch is True and bound._self_parent is method
    assert bound._self_wrapper is method._self_wrapper and bound._self_instance is bound.__self__
    for missing in ("no_such_attribute", "_self_no_such", "__deepcopy__"):
        with pytest.raises(AttributeError):
            getattr(bound, missing)
    with pytest.raises(AttributeError):
        bound.tag = "theirs"  # as a bound method, it takes no attribute


def test_it_passes_for_a_method_and_not_for_a_function(bound_type, method):
    bound = bound_type(method, Layer())
    assert isinstance(bound, types.MethodType) and inspect.ismethod(bound)
    assert not inspect.isfunction(bound) and callable(bound)
    assert bound.__class__ is types.MethodType


def test_two_reads_are_equal_as_bound_methods_are(bound_type, method):
    layer, other = Layer(), Layer()
    first, second = bound_type(method, layer), bound_type(method, layer)
    plain = types.MethodType(ORIGINAL, layer)
    assert first == second and not first != second and hash(first) == hash(second)
    assert first == plain and plain == first and hash(first) == hash(plain)
    assert first != bound_type(method, other) and first != ORIGINAL
    assert {first: 1}[second] == 1


def test_its_repr_names_the_bound_method(bound_type, method):
    layer = Layer()
    text = repr(bound_type(method, layer))
    assert text.startswith("<recording <bound method Layer.forward of ") and repr(layer) in text


def test_it_pickles_and_copies_as_the_bound_method(bound_type, method):
    layer = Layer(scale=3)
    bound = bound_type(method, layer)
    loaded = pickle.loads(pickle.dumps(bound))  # the layer's attribute, read again
    assert loaded(1) == 3 and loaded.__self__ is not layer and loaded.__self__.scale == 3
    assert copy.copy(bound) == types.MethodType(ORIGINAL, layer)
    assert copy.deepcopy(bound).__self__.scale == 3


def test_it_can_be_referred_to_weakly_and_holds_what_it_is_bound_to(bound_type, method):
    layer = Layer()
    bound = bound_type(method, layer)
    ref = weakref.ref(bound)
    assert ref() is bound
    held = weakref.ref(layer)
    del layer
    assert held() is not None  # the bound object keeps its layer
    del bound
    assert ref() is None and held() is None


def test_a_cycle_through_it_is_collected(bound_type, method):
    layer = Layer()
    layer.own = bound_type(method, layer)  # the layer holds its bound method: a cycle
    held = weakref.ref(layer)
    del layer
    gc.collect()
    assert held() is None


def test_the_class_of_the_python_binding_keeps_its_own_name_and_doc():
    assert BoundLayerMethod.__module__ == "tracetorch.engine.patches"
    assert BoundLayerMethod.__doc__.startswith("A layer's recording method bound")


# ----------------------------------------------------------------------------- in a profile
def test_a_layers_method_in_a_profile_is_the_bound_type_of_the_build(torch):
    layer = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    built = native.native_type("tracetorch.engine._binding", "BoundLayerMethod")
    with tracetorch.profile(layer) as prof:
        bound = layer.forward
        assert type(bound) is (BoundLayerMethod if built is None else built)
        assert type(layer).forward is torch.nn.Linear.forward  # the class's read is unchanged
        assert isinstance(bound, types.MethodType) and bound == layer.forward
        assert inspect.signature(bound) == inspect.signature(bound.__wrapped__)
        assert str(inspect.signature(bound)) == "(input: torch.Tensor) -> torch.Tensor"
        assert bound.__self__ is layer and bound.__func__ is torch.nn.Linear.forward
        assert bound.__module__ == "torch.nn.modules.linear"
        assert bound.__qualname__ == "Linear.forward"
        assert bound.__doc__ == torch.nn.Linear.forward.__doc__
        layer(x)
        bound(input=x)
        functools.partial(layer.forward)(x)
    assert prof.find("").calls == 3
    assert type(layer.forward) is types.MethodType  # after the block, a plain method again


def test_a_forward_assigned_on_the_instance_is_its_own(torch):
    layer = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    plain = layer.forward

    def forward(input):  # as accelerate's mixed precision assigns one
        return plain(input) * 2

    layer.forward = forward
    with tracetorch.profile(layer) as prof:
        assert torch.equal(layer(x), plain(x) * 2)
    assert prof.find("").calls == 1 and layer.forward is forward


@pytest.mark.slow
def test_the_python_binding_passes_these_tests():
    env = dict(os.environ, **{native.PURE_PYTHON_ENV: "1"})
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "not slow",
                          "-p", "no:cacheprovider", __file__],
                         env=env, capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
