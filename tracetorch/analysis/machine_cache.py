"""This machine's facts and the calibrations measured for them, cached on disk.

What a calibration is for (:func:`machine_facts`: host, CPU and GPU model, framework, device,
dtype, threads), the cache that keeps each measured :class:`~tracetorch.analysis.machine.Machine`
(``$XDG_CACHE_HOME/tracetorch/machine.json``, one entry per facts; :func:`cache_path`), and
which calibration fits a recorded profile (:func:`profile_target`). Nothing here measures: that
is :mod:`tracetorch.tools.calibrate`, which runs a profile.

Example:
    >>> profile_target({"framework": "torch", "dtype": "int64"})["dtype"]
    'float32'
"""
from __future__ import annotations

import functools
import json
import os
import platform
import socket
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from tracetorch.analysis.machine import Machine

__all__ = ("FRAMEWORKS", "DTYPES", "CACHE_FORMAT", "cache_path", "machine_facts", "cache_key",
           "cached_machine", "cached", "profile_target", "read_cache", "write_cache",
           "store", "import_torch", "cpu_model", "blas_threads", "THREAD_VARIABLES")

FRAMEWORKS = ("numpy", "torch")
#: The dtypes each framework can be calibrated in.
DTYPES = {"numpy": ("float16", "float32", "float64"),
          "torch": ("float16", "bfloat16", "float32", "float64")}
#: The cache file's format name and version.
CACHE_FORMAT = ("tracetorch-machine-cache", 1)
#: The environment variables numpy's BLAS reads its thread count from when it loads.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def import_torch() -> Any:
    """torch, or a ValueError naming the framework argument when it is not installed."""
    try:
        import torch
    except ImportError:
        raise ValueError("framework: 'torch' needs PyTorch installed (pip install torch)") from None
    return torch


def cache_path() -> Path:
    """Where measured machines are kept: ``$XDG_CACHE_HOME/tracetorch/machine.json``.

    Example:
        >>> cache_path().name
        'machine.json'
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracetorch" / "machine.json"


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    # /proc/cpuinfo names the model on Linux; platform.processor() is often empty there. Read
    # once per process: every profile notes it when it closes.
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def blas_threads() -> int:
    # numpy's BLAS reads its thread count from the environment when it loads, else uses all cores.
    for name in THREAD_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


def machine_facts(framework: str = "numpy", device: str = "cpu", dtype: str = "float32",
                  threads: int | None = None) -> dict[str, Any]:
    """What a calibration is for, checked: host, cpu (and gpu), framework, device, dtype, threads.

    Raises:
        ValueError: an unknown framework, device or dtype, a thread count that is not a
            positive int, numpy asked for a GPU.

    Example:
        >>> facts = machine_facts("numpy", "cpu", "float64")
        >>> facts["framework"], facts["dtype"], facts["threads"] >= 1
        ('numpy', 'float64', True)
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework: expected one of {FRAMEWORKS}, got {framework!r}")
    if not isinstance(device, str) or not (device == "cpu" or device == "cuda"
                                           or (device.startswith("cuda:")
                                               and device[5:].isdigit())):
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dtype not in DTYPES[framework]:
        raise ValueError(f"dtype: expected one of {DTYPES[framework]} for {framework}, "
                         f"got {dtype!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"threads: expected a positive int or None, got {threads!r}")
    facts: dict[str, Any] = {"host": socket.gethostname(), "cpu": cpu_model(),
                             "framework": framework, "device": device, "dtype": dtype}
    if framework == "numpy":
        if device != "cpu":
            raise ValueError(f"device: numpy runs on the CPU only, got {device!r}")
        # Another count than this process runs is measured in a child process (see measure).
        facts["threads"] = threads if threads is not None else blas_threads()
        return facts
    torch = import_torch()
    if device != "cpu":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asked for, but torch.cuda.is_available() "
                             "is False")
        facts["gpu"] = torch.cuda.get_device_name(torch.device(device))
    facts["threads"] = threads if threads is not None else torch.get_num_threads()
    return facts


def cache_key(facts: dict[str, Any]) -> str:
    return "|".join(str(facts.get(k, "")) for k in
                    ("host", "cpu", "gpu", "framework", "device", "dtype", "threads"))


def cached_machine(framework: str = "numpy", device: str = "cpu", dtype: str = "float32",
                   threads: int | None = None) -> Machine | None:
    """The cached calibration for exactly these arguments (see :func:`calibrate`), else
    ``None``; nothing is measured.

    Raises:
        ValueError: a bad framework, device, dtype or thread count (the message names it).

    Example:
        >>> cached_machine("numpy", "cpu", "float64", threads=1) is None  # doctest: +SKIP
        True
    """
    return cached(machine_facts(framework, device, dtype, threads))


def cached(facts: dict[str, Any]) -> Machine | None:
    key = cache_key(facts)
    path = cache_path()
    entry = read_cache(path).get(key)
    if entry is None:
        return None
    try:
        cached = Machine.from_dict(entry, where=f"{path} [{key}]")
    except ValueError as err:
        warnings.warn(f"tracetorch: ignoring a damaged cache entry: {err}", stacklevel=3)
        return None
    return replace(cached, source=f"cache ({cached.source})")


def profile_target(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The ``framework``, ``device``, ``dtype`` and ``threads`` a profile ran with, from the
    facts it recorded (:func:`tracetorch.profiler.runinfo.run_facts`): the arguments of the
    calibration that fits it. What a profile did not record (an older file) is the default: numpy,
    cpu, float32, this process's threads; a dtype no calibration runs in (an integer model) is
    float32.

    Raises:
        ValueError: a recorded framework, device or thread count that is not one (the message
            names the ``meta`` key).

    Example:
        >>> profile_target({"framework": "torch", "device": "cpu", "dtype": "bfloat16",
        ...                 "threads": 4})
        {'framework': 'torch', 'device': 'cpu', 'dtype': 'bfloat16', 'threads': 4}
        >>> profile_target({})
        {'framework': 'numpy', 'device': 'cpu', 'dtype': 'float32', 'threads': None}
    """
    framework = meta.get("framework", "numpy")
    if framework not in FRAMEWORKS:
        raise ValueError(f'meta["framework"]: expected one of {FRAMEWORKS}, got {framework!r}')
    device = meta.get("device", "cpu")
    if not isinstance(device, str):
        raise ValueError(f'meta["device"]: expected a device name, got {device!r}')
    threads = meta.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f'meta["threads"]: expected a positive int, got {threads!r}')
    dtype = meta.get("dtype")
    return {"framework": framework, "device": device,
            "dtype": dtype if dtype in DTYPES[framework] else "float32", "threads": threads}


def read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        warnings.warn(f"tracetorch: ignoring the unreadable machine cache {path}: {err}",
                      stacklevel=3)
        return {}
    if not (isinstance(data, dict) and [data.get("format"), data.get("version")]
            == list(CACHE_FORMAT) and isinstance(data.get("machines"), dict)):
        warnings.warn(f"tracetorch: ignoring {path}: not a {CACHE_FORMAT[0]} file of version "
                      f"{CACHE_FORMAT[1]}", stacklevel=3)
        return {}
    return dict(data["machines"])


def write_cache(path: Path, entries: dict[str, Any]) -> None:
    data = {"format": CACHE_FORMAT[0], "version": CACHE_FORMAT[1], "machines": entries}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(partial, path)  # never a half-written cache, even with two writers
    except OSError as err:
        warnings.warn(f"tracetorch: could not write the machine cache {path}: {err}",
                      stacklevel=3)


def store(facts: dict[str, Any], machine: Machine) -> Path:
    """Keep ``machine`` as the calibration for ``facts``; the cache file it went to.

    The file is read again just before writing: another process may have added entries.
    """
    path = cache_path()
    entries = read_cache(path)
    entries[cache_key(facts)] = machine.to_dict()
    write_cache(path, entries)
    return path
