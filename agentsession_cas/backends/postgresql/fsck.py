"""fsck of a PostgreSQL store: every object re-hashed in the server (``sha256(data)``),
every log row and session row checked against the records they hold, the edges index
against the envelopes, and then every session against the one rule set
(:func:`agentsession_cas.maintenance.check.check_sessions`, as a store of any backend).

Imported when fsck runs (:meth:`PostgresBackend.fsck`), as the file backend's walk is:
it uses the domain (replay, the rules' walk), which sits above the backends.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...maintenance.check import check_sessions
from ...store.state import replay
from ..base import FsckReport
from .objects import envelope_parents, hash_name
from .schema import SPACE_CODES

if TYPE_CHECKING:
    from . import PostgresBackend
    from .database import Database

__all__ = ["fsck_walk"]

_SPACES = {code: space for space, code in SPACE_CODES.items()}


def fsck_walk(backend: PostgresBackend, store: Any, *, progress: Callable[[str], None] | None = None) -> FsckReport:
    db = backend.db
    report = FsckReport(backend.describe())
    if progress:
        progress("re-hashing every object")
    with db.conn() as c:
        counts = c.execute("SELECT space, count(*) FROM objects GROUP BY space").fetchall()
        bad = c.execute("SELECT space, hash FROM objects WHERE sha256(data) <> hash").fetchall()
    total = sum(int(n) for _, n in counts)
    report.counts.update(objects=total, **{_SPACES[s]: int(n) for s, n in counts})
    for space, raw in bad:
        name = hash_name(bytes(raw))
        report.add("error", "corrupt-object", f"{_SPACES[space]} object {name} does not hash to its name",
                   object=name, space=_SPACES[space], file="objects")
    if progress:
        progress("checking the edges index against the envelopes")
    _check_edges(db, report)
    if progress:
        progress("checking the session and log rows")
    _check_rows(db, report)
    check_sessions(store, report, progress=progress)
    return report


def _check_edges(db: Database, report: FsckReport) -> None:
    """Every parent an envelope names has its edge; every edge names a held envelope."""
    with db.conn() as c:
        edges = {(bytes(p), bytes(ch)) for p, ch in c.execute("SELECT parent, child FROM edges").fetchall()}
        wanted: set[tuple[bytes, bytes]] = set()
        with c.cursor() as cur:
            cur.execute("SELECT hash, data FROM objects WHERE space = 0 AND sha256(data) = hash")
            for raw, data in cur:
                wanted.update((p, bytes(raw)) for p in envelope_parents(bytes(data)))
        children = {bytes(r[0]) for r in c.execute("SELECT hash FROM objects WHERE space = 0").fetchall()}
    for parent, child in sorted(wanted - edges):
        report.add("warning", "edges-missing", f"envelope {hash_name(child)} names parent {hash_name(parent)}, "
                   "and the edges index lacks that row (an index: repair rebuilds it)", object=hash_name(child), file="edges")
    for parent, child in sorted(edges - wanted):
        if child not in children:
            report.add("warning", "edges-orphan", f"edges row {hash_name(parent)} -> {hash_name(child)} names no held envelope",
                       object=hash_name(child), file="edges")
    report.counts["edges"] = len(edges)


def _check_rows(db: Database, report: FsckReport) -> None:
    """Each session's row against its log's rows, and each log row's columns against its record."""
    with db.conn() as c:
        sessions = c.execute('SELECT key, id, head, mark, last_pos FROM sessions ORDER BY id COLLATE "C"').fetchall()
        orphans = c.execute("SELECT count(*) FROM log WHERE session NOT IN (SELECT key FROM sessions)").fetchone()[0]
        log_records = 0
        for key, sid, head, mark, last_pos in sessions:
            rows = c.execute("SELECT pos, op, seq, hash, record FROM log WHERE session = %s ORDER BY pos", [key]).fetchall()
            log_records += len(rows)
            records = []
            for want, (pos, op, seq, raw, text) in enumerate(rows, start=1):
                where = {"session": sid, "file": "log", "line": pos}
                if pos != want:
                    report.add("error", "log-gap", f"session {sid}: log position {want} is missing (next is {pos})", **where)
                try:
                    record = json.loads(text)
                except ValueError as exc:
                    report.add("error", "log-record", f"session {sid}: log row {pos} is not a JSON record: {exc}", **where)
                    continue
                if not isinstance(record, dict) or record.get("op") != op:
                    report.add("error", "log-row", f"session {sid}: log row {pos}'s op column {op!r} is not its record's", **where)
                    continue
                entry = record.get("entry")
                if (raw is not None and hash_name(bytes(raw)) != entry) or (seq is not None and record.get("seq") != seq):
                    report.add("error", "log-row", f"session {sid}: log row {pos}'s columns disagree with its record", **where)
                records.append(record)
            if len(rows) != last_pos:
                report.add("error", "log-length", f"session {sid}: its row says {last_pos} log record(s), the log holds {len(rows)}",
                           session=sid, file="sessions")
            state = replay(records)
            if state.head != head or state.mark != mark:
                report.add("error", "session-row",
                           f"session {sid}: its row says head {head or 'none'} and mark {mark}, its log says "
                           f"head {state.head or 'none'} and mark {state.mark}", session=sid, file="sessions")
    if orphans:
        report.add("warning", "log-orphan", f"{orphans} log row(s) belong to no session (a deleted one's): they retain nothing",
                   file="log")
    report.counts["log_records"] = log_records


