"""Migrating a store of the reference library's current layout to ours, in place.

The reference (Go) library writes today the layout go-cas-internals sections 1
to 3 describe: a ``layout`` file saying ``cas 2``; a per-session ``log`` of
CRC-32C-checksummed JSON records (``create``, ``mark``, ``append``, ``head``,
``sync``, ``lost``), which is each session's write-ahead log and commit point,
beside ``HEAD``, ``record`` and ``summary`` indexes; loose objects exactly as
ours (canonical bytes under ``objects/entries`` and ``objects/contents``,
media blobs among the contents); ``CASPACK`` packs; refs as
``refs/<name with / as %>`` (``<session> <entry or -> <ident or ->``) with a
checksummed ref log under ``logs/refs/``; and the earlier journal replaced by a
tombstone link.

The records of a session log are those the earlier store-wide journal held for
that session, so a session is rebuilt by the same replay
(:class:`~.migrate._Planner`: lazy appends whose objects are gone cut the rest,
``lost`` records honoured, heads and marks kept), fed from its own log and read
by the reference's rules for that log (section 2.4): a torn last line is a
crash's and skipped; damaged lines that all hold a zero byte are blocks a crash
left unwritten in the uncommitted tail, which is cut (its appends recorded as
losses); a record without a checksum, or any other damage, refuses the
migration (``skip_damaged`` migrates without it); a record whose newline was
replaced by one wrong byte reads, with a note.

The steps (each atomic and idempotent, so running it again finishes a migration
a crash interrupted) are those of the journal migration, less its journal: lock
(the reference's own flock files), plan (nothing written; anything that cannot
be carried over faithfully refuses the whole migration), objects (packs
unpacked, media blobs copied to ``objects/blobs``, lazy objects made durable),
sessions (the reference log kept as ``migrated/logs/<id>``, then our log
written in one rename as the session's commit point, then ``HEAD`` and
``mark``; the reference's ``cut-*`` and ``damaged-*`` files go to
``migrated/sessions/<id>/``), refs (rewritten in our form; the ref logs go to
``migrated/ref-logs/``), cleanup, and ``layout`` last, which is the commit
point: until then this release refuses the store and says to finish.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

from ...errors import AgentSessionError, BadNameError, MigrationError, quoted
from ...format.canonical import loads
from ...format.hashing import is_hash
from ...format.names import check_ref_name, check_session_id
from ...fsutil import fsync_dir, write_atomic
from ...lean import dataclass
from ...store.refs import header_ident
from . import migrate as journal_migration
from .layout import KEPT_DIR, LAYOUT, REFERENCE_LAYOUT, layout_state
from .migrate import (
    _NEW_LOG,
    _NO_HEAD,
    _OPEN,
    JournalFault,
    JournalRead,
    JournalRecord,
    MigrationReport,
    SessionPlan,
    _Locks,
    _Migration,
    _Objects,
    _Planner,
    _run,
    _segment,
    crc32c,
    migrate,
)
from .refs import ref_file_bytes, ref_file_name

__all__ = ["LogFault", "LogRead", "migrate_reference", "migrate_store", "read_session_log"]

#: The record operations a reference session log holds (the journal's others are not its).
_LOG_OPS = frozenset({"create", "mark", "append", "head", "sync", "lost"})
_LOGS = "logs"  # migrated/logs/<id>: each session's reference log, as it was
_REF_LOGS = "ref-logs"  # migrated/ref-logs/: the reference's ref logs
_SESSION_LEFTOVERS = re.compile(r"(cut|damaged)-[0-9]+")


# -- a session's log, by the reference's reading rules --------------------------------------


@dataclass
class LogFault(JournalFault):
    """Bytes of a session log that are no record (``kind``: ``torn``, ``tail`` (a crash's
    unwritten blocks, cut), ``newline`` (read, noted) or ``damaged``)."""

    def __str__(self) -> str:
        who = f"sessions/{self.session}/log" if self.session else "a session log"
        return f"{who} line {self.line} (offset {self.offset}): {self.reason}"


@dataclass
class LogRead:
    records: list[JournalRecord]
    faults: list[LogFault]
    #: Records from this line on are a crash's tail (None: no tail was cut).
    cut_line: int | None = None
    #: Append records in the cut tail: entries a crash took.
    cut_appends: list[JournalRecord] | None = None


def _checked(seg: bytes) -> dict[str, Any] | str:
    """A segment as a session log record: checksummed (an unchecked one is damage there)."""
    if b',"crc":"' not in seg:
        return "a record without a checksum (every record of a session log carries one)"
    parsed = _segment(seg)
    if isinstance(parsed, dict) and parsed["op"] not in _LOG_OPS:
        return f"a {parsed['op']!r} record, which no session log holds"
    return parsed


def read_session_log(sid: str, data: bytes) -> LogRead:
    """Every record of a reference session log, and every fault, by go-cas-internals 2.4."""
    records: list[JournalRecord] = []
    faults: list[LogFault] = []
    lossy: list[tuple[int, bool]] = []  # (line, holds a zero byte)
    line_records: dict[int, list[JournalRecord]] = {}
    offset, number = 0, 0
    while offset < len(data):
        number += 1
        end = data.find(b"\n", offset)
        terminated = end >= 0
        raw = data[offset : end if terminated else len(data)]
        got: list[JournalRecord] = []
        bad: list[tuple[int, str]] = []
        notes: list[LogFault] = []
        starts = [m.start() for m in re.finditer(re.escape(_OPEN), raw)]
        if not raw:
            pass
        elif not starts or starts[0] > 0:
            bad.append((0, "bytes that are no record"))
        for i, s in enumerate(starts):
            seg = raw[s : starts[i + 1] if i + 1 < len(starts) else len(raw)]
            parsed = _checked(seg)
            if isinstance(parsed, str) and i + 1 < len(starts):
                # One wrong byte where the newline was, the next record on the same line.
                again = _checked(seg[:-1])
                if isinstance(again, dict):
                    parsed = again
                    notes.append(LogFault(number, offset + s, "a record whose newline is one wrong byte (read)", "newline", sid))
            if isinstance(parsed, dict):
                if parsed.get("session") != sid:
                    bad.append((s, f"a record of session {quoted(parsed.get('session'))} in this session's log"))
                else:
                    got.append(JournalRecord(number, offset + s, parsed))
            else:
                bad.append((s, parsed))
        if not terminated:
            if bad:
                faults.append(LogFault(number, offset, "cut short", "torn", sid))
                break
            # An unterminated line of whole records counts (its holder adds the newline).
        elif bad:
            for s, why in bad:
                faults.append(LogFault(number, offset + s, why, "damaged", sid))
            lossy.append((number, b"\x00" in raw))
        faults.extend(notes)
        records.extend(got)
        line_records[number] = got
        offset = end + 1 if terminated else len(data)
    out = LogRead(records, faults)
    if lossy and all(zero for _, zero in lossy):
        # Blocks a crash left unwritten: the tail from the first is cut, as its recovery does.
        cut = lossy[0][0]
        out.cut_line = cut
        out.records = [r for r in records if r.line < cut]
        out.cut_appends = [r for r in records if r.line >= cut and r.op == "append"]
        for f in faults:
            if f.kind == "damaged" and f.line >= cut:
                f.kind = "tail"
                f.reason += " (zero bytes a crash left unwritten: the tail from here is cut)"
    return out


# -- refs ---------------------------------------------------------------------------------


@dataclass
class RefPlan:
    """A reference ref, and what it becomes here."""

    file: str
    name: str
    session: str | None
    ident: str | None
    note: str | None = None
    done: bool = False  # already in our form (a resumed migration)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "session": self.session, "ident": self.ident, "note": self.note}


def _ref_log_last(data: bytes) -> dict[str, Any] | None:
    """The last whole, checksummed record of a reference ref log (None: none reads)."""
    last = None
    for line in data.split(b"\n"):
        crc_at = line.rfind(b',"crc":"')
        if crc_at < 0 or not line.endswith(b'"}'):
            continue
        body = line[:crc_at]
        try:
            if int(line[crc_at + 8 : -2], 16) != crc32c(body):
                continue
            obj = json.loads(body + b"}")
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("op") == "ref":
            last = obj
    return last


# -- the plan -----------------------------------------------------------------------------


class _ReferencePlanner(_Planner):
    SOURCE = "log"

    def read(self, report: MigrationReport) -> list[str]:
        report.journal = None
        self.journal = JournalRead()  # no journal: each session's records are in its own log
        self.by_session: dict[str, list[JournalRecord]] = {}
        report.resumed = os.path.isdir(self._path(KEPT_DIR, _LOGS))
        packs, in_place = self._packs(report)
        self._objects = _Objects(self.root, packs, new_packs=not in_place)
        ids: list[str] = []
        try:
            names = sorted(os.listdir(self._path("sessions")))
        except FileNotFoundError:
            names = []
        for n in names:
            try:
                ids.append(check_session_id(n))
            except AgentSessionError:
                continue
        self.refs = self._read_refs(report)
        report.refs = [r.as_dict() for r in self.refs if not r.done]
        return ids

    def _read_refs(self, report: MigrationReport) -> list[RefPlan]:
        plans: list[RefPlan] = []
        refs_dir = self._path("refs")
        try:
            files = sorted(os.listdir(refs_dir))
        except FileNotFoundError:
            return plans
        for file in files:
            if file.startswith(("%tmp-", ".tmp-")):
                continue  # a ref write the reference (or we) left unfinished
            name = file.replace("%", "/")
            try:
                check_ref_name(name)
            except BadNameError:
                report.add_problem("bad-ref", f"refs/{file}: not a ref name ({quoted(name)})")
                continue
            with open(os.path.join(refs_dir, file), "rb") as f:
                data = f.read()
            if data.startswith(b"{"):
                plans.append(RefPlan(file, name, None, None, done=True))
                continue
            fields = data.decode("utf-8", "replace").split()
            if not 1 <= len(fields) <= 3:
                report.add_problem("bad-ref", f"refs/{file}: {data[:80]!r} is not '<session> [<entry>|- [<ident>|-]]'")
                continue
            session, entry, ident = (fields + ["-", "-"])[:3]
            log_path = self._path("logs", "refs", file)
            last = None
            if os.path.exists(log_path):
                with open(log_path, "rb") as f:
                    last = _ref_log_last(f.read())
            note = None
            if last is not None and (last.get("old_session") or "") == session and (last.get("new_session") or "") != session:
                # The record is the commit (go-cas-internals 8.4): an update recorded, not yet made.
                note = f"its log's last record moved it from {session} to {last.get('new_session') or '(deleted)'}"
                session = last.get("new_session") or ""
                entry = last.get("new_entry") or "-"
                ident = last.get("new_ident") or "-"
            if not session:
                plans.append(RefPlan(file, name, None, None, note=note))  # deleted by its last record
                continue
            if entry != "-":
                report.add_problem("bad-ref",
                    f"ref {name} pins entry {quoted(entry)} of session {quoted(session)}; this store's refs name a session only, "
                    "so the pin cannot be carried over (unpin it with the reference library first)"
                )
                continue
            try:
                check_session_id(session)
            except BadNameError:
                report.add_problem("bad-ref", f"ref {name} names {quoted(session)}, not a session id")
                continue
            held: str | None = ident
            if ident == "-":
                held = self._ident(session)
            elif re.fullmatch(r"[0-9a-f]{64}", ident):
                held = "sha256:" + ident
            if held is not None and not is_hash(held):
                report.add_problem("bad-ref", f"ref {name}: its ident {quoted(ident)} is not a sha256 hash")
                continue
            plans.append(RefPlan(file, name, session, held, note=note))
        return plans

    def _ident(self, session: str) -> str | None:
        try:
            with open(self._path("sessions", session, "header"), "rb") as f:
                return header_ident(loads(f.read()))
        except (OSError, ValueError, AgentSessionError):
            return None  # dangling: the ref is kept, as our refs keep one

    def _session(self, sid: str, recs: list[JournalRecord], compacted: bool) -> SessionPlan:
        sdir = self._path("sessions", sid)
        try:
            with open(os.path.join(sdir, "log"), "rb") as f:
                log_data = f.read()
        except FileNotFoundError:
            log_data = b""
        if log_data and _NEW_LOG.match(log_data):
            return self._already_migrated(sid, log_data)
        header_path = os.path.join(sdir, "header")
        if not os.path.exists(header_path):
            return SessionPlan(sid, "set-aside",
                               reason="it has no header (a create that never finished); its directory goes to trash/")
        plan = SessionPlan(sid, "rebuild")
        if log_data.startswith(b"sha256:"):
            plan.add_problem("bad-log", "its log is an index of the journal layout (v0.0.15 and earlier) in a 'cas 2' store")
            return plan
        header_base = self._header_base(plan, sid, header_path)
        if plan.problems:
            return plan
        lr = read_session_log(sid, log_data)
        self.log_faults.extend(lr.faults)
        damaged = [fault for fault in lr.faults if fault.kind == "damaged"]
        if damaged and not self.skip_damaged:
            for fault in damaged:
                plan.add_problem("log-damage", f"{fault}: damaged, not a crash's torn or unwritten tail "
                             "(--skip-damaged migrates without it)", line=fault.line)
            return plan
        for fault in lr.faults:
            if fault.kind == "newline":
                plan.notes.append(f"log line {fault.line}: a record whose newline was one wrong byte; read")
            elif fault.kind == "tail":
                plan.notes.append(f"log line {fault.line}: {fault.reason}")
            elif fault.kind == "torn":
                plan.notes.append(f"log line {fault.line}: a torn last line (never committed), skipped")
            elif self.skip_damaged:
                plan.notes.append(f"log line {fault.line}: damaged ({fault.reason}); skipped (--skip-damaged)")
        recs = lr.records
        base = header_base
        if recs and recs[0].op == "create":
            base = recs[0].get("base") or None
            if base != header_base:
                plan.add_problem("bad-log",
                    f"its log's create (line {recs[0].line}) names base {base or 'none'}, its header {header_base or 'none'}"
                )
                return plan
            recs = recs[1:]
        elif log_data:
            plan.notes.append("its log holds no create record; the header's base stands")
        last_lost: dict[str, int] = {}
        for i, r in enumerate(recs):
            if r.op == "lost" and r.get("entry"):
                last_lost[r.get("entry")] = i
        events: list[tuple] = []
        for i, r in enumerate(recs):
            if r.op == "append" and r.get("entry"):
                h = r.get("head") if r.get("head") else _NO_HEAD
                events.append(("append", r.get("entry"), h, bool(r.get("lazy")), r.line, i))
            elif r.op == "head":
                events.append(("head", r.get("head") or None, i))
            elif r.op == "mark":
                events.append(("mark", r.get("mark")))
            elif r.op == "create":
                plan.add_problem("bad-log", f"log line {r.line}: a second create record")
                return plan
        for r in lr.cut_appends or ():
            events.append(("lost", r.get("entry"), f"in the tail a crash left unwritten (log line {r.line})"))
        self._build(plan, sid, sdir, events, base, last_lost)
        return plan

    def plan(self, report: MigrationReport, ids: list[str]) -> None:
        self.log_faults: list[LogFault] = []
        super().plan(report, ids)
        report.torn.extend(f for f in self.log_faults if f.kind in ("torn", "tail"))
        report.damaged.extend(f for f in self.log_faults if f.kind == "damaged")


# -- doing it -----------------------------------------------------------------------------


class _ReferenceMigration(_Migration):
    """The journal migration's steps, with the reference's first write, what it keeps of
    each session, and its refs."""

    def _begin(self, planner: _Planner) -> None:
        # There is no journal to keep: the first write is where the reference logs go,
        # which also tells a refused open that a migration began.
        os.makedirs(self._path(KEPT_DIR, _LOGS), exist_ok=True)
        fsync_dir(self._path(KEPT_DIR))
        fsync_dir(self.root)
        journal_migration._reached("begun")

    def _before_session(self, plan: SessionPlan) -> None:
        self._keep(plan)

    def _after_sessions(self, planner: _Planner) -> None:
        assert isinstance(planner, _ReferencePlanner)
        self._refs(planner.refs)
        journal_migration._reached("refs")

    def _keep(self, plan: SessionPlan) -> None:
        """Keep the session's reference log (a hard link, once) and move the reference's
        recovery leftovers (``cut-*``, ``damaged-*``) out of the session directory."""
        sdir = self._path("sessions", plan.id)
        if not os.path.isdir(sdir):
            return
        log = os.path.join(sdir, "log")
        kept = self._path(KEPT_DIR, _LOGS, plan.id)
        if plan.action == "rebuild" and os.path.exists(log) and not os.path.exists(kept):
            tmp = kept + ".tmp"
            try:
                os.link(log, tmp)
            except OSError:
                with open(log, "rb") as f:
                    write_atomic(tmp, f.read(), durable=True)
            os.replace(tmp, kept)
            fsync_dir(os.path.dirname(kept))
        if plan.action == "set-aside":
            return
        leftovers = [n for n in os.listdir(sdir) if _SESSION_LEFTOVERS.fullmatch(n)]
        if leftovers:
            dest = self._path(KEPT_DIR, "sessions", plan.id)
            os.makedirs(dest, exist_ok=True)
            for n in leftovers:
                os.replace(os.path.join(sdir, n), os.path.join(dest, n))
                self.report.kept.append(f"{KEPT_DIR}/sessions/{plan.id}/{n}")
            fsync_dir(dest)
            fsync_dir(sdir)

    def _refs(self, refs: list[RefPlan]) -> None:
        refs_dir = self._path("refs")
        written = 0
        for r in refs:
            path = os.path.join(refs_dir, r.file)
            if r.done:
                continue
            if r.session is None:
                if os.path.exists(path):
                    os.unlink(path)
                continue
            record: dict[str, Any] = {"name": r.name, "session": r.session}
            if r.ident is not None:
                record["ident"] = r.ident
            target = os.path.join(refs_dir, ref_file_name(r.name))
            write_atomic(target, ref_file_bytes(record), durable=True)
            if target != path and os.path.exists(path):
                os.unlink(path)
            written += 1
        if os.path.isdir(refs_dir):
            fsync_dir(refs_dir)
        logs = self._path("logs", "refs")
        if os.path.isdir(logs):
            os.replace(logs, self._path(KEPT_DIR, _REF_LOGS))
            self.report.kept.append(f"{KEPT_DIR}/{_REF_LOGS}")
        try:
            os.rmdir(self._path("logs"))
        except (FileNotFoundError, OSError):
            pass
        fsync_dir(self._path(KEPT_DIR))
        fsync_dir(self.root)
        if written:
            self.report.steps.append(f"rewrote {written} ref(s) in this store's form")


class _ReferenceLocks(_Locks):
    """The reference's locks: ``gc.lock`` (its sweeps and packs), ``sweep.lock`` (held
    shared by its writers from an object write through the commit), ``refs.lock``
    (ref creations), and every session's ``locks/<id>`` (held while a process holds
    the session). No ``journal.lock``: there is no journal."""

    def __enter__(self) -> _ReferenceLocks:
        try:
            self._take(os.path.join(self.root, "gc.lock"),
                       f"a sweep or pack of the reference library, or another migration, holds {self.root}/gc.lock; "
                       "let it finish, then migrate", wait=False)
            for name in ("sweep.lock", "refs.lock"):
                self._take(os.path.join(self.root, name),
                           f"a writer of the reference library held {self.root}/{name} for {self.wait:g}s; "
                           "stop every writer of the reference library first", wait=True)
        except BaseException:
            self.release()
            raise
        return self


# -- the entry points ------------------------------------------------------------------------


def migrate_reference(
    root: str | os.PathLike,
    *,
    dry_run: bool = False,
    skip_damaged: bool = False,
    lock_wait: float = 60.0,
    progress: Callable[[str], None] | None = None,
) -> MigrationReport:
    """Migrate the store at ``root`` from the reference library's current layout, in place.

    Idempotent and resumable as :func:`~.migrate.migrate` is; refuses
    (:class:`MigrationError`, nothing changed) a session log damaged other than by a
    crash (``skip_damaged`` migrates without the damaged records), a committed append
    whose objects do not read, and a ref that pins an entry; and
    (:class:`MigrationBusyError`) while a process of the reference library holds one
    of its locks."""
    root = os.path.abspath(os.path.expanduser(os.fspath(root)))
    report = MigrationReport(root, "dry-run" if dry_run else "migrated", LAYOUT)
    state = layout_state(root)
    if state == "current":
        report.status = "current"
        return report
    if state != "reference":
        raise MigrationError(f"the store at {root} is not of the reference library's layout ({REFERENCE_LAYOUT!r})")
    with _ReferenceLocks(root, create=not dry_run, wait=lock_wait) as locks:
        planner = _ReferencePlanner(root, skip_damaged=skip_damaged, progress=progress)
        try:
            _run(planner, locks, report, dry_run=dry_run, progress=progress,
                 migration_class=_ReferenceMigration, kept=f"{KEPT_DIR}/{_LOGS}")
        finally:
            planner.close()
    return report


def migrate_store(
    root: str | os.PathLike,
    *,
    dry_run: bool = False,
    skip_damaged: bool = False,
    lock_wait: float = 60.0,
    progress: Callable[[str], None] | None = None,
) -> MigrationReport:
    """What ``agentsession migrate`` runs: the reference library's current layout, or the
    earlier journal layout, whichever the store is (see :func:`.layout.layout_state`)."""
    path = os.path.abspath(os.path.expanduser(os.fspath(root)))
    which = migrate_reference if layout_state(path) == "reference" else migrate
    return which(path, dry_run=dry_run, skip_damaged=skip_damaged, lock_wait=lock_wait, progress=progress)


