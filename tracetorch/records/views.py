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
    >>> {"json", "chrome", "speedscope", "csv", "html"} <= set(exporter_names())
    True
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ("Exporter", "register_exporter", "exporter", "exporter_names", "register_view",
           "view")


@dataclass
class Exporter:
    """A file format: ``write(result, path, **options)`` (or a loader giving it) and the file
    suffix a user expects (``.json``, ``.html``)."""

    name: str
    suffix: str
    load: Callable[[], Callable[..., None]]
    description: str = ""


_EXPORTERS: dict[str, Exporter] = {}
_VIEWS: dict[str, Callable[[], Callable[..., Any]]] = {}


def register_exporter(name: str, suffix: str, load: Callable[[], Callable[..., None]],
                      description: str = "") -> None:
    """Make ``result.export(name, path)`` write with the function ``load()`` returns.

    Example:
        >>> register_exporter("lines", ".txt", lambda: lambda result, path: None, "a test format")
        >>> exporter("lines").suffix
        '.txt'
        >>> _ = _EXPORTERS.pop("lines")
    """
    _EXPORTERS[name] = Exporter(name, suffix, load, description)


def exporter_names() -> list[str]:
    """The formats ``export`` accepts, in registration order."""
    return list(_EXPORTERS)


def exporter(name: str) -> Exporter:
    """The registered format ``name``.

    Raises:
        ValueError: no format of that name; the message lists those there are.
    """
    try:
        return _EXPORTERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"format: expected one of {', '.join(map(repr, _EXPORTERS))}, "
                         f"got {name!r}") from None


def register_view(name: str, load: Callable[[], Callable[..., Any]]) -> None:
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
