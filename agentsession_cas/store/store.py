"""The store: content-addressed objects, and sessions as refs whose logs are their commit point.

A :class:`Store` is RFC 0002's rules over a backend
(:mod:`agentsession_cas.backends`): a directory (the default), memory, or any
other class implementing the seam. It creates, opens and deletes sessions,
serves entries from objects, forks, projects and imports; the session itself
is :mod:`.session`. Nothing here touches a file: reading a projection or its
sidecar blobs is the format core's, keeping bytes is the backend's.

One writer holds a session at a time; a read-only store takes no hold and
writes nothing.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from os import PathLike, fspath
from typing import TYPE_CHECKING, Any

from ..backends import DEFAULT_STORE, default_store_path, open_backend
from ..backends.base import (
    SPACES,
    Backend,
    CreatedRecords,
    LogHistory,
    Mark,
    ObjectStage,
    ObjectStore,
    ReadyStage,
    RepackResult,
    Space,
)
from ..backends.digests import EntryDigests
from ..errors import (
    AgentSessionError,
    AppendRefusedError,
    BadArgumentError,
    BadBaseError,
    BadNameError,
    BaseNotHeldError,
    CorruptObjectError,
    FormatVersionError,
    IJSONError,
    NoSuchObjectError,
    NoSuchSessionError,
    Problem,
    ReadOnlyError,
    SessionExistsError,
    SessionFormatError,
    StoreError,
    SupersededError,
    not_an_object_name,
    quoted,
    unknown_object_space,
)
from ..format.canonical import canonical_bytes, loads_flagged
from ..format.entry import FORMAT_WRITTEN, Entry, Header, header_member_problem, parse_format, short_id
from ..format.hashing import HASH_PREFIX, common_envelopes, entry_objects, is_hash, sha256_ref
from ..format.links import continued_in_link, fork_of_link
from ..format.media import sidecar_blob, sidecar_dir, sidecar_names, write_projection
from ..format.names import check_session_id
from ..format.timestamps import now_ts
from ..lean import dataclass
from ..progress import Progress, reported
from .links import CHAIN_LIMIT, Chain, resolve_current
from .own import OwnOrder
from .refs import header_ident
from .session import (
    SYNTHETIC_REFUSED,
    AppendResult,
    Session,
    _ProjectionWalk,
    _resume_tree,
    carries_synthetic,
    entry_from_objects,
    envelope_parts,
    iter_up,
    walk_up,
)
from .state import index_damage, replay
from .summary import SessionSummary, SummaryBuilder

if TYPE_CHECKING:
    from ..format.reader import SessionFile
    from ..maintenance.sweep import SweepResult

# The reader, the rule set and sweep are imported by the methods that use them (import,
# sweep), so opening a store to read a head or list sessions does not load them.

__all__ = [
    "DEFAULT_STORE", "SYNC_POLICIES", "AppendResult", "HeadAdjusted", "Session", "Store", "check_fork_of",
    "check_new_header", "default_store_path",
]


def check_new_header(header: Header, where: str, *, made: bool = False) -> None:
    """Refuse a header no store may take as a new session's (a create, a push or fetch of
    a session the store lacks): a format it does not read, or one before 0.5 (before
    hashed ids, which a store holds), is :class:`FormatVersionError` (RFC 0003's
    ``format``); any other problem is :class:`SessionFormatError` with the problems.
    ``made``: a header the store makes (a create, a fork, a continue, the recorder's),
    also held to the rules whose store policy is ``keep`` (``header-member``: a member
    of another form than RFC 0001's), which a header a session already has (an import,
    a push, a fetch) is kept with, byte for byte, and reported (``Header.member_problems``)."""
    problems = header.problems()
    if any(p.code == "format" for p in problems):
        raise FormatVersionError(str(SessionFormatError(where, problems)))
    if made:
        problems += header.member_problems()
    if problems:
        raise SessionFormatError(where, problems)
    if header.is_legacy:
        raise FormatVersionError(f"{where}: format {header.format} is before 0.5; a store holds hashed entries")

def check_fork_of(header: Header, owner_id: str, owner_header: Header, *, owns: bool = True) -> None:
    """Refuse a fork (created, imported or pushed) whose header the session holding its
    base forbids (RFC 0002 "Sessions"): ``media`` other than that session's, since the
    prefix was written in one form; or, when that session's own entries include the base
    (``owns``), a ``format`` earlier than its, since the prefix was written under that
    one. :class:`BadBaseError` (``bad_base``) either way: the one place of the rule."""
    if owner_header.media != header.media:
        raise BadBaseError(
            f"media {header.media!r} differs from {owner_header.media!r} of session {owner_id}, which holds the base"
        )
    fmt, owner_fmt = parse_format(header.format), parse_format(owner_header.format)
    if owns and fmt and owner_fmt and fmt < owner_fmt:
        raise BadBaseError(f"a fork's format {header.format} may not be earlier than {owner_header.format} of {owner_id}")


def synthetic_refusal(source: str, entry: Entry, markers: Container[str]) -> AppendRefusedError | None:
    """What an import refuses of an entry it keeps (``markers``: the synthetic markers the
    file held, which an import discards): a label carrying ``synthetic`` that is no marker
    (:func:`~.session.carries_synthetic`, as an append and a push refuse it), or an entry
    hanging from a marker, which would name a parent the store does not hold."""
    where = f"{source}: line {entry.line}: " if entry.line is not None else f"{source}: "
    if entry.parent is not None and entry.parent in markers:
        return AppendRefusedError(
            f"{where}entry {short_id(entry.id)} hangs from {short_id(entry.parent)}, a synthetic marker, which an "
            "import discards (it is the projection's, not an entry): the entry would name a parent the store does not hold",
            rule="synthetic", code="synthetic", entry=entry.id,
        )
    if carries_synthetic(entry.type, entry.data):
        return AppendRefusedError(f"{where}entry {short_id(entry.id)}: {SYNTHETIC_REFUSED} (only a projection's marker, "
                                  "synthetic: true, is discarded at import)", rule="synthetic", code="synthetic",
                                  entry=entry.id)
    return None


#: When an append is made durable before it returns.
SYNC_POLICIES = ("always", "responses", "never")


class Store:
    """A store over a backend, opened read-only or for writing.

    ``Store(path)`` opens a store directory; ``Store(backend)`` any backend
    (:func:`agentsession_cas.open_store` makes one from a URL). Use as a
    context manager; sessions opened through a writing store are committed and
    released when it closes. ``sync`` is the default policy for appends:
    ``always`` (every append durable before it returns), ``responses``
    (durable on responses, function call outputs, compactions, branch
    summaries and the record types the header names) or ``never`` (durable at
    :meth:`Session.commit` and close, and for the record types the header
    names, which RFC 0001 requires durable before their side effect).
    """

    def __init__(self, target: str | PathLike[str] | Backend | None = None, *, readonly: bool = False, sync: str = "always"):
        if sync not in SYNC_POLICIES:
            raise BadArgumentError(f"unknown sync policy {quoted(sync)}: use one of {', '.join(SYNC_POLICIES)}")
        if isinstance(target, Backend):
            self.backend = target
        else:
            self.backend = open_backend(target if target is not None else default_store_path(), readonly=readonly)
        self.sync = sync
        self._open: dict[str, Session] = {}

    @classmethod
    def init(cls, target: str | PathLike[str] | None = None, **kwargs: Any) -> Store:
        """Create a store (or open the one already there), open for writing."""
        readonly = kwargs.pop("readonly", False)
        return cls(open_backend(target if target is not None else default_store_path(), create=True, readonly=readonly), **kwargs)

    # -- the store ---------------------------------------------------------------------

    @property
    def readonly(self) -> bool:
        return self.backend.readonly

    @property
    def objects(self) -> ObjectStore:
        """The backend's object store (see :class:`~agentsession_cas.backends.base.ObjectStore`)."""
        return self.backend.objects

    @property
    def root(self) -> str | None:
        """The directory of a file store (None for a store held elsewhere)."""
        return getattr(self.backend, "root", None)

    @property
    def url(self) -> str:
        return self.backend.url

    def describe(self) -> str:
        """The store named for a message: "the store at /path", "the memory store"."""
        return self.backend.describe()

    def no_session(self, session_id: str) -> NoSuchSessionError:
        """The error for a session id this store does not hold, naming the store."""
        return NoSuchSessionError(f"no such session: {session_id} (none in {self.describe()})")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Commit and release every session this store opened for writing, then the backend."""
        errors: builtins.list[BaseException] = []
        for session in list(self._open.values()):
            try:
                session.close()
            except (AgentSessionError, OSError) as exc:  # keep closing the others
                errors.append(exc)
        self._open.clear()
        try:
            self.backend.close()
        except (AgentSessionError, OSError) as exc:
            errors.append(exc)
        if errors:
            raise errors[0]

    def _forget(self, session: Session) -> None:
        if self._open.get(session.id) is session:
            del self._open[session.id]

    def _require_writable(self) -> None:
        if self.readonly:
            raise ReadOnlyError(f"{self.describe()} is open read-only")

    def pack(self, **kwargs: Any) -> RepackResult:
        """Repack every object into one pack (``agentsession pack``), where the backend packs."""
        self._require_writable()
        pack = getattr(self.backend, "pack", None)
        if pack is None:
            nothing = RepackResult()
            nothing.note("own-storage", f"{self.describe()} keeps its objects its own way: there is nothing to pack")
            return nothing
        result: RepackResult = pack(**kwargs)
        return result

    def sweep(self, **kwargs: Any) -> SweepResult:
        """Remove what nothing retained names (``agentsession sweep``); see
        :func:`agentsession_cas.maintenance.sweep.sweep`."""
        from ..maintenance.sweep import sweep

        if not kwargs.get("dry_run"):
            self._require_writable()
        return sweep(self, **kwargs)

    # -- sessions ---------------------------------------------------------------------

    def list(self) -> builtins.list[str]:
        """The ids of the sessions held, sorted."""
        return self.backend.sessions.list()

    def __contains__(self, session_id: object) -> bool:
        try:
            return self.backend.sessions.exists(check_session_id(session_id))
        except BadNameError:
            return False

    def session(self, session_id: str) -> Session:
        """Open a session: for writing (held, recovered) or, on a read-only store, as a snapshot."""
        check_session_id(session_id)
        if session_id in self._open:
            return self._open[session_id]
        if session_id not in self:
            raise self.no_session(session_id)
        session = Session._open(self, session_id, writable=not self.readonly)
        self._open[session_id] = session
        return session

    open = session

    def read(self, session_id: str) -> Session:
        """A read-only snapshot of a session, taking no hold, whatever the store's mode."""
        check_session_id(session_id)
        if session_id not in self:
            raise self.no_session(session_id)
        return Session._open(self, session_id, writable=False)

    def history(self, session_id: str) -> LogHistory:
        """A session's log as held now, without recovery (``agentsession log``), with the
        damage a line's checksum cannot show added to what the backend found: records
        that contradict each other and a head index leading the log (committed records
        lost: a log cut short at a record boundary reads cleanly line by line)."""
        history = self.backend.sessions.history(check_session_id(session_id))
        if history.damage:
            return history  # the replay of a log that does not read would only repeat it
        records = history.records if history.tail_from is None else history.records[: history.tail_from]
        state = replay(records)
        after = history.positions[len(records) - 1][0] + 1 if history.positions and records else len(records) + 1
        for code, why in state.damage:
            history.damaged(code, why, after)
        lost = index_damage(state, history.head_index, history.length_index, summary=history.summary)
        if lost is not None:
            history.damaged("log-cut", lost, after)
        return history

    def summary(self, session_id: str) -> SessionSummary:
        """What ``list`` shows of a session (:class:`~.summary.SessionSummary`): the summary
        the backend keeps when it describes the log as it is, without reading the log;
        else the log replayed and the summary kept brought up to date (only the entries
        appended since it are read; all of them when none was kept)."""
        check_session_id(session_id)
        held = self._open.get(session_id)
        if held is not None:
            return held.summary()
        kept = self.backend.sessions.summary(session_id)
        if kept is not None and kept[1]:
            s = SessionSummary.from_dict(kept[0])
            if s is not None and s.id == session_id:
                return s
        session = self.read(session_id)
        try:
            return session.summary()
        finally:
            session.close()

    def header(self, session_id: str) -> Header:
        """A session's header, read alone (one small read)."""
        raw = self.backend.sessions.header(check_session_id(session_id))
        if raw is None:
            raise self.no_session(session_id)
        try:
            data, _ = loads_flagged(raw)
        except (ValueError, AgentSessionError) as exc:
            raise StoreError(f"session {session_id}: its header here is unreadable: {exc}") from None
        if not isinstance(data, dict):
            raise StoreError(f"session {session_id}: its header here is not a JSON object")
        return Header(data)

    def session_ident(self, session_id: str) -> str:
        """The ident of a session's incarnation (see :func:`~.refs.header_ident`)."""
        return header_ident(self.header(session_id).data)

    def create(self, header: Header | Mapping[str, Any], *, record: bool = True, given: bool = False) -> Session:
        """Create a session from its header, in one step that fails if the id is held.

        A fork names a ``base`` the store holds, that is not a ``leaf`` label,
        with the media of the session owning it. Returns the new session,
        open for writing. ``given``: the header is one a session already has, which
        its maker checked (a server's create, asked by a client's store for an import
        of a header alone): a member of another form than RFC 0001's is kept, as an
        import keeps it (``header_findings``), not refused as a header made here is.
        """
        if not isinstance(header, (Header, Mapping)):  # (the caller's mistake, said before read-only)
            raise BadArgumentError(f"a header is a Header or a JSON object (a dict), not {type(header).__name__}: "
                                   f"{quoted(header)}")
        self._require_writable()
        header = header if isinstance(header, Header) else Header(dict(header))
        header = self._checked_new_header(header, made=not given)
        if header.base is None:
            session = self._create(header, own=[], head=None, record=record)
        else:
            owner = self.holder_of(header.base)
            # The session owning the base is the one a fork at its head starts its rules from.
            origin = None
            if owner is not None and owner.owns:
                origin = owner.snapshot if owner.snapshot is not None else self._open.get(owner.session)
            session = self._create_fork(header, owner, record=record, origin=origin)
        session.header_findings = header.member_problems() if given else []
        return session

    def _create_fork(self, header: Header, owner: Holder | None, *, record: bool, origin: Session | None = None) -> Session:
        """Create a fork (its header checked, ``owner`` the session holding its base, closed
        here); its rules start from the state of ``origin``, the session it is made from
        (open until then), where that stands for the fork's prefix (:meth:`Session.fork_rules`)."""
        if owner is not None and header.data.get("parent_session") is None:
            # RFC 0001: parent_session names the session a fork was made from; the
            # caller who names none gets the session holding the base.
            header = Header({**header.data, "parent_session": owner.session})
        try:
            prefix = self._prefix_for_base(header, owner)
            # The owner stays open until the fork is made: a prefix entry another process
            # holds only in its log so far is served from the snapshot, and made durable.
            fork = self._create(header, own=[], head=header.base, record=record, prefix=prefix)
            rules = origin.fork_rules(fork.header) if origin is not None else None
        finally:
            if owner is not None:
                owner.close()
        if rules is not None:
            fork.start_rules(rules)
        return fork

    def fork(
        self,
        origin: str,
        at: str | None = None,
        *,
        session_id: str | None = None,
        header: Mapping[str, Any] | None = None,
        link: bool = False,
    ) -> Session:
        """Fork session ``origin`` at entry ``at`` (its head by default): a new session
        whose base is that entry, whose header names ``origin`` as ``parent_session``
        unless ``header`` names one, with the origin's ``media`` and ``payload``. ``link`` also appends
        a ``fork_of`` link naming ``origin`` as the fork's first entry (RFC 0001: the
        session it was made from, which the header's provenance may not say). Returns
        the fork, open for writing."""
        self._require_writable()
        if header is not None and not isinstance(header, Mapping):  # (the caller's, before anything is read)
            raise BadArgumentError(f"a fork's header members are a JSON object (a dict), not "
                                   f"{type(header).__name__}: {quoted(header)}")
        held = self._open.get(origin)  # open here: its head may be an append not yet committed
        o = held if held is not None else self.read(origin)
        try:
            base = o.head if at is None else at
            if base is None:
                raise BadBaseError.no_head(origin)
            if base not in o and base != o.base and base not in o.prefix_set:
                raise BaseNotHeldError(f"entry {base} is not on session {origin} (its own entries, base or prefix)")
            media, payload = o.header.data.get("media"), o.header.payload
            data: dict[str, Any] = dict(header or {})
            if session_id is not None:
                data["id"] = session_id
            data.setdefault("id", str(uuid.uuid4()))
            data["base"] = base
            data.setdefault("parent_session", origin)
            if media is not None:
                data.setdefault("media", media)
            if payload is not None:
                data.setdefault("payload", payload)
            # The origin holds the base (an own entry, or on its prefix): no scan of the
            # store for its holder, and the origin stays open until the fork is made.
            fork = self._create_fork(self._checked_new_header(Header(data), made=True), self._holder_in(o, base), record=True,
                                     origin=o)
        finally:
            if held is None:
                o.close()
        if link:
            try:
                fork.append(fork_of_link(origin))
            except BaseException:
                fork.close()
                raise
        return fork

    def continue_session(
        self, session_id: str, *, successor_id: str | None = None, summary: Mapping[str, Any] | None = None
    ) -> Session:
        """Roll session ``session_id`` over into a successor (RFC 0003 Continue): a new
        session naming it as ``parent_session``, with its ``harness``, ``cwd``,
        ``records``, ``media`` and ``payload``, whose first entry is a full ``config``
        of the settings in force at the old head (and ``summary``, an item, after it);
        then a ``continued_in`` link appended to the old session, which retires it.
        A session continued already is refused (:class:`SupersededError`), and when
        the link cannot be appended the successor is deleted. Returns the successor,
        open for writing."""
        if summary is not None and not isinstance(summary, Mapping):
            raise BadArgumentError(f"a summary is an item, a JSON object (a dict), not {type(summary).__name__}: "
                                   f"{quoted(summary)}")
        old = self.session(session_id)
        if old.superseded_by is not None:
            raise SupersededError(f"session {session_id} was continued in {old.superseded_by} already; continue that one",
                                  session=session_id, successor=old.superseded_by)
        from ..format.builders import config_from_settings  # the context machinery: not for head or list
        from ..format.context import build_context

        settings = build_context(self.path_to(old.head)).settings if old.head is not None else None
        # A member the old header holds in another form than RFC 0001's (a session stored
        # before the header-member rule: cwd null, say) is not copied: the successor's
        # header is one this store makes, held to every header rule; the old keeps its own.
        kept = {k: v for k, v in old.header.data.items()
                if k in ("harness", "cwd", "records", "media") and header_member_problem(k, v) is None}
        header = Header.new(successor_id or str(uuid.uuid4()), parent_session=session_id, **kept)
        if old.header.payload is not None:
            header.data["payload"] = old.header.payload
        new = self.create(header)
        try:
            if settings is not None and settings.as_dict():
                new.append(config_from_settings(settings))
            if summary is not None:
                new.append({"type": "item", "item": dict(summary)})
            old.append(continued_in_link(new.id))
        except BaseException:
            new.close()
            self.delete(new.id)
            raise
        return new

    def resolve_current(self, session_id: str, *, limit: int = CHAIN_LIMIT) -> Chain:
        """The current session of the chain of continuations ``session_id`` starts
        (:func:`~agentsession_cas.store.links.resolve_current`)."""
        return resolve_current(self, session_id, limit=limit)

    @staticmethod
    def _defaulted_header(header: Header) -> Header:
        """The header with what a store fills in when it is absent (type, format, creation
        time); a header already so is returned as it is."""
        data = dict(header.data)
        data.setdefault("type", "session")
        data.setdefault("format", FORMAT_WRITTEN)
        data.setdefault("created_at", now_ts())
        return header if data == header.data else Header(data)

    def _checked_new_header(self, header: Header, *, made: bool = False) -> Header:
        """The header a new session is created with, defaulted and checked
        (:func:`check_new_header`; ``made``: the store makes it, not an import)."""
        header = self._defaulted_header(header)
        check_new_header(header, "header", made=made)
        check_session_id(header.id)
        if header.data.get("redacted") is not None:
            raise StoreError("a redacted session is a record to read, not one to hold (RFC 0002)")
        if header.id in self:
            raise SessionExistsError(f"session {header.id} already exists in {self.describe()}")
        try:
            canonical_bytes(header.data)
        except IJSONError as exc:  # the caller's header, not the store's fault (it was a 500)
            raise IJSONError(f"header is not I-JSON: {exc}") from None
        return header

    def _prefix_for_base(self, header: Header, owner: Holder | None) -> builtins.list[tuple[str, str]]:
        """(id, content hash) root..base, checked: held, not a leaf label, committed, same
        media, not below a merge. Only envelopes are read along the way (and the base
        whole), so a fork deep in a long session costs one small read per entry."""
        base = header.base
        assert base is not None
        if owner is None:
            raise BaseNotHeldError(f"base {base} is not an entry this store holds (in a log or on a prefix)")
        owner_id, owner_header, committed = owner.session, owner.header, owner.committed
        if not committed:
            raise BadBaseError(f"base {short_id(base)} is not yet committed in session {owner_id}; commit it first")
        check_fork_of(header, owner_id, owner_header, owns=owner.owns)
        if self.entry(base).is_leaf_label:
            raise BadBaseError(f"base {short_id(base)} is a leaf label; the base is a fork's first head")

        def step(eid: str) -> tuple[tuple[str, str, Any], str | None]:
            env = self.envelope(eid)  # (kept: its id, content and any parents, not the whole envelope)
            return (eid, env.get("content", ""), env.get("parents") or None), _parent_of(env)

        chain = walk_up(base, step)
        converging = [Entry({"id": i, "parents": p}, computed_id=i, content_hash=c) for i, c, p in chain if p is not None]
        if converging:
            self.check_prefix_readable(converging, owner_id, on_path={i for i, _, _ in chain})
        return [(i, c) for i, c, _ in chain]

    @staticmethod
    def check_prefix_readable(
        path: builtins.list[Entry], origin: str | None, on_path: Container[str] | None = None
    ) -> None:
        """Refuse a base below a merge: a prefix entry whose ``parents`` names, in this
        session, an entry off the path would make a projection no reader can read
        (RFC 0002, open questions; the reference refuses it too). ``on_path`` holds the
        path's ids when ``path`` holds only the entries naming ``parents``."""
        if on_path is None:
            on_path = {e.id for e in path}
        for e in path:
            for ref in e.parents:
                if (ref.session is None or ref.session == origin) and ref.entry not in on_path:
                    raise BadBaseError(
                        f"base is below a merge: prefix entry {short_id(e.id)} converges {short_id(ref.entry)}, "
                        "which is off the path, so the fork's file could not be read"
                    )

    def holder_of(self, entry_id: str) -> Holder | None:
        """The session whose own entries (else whose prefix) hold ``entry_id``. Scans the
        store, which only creating a fork or importing one needs. A session open here is
        committed and checkpointed first, so the fork finds its objects; one read as a
        snapshot to find it is kept open in the answer, for the caller to close."""
        on_prefix: Holder | None = None
        for sid in self.list():
            s = self._open.get(sid)
            if s is not None:
                if entry_id in s.own:
                    if on_prefix is not None:
                        on_prefix.close()
                    return self._holder_in(s, entry_id)
                if on_prefix is None and (entry_id in s.prefix_set or entry_id == s.base):
                    on_prefix = Holder(sid, s.header, True, False, None)
                continue
            try:
                s = self.read(sid)
            except AgentSessionError:
                continue
            if entry_id in s.own:
                if on_prefix is not None:
                    on_prefix.close()
                return self._holder_in(s, entry_id, s)
            if on_prefix is None and (entry_id in s.prefix_set or entry_id == s.base):
                on_prefix = Holder(sid, s.header, True, False, s)
            else:
                s.close()
        return on_prefix

    @staticmethod
    def _holder_in(s: Session, entry_id: str, snapshot: Session | None = None) -> Holder:
        """``s`` as the holder of ``entry_id``, an own entry of it or on its prefix (the
        base included). A session open here for writing is committed and checkpointed
        first when it owns the entry, so the fork finds its objects."""
        if entry_id not in s.own:
            return Holder(s.id, s.header, True, False, snapshot)
        if s.writable and not s.closed:
            s.commit()
            s.checkpoint()
            return Holder(s.id, s.header, True, True, snapshot)
        return Holder(s.id, s.header, s.is_committed(entry_id), True, snapshot)

    def opened(self, session_id: str) -> Session | None:
        """The session if this store has it open for writing, else None."""
        return self._open.get(session_id)

    def exchange_create(self, header: Header, *, prefix: builtins.list[str], record: bool) -> Session:
        """Create the session a push or fetch brings, from the pushed header, with the
        base as its head (or none) and no own entries yet; committed, open for writing.
        ``prefix`` (root..base) names entries whose objects the caller has already made
        durable and checked as admission requires."""
        header = self._checked_new_header(header)
        session = self._create(header, own=[], head=header.base, record=record)
        session.prefix = list(prefix)
        return session

    def _create(
        self,
        header: Header,
        *,
        own: Sequence[str],
        leaf_labels: Collection[str] = (),
        head: str | None,
        record: bool,
        prefix: Sequence[tuple[str, str]] = (),
        objects: Iterable[tuple[Space, str, bytes]] = (),
    ) -> Session:
        """Create a session whole through the backend: its create record, its own
        entries' appends (``own``: their ids, those in ``leaf_labels`` leaf labels; their
        objects in ``objects``), the head and a commit."""
        mark: Mark = "record" if record else "mirror"
        create: dict[str, Any] = {"op": "create", "session": header.id, "base": header.base, "mark": mark}
        records = CreatedRecords(create, EntryDigests.of(own), leaf_labels, head)
        del own  # (an import's ids as digests already: the records hold them, and no Append each)
        log = self.backend.sessions.create(
            header.id, header.canonical_line(), records, objects, head=head, mark=mark, prefix=prefix
        )
        session = Session._created(self, header.id, log, header, records)
        session.prefix = [eid for eid, _ in prefix]
        self._open[header.id] = session
        return session

    def delete(self, session_id: str) -> None:
        """Remove a session in one step (its log and header; objects stay for a sweep)."""
        self._require_writable()
        check_session_id(session_id)
        session = self._open.get(session_id)
        if session is not None:
            session._closed = True  # no append while it goes
            try:
                self.backend.sessions.delete(session_id, session.log)
            except AgentSessionError:
                session._closed = False  # refused (a mirror held over RFC 0003): the handle stays as it was
                raise
            del self._open[session_id]
            session._drop_pending()
            return
        if session_id not in self:
            raise self.no_session(session_id)
        self.backend.sessions.delete(session_id)

    # -- objects and entries ------------------------------------------------------------

    def _get(self, space: Space, name: str) -> bytes:
        """An object's verified bytes, as every read of one by its name here gets them: a
        name that is none (whatever the backend would say of it) is ``bad_name``."""
        try:
            return self.objects.get(space, name)
        except (NoSuchObjectError, TypeError):  # (TypeError: a name given that is no string)
            _refuse_no_names((name,))
            raise

    def _get_many(self, space: Space, names: Sequence[str]) -> builtins.list[bytes]:
        """:meth:`_get` of each name, in one :meth:`ObjectStore.get_many`."""
        try:
            return self.objects.get_many(space, names)
        except (NoSuchObjectError, TypeError):
            _refuse_no_names(names)
            raise

    def envelope(self, entry_id: str) -> dict[str, Any]:
        """An entry's envelope, parsed and checked to be one."""
        return self._envelope(entry_id, self._get("entries", entry_id))

    def _envelope(self, entry_id: str, env_bytes: bytes) -> dict[str, Any]:
        """:meth:`envelope` of the bytes read for it."""
        env, _ = envelope_parts(env_bytes, entry_id, self.objects)
        parent = env.get("parent")
        if parent is not None and not is_hash(parent):
            where = self.objects.where("entries", entry_id)
            raise CorruptObjectError(
                f"envelope {entry_id} names parent {parent!r}, not an entry id", space="entries", name=entry_id, path=where
            )
        return env

    def entry(self, entry_id: str) -> Entry:
        """An entry rebuilt from its envelope and content objects, both verified."""
        env_bytes = self._get("entries", entry_id)
        env, env_careful = envelope_parts(env_bytes, entry_id, self.objects)
        body, body_careful = loads_flagged(self.objects.get("contents", env["content"]))
        return entry_from_objects(entry_id, env, body, env_careful or body_careful)

    def entries(self, entry_ids: Sequence[str]) -> Iterator[Entry]:
        """:meth:`entry` of each id, in order, read a chunk at a time in two bulk reads (its
        envelopes, then their contents: :meth:`ObjectStore.get_many`, every object
        verified), so a walk over a whole session costs a backend whose reads are round
        trips (PostgreSQL) a few hundred of them, not two an entry."""
        if isinstance(entry_ids, (str, bytes)) or not isinstance(entry_ids, Sequence):
            raise BadArgumentError(f"entries takes a sequence of entry ids, not {type(entry_ids).__name__}: "
                                   f"{quoted(entry_ids)}")
        objects = self.objects
        step = _ProjectionWalk.CHUNK  # (the projection's walk reads so too)
        for at in range(0, len(entry_ids), step):
            chunk = entry_ids[at : at + step]
            envelopes = self._get_many("entries", chunk)
            envs = [envelope_parts(b, eid, objects) for eid, b in zip(chunk, envelopes)]
            contents = objects.get_many("contents", [env["content"] for env, _ in envs])
            for eid, (env, env_careful), content in zip(chunk, envs, contents):
                body, body_careful = loads_flagged(content)
                yield entry_from_objects(eid, env, body, env_careful or body_careful)

    def ancestry(self, entry_id: str) -> builtins.list[str]:
        """The ids root..entry_id, walking parents through envelopes alone."""
        return walk_up(entry_id, lambda eid: (eid, _parent_of(self.envelope(eid))))

    def ancestry_along(self, entry_id: str, order: Sequence[str]) -> tuple[builtins.list[str], str | None]:
        """The ids from ``entry_id`` up its parents (leaf first) while they are of ``order``
        (a session's own entries in log order, ``entry_id`` one of them), and the first
        parent that is not (None when the walk reached a root): :meth:`ancestry`'s walk with
        the envelopes read in bulk. An entry's parent is most often the entry logged just
        before it, so the walk reads the envelopes before the one it stands at, a chunk
        through one :meth:`ObjectStore.get_many`, and follows the parents through them; a
        chunk the path leaves (at a branch) makes the next one small again (16, doubling
        up to 256 while the guess holds). Only the envelopes on the path are parsed, so
        what it reads, returns and refuses is what :meth:`envelope` one at a time does; a
        chunk that does not read whole is left to that (the error then its own)."""
        snap_n = len(order.snap) if isinstance(order, OwnOrder) else 0
        tail_at: dict[str, int] | None = None

        def position(eid: str) -> int:
            nonlocal tail_at
            if isinstance(order, OwnOrder):
                p = order.snap.position(eid)
                if p >= 0:
                    return p
                if tail_at is None:
                    tail_at = {e: i for i, e in enumerate(order.tail)}
                q = tail_at.get(eid)
                return -1 if q is None else snap_n + q
            if tail_at is None:
                tail_at = {e: i for i, e in enumerate(order)}
            return tail_at.get(eid, -1)

        up: builtins.list[str] = []
        seen: set[str] = set()
        current: str | None = entry_id
        size, at = _ALONG_FIRST, -1
        while current is not None:
            if not (0 <= at < len(order) and order[at] == current):
                at = position(current)
                if at < 0:
                    return up, current
            names = list(order[max(0, at - size + 1) : at + 1])
            names.reverse()
            try:
                datas: Sequence[bytes | None] = self.objects.get_many("entries", names)
            except AgentSessionError:
                names, datas = [current], [None]  # (read alone below: its error, if any, as before)
            # Envelopes all of the common form: their parents by one match over the chunk
            # (each a hash or null, as :meth:`envelope` reads it); else each parsed as it is reached.
            common = common_envelopes(datas) if datas[0] is not None else None  # type: ignore[arg-type]
            walked = 0
            for i, name in enumerate(names):
                if name != current:
                    continue
                if current in seen:
                    raise StoreError(f"entry {current} is its own ancestor: the objects are damaged")
                seen.add(current)
                up.append(current)
                walked += 1
                if common is not None:
                    current = common[i][1] or None
                else:
                    data = datas[i]
                    current = _parent_of(self.envelope(current) if data is None else self._envelope(current, data))
                if current is None:
                    break
            at -= len(names)
            size = min(2 * size, _ALONG_MOST) if walked == len(names) else _ALONG_FIRST
        return up, None

    def ancestry_up(self, entry_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each id entry_id..root with its envelope, leaf first, read as they are taken
        (a caller may walk a long path a piece at a time, keeping what it needs of each)."""

        def step(eid: str) -> tuple[tuple[str, dict[str, Any]], str | None]:
            env = self.envelope(eid)
            return (eid, env), _parent_of(env)

        return iter_up(entry_id, step)

    def path_to(self, entry_id: str) -> builtins.list[Entry]:
        """Entries from the root to ``entry_id``, read from the objects."""

        def step(eid: str) -> tuple[Entry, str | None]:
            e = self.entry(eid)
            return e, e.parent

        return walk_up(entry_id, step)

    def put_blob(self, data: bytes) -> str:
        """Store a media blob durably; return its ``sha256:`` name (use as ``sidecar:<name>``)."""
        self._require_writable()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise BadArgumentError(f"a blob is bytes, not {type(data).__name__}: {quoted(data)}")
        name = sha256_ref(data)
        self.objects.put("blobs", name, data, durable=True)
        return name

    def blob(self, name: str) -> bytes:
        return self._get("blobs", name)

    def cat_object(self, name: str, space: Space | None = None) -> tuple[Space, bytes]:
        """An object's verified bytes and its space, looked up in every space unless one is given."""
        if not is_hash(name):
            raise not_an_object_name(name)
        if space is not None and space not in SPACES:
            raise unknown_object_space(space, SPACES)
        spaces: builtins.list[Space] = [space] if space else list(SPACES)
        unread = None
        for sp in spaces:
            try:
                return sp, self.objects.get(sp, name)
            except NoSuchObjectError as exc:
                unread = unread or exc.unread
                continue
        missing = NoSuchObjectError(f"no object {name} in {self.describe()}"
                                    + (f"; it may be in a pack that could not be read: {unread}" if unread else ""))
        missing.unread = unread
        raise missing

    # -- projection and import ----------------------------------------------------------

    def export(self, session_id: str) -> bytes:
        """The session's RFC 0002 projection as bytes (:meth:`export_lines` streams it)."""
        return b"".join(self.export_lines(session_id))

    def export_lines(self, session_id: str) -> Iterator[bytes]:
        """The session's projection one line at a time, read from a snapshot as it goes
        (``Session.projection_lines``): what it holds does not grow with the entries' bytes."""
        s = self.read(session_id)
        try:
            yield from s.projection_lines()
        finally:
            s.close()

    def export_blobs(self, session_id: str, projection: bytes) -> dict[str, bytes]:
        """The sidecar blobs a sidecar session's projection names (a blob the store
        lacks is an error naming it)."""
        header = self.header(session_id)
        if header.media != "sidecar":
            return {}
        return {name: self.blob(name) for name in sidecar_names(projection)}

    def export_to(self, session_id: str, path: str | PathLike[str], *, progress: Progress | None = None) -> int:
        """Write the projection to ``path`` (a regular file atomically, a symlink's
        target, a device or pipe as a stream), and sidecar media beside a file
        (``<dir>/<session id>/<hex>``, RFC 0001); a blob the store lacks is an error,
        raised before a file is put in place. The projection streams to the file.
        Returns how many blobs a stream output left unwritten. ``progress(lines, total)``
        is called as the lines are written (:mod:`agentsession_cas.progress`)."""
        if not isinstance(path, (str, PathLike)):
            raise BadArgumentError(f"export_to writes to a path (str or os.PathLike), not {type(path).__name__}: "
                                   f"{quoted(path)}")
        blobs: dict[str, bytes] = {}
        lines: Iterator[bytes] = self.export_lines(session_id)
        if progress is not None:
            with self.read(session_id) as s:
                total = 1 + len(s.prefix) + len(s)
            lines = iter(reported(lines, total, progress))
        if self.header(session_id).media == "sidecar":
            lines = self._collect_blobs(lines, blobs)
        return write_projection(path, lines, session_id, blobs)

    def _collect_blobs(self, lines: Iterator[bytes], blobs: dict[str, bytes]) -> Iterator[bytes]:
        """``lines`` passed on, and once they are all written (before the file is renamed
        into place), every blob they name read into ``blobs``."""
        names: set[str] = set()
        for line in lines:
            names.update(sidecar_names(line))
            yield line
        for name in sorted(names):
            blobs[name] = self.blob(name)

    def import_file(self, path: str | PathLike[str], *, record: bool = False, progress: Progress | None = None) -> Session:
        """Import a projection (RFC 0002): every line verified, the head from the resume
        rule held to the head rule, a synthetic marker discarded. A mirror unless ``record``.

        One pass over the file, read line by line (:func:`~..format.reader.verify_file`:
        the line, tree, record and context rules of each entry as it comes), each entry's
        two objects put in the backend's stage (:meth:`ObjectStore.stage`) as they are
        checked and stored once the whole file is found sound: what it holds is what a verify holds
        (the entries on the path the context rules stand on) and a few ids per entry, not
        the file. A file of a format before 0.5 is migrated whole, in memory.
        ``progress(done, total)`` is called as the file is read and checked."""
        from ..format.reader import file_header, gc_paused, read_if_stream, read_session

        held = read_if_stream(path)  # a pipe or a FIFO: read once, whole (a second open would wait or find nothing)
        if held is not None:
            return self.import_bytes(held, record=record, source=fspath(path), progress=progress)
        first = file_header(path)
        if first.is_legacy:
            with gc_paused():
                sf = read_session(path, keep_objects=True, progress=progress)
                return self.import_session(sf, record=record, sidecar_dir=sidecar_dir(path, str(sf.header.id)))
        self._require_writable()
        with gc_paused(), closing(self.objects.stage()) as spill:  # a bulk pass: many acyclic objects per entry (see gc_paused)
            return self._import_streamed(path, first, spill, record, progress)

    def _import_streamed(
        self, path: str | PathLike[str], first: Header, spill: ObjectStage, record: bool, progress: Progress | None
    ) -> Session:
        from ..format.reader import verify_file
        from . import rulestate

        taken = _TakenImport(spill, self._defaulted_header(first), fspath(path))
        # A stage that takes pack blocks made ready lets the helper process compress the
        # entries' objects on its core (not for sidecar media: their names are read here).
        ready = spill.add_ready if isinstance(spill, ReadyStage) and first.media != "sidecar" else None
        report = verify_file(path, on_entry=taken.take, progress=progress, on_ready=ready, sidecars=False)  # (_import_blobs checks them)
        source = report.source
        header_kept = _refused_or_kept(source, report.problems)
        if taken.refusal is not None:
            raise taken.refusal
        if report.header.data != first.data:
            raise StoreError(f"{source}: the file changed while it was imported (its header is not the one first read)")
        spill.end()  # (the file backend's pack is ended and made durable beside what follows)
        header = self._checked_new_header(taken.header)
        base = header.base
        if base is not None:
            if not taken.base_found:
                raise StoreError(
                    f"{source}: the header names base {base}, which the file does not hold; "
                    "a fork's projection carries its prefix (RFC 0001 ingress)"
                )
            if taken.base_is_leaf_label:
                raise BadBaseError(f"{source}: base {short_id(base)} is a leaf label; the base is a fork's first head")
            self._check_holder(base, header)
        # The rules' state the pass leaves, kept for the session's first append (else
        # built then from every entry: seconds for a big session) if it stands at the head.
        rules = rulestate.capture_pass(report, header, taken.prefix, taken.own_ids(), taken.leaf_labels)
        # The pass's state (the checker's path and tables) is not needed any more: freed
        # (it holds no cycle, which a paused collector would keep) before the session is
        # written, so the import's peak is not the two together.
        del report
        # Where an own entry may hang (the base or another own entry) is the format's
        # tree rule ("base"), which verify_file held every line to above.
        own = taken.own()
        named = _resume_tree(taken.stubs(), base, taken.above_base).resume_named()
        head = self._import_head(named, base, own, taken.entry)
        adjusted = _head_adjusted(named, head, base, taken.entry)
        if rules is not None and head != own[-1]:
            rules = None
        if header.media == "sidecar":
            self._import_blobs(taken.sidecars, source, sidecar_dir(path, str(header.id)))
        # What the head rule read (every entry's id and parent) is not needed to write the
        # session: freed first, so the write's peak is not both together (issue 11: the
        # import's peak memory).
        taken.release()
        session = self._create(header, own=own, leaf_labels=taken.leaf_labels, head=head, record=record, objects=spill)
        session.head_adjusted = adjusted
        session.header_findings = header_kept
        session._builder = taken.summary
        session.prefix = taken.prefix
        if rules is not None:
            session.start_rules(rules)
        return session

    def import_bytes(
        self, data: bytes, *, record: bool = False, source: str = "<bytes>", progress: Progress | None = None
    ) -> Session:
        from ..format.reader import gc_paused, read_session_bytes

        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise BadArgumentError(f"import_bytes takes a session file's bytes, not {type(data).__name__}: "
                                   f"{quoted(data)}")
        with gc_paused():
            sf = read_session_bytes(data, source=source, keep_objects=True, progress=progress)
            return self.import_session(sf, record=record)

    def _import_blobs(self, names: Iterable[str], source: str, directory: str | None) -> None:
        """A sidecar session's blobs come from ``<dir>/<id>/<hex>`` beside its file, each
        verified against its name as ``verify FILE`` verifies it (:func:`sidecar_blob`); one
        neither there nor held already refuses the import (:class:`SessionFormatError`,
        with the file's problem: ``missing-blob`` or ``blob-hash``)."""
        for name in sorted(set(names)):
            if self.objects.is_sound("blobs", name):
                continue
            blob, wrong = sidecar_blob(directory, name)
            if wrong is not None:
                raise SessionFormatError(source, [wrong])
            assert blob is not None
            self.objects.put("blobs", name, blob, durable=True)

    def import_session(self, sf: SessionFile, *, record: bool = False, sidecar_dir: str | None = None) -> Session:
        from ..format.rules import verify_session
        from . import rulestate

        self._require_writable()
        if sf.problems or sf.truncated is not None:
            # A last line cut short is a problem like any other here: verify's (the reader
            # tolerates it to read the rest), and a cut-short file is not imported.
            raise SessionFormatError(sf.source, sf.all_problems())
        # Every rule verify holds a file to, the one rule set: a file verify rejects is
        # refused here with the same codes. A request_hash that does not match is
        # refused too (unlike at append, nothing is lost: the file stays as it is); a
        # header member of another form is kept (store policy keep: _refused_or_kept).
        report = verify_session(sf)
        header_kept = _refused_or_kept(sf.source, report.problems)
        header = sf.header
        if sf.migrated:
            # RFC 0001 Versioning: a file before 0.5 is migrated on read (ids hashed, each
            # old id kept in legacy_id), and may be held as 0.5 or later unless migration
            # left a reference it could not rewrite, which must never be re-emitted.
            if sf.unresolved:
                raise SessionFormatError(
                    sf.source, list(sf.unresolved),
                    why=f"of format {sf.header.format}, migrated on read, and RFC 0001 forbids re-emitting it as a "
                    "later format: it holds a reference migration could not rewrite",
                )
            header = Header(dict(header.data, format=FORMAT_WRITTEN))
        header = self._checked_new_header(header)
        base = header.base
        entries = sf.entries
        tree = sf.tree
        named = tree.resume_named()
        markers = {e.id for e in entries if e.type == "label" and e.synthetic}
        kept = [e for e in entries if e.id not in markers] if markers else entries
        for e in kept:
            refusal = synthetic_refusal(sf.source, e, markers)
            if refusal is not None:
                raise refusal
        if base is not None:
            cut = next((i for i, e in enumerate(kept) if e.id == base), None)
            if cut is None:
                raise StoreError(
                    f"{sf.source}: the header names base {base}, which the file does not hold; "
                    "a fork's projection carries its prefix (RFC 0001 ingress)"
                )
            if kept[cut].is_leaf_label:
                raise BadBaseError(f"{sf.source}: base {short_id(base)} is a leaf label; the base is a fork's first head")
            cut += 1
            prefix, own = kept[:cut], kept[cut:]
            self._check_holder(base, header)
        else:
            prefix, own = [], kept
        own_ids = {e.id for e in own}  # where each may hang: the tree rule ("base"), held by verify_session

        def entry(eid: str) -> tuple[str | None, bool]:
            return tree.by_id[eid].parent, tree.by_id[eid].is_leaf_label

        head = self._import_head(named, base, own_ids, entry)
        adjusted = _head_adjusted(named, head, base, entry)
        if header.media == "sidecar":
            names: list[str] = []
            for e in sf.entries:
                names.extend(sidecar_names(canonical_bytes(e.body, parsed=True)))
            self._import_blobs(names, sf.source, sidecar_dir)
        ids = [e.id for e in own]
        leaf_labels = {e.id for e in own if e.is_leaf_label}
        session = self._create(header, own=ids, leaf_labels=leaf_labels, head=head, record=record,
                               objects=_objects_of(prefix + own))
        session.head_adjusted = adjusted
        session.header_findings = header_kept
        for e in own:
            session._summarize_created(e)
        session.prefix = [e.id for e in prefix]
        if ids and head == ids[-1]:  # the pass's state, as a streamed import keeps it
            rules = rulestate.capture_pass(report, header, session.prefix, ids, {e.id for e in kept if e.is_leaf_label})
            if rules is not None:
                session.start_rules(rules)
        return session

    def _check_holder(self, base: str, header: Header) -> None:
        """A fork imported over a base held here: held to the session holding the base as a
        create is (:func:`check_fork_of`: its media, and its format when that session owns it)."""
        holder = self.holder_of(base)
        if holder is not None:
            holder.close()
            check_fork_of(header, holder.session, holder.header, owns=holder.owns)

    @staticmethod
    def _import_head(
        named: str | None, base: str | None, own_ids: Container[str], entry: Callable[[str], tuple[str | None, bool]]
    ) -> str | None:
        """An imported session's head (RFC 0002 "Projection to JSONL"): the entry the
        file's resume rule names (:meth:`Tree.resume_named`) held to the head rule.
        A ``leaf`` label gives way to its nearest ancestor that is not one (a projection's
        marker too, which is no own entry); what is then no own entry (a prefix entry, the
        base itself) to the base; none to the base in a fork, where there always is a head.
        ``entry`` gives an entry's (parent, is a leaf label)."""
        head = named
        while head is not None:
            parent, leaf_label = entry(head)
            if not leaf_label:
                break
            head = parent
        if head is None or head not in own_ids:
            head = base
        return head


@dataclass
class Holder:
    """The session found holding an entry: its id and header, whether the entry is
    committed there, whether it is an own entry (else on its prefix), and the snapshot
    read to find it (None for a session open here)."""

    session: str
    header: Header
    committed: bool
    owns: bool
    snapshot: Session | None

    def close(self) -> None:
        if self.snapshot is not None:
            self.snapshot.close()
            self.snapshot = None


@dataclass
class HeadAdjusted:
    """An import's report of the head it holds in place of the one its file names (RFC
    0002 "Projection to JSONL": the head is what RFC 0001's resume rule gives, held to the
    head rule, "and the store reports any of these"): :attr:`Session.head_adjusted`.

    ``named`` is the entry the file's resume rule lands on, which no head may rest on;
    ``held`` the head the store holds (None: no head); ``why`` is ``leaf_label`` (named is
    a ``leaf`` label: held is its nearest ancestor that is not one, the base when none lies
    above the base, or no head in a baseless session with none), ``prefix`` (named is a
    prefix entry above the base: held is the base) or ``root`` (the rule names no entry in
    a fork, which always has a head: the base). ``message`` says it in a sentence."""

    named: str | None
    held: str | None
    why: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"named": self.named, "held": self.held, "why": self.why, "message": self.message}


def _head_adjusted(
    named: str | None, held: str | None, base: str | None, entry: Callable[[str], tuple[str | None, bool]]
) -> HeadAdjusted | None:
    """What an import reports of its head: None when it holds the entry its file's rule
    names (the base included: a head may rest on it), else a :class:`HeadAdjusted`."""
    if named == held:
        return None
    if held is None:
        instead = "no head"
    elif held == base:
        instead = f"the base, {short_id(held)}"
    else:
        instead = short_id(held)
    if named is None:
        return HeadAdjusted(named, held, "root", f"the file's resume rule names no entry, and a fork always has a "
                                                 f"head: the store holds {instead}")
    if entry(named)[1]:
        if held is None:
            instead += " (no ancestor of the label is not one)"
        elif held == base:
            instead += " (no ancestor of the label below the base is not one)"
        else:
            instead = f"its nearest ancestor that is not one, {instead}"
        return HeadAdjusted(named, held, "leaf_label", f"the file's resume rule lands on {short_id(named)}, a leaf "
                                                       f"label, which no head rests on: the store holds {instead}")
    return HeadAdjusted(named, held, "prefix", f"the file's resume rule lands on {short_id(named)}, on the prefix "
                                               f"above the base, which no head rests on: the store holds {instead}")


class _TakenImport:
    """What a streamed import keeps of each entry the reader accepted, in file order: its
    two objects put in the stage, and of the entry itself only its id and parent (what
    the resume and head rules read, and the own entries' ids), in two lists. What fewer
    entries bring is kept apart: a label's members and which labels are leaf labels, the
    lines that are no entries of record (a synthetic marker; a line refused), the prefix
    up to the base, sidecar names; and the summary's running fields."""

    def __init__(self, stage: ObjectStage, header: Header, source: str):
        from ..format.parallel import PACKED

        self.stage = stage
        self.source = source
        #: What an entry's objects are when the helper made them into ready blocks.
        self._packed = PACKED
        #: The header the session gets (the store's defaults filled in), which the summary starts from.
        self.header = header
        self._base = header.base
        self._sidecar = header.media == "sidecar"
        #: Every entry's id and parent, in file order.
        self.ids: list[str] = []
        self.parents: list[str | None] = []
        self.labels: dict[str, Mapping[str, Any]] = {}  # a label's members by id, for the resume rule
        self.leaf_labels: set[str] = set()
        self.skipped: set[str] = set()  # no entries of record: synthetic markers, lines refused
        self.markers: set[str] = set()  # the synthetic markers, which no entry may hang from
        #: The first entry an import refuses beside the rules verify applies (synthetic_refusal).
        self.refusal: AppendRefusedError | None = None
        #: Where the own entries begin in :attr:`ids` (past the base), -1 until the base has come.
        self.own_from = 0 if header.base is None else -1
        self.prefix: list[str] = []  # the kept entries up to the base, the base included
        self.sidecars: list[str] = []
        self.base_is_leaf_label = False
        #: The summary of the own entries taken.
        self.summary = SummaryBuilder(header)
        self._by_id: dict[str, str | None] | None = None

    @property
    def base_found(self) -> bool:
        return self._base is not None and self.own_from >= 0

    @property
    def above_base(self) -> list[str]:
        """Every entry's id before the base (the tree's prefix; all of them when it never came)."""
        if self._base is None:
            return []
        return self.ids[: self.own_from - 1] if self.own_from > 0 else list(self.ids)

    def own_ids(self) -> list[str]:
        """The own entries' ids (those after the base that are entries of record)."""
        own = self.ids[max(self.own_from, 0) :] if self.own_from >= 0 else []
        if self.skipped:
            own = [eid for eid in own if eid not in self.skipped]
        return own

    def own(self) -> EntryDigests:
        """:meth:`own_ids` as digests, none twice: the reader hands on an id the file
        repeats once (the tree rule), so the created log need not look for a repeat."""
        # (computed ids, every one: a line whose stated id differs was skipped)
        return EntryDigests(bytes.fromhex("".join(self.own_ids()).replace(HASH_PREFIX, "")), unrepeated=True)

    def entry(self, entry_id: str) -> tuple[str | None, bool]:
        """An entry's parent and whether it is a leaf label (what the head rule walks up by):
        the last entry's read as it is (the resume rule's leaf, most often), another's
        through a table of every entry made when first needed."""
        if self.ids and self.ids[-1] == entry_id:
            return self.parents[-1], entry_id in self.leaf_labels
        if self._by_id is None:
            self._by_id = dict(zip(self.ids, self.parents))
        return self._by_id[entry_id], entry_id in self.leaf_labels

    def release(self) -> None:
        """Let go of what only the resume and head rules read (they have run)."""
        self.ids, self.parents, self._by_id = [], [], None
        self.labels.clear()

    def stubs(self) -> Iterator[tuple[str, str | None, Mapping[str, Any] | None]]:
        """(id, parent, a label's members) of every entry in file order: what the resume
        rule reads, made as it is read rather than held beside the parents. In a file
        without a ``leaf`` label the rule reads the last entry alone (no mark is in force,
        and only a leaf label walks a leaf up): only that one is given."""
        labels = self.labels
        if not self.leaf_labels and self.ids:
            eid = self.ids[-1]
            yield eid, self.parents[-1], labels.get(eid)
            return
        for eid, parent in zip(self.ids, self.parents):
            yield eid, parent, labels.get(eid)

    def take(self, e: Entry) -> None:
        eid = e.id
        data = e.data
        self.ids.append(eid)
        self.parents.append(data.get("parent"))
        if self.markers and self.refusal is None and data.get("parent") in self.markers:
            self.refusal = synthetic_refusal(self.source, e, self.markers)
        objects = e.objects
        if self.own_from < 0 or objects is None or eid != e.computed_id or data.get("type") == "label":
            self._take_other(e, objects)
            return
        self.summary.feed(e)
        if objects is not self._packed:  # (else in the helper's blocks, handed to the stage already)
            self.stage.add_entry(e.content_hash, eid, objects)
            if self._sidecar:
                self.sidecars.extend(sidecar_names(objects[0]))

    def _take_other(self, e: Entry, objects: tuple[bytes, bytes] | None) -> None:
        """An entry of the prefix, a label, or a line the rules refuse."""
        eid = e.id
        label = e.type == "label"
        leaf_label = label and e.is_leaf_label
        if label:
            self.labels[eid] = e.body
            if leaf_label:
                self.leaf_labels.add(eid)
        if (label and e.synthetic) or objects is None or eid != e.computed_id:
            # a projection's marker, never an entry of record; or a line the rules refuse
            # (the import is refused once the pass ends)
            self.skipped.add(eid)
            if label and e.synthetic:
                self.markers.add(eid)
            return
        if label and self.refusal is None:
            self.refusal = synthetic_refusal(self.source, e, ())
        if self.own_from >= 0:
            self.summary.feed(e)
        else:
            self.prefix.append(eid)
            if eid == self._base:
                self.own_from = len(self.ids)
                self.base_is_leaf_label = leaf_label
        if objects is not self._packed:
            self.stage.add_entry(e.content_hash, eid, objects)
            if self._sidecar:
                self.sidecars.extend(sidecar_names(objects[0]))


def _refused_or_kept(source: str, problems: Sequence[Problem]) -> list[Problem]:
    """What an import does with the problems verify found in a file: refuses the file for
    any (:class:`SessionFormatError`, every one named), unless each is of a rule whose
    store policy is ``keep`` (``header-member``), which it returns, to be kept with the
    header byte for byte and reported. An import cannot tell a file a store exported
    from one written fresh, and its header is the session's, not one the store makes:
    so a header of another form is kept and said, wherever the file came from."""
    from ..format.codes import RULES  # (the table: loaded by what checks, not by head or list)

    kept = [p for p in problems if RULES[p.code].store == "keep"]
    if len(kept) < len(problems):
        raise SessionFormatError(source, list(problems))
    return kept


def _objects_of(entries: list[Entry]) -> list[tuple[Space, str, bytes]]:
    """The two objects of each entry, from what the reader kept or computed afresh."""
    items: list[tuple[Space, str, bytes]] = []
    for e in entries:
        # Entries here were parsed (a file read): their member names are strings and
        # their parse flags say how to serialise.
        if e.objects is not None and e.id == e.computed_id:
            (content, env), chash = e.objects, e.content_hash  # kept by the reader
        else:
            _, chash, content, env = entry_objects(e.data, parsed=True, careful=e.careful)
        items.append(("contents", chash, content))
        items.append(("entries", e.id, env))
    return items


#: The envelopes :meth:`Store.ancestry_along` reads at once: first, and at most.
_ALONG_FIRST, _ALONG_MOST = 16, 256


def _refuse_no_names(names: Iterable[object]) -> None:
    """Where a read by name failed: the first of ``names`` that is no object name is
    ``bad_name`` (:func:`~agentsession_cas.errors.not_an_object_name`), whatever the
    backend said of it; when every one is a name, the backend's error stands. The one
    handler of :meth:`Store._get` and :meth:`Store._get_many`."""
    for name in names:
        if not is_hash(name):
            raise not_an_object_name(name) from None


def _parent_of(env: Mapping[str, Any]) -> str | None:
    parent = env.get("parent")
    return parent if isinstance(parent, str) else None

