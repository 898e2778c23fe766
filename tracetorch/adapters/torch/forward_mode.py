"""Forward-mode AD inside a profile (``torch.func.jvp``, ``jacfwd``, ``hessian``,
``torch.autograd.forward_ad``): said, not silently counted short.

On a dual tensor each operation computes its tangent beside its value, inside torch's own
kernels (a product's tangent is another product per operand that has one): a layer's rule and
the operations the function mode counts see one call, the value's, so a Jacobian-vector product
through a Linear counted half the products that ran (``FlopCounterMode``, below autograd, counts
both). Every forward-mode computation starts by making dual tensors through
``torch.autograd.forward_ad.make_dual`` (``torch.func.jvp`` and ``jacfwd`` call it too), which
is watched while a profile is open: the first one of a profiling session warns, and a profile in
which one ran says so in ``meta["forward_ad"]`` (``{"dual_tensors": n}``, kept in a saved
profile) and in its report's summary. The FLOPs shown stay the values' computation.

Example:
    >>> import warnings, torch, tracetorch
    >>> lin = torch.nn.Linear(8, 4)
    >>> x, v = torch.ones(1, 8), torch.ones(1, 8)
    >>> with tracetorch.profile(lin) as prof, warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")             # (the first dual tensor warns)
    ...     _ = torch.func.jvp(lin, (x,), (v,))
    >>> prof.total_flops, prof.meta["forward_ad"]     # the value's product, 2·8·4
    (64, {'dual_tensors': 1})
"""
from __future__ import annotations

import sys
import warnings
from typing import Any, Callable

from tracetorch.adapters.torch.tracing import tracing
from tracetorch.engine.hotpath import innermost_frame
from tracetorch.engine.notes import register_note
from tracetorch.engine.patches import PatchBoard
from tracetorch.records.tree import CallNode

__all__ = ("forward_ad_facts", "start_forward_ad_watch")

#: The ``id`` of the node of the call each dual tensor was made in, since the profiles opened
#: (the last session's, once closed): a profile's root at its top level.
_MADE: list[int] = []


def forward_ad_facts(root: CallNode, meta: dict[str, Any]) -> None:
    """``meta["forward_ad"]`` of a closing profile whose tree ``root`` made dual tensors: how
    many (a note: :mod:`tracetorch.engine.notes`).

    Example:
        >>> meta = {}
        >>> forward_ad_facts(CallNode.root(), meta)
        >>> meta
        {}
    """
    inside = {id(node) for node in root.walk()}
    made = sum(1 for node in _MADE if node in inside)
    if made:
        meta["forward_ad"] = {"dual_tensors": made}


def start_forward_ad_watch(board: PatchBoard) -> None:
    """Watch ``torch.autograd.forward_ad.make_dual`` while ``board`` is open (it puts torch's
    own back when it closes): a profiling session starts with none made."""
    _MADE.clear()
    module = sys.modules.get("torch.autograd.forward_ad")
    original = vars(module).get("make_dual") if module is not None else None
    if callable(original):
        board.install(module, "make_dual", _watched(original))


def _watched(original: Callable[..., Any]) -> Callable[..., Any]:
    def make_dual(*args: Any, **kwargs: Any) -> Any:
        frame = innermost_frame()
        if frame is not None and frame.collector.active and not tracing():
            if not _MADE:
                warnings.warn(
                    "tracetorch: forward-mode AD (torch.func.jvp, jacfwd, torch.autograd."
                    "forward_ad) ran inside a profile: the FLOPs of the tangents it computes "
                    "beside each value are not counted, only the values' computation",
                    RuntimeWarning, stacklevel=2)
            _MADE.append(id(frame.node))
        return original(*args, **kwargs)

    return make_dual


register_note(forward_ad_facts)
