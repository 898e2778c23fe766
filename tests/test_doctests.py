"""The examples in the docstrings of every tracetorch module run and show what they say.

Modules are found on disk, so collecting imports nothing but ``tracetorch`` (torch stays
unimported). A module that needs torch is skipped where torch is not installed, except under CI,
where torch must be installed and nothing is skipped.

Examples in ``tracetorch.core`` assume ``import numpy as np`` and ``from tracetorch.core import *``
and compare output with whitespace normalized; elsewhere each example imports what it uses and
output is compared exactly (a table's alignment is part of what it shows).
"""
from __future__ import annotations

import doctest
import importlib
import importlib.util
import os
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import tracetorch

ROOT = Path(tracetorch.__file__).parent
#: Packages whose every module must have examples.
ALWAYS_EXAMPLES = ("tracetorch.core", "tracetorch.report")


def _module_names() -> list[str]:
    names = ["tracetorch"]

    def walk(path: Path, prefix: str) -> None:
        for info in pkgutil.iter_modules([str(path)]):
            name = prefix + info.name
            if name != "tracetorch.__main__":  # importing it is harmless, but it has nothing
                names.append(name)
            if info.ispkg:
                walk(path / info.name, name + ".")

    walk(ROOT, "tracetorch.")
    return sorted(names)


MODULES = _module_names()


def _in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


#: What a module may need that a local install may lack (CI installs them all).
OPTIONAL = ("torch", "transformers", "lightning", "pytorch_lightning")


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name not in OPTIONAL or os.environ.get("CI") == "true":
            raise
        pytest.skip(f"{name} needs {error.name}, which is not installed")


def test_the_walk_finds_every_package() -> None:
    for package in ("tracetorch.core", "tracetorch.report", "tracetorch.cli",
                    "tracetorch.adapters.torch", "tracetorch.engine", "tracetorch.flops"):
        assert package in MODULES
    assert "tracetorch.report.table" in MODULES and "tracetorch.core.tensor" in MODULES


def _needs_missing_torch(module: Any) -> bool:
    # Examples that import torch run where torch is installed (always in CI).
    if os.environ.get("CI") == "true" or importlib.util.find_spec("torch") is not None:
        return False
    return any("import torch" in example.source
               for test in doctest.DocTestFinder().find(module) for example in test.examples)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = _import(name)
    if _needs_missing_torch(module):
        pytest.skip(f"{name}'s examples need torch, which is not installed")
    flags = doctest.ELLIPSIS
    extraglobs: dict[str, Any] = {}
    if _in_package(name, "tracetorch.core"):
        import tracetorch.core as core

        extraglobs = {"np": np, **{n: getattr(core, n) for n in core.__all__}}
        flags |= doctest.NORMALIZE_WHITESPACE
    failures, tried = doctest.testmod(module, extraglobs=extraglobs, optionflags=flags,
                                      report=True)
    if any(_in_package(name, package) for package in ALWAYS_EXAMPLES):
        assert tried > 0, f"{name} has no examples"
    assert failures == 0, f"{failures} of {tried} examples in {name} failed (output above)"


@pytest.mark.parametrize("name", MODULES)
def test_public_names_are_declared(name: str) -> None:
    module = _import(name)
    if not hasattr(module, "__all__"):
        assert not any(_in_package(name, package) for package in ALWAYS_EXAMPLES), name
        return
    assert isinstance(module.__all__, tuple), name
    for public in module.__all__:
        assert hasattr(module, public), f"{name}.{public}"
