"""A Lightning callback (``lightning.pytorch``): a per-layer profile of ``Trainer.fit``.

``lightning.Trainer(..., callbacks=[TracetorchCallback()])`` is the only change to the training
code; the events it uses are in :mod:`~tracetorch.integrations.lightning_hooks`. When fitting
raises, Lightning calls ``on_exception``, which closes the profile (every layer restored)
before the exception leaves ``fit``. For the older ``pytorch_lightning`` package, use
:mod:`tracetorch.integrations.pytorch_lightning`.

Example:
    >>> TracetorchCallback(print_report=False).running
    False
"""
from __future__ import annotations

from lightning.pytorch import Callback

from tracetorch.integrations.lightning_hooks import LightningHooks

__all__ = ("TracetorchCallback",)


class TracetorchCallback(LightningHooks, Callback):
    """Profile a ``lightning.Trainer`` run per layer; see
    :class:`~tracetorch.integrations.base.ProfilingCallback` for the options."""
