"""``torch.vmap`` inside a profile (tracetorch.adapters.torch.vmapped): layers there see one
example's shapes, and the profile says so instead of counting short in silence; vmap itself is
left as torch made it."""
from __future__ import annotations

import importlib
import os
import threading
import warnings

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from tracetorch.adapters.torch.vmapped import vmap_batch_sizes  # noqa: E402

torch.set_num_threads(1)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _flat_vmap():
    return vars(importlib.import_module("torch._functorch.vmap"))["_flat_vmap"]


def test_a_vmap_in_a_profile_warns_once_with_its_batch_size():
    model, x = _model(), torch.randn(5, 8)
    expected = model(x)
    original = _flat_vmap()
    with pytest.warns(RuntimeWarning, match=r"torch\.vmap ran inside a profile \(batch size 5\)"
                      ) as caught, tracetorch.profile(model) as prof:
        out = torch.vmap(model)(x)
        again = torch.vmap(model, chunk_size=2)(x)
    assert torch.allclose(out, expected) and torch.allclose(again, expected)
    assert len([w for w in caught if "torch.vmap" in str(w.message)]) == 1
    assert vmap_batch_sizes() == [5, 2, 2, 1]  # (the chunked vmap runs each chunk as a vmap)
    # said where the profile goes: its meta (kept in a saved profile) and its report's summary
    assert prof.meta["vmap"] == {"batch_sizes": [5, 2, 2, 1]}
    assert ("Under vmap:    4 vmaps (batch sizes 5, 2, 2, 1): the FLOPs, sizes and op counts of "
            "what ran under them are one example's of each batch") in str(prof)
    # one example's FLOPs per call, as the warning says: 2·(8·16 + 16·4) a call, 4 calls
    assert prof.gemm_flops == 4 * 2 * (8 * 16 + 16 * 4)
    assert prof.find("0").calls == 4
    assert _flat_vmap() is original


def test_nested_vmaps_list_each_batch_size():
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracetorch.profile(model):
            torch.vmap(torch.vmap(model))(torch.randn(3, 2, 8))
    assert vmap_batch_sizes() == [3, 2]


def test_no_vmap_no_warning():
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracetorch.profile(model):
            torch.vmap(model)(torch.randn(5, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tracetorch.profile(model) as prof:  # (a session of its own: the last one's vmap
            model(torch.randn(5, 8))             # is not this one's)
    assert vmap_batch_sizes() == [] and "vmap" not in prof.meta
    assert "Under vmap" not in str(prof)


def test_a_vmap_in_a_thread_no_profile_watches_is_not_noted():
    model = _model()
    done = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tracetorch.profile(model) as prof:
            worker = threading.Thread(target=lambda: done.append(torch.vmap(model)(
                torch.randn(5, 8)).shape))
            worker.start()
            worker.join()
    assert done == [(5, 4)] and vmap_batch_sizes() == [] and "vmap" not in prof.meta


def test_a_vmap_outside_every_profile_is_torchs_own():
    model = _model()
    original = _flat_vmap()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = torch.vmap(model)(torch.randn(5, 8))
    assert out.shape == (5, 4) and _flat_vmap() is original
