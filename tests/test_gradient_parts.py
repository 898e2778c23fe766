"""Gradient parts (tracetorch.flops.gradients) against FlopCounterMode's backward FLOPs.

For every layer type and counted function, several shapes and requires-grad patterns (each
tensor alone, all but each one, all, none): the parts whose needs include a tensor that requires
a gradient add up to what FlopCounterMode counts in ``out.sum().backward()``. Where it is wrong
or blind, against the closed form or the products the profiler saw: a grouped convolution's
weight gradient (counted ``groups`` times over), bilinear (``_trilinear`` hides its products),
attention (CPU's flash kernel is not counted; the fused kernels recompute the scores).
"""
import math
import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count  # noqa: E402

from tracetorch.flops.gradients import (  # noqa: E402
    einsum_contractions,
    function_gradient_parts,
    layer_gradient_parts,
)
from tracetorch.flops.torch_functions import torch_function_formulas  # noqa: E402
from tracetorch.models.introspect import bound_inputs  # noqa: E402

nn = torch.nn
F = torch.nn.functional
torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections", "ignore:TF32")


# ----------------------------------------------------------------------------- helpers
def _loss(out):
    out = out[0] if isinstance(out, tuple) else out  # (output, hidden state), (output, weights)
    return (out.data if isinstance(out, nn.utils.rnn.PackedSequence) else out).sum()


def fcm_backward(run, *args, mapping=None, **kwargs):
    """FlopCounterMode's FLOPs for ``run(*args, **kwargs).sum().backward()`` minus those of the
    call (``mapping``: its ``custom_mapping``)."""
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        loss = _loss(run(*args, **kwargs))
        forward = counter.get_total_flops()
        loss.backward()
        return counter.get_total_flops() - forward


def cpu_attention_formulas():
    """FlopCounterMode's own sdpa formulas, registered for the CPU flash kernels it lacks."""
    from torch.utils import flop_counter
    aten = torch.ops.aten
    return {aten._scaled_dot_product_flash_attention_for_cpu: flop_counter.sdpa_flop.__wrapped__,
            aten._scaled_dot_product_flash_attention_for_cpu_backward:
                flop_counter.sdpa_backward_flop.__wrapped__}


def profiled_backward(run, *args, **kwargs):
    """FLOPs of the mm/bmm products a backward pass runs, from the profiler's record of shapes:
    for kernels that do their products inside (``_trilinear``), which FlopCounterMode cannot see."""
    loss = _loss(run(*args, **kwargs))
    with torch.profiler.profile(record_shapes=True) as prof:
        loss.backward()
    flops = 0
    for event in prof.events():
        if event.name in ("aten::mm", "aten::bmm"):
            a, b = event.input_shapes[:2]
            flops += 2 * math.prod(a) * b[-1]
    return flops


def _needs_grad(value):
    if isinstance(value, nn.utils.rnn.PackedSequence):
        value = value.data
    if isinstance(value, (tuple, list)):
        return any(_needs_grad(v) for v in value)
    return isinstance(value, torch.Tensor) and value.requires_grad


def _lookup(need, args, names):
    if isinstance(need, int):
        return args[need] if need < len(args) else None
    return names.get(need)


def charged(parts, args, names):
    """FLOPs of the parts a pass does: those with a needed tensor that requires a gradient. A need
    is a position in ``args`` or a key of ``names`` (parameters, or keyword arguments)."""
    return sum(flops for flops, needs in parts
               if any(_needs_grad(_lookup(n, args, names)) for n in needs))


def patterns(keys):
    """Requires-grad patterns over ``keys``: all, none, each alone, all but each."""
    keys = list(keys)
    found = [set(keys), set()] + [{k} for k in keys] + [set(keys) - {k} for k in keys]
    return [p for i, p in enumerate(found) if p not in found[:i]]


def with_grad(value, needed):
    if isinstance(value, nn.utils.rnn.PackedSequence):
        return value._replace(data=value.data.detach().requires_grad_(needed))
    if isinstance(value, (tuple, list)):
        return type(value)(with_grad(v, needed) for v in value)
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(needed and value.is_floating_point())
    return value


# ----------------------------------------------------------------------------- layers
def _packed():
    seqs = [torch.randn(n, 6) for n in (3, 2, 1)]
    return nn.utils.rnn.pack_sequence(seqs)


LAYERS = {
    "linear": (lambda: nn.Linear(5, 7), lambda: (torch.randn(2, 3, 5),)),
    "linear-1d-nobias": (lambda: nn.Linear(5, 7, bias=False), lambda: (torch.randn(5),)),
    "bilinear": (lambda: nn.Bilinear(3, 4, 5), lambda: (torch.randn(6, 3), torch.randn(6, 4))),
    "bilinear-3d": (lambda: nn.Bilinear(3, 4, 2),
                    lambda: (torch.randn(2, 3, 3), torch.randn(2, 3, 4))),
    "conv1d": (lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2),
               lambda: (torch.randn(2, 4, 17),)),
    "conv2d-unbatched-circular": (lambda: nn.Conv2d(3, 5, 3, padding=1, padding_mode="circular"),
                                  lambda: (torch.randn(3, 8, 8),)),
    "conv3d": (lambda: nn.Conv3d(2, 4, (3, 2, 1), stride=(1, 2, 1)),
               lambda: (torch.randn(1, 2, 5, 6, 7),)),
    "conv_transpose1d": (lambda: nn.ConvTranspose1d(4, 6, 3, stride=2),
                         lambda: (torch.randn(2, 4, 9),)),
    "conv_transpose3d": (lambda: nn.ConvTranspose3d(2, 4, 2, stride=2, bias=False),
                         lambda: (torch.randn(1, 2, 3, 4, 5),)),
    "mha-self": (lambda: nn.MultiheadAttention(16, 4), "self"),
    "mha-kv-dims": (lambda: nn.MultiheadAttention(16, 4, kdim=8, vdim=12, batch_first=True),
                    lambda: (torch.randn(2, 5, 16), torch.randn(2, 7, 8), torch.randn(2, 7, 12))),
    "mha-bias-kv-zero-attn": (lambda: nn.MultiheadAttention(8, 2, add_bias_kv=True,
                                                            add_zero_attn=True),
                              lambda: (torch.randn(3, 2, 8), torch.randn(4, 2, 8),
                                       torch.randn(4, 2, 8))),
    "mha-encoder-decoder": (lambda: nn.MultiheadAttention(8, 2), "kv"),
    "mha-unbatched": (lambda: nn.MultiheadAttention(8, 2, bias=False),
                      lambda: (torch.randn(3, 8), torch.randn(5, 8), torch.randn(5, 8))),
    "encoder": (lambda: nn.TransformerEncoderLayer(16, 4, 32, batch_first=True),
                lambda: (torch.randn(2, 5, 16),)),
    "encoder-norm-first": (lambda: nn.TransformerEncoderLayer(8, 2, 12, norm_first=True),
                           lambda: (torch.randn(4, 2, 8),)),
    "rnn": (lambda: nn.RNN(6, 8, num_layers=2),
            lambda: (torch.randn(5, 3, 6), torch.randn(2, 3, 8))),
    "rnn-relu-unbatched": (lambda: nn.RNN(6, 8, nonlinearity="relu", bias=False),
                           lambda: (torch.randn(4, 6),)),
    "gru-bidirectional": (lambda: nn.GRU(6, 8, batch_first=True, bidirectional=True),
                          lambda: (torch.randn(2, 3, 6),)),
    "lstm": (lambda: nn.LSTM(6, 8), lambda: (torch.randn(4, 3, 6),)),
    "lstm-proj-2-layers-bidirectional-nobias": (
        lambda: nn.LSTM(6, 8, num_layers=2, proj_size=4, bidirectional=True, bias=False),
        lambda: (torch.randn(2, 3, 6), (torch.randn(4, 3, 4), torch.randn(4, 3, 8)))),
    "lstm-packed-bidirectional": (lambda: nn.LSTM(6, 4, bidirectional=True),
                                  lambda: (_packed(),)),
    "gru-packed-hx": (lambda: nn.GRU(6, 4), lambda: (_packed(), torch.randn(1, 3, 4))),
    "lstm-cell": (lambda: nn.LSTMCell(6, 8),
                  lambda: (torch.randn(3, 6), (torch.randn(3, 8), torch.randn(3, 8)))),
    "gru-cell": (lambda: nn.GRUCell(6, 8), lambda: (torch.randn(3, 6),)),
    "rnn-cell-unbatched": (lambda: nn.RNNCell(6, 8), lambda: (torch.randn(6), torch.randn(8))),
}


def _layer_inputs(spec):
    if spec == "self":
        x = torch.randn(5, 2, 16)
        return (x, x, x)
    if spec == "kv":
        memory = torch.randn(6, 2, 8)
        return (torch.randn(3, 2, 8), memory, memory)
    return spec()


def _with_grads(inputs, needed):
    """``inputs`` with fresh leaves; one tensor passed several times stays one tensor."""
    fresh = {}
    out = []
    for i, value in enumerate(inputs):
        if isinstance(value, torch.Tensor) and id(value) in fresh:
            out.append(fresh[id(value)])
            continue
        out.append(with_grad(value, i in needed))
        fresh[id(value)] = out[-1]
    return tuple(out)


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_parts_charged_as_flop_counter_mode(name):
    torch.manual_seed(0)
    make, spec = LAYERS[name]
    layer, base = make(), _layer_inputs(spec)
    positions = [i for i, v in enumerate(base)  # a tensor passed again is the same tensor
                 if isinstance(v, (torch.Tensor, tuple)) and all(v is not u for u in base[:i])]
    params = [n for n, _ in layer.named_parameters()]
    # LSTMs run fused oneDNN kernels on CPU, which FlopCounterMode does not see; ATen's own
    # products are what the formula describes.
    with torch.backends.mkldnn.flags(enabled=False):
        for needed in patterns(positions + params):
            for param_name, param in layer.named_parameters():
                param.requires_grad_(param_name in needed)
            inputs = _with_grads(base, needed)
            parts = layer_gradient_parts(layer, inputs, layer(*inputs))
            expected = charged(parts, inputs, dict(layer.named_parameters()))
            if not any(_needs_grad(t) for t in (*inputs, *layer.parameters())):
                assert expected == 0
                continue
            count = profiled_backward if isinstance(layer, nn.Bilinear) else fcm_backward
            assert expected == count(layer, *inputs), (name, sorted(needed, key=str))


def test_layer_parts_examples():
    x = torch.zeros(6, 5)
    linear = nn.Linear(5, 7)
    assert layer_gradient_parts(linear, (x,), linear(x)) == [(420, (0,)), (420, ("weight",))]
    lstm = nn.LSTM(5, 3)
    seq = torch.zeros(4, 2, 5)
    rows, first = 8, 2
    assert layer_gradient_parts(lstm, (seq,), lstm(seq)) == [
        (2 * rows * 5 * 12, (0,)), (2 * rows * 5 * 12, ("weight_ih_l0",)),
        (2 * rows * 12 * 3, ("weight_hh_l0",)),
        (2 * (rows - first) * 12 * 3, (0, "weight_ih_l0", "bias_ih_l0", "weight_hh_l0",
                                       "bias_hh_l0"))]


class MyLinear(nn.Linear):
    pass


def test_lookup_follows_the_mro_and_skips_layers_without_gemm_gradients():
    x, layer = torch.zeros(2, 4), MyLinear(4, 3)
    assert layer_gradient_parts(layer, (x,), layer(x)) == [(48, (0,)), (48, ("weight",))]
    assert layer_gradient_parts(nn.ReLU(), (x,), x) is None
    assert layer_gradient_parts(nn.LayerNorm(4), (x,), x) is None


# ----------------------------------------------------------------------------- grouped convolutions
GROUPED = [  # closed form: 2·B·C_out·(C_in/groups)·prod(kernel)·prod(output spatial)
    (lambda: nn.Conv2d(4, 6, 3, groups=2, bias=False), (2, 4, 7, 9), 2, 2 * 2 * 6 * 2 * 9 * 5 * 7),
    (lambda: nn.Conv1d(4, 4, 3, groups=4, padding=1), (3, 4, 10), 4, 2 * 3 * 4 * 1 * 3 * 10),
    # transposed: 2·B·prod(input spatial)·C_in·(C_out/groups)·prod(kernel)
    (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), (2, 4, 5, 6), 2,
     2 * 2 * 5 * 6 * 4 * 3 * 9),
]


@pytest.mark.parametrize("make, shape, groups, closed_form", GROUPED)
def test_grouped_convolution_weight_gradient_costs_the_forward(make, shape, groups, closed_form):
    layer, x = make(), torch.randn(shape)
    parts = layer_gradient_parts(layer, (x,), layer(x))
    assert parts == [(closed_form, (0,)), (closed_form, ("weight",))]
    # weight only: FlopCounterMode counts the weight gradient `groups` times over
    assert fcm_backward(layer, x) == groups * closed_form
    # input only: it agrees
    layer.weight.requires_grad_(False)
    x.requires_grad_(True)
    assert fcm_backward(layer, x) == closed_form


# ----------------------------------------------------------------------------- functions
def t(*shape):
    return torch.randn(*shape)


FUNCTIONS = {
    "mm": (torch.mm, lambda: ((t(4, 5), t(5, 6)), {})),
    "mm-kwarg": (torch.mm, lambda: ((t(4, 5),), {"mat2": t(5, 6)})),
    "Tensor.mm": (torch.Tensor.mm, lambda: ((t(3, 5), t(5, 2)), {})),
    "bmm": (torch.bmm, lambda: ((t(2, 4, 5), t(2, 5, 3)), {})),
    "Tensor.bmm": (torch.Tensor.bmm, lambda: ((t(2, 4, 5), t(2, 5, 3)), {})),
    "addmm": (torch.addmm, lambda: ((t(6), t(4, 5), t(5, 6)), {"beta": 0.5})),
    "Tensor.addmm": (torch.Tensor.addmm, lambda: ((t(4, 6), t(4, 5), t(5, 6)), {})),
    "addmm_": (torch.Tensor.addmm_, lambda: ((torch.zeros(4, 6), t(4, 5), t(5, 6)), {})),
    "baddbmm": (torch.baddbmm, lambda: ((t(2, 4, 3), t(2, 4, 5), t(2, 5, 3)), {})),
    "Tensor.baddbmm": (torch.Tensor.baddbmm, lambda: ((t(2, 4, 3), t(2, 4, 5), t(2, 5, 3)), {})),
    "baddbmm_": (torch.Tensor.baddbmm_,
                 lambda: ((torch.zeros(2, 4, 3), t(2, 4, 5), t(2, 5, 3)), {})),
    "matmul": (torch.matmul, lambda: ((t(4, 5), t(5, 6)), {})),
    "matmul-folded": (torch.matmul, lambda: ((t(2, 3, 4, 5), t(5, 6)), {})),
    "matmul-broadcast": (torch.matmul, lambda: ((t(2, 1, 4, 5), t(3, 5, 6)), {})),
    "matmul-vector-matrix": (torch.Tensor.matmul, lambda: ((t(5), t(5, 6)), {})),
    "matmul-matrix-vector": (torch.Tensor.matmul, lambda: ((t(4, 5), t(5)), {})),
    "matmul-dot": (torch.linalg.matmul, lambda: ((t(5), t(5)), {})),
    "matmul-batch-vector": (torch.matmul, lambda: ((t(3, 4, 5), t(5)), {})),
    "matmul-strided-batch-vector": (torch.matmul,
                                    lambda: ((t(4, 3, 5).transpose(0, 1), t(5)), {})),
    "matmul-vector-batch": (torch.matmul, lambda: ((t(5), t(3, 5, 6)), {})),
    "matmul-matrix-batch": (torch.matmul, lambda: ((t(4, 5), t(3, 5, 6)), {})),
    "rmatmul": (torch.Tensor.__rmatmul__, lambda: ((t(3, 5, 6), t(4, 5)), {})),
    "einsum": (torch.einsum, lambda: (("bij,bjk->bik", t(2, 3, 4), t(2, 4, 5)), {})),
    "einsum-list-implicit": (torch.einsum, lambda: (("ij,jk", [t(3, 4), t(4, 5)]), {})),
    "einsum-sum-first": (torch.einsum, lambda: (("ij,jk->i", t(3, 4), t(4, 5)), {})),
    "einsum-elementwise": (torch.einsum, lambda: (("ij,ij->ij", t(3, 4), t(3, 4)), {})),
    "einsum-outer": (torch.einsum, lambda: (("i,j->ij", t(3), t(4)), {})),
    "einsum-three": (torch.einsum, lambda: (("ij,jk,kl->il", t(2, 3), t(3, 4), t(4, 5)), {})),
    "einsum-shared-index": (torch.einsum, lambda: (("bi,bi,bj->j", t(3, 4), t(3, 4), t(3, 2)),
                                                   {})),
    "einsum-ellipsis-broadcast": (torch.einsum,
                                  lambda: (("...ij,...jk->...ik", t(2, 1, 3, 4), t(5, 4, 2)), {})),
    "einsum-diagonal": (torch.einsum, lambda: (("ii,ij->j", t(3, 3), t(3, 4)), {})),
    "einsum-attention": (torch.einsum, lambda: (("bhqd,bhkd->bhqk", t(2, 2, 3, 4), t(2, 2, 5, 4)),
                                                {})),
    "linear": (F.linear, lambda: ((t(2, 3, 5), t(7, 5), t(7)), {})),
    "linear-kwargs": (F.linear, lambda: ((t(5),), {"weight": t(7, 5)})),
    "bilinear": (F.bilinear, lambda: ((t(6, 3), t(6, 4), t(5, 3, 4), t(5)), {})),
    # (the logits it never returns: their product's input and weight gradients)
    "linear_cross_entropy": (F.linear_cross_entropy, lambda: (
        (t(6, 5), t(7, 5)), {"target": torch.tensor([0, 3, 6, 1, 2, 5])})),
    "conv1d": (F.conv1d, lambda: ((t(2, 4, 11), t(6, 4, 3)), {"stride": 2})),
    "conv2d": (F.conv2d, lambda: ((t(1, 3, 8, 8), t(5, 3, 3, 3)), {"padding": 1})),
    "conv3d": (F.conv3d, lambda: ((t(3, 4, 4, 4), t(2, 3, 2, 2, 2)), {})),  # unbatched
    "conv_transpose1d": (F.conv_transpose1d, lambda: ((t(2, 4, 5), t(4, 3, 3)), {"stride": 2})),
    "conv_transpose2d": (F.conv_transpose2d, lambda: ((t(1, 3, 4, 4), t(3, 2, 3, 3)), {})),
    "conv_transpose3d": (F.conv_transpose3d, lambda: ((t(1, 2, 2, 3, 2), t(2, 2, 2, 2, 2)), {})),
    # (L, N, E) queries over S keys; weights packed, then separate q/k/v weights
    "multi_head_attention_forward": (F.multi_head_attention_forward, lambda: (
        (t(4, 2, 8), t(5, 2, 8), t(5, 2, 8), 8, 2, t(24, 8), t(24), None, None, False, 0.0,
         t(8, 8), t(8)), {"training": False})),
    "multi_head_attention_forward-separate": (F.multi_head_attention_forward, lambda: (
        (t(4, 2, 8), t(5, 2, 6), t(5, 2, 5), 8, 2, None, t(24), None, None, False, 0.0,
         t(8, 8), t(8)), {"training": False, "use_separate_proj_weight": True,
                          "q_proj_weight": t(8, 8), "k_proj_weight": t(8, 6),
                          "v_proj_weight": t(8, 5), "need_weights": False})),
    "tensordot": (torch.tensordot, lambda: ((t(3, 4, 5), t(4, 5, 6)), {"dims": 2})),
    "tensordot-pairs": (torch.tensordot,
                        lambda: ((t(3, 4, 5), t(5, 2, 3)), {"dims": ([0, 2], [2, 0])})),
    "inner": (torch.inner, lambda: ((t(3, 4), t(2, 5, 4)), {})),
    "inner-method": (torch.Tensor.inner, lambda: ((t(2, 3, 4), t(5, 4)), {})),
    "multi_dot": (torch.linalg.multi_dot, lambda: (([t(10, 30), t(30, 5), t(5, 60)],), {})),
    "multi_dot-vectors": (torch.linalg.multi_dot, lambda: (([t(7), t(7, 3), t(3, 9), t(9)],), {})),
    "chain_matmul": (torch.chain_matmul, lambda: ((t(4, 30), t(30, 2), t(2, 20)), {})),
}


IN_PLACE = (torch.Tensor.addmm_, torch.Tensor.baddbmm_)


def _tensor_keys(func, args, kwargs):
    # The arguments that can need a gradient (not a tensor written in place, which is no leaf,
    # nor an integer one: a class target)
    keys = [i for i, a in enumerate(args) if (isinstance(a, list) or _real(a))
            and not (i == 0 and func in IN_PLACE)]
    return keys + [k for k, v in kwargs.items() if _real(v)]


def _real(value):
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _run_function(func, needed, args, kwargs):
    args = tuple(with_grad(a, i in needed) for i, a in enumerate(args))
    kwargs = {k: with_grad(v, k in needed) for k, v in kwargs.items()}
    return args, kwargs


def call(func, args, kwargs):
    if func in IN_PLACE:  # each call writes a fresh tensor
        args = (args[0].detach().clone(),) + args[1:]
    return func(*args, **kwargs)


def _function_charged(func, args, kwargs):
    result = call(func, args, kwargs)
    parts = function_gradient_parts(func, args, kwargs, result)
    return charged(parts, args, kwargs)


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_function_parts_charged_as_flop_counter_mode(name):
    torch.manual_seed(0)
    func, make = FUNCTIONS[name]
    base_args, base_kwargs = make()
    for needed in patterns(_tensor_keys(func, base_args, base_kwargs)):
        args, kwargs = _run_function(func, needed, base_args, base_kwargs)
        expected = _function_charged(func, args, kwargs)
        if not needed:
            assert expected == 0
            continue
        if func is F.bilinear:
            assert expected == profiled_backward(call, func, args, kwargs), (name, needed)
        else:  # (attention without its weights runs CPU flash kernels: their formulas given)
            assert expected == fcm_backward(call, func, args, kwargs,
                                            mapping=cpu_attention_formulas()), (name, needed)


def test_every_counted_product_is_tested():
    # (grouped_mm, which FlopCounterMode has no formula for: tests/test_layer_functions.py,
    # the MoE experts run three ways, and tests/test_transformers_models.py)
    # (and the integer and float8 products of quantized inference, which have no gradient:
    # their forward in tests/test_layer_functions.py)
    tested = {func for func, _ in FUNCTIONS.values()} | {
        F.scaled_dot_product_attention, torch._grouped_mm, F.grouped_mm, torch._scaled_grouped_mm,
        torch._scaled_grouped_mm_v2, torch._int_mm, torch._scaled_mm, torch._scaled_mm_v2,
        torch._weight_int8pack_mm, torch._weight_int4pack_mm, torch._weight_int4pack_mm_for_cpu,
        torch._weight_int4pack_mm_with_scales_and_zeros}
    products = {func for func, (_, _, gemm) in torch_function_formulas().items() if gemm}
    assert products <= tested


def test_grouped_conv_function_weight_gradient_costs_the_forward():
    x, w = t(2, 4, 9), t(6, 2, 3).requires_grad_()
    out = F.conv1d(x, w, groups=2)
    forward = 2 * 2 * 6 * 2 * 3 * 7
    assert function_gradient_parts(F.conv1d, (x, w), {"groups": 2}, out) == [
        (forward, (0,)), (forward, (1,))]
    assert fcm_backward(F.conv1d, x, w, groups=2) == 2 * forward


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.lists(st.integers(1, 3),
                                                                      min_size=1, max_size=4),
       st.booleans(), st.booleans())
def test_matmul_parts_for_any_shapes(left, right, grad_left, grad_right):
    # Make the shapes multiply: the contracted sizes agree, batch sizes broadcast.
    right[-2 if len(right) > 1 else -1] = left[-1]
    if len(left) > 2 and len(right) > 2:
        for i in range(3, min(len(left), len(right)) + 1):
            right[-i] = left[-i] if right[-i] != 1 and left[-i] != 1 else right[-i]
    a = t(*left).requires_grad_(grad_left)
    b = t(*right).requires_grad_(grad_right)
    expected = _function_charged(torch.matmul, (a, b), {})
    if not (grad_left or grad_right):
        assert expected == 0
    else:
        assert expected == fcm_backward(torch.matmul, a, b)


def test_einsum_follows_opt_einsums_path(monkeypatch):
    class OptEinsum:
        @staticmethod
        def contract_path(equation, *operands, optimize=None):
            return [(1, 2), (0, 1)], None  # the last two operands first

    backend = torch.backends.opt_einsum
    monkeypatch.setattr(backend, "is_available", lambda: True)
    monkeypatch.setattr(backend, "get_opt_einsum", lambda: OptEinsum)
    ops = (t(2, 30), t(30, 3), t(3, 4))
    assert einsum_contractions("ij,jk,kl->il", [o.shape for o in ops], [1, 2, 0, 1]) == [
        (2 * 30 * 3 * 4, frozenset({1}), frozenset({2})),
        (2 * 2 * 30 * 4, frozenset({0}), frozenset({1, 2}))]
    for needed in patterns([1, 2, 3]):
        args = ("ij,jk,kl->il",) + tuple(o.detach().requires_grad_(i + 1 in needed)
                                         for i, o in enumerate(ops))
        expected = _function_charged(torch.einsum, args, {})
        assert expected == (fcm_backward(torch.einsum, *args) if needed else 0)


def test_calls_without_a_formula():
    a = t(2, 2)
    assert function_gradient_parts(torch.add, (a, a), {}, a + a) is None
    assert function_gradient_parts(torch.einsum, (a, [0, 1], a, [1, 2]), {}, a @ a) is None


# ----------------------------------------------------------------------------- attention
SDPA_SHAPES = [((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4)),
               ((1, 4, 6, 8), (1, 4, 6, 8), (1, 4, 6, 8))]


@pytest.mark.parametrize("shapes", SDPA_SHAPES)
def test_sdpa_parts_are_flop_counter_modes_fused_backward(shapes):
    q, k, v = (t(*s) for s in shapes)
    parts = function_gradient_parts(F.scaled_dot_product_attention, (q, k, v), {}, None)
    grad_out = q.shape[:-1] + v.shape[-1:]
    assert sum(flops for flops, _ in parts) == sdpa_backward_flop_count(grad_out, q.shape, k.shape,
                                                                        v.shape)
    # On CPU the flash kernel runs; FlopCounterMode has no formula for it, so give it its own
    # formulas for the fused kernels: with every input needing a gradient, the same total.
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    assert fcm_backward(F.scaled_dot_product_attention, q, k, v,
                        mapping=cpu_attention_formulas()) == sum(flops for flops, _ in parts)


@pytest.mark.parametrize("needed", [(0,), (1,), (2,), (0, 1), (1, 2)])
def test_a_fused_kernel_computes_every_gradient_once_one_is_needed(needed):
    # Frozen keys and values (cross-attention to a frozen memory): the flash kernel's backward
    # still computes dQ, dK and dV, as FlopCounterMode's formula counts.
    q, k, v = (t(*s).requires_grad_(i in needed) for i, s in enumerate(SDPA_SHAPES[1]))
    parts = function_gradient_parts(F.scaled_dot_product_attention, (q, k, v), {},
                                    F.scaled_dot_product_attention(q, k, v))
    assert charged(parts, (q, k, v), {}) == fcm_backward(
        F.scaled_dot_product_attention, q, k, v, mapping=cpu_attention_formulas()) > 0


@pytest.mark.parametrize("by_keyword", [False, True])
def test_sdpa_parts_match_the_math_kernel(by_keyword):
    # Value head size unlike the query's: CPU runs the math kernel, plain bmm products that keep
    # the attention weights. It does dP, dV, dQ, dK as needed, and no recompute.
    shapes = ((2, 2, 5, 4), (2, 2, 7, 4), (2, 2, 7, 6))
    base = [t(*s) for s in shapes]
    names = ("query", "key", "value")
    for needed in patterns(range(3)):
        q, k, v = (x.detach().requires_grad_(i in needed) for i, x in enumerate(base))
        args, kwargs = ((), dict(zip(names, (q, k, v)))) if by_keyword else ((q, k, v), {})
        result = F.scaled_dot_product_attention(*args, **kwargs)
        parts = function_gradient_parts(F.scaled_dot_product_attention, args, kwargs, result)
        total = charged(parts, args, kwargs)
        if needed:
            assert total == fcm_backward(F.scaled_dot_product_attention, *args, **kwargs)
        else:
            assert total == 0


def test_sdpa_with_a_mask_that_needs_a_gradient_runs_the_math_kernel():
    q, k, v = (t(2, 4, 8, 16).requires_grad_() for _ in range(3))
    mask = t(1, 4, 8, 8).requires_grad_()  # a learned bias (T5's relative positions)
    result = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    parts = function_gradient_parts(F.scaled_dot_product_attention, (q, k, v),
                                    {"attn_mask": mask}, result)
    assert charged(parts, (q, k, v), {"attn_mask": mask}) == fcm_backward(
        F.scaled_dot_product_attention, q, k, v, attn_mask=mask) == 4 * 2 * 2 * 4 * 8 * 8 * 16


# ----------------------------------------------------------------------------- MHA's kernels
def _mha_call(mha, x, memory, options):
    return mha(x, memory, memory, **options)


MHA_CALLS = {  # (dropout, training, keyword arguments): what torch runs on CPU
    "flash": (0.0, True, {"need_weights": False}),
    "flash-eval-with-grad": (0.1, False, {"need_weights": False}),
    "math-dropout": (0.1, True, {"need_weights": False}),
    "bmm-need-weights": (0.0, True, {}),
    "flash-padding-mask": (0.0, True, {"need_weights": False, "key_padding_mask": "padding"}),
    "flash-causal": (0.0, True, {"need_weights": False, "attn_mask": "causal", "is_causal": True}),
    "math-learned-mask": (0.0, True, {"need_weights": False, "attn_mask": "learned"}),
    "bmm-need-weights-padding-mask": (0.0, True, {"key_padding_mask": "padding"}),
}


def _mha_case(name):
    torch.manual_seed(0)
    dropout, training, options = MHA_CALLS[name]
    mha = nn.MultiheadAttention(16, 2, dropout=dropout, batch_first=True).train(training)
    x = torch.randn(2, 6, 16, requires_grad=True)
    masks = {"padding": torch.tensor([[False] * 6, [False] * 4 + [True] * 2]),
             "causal": nn.Transformer.generate_square_subsequent_mask(6),
             "learned": torch.zeros(6, 6, requires_grad=True)}
    return mha, x, {k: masks.get(v, v) if isinstance(v, str) else v for k, v in options.items()}


@pytest.mark.parametrize("name", list(MHA_CALLS))
def test_mha_parts_follow_the_attention_kernel_that_ran(name):
    # The fused kernels (flash on CPU) recompute the scores in backward, as sdpa's parts count
    # them; the math kernel and need_weights' bmm keep the weights.
    mha, x, options = _mha_case(name)
    kernel = name.split("-")[0]
    torch.manual_seed(1)
    result = mha(x, x, x, **options)
    inputs = bound_inputs(mha, (x, x, x), options)
    parts = layer_gradient_parts(mha, inputs, result)
    expected = charged(parts, inputs, dict(mha.named_parameters()))
    torch.manual_seed(1)  # the same dropout
    assert expected == fcm_backward(_mha_call, mha, x, x, options,
                                    mapping=cpu_attention_formulas())
    # 2·N·L·S·E for each of the scores recomputed, dP, dV, dQ, dK; N=2, L=S=6, E=16
    attention = 2 * 2 * 6 * 6 * 16
    projections = 4 * 2 * (2 * 2 * 6 * 16 * 16)  # q, k, v, out: input and weight
    assert expected == projections + (5 if kernel == "flash" else 4) * attention


class _FunctionalAttention(nn.Module):
    """nn.MultiheadAttention's products written with F.scaled_dot_product_attention, as
    transformers' attention layers are."""

    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x, mask=None, causal=False):
        mha, (n, length, e) = self.mha, x.shape
        heads = mha.num_heads
        q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (t.view(n, length, heads, e // heads).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                             dropout_p=mha.dropout if mha.training else 0.0)
        return F.linear(out.transpose(1, 2).reshape(n, length, e), mha.out_proj.weight,
                        mha.out_proj.bias)


@pytest.mark.parametrize("name", ["flash", "math-dropout", "flash-causal", "math-learned-mask"])
def test_mha_and_functional_attention_count_the_same_backward(name):
    import tracetorch

    mha, x, options = _mha_case(name)
    functional = _FunctionalAttention(mha)
    mask = options.get("attn_mask")
    with tracetorch.profile() as module_run:
        mha(x, x, x, **options)[0].sum().backward()
    with tracetorch.profile() as functional_run:
        functional(x, None if options.get("is_causal") else mask,
                   bool(options.get("is_causal"))).sum().backward()
    assert module_run.backward_gemm_flops == functional_run.backward_gemm_flops > 0
