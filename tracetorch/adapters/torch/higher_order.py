"""Backward passes through gradients: the FLOPs of differentiating a gradient taken with
``create_graph=True`` (a gradient penalty, a Hessian-vector product, MAML, a physics-informed
loss).

A layer's backward FLOPs come from marks on its forward output (:mod:`.backward`): the nodes a
pass with ``create_graph=True`` adds to the graph — the gradient computation made
differentiable — belong to no layer and carry no mark, so a later pass through them did work no
formula charged (a gradient penalty's second pass: 0 FLOPs where
``torch.utils.flop_counter.FlopCounterMode`` counts 9,216). A dispatch mode closes that gap, on
only the passes that need it:

* **A pass with ``create_graph=True``** notes which autograd nodes it created: their sequence
  numbers, which autograd draws from a counter per thread, so a pass's nodes on a thread are
  one interval of that thread's numbers (on the pass's own thread from its start to its end; on
  autograd's device threads from the first to the last operation the mode saw there).
* **A later pass of the same profile** counts, with torch's own formulas (:func:`aten_flops`:
  products, convolutions and attention, as the layers' gradient parts count only products),
  what the nodes inside those intervals run — the gradient graphs' work — and apart what every
  other node runs. Layers reached through their outputs are charged by their marks, as in any
  pass; a pass that enters a layer's graph in its middle (an RNN's steps, through the
  activations a gradient saved) runs work no mark charges: the forward graph's dispatched FLOPs
  beyond what the marks charged. Both are the pass's own (its ``backward`` node's backward
  FLOPs), as are the products at the profile's root. A compiled region's nodes
  (:data:`REGION_NODE`) are left to the region, which charges its backward itself.

Ordinary passes pay a dictionary check each. A pass that must count its operations pays
torch's Python dispatch per operation, like ``FlopCounterMode``: only after a pass with
``create_graph=True`` in the same profile. With ``profile(ops=False)`` no pass is seen before
it runs (:func:`~.backward.implicit_pass`), and a pass building a graph is only warned of.

Example:
    >>> import torch, tracetorch
    >>> lin = torch.nn.Linear(4, 3, bias=False)
    >>> x = torch.ones(2, 4, requires_grad=True)
    >>> with tracetorch.profile() as prof:
    ...     (grad,) = torch.autograd.grad(lin(x).sum(), x, create_graph=True)  # dX: 2·2·3·4
    ...     grad.pow(2).sum().backward()       # through dX = dY·W: dW, 2·2·3·4
    >>> prof.find("autograd.grad").flops, prof.find("backward").backward_flops
    (48, 48)
"""
from __future__ import annotations

import bisect
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import conv_flop_count, flop_registry

if TYPE_CHECKING:
    from tracetorch.engine.collector import Collector

__all__ = ("REGION_NODE", "GradientGraphs", "aten_flops", "builds_graph", "gradient_graph_mode",
           "warn_unseen_graph")

_next_sequence_nr: Callable[[], int] = torch._C._autograd._get_sequence_nr
_current_node = torch._C._current_autograd_node
_thread_id = threading.get_ident


def aten_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """The FLOPs of one dispatched ATen operation by ``torch.utils.flop_counter``'s formulas
    (products, convolutions, attention kernels), where they are right: a grouped convolution's
    weight gradient costs its forward's FLOPs (the formula counts ``groups`` times that), and
    CPU's flash attention kernels cost what the fused kernels cost on GPU (it has no formula for
    them). 0 for an operation with none, or one whose formula cannot read these arguments.

    Example:
        >>> a, b = torch.ones(2, 3), torch.ones(3, 4)
        >>> aten_flops(torch.ops.aten.mm.default, (a, b), {}, a @ b)        # 2·2·3·4
        48
    """
    packet = func._overloadpacket
    formula = _FORMULAS.get(packet)
    if formula is None:
        return 0
    try:
        flops = int(formula(*args, **kwargs, out_val=out))
        if packet is _CONVOLUTION_BACKWARD:
            flops -= _grouped_weight_excess(*args)
    except Exception:  # a formula that cannot read these arguments: left uncounted
        return 0
    return flops


_CONVOLUTION_BACKWARD = torch.ops.aten.convolution_backward
#: torch's formulas by operation, with those of CPU's flash attention kernels added.
_FORMULAS: dict[Any, Callable[..., Any]] = {
    **flop_registry,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
        flop_registry[torch.ops.aten._scaled_dot_product_flash_attention],
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
        flop_registry[torch.ops.aten._scaled_dot_product_flash_attention_backward],
}


def _grouped_weight_excess(grad_output: Any, data: Any, weight: Any, bias_sizes: Any,
                           stride: Any, padding: Any, dilation: Any, transposed: bool,
                           output_padding: Any, groups: int, output_mask: Any) -> int:
    # What torch's formula adds to a grouped convolution's weight gradient: groups - 1 times
    # the forward's FLOPs.
    if groups <= 1 or not output_mask[1]:
        return 0
    forward = conv_flop_count(list(data.shape), list(weight.shape), list(grad_output.shape),
                              transposed)
    return (groups - 1) * int(forward)


def builds_graph(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a backward entry point (``Tensor.backward``, ``torch.autograd.backward`` or
    ``torch.autograd.grad``), called so, differentiates its own gradient computation
    (``create_graph=True``).

    Example:
        >>> builds_graph(torch.autograd.grad, (None, None), {"create_graph": True})
        True
        >>> builds_graph(torch.Tensor.backward, (None, None, None, True), {})
        True
    """
    if "create_graph" in kwargs:
        return bool(kwargs["create_graph"])
    # Positionally: (tensor, gradient, retain_graph, create_graph); (tensors, grad_tensors,
    # retain_graph, create_graph); (outputs, inputs, grad_outputs, retain_graph, create_graph).
    at = 4 if func is torch.autograd.grad else 3
    return len(args) > at and bool(args[at])


class GradientGraphs:
    """The sequence-number intervals of the nodes that one profile's passes with
    ``create_graph=True`` created, per thread (appended in the order the counter gives them).

    Example:
        >>> graphs = GradientGraphs()
        >>> graphs.add(7, 10, 14)
        >>> graphs.holds(7, 12), graphs.holds(7, 14), graphs.holds(8, 12)
        (True, False, False)
    """

    def __init__(self) -> None:
        self._starts: dict[int, list[int]] = {}
        self._ends: dict[int, list[int]] = {}

    def add(self, thread: int, start: int, end: int) -> None:
        """The nodes numbered ``start`` to ``end - 1`` on ``thread`` are a gradient graph's."""
        if end > start:
            self._starts.setdefault(thread, []).append(start)
            self._ends.setdefault(thread, []).append(end)

    def holds(self, thread: int, number: int) -> bool:
        """Whether the node numbered ``number`` on ``thread`` is a gradient graph's."""
        starts = self._starts.get(thread)
        if not starts:
            return False
        at = bisect.bisect_right(starts, number) - 1
        return at >= 0 and number < self._ends[thread][at]


#: The key of ``grad_fn.metadata`` marking a node of a compiled region: the region charges its
#: backward itself (:mod:`.compiled`), so no pass counts what the node runs.
REGION_NODE = "tracetorch.region"

#: Each profile's gradient graphs, from its first pass with ``create_graph=True``.
_GRAPHS: weakref.WeakKeyDictionary[Collector, GradientGraphs] = weakref.WeakKeyDictionary()

#: ``report(gradient_graphs, forward_graph)``: what a pass ran, in FLOPs, on the nodes of
#: gradient graphs and on all others.
Report = Callable[[int, int], None]


class _GraphPassMode(TorchDispatchMode):
    """One backward pass's dispatch mode: counts the FLOPs run by the nodes of earlier gradient
    graphs and by all others (``counted``, when the profile has some), and notes the nodes the
    pass creates (``building``) on each thread but its own, whose interval the caller knows."""

    def __init__(self, graphs: GradientGraphs, counted: bool, building: bool) -> None:
        super().__init__()
        self.graphs, self.counted, self.building = graphs, counted, building
        self.owner = _thread_id()
        self.gradient_graphs = self.forward_graph = 0
        #: Device threads' intervals: the first number an operation there saw, the next after.
        self.created: dict[int, list[int]] = {}

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """A compiled backward runs as without the mode (its graph's own nodes hold the work)."""
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        thread = _thread_id()
        noting = self.building and thread != self.owner
        if noting and thread not in self.created:
            # An operation's autograd node is made before it dispatches: at most this one
            # (numbered one less) is older than the mode's first sight of the thread.
            first = _next_sequence_nr() - 1
            self.created[thread] = [first, first]
        out = func(*args, **kwargs)
        if noting:
            self.created[thread][1] = _next_sequence_nr()
        if self.counted:
            node = _current_node()
            if node is not None:
                flops = aten_flops(func, args, kwargs, out)
                if flops:
                    if self.graphs.holds(thread, node._sequence_nr()):
                        self.gradient_graphs += flops
                    elif REGION_NODE not in node.metadata:
                        self.forward_graph += flops
        return out


class _GraphPass:
    """The context of one pass that gradient graphs concern (see :func:`gradient_graph_mode`)."""

    def __init__(self, mode: _GraphPassMode, report: Report) -> None:
        self.mode, self.report = mode, report
        self.start = 0

    def __enter__(self) -> None:
        self.start = _next_sequence_nr()
        self.mode.__enter__()

    def __exit__(self, *exc: object) -> None:
        mode = self.mode
        mode.__exit__(*exc)
        if mode.building:
            mode.graphs.add(mode.owner, self.start, _next_sequence_nr())
            for thread, (start, end) in mode.created.items():
                mode.graphs.add(thread, start, end)
        if mode.counted:
            self.report(mode.gradient_graphs, mode.forward_graph)


def gradient_graph_mode(collector: Collector, func: Callable[..., Any], args: tuple[Any, ...],
                        kwargs: dict[str, Any], report: Report) -> _GraphPass | None:
    """The context to run a recorded pass in, if gradient graphs concern it: it builds one
    (``create_graph=True``), or its profile holds some that it may reach, and then ``report``
    gets the FLOPs it ran (see :data:`Report`); ``None`` otherwise: the pass runs as it is.

    Example:
        >>> import tracetorch
        >>> from tracetorch.engine.hotpath import current_frame
        >>> x = torch.ones(3, requires_grad=True)
        >>> with tracetorch.profile():
        ...     collector = current_frame().collector
        ...     gradient_graph_mode(collector, torch.autograd.grad, ((x * x).sum(), x), {},
        ...                         print) is None
        True
    """
    building = builds_graph(func, args, kwargs)
    if not (building or _GRAPHS) or not collector.backward_on:
        # (a step ``backward_every`` leaves out: no pass is charged)
        return None
    graphs = _GRAPHS.get(collector)
    if graphs is None:
        if not building:
            return None
        graphs = _GRAPHS[collector] = GradientGraphs()
        counted = False
    else:
        counted = True
    return _GraphPass(_GraphPassMode(graphs, counted, building), report)


def warn_unseen_graph() -> None:
    """Warn that a pass building a gradient graph ran where no function mode saw it
    (``profile(ops=False)``): what later passes do through its gradients is not counted.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_unseen_graph()
        >>> "create_graph=True" in str(caught[0].message)
        True
    """
    warnings.warn(
        "tracetorch: a backward pass with create_graph=True ran under profile(ops=False): the "
        "FLOPs of later passes through the gradients it computed are not counted (profile() "
        "with ops=True counts them)", RuntimeWarning, stacklevel=2)
