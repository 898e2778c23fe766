"""The one patch primitive: every attribute tracetorch sets, and taking back only its own.

Every attribute the profiler changes — a layer's ``forward``, ``Tensor.backward``, a core
optimizer's ``step``, a base class's ``__init_subclass__``, an ``@instrument``\\ ed class — is
set by :meth:`Patch.apply`, which remembers where, what was there (or that nothing was: the class
only inherited it) and the object it installed. :meth:`Patch.restore` puts the original back by
identity only while the attribute still holds that object: a user's own reassignment made
inside the block (``nn.Linear.forward = f``) is theirs and stays; an attribute added to a class
that only inherited it is deleted again, so the class gets no copy.

:class:`PatchBoard` holds the patches of the open profiles, reference-counted under a lock:
the first :meth:`~PatchBoard.acquire` opens, the last :meth:`~PatchBoard.release` restores, so
code run outside every profile pays nothing. A wrapper is built once per class and callable
(:func:`reusable_wrapper`): entering a block again costs a ``setattr`` per class wrapped.

Example:
    >>> class Layer:
    ...     def forward(self, x):
    ...         return x
    >>> original = vars(Layer)["forward"]
    >>> board = PatchBoard()
    >>> board.acquire([PatchTarget(Layer, "forward", "module")])
    >>> is_instrumented(vars(Layer)["forward"])
    True
    >>> board.release()
    >>> vars(Layer)["forward"] is original
    True
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable, Iterator
from types import FunctionType, MethodType
from typing import Any, Callable, NamedTuple

import wrapt

from tracetorch.engine.hotpath import make_wrapper
from tracetorch.engine.native import native_type
from tracetorch.records.tree import NodeKind

__all__ = ("BOARD", "BoundLayerMethod", "LayerMethod", "Patch", "PatchTarget", "PatchBoard",
           "defining_class", "is_instrumented", "recording_wrapper", "reusable_wrapper",
           "subclass_watcher")

Guard = Callable[[], bool]

#: Stands for "the owner had no attribute of its own" (it inherited it, or had none).
_ABSENT: Any = object()


class Patch:
    """One attribute set by tracetorch: where, what was there, and what was put there.

    Example:
        >>> class Base:
        ...     def hello(self):
        ...         return "base"
        >>> class Child(Base):
        ...     pass
        >>> patch = Patch.apply(Child, "hello", lambda self: "patched")
        >>> Child().hello()
        'patched'
        >>> patch.restore(), "hello" in vars(Child)    # inherited: the copy is deleted
        (True, False)
    """

    __slots__ = ("owner", "attr", "original", "installed")

    def __init__(self, owner: Any, attr: str, original: Any, installed: Any) -> None:
        self.owner = owner
        self.attr = attr
        self.original = original
        self.installed = installed

    @classmethod
    def apply(cls, owner: Any, attr: str, value: Any) -> Patch:
        """Set ``owner.attr = value`` and return the patch that can undo it."""
        patch = cls(owner, attr, vars(owner).get(attr, _ABSENT), value)
        setattr(owner, attr, value)
        return patch

    @property
    def inherited(self) -> bool:
        """Whether the owner had no attribute of its own before the patch."""
        return self.original is _ABSENT

    @property
    def owned(self) -> bool:
        """Whether the attribute still holds what tracetorch installed."""
        return vars(self.owner).get(self.attr, _ABSENT) is self.installed

    def restore(self) -> bool:
        """Put the original back (delete the attribute if there was none) unless something
        else was assigned since; returns whether anything was restored."""
        if not self.owned:
            return False  # reassigned by the user (or deleted): theirs now
        if self.original is _ABSENT:
            delattr(self.owner, self.attr)
        else:
            setattr(self.owner, self.attr, self.original)
        return True


class PatchTarget(NamedTuple):
    """A callable attribute to wrap: ``cls.attr`` recorded as a node of ``kind``.

    ``cls`` may also be an instance whose own ``__dict__`` holds ``attr`` (a ``forward``
    assigned on the instance, as accelerate's mixed precision does): its calls are recorded as
    calls of that instance, and the very object that was there is put back.

    ``guard() -> True`` lets a call through unrecorded (see
    :func:`tracetorch.engine.hotpath.make_wrapper`). Only a class that defines ``attr`` itself
    is patched, unless ``inherited``: then the attribute found through the MRO is wrapped and
    set on ``cls`` (and deleted again on restore).
    """

    cls: type
    attr: str
    kind: NodeKind
    guard: Guard | None = None
    inherited: bool = False


def defining_class(cls: type, attr: str) -> type | None:
    """The class in ``cls``'s MRO whose own ``__dict__`` holds ``attr`` (``None`` if none).

    Example:
        >>> class A:
        ...     def forward(self): ...
        >>> class B(A):
        ...     pass
        >>> defining_class(B, "forward").__name__
        'A'
    """
    for klass in cls.__mro__:
        if attr in vars(klass):
            return None if klass is object else klass
    return None


def is_instrumented(value: Any) -> bool:
    """Whether ``value`` is a tracetorch wrapper (from a profile or ``instrument``).

    Example:
        >>> is_instrumented(print), is_instrumented(recording_wrapper(print, "function"))
        (False, True)
    """
    return isinstance(value, wrapt.FunctionWrapper) and getattr(value, "_self_tracetorch", False)


class _Answered:
    """An attribute that a :class:`BoundLayerMethod` answers with its bound method's (every
    class holds its own ``__doc__`` and ``__module__``, which would shadow the method's), and
    its class with its own value."""

    __slots__ = ("name", "own")

    def __init__(self, name: str, own: Any) -> None:
        self.name = name
        self.own = own

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        return self.own if instance is None else getattr(instance.__wrapped__, self.name)


class _BoundClass(type):
    """The class of :class:`BoundLayerMethod`: ``type.__module__`` hands back what the class
    holds as is, here an :class:`_Answered`; this gives its value instead."""

    @property
    def __module__(cls) -> str:  # type: ignore[override]
        return vars(cls)["__module__"].own


class BoundLayerMethod(metaclass=_BoundClass):
    """A layer's recording method bound to one layer: what ``layer.forward`` is in a block.

    Calling it calls the method's per-call wrapper as wrapt's own bound wrapper does for a
    function bound to an instance, ``wrapper(bound, layer, args, kwargs)``, with ``bound`` the
    layer's plain bound method (``__wrapped__``); everything else it answers as that bound method
    does (``__self__``, ``__func__``, ``__name__``, ``__doc__``, ``__module__``, equality and
    hash, pickling, ``isinstance(..., types.MethodType)`` through ``__class__``), and wrapt's
    ``_self_`` names as the recording method (``_self_tracetorch``), as wrapt's bound wrapper
    does. It is made at every read, as a bound method is; ``tracetorch/engine/_binding.c`` makes
    its C twin, without wrapt's proxy and keyword parsing.

    Example:
        >>> class Layer:
        ...     def forward(self, x):
        ...         return x
        >>> Layer.forward = recording_wrapper(vars(Layer)["forward"], "module")
        >>> layer = Layer()
        >>> method = BoundLayerMethod(vars(Layer)["forward"], layer)
        >>> method(3), method.__self__ is layer, method == layer.forward
        (3, True, True)
    """

    __slots__ = ("_self_parent", "_self_instance", "_self_wrapper", "__wrapped__",
                 "__weakref__")
    __doc__ = _Answered("__doc__", __doc__)
    __module__ = _Answered("__module__", __module__)

    def __init__(self, method: wrapt.FunctionWrapper, instance: Any) -> None:
        # (typed here, not in the class body: class annotations would be the method's)
        self._self_parent: Any = method
        self._self_instance: Any = instance
        self._self_wrapper: Callable[..., Any] = method._self_wrapper
        self.__wrapped__: MethodType = MethodType(method.__wrapped__, instance)

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        return self._self_wrapper(self.__wrapped__, self._self_instance, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only for what the class does not define. A field is unset only in the object Dynamo
        # traces __init__ on (it records the stores, never makes them), which it hashes and
        # asks for its class: None, as if there were no method yet.
        if name in BoundLayerMethod.__slots__:
            return None
        try:
            return getattr(self.__wrapped__, name)
        except AttributeError:
            if not name.startswith("_self_"):
                raise
        return getattr(self._self_parent, name)  # wrapt's own names: _self_tracetorch

    @property
    def __self__(self) -> Any:
        return self._self_instance

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self.__wrapped__)

    def __eq__(self, other: object) -> bool:
        return self.__wrapped__ == (other.__wrapped__ if type(other) is BoundLayerMethod
                                    else other)

    def __hash__(self) -> int:
        return hash(self.__wrapped__)

    def __repr__(self) -> str:
        return f"<recording {self.__wrapped__!r}>"

    def __reduce__(self) -> Any:
        return self.__wrapped__.__reduce__()

    def __dir__(self) -> list[str]:
        return dir(self.__wrapped__)


class _LayerBinding(wrapt.FunctionWrapper):
    """How a layer's method binds: read from a class, the function itself; from an instance,
    a :class:`BoundLayerMethod` (in C where ``tracetorch/engine/_binding.c`` is built)."""

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self.__wrapped__
        return BoundLayerMethod(self, instance)


# The same binding as a C slot and a C bound object: no Python frame on each read of a layer's
# method (``_call_impl`` reads ``self.forward`` at every call) nor on its call.
_native_binding = native_type("tracetorch.engine._binding", "layer_binding")
_Binding: type[wrapt.FunctionWrapper] = (
    _LayerBinding if _native_binding is None else _native_binding(wrapt.FunctionWrapper))


class LayerMethod(_Binding):  # type: ignore[valid-type,misc]
    """The recording wrapper of a layer's method: called through an instance it records, read
    from the class (``type(self).forward``, ``Linear.forward``) it is the original function.

    So code that compares a class's method with a function it knows sees the same object in a
    block as outside (transformers' gradient-checkpointing layers ask ``type(self).forward is
    forward_with_checkpointing`` to decide whether to checkpoint), and Dynamo, which guards on
    the object such a read returns, finds the same one at each check: wrapt binds a new object
    at each read. An unbound call (``Base.forward(self, x)``) is the call of the function, as
    ``super().forward(x)`` made inside the layer's own call is anyway. Read from an instance it
    is a :class:`BoundLayerMethod`, made by a C slot where the accelerators are built
    (``_LayerBinding.__get__`` otherwise, then ``BoundLayerMethod``'s own ``__init__`` and
    ``__call__``: three Python frames per layer call).

    Example:
        >>> class Layer:
        ...     def forward(self, x):
        ...         return x
        >>> original = vars(Layer)["forward"]
        >>> Layer.forward = recording_wrapper(original, "module")
        >>> Layer.forward is original, Layer().forward(3)
        (True, 3)
    """

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # Not the wrapped function's class, which wrapt's proxy claims: Dynamo takes an object
        # that passes isinstance(..., FunctionType) for a function and guards on its closure
        # as a function's, which this object is not.
        return type(self)


def recording_wrapper(original: Any, kind: NodeKind, *, label: str | None = None,
                      flops_fn: Callable[..., int] | None = None,
                      guard: Guard | None = None, owner: Any = None) -> wrapt.FunctionWrapper:
    """``original`` wrapped (with wrapt, so it still binds as a method) to record each call as
    a node of ``kind``, tagged as tracetorch's so nothing wraps it twice; ``owner``, when
    given, is the object every call is a call of (an instance's own ``forward``).

    Example:
        >>> double = recording_wrapper(lambda x: 2 * x, "function", label="double")
        >>> double(21)                      # outside a profile it only calls through
        42
    """
    # A layer's method read from its class is the function itself (see LayerMethod).
    wrapper_type: type[wrapt.FunctionWrapper] = (
        LayerMethod if kind == "module" and isinstance(original, FunctionType)
        else wrapt.FunctionWrapper)
    wrapper = wrapper_type(original, make_wrapper(kind, label, flops_fn, guard, owner))
    wrapper._self_tracetorch = True  # type: ignore[attr-defined]
    return wrapper


#: The wrapper built for each class's attribute, with what it was built from: entering a block
#: again reuses it, so re-wrapping a class costs a ``setattr``, not a new wrapper (and the garbage
#: collections that allocating thousands of them triggers). Weak: a class that goes away takes its
#: entry along, unless its own method refers back to it (``super()`` in ``forward``).
_WRAPPERS: weakref.WeakKeyDictionary[type, dict[str, tuple[Any, NodeKind, Guard | None, Any]]] = (
    weakref.WeakKeyDictionary())


def reusable_wrapper(cls: type, attr: str, original: Any, kind: NodeKind,
                     guard: Guard | None = None) -> wrapt.FunctionWrapper:
    """:func:`recording_wrapper` of ``original`` for ``cls.attr``, the same object each time it
    is asked for the same callable, kind and guard.

    Example:
        >>> class Layer:
        ...     def forward(self, x):
        ...         return x
        >>> first = reusable_wrapper(Layer, "forward", vars(Layer)["forward"], "module")
        >>> first is reusable_wrapper(Layer, "forward", vars(Layer)["forward"], "module")
        True
    """
    built = _WRAPPERS.setdefault(cls, {})
    entry = built.get(attr)
    if entry is not None and entry[0] is original and entry[1] == kind and entry[2] is guard:
        return entry[3]
    wrapper = recording_wrapper(original, kind, guard=guard)
    built[attr] = (original, kind, guard, wrapper)
    return wrapper


def subclass_watcher(base: type, on_new: Callable[[type], None]) -> classmethod:
    """An ``__init_subclass__`` for ``base`` that does what ``base`` did, then calls
    ``on_new(cls)`` for the new subclass (a class the profiler cannot wrap is still created).

    Example:
        >>> class Base:
        ...     pass
        >>> seen = []
        >>> patch = Patch.apply(Base, "__init_subclass__", subclass_watcher(Base, seen.append))
        >>> class New(Base):
        ...     pass
        >>> patch.restore(), seen == [New]
        (True, True)
    """
    own = vars(base).get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:  # noqa: N807 - its real name
        if own is not None:
            own.__get__(None, cls)(**kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)  # type: ignore[arg-type]
        try:
            on_new(cls)
        except Exception:
            pass

    return classmethod(__init_subclass__)


class PatchBoard:
    """The patches of the open profiles: the first :meth:`acquire` opens, the last
    :meth:`release` restores what is still tracetorch's and runs the registered cleanups."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._users = 0
        self._patches: dict[tuple[Any, str], Patch] = {}
        self._cleanups: list[Callable[[], None]] = []
        self._suspensions = 0

    @property
    def active(self) -> bool:
        """Whether any profile currently holds the patches."""
        return self._users > 0

    def acquire(self, targets: Iterable[PatchTarget],
                on_first: Callable[[], list[Callable[[], None]]] | None = None) -> None:
        """Register one more user and wrap ``targets`` not wrapped yet.

        ``on_first`` runs when this is the first user; the callables it returns run when the last
        user releases (in reverse order). If anything fails, everything done here is undone.
        """
        with self._lock:
            self._users += 1
            try:
                if self._users == 1 and on_first is not None:
                    self._cleanups.extend(on_first())
                for target in targets:
                    self.patch(target)
            except BaseException:
                self.release()
                raise

    def patch(self, target: PatchTarget) -> None:
        """Wrap one attribute now (a no-op if it is wrapped, not callable, not the class's own
        without ``inherited``, or if no profile is active)."""
        cls, attr, kind, guard, inherited = target
        with self._lock:
            if not self._users or (cls, attr) in self._patches:
                return
            if attr in vars(cls):
                original = vars(cls)[attr]
            elif inherited and defining_class(cls, attr) is not None:
                original = getattr(cls, attr)
            else:
                return
            if is_instrumented(original) or not callable(original):
                return
            if isinstance(cls, type):
                self._add(cls, attr, reusable_wrapper(cls, attr, original, kind, guard))
            else:  # an instance's own attribute: its calls are the instance's
                self._add(cls, attr, recording_wrapper(original, kind, guard=guard, owner=cls))

    def install(self, owner: Any, attr: str, value: Any) -> bool:
        """Set ``owner.attr = value`` until the last release, also over a value the board set
        there itself (what is restored stays what was there first); returns False, doing
        nothing, when no profile is active or the attribute holds what someone else put there
        since the board set it."""
        with self._lock:
            if not self._users:
                return False
            patch = self._patches.get((owner, attr))
            if patch is None:
                self._add(owner, attr, value)
            elif patch.owned:
                setattr(owner, attr, value)
                patch.installed = value
            else:
                return False
            return True

    def watch_subclasses(self, base: type, on_new: Callable[[type], None]) -> None:
        """Call ``on_new(cls)`` for every subclass of ``base`` created until the last release."""
        with self._lock:
            if self._users and (base, "__init_subclass__") not in self._patches:
                self._add(base, "__init_subclass__", subclass_watcher(base, on_new))

    def _add(self, owner: Any, attr: str, value: Any) -> None:
        self._patches[(owner, attr)] = Patch.apply(owner, attr, value)

    def add_cleanups(self, cleanups: list[Callable[[], None]]) -> None:
        """Run ``cleanups`` when the last user releases (for adapters started late)."""
        with self._lock:
            if self._users:
                self._cleanups.extend(cleanups)
            else:
                for cleanup in reversed(cleanups):
                    cleanup()

    def release(self) -> None:
        """One user fewer; the last one restores every patch still tracetorch's (a value the
        user assigned meanwhile stays) and runs the cleanups."""
        with self._lock:
            if self._users == 0:
                return
            self._users -= 1
            if self._users:
                return
            errors: list[BaseException] = []
            patches, self._patches = self._patches, {}
            cleanups, self._cleanups = self._cleanups, []
            for patch in reversed(list(patches.values())):
                try:
                    patch.restore()
                except BaseException as exc:  # keep restoring the rest, report after
                    errors.append(exc)
            for cleanup in reversed(cleanups):
                try:
                    cleanup()
                except BaseException as exc:
                    errors.append(exc)
            if errors:
                raise errors[0]

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """For the duration, every attribute the board set holds what was there before (the
        patches are put back after, where nothing else was assigned meanwhile): what runs
        inside sees the classes as outside any profile. Nested suspensions suspend once.

        Example:
            >>> class Layer:
            ...     def forward(self, x):
            ...         return x
            >>> board = PatchBoard()
            >>> board.acquire([PatchTarget(Layer, "forward", "module")])
            >>> with board.suspended():
            ...     is_instrumented(vars(Layer)["forward"])
            False
            >>> is_instrumented(vars(Layer)["forward"])
            True
            >>> board.release()
        """
        with self._lock:
            self._suspensions += 1
            undone = ([patch for patch in self._patches.values() if patch.restore()]
                      if self._suspensions == 1 else [])
        try:
            yield
        finally:
            with self._lock:
                self._suspensions -= 1
                for patch in undone:
                    # Not if the board closed meanwhile, or the user assigned the attribute.
                    if (self._patches.get((patch.owner, patch.attr)) is patch
                            and vars(patch.owner).get(patch.attr, _ABSENT) is patch.original):
                        setattr(patch.owner, patch.attr, patch.installed)

    def patched(self) -> dict[tuple[Any, str], Patch]:
        """What is patched now, ``{(owner, attr): patch}`` (for tests and debugging)."""
        with self._lock:
            return dict(self._patches)


#: The one board every profile in the process shares.
BOARD = PatchBoard()
