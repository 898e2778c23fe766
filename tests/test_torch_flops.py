"""FLOPs on torch: built-in rules, counted operations, and parity with FlopCounterMode."""
import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from test_torch_models import Attn, Conv1D, GPTBlock, Shared, fcm_counts, resnet18  # noqa: E402
from tracetorch.flops.torch_functions import einsum_flops, matmul_flops  # noqa: E402

nn = torch.nn
F = torch.nn.functional
torch.set_num_threads(2)
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections")


def profiled(model, *args, **kwargs):
    with tracetorch.profile(model, warn_unsupported=False) as prof:
        model(*args, **kwargs)
    return prof


# ------------------------------------------------------------------ rules vs FlopCounterMode
GEMM_LAYERS = [
    (lambda: nn.Linear(5, 7), lambda: (torch.randn(2, 3, 5),)),
    (lambda: nn.Linear(5, 7, bias=False), lambda: (torch.randn(4, 5),)),
    (lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2), lambda: (torch.randn(2, 4, 17),)),
    (lambda: nn.Conv2d(4, 6, 3, stride=2, padding=2, groups=2, dilation=2),
     lambda: (torch.randn(2, 4, 11, 13),)),
    (lambda: nn.Conv2d(3, 5, 3), lambda: (torch.randn(3, 8, 8),)),  # unbatched
    (lambda: nn.Conv3d(2, 4, (3, 2, 1), stride=(1, 2, 1)), lambda: (torch.randn(1, 2, 5, 6, 7),)),
    (lambda: nn.ConvTranspose1d(4, 6, 3, stride=2), lambda: (torch.randn(2, 4, 9),)),
    (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2, padding=1, output_padding=1),
     lambda: (torch.randn(2, 4, 5, 6),)),
    (lambda: nn.ConvTranspose3d(2, 4, 2, stride=2), lambda: (torch.randn(1, 2, 3, 4, 5),)),
    (lambda: nn.MultiheadAttention(16, 4), lambda: (torch.randn(5, 2, 16),) * 3),
    (lambda: nn.MultiheadAttention(16, 4, kdim=8, vdim=12, batch_first=True),
     lambda: (torch.randn(2, 5, 16), torch.randn(2, 7, 8), torch.randn(2, 7, 12))),
    (lambda: nn.GRU(6, 8, batch_first=True), lambda: (torch.randn(3, 5, 6),)),
    (lambda: nn.RNN(6, 8, num_layers=2), lambda: (torch.randn(5, 3, 6),)),
    (lambda: nn.LSTM(6, 8, proj_size=4), lambda: (torch.randn(5, 3, 6),)),
    (lambda: nn.LSTMCell(6, 8), lambda: (torch.randn(3, 6),)),
    (lambda: nn.GRUCell(6, 8), lambda: (torch.randn(3, 6),)),
    (lambda: nn.TransformerEncoderLayer(16, 4, 32, batch_first=True),
     lambda: (torch.randn(2, 5, 16),)),
]


@pytest.mark.parametrize("make, inputs", GEMM_LAYERS)
def test_rule_gemm_part_equals_flop_counter_mode(make, inputs):
    torch.manual_seed(0)
    layer, args = make(), inputs()
    prof = profiled(layer, *args)
    node = prof.find("")
    assert node.flops_source == "rule"
    assert prof.gemm_flops == fcm_counts(lambda: layer(*args))["Global"]
    if not node.children:
        assert node.macs == prof.gemm_flops // 2


def test_linear_and_conv_totals_are_their_products_bias_not_counted():
    lin = nn.Linear(5, 7)
    prof = profiled(lin, torch.randn(2, 3, 5))
    assert (prof.forward_flops, prof.gemm_flops) == (2 * 6 * 5 * 7, 2 * 6 * 5 * 7)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=2, groups=2, dilation=2)
    prof = profiled(conv, torch.randn(2, 4, 11, 13))
    out = 2 * 6 * 6 * 7  # output (2, 6, 6, 7)
    assert prof.gemm_flops == 2 * out * (4 // 2) * 9
    assert prof.forward_flops == prof.gemm_flops


def test_bilinear_rule():
    layer = nn.Bilinear(4, 5, 6)
    prof = profiled(layer, torch.randn(3, 4), torch.randn(3, 5))
    assert prof.gemm_flops == 2 * 3 * 6 * 4 * 5
    assert prof.forward_flops == prof.gemm_flops


def test_recurrent_rules_count_every_layer_and_direction():
    lstm = nn.LSTM(6, 8, num_layers=2, bidirectional=True)
    prof = profiled(lstm, torch.randn(5, 3, 6))
    steps, gates, h = 15, 4, 8
    expected = 2 * steps * 2 * gates * h * (6 + h) + 2 * steps * 2 * gates * h * (2 * h + h)
    assert prof.gemm_flops == expected
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(5, 3, 6), [5, 3, 2])
    gru = nn.GRU(6, 8)
    assert profiled(gru, packed).gemm_flops == 10 * 2 * 3 * 8 * (6 + 8)


@pytest.mark.parametrize("layer, shape, expected", [
    # tracetorch.flops.elementwise's convention, shared with torch's functions and core.
    (nn.BatchNorm2d(3), (2, 3, 4, 4), 96 * 7),              # training: batch statistics
    (nn.BatchNorm2d(3).eval(), (2, 3, 4, 4), 96 * 4),       # running statistics
    (nn.BatchNorm1d(3, affine=False), (2, 3), 6 * 7),
    (nn.LayerNorm(4), (2, 3, 4), 24 * 7),
    (nn.GroupNorm(2, 4), (2, 4, 3), 24 * 7),
    (nn.InstanceNorm2d(3), (2, 3, 4, 4), 96 * 7),
    (nn.ReLU(), (2, 5), 10),
    (nn.GELU(), (2, 5), 10 * 6),
    (nn.SiLU(), (2, 5), 10 * 5),
    (nn.Sigmoid(), (2, 5), 10 * 4),
    (nn.Softmax(dim=-1), (2, 5), 10 * 5),
    (nn.GLU(), (2, 6), 6 * 5),
    (nn.MaxPool2d(3, 2, 1), (1, 2, 8, 8), 2 * 4 * 4 * 9),
    (nn.AvgPool1d(2), (1, 3, 8), 3 * 4 * 2),
    (nn.AdaptiveAvgPool2d((1, 1)), (1, 512, 7, 7), 512 * 49),
    (nn.AdaptiveMaxPool1d(2), (1, 2, 8), 2 * 2 * 4),
    (nn.Upsample(scale_factor=2, mode="nearest"), (1, 2, 3, 3), 0),
    (nn.Upsample(scale_factor=2, mode="bilinear"), (1, 2, 3, 3), 72 * 7),
    (nn.Dropout(0.5), (4, 4), 0),
    (nn.Flatten(), (2, 3, 4), 0),
    (nn.Identity(), (2, 3), 0),
])
def test_elementwise_rules(layer, shape, expected):
    prof = profiled(layer, torch.randn(*shape))
    assert prof.forward_flops == expected
    assert prof.gemm_flops == 0
    assert prof.find("").flops_source == "rule"


def test_embeddings():
    emb = nn.Embedding(10, 4)
    assert profiled(emb, torch.tensor([[1, 2, 3]])).forward_flops == 0
    bag = nn.EmbeddingBag(10, 4, mode="mean")
    prof = profiled(bag, torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2]))
    assert prof.forward_flops == 4 * 4 + 2 * 4


def test_user_rule_overrides_builtin_for_one_profile():
    lin = nn.Linear(3, 3)
    with tracetorch.profile(lin, flop_rules={nn.Linear: lambda m, i, o: 7}) as prof:
        lin(torch.ones(1, 3))
    assert prof.forward_flops == 7
    assert profiled(lin, torch.ones(1, 3)).forward_flops == 2 * 9


# ----------------------------------------------------------------------------- counted operations
def test_shapes_formulas():
    assert matmul_flops((5,), (5,)) == 10
    assert matmul_flops((3, 5), (5,)) == 30
    assert matmul_flops((2, 1, 3, 4), (6, 4, 5)) == 2 * 12 * 3 * 4 * 5
    assert einsum_flops("ij,jk->ik", [(3, 4), (4, 5)]) == 2 * 3 * 4 * 5
    assert einsum_flops("ij,jk", [(3, 4), (4, 5)]) == 2 * 3 * 4 * 5
    assert einsum_flops("...ij,...jk->...ik", [(7, 3, 4), (7, 4, 5)]) == 2 * 7 * 3 * 4 * 5
    assert einsum_flops("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]) == 2 * 24 + 2 * 2 * 4 * 5
    assert einsum_flops("ii->i", [(3, 3)]) == 0


class Functional(nn.Module):
    """Every counted function, called outside any layer with a rule."""

    def forward(self, a, b, img, seq, q):
        c = (torch.matmul(a, b) + (a @ b) + a.matmul(b) + torch.mm(a, b) + a.mm(b)
             + torch.addmm(torch.zeros(4, 6), a, b) + torch.einsum("ik,kj->ij", a, b))
        d = torch.bmm(a[None], b[None]) + torch.baddbmm(torch.zeros(1, 4, 6), a[None], b[None])
        e = F.linear(a, b.t(), torch.zeros(6))
        f = F.conv2d(img, torch.randn(4, 3, 3, 3), torch.zeros(4), padding=1)
        g = F.conv_transpose1d(seq, torch.randn(2, 3, 2), stride=2)
        h = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return c, d, e, f, g, h


def test_every_counted_operation():
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    img, seq, q = torch.randn(1, 3, 6, 6), torch.randn(1, 2, 7), torch.randn(1, 2, 8, 4)
    model = Functional()
    prof = profiled(model, a, b, img, seq, q)
    mm = 2 * 4 * 5 * 6
    gemm = (7 * mm + 2 * mm + mm + 2 * 36 * 3 * 4 * 9 + 2 * 7 * 2 * 3 * 2
            + 2 * 2 * 8 * 8 * (4 + 4))
    assert prof.gemm_flops == gemm  # fused bias / added inputs are not counted in products
    adds = 6 * 4 * 6 + 1 * 4 * 6  # the + between them: one FLOP per element each
    assert prof.forward_flops == gemm + adds
    node = prof.find("")
    assert node.flops_source == "ops"
    without_sdpa = fcm_counts(lambda: model(a, b, img, seq, q))["Global"]
    assert without_sdpa == gemm - 2 * 2 * 8 * 8 * 8  # FlopCounterMode skips CPU flash attention


def test_operations_are_counted_only_inside_the_block():
    a = torch.randn(3, 3)
    torch.matmul(a, a)
    with tracetorch.profile() as prof:
        torch.matmul(a, a)
        a @ a
    assert prof.gemm_flops == 2 * 2 * 27  # top-level operations belong to the root
    assert "__matmul__" not in vars(torch.Tensor)
    assert not hasattr(torch.matmul, "_tracetorch_original")


def test_attn_functional_attention():
    prof = profiled(Attn(), torch.randn(1, 64, 32))
    assert prof.gemm_flops == 524_288
    assert prof.find("").flops_source == "ops"


def test_linear_rule_is_not_doubled_by_f_linear():
    lin = nn.Linear(10, 20)
    prof = profiled(nn.Sequential(lin), torch.randn(3, 10))
    assert prof.gemm_flops == 2 * 3 * 10 * 20
    assert prof.forward_flops == 2 * 3 * 10 * 20


def test_gpt2_conv1d_without_a_rule_is_counted_from_addmm():
    layer = Conv1D(12, 4)
    with tracetorch.profile(layer) as prof:
        layer(torch.randn(2, 3, 4))
    assert prof.gemm_flops == 2 * 6 * 4 * 12
    assert prof.forward_flops == 2 * 6 * 4 * 12  # the fused bias of addmm is not counted
    assert prof.find("").flops_source == "ops"
    assert prof.unsupported == {}


def test_shared_model():
    prof = profiled(Shared(), torch.randn(1, 100))
    assert prof.forward_flops == 60_000


# ----------------------------------------------------------------------------- model parity
def test_resnet18_forward_parity():
    model = resnet18().eval()
    assert tracetorch.count_parameters(model) == 11_689_512
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        prof = profiled(model, x)
    assert prof.gemm_flops == 3_628_146_688
    assert prof.find("").subtree_gemm_flops == 3_628_146_688
    assert prof.find("fc").macs == 512_000
    # + BatchNorm 4/element, ReLU 1/element, max-pool 9/output, average pool 1/input element,
    # and each block's residual add, 1/element: 2 x (64·56² + 128·28² + 256·14² + 512·7²)
    residual = 2 * (64 * 56 * 56 + 128 * 28 * 28 + 256 * 14 * 14 + 512 * 7 * 7)
    assert residual == 752_640
    assert prof.forward_flops == 3_642_221_056 + residual
    assert prof.unsupported == {}


def _assert_modules_agree(prof, fcm, prefix, minimum):
    compared = 0
    for node in prof.nodes():
        key = prefix + ("." + node.path if node.path else "")
        if key in fcm:
            assert node.subtree_gemm_flops == fcm[key], key
            compared += 1
    assert compared >= minimum


def test_transformer_encoder_layer_per_module():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)  # training: math attention
    x = torch.randn(2, 10, 32)
    prof = profiled(layer, x)
    fcm = fcm_counts(lambda: layer(x))
    assert prof.gemm_flops == fcm["Global"] == 353_280
    _assert_modules_agree(prof, fcm, "TransformerEncoderLayer", 4)
    layer.eval()
    with torch.no_grad():  # the fused fast path runs no children: the rule covers it
        fast = profiled(layer, x)
    assert [n.path for n in fast.nodes()] == [""]
    assert fast.gemm_flops == 353_280


def test_gpt_block_per_module():
    torch.manual_seed(0)
    block = GPTBlock(dim=32, heads=4)
    x = torch.randn(2, 16, 32)
    prof = profiled(block, x)
    fcm = fcm_counts(lambda: block(x))
    assert prof.gemm_flops == fcm["Global"]
    _assert_modules_agree(prof, fcm, "GPTBlock", 6)
    assert prof.find("attn").gemm_flops == 2 * 2 * 2 * 4 * 16 * 16 * 8  # its own q·kᵀ and ·v
    sdpa = GPTBlock(dim=32, heads=4, sdpa=True)
    sdpa.load_state_dict(block.state_dict())
    assert profiled(sdpa, x).gemm_flops == prof.gemm_flops


def test_a_built_in_rule_that_cannot_read_a_call_leaves_it_unknown_and_the_model_running():
    # An error in tracetorch's own rule (as its Transformer rule had on a nested batch) is
    # tracetorch's: the call's FLOPs are unknown, the model runs on. A user's rule's is theirs.
    import warnings

    from tracetorch.flops.registry import default_registry

    class Doubling(nn.Module):
        def forward(self, x):
            return x * 2

    def unreadable(layer, inputs, output):
        raise ValueError("no sizes to read")

    default_registry.register(Doubling, builtin=True)(unreadable)
    model = nn.Sequential(nn.Linear(4, 4), Doubling())
    x = torch.ones(2, 4)
    with pytest.warns(UserWarning, match=r"rule for Doubling could not read a call "
                                         r"\(ValueError\('no sizes to read'\)\)"):
        with tracetorch.profile(model) as prof:
            out = model(x)
    assert torch.equal(out, model(x))
    assert prof.find("1").flops_unknown and prof.completeness == "partial"
    assert prof.find("0").flops == 2 * 2 * 4 * 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (warned once per process)
        assert tracetorch.count_flops(model, x) == 2 * 2 * 4 * 4

    def users(layer, inputs, output):
        raise ValueError("the user's rule")

    with pytest.raises(ValueError, match="the user's rule"):
        with tracetorch.profile(model, flop_rules={Doubling: users}):
            model(x)
