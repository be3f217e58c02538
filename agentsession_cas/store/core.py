"""The store: content-addressed objects, and sessions as refs whose logs are their commit point.

A :class:`Store` is a directory (``docs/storage-format.md`` lays it out
byte by byte). A :class:`Session` is a header, a base, a head, a record
mark and a log; its log (:mod:`.log`) is its write-ahead log and its only
record, and ``HEAD`` and ``mark`` are indexes rebuilt from it.

An append is one log record that carries the entry's two objects; it is
visible once the record is written, and a commit (a ``commit`` record and
one fsync of the log) makes it durable. Objects reach ``objects/`` at
checkpoints, in batches; until then the log is where they are held. Recovery, on open, reads that one session's log: a torn or
unwritten tail after the last commit is the loss of uncommitted working
state (dropped, and a ``loss`` record written); anything else that fails
its checksum is damage, and the session refuses writes until repaired.

One process writes a session at a time, holding ``locks/<id>.lock``; a
read-only store takes no lock and writes nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import filelock

from ..backends.files.fsutil import fsync_dir, start_writeback, write_atomic
from ..backends.files.log import LogRead, Record, encode_append, encode_record, read_log
from ..backends.files.objects import AUTO_PACK_LOOSE, ObjectStore, RepackResult
from ..errors import (
    AgentSessionError,
    AppendRefusedError,
    CorruptObjectError,
    EntryError,
    HeadMovedError,
    IJSONError,
    LayoutError,
    MirrorError,
    NoSuchEntryError,
    NoSuchObjectError,
    NoSuchSessionError,
    ReadOnlyError,
    SessionDamagedError,
    SessionExistsError,
    SessionFormatError,
    SessionLockedError,
    StoreError,
    TimestampError,
)
from ..format.canonical import canonical_bytes, loads, loads_flagged
from ..format.context import ContextHasher
from ..format.entry import FORMAT_WRITTEN, LEAF_LABEL, Entry, Header, make_entry, parse_format, short_id
from ..format.hashing import entry_objects, is_hash, parse_envelope, sha256_ref
from ..format.names import check_session_id
from ..format.reader import CORE_TYPES, SessionFile, gc_paused, read_session, read_session_bytes
from ..format.timestamps import check_ts, now_ts
from ..format.tree import Tree

__all__ = [
    "LAYOUT",
    "OLDER_LAYOUTS",
    "SYNC_POLICIES",
    "DEFAULT_STORE",
    "AppendResult",
    "Store",
    "Session",
    "default_store_path",
]

#: The layout this release writes and reads, as the ``layout`` file spells it.
LAYOUT = "agentsession-cas 2"
#: Earlier layouts this release reads as they are. A writable open moves the file to
#: :data:`LAYOUT` before it writes anything, since what it writes (format-2 packs)
#: is not readable by the releases that wrote those; a read-only open writes nothing.
OLDER_LAYOUTS = ("agentsession-cas 1",)
#: When an append is made durable before it returns.
SYNC_POLICIES = ("always", "responses", "never")
DEFAULT_STORE = "~/.agent/cas"
_SIDECAR = re.compile(r"sidecar:(sha256:[0-9a-f]{64})")
_DURABLE_ON_RESPONSES = frozenset({"response", "compaction", "branch_summary"})
_ENTRY_NAMING = ("target", "first_kept", "from", "queued_from")
_COMMIT = encode_record({"op": "commit"})
#: Appends whose objects live only in the log (their payloads) before a checkpoint
#: writes them to objects/.
CHECKPOINT_ENTRIES = 1024
_REPAIR_HINT = (
    "it refuses writes until repaired: run `agentsession repair {id}` "
    "(`--dry-run` first shows what it keeps and drops; the damaged log is kept aside)"
)
_ENTRY_IN_RECORD = re.compile(rb'"entry":"(sha256:[0-9a-f]{64})"')
_SEQ_IN_RECORD = re.compile(rb'"seq":([0-9]{1,18})[,}]')


def _walk_up(entry_id: str, step: Callable[[str], tuple[Any, str | None]]) -> list[Any]:
    """What ``step`` gives for each entry from ``entry_id`` up to its root (``step``
    returns the item and the parent's id), in root-first order; a cycle in the
    parents is damaged objects, reported rather than looped on."""
    out: list[Any] = []
    seen: set[str] = set()
    current: str | None = entry_id
    while current is not None:
        if current in seen:
            raise StoreError(f"entry {current} is its own ancestor: the objects are damaged")
        seen.add(current)
        item, current = step(current)
        out.append(item)
    out.reverse()
    return out


def _checkpoint_covers(records: list[Record]) -> int:
    """The highest sequence number whose objects a checkpoint record says are in
    objects/: a record's ``seq``, or, for a record without one (written before
    checkpoints ran on a worker), every append before it."""
    covered, seen = 0, 0
    for r in records:
        if r.op == "append" and isinstance(r.get("seq"), int):
            seen = max(seen, r.get("seq"))
        elif r.op == "checkpoint":
            seq = r.get("seq")
            covered = max(covered, seq if isinstance(seq, int) else seen)
    return covered


_CHECKPOINT_POOL: ThreadPoolExecutor | None = None


def _checkpoint_pool() -> ThreadPoolExecutor:
    """One worker for background checkpoints: zstd and fsync let go of the GIL, so
    the appending thread goes on while a pack is compressed and written."""
    global _CHECKPOINT_POOL
    if _CHECKPOINT_POOL is None:
        _CHECKPOINT_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentsession-checkpoint")
    return _CHECKPOINT_POOL


def default_store_path() -> str:
    """``$AGENTSESSION_STORE``, else ``~/.agent/cas``."""
    return os.path.expanduser(os.environ.get("AGENTSESSION_STORE") or DEFAULT_STORE)


def _write_atomic(path: str, data: bytes, *, durable: bool) -> None:
    write_atomic(path, data, durable=durable)


@dataclass
class AppendResult:
    """What an append did.

    ``outcome`` is ``continued`` (the head moved to the entry), ``branched``
    (the parent was not the head; nothing moved), ``no-op`` (the log already
    held the entry), ``head-moved`` (a ``leaf`` label moved the head to its
    target) or ``head-not-moved`` (a ``leaf`` label whose target may not
    hold the head). ``durable`` says whether it was committed before
    returning. ``unresolved`` lists references the store cannot resolve
    (RFC 0002: reported, never a condition of acceptance).
    """

    id: str
    outcome: str
    head: str | None
    durable: bool
    seq: int | None = None
    unresolved: list[str] = field(default_factory=list)
    note: str | None = None

    @property
    def head_moved(self) -> bool:
        return self.outcome in ("continued", "head-moved")

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "outcome": self.outcome,
            "head": self.head,
            "head_moved": self.head_moved,
            "durable": self.durable,
            "seq": self.seq,
            "unresolved": list(self.unresolved),
            "note": self.note,
        }


def _entry_from(
    entry_id: str, env: dict[str, Any], body: dict[str, Any], careful: bool | None = None
) -> Entry:
    """The line an envelope and its body make: the body's members, the envelope's (less
    ``content``), and ``id``. ``careful`` as :func:`canonical.loads_flagged` says."""
    data = dict(body)
    data["type"] = env.get("type")
    data["parent"] = env.get("parent")
    if env.get("parents"):
        data["parents"] = env["parents"]
    data["ts"] = env.get("ts")
    data["id"] = entry_id
    entry = Entry(data, computed_id=entry_id, content_hash=env["content"])
    entry.careful = careful
    return entry


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


class Store:
    """A store directory, opened read-only or for writing.

    Use as a context manager; sessions opened through a writing store are
    committed and released when it closes. ``sync`` is the default policy
    for appends: ``always`` (every append durable before it returns),
    ``responses`` (durable on responses, function call outputs, compactions,
    branch summaries and the record types the header names) or ``never``
    (durable at :meth:`Session.commit` and close, and for the record types
    the header names, which RFC 0001 requires durable before their side
    effect).
    """

    def __init__(self, path: str | os.PathLike | None = None, *, readonly: bool = False, sync: str = "always"):
        self.root = os.path.abspath(os.path.expanduser(os.fspath(path)) if path is not None else default_store_path())
        if sync not in SYNC_POLICIES:
            raise StoreError(f"unknown sync policy {sync!r}: use one of {', '.join(SYNC_POLICIES)}")
        self.readonly = readonly
        self.sync = sync
        self.objects = ObjectStore(self.root)
        self._open: dict[str, Session] = {}
        self._check_layout()

    # -- the directory --------------------------------------------------------

    @classmethod
    def init(cls, path: str | os.PathLike | None = None, **kwargs: Any) -> Store:
        """Create a store (or open the one already there) and return it open for writing."""
        root = os.path.abspath(os.path.expanduser(os.fspath(path)) if path is not None else default_store_path())
        layout = os.path.join(root, "layout")
        if not os.path.exists(layout):
            if os.path.isdir(root) and os.listdir(root):
                raise LayoutError(f"{root} exists and is not empty; a store needs an empty or new directory")
            for sub in ("objects/entries", "objects/contents", "objects/blobs", "sessions", "locks", "tmp", "trash"):
                os.makedirs(os.path.join(root, sub), exist_ok=True)
            ObjectStore(root).make_fanout()
            fsync_dir(os.path.join(root, "objects"))
            _write_atomic(layout, (LAYOUT + "\n").encode(), durable=True)
        return cls(root, **kwargs)

    def _check_layout(self) -> None:
        layout = os.path.join(self.root, "layout")
        try:
            with open(layout, "rb") as f:
                text = f.read().decode("utf-8", "replace").strip()
        except FileNotFoundError:
            from ..maintenance.migrate import old_layout_hint  # here, not at the top: migrate imports this module

            hint = old_layout_hint(self.root)
            if hint is not None:
                raise LayoutError(hint) from None
            raise LayoutError(f"no store at {self.root} (no layout file); create one with `agentsession init`") from None
        except IsADirectoryError:
            raise LayoutError(f"{layout} is a directory, not a layout file") from None
        if text in OLDER_LAYOUTS:
            if not self.readonly:
                _write_atomic(layout, (LAYOUT + "\n").encode(), durable=True)
            return
        if text != LAYOUT:
            raise LayoutError(
                f"the store at {self.root} has layout {text!r}; this release reads {LAYOUT!r} (a newer or unknown layout)"
            )

    def _dir(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def session_dir(self, session_id: str) -> str:
        return self._dir("sessions", check_session_id(session_id))

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Commit and release every session this store opened for writing."""
        errors = []
        for session in list(self._open.values()):
            try:
                session.close()
            except (AgentSessionError, OSError) as exc:  # keep closing the others
                errors.append(exc)
        self._open.clear()
        if not errors and not self.readonly:
            try:
                self._auto_pack()
            except (AgentSessionError, OSError) as exc:
                errors.append(exc)
        self.objects.close()
        if errors:
            raise errors[0]

    def pack(self, **kwargs: Any) -> RepackResult:
        """Repack every loose and packed object into one pack (``agentsession pack``);
        see :meth:`ObjectStore.repack`."""
        self._require_writable()
        return self.objects.repack(**kwargs)

    def sweep(self, **kwargs: Any) -> SweepResult:
        """Remove what nothing retained names (``agentsession sweep``); see
        :func:`agentsession_cas.sweep.sweep`."""
        from ..maintenance.sweep import sweep

        if not kwargs.get("dry_run"):
            self._require_writable()
        return sweep(self, **kwargs)

    def _auto_pack(self) -> None:
        """Pack loose objects once there are many (as ``git gc --auto`` does), when a
        writer closes rather than inside an append; then merge small packs."""
        if not self.objects.wrote:
            return  # nothing written here: closing costs nothing however big the store
        if self.objects.estimate_loose() >= AUTO_PACK_LOOSE:
            self.objects.pack_loose()
        self.objects.merge_small_packs()

    # -- sessions ---------------------------------------------------------------

    def list(self) -> list[str]:
        """The ids of the sessions held, sorted."""
        try:
            names = os.listdir(self._dir("sessions"))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            try:
                check_session_id(name)
            except AgentSessionError:
                continue
            if os.path.exists(self._dir("sessions", name, "header")):
                out.append(name)
        return sorted(out)

    def __contains__(self, session_id: object) -> bool:
        try:
            return os.path.exists(os.path.join(self.session_dir(session_id), "header"))  # type: ignore[arg-type]
        except AgentSessionError:
            return False

    def session(self, session_id: str) -> Session:
        """Open a session: for writing (locked, recovered) or, on a read-only store, as a snapshot."""
        check_session_id(session_id)
        if session_id in self._open:
            return self._open[session_id]
        if session_id not in self:
            raise NoSuchSessionError(f"no such session: {session_id}")
        if self.readonly:
            # A snapshot, kept so that entries it serves from log payloads resolve
            # through the store too (Store.entry).
            session = Session._load(self, session_id, writable=False)
            self._open[session_id] = session
            return session
        session = Session._load(self, session_id, writable=True)
        self._open[session_id] = session
        return session

    open = session

    def read(self, session_id: str) -> Session:
        """A read-only snapshot of a session, taking no lock, whatever the store's mode."""
        check_session_id(session_id)
        if session_id not in self:
            raise NoSuchSessionError(f"no such session: {session_id}")
        return Session._load(self, session_id, writable=False)

    def _require_writable(self) -> None:
        if self.readonly:
            raise ReadOnlyError(f"the store at {self.root} is open read-only")

    def _lock(self, session_id: str) -> filelock.BaseFileLock:
        os.makedirs(self._dir("locks"), exist_ok=True)
        lock = filelock.FileLock(self._dir("locks", session_id + ".lock"), timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise SessionLockedError(f"session {session_id} is locked by another process") from None
        return lock

    def create(self, header: Header | Mapping[str, Any], *, record: bool = True) -> Session:
        """Create a session from its header, by one rename into place that fails if the id is held.

        A fork names a ``base`` the store holds, that is not a ``leaf`` label,
        with the media of the session owning it. Returns the new session,
        open for writing.
        """
        self._require_writable()
        header = header if isinstance(header, Header) else Header(dict(header))
        header = self._checked_new_header(header)
        base = header.base
        prefix_ids: list[str] = []
        if base is not None:
            # Checks, and makes the prefix's objects durable; they are not written again.
            chain = self._prefix_for_base(header)
            prefix_ids = [eid for eid, _ in chain]
        else:
            chain = []
        return self._stage_session(
            header, base=base, own=[], prefix=[], head=base, record=record, prefix_ids=prefix_ids, freshen=chain
        )

    def _checked_new_header(self, header: Header) -> Header:
        data = dict(header.data)
        data.setdefault("type", "session")
        data.setdefault("format", FORMAT_WRITTEN)
        data.setdefault("created_at", now_ts())
        header = Header(data)
        problems = header.problems()
        if problems:
            raise SessionFormatError("header", problems)
        if header.is_legacy:
            raise StoreError(f"a store holds hashed entries; format {header.format} is before 0.5")
        check_session_id(header.id)
        if header.data.get("redacted") is not None:
            raise StoreError("a redacted session is a record to read, not one to hold (RFC 0002)")
        if header.id in self:
            raise SessionExistsError(f"session {header.id} already exists")
        try:
            canonical_bytes(header.data)
        except IJSONError as exc:
            raise StoreError(f"header is not I-JSON: {exc}") from None
        return header

    def _prefix_for_base(self, header: Header) -> list[tuple[str, str]]:
        """(id, content hash) root..base, checked: held, not a leaf label, committed,
        same media, not below a merge. Only envelopes are read along the way (and the
        base whole), so a fork deep in a long session costs one small read per entry."""
        base = header.base
        assert base is not None
        owner = self._holder_of(base)
        if owner is None:
            raise StoreError(f"base {base} is not an entry this store holds (in a log or on a prefix)")
        owner_id, owner_header, committed, owner_session = owner
        if not committed:
            raise StoreError(f"base {short_id(base)} is not yet committed in session {owner_id}; commit it first")
        if owner_header.media != header.media:
            raise StoreError(
                f"media {header.media!r} differs from {owner_header.media!r} of session {owner_id}, which holds the base"
            )
        base_entry = owner_session.entry(base) if owner_session is not None else self.entry(base)
        if base_entry.is_leaf_label:
            raise StoreError(f"base {short_id(base)} is a leaf label; the base is a fork's first head")
        chain: list[tuple[str, dict]] = []  # (id, envelope), base first
        seen: set[str] = set()
        current: str | None = base
        while current is not None:
            if current in seen:
                raise StoreError(f"entry {current} is its own ancestor: the objects are damaged")
            seen.add(current)
            try:
                env = loads(self.objects.get("entries", current))
            except NoSuchObjectError:
                # Held only in its owner's log so far (another process's session between
                # checkpoints): the fork reads its prefix from objects/, so write it there.
                if owner_session is None:
                    raise
                e = owner_session.entry(current)
                self._put_entry(e, durable=True)
                env = loads(self.objects.get("entries", current))
            if not isinstance(env, dict):
                raise CorruptObjectError(
                    f"envelope {current} is not an envelope", space="entries", name=current,
                    path=self.objects.path("entries", current),
                )
            chain.append((current, env))
            parent = env.get("parent")
            current = parent if isinstance(parent, str) else None
        chain.reverse()
        self._check_prefix_readable(
            [Entry({"id": i, **env}, computed_id=i, content_hash=env.get("content", "")) for i, env in chain], owner_id
        )
        fmt, owner_fmt = parse_format(header.format), parse_format(owner_header.format)
        if fmt and owner_fmt and fmt < owner_fmt:
            raise StoreError(f"a fork's format {header.format} may not be earlier than {owner_header.format} of {owner_id}")
        return [(i, env.get("content", "")) for i, env in chain]

    @staticmethod
    def _check_prefix_readable(path: list[Entry], origin: str | None) -> None:
        """Refuse a base below a merge: a prefix entry whose ``parents`` names, in this
        session, an entry off the path would make a projection no reader can read
        (RFC 0002, open questions; the reference refuses it too)."""
        on_path = {e.id for e in path}
        for e in path:
            for ref in e.parents:
                if (ref.session is None or ref.session == origin) and ref.entry not in on_path:
                    raise StoreError(
                        f"base is below a merge: prefix entry {short_id(e.id)} converges {short_id(ref.entry)}, "
                        "which is off the path, so the fork's file could not be read"
                    )

    def _holder_of(self, entry_id: str) -> tuple[str, Header, bool, Session] | None:
        """The session whose own entries (else whose prefix) hold ``entry_id``:
        (id, header, whether the entry is committed there, the session). Scans the
        store, which only creating a fork or importing one needs. A session open
        here is committed and checkpointed first, so the fork finds its objects."""
        on_prefix = None
        for sid in self.list():
            if sid in self._open:
                s = self._open[sid]
                if entry_id in s.own:
                    s.commit()
                    s.checkpoint()
                    return sid, s.header, True, s
                if entry_id in s.prefix_set or entry_id == s.base:
                    on_prefix = on_prefix or (sid, s.header, True, s)
                continue
            try:
                s = Session._load(self, sid, writable=False)
            except AgentSessionError:
                continue
            if entry_id in s.own:
                return sid, s.header, entry_id in s.committed_own, s
            if entry_id in s.prefix_set or entry_id == s.base:
                on_prefix = on_prefix or (sid, s.header, True, s)
        return on_prefix

    def _stage_session(
        self,
        header: Header,
        *,
        base: str | None,
        own: list[Entry],
        prefix: list[Entry],
        head: str | None,
        record: bool,
        prefix_ids: list[str] | None = None,
        freshen: list[tuple[str, str]] = (),  # type: ignore[assignment]
    ) -> Session:
        """Write a whole session in ``tmp/`` and rename it into ``sessions/``. The objects
        of ``prefix`` and ``own`` are written; ``prefix_ids`` names a prefix whose
        objects are already durable."""
        lock = self._lock(header.id)
        try:
            if header.id in self:
                raise SessionExistsError(f"session {header.id} already exists")
            stage = self._dir("tmp", f"{header.id}-{os.getpid()}-{os.urandom(4).hex()}")
            os.makedirs(stage)
            try:
                mark = "record" if record else "mirror"
                lines = [encode_record({"op": "create", "session": header.id, "base": base, "mark": mark})]
                for seq, e in enumerate(own, start=1):
                    # leaf_label: the head never rests on one, after a reopen too
                    lines.append(
                        encode_append(seq, e.id, None, head_moved=False, leaf_label=e.is_leaf_label, lazy=False, payload=None)
                    )
                if own:
                    lines.append(encode_record({"op": "head", "head": head}))
                    lines.append(encode_record({"op": "commit"}))
                files = {
                    "header": header.canonical_line(),
                    "log": b"".join(lines),
                    "HEAD": ((head or "") + "\n").encode(),
                    "mark": (mark + "\n").encode(),
                }
                # The staged log comes first, the objects after it: a sweep running now
                # reads staged logs too, so it never takes these objects for garbage.
                for name, data in files.items():
                    with open(os.path.join(stage, name), "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                fsync_dir(stage)
                # A fork names a prefix it does not write: touch the files holding it,
                # now that the staged log names the base, so a sweep that read the logs
                # before (while the origin was being deleted) keeps them; one already
                # gone refuses the fork rather than leave it without its prefix.
                touched: set[str] = set()
                for eid, chash in freshen:
                    if (
                        self.objects.freshen("entries", eid, touched=touched) is None
                        or self.objects.freshen("contents", chash, touched=touched) is None
                    ):
                        raise StoreError(
                            f"prefix entry {short_id(eid)} of the fork's base was swept while the fork was "
                            "being made; nothing was created (the base's session was deleted meanwhile?)"
                        )
                items: list[tuple[str, str, bytes]] = []
                for e in prefix + own:
                    # Entries here were parsed (a file read, or objects of this store): their
                    # member names are strings and their parse flags say how to serialise.
                    if e.objects is not None and e.id == e.computed_id:
                        (content, env), chash = e.objects, e.content_hash  # kept by the reader
                    else:
                        _, chash, content, env = entry_objects(e.data, parsed=True, careful=e.careful)
                    items.append(("contents", chash, content))
                    items.append(("entries", e.id, env))
                self.objects.put_many(items)
                target = self.session_dir(header.id)
                if os.path.exists(target):
                    raise SessionExistsError(f"session {header.id} already exists")
                os.rename(stage, target)
            except BaseException:
                shutil.rmtree(stage, ignore_errors=True)
                raise
            fsync_dir(self._dir("sessions"))
        except BaseException:
            lock.release()
            raise
        # What the new log says is known here: no need to read it back.
        session = Session(self, header.id)
        session.lock = lock
        session._adopt(
            header, base=base, own=own, prefix=prefix_ids if prefix_ids is not None else [e.id for e in prefix],
            head=head, mark=mark,
        )
        self._open[header.id] = session
        return session

    def delete(self, session_id: str) -> None:
        """Remove a session in one step (a rename away), then its files."""
        self._require_writable()
        check_session_id(session_id)
        session = self._open.pop(session_id, None)
        if session is not None:
            lock = session._release_for_delete()
        else:
            if session_id not in self:
                raise NoSuchSessionError(f"no such session: {session_id}")
            lock = self._lock(session_id)
        try:
            os.makedirs(self._dir("trash"), exist_ok=True)
            trash = self._dir("trash", f"{session_id}-{time.time_ns()}")
            os.rename(self.session_dir(session_id), trash)
            fsync_dir(self._dir("sessions"))
            shutil.rmtree(trash, ignore_errors=True)
        finally:
            lock.release()

    # -- objects and entries ------------------------------------------------------

    def _put_entry(
        self, entry: Entry, *, durable: bool, content: bytes | None = None, env: bytes | None = None
    ) -> list[str]:
        """Write an entry's content then its envelope; return paths owed an fsync."""
        if content is None or env is None:
            _, _, content, env = entry_objects(entry.data)
        owed = []
        p = self.objects.put("contents", entry.content_hash, content, durable=durable)
        if p:
            owed.append(p)
        p = self.objects.put("entries", entry.id, env, durable=durable)
        if p:
            owed.append(p)
        return owed

    def entry(self, entry_id: str) -> Entry:
        """An entry rebuilt from its envelope and content objects, both verified (or
        from a session open here that holds it only in its log until a checkpoint)."""
        try:
            env_bytes = self.objects.get("entries", entry_id)
        except NoSuchObjectError:
            for session in self._open.values():
                if entry_id in session._unmaterialized or entry_id in session._payloads:
                    return session.entry(entry_id)
            raise
        env, env_careful = parse_envelope(env_bytes)
        if not isinstance(env, dict) or not isinstance(env.get("content"), str):
            raise CorruptObjectError(
                f"envelope {entry_id} is not an envelope ({self.objects.relpath('entries', entry_id)})",
                space="entries",
                name=entry_id,
                path=self.objects.path("entries", entry_id),
            )
        body, body_careful = loads_flagged(self.objects.get("contents", env["content"]))
        return _entry_from(entry_id, env, body, env_careful or body_careful)

    def _ancestry(self, entry_id: str) -> list[str]:
        """The ids root..entry_id, walking parents through envelopes alone (a prefix
        needs no contents), from objects or from a session open here that holds
        them only in its log so far."""
        return _walk_up(entry_id, lambda eid: (eid, self._envelope_parent(eid)))

    def _envelope_parent(self, entry_id: str) -> str | None:
        try:
            env_bytes = self.objects.get("entries", entry_id)
        except NoSuchObjectError:
            for session in self._open.values():
                held = session._unmaterialized.get(entry_id)
                if held is not None:
                    env_bytes = held[2]
                    break
                payload = session._payloads.get(entry_id)
                if payload is not None:
                    env_bytes = payload[1]
                    break
            else:
                raise
        env = loads(env_bytes)
        parent = env.get("parent") if isinstance(env, dict) else None
        if parent is not None and not is_hash(parent):
            raise CorruptObjectError(
                f"envelope {entry_id} names parent {parent!r}, not an entry id",
                space="entries", name=entry_id, path=self.objects.path("entries", entry_id),
            )
        return parent

    def path_to(self, entry_id: str, *, via: Session | None = None) -> list[Entry]:
        """Entries from the root to ``entry_id``, read from the objects (or through
        ``via``, a session that may hold some only in its log so far)."""
        read = via.entry if via is not None else self.entry

        def step(eid: str) -> tuple[Entry, str | None]:
            e = read(eid)
            return e, e.parent

        return _walk_up(entry_id, step)

    def put_blob(self, data: bytes) -> str:
        """Store a media blob durably; return its ``sha256:`` name (use as ``sidecar:<name>``)."""
        self._require_writable()
        name = sha256_ref(data)
        self.objects.put("blobs", name, data, durable=True)
        return name

    def blob(self, name: str) -> bytes:
        return self.objects.get("blobs", name)

    def cat_object(self, name: str, space: str | None = None) -> tuple[str, bytes]:
        """An object's verified bytes and its space, looked up in every space unless one is given."""
        if not is_hash(name):
            raise AgentSessionError(f"{name!r} is not an object name (sha256: and 64 lowercase hex digits)")
        spaces = [space] if space else ["entries", "contents", "blobs"]
        for sp in spaces:
            try:
                return sp, self.objects.get(sp, name)
            except NoSuchObjectError:
                for session in self._open.values():
                    pending = [(i, c, co, en) for i, (c, co, en) in session._unmaterialized.items()]
                    pending += [(i, sha256_ref(co), co, en) for i, (co, en) in session._payloads.items()]
                    for entry_id, chash, content, env in pending:
                        if sp == "entries" and entry_id == name:
                            return sp, env
                        if sp == "contents" and chash == name:
                            return sp, content
                continue
        raise NoSuchObjectError(
            f"no object {name} in objects/ (an entry appended since its session's last checkpoint "
            "is held only in that session's log until the next one)"
        )

    # -- projection and import ----------------------------------------------------

    def export(self, session_id: str) -> bytes:
        """The session's RFC 0002 projection as bytes."""
        return self.read(session_id).projection()

    def export_to(self, session_id: str, path: str | os.PathLike) -> None:
        """Write the projection to ``path`` atomically, and sidecar media beside it
        (``<dir>/<session id>/<hex>``, RFC 0001); a blob the store lacks is an error."""
        session = self.read(session_id)
        data = session.projection()
        path = os.fspath(path)
        blobs: dict[str, bytes] = {}
        if session.header.media == "sidecar":
            for name in sorted(set(_SIDECAR.findall(data.decode("utf-8")))):
                blobs[name] = self.blob(name)  # raises, naming it, when missing or corrupt
        _write_atomic(path, data, durable=True)
        if blobs:
            side = os.path.join(os.path.dirname(os.path.abspath(path)), session.id)
            os.makedirs(side, exist_ok=True)
            for name, blob in blobs.items():
                _write_atomic(os.path.join(side, name[7:]), blob, durable=True)

    def import_file(self, path: str | os.PathLike, *, record: bool = False) -> Session:
        """Import a projection (RFC 0002): every line verified, the head from the resume
        rule held to the head rule, a synthetic marker discarded. A mirror unless ``record``."""
        with gc_paused():  # a bulk pass: many acyclic objects per entry (see gc_paused)
            sf = read_session(path, keep_objects=True)  # the objects it writes, computed once
            side = os.path.join(os.path.dirname(os.path.abspath(os.fspath(path))), str(sf.header.id))
            return self.import_session(sf, record=record, sidecar_dir=side)

    def import_bytes(self, data: bytes, *, record: bool = False, source: str = "<bytes>") -> Session:
        with gc_paused():
            return self.import_session(read_session_bytes(data, source=source, keep_objects=True), record=record)

    def _import_blobs(self, sf: SessionFile, sidecar_dir: str | None) -> None:
        """A sidecar session's blobs come from ``<dir>/<id>/<hex>`` beside its file, each
        verified against its name; one neither there nor held already refuses the import."""
        names: set[str] = set()
        for e in sf.entries:
            text = canonical_bytes(e.body, parsed=True)
            if b"sidecar:" in text:
                names.update(_SIDECAR.findall(text.decode("utf-8")))
        for name in sorted(names):
            if self.objects.is_sound("blobs", name):
                continue
            where = os.path.join(sidecar_dir, name[7:]) if sidecar_dir else None
            try:
                with open(where, "rb") as f:  # type: ignore[arg-type]
                    blob = f.read()
            except (OSError, TypeError):
                raise StoreError(f"{sf.source}: sidecar blob {name} is missing (looked for {where})") from None
            if sha256_ref(blob) != name:
                raise StoreError(f"{sf.source}: sidecar blob {where} does not hash to its name {name}")
            self.objects.put("blobs", name, blob, durable=True)

    def import_session(self, sf: SessionFile, *, record: bool = False, sidecar_dir: str | None = None) -> Session:
        self._require_writable()
        if sf.truncated is not None:
            raise StoreError(f"{sf.source}: {sf.truncated}; a cut-short file is not imported")
        if sf.problems:
            raise SessionFormatError(sf.source, sf.problems)
        if sf.migrated:
            raise StoreError(f"{sf.source} is of format {sf.header.format}, before hashed ids; it is read, not imported")
        header = self._checked_new_header(sf.header)
        base = header.base
        entries = sf.entries
        tree = sf.tree
        leaf = tree.resume_leaf()
        kept = [e for e in entries if not (e.type == "label" and e.synthetic)]
        if base is not None:
            cut = next((i for i, e in enumerate(kept) if e.id == base), None)
            if cut is None:
                raise StoreError(
                    f"{sf.source}: the header names base {base}, which the file does not hold; "
                    "a fork's projection carries its prefix (RFC 0001 ingress)"
                )
            if kept[cut].is_leaf_label:
                raise StoreError(f"{sf.source}: base {short_id(base)} is a leaf label; the base is a fork's first head")
            cut += 1
            prefix, own = kept[:cut], kept[cut:]
            holder = self._holder_of(base)
            if holder is not None and holder[1].media != header.media:
                raise StoreError(
                    f"media {header.media!r} differs from {holder[1].media!r} of session {holder[0]}, which holds the base"
                )
        else:
            prefix, own = [], kept
        own_ids = {e.id for e in own}
        for e in own:
            if e.parent is None and base is not None:
                raise StoreError(f"{sf.source}: line {e.line}: an own entry of a fork cannot be a root")
            if e.parent is not None and e.parent != base and e.parent not in own_ids:
                raise StoreError(f"{sf.source}: line {e.line}: parent {e.parent} is neither the base nor an own entry")
        # The head: the resume rule, held to the head rule.
        head = leaf
        if head is not None and head not in own_ids:
            head = base
        else:
            while head is not None and tree.by_id[head].is_leaf_label:
                head = tree.by_id[head].parent
                if head is not None and head not in own_ids:
                    head = base
                    break
        if head is None:
            head = base  # a fork always has a head; a baseless session may have none
        if header.media == "sidecar":
            self._import_blobs(sf, sidecar_dir)
        return self._stage_session(header, base=base, own=own, prefix=prefix, head=head, record=record)


class Session:
    """A session as a store holds it: header, base, head, mark and the log of own entries."""

    def __init__(self, store: Store, session_id: str):
        self.store = store
        self.id = session_id
        self.dir = store.session_dir(session_id)
        self.header: Header
        self.base: str | None = None
        self.head: str | None = None
        self.mark: str = "mirror"
        self.own: dict[str, int] = {}  # entry id -> seq
        self.log_order: list[str] = []
        self.committed_own: set[str] = set()
        # Own entries appended lazily and not yet committed (a suffix of log_order):
        # a commit adds these to committed_own, not the whole log again.
        self._uncommitted_ids: list[str] = []
        self.leaf_labels: set[str] = set()
        self._prefix: list[str] | None = []  # root..base, base included; None: not read yet
        self._prefix_set: frozenset[str] | None = None
        self.writable = False
        self.lock: filelock.BaseFileLock | None = None
        self.records_read: LogRead | None = None
        self.recovered: list[str] = []  # what recovery did, for the caller to log
        self._uncommitted = False
        self._format_raised = False  # the header's format checked against ours (once)
        self._log_size: int | None = None  # the log's length as this writer left it
        self._since_checkpoint = 0  # appends since the last checkpoint began
        # The checkpoint on the worker thread: (future, entry ids, last seq covered).
        self._inflight: tuple[Future, list[str], int] | None = None
        self._context_hashes: ContextHasher | None = None  # built when first asked, then fed at append
        # Appends whose objects are only in the log so far: id -> (content hash, content, envelope).
        self._unmaterialized: dict[str, tuple[str, bytes, bytes]] = {}
        self._payloads: dict[str, tuple[bytes, bytes]] = {}  # read-only: objects recovery could not write
        self._max_seq = 0  # sequence numbers are never reused, a lost append's included
        self._stopped: str | None = None  # set when an fsync failed
        self._log_fd: int | None = None
        self._closed = False

    # -- loading and recovery -------------------------------------------------------

    @classmethod
    def _load(
        cls, store: Store, session_id: str, *, writable: bool, lock: filelock.BaseFileLock | None = None
    ) -> Session:
        s = cls(store, session_id)
        if writable:
            store._require_writable()
            s.lock = lock or store._lock(session_id)
        try:
            s._read(writable)
        except BaseException:
            if s.lock is not None:
                s.lock.release()
            raise
        return s

    def _adopt(
        self, header: Header, *, base: str | None, own: list[Entry], prefix: list[str], head: str | None, mark: str
    ) -> None:
        """Take the state of a session just staged whole (create, import), committed."""
        self.header = header
        self.base = base
        self.head = head
        self.mark = mark
        for seq, e in enumerate(own, start=1):
            self.own[e.id] = seq
            self.log_order.append(e.id)
            if e.is_leaf_label:
                self.leaf_labels.add(e.id)
        self._max_seq = len(own)
        self.committed_own.update(self.own)
        self.prefix = prefix
        self.prefix_set = frozenset(prefix)
        self.writable = True
        self._log_fd = os.open(os.path.join(self.dir, "log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _read(self, writable: bool) -> None:
        try:
            with open(os.path.join(self.dir, "header"), "rb") as f:
                header_bytes = f.read()
        except FileNotFoundError:
            raise NoSuchSessionError(f"no such session: {self.id}") from None
        except OSError as exc:
            raise StoreError(f"session {self.id}: its header cannot be read: {exc.strerror or exc}") from None
        try:
            header_obj = loads(header_bytes)
        except (ValueError, AgentSessionError) as exc:
            raise StoreError(f"session {self.id}: header is unreadable: {exc}") from None
        if not isinstance(header_obj, dict) or header_obj.get("type") != "session":
            raise StoreError(f"session {self.id}: header is not a session header object")
        if header_obj.get("id") != self.id:
            raise StoreError(
                f"session {self.id}: its header names session {header_obj.get('id')!r}; the directory and the header disagree"
            )
        self.header = Header(header_obj)
        try:
            with open(os.path.join(self.dir, "log"), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            raise StoreError(f"session {self.id}: its log cannot be read: {exc.strerror or exc}") from None
        logread = read_log(data)
        self.records_read = logread
        if logread.damage:
            first = logread.damage[0]
            raise SessionDamagedError(
                f"session {self.id} is damaged: log line {first.line} (offset {first.offset}): {first.reason}; "
                + _REPAIR_HINT.format(id=self.id),
                session=self.id,
                line=first.line,
                offset=first.offset,
            )
        records = logread.records
        if not records or records[0].op != "create":
            # Every log opens with its create record, written durably with the session;
            # without it nothing says what the session holds, so it is damage, not an empty session.
            what = "is missing or empty" if not data else "does not open with its create record"
            raise SessionDamagedError(
                f"session {self.id} is damaged: its log {what}; "
                + _REPAIR_HINT.format(id=self.id),
                session=self.id,
                line=1,
                offset=0,
            )
        cut_at = len(records)
        last_commit = max((i for i, r in enumerate(records) if r.op in ("commit", "create")), default=-1)
        # Uncommitted appends whose objects a crash took or tore are lost, with all after them.
        for i in range(last_commit + 1, len(records)):
            r = records[i]
            if r.op == "append":
                entry = r.get("entry")
                if not self._objects_sound(entry) and not (r.payload and payload_entry(entry, r.payload)):
                    cut_at = i
                    break
        kept = records[:cut_at]
        dropped = records[cut_at:] + logread.cut_records
        # Appends since the last checkpoint have their objects only in the log for
        # sure; after a crash, any the disk lacks are restored from their payloads.
        covered = _checkpoint_covers(kept)
        since_checkpoint = [
            r for r in kept
            if r.op == "append" and r.payload is not None
            and not (isinstance(r.get("seq"), int) and r.get("seq") <= covered)
        ]
        to_restore: list[Record] = []
        for r in since_checkpoint:
            if not self._objects_sound(r.get("entry")):
                if payload_entry(r.get("entry"), r.payload) is None:
                    raise SessionDamagedError(
                        f"session {self.id} is damaged: log line {r.line} carries a payload that does not "
                        f"hash to entry {r.get('entry')}; " + _REPAIR_HINT.format(id=self.id),
                        session=self.id,
                        line=r.line,
                        offset=r.offset,
                    )
                to_restore.append(r)
        lost = [r for r in dropped if r.op == "append"]
        self._replay(kept, last_commit)
        for r in lost:  # a dropped append's sequence number stays spent
            if isinstance(r.get("seq"), int):
                self._max_seq = max(self._max_seq, r.get("seq"))
        # The prefix (root..base) is read from the objects when first needed, not here:
        # opening a fork then costs its own log, not the depth of its base.
        self._prefix = None if self.base is not None else []
        adopted = [r for r in kept[last_commit + 1 :] if r.op == "append"]
        needs_rewrite = bool(logread.cut or lost or cut_at < len(records))
        if lost or logread.cut:
            self.recovered.append(
                f"recovered session {self.id}: dropped {len(lost)} uncommitted record(s) after the last commit"
                + (f", from a torn line {logread.cut.line} on" if logread.cut else "")
            )
        losses = [{"op": "loss", "entry": r.get("entry"), "seq": r.get("seq")} for r in lost]
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
            if m:
                # An append's sequence number is spent even when its line was torn;
                # read it from the bytes, or take the next one, never reusing it.
                sq = _SEQ_IN_RECORD.search(torn)
                loss["seq"] = int(sq.group(1)) if sq else self._max_seq + 1
                self._max_seq = max(self._max_seq, loss["seq"])
            losses.insert(0, loss)
        if to_restore:
            self.recovered.append(
                f"recovered session {self.id}: restored the objects of {len(to_restore)} append(s) from the log"
                if writable
                else f"session {self.id}: {len(to_restore)} append(s) not yet in objects/ are read from the log"
            )
        if not writable:
            for r in to_restore:
                self._payloads[r.get("entry")] = r.payload  # type: ignore[assignment]
            return
        self.writable = True
        # A checkpoint record needs no commit (lost, it only makes recovery check the
        # objects again): a log whose tail after the last commit holds only checkpoints
        # is clean and is not rewritten.
        uncommitted_tail = any(r.op != "checkpoint" for r in kept[last_commit + 1 :])
        if needs_rewrite or adopted or uncommitted_tail:
            self._rewrite_log(kept, losses)
        self._log_fd = os.open(os.path.join(self.dir, "log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if since_checkpoint:
            # Finish the checkpoint the last writer did not reach: every object since
            # it written (where missing or torn) and fsynced, then the record.
            for r in since_checkpoint:
                content, env_bytes = r.payload  # type: ignore[misc]
                self._unmaterialized[r.get("entry")] = (sha256_ref(content), content, env_bytes)
            self._checkpoint()
        self._write_indexes()

    def _objects_sound(self, entry_id: object) -> bool:
        if not isinstance(entry_id, str) or not is_hash(entry_id):
            return False
        objs = self.store.objects
        try:
            env = loads(objs.get("entries", entry_id))
            return isinstance(env, dict) and objs.is_sound("contents", env.get("content", ""))
        except (NoSuchObjectError, CorruptObjectError, ValueError, AgentSessionError):
            return False

    def _replay(self, records: list[Record], last_commit: int) -> None:
        for i, r in enumerate(records):
            op = r.op
            if op == "create":
                self.base = r.get("base")
                self.head = self.base
                self.mark = r.get("mark") or "mirror"
            elif op == "append":
                entry = r.get("entry")
                seq = r.get("seq")
                if isinstance(seq, int):
                    self._max_seq = max(self._max_seq, seq)
                if entry not in self.own:
                    self.own[entry] = seq if isinstance(seq, int) else len(self.log_order) + 1
                    self.log_order.append(entry)
                    if i <= last_commit:
                        self.committed_own.add(entry)
                    if r.get("leaf_label"):
                        self.leaf_labels.add(entry)
                if "head" in r.data:
                    self.head = r.get("head")
            elif op == "head":
                self.head = r.get("head")
            elif op == "mark":
                self.mark = r.get("mark")
            elif op in ("loss", "repair") and isinstance(r.get("seq"), int):
                self._max_seq = max(self._max_seq, r.get("seq"))

    def _rewrite_log(self, kept: list[Record], losses: list[dict[str, Any]]) -> None:
        """Recovery's rewrite: what reads (appends with their payloads), a ``loss``
        record for each append dropped (and one for a torn line), and a commit, as a
        new file."""
        lines = [encode_record(r.data, r.payload) for r in kept]
        lines.extend(encode_record(loss) for loss in losses)
        lines.append(encode_record({"op": "commit"}))
        _write_atomic(os.path.join(self.dir, "log"), b"".join(lines), durable=True)
        self.committed_own.update(self.own)

    def _write_indexes(self) -> None:
        """HEAD and mark: indexes of the log, rewritten without fsync (rebuilt on every
        open, never read), and only when they differ from what they should say."""
        for name, text in (("HEAD", (self.head or "") + "\n"), ("mark", self.mark + "\n")):
            path = os.path.join(self.dir, name)
            data = text.encode()
            try:
                with open(path, "rb") as f:
                    if f.read() == data:
                        continue
            except OSError:
                pass
            _write_atomic(path, data, durable=False)

    # -- reading --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.log_order)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.own

    def entry(self, entry_id: str) -> Entry:
        """An entry from the objects, or from its logged payload when a read-only
        open found its objects not yet restored after a crash."""
        pending = self._unmaterialized.get(entry_id)
        if pending is not None:
            return _entry_from(entry_id, loads(pending[2]), loads(pending[1]))
        payload = self._payloads.get(entry_id)
        if payload is not None:
            checked = payload_entry(entry_id, payload)
            assert checked is not None  # checked when the payload was taken
            return _entry_from(entry_id, *checked)
        return self.store.entry(entry_id)

    def __iter__(self) -> Iterator[Entry]:
        """Own entries in log order."""
        for entry_id in self.log_order:
            yield self.entry(entry_id)

    entries = __iter__

    @property
    def prefix(self) -> list[str]:
        """The ids root..base (base included; empty without a base), read from the
        envelopes on first use."""
        if self._prefix is None:
            try:
                self._prefix = self.store._ancestry(self.base) if self.base is not None else []
            except (NoSuchObjectError, CorruptObjectError) as exc:
                raise StoreError(f"session {self.id}: its prefix cannot be read: {exc}") from None
            self._prefix_set = None
        return self._prefix

    @prefix.setter
    def prefix(self, ids: list[str]) -> None:
        self._prefix, self._prefix_set = list(ids), None

    @property
    def prefix_set(self) -> frozenset[str]:
        if self._prefix_set is None:
            self._prefix_set = frozenset(self.prefix)
        return self._prefix_set

    @prefix_set.setter
    def prefix_set(self, ids: frozenset[str]) -> None:
        self._prefix_set = frozenset(ids)

    def prefix_entries(self) -> list[Entry]:
        return [self.store.entry(e) for e in self.prefix]

    def context_hash(self, entry_id: str | None = None) -> str:
        """RFC 0002's context hash ("Prefix caching") at an entry of this session (its
        prefix or its own), by default at the head: the key a provider's prompt cache
        can use. Computed along the session once, when first asked, then kept up to
        date by every append of this handle, so each later append costs one step."""
        if self._context_hashes is None:
            hasher = ContextHasher()
            for e in self.prefix_entries():
                hasher.feed(e)
            for eid in self.log_order:
                hasher.feed(self.entry(eid))
            self._context_hashes = hasher
        target = self.head if entry_id is None else entry_id
        if target is not None and target not in self._context_hashes:
            raise NoSuchEntryError(f"{target} is not an entry of session {self.id}")
        return self._context_hashes.get(target)

    def records(self) -> list[Record]:
        """The log's good records as the file holds them now (the session's history)."""
        with open(os.path.join(self.dir, "log"), "rb") as f:
            return read_log(f.read()).records

    @property
    def is_record(self) -> bool:
        return self.mark == "record"

    def projection(self) -> bytes:
        """RFC 0002 "Projection to JSONL": header, prefix root first, own entries in log
        order, and a synthetic ``leaf`` label only when the resume rule over those lines
        would not name the head. Byte-stable."""
        with gc_paused():
            return self._projection()

    def _projection(self) -> bytes:
        prefix = self.prefix_entries()
        own = list(self)
        entries = prefix + own
        lines = [self.header.canonical_line()]
        lines.extend(e.canonical_line() for e in entries)
        tree = Tree(entries, base=self.base, prefix=self.prefix[:-1])
        if entries and tree.resume_leaf() != self.head:
            last = entries[-1]
            ts = tree.by_id[self.head].ts if self.head is not None else last.ts
            marker = make_entry("label", last.id, ts=ts, target=self.head, label=LEAF_LABEL, synthetic=True)
            lines.append(marker.canonical_line())
        return b"".join(lines)

    # -- writing --------------------------------------------------------------------

    def _check_writable(self, what: str) -> None:
        if self._closed:
            raise StoreError(f"session {self.id} is closed")
        if self._stopped:
            raise StoreError(
                f"session {self.id} stopped writing after an fsync failed ({self._stopped}); "
                "reopen it to recover from what the disk holds"
            )
        if not self.writable:
            raise ReadOnlyError(f"session {self.id} is open read-only; cannot {what}")
        if self.mark != "record":
            raise MirrorError(
                f"session {self.id} is a mirror here; it refuses local {what} (only exchange moves it)"
            )

    def _durable_for(self, entry: Entry, durable: bool | None) -> bool:
        if durable is not None:
            return durable
        if entry.type in self.header.records:
            return True  # RFC 0001: durable before the side effect it precedes
        policy = self.store.sync
        if policy == "always":
            return True
        if policy == "responses":
            if entry.type in _DURABLE_ON_RESPONSES:
                return True
            item = entry.data.get("item")
            return entry.type == "item" and isinstance(item, dict) and item.get("type") == "function_call_output"
        return False

    def _may_hold_head(self, target: str | None) -> bool:
        if target is None:
            return self.base is None
        if target == self.base:
            return True
        return target in self.own and target not in self.leaf_labels

    def _prepare(self, entry: Entry | Mapping[str, Any]) -> tuple[Entry, bytes, bytes]:
        """Hash and check an entry as an append needs; returns it and its two objects' bytes."""
        data = dict(entry.data if isinstance(entry, Entry) else entry)
        stated = data.pop("id", None)
        if "parent" not in data:
            data["parent"] = self.head
        if "ts" not in data:
            data["ts"] = now_ts()
        type_ = data.get("type")
        if type_ == "session" or (isinstance(type_, str) and type_ not in CORE_TYPES and ":" not in type_):
            raise AppendRefusedError(
                f"entry type {type_!r} is neither a core type of RFC 0001 nor namespaced (ns:type); refused"
            )
        try:
            check_ts(data.get("ts"))
            if isinstance(entry, Entry) and entry.careful is not None:
                # Made or read by the format core, which walked it once already: its
                # flag says how to serialise (an Entry's data is not changed once made).
                entry_id, chash, content, env = entry_objects(data, parsed=True, careful=entry.careful)
            else:
                entry_id, chash, content, env = entry_objects(data)
        except (TimestampError, EntryError, IJSONError) as exc:
            raise AppendRefusedError(f"entry refused: {exc}") from None
        data["id"] = entry_id
        built = Entry(data, computed_id=entry_id, content_hash=chash)
        if stated is not None:
            if not isinstance(stated, str) or not stated.startswith("sha256:"):
                raise AppendRefusedError(f"id {stated!r} does not carry the sha256: prefix; it is refused")
            if stated != built.id:
                raise AppendRefusedError(f"id {stated} differs from the entry's hash {built.id}; refused")
        return built, content, env

    def append(self, entry: Entry | Mapping[str, Any], *, durable: bool | None = None) -> AppendResult:
        """Append one entry (RFC 0002 "Append"); see :class:`AppendResult` for what it reports.

        ``parent`` defaults to the head and ``ts`` to now. ``durable`` overrides
        the store's sync policy for this append.
        """
        self._check_writable("appends")
        e, content, env = self._prepare(entry)
        if e.type == "label" and e.data.get("synthetic") is not None:
            raise AppendRefusedError("a label carrying 'synthetic' is a projection's marker; a store refuses it")
        if e.id in self.own:
            return AppendResult(e.id, "no-op", self.head, durable=e.id in self.committed_own, seq=self.own[e.id])
        parent = e.parent
        if parent is None:
            if self.base is not None:
                raise AppendRefusedError(f"session {self.id} has a base; every own entry hangs from it, so a root is refused")
        elif parent != self.base and parent not in self.own:
            where = "on the prefix above the base" if parent in self.prefix_set else "not held by this session"
            raise AppendRefusedError(
                f"parent {parent} is {where}; an own entry hangs from the base or another own entry"
            )
        outcome, new_head, note = "branched", self.head, None
        is_leaf_label = e.is_leaf_label
        if is_leaf_label:
            target = e.data.get("target")
            if "target" in e.data and self._may_hold_head(target):
                outcome, new_head = "head-moved", target
            else:
                outcome = "head-not-moved"
                note = f"label target {target} may not hold the head (not the base or an own entry, or a leaf label)"
        elif parent == self.head:
            outcome, new_head = "continued", e.id
        durable_now = self._durable_for(e, durable)
        self._raise_format()
        unresolved = self._unresolved(e, content)
        seq = self._max_seq + 1
        moved = new_head != self.head or outcome in ("continued", "head-moved")
        # The record carries the entry's two objects: the log alone makes the append
        # durable (one fsync), and the objects reach objects/ at the next checkpoint.
        line = encode_append(
            seq, e.id, new_head, head_moved=moved, leaf_label=is_leaf_label, lazy=not durable_now, payload=(content, env)
        )
        if durable_now:
            self._write_log(line + _COMMIT, sync=True)
            self._uncommitted = False
        else:
            self._write_log(line, sync=False)
            self._uncommitted = True
        unresolved.extend(self._hold_blobs(content))
        self._unmaterialized[e.id] = (e.content_hash, content, env)
        self._max_seq = seq
        self.own[e.id] = seq
        self.log_order.append(e.id)
        if is_leaf_label:
            self.leaf_labels.add(e.id)
        if durable_now:
            self._mark_committed()
            self.committed_own.add(e.id)
        else:
            self._uncommitted_ids.append(e.id)
        self.head = new_head
        if self._context_hashes is not None:
            self._context_hashes.feed(e)
        self._since_checkpoint += 1
        if self._since_checkpoint >= CHECKPOINT_ENTRIES:
            try:
                self._checkpoint(wait=False)
            except OSError as exc:
                # The append was accepted at its record and stays so; the session now
                # refuses writes until reopened, and the caller is told.
                self._stopped = self._stopped or str(exc)
                note = f"accepted, but the checkpoint after it failed ({exc}); the session stopped writing"
        return AppendResult(e.id, outcome, self.head, durable=durable_now, seq=seq, unresolved=unresolved, note=note)

    def _unresolved(self, e: Entry, content: bytes) -> list[str]:
        """References RFC 0002 lets a store report and not refuse: ones it cannot resolve."""
        out = []
        names: list[str] = []
        for ref in e.parents:
            if ref.session is None or ref.session == self.id:
                names.append(ref.entry)
        for member in _ENTRY_NAMING:
            v = e.data.get(member)
            if isinstance(v, str):
                names.append(v)
        for name in names:
            if name not in self.own and name not in self.prefix_set and name != e.id:
                out.append(name)
        return out

    def _hold_blobs(self, content: bytes) -> list[str]:
        """Touch the blobs an appended content names by ``sidecar:`` URL, after its
        record is written (RFC 0002: an accepted append holds its objects; a sweep
        that looked before keeps a touched file), and name those not here."""
        missing = []
        if b"sidecar:" in content:
            touched: set[str] = set()
            for blob in sorted(set(_SIDECAR.findall(content.decode("utf-8")))):
                if self.store.objects.freshen("blobs", blob, touched=touched) is None:
                    missing.append(f"sidecar:{blob}")
        return missing

    def _raise_format(self) -> None:
        """RFC 0002: a writer of a later minor raises the header's format, durably, first."""
        if self._format_raised:
            return
        mine, theirs = parse_format(FORMAT_WRITTEN), self.header.format_version
        if theirs is not None and mine is not None and theirs < mine:
            data = dict(self.header.data, format=FORMAT_WRITTEN)
            _write_atomic(os.path.join(self.dir, "header"), canonical_bytes(data) + b"\n", durable=True)
            self.header = Header(data)
        self._format_raised = True

    def _write_log(self, data: bytes, *, sync: bool) -> None:
        assert self._log_fd is not None
        size = self._log_size
        if size is None:
            size = os.fstat(self._log_fd).st_size
        try:
            written = os.write(self._log_fd, data)
            if written != len(data):
                raise OSError(f"short write to the log of session {self.id}")
            if sync:
                try:
                    os.fsync(self._log_fd)
                except OSError as exc:
                    # Pages a failed fsync covered may never reach the disk and a later
                    # fsync can succeed without them: write nothing more until reopened.
                    self._stopped = str(exc)
                    raise
        except BaseException:
            # Leave no partial record behind; the caller's append is not accepted.
            try:
                os.ftruncate(self._log_fd, size)
            except OSError:
                self._log_size = None  # unknown now: ask the file next time
            raise
        self._log_size = size + len(data)

    def _mark_committed(self) -> None:
        self.committed_own.update(self._uncommitted_ids)
        self._uncommitted_ids.clear()

    def _refuse_if_stopped(self) -> None:
        if self._stopped:
            raise StoreError(
                f"session {self.id} stopped writing after an fsync failed ({self._stopped}); "
                "reopen it to recover from what the disk holds"
            )

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
        self._finish_checkpoint()
        if not self._unmaterialized:
            return
        items: list[tuple[str, str, bytes]] = []
        for entry_id, (chash, content, env) in self._unmaterialized.items():
            items.append(("contents", chash, content))
            items.append(("entries", entry_id, env))
        ids, seq = list(self._unmaterialized), self._max_seq
        self._since_checkpoint = 0  # this checkpoint takes every append so far
        if wait:
            try:
                self.store.objects.put_many(items, dedup=False)
            except OSError as exc:
                self._stopped = str(exc)
                raise
            self._checkpoint_done(ids, seq)
            return
        self._inflight = (_checkpoint_pool().submit(self._materialize, items), ids, seq)

    def _materialize(self, items: list[tuple[str, str, bytes]]) -> None:
        """The worker thread's share of a checkpoint: the pack, then writeback of the
        log's pages started (not waited for), so a later commit finds little to write."""
        self.store.objects.put_many(items, dedup=False)
        fd = self._log_fd
        if fd is not None:
            start_writeback(fd)

    def _finish_checkpoint(self) -> None:
        """Wait for the checkpoint in flight, if any, and record it; a failure there (a
        failed write or fsync) stops the session's writes, as a failed fsync does."""
        if self._inflight is None:
            return
        job, ids, seq = self._inflight
        self._inflight = None
        try:
            job.result()
        except OSError as exc:
            self._stopped = self._stopped or str(exc)
            raise
        self._checkpoint_done(ids, seq)

    def _checkpoint_done(self, ids: list[str], seq: int) -> None:
        self._write_log(encode_record({"op": "checkpoint", "seq": seq}), sync=False)
        for entry_id in ids:
            self._unmaterialized.pop(entry_id, None)

    def checkpoint(self) -> None:
        """Write every object the log alone holds so far to objects/ (the store does this
        every 1024 appends and at close); other processes then find them there."""
        if self.writable and not self._closed:
            self._checkpoint()

    def commit(self) -> None:
        """Make every append so far durable: one fsync of the log, whose records carry
        the appends' objects."""
        if not self.writable or self._closed:
            return
        self._refuse_if_stopped()
        if not self._uncommitted:
            return
        self._write_log(_COMMIT, sync=True)
        self._uncommitted = False
        self._mark_committed()
        self._write_indexes()

    def set_head(self, new: str | None, *, expected: str | None) -> None:
        """Compare-and-swap the head, durably. ``expected`` None means "no head"."""
        self._check_writable("head moves")
        if self.head != expected:
            raise HeadMovedError(
                f"the head of session {self.id} moved: it is {self.head or 'no head'}, not {expected or 'no head'}"
            )
        if new is not None and not is_hash(new):
            raise AppendRefusedError(f"{new!r} is not an entry id")
        if not self._may_hold_head(new):
            if new is None:
                raise AppendRefusedError(f"session {self.id} has a base; its head cannot be empty")
            if new in self.leaf_labels:
                raise AppendRefusedError(f"{new} is a leaf label; the head never rests on one")
            raise AppendRefusedError(f"{new} is neither the base nor an own entry of session {self.id}")
        self._write_log(encode_record({"op": "head", "head": new}) + _COMMIT, sync=True)
        self._uncommitted = False
        self._mark_committed()
        self.head = new
        self._write_indexes()

    def set_mark(self, mark: str) -> None:
        """Set the record mark (``record`` or ``mirror``), committed before it returns."""
        if not self.writable or self._closed:
            raise ReadOnlyError(f"session {self.id} is open read-only")
        if mark not in ("record", "mirror"):
            raise StoreError(f"mark must be 'record' or 'mirror', not {mark!r}")
        self._refuse_if_stopped()
        self._write_log(encode_record({"op": "mark", "mark": mark}) + _COMMIT, sync=True)
        self._uncommitted = False
        self._mark_committed()
        self.mark = mark
        self._write_indexes()

    def close(self) -> None:
        """Commit, checkpoint and release the session's lock. A session whose writes
        stopped (a failed fsync) writes nothing more: it only lets go, and the next
        open recovers from what the disk holds."""
        if self._closed:
            return
        try:
            if self.writable and not self._stopped:
                self.commit()
                self._checkpoint()
                self._write_indexes()
        finally:
            self._closed = True
            if self._inflight is not None:
                # A stopped session still lets its worker finish before the log's
                # descriptor goes (it may be flushing it); the outcome no longer matters.
                try:
                    self._inflight[0].result()
                except Exception:
                    pass
                self._inflight = None
            if self._log_fd is not None:
                os.close(self._log_fd)
                self._log_fd = None
            if self.lock is not None:
                self.lock.release()
                self.lock = None
            self.store._open.pop(self.id, None)

    def _release_for_delete(self) -> filelock.BaseFileLock:
        """Close without committing further, keeping the lock for the caller (delete).
        Objects the log alone holds are written to objects/ first: deleting a session
        removes its ref, never objects another session may come to need."""
        if self.writable and not self._closed and not self._stopped:
            self._checkpoint()
        lock = self.lock
        self.lock = None
        self.writable = False  # so close() neither commits nor rewrites the indexes
        self.close()
        assert lock is not None
        return lock

    # -- exchange (agentsession_cas/exchange.py) ----------------------------------------
    # What a push, a fetch, a handover and a take-back need of a session's internals,
    # kept together in this block. None of these checks the record mark: they are how a
    # mirror takes entries, head moves and marks "only through exchange" (RFC 0002).

    @classmethod
    def exchange_create(cls, store: Store, header: Header, *, prefix: list[str], record: bool) -> Session:
        """Create the session a push or fetch brings, from the pushed header, with the
        base as its head (or none) and no own entries yet; committed, open for writing.
        ``prefix`` (root..base) names entries whose objects the caller has already made
        durable in objects/ and checked as admission requires."""
        header = store._checked_new_header(header)
        return store._stage_session(
            header, base=header.base, own=[], prefix=[], head=header.base, record=record, prefix_ids=list(prefix)
        )

    def exchange_view(self) -> tuple[list[str], str | None, str]:
        """(own entries in log order, head, mark) as last committed: what this session may
        serve to another store. A session open for writing is committed first, so that is
        all of it; a read-only snapshot replays its log only through the last commit, since
        another process's working state is not the session's to serve yet."""
        if self.writable and not self._closed:
            self.commit()
            return list(self.log_order), self.head, self.mark
        read = self.records_read
        records = read.records if read is not None else []
        last = max((i for i, r in enumerate(records) if r.op in ("commit", "create")), default=-1)
        if read is not None and not read.cut_records and all(r.op == "checkpoint" for r in records[last + 1 :]):
            return list(self.log_order), self.head, self.mark
        view = Session(self.store, self.id)
        view._replay(records[: last + 1], last)
        return list(view.log_order), view.head, view.mark

    def exchange_objects(self, entry_id: str) -> tuple[str, bytes, bytes]:
        """(content hash, content bytes, envelope bytes) of an entry this session holds or
        builds on: from memory or the log's payloads until a checkpoint writes them to
        objects/, else from objects/ (verified against their names there)."""
        pending = self._unmaterialized.get(entry_id)
        if pending is not None:
            return pending
        payload = self._payloads.get(entry_id)
        if payload is not None:
            return sha256_ref(payload[0]), payload[0], payload[1]
        objects = self.store.objects
        env = objects.get("entries", entry_id)
        try:
            chash = loads(env).get("content")
        except (ValueError, AttributeError, AgentSessionError):
            chash = None
        if not is_hash(chash):
            raise CorruptObjectError(
                f"envelope {entry_id} is not an envelope ({objects.relpath('entries', entry_id)})",
                space="entries", name=entry_id, path=objects.path("entries", entry_id),
            )
        return chash, objects.get("contents", chash), env

    def exchange_pending(self) -> dict[str, bytes]:
        """The objects this session holds only in its log (or memory) so far, by name:
        what another store may ask for before the writer's next checkpoint."""
        out: dict[str, bytes] = {}
        for entry_id, (chash, content, env) in self._unmaterialized.items():
            out[entry_id], out[chash] = env, content
        for entry_id, (content, env) in self._payloads.items():
            out[entry_id], out[sha256_ref(content)] = env, content
        return out

    def exchange_admit(
        self,
        entries: list[tuple[str, bool]],
        *,
        head: str | None = None,
        move_head: bool = False,
        mark: str | None = None,
        header_format: str | None = None,
    ) -> list[str]:
        """Admit own entries through exchange, then move the head, then set the mark: one
        write and one fsync, committed before it returns (a receiver commits what it
        admits, and a mark, before it acknowledges them). ``entries`` are (id, whether it
        is a ``leaf`` label), every object already durable in objects/, parents before
        children, checked by the caller; ones the log holds are skipped. A later
        ``header_format`` raises the header's format first, durably. Returns the ids
        appended."""
        if self._closed:
            raise StoreError(f"session {self.id} is closed")
        if not self.writable:
            raise ReadOnlyError(f"session {self.id} is open read-only; cannot admit entries")
        self._refuse_if_stopped()
        if mark not in (None, "record", "mirror"):
            raise StoreError(f"mark must be 'record' or 'mirror', not {mark!r}")
        if move_head and not (head is None or head == self.base or head in self.own or any(e == head for e, _ in entries)):
            raise AppendRefusedError(f"{head} is neither the base nor an own entry of session {self.id}")
        if header_format is not None:
            theirs, mine = parse_format(header_format), self.header.format_version
            if theirs is not None and mine is not None and mine < theirs:
                data = dict(self.header.data, format=header_format)
                _write_atomic(os.path.join(self.dir, "header"), canonical_bytes(data) + b"\n", durable=True)
                self.header = Header(data)
        lines: list[bytes] = []
        added: list[tuple[str, int, bool]] = []
        seen: set[str] = set()
        seq = self._max_seq
        for entry_id, leaf in entries:
            if entry_id in self.own or entry_id in seen:
                continue
            seen.add(entry_id)
            seq += 1
            record: dict[str, Any] = {"op": "append", "seq": seq, "entry": entry_id}
            if leaf:
                record["leaf_label"] = True
            lines.append(encode_record(record))
            added.append((entry_id, seq, leaf))
        if move_head and head != self.head:
            lines.append(encode_record({"op": "head", "head": head}))
        else:
            move_head = False
        if mark is not None and mark != self.mark:
            lines.append(encode_record({"op": "mark", "mark": mark}))
        else:
            mark = None
        if not lines:
            return []
        self._write_log(b"".join(lines) + _COMMIT, sync=True)
        if self._uncommitted:
            self._mark_committed()  # this process's own appends, committed by the same record
        for entry_id, s, leaf in added:
            self.own[entry_id] = s
            self.log_order.append(entry_id)
            self.committed_own.add(entry_id)
            if leaf:
                self.leaf_labels.add(entry_id)
            if self._context_hashes is not None:
                # Kept up to date as append keeps it (parents come first: admitted in order).
                self._context_hashes.feed(self.entry(entry_id))
        self._max_seq = seq
        self._uncommitted = False
        if move_head:
            self.head = head
        if mark is not None:
            self.mark = mark
        self._write_indexes()
        return [e for e, _, _ in added]

    def _exchange_identity(self) -> tuple[tuple[int, int, int, int], ...]:
        out = []
        for name in ("log", "header"):
            st = os.stat(os.path.join(self.dir, name))
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def exchange_park(self) -> tuple[tuple[int, int, int, int], ...]:
        """Let go of the lock and the log's descriptor, keeping what the session knows, so
        the next exchange into it need not read its log again (:meth:`exchange_resume`).
        Returns the identity of its files to hand back to that call."""
        if self.writable and not self._closed and not self._stopped:
            self.commit()
            self._checkpoint()
            self._write_indexes()
        identity = self._exchange_identity()
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self.store._open.get(self.id) is self:
            del self.store._open[self.id]
        return identity

    def exchange_resume(self, identity: tuple[tuple[int, int, int, int], ...]) -> bool:
        """Take the lock again and carry on from what was known at :meth:`exchange_park`,
        if the log and header are the very files left then (same inode, size and mtime):
        nothing wrote to the session meanwhile. False, holding nothing, when they changed
        (the caller opens the session afresh); :class:`SessionLockedError` when another
        process holds it."""
        if self._closed or self._stopped or not self.writable or self.id in self.store._open:
            return False
        lock = self.store._lock(self.id)
        try:
            same = self._exchange_identity() == identity
        except OSError:
            same = False
        if not same:
            lock.release()
            return False
        self.lock = lock
        self._log_fd = os.open(os.path.join(self.dir, "log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._log_size = None  # asked of the file at the next write
        self.store._open[self.id] = self
        return True

    # -- end of the exchange block ---------------------------------------------------------

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session({self.id!r}, head={short_id(self.head)}, entries={len(self)}, mark={self.mark})"
