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
  commit covers records sent as not durable;
- ``error``: the session was deleted (or created again) under a live follow:
  ``no_session``, and the stream ends.

Every event's id is ``<cursor>.<n>``; a client resumes with ``Last-Event-ID`` (or
``after``), and a cursor the server cannot resume from (another incarnation,
past the log's end) is answered with a ``reset``, never a silent skip. A stream
lives at most ``max_stream_age_s`` and then ends with an ``end`` event carrying
the cursor to resume from (``reason``: ``max_stream_age``); a server that stops ends
every open stream so at once (``reason``: ``shutdown``), rather than wait for it to
reach its age.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import field
from typing import Any

from ..errors import AgentSessionError, NoSuchSessionError
from ..exchange.wire import problem_body
from ..format.hashing import envelope_content
from ..lean import dataclass
from ..store.refs import header_ident
from ..store.session import Session
from ..store.state import SessionState
from ..store.store import Store

__all__ = ["Changes", "LogView", "SNAPSHOT_INLINE_BYTES", "Stream", "Tail", "Tails", "cursor_of", "load_view", "log_line"]

#: Bytes of entries a snapshot carries inline before it leaves them to ``path``.
SNAPSHOT_INLINE_BYTES = 4 * 1024 * 1024
#: Seconds between keep-alive comments on an idle stream.
HEARTBEAT_S = 15.0
#: Sessions whose log the server keeps what it read of (see :class:`Tails`).
TAILS = 256


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

    def extend(self, records: list[dict[str, Any]]) -> None:
        for rec in records:
            if rec.get("op") in ("commit", "create"):
                self.last_commit = len(self.records)
            self.records.append(rec)


class Tails:
    """The :class:`Tail` of each session read lately (the most recent :data:`TAILS` of
    them), shared by every follower of a session and by the routes that answer a cursor."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._tails: OrderedDict[str, Tail] = OrderedDict()

    def read(self, session: Session) -> Tail:
        """The session's log as it is now (the caller holds the server's lock)."""
        sessions = self.store.backend.sessions
        session_id = session.id
        ident = header_ident(session.header.data)
        tail = self._tails.get(session_id)
        if tail is not None and tail.ident == ident and tail.handle is session:
            self._tails.move_to_end(session_id)
            start = len(tail.records)
            got = sessions.history_since(session_id, start, tail.resume)
            if got.total == start + len(got.records):
                tail.extend(got.records)
                tail.resume = got.resume
                return tail
        # First read, another incarnation, or a log cut back or rewritten: all of it.
        got = sessions.history_since(session_id, 0, None)
        tail = Tail(ident, session, resume=got.resume)
        tail.extend(got.records)
        self._tails[session_id] = tail
        while len(self._tails) > TAILS:
            self._tails.popitem(last=False)
        return tail

    def length(self, session: Session) -> int:
        """How many records the session's log holds (what a cursor counts)."""
        return len(self.read(session).records)


def load_view(store: Store, tails: Tails, session_id: str, durable: bool) -> LogView:
    """Read the log (the caller holds the server's lock). ``durable``: commit first (the
    server is the writer), and serve the records through the last commit only."""
    s = store.session(session_id)
    if durable:
        s.commit()
    tail = tails.read(s)
    end = tail.last_commit + 1 if durable else len(tail.records)
    return LogView(tail.ident, dict(s.header.data), tail.records, tail.last_commit, end)


def cursor_of(position: int, ident: str) -> str:
    return f"{position}-{ident[7:23]}"


def resume_position(cursor: str | None, view: LogView) -> int | None:
    """Where to resume after ``cursor`` (``<cursor>`` or an event id ``<cursor>.<n>``), or
    None when it cannot be resumed from here (then a reset is sent)."""
    if cursor is None:
        return None
    text = cursor.rsplit(".", 1)[0] if "." in cursor else cursor
    pos, _, tag = text.partition("-")
    if not pos.isdigit() or tag != view.ident[7:23] or int(pos) > view.end:
        return None
    return int(pos)


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
    position: int = 0
    ident: str = ""
    uncommitted: bool = False
    started: float = field(default_factory=time.monotonic)
    #: The session's state through ``position`` (what each record's line says of it).
    state: SessionState = field(default_factory=SessionState)

    def frame(self, kind: str, data: dict[str, Any], cursor: str, index: int = 0) -> bytes:
        event_id = f"{cursor}.{index}"
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        if self.sse:
            return f"id: {event_id}\nevent: {kind}\ndata: {body}\n\n".encode()
        return (json.dumps({"event": kind, "id": event_id, "data": data}, ensure_ascii=False, separators=(",", ":"))
                + "\n").encode()

    def _entry(self, entry_id: str) -> tuple[dict[str, Any], dict[str, Any] | None, int]:
        env_bytes = self.store.objects.get("entries", entry_id)
        chash = envelope_content(env_bytes)
        content = self.store.objects.get("contents", chash) if chash is not None else b"null"
        return json.loads(env_bytes), json.loads(content), len(env_bytes) + len(content)

    def whole(self, kind: str, view: LogView) -> bytes:
        """A snapshot or reset: every record, who the session is, entries inline."""
        state = SessionState()
        lines: list[dict[str, Any]] = []
        inline: dict[str, Any] = {}
        budget = SNAPSHOT_INLINE_BYTES
        for i in range(view.end):
            rec = view.records[i]
            state.apply(rec, i)
            line = log_line(rec, state, i <= view.last_commit, cursor_of(i + 1, view.ident))
            if line is None:
                continue
            lines.append(line)
            entry = rec.get("entry")
            if rec.get("op") == "append" and isinstance(entry, str) and budget > 0:
                env, content, size = self._entry(entry)
                budget -= size
                if budget >= 0:
                    inline[entry] = {"envelope": env, "content": content}
        self.position = view.end
        self.state = state
        self.ident = view.ident
        self.uncommitted = any(not x["durable"] for x in lines)
        data = {"session": self.session_id, "header": view.header, "incarnation": view.ident, "head": state.head,
                "mark": state.mark, "base": state.base, "records": lines, "entries": inline, "inline": budget >= 0}
        return self.frame(kind, data, cursor_of(self.position, view.ident))

    def since(self, view: LogView) -> list[bytes]:
        """The events for the records after the stream's position (the stream's state is
        kept from one call to the next, so each costs only the new records)."""
        out: list[bytes] = []
        if self.state.records != self.position:  # resumed from a cursor: the state up to it
            self.state = SessionState()
            for i in range(self.position):
                self.state.apply(view.records[i], i)
        state = self.state
        for i in range(self.position, view.end):
            rec = view.records[i]
            state.apply(rec, i)
            cursor = cursor_of(i + 1, view.ident)
            durable = i <= view.last_commit
            op = rec.get("op")
            if op == "append":
                entry = str(rec.get("entry"))
                env, content, _ = self._entry(entry)
                line = log_line(rec, state, durable, cursor)
                assert line is not None
                out.append(self.frame("appended", dict(line, envelope=env, content=content), cursor))
                self.uncommitted |= not durable
            elif op == "head":
                out.append(self.frame("head", {"leaf": rec.get("head"), "durable": durable, "cursor": cursor}, cursor))
                self.uncommitted |= not durable
            elif op in ("commit", "create") and self.uncommitted:
                out.append(self.frame("committed", {"cursor": cursor}, cursor))
                self.uncommitted = False
        self.position = view.end
        return out

    async def events(self, first: LogView, after: str | None) -> AsyncIterator[bytes]:
        resumed = resume_position(after, first)
        if resumed is None:
            yield self.whole("snapshot" if after is None else "reset", first)
        else:
            self.position, self.ident = resumed, first.ident
            for chunk in self.since(first):
                yield chunk
        while True:
            left = self.max_age_s - (time.monotonic() - self.started)
            if left <= 0 or self.changes.closing:
                cursor = cursor_of(self.position, self.ident)
                reason = "shutdown" if self.changes.closing else "max_stream_age"
                yield self.frame("end", {"reason": reason, "cursor": cursor}, cursor)
                return
            event = self.changes.event(self.session_id)
            try:
                await asyncio.wait_for(event.wait(), timeout=min(HEARTBEAT_S, left))
            except TimeoutError:
                yield b": keep-alive\n\n" if self.sse else b"\n"
                continue
            if self.changes.closing:
                continue  # (ended above, its cursor where a follower resumes on the next server)
            try:
                view = await self.run(load_view, self.store, self.tails, self.session_id, self.durable)
            except NoSuchSessionError as exc:
                yield self.frame("error", problem_body(exc), cursor_of(self.position, self.ident))
                return
            except AgentSessionError as exc:
                yield self.frame("error", problem_body(exc), cursor_of(self.position, self.ident))
                return
            if view.ident != self.ident:
                gone = NoSuchSessionError(f"session {self.session_id} was deleted (and created again) while followed")
                yield self.frame("error", problem_body(gone), cursor_of(self.position, self.ident))
                return
            if view.end < self.position:
                yield self.whole("reset", view)  # records taken back (a failed commit, a repair)
                continue
            for chunk in self.since(view):
                yield chunk


def log_line(rec: dict[str, Any], state: SessionState, durable: bool, cursor: str) -> dict[str, Any] | None:
    """A record in the log's line shape (None for one a follower is not told of)."""
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
