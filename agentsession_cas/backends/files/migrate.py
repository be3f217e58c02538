"""Migrating a store of the earlier journal layout to the current layout, in place.

The earlier layout (docs/migrate.md describes it, after go-cas-internals
section 6) kept one store-wide ``journal`` as its commit point: one
CRC-32C-checksummed JSON record per line, ``op`` create/append/head/mark/
delete (and, in its later releases, sync/lost/settled/journal). Each session
directory held an index of its entries (``log``: one hash per line), ``HEAD``
and ``record``. Objects lived loose under ``objects/entries`` and
``objects/contents`` (media blobs among the contents), or in ``CASPACK``
packs under ``objects/pack``.

:func:`migrate` rebuilds every session's log in our format from the journal
(a torn record skipped, a create or delete clearing what came before it for
that session), keeps heads, marks and objects, and writes ``layout`` last,
as the migration's commit point. The work is split into steps that are each
atomic (one rename, or one file written whole and renamed) and idempotent,
so a migration that crashes anywhere is finished by running it again:

1. **lock**: take the earlier layout's own locks (``gc.lock``,
   ``journal.lock``, ``sweep.lock``, every ``locks/<id>``) so that no
   writer of the earlier layout commits while the journal is read; refuse
   (:class:`MigrationBusyError`) when one holds any of them;
2. **plan**: read everything and decide, writing nothing; any session that
   cannot be rebuilt faithfully refuses the whole migration
   (:class:`MigrationError`), with the store left as it was;
3. **keep the journal**: hard-link it to ``migrated/journal``;
4. **tombstone**: replace ``journal`` with a symbolic link to
   ``layout/journal`` in one rename, so an old writer fails (ENOENT now,
   ENOTDIR once ``layout`` exists) rather than commits to a journal
   nobody reads;
5. **objects**: make the current object directories, unpack the old
   packs, copy media blobs from ``contents`` to ``blobs``, make durable the
   objects of appends the earlier writer left lazy, then move the old packs
   out of ``objects/pack``;
6. **sessions**: per session, write ``HEAD`` and ``mark``, then the new log
   (temp, fsync, rename: the session's own commit point), then drop the
   earlier ``record`` and ``summary``; or move a deleted session's leftover
   directory to ``trash/``;
7. **cleanup**: remove the earlier layout's journal-only files;
8. **layout**: write ``layout`` (the commit point of the whole migration).

The library prints nothing; :class:`MigrationReport` says what was (or would
be) done, and ``progress`` (a callable) is told of long steps as they run.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import re
import struct
import time
from collections.abc import Callable
from dataclasses import field
from typing import Any

from ...lean import dataclass

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system
    fcntl = None  # type: ignore[assignment]

from ...errors import (
    AgentSessionError,
    CorruptObjectError,
    CorruptPackError,
    MigrationBusyError,
    MigrationError,
    NoSuchObjectError,
    quoted,
)
from ...format.canonical import loads
from ...format.entry import LEAF_LABEL, short_id
from ...format.hashing import HASH_PREFIX, is_hash, sha256_ref
from ...format.names import check_session_id
from ...fsutil import fsync_dir, write_atomic
from ..base import FsckProblem
from .layout import JOURNAL, KEPT_DIR, LAYOUT, _journal_kind, layout_state, layout_text, old_layout_hint
from .log import encode_log, read_log
from .objects import FileObjects
from .packs import read_varint

__all__ = [
    "JOURNAL",
    "KEPT_DIR",
    "TOMBSTONE_TARGET",
    "MigrationReport",
    "SessionPlan",
    "JournalRead",
    "crc32c",
    "layout_state",
    "migrate",
    "old_layout_hint",
    "read_journal",
]

#: What the tombstone ``journal`` points at: through the regular file ``layout``,
#: so opening the journal fails with ENOTDIR (ENOENT before ``layout`` exists).
TOMBSTONE_TARGET = "layout/journal"
_TOMBSTONE_TMP = "journal.tmp-tombstone"
#: Files of the earlier layout that only its journal machinery used.
_JOURNAL_FILES = ("checkpoint", "journal.lock", "journal.gate")
_JOURNAL_TEMPS = ("checkpoint.tmp-", "journal.tmp-")
_OPS = frozenset({"create", "append", "head", "mark", "delete", "sync", "lost", "settled", "journal"})
_OPEN = b'{"op":"'
_CRC_HEX = re.compile(rb"0|[1-9a-f][0-9a-f]{0,7}")
_SESSION_IN = re.compile(rb'"session":"([A-Za-z0-9._*-]{1,200})"')
_SIDECAR = re.compile(rb"sidecar:(sha256:[0-9a-f]{64})")
_OLD_LOG_LINE = re.compile(rb"(sha256:[0-9a-f]{64})(?: [0-9]{1,18})?")
_NEW_LOG = re.compile(rb"[0-9a-f]{16} ")
_PACK_MAGIC = b"CASPACK\x00"
_PACK_NAME = re.compile(r"pack-([0-9a-f]{64})\.pack")
_SPACE_OF = {0x65: "entries", 0x63: "contents"}  # 'e', 'c'
_BATCH = 4096


# -- CRC-32C ----------------------------------------------------------------------


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli, reflected, init and final xor 0xFFFFFFFF): the earlier
    layout's record checksum. Pure Python; a migration reads each journal once."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# -- the journal ------------------------------------------------------------------


@dataclass
class JournalRecord:
    """One record of the journal as read: its line (1-based), byte offset and members."""

    line: int
    offset: int
    data: dict[str, Any]

    @property
    def op(self) -> str:
        return self.data["op"]

    @property
    def session(self) -> str:
        return self.data["session"]

    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default)


@dataclass
class JournalFault:
    """Bytes of the journal that are no record: ``torn`` (a crash cut the write short:
    at the journal's end, or before a later writer's record on the same line) or
    ``damaged`` (anything else)."""

    line: int
    offset: int
    reason: str
    kind: str
    session: str | None = None

    def __str__(self) -> str:
        who = f", session {self.session}" if self.session else ""
        return f"journal line {self.line} (offset {self.offset}{who}): {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "offset": self.offset, "reason": self.reason, "kind": self.kind, "session": self.session}


@dataclass
class JournalRead:
    records: list[JournalRecord] = field(default_factory=list)
    torn: list[JournalFault] = field(default_factory=list)
    damaged: list[JournalFault] = field(default_factory=list)
    size: int = 0

    @property
    def compacted(self) -> bool:
        """A journal a compaction rewrote: it opens with a ``journal`` record and holds only
        what the sessions' own files did not yet stand for."""
        return any(r.op == "journal" for r in self.records)


def _segment(seg: bytes) -> dict[str, Any] | str:
    """The record one ``{"op":"...`` segment spells, or why it spells none."""
    crc_at = seg.rfind(b',"crc":"')
    if crc_at >= 0:
        if not seg.endswith(b'"}'):
            return "cut short"
        digits = seg[crc_at + 8 : -2]
        if not _CRC_HEX.fullmatch(digits):
            return "malformed checksum"
        body = seg[:crc_at]
        if int(digits, 16) != crc32c(body):
            return "checksum mismatch"
        text = body + b"}"
    else:
        text = seg  # records of the earliest releases carried no checksum
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return "cut short" if crc_at < 0 else "checksum matches but the record is not JSON"
    if not isinstance(obj, dict) or not isinstance(obj.get("op"), str) or not isinstance(obj.get("session"), str):
        return "record names no operation or session"
    if obj["op"] not in _OPS:
        return f"unknown operation {quoted(obj['op'])}"
    if obj["op"] != "journal":
        try:
            check_session_id(obj["session"])
        except AgentSessionError:
            return f"record names an unusable session id {quoted(obj['session'])}"
        for name in ("entry", "head", "base"):
            v = obj.get(name)
            if v not in (None, "") and not is_hash(v):
                return f"record's {name} {quoted(v)} is not a sha256: hash"
        if obj["op"] == "mark" and obj.get("mark") not in ("record", "mirror"):
            return f"mark record names {quoted(obj.get('mark'))}, neither record nor mirror"
    return obj


def read_journal(data: bytes) -> JournalRead:
    """Parse a journal: every record, and every torn or damaged stretch of bytes.

    Lines split on LF; each line is scanned for every record opening
    ``{"op":"`` (a writer after a crash appended its record on the torn line).
    A segment that is no record is torn when a later record follows it on its
    line or when it ends the journal without an LF; otherwise it is damage.
    """
    out = JournalRead(size=len(data))
    offset = 0
    number = 0
    while offset < len(data):
        number += 1
        end = data.find(b"\n", offset)
        terminated = end >= 0
        if not terminated:
            end = len(data)
        _read_line(out, number, offset, data[offset:end], terminated)
        offset = end + 1
    return out


def _read_line(out: JournalRead, number: int, offset: int, raw: bytes, terminated: bool) -> None:
    if not raw.strip(b" \t\r"):
        return  # a blank line holds no record and loses none
    starts = [m.start() for m in re.finditer(re.escape(_OPEN), raw)]
    pieces: list[tuple[int, bytes]] = []
    if not starts or starts[0] > 0:
        pieces.append((0, raw[: starts[0] if starts else len(raw)]))
    for i, s in enumerate(starts):
        pieces.append((s, raw[s : starts[i + 1] if i + 1 < len(starts) else len(raw)]))
    for i, (start, seg) in enumerate(pieces):
        parsed = _segment(seg) if seg.startswith(_OPEN) else "bytes that are no record"
        if isinstance(parsed, dict):
            out.records.append(JournalRecord(number, offset + start, parsed))
            continue
        m = _SESSION_IN.search(seg)
        fault = JournalFault(number, offset + start, parsed, "torn", m.group(1).decode() if m else None)
        if i < len(pieces) - 1 or not terminated:
            out.torn.append(fault)
        else:
            fault.kind = "damaged"
            out.damaged.append(fault)


# -- the earlier layout's packs ----------------------------------------------------


@dataclass
class OldPack:
    """A ``CASPACK`` pack of the earlier layout: where each object's bytes lie in it."""

    path: str
    objects: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    problem: str | None = None
    _fd: int | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def idx(self) -> str:
        """Its index, beside it (the migration reads the pack alone; the index goes with it)."""
        return self.path[: -len(".pack")] + ".idx"

    def read(self, where: tuple[int, int]) -> bytes:
        # One descriptor for every read: it outlives the pack's move to migrated/packs.
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        return os.pread(self._fd, where[1], where[0])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _scan_pack(path: str) -> OldPack:
    """Index a pack by reading it through once; its checksum and each object's name are checked."""
    pack = OldPack(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 48:
            pack.problem = "shorter than a pack's header and checksum"
            return pack
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[:8] != _PACK_MAGIC:
                pack.problem = "not a pack of the earlier layout (no CASPACK magic)"
                return pack
            version, count = struct.unpack(">II", m[8:16])
            if version != 1:
                pack.problem = f"pack format version {version}, which this migration does not read"
                return pack
            digest = hashlib.sha256(m[: size - 32]).digest()
            if digest != m[size - 32 :]:
                pack.problem = "its checksum does not match its bytes"
            m_name = _PACK_NAME.fullmatch(os.path.basename(path))
            if m_name and m_name.group(1) != m[size - 32 :].hex() and pack.problem is None:
                pack.problem = "its name is not its checksum"
            pos, end = 16, size - 32
            try:
                for _ in range(count):
                    if pos + 33 > end:
                        raise ValueError("cut short")
                    space = _SPACE_OF.get(m[pos])
                    if space is None:
                        raise ValueError(f"unknown object space byte {m[pos]:#x}")
                    name = HASH_PREFIX + m[pos + 1 : pos + 33].hex()
                    length, pos = read_varint(m, pos + 33, end)
                    if pos + length > end:
                        raise ValueError("an object runs past the pack's end")
                    pack.objects.setdefault((space, name), (pos, length))
                    pos += length
            except ValueError as exc:
                pack.problem = pack.problem or f"unreadable after {len(pack.objects)} objects: {exc}"
    return pack


# -- reading objects from either place ------------------------------------------------


class _Objects:
    """The store's objects wherever a migration may find them: loose, in the earlier
    layout's packs, or (once those have left ``objects/pack``) in our own packs. Every
    read is checked against the object's name."""

    def __init__(self, root: str, packs: list[OldPack], *, new_packs: bool):
        self.loose = FileObjects(root)
        self.packs = packs
        #: Our ObjectStore reads objects/pack, which it cannot while old packs lie there.
        self.new_packs = new_packs

    def _loose(self, space: str, name: str) -> bytes | None:
        try:
            with open(self.loose.path(space, name), "rb") as f:
                data = f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        return data if sha256_ref(data) == name else None

    def get(self, space: str, name: str) -> bytes | None:
        data = self._loose(space, name)
        if data is not None:
            return data
        for pack in self.packs:
            where = pack.objects.get((space, name))
            if where is not None:
                data = pack.read(where)
                if sha256_ref(data) == name:
                    return data
        if self.new_packs:
            try:
                return self.loose.get(space, name)
            except (NoSuchObjectError, CorruptObjectError, CorruptPackError):
                return None
        return None

    def why_not(self, space: str, name: str) -> str:
        rel = self.loose.relpath(space, name)
        if os.path.exists(self.loose.path(space, name)):
            return f"{rel} does not hash to its name"
        return f"{rel} is missing"


@dataclass
class _EntryInfo:
    parent: str | None
    leaf_label: bool
    content: str
    blobs: tuple[str, ...]


# -- what the migration decides, and reports --------------------------------------------


@dataclass
class SessionPlan:
    """What the migration does (or did) with one session.

    ``action`` is ``rebuild`` (its log is written in the current format),
    ``migrated`` (a resumed migration had already rebuilt it), ``set-aside``
    (the journal deleted it, or it has no header, and its leftover directory
    goes to ``trash/``) or ``gone`` (the journal names it, nothing of it is on
    disk, and nothing is done).
    """

    id: str
    action: str
    reason: str = ""
    base: str | None = None
    head: str | None = None
    mark: str | None = None
    entries: int = 0
    #: Appends the journal accepted that the session does not keep, and why.
    lost: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Why it cannot be migrated as it stands, in fsck's shape and codes.
    problems: list[FsckProblem] = field(default_factory=list)
    trash: str | None = None
    log: bytes = b""
    lazy: list[str] = field(default_factory=list)
    blobs: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "action": self.action,
            "reason": self.reason,
            "base": self.base,
            "head": self.head,
            "mark": self.mark,
            "entries": self.entries,
            "lost": list(self.lost),
            "notes": list(self.notes),
            "problems": [p.as_dict() for p in self.problems],
            "trash": self.trash,
        }

    def add_problem(self, code: str, message: str, **where: Any) -> None:
        """Why this session cannot be migrated as it stands."""
        self.problems.append(FsckProblem("error", code, message, session=self.id, file=f"sessions/{self.id}", **where))


@dataclass
class MigrationReport:
    """What a migration did (``status`` ``migrated``), would do (``dry-run``), or found
    to do nothing about (``current``: the store is already of the current layout)."""

    root: str
    status: str
    layout: str
    resumed: bool = False
    journal: str | None = None
    journal_records: int = 0
    compacted: bool = False
    torn: list[JournalFault] = field(default_factory=list)
    damaged: list[JournalFault] = field(default_factory=list)
    sessions: list[SessionPlan] = field(default_factory=list)
    packs: list[dict[str, Any]] = field(default_factory=list)
    blobs_copied: list[str] = field(default_factory=list)
    blobs_missing: list[str] = field(default_factory=list)
    lazy_objects: int = 0
    kept: list[str] = field(default_factory=list)
    #: Why the store cannot be migrated as it stands (each session's, its id leading), in fsck's shape.
    problems: list[FsckProblem] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    #: Refs rewritten (a store of the reference library's layout): {name, session, ident, note}.
    refs: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "store": self.root,
            "status": self.status,
            "layout": self.layout,
            "resumed": self.resumed,
            "journal": {
                "source": self.journal,
                "records": self.journal_records,
                "compacted": self.compacted,
                "torn": [f.as_dict() for f in self.torn],
                "damaged": [f.as_dict() for f in self.damaged],
            },
            "sessions": [s.as_dict() for s in self.sessions],
            "objects": {
                "packs": list(self.packs),
                "blobs_copied": list(self.blobs_copied),
                "blobs_missing": list(self.blobs_missing),
                "lazy_made_durable": self.lazy_objects,
            },
            "kept": list(self.kept),
            "problems": [p.as_dict() for p in self.problems],
            "steps": list(self.steps),
            "refs": list(self.refs),
        }

    def add_problem(self, code: str, message: str, **where: Any) -> None:
        """Why the store cannot be migrated as it stands."""
        self.problems.append(FsckProblem("error", code, message, **where))


# -- where a store stands ---------------------------------------------------------------


# -- locks -----------------------------------------------------------------------------


class _Locks:
    """The earlier layout's locks, held exclusively for the length of a migration.

    Its writers hold ``locks/<id>`` while they hold a session, ``sweep.lock``
    shared from an object write through the journal commit naming it, and
    ``journal.lock`` shared per commit (a compaction, exclusive); a sweep or
    pack holds ``gc.lock``. All are flock(2) locks on files never unlinked, so
    a process that died holds nothing. ``create`` False (a dry run) takes only
    the locks whose files exist, and creates nothing.
    """

    def __init__(self, root: str, *, create: bool, wait: float):
        self.root = root
        self.create = create
        self.wait = wait
        self.fds: list[int] = []

    def _open(self, path: str) -> int | None:
        flags = os.O_RDWR | os.O_CREAT if self.create else os.O_RDONLY
        try:
            return os.open(path, flags, 0o644)
        except FileNotFoundError:
            return None

    def _try(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise

    def _take(self, path: str, what: str, *, wait: bool) -> None:
        fd = self._open(path)
        if fd is None:
            return
        self.fds.append(fd)
        deadline = time.monotonic() + (self.wait if wait else 0.0)
        delay = 0.01
        while not self._try(fd):
            if time.monotonic() >= deadline:
                raise MigrationBusyError(what)
            time.sleep(delay)
            delay = min(delay * 2, 0.25)

    def __enter__(self) -> _Locks:
        if fcntl is None:  # pragma: no cover
            raise MigrationError("migrating needs flock(2), which this platform lacks")
        try:
            self._take(
                os.path.join(self.root, "gc.lock"),
                f"another migration, or a sweep or pack of the earlier layout, holds {self.root}/gc.lock; "
                "let it finish, then migrate",
                wait=False,
            )
            for name in ("journal.lock", "sweep.lock"):
                self._take(
                    os.path.join(self.root, name),
                    f"a writer of the earlier layout held {self.root}/{name} for {self.wait:g}s; "
                    "stop every writer of the earlier version first",
                    wait=True,
                )
        except BaseException:
            self.release()
            raise
        return self

    def sessions(self, ids: list[str]) -> None:
        """Take ``locks/<id>`` of every session named (non-blocking: a holder is a live
        writer). A session with a directory gets its lock file made if it has none, so
        a writer starting now cannot take it; one without (deleted) is locked only if
        its file exists, as a writer re-creating it would have made it."""
        locks = os.path.join(self.root, "locks")
        if self.create:
            os.makedirs(locks, exist_ok=True)
        try:
            for sid in sorted(ids):
                path = os.path.join(locks, sid)
                if not os.path.exists(path) and not os.path.isdir(os.path.join(self.root, "sessions", sid)):
                    continue
                self._take(
                    path,
                    f"a process holds session {sid} of the store at {self.root} (locks/{sid}); "
                    "stop every writer of the earlier version before migrating",
                    wait=False,
                )
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()

    def __exit__(self, *exc: object) -> None:
        self.release()


# -- the plan ------------------------------------------------------------------------------


def _reached(point: str) -> None:
    """Called as each step of a migration completes; tests replace it to crash there."""


class _Planner:
    """Reads the store and decides everything; writes nothing."""

    #: What the records are read from, as a refusal names it.
    SOURCE = "journal"

    def __init__(self, root: str, *, skip_damaged: bool, progress: Callable[[str], None] | None):
        self.root = root
        self.skip_damaged = skip_damaged
        self.progress = progress
        self.infos: dict[str, _EntryInfo | str] = {}
        self.sound_prefix: set[str] = set()
        self._objects: _Objects | None = None


    @property
    def objects(self) -> _Objects:
        """The old layout's objects, once :meth:`plan` has looked at them."""
        if self._objects is None:
            raise MigrationError("the objects were asked for before the plan read them")
        return self._objects
    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def close(self) -> None:
        if self.objects is not None:
            for pack in self.objects.packs:
                pack.close()
            self.objects.loose.close()

    def read(self, report: MigrationReport) -> list[str]:
        """Read the journal and the old packs; return every session id to consider
        (the journal's and the directories')."""
        journal_kind = _journal_kind(self.root)
        kept_journal = self._path(KEPT_DIR, JOURNAL)
        if journal_kind == "file":
            source = JOURNAL
            report.resumed = os.path.exists(kept_journal)
        elif os.path.exists(kept_journal):
            source = f"{KEPT_DIR}/{JOURNAL}"
            report.resumed = True
        else:
            source = None
            report.resumed = journal_kind == "tombstone"
        data = b""
        if source is not None:
            with open(self._path(source), "rb") as f:
                data = f.read()
        jr = read_journal(data)
        self.journal = jr
        report.journal = source
        report.journal_records = len(jr.records)
        report.compacted = jr.compacted
        report.torn = jr.torn
        report.damaged = jr.damaged
        if jr.damaged and not self.skip_damaged:
            for fault in jr.damaged:
                report.add_problem("log-damage", f"{fault}: damaged in the middle of the journal, not a crash's torn tail "
                               "(--skip-damaged migrates without it)", file=JOURNAL, line=fault.line)
        packs, in_place = self._packs(report)
        self._objects = _Objects(self.root, packs, new_packs=not in_place)
        self.by_session: dict[str, list[JournalRecord]] = {}
        for r in jr.records:
            if r.op != "journal":
                self.by_session.setdefault(r.session, []).append(r)
        ids = set(self.by_session)
        try:
            for n in os.listdir(self._path("sessions")):
                try:
                    ids.add(check_session_id(n))
                except AgentSessionError:
                    continue
        except FileNotFoundError:
            pass
        return sorted(ids)

    def plan(self, report: MigrationReport, ids: list[str]) -> None:
        """Decide what becomes of every session, and which objects to convert."""
        for i, sid in enumerate(ids, 1):
            if self.progress:
                self.progress(f"reading session {i}/{len(ids)}: {sid}")
            plan = self._session(sid, self.by_session.get(sid, []), self.journal.compacted)
            report.sessions.append(plan)
            report.problems.extend(FsckProblem(p.severity, p.code, f"session {sid}: {p.message}", session=sid, file=p.file,
                                               line=p.line) for p in plan.problems)
        blobs: set[str] = set()
        for s in report.sessions:
            blobs |= s.blobs
        for name in sorted(blobs):
            if self.objects.get("blobs", name) is not None:
                continue
            if self.objects.get("contents", name) is not None:
                report.blobs_copied.append(name)
            else:
                report.blobs_missing.append(name)
        report.lazy_objects = sum(2 * len(s.lazy) for s in report.sessions)

    def _packs(self, report: MigrationReport) -> tuple[list[OldPack], bool]:
        """The earlier layout's packs: in ``objects/pack``, or already moved to
        ``migrated/packs`` by a migration that did not finish. Also says whether any
        is still in ``objects/pack``."""
        packs: list[OldPack] = []
        in_place = False
        for where in (("objects", "pack"), (KEPT_DIR, "packs")):
            pack_dir = self._path(*where)
            try:
                names = sorted(os.listdir(pack_dir))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for n in names:
                if not n.startswith("pack-") or not n.endswith(".pack"):
                    continue
                path = os.path.join(pack_dir, n)
                with open(path, "rb") as f:
                    magic = f.read(8)
                if magic != _PACK_MAGIC:
                    if where[0] == KEPT_DIR:
                        report.add_problem("bad-pack", f"{KEPT_DIR}/packs/{n} is not a pack of the earlier layout",
                                       file=f"{KEPT_DIR}/packs/{n}")
                    continue  # one of ours (a resumed migration wrote it)
                pack = _scan_pack(path)
                packs.append(pack)
                in_place = in_place or where[0] == "objects"
                report.packs.append({"pack": "/".join(where + (n,)), "objects": len(pack.objects), "problem": pack.problem})
        return packs, in_place

    # -- one entry, read once ----------------------------------------------------------

    def _info(self, entry_id: str) -> _EntryInfo | str:
        """What the migration needs of an entry, or why its objects do not read."""
        got = self.infos.get(entry_id)
        if got is not None:
            return got
        info: _EntryInfo | str
        env_bytes = self.objects.get("entries", entry_id)
        if env_bytes is None:
            info = f"the envelope of entry {entry_id}: {self.objects.why_not('entries', entry_id)}"
        else:
            try:
                env = loads(env_bytes)
            except (ValueError, AgentSessionError):
                env = None
            content = env.get("content") if isinstance(env, dict) else None
            if not is_hash(content):
                info = f"the envelope of entry {entry_id} is not an envelope"
            else:
                body_bytes = self.objects.get("contents", content)
                body = None
                if body_bytes is not None:
                    try:
                        body = loads(body_bytes)
                    except (ValueError, AgentSessionError):
                        body = None
                if body_bytes is None:
                    info = f"the content of entry {entry_id}: {self.objects.why_not('contents', content)}"
                elif not isinstance(body, dict):
                    info = f"the content of entry {entry_id} is not a JSON object"
                else:
                    parent = env.get("parent")
                    blobs = tuple(sorted({m.decode() for m in _SIDECAR.findall(body_bytes)}))
                    info = _EntryInfo(
                        parent=parent if isinstance(parent, str) else None,
                        leaf_label=env.get("type") == "label" and body.get("label") == LEAF_LABEL,
                        content=content,
                        blobs=blobs,
                    )
        self.infos[entry_id] = info
        return info

    def _prefix(self, base: str, plan: SessionPlan) -> None:
        """The path from the base to its root must read (a fork's projection holds it)."""
        walked: list[str] = []
        current: str | None = base
        seen: set[str] = set()
        while current is not None and current not in self.sound_prefix:
            if current in seen:
                plan.add_problem("broken-chain", f"entry {current} on the prefix is its own ancestor")
                return
            seen.add(current)
            info = self._info(current)
            if isinstance(info, str):
                plan.add_problem("missing-object", f"the prefix of base {short_id(base)} cannot be read: {info}")
                return
            plan.blobs.update(info.blobs)
            walked.append(current)
            current = info.parent
        self.sound_prefix.update(walked)
        if base in self.infos and isinstance(self.infos[base], _EntryInfo) and self.infos[base].leaf_label:  # type: ignore[union-attr]
            plan.add_problem("bad-base", f"base {short_id(base)} is a leaf label; a fork's base never is")

    # -- one session -------------------------------------------------------------------

    def _session(self, sid: str, recs: list[JournalRecord], compacted: bool) -> SessionPlan:
        sdir = self._path("sessions", sid)
        exists = os.path.isdir(sdir)
        resets = [i for i, r in enumerate(recs) if r.op in ("create", "delete", "settled")]
        last = resets[-1] if resets else None
        log_data = b""
        if exists:
            try:
                with open(os.path.join(sdir, "log"), "rb") as f:
                    log_data = f.read()
            except FileNotFoundError:
                pass
            if log_data and _NEW_LOG.match(log_data):
                return self._already_migrated(sid, log_data)
        if last is not None and recs[last].op == "delete":
            where = f"the journal deleted it (line {recs[last].line})"
            after = len(recs) - last - 1
            notes = [f"{after} journal record(s) after its delete ignored"] if after else []
            if exists:
                return SessionPlan(sid, "set-aside", reason=where + "; its leftover directory goes to trash/", notes=notes)
            return SessionPlan(sid, "gone", reason=where, notes=notes)
        header_path = os.path.join(sdir, "header")
        if not os.path.exists(header_path):
            why = "it has no header (a create that never finished)"
            if exists:
                return SessionPlan(sid, "set-aside", reason=why + "; its directory goes to trash/")
            return SessionPlan(sid, "gone", reason="the journal names it but nothing of it is on disk (a create that never finished)")
        plan = SessionPlan(sid, "rebuild")
        if log_data.startswith(_OPEN):
            plan.add_problem("bad-log",
                "its log is in the per-session format of a later release of the earlier store, "
                "not the journal layout; this migration does not convert it"
            )
            return plan
        if log_data and not log_data.startswith(b"sha256:"):
            plan.add_problem("bad-log", "its log is neither the earlier layout's index of hashes nor ours")
            return plan
        header_base = self._header_base(plan, sid, header_path)
        if plan.problems:
            return plan
        self._replay(plan, sid, sdir, recs, last, header_base, compacted)
        return plan

    @staticmethod
    def _header_base(plan: SessionPlan, sid: str, header_path: str) -> str | None:
        """The base the session's header names; a header that does not read, or is not a
        session header naming ``sid``, is a problem of the plan."""
        try:
            with open(header_path, "rb") as f:
                header = loads(f.read())
        except (ValueError, AgentSessionError, OSError) as exc:
            plan.add_problem("bad-header", f"its header does not read: {exc}")
            return None
        if not isinstance(header, dict) or header.get("type") != "session" or header.get("id") != sid:
            plan.add_problem("bad-header", "its header is not a session header naming this session")
            return None
        return header.get("base") if isinstance(header.get("base"), str) else None

    def _already_migrated(self, sid: str, log_data: bytes) -> SessionPlan:
        plan = SessionPlan(sid, "migrated", reason="its log is already in the current format")
        lr = read_log(log_data)
        if lr.damage or not lr.records or lr.records[0].op != "create":
            plan.notes.append("its log does not read cleanly; it is left as it is (see `agentsession verify`)")
            plan.action = "migrated-damaged"
            return plan
        head = mark = None
        own: set[str] = set()
        for r in lr.records:
            if r.op == "create":
                plan.base = head = r.get("base")
                mark = r.get("mark")
            elif r.op == "append":
                own.add(r.get("entry"))
                if "head" in r.data:
                    head = r.get("head")
            elif r.op == "head":
                head = r.get("head")
            elif r.op == "mark":
                mark = r.get("mark")
        plan.head, plan.mark, plan.entries = head, mark, len(own)
        return plan

    def _old_files(self, plan: SessionPlan, sdir: str) -> tuple[list[str], str | None, str]:
        """The session's own files: (entries of its index log, HEAD, record mark)."""
        entries: list[str] = []
        try:
            with open(os.path.join(sdir, "log"), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        lines = data.split(b"\n")
        if lines and lines[-1]:
            plan.notes.append("the last line of its index log was torn (no newline) and is not read")
        for n, line in enumerate(lines[:-1], 1):
            m = _OLD_LOG_LINE.fullmatch(line)
            if m is None:
                plan.add_problem("bad-log", f"line {n} of its index log is not '<hash> [<size>]'")
                continue
            e = m.group(1).decode()
            if e not in entries:
                entries.append(e)
        head = None
        try:
            with open(os.path.join(sdir, "HEAD"), "rb") as f:
                text = f.read().decode("ascii", "replace").strip()
            if is_hash(text):
                head = text
            elif text:
                plan.add_problem("bad-head", f"its HEAD file holds {quoted(text)}, not an entry id")
        except FileNotFoundError:
            pass
        return entries, head, self._record_mark(sdir)

    @staticmethod
    def _record_mark(sdir: str) -> str:
        try:
            with open(os.path.join(sdir, "record"), "rb") as f:
                return "record" if f.read().strip() == b"record" else "mirror"
        except FileNotFoundError:
            return "mirror"  # the earlier layout read a missing record file so

    def _replay(
        self,
        plan: SessionPlan,
        sid: str,
        sdir: str,
        recs: list[JournalRecord],
        last: int | None,
        header_base: str | None,
        compacted: bool,
    ) -> None:
        """Rebuild the session's state as the earlier layout's recovery would, and its new log."""
        # ("append", entry, head or _NO_HEAD, lazy, journal line or None, record index)
        # | ("head", head, record index) | ("mark", mark); the index decides whether a
        # `lost` record comes after it.
        events: list[tuple] = []
        base = header_base
        start = last + 1 if last is not None else 0
        beyond: list[str] = []
        if last is not None and recs[last].op == "create":
            create = recs[last]
            base = create.get("base") or None
            if base != header_base:
                plan.add_problem("bad-log",
                    f"the journal's create (line {create.line}) names base {base or 'none'}, "
                    f"its header {header_base or 'none'}"
                )
                return
        else:
            # The journal holds nothing that began this session: a compacted journal, or a
            # session older than the journal. Its own files stand for what came before.
            entries, file_head, _ = self._old_files(plan, sdir)
            if last is not None:  # settled: only the first `seq` entries of the index stood fsynced
                settled = recs[last]
                count = settled.get("seq") or 0
                if not isinstance(count, int) or count < 0 or count > len(entries):
                    plan.add_problem("bad-log",
                        f"the journal's settled record (line {settled.line}) counts {quoted(count)} entries; "
                        f"its index log holds {len(entries)}"
                    )
                    return
                entries, beyond = entries[:count], entries[count:]
                start_head = settled.get("head") or None
                plan.notes.append(f"taken from its own files up to the journal's settled record (line {settled.line})")
            else:
                start_head = file_head
                plan.notes.append(
                    "the journal holds nothing that began it"
                    + (" (a compacted journal)" if compacted else "")
                    + "; taken from its own files (index log, HEAD, record)"
                )
            at = last if last is not None else -1  # a `lost` record after this point still counts
            for e in entries:
                events.append(("append", e, _NO_HEAD, False, None, at))
            mentioned = {r.get("entry") for r in recs[start:]}
            kept_beyond = []
            for e in beyond:
                if e in mentioned:
                    continue  # the journal says what became of it
                if isinstance(self._info(e), _EntryInfo):
                    kept_beyond.append(e)
                    events.append(("append", e, _NO_HEAD, True, None, at))
                else:
                    plan.lost.append({"entry": e, "why": "listed by its index log past what the journal settled, and its objects are gone"})
            if kept_beyond:
                plan.notes.append(
                    f"kept {len(kept_beyond)} entr{'y' if len(kept_beyond) == 1 else 'ies'} its index log held past "
                    "the journal's settled count, whose objects are whole"
                )
                if file_head in entries + kept_beyond:
                    start_head = file_head  # the earlier recovery let HEAD win then
            if start_head != base:
                events.append(("head", start_head, at))
        if plan.problems:
            return
        last_lost: dict[str, int] = {}
        for i, r in enumerate(recs):
            if r.op == "lost" and r.get("entry"):
                last_lost[r.get("entry")] = i
        for i in range(start, len(recs)):
            r = recs[i]
            if r.op == "append" and r.get("entry"):
                h = r.get("head") if r.get("head") else _NO_HEAD
                events.append(("append", r.get("entry"), h, bool(r.get("lazy")), r.line, i))
            elif r.op == "head":
                events.append(("head", r.get("head") or None, i))
            elif r.op == "mark":
                events.append(("mark", r.get("mark")))
            elif r.op in ("create", "settled"):  # a reset after `last` cannot be; guard anyway
                plan.add_problem("bad-log", f"journal line {r.line}: a {r.op} record after the session began")
                return
        self._build(plan, sid, sdir, events, base, last_lost)

    def _build(
        self,
        plan: SessionPlan,
        sid: str,
        sdir: str,
        events: list[tuple],
        base: str | None,
        last_lost: dict[str, int],
    ) -> None:
        own: list[str] = []
        own_set: set[str] = set()
        leaf_labels: set[str] = set()
        head = base
        mark: str | None = None
        first_mark: str | None = None
        out: list[tuple] = []  # kept events, in order
        losses: list[tuple[str, str]] = []
        cut = False
        for ev in events:
            kind = ev[0]
            if kind == "lost":
                # ("lost", entry, why): an append the reader already knows a crash took.
                losses.append((ev[1], ev[2]))
                continue
            if cut:
                if kind == "append" and ev[1] not in own_set:
                    losses.append((ev[1], "after an earlier lazy append the crash took"))
                continue
            if kind == "append":
                entry, h, lazy, line, index = ev[1], ev[2], ev[3], ev[4], ev[5]
                if last_lost.get(entry, -1) > index:
                    if entry not in own_set:
                        losses.append((entry, f"the {self.SOURCE} recorded it lost"))
                    continue
                if entry in own_set:
                    if h is not _NO_HEAD:
                        out.append(("head", h))
                        head = h
                    continue
                info = self._info(entry)
                if isinstance(info, str):
                    if lazy:
                        # A lazy append the crash took: it and everything after it go.
                        cut = True
                        losses.append((entry, f"a lazy append whose objects are gone ({info})"))
                        continue
                    where = f" ({self.SOURCE} line {line})" if line else " (its index log)"
                    plan.add_problem("missing-object", f"entry {entry}{where} is committed but {info}")
                    return
                parent = info.parent
                if parent is None and base is not None:
                    plan.add_problem("base", f"entry {entry} is a root, but the session is a fork of {short_id(base)}")
                    return
                if parent is not None and parent != base and parent not in own_set:
                    plan.add_problem("parent",
                        f"entry {entry} hangs from {parent}, which is neither the base nor an earlier entry of the session"
                    )
                    return
                own.append(entry)
                own_set.add(entry)
                if info.leaf_label:
                    leaf_labels.add(entry)
                plan.blobs.update(info.blobs)
                if lazy:
                    plan.lazy.append(entry)
                out.append(("append", entry, h, info.leaf_label))
                if h is not _NO_HEAD:
                    head = h
            elif kind == "head":
                h, index = ev[1], ev[2]
                if h is not None and last_lost.get(h, -1) > index:
                    continue
                out.append(("head", h))
                head = h
            elif kind == "mark":
                if first_mark is None and not out:
                    first_mark = ev[1]
                else:
                    out.append(("mark", ev[1]))
                mark = ev[1]
        if base is not None:
            self._prefix(base, plan)
            if plan.problems:
                return
        if head is None and base is not None:
            head = base
            plan.notes.append("no head named; the head is the base")
        if head is not None and not (head == base or (head in own_set and head not in leaf_labels)):
            plan.add_problem("head-rule",
                f"its head {head} is not the base or one of its entries that is not a leaf label"
            )
            return
        file_mark = self._record_mark(sdir)
        final_mark = mark or file_mark
        lines: list[dict[str, Any]] = [{"op": "create", "session": sid, "base": base, "mark": first_mark or file_mark}]
        seq = 0
        replay_head = base
        for ev in out:
            if ev[0] == "append":
                seq += 1
                rec: dict[str, Any] = {"op": "append", "seq": seq, "entry": ev[1]}
                if ev[2] is not _NO_HEAD:
                    rec["head"] = ev[2]
                    replay_head = ev[2]
                if ev[3]:
                    rec["leaf_label"] = True
                lines.append(rec)
            elif ev[0] == "head":
                lines.append({"op": "head", "head": ev[1]})
                replay_head = ev[1]
            else:
                lines.append({"op": "mark", "mark": ev[1]})
        if replay_head != head:
            lines.append({"op": "head", "head": head})
        seen_loss: set[str] = set()
        for entry, why in losses:
            if entry in seen_loss or entry in own_set:
                continue
            seen_loss.add(entry)
            seq += 1
            lines.append({"op": "loss", "entry": entry, "seq": seq})
            plan.lost.append({"entry": entry, "why": why})
        lines.append({"op": "commit"})
        plan.log = encode_log(lines)
        plan.base, plan.head, plan.mark, plan.entries = base, head, final_mark, len(own)


_NO_HEAD = object()  # an append that did not move the head


# -- doing it ------------------------------------------------------------------------------


class _Migration:
    def __init__(self, root: str, report: MigrationReport, progress: Callable[[str], None] | None):
        self.root = root
        self.report = report
        self.progress = progress
        self.objects = FileObjects(root)

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def _say(self, text: str) -> None:
        if self.progress:
            self.progress(text)

    def run(self, planner: _Planner) -> None:
        self._begin(planner)
        self._convert_objects(planner)
        self._rebuild_sessions()
        self._after_sessions(planner)
        self._cleanup()
        _reached("cleanup")
        fsync_dir(self._path("objects"))
        write_atomic(self._path("layout"), (LAYOUT + "\n").encode(), durable=True)
        self.report.steps.append(f"wrote layout {LAYOUT!r} (the commit point)")

    def _begin(self, planner: _Planner) -> None:
        """The first writes: the journal kept, then its tombstone."""
        self._keep_journal()
        self.report.steps.append("kept the journal as migrated/journal")
        _reached("kept-journal")
        self._tombstone()
        self.report.steps.append("replaced the journal with a tombstone")
        _reached("tombstone")

    def _before_session(self, plan: SessionPlan) -> None:
        """What a layout keeps of a session before its log is replaced (nothing here:
        the journal, kept whole, is the record)."""

    def _after_sessions(self, planner: _Planner) -> None:
        """Store-wide state beside the sessions (none in the journal layout)."""

    def _convert_objects(self, planner: _Planner) -> None:
        self._directories()
        _reached("directories")
        self._stage_packs(planner.objects.packs)
        planner.objects.new_packs = True
        _reached("packs-staged")
        self._unpack(planner.objects.packs)
        _reached("unpacked")
        self._blobs(planner.objects)
        _reached("blobs")
        self._lazy(planner.objects)
        _reached("lazy-objects")
        self._retire_packs(planner.objects.packs)
        _reached("packs-retired")

    def _rebuild_sessions(self) -> None:
        sessions = self.report.sessions
        for i, plan in enumerate(sessions, 1):
            self._say(f"session {i}/{len(sessions)}: {plan.id}")
            self._before_session(plan)
            self._session(plan)
            _reached(f"session:{plan.id}")
        fsync_dir(self._path("sessions"))
        fsync_dir(self._path("trash"))
        self.report.steps.append(f"rebuilt {sum(1 for s in sessions if s.action == 'rebuild')} session log(s)")

    def _keep_journal(self) -> None:
        """Hard-link the journal into migrated/ (so the tombstone's rename keeps its bytes);
        a copy where links are refused. Done again while the journal is still a file."""
        kept_dir = self._path(KEPT_DIR)
        os.makedirs(kept_dir, exist_ok=True)
        kept = os.path.join(kept_dir, JOURNAL)
        journal = self._path(JOURNAL)
        if _journal_kind(self.root) == "file":
            if os.path.exists(kept) and os.path.samefile(journal, kept):
                return
            tmp = os.path.join(kept_dir, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
            try:
                os.link(journal, tmp)
                os.replace(tmp, kept)
            except OSError:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                with open(journal, "rb") as f:
                    write_atomic(kept, f.read(), durable=True)
            fsync_dir(kept_dir)
            fsync_dir(self.root)
        elif not os.path.exists(kept):
            # A store of the earlier layout that never wrote a journal: keep an empty one,
            # so a resumed migration knows it read everything there was.
            write_atomic(kept, b"", durable=True)
            fsync_dir(self.root)

    def _tombstone(self) -> None:
        if _journal_kind(self.root) == "tombstone":
            return
        tmp = self._path(_TOMBSTONE_TMP)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        try:
            os.symlink(TOMBSTONE_TARGET, tmp)
        except OSError:
            # No symbolic links here: the journal is only removed (its bytes are kept).
            try:
                os.unlink(self._path(JOURNAL))
            except FileNotFoundError:
                pass
        else:
            os.replace(tmp, self._path(JOURNAL))
        fsync_dir(self.root)

    def _directories(self) -> None:
        for sub in ("sessions", "locks", "tmp", "trash"):
            os.makedirs(self._path(sub), exist_ok=True)
        self.objects.make_fanout()
        fsync_dir(self._path("objects"))
        fsync_dir(self.root)

    def _unpack(self, packs: list[OldPack]) -> None:
        for i, pack in enumerate(packs, 1):
            if not os.path.exists(pack.path):
                continue
            self._say(f"unpacking {pack.name} ({i}/{len(packs)}, {len(pack.objects)} objects)")
            batch: list[tuple[str, str, bytes]] = []
            bad = 0
            for (space, name), where in pack.objects.items():
                data = pack.read(where)
                if sha256_ref(data) != name:
                    bad += 1
                    continue
                batch.append((space, name, data))
                if len(batch) >= _BATCH:
                    self.objects.put_many(batch)
                    batch = []
            if batch:
                self.objects.put_many(batch)
            if bad and pack.problem is None:
                pack.problem = f"{bad} object(s) in it do not hash to their names"
        if packs:
            self.report.steps.append(f"unpacked {len(packs)} pack(s) of the earlier layout")

    def _blobs(self, objects: _Objects) -> None:
        names = self.report.blobs_copied
        for start in range(0, len(names), _BATCH):
            batch = []
            for name in names[start : start + _BATCH]:
                data = objects.get("contents", name)
                if data is not None:
                    batch.append(("blobs", name, data))
            self.objects.put_many(batch)
        if names:
            self.report.steps.append(f"copied {len(names)} media blob(s) to objects/blobs")

    def _lazy(self, objects: _Objects) -> None:
        """The earlier writer did not fsync a lazy append's objects; our log, which carries
        no payload for migrated appends, needs them durable before it names them."""
        batch: list[tuple[str, str, bytes]] = []
        for plan in self.report.sessions:
            for entry in plan.lazy:
                env = objects.get("entries", entry)
                info = loads(env) if env is not None else None
                content = objects.get("contents", info["content"]) if isinstance(info, dict) else None
                if env is None or content is None:
                    raise MigrationError(f"session {plan.id}: the objects of entry {entry} vanished during the migration")
                batch.append(("contents", info["content"], content))  # type: ignore[index]
                batch.append(("entries", entry, env))
                if len(batch) >= _BATCH:
                    self.objects.put_many(batch)
                    batch = []
        self.objects.put_many(batch)

    def _stage_packs(self, packs: list[OldPack]) -> None:
        """Move the old packs from objects/pack (where ours live, and which our object
        store reads) to migrated/packs, each file in one rename, the index first."""
        staged = self._path(KEPT_DIR, "packs")
        moved = False
        for pack in packs:
            if os.path.dirname(pack.path) == staged:
                continue
            os.makedirs(staged, exist_ok=True)
            # The index first: our object store lists indexes, and must never meet an old one.
            for src in (pack.idx, pack.path):
                if os.path.exists(src):
                    os.replace(src, os.path.join(staged, os.path.basename(src)))
            pack.path = os.path.join(staged, pack.name)
            moved = True
        if moved:
            fsync_dir(staged)
            fsync_dir(self._path("objects", "pack"))
            self.report.steps.append(f"moved {len(packs)} pack(s) of the earlier layout out of objects/pack")
        pack_dir = self._path("objects", "pack")
        if os.path.isdir(pack_dir):
            for n in os.listdir(pack_dir):
                if n.startswith(".tmp-"):
                    os.unlink(os.path.join(pack_dir, n))  # an interrupted pack write of the earlier layout

    def _retire_packs(self, packs: list[OldPack]) -> None:
        """Once their objects are unpacked and durable, the old packs go; a damaged one
        stays in migrated/packs, so nothing is lost that might yet be read from it."""
        removed = 0
        for pack in packs:
            if pack.problem is not None:
                self.report.kept.append(os.path.relpath(pack.path, self.root))
                continue
            for p in (pack.idx, pack.path):
                if os.path.exists(p):
                    os.unlink(p)
            removed += 1
        if removed:
            staged = self._path(KEPT_DIR, "packs")
            fsync_dir(staged)
            if not os.listdir(staged):
                os.rmdir(staged)
            self.report.steps.append(f"removed {removed} unpacked pack(s) of the earlier layout")

    def _session(self, plan: SessionPlan) -> None:
        sdir = self._path("sessions", plan.id)
        if plan.action == "set-aside":
            if os.path.isdir(sdir):
                trash = self._path("trash", f"{plan.id}-{time.time_ns()}")
                os.rename(sdir, trash)
                plan.trash = os.path.relpath(trash, self.root)
            return
        if plan.action not in ("rebuild", "migrated"):
            return
        if plan.action == "rebuild":
            # The log first, in one rename: the session's commit point. Until then its
            # earlier files (which planning reads) are untouched; after it a rerun passes
            # the session over and only redoes what follows.
            write_atomic(os.path.join(sdir, "log"), plan.log, durable=True)
        self._indexes(sdir, plan)
        self._remove(os.path.join(sdir, "summary"))
        self._remove(os.path.join(sdir, "rules"))
        self._remove(os.path.join(sdir, "record"))

    @staticmethod
    def _indexes(sdir: str, plan: SessionPlan) -> None:
        for name, text in (("HEAD", (plan.head or "") + "\n"), ("mark", (plan.mark or "mirror") + "\n")):
            write_atomic(os.path.join(sdir, name), text.encode(), durable=False)

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _cleanup(self) -> None:
        for name in os.listdir(self.root):
            if name in _JOURNAL_FILES or name.startswith(_JOURNAL_TEMPS):
                self._remove(self._path(name))
        self._remove(self._path("objects", "pruned"))
        fsync_dir(self.root)


# -- the entry point ---------------------------------------------------------------------


def migrate(
    root: str | os.PathLike,
    *,
    dry_run: bool = False,
    skip_damaged: bool = False,
    lock_wait: float = 60.0,
    progress: Callable[[str], None] | None = None,
) -> MigrationReport:
    """Migrate the store at ``root`` from the earlier journal layout, in place.

    Idempotent: a store already of the current layout reports ``current``
    and is not touched; a migration a crash interrupted is finished. Refuses
    (:class:`MigrationError`, nothing changed) when any session cannot be
    rebuilt faithfully or the journal is damaged other than by a crash's
    torn write (``skip_damaged`` migrates without the damaged records), and
    (:class:`MigrationBusyError`) while a process of the earlier layout holds
    one of its locks, waiting up to ``lock_wait`` seconds for a commit in
    flight. ``dry_run`` decides everything and writes nothing.
    """

    root = os.path.abspath(os.path.expanduser(os.fspath(root)))
    report = MigrationReport(root, "dry-run" if dry_run else "migrated", LAYOUT)
    state = layout_state(root)
    if state == "current":
        report.status = "current"
        return report
    if state == "none":
        raise MigrationError(f"no store at {root}: no layout file, journal, sessions/ or objects/ to migrate")
    if state == "reference":
        raise MigrationError(
            f"the store at {root} is of the reference library's layout ({layout_text(root)!r}); "
            "migrate_reference.migrate_reference converts it"
        )
    if state == "other":
        raise MigrationError(
            f"the store at {root} has layout {quoted(layout_text(root))}: neither this release's "
            f"({LAYOUT!r}) nor the earlier journal layout this command migrates"
        )
    with _Locks(root, create=not dry_run, wait=lock_wait) as locks:
        planner = _Planner(root, skip_damaged=skip_damaged, progress=progress)
        try:
            _run(planner, locks, report, dry_run=dry_run, progress=progress)
        finally:
            planner.close()
    return report


def _run(
    planner: _Planner,
    locks: _Locks,
    report: MigrationReport,
    *,
    dry_run: bool,
    progress: Callable[[str], None] | None,
    migration_class: type[_Migration] = _Migration,
    kept: str = f"{KEPT_DIR}/{JOURNAL}",
) -> None:
    """Under the store-wide locks: read, lock the sessions, plan, do (with
    ``migration_class``); ``kept`` is what the report names first as kept."""
    ids = planner.read(report)
    locks.sessions(ids)
    _reached("locked")
    planner.plan(report, ids)
    if report.problems:
        if dry_run:
            report.status = "would-refuse"
            return
        first = report.problems[0].message
        more = f" (and {len(report.problems) - 1} more; --dry-run lists them)" if len(report.problems) > 1 else ""
        raise MigrationError(
            f"cannot migrate the store at {report.root}: {first}{more}; nothing was changed",
            problems=[p.as_dict() for p in report.problems],
        )
    if dry_run:
        return
    _reached("planned")
    migration = migration_class(report.root, report, progress)
    try:
        migration.run(planner)
    finally:
        migration.objects.close()
    report.kept.insert(0, kept)
