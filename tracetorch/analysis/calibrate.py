"""Measure this machine's roofline: peak matmul FLOP/s, memory bandwidth, one layer call's cost.

:func:`calibrate` takes a few seconds and caches what it measured per machine, so every later
call (and ``profile(machine="calibrate")``) reads the cache:

- **peak FLOP/s**: square ``n x n`` matmuls for a few sizes (:data:`CPU_SIZES`, or
  :data:`CUDA_SIZES` on a GPU), each timed by :func:`tracetorch.tools.bench.benchmark`; the best
  median rate (``2 n^3`` FLOPs per product) is the peak;
- **bandwidth**: one large copy (:data:`CPU_COPY_BYTES`, well past any CPU cache; 1 GiB on a
  GPU): bytes read plus bytes written over the median time;
- **call overhead**: the median time a profile records for one call of a layer with no work to
  do (a ``Linear(1, 1)`` on one number), the floor under every layer's time; beside it, what the
  profiler adds to a call's wall time (``facts["profiling_cost_ns"]``).

The cache is ``$XDG_CACHE_HOME/tracetorch/machine.json`` (``~/.cache/tracetorch/`` without
``XDG_CACHE_HOME``), one entry per host, CPU model (and GPU), framework, device, dtype and thread
count; ``refresh=True`` (``tracetorch calibrate --refresh``) measures again.

A profile is measured against the calibration that fits it: :func:`profile_target` reads the
framework, device, dtype and thread count the profile recorded (see
:mod:`tracetorch.profiler.runinfo`), :func:`cached_machine` finds the cache entry for them and
:func:`calibrate` measures them once when there is none. numpy's BLAS fixes its thread count when
numpy loads, so numpy at another count than this process runs is measured in a child process started
with that count.

Example:
    >>> import tracetorch
    >>> user = tracetorch.Machine(peak_flops=989e12, bandwidth_bytes_per_s=3.35e12,
    ...                           source="H100 SXM datasheet, dense bf16")
    >>> resolve_machine(user) is user, resolve_machine(None)
    (True, None)
"""
from __future__ import annotations

import functools
import json
import os
import platform
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from tracetorch.analysis.kits import Kit, import_torch, kit_for
from tracetorch.analysis.machine import Machine
from tracetorch.models.introspect import is_torch_module
from tracetorch.text.units import format_per_second, format_time_ns

__all__ = ("calibrate", "cached_machine", "measure", "machine_facts", "profile_target",
           "cache_path", "resolve_machine", "measurement_lines", "FRAMEWORKS", "DTYPES",
           "CPU_SIZES", "CUDA_SIZES", "CPU_COPY_BYTES", "CUDA_COPY_BYTES", "CACHE_FORMAT")

FRAMEWORKS = ("numpy", "torch")
#: The dtypes each framework can be calibrated in.
DTYPES = {"numpy": ("float16", "float32", "float64"),
          "torch": ("float16", "bfloat16", "float32", "float64")}
#: Matmul sizes timed on a CPU, and on a GPU (large enough to fill one).
CPU_SIZES = (256, 512, 1024, 2048)
CUDA_SIZES = (1024, 2048, 4096, 8192)
#: Bytes of each of the two buffers of the bandwidth copy.
CPU_COPY_BYTES = 256 * 2**20
CUDA_COPY_BYTES = 2**30
#: Timed seconds per matmul size and for the copy (after one untimed call).
MATMUL_SECONDS = 0.15
COPY_SECONDS = 0.3
#: Calls of the trivial layer recorded to find one call's fixed cost.
OVERHEAD_CALLS = 2_000
#: The cache file's format name and version.
CACHE_FORMAT = ("tracetorch-machine-cache", 1)
#: The settings above, which a child process measuring numpy at another thread count is given
#: so that it measures as this process would.
_SETTINGS = ("CPU_SIZES", "CUDA_SIZES", "CPU_COPY_BYTES", "CUDA_COPY_BYTES", "MATMUL_SECONDS",
             "COPY_SECONDS", "OVERHEAD_CALLS")
#: The environment variables numpy's BLAS reads its thread count from when it loads.
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def cache_path() -> Path:
    """Where measured machines are kept: ``$XDG_CACHE_HOME/tracetorch/machine.json``.

    Example:
        >>> cache_path().name
        'machine.json'
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tracetorch" / "machine.json"


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str:
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


def _blas_threads() -> int:
    # numpy's BLAS reads its thread count from the environment when it loads, else uses all cores.
    for name in _THREAD_VARIABLES:
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
    facts: dict[str, Any] = {"host": socket.gethostname(), "cpu": _cpu_model(),
                             "framework": framework, "device": device, "dtype": dtype}
    if framework == "numpy":
        if device != "cpu":
            raise ValueError(f"device: numpy runs on the CPU only, got {device!r}")
        # Another count than this process runs is measured in a child process (see measure).
        facts["threads"] = threads if threads is not None else _blas_threads()
        return facts
    torch = import_torch()
    if device != "cpu":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asked for, but torch.cuda.is_available() "
                             "is False")
        facts["gpu"] = torch.cuda.get_device_name(torch.device(device))
    facts["threads"] = threads if threads is not None else torch.get_num_threads()
    return facts


def _cache_key(facts: dict[str, Any]) -> str:
    return "|".join(str(facts.get(k, "")) for k in
                    ("host", "cpu", "gpu", "framework", "device", "dtype", "threads"))


def calibrate(framework: str = "numpy", device: str = "cpu", dtype: str = "float32",
              threads: int | None = None, refresh: bool = False,
              verbose: bool = True) -> Machine:
    """This machine's peaks for ``framework`` on ``device`` in ``dtype``: cached, else measured.

    A measurement takes a few seconds, prints what it found (``verbose``) and is cached (see
    the module docstring); ``refresh=True`` measures again and replaces the cached entry.
    ``threads`` (default: the count this process runs) is set with ``torch.set_num_threads``
    while measuring torch; numpy at another count than this process runs is measured in a
    child process started with it.

    Raises:
        ValueError: a bad framework, device, dtype or thread count (the message names it).

    Example:
        >>> import tracetorch
        >>> machine = tracetorch.calibrate(verbose=False)  # doctest: +SKIP
        >>> machine.peak_flops > 0                         # doctest: +SKIP
        True
    """
    if not isinstance(refresh, bool):
        raise ValueError(f"refresh: expected True or False, got {refresh!r}")
    facts = machine_facts(framework, device, dtype, threads)
    if not refresh:
        cached = _cached(facts)
        if cached is not None:
            return cached
    machine = measure(facts)
    path = cache_path()
    entries = _read_cache(path)  # read again: another process may have added entries since
    entries[_cache_key(facts)] = machine.to_dict()
    _write_cache(path, entries)
    if verbose:
        print("\n".join(measurement_lines(machine) + [f"  cached in {path}"]))
    return machine


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
    return _cached(machine_facts(framework, device, dtype, threads))


def _cached(facts: dict[str, Any]) -> Machine | None:
    key = _cache_key(facts)
    path = cache_path()
    entry = _read_cache(path).get(key)
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


def _read_cache(path: Path) -> dict[str, Any]:
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


def _write_cache(path: Path, entries: dict[str, Any]) -> None:
    data = {"format": CACHE_FORMAT[0], "version": CACHE_FORMAT[1], "machines": entries}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(partial, path)  # never a half-written cache, even with two writers
    except OSError as err:
        warnings.warn(f"tracetorch: could not write the machine cache {path}: {err}",
                      stacklevel=3)


def measure(facts: dict[str, Any]) -> Machine:
    """Time the matmuls, the copy and the trivial layer for ``facts`` (see
    :func:`machine_facts`); no cache is read or written.

    Example:
        >>> machine = measure(machine_facts("numpy"))  # doctest: +SKIP
        >>> machine.source.startswith("measured")      # doctest: +SKIP
        True
    """
    if facts["framework"] == "numpy" and facts["threads"] != _blas_threads():
        return _measure_in_child(facts)
    started = time.perf_counter()
    kit = kit_for(facts)
    with kit:
        rates = {}
        for n in CUDA_SIZES if kit.cuda else CPU_SIZES:
            seconds = kit.time(kit.matmul(n), MATMUL_SECONDS)
            rates[str(n)] = 2.0 * n**3 / seconds
        copy_bytes = CUDA_COPY_BYTES if kit.cuda else CPU_COPY_BYTES
        bandwidth = 2.0 * copy_bytes / kit.time(kit.copy(copy_bytes), COPY_SECONDS)
        call_ns, cost_ns = _call_overhead(kit)
    facts = dict(facts, matmul_flops_by_size=rates, copy_bytes=copy_bytes,
                 profiling_cost_ns=cost_ns, seconds=round(time.perf_counter() - started, 2))
    return Machine(peak_flops=max(rates.values()), bandwidth_bytes_per_s=bandwidth,
                   call_overhead_ns=call_ns, source=f"measured {time.strftime('%Y-%m-%d %H:%M')}",
                   facts=facts)


def _measure_in_child(facts: dict[str, Any]) -> Machine:
    """numpy at ``facts["threads"]``, measured by a child process whose BLAS loads with that
    count, with this module's settings; it answers with the machine as JSON on stdout."""
    env = dict(os.environ, **{name: str(facts["threads"]) for name in _THREAD_VARIABLES})
    # The child imports this very tracetorch, installed or not.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (package_root, env.get("PYTHONPATH"))))
    request = json.dumps({"facts": facts, "settings": {name: globals()[name]
                                                       for name in _SETTINGS}})
    code = "import sys; from tracetorch.analysis.calibrate import _child; _child(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", code, request], env=env, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tracetorch: measuring numpy at {facts['threads']} threads in a "
                           f"child process failed (status {done.returncode}): "
                           f"{done.stderr.strip()[-2000:]}")
    return Machine.from_dict(json.loads(done.stdout), where="the child's measurement")


def _child(request: str) -> None:
    """The child of :func:`_measure_in_child`: measure ``request``'s facts, print JSON."""
    asked = json.loads(request)
    globals().update({name: tuple(value) if isinstance(value, list) else value
                      for name, value in asked["settings"].items() if name in _SETTINGS})
    facts = asked["facts"]
    if _blas_threads() != facts["threads"]:  # never measure another count than asked
        raise SystemExit(f"numpy runs {_blas_threads()} threads here, not {facts['threads']}")
    print(json.dumps(measure(facts).to_dict()))


def _call_overhead(kit: Kit) -> tuple[float, float]:
    """The median time a profile records for one trivial call, and what profiling adds to its
    wall time (both in ns)."""
    from tracetorch.profiler import profile  # the profiler imports this module for machine=

    layer, x = kit.trivial_layer()
    plain_ns = kit.time(lambda: layer(x), 0.05) * 1e9
    with profile(layer, warn_unsupported=False) as prof:
        start = time.perf_counter_ns()
        for _ in range(OVERHEAD_CALLS):
            layer(x)
        kit.sync()
        profiled_ns = (time.perf_counter_ns() - start) / OVERHEAD_CALLS
    node = next(iter(prof.root.children.values()))
    return float(node.time.quantile(0.5)), max(0.0, profiled_ns - plain_ns)


def measurement_lines(machine: Machine) -> list[str]:
    """What a calibration found, for people: the machine, each matmul size, copy and call.

    Example:
        >>> m = Machine(2e11, 1e10, 2_500, source="measured 2026-01-02 10:00",
        ...             facts={"framework": "numpy", "device": "cpu", "dtype": "float32",
        ...                    "threads": 2, "matmul_flops_by_size": {"256": 1e11, "512": 2e11},
        ...                    "copy_bytes": 2**28, "profiling_cost_ns": 1_200})
        >>> lines = measurement_lines(m)
        >>> lines[0] == "tracetorch machine: " + m.describe()
        True
        >>> print("\\n".join(lines[1:]))
          matmul n x n: n=256 100 GFLOP/s, n=512 200 GFLOP/s (peak: the best)
          copy of 256 MiB: 10.0 GB/s (bytes read + written)
          one trivial layer call: 2.50 us as a profile records it; profiling adds 1.20 us
    """
    facts = machine.facts
    lines = [f"tracetorch machine: {machine.describe()}"]
    rates = facts.get("matmul_flops_by_size")
    if isinstance(rates, dict) and rates:
        lines.append("  matmul n x n: " + ", ".join(
            f"n={n} {format_per_second(rate, 'FLOP')}"
            for n, rate in sorted(rates.items(), key=lambda item: int(item[0])))
            + " (peak: the best)")
    if "copy_bytes" in facts:
        lines.append(f"  copy of {facts['copy_bytes'] // 2**20} MiB: "
                     f"{format_per_second(machine.bandwidth_bytes_per_s, 'B')} "
                     "(bytes read + written)")
    if machine.call_overhead_ns and "profiling_cost_ns" in facts:
        lines.append(f"  one trivial layer call: {format_time_ns(machine.call_overhead_ns)} as "
                     f"a profile records it; profiling adds "
                     f"{format_time_ns(facts['profiling_cost_ns'])}")
    return lines


def resolve_machine(machine: Any, model: Any = None, argument: str = "machine",
                    meta: Mapping[str, Any] | None = None) -> Machine | None:
    """``machine`` as a :class:`Machine`: itself, ``None``, or for ``"calibrate"`` the cached
    (else measured) machine that fits: the profile's recorded framework, device, dtype and
    threads when ``meta`` is given (:func:`profile_target`), else ``model``'s framework, device
    and dtype (without a model: torch float32 when the program imported torch, numpy float32
    otherwise).

    Raises:
        TypeError: anything else (the message names ``argument``).
    """
    if machine is None or isinstance(machine, Machine):
        return machine
    if machine != "calibrate":
        raise TypeError(f"{argument}: expected a tracetorch.Machine, 'calibrate' or None, "
                        f"got {machine!r}")
    if meta is not None:
        return calibrate(**profile_target(meta))
    if model is None and "torch" in sys.modules:  # as the profile's run facts will say
        return calibrate("torch")
    if not is_torch_module(model):
        return calibrate()
    param = next(iter(model.parameters()), None)
    if param is None:
        return calibrate("torch")
    dtype = str(param.dtype).replace("torch.", "")
    device = "cpu" if param.device.type == "cpu" else str(param.device)
    return calibrate("torch", device, dtype if dtype in DTYPES["torch"] else "float32")
