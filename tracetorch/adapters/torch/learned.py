"""Learned operation counts: a layer's calls run without the function mode once two calls with
the same key counted the same operations.

Inside a torch module without a FLOP rule every operation reaches the profile's function mode
(:class:`~tracetorch.adapters.torch.ops.OpCountingMode`), about 1.5 µs each, and each ruled
layer it calls pops the mode and pushes it back: in a transformer's attention or residual
blocks that is most of what profiling costs. What the mode records for one call of a node — the
calls and FLOPs in its op table, its operation FLOPs and GEMM FLOPs — depends on what the call
runs, which for nearly every layer is a function of the call's key: what
:func:`~tracetorch.engine.hotpath.call_key` holds (its inputs' shapes and dtypes, its plain
arguments by value — a flag, a count —, the class of any other argument object, the grad mode,
the generation of layer structures, the training flag).

What is learned of a key is kept in its counter (the ``learned`` slot of the node's per-key
counter, :data:`~tracetorch.records.tree.ENTRY_FIELDS`), where the engine reads it before the
call (:func:`~tracetorch.engine.hotpath.set_op_replay`): a learned call's counts are added to
the node as the mode would have added them and the call runs with a copy of its frame that has
``ops`` off (so the engine pops the mode as it does around a ruled layer, and a child without a
rule pushes it back for its own calls) — in C where the accelerator is built, with no Python
frame. Every other call of a frame that counts operations asks :meth:`OpLearner.replay`, which
watches it: two calls with one key that counted exactly the same teach the key's counts. Only
where nothing else could differ:

- with autograd recording (the key's grad mode on), a call that ran products only if each can
  be found again in the graph a replayed call builds (:mod:`~tracetorch.adapters.torch.\
product_paths`): the mode marks products for their backward FLOPs, and a replayed call's exit
  marks the same nodes, found from its outputs, with the same parts resolved for that call;
  every operand a part names must have needed a gradient (one that did not might later: a
  weight unfrozen, which no key holds). Under ``no_grad``/inference mode nothing is marked;
- a key whose two calls counted differently is never learned, nor one whose call read a
  tensor's value into Python or made a tensor whose shape its values decide, itself or in a
  layer it called (:mod:`~tracetorch.adapters.torch.value_reads`: ``if mask.all():``,
  ``.item()``, ``x[mask]``, ``nonzero``): what such a call runs can follow the values, which
  no key holds, however many calls agree;
- a call observed while something besides the mode's counting happened (a backward pass run
  inside it; under ``no_grad``, a product marked for one under ``enable_grad``) teaches nothing;
- never with ``profile(op_timing=True)`` (each operation's time is measured, not learned),
  inside a backward pass, or while another function mode sits above the profile's (the
  profile's could not be taken off the stack for the call).

A layer whose counts change between calls of the same key after two equal ones for a reason
outside its tensors — an attribute changed later, a config, a global, an argument object whose
state differs — is beyond what agreement can catch. So a learned key stands in for a budget of
calls (:data:`FIRST_BUDGET`, doubled by each check that agrees, up to :data:`MOST_BUDGET`: the
counter's ``budget`` slot, which the engine reads), after which its next call is counted by the
mode and compared: counts that differ warn (the calls since the last check may have run
something else) and the key is counted by the mode from then on. A change to an attribute
:mod:`~tracetorch.adapters.torch.path_watch` sees (a module's public attribute, a transformers
config's) has every key checked at its next call (:func:`check_learned_again`): exact, with no
warning, and the key's new counts learned anew. ``TRACETORCH_LEARN_OPS=0``, set before a profile
opens, counts every call with the mode.

What a watched call counted is read at the node's next call, from its op table (which a fold
does not reset): the difference to the table before it; until then every call of the node goes
to the learner (``observing``), so nothing replayed meanwhile is taken for the watched call's.
A call raising after its counts were replayed keeps them. Each session learns anew: a counter
keeps what an earlier one learned, marked as that learner's, and no other reads it.

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
import warnings
import weakref
from typing import Any, NamedTuple

import torch

from tracetorch.adapters.torch.product_paths import WATCHED, Place, ProductWatch
from tracetorch.engine.hotpath import (
    Frame,
    call_key,
    counter_of,
    innermost_frame,
    settle_replayed,
)
from tracetorch.flops.torch_functions import torch_function_formulas
from tracetorch.records.tree import BUDGET, KEY, LEARNED, REPLAYED, CallNode

__all__ = ("LEARNED_PRODUCTS", "LEARNED_QUIET", "OpLearner", "check_learned_again", "disturb",
           "learning_enabled", "note_marked")

_grad_enabled = torch.is_grad_enabled
_current_node = torch._C._current_autograd_node
_stack_len = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_quiet = torch._C.DisableTorchFunction

#: Bumped by whatever adds to a node's op table besides the mode's counting (a backward pass
#: recorded): a call observed across a change teaches nothing.
_DISTURBED = [0]
#: Bumped when the mode marks a product for its backward FLOPs: a call observed across it under
#: no grad mode (a product marked under ``enable_grad`` inside it) teaches nothing. A call under
#: grad mode is not learned if it ran a product at all, and one of its children marking its own
#: products is no reason to keep counting the caller's operations.
_MARKED = [0]

#: How many calls a key's learned counts stand in for before the next call is counted by the
#: mode again and compared (the budget: the counter's ``budget`` slot): at first, and at most.
#: Each check that agrees doubles it; one that differs ends the key's learning with a warning.
FIRST_BUDGET = 32
MOST_BUDGET = 1024

#: The learners of the profiling sessions open now (one at a time, unless a test makes more):
#: :func:`check_learned_again` reaches them.
_LEARNERS: weakref.WeakSet[OpLearner] = weakref.WeakSet()

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


def note_marked() -> None:
    """Say that the function mode marked a product for its backward FLOPs now (which a learned
    call could not do): a call under no grad mode that ran meanwhile is not learned from.

    Example:
        >>> before = _MARKED[0]
        >>> note_marked()
        >>> _MARKED[0] == before + 1
        True
    """
    _MARKED[0] += 1


def learning_enabled() -> bool:
    """Whether op counts are learned: unless ``TRACETORCH_LEARN_OPS`` is ``0`` (every call
    counted by the mode: the reference the tests compare learned counts with).

    Example:
        >>> learning_enabled() == (os.environ.get("TRACETORCH_LEARN_OPS", "1") != "0")
        True
    """
    return os.environ.get("TRACETORCH_LEARN_OPS", "1") != "0"


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


#: One learned call, as the engine reads it from a counter's ``learned`` slot
#: (:func:`~tracetorch.engine.hotpath.set_op_replay`): its operation FLOPs, GEMM FLOPs, op-table
#: rows (name, calls, FLOPs), the frame it stands in for, that frame with ops off, where its
#: products' autograd nodes are found (:data:`~tracetorch.adapters.torch.product_paths.Place`s;
#: empty under no grad mode), the budget it was last given (the calls it may stand in for before
#: it is checked) and the learner that learned it. A plain tuple: the engine tells it from the
#: slot's other states (the classes below) by its class alone.
#: (The frames are None until a call of the node asks for the counts: ``tuple[Any, ...]``.)
Learned = tuple[Any, ...]
#: Where a Learned tuple keeps the quiet frame and the places of its products (the exit
#: observer places them for a call run with that frame: :mod:`~tracetorch.adapters.torch.marks`).
LEARNED_QUIET = 4
LEARNED_PRODUCTS = 5
_GRANTED = 6


class _Seen(NamedTuple):
    """A key's first call observed: its op-table rows and its products' places, for the learner
    ``by``."""

    rows: tuple[tuple[str, int, int], ...]
    places: tuple[Place, ...]
    by: object


class _Check(NamedTuple):
    """A learned key whose next call is counted by the mode and compared with what was learned:
    its budget spent (``exact`` false: the calls replayed since the last check may have run
    something else), or something its calls may follow changed (``exact``: no call was replayed
    since, so another count is simply learned anew)."""

    learned: Learned
    exact: bool
    by: object


class _Never(NamedTuple):
    """A key whose observed calls counted differently (or not replayably): never learned."""

    by: object


#: What :meth:`OpLearner._places` answers for a call with a product it cannot place: never
#: learned (the mode counts every call).
_UNPLACED: Any = object()


class OpLearner:
    """What is learned of one profiling session's layers, kept in each call key's counter (its
    ``learned`` slot). The engine replays a learned call itself; :meth:`replay` is what it asks
    for every other call of a frame that counts operations (see the module docstring), and
    hands back the frame to run the call with: ``frame`` itself or, for a call whose counts are
    learned (added to the node already), a copy with ``ops`` off.

    Example:
        >>> from tracetorch.engine.hotpath import OpCounter
        >>> from tracetorch.adapters.torch.ops import OpCountingMode
        >>> learner = OpLearner(OpCountingMode(OpCounter()))
        >>> learner.observing
        {}
    """

    #: What the engine asks before replaying a call itself: each returns something false while
    #: learned counts may stand in (no backward pass running, no function mode on the stack, so
    #: none to take off: the profile's is off already, a user's is never moved).
    HOLD = (_current_node, _stack_len)

    def __init__(self, mode: Any) -> None:
        self._mode = mode
        #: per node, its call being watched: (key, the op table before the call, _DISTURBED then,
        #: _MARKED then under no grad mode, None under grad mode, and under grad mode what sees
        #: its products: a ProductWatch, also in product_paths.WATCHED while the call runs)
        self.observing: dict[CallNode, tuple[Any, dict[str, tuple[int, int]], int, int | None,
                                             ProductWatch | None]] = {}
        self._pruned_at = 64  # the size past which the watches of stopped profiles are dropped
        # The counters this learner learned a key in (their learned calls hold a frame, and so
        # its collector and the layer the frame calls, once replayed): emptied by forget, else
        # a profile's result would keep them alive; check_again reaches them.
        self._learned: dict[int, list[Any]] = {}
        self._gemm, self._ambiguous = _gemm_names()
        #: the nodes whose watched call let its work follow tensor values (saw_values)
        self._saw_values: set[CallNode] = set()
        _LEARNERS.add(self)

    def replay(self, frame: Frame, args: tuple[Any, ...], kwargs: dict[str, Any],
               owner: Any, entry: list[Any] | None) -> Frame:
        """The frame to run this call of ``frame``'s node with (see the class docstring);
        ``entry``: the call's counter where the engine found it."""
        collector = frame.collector
        if not collector.records_tree:  # a running total: one call per node, nothing to learn
            return frame
        node = frame.node
        watched = self.observing.pop(node, None)
        if watched is not None:
            self._settle(frame, *watched)
        if collector.op_timing or _current_node() is not None:
            return frame
        depth = _stack_len()
        try:
            if entry is None:
                if depth:  # the key's .shape reads must not reach the mode (nor a user's)
                    with _quiet():
                        key = call_key(args, kwargs, owner)
                else:
                    key = call_key(args, kwargs, owner)
                entry = counter_of(frame.flops_cache, key)
            else:
                key = entry[KEY]
        except Exception:  # a key that cannot key a dict, an odd argument: nothing learned
            return frame
        state = self._state(entry)
        if entry is not None and state.__class__ is tuple:
            if depth and not self._comes_off(depth):
                return frame
            learned: Learned = state
            if entry[REPLAYED] >= entry[BUDGET]:  # its budget spent: this call is counted again
                settle_replayed(node, entry)
                state = entry[LEARNED] = _Check(learned, False, self)
            else:
                if learned[3] is not frame:  # (a node's frame is made anew at each opening)
                    quiet = _new_tuple(Frame, frame[:_OPS] + (False,) + frame[_OPS + 1:])
                    learned = entry[LEARNED] = (*learned[:3], frame, quiet,
                                                *learned[LEARNED_PRODUCTS:])
                entry[REPLAYED] += 1  # (added to the node at its fold)
                replayed: Frame = learned[LEARNED_QUIET]
                return replayed
        if state.__class__ is not _Never:
            if len(self.observing) >= self._pruned_at:
                self._prune()
            # The op table before the call, with the node's replayed calls in it: a fold
            # before the watched call is settled must not add them to what the call counted.
            for counter in node.engine.flops_cache.values():
                settle_replayed(node, counter)
            before = {name: (row[0], row[1]) for name, row in node.ops.items()}
            watch = None
            if _grad_enabled():
                watch = WATCHED[node] = ProductWatch()
            self.observing[node] = (key, before, _DISTURBED[0],
                                    None if watch is not None else _MARKED[0], watch)
        return frame

    def saw_values(self, node: CallNode) -> None:
        """A call of ``node`` read a tensor's value into Python or made a tensor whose shape
        its values decide (:mod:`~tracetorch.adapters.torch.value_reads`): what runs in it,
        and in every call it ran within (the value or the shape goes back to them), can differ
        between calls of one key, so the keys of the calls watched now are never learned.

        Example:
            >>> from tracetorch.adapters.torch.ops import OpCountingMode
            >>> from tracetorch.engine.hotpath import OpCounter
            >>> learner = OpLearner(OpCountingMode(OpCounter()))
            >>> learner.saw_values(CallNode("layer", "Layer", "layer"))  # (not watched: no-op)
        """
        observing, seen = self.observing, self._saw_values
        around: CallNode | None = node
        while around is not None:
            if around in observing:
                seen.add(around)
            around = around.parent

    def _state(self, entry: list[Any] | None) -> Any:
        # What this learner learned of a counter's key: a Learned tuple, _Seen, _Never or None
        # (no counter yet, nothing yet, or another session's: each session learns anew).
        if entry is None:
            return None
        state = entry[LEARNED]
        if state is None:
            return None
        learner = state[-1]  # (every state ends with the learner that made it)
        return state if learner is self else None

    def _prune(self) -> None:
        # Nodes of profiles stopped meanwhile (no frame) are not called again: a profile opened
        # in a loop inside a long one leaves no growing table.
        observing = self.observing
        for stopped in [node for node in list(observing) if node.engine.frame is None]:
            watched = observing.pop(stopped, None)  # (list(): another thread may add one)
            self._saw_values.discard(stopped)
            if watched is not None:
                _unwatch(stopped, watched[4])
        self._pruned_at = 2 * max(len(observing), 32)

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

    def _settle(self, frame: Frame, key: Any, before: dict[str, tuple[int, int]],
                disturbed: int, marked: int | None, watch: ProductWatch | None) -> None:
        # The watched call ended (this is the node's next call): what it added to the op table.
        _unwatch(frame.node, watch)
        entry = counter_of(frame.flops_cache, key)
        if frame.node in self._saw_values:  # (whatever else happened meanwhile)
            self._saw_values.discard(frame.node)
            if entry is not None:
                entry[LEARNED] = _Never(self)
            return
        if disturbed != _DISTURBED[0] or (marked is not None and marked != _MARKED[0]):
            return
        if entry is None:  # (its counter was dropped meanwhile: a changed structure, a reset)
            return
        rows = []
        for name, row in frame.node.ops.items():
            old = before.get(name)
            calls, flops = (row[0], row[1]) if old is None else (row[0] - old[0],
                                                                 row[1] - old[1])
            if calls or flops:
                rows.append((name, calls, flops))
        counted = tuple(rows)
        places = self._places(counted, watch)
        if places is None:
            return
        first = self._state(entry)
        if first.__class__ is _Check:
            self._checked(frame.node, entry, first, counted, places)
        elif places is _UNPLACED:
            entry[LEARNED] = _Never(self)
        elif first is None:
            entry[LEARNED] = _Seen(counted, places, self)
        elif (first.__class__ is _Seen and first.rows == counted and first.places == places
              and self._replayable(counted, products=marked is not None or bool(places))):
            flops = sum(row[2] for row in counted)
            gemm = sum(row[2] for row in counted if row[0] in self._gemm)
            entry[LEARNED] = (flops, gemm, counted, None, None, places, FIRST_BUDGET, self)
            _grant(entry, FIRST_BUDGET)
            self._learned[id(entry)] = entry
        elif first.__class__ is _Seen:
            entry[LEARNED] = _Never(self)

    def _checked(self, node: CallNode, entry: list[Any], check: _Check,
                 counted: tuple[tuple[str, int, int], ...], places: Any) -> None:
        # A learned key's call counted again by the mode (see _Check): what it ran is what was
        # learned (the budget doubles), or after a change another count is learned anew, or
        # with calls replayed since the last check the key is counted by the mode from now on.
        learned = check.learned
        if learned[2] == counted and learned[LEARNED_PRODUCTS] == places:
            granted = min(2 * learned[_GRANTED], MOST_BUDGET)
            entry[LEARNED] = (*learned[:_GRANTED], granted, self)
            _grant(entry, granted)
        elif check.exact:
            entry[LEARNED] = (_Never(self) if places is _UNPLACED
                              else _Seen(counted, places, self))
        else:
            entry[LEARNED] = _Never(self)
            warnings.warn(
                f"tracetorch: the operations a call of {node.type_name} ({node.path}) runs "
                "changed with nothing in its call key changing (an attribute, a config or a "
                "global it reads?); up to the last "
                f"{learned[_GRANTED]} of its calls with that key before this one were counted "
                "as the earlier calls ran; its later calls are counted in full "
                "(TRACETORCH_LEARN_OPS=0 counts every call)", RuntimeWarning, stacklevel=2)

    def check_again(self) -> None:
        """Have every key learned so far counted by the mode at its next call and compared (an
        attribute its calls may follow changed: :mod:`~tracetorch.adapters.torch.path_watch`);
        no learned call is replayed before that.

        Example:
            >>> from tracetorch.engine.hotpath import OpCounter
            >>> from tracetorch.adapters.torch.ops import OpCountingMode
            >>> OpLearner(OpCountingMode(OpCounter())).check_again()   # (nothing learned yet)
        """
        for entry in list(self._learned.values()):  # (list(): another thread may learn one)
            learned = self._state(entry)
            if learned.__class__ is tuple:
                if learned[3] is not None:
                    settle_replayed(learned[3].node, entry)
                entry[LEARNED] = _Check(learned, True, self)

    def _places(self, counted: tuple[tuple[str, int, int], ...], watch: ProductWatch | None
                ) -> tuple[Place, ...] | None:
        # Where a call's products are found (see .product_paths): () without any, or under no
        # grad mode (nothing to mark); None when this call teaches nothing (a product ran while
        # marking was off, its exit was not seen); _UNPLACED when one cannot be found.
        if watch is None:
            return ()
        products = sum(calls for name, calls, _ in counted if name in self._gemm)
        if not products:
            return ()
        if watch.blind:
            return None
        if not watch.learnable:
            return _UNPLACED
        if watch.places is None:  # (its exit was not seen)
            return None
        return watch.places if len(watch.places) == products else _UNPLACED

    def _replayable(self, rows: tuple[tuple[str, int, int], ...], products: bool) -> bool:
        # ``products``: whether a call that ran products may be replayed (not under grad mode).
        return not any(name in _NOT_THE_MODES or (flops and name in self._ambiguous)
                       or (not products and name in self._gemm)
                       for name, _, flops in rows)

    def unlearn(self, frame: Frame, entry: list[Any]) -> None:
        """A replayed call's products were not where the learned calls' were (another graph for
        the same key): its key is counted by the function mode from the next call on, and what
        this call's products add to the backward pass is missing, which a warning says."""
        settle_replayed(frame.node, entry)  # (this call's counts stand, as the docstring says)
        entry[LEARNED] = _Never(self)
        warnings.warn(
            f"tracetorch: a call of {frame.node.type_name} built another autograd graph than "
            "the two calls its operation counts were learned from; the backward FLOPs of its "
            "products in this one call are not counted (its later calls are counted in full; "
            "TRACETORCH_LEARN_OPS=0 counts every call)", RuntimeWarning, stacklevel=2)

    def forget(self) -> None:
        """Stop watching calls and drop what this learner put in the counters with a frame (the
        profiles closed: no node, collector or layer is kept alive by a profile's result; each
        session learns anew, so nothing learned is lost to a later one)."""
        for node, watched in list(self.observing.items()):
            _unwatch(node, watched[4])
        self.observing.clear()
        self._saw_values.clear()
        for entry in self._learned.values():
            state = self._state(entry)
            if state.__class__ is tuple and state[3] is not None:
                settle_replayed(state[3].node, entry)  # (a fold settled them, unless raced)
            if state is not None:
                entry[LEARNED] = None
                entry[BUDGET] = 0
        self._learned.clear()
        _LEARNERS.discard(self)


def check_learned_again() -> None:
    """Have the learned keys of the profiling sessions open now counted by the mode at their
    next calls and compared (see :meth:`OpLearner.check_again`).

    Example:
        >>> check_learned_again()        # (no session open: nothing to do)
    """
    for learner in list(_LEARNERS):
        learner.check_again()


def _grant(entry: list[Any], budget: int) -> None:
    # The engine may replay ``budget`` more calls of the counter's key before the next check
    # (its calls replayed since the last fold count against the budget until that fold).
    entry[BUDGET] = entry[REPLAYED] + budget


def _unwatch(node: CallNode, watch: ProductWatch | None) -> None:
    # The node's watched call is settled or dropped: the exit observer stops looking for it.
    if watch is not None and WATCHED.get(node) is watch:
        del WATCHED[node]
