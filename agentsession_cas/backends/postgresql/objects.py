"""Objects in the ``objects`` table, by space and hash, each verified when read.

A put of an object already held freshens its ``born`` (what a sweep's grace
counts from, as the file backend touches a file) and replaces a copy that no
longer hashes to its name, so storing the sound bytes over a corrupt row
repairs it, as it does a file. Every write transaction first takes the store's
sweep barrier in shared mode (:meth:`PgObjects.barrier`): a sweep takes it
exclusively for an instant before it reads the logs, so every write that
touched an object before then is committed and visible to it, and every write
after it stamps a ``born`` the sweep's cut-off excludes.

Objects are stored compressed where that makes them smaller (:mod:`.compression`:
PostgreSQL's own TOAST compression only looks at rows over about 2 kB and most
objects are smaller), a big write's in blocks of many; every read decompresses
and hashes what it returns against the name. A reader that walks a session's
entries in order (a projection, an export) is served by a read-ahead: the first
miss fetches the next entries of the order the session registered and their
contents (the blocks that hold them, a few at a query, else their rows in two
queries), and each is verified as it is served.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import compress
from typing import TYPE_CHECKING, Any, cast

import orjson

from ...errors import AgentSessionError, CorruptObjectError, NoSuchObjectError, not_an_object_name
from ...format.hashing import envelope_content, raw_hash
from ..base import ObjectStore, Space
from .arrays import int2
from .compression import BLOCK, Compression, block_of, block_parts
from .database import checked
from .schema import REPLACE, SPACE_CODES, sound

if TYPE_CHECKING:
    from . import PostgresBackend

__all__ = ["PgObjects", "raw_hash", "hash_name", "envelope_parents", "copy_rows"]

_PREFIX = "sha256:"
_BATCH = 500
#: Rows from which a write goes through COPY rather than one statement per row.
COPY_FROM = 64
#: Entries a read-ahead fetches at once (with their contents).
READ_AHEAD = 1000
#: Blocks a read-ahead reads in its first query, before it knows how many entries a block holds.
FIRST_BLOCKS = 4
#: Read-aheads before the last whose objects are kept until a read takes them.
KEPT_BEHIND = 2
_SPACE_NAMES: dict[int, Space] = {code: cast(Space, space) for space, code in SPACE_CODES.items()}
#: What a read-ahead holds of an object, by space and name: its bytes where it was taken
#: from a block by its hash (verified already), else its row (codec, data), decompressed
#: where it could be, to be checked when it is read.
Held = bytes | tuple[int, bytes]
Ahead = dict[Space, dict[str, Held]]
#: What a read-ahead fetched, and the block after the last ones it read where its walk
#: goes on in blocks (where the next read-ahead reads first), else None.
Fetched = tuple[Ahead, int | None]
_SOUND = sound("objects")
#: A block's space codes with 0 and 1 swapped (entries and contents, SPACE_CODES): as selectors,
#: the codes pick its contents and the swapped ones its envelopes.
_SWAP_01 = bytes.maketrans(b"\x00\x01", b"\x01\x00")

#: An entry and its ancestors up the ``parent`` edges, at most %s of them: each step one
#: lookup in the edges' index (an envelope has one ``parent``). The ORDER BY ... LIMIT 1
#: keeps that plan where the table has no statistics yet; a join, which the planner may
#: choose then, scans the table once per step.
WALK_UP = ("WITH RECURSIVE up(h, n) AS (SELECT %s::bytea, 1 UNION ALL "
           "SELECT p.parent, up.n + 1 FROM up, LATERAL (SELECT e.parent FROM edges e "
           "WHERE e.child = up.h AND e.first ORDER BY e.child LIMIT 1) p WHERE up.n < %s) "
           "SELECT h FROM up")
_UPSERT = f"INSERT INTO objects (space, hash, codec, data) VALUES (%s, %s, %s, %s) ON CONFLICT (space, hash) DO UPDATE SET {REPLACE}"
#: One object's row.
_ONE = "SELECT codec, data FROM objects WHERE space = %s AND hash = %s"
#: Where an envelope lies when it lies in a block (codec 3): its block and slot.
_IN_BLOCK = "SELECT data FROM objects WHERE space = 0 AND hash = %s AND codec = 3"
_EDGE = "INSERT INTO edges (parent, child, first) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"


def copy_rows(conn: Any, target: str, types: list[str], rows: Iterable[Sequence[Any]]) -> None:
    """``rows`` into ``target`` (a table and its columns) through one binary COPY."""
    with conn.cursor() as cur, cur.copy(f"COPY {target} FROM STDIN (FORMAT BINARY)") as cp:
        cp.set_types(types)
        for row in rows:
            cp.write_row(row)


#: ``hash IN`` the hashes of one packed bytea parameter (32 bytes each, end to end), as an
#: array the server builds: a list of hashes sent as one value. psycopg adapts a list
#: parameter element by element in Python, which cost more than the query for a fork's
#: prefix (100,000 hashes). An array keeps the plan an index scan per hash.
IN_PACKED = "hash = ANY(ARRAY(SELECT substr(p.b, i * 32 + 1, 32) FROM (SELECT %b::bytea AS b) p, " \
            "generate_series(0, length(p.b) / 32 - 1) AS i))"


#: The objects of a space among some hashes (one packed parameter), for :meth:`PgObjects._rows`.
_ROWS = f"SELECT hash, codec, data FROM objects WHERE space = $1::smallint AND {IN_PACKED.replace('%b', '$2')}".encode()


def packed(hashes: Iterable[bytes | None]) -> bytes:
    """Raw hashes for :data:`IN_PACKED` (a None, a name that was no hash, is left out)."""
    return b"".join(h for h in hashes if h is not None)


def hash_name(raw: bytes) -> str:
    return _PREFIX + bytes(raw).hex()


def envelope_parents(env: bytes) -> list[tuple[bytes, bool]]:
    """The parents an envelope names, as raw hashes, each with whether it is the
    ``parent`` (not one of ``parents``), for the edges index; nothing for bytes that are
    not an envelope (a corrupt put)."""
    try:  # (a plain parse: the parents are all it reads, and every reader checks the bytes)
        data = orjson.loads(env)
    except (ValueError, UnicodeDecodeError):
        return []
    if not isinstance(data, dict):
        return []
    names: list[Any] = [data.get("parent")]
    parents = data.get("parents")
    if isinstance(parents, list):
        names.extend(p.get("entry") for p in parents if isinstance(p, dict))
    out: list[tuple[bytes, bool]] = []
    for i, n in enumerate(names):
        raw = raw_hash(n) if isinstance(n, str) else None
        if raw is not None and all(raw != r for r, _ in out):
            out.append((raw, i == 0))
    return out


#: What :func:`object_rows` makes: the ``objects`` rows, the ``edges`` rows and the ``blocks`` rows.
Encoded = tuple[list[tuple[int, bytes, int, bytes]], list[tuple[bytes, bytes, bool]], list[tuple[int, bytes]]]


def _batches(items: Iterable[tuple[Space, str, bytes]]) -> Iterator[list[tuple[Space, str, bytes]]]:
    """``items`` in batches of at most 4 x _BATCH objects or about 8 MiB."""
    batch: list[tuple[Space, str, bytes]] = []
    size = 0
    for item in items:
        if len(batch) >= 4 * _BATCH or size >= 8 << 20:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += len(item[2])
    if batch:
        yield batch


def object_rows(items: Iterable[tuple[Space, str, bytes]], codecs: Compression, *,
                block_ids: Callable[[int], list[int]] | None = None) -> Encoded:
    """The ``objects`` rows (space, hash, codec, data), ``edges`` rows (parent, child,
    first) and, given ``block_ids`` (a big write's), ``blocks`` rows (id, data) of some
    objects (a name that is no hash: :func:`~agentsession_cas.errors.not_an_object_name`, code
    ``bad_name``, as every backend's ``put``)."""
    rows: dict[tuple[int, bytes], bytes] = {}  # one row per object: an upsert may not meet one twice
    edges: dict[tuple[bytes, bytes], bool] = {}
    for space, name, data in items:
        raw = raw_hash(name)
        if raw is None:
            raise not_an_object_name(name)
        rows[(SPACE_CODES[space], raw)] = bytes(data)
        if space == "entries":
            edges.update(((p, raw), first) for p, first in envelope_parents(data))
    coded, blocks = codecs.encode_many([(code, raw, data) for (code, raw), data in rows.items()], block_ids=block_ids)
    out = [(code, raw, codec, stored) for (code, raw), (codec, stored) in zip(rows, coded)]
    return out, [(p, c, first) for (p, c), first in edges.items()], blocks


#: Names whose rows one query of :meth:`PgObjects.held_many` reads.
_HELD_CHUNK = 4096


class PgObjects(ObjectStore):
    def __init__(self, backend: PostgresBackend):
        self.backend = backend
        self.db = backend.db
        self.codecs = Compression(backend.db)
        #: The expected order as given (:meth:`expect`), made into a list and a map of each
        #: entry's place on first need.
        self._expected: Sequence[str] | Callable[[], Iterable[str]] = ()
        self._order_map: dict[str, int] | None = {}
        self._sequence_list: list[str] = []
        self._ahead: Ahead = {}
        #: What the read-aheads before fetched and no read took yet, the newest
        #: :data:`KEPT_BEHIND` of them, oldest first: a reader that takes a chunk's
        #: envelopes, then its contents (a projection, whose chunk may span three
        #: read-aheads) finds them here.
        self._behind: list[Ahead] = []
        self._chain: list[str] = []
        self._last = -1
        self._prev: bytes | None = None  # the envelope served last
        self._prev_parent: str | None = None
        self._prev_parsed = True
        self._epoch = 0
        self._pool: ThreadPoolExecutor | None = None
        #: Entries a block held in the last read-ahead from blocks (an estimate of how many
        #: blocks the next one reads at once; None before the first).
        self._per_block: float | None = None
        self._next: tuple[int, int, Future[Fetched]] | None = None

    def barrier(self, conn: Any) -> None:
        """Inside a write transaction: the sweep barrier, shared (see the module)."""
        conn.execute("SELECT pg_advisory_xact_lock_shared(%s)", [self.db.lock_key("sweep")])

    def write_rows(self, conn: Any, items: Iterable[tuple[Space, str, bytes]]) -> None:
        """Store objects inside the caller's transaction (barrier taken)."""
        self.write_encoded(conn, object_rows(items, self.codecs))

    def write_encoded(self, conn: Any, encoded: Encoded) -> None:
        """Store rows :func:`object_rows` made, inside the caller's transaction (barrier
        taken): row by row for a few, through COPY into a scratch table and one upsert for
        many (an import), the blocks their rows name first."""
        rows, edges, blocks = encoded
        if blocks:
            copy_rows(conn, "blocks (id, data)", ["int8", "bytea"], blocks)
        if len(rows) < COPY_FROM:
            with conn.cursor() as cur:
                if rows:
                    cur.executemany(_UPSERT, rows)
                if edges:
                    cur.executemany(_EDGE, edges)
            return
        conn.execute("CREATE TEMPORARY TABLE IF NOT EXISTS incoming_objects "
                     "(space smallint, hash bytea, codec smallint, data bytea) ON COMMIT DELETE ROWS")
        conn.execute("CREATE TEMPORARY TABLE IF NOT EXISTS incoming_edges (parent bytea, child bytea, first boolean) "
                     "ON COMMIT DELETE ROWS")
        copy_rows(conn, "incoming_objects (space, hash, codec, data)", ["int2", "bytea", "int2", "bytea"], rows)
        copy_rows(conn, "incoming_edges (parent, child, first)", ["bytea", "bytea", "bool"], edges)
        conn.execute(_UPSERT.replace("VALUES (%s, %s, %s, %s)", "SELECT * FROM incoming_objects"))
        conn.execute("INSERT INTO edges (parent, child, first) SELECT * FROM incoming_edges ON CONFLICT DO NOTHING")

    def get(self, space: Space, name: str) -> bytes:
        row = self._take_many(space, [name])[0]
        if row is None:
            row = self._miss(space, name)
        data = self._checked(space, name, row)
        if space == "entries":
            self._served(name, data)
        return data

    def get_many(self, space: Space, names: Sequence[str]) -> list[bytes]:
        """:meth:`get` of each name, in order, each hashed against its name: what the
        read-ahead holds taken at once, the rest in one query (reading ahead first where
        they go on along the expected order, as :meth:`get` does); a name that is no hash
        or an object the table lacks by :meth:`get`, which says so. A projection's walk
        reads this way, a few hundred entries, then their contents."""
        rows = self._take_many(space, names)
        missing = [i for i, row in enumerate(rows) if row is None]
        while missing and space == "entries" and self._walks_on(names, missing[0]):
            self._read_ahead(names[missing[0]], up=False)
            for i, row in zip(missing, self._take_many(space, [names[i] for i in missing])):
                rows[i] = row
            if rows[missing[0]] is None:
                break
            missing = [i for i in missing if rows[i] is None]
        if missing:
            found = dict(self._rows(SPACE_CODES[space], [raw_hash(names[i]) for i in missing]))
            for i in missing:
                rows[i] = found.get(raw_hash(names[i]) or b"")
        checked = self._checked
        out = [row if isinstance(row, bytes) else self.get(space, name) if row is None else checked(space, name, row)
               for name, row in zip(names, rows)]
        if out and space == "entries":
            self._served(names[-1], out[-1])
        return out

    def _take_many(self, space: Space, names: Sequence[str]) -> list[Held | None]:
        """What the read-aheads hold of each name, taken (a reader reads it once): the
        last one's, else the ones before it (None where none holds it)."""
        ahead = self._ahead.get(space)
        rows: list[Held | None] = [None] * len(names) if ahead is None else [ahead.pop(name, None) for name in names]
        for before in reversed(self._behind):
            held = before.get(space)
            missing = [i for i, row in enumerate(rows) if row is None] if held else ()
            if not missing:
                continue
            for i in missing:
                rows[i] = held.pop(names[i], None)  # type: ignore[union-attr]  # (held, where missing)
        return rows

    def _checked(self, space: Space, name: str, row: Held) -> bytes:
        """The object's bytes from what a read-ahead or a query held of it: its row
        decompressed and hashed against its name, or its bytes where it was taken from a
        block by its hash (so verified already)."""
        if isinstance(row, bytes):
            return row
        data = row[1] if row[0] == 0 else self.codecs.decode(*row)
        if data is None and row[0] == BLOCK:
            # Its block is gone: the object was stored again since the row was read, and a
            # sweep removed the block no row named any more. The row as it is now says where.
            now = self.db.query(_ONE, [SPACE_CODES[space], raw_hash(name)], binary=True)
            if now and (int(now[0][0]), bytes(now[0][1])) != row:
                data = self.codecs.decode(int(now[0][0]), bytes(now[0][1]))
        # A row came by its name's 32 bytes, so the name is ``sha256:`` and 64 hex digits.
        if data is None or hashlib.sha256(data).hexdigest() != name[7:]:
            raise CorruptObjectError(
                f"corrupt object: {space} object {name} does not hash to its name (in {self.where(space, name)})",
                space=space, name=name, path=self.where(space, name),
            )
        return data

    def _miss(self, space: Space, name: str) -> Held:
        """An object the read-ahead did not hold: read ahead from it where a walk goes on
        there, else its row read alone; NoSuchObjectError when the table lacks it."""
        raw = raw_hash(name)
        row: Held | None = None
        if raw is not None:
            up = space == "entries" and self._parent_of_last_is(name)
            if up or (space == "entries" and self._walks_forward(name)):
                self._read_ahead(name, up=up)
                row = self._take_many(space, [name])[0]
            if row is None:
                rows = self.db.query(_ONE, [SPACE_CODES[space], raw], binary=True)
                row = (int(rows[0][0]), bytes(rows[0][1])) if rows else None
        if row is None:
            raise NoSuchObjectError(f"no {space} object {name} in {self.backend.describe()}")
        return row

    # -- the read-ahead ------------------------------------------------------------------

    def expect(self, order: Sequence[str] | Callable[[], Iterable[str]]) -> None:
        """The entries a reader is about to walk, in order (a session's log), or a function
        that lists them, called only once an object is read (an open to ask the head
        reads none, and lists none of a session's 100,000 ids): a miss on the first of
        them, or on the one after the last served, fetches it and the next ones, with
        their contents."""
        self._expected, self._order_map = order, None
        self._ahead, self._behind = {}, []
        self._last = -1
        self._epoch += 1  # a chunk fetched for the order before is not this one's
        self._next = None

    @property
    def _order(self) -> dict[str, int]:
        """Each expected entry's place in the order."""
        if self._order_map is None:
            expected = self._expected
            self._sequence_list = list(expected() if callable(expected) else expected)
            self._order_map = {eid: i for i, eid in enumerate(self._sequence_list)}
        return self._order_map

    @property
    def _sequence(self) -> list[str]:
        """The expected order."""
        if self._order_map is None:
            self._order  # noqa: B018  # (made together)
        return self._sequence_list

    def _walks_forward(self, name: str) -> bool:
        at = self._order.get(name)
        return at is not None and (at == 0 or at == self._last + 1)

    def _walks_on(self, names: Sequence[str], i: int) -> bool:
        """Whether ``names[i]`` is where a walk forward along the expected order goes next:
        the first of it, after the entry served last, or after ``names[i - 1]``."""
        at = self._order.get(names[i])
        return at is not None and (at == 0 or at == self._last + 1 or (i > 0 and self._order.get(names[i - 1]) == at - 1))

    def _parent_of_last_is(self, name: str) -> bool:
        """Whether ``name`` is the ``parent`` of the envelope served last. Only an envelope
        that holds the name can name it, and on a walk forward none does, so the envelope
        is parsed (once) only where it might."""
        prev = self._prev
        if prev is None or name.encode() not in prev:
            return False
        return name == self._parent_of_last()

    def _parent_of_last(self) -> str | None:
        if not self._prev_parsed:
            first = [p for p, is_parent in envelope_parents(self._prev or b"") if is_parent]
            self._prev_parent, self._prev_parsed = (hash_name(first[0]) if first else None), True
        return self._prev_parent

    def _served(self, name: str, envelope: bytes) -> None:
        """Follow the walk an envelope served belongs to. Up the parents (a prefix, read
        from the base): its parent is asked next, so a miss on that reads ahead up the
        chain; and once the walk reaches the root, the chain read top down (the prefix's
        entries, then the session's own) is the order expected next."""
        at = self._order.get(name)
        if at is not None:
            self._last = at
        if not self._parent_of_last_is(name):
            self._chain = []
        self._chain.append(name)
        self._prev, self._prev_parsed = envelope, False
        if len(self._chain) > 1 and self._parent_of_last() is None:
            walked = set(self._chain)  # once: per element it made a long walk quadratic
            self.expect([*reversed(self._chain), *(e for e in self._sequence if e not in walked)])
            self._chain = []

    def _read_ahead(self, name: str, *, up: bool) -> None:
        """Fetch ``name`` and the entries after it: its ancestors (up the ``parent``
        edges) on a walk up, else the next of the expected order, whose following
        chunk is then fetched on a worker thread while the reader works through this one.
        That chunk starts at the first entry this one's blocks did not hold (its last
        block holds the first entries after it, unless the chunks fall on the blocks'
        bounds), so no block is read twice, and it reads first the blocks after the last
        ones this one read."""
        if not up:
            start = self._order[name]
            got = self._prefetched(start)
            if got is None:
                got = start, self._fetch(self._chunk(start))
            start, (ahead, after) = got
            sequence, envelopes = self._sequence, ahead["entries"]
            end = start + READ_AHEAD
            while end < len(sequence) and sequence[end] in envelopes:
                end += 1
            if end < len(sequence):
                self._prefetch(end, after)
        else:
            rows = self.db.query(WALK_UP, [raw_hash(name), READ_AHEAD], binary=True)
            ahead, _ = self._fetch([hash_name(bytes(r[0])) for r in rows], up=True)
        if any(self._ahead.values()):
            self._behind = [*self._behind, self._ahead][-KEPT_BEHIND:]
        self._ahead = ahead

    def _chunk(self, start: int) -> list[str]:
        return self._sequence[start:start + READ_AHEAD]

    def _prefetch(self, start: int, after: int | None) -> None:
        """Fetch the chunk of the expected order at ``start`` on the worker (a pooled
        connection of its own), from block ``after`` first where it is not None; the
        reader takes it when it gets there."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentsession-pg-read")
        self._next = (self._epoch, start, self._pool.submit(self._fetch, self._chunk(start), after=after))

    def _prefetched(self, start: int) -> tuple[int, Fetched] | None:
        """(where it starts, its objects) of the chunk holding ``start`` the worker fetched
        for this order, if it did (the reader may miss past the chunk's first entry: the
        blocks before it held the first few); None when it did not or failed (the reader
        then reads it itself, and meets any error)."""
        pending, self._next = self._next, None
        if pending is None or pending[0] != self._epoch or not pending[1] <= start < pending[1] + READ_AHEAD:
            return None
        try:
            return pending[1], pending[2].result()
        except Exception:
            return None

    def _fetch(self, chunk: list[str], *, up: bool = False, after: int | None = None) -> Fetched:
        """Envelopes named in ``chunk`` (down a session's order, or ``up`` the parents) and
        their contents: from the blocks that hold them (:meth:`_from_blocks`, reading
        block ``after`` and the next first where it is not None), else as rows (two
        queries), each decompressed here (a batch at once, on the worker while the reader
        works) and kept as codec 0, so get() only verifies it; a row that does not
        decompress is kept as it is, for get() to refuse. With them, the block after the
        last ones read where the blocks held the whole chunk (else None). Runs on the
        reader's thread or the worker's."""
        ahead: Ahead = {space: {} for space in _SPACE_NAMES.values()}
        envelopes = ahead["entries"]
        after = self._from_blocks(chunk, ahead, up=up, after=after)
        rest = [raw_hash(n) for n in chunk if n not in envelopes]
        if not rest:
            return ahead, after
        contents: list[bytes] = []
        for raw, env in self._rows(0, rest):
            envelopes[hash_name(raw)] = env
            c = envelope_content(env[1]) if env[0] == 0 else None
            if c is not None and (craw := raw_hash(c)) is not None:
                contents.append(craw)
        if contents:
            held = ahead["contents"]
            for raw, row in self._rows(1, contents):
                held[hash_name(raw)] = row
        return ahead, None

    def _from_blocks(self, chunk: list[str], ahead: Ahead, *, up: bool, after: int | None = None) -> int | None:
        """Add to ``ahead`` the objects of the blocks holding ``chunk``'s envelopes, each
        taken by its hash, so as bytes verified already: the block of the first envelope
        not yet held (its row, one query), then that block and the ones after it (before
        it, for a walk ``up``), as many as the chunk's rest should fill at the entries a
        block held so far (:attr:`_per_block`), in one query. An import writes a
        session's objects in order, in blocks that follow each other, so where the chunk
        goes on past them the next blocks are read without asking a row first (``after``:
        where the read-ahead before stopped), and the row is asked only when they did not
        hold the envelope. Stops at an envelope in no block: the rows serve the rest.
        Returns the block after (before, up) the last ones read, or None where none was."""
        by_code = {code: ahead[space] for code, space in _SPACE_NAMES.items()}
        envelopes, contents = ahead["entries"], ahead["contents"]
        sha256 = hashlib.sha256
        i, entries, blocks = 0, 0, 0
        while i < len(chunk):
            if chunk[i] in envelopes:
                i += 1
                continue
            bid = after
            if bid is None:
                row = self.db.query(_IN_BLOCK, [raw_hash(chunk[i])], binary=True)
                bid = block_of(bytes(row[0][0])) if row else None
                if bid is None:
                    return None
            per_block = entries / blocks if entries else self._per_block
            want = FIRST_BLOCKS if not per_block else math.ceil((len(chunk) - i) / per_block)
            found = self.codecs.block_frames(start=bid, count=max(1, want), down=up)
            for frame in found.values():
                parts = block_parts(frame)
                if parts is None:
                    continue  # damaged: its objects' rows name it, and a read of one refuses it
                codes, datas = parts
                names = [_PREFIX + sha256(data).hexdigest() for data in datas]
                envelopes_in = codes.count(0)
                if envelopes_in + codes.count(1) == len(codes):  # (an import's: no blobs)
                    others = codes.translate(_SWAP_01)  # 1 for an envelope, 0 for a content
                    envelopes.update(zip(compress(names, others), compress(datas, others)))
                    contents.update(zip(compress(names, codes), compress(datas, codes)))
                else:
                    for code, name, data in zip(codes, names, datas):
                        held = by_code.get(code)
                        if held is not None:
                            held[name] = data
                entries += envelopes_in
            blocks += len(found)
            if entries:
                self._per_block = entries / blocks
            if chunk[i] not in envelopes:
                if after is not None:
                    after = None  # the blocks after the last ones are not the walk's: ask its row
                    continue
                return None  # its block did not hold it (damaged): its row serves it
            after = min(found) - 1 if up else max(found) + 1
        return after

    def _rows(self, space: int, hashes: Sequence[bytes | None]) -> list[tuple[bytes, tuple[int, bytes]]]:
        """(hash, row) of the objects of ``space`` named, decompressed where they can be."""
        # Through libpq itself, parameters and results in the binary format (bytea in text
        # would travel as hex, twice its size, encoded by the server and decoded here).
        with self.db.conn() as c, c.lock:
            res = checked(c, c.pgconn.exec_params(_ROWS, [int2(space), packed(hashes)], param_formats=[1, 1], result_format=1))
        value = res.get_value
        rows = [(value(i, 0), int.from_bytes(value(i, 1), "big"), value(i, 2)) for i in range(res.ntuples)]
        plain = self.codecs.decode_many([(codec, data) for _, codec, data in rows])
        return [(raw, (codec, data) if out is None else (0, out)) for (raw, codec, data), out in zip(rows, plain)]

    def close(self) -> None:
        """Wait for a chunk the worker is fetching (before the pool closes)."""
        pool, self._pool, self._next = self._pool, None, None
        if pool is not None:
            pool.shutdown(wait=True)

    def exists(self, space: Space, name: str) -> bool:
        raw = raw_hash(name)
        if raw is None:
            return False
        return bool(self.db.query("SELECT 1 FROM objects WHERE space = %s AND hash = %s", [SPACE_CODES[space], raw]))

    def held(self, space: Space, name: str) -> bool:
        return self.is_sound(space, name)

    def held_many(self, space: Space, names: Sequence[str]) -> list[bool]:
        """:meth:`held` of each name, in order, the rows read by one query a chunk of
        names (a server's ``missing`` asks about a whole closure: one query a name took
        a round trip each), each row decompressed and hashed against its name."""
        out: list[bool] = []
        for at in range(0, len(names), _HELD_CHUNK):
            chunk = names[at : at + _HELD_CHUNK]
            raws = [raw_hash(name) for name in chunk]
            found = dict(self._rows(SPACE_CODES[space], [raw for raw in raws if raw is not None]))
            for name, raw in zip(chunk, raws):
                row = found.get(raw) if raw is not None else None
                if row is None:
                    out.append(False)
                    continue
                try:
                    self._checked(space, name, row)
                    out.append(True)
                except AgentSessionError:
                    out.append(False)
        return out

    def put(self, space: Space, name: str, data: bytes, *, durable: bool = True) -> None:
        self.backend.require_writable()
        with self.db.conn() as c, c.transaction():
            if not durable:
                c.execute("SET LOCAL synchronous_commit TO off")
            self.barrier(c)
            self.write_rows(c, [(space, name, data)])

    def put_many(self, items: Iterable[tuple[Space, str, bytes]], *, count: int | None = None) -> None:
        """Store objects in batches, each its own transaction, the next batch encoded here
        (zstd, hashes) while a worker thread stores the one before. Every batch but the
        last commits asynchronously and the last synchronously, after all the others: the
        WAL is one sequence, so flushing the last commit flushes every batch before it, and
        the objects are all durable when this returns, for one wait on the disk."""
        self.backend.require_writable()
        pool: ThreadPoolExecutor | None = None
        flight: Future[None] | None = None
        held: Encoded | None = None
        try:
            for batch in _batches(items):
                if held is None:  # the first batch: a sample to train the dictionaries on
                    self._train(batch)
                encoded = object_rows(batch, self.codecs, block_ids=self._block_ids)
                if held is not None:
                    if pool is None:
                        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentsession-pg-put")
                    if flight is not None:
                        flight.result()
                    flight = pool.submit(self._put_batch, held, durable=False)
                held = encoded
            if flight is not None:
                flight.result()
            if held is not None:
                self._put_batch(held, durable=True)
        finally:
            if pool is not None:
                pool.shutdown(wait=True)

    def _block_ids(self, n: int) -> list[int]:
        """``n`` new block ids, in order (the ``blocks`` table's sequence)."""
        rows = self.db.query("SELECT nextval(pg_get_serial_sequence('blocks', 'id')) FROM generate_series(1, %s)", [n])
        return [int(r[0]) for r in rows]

    def _train(self, batch: list[tuple[Space, str, bytes]]) -> None:
        """Train each space's dictionary on the batch's objects of that space, where the
        store has none yet and the batch brings enough (:mod:`.compression`)."""
        for space, code in SPACE_CODES.items():
            if space != "blobs":  # media: each its own format, little to share
                self.codecs.train(code, [data for sp, _, data in batch if sp == space])

    def _put_batch(self, encoded: Encoded, *, durable: bool) -> None:
        with self.db.conn() as c, c.transaction():
            if not durable:
                c.execute("SET LOCAL synchronous_commit TO off")
            self.barrier(c)
            self.write_encoded(c, encoded)

    def hold(self, names: Iterable[tuple[Space, str]], *, written: set[str] = frozenset()) -> list[tuple[Space, str]]:  # type: ignore[assignment]
        by_space: dict[Space, list[str]] = {}
        for space, name in names:
            by_space.setdefault(space, []).append(name)
        if not by_space:
            return []
        missing: list[tuple[Space, str]] = []
        with self.db.conn() as c, c.transaction():
            self.barrier(c)
            for space, wanted in by_space.items():
                raws = [r for n in wanted if (r := raw_hash(n)) is not None]
                rows = c.execute(
                    "UPDATE objects SET born = clock_timestamp() WHERE space = %s AND hash = ANY(%s) "
                    f"AND {_SOUND} RETURNING hash", [SPACE_CODES[space], raws]
                ).fetchall()
                found = {hash_name(bytes(r[0])) for r in rows}
                missing.extend((space, n) for n in wanted if n not in found)
        return missing

    def names(self, space: Space) -> Iterator[str]:
        rows = self.db.query("SELECT hash FROM objects WHERE space = %s", [SPACE_CODES[space]])
        for (raw,) in rows:
            yield hash_name(bytes(raw))

    def stored_bytes(self) -> dict[str, int]:
        """The objects table as PostgreSQL counts it: its rows, TOAST and indexes."""
        rows = self.db.query("SELECT pg_total_relation_size('objects')")
        return {"table": int(rows[0][0])}

    def where(self, space: Space, name: str) -> str:
        return f"{self.backend.describe()}, table objects ({space})"
