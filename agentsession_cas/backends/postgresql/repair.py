"""Repair of a damaged session in a PostgreSQL store: its log rows rewritten from what can
be proved, the damaged rows kept aside in ``log_aside``.

The rules are the file backend's repair planner's, run over this session's rows
(:class:`agentsession_cas.backends.files.repair.RepairPlanner`, which consults the one
rule set; the session's row may keep its head and mark: ``_RowPlanner``): each row is spelled as a log line, a row that is no
record as a line that does not read, and the session's row stands where the
file backend reads its ``HEAD`` and ``mark`` index files. The log is read whole; a kept
snapshot is planned from when rows it stands for are lost and it agrees with the rest
(``_snapshot_start``). What the plan keeps is
written in one transaction: the objects it recovered, the damaged rows copied to
``log_aside``, the new rows, and the session's row, conditional on the log
being as the plan read it. ``docs/repair.md`` states the rules; ``docs/postgresql.md``
what differs here.

It uses the domain (sessions, replay), so nothing in ``backends/`` imports it:
:mod:`agentsession_cas.maintenance.repair` does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import AgentSessionError, SessionDamagedError, StoreError
from ...format.entry import short_id
from ...format.hashing import envelope_content, is_hash, raw_hash, sha256_ref
from ...format.names import check_session_id
from ...lean import dataclass
from ...store.session import Session, parse_header
from ...store.state import replay
from ..base import Space
from ..files.log import encode_record, expand_snapshot, read_log
from ..files.repair import DamagedLine, Recovered, RepairPlanner, RepairReport, build_log, check_repairable
from . import PostgresBackend
from .objects import copy_rows, hash_name
from .sessions import (
    LOG_COLUMNS,
    LOG_TYPES,
    SNAPSHOT,
    gap_message,
    kept_snapshot,
    log_gaps,
    log_repeats,
    log_rows,
    parse_record,
    row_columns,
    row_disagrees,
    row_text,
    snapshot_problem,
)

if TYPE_CHECKING:
    from ...store.store import Store

__all__ = ["plan_repair", "repair_session"]


class _RowPlanner(RepairPlanner):
    """The file backend's planner, with the session's row for its index files.

    The row is written in the transaction of the records it follows (``append_records``),
    so where the records that read leave the head or the mark elsewhere than the row says,
    and a line the damage took lies after the last head move (mark) that reads, that line's
    record may have moved it (a ``head`` record lost, a ``mark`` record lost): the row's
    head, when it names a kept entry, and its mark are kept, with a note (``head-from-row``,
    ``mark-from-row``). Not when a move reads after the last damage (nothing lost can have
    moved it since: the row is what is wrong), nor when rows lie past the row's length
    (``row_stale``: the row is older than the log). The file backend's ``HEAD`` is written
    after the log, so there the log's replay stands (docs/repair.md)."""

    row_head: str | None = None
    row_mark: str = ""
    #: Rows lie past the session row's ``last_pos``: the row is older than the log.
    row_stale: bool = False

    def run(self) -> RepairReport:
        rep = super().run()
        if self.row_stale:
            return rep
        head = self.head_index()
        if (head is not None and head != rep.head and self.last_bad > self.last_head_read and head in self.kept
                and self.may_hold(head)):
            rep.note("head-from-row", f"the session's row names head {short_id(head)}, a kept entry, where the records "
                     f"that read leave it at {short_id(rep.head) if rep.head else 'none'}: the row is written with the "
                     "records it follows, so a record the damage took moved it there; the head stays where the row "
                     "says", object=head, file=self.head_file())
            self.out.append(({"op": "head", "head": head}, None))
            self.head = rep.head = head
            rep.head_note = "as the session's row names it (written with the records; a lost record moved it there)"
        if self.row_mark in ("record", "mirror") and self.row_mark != rep.mark and self.last_bad > self.last_mark_read:
            rep.note("mark-from-row", f"the session's row says mark {self.row_mark}, where the records that read leave "
                     f"{rep.mark}: the row is written with the records it follows, so a mark record the damage took "
                     "set it; the mark stays what the row says", file=self.head_file())
            self.out.append(({"op": "mark", "mark": self.row_mark}, None))
            self.mark = rep.mark = self.row_mark
        return rep

    def head_file(self) -> str:
        return "sessions"  # the session's row holds its head (fsck's file for it)

    def head_index(self) -> str | None:
        return self.row_head if isinstance(self.row_head, str) and is_hash(self.row_head) else None

    def summary_index(self) -> tuple[int, str | None]:
        return 0, None  # the file backend's summary file: a database's rows are its only account

    def mark_index(self) -> tuple[str, str]:
        if self.row_mark in ("record", "mirror"):
            return self.row_mark, "from the session's row"
        return "mirror", "the session's row says neither, so the safer mirror"


def _backend(store: Store) -> PostgresBackend:
    backend = store.backend
    if not isinstance(backend, PostgresBackend):
        raise StoreError(f"{store.describe()} is not a PostgreSQL store")
    return backend


#: What a position missing from the log is spelled as for the planner: a line that does not
#: read and holds nothing (shorter than any append: it may have held one, and spent its number).
_MISSING_ROW = b"missing-row\n"


def _missing(texts: list[tuple[int, str]]) -> list[int]:
    """Each position missing from the log (:func:`.sessions.log_gaps`, the one rule)."""
    return [pos for missing, after in log_gaps(pos for pos, _ in texts) for pos in range(missing, after)]


def _as_log(texts: list[tuple[int, str]], start: _Snapshot | None = None) -> bytes:
    """The rows as the file backend's log lines, line N the log's position N: a row that is
    no record as a line that does not read (its text, newlines made spaces), and a position
    missing from the log (a gap) as one too, holding nothing, and a repeated append row
    (:func:`.sessions.log_repeats`) as one, so the first is kept: the planner then recovers what
    the lost record appended, where a kept record or the row's head names it, and numbers it
    as for any damaged line. From a kept snapshot (``start``), the rows it stands for are
    its create and snapshot records (lines 1 and 2, as a compacted file log holds them),
    then a commit for each row after line 2 (so line N is still position N), then the rows
    after it."""
    lines = dict.fromkeys(_missing(texts), _MISSING_ROW)
    if start is not None:
        lines = {pos: line for pos, line in lines.items() if pos > start.pos}
        lines.update({1: encode_record(start.create), 2: encode_record(start.snapshot)})
        lines.update(dict.fromkeys(range(3, start.pos + 1), encode_record({"op": "commit"})))
        texts = [(pos, text) for pos, text in texts if pos > start.pos]
    read: list[tuple[int, dict[str, Any]]] = []
    for pos, text in texts:
        record = parse_record(text)
        if isinstance(record, str):
            lines[pos] = b"damaged-row " + text.replace("\n", " ").encode("utf-8", "replace") + b"\n"
        else:
            lines[pos] = encode_record(record)
            read.append((pos, record))
    # A repeated append row (log_repeats: a second append of an entry, a number spent
    # again) as a line that does not read: the planner keeps the first and drops it.
    spent = start.snapshot["seq"] if start is not None else 0
    while (repeat := log_repeats(read, spent)) is not None:
        lines[repeat[0]] = b"repeated-row " + lines[repeat[0]]
        read = [(pos, r) for pos, r in read if pos != repeat[0]]
    return b"".join(line for _, line in sorted(lines.items()))


@dataclass
class _Snapshot:
    """A kept snapshot a repair plans from: the log's first ``pos`` rows as its ``create``
    and ``snapshot`` records, and what of those rows was lost (``lost``: position -> why)."""

    pos: int
    create: dict[str, Any]
    snapshot: dict[str, Any]
    lost: dict[int, str]
    #: Why it is not planned from, in words (it says other than the rows under it that read).
    disagrees: str | None = None


def _record_key(record: dict[str, Any]) -> str:
    """What a record says that a snapshot keeps of it: an append its entry and number, any
    other record whole (a row's JSON, which need not be canonical: no error)."""
    if record.get("op") == "append":
        return json.dumps([record.get("entry"), record.get("seq")])
    return json.dumps(record, sort_keys=True)


#: The entries a ``snapshot-disagrees`` note names at most (a long snapshot's would make one
#: note of megabytes); it counts the rest.
_NAMES_SHOWN = 20


def _snapshot_start(kept: tuple[int, bytes] | None, texts: list[tuple[int, str]]) -> _Snapshot | None:
    """The kept snapshot (``kept``: the log's length it stands for, its bytes) a repair plans
    from instead of the rows it stands for, when one of those rows is lost (a gap) or is no
    record: one an open trusts (:func:`.sessions.kept_snapshot`) is proof of what they held,
    as a kept record is. None when there is none, it is not trusted, or the rows under it
    read whole; ``disagrees`` says why not when it says other than those that read (each
    must be one of its records, in its order, and it may hold no more records than were lost)."""
    if kept is None:
        return None
    pos, data = kept
    rows = dict(texts)
    got = kept_snapshot(data, pos, rows.get(1), rows.get(pos))
    if isinstance(got, str):
        # Not trusted (the row it ends at, or row 1, lost among others): not planned from,
        # but what it names that the plan does not keep is said, never dropped unsaid.
        read = read_log(data, expand=False)
        whole = all(p in rows and not isinstance(parse_record(rows[p]), str) for p in range(1, pos + 1))
        if whole or read.damage or read.cut or [r.op for r in read.records] != ["create", "snapshot"]:
            return None
        return _Snapshot(pos, read.records[0].data, read.records[1].data, {}, f"it is not trusted: {got}")
    create, snapshot = got
    lost: dict[int, str] = {}
    said: list[str] = []  # (what each row under it that reads says, in order)
    for p in range(2, pos + 1):
        record = parse_record(rows[p]) if p in rows else "is missing: the record it held is lost"
        if isinstance(record, str):
            lost[p] = record
        elif record["op"] not in ("commit", "checkpoint"):
            said.append(_record_key(record))
    if not lost:
        return None
    records = expand_snapshot(snapshot)
    records = records[: len(records) - (3 if snapshot["mark"] is not None else 2)]  # (not its closing head, mark, commit)
    holds = [_record_key(r) for r in records if r["op"] not in ("commit", "checkpoint")]
    keys = iter(holds)
    for key in said:  # (each in the snapshot's order: what is left of ``keys`` after it)
        if key not in keys:
            return _Snapshot(pos, create, snapshot, lost, f"a record that reads under it ({key[:100]}) is not "
                             "one of its own, in its order")
    if len(holds) - len(said) > len(lost):
        return _Snapshot(pos, create, snapshot, lost, f"it holds {len(holds) - len(said)} record(s) the rows under "
                         f"it do not, more than the {len(lost)} row(s) lost")
    return _Snapshot(pos, create, snapshot, lost)


def _row_fixes(backend: PostgresBackend, conn: Any, key: int,
               texts: list[tuple[int, str]]) -> list[tuple[int, str, tuple[Any, ...]]]:
    """The log rows whose columns are not an index of their record (``row_disagrees``, the
    one rule), as (position, what the columns say, what they should hold: the op, seq and
    hash :func:`log_rows` writes of that record, and the content its entry's envelope
    names where the row named one and the envelope reads, else none)."""
    records = {pos: parse_record(text) for pos, text in texts}
    named_by: dict[bytes, bytes | None] = {}  # (each envelope read once: a fix asks again)

    def content_of(raw: bytes) -> bytes | None:
        raw = bytes(raw)
        if raw not in named_by:
            try:
                name = envelope_content(backend.objects.get("entries", hash_name(raw)))
            except AgentSessionError:
                name = None
            named_by[raw] = raw_hash(name) if name is not None else None
        return named_by[raw]

    fixes: list[tuple[int, str, tuple[Any, ...]]] = []
    for pos, op, seq, raw, content in conn.execute(
            "SELECT pos, op, seq, hash, content FROM log WHERE session = %s ORDER BY pos", [key]).fetchall():
        record = records.get(pos)
        if not isinstance(record, dict):
            continue  # not a record: the planner's damage, not an index's
        if row_disagrees(record, op, seq, raw, content, content_of) is None:
            continue
        want = row_columns(record)
        have = (op, seq, None if raw is None else bytes(raw), None if content is None else bytes(content))
        named = content_of(want[2]) if content is not None and want[0] == "append" and want[2] is not None else None
        fixes.append((pos, row_text(*have), (*want, named)))
    return fixes


def _from_snapshot(report: RepairReport, start: _Snapshot, texts: list[tuple[int, str]]) -> None:
    """What a plan made from a kept snapshot reports of the rows it stands for: each row lost
    as a damaged line, and each entry it names that no row under it that reads appends as
    recovered (``snapshot``); and the commits that held the rows' places (:func:`_as_log`)
    left out of the rows written, a commit after a commit saying nothing."""
    report._records[:] = [r for k, r in enumerate(report._records)
                          if not (k and r[0] == {"op": "commit"} and report._records[k - 1][0] == {"op": "commit"})]
    where = f"the kept snapshot (states kind 2, log row {start.pos}) stands for it"
    report.damage.extend(DamagedLine(pos, 0, 0, f"log {'position' if why.startswith('is missing') else 'row'} {pos} {why}; {where}")
                         for pos, why in start.lost.items())
    report.damage.sort(key=lambda d: d.line)
    read: set[str] = set()
    for pos, text in texts:
        record = parse_record(text)
        if 1 < pos <= start.pos and not isinstance(record, str) and record["op"] == "append":
            read.add(record.get("entry"))  # type: ignore[arg-type]
    report.recovered.extend(Recovered(e, report._kept_seqs[e], "snapshot") for e in start.snapshot["entries"]
                            if e not in read and e in report._kept_seqs)


def plan_repair(store: Store, session_id: str, *, progress: Callable[[str], None] | None = None) -> RepairReport:
    """What a repair of the session would keep, recover and drop; writes nothing."""
    check_session_id(session_id)
    backend = _backend(store)
    with backend.db.conn() as c:
        row, texts = backend.sessions.rows(c, session_id)
        fixes = _row_fixes(backend, c, row[0], texts)
    key, header_bytes, row_head, row_mark, last_pos, _ = row
    try:
        with backend.sessions.whole_log():  # (damage in the rows a kept snapshot stands for is sought too)
            probe = Session._open(store, session_id, writable=False)
    except SessionDamagedError as exc:
        why = exc.why
    else:
        probe.close()
        report = RepairReport(
            session=session_id, damaged=False, why="its log reads whole", kept=list(probe.log_order),
            head=probe.head, mark=probe.mark, seq=probe.state.max_seq, head_note="as the log names it",
            _kept_seqs=dict(probe.own),
        )
        if row_head != probe.head:
            report.stale_indexes.append(("head", row_head, probe.head or ""))
        if row_mark != probe.mark:
            report.stale_indexes.append(("mark", row_mark, probe.mark))
        # The row's length and each log row's op, seq and hash columns index its records
        # (what every read takes, and what fsck holds them to: log-length, log-row).
        # (a gap is damage: the probe's open refuses it, whole_log reading every row)
        if last_pos != len(texts):
            report.stale_indexes.append(("log length", str(last_pos), str(len(texts))))
        for pos, said, want in fixes:
            report.stale_indexes.append((f"log row {pos}", said, row_text(*want)))
        kept = backend.db.query("SELECT pos, data FROM states WHERE session = %s AND kind = %s", [key, SNAPSHOT])
        if kept and snapshot_problem(int(kept[0][0]), bytes(kept[0][1]), dict(texts)) is not None:
            report.stale_indexes.append(("snapshot", f"states kind 2 at log row {kept[0][0]}", "dropped"))
        return report
    header_bytes = bytes(header_bytes)
    header = parse_header(session_id, header_bytes)
    kept = backend.db.query("SELECT pos, data FROM states WHERE session = %s AND kind = %s", [key, SNAPSHOT])
    start = _snapshot_start((int(kept[0][0]), bytes(kept[0][1])) if kept else None, texts)
    planner = _RowPlanner(store, session_id, header, header_bytes,
                          _as_log(texts, start if start is not None and start.disagrees is None else None), why, progress)
    planner.row_head, planner.row_mark = row_head, row_mark
    planner.row_stale = bool(texts) and max(pos for pos, _ in texts) > last_pos
    report = planner.run()
    missing = set(_missing(texts))
    for d in report.damage:
        if d.line in missing:
            d.reason = f"log position {d.line} is missing: the record it held is lost"
    under = 0
    if start is not None and start.disagrees is None:
        under = start.pos
        _from_snapshot(report, start, texts)
    elif start is not None:
        names = [e for e in start.snapshot["entries"] if e not in report._kept_seqs]
        shown = ", ".join(names[:_NAMES_SHOWN]) + (f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else "")
        report.note("snapshot-disagrees", f"the kept snapshot (states kind 2, log row {start.pos}) stands for rows the "
                    f"log lost, but is not planned from: {start.disagrees}; the rows are, and of the entries it names "
                    f"{len(names)} {'is' if len(names) == 1 else 'are'} not kept{': ' + shown if names else ''}",
                    file="states")
    for first, after in log_gaps(pos for pos, _ in texts):
        if after <= under:
            how = (f"among the rows the kept snapshot (states kind 2, log row {under}) stands for: it names what they "
                   "held, as a kept record does, so the repair plans from it and the rows after it (every entry it names "
                   "comes back with its own number) and rewrites the rows")
        else:
            how = ("the repair reads each as a damaged line holding nothing (what a kept record or the session's head "
                   "names of it comes back from the objects) and rewrites the rows")
        report.note("log-gap", f"{gap_message(first, after)}: a record lost at each; {how}",
                    file="log", line=after)  # (fsck's code and line for the same fault)
    report._source = repr([(pos, text) for pos, text in texts]).encode()
    return report


def repair_session(
    store: Store,
    session_id: str,
    *,
    confirm: Callable[[RepairReport], bool] | None = None,
    progress: Callable[[str], None] | None = None,
) -> RepairReport:
    """Repair a damaged session holding its advisory lock (see the module); a whole one is
    left as it is, its row set to what its log says where they differ."""
    check_repairable(store, session_id)
    backend = _backend(store)
    conn = backend.sessions.take(session_id)
    try:
        report = plan_repair(store, session_id, progress=progress)
        if not report.damaged:
            if report.stale_indexes:
                with conn.transaction():
                    key, = conn.execute("UPDATE sessions SET head = %s, mark = %s WHERE id = %s RETURNING key",
                                        [report.head, report.mark, session_id]).fetchone()
                    texts = conn.execute("SELECT pos, record FROM log WHERE session = %s ORDER BY pos", [key]).fetchall()
                    for pos, _, (op, seq, raw, content) in _row_fixes(backend, conn, key, texts):
                        conn.execute("UPDATE log SET op = %s, seq = %s, hash = %s, content = %s WHERE session = %s AND pos = %s",
                                     [op, seq, raw, content, key, pos])
                    conn.execute("UPDATE sessions SET last_pos = %s WHERE key = %s", [len(texts), key])
                    if any(name == "snapshot" for name, _, _ in report.stale_indexes):
                        conn.execute("DELETE FROM states WHERE session = %s AND kind = %s", [key, SNAPSHOT])
                report.indexes_fixed = True
            return report
        if confirm is not None and not confirm(report):
            report.cancelled = True
            return report
        _write(backend, conn, session_id, report)
        return report
    finally:
        backend.sessions.let_go(conn)


def _write(backend: PostgresBackend, conn: Any, session_id: str, report: RepairReport) -> None:
    """The plan, in one transaction, checked to replay to it before anything is kept."""
    records = [r.data for r in read_log(build_log(report, "log_aside")).records if r.op != "checkpoint"]
    state = replay(records)
    if [why for _, why in state.damage] or state.log_order != report.kept or (state.head, state.mark) != (report.head, report.mark):
        raise StoreError(f"session {session_id} was not repaired: the log the repair built does not replay to the plan; "
                         "nothing was changed (please report this)")
    objects: dict[tuple[Space, str], bytes] = {(s, n): b for s, n, b in report._objects}
    for data, payload in report._records:
        if payload is not None:
            content, envelope = payload
            objects[("contents", sha256_ref(content))] = content
            objects[("entries", str(data["entry"]))] = envelope
    with conn.transaction():
        backend.objects.barrier(conn)
        row = conn.execute("SELECT key, last_pos FROM sessions WHERE id = %s FOR UPDATE", [session_id]).fetchone()
        texts = conn.execute("SELECT pos, record FROM log WHERE session = %s ORDER BY pos", [row[0]]).fetchall()
        if repr([(pos, text) for pos, text in texts]).encode() != report._source:
            raise StoreError(f"session {session_id} was not repaired: its log changed while the repair read it")
        key = int(row[0])
        backend.objects.write_rows(conn, [(s, n, b) for (s, n), b in objects.items()])
        kept = conn.execute(
            "INSERT INTO log_aside (session, id, kept, pos, record) "  # one time for the whole log set aside
            "SELECT session, %s, t.kept, pos, record FROM log, (SELECT clock_timestamp() AS kept) t "
            "WHERE session = %s RETURNING kept",
            [session_id, key],
        ).fetchone()
        conn.execute("DELETE FROM log WHERE session = %s", [key])
        conn.execute("DELETE FROM states WHERE session = %s", [key])  # they describe the log replaced
        copy_rows(conn, LOG_COLUMNS, LOG_TYPES, log_rows(key, 0, records))
        conn.execute("UPDATE sessions SET last_pos = %s, head = %s, mark = %s, fence = fence + 1 WHERE key = %s",
                     [len(records), state.head, state.mark, key])
    report.repaired = True
    report.damaged_log = f"table log_aside, session {session_id}, kept at {kept[0].isoformat() if kept else '?'}"
