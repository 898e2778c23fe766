"""The examples in tracetorch.core docstrings run and show what they say.

Examples assume ``import numpy as np`` and ``from tracetorch.core import *``.
"""
import doctest
import importlib

import numpy as np
import pytest

import tracetorch.core as core

MODULES = [
    "tracetorch.core", "tracetorch.core.autograd", "tracetorch.core.tensor",
    "tracetorch.core.ops_math", "tracetorch.core.ops_linalg", "tracetorch.core.ops_reduce",
    "tracetorch.core.ops_shape", "tracetorch.core.ops_nn", "tracetorch.core.ops_conv",
    "tracetorch.core.ops_pool", "tracetorch.core.ops_norm", "tracetorch.core.init",
    "tracetorch.core.conv_impl",
    "tracetorch.core.layers", "tracetorch.core.activations", "tracetorch.core.spatial",
    "tracetorch.core.normalization", "tracetorch.core.embeddings", "tracetorch.core.attention",
    "tracetorch.core.losses", "tracetorch.core.optim", "tracetorch.core.functional",
    "tracetorch.core.gradcheck",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    extraglobs = {"np": np, **{n: getattr(core, n) for n in core.__all__}}
    failures, tried = doctest.testmod(module, extraglobs=extraglobs,
                                      optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert tried > 0, f"{name} has no examples"
    assert failures == 0


@pytest.mark.parametrize("name", MODULES)
def test_public_names_are_declared(name):
    module = importlib.import_module(name)
    assert isinstance(module.__all__, tuple)
    for public in module.__all__:
        assert hasattr(module, public), public
