"""Named refs: store-wide names for sessions, moved only by compare-and-swap.

A ref is a name such as ``chat/slack/C123`` that names a session of the
store, as a git branch names a commit. Sessions are refs too (RFC 0002),
but their names are fixed at creation; a named ref is how a user or a
harness says "the current conversation is that session" and moves the
name when a session is continued into another one.

The rules on names are RFC 0002's (see :func:`check_ref_name` and
:func:`check_ref_conflict`); the layout is one small file per ref in
``refs/``, replaced atomically under a store-wide lock because a creation's
conflict check spans names. ``docs/refs.md`` gives the decisions and
``docs/storage-format.md`` the bytes.

Reads take no lock and never write, so a read-only store lists and shows
refs; what a read costs depends on the refs asked for, never on the number
of sessions.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import filelock

from ..backends.files.fsutil import fsync_dir, write_atomic
from ..errors import (
    AgentSessionError,
    BadNameError,
    BadRefNameError,
    DanglingRefError,
    NoSuchRefError,
    NoSuchSessionError,
    ReadOnlyError,
    RefConflictError,
    RefMovedError,
    StoreError,
)
from ..format.canonical import canonical_bytes, loads
from ..format.hashing import is_hash, sha256_ref
from ..format.names import check_session_id

if TYPE_CHECKING:  # the store imports nothing from here; keep it that way
    from .core import Store

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
    "ref_file_name",
]

#: The longest ref name, in bytes (names are ASCII, so also in characters).
MAX_REF_NAME = 200
#: What :meth:`Refs.state` reports: the session is there and is the one the ref was
#: set to; it is gone; it was deleted and another was created under its id.
REF_STATES = ("ok", "dangling", "replaced")
#: How long a writer waits for another's ref update before giving up. Updates hold the
#: lock for a read, a file write and two fsyncs, so a wait this long means a stuck process.
LOCK_TIMEOUT = 30.0

_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_PREFIX = re.compile(r"[A-Za-z0-9._/-]*")
#: Names Windows gives to devices in every directory, with or without an extension.
_DEVICES = frozenset(
    ["CON", "PRN", "AUX", "NUL"] + [f"COM{i}" for i in range(1, 10)] + [f"LPT{i}" for i in range(1, 10)]
)
#: The file-name spelling of ``/``; no ref name can hold it, so the mapping is one to one.
_SLASH = "%"


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


def ref_file_name(name: str) -> str:
    """The file in ``refs/`` that holds the ref ``name`` (``/`` written as ``%``)."""
    return check_ref_name(name).replace("/", _SLASH)


def _name_of_file(file_name: str) -> str | None:
    name = file_name.replace(_SLASH, "/")
    try:
        return check_ref_name(name)
    except BadRefNameError:
        return None


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
    :meth:`resolve`) take no lock and write nothing. Writes (:meth:`update`,
    :meth:`delete`) are compare-and-swaps under ``refs.lock``, each durable
    before it returns: the ref file is written to ``tmp/``, fsynced, renamed
    into ``refs/`` and the directory fsynced.
    """

    def __init__(self, store: Store):
        self.store = store
        self.root = store.root
        self.dir = os.path.join(self.root, "refs")

    # -- reading -------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, ref_file_name(name))

    def _read_file(self, path: str, name: str) -> Ref | None:
        """The ref in ``path`` if it is the ref ``name``; None when there is none.

        A file holding another name is another ref that a case-insensitive file
        system maps to this path (``Chat`` finds ``chat``): not this one.
        """
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        except IsADirectoryError:
            raise StoreError(f"ref file {path} is a directory; refs/ holds one file per ref") from None
        try:
            data = loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, AgentSessionError) as exc:
            raise StoreError(f"ref file {path} is damaged: not a JSON object ({exc})") from None
        if not isinstance(data, dict):
            raise StoreError(f"ref file {path} is damaged: not a JSON object")
        held, session, ident = data.get("name"), data.get("session"), data.get("ident")
        if not isinstance(held, str) or not _valid(held):
            raise StoreError(f"ref file {path} is damaged: 'name' is {held!r}, not a ref name")
        if held.lower() != name.lower():
            raise StoreError(f"ref file {path} is damaged: it holds the ref {held!r}, not {name!r}")
        if not isinstance(session, str) or not _valid_session(session):
            raise StoreError(f"ref file {path} is damaged: 'session' is {session!r}, not a session id")
        if ident is not None and not is_hash(ident):
            raise StoreError(f"ref file {path} is damaged: 'ident' is {ident!r}, not a sha256 hash")
        if held != name:
            return None
        return Ref(held, session, ident)

    def get(self, name: str) -> Ref | None:
        """The ref ``name``, or None when the store holds none by that name."""
        return self._read_file(self._path(name), name)

    def _files(self, prefix: str = "") -> list[tuple[str, str]]:
        """(name, file) of every ref whose name begins with ``prefix``, in name order."""
        try:
            files = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        want = prefix.replace("/", _SLASH)
        out = []
        for file_name in files:
            if file_name.startswith(want):
                name = _name_of_file(file_name)
                if name is not None:
                    out.append((name, file_name))
        out.sort()
        return out

    def names(self, prefix: str = "") -> list[str]:
        """The names of the refs beginning with ``prefix``, in name order, reading no ref file."""
        return [name for name, _ in self._files(check_ref_prefix(prefix))]

    def iter(self, prefix: str = "") -> Iterator[Ref]:
        """The refs whose name begins with ``prefix`` (at any character), in name order.

        One file read per ref; a ref deleted while the listing runs is left
        out. A damaged ref file raises :class:`StoreError` when reached, after
        the refs before it were yielded. Not a snapshot across names.
        """
        for name, file_name in self._files(check_ref_prefix(prefix)):
            ref = self._read_file(os.path.join(self.dir, file_name), name)
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
        path = os.path.join(self.store.session_dir(session), "header")
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except (FileNotFoundError, NotADirectoryError):
            raise NoSuchSessionError(f"no such session: {session}") from None
        try:
            header = loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, AgentSessionError) as exc:
            raise StoreError(f"the header of session {session} ({path}) is not a JSON object: {exc}") from None
        if not isinstance(header, dict):
            raise StoreError(f"the header of session {session} ({path}) is not a JSON object")
        return header_ident(header)

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
            raise ReadOnlyError(f"the store at {self.root} is open read-only; refs cannot be moved")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The store-wide refs lock: a creation's conflict check spans every name, so
        every write holds it (reads do not). Its file is made by the first write and
        never removed, as a session's lock file is."""
        lock = filelock.FileLock(os.path.join(self.root, "refs.lock"), timeout=LOCK_TIMEOUT)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise StoreError(
                f"the refs of the store at {self.root} stayed locked for {LOCK_TIMEOUT:g}s by another process"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def _ensure_dirs(self) -> None:
        if not os.path.isdir(self.dir):
            os.makedirs(self.dir, exist_ok=True)
            fsync_dir(self.root)  # the new directory's name, before any ref in it
        os.makedirs(os.path.join(self.root, "tmp"), exist_ok=True)

    def update(self, name: str, session: str | None, *, expected: str | None) -> RefUpdate:
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
        path = self._path(name)
        with self._locked():
            current = self._read_file(path, name)
            held = current.session if current is not None else None
            if held != expected:
                raise RefMovedError(_moved_message(name, expected, held), name=name, expected=expected, current=held)
            if session is None:
                if current is None:
                    return RefUpdate(name, None, None, changed=False)
                os.unlink(path)
                fsync_dir(self.dir)
                return RefUpdate(name, held, None, changed=True)
            ident = self.session_ident(session)
            if current is not None and current.session == session and current.ident == ident:
                return RefUpdate(name, held, session, changed=False)
            if current is None:
                check_ref_conflict(name, (n for n, _ in self._files()))
            data = canonical_bytes({"ident": ident, "name": name, "session": session}) + b"\n"
            self._ensure_dirs()
            write_atomic(path, data, durable=True, tmp_dir=os.path.join(self.root, "tmp"))
            return RefUpdate(name, held, session, changed=True)

    def delete(self, name: str, *, expected: str) -> RefUpdate:
        """Delete the ref ``name`` if it holds ``expected`` (compare-and-swap); a ref that
        is absent or holds another session raises :class:`RefMovedError`."""
        if not isinstance(expected, str):
            raise BadNameError("deleting a ref needs the session it is expected to hold")
        return self.update(name, None, expected=expected)


def _valid(name: str) -> bool:
    try:
        check_ref_name(name)
    except BadRefNameError:
        return False
    return True


def _valid_session(session: str) -> bool:
    try:
        check_session_id(session)
    except BadNameError:
        return False
    return True


def _moved_message(name: str, expected: str | None, held: str | None) -> str:
    now = f"it holds session {held}" if held is not None else "it is absent"
    wanted = f"session {expected}" if expected is not None else "absent"
    return f"ref {name} moved: {now}, not {wanted} as expected"
