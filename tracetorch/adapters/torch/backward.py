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

**Counting, during backward.** While profiling, ``torch.autograd.backward`` (what
``Tensor.backward`` calls) and ``torch.autograd.grad`` run their pass under a
``TorchDispatchMode``. For every aten operation it asks torch which autograd node is executing
(``torch._C._current_autograd_node()``), reads that node's layer, counts the operation's FLOPs
with the formulas of :data:`BACKWARD_FORMULAS` (matrix products, convolutions and their
backward, attention kernels: what ``torch.utils.flop_counter`` counts, so the totals agree) and
times it. Each is charged with ``counter.backward_op(frame, ...)`` to the layer call whose
forward made the node; the rest goes to the backward call itself. When the pass ends each layer
it touched gets one backward sample.

The dispatch mode costs a few µs per aten operation of the backward pass, outside the measured
operation times (the enclosing ``backward`` node's time includes it, and the region walk).
Forward operations re-run inside a backward pass (activation checkpointing) count as backward
work. A layer that computes from a tensor that is neither an input nor made inside it (one
kept on ``self`` from an earlier call) also claims that tensor's untagged history.

Example:
    >>> import torch
    >>> backward_flops(torch.ops.aten.mm.default, (torch.zeros(2, 3), torch.zeros(3, 4)), {}, None)
    48
"""
from __future__ import annotations

import time
from math import prod
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tracetorch.adapters.torch.ops import conv_flops, sdpa_flops, set_suspended, suspended
from tracetorch.engine.hotpath import Frame, OpCounter, current_frame

__all__ = ("TAG", "MARKS", "tag_call", "assign_regions", "BackwardCounter", "AutogradPatches",
           "backward_flops", "BACKWARD_FORMULAS")

#: The key under which a node's creating layer call is kept in ``grad_fn.metadata``.
TAG = "tracetorch"
#: On a call's output nodes: ``(frame, frontier, marks of the inner call or None)``: a parent
#: returning its child's output marks it after the child, so the outermost call heads the chain.
MARKS = "tracetorch.marks"

_aten = torch.ops.aten
_grad_enabled = torch.is_grad_enabled
_current_node = torch._C._current_autograd_node


# ----------------------------------------------------------------------------- tagging
def _probe_node() -> Any:
    # A fresh autograd node, whatever grad mode the caller is in.
    with torch.inference_mode(False), torch.enable_grad():
        return torch.zeros(1, requires_grad=True).expand(1).grad_fn


_ACCUMULATE = type(_probe_node().next_functions[0][0])


def _tensors(value: Any, out: List[torch.Tensor], depth: int = 0) -> None:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif depth < 3:
        if isinstance(value, (tuple, list)):
            for item in value:
                _tensors(item, out, depth + 1)
        elif isinstance(value, dict):
            for item in value.values():
                _tensors(item, out, depth + 1)


def tag_call(frame: Frame, args: Tuple[Any, ...], kwargs: Dict[str, Any], output: Any) -> None:
    """Exit observer: mark this call's output nodes with its frame and frontier."""
    if not _grad_enabled():
        return
    try:
        fn = output.grad_fn
    except AttributeError:  # not a tensor: a tuple, dict, dataclass... of outputs
        outputs: List[torch.Tensor] = []
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


def _mark(fn: Any, frame: Frame, frontier: Tuple[Any, ...]) -> None:
    # A parent returning its child's output marks it again: the marks chain outwards.
    meta = fn.metadata
    meta[MARKS] = (frame, frontier, meta.get(MARKS))


def _mark_all(frame: Frame, args: Tuple[Any, ...], kwargs: Dict[str, Any],
              outputs: List[torch.Tensor]) -> None:
    inputs: List[torch.Tensor] = []
    _tensors(args, inputs)
    if kwargs:
        _tensors(kwargs, inputs)
    frontier: List[Any] = []
    for tensor in inputs:
        fn = tensor.grad_fn
        if fn is None:
            continue
        if any(tensor is out for out in outputs):  # modified in place
            frontier.extend(n for n, _ in fn.next_functions if n is not None)
        else:
            frontier.append(fn)
    boundary = tuple(frontier)
    seen: List[Any] = []
    for out in outputs:
        fn = out.grad_fn
        if fn is not None and not any(fn is s for s in seen):
            seen.append(fn)
            _mark(fn, frame, boundary)


class _Region:
    __slots__ = ("frame", "frontier", "outer")

    def __init__(self, frame: Frame, frontier: Tuple[Any, ...], outer: Optional["_Region"]):
        self.frame = frame
        self.frontier = frontier
        self.outer = outer


def assign_regions(roots: List[Any]) -> int:
    """Tag every node reachable from ``roots`` with the innermost layer call owning it.

    Returns how many nodes were tagged.
    """
    stack: List[Tuple[Any, Optional[_Region]]] = [(r, None) for r in roots if r is not None]
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


def _roots_of(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Any]:
    first = args[0] if args else kwargs.get("tensors", kwargs.get("outputs"))
    tensors: List[torch.Tensor] = []
    _tensors(first, tensors)
    return [t.grad_fn for t in tensors if t.grad_fn is not None]


# ----------------------------------------------------------------------------- formulas
def _s(value: Any) -> Tuple[int, ...]:
    return tuple(value.shape)


def _t(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    return (shape[1], shape[0]) + tuple(shape[2:])


def _mm(args, kwargs, out):
    a, b = _s(args[0]), _s(args[1])
    return 2 * a[0] * a[1] * b[1]


def _addmm(args, kwargs, out):
    return _mm(args[1:], kwargs, out)


def _bmm(args, kwargs, out):
    a, b = _s(args[0]), _s(args[1])
    return 2 * a[0] * a[1] * a[2] * b[2]


def _baddbmm(args, kwargs, out):
    return _bmm(args[1:], kwargs, out)


def _convolution(args, kwargs, out):
    x, w, transposed = _s(args[0]), _s(args[1]), bool(args[6])
    return conv_flops(x, w, _s(out), transposed)


def _conv_backward(args, kwargs, out):
    grad_out, x, w = _s(args[0]), _s(args[1]), _s(args[2])
    transposed, mask = bool(args[7]), args[10]
    flops = 0
    if mask[0] and out[0] is not None:  # grad_input: the transposed convolution of grad_out
        flops += conv_flops(grad_out, w, _s(out[0]), not transposed)
    if mask[1] and out[1] is not None:  # grad_weight: a convolution of the input by grad_out
        grad_w = _t(_s(out[1]))
        if transposed:
            flops += conv_flops(_t(grad_out), _t(x), grad_w, False)
        else:
            flops += conv_flops(_t(x), _t(grad_out), grad_w, False)
    return flops


def _sdpa(args, kwargs, out):
    return sdpa_flops(_s(args[0]), _s(args[1]), _s(args[2]))


def _sdpa_backward_count(q: Tuple[int, ...], k: Tuple[int, ...], v: Tuple[int, ...]) -> int:
    # Scores recomputed (q·kᵀ), then d(scores) = dO·vᵀ, dV = Pᵀ·dO, dQ = dS·k, dK = dSᵀ·q.
    return 2 * prod(q[:-2]) * q[-2] * k[-2] * (3 * q[-1] + 2 * v[-1])


def _sdpa_backward(args, kwargs, out):
    return _sdpa_backward_count(_s(args[1]), _s(args[2]), _s(args[3]))


def _bshd(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    # The raw flash/efficient kernels take (batch, sequence, heads, dim).
    return (shape[0], shape[2], shape[1], shape[3])


def _raw_attention(args, kwargs, out):
    return sdpa_flops(_bshd(_s(args[0])), _bshd(_s(args[1])), _bshd(_s(args[2])))


def _raw_attention_backward(args, kwargs, out):
    return _sdpa_backward_count(_bshd(_s(args[1])), _bshd(_s(args[2])), _bshd(_s(args[3])))


def _packets(*names: str) -> List[Any]:
    return [getattr(_aten, n) for n in names if hasattr(_aten, n)]


#: FLOP formulas by aten overload packet, for the operations a backward pass runs.
BACKWARD_FORMULAS: Dict[Any, Callable[..., int]] = {}
for _packet, _formula in (
        (("mm",), _mm), (("addmm",), _addmm), (("bmm",), _bmm), (("baddbmm",), _baddbmm),
        (("convolution", "_convolution", "cudnn_convolution", "convolution_overrideable",
          "_slow_conv2d_forward"), _convolution),
        (("convolution_backward",), _conv_backward),
        (("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
          "_scaled_dot_product_cudnn_attention",
          "_scaled_dot_product_flash_attention_for_cpu"), _sdpa),
        (("_scaled_dot_product_efficient_attention_backward",
          "_scaled_dot_product_flash_attention_backward",
          "_scaled_dot_product_cudnn_attention_backward",
          "_scaled_dot_product_flash_attention_for_cpu_backward"), _sdpa_backward),
        (("_flash_attention_forward", "_efficient_attention_forward"), _raw_attention),
        (("_flash_attention_backward", "_efficient_attention_backward"),
         _raw_attention_backward)):
    for _op in _packets(*_packet):
        BACKWARD_FORMULAS[_op] = _formula


def backward_flops(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], out: Any) -> int:
    """FLOPs of one aten operation (0 for operations without a formula)."""
    formula = BACKWARD_FORMULAS.get(getattr(func, "overloadpacket", None))
    if formula is None:
        return 0
    try:
        return int(formula(args, kwargs, out))
    except Exception:
        return 0


# ----------------------------------------------------------------------------- counting
class BackwardCounter(TorchDispatchMode):
    """Charges each aten operation of a backward pass to the layer that created its node.

    ``fallback`` receives operations of untagged nodes. ``timer`` (a device timer, see
    :mod:`tracetorch.adapters.torch.cuda`) replaces the host clock where set.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch would wrap __torch_dispatch__ in torch._dynamo.disable, importing all of dynamo
        # (over a second, and it rebinds torch.manual_seed) on a profile's first backward pass.
        return False

    def __init__(self, counter: OpCounter, fallback: Optional[Frame], timer: Any = None) -> None:
        super().__init__()
        self.counter = counter
        self.fallback = fallback
        self.timer = timer
        self._node: Any = None
        self._tag: Optional[Frame] = fallback

    def _tag_of_current(self) -> Optional[Frame]:
        node = _current_node()
        if node is not self._node:
            self._node = node
            tag = node.metadata.get(TAG) if node is not None else None
            self._tag = tag if tag is not None else self.fallback
        return self._tag

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        tag = self._tag_of_current()
        timer = self.timer
        if timer is None:
            start = time.perf_counter_ns()
            out = func(*args, **kwargs)
            elapsed = time.perf_counter_ns() - start
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


class AutogradPatches:
    """Wraps ``torch.autograd.backward`` and ``torch.autograd.grad`` while profiling."""

    def __init__(self, counter: OpCounter, timer_factory: Callable[[], Any] = lambda: None) -> None:
        self.counter = counter
        self.timer_factory = timer_factory
        self._saved: List[Tuple[str, Any]] = []

    def install(self) -> None:
        """Replace both functions in ``torch.autograd`` with counting versions."""
        for name in ("backward", "grad"):
            original = vars(torch.autograd)[name]
            setattr(torch.autograd, name, self._wrap(original))
            self._saved.append((name, original))

    def restore(self) -> None:
        """Put the originals back."""
        while self._saved:
            name, original = self._saved.pop()
            setattr(torch.autograd, name, original)

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        counter = self.counter
        timer_factory = self.timer_factory

        def counted_pass(*args: Any, **kwargs: Any) -> Any:
            frame = current_frame()
            if frame is None or suspended():
                return original(*args, **kwargs)
            try:
                assign_regions(_roots_of(args, kwargs))
            except Exception:  # attribution is best effort; the pass itself must run
                pass
            mode = BackwardCounter(counter, frame, timer_factory())
            previous = set_suspended(True)
            try:
                with mode:
                    return original(*args, **kwargs)
            finally:
                set_suspended(previous)
                mode.finish()
                frame.collector.flush_backward()

        counted_pass.__wrapped__ = original  # type: ignore[attr-defined]
        counted_pass.__name__ = getattr(original, "__name__", "backward")
        counted_pass.__doc__ = getattr(original, "__doc__", None)
        return counted_pass
