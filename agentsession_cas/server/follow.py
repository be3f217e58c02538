"""Following a session over the wire (RFC 0003, Following): server-sent events or NDJSON.

A follow reads the session's log from a cursor (or sends a ``snapshot`` of all
of it), then waits for the server's own writes to that session (every write
route wakes the session's followers: the server is the session's writer, so
one wakeup per write fans out to every stream) and sends what they added:

- ``snapshot`` / ``reset``: every record so far in the log's line shape, with
  the header, incarnation, mark and head, and the entries inline while they
  fit :data:`SNAPSHOT_INLINE_BYTES` (past it ``inline`` is false and the client
  reads ``path``);
- ``appended``: one append's record, its envelope and content inline, the head
  after it and ``durable``;
- ``head``: a head move no append explains;
- ``committed``: the cursor through which the log is now durable, sent when a
  commit covers records sent as not durable: by this stream, or, to a follower back
  with its cursor, by a stream or a log read before it (:meth:`Stream.resume`);
- ``error``: the session was deleted (or created again) under a live follow:
  ``no_session``, and the stream ends.

Every event's id is ``<cursor>.<n>``; a client resumes with ``Last-Event-ID`` (or
``after``). A cursor is ``<records>-<incarnation>-<state>``: how many records of the
log it follows, and a check of what a follower was told through them (:class:`Told`:
the own entries in log order, the head, the highest sequence number), which a rewrite
of the log (a compaction, a repair) keeps wherever it keeps the session as it was. So a
cursor is resumed at its position while the log there is as it was, else at the place
in the log as it is now where the session is what the follower was told (a compaction
folds records: the position moves, the state is there), and otherwise, as for a cursor
of another incarnation, of the earlier form (no check) or past the log's end, answered
with a ``reset``: never a silent skip, nor a record sent twice. With a ``max_resume``
(off unless the operator sets one), a cursor further behind than that many records is
answered with a ``reset`` too. An open stream finds its
place so too when the log it read is read again whole (:class:`Tails`). A stream
lives at most ``max_stream_age_s`` and then ends with an ``end`` event carrying
the cursor to resume from (``reason``: ``max_stream_age``); a server that stops ends
every open stream so at once (``reason``: ``shutdown``), rather than wait for it to
reach its age.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import field
from typing import Any

from ..backends.base import COMMIT_POINTS
from ..errors import AgentSessionError, NoSuchSessionError
from ..exchange.wire import problem_body
from ..format.hashing import envelope_content
from ..lean import dataclass
from ..store.refs import header_ident
from ..store.session import Session
from ..store.state import SessionState
from ..store.store import Store

__all__ = [
    "Changes", "LogView", "MAX_RESUME_RECORDS", "SNAPSHOT_INLINE_BYTES", "Stream", "Tail", "Tails", "Told", "cursor_of", "load_view", "locate",
    "log_line", "parse_cursor",
]

#: Bytes of entries a snapshot carries inline before it leaves them to ``path``.
SNAPSHOT_INLINE_BYTES = 4 * 1024 * 1024
#: Records a resumed follow replays at most (each append an event, its objects read); a
#: follower further behind is sent a ``reset``, the session afresh, as a new follower's
#: ``snapshot``. None by default: RFC 0003 has a server resume "after exactly that event",
#: and a reset costs the whole session (docs/server.md, Decisions, "Resumes").
MAX_RESUME_RECORDS: int | None = None
#: Seconds between keep-alive comments on an idle stream.
HEARTBEAT_S = 15.0
#: Sessions whose log the server keeps what it read of (see :class:`Tails`).
TAILS = 256
#: The records a follower is told of (a line of the log read, an event of a follow).
LINES = frozenset({"append", "head"})


class Changes:
    """Wakeups per session, set in the event loop after each write the server makes, and
    the server's stop (:meth:`close`), which wakes every follower to end its stream."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        #: The server is stopping: a follow stream ends (an ``end`` event, reason
        #: ``shutdown``) rather than wait for a write or its age limit.
        self.closing = False

    def event(self, session_id: str) -> asyncio.Event:
        if self.closing:
            done = asyncio.Event()
            done.set()
            return done
        return self._events.setdefault(session_id, asyncio.Event())

    def notify(self, session_id: str) -> None:
        event = self._events.pop(session_id, None)
        if event is not None:
            event.set()

    def close(self) -> None:
        """Wake every follower for good (in the event loop, as the server begins to stop)."""
        self.closing = True
        events, self._events = self._events, {}
        for event in events.values():
            event.set()


class Told:
    """What a follower has been told through a point of a session's log: the session's
    state there (what each record's line says of it) and a running hash of its own entries
    in log order; :meth:`check` is the part of a cursor that says so. A compaction keeps
    the state at the point it folds to (the entries in order, the head, the highest
    sequence number), and a repair keeps it up to the first record it drops: where the
    check is found again, a follower resumes with nothing missed and nothing twice."""

    __slots__ = ("state", "_entries", "_hashed", "_check")

    def __init__(self) -> None:
        self.state = SessionState()
        self._entries = hashlib.sha256()
        self._hashed = 0
        self._check: str | None = None

    def apply(self, rec: dict[str, Any], index: int) -> None:
        state = self.state
        before = self.said()
        state.apply(rec, index)
        op = rec.get("op")
        if op == "append":
            n = len(state.log_order)
            if n > self._hashed:  # (an append adds its own entry, at the end, or nothing)
                self._entries.update(str(rec["entry"]).encode("ascii", "replace"))
                self._hashed = n
        elif op == "snapshot":  # (a compacted log's, read as itself: its entries at once)
            for entry_id in state.log_order[self._hashed :]:
                self._entries.update(entry_id.encode("ascii", "replace"))
            self._hashed = len(state.log_order)
        if self.said() != before:
            self._check = None  # (the check is made of what said() gives, and of nothing else)

    def said(self) -> tuple[str | None, int, int]:
        """What :meth:`check` is made of, within one log (its entries grow only)."""
        return self.state.head, self._hashed, self.state.max_seq

    def check(self) -> str:
        """16 hex digits of SHA-256 over the entries' hash, the head and the highest number."""
        if self._check is None:
            h = self._entries.copy()
            h.update(f"|{self.state.head}|{self.state.max_seq}".encode("ascii", "replace"))
            self._check = h.hexdigest()[:16]
        return self._check


@dataclass
class LogView:
    """A session's log as a follower reads it: records (the first ``end`` of them are
    this view's; the list is the session's :class:`Tail`, which grows), the last
    commit's index among them, and who the session is."""

    ident: str
    header: dict[str, Any]
    records: list[dict[str, Any]]
    last_commit: int
    end: int


@dataclass
class Tail:
    """What the server has read of one session's log: the records, the last commit's
    index, and the backend's note of where the read ended, so the next read takes only
    what was written since (a follower's wakeup costs the new records, not the log)."""

    ident: str
    #: The handle the log was read through: another one (the session deleted and made
    #: again, or opened again) reads the log afresh.
    handle: object
    records: list[dict[str, Any]] = field(default_factory=list)
    last_commit: int = -1
    resume: Any = None
    #: What the first ``_told_to`` records tell (brought to the end when a route asks
    #: for the cursor at the log's end: :meth:`told`).
    _told: Told = field(default_factory=Told)
    _told_to: int = 0

    def extend(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            if rec.get("op") in COMMIT_POINTS:
                self.last_commit = len(self.records)
            self.records.append(rec)

    def told(self) -> Told:
        """What the records read tell, through the last."""
        told, records = self._told, self.records
        for i in range(self._told_to, len(records)):
            told.apply(records[i], i)
        self._told_to = len(records)
        return told


class Tails:
    """The :class:`Tail` of each session read lately (the most recent :data:`TAILS` of
    them), shared by every follower of a session and by the routes that answer a cursor."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._tails: OrderedDict[str, Tail] = OrderedDict()

    def read(self, session: Session) -> Tail:
        """The session's log as it is now (the caller holds the server's lock).

        What was written since the last read is added to the same :class:`Tail` while the
        backend reads on from where that read ended (``whole`` false). A log the backend
        reads from its start again (another handle, a log compacted, cut back or repaired)
        keeps the Tail only when it begins with exactly the records read; else it is
        another Tail, whose records a stream positioned in the old one finds its place in
        again (:meth:`Stream.since`)."""
        sessions = self.store.backend.sessions
        session_id = session.id
        ident = header_ident(session.header.data)
        tail = self._tails.get(session_id)
        if tail is not None and tail.ident == ident:
            self._tails.move_to_end(session_id)
            start = len(tail.records)
            if tail.handle is session:
                got = sessions.history_since(session_id, start, tail.resume)
                if not got.whole and got.total == start + len(got.records):
                    tail.extend(got.records)
                    tail.resume = got.resume
                    return tail
            got = sessions.history_since(session_id, 0, None)
            if len(got.records) >= start and got.records[:start] == tail.records:
                tail.extend(got.records[start:])
                tail.handle, tail.resume = session, got.resume
                return tail
        else:
            # First read, or another incarnation: all of it.
            got = sessions.history_since(session_id, 0, None)
        tail = Tail(ident, session, resume=got.resume)
        tail.extend(got.records)
        self._tails[session_id] = tail
        while len(self._tails) > TAILS:
            self._tails.popitem(last=False)
        return tail

    def cursor(self, session: Session) -> str:
        """The cursor at the end of the session's log as it is now."""
        tail = self.read(session)
        return cursor_of(len(tail.records), tail.ident, tail.told().check())

    def forget(self, session_id: str) -> None:
        """Let go of what was read of a session (deleted: its records and handle go now,
        not when :data:`TAILS` others have pushed them out)."""
        self._tails.pop(session_id, None)


def load_view(store: Store, tails: Tails, session_id: str, durable: bool) -> LogView:
    """Read the log (the caller holds the server's lock). ``durable``: commit first (the
    server is the writer), and serve the records through the last commit only."""
    s = store.session(session_id)
    if durable:
        s.commit()
    tail = tails.read(s)
    end = tail.last_commit + 1 if durable else len(tail.records)
    return LogView(tail.ident, dict(s.header.data), tail.records, tail.last_commit, end)


def cursor_of(position: int, ident: str, check: str) -> str:
    """The cursor after the first ``position`` records of a log of incarnation ``ident``,
    whose follower was told what :meth:`Told.check` gives there."""
    return f"{position}-{ident[7:23]}-{check}"


def parse_cursor(cursor: str) -> tuple[int, str, str] | None:
    """(position, incarnation tag, state check) of a cursor or an event id
    (``<cursor>.<n>``); None for what is no cursor of this form (an earlier form's
    ``<position>-<incarnation>`` among them: it says nothing to check the log against)."""
    text = cursor.rsplit(".", 1)[0] if "." in cursor else cursor
    parts = text.split("-")
    if len(parts) != 3:
        return None
    pos, tag, check = parts
    if not (pos.isascii() and pos.isdecimal() and len(pos) <= 18 and len(tag) == 16 and len(check) == 16):
        return None
    return int(pos), tag, check


def locate(records: list[dict[str, Any]], end: int, position: int, check: str) -> tuple[int, Told] | None:
    """Where in ``records[:end]`` a follower whose cursor says (``position``, ``check``)
    resumes, and what it was told there: at ``position`` when the state there checks; else
    at the last place the state checks (the log was rewritten: a compaction folds what the
    follower read into fewer records); None when it checks nowhere (a record it was sent
    is gone, or was never committed, or the cursor is no cursor of this log)."""
    told = Told()
    found = -1
    for i in range(end + 1):
        if told.check() == check:
            if i == position:
                return position, told
            found = i
        if i < end:
            told.apply(records[i], i)
    if found < 0:
        return None
    told = Told()
    for i in range(found):
        told.apply(records[i], i)
    return found, told


@dataclass
class Stream:
    """One follow: what it has sent, and how to frame it (SSE or NDJSON)."""

    store: Store
    session_id: str
    durable: bool
    sse: bool
    run: Callable[..., Any]  # the server's "do this under the lock" (Api.soon)
    changes: Changes
    tails: Tails
    max_age_s: float
    #: Records a resume replays at most (:data:`MAX_RESUME_RECORDS`): past it, a ``reset``.
    max_resume: int | None = MAX_RESUME_RECORDS
    position: int = 0
    ident: str = ""
    uncommitted: bool = False
    started: float = field(default_factory=time.monotonic)
    #: What the stream has told through ``position`` (each record's line says the state).
    told: Told = field(default_factory=Told)
    #: The records ``position`` counts in (a :class:`Tail`'s): another list is the log
    #: read again whole, in which the stream finds its place again (:func:`locate`).
    records: list[dict[str, Any]] | None = None

    def frame(self, kind: str, data: dict[str, Any], cursor: str, index: int = 0) -> bytes:
        event_id = f"{cursor}.{index}"
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        if self.sse:
            return f"id: {event_id}\nevent: {kind}\ndata: {body}\n\n".encode()
        return (json.dumps({"event": kind, "id": event_id, "data": data}, ensure_ascii=False, separators=(",", ":"))
                + "\n").encode()

    def cursor(self) -> str:
        """The cursor through what the stream has sent."""
        return cursor_of(self.position, self.ident, self.told.check())

    def _entry(self, entry_id: str) -> tuple[dict[str, Any], dict[str, Any] | None, int]:
        env_bytes = self.store.objects.get("entries", entry_id)
        chash = envelope_content(env_bytes)
        content = self.store.objects.get("contents", chash) if chash is not None else b"null"
        return json.loads(env_bytes), json.loads(content), len(env_bytes) + len(content)

    def whole(self, kind: str, view: LogView) -> bytes:
        """A snapshot or reset: every record, who the session is, entries inline."""
        told = Told()
        state = told.state
        lines: list[dict[str, Any]] = []
        inline: dict[str, Any] = {}
        budget = SNAPSHOT_INLINE_BYTES
        for i in range(view.end):
            rec = view.records[i]
            told.apply(rec, i)
            op = rec.get("op")
            if op not in LINES:
                continue  # (no line: log_line's None, without making the cursor)
            line = log_line(rec, state, i <= view.last_commit, cursor_of(i + 1, view.ident, told.check()))
            assert line is not None
            lines.append(line)
            entry = rec.get("entry")
            if op == "append" and isinstance(entry, str) and budget > 0:
                env, content, size = self._entry(entry)
                budget -= size
                if budget >= 0:
                    inline[entry] = {"envelope": env, "content": content}
        self.position = view.end
        self.told = told
        self.records = view.records
        self.ident = view.ident
        self.uncommitted = any(not x["durable"] for x in lines)
        data = {"session": self.session_id, "header": view.header, "incarnation": view.ident, "head": state.head,
                "mark": state.mark, "base": state.base, "records": lines, "entries": inline, "inline": budget >= 0}
        return self.frame(kind, data, self.cursor())

    def resume(self, cursor: str | None, view: LogView, *, back: bool = False) -> bool:
        """Take up the stream after ``cursor`` (see :func:`locate`); False when it cannot be.

        ``back``: the cursor is a follower's, come back (``Last-Event-ID``, ``after``), not
        this stream's own. Such a follower may hold records it was told as not durable, by
        a stream before this one or by a log read, which a commit has covered since or will
        cover: the stream is then :attr:`uncommitted`, so it says ``committed`` at the
        commit that covers them, or first when that commit lies before the follower's place
        (:meth:`since`). It may when a lazy append lies after the last commit point before
        its place (what it was told before that commit, it was told ``committed`` for, or
        as durable; an append made durable came with its commit; :func:`_uncommitted`), or
        when its place was found elsewhere than its cursor counts (a log rewritten: what it
        was told is not known, and a ``committed`` too many says nothing false). It may not
        when the event it resumes after is the ``committed`` sent at its place (index 1 of
        its cursor)."""
        parsed = parse_cursor(cursor) if cursor is not None else None
        if parsed is None or parsed[1] != view.ident[7:23]:
            return False
        found = locate(view.records, view.end, parsed[0], parsed[2])
        if found is None:
            return False
        self.position, self.told = found
        self.records, self.ident = view.records, view.ident
        if back and cursor is not None and _event_index(cursor) != _COMMITTED_INDEX:
            self.uncommitted = self.position != parsed[0] or _uncommitted(view.records, self.position, lazy=True)
        return True

    def since(self, view: LogView) -> list[bytes]:
        """The events for the records after the stream's position (the stream's state is
        kept from one call to the next, so each costs only the new records). In a log read
        again whole (another list of records) the stream first finds its place, or sends
        a ``reset`` when the log no longer holds what it told."""
        if view.records is not self.records and not self.resume(self.cursor(), view):
            return [self.whole("reset", view)]
        if view.end < self.position:
            return [self.whole("reset", view)]  # records taken back (a failed commit)
        out: list[bytes] = []
        if self.uncommitted and view.last_commit < self.position and not _uncommitted(
                view.records, self.position, view.last_commit):
            # What was sent as not durable is committed through the stream's place, by a
            # commit before it (a log rewritten: a stream that found its place again past
            # the commit, or a follower back after it), so no commit record ahead will say
            # it: said before anything after that place. The second event of its cursor:
            # the first was the record's own. (A commit ahead says it as the stream passes.)
            cursor = self.cursor()
            out.append(self.frame("committed", {"cursor": cursor}, cursor, _COMMITTED_INDEX))
            self.uncommitted = False
        told = self.told
        state = told.state
        for i in range(self.position, view.end):
            rec = view.records[i]
            told.apply(rec, i)
            op = rec.get("op")
            durable = i <= view.last_commit
            if op == "append":
                cursor = cursor_of(i + 1, view.ident, told.check())
                entry = str(rec.get("entry"))
                env, content, _ = self._entry(entry)
                line = log_line(rec, state, durable, cursor)
                assert line is not None
                out.append(self.frame("appended", dict(line, envelope=env, content=content), cursor))
                self.uncommitted |= not durable
            elif op == "head":
                cursor = cursor_of(i + 1, view.ident, told.check())
                out.append(self.frame("head", {"leaf": rec.get("head"), "durable": durable, "cursor": cursor}, cursor))
                self.uncommitted |= not durable
            elif op in COMMIT_POINTS and self.uncommitted:
                cursor = cursor_of(i + 1, view.ident, told.check())
                out.append(self.frame("committed", {"cursor": cursor}, cursor))
                self.uncommitted = False
        self.position = view.end
        return out

    async def events(self, first: LogView, after: str | None) -> AsyncIterator[bytes]:
        # With a max_resume, a resume further behind is a reset: it then costs what a
        # snapshot does (finding its place, each record's line, the entries inline up to
        # SNAPSHOT_INLINE_BYTES), not an event and two object reads for every record since.
        if not self.resume(after, first, back=True) or (
                self.max_resume is not None and first.end - self.position > self.max_resume):
            yield self.whole("snapshot" if after is None else "reset", first)
        else:
            for chunk in self.since(first):
                yield chunk
        # The keep-alive is due HEARTBEAT_S after the last byte sent, not after the last
        # wake: a request on the session that makes no event (a lease's renewal) wakes
        # the stream, and a renewal more often than the heartbeat kept it silent for good,
        # which a follower takes for a stream gone dead.
        said = time.monotonic()
        while True:
            now = time.monotonic()
            left = self.max_age_s - (now - self.started)
            if left <= 0 or self.changes.closing:
                cursor = self.cursor()
                reason = "shutdown" if self.changes.closing else "max_stream_age"
                yield self.frame("end", {"reason": reason, "cursor": cursor}, cursor)
                return
            due = HEARTBEAT_S - (now - said)
            if due <= 0:
                said = now
                yield b": keep-alive\n\n" if self.sse else b"\n"
                continue
            event = self.changes.event(self.session_id)
            try:
                await asyncio.wait_for(event.wait(), timeout=min(due, left))
            except TimeoutError:
                continue  # (the keep-alive, or the end, is due: said above)
            if self.changes.closing:
                continue  # (ended above, its cursor where a follower resumes on the next server)
            try:
                view = await self.run(load_view, self.store, self.tails, self.session_id, self.durable)
            except AgentSessionError as exc:  # NoSuchSessionError among them: no_session
                yield self.frame("error", problem_body(exc), self.cursor())
                return
            if view.ident != self.ident:
                gone = NoSuchSessionError(f"session {self.session_id} was deleted (and created again) while followed")
                yield self.frame("error", problem_body(gone), self.cursor())
                return
            for chunk in self.since(view):
                said = time.monotonic()
                yield chunk


#: The index, among the events of one cursor, of a ``committed`` sent at a place the
#: stream had already reached (after the record's own event, index 0).
_COMMITTED_INDEX = 1


def _event_index(event_id: str) -> int:
    """The index among its cursor's events of the event ``event_id`` names (0 for a bare
    cursor)."""
    _, dot, n = event_id.rpartition(".")
    return int(n) if dot and n.isascii() and n.isdecimal() and len(n) <= 4 else 0


def _uncommitted(records: list[dict[str, Any]], position: int, last_commit: int = -1, *, lazy: bool = False) -> bool:
    """Whether among the first ``position`` records, after the last commit point before
    them (looked for back from ``position``, no further than ``last_commit`` when that is
    known), lies a record a follower is told of (:data:`LINES`).

    With ``lazy``, one it may have been told of as not durable: a lazy append (an append
    made durable and a head move are written with their commit, which a follower reads
    with them), or any, when the commit point before them is the ``create``: those may
    be a compacted log's snapshot, expanded, whose appends keep no ``lazy`` flag."""
    told = False
    for i in range(position - 1, last_commit, -1):
        rec = records[i]
        op = rec.get("op")
        if op in COMMIT_POINTS:
            return lazy and told and op == "create"
        if op in LINES:
            if not lazy or rec.get("lazy"):
                return True
            told = True
    return False


def log_line(rec: dict[str, Any], state: SessionState, durable: bool, cursor: str) -> dict[str, Any] | None:
    """A record in the log's line shape (None for one a follower is not told of: one
    whose op is not among :data:`LINES`)."""
    op = rec.get("op")
    if op == "append":
        leaf = bool(rec.get("leaf_label"))
        if "head" in rec:
            outcome = "leaf_moved" if leaf else "continued"
        else:
            outcome = "leaf_not_moved" if leaf else "branched"
        return {"seq": rec.get("seq"), "entry": rec.get("entry"), "head": state.head, "outcome": outcome,
                "durable": durable, "cursor": cursor}
    if op == "head":
        return {"seq": state.max_seq, "head": rec.get("head"), "durable": durable, "cursor": cursor}
    return None
