"""Built-in FLOP rules for every ``tracetorch.core`` layer and optimizer.

Each rule returns the inclusive cost of one call over the whole batch (see
:mod:`tracetorch.flops.registry` for the conventions). Shapes come from the recorded input and
output, never from guesses. Rules do not depend on train/eval mode, because results are cached
per input shape; where a layer does more work in training, the docstring says what is left out.

======================  =================================================================
Layer                   FLOPs per call (N = output elements unless stated)
======================  =================================================================
Linear                  2·in·out·rows (GEMM; bias add not counted, as PyTorch's counter)
Conv2d                  2·kh·kw·Cin·Cout·OH·OW·batch (GEMM; bias add not counted)
ReLU                    1·N (one comparison)
Sigmoid                 4·N (negate, exp, add, divide)
Tanh                    1·N (one library call per element, as the core op counts it)
GELU                    6·N (x·sigmoid(1.702·x): two multiplies and a sigmoid)
Softmax                 5·N (max-subtract, exp, sum, divide, and the max itself)
MaxPool2d / AvgPool2d   kh·kw·N (each window element compared or added once)
LayerNorm               7·N (mean 1, variance 2, normalise 2, affine 2)
BatchNorm2d             7·N (as LayerNorm; in eval mode the statistics are not recomputed and
                        4·N would be exact, but rules are cached per shape, not per mode)
Dropout, Flatten,       0 (data movement or masking only)
Embedding
MultiHeadAttention      4 projections 2·rows·E·E each, QKᵀ and AV 2·B·L·L·E each (GEMM),
                        scaling q (B·L·E) and softmax 5 per score (B·H·L·L scores); a
                        mask's fill (1 per score) is not counted
MSELoss                 3·N_in (subtract, square, accumulate)
CrossEntropyLoss        5·N·C + N (log-softmax 5 per logit, pick-and-accumulate 1 per row)
SGD.step                2 per element of a parameter with a gradient, +2 with momentum, +2
                        with weight decay (:func:`~tracetorch.flops.optimizers.sgd_flops`)
Adam.step               13 per element of a parameter with a gradient, +2 with weight decay
                        (:func:`~tracetorch.flops.optimizers.adam_flops`)
======================  =================================================================

The optimizers follow torch's by :mod:`tracetorch.flops.optimizers`' formulas and convention,
so a step costs the same in both frameworks. A step takes no input, so the engine runs its
rule once, at the end of the first step, and keeps the count: the parameters with a gradient
then, and the steady state of SGD's momentum (its first step, a copy, costs 2 less per element
in fact, which torch's steps, counted before each, do show).

Every number comes from :mod:`tracetorch.flops.core_ops`, where the core tensor operations get
theirs, so a layer costs the same whether its rule or its counted operations report it. Layers
without a rule here (Sequential, TransformerBlock, user subclasses of Module with their own
forward) get their FLOPs from their children and the tensor operations they run.

Example:
    >>> from tracetorch.core import Linear, Tensor
    >>> import numpy as np
    >>> layer = Linear(4, 3)
    >>> linear_rule(layer, (Tensor(np.ones((7, 4))),), layer(Tensor(np.ones((7, 4)))))
    FlopCount(flops=168, gemm=168, macs=84)
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

from tracetorch.flops.core_ops import (
    GELU,
    MUL,
    REDUCTION,
    RELU,
    SIGMOID,
    SOFTMAX,
    SUB,
    TANH,
    conv2d_flops,
    cross_entropy_flops,
    gemm_flops,
    linear_flops,
    norm_flops,
    pool2d_flops,
)
from tracetorch.flops.optimizers import adam_flops, sgd_flops
from tracetorch.flops.registry import FlopCount, FlopRegistry, default_registry

__all__ = ("register_core_rules", "linear_rule", "conv2d_rule", "attention_rule")

Inputs = tuple[Any, ...]


def _size(value: Any) -> int:
    return int(math.prod(value.shape))


def _products(flops: int, other: int = 0) -> FlopCount:
    return FlopCount(flops + other, gemm=flops, macs=flops // 2)


def linear_rule(layer: Any, inputs: Inputs, output: Any) -> FlopCount:
    """2·in·out per row of the input, every leading dimension a row (bias add not counted)."""
    rows = _size(inputs[0]) // inputs[0].shape[-1]
    return _products(linear_flops(rows, layer.in_features, layer.out_features))


def conv2d_rule(layer: Any, inputs: Inputs, output: Any) -> FlopCount:
    """2·kh·kw·Cin per element of the recorded output (bias add not counted)."""
    kh, kw = layer.kernel_size  # core layers keep it as a pair
    return _products(conv2d_flops(_size(output), layer.in_channels, kh, kw))


def attention_rule(layer: Any, inputs: Inputs, output: Any) -> FlopCount:
    """Projections, both attention matmuls, q scaling and softmax over (B, L, E) self-attention."""
    x = inputs[0]
    embed = x.shape[-1]
    length = x.shape[-2]
    batch = _size(x) // (length * embed)
    rows = batch * length
    projections = 4 * linear_flops(rows, embed, embed)
    # QKᵀ and AV: per head, L·L outputs over E/H products, L·(E/H) over L; summed over heads.
    matmuls = 2 * gemm_flops(rows * length, embed)
    scores = batch * layer.num_heads * length * length
    return _products(projections + matmuls,
                     MUL.forward * rows * embed + SOFTMAX.forward * scores)


def _per_output(cost: int) -> Callable[[Any, Inputs, Any], int]:
    def rule(layer: Any, inputs: Inputs, output: Any) -> int:
        return cost * _size(output)

    rule.__doc__ = f"{cost} FLOP(s) per output element."
    return rule


def _cross_entropy_rule(layer: Any, inputs: Inputs, output: Any) -> int:
    """Log-softmax over every logit, one pick-and-accumulate per row (leading dims are rows)."""
    logits = inputs[0]
    classes = logits.shape[-1]
    return cross_entropy_flops(_size(logits) // classes, classes)


def _mse_rule(layer: Any, inputs: Inputs, output: Any) -> int:
    """Subtract, square (a multiply) and the mean's accumulate, per element of the input."""
    return (SUB.forward + MUL.forward + REDUCTION.forward) * _size(inputs[0])


def _pool_rule(layer: Any, inputs: Inputs, output: Any) -> int:
    """kh·kw per output element: each window element compared (max) or added (average)."""
    kh, kw = layer.kernel_size
    return pool2d_flops(kh * kw, _size(output))


def _norm_rule(layer: Any, inputs: Inputs, output: Any) -> int:
    """Batch statistics, normalization and affine: 7 per element."""
    return norm_flops(_size(output))


def _elements_with_grad(optimizer: Any) -> int:
    # What a step updates: the parameters with a gradient (core's steps skip the others).
    return sum(int(p.data.size) for p in optimizer.params if p.grad is not None)


def _sgd_rule(optimizer: Any, inputs: Inputs, output: Any) -> int:
    """2 per element (scale and subtract), +2 with momentum, +2 with weight decay."""
    return _elements_with_grad(optimizer) * sgd_flops(
        lr=optimizer.lr, momentum=optimizer.momentum, weight_decay=optimizer.weight_decay)


def _adam_rule(optimizer: Any, inputs: Inputs, output: Any) -> int:
    """13 per element: both moments (7), the denominator (3), scale, divide, subtract (3); +2
    with weight decay."""
    beta1, beta2 = optimizer.betas
    return _elements_with_grad(optimizer) * adam_flops(
        beta1=beta1, beta2=beta2, weight_decay=optimizer.weight_decay)


def register_core_rules(registry: FlopRegistry = default_registry) -> None:
    """Register the rules above for the ``tracetorch.core`` classes (idempotent: the core adapter
    calls it at every opening, and registering the same rule objects again changes nothing, so
    the nodes a profile keeps between openings stay valid)."""
    for layer_type, rule in _core_rules().items():
        registry.register(layer_type, builtin=True)(rule)


@functools.cache
def _core_rules() -> dict[type, Any]:
    # Built once: the same rule objects at each registration.
    from tracetorch.core import (
        activations,
        attention,
        embeddings,
        layers,
        losses,
        normalization,
        optim,
        spatial,
    )

    rules: dict[type, Any] = {
        layers.Linear: linear_rule,
        layers.Dropout: None,
        layers.Flatten: None,
        spatial.Conv2d: conv2d_rule,
        spatial.MaxPool2d: _pool_rule,
        spatial.AvgPool2d: _pool_rule,
        activations.ReLU: _per_output(RELU.forward),
        activations.Sigmoid: _per_output(SIGMOID.forward),
        activations.Tanh: _per_output(TANH.forward),
        activations.GELU: _per_output(GELU.forward),
        activations.Softmax: _per_output(SOFTMAX.forward),
        normalization.LayerNorm: _norm_rule,
        normalization.BatchNorm2d: _norm_rule,
        embeddings.Embedding: None,
        attention.MultiHeadAttention: attention_rule,
        losses.MSELoss: _mse_rule,
        losses.CrossEntropyLoss: _cross_entropy_rule,
        optim.SGD: _sgd_rule,
        optim.Adam: _adam_rule,
    }
    return rules
