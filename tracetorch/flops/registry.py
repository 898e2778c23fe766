"""The FLOP rule registry: analytical formulas keyed by layer type, looked up along the MRO.

Conventions, stated once for the whole package:

* **FLOPs = 2 x MACs** for matrix products and convolutions (one multiply-add is 2 FLOPs), as
  the TinyTorch guide, ``torch.utils.flop_counter`` and DeepSpeed count. fvcore, thop and ptflops
  print MACs under the name "flops"; tracetorch labels both and never prints a bare "flops".
* Counts cover the **whole batch** and every leading dimension (batch, sequence positions).
* Elementwise work (activations, norms, pooling, bias adds where a rule counts them) is 1 FLOP
  per output element per elementary operation; each rule's docstring says what it counts.
  Results keep the matmul/convolution part (``gemm``) apart so reports can compare like for like.

A rule is ``rule(layer, inputs, output) -> int | FlopCount``; ``inputs`` is the tuple of
positional arguments the layer's ``forward`` received. A rule returns the *inclusive* cost of the
call: the engine subtracts what child layers recorded, so a composite rule (attention counting
its projections) never counts a child twice. Registering ``None`` marks a type as deliberately
free (no warning); a type with no rule at all is reported as unsupported.

Example:
    >>> class Doubler:
    ...     def forward(self, x):
    ...         return x * 2
    >>> registry = FlopRegistry()
    >>> @registry.register(Doubler)
    ... def _doubler(layer, inputs, output):
    ...     return output.size
    >>> registry.lookup(Doubler) is _doubler
    True
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Callable, NamedTuple, Union

__all__ = ("FlopCount", "FlopRule", "FlopRegistry", "NO_RULE", "default_registry", "flop_rule",
           "hooks_run_inside")


class FlopCount(NamedTuple):
    """What a rule may return instead of a bare int.

    ``flops`` is the total, ``gemm`` the part done by matrix products and convolutions, and
    ``macs`` the multiply-accumulates where that word has a meaning (``None`` elsewhere).
    """

    flops: int
    gemm: int = 0
    macs: int | None = None


FlopRule = Callable[[Any, tuple[Any, ...], Any], Union[int, FlopCount]]

#: Returned by :meth:`FlopRegistry.lookup` for a type nobody wrote a rule for.
NO_RULE: Any = object()


#: Rules registered so far, in every registry (see :attr:`FlopRegistry.generation`).
_CHANGES = [0]


class FlopRegistry:
    """Rules by type. User rules sit above built-ins; both are found through the MRO.

    :meth:`copy` gives an independent registry, so a profile can override rules for itself
    without changing what every other profile sees.
    """

    def __init__(self) -> None:
        self._builtin: dict[type, FlopRule | None] = {}
        self._user: dict[type, FlopRule | None] = {}
        #: Per built-in rule's type, which of its instances the rule covers (a test of one).
        self._covers: dict[type, Callable[[Any], bool]] = {}

    def register(self, layer_type: type, *, builtin: bool = False,
                 covers: Callable[[Any], bool] | None = None) -> Callable[[Any], Any]:
        """Decorator registering ``rule`` for ``layer_type`` and its subclasses; a built-in
        rule's ``covers(layer)`` says which instances it counts (those it cannot cost, a layer
        built with a function of the user's, have their operations counted)."""
        if not isinstance(layer_type, type):
            raise TypeError(f"layer_type must be a class, got {layer_type!r}")
        if covers is not None and builtin:
            self._covers[layer_type] = covers

        def decorate(rule: FlopRule | None) -> FlopRule | None:
            if rule is not None and not callable(rule):
                raise TypeError(f"a FLOP rule must be callable or None, got {rule!r}")
            table = self._builtin if builtin else self._user
            if layer_type not in table or table[layer_type] is not rule:  # else: no change
                table[layer_type] = rule
                _CHANGES[0] += 1
            return rule

        return decorate

    @property
    def generation(self) -> int:
        """Changes whenever any registry gains a rule (registries share built-ins), so that a
        lookup remembered at one generation is known to hold while it stays the same."""
        return _CHANGES[0]

    def lookup(self, layer_type: type, layer: Any = None, method: str = "forward") -> Any:
        """The rule for ``layer_type`` (a user rule first at each MRO level), ``None`` for a type
        registered as free, or :data:`NO_RULE`; ``layer``, where given, is the instance called;
        ``method``, what a call runs (an optimizer's: ``"step"``).

        A built-in rule counts what its framework's layer does: it covers a subclass defined
        elsewhere only while the subclass keeps the layer's ``method`` (a ``Linear`` subclass
        that adds a low-rank product in its own ``forward``, as loralib's does, has no rule:
        its operations are counted; so has an ``SGD`` subclass whose ``step`` does more than
        SGD's), and an instance only while no ``forward`` of its own was
        assigned on it (but for accelerate's device hooks, which run the class's, kept as
        ``_old_forward``), no forward hook runs inside its calls (:func:`hooks_run_inside`:
        pruning's mask, an old-style ``weight_norm`` on one of its sublayers) and the rule's
        ``covers(layer)`` (see :meth:`register`) holds. A user's rule covers every subclass and
        instance.

        Example:
            >>> class Layer:
            ...     def forward(self, x):
            ...         return x
            >>> class Renamed(Layer):
            ...     pass
            >>> registry = FlopRegistry()
            >>> _ = registry.register(Layer, builtin=True)(lambda layer, inputs, output: 1)
            >>> registry.lookup(Renamed) is registry.lookup(Layer), registry.lookup(int) is NO_RULE
            (True, True)
        """
        forward_from: type | None = None  # the class whose ``method`` the layer runs
        for klass in layer_type.__mro__:
            if forward_from is None and method in vars(klass):
                forward_from = klass
            if klass in self._user:
                return self._user[klass]
            if klass in self._builtin:
                if forward_from is not None and _package(forward_from) != _package(klass):
                    return NO_RULE  # another package's forward: not what the rule counts
                if layer is not None:
                    own = getattr(layer, "__dict__", _NOTHING)
                    covers = self._covers.get(klass)
                    if (("forward" in own and "_old_forward" not in own)
                            or (own.get("_modules") and hooks_run_inside(layer, deep=True))
                            or (covers is not None and not covers(layer))):
                        return NO_RULE
                return self._builtin[klass]
        return NO_RULE

    def is_builtin(self, rule: Any) -> bool:
        """Whether ``rule`` is one of the built-in rules (tracetorch's own, not a user's).

        Example:
            >>> FlopRegistry().is_builtin(len)
            False
        """
        return any(rule is known for known in self._builtin.values())

    def covers_some(self, layer_type: type) -> bool:
        """Whether the built-in rule of ``layer_type`` covers some of its instances only (see
        :meth:`register`'s ``covers``).

        Example:
            >>> FlopRegistry().covers_some(int)
            False
        """
        return any(klass in self._covers for klass in layer_type.__mro__)

    def copy(self) -> FlopRegistry:
        """A registry whose user rules are independent; built-in rules stay shared, so those a
        framework adapter registers later (when its framework is first profiled) reach it too."""
        twin = FlopRegistry()
        twin._builtin, twin._covers = self._builtin, self._covers
        twin._user = dict(self._user)
        return twin


def hooks_run_inside(layer: Any, deep: bool) -> bool:
    """Whether torch runs forward hooks or pre-hooks inside a call of ``layer``: those of its
    sublayers (of its children only, ``deep=False``), or hooks registered for every module
    (``register_module_forward_hook``). torch runs a layer's hooks around its ``forward``, in
    its caller's call: arithmetic there (pruning's ``weight * mask``, an old-style
    ``weight_norm`` or ``spectral_norm``, a hook computing a statistic) is no sublayer's, and
    no rule of the caller counts it. Duck-typed: nothing but torch modules have hooks.

    Example:
        >>> import torch
        >>> block = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> before = hooks_run_inside(block, deep=False)
        >>> handle = block[0].register_forward_pre_hook(lambda layer, inputs: None)
        >>> before, hooks_run_inside(block, deep=False)
        (False, True)
        >>> handle.remove()
    """
    below = getattr(layer, "__dict__", _NOTHING).get("_modules")
    if not below:  # (a leaf: its own hooks run in its caller's call)
        return False
    torch_module = sys.modules.get("torch.nn.modules.module")
    if (getattr(torch_module, "_global_forward_hooks", None)
            or getattr(torch_module, "_global_forward_pre_hooks", None)):
        return True
    sublayers = list(below.values())
    while sublayers:
        sublayer = sublayers.pop()
        own = getattr(sublayer, "__dict__", _NOTHING)
        if own.get("_forward_hooks") or own.get("_forward_pre_hooks"):
            return True
        if deep:
            sublayers.extend((own.get("_modules") or {}).values())
    return False


def _package(klass: type) -> str:
    # The top-level package a class is defined in ("torch" for torch.nn.modules.rnn.LSTM).
    # torch's quantization-aware training layers count as another: they subclass torch.nn's
    # layers with a forward that does more (qat.Linear fake-quantizes its weight, qat.ConvBn2d
    # folds a batch norm in), where torch's other subclasses (quantized inference's, which run
    # their own kernels) do what the layer does.
    module = str(getattr(klass, "__module__", "") or "")
    if module.startswith(_TRAINING_QUANTIZED):
        return "torch.ao.qat"
    return module.partition(".")[0]


_TRAINING_QUANTIZED = ("torch.ao.nn.qat.", "torch.ao.nn.intrinsic.qat.")


#: What a layer without a ``__dict__`` holds of its own: nothing.
_NOTHING: Mapping[str, Any] = MappingProxyType({})

#: The process-wide registry that built-in rules and :func:`flop_rule` write to.
default_registry = FlopRegistry()


def flop_rule(layer_type: type) -> Callable[[Any], Any]:
    """Register a FLOP formula for ``layer_type`` (and its subclasses) in every later profile.

    The rule receives the layer, the tuple of positional inputs and the output, and returns
    FLOPs as an ``int`` (or a :class:`FlopCount` to also give the GEMM part and MACs). It wins
    over a built-in rule for the same type; register ``None`` to mark a type as costing nothing.

    Example:
        >>> import tracetorch
        >>> class Scale:
        ...     def forward(self, x):
        ...         return x * 3
        >>> @tracetorch.flop_rule(Scale)
        ... def scale_flops(layer, inputs, output):
        ...     return output.size          # one multiply per element
    """
    return default_registry.register(layer_type)
