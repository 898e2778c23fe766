"""nn.TransformerEncoder's inference fast path inside a profile: it runs as without one, and its
layers are counted on the nested batch it hands them, each sequence at its own length.

In eval mode under ``no_grad`` with a padding mask, the encoder packs its batch into a nested
tensor with the padding dropped (``torch._nested_tensor_from_mask``) — unless a torch function
mode is on (``has_torch_function``), as the profile's was inside it until its counts were
learned. Its third call reached the layers' rule with a nested tensor, whose shape cannot be
read: the user's program died with "NestedTensorImpl doesn't support sizes"; its first two ran
the slow path, over the padding.
"""
from __future__ import annotations

import os
import warnings

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from tracetorch.engine.hotpath import call_key  # noqa: E402
from tracetorch.flops.torch_rules import encoder_layer_rule  # noqa: E402

nn = torch.nn
E, HEADS, HIDDEN = 32, 4, 64


def _encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, HEADS, HIDDEN, batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch's note on enable_nested_tensor)
        return nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()


def _padding(lengths, total=10):
    mask = torch.ones(len(lengths), total, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, :length] = False
    return mask


def _one_layer(length):
    # A layer's FLOPs on one sequence of ``length`` tokens, by its rule on a plain tensor.
    layer = nn.TransformerEncoderLayer(E, HEADS, HIDDEN, batch_first=True)
    return encoder_layer_rule(layer, (torch.ones(1, length, E),), None).flops


def _packings(monkeypatch):
    packed = []
    original = torch._nested_tensor_from_mask

    def watched(*args, **kwargs):
        packed.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "_nested_tensor_from_mask", watched)
    return packed


def test_the_fast_path_runs_as_without_a_profile_and_counts_each_sequence(monkeypatch):
    encoder, x = _encoder(), torch.randn(4, 10, E)
    masks = [_padding([5, 5, 5, 5]), _padding([10, 7, 3, 1])]
    packed = _packings(monkeypatch)
    with torch.no_grad():
        expected = [encoder(x, src_key_padding_mask=mask) for mask in masks for _ in range(3)]
        plain = len(packed)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing unknown, no rule failing
            with tracetorch.profile(encoder) as prof:
                out = [encoder(x, src_key_padding_mask=mask) for mask in masks for _ in range(3)]
    assert plain == 6 and len(packed) == 12  # every call packed, as without the profile
    assert all(torch.equal(a, b) for a, b in zip(out, expected))
    per_call = [sum(_one_layer(n) for n in lengths) for lengths in ([5] * 4, [10, 7, 3, 1])]
    assert prof.find("layers.0").flops == prof.find("layers.1").flops == 3 * sum(per_call)
    assert prof.find("").flops == 0 and prof.completeness == "complete"


def test_two_nested_batches_of_other_lengths_are_two_keys():
    packed = [torch._nested_tensor_from_mask(torch.ones(2, 10, E), ~_padding(lengths))
              for lengths in ([5, 5], [9, 1], [5, 5])]
    keys = [call_key((batch,), {}) for batch in packed]
    assert keys[0] == keys[2] != keys[1]


def test_count_flops_counts_a_nested_batch_too():
    encoder = _encoder()
    with torch.no_grad():
        flops = tracetorch.count_flops(encoder, {"src": torch.randn(2, 10, E),
                                                "src_key_padding_mask": _padding([4, 6])})
    assert flops == 2 * (_one_layer(4) + _one_layer(6))
