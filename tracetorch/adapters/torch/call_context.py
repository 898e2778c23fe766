"""What a call's figures follow that no argument holds, a part of every call's key while a
profile is open: the autocast state, and whether saved-tensor hooks are on.

Under ``torch.autocast`` a layer handed the same tensors returns another dtype (a ``Linear``'s
output in bfloat16 on float32 inputs), so its output bytes, and what a layer that asks
``torch.is_autocast_enabled()`` runs, follow the autocast state. Under saved-tensor hooks
(activation checkpointing, ``torch.autograd.graph.save_on_cpu``, a pack hook of the user's)
what autograd keeps is the hooks' to decide, and nothing is read (see
:mod:`~tracetorch.adapters.torch.saved`): a call there saves 0 bytes, which the same call
without them must not be taken for. A profile that timed a float32 step and an autocast one of
the same shapes would give the second the first's sizes; one whose first step ran under
``save_on_cpu`` gave every later step 0 bytes saved.

While a profile is open, ``torch.autocast``'s ``__enter__`` and ``__exit__`` (through which
``torch.amp.autocast``, ``torch.cpu.amp.autocast``, ``torch.cuda.amp.autocast`` and their
decorator forms all go) and autograd's push and pop of saved-tensor hooks (through which every
``saved_tensors_hooks`` context goes) publish the context they leave
(:func:`~tracetorch.engine.hotpath.set_call_context`): a call under another context has
another key, and each context's calls keep their own figures, learned counts included. Not
seen: ``torch.set_autocast_enabled`` called directly, and a context that differs between
threads (it is one for the process: a thread under autocast beside one without shares keys).

Example:
    >>> import torch, tracetorch
    >>> layer = torch.nn.Linear(8, 8)
    >>> x = torch.ones(2, 8)
    >>> with torch.no_grad(), tracetorch.profile(layer) as prof:
    ...     _ = layer(x)                                          # float32 out: 64 bytes
    ...     with torch.autocast("cpu", dtype=torch.bfloat16):
    ...         _ = layer(x)                                      # bfloat16 out: 32 bytes
    >>> prof.find("").memory.output_bytes
    96
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Callable

import torch

from tracetorch.engine.hotpath import set_call_context
from tracetorch.engine.patches import PatchBoard

__all__ = ("autocast_state", "call_context", "start_context_watch")

_autograd = torch._C._autograd
_top_hooks = _autograd._top_saved_tensors_default_hooks


def _device_types() -> tuple[str, ...]:
    # The device types this torch keeps an autocast state for.
    known = []
    for device in ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "ipu", "mtia", "maia",
                   "privateuseone"):
        try:
            torch.is_autocast_enabled(device)
        except (RuntimeError, TypeError):  # (a device type this build has no autocast for)
            continue
        known.append(device)
    return tuple(known)


_DEVICE_TYPES = _device_types()


def autocast_state() -> tuple[tuple[str, torch.dtype], ...] | None:
    """Each device type on which autocast is on in this thread, with its dtype (``None``: on
    none).

    Example:
        >>> autocast_state() is None
        True
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     autocast_state()
        (('cpu', torch.bfloat16),)
    """
    if not torch._C._is_any_autocast_enabled():
        return None
    return tuple((device, torch.get_autocast_dtype(device)) for device in _DEVICE_TYPES
                 if torch.is_autocast_enabled(device)) or None


def call_context() -> Hashable:
    """This thread's call context: :func:`autocast_state`, paired with a note when saved-tensor
    hooks are on (the autocast state alone otherwise, as keys were without hooks).

    Example:
        >>> call_context() is None
        True
        >>> with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        ...     call_context()
        (None, 'saved-tensor hooks')
    """
    autocast = autocast_state()
    if _top_hooks(False) is None:
        return autocast
    return (autocast, "saved-tensor hooks")


def start_context_watch(board: PatchBoard) -> Callable[[], None]:
    """Publish the call context now and wherever an autocast region or saved-tensor hooks
    begin or end while ``board`` is open; returns the cleanup, which takes the context out of
    the keys.

    Example:
        >>> stop = start_context_watch(PatchBoard())      # (no profile open: nothing patched)
        >>> stop()
    """
    autocast = torch.amp.autocast_mode.autocast
    for name in ("__enter__", "__exit__"):
        board.install(autocast, name, _publishing(vars(autocast)[name]))
    for name in ("_push_saved_tensors_default_hooks", "_pop_saved_tensors_default_hooks"):
        board.install(_autograd, name, _publishing(getattr(_autograd, name)))
    set_call_context(call_context())

    def stop() -> None:
        set_call_context(None)

    return stop


def _publishing(method: Callable[..., Any]) -> Callable[..., Any]:
    # ``method`` (of an autocast region, or autograd's own), then the context it leaves
    # published.
    def published(*args: Any) -> Any:
        try:
            return method(*args)
        finally:
            set_call_context(call_context())

    published.__wrapped__ = method  # type: ignore[attr-defined]
    return published
