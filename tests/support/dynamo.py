"""A fresh Dynamo for each test that compiles: its caches and counters emptied before and after,
so one test's compilations never count in another's figures.

Use: ``from support.dynamo import fresh_dynamo`` and
``pytestmark = pytest.mark.usefixtures("fresh_dynamo")``.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

__all__ = ("fresh_dynamo",)


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    import torch._dynamo  # only the compiling tests load it

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()
