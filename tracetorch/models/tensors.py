"""Framework-neutral looks at tensors and call arguments: shapes (of a value, of a call's
arguments), element and byte counts, the tensors inside nested arguments, input shapes checked,
and inputs made to fit a model.

Everything here works on torch tensors, ``tracetorch.core`` Tensors, ndarrays and anything else
with a ``.shape``, without importing torch: a torch tensor can only exist once the user has
imported it.

Example:
    >>> import numpy as np
    >>> signature((np.zeros((2, 3)), 5), {"mask": np.zeros(4)})
    ((2, 3), None, (4,))
    >>> numel(np.zeros((2, 3))), tensor_bytes([np.zeros(4, dtype=np.int8), "text"])
    (6, 4)
"""
from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import nullcontext
from enum import Enum
from typing import Any, Callable

import numpy as np

from tracetorch.models.introspect import is_torch_module
from tracetorch.records.tree import ShapeSignature

__all__ = ("shape_of", "register_int_shaped", "register_quiet_reads", "quiet_reads",
           "register_irregular_sizes", "irregular_sizes",
           "INT_SHAPED", "SHAPELESS", "QUIET_READS", "dtype_of", "signature", "typed_signature",
           "parameter_ids", "numel", "ndarray_of", "nbytes", "tensors_in", "tensor_bytes",
           "check_shape", "dummy_input")


#: Array classes whose ``.shape`` always holds plain ints, copied as it is instead of converted
#: dimension by dimension: the conversion is most of what reading a shape costs, and a layer's
#: first call reads several. Only exact classes: a subclass (torch's FakeTensor) may hold
#: symbolic sizes. (The engine's C wrapper reads it by name too.)
INT_SHAPED: set[type] = {np.ndarray}


def register_int_shaped(cls: type) -> None:
    """Declare that ``cls`` instances' ``.shape`` is always a tuple (or tuple subclass) of plain
    ints, so :func:`shape_of` copies it without converting each dimension.

    Example:
        >>> register_int_shaped(np.ndarray)
        >>> shape_of(np.zeros((2, 3)))
        (2, 3)
    """
    INT_SHAPED.add(cls)


#: Readers of the sizes of a tensor that has no plain ``.shape`` (torch's strided nested
#: tensors, whose components each have their own): ``reader(value)`` gives something hashable
#: or ``None``; registered by a framework's adapter (:func:`register_irregular_sizes`).
_IRREGULAR: list[Callable[[Any], Hashable | None]] = []


def register_irregular_sizes(reader: Callable[[Any], Hashable | None]) -> None:
    """Add ``reader(value)``: the sizes of a tensor whose ``.shape`` cannot be read, which then
    key its calls (two batches of other lengths are two calls), or ``None`` for another value.
    Registering the same function again changes nothing.

    Example:
        >>> register_irregular_sizes(lambda value: None)
        >>> irregular_sizes(object()) is None
        True
    """
    if reader not in _IRREGULAR:
        _IRREGULAR.append(reader)


def irregular_sizes(value: Any) -> Hashable | None:
    """What the registered readers say of the sizes of ``value``, a tensor without a plain
    shape; ``None`` where none knows them.

    Example:
        >>> irregular_sizes(3) is None
        True
    """
    for reader in _IRREGULAR:
        sizes = reader(value)
        if sizes is not None:
            return sizes
    return None


#: Per class seen: the context under which the profiler reads its instances' attributes, or
#: ``None`` to read them as they are. A torch tensor subclass with its own
#: ``__torch_function__`` would see every ``.shape`` or ``.dtype`` read as a call of its own:
#: the profiler reads those with subclass dispatch off, so the subclass sees the calls it sees
#: without a profile. Filled at a class's first sight by the classifiers registered with
#: :func:`register_quiet_reads` (the engine's hot path reads it by name, in C too).
QUIET_READS: dict[type, Any] = {}
_CLASSIFIERS: list[Callable[[type], Any]] = []


def register_quiet_reads(classify: Callable[[type], Any]) -> None:
    """Add ``classify(cls) -> context factory | None``: how a framework's classes must be read
    quietly (the torch adapter: ``DisableTorchFunctionSubclass`` for a subclass with its own
    ``__torch_function__``). Registering the same function again changes nothing.

    Example:
        >>> register_quiet_reads(lambda cls: None)
        >>> quiet_reads(np.ndarray) is None
        True
    """
    if classify not in _CLASSIFIERS:
        _CLASSIFIERS.append(classify)
        QUIET_READS.clear()


def quiet_reads(cls: type) -> Any:
    """The context factory under which ``cls``'s attributes are read quietly, or ``None`` where
    they are read as they are (see :data:`QUIET_READS`). A plain value's class
    (:data:`SHAPELESS`) gets a context that changes nothing: never ``None``, so that the hot
    path's one-tensor shortcut (``None`` only) leaves it alone.

    Example:
        >>> quiet_reads(np.ndarray) is None, quiet_reads(int) is None
        (True, False)
    """
    try:
        return QUIET_READS[cls]
    except KeyError:
        pass
    quiet = None
    if cls in SHAPELESS:
        # Never read as a tensor: the hot path keys a one-argument call of it by value, not
        # by the shape a numpy scalar has (the context changes nothing).
        quiet = nullcontext
    else:
        for classify in _CLASSIFIERS:
            quiet = classify(cls)
            if quiet is not None:
                break
    QUIET_READS[cls] = quiet
    return quiet


def shape_of(value: Any) -> tuple[int, ...] | None:
    """The shape of a tensor-like value as a plain tuple, or ``None`` for anything else."""
    cls: type = value.__class__  # (a local: testing value.__class__ itself narrows value)
    try:
        if cls in INT_SHAPED:
            return tuple(value.shape)
        quiet = quiet_reads(cls)
        if quiet is not None:
            with quiet():
                return _converted_shape(value)
        return _converted_shape(value)
    except Exception:  # a ``.shape`` that is not one (a str...), or has no ints (a nested
        return None    # tensor's: a strided one raises, a jagged one holds a symbolic size)


def _converted_shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    if shape is None or isinstance(value, type):
        return None
    return tuple(map(int, shape))


def dtype_of(value: Any) -> Any:
    """A tensor-like value's ``.dtype`` (``None`` where it has none), read quietly.

    Example:
        >>> dtype_of(np.zeros(2, np.int8)), dtype_of(3)
        (dtype('int8'), None)
    """
    quiet = quiet_reads(value.__class__)
    if quiet is not None:
        with quiet():
            return getattr(value, "dtype", None)
    return getattr(value, "dtype", None)


def signature(args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> ShapeSignature:
    """Shapes of a call's tensor arguments: one entry per argument, tensors inside tuples,
    lists and dicts flattened in order, ``None`` for a non-tensor argument.

    Example:
        >>> import numpy as np
        >>> signature((np.zeros((2, 3)), 5), {"mask": np.zeros(4)})
        ((2, 3), None, (4,))
    """
    if len(args) == 1 and not kwargs:  # one tensor, as most layers are called: no walk
        shape = shape_of(args[0])
        if shape is not None:
            return (shape,)
    shapes: list[Any] = []
    _collect_arguments(args, kwargs, shapes, False)
    return tuple(shapes)


def typed_signature(args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
                    tail: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """:func:`signature` with each tensor's dtype after its shape, flat, then ``tail`` (what
    else the caller's key holds): what a call's sizes and a rule's FLOPs depend on in its
    arguments. A plain value (a number, numpy's too, a flag, a string, an enum member) is
    itself, not ``None`` (a rule may read a count: 3 steps and 5 differ); a keyword argument's
    name comes before its value; a list, tuple or dict enters its class and length, then its
    items (a dict's with their keys); any other object, its class. A one-tensor
    call gives ``(shape, dtype, *tail)``, what reading the tensor's ``.shape`` and ``.dtype``
    gives (the engine's hot path builds that key itself). A tensor without a ``.dtype`` has
    ``None`` there.

    Example:
        >>> typed_signature((np.zeros((2, 3)), 5), {"mask": np.zeros(4, np.int8)}, ("tail",))
        ((2, 3), dtype('float64'), 5, 'mask', (4,), dtype('int8'), 'tail')
    """
    if len(args) == 1 and not kwargs and type(args[0]) not in SHAPELESS:
        value = args[0]  # one tensor, as most layers are called: no walk
        shape = shape_of(value)
        if shape is not None:
            return (shape, dtype_of(value), *tail)
    items: list[Any] = []
    _collect_arguments(args, kwargs, items, True)
    items.extend(tail)
    return tuple(items)


def _collect_arguments(args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: list[Any],
                       for_key: bool) -> None:
    for value in args:
        _collect_shapes(value, out, for_key)
    if kwargs:
        for name, value in kwargs.items():
            if for_key:  # f(a=1, b=2) and f(b=1, a=2) are two calls
                out.append(name)
            _collect_shapes(value, out, for_key)


#: Classes whose instances have no ``.shape`` (``shape_of`` gives ``None``) and are plain values:
#: a multi-argument call passes many (``None`` for an optional mask, flags, sizes), each entered
#: as itself in a key (``None`` in a list of shapes) without the reads that find no shape (the
#: engine's C wrapper reads it by name too).
#: numpy's scalar types (``np.int64(3)``, what a loop over an array hands out) among them: they
#: have a ``.shape``, ``()``, but a rule reads them as numbers.
SHAPELESS = frozenset({type(None), bool, int, float, str, *(
    kind for kind in np.sctypeDict.values() if issubclass(kind, (np.number, np.bool_)))})


def _collect_shapes(value: Any, out: list[Any], for_key: bool) -> None:
    # (The flat list reads back one way: a shape is a tuple, followed by its dtype in a key.)
    cls = type(value)
    if cls in SHAPELESS:
        # (a NaN, never equal to itself, would make a new key at each call: None)
        out.append(value if for_key and value == value else None)
        return
    if cls in INT_SHAPED and QUIET_READS.get(cls, False) is None:
        # A plain array, read as it is: shape_of and dtype_of, inlined
        try:
            dims = tuple(value.shape)
        except Exception:  # (shape_of's None: a strided nested tensor; no list, tuple or dict)
            if for_key:  # its components' sizes, where its framework reads them
                out += (irregular_sizes(value), getattr(value, "dtype", None))
            else:
                out.append(None)
            return
        out.append(dims)
        if for_key:
            out.append(getattr(value, "dtype", None))
        return
    if for_key and isinstance(value, Enum):  # a plain value too
        out.append(value)
        return
    shape = shape_of(value)
    if shape is not None:
        out.append(shape)
        if for_key:
            out.append(dtype_of(value))
    elif isinstance(value, (list, tuple)):
        if for_key:  # ([a, b], c) and (a, [b, c]) are two calls
            out.append((type(value), len(value)))
        for item in value:
            _collect_shapes(item, out, for_key)
    elif isinstance(value, dict):
        if for_key:
            out.append((dict, len(value)))
        for name, item in value.items():
            if for_key:
                out.append(name)
            _collect_shapes(item, out, for_key)
    else:
        # Any other object: by its class in a key (an activation object, a cache: what runs
        # may depend on which), None among shapes.
        out.append(type(value) if for_key else None)


def parameter_ids(layer: Any) -> tuple[int, ...]:
    """The identities of a torch module's own parameters, in order (a submodule's are its own;
    ``()`` for anything else): which weights its sizes depend on besides its inputs.
    Identities, not shapes: reading a tensor's shape costs microseconds while torch's function
    mode is on the stack, as it is where the engine asks.

    Example:
        >>> parameter_ids(object())
        ()
    """
    params = getattr(layer, "__dict__", {}).get("_parameters")
    return tuple(map(id, params.values())) if isinstance(params, dict) else ()


def numel(tensor: Any) -> int:
    """Number of elements of a torch tensor, a ``tracetorch.core`` Tensor, an ndarray or a scalar.

    Example:
        >>> numel(np.zeros((2, 3))), numel(1.5)
        (6, 1)
    """
    count = getattr(tensor, "numel", None)
    if callable(count):
        try:
            return int(count())
        except ValueError as error:
            if not hasattr(type(tensor), "materialize"):
                raise
            # torch's lazy modules (nn.LazyLinear...) give their parameters a shape at their
            # first call: there is no count before it.
            raise ValueError(
                "model: a parameter of a lazy module (torch.nn.LazyLinear, LazyConv2d...) has "
                "no shape before the module's first call; call the model once on an example "
                "input, then count") from error
    data = getattr(tensor, "data", None)
    # A TinyTorch-style Tensor keeps its array in .data (its cached .shape can go stale).
    if isinstance(data, np.ndarray):
        return int(data.size)
    return int(np.size(tensor))


def ndarray_of(value: Any) -> np.ndarray | None:
    """The array holding ``value``'s data: an ndarray itself, a ``tracetorch.core`` Tensor's
    ``.data`` (an ndarray's own ``.data`` is a memoryview), else ``None``.

    Example:
        >>> ndarray_of(np.zeros(2)).shape, ndarray_of("text")
        ((2,), None)
    """
    if isinstance(value, np.ndarray):
        return value
    data = getattr(value, "data", None)
    return data if isinstance(data, np.ndarray) else None


def nbytes(tensor: Any) -> int:
    """Bytes of a torch tensor, a ``tracetorch.core`` Tensor or an ndarray (0 for anything
    else).

    Example:
        >>> nbytes(np.zeros((2, 3), dtype=np.float32)), nbytes("text")
        (24, 0)
    """
    size = getattr(tensor, "element_size", None)
    if callable(size):  # torch
        return int(size()) * int(tensor.numel())
    array = ndarray_of(tensor)
    return 0 if array is None else int(array.nbytes)


def tensors_in(value: Any) -> Iterator[Any]:
    """The tensors in ``value`` (anything with a shape), itself or inside tuples, lists and
    dicts, in order: what :func:`signature` walks.

    Example:
        >>> [t.shape for t in tensors_in(((np.zeros(4), 3), {"mask": np.zeros(2)}))]
        [(4,), (2,)]
    """
    if shape_of(value) is not None:
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (:func:`tensors_in`).

    Example:
        >>> tensor_bytes(((np.zeros(4), 3), {"mask": np.zeros(2, dtype=np.int8)}))
        34
    """
    return sum(nbytes(tensor) for tensor in tensors_in(value))


def check_shape(input_shape: Any, name: str = "input_shape") -> tuple[int, ...]:
    """``input_shape`` as a tuple of ints, or a ValueError naming it (as ``name``) and saying
    what it got, never a tensor's contents.

    Example:
        >>> check_shape([2, 3])
        (2, 3)
    """
    valid = (isinstance(input_shape, (tuple, list)) and len(input_shape) > 0
             and all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0
                     for d in input_shape))
    if not valid:
        raise ValueError(f"{name}: expected a non-empty tuple of positive ints, "
                         f"got {_described(input_shape)}")
    return tuple(int(d) for d in input_shape)


def _described(value: Any) -> str:
    # A value in an error message: a short repr, never a tensor's contents.
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def dummy_input(model: Any, shape: tuple[int, ...], seed: int | None = None) -> Any:
    """An input of ``shape`` in the model's own framework: zeros, or with ``seed`` seeded
    standard-normal values.

    A torch model gets a torch tensor of its parameters' dtype and device (float32 on the CPU
    when it has none). Anything else gets a float32 ``tracetorch.core`` Tensor, except a core
    token model (an int ``vocab_size``), which cannot take floats: integer ids below
    ``vocab_size`` (zeros, or seeded random ids).

    Example:
        >>> dummy_input(object(), (2, 3)).data.tolist()
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
        >>> x = dummy_input(object(), (2, 3), seed=0)
        >>> x.shape, str(x.data.dtype), bool((x.data != 0).all())
        ((2, 3), 'float32', True)
    """
    if is_torch_module(model):
        import torch  # already imported by the user: a torch model exists

        first = next(iter(model.parameters()), None)
        like = {} if first is None else {"dtype": first.dtype, "device": first.device}
        if seed is None:
            return torch.zeros(shape, **like)
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(**like)
    from tracetorch.core.tensor import Tensor

    rng = np.random.default_rng(seed)
    vocab_size = getattr(model, "vocab_size", None)
    if isinstance(vocab_size, int) and not isinstance(vocab_size, bool):
        ids = np.zeros(shape, np.int64) if seed is None else rng.integers(0, vocab_size, shape)
        return Tensor(ids, dtype=np.int64)
    values = np.zeros(shape) if seed is None else rng.standard_normal(shape)
    return Tensor(values.astype(np.float32))
