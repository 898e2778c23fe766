"""APIs of other projects that tracetorch keeps for their users (see :mod:`.tinytorch`)."""
from __future__ import annotations

__all__: tuple[str, ...] = ()
