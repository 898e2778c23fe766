"""tracetorch's version, defined once: ``setup.cfg`` reads it, and every saved profile, HTML
report and ``tracetorch --version`` names it.

Example:
    >>> from tracetorch.version import __version__
    >>> __version__.count(".")
    2
"""
from __future__ import annotations

__all__ = ("__version__",)

__version__ = "0.1.0"
