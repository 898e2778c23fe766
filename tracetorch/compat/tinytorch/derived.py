"""Rates and rules of thumb derived from a profile's FLOPs, bytes and latency.

Nothing here is measured on the hardware: the bottleneck verdict compares the workload's
arithmetic intensity with an *assumed* machine ridge point, and the efficiency divides by an
*assumed* peak. Both assumptions are parameters and travel with the results that use them.

Example:
    >>> arithmetic_intensity(32e6, 2e6, ridge_point=9.6)["regime"]
    'compute'
"""
from __future__ import annotations

__all__ = (
    "BYTES_PER_FLOAT32",
    "KB_TO_BYTES",
    "MB_TO_BYTES",
    "ASSUMED_PEAK_GFLOPS",
    "ASSUMED_RIDGE_FLOPS_PER_BYTE",
    "arithmetic_intensity",
    "derived_metrics",
    "optimizer_memory_estimates",
)

BYTES_PER_FLOAT32 = 4
KB_TO_BYTES = 1024
#: "MB" throughout the facade means MiB, as in TinyTorch.
MB_TO_BYTES = 1024 * 1024
#: Heuristic placeholder (TinyTorch's), not a measured peak: pass your machine's own number.
ASSUMED_PEAK_GFLOPS = 100.0
#: Heuristic ridge point of the roofline (peak FLOP/s over memory bandwidth) of a typical CPU:
#: e.g. 1 TFLOP/s over 100 GB/s. Workloads below it are likely memory-bound.
ASSUMED_RIDGE_FLOPS_PER_BYTE = 10.0


def arithmetic_intensity(flops: float, bytes_moved: float,
                         ridge_point: float = ASSUMED_RIDGE_FLOPS_PER_BYTE
                         ) -> dict[str, float | str]:
    """FLOPs per byte and the roofline regime it falls in (a tie counts as compute-bound).

    Example:
        >>> arithmetic_intensity(1e6, 2e6, ridge_point=9.6)
        {'intensity': 0.5, 'ridge_point': 9.6, 'regime': 'memory'}
    """
    intensity = flops / max(bytes_moved, 1e-9)
    regime = "compute" if intensity >= ridge_point else "memory"
    return {"intensity": intensity, "ridge_point": ridge_point, "regime": regime}


def derived_metrics(flops: int, latency_s: float, bytes_touched: int,
                    peak_gflops: float = ASSUMED_PEAK_GFLOPS,
                    ridge_point: float = ASSUMED_RIDGE_FLOPS_PER_BYTE
                    ) -> dict[str, float | bool | str]:
    """Throughput, a lower bound on memory traffic, and the heuristic bottleneck of one call.

    ``bytes_touched`` is what a call must read or write at least once (parameters, input,
    output); ``memory_bandwidth_mbs`` is that over the latency, so a lower bound on real
    traffic. ``computational_efficiency`` is the achieved rate over ``peak_gflops``, capped at 1.
    A zero latency (a clock too coarse for the call) is taken as 1 ns.

    Example:
        >>> m = derived_metrics(1_000_000_000, 1.0, 100 * 1024 * 1024)
        >>> m["gflops_per_second"], m["memory_bandwidth_mbs"], m["bottleneck"]
        (1.0, 100.0, 'memory')
    """
    seconds = max(latency_s, 1e-9)
    gflops_per_second = flops / 1e9 / seconds
    regime = arithmetic_intensity(flops, bytes_touched, ridge_point)
    return {
        "gflops_per_second": gflops_per_second,
        "memory_bandwidth_mbs": bytes_touched / MB_TO_BYTES / seconds,
        "arithmetic_intensity": regime["intensity"],
        "computational_efficiency": min(gflops_per_second / peak_gflops, 1.0),
        "is_memory_bound": regime["regime"] == "memory",
        "is_compute_bound": regime["regime"] == "compute",
        "bottleneck": regime["regime"],
        "assumed_peak_gflops": peak_gflops,
        "assumed_ridge_flops_per_byte": ridge_point,
    }


def optimizer_memory_estimates(gradient_memory_mb: float) -> dict[str, float]:
    """Optimizer state beside the gradients: none for plain SGD, one buffer for momentum, two
    (first and second moments) for Adam and AdamW.

    Example:
        >>> optimizer_memory_estimates(100.0)
        {'sgd': 0.0, 'sgd_momentum': 100.0, 'adam': 200.0, 'adamw': 200.0}
    """
    return {"sgd": 0.0, "sgd_momentum": gradient_memory_mb, "adam": 2 * gradient_memory_mb,
            "adamw": 2 * gradient_memory_mb}
