"""The remote backend: a store served over HTTP (RFC 0003), opened as ``http://…`` or ``https://…``.

``open_store("https://host/")`` (and ``--store``, ``AGENTSESSION_STORE``) gives a
:class:`~agentsession_cas.store.Store` whose sessions live on an
``agentsession serve`` server. Every rule stays the domain's on both ends: the
client's :class:`~agentsession_cas.store.Session` checks an append as it would
locally, and the server checks it again before it lands (RFC 0003: a server
verifies everything it receives), so a refusal reads the same either way.

How the seam maps onto the protocol:

- **Objects**: ``GET``/``HEAD``/``PUT /v1/objects/…``, many read at once by this
  server's batch read (``POST /v1/objects/read``) where it offers one, every read
  verified against its name, with an object cache (objects never change under their hash: each is
  fetched once per store handle). An object this handle uploaded is reachable by
  no one until a push or an append names it (RFC 0003, Reach), so the cache serves
  it meanwhile.
- **Sessions**: a writable open is a **lease** (``POST …/lease``): one writer at a
  time, as a local hold; a second is refused ``session_locked``. Every write then
  carries the lease's fencing token, and the lease is renewed as the handle writes
  (past a third of its time to live) and released at close. A snapshot reads the
  log (``GET …/log``). Appends are ``POST …/entries`` with the entry's line, head
  moves ``PUT …/head``, marks ``POST …/handover`` (to mirror) and ``POST …/record``
  (to record); creation is ``POST /v1/sessions`` for an empty session and a push
  for one created whole (an import: its objects uploaded, then the closure).
- **Refs**: ``GET``/``PUT /v1/refs/…``; a change made inside :meth:`RemoteRefs.locked`
  sends what the handle read there as ``expected``, so the domain's compare-and-swap
  is the server's.
- **Remote state** (what this store remembers of its own remotes) is kept in the
  handle's memory: the protocol carries none, and each record is a hint that a lost
  write only costs re-learning.

What the protocol does not carry is refused with :class:`UnsupportedError`: listing
every object, sweep, repair and the rest of local maintenance (RFC 0003, "Out of
scope"), and admitting entries into a mirror except by a push to the server.

The log a client sees is the log read's lines, not the server's records: an
append line is an ``append`` record, a head line a ``head`` record, one ``commit``
after the last durable line, and the ``create`` record carries the mark the server
reports (mark changes are not lines of the log read).
"""

from __future__ import annotations

import builtins
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from ..errors import (
    AgentSessionError,
    CorruptObjectError,
    LeaseLostError,
    MirrorError,
    NoSuchObjectError,
    NoSuchSessionError,
    ReadOnlyError,
    SessionExistsError,
    StoreError,
    TransportError,
    UnsupportedError,
)
from ..exchange.http_client import HttpTransport
from ..exchange.transport import PushRequest
from ..exchange.wire import OUTCOMES, frame_problem
from ..format.canonical import canonical_bytes, loads
from ..format.entry import FORMAT_WRITTEN
from ..format.hashing import line_from_objects, sha256_ref
from .base import (
    Append,
    Backend,
    Capabilities,
    LogHistory,
    LogOpen,
    Mark,
    ObjectStore,
    Record,
    RefStore,
    RepackResult,
    Retained,
    RetentionSource,
    SessionLog,
    SessionStore,
    Space,
    record_data,
)
from .memory import MemoryData, MemoryRemotes

__all__ = ["LEASE_TTL_MS", "RemoteBackend", "records_from_log"]

#: How long a writable open's lease lives (renewed as the handle writes, past a third of it).
LEASE_TTL_MS = 5 * 60 * 1000
#: Bytes of objects one handle keeps in its cache.
CACHE_BYTES = 64 * 1024 * 1024
#: Lazy appends a handle holds before it sends them as one batch, and their bytes.
BATCH_ENTRIES = 256
BATCH_BYTES = 1024 * 1024
#: Seconds a held lazy append waits at most before it is sent (so followers see it).
FLUSH_DELAY_S = 0.005
#: Seconds a flusher's worker beyond the two idle ones waits for a batch before it ends.
FLUSH_IDLE_S = 1.0
#: The log read's outcomes, back to what the record says: (head moved, a leaf label).
_OUTCOME_RECORD: dict[str, tuple[bool, bool]] = {
    "continued": (True, False),
    "branched": (False, False),
    "leaf_moved": (True, True),
    "leaf_not_moved": (False, True),
}
_FROM_WIRE_OUTCOME = {wire: lib for lib, wire in OUTCOMES.items()}


def _sid(session_id: str) -> str:
    return quote(session_id, safe="")


def _held_size(rec: Append) -> int:
    """The bytes of a held append's objects (what :data:`BATCH_BYTES` counts)."""
    return 0 if rec.objects is None else len(rec.objects[1]) + len(rec.objects[2])


def records_from_log(session_id: str, frames: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the session's facts, its log as records) from a log read's frames (see the module)."""
    view = next((f["session"] for f in frames if isinstance(f.get("session"), dict)), None)
    if view is None:
        raise StoreError(f"the log of session {session_id} the server sent names no session")
    mark = "record" if view.get("mark") == "record" else "mirror"
    records: list[dict[str, Any]] = [{"op": "create", "session": session_id, "base": view.get("base"), "mark": mark}]
    lines = [f for f in frames if "cursor" in f and not f.get("end")]
    last_durable = max((i for i, f in enumerate(lines) if f.get("durable")), default=-1)
    for i, line in enumerate(lines):
        if isinstance(line.get("entry"), str):
            moved, leaf = _OUTCOME_RECORD.get(str(line.get("outcome")), (False, False))
            rec: dict[str, Any] = {"op": "append", "seq": line.get("seq"), "entry": line["entry"]}
            if moved:
                rec["head"] = line.get("head")
            if not line.get("durable"):
                rec["lazy"] = True
            if leaf:
                rec["leaf_label"] = True
            records.append(rec)
        else:
            records.append({"op": "head", "head": line.get("head")})
        if i == last_durable:
            records.append({"op": "commit"})
    return view, records


class RemoteObjects(ObjectStore):
    """Objects over ``/v1/objects``, cached by name (see the module)."""

    def __init__(self, backend: RemoteBackend):
        self.backend = backend
        self._cache: OrderedDict[tuple[Space, str], bytes] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()

    def _path(self, space: Space, name: str) -> str:
        return f"/objects/{'media' if space == 'blobs' else space}/{name}"

    def remember(self, space: Space, name: str, data: bytes) -> None:
        """Keep sound bytes in the cache (the least recently used go past :data:`CACHE_BYTES`)."""
        with self._lock:
            key = (space, name)
            if key in self._cache:
                self._cache.move_to_end(key)
                return
            self._cache[key] = data
            self._cached_bytes += len(data)
            while self._cached_bytes > CACHE_BYTES and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cached_bytes -= len(old)

    def cached(self, space: Space, name: str) -> bytes | None:
        with self._lock:
            return self._cache.get((space, name))

    def get(self, space: Space, name: str) -> bytes:
        data = self.cached(space, name)
        if data is not None:
            return data
        try:
            data = self.backend.http.get_object(space, name)  # (streamed, within the object limit)
        except NoSuchObjectError:
            raise self._absent(space, name) from None
        self.remember(space, name, self._checked(space, name, data))
        return data

    def _checked(self, space: Space, name: str, data: bytes) -> bytes:
        """``data``, which the server sent as ``name``; CorruptObjectError unless it hashes to it."""
        if sha256_ref(data) != name:
            raise CorruptObjectError(
                f"corrupt object: the server sent {space} object {name} with bytes that do not hash to it",
                space=space, name=name, path=self.where(space, name),
            )
        return data

    def _absent(self, space: Space, name: str) -> NoSuchObjectError:
        return NoSuchObjectError(f"no {space} object {name} in {self.backend.describe()} (that this caller may read)")

    def get_many(self, space: Space, names: Sequence[str]) -> list[bytes]:
        """The names not cached read in batches (``POST /v1/objects/read``, where the server
        offers it: one request for thousands of objects, not a GET each), each verified."""
        out: list[bytes | None] = [self.cached(space, name) for name in names]
        lacking = list(dict.fromkeys(name for name, data in zip(names, out) if data is None))
        if len(lacking) <= 1:
            return [data if data is not None else self.get(space, name) for name, data in zip(names, out)]
        got: dict[str, bytes] = {}
        try:
            for _, name, data in self.backend.http.get_objects([(space, name) for name in lacking]):
                got[name] = self._checked(space, name, data)
        except NoSuchObjectError:
            raise self._absent(space, next(n for n in lacking if n not in got)) from None
        for name, data in got.items():
            self.remember(space, name, data)
        return [data if data is not None else got[name] for name, data in zip(names, out)]

    def exists(self, space: Space, name: str) -> bool:
        if self.cached(space, name) is not None:
            return True
        response = self.backend.http.request("HEAD", self._path(space, name), safe=True, ok=(404,))
        return response.status_code == 200

    def held(self, space: Space, name: str) -> bool:
        return self.exists(space, name)

    def put(self, space: Space, name: str, data: bytes, *, durable: bool = True) -> None:
        self.put_many([(space, name, data)], count=1)

    def put_many(self, items: Iterable[tuple[Space, str, bytes]], *, count: int | None = None) -> None:
        self.backend.require_writable()
        batch = [(space, name, bytes(data)) for space, name, data in items]
        if not batch:
            return
        self.backend.http.put_objects(batch, len(batch))
        for space, name, data in batch:  # the server verified each (bad_object otherwise)
            self.remember(space, name, data)

    def hold(self, names: Iterable[tuple[Space, str]], *, written: set[str] = frozenset()) -> list[tuple[Space, str]]:  # type: ignore[assignment]
        """The server holds what a record names once the record lands (its own append
        holds them): what is missing is what this caller cannot see there."""
        return [(space, name) for space, name in names if not self.exists(space, name)]

    def names(self, space: Space) -> Iterator[str]:
        raise UnsupportedError(f"{self.backend.describe()} does not list its objects (RFC 0003 carries no such call)")

    def where(self, space: Space, name: str) -> str:
        return f"{self.backend.url}v1{self._path(space, name)}"


class RemoteSessionLog(SessionLog):
    """One session on the server: a lease for writing, or a snapshot (see the module)."""

    def __init__(self, backend: RemoteBackend, session_id: str, *, writable: bool, head: str | None,
                 lease: dict[str, Any] | None):
        self.backend = backend
        self.session_id = session_id
        self.writable = writable
        self.stopped: str | None = None
        self._head = head
        self._lease = lease
        self._renewed = time.monotonic()
        self._closed = False
        #: Lazy appends not sent yet, their objects' bytes, and a failure to send them.
        self._held: list[Append] = []
        self._held_bytes = 0
        self._failed: AgentSessionError | None = None
        self._applied = 0
        # Two locks, taken in this order. ``_wire`` is held while this session's writes
        # are on their way to the server, their retries' waits included (a lost answer,
        # a 503's Retry-After: up to the client's bound, a minute by default). That is on
        # purpose: the server must see the log in order, so another send, a commit, a
        # head move, a close, and a read of the session through this backend (which sends
        # what is held first, so a writer reads its writes) must wait for the send on its
        # way. ``_lock`` guards what is held and the failure, and is never held while
        # talking to the server, so a lazy append that does not fill the batch is held
        # and answered at once even while another thread's send waits to go again (it
        # waited for the whole retry before this release).
        self._wire = threading.RLock()
        self._lock = threading.Lock()
        if writable:
            backend.flusher.track(self)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the lease -------------------------------------------------------------------

    def _token(self) -> dict[str, str]:
        """The fencing header every write carries; renews the lease past a third of its life."""
        if self._closed:
            raise StoreError(f"session {self.session_id} is closed")
        if not self.writable:
            raise ReadOnlyError(f"session {self.session_id} is open read-only")
        if self._lease is None:
            raise MirrorError(
                f"session {self.session_id} is a mirror at {self.backend.url}; it is written only by a push to it"
            )
        ttl = float(self._lease.get("ttl_ms", LEASE_TTL_MS)) / 1000
        if time.monotonic() - self._renewed > ttl / 3:
            renewed = self.backend.http.answer(
                "PUT", f"/sessions/{_sid(self.session_id)}/lease", safe=True,
                headers={"Lease-ID": str(self._lease["lease_id"])}, json={"ttl_ms": self._lease.get("ttl_ms")},
            )
            self._lease.update(renewed)
            self._renewed = time.monotonic()
        return {"Lease-Token": str(self._lease["token"])}

    # -- writing ----------------------------------------------------------------------

    def write(self, records: Sequence[Record], *, commit: bool) -> str | None:
        """Appends that need no commit are held and sent together (see :meth:`flush`);
        anything else sends what is held first, so the server sees the log in order.
        Appends that need no commit and leave the batch short of full are only held,
        under ``_lock`` alone (see ``__init__``)."""
        appends = [a for a in records if isinstance(a, Append)]
        if not commit and self._lease is not None and len(appends) == len(records):
            with self._lock:
                self._check_failed()
                size = sum(_held_size(a) for a in appends)
                if len(self._held) + len(appends) < BATCH_ENTRIES and self._held_bytes + size < BATCH_BYTES:
                    for a in appends:
                        self._hold(a)
                    self.backend.flusher.due(self, FLUSH_DELAY_S)
                    return None
        with self._wire:
            self._check_failed()
            if self._lease is None:  # a mirror: refused now (or a mark change sent now), nothing held
                self._write_now(records, commit=commit)
                return None
            own = 0  # this call's appends held since the last send
            for rec in records:
                if isinstance(rec, Append):
                    with self._lock:
                        self._hold(rec)
                    own += 1
                    continue
                self._send(commit=False, own=own)
                own = 0
                self._record(record_data(rec))
            if commit:
                if self._held:
                    self._send(commit=True, own=own)
                else:
                    self._commit()
            elif self._held_bytes >= BATCH_BYTES or len(self._held) >= BATCH_ENTRIES:
                self._send(commit=False, own=own)
            elif self._held:
                self.backend.flusher.due(self, FLUSH_DELAY_S)
        return None

    def _write_now(self, records: Sequence[Record], *, commit: bool) -> None:
        pending: list[Append] = []
        for rec in records:
            if isinstance(rec, Append):
                pending.append(rec)
                continue
            self._append(pending, commit=False)
            pending = []
            self._record(record_data(rec))
        self._append(pending, commit=commit)

    def _hold(self, rec: Append) -> None:
        """Keep a lazy append to send with the next batch (under ``_lock``); its objects
        go to the cache, so this handle reads them before the server has them."""
        if rec.objects is not None:
            chash, content, env = rec.objects
            self.backend.objects.remember("contents", chash, content)
            self.backend.objects.remember("entries", rec.entry, env)
        self._held_bytes += _held_size(rec)
        self._held.append(rec)

    def flush(self) -> None:
        """Send the appends held so far (one ``POST …/entries``, RFC 0003's batch form).
        Called when a batch is full, after :data:`FLUSH_DELAY_S` by the backend's flusher,
        and before anything else this handle or its backend does with the session."""
        with self._wire:
            self._check_failed()
            self._send(commit=False, own=0)

    def _flush_due(self) -> None:
        """The flusher's call: a failure is kept and raised at this handle's next call."""
        with self._wire:
            if self._failed is not None or self._closed:
                return
            try:
                self._send(commit=False, own=0)
            except AgentSessionError:
                pass  # kept in self._failed by _send

    def _check_failed(self) -> None:
        if self._failed is not None:
            raise self._failed

    def _send(self, *, commit: bool, own: int) -> None:
        """Send what is held (under ``_wire``). ``own``: how many of the held appends, the
        last ones, the current call made; earlier calls made the rest, and their callers
        were answered already. A refusal of only the current call's appends, none stored,
        is that call's error: the domain takes them back. Any other failure stops the
        handle: the domain counted in appends the server may not hold (and those held
        while this batch was on its way, which are never sent), and every later call
        (close included) raises it."""
        with self._lock:
            batch, self._held, self._held_bytes = self._held, [], 0
        if not batch:
            return
        self._applied = 0
        try:
            self._append(batch, commit=commit)
        except AgentSessionError as exc:
            if own == len(batch) and self._applied == 0 and not isinstance(exc, TransportError):
                raise
            with self._lock:  # no append is held once the failure is set (write checks it)
                since = len(self._held)
                more = f", and {since} held since {'was' if since == 1 else 'were'} not sent" if since else ""
                exc.args = (f"session {self.session_id}: {len(batch)} append(s) from {batch[0].entry} on were sent and "
                            f"{self._applied} stored{more}: {exc}; reopen the session to see what the server holds",)
                self._failed = exc
            raise

    def _line(self, rec: Append) -> bytes:
        if rec.objects is not None:
            _, content, env = rec.objects
        else:
            objects = self.backend.objects
            env = objects.get("entries", rec.entry)
            content = objects.get("contents", str(loads(env).get("content")))
        return line_from_objects(rec.entry, loads(env), content)

    def _append(self, batch: list[Append], *, commit: bool) -> None:
        """One ``POST …/entries`` for the batch; the server's outcome must be the one the
        domain decided (it checked the same log), else the handle stops."""
        if not batch:
            return
        headers = self._token()
        body = b"".join(self._line(r) for r in batch)
        # Under an Idempotency-Key, sent again when no answer came (RFC 0003, Retries): the
        # server replays the first answer, so the outcomes and seqs read below are the ones
        # the batch had, never `held` for an append that landed before its answer was lost.
        answer = self.backend.http.answer(
            "POST", f"/sessions/{_sid(self.session_id)}/entries", safe=False, keyed=True, content=body,
            params={"commit": "true" if commit else "false"},
            headers=dict(headers, **{"Session-Format": FORMAT_WRITTEN, "Content-Type": "application/x-ndjson"}),
        )
        results = answer.get("results") or []
        self._applied = len(results)
        for rec, got in zip(batch, results, strict=False):
            if rec.objects is not None:
                chash, content, env = rec.objects
                self.backend.objects.remember("contents", chash, content)
                self.backend.objects.remember("entries", rec.entry, env)
            if got.get("id") != rec.entry or got.get("seq") != rec.seq:
                self.stopped = (f"the server recorded {got.get('id')} as seq {got.get('seq')} where this handle "
                                f"wrote {rec.entry} as seq {rec.seq}")
                raise StoreError(f"session {self.session_id}: {self.stopped}; reopen it")
        stopped = answer.get("stopped")
        if stopped is not None:
            problem = stopped.get("problem") if isinstance(stopped, dict) else None
            raise frame_problem(problem, where=f"remote {self.backend.url}")
        if len(results) != len(batch):
            raise StoreError(f"session {self.session_id}: the server answered {len(results)} of {len(batch)} appends")
        self._head = answer.get("head", self._head)

    def _record(self, rec: dict[str, Any]) -> None:
        """A head move under the lease; a mark change with the lease's token when there is
        one (a mirror has none: declaring the record needs write scope, not a lease)."""
        op = rec.get("op")
        sid = _sid(self.session_id)
        if op == "head":  # keyed: a retry gets the first answer, not `head_moved` for its own move
            self.backend.http.request("PUT", f"/sessions/{sid}/head", safe=False, keyed=True, headers=self._token(),
                                      json={"expected": self._head, "to": rec.get("head"), "durable": True})
            self._head = rec.get("head")
            return
        if op == "commit":
            return
        if op != "mark" or rec.get("mark") not in ("record", "mirror"):
            raise UnsupportedError(f"{self.backend.describe()} takes no {op!r} record from a client")
        if self._closed or not self.writable:
            raise ReadOnlyError(f"session {self.session_id} is open read-only")
        headers = self._token() if self._lease is not None else {}
        if rec["mark"] == "mirror":
            self.backend.http.request("POST", f"/sessions/{sid}/handover", safe=False, keyed=True, headers=headers,
                                      json={"to": "client", "head": self._head})
        else:
            self.backend.http.request("POST", f"/sessions/{sid}/record", safe=False, keyed=True, headers=headers,
                                      json={"basis": "sole_copy", "head": self._head})
            if self._lease is None:  # the record now: this writer leases it, as an open would
                self._lease = self.backend.sessions.acquire(self.session_id)
                self._renewed = time.monotonic()

    def commit(self) -> None:
        if not self.writable or self._closed or self._lease is None:
            return
        with self._wire:
            self._check_failed()
            if self._held:
                self._send(commit=True, own=0)
            else:
                self._commit()

    def _commit(self) -> None:
        self.backend.http.request("POST", f"/sessions/{_sid(self.session_id)}/commit", safe=True, keyed=True,
                                  headers=self._token())

    def set_indexes(self, head: str | None, mark: Mark) -> None:
        """The server keeps its own indexes; nothing to do."""

    def set_header(self, header: bytes) -> None:
        """The server raises the header's format itself, before the append that carries a
        later one (``Session-Format``): nothing to send."""

    def lease_holder(self) -> dict[str, Any] | None:
        return self._lease

    def close(self) -> None:
        if self._closed:
            return
        self.backend.flusher.forget(self)
        try:
            with self._wire:
                if self._failed is None and self._held and self._lease is not None:
                    self._send(commit=False, own=0)
        except AgentSessionError:
            pass  # the session's close committed first and raised what failed; this only lets go
        finally:
            self._release()

    def _release(self) -> None:
        self._closed = True
        self._held = []
        lease, self._lease = self._lease, None
        if lease is None:
            return
        try:
            self.backend.http.request("DELETE", f"/sessions/{_sid(self.session_id)}/lease", safe=True,
                                      headers={"Lease-ID": str(lease["lease_id"])})
        except (LeaseLostError, NoSuchSessionError):
            pass  # expired, broken or its session deleted: nothing is held any more


class Flusher:
    """What sends the backend's held appends once they have waited :data:`FLUSH_DELAY_S`,
    and the handles open for writing, so a read of a session through the backend first
    sends what its writer here holds (reads see the writes).

    Each due handle's batch is sent by a worker thread of its own: a batch that waits
    (for its answer, or to be sent again: a server's ``Retry-After``, up to the client's
    bound) holds up no other session's. A handle is given to one worker at a time (its
    batches go in its log's order: ``_wire``), and one made due again meanwhile waits
    for that worker to finish. A worker that takes a batch while no other is idle
    starts one, so a due handle always finds one; two of those left idle stay for the
    next batches (a writer's next batch starts no thread), the others end after
    :data:`FLUSH_IDLE_S`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[RemoteSessionLog, float] = {}
        self._sending: set[RemoteSessionLog] = set()
        self._open: dict[str, RemoteSessionLog] = {}
        self._workers: set[threading.Thread] = set()
        self._idle = 0
        self._stop = False

    def track(self, log: RemoteSessionLog) -> None:
        with self._cond:
            self._open[log.session_id] = log

    def forget(self, log: RemoteSessionLog) -> None:
        with self._cond:
            self._due.pop(log, None)
            if self._open.get(log.session_id) is log:
                del self._open[log.session_id]

    def flush(self, session_id: str) -> None:
        """Send what the writer of ``session_id`` here holds, if there is one."""
        with self._cond:
            log = self._open.get(session_id)
        if log is not None and not log.closed:
            log.flush()

    def due(self, log: RemoteSessionLog, delay: float) -> None:
        """Send what ``log`` holds after ``delay`` seconds (unless it was sent before)."""
        with self._cond:
            if log in self._due or self._stop:
                return
            self._due[log] = time.monotonic() + delay
            if not self._workers:
                self._start_worker()
            self._cond.notify_all()

    def _start_worker(self) -> None:
        """(under ``_cond``)"""
        worker = threading.Thread(target=self._work, name="agentsession-remote-flush", daemon=True)
        self._workers.add(worker)
        worker.start()

    def _next(self) -> RemoteSessionLog | None:
        """(under ``_cond``) The next due handle no worker is sending, once it is due; None
        when the flusher closes, or when this worker has waited :data:`FLUSH_IDLE_S` for one
        while two others wait too."""
        self._idle += 1
        try:
            while not self._stop:
                now = time.monotonic()
                free = {log: at for log, at in self._due.items() if log not in self._sending}
                ready = min(free, key=free.__getitem__, default=None)
                if ready is not None and free[ready] <= now:
                    del self._due[ready]
                    return ready
                wait = free[ready] - now if ready is not None else None
                if self._idle > 2 and (wait is None or wait > FLUSH_IDLE_S):
                    if not self._cond.wait(FLUSH_IDLE_S) and self._idle > 2:
                        return None  # two others are idle: they take the next batches
                    continue
                self._cond.wait(wait)
            return None
        finally:
            self._idle -= 1

    def _work(self) -> None:
        with self._cond:
            try:
                while (log := self._next()) is not None:
                    self._sending.add(log)
                    if self._idle == 0:
                        self._start_worker()  # so the next due handle need not wait for this send
                    self._cond.release()
                    try:
                        log._flush_due()
                    finally:
                        self._cond.acquire()
                        self._sending.discard(log)
                        self._cond.notify_all()  # the handle may be due again; another may end
            finally:  # (a worker gone, the next due() starts one if none is left)
                self._workers.discard(threading.current_thread())

    def close(self) -> None:
        """Stop taking batches and wait for the sends on their way (their handles keep a
        failure for their next call)."""
        with self._cond:
            self._stop = True
            self._due.clear()
            self._cond.notify_all()
            workers = list(self._workers)
        for worker in workers:
            worker.join()


class RemoteSessions(SessionStore):
    def __init__(self, backend: RemoteBackend):
        self.backend = backend

    def list(self) -> list[str]:
        frames = self.backend.http.ndjson("/sessions")
        return sorted(str(f["id"]) for f in frames if isinstance(f.get("id"), str))

    def exists(self, session_id: str) -> bool:
        return self.header(session_id) is not None

    def header(self, session_id: str) -> bytes | None:
        header = self.backend.http.session_header(session_id)
        return None if header is None else canonical_bytes(header) + b"\n"

    def _log(self, session_id: str) -> tuple[dict[str, Any], builtins.list[dict[str, Any]]]:
        self.backend.flusher.flush(session_id)
        return records_from_log(session_id, self.backend.http.ndjson(f"/sessions/{_sid(session_id)}/log"))

    def acquire(self, session_id: str) -> dict[str, Any] | None:
        """A lease on the session (None for a mirror, which the server never leases)."""
        try:
            return self.backend.http.answer(
                "POST", f"/sessions/{_sid(session_id)}/lease", safe=False, keyed=True,  # a lost answer is asked again
                json={"holder": self.backend.holder, "ttl_ms": LEASE_TTL_MS},
            )
        except MirrorError:
            return None

    def open(self, session_id: str, *, writable: bool) -> tuple[SessionLog, LogOpen]:
        lease = None
        if writable:
            self.backend.require_writable()
            lease = self.acquire(session_id)
        try:
            view, records = self._log(session_id)
        except BaseException:
            if lease is not None:
                RemoteSessionLog(self.backend, session_id, writable=True, head=None, lease=lease).close()
            raise
        log = RemoteSessionLog(self.backend, session_id, writable=writable, head=view.get("head"), lease=lease)
        return log, LogOpen(canonical_bytes(view["header"]) + b"\n", records)

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
        """An empty record is ``POST /v1/sessions`` with a lease (a fork's prefix is the
        server's to hold); one created whole, or a mirror, is a push of its closure."""
        self.backend.require_writable()
        http = self.backend.http
        data = loads(header)
        appends = [r for r in records if isinstance(r, Append)]
        if not appends and mark == "record":
            if self.exists(session_id):
                raise SessionExistsError(f"session {session_id} already exists")
            facts = http.answer("POST", "/sessions", safe=False, keyed=True, json=data,
                                params={"lease_ttl_ms": str(LEASE_TTL_MS), "holder": self.backend.holder})
            if facts.get("header") != data:
                raise SessionExistsError(f"session {session_id} already exists")
            return RemoteSessionLog(self.backend, session_id, writable=True, head=facts.get("head"),
                                    lease=facts.get("lease"))
        if self.exists(session_id):
            raise SessionExistsError(f"session {session_id} already exists")
        self.backend.objects.put_many(objects)
        base = data.get("base")
        chain: builtins.list[str] = []
        if isinstance(base, str):
            at: str | None = base
            while at is not None:  # root..base from the envelopes (the prefix is held there)
                chain.append(at)
                parent = loads(self.backend.objects.get("entries", at)).get("parent")
                at = parent if isinstance(parent, str) else None
            chain.reverse()
        http.push(PushRequest(header=data, prefix=chain, entries=[r.entry for r in appends], to=head, expected=base,
                              force=False, mark=mark, refs=[]))
        if mark == "record":
            return self.open(session_id, writable=True)[0]
        return RemoteSessionLog(self.backend, session_id, writable=True, head=head, lease=None)

    def history(self, session_id: str) -> LogHistory:
        return LogHistory(self._log(session_id)[1])

    def delete(self, session_id: str, log: SessionLog | None = None) -> None:
        """``DELETE`` under the lease: the caller's handle's, else one taken for it."""
        self.backend.require_writable()
        mine = isinstance(log, RemoteSessionLog) and log.lease_holder() is not None
        handle = log if mine else None
        if handle is None:
            if not self.exists(session_id):
                raise NoSuchSessionError(f"no such session: {session_id}")
            lease = self.acquire(session_id)
            if lease is None:
                raise MirrorError(f"session {session_id} is a mirror at {self.backend.url}; only its record deletes it")
            handle = RemoteSessionLog(self.backend, session_id, writable=True, head=None, lease=lease)
        assert isinstance(handle, RemoteSessionLog)
        refused = False
        try:
            handle.flush()
            self.backend.http.request("DELETE", f"/sessions/{_sid(session_id)}", safe=False, keyed=True,
                                      headers=handle._token())
        except AgentSessionError:
            refused = True
            raise
        finally:
            if not (refused and handle is log):  # a refusal leaves the caller's lease held
                handle.close()
        if log is not None and log is not handle:
            log.close()


class RemoteRefs(RefStore):
    """Refs over ``/v1/refs``; see :meth:`locked` for the compare-and-swap."""

    def __init__(self, backend: RemoteBackend):
        self.backend = backend
        self._local = threading.local()

    def _read(self) -> dict[str, str | None] | None:
        return getattr(self._local, "read", None)

    def get(self, name: str) -> dict[str, Any] | None:
        facts = self.backend.http.resolve_ref(name)
        record = None if facts is None else {"ident": facts.get("incarnation"), "name": name,
                                             "session": facts["target"]["session"]}
        read = self._read()
        if read is not None and name not in read:
            read[name] = record["session"] if record is not None else None
        return record

    def names(self, prefix: str = "") -> list[str]:
        frames = self.backend.http.ndjson("/refs", params={"prefix": prefix})
        return sorted(str(f["name"]) for f in frames if isinstance(f.get("name"), str))

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Not a hold (the server orders ref changes): what is read inside is remembered
        and sent as each change's ``expected``, so the server refuses (``ref_moved``) a
        change another client made since."""
        self._local.read = {}
        try:
            yield
        finally:
            self._local.read = None

    @property
    def keeps_moves(self) -> bool:  # type: ignore[override]
        return bool(self.backend.http.capabilities().get("features", {}).get("ref_log"))

    def moves(self, name: str) -> list[dict[str, Any]] | None:
        """The server's ref log (newest first on the wire), oldest first as the seam has it;
        the server records each change itself."""
        if not self.keeps_moves:
            return None
        frames = self.backend.http.ndjson(f"/refs/{name}", params={"view": "log"})
        out = []
        for f in reversed([f for f in frames if not f.get("end")]):
            old, new = f.get("old") or {}, f.get("new") or {}
            out.append({"name": name, "old": old.get("session"), "new": new.get("session"),
                        "ident": f.get("incarnation"), "at": f.get("at"), "reason": f.get("reason")})
        return out

    def _update(self, name: str, nxt: str | None) -> None:
        self.backend.require_writable()
        read = self._read()
        expected = read.get(name) if read is not None else None
        self.backend.http.request("PUT", f"/refs/{name}", safe=False, keyed=True,
                                  json={"expected": expected, "next": nxt})

    def put(self, name: str, record: Mapping[str, Any]) -> None:
        self._update(name, str(record["session"]))

    def delete(self, name: str) -> None:
        self._update(name, None)


class RemoteBackend(Backend):
    """A store behind an RFC 0003 server (see the module)."""

    capabilities = Capabilities(persistent=True, packs=False, sweep=False, repair=False, migrate=False)
    objects: RemoteObjects
    sessions: RemoteSessions

    def __init__(self, url: str, *, readonly: bool = False, create: bool = False, token: str | None = None):
        """``create`` asks nothing more: a server's store exists as long as it serves it
        (``agentsession init`` and ``serve`` make one). A URL where no server answers is
        refused here, as a directory holding no store is."""
        self.http = HttpTransport(url, token=token)
        self.url = self.http.url
        self.readonly = readonly
        self.holder = f"agentsession pid {os.getpid()}"
        try:
            caps = self.http.capabilities()
        except BaseException:
            self.http.close()
            raise
        if caps.get("protocol") != "agentsession-store/1":
            self.http.close()
            raise StoreError(f"{url} does not answer as an agentsession store (RFC 0003 capabilities)")
        self.objects = RemoteObjects(self)
        self.sessions = RemoteSessions(self)
        self.refs = RemoteRefs(self)
        self.flusher = Flusher()
        self.remotes = MemoryRemotes(MemoryData())  # hints, in this handle's memory (see the module)

    def describe(self) -> str:
        return f"the store at {self.url}"

    def require_writable(self) -> None:
        if self.readonly:
            raise ReadOnlyError(f"{self.describe()} is open read-only")

    def close(self) -> None:
        self.flusher.close()
        self.http.close()

    def writers_holding(self) -> list[str] | None:
        return None

    def follow_stream(self) -> HttpTransport:
        """The server's follow stream carries each change as it commits (no polling)."""
        return self.http

    def retention_sources(self) -> Iterator[RetentionSource]:
        raise UnsupportedError(f"{self.describe()}: sweep is the server's maintenance (run it where the store is)")

    def sweep_objects(
        self, compute: Callable[[bool], Retained], *, grace: float, dry_run: bool, wait: float,
        progress: Callable[[int, int], None] | None,
    ) -> tuple[RepackResult, int, list[str], Retained]:
        raise UnsupportedError(f"{self.describe()}: sweep is the server's maintenance (run it where the store is)")

