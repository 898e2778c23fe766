"""Torch models shared by several test modules, built from a ``torch`` module passed in.

torch is never imported here: the core test modules that use these models take torch from a
fixture, and other tests check that torch stays unimported in the test process.
"""
from __future__ import annotations

from functools import cache
from types import ModuleType
from typing import Any

__all__ = ("raising_in_backward", "shared_classes", "shared_model")


@cache
def shared_classes(torch: ModuleType) -> tuple[type, type]:
    """peers.md's ``(Block, Shared)`` classes, defined once per ``torch`` module.

    ``Shared`` holds one bias-free ``Linear(100, 100)`` through three ``Block`` parents ``a``,
    ``b`` and ``c`` and calls it once through each: 10,000 parameters, 3 x 20,000 FLOPs.
    """
    nn = torch.nn

    class Block(nn.Module):
        """Calls the module it is given (possibly shared with other blocks)."""

        def __init__(self, lin: Any) -> None:
            super().__init__()
            self.lin = lin

        def forward(self, x: Any) -> Any:
            return self.lin(x)

    class Shared(nn.Module):
        """One Linear(100, 100, bias=False) held by three Block parents: 3 x 20,000 FLOPs."""

        def __init__(self) -> None:
            super().__init__()
            lin = nn.Linear(100, 100, bias=False)
            self.a, self.b, self.c = Block(lin), Block(lin), Block(lin)

        def forward(self, x: Any) -> Any:
            return self.c(self.b(self.a(x)))

    return Block, Shared


def shared_model(torch: ModuleType) -> Any:
    """A new peers.md ``Shared`` model (see :func:`shared_classes`)."""
    return shared_classes(torch)[1]()


def raising_in_backward(torch: ModuleType, error: BaseException) -> Any:
    """An autograd Function that copies its input forward and raises ``error`` in backward."""

    class Raising(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            raise error

    return Raising
