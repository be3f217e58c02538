"""Entry hashing (RFC 0001 "Entry hash"): a content hash over the body, an id over the envelope.

An entry hashes in two layers, as a git commit over its tree: the **content**
is every member but ``id``, ``type``, ``parent``, ``parents`` and ``ts``; the
**id** is the hash of the envelope object ``{type, parent, parents (only
when non-empty), ts, content: <content hash>}``. Both are ``sha256:`` plus 64
lowercase hex digits over canonical JSON bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import orjson

from ..errors import AgentSessionError, EntryError
from .canonical import canonical_bytes, loads_flagged, member_order, needs_careful

__all__ = [
    "envelope_content",
    "ENVELOPE_MEMBERS",
    "RESERVED_MEMBERS",
    "HASH_PREFIX",
    "raw_hash",
    "is_hash",
    "all_hashes",
    "sha256_ref",
    "ReservedMemberError",
    "body_of",
    "entry_objects_item",
    "content_hash",
    "envelope_hash",
    "entry_hashes",
    "line_from_objects",
    "line_size",
    "lines_from_objects",
    "lines_of_bytes",
    "stored_item_bytes",
    "read_envelope",
    "common_envelopes",
]

HASH_PREFIX = "sha256:"
ENVELOPE_MEMBERS = frozenset({"id", "type", "parent", "parents", "ts"})
#: Names a body must not carry at top level: the envelope's, and ``content``.
RESERVED_MEMBERS = ENVELOPE_MEMBERS | {"content"}

_HASH = re.compile(r"sha256:[0-9a-f]{64}")


def is_hash(value: object) -> TypeGuard[str]:
    """True for ``sha256:`` followed by exactly 64 lowercase hex digits."""
    return isinstance(value, str) and _HASH.fullmatch(value) is not None


def all_hashes(names: Sequence[str]) -> bool:
    """:func:`is_hash` of every one of ``names`` (strings), tested over them all at once,
    for a reader of many (a bulk read of objects, a listing's short ids): their text
    joined is 71 characters a name, the prefix stands at the start of each (a slice a
    character of it), and with the hex digits deleted only the prefix's other characters
    are left, a copy a name. A seventh of a regular expression's time over them."""
    text, n = "".join(names), len(names)
    if len(text) != 71 * n or not text.isascii():
        return False
    for at, char in enumerate(HASH_PREFIX):
        if text[at::71] != char * n:
            return False
    return text.encode("ascii").translate(None, _HEX_DIGITS) == _PREFIX_LEFT * n


_HEX_DIGITS = b"0123456789abcdef"
#: What the prefix leaves once the hex digits are deleted from it.
_PREFIX_LEFT = HASH_PREFIX.encode("ascii").translate(None, _HEX_DIGITS)


def sha256_ref(data: bytes) -> str:
    """``sha256:<hex>`` of raw bytes (content bodies, envelopes, media blobs)."""
    return HASH_PREFIX + _sha256(data).hexdigest()


_sha256 = hashlib.sha256


class ReservedMemberError(EntryError):
    """A body carrying a top-level member by a name the envelope reserves."""


def body_of(entry: Mapping[str, Any], *, allow_reserved: bool = False) -> dict[str, Any]:
    """The content of an entry: every member outside the envelope.

    Raises :class:`EntryError` when the body carries ``content``, which the
    format reserves (the other reserved names are the envelope's own and so
    never reach the body). ``allow_reserved`` is for migrating a file from
    before 0.5, which could carry it and is reported as unresolved instead.
    """
    if "content" in entry and not allow_reserved:
        raise ReservedMemberError("body carries the reserved member 'content'")
    return {k: v for k, v in entry.items() if k not in ENVELOPE_MEMBERS}


def content_hash(body: Mapping[str, Any], *, parsed: bool = False, careful: bool | None = None) -> str:
    """Hash of a body's canonical bytes. ``parsed``/``careful`` as in :func:`canonical_bytes`."""
    return sha256_ref(canonical_bytes(body, parsed=parsed, careful=careful))


def envelope_object(
    type_: str, parent: str | None, parents: list | None, ts: str, content: str
) -> dict[str, Any]:
    """The object an id is the hash of; ``parents`` is left out when empty."""
    env: dict[str, Any] = {"type": type_, "parent": parent, "ts": ts, "content": content}
    if parents:
        env["parents"] = parents
    return env


_encode_str = json.encoder.encode_basestring


def envelope_bytes(
    type_: str, parent: str | None, parents: list | None, ts: Any, content: str
) -> bytes:
    """The canonical bytes of an envelope (what an entry id is the hash of).

    The envelope's members are few and fixed, so the common case (strings,
    no ``parents``) is an object built in canonical order (``content``,
    ``parent``, ``ts``, ``type``) written by ``orjson`` unsorted: what
    :func:`canonical_bytes` writes for a value with no float nor large integer,
    in one call and without the sort. Anything else goes through
    :func:`canonical_bytes`; both give the same bytes (tested).
    """
    if not parents and ts.__class__ is str:
        try:
            return _orjson_dumps({"content": content, "parent": parent, "ts": ts, "type": type_})
        except TypeError:  # (orjson.JSONEncodeError is one) a lone surrogate: let canonical_bytes name it
            pass
    return canonical_bytes(envelope_object(type_, parent, parents, ts, content))


def envelope_hash(
    type_: str, parent: str | None, parents: list | None, ts: Any, content: str
) -> str:
    """The entry id over its envelope."""
    return sha256_ref(envelope_bytes(type_, parent, parents, ts, content))


def entry_hashes(
    entry: Mapping[str, Any],
    *,
    parsed: bool = False,
    careful: bool | None = None,
    allow_reserved: bool = False,
) -> tuple[str, str]:
    """Compute ``(id, content hash)`` of an entry from its own members.

    Checks only what hashing needs (types of the envelope members, the
    reserved name); the ``ts`` spelling and the parent rules are the
    reader's business.
    """
    if "ts" not in entry:
        raise EntryError("entry has no 'ts'")
    type_, parent, parents = _envelope_members(entry)
    chash = content_hash(body_of(entry, allow_reserved=allow_reserved), parsed=parsed, careful=careful)
    return envelope_hash(type_, parent, parents, entry["ts"], chash), chash


def _envelope_members(entry: Mapping[str, Any]) -> tuple[str, str | None, list | None]:
    """``type``, ``parent`` and ``parents``, checked for the types hashing needs."""
    type_ = entry.get("type")
    if not isinstance(type_, str) or not type_:
        raise EntryError("entry has no string 'type'")
    parent = entry.get("parent")
    if parent is not None and not isinstance(parent, str):
        raise EntryError("entry 'parent' is neither a string nor null")
    parents = entry.get("parents")
    if parents is not None and not isinstance(parents, list):
        raise EntryError("entry 'parents' is not an array")
    return type_, parent, parents


#: The common form of an envelope's canonical bytes (no ``parents``, plain strings):
#: read by one match here, and stored compactly by packs (see packs.py).
FAST_ENVELOPE = re.compile(
    rb'\{"content":"(sha256:[0-9a-f]{64})","parent":(?:null|"(sha256:[0-9a-f]{64})"),'
    rb'"ts":"([0-9TZ:.\-]+)","type":"([A-Za-z0-9_:.\-]+)"\}'
)


def _fast_envelope(data: bytes) -> dict[str, Any] | None:
    """The envelope of the common form read by one match, or None for any other bytes."""
    m = FAST_ENVELOPE.fullmatch(data)
    return None if m is None else _matched_envelope(m)


def _matched_envelope(m: re.Match[bytes]) -> dict[str, Any]:
    parent = m.group(2)
    return {
        "content": m.group(1).decode("ascii"),
        "parent": parent.decode("ascii") if parent is not None else None,
        "ts": m.group(3).decode("ascii"),
        "type": m.group(4).decode("ascii"),
    }


def parse_envelope(data: bytes) -> tuple[dict[str, Any], bool | None]:
    """An envelope object from its canonical bytes, and the parse's careful flag.
    The common form (no ``parents``, plain strings) is read with one regular
    expression; anything else is parsed as JSON. Both give the same dict (tested)."""
    env = _fast_envelope(data)
    return (env, False) if env is not None else loads_flagged(data)


def checked_envelope(data: bytes) -> tuple[Any, bool | None, str | None]:
    """:func:`parse_envelope`, and why the object is no envelope (:func:`envelope_defect`)
    or None. One of the common form is an envelope by its match alone (the expression
    admits exactly the members, hashes and strings the rule asks for), so the rule's
    walk is taken for the others only."""
    env = _fast_envelope(data)
    if env is not None:
        return env, False, None
    obj, careful = loads_flagged(data)
    return obj, careful, envelope_defect(obj)


#: Where the members after ``content`` begin in an envelope of the common form.
_AFTER_CONTENT = len(b'{"content":"sha256:",') + 64


def read_envelope(data: bytes) -> tuple[Any, bool | None, str | None, bytes | None]:
    """:func:`checked_envelope`, and for an envelope of the common form the canonical
    bytes of its members but ``content`` (``"parent":…,"ts":…,"type":…``, in order):
    a line is made of them as they are (:func:`line_from_objects`), with no encoding."""
    m = FAST_ENVELOPE.fullmatch(data)
    if m is not None:
        return _matched_envelope(m), False, None, data[_AFTER_CONTENT:-1]
    obj, careful = loads_flagged(data)
    return obj, careful, envelope_defect(obj), None


#: :data:`FAST_ENVELOPE` as text, matched one envelope a line, each a whole line.
_COMMON_LINES = re.compile("(?m)^" + FAST_ENVELOPE.pattern.decode("ascii") + "\n")


def common_envelopes(datas: Sequence[bytes]) -> list[tuple[str, str, str, str]] | None:
    """The members of each envelope of ``datas`` as :func:`read_envelope` reads one of the
    common form (``content``, ``parent`` or ``""`` for null, ``ts``, ``type``), when every
    one is of that form: one match over them all (a reader of many, a listing's outline,
    spares a match and a dict an envelope). None when any is of another form (a merge's,
    with ``parents``), which the caller then reads one by one."""
    try:
        text = b"\n".join(datas).decode("ascii") + "\n"
    except UnicodeDecodeError:
        return None
    found = _COMMON_LINES.findall(text)
    # n whole-line matches over n lines (no canonical envelope holds a line break): each one is
    return found if len(found) == len(datas) == text.count("\n") else None


_CONTENT_FIRST = b'{"content":"'


def envelope_content(data: bytes) -> str | None:
    """The content hash an envelope's bytes name, or None when they are no envelope: the
    one place a reader of objects finds it (a sweep, recovery, fsck, exchange). In
    canonical form it is the first member, so most envelopes need no parse at all."""
    if data.startswith(_CONTENT_FIRST) and data[83:84] == b'"':
        name = data[12:83].decode("ascii", "replace")
        if is_hash(name):
            return name
    try:
        env = loads_flagged(data)[0]
    except (ValueError, AgentSessionError):
        return None
    c = env.get("content") if isinstance(env, dict) else None
    return c if isinstance(c, str) and is_hash(c) else None


def entry_objects(
    entry: Mapping[str, Any], *, parsed: bool = False, careful: bool | None = None
) -> tuple[str, str, bytes, bytes]:
    """``(id, content hash, content bytes, envelope bytes)`` of an entry: what a store
    writes as its two objects, computed once. ``parsed``/``careful`` as in
    :func:`canonical_bytes` (``parsed=True``: the member names are known strings)."""
    entry_id, chash, content, envelope, _ = entry_objects_item(entry, parsed=parsed, careful=careful)
    return entry_id, chash, content, envelope


def entry_objects_item(
    entry: Mapping[str, Any], *, parsed: bool = False, careful: bool | None = None, line: bytes | None = None
) -> tuple[str, str, bytes, bytes, bytes | None]:
    """:func:`entry_objects`, and the canonical bytes of an ``item`` member (None when
    there is none): the request hash of a later response hashes the item again, and
    its bytes are a piece of the content's. The content is then assembled from the
    item's bytes and the other members' (JCS sorts members by name, and this is done
    only when every other name is ASCII and sorts after ``item``), byte for byte the
    canonical form of the whole. ``line``: the entry's own line when it is proven the
    entry's canonical form (``canonical.loads_canonical``, which parsed ``entry`` from
    it): the content is made of its members as they stand there (:func:`_content_of_line`)."""
    type_, parent, parents = _envelope_members(entry)
    if line is not None and "content" not in entry:  # (a body carrying it is refused below)
        content, item_bytes = _content_of_line(entry, line)
    else:
        body = body_of(entry)
        item = body.get("item")
        item_bytes = None
        splice = item.__class__ is dict
        if splice:
            for k in body:  # a loop, not all() over a generator: this runs once an entry
                if k != "item" and not (k.__class__ is str and k > "item" and k.isascii()):
                    splice = False
                    break
        if splice:
            item_bytes = canonical_bytes(item, parsed=parsed, careful=careful)
            if len(body) == 1:
                content = b'{"item":' + item_bytes + b"}"
            else:
                del body["item"]  # the body is this call's own copy: what remains is the rest
                content = b'{"item":' + item_bytes + b"," + canonical_bytes(body, parsed=parsed, careful=careful)[1:]
        else:
            content = canonical_bytes(body, parsed=parsed, careful=careful)
    chash = HASH_PREFIX + _sha256(content).hexdigest()  # (sha256_ref's, written out: twice an entry)
    envelope = envelope_bytes(type_, parent, parents, entry.get("ts"), chash)
    return HASH_PREFIX + _sha256(envelope).hexdigest(), chash, content, envelope, item_bytes


def _content_of_line(entry: Mapping[str, Any], line: bytes) -> tuple[bytes, bytes | None]:
    """The content's canonical bytes and an object ``item``'s, from ``line``, the proven
    canonical form of ``entry`` (its members in the line's order, which is canonical, and
    none needing the careful serialiser): the content is the line's members less the
    envelope's, in the same order, so it is canonical too; an ``item`` object's bytes are
    cut from the line, the members before and after it encoded only to be measured (a
    member's bytes are the same wherever it stands), and only the small members around it
    are encoded for the content."""
    members = iter(entry.items())
    before: dict[str, Any] = {}
    for k, v in members:
        if k == "item" and v.__class__ is dict:
            break
        before[k] = v
    else:  # no item object: the body encoded whole
        return _orjson_dumps({k: v for k, v in before.items() if k not in ENVELOPE_MEMBERS}), None
    after = dict(members)
    # ``{<before>,"item":`` and ``,<after>}``: each as long as its members' own encoding
    item_bytes = line[(len(_orjson_dumps(before)) if before else 1) + 7 : len(line) - (len(_orjson_dumps(after)) if after else 1)]
    head = [k for k in before if k not in ENVELOPE_MEMBERS]
    tail = [k for k in after if k not in ENVELOPE_MEMBERS]
    return b"".join((
        _orjson_dumps({k: before[k] for k in head})[:-1] + b"," if head else b"{",
        b'"item":',
        item_bytes,
        b"," + _orjson_dumps({k: after[k] for k in tail})[1:] if tail else b"}",
    )), item_bytes


_orjson_dumps = orjson.dumps


#: The member a line is spliced around when the content holds it (see
#: :func:`line_from_objects`): an ``item`` is most of an entry's bytes.
_SPLICE_MEMBER = "item"


#: What an envelope holds (RFC 0001, "The two hashes"): these, and ``parents`` when not empty.
_ENVELOPE_NEEDS = frozenset({"content", "parent", "ts", "type"})


def envelope_defect(env: Any) -> str | None:
    """Why a parsed object is no envelope the two hashes could have made, or None: the
    members exactly ``content`` (a hash), ``parent`` (a hash or null), ``ts`` and ``type``
    (strings), and ``parents`` only as a non-empty list. An object whose bytes hash to
    its name but that fails this is damaged (a flipped member name, say), never an entry."""
    if not isinstance(env, dict):
        return "not a JSON object"
    missing = _ENVELOPE_NEEDS - env.keys()
    if missing:
        return f"it lacks {', '.join(sorted(missing))}"
    extra = env.keys() - _ENVELOPE_NEEDS - {"parents"}
    if extra:
        return f"it holds {', '.join(sorted(extra))}, which no envelope holds"
    if not is_hash(env["content"]) or not (env["parent"] is None or is_hash(env["parent"])):
        return "its content or parent is not an entry hash"
    if not isinstance(env["ts"], str) or not isinstance(env["type"], str):
        return "its ts or type is not a string"
    if "parents" in env and not (isinstance(env["parents"], list) and env["parents"]):
        return "its parents is not a non-empty list"
    return None


def line_from_objects(entry_id: str, env: Mapping[str, Any], content: bytes, members: bytes | None = None) -> bytes:
    """The canonical line (LF included) of the entry an envelope (parsed) and its content
    object's bytes make: the content's members, the envelope's less ``content``, and
    ``id``, in canonical order. Byte for byte what ``Entry.canonical_line`` gives for the
    entry rebuilt from the same objects, without encoding the body again: the stored
    content is canonical, so where it holds an ``item`` the member's bytes are copied
    as they are and only the members around it (small) are encoded with the envelope's.
    Anything else is parsed strictly and encoded whole, as a rebuilt entry would be.

    ``members``, when given, are the envelope's members but ``content`` as
    :func:`read_envelope` cuts them from an envelope of the common form: an item entry
    is then made of the two objects' bytes, nothing encoded but its other members."""
    if members is not None:
        line = _line_of_bytes(entry_id, content, members, _UNPARSED)
        if line is not None:
            return line
    return _line_from_parsed(entry_id, env, content)


def line_size(entry_id: str, content_size: int, members: bytes) -> int:
    """The length of the line :func:`line_from_objects` makes of a stored (canonical)
    content of ``content_size`` bytes and an envelope of the common form (``members``:
    its members but ``content``, as :func:`read_envelope` cuts them), without the
    content's bytes: the line holds the content's members, the envelope's and ``id``,
    each as its bytes are (the order alone differs), a comma between each two, braces
    and the LF around them. For a reader that sums lines over a whole store (``stats``)."""
    inner = content_size - 2  # the content's members and the commas between them
    id_member = len('"id":"') + len(entry_id) + 1
    return 1 + id_member + 1 + len(members) + (inner + 1 if inner > 0 else 0) + 2


def lines_from_objects(entries: Sequence[tuple[str, Mapping[str, Any], bytes, bytes | None]]) -> list[bytes]:
    """:func:`line_from_objects` of each ``(id, envelope, content, members)``, the
    contents parsed in one call (a projection reads a chunk of entries at a time; one
    parse of many values costs much less than as many parses)."""
    names = _names_each([content for _, _, content, _ in entries])
    out = []
    for (entry_id, env, content, members), these in zip(entries, names):
        line = _line_of_bytes(entry_id, content, members, these) if members is not None else None
        out.append(line if line is not None else _line_from_parsed(entry_id, env, content))
    return out


def lines_of_bytes(entries: Sequence[tuple[str, bytes, bytes]]) -> list[tuple[bytes | None, Any]]:
    """The line of each ``(id, content, members)`` as :func:`lines_from_objects` makes it
    of the objects' bytes alone (``members``: an envelope of the common form's, as
    :func:`read_envelope` cuts them), or None where the bytes alone do not make it (a
    content that is no JSON object, a member name not plain), nothing encoded; and the
    content as the one parse of them all read it (:func:`_parsed_each`: not the strict
    parse, its numbers perhaps not exact), or None. For objects another store sent (a
    push's receiver): what such a line holds is for the caller to check."""
    parsed = _parsed_each([content for _, content, _ in entries])
    out: list[tuple[bytes | None, Any]] = []
    for (entry_id, content, members), value in zip(entries, parsed):
        names = _UNPARSED if value is _UNPARSED else tuple(value) if value.__class__ is dict else None
        out.append((_line_of_bytes(entry_id, content, members, names), value if value.__class__ is dict else None))
    return out


#: A separator no stored value can forge: a string drawn at random once per process.
_NONCE = os.urandom(16).hex()
_SEPARATOR = b',"' + _NONCE.encode("ascii") + b'",'
_UNPARSED = object()


def _names_each(texts: Sequence[bytes]) -> list[Any]:
    """The top-level member names of each JSON text (a tuple, or None for a text that is
    no object), from :func:`_parsed_each`, or :data:`_UNPARSED`."""
    return [v if v is _UNPARSED else tuple(v) if v.__class__ is dict else None for v in _parsed_each(texts)]


def _parsed_each(texts: Sequence[bytes]) -> list[Any]:
    """Each JSON text parsed, as one array parsed in one call (:func:`_loads_names_only`):
    the texts joined by a string no text can know, so a text that is not one whole value
    (``1,2``, or one that opens what the next closes) shows as a separator out of place,
    and then each is left unparsed (:data:`_UNPARSED`) for the caller's own parse, which
    names the fault."""
    n = len(texts)
    if n:
        got = _loads_names_only(b"[" + _SEPARATOR.join(texts) + b"]")
        if got.__class__ is list and len(got) == 2 * n - 1 and got[1::2].count(_NONCE) == n - 1:
            return got[::2]
    return [_UNPARSED] * n


def _names(text: bytes) -> tuple[str, ...] | None:
    """:func:`_names_each` of one text, or None for a text that is no object or no JSON."""
    value = _loads_names_only(text)
    return tuple(value) if value.__class__ is dict else None


def _loads_names_only(text: bytes) -> Any:
    """A JSON text parsed for its objects' member names only (None when it is no JSON):
    by ``orjson`` (about 2.5 times ``json.loads``'s speed on contents, the largest cost
    of an export), ``json.loads`` taking over where it refuses what the standard parser
    admits (a lone surrogate, ``NaN``). Where ``orjson`` admits a text, ``json.loads``
    admits it too and finds the same names (tests/test_hashing.py holds the two to it);
    its values may differ (a number beyond 64 bits is read as a float)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            return json.loads(text)
        except ValueError:
            return None


#: Member names a line is cut at by a search for ``,"name":``: with no character JSON
#: gives a meaning to, that pattern is a member of that name (at some depth) and
#: nothing else, so where it occurs once it is the top-level member.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_]+")
#: The members a line adds to its content's, in their (canonical) order.
_LINE_NAMES = ("id", "parent", "ts", "type")
#: Where a content's members (by their names, in order) are cut to put the line's in:
#: [(cut, lo, hi)], ``_LINE_NAMES[lo:hi]`` going in at each cut, a cut being b"" (before
#: the first member), None (after the last) or the ``,"name":`` that begins a member.
#: None for a content whose names cannot be cut at. Contents share a few shapes: kept
#: for the first few hundred.
_CUTS: dict[tuple[str, ...], list[tuple[bytes | None, int, int]] | None] = {}
_CUTS_KEPT = 512


def _cuts(names: tuple[str, ...]) -> list[tuple[bytes | None, int, int]] | None:
    """Where a content of these member names is cut: [(cut, lo, hi)], the line's members
    ``_LINE_NAMES[lo:hi]`` going in at each cut, in order."""
    plan: list[tuple[bytes | None, int, int]] = []
    at = 0
    for i, name in enumerate(_LINE_NAMES):
        # every content member that sorts before ``name`` stays before it (ASCII names
        # order alike by code point and by UTF-16 unit, JCS's order)
        while at < len(names) and names[at] < name:
            at += 1
        if at == len(names):
            cut: bytes | None = None
        elif at == 0:
            cut = b""
        elif _PLAIN_NAME.fullmatch(names[at]) is None:
            return None
        else:
            cut = b',"' + names[at].encode("ascii") + b'":'
        if plan and plan[-1][0] == cut:
            plan[-1] = (cut, plan[-1][1], i + 1)
        else:
            plan.append((cut, i, i + 1))
    return plan


def _line_of_bytes(entry_id: str, content: bytes, envelope: bytes, names: Any) -> bytes | None:
    """The line of an entry from its content's bytes and its envelope's members' bytes
    (``"parent":…,"ts":…,"type":…``, an envelope of the common form), nothing encoded:
    the content's top-level member names (``names``, from :func:`_names_each`: a tuple,
    None for no object, or :data:`_UNPARSED`) say where each of the line's members goes, before the first
    content member that sorts after it, found by its ``,"name":`` where that occurs
    once in the content; the envelope's members that go in together are copied as one
    piece. None when a name is not plain or occurs more than once (the caller encodes
    around the parse instead)."""
    if names is _UNPARSED:
        names = _names(content)
    if names is None:
        return None
    if names in _CUTS:
        plan = _CUTS[names]
    else:
        plan = _cuts(names)
        if len(_CUTS) < _CUTS_KEPT:
            _CUTS[names] = plan
    if plan is None:
        return None
    inner = content[1:-1]
    pieces = []
    at = 0  # where in ``inner`` the members not yet copied begin
    ts = type_ = -1  # where the envelope's ts and type begin, found when a cut falls between
    for cut_at, lo, hi in plan:
        if cut_at is None:
            cut = len(inner)
        elif not cut_at:
            cut = 0
        else:
            cut = inner.find(cut_at)
            if cut < at or inner.find(cut_at, cut + 1) >= 0:
                return None  # the name occurs more than once, or out of order: not for a cut
        if cut > at:
            pieces.append(inner[at:cut])
            at = cut + 1 if cut < len(inner) else cut  # past the comma before the member
        if lo == 0:
            pieces.append(b'"id":"' + entry_id.encode("ascii") + b'"')
            lo = 1
        if lo == hi:
            continue
        if lo == 1 and hi == 4:
            pieces.append(envelope)  # parent, ts and type together: the envelope's bytes as they are
            continue
        if ts < 0:
            ts = envelope.find(b',"ts":"')
            type_ = envelope.find(b',"type":"', ts)
            if ts < 0 or type_ < 0:
                return None
        bounds = (0, 0, ts + 1, type_ + 1, len(envelope) + 1)
        pieces.append(envelope[bounds[lo] : bounds[hi] - 1])
    if at < len(inner):
        pieces.append(inner[at:])
    return b"{" + b",".join(pieces) + b"}\n"


def _line_from_parsed(entry_id: str, env: Mapping[str, Any], content: bytes) -> bytes:
    members: dict[str, Any] = {"id": entry_id, "parent": env.get("parent"), "ts": env.get("ts"), "type": env.get("type")}
    parents = env.get("parents")
    if parents:
        members["parents"] = parents
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if body.__class__ is dict and _SPLICE_MEMBER in body:
        line = _after_item(members, body, content) or _spliced(members, body, content, _SPLICE_MEMBER)
        if line is not None:
            return line
    if body.__class__ is not dict:
        body, careful = loads_flagged(content)  # the strict parse names what is wrong
        if not isinstance(body, dict):
            raise EntryError("the content object is not a JSON object")
    else:
        careful = needs_careful(body)  # the content is stored canonical: its plain parse re-encodes to it
    plain = all(v is None or v.__class__ is str for v in members.values())
    body.update(members)
    # the envelope's members are strings or null in the common form; anything else is scanned for
    return canonical_bytes(body, parsed=True, careful=True if careful else (False if plain else None)) + b"\n"


def line_members(entry_id: str, env: Mapping[str, Any], content: bytes) -> tuple[dict[str, Any], bool | None, bytes | None]:
    """What parsing the line :func:`line_from_objects` makes gives (the members in the
    line's order, the parse's careful flag or None when not known), with the content
    parsed once and no line made: for a reader of entries, not of bytes (a listing);
    and the canonical bytes of the content's ``item`` when it holds one, cut from the
    stored bytes (:func:`stored_item_bytes`), else None (and when the flag is known).
    The envelope's members are ASCII-named strings, null or ``parents``' plain
    objects, which raise no careful flag.
    A content with a member name outside ASCII (where JCS's order is not ``sorted``'s)
    is read through its line.

    ``env`` may hold only some of the envelope's members (a listing's outline keeps no
    ``ts``): the entry then holds those."""
    body, careful = _parse_stored(content)
    if body.__class__ is not dict:
        raise EntryError("the content object is not a JSON object")
    names = tuple(body)
    parents = env.get("parents")
    if names in _ITEM_NAMES and not parents:  # most of a session's entries: the line's order written out
        data = {"id": entry_id, "item": body["item"], "parent": env.get("parent")}
        # the bytes are cut only when the parse proved them compact (the store holds
        # canonical contents: their hash names their canonical form)
        item = None
        if careful is None:
            item = content[8:-1] if len(names) == 1 else _item_before_response(content, body["response"])
        if len(names) == 2:
            data["response"] = body["response"]
        if "ts" in env:
            data["ts"] = env["ts"]
        data["type"] = env.get("type")
        return data, careful, item
    if not "".join(names).isascii():
        data, careful = loads_flagged(line_from_objects(entry_id, env, content))
        if "ts" not in env:
            del data["ts"]
        return data, careful, None
    item = stored_item_bytes(content, names) if careful is None else None
    body["id"] = entry_id
    body["parent"] = env.get("parent")
    if parents:
        body["parents"] = parents
    if "ts" in env:
        body["ts"] = env["ts"]
    body["type"] = env.get("type")
    return dict(sorted(body.items())), careful, item


#: An item entry's content member names, alone or with the response that returned it.
_ITEM_NAMES = (("item",), ("item", "response"))
_RESPONSE_MEMBER = b',"response":'


def _item_before_response(content: bytes, response: Any) -> bytes | None:
    """:func:`stored_item_bytes` of a compact content of members ``item`` then ``response``:
    a string ``response`` holds no ``,"response":`` (its quotes are escaped), so the last
    one begins the member, found from the end rather than by a search of the item; any
    other value, as :func:`stored_item_bytes` cuts it."""
    if response.__class__ is not str:
        return stored_item_bytes(content, _ITEM_NAMES[1])
    return content[8 : content.rfind(_RESPONSE_MEMBER)]


def _parse_stored(content: bytes) -> tuple[Any, bool | None]:
    """A stored content parsed: ``orjson``'s value when encoding it again (compact, its
    members in the order read) gives the bytes back, which proves it what the strict parse
    gives (no member named twice, no number read otherwise: a number beyond 64 bits, read
    as a float, is written otherwise), with the careful flag unknown (None: a later
    encoding scans); anything else the strict parse's value and flag
    (:func:`loads_flagged`, which names a fault). Sorting the members as it encodes
    would prove no more of the value (a third of the time of the whole on the
    benchmark's contents); that the bytes are canonical, the store holds to (a content
    is named by its canonical form's hash; ``verify ID`` checks it). About half the
    strict parse's time on the benchmark's contents."""
    try:
        value = orjson.loads(content)
        if value.__class__ is dict and orjson.dumps(value) == content:
            return value, None
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):  # what it refuses (nesting past 255 levels to encode)
        pass
    return loads_flagged(content)


def stored_item_bytes(content: bytes, names: Sequence[str]) -> bytes | None:
    """The bytes of the ``item`` member of a stored (canonical) content whose top-level
    member names are ``names`` (in order), or None when it holds none or the member after
    it is not found once by its ``,"name":``: an item's canonical bytes (a stored
    content is canonical: its hash names its canonical form), for the context and
    request hashes, without encoding it again."""
    if not names or names[0] != _SPLICE_MEMBER:
        return None
    if len(names) == 1:
        return content[8:-1]
    after = names[1]
    if _PLAIN_NAME.fullmatch(after) is None:
        return None
    cut_at = b',"' + after.encode("ascii") + b'":'
    cut = content.find(cut_at, 8)
    if cut < 0 or content.find(cut_at, cut + 1) >= 0:
        return None
    return content[8:cut]


def _spliced(members: dict[str, Any], body: dict[str, Any], content: bytes, name: str) -> bytes | None:
    """The line built around member ``name`` of the canonical ``content`` (parsed as
    ``body``, in the content's order, which is canonical): the members before and after
    it are encoded (with the envelope's on their side of it) and the member's own bytes
    copied. None when the content's bytes are not what its parse re-encodes to, which
    a stored (canonical) content always is; the caller then encodes it whole."""
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    side = before
    for k, v in body.items():
        if k == name:
            side = after
        else:
            side[k] = v
    # The members around it are few and small: one walk says how to encode them.
    careful: bool | None = needs_careful(before) or needs_careful(after)
    if not careful and not all(v is None or v.__class__ is str for v in members.values()):
        careful = None  # an envelope of an uncommon form: the encoder's output is scanned
    # where the member's bytes begin and end: after "{" or "{<before>,", before "}" or ",<after>}"
    head = canonical_bytes(before, parsed=True, careful=careful)[:-1] + b"," if before else b"{"
    tail = b"," + canonical_bytes(after, parsed=True, careful=careful)[1:] if after else b"}"
    end = len(content) - len(tail)
    key = _MEMBER_KEYS.get(name) or (_encode_str(name) + ":").encode("utf-8")
    if not (content.startswith(head) and content.endswith(tail) and content.startswith(key, len(head)) and end > len(head) + len(key)):
        return None
    pivot = member_order(name)
    for k, v in members.items():
        (before if member_order(k) < pivot else after)[k] = v
    return b"".join((
        canonical_bytes(before, parsed=True, careful=careful)[:-1] + b"," if before else b"{",
        content[len(head):end],
        b"," + canonical_bytes(after, parsed=True, careful=careful)[1:] if after else b"}",
        b"\n",
    ))


def _after_item(members: dict[str, Any], body: dict[str, Any], content: bytes) -> bytes | None:
    """:func:`_spliced` for the common item entry, written out: ``item`` is the body's
    first member, every other one (a ``response`` id, say) and every envelope member but
    ``id`` a string (or a null parent) named in ASCII after ``item``; None otherwise."""
    first = True
    rest: list[tuple[str, str]] = []
    for k, v in body.items():
        if first:
            if k != _SPLICE_MEMBER:
                return None
            first = False
        elif v.__class__ is str and k.isascii() and k > _SPLICE_MEMBER:
            rest.append((k, v))
        else:
            return None
    if rest:
        tail = ("," + ",".join([_encode_str(k) + ":" + _encode_str(v) for k, v in rest]) + "}").encode("utf-8")
        if not content.endswith(tail):
            return None
    else:
        tail = b"}"
    for k, v in members.items():
        if k == "id":
            continue
        if v is None and k == "parent":
            rest.append((k, None))  # type: ignore[arg-type]
        elif v.__class__ is str:
            rest.append((k, v))
        else:
            return None
    rest.sort()  # ASCII names after "item": code point order is JCS's
    out = ",".join([_encode_str(k) + ":" + ("null" if v is None else _encode_str(v)) for k, v in rest])
    try:
        spliced = out.encode("utf-8")
        entry_id = _encode_str(members["id"]).encode("utf-8")
    except UnicodeEncodeError:
        return None  # a lone surrogate: the whole encoding names it
    return b"".join((b'{"id":', entry_id, b",", content[1 : len(content) - len(tail)], b",", spliced, b"}\n"))


_MEMBER_KEYS = {_SPLICE_MEMBER: b'"' + _SPLICE_MEMBER.encode("ascii") + b'":'}


def raw_hash(name: str) -> bytes | None:
    """The 32 bytes of a ``sha256:<hex>`` name, or None when it is not one."""
    if len(name) != 71 or not name.startswith(HASH_PREFIX):
        return None
    digits = name[7:]
    try:
        raw = bytes.fromhex(digits)
    except ValueError:
        return None
    # fromhex takes upper case and skips spaces: only 64 lowercase digits spell the name.
    return raw if raw.hex() == digits else None
