"""count_flops takes what users have: a shape, or the model's real inputs (a tensor, token ids,
a tuple of arguments, a dict of keyword arguments); a bad input is reported without printing a
tensor's contents."""
from __future__ import annotations

import gc
import os
import weakref

import numpy as np
import pytest

import tracetorch
from tracetorch.core import Linear, Tensor

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")
nn = torch.nn


def test_a_shape_and_a_real_input_count_the_same():
    layer = nn.Linear(3, 2)
    assert tracetorch.count_flops(layer, (4, 3)) == tracetorch.count_flops(
        layer, torch.ones(4, 3)) == tracetorch.count_flops(layer, [4, 3]) == 2 * 4 * 3 * 2
    core = Linear(3, 2)
    assert tracetorch.count_flops(core, Tensor(np.ones((4, 3)))) == 2 * 4 * 3 * 2


def test_token_ids_positional_and_keyword_arguments():
    class Lookup(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(10, 4), nn.Linear(4, 6)

        def forward(self, ids, scale=None):
            out = self.head(self.embed(ids))
            return out if scale is None else out * scale

    model, ids = Lookup(), torch.tensor([[1, 2, 3]])
    gemm = 2 * 3 * 4 * 6
    assert tracetorch.count_flops(model, ids) == gemm
    assert tracetorch.count_flops(model, {"ids": ids}) == gemm
    scaled = tracetorch.count_flops(model, (ids, torch.ones(1)))
    assert scaled == tracetorch.count_flops(model, {"ids": ids, "scale": torch.ones(1)}) >= gemm


def test_a_bad_shape_names_the_argument_and_never_prints_a_tensor():
    with pytest.raises(ValueError, match=r"inputs: expected a non-empty tuple of positive ints, "
                                         r"got \(0, 3\)"):
        tracetorch.count_flops(nn.Linear(3, 2), (0, 3))
    from tracetorch.models.tensors import check_shape

    with pytest.raises(ValueError) as caught:
        check_shape(torch.ones(100, 100))
    assert str(caught.value) == ("input_shape: expected a non-empty tuple of positive ints, "
                                 "got a Tensor of shape (100, 100)")
    with pytest.raises(TypeError, match="inputs: expected a shape"):
        tracetorch.count_flops(nn.Linear(3, 2), None)


def _cyclic_garbage_after(run) -> list:
    """What the cyclic garbage collector alone would free of what ``run()`` left behind."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("model", [
    lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 2)),
    lambda: tracetorch.core.Sequential(Linear(8, 4), tracetorch.core.ReLU(), Linear(4, 2)),
])
def test_a_count_leaves_its_tree_to_reference_counting_not_to_the_cyclic_collector(model):
    # A one-shot count in a loop would otherwise hand ~20 objects per layer to the collector.
    layers = model()
    shape = (2, 3, 8, 8) if isinstance(layers, nn.Module) else (2, 8)
    expected = tracetorch.count_flops(layers, shape)
    left = _cyclic_garbage_after(lambda: tracetorch.count_flops(layers, shape))
    kinds = {type(obj).__name__ for obj in left}
    assert not kinds & {"CallNode", "Collector", "Frame", "TimeStats", "Identities"}, kinds
    assert tracetorch.count_flops(layers, shape) == expected  # and the next count is the same


def test_a_recording_is_released_only_once_stopped():
    from tracetorch.engine.collector import Collector
    from tracetorch.records.tree import CallNode

    collector = Collector(CallNode.root(), None)
    collector.start(collector.root)
    with pytest.raises(RuntimeError, match="release: the recording is still active"):
        collector.release()
    collector.stop()
    collector.release()
    # Released, the last reference frees it at once: nothing waits for the cyclic collector.
    gone = weakref.ref(collector)
    gc.disable()
    try:
        del collector
        assert gone() is None
    finally:
        gc.enable()


def test_a_count_keeps_nothing_for_another_opening_and_notes_no_run_facts(monkeypatch):
    # Its profile is opened once and read for its FLOPs alone: no node is remembered for a next
    # opening, no parameter ids kept, no run facts or unsupported-layer list made; the count is
    # what an ordinary profile of the same forward counts.
    from tracetorch.adapters.torch.ops import OpCountingMode
    from tracetorch.engine import collector, warm
    from tracetorch.profiler import block

    model, x = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(5)), \
        torch.ones(2, 3, 8, 8)
    model(x)  # (the lazy layer's weight made)
    reached = []  # what reaches the function mode: nothing inside the ruled layers, either way
    original_mode = OpCountingMode.__torch_function__
    monkeypatch.setattr(OpCountingMode, "__torch_function__", lambda mode, func, *a, **k: (
        reached.append(func), original_mode(mode, func, *a, **k))[1])
    with tracetorch.profile(model, timing=False, isolated=True, memory=False,
                            params=False) as prof:  # count_flops's settings
        with torch.no_grad():
            model(x)
    profiled, reached[:] = list(reached), []
    calls = []
    for owner, name in ((warm.WarmNodes, "remember"), (collector, "parameter_ids"),
                        (block, "run_facts"), (collector.Collector, "unsupported")):
        original = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _name=name, _original=original, **k: (
            calls.append(_name), _original(*a, **k))[1])
    assert tracetorch.count_flops(model, x) == prof.forward_flops > 2 * 2 * 5 * 4 * 36
    assert calls == []
    assert reached == profiled


class _Named(nn.Module):
    """What a profile's names tell apart, which count_flops's running total must count alike:
    siblings of one class, one layer at two call sites, a layer reached through an attribute
    path (and again through its container), a layer made afresh at each call."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b(self.a(self.a(x)))
        x = nn.GELU()(self.block[0](x))
        return self.block(x) + x


def test_a_count_counts_what_a_named_profile_counts():
    model, x = _Named(), torch.ones(4, 8)
    with torch.no_grad(), tracetorch.profile(model, timing=False) as prof:
        model(x)
    # a twice, b, block.0 twice, GELU (6 per element), ReLU, the residual add
    expected = 2 * 2 * 4 * 8 * 8 + 2 * 4 * 8 * 16 + 2 * 2 * 4 * 16 * 16 + 6 * 64 + 64 + 64
    assert tracetorch.count_flops(model, x) == prof.forward_flops == expected
    assert tracetorch.count_flops(model, x) == expected  # a next count alike
