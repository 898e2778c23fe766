"""The examples in the report modules' docstrings run and print what they say."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["tracetorch.report", "tracetorch.report.units", "tracetorch.report._layout",
           "tracetorch.report.summary", "tracetorch.report.table", "tracetorch.report.jsonio",
           "tracetorch.report.chrome"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert tried > 0, f"{name} has no examples"
    assert failures == 0


@pytest.mark.parametrize("name", MODULES)
def test_public_names_are_declared(name: str) -> None:
    module = importlib.import_module(name)
    assert isinstance(module.__all__, tuple)
    for public in module.__all__:
        assert hasattr(module, public), public
