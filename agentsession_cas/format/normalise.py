"""Normalising what I-JSON refuses into what it admits, and recording it (RFC 0001
Entry hash: "a writer MUST normalise before it writes").

A model or provider can emit a string cut inside a surrogate pair, bytes that are not
UTF-8, or a 64-bit integer no double holds. The writing discipline says an output is
recorded before it is acted on, so refusing the entry would lose it. RFC 0001's rule:

- a lone surrogate becomes U+FFFD;
- each maximal subpart of an ill-formed UTF-8 sequence becomes one U+FFFD (Python's
  ``errors="replace"`` decoder substitutes exactly so);
- a whole number that fails the test is rounded to binary64 and written canonically;
- each change is recorded in the entry's ``normalised`` member, an array of
  ``{"at": <RFC 6901 pointer into the body>, "was": <the member's JSON source text>}``
  sorted by ``at`` in UTF-16 code units; for bytes that were not UTF-8 there is no
  text, so ``was`` is left out and ``raw`` carries the member's source bytes, quotes
  included, in padded standard base64;
- what no rewrite reaches (a number not finite in binary64, a repeated member name)
  is refused: :class:`~agentsession_cas.errors.NormalisationError`.

Where the payload profile types a member as a string, RFC 0001 carries a too-large
integer's digits as that string instead of rounding; this module does not know the
profile's types, so a harness that has such a member converts it before it calls here.
A member name is never rewritten: a pointer cannot name a member by its old name, so a
name that is not well-formed is refused.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from ..errors import IJSONError, NormalisationError
from .canonical import check_whole_number

__all__ = ["check_normalised", "normalise", "normalise_json", "normalised_body", "pointer"]

_LONE = re.compile(r"[\ud800-\udfff]")
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_WS = b" \t\n\r"
#: An RFC 6901 JSON Pointer: empty, or reference tokens each after a "/", in which "~"
#: is only ever "~0" (a "~") or "~1" (a "/"), as :func:`pointer` writes them.
_POINTER = re.compile(r"(?:/(?:[^/~]|~[01])*)*")


def pointer(parts: list[str]) -> str:
    """An RFC 6901 JSON Pointer from its reference tokens."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


def _sorted(found: list[dict[str, str]]) -> list[dict[str, str]]:
    return sorted(found, key=lambda n: _utf16(n["at"]))


def _base64(text: str) -> bool:
    try:
        return base64.b64encode(base64.b64decode(text, validate=True)).decode("ascii") == text
    except ValueError:
        return False


def check_normalised(value: Any) -> str | None:
    """What is wrong with an entry's ``normalised`` member as RFC 0001 defines it, or
    None: an array of objects, each with ``at`` (an RFC 6901 JSON Pointer: empty, or
    tokens each after a ``/``, a ``~`` only as ``~0`` or ``~1``) and ``was`` (a string) or, without ``was``, ``raw`` (padded standard
    base64), in ascending order of ``at`` as UTF-16 code units. Other members of an
    element are kept as any member is."""
    if not isinstance(value, list):
        return "normalised is not an array"
    last: bytes | None = None
    for i, el in enumerate(value):
        if not isinstance(el, dict):
            return f"normalised[{i}] is not an object"
        at = el.get("at")
        if not isinstance(at, str) or _POINTER.fullmatch(at) is None:
            return f"normalised[{i}].at is not a JSON Pointer"
        if "was" in el:
            if not isinstance(el["was"], str):
                return f"normalised[{i}].was is not a string (the member's JSON source text)"
        elif not isinstance(el.get("raw"), str) or not _base64(el["raw"]):
            return f"normalised[{i}] has neither was nor raw in padded standard base64"
        key = _utf16(at)
        if last is not None and key < last:
            return f"normalised is not sorted by at: {at!r} comes after a later pointer"
        last = key
    return None


def _escaped(text: str) -> str:
    """A string's JSON text with each lone surrogate written as its six-character
    escape, as RFC 0001 records one in ``was``."""
    return _LONE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(text, ensure_ascii=False))


def _number(exact: int | Decimal, at: list[str], spelled: str | None, found: list[dict[str, str]]) -> float | None:
    """A whole number's exact value held to the whole-number rule: None when it passes (the
    number is kept as it is); else rounded to its double, recorded (``was`` its digits:
    ``spelled``, the source text, or for a value held decoded its decimal form), and the
    double returned; a number not finite in binary64 refused, however many digits it has."""
    try:
        check_whole_number(exact, spelled)
        return None
    except IJSONError as exc:
        try:
            as_float = float(exact)
        except OverflowError:  # (an int beyond binary64; a Decimal gives inf)
            as_float = math.inf
        if math.isinf(as_float):
            raise NormalisationError(f"{pointer(at) or '/'}: {exc}; no normalisation can make it I-JSON") from None
        found.append({"at": pointer(at), "was": spelled if spelled is not None else str(exact)})
        return as_float


def normalise(value: Any) -> tuple[Any, list[dict[str, str]]]:
    """A value a writer holds decoded, made I-JSON: every lone surrogate replaced by
    U+FFFD and every whole number no double holds rounded, with the ``normalised``
    records (sorted). The value itself is not changed."""
    found: list[dict[str, str]] = []

    def walk(v: Any, at: list[str]) -> Any:
        if isinstance(v, str):
            if _LONE.search(v):
                found.append({"at": pointer(at), "was": _escaped(v)})
                return _LONE.sub("\ufffd", v)
            return v
        if isinstance(v, bool) or v is None:
            return v
        if isinstance(v, int):
            rounded = _number(v, at, None, found)
            return v if rounded is None else rounded
        if isinstance(v, float):
            if math.isinf(v) or v != v:
                raise NormalisationError(f"{pointer(at) or '/'}: number {v!r} is not finite; no normalisation can make it I-JSON")
            return v
        if isinstance(v, (list, tuple)):
            return [walk(x, [*at, str(i)]) for i, x in enumerate(v)]
        if isinstance(v, Mapping):
            out = {}
            for k, x in v.items():
                if not isinstance(k, str):
                    raise NormalisationError(f"{pointer(at) or '/'}: member name {k!r} is not a string")
                if _LONE.search(k):
                    raise NormalisationError(f"{pointer(at) or '/'}: member name {_escaped(k)} holds a lone surrogate; "
                                             "a pointer cannot record a renamed member")
                out[k] = walk(x, [*at, k])
            return out
        raise NormalisationError(f"{pointer(at) or '/'}: {type(v).__name__} is not a JSON value")

    return walk(value, []), _sorted(found)


class _Scanner:
    """A JSON parser over bytes that keeps each value's source text, for the records."""

    def __init__(self, data: bytes):
        self.d = data
        self.i = 0
        self.found: list[dict[str, str]] = []

    def fail(self, why: str) -> NormalisationError:
        return NormalisationError(f"byte {self.i}: {why}")

    def ws(self) -> None:
        d, i = self.d, self.i
        while i < len(d) and d[i] in _WS:
            i += 1
        self.i = i

    def value(self, at: list[str]) -> Any:
        self.ws()
        if self.i >= len(self.d):
            raise self.fail("the text ends where a value was expected")
        c = self.d[self.i]
        if c == 0x7B:  # {
            return self.obj(at)
        if c == 0x5B:  # [
            return self.arr(at)
        if c == 0x22:  # "
            return self.string(at, member=False)
        for word, val in ((b"true", True), (b"false", False), (b"null", None)):
            if self.d.startswith(word, self.i):
                self.i += len(word)
                return val
        m = _NUMBER.match(self.d, self.i)
        if m is None:
            raise self.fail("not a JSON value (NaN and Infinity are not JSON)")
        self.i = m.end()
        spelled = m.group().decode("ascii")
        exact = Decimal(spelled)  # (any length: int() refuses a literal of more than 4300 digits)
        if any(ch in spelled for ch in ".eE"):
            as_float = float(spelled)
            if math.isinf(as_float):
                raise NormalisationError(f"{pointer(at) or '/'}: number {spelled} is not finite in binary64; "
                                         "no normalisation can make it I-JSON")
            if exact == exact.to_integral_value():
                _number(exact, at, spelled, self.found)
            return as_float
        rounded = _number(exact, at, spelled, self.found)
        return int(spelled) if rounded is None else rounded  # (a number that passes is no longer than a double's)

    def obj(self, at: list[str]) -> dict[str, Any]:
        self.i += 1
        out: dict[str, Any] = {}
        self.ws()
        if self.d[self.i:self.i + 1] == b"}":
            self.i += 1
            return out
        while True:
            self.ws()
            if self.d[self.i:self.i + 1] != b'"':
                raise self.fail("a member name was expected")
            name = self.string(at, member=True)
            if name in out:
                raise NormalisationError(f"{pointer(at) or '/'}: member {name!r} is repeated; no normalisation can "
                                         "make an object with a repeated name I-JSON")
            self.ws()
            if self.d[self.i:self.i + 1] != b":":
                raise self.fail("':' was expected")
            self.i += 1
            out[name] = self.value([*at, name])
            self.ws()
            c = self.d[self.i:self.i + 1]
            self.i += 1
            if c == b"}":
                return out
            if c != b",":
                raise self.fail("',' or '}' was expected")

    def arr(self, at: list[str]) -> list[Any]:
        self.i += 1
        out: list[Any] = []
        self.ws()
        if self.d[self.i:self.i + 1] == b"]":
            self.i += 1
            return out
        while True:
            out.append(self.value([*at, str(len(out))]))
            self.ws()
            c = self.d[self.i:self.i + 1]
            self.i += 1
            if c == b"]":
                return out
            if c != b",":
                raise self.fail("',' or ']' was expected")

    def string(self, at: list[str], *, member: bool) -> str:
        d, start = self.d, self.i
        j = start + 1
        while j < len(d) and d[j] != 0x22:
            j += 2 if d[j] == 0x5C else 1
        if j >= len(d):
            raise self.fail("a string is not closed")
        self.i = j + 1
        raw = d[start:j + 1]
        try:
            source = raw.decode("utf-8")
            ill_formed = False
        except UnicodeDecodeError:
            source = raw.decode("utf-8", errors="replace")  # one U+FFFD per maximal subpart
            ill_formed = True
        try:
            text = json.loads(source)
        except ValueError as exc:
            raise self.fail(f"a string does not parse: {exc}") from None
        lone = bool(_LONE.search(text))
        if member:
            if ill_formed or lone:
                raise NormalisationError(f"{pointer(at) or '/'}: a member name is not well-formed text; "
                                         "a pointer cannot record a renamed member")
            return str(text)
        if ill_formed:
            self.found.append({"at": pointer(at), "raw": base64.b64encode(raw).decode("ascii")})
        elif lone:
            self.found.append({"at": pointer(at), "was": source})
        return _LONE.sub("\ufffd", text) if lone else str(text)


def normalise_json(data: bytes) -> tuple[Any, list[dict[str, str]]]:
    """The JSON text ``data`` (bytes as a model or provider sent them) parsed and made
    I-JSON, with the ``normalised`` records (sorted): ``was`` the member's source text
    as it was written, or ``raw`` its source bytes in base64 when they were not UTF-8."""
    s = _Scanner(data)
    value = s.value([])
    s.ws()
    if s.i != len(data):
        raise s.fail("text follows the value")
    return value, _sorted(s.found)


def normalised_body(body: Mapping[str, Any] | bytes) -> dict[str, Any]:
    """An entry body made I-JSON with its ``normalised`` member written (RFC 0001), for
    a writer to append: a body held decoded (a dict) or as the JSON bytes it arrived
    in. A body that needed nothing comes back without the member. One that carries
    ``normalised`` already is refused: a writer normalises once, before it writes."""
    if isinstance(body, (bytes, bytearray)):
        value, found = normalise_json(bytes(body))
        if not isinstance(value, dict):
            raise NormalisationError("an entry body is a JSON object")
    else:
        value, found = normalise(body)
    if "normalised" in value:
        raise NormalisationError("the body carries normalised already; a writer normalises once, before it writes")
    if found:
        value["normalised"] = found
    return value
