"""fsck of a PostgreSQL store: every object read (decompressed) and re-hashed against its name,
every log row and session row checked against the records they hold, each kept snapshot
against the log it stands for, the edges index against the envelopes, and then every session against the one rule set
(:func:`agentsession_cas.maintenance.check.check_sessions`, as a store of any backend). Last, the
objects nothing retains are counted per space by the sweep's rule
(:func:`agentsession_cas.maintenance.sweep.unreferenced`), over the logs read in one statement
and what the walk read of the objects: no object is read a second time.

Imported when fsck runs (:meth:`PostgresBackend.fsck`), as the file backend's walk is:
it uses the domain (replay, the rules' walk), which sits above the backends.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

from ...errors import NoSuchObjectError
from ...format.hashing import envelope_content, raw_hash
from ...format.media import sidecar_names
from ...maintenance.check import check_sessions
from ...maintenance.sweep import EnvelopeBytes, RawNames, unreferenced
from ...store.state import index_damage, replay, stale_head
from ..base import FsckReport
from .objects import envelope_parents, hash_name
from .schema import SPACE_CODES
from .sessions import SNAPSHOT, log_gaps, parse_record, row_disagrees, snapshot_problem

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
    counts: dict[str, int] = {}
    parents: set[tuple[bytes, bytes]] = set()  # what the edges index must hold
    kept = _Walked()  # the sound objects, and what the retention rule reads of them
    with db.conn() as c, c.transaction(), c.cursor(name="fsck_objects") as cur:
        cur.itersize = 500
        # The rows of a block together, so each block is read and decompressed once.
        cur.execute("SELECT space, hash, codec, data FROM objects ORDER BY CASE WHEN codec = 3 THEN data END NULLS FIRST")
        for space, raw, codec, stored in cur:
            raw, name, sp = bytes(raw), hash_name(bytes(raw)), _SPACES[space]
            counts[sp] = counts.get(sp, 0) + 1
            data = backend.objects.codecs.decode(int(codec), bytes(stored))
            if data is None or hashlib.sha256(data).digest() != raw:
                report.add("error", "corrupt-object", f"{sp} object {name} does not hash to its name",
                           object=name, space=sp, file="objects")
                continue
            if space == 0:
                parents.update((p, raw) for p, _ in envelope_parents(data))
                kept.envelopes[raw] = data
            elif space == 1:
                kept.contents.add(raw)
                if b"sidecar:" in data:
                    kept.named[raw] = sidecar_names(data)
            else:
                kept.blobs.append(raw)
    report.counts.update(objects=sum(counts.values()), **counts)
    if progress:
        progress("checking the edges index against the envelopes")
    _check_edges(db, report, parents, kept.envelopes.keys())
    if progress:
        progress("checking the session and log rows")
    _check_rows(db, report, kept.content_of)
    check_sessions(store, report, progress=progress)
    if progress:
        progress("counting unreferenced objects")
    # The logs read after the objects, as a sweep reads them: an append landing meanwhile
    # is never counted unreferenced. A damaged log retains what of it reads (its damage is
    # reported above; a sweep would refuse the store until it is repaired).
    sound = {"entries": RawNames(kept.envelopes.keys()), "contents": RawNames(kept.contents), "blobs": RawNames(kept.blobs)}
    report.counts["unreferenced"] = unreferenced(
        store, sound, backend.retention_sources(refuse_damage=False), objects=kept, progress=progress)
    return report


class _Walked(EnvelopeBytes):
    """The sound objects as the walk read them, by raw hash, for the retention rule: each
    envelope's bytes and each content's ``sidecar:`` names (none kept for the many that
    name none), so counting what is unreferenced sends the database no query per object
    (fsck's peak for the 100,000-entry benchmark session: 325 MB, 288 MB without them)."""

    def __init__(self) -> None:
        self.envelopes: dict[bytes, bytes] = {}
        self.contents: set[bytes] = set()
        self.named: dict[bytes, list[str]] = {}
        self.blobs: list[bytes] = []

    def read_order(self, raws: Iterable[bytes]) -> list[bytes]:
        return list(raws)

    def content_of(self, raw: bytes) -> bytes | None:
        """The raw digest of the content a sound envelope names (None: no sound envelope)."""
        data = self.envelopes.get(raw)
        name = envelope_content(data) if data is not None else None
        return raw_hash(name) if name is not None else None

    def envelope(self, raw: bytes) -> bytes:
        data = self.envelopes.get(raw)
        if data is None:
            raise NoSuchObjectError(f"no sound entries object {hash_name(raw)}")
        return data

    def sidecars(self, raw: bytes) -> list[str]:
        if raw not in self.contents:
            raise NoSuchObjectError(f"no sound contents object {hash_name(raw)}")
        return self.named.get(raw, [])


def _check_edges(db: Database, report: FsckReport, wanted: set[tuple[bytes, bytes]], envelopes: Collection[bytes]) -> None:
    """Every parent a sound envelope names has its edge; every edge names a held envelope."""
    with db.conn() as c:
        edges = {(bytes(p), bytes(ch)) for p, ch in c.execute("SELECT parent, child FROM edges").fetchall()}
        held = {bytes(r[0]) for r in c.execute("SELECT hash FROM objects WHERE space = 0").fetchall()}
    for parent, child in sorted(wanted - edges):
        report.add("warning", "edges-missing", f"envelope {hash_name(child)} names parent {hash_name(parent)}, "
                   "and the edges index lacks that row (an index of the envelopes: storing the envelope again restores it)", object=hash_name(child), file="edges")
    for parent, child in sorted(edges - wanted):
        if child not in held:
            report.add("warning", "edges-orphan", f"edges row {hash_name(parent)} -> {hash_name(child)} names no held envelope",
                       object=hash_name(child), file="edges")
    report.counts["edges"] = len(edges)


def _check_rows(db: Database, report: FsckReport, content_of: Callable[[bytes], bytes | None]) -> None:
    """Each session's row against its log's rows, and each log row's columns against its record,
    all read in one snapshot: an append or a delete committed while fsck reads is not a
    row disagreeing with its log."""
    with db.conn() as c, c.transaction():
        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        sessions = c.execute('SELECT key, id, head, mark, last_pos FROM sessions ORDER BY id COLLATE "C"').fetchall()
        orphans = c.execute("SELECT count(*) FROM log WHERE session NOT IN (SELECT key FROM sessions)").fetchone()[0]
        log_records = 0
        for key, sid, head, mark, last_pos in sessions:
            rows = c.execute("SELECT pos, op, seq, hash, content, record FROM log WHERE session = %s ORDER BY pos",
                             [key]).fetchall()
            log_records += len(rows)
            records = []
            # A position missing (log-gap) is the session's walk's to name, once (its log's
            # history says so, as verify ID does: log_gaps is the one rule).
            gapped = bool(log_gaps(pos for pos, *_ in rows))
            for pos, op, seq, raw, content, text in rows:
                record = parse_record(text)
                if isinstance(record, str):
                    continue  # a row that is no record: the session's walk names it (log-damage), once
                why = row_disagrees(record, op, seq, raw, content, content_of)
                if why is not None:  # (the record is what every read takes: the columns index it)
                    report.add("error", "log-row", f"session {sid}: log row {pos}: {why}", session=sid, file="log", line=pos)
                records.append(record)
            kept = c.execute("SELECT pos, data FROM states WHERE session = %s AND kind = %s", [key, SNAPSHOT]).fetchone()
            if kept is not None:
                problem = snapshot_problem(int(kept[0]), bytes(kept[1]), {pos: text for pos, *_, text in rows})
                if problem is not None:
                    report.add(problem[0], problem[1], f"session {sid}: {problem[2]}", session=sid, file="states")
            if gapped:
                # (its row's head, and a length past its last row, held to a log that lost records
                # would name the gap again; rows past the row's length are a fault of their own)
                if rows[-1][0] > last_pos:
                    report.add("error", "log-length", f"session {sid}: its row says {last_pos} log record(s), the log "
                               f"holds rows up to position {rows[-1][0]}", session=sid, file="sessions")
                continue
            state = replay(records)
            if len(records) == len(rows) and index_damage(state, head, (last_pos, rows[-1][0] if rows else 0)):
                continue  # the row's head or length ahead of the log: the session's walk names it (log-cut), once
            if len(rows) != last_pos:
                report.add("error", "log-length", f"session {sid}: its row says {last_pos} log record(s), the log holds {len(rows)}",
                           session=sid, file="sessions")
            # (a head on a leaf label, the mark right: the session's walk names it, stale-head, once)
            if (state.head != head or state.mark != mark) and not (state.mark == mark and stale_head(state, head)):
                report.add("error", "session-row",
                           f"session {sid}: its row says head {head or 'none'} and mark {mark}, its log says "
                           f"head {state.head or 'none'} and mark {state.mark}", session=sid, file="sessions")
    if orphans:
        report.add("warning", "log-orphan", f"{orphans} log row(s) belong to no session (a deleted one's): they retain nothing",
                   file="log")
    report.counts["log_records"] = log_records


