"""The autocast state, a part of every call's key while a profile is open.

Under ``torch.autocast`` a layer handed the same tensors returns another dtype (a ``Linear``'s
output in bfloat16 on float32 inputs), so its output bytes, and what a layer that asks
``torch.is_autocast_enabled()`` runs, follow the autocast state, which no argument holds: a
profile that times a float32 step and an autocast one of the same shapes would give the second
the first's sizes. While a profile is open, ``torch.autocast``'s ``__enter__`` and ``__exit__``
(through which ``torch.amp.autocast``, ``torch.cpu.amp.autocast``, ``torch.cuda.amp.autocast``
and their decorator forms all go) publish the state they leave — for each device type on which
autocast is on, its dtype — as the engine's call context
(:func:`~tracetorch.engine.hotpath.set_call_context`): a call under another state has another
key, and each state's calls keep their own figures, learned counts included. Not seen:
``torch.set_autocast_enabled`` called directly, and a state that differs between threads (the
context is one for the process: a thread under autocast beside one without shares keys).

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

from typing import Any, Callable

import torch

from tracetorch.engine.hotpath import set_call_context
from tracetorch.engine.patches import PatchBoard

__all__ = ("autocast_state", "start_autocast_watch")


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


def start_autocast_watch(board: PatchBoard) -> Callable[[], None]:
    """Publish the autocast state now and at each autocast region's entry and exit while
    ``board`` is open; returns the cleanup, which takes the state out of the keys.

    Example:
        >>> stop = start_autocast_watch(PatchBoard())      # (no profile open: nothing patched)
        >>> stop()
    """
    autocast = torch.amp.autocast_mode.autocast
    for name in ("__enter__", "__exit__"):
        board.install(autocast, name, _publishing(vars(autocast)[name]))
    set_call_context(autocast_state())

    def stop() -> None:
        set_call_context(None)

    return stop


def _publishing(method: Callable[..., Any]) -> Callable[..., Any]:
    # ``method`` of an autocast region, then the state it leaves published.
    def published(self: Any, *args: Any) -> Any:
        try:
            return method(self, *args)
        finally:
            set_call_context(autocast_state())

    published.__wrapped__ = method  # type: ignore[attr-defined]
    return published
