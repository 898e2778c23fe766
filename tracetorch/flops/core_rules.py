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
SGD.step                2 per parameter element, +2 with momentum, +2 with weight decay
Adam.step               12 per parameter element, +2 with weight decay
======================  =================================================================

The numbers match the tensor operations of :mod:`tracetorch.core.autograd`, so a layer costs
the same whether its rule or its counted operations report it. Layers without a rule here (Sequential, TransformerBlock, user subclasses of Module with their
own forward) get their FLOPs from their children and the tensor operations they run.

Example:
    >>> from tracetorch.core import Linear, Tensor
    >>> import numpy as np
    >>> layer = Linear(4, 3)
    >>> linear_flops(layer, (Tensor(np.ones((7, 4))),), layer(Tensor(np.ones((7, 4)))))
    FlopCount(flops=168, gemm=168, macs=84)
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Tuple

from tracetorch.flops.registry import FlopCount, FlopRegistry, default_registry

__all__ = ("register_core_rules", "linear_flops", "conv2d_flops", "attention_flops")

Inputs = Tuple[Any, ...]


def _size(value: Any) -> int:
    return int(math.prod(value.shape))


def _pair(value: Any) -> Tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def linear_flops(layer: Any, inputs: Inputs, output: Any) -> FlopCount:
    """2·in·out per row of the input, every leading dimension a row (bias add not counted)."""
    rows = _size(inputs[0]) // inputs[0].shape[-1]
    macs = rows * layer.in_features * layer.out_features
    return FlopCount(2 * macs, gemm=2 * macs, macs=macs)


def conv2d_flops(layer: Any, inputs: Inputs, output: Any) -> FlopCount:
    """2·kh·kw·Cin·Cout per output pixel and image, from the recorded output shape."""
    kh, kw = _pair(layer.kernel_size)
    batch, _, out_h, out_w = output.shape
    macs = kh * kw * layer.in_channels * layer.out_channels * out_h * out_w * batch
    return FlopCount(2 * macs, gemm=2 * macs, macs=macs)


def attention_flops(layer: Any, inputs: Inputs, output: Any) -> FlopCount:
    """Projections, both attention matmuls, q scaling and softmax over (B, L, E) self-attention."""
    x = inputs[0]
    embed = x.shape[-1]
    length = x.shape[-2]
    batch = _size(x) // (length * embed)
    projections = 4 * 2 * batch * length * embed * embed
    matmuls = 2 * 2 * batch * length * length * embed
    scores = batch * layer.num_heads * length * length
    gemm = projections + matmuls
    return FlopCount(gemm + batch * length * embed + 5 * scores, gemm=gemm, macs=gemm // 2)


def _per_output(cost: int) -> Callable[[Any, Inputs, Any], int]:
    def rule(layer: Any, inputs: Inputs, output: Any) -> int:
        return cost * _size(output)

    rule.__doc__ = f"{cost} FLOP(s) per output element."
    return rule


def _per_input(cost: int) -> Callable[[Any, Inputs, Any], int]:
    def rule(layer: Any, inputs: Inputs, output: Any) -> int:
        return cost * _size(inputs[0])

    rule.__doc__ = f"{cost} FLOP(s) per element of the first input."
    return rule


def _cross_entropy_flops(layer: Any, inputs: Inputs, output: Any) -> int:
    """5 per logit (log-softmax) and 1 per row (pick the target and accumulate)."""
    logits = inputs[0]
    return 5 * _size(logits) + _size(logits) // logits.shape[-1]


def _pool_flops(layer: Any, inputs: Inputs, output: Any) -> int:
    """kh·kw per output element: each window element compared (max) or added (average)."""
    kh, kw = _pair(layer.kernel_size)
    return kh * kw * _size(output)


def _parameter_elements(optimizer: Any) -> int:
    return sum(int(p.data.size) for p in optimizer.params)


def _sgd_flops(optimizer: Any, inputs: Inputs, output: Any) -> int:
    """2 per element (scale and subtract), +2 with momentum, +2 with weight decay."""
    per_element = 2 + (2 if optimizer.momentum else 0) + (2 if optimizer.weight_decay else 0)
    return per_element * _parameter_elements(optimizer)


def _adam_flops(optimizer: Any, inputs: Inputs, output: Any) -> int:
    """12 per element: both moment updates (7), sqrt, eps, divide, scale, subtract (5); +2 decay."""
    per_element = 12 + (2 if optimizer.weight_decay else 0)
    return per_element * _parameter_elements(optimizer)


def register_core_rules(registry: FlopRegistry = default_registry) -> None:
    """Register the rules above for the ``tracetorch.core`` classes (idempotent)."""
    from tracetorch.core import activations, attention, embeddings, layers, losses
    from tracetorch.core import normalization, optim, spatial

    rules: Dict[type, Any] = {
        layers.Linear: linear_flops,
        layers.Dropout: None,
        layers.Flatten: None,
        spatial.Conv2d: conv2d_flops,
        spatial.MaxPool2d: _pool_flops,
        spatial.AvgPool2d: _pool_flops,
        activations.ReLU: _per_output(1),
        activations.Sigmoid: _per_output(4),
        activations.Tanh: _per_output(1),
        activations.GELU: _per_output(6),
        activations.Softmax: _per_output(5),
        normalization.LayerNorm: _per_output(7),
        normalization.BatchNorm2d: _per_output(7),
        embeddings.Embedding: None,
        attention.MultiHeadAttention: attention_flops,
        losses.MSELoss: _per_input(3),
        losses.CrossEntropyLoss: _cross_entropy_flops,
        optim.SGD: _sgd_flops,
        optim.Adam: _adam_flops,
    }
    for layer_type, rule in rules.items():
        registry.register(layer_type, builtin=True)(rule)
