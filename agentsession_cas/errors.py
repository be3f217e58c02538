"""The one exception hierarchy of agentsession-cas.

Every error the library raises on purpose is an :class:`AgentSessionError`,
so a caller (the CLI above all) can catch one type and print one line.
Problems found while reading a file are not raised one by one: they are
collected as :class:`Problem` values, since a verifier wants all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

#: How much a problem weighs: an ``error`` fails a verify, a ``note`` is a remark.
Severity = Literal["error", "note"]


class AgentSessionError(Exception):
    """Base of every error this library raises deliberately."""


class IJSONError(AgentSessionError, ValueError):
    """A value that JSON admits but I-JSON (RFC 7493, as RFC 0001 tests it) refuses."""


class TimestampError(AgentSessionError, ValueError):
    """A ``ts`` that is not in the one spelling RFC 0001 admits."""


class EntryError(AgentSessionError, ValueError):
    """An entry that cannot be hashed or built: a reserved member in its body,
    a missing or mistyped envelope member, a caller-given id that differs."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one line of a session file.

    ``line`` is 1-based (the header is line 1); ``code`` is a short stable
    word scripts can match on (``agentsession_cas.format.rules.RULES`` lists
    every one); ``message`` says what failed in words, on one line;
    ``severity`` is ``error`` or, for a remark that fails nothing, ``note``.
    """

    line: int | None
    code: str
    message: str
    entry: str | None = None
    severity: Severity = "error"

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        return f"{where}{self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "code": self.code, "message": self.message, "entry": self.entry, "severity": self.severity}


class SessionFormatError(AgentSessionError):
    """A session file that cannot be read at all (no header, an unsupported
    format) or, when read strictly, one with problems. Carries them."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = list(problems)
        first = problems[0] if problems else None
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{source}: {first}{more}" if first else f"{source}: unreadable")


class NoSuchEntryError(AgentSessionError, LookupError):
    """An entry id (or prefix) that names nothing, or names several entries."""


class ContextError(AgentSessionError):
    """A context that cannot be built from a path: the last compaction's ``first_kept``
    names no entry on the path before it (RFC 0001 "compaction")."""


# -- the store ---------------------------------------------------------------


class StoreError(AgentSessionError):
    """A store-level refusal or failure."""


class LayoutError(StoreError):
    """No store here, or a store of a layout this release does not read."""


class MigrationError(StoreError):
    """A store of the earlier journal layout that cannot be migrated as it stands.
    ``problems`` lists every reason found (the message names the first); nothing was changed."""

    def __init__(self, message: str, *, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [])


class MigrationBusyError(MigrationError):
    """A writer (or sweep) of the earlier layout holds one of the store's locks: migrating
    now could lose what it commits, so the migration refuses until it has stopped."""


class BadNameError(StoreError, ValueError):
    """A session id or hash that may not name anything (checked before any path is built)."""


class ReadOnlyError(StoreError):
    """A write through a store or session opened read-only."""


class NoSuchSessionError(StoreError, LookupError):
    """The store holds no session by that id."""


class SessionExistsError(StoreError):
    """A create or import under an id the store already holds."""


class SessionLockedError(StoreError):
    """Another process holds the session for writing."""


class SessionDamagedError(StoreError):
    """A session log record before the last commit fails its checksum: damage, not a crash's loss.
    The session refuses writes until repaired."""

    def __init__(self, message: str, *, session: str, line: int, offset: int):
        super().__init__(message)
        self.session = session
        self.line = line
        self.offset = offset


class MirrorError(StoreError):
    """A local append or head move on a session this store is a mirror of."""


class HeadMovedError(StoreError):
    """A head compare-and-swap whose expectation was wrong: the head moved."""


class AppendRefusedError(StoreError, EntryError):
    """An append the store's rules refuse (parent rule, synthetic label, bad id, ...)."""


class NoSuchObjectError(StoreError, LookupError):
    """An object the store does not hold."""


class CorruptObjectError(StoreError):
    """An object whose bytes do not hash to its name; never served."""

    def __init__(self, message: str, *, space: str, name: str, path: str):
        super().__init__(message)
        self.space = space
        self.name = name
        self.path = path


class CorruptPackError(StoreError):
    """A pack or its index fails its checksum or is not laid out as it says;
    nothing in it is served until it is repaired (``fsck`` names the file)."""

    def __init__(self, message: str, *, path: str):
        super().__init__(message)
        self.path = path


# -- refs (agentsession_cas/refs.py) ---------------------------------------------


class BadRefNameError(BadNameError):
    """A ref name (or listing prefix) that RFC 0002's rules on names refuse, whatever the store holds."""


class RefConflictError(BadRefNameError):
    """A new ref name that clashes with one the store holds: one under the other, or a case-only difference."""

    def __init__(self, message: str, *, name: str, existing: str):
        super().__init__(message)
        self.name = name
        self.existing = existing


class NoSuchRefError(StoreError, LookupError):
    """The store holds no ref by that name."""


class RefMovedError(StoreError):
    """A ref compare-and-swap whose expectation was wrong. ``current`` is the session the
    ref holds (None when it is absent); ``expected`` the one the caller named."""

    def __init__(self, message: str, *, name: str, expected: str | None, current: str | None):
        super().__init__(message)
        self.name = name
        self.expected = expected
        self.current = current


class DanglingRefError(NoSuchSessionError):
    """A ref whose session is gone, or was deleted and created again under its id.
    ``session`` is the id the ref holds, so a caller can tell which and move the ref."""

    def __init__(self, message: str, *, name: str, session: str, state: str):
        super().__init__(message)
        self.name = name
        self.session = session
        self.state = state


# -- exchange between stores (agentsession_cas/exchange.py, transport.py) ----------


class TransportError(StoreError):
    """A remote that cannot be reached or named: an unsupported URL scheme, no store there,
    or the local store itself given as its own remote."""


class NotRecordError(StoreError):
    """A push (or handover) from a store that is not the session's record here (RFC 0002:
    only the record may initiate a push)."""


class HeaderDiffersError(StoreError):
    """The receiver holds another session under the pushed id: the headers differ apart
    from ``format``, and two sessions alike only in id are not one session."""


class BadObjectError(StoreError):
    """Bytes sent under a name they do not hash to; nothing of them was stored."""


class MissingObjectsError(StoreError):
    """A push names objects the receiver cannot find; nothing was admitted.
    ``missing`` maps a space (entries, contents, blobs) to the hashes it lacks."""

    def __init__(self, message: str, *, missing: dict[str, list[str]]):
        super().__init__(message)
        self.missing = {space: list(names) for space, names in missing.items()}


class IncompletePushError(StoreError):
    """A push that sent only what the sender believed new, to a receiver that lacks what it
    builds on (its session, or a parent): nothing was admitted, and the sender pushes
    again with the whole closure."""


class HandoverIncompleteError(StoreError):
    """A handover or take-back stopped between its two steps: both stores hold the session
    as its record (never neither). Running the same command again finishes it."""
