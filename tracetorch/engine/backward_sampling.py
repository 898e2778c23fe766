"""Backward attribution on sampled steps only: ``profile(backward_every=K)``.

Between its sampled steps such a profile turns its collector's ``backward_on`` off: the
collector then charges no gradient work to layers (:meth:`~tracetorch.engine.collector.
Collector.add_backward`, which every framework's backward goes through), and the engine's
wrapper calls no exit observer (torch's marking of autograd nodes, the per-call cost of backward
attribution) for the calls it records. The profile recording a call decides, in its own
context: an exact profile opened inside a skipping one marks its calls, other threads' profiles
keep marking. The flag is read where the wrapper has the collector at hand already, so sampling
adds no call of its own per layer.

Example:
    >>> from tracetorch.engine.collector import Collector
    >>> from tracetorch.records.tree import CallNode
    >>> collector = Collector(CallNode.root(), model=None)
    >>> skip(collector); collector.backward_on
    False
    >>> resume(collector); collector.backward_on
    True
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tracetorch.engine.collector import Collector

__all__ = ("skip", "resume")


def skip(collector: Collector) -> None:
    """Stop attributing backward work to ``collector``'s layers until :func:`resume`."""
    collector.backward_on = False


def resume(collector: Collector) -> None:
    """Attribute backward work to ``collector``'s layers again."""
    collector.backward_on = True
