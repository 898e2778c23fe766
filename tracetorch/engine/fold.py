"""Folding counters into FLOPs, and moving what one recording saw into another tree.

:func:`fold_tree` turns the per-shape counters the hot path bumps into each node's own FLOPs;
:func:`fold_touched` does it for the nodes that ran since the last fold only (a step's fold).
:func:`merge_tree` adds one tree's recorded data to another tree of the same profile (a nested
profile's per-entry recording into its own accumulated tree); :func:`graft` does the same into
another profile, under the call that profile has open, so that a call made inside nested
profiles is recorded once in each of them. :func:`clear_recorded` empties a recording once it
has been handed on, so that the same nodes record the next step.

Example:
    >>> from tracetorch.records.tree import CallNode
    >>> source, target = CallNode.root(), CallNode.root()
    >>> source.child("fc", "Linear", "m0").time.add(5)
    >>> mapping = merge_tree(source, target)
    >>> target.children["fc"].calls, mapping[source.children["fc"]] is target.children["fc"]
    (1, True)
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tracetorch.engine.hotpath import Frame, settle_replayed
from tracetorch.records.memory import MemoryStats
from tracetorch.records.tree import (
    CALLS,
    FLOPS,
    GEMM_FLOPS,
    INPUT_BYTES,
    MACS,
    OUTPUT_BYTES,
    REPLAYED,
    SAVED_BYTES,
    CallNode,
)

__all__ = ("Counterpart", "fold_tree", "fold_touched", "merge_tree", "merge_below", "graft",
           "add_recorded", "clear_recorded")

# _fold_node reads a per-shape counter's slots by number, in the one loop that runs for every
# node of every step: a name there is a global read, about 170 machine instructions more per
# node folded than a constant. The numbers are checked against the counter's definition here.
if (CALLS, FLOPS, GEMM_FLOPS, MACS, INPUT_BYTES, OUTPUT_BYTES, SAVED_BYTES,
        REPLAYED) != (*range(7), 9):
    raise ImportError("tracetorch.records.tree.ENTRY_FIELDS changed: update _fold_node's slots")

#: The same node in the source tree and in the tree it was merged into.
NodeMap = dict[CallNode, CallNode]
#: How merge_below matches a child: (target parent, source child, names taken) -> target child.
Counterpart = Callable[[CallNode, CallNode, set[str]], CallNode]


def fold_tree(node: CallNode) -> tuple[int, int, int]:
    """Fold ``node``'s whole subtree; return its inclusive (FLOPs, GEMM FLOPs, MACs) since the
    last fold.

    A node with a rule costs what the rule said (its own tensor operations were the rule's
    subject, so they are dropped), plus the children beside its rule (``engine.beside_rule``: a
    parametrization computing its weight); any other node costs its own operations plus its
    children. Its own share is the inclusive cost minus what the children report, so nothing
    counts twice.
    """
    return _fold(node, None)[:3]


def fold_touched(nodes: Iterable[CallNode]) -> None:
    """Fold ``nodes`` and their ancestors and nothing else: the same as :func:`fold_tree` on
    each tree they belong to, when no other node of it ran since the last fold (such a node's
    counters are all zero, it would add nothing). A step costs the nodes that ran, not the tree.

    Example:
        >>> root = CallNode.root()
        >>> fc = root.child("block", "Block", "m0").child("fc", "Linear", "m1")
        >>> fc.engine.op_flops = 8
        >>> fold_touched([fc])
        >>> fc.flops, fc.parent.flops, fc.parent.subtree_flops
        (8, 0, 8)
    """
    # Each node reached, with those of its children to fold (None: none, a leaf of the fold,
    # which costs no list): built leaves-up, so reaching a node already known ends the climb and
    # the work is the nodes touched plus their ancestors. (A step folds every layer that ran:
    # this runs once per node per step, so it is written for the interpreter's cost.)
    ran: dict[CallNode, list[CallNode] | None] = {}
    tops: list[CallNode] = []
    for node in nodes:
        if node in ran:
            continue
        ran[node] = None
        parent = node.parent
        while parent is not None:
            if parent in ran:
                siblings = ran[parent]
                if siblings is None:
                    ran[parent] = [node]
                else:
                    siblings.append(node)
                break
            ran[parent] = [node]
            node, parent = parent, parent.parent
        else:
            tops.append(node)
    for top in tops:
        _fold(top, ran)


def _fold(node: CallNode, ran: dict[CallNode, list[CallNode] | None] | None
          ) -> tuple[int, int, int, tuple[int, int, int] | None]:
    # The children to fold: all of them, or (``ran`` given) those that ran since the last fold.
    # Returns the node's inclusive counts and, of them, those beside a rule (a parametrization
    # computing a weight, at any depth below: no ruled layer above counts them in its rule).
    flops = gemm = macs = 0
    beside: tuple[int, int, int] | None = None
    children = node.children.values() if ran is None else ran[node]
    if children:
        for child in children:
            # (a leaf of the fold, the commonest node, without a call of this function)
            if ran is not None and ran[child] is None:
                child_flops, child_gemm, child_macs = _fold_node(child, 0, 0, 0)
                inner = None
            else:
                child_flops, child_gemm, child_macs, inner = _fold(child, ran)
            flops += child_flops
            gemm += child_gemm
            macs += child_macs
            if child.engine.beside_rule:
                inner = (child_flops, child_gemm, child_macs)
            if inner is not None:
                beside = inner if beside is None else (
                    beside[0] + inner[0], beside[1] + inner[1], beside[2] + inner[2])
    return (*_fold_node(node, flops, gemm, macs, beside), beside)


def _fold_node(node: CallNode, flops: int, gemm: int, macs: int,
               beside: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
    """Fold one node whose children reported inclusive ``flops``, ``gemm`` and ``macs`` (of
    which ``beside``, those beside its rule); return its own inclusive counts (every fold goes
    through here, once per node folded)."""
    engine = node.engine
    state = engine.rule_state
    ruled = state == "rule" or state == "user"
    inclusive = inclusive_gemm = inclusive_macs = 0
    read = written = saved = 0
    for entry in engine.flops_cache.values():
        if entry[9]:  # REPLAYED (the slots by number: see the check at the top)
            settle_replayed(node, entry)  # (also for a replayed call that raised: no call)
        calls = entry[0]  # CALLS
        if not calls:
            continue
        # Not "= 0": another thread may have counted a call meanwhile (folded at the latest
        # when the profile stops: Collector.stop folds the whole tree after other threads).
        entry[0] -= calls
        read += calls * entry[4]  # INPUT_BYTES
        written += calls * entry[5]  # OUTPUT_BYTES
        saved += calls * entry[6]  # SAVED_BYTES
        if ruled:
            inclusive += calls * entry[1]  # FLOPS
            inclusive_gemm += calls * entry[2]  # GEMM_FLOPS
            inclusive_macs += calls * entry[3]  # MACS
    if read or written or saved:  # (with profile(memory=False) the node's memory stays unmade)
        memory = node._memory  # (made at its first use: node.memory, a Python descriptor)
        if memory is None:
            memory = node.memory
        memory.input_bytes += read
        memory.output_bytes += written
        memory.saved_bytes += saved
    if ruled:
        if node.flops_source != "uncounted":  # (a built-in rule that failed on a call)
            node.flops_source = state
        if beside is not None:  # (what computing its weights cost is not the rule's)
            inclusive += beside[0]
            inclusive_gemm += beside[1]
            inclusive_macs += beside[2]
    elif state == "free":
        inclusive, inclusive_gemm, inclusive_macs = flops, gemm, macs
        node.flops_source = "rule"  # its rule says it costs nothing: known, not unsupported
    else:
        op_flops = engine.op_flops
        inclusive = op_flops + flops
        inclusive_gemm = engine.op_gemm + gemm
        inclusive_macs = engine.op_gemm // 2 + macs
        if op_flops and node.flops_source == "none":  # ("uncounted" stays: a lower bound)
            node.flops_source = "ops"
    engine.op_flops = engine.op_gemm = 0
    # A rule smaller than its children's rules (or a call that raised) must not go negative
    # (compared, not max(0, ...): the builtin parses keywords on every call).
    own = inclusive - flops
    if own > 0:
        node.flops += own
    own = inclusive_gemm - gemm
    if own > 0:
        node.gemm_flops += own
    own = inclusive_macs - macs
    if own > 0:
        node.macs = (node.macs or 0) + own
    elif node.macs is None and node.gemm_flops:
        node.macs = 0
    return inclusive, inclusive_gemm, inclusive_macs


def add_recorded(source: CallNode, target: CallNode) -> None:
    """Add what ``source`` itself recorded (not its children) to ``target``: its calls and
    their times, FLOPs, backward work, errors, memory and operations (another recording of the
    same call path: a nested profile's, another rank's)."""
    target.time.merge(source.time)
    target.backward_time.merge(source.backward_time)
    target.flops += source.flops
    target.gemm_flops += source.gemm_flops
    if source.macs is not None:
        target.macs = (target.macs or 0) + source.macs
    if target.flops_source == "none" or source.flops_source == "uncounted":
        target.flops_source = source.flops_source
    target.backward_flops += source.backward_flops
    target.backward_gemm_flops += source.backward_gemm_flops
    target.errors += source.errors
    target.params = max(target.params, source.params)
    target.memory.merge(source.memory)
    for name, (calls, flops, elapsed) in source.ops.items():
        target.note_op(name, calls, flops, elapsed)
    for inputs, output in zip(source.input_shapes, source.output_shapes):
        target.note_shapes(inputs, output)


def clear_recorded(root: CallNode) -> None:
    """Forget what every node of ``root``'s subtree recorded (what :func:`add_recorded` hands
    on: calls, times, FLOPs, backward work, errors, operations, bytes moved), keeping what makes
    it ready to record again: its frame, rule, per-key counters, parameters and shapes. A
    schedule's scratch recording (a warm-up step's, a nested profile's step) is emptied so after
    each step instead of being made anew: its memory stays that of one step's tree. Fold and
    hand ``root`` on first.

    Example:
        >>> root = CallNode.root()
        >>> root.child("fc", "Linear", "m0").time.add(5)
        >>> clear_recorded(root)
        >>> root.children["fc"].calls
        0
    """
    for node in root.walk():
        node.time.clear()  # in place: the node's frame holds its pending buffer
        if node._backward_time is not None:
            node._backward_time.clear()
        node.flops = node.gemm_flops = 0
        node.macs = None
        node.backward_flops = node.backward_gemm_flops = 0
        node.errors = 0
        node.ops.clear()
        if node._memory is not None:  # the parameters' bytes are the layer's, not a step's
            memory = MemoryStats()
            memory.param_bytes = node._memory.param_bytes
            node.memory = memory


def merge_tree(source: CallNode, target: CallNode) -> NodeMap:
    """Add ``source``'s subtree to ``target``'s, matching children by name (both trees belong
    to one profile, so names and module keys agree); return which node each source node went
    to. Fold ``source`` first."""
    add_recorded(source, target)
    mapping = {source: target}
    mapping.update(merge_below(source, target))
    return mapping


def merge_below(source: CallNode, target: CallNode,
                counterpart: Counterpart | None = None) -> list[tuple[CallNode, CallNode]]:
    """Add every node below ``source`` (not ``source`` itself) into ``target``'s tree by call
    path, children matched by name and new ones appended in their call order; returns the
    (source node, target node) pairs, each parent before its children. ``counterpart(parent,
    child, taken)`` picks another match (the child of ``parent`` that ``child`` goes to, given
    the names of ``parent``'s children already taken by ``child``'s siblings).

    An explicit stack, not recursion: a tree hundreds of levels deep merges as well as a flat
    one.

    Example:
        >>> source, target = CallNode.root(), CallNode.root()
        >>> fc = source.child("block", "Block", "m0").child("fc", "Linear", "m1")
        >>> [(s.path, t.path) for s, t in merge_below(source, target)]
        [('block', 'block'), ('block.fc', 'block.fc')]
    """
    pairs: list[tuple[CallNode, CallNode]] = []
    stack = [(source, target)]
    while stack:
        theirs, mine = stack.pop()
        taken: set[str] = set()
        for child in theirs.children.values():
            merged = (counterpart or _same_name)(mine, child, taken)
            taken.add(merged.name)
            if merged.engine.rule_state == "none":
                merged.engine.rule_state = child.engine.rule_state
            add_recorded(child, merged)
            pairs.append((child, merged))
            stack.append((child, merged))
    return pairs


def _same_name(parent: CallNode, child: CallNode, taken: set[str]) -> CallNode:
    # merge_below's own match: the child of the same name (made when missing).
    return parent.child(child.name, child.type_name, child.module_key, child.kind)


def graft(source: CallNode, owners: dict[str, Any], frame: Frame) -> NodeMap:
    """Add the top-level calls of the folded tree ``source`` to another profile, under its open
    call ``frame``, and return which node of that profile each source node went to.

    ``owners`` maps the source's module keys to the objects called, so the grafted nodes are
    named as the other profile names them and later direct calls find the same nodes.
    """
    outer, parent = frame.collector, frame.node
    mapping: NodeMap = {source: parent}
    parent.flops += source.flops
    parent.gemm_flops += source.gemm_flops
    for child in source.children.values():
        owner = owners.get(child.module_key)
        if owner is None:
            target = parent.child(child.name, child.type_name, child.module_key, child.kind)
        else:
            label = child.type_name if child.kind == "function" else None
            target = (frame.child_frames.get(id(owner))
                      or outer.new_child(frame, owner, child.kind, label, None)).node
        _graft_subtree(child, target, owners, mapping, outer)
    return mapping


def _graft_subtree(source: CallNode, target: CallNode, owners: dict[str, Any], mapping: NodeMap,
                   outer: Any) -> None:
    mapping[source] = target
    add_recorded(source, target)
    for name, child in source.children.items():
        owner = owners.get(child.module_key)
        key = outer.module_key(owner) if owner is not None else child.module_key
        grafted = target.child(name, child.type_name, key, child.kind)
        if owner is not None:
            frame = grafted.engine.frame
            if frame is None:
                frame = outer.adopt(grafted, owner, child.kind, None, target.engine.frame.ops)
            target.engine.child_frames[id(owner)] = frame
        _graft_subtree(child, grafted, owners, mapping, outer)
