"""Framework adapters and the bookkeeping of which ones are running.

An adapter starts with the first open profile if its framework is already imported, or the
moment the framework is imported while a profile is open (a post-import hook), which is what
lets ``tracetorch run script.py`` profile a script that imports torch itself.

Example:
    >>> [name for name, _ in ADAPTERS]
    ['tracetorch.core', 'torch']
"""
from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Callable

import wrapt

from tracetorch.adapters.base import Adapter
from tracetorch.adapters.duck import duck_targets, instance_forwards
from tracetorch.engine.hotpath import OpCounter
from tracetorch.engine.patches import PatchBoard, PatchTarget

__all__ = ("ADAPTERS", "AdapterSet", "Adapter", "duck_targets")


def _core() -> Adapter:
    from tracetorch.adapters.core import CoreAdapter

    return CoreAdapter()


def _torch() -> Adapter:
    from tracetorch.adapters.torch import TorchAdapter

    return TorchAdapter()


#: (module that makes the adapter relevant, factory), in start order.
ADAPTERS: list[tuple[str, Callable[[], Adapter]]] = [("tracetorch.core", _core), ("torch", _torch)]


class AdapterSet:
    """The adapters started for the current opening of a :class:`PatchBoard`."""

    def __init__(self, board: PatchBoard) -> None:
        self.board = board
        self.counter = OpCounter()
        self._started: dict[str, Adapter] = {}
        self._lock = threading.RLock()
        self._hooked = False
        # id(model) -> (weak reference, adapters started, what to wrap for it).
        self._model_targets: dict[int, tuple[weakref.ref, tuple[str, ...], list[PatchTarget]]] = {}

    def open(self) -> list[Callable[[], None]]:
        """Start every adapter whose framework is loaded; return the cleanups (board calls this
        for its first user)."""
        if not self._hooked:
            # Registered once per process; the hook does nothing while no profile is open.
            for module_name, _ in ADAPTERS:
                wrapt.register_post_import_hook(self._on_import, module_name)
            self._hooked = True
        cleanups: list[Callable[[], None]] = [self._started.clear]
        for module_name, factory in ADAPTERS:
            if module_name in sys.modules:
                cleanups.extend(self._start(module_name, factory))
        return cleanups

    def targets(self, model: Any) -> Iterator[PatchTarget]:
        """What to wrap now: every started adapter's targets, then the model's own classes (as
        the adapter of their framework wraps them, else as duck-typed layers)."""
        with self._lock:
            adapters = list(self._started.values())
        for adapter in adapters:
            yield from adapter.patch_targets()
        if model is None:
            return
        # A forward assigned on an instance hides its class's: wrapped on the instance, under
        # its class's guard, looked for afresh at each opening (and never kept between them).
        for layer in instance_forwards(model):
            guard = None
            for adapter in adapters:
                claimed = adapter.class_targets(type(layer))
                if claimed is not None:
                    guard = next((target.guard for target in claimed), None)
                    break
            yield PatchTarget(layer, "forward", "module", guard)
        # The model's walk is remembered for the next opening with the same adapters (a
        # decorated step opens one per call); a class it gains later is wrapped at its first
        # call like any other.
        started = tuple(self._started)
        known = self._model_targets.get(id(model))
        if known is not None and known[0]() is model and known[1] == started:
            yield from known[2]
            return
        found: list[PatchTarget] = []
        for target in duck_targets(model):
            for adapter in adapters:
                claimed = adapter.class_targets(target.cls)
                if claimed is not None:
                    found.extend(claimed)
                    break
            else:
                found.append(target)
        key, remembered = id(model), self._model_targets
        try:  # forgotten with the model
            ref = weakref.ref(model, lambda _: remembered.pop(key, None))
        except TypeError:  # no weak reference: walked at every opening
            pass
        else:
            remembered[key] = (ref, started, found)
        yield from found

    def configure(self, collector: Any) -> None:
        """Let every started adapter set up a profile being entered (a device clock...)."""
        with self._lock:
            adapters = list(self._started.values())
        for adapter in adapters:
            configure = getattr(adapter, "configure", None)
            if configure is not None:
                configure(collector)

    def _start(self, module_name: str, factory: Callable[[], Adapter]) -> list[Callable[[], None]]:
        with self._lock:
            if module_name in self._started:
                return []
            adapter = factory()
            self._started[module_name] = adapter
            return adapter.start(self.board, self.counter)

    def _on_import(self, module: Any) -> None:
        if not self.board.active:
            return
        for module_name, factory in ADAPTERS:
            if module.__name__ == module_name:
                self.board.add_cleanups(self._start(module_name, factory))
                for target in self._started[module_name].patch_targets():
                    self.board.patch(target)
