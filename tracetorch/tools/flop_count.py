"""FLOPs of one forward pass, from an input shape or from real inputs.

Rather than re-deriving shapes by hand, :func:`count_flops` runs the model once under the engine
(:func:`tracetorch.profiler.counting.count_forward`: what a profile with timing off counts, kept
as a running total) and returns what the engine's FLOP rules counted:
on a zero input of a given shape, or on the inputs the caller has (a tensor, token ids, a tuple
of arguments, a dict of keyword arguments). It is therefore exact for every model whose forward
runs on them: branches, residuals, functional matmuls and custom rules included. FLOPs cover the
whole batch (every leading dimension), with FLOPs = 2 x MACs for matrix products.

Example:
    >>> import numpy as np
    >>> from tracetorch.core import Linear
    >>> count_flops(Linear(1024, 512), (1, 1024)) >= 2 * 1024 * 512
    True
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tracetorch.models.introspect import is_torch_module
from tracetorch.models.tensors import check_shape, dummy_input
from tracetorch.tools.bench import as_callable

__all__ = ("count_flops", "forward_flops_and_output")


def count_flops(model: Any, inputs: Any) -> int:
    """Total forward FLOPs of ``model`` on one call.

    ``inputs`` is either a shape — a tuple or list of positive ints, for one zero-filled input:
    a torch model gets ``torch.zeros`` of its parameters' dtype and device, anything else a
    float32 ``tracetorch.core`` Tensor — or what the model is called with: a dict is passed as
    keyword arguments, any other tuple or list as positional arguments, anything else (a
    tensor, an array of token ids) as the one argument. The model runs once, in its current
    mode (train/eval is not changed); a torch model runs under ``torch.no_grad()``.

    Raises:
        ValueError: a shape (a tuple or list of numbers) with a dimension that is not a
            positive int.
        TypeError: ``model`` is neither callable nor has a ``forward``.

    Example:
        >>> import numpy as np
        >>> from tracetorch.core import Linear, Tensor
        >>> count_flops(Linear(4, 3), (7, 5, 4)) >= 2 * 4 * 3 * 35
        True
        >>> count_flops(Linear(4, 3), Tensor(np.ones((2, 4)))) == count_flops(Linear(4, 3), (2, 4))
        True
    """
    args, kwargs = _call_arguments(model, inputs)
    flops, _ = forward_flops_and_output(model, *args, **kwargs)
    return flops


def _is_shape(value: Any) -> bool:
    # A sequence of plain numbers is meant as a shape (and a bad one is reported as such).
    return isinstance(value, (tuple, list)) and all(
        isinstance(d, (int, float, np.number)) for d in value)


def _call_arguments(model: Any, inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if _is_shape(inputs):
        return (dummy_input(model, check_shape(inputs, "inputs")),), {}
    if isinstance(inputs, dict):
        if not all(isinstance(key, str) for key in inputs):
            raise TypeError("inputs: a dict of keyword arguments must have str keys")
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    if inputs is None:
        raise TypeError("inputs: expected a shape (a tuple of positive ints) or the model's "
                        "inputs (a tensor, a tuple of arguments, a dict of keyword arguments), "
                        "got None")
    return (inputs,), {}


def forward_flops_and_output(model: Any, *args: Any, **kwargs: Any) -> tuple[int, Any]:
    """Run ``model(*args, **kwargs)`` once under the engine: its forward FLOPs and its output.

    Example:
        >>> import numpy as np
        >>> from tracetorch.core import ReLU, Tensor
        >>> flops, out = forward_flops_and_output(ReLU(), Tensor(np.zeros((2, 3))))
        >>> out.shape
        (2, 3)
    """
    call = as_callable(model, "model")
    # Imported here: the engine imports the adapters, which a parameter count never needs.
    from tracetorch.profiler.counting import count_forward

    if is_torch_module(model):
        import torch  # a torch model exists, so torch is already imported

        def run() -> Any:
            with torch.no_grad():
                return call(*args, **kwargs)

        return count_forward(model, run)
    return count_forward(model, lambda: call(*args, **kwargs))
