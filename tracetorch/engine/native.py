"""The optional C accelerators of the hot path, and the switch that turns them off.

Three C files are built by ``pip install`` where a C compiler is there (see ``setup.py``):
``engine/_hotpath.c`` does what :func:`tracetorch.engine.hotpath.make_wrapper`'s Python wrapper
does on a recorded call, and ``adapters/torch/_marks.c`` what the torch exit observer
(:func:`tracetorch.adapters.torch.marks.tag_call`) does for a one-tensor output
(``engine/_binding.c``, a third, binds a layer's recording method to the layer and calls it:
see :class:`tracetorch.engine.patches.LayerMethod` and
:class:`~tracetorch.engine.patches.BoundLayerMethod`). Each hands
the uncommon cases back to the Python function it stands for, so without a compiler nothing is
lost but speed. ``TRACETORCH_PURE_PYTHON=1`` in the environment (read at import) runs the
Python functions even where the accelerators are built: the tests run both.

The C reads Python names — the settings of the module it stands in for, on each call, so that
installing one in Python takes effect at once; the methods and fields of the objects it is
handed — and finds the positions of the tuples and lists it shares with Python (a
:class:`~tracetorch.engine.hotpath.Frame`, a per-shape counter) by their field names when it
is made, never as numbers of its own. :data:`C_NAMES` lists every such name, and
``tests/test_c_contract.py`` checks the C sources against it: a name renamed in Python fails a
test instead of sending calls down the Python path or raising ``NameError`` mid-profile. The C
imports no module by name: what it needs is handed to it as objects.

Example:
    >>> accelerated() in (True, False)
    True
"""
from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ("C_NAMES", "PURE_PYTHON_ENV", "accelerated", "native_type")

#: The environment variable that, set to ``1``, keeps the hot path in Python.
PURE_PYTHON_ENV = "TRACETORCH_PURE_PYTHON"

_PURE = os.environ.get(PURE_PYTHON_ENV) == "1"

#: Every Python name each C module reads, by where it is read: ``hotpath``, ``marks``,
#: ``backward`` and ``ops``, the globals of that module (``engine.hotpath``,
#: ``adapters.torch.marks``, ``adapters.torch.backward``, ``adapters.torch.ops``: the namespace
#: handed to the C type that stands for one of its functions); ``Frame``, ``ENTRY_FIELDS`` and
#: ``_Hot``, a field of that record (a frame, a per-shape counter, a backward pass's ``hot``
#: tuple: the C finds its position by this name);
#: ``NamedTuple``, an attribute of those records' classes; ``NodeKind``, a value of
#: :data:`tracetorch.records.tree.NodeKind`; the others, an attribute of such an object (a
#: ``Collector``, a ``CallNode``, its ``NodeState`` and ``TimeStats``, a ``BackwardPass``, a
#: tensor, a tensor's autograd node, a torch module, the wrapt wrapper of a layer method:
#: ``__doc__``, ``__module__`` and ``__reduce__`` are read from the method bound from it, which
#: has them too).
C_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "tracetorch.engine._hotpath": {
        "hotpath": ("_FRAME", "_op_switch", "_op_replay", "_op_hold", "_op_observing",
                    "_exit_observer", "_observe_now",
                    "_all_threads", "call_key", "_grad_mode", "_structure", "_QUIET_READS",
                    "quiet_reads", "_SHAPELESS", "_INT_SHAPED", "FLUSH_EVERY", "NO_COUNTERS",
                    "Frame", "_ENTRY_FIELDS", "_SETTINGS", "_SETTING_NAMES",
                    "_PERF_COUNTER_NS"),
        "Frame": ("collector", "node", "owner", "ops", "observe", "pending", "flops_cache",
                  "last_counter", "child_frames"),
        "ENTRY_FIELDS": ("calls", "key", "learned", "replayed", "budget"),
        "NamedTuple": ("_fields",),
        "Collector": ("plain_clock", "record_failure", "touch", "flush_backward", "backward_on",
                      "new_child", "first_entry"),
        "CallNode": ("time",),
        "TimeStats": ("flush",),
        "tensor": ("shape", "dtype"),
        "torch module": ("training", "__getattribute__"),
    },
    "tracetorch.engine._binding": {
        "layer method": ("__wrapped__", "_self_wrapper", "__doc__", "__module__", "__reduce__"),
    },
    "tracetorch.adapters.torch._marks": {
        "marks": ("_Tensor", "_Parameter", "_PARTS", "MARKS", "_HOOK_CARRIER", "_layer_parts",
                  "WATCHED", "LEARNED", "LEARNED_PRODUCTS", "Frame"),
        "backward": ("_current_node", "_PASSES", "MARKS", "_will_execute", "Frame", "_Hot"),
        "Frame": ("collector", "node", "owner"),
        "_Hot": ("clock", "collector", "recompute_of", "boundaries", "leaves", "flops",
                 "pass_node"),
        "NamedTuple": ("_fields",),
        "BackwardPass": ("hot", "_charge", "reach"),
        "CallNode": ("kind",),
        "NodeKind": ("thread",),
        "tensor": ("grad_fn", "requires_grad", "_base"),
        "autograd node": ("metadata", "_register_hook_dict"),
        "torch module": ("_parameters",),
        "ops": ("_stack_len", "_stack_at", "_pop", "_push", "drop_retired"),
    },
}


def native_type(module: str, name: str) -> Any:
    """The type ``name`` of the C module ``module``, or ``None`` where it is not built or
    ``TRACETORCH_PURE_PYTHON=1``.

    Example:
        >>> native_type("tracetorch.engine._no_such_module", "Wrapper") is None
        True
    """
    if _PURE:
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:  # not built here (no compiler at install time)
        return None


def accelerated() -> bool:
    """Whether recorded calls go through the engine's C accelerator in this process."""
    return native_type("tracetorch.engine._hotpath", "Wrapper") is not None
