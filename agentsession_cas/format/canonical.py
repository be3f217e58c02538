"""Canonical JSON (RFC 8785, JCS) and the I-JSON test RFC 0001 puts on hashed members.

This is the one place the project turns values into the bytes it hashes and
the one place it parses JSON strictly. Two serialisers live here:

* :func:`canonical_str_reference` is a direct, readable implementation of
  JCS. It is the definition; property tests prove it byte-identical to the
  ``rfc8785`` package.
* :func:`canonical_bytes` is the hot path. It asks a C JSON encoder for
  sorted, compact output, which is already JCS for strings, ``true``/
  ``false``/``null``, small integers and keys inside the Basic Multilingual
  Plane: ``orjson`` (UTF-8 bytes in one call) for a value known to hold
  nothing else, the standard library's for one not known. A cheap scan of its
  output spots anything it renders differently (a float, an integer of 16 or
  more digits, a supplementary character) and only then falls back to the
  reference serialiser. False alarms cost speed, never correctness.

Parsing (:func:`loads`) refuses what ``json.loads`` silently accepts or
alters: repeated member names, ``NaN``/``Infinity``, numbers that are not
finite in binary64, and whole numbers a double reader would change (RFC
0001 "Entry hash"). Lone surrogates are refused when the value is encoded
to canonical UTF-8 bytes, which every hash needs anyway.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from ..errors import IJSONError

__all__ = [
    "loads",
    "loads_flagged",
    "loads_canonical",
    "canonical_bytes",
    "canonical_members",
    "canonical_str",
    "canonical_str_reference",
    "number_to_json",
    "check_whole_number",
]

_TWO_53 = 2**53

# --------------------------------------------------------------------------
# Numbers


def number_to_json(value: float) -> str:
    """Render a binary64 value as ECMAScript's Number::toString does (JCS 3.2.2.3)."""
    if value != value or value in (math.inf, -math.inf):
        raise IJSONError(f"number {value!r} is not finite")
    if value == 0:
        return "0"  # covers -0.0 as well
    if value < 0:
        return "-" + number_to_json(-value)
    # repr gives the shortest digit string that round-trips, which is what
    # ECMAScript asks for; only the layout differs.
    _, digits_t, exponent = Decimal(repr(value)).as_tuple()
    exp: int = exponent  # type: ignore[assignment]  # a finite value's exponent is an int, never n, N or F
    digits = "".join(map(str, digits_t)).rstrip("0") or "0"
    exp += len(digits_t) - len(digits)
    k = len(digits)
    n = k + exp  # value = 0.digits * 10**n
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


def _show(exact: int | Decimal) -> str:
    """``str(exact)``, which for an int beyond ``sys.get_int_max_str_digits()`` raises."""
    try:
        return str(exact)
    except ValueError:
        return f"of {exact.bit_length()} bits"  # type: ignore[union-attr]


def check_whole_number(exact: int | Decimal, spelled: str | None = None) -> float:
    """Apply RFC 0001's whole-number rule to an exact whole value; return its double.

    The value must be exactly representable in binary64, or equal to the
    canonical rendering of the nearest double (so 2**60 spelled
    ``1152921504606847000`` passes, ``9007199254740993`` never does).
    """
    try:
        as_float = float(exact)
    except OverflowError:
        raise IJSONError(f"number {spelled or _show(exact)} is not finite in binary64") from None
    if math.isinf(as_float):
        raise IJSONError(f"number {spelled or _show(exact)} is not finite in binary64")
    if Decimal(as_float) == exact:
        return as_float
    if Decimal(number_to_json(as_float)) == exact:
        return as_float
    raise IJSONError(
        f"whole number {spelled or exact} is not exact in binary64 and is not the "
        f"canonical rendering of the nearest double ({number_to_json(as_float)})"
    )


class _ParseFlags(threading.local):
    """Per-thread note, set by the parser hooks, that the value being parsed
    holds something the C encoder does not render as JCS does."""

    careful = False


_flags = _ParseFlags()

_orjson_loads = orjson.loads
_orjson_dumps = orjson.dumps
_ORJSON_SORTED = orjson.OPT_SORT_KEYS


def _parse_int(text: str) -> int:
    if len(text) > 15:
        _flags.careful = True
    return int(text)


def _parse_float(text: str) -> float:
    """Float hook for the strict parser: finite, and the whole-number rule by spelling."""
    _flags.careful = True
    value = float(text)
    if math.isinf(value) or value != value:
        raise IJSONError(f"number {text} is not finite in binary64")
    if abs(value) >= _TWO_53:
        # Only here can a whole number be one a double does not hold.
        try:
            exact = Decimal(text)
        except InvalidOperation:  # pragma: no cover - json already validated it
            raise IJSONError(f"bad number {text}") from None
        if exact == exact.to_integral_value():
            check_whole_number(exact, text)
    return value


def _parse_constant(name: str) -> Any:
    raise IJSONError(f"{name} is not a JSON number")


def _object_pairs_ascii(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Hook for text known to be ASCII: only the repeated-name check."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        _repeated(pairs)
    return obj


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if not _flags.careful and _astral("".join(obj)):
        _flags.careful = True
    if len(obj) != len(pairs):
        _repeated(pairs)
    return obj


def _repeated(pairs: list[tuple[str, Any]]) -> None:
    """Name the member that repeats (called only when one does)."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise IJSONError(f"member name {json.dumps(key, ensure_ascii=False)} is repeated in one object")
        seen.add(key)


_DECODER = json.JSONDecoder(
    object_pairs_hook=_object_pairs,
    parse_float=_parse_float,
    parse_int=_parse_int,
    parse_constant=_parse_constant,
)
# ASCII text without a surrogate escape holds no supplementary-plane member
# name, so its hook skips that check.
_DECODER_ASCII = json.JSONDecoder(
    object_pairs_hook=_object_pairs_ascii,
    parse_float=_parse_float,
    parse_int=_parse_int,
    parse_constant=_parse_constant,
)


#: The deepest a value may nest arrays and objects (an entry's own object is the first
#: level). Deeper is refused (:class:`IJSONError`) by the parse, by :func:`canonical_bytes`
#: of a value a caller built, and so by every check of a line, whoever calls it: the
#: standard parser and encoder recurse once a level, and a bound set by the interpreter's
#: recursion limit would move with the depth of the caller's stack and leave none to what
#: runs during the parse (a finalizer the cyclic collector calls, the report of its error).
#: 512 levels leave about half the default limit; ``orjson`` encodes 254 and parses 1024.
MAX_DEPTH = 512
_TOO_DEEP = f"the value is nested more than {MAX_DEPTH} deep"
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


def _check_depth(text: str | bytes) -> None:
    """Refuse a text nesting more than :data:`MAX_DEPTH` levels, before a parse recurses
    into it: two counts when it opens no more than that many arrays and objects in all
    (every line of a session but a huge one), else one pass over its brackets, its
    strings removed (an unterminated one left: its brackets then count, a text that is
    no JSON refused a little early)."""
    if len(text) <= MAX_DEPTH:
        return
    if isinstance(text, str):
        if text.count("[") + text.count("{") <= MAX_DEPTH:
            return
        text = text.encode("utf-8", "surrogatepass")
    elif text.count(b"[") + text.count(b"{") <= MAX_DEPTH:
        return
    depth = 0
    for c in _NOT_BRACKET.sub(b"", _STRING.sub(b"", text)):
        if c == 91 or c == 123:  # [ {
            depth += 1
            if depth > MAX_DEPTH:
                raise IJSONError(_TOO_DEEP)
        else:
            depth -= 1


def _check_value_depth(value: Any) -> None:
    """Refuse a value nesting more than :data:`MAX_DEPTH` levels, walked a level at a time."""
    level = [value] if isinstance(value, (dict, list, tuple)) else []
    for _ in range(MAX_DEPTH):
        if not level:
            return
        level = [x for v in level for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, (dict, list, tuple))]
    if level:
        raise IJSONError(_TOO_DEEP)


def loads(text: str | bytes) -> Any:
    """Parse JSON strictly (I-JSON). Syntax errors raise ``json.JSONDecodeError``
    (a ``ValueError``); values JSON admits but I-JSON refuses raise :class:`IJSONError`.

    Integers are kept exact; :func:`canonical_bytes` applies the whole-number
    rule to them, since it is a property of the value, not of its spelling.
    """
    return loads_flagged(text)[0]


def loads_flagged(text: str | bytes) -> tuple[Any, bool]:
    """:func:`loads`, also saying whether the value needs the careful serialiser
    (it holds a float, an integer beyond 15 digits or a supplementary-plane
    member name). Pass the flag to :func:`canonical_bytes` as ``careful``."""
    return _loads_flagged(text, True)


def _loads_flagged(text: str | bytes, deep: bool) -> tuple[Any, bool]:
    """:func:`loads_flagged`; ``deep`` False when the text is known to nest no more than
    :data:`MAX_DEPTH` levels (``orjson`` encoded the value it holds), sparing the count."""
    if isinstance(text, (bytes, bytearray)):
        if deep:
            _check_depth(text)  # (counted in the bytes: a little faster than in the text)
        text = text.decode("utf-8")
    elif deep:
        _check_depth(text)
    _flags.careful = False
    try:
        plain = text.isascii() and ("\\u" not in text or _SURROGATE_ESCAPE.search(text) is None)
        decoder = _DECODER_ASCII if plain else _DECODER
        # The scanner directly: decode() adds two regex matches and a call per line.
        try:
            value, end = decoder.scan_once(text, 0)  # type: ignore[attr-defined]  # set on each decoder by json.decoder
        except StopIteration:
            value, end = decoder.decode(text), len(text)  # leading space, or the real error
        if end != len(text) and text[end:].strip(" \t\n\r"):
            raise json.JSONDecodeError("Extra data", text, end)
        return value, _flags.careful
    except (json.JSONDecodeError, IJSONError):
        raise
    except RecursionError:
        raise IJSONError(_TOO_DEEP) from None
    except ValueError as exc:
        # int() refuses a literal longer than sys.get_int_max_str_digits()
        # (at least 640 digits), and so a number far beyond binary64's range.
        raise IJSONError(f"a number is not finite in binary64 ({exc})") from None


def loads_canonical(raw: bytes) -> tuple[Any, bool, bool]:
    """:func:`loads_flagged` of a line's bytes, and whether they are proven the canonical
    form of the object they hold: ``(value, careful, canonical)``.

    ``orjson`` parses in a third of the strict parse's time. Its object is taken when
    encoding it again (sorted, compact) gives ``raw`` back and it holds no float, no
    integer of 16 characters or more and no supplementary-plane member name (the strict
    parse's careful flag is then False): the round trip proves no member named twice
    (a dict keeps one of them, and its encoding is shorter), every string read as its
    bytes say (an escape ``orjson`` writes otherwise differs), no whitespace, and, with
    such values, RFC 8785's bytes (``canonical_bytes`` relies on that equivalence), so
    the value is the strict parse's and ``raw`` its canonical form. Anything not proven
    (a float, an escape, a repeat, a fault) goes through :func:`loads_flagged`, which
    raises as it always did, and is never called canonical."""
    deep = True
    try:
        value = _orjson_loads(raw)
        if value.__class__ is dict and _plain(value, not raw.isascii()):
            if _orjson_dumps(value, None, _ORJSON_SORTED) == raw:
                return value, False, True
            deep = False  # (encoded: it nests no more than orjson's 254 levels)
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):  # a fault, or nesting past 255 levels to encode
        pass
    value, careful = _loads_flagged(raw, deep)
    return value, careful, False


#: The integers whose literal the strict parse leaves unflagged (15 characters at most).
_PLAIN_LOW, _PLAIN_HIGH = -(10**14), 10**15


def _plain(value: dict, names: bool) -> bool:
    """Whether a parsed value holds no float and no integer of 16 characters or more (and,
    with ``names``, no member name outside the Basic Multilingual Plane): the values the
    strict parse flags careful. One walk over the containers, the strings skipped."""
    stack: list[Any] = [value]
    pop, push = stack.pop, stack.append
    while stack:
        v = pop()
        if v.__class__ is dict:
            if names and _astral("".join(v)):
                return False
            members = v.values()
        else:
            members = v
        for x in members:
            c = x.__class__
            if c is str:
                continue
            if c is dict or c is list:
                push(x)
            elif c is float or (c is int and not _PLAIN_LOW < x < _PLAIN_HIGH):
                return False
    return True


# --------------------------------------------------------------------------
# The reference serialiser


def member_order(name: str) -> bytes:
    """The key JCS orders member names by: their UTF-16 code units."""
    return name.encode("utf-16-be", "surrogatepass")


def canonical_members(members: Mapping[str, bytes]) -> bytes:
    """The canonical bytes of an object's members, braces left out, from each member
    value's own canonical bytes: RFC 8785 writes every value alike wherever it stands, so
    one encoded once serves each object holding it (a request's tools, say)."""
    return b",".join(canonical_bytes(name) + b":" + members[name] for name in sorted(members, key=member_order))


_encode_str = json.encoder.encode_basestring


def _ref(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_encode_str(value))
    elif isinstance(value, int):
        if -_TWO_53 < value < _TWO_53:
            out.append(str(int(value)))
        else:
            out.append(number_to_json(check_whole_number(int(value))))
    elif isinstance(value, float):
        out.append(number_to_json(float(value)))  # a subclass's repr may differ
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise IJSONError(f"member name {key!r} is not a string")
        out.append("{")
        first = True
        for key in sorted(value, key=member_order):
            if not first:
                out.append(",")
            first = False
            out.append(_encode_str(key))
            out.append(":")
            _ref(value[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _ref(item, out)
        out.append("]")
    else:
        raise IJSONError(f"value of type {type(value).__name__} is not JSON")


def canonical_str_reference(value: Any) -> str:
    """JCS text of ``value``, written straight from RFC 8785. Slow; the definition."""
    out: list[str] = []
    _ref(value, out)
    return "".join(out)


# --------------------------------------------------------------------------
# The fast path

# The C encoder, called directly: no per-call encoder object, no cycle check
# (parsed values hold none, and a cycle in a caller's value ends in RecursionError).
_c_iterencode = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, None, _encode_str, None, ":", ",", True, False, False
) if getattr(json.encoder, "c_make_encoder", None) else None
_C_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))


def _c_chunks_fallback(value: Any, _: int) -> list[str]:  # pragma: no cover - CPython always has the C encoder
    return [_C_ENCODER.encode(value)]



#: The C encoder's chunks of a value, joined by the caller (``_join(_c_chunks(value, 0))``).
_c_chunks: Any = _c_iterencode if _c_iterencode is not None else _c_chunks_fallback
_join = "".join


# In the C encoder's output a number follows ':', ',' or '['. A float always
# renders with '.' or 'e'; an integer the C encoder may render differently
# from JCS has 16 digits or more. Supplementary characters may sort
# differently as member names. Matches inside strings are harmless false alarms.
# Used only for parsed values whose parse flags are not known.
# Kept as three cheap tests: a pattern that opens with a character set lets the
# regex engine skip ahead, where one alternation tried at every position is 10x slower.
_SUSPECT_NUMBER = re.compile(r"[:,\[]-?(?:[0-9]+[.eE]|[0-9]{16})")
_SUSPECT_TOP = re.compile(r"-?(?:[0-9]+[.eE]|[0-9]{16})")
_ASTRAL = re.compile(r"[\U00010000-\U0010FFFF]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")


def _suspect(text: str) -> bool:
    """True when encoder output may hold what JCS writes differently: a float, an
    integer of 16 digits or more, a supplementary-plane character."""
    return (
        _SUSPECT_NUMBER.search(text) is not None
        or _SUSPECT_TOP.match(text) is not None
        or (not text.isascii() and _ASTRAL.search(text) is not None)
    )


def _astral(names: str) -> bool:
    """True when a string holds a supplementary-plane character (UTF-16 sorts it differently)."""
    return not names.isascii() and _ASTRAL.search(names) is not None


def needs_careful(value: Any) -> bool:
    """Whether a caller-built value holds anything the fast serialiser writes
    differently from RFC 8785 (a float, an integer beyond 15 digits, a
    supplementary-plane member name); refuses non-string member names. The
    answer can be passed to :func:`canonical_bytes` as ``careful`` (with
    ``parsed=True``) for the same value later, sparing a second walk."""
    try:
        return _inspect(value)
    except RecursionError:  # pragma: no cover - _inspect keeps its own stack
        raise IJSONError(_TOO_DEEP) from None


def _inspect(value: Any) -> bool:
    """Walk a caller-built value, a level at a time: refuse non-string member names (the
    C encoder would coerce them) and nesting past :data:`MAX_DEPTH`, and say whether
    anything needs the careful serialiser (a float, an integer beyond 15 digits, a
    supplementary-plane member name)."""
    careful = False
    level = [value]
    depth = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise IJSONError(_TOO_DEEP)
        below: list[Any] = []
        push = below.append
        for v in level:
            if isinstance(v, dict):
                for key, item in v.items():
                    if not isinstance(key, str):
                        raise IJSONError(f"member name {key!r} is not a string")
                    if not careful and _astral(key):
                        careful = True
                    if isinstance(item, (dict, list, tuple)):
                        push(item)
                    elif isinstance(item, float) or (
                        isinstance(item, int) and not -(10**15) < item < 10**15
                    ):
                        careful = True
            elif isinstance(v, (list, tuple)):
                for item in v:
                    if isinstance(item, (dict, list, tuple)):
                        push(item)
                    elif isinstance(item, float) or (
                        isinstance(item, int) and not -(10**15) < item < 10**15
                    ):
                        careful = True
            elif isinstance(v, float) or (isinstance(v, int) and not -(10**15) < v < 10**15):
                careful = True
        level = below
    return careful


def canonical_str(value: Any, *, careful: bool | None = None) -> str:
    """JCS text of ``value``, not yet checked for lone surrogates nor for non-string
    member names (which the C encoder coerces to strings); see :func:`canonical_bytes`.

    ``careful`` says whether the value holds anything the C encoder renders
    differently from JCS (True), nothing of the kind (False), or is unknown
    (None: the output is scanned for it).
    """
    try:
        return _canonical_str(value, careful)
    except RecursionError:
        raise IJSONError(_TOO_DEEP) from None


def _canonical_str(value: Any, careful: bool | None) -> str:
    if careful:
        return canonical_str_reference(value)
    try:
        text = _join(_c_chunks(value, 0))
    except (TypeError, ValueError):
        # NaN/inf, unknown types or odd keys: let the reference serialiser say
        # precisely what is wrong.
        return canonical_str_reference(value)
    if careful is None and _suspect(text):
        return canonical_str_reference(value)
    return text


def canonical_bytes(value: Any, *, parsed: bool = False, careful: bool | None = None) -> bytes:
    """Canonical UTF-8 bytes of ``value``; refuses what I-JSON refuses.

    ``parsed=True`` says the value came from :func:`loads`, so its member
    names are known to be strings; ``careful`` is then the flag
    :func:`loads_flagged` returned for it, when known. A value the caller
    built (``parsed=False``) is walked once to find both.
    """
    if not parsed:
        try:
            careful = _inspect(value)
        except RecursionError:  # pragma: no cover - _inspect keeps its own stack
            raise IJSONError(_TOO_DEEP) from None
    if careful is False:
        # The common case: every entry hashed comes here once or twice. orjson's sorted
        # compact UTF-8 of a value with no float, no integer beyond 15 digits and no
        # supplementary-plane member name is RFC 8785's byte for byte (tested against
        # rfc8785), in one call and in half the time of the standard encoder's text
        # joined and encoded. What it refuses (a lone surrogate, a member name that is
        # no str, nesting past 255 levels, a type it does not know) goes the standard
        # encoder's way below, which renders it or says what is wrong.
        try:
            return _orjson_dumps(value, None, _ORJSON_SORTED)
        except TypeError:  # (orjson.JSONEncodeError is one)
            if parsed:  # (one orjson parsed may nest past the bound: the encoder would recurse)
                _check_value_depth(value)
        try:
            text = _join(_c_chunks(value, 0))
        except (TypeError, ValueError):
            text = canonical_str(value, careful=True)
        except RecursionError:
            raise IJSONError(_TOO_DEEP) from None
    else:
        text = canonical_str(value, careful=careful)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise IJSONError(f"string holds a lone surrogate {json.dumps(bad)}") from None
