"""The formats and views of a result, registered by the layers that make them.

A :class:`~tracetorch.records.result.ProfileResult` is data: it does not import a renderer or
an analysis. Its convenience methods (``table()``, ``save_html()``, ``analyze()``...) and
``export(format, path)`` look the function up here by name, and each format or view registers
itself where it is written — :mod:`tracetorch.report` its formats, :mod:`tracetorch.analysis`
its views — when the package loads (the package facade ``tracetorch`` imports both, so every
import of tracetorch has them). A new format is one :func:`register_exporter` call in its own
module: the result class does not grow.

A registration may name a loader instead of the function, so a renderer's module (and what it
imports) loads the first time it is used, not with ``import tracetorch``.

Example:
    >>> from tracetorch.records.views import exporter_names
    >>> {"json", "chrome", "speedscope", "csv", "html", "text"} <= set(exporter_names())
    True
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ("register_exporter", "exporter", "exporter_names", "register_view", "view")

#: A format's writer ``write(result, path, **options)``, or the view's function, as a loader
#: returns it the first time it is used.
Loader = Callable[[], Callable[..., Any]]

_EXPORTERS: dict[str, Loader] = {}
_VIEWS: dict[str, Loader] = {}


def register_exporter(name: str, load: Loader) -> None:
    """Make ``result.export(name, path)`` write with the function ``load()`` returns.

    Example:
        >>> register_exporter("lines", lambda: lambda result, path: None)
        >>> exporter("lines")(None, "unused") is None
        True
        >>> _ = _EXPORTERS.pop("lines")
    """
    _EXPORTERS[name] = load


def exporter_names() -> list[str]:
    """The formats ``export`` accepts, in registration order."""
    return list(_EXPORTERS)


def exporter(name: str) -> Callable[..., Any]:
    """The writer of the registered format ``name``.

    Raises:
        ValueError: no format of that name; the message lists those there are.
    """
    try:
        load = _EXPORTERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"format: expected one of {', '.join(map(repr, _EXPORTERS))}, "
                         f"got {name!r}") from None
    return load()


def register_view(name: str, load: Loader) -> None:
    """Make :func:`view` ``(name)`` the function ``load()`` returns (loaded when first used)."""
    _VIEWS[name] = load


def view(name: str) -> Callable[..., Any]:
    """The function registered as ``name`` (``"table"``, ``"analyze"``...).

    Raises:
        LookupError: nothing registered it, i.e. the package that makes it was not imported.
    """
    try:
        load = _VIEWS[name]
    except KeyError:
        raise LookupError(f"no view {name!r} is registered: import tracetorch (the package "
                          "registers its reports and analyses)") from None
    return load()
