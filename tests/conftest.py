"""Fixtures shared by the test modules.

torch is imported only inside the ``torch`` fixture, never while collecting: some tests
check that ``import tracetorch`` leaves torch unimported.

A test that starts a process (``subprocess``: a script, the CLI, a fresh interpreter) must be
marked ``@pytest.mark.slow``, so that ``pytest -m "not slow"`` is a fast inner loop; an unmarked
one fails when it tries.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
from types import ModuleType
from typing import Any

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


def _importing() -> bool:
    """Whether a module is being imported: some probe the machine at import (numpy.testing runs
    ``lscpu``), once per process, which is no process the test itself starts."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib."):
            return True
        frame = frame.f_back
    return False


@pytest.fixture(autouse=True)
def _own_machine_cache(tmp_path_factory: pytest.TempPathFactory,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own, empty calibration cache (``XDG_CACHE_HOME``, which processes it starts
    inherit): ``tracetorch run`` adds the bottleneck section when the user's cache has a fitting
    calibration, and no test may depend on what this machine's user measured."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture(autouse=True)
def _processes_only_in_slow_tests(request: pytest.FixtureRequest,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail a test not marked ``slow`` that starts a process through ``subprocess``."""
    if request.node.get_closest_marker("slow") is None:
        test, popen = request.node.nodeid, subprocess.Popen

        class Refused(subprocess.Popen):
            def __new__(cls, *args: Any, **kwargs: Any) -> Any:
                if _importing():
                    return popen(*args, **kwargs)
                pytest.fail(f"{test} starts a process: mark it @pytest.mark.slow", pytrace=False)

        monkeypatch.setattr(subprocess, "Popen", Refused)
