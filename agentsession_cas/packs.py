"""Packs: many objects in one zstd-compressed file, found through a sorted index.

A loose object costs a file (an inode, a block, a directory entry and, to be
durable, an fsync). A pack holds thousands: their bytes are concatenated in
**blocks** of about :data:`BLOCK_TARGET` bytes, each block one zstd frame, so
objects of one session compress together (they share most of their words)
while reading one object decompresses one block, not the pack. Beside each
pack, an index lists the objects' hashes sorted, with a 256-slot fan-out
table, so a lookup is a binary search over a memory map and never reads the
pack. Both files end in a BLAKE3 checksum of everything before it; the index
also holds the pack's checksum, which pairs the two.

Byte layout (all integers big-endian; see docs/storage-format.md)::

    pack-<h>.pack   "ASPACK\\0\\1"  block*  blake3(previous bytes)[32]
    pack-<h>.idx    "ASIDX\\0\\0\\1"  count:u32  blocks:u32
                    fanout: 256 x u32  (objects whose first byte <= i)
                    names:  count x 32 (raw SHA-256, ascending)
                    where:  count x (block:u32 offset:u32 length:u32 spaces:u8)
                    blocks: blocks x (offset:u64 size:u32 raw:u32)
                    pack checksum[32]   blake3(previous bytes)[32]

``<h>`` is the hex of the pack's checksum: a pack is named by its bytes, so
writing the same pack twice is harmless. The ``.pack`` is renamed into place
before the ``.idx``, and readers find packs by their index, so a pack is
visible whole or not at all.

Decompression is bounded: a block's raw size comes from the (checksummed)
index, may not exceed :data:`MAX_BLOCK`, and must agree with the size the
zstd frame declares before anything is allocated. Objects above
:data:`MAX_PACKED` stay loose.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Iterator

import blake3
import zstandard

from .errors import CorruptPackError, StoreError
from .fsutil import fsync_dir, write_all

__all__ = [
    "BLOCK_TARGET",
    "MAX_BLOCK",
    "MAX_PACKED",
    "SPACE_BITS",
    "Pack",
    "PackSet",
    "PackWriter",
]

PACK_MAGIC = b"ASPACK\x00\x01"
IDX_MAGIC = b"ASIDX\x00\x00\x01"
#: A block is closed once it holds this many raw bytes.
BLOCK_TARGET = 256 * 1024
#: Objects larger than this are not packed (they stay loose files).
MAX_PACKED = 32 * 1024 * 1024
#: No block may claim more raw bytes than this (bounds what a read allocates).
MAX_BLOCK = MAX_PACKED + BLOCK_TARGET
#: One bit per hash space in an index record.
SPACE_BITS = {"entries": 1, "contents": 2, "blobs": 4}

_HEAD = struct.Struct(">II")
_FANOUT = struct.Struct(">256I")
_WHERE = struct.Struct(">IIIB")
_BLOCK = struct.Struct(">QII")
_SUM = 32
_PREFIX = "sha256:"


def _raw(name: str) -> bytes:
    return bytes.fromhex(name[7:])


@dataclass(frozen=True)
class Located:
    """Where one object lies in a pack."""

    block: int
    offset: int
    length: int
    spaces: int


class Pack:
    """One pack and its index, opened read-only.

    The index is memory-mapped and checked (magic, sizes, checksum) when the
    pack is opened; the pack file is read block by block with ``pread``.
    """

    def __init__(self, idx_path: str):
        self.idx_path = idx_path
        self.path = idx_path[: -len(".idx")] + ".pack"
        self.name = os.path.basename(idx_path)[: -len(".idx")]
        with open(idx_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < len(IDX_MAGIC) + _HEAD.size + _FANOUT.size + 2 * _SUM:
                raise CorruptPackError(f"pack index {idx_path} is too short ({size} bytes)", path=idx_path)
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._check_index(size)
        except BaseException:
            self._map.close()  # a bad index is retried at every listing: leak no mapping
            raise
        # Opened now, so a pack merged or swept away later by another process
        # stays readable through this handle for as long as we hold it.
        try:
            self._fd: int | None = os.open(self.path, os.O_RDONLY)
        except BaseException:
            self._map.close()
            raise

    def _check_index(self, size: int) -> None:
        idx_path = self.idx_path
        m = self._map
        if m[: len(IDX_MAGIC)] != IDX_MAGIC:
            raise CorruptPackError(f"pack index {idx_path} does not start with the index magic", path=idx_path)
        if blake3.blake3(m[: size - _SUM]).digest() != m[size - _SUM :]:
            raise CorruptPackError(f"pack index {idx_path} fails its checksum", path=idx_path)
        self.count, self.nblocks = _HEAD.unpack_from(m, len(IDX_MAGIC))
        o = len(IDX_MAGIC) + _HEAD.size
        self._fanout = _FANOUT.unpack_from(m, o)
        o += _FANOUT.size
        self._names_at = o
        o += 32 * self.count
        self._where_at = o
        o += _WHERE.size * self.count
        self._blocks_at = o
        o += _BLOCK.size * self.nblocks
        if o + 2 * _SUM != size or self._fanout[255] != self.count:
            raise CorruptPackError(f"pack index {idx_path} is not laid out as its counts say", path=idx_path)
        self.pack_sum = bytes(m[o : o + _SUM])
        self._finds = 0
        self._index: dict[bytes, int] | None = None

    # -- the index --------------------------------------------------------------

    def _name_at(self, i: int) -> bytes:
        o = self._names_at + 32 * i
        return self._map[o : o + 32]

    #: After this many lookups in one pack, its names are loaded into a dict: a
    #: bulk reader (export, exchange, sweep) then pays a hash lookup per object,
    #: while a process that asks for a few objects never pays for the load.
    DICT_AFTER = 2048

    def find(self, name: str) -> Located | None:
        """Where ``name`` lies, or None: a binary search within its fan-out slot
        (a dict once this pack has been asked often)."""
        raw = _raw(name)
        index = self._index
        if index is not None:
            i = index.get(raw)
            return None if i is None else Located(*_WHERE.unpack_from(self._map, self._where_at + _WHERE.size * i))
        self._finds += 1
        if self._finds > self.DICT_AFTER:
            names = self._map[self._names_at : self._names_at + 32 * self.count]
            self._index = {names[o : o + 32]: i for i, o in enumerate(range(0, len(names), 32))}
            return self.find(name)
        first = raw[0]
        lo = self._fanout[first - 1] if first else 0
        hi = self._fanout[first]
        m, base = self._map, self._names_at
        while lo < hi:
            mid = (lo + hi) >> 1
            o = base + 32 * mid
            probe = m[o : o + 32]
            if probe < raw:
                lo = mid + 1
            elif probe > raw:
                hi = mid
            else:
                return Located(*_WHERE.unpack_from(m, self._where_at + _WHERE.size * mid))
        return None

    def block_info(self, block: int) -> tuple[int, int, int]:
        """(offset in the pack, compressed size, raw size) of a block."""
        if not 0 <= block < self.nblocks:
            raise CorruptPackError(f"pack index {self.idx_path} names block {block} of {self.nblocks}", path=self.idx_path)
        return _BLOCK.unpack_from(self._map, self._blocks_at + _BLOCK.size * block)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[str, Located]]:
        """Every object, in hash order."""
        for raw, where in self.records():
            yield _PREFIX + raw.hex(), Located(*where)

    def records(self) -> Iterator[tuple[bytes, tuple[int, int, int, int]]]:
        """(raw name, (block, offset, length, spaces)) of every object, in hash order,
        unpacked in bulk (merges and sweeps walk whole indexes)."""
        m = self._map
        names = m[self._names_at : self._names_at + 32 * self.count]
        wheres = _WHERE.iter_unpack(m[self._where_at : self._where_at + _WHERE.size * self.count])
        return zip((names[i : i + 32] for i in range(0, len(names), 32)), wheres)

    def objects_by_block(self) -> list[list[tuple[int, int, bytes, int]]]:
        """For each block, its objects as (offset, length, raw name, spaces) in the
        order they lie: a repack reads each block once and cuts it up."""
        blocks: list[list[tuple[int, int, bytes, int]]] = [[] for _ in range(self.nblocks)]
        for raw, (block, offset, length, spaces) in self.records():
            if not 0 <= block < self.nblocks:
                raise CorruptPackError(
                    f"pack index {self.idx_path} names block {block} of {self.nblocks}", path=self.idx_path
                )
            blocks[block].append((offset, length, raw, spaces))
        for objs in blocks:
            objs.sort()
        return blocks

    # -- the pack ---------------------------------------------------------------

    def _pack_fd(self) -> int:
        if self._fd is None:
            raise CorruptPackError(f"pack {self.path} is closed", path=self.path)
        return self._fd

    def read_block_raw(self, block: int) -> bytes:
        """A block's compressed bytes, as stored."""
        offset, size, _ = self.block_info(block)
        data = os.pread(self._pack_fd(), size, offset)
        if len(data) != size:
            raise CorruptPackError(f"pack {self.path} ends inside block {block}", path=self.path)
        return data

    def read_block(self, block: int) -> bytes:
        """A block decompressed, its size bounded by the index before any allocation."""
        _, _, raw = self.block_info(block)
        data = self.read_block_raw(block)
        return decompress_block(data, raw, where=f"pack {self.path} block {block}", path=self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            self._map.close()
        except (BufferError, ValueError):
            pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def check_pack_checksum(self) -> None:
        """Read the whole pack and compare its checksum with its trailer and the index."""
        h = blake3.blake3()
        fd = self._pack_fd()
        size = os.fstat(fd).st_size
        if size < len(PACK_MAGIC) + _SUM:
            raise CorruptPackError(f"pack {self.path} is too short ({size} bytes)", path=self.path)
        pos, end = 0, size - _SUM
        while pos < end:
            chunk = os.pread(fd, min(1 << 22, end - pos), pos)
            if not chunk:
                raise CorruptPackError(f"pack {self.path} could not be read to its end", path=self.path)
            if pos == 0 and chunk[: len(PACK_MAGIC)] != PACK_MAGIC:
                raise CorruptPackError(f"pack {self.path} does not start with the pack magic", path=self.path)
            h.update(chunk)
            pos += len(chunk)
        trailer = os.pread(fd, _SUM, end)
        digest = h.digest()
        if digest != trailer:
            raise CorruptPackError(f"pack {self.path} fails its checksum", path=self.path)
        if digest != self.pack_sum:
            raise CorruptPackError(f"pack {self.path} is not the pack its index {self.idx_path} describes", path=self.path)


def decompress_block(data: bytes, raw: int, *, where: str, path: str) -> bytes:
    if raw > MAX_BLOCK:
        raise CorruptPackError(f"{where} claims {raw} bytes, more than a block may hold", path=path)
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        raise CorruptPackError(f"{where} is not a zstd frame", path=path) from None
    if declared not in (raw, -1):
        raise CorruptPackError(f"{where} declares {declared} bytes where the index says {raw}", path=path)
    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw)
    except zstandard.ZstdError as exc:
        raise CorruptPackError(f"{where} does not decompress: {exc}", path=path) from None
    if len(out) != raw:
        raise CorruptPackError(f"{where} decompresses to {len(out)} bytes, not {raw}", path=path)
    return out


class PackWriter:
    """Write one pack and its index: objects are added in the order they should
    sit (a session's objects together compress best), then :meth:`finish`
    makes both files durable and renames them into ``pack_dir``."""

    def __init__(self, pack_dir: str, tmp_dir: str, *, level: int = 3, block_target: int = BLOCK_TARGET):
        self.pack_dir = pack_dir
        self.tmp_dir = tmp_dir
        self.block_target = block_target
        self._cctx = zstandard.ZstdCompressor(level=level, write_checksum=False)
        self._tmp = os.path.join(tmp_dir, f"pack-{os.getpid()}-{os.urandom(6).hex()}")
        try:
            self._fd = os.open(self._tmp + ".pack", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            os.makedirs(tmp_dir, exist_ok=True)
            self._fd = os.open(self._tmp + ".pack", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._hash = blake3.blake3()
        self._out: list[bytes] = []  # compressed bytes not yet written (see WRITE_BUFFER)
        self._out_len = 0
        self._pos = 0
        self._objects: dict[bytes, list[int]] = {}  # raw name -> [block, offset, length, spaces]
        self._blocks: list[tuple[int, int, int]] = []
        self._buf: list[bytes] = []
        self._buf_len = 0
        self._write(PACK_MAGIC)

    def __contains__(self, name: str) -> bool:
        return _raw(name) in self._objects

    def __len__(self) -> int:
        return len(self._objects)

    #: Compressed bytes are gathered up to this much before one write: a writer
    #: on a worker thread then gives up the interpreter lock a few times per
    #: pack, not once per block (each hand-back can wait a switch interval).
    WRITE_BUFFER = 8 << 20

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        self._out_len += len(data)
        self._pos += len(data)
        if self._out_len >= self.WRITE_BUFFER:
            self._drain()

    def _drain(self) -> None:
        if self._out:
            data = b"".join(self._out)
            self._out, self._out_len = [], 0
            write_all(self._fd, data)
            self._hash.update(data)

    def add(self, space: str, name: str, data: bytes) -> None:
        """Add an object (the caller vouches that ``name`` is its hash)."""
        self.add_raw(_raw(name), SPACE_BITS[space], data)

    def add_raw(self, raw: bytes, spaces: int, data: bytes) -> None:
        """Add an object by its raw name and space bits (a repack copying objects)."""
        known = self._objects.get(raw)
        if known is not None:
            known[3] |= spaces
            return
        if self._buf_len and self._buf_len + len(data) > self.block_target:
            self._flush()
        self._objects[raw] = [len(self._blocks), self._buf_len, len(data), spaces]
        self._buf.append(data)
        self._buf_len += len(data)
        if self._buf_len >= self.block_target:
            self._flush()

    def copy_pack(self, pack: "Pack") -> None:
        """Copy every block of another pack as it is (a merge need not recompress),
        and take over its index records with their block numbers shifted."""
        self._flush()
        if not pack.nblocks:
            return
        first = len(self._blocks)
        start = pack.block_info(0)[0]
        blocks = [pack.block_info(b) for b in range(pack.nblocks)]
        end = blocks[-1][0] + blocks[-1][1]
        data = os.pread(pack._pack_fd(), end - start, start)
        if len(data) != end - start:
            raise CorruptPackError(f"pack {pack.path} ends inside its blocks", path=pack.path)
        shift = self._pos - start
        self._blocks.extend((off + shift, size, raw) for off, size, raw in blocks)
        self._write(data)
        objects = self._objects
        for raw, (block, offset, length, spaces) in pack.records():
            known = objects.get(raw)
            if known is not None:
                known[3] |= spaces
            else:
                objects[raw] = [block + first, offset, length, spaces]

    def _flush(self) -> None:
        if not self._buf:  # (not the byte count: an empty object still needs its block)
            return
        raw = b"".join(self._buf)
        data = self._cctx.compress(raw)
        self._blocks.append((self._pos, len(data), len(raw)))
        self._write(data)
        self._buf, self._buf_len = [], 0

    def finish(self) -> str:
        """Seal, fsync and rename into place; return the index's path. A pack of
        no objects is refused (and its temp file removed): nothing would find it."""
        if not self._objects:
            self.abort()
            raise StoreError("refusing to write an empty pack")
        self._flush()
        self._drain()
        pack_sum = self._hash.digest()
        write_all(self._fd, pack_sum)
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1
        names = sorted(self._objects)
        fanout = [0] * 256
        for raw in names:
            fanout[raw[0]] += 1
        total = 0
        for i in range(256):
            total += fanout[i]
            fanout[i] = total
        objs = self._objects
        parts = [
            IDX_MAGIC,
            _HEAD.pack(len(names), len(self._blocks)),
            _FANOUT.pack(*fanout),
            b"".join(names),
            b"".join(_WHERE.pack(*objs[raw]) for raw in names),
            b"".join(_BLOCK.pack(*b) for b in self._blocks),
            pack_sum,
        ]
        body = b"".join(parts)
        idx = body + blake3.blake3(body).digest()
        fd = os.open(self._tmp + ".idx", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, idx)
            os.fsync(fd)
        finally:
            os.close(fd)
        final = os.path.join(self.pack_dir, f"pack-{pack_sum.hex()}")
        try:
            os.replace(self._tmp + ".pack", final + ".pack")
        except FileNotFoundError:
            os.makedirs(self.pack_dir, exist_ok=True)  # the store's first pack
            fsync_dir(os.path.dirname(self.pack_dir))
            os.replace(self._tmp + ".pack", final + ".pack")
        os.replace(self._tmp + ".idx", final + ".idx")  # the index last: the pack is now visible
        fsync_dir(self.pack_dir)
        return final + ".idx"

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for ext in (".pack", ".idx"):
            try:
                os.unlink(self._tmp + ext)
            except FileNotFoundError:
                pass


class PackSet:
    """The packs of one store, found by listing ``objects/pack`` and listed again
    when a lookup misses and the directory has changed (another process packed,
    merged or swept). Decompressed blocks are kept in a small LRU cache, since
    reading a session reads its objects in the order they were packed."""

    CACHE_BLOCKS = 16
    #: A directory changed this recently may change again without its mtime
    #: moving (timestamps come from a coarse clock, or whole seconds on some
    #: filesystems): until it is older, a miss lists it again (git's "racy" rule).
    RACY_NS = 2_000_000_000

    def __init__(self, pack_dir: str):
        self.dir = pack_dir
        self.packs: list[Pack] = []
        self._seen: int | None = None  # mtime_ns of the directory when last listed
        self._racy = False  # listed within RACY_NS of that mtime: not to be trusted
        self._cache: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        #: Packs found unreadable when listed (name -> why); skipped by reads.
        self.bad: dict[str, str] = {}
        self._lock = threading.RLock()

    def refresh(self, *, force: bool = False) -> bool:
        """List the directory again if it changed; True when the set changed."""
        with self._lock:
            return self._refresh(force)

    def _refresh(self, force: bool) -> bool:
        try:
            mtime = os.stat(self.dir).st_mtime_ns
        except FileNotFoundError:
            mtime = -1  # no pack yet: listed all the same
        if mtime == self._seen and not force and not self._racy:
            return False
        self._seen = mtime
        self._racy = mtime >= 0 and time.time_ns() - mtime < self.RACY_NS
        try:
            names = sorted(n for n in os.listdir(self.dir) if n.startswith("pack-") and n.endswith(".idx"))
        except FileNotFoundError:
            names = []
        listed = {n[: -len(".idx")] for n in names}
        self.bad = {k: v for k, v in self.bad.items() if k in listed}  # gone since: no longer a problem
        old = {p.name: p for p in self.packs}
        packs = []
        for n in names:
            key = n[: -len(".idx")]
            if key in old:
                packs.append(old.pop(key))
                continue
            try:
                packs.append(Pack(os.path.join(self.dir, n)))
            except FileNotFoundError:
                continue  # removed between the listing and the open
            except (CorruptPackError, OSError, ValueError) as exc:
                # Not served, not fatal: reads go on from the other packs and loose
                # copies, and fsck names the file.
                self.bad[key] = str(exc)
                continue
            self.bad.pop(key, None)
        # Packs gone from the listing are not closed here: another thread may be
        # reading one this moment; each closes itself when no longer referenced.
        # Biggest first: most lookups are answered by the first pack asked.
        packs.sort(key=lambda p: -p.count)
        changed = [p.name for p in packs] != [p.name for p in self.packs]
        self.packs = packs
        return changed

    def locate(self, name: str) -> tuple[Pack, Located] | None:
        if self._seen is None:
            self.refresh()
        for p in self.packs:
            loc = p.find(name)
            if loc is not None:
                return p, loc
        return None

    def read(self, pack: Pack, loc: Located) -> bytes:
        key = (pack.name, loc.block)
        with self._lock:  # a checkpoint's worker thread reads and writes packs too
            block = self._cache.get(key)
            if block is not None:
                self._cache.move_to_end(key)
        if block is None:
            block = pack.read_block(loc.block)
            with self._lock:
                self._cache[key] = block
                if len(self._cache) > self.CACHE_BLOCKS:
                    self._cache.popitem(last=False)
        end = loc.offset + loc.length
        if end > len(block):
            raise CorruptPackError(
                f"pack index {pack.idx_path} places an object past the end of block {loc.block}", path=pack.idx_path
            )
        return block[loc.offset : end]

    def close(self) -> None:
        for p in self.packs:
            p.close()
        self.packs = []
        self._cache.clear()
        self._seen = None
