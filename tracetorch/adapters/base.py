"""The small interface a framework implements so the engine can profile its models.

An adapter names the callables to wrap (layer ``forward``\\ s, the backward entry point,
optimizer steps) and starts whatever else its framework needs while a profile is active:
counting tensor operations, watching for classes defined inside the block, backward hooks.

Example:
    >>> class NoFramework:
    ...     module_name = "builtins"
    ...     def patch_targets(self):
    ...         return []
    ...     def class_targets(self, cls):
    ...         return None
    ...     def start(self, board, counter):
    ...         return []
    >>> isinstance(NoFramework(), Adapter)
    True
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tracetorch.engine.hotpath import OpCounter
    from tracetorch.engine.patches import PatchBoard, PatchTarget

__all__ = ("Adapter", "all_subclasses")


@runtime_checkable
class Adapter(Protocol):
    """What the engine asks of a framework.

    ``module_name`` is the import that makes the adapter relevant; ``patch_targets`` lists what
    to wrap on entry; ``class_targets`` what to wrap for a class of the model given to
    ``profile(model)`` (``None`` for a class of another framework); ``start`` runs once when
    the first profile opens (or when the framework is imported while one is open) and returns
    the cleanups to run when the last one closes.
    """

    module_name: str

    def patch_targets(self) -> Iterable[PatchTarget]: ...

    def class_targets(self, cls: type) -> Iterable[PatchTarget] | None: ...

    def start(self, board: PatchBoard, counter: OpCounter) -> list[Callable[[], None]]: ...


def all_subclasses(cls: type) -> Iterator[type]:
    """``cls`` and every class derived from it, each once, parents before children."""
    seen: set[type] = {cls}
    stack: list[type] = [cls]
    yield cls
    while stack:
        subclasses: list[type] = stack.pop().__subclasses__()
        for sub in subclasses:
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                yield sub
