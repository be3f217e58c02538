"""The one exception hierarchy of agentsession-cas.

Every error the library raises on purpose is an :class:`AgentSessionError`,
so a caller (the CLI above all) can catch one type and print one line.
Each class carries a stable machine ``code`` (scripts branch on it, the
command prints it under ``--json``) and the HTTP ``status`` a server answers
with: where RFC 0003's error table names a code for the refusal, the code
is that one; the others are this project's own, and :attr:`wire_code` maps
them to the protocol's ``store_fault``. Problems found while reading a file
are not raised one by one: they are collected as :class:`Problem` values,
since a verifier wants all of them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

from .lean import dataclass

#: How much a problem weighs: an ``error`` fails a verify, a ``note`` is a remark.
Severity = Literal["error", "note"]

#: The codes RFC 0003's error table defines (its section "Errors").
PROTOCOL_CODES = frozenset(
    {
        "no_session", "session_exists", "session_replaced", "no_entry", "no_object", "no_ref", "ref_dangling",
        "ref_moved", "ref_name", "head_moved", "head_target", "session_locked", "lease_lost", "mirror",
        "not_record", "header_differs", "call_id_repeated", "synthetic", "bad_entry", "base_rule", "bad_base",
        "bad_object", "missing_object", "bad_ref_target", "format", "read_only", "unsupported", "store_fault",
        "auth", "scope",
    }
)


def quoted(value: object, limit: int = 80) -> str:
    """A value as an error message shows it: its repr, cut to ``limit`` characters with
    its full length said, so a hostile 10,000-character name stays a one-line error."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, (str, bytes)) else f"{len(text)} characters shown"
    return f"{text[:limit]}... ({size})"


def store_relative(text: str, root: str | None) -> str:
    """``text`` on one line with the store's root taken out of the paths it names: a
    finding or a note names a file relative to the store (an error's message, made
    where the root is not known, names it whole)."""
    text = " ".join(text.splitlines())
    return text.replace(root.rstrip(os.sep) + os.sep, "") if root else text


class AgentSessionError(Exception):
    """Base of every error this library raises deliberately."""

    code = "error"
    status = 500

    @property
    def wire_code(self) -> str:
        """The code as RFC 0003 spells it: this one where the protocol names it, else ``store_fault``."""
        return self.code if self.code in PROTOCOL_CODES else "store_fault"

    def as_dict(self) -> dict[str, Any]:
        """The error as one JSON object (what ``--json`` prints on stderr)."""
        return {"error": {"code": self.code, "message": str(self)}}


class IJSONError(AgentSessionError, ValueError):
    """A value that JSON admits but I-JSON (RFC 7493, as RFC 0001 tests it) refuses."""

    code = "bad_entry"
    status = 422


class TimestampError(AgentSessionError, ValueError):
    """A ``ts`` that is not in the one spelling RFC 0001 admits."""

    code = "bad_entry"
    status = 422


class EntryError(AgentSessionError, ValueError):
    """An entry that cannot be hashed or built: a reserved member in its body,
    a missing or mistyped envelope member, a caller-given id that differs."""

    code = "bad_entry"
    status = 422


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
        """The problem shape every ``--json`` output shares (``docs/cli.md``, "JSON"):
        ``code``, ``severity``, ``where`` (here the file's lines), ``line``, ``entry``,
        ``message``."""
        return {"code": self.code, "severity": self.severity, "where": "file", "line": self.line, "entry": self.entry,
                "message": self.message}


class SessionFormatError(AgentSessionError):
    """A session file that cannot be read at all (no header, an unsupported
    format) or, when read strictly, one with problems. Carries them."""

    code = "bad_file"
    status = 422

    def __init__(self, source: str, problems: list[Problem], *, why: str | None = None):
        self.source = source
        self.problems = list(problems)
        first = problems[0] if problems else None
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        lead = f"{source}: {why}: " if why else f"{source}: "
        super().__init__(f"{lead}{first}{more}" if first else f"{source}: unreadable")


class NoSuchEntryError(AgentSessionError, LookupError):
    """An entry id (or prefix) that names nothing (a prefix naming several is an AmbiguousNameError)."""

    code = "no_entry"
    status = 404


class BadArgumentError(AgentSessionError, ValueError):
    """A caller's argument the library cannot take, whatever the store holds: a value of
    the wrong type (a blob that is no bytes), out of its range (a negative limit), not
    one of the values it names (a mark that is neither ``record`` nor ``mirror``, an
    unknown sync policy or object space). The caller's mistake, never the store's:
    nothing was read or written (a name that is no name, None where an entry is wanted
    included, is :class:`BadNameError`; a value the format refuses :class:`EntryError`)."""

    code = "bad_argument"
    status = 400


def unknown_object_space(space: object, known: Sequence[str]) -> BadArgumentError:
    """The error for an object space that is none of ``known`` (the library's spaces, or
    the wire's, which name ``blobs`` ``media``): one wording and one code
    (``bad_argument``, 400 over HTTP) for the store, the backends, the exchange and the
    server alike."""
    return BadArgumentError(f"unknown object space {quoted(space)}: one of {', '.join(known)}")


class ContextError(AgentSessionError):
    """A context that cannot be built from a path: the last compaction's ``first_kept``
    names no entry on the path before it (RFC 0001 "compaction")."""

    code = "context"
    status = 422


# -- the store ---------------------------------------------------------------


class StoreError(AgentSessionError):
    """A store-level refusal or failure."""

    code = "store_fault"
    status = 500


class LayoutError(StoreError):
    """No store here, or a store of a layout this release does not read."""

    code = "layout"
    status = 500

    @classmethod
    def no_store(cls, what: str, url: str) -> LayoutError:
        """No store at ``url`` (``what`` says how that was found), with the command that
        makes one there: ``init`` with ``--store``, since a bare ``agentsession init`` makes
        the store the search finds, which is not this one when ``--store`` named it."""
        import shlex  # an error's path only: not on a command's start-up path

        return cls(f"{what}; create one with `agentsession --store {shlex.quote(url)} init`")


class MigrationError(StoreError):
    """A store of the earlier journal layout that cannot be migrated as it stands.
    ``problems`` lists every reason found (the message names the first); nothing was changed."""

    code = "migration"
    status = 500

    def __init__(self, message: str, *, problems: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.problems = list(problems or [])


class MigrationBusyError(MigrationError):
    """A writer (or sweep) of the earlier layout holds one of the store's locks: migrating
    now could lose what it commits, so the migration refuses until it has stopped."""

    code = "migration_busy"
    status = 409


class BadNameError(StoreError, ValueError):
    """A session id or hash that may not name anything (checked before any path is built)."""

    code = "bad_name"
    status = 400


#: How a full object name (an entry id among them) is spelled, as the refusals say it.
HASH_FORM = "sha256: and 64 lowercase hex digits"


def not_an_object_name(name: object) -> BadNameError:
    """The error for what was given as an object's name (an entry id, a content or blob
    name) and is none: one wording and one code (``bad_name``, as for a session id) for
    every read of every backend."""
    return BadNameError(f"{quoted(name)} is not an object name ({HASH_FORM})")


class ReadOnlyError(StoreError):
    """A write through a store or session opened read-only."""

    code = "read_only"
    status = 403


class NoSuchSessionError(StoreError, LookupError):
    """The store holds no session by that id."""

    code = "no_session"
    status = 404


class SessionExistsError(StoreError):
    """A create or import under an id the store already holds."""

    code = "session_exists"
    status = 409


class SessionLockedError(StoreError):
    """Another process holds the session for writing."""

    code = "session_locked"
    status = 409


class NoSpaceError(StoreError):
    """The device (or quota) holding the store is full: a write was refused whole."""

    code = "no_space"
    status = 507


#: The errno values that mean the device or quota is full.
NO_SPACE_ERRNOS = frozenset({28, 122})  # ENOSPC, EDQUOT (Linux)
#: The errno value that means the device holding the store is mounted read-only: the
#: store's own read-only refusal (ReadOnlyError's code), met at the filesystem instead.
READ_ONLY_ERRNOS = frozenset({30})  # EROFS


class WritersActiveError(StoreError):
    """A sweep whose grace is too short to protect a writer in flight, refused while a
    writer holds a session of the store (``--force`` takes that risk)."""

    code = "writers_active"
    status = 409


class SessionDamagedError(StoreError):
    """A session log record before the last commit fails its checksum: damage, not a crash's loss.
    The session refuses writes until repaired."""

    code = "session_damaged"
    status = 500

    def __init__(self, why: str, *, session: str, line: int, offset: int, path: str | None = None,
                 store: str | None = None):
        import shlex  # an error's path only: not on a command's start-up path

        where = f" ({path})" if path else ""
        # The store named as --store names it: a bare `agentsession repair` repairs the
        # store the search finds, which need not be the damaged one (as LayoutError.no_store).
        named = f" --store {shlex.quote(store)}" if store else ""
        super().__init__(
            f"session {session} is damaged: {why}{where}; it refuses writes until repaired: run `agentsession{named} "
            f"repair {session}` (`--dry-run` first shows what it keeps and drops; the damaged log is kept aside)"
        )
        #: What is wrong, without the session's name or the advice (for a report that names the session).
        self.why = why
        self.session = session
        self.line = line
        self.offset = offset
        #: The damaged log, relative to the store's root (None where the backend names no file).
        self.path = path
        #: The damaged store, as ``--store`` names it (None where the raiser did not know it).
        self.store = store

    def in_store(self, store: str) -> SessionDamagedError:
        """The same damage, its advice naming ``store`` (a layer that knows the store and
        meets the error raised below it without one)."""
        if self.store is not None:
            return self
        out = SessionDamagedError(self.why, session=self.session, line=self.line, offset=self.offset, path=self.path,
                                  store=store)
        out.__traceback__ = self.__traceback__
        return out

    @classmethod
    def header_lost(cls, session: str, path: str, store: str | None = None) -> SessionDamagedError:
        """A session the store holds whose header file (``path``) is gone: it is listed no
        more, but it is damage, which repair makes good, not an absent session."""
        return cls("its header file is missing; the store lists it no more", session=session, line=0, offset=0,
                   path=path, store=store)

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out["error"].update(session=self.session, file=self.path)
        return out


class SweepRefusedError(StoreError):
    """A sweep that stopped before deleting anything: a session's log is damaged, or lost
    what its head names, so what it names cannot be told (and ``repair`` takes the lost
    entries back from the objects while they are held). The code is the damaged session's:
    a script's next step is the same, ``repair`` of :attr:`session`."""

    code = "session_damaged"

    def __init__(self, message: str, *, session: str):
        super().__init__(message)
        self.session = session


class BaseNotHeldError(StoreError, NoSuchEntryError):
    """A fork whose base is an entry the store does not hold (in a log or on a prefix)."""

    code = "no_entry"
    status = 404


class BadBaseError(StoreError):
    """A fork (or a pushed or imported one) whose base may not be one: a ``leaf`` label,
    an entry not yet committed, one below a merge, or a base owned with other media."""

    code = "bad_base"
    status = 422

    @classmethod
    def no_head(cls, session: str) -> BadBaseError:
        """A fork asked for at the head of a session that has none (``Store.fork`` at no
        entry, ``create --base ID``): one wording wherever a session stands for its head."""
        return cls(f"session {session} has no head to fork at; name an entry")


class MirrorError(StoreError):
    """A local append or head move on a session this store is a mirror of."""

    code = "mirror"
    status = 409


class SupersededError(StoreError):
    """An append to a session a ``continued_in`` link retired: its record goes on in
    the successor (``successor``), and a store refuses to fork the chain."""

    code = "superseded"
    status = 409

    def __init__(self, message: str, *, session: str | None = None, successor: str | None = None):
        super().__init__(message)
        self.session = session
        self.successor = successor

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out["error"].update(session=self.session, successor=self.successor)
        return out


class RedactionError(AgentSessionError):
    """A redaction that cannot be made: a pattern that is no regular expression, a
    file that does not verify or is redacted already, or a rewrite that makes two
    entries (or two paths of an env entry) one."""

    code = "redaction"
    status = 422


class NormalisationError(AgentSessionError, ValueError):
    """A value no normalisation makes I-JSON (RFC 0001: a number not finite in binary64,
    an object repeating a member name), or one a writer may not normalise (a member name
    a pointer cannot record, a body normalised already)."""

    code = "bad_entry"
    status = 422


class ContinuationError(StoreError):
    """A chain of ``continued_in`` links that cannot be followed to its end: a cycle,
    or longer than the bound a walk allows."""

    code = "continuation"
    status = 409


class HeadMovedError(StoreError):
    """A head compare-and-swap whose expectation was wrong: the head moved. Raised with
    ``current=`` the head the store holds (None: no head), it says it: ``knows_current``
    is then true, and RFC 0003's problem body carries it as ``current``."""

    code = "head_moved"
    status = 409

    def __init__(self, message: str, **current: str | None):
        if set(current) - {"current"}:
            raise TypeError(f"HeadMovedError takes current= only, not {sorted(current)}")
        super().__init__(message)
        self.knows_current = "current" in current
        self.current = current.get("current")


class AppendRefusedError(StoreError, EntryError):
    """An append (or an import, or a pushed entry) the rules refuse. ``rule`` is the
    rule's code from :data:`agentsession_cas.format.rules.RULES` (the code ``verify``
    reports for the same bytes); ``code`` is the refusal's protocol code
    (``bad_entry``, ``base_rule``, ``call_id_repeated``, ``synthetic``, ...)."""

    code = "bad_entry"
    status = 422

    def __init__(self, message: str, *, rule: str | None = None, code: str | None = None, entry: str | None = None):
        super().__init__(message)
        self.rule = rule
        self.entry = entry
        if code is not None:
            self.code = code

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out["error"].update(rule=self.rule, entry=self.entry)
        return out


def not_an_entry_id(value: object, *, rule: str | None = None, code: str | None = None) -> AppendRefusedError:
    """The refusal of what an entry's place holds (a pushed entry, a head target) and is no
    entry id: one wording for the store, the exchange's receiver and the server (``rule``
    and ``code`` as :class:`AppendRefusedError` takes them: ``bad_entry`` by default)."""
    return AppendRefusedError(f"{quoted(value)} is not an entry id ({HASH_FORM})", rule=rule, code=code)


class NoSuchObjectError(StoreError, LookupError):
    """An object the store does not hold. ``unread`` names what might hold it but could
    not be read (a pack the process may not open): then the object may not be lost."""

    code = "no_object"
    status = 404
    unread: str | None = None


class CorruptObjectError(StoreError):
    """An object whose bytes do not hash to its name; never served."""

    code = "corrupt_object"
    status = 500

    def __init__(self, message: str, *, space: str, name: str, path: str):
        super().__init__(message)
        self.space = space
        self.name = name
        self.path = path


class CorruptPackError(StoreError):
    """A pack or its index fails its checksum or is not laid out as it says;
    nothing in it is served until it is repaired (``fsck`` names the file)."""

    code = "corrupt_pack"
    status = 500

    def __init__(self, message: str, *, path: str):
        super().__init__(message)
        self.path = path


# -- refs (agentsession_cas/refs.py) ---------------------------------------------


class BadRefNameError(BadNameError):
    """A ref name (or listing prefix) that RFC 0002's rules on names refuse, whatever the store holds."""

    code = "ref_name"
    status = 400


class RefConflictError(BadRefNameError):
    """A new ref name that clashes with one the store holds: one under the other, or a case-only difference."""

    code = "ref_name"
    status = 400

    def __init__(self, message: str, *, name: str, existing: str):
        super().__init__(message)
        self.name = name
        self.existing = existing


class NoSuchRefError(StoreError, LookupError):
    """The store holds no ref by that name."""

    code = "no_ref"
    status = 404


class RefMovedError(StoreError):
    """A ref compare-and-swap whose expectation was wrong. ``current`` is the session the
    ref holds (None when it is absent); ``expected`` the one the caller named."""

    code = "ref_moved"
    status = 409

    def __init__(self, message: str, *, name: str, expected: str | None, current: str | None):
        super().__init__(message)
        self.name = name
        self.expected = expected
        self.current = current


class DanglingRefError(NoSuchSessionError):
    """A ref whose session is gone, or was deleted and created again under its id.
    ``session`` is the id the ref holds, so a caller can tell which and move the ref."""

    code = "ref_dangling"
    status = 409

    def __init__(self, message: str, *, name: str, session: str, state: str):
        super().__init__(message)
        self.name = name
        self.session = session
        self.state = state


# -- exchange between stores (agentsession_cas/exchange.py, transport.py) ----------


class OutputError(AgentSessionError, OSError):
    """A file the user named to write cannot be written (its directory is missing, it
    is a directory, permission is denied); the message names the user's path."""

    code = "output"
    status = 400


class AmbiguousNameError(StoreError, LookupError):
    """A prefix that names more than one session or entry; the message lists them."""

    code = "ambiguous"
    status = 400

    def __init__(self, message: str, *, candidates: list[str] | None = None):
        super().__init__(message)
        self.candidates = list(candidates or [])

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out["error"]["candidates"] = self.candidates
        return out


class UnsupportedError(StoreError):
    """A feature or URL scheme this store (or this release) does not serve."""

    code = "unsupported"
    status = 501


class TransportError(StoreError):
    """A remote that cannot be reached or named: an unsupported URL scheme, no store there,
    or the local store itself given as its own remote."""

    code = "transport"
    status = 502


class NotRecordError(StoreError):
    """A push (or handover) from a store that is not the session's record here (RFC 0002:
    only the record may initiate a push)."""

    code = "not_record"
    status = 409


class HeaderDiffersError(StoreError):
    """The receiver holds another session under the pushed id: the headers differ apart
    from ``format``, and two sessions alike only in id are not one session."""

    code = "header_differs"
    status = 409


class BadObjectError(StoreError):
    """Bytes sent under a name they do not hash to; nothing of them was stored."""

    code = "bad_object"
    status = 422


class MissingObjectsError(StoreError):
    """A push names objects the receiver cannot find; nothing was admitted.
    ``missing`` maps a space (entries, contents, blobs) to the hashes it lacks."""

    code = "missing_object"
    status = 409

    def __init__(self, message: str, *, missing: dict[str, list[str]]):
        super().__init__(message)
        self.missing = {space: list(names) for space, names in missing.items()}


class IncompletePushError(StoreError):
    """A push that sent only what the sender believed new, to a receiver that lacks what it
    builds on (its session, or a parent): nothing was admitted, and the sender pushes
    again with the whole closure."""

    code = "incomplete_push"
    status = 409


class HandoverIncompleteError(StoreError):
    """A handover or take-back stopped between its two steps: both stores hold the session
    as its record (never neither). Running the same command again finishes it."""

    code = "handover_incomplete"
    status = 500


# -- the HTTP protocol (agentsession_cas/server, exchange/http_client.py) ------------


class AuthError(AgentSessionError):
    """A request to a server without a token it accepts (RFC 0003: 401 ``auth``)."""

    code = "auth"
    status = 401


class ScopeError(AgentSessionError):
    """A request whose token lacks the scope it needs, or names a session outside the
    token's ``sessions`` prefix (RFC 0003: 403 ``scope``)."""

    code = "scope"
    status = 403


class InsecureListenError(AgentSessionError):
    """``serve`` asked to listen beyond loopback without what RFC 0003 requires there:
    bearer tokens (``--auth``) and TLS (``--tls-cert``/``--tls-key``, or
    ``--behind-tls-proxy`` where a proxy in front terminates it). Nothing was bound."""

    code = "insecure_listen"
    status = 500


class SessionReplacedError(StoreError):
    """The session under this id is another incarnation than the caller's
    ``If-Incarnation`` names: deleted and created again since it looked."""

    code = "session_replaced"
    status = 409


class LeaseLostError(StoreError):
    """A write (or renew) whose lease is not the session's current, unexpired one: it
    expired, was released, broken or taken by another holder (fencing)."""

    code = "lease_lost"
    status = 409


class TooLargeError(AgentSessionError):
    """A request body past the server's published limit; nothing of it was used."""

    code = "too_large"
    status = 413


class FormatVersionError(StoreError):
    """A writer's format minor (``Session-Format``) this store does not read, or one
    earlier than the session's (RFC 0002: a later writer raises it, never lowers it)."""

    code = "format"
    status = 422


class BadRefTargetError(StoreError):
    """A pushed ref whose ``next`` is not the pushed session (RFC 0003, Exchange)."""

    code = "bad_ref_target"
    status = 422
