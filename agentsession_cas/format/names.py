"""Names that become paths or keys: session ids and ref names (RFC 0002's rules on names),
checked before any path is built from them; and the one rule by which a person names an
entry of a session (:func:`resolve_entry_name`), a file's or a stored session's alike."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from ..errors import AmbiguousNameError, BadNameError, BadRefNameError, NoSuchEntryError, RefConflictError, quoted
from .hashing import HASH_PREFIX, is_hash

__all__ = ["check_session_id", "is_session_id", "names_an_entry", "MAX_SESSION_ID", "MAX_REF_NAME", "check_ref_name", "check_ref_prefix",
           "check_ref_conflict", "MIN_ENTRY_PREFIX", "full_entry_id", "resolve_entry_name", "the_one"]

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
            + names_an_entry(session_id)
        )
    if session_id in (".", ".."):
        raise BadNameError(f"session id {session_id!r} is not usable")
    if len(session_id) > MAX_SESSION_ID:
        raise BadNameError(f"session id is {len(session_id)} characters long; at most {MAX_SESSION_ID} are allowed")
    return session_id


def names_an_entry(name: object) -> str:
    """What to add where a session was asked for and ``name`` spells an entry or object id
    (``sha256:`` and hex digits): a pasted id from ``show`` or ``log`` names no session."""
    if isinstance(name, str) and name.startswith("sha256:") and 0 < len(name) - 7 <= 64 \
            and all(c in "0123456789abcdef" for c in name[7:]):
        return "; it names an entry or object, not a session (`agentsession cat-object` prints one)"
    return ""


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


# ---------------------------------------------------------------------------
# entry names: the one rule (a file's entries and a stored session's)

#: The fewest hex digits a prefix of an entry id may have (as git's short ids; also the
#: fewest of an object name's or a session id's prefix, store/names.py).
MIN_ENTRY_PREFIX = 4
#: The most candidates an ambiguity error lists.
_SHOWN = 10
_HEX = re.compile(r"[0-9a-f]+")


def full_entry_id(name: object) -> str | None:
    """The full entry id ``name`` spells whole, by the rule below (``sha256:`` and 64
    lowercase hex digits, or the 64 digits alone, ``sha256:`` then added), else None: what
    names an entry wherever it is, held here or not (an exchange's expected head, which
    is the remote's)."""
    if is_hash(name):
        return name
    if isinstance(name, str) and len(name) == 64 and _HEX.fullmatch(name):
        return HASH_PREFIX + name
    return None


def resolve_entry_name(
    name: str,
    *,
    held: Callable[[str], bool],
    ids: Callable[[], Iterable[str]],
    legacy: Callable[[], Iterable[tuple[str, str]]] | None,
    where: str,
) -> str:
    """The full id of the entry ``name`` names among a session's entries, by one rule
    wherever an entry is named (``show --leaf``, ``export --at``, ``rev-parse``, ``head``,
    ``push --expect``, ``diff --session``), first match wins:

    1. a full id (``sha256:`` and 64 hex digits): that entry, when ``held``;
    2. an entry's ``legacy_id`` (the id a file from before 0.5 gave it, RFC 0001
       Versioning), exactly: an exact name before an abbreviation, as git's;
    3. a prefix of at least :data:`MIN_ENTRY_PREFIX` lowercase hex digits of an id, with
       or without ``sha256:`` (64 of them: the full id), naming one entry.

    ``ids`` gives the ids to look prefixes up among, ``legacy`` the (legacy id, id) pairs
    (each asked only when the step before found nothing; None where legacy ids name
    nothing, step 2 then skipped: a whole store's entries, ``create --base``, where one
    legacy id is in many sessions), ``where`` what they are of, as errors name it
    (``session ID``, a file's path, a store). A prefix naming several is an
    :class:`~agentsession_cas.errors.AmbiguousNameError` (code ``ambiguous``) listing them;
    a name of the right form naming none is a
    :class:`~agentsession_cas.errors.NoSuchEntryError` (``no_entry``); a name of none of
    these forms (fewer than 4 digits, not lowercase hex) is a
    :class:`~agentsession_cas.errors.BadNameError` (``bad_name``), whatever the session
    holds: a 3-digit prefix unique today would name another entry, or several, tomorrow.
    """
    forms = "id, legacy_id or id prefix" if legacy is not None else "id or id prefix"
    missing = f"no such entry: {name} (no {forms} in {where})"
    if is_hash(name):
        if held(name):
            return name
        raise NoSuchEntryError(missing)
    if legacy is not None:
        for legacy_id, entry_id in legacy():
            if legacy_id == name:
                return entry_id
    digits = name[len(HASH_PREFIX):] if name.startswith(HASH_PREFIX) else name
    if not (MIN_ENTRY_PREFIX <= len(digits) <= 64 and _HEX.fullmatch(digits)):
        raise BadNameError(
            f"{quoted(name)} is not an entry id nor a prefix of one ({MIN_ENTRY_PREFIX} to 64 lowercase hex digits, "
            f"with or without {HASH_PREFIX})"
            + (f", nor the legacy_id of an entry in {where}" if legacy is not None else f", for an entry in {where}")
        )
    want = HASH_PREFIX + digits
    found = sorted({e for e in ids() if e.startswith(want)})
    if found:
        return the_one(name, found, f"entry ids in {where}")
    raise NoSuchEntryError(missing)


def the_one(name: str, found: list[str], what: str) -> str:
    """The one name a prefix matched; more than one is an
    :class:`~agentsession_cas.errors.AmbiguousNameError` listing them (``what``: what they
    are, ``entry ids in session ID``), the wording of every ambiguous name."""
    if len(found) == 1:
        return found[0]
    shown = ", ".join(found[:_SHOWN]) + (f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else "")
    raise AmbiguousNameError(f"{name} is the start of {len(found)} {what}: {shown}; give more of it",
                             candidates=found)
