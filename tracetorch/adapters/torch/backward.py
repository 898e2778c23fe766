"""Backward FLOPs and times per layer, measured from the autograd graph (not a fixed 2x).

**Marking, during forward.** After each layer call returns (the engine's exit observer), the
``grad_fn`` of each output tensor is marked, in ``node.metadata``, with the call's frame and its
*frontier*: its inputs' ``grad_fn`` (for an in-place layer such as ``ReLU(inplace=True)``,
whose output is its input, the history below its newest node). That is two dict entries per
call: nothing is walked, and nothing is added to modules or tensors; the marks live and die
with the graph. Under ``torch.no_grad()``/inference mode this costs one
``is_grad_enabled()`` check.

**Regions, when a backward pass starts.** One walk from the tensors being differentiated
assigns every node to the innermost layer call whose region holds it: entering a marked output
opens that call's region, reaching its frontier closes it. So a layer owns exactly the
operations it ran itself (``Linear`` its ``addmm`` and weight transpose, a residual block its
add), children own theirs, and nodes made outside every layer (a loss written with tensor
maths, history from before the block) own none.

**Counting, during backward.** ``Tensor.backward``, ``torch.autograd.backward`` and
``torch.autograd.grad`` reach the operation-counting function mode of
:mod:`~tracetorch.adapters.torch.ops` as the ``func`` of a call (torch hands them to modes; none
of them is replaced). :func:`pass_recorder` runs such a pass as a node of kind ``backward``
(``backward`` for the first two, ``autograd.grad`` for the third) under a ``TorchDispatchMode``.
For every aten operation it asks torch which autograd node is executing
(``torch._C._current_autograd_node()``), reads that node's layer, counts the operation's FLOPs
(:mod:`tracetorch.flops.aten`: what ``torch.utils.flop_counter`` counts, so the totals agree)
and times it with the profile's clock (``profile(clock=...)``; nothing with ``timing=False``;
CUDA events where the profile times on the device). Each is charged with
``counter.backward_op(frame, ...)`` to the layer call whose forward made the node; the rest goes
to the pass's own node. When the pass ends each layer it touched gets one backward sample.
Nothing is recorded while a compiler or tracer runs the code (AOT autograd traces a backward
graph under ``torch.compile``: no pass ran).

The dispatch mode costs a few µs per aten operation of the backward pass, outside the measured
operation times (the enclosing ``backward`` node's time includes it, and the region walk).
Forward operations re-run inside a backward pass (activation checkpointing) count as backward
work. A layer that computes from a tensor that is neither an input nor made inside it (one
kept on ``self`` from an earlier call) also claims that tensor's untagged history.

Example:
    >>> import torch, tracetorch
    >>> lin = torch.nn.Linear(4, 3)
    >>> with tracetorch.profile() as prof:
    ...     lin(torch.ones(2, 4)).sum().backward()
    >>> prof.find("Linear").backward_flops, prof.find("backward").flops   # weight gradient
    (48, 48)
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tracetorch.adapters.torch.cuda import backward_timer
from tracetorch.adapters.torch.tracing import tracing
from tracetorch.engine.hotpath import Frame, OpCounter, current_frame, make_wrapper
from tracetorch.flops.aten import backward_flops

__all__ = ("TAG", "MARKS", "tag_call", "assign_regions", "BackwardCounter", "pass_recorder",
           "PassRecorder")

#: The key under which a node's creating layer call is kept in ``grad_fn.metadata``.
TAG = "tracetorch"
#: On a call's output nodes: ``(frame, frontier, marks of the inner call or None)``: a parent
#: returning its child's output marks it after the child, so the outermost call heads the chain.
MARKS = "tracetorch.marks"

_grad_enabled = torch.is_grad_enabled
_current_node = torch._C._current_autograd_node


# ----------------------------------------------------------------------------- tagging
def _probe_node() -> Any:
    # A fresh autograd node, whatever grad mode the caller is in.
    with torch.inference_mode(False), torch.enable_grad():
        return torch.zeros(1, requires_grad=True).expand(1).grad_fn


_ACCUMULATE = type(_probe_node().next_functions[0][0])


def _tensors(value: Any, out: list[torch.Tensor], depth: int = 0) -> None:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif depth < 3:
        if isinstance(value, (tuple, list)):
            for item in value:
                _tensors(item, out, depth + 1)
        elif isinstance(value, dict):
            for item in value.values():
                _tensors(item, out, depth + 1)


def tag_call(frame: Frame, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
    """Exit observer: mark this call's output nodes with its frame and frontier."""
    if not _grad_enabled():
        return
    try:
        fn = output.grad_fn
    except AttributeError:  # not a tensor: a tuple, dict, dataclass... of outputs
        outputs: list[torch.Tensor] = []
        _tensors(output, outputs)
        if outputs:
            try:
                _mark_all(frame, args, kwargs, outputs)
            except Exception:  # marking must never break the user's model
                pass
        return
    if fn is None:
        return
    try:
        x = args[0] if len(args) == 1 and not kwargs else None
        if isinstance(x, torch.Tensor):  # the common call: one tensor in, one out
            if x is output:  # in place: the history below its newest node
                frontier = tuple(n for n, _ in fn.next_functions if n is not None)
            else:
                before = x.grad_fn
                frontier = () if before is None else (before,)
            meta = fn.metadata
            meta[MARKS] = (frame, frontier, meta.get(MARKS))
        else:
            _mark_all(frame, args, kwargs, [output])
    except Exception:
        return


def _mark(fn: Any, frame: Frame, frontier: tuple[Any, ...]) -> None:
    # A parent returning its child's output marks it again: the marks chain outwards.
    meta = fn.metadata
    meta[MARKS] = (frame, frontier, meta.get(MARKS))


def _mark_all(frame: Frame, args: tuple[Any, ...], kwargs: dict[str, Any],
              outputs: list[torch.Tensor]) -> None:
    inputs: list[torch.Tensor] = []
    _tensors(args, inputs)
    if kwargs:
        _tensors(kwargs, inputs)
    frontier: list[Any] = []
    for tensor in inputs:
        fn = tensor.grad_fn
        if fn is None:
            continue
        if any(tensor is out for out in outputs):  # modified in place
            frontier.extend(n for n, _ in fn.next_functions if n is not None)
        else:
            frontier.append(fn)
    boundary = tuple(frontier)
    seen: list[Any] = []
    for out in outputs:
        fn = out.grad_fn
        if fn is not None and not any(fn is s for s in seen):
            seen.append(fn)
            _mark(fn, frame, boundary)


class _Region:
    __slots__ = ("frame", "frontier", "outer")

    def __init__(self, frame: Frame, frontier: tuple[Any, ...], outer: _Region | None):
        self.frame = frame
        self.frontier = frontier
        self.outer = outer


def assign_regions(roots: list[Any]) -> int:
    """Tag every node reachable from ``roots`` with the innermost layer call owning it.

    Returns how many nodes were tagged.
    """
    stack: list[tuple[Any, _Region | None]] = [(r, None) for r in roots if r is not None]
    seen = set()
    tagged = 0
    while stack:
        node, region = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if type(node) is _ACCUMULATE:
            continue
        while region is not None and any(node is f for f in region.frontier):
            region = region.outer
        meta = node.metadata
        marks = meta.get(MARKS)
        if marks is not None:
            chain = []
            while marks is not None:  # the outermost call marked last, so it heads the chain
                chain.append(marks)
                marks = marks[2]
            for frame, frontier, _ in chain:  # open the outermost region first
                region = _Region(frame, frontier, region)
        if region is not None:
            meta[TAG] = region.frame
            tagged += 1
        elif TAG in meta:
            del meta[TAG]
        for nxt, _ in node.next_functions:
            if nxt is not None:
                stack.append((nxt, region))
    return tagged


def _roots_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    first = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
    tensors: list[torch.Tensor] = []
    _tensors(first, tensors)
    return [t.grad_fn for t in tensors if t.grad_fn is not None]


# ----------------------------------------------------------------------------- counting
class BackwardCounter(TorchDispatchMode):
    """Charges each aten operation of a backward pass to the layer that created its node.

    ``fallback`` receives operations of untagged nodes. ``timer`` (a device timer, see
    :mod:`tracetorch.adapters.torch.cuda`) replaces the profile's clock where set.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch would wrap __torch_dispatch__ in torch._dynamo.disable, importing all of dynamo
        # (over a second, and it rebinds torch.manual_seed) on a profile's first backward pass.
        return False

    def __init__(self, counter: OpCounter, fallback: Frame | None, timer: Any = None) -> None:
        super().__init__()
        self.counter = counter
        self.fallback = fallback
        self.timer = timer
        self._node: Any = None
        self._tag: Frame | None = fallback
        self._clock = counter.backward_clock(fallback)

    def _tag_of_current(self) -> Frame | None:
        node = _current_node()
        if node is not self._node:
            self._node = node
            tag = node.metadata.get(TAG) if node is not None else None
            self._tag = tag if tag is not None else self.fallback
            self._clock = self.counter.backward_clock(self._tag)
        return self._tag

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        tag = self._tag_of_current()
        timer = self.timer
        if timer is None:
            clock = self._clock
            start = clock()
            out = func(*args, **kwargs)
            elapsed = clock() - start
        else:
            timer.mark(tag)
            out = func(*args, **kwargs)
            elapsed = 0
        flops = backward_flops(func, args, kwargs, out)
        if tag is not None:
            self.counter.backward_op(tag, func.__name__ if flops else "", flops, flops > 0,
                                     elapsed)
        return out

    def finish(self) -> None:
        """End of the pass: a device timer charges its measured spans now."""
        self._node = None
        if self.timer is not None:
            for tag, elapsed in self.timer.resolve():
                if tag is not None:
                    self.counter.backward_op(tag, "", 0, False, elapsed)


# ----------------------------------------------------------------------------- passes
#: Runs one pass: ``recorder(func, args, kwargs)`` with the entry point torch handed the mode.
PassRecorder = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


def pass_recorder(counter: OpCounter, label: str | None = None) -> PassRecorder:
    """What the function mode calls for a backward entry point: the pass, recorded as a node of
    kind ``backward`` (named ``label``, by default ``backward``) whose operations are counted
    and timed per layer; the pass runs unrecorded while compiling or tracing, and inside
    another pass (a gradient taken in a custom ``backward``).

    Example:
        >>> import torch
        >>> run = pass_recorder(OpCounter())
        >>> x = torch.ones(2, requires_grad=True)
        >>> run(torch.autograd.grad, ((x * x).sum(), x), {})   # outside a profile: just runs
        (tensor([2., 2.]),)
    """
    record = _pass_wrapper(label)

    def recorded(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if tracing() or _current_node() is not None:
            return func(*args, **kwargs)

        def counted() -> Any:
            frame = current_frame()  # the pass's own node, unless the engine passed it through
            if frame is None or not frame.collector.active or frame.node.kind != "backward":
                return func(*args, **kwargs)
            try:
                assign_regions(_roots_of(args, kwargs))
            except Exception:  # attribution is best effort; the pass itself must run
                pass
            mode = BackwardCounter(counter, frame, backward_timer(frame.collector))
            try:
                with mode:
                    return func(*args, **kwargs)
            finally:
                mode.finish()
                frame.collector.flush_backward()

        return record(counted, None, (), {})

    return recorded


@functools.cache
def _pass_wrapper(label: str | None) -> Callable[..., Any]:
    # One engine wrapper per kind of pass for the whole process: its passes are one node, also
    # in a profile entered again after the last one closed (a new wrapper would be a new node).
    return make_wrapper("backward", label)
