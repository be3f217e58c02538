"""Names that become paths or keys: session ids and ref names (RFC 0002's rules on names),
checked before any path is built from them."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..errors import BadNameError, BadRefNameError, RefConflictError

__all__ = ["check_session_id", "is_session_id", "MAX_SESSION_ID", "MAX_REF_NAME", "check_ref_name", "check_ref_prefix", "check_ref_conflict"]

MAX_SESSION_ID = 200
_SESSION_ID = re.compile(r"[A-Za-z0-9._-]+")
#: The longest ref name, in bytes (names are ASCII, so also in characters).
MAX_REF_NAME = 200
_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_PREFIX = re.compile(r"[A-Za-z0-9._/-]*")
#: Names Windows gives to devices in every directory, with or without an extension.
_DEVICES = frozenset(
    ["CON", "PRN", "AUX", "NUL"] + [f"COM{i}" for i in range(1, 10)] + [f"LPT{i}" for i in range(1, 10)]
)


def check_session_id(session_id: object) -> str:
    """Return the id if it may name a session directory, else raise :class:`BadNameError`.

    Allowed: 1 to 200 characters of ASCII letters, digits, ``.``, ``_`` and
    ``-``, and not ``.`` or ``..``; so no id can climb out of ``sessions/``.
    """
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        raise BadNameError(
            f"session id {session_id!r} is not usable: use 1 to {MAX_SESSION_ID} of A-Z a-z 0-9 . _ -"
        )
    if session_id in (".", ".."):
        raise BadNameError(f"session id {session_id!r} is not usable")
    if len(session_id) > MAX_SESSION_ID:
        raise BadNameError(f"session id is {len(session_id)} characters long; at most {MAX_SESSION_ID} are allowed")
    return session_id


def is_session_id(text: object) -> bool:
    """Whether :func:`check_session_id` takes ``text``."""
    try:
        check_session_id(text)
    except BadNameError:
        return False
    return True


# -- names ------------------------------------------------------------------------


def check_ref_name(name: object) -> str:
    """Return ``name`` if it may name a ref, else raise :class:`BadRefNameError`.

    RFC 0002's rules on the name alone: segments of ``[A-Za-z0-9._-]`` joined
    by ``/``; no segment empty, ``.`` or ``..``, ending in a dot, or naming a
    Windows device (CON, PRN, AUX, NUL, COM1-9, LPT1-9 in any case, alone or
    before an extension: ``con.txt``); at most 200 bytes. They keep every
    name a portable file name, on case-insensitive systems too.
    """
    if not isinstance(name, str):
        raise BadRefNameError(f"invalid ref name {name!r}: a ref name is a string")
    if not name:
        raise BadRefNameError("invalid ref name '': a ref name is not empty")
    if not name.isascii():
        raise BadRefNameError(f"invalid ref name {name!r}: only A-Z a-z 0-9 . _ - and / are allowed")
    if len(name) > MAX_REF_NAME:
        raise BadRefNameError(
            f"invalid ref name {name[:40]!r}...: it is {len(name)} bytes long; at most {MAX_REF_NAME} are allowed"
        )
    for number, segment in enumerate(name.split("/"), start=1):
        why = _segment_problem(segment)
        if why:
            raise BadRefNameError(f"invalid ref name {name!r}: segment {number} {why}")
    return name


def _segment_problem(segment: str) -> str | None:
    if not segment:
        return "is empty (no leading, trailing or doubled '/')"
    if not _SEGMENT.fullmatch(segment):
        bad = next(c for c in segment if not _SEGMENT.fullmatch(c))
        return f"{segment!r} holds {bad!r}; only A-Z a-z 0-9 . _ - are allowed"
    if segment in (".", ".."):
        return f"is {segment!r}"
    if segment.endswith("."):
        return f"{segment!r} ends in a dot"
    if segment.split(".", 1)[0].upper() in _DEVICES:
        return f"{segment!r} names a Windows device"
    return None


def check_ref_prefix(prefix: object) -> str:
    """Return ``prefix`` if it can begin a ref name (empty, or name characters and ``/``;
    it need not end at a segment boundary), else raise :class:`BadRefNameError`."""
    if not isinstance(prefix, str) or not prefix.isascii() or not _PREFIX.fullmatch(prefix):
        raise BadRefNameError(f"invalid ref prefix {prefix!r}: only A-Z a-z 0-9 . _ - and / are allowed")
    if len(prefix) > MAX_REF_NAME:
        raise BadRefNameError(f"invalid ref prefix: {len(prefix)} bytes is longer than any ref name")
    return prefix


def _conflict_with(name: list[str], existing: list[str]) -> str | None:
    """Why ``name`` cannot sit beside ``existing`` (both split into segments), or None."""
    for k in range(min(len(name), len(existing))):
        a, b = name[k], existing[k]
        if a == b:
            continue
        if a.lower() == b.lower():
            return (
                f"{'/'.join(name[: k + 1])!r} differs only in case from {'/'.join(existing[: k + 1])!r}; "
                "on a case-insensitive file system they would be one"
            )
        return None
    if len(name) == len(existing):
        return None  # the same ref
    outer, inner = "/".join(existing), "/".join(name)
    if len(name) < len(existing):
        outer, inner = inner, outer
    return f"{inner!r} would be a ref under the ref {outer!r}, and no ref is under another"


def check_ref_conflict(name: str, existing: Iterable[str]) -> None:
    """Raise :class:`RefConflictError` if creating ``name`` beside the refs ``existing``
    breaks RFC 0002's rules on names, which depend on what the store holds.

    Refused: a ref under a ref (``a/b`` beside ``a``, or ``a`` beside ``a/b``),
    and a name any of whose leading segments differ only in ASCII case from
    the same leading segments of an existing name (``Chat`` beside ``chat``,
    ``A/x`` beside ``a/y``). A name that is itself in ``existing``, spelled
    the same, creates nothing new and passes.
    """
    check_ref_name(name)
    mine = name.split("/")
    for other in existing:
        why = _conflict_with(mine, other.split("/"))
        if why:
            raise RefConflictError(
                f"invalid ref name {name!r}: it conflicts with the ref {other!r}: {why}", name=name, existing=other
            )
