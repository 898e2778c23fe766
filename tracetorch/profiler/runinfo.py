"""What a profile notes about its run, in ``meta``: when, how it was started, on what.

:func:`run_facts` gives the date (local time with its UTC offset), the command line, the Python,
numpy, tracetorch (and torch) versions, the platform, and the framework, device, CPU and thread
count as :func:`tracetorch.analysis.machine_cache.machine_facts` states them for calibrations (the
host name is left out: a profile is shared more often than a calibration cache); the framework
and dtype are those of the profile's arithmetic (:func:`work_dtype`): what a calibration must
match to measure the profile against (:func:`tracetorch.analysis.machine_cache.profile_target`).
torch is only looked at when the program has imported it; then ``device`` is ``cuda`` once CUDA
is initialised. A profile records these once, the first time it closes, so they describe the run
and reports (the HTML page's header and Run table) can show them.

Example:
    >>> facts = run_facts()
    >>> sorted(facts["versions"])[:2], facts["device"] in ("cpu", "cuda")
    (['numpy', 'python'], True)
"""
from __future__ import annotations

import platform
import shlex
import sys
from collections import Counter
from datetime import datetime, timezone
from typing import Any

import numpy as np

from tracetorch.analysis.machine_cache import DTYPES, machine_facts
from tracetorch.records.tree import FLOPS, GEMM_FLOPS, KEY, CallNode
from tracetorch.version import __version__

__all__ = ("run_facts", "work_dtype")


#: Per class of a call key's items, whether it is a dtype class (numpy's or torch's), and per
#: dtype seen, what :func:`_framework_dtype` made of it: a profile's exit reads every counter's
#: key, and the same few dtypes come back in each.
_IS_DTYPE_CLASS: dict[type, bool] = {}
_KINDS: dict[Any, tuple[str, str] | None] = {}


def _framework_dtype(item: Any) -> tuple[str, str] | None:
    # A call key's dtype, as (framework, name) when a calibration can be made in it.
    cls = type(item)
    is_dtype = _IS_DTYPE_CLASS.get(cls)
    if is_dtype is None:
        is_dtype = _IS_DTYPE_CLASS[cls] = issubclass(cls, np.dtype) or (
            cls.__name__ == "dtype" and cls.__module__ == "torch")
    if not is_dtype:
        return None
    if item in _KINDS:
        return _KINDS[item]
    found = (("numpy", item.name) if isinstance(item, np.dtype)
             else ("torch", str(item).replace("torch.", "")))
    kind = _KINDS[item] = found if found[1] in DTYPES[found[0]] else None
    return kind


def work_dtype(root: CallNode) -> tuple[str, str] | None:
    """The framework and floating dtype most of the tree's counted FLOPs ran in (GEMM/conv
    FLOPs first), read from the input dtypes of each layer call's key; ``None`` when no call
    had a floating input. One walk of the tree, once per profile.

    Example:
        >>> from tracetorch.records.tree import FLOPS, GEMM_FLOPS, KEY, new_entry
        >>> root = CallNode.root()
        >>> for name, dtype, flops in (("a", np.float64, 10), ("b", np.float32, 99)):
        ...     key = ((2, 2), np.dtype(dtype), (True, 0, None))
        ...     entry = new_entry(); entry[FLOPS] = entry[GEMM_FLOPS] = flops; entry[KEY] = key
        ...     root.child(name, "Linear", name).engine.flops_cache[key] = entry
        >>> work_dtype(root), work_dtype(CallNode.root())
        (('numpy', 'float32'), None)
    """
    weights: Counter[tuple[str, str]] = Counter()
    for node in root.walk():
        for entry in node.engine.flops_cache.values():
            key = entry[KEY]
            if not isinstance(key, tuple):
                continue
            found = {kind for item in key if (kind := _framework_dtype(item)) is not None}
            if found:
                # GEMM FLOPs decide (the peak is a matmul's); any FLOPs, then a call, break ties.
                weight = (entry[GEMM_FLOPS] or 0) * 2**32 + (entry[FLOPS] or 0) + 1
                for kind in found:
                    weights[kind] += weight
    return max(weights, key=weights.__getitem__) if weights else None


def run_facts(root: CallNode | None = None) -> dict[str, Any]:
    """The date, command line, versions, platform, framework, device, cpu and threads of this
    process, and the dtype ``root``'s calls ran in (:func:`work_dtype`), JSON-ready (see the
    module docstring).

    Example:
        >>> run_facts()["framework"] in ("numpy", "torch")
        True
    """

    torch = sys.modules.get("torch")  # never imported here: only seen if the program did
    # The framework whose layers did the arithmetic; without a call, the one imported.
    framework, dtype = (work_dtype(root) if root is not None else None) or (
        "torch" if torch is not None else "numpy", None)
    device = ("cuda" if framework == "torch" and torch is not None
              and torch.cuda.is_initialized() else "cpu")
    facts = machine_facts(framework, device)
    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "tracetorch": __version__}
    if torch is not None:
        versions["torch"] = str(torch.__version__)
    return {
        "date": datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv),
        "versions": versions,
        # Not platform.platform(): it asks `uname -p` in a subprocess for the processor.
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        **{k: v for k, v in facts.items() if k not in ("host", "dtype")},
        **({"dtype": dtype} if dtype is not None else {}),
    }
