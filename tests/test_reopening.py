"""A profile opened again (a decorated step opens one per call) takes up the nodes it made
before at the cost of a frame: the same numbers as a first opening, no user object kept alive
between openings, and a change of rules, layer or weights seen at the next opening."""
from __future__ import annotations

import gc
import weakref

import numpy as np

import tracetorch
from tracetorch.core import Linear, ReLU, Sequential, Tensor


def test_a_decorated_step_counts_the_same_as_one_block():
    model, x = Sequential(Linear(4, 8), ReLU(), Linear(8, 2)), Tensor(np.ones((3, 4)))

    @tracetorch.profile(model)
    def step():
        model(x)

    for _ in range(5):
        step()
    with tracetorch.profile(model) as block:
        for _ in range(5):
            model(x)
    decorated = step.profile
    assert [(n.path, n.calls, n.flops, n.params) for n in decorated.nodes()] == \
           [(n.path, n.calls, n.flops, n.params) for n in block.nodes()]
    assert decorated.total_flops == block.total_flops == 5 * (2 * 3 * 4 * 8 + 3 * 8 + 2 * 3 * 8 * 2)


def test_between_openings_the_profile_keeps_no_model_alive():
    model, x = Sequential(Linear(4, 8), ReLU()), Tensor(np.ones((3, 4)))
    prof = tracetorch.profile()
    for _ in range(2):
        with prof:
            model(x)
    ref = weakref.ref(model)
    layer = weakref.ref(model.layers[0])
    del model
    gc.collect()
    assert ref() is None and layer() is None
    assert prof.find("layers.0").calls == 2


def test_a_rule_registered_between_openings_applies_from_the_next_one():
    class Scale:
        def forward(self, x):
            return x * 2.0

    layer, x = Scale(), Tensor(np.ones((3, 4)))
    prof = tracetorch.profile(layer, warn_unsupported=False)
    with prof:
        layer.forward(x)
    before = prof.find("").flops
    tracetorch.flop_rule(Scale)(lambda layer, inputs, output: 1000)
    with prof:
        layer.forward(x)
    assert prof.find("").flops == before + 1000


def test_a_new_model_at_the_same_path_gets_its_own_numbers():
    x = Tensor(np.ones((3, 4)))
    prof = tracetorch.profile()
    for width in (8, 16):
        model = Sequential(Linear(4, width))
        with prof:
            model(x)
        del model
        gc.collect()
    assert sorted(n.flops for n in prof.nodes() if n.type_name == "Linear") == [
        2 * 3 * 4 * 8, 2 * 3 * 4 * 16]


def test_reopening_a_core_profile_keeps_each_layers_measured_figures():
    # The core adapter registers its rules at every opening: registering the same rules again
    # must not count as a change of rules, which would drop what the kept nodes measured.
    measured = []

    class Scale:
        def forward(self, x):
            return x * 2.0

    tracetorch.flop_rule(Scale)(lambda layer, inputs, output: measured.append(1) or 12)
    layer, x = Scale(), Tensor(np.ones((3, 4)))
    prof = tracetorch.profile(layer)
    for _ in range(3):
        with prof:
            layer.forward(x)
    assert prof.find("").flops == 3 * 12
    assert len(measured) == 1  # measured at the first call only
