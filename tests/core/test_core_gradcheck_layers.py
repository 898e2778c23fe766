"""Finite-difference gradient checks (float64) for every core layer, activation and loss."""
import numpy as np
import pytest

from tracetorch.core import (
    GELU,
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Flatten,
    LayerNorm,
    Linear,
    MaxPool2d,
    MSELoss,
    MultiHeadAttention,
    ReLU,
    Sequential,
    Sigmoid,
    Softmax,
    Tanh,
    TransformerBlock,
    manual_seed,
)
from tracetorch.core.gradcheck import gradcheck, to_float64
from tracetorch.core.tensor import Tensor


def x64(*shape, seed=0):
    return Tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=True,
                  dtype=np.float64)


def check_layer(layer, x, *extra):
    to_float64(layer)
    inputs = ([x] if x.requires_grad else []) + layer.parameters()
    assert gradcheck(lambda: layer(x, *extra), inputs)


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear(shape, bias):
    check_layer(Linear(4, 3, bias=bias), x64(*shape))


@pytest.mark.parametrize(
    "kwargs",
    [dict(kernel_size=3), dict(kernel_size=3, stride=2, padding=1),
     dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0)), dict(kernel_size=1, bias=False),
     dict(kernel_size=2, padding=2), dict(kernel_size=(1, 3), padding=(0, 1)),
     dict(kernel_size=(3, 2), padding=(2, 0))],
)
def test_conv2d(kwargs):
    check_layer(Conv2d(2, 3, **kwargs), x64(2, 2, 5, 6, seed=1))


@pytest.mark.parametrize("pool", [MaxPool2d, AvgPool2d])
@pytest.mark.parametrize("args", [(2,), (3, 1, 1), ((2, 3), (2, 1), 0)])
def test_pools(pool, args):
    check_layer(pool(*args), x64(2, 3, 6, 6, seed=2))


def test_layernorm_and_batchnorm():
    check_layer(LayerNorm(5), x64(3, 4, 5, seed=3))
    check_layer(LayerNorm((4, 5)), x64(3, 4, 5, seed=4))
    bn = BatchNorm2d(3)
    check_layer(bn, x64(4, 3, 3, 3, seed=5))
    bn.eval()
    check_layer(bn, x64(4, 3, 3, 3, seed=6))


def test_embedding():
    emb = Embedding(6, 4)
    to_float64(emb)
    ids = Tensor([[0, 5, 2], [2, 2, 1]])  # float ids, TinyTorch style
    assert gradcheck(lambda: emb(ids), [emb.weight])


@pytest.mark.parametrize("causal", [False, True])
def test_attention(causal):
    manual_seed(1)
    check_layer(MultiHeadAttention(6, 2, causal=causal), x64(2, 4, 6, seed=7))


def test_attention_with_padding_mask():
    mha = MultiHeadAttention(4, 2)
    keep = np.ones((2, 3, 3), dtype=bool)
    keep[1, :, 2] = False  # second sequence: last token is padding
    check_layer(mha, x64(2, 3, 4, seed=8), keep)


@pytest.mark.parametrize("causal", [False, True])
def test_transformer_block(causal):
    manual_seed(2)
    check_layer(TransformerBlock(4, 2, 8, causal=causal), x64(2, 3, 4, seed=9))


@pytest.mark.parametrize("act", [ReLU(), Sigmoid(), Tanh(), GELU(), Softmax(), Softmax(dim=0)])
def test_activations(act):
    check_layer(act, x64(3, 4, seed=10))


def test_dropout_train_and_eval():
    drop = Dropout(0.5)
    x = x64(4, 5, seed=11)
    manual_seed(3)
    check_layer_with_fixed_mask = lambda: (manual_seed(3), drop(x))[1]  # noqa: E731
    assert gradcheck(check_layer_with_fixed_mask, [x])
    drop.eval()
    assert drop(x) is x


def test_losses():
    pred, target = x64(3, 4, seed=12), x64(3, 4, seed=13)
    target.requires_grad = False
    assert gradcheck(lambda: MSELoss()(pred, target), [pred])
    logits = x64(5, 3, seed=14)
    assert gradcheck(lambda: CrossEntropyLoss()(logits, [0, 1, 2, 1, 0]), [logits])
    seq_logits = x64(2, 3, 4, seed=15)
    assert gradcheck(lambda: CrossEntropyLoss()(seq_logits, np.array([[0, 1, 2], [3, 3, 0]])),
                     [seq_logits])


def test_small_cnn_end_to_end():
    manual_seed(4)
    net = Sequential(Conv2d(1, 2, 3, padding=1), ReLU(), MaxPool2d(2), Flatten(), Linear(8, 3))
    x = x64(2, 1, 4, 4, seed=16)
    x.requires_grad = False
    to_float64(net)
    assert gradcheck(lambda: CrossEntropyLoss()(net(x), [0, 2]), net.parameters())
