"""Callbacks that profile a training framework's run with no change to the training code.

Each framework has its module, imported only by a user who has the framework (importing
``tracetorch`` or this package imports none of them):

- :mod:`tracetorch.integrations.huggingface`: ``TracetorchCallback`` for ``transformers.Trainer``;
- :mod:`tracetorch.integrations.lightning`: ``TracetorchCallback`` for ``lightning.Trainer``
  (:mod:`tracetorch.integrations.pytorch_lightning` for the older ``pytorch_lightning``).

All of them are a :class:`ProfilingCallback`: a profile of the trainer's model opened when
training starts, a step marked at each optimizer step, closed and reported when training ends,
and closed (everything restored) when training raises.

Example:
    >>> from tracetorch.integrations import ProfilingCallback
    >>> ProfilingCallback().profile is None          # nothing profiled before training starts
    True
"""
from __future__ import annotations

from tracetorch.integrations.base import ProfilingCallback

__all__ = ("ProfilingCallback",)
