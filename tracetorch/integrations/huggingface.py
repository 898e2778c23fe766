"""A Hugging Face ``transformers.Trainer`` callback: a per-layer profile of the training run.

``Trainer(..., callbacks=[TracetorchCallback()])`` is the only change to the training code: the
profile of the trainer's model opens at ``on_train_begin``, each optimizer step ends a step at
``on_step_end`` (called once per optimizer step, after gradient accumulation's micro-batches),
and the profile closes and reports at ``on_train_end``.

**When training raises**, ``Trainer`` calls no further event, so the callback guards the
trainer itself: it does not hand callbacks the trainer, so the callback finds it among its
callers (the ``Trainer`` method that fires the event), and wraps that trainer's ``train`` (an
attribute of that one instance, no class is touched) so that an exception leaving it closes
the profile first, restoring every layer. That guard is set at ``on_init_end``, i.e. when the
callback is given to the constructor. Added later (``trainer.add_callback``), the callback can
only guard the run's training steps (``trainer.training_step``, for the run): an exception in
data loading or evaluation then leaves the profile open until :meth:`~ProfilingCallback.close`.

Example:
    >>> TracetorchCallback(print_report=False).profile is None
    True
"""
from __future__ import annotations

import functools
import sys
from types import FrameType
from typing import Any, Callable

from transformers import Trainer, TrainerCallback

from tracetorch.integrations.base import ProfilingCallback

__all__ = ("TracetorchCallback",)

#: How far up the stack the Trainer that fires an event is looked for (it is 3 frames up).
_SEARCH_DEPTH = 8
_MISSING = object()


class TracetorchCallback(ProfilingCallback, TrainerCallback):
    """Profile a ``transformers.Trainer`` run per layer; see :class:`ProfilingCallback` for the
    options (``schedule``, ``print_report``, ``output``, ``html``, ``gather``, profile options).

    Example:
        >>> import tracetorch
        >>> callback = TracetorchCallback(tracetorch.schedule(wait=1, active=2, repeat=1),
        ...                               output="run.json")
        >>> callback.output
        'run.json'
    """

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = _calling_trainer()
        if trainer is not None:
            _guard(trainer, "train", self)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        self.start(model)
        trainer = _calling_trainer()
        if trainer is not None and not _guarded(trainer, "train", self):
            self._cleanups.append(_guard(trainer, "training_step", self))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.finish()


class _Guard:
    """A trainer's method that, when it raises, closes the callback's profile first."""

    def __init__(self, method: Callable[..., Any], callback: ProfilingCallback) -> None:
        self.method = method
        self.callback = callback
        functools.update_wrapper(self, method)  # its name, docstring and signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.method(*args, **kwargs)
        except BaseException as exc:
            self.callback.close(exc)
            raise


def _guarded(trainer: Any, name: str, callback: ProfilingCallback) -> bool:
    guard = vars(trainer).get(name)
    return isinstance(guard, _Guard) and guard.callback is callback


def _guard(trainer: Any, name: str, callback: ProfilingCallback) -> Callable[[], None]:
    """Wrap ``trainer.<name>`` (on the instance); returns what removes the wrapper again."""
    if _guarded(trainer, name, callback):
        return lambda: None
    own = vars(trainer).get(name, _MISSING)  # an attribute of the instance itself, kept
    guard = _Guard(getattr(trainer, name), callback)
    setattr(trainer, name, guard)

    def remove() -> None:
        if vars(trainer).get(name) is not guard:
            return  # replaced since: theirs now
        if own is _MISSING:
            delattr(trainer, name)
        else:
            setattr(trainer, name, own)
    return remove


def _calling_trainer() -> Any:
    # The callback's event method is 2 frames up (this function's caller), the Trainer's
    # method that fired it a few more; its `self` is the trainer.
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_SEARCH_DEPTH):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back
    return None
