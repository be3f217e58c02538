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
import itertools
import json
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from ...errors import (
    AgentSessionError,
    NoSuchSessionError,
    SessionDamagedError,
    SessionExistsError,
    SessionLockedError,
    StoreError,
)
from ...format.canonical import canonical_bytes
from ...lean import dataclass
from ..base import (
    COMMIT_POINTS,
    Append,
    CreatedRecords,
    FsckProblem,
    LogHistory,
    LogOpen,
    LogTail,
    Mark,
    Record,
    SessionLog,
    SessionStore,
    Space,
)
from ..files.log import AppendRow, chain, make_snapshot, read_log, record_body, run_snapshot, with_digests
from ..files.sessions import APPEND_LINE_MIN, COMPACT_AT_CLOSE, COMPACT_WHILE_WRITING, append_row
from .arrays import bool_array, boolean, bytea_array, int2_array, int4, int4_array, int8, text_array
from .database import checked, pq, psycopg, translate
from .objects import IN_PACKED, copy_rows, hash_name, object_rows, packed, raw_hash

if TYPE_CHECKING:
    from . import PostgresBackend

__all__ = ["PgSessions", "PgSessionLog", "SNAPSHOT", "gap_message", "log_gaps", "log_repeats", "kept_snapshot", "row_columns", "row_disagrees", "row_text", "snapshot_bytes", "snapshot_disagrees", "snapshot_problem"]

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
_SUMMARY, _RULES, SNAPSHOT = 0, 1, 2
#: The fewest appends of a session created whole that its create keeps a snapshot of (as
#: many as the file backend's create counts to make a log :data:`COMPACT_AT_CLOSE` long).
_SNAPSHOT_CREATED = COMPACT_AT_CLOSE // APPEND_LINE_MIN


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
            rows.append((key, pos, *row_columns(r), None, _DUMPS(r)))
    return rows


def row_columns(record: Mapping[str, Any]) -> tuple[str, int | None, bytes | None]:
    """The ``op``, ``seq`` and ``hash`` columns of the log row holding ``record`` (an
    index of it, for SQL: what :func:`log_rows` writes)."""
    entry, seq = record.get("entry"), record.get("seq")
    return str(record.get("op")), seq if isinstance(seq, int) else None, raw_hash(entry) if isinstance(entry, str) else None


def row_disagrees(record: Mapping[str, Any], op: str, seq: int | None, raw: bytes | None, content: bytes | None,
                  content_of: Callable[[bytes], bytes | None] | None = None) -> str | None:
    """Why a log row's columns are not an index of its record, in words (None where they
    are): the one rule of whoever trusts or checks them (fsck's ``log-row``, repair's
    fixes, a sweep's refusal). ``op``, ``seq`` and ``hash`` must be what :func:`log_rows`
    writes of the record; ``content``, where set, belongs to an append, and names the
    content its entry's envelope names where ``content_of`` reads it (the envelope's
    content by the entry's raw digest; None where it cannot be read: fsck names that)."""
    want = row_columns(record)
    have = (op, seq, None if raw is None else bytes(raw))
    if have != want:
        return f"its columns ({row_text(*have)}) are not its record's ({row_text(*want)})"
    if content is None:
        return None
    if want[0] != "append" or want[2] is None:
        return f"its content column names {hash_name(bytes(content))} for a record that appends no entry"
    named = content_of(want[2]) if content_of is not None else None
    if named is not None and named != bytes(content):
        return (f"its content column names {hash_name(bytes(content))}, where its entry's envelope names "
                f"{hash_name(named)}")
    return None


def row_text(op: str, seq: int | None, raw: bytes | None, content: bytes | None = None) -> str:
    """A log row's columns in words."""
    out = f"op {op}, seq {'none' if seq is None else seq}, entry {'none' if raw is None else hash_name(raw)}"
    return out if content is None else f"{out}, content {hash_name(content)}"


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


def log_gaps(positions: Iterable[int], start: int = 1) -> list[tuple[int, int]]:
    """The positions missing from a log's rows, given in order from ``start`` (the
    first position expected): as (the first missing, the row after them), one per run
    of missing positions. The one rule of a log gap (fsck's ``log-gap``): each position
    missing held a record the log lost, which an open, ``verify``, a sweep and repair
    all treat as damage, as the file backend treats a record removed from its log."""
    gaps: list[tuple[int, int]] = []
    want = start
    for pos in positions:
        if pos > want:
            gaps.append((want, pos))
        want = pos + 1
    return gaps


def log_repeats(rows: Iterable[tuple[int, Mapping[str, Any]]], spent: int = 0) -> tuple[int, str] | None:
    """The first of a log's records (row, record; in order) that appends an entry an
    earlier one appended, or spends a sequence number not above those spent before it
    (``spent``: the highest a kept snapshot's records spent), as (its row, why), or None:
    the one rule of a repeated append row (``log-order``), which an open, ``verify``,
    fsck, a sweep and repair all treat as damage. No writer writes one (a re-append is a
    no-op, RFC 0002), and RFC 0002's reference schema keys its log on (session, seq) and
    (session, hash); a repeat's head member would move the head back on every open."""
    seen: set[Any] = set()
    for pos, record in rows:
        op, seq = record.get("op"), record.get("seq")
        if op == "append":
            entry = record.get("entry")
            if entry in seen:
                return pos, f"log row {pos} appends entry {entry} a second time"
            seen.add(entry)
            if isinstance(seq, int) and not isinstance(seq, bool) and seq <= spent:
                return pos, f"log row {pos} appends with sequence number {seq}, which the log spent before it"
        if op in ("append", "loss", "repair") and isinstance(seq, int) and not isinstance(seq, bool):
            spent = max(spent, seq)
    return None


def gap_message(missing: int, after: int) -> str:
    """A gap in words, as every finding and refusal says it."""
    if after - missing > 1:
        return f"log positions {missing} to {after - 1} are missing (next is {after})"
    return f"log position {missing} is missing (next is {after})"


def _uncommitted_tail(records: list[dict[str, Any]]) -> bool:
    """Whether records follow the last commit (or create): a writer's lazy work it never committed."""
    return bool(records) and records[-1].get("op") not in COMMIT_POINTS


# -- the kept snapshot: the log's first records as the file backend compacts them -------


def snapshot_bytes(create: Mapping[str, Any], snapshot: Mapping[str, Any]) -> bytes:
    """A kept snapshot's bytes: the ``create`` record and the ``snapshot`` of the records
    after it, as the file backend's compacted log holds them (two chained, checksummed
    lines: :mod:`..files.log` is the one place of that form)."""
    return chain([record_body(dict(create)), record_body(dict(snapshot))])[0]


def kept_snapshot(data: bytes, pos: int, first: str | None, last: str | None) -> tuple[dict[str, Any], dict[str, Any]] | str:
    """The (create, snapshot) records of a kept snapshot standing for a log's first ``pos``
    rows, given the text of the log's row 1 (``first``) and of its row ``pos`` (``last``),
    or why it is not trusted: its lines must read (checksums, chain), be a create and the
    snapshot of ``pos - 1`` records, its create must be the log's own (another incarnation's
    or a repaired log's is not) and the row it ends at a commit point (a snapshot is made
    of committed records only)."""
    if pos < 2 or first is None or last is None:
        return f"it stands for {pos} log row(s), which the log does not hold"
    read = read_log(data, expand=False)
    if read.damage or read.cut or [r.op for r in read.records] != ["create", "snapshot"]:
        return "its lines do not read as a create and a snapshot record (damaged)"
    create, snapshot = read.records[0].data, read.records[1].data
    if snapshot["records"] != pos - 1:
        return f"its snapshot stands for {snapshot['records']} record(s) after the create, not the log's {pos - 1}"
    if parse_record(first) != create:
        return "its create record is not the log's (another incarnation's, or a log rewritten since)"
    end = parse_record(last)
    if isinstance(end, str) or end.get("op") not in COMMIT_POINTS:
        return f"log row {pos}, where it ends, is no commit point"
    return create, snapshot


def snapshot_disagrees(create: Mapping[str, Any], snapshot: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a kept snapshot that an open would trust says other than the log's records
    it stands for (the whole log's first ones, create included): fsck's question, made by
    snapshotting those records again and comparing the two lines' bytes."""
    again = make_snapshot(dict(records[0]), (dict(r) for r in records[1:]))
    return snapshot_bytes(create, snapshot) != snapshot_bytes(records[0], again)


def snapshot_problem(
    pos: int, data: bytes, texts: Mapping[int, str]
) -> tuple[Literal["error", "warning"], str, str] | None:
    """What is wrong with a session's kept snapshot (``pos``, ``data``) against its whole
    log (``texts``, row -> record text), as (severity, code, why), or None: fsck's finding
    and what makes a repair drop it. One an open refuses costs only a full read (a
    warning); one an open trusts though it says other than the log is an error."""
    got = kept_snapshot(data, pos, texts.get(1), texts.get(pos))
    if isinstance(got, str):
        return "warning", "snapshot-refused", f"its kept snapshot (states kind 2, log row {pos}) is not trusted: {got}; " \
            "every open reads the whole log until a writer's close keeps another"
    records = [r for p in range(1, pos + 1) if not isinstance(r := parse_record(texts.get(p, "")), str)]
    if len(records) != pos:
        return None  # (the log's own damage, which is reported as such; a repair drops the states)
    if snapshot_disagrees(got[0], got[1], records):
        return "error", "snapshot-disagrees", f"its kept snapshot (states kind 2, log row {pos}) passes the checks an " \
            "open makes but says other than the log's records it stands for: opens read the session wrong " \
            "(agentsession repair drops it)"
    return None


def _row_of(record: Record) -> dict[str, Any] | AppendRow:
    """What a writer keeps of a record it wrote, for its next snapshot: an append as its
    row (:data:`~..files.log.AppendRow`, no dict made of it), any other as its members."""
    return append_row(record) if isinstance(record, Append) else record


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
        #: What a writing open read, for :meth:`_know` once the domain accepts the log (:meth:`recover`).
        self._known: tuple[Any, ...] | None = None
        self._closed = False
        self._parked = False
        #: What the domain handed over to keep at close (``states``), by kind.
        self._states: dict[int, Mapping[str, Any]] = {}
        #: What the writer knows of its log, for the next snapshot (kind 2): the create
        #: record (None: unknown, no snapshot is made), the snapshot the log starts from
        #: (None: none), and the records after it, with their bytes in the log.
        self._create: dict[str, Any] | None = None
        self._base: dict[str, Any] | None = None
        self._since: list[dict[str, Any] | AppendRow] = []
        self._since_bytes = 0
        #: The size of the snapshot last kept or read (one made while writing waits for as
        #: many new bytes, so the bytes rewritten stay proportional to the bytes appended).
        self._base_bytes = 0

    def _know(self, create: Mapping[str, Any] | None, base: dict[str, Any] | None,
              since: Iterable[dict[str, Any] | AppendRow], since_bytes: int, base_bytes: int = 0) -> None:
        """Start keeping the log's records for its next snapshot (a writer only)."""
        if self.writable and isinstance(create, Mapping) and create.get("op") == "create":
            self._create, self._base, self._since = dict(create), base, list(since)
            self._since_bytes, self._base_bytes = since_bytes, base_bytes

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
        if self._create is not None:
            self._since.extend(_row_of(r) for r in records)
            self._since_bytes += sum(map(len, cols[6]))
            if self._since_bytes >= max(COMPACT_WHILE_WRITING, self._base_bytes) and self._at_commit_point():
                self._keep({SNAPSHOT: self._make_snapshot()})

    def _at_commit_point(self) -> bool:
        """Whether the log's last record is a commit point (so every record is committed)."""
        last = self._since[-1] if self._since else None
        return last is None or (isinstance(last, dict) and last.get("op") in COMMIT_POINTS)

    def _lost_hold(self) -> None:
        rows = self.backend.db.query("SELECT fence FROM sessions WHERE key = %s", [self.key])
        if not rows:
            self.stopped = "the session was deleted"
            raise NoSuchSessionError(f"no such session: {self.session_id} (deleted since it was opened)")
        self.stopped = f"another writer took the session (fencing token {rows[0][0]}, this handle's {self.fence})"
        raise SessionLockedError(f"session {self.session_id}: {self.stopped}; nothing was written")

    def recover(self) -> None:
        """The domain found the log sound: what the open read is known for the next
        snapshot, and the uncommitted tail adopted."""
        known, self._known = self._known, None
        if known is not None:
            self._know(*known)
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

    def keep_summary(self, summary: Mapping[str, Any]) -> None:
        """Kept now, as of the log's length now (one statement, as at close)."""
        if not self.writable or self._closed or self.conn is None or self.stopped or self._parked:
            return
        try:
            kept = canonical_bytes(summary)
        except (ValueError, AgentSessionError):
            return
        self._keep({_SUMMARY: kept})

    def set_rule_state(self, state: Mapping[str, Any]) -> None:
        if self.writable and not self._closed:
            self._states[_RULES] = dict(state)

    def kept_rule_state(self) -> dict[str, Any] | None:
        kept = self.backend.sessions.states(self.key, _RULES)
        return kept[1] if kept is not None else None

    def _make_snapshot(self) -> bytes:
        """A snapshot of the log as it is now (every record committed: the caller's to
        know), which the records since become the base of."""
        assert self._create is not None
        before = [self._base] if self._base is not None else []
        snapshot = with_digests(make_snapshot(self._create, itertools.chain(before, self._since)))
        data = snapshot_bytes(self._create, snapshot)
        self._base, self._since, self._since_bytes, self._base_bytes = snapshot, [], 0, len(data)
        return data

    def _keep_states(self) -> None:
        """The states handed over, in ``states``, as of the log's length now, and a snapshot
        of the log when it grew :data:`COMPACT_AT_CLOSE` bytes of records since the last
        (the file backend's rule for compacting at close)."""
        states, self._states = self._states, {}
        if self.conn is None or self.stopped or self._parked:
            return
        kept: dict[int, bytes] = {}
        for kind, value in sorted(states.items()):
            try:
                kept[kind] = canonical_bytes(value)
            except (ValueError, AgentSessionError):
                continue  # no I-JSON: none is kept, the next reader rebuilds it
        if self._create is not None and self._since_bytes >= COMPACT_AT_CLOSE and self._at_commit_point():
            kept[SNAPSHOT] = self._make_snapshot()
        self._keep(kept)

    def _keep(self, kept: Mapping[int, bytes]) -> None:
        """``kept`` (kind -> bytes) in ``states`` as of the log's length now: one statement,
        committed asynchronously (an index: lost, the next open rebuilds it), written only
        while this handle still holds the session at that length."""
        if not kept or self.conn is None:
            return
        kinds, data = list(kept), list(kept.values())
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
                # The fence as well as the log's length: a repair bumps the fence and may
                # give the log back at its length, rewritten, which this handle's state no
                # longer describes; any other writer's hold is taken for a write so too.
                row = conn.execute(
                    "UPDATE sessions SET fence = fence + 1, holder = %s"
                    " WHERE key = %s AND last_pos = %s AND fence = %s RETURNING fence",
                    [_holder(), self.key, self.last_pos, self.fence],
                ).fetchone()
        except BaseException:
            self.backend.sessions.let_go(conn)
            raise
        if row is None:  # written, held by another (or deleted) since: the caller reopens it
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


@dataclass
class _Start:
    """A kept snapshot an open trusts: its create and snapshot records, the log's length it
    stands for, and its size in bytes."""

    create: dict[str, Any]
    snapshot: dict[str, Any]
    pos: int
    size: int


@dataclass
class _Records:
    """A log as an open read it: its records (from a kept snapshot: the create, the
    snapshot, then the records after), where the records after the create or snapshot
    begin, their bytes in the log, the log's length the records stand for, the size
    of the snapshot read (0: none), and the position of its last row (0: none)."""

    records: list[dict[str, Any]]
    since: int
    since_bytes: int
    length: int
    base_bytes: int
    last: int


def _appended(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The entries a log's records append, in order (a snapshot's first)."""
    out: list[str] = []
    for r in records:
        op = r.get("op")
        if op == "append" and "entry" in r:
            out.append(r["entry"])
        elif op == "snapshot":
            out.extend(r["entries"])
    return out


class _Fenced(Exception):
    """The conditional update matched no row: this handle no longer holds the session."""


class PgSessions(SessionStore):
    def __init__(self, backend: PostgresBackend):
        self.backend = backend
        self.db = backend.db
        self._local = threading.local()

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
        row, texts, _, _ = self._snapshot(conn, session_id, ())
        return row, texts

    @contextmanager
    def whole_log(self) -> Iterator[None]:
        """Opens in this thread, meanwhile, read every log row, whatever snapshot is kept
        (a repair's probe: damage in the rows a snapshot stands for is what it looks for)."""
        before = getattr(self._local, "whole", False)
        self._local.whole = True
        try:
            yield
        finally:
            self._local.whole = before

    def _snapshot(
        self, conn: Any, session_id: str, kinds: Sequence[int], *, start: bool = False
    ) -> tuple[tuple[Any, ...], builtins.list[tuple[int, str]], dict[int, tuple[int, bytes]], _Start | None]:
        """:meth:`rows`, and the ``states`` of ``kinds`` kept for the session (kind ->
        (log length, bytes)), all in one snapshot. With ``start``, from the log's kept
        snapshot where one is trusted (:func:`kept_snapshot`): the rows are then row 1, the
        row the snapshot ends at and those after it (one query on the log's key), and the
        snapshot is returned too; else every row."""
        whole = not start or getattr(self._local, "whole", False)
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            row = conn.execute(
                "SELECT key, header, head, mark, last_pos, fence FROM sessions WHERE id = %s", [session_id]
            ).fetchone()
            if row is None:
                raise NoSuchSessionError(f"no such session: {session_id}")
            key, last_pos = row[0], row[4]
            want = list(kinds) if whole else [*kinds, SNAPSHOT]
            # (binary: a snapshot's bytes as they are, not twice as many hex digits to decode)
            kept = {} if not want else {int(k): (int(p), bytes(d)) for k, p, d in conn.execute(
                "SELECT kind, pos, data FROM states WHERE session = %s AND kind = ANY(%s)", [key, want],
                binary=True).fetchall()}
            found, texts = None, None
            if SNAPSHOT in kept:
                pos, data = kept.pop(SNAPSHOT)
                if 2 <= pos <= last_pos:
                    texts = conn.execute(
                        "SELECT pos, record FROM log WHERE session = %s AND pos = 1 UNION ALL "
                        "SELECT pos, record FROM log WHERE session = %s AND pos >= %s ORDER BY pos", [key, key, pos]).fetchall()
                    first = texts[0][1] if texts and texts[0][0] == 1 else None
                    last = texts[1][1] if len(texts) > 1 and texts[1][0] == pos else None
                    got = kept_snapshot(data, pos, first, last)
                    if not isinstance(got, str):
                        found = _Start(got[0], got[1], pos, len(data))
            if found is None:
                texts = conn.execute("SELECT pos, record FROM log WHERE session = %s ORDER BY pos", [key]).fetchall()
        assert texts is not None
        return row, texts, kept, found

    def _read(
        self, conn: Any, session_id: str, kinds: Sequence[int] = ()
    ) -> tuple[tuple[Any, ...], _Records, dict[int, dict[str, Any]]]:
        """The session's row, its log's records (from its kept snapshot where one is
        trusted) and the states of ``kinds`` that parse; SessionDamagedError at a row that
        is no record, or a position missing among the rows read (a gap: a record lost)."""
        row, texts, kept, start = self._snapshot(conn, session_id, kinds, start=True)
        records: builtins.list[dict[str, Any]] = []
        skip = 0
        if start is not None:
            records, skip = [start.create, start.snapshot], 2  # (rows 1 and pos: the snapshot stands for them)
        tail = texts[skip:]
        first = start.pos + 1 if start is not None else 1
        # (rising positions: only a gap leaves the last beyond the count, so most opens walk none)
        gaps = log_gaps((pos for pos, _ in tail), first) if tail and tail[-1][0] != first + len(tail) - 1 else []
        if gaps:
            raise SessionDamagedError(f"{gap_message(*gaps[0])}: a record lost", session=session_id,
                                      line=gaps[0][1], offset=0, path=self.log_source(session_id))
        for pos, text in tail:
            record = parse_record(text)
            if isinstance(record, str):
                raise SessionDamagedError(f"log row {pos} {record}", session=session_id, line=pos, offset=0,
                                          path=self.log_source(session_id))
            records.append(record)
        repeat = log_repeats(zip((pos for pos, _ in tail), records[skip:]), start.snapshot["seq"] if start is not None else 0)
        if repeat is not None:
            raise SessionDamagedError(repeat[1], session=session_id, line=repeat[0], offset=0,
                                      path=self.log_source(session_id))
        out = _Records(records, skip or 1, sum(len(t) for _, t in tail[0 if skip else 1 :]),
                       start.pos + len(tail) if start is not None else len(tail), start.size if start is not None else 0,
                       texts[-1][0] if texts else 0)
        return row, out, {k: v for k, (_, data) in kept.items() if (v := _state(data)) is not None}

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
        which may keep the length, deletes it) and its last row is there: a log cut short
        (rows lost at its end, the row's length ahead of them) is read, and refused, as
        the file backend's is."""
        rows = self.db.query(
            "SELECT st.pos, st.data, s.last_pos, (SELECT max(pos) FROM log WHERE session = s.key) "
            "FROM sessions s JOIN states st ON st.session = s.key WHERE s.id = %s AND st.kind = %s",
            [session_id, _SUMMARY])
        if not rows:
            return None
        value = _state(bytes(rows[0][1]))
        pos, last_pos, last = rows[0][0], rows[0][2], rows[0][3]
        return None if value is None else (value, int(pos) == int(last_pos) == int(last or 0))

    def open(self, session_id: str, *, writable: bool) -> tuple[SessionLog, LogOpen]:
        if not writable:
            with self.db.conn() as c:
                row, got, kept = self._read(c, session_id, (_SUMMARY,))
            records = got.records
            # A snapshot is mostly opened to be read whole (a projection): read ahead.
            self.backend.objects.expect(lambda: _appended(records))
            key, header, head, mark, last_pos, _ = row
            log = PgSessionLog(self.backend, session_id, key, writable=False, last_pos=last_pos, head=head, mark=mark)
            # The row's head and length are the log's indexes: the domain holds them to it
            # (a log cut short at a record is the file backend's log-cut, refused alike).
            return log, LogOpen(bytes(header), records, head, mark, summary=kept.get(_SUMMARY),
                                length_index=(last_pos, got.last))
        self.backend.require_writable()
        conn = self.take(session_id)
        try:
            with translate(self.backend.describe()):
                row, got, kept = self._read(conn, session_id, (_SUMMARY, _RULES))
                key, header, head, mark, last_pos, _ = row
                fence = conn.execute(
                    "UPDATE sessions SET fence = fence + 1, holder = %s WHERE key = %s RETURNING fence", [_holder(), key]
                ).fetchone()[0]
        except BaseException:
            self.let_go(conn)
            raise
        # Rows missing at the log's end (its row's length beyond its last row) are a log cut
        # short: the domain refuses the open on the row's indexes (index_damage: log-cut),
        # as on the file backend. Any other disagreement of the length (a gap, rows beyond it)
        # is this backend's own (fsck's log-gap, log-length).
        cut = got.last < last_pos
        if got.length != last_pos and not cut:
            self.let_go(conn)
            raise StoreError(
                f"session {session_id}: its row says the log has {last_pos} record(s), the log table holds "
                f"{got.length}; run agentsession fsck"
            )
        records = got.records
        log = PgSessionLog(self.backend, session_id, key, writable=True, conn=conn, fence=int(fence),
                           last_pos=last_pos, head=head, mark=mark)
        # Known for the next snapshot only once the domain found the log sound (recover): a
        # handle whose log it refused keeps no state of it at close.
        log._known = (records[0] if records else None, records[1] if got.since == 2 else None, records[got.since :],
                      got.since_bytes, got.base_bytes)
        recovered: builtins.list[FsckProblem] = []
        if _uncommitted_tail(records):
            log._recover = [{"op": "commit"}]
            records = records + [{"op": "commit"}]
            recovered.append(FsckProblem("note", "log-tail", f"adopted the uncommitted records a writer of session "
                                         f"{session_id} left, with a commit", session=session_id, file="log"))
        return log, LogOpen(bytes(header), records, head, mark, recovered,
                            summary=kept.get(_SUMMARY), rule_state=kept.get(_RULES), length_index=(last_pos, got.last))

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
        # A session created whole with many entries (an import) keeps its snapshot at once,
        # made of the ids as they are, so its first open reads none of its rows.
        snapshot = None
        if isinstance(records, CreatedRecords) and len(records.own) >= _SNAPSHOT_CREATED \
                and records.tail and records.tail[-1].get("op") in COMMIT_POINTS:
            snapshot = with_digests(run_snapshot(records.create, records.own, records.leaf_labels, records.tail))
            kept = snapshot_bytes(records.create, snapshot)
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
                rows = log_rows(key, 0, records)
                copy_rows(conn, LOG_COLUMNS, LOG_TYPES, rows)
                if snapshot is not None:
                    conn.execute("INSERT INTO states (session, kind, pos, data) VALUES (%s, %s, %s, %s)",
                                 [key, SNAPSHOT, len(records), kept])
        except BaseException:
            self.let_go(conn)
            raise
        log = PgSessionLog(self.backend, session_id, key, writable=True, conn=conn, fence=1,
                           last_pos=len(records), head=final_head, mark=final_mark)
        if snapshot is not None:
            assert isinstance(records, CreatedRecords)
            log._know(records.create, snapshot, (), 0, len(kept))
            log.created_records = [records.create, snapshot]  # (the domain replays these: no record per entry)
        elif records:
            first = records[0]
            log._know(first if isinstance(first, dict) else None, None, (_row_of(r) for r in records[1:]),
                      sum(len(r[6]) for r in rows[1:]))
        return log

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

    def log_source(self, session_id: str) -> str:
        return "log"  # the table, as fsck names it

    def history(self, session_id: str) -> LogHistory:
        with self.db.conn() as c:
            row, texts = self.rows(c, session_id)
        # The row's head is the log's index (written in the append's transaction): the
        # domain holds it to the records, as the file backend's HEAD (read in one snapshot).
        out = LogHistory([], source=self.log_source(session_id), head_index=row[2] if isinstance(row[2], str) else None,
                         length_index=(row[4], texts[-1][0] if texts else 0))
        out.positions = positions = []
        for missing, after in log_gaps(pos for pos, _ in texts):
            out.damaged("log-gap", gap_message(missing, after), after)  # (fsck's line: the row after it)
        for pos, text in texts:
            record = parse_record(text)
            if isinstance(record, str):
                out.damaged("log-damage", f"log row {pos} {record}", pos)
            else:
                out.records.append(record)
                positions.append((pos, None))  # (its row: a record after a gap keeps its number)
        repeat = log_repeats(zip((pos for pos, _ in positions), out.records))
        if repeat is not None:
            out.damaged("log-order", repeat[1], repeat[0])
        return out

    def history_since(self, session_id: str, start: int, resume: Any = None) -> LogTail:
        """The rows after the first ``start`` only (``whole`` false), while ``resume`` (the
        incarnation's key, the rows read, the last one's text and row version) still
        holds: the session's row says how long its log is, and the row the last read
        ended at must be the very row read then (its ``xmin``, the transaction that wrote
        it: a repair writes every row of the log anew, in one transaction, so a log
        repaired to the same length, even ending in the same record, is not the one read),
        so an idle poll is one query; the rows after are read with the last one read.
        Else every row, as :meth:`history` reads them."""
        if resume is not None and resume[1] == start:
            key, count, last, version = resume
            with self.db.conn() as c:
                row = c.execute("SELECT s.key, s.last_pos, l.xmin::text FROM sessions s LEFT JOIN log l "
                                "ON l.session = s.key AND l.pos = s.last_pos WHERE s.id = %s", [session_id]).fetchone()
                if row is None:
                    raise NoSuchSessionError(f"no such session: {session_id}")
                if row[0] == key and row[1] == count and row[2] == version:
                    return LogTail([], count, resume, whole=False)
                # (an append's rows and its last_pos commit together: these are whole appends)
                texts = c.execute("SELECT pos, record, xmin::text FROM log WHERE session = %s AND pos >= %s ORDER BY pos",
                                  [key, count]).fetchall() if row[0] == key and row[1] > count else None
            if texts and texts[0] == (count, last, version) and not log_gaps((pos for pos, _, _ in texts), count):
                records = [r for _, text, _ in texts[1:] if not isinstance(r := parse_record(text), str)]
                if len(records) == len(texts) - 1:
                    end = texts[-1][0]
                    return LogTail(records, end, (key, end, texts[-1][1], texts[-1][2]), whole=False)
        with self.db.conn() as c:  # (one statement: the rows and the session's key as of one moment)
            rows = c.execute("SELECT s.key, l.pos, l.record, l.xmin::text FROM sessions s LEFT JOIN log l "
                             "ON l.session = s.key WHERE s.id = %s ORDER BY l.pos", [session_id]).fetchall()
        if not rows:
            raise NoSuchSessionError(f"no such session: {session_id}")
        texts = [(pos, text, version) for _, pos, text, version in rows if pos is not None]
        parsed = [parse_record(text) for _, text, _ in texts]
        records = [r for r in parsed if not isinstance(r, str)]
        sound = len(records) == len(texts) and not log_gaps(pos for pos, _, _ in texts)
        note = (rows[0][0], len(texts), texts[-1][1], texts[-1][2]) if sound and texts else None
        return LogTail(records[start:], len(records), note)

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
                conn.execute("DELETE FROM log_aside WHERE session = %s", [row[0]])  # (what repair kept goes with it)
        finally:
            if mine:
                self.let_go(conn)
        if log is not None:
            log.close()
