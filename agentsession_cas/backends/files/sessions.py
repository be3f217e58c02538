"""Sessions in a store directory: ``sessions/<id>/{header,log,HEAD,mark}``, one lock each.

The log's byte format is :mod:`.log`'s. This module is how the file backend
keeps a session's log as RFC 0002 asks, and one speed-up of its own:

- **The log carries the objects.** An append record carries its entry's two
  objects after its JSON (the payload), so a durable append is one write and
  one fsync of the log. Objects reach ``objects/`` at **checkpoints** (every
  :data:`CHECKPOINT_ENTRIES` appends, on a worker thread; at close; before a
  fork reads them), written as one pack, made durable, then a ``checkpoint``
  record says so. Until then the log (and this process's memory) is where
  they are, and :class:`~.objects.FileObjects` serves them from here.
- **Recovery** reads one session's log when it is opened: a torn or
  unwritten tail after the last commit is a crash's loss (dropped, with a
  ``loss`` record); an uncommitted append whose objects the crash took is
  lost with everything after it; objects a checkpoint did not reach are
  restored from their payloads. Anything else that fails its checksum is
  damage (:class:`~agentsession_cas.errors.SessionDamagedError`).
- ``HEAD`` and ``mark`` are indexes written after a commit (never ahead of
  the durable log), for readers that want them without the log; the domain
  checks them against the log on every open.
- One writer per session, holding ``locks/<id>.lock``; a read-only snapshot
  takes no lock and writes nothing.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import (
    AgentSessionError,
    NoSuchSessionError,
    SessionDamagedError,
    SessionExistsError,
    SessionLockedError,
    StoreError,
)
from ...format.canonical import canonical_bytes, loads
from ...format.hashing import sha256_ref
from ...format.names import check_session_id
from ...fsutil import NotAFileError, fsync_dir, read_dense, read_prefix, read_small, start_writeback, write_atomic
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
    record_data,
)
from .locks import FileLock, LockTimeout
from .log import (
    CHECKSUM_HEX,
    LINE_OVERHEAD,
    ZERO_LINK,
    AppendRow,
    SnapshotIds,
    append_body,
    chain,
    chain_one,
    checked_body,
    checksummed_line,
    header_of,
    line_bodies,
    make_snapshot,
    read_log,
    read_snapshot_ids,
    read_tail,
    record_body,
    run_snapshot,
    snapshot_ids_file,
    with_digests,
)
from .sweep import SESSION_FILES

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    from . import FileBackend

__all__ = [
    "CHECKPOINT_ENTRIES", "FileSessionLog", "FileSessions", "payload_entry", "checkpoint_covers", "read_summary", "kept_summary",
]

#: Appends whose objects live only in the log (their payloads) before a checkpoint
#: writes them to objects/.
CHECKPOINT_ENTRIES = 1024
#: The most a session's header file may hold (a header is small; a sparse file of
#: gigabytes where one should be is refused unread), and an index file (HEAD, mark, summary).
HEADER_LIMIT = 16 << 20
#: The most of a log's new bytes a follower's read takes in one read (history_since).
_TAIL_LIMIT = 16 << 20
_SMALL = 1 << 16
#: Compaction (a snapshot in place of the records a checkpoint covers, payloads
#: dropped): at close once the log grew this much since its last snapshot ...
COMPACT_AT_CLOSE = 64 << 10
#: ... and while writing once it grew this much and at least its snapshot's size (so
#: the bytes rewritten stay proportional to the bytes appended).
COMPACT_WHILE_WRITING = 8 << 20
_COMMIT = record_body({"op": "commit"})
_ENTRY_IN_RECORD = re.compile(rb'"entry":"(sha256:[0-9a-f]{64})"')
_SEQ_IN_RECORD = re.compile(rb'"seq":([0-9]{1,18})[,}]')
#: How an append record begins (its members in canonical order: ``entry`` first).
_APPEND_START = b'{"entry":"'


def _may_be_append(torn: bytes) -> bool:
    """Whether a torn line may be an append whose entry id did not survive: what can be
    read of its record (up to any zeroed bytes) is the start of an append's, or nothing."""
    part = torn[LINE_OVERHEAD - 1 :].split(b"\0", 1)[0][: len(_APPEND_START)]
    return _APPEND_START.startswith(part)

_CHECKPOINT_POOL: ThreadPoolExecutor | None = None


def _checkpoint_pool() -> ThreadPoolExecutor:
    """One worker for background checkpoints: zstd and fsync let go of the GIL, so
    the appending thread goes on while a pack is compressed and written."""
    global _CHECKPOINT_POOL
    if _CHECKPOINT_POOL is None:
        # (Imported here: concurrent.futures and what it imports cost start-up that a
        # command which never checkpoints, head or list, need not pay.)
        from concurrent.futures import ThreadPoolExecutor

        _CHECKPOINT_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentsession-checkpoint")
    return _CHECKPOINT_POOL



def checkpoint_covers(records: Iterable[tuple[str, Any]]) -> int:
    """The highest sequence number whose objects a checkpoint record says are in
    objects/, from each record's ``op`` and ``seq`` (None when it has none): a
    checkpoint's ``seq``, or, for one without (written before checkpoints ran on a
    worker), every append before it."""
    covered, seen = 0, 0
    for op, seq in records:
        if op == "append" and isinstance(seq, int):
            if seq > seen:  # (a comparison, not a call of max: once per append of a long log)
                seen = seq
        elif op == "snapshot":  # compaction kept only appends a checkpoint covered
            covered = seen = max(seen, seq)
        elif op == "checkpoint":
            covered = max(covered, seq if isinstance(seq, int) else seen)
    return covered


def payload_entry(entry_id: str, payload: tuple[bytes, bytes]) -> tuple[dict, dict] | None:
    """Check an append's payload against the id it is logged under: (envelope, body) or None."""
    content, env_bytes = payload
    if sha256_ref(env_bytes) != entry_id:
        return None
    try:
        env = loads(env_bytes)
        body = loads(content)
    except (ValueError, AgentSessionError):
        return None
    if not isinstance(env, dict) or env.get("content") != sha256_ref(content) or not isinstance(body, dict):
        return None
    return env, body


def _identity(st: os.stat_result) -> list[str]:
    """What tells one state of a log file from another: inode, size, mtime (as strings:
    an I-JSON number could not hold them whole)."""
    return [str(st.st_ino), str(st.st_size), str(st.st_mtime_ns)]


def _read_index(directory: str, name: str, limit: int, parse: Callable[[bytes], Any]) -> dict[str, Any] | None:
    """The JSON object of a checksummed index file (one line of the log's form), or None
    when there is none or it does not read (an index: rebuilt, never an error)."""
    try:
        raw = read_small(os.path.join(directory, name), limit)
    except OSError:
        return None
    body = checked_body(raw)
    try:
        data = parse(body) if body is not None else None
    except (ValueError, AgentSessionError):
        return None
    return data if isinstance(data, dict) else None


def _header_lost_at(sdir: str) -> bool:
    """A session directory holding a log but no header: a session a listing no longer
    shows (its header file lost), damaged rather than gone."""
    return not os.path.lexists(sdir + "/header") and os.path.lexists(sdir + "/log")


def read_summary(directory: str) -> tuple[dict[str, Any], list[str]] | None:
    """(summary, log identity) from a session's ``summary`` file, or None."""
    data = _read_index(directory, "summary", _SMALL, orjson.loads)  # checksummed, ours: the fastest parser
    if data is None:
        return None
    summary, ident = data.get("summary"), data.get("log")
    if not isinstance(summary, dict) or not (isinstance(ident, list) and len(ident) == 3):
        return None
    return summary, ident


def kept_summary(directory: str) -> dict[str, Any] | None:
    """The summary a session's ``summary`` file holds, current or not (what the domain
    holds to the log: :func:`~...store.state.index_damage`). Read it before the log, as
    HEAD: a writer rewrites it only after a commit, so read first it can lag what is read
    of the log, never lead it."""
    kept = read_summary(directory)
    return kept[0] if kept is not None else None


#: The side file holding a compacted log's snapshot ids raw (``docs/storage-format.md``),
#: and the bytes of ids below which none is kept (decoding them costs less than a read).
IDS_FILE = "ids"
_IDS_WORTH = 32 * 4096

#: The largest ``rules`` file read: bigger, it is rebuilt (it grows with the call ids
#: a session used, about 40 bytes each).
_RULES_MAX = 1 << 28


def _read_rule_state(directory: str) -> dict[str, Any] | None:
    """The append rules' state from a session's ``rules`` file, or None. Parsed by
    json's own parser, not the strict one: the line is one this store wrote (its
    checksum holds) and the domain checks the form as it restores; the strict parse
    would cost a 100,000-entry session's first append 20 ms."""
    return _read_index(directory, "rules", _RULES_MAX, json.loads)


def _with_header(records: Sequence[Record], header: bytes) -> Sequence[Record]:
    """The records with the session's header in the ``create`` record: the log holds the
    header, so a damaged or stale ``header`` file is an index to rewrite, not a loss."""
    if isinstance(records, CreatedRecords):
        create = records.create
        return records if "header" in create else records.with_create(dict(create, header=loads(header)))
    out = list(records)
    if out and not isinstance(out[0], Append) and out[0].get("op") == "create" and "header" not in out[0]:
        out[0] = dict(out[0], header=loads(header))
    return out


def _encode(record: Record) -> bytes:
    """A record's bytes in its line (the line's frame is :func:`~.log.chain`'s)."""
    if record.__class__ is Append:
        r: Any = record
        objects = r.objects
        return append_body(r.seq, r.entry, r.head, r.head_moved, r.leaf_label, r.lazy, None if objects is None else objects[1:])
    return record_body(record)  # type: ignore[arg-type]  # (any other record is its members)


def _held_item(record: Record, offset: int) -> tuple[Any, ...]:
    """What a writer keeps of a record it wrote, for compaction (its members, no
    payload, and its offset): an append as its row (:data:`~.log.AppendRow`, the offset
    last), which holds only atomic values, so the collector stops tracking it (a long
    session keeps one per append, and every full collection would walk an
    :class:`Append` object each); any other record as its members."""
    if isinstance(record, Append):
        r = record  # its row (append_row) and the offset, made inline: every append pays for it
        return (r.seq, r.entry, r.head, r.head_moved, r.leaf_label, r.lazy, offset)
    return (record, offset)


def append_row(r: Append) -> AppendRow:
    """An append as its row (:data:`~.log.AppendRow`): what compaction and a created log's
    snapshot read of it, with no dict made of it."""
    return (r.seq, r.entry, r.head, r.head_moved, r.leaf_label, r.lazy)


#: The fewest bytes an append record's line takes (checksum, link, op, seq and a full
#: entry id): how many appends make a log at least :data:`COMPACT_AT_CLOSE` long.
APPEND_LINE_MIN = 100


def _created_log(records: Sequence[Record]) -> tuple[bytes, str, int, list[dict[str, Any]] | None]:
    """The log a session created whole starts with: (its bytes, its last line's checksum,
    where what compaction would replace begins, the records written when they are not
    ``records``). Its objects are made durable in the same create, before the session is
    visible, so when its records end with a commit and carry no payloads it is written as
    its close would compact it, once it is :data:`COMPACT_AT_CLOSE` or longer: the
    ``create`` record and one ``snapshot``. An import of 100,000 entries so writes two
    lines, not 100,000 appends that its close would read back and every open (and the
    creating session's own state) would replay one by one; their ids given as digests
    (:class:`CreatedRecords`), the snapshot is made of them as they are."""
    if isinstance(records, CreatedRecords) and len(records.own) * APPEND_LINE_MIN >= COMPACT_AT_CLOSE:
        snapshot = run_snapshot(records.create, records.own, records.leaf_labels, records.tail)
        data, link = chain([record_body(records.create), record_body(snapshot)])
        return data, link, len(data), [records.create, snapshot]
    last = records[-1] if records else None
    appends = sum(1 for r in records if isinstance(r, Append))
    foldable = (
        appends and isinstance(last, dict) and last.get("op") in COMMIT_POINTS
        and not any(isinstance(r, Append) and r.objects is not None for r in records)
    )
    if not foldable or appends * APPEND_LINE_MIN < COMPACT_AT_CLOSE:
        data, link = chain(_encode(r) for r in records)
        if not foldable or len(data) < COMPACT_AT_CLOSE:
            return data, link, 0, None
    create = records[0]
    assert isinstance(create, dict)
    snapshot = with_digests(make_snapshot(create, (append_row(r) if isinstance(r, Append) else r for r in records[1:])))
    data, link = chain([record_body(create), record_body(snapshot)])
    return data, link, len(data), [create, snapshot]


def _ids_file(link: str, snapshot: Mapping[str, Any]) -> bytes | None:
    """The ``ids`` file of a snapshot line (checksum ``link``), or None when its ids are
    too few to be worth one (or one stands twice: see :func:`snapshot_ids_file`)."""
    entries = snapshot["entries"]
    return snapshot_ids_file(link, entries) if 32 * len(entries) >= _IDS_WORTH else None


def _logged_header(path: str, file_bytes: bytes) -> bytes | None:
    """The header the log at ``path`` holds, as a header file's bytes, when it is not
    ``file_bytes``; None when they agree or the log says nothing sure (a log written before
    logs held the header, or one that does not read: its open judges it)."""
    try:
        head = read_prefix(path, HEADER_LIMIT + 4096)  # a FIFO or a link there is refused, never waited on
    except OSError:
        return None
    cut = head.find(b"\n")
    parsed = read_log(head[: cut + 1]).records if cut >= 0 else []
    if not parsed or parsed[0].op != "create" or not isinstance(parsed[0].get("header"), dict):
        return None
    if canonical_bytes(parsed[0].get("header")) + b"\n" == file_bytes:
        return None  # the common case: the file is the create record's header
    try:
        lr = read_log(read_dense(path), expand=False)
    except OSError:
        return None
    logged = header_of(lr.records)
    if lr.damage or logged is None:
        return None
    held = canonical_bytes(logged) + b"\n"
    return None if held == file_bytes else held


class FileSessions(SessionStore):
    """``sessions/`` of a store directory."""

    def __init__(self, backend: FileBackend):
        self.backend = backend
        self.root = backend.root

    # -- paths and holds ------------------------------------------------------------

    def dir(self, session_id: str) -> str:
        return os.path.join(self.root, "sessions", check_session_id(session_id))

    def lock(self, session_id: str) -> FileLock:
        """Take the session's writer lock now, or SessionLockedError."""
        locks = os.path.join(self.root, "locks")
        os.makedirs(locks, exist_ok=True)
        lock = FileLock(os.path.join(locks, check_session_id(session_id) + ".lock"), timeout=0)
        try:
            lock.acquire()
        except LockTimeout:
            raise SessionLockedError(f"session {session_id} is locked by another process") from None
        return lock

    # -- SessionStore -------------------------------------------------------------------

    def list(self) -> list[str]:
        return sorted(name for name, path in self._named_dirs() if os.path.exists(path + "/header"))

    def unlisted(self) -> Sequence[str]:
        """Session directories holding a session's files but no header file, which
        :meth:`list` leaves out (see the base class)."""
        out = []
        for name, path in self._named_dirs():
            try:
                present = os.listdir(path)
            except OSError:  # not a directory, or gone
                continue
            if "header" not in present and any(f in SESSION_FILES for f in present):
                out.append(name)
        return sorted(out)

    def _named_dirs(self) -> Iterator[tuple[str, str]]:
        """(name, path) of each entry of ``sessions/`` named as a session may be."""
        base = os.path.join(self.root, "sessions")
        try:
            names = os.listdir(base)
        except FileNotFoundError:
            return
        base += "/"
        for name in names:
            try:
                check_session_id(name)
            except AgentSessionError:
                continue
            yield name, base + name

    def header_lost(self, session_id: str) -> str | None:
        try:
            sdir = self.dir(session_id)
        except AgentSessionError:
            return None  # not an id: nothing is held under it
        return f"sessions/{session_id}/header" if _header_lost_at(sdir) else None

    def lost_headers(self) -> builtins.list[str]:
        return sorted(name for name, path in self._named_dirs() if _header_lost_at(path))

    def log_source(self, session_id: str) -> str:
        return f"sessions/{session_id}/log"

    def exists(self, session_id: str) -> bool:
        try:
            return os.path.exists(os.path.join(self.dir(session_id), "header"))
        except AgentSessionError:
            return False

    def header(self, session_id: str) -> bytes | None:
        """The header, from its file checked against the one the log holds: the file is
        an index of the log (which a damaged or stale file never overrides). The log's
        first line (its create record) is read to check it; only when they differ (a
        damaged file, or a header record written later) is the whole log read."""
        d = self.dir(session_id)
        try:
            raw = read_small(os.path.join(d, "header"), HEADER_LIMIT)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreError(f"session {session_id}: its header cannot be read: {exc.strerror or exc}") from None
        logged = _logged_header(os.path.join(d, "log"), raw)
        return raw if logged is None else logged

    def open(self, session_id: str, *, writable: bool) -> tuple[SessionLog, LogOpen]:
        log = FileSessionLog(self.backend, session_id)
        if writable:
            self.backend.require_writable()
            log.lock = self.lock(session_id)
        try:
            opened = log._open(writable)
        except BaseException:
            log._release()
            raise
        return log, opened

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
        """Write the whole session in ``tmp/``, then rename it into ``sessions/``."""
        self.backend.require_writable()
        lock = self.lock(session_id)
        stage = os.path.join(self.root, "tmp", f"{session_id}-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            if self.exists(session_id):
                raise SessionExistsError(f"session {session_id} already exists")
            os.makedirs(stage)
            try:
                staged = _with_header(records, header)
                log_bytes, last_line, compacted, written = _created_log(staged)
                files = {
                    "header": header,
                    "log": log_bytes,
                    "HEAD": ((head or "") + "\n").encode(),
                    "mark": (mark + "\n").encode(),
                }
                ids = _ids_file(last_line, written[1]) if written is not None else None
                if ids is not None:
                    files[IDS_FILE] = ids
                # The staged log comes first, the objects after it: a sweep running now
                # reads staged logs too, so it never takes these objects for garbage.
                for name, data in files.items():
                    with open(os.path.join(stage, name), "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                fsync_dir(stage)
                # A fork names a prefix it does not write: make it durable in objects/
                # (a prefix entry may so far be held only in its session's log) and touch
                # the files holding it, now that the staged log names the base, so a sweep
                # that read the logs before (while the origin was being deleted) keeps them;
                # one already gone refuses the fork rather than leave it without its prefix.
                if prefix:
                    self.backend.objects.secure_prefix(prefix)
                # Sized (an import's spill): streamed into one pack, never listed whole.
                self.backend.objects.put_many(objects, count=len(objects) if isinstance(objects, Sized) else None)
                target = self.dir(session_id)
                if os.path.exists(target):
                    raise SessionExistsError(f"session {session_id} already exists")
                os.rename(stage, target)
            except BaseException:
                import shutil  # (here and in delete: shutil brings bz2 and lzma, start-up head and list need not pay)

                shutil.rmtree(stage, ignore_errors=True)
                raise
            fsync_dir(os.path.join(self.root, "sessions"))
        except BaseException:
            lock.release()
            raise
        log = FileSessionLog(self.backend, session_id)
        log.lock = lock
        log.writable = True
        log._fd = os.open(os.path.join(log.dir, "log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if isinstance(records, CreatedRecords):
            log._max_seq = len(records.own)
        else:
            log._max_seq = max((r.seq for r in records if isinstance(r, Append)), default=0)
        log._head, log._mark = head, mark
        log._last = last_line
        log._compacted = compacted
        log.created_records = written
        if not compacted:  # (a log written compacted is read back by its first compaction)
            offsets, offset = [], 0
            for line in log_bytes.split(b"\n")[:-1]:  # (a record or payload holds no raw LF)
                offsets.append(offset)
                offset += len(line) + 1
            datas = [record_data(r) for r in staged]
            log._held_head = datas[:1]
            log._held = list(zip(datas[1:], offsets[1:], strict=True))
        return log

    def summary(self, session_id: str) -> tuple[dict[str, Any], bool] | None:
        """``summary``: one checksummed line (as a log record is) holding the domain's
        summary and the log's identity (inode, size, mtime) when it was written; current
        while the log is still that file at that size and time."""
        sdir = self.dir(session_id)
        kept = read_summary(sdir)
        if kept is None:
            return None
        data, ident = kept
        try:
            st = os.stat(sdir + "/log")
        except OSError:
            return data, False
        return data, ident == _identity(st)

    def size(self, session_id: str) -> int | None:
        """Bytes of the session's directory (header, log, indexes)."""
        total = 0
        try:
            with os.scandir(self.dir(session_id)) as it:
                for e in it:
                    try:
                        if e.is_file(follow_symlinks=False):
                            total += e.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            return None
        return total

    def history(self, session_id: str) -> LogHistory:
        """The log as the file holds it now: its good records (up to the first bad line,
        and a crash's tail after it), their lines and offsets, and what does not read."""
        path = os.path.join(self.dir(session_id), "log")
        try:  # HEAD before the log, so that it can lag what is read, never lead it (see _open)
            head_index: str | None = read_small(os.path.join(self.dir(session_id), "HEAD"), _SMALL).decode("ascii", "replace").strip()
        except OSError:
            head_index = None
        summary = kept_summary(self.dir(session_id))
        try:
            data = read_dense(path)
        except NotAFileError as exc:
            raise StoreError(f"session {session_id}: its log cannot be read: {exc}") from None
        except FileNotFoundError:
            if not self.exists(session_id):
                raise NoSuchSessionError(f"no such session: {session_id}") from None
            data = None
        lr = read_log(data or b"")
        records = lr.records + lr.cut_records
        out = LogHistory([r.data for r in records], [(r.line, r.offset) for r in records],
                         source=self.log_source(session_id))
        for d in lr.damage:
            out.damaged("log-damage", f"log line {d.line} (offset {d.offset}): {d.reason}", d.line, d.offset)
        if lr.cut is not None:
            out.tail = (
                f"log line {lr.cut.line}: {lr.cut.reason}: an uncommitted tail ({1 + len(lr.cut_records)} line(s)), "
                "a write in progress or a crash's loss that the next writing open drops"
            )
            out.tail_from = len(lr.records)
        out.head_index, out.summary = head_index, summary
        if data is None:
            out.damaged("missing-log", f"the log is missing ({out.source}): nothing says what the session holds")
        elif not data:
            out.damaged("log-damage", "the log is empty", 1, 0)
        elif not lr.records or lr.records[0].op != "create":
            if not lr.damage:
                out.damaged("log-damage", "the log does not begin with a create record", 1, 0)
        return out

    def history_since(self, session_id: str, start: int, resume: Any = None) -> LogTail:
        """Only the lines written after the point ``resume`` names (the log file's inode,
        the end of what was read, the records it held, the last line's checksum), while
        the file is the same one and they all read and chain on; else :meth:`history`
        (``whole``: a compaction, which rewrites the log as another file, comes here)."""
        path = os.path.join(self.dir(session_id), "log")
        if resume is not None and resume[2] == start:
            ino, offset, count, link = resume
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            except OSError:
                fd = -1
            if fd >= 0:
                try:
                    st = os.fstat(fd)
                    # A tail of more than a few megabytes (a sparse extension, a burst) is
                    # left to the whole read, which skips holes (fsutil.read_dense).
                    if stat.S_ISREG(st.st_mode) and st.st_ino == ino and offset <= st.st_size <= offset + _TAIL_LIMIT:
                        data = os.pread(fd, st.st_size - offset, offset) if st.st_size > offset else b""
                        tail = read_tail(data, link)
                        if tail is not None:
                            records, used, last = tail
                            return LogTail(records, count + len(records), (ino, offset + used, count + len(records), last),
                                           whole=False, objects=_payloads(data[:used]))
                finally:
                    os.close(fd)
        try:
            before = os.stat(path)
        except OSError:
            before = None
        history = self.history(session_id)
        note = None
        if before is not None and history.tail is None and not history.damage and history.positions:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
                try:
                    after = os.fstat(fd)
                    offset = history.positions[-1][1]
                    assert offset is not None  # (a file's lines have offsets)
                    last = os.pread(fd, CHECKSUM_HEX, offset).decode("ascii", "replace")
                finally:
                    os.close(fd)
            except OSError:
                after = None
            if after is not None and (after.st_ino, after.st_size) == (before.st_ino, before.st_size):
                note = (after.st_ino, after.st_size, len(history.records), last)
        return LogTail(history.records[start:], len(history.records), note)

    def delete(self, session_id: str, log: SessionLog | None = None) -> None:
        """Rename the session away (one step), then remove its files."""
        self.backend.require_writable()
        if log is not None:
            assert isinstance(log, FileSessionLog)
            lock = log._release_for_delete()
        else:
            if not self.exists(session_id):
                raise NoSuchSessionError(f"no such session: {session_id}")
            lock = self.lock(session_id)
        try:
            trash_dir = os.path.join(self.root, "trash")
            os.makedirs(trash_dir, exist_ok=True)
            trash = os.path.join(trash_dir, f"{session_id}-{time.time_ns()}")
            os.rename(self.dir(session_id), trash)
            fsync_dir(os.path.join(self.root, "sessions"))
            import shutil

            shutil.rmtree(trash, ignore_errors=True)
        finally:
            lock.release()


def _payloads(lines: bytes) -> dict[str, tuple[bytes, bytes]]:
    """The payloads (content, envelope) of the append lines of ``lines`` (whole lines that
    read: a record is canonical JSON, so a tab on a line sets its payload off), by entry."""
    out: dict[str, tuple[bytes, bytes]] = {}
    if b"\t" not in lines:
        return out
    for raw in lines.split(b"\n"):
        parts = raw.split(b"\t")
        if len(parts) == 3 and (m := _ENTRY_IN_RECORD.search(parts[0])) is not None:
            out[m.group(1).decode("ascii")] = (parts[1], parts[2])
    return out


class FileSessionLog(SessionLog):
    """One session's ``log`` file, open for appending (locked) or read as a snapshot."""

    def __init__(self, backend: FileBackend, session_id: str):
        self.backend = backend
        self.session_id = session_id
        self.dir = backend.sessions.dir(session_id)
        self.writable = False
        self.lock: FileLock | None = None
        self.stopped: str | None = None  # why writes stopped (a failed fsync), if they did
        self._fd: int | None = None
        self._size: int | None = None  # the log's length as this writer left it
        self._uncommitted = False
        self._max_seq = 0
        self._head: str | None = None
        self._mark: str | None = None
        self._since_checkpoint = 0
        # Appends written since the last checkpoint record whose objects were durable in
        # objects/ before them (an exchange's, an import's): no checkpoint writes them, but
        # one must say so in the log before compaction may fold them.
        self._durable_since_checkpoint = False
        # Appends whose objects are only in the log so far: id -> (content hash, content, envelope).
        self.unmaterialized: dict[str, tuple[str, bytes, bytes]] = {}
        # A snapshot's appends whose objects recovery would restore: id -> (content, envelope).
        self.payloads: dict[str, tuple[bytes, bytes]] = {}
        # The checkpoint on the worker thread: (future, entry ids, last seq covered).
        self._inflight: tuple[Future, list[str], int] | None = None
        self._closed = False
        self._identity: tuple[tuple[int, int, int, int], ...] | None = None
        self._recovery: tuple[bytes | None, list[Any]] | None = None
        #: Where the log's records after its snapshot begin (0: it has none): what
        #: compaction would replace lies after it.
        self._compacted = 0
        #: The log's length up to the last commit point this writer wrote (0: none yet).
        #: Compaction replaces only committed records, so until this moves past what
        #: the last compaction (or attempt) looked at there is nothing new to fold.
        self._committed_to = 0
        #: ``_committed_to`` when compaction last looked and found nothing to fold.
        self._compact_looked = 0
        #: What this writer knows the log holds, so compaction need not read it back: the
        #: records before ``_compacted`` (create, and a snapshot), and each record after
        #: them with its offset. None when not known (a recovery rewrote the log, or a
        #: record was written without its data): compaction then reads the file.
        self._held_head: list[dict[str, Any]] | None = None
        self._held: list[tuple[Any, ...]] | None = None  # (see _held_item)
        #: Registered with the object store as holding objects not yet there (see write).
        self._registered = False
        #: The checksum of the log's last line, which the next line links to.
        self._last = ZERO_LINK
        #: The header the log holds, when the header file says otherwise (rewritten at recovery).
        self._header_fix: bytes | None = None
        #: The summary the domain handed over, written when the log is let go.
        self._summary: dict[str, Any] | None = None
        #: The rules' state the domain handed over, written with the summary.
        self._rule_state: dict[str, Any] | None = None

    # -- opening and recovery -------------------------------------------------------------

    def _open(self, writable: bool) -> LogOpen:
        """Read the header and the log, recover (writable) or look as recovery would
        (a snapshot), and say what the indexes hold."""
        sid = self.session_id
        try:
            header = read_small(os.path.join(self.dir, "header"), HEADER_LIMIT)
        except (FileNotFoundError, NotADirectoryError):
            raise NoSuchSessionError(f"no such session: {sid}") from None
        except OSError as exc:
            raise StoreError(f"session {sid}: its header cannot be read: {exc.strerror or exc}") from None
        # The indexes before the log: a writer rewrites HEAD only after the log holds what it
        # names, so read in this order HEAD can lag what is read of the log, never lead it
        # (read after, a snapshot beside a live writer saw a head "the log does not hold").
        head_index, mark_index = self._read_indexes()
        summary = kept_summary(self.dir)
        try:
            data = read_dense(os.path.join(self.dir, "log"))  # a FIFO, device or link there is refused, never waited on; holes are not read
        except FileNotFoundError:
            if not os.path.lexists(os.path.join(self.dir, "header")):
                # Deleted since its header was read (a delete renames the directory away):
                # gone, not damaged (a log lost beside its header is the damage below).
                raise NoSuchSessionError(f"no such session: {sid}") from None
            data = b""
        except OSError as exc:
            raise StoreError(f"session {sid}: its log cannot be read: {exc.strerror or exc}") from None
        logread = read_log(data, expand=False, known=self._snapshot_ids(data))
        if logread.damage:
            first = logread.damage[0]
            raise SessionDamagedError(
                f"log line {first.line} (offset {first.offset}): {first.reason}",
                session=sid, line=first.line, offset=first.offset, path=self.backend.sessions.log_source(sid),
            )
        records = logread.records
        if not records or records[0].op != "create":
            # Every log opens with its create record, written durably with the session;
            # without it nothing says what the session holds: damage, not an empty session.
            what = "is missing or empty" if not data else "does not open with its create record"
            raise SessionDamagedError(f"its log {what}", session=sid, line=1, offset=0,
                                      path=self.backend.sessions.log_source(sid))
        logged = header_of(records)
        if logged is not None:
            held = canonical_bytes(logged) + b"\n"
            if held != header:
                self._header_fix = held
                header = held
        if len(records) > 1 and records[1].op == "snapshot":
            self._compacted = records[2].offset if len(records) > 2 else logread.sound_bytes
        cut_at = len(records)
        last_commit = max((i for i, r in enumerate(records) if r.op in COMMIT_POINTS), default=-1)
        if last_commit >= 0:
            after = last_commit + 1
            self._committed_to = records[after].offset if after < len(records) else logread.sound_bytes
        if writable and logread.cut is None:
            k = 2 if len(records) > 1 and records[1].op == "snapshot" else 1
            self._held_head = [r.data for r in records[:k]]
            self._held = [(r.data, r.offset) for r in records[k:]]  # (what _held_item keeps of a dict)
        # Uncommitted appends whose objects a crash took or tore are lost, with all after them.
        objects = self.backend.objects
        for i in range(last_commit + 1, len(records)):
            r = records[i]
            if r.op == "append":
                entry = r.get("entry")
                if not objects.entry_sound(entry) and not (r.payload and payload_entry(entry, r.payload)):
                    cut_at = i
                    break
        kept = records[:cut_at]
        dropped = records[cut_at:] + logread.cut_records
        # Appends since the last checkpoint have their objects only in the log for
        # sure; after a crash, any the disk lacks are restored from their payloads.
        covered = checkpoint_covers((r.op, r.get("seq")) for r in kept)
        since_checkpoint = [
            r for r in kept
            if r.op == "append" and r.payload is not None
            and not (isinstance(r.get("seq"), int) and r.get("seq") <= covered)
        ]
        to_restore = []
        for r in since_checkpoint:
            if not objects.entry_sound(r.get("entry")):
                if payload_entry(r.get("entry"), r.payload) is None:  # type: ignore[arg-type]
                    raise SessionDamagedError(
                        f"log line {r.line} carries a payload that does not hash to entry {r.get('entry')}",
                        session=sid, line=r.line, offset=r.offset, path=self.backend.sessions.log_source(sid),
                    )
                to_restore.append(r)
        lost = [r for r in dropped if r.op == "append"]
        max_seq = 0
        for r in records + logread.cut_records:
            seq = r.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool):
                max_seq = max(max_seq, seq)
        rel = f"sessions/{sid}"
        recovered: list[FsckProblem] = []
        if self._header_fix is not None:
            recovered.append(FsckProblem(
                "note", "stale-header", f"session {sid}: its header file differs from the header its log holds; the "
                "log's is used" + (" and the file rewritten" if writable else ""), session=sid, file=f"{rel}/header"))
            if not writable:
                self._header_fix = None
        losses: list[dict[str, Any]] = [{"op": "loss", "entry": r.get("entry"), "seq": r.get("seq")} for r in lost]
        torn_append = False
        if logread.cut is not None:
            # The cut line itself is no record; name what can be read of it.
            cut = logread.cut
            end = data.find(b"\n", cut.offset)
            torn = data[cut.offset : end if end >= 0 else len(data)]
            m = _ENTRY_IN_RECORD.search(torn)
            loss: dict[str, Any] = {
                "op": "loss", "entry": m.group(1).decode() if m else None,
                "line": cut.line, "offset": cut.offset, "reason": cut.reason,
            }
            torn_append = m is not None
            if m or (writable and _may_be_append(torn)):
                # An append's sequence number is spent even when its line was torn (a lazy
                # append was acknowledged with it): read it from the bytes, or take the
                # next one, never reusing it. A writer, which gives the next numbers out,
                # spends one for a line too torn to say it was no append too (a reader's
                # would only hide a kept summary's number from index_damage).
                sq = _SEQ_IN_RECORD.search(torn) if m else None
                loss["seq"] = int(sq.group(1)) if sq else max_seq + 1
                max_seq = max(max_seq, loss["seq"])
            losses.insert(0, loss)
        self._max_seq = max_seq
        if lost or logread.cut:
            recovered.append(FsckProblem(  # (fsck's codes: an append whose objects are gone, else a torn tail)
                "note", "dropped-on-open" if lost else "log-tail", f"recovered session {sid}: dropped "
                f"{len(lost) + torn_append} uncommitted append(s) after the last commit"
                + (f", from a torn line {logread.cut.line} on" if logread.cut else ""),
                session=sid, file=f"{rel}/log", line=logread.cut.line if logread.cut else None))
        if to_restore:
            recovered.append(FsckProblem(
                "note", "in-log-only",
                f"recovered session {sid}: restored the objects of {len(to_restore)} append(s) from the log"
                if writable
                else f"session {sid}: {len(to_restore)} append(s) not yet in objects/ are read from the log",
                session=sid, file=f"{rel}/log"))
        out_records = [r.data for r in kept]
        if not writable:
            for r in to_restore:
                self.payloads[r.get("entry")] = r.payload  # type: ignore[assignment]
            if self.payloads:
                objects.register(self)
            if losses or cut_at < len(records):
                out_records = out_records + losses + [{"op": "commit"}]
            return LogOpen(header, out_records, head_index, mark_index, recovered, summary)
        self.writable = True
        # A checkpoint record needs no commit (lost, it only makes recovery check the
        # objects again): a log whose tail after the last commit holds only checkpoints
        # is clean and is not rewritten.
        adopted = [r for r in kept[last_commit + 1 :] if r.op == "append"]
        uncommitted_tail = any(r.op != "checkpoint" for r in kept[last_commit + 1 :])
        rewrite = None
        self._last = records[-1].checksum
        if logread.cut or lost or cut_at < len(records) or adopted or uncommitted_tail:
            bodies = [record_body(r.data, r.payload) for r in kept]
            bodies.extend(record_body(x) for x in losses)
            bodies.append(_COMMIT)
            rewrite, self._last = chain(bodies)
            out_records = out_records + losses + [{"op": "commit"}]
        # Nothing is written yet: the domain checks the log first (recover() writes).
        self._recovery = (rewrite, since_checkpoint)
        return LogOpen(header, out_records, head_index, mark_index, recovered, summary,
                       _read_rule_state(self.dir))

    def recover(self) -> None:
        """Apply what opening found a crash left, now that the domain found the log sound:
        the log rewritten (uncommitted working state adopted, or dropped with ``loss``
        records, then a commit), and the checkpoint the last writer did not reach."""
        if not self.writable or self._recovery is None:
            return
        rewrite, since_checkpoint = self._recovery
        self._recovery = None
        if self._header_fix is not None:
            write_atomic(os.path.join(self.dir, "header"), self._header_fix, durable=True)
            self._header_fix = None
        if rewrite is not None:
            write_atomic(os.path.join(self.dir, "log"), rewrite, durable=True)
            self._committed_to = len(rewrite)  # it ends with a commit
            self._held = None  # compaction reads what recovery wrote
        self._fd = os.open(os.path.join(self.dir, "log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if since_checkpoint:
            # Finish the checkpoint the last writer did not reach: every object since
            # it written (where missing or torn) and fsynced, then the record.
            for r in since_checkpoint:
                content, env_bytes = r.payload
                self.unmaterialized[r.get("entry")] = (sha256_ref(content), content, env_bytes)
            self.backend.objects.register(self)
            self._checkpoint()

    def set_summary(self, summary: Mapping[str, Any]) -> None:
        if self.writable and not self._closed:
            self._summary = dict(summary)

    def keep_summary(self, summary: Mapping[str, Any]) -> None:
        """Written now, with the log's identity now, where nothing is uncommitted (a summary
        of records a crash may take back must not pass for the log's)."""
        if self.writable and not self._closed and not self._uncommitted:
            self._summary = dict(summary)
            try:
                self._write_summary()
            except OSError:
                pass  # an index: the one written at close, or a reader, makes it again

    def set_rule_state(self, state: Mapping[str, Any]) -> None:
        if self.writable and not self._closed:
            self._rule_state = dict(state)

    def kept_rule_state(self) -> dict[str, Any] | None:
        return _read_rule_state(self.dir)

    def _write_rule_state(self) -> None:
        """The rules' state handed over, in ``rules`` (written atomically, not fsynced: an
        index the domain checks against the log, rebuilt when lost or stale)."""
        if self._rule_state is None or self._fd is None or self.stopped:
            return
        state, self._rule_state = self._rule_state, None
        try:
            body = canonical_bytes(state)
        except (ValueError, AgentSessionError):
            return
        write_atomic(os.path.join(self.dir, "rules"), checksummed_line(body), durable=False)

    def _write_summary(self) -> None:
        """The summary handed over, with the log's identity as the writer leaves it (after
        any compaction): written atomically, not fsynced (an index; lost, it is rebuilt)."""
        if self._summary is None or self._fd is None or self.stopped:
            return
        summary, self._summary = self._summary, None
        try:
            body = canonical_bytes({"log": _identity(os.fstat(self._fd)), "summary": summary})
        except (ValueError, AgentSessionError):
            return  # a summary the domain made that is no I-JSON: none is kept, list rebuilds it
        write_atomic(os.path.join(self.dir, "summary"), checksummed_line(body), durable=False)

    def _read_indexes(self) -> tuple[str | None, str | None]:
        out: list[str | None] = []
        for name in ("HEAD", "mark"):
            try:
                text = read_small(os.path.join(self.dir, name), _SMALL).decode("ascii", "replace").strip()
            except OSError:
                text = None
            out.append(text)
        return out[0], out[1]

    # -- objects held here ---------------------------------------------------------------

    def pending_object(self, space: Space, name: str) -> bytes | None:
        """An object this log alone holds so far (not yet in objects/), or None."""
        if space == "entries":
            held = self.unmaterialized.get(name)
            if held is not None:
                return held[2]
            payload = self.payloads.get(name)
            return payload[1] if payload is not None else None
        if space == "contents":
            for chash, content, _ in self.unmaterialized.values():
                if chash == name:
                    return content
            for content, _ in self.payloads.values():
                if sha256_ref(content) == name:
                    return content
        return None

    # -- writing ----------------------------------------------------------------------

    def _refuse_if_stopped(self) -> None:
        if self.stopped:
            raise StoreError(
                f"session {self.session_id} stopped writing ({self.stopped}); "
                "reopen it to recover from what the disk holds"
            )

    def write(self, records: Sequence[Record], *, commit: bool) -> str | None:
        """Write records (and a commit record and an fsync with ``commit``). Returns a
        note when the write was accepted but the checkpoint it triggered failed (the
        log stops taking writes: reopen to recover)."""
        if self._closed or not self.writable or self.stopped:
            self._check_open()  # (which says why)
        if not commit and len(records) == 1 and records[0].__class__ is Append:
            return self._write_append(records[0])
        bodies = [_encode(r) for r in records]
        datas = records
        if commit:
            bodies.append(_COMMIT)
            datas = [*records, {"op": "commit"}]
        self._write_log(bodies, sync=commit, datas=datas)
        self._uncommitted = not commit
        if commit:
            self._committed_to = self._size or 0
        for r in records:
            if isinstance(r, Append):
                self._took(r)
            elif isinstance(r.get("seq"), int):
                self._max_seq = max(self._max_seq, r["seq"])
        return self._after_write()

    def _write_append(self, r: Append) -> str | None:
        """One append not committed, the write of a lazy append: what :meth:`write` does
        for it, in the fewest steps (its line framed on its own: no list of bodies, no
        chain loop, no list of records to keep)."""
        objects = r.objects
        body = append_body(r.seq, r.entry, r.head, r.head_moved, r.leaf_label, r.lazy, None if objects is None else objects[1:])
        line, link = chain_one(body, self._last.encode("ascii"))
        size = self._put(line, sync=False)
        self._last = link.decode("ascii")
        if self._held is not None:
            self._held.append(_held_item(r, size))
        self._uncommitted = True
        self._took(r)
        return self._after_write()

    def _took(self, r: Append) -> None:
        """An append just written: its number, and its objects held here until a checkpoint."""
        if r.seq > self._max_seq:
            self._max_seq = r.seq
        if r.objects is not None:
            self.unmaterialized[r.entry] = r.objects
            self._since_checkpoint += 1
        else:
            self._durable_since_checkpoint = True

    def _after_write(self) -> str | None:
        """After a write: the log registered with the object store while it holds objects
        not yet there, and the checkpoint due every :data:`CHECKPOINT_ENTRIES` appends
        started. A note when that checkpoint failed (the log stops taking writes)."""
        if not self._registered and self.unmaterialized:
            self.backend.objects.register(self)
            self._registered = True
        if self._since_checkpoint >= CHECKPOINT_ENTRIES:
            try:
                self._checkpoint(wait=False)
            except OSError as exc:
                # The write was accepted at its records and stays so; the log now
                # refuses writes until reopened, and the caller is told.
                self.stopped = self.stopped or str(exc)
                return f"accepted, but the checkpoint after it failed ({exc}); the session stopped writing"
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"session {self.session_id} is closed")
        if not self.writable:
            raise StoreError(f"session {self.session_id} is open read-only")
        self._refuse_if_stopped()

    def _write_log(self, bodies: Sequence[bytes], *, sync: bool, datas: Sequence[Record]) -> None:
        """Records' bytes as chained lines after the log's last, written whole or not at
        all; ``datas`` are the records as a reader of the lines would parse them (without
        payloads), kept for compaction."""
        data, last = chain(bodies, self._last)
        size = self._put(data, sync=sync)
        self._last = last
        held = self._held
        if held is not None:
            offset = size
            for body, record in zip(bodies, datas, strict=True):
                held.append(_held_item(record, offset))
                offset += len(body) + LINE_OVERHEAD

    def _put(self, data: bytes, *, sync: bool) -> int:
        """Lines onto the log's end, whole or not at all (and fsynced with ``sync``):
        where they begin. A failure leaves no partial line behind (the caller's write
        is not accepted); a failed fsync stops the log's writes."""
        assert self._fd is not None
        size = self._size
        if size is None:
            size = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write to the log of session {self.session_id}")
            if sync:
                try:
                    os.fsync(self._fd)
                except OSError as exc:
                    # Pages a failed fsync covered may never reach the disk and a later
                    # fsync can succeed without them: write nothing more until reopened.
                    self.stopped = f"an fsync failed: {exc}"
                    raise
        except BaseException:
            try:
                os.ftruncate(self._fd, size)
            except OSError as exc:
                # A partial line may stay at the end: anything written after it would
                # follow torn bytes (the log would not read past them). Stop as after a
                # failed fsync: the next open recovers from what the file holds.
                self._size = None
                self.stopped = self.stopped or f"a failed write could not be taken back ({exc.strerror or exc})"
            raise
        self._size = size + len(data)
        return size

    def commit(self) -> None:
        if not self.writable or self._closed:
            return
        self._refuse_if_stopped()
        if not self._uncommitted:
            return
        self._write_log([_COMMIT], sync=True, datas=[{"op": "commit"}])
        self._uncommitted = False
        self._committed_to = self._size or 0

    def set_indexes(self, head: str | None, mark: Mark) -> None:
        """HEAD and mark, rewritten without fsync (the log is the record; the domain
        checks them against it) and only when they differ from what they should say.

        They are written after the log is committed, so a device that refuses them
        (full, or made read-only) must not turn a committed write into a failure (a
        retry would record it twice): an index may lag the log, and the next writing
        open or close sets it from the log."""
        if not self.writable or self._closed or self.stopped:
            return
        for name, text, last in (("HEAD", (head or "") + "\n", self._head), ("mark", mark + "\n", self._mark)):
            value = text[:-1]
            if value == last:
                continue
            path = os.path.join(self.dir, name)
            data = text.encode()
            try:
                same = read_small(path, _SMALL) == data
            except OSError:
                same = False
            if not same:
                try:
                    write_atomic(path, data, durable=False)
                except OSError:
                    continue  # lags the log, as after a crash; tried again at the next write
            if name == "HEAD":
                self._head = value or None
            else:
                self._mark = value

    def set_header(self, header: bytes) -> None:
        """The new header into the log first (a ``header`` record, committed: the log is
        the record), then its file."""
        self._check_open()
        record = {"op": "header", "header": loads(header)}
        self._write_log([record_body(record), _COMMIT], sync=True, datas=[record, {"op": "commit"}])
        self._uncommitted = False
        self._committed_to = self._size or 0
        write_atomic(os.path.join(self.dir, "header"), header, durable=True)

    # -- checkpoints ------------------------------------------------------------------------

    def checkpoint(self) -> None:
        if self.writable and not self._closed:
            self._checkpoint()

    def _checkpoint(self, *, wait: bool = True) -> None:
        """Write the objects of the appends since the last checkpoint to objects/, make
        them durable, then say so in the log with a ``checkpoint`` record naming the
        last sequence number covered. The record needs no fsync of its own: lost, it
        only makes recovery check (and if need be restore) those objects again.

        With ``wait=False`` (the checkpoint an append triggers) the pack is compressed,
        written and fsynced on a worker thread while appends go on, and the log is
        flushed there too so a later commit finds little left to write; the record is
        written at the next checkpoint, commit point or close, once the work is known
        done. Until then the objects stay in memory here (and in the log's payloads for
        other processes). At most one such checkpoint is in flight per session."""
        self._refuse_if_stopped()
        # A checkpoint that waits and has objects of its own after the one in flight
        # compacts once, after its own: a fold after each would read the log's records
        # twice (at close, after a stream of lazy appends, nearly all of them).
        inflight = self._inflight
        more = wait and inflight is not None and len(self.unmaterialized) > len(inflight[1])
        self._finish_checkpoint(compact=not more)
        if not self.unmaterialized:
            if self._durable_since_checkpoint:  # (none in flight: finished above)
                # Only appends whose objects were durable before them came since the last
                # checkpoint record: one naming them lets compaction fold them (a session
                # that takes its entries by push would otherwise never be compacted, and
                # every close would read its whole log to find nothing to fold).
                self._checkpoint_done([], self._max_seq)
            return
        items: list[tuple[Space, str, bytes]] = []
        for entry_id, (chash, content, env) in self.unmaterialized.items():
            items.append(("contents", chash, content))
            items.append(("entries", entry_id, env))
        ids, seq = list(self.unmaterialized), self._max_seq
        self._since_checkpoint = 0  # this checkpoint takes every append so far
        if wait:
            try:
                self.backend.objects.put_many(items, dedup=False)
            except OSError as exc:
                self.stopped = f"a checkpoint failed: {exc}"
                raise
            self._checkpoint_done(ids, seq)
            return
        self._inflight = (_checkpoint_pool().submit(self._materialize, items), ids, seq)

    def _materialize(self, items: list[tuple[Space, str, bytes]]) -> None:
        """The worker thread's share of a checkpoint: the pack, then writeback of the
        log's pages started (not waited for), so a later commit finds little to write."""
        self.backend.objects.put_many(items, dedup=False)
        fd = self._fd
        if fd is not None:
            start_writeback(fd)

    def _finish_checkpoint(self, *, compact: bool = True) -> None:
        """Wait for the checkpoint in flight, if any, and record it (then compact, unless
        ``compact`` is False); a failure there (a failed write or fsync) stops the log's
        writes, as a failed fsync does."""
        if self._inflight is None:
            return
        job, ids, seq = self._inflight
        self._inflight = None
        try:
            job.result()
        except OSError as exc:
            self.stopped = self.stopped or str(exc)
            raise
        self._checkpoint_done(ids, seq, compact=compact)

    def _checkpoint_done(self, ids: list[str], seq: int, *, compact: bool = True) -> None:
        if seq >= self._max_seq:
            self._durable_since_checkpoint = False
        record = {"op": "checkpoint", "seq": seq}
        self._write_log([record_body(record)], sync=False, datas=[record])
        for entry_id in ids:
            self.unmaterialized.pop(entry_id, None)
        if compact:
            self._compact(final=False)

    # -- compaction -----------------------------------------------------------------------

    def _snapshot_ids(self, data: bytes) -> SnapshotIds | None:
        """The ``ids`` side file of a compacted log, when it reads (its snapshot line's
        checksum decides whether it is that line's: a stale one is not used)."""
        if len(data) < _IDS_WORTH or not data.startswith(b'{"entries":"', data.find(b"\n") + 2 * CHECKSUM_HEX + 3):
            return None  # (no snapshot line, or a small one: nothing to read beside the log)
        try:
            return read_snapshot_ids(read_small(os.path.join(self.dir, IDS_FILE), _RULES_MAX))
        except OSError:
            return None

    def _write_snapshot_ids(self, link: str, snapshot: Mapping[str, Any]) -> None:
        """The snapshot's ids beside the log, raw (an index, as ``rules``: written
        atomically, not fsynced; lost or stale, an open decodes the log's base64)."""
        path = os.path.join(self.dir, IDS_FILE)
        data = _ids_file(link, snapshot)
        try:
            if data is not None:
                write_atomic(path, data, durable=False)
            else:
                os.unlink(path)
        except OSError:
            pass  # (an index: the log's own base64 stands in for it)

    def _compact(self, *, final: bool) -> None:
        """Rewrite the log with one ``snapshot`` record in place of every record a commit
        and a checkpoint both cover, so the log stops carrying a second copy of objects
        that objects/ holds durably and an open reads one line for them.

        The new log (create, snapshot, then the records after them as they were, payloads
        included) is written whole, fsynced and renamed over the old one: a crash leaves
        one or the other, each the same session. Done at close once the log grew by
        :data:`COMPACT_AT_CLOSE`, and while writing once it grew by both
        :data:`COMPACT_WHILE_WRITING` and the size of its last snapshot."""
        if self._fd is None or self.stopped or self._inflight is not None or self._closed:
            return
        # Only committed records fold, so the growth that counts is the committed part's:
        # while writing, since the last compaction or the last look that found nothing to
        # fold (a stream of lazy appends commits nothing, and reading the log at each
        # checkpoint to learn that costs a whole read each time); at close, since the last
        # compaction (the close's checkpoint may have covered what a look found uncovered).
        if final:
            if self._committed_to - self._compacted < COMPACT_AT_CLOSE:
                return
        elif self._committed_to - max(self._compacted, self._compact_looked) < max(COMPACT_WHILE_WRITING, self._compacted):
            return
        self._compact_looked = self._committed_to
        path = os.path.join(self.dir, "log")
        size = self._size if self._size is not None else os.fstat(self._fd).st_size
        # Each record as its members, or an append this writer holds as a row (see
        # _held_item), with the offset of its line.
        forms: list[dict[str, Any] | AppendRow]
        if self._held is not None and self._held_head is not None:
            # What this writer wrote and read is known: no need to read the log back, nor
            # to make an object of each append held (100,000 of them at a long session's close).
            held = self._held
            forms = [*self._held_head, *[h[0] if len(h) == 2 else h for h in held]]
            offsets = [0] * len(self._held_head) + [h[-1] for h in held]
        else:
            logread = read_log(read_dense(path), expand=False)
            if logread.damage or logread.cut:
                return  # what the next open must judge is never rewritten here
            forms = [r.data for r in logread.records]
            offsets = [r.offset for r in logread.records]
            size = logread.size
        ops = [r["op"] if isinstance(r, dict) else "append" for r in forms]
        seqs = [r.get("seq") if isinstance(r, dict) else r[0] for r in forms]
        if len(forms) < 2 or ops[0] != "create":
            return
        covered = checkpoint_covers(zip(ops, seqs))
        # the last commit point, looked for from the end (the first record is one: create)
        last_commit = next(i for i in range(len(ops) - 1, -1, -1) if ops[i] in COMMIT_POINTS)
        end = last_commit + 1
        for i in range(1, last_commit + 1):
            seq = seqs[i]
            if ops[i] == "append" and not (isinstance(seq, int) and seq <= covered):
                end = i
                break
        if end == last_commit + 1:
            # A checkpoint record needs no commit: one right after the last commit folds in too.
            while end < len(ops) and ops[end] == "checkpoint":
                end += 1
        if end <= 1 or (end == 2 and ops[1] == "snapshot"):
            return
        # The records after the fold are copied as their lines hold them, payloads included,
        # each line's checksum checked on the way (nothing damaged is copied).
        start = offsets[end] if end < len(forms) else size
        with open(path, "rb") as f:
            f.seek(start)
            tail_bodies = line_bodies(f.read(size - start))
        if tail_bodies is None or len(tail_bodies) != len(forms) - end:
            self._held = None  # the file is not what this writer knows: the next look reads it
            return
        create = forms[0]
        assert isinstance(create, dict)
        snapshot = with_digests(make_snapshot(create, forms[1:end]))
        head_lines, link = chain([record_body(create), record_body(snapshot)])
        tail, last = chain(tail_bodies, link)
        try:
            write_atomic(path, head_lines + tail, durable=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            # The old log stays whole (the rename is the switch): nothing was lost, but
            # whether the new one reached the disk is unknown, so stop as after a failed fsync.
            self.stopped = self.stopped or str(exc)
            raise
        os.close(self._fd)
        self._fd = fd
        self._write_snapshot_ids(link, snapshot)
        self._last = last
        self._size = len(head_lines) + len(tail)
        self._compacted = len(head_lines)
        # Where the last commit point now lies: the records after it were copied as they were.
        self._committed_to = self._compact_looked = max(self._compacted, self._size - (size - self._committed_to))
        self._held_head = [create, snapshot]
        self._held = []
        offset = self._compacted
        for r, body in zip(forms[end:], tail_bodies, strict=True):
            self._held.append((r, offset) if isinstance(r, dict) else (*r[:-1], offset))
            offset += len(body) + LINE_OVERHEAD

    # -- closing, parking -----------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self.writable and not self.stopped and self._fd is not None and not self.unmaterialized:
                self._finish_checkpoint()
                if not self._uncommitted:
                    self._compact(final=True)
                    self._write_summary()
                    self._write_rule_state()
        except OSError:
            pass  # the log is whole as it was (the rename is the switch); the next close tries again
        finally:
            self._closed = True
            self._release()

    def _release(self) -> None:
        if self._inflight is not None:
            # A stopped log still lets its worker finish before the descriptor goes
            # (it may be flushing it); the outcome no longer matters.
            try:
                self._inflight[0].result()
            except Exception:
                pass
            self._inflight = None
        self._let_go()
        self.backend.objects.unregister(self)
        self._registered = False

    def _let_go(self) -> None:
        """Close the log's descriptor and release the session's lock."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _release_for_delete(self) -> FileLock:
        """Close keeping the lock for the caller (delete). Objects the log alone holds are
        written to objects/ first: deleting a session removes its ref, never objects
        another session may come to need."""
        if self.writable and not self._closed and not self.stopped:
            self._checkpoint()
        lock = self.lock
        self.lock = None
        self.close()
        assert lock is not None
        return lock

    def _file_identity(self) -> tuple[tuple[int, int, int, int], ...]:
        out = []
        for name in ("log", "header"):
            st = os.stat(os.path.join(self.dir, name))
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def park(self) -> bool:
        if not self.writable or self._closed or self.stopped:
            return False
        self.commit()
        self._checkpoint()
        self._compact(final=True)
        self._identity = self._file_identity()
        self._let_go()
        return True

    def resume(self) -> bool:
        if self._closed or self.stopped or not self.writable or self._identity is None:
            return False
        lock = self.backend.sessions.lock(self.session_id)
        try:
            same = self._file_identity() == self._identity
        except OSError:
            same = False
        if not same:
            lock.release()
            return False
        self.lock = lock
        self._fd = os.open(os.path.join(self.dir, "log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = None  # asked of the file at the next write
        self._identity = None
        return True


