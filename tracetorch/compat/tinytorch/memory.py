"""Bytes of tensors, and the Python/NumPy heap one forward pass allocates (tracemalloc).

Sizes are those a profile records per layer (:func:`tracetorch.models.tensors.nbytes`,
:mod:`tracetorch.records.memory`), so the facade's parameter and activation figures equal the
profile's ``param_bytes`` and ``input_bytes + output_bytes`` for the same call.

``tracemalloc`` sees allocations made through Python's allocators, which include NumPy arrays
(and so ``tracetorch.core``) but not torch's own CPU or device allocator: for a torch model the
traced figure is near zero and only the tensor sizes below are meaningful.

Example:
    >>> import numpy as np
    >>> peak, out = traced_peak_bytes(lambda a: a * 2, np.zeros(1000))
    >>> out.shape, peak >= 8000
    ((1000,), True)
"""
from __future__ import annotations

import tracemalloc
from typing import Any, Callable

import numpy as np

from tracetorch.models.params import iter_parameters
from tracetorch.models.tensors import nbytes, ndarray_of, numel
from tracetorch.tools.bench import as_callable

__all__ = ("parameter_bytes", "gradient_bytes", "activation_bytes",
           "traced_peak_bytes", "memory_report")

_MIB = 1024 * 1024


def parameter_bytes(model: Any) -> int:
    """Bytes of the model's distinct parameters (float32 assumed for array-less objects).

    Example:
        >>> import numpy as np
        >>> class Layer:
        ...     weight = np.zeros((1024, 1024), dtype=np.float32)
        >>> parameter_bytes(Layer()) / 2**20
        4.0
    """
    return sum(nbytes(p) or 4 * numel(p) for p in iter_parameters(model))


def gradient_bytes(model: Any) -> int:
    """Bytes one gradient per trainable parameter takes (a parameter without a
    ``requires_grad`` flag counts as trainable).

    Example:
        >>> import numpy as np
        >>> class Layer:
        ...     weight = np.zeros(10, dtype=np.float32)
        >>> gradient_bytes(Layer())
        40
    """
    return sum(nbytes(p) or 4 * numel(p) for p in iter_parameters(model)
               if getattr(p, "requires_grad", True))


def activation_bytes(x: Any, out: Any) -> int:
    """Bytes of the input plus the output, the output not counted again when it is a view of
    the input (an identity layer, eval-mode dropout).

    Example:
        >>> import numpy as np
        >>> a = np.zeros(10)
        >>> activation_bytes(a, a), activation_bytes(a, a + 1)
        (80, 160)
    """
    x_data, out_data = ndarray_of(x), ndarray_of(out)
    shared = x_data is not None and out_data is not None and np.shares_memory(x_data, out_data)
    return nbytes(x) + (0 if shared or out is x else nbytes(out))


def traced_peak_bytes(call: Callable[[Any], Any], x: Any) -> tuple[int, Any]:
    """Peak traced heap growth while running ``call(x)``, and its result.

    Tracing is started (and stopped) here only when the caller is not tracing already; a
    caller's session is left running, and its peak is not reset, so in that case the figure
    is an upper bound that may include the caller's earlier peak.

    Example:
        >>> import tracemalloc
        >>> _ = traced_peak_bytes(len, [1, 2])
        >>> tracemalloc.is_tracing()
        False
    """
    owns = not tracemalloc.is_tracing()
    if owns:
        tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        out = call(x)
        return max(0, tracemalloc.get_traced_memory()[1] - baseline), out
    finally:
        if owns:
            tracemalloc.stop()


def memory_report(model: Any, x: Any) -> tuple[dict[str, float], int]:
    """Memory of ``model(x)`` in MiB, and the bytes one call touches at least once.

    ``parameter_memory_mb``: distinct parameters. ``activation_memory_mb``: input plus output.
    ``peak_memory_mb``: parameters + input + the peak traced heap growth during the call (which
    holds the output and every temporary), never below parameters + activations (torch's
    allocator is invisible to tracemalloc). ``memory_efficiency``: (parameters + activations)
    over the peak, in [0, 1]; the rest of the peak is temporaries.

    Example:
        >>> import numpy as np
        >>> class Scale:
        ...     weight = np.ones(4, dtype=np.float32)
        ...     def forward(self, x):
        ...         return x * 2
        >>> report, touched = memory_report(Scale(), np.ones(4, dtype=np.float32))
        >>> touched, 0 < report["memory_efficiency"] <= 1
        (48, True)
    """
    params = parameter_bytes(model)
    traced, out = traced_peak_bytes(as_callable(model, "model"), x)
    activations = activation_bytes(x, out)
    peak = max(params + nbytes(x) + traced, params + activations)
    report = {
        "parameter_memory_mb": params / _MIB,
        "activation_memory_mb": activations / _MIB,
        "peak_memory_mb": peak / _MIB,
        "memory_efficiency": (params + activations) / peak if peak else 1.0,
    }
    return report, params + activations
