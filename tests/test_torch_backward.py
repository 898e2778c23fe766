"""Backward FLOPs and times per layer, measured from the autograd graph."""
import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from test_gradient_parts import cpu_attention_formulas  # noqa: E402
from test_torch_models import GPTBlock, Shared, fcm_counts, resnet18  # noqa: E402

nn = torch.nn
F = torch.nn.functional
torch.set_num_threads(2)


def fwd_bwd(model, x):
    def run():
        model(x).sum().backward()
    return run


def test_resnet18_forward_and_backward_match_flop_counter_mode_per_module():
    torch.manual_seed(0)
    model = resnet18()
    x = torch.randn(1, 3, 224, 224)
    fcm = fcm_counts(fwd_bwd(model, x))
    with tracetorch.profile(model) as prof:
        model(x).sum().backward()
    assert fcm["Global"] == 10_648_412_160
    assert prof.gemm_flops == 10_648_412_160
    assert prof.backward_flops == 10_648_412_160 - 3_628_146_688
    compared = 0
    for node in prof.nodes():
        key = "ResNet" + ("." + node.path if node.path else "")
        if key in fcm:
            ours = node.subtree_gemm_flops + node.subtree_backward_flops
            if ".downsample" in key:
                # FlopCounterMode's module tracker also charges the main branch's conv2
                # backward to the downsample branch running beside it (its per-module rows
                # overlap; its total does not): ours is the downsample convolution alone.
                conv2 = prof.find(node.path.split(".downsample")[0] + ".conv2")
                assert fcm[key] - ours == conv2.gemm_flops + conv2.backward_flops
                assert ours == 3 * node.subtree_gemm_flops
            else:
                assert ours == fcm[key], key
            compared += 1
    assert compared == 1 + 4 + 8 + 3 * 2 + 2 * 8 + 1 + 1  # every layer with a product
    # The first convolution's input needs no gradient: only its weight gradient is computed.
    assert prof.find("conv1").backward_flops == prof.find("conv1").gemm_flops
    assert prof.find("layer1.0.conv1").backward_flops == 2 * prof.find("layer1.0.conv1").gemm_flops
    # Every layer gets one backward sample, beside its forward time, in the tree.
    for path in ("conv1", "bn1", "relu", "maxpool", "layer1.0.conv1", "layer4.1.bn2", "fc"):
        node = prof.find(path)
        assert node.backward_time.count == 1 and node.backward_time.total_ns > 0, path
    assert torch._C._len_torch_dispatch_stack() == 0


def test_input_requiring_grad_gives_three_times_forward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5))
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with tracetorch.profile(model) as prof:
        model(x).sum().backward()
    assert prof.backward_flops == 2 * prof.forward_gemm_flops
    assert prof.gemm_flops == fcm_counts(fwd_bwd(model, x))["Global"]


def test_gpt_block_backward_per_module():
    torch.manual_seed(0)
    block = GPTBlock(dim=32, heads=4)
    x = torch.randn(2, 16, 32)
    fcm = fcm_counts(fwd_bwd(block, x))
    with tracetorch.profile(block) as prof:
        block(x).sum().backward()
    assert prof.gemm_flops == fcm["Global"]
    for path in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.out", "attn", "mlp"):
        node = prof.find(path)
        assert node.subtree_gemm_flops + node.subtree_backward_flops == fcm["GPTBlock." + path]
    attn = prof.find("attn")
    assert attn.backward_flops == 2 * attn.gemm_flops  # q·kᵀ and ·v, both inputs need grads


def test_shared_linear_backward_per_call_site():
    model = Shared()
    x = torch.randn(1, 100)
    with tracetorch.profile(model) as prof:
        model(x).sum().backward()
    sites = [prof.find(p) for p in ("a.lin", "b.lin", "c.lin")]
    # a.lin's input needs no gradient; b and c also compute their input's gradient.
    assert [s.backward_flops for s in sites] == [20_000, 40_000, 40_000]
    row = [r for r in prof.by_module().values() if r.type_name == "Linear"][0]
    assert row.backward_flops == 100_000


def test_loss_maths_outside_layers_lands_on_the_backward_node():
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4)
    with tracetorch.profile() as prof:
        out = lin(x)
        loss = (out @ torch.ones(4, 4, requires_grad=True)).sum()  # a product outside layers
        loss.backward()
    back = prof.find("backward")
    assert back.calls == 1
    assert back.backward_flops == 2 * (2 * 3 * 4 * 4)  # both gradients of the root-level product
    assert prof.find("").backward_flops == 2 * 4 * 3 * 4


def test_autograd_grad_and_direct_backward_are_counted():
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    with tracetorch.profile() as prof:
        (grad,) = torch.autograd.grad(lin(x).sum(), x)
        torch.autograd.backward(lin(x).sum())
    assert grad.shape == x.shape
    node = prof.find("")
    assert node.calls == 2
    assert node.backward_flops == 2 * 3 * 4 * 4 + 2 * (2 * 3 * 4 * 4)
    assert node.backward_time.count == 2


def test_graph_outliving_the_block_and_forward_before_it():
    lin = nn.Linear(4, 4)
    with tracetorch.profile() as prof:
        loss = lin(torch.randn(2, 4)).sum()
    loss.backward()  # after the block: nothing recorded, nothing fails
    assert prof.backward_flops == 0
    outside = lin(torch.randn(2, 4)).sum()
    with tracetorch.profile() as prof:
        outside.backward()
    # Timed as a pass; its FLOPs come from forward calls, and none was recorded.
    assert prof.find("backward").calls == 1
    assert prof.backward_flops == 0


def test_training_loop_with_optimizer_steps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with tracetorch.profile(model) as prof:
        for _ in range(5):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            prof.step()
    assert prof.find("Adam.step").calls == 5
    assert prof.find("backward").calls == 5
    assert prof.find("0").backward_time.count == 5
    assert prof.find("0").backward_flops == 5 * 2 * 32 * 8 * 16
    assert prof.find("2").backward_flops == 5 * 2 * 2 * 32 * 16


def test_failing_backward_restores_everything():
    class Bad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise ValueError("bad gradient")

    lin = nn.Linear(3, 3)
    original = torch.autograd.backward
    with pytest.raises(ValueError, match="bad gradient"):
        with tracetorch.profile() as prof:
            Bad.apply(lin(torch.randn(2, 3))).sum().backward()
    assert torch.autograd.backward is original
    assert torch._C._len_torch_dispatch_stack() == 0
    assert prof.find("backward").errors == 1


def test_no_grad_forward_tags_nothing():
    lin = nn.Linear(3, 3)
    with torch.no_grad(), tracetorch.profile() as prof:
        out = lin(torch.randn(2, 3))
    assert out.grad_fn is None
    assert prof.backward_flops == 0


def test_graph_nodes_are_tagged_with_the_innermost_call_that_made_them():
    from tracetorch.adapters.torch.backward import MARKS

    class Res(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            out = self.relu(self.lin(x))
            out = out + x  # the block's own operation, between two in-place ReLU calls
            return self.relu(out)

    model = Res()
    x = torch.randn(2, 4, requires_grad=True) * 1  # input with history made outside any layer
    with tracetorch.profile(model) as prof:
        y = model(x)
        y.sum().backward()

    def calls(fn):  # the paths of the calls that marked fn, outermost first
        paths, mark = [], fn.metadata.get(MARKS)
        while mark is not None:  # (frame, parts, inner)
            paths.append(mark[0].node.path)
            mark = mark[2]
        return paths

    chain = []
    node = y.grad_fn
    while node is not None:
        chain.append((type(node).__name__, calls(node)))
        node = node.next_functions[0][0] if node.next_functions else None
    assert chain[:4] == [("ReluBackward0", ["", "relu"]), ("AddBackward0", []),
                         ("ReluBackward0", ["relu"]), ("AddmmBackward0", ["lin"])]
    assert calls(x.grad_fn) == []  # history from before the call stays unclaimed
    assert prof.find("lin").backward_flops == 2 * 4 * 2 * 4 * 2
    assert prof.find("relu").backward_time.count == 1


def test_backward_time_per_layer_comes_from_the_boundaries_between_layers():
    ticks = iter(range(10**6))
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    with tracetorch.profile(model, clock=lambda: next(ticks)) as prof:
        model(x).sum().backward()
    # One clock read where each layer's first node runs and one at the end of the pass: each
    # layer owns the ticks from its boundary to the next; the container nothing of its own.
    assert [prof.find(p).backward_time.total_ns for p in ("2", "1", "0")] == [1, 1, 1]
    assert prof.find("").backward_time.total_ns == 0
    assert all(n.backward_time.count == 1 for n in prof.nodes() if n.kind == "module")


def test_only_gradients_the_pass_computes_are_counted():
    lin = nn.Linear(4, 5)
    x = torch.randn(3, 4, requires_grad=True)
    product = 2 * 3 * 4 * 5
    with tracetorch.profile() as prof:
        torch.autograd.grad(lin(x).sum(), [lin.weight])   # the input's gradient is not needed
    assert prof.find("").backward_flops == product
    with tracetorch.profile() as prof:
        lin(x).sum().backward(inputs=[x])                 # nor the weight's here
    assert prof.find("").backward_flops == product
    lin.weight.requires_grad_(False)
    with tracetorch.profile() as prof:
        lin(x).sum().backward()                           # a frozen weight has no gradient
    assert prof.find("").backward_flops == product


def test_a_graph_built_in_a_block_runs_no_tracetorch_work_after_it():
    lin = nn.Linear(4, 4)
    with tracetorch.profile() as prof:
        loss = lin(torch.randn(2, 4)).sum()
    calls = []
    import sys

    package = os.path.dirname(tracetorch.__file__) + os.sep  # not a venv named after it

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            calls.append(frame.f_code.co_name)
    sys.setprofile(watch)
    try:
        loss.backward()
    finally:
        sys.setprofile(None)
    assert calls == ["_on_marked_node"]  # one hook per marked node, returning at once
    assert prof.backward_flops == 0


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))


def _backward_numbers(prof):
    return (prof.find("backward").calls, prof.backward_flops,
            [(n.path, n.backward_flops, n.backward_time.count) for n in prof.nodes()])


def test_ops_false_runs_no_function_mode_and_records_the_same_backward():
    from torch.overrides import _get_current_function_mode_stack

    model, x = _mlp(), torch.randn(2, 4)
    seen = []

    class Watch(nn.Module):
        def forward(self, y):
            seen.append(len(_get_current_function_mode_stack()))
            return y

    watch = Watch()
    with tracetorch.profile(model) as counted:
        for _ in range(2):
            model(x).sum().backward()
    with tracetorch.profile(model, ops=False) as rules_only:
        seen.append(len(_get_current_function_mode_stack()))  # at the root
        for _ in range(2):
            watch(model(x)).sum().backward()
    assert seen == [0, 0, 0]
    expected = 2 * (2 * 2 * 5 * 3 + 2 * 2 * 4 * 5 + 2 * 2 * 5 * 3)  # dW1, dW2, dX of Linear 2
    assert counted.backward_flops == rules_only.backward_flops == expected
    assert _backward_numbers(counted)[0] == _backward_numbers(rules_only)[0] == 2
    ruled = {p: (f, c) for p, f, c in _backward_numbers(rules_only)[2]}
    for path, flops, count in _backward_numbers(counted)[2]:
        assert ruled[path] == (flops, count), path
    assert rules_only.find("backward").total_ns > 0


def test_a_pass_started_inside_a_layer_with_a_rule_is_recorded():
    class GradientPenalty(nn.Linear):  # the Linear rule: no function mode inside
        def forward(self, x):
            out = super().forward(x)
            inner = nn.functional.linear(x, self.weight)  # counted by the rule only
            inner.sum().backward(retain_graph=True)
            return out

    layer = GradientPenalty(4, 3)
    lin = nn.Linear(4, 4)
    with tracetorch.profile() as prof:
        layer(lin(torch.randn(2, 4)))
    # The pass is a node under the layer; it reached Linear(4, 4)'s output: dW and no dX.
    (node,) = [n for n in prof.root.walk() if n.kind == "backward"]
    assert node.parent.type_name == "GradientPenalty"
    assert node.calls == 1
    assert prof.find("").backward_flops == 2 * 2 * 4 * 4


def test_a_pass_seen_only_by_its_nodes_charges_what_autograd_computes():
    model, x = _mlp(), torch.randn(2, 4, requires_grad=True)
    first, second = model[0], model[2]
    with tracetorch.profile(model, ops=False) as prof:
        torch.autograd.grad(model(x).sum(), [x])
    assert first.weight.grad is None
    # dX of both layers (the first one's input is the leaf asked for); no weight gradient.
    assert prof.backward_flops == 2 * 2 * 5 * 3 + 2 * 2 * 4 * 5
    with tracetorch.profile(model, ops=False) as prof:
        model(x).sum().backward(inputs=[second.weight])
    assert prof.find("2").backward_flops == 2 * 2 * 5 * 3  # dW of the last layer only
    assert prof.find("0").backward_flops == 0
    assert first.weight.grad is None and x.grad is None


def test_an_implicit_pass_keeps_no_tensor_after_the_block():
    import gc
    import weakref

    from tracetorch.adapters.torch import backward

    layer = nn.Linear(4, 4)
    with tracetorch.profile(ops=False):
        torch.autograd.grad(layer(torch.randn(2, 4)).sum(), [layer.weight])
    ref = weakref.ref(layer.weight)
    del layer
    gc.collect()
    assert ref() is None
    assert not backward._ACCUMULATORS and not backward._PASSES


class _Checkpointed(nn.Module):
    """A two-Linear block run under activation checkpointing, and a head."""

    def __init__(self, reentrant):
        super().__init__()
        self.blk = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 4)
        self.reentrant = reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return self.head(checkpoint(self.blk, x, use_reentrant=self.reentrant))


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_counts_the_model_once_and_recompute_apart(reentrant):
    model, x = _Checkpointed(reentrant), torch.randn(8, 16, requires_grad=True)
    with tracetorch.profile(model) as prof:
        model(x).sum().backward()
    linear, head = 2 * 8 * 16 * 16, 2 * 8 * 16 * 4
    assert prof.forward_gemm_flops == 2 * linear + head  # the model's forward, once
    assert prof.backward_gemm_flops == 2 * (2 * linear + head)  # dX and dW of every Linear
    # Backward FLOPs stay on the layers that own them, not on the recomputation.
    assert [prof.find(p).backward_gemm_flops for p in ("blk.0", "blk.2", "head")] == [
        2 * linear, 2 * linear, 2 * head]
    assert prof.find("blk.0").calls == prof.find("blk.2").calls == 1
    recomputed = [n for n in prof.root.walk() if n.kind == "recompute"]
    assert recomputed and all(n.backward_flops == 0 for n in recomputed)
    assert prof.recompute_flops == sum(n.flops for n in recomputed) > 0
    assert "Recompute FLOPs:" in str(prof)


def test_a_pass_that_raises_leaves_no_open_pass_behind():
    from support.torch_models import raising_in_backward
    from tracetorch.adapters.torch import backward

    boom = raising_in_backward(torch, RuntimeError("boom"))
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    with tracetorch.profile(ops=False):
        out = second(boom.apply(first(torch.randn(2, 4))))
        with pytest.raises(RuntimeError, match="boom"):
            out.sum().backward()  # second's node opens a pass; autograd never closes it
    assert not backward._PASSES
    with tracetorch.profile(ops=False) as prof:
        second(first(torch.randn(2, 4))).sum().backward()
    assert prof.find("backward").calls == 1
    assert prof.backward_gemm_flops == 2 * 2 * 4 * 4 + 2 * (2 * 2 * 4 * 4)  # dW1; dW2 and dX2


# ----------------------------------------------------------------------------- parametrized weights
def _parametrized(wrap, make):
    torch.manual_seed(0)
    return getattr(nn.utils.parametrizations, wrap)(make())


PARAMETRIZED = [  # (layer, input shape, forward product 2·rows·in·out per call)
    (lambda: nn.Linear(8, 6), (4, 8), 2 * 4 * 8 * 6),
    (lambda: nn.Conv1d(4, 6, 3), (2, 4, 10), 2 * 2 * 6 * 4 * 3 * 8),
]


@pytest.mark.parametrize("wrap", ["weight_norm", "spectral_norm"])
@pytest.mark.parametrize("make, shape, product", PARAMETRIZED)
@pytest.mark.parametrize("input_grad", [False, True])
def test_a_parametrized_weights_gradient_is_counted(wrap, make, shape, product, input_grad):
    # The weight is computed through torch.nn.utils.parametrize from leaves (weight_norm's g
    # and v): its gradient is the layer's product all the same, as FlopCounterMode counts it.
    x = torch.randn(shape, requires_grad=input_grad)
    fcm = fcm_counts(fwd_bwd(_parametrized(wrap, make), x))["Global"]
    layer = _parametrized(wrap, make)
    with tracetorch.profile(layer) as prof:
        layer(x).sum().backward()
    assert prof.backward_gemm_flops == fcm - product == product * (1 + input_grad)
    # The weight's originals frozen: only the input's gradient, if it needs one.
    for p in layer.parameters():
        p.requires_grad_(False)
    with tracetorch.profile(layer) as prof:
        out = layer(x)
        if input_grad:
            out.sum().backward()
    assert prof.backward_gemm_flops == product * input_grad


class _SpectralSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        mha = nn.MultiheadAttention(8, 2)
        self.mha = nn.utils.parametrizations.spectral_norm(mha, "in_proj_weight")

    def forward(self, x):
        return self.mha(x, x, x)[0]


SPECTRAL = [(lambda m=make: _parametrized("spectral_norm", m), shape)
            for make, shape, _ in PARAMETRIZED] + [(_SpectralSelfAttention, (3, 2, 8))]


@pytest.mark.parametrize("make, shape", SPECTRAL)
def test_resolving_a_parametrized_weight_does_not_run_its_parametrization(make, shape):
    # spectral_norm's power iteration updates its buffers each time the weight is computed in
    # training: a profiled step leaves them as a plain step does.
    x = torch.randn(shape)
    plain, profiled = make(), make()
    profiled.load_state_dict(plain.state_dict())
    for _ in range(2):
        plain(x).sum().backward()
    with tracetorch.profile(profiled):
        for _ in range(2):
            profiled(x).sum().backward()
    for (name, a), b in zip(plain.state_dict().items(), profiled.state_dict().values()):
        assert torch.equal(a, b), name


# ----------------------------------------------------------------------------- composite layers
def _transformer(kind, norm_first):
    torch.manual_seed(0)
    options = dict(dim_feedforward=32, dropout=0.0, batch_first=True, norm_first=norm_first)
    if kind == "encoder-layer":
        return nn.TransformerEncoderLayer(16, 2, **options)
    if kind == "decoder-layer":
        return nn.TransformerDecoderLayer(16, 2, **options)
    if kind == "encoder":
        return nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, **options), 2,
                                     enable_nested_tensor=False)
    return nn.Transformer(16, 2, 1, 1, **options)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("kind", ["encoder-layer", "decoder-layer", "encoder", "transformer"])
def test_a_composite_layers_backward_is_its_childrens_once(kind, norm_first):
    # A layer whose gradient formula includes its children's (TransformerEncoderLayer's) is
    # charged only what they were not: its children run and charge their own parts.
    from torch.utils.flop_counter import FlopCounterMode

    model = _transformer(kind, norm_first)
    torch.manual_seed(1)
    inputs = (torch.randn(2, 5, 16),) + ((torch.randn(2, 7, 16),) if "encoder" not in kind
                                          else ())
    with FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas()) as counter:
        out = model(*inputs)
        forward = counter.get_total_flops()
        out.sum().backward()
    backward = counter.get_total_flops() - forward
    model.zero_grad()
    with tracetorch.profile(model) as prof:
        model(*inputs).sum().backward()
    assert prof.backward_gemm_flops == prof.find("").subtree_backward_flops == backward
    # N=2, L=5, E=16, FFN 32: the q, k, v projections (their weights; their input's gradient
    # only after norm1, whose parameters need one), five attention products of the flash kernel
    # (scores recomputed, dP, dV, dQ, dK), output projection, the two FFN Linears.
    if kind == "encoder-layer":
        projections = 3 * (2 * 2 * 5 * 16 * 16) * (1 + norm_first)
        attention = 5 * 2 * 2 * 5 * 5 * 16
        out_proj = 2 * (2 * 2 * 5 * 16 * 16)
        ffn = 2 * 2 * (2 * 2 * 5 * 16 * 32)
        assert backward == projections + attention + out_proj + ffn
    for node in prof.nodes():
        if node.type_name.startswith("Transformer"):
            assert node.backward_flops == 0, node.path
