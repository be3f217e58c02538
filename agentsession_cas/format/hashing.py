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
import re
from collections.abc import Mapping
from typing import Any, TypeGuard

from ..errors import AgentSessionError, EntryError
from .canonical import canonical_bytes, loads_flagged

__all__ = [
    "envelope_content",
    "ENVELOPE_MEMBERS",
    "RESERVED_MEMBERS",
    "HASH_PREFIX",
    "is_hash",
    "sha256_ref",
    "ReservedMemberError",
    "body_of",
    "entry_objects_item",
    "content_hash",
    "envelope_hash",
    "entry_hashes",
]

HASH_PREFIX = "sha256:"
ENVELOPE_MEMBERS = frozenset({"id", "type", "parent", "parents", "ts"})
#: Names a body must not carry at top level: the envelope's, and ``content``.
RESERVED_MEMBERS = ENVELOPE_MEMBERS | {"content"}

_HASH = re.compile(r"sha256:[0-9a-f]{64}")


def is_hash(value: object) -> TypeGuard[str]:
    """True for ``sha256:`` followed by exactly 64 lowercase hex digits."""
    return isinstance(value, str) and _HASH.fullmatch(value) is not None


def sha256_ref(data: bytes) -> str:
    """``sha256:<hex>`` of raw bytes (content bodies, envelopes, media blobs)."""
    return HASH_PREFIX + hashlib.sha256(data).hexdigest()


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
    no ``parents``) is written straight in canonical order: ``content``,
    ``parent``, ``ts``, ``type``. Anything else goes through
    :func:`canonical_bytes`; both give the same bytes (tested).
    """
    if not parents and isinstance(ts, str) and content.isascii():
        text = (
            '{"content":"' + content + '","parent":'
            + ("null" if parent is None else _encode_str(parent))
            + ',"ts":' + _encode_str(ts) + ',"type":' + _encode_str(type_) + "}"
        )
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate: let canonical_bytes name it
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


def parse_envelope(data: bytes) -> tuple[dict[str, Any], bool | None]:
    """An envelope object from its canonical bytes, and the parse's careful flag.
    The common form (no ``parents``, plain strings) is read with one regular
    expression; anything else is parsed as JSON. Both give the same dict (tested)."""
    m = FAST_ENVELOPE.fullmatch(data)
    if m is not None:
        parent = m.group(2)
        return (
            {
                "content": m.group(1).decode("ascii"),
                "parent": parent.decode("ascii") if parent is not None else None,
                "ts": m.group(3).decode("ascii"),
                "type": m.group(4).decode("ascii"),
            },
            False,
        )
    return loads_flagged(data)


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
    entry: Mapping[str, Any], *, parsed: bool = False, careful: bool | None = None
) -> tuple[str, str, bytes, bytes, bytes | None]:
    """:func:`entry_objects`, and the canonical bytes of an ``item`` member (None when
    there is none): the request hash of a later response hashes the item again, and
    its bytes are a piece of the content's. The content is then assembled from the
    item's bytes and the other members' (JCS sorts members by name, and this is done
    only when every other name is ASCII and sorts after ``item``), byte for byte the
    canonical form of the whole."""
    type_, parent, parents = _envelope_members(entry)
    body = body_of(entry)
    item = body.get("item")
    item_bytes: bytes | None = None
    if item.__class__ is dict and all(k.__class__ is str and k > "item" and k.isascii() for k in body if k != "item"):
        item_bytes = canonical_bytes(item, parsed=parsed, careful=careful)
        if len(body) == 1:
            content = b'{"item":' + item_bytes + b"}"
        else:
            rest = canonical_bytes({k: v for k, v in body.items() if k != "item"}, parsed=parsed, careful=careful)
            content = b'{"item":' + item_bytes + b"," + rest[1:]
    else:
        content = canonical_bytes(body, parsed=parsed, careful=careful)
    chash = sha256_ref(content)
    envelope = envelope_bytes(type_, parent, parents, entry.get("ts"), chash)
    return sha256_ref(envelope), chash, content, envelope, item_bytes
