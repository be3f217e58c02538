"""How an object's bytes are kept in the ``objects`` table: as they are, as a zstd frame,
or as a zstd frame made with a dictionary the store trained on its own objects.

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
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import zstandard

if TYPE_CHECKING:
    from .database import Database

__all__ = ["RAW", "ZSTD", "ZSTD_DICT", "Compression", "decode_plain"]

RAW, ZSTD, ZSTD_DICT = 0, 1, 2
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

    def encode_many(self, objects: Sequence[tuple[int, bytes, bytes]]) -> list[tuple[int, bytes]]:
        """(codec, stored bytes) of each (space code, name, bytes). Bytes that do not hash to
        their name (a corrupt put) are stored as they are, where the server sees it; the
        others compressed with their space's dictionary (else alone) where that is smaller.
        Many are compressed in one call that runs zstd on every core without the GIL (an
        import's batch, at :data:`LEVEL`); a few (an append's) one at a time, at
        :data:`FAST_LEVEL`."""
        todo: dict[int | None, list[int]] = {}
        for i, (space, raw, data) in enumerate(objects):
            if len(data) >= COMPRESS_FROM and hashlib.sha256(data).digest() == raw:
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
            if frame is not None and len(frame) < len(data):
                out.append((codec[i], frame))
            else:
                out.append((RAW, data))
        return out

    # -- decoding -------------------------------------------------------------------------

    def decode(self, codec: int, stored: bytes) -> bytes | None:
        """The object's bytes from a row; None when they cannot be had (a damaged frame, a
        dictionary the store does not hold)."""
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
        that runs without the GIL (a read-ahead's chunk). The frames of codec 2 are tried
        with the dictionary the first one names (a space has one), and grouped by the one
        each names only where that fails (zstd refuses a frame made with another)."""
        out: list[bytes | None] = [None] * len(rows)
        if len(rows) < MULTI_FROM:
            return [self.decode(codec, stored) for codec, stored in rows]
        groups: dict[int, list[int]] = {ZSTD: [], ZSTD_DICT: []}
        for i, (codec, stored) in enumerate(rows):
            if codec == RAW:
                out[i] = stored
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


_plain = threading.local()


def decode_plain(codec: int, stored: bytes) -> bytes | None:
    """Codecs 0 and 1, which need no dictionary; None for a damaged frame or another codec."""
    if codec == RAW:
        return stored
    if codec == ZSTD:
        d = getattr(_plain, "d", None)
        if d is None:
            d = _plain.d = zstandard.ZstdDecompressor()
        try:
            return bytes(d.decompress(stored))
        except zstandard.ZstdError:
            return None
    return None
