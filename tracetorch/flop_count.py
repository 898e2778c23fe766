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

from typing import Any, Sequence, Tuple

import numpy as np

from tracetorch.bench import as_callable
from tracetorch.params import is_torch_module

__all__ = ("count_flops", "forward_flops_and_output", "dummy_input", "check_shape")


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


def forward_flops_and_output(model: Any, x: Any) -> Tuple[int, Any]:
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


def dummy_input(model: Any, shape: Tuple[int, ...]) -> Any:
    """A zero input of ``shape`` in the model's framework, dtype and device.

    Example:
        >>> dummy_input(object(), (2, 3)).shape
        (2, 3)
    """
    if is_torch_module(model):
        import torch

        first = next(iter(model.parameters()), None)
        if first is None:
            return torch.zeros(shape)
        return torch.zeros(shape, dtype=first.dtype, device=first.device)
    from tracetorch.core.tensor import Tensor

    return Tensor(np.zeros(shape, dtype=np.float32))


def check_shape(input_shape: Any) -> Tuple[int, ...]:
    """``input_shape`` as a tuple, or a ValueError naming it.

    Example:
        >>> check_shape([2, 3])
        (2, 3)
    """
    valid = (isinstance(input_shape, (tuple, list)) and len(input_shape) > 0
             and all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0
                     for d in input_shape))
    if not valid:
        raise ValueError("input_shape: expected a non-empty tuple of positive ints, "
                         f"got {input_shape!r}")
    return tuple(int(d) for d in input_shape)
