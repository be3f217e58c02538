"""How an object's bytes are kept in the ``objects`` table: as they are, as a zstd frame,
as a zstd frame made with a dictionary the store trained on its own objects, or in a
block of ``blocks`` with the objects stored beside it.

PostgreSQL's TOAST compression only considers rows over about 2 kB, and most
envelopes and contents are smaller, so objects are compressed here (codec 1, a
frame of their own, where that is smaller). An object of a few hundred bytes
shares little with itself and much with its neighbours: the keys, the shapes of
the JSON, the hash prefix. A zstd dictionary trained on a sample of the store's
objects (one per space, kept in the ``dictionaries`` table) gives each small
frame that shared part (codec 2): about a third less stored than codec 1 on the
benchmark session. The first import big enough to sample trains it; a store fed
by appends alone keeps codec 1.

A frame of codec 2 names its dictionary (zstd writes the id in the frame), so a
row is read with the dictionary it was made with whichever is current, and a
dictionary, once stored, is never removed. Every reader still hashes what it
decoded against the object's name: a missing or damaged dictionary reads as a
corrupt object, never as other bytes.

A big write (an import's objects, an exchange's, through ``put_many``) keeps its
objects in **blocks** instead (codec 3), as the file backend's packs do: about
:data:`BLOCK_TARGET` bytes of objects, in the order written (a session's entries
and contents, in order), compressed together in one zstd frame, one row of the
``blocks`` table; each object's row then holds only where it lies (the block's
id and its slot). A reader of one object decompresses its block (a few are kept
decompressed); a reader of a session in order (an export) reads the blocks
themselves, a few at once, and takes every object in them by its hash, so it no
longer looks up each object by hash in the table nor decompresses it alone.
Layout of a block's bytes before compression (integers big-endian)::

    count:u32  spaces: count x u8  lengths: count x u32  payloads (in slot order)
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import zstandard

if TYPE_CHECKING:
    from .database import Database

__all__ = ["RAW", "ZSTD", "ZSTD_DICT", "BLOCK", "Compression", "decode_plain", "block_of", "block_parts", "unpack_block"]

RAW, ZSTD, ZSTD_DICT, BLOCK = 0, 1, 2, 3
#: Objects shorter than this are stored as they are (a frame would not pay).
COMPRESS_FROM = 64
#: Objects from which a batch is compressed in one call, on every core.
MULTI_FROM = 64
#: Objects of one space a batch must bring to train that space's dictionary from them.
TRAIN_FROM = 1000
#: Samples a dictionary is trained on (at most), and its size: 64 KiB took a third off
#: the benchmark session's stored bytes; a larger one gained under 1% more.
TRAIN_SAMPLES = 4000
DICT_SIZE = 64 << 10
#: zstd's level for a batch (an import's, compressed on every core) and for the few objects
#: of an append, compressed one at a time in the writer's thread: level 1 took 5 us an
#: object of the benchmark session where level 3 took 11.5 (about a tenth of the client's
#: CPU per append), for 1% more stored bytes.
LEVEL, FAST_LEVEL = 3, 1
#: zstd keeps dictionary ids below 32768 for a registry: ours are drawn above it.
_ID_FLOOR = 1 << 15
#: Raw bytes of objects a block holds (the file backend's pack blocks are this size): enough
#: for zstd to find what neighbours share, small enough that reading one object (which
#: decompresses its block) stays well under a millisecond.
BLOCK_TARGET = 256 << 10
#: Objects from this size are stored on their own, never in a block.
BLOCK_OBJECT_MAX = 64 << 10
#: Objects a write must bring to be stored in blocks (fewer: each its own frame).
BLOCK_FROM = 64
#: The most a block's frame may declare it holds (a damaged one claiming more is refused
#: before anything is allocated).
MAX_BLOCK = BLOCK_TARGET + BLOCK_OBJECT_MAX
#: Blocks a reader keeps decompressed (for reads of single objects).
BLOCK_CACHE = 8
#: A codec-3 row's ``data``: the block's id and the object's slot in it.
POINTER = struct.Struct(">qI")
_U32 = struct.Struct(">I")


def block_of(stored: bytes) -> int | None:
    """The block id a codec-3 row's data names (None when it is not a pointer)."""
    return POINTER.unpack(stored)[0] if len(stored) == POINTER.size else None


def unpack_block(frame: bytes) -> list[tuple[int, bytes]] | None:
    """A block's objects, (space code, bytes) by slot; None when the frame is damaged or
    not a block (every object is still hashed against its name by the reader)."""
    parts = block_parts(frame)
    return None if parts is None else list(zip(*parts))


def block_parts(frame: bytes) -> tuple[bytes, list[bytes]] | None:
    """A block's objects as two sequences by slot: their space codes (a byte each) and
    their bytes; None when the frame is damaged or not a block."""
    try:
        size = zstandard.get_frame_parameters(frame).content_size
        if not 0 < size <= MAX_BLOCK:
            return None
        raw = _plain_decompressor().decompress(frame)
    except zstandard.ZstdError:
        return None
    if len(raw) < 4:
        return None
    (count,) = _U32.unpack_from(raw)
    at = 4 + 5 * count
    if at > len(raw):
        return None
    ends = list(itertools.accumulate(struct.unpack_from(f">{count}I", raw, 4 + count), initial=at))
    if ends[-1] != len(raw):
        return None
    return raw[4:4 + count], [raw[a:b] for a, b in zip(ends, ends[1:])]


def _pack_block(objects: Sequence[tuple[int, bytes]]) -> bytes:
    """The bytes of a block (see the module) holding ``objects`` (space code, bytes)."""
    return b"".join([_U32.pack(len(objects)), bytes(sp for sp, _ in objects),
                     struct.pack(f">{len(objects)}I", *(len(d) for _, d in objects)), *(d for _, d in objects)])


class Compression:
    """One store's codecs: its dictionaries (read from the ``dictionaries`` table on first
    need and when a frame names one not yet seen) and the compressors made from them, one
    per thread (a zstd context is not shared between threads)."""

    def __init__(self, db: Database):
        self.db = db
        self._lock = threading.Lock()
        self._dicts: dict[int, zstandard.ZstdCompressionDict] = {}
        self._current: dict[int, int] = {}  # space code -> the dictionary id new frames use
        self._loaded = False
        self._local = threading.local()
        #: Blocks read for single objects, decompressed, the newest BLOCK_CACHE kept.
        self._blocks: OrderedDict[int, list[tuple[int, bytes]] | None] = OrderedDict()

    # -- the dictionaries -----------------------------------------------------------------

    def _load(self) -> None:
        rows = self.db.query("SELECT id, space, data FROM dictionaries ORDER BY made, id", binary=True)
        with self._lock:
            for did, space, data in rows:
                did, space = int(did), int(space)
                if did not in self._dicts:
                    self._dicts[did] = zstandard.ZstdCompressionDict(bytes(data), dict_type=zstandard.DICT_TYPE_FULLDICT)
                self._current.setdefault(space, did)  # the first one trained for the space
            self._loaded = True

    def current(self, space: int) -> int | None:
        """The dictionary new frames of ``space`` use, or None while it has none."""
        if not self._loaded:
            self._load()
        return self._current.get(space)

    def train(self, space: int, samples: Sequence[bytes]) -> None:
        """Train ``space``'s dictionary on ``samples`` and store it (committed before any
        frame uses it) where the space has none yet; training that fails (samples too
        alike or too few) leaves the space on codec 1."""
        if self.current(space) is not None or len(samples) < TRAIN_FROM:
            return
        step = max(1, len(samples) // TRAIN_SAMPLES)
        try:
            trained = zstandard.train_dictionary(DICT_SIZE, list(samples[::step]), level=LEVEL,
                                                 dict_id=_ID_FLOOR + secrets.randbelow((1 << 31) - _ID_FLOOR))
        except zstandard.ZstdError:
            return
        self.db.query("INSERT INTO dictionaries (id, space, data) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
                      [trained.dict_id(), space, trained.as_bytes()])
        self._loaded = False  # another importer may have trained one first: the first one made wins
        self._load()

    def _dictionary(self, did: int) -> zstandard.ZstdCompressionDict | None:
        d = self._dicts.get(did)
        if d is None:
            self._load()  # a dictionary another process trained since
            d = self._dicts.get(did)
        return d

    # -- encoding -------------------------------------------------------------------------

    def _compressor(self, did: int | None, level: int) -> Any:
        cache = getattr(self._local, "c", None)
        if cache is None:
            cache = self._local.c = {}
        c = cache.get((did, level))
        if c is None:
            d = self._dicts[did] if did is not None else None
            c = cache[did, level] = zstandard.ZstdCompressor(level=level, dict_data=d, write_content_size=True)
        return c

    def encode_many(self, objects: Sequence[tuple[int, bytes, bytes]], *,
                    block_ids: Callable[[int], list[int]] | None = None) -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]]:
        """(codec, stored bytes) of each (space code, name, bytes), and the blocks they
        name. Bytes that do not hash to their name (a corrupt put) are stored as they are,
        where the server sees it. Given ``block_ids`` (which draws that many new block
        ids), many objects go into blocks, in their order (codec 3); the others are
        compressed with their space's dictionary (else alone) where that is smaller. Many
        are compressed in one call that runs zstd on every core without the GIL (an
        import's batch, at :data:`LEVEL`); a few (an append's) one at a time, at
        :data:`FAST_LEVEL`."""
        sound = [len(data) >= COMPRESS_FROM and hashlib.sha256(data).digest() == raw for _, raw, data in objects]
        blocked: dict[int, bytes] = {}
        blocks: list[tuple[int, bytes]] = []
        if block_ids is not None and len(objects) >= BLOCK_FROM:
            blocked, blocks = self._blocks_of(objects, sound, block_ids)
        todo: dict[int | None, list[int]] = {}
        for i, (space, _, _) in enumerate(objects):
            if sound[i] and i not in blocked:
                todo.setdefault(self.current(space), []).append(i)
        codec = {i: ZSTD if did is None else ZSTD_DICT for did, idx in todo.items() for i in idx}
        frames: dict[int, bytes] = {}
        for did, idx in todo.items():
            compressor = self._compressor(did, LEVEL) if len(idx) >= MULTI_FROM else None
            if compressor is not None and hasattr(compressor, "multi_compress_to_buffer"):
                done = compressor.multi_compress_to_buffer([objects[i][2] for i in idx], threads=-1)
                frames.update((i, done[k].tobytes()) for k, i in enumerate(idx))
            else:
                compress = (compressor or self._compressor(did, FAST_LEVEL)).compress
                frames.update((i, compress(objects[i][2])) for i in idx)
        out = []
        for i, (_, _, data) in enumerate(objects):
            frame = frames.get(i)
            if i in blocked:
                out.append((BLOCK, blocked[i]))
            elif frame is not None and len(frame) < len(data):
                out.append((codec[i], frame))
            else:
                out.append((RAW, data))
        return out, blocks

    def _blocks_of(self, objects: Sequence[tuple[int, bytes, bytes]], sound: list[bool],
                   block_ids: Callable[[int], list[int]]) -> tuple[dict[int, bytes], list[tuple[int, bytes]]]:
        """The sound objects under :data:`BLOCK_OBJECT_MAX`, in order, cut into blocks of
        about :data:`BLOCK_TARGET` bytes: each one's pointer (by index) and the blocks
        (id, zstd frame), compressed in one call on every core."""
        groups: list[list[int]] = []
        size = BLOCK_TARGET
        for i, (_, _, data) in enumerate(objects):
            if not sound[i] or len(data) >= BLOCK_OBJECT_MAX:
                continue
            if size + len(data) > BLOCK_TARGET:
                groups.append([])
                size = 0
            groups[-1].append(i)
            size += len(data)
        if not groups:
            return {}, []
        ids = block_ids(len(groups))
        raw = [_pack_block([(objects[i][0], objects[i][2]) for i in idx]) for idx in groups]
        compressor = self._compressor(None, LEVEL)
        if len(raw) > 1 and hasattr(compressor, "multi_compress_to_buffer"):
            done = compressor.multi_compress_to_buffer(raw, threads=-1)
            frames = [done[k].tobytes() for k in range(len(raw))]
        else:
            frames = [compressor.compress(r) for r in raw]
        pointers = {i: POINTER.pack(bid, slot) for bid, idx in zip(ids, groups) for slot, i in enumerate(idx)}
        return pointers, list(zip(ids, frames))

    # -- decoding -------------------------------------------------------------------------

    def decode(self, codec: int, stored: bytes) -> bytes | None:
        """The object's bytes from a row; None when they cannot be had (a damaged frame, a
        dictionary the store does not hold, a block the store lacks)."""
        if codec == BLOCK:
            return self._in_block(stored)
        if codec != ZSTD_DICT:
            return decode_plain(codec, stored)
        try:
            did = zstandard.get_frame_parameters(stored).dict_id
        except zstandard.ZstdError:
            return None
        cache = getattr(self._local, "d", None)
        if cache is None:
            cache = self._local.d = {}
        d = cache.get(did)
        if d is None:
            found = self._dictionary(did) if did else None
            if found is None:
                return None
            d = cache[did] = zstandard.ZstdDecompressor(dict_data=found)
        try:
            return bytes(d.decompress(stored))
        except zstandard.ZstdError:
            return None

    def decode_many(self, rows: Sequence[tuple[int, bytes]]) -> list[bytes | None]:
        """:meth:`decode` of many rows; the frames of each codec decompressed in one call
        that runs without the GIL (a read-ahead's chunk), the blocks rows lie in read in
        one query. The frames of codec 2 are tried with the dictionary the first one names
        (a space has one), and grouped by the one each names only where that fails (zstd
        refuses a frame made with another)."""
        out: list[bytes | None] = [None] * len(rows)
        self.read_blocks({b for codec, stored in rows if codec == BLOCK and (b := block_of(stored)) is not None})
        if len(rows) < MULTI_FROM:
            return [self.decode(codec, stored) for codec, stored in rows]
        groups: dict[int, list[int]] = {ZSTD: [], ZSTD_DICT: []}
        for i, (codec, stored) in enumerate(rows):
            if codec == RAW:
                out[i] = stored
            elif codec == BLOCK:
                out[i] = self._in_block(stored)
            elif codec in groups:
                groups[codec].append(i)
        for codec, idx in groups.items():
            if not idx:
                continue
            d = None
            if codec == ZSTD_DICT:
                try:
                    d = self._dictionary(zstandard.get_frame_parameters(rows[idx[0]][1]).dict_id)
                except zstandard.ZstdError:
                    d = None
                if d is None:
                    self._decode_each(rows, idx, out)
                    continue
            try:
                done = zstandard.ZstdDecompressor(dict_data=d).multi_decompress_to_buffer([rows[i][1] for i in idx], threads=0)
                for k, i in enumerate(idx):
                    out[i] = done[k].tobytes()
            except zstandard.ZstdError:  # a damaged frame, or one made with another dictionary
                self._decode_each(rows, idx, out)
        return out

    def _decode_each(self, rows: Sequence[tuple[int, bytes]], idx: list[int], out: list[bytes | None]) -> None:
        for i in idx:
            out[i] = self.decode(*rows[i])

    # -- blocks ---------------------------------------------------------------------------

    def blocks(self, ids: Sequence[int] = (), *, start: int | None = None, count: int = 0,
               down: bool = False) -> dict[int, list[tuple[int, bytes]] | None]:
        """Blocks by id, decompressed (None for one whose frame is damaged): those of
        ``ids``, or the ``count`` first from ``start`` on, up (an import's blocks follow
        each other) or ``down`` (a walk up the parents). One query."""
        return {bid: unpack_block(frame) for bid, frame in self.block_frames(ids, start=start, count=count, down=down).items()}

    def block_frames(self, ids: Sequence[int] = (), *, start: int | None = None, count: int = 0,
                     down: bool = False) -> dict[int, bytes]:
        """The frames of the blocks :meth:`blocks` reads, by id, as stored."""
        if start is not None:
            rows = self.db.query(f"SELECT id, data FROM blocks WHERE id {'<=' if down else '>='} %s "
                                 f"ORDER BY id {'DESC' if down else ''} LIMIT %s", [start, count], binary=True)
        elif ids:
            rows = self.db.query("SELECT id, data FROM blocks WHERE id = ANY(%s)", [list(ids)], binary=True)
        else:
            return {}
        return {int(bid): bytes(data) for bid, data in rows}

    def read_blocks(self, ids: set[int]) -> None:
        """Have the blocks of ``ids`` in the cache (the ones it lacks read in one query)."""
        with self._lock:
            wanted = [b for b in ids if b not in self._blocks]
        if wanted:
            self._keep(self.blocks(wanted))

    def _keep(self, found: dict[int, list[tuple[int, bytes]] | None]) -> None:
        with self._lock:
            for bid, objects in found.items():
                self._blocks[bid] = objects
                self._blocks.move_to_end(bid)
            while len(self._blocks) > max(BLOCK_CACHE, len(found)):
                self._blocks.popitem(last=False)

    def _in_block(self, stored: bytes) -> bytes | None:
        """The bytes in the block slot a codec-3 row names (None: no such block or slot)."""
        if len(stored) != POINTER.size:
            return None
        bid, slot = POINTER.unpack(stored)
        with self._lock:
            held = bid in self._blocks
            objects = self._blocks.get(bid)
            if held:
                self._blocks.move_to_end(bid)
        if not held:
            found = self.blocks([bid])
            objects = found.get(bid)
            self._keep({bid: objects})
        return objects[slot][1] if objects is not None and slot < len(objects) else None


_plain = threading.local()


def _plain_decompressor() -> Any:
    d = getattr(_plain, "d", None)
    if d is None:
        d = _plain.d = zstandard.ZstdDecompressor()
    return d


def decode_plain(codec: int, stored: bytes) -> bytes | None:
    """Codecs 0 and 1, which need no dictionary; None for a damaged frame or another codec."""
    if codec == RAW:
        return stored
    if codec == ZSTD:
        try:
            return bytes(_plain_decompressor().decompress(stored))
        except zstandard.ZstdError:
            return None
    return None
