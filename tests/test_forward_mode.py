"""Forward-mode AD inside a profile (tracetorch.adapters.torch.forward_mode): the tangents'
FLOPs are not counted, and the profile says so instead of counting short in silence (a JVP
through a Linear ran twice the products the profile shows); forward AD is left as torch made it.
"""
from __future__ import annotations

import os
import warnings

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import torch.autograd.forward_ad as forward_ad  # noqa: E402

import tracetorch  # noqa: E402

torch.set_num_threads(1)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _dual_level(model, x, tangent):
    with forward_ad.dual_level():
        out = model(forward_ad.make_dual(x, tangent))
        return forward_ad.unpack_dual(out).tangent


PROGRAMS = {
    "func.jvp": lambda model, x, v: torch.func.jvp(model, (x,), (v,))[1],
    "forward_ad": _dual_level,
    "jacfwd": lambda model, x, v: torch.func.jacfwd(model)(x[0]),
}


@pytest.mark.parametrize("name", PROGRAMS)
def test_forward_mode_ad_in_a_profile_is_said_and_its_values_kept(name, tmp_path):
    model, x, v = _model(), torch.randn(3, 8), torch.randn(3, 8)
    program = PROGRAMS[name]
    expected = program(model, x, v)
    original = forward_ad.make_dual
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tracetorch.profile(model) as prof:
            out = program(model, x, v)
    assert torch.allclose(out, expected)
    said = [w for w in caught if "forward-mode AD" in str(w.message)]
    assert len(said) == 1 and "tangents" in str(said[0].message)
    made = prof.meta["forward_ad"]["dual_tensors"]
    assert made >= 1
    assert "Forward-mode AD: " in str(prof) and "tangents computed beside the values are not " \
        "counted" in str(prof)
    prof.save(str(tmp_path / "profile.json"))
    assert tracetorch.load(str(tmp_path / "profile.json")).meta["forward_ad"] == {
        "dual_tensors": made}
    assert forward_ad.make_dual is original


def test_a_profile_without_forward_mode_ad_says_nothing():
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracetorch.profile(model):
            torch.func.jvp(model, (torch.randn(2, 8),), (torch.randn(2, 8),))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tracetorch.profile(model) as prof:  # a session of its own
            model(torch.randn(2, 8)).sum().backward()
    assert "forward_ad" not in prof.meta and "Forward-mode AD" not in str(prof)


def test_forward_mode_ad_outside_every_profile_is_torchs_own():
    original = forward_ad.make_dual
    with tracetorch.profile(_model()):
        pass
    assert forward_ad.make_dual is original
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.func.jvp(_model(), (torch.randn(2, 8),), (torch.randn(2, 8),))


def test_the_figures_shown_are_the_values_computation_alone():
    # What docs/pytorch.md quotes: a JVP through Linear(4, 8), Tanh, Linear(8, 1) on 3 rows
    # shows the values' products, 2·3·4·8 + 2·3·8·1 = 240, where FlopCounterMode, below
    # autograd, sees the tangents' too (720: one more product per layer, of the input with the
    # weight's tangent, all zeros).
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, v = torch.randn(3, 4), torch.randn(3, 4)
    with FlopCounterMode(display=False) as counter:
        torch.func.jvp(model, (x,), (v,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracetorch.profile(model) as prof:
            torch.func.jvp(model, (x,), (v,))
    assert (prof.forward_gemm_flops, counter.get_total_flops()) == (240, 720)
