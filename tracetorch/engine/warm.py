"""The nodes of a profile kept ready between its openings.

A profile opened again and again (a decorated training step, a schedule's steps) meets the same
layers under the same parents each time. When an opening stops, :class:`WarmNodes` remembers
each node it adopted, with a weak reference to the object called and its frame's settings, so
that the next opening takes it up again at the cost of a frame: no naming, no parameter count,
no rule's first call. A node is taken up only while its owner is the same object, under the
same parent node, with no ``instrument(flops=...)`` rule, and the FLOP registry unchanged.

Example:
    >>> from tracetorch.records.tree import CallNode
    >>> warm = WarmNodes()
    >>> warm.take(CallNode.root(), object(), None, 0) is None
    True
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

from tracetorch.records.tree import CallNode

if TYPE_CHECKING:
    from tracetorch.engine.hotpath import Frame

__all__ = ("WarmNodes",)

#: A remembered node: a weak reference to its owner, the node, its frame's ``ops`` and
#: ``observe``, and the rules' generation it was adopted at.
_Warm = tuple[weakref.ref, CallNode, bool, bool, int]

# Kinds whose nodes are found again by the object called (a thread's node by the thread).
_REMEMBERED_KINDS = frozenset({"module", "function", "optimizer", "backward"})


class WarmNodes:
    """Adopted nodes remembered by (parent node, object called) between openings."""

    def __init__(self) -> None:
        #: What the next opening can take up, by ``(id(parent node), id(owner))``.
        self.nodes: dict[tuple[int, int], _Warm] = {}

    def remember(self, node: CallNode, frame: Frame, generation: int) -> bool:
        """Keep ``node``, adopted with ``frame`` under its parent, for the next opening; False
        where it cannot be (a thread's node, an owner without weak references)."""
        if node.kind not in _REMEMBERED_KINDS or node.parent is None:
            return False
        try:
            ref = weakref.ref(frame.owner)
        except TypeError:  # no weak reference: adopted anew each opening
            return False
        self.nodes[(id(node.parent), id(frame.owner))] = (
            ref, node, frame.ops, frame.observe, generation)
        return True

    def take(self, parent: CallNode, owner: Any, flops_fn: Callable[..., int] | None,
             generation: int) -> tuple[CallNode, bool, bool] | None:
        """The node remembered for ``owner`` under ``parent``, with its frame's ``ops`` and
        ``observe``; ``None`` when there is none or it must be adopted anew (its owner, rule or
        place changed; its per-shape counters are dropped then)."""
        warm = self.nodes.pop((id(parent), id(owner)), None)
        if warm is None:
            return None
        ref, node, ops, observe, adopted_at = warm
        if (ref() is not owner or node.parent is not parent or flops_fn is not None
                or generation != adopted_at):
            node.engine.drop_counters()
            return None
        return node, ops, observe
