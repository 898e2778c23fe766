"""The Python state a layer's calls follow (tracetorch.adapters.torch.path_watch and the learned
counts' budget): what a call runs and returns can change with nothing in its key changing — an
attribute, a transformers config, a global. A change to a watched attribute has every layer
measured again (every key checked again, once the attribute changed often enough to be
bookkeeping), so every figure stays what the mode counts (``TRACETORCH_LEARN_OPS=0``) and what
separate profiles measure, without a word; any other change is found by the periodic check
(after 32 replayed calls, then 64, ... up to 1,024), which warns and counts the key by the mode
from then on."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from test_learned_ops import _figures, _ModeCalls  # noqa: E402
from tracetorch.adapters.torch.learned import FIRST_BUDGET, MOST_BUDGET  # noqa: E402

torch.set_num_threads(1)


class Gate(torch.nn.Module):
    """``x * 2`` where ``double`` is true, else ``x + 1``: the same key, two paths."""

    double = False

    def forward(self, x):
        return x * 2 if self.double else x + 1


class PrivateGate(Gate):
    """A gate that reads a private attribute (not watched)."""

    _double = False

    def forward(self, x):
        return x * 2 if self._double else x + 1


class PropertyGate(Gate):
    """A gate whose path is set through a property."""

    def __init__(self):
        super().__init__()
        self.mode = "add"

    @property
    def doubled(self):
        return self.mode == "mul"

    @doubled.setter
    def doubled(self, value):
        self.__dict__["mode"] = "mul" if value else "add"

    def forward(self, x):
        return x * 2 if self.doubled else x + 1


class Outer(torch.nn.Module):
    """Sets its gate's path inside its own call, from its own call count (its bookkeeping)."""

    def __init__(self, switch_at):
        super().__init__()
        self.gate, self.switch_at, self.calls = Gate(), switch_at, 0

    def forward(self, x):
        self.calls += 1
        self.gate.double = self.calls >= self.switch_at
        return self.gate(x)


GLOBAL_PATH = {"double": False}


class GlobalGate(Gate):
    def forward(self, x):
        return x * 2 if GLOBAL_PATH["double"] else x + 1


def _profile(monkeypatch, learn, layer, calls, change_at, change, x=None):
    """``calls`` calls of ``layer`` under ``no_grad``, ``change(layer)`` before call number
    ``change_at`` (1-based); returns the figures, the call numbers that reached the mode and
    the warnings."""
    x = torch.ones(4) if x is None else x
    with monkeypatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patch.setenv("TRACETORCH_LEARN_OPS", "1" if learn else "0")
        mode_calls = _ModeCalls(patch)
        counted = []
        with torch.no_grad(), tracetorch.profile(layer) as prof:
            for call in range(1, calls + 1):
                if call == change_at:
                    change(layer)
                before = mode_calls.calls
                layer(x)
                if mode_calls.calls != before:
                    counted.append(call)
    messages = [str(w.message) for w in caught if "tracetorch" in str(w.message)]
    return _figures(prof), counted, messages


def _set(name, value):
    return lambda layer: setattr(layer, name, value)


#: Changes the watch sees: each has the next call counted by the mode, no warning.
WATCHED = {
    "class default shadowed": (Gate, _set("double", True)),
    "instance attribute changed": (Gate, lambda g: (setattr(g, "double", 0),
                                                    setattr(g, "double", 1))),
    "through a property": (PropertyGate, _set("doubled", True)),
    "a string": (PropertyGate, _set("mode", "mul")),
}


@pytest.mark.parametrize("name", list(WATCHED))
def test_a_watched_attribute_change_keeps_every_count_exact(monkeypatch, name):
    klass, change = WATCHED[name]
    reference, _, _ = _profile(monkeypatch, False, klass(), 10, 6, change)
    learned, counted, messages = _profile(monkeypatch, True, klass(), 10, 6, change)
    assert learned == reference and not messages
    assert reference[""][-1] == [("add", 5, 20), ("mul", 5, 20)]
    assert counted == [1, 2, 6, 7]  # learned from 1 and 2; 6 checked, differs, 7 agrees


def test_the_first_change_of_an_instance_default_only_is_checked_when_it_changes(monkeypatch):
    # 0 to 1 twice (the second time a change too), a set to the same value is no change
    def sets(gate):
        gate.double = False  # (the class's value: no change)

    learned, counted, _ = _profile(monkeypatch, True, Gate(), 8, 4, sets)
    assert counted == [1, 2] and learned[""][-1] == [("add", 8, 32)]


def test_a_parent_setting_its_childs_attribute_in_its_call_has_it_checked(monkeypatch):
    reference, _, _ = _profile(monkeypatch, False, Outer(switch_at=6), 10, 0, None)
    learned, _, messages = _profile(monkeypatch, True, Outer(switch_at=6), 10, 0, None)
    assert learned == reference and not messages
    assert reference["gate"][-1] == [("add", 5, 20), ("mul", 5, 20)]


class WeightedGate(Gate):
    """A gate whose path follows a list or array it holds: its comparison with another has
    no truth value (an array) or compares items (a list)."""

    def __init__(self, weights):
        super().__init__()
        self.weights = weights

    def forward(self, x):
        return x * 2 if sum(self.weights) > 0 else x + 1


@pytest.mark.parametrize("array", [True, False], ids=["array", "list"])
def test_an_attribute_compared_without_a_truth_value_is_taken_as_changed(monkeypatch, array):
    def gate():
        return WeightedGate(np.zeros(3) if array else [0.0, 0.0, 0.0])

    def change(layer):
        layer.weights = np.ones(3) if array else [1.0, 0.0, 0.0]

    reference, _, _ = _profile(monkeypatch, False, gate(), 6, 4, change)
    learned, _, messages = _profile(monkeypatch, True, gate(), 6, 4, change)
    assert learned == reference and not messages
    assert reference[""][-1] == [("add", 3, 12), ("mul", 3, 12)]


def test_bookkeeping_in_a_layers_own_call_and_private_names_check_nothing(monkeypatch):
    class Counting(Gate):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1  # its own call's bookkeeping
            return super().forward(x)

    def call(layer, *args):  # what Lightning sets on a LightningModule several times a step
        layer._current_fx_name = f"step {next(steps)}"
        return original(layer, *args)

    steps, original = iter(range(1000)), Counting.__call__
    with monkeypatch.context() as patch:
        patch.setattr(Counting, "__call__", call)
        _, counted, messages = _profile(monkeypatch, True, Counting(), 30, 0, None)
    assert counted == [1, 2] and not messages


#: Changes the watch does not see: found by the check after the first budget, with a warning.
UNWATCHED = {
    "private attribute": (PrivateGate, _set("_double", True)),
    "global": (GlobalGate, lambda _: GLOBAL_PATH.update(double=True)),
}


@pytest.mark.parametrize("name", list(UNWATCHED))
def test_an_unwatched_change_is_found_by_the_check_and_said(monkeypatch, name):
    klass, change = UNWATCHED[name]
    calls, change_at = 40, 10
    check = 2 + FIRST_BUDGET + 1  # two calls learn, the budget's replay, then one is checked
    try:
        reference, _, _ = _profile(monkeypatch, False, klass(), calls, change_at, change)
        GLOBAL_PATH["double"] = False
        learned, counted, messages = _profile(monkeypatch, True, klass(), calls, change_at,
                                              change)
    finally:
        GLOBAL_PATH["double"] = False
    assert reference[""][-1] == [("add", change_at - 1, 4 * (change_at - 1)),
                                 ("mul", calls - change_at + 1, 4 * (calls - change_at + 1))]
    # the calls from the change to the check replayed the earlier counts; from the check on,
    # every call is counted by the mode
    wrong = check - change_at
    assert learned[""][-1] == [("add", change_at - 1 + wrong, 4 * (change_at - 1 + wrong)),
                               ("mul", calls - check + 1, 4 * (calls - check + 1))]
    assert counted == [1, 2, *range(check, calls + 1)]
    assert len(messages) == 1
    assert f"up to the last {FIRST_BUDGET} of its calls" in messages[0]
    assert "PrivateGate" in messages[0] or "GlobalGate" in messages[0]


def test_the_budget_doubles_at_each_check_that_agrees_up_to_its_most(monkeypatch):
    budgets, checks, call = [], [1, 2], 2
    budget = FIRST_BUDGET
    while call + budget + 1 <= 3000:
        call += budget + 1
        checks.append(call)
        budgets.append(budget)
        budget = min(2 * budget, MOST_BUDGET)
    assert budgets[-1] == MOST_BUDGET  # (the run reaches the cap)
    learned, counted, messages = _profile(monkeypatch, True, Gate(), 3000, 0, None)
    assert counted == checks and not messages
    assert learned[""][-1] == [("add", 3000, 12000)]


def test_a_check_folded_across_keeps_its_budget(monkeypatch):
    # The tree read every call (a live view folds it): the replayed calls settled at each fold
    # spend the budget as the calls replayed since did.
    layer, x = Gate(), torch.ones(4)
    monkeypatch.setenv("TRACETORCH_LEARN_OPS", "1")
    with monkeypatch.context() as patch:
        mode_calls = _ModeCalls(patch)
        counted = []
        with torch.no_grad(), tracetorch.profile(layer) as prof:
            for call in range(1, 80):
                before = mode_calls.calls
                layer(x)
                _ = prof.root
                if mode_calls.calls != before:
                    counted.append(call)
    assert counted == [1, 2, 35]
    assert [(op.name, op.calls) for op in prof.find("").op_table()] == [("add", 79)]


def test_a_buffer_replaced_by_another_shape_is_measured_again(monkeypatch):
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.ones(()))

        def forward(self, x):
            return x * self.scale

    def grow(layer):
        layer.scale = torch.ones(3, 1)

    reference, _, _ = _profile(monkeypatch, False, Scaled(), 6, 4, grow)
    learned, _, messages = _profile(monkeypatch, True, Scaled(), 6, 4, grow)
    assert learned == reference and not messages
    assert reference[""][-1] == [("mul", 6, 3 * 4 + 3 * 12)]


def _gpt2():
    transformers = pytest.importorskip("transformers") if os.environ.get("CI") != "true" \
        else __import__("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50,
                                     n_positions=32, bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(config).eval()


def test_a_transformers_models_attention_switched_inside_the_block_is_counted_exactly(
        monkeypatch):
    ids = torch.randint(0, 50, (2, 12))

    def switch(model):
        model.set_attn_implementation("eager")

    reference, _, _ = _profile(monkeypatch, False, _gpt2(), 8, 4, switch, x=ids)
    learned, _, messages = _profile(monkeypatch, True, _gpt2(), 8, 4, switch, x=ids)
    assert learned == reference and not messages
    # the eager path builds its mask with operations the sdpa path does not run
    ops = {name for name, _, _ in reference["transformer"][-1]}
    assert {"where", "le"} <= ops


def test_the_watched_setattrs_are_put_back():
    transformers = pytest.importorskip("transformers") if os.environ.get("CI") != "true" \
        else __import__("transformers")
    from transformers.configuration_utils import PreTrainedConfig

    config_class = transformers.GPT2Config
    before = (vars(torch.nn.Module)["__setattr__"], vars(PreTrainedConfig)["__setattr__"],
              vars(config_class)["__setattr__"])
    layer = Gate()
    with tracetorch.profile(layer):
        assert "__setattr__" not in vars(Gate)  # (watched from its first call)
        layer(torch.ones(2))
        assert getattr(vars(Gate)["__setattr__"], "watches_paths", False)
        assert vars(torch.nn.Module)["__setattr__"] is before[0]  # (its subclasses' slots)
        assert vars(config_class)["__setattr__"] is not before[2]
    assert "__setattr__" not in vars(Gate)
    assert (vars(torch.nn.Module)["__setattr__"], vars(PreTrainedConfig)["__setattr__"],
            vars(config_class)["__setattr__"]) == before


def _memory_and_flops(prof):
    return {node.path: (node.calls, node.flops, node.memory.input_bytes,
                        node.memory.output_bytes, node.memory.saved_bytes)
            for node in prof.root.walk() if node.parent}


class Slimmable(torch.nn.Module):
    """A layer whose output width is an attribute (a slimmable network's subnet)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 8))
        self.active_width = 16

    def forward(self, x):
        return x @ self.weight[: self.active_width].t()


def _conv():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())


#: Layers whose figures (FLOPs by rule or by counted operations, sizes) follow an attribute, the
#: attribute and its values, and their input.
ATTRIBUTE_SHAPED = {
    "Conv2d stride": (_conv, lambda model, value: setattr(model[0], "stride", value),
                      [(1, 1), (2, 2)], lambda: torch.ones(1, 3, 9, 9)),
    "slimmable width": (Slimmable, lambda model, value: setattr(model, "active_width", value),
                        [16, 4], lambda: torch.ones(2, 8)),
}


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
@pytest.mark.parametrize("name", list(ATTRIBUTE_SHAPED))
def test_an_attribute_that_shapes_a_layers_output_has_it_measured_again(name, grad):
    make, set_value, values, inputs = ATTRIBUTE_SHAPED[name]
    torch.manual_seed(0)
    model, x = make(), inputs()

    def run(plan):
        with torch.set_grad_enabled(grad), tracetorch.profile(model) as prof:
            for value in plan:
                set_value(model, value)
                for _ in range(3):
                    out = model(x)
                    if grad:
                        out.sum().backward()
        return _memory_and_flops(prof)

    together = run(values)
    apart = [run([value]) for value in values]
    assert together == {path: tuple(a + b for a, b in zip(apart[0][path], apart[1][path]))
                        for path in together}
    assert apart[0] != apart[1]  # (the attribute does change the figures)


def test_an_attribute_changed_at_every_step_is_taken_for_bookkeeping(monkeypatch):
    from tracetorch.adapters.torch.path_watch import REMEASURED
    from tracetorch.engine.hotpath import structure_generation

    class Engine(torch.nn.Module):  # a training engine counting its steps on itself
        def __init__(self):
            super().__init__()
            self.gate, self.global_steps = Gate(), 0

        def forward(self, x):
            return self.gate(x)

    def run(learn):
        engine, x = Engine(), torch.ones(4)
        monkeypatch.setenv("TRACETORCH_LEARN_OPS", "1" if learn else "0")
        with torch.no_grad(), tracetorch.profile(engine) as prof:
            before = structure_generation()
            for step in range(12):
                engine(x)
                engine.global_steps += 1
                engine.gate.double = step >= 8  # (after the limit: checked, still exact)
            bumps = structure_generation() - before
        return _figures(prof), bumps

    (learned, bumps), (reference, _) = run(True), run(False)
    assert learned == reference
    assert reference["gate"][-1] == [("add", 9, 36), ("mul", 3, 12)]
    # global_steps' first changes and gate.double's one each measured everything again
    assert bumps == REMEASURED + 1
