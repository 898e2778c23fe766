"""Built-in FLOP rules for ``torch.nn`` layers (registered when the torch adapter starts).

Bias adds are not counted (as the TinyTorch guide, ``tracetorch.core``'s rules and PyTorch's
counter do), so a Linear or convolution costs exactly its product. Each rule returns the
*inclusive* cost of one call as ``FlopCount(flops, gemm, macs)``: ``gemm`` is the
matrix-product/convolution part (2 x MACs, what ``torch.utils.flop_counter`` counts, so
``prof.gemm_flops`` compares like for like), ``flops`` adds the elementwise work each docstring
lists, ``macs`` is ``gemm // 2`` where products exist. Counts cover the whole batch. The
elementwise part follows :mod:`tracetorch.flops.elementwise`, the convention torch's functions
and ``tracetorch.core`` share: an activation costs what its function does per output element
(ReLU 1, Sigmoid 4, GELU 6, Softmax 5), a normalization 7 per input element where it computes
statistics (4 with BatchNorm's running statistics). Losses, distances, LocalResponseNorm and
Fold cost what their ``torch.nn.functional`` function does (``criterion_flops``); pure data
movement (padding, pixel and channel shuffles, Unfold, MaxUnpool) is a known 0; quantized
Linear and convolutions count their integer product as the float one. A layer whose weight is
parametrized (``weight_norm``, ``spectral_norm``, ``orthogonal``, a LoRA written with
``torch.nn.utils.parametrize``) counts what it does with its weight; computing the weight is its
parametrization's call, counted there (by the rules below for ``weight_norm`` and
``spectral_norm``, by its operations for any other) and added to the layer's.

Example:
    >>> import torch
    >>> layer = torch.nn.Linear(4, 3)
    >>> x = torch.zeros(2, 4)
    >>> linear_rule(layer, (x,), layer(x))
    FlopCount(flops=48, gemm=48, macs=24)
"""
from __future__ import annotations

from collections.abc import Iterable
from math import prod
from typing import Any, Callable

import torch
from torch import nn

from tracetorch.flops.elementwise import (
    PER_ELEMENT,
    criterion_flops,
    normalization_flops,
)
from tracetorch.flops.layer_functions import (
    adaptive_window,
    embedding_bag_flops,
    interpolation_flops,
    weight_norm_flops,
    window_flops,
)
from tracetorch.flops.registry import FlopCount, FlopRegistry, default_registry
from tracetorch.flops.torch_functions import (
    CRITERION_PARAMETERS,
    attention_products,
    linear_cross_entropy_flops,
    real_arithmetic,
)

__all__ = ("register_torch_rules", "linear_rule", "mha_count", "nested_sizes")


_Tensor = torch.Tensor
# Every rule's result is made by _gemm or _elementwise: tuple.__new__ skips FlopCount's own
# __new__, a Python frame.
_new_count = tuple.__new__


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    if isinstance(value, nn.utils.rnn.PackedSequence):
        return value.data
    return None


def _numel(value: Any) -> int:
    if value.__class__ is _Tensor:  # (the common call: a plain tensor, without a call)
        return value.numel()
    tensor = _first_tensor(value)
    return int(tensor.numel()) if tensor is not None else 0


def _real(output: Any) -> int:
    # Real FLOPs per FLOP of the product that returned ``output`` (a tensor, or tensors).
    return real_arithmetic(output if output.__class__ is _Tensor else _first_tensor(output))


def _gemm(gemm: int, other: int = 0) -> FlopCount:
    return _new_count(FlopCount, (int(gemm + other), int(gemm), int(gemm // 2)))


def _elementwise(flops: int) -> FlopCount:
    return _new_count(FlopCount, (int(flops), 0, None))


# ----------------------------------------------------------------------------- products
def linear_rule(layer: nn.Linear, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """Linear: 2·rows·in·out for the product (also quantized Linears: an int8 product counts
    as a float one; a complex one 4 x, its real arithmetic, as for every product here)."""
    return _gemm(2 * _numel(output) * layer.in_features * _real(output))


def bilinear_rule(layer: nn.Bilinear, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """Bilinear: 2·rows·out·in1·in2 for x1ᵀWx2."""
    return _gemm(2 * _numel(output) * layer.in1_features * layer.in2_features * _real(output))


def conv_rule(layer: nn.modules.conv._ConvNd, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """ConvNd: 2 x (output elements) x (C_in/groups) x prod(kernel) — stride, padding and
    dilation enter through the output shape."""
    per_output = (layer.in_channels // layer.groups) * prod(layer.kernel_size)
    return _gemm(2 * _numel(output) * per_output * _real(output))


def conv_transpose_rule(layer: nn.modules.conv._ConvTransposeNd, inputs: tuple[Any, ...],
                        output: Any) -> FlopCount:
    """ConvTransposeNd: every input element meets C_out/groups filters: 2 x (input elements) x
    (C_out/groups) x prod(kernel)."""
    per_input = (layer.out_channels // layer.groups) * prod(layer.kernel_size)
    return _gemm(2 * _numel(inputs) * per_input * _real(output))


def mha_count(layer: nn.MultiheadAttention, n: int, length: int, source: int) -> FlopCount:
    """FLOPs of nn.MultiheadAttention for ``n`` sequences of ``length`` queries over ``source``
    keys: q/k/v and output projections, the two attention products, softmax (3 per score); a
    ``bias_k`` row and ``add_zero_attn``'s zeros are keys more to attend to (not projected)."""
    e = layer.embed_dim
    added = (layer.bias_k is not None) + bool(layer.add_zero_attn)
    softmax = 3 * n * layer.num_heads * length * (source + added)
    scale = n * length * e
    return _gemm(attention_products(e, layer.kdim, layer.vdim, n, length, source, added),
                 softmax + scale)


def _mha_dims(layer: nn.MultiheadAttention, query: torch.Tensor,
              key: torch.Tensor | None) -> tuple[int, int, int]:
    if query.dim() == 2:  # unbatched (L, E)
        return 1, query.shape[0], (key.shape[0] if key is not None else query.shape[0])
    batch_dim, seq_dim = (0, 1) if layer.batch_first else (1, 0)
    source = key.shape[seq_dim] if key is not None and key.dim() == 3 else query.shape[seq_dim]
    return query.shape[batch_dim], query.shape[seq_dim], source


def nested_sizes(value: Any) -> tuple[tuple[int, ...], ...] | None:
    """The shapes of a strided nested tensor's components, which it has instead of one shape
    (``None`` for any other value): nn.TransformerEncoder's inference fast path hands its layers
    one, each sequence without its padding.

    Example:
        >>> batch = torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)])
        >>> nested_sizes(batch), nested_sizes(torch.ones(2))
        (((2, 4), (3, 4)), None)
    """
    if not isinstance(value, _Tensor) or not value.is_nested or value.layout != torch.strided:
        return None
    return tuple(map(tuple, value._nested_tensor_size().tolist()))


def _sequence_lengths(value: Any) -> list[int] | None:
    # A nested batch's sequence lengths (its components are (length, features)); None for a
    # plain tensor.
    sizes = nested_sizes(value)
    return None if sizes is None else [size[0] for size in sizes]


def _summed(counts: Iterable[FlopCount]) -> FlopCount:
    gemm = flops = 0
    for count in counts:
        gemm += count.gemm
        flops += count.flops
    return _gemm(gemm, flops - gemm)


def mha_rule(layer: nn.MultiheadAttention, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """MultiheadAttention: q/k/v projections 2·N·(L·E·E + S·kdim·E + S·vdim·E), scores and
    weighted sum 2·2·N·L·S'·E, output projection 2·N·L·E·E; 3 per score for softmax
    and 1 per query element for the scaling, where S' counts ``bias_k``'s row and
    ``add_zero_attn``'s zeros besides the S keys. A nested batch: each sequence at its own
    length."""
    query = inputs[0] if inputs else _first_tensor(output)
    key = inputs[1] if len(inputs) > 1 and isinstance(inputs[1], torch.Tensor) else None
    lengths = _sequence_lengths(query)
    if lengths is not None:
        sources = _sequence_lengths(key) or lengths  # (self-attention: the same)
        return _summed(mha_count(layer, 1, length, source)
                       for length, source in zip(lengths, sources))
    n, length, source = _mha_dims(layer, query, key)
    return mha_count(layer, n, length, source)


def encoder_layer_rule(layer: nn.TransformerEncoderLayer, inputs: tuple[Any, ...],
                       output: Any) -> FlopCount:
    """TransformerEncoderLayer (needed because its inference fast path runs no children):
    self-attention as MultiheadAttention, the two feed-forward Linears, the activation (its
    function's cost per hidden element), two LayerNorms and two residual adds. A nested batch
    (nn.TransformerEncoder's fast path, padding dropped): each sequence at its own length."""
    x = inputs[0] if inputs else _first_tensor(output)
    lengths = _sequence_lengths(x)
    if lengths is not None:
        return _summed(_encoder_count(layer, 1, length) for length in lengths)
    n, length, _ = _mha_dims(layer.self_attn, x, None)
    return _encoder_count(layer, n, length)


def _encoder_count(layer: nn.TransformerEncoderLayer, n: int, length: int) -> FlopCount:
    tokens = n * length
    e = layer.linear1.in_features
    hidden = layer.linear1.out_features
    attn = mha_count(layer.self_attn, n, length, length)
    ffn = 2 * tokens * e * hidden * 2
    activation = _activation_name(layer.activation)
    assert activation is not None  # (_known_activation keeps a user's from this rule)
    other = (PER_ELEMENT[activation] * tokens * hidden
             + 2 * normalization_flops("layer_norm", tokens * e))
    return _gemm(attn.gemm + ffn, (attn.flops - attn.gemm) + other + 2 * tokens * e)


def _activation_name(activation: Any) -> str | None:
    # The torch function an encoder layer's activation is (F.relu, F.gelu, as its string
    # options give), or applies (a ReLU or GELU module...); None for the user's own.
    if isinstance(activation, nn.Module):
        return _ACTIVATIONS.get(type(activation))
    name = getattr(activation, "__name__", None)
    if name in PER_ELEMENT and getattr(nn.functional, name, None) is activation:
        return str(name)
    return None


def _known_activation(layer: nn.TransformerEncoderLayer) -> bool:
    # A function of the user's as the activation (lambda x: x * torch.sigmoid(x)) has a cost the
    # rule cannot know: such a layer runs its children (no fast path), counted by its operations.
    return _activation_name(layer.activation) is not None


# ----------------------------------------------------------------------------- recurrent
_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}
_GATE_ELEMENTWISE = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 9, "GRU": 7}


def _timesteps(layer: nn.RNNBase, inputs: tuple[Any, ...]) -> int:
    x = inputs[0] if inputs else None
    if isinstance(x, nn.utils.rnn.PackedSequence):
        return int(x.data.shape[0])
    if x is None:
        return 0
    if x.dim() == 2:  # unbatched (L, H_in)
        return int(x.shape[0])
    return int(x.shape[0] * x.shape[1])


def rnn_rule(layer: nn.RNNBase, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """RNN/LSTM/GRU: per timestep, layer and direction, 2·G·H·(in + H_h) for the input and
    hidden products (G gates: RNN 1, GRU 3, LSTM 4; LSTM projection 2·H·P more) and
    elementwise gate maths (RNN 1, GRU 7, LSTM 9 per hidden unit)."""
    steps = _timesteps(layer, inputs)
    gates = _GATES.get(layer.mode, 1)
    h = layer.hidden_size
    proj = getattr(layer, "proj_size", 0) or 0
    h_out = proj or h
    dirs = 2 if layer.bidirectional else 1
    gemm = other = 0
    for index in range(layer.num_layers):
        width = layer.input_size if index == 0 else h_out * dirs
        per_step = 2 * gates * h * (width + h_out) + (2 * h * proj if proj else 0)
        gemm += dirs * steps * per_step
        other += dirs * steps * _GATE_ELEMENTWISE.get(layer.mode, 1) * h
    return _gemm(gemm, other)


def rnn_cell_rule(layer: nn.RNNCellBase, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """RNNCell/LSTMCell/GRUCell: one timestep of the matching recurrent layer per row."""
    x = inputs[0] if inputs else None
    rows = 1 if x is None or x.dim() == 1 else int(x.shape[0])
    gates = {nn.LSTMCell: 4, nn.GRUCell: 3}.get(type(layer), 1)
    elementwise = {nn.LSTMCell: 9, nn.GRUCell: 7}.get(type(layer), 1)
    h = layer.hidden_size
    gemm = 2 * rows * gates * h * (layer.input_size + h)
    other = rows * elementwise * h
    return _gemm(gemm, other)


# ----------------------------------------------------------------------------- elementwise
# Per-element costs are those of tracetorch.flops.elementwise, which torch's functions and
# tracetorch.core use too: a layer costs what its function costs, in either framework.
def batchnorm_rule(layer: nn.modules.batchnorm._NormBase, inputs: tuple[Any, ...],
                   output: Any) -> FlopCount:
    """BatchNorm: 7 per element while it computes batch statistics (training, or no running
    statistics), 4 with running statistics (``F.batch_norm``'s convention)."""
    batch_stats = layer.training or not layer.track_running_stats
    return _elementwise(normalization_flops("batch_norm", _numel(inputs), training=batch_stats))


def _norm_rule(name: str) -> Any:
    def rule(layer: nn.Module, inputs: tuple[Any, ...], output: Any) -> FlopCount:
        affine = getattr(layer, "weight", None) is not None
        return _elementwise(normalization_flops(name, _numel(inputs), affine=affine))
    rule.__doc__ = f"{name}: as ``F.{name}`` (see tracetorch.flops.elementwise)."
    return rule


layernorm_rule = _norm_rule("layer_norm")
groupnorm_rule = _norm_rule("group_norm")
instancenorm_rule = _norm_rule("instance_norm")
rmsnorm_rule = _norm_rule("rms_norm")


#: The function each activation layer applies, by class: its cost per output element.
_ACTIVATIONS = {
    nn.ReLU: "relu", nn.ReLU6: "relu6", nn.LeakyReLU: "leaky_relu", nn.PReLU: "prelu",
    nn.RReLU: "rrelu", nn.ELU: "elu", nn.SELU: "selu", nn.CELU: "celu", nn.GELU: "gelu",
    nn.SiLU: "silu", nn.Mish: "mish", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh",
    nn.Hardtanh: "hardtanh", nn.Hardsigmoid: "hardsigmoid", nn.Hardswish: "hardswish",
    nn.Hardshrink: "hardshrink", nn.Softshrink: "softshrink", nn.Softplus: "softplus",
    nn.Softsign: "softsign", nn.Tanhshrink: "tanhshrink", nn.Threshold: "threshold",
    nn.LogSigmoid: "logsigmoid", nn.GLU: "glu", nn.Softmax: "softmax",
    nn.LogSoftmax: "log_softmax", nn.Softmin: "softmin", nn.Softmax2d: "softmax",
}


def activation_rule(layer: nn.Module, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """Activations, softmax and GLU: the cost per output element of the function they apply
    (tracetorch.flops.elementwise: ReLU 1, Sigmoid 4, GELU 6, SiLU 5, Softmax 5...)."""
    name = _ACTIVATIONS.get(type(layer)) or next(  # (a subclass: its base's function)
        _ACTIVATIONS[klass] for klass in type(layer).__mro__ if klass in _ACTIVATIONS)
    return _elementwise(PER_ELEMENT[name] * _numel(output))


def pool_rule(layer: nn.Module, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """Max/average/LP pooling: one comparison or add per window element per output element."""
    return _elementwise(window_flops(_numel(output),
                                     _tuple(layer.kernel_size, _spatial_dims(layer))))


def adaptive_pool_rule(layer: nn.Module, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """Adaptive pooling: each output element reduces its window (about input/output elements
    per dimension, rounded up): one comparison or add per window element."""
    x, out = _first_tensor(inputs), _first_tensor(output)
    if x is None or out is None:
        return _elementwise(0)
    dims = _spatial_dims(layer)  # an int output_size (AdaptiveAvgPool2d(1)) covers them all
    return _elementwise(out.numel() * adaptive_window(x.shape[-dims:], out.shape[-dims:]))


def upsample_rule(layer: nn.Upsample, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """Upsample: nearest 0; (bi/tri)linear 2^d multiplies + 2^d−1 adds per output element
    (3, 7, 15); bicubic 31 per output element; area as adaptive average pooling."""
    x, out = _first_tensor(inputs), _first_tensor(output)
    if x is None or out is None:
        return _elementwise(0)
    spatial = x.dim() - 2
    return _elementwise(interpolation_flops(getattr(layer, "mode", "nearest"), x.shape[2:],
                                            out.shape[-spatial:], out.numel()))


def free_rule(layer: nn.Module, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """Lookups, copies, reshapes and padding (Embedding, Identity, Flatten, Dropout,
    PixelShuffle, ChannelShuffle, Unfold, MaxUnpool, the padding layers...): 0 FLOPs."""
    return _elementwise(0)


# ----------------------------------------------------------------------------- losses
#: The function each loss, distance or normalization layer applies, by class: it costs what
#: the function does (tracetorch.flops.elementwise.criterion_flops), so a layer and its function
#: agree.
_CRITERIA: dict[type, str] = {
    nn.L1Loss: "l1_loss", nn.MSELoss: "mse_loss", nn.SmoothL1Loss: "smooth_l1_loss",
    nn.HuberLoss: "huber_loss", nn.CrossEntropyLoss: "cross_entropy", nn.NLLLoss: "nll_loss",
    nn.BCELoss: "binary_cross_entropy", nn.BCEWithLogitsLoss: "binary_cross_entropy_with_logits",
    nn.KLDivLoss: "kl_div", nn.PoissonNLLLoss: "poisson_nll_loss",
    nn.GaussianNLLLoss: "gaussian_nll_loss", nn.SoftMarginLoss: "soft_margin_loss",
    nn.MultiLabelSoftMarginLoss: "multilabel_soft_margin_loss",
    nn.HingeEmbeddingLoss: "hinge_embedding_loss", nn.MarginRankingLoss: "margin_ranking_loss",
    nn.MultiMarginLoss: "multi_margin_loss", nn.MultiLabelMarginLoss: "multilabel_margin_loss",
    nn.CosineEmbeddingLoss: "cosine_embedding_loss", nn.TripletMarginLoss: "triplet_margin_loss",
    nn.CTCLoss: "ctc_loss", nn.CosineSimilarity: "cosine_similarity",
    nn.PairwiseDistance: "pairwise_distance", nn.LocalResponseNorm: "local_response_norm",
    nn.CrossMapLRN2d: "local_response_norm", nn.Fold: "fold",
}
# The layer attributes that are options of their function (BCEWithLogitsLoss.pos_weight...).
_CRITERION_OPTIONS = ("pos_weight", "log_input", "full", "p", "swap", "dim", "size")


def criterion_rule(layer: nn.Module, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """Losses, distances, LocalResponseNorm and Fold: what their ``torch.nn.functional`` function
    costs (see tracetorch.flops.elementwise), the forward's inputs in the function's places and
    the layer's settings (``pos_weight``, ``full``, ``swap``, ``size``...) as its options."""
    name = next(_CRITERIA[klass] for klass in type(layer).__mro__ if klass in _CRITERIA)
    arguments = dict(zip(CRITERION_PARAMETERS[name], inputs))
    for option in _CRITERION_OPTIONS:
        if option not in arguments and hasattr(layer, option):
            arguments[option] = getattr(layer, option)
    return _elementwise(criterion_flops(name, arguments))


def linear_cross_entropy_rule(layer: nn.Module, inputs: tuple[Any, ...],
                              output: Any) -> FlopCount:
    """LinearCrossEntropyLoss: its Linear's product (2·rows·in·out, run inside
    ``F.linear_cross_entropy``, not by the child) and the cross entropy of the logits."""
    linear = layer.linear
    return _gemm(*linear_cross_entropy_flops(_numel(inputs[:1]), linear.in_features,
                                             linear.out_features))


# ----------------------------------------------------------------------------- parametrizations
def weight_norm_rule(layer: nn.Module, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """``parametrizations.weight_norm``: g·v/‖v‖ — the norm of v (2 per element of v: square,
    add), a root and a division per norm (2 per element of g), the scaling (1 per element of v)."""
    magnitude, direction = (_numel(value) for value in inputs[:2])
    return _elementwise(weight_norm_flops(direction, magnitude))


def spectral_norm_rule(layer: nn.Module, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """``parametrizations.spectral_norm`` of an m x n weight: while training, each power
    iteration's two matrix-vector products (2·m·n each) and normalizations of u and v (3 per
    element: norm 2, divide); then σ = u·(W v) (2·m·n + 2·m) and W / σ (m·n). A 1-D weight is
    normalized (3 per element). Matrix-vector products are not ``gemm`` (as FlopCounterMode)."""
    weight = _first_tensor(inputs)
    if weight is None:
        return _elementwise(0)
    if weight.dim() == 1:
        return _elementwise(3 * weight.numel())
    m = weight.shape[layer.dim]
    n = weight.numel() // max(m, 1)
    iterations = layer.n_power_iterations if layer.training else 0
    return _elementwise(iterations * (4 * m * n + 3 * (m + n)) + 3 * m * n + 2 * m)


def embedding_bag_rule(layer: nn.EmbeddingBag, inputs: tuple[Any, ...], output: Any) -> FlopCount:
    """EmbeddingBag: one add (sum/mean) or comparison (max) per looked-up element, one multiply
    more with per_sample_weights, one divide per output element for mean."""
    weighted = len(inputs) > 2 and inputs[2] is not None
    return _elementwise(embedding_bag_flops(_numel(inputs[:1]) * layer.embedding_dim, weighted,
                                            layer.mode, _numel(output)))


def _tuple(value: Any, n: int) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)):
        return tuple(int(v) if v is not None else 1 for v in value)
    return (int(value),) * n


def _spatial_dims(layer: nn.Module) -> int:
    for klass in type(layer).__mro__:  # MaxPool2d -> 2, also for a user's subclass of it
        name = klass.__name__
        if name.endswith("d") and name[-2].isdigit():
            return int(name[-2])
    return 1


# ----------------------------------------------------------------------------- registration
def register_torch_rules(registry: FlopRegistry = default_registry) -> None:
    """Register every built-in torch rule (user rules registered before or after still win)."""
    def add(types: Any, rule: Any, covers: Callable[[Any], bool] | None = None) -> None:
        for layer_type in types if isinstance(types, tuple) else (types,):
            registry.register(layer_type, builtin=True, covers=covers)(rule)

    add(nn.Linear, linear_rule)
    add(nn.Bilinear, bilinear_rule)
    add((nn.Conv1d, nn.Conv2d, nn.Conv3d), conv_rule)
    add((nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d), conv_transpose_rule)
    add(nn.MultiheadAttention, mha_rule)
    add(nn.TransformerEncoderLayer, encoder_layer_rule, covers=_known_activation)
    # Free (its layers and norm are counted, it runs nothing else): no function mode inside it,
    # whose presence turns its inference fast path off (has_torch_function), so it runs as
    # without a profile, each sequence without its padding.
    add(nn.TransformerEncoder, None)
    add(nn.RNNBase, rnn_rule)
    add(nn.RNNCellBase, rnn_cell_rule)
    add(nn.modules.batchnorm._BatchNorm, batchnorm_rule)
    add(nn.LayerNorm, layernorm_rule)
    add(nn.GroupNorm, groupnorm_rule)
    add(nn.modules.instancenorm._InstanceNorm, instancenorm_rule)
    if hasattr(nn, "RMSNorm"):
        add(nn.RMSNorm, rmsnorm_rule)
    add(tuple(_ACTIVATIONS), activation_rule)
    add((nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
         nn.LPPool1d, nn.LPPool2d, nn.LPPool3d, nn.FractionalMaxPool2d, nn.FractionalMaxPool3d),
        pool_rule)
    add((nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
         nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d), adaptive_pool_rule)
    add(nn.Upsample, upsample_rule)
    add(nn.EmbeddingBag, embedding_bag_rule)
    add(tuple(_CRITERIA), criterion_rule)
    if hasattr(nn, "LinearCrossEntropyLoss"):  # torch 2.13 and later
        add(nn.LinearCrossEntropyLoss, linear_cross_entropy_rule)
    add((nn.Embedding, nn.Identity, nn.Flatten, nn.Unflatten, nn.Dropout, nn.Dropout1d,
         nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout), free_rule)
    padding = nn.modules.padding
    add((nn.PixelShuffle, nn.PixelUnshuffle, nn.ChannelShuffle, nn.Unfold,
         padding._ConstantPadNd, padding._ReflectionPadNd, padding._ReplicationPadNd,
         padding._CircularPadNd, nn.modules.pooling._MaxUnpoolNd), free_rule)
    # Quantized layers (torch.ao: static, and dynamic ones such as quantize_dynamic's int8
    # Linear) run the same product in integers: the same count, 2 x MACs.
    quantized = torch.ao.nn.quantized
    add(quantized.Linear, linear_rule)
    add(quantized.modules.conv._ConvNd, conv_rule)
    add(quantized.modules.conv._ConvTransposeNd, conv_transpose_rule)
    parametrizations = nn.utils.parametrizations
    add(parametrizations._WeightNorm, weight_norm_rule)
    add(parametrizations._SpectralNorm, spectral_norm_rule)
