"""Watching, while a profile is open, for a module's parameters or submodules being replaced.

A layer's FLOPs and sizes are cached per call key (:func:`tracetorch.engine.hotpath.call_key`:
its inputs' shapes and dtypes, the grad mode); they also depend on its weights' shapes (a
``Linear`` whose weight is replaced by a larger one returns a larger output) and on the
sublayers it calls. torch's global registration hooks see every ``module.weight =
nn.Parameter(...)``, ``module.mask = tensor`` (a buffer) and ``model.fc = layer``
(``Module.__setattr__``, ``register_parameter``, ``register_buffer``, ``add_module``): one that
replaces a parameter or buffer by one of another shape or dtype, or a submodule by another,
bumps the engine's structure generation (:func:`~tracetorch.engine.hotpath.
structure_changed`), and each layer's next call measures its figures again (its parameters
counted again too). A name registered for the first time changes nothing measured yet (a model
built inside the block, a weight made at a layer's first call). Converting a model's weights in
place — ``model.to(torch.bfloat16)``, ``.half()``, ``.cuda()``, all through
``Module._apply`` — is seen as it returns, where any parameter's or buffer's dtype, shape or
device changed. Not seen here: writing to ``module._parameters`` directly (FSDP's unsharding,
which keeps shapes) and other changes in place (``weight.data = ...``). Between the
openings of a profile, when no hook is installed, the collector compares which parameters each
module holds (:func:`~tracetorch.models.tensors.parameter_ids`) as it takes the module's node up
again, and sees a submodule replaced when it names the new one: any replacement there, of whatever
shape, has every layer measured again.

Example:
    >>> import torch
    >>> from tracetorch.engine.hotpath import structure_generation
    >>> stop = start_structure_hooks(PatchBoard())     # (no profile open: hooks only)
    >>> layer, before = torch.nn.Linear(4, 4), structure_generation()
    >>> layer.weight = torch.nn.Parameter(torch.ones(4, 4))     # the same shape: no change
    >>> structure_generation() == before
    True
    >>> layer.weight = torch.nn.Parameter(torch.ones(8, 4))
    >>> structure_generation() == before + 1
    True
    >>> stop()
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.nn.modules.module import (
    register_module_buffer_registration_hook,
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)

from tracetorch.engine.hotpath import structure_changed
from tracetorch.engine.patches import PatchBoard

__all__ = ("start_structure_hooks",)


def start_structure_hooks(board: PatchBoard) -> Callable[[], None]:
    """Register the registration hooks, and watch ``Module._apply`` while ``board`` is open;
    returns the function that removes the hooks."""
    module = torch.nn.Module
    board.install(module, "_apply", _converting(vars(module)["_apply"]))
    handles = [register_module_parameter_registration_hook(_parameter_registered),
               register_module_buffer_registration_hook(_buffer_registered),
               register_module_module_registration_hook(_module_registered)]

    def stop() -> None:
        for handle in handles:
            handle.remove()

    return stop


def _parameter_registered(module: Any, name: str, param: Any) -> None:
    # Called before the parameter is stored: what the module holds now is the old one.
    _replaced(module._parameters, name, param)


def _buffer_registered(module: Any, name: str, buffer: Any) -> None:
    _replaced(module._buffers, name, buffer)


def _replaced(own: dict[str, Any], name: str, tensor: Any) -> None:
    # A tensor (or None) registered under a name ``own`` holds already: a change when it has
    # another shape or dtype, or one of the two is None.
    if name in own:
        old = own[name]
        if (old is None) is not (tensor is None) or (
                old is not None and (old.shape != tensor.shape or old.dtype != tensor.dtype)):
            structure_changed()


def _module_registered(module: Any, name: str, submodule: Any) -> None:
    own = module._modules
    if name in own and own[name] is not submodule:
        structure_changed()


#: How deep ``Module._apply`` is running (it calls itself for each submodule): only the outermost
#: call compares the weights before and after.
_APPLYING = [0]


def _converting(original: Callable[..., Any]) -> Callable[..., Any]:
    # ``Module._apply``, then a structure change where it changed a weight's or buffer's dtype,
    # shape or device.
    def _apply(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _APPLYING[0]:
            return original(self, *args, **kwargs)
        before = _tensor_facts(self)
        _APPLYING[0] += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _APPLYING[0] -= 1
            if _tensor_facts(self) != before:
                structure_changed()

    _apply.__wrapped__ = original  # type: ignore[attr-defined]
    return _apply


def _tensor_facts(module: Any) -> list[tuple[Any, ...]]:
    return [(tensor.dtype, tensor.shape, tensor.device)
            for tensors in (module.parameters(), module.buffers()) for tensor in tensors]
