"""Fixtures shared by the test modules.

torch is imported only inside the ``torch`` fixture, never while collecting: some tests
check that ``import tracetorch`` leaves torch unimported.
"""
from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import pytest


def _in_ci() -> bool:
    return os.environ.get("CI") == "true"


@pytest.fixture
def torch() -> ModuleType:
    """torch, skipped when missing locally but required (never skipped) under CI."""
    if _in_ci():
        import torch as torch_module

        return torch_module
    return pytest.importorskip("torch")


@pytest.fixture
def torch_installed() -> None:
    """Skip where torch is not installed; in CI, where it must be, fail instead.

    torch is only looked up, not imported: the test runs it in a subprocess, and other tests
    check that tracetorch works with torch not imported.
    """
    if importlib.util.find_spec("torch") is None:
        if _in_ci():
            pytest.fail("torch must be installed in CI")
        pytest.skip("torch is not installed")
