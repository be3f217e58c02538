"""Following a session as it is written, from a store this process opens or from a
server (RFC 0003 Following): what ``agentsession show -f`` prints.

Both give the same :class:`Change` values, committed changes only (a follower
that prints is told what will survive a crash): each own entry once, in log
order, and each head move. A remote follow reads the server's durable stream,
verifies every entry it receives by its hashes, and resumes after a dropped
connection from the last event it saw.

A log rewritten under a follow (compacted, repaired) is read again; while it begins
with the entries given, in their order, the follow goes on after them. When it does
not (a repair dropped an entry given), a ``reset`` change says that what was given is
void, and the session's entries are given afresh, as RFC 0003 asks of a ``reset``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..backends.base import COMMIT_POINTS
from ..errors import BadObjectError, CorruptObjectError, NoSuchObjectError, NoSuchSessionError, TransportError
from ..format.canonical import canonical_bytes, loads_flagged
from ..format.entry import Entry
from ..format.hashing import sha256_ref
from ..lean import dataclass
from ..store.refs import header_ident
from ..store.session import entry_from_objects, envelope_parts
from ..store.state import SessionState
from ..store.store import Store
from .wire import frame_problem, stream_frame

__all__ = ["Change", "follow_remote", "follow_store"]


@dataclass
class Change:
    """One committed change: an entry appended (``entry``, and the head after it), a
    head move no append explains (``entry`` None), or a ``reset`` (``entry`` None, the
    head now): the session's log was rewritten without an entry given before, so what
    was given is void and the session's entries follow afresh, from its first."""

    kind: str
    session: str
    head: str | None
    entry: Entry | None = None
    cursor: str | None = None


class _Given:
    """The entries a follow has given, in order: how many, and a running hash of their ids,
    which a log read afresh is checked against (it must begin with them)."""

    __slots__ = ("count", "_hash")

    def __init__(self) -> None:
        self.count = 0
        self._hash = hashlib.sha256()

    def add(self, entry_id: str) -> None:
        self._hash.update(entry_id.encode("ascii", "replace"))  # (ids are of one length: no separator needed)
        self.count += 1

    def begin(self, ids: Iterable[str]) -> bool:
        """Whether ``ids`` (a log's entries in order) begin with the ones given."""
        h = hashlib.sha256()
        n = 0
        for entry_id in ids:
            if n == self.count:
                break
            h.update(entry_id.encode("ascii", "replace"))
            n += 1
        return n == self.count and h.digest() == self._hash.digest()


def follow_store(
    store: Store, session_id: str, *, interval: float = 0.1, sleep: Callable[[float], None] = time.sleep
) -> Iterator[Change]:
    """The session's committed entries from the first, then each one committed after,
    read from ``store`` every ``interval`` seconds (a store on this machine tells no
    one of a commit). Ends with :class:`NoSuchSessionError` when the session is
    deleted or created again while followed. A store served over HTTP is followed
    through its server's follow stream instead (:func:`follow_remote`: no polling).

    A poll costs what was written since the last, not the session's size: it asks the
    backend for the log's records after those read
    (:meth:`~..backends.base.SessionStore.history_since`: on the file store the bytes
    after the last read's end, on PostgreSQL the session's row and the rows after; an
    idle poll is one small read) and replays the committed ones onto the state kept
    from the last (:class:`~..store.state.SessionState`). The log is read afresh, its
    session opened and checked as a read opens it, first and whenever the backend says
    the log is no longer the one it read on from (``whole``: compacted, cut back,
    created again): it goes on after the entries given while the log begins with them,
    and says ``reset`` and gives them afresh when it does not (a repair dropped one)."""
    transport = store.backend.follow_stream()
    if transport is not None:
        yield from follow_remote(transport, session_id)
        return
    sessions = store.backend.sessions
    ident: str | None = None
    head: str | None = None  # the head last told (no head: nothing to tell)
    given = _Given()  # own entries given
    afresh = False  # the log was read again whole: check it begins with what was given
    state = SessionState()  # the log through the last commit point read
    pending: list[dict[str, Any]] = []  # records read after it
    logged: dict[str, tuple[bytes, bytes]] = {}  # objects the log's lines carried (see LogTail.objects)
    total, note = -1, None  # records read (-1: read afresh), and the backend's note of where
    while True:
        snapshot = None
        try:
            tail = _read(sessions.history_since, session_id, ident, total, note) if total >= 0 else None
            if tail is None or tail.whole:
                # Opened as a read opens it (what it checks, it checks), and held while this
                # poll's entries are read: their objects may be only in the log still (the
                # file store's payloads, until a checkpoint), which a snapshot serves.
                snapshot = _read(store.read, session_id, ident)
                now = header_ident(snapshot.header.data)
                tail = _read(sessions.history_since, session_id, ident, 0, None)
                after = _ident(store, session_id)  # (the log read is this incarnation's)
                if after is None:
                    raise NoSuchSessionError(f"session {session_id} was deleted while followed")
                if now != after or (ident is not None and now != ident):
                    raise NoSuchSessionError(f"session {session_id} was deleted and created again while followed")
                afresh = ident is not None
                ident, state, pending, logged = now, SessionState(), [], {}
            total, note = tail.total, tail.resume
            pending.extend(tail.records)
            logged.update(tail.objects)
            last = max((i for i, r in enumerate(pending) if r.get("op") in COMMIT_POINTS), default=-1)
            for rec in pending[: last + 1]:
                state.apply(rec)
            del pending[: last + 1]
            order = state.log_order
            if afresh and not given.begin(order):
                # (what was given was committed: a log read afresh lacks one only when a
                # repair dropped it)
                yield Change("reset", session_id, state.head)
                given, head = _Given(), None
            afresh = False
            fresh = order[given.count :]
            for entry_id in fresh:
                given.add(entry_id)
            # Read a chunk at a time as they are printed: a long session's first line comes
            # at once, not after every entry was read (6 s for 100,000).
            head = yield from _batch(session_id, ((e, None) for e in _entries(store, session_id, fresh, logged)), state.head, head)
        finally:
            if snapshot is not None:
                snapshot.close()
        sleep(interval)


def _entries(store: Store, session_id: str, ids: Sequence[str], logged: dict[str, tuple[bytes, bytes]]) -> Iterator[Entry]:
    """The entries ``ids`` names, in order: from the objects a read of the log's lines
    carried (``logged``, each taken out as it is used, checked against its name), the rest
    from the store a chunk at a time (:meth:`Store.entries`)."""
    at = 0
    while at < len(ids):
        end = at
        while end < len(ids) and ids[end] not in logged:
            end += 1
        if end > at:
            try:
                for entry in store.entries(ids[at:end]):
                    yield entry
                    at += 1
            except NoSuchObjectError:
                # Only in the writer's log still, its lines read whole before they were
                # committed (no objects carried): read as a snapshot, which serves them.
                snapshot = store.read(session_id)
                try:
                    for entry in store.entries(ids[at:end]):
                        yield entry
                        at += 1
                finally:
                    snapshot.close()
            continue
        entry_id = ids[at]
        content, env_bytes = logged.pop(entry_id)
        env, env_careful = envelope_parts(env_bytes, entry_id, store.objects)
        for space, name, data in (("entries", entry_id, env_bytes), ("contents", str(env["content"]), content)):
            if sha256_ref(data) != name:
                where = store.backend.sessions.log_source(session_id) or f"the log of session {session_id}"
                raise CorruptObjectError(f"session {session_id}: its log carries {space} object {name} in bytes that "
                                         f"do not hash to it ({where})", space=space, name=name, path=where)
        body, body_careful = loads_flagged(content)
        yield entry_from_objects(entry_id, env, body, env_careful or body_careful)
        at += 1


def _batch(
    session_id: str, entries: Iterable[tuple[Entry, str | None]], head: str | None, told: str | None
) -> Generator[Change, None, str | None]:
    """Entries committed since the last look, each (with its cursor) and the head after
    them all, then a head move they do not explain (``told``: the head last reported,
    None at first: a session with no head has none to tell); returns the head now reported. What a poll finds, and what a server's snapshot holds."""
    last: Entry | None = None
    for entry, cursor in entries:
        last = entry
        yield Change("appended", session_id, head, entry, cursor)
    if last is not None and head == last.id:
        told = head
    if head != told:
        told = head
        yield Change("head", session_id, head)
    return told


def _read(read: Callable[..., Any], session_id: str, ident: str | None, *args: Any) -> Any:
    """``read(session_id, *args)``; its NoSuchSessionError said as a deletion once followed."""
    try:
        return read(session_id, *args)
    except NoSuchSessionError:
        if ident is None:
            raise
        raise NoSuchSessionError(f"session {session_id} was deleted while followed") from None


def _ident(store: Store, session_id: str) -> str | None:
    """The ident of the session's incarnation now (its header: one small read)."""
    header = store.backend.sessions.header(session_id)
    return header_ident(json.loads(header)) if header is not None else None


def _verified_entry(entry_id: str, envelope: Any, content: Any) -> Entry:
    """An entry received inline, its two hashes recomputed: a server's word is not taken."""
    if not isinstance(envelope, dict) or not isinstance(content, dict):
        raise BadObjectError(f"entry {entry_id} came without its envelope and content")
    if sha256_ref(canonical_bytes(envelope)) != entry_id or sha256_ref(canonical_bytes(content)) != envelope.get("content"):
        raise BadObjectError(f"entry {entry_id} came with objects that do not hash to their names")
    return entry_from_objects(entry_id, envelope, content)


#: Records of a snapshot whose entries are read from the server together, when it did
#: not send them inline: their envelopes in one batch read, then their contents.
SNAPSHOT_CHUNK = 1024


def _snapshot_entries(transport: Any, data: Mapping[str, Any], skip: int = 0) -> Iterator[tuple[Entry, str | None]]:
    """The entries a snapshot names, in its order, after the first ``skip``: those sent
    inline as they are, the rest read a chunk at a time
    (:meth:`~.http_client.HttpTransport.get_objects`: a batch read where the server
    offers one, not two GETs an entry)."""
    inline = data.get("entries") or {}
    records = [rec for rec in data.get("records") or [] if rec.get("entry") is not None][skip:]
    for at in range(0, len(records), SNAPSHOT_CHUNK):
        chunk = records[at : at + SNAPSHOT_CHUNK]
        lacking = [str(rec["entry"]) for rec in chunk if rec["entry"] not in inline]
        read: dict[str, Any] = {}
        if lacking:
            envs = {name: json.loads(raw) for _, name, raw in transport.get_objects([("entries", e) for e in lacking])}
            names = list(dict.fromkeys(str(env.get("content")) for env in envs.values()))
            contents = {name: json.loads(raw) for _, name, raw in transport.get_objects([("contents", c) for c in names])}
            read = {e: {"envelope": env, "content": contents.get(str(env.get("content")))} for e, env in envs.items()}
        for rec in chunk:
            entry_id = str(rec["entry"])
            obj = inline.get(entry_id) or read.get(entry_id) or {}
            yield _verified_entry(entry_id, obj.get("envelope"), obj.get("content")), rec.get("cursor")


def follow_remote(transport: Any, session_id: str) -> Iterator[Change]:
    """The committed changes of a session a server holds (``GET .../follow?durable=true``),
    from its first entry. The transport keeps the stream open (its ``stream_lines``): a
    connection that drops or ends, or that the server refuses for a while (its follow
    streams at their limit: 503, ``Retry-After``), is opened again after the wait its
    retry rule gives, within its bound (``AGENTSESSION_RETRY_WAIT``), and resumes after
    the last event seen (``Last-Event-ID``). A ``reset`` of another incarnation says the
    session was replaced (:class:`NoSuchSessionError`); one of the session followed (its
    log rewritten) goes on after the entries given when it begins with them, else gives a
    ``reset`` change and the session's entries afresh."""
    last_id: str | None = None
    ident: str | None = None
    given = _Given()
    told: str | None = None  # the head last told

    def headers() -> dict[str, str]:
        return {"Accept": "application/x-ndjson", **({"Last-Event-ID": last_id} if last_id is not None else {})}

    path = f"/sessions/{session_id}/follow"
    for event in transport.stream_lines(path, params={"durable": "true"}, headers=headers):
        if not event.strip():
            continue  # the server's keep-alive on an idle stream (every 15 s)
        where = f"remote {getattr(transport, 'url', '?')}"
        frame = stream_frame(event, where=f"{where}: the stream {path}")  # (no JSON object: TransportError)
        kind, data = frame.get("event"), frame.get("data") or {}
        if not isinstance(data, dict):
            raise TransportError(f"{where}: a {kind} event of the stream {path} carries no object")
        if kind == "error":  # the problem it carries: no_session when the session went
            raise frame_problem(data, where=where)
        if kind in ("snapshot", "reset"):
            if ident is not None and data.get("incarnation") != ident:
                raise NoSuchSessionError(f"session {session_id} was replaced while followed")
            ids = (str(rec["entry"]) for rec in data.get("records") or [] if rec.get("entry") is not None)
            if ident is not None and not given.begin(ids):
                yield Change("reset", session_id, data.get("head"))
                given, told = _Given(), None
            ident = data.get("incarnation")
            # As a poll of a local store reports what it finds (show -f prints the same
            # either way): each entry with the head now, then a head that is not the last.
            told = yield from _batch(session_id, _counted(given, _snapshot_entries(transport, data, given.count)),
                                     data.get("head"), told)
        elif kind == "appended":
            entry = _verified_entry(str(data.get("entry")), data.get("envelope"), data.get("content"))
            given.add(entry.id)
            told = data.get("head")
            yield Change("appended", session_id, told, entry, data.get("cursor"))
        elif kind == "head":
            told = data.get("leaf")
            yield Change("head", session_id, told, None, data.get("cursor"))
        # (an "end" is the stream's age limit, or the server stopping: the transport opens it
        # again from its id, at once, then by its retry rule while no server answers)
        last_id = frame.get("id") or last_id


def _counted(given: _Given, entries: Iterable[tuple[Entry, str | None]]) -> Iterator[tuple[Entry, str | None]]:
    """``entries``, each added to ``given`` as it is taken."""
    for entry, cursor in entries:
        given.add(entry.id)
        yield entry, cursor
