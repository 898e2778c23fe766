"""``@tracetorch.profile(...)`` on a function: each call runs inside the profile, as one step.

Plain functions, coroutine functions and generator functions are each wrapped their own way so
that what is recorded is the decorated code and nothing else: a coroutine carries the profile
across its awaits (the call stack is a context variable, which asyncio gives each task), and a
generator is inside the profile only while it runs, not while its consumer does. A recursive
call enters the profile it is already in: its calls are recorded once and it is not a step of
its own. The decorated function keeps the profile as ``.profile``.

Example:
    >>> import tracetorch
    >>> prof = tracetorch.profile()
    >>> def countdown(n):
    ...     return n if n == 0 else countdown(n - 1)
    >>> countdown = profiled(prof, countdown)
    >>> countdown(3), prof.step_count
    (0, 1)
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
    from tracetorch.profiler import profile

__all__ = ("profiled",)

F = TypeVar("F", bound=Callable[..., Any])


def profiled(prof: profile, fn: F) -> F:
    """``fn`` wrapped so that each call runs inside ``prof`` and ends one of its steps."""
    if not callable(fn):
        raise TypeError(f"profile() decorates a callable, got {type(fn).__name__}")
    if inspect.isasyncgenfunction(fn):
        raise TypeError(f"profile() cannot decorate the async generator {fn.__qualname__}: "
                        f"its consumer would run inside the profile between items; open "
                        f"`with profile:` inside it instead")
    if inspect.iscoroutinefunction(fn):
        wrapper = _coroutine(prof, fn)
    elif inspect.isgeneratorfunction(fn):
        wrapper = _generator(prof, fn)
    else:
        wrapper = _plain(prof, fn)
    wrapper = functools.wraps(fn)(wrapper)
    wrapper.profile = prof  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def _plain(prof: profile, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run_profiled(*args: Any, **kwargs: Any) -> Any:
        outermost = not prof.reentered
        with prof:
            try:
                return fn(*args, **kwargs)
            finally:
                if outermost:
                    prof.step()

    return run_profiled


def _coroutine(prof: profile, fn: Callable[..., Any]) -> Callable[..., Any]:
    async def run_profiled(*args: Any, **kwargs: Any) -> Any:
        outermost = not prof.reentered
        with prof:
            try:
                return await fn(*args, **kwargs)
            finally:
                if outermost:
                    prof.step()

    return run_profiled


def _generator(prof: profile, fn: Callable[..., Any]) -> Callable[..., Any]:
    def run_profiled(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        outermost = not prof.reentered

        def resume(method: Callable[[Any], Any], value: Any) -> Any:
            with prof:
                return method(value)

        generator = fn(*args, **kwargs)
        try:
            value = resume(generator.send, None)
            while True:
                try:
                    sent = yield value
                except GeneratorExit:
                    resume(lambda _: generator.close(), None)
                    raise
                except BaseException as exc:  # thrown in by the consumer: pass it on
                    value = resume(generator.throw, exc)
                else:
                    value = resume(generator.send, sent)
        except StopIteration as stop:
            return stop.value
        finally:
            if outermost:
                prof.step()

    return run_profiled
