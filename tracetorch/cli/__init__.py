"""The ``tracetorch`` command line: ``run``, ``report``, ``demo`` and the progress line.

Example:
    >>> from tracetorch.cli import main
    >>> callable(main)
    True
"""
from tracetorch.cli.main import main

__all__ = ("main",)
