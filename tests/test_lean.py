"""``agentsession_cas.lean.dataclass`` says, compares and hashes as the standard one does."""

from __future__ import annotations

import dataclasses

import pytest

from agentsession_cas import lean


def _shapes(make):
    """The same class shapes made with a decorator ``make``."""

    @make
    class Plain:
        a: int
        b: list = dataclasses.field(default_factory=list)
        hidden: str = dataclasses.field(default="h", repr=False, compare=False)

    @make(frozen=True)
    class Frozen:
        a: int
        b: str = "x"
        loose: int = dataclasses.field(default=0, hash=False)

    @make(slots=True)
    class Slotted:
        a: int
        b: int = 2

    @make(frozen=True)
    class OwnEq:
        a: int

        def __eq__(self, other):
            return isinstance(other, OwnEq) and other.a % 2 == self.a % 2

    @make
    class OwnRepr:
        a: int

        def __repr__(self):
            return "mine"

    @make(frozen=True)
    class OwnHash:
        a: int

        def __hash__(self):
            return 7

    @make
    class Nested:
        inner: object = None

    return Plain, Frozen, Slotted, OwnEq, OwnRepr, OwnHash, Nested


def _instances(shapes):
    Plain, Frozen, Slotted, OwnEq, OwnRepr, OwnHash, Nested = shapes
    loop = Nested()
    loop.inner = loop  # (a repr that refers to itself)
    return [
        (Plain(1), Plain(1, hidden="other"), Plain(2)),
        (Frozen(1), Frozen(1, loose=5), Frozen(1, "y")),
        (Slotted(1), Slotted(1), Slotted(1, 3)),
        (OwnEq(1), OwnEq(3), OwnEq(2)),
        (OwnRepr(1), OwnRepr(1), OwnRepr(2)),
        (OwnHash(1), OwnHash(1), OwnHash(2)),
        (loop, Nested(1), Nested(2)),
    ]


def _said(x):
    """What can be said of an instance, its class's name made neutral."""
    try:
        h: object = hash(x)
    except TypeError as exc:
        h = f"unhashable: {exc}".split(":")[0]
    return repr(x), h


@pytest.mark.parametrize("k", range(7))
def test_lean_dataclasses_say_compare_and_hash_as_the_standard_ones(k):
    a, b, c = _instances(_shapes(dataclasses.dataclass))[k]
    x, y, z = _instances(_shapes(lean.dataclass))[k]
    assert [_said(v) for v in (a, b, c)] == [_said(v) for v in (x, y, z)]
    assert (a == b, a == c, b == c, a == 1, a != b) == (x == y, x == z, y == z, x == 1, x != y)


def test_lean_passes_other_options_to_the_standard_decorator():
    @lean.dataclass(order=True)
    class Ordered:
        a: int

    assert Ordered(1) < Ordered(2) and Ordered(1) == Ordered(1)
    assert "__lt__" in Ordered.__dict__ and "__eq__" in Ordered.__dict__


def _frozen_said(make):
    """What assigning and deleting attributes of frozen instances does (the error and its
    words, or the value after): of the class, of a plain subclass, with slots too."""

    @make(frozen=True)
    class Frozen:
        a: int
        b: str = "x"

    class Sub(Frozen):
        pass

    @make(frozen=True, slots=True)
    class FrozenSlots:
        a: int

    def attempt(act):
        try:
            return ("ok", act())
        except (AttributeError, TypeError) as exc:
            return (type(exc).__name__, str(exc))

    f, s, fs = Frozen(1), Sub(1), FrozenSlots(1)
    said = [attempt(lambda: setattr(f, "a", 2)), attempt(lambda: setattr(f, "new", 2)),
            attempt(lambda: delattr(f, "b")), attempt(lambda: delattr(f, "new")),
            attempt(lambda: setattr(s, "a", 2)), attempt(lambda: setattr(s, "new", 2)), attempt(lambda: s.new),
            attempt(lambda: delattr(s, "new")), attempt(lambda: delattr(s, "a")),
            attempt(lambda: setattr(fs, "a", 2)), attempt(lambda: delattr(fs, "a")),
            attempt(lambda: dataclasses.replace(f, a=5).a), attempt(lambda: (f.a, f.b, s.a, fs.a))]
    names = [Frozen.__setattr__.__qualname__, Frozen.__delattr__.__qualname__]
    return said, names, dataclasses.fields(Frozen) == dataclasses.fields(Frozen)


def test_lean_frozen_classes_refuse_and_allow_as_the_standard_ones():
    """A lean frozen class's ``__setattr__`` and ``__delattr__`` (closures, not compiled)
    refuse and allow what the standard ones do, in the same words; the standard decorator
    keeps its own maker for every other class."""
    assert _frozen_said(lean.dataclass) == _frozen_said(dataclasses.dataclass)
    standard = dataclasses._frozen_get_del_attr  # type: ignore[attr-defined]
    assert standard.__module__ == "dataclasses"

    @dataclasses.dataclass(frozen=True)
    class Standard:
        a: int

    assert Standard.__setattr__.__code__.co_filename == "<string>"  # (compiled, as ever)


@pytest.mark.skipif(not lean._SHARES_FROZEN, reason="Python 3.13 on: the standard maker is kept")
def test_lean_frozen_classes_compile_no_setattr_nor_delattr():
    @lean.dataclass(frozen=True)
    class Frozen:
        a: int

    assert Frozen.__setattr__.__code__.co_filename == lean.__file__
    assert Frozen.__delattr__.__code__.co_filename == lean.__file__
