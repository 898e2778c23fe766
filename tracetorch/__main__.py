"""``python -m tracetorch``: the ``tracetorch`` command (see :mod:`tracetorch.cli`)."""
import sys

from tracetorch.cli import main

if __name__ == "__main__":
    sys.exit(main())
