"""The layers of a ``torch.compile``\\ d module, from one eager run of its original on fake tensors.

Inside a compiled region the layers do not run as Python, so no wrapper sees them. Once per
distinct call (:func:`~tracetorch.engine.hotpath.call_key` of the original module: its inputs'
shapes and dtypes, the grad mode, the training flag) the original module (``_orig_mod``) runs
once more, eagerly, under torch's ``FakeTensorMode`` — no arithmetic, no memory — through
tracetorch's own recording (a private :class:`~tracetorch.engine.collector.Collector`), forward
and, with grad on, backward. So the layers' rows (call paths), forward FLOPs and backward FLOPs
are the eager ones by construction, with the same rules. :class:`Replay` keeps that subtree;
each compiled call charges it under the region's row.

The backward runs as ``torch.autograd.grad`` into the module's parameters that need a gradient
and the inputs that do, from every output that needs one (what a compiled backward computes:
AOT autograd's graph takes a gradient for each such output). Nothing accumulates into the
parameters' ``.grad``; the real parameters are read as fake ones, so no value, buffer or random
state changes. The module's Python runs again (forward hooks included): once per distinct call.

It needs an open profile (whose board wraps the layers' classes as they are first called).

Example:
    >>> import torch, tracetorch
    >>> layer = torch.nn.Linear(4, 2)
    >>> with tracetorch.profile():
    ...     replay = Replay.of(layer, (torch.ones(3, 4),), {}, grad=True)
    >>> [(row.type_name, row.calls, row.flops, row.backward_flops) for row in replay.layers]
    [('Linear', 1, 48, 48)]
    >>> layer.weight.grad is None              # the gradients were returned, not accumulated
    True
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from tracetorch.adapters.torch.backward import collect_tensors
from tracetorch.engine.collector import Collector
from tracetorch.engine.hotpath import close_root, open_root
from tracetorch.records.memory import MemoryStats
from tracetorch.records.tree import CallNode, NodeKind, RuleState, ShapeSignature

__all__ = ("Layer", "Replay")


class Layer(NamedTuple):
    """One row of a replayed subtree: its parent's index (``-1`` for the module itself), its
    name, type and kind, the module called (for the profile's module key), its calls in one
    call of the compiled module (a layer reused, called in a loop), and what they cost: their
    own forward FLOPs (GEMM part, MACs), backward FLOPs (GEMM part), parameters,
    where its FLOPs come from, its shapes, and the bytes those calls read, wrote and saved for
    backward (:class:`~tracetorch.records.memory.MemoryStats`; fake tensors have sizes)."""

    parent: int
    name: str
    type_name: str
    kind: NodeKind
    owner: Any
    calls: int
    flops: int
    gemm_flops: int
    macs: int | None
    backward_flops: int
    backward_gemm_flops: int
    params: int
    flops_source: str
    rule_state: RuleState
    input_shapes: list[ShapeSignature]
    output_shapes: list[ShapeSignature]
    memory: MemoryStats


class Replay:
    """The eager subtree of one compiled call (see the module docstring): its layers, parents
    first, and each one's inclusive forward and backward FLOPs (what estimated times are
    shared by)."""

    def __init__(self, layers: list[Layer]) -> None:
        self.layers = layers
        forward = [layer.flops for layer in layers]
        backward = [layer.backward_flops for layer in layers]
        for index in range(len(layers) - 1, 0, -1):  # children come after their parents
            parent = layers[index].parent
            forward[parent] += forward[index]
            backward[parent] += backward[index]
        #: Inclusive FLOPs of each layer (index 0: the whole call).
        self.inclusive_flops = forward
        self.inclusive_backward_flops = backward

    @classmethod
    def of(cls, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool,
           call: Callable[..., Any] | None = None) -> Replay:
        """Run ``module(*args, **kwargs)`` (or ``call(...)``, which runs it: its
        ``_call_impl``) on fake copies of the tensors, recorded, and (with ``grad``) its
        backward; raises what the run raises (an operation fake tensors cannot run: a value
        read from data)."""
        # Imported here, at a compiled call: importing torch's fake tensors (and Dynamo with
        # them) when a profile opens would change torch's namespace.
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._pytree import tree_map_only

        fake = FakeTensorMode(allow_non_fake_inputs=True)
        leaves: list[torch.Tensor] = []

        def to_fake(tensor: torch.Tensor) -> torch.Tensor:
            copy = fake.from_tensor(tensor.detach())
            if tensor.requires_grad:
                copy.requires_grad_(True)
                leaves.append(copy)
            return copy

        fake_args, fake_kwargs = tree_map_only(torch.Tensor, to_fake, (args, kwargs))
        root = CallNode.root()
        collector = Collector(root, module, clock=int, warn_unsupported=False)
        opened = open_root(collector.start(root))
        try:
            with fake, torch.set_grad_enabled(grad):
                output = (call or module)(*fake_args, **fake_kwargs)
                if grad:
                    _backward(module, output, leaves)
            owners = collector.owners_by_key()
        finally:
            close_root(collector, opened)
            collector.stop()
        layers = _flatten(root, owners)
        collector.release()
        return cls(layers)


def _backward(module: Any, output: Any, leaves: list[torch.Tensor]) -> None:
    # Gradients of every output that needs one, into the parameters and inputs that need one,
    # returned (not accumulated into .grad): what a compiled step's backward computes.
    outputs: list[torch.Tensor] = []
    collect_tensors(output, outputs)
    outputs = [t for t in outputs if t.requires_grad]
    wanted = [p for p in module.parameters() if p.requires_grad] + leaves
    if outputs and wanted:
        torch.autograd.grad(outputs, wanted, [torch.ones_like(t) for t in outputs],
                            allow_unused=True)


def _flatten(root: CallNode, owners: dict[str, Any]) -> list[Layer]:
    # The module's own node (the recording's one top-level layer) and its subtree, parents
    # first; the backward pass's own node is left out (the real pass has one).
    tops = [node for node in root.children.values() if node.kind == "module"]
    if len(tops) != 1:
        raise RuntimeError(f"the replay recorded {len(tops)} top-level layers, expected 1")
    layers: list[Layer] = []
    stack: list[tuple[int, CallNode]] = [(-1, tops[0])]
    while stack:
        parent, node = stack.pop()
        index = len(layers)
        layers.append(Layer(
            parent, node.name, node.type_name, node.kind, owners.get(node.module_key),
            node.calls,
            node.flops, node.gemm_flops, node.macs, node.backward_flops,
            node.backward_gemm_flops, node.params, node.flops_source, node.engine.rule_state,
            list(node.input_shapes), list(node.output_shapes), node.memory))
        stack.extend((index, child) for child in reversed(node.children.values()))
    return layers
