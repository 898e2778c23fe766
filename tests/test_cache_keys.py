"""A layer's figures measured once are reused only for calls they hold for.

FLOPs, bytes read and written, bytes saved for backward and gradient parts are measured at a
layer's first call with a key (``node.engine.flops_cache``) and counted again for each later call
with the same key: the key holds what they depend on besides the layer's type (its inputs'
shapes and dtypes, the grad mode, the layer's parameter shapes and dtypes and sublayers), so a
call that differs in any of them is measured anew. Sizes below: F32 = 4, F64 = 8 bytes an element.

(``tracetorch.core``'s grad mode: tests/test_memory.py. This module leaves ``tracetorch.core``
unimported: while it is, each opening of a profile re-registers core's rules, which drops the
nodes kept between openings, and the tests between two openings would not reach them.)
"""
from __future__ import annotations

import pytest

import tracetorch

F32, F64 = 4, 8


# ----------------------------------------------------------------------------- training mode
def test_batchnorm_in_training_then_eval_counts_each_mode(torch):
    # BatchNorm: 7 per element with batch statistics (training), 4 with running statistics.
    layer, x = torch.nn.BatchNorm1d(4), torch.ones(8, 4)
    with tracetorch.profile(layer) as prof:
        layer(x)
        layer.eval()
        layer(x)
        layer.train()
        layer(x)
    assert prof.root.children[""].flops == 8 * 4 * (7 + 4 + 7)


def test_attention_keys_its_backward_by_training_mode(torch):
    # With dropout, MultiheadAttention runs the math kernel in training (no recompute) and the
    # fused one in eval (the scores recomputed in backward): each mode keeps its own parts, so
    # one profile over both modes gives what two profiles give.
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 2, dropout=0.5, batch_first=True)
    x = torch.randn(2, 5, 16, requires_grad=True)

    def run(training):
        mha.train(training)
        mha(x, x, x, need_weights=False)[0].sum().backward()

    separate = []
    for training in (True, False):
        with tracetorch.profile(mha) as prof:
            run(training)
        separate.append(prof.backward_flops)
    with tracetorch.profile(mha) as prof:
        run(True)
        run(False)
    assert separate[0] != separate[1]
    assert prof.backward_flops == sum(separate)


# ----------------------------------------------------------------------------- grad mode
def test_an_inference_call_before_training_leaves_the_training_calls_their_saved_bytes(torch):
    layer, x = torch.nn.Linear(16, 32), torch.ones(8, 16)
    with tracetorch.profile(layer) as prof:
        with torch.no_grad():
            layer(x)  # saves nothing
        layer(x)      # keeps its input for the weight's gradient
    node = prof.root.children[""]
    assert node.calls == 2
    assert node.memory.saved_bytes == 8 * 16 * F32
    assert node.memory.input_bytes == 2 * 8 * 16 * F32


def test_an_inference_call_after_training_saves_nothing(torch):
    layer, x = torch.nn.Linear(16, 32), torch.ones(8, 16)
    with tracetorch.profile(layer) as prof:
        layer(x)
        with torch.inference_mode():
            layer(x)
    assert prof.root.children[""].memory.saved_bytes == 8 * 16 * F32  # the first call's only


# ----------------------------------------------------------------------------- dtypes
def test_a_float64_call_after_a_float32_call_of_the_same_shape_is_sized_as_float64(torch):
    layer, x = torch.nn.Linear(4, 4), torch.ones(2, 4)
    with tracetorch.profile(layer) as prof:
        layer(x)
        layer.double()(x.double())
    memory = prof.root.children[""].memory
    assert memory.input_bytes == 2 * 4 * F32 + 2 * 4 * F64
    assert memory.output_bytes == 2 * 4 * F32 + 2 * 4 * F64
    assert memory.saved_bytes == 2 * 4 * F32 + 2 * 4 * F64  # each call's input
    assert prof.root.children[""].flops == 2 * (2 * 2 * 4 * 4)  # 2·rows·in·out a call


def test_dtypes_key_calls_with_several_tensors(torch):
    # Two tensors and a keyword: the key is walked, not read off one tensor.
    layer = torch.nn.Bilinear(3, 3, 2, bias=False)
    a, b = torch.ones(1, 3), torch.ones(1, 3)
    with tracetorch.profile(layer) as prof:
        layer(a, input2=b)
        layer.double()(a.double(), input2=b.double())
    assert prof.root.children[""].memory.input_bytes == 2 * 3 * F32 + 2 * 3 * F64


# ----------------------------------------------------------------------------- parameters
def _grown(torch, layer, out_features):
    # A larger weight for a Linear(4, 4) without bias: its output grows to 8 features.
    layer.weight = torch.nn.Parameter(torch.ones(8, 4))
    layer.out_features = out_features


def _assert_measured_twice(node):
    # Rows 2, in 4: out 4 then 8 features. FLOPs 2·rows·in·out, output bytes rows·out·4; the
    # weight's gradient 2·rows·in·out (the input needs none).
    assert node.flops == 2 * 2 * 4 * 4 + 2 * 2 * 4 * 8
    assert node.memory.output_bytes == (2 * 4 + 2 * 8) * F32
    assert node.backward_flops == 2 * 2 * 4 * 4 + 2 * 2 * 4 * 8


def test_a_weight_replaced_by_a_larger_one_in_the_block_is_measured_again(torch):
    for out_features in (4, 8):  # out_features left as it was, or changed with it
        layer, x = torch.nn.Linear(4, 4, bias=False), torch.ones(2, 4)
        with tracetorch.profile(layer) as prof:
            layer(x).sum().backward()
            _grown(torch, layer, out_features)
            layer(x).sum().backward()
        _assert_measured_twice(prof.root.children[""])


def test_a_weight_replaced_between_two_openings_is_measured_again(torch):
    layer, x = torch.nn.Linear(4, 4, bias=False), torch.ones(2, 4)
    prof = tracetorch.profile(layer)
    with prof:
        layer(x).sum().backward()
    _grown(torch, layer, 8)
    with prof:
        layer(x).sum().backward()
    _assert_measured_twice(prof.root.children[""])


def test_a_weight_replaced_by_one_of_the_same_shape_keeps_the_figures(torch):
    layer, x = torch.nn.Linear(4, 4, bias=False), torch.ones(2, 4)
    with tracetorch.profile(layer) as prof:
        layer(x)
        keys = list(prof.root.children[""].engine.flops_cache)
        layer.weight = torch.nn.Parameter(torch.zeros(4, 4))
        layer(x)
        assert list(prof.root.children[""].engine.flops_cache) == keys  # nothing measured again
    assert prof.root.children[""].flops == 2 * (2 * 2 * 4 * 4)


def test_a_weight_replaced_in_the_block_is_counted_again_as_a_parameter(torch):
    layer, x = torch.nn.Linear(4, 4, bias=False), torch.ones(2, 4)
    with tracetorch.profile(layer) as prof:
        layer(x)
        _grown(torch, layer, 8)
        layer(x)
    node = prof.root.children[""]
    assert (node.params, node.memory.param_bytes) == (8 * 4, 8 * 4 * F32)


def _embedding_model(torch):
    # Token ids in, floats out: converting the weights changes what it returns, not its key.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 2))


def _figures(prof):
    return {node.path: (node.calls, node.flops, node.memory.input_bytes,
                        node.memory.output_bytes) for node in prof.root.walk() if node.parent}


@pytest.mark.parametrize("convert", ["to", "half", "double"])
def test_a_model_converted_in_the_block_is_measured_again(torch, convert):
    ids = torch.tensor([[1, 2, 3]])

    def converted(model):
        return (model.to(torch.bfloat16) if convert == "to"
                else getattr(model, convert)())

    model = _embedding_model(torch)
    with torch.no_grad(), tracetorch.profile(model) as prof:
        model(ids)
        converted(model)
        model(ids)
    together = _figures(prof)
    apart = _embedding_model(torch)
    with torch.no_grad(), tracetorch.profile(apart) as before:
        apart(ids)
    converted(apart)
    with torch.no_grad(), tracetorch.profile(apart) as after:
        apart(ids)
    first, second = _figures(before), _figures(after)
    assert together == {path: tuple(a + b for a, b in zip(first[path], second[path]))
                        for path in together}
    size = {"to": 2, "half": 2, "double": 8}[convert]
    assert together["0"][3] == 3 * 4 * (F32 + size)  # the embedding's output, once each
    embedding = prof.find("0")
    assert embedding.memory.param_bytes == 10 * 4 * size  # its weight as it is now


def test_a_conversion_that_changes_nothing_measures_nothing_again(torch):
    model, ids = _embedding_model(torch), torch.tensor([[1, 2, 3]])
    with torch.no_grad(), tracetorch.profile(model) as prof:
        model(ids)
        keys = list(prof.find("0").engine.flops_cache)
        model.to(torch.float32)
        model.float()
        model(ids)
        assert list(prof.find("0").engine.flops_cache) == keys


def _model_with_fc(torch):
    # A model whose ``fc`` is replaced: the model's own node keeps its path and its key.
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)

    return Model()


def test_a_replaced_submodule_resizes_its_parent_in_the_block(torch):
    model, x = _model_with_fc(torch), torch.ones(2, 4)
    with tracetorch.profile(model) as prof:
        model(x)
        model.fc = torch.nn.Linear(4, 8)
        model(x)
    assert prof.root.children[""].memory.output_bytes == (2 * 4 + 2 * 8) * F32


def test_a_replaced_submodule_resizes_its_parent_between_openings(torch):
    model, x = _model_with_fc(torch), torch.ones(2, 4)
    prof = tracetorch.profile(model)
    with prof:
        model(x)
    model.fc = torch.nn.Linear(4, 8)
    with prof:
        model(x)
    assert prof.root.children[""].memory.output_bytes == (2 * 4 + 2 * 8) * F32


@pytest.mark.parametrize("grad", [True, False])
def test_a_replaced_submodule_resizes_a_nested_parent_between_openings(torch, grad):
    # The parent's counter is looked up before its call where its counts may be replayed
    # (a layer without a rule): the call itself finds the replaced submodule, which changes
    # the key, so the counter is looked up again after it.
    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = _model_with_fc(torch)

        def forward(self, x):
            return self.model(x) * 2

    outer, x = Outer(), torch.ones(2, 4)
    prof = tracetorch.profile(outer)
    with torch.set_grad_enabled(grad):
        with prof:
            for _ in range(3):  # (its counts learned)
                outer(x)
        outer.model.fc = torch.nn.Linear(4, 8)
        with prof:
            outer(x)
    # three calls returning 2x4 floats, one 2x8 (the last measured for its own key)
    assert prof.find("model").memory.output_bytes == (3 * 2 * 4 + 2 * 8) * F32


def test_the_registration_hooks_leave_with_the_block(torch):
    from torch.nn.modules import module

    layer = torch.nn.Linear(2, 2)
    hooks = (module._global_parameter_registration_hooks, module._global_module_registration_hooks)
    before = [dict(registry) for registry in hooks]
    with tracetorch.profile(layer):
        layer(torch.ones(1, 2))
        assert all(len(registry) == len(seen) + 1 for registry, seen in zip(hooks, before))
    assert [dict(registry) for registry in hooks] == before


# ----------------------------------------------------------------------------- the key itself
def _leaf_reference(value, out):
    """A call key's argument part as its rule says, one value at a time (shape_of, then
    dtype_of; a plain value itself; lists, tuples and dicts as their class and length, then
    their items, a dict's with its keys; for a tensor whose shape cannot be read its sizes as
    its framework reads them (a nested tensor's components'), or ``None``; the class of
    anything else)."""
    from enum import Enum

    from tracetorch.models.tensors import SHAPELESS, dtype_of, irregular_sizes, shape_of

    shape = shape_of(value)
    if type(value) in SHAPELESS or isinstance(value, Enum):
        out.append(value)
    elif shape is not None:
        out += [shape, dtype_of(value)]
    elif isinstance(value, (list, tuple)):
        out.append((type(value), len(value)))
        for item in value:
            _leaf_reference(item, out)
    elif isinstance(value, dict):
        out.append((dict, len(value)))
        for name, item in value.items():
            out.append(name)
            _leaf_reference(item, out)
    elif irregular_sizes(value) is not None:
        out += [irregular_sizes(value), dtype_of(value)]
    else:
        out.append(None if hasattr(type(value), "shape") else type(value))
    return out


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_multi_argument_key_is_each_arguments_shape_and_dtype_in_order(torch):
    # The walk enters None, flags and sizes and plain tensors without the general reads: the
    # same key as those reads give, nested tensors and numpy values included.
    import numpy as np

    from tracetorch.models.tensors import typed_signature

    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])  # .shape raises
    args = (torch.ones(2, 3), None, True, 7, 0.5, "mode", np.float32(2.0), np.zeros((4,)),
            [torch.ones(1, dtype=torch.int64), (None, torch.ones(5, dtype=torch.float16))],
            nested, torch.nn.Parameter(torch.ones(3)))
    kwargs = {"mask": None, "cache": {"k": torch.ones(2, 2)}, "use_cache": False, "n": 3}
    with tracetorch.profile():  # the torch classes registered as a profile registers them
        key = typed_signature(args, kwargs, ("tail",))
    reference: list = []
    for value in args:
        _leaf_reference(value, reference)
    for name, value in kwargs.items():
        reference.append(name)
        _leaf_reference(value, reference)
    assert key == (*reference, "tail")
    # the tensor, None, four plain values, numpy's scalar ... the nested tensor
    assert key[:8] == ((2, 3), torch.float32, None, True, 7, 0.5, "mode", 2.0)
    # (after the list: its class and length, items) its components' shapes
    assert key[key.index((4,)) + 9: key.index((4,)) + 11] == (((2,), (3,)), torch.float32)


def test_each_multi_argument_call_counts_under_call_keys_key(torch):
    # The C wrapper makes the key of a call of plain arguments (tensors, None, flags, numbers,
    # strings) itself and leaves any other to call_key: both must be call_key's, or a call
    # would be counted under a key of its own (measured again, its figures split).
    from tracetorch.engine.hotpath import call_key
    from tracetorch.records.tree import CALLS

    class Mix(torch.nn.Module):
        def forward(self, x, mask=None, scale=1.0, flag=False, name="a", extra=None):
            return x * scale

    layer = Mix()
    calls = [((torch.ones(4, 3), None), {"scale": 2.0, "flag": True, "name": "b"}),
             ((torch.ones(4, 3, dtype=torch.float64),), {"mask": torch.ones(4, dtype=torch.bool)}),
             ((torch.nn.Parameter(torch.ones(5, 3)), None, 3), {}),
             ((torch.ones(4, 3),), {"extra": [torch.ones(1)]})]  # a list: call_key's own walk
    with torch.no_grad(), tracetorch.profile(layer) as prof:
        layer(torch.ones(2, 3))  # the node's first call
        cache = prof.find("").engine.flops_cache
        for args, kwargs in calls:
            for _ in range(3):
                layer(*args, **kwargs)
            assert cache[call_key(args, kwargs, layer)][CALLS] == 3
        assert len(cache) == 1 + len(calls)


# ----------------------------------------------------------------------------- plain arguments
def test_a_rule_reading_a_plain_argument_is_run_for_each_value():
    # Numbers, flags and strings are part of the key as themselves: a rule that reads one (a
    # count of steps, a flag) is run again for each value, never replayed from another's.
    @tracetorch.instrument(flops=lambda n, *, scale=1.0, wide=False, mode="a":
                           int(n * scale) * (2 if wide else 1)
                           * (3 if getattr(mode, "value", mode) == "b" else 1))
    def work(n, *, scale=1.0, wide=False, mode="a"):
        return n

    import enum

    import numpy as np

    class Mode(enum.Enum):
        A = "a"
        B = "b"

    calls = [((1,), {}), ((2,), {}), ((2,), {}), ((2,), {"scale": 2.5}), ((2,), {"wide": True}),
             ((2,), {"mode": "b"}), ((4,), {"scale": 0.5}), ((np.int64(3),), {}),
             ((np.int64(5),), {}), ((2,), {"mode": Mode.B}), ((2,), {"mode": Mode.A})]
    with tracetorch.profile() as prof:
        for args, kwargs in calls:
            work(*args, **kwargs)
    assert prof.nodes()[0].flops == 1 + 2 + 2 + 5 + 4 + 6 + 2 + 3 + 5 + 6 + 2


def test_keyword_names_are_part_of_the_key(torch):
    # f(x, a=1, b=2) and f(x, b=1, a=2) bind differently: two keys, each measured.
    class Weighted(torch.nn.Module):
        def forward(self, x, a=0, b=0):
            return x

    def rule(layer, inputs, output):
        x, a, b = inputs
        return x.numel() * (10 * a + b)

    layer, x = Weighted(), torch.ones(2, 3)
    with torch.no_grad(), tracetorch.profile(layer, flop_rules={Weighted: rule}) as prof:
        layer(x, a=1, b=2)
        layer(x, b=1, a=2)
        layer(x, 3, 4)
    assert prof.find("").flops == 6 * (12 + 21 + 34)


def test_a_nan_argument_keeps_one_key(torch):
    # A NaN is never equal to itself: kept as itself, each call would be a new key (measured
    # again, a counter more).
    class Scaled(torch.nn.Module):
        def forward(self, x, scale):
            return x

    import numpy as np

    layer = Scaled()
    for nan in (float("nan"), np.float32("nan"), np.float64("nan")):  # Python's, numpy's
        with torch.no_grad(), tracetorch.profile(layer) as prof:
            for _ in range(5):
                layer(torch.ones(2), type(nan)("nan"))  # a new object each call
        assert len(prof.find("").engine.flops_cache) == 1 and prof.find("").calls == 5


def count_each_call_under_its_key(torch, layer, calls):
    """Call ``layer`` with each ``(args, kwargs)`` of ``calls``, twice over, in each grad mode
    and training mode, after a first call ``layer(calls[0][0][0])``; check after each call that
    the counter of its key (``call_key``'s) holds the calls made with that key so far. Hands
    back, read before the block closes (which folds them), how many counters the layer has and
    the calls they hold together, and the calls expected of each key."""
    from tracetorch.engine.hotpath import call_key, counter_of
    from tracetorch.records.tree import CALLS

    first = calls[0][0][0]
    expected: dict = {}
    with tracetorch.profile(layer) as prof:
        layer(first)  # the node's first call; its state read once (a read of the tree folds)
        cache = prof.find("").engine.flops_cache
        expected[call_key((first,), {}, layer)] = 0  # (folded by that read)
        for grad in (True, False):
            for training in (True, False):
                layer.train(training)
                with torch.set_grad_enabled(grad):
                    for args, kwargs in calls * 2:
                        layer(*args, **kwargs)
                        key = call_key(args, kwargs, layer)
                        expected[key] = expected.get(key, 0) + 1
                        assert counter_of(cache, key)[CALLS] == expected[key], (args, kwargs)
        return len(cache), sum(counter[CALLS] for counter in cache.values()), expected


def test_a_call_like_the_last_but_for_one_item_counts_under_its_own_key(torch):
    # The C wrapper compares a call of several arguments with the key of the node's last such
    # call before it makes one: every item must be compared (each argument's shape and dtype,
    # plain values, keyword names, how many there are, the grad mode and training flag), and
    # values a dict takes for one key (1, 1.0 and True) must find one counter, as they would.
    from tracetorch.engine.hotpath import structure_generation

    class Pair(torch.nn.Module):
        def forward(self, x, y=None, scale=1, flag=False, extra=None):
            return x

    layer, x = Pair(), torch.ones(2, 3)
    calls = [((x, x), {}), ((x, torch.ones(2, 4)), {}), ((x, x.double()), {}),
             ((x, x), {"scale": 2}), ((x, x), {"scale": 1.0}), ((x, x), {"scale": True}),
             ((x, x), {"flag": True}), ((x,), {"y": x}), ((x, x, 1), {}), ((x, x, 1, False), {}),
             ((x,), {"y": x, "scale": 1}), ((x,), {"scale": 1, "y": x}), ((x, None), {}),
             ((x, x), {}),
             # a key that is the last one's first items: (1, generation, 0) == (True,
             # generation, False), the context of a call with grad on in eval mode
             ((x, None, torch.ones(1, structure_generation(), 0)), {}), ((x, None), {})]
    counters, _, expected = count_each_call_under_its_key(torch, layer, calls)
    assert counters == len(expected)
    assert sum(expected.values()) == 4 * 2 * len(calls)


def test_a_one_tensor_call_like_the_last_but_for_one_item_counts_under_its_own_key(torch):
    # A one-tensor call's first key is kept under its shape alone: a call of that shape whose
    # dtype, grad mode or training flag differs, or of another shape, must find its own
    # counter, between calls of several arguments to the same layer (whose last counter the C
    # wrapper compares in place).
    class Either(torch.nn.Module):
        def forward(self, x, y=None):
            return x

    layer, x = Either(), torch.ones(2, 3)
    calls = [((x,), {}), ((torch.zeros(2, 3),), {}), ((torch.ones(2, 4),), {}), ((x,), {}),
             ((x.double(),), {}), ((x.int(),), {}), ((x,), {}), ((x, x), {}), ((x,), {}),
             ((torch.ones(3, 2),), {}), ((x, None), {}), ((x,), {}),
             ((torch.ones(2, 3, 1),), {}), ((torch.ones(6),), {}), ((x,), {})]
    counters, counted, expected = count_each_call_under_its_key(torch, layer, calls)
    assert counters == len(expected)
    assert counted == 4 * 2 * len(calls)


def test_a_dropped_counter_is_never_counted_into_again(torch):
    # drop_counters forgets the node's last counter with the others: the next call like the
    # last is counted in a counter of the node's cache, not in the one dropped.
    from tracetorch.records.tree import CALLS

    class Pair(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    layer, x = Pair(), torch.ones(2, 3)
    with torch.no_grad(), tracetorch.profile(layer) as prof:
        layer(x, x)
        layer(x, x)
        state = prof.find("").engine
        dropped = next(iter(state.flops_cache.values()))
        state.drop_counters()
        layer(x, x)
        assert [counter[CALLS] for counter in state.flops_cache.values()] == [1]
        assert state.last_counter[0] is not dropped


def test_the_training_flag_is_read_as_getattr_reads_it(torch):
    # The C wrapper reads a module's flag from its __dict__ where its class has nothing of the
    # name: a class with a property of that name, or one answering it from __getattr__, must
    # be read as getattr reads it (each call counted under call_key's key).
    from tracetorch.engine.hotpath import call_key, counter_of
    from tracetorch.records.tree import CALLS

    class Switched(torch.nn.Module):
        mode = True

        @property
        def training(self):
            return type(self).mode

        @training.setter
        def training(self, value):  # (a stale value in the instance's dict, never read)
            self.__dict__["training"] = value

        def forward(self, x):
            return x

    class Answering(torch.nn.Module):
        def __init__(self):
            super().__init__()
            del self.__dict__["training"]

        def __getattr__(self, name):
            return False if name == "training" else super().__getattr__(name)

        def forward(self, x):
            return x

    x = torch.ones(2, 3)
    for layer, modes in ((Switched(), (True, False, False, True)), (Answering(), (False,) * 3)):
        Switched.mode = True
        with torch.no_grad(), tracetorch.profile(layer) as prof:
            layer(x)  # (its state read once: a read of the tree folds)
            cache = prof.find("").engine.flops_cache
            counted: dict = {}
            for mode in modes:
                Switched.mode = mode
                layer(x)
                key = call_key((x,), {}, layer)
                assert key[2][2] is mode
                counted[key] = counted.get(key, 0) + 1
                assert counter_of(cache, key)[CALLS] == counted[key]
