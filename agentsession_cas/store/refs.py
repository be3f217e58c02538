"""Named refs: store-wide names for sessions, moved only by compare-and-swap.

A ref is a name such as ``chat/slack/C123`` that names a session of the
store, as a git branch names a commit. Sessions are refs too (RFC 0002),
but their names are fixed at creation; a named ref is how a user or a
harness says "the current conversation is that session" and moves the
name when a session is continued into another one.

The rules on names are RFC 0002's (:mod:`agentsession_cas.format.names`);
this module is the domain's half: what a ref record holds (the session and
the ident of its incarnation), the compare-and-swap, and the states of a
ref whose session went away. Where the records are kept is the backend's
(:class:`~agentsession_cas.backends.base.RefStore`). ``docs/refs.md`` gives
the decisions.

Reads take no hold and never write, so a read-only store lists and shows
refs; what a read costs depends on the refs asked for, never on the number
of sessions.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import (
    BadNameError,
    DanglingRefError,
    NoSuchRefError,
    NoSuchSessionError,
    ReadOnlyError,
    RefMovedError,
    StoreError,
    UnsupportedError,
)
from ..format.canonical import canonical_bytes
from ..format.hashing import is_hash, sha256_ref
from ..format.names import (
    MAX_REF_NAME,
    check_ref_conflict,
    check_ref_name,
    check_ref_prefix,
    check_session_id,
    is_session_id,
)
from ..format.timestamps import now_ts
from ..lean import dataclass

if TYPE_CHECKING:
    from .store import Store

__all__ = [
    "MAX_REF_NAME",
    "REF_STATES",
    "Ref",
    "RefUpdate",
    "Refs",
    "check_ref_conflict",
    "check_ref_name",
    "check_ref_prefix",
    "header_ident",
]

#: What :meth:`Refs.state` reports: the session is there and is the one the ref was
#: set to; it is gone; it was deleted and another was created under its id.
REF_STATES = ("ok", "dangling", "replaced")


def header_ident(header: Mapping[str, Any]) -> str:
    """The identity of a session's incarnation: the hash of its header's canonical JSON
    without ``format`` (the one member a writer of a later minor rewrites). A session
    deleted and created again under its id has, in practice, another ident (its
    ``created_at`` at least differs), so a ref set to the first never reaches the second."""
    return sha256_ref(canonical_bytes({k: v for k, v in header.items() if k != "format"}))


# -- values -----------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """A ref as its file holds it: its name, the session it names, and the ident of
    that session's incarnation when the ref was set (None in a file that has none)."""

    name: str
    session: str
    ident: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "session": self.session, "ident": self.ident}


@dataclass(frozen=True)
class RefUpdate:
    """What a compare-and-swap did: the session the ref held before (``old``) and holds
    now (``new``), None for absent. ``changed`` is False when nothing was written (the
    ref already held that session's incarnation, or a deletion found it absent as expected)."""

    name: str
    old: str | None
    new: str | None
    changed: bool

    @property
    def created(self) -> bool:
        return self.changed and self.old is None

    @property
    def deleted(self) -> bool:
        return self.changed and self.new is None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "session": self.new, "previous": self.old, "changed": self.changed}


# -- the refs of a store ----------------------------------------------------------


class Refs:
    """The named refs of a :class:`~agentsession_cas.store.Store`.

    Reads (:meth:`get`, :meth:`list`, :meth:`names`, :meth:`state`,
    :meth:`resolve`) take no hold and write nothing. Writes (:meth:`update`,
    :meth:`delete`) are compare-and-swaps under the backend's refs hold, each
    durable before it returns.
    """

    def __init__(self, store: Store):
        self.store = store
        self.backend = store.backend.refs

    # -- reading -------------------------------------------------------------------

    def get(self, name: str) -> Ref | None:
        """The ref ``name``, or None when the store holds none by that name."""
        check_ref_name(name)
        data = self.backend.get(name)
        if data is None:
            return None
        session, ident = data.get("session"), data.get("ident")
        if not isinstance(session, str) or not is_session_id(session):
            raise StoreError(f"ref {name} is damaged: 'session' is {session!r}, not a session id")
        if ident is not None and not is_hash(ident):
            raise StoreError(f"ref {name} is damaged: 'ident' is {ident!r}, not a sha256 hash")
        return Ref(name, session, ident)

    def names(self, prefix: str = "") -> list[str]:
        """The names of the refs beginning with ``prefix``, in name order, reading no ref."""
        return self.backend.names(check_ref_prefix(prefix))

    def iter(self, prefix: str = "") -> Iterator[Ref]:
        """The refs whose name begins with ``prefix`` (at any character), in name order.

        One read per ref; a ref deleted while the listing runs is left out. A
        damaged ref raises :class:`StoreError` when reached, after the refs before
        it were yielded. Not a snapshot across names.
        """
        for name in self.names(prefix):
            ref = self.get(name)
            if ref is not None:
                yield ref

    def list(self, prefix: str = "") -> list[Ref]:
        """:meth:`iter` as a list."""
        return list(self.iter(prefix))

    def __contains__(self, name: object) -> bool:
        try:
            return self.get(name) is not None  # type: ignore[arg-type]
        except BadNameError:
            return False

    def session_ident(self, session: str) -> str:
        """The ident of the session the store holds under ``session`` (one header read),
        or :class:`NoSuchSessionError`."""
        return self.store.session_ident(session)

    def state(self, ref: Ref) -> str:
        """``ok``, ``dangling`` (the session is gone) or ``replaced`` (a session was created
        again under its id since the ref was set), reading that session's header only."""
        try:
            ident = self.session_ident(ref.session)
        except NoSuchSessionError:
            return "dangling"
        if ref.ident is not None and ident != ref.ident:
            return "replaced"
        return "ok"

    def resolve(self, name: str) -> str:
        """The session the ref names, checked to be the one it was set to.

        :class:`NoSuchRefError` when there is no such ref;
        :class:`DanglingRefError` (a :class:`NoSuchSessionError`, carrying the
        session id) when its session is gone or was replaced.
        """
        ref = self.get(name)
        if ref is None:
            raise NoSuchRefError(f"no such ref: {name}")
        state = self.state(ref)
        if state == "dangling":
            raise DanglingRefError(
                f"ref {name} is dangling: its session {ref.session} is not in the store",
                name=name, session=ref.session, state=state,
            )
        if state == "replaced":
            raise DanglingRefError(
                f"ref {name} is dangling: session {ref.session} was deleted and created again since the ref was set",
                name=name, session=ref.session, state=state,
            )
        return ref.session

    # -- writing ---------------------------------------------------------------------

    def _require_writable(self) -> None:
        if self.store.readonly:
            raise ReadOnlyError(f"{self.store.describe()} is open read-only; refs cannot be moved")

    def update(self, name: str, session: str | None, *, expected: str | None, reason: str | None = None) -> RefUpdate:
        """Move the ref ``name`` from ``expected`` to ``session``, by compare-and-swap.

        None as ``expected`` means the ref must be absent (a creation); None as
        ``session`` deletes it. When the ref holds anything else than
        ``expected``, nothing is written and :class:`RefMovedError` says what
        it holds. ``session`` must be a session the store holds
        (:class:`NoSuchSessionError` otherwise), and a creation must not
        conflict with the names held (:class:`RefConflictError`). Setting a
        ref to the incarnation it already holds writes nothing.
        """
        check_ref_name(name)
        if expected is not None:
            check_session_id(expected)
        if session is not None:
            check_session_id(session)
        self._require_writable()
        with self.backend.locked():
            current = self.get(name)
            held = current.session if current is not None else None
            if held != expected:
                raise RefMovedError(_moved_message(name, expected, held), name=name, expected=expected, current=held)
            if session is None:
                if current is None:
                    return RefUpdate(name, None, None, changed=False)
                self.backend.delete(name)
                self._moved(name, held, None, None, reason)
                return RefUpdate(name, held, None, changed=True)
            ident = self.session_ident(session)
            if current is not None and current.session == session and current.ident == ident:
                return RefUpdate(name, held, session, changed=False)
            if current is None:
                check_ref_conflict(name, self.backend.names())
            self.backend.put(name, {"ident": ident, "name": name, "session": session})
            self._moved(name, held, session, ident, reason)
            return RefUpdate(name, held, session, changed=True)

    def _moved(self, name: str, old: str | None, new: str | None, ident: str | None, reason: str | None) -> None:
        """One line of the ref's history (a backend that keeps one): what it held, what it
        holds now (and which incarnation), when, and why when the caller said."""
        move: dict[str, Any] = {"name": name, "old": old, "new": new, "ident": ident, "at": now_ts()}
        if reason:
            move["reason"] = reason
        self.backend.record_move(name, move)

    def log(self, name: str) -> builtins.list[dict[str, Any]]:
        """The ref's changes, newest first (RFC 0003's ref log): each ``{name, old, new,
        ident, at[, reason]}``. :class:`UnsupportedError` when the backend keeps none."""
        check_ref_name(name)
        self.require_log()
        return list(reversed(self.backend.moves(name) or ()))

    def require_log(self) -> None:
        """:class:`UnsupportedError` when the backend keeps no history of its refs
        (``keeps_moves``, which says whether ``moves`` answers None): what :meth:`log`
        raises, asked without reading one (a server's ``HEAD``)."""
        if not self.backend.keeps_moves:
            raise UnsupportedError(f"{self.store.describe()} keeps no history of its refs")

    def delete(self, name: str, *, expected: str) -> RefUpdate:
        """Delete the ref ``name`` if it holds ``expected`` (compare-and-swap); a ref that
        is absent or holds another session raises :class:`RefMovedError`."""
        if not isinstance(expected, str):
            raise BadNameError("deleting a ref needs the session it is expected to hold")
        return self.update(name, None, expected=expected)


def _moved_message(name: str, expected: str | None, held: str | None) -> str:
    now = f"it holds session {held}" if held is not None else "it is absent"
    wanted = f"it was expected to hold session {expected}" if expected is not None else "it was expected to be absent"
    return f"ref {name} moved: {now}, where {wanted}"
