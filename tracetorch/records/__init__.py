"""What a profile records, as data: the call tree, its statistics, and the result built on it.

Nothing here measures, renders or analyses; the layers above read these records.

* :mod:`.tree` — :class:`~.tree.CallNode`, one per call path, and its shape signatures.
* :mod:`.stats` — bounded timing statistics per node.
* :mod:`.memory` — bytes a node's calls read, wrote and saved for backward.
* :mod:`.phases` — the phases of a training step (data, forward, backward, optimizer).
* :mod:`.result` — :class:`~.result.ProfileResult`, the tree with its totals and views.
* :mod:`.rows` — a profile as flat records, one per node.
* :mod:`.jsonio` / :mod:`.jsonread` — the saved profile file, written and read.
"""
from __future__ import annotations

__all__: tuple[str, ...] = ()
