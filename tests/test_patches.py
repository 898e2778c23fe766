"""The patch primitive: identity restore, ownership, inherited attributes, reference counts."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import tracetorch
from tracetorch.core import SGD, Linear, Module, Tensor
from tracetorch.core.optim import Optimizer
from tracetorch.engine.patches import (
    BOARD,
    Patch,
    PatchBoard,
    PatchTarget,
    is_instrumented,
    recording_wrapper,
)


class Layer:
    def forward(self, x):
        return x + 1

    def __call__(self, x):
        return self.forward(x)


class Child(Layer):
    """Inherits ``forward``."""


def test_apply_and_restore_by_identity():
    original = vars(Layer)["forward"]
    patch = Patch.apply(Layer, "forward", recording_wrapper(original, "module"))
    assert patch.owned and not patch.inherited and is_instrumented(vars(Layer)["forward"])
    assert patch.restore() is True
    assert vars(Layer)["forward"] is original
    assert patch.restore() is False  # the attribute no longer holds what was installed


def test_an_inherited_attribute_set_on_a_class_is_deleted_again():
    patch = Patch.apply(Child, "forward", recording_wrapper(Layer.forward, "module"))
    assert patch.inherited and "forward" in vars(Child)
    patch.restore()
    assert "forward" not in vars(Child) and Child().forward(1) == 2


def test_the_users_reassignment_is_kept():
    original = vars(Layer)["forward"]

    def users(self, x):
        return x * 10

    patch = Patch.apply(Layer, "forward", recording_wrapper(original, "module"))
    Layer.forward = users
    try:
        assert patch.restore() is False
        assert vars(Layer)["forward"] is users
    finally:
        Layer.forward = original


def test_board_wraps_only_classes_defining_the_attribute_unless_asked():
    board = PatchBoard()
    board.acquire([PatchTarget(Child, "forward", "module"),
                   PatchTarget(Layer, "forward", "module")])
    try:
        assert "forward" not in vars(Child)
        assert set(board.patched()) == {(Layer, "forward")}
    finally:
        board.release()
    board.acquire([PatchTarget(Child, "forward", "module", inherited=True)])
    assert is_instrumented(vars(Child)["forward"])
    board.release()
    assert "forward" not in vars(Child) and not board.patched()


def test_reference_counted_open_and_close():
    original = vars(Layer)["forward"]
    board = PatchBoard()
    target = PatchTarget(Layer, "forward", "module")
    board.acquire([target])
    wrapper = vars(Layer)["forward"]
    board.acquire([target])  # a second profile: nothing wrapped twice
    assert vars(Layer)["forward"] is wrapper
    board.release()
    assert vars(Layer)["forward"] is wrapper and board.active
    board.release()
    assert vars(Layer)["forward"] is original and not board.active
    board.release()  # one release too many is harmless
    assert not board.active


def test_a_failing_first_open_undoes_everything():
    original = vars(Layer)["forward"]
    board = PatchBoard()

    def broken_start():
        raise RuntimeError("adapter failed")

    with pytest.raises(RuntimeError, match="adapter failed"):
        board.acquire([PatchTarget(Layer, "forward", "module")], on_first=broken_start)
    assert not board.active and vars(Layer)["forward"] is original


def test_restore_goes_on_past_a_failure_and_reports_it():
    class Frozen(type):
        locked = False

        def __setattr__(cls, name, value):
            if Frozen.locked:
                raise TypeError("frozen")
            super().__setattr__(name, value)

    class A(metaclass=Frozen):
        def forward(self, x):
            return x

    original_a, original_layer = vars(A)["forward"], vars(Layer)["forward"]
    cleaned = []
    board = PatchBoard()
    board.acquire([PatchTarget(Layer, "forward", "module"), PatchTarget(A, "forward", "module")],
                  on_first=lambda: [lambda: cleaned.append(True)])
    Frozen.locked = True
    with pytest.raises(TypeError, match="frozen"):
        board.release()
    Frozen.locked = False
    assert vars(Layer)["forward"] is original_layer and cleaned == [True]
    assert vars(A)["forward"] is not original_a and not board.active  # as far as it could go


def test_a_guard_lets_calls_through_unrecorded():
    compiling = [False]
    board = PatchBoard()
    board.acquire([PatchTarget(Layer, "forward", "module", guard=lambda: compiling[0])])
    try:
        with tracetorch.profile(warn_unsupported=False) as prof:
            assert Layer()(1) == 2
            compiling[0] = True
            assert Layer()(1) == 2
    finally:
        board.release()
    assert prof.find("").calls == 1  # the first Layer; the guarded one left no node


def test_subclass_watching_calls_the_base_class_hook_and_is_removed():
    seen = []

    class Base:
        def __init_subclass__(cls, tag="", **kwargs):
            super().__init_subclass__(**kwargs)
            cls.tag = tag

    own = vars(Base)["__init_subclass__"]
    board = PatchBoard()
    board.acquire([])
    board.watch_subclasses(Base, seen.append)

    class New(Base, tag="x"):
        pass

    board.release()
    assert seen == [New] and New.tag == "x"
    assert vars(Base)["__init_subclass__"] is own

    class After(Base):
        pass

    assert seen == [New]


# ------------------------------------------------------------------ through a profile
def test_users_forward_assigned_inside_the_block_is_kept():
    original = vars(Linear)["forward"]

    def forward(self, x):
        return x

    try:
        with tracetorch.profile():
            Linear.forward = forward
        assert vars(Linear)["forward"] is forward
    finally:
        Linear.forward = original
    with tracetorch.profile():  # and the next block wraps what is there now
        assert is_instrumented(vars(Linear)["forward"])
    assert vars(Linear)["forward"] is original


def test_users_optimizer_step_and_init_subclass_assigned_inside_are_kept():
    original_step = vars(SGD)["step"]

    def step(self):
        pass

    def init_subclass(cls, **kwargs):
        pass

    hook = classmethod(init_subclass)
    try:
        with tracetorch.profile():
            SGD.step = step
            Module.__init_subclass__ = hook
        assert vars(SGD)["step"] is step and vars(Module)["__init_subclass__"] is hook
    finally:
        SGD.step = original_step
        del Module.__init_subclass__
    with tracetorch.profile():
        pass
    assert vars(SGD)["step"] is original_step and "__init_subclass__" not in vars(Module)


def test_classes_defined_inside_get_no_copy_and_run_no_wrapper_after():
    with tracetorch.profile() as prof:
        class Doubler(Module):
            def forward(self, x):
                return x * 2

        class Plain(Doubler):  # inherits forward: no copy, then or after
            pass

        class Noop(Optimizer):
            def step(self):
                pass

        assert is_instrumented(vars(Doubler)["forward"]) and "forward" not in vars(Plain)
        assert is_instrumented(vars(Noop)["step"])
        Plain()(Tensor(np.ones(2, dtype=np.float32)))
        Noop([Tensor(np.ones(1))]).step()
    assert prof.find("").calls == 1 and prof.find("Noop.step").calls == 1
    assert not is_instrumented(vars(Doubler)["forward"]) and "forward" not in vars(Plain)
    assert not is_instrumented(vars(Noop)["step"])
    assert "__init_subclass__" not in vars(Module) and "__init_subclass__" not in vars(Optimizer)


def test_profiles_in_threads_share_the_board_and_leave_nothing():
    original = vars(Linear)["forward"]
    errors = []

    def work():
        try:
            for _ in range(50):
                with tracetorch.profile():
                    Linear(2, 2)(Tensor(np.ones((1, 2), dtype=np.float32)))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and not BOARD.active and not BOARD.patched()
    assert vars(Linear)["forward"] is original


def test_an_exception_in_the_block_restores_everything():
    before = {cls: vars(cls).get("forward") for cls in (Linear, Layer)}
    model = Layer()
    with pytest.raises(ZeroDivisionError):
        with tracetorch.profile(model, warn_unsupported=False):
            assert is_instrumented(vars(Layer)["forward"])
            model(1) / 0
    assert {cls: vars(cls).get("forward") for cls in (Linear, Layer)} == before
    assert not BOARD.active


def test_a_layer_method_binds_to_tracetorchs_own_bound_method():
    # Read from a layer, the recording method is tracetorch's light bound object (C where the
    # accelerator is built): it stands for the bound original forward and calls the wrapper.
    from types import MethodType

    from tracetorch.engine.native import native_type
    from tracetorch.engine.patches import BoundLayerMethod

    original = vars(Layer)["forward"]
    patch = Patch.apply(Layer, "forward", recording_wrapper(original, "module"))
    try:
        layer = Layer()
        built = native_type("tracetorch.engine._binding", "BoundLayerMethod")
        assert type(layer.forward) is (built or BoundLayerMethod)
        assert isinstance(layer.forward, MethodType)
        assert layer.forward.__wrapped__ == MethodType(original, layer)
        assert layer.forward(1) == 2 and Layer.forward is original
    finally:
        patch.restore()


def test_a_call_without_keywords_hands_its_wrapper_an_empty_dict_each_time():
    # (the C binding hands every such call one empty dict: one that a wrapper filled is not
    # handed on)
    from tracetorch.engine.patches import LayerMethod

    seen = []

    def filling(wrapped, instance, args, kwargs):
        seen.append(dict(kwargs))
        kwargs["left"] = True
        return wrapped(*args)

    patch = Patch.apply(Layer, "forward", LayerMethod(vars(Layer)["forward"], filling))
    try:
        layer = Layer()
        assert [layer.forward(1), layer.forward(2), layer.forward(3, **{})] == [2, 3, 4]
    finally:
        patch.restore()
    assert seen == [{}, {}, {}]


def test_a_layer_method_binds_in_c_where_the_accelerator_is_built():
    # _call_impl reads self.forward at every layer call: a Python __get__ costs a frame there.
    from types import FunctionType

    from tracetorch.engine.native import PURE_PYTHON_ENV, native_type
    from tracetorch.engine.patches import LayerMethod

    binding = next(vars(cls)["__get__"] for cls in LayerMethod.__mro__ if "__get__" in vars(cls))
    built = native_type("tracetorch.engine._binding", "layer_binding") is not None
    if os.environ.get("CI") == "true" and os.environ.get(PURE_PYTHON_ENV) != "1":
        assert built, "tracetorch/engine/_binding.c was not built by pip install"
    assert isinstance(binding, FunctionType) is not built
