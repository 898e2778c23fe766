"""Lightning's events mapped onto a :class:`~tracetorch.integrations.base.ProfilingCallback`,
free of any import of Lightning, so that the callbacks of ``lightning`` and of the older
``pytorch_lightning`` (two packages, two ``Callback`` base classes) share them.

A step is an optimizer step: ``on_train_batch_end`` runs after every batch, and with gradient
accumulation (``accumulate_grad_batches``) only some batches step the optimizers, which
``trainer.global_step`` (the optimizer steps so far) tells.

Example:
    >>> from types import SimpleNamespace
    >>> from tracetorch.core import Linear
    >>> hooks, trainer = LightningHooks(print_report=False), SimpleNamespace(global_step=0)
    >>> hooks.on_train_start(trainer, Linear(2, 2))
    >>> hooks.on_train_batch_end(trainer, None, None, None, 0)   # accumulating: no step yet
    >>> trainer.global_step = 1
    >>> hooks.on_train_batch_end(trainer, None, None, None, 1)
    >>> hooks.on_train_end(trainer, None)
    >>> hooks.profile.step_count
    1
"""
from __future__ import annotations

from typing import Any

from tracetorch.integrations.base import ProfilingCallback

__all__ = ("LightningHooks",)


class LightningHooks(ProfilingCallback):
    """Start at ``on_train_start`` (after the sanity check), a step per optimizer step, finish
    at ``on_train_end``, close at ``on_exception`` (Lightning calls it when fitting raises)."""

    _last_global_step = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_global_step = trainer.global_step
        self.start(pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_step != self._last_global_step:
            self._last_global_step = trainer.global_step
            self.step()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.close(exception)
