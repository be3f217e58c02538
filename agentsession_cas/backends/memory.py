"""The memory backend: a store held in this process's memory (``memory:`` or ``memory:NAME``).

For tests, ephemeral sessions and the contract suite's second implementation
of the seam. Every rule is the domain's, so a memory store refuses and
accepts exactly what a file store does; what it does not have is
persistence (it ends with the process), packs, or anything for fsck, sweep
or repair to find on a disk. Objects are verified when read, as everywhere.

``memory:NAME`` names a store in a process-wide registry, so two handles
(a store and the transport of a push to it) reach the same one;
``memory:`` alone is a new anonymous store each time it is opened.
"""

from __future__ import annotations

import copy
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import field
from typing import Any, Literal

from ..errors import (
    CorruptObjectError,
    LayoutError,
    NoSuchObjectError,
    NoSuchSessionError,
    ReadOnlyError,
    SessionExistsError,
    SessionLockedError,
    StoreError,
    not_an_object_name,
)
from ..format.hashing import is_hash, sha256_ref
from ..lean import dataclass
from .base import (
    Append,
    Backend,
    Capabilities,
    LogHistory,
    LogOpen,
    LogTail,
    Mark,
    ObjectStore,
    Record,
    RefStore,
    RemoteStore,
    RepackResult,
    Retained,
    RetentionSource,
    SessionLog,
    SessionStore,
    Space,
    record_data,
)

__all__ = ["MemoryBackend", "MemoryData", "memory_store"]


@dataclass
class _SessionData:
    header: bytes
    records: list[dict[str, Any]] = field(default_factory=list)
    committed: int = 0  # records[:committed] are durable
    head: str | None = None
    mark: Mark = "mirror"
    holder: object | None = None
    #: The summary the domain handed over, and how many records the log held then.
    summary: tuple[dict[str, Any], int] | None = None
    #: The append rules' state the domain handed over (an index: checked before use).
    rule_state: dict[str, Any] | None = None


@dataclass
class MemoryData:
    """Everything one memory store holds; shared by every handle opened on it."""

    objects: dict[tuple[Space, str], bytes] = field(default_factory=dict)
    sessions: dict[str, _SessionData] = field(default_factory=dict)
    refs: dict[str, dict[str, Any]] = field(default_factory=dict)
    ref_moves: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    remotes: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    #: When each object was last written or held (what a sweep's grace counts from).
    born: dict[tuple[Space, str], float] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)


_REGISTRY: dict[str, MemoryData] = {}
_REGISTRY_LOCK = threading.Lock()


def memory_store(name: str | None, *, create: bool = False) -> MemoryData:
    """The memory store called ``name`` (a new anonymous one for None); one never made
    is :class:`LayoutError` unless ``create``, as a directory with no store is."""
    if not name:
        return MemoryData()
    with _REGISTRY_LOCK:
        data = _REGISTRY.get(name)
        if data is None:
            if not create:
                raise LayoutError(
                    f"no store at memory:{name} (no memory store of that name in this process); "
                    f"open_store('memory:{name}', create=True) makes one"
                )
            data = _REGISTRY[name] = MemoryData()
        return data


class MemoryObjects(ObjectStore):
    def __init__(self, data: MemoryData, backend: MemoryBackend):
        self.data = data
        self.backend = backend

    def get(self, space: Space, name: str) -> bytes:
        blob = self.data.objects.get((space, name))
        if blob is None:
            raise NoSuchObjectError(f"no {space} object {name} in {self.backend.describe()}")
        if sha256_ref(blob) != name:
            raise CorruptObjectError(
                f"corrupt object: {space} object {name} does not hash to its name (in memory)",
                space=space, name=name, path=self.backend.url,
            )
        return blob

    def exists(self, space: Space, name: str) -> bool:
        return (space, name) in self.data.objects

    def held(self, space: Space, name: str) -> bool:
        return self.is_sound(space, name)

    def put(self, space: Space, name: str, data: bytes, *, durable: bool = True) -> None:
        """Under the store's lock, as a sweep decides under it: a put beside a sweep in
        another thread changed the dicts it was walking ("dictionary changed size"). A
        name that is no object name is refused, as the other backends refuse it."""
        self.backend.require_writable()
        if not is_hash(name):
            raise not_an_object_name(name)
        key = (space, name)
        with self.data.lock:
            current = self.data.objects.get(key)
            if current is None or sha256_ref(current) != name:
                self.data.objects[key] = bytes(data)
            self.data.born[key] = time.time()  # written or held again: a sweep's grace counts from now

    def put_many(self, items: Iterable[tuple[Space, str, bytes]], *, count: int | None = None) -> None:
        for space, name, data in items:
            self.put(space, name, data)

    def hold(self, names: Iterable[tuple[Space, str]], *, written: set[str] = frozenset()) -> list[tuple[Space, str]]:  # type: ignore[assignment]
        missing = []
        with self.data.lock:  # as put: a sweep decides under it
            now = time.time()
            for space, name in names:
                if self.is_sound(space, name):
                    self.data.born[(space, name)] = now
                else:
                    missing.append((space, name))
        return missing

    def names(self, space: Space) -> Iterator[str]:
        for sp, name in list(self.data.objects):
            if sp == space:
                yield name

    def where(self, space: Space, name: str) -> str:
        return f"{self.backend.url} ({space})"

    def delete(self, space: Space, name: str) -> None:
        """Remove an object (a sweep's, which decided nothing retains it)."""
        self.data.objects.pop((space, name), None)


class MemorySessionLog(SessionLog):
    def __init__(self, backend: MemoryBackend, session: _SessionData, session_id: str, writable: bool):
        self.backend = backend
        self.session_id = session_id
        self.writable = writable
        self.stopped: str | None = None
        self._session = session  # this incarnation: one deleted and made again is another
        self._closed = False
        self._parked = False
        self._parked_at = 0

    def _data(self) -> _SessionData:
        data = self.backend.data.sessions.get(self.session_id)
        if data is None or data is not self._session:
            raise NoSuchSessionError(f"no such session: {self.session_id} (deleted since it was opened)")
        return data

    def _check(self) -> _SessionData:
        if self._closed:
            raise StoreError(f"session {self.session_id} is closed")
        if not self.writable:
            raise StoreError(f"session {self.session_id} is open read-only")
        data = self._data()
        if data.holder is not self:
            raise StoreError(f"session {self.session_id} is no longer held by this handle")
        return data

    def write(self, records: Sequence[Record], *, commit: bool) -> str | None:
        with self.backend.data.lock:
            data = self._check()
            for r in records:
                if isinstance(r, Append) and r.objects is not None:
                    chash, content, env = r.objects
                    self.backend.objects.put("contents", chash, content)
                    self.backend.objects.put("entries", r.entry, env)
                data.records.append(dict(record_data(r)))
            if commit:
                data.records.append({"op": "commit"})
                data.committed = len(data.records)
        return None

    def commit(self) -> None:
        with self.backend.data.lock:
            if not self.writable or self._closed:
                return
            data = self._check()
            if data.committed < len(data.records):
                data.records.append({"op": "commit"})
                data.committed = len(data.records)

    def set_indexes(self, head: str | None, mark: Mark) -> None:
        if not self.writable or self._closed or self._session.holder is not self:
            return
        self._session.head, self._session.mark = head, mark

    def set_header(self, header: bytes) -> None:
        self._check().header = bytes(header)

    def set_summary(self, summary: Mapping[str, Any]) -> None:
        if not self.writable or self._closed or self._session.holder is not self:
            return
        with self.backend.data.lock:
            self._session.summary = (dict(summary), len(self._session.records))

    def set_rule_state(self, state: Mapping[str, Any]) -> None:
        if not self.writable or self._closed or self._session.holder is not self:
            return
        with self.backend.data.lock:
            self._session.rule_state = copy.deepcopy(dict(state))  # (the domain's dict is not shared)

    def kept_rule_state(self) -> dict[str, Any] | None:
        with self.backend.data.lock:
            kept = self._session.rule_state
            return copy.deepcopy(kept) if kept is not None else None

    def park(self) -> bool:
        if not self.writable or self._closed:
            return False
        self.commit()
        with self.backend.data.lock:
            data = self._data()
            data.holder = None
            self._parked = True
            self._parked_at = len(data.records)
        return True

    def resume(self) -> bool:
        with self.backend.data.lock:
            data = self.backend.data.sessions.get(self.session_id)
            if not self._parked or data is not self._session:
                return False
            if data.holder is not None:
                raise SessionLockedError(f"session {self.session_id} is held by another writer")
            if len(data.records) != self._parked_at:
                return False
            data.holder = self
            self._parked = False
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self.backend.data.lock:
            if self._session.holder is self:
                self._session.holder = None


class MemorySessions(SessionStore):
    def __init__(self, backend: MemoryBackend):
        self.backend = backend
        self.data = backend.data

    def list(self) -> list[str]:
        return sorted(self.data.sessions)

    def exists(self, session_id: str) -> bool:
        return session_id in self.data.sessions

    def header(self, session_id: str) -> bytes | None:
        s = self.data.sessions.get(session_id)
        return s.header if s is not None else None

    def open(self, session_id: str, *, writable: bool) -> tuple[SessionLog, LogOpen]:
        with self.data.lock:
            s = self.data.sessions.get(session_id)
            if s is None:
                raise NoSuchSessionError(f"no such session: {session_id}")
            log = MemorySessionLog(self.backend, s, session_id, writable)
            if writable:
                self.backend.require_writable()
                if s.holder is not None:
                    raise SessionLockedError(f"session {session_id} is held by another writer")
                s.holder = log
                # What a crash would take: records after the last commit (none can be
                # pending here once their writer closed, but a handle dropped without
                # closing leaves them, and a reopen commits or drops them as a file does).
                if s.committed < len(s.records):
                    s.records.append({"op": "commit"})
                    s.committed = len(s.records)
            kept = dict(s.summary[0]) if s.summary is not None else None
            rules = copy.deepcopy(s.rule_state) if writable and s.rule_state is not None else None
            return log, LogOpen(s.header, [dict(r) for r in s.records], s.head, s.mark, [], kept, rules)

    def summary(self, session_id: str) -> tuple[dict[str, Any], bool] | None:
        with self.data.lock:
            s = self.data.sessions.get(session_id)
            if s is None or s.summary is None:
                return None
            return dict(s.summary[0]), s.summary[1] == len(s.records)

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
        with self.data.lock:
            if session_id in self.data.sessions:
                raise SessionExistsError(f"session {session_id} already exists")
            for eid, chash in prefix:
                for space, name in (("entries", eid), ("contents", chash)):
                    if not self.backend.objects.exists(space, name):  # type: ignore[arg-type]
                        raise StoreError(
                            f"prefix entry {eid[7:19]} of the fork's base is not held; nothing was created"
                        )
            self.backend.objects.put_many(objects)
            recs = [dict(record_data(r)) for r in records]
            s = _SessionData(bytes(header), recs, len(recs), head, mark)
            log = MemorySessionLog(self.backend, s, session_id, True)
            s.holder = log
            self.data.sessions[session_id] = s
            return log

    def history(self, session_id: str) -> LogHistory:
        s = self.data.sessions.get(session_id)
        if s is None:
            raise NoSuchSessionError(f"no such session: {session_id}")
        return LogHistory([dict(r) for r in s.records])

    def history_since(self, session_id: str, start: int, resume: Any = None) -> LogTail:
        """The records after the first ``start``, only those (``whole`` false) while
        ``resume`` names this incarnation at that count: a log here only grows. The note
        names the incarnation weakly: a note kept (a server keeps one for each of 256
        sessions) does not keep a deleted session's records alive."""
        with self.data.lock:
            s = self.data.sessions.get(session_id)
            if s is None:
                raise NoSuchSessionError(f"no such session: {session_id}")
            total = len(s.records)
            on = resume is not None and resume[0]() is s and resume[1] == start <= total
            return LogTail([dict(r) for r in s.records[start:]], total, (weakref.ref(s), total), whole=not on)

    def delete(self, session_id: str, log: SessionLog | None = None) -> None:
        self.backend.require_writable()
        with self.data.lock:
            s = self.data.sessions.get(session_id)
            if s is None:
                raise NoSuchSessionError(f"no such session: {session_id}")
            if s.holder is not None and s.holder is not log:
                raise SessionLockedError(f"session {session_id} is held by another writer")
            del self.data.sessions[session_id]
        if log is not None:
            log.close()


class MemoryRefs(RefStore):
    keeps_moves = True

    def __init__(self, data: MemoryData):
        self.data = data

    def record_move(self, name: str, move: Mapping[str, Any]) -> None:
        self.data.ref_moves.setdefault(name, []).append(dict(move))

    def moves(self, name: str) -> list[dict[str, Any]] | None:
        return [dict(m) for m in self.data.ref_moves.get(name, [])]

    def get(self, name: str) -> dict[str, Any] | None:
        r = self.data.refs.get(name)
        return dict(r) if r is not None else None

    def names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self.data.refs if n.startswith(prefix))

    @contextmanager
    def locked(self) -> Iterator[None]:
        with self.data.lock:
            yield

    def put(self, name: str, record: Mapping[str, Any]) -> None:
        self.data.refs[name] = dict(record)

    def delete(self, name: str) -> None:
        self.data.refs.pop(name, None)


class MemoryRemotes(RemoteStore):
    def __init__(self, data: MemoryData):
        self.data = data

    def get(self, url: str, kind: Literal["sessions", "refs"], name: str) -> dict[str, Any] | None:
        r = self.data.remotes.get((url, kind, name))
        return dict(r) if r is not None else None

    def put(self, url: str, kind: Literal["sessions", "refs"], name: str, record: Mapping[str, Any]) -> None:
        self.data.remotes[(url, kind, name)] = dict(record)

    def delete(self, url: str, kind: Literal["sessions", "refs"], name: str) -> None:
        self.data.remotes.pop((url, kind, name), None)


class MemoryBackend(Backend):
    """A store in memory; ``name`` shares it within the process (see the module)."""

    capabilities = Capabilities(persistent=False, packs=False, sweep=True, repair=True, migrate=False)

    def __init__(
        self, name: str | None = None, *, readonly: bool = False, create: bool = False, data: MemoryData | None = None
    ):
        self.name = name
        self.url = f"memory:{name}" if name else "memory:"
        self.readonly = readonly
        self.data = data if data is not None else memory_store(name, create=create)
        self.objects = MemoryObjects(self.data, self)
        self.sessions = MemorySessions(self)
        self.refs = MemoryRefs(self.data)
        self.remotes = MemoryRemotes(self.data)

    def describe(self) -> str:
        return f"the memory store {self.name}" if self.name else "the memory store"

    def require_writable(self) -> None:
        if self.readonly:
            raise ReadOnlyError(f"{self.describe()} is open read-only")

    def close(self) -> None:
        """Nothing to release: the data lives as long as the process (or its registry entry)."""

    def writers_holding(self) -> list[str] | None:
        """The sessions a writing handle (of any store on this data) holds now."""
        with self.data.lock:
            return sorted(sid for sid, s in self.data.sessions.items() if s.holder is not None)

    def retention_sources(self) -> Iterator[RetentionSource]:
        with self.data.lock:
            logs = [list(s.records) for s in self.data.sessions.values()]
        for records in logs:
            yield RetentionSource(records)

    def sweep_objects(
        self, compute: Callable[[bool], Retained], *, grace: float, dry_run: bool, wait: float,
        progress: Callable[[int, int], None] | None,
    ) -> tuple[RepackResult, int, list[str], Retained]:
        with self.data.lock:
            now = time.time()
            keys = list(self.data.objects)
            old = [k for k in keys if now - self.data.born.get(k, 0.0) >= grace]
            ret = compute(any(space == "blobs" for space, _ in old))
            retained = {"entries": ret.envelopes, "contents": ret.contents, "blobs": ret.blobs}
            result = RepackResult(dry_run=dry_run, loose_before=len(keys))
            result.bytes_before = sum(len(v) for v in self.data.objects.values())
            dropped = sorted({name for space, name in old if name not in retained[space]})
            for space, name in old:
                if name in retained[space]:
                    continue
                result.dropped_bytes += len(self.data.objects[(space, name)])
                if not dry_run:
                    del self.data.objects[(space, name)]
                    self.data.born.pop((space, name), None)
            result.dropped = len(dropped)
            result.dropped_names = dropped
            result.objects = len(self.data.objects) if not dry_run else len(keys) - len(dropped)
            result.bytes_after = sum(len(v) for v in self.data.objects.values())
            return result, len(keys) - len(old), [], ret

