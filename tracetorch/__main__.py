"""``python -m tracetorch``: the ``tracetorch`` command (see :mod:`tracetorch.cli.main`)."""
import sys

from tracetorch.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
