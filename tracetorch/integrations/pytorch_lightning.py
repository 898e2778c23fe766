"""The Lightning callback for the older ``pytorch_lightning`` package: its ``Trainer`` accepts
only its own ``Callback`` subclasses, so the events of :mod:`tracetorch.integrations.lightning`
(:class:`~tracetorch.integrations.lightning_hooks.LightningHooks`) get that base here."""
from __future__ import annotations

import pytorch_lightning

from tracetorch.integrations.lightning_hooks import LightningHooks

__all__ = ("TracetorchCallback",)


class TracetorchCallback(LightningHooks, pytorch_lightning.Callback):
    """Profile a ``pytorch_lightning.Trainer`` run per layer, as
    :class:`tracetorch.integrations.lightning.TracetorchCallback` does ``lightning.Trainer``'s.

    Example:
        >>> TracetorchCallback(print_report=False).running
        False
    """
