"""Marking, during forward: each torch layer call's autograd nodes, with what their backward costs.

After each torch layer call returns (the engine's exit observer), the ``grad_fn`` of its output
is marked, in ``node.metadata``, with a :data:`~tracetorch.adapters.torch.backward.Mark`: the
call's frame and its *gradient parts* (:mod:`tracetorch.flops.gradients`: the GEMM work its
gradient will take, each piece with the tensors that must need a gradient for the pass to do it,
resolved for this call: an input's ``grad_fn``, or a leaf tensor such as a weight). A counted
tensor operation inside a layer without a rule (``x @ w`` in a custom layer) marks its own output
the same way. A node marked for the first time gets the hook (see :data:`_HOOK_CARRIER`); nothing
is added to modules or tensors, and the marks live and die with the graph. Under
``torch.no_grad()``/inference mode this costs one ``is_grad_enabled()`` check, made by the
engine before it calls the observer.

The hook a marked node gets, and the backward passes that read the marks and charge each layer,
are :mod:`~tracetorch.adapters.torch.backward`'s. The C ``Marker`` (``_marks.c``), which stands
for :func:`tag_call`, reads this module's globals by name (``_Tensor``, ``MARKS``...: every name
it reads is in :data:`tracetorch.engine.native.C_NAMES`): ``MARKS``, which
:mod:`~tracetorch.adapters.torch.backward` defines, is imported here by name for it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

import torch

from tracetorch.adapters.torch.backward import (
    MARKED_NODE_HOOK,
    MARKS,
    ResolvedPart,
    collect_tensors,
)
from tracetorch.adapters.torch.learned import LEARNED_PRODUCTS, LEARNED_QUIET, note_marked
from tracetorch.adapters.torch.product_paths import WATCHED, ProductWatch, place
from tracetorch.engine.hotpath import Frame
from tracetorch.flops.gradients import GradientPart, layer_gradient_parts
from tracetorch.models.introspect import bound_inputs
from tracetorch.records.tree import ENTRY_FIELDS, LEARNED

__all__ = ("tag_call", "mark_operation", "operation_tensors", "resolve_parts")

#: Where a call's symbolic gradient parts are kept in its per-shape counter, after the engine's
#: own slots (the C ``Marker`` reads it when it is made).
_PARTS = len(ENTRY_FIELDS)

_grad_enabled = torch.is_grad_enabled
_torch_function_enabled = torch._C._is_torch_function_enabled
_no_subclass_dispatch = torch._C.DisableTorchFunctionSubclass
_is_parametrized = torch.nn.utils.parametrize.is_parametrized
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


# ----------------------------------------------------------------------------- marking
#: What puts the hook on a marked node: a tensor of our own whose hook dict holds the hook alone.
#: ``grad_fn._register_hook_dict(tensor)`` adds a tensor's hook dict to a node as a tensor
#: pre-hook (what ``Tensor.register_hook`` does for a tensor's own node); handed this tensor, it
#: adds the hook to any node, and autograd runs it when the node runs. So the layer's output
#: is left as it was (its ``_backward_hooks`` stay the user's, ``torch.save`` sees none of ours)
#: and nothing is made per call: ``register_prehook`` allocates a handle on every call, and a
#: hook dict of the output's own (set through ``_backward_hooks``) makes torch add a second,
#: unused hook to the tensor, each freed under the GIL, which cost more than the rest of marking.
#: The hook ignores its argument (the gradient of the node's first output, or ``None``). On the
#: CPU whatever the default device: importing must not initialise CUDA.
_HOOK_CARRIER = torch.empty(0, device="cpu")
_HOOK_CARRIER._backward_hooks = {"tracetorch": MARKED_NODE_HOOK}


def _lasting_node(tensor: Any, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The node of ``tensor`` (its ``grad_fn``, ``fn``) that stays in the graph if the tensor is
    written in place later (``h += x``, ``h[mask] = e`` on a Linear's output of a 3-D input,
    which is a view): autograd replaces a view's node then, rebuilt over its base's, and the
    base's node stays. The base's node only where the call made the base: not an input, the
    node of one, or an input's base (a layer that hands back a view of what it was given).

    Example:
        >>> x, weight = torch.ones(2, 3, 4), torch.ones(5, 4, requires_grad=True)
        >>> out = torch.nn.functional.linear(x, weight, torch.ones(5))   # addmm, then a view
        >>> type(_lasting_node(out, out.grad_fn, (x, weight), {})).__name__
        'AddmmBackward0'
        >>> y = out * 1
        >>> view = y.view(6, 5)                              # a view of what the call was given
        >>> _lasting_node(view, view.grad_fn, (y,), {}) is view.grad_fn
        True
    """
    base = tensor._base
    if base is None:
        return fn
    below = base.grad_fn
    if below is None or below is fn:
        return fn
    for value in (*args, *kwargs.values()):
        if isinstance(value, _Tensor) and (
                value is base or value.grad_fn is below or value._base is base):
            return fn
    return below


def _mark(fn: Any, frame: Frame, parts: Sequence[ResolvedPart]) -> None:
    meta = fn.metadata
    inner = meta.get(MARKS)
    meta[MARKS] = (frame, parts, inner)
    if inner is None:  # else the node's hook is there already
        fn._register_hook_dict(_HOOK_CARRIER)


def _mark_innermost(fn: Any, frame: Frame, parts: Sequence[ResolvedPart]) -> None:
    # A product's mark put where the function mode's would be: at the end of the node's chain
    # (the mode marks a product while it runs, before any layer returning it marks it on exit).
    meta = fn.metadata
    chain = meta.get(MARKS)
    if chain is None:
        _mark(fn, frame, parts)
        return
    outer: list[tuple[Frame, Sequence[ResolvedPart]]] = []
    while chain is not None:
        marked_frame, marked_parts, chain = chain
        outer.append((marked_frame, marked_parts))
    rebuilt: Any = (frame, parts, None)
    for marked_frame, marked_parts in reversed(outer):
        rebuilt = (marked_frame, marked_parts, rebuilt)
    meta[MARKS] = rebuilt


def _needing_grad(value: Any, out: list[Any]) -> None:
    # The tensors behind one named input that need a gradient: the tensor, the tensors of a
    # tuple or list (an RNN's ``(h0, c0)``, einsum's operands), a packed sequence's data. They
    # are kept for the pass to ask whether it computes their gradients; they are a layer's
    # inputs and weights, which its own backward keeps alive anyway.
    if isinstance(value, _Tensor):
        if value.requires_grad:
            out.append(value)
    elif isinstance(value, (tuple, list)):
        data = getattr(value, "data", None)  # a PackedSequence is a NamedTuple
        if isinstance(data, _Tensor):
            _needing_grad(data, out)
        else:
            for item in value:
                _needing_grad(item, out)


def resolve_parts(parts: Sequence[GradientPart], tensor_of: Callable[[int | str], Any]
                  ) -> list[ResolvedPart]:
    """The parts of one call whose work can happen: each with the tensors found through
    ``tensor_of`` (an input index or parameter name → the value) that need a gradient.

    Example:
        >>> w = torch.ones(2, requires_grad=True)
        >>> resolve_parts([(8, (0,)), (8, ("weight",))], {0: torch.ones(2), "weight": w}.get)
        [(8, (tensor([1., 1.], requires_grad=True),))]
    """
    resolved = []
    for flops, needs in parts:
        tensors: list[Any] = []
        for need in needs:
            value = tensor_of(need)
            if value.__class__ is _Parameter or value.__class__ is _Tensor:
                if value.requires_grad:  # the common case, without a call
                    tensors.append(value)
            else:
                _needing_grad(value, tensors)
        if tensors:
            resolved.append((flops, tuple(tensors)))
    return resolved


def _symbolic_parts(frame: Frame, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
                    entry: list[Any]) -> Sequence[GradientPart]:
    # A call's symbolic parts, once per input shape, kept in its per-shape counter (``()``: its
    # gradient is no product, or its type has no formula).
    symbolic = None
    if frame.node.engine.rule_state == "rule":
        try:
            symbolic = layer_gradient_parts(
                frame.owner, bound_inputs(frame.owner, args, kwargs), output)
        except Exception:  # an unusual call is not worth breaking the model for
            symbolic = None
    entry.append(symbolic or ())
    return entry[_PARTS]


def _layer_parts(frame: Frame, args: tuple[Any, ...], kwargs: dict[str, Any],
                 symbolic: Sequence[GradientPart]) -> list[ResolvedPart]:
    # Resolved per call: whether an input or weight needs a gradient may change between calls.
    # Parts name inputs by position, as rules read them: keyword arguments are bound to the
    # forward's signature, only for calls that have parts (most keyword-called layers have none).
    if kwargs:
        args = bound_inputs(frame.owner, args, kwargs)
    layer = frame.owner
    own = getattr(layer, "_parameters", None) or {}

    def tensor_of(need: int | str) -> Any:
        if isinstance(need, int):
            return args[need] if need < len(args) else None
        found = own.get(need)  # a parameter of its own: no Module.__getattr__
        return found if found is not None else _named_tensor(layer, need)

    return resolve_parts(symbolic, tensor_of)


def _named_tensor(layer: Any, name: str) -> Any:
    # A tensor a part names: a submodule's parameter ("self_attn.in_proj_weight"), an attribute.
    # A parametrized one (torch.nn.utils.parametrize: weight_norm, spectral_norm...) is computed
    # on each read, a new tensor outside the graph, and reading it runs the parametrization
    # (spectral_norm's power iteration): it stands for the tensors it is computed from, its
    # originals and the parametrizations' own parameters, whose gradients need its gradient.
    path, _, leaf = name.rpartition(".")
    try:
        module = layer.get_submodule(path) if path else layer
    except AttributeError:
        return None
    if _is_parametrized(module, leaf):
        return tuple(module.parametrizations[leaf].parameters())
    return getattr(module, leaf, None)


def _call_parts(frame: Frame, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
                entry: list[Any]) -> Sequence[ResolvedPart]:
    # This call's resolved parts: its symbolic parts (found at the first call with its shapes),
    # resolved for this call.
    symbolic = (entry[_PARTS] if len(entry) > _PARTS
                else _symbolic_parts(frame, args, kwargs, output, entry))
    return _layer_parts(frame, args, kwargs, symbolic) if symbolic else ()


def tag_call(frame: Frame, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any,
             entry: list[Any]) -> None:
    """Exit observer: mark this call's output nodes with its frame and gradient parts.

    It runs on every torch layer call that records autograd (the engine asks
    ``torch.is_grad_enabled()`` first): the one-tensor output of a layer whose gradient is no
    product (an activation, a norm) costs a grad_fn read and a mark."""
    if output.__class__ is not _Tensor and _torch_function_enabled():
        # A tensor subclass's __torch_function__ sees none of the reads and writes below.
        with _no_subclass_dispatch():
            tag_call(frame, args, kwargs, output, entry)
        return
    watch = WATCHED.get(frame.node) if WATCHED else None
    learned = entry[LEARNED] if len(entry) > LEARNED else None
    if watch is not None or _has_places(learned, frame):
        try:
            _products(frame, output, entry, watch, learned)
        except Exception:  # (the call's own mark, below, does not depend on it)
            pass
    try:
        if output.__class__ is _Tensor or isinstance(output, _Tensor):  # one tensor, one node
            fn = output.grad_fn
            if fn is not None:
                _mark(_lasting_node(output, fn, args, kwargs), frame,
                      _call_parts(frame, args, kwargs, output, entry))
            return
        outputs: list[torch.Tensor] = []
        collect_tensors(output, outputs)  # a tuple, dict, dataclass... of outputs
        fns: list[Any] = []
        for tensor in outputs:
            fn = tensor.grad_fn
            if fn is not None:
                fn = _lasting_node(tensor, fn, args, kwargs)
                if not any(fn is known for known in fns):
                    fns.append(fn)
        if fns:
            parts = _call_parts(frame, args, kwargs, output, entry)
            for fn in fns:  # the parts on one node only: each call is charged once
                _mark(fn, frame, parts if fn is fns[0] else ())
    except Exception:  # marking must never break the user's model
        return


def _has_places(learned: Any, frame: Frame) -> bool:
    # Whether a call's counter holds learned counts with products to place, replayed for this
    # very call (run with the learned quiet frame).
    return (learned.__class__ is tuple and len(learned) > LEARNED_PRODUCTS
            and bool(learned[LEARNED_PRODUCTS]) and learned[LEARNED_QUIET] is frame)


def _products(frame: Frame, output: Any, entry: list[Any], watch: ProductWatch | None,
              learned: Any) -> None:
    # A watched call's products found from its outputs; else a replayed call's (``learned``
    # has places) placed and marked as the function mode would have marked them (see
    # .product_paths).
    outputs: list[torch.Tensor] = []
    collect_tensors(output, outputs)
    if watch is not None:
        watch.locate(outputs)
        return
    placed = place(outputs, learned[LEARNED_PRODUCTS])
    if placed is None:  # another graph than the learned calls': counted by the mode from now
        learned[-1].unlearn(frame, entry)
        return
    for fn, parts in placed:
        if parts:
            note_marked()
            _mark_innermost(fn, frame, parts)


def operation_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]
                      ) -> Callable[[int | str], Any]:
    """What a counted operation's gradient parts name: an index a positional argument, a string
    a keyword argument.

    Example:
        >>> operation_tensors((1, 2), {"weight": 3})("weight")
        3
    """
    def tensor_of(need: int | str) -> Any:
        if isinstance(need, int):
            return args[need] if need < len(args) else None
        return kwargs.get(need)

    return tensor_of


def mark_operation(frame: Frame, result: Any, parts: Sequence[GradientPart],
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Mark the node of a counted tensor operation with the gradient parts of its arguments
    (an index names a positional argument, a string a keyword argument); whether it did."""
    fn = result.grad_fn
    if fn is None or not _grad_enabled() or not frame.collector.backward_on:
        return False  # (off between the sampled steps of profile(backward_every=K))
    resolved = resolve_parts(parts, operation_tensors(args, kwargs))
    if resolved:
        _mark(_lasting_node(result, fn, args, kwargs), frame, resolved)
    return bool(resolved)
