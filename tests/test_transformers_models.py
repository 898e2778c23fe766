"""Parity on models nobody here wrote: Hugging Face transformers models built from small configs
(random weights, nothing downloaded). Parameter counts, forward and forward + backward
matmul/conv FLOPs equal ``FlopCounterMode``'s, once it is given formulas for the CPU attention
kernels it has none for; the model is left exactly as it was.

transformers is installed by ``.ci/run``: under ``CI=true`` a missing package fails these tests
instead of skipping them.
"""
from __future__ import annotations

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

torch.set_num_threads(1)


def _configs():
    hf = transformers
    ids = (2, 16)
    return {
        "bert": (hf.BertModel, hf.BertConfig(hidden_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, intermediate_size=128,
                                           vocab_size=100), {"input_ids": ids}),
        "gpt2": (hf.GPT2Model, hf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100,
                                           bos_token_id=1, eos_token_id=2),
                 {"input_ids": ids}),
        # Grouped-query attention: 4 query heads share 2 key/value heads.
        "llama-gqa": (hf.LlamaModel, hf.LlamaConfig(hidden_size=64, intermediate_size=128,
                                                  num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, vocab_size=100),
                      {"input_ids": ids}),
        "t5": (hf.T5Model, hf.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
                                     vocab_size=100),
               {"input_ids": ids, "decoder_input_ids": (2, 8)}),
        "whisper": (hf.WhisperModel, hf.WhisperConfig(
            d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
            max_source_positions=32, vocab_size=100, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=1),
            {"input_features": (2, 16, 64), "decoder_input_ids": (2, 8)}),
    }


MODELS = list(_configs())


def build(name):
    torch.manual_seed(0)
    cls, config, shapes = _configs()[name]
    model = cls(config).eval()
    inputs = {key: (torch.randn(shape) if key == "input_features"
                    else torch.randint(0, 100, shape)) for key, shape in shapes.items()}
    return model, inputs


def cpu_attention_formulas():
    """FlopCounterMode's own sdpa formulas, registered for the CPU flash kernels it lacks."""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    return {aten._scaled_dot_product_flash_attention_for_cpu: flop_counter.sdpa_flop.__wrapped__,
            aten._scaled_dot_product_flash_attention_for_cpu_backward:
                flop_counter.sdpa_backward_flop.__wrapped__}


def first_output(out):
    return out.last_hidden_state


def fcm_flops(model, inputs, backward):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas()) as counter:
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


@pytest.mark.parametrize("name", MODELS)
def test_backward_gemm_flops_match_flop_counter_mode(name):
    model, inputs = build(name)
    forward, backward = fcm_flops(model, inputs, backward=True)
    model.zero_grad()
    prof, _ = profiled(model, inputs, backward=True)
    assert backward > 0
    assert prof.forward_gemm_flops == forward
    assert prof.backward_gemm_flops == backward


@pytest.mark.parametrize("name", MODELS)
def test_the_model_is_left_as_it_was(name):
    model, inputs = build(name)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    with torch.no_grad():
        expected = first_output(model(**inputs))
        _, out = profiled(model, inputs, backward=False)
        after = first_output(model(**inputs))
    assert torch.equal(out, expected) and torch.equal(after, expected)
    assert all(torch.equal(state[key], value) for key, value in model.state_dict().items())
    for module in model.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
        assert "forward" not in vars(module)
