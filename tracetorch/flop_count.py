"""FLOPs of one forward pass, from an input shape alone.

Rather than re-deriving shapes by hand, :func:`count_flops` runs the model once on a zero input
of the given shape under the engine (:class:`tracetorch.profile` with timing off) and returns
what the engine's FLOP rules counted. It is therefore exact for every model whose forward runs on
such an input: branches, residuals, functional matmuls and custom rules included. FLOPs cover the
whole batch (every leading dimension), with FLOPs = 2 x MACs for matrix products.

Example:
    >>> import numpy as np
    >>> from tracetorch.core import Linear
    >>> count_flops(Linear(1024, 512), (1, 1024)) >= 2 * 1024 * 512
    True
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tracetorch.bench import as_callable
from tracetorch.introspect import check_shape, dummy_input, is_torch_module

__all__ = ("count_flops", "forward_flops_and_output")


def count_flops(model: Any, input_shape: Sequence[int]) -> int:
    """Total forward FLOPs of ``model`` on one zero-filled input of ``input_shape``.

    The model runs once, in its current mode (train/eval is not changed); a torch model runs
    under ``torch.no_grad()`` on ``torch.zeros`` of its parameters' dtype and device, anything
    else on a float32 ``tracetorch.core`` Tensor. Models that need integer inputs (token ids)
    should be profiled with a real input through :class:`tracetorch.profile` instead.

    Raises:
        ValueError: ``input_shape`` is not a non-empty sequence of positive ints.
        TypeError: ``model`` is neither callable nor has a ``forward``.

    Example:
        >>> from tracetorch.core import Linear
        >>> count_flops(Linear(4, 3), (7, 5, 4)) >= 2 * 4 * 3 * 35
        True
    """
    shape = check_shape(input_shape)
    flops, _ = forward_flops_and_output(model, dummy_input(model, shape))
    return flops


def forward_flops_and_output(model: Any, x: Any) -> tuple[int, Any]:
    """Run ``model(x)`` once under the engine: its forward FLOPs and its output.

    Example:
        >>> import numpy as np
        >>> from tracetorch.core import ReLU, Tensor
        >>> flops, out = forward_flops_and_output(ReLU(), Tensor(np.zeros((2, 3))))
        >>> out.shape
        (2, 3)
    """
    # Imported here: the engine imports the adapters, which a parameter count never needs.
    from tracetorch.profiler import profile

    call = as_callable(model, "model")
    with profile(model, timing=False, isolated=True) as prof:
        if is_torch_module(model):
            import torch  # a torch model exists, so torch is already imported

            with torch.no_grad():
                out = call(x)
        else:
            out = call(x)
    return prof.forward_flops, out
