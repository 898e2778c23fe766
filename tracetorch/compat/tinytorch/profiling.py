"""TinyTorch's ``Profiler``, API-compatible: ``from tracetorch.perf.profiling import Profiler``.

The TinyTorch guide's example runs unchanged with ``tinytorch`` replaced by ``tracetorch``.
Where TinyTorch was unclear or wrong, tracetorch's conventions hold instead:

* FLOPs cover the **whole batch** (every leading dimension), 2 FLOPs per multiply-add.
* ``measure_latency`` returns **mean seconds** per call (the guide's unit), timed as one block
  with the garbage collector off; ``tracetorch.tools.bench.benchmark`` gives medians and spread.
* ``measurements`` keys never overwrite: a second ``Linear`` profiled is ``"Linear_2"``.
* The backward pass is measured with real autograd when the model has it.
* Bottleneck and efficiency figures are heuristics against *assumed* hardware numbers
  (:data:`ASSUMED_PEAK_GFLOPS`, :data:`ASSUMED_RIDGE_FLOPS_PER_BYTE`) and say so.

Example:
    >>> from tracetorch.core import Linear
    >>> profiler = Profiler()
    >>> profiler.count_parameters(Linear(1024, 512))
    524800
    >>> profiler._count_linear_flops(Linear(1024, 512), input_shape=(1, 1024))
    1048576
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from tracetorch.compat.tinytorch.analytic import (
    conv2d_layer_flops,
    flops_and_output_shape,
    layer_parameter_count,
    linear_layer_flops,
    walk_layers,
)
from tracetorch.compat.tinytorch.backward import preserved_gradients, step_flops, train_step
from tracetorch.compat.tinytorch.derived import (
    ASSUMED_PEAK_GFLOPS,
    ASSUMED_RIDGE_FLOPS_PER_BYTE,
    BYTES_PER_FLOAT32,
    KB_TO_BYTES,
    MB_TO_BYTES,
    arithmetic_intensity,
    derived_metrics,
    optimizer_memory_estimates,
)
from tracetorch.compat.tinytorch.memory import gradient_bytes, memory_report
from tracetorch.compat.tinytorch.weights import analyze_weight_distribution
from tracetorch.models.params import count_parameters as _count_parameters
from tracetorch.models.tensors import check_shape, dummy_input
from tracetorch.profiler import profile
from tracetorch.tools import bench

__all__ = (
    "BYTES_PER_FLOAT32",
    "KB_TO_BYTES",
    "MB_TO_BYTES",
    "ASSUMED_PEAK_GFLOPS",
    "ASSUMED_RIDGE_FLOPS_PER_BYTE",
    "Profiler",
    "quick_profile",
    "analyze_weight_distribution",
    "arithmetic_intensity",
)

# TinyTorch also exposes its helpers at module level
# (``from ...profiling import _count_conv_flops``).
_count_layer_parameters = layer_parameter_count
_count_linear_flops = linear_layer_flops
_count_conv_flops = conv2d_layer_flops


class Profiler:
    """Parameters, FLOPs, latency and memory of a model, and a record of what was measured.

    Attributes:
        measurements: every ``profile_*`` report, keyed by a unique name (the class name, then
            ``"Linear_2"``, ``"Linear_3"``... for later models of the same class).
        operation_counts: how often each public method ran (including the calls the
            ``profile_*`` methods make) and, after ``with profiler:``, how often each layer type
            was called inside the block.
        prof: the engine's :class:`tracetorch.profile` of the last ``with`` block (also
            ``result``): the full call tree with per-layer FLOPs and times.
        elapsed: seconds the last ``with`` block took (``None`` before one has ended).

    Example:
        >>> import numpy as np
        >>> from tracetorch.core import Linear, Tensor
        >>> model = Linear(4, 3)
        >>> with Profiler() as p:
        ...     _ = model(Tensor(np.ones((2, 4))))
        >>> p.operation_counts["Linear"], p.elapsed > 0
        (1, True)
    """

    def __init__(self, peak_gflops: float = ASSUMED_PEAK_GFLOPS,
                 ridge_flops_per_byte: float = ASSUMED_RIDGE_FLOPS_PER_BYTE) -> None:
        self.measurements: dict[str, dict[str, Any]] = {}
        self.operation_counts: defaultdict[str, int] = defaultdict(int)
        self.peak_gflops = peak_gflops
        self.ridge_flops_per_byte = ridge_flops_per_byte
        self.prof: profile | None = None
        self.elapsed: float | None = None
        self._start_ns: int | None = None

    @property
    def result(self) -> profile | None:
        """The engine's profile of the last ``with`` block (the same object as ``prof``)."""
        return self.prof

    # ---------------------------------------------------------------- context manager
    def __enter__(self) -> Profiler:
        if self._start_ns is not None:
            raise RuntimeError("this Profiler is already in a with block; use a second Profiler "
                               "to nest")
        self.prof = profile()
        self.prof.__enter__()
        self._start_ns = time.perf_counter_ns()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._start_ns is None or self.prof is None:
            raise RuntimeError("Profiler.__exit__ called without __enter__")
        self.elapsed = (time.perf_counter_ns() - self._start_ns) / 1e9
        self._start_ns = None
        self.prof.__exit__(*exc_info)
        for type_name, row in self.prof.by_type().items():
            self.operation_counts[type_name] += row.calls

    # ---------------------------------------------------------------- parameters
    def count_parameters(self, model: Any) -> int:
        """Distinct parameters of ``model`` (see :func:`tracetorch.count_parameters`).

        Example:
            >>> from tracetorch.core import Linear
            >>> Profiler().count_parameters(Linear(10, 5))
            55
        """
        self.operation_counts["count_parameters"] += 1
        return _count_parameters(model)

    def _count_layer_parameters(self, layer: Any) -> int:
        """Elements of ``layer.weight`` plus those of ``layer.bias``, each if present.

        Example:
            >>> from tracetorch.core import Linear
            >>> Profiler()._count_layer_parameters(Linear(8, 4, bias=False))
            32
        """
        return layer_parameter_count(layer)

    # ---------------------------------------------------------------- FLOPs
    def count_flops(self, model: Any, input_shape: Sequence[int]) -> int:
        """FLOPs of one forward pass on an input of ``input_shape``, whole batch.

        ``tracetorch.core`` ``Linear`` and ``Conv2d`` (and their subclasses) use the closed
        forms of TinyTorch (matmul/convolution only, no bias); a ``Sequential``, or a
        forward-less object with a ``layers`` list, is walked layer by layer with shapes
        propagated; anything else runs once on a zero input under the engine, which counts
        every operation (see :func:`tracetorch.compat.tinytorch.analytic.flops_and_output_shape`).

        Raises:
            ValueError: ``input_shape`` is not a non-empty tuple of positive ints.

        Example:
            >>> from tracetorch.core import Linear, ReLU, Sequential
            >>> model = Sequential(Linear(4, 3), ReLU(), Linear(3, 2))
            >>> Profiler().count_flops(model, (7, 4))   # 7 x (24 + 3 + 12)
            273
        """
        self.operation_counts["count_flops"] += 1
        return flops_and_output_shape(model, check_shape(input_shape))[0]

    def _count_linear_flops(self, model: Any, input_shape: Sequence[int]) -> int:
        """``2 * in * out * rows``; see
        :func:`tracetorch.compat.tinytorch.analytic.linear_layer_flops`.

        Example:
            >>> from tracetorch.core import Linear
            >>> Profiler()._count_linear_flops(Linear(128, 64), (32, 128))
            524288
        """
        return linear_layer_flops(model, input_shape)

    def _count_conv_flops(self, model: Any, input_shape: Sequence[int]) -> int:
        """``2 * kh * kw * in * out * oh * ow * batch``; see
        :func:`tracetorch.compat.tinytorch.analytic.conv2d_layer_flops`.

        Example:
            >>> from tracetorch.core import Conv2d
            >>> Profiler()._count_conv_flops(Conv2d(3, 16, 3), (1, 3, 32, 32))
            777600
        """
        return conv2d_layer_flops(model, input_shape)

    def _count_sequential_flops(self, model: Any, input_shape: Sequence[int]) -> int:
        """Sum over ``model.layers``, each layer seeing the shape its predecessor produced.

        Example:
            >>> from tracetorch.core import Linear, Sequential
            >>> Profiler()._count_sequential_flops(
            ...     Sequential(Linear(128, 64), Linear(64, 10)), (1, 128))
            17664
        """
        return walk_layers(model, check_shape(input_shape))[0]

    # ---------------------------------------------------------------- time and memory
    def measure_latency(self, model: Any, input_tensor: Any, warmup: int = 10,
                        iterations: int = 100) -> float:
        """Mean seconds per call; see :func:`tracetorch.tools.bench.measure_latency`.

        Example:
            >>> from tracetorch.core import Linear
            >>> 0 < Profiler().measure_latency(Linear(8, 4), (4, 8), warmup=2, iterations=5) < 1
            True
        """
        self.operation_counts["measure_latency"] += 1
        return bench.measure_latency(model, input_tensor, warmup=warmup, iterations=iterations)

    def measure_memory(self, model: Any, input_shape: Sequence[int]) -> dict[str, float]:
        """Memory of one forward pass on a random input of ``input_shape``, in MiB.

        Keys: ``parameter_memory_mb`` (distinct parameters), ``activation_memory_mb`` (input
        plus output), ``peak_memory_mb`` (parameters + input + the peak Python/NumPy heap growth
        during the call, traced with ``tracemalloc``; never below parameters + activations,
        since torch's allocator is invisible to tracemalloc) and ``memory_efficiency``
        (parameters + activations over peak, in [0, 1]: the rest is temporaries). A caller's
        own tracemalloc session is left running; otherwise tracing is stopped again, also
        when the model raises.

        Example:
            >>> from tracetorch.core import Linear
            >>> m = Profiler().measure_memory(Linear(20, 10), (10, 20))
            >>> round(m["parameter_memory_mb"] * 2**20)
            840
        """
        self.operation_counts["measure_memory"] += 1
        shape = check_shape(input_shape)
        return memory_report(model, dummy_input(model, shape, seed=0))[0]

    # ---------------------------------------------------------------- reports
    def profile_layer(self, layer: Any, input_shape: Sequence[int]) -> dict[str, Any]:
        """Type, parameters, FLOPs, latency, throughput and memory of one layer.

        Example:
            >>> from tracetorch.core import Linear
            >>> report = Profiler().profile_layer(Linear(8, 4), (4, 8))
            >>> report["layer_type"], report["flops"]
            ('Linear', 256)
        """
        self.operation_counts["profile_layer"] += 1
        shape = check_shape(input_shape)
        x = dummy_input(layer, shape, seed=0)
        memory, _ = memory_report(layer, x)
        flops = self.count_flops(layer, shape)
        latency_s = self.measure_latency(layer, x, warmup=3, iterations=10)
        report = {"layer_type": type(layer).__name__,
                  "parameters": self.count_parameters(layer),
                  "flops": flops,
                  "latency_ms": latency_s * 1e3,
                  "gflops_per_second": flops / 1e9 / max(latency_s, 1e-9),
                  **memory}
        self._store(layer, report)
        return report

    def profile_forward_pass(self, model: Any, input_tensor: Any) -> dict[str, Any]:
        """Parameters, FLOPs, latency, memory, throughput and a heuristic bottleneck.

        ``input_tensor`` may also be a shape tuple (a random input is made). ``flops`` covers
        the whole batch; ``batch_flops`` is the same number under TinyTorch's name.
        ``memory_bandwidth_mbs`` is the bytes a call must touch at least once (parameters,
        input, output) over the latency: a lower bound on real traffic. ``bottleneck`` compares
        FLOPs per touched byte with ``ridge_flops_per_byte`` and ``computational_efficiency``
        divides by ``peak_gflops``: both assumed, not measured.

        Example:
            >>> import numpy as np
            >>> from tracetorch.core import Linear, Tensor
            >>> report = Profiler().profile_forward_pass(Linear(16, 8), Tensor(np.ones((4, 16))))
            >>> report["flops"], report["bottleneck"] in ("memory", "compute")
            (1024, True)
        """
        self.operation_counts["profile_forward_pass"] += 1
        x = self._as_input(model, input_tensor)
        shape = tuple(x.shape)
        flops = self.count_flops(model, shape)
        memory, touched = memory_report(model, x)
        latency_s = self.measure_latency(model, x, warmup=5, iterations=20)
        report = {"parameters": self.count_parameters(model),
                  "flops": flops,
                  "batch_flops": flops,
                  "latency_ms": latency_s * 1e3,
                  **memory,
                  **derived_metrics(flops, latency_s, touched, self.peak_gflops,
                                    self.ridge_flops_per_byte)}
        self._store(model, report)
        return report

    def profile_backward_pass(self, model: Any, input_tensor: Any) -> dict[str, Any]:
        """Forward report plus a training step: forward + backward of ``output.sum()``.

        With autograd (``tracetorch.core`` or torch, trainable parameters), the step's time is
        measured (``backward_measured``) and its backward FLOPs are the engine's count
        (``backward_flops_source``); what cannot be measured is estimated as TinyTorch did,
        backward = 2x forward. The parameters' existing gradients are restored afterwards.
        ``gradient_memory_mb`` is one gradient per trainable parameter;
        ``optimizer_memory_estimates`` adds optimizer state per optimizer. The report is stored
        as ``"<Class> (backward)"`` beside the forward report.

        Example:
            >>> import numpy as np
            >>> from tracetorch.core import Linear, Tensor
            >>> report = Profiler().profile_backward_pass(Linear(8, 4), Tensor(np.ones((4, 8))))
            >>> report["backward_measured"], report["backward_flops"] > 0
            (True, True)
        """
        self.operation_counts["profile_backward_pass"] += 1
        x = self._as_input(model, input_tensor)
        forward = self.profile_forward_pass(model, x)
        forward_s = forward["latency_ms"] / 1e3
        # TinyTorch's rule of thumb stands in for whatever cannot be measured.
        backward_flops, flops_source = 2 * forward["flops"], "estimated (2x forward)"
        step_s = 3 * forward_s
        with preserved_gradients(model):
            step = train_step(model, x)
            if step is not None:
                step_s = self.measure_latency(step, x, warmup=2, iterations=10)
                measured = step_flops(model, step, x)[1]
                if measured:  # 0 when the engine has no backward counts for this framework
                    backward_flops, flops_source = measured, "measured"
        gradient_mb = gradient_bytes(model) / MB_TO_BYTES
        total_flops = forward["flops"] + backward_flops
        report = {
            "forward_flops": forward["flops"],
            "forward_latency_ms": forward["latency_ms"],
            "forward_memory_mb": forward["peak_memory_mb"],
            "backward_flops": backward_flops,
            "backward_latency_ms": max(step_s - forward_s, 0.0) * 1e3,
            "backward_measured": step is not None,
            "backward_flops_source": flops_source,
            "gradient_memory_mb": gradient_mb,
            "total_flops": total_flops,
            "total_latency_ms": step_s * 1e3,
            "total_memory_mb": (forward["parameter_memory_mb"] + forward["activation_memory_mb"]
                                + gradient_mb),
            "total_gflops_per_second": total_flops / 1e9 / max(step_s, 1e-9),
            "optimizer_memory_estimates": optimizer_memory_estimates(gradient_mb),
            "memory_efficiency": forward["memory_efficiency"],
            "bottleneck": forward["bottleneck"],
        }
        self._store(model, report, suffix=" (backward)")
        return report

    def _as_input(self, model: Any, input_tensor: Any) -> Any:
        if isinstance(input_tensor, tuple) and not hasattr(input_tensor, "numel"):
            return dummy_input(model, check_shape(input_tensor), seed=0)
        return input_tensor

    def _store(self, model: Any, report: dict[str, Any], suffix: str = "") -> None:
        name = key = type(model).__name__ + suffix
        n = 1
        while key in self.measurements:
            n += 1
            key = f"{name}_{n}"
        self.measurements[key] = report


def quick_profile(model: Any, input_tensor: Any, profiler: Profiler | None = None
                  ) -> dict[str, Any]:
    """Profile one forward pass, print a short summary with units, and return the report.

    Example:
        >>> from tracetorch.core import Linear
        >>> report = quick_profile(Linear(16, 8), (8, 16))   # doctest: +ELLIPSIS
        Quick profile of Linear
        ...
        >>> report["parameters"]
        136
    """
    profiler = profiler if profiler is not None else Profiler()
    r = profiler.profile_forward_pass(model, input_tensor)
    print(f"Quick profile of {type(model).__name__}")
    print(f"  Parameters:  {r['parameters']:,}")
    print(f"  FLOPs:       {r['flops']:,} (one forward pass, whole batch)")
    print(f"  Latency:     {r['latency_ms']:.3f} ms (mean per forward pass)")
    print(f"  Throughput:  {r['gflops_per_second']:.3f} GFLOP/s")
    print(f"  Peak memory: {r['peak_memory_mb']:.3f} MiB (parameters + traced Python/NumPy heap)")
    print(f"  Heuristic bottleneck (not hardware measured): {r['bottleneck']} "
          f"({r['arithmetic_intensity']:.2f} FLOPs/byte vs assumed ridge "
          f"{r['assumed_ridge_flops_per_byte']:g})")
    print(f"  Efficiency vs assumed {r['assumed_peak_gflops']:g} GFLOP/s peak (heuristic): "
          f"{r['computational_efficiency']:.1%}")
    return r
