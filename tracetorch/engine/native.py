"""The optional C accelerators of the hot path, and the switch that turns them off.

Three C files are built by ``pip install`` where a C compiler is there (see ``setup.py``):
``engine/_hotpath.c`` does what :func:`tracetorch.engine.hotpath.make_wrapper`'s Python wrapper
does on a recorded call, and ``adapters/torch/_marks.c`` what the torch exit observer
(:func:`tracetorch.adapters.torch.marks.tag_call`) does for a one-tensor output
(``engine/_binding.c``, a third, binds a layer's recording method: see
:class:`tracetorch.engine.patches.LayerMethod`). Each hands
the uncommon cases back to the Python function it stands for, so without a compiler nothing is
lost but speed. ``TRACETORCH_PURE_PYTHON=1`` in the environment (read at import) runs the
Python functions even where the accelerators are built: the tests run both.

Example:
    >>> accelerated() in (True, False)
    True
"""
from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ("PURE_PYTHON_ENV", "accelerated", "native_type")

#: The environment variable that, set to ``1``, keeps the hot path in Python.
PURE_PYTHON_ENV = "TRACETORCH_PURE_PYTHON"

_PURE = os.environ.get(PURE_PYTHON_ENV) == "1"


def native_type(module: str, name: str) -> Any:
    """The type ``name`` of the C module ``module``, or ``None`` where it is not built or
    ``TRACETORCH_PURE_PYTHON=1``.

    Example:
        >>> native_type("tracetorch.engine._no_such_module", "Wrapper") is None
        True
    """
    if _PURE:
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:  # not built here (no compiler at install time)
        return None


def accelerated() -> bool:
    """Whether recorded calls go through the engine's C accelerator in this process."""
    return native_type("tracetorch.engine._hotpath", "Wrapper") is not None
