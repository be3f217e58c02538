"""The storage seam: what the store's domain asks of whatever holds its bytes.

The domain (:mod:`agentsession_cas.store`, exchange, the rules of fsck and
sweep) decides *what* is written and *whether* it may be; a backend decides
*how* it is kept. The domain talks to a backend only through the abstract
classes here, as dulwich's object-store ladder and borgstore's backend base
do, so a new backend is one class per interface and passes the same
contract suite (``tests/test_contract.py``).

A backend is five parts:

- :class:`ObjectStore`: objects named by their SHA-256 in three spaces
  (RFC 0002: envelopes, contents, media blobs), every read verified.
- :class:`SessionStore` and :class:`SessionLog`: sessions, each a header and
  a log of records that is its write-ahead log and commit point. A log
  handle is opened for writing (an exclusive hold: one writer per session)
  or as a read-only snapshot; recovery after a crash is the backend's,
  since only it knows what a crash can leave in its medium.
- :class:`RefStore`: named refs, replaced under one store-wide hold so a
  compare-and-swap sees every name.
- :class:`RemoteStore`: what this store remembers of each remote it
  exchanged with (hints a push re-learns).
- Maintenance hooks on :class:`Backend` (pack, the physical half of sweep,
  fsck and repair), which a backend may answer with "nothing to do".

Records cross the seam as plain JSON objects (``dict`` with an ``op``),
except the hot path's :class:`Append`, which a backend encodes as it likes.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from dataclasses import asdict, field
from typing import Any, Literal, Protocol, overload, runtime_checkable

from ..format.hashing import HASH_PREFIX, all_hashes, raw_hash
from ..lean import dataclass
from .digests import EntryDigests

__all__ = [
    "COMMIT_POINTS",
    "SPACES",
    "Space",
    "Mark",
    "Append",
    "CreatedRecords",
    "Record",
    "LogHistory",
    "LogOpen",
    "ObjectStage",
    "ObjectStore",
    "SessionLog",
    "SessionStore",
    "RefStore",
    "RemoteStore",
    "Backend",
    "Capabilities",
    "FsckProblem",
    "FsckReport",
    "RepackResult",
    "Names",
    "Retained",
    "RetentionSource",
    "SEVERITIES",
    "record_data",
]

#: The three hash spaces RFC 0002 names.
Space = Literal["entries", "contents", "blobs"]
SPACES: tuple[Space, ...] = ("entries", "contents", "blobs")

#: Objects :meth:`ObjectStore.read_all` reads at once by default (a projection's walk reads so many).
_READ_ALL_CHUNK = 256
#: A session's record mark (RFC 0002 "One store of record").
Mark = Literal["record", "mirror"]
#: The records that commit everything before them: a crash never takes what precedes
#: one, and a reader serves another writer's log only up to the last one. ``snapshot``
#: is what a compacted log holds in place of committed records (files backend).
COMMIT_POINTS = frozenset({"create", "commit", "snapshot"})


@dataclass(slots=True)
class Append:
    """An ``append`` record as the domain hands it to a log: the hot path, so not a dict.

    ``objects`` is (content hash, content bytes, envelope bytes) for an append
    whose objects the backend has not stored yet (a local append), or None when
    they are already durable in the object store (an import, exchange)."""

    seq: int
    entry: str
    head: str | None
    head_moved: bool
    leaf_label: bool
    lazy: bool
    objects: tuple[str, bytes, bytes] | None = None

    def as_record(self) -> dict[str, Any]:
        """The record as JSON members (what the log holds, payload aside)."""
        out: dict[str, Any] = {"op": "append", "seq": self.seq, "entry": self.entry}
        if self.head_moved:
            out["head"] = self.head
        if self.lazy:
            out["lazy"] = True
        if self.leaf_label:
            out["leaf_label"] = True
        return out


#: A record as it crosses the seam: an :class:`Append`, or a JSON object with an ``op``.
Record = Append | dict[str, Any]


def record_data(record: Record) -> dict[str, Any]:
    """A record's JSON members, whichever form it came in."""
    return record.as_record() if isinstance(record, Append) else record


class CreatedRecords(Sequence[Record]):
    """The records of a session created whole (:meth:`SessionStore.create`): its ``create``
    record; with own entries, an append of each in order (numbered from 1, not moving the
    head, not lazy, its objects durable; a leaf label marked so: the head never rests on
    one, after a reopen too), then a ``head`` record and a ``commit``. The appends are made
    as they are read: a backend that folds them (the files backend writes a created log
    compacted) reads the ids as :attr:`own`, their digests, not 100,000 records."""

    __slots__ = ("create", "own", "leaf_labels", "tail")

    def __init__(self, create: dict[str, Any], own: EntryDigests, leaf_labels: Collection[str], head: str | None):
        self.create = create
        self.own = own
        #: The own entries that are leaf labels.
        self.leaf_labels = frozenset(eid for eid in leaf_labels if eid in own) if leaf_labels and own else frozenset()
        #: The records after the appends.
        self.tail: list[dict[str, Any]] = [{"op": "head", "head": head}, {"op": "commit"}] if own else []

    def with_create(self, create: dict[str, Any]) -> CreatedRecords:
        """The same records with another ``create`` record."""
        out = CreatedRecords(create, self.own, (), None)
        out.leaf_labels, out.tail = self.leaf_labels, self.tail
        return out

    def _append(self, seq: int, eid: str) -> Append:
        return Append(seq, eid, None, head_moved=False, leaf_label=eid in self.leaf_labels, lazy=False)

    def __len__(self) -> int:
        return 1 + len(self.own) + len(self.tail)

    @overload
    def __getitem__(self, i: int) -> Record: ...
    @overload
    def __getitem__(self, i: slice) -> list[Record]: ...
    def __getitem__(self, i: int | slice) -> Record | list[Record]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self.own)
        if i < 0:
            i += len(self)
        if i == 0:
            return self.create
        if 0 < i <= n:
            return self._append(i, self.own[i - 1])
        if n < i < len(self):
            return self.tail[i - n - 1]
        raise IndexError("record index out of range")

    def __iter__(self) -> Iterator[Record]:
        yield self.create
        for seq, eid in enumerate(self.own, start=1):
            yield self._append(seq, eid)
        yield from self.tail


@dataclass
class LogOpen:
    """What opening a session's log found, for the domain to replay.

    ``records`` are the log's records in order as JSON objects, recovery done:
    for a writable open the backend has already rewritten the log (dropped a
    crash's uncommitted tail, written ``loss`` records); a read-only snapshot
    writes nothing and shows the same records it would keep, ``loss`` records
    included. ``head_index`` and ``mark_index`` are what the backend's indexes
    say (None where it keeps none, or the index is missing or unreadable): the
    domain checks them against the replayed log, since an index that names an
    entry the log lacks means committed records were lost. ``recovered`` says
    what recovery did, as notes with fsck's codes (``log-tail``, ``stale-header``, ...)."""

    header: bytes
    records: list[dict[str, Any]]
    head_index: str | None = None
    mark_index: str | None = None
    recovered: list[FsckProblem] = field(default_factory=list)
    #: The last summary the backend keeps for the session (see
    #: :meth:`SessionLog.set_summary`), current or not: the domain checks it against the
    #: log before it trusts it, and counts only the entries appended since.
    summary: dict[str, Any] | None = None
    #: The append rules' state the backend keeps for the session (see
    #: :meth:`SessionLog.set_rule_state`; a writing open only), current or not: the
    #: domain checks it against the log before it uses it.
    rule_state: dict[str, Any] | None = None
    #: Where the backend keeps the log's length apart from its records (PostgreSQL's
    #: ``last_pos``): (the length it says, the position of the log's last record). The
    #: domain holds it to the log as it holds the head index (:func:`~..store.state.index_damage`).
    length_index: tuple[int, int] | None = None


@dataclass
class LogHistory:
    """A session's log as it is held now, read without recovery (``agentsession log``,
    a stored session's ``verify``): the records that read, in order, each with where it
    lies when the backend has lines (``(line, byte offset)``), what does not read
    (``damage``: findings with fsck's codes, each message naming its place), and an
    uncommitted tail a writing open would drop (``tail``, in words; its records are in
    ``records`` too, after ``tail_from``). ``head_index`` is the head the backend's
    index names, where it keeps one apart from the log (the domain holds it to the log:
    an index may lag the log, never lead it)."""

    records: list[dict[str, Any]]
    positions: list[tuple[int, int | None]] | None = None
    damage: list[FsckProblem] = field(default_factory=list)
    tail: str | None = None
    tail_from: int | None = None
    head_index: str | None = None
    #: As :attr:`LogOpen.length_index`: (the log's length an index apart from it says, the
    #: position of its last record), where the backend keeps one.
    length_index: tuple[int, int] | None = None
    #: As :attr:`LogOpen.summary`, read before the log (it may lag it, never lead it).
    summary: dict[str, Any] | None = None
    #: Where the log lies, relative to the store's root (the ``file`` its findings name).
    source: str | None = None

    def damaged(self, code: str, message: str, line: int | None = None, offset: int | None = None) -> None:
        """Add a fault of the log, coded as fsck codes it (docs/fsck.md)."""
        self.damage.append(FsckProblem("error", code, message, file=self.source, line=line, offset=offset))


@dataclass
class LogTail:
    """The records a log holds after its first ``start`` (what ``history().records[start:]``
    holds), ``total`` the records it holds in all (less than ``start`` when it was cut
    back or rewritten), and ``resume``: the backend's note of where the log ended, which
    lets the next :meth:`SessionStore.history_since` read only what follows."""

    records: list[dict[str, Any]]
    total: int
    resume: Any = None
    #: Read from the log's start, not on from ``resume`` (a first read; a note not given,
    #: or no longer the log's: compacted, cut back, rewritten, another incarnation):
    #: ``start`` then counts the records of the log as it is now, which need not be those
    #: a caller counted before, so a caller keeping a position reads afresh.
    whole: bool = True
    #: The two objects (content, envelope) of appends among ``records`` whose log line
    #: carries them, by entry id: the file store's payloads, which are in no other place
    #: a reader without the log open can see until a checkpoint writes them to objects/.
    #: Given where the backend read them on from ``resume``; empty otherwise.
    objects: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)


class ObjectStage(Protocol):
    """Objects a bulk writer (an import) puts down as it checks them, before it knows
    they are to be kept: handed to :meth:`ObjectStore.put_many` (a session's create
    does) once they are, and closed either way, which discards what was not stored.
    Iterating gives what is still to be stored, ``len()`` how many."""

    def add(self, space: Space, name: str, data: bytes) -> None: ...

    def add_entry(self, content: str, entry: str, objects: tuple[bytes, bytes]) -> None:
        """An entry's two objects, its content's (named ``content``) then its envelope's
        (named ``entry``), as two :meth:`add` calls put them: one call per entry of an
        import's pass, not two."""

    def end(self) -> None:
        """No more objects come (the pass is over and found sound): a stage that writes
        them towards their place may complete that now, still out of sight, beside what
        the import does next; :meth:`ObjectStore.put_many` then stores them."""

    def close(self) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple[Space, str, bytes]]: ...


#: A pack block made and compressed outside the pack's writer (the file backend's
#: :func:`~.files.packs.ready_blocks`): its zstd frame, its stream's size, its objects'
#: raw names (32 bytes each) and space bits.
ReadyBlock = tuple[bytes, int, bytes, bytes]


@runtime_checkable
class ReadyStage(ObjectStage, Protocol):
    """A stage that also takes pack blocks made and compressed by an import's helper
    process, the entries' objects in them then never passing through this process."""

    def add_ready(self, blocks: list[ReadyBlock]) -> None: ...


class ObjectStore(ABC):
    """Objects named by ``sha256:<hex>`` of their bytes, in three spaces.

    Every read hashes what it returns against the name (a corrupt object is
    never served: :class:`~agentsession_cas.errors.CorruptObjectError`);
    storing an object that is present is a no-op that succeeds. Objects a
    session's log holds and the store has not yet written out (a backend may
    batch them) are served by :meth:`get` too."""

    @abstractmethod
    def get(self, space: Space, name: str) -> bytes:
        """The object's bytes, verified; NoSuchObjectError when absent."""

    def get_many(self, space: Space, names: Sequence[str]) -> list[bytes]:
        """:meth:`get` of each name, in order, each verified: a backend that can read
        many objects for less than many reads (a pack's block at once) does so here."""
        return [self.get(space, name) for name in names]

    def get_chunks(self, space: Space, chunks: Iterable[Sequence[str]]) -> Iterator[list[bytes]]:
        """:meth:`get_many` of each chunk of names, in order, one at a time: for a reader
        that works on a chunk's objects before it asks for the next (a listing). A
        backend may then read ahead while the caller works."""
        for names in chunks:
            yield self.get_many(space, names)

    @abstractmethod
    def exists(self, space: Space, name: str) -> bool:
        """Whether the object store proper holds it (present, not verified; a log's
        pending objects do not count)."""

    @abstractmethod
    def held(self, space: Space, name: str) -> bool:
        """Whether it is held and sound, as a receiver answers "missing": what is
        reported held need not be sent again."""

    def held_many(self, space: Space, names: Sequence[str]) -> list[bool]:
        """:meth:`held` of each name, in order: a backend that can answer many for less
        than many questions (a push's whole closure) does so here."""
        return [self.held(space, name) for name in names]

    def is_sound(self, space: Space, name: str) -> bool:
        """Present and hashing to its name."""
        from ..errors import AgentSessionError

        try:
            self.get(space, name)
        except AgentSessionError:
            return False
        return True

    @abstractmethod
    def put(self, space: Space, name: str, data: bytes, *, durable: bool = True) -> None:
        """Store ``data`` under ``name`` (the caller computed the name)."""

    @abstractmethod
    def put_many(self, items: Iterable[tuple[Space, str, bytes]], *, count: int | None = None) -> None:
        """Store many objects durably at once (an import, a push); ``count`` is a hint
        of how many ``items`` yields, for a backend that streams big batches."""

    def stage(self) -> ObjectStage:
        """Where an import puts each object as the file's pass accepts it: a temporary
        file (its memory does not grow with the file), read back by :meth:`put_many`.
        A backend may write them towards their place at once (the file backend: into a
        pack not yet visible), sparing the second pass."""
        from ..fsutil import Spill

        return Spill()

    @abstractmethod
    def hold(self, names: Iterable[tuple[Space, str]], *, written: set[str] = frozenset()) -> list[tuple[Space, str]]:  # type: ignore[assignment]
        """Before a record names objects it did not write itself: make each durable and
        safe from a sweep running now (RFC 0002: an accepted append holds its objects).
        ``written`` names objects this caller stored durably already. Returns those
        found missing (nothing may then name them)."""

    @abstractmethod
    def names(self, space: Space) -> Iterator[str]:
        """Every object name of a space, each once."""

    @abstractmethod
    def where(self, space: Space, name: str) -> str:
        """Where the object lives, in words for a message (a path relative to the store)."""

    def names_starting(self, digits: str) -> set[str]:
        """Every object name, of any space, that starts with ``sha256:`` and the hex
        ``digits`` (a short name, as ``cat-object`` takes one). A backend that keeps its
        names sorted finds them without reading every name."""
        want = "sha256:" + digits
        return {n for space in SPACES for n in self.names(space) if n.startswith(want)}

    def read_order(self, names: Iterable[str]) -> list[str]:
        """``names`` in the order reading them all costs least (the backend's layout)."""
        return sorted(names)

    def scan(self, spaces: Sequence[Space]) -> Iterator[tuple[Space, str, bytes]]:
        """Every object of the given spaces as ``(space, name, bytes)``, in the order
        reading them costs least: a bulk pass (a search) that must not pay a lookup per
        object.

        The bytes are NOT verified against their names, and an object that cannot be
        read is left out: a caller uses them only to rule objects out, and reads what it
        shows through :meth:`get`. An object may come more than once (two packs hold it);
        objects only a session's log holds so far may not come at all."""
        from ..errors import AgentSessionError

        for space in spaces:
            for name in self.read_order(self.names(space)):
                try:
                    yield space, name, self.get(space, name)
                except AgentSessionError:
                    continue

    def read_all(self, spaces: Sequence[Space]) -> Iterator[tuple[Space, str, bytes | Exception]]:
        """Every object of the given spaces, each once, as ``(space, name, bytes)``
        verified as :meth:`get` verifies them, or ``(space, name, error)`` with the
        error :meth:`get` raises for one that does not read (``AgentSessionError`` or
        ``OSError``): what a count of the whole store reads (``stats``). Here a chunk
        at a time through :meth:`get_many` (one query a chunk for a backend whose reads
        are round trips), a chunk that does not read whole one name at a time; a
        backend that can read its objects in bulk without a lookup by name does so."""
        from ..errors import AgentSessionError

        for space in spaces:
            names = self.read_order(self.names(space))
            for at in range(0, len(names), _READ_ALL_CHUNK):
                chunk = names[at : at + _READ_ALL_CHUNK]
                try:
                    datas: list[bytes | Exception] = list(self.get_many(space, chunk))
                except (AgentSessionError, OSError):
                    datas = []
                    for name in chunk:
                        try:
                            datas.append(self.get(space, name))
                        except (AgentSessionError, OSError) as exc:
                            datas.append(exc)
                for name, data in zip(chunk, datas):
                    yield space, name, data

    def stored_bytes(self) -> dict[str, int] | None:
        """The bytes the objects take where they are kept, by kind (the file backend's
        ``loose`` and ``packs``), for ``stats``; None when the backend cannot say."""
        return None

    def close(self) -> None:  # noqa: B027 - a hook: most object stores hold nothing open
        """Let go of whatever is held open."""


class SessionLog(ABC):
    """One session's log, open for writing (holding the session) or as a snapshot.

    A writable handle is the only writer of its session until it is closed. Its
    writes are records; ``commit=True`` makes every record so far durable before
    the call returns (RFC 0002 "Durability": the commit point), and a failure there
    stops the handle (nothing more is written until the session is reopened)."""

    session_id: str
    writable: bool
    #: Why the handle stopped taking writes (a failed fsync), or None.
    stopped: str | None = None
    #: On a log :meth:`SessionStore.create` just made: the records it holds when the
    #: backend wrote them in another form than given (the file backend folds a created
    #: session's appends into one snapshot), which the domain replays as an open would;
    #: None to replay the records given. The domain lets go of them once replayed.
    created_records: Sequence[Mapping[str, Any]] | None = None

    def recover(self) -> None:  # noqa: B027 - a hook: only a backend a crash can leave half-written has work
        """Apply the recovery a writable open found needed (rewriting a crash's tail),
        called once the domain has checked the log it replays to and its indexes: a
        damaged session is left exactly as it was found."""

    @abstractmethod
    def write(self, records: Sequence[Record], *, commit: bool) -> str | None:
        """Append ``records`` to the log, as one write; with ``commit`` also a commit
        record, durable before this returns. All or nothing: a failure leaves no
        partial record behind and raises. Returns a note when the records were
        accepted but work they triggered failed (the handle has then stopped)."""

    @abstractmethod
    def commit(self) -> None:
        """Make every record so far durable (nothing to do when all are)."""

    @abstractmethod
    def set_indexes(self, head: str | None, mark: Mark) -> None:
        """Record the committed head and mark where readers find them cheaply."""

    def set_summary(self, summary: Mapping[str, Any]) -> None:  # noqa: B027 - a hook: a backend may keep none
        """Keep what ``list`` shows of the session (a JSON object the domain made) with
        what identifies the log as it is when the session is let go, so a reader can
        tell whether it is current (:meth:`SessionStore.summary`). Called at close; an
        index, like HEAD: lost or stale, it is rebuilt from the log."""

    def keep_summary(self, summary: Mapping[str, Any]) -> None:
        """:meth:`set_summary` kept at once, describing the log as it is now (every record
        committed: the caller's to know), not when the session is let go: a writer that
        holds a session open for long (a recorder, a server) hands one over now and then,
        so a reader beside it reads only the entries since (:meth:`Session.summary
        <agentsession_cas.store.session.Session.summary>`). A backend whose
        :meth:`set_summary` keeps at once needs nothing more."""
        self.set_summary(summary)

    def set_rule_state(self, state: Mapping[str, Any]) -> None:  # noqa: B027 - a hook: a backend may keep none
        """Keep the append rules' state of the session (a JSON object the domain made,
        :mod:`agentsession_cas.store.rulestate`), written when the session is let go, so
        the next writing open need not read the session to judge its appends. Called at
        close; an index: lost, damaged or stale, it is rebuilt from the log."""

    def kept_rule_state(self) -> dict[str, Any] | None:
        """The rules' state kept for the session (as :attr:`LogOpen.rule_state`), read when
        asked: what a fork of a session read as a snapshot starts from. None when none."""
        return None

    @abstractmethod
    def set_header(self, header: bytes) -> None:
        """Replace the header, durably (RFC 0002: only ``format`` is raised)."""

    def checkpoint(self) -> None:  # noqa: B027 - a hook: only a backend that batches objects has work
        """Write out objects the log alone holds (a backend that batches them); others have none."""

    def park(self) -> bool:
        """Let go of the hold but keep what is known, for :meth:`resume` (an exchange
        endpoint between pushes). False when this backend cannot."""
        return False

    def resume(self) -> bool:
        """Take the hold again after :meth:`park`, if nothing wrote the session since:
        True; False (holding nothing) when it changed, the caller reopening it."""
        return False

    @abstractmethod
    def close(self) -> None:
        """Commit nothing more; release the hold. Idempotent."""


class SessionStore(ABC):
    """The sessions of a store, by id (ids are checked by the caller)."""

    def header_lost(self, session_id: str) -> str | None:
        """Of a session the store holds but no longer lists, its header being lost (fsck's
        ``missing-header``): where the header belongs, relative to the store's root; None
        for any other id (and for a backend whose header cannot be lost apart)."""
        return None

    def lost_headers(self) -> list[str]:
        """The ids of the sessions :meth:`header_lost` names, sorted (what ``list`` reports
        as damaged: :meth:`list` holds only sessions with their header)."""
        return []

    def log_source(self, session_id: str) -> str | None:
        """Where a session's log lies, relative to the store's root: what a fault of it names
        (``file`` of a finding, ``path`` of :class:`~agentsession_cas.errors.SessionDamagedError`);
        None for a backend that keeps no file of it."""
        return None

    @abstractmethod
    def list(self) -> list[str]:
        """The ids held, sorted."""

    def unlisted(self) -> Sequence[str]:
        """The ids of sessions the backend keeps something of yet does not list, for want
        of what makes one listed (the file backend's session directory whose header file
        is gone: fsck's ``missing-header``), sorted: for a count of the whole store
        (``stats``) to name. A backend that keeps a session whole or not at all has none."""
        return []

    @abstractmethod
    def exists(self, session_id: str) -> bool: ...

    @abstractmethod
    def header(self, session_id: str) -> bytes | None:
        """The header's bytes (one small read), or None when the session is absent."""

    @abstractmethod
    def open(self, session_id: str, *, writable: bool) -> tuple[SessionLog, LogOpen]:
        """Open a session's log: for writing (an exclusive hold, SessionLockedError when
        another holds it), or as a read-only snapshot. Nothing is written: the records
        returned are those recovery would keep, and :meth:`SessionLog.recover` applies
        it. NoSuchSessionError when absent; SessionDamagedError when the log is damaged
        beyond a crash's loss."""

    @abstractmethod
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
        """Create a session whole: its header and first records, with ``objects``
        stored first, visible in one step that fails (SessionExistsError) if the id is
        held. ``prefix`` (entry id, content hash) names objects already stored that the
        new session builds on (a fork's prefix): they are made durable and held from a
        sweep, and one gone refuses the creation. Returns the log open for writing."""

    def summary(self, session_id: str) -> tuple[dict[str, Any], bool] | None:
        """The summary kept for a session and whether it describes the log as it is now
        (True), or an older state of it (False); None when none is kept."""
        return None

    def size(self, session_id: str) -> int | None:
        """Bytes the session's own records take, where the backend can tell cheaply."""
        return None

    @abstractmethod
    def history(self, session_id: str) -> LogHistory:
        """The log as held now, without recovery (what ``agentsession log`` shows)."""

    def history_since(self, session_id: str, start: int, resume: Any = None) -> LogTail:
        """The records after the first ``start`` (a follower's read, RFC 0003, and a local
        ``show -f``'s poll), given the ``resume`` note of the previous call; a backend that
        can read only the new ones does, and says so (:attr:`LogTail.whole` false; an idle
        poll then costs it one small read). This one reads the whole log."""
        records = self.history(session_id).records
        return LogTail(records[start:], len(records))

    @abstractmethod
    def delete(self, session_id: str, log: SessionLog | None = None) -> None:
        """Remove a session in one step (its header, log and indexes), holding it (or
        through ``log``, the caller's writable handle, which is closed). A refusal (an
        :class:`~agentsession_cas.errors.AgentSessionError` raised because the session may
        not be deleted here) changes nothing and leaves ``log`` held as it was."""


class RefStore(ABC):
    """Named refs as opaque JSON records, one per name. Every change happens inside
    :meth:`locked`, so a compare-and-swap (and a new name's conflict check) sees a
    stable set of names; reads take no hold. A backend may keep each ref's history
    (:attr:`keeps_moves`): one record per change, written after it."""

    #: Whether :meth:`record_move` keeps what it is given (RFC 0003's ref log).
    keeps_moves: bool = False

    def record_move(self, name: str, move: Mapping[str, Any]) -> None:  # noqa: B027 - a hook: a backend may keep none
        """Keep one change of the ref ``name`` (inside :meth:`locked`, once the change is
        durable); a backend that keeps no history does nothing."""

    def moves(self, name: str) -> list[dict[str, Any]] | None:
        """The changes kept of the ref ``name``, oldest first (empty when none), or None
        when this backend keeps no history."""
        return None

    @abstractmethod
    def get(self, name: str) -> dict[str, Any] | None:
        """The record held under ``name`` (None when absent or unreadable)."""

    @abstractmethod
    def names(self, prefix: str = "") -> list[str]:
        """The names held that start with ``prefix``, sorted."""

    @abstractmethod
    def locked(self) -> AbstractContextManager[None]:
        """The store-wide hold every ref change is made under."""

    @abstractmethod
    def put(self, name: str, record: Mapping[str, Any]) -> None:
        """Create or replace a ref durably (inside :meth:`locked`)."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove a ref durably (inside :meth:`locked`); absent is a no-op."""


class RemoteStore(ABC):
    """What a store remembers of its remotes: small JSON records by (remote URL,
    kind, name), each a hint that a lost write only costs re-learning."""

    @abstractmethod
    def get(self, url: str, kind: Literal["sessions", "refs"], name: str) -> dict[str, Any] | None: ...

    @abstractmethod
    def put(self, url: str, kind: Literal["sessions", "refs"], name: str, record: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def delete(self, url: str, kind: Literal["sessions", "refs"], name: str) -> None: ...


@dataclass
class RepackResult:
    """What a repack (``pack``) or a sweep did, or would do."""

    dry_run: bool = False
    packs_before: int = 0
    loose_before: int = 0
    bytes_before: int = 0
    packs_after: int = 0
    bytes_after: int = 0
    objects: int = 0
    dropped: int = 0
    dropped_bytes: int = 0
    dropped_names: list[str] = field(default_factory=list)
    pack: str | None = None
    #: What could not be read or copied (corrupt objects, unreadable blocks): the
    #: command exits 1 when there is any, after doing the rest.
    problems: list[FsckProblem] = field(default_factory=list)
    bad_packs: dict[str, str] = field(default_factory=dict)
    #: Remarks that are not problems (a file a writer touched meanwhile, kept), each a
    #: finding of severity ``note`` with a code, as fsck's notes are.
    notes: list[FsckProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.bad_packs

    def note(self, code: str, message: str, **where: Any) -> None:
        """Add a remark that fails nothing (``code`` as fsck would code what it says)."""
        self.notes.append(FsckProblem("note", code, message, **where))

    def joined(self, res: RepackResult) -> RepackResult:
        """``res`` with this result's problems and notes in front: what a step before it
        (:meth:`~.files.objects.FileObjects.index_lost`) did."""
        res.notes[:0] = self.notes
        res.problems[:0] = self.problems
        return res

    def unread(self) -> list[FsckProblem]:
        """Each pack left unread (``bad_packs``) as a finding with fsck's code: ``bad-pack-index``
        for its index (every error of a pack's index says ``pack index``), else ``bad-pack``."""
        return [FsckProblem("error", "bad-pack-index" if why.startswith("pack index ") else "bad-pack",
                            f"objects/pack/{key}.pack was not read: {why}; left in place (run fsck)",
                            file=f"objects/pack/{key}.idx" if why.startswith("pack index ") else f"objects/pack/{key}.pack")
                for key, why in sorted(self.bad_packs.items())]

    def as_dict(self) -> dict[str, Any]:
        """Each problem and note in the one shape fsck's have (code, severity, where, ...), a
        pack left unread among the problems."""
        return {**asdict(self), "problems": [p.as_dict() for p in self.problems + self.unread()],
                "notes": [n.as_dict() for n in self.notes], "ok": self.ok}


def digests(names: list[str]) -> list[bytes | None]:
    """:func:`raw_hash` of each of ``names``, converted with no Python call per name where
    all are object names (:func:`all_hashes`), as a log's appends are."""
    if all_hashes(names):
        return list(map(bytes.fromhex, map(_DIGITS, names)))
    return list(map(raw_hash, names))


_DIGITS = operator.itemgetter(slice(len(HASH_PREFIX), None))


class Names(AbstractSet[str]):
    """A set of object names as the retention rule holds them: each ``sha256:<hex>`` name
    as its raw 32-byte digest in :attr:`raws` (65 bytes an object where its name is 120,
    in a set 107 where 162: a 100,000-entry session's retention, 21 MB where 32), and what
    a log names that is no object name (:func:`raw_hash` is None: a damaged log kept
    aside, a hostile writer) as it is in :attr:`odd`. Read as a set of names (``in``,
    ``len``, iteration, set comparisons) it is the set of those names; the rule and the
    backends that keep raw digests use :attr:`raws` itself."""

    __slots__ = ("raws", "odd")

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.raws: set[bytes] = set()
        self.odd: set[str] = set()
        self.update(names)

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> set[Any]:
        return set(it)  # (what a set operation with another set makes: a set of names)

    def add(self, name: str) -> None:
        raw = raw_hash(name)
        if raw is None:
            self.odd.add(name)
        else:
            self.raws.add(raw)

    def update(self, names: Iterable[str]) -> list[bytes | None]:
        """Add each of ``names``; their digests returned in their order (None for a name
        that is no object name)."""
        names = names if isinstance(names, list) else list(names)
        raws = digests(names)
        if None in raws:
            self.odd.update(name for name, raw in zip(names, raws) if raw is None)
        self.raws.update(filter(None, raws))
        return raws

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        raw = raw_hash(name)
        return name in self.odd if raw is None else raw in self.raws

    def __len__(self) -> int:
        return len(self.raws) + len(self.odd)

    def __iter__(self) -> Iterator[str]:
        yield from map(HASH_PREFIX.__add__, map(bytes.hex, self.raws))
        yield from self.odd

    def __repr__(self) -> str:
        return f"Names({len(self)} names)"


@dataclass
class Retained:
    """What the logs and prefixes of a store retain, and where it was read: the names of
    each space as :class:`Names` (raw digests)."""

    envelopes: Names = field(default_factory=Names)
    contents: Names = field(default_factory=Names)
    blobs: Names = field(default_factory=Names)
    sessions: int = 0
    staged: int = 0


@dataclass
class RetentionSource:
    """One log a sweep must honour, as the backend read it: its records (a crash's torn
    tail and records kept aside by repair included), the content each append's own
    copy of its objects names where the backend keeps one (so the envelope need not
    be read), the blobs those copies' contents name by ``sidecar:`` URL (a content the
    log alone holds, not yet written to the objects, cannot be read there for them),
    and whether it is a session being made (staged) rather than held."""

    records: list[dict[str, Any]]
    contents: dict[str, str] = field(default_factory=dict)
    staged: bool = False
    blobs: set[str] = field(default_factory=set)


#: Severities of a finding, from the one that fails the check to the one that only informs.
Severity = Literal["error", "warning", "note"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "note")


@dataclass
class FsckProblem:
    """One finding: what (``code``, ``message``), how bad (``severity``), and what it
    concerns: a session, an object (``object`` in ``space``), a file (relative to
    the store's root) and a place in it (a log ``line`` and byte ``offset``, a
    pack ``block``)."""

    severity: Severity
    code: str
    message: str
    session: str | None = None
    object: str | None = None
    space: str | None = None
    file: str | None = None
    line: int | None = None
    offset: int | None = None
    block: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The shared problem shape (``code``, ``severity``, ``where``: the file, else the
        session or the store; ``line``, ``entry``, ``message``) and where in the store."""
        return {
            "severity": self.severity,
            "code": self.code,
            "where": self.file or (f"session {self.session}" if self.session else "store"),
            "entry": self.object if self.space == "entries" else None,
            "message": self.message,
            "session": self.session,
            "object": self.object,
            "space": self.space,
            "file": self.file,
            "line": self.line,
            "offset": self.offset,
            "block": self.block,
        }

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass
class FsckReport:
    """Everything one walk found, and what it looked at (``counts``)."""

    root: str
    problems: list[FsckProblem] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> list[FsckProblem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[FsckProblem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def notes(self) -> list[FsckProblem]:
        return [p for p in self.problems if p.severity == "note"]

    @property
    def ok(self) -> bool:
        """True when nothing is damaged (warnings and notes do not count)."""
        return not self.errors

    def add(self, severity: Severity, code: str, message: str, **where: Any) -> FsckProblem:
        if severity not in SEVERITIES:
            raise ValueError(f"unknown severity {severity!r}")
        p = FsckProblem(severity, code, message, **where)
        self.problems.append(p)
        return p

    def as_dict(self) -> dict[str, Any]:
        return {
            "store": self.root,
            "ok": self.ok,
            "problems": [p.as_dict() for p in self.errors],
            "warnings": [p.as_dict() for p in self.warnings],
            "notes": [p.as_dict() for p in self.notes],
            "counts": self.counts,
        }


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers beyond the interfaces (RFC 0003's capabilities say it
    truthfully): whether it persists across processes, packs objects, and can be
    swept, repaired or migrated."""

    persistent: bool
    packs: bool
    sweep: bool
    repair: bool
    migrate: bool


class Backend(ABC):
    """One store's storage: the four stores and the maintenance hooks."""

    url: str
    readonly: bool
    objects: ObjectStore
    sessions: SessionStore
    refs: RefStore
    remotes: RemoteStore
    capabilities: Capabilities
    #: What :meth:`sweep_objects` counts as left young: objects, or (a store that keeps
    #: them in files and leaves a young file whole) files.
    young_unit = "object"

    def describe(self) -> str:
        """The store, named for a message ("the store at /path", "the memory store")."""
        return f"the store at {self.url}"

    def public_url(self) -> str:
        """The store as ``--store`` names it in advice a message gives (a command to run):
        its URL, with no secret in it."""
        return self.url

    @abstractmethod
    def close(self) -> None:
        """Release everything; a writer's close may tidy storage (pack loose objects)."""

    def follow_stream(self) -> Any:
        """The transport of a server that follows this store's sessions itself (RFC 0003's
        follow stream, which ``exchange.following.follow_store`` then reads instead of
        polling the log), or None: a store this process reads is polled."""
        return None

    # -- maintenance hooks: the physical half of what maintenance/ decides ----------------

    @abstractmethod
    def retention_sources(self) -> Iterator[RetentionSource]:
        """Every log a sweep must honour (sessions held, being made, and records kept
        aside by a repair)."""

    def writers_holding(self) -> list[str] | None:
        """The sessions a writer (in any process) holds now, or None when this backend
        cannot tell. A sweep with a short grace asks first (see maintenance/sweep.py)."""
        return []

    @abstractmethod
    def sweep_objects(
        self, compute: Callable[[bool], Retained], *, grace: float, dry_run: bool, wait: float,
        progress: Callable[[int, int], None] | None,
    ) -> tuple[RepackResult, int, list[str], Retained]:
        """Remove what nothing retains: take a snapshot of the objects first, then call
        ``compute(holds_blobs)`` for what is retained (it reads the logs), then drop what
        is not and is older than ``grace`` seconds. Returns (what was done, objects (or
        files: :attr:`young_unit`) left young, leftovers removed, what ``compute`` returned)."""
