"""Call paths through data-parallel wrappers: the user's module names, without ``module.``.

``DistributedDataParallel(model)`` (and FSDP's and ``DataParallel``'s wrappers) call the wrapped
model as their attribute ``module``, so its layers would be ``module.fc1`` in the tree, and a
top-level wrapper would be named ``DistributedDataParallel``. The collector names through them
instead: the wrapped model's node is unnamed (as a profiled model's own node is), and a
top-level wrapper takes the wrapped model's name, so the paths are those of the same model run
in one process (``fc1``, with or without ``profile(model)``: the wrapper is the model). The
wrapper's own node stays, with its own time (bucket preparation and the like). Set the
environment variable ``TRACETORCH_WRAPPER_NAMES=1`` to keep the wrappers' names as they are
(read when a profile opens: :func:`naming_through_wrappers`).

Recognised by class name and module, so torch is never imported here (the engine imports this
module: it must stay light).

Example:
    >>> class DistributedDataParallel:            # stands in for torch's
    ...     __module__ = "torch.nn.parallel.distributed"
    ...     def __init__(self, module): self.module = module
    >>> class Net: pass
    >>> net = Net(); ddp = DistributedDataParallel(net)
    >>> wrapper_name("module", net, ddp, None)
    ''
    >>> wrapper_name("DistributedDataParallel", ddp, None, None)
    'Net'
"""
from __future__ import annotations

import os
from typing import Any

__all__ = ("is_wrapper", "naming_through_wrappers", "wrapper_name")

#: (class name, module prefix) of the wrappers named through.
_WRAPPERS = (("DistributedDataParallel", "torch.nn.parallel"),
             ("DataParallel", "torch.nn.parallel"),
             ("FullyShardedDataParallel", "torch.distributed.fsdp"))

# Per class: whether it is one of them (asked at every layer's first call, twice).
_WRAPPER_CLASSES: dict[type, bool] = {}


def naming_through_wrappers() -> bool:
    """Whether layers are named through the wrappers (unless ``TRACETORCH_WRAPPER_NAMES=1``)."""
    return os.environ.get("TRACETORCH_WRAPPER_NAMES") != "1"


def _is_wrapper_class(cls: type) -> bool:
    known = _WRAPPER_CLASSES.get(cls)
    if known is None:
        known = _WRAPPER_CLASSES[cls] = any(
            base.__name__ == name and base.__module__.startswith(prefix)
            for base in cls.__mro__ for name, prefix in _WRAPPERS)
    return known


def is_wrapper(obj: Any) -> bool:
    """Whether ``obj`` is a data-parallel wrapper (DDP, FSDP, DataParallel) around ``.module``."""
    return _is_wrapper_class(type(obj)) and hasattr(obj, "module")


def wrapper_name(name: str, owner: Any, parent_owner: Any, model: Any) -> str:
    """The name of ``owner``'s node under ``parent_owner`` (``None``: at the top), given the name
    it would otherwise get and the profiled ``model``."""
    if parent_owner is not None and is_wrapper(parent_owner) and owner is parent_owner.module:
        return ""
    if parent_owner is None and name and is_wrapper(owner):
        inner = owner.module
        return "" if inner is model else type(inner).__name__
    return name
