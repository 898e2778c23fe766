"""Parity on models nobody here wrote: Hugging Face transformers models built from small configs
(random weights, nothing downloaded). Parameter counts, forward and forward + backward
matmul/conv FLOPs equal ``FlopCounterMode``'s, corrected where the profiler's conventions say it
is blind or wrong: formulas for the CPU attention kernels and dynamically quantized Linears it
has none for, a grouped convolution's weight gradient counted once (it counts it ``groups``
times); the model is left exactly as it was. Families: text (BERT, GPT-2, Llama with grouped-query
attention, T5), speech (Whisper; wav2vec2 with its weight-normed convolutional position
embedding), vision (Swin, SegFormer, ConvNeXt's depthwise convolutions) and BERT with its Linears
quantized to int8 (inference only: torch has no gradient for them).

transformers is installed by ``.ci/run``: under ``CI=true`` a missing package fails these tests
instead of skipping them.
"""
from __future__ import annotations

import copy
import math
import os
import warnings

import pytest

if os.environ.get("CI") == "true":
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

import tracetorch
from test_gradient_parts import cpu_attention_formulas

torch.set_num_threads(1)


def _quantized(model):
    return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def _experts(config, implementation):
    config._experts_implementation = implementation
    return config


def _configs():
    """name: (model class, config, input shapes, what to do to the model once built)."""
    hf = transformers
    ids = (2, 16)
    image = {"pixel_values": (2, 3, 32, 32)}
    return {
        "bert": (hf.BertModel, hf.BertConfig(hidden_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=128,
                                           vocab_size=100), {"input_ids": ids}, None),
        "gpt2": (hf.GPT2Model, hf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100,
                                           bos_token_id=1, eos_token_id=2),
                 {"input_ids": ids}, None),
        # Grouped-query attention: 4 query heads share 2 key/value heads.
        "llama-gqa": (hf.LlamaModel, hf.LlamaConfig(hidden_size=64, intermediate_size=128,
                                                  num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, vocab_size=100),
                      {"input_ids": ids}, None),
        "t5": (hf.T5Model, hf.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
                                     vocab_size=100),
               {"input_ids": ids, "decoder_input_ids": (2, 8)}, None),
        "whisper": (hf.WhisperModel, hf.WhisperConfig(
            d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
            max_source_positions=32, vocab_size=100, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=1),
            {"input_features": (2, 16, 64), "decoder_input_ids": (2, 8)}, None),
        # The position embedding: a grouped Conv1d under weight_norm (a parametrization).
        "wav2vec2": (hf.Wav2Vec2Model, hf.Wav2Vec2Config(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=32),
            {"input_values": (2, 400)}, None),
        "swin": (hf.SwinModel, hf.SwinConfig(image_size=32, patch_size=4, embed_dim=16,
                                           depths=[1, 1], num_heads=[2, 2], window_size=4),
                 image, None),
        "segformer": (hf.SegformerModel, hf.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
            num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2],
            decoder_hidden_size=32), image, None),
        "convnext": (hf.ConvNextModel, hf.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1],
                                                       num_stages=2, patch_size=4),
                     image, None),
        # A mixture of experts: its experts run as one grouped_mm per projection.
        "mixtral-moe": (hf.MixtralModel, _experts(hf.MixtralConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=100, num_local_experts=4, num_experts_per_tok=2),
            "grouped_mm"), {"input_ids": ids}, None),
        "bert-int8-dynamic": (hf.BertModel, hf.BertConfig(hidden_size=32, num_hidden_layers=1,
                                                        num_attention_heads=2,
                                                        intermediate_size=64, vocab_size=100),
                              {"input_ids": ids}, _quantized),
    }


MODELS = list(_configs())
#: Models that train: not a dynamically quantized one (its Linears have no gradient in torch,
#: which runs their backward as a deprecated, "silently incorrect" no-op).
TRAINED = [name for name in MODELS if not name.endswith("-dynamic")]
_IDS = ("input_ids", "decoder_input_ids")


def build(name):
    torch.manual_seed(0)
    cls, config, shapes, prepare = _configs()[name]
    model = cls(config).eval()
    if prepare is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation
            model = prepare(model)
    inputs = {key: (torch.randint(0, 100, shape) if key in _IDS else torch.randn(shape))
              for key, shape in shapes.items()}
    return model, inputs


def _grouped_conv_backward(grad_out_shape, x_shape, w_shape, *args, out_shape=None, **kwargs):
    """FlopCounterMode's convolution backward, with a grouped convolution's weight gradient
    counted once, as it runs (it counts it ``groups`` times)."""
    from torch.utils.flop_counter import conv_backward_flop

    count = conv_backward_flop.__wrapped__
    total = count(grad_out_shape, x_shape, w_shape, *args, out_shape=out_shape, **kwargs)
    *options, groups, output_mask = args
    if groups > 1 and output_mask[1]:
        weight = count(grad_out_shape, x_shape, w_shape, *options, groups, [False, True, False],
                       out_shape=out_shape, **kwargs)
        total -= weight - weight // groups
    return total


def _quantized_linear(x_shape, *args, out_shape=None, **kwargs):
    """A dynamically quantized Linear's product, 2·rows·in·out (FlopCounterMode has none)."""
    return 2 * math.prod(x_shape) * out_shape[-1]


def _grouped_mm(a_shape, b_shape, *args, out_shape=None, **kwargs):
    """grouped_mm (MoE experts; FlopCounterMode has none): each group's product, 2·rows·K·N;
    two 2-D operands (a weight gradient) split K into groups, each a matrix of the result."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * math.prod(a_shape) * b_shape[-1]
    return 2 * math.prod(out_shape) * a_shape[-1]


def corrected_formulas():
    """What FlopCounterMode is given: its own sdpa formulas for the CPU flash kernels it lacks,
    and the corrections above."""
    return {**cpu_attention_formulas(), torch.ops.aten.convolution_backward: _grouped_conv_backward,
            torch.ops.quantized.linear_dynamic: _quantized_linear,
            torch.ops.aten._grouped_mm: _grouped_mm}


def first_output(out):
    return out.last_hidden_state


def fcm_flops(model, inputs, backward):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=corrected_formulas()) as counter:
        out = first_output(model(**inputs))
        forward = counter.get_total_flops()
        if backward:
            out.sum().backward()
    return forward, counter.get_total_flops() - forward


def profiled(model, inputs, backward):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no layer of these models goes uncounted
        with tracetorch.profile(model) as prof:
            out = first_output(model(**inputs))
            if backward:
                out.sum().backward()
    return prof, out


@pytest.mark.parametrize("name", MODELS)
def test_parameters_and_forward_gemm_flops_match_flop_counter_mode(name):
    model, inputs = build(name)
    with torch.no_grad():
        forward, _ = fcm_flops(model, inputs, backward=False)
        prof, _ = profiled(model, inputs, backward=False)
    assert prof.find("").params == tracetorch.count_parameters(model) == sum(
        p.numel() for p in model.parameters())
    assert forward > 0
    assert prof.gemm_flops == forward
    # Every layer's FLOPs known: activations, norms, rotary embeddings counted from their ops.
    assert prof.unsupported == {} and prof.completeness == "complete"
    assert prof.forward_flops > prof.gemm_flops
    # count_flops's running total (no node per call path: tracetorch.engine.tally) counts the same
    assert tracetorch.count_flops(model, inputs) == prof.forward_flops


@pytest.mark.parametrize("name", TRAINED)
def test_backward_gemm_flops_match_flop_counter_mode(name):
    model, inputs = build(name)
    forward, backward = fcm_flops(model, inputs, backward=True)
    model.zero_grad()
    prof, _ = profiled(model, inputs, backward=True)
    assert backward > 0
    assert prof.forward_gemm_flops == forward
    assert prof.backward_gemm_flops == backward
    assert prof.unsupported == {} and prof.completeness == "complete"


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")  # copying quantized weights
@pytest.mark.parametrize("name", MODELS)
def test_the_model_is_left_as_it_was(name):
    model, inputs = build(name)
    state = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        expected = first_output(model(**inputs))
        _, out = profiled(model, inputs, backward=False)
        after = first_output(model(**inputs))
    assert torch.equal(out, expected) and torch.equal(after, expected)
    assert state.keys() == model.state_dict().keys()
    assert all(_same(state[key], value) for key, value in model.state_dict().items())
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
        assert "forward" not in vars(module)


def _same(a, b):
    # A state-dict value: a tensor, or a quantized Linear's packed (weight, bias) and its dtype.
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
