"""Learned operation counts (tracetorch.adapters.torch.learned): a layer without a FLOP rule runs
without the function mode once two calls with its key counted the same (under autograd, only
a call whose products can be found in its graph again), and every figure, backward FLOPs
included, stays what the mode counts on every call (``TRACETORCH_LEARN_OPS=0``)."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from tracetorch.adapters.torch.ops import OpCountingMode  # noqa: E402

torch.set_num_threads(1)


def _figures(prof):
    """Every node's forward and backward figures and op table (calls and FLOPs)."""
    return {node.path: (node.calls, node.flops, node.gemm_flops, node.macs, node.flops_source,
                        node.backward_flops, node.backward_gemm_flops,
                        sorted((op.name, op.calls, op.flops) for op in node.op_table()))
            for node in prof.root.walk()}


class _ModeCalls:
    """Counts the calls reaching the profile's function mode."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = OpCountingMode.__torch_function__

        def counted(mode, *args, **kwargs):
            self.calls += 1
            return original(mode, *args, **kwargs)

        monkeypatch.setattr(OpCountingMode, "__torch_function__", counted)


def _run(monkeypatch, learn, model, inputs, steps=6, grad=False, read=False, **options):
    """Profile ``steps`` steps of ``model(**inputs)``; returns its figures and the calls that
    reached the mode at each step (``read``: the tree is read after each step, which folds
    it then, as a live view does)."""
    with monkeypatch.context() as patch:
        patch.setenv("TRACETORCH_LEARN_OPS", "1" if learn else "0")
        mode_calls = _ModeCalls(patch)
        per_step = []
        with torch.set_grad_enabled(grad), tracetorch.profile(model, **options) as prof:
            for _ in range(steps):
                before = mode_calls.calls
                out = model(**inputs)
                if grad:  # (a transformers model's output: its first tensor)
                    (out if isinstance(out, torch.Tensor) else out[0]).sum().backward()
                prof.step()
                if read:
                    _ = prof.root
                per_step.append(mode_calls.calls - before)
    return _figures(prof), per_step


class Caller(torch.nn.Module):
    """Calls ``layer`` with ``arguments(call number, x)``: a layer whose key changes from call
    to call under a caller."""

    def __init__(self, layer, arguments):
        super().__init__()
        self.layer, self.arguments, self.call = layer, arguments, 0

    def forward(self, x):
        self.call += 1
        return self.layer(*self.arguments(self.call, x))


def _both(monkeypatch, layer, arguments, inputs, steps=6):
    """The figures of ``steps`` steps of a :class:`Caller`, every call counted by the mode
    (the reference) and with learned counts."""
    reference, _ = _run(monkeypatch, False, Caller(layer, arguments), inputs, steps=steps)
    learned, _ = _run(monkeypatch, True, Caller(layer, arguments), inputs, steps=steps)
    return reference, learned


class Attention(torch.nn.Module):
    """Products, a softmax and a residual add around ruled Linears: no rule of its own."""

    def __init__(self, width=8):
        super().__init__()
        self.q = torch.nn.Linear(width, width)
        self.k = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        scores = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), dim=-1)
        return x + self.out(scores @ x)


class Block(torch.nn.Module):
    """A layer without a rule around another one without a rule."""

    def __init__(self):
        super().__init__()
        self.attention = Attention()
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(self.attention(x) * 0.5 + x)


def _small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(Block(), Block()).eval()


def test_learned_counts_equal_the_modes_on_small_models(monkeypatch):
    model, x = _small_model(), {"input": torch.randn(2, 4, 8)}
    reference, reference_calls = _run(monkeypatch, False, model, x)
    learned, learned_calls = _run(monkeypatch, True, model, x)
    assert learned == reference
    assert learned_calls[:2] == reference_calls[:2]
    # Blocks and Attentions learned from steps 1 and 2: no operation reaches the mode after.
    assert learned_calls[2:] == [0] * 4 and reference_calls[2] > 0


def test_learned_counts_equal_the_modes_for_varying_shapes(monkeypatch):
    # Two keys interleaved: each learned apart, each replayed with its own counts.
    reference, learned = _both(monkeypatch, _small_model(),
                               lambda call, x: (x if call % 2 else x[:, :3],),
                               {"x": torch.randn(2, 4, 8)}, steps=8)
    assert learned == reference


class Unsteady(torch.nn.Module):
    """Runs ``adds[i]`` additions at its i-th call: its counts change under one key."""

    def __init__(self, adds):
        super().__init__()
        self.adds, self.call = adds, 0

    def forward(self, x):
        for _ in range(self.adds[self.call]):
            x = x + 1
        self.call += 1
        return x


@pytest.mark.parametrize("adds", [[1, 2, 2, 2, 2, 2], [1, 2, 1, 1, 1, 1], [3, 1, 3, 3, 3, 3]])
def test_counts_that_differ_between_the_first_calls_are_never_learned(monkeypatch, adds):
    x = {"x": torch.ones(3)}
    reference, reference_calls = _run(monkeypatch, False, Unsteady(adds), x)
    learned, learned_calls = _run(monkeypatch, True, Unsteady(adds), x)
    assert learned == reference
    assert reference[""][-1] == [("add", sum(adds), 3 * sum(adds))]  # 3 elements per add
    assert learned_calls == reference_calls  # every call counted by the mode


def test_steady_counts_are_learned(monkeypatch):
    x = {"x": torch.ones(3)}
    reference, reference_calls = _run(monkeypatch, False, Unsteady([2] * 6), x)
    learned, learned_calls = _run(monkeypatch, True, Unsteady([2] * 6), x)
    assert learned == reference
    assert reference[""][-1] == [("add", 12, 36)]
    # Calls 1 and 2 counted by the mode, 3 to 6 learned.
    assert learned_calls[:2] == reference_calls[:2] and learned_calls[2:] == [0] * 4


def test_under_autograd_calls_whose_products_can_be_placed_are_learned(monkeypatch):
    # A training loop (a backward pass at the root after each step): the Blocks' own operations
    # (a mul and an add each) are learned across it, and so is the second Attention, whose
    # products' operands all need a gradient (each is found in the graph after a replay: see
    # test_learned_products.py). The first Attention's ``scores @ x`` takes the model's input,
    # which needs none (and might later): its five operations reach the mode to the end, as do
    # the loop's sum and backward at the root.
    model, x = _small_model().train(), {"input": torch.randn(2, 4, 8)}
    reference, reference_calls = _run(monkeypatch, False, model, x, grad=True)
    learned, learned_calls = _run(monkeypatch, True, model, x, grad=True)
    assert learned == reference
    assert reference["0.attention"][6] and reference["0.attention"][5] > 0  # backward FLOPs
    assert reference["1.attention"][6] and reference["1.attention"][5] > 0
    assert learned_calls[:2] == reference_calls[:2]
    assert reference_calls[2] == 2 * (2 + 5) + 2
    assert learned_calls[2:] == [5 + 2] * 4


class Unfreezing(torch.nn.Module):
    """``x @ weight + bias`` with ``weight`` frozen for the first ``frozen`` calls: whether the
    product needs marking for backward changes under one key."""

    def __init__(self, frozen):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4, 4), requires_grad=False)
        self.bias = torch.nn.Parameter(torch.zeros(4))
        self.frozen, self.call = frozen, 0

    def forward(self, x):
        self.call += 1
        self.weight.requires_grad_(self.call > self.frozen)
        return x @ self.weight + self.bias


def test_a_product_under_autograd_is_never_learned(monkeypatch):
    # Learned from two calls with a frozen weight, the product's backward FLOPs would be lost
    # once the weight trains: a call under grad mode that ran a product is counted every time.
    x = {"x": torch.ones(2, 4)}
    reference, reference_calls = _run(monkeypatch, False, Unfreezing(3), x, grad=True)
    learned, learned_calls = _run(monkeypatch, True, Unfreezing(3), x, grad=True)
    assert learned == reference
    assert reference[""][6] == 3 * 2 * 2 * 4 * 4  # the weight's gradient, in calls 4 to 6
    assert learned_calls == reference_calls


def test_a_users_mode_above_the_profiles_keeps_every_count(monkeypatch):
    # The profile's mode cannot come off the stack under a user's mode: nothing is replayed,
    # which would count the calls twice.
    class UserMode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    model = _small_model()

    class UnderUserMode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            with UserMode():
                return self.model(x)

    x = {"x": torch.randn(2, 4, 8)}
    reference, _ = _run(monkeypatch, False, UnderUserMode(), x)
    learned, _ = _run(monkeypatch, True, UnderUserMode(), x)
    assert learned == reference


def test_op_timing_counts_every_call(monkeypatch):
    # Each operation's time is measured, never learned.
    model, x = _small_model(), {"input": torch.randn(2, 4, 8)}
    reference, reference_calls = _run(monkeypatch, False, model, x, op_timing=True)
    learned, learned_calls = _run(monkeypatch, True, model, x, op_timing=True)
    assert learned == reference
    assert learned_calls == reference_calls


def _transformers_cases():
    # Every model of test_transformers_models, under no_grad and (those that train) training.
    try:
        from test_transformers_models import MODELS, TRAINED
    except ImportError:  # no transformers here (CI installs it and fails instead: see below)
        return [pytest.param("bert", False, id="bert-no_grad")]
    return [pytest.param(name, grad, id=f"{name}-{'training' if grad else 'no_grad'}")
            for name in MODELS for grad in (False, True) if not grad or name in TRAINED]


@pytest.mark.parametrize("name, grad", _transformers_cases())
def test_learned_counts_equal_the_modes_on_transformers(monkeypatch, name, grad):
    if os.environ.get("CI") != "true":
        pytest.importorskip("transformers")
    from test_transformers_models import build

    model, inputs = build(name)
    model.train(grad)
    reference, reference_calls = _run(monkeypatch, False, model, inputs, steps=4, grad=grad)
    model, inputs = build(name)  # (the same weights: a model of its own, as a new run's)
    model.train(grad)
    learned, learned_calls = _run(monkeypatch, True, model, inputs, steps=4, grad=grad)
    assert learned == reference
    # The first step is counted by the mode (the second too, but for a layer called twice a
    # step: learned from its two calls in the first, as segformer's are).
    assert learned_calls[0] == reference_calls[0] and learned_calls[1] <= reference_calls[1]
    # From the third step on every layer's counts are replayed, attentions' products included
    # (placed in the graph for their backward FLOPs): only the loop's own sum and backward, at
    # the profile's root, reach the mode. A layer that branches on a tensor's value is counted
    # by the mode at every call (test_learned_value_reads): wav2vec2's encoder in training
    # draws a random number per layer and compares it with its LayerDrop in Python.
    if name == "wav2vec2" and grad:
        assert learned_calls[2] == learned_calls[3] < reference_calls[2]
    else:
        assert learned_calls[2:] == [2 if grad else 0] * 2


class Repeated(torch.nn.Module):
    """Runs ``times`` additions: a plain argument the call key has no value of."""

    def forward(self, x, times):
        for _ in range(times):
            x = x + 1
        return x


def test_a_plain_argument_is_a_part_of_what_is_learned(monkeypatch):
    reference, learned = _both(monkeypatch, Repeated(),
                               lambda call, x: (x, 2 if call <= 3 else 5), {"x": torch.ones(3)})
    assert learned == reference
    assert reference["layer"][-1] == [("add", 3 * 2 + 3 * 5, 3 * (3 * 2 + 3 * 5))]


class Doubling:
    """An argument object: which one a call gets decides what it runs."""

    def apply(self, x):
        return x * 2


class Shifting:
    def apply(self, x):
        return x + 1


class Applying(torch.nn.Module):
    def forward(self, x, how):
        return how.apply(x)


def test_an_argument_objects_class_is_a_part_of_what_is_learned(monkeypatch):
    reference, learned = _both(monkeypatch, Applying(),
                               lambda call, x: (x, Doubling() if call <= 3 else Shifting()),
                               {"x": torch.ones(3)})
    assert learned == reference
    assert reference["layer"][-1] == [("add", 3, 9), ("mul", 3, 9)]


def test_a_call_watched_beside_a_learned_key_keeps_exact_counts(monkeypatch):
    # Key B is learned first; then calls of key A (watched while A is being learned) alternate
    # with B's (replayed): what B adds must not be taken for what A's watched call counted.
    # (the caller slices at every call: the same operations, its own counts learned)
    reference, learned = _both(monkeypatch, Repeated(),
                               lambda call, x: (x[:3] if call <= 3 or call % 2 else x[:2], 2),
                               {"x": torch.ones(3)}, steps=12)
    assert learned == reference


def test_each_profile_learns_anew(monkeypatch):
    # What one session learned stays in the counters, but a new session reads none of it: its
    # first calls go through the mode again.
    model, x = _small_model(), {"input": torch.randn(2, 4, 8)}
    first, first_calls = _run(monkeypatch, True, model, x)
    again, again_calls = _run(monkeypatch, True, model, x)
    assert again == first and again_calls == first_calls and first_calls[0] > 0


class EnableGradInside(torch.nn.Module):
    """Under ``no_grad``, records a product for backward inside ``enable_grad`` and, with
    ``backward``, runs a backward pass of its own: neither is the mode's counting."""

    def __init__(self, backward):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4, 4))
        self.backward = backward

    def forward(self, x):
        with torch.enable_grad():
            product = self.weight @ x
            if self.backward:
                product.sum().backward()
        return x * 2


@pytest.mark.parametrize("backward", [False, True], ids=["product marked", "backward pass"])
def test_a_call_recording_for_backward_under_no_grad_is_not_learned(monkeypatch, backward):
    x = {"x": torch.ones(4, 2)}
    reference, reference_calls = _run(monkeypatch, False, EnableGradInside(backward), x)
    learned, learned_calls = _run(monkeypatch, True, EnableGradInside(backward), x)
    assert learned == reference
    assert (reference[""][5] > 0) is backward  # the backward FLOPs of its own pass
    assert learned_calls == reference_calls


def test_the_nodes_of_stopped_profiles_are_not_kept(monkeypatch, torch):
    from tracetorch.engine import hotpath

    layer = Repeated()
    with torch.no_grad(), tracetorch.profile():
        replay = hotpath._op_replay
        for _ in range(300):
            with tracetorch.profile(layer):
                layer(torch.ones(2), 1)
        assert replay is not None and len(replay.__self__.observing) < 200


def test_a_torch_function_subclass_logs_the_same_calls_inside_and_outside():
    # The learner's key reads a subclass's .shape and .dtype with its __torch_function__ off.
    class Logged(torch.Tensor):
        log: list = []

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            cls.log.append(getattr(func, "__name__", ""))
            return super().__torch_function__(func, types, args, kwargs or {})

    model = _small_model()

    def step():
        x = torch.randn(2, 4, 8).as_subclass(Logged)
        Logged.log = []
        model(x)
        return list(Logged.log)

    with torch.no_grad():
        step()
        outside = step()
        with tracetorch.profile(model):
            inside = [step() for _ in range(5)]
    assert inside[1:] == [outside] * 4


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama-gqa", "t5"])
def test_learned_counts_equal_the_modes_under_activation_checkpointing(monkeypatch, name):
    # The checkpointed layers run again inside each backward pass (recompute nodes), where
    # nothing is counted or learned: the figures, the recomputed layers' included, are the mode's.
    if os.environ.get("CI") != "true":
        pytest.importorskip("transformers")
    from test_transformers_models import build

    figures = []
    for learn in (False, True):
        model, inputs = build(name)
        model.train()
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
        figures.append(_run(monkeypatch, learn, model, inputs, steps=4, grad=True)[0])
    reference, learned = figures
    assert any(path.startswith("backward.") for path in reference)  # recomputed layers
    assert learned == reference


class LateSecondKey(torch.nn.Module):
    """Calls ``layer`` with one key at every step and, from the fourth step, with a second key
    after it: the second key's first calls are watched while the first key's replayed calls of
    the same step wait for the step's fold."""

    def __init__(self):
        super().__init__()
        self.layer, self.steps = Repeated(), 0
        # (made here: the caller runs no operation of its own, whose count its own unchanged
        # key would not tell apart from the fourth step on)
        self.short, self.long = torch.ones(2), torch.ones(3)

    def forward(self, x):
        self.steps += 1
        y = self.layer(self.short, 2)
        if self.steps >= 4:
            y = self.layer(self.long, 3)
        return y


def test_replayed_calls_folded_while_another_key_is_watched_are_not_taken_for_its_counts(
        monkeypatch):
    x = {"x": torch.ones(3)}
    reference, _ = _run(monkeypatch, False, LateSecondKey(), x, steps=9, read=True)
    learned, calls = _run(monkeypatch, True, LateSecondKey(), x, steps=9, read=True)
    assert learned == reference
    assert reference["layer"][-1] == [("add", 9 * 2 + 6 * 3, 9 * 2 * 2 + 6 * 3 * 3)]
    assert calls[-2:] == [0, 0]  # both keys learned by then


def test_a_replayed_call_that_raises_keeps_its_counts(monkeypatch):
    class Failing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            y = x * 2
            if self.calls == 5:
                raise ValueError("the fifth call")
            return y

    layer = Failing()
    monkeypatch.setenv("TRACETORCH_LEARN_OPS", "1")
    with torch.no_grad(), tracetorch.profile(layer) as prof:
        for _ in range(4):
            layer(torch.ones(4))
        prof.step()
        _ = prof.root  # folded: the raising call is its counter's only one since
        with pytest.raises(ValueError, match="the fifth call"):
            layer(torch.ones(4))
        inside = [(op.name, op.calls, op.flops) for op in prof.find("").op_table()]
    assert inside == [("mul", 5, 20)]  # read inside the block, as a live view reads it
    node = prof.find("")
    # every call ran its product: the raising one's counts were replayed before it raised
    assert [(op.name, op.calls, op.flops) for op in node.op_table()] == [("mul", 5, 20)]
    assert node.calls == 5 and node.errors == 1


def test_a_model_called_at_the_top_of_a_block_is_replayed_by_the_engine(monkeypatch):
    # At the top of a block the profile's mode is on the stack: the engine takes it off to
    # read the call's key, so a learned model call is replayed without asking the learner
    # (which read the key again in Python, quietly, at every step) and its counts stay exact.
    from tracetorch.adapters.torch.learned import OpLearner

    asked: list[str] = []
    original = OpLearner.replay

    def replay(learner, frame, *args):
        asked.append(frame.node.path)
        return original(learner, frame, *args)

    torch.manual_seed(0)
    model, x = Block().eval(), {"x": torch.randn(2, 4, 8)}
    reference, _ = _run(monkeypatch, False, model, x)
    with monkeypatch.context() as patch:
        patch.setattr(OpLearner, "replay", replay)
        learned, calls = _run(monkeypatch, True, model, x)
    assert learned == reference
    # asked at the first three steps (two watched, the third settles the second), then never
    assert asked == ["", "attention"] * 3 and calls[3:] == [0] * 3
