"""Where a layer call's products sit in the autograd graph it built: what lets a call whose
operation counts are learned under grad mode mark its products without the function mode.

Under grad mode the function mode marks each product it counts (``scaled_dot_product_attention``,
``mm``...) with the gradient parts of its operands (:func:`~tracetorch.adapters.torch.marks.\
mark_operation`), which the backward pass charges to the layer. A call whose counts are learned
(:mod:`~tracetorch.adapters.torch.learned`) runs without the mode, so nothing sees its products
run; what is learned instead is where each product's autograd node is found from the call's
outputs, a :data:`Place`: which output, the edge taken at each node on the way
(``next_functions`` indices), the node's class name, and for each gradient part the node's edges
to the operands it names. After a replayed call :func:`place` follows those paths and hands back
each node with its parts resolved as the mode resolves them: an operand that is a leaf by its
``AccumulateGrad``'s variable, any other by its node (:class:`Operand`), so a part counts in a
pass exactly when the mode's own mark would have counted it (one case apart: an operand that is
no leaf, named itself in ``torch.autograd.grad``'s ``inputs``, is known to the pass by the
tensor, which a replay does not have; its part counts when the pass runs the operand's node).

A call is learned this way only where that is exact (:class:`ProductWatch` decides, while the
call is watched): every product the mode counted in it was marked, every tensor its parts name
needed a gradient (an operand that did not has no edge to find, and might need one later), and
each node was found from the outputs along nodes made after it (a product off the outputs' paths
is not learned). A later call whose operands stopped needing a gradient finds no edge there, or
no node, and marks only what the mode would have. A path that leads to a node of another class
(the same key running another kernel: a mask that came to need a gradient makes
``scaled_dot_product_attention`` run as plain products) is caught by :func:`place`, and the key
is counted by the mode from then on.

Example:
    >>> import torch
    >>> q = torch.ones(1, 2, 4, 8, requires_grad=True)
    >>> k, v = q * 2, q * 3
    >>> out = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)
    >>> watch = ProductWatch()
    >>> attention = out.grad_fn.next_functions[0][0]
    >>> watch.note(attention, [(10, (0, 1)), (20, (2,))], [q, k, v].__getitem__)
    >>> watch.locate([out])
    >>> watch.places  # (the node, from the output's by edge 0; q, k and v at its edges 0, 1, 2)
    ... # doctest: +NORMALIZE_WHITESPACE
    (('ScaledDotProductFlashAttentionForCpuBackward0', 0, (0,),
      ((10, ((0,), (1,))), (20, ((2,),)))),)
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, Callable

import torch

from tracetorch.adapters.torch.backward import ResolvedPart
from tracetorch.flops.gradients import GradientPart
from tracetorch.records.tree import CallNode

__all__ = ("WATCHED", "Operand", "Place", "ProductWatch", "place")

#: One product of a learned call: the node's class name, the output it is found from (its index
#: among the call's output tensors, as :func:`~tracetorch.adapters.torch.backward.\
#: collect_tensors` lists them), the edge taken at each node from there, and per gradient part
#: its FLOPs and, per operand it names, the edges from the node to that operand.
Place = tuple[str, int, tuple[int, ...], tuple[tuple[int, tuple[tuple[int, ...], ...]], ...]]

#: The nodes whose current call is watched under grad mode, with the products it marked so far:
#: filled by the learner, read by the function mode (which notes each product) and by the exit
#: observer (which finds them from the outputs). The C exit observer hands a call of a node
#: listed here to the Python one.
WATCHED: dict[CallNode, ProductWatch] = {}

#: How many nodes a search from a call's outputs looks at before it gives up (a product is
#: usually a few views away from an output: this bounds a call that built a long graph).
_SEARCH_LIMIT = 256
_ACCUMULATE = "AccumulateGrad"
#: What :func:`_follow` answers for a path that does not fit the graph.
_ASTRAY = object()


class Operand:
    """A product's operand that is no leaf, as a part's tensor: the backward pass asks only for
    its ``grad_fn`` (whether the pass runs it)."""

    __slots__ = ("grad_fn",)

    def __init__(self, grad_fn: Any) -> None:
        self.grad_fn = grad_fn

    def __repr__(self) -> str:
        return f"Operand({type(self.grad_fn).__name__})"


class ProductWatch:
    """The products one watched call marked (each node with its parts' edges), and whether the
    call can be learned with them: :attr:`learnable` turns False for good at a product it
    cannot place (see the module docstring), :attr:`places` is set when the call's exit found
    every node from the outputs."""

    __slots__ = ("marked", "learnable", "blind", "places")

    def __init__(self) -> None:
        self.marked: list[tuple[Any, tuple[tuple[int, tuple[tuple[int, ...], ...]], ...]]] = []
        self.learnable = True
        #: a product ran while marking was off (between the steps ``backward_every`` samples):
        #: the call teaches nothing
        self.blind = False
        self.places: tuple[Place, ...] | None = None

    def note(self, node: Any, parts: Sequence[GradientPart],
             tensor_of: Callable[[int | str], Any], marking: bool = True) -> None:
        """A product ran: ``node`` its autograd node as marked (``None``: not marked), ``parts``
        its symbolic gradient parts, ``tensor_of`` what each need of a part names;
        ``marking``: whether products were being marked at all."""
        if not marking:
            self.blind = True
            return
        if node is None or not parts:
            self.learnable = False
            return
        needs = {need for _, part_needs in parts for need in part_needs}
        paths = _operand_paths(node, {need: tensor_of(need) for need in needs})
        if paths is None:
            self.learnable = False
            return
        self.marked.append((node, tuple((flops, tuple(paths[need] for need in part_needs))
                                        for flops, part_needs in parts)))

    def locate(self, outputs: Sequence[Any]) -> None:
        """The call returned ``outputs`` (its tensors): find each marked node from them."""
        marked, self.marked = self.marked, []  # (the call's graph is not kept beyond its exit)
        if not self.learnable:
            return
        if not marked:
            self.places = ()
            return
        paths = _paths([tensor.grad_fn for tensor in outputs], [node for node, _ in marked])
        if paths is None:
            self.learnable = False
            return
        self.places = tuple((type(node).__name__, *path, parts)
                            for (node, parts), path in zip(marked, paths))


def _operand_paths(node: Any, operands: dict[Any, Any]) -> dict[Any, tuple[int, ...]] | None:
    # Per operand (keyed as the parts name it), the edges from the product's node to it: the
    # last leads to the operand (its node and output number; a leaf's AccumulateGrad), those
    # before it through the nodes the product itself made (a product torch runs as several,
    # such as scaled_dot_product_attention's math kernel: each made after every operand).
    wanted = []
    floor = -1
    for need, tensor in operands.items():
        if not isinstance(tensor, torch.Tensor) or not tensor.requires_grad:
            return None
        fn = tensor.grad_fn
        if fn is not None:
            floor = max(floor, fn._sequence_nr())
        wanted.append((need, fn, tensor.output_nr if fn is not None else 0, tensor))
    found: dict[Any, tuple[int, ...]] = {}
    seen: set[int] = set()
    queue: deque[tuple[Any, tuple[int, ...]]] = deque([(node, ())])
    while queue and len(found) < len(wanted) and len(seen) < _SEARCH_LIMIT:
        current, path = queue.popleft()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for edge, (target, output_nr) in enumerate(current.next_functions):
            if target is None:
                continue
            leaf = type(target).__name__ == _ACCUMULATE
            for need, fn, number, tensor in wanted:
                if need not in found and (
                        (target is fn and output_nr == number) if fn is not None
                        else leaf and target.variable is tensor):
                    found[need] = (*path, edge)
            if not leaf and target._sequence_nr() > floor:
                queue.append((target, (*path, edge)))
    return found if len(found) == len(wanted) else None


def _paths(starts: Sequence[Any], targets: Sequence[Any]
           ) -> list[tuple[int, tuple[int, ...]]] | None:
    # From which output, and along which edges, each target node is reached: a breadth-first
    # search over nodes made after the earliest target (a node on a path from an output to a
    # product consumes its result, so it was made later).
    floor = min(target._sequence_nr() for target in targets)
    wanted = {id(target): index for index, target in enumerate(targets)}
    found: list[tuple[int, tuple[int, ...]] | None] = [None] * len(targets)
    missing = len(targets)
    seen: set[int] = set()
    queue: deque[tuple[Any, int, tuple[int, ...]]] = deque(
        (start, output, ()) for output, start in enumerate(starts) if start is not None)
    looked = 0
    while queue and missing and looked < _SEARCH_LIMIT:
        node, output, path = queue.popleft()
        if id(node) in seen:
            continue
        seen.add(id(node))
        looked += 1
        index = wanted.get(id(node))
        if index is not None and found[index] is None:
            found[index] = (output, path)
            missing -= 1
        for edge, (target, _) in enumerate(node.next_functions):
            if target is not None and type(target).__name__ != _ACCUMULATE \
                    and target._sequence_nr() >= floor:
                queue.append((target, output, (*path, edge)))
    if missing:
        return None
    return found  # type: ignore[return-value]


def _follow(node: Any, path: tuple[int, ...]) -> Any:
    # The node reached from ``node`` along ``path``'s edges; None where an edge on the way is
    # empty (a tensor that needs no gradient), _ASTRAY where the path runs past a node's edges.
    for edge in path:
        if node is None:
            return None
        edges = node.next_functions
        if edge >= len(edges):
            return _ASTRAY
        node = edges[edge][0]
    return node


def place(outputs: Sequence[Any], places: Sequence[Place]
          ) -> list[tuple[Any, list[ResolvedPart]]] | None:
    """The nodes of a replayed call's products, found from its output tensors along ``places``,
    each with its parts resolved for this call (those with an operand needing a gradient); a
    product whose result needs no gradient now has no node and is left out. ``None`` where a
    path leads to a node of another class or past the edges there (another graph).

    Example:
        >>> import torch
        >>> w = torch.ones(3, 3, requires_grad=True)
        >>> out = (torch.ones(2, 3).mm(w) * 2,)
        >>> [(type(node).__name__, parts) for node, parts in
        ...  place(out, [("MmBackward0", 0, (0,), ((36, ((1,),)), (36, ((0,),))))])]
        [('MmBackward0', [(36, (tensor([[1., 1., 1.],
                [1., 1., 1.],
                [1., 1., 1.]], requires_grad=True),))])]
    """
    found = []
    for class_name, output, path, parts in places:
        if output >= len(outputs):
            return None
        node = _follow(outputs[output].grad_fn, path)
        if node is _ASTRAY:
            return None
        if node is None:  # its result needs no gradient in this call: nothing to charge
            continue
        if type(node).__name__ != class_name:
            return None
        resolved: list[ResolvedPart] = []
        for flops, operand_paths in parts:
            tensors = []
            for operand_path in operand_paths:
                target = _follow(node, operand_path)
                if target is _ASTRAY:
                    return None
                if target is not None:  # (None: this operand needs no gradient in this call)
                    tensors.append(target.variable if type(target).__name__ == _ACCUMULATE
                                   else Operand(target))
            if tensors:
                resolved.append((flops, tuple(tensors)))
        found.append((node, resolved))
    return found
