"""What tracetorch knows about models without running them: which objects are layers, their
submodules and parameters, and the shapes, dtypes and bytes of tensors and call arguments.

* :mod:`.introspect` — layers, submodule names, a call's arguments (numpy, torch, duck-typed).
* :mod:`.params` / :mod:`.subtree_params` — parameter counts, total and per module.
* :mod:`.tensors` — shapes, dtypes, bytes, dummy inputs.
"""
from __future__ import annotations

__all__: tuple[str, ...] = ()
