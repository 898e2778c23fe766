"""One run of a model under the engine, read for its forward FLOPs alone: ``count_flops``'s.

A profile's opening keeps what a report needs (steps, a schedule, what an enclosing profile is
handed, the run's facts); a count needs none of it. :func:`count_forward` opens the engine the
way an isolated profile does — the patches and adapters on the board, the model's classes
wrapped, a recording of its own as this context's innermost — with a
:class:`~tracetorch.engine.tally.TallyCollector` recording, and closes it again, also when the
run raises (the exception passes through unchanged).

Example:
    >>> import numpy as np
    >>> from tracetorch.core import Linear, Tensor
    >>> layer = Linear(4, 3)
    >>> flops, out = count_forward(layer, lambda: layer(Tensor(np.ones((2, 4)))))
    >>> flops >= 2 * 2 * 4 * 3, out.shape
    (True, (2, 3))
"""
from __future__ import annotations

from typing import Any, Callable

from tracetorch.engine.hotpath import close_root, open_root
from tracetorch.engine.patches import BOARD
from tracetorch.engine.tally import TallyCollector
from tracetorch.profiler.block import ADAPTERS
from tracetorch.records.tree import CallNode

__all__ = ("count_forward",)


def count_forward(model: Any, run: Callable[[], Any]) -> tuple[int, Any]:
    """``run()``'s forward FLOPs, counted as a profile of ``model`` with ``timing=False``,
    ``memory=False`` and ``params=False`` would count them, and what it returned.

    Example:
        >>> from tracetorch.core import ReLU, Tensor
        >>> import numpy as np
        >>> relu = ReLU()
        >>> count_forward(relu, lambda: relu(Tensor(np.zeros((2, 3)))))[0]
        6
    """
    # int() is 0: a clock that never advances and costs no Python frame per call.
    collector = TallyCollector(CallNode.root(), model, clock=int, memory=False, params=False)
    BOARD.acquire(ADAPTERS.targets(model), on_first=ADAPTERS.open)
    try:
        ADAPTERS.configure(collector)
        opened = open_root(collector.start(collector.root))
        try:
            output = run()
        finally:
            close_root(collector, opened)
            collector.stop()
    finally:
        BOARD.release()
    # Nothing else reads this recording: freed now rather than by the cyclic garbage collector.
    collector.release()
    return collector.total, output
