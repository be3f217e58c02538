"""The PostgreSQL backend: a store in a PostgreSQL database (``postgresql://…``).

For a shared store that outgrows one disk, on a database its operators
already replicate and back up. The tables (:mod:`.schema`) follow RFC 0002's
reference schema: objects by space and hash, sessions, a log of records per
session, the edges reverse index, refs and remote state; ``docs/postgresql.md``
says what each holds, what is transactional and what the store promises when
the database fails over. Every rule is the domain's: this backend only keeps
bytes, in transactions.

psycopg 3 and psycopg-pool come with the ``postgresql`` extra
(``pip install 'agentsession-cas[postgresql]'``).
"""

from __future__ import annotations

import itertools
import json
import operator
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from ...errors import LayoutError, ReadOnlyError, SweepRefusedError, UnsupportedError
from ..base import Backend, Capabilities, RefStore, RemoteStore, RepackResult, Retained, RetentionSource
from .database import Database, sql, translate
from .maintenance import migrate_schema, storage_report, sweep_objects
from .objects import PgObjects
from .schema import SCHEMA_VERSION, MigrationPlan, create_statements
from .sessions import PgSessions, gap_message, log_gaps, log_repeats, parse_record, row_disagrees

__all__ = ["PostgresBackend", "SCHEMA_VERSION", "MigrationPlan", "migrate_store"]

#: Rows a sweep's (or fsck's) read of the logs fetches at a time.
RETENTION_BATCH = 2000

_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _json_record(rows: list[tuple[Any, ...]]) -> dict[str, Any] | None:
    """The JSON object a one-row, one-column result holds (None when absent or unreadable)."""
    if not rows:
        return None
    try:
        record = json.loads(rows[0][0])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


class PgRefs(RefStore):
    """Refs in the ``refs`` table; :meth:`locked` is a store-wide advisory lock held on a
    connection of its own, which the changes inside it use."""

    def __init__(self, backend: PostgresBackend):
        self.backend = backend
        self.db = backend.db
        self._local = threading.local()

    def get(self, name: str) -> dict[str, Any] | None:
        return _json_record(self._run("SELECT record FROM refs WHERE name = %s", [name]))

    def names(self, prefix: str = "") -> list[str]:
        rows = self._run('SELECT name FROM refs WHERE starts_with(name, %s) ORDER BY name COLLATE "C"', [prefix])
        return [r[0] for r in rows]

    def _run(self, statement: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """Run on the connection holding the refs lock when inside :meth:`locked`, else on a pooled one."""
        held = getattr(self._local, "conn", None)
        with self.db.conn() if held is None else _as_is(held) as conn, translate(self.backend.describe()):
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description is not None else []

    @contextmanager
    def locked(self) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if depth:
            self._local.depth = depth + 1
            try:
                yield
            finally:
                self._local.depth -= 1
            return
        self.backend.require_writable()
        conn = self.db.getconn()
        try:
            with translate(self.backend.describe()):
                conn.execute("SELECT pg_advisory_lock(%s)", [self.db.lock_key("refs")])
            self._local.conn, self._local.depth = conn, 1
            try:
                yield
            finally:
                self._local.conn, self._local.depth = None, 0
                with translate(self.backend.describe()):
                    conn.execute("SELECT pg_advisory_unlock(%s)", [self.db.lock_key("refs")])
        finally:
            self.db.putconn(conn)

    def put(self, name: str, record: Mapping[str, Any]) -> None:
        self.backend.require_writable()
        self._run(
            "INSERT INTO refs (name, record) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE SET record = EXCLUDED.record",
            [name, _DUMPS(dict(record))],
        )

    def delete(self, name: str) -> None:
        self.backend.require_writable()
        self._run("DELETE FROM refs WHERE name = %s", [name])


@contextmanager
def _as_is(conn: Any) -> Iterator[Any]:
    yield conn


class PgRemotes(RemoteStore):
    """What the store remembers of each remote, one row per (remote, kind, name): hints,
    which a read-only store does not write (it re-learns them)."""

    def __init__(self, backend: PostgresBackend):
        self.backend = backend
        self.db = backend.db

    def get(self, url: str, kind: Literal["sessions", "refs"], name: str) -> dict[str, Any] | None:
        return _json_record(self.db.query("SELECT record FROM remotes WHERE url = %s AND kind = %s AND name = %s",
                                           [url, kind, name]))

    def put(self, url: str, kind: Literal["sessions", "refs"], name: str, record: Mapping[str, Any]) -> None:
        if self.backend.readonly:
            return  # a hint: a read-only store re-learns it next time, as a file store does
        with self.db.conn() as c:
            c.execute(
                "INSERT INTO remotes (url, kind, name, record) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (url, kind, name) DO UPDATE SET record = EXCLUDED.record",
                [url, kind, name, _DUMPS(dict(record))],
            )

    def delete(self, url: str, kind: Literal["sessions", "refs"], name: str) -> None:
        if self.backend.readonly:
            return
        with self.db.conn() as c:
            c.execute("DELETE FROM remotes WHERE url = %s AND kind = %s AND name = %s", [url, kind, name])


class PostgresBackend(Backend):
    """A store in a PostgreSQL schema (see the module). ``create`` makes the schema where
    there is none (``agentsession init``); an older schema version is refused until
    ``agentsession migrate`` upgrades it, a newer one always."""

    capabilities = Capabilities(persistent=True, packs=False, sweep=True, repair=True, migrate=True)
    objects: PgObjects
    sessions: PgSessions

    def __init__(self, url: str, *, readonly: bool = False, create: bool = False):
        self.url = url
        self.readonly = readonly
        self.db = Database(url)
        try:
            self.created = False
            version = self.db.version()
            if version is None and create and not readonly:
                self.created = init_schema(self.db)
                version = self.db.version()
            check_version(self.db, version)
        except BaseException:
            self.db.close()
            raise
        self.objects = PgObjects(self)
        self.sessions = PgSessions(self)
        self.refs = PgRefs(self)
        self.remotes = PgRemotes(self)

    def describe(self) -> str:
        return self.db.describe()

    def public_url(self) -> str:
        return self.db.public

    def require_writable(self) -> None:
        if self.readonly:
            raise ReadOnlyError(f"{self.describe()} is open read-only")

    def close(self) -> None:
        self.objects.close()
        self.db.close()

    # -- maintenance ------------------------------------------------------------------

    def writers_holding(self) -> list[str] | None:
        """The sessions whose writer's advisory lock (``lock_key("session/<id>")``, a
        bigint key: its high half in ``classid``, its low in ``objid``) a connection holds
        now, read from ``pg_locks`` (which every role may read) without taking any, as
        the file backend reads the kernel's table."""
        with translate(self.describe()):
            rows = self.db.query(
                "SELECT s.id FROM sessions s JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted "
                "AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended(%s || s.id, 0) ORDER BY s.id",
                [f"agentsession:{self.db.schema}:session/"],
            )
        return [sid for (sid,) in rows]

    def retention_sources(self, *, refuse_damage: bool = True) -> Iterator[RetentionSource]:
        """Each session's log (its create and append rows) with the rows repairs kept
        aside of it, one source a session, as the file backend reads a session's
        ``log.damaged-*`` beside its log (rows kept aside of a session an older release
        deleted without them: a source of their own). A session whose log is damaged (a
        row that is no record, or whose columns are not its record's: ``row_disagrees``), lost
        rows its head names (deleted, or cut at a record: every row left reads), or lost a
        row between two it holds (a gap: its record may have been the only one naming an
        entry), stops the sweep, as on the file backend: ``repair`` takes the lost entries
        back from the objects while they are held.
        ``refuse_damage=False`` (fsck, which reports the damage itself) yields what of
        such a log reads instead, as the file backend's fsck counts it."""
        from ...store.state import log_loss  # the domain's rule (it sits above the backends)

        # One snapshot for all of it (a read-only repeatable-read transaction, its two
        # cursors streamed, so no more than a batch of rows and one session's records are
        # held at a time): an append writes its rows and the session's head in one
        # transaction, so the head read here is never ahead of the rows read with it, and
        # a repair moves rows to log_aside in one, so each is read in one place. The row's
        # length and the log's last row (of any op) with them: the length index.
        with self.db.conn() as c, c.transaction():
            c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            with c.cursor(name="retention_log") as logs, c.cursor(name="retention_aside") as kept:
                logs.itersize = kept.itersize = RETENTION_BATCH
                logs.execute(
                    "SELECT s.key, s.id, s.head, s.last_pos, coalesce(m.last, 0), coalesce(m.n, 0), l.pos, l.record, l.op, "
                    "l.seq, l.hash, l.content FROM sessions s LEFT JOIN (SELECT session, max(pos) AS last, count(*) AS n "
                    "FROM log GROUP BY session) m "
                    "ON m.session = s.key LEFT JOIN log l ON l.session = s.key ORDER BY s.key, l.pos"
                )
                kept.execute("SELECT session, record FROM log_aside ORDER BY session, kept, pos")
                aside = _aside_by_session(kept)
                pending = next(aside, None)
                for key, rows in itertools.groupby(logs, key=operator.itemgetter(0)):
                    while pending is not None and pending[0] < key:  # (kept of a session gone)
                        yield RetentionSource(pending[1])
                        pending = next(aside, None)
                    records: list[dict[str, Any]] = []
                    rows_of: list[int] = []  # (each record's row)
                    session_id = head = None
                    length = (0, 0)
                    held = 0  # (the log's rows, of any op)
                    for _, sid, row_head, last_pos, last, count, pos, text, op, seq, raw, content in rows:
                        session_id, head, length, held = sid, row_head, (int(last_pos), int(last)), int(count)
                        if text is None:
                            continue  # (a session with no row: log_loss refuses it)
                        record = parse_record(text)
                        if isinstance(record, str):
                            if not refuse_damage:
                                continue
                            raise _damaged_log(sid, f"log row {pos}: {record}")
                        # The record is what is read (its op and entry), never the row's columns,
                        # which index it; columns that disagree with it are damage (fsck's
                        # log-row), as a record that does not read is. The content column is
                        # not read: only the entry's envelope says its content.
                        why = row_disagrees(record, op, seq, raw, content) if refuse_damage else None
                        if why is not None:
                            raise _damaged_log(sid, f"log row {pos}: {why}")
                        if record["op"] in ("append", "create"):
                            records.append(record)
                            rows_of.append(pos)
                    if refuse_damage and held < length[1]:
                        # Fewer rows than the last one's position: a gap, whose lost record may
                        # have named entries nothing else does (repair takes them back).
                        gap = _first_gap(c, key)
                        if gap is not None:
                            raise _damaged_log(str(session_id), f"{gap}: a record lost")
                    repeat = log_repeats(zip(rows_of, records)) if refuse_damage else None
                    if repeat is not None:
                        raise _damaged_log(str(session_id), repeat[1])
                    lost = log_loss(records, head, length) if refuse_damage else None
                    if lost is not None:
                        raise _damaged_log(str(session_id), lost)
                    if pending is not None and pending[0] == key:
                        records += pending[1]
                        pending = next(aside, None)
                    yield RetentionSource(records)
                while pending is not None:
                    yield RetentionSource(pending[1])
                    pending = next(aside, None)

    def sweep_objects(
        self, compute: Callable[[bool], Retained], *, grace: float, dry_run: bool, wait: float,
        progress: Callable[[int, int], None] | None,
    ) -> tuple[RepackResult, int, list[str], Retained]:
        return sweep_objects(self, compute, grace=grace, dry_run=dry_run, progress=progress)

    def fsck(self, store: Any, *, progress: Callable[[str], None] | None = None) -> Any:
        """fsck's walk (called by :func:`agentsession_cas.maintenance.fsck.fsck`)."""
        from .fsck import fsck_walk  # the domain's rules sit above the backends (as files/ does)

        return fsck_walk(self, store, progress=progress)

    def pack(self, **kwargs: Any) -> RepackResult:
        """Nothing to pack: the database keeps its own storage. Says what it holds."""
        return storage_report(self)


def init_schema(db: Database) -> bool:
    """Create the store's tables in one transaction (serialised with any other ``init``
    by an advisory lock); False when another made them first."""
    with db.conn() as c, c.transaction():
        c.execute("SELECT pg_advisory_xact_lock(%s)", [db.lock_key("init")])
        if c.execute("SELECT 1 FROM pg_namespace n JOIN pg_class r ON r.relnamespace = n.oid "
                     "WHERE n.nspname = %s AND r.relname = 'meta'", [db.schema]).fetchone():
            return False
        quoted = sql.Identifier(db.schema).as_string(c)
        for statement in create_statements(quoted):
            c.execute(statement.encode())
        c.execute("INSERT INTO meta (key, value) VALUES ('version', %s)", [str(SCHEMA_VERSION)])
    return True


def check_version(db: Database, version: int | None) -> None:
    """Refuse a database holding no store, or a schema of another version."""
    if version is None:
        raise LayoutError.no_store(f"no store at {db.public} (no schema {db.schema!r} with a store's tables)", db.public)
    if version > SCHEMA_VERSION:
        raise UnsupportedError(
            f"{db.describe()} has schema version {version}; this release reads version {SCHEMA_VERSION}: upgrade agentsession-cas"
        )
    if version < SCHEMA_VERSION:
        raise LayoutError(
            f"{db.describe()} has schema version {version}, older than this release's {SCHEMA_VERSION}: "
            "run `agentsession migrate` (it says what it will do first with --dry-run)"
        )


def migrate_store(url: str, *, dry_run: bool = False) -> MigrationPlan:
    """Upgrade the schema of the store at ``url`` to this release's version, in one
    transaction (``agentsession migrate``); ``dry_run`` says what it would run."""
    db = Database(url)
    try:
        return migrate_schema(db, dry_run=dry_run)
    finally:
        db.close()


def _aside_by_session(rows: Iterable[tuple[Any, str]]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """The records ``log_aside`` rows hold (in session order), a session's together; rows
    that are no record name nothing and are left out."""
    for key, group in itertools.groupby(rows, key=operator.itemgetter(0)):
        records = [r for r in (parse_record(text) for _, text in group) if not isinstance(r, str)]
        if records:
            yield int(key), records


def _first_gap(conn: Any, key: int) -> str | None:
    """The first gap in the log of the session incarnation ``key`` (:func:`.sessions.log_gaps`), in words."""
    gaps = log_gaps(pos for (pos,) in conn.execute("SELECT pos FROM log WHERE session = %s ORDER BY pos", [key]))
    return gap_message(*gaps[0]) if gaps else None


def _damaged_log(session_id: str, why: str) -> SweepRefusedError:
    return SweepRefusedError(
        f"session {session_id} has a damaged log ({why}); a sweep cannot tell what its lost or unreadable "
        f"records name: repair the session first (agentsession repair {session_id})", session=session_id
    )
