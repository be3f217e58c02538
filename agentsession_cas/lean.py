"""``dataclass`` as the standard library's, with ``__repr__``, ``__eq__`` and ``__hash__``
shared by every class rather than compiled for each.

The standard decorator writes each class's methods as source text and compiles it
when the module is imported: the project's 70-odd dataclasses cost every command's
start a good part of its CPU (``agentsession head`` on a small store, in process:
70-71 ms -> 64-68 ms with the shared ``__repr__`` and ``__eq__``).
These generic methods read the class's fields instead, and say and compare what the
compiled ones would: ``repr=``/``compare=``/``hash=`` of each field are honoured, ``eq``
compares the fields of two instances of the same class, a frozen class hashes its
compared fields and an unfrozen one is unhashable, and a method the class defines
itself is kept. Any option beyond ``frozen``, ``slots``, ``kw_only`` and ``init`` goes
to the standard decorator unchanged.

A frozen class's ``__setattr__`` and ``__delattr__``, which the standard decorator also
compiles for each (two of the three functions it compiles for a frozen class), are
closures made by :func:`_frozen_methods` instead, of the same code: the standard
decorator is handed it in place of its own maker for the time it makes a lean class
(Python 3.11 and 3.12, whose maker has that shape; 3.13 compiles a class's functions
together, and keeps its own). ``agentsession append`` makes a dozen frozen classes.
"""

from __future__ import annotations

import dataclasses
import reprlib
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["dataclass"]

_T = TypeVar("_T", bound=type)
_PASSED = frozenset({"frozen", "slots", "kw_only", "init"})
_MISSING = object()


def _compared(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.compare)


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        return _compared(self) == _compared(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self) if (f.compare if f.hash is None else f.hash)))


@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
    return f"{self.__class__.__qualname__}({shown})"


def _frozen_methods(cls: Any, fields: list[dataclasses.Field], _globals: Any = None) -> tuple[Callable, Callable]:
    """A frozen class's ``__setattr__`` and ``__delattr__``, as the standard decorator's
    ``_frozen_get_del_attr`` makes them (``FrozenInstanceError`` for the class's own
    instances and for its fields, else the next class's method), without compiling."""
    names = tuple(f.name for f in fields)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__


#: Whether the standard decorator's maker of a frozen class's methods is the one
#: :func:`_frozen_methods` stands in for (``(cls, fields, globals)`` -> the two functions).
_SHARES_FROZEN = sys.version_info < (3, 13) and hasattr(dataclasses, "_frozen_get_del_attr")
_swapping = threading.Lock()


def _lean(cls: _T, options: dict[str, Any]) -> _T:
    own = cls.__dict__
    out: Any
    if options.get("frozen") and _SHARES_FROZEN:
        with _swapping:
            standard = dataclasses._frozen_get_del_attr  # type: ignore[attr-defined]
            dataclasses._frozen_get_del_attr = _frozen_methods  # type: ignore[attr-defined]
            try:
                out = dataclasses.dataclass(cls, repr=False, eq=False, **options)
            finally:
                dataclasses._frozen_get_del_attr = standard  # type: ignore[attr-defined]
    else:
        out = dataclasses.dataclass(cls, repr=False, eq=False, **options)
    if "__repr__" not in own:
        out.__repr__ = _repr
    if "__eq__" not in own:
        out.__eq__ = _eq
    # (as the standard decorator decides: a __hash__ of the class's own stays, and the
    # None Python sets beside an __eq__ of the class's own is not one)
    stated = own.get("__hash__", _MISSING)
    if stated is _MISSING or (stated is None and "__eq__" in own):
        out.__hash__ = _hash if options.get("frozen") else None
    return out


@overload
def dataclass(cls: _T, /) -> _T: ...
@overload
def dataclass(cls: None = None, /, **options: Any) -> Callable[[_T], _T]: ...
@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def dataclass(cls: Any = None, /, **options: Any) -> Any:
    """``@dataclass`` or ``@dataclass(frozen=True, slots=True, ...)``, as the standard one."""
    if not _PASSED.issuperset(options):
        return dataclasses.dataclass(cls, **options) if cls is not None else dataclasses.dataclass(**options)
    if cls is None:
        return lambda c: _lean(c, options)
    return _lean(cls, options)
