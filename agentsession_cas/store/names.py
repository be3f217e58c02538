"""Names a person types for sessions and entries, resolved as git resolves revisions.

A session is named by its id, by ``ref:NAME``, by a bare ref name where no session
has that id, or by a unique prefix of its id (at least :data:`MIN_ENTRY_PREFIX`
characters); an entry among the entries a session holds (its own and its prefix) by
the one rule a session file's entries are named by too
(:func:`~agentsession_cas.format.names.resolve_entry_name`: its full id, its
``legacy_id``, or a unique prefix of at least :data:`MIN_ENTRY_PREFIX` hex digits, with
or without ``sha256:``). A prefix that names several is an
:class:`~agentsession_cas.errors.AmbiguousNameError` listing them
(:func:`~agentsession_cas.format.names.the_one`, the one wording); one that names none
is the usual "no such" error, naming the store or the session looked in.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..errors import (
    AmbiguousNameError,
    BadBaseError,
    BadNameError,
    NoSuchEntryError,
    NoSuchObjectError,
    NoSuchRefError,
    NoSuchSessionError,
    SessionDamagedError,
    quoted,
)
from ..format.hashing import HASH_PREFIX, is_hash
from ..format.names import MIN_ENTRY_PREFIX, check_session_id, resolve_entry_name, the_one
from .refs import Refs

if TYPE_CHECKING:
    from .session import Session
    from .store import Store

__all__ = ["MIN_ENTRY_PREFIX", "REF_PREFIX", "resolve_session", "resolve_entry", "resolve_store_entry", "resolve_base",
           "resolve_object"]

#: Names a ref explicitly, whatever session ids exist.
REF_PREFIX = "ref:"
_HEX = re.compile(r"[0-9a-f]+")


def resolve_session(store: Store, name: str) -> str:
    """The id of the session ``name`` names in ``store`` (see the module docstring)."""
    refs = Refs(store)
    if name.startswith(REF_PREFIX):
        return refs.resolve(name[len(REF_PREFIX):])
    unusable: BadNameError | None = None
    try:
        check_session_id(name)
    except BadNameError as exc:
        unusable = exc  # perhaps a ref (they may hold '/'); else refused as it stands
    if unusable is None and name in store:
        return name
    try:
        return refs.resolve(name)
    except NoSuchRefError:
        if unusable is not None:  # a ref's name, no session's: the ref is what is missing
            raise NoSuchSessionError(
                f"no such session: {name} (no ref of that name in {store.describe()}, and it cannot be a session id)"
            ) from None
    except BadNameError:
        pass
    if unusable is not None:
        raise unusable
    # A prefix of at least as many characters as an entry prefix: a command that deletes
    # must not take one letter for a session.
    # A session whose header file is lost is held still (``list`` shows it damaged): it is
    # a candidate as any other, so a prefix naming it and another stays ambiguous (a
    # ``delete`` must not take the other), and one naming it alone is its damage.
    sessions = store.backend.sessions
    found = []
    if len(name) >= MIN_ENTRY_PREFIX:
        found = [sid for sid in store.list() if sid.startswith(name)]
        found += [sid for sid in sessions.lost_headers() if sid.startswith(name)]
    if name in found or not found:
        sid = name  # (an exact id whose header is lost: not `in store`, yet this one)
    else:
        sid = the_one(name, sorted(found), f"session ids in {store.describe()}")
    lost = sessions.header_lost(sid)
    if lost is not None:
        raise SessionDamagedError.header_lost(sid, lost, store.backend.public_url())
    if found:
        return sid
    raise NoSuchSessionError(f"no such session: {name} (no id, ref or id prefix in {store.describe()})")


def resolve_entry(session: Session, name: str) -> str:
    """The id of the entry ``name`` names among the entries ``session`` holds (its own and
    its prefix), by the one rule (:func:`~agentsession_cas.format.names.resolve_entry_name`).
    Its ``legacy_id`` names are read from the entries' contents only when the session's
    first entry has one (a session imported from a file before format 0.5, which RFC 0001
    migrates whole): any other session's lookup reads that one content, no more."""
    return resolve_entry_name(
        name,
        held=lambda e: e in session or (session.base is not None and e in session.prefix_set),
        ids=lambda: _held(session),
        legacy=lambda: _legacy_ids(session),
        where=f"session {session.id}",
    )


def resolve_store_entry(store: Store, name: str) -> str:
    """The id of the entry ``name`` names among every entry ``store`` holds, whichever
    session holds it (``create --base H``: git's commit wanted, any revision taken), by
    the one rule (:func:`~agentsession_cas.format.names.resolve_entry_name`) without its
    ``legacy_id`` step: a legacy id names an entry within its session, and the same one
    (``m0``) is in many. An entry is its id, content-addressed: an entry several sessions
    hold (a fork's prefix, a pushed copy) is one candidate, two ids that share the prefix
    are two, whichever sessions hold them, and, as git counts every object a short id
    could name, an entry object no session holds any more (a deleted session's, until
    ``sweep``) counts too. Looking a prefix up is the backend's
    (:meth:`~agentsession_cas.backends.base.ObjectStore.names_starting`, then only the
    names held as entries). A full id is taken as it stands: whether a session holds the
    entry named is the caller's to ask (``Store.create`` refuses a base none holds, with
    :class:`~agentsession_cas.errors.BaseNotHeldError`, code ``no_entry``)."""
    objects = store.objects

    def ids() -> list[str]:
        digits = name.removeprefix(HASH_PREFIX)
        return [n for n in objects.names_starting(digits) if objects.held("entries", n)]

    return resolve_entry_name(name, held=lambda e: True, ids=ids, legacy=None, where=store.describe())


def resolve_base(store: Store, name: str) -> tuple[str, str | None]:
    """The entry ``create --base NAME`` forks from, and the session ``name`` named (None
    when it named an entry): the head of the session whose id is ``name`` (as git takes a
    branch where a commit is wanted), or the entry ``name`` names among every entry the
    store holds (:func:`resolve_store_entry`, with its errors when no session has that
    id). A session with no head is :meth:`BadBaseError.no_head
    <agentsession_cas.errors.BadBaseError.no_head>`. A name that is both a session's id
    and a name of another entry (a session id of hex digits, say ``beef``, and an entry
    id starting ``sha256:beef``) is refused as :class:`AmbiguousNameError` listing what
    each reading names, rather than one reading winning: a fork from the wrong entry is
    a session that looks right and is not, and the choice would turn on what the store
    holds that day. ``sha256:`` before the digits names the entry alone (no session id
    has a ``:``); the head's id, the session alone. Both readings naming one entry is no
    ambiguity."""
    if name not in store:
        return resolve_store_entry(store, name), None
    with store.read(name) as session:
        head = session.head
    try:
        entries = [resolve_store_entry(store, name)]
    except AmbiguousNameError as exc:
        entries = exc.candidates
    except (BadNameError, NoSuchEntryError):  # no entry's name, or one naming none: the session's
        entries = []
    entries = [e for e in entries if e != head and store.objects.held("entries", e)]
    if entries:
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise AmbiguousNameError(
            f"{name} is both a session in {store.describe()} (its head: {head or 'none'}) and the start of "
            f"{'an entry id' if len(entries) == 1 else f'{len(entries)} entry ids'}: {shown}; give the head's id for "
            f"the session, or sha256: and the digits for the entry",
            candidates=sorted({*entries, *([head] if head is not None else [])}),
        )
    if head is None:
        raise BadBaseError.no_head(name)
    return head, name


def resolve_object(store: Store, name: str) -> str:
    """The name of the object ``name`` names: a full ``sha256:`` name, or a unique prefix
    of at least :data:`MIN_ENTRY_PREFIX` hex digits among every object the store holds,
    in any space (as ``git cat-file`` takes a short id). Looking a prefix up is the
    backend's (:meth:`~agentsession_cas.backends.base.ObjectStore.names_starting`: a
    binary search in each pack's index, one loose fan-out directory a space)."""
    if is_hash(name):
        return name
    digits = name[len("sha256:"):] if name.startswith("sha256:") else name
    if len(digits) < MIN_ENTRY_PREFIX or not _HEX.fullmatch(digits):
        raise BadNameError(
            f"{quoted(name)} is not an object name nor a prefix of one ({MIN_ENTRY_PREFIX} to 64 lowercase hex digits, "
            "with or without sha256:)"
        )
    found = sorted(store.objects.names_starting(digits))
    if found:
        return the_one(name, found, f"objects in {store.describe()}")
    raise NoSuchObjectError(f"no object in {store.describe()} starts with {quoted(name)}")


def _held(session: Session) -> Iterator[str]:
    yield from session.log_order
    yield from session.prefix


def _legacy_ids(session: Session) -> Iterator[tuple[str, str]]:
    """(legacy id, id) of each entry the session holds that has one; nothing, after one
    content read, when its first entry has none."""
    prefix = session.prefix
    first = prefix[0] if prefix else next(iter(session.log_order), None)
    if first is None or session.entry(first).legacy_id is None:
        return
    for e in session.store.entries([*prefix, *session.log_order]):
        if e.legacy_id is not None:
            yield e.legacy_id, e.id
