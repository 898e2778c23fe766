"""What a layer's forward does by calling torch itself costs what the layer would: every
``torch.nn`` layer of the sweep (:data:`test_torch_layer_sweep.CASES`) given a ``forward`` of its
own (the class's, assigned on the instance: no rule covers it, its operations are counted) costs
what its rule counts; products of vectors and chains of matrices cost their hand formulas; an
operation with no formula (a fused LSTM, a solver) leaves its layer unknown, never a silent 0;
and a module's forward hooks (pruning's mask, old-style ``weight_norm`` and ``spectral_norm``,
a hook of the user's), which torch runs around its forward in its caller's call, are counted
inside a plain ``nn.Sequential`` and a ruled layer as they are inside any other caller.
"""
from __future__ import annotations

import os
import types
import warnings

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import tracetorch  # noqa: E402
from test_torch_layer_sweep import CASES, _build, _inputs  # noqa: E402

nn = torch.nn
F = torch.nn.functional
pytestmark = pytest.mark.filterwarnings(
    "ignore:LSTM with projections", "ignore:enable_nested_tensor", "ignore:Lazy modules",
    "ignore:nn.Container is deprecated", "ignore:TF32", "ignore:`NLLLoss2d` has been deprecated",
    "ignore:torch.chain_matmul is deprecated")

#: Layers whose own forward runs an operation with no formula: their counted FLOPs are unknown
#: (a lower bound), where the rule of the layer called as itself knows them.
UNCOUNTED = {"RNN", "RNN-relu-batch_first", "LSTM", "LSTM-proj", "GRU", "RNNCell", "LSTMCell",
             "GRUCell"}
#: Layers whose operations count more or less than their rule, and why.
APART = {
    # the rule leaves out the running-statistics counter (num_batches_tracked += 1)
    "BatchNorm1d": 1, "BatchNorm2d": 1, "BatchNorm3d": 1, "SyncBatchNorm": 1,
    # its own autograd Function, whose operations are counted as they run (a sum over a
    # padded window), where the rule costs F.local_response_norm
    "CrossMapLRN2d": 1250 - 1600,
    # F.multi_head_attention_forward costs the layer's products; its softmax (3 per score) and
    # scaling (1 per query element) are the layer rule's alone: 2 sequences, 2 heads, 4
    # queries, 5 keys, width 8
    "MultiheadAttention": -(3 * 2 * 2 * 4 * 5 + 2 * 4 * 8),
    "MultiheadAttention-fused": -(3 * 2 * 2 * 4 * 5 + 2 * 4 * 8),
}


def _own_forward(layer: nn.Module) -> nn.Module:
    layer.forward = types.MethodType(type(layer).forward, layer)
    return layer


def _counted(layer: nn.Module, inputs: tuple) -> tuple[int, str]:
    torch.manual_seed(1)
    with torch.no_grad(), tracetorch.profile(layer) as prof:
        layer(*inputs)
    return prof.forward_flops, prof.completeness


@pytest.mark.parametrize("name", sorted(name for name in CASES if not name.startswith("Lazy")))
def test_a_layer_running_its_own_forward_costs_what_its_rule_counts(name):
    case = CASES[name]
    inputs = _inputs(case)
    by_rule = _counted(_build(case), inputs)
    assert by_rule[1] == "complete"
    by_operations = _counted(_own_forward(_build(case)), inputs)
    if name in UNCOUNTED:
        assert by_operations[1] != "complete"
    else:
        assert by_operations == (by_rule[0] + APART.get(name, 0), "complete")


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


#: Products that are no matrix products (FlopCounterMode counts none of them), with their
#: hand counts: a multiply-add (2) per element of the matrix or vector, a multiply per output
#: element of an outer product.
VECTOR_PRODUCTS = {
    "mv": (lambda: torch.mv(r(3, 4), r(4)), 2 * 12),
    "Tensor.mv": (lambda: r(3, 4).mv(r(4)), 2 * 12),
    "addmv": (lambda: torch.addmv(r(3), r(3, 4), r(4)), 2 * 12),
    "addmv_": (lambda: r(3).addmv_(r(3, 4), r(4)), 2 * 12),
    "dot": (lambda: torch.dot(r(5), r(5)), 2 * 5),
    "vdot": (lambda: torch.vdot(r(5), r(5)), 2 * 5),
    "vecdot": (lambda: torch.linalg.vecdot(r(3, 4), r(3, 4)), 2 * 3 * 4),
    "vecdot-dim": (lambda: torch.linalg.vecdot(r(3, 4), r(3, 4), dim=0), 2 * 4 * 3),
    "outer": (lambda: torch.outer(r(3), r(4)), 12),
    "ger": (lambda: torch.ger(r(3), r(4)), 12),
    "addr": (lambda: torch.addr(r(3, 4), r(3), r(4)), 12),
    "kron": (lambda: torch.kron(r(2, 3), r(4, 5)), 120),
    "addbmm": (lambda: torch.addbmm(r(3, 5), r(2, 3, 4), r(2, 4, 5)), 2 * 2 * 3 * 4 * 5),
    # per pair of points and coordinate a difference, a power, an add; a root per pair
    "cdist": (lambda: torch.cdist(r(2, 5, 3), r(2, 6, 3)), 2 * 5 * 6 * (3 * 3 + 1)),
    "complex-mv": (lambda: torch.mv(r(3, 4).to(torch.complex64), r(4).to(torch.complex64)),
                   4 * 2 * 12),
}
#: Matrix products torch runs as mm/bmm, which FlopCounterMode counts.
MATRIX_PRODUCTS = {
    "tensordot": lambda: torch.tensordot(r(3, 4, 5), r(4, 5, 6), 2),
    "tensordot-pairs": lambda: torch.tensordot(r(3, 4, 5), r(5, 2, 3), ([0, 2], [2, 0])),
    "inner": lambda: torch.inner(r(3, 4), r(2, 5, 4)),
    "multi_dot": lambda: torch.linalg.multi_dot([r(10, 30), r(30, 5), r(5, 60)]),
    "multi_dot-vectors": lambda: torch.linalg.multi_dot([r(7), r(7, 3), r(3, 9), r(9)]),
    "chain_matmul": lambda: torch.chain_matmul(r(4, 30), r(30, 2), r(2, 20)),
}


@pytest.mark.parametrize("name", VECTOR_PRODUCTS)
def test_a_product_of_vectors_costs_its_hand_count(name):
    call, expected = VECTOR_PRODUCTS[name]
    with tracetorch.profile() as prof:
        call()
    assert (prof.forward_flops, prof.forward_gemm_flops) == (expected, 0)


@pytest.mark.parametrize("name", MATRIX_PRODUCTS)
def test_a_matrix_product_costs_what_flop_counter_mode_counts(name):
    call = MATRIX_PRODUCTS[name]
    torch.manual_seed(0)
    with FlopCounterMode(display=False) as reference:
        call()
    torch.manual_seed(0)
    with tracetorch.profile() as prof:
        call()
    assert prof.forward_gemm_flops == prof.forward_flops == reference.get_total_flops() > 0


def test_a_chain_is_multiplied_in_its_cheapest_order():
    # (AB)C costs 2·(10·100·5 + 10·5·50) = 15,000; A(BC) would cost 2·(100·5·50 + 10·100·50)
    a, b, c = r(10, 100), r(100, 5), r(5, 50)
    with tracetorch.profile() as prof:
        torch.linalg.multi_dot([a, b, c])
    assert prof.forward_flops == 15_000


class Solver(nn.Module):
    """A layer whose forward solves a linear system: arithmetic no formula counts."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.T @ x + torch.eye(4)
        return self.fc(torch.linalg.solve(a, x.T).T)


def test_an_operation_with_no_formula_leaves_its_layer_unknown_and_its_callers_partial(tmp_path):
    model = nn.Sequential(Solver(), nn.ReLU())
    with pytest.warns(UserWarning, match="Solver runs linalg_solve, which tracetorch has no"):
        tracetorch.count_flops(model, r(6, 4))  # (warned once per layer type and process)
    with tracetorch.profile(model) as prof:
        model(r(6, 4))
    assert prof.unsupported == {"Solver": 1}
    saved = tmp_path / "solver.json"
    prof.save(saved)
    assert tracetorch.load(saved).find("0").completeness == "unknown"
    solver = prof.find("0")
    assert solver.completeness == "unknown" and "linalg_solve" in solver.ops
    assert prof.find("0.fc").completeness == "complete"
    assert prof.completeness == "partial"
    assert "?" in prof.table()


ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "F.gelu": F.gelu, "nn.GELU": nn.GELU(),
               "nn.SiLU": nn.SiLU(), "F.silu": F.silu,
               "users-silu": lambda x: x * torch.sigmoid(x)}


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_an_encoder_layer_costs_its_activation_whatever_it_is(activation, training):
    # relu 47,500 (see test_torch_layer_sweep); per hidden element (2·5 tokens x 32) gelu 6,
    # silu 5 (x·sigmoid(x): 4 + 1) where relu costs 1
    x = r(2, 5, 16)
    expected = 47_500 + 2 * 5 * 32 * {"relu": 0, "gelu": 5, "F.gelu": 5, "nn.GELU": 5}.get(
        activation, 4)

    def layer() -> nn.Module:
        torch.manual_seed(0)
        return nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True,
                                          activation=ACTIVATIONS[activation]).train(training)

    assert _counted(layer(), (x,)) == _counted(_own_forward(layer()), (x,)) == (
        expected, "complete")


@pytest.mark.parametrize("implementation", ["eager", "grouped_mm", "batched_mm"])
def test_mixture_of_experts_costs_its_routed_products_however_its_experts_run(implementation):
    # transformers runs Mixtral's experts as a loop of F.linear over the tokens routed to each,
    # one grouped_mm per projection, or one bmm per projection over the routed copies: 12
    # tokens, 2 experts each, gate_up 32 -> 2·64 and down 64 -> 32, backward twice that.
    transformers = pytest.importorskip("transformers") if os.environ.get("CI") != "true" else (
        __import__("transformers"))
    config = transformers.MixtralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, num_local_experts=4, num_experts_per_tok=2)
    config._experts_implementation = implementation
    torch.manual_seed(0)
    model = transformers.MixtralModel(config)
    ids = torch.randint(100, (1, 12), generator=torch.Generator().manual_seed(1))
    with tracetorch.profile(model) as prof:
        model(input_ids=ids).last_hidden_state.sum().backward()
    experts = prof.find("layers.0.mlp.experts")
    routed = 12 * 2
    forward = 2 * routed * 32 * 128 + 2 * routed * 64 * 32
    assert (experts.gemm_flops, experts.backward_gemm_flops) == (forward, 2 * forward)
    assert prof.completeness == "complete"


@torch.library.custom_op("tracetorch_tests::outer_sum", mutates_args=())
def _library_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b.T


class LibraryOperator(nn.Module):
    """A layer calling an operator a library registered (torch.library, a C++ extension)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tracetorch_tests.outer_sum(x, x).relu() + torch.ops.aten.mul(x, 2).sum()


def test_a_library_operator_leaves_its_layer_unknown_in_every_profile():
    layer = LibraryOperator()
    for _ in range(2):  # (the second profile finds the operator classified already)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with tracetorch.profile(layer) as prof:
                layer(r(3, 4))
        assert prof.completeness == "unknown" and prof.unsupported == {"LibraryOperator": 1}
        assert set(prof.find("").ops) >= {"outer_sum", "relu", "mul", "add"}


def _int8(*shape: int) -> torch.Tensor:
    return torch.randint(-8, 8, shape, dtype=torch.int8)


#: The products of quantized inference (torchao, gpt-fast), as the float product of the same
#: shapes: 2·M·K·N.
QUANTIZED_PRODUCTS = {
    "_int_mm": (lambda: torch._int_mm(_int8(32, 64), _int8(64, 16)), 2 * 32 * 64 * 16),
    "_weight_int8pack_mm": (lambda: torch._weight_int8pack_mm(r(4, 64), _int8(16, 64), r(16)),
                            2 * 4 * 64 * 16),
    "_scaled_mm": (lambda: torch._scaled_mm(
        r(32, 64).to(torch.float8_e4m3fn), r(16, 64).to(torch.float8_e4m3fn).T,
        torch.tensor(1.0), torch.tensor(1.0), out_dtype=torch.float32), 2 * 32 * 64 * 16),
}


@pytest.mark.parametrize("name", QUANTIZED_PRODUCTS)
def test_a_quantized_product_costs_the_float_products_flops(name):
    call, expected = QUANTIZED_PRODUCTS[name]
    with tracetorch.profile() as prof:
        call()
    assert prof.forward_gemm_flops == prof.forward_flops == expected


def test_a_sparse_product_leaves_its_layer_unknown():
    class Sparse(nn.Module):
        def forward(self, x):
            return torch.sparse.mm(x.to_sparse(), x.T)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracetorch.profile(Sparse()) as prof:
            Sparse()(r(3, 4))
    assert prof.completeness == "unknown"


def _flops(call) -> int:
    with tracetorch.profile() as prof:
        call()
    return prof.forward_flops


ALIASES = {"multiply": "mul", "divide": "div", "subtract": "sub", "absolute": "abs",
           "negative": "neg", "fix": "trunc", "arctan2": "atan2", "arcsin": "asin",
           "arctanh": "atanh"}


@pytest.mark.parametrize("alias", ALIASES)
def test_an_alias_costs_what_its_function_costs(alias):
    a, b = r(3, 4).clamp(-0.5, 0.5), r(3, 4).clamp(-0.5, 0.5)
    two = alias in ("multiply", "divide", "subtract", "arctan2")

    def run(name):
        return _flops(lambda: getattr(torch, name)(*((a, b) if two else (a,))))

    assert run(alias) == run(ALIASES[alias]) > 0


#: Functions returning values and indices, each against one returning its values alone.
WITH_INDICES = {
    "max-dim": (lambda x: torch.max(x, 1), lambda x: torch.amax(x, 1)),
    "min-dim": (lambda x: x.min(dim=0), lambda x: x.amin(dim=0)),
    "cummax": (lambda x: x.cummax(0), lambda x: x.cumsum(0)),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2, return_indices=True), lambda x: F.max_pool2d(x, 2)),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, 3, return_indices=True),
                            lambda x: F.adaptive_max_pool2d(x, 3)),
    "var_mean": (lambda x: torch.var_mean(x), lambda x: torch.var(x)),
}


@pytest.mark.parametrize("name", WITH_INDICES)
def test_a_function_returning_values_and_indices_costs_its_values(name):
    with_indices, alone = WITH_INDICES[name]
    x = r(2, 3, 6, 6)
    assert _flops(lambda: with_indices(x)) == _flops(lambda: alone(x)) > 0


ATTENTION_LAYERS = {"plain": {}, "kdim-vdim": {"kdim": 6, "vdim": 5},
                    "batch_first": {"batch_first": True}, "no-bias": {"bias": False},
                    "bias_kv": {"add_bias_kv": True}, "dropout": {"dropout": 0.5}}


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("settings", ATTENTION_LAYERS)
def test_attention_through_its_function_costs_the_layers_products_forward_and_backward(
        settings, need_weights):
    # A forward of its own runs F.multi_head_attention_forward, counted by its formula and its
    # gradient parts; the layer under its rule is the reference (and FlopCounterMode's: see
    # test_torch_layer_sweep).
    options = ATTENTION_LAYERS[settings]
    figures = []
    for own in (False, True):
        torch.manual_seed(0)
        layer = nn.MultiheadAttention(8, 2, **options)
        if own:
            _own_forward(layer)
        rows = (2, 3) if options.get("batch_first") else (3, 2)
        query = torch.randn(*rows, 8, requires_grad=True)
        key, value = torch.randn(*rows, options.get("kdim", 8)), torch.randn(
            *rows, options.get("vdim", 8))
        with tracetorch.profile(layer) as prof:
            layer(query, key, value, need_weights=need_weights)[0].sum().backward()
        figures.append((prof.forward_gemm_flops, prof.backward_gemm_flops, prof.completeness))
    assert figures[0] == figures[1] and figures[0][1] > 0
