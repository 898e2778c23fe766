"""What the engine keeps for one node of the call tree while profiles record it.

A :class:`~tracetorch.records.tree.CallNode` is the record a user reads; the working state
the engine needs to record into it — the per-key counters the hot path bumps, each child's
open-call record by caller, the FLOP rule's standing, the tensor operations charged since the
last fold — is this object, the node's ``engine``. Importing this module registers it with the
tree (:func:`tracetorch.records.tree.set_engine_state`), so every node made once the engine is
loaded carries one.

Example:
    >>> from tracetorch.records.tree import CallNode
    >>> state = CallNode.root().engine
    >>> state.rule_state, state.op_flops, state.frame is None
    ('none', 0, True)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tracetorch.records.tree import RuleState, set_engine_state

if TYPE_CHECKING:
    from tracetorch.engine.hotpath import Frame

__all__ = ("NodeState",)


class NodeState:
    """The engine's working state for one node (folded into the node by
    :class:`~tracetorch.engine.collector.Collector.fold`).

    Attributes:
        flops_cache: per call key (:func:`tracetorch.engine.hotpath.call_key`: input shapes and
            dtypes, grad mode, layer structures; a one-tensor call's first key is kept under its
            shape alone) a counter laid out as :data:`~tracetorch.records.tree.ENTRY_FIELDS`
            (the rule's FLOPs, the call's sizes), so a rule runs once per distinct key and a
            call costs one increment. Kept between openings of a profile.
        last_counter: a one-item list: the counter of the node's last call whose key was made
            of its arguments one by one (a call of several arguments), or ``None``. The C
            wrapper compares the next such call's arguments with that counter's key in place
            before it builds a key to look up; :meth:`drop_counters` empties it with the
            counters.
        child_frames: ``id(owner) -> the child's Frame``, for each object this node's calls
            called, so naming runs once per child and a call finds its record in one lookup.
        rule_state: ``"rule"``, ``"user"``, ``"free"`` (a rule of ``None``) or ``"none"``.
        beside_rule: whether this node's cost adds to its parent's rule instead of being a part
            of what the rule counts (a parametrization computing the parent's weight, which
            the parent's rule, counting what the layer does with its weight, leaves out).
        op_flops / op_gemm: FLOPs (and their matmul part) of the tensor operations run directly
            in this node's calls since the last fold.
        frame: the open-call record of this node's calls (:class:`~tracetorch.engine.hotpath.
            Frame`), made when a profile takes the node up; ``None`` on the root and between
            openings.
    """

    __slots__ = ("flops_cache", "last_counter", "child_frames", "rule_state", "beside_rule",
                 "op_flops", "op_gemm", "frame")

    def __init__(self) -> None:
        self.flops_cache: dict[Any, list[Any]] = {}
        self.last_counter: list[list[Any] | None] = [None]
        self.child_frames: dict[int, Frame] = {}
        self.rule_state: RuleState = "none"
        self.beside_rule = False
        self.op_flops = 0
        self.op_gemm = 0
        self.frame: Frame | None = None

    def drop_counters(self) -> None:
        """Forget every per-key counter (their counts folded already): a layer whose structure
        or place changed is counted anew.

        Example:
            >>> state = NodeState()
            >>> state.flops_cache["key"] = state.last_counter[0] = [0]
            >>> state.drop_counters()
            >>> state.flops_cache, state.last_counter
            ({}, [None])
        """
        self.flops_cache.clear()
        self.last_counter[0] = None


set_engine_state(NodeState)
