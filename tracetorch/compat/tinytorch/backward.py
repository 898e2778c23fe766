"""A measured training step (forward, then backward of the summed output) for the facade.

The loss is ``output.sum()``: it touches every output element once, so the backward pass is
the model's own, plus one reduction. Gradients already on the parameters are put back
afterwards, so profiling a model mid-training does not disturb its optimizer's next step.

Example:
    >>> train_step(lambda x: x, 1.0) is None     # no autograd graph: nothing to measure
    True
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

from tracetorch.models.params import iter_parameters
from tracetorch.tools.bench import as_callable

__all__ = ("train_step", "preserved_gradients", "step_flops")


def train_step(model: Any, x: Any) -> Callable[[Any], None] | None:
    """A callable running one forward and backward pass, or ``None`` when ``model(x)`` builds
    no autograd graph (no trainable parameters, or a framework without autograd).

    The probe runs one forward pass. Each step first drops the parameters' gradients, as
    ``zero_grad(set_to_none=True)`` does, so gradients do not pile up across steps.

    Example:
        >>> import numpy as np
        >>> from tracetorch.core import Linear, Tensor
        >>> step = train_step(Linear(4, 2), Tensor(np.ones((3, 4))))
        >>> step is not None
        True
    """
    call = as_callable(model, "model")
    out = call(x)
    if not getattr(out, "requires_grad", False) or not callable(getattr(out, "sum", None)):
        return None
    params = [p for p in iter_parameters(model) if hasattr(p, "grad")]

    def step(inputs: Any) -> None:
        for p in params:
            p.grad = None
        call(inputs).sum().backward()

    return step


@contextmanager
def preserved_gradients(model: Any) -> Iterator[None]:
    """Put every parameter's ``.grad`` back as it was on leaving the block.

    Example:
        >>> import numpy as np
        >>> class Layer:
        ...     weight = np.zeros(3)
        >>> with preserved_gradients(Layer()):
        ...     pass
    """
    saved: list[tuple[Any, Any]] = [(p, p.grad) for p in iter_parameters(model)
                                    if hasattr(p, "grad")]
    try:
        yield
    finally:
        for p, grad in saved:
            p.grad = grad


def step_flops(model: Any, step: Callable[[Any], None], x: Any) -> tuple[int, int]:
    """Forward and backward FLOPs of one ``step(x)``, as the engine counts them.

    Example:
        >>> import numpy as np
        >>> from tracetorch.core import Linear, Tensor
        >>> model, x = Linear(4, 2), Tensor(np.ones((3, 4)))
        >>> forward, backward = step_flops(model, train_step(model, x), x)
        >>> forward >= 2 * 3 * 4 * 2 and backward > 0
        True
    """
    from tracetorch.profiler import profile

    with profile(model, timing=False, isolated=True, memory=False) as prof:
        step(x)
    return prof.forward_flops, prof.backward_flops
