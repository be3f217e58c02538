"""Sessions and their logs in the ``sessions`` and ``log`` tables.

A writer holds its session with a PostgreSQL advisory lock on a connection of
its own, kept for as long as the handle is open: two processes, on one
machine or two, never interleave one session's records, and a writer that
dies (or whose connection drops) lets go at once, the server releasing the
lock. Taking the hold also raises the session's ``fence``, and every write
is one statement, its own transaction (the schema's ``append_records``, one
round trip), whose first step is the conditional update

    UPDATE sessions SET last_pos = …, head = …, mark = …
     WHERE key = … AND fence = <the handle's token> AND last_pos = <what it last wrote>

so a handle that lost its hold (its connection dropped and another writer
took the session) changes nothing: the head's compare-and-swap and the log's
order are one row's. The log rows, the objects and that update commit
together. A durable write commits with ``synchronous_commit = on``; a lazy
one with ``off`` (PostgreSQL's asynchronous commit: visible at once, on disk
within the WAL writer's delay), and ``commit()`` writes the commit record
synchronously, which flushes every earlier asynchronous commit with it.

A record a writer wrote lazily and never committed (it was killed) is a
committed row all the same, whole: the next writing open adopts it with a
commit record, as the file backend adopts an uncommitted tail whose objects
are sound. A server crash can take the last asynchronous commits, and then
takes their rows, objects and head update together.
"""

from __future__ import annotations

import builtins
import json
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from psycopg import pq

from ...errors import (
    AgentSessionError,
    NoSuchSessionError,
    SessionDamagedError,
    SessionExistsError,
    SessionLockedError,
    StoreError,
)
from ...format.canonical import canonical_bytes
from ..base import COMMIT_POINTS, Append, LogHistory, LogOpen, Mark, Record, SessionLog, SessionStore, Space
from .arrays import bool_array, boolean, bytea_array, int2_array, int4, int4_array, int8, text_array
from .database import checked, psycopg, translate
from .objects import IN_PACKED, copy_rows, object_rows, packed, raw_hash

if TYPE_CHECKING:
    from . import PostgresBackend

__all__ = ["PgSessions", "PgSessionLog"]

#: The log's columns and their types, for COPY.
LOG_COLUMNS = "log (session, pos, op, seq, hash, content, record)"
LOG_TYPES = ["int8", "int4", "text", "int4", "bytea", "bytea", "text"]
_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_DECODE = json.JSONDecoder().raw_decode
#: An append: one prepared statement, its parameters sent in the binary format
#: (:mod:`.arrays`), each of the type its cast here names. It is run through libpq itself
#: (:func:`_call_append`), not psycopg's execute, whose Python-level adaptation and wait
#: loop cost more client CPU than the rest of the backend's work on an append.
_APPEND_NAME = b"agentsession_append_records"
_APPEND_SQL = (
    b"SELECT append_records($1::bigint, $2::bigint, $3::integer, $4::text, $5::text, $6::boolean, $7::bigint, "
    b"$8::smallint[], $9::bytea[], $10::smallint[], $11::bytea[], $12::bytea[], $13::bytea[], "
    b"$14::boolean[], $15::text[], $16::integer[], $17::bytea[], $18::bytea[], $19::text[])"
)
#: SQLSTATE of a statement name the connection has not prepared (a connection's first append).
_NOT_PREPARED = b"26000"
#: Every parameter of the append in the binary format.
_BINARY = [1] * 19
#: The ``states`` rows' kinds (schema.STATES).
_SUMMARY, _RULES = 0, 1


def _call_append(conn: Any, params: list[bytes | None]) -> bool:
    """Run ``append_records`` on ``conn`` (autocommit: the call is its own transaction), its
    parameters in the binary format, and say what it returned; psycopg's error for a failed call, OperationalError where the
    connection is gone. A blocking libpq call: it releases the GIL (other writers run
    meanwhile) but, unlike psycopg's wait, Ctrl-C takes effect only when it returns; a
    network that stops answering is bounded by libpq's keepalives settings in the URL."""
    pgconn = conn.pgconn
    with conn.lock:
        res = pgconn.exec_prepared(_APPEND_NAME, params, _BINARY)
        if res.status == pq.ExecStatus.FATAL_ERROR and res.error_field(pq.DiagnosticField.SQLSTATE) == _NOT_PREPARED:
            prep = pgconn.prepare(_APPEND_NAME, _APPEND_SQL)
            if prep.status != pq.ExecStatus.COMMAND_OK:
                res = prep
            else:
                res = pgconn.exec_prepared(_APPEND_NAME, params, _BINARY)
    return bool(checked(conn, res).get_value(0, 0) == b"t")


def _holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


def log_rows(key: int, start: int, records: Sequence[Record]) -> list[tuple[Any, ...]]:
    """The ``log`` rows of records written from position ``start``."""
    rows: list[tuple[Any, ...]] = []
    pos = start
    for r in records:
        pos += 1
        if isinstance(r, Append):
            content = raw_hash(r.objects[0]) if r.objects is not None else None
            rows.append((key, pos, "append", r.seq, raw_hash(r.entry), content, _DUMPS(r.as_record())))
        else:
            entry = r.get("entry")
            seq = r.get("seq")
            rows.append((key, pos, str(r.get("op")), seq if isinstance(seq, int) else None,
                         raw_hash(entry) if isinstance(entry, str) else None, None, _DUMPS(r)))
    return rows


def indexes_after(records: Sequence[Record], head: str | None, mark: str) -> tuple[str | None, str]:
    """The head and mark the log says after ``records`` (the row keeps them in step)."""
    for r in records:
        if isinstance(r, Append):
            if r.head_moved:
                head = r.head
        elif r.get("op") == "head":
            head = r.get("head")
        elif r.get("op") == "mark":
            mark = str(r.get("mark"))
        elif r.get("op") == "create":
            mark = str(r.get("mark"))
            head = r.get("base")
    return head, mark


def _objects_of(records: Sequence[Record]) -> list[tuple[Space, str, bytes]]:
    out: list[tuple[Space, str, bytes]] = []
    for r in records:
        if isinstance(r, Append) and r.objects is not None:
            chash, content, env = r.objects
            out.append(("contents", chash, content))
            out.append(("entries", r.entry, env))
    return out


def parse_record(text: str) -> dict[str, Any] | str:
    """A log row's record, or why it is none (a row someone altered: damage)."""
    try:
        # A record is written as compact JSON: its text parsed directly (what json.loads
        # does after skipping whitespace, for less per row); anything else by json.loads.
        record, end = _DECODE(text)
        if end != len(text):
            record = json.loads(text)
    except ValueError:
        try:
            record = json.loads(text)
        except ValueError as exc:
            return f"is not a JSON record ({exc})"
    if not isinstance(record, dict) or not isinstance(record.get("op"), str):
        return "is not a record (a JSON object with an op)"
    return record


def _uncommitted_tail(records: list[dict[str, Any]]) -> bool:
    """Whether records follow the last commit (or create): a writer's lazy work it never committed."""
    return bool(records) and records[-1].get("op") not in COMMIT_POINTS


class PgSessionLog(SessionLog):
    """One session's log: writable (its own connection, holding the advisory lock) or a snapshot."""

    def __init__(self, backend: PostgresBackend, session_id: str, key: int, *, writable: bool,
                 conn: Any = None, fence: int = 0, last_pos: int = 0, head: str | None = None, mark: str = "mirror"):
        self.backend = backend
        self.session_id = session_id
        self.key = key
        self.writable = writable
        self.stopped: str | None = None
        self.conn = conn
        self.fence = fence
        self.last_pos = last_pos
        self.head = head
        self.mark = mark
        self.committed = True
        self._recover: list[dict[str, Any]] = []
        self._closed = False
        self._parked = False
        #: What the domain handed over to keep at close (``states``), by kind.
        self._states: dict[int, Mapping[str, Any]] = {}

    def _check(self) -> Any:
        if self._closed:
            raise StoreError(f"session {self.session_id} is closed")
        if not self.writable:
            raise StoreError(f"session {self.session_id} is open read-only")
        if self._parked or self.conn is None:
            raise StoreError(f"session {self.session_id} is no longer held by this handle")
        if self.stopped:
            raise StoreError(f"session {self.session_id} stopped writing: {self.stopped}")
        return self.conn

    def _write(self, records: Sequence[Record], *, durable: bool) -> None:
        """One statement in a transaction of its own (the schema's ``append_records``): the
        conditional update of the session's row, the objects the records carry, their
        edges and the log rows. Nothing of it is left when it fails."""
        conn = self._check()
        head, mark = indexes_after(records, self.head, self.mark)
        rows = log_rows(self.key, self.last_pos, records)
        end = self.last_pos + len(rows)
        orows, erows, _ = object_rows(_objects_of(records), self.backend.objects.codecs)
        cols = list(zip(*rows))
        try:
            done = _call_append(conn, [
                int8(self.key), int8(self.fence), int4(self.last_pos), None if head is None else head.encode(), mark.encode(),
                boolean(not durable), int8(self.backend.db.lock_key("sweep")),
                int2_array(r[0] for r in orows), bytea_array(r[1] for r in orows), int2_array(r[2] for r in orows),
                bytea_array(r[3] for r in orows),
                bytea_array(e[0] for e in erows), bytea_array(e[1] for e in erows), bool_array(e[2] for e in erows),
                text_array(cols[2]), int4_array(cols[3]), bytea_array(cols[4]), bytea_array(cols[5]), text_array(cols[6])])
            if not done:
                raise _Fenced()
        except _Fenced:
            self._lost_hold()
        except psycopg.OperationalError as exc:
            # The connection is gone: whether the commit reached the server is unknown,
            # so the handle stops and the next open reads what the database holds.
            self.stopped = f"the connection to the database failed: {' '.join(str(exc).split())}"
            raise StoreError(f"session {self.session_id}: {self.stopped}; reopen the session") from exc
        except psycopg.Error as exc:
            raise StoreError(f"session {self.session_id}: the write failed and was rolled back: {exc}") from exc
        self.last_pos, self.head, self.mark = end, head, mark

    def _lost_hold(self) -> None:
        rows = self.backend.db.query("SELECT fence FROM sessions WHERE key = %s", [self.key])
        if not rows:
            self.stopped = "the session was deleted"
            raise NoSuchSessionError(f"no such session: {self.session_id} (deleted since it was opened)")
        self.stopped = f"another writer took the session (fencing token {rows[0][0]}, this handle's {self.fence})"
        raise SessionLockedError(f"session {self.session_id}: {self.stopped}; nothing was written")

    def recover(self) -> None:
        if self._recover:
            self._write(self._recover, durable=True)
            self._recover = []

    def write(self, records: Sequence[Record], *, commit: bool) -> str | None:
        out = list(records)
        if commit:
            out.append({"op": "commit"})
        self._write(out, durable=commit)
        self.committed = commit
        return None

    def commit(self) -> None:
        if not self.writable or self._closed or self._parked or self.committed:
            return
        self._write([{"op": "commit"}], durable=True)
        self.committed = True

    def set_indexes(self, head: str | None, mark: Mark) -> None:
        """Nothing to do: the session's row is updated in each write's own transaction."""

    def set_summary(self, summary: Mapping[str, Any]) -> None:
        if self.writable and not self._closed:
            self._states[_SUMMARY] = dict(summary)

    def set_rule_state(self, state: Mapping[str, Any]) -> None:
        if self.writable and not self._closed:
            self._states[_RULES] = dict(state)

    def kept_rule_state(self) -> dict[str, Any] | None:
        kept = self.backend.sessions.states(self.key, _RULES)
        return kept[1] if kept is not None else None

    def _keep_states(self) -> None:
        """The states handed over, in ``states``, as of the log's length now: one statement,
        committed asynchronously (an index: lost, the next open rebuilds it), written only
        while this handle still holds the session at that length."""
        states, self._states = self._states, {}
        if not states or self.conn is None or self.stopped or self._parked:
            return
        kinds, data = [], []
        for kind, value in sorted(states.items()):
            try:
                data.append(canonical_bytes(value))
            except (ValueError, AgentSessionError):
                continue  # no I-JSON: none is kept, the next reader rebuilds it
            kinds.append(kind)
        if not kinds:
            return
        try:
            with self.conn.transaction():
                self.conn.execute("SET LOCAL synchronous_commit = off")
                self.conn.execute(
                    "INSERT INTO states (session, kind, pos, data) "
                    "SELECT %s, k, %s, d FROM unnest(%s::smallint[], %s::bytea[]) AS t(k, d) "
                    "WHERE EXISTS (SELECT 1 FROM sessions WHERE key = %s AND fence = %s AND last_pos = %s) "
                    "ON CONFLICT (session, kind) DO UPDATE SET pos = EXCLUDED.pos, data = EXCLUDED.data",
                    [self.key, self.last_pos, kinds, data, self.key, self.fence, self.last_pos])
        except psycopg.Error:
            pass  # an index, as above: the session's records are all committed already

    def set_header(self, header: bytes) -> None:
        conn = self._check()
        with translate(self.backend.describe()):
            moved = conn.execute(
                "UPDATE sessions SET header = %s WHERE key = %s AND fence = %s RETURNING 1", [bytes(header), self.key, self.fence]
            ).fetchone()
        if moved is None:
            self._lost_hold()

    def park(self) -> bool:
        if not self.writable or self._closed:
            return False
        self.commit()
        self._release()
        self._parked = True
        return True

    def resume(self) -> bool:
        if not self._parked or self._closed:
            return False
        conn = self.backend.sessions.take(self.session_id)
        try:
            with translate(self.backend.describe()):
                row = conn.execute(
                    "UPDATE sessions SET fence = fence + 1, holder = %s WHERE key = %s AND last_pos = %s RETURNING fence",
                    [_holder(), self.key, self.last_pos],
                ).fetchone()
        except BaseException:
            self.backend.sessions.let_go(conn)
            raise
        if row is None:  # written (or deleted) since: the caller reopens it
            self.backend.sessions.let_go(conn)
            return False
        self.conn, self.fence, self._parked = conn, int(row[0]), False
        return True

    def _release(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            self.backend.sessions.let_go(conn)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._keep_states()
        finally:
            self._release()


def _state(data: bytes) -> dict[str, Any] | None:
    """A kept state's object, or None where its bytes are no JSON object (an index that is
    rebuilt). Parsed by json's own parser: bytes this store wrote, whose form the domain
    checks as it uses them (the file backend's ``rules`` are read so too)."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


class _Fenced(Exception):
    """The conditional update matched no row: this handle no longer holds the session."""


class PgSessions(SessionStore):
    def __init__(self, backend: PostgresBackend):
        self.backend = backend
        self.db = backend.db

    # -- the hold -----------------------------------------------------------------------

    def take(self, session_id: str) -> Any:
        """A connection of the pool holding the session's advisory lock; SessionLockedError
        when another connection holds it."""
        conn = self.db.getconn()
        try:
            with translate(self.backend.describe()):
                got = conn.execute("SELECT pg_try_advisory_lock(%s)", [self.db.lock_key(f"session/{session_id}")]).fetchone()
        except BaseException:
            self.db.putconn(conn)
            raise
        if not got or not got[0]:
            self.db.putconn(conn)
            raise SessionLockedError(f"session {session_id} is held by another writer")
        return conn

    def let_go(self, conn: Any) -> None:
        """Release every advisory lock the connection holds and give it back (a
        connection that cannot say so is closed, which releases them too)."""
        try:
            if not conn.closed:
                conn.execute("SELECT pg_advisory_unlock_all()")
        except psycopg.Error:
            conn.close()
        self.db.putconn(conn)

    # -- reading ------------------------------------------------------------------------

    def list(self) -> list[str]:
        return [r[0] for r in self.db.query('SELECT id FROM sessions ORDER BY id COLLATE "C"')]

    def exists(self, session_id: str) -> bool:
        return bool(self.db.query("SELECT 1 FROM sessions WHERE id = %s", [session_id]))

    def header(self, session_id: str) -> bytes | None:
        rows = self.db.query("SELECT header FROM sessions WHERE id = %s", [session_id])
        return bytes(rows[0][0]) if rows else None

    def rows(self, conn: Any, session_id: str) -> tuple[tuple[Any, ...], builtins.list[tuple[int, str]]]:
        """The session's row and its log's rows (position, record text), in one snapshot."""
        row, texts, _ = self._snapshot(conn, session_id, ())
        return row, texts

    def _snapshot(
        self, conn: Any, session_id: str, kinds: Sequence[int]
    ) -> tuple[tuple[Any, ...], builtins.list[tuple[int, str]], dict[int, tuple[int, bytes]]]:
        """:meth:`rows`, and the ``states`` of ``kinds`` kept for the session (kind ->
        (log length, bytes)), all in one snapshot."""
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            row = conn.execute(
                "SELECT key, header, head, mark, last_pos, fence FROM sessions WHERE id = %s", [session_id]
            ).fetchone()
            if row is None:
                raise NoSuchSessionError(f"no such session: {session_id}")
            texts = conn.execute("SELECT pos, record FROM log WHERE session = %s ORDER BY pos", [row[0]]).fetchall()
            kept = {} if not kinds else {int(k): (int(p), bytes(d)) for k, p, d in conn.execute(
                "SELECT kind, pos, data FROM states WHERE session = %s AND kind = ANY(%s)", [row[0], list(kinds)]).fetchall()}
        return row, texts, kept

    def _read(
        self, conn: Any, session_id: str, kinds: Sequence[int] = ()
    ) -> tuple[tuple[Any, ...], builtins.list[dict[str, Any]], dict[int, dict[str, Any]]]:
        """The session's row, its log's records and the states of ``kinds`` that parse;
        SessionDamagedError at a row that is no record."""
        row, texts, kept = self._snapshot(conn, session_id, kinds)
        records = []
        for pos, text in texts:
            record = parse_record(text)
            if isinstance(record, str):
                raise SessionDamagedError(f"log row {pos} {record}", session=session_id, line=pos, offset=0)
            records.append(record)
        return row, records, {k: v for k, (_, data) in kept.items() if (v := _state(data)) is not None}

    def states(self, key: int, kind: int) -> tuple[int, dict[str, Any]] | None:
        """The state of ``kind`` kept for the session incarnation ``key``: (the log's length it
        describes, the object); None when none is kept or it does not parse."""
        rows = self.db.query("SELECT pos, data FROM states WHERE session = %s AND kind = %s", [key, kind])
        if not rows:
            return None
        value = _state(bytes(rows[0][1]))
        return None if value is None else (int(rows[0][0]), value)

    def summary(self, session_id: str) -> tuple[dict[str, Any], bool] | None:
        """The summary kept, current while the log is the length it was written at (a repair,
        which may keep the length, deletes it)."""
        rows = self.db.query(
            "SELECT st.pos, st.data, s.last_pos FROM sessions s JOIN states st ON st.session = s.key "
            "WHERE s.id = %s AND st.kind = %s", [session_id, _SUMMARY])
        if not rows:
            return None
        value = _state(bytes(rows[0][1]))
        return None if value is None else (value, int(rows[0][0]) == int(rows[0][2]))

    def open(self, session_id: str, *, writable: bool) -> tuple[SessionLog, LogOpen]:
        if not writable:
            with self.db.conn() as c:
                row, records, kept = self._read(c, session_id, (_SUMMARY,))
            # A snapshot is mostly opened to be read whole (a projection): read ahead.
            self.backend.objects.expect([r["entry"] for r in records if r.get("op") == "append" and "entry" in r])
            key, header, head, mark, last_pos, _ = row
            log = PgSessionLog(self.backend, session_id, key, writable=False, last_pos=last_pos, head=head, mark=mark)
            return log, LogOpen(bytes(header), records, head, mark, summary=kept.get(_SUMMARY))
        self.backend.require_writable()
        conn = self.take(session_id)
        try:
            with translate(self.backend.describe()):
                row, records, kept = self._read(conn, session_id, (_SUMMARY, _RULES))
                key, header, head, mark, last_pos, _ = row
                fence = conn.execute(
                    "UPDATE sessions SET fence = fence + 1, holder = %s WHERE key = %s RETURNING fence", [_holder(), key]
                ).fetchone()[0]
        except BaseException:
            self.let_go(conn)
            raise
        if len(records) != last_pos:
            self.let_go(conn)
            raise StoreError(
                f"session {session_id}: its row says the log has {last_pos} record(s), the log table holds "
                f"{len(records)}; run agentsession fsck"
            )
        log = PgSessionLog(self.backend, session_id, key, writable=True, conn=conn, fence=int(fence),
                           last_pos=last_pos, head=head, mark=mark)
        recovered: builtins.list[str] = []
        if _uncommitted_tail(records):
            log._recover = [{"op": "commit"}]
            records = records + [{"op": "commit"}]
            recovered.append(f"adopted the uncommitted records a writer of session {session_id} left, with a commit")
        return log, LogOpen(bytes(header), records, head, mark, recovered,
                            summary=kept.get(_SUMMARY), rule_state=kept.get(_RULES))

    def create(
        self,
        session_id: str,
        header: bytes,
        records: Sequence[Record],
        objects: Iterable[tuple[Space, str, bytes]],
        *,
        head: str | None,
        mark: Mark,
        prefix: Sequence[tuple[str, str]] = (),
    ) -> SessionLog:
        self.backend.require_writable()
        objs = list(objects)
        if len(objs) > 2000:  # a big import: its objects in batches of their own first
            self.backend.objects.put_many(objs)
            objs = []
        try:
            conn = self.take(session_id)
        except SessionLockedError:
            raise SessionExistsError(f"session {session_id} already exists (another writer holds it)") from None
        base = next((r.get("base") for r in records if isinstance(r, dict) and r.get("op") == "create"), None)
        final_head, final_mark = indexes_after(records, None, mark)
        try:
            with translate(self.backend.describe()), conn.transaction():
                self.backend.objects.barrier(conn)
                self._hold_prefix(conn, prefix)
                self.backend.objects.write_rows(conn, objs)
                row = conn.execute(
                    "INSERT INTO sessions (id, header, base, head, mark, last_pos, fence, holder) "
                    "VALUES (%s, %s, %s, %s, %s, %s, 1, %s) ON CONFLICT (id) DO NOTHING RETURNING key",
                    [session_id, bytes(header), base, final_head, final_mark, len(records), _holder()],
                ).fetchone()
                if row is None:
                    raise SessionExistsError(f"session {session_id} already exists")
                key = int(row[0])
                copy_rows(conn, LOG_COLUMNS, LOG_TYPES, log_rows(key, 0, records))
        except BaseException:
            self.let_go(conn)
            raise
        return PgSessionLog(self.backend, session_id, key, writable=True, conn=conn, fence=1,
                            last_pos=len(records), head=final_head, mark=final_mark)

    def _hold_prefix(self, conn: Any, prefix: Sequence[tuple[str, str]]) -> None:
        """Hold the prefix from a sweep with one ``holds`` row (not one write per object: a
        fork of a deep session would rewrite its whole path), and refuse a prefix whose
        objects are not all held."""
        if not prefix:
            return
        for space, names in ((0, {eid for eid, _ in prefix}), (1, {c for _, c in prefix})):
            keys = [raw_hash(n) for n in names]
            # One count per space (the hashes as one packed value); the rows only where it falls short.
            held = conn.execute(f"SELECT count(*) FROM objects WHERE space = %s AND {IN_PACKED}",
                                [space, packed(keys)]).fetchone()[0]
            if None not in keys and held == len(keys):
                continue
            found = {bytes(r[0]) for r in conn.execute(
                f"SELECT hash FROM objects WHERE space = %s AND {IN_PACKED}",
                [space, packed(keys)]).fetchall()}
            for eid, chash in prefix:
                if raw_hash(eid if space == 0 else chash) not in found:
                    raise StoreError(f"prefix entry {eid[7:19]} of the fork's base is not held; nothing was created")
        conn.execute("INSERT INTO holds (base) VALUES (%s)", [prefix[-1][0]])

    def size(self, session_id: str) -> int | None:
        rows = self.db.query(
            "SELECT coalesce(sum(octet_length(l.record)), 0) FROM sessions s JOIN log l ON l.session = s.key WHERE s.id = %s",
            [session_id],
        )
        return int(rows[0][0]) if rows else None

    def history(self, session_id: str) -> LogHistory:
        with self.db.conn() as c:
            _, texts = self.rows(c, session_id)
        out = LogHistory([])
        for pos, text in texts:
            record = parse_record(text)
            if isinstance(record, str):
                out.damage.append(f"log row {pos} {record}")
                out.damage_lines.append(pos)
            else:
                out.records.append(record)
        return out

    def delete(self, session_id: str, log: SessionLog | None = None) -> None:
        self.backend.require_writable()
        if isinstance(log, PgSessionLog) and log.conn is not None and not log._closed:
            conn, mine = log.conn, False
        else:
            if not self.exists(session_id):
                raise NoSuchSessionError(f"no such session: {session_id}")
            conn, mine = self.take(session_id), True
        try:
            with translate(self.backend.describe()), conn.transaction():
                row = conn.execute("DELETE FROM sessions WHERE id = %s RETURNING key", [session_id]).fetchone()
                if row is None:
                    raise NoSuchSessionError(f"no such session: {session_id}")
                conn.execute("DELETE FROM log WHERE session = %s", [row[0]])
                conn.execute("DELETE FROM states WHERE session = %s", [row[0]])
        finally:
            if mine:
                self.let_go(conn)
        if log is not None:
            log.close()
