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

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracetorch.analysis.machine import Machine
from tracetorch.analysis.machine_cache import (
    DTYPES,
    THREAD_VARIABLES,
    blas_threads,
    cached,
    machine_facts,
    profile_target,
    store,
)
from tracetorch.models.introspect import is_torch_module
from tracetorch.records.views import register_view
from tracetorch.text.units import format_per_second, format_time_ns
from tracetorch.tools.kits import Kit, kit_for

__all__ = ("calibrate", "measure", "resolve_machine", "measurement_lines", "CPU_SIZES",
           "CUDA_SIZES", "CPU_COPY_BYTES", "CUDA_COPY_BYTES")

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
#: The settings above, which a child process measuring numpy at another thread count is given
#: so that it measures as this process would.
_SETTINGS = ("CPU_SIZES", "CUDA_SIZES", "CPU_COPY_BYTES", "CUDA_COPY_BYTES", "MATMUL_SECONDS",
             "COPY_SECONDS", "OVERHEAD_CALLS")
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
        known = cached(facts)
        if known is not None:
            return known
    machine = measure(facts)
    path = store(facts, machine)
    if verbose:
        print("\n".join(measurement_lines(machine) + [f"  cached in {path}"]))
    return machine


def measure(facts: dict[str, Any]) -> Machine:
    """Time the matmuls, the copy and the trivial layer for ``facts`` (see
    :func:`machine_facts`); no cache is read or written.

    Example:
        >>> machine = measure(machine_facts("numpy"))  # doctest: +SKIP
        >>> machine.source.startswith("measured")      # doctest: +SKIP
        True
    """
    if facts["framework"] == "numpy" and facts["threads"] != blas_threads():
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
    env = dict(os.environ, **{name: str(facts["threads"]) for name in THREAD_VARIABLES})
    # The child imports this very tracetorch, installed or not.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (package_root, env.get("PYTHONPATH"))))
    request = json.dumps({"facts": facts, "settings": {name: globals()[name]
                                                       for name in _SETTINGS}})
    code = "import sys; from tracetorch.tools.calibrate import _child; _child(sys.argv[1])"
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
    if blas_threads() != facts["threads"]:  # never measure another count than asked
        raise SystemExit(f"numpy runs {blas_threads()} threads here, not {facts['threads']}")
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


# profile(machine="calibrate") and result.analyze("calibrate") resolve through this view: the
# profiler and the analyses sit below this module, which runs a profile.
register_view("resolve_machine", lambda: resolve_machine)
