"""The torch calls through which a layer's work can follow its tensors' values, not only their
shapes.

Learned operation counts (:mod:`~tracetorch.adapters.torch.learned`) stand in for a call once
two calls of its key counted the same: the key holds the inputs' shapes and dtypes and the
plain arguments, so the rest of what a call runs has to follow from those. Python code can run
differently for the same key only where it sees values, and that takes one of these calls:

- a value read into Python, where control flow can branch on it: ``bool(t)`` (``if t.any():``),
  ``t.item()``, ``float(t)``, ``int(t)``, ``t.tolist()``, ``t.numpy()``, ``torch.equal``;
- a tensor whose shape its input's values decide, whose size every operation after it follows:
  ``nonzero``, a boolean mask index (``x[mask]``), ``masked_select``, ``unique``,
  ``torch.where(condition)``, ``repeat_interleave`` by a tensor of repeats, ``bincount``.

A layer that makes such a call has its calls counted by the function mode every time, and so
has every layer around it (the value or the shape is handed back to its callers).

Example:
    >>> import torch
    >>> x = torch.ones(2, 3)
    >>> reads_values(torch.Tensor.__getitem__, (x, x > 0), {})
    True
    >>> reads_values(torch.Tensor.__getitem__, (x, 0), {})
    False
    >>> reads_values(torch.where, (x > 0, x, -x), {})
    False
"""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ("VALUE_READS", "DependsOnValues", "reads_values")

#: Whether a call of a function, given its arguments, depends on tensor values.
DependsOnValues = Callable[[tuple[Any, ...], dict[str, Any]], bool]


def _always(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return True


def _mask_index(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    # x[mask], x[mask, 0], x[:, [mask]]: a tensor of flags anywhere in the index selects as many
    # items as it holds True (an integer tensor selects as many as its shape says)
    if len(args) < 2:
        return False
    index = args[1]
    parts = index if isinstance(index, (tuple, list)) else (index,)
    for part in parts:
        if isinstance(part, (tuple, list)):
            if _mask_index((None, part), {}):
                return True
        elif isinstance(part, torch.Tensor) and part.dtype in (torch.bool, torch.uint8):
            return True
    return False


def _condition_only(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    # torch.where(condition) is nonzero(condition, as_tuple=True); with x and y, a select
    return len(args) + len(kwargs) == 1


def _repeats_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    # repeat_interleave(repeats) alone, or with a tensor of repeats and no output_size given
    if kwargs.get("output_size") is not None:
        return False
    if len(args) == 1 and "repeats" not in kwargs:
        return isinstance(args[0], torch.Tensor)
    return isinstance(kwargs.get("repeats", args[1] if len(args) > 1 else None), torch.Tensor)


def _value_reads() -> dict[Any, DependsOnValues]:
    tensor = torch.Tensor
    always = (
        # values into Python
        tensor.__bool__, tensor.item, tensor.__float__, tensor.__int__, tensor.__index__,
        tensor.__complex__, tensor.tolist, tensor.numpy, tensor.__array__, tensor.__contains__,
        tensor.equal, torch.equal, tensor.allclose, torch.allclose, tensor.is_nonzero,
        torch.is_nonzero,
        # shapes from values
        tensor.nonzero, torch.nonzero, tensor.argwhere, torch.argwhere, tensor.masked_select,
        torch.masked_select, tensor.unique, torch.unique, tensor.unique_consecutive,
        torch.unique_consecutive, tensor.bincount, torch.bincount)
    reads: dict[Any, DependsOnValues] = dict.fromkeys(always, _always)
    reads[tensor.__getitem__] = _mask_index
    reads[torch.where] = _condition_only
    reads[tensor.repeat_interleave] = reads[torch.repeat_interleave] = _repeats_tensor
    return reads


#: The functions of this module's docstring, as torch hands them to a function mode, each with
#: the test of its arguments that says whether a call depends on values.
VALUE_READS: dict[Any, DependsOnValues] = _value_reads()


def reads_values(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether this call of ``func`` lets what runs after it follow tensor values (see the
    module docstring).

    Example:
        >>> reads_values(torch.Tensor.item, (torch.ones(()),), {})
        True
        >>> reads_values(torch.matmul, (torch.ones(2, 2), torch.ones(2, 2)), {})
        False
    """
    test = VALUE_READS.get(func)
    return test is not None and test(args, kwargs)
