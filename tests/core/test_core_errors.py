"""Bad input raises clear errors naming the layer/op, the argument and the shapes."""
import numpy as np
import pytest

from tracetorch.core import (
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    MaxPool2d,
    MSELoss,
    MultiHeadAttention,
    Tensor,
    TransformerBlock,
)


def test_linear_wrong_last_dim():
    msg = (r"Linear\(in_features=4, out_features=3\): expected input with last dimension 4, "
           r"got shape \(2, 5\)")
    with pytest.raises(ValueError, match=msg):
        Linear(4, 3)(Tensor(np.ones((2, 5))))


def test_conv2d_bad_inputs():
    conv = Conv2d(3, 8, 3)
    with pytest.raises(ValueError, match=r"Conv2d\(in_channels=3.*4-D input.*\(3, 32, 32\)"):
        conv(Tensor(np.ones((3, 32, 32))))
    with pytest.raises(ValueError, match=r"expected 3 input channels, got shape \(1, 4, 8, 8\)"):
        conv(Tensor(np.ones((1, 4, 8, 8))))
    with pytest.raises(ValueError, match=r"Conv2d.*smaller than the kernel"):
        conv(Tensor(np.ones((1, 3, 2, 2))))


def test_matmul_and_broadcast_mismatch():
    with pytest.raises(ValueError, match=r"matmul: shapes \(2, 3\) and \(4, 5\) are not aligned"):
        Tensor(np.ones((2, 3))) @ Tensor(np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"matmul: batch dimensions of shapes"):
        Tensor(np.ones((2, 2, 3))) @ Tensor(np.ones((3, 3, 4)))
    with pytest.raises(ValueError, match=r"add: cannot broadcast shapes \(2, 3\) and \(4,\)"):
        Tensor(np.ones((2, 3))) + Tensor(np.ones(4))
    with pytest.raises(ValueError, match=r"reshape: cannot reshape a tensor of shape \(6,\)"):
        Tensor(np.ones(6)).reshape(4, 2)


@pytest.mark.parametrize("p", [-0.1, 1.5, "half"])
def test_dropout_probability(p):
    with pytest.raises(ValueError, match=f"p={p!r}".replace(".", r"\.")):
        Dropout(p)


@pytest.mark.parametrize(
    "build,arg",
    [
        (lambda: Linear(0, 3), "in_features"),
        (lambda: Linear(3, -1), "out_features"),
        (lambda: Linear(2.5, 3), "in_features"),
        (lambda: Conv2d(0, 3, 3), "in_channels"),
        (lambda: Conv2d(3, 3, 0), "kernel_size"),
        (lambda: Conv2d(3, 3, (3, 3, 3)), "kernel_size"),
        (lambda: Conv2d(3, 3, 3, stride=0), "stride"),
        (lambda: Conv2d(3, 3, 3, padding=-1), "padding"),
        (lambda: MaxPool2d(0), "kernel_size"),
        (lambda: AvgPool2d(2, stride=0), "stride"),
        (lambda: Embedding(0, 4), "num_embeddings"),
        (lambda: LayerNorm(0), "normalized_shape"),
        (lambda: BatchNorm2d(-2), "num_features"),
        (lambda: MultiHeadAttention(10, 3), "divisible"),
        (lambda: TransformerBlock(8, 2, 0), "mlp_hidden_dim"),
    ],
)
def test_bad_constructor_args(build, arg):
    with pytest.raises(ValueError, match=arg):
        build()


def test_bad_forward_inputs_of_other_layers():
    with pytest.raises(ValueError, match=r"LayerNorm.*trailing dims are \(4,\).*\(2, 5\)"):
        LayerNorm(4)(Tensor(np.ones((2, 5))))
    with pytest.raises(ValueError, match=r"BatchNorm2d\(num_features=3\).*\(2, 4, 5, 5\)"):
        BatchNorm2d(3)(Tensor(np.ones((2, 4, 5, 5))))
    with pytest.raises(ValueError, match=r"MultiHeadAttention.*\(batch, seq, 8\).*\(2, 3, 6\)"):
        MultiHeadAttention(8, 2)(Tensor(np.ones((2, 3, 6))))
    with pytest.raises(ValueError, match=r"max_pool2d: expected 4-D input"):
        MaxPool2d(2)(Tensor(np.ones((4, 4))))
    with pytest.raises(ValueError, match=r"MSELoss: predictions shape \(2,\) != targets shape"):
        MSELoss()(Tensor([1.0, 2.0]), Tensor([1.0, 2.0, 3.0]))


def test_bad_ids_and_targets():
    with pytest.raises(IndexError, match=r"embedding: index out of range \[0, 5\)"):
        Embedding(5, 2)([0, 5])
    with pytest.raises(ValueError, match="whole numbers"):
        Embedding(5, 2)(Tensor([0.5]))
    with pytest.raises(ValueError, match=r"targets must have shape \(3,\)"):
        CrossEntropyLoss()(Tensor(np.zeros((3, 4))), [0, 1])
    with pytest.raises(IndexError, match="cross_entropy: index out of range"):
        CrossEntropyLoss()(Tensor(np.zeros((2, 4))), [0, 4])
    with pytest.raises(TypeError, match="pow: exponent must be a number"):
        Tensor([1.0]) ** Tensor([2.0])
