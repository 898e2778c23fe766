"""Learned operation counts: a layer's calls under ``no_grad`` run without the function mode
once two calls with the same key counted the same operations.

Inside a torch module without a FLOP rule every operation reaches the profile's function mode
(:class:`~tracetorch.adapters.torch.ops.OpCountingMode`), about 1.5 µs each, and each ruled
layer it calls pops the mode and pushes it back: in a transformer's attention or residual
blocks that is most of what profiling costs. What the mode records for one call of a node — the
calls and FLOPs in its op table, its operation FLOPs and GEMM FLOPs — depends on what the call
runs, which for nearly every layer is a function of the call's key: what
:func:`~tracetorch.engine.hotpath.call_key` holds (its inputs' shapes and dtypes, the grad
mode, the generation of layer structures, the training flag) and, here, its plain arguments
by value (a flag, a count; any other object by its type).

:class:`OpLearner` is asked before each call of a frame that counts operations
(:func:`~tracetorch.engine.hotpath.set_op_replay`). It learns a node's counts under a key from
two calls with that key that counted exactly the same, and later calls with it run with the
mode off (the frame handed back has ``ops`` off, so the engine pops the mode as it does around
a ruled layer, and a child without a rule pushes it back for its own calls), the learned
counts added to the node as the mode would have added them. Only where nothing else could
differ:

- under ``no_grad``/inference mode only (the key's grad mode): with autograd recording, the
  mode also marks products for their backward FLOPs, which only it can do;
- a key whose two calls counted differently (data-dependent control flow) is never learned;
- a call observed while something besides the mode's counting happened (a backward pass, a
  product marked for one under ``enable_grad``) teaches nothing;
- never with ``profile(op_timing=True)`` (each operation's time is measured, not learned),
  inside a backward pass, or while another function mode sits above the profile's (the
  profile's could not be taken off the stack for the call).

A layer whose counts change between calls of the same key after two equal ones (control flow
on tensor values that happened to agree twice, an attribute changed later, an argument object
whose state differs) is beyond what agreement can catch; ``TRACETORCH_LEARN_OPS=0``, set
before a profile opens, counts every call with the mode.

What a call counted is read at the node's next call, from its op table (which a fold does not
reset): the difference to the table before it. A call raising after its counts were replayed
keeps them.

Example:
    >>> import torch, tracetorch
    >>> class Residual(torch.nn.Module):
    ...     def forward(self, x):
    ...         return x + x * 2
    >>> layer = Residual()
    >>> with torch.no_grad(), tracetorch.profile(layer) as prof:
    ...     for _ in range(4):                        # calls 3 and 4 learned from 1 and 2
    ...         _ = layer(torch.ones(3))
    >>> sorted((op.name, op.calls, op.flops) for op in prof.find("").op_table())
    [('add', 4, 12), ('mul', 4, 12)]
"""
from __future__ import annotations

import functools
import os
from typing import Any

import torch

from tracetorch.engine import hotpath as _hotpath
from tracetorch.engine.hotpath import Frame, innermost_frame
from tracetorch.flops.torch_functions import torch_function_formulas
from tracetorch.records.tree import CallNode

__all__ = ("OpLearner", "disturb", "learning_enabled")

_grad_enabled = torch.is_grad_enabled
_current_node = torch._C._current_autograd_node
_stack_len = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_quiet = torch._C.DisableTorchFunction

#: Bumped by whatever adds to a node's op table besides the mode's counting (a backward pass
#: recorded, a product marked for one): a call observed across a change teaches nothing.
_DISTURBED = [0]

#: Charged to a layer's op table by the compiled-graph counting (adapters.torch.compiled),
#: not by the mode: it runs whether the mode is on or not, so a call that ran it is not learned.
_NOT_THE_MODES = frozenset({"compiled"})


def disturb() -> None:
    """Say that something besides the function mode's counting added to an op table now: a
    call that ran meanwhile is not learned from.

    Example:
        >>> before = _DISTURBED[0]
        >>> disturb()
        >>> _DISTURBED[0] == before + 1
        True
    """
    _DISTURBED[0] += 1


def learning_enabled() -> bool:
    """Whether op counts are learned: unless ``TRACETORCH_LEARN_OPS`` is ``0`` (every call
    counted by the mode: the reference the tests compare learned counts with).

    Example:
        >>> learning_enabled() == (os.environ.get("TRACETORCH_LEARN_OPS", "1") != "0")
        True
    """
    return os.environ.get("TRACETORCH_LEARN_OPS", "1") != "0"


def _key(args: tuple[Any, ...], kwargs: dict[str, Any], owner: Any) -> tuple[Any, ...]:
    # The call's key under no_grad, in one walk: what call_key holds (the tensors' shapes and
    # dtypes, the structure generation, the training flag) and what it leaves out, plain
    # arguments (a flag, a count) by value: a flag that changes what a layer runs makes another
    # key. Keyword arguments with their names.
    # (Asked before most calls of layers without a rule: the generation is read as a module
    # attribute rather than through structure_generation(), and a tensor or None, the commonest
    # arguments, without a call of _part.)
    training = getattr(owner, "training", None)  # (training_flag, inlined)
    parts: list[Any] = [_hotpath._structure,
                        training if training is True or training is False else None]
    for value in args:
        cls = value.__class__
        parts.append((value.shape, value.dtype) if cls is _Tensor or cls is _Parameter
                     else None if value is None else _part(value, 0))
    for name, value in kwargs.items():
        parts.append(name)
        cls = value.__class__
        parts.append((value.shape, value.dtype) if cls is _Tensor or cls is _Parameter
                     else None if value is None else _part(value, 0))
    return tuple(parts)


def _part(value: Any, depth: int) -> Any:
    if value is None:
        return None
    cls = value.__class__
    if cls is _Tensor or cls is _Parameter:
        return (value.shape, value.dtype)
    if cls in _PLAIN:
        return (cls, value)  # (True and 1 are equal keys otherwise)
    if (cls is tuple or cls is list) and depth < 3:
        return tuple([_part(item, depth + 1) for item in value])
    if cls is dict and depth < 3:
        return tuple([(name, _part(item, depth + 1)) for name, item in value.items()])
    if isinstance(value, _Tensor):  # a subclass: read with its __torch_function__ off
        with _quiet():
            return (cls, value.shape, value.dtype)
    return cls  # any other object by its type


_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_PLAIN = frozenset({bool, int, float, str, torch.dtype, torch.device})
_new_tuple = tuple.__new__
#: Where a Frame keeps its ``ops`` flag (a replayed call runs with a copy that has it off).
_OPS = Frame._fields.index("ops")


@functools.cache  # (the formulas are built once: a profile opened in a loop reads these again)
def _gemm_names() -> tuple[frozenset[str], frozenset[str]]:
    # The names the mode charges FLOPs under (a counted function's formula name), those of
    # products, and those used by both a product and another function (not learned: which
    # part of their FLOPs is GEMM would be a guess).
    gemm: set[str] = set()
    other: set[str] = set()
    for name, _, is_gemm in torch_function_formulas().values():
        (gemm if is_gemm else other).add(name)
    return frozenset(gemm), frozenset(gemm & other)


#: One learned call: its operation FLOPs, GEMM FLOPs and op-table rows (name, calls, FLOPs).
Learned = tuple[int, int, tuple[tuple[str, int, int], ...]]


class _NodeState:
    """What is learned of one node: per key, the counts of the first call seen (``seen``), the
    counts learned, the keys never learned; the call being observed; its frame with ops off."""

    __slots__ = ("seen", "learned", "never", "pending", "quiet")

    def __init__(self) -> None:
        self.seen: dict[Any, tuple[tuple[str, int, int], ...]] = {}
        self.learned: dict[Any, Learned] = {}
        self.never: set[Any] = set()
        # (key, the op table before the call, _DISTURBED then)
        self.pending: tuple[Any, dict[str, tuple[int, int]], int] | None = None
        # The node's frame and its copy with ops off, made at its first replayed call: a node
        # keeps its frame while its profile records it (dropped with the state: forget(), or
        # pruned once that profile stopped).
        self.quiet: tuple[Frame, Frame] | None = None


class OpLearner:
    """What is learned of one profiling session's layers: :meth:`replay` is what the engine asks
    before each call of a frame that counts operations (see the module docstring); it hands back
    the frame to run the call with, ``frame`` itself or, for a call whose counts are learned
    (added to the node already), a copy with ``ops`` off.

    Example:
        >>> from tracetorch.engine.hotpath import OpCounter
        >>> from tracetorch.adapters.torch.ops import OpCountingMode
        >>> learner = OpLearner(OpCountingMode(OpCounter()))
        >>> learner.forget()
    """

    def __init__(self, mode: Any) -> None:
        self._mode = mode
        self._states: dict[CallNode, _NodeState] = {}
        self._pruned_at = 64  # the size past which the states of stopped profiles are dropped
        self._gemm, self._ambiguous = _gemm_names()

    def replay(self, frame: Frame, args: tuple[Any, ...], kwargs: dict[str, Any],
               owner: Any) -> Frame:
        """The frame to run this call of ``frame``'s node with (see the class docstring)."""
        node = frame.node
        state = self._states.get(node)
        if state is not None and state.pending is not None:
            self._settle(node, state)
        if _grad_enabled() or frame.collector.op_timing or _current_node() is not None:
            return frame
        depth = _stack_len()
        try:
            if depth:  # the key's .shape reads must not reach the mode (nor a user's)
                with _quiet():
                    key = _key(args, kwargs, owner)
            else:
                key = _key(args, kwargs, owner)
            if state is None:
                state = self._new_state(node)
            learned = state.learned.get(key)
            never = learned is None and key in state.never
        except Exception:  # a key that cannot key a dict, an odd argument: nothing learned
            return frame
        if learned is not None:
            if depth and not self._comes_off(depth):
                return frame
            flops, gemm, rows = learned
            counted = node.engine
            counted.op_flops += flops
            counted.op_gemm += gemm
            ops = node.ops
            for name, calls, op_flops in rows:
                row = ops.get(name)
                if row is None:
                    ops[name] = [calls, op_flops, 0]
                else:
                    row[0] += calls
                    row[1] += op_flops
            quiet = state.quiet
            if quiet is None or quiet[0] is not frame:
                quiet = state.quiet = (
                    frame, _new_tuple(Frame, frame[:_OPS] + (False,) + frame[_OPS + 1:]))
            return quiet[1]
        if not never:
            before = {name: (row[0], row[1]) for name, row in node.ops.items()}
            state.pending = (key, before, _DISTURBED[0])
        return frame

    def _new_state(self, node: CallNode) -> _NodeState:
        states = self._states
        if len(states) >= self._pruned_at:
            # Nodes of profiles stopped meanwhile (no frame) are not called again: a profile
            # opened in a loop inside a long one leaves no growing table.
            for stopped in [known for known in list(states) if known.engine.frame is None]:
                states.pop(stopped, None)  # (list(): another thread may add a node meanwhile)
            self._pruned_at = 2 * max(len(states), 32)
        state = states[node] = _NodeState()
        return state

    def _comes_off(self, depth: int) -> bool:
        # Whether the profile's mode is off the stack during the call: the engine pops it only
        # where it is the top and the caller counts (its switch), and it must be nowhere below.
        mode = self._mode
        if _stack_at(depth - 1) is mode:
            parent = innermost_frame()
            if parent is None or not parent.ops:
                return False
            depth -= 1
        for below in range(depth):  # (a loop, not any() over a generator: asked per call)
            if _stack_at(below) is mode:
                return False
        return True

    def _settle(self, node: CallNode, state: _NodeState) -> None:
        # The observed call ended (this is the node's next call): what it added to the op table.
        key, before, disturbed = state.pending  # type: ignore[misc]
        state.pending = None
        if disturbed != _DISTURBED[0]:
            return
        rows = []
        for name, row in node.ops.items():
            old = before.get(name)
            calls, flops = (row[0], row[1]) if old is None else (row[0] - old[0],
                                                                 row[1] - old[1])
            if calls or flops:
                rows.append((name, calls, flops))
        counted = tuple(rows)
        first = state.seen.pop(key, None)
        if first is None:
            state.seen[key] = counted
        elif first == counted and self._replayable(counted):
            flops = sum(row[2] for row in counted)
            gemm = sum(row[2] for row in counted if row[0] in self._gemm)
            state.learned[key] = (flops, gemm, counted)
        else:
            state.never.add(key)

    def _replayable(self, rows: tuple[tuple[str, int, int], ...]) -> bool:
        return not any(name in _NOT_THE_MODES or (flops and name in self._ambiguous)
                       for name, _, flops in rows)

    def forget(self) -> None:
        """Drop everything learned (the profiles closed: no node is kept alive)."""
        self._states.clear()
