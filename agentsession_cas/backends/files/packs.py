"""Packs: many objects in one zstd-compressed file, found through a sorted index.

A loose object costs a file (an inode, a block, a directory entry and, to be
durable, an fsync). A pack holds thousands: they are grouped in **blocks**,
each one zstd frame of about :data:`BLOCK_TARGET` bytes, so objects of one
session compress together (they share most of their words) while reading one
object decompresses one block, not the pack. Beside each pack, an index lists
the objects' hashes sorted, with a 256-slot fan-out table, so a lookup is a
binary search over a memory map and never reads the pack. Both files end in a
BLAKE3 checksum of everything before it; the index also holds the pack's
checksum, which pairs the two.

Inside a block each object has a **slot**; the index maps a name to its
ordinal (which block, which slot), and the block says where each slot lies. A
slot holds its object as it is (kind 0) or in one of two lossless encodings
that a full repack uses (``encode=True``), because hashes are what no
compressor can shrink:

* kind 1, an envelope of the common form (:data:`hashing.FAST_ENVELOPE`):
  its ``content`` and ``parent`` hashes are written as "the slot *d* places
  back" when that object is in the same block (an entry's content lies just
  before it, its parent two places before), else as 32 raw bytes; then ``ts``
  and ``type``. Reading it hashes the slots it points to.
* kind 2, a content with long random base64 runs (``encrypted_content``):
  each run is cut out and its decoded bytes kept, uncompressed, in the
  block's **side** area; zstd then compresses the text around it better.

Every read still hashes the bytes it rebuilds against the name asked for, so
an encoding error can never serve wrong bytes.

Byte layout (all integers big-endian; see docs/storage-format.md)::

    pack-<h>.pack   "ASPACK\\0\\2"  block*  blake3(previous bytes)[32]
      block         zstd frame of the stream  side bytes
      stream        kinds: count x u8  lengths: count x u32  side: count x u32
                    payloads (concatenated, in slot order)
    pack-<h>.idx    "ASIDX\\0\\0\\2"  count:u32  blocks:u32
                    fanout: 256 x u32  (objects whose first byte <= i)
                    names:  count x 32 (raw SHA-256, ascending)
                    where:  count x u32  (ordinal << 3 | space bits)
                    blocks: blocks x (offset:u64 zsize:u32 raw:u32 side:u32
                                      first:u32 slots:u32)
                    pack checksum[32]   blake3(previous bytes)[32]

``<h>`` is the hex of the pack's checksum: a pack is named by its bytes, so
writing the same pack twice is harmless. The ``.pack`` is renamed into place
before the ``.idx``, and readers find packs by their index, so a pack is
visible whole or not at all. Packs of the first format (``\\1``: each object's
block, offset and length in the index, objects as they are) are still read.

Decompression is bounded: a block's raw and side sizes come from the
(checksummed) index, may not exceed :data:`MAX_BLOCK`, and the raw size must
agree with the size the zstd frame declares before anything is allocated.
Objects above :data:`MAX_PACKED` stay loose.
"""

from __future__ import annotations

import array
import base64
import binascii
import contextlib
import errno
import functools
import hashlib
import itertools
import mmap
import operator
import os
import re
import stat
import struct
import sys
import threading
import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, NamedTuple

import blake3
import zstandard

from ...errors import CorruptPackError, StoreError, store_relative
from ...format.hashing import FAST_ENVELOPE, envelope_content, is_hash
from ...fsutil import fsync_dir, write_all, write_new_file
from ..base import ReadyBlock
from . import packindex

if TYPE_CHECKING:  # loaded when a read first reads ahead: a command that does not, does not load it
    import subprocess
    from concurrent.futures import Future, ThreadPoolExecutor

__all__ = [
    "pack_file_sound",
    "salvage_pack",
    "BLOCK_TARGET",
    "MAX_BLOCK",
    "MAX_PACKED",
    "SPACE_BITS",
    "Pack",
    "PackSet",
    "PackWriter",
]

PACK_MAGIC = b"ASPACK\x00\x02"
IDX_MAGIC = b"ASIDX\x00\x00\x02"
#: The first format, still read.
PACK_MAGIC_V1 = b"ASPACK\x00\x01"
IDX_MAGIC_V1 = b"ASIDX\x00\x00\x01"
#: A block is closed once its stream holds this many raw bytes.
BLOCK_TARGET = 256 * 1024
#: Objects larger than this are not packed (they stay loose files).
MAX_PACKED = 32 * 1024 * 1024
#: The zstd level of the packs an import writes as its pass goes (its own blocks and the
#: ready ones its helper process makes). Level 3 while the main process's pass was what an
#: import waited for (level 1 then gained nothing: 2,632 against 2,639 ms idle). Since the
#: helper is sent its blocks through shared memory it answers every block, and its work,
#: of which this compression is the largest single part, is as long as the main
#: process's: on the 100k benchmark file (its whole work, in one process, alternated)
#: level 3 2.21 s of CPU and 61.7 MB of frames, level 2 2.13-2.27 s and 62.9 MB (+2.0%),
#: level 1 1.95-1.97 s and 65.8 MB (+6.6%, until a repack, which recompresses at level 13,
#: ``objects.REPACK_LEVEL``). The main process is then again the longer side.
STREAM_LEVEL = 1
#: The largest block target a writer takes: with envelopes counted at
#: ENVELOPE_SIZE (up to ENVELOPE_COUNTED bytes), no block outgrows MAX_BLOCK.
MAX_TARGET = 4 * 1024 * 1024
#: No block may claim more raw (or side) bytes than this (bounds what a read allocates).
MAX_BLOCK = MAX_PACKED + BLOCK_TARGET + (MAX_PACKED // 2)
#: Nor more stored bytes: its zstd frame (which may exceed its raw size a little)
#: and its side bytes.
MAX_STORED = 2 * MAX_BLOCK + (MAX_BLOCK >> 7) + 4096
#: One bit per hash space in an index record.
SPACE_BITS = {"entries": 1, "contents": 2, "blobs": 4}
#: Slot kinds.
KIND_PLAIN, KIND_ENVELOPE, KIND_SIDE = 0, 1, 2
#: Ordinals fit beside three space bits in a u32.
MAX_OBJECTS = 1 << 29

_HEAD = struct.Struct(">II")
_FANOUT = packindex.FANOUT
_WHERE_V1 = struct.Struct(">IIIB")
_BLOCK_V1 = struct.Struct(">QII")
_WHERE = struct.Struct(">I")
_BLOCK = struct.Struct(">QIIIII")
_SUM = 32
_PREFIX = "sha256:"
_SIDE_MARK = 0xFA  # never a byte of UTF-8 text, so never of a canonical JSON content
_B64_RUN = re.compile(rb"[A-Za-z0-9+/]{64,}={0,2}")
_HEX_ONLY = re.compile(rb"[0-9a-f]+")


#: A writer's record of an object whose block is not cut yet (encoding): ordinal -1.
_UNCUT = -1 << 3


def _raw(name: str) -> bytes:
    return bytes.fromhex(name[7:])


def _raw_names(names: Sequence[str], spaces: bytes, datas: Sequence[bytes]) -> bytes:
    """The raw names (32 bytes each, in order) of objects handed to a pack writer with
    their space bits and bytes, made in one step, not one call each."""
    raws = bytes.fromhex("".join(names).replace(_PREFIX, ""))
    if len(raws) != 32 * len(names) or len(spaces) != len(names) or len(datas) != len(names):
        raise StoreError(f"{len(names)} objects handed to a pack writer with {len(raws)} bytes of names, "
                         f"{len(spaces)} spaces and {len(datas)} objects' bytes")
    return raws


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(data, pos: int, end: int | None = None) -> tuple[int, int]:
    """An unsigned LEB128 number at ``pos`` (not reading at or past ``end``), and
    the position after it; ValueError when it runs past ``end`` or 63 bits."""
    if end is None:
        end = len(data)
    n = shift = 0
    while True:
        if pos >= end or shift > 56:
            raise ValueError("a varint runs past its end or past 63 bits")
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7


class Located(NamedTuple):
    """Where one object lies in a pack: its block, and in it its slot (format 2;
    ``length`` is -1) or its byte offset and length (format 1). A named tuple: one is
    made per object read, and a frozen dataclass costs several times as much to make."""

    block: int
    offset: int
    length: int
    spaces: int


# -- encodings of one slot ----------------------------------------------------------


def _looks_random(raw: bytes) -> bool:
    """Whether decoded base64 looks like random bytes (as encrypted or compressed data
    does): about as many distinct byte values as random bytes would show. Text that
    happens to be in the base64 alphabet compresses better left where it is."""
    head = raw[:256]
    n = len(head)
    expected = 256.0 * (1.0 - (255.0 / 256.0) ** n)
    return len(set(head)) >= 0.8 * expected


def encode_side(data: bytes) -> tuple[bytes, bytes] | None:
    """``data`` with its long random base64 runs cut out (each replaced by the mark
    byte and the decoded length), and the decoded bytes; None when nothing is cut.
    Only runs that decode and encode back to themselves are cut: the result is exact."""
    if _SIDE_MARK in data:
        return None
    side: list[bytes] = []

    def cut(m: re.Match) -> bytes:
        run = m.group(0)
        if len(run) % 4 or _HEX_ONLY.fullmatch(run):
            return run
        try:
            raw = base64.b64decode(run, validate=True)
        except (binascii.Error, ValueError):
            return run
        if base64.b64encode(raw) != run or not _looks_random(raw):
            return run
        side.append(raw)
        return bytes((_SIDE_MARK,)) + _varint(len(raw))

    out = _B64_RUN.sub(cut, data)
    if not side:
        return None
    return out, b"".join(side)


def decode_side(payload: bytes, side: bytes) -> bytes:
    """The inverse of :func:`encode_side`; ValueError when the two do not fit."""
    parts: list[bytes] = []
    pos = used = 0
    while True:
        i = payload.find(_SIDE_MARK, pos)
        if i < 0:
            parts.append(payload[pos:])
            break
        parts.append(payload[pos:i])
        n, pos = read_varint(payload, i + 1)
        if used + n > len(side):
            raise ValueError("a cut run reaches past the side bytes")
        parts.append(base64.b64encode(side[used : used + n]))
        used += n
    if used != len(side):
        raise ValueError("side bytes left over")
    return b"".join(parts)


#: An envelope whose parent chain within its block is this long names its parent by
#: hash: reading one envelope then hashes at most this many others (and their
#: contents) to rebuild it, wherever it lies in its block.
MAX_CHAIN = 32


def encode_envelope(
    data: bytes, slot: int, local: dict[bytes, int], depth: dict[int, int], plain: int | None = None
) -> bytes | None:
    """An envelope of the common form as a kind-1 payload (None for any other form):
    flags, its content and parent as back references to slots of this block
    (``local``: raw name -> slot) or raw hashes, then ts, NUL, type. A content may
    point back only to the block's first ``plain`` slots (those before its envelopes;
    default: all before ``slot``), so rebuilding one never needs another envelope's
    content chain. ``depth`` (slot -> length of its chain of back-referenced
    parents) is kept up to date here."""
    m = FAST_ENVELOPE.fullmatch(data)
    return None if m is None else _encode_envelope(m, slot, local, depth, slot if plain is None else plain)


def _encode_envelope(m: re.Match, slot: int, local: dict[bytes, int], depth: dict[int, int], plain: int) -> bytes:
    content, parent, ts, type_ = m.groups()
    out = bytearray(1)
    flags = 0
    c = bytes.fromhex(content[7:].decode())
    at = local.get(c)
    if at is not None and at < min(slot, plain):  # (references point back only, and not at envelopes)
        flags |= 1
        out += _varint(slot - at)
    else:
        out += c
    chain = 0
    if parent is not None:
        flags |= 2
        p = bytes.fromhex(parent[7:].decode())
        at = local.get(p)
        if at is not None and at < slot and depth.get(at, 0) < MAX_CHAIN:
            flags |= 4
            out += _varint(slot - at)
            chain = depth.get(at, 0) + 1
        else:
            out += p
    depth[slot] = chain
    out[0] = flags
    out += ts + b"\x00" + type_
    return bytes(out)


def _reference(payload: bytes, pos: int, slot: int, back: bool, what: str) -> tuple[object, int]:
    """A slot number (``back``: a varint counting back from ``slot``) or a raw hash."""
    if not back:
        return payload[pos : pos + 32], pos + 32
    d, pos = read_varint(payload, pos)
    if not 0 < d <= slot:
        raise ValueError(f"{what} reference {d} slots back from slot {slot}")
    return slot - d, pos


def _envelope_refs(payload: bytes, slot: int) -> tuple[int, object, object, int]:
    """(flags, content, parent, where ts starts) of a kind-1 payload: each reference a
    slot number (int) or raw hash (bytes); parent None when null."""
    flags = payload[0]
    if flags > 7 or (flags & 4 and not flags & 2):
        raise ValueError(f"envelope flags {flags} are not a known combination")
    content, pos = _reference(payload, 1, slot, bool(flags & 1), "content")
    parent: object = None
    if flags & 2:
        parent, pos = _reference(payload, pos, slot, bool(flags & 4), "parent")
    if pos > len(payload) or payload.find(b"\x00", pos) < 0:
        raise ValueError("envelope payload cut short")
    return flags, content, parent, pos


def _envelope_bytes(content: bytes, parent: bytes | None, rest: bytes) -> bytes:
    ts, _, type_ = rest.partition(b"\x00")
    return b"".join((
        b'{"content":"sha256:', content.hex().encode(), b'","parent":',
        b"null" if parent is None else b'"sha256:' + parent.hex().encode() + b'"',
        b',"ts":"', ts, b'","type":"', type_, b'"}',
    ))


class Block:
    """One decompressed block of a format-2 pack: its slots, decoded on demand.
    Decoding an envelope needs the names of the slots it points to, which are
    hashed once and remembered, as are rebuilt envelopes (the next one needs its
    parent's name)."""

    __slots__ = ("kinds", "starts", "ends", "side_at", "stream", "side", "names", "decoded", "where", "path")

    def __init__(self, stream: bytes, side: bytes, count: int, *, where: str, path: str):
        self.where, self.path = where, path
        table = 9 * count
        if table > len(stream):
            raise CorruptPackError(f"{where} is too short for its {count} slot(s)", path=path)
        self.kinds = stream[:count]
        lengths = struct.unpack_from(f">{count}I", stream, count)
        sides = struct.unpack_from(f">{count}I", stream, 5 * count)
        self.ends = list(itertools.accumulate(lengths, initial=table))
        self.starts = self.ends[:-1]
        del self.ends[0]
        self.side_at = list(itertools.accumulate(sides, initial=0))
        if count and (self.ends[-1] != len(stream) or self.side_at[-1] != len(side)):
            raise CorruptPackError(f"{where}: its slot table does not add up to its bytes", path=path)
        self.stream, self.side = stream, side
        self.names: dict[int, bytes] = {}
        self.decoded: dict[int, bytes] = {}  # rebuilt envelopes

    def __len__(self) -> int:
        return len(self.kinds)

    def object(self, slot: int, length: int = -1) -> bytes:
        """The bytes of the object in ``slot`` (``length`` is format 1's and unused)."""
        if not 0 <= slot < len(self.kinds):
            raise CorruptPackError(f"{self.where} has no slot {slot}", path=self.path)
        if self.kinds[slot] == KIND_PLAIN:  # the common case, without a call more
            return self.stream[self.starts[slot] : self.ends[slot]]
        try:
            return self._decode(slot)
        except (ValueError, IndexError, struct.error, RecursionError) as exc:
            raise CorruptPackError(f"{self.where} slot {slot} does not decode: {exc}", path=self.path) from None

    def _payload(self, slot: int) -> bytes:
        return self.stream[self.starts[slot] : self.ends[slot]]

    def _decode(self, slot: int) -> bytes:
        kind = self.kinds[slot]
        if kind == KIND_PLAIN:
            return self._payload(slot)
        if kind == KIND_SIDE:
            return decode_side(self._payload(slot), self.side[self.side_at[slot] : self.side_at[slot + 1]])
        if kind != KIND_ENVELOPE:
            raise ValueError(f"unknown slot kind {kind}")
        got = self.decoded.get(slot)
        return got if got is not None else self._decode_envelope(slot)

    def _decode_envelope(self, slot: int) -> bytes:
        """Rebuild an envelope and, first, the envelopes its parent chain in this block
        needs (oldest first: a chain costs a loop, not recursion)."""
        decoded, kinds = self.decoded, self.kinds
        chain = []
        k = slot
        while True:
            refs = _envelope_refs(self._payload(k), k)
            chain.append((k, refs))
            p = refs[2]
            if type(p) is int and p not in decoded and kinds[p] == KIND_ENVELOPE:
                k = p
                continue
            break
        for k, (_, c, p, pos) in reversed(chain):
            if type(c) is int:
                if kinds[c] == KIND_ENVELOPE:
                    raise ValueError(f"content reference from slot {k} to an envelope (slot {c})")
                c = self._name(c)
            if type(p) is int:
                p = self._name(p)
            decoded[k] = _envelope_bytes(c, p, self._payload(k)[pos:])  # type: ignore[arg-type]
        return decoded[slot]

    def _name(self, slot: int) -> bytes:
        """The hash of the object in ``slot`` (remembered: the next envelope needs it)."""
        got = self.names.get(slot)
        if got is None:
            got = self.names[slot] = hashlib.sha256(self._decode(slot)).digest()
        return got


class _FlatBlock:
    """A decompressed block of a format-1 pack: objects are byte ranges."""

    __slots__ = ("data", "where", "path")

    def __init__(self, data: bytes, *, where: str, path: str):
        self.data, self.where, self.path = data, where, path

    def __len__(self) -> int:
        return len(self.data)

    def object(self, offset: int, length: int) -> bytes:
        end = offset + length
        if length < 0 or end > len(self.data):
            raise CorruptPackError(f"{self.where}: an object is placed past its end", path=self.path)
        return self.data[offset:end]


def open_regular(path: str, what: str) -> int:
    """A read-only descriptor of ``path``, which must be a regular file and no symbolic
    link: a FIFO would block the open (O_NONBLOCK spares that), a device or a link to
    /dev/zero would be read without end, and a link leads out of the store. Anything
    else is a :class:`CorruptPackError` naming the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptPackError(f"{what} {path} is a symbolic link; the store makes none", path=path) from None
        if isinstance(exc, FileNotFoundError):
            raise
        raise CorruptPackError(f"{what} {path} cannot be opened: {exc.strerror}", path=path) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise CorruptPackError(f"{what} {path} is {kind}", path=path)
    os.set_blocking(fd, True)
    return fd


class Pack:
    """One pack and its index, opened read-only.

    The index is memory-mapped and checked (magic, sizes, checksum) when the
    pack is opened; the pack file is read block by block with ``pread``.
    """

    def __init__(self, idx_path: str):
        self.idx_path = idx_path
        self.path = idx_path[: -len(".idx")] + ".pack"
        self.name = os.path.basename(idx_path)[: -len(".idx")]
        with os.fdopen(open_regular(idx_path, "pack index"), "rb") as f:
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
            self._fd: int | None = open_regular(self.path, "pack")
        except BaseException:
            self._map.close()
            raise

    def _check_index(self, size: int) -> None:
        idx_path = self.idx_path
        m = self._map
        magic = m[: len(IDX_MAGIC)]
        if magic == IDX_MAGIC:
            self.version, where, block = 2, _WHERE, _BLOCK
        elif magic == IDX_MAGIC_V1:
            self.version, where, block = 1, _WHERE_V1, _BLOCK_V1
        else:
            raise CorruptPackError(f"pack index {idx_path} does not start with the index magic", path=idx_path)
        self.count, self.nblocks = _HEAD.unpack_from(m, len(IDX_MAGIC))
        if self.count > MAX_OBJECTS or self.nblocks > MAX_OBJECTS:
            raise CorruptPackError(f"pack index {idx_path} claims {self.count} objects in {self.nblocks} blocks", path=idx_path)
        laid = len(IDX_MAGIC) + _HEAD.size + _FANOUT.size + (32 + where.size) * self.count + block.size * self.nblocks + 2 * _SUM
        if laid != size:
            # Before the checksum reads it all: a file of another size (a sparse one of
            # gigabytes say) is refused without a byte of it read past the head.
            raise CorruptPackError(f"pack index {idx_path} is not laid out as its counts say", path=idx_path)
        # Hashed through a view of the mapping, not a copy of it (a 100,000-entry session's
        # index is 7 MB, copied at every open of the store for an append).
        with memoryview(m) as whole, whole[: size - _SUM] as covered:
            digest = blake3.blake3(covered).digest()
        if digest != m[size - _SUM :]:
            raise CorruptPackError(f"pack index {idx_path} fails its checksum", path=idx_path)
        o = len(IDX_MAGIC) + _HEAD.size
        self._fanout = _FANOUT.unpack_from(m, o)
        o += _FANOUT.size
        self._names_at = o
        o += 32 * self.count
        self._where_at = o
        o += where.size * self.count
        self._blocks_at = o
        o += block.size * self.nblocks
        if o + 2 * _SUM != size or self._fanout[255] != self.count:
            raise CorruptPackError(f"pack index {idx_path} is not laid out as its counts say", path=idx_path)
        fan = self._fanout
        if list(fan) != sorted(fan):
            raise CorruptPackError(f"pack index {idx_path} has a fan-out table that goes down", path=idx_path)
        self.pack_sum = bytes(m[o : o + _SUM])
        self._finds = 0
        self._index: dict[bytes, int] | None = None
        self._blocks = list(block.iter_unpack(m[self._blocks_at : self._blocks_at + block.size * self.nblocks]))
        if self.version == 2:
            # Whatever the index claims is bounded here, before anything is allocated for it.
            self._firsts = [b[4] for b in self._blocks]
            slots = 0
            for first, count in ((b[4], b[5]) for b in self._blocks):
                if first != slots:
                    raise CorruptPackError(f"pack index {idx_path} numbers its blocks' slots out of order", path=idx_path)
                if count > MAX_BLOCK // 9:
                    raise CorruptPackError(f"pack index {idx_path} claims {count} slots in one block", path=idx_path)
                slots += count
            if slots > MAX_OBJECTS or self.count > slots:
                raise CorruptPackError(
                    f"pack index {idx_path} claims {slots} slots for {self.count} objects", path=idx_path
                )
            self.slots = slots

    # -- the index --------------------------------------------------------------

    def _name_at(self, i: int) -> bytes:
        o = self._names_at + 32 * i
        return self._map[o : o + 32]

    #: After this many lookups in one pack, its names are loaded into a dict: a
    #: bulk reader (export, exchange, sweep) then pays a hash lookup per object,
    #: while a process that asks for a few objects never pays for the load.
    DICT_AFTER = 2048

    def _located(self, i: int) -> Located:
        if self.version == 1:
            return Located(*_WHERE_V1.unpack_from(self._map, self._where_at + _WHERE_V1.size * i))
        (w,) = _WHERE.unpack_from(self._map, self._where_at + 4 * i)
        ordinal = w >> 3
        b = bisect_right(self._firsts, ordinal) - 1
        if b < 0 or ordinal >= self.slots:
            b = self.nblocks  # names no block: reported by the read
            return Located(b, 0, -1, w & 7)
        return Located(b, ordinal - self._firsts[b], -1, w & 7)

    def find(self, name: str) -> Located | None:
        """Where ``name`` lies, or None: a binary search within its fan-out slot
        (a dict once this pack has been asked often)."""
        return self.find_raw(_raw(name))

    def find_raw(self, raw: bytes) -> Located | None:
        """:meth:`find` of a raw name (a lookup in every pack makes it once)."""
        index = self._index
        if index is not None:
            i = index.get(raw)
            return None if i is None else self._located(i)
        self._finds += 1
        if self._finds > self.DICT_AFTER:
            self.index()
            return self.find_raw(raw)
        i = self.position(raw)
        return None if i is None else self._located(i)

    def position(self, raw: bytes) -> int | None:
        """Where a raw name lies in the index, by a binary search within its fan-out slot."""
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
                return mid
        return None

    def starting_with(self, digits: str) -> list[tuple[str, int]]:
        """The names that start with the hex ``digits`` (two or more), each with its spaces
        bits: a binary search within the fan-out slot of their first byte for the first,
        then the names after it while they match (a short name's lookup, O(log n))."""
        low = bytes.fromhex((digits + "0" * 64)[:64])
        lo = self._fanout[low[0] - 1] if low[0] else 0
        hi = self._fanout[low[0]]
        m, base = self._map, self._names_at
        while lo < hi:
            mid = (lo + hi) >> 1
            if m[base + 32 * mid : base + 32 * mid + 32] < low:
                lo = mid + 1
            else:
                hi = mid
        out = []
        for i in range(lo, self.count):
            name = m[base + 32 * i : base + 32 * i + 32].hex()
            if not name.startswith(digits):
                break
            out.append((_PREFIX + name, self._located(i).spaces))
        return out

    def index(self) -> dict[bytes, int]:
        """Raw name -> position in the index, for every object: built once per pack (a
        bulk reader asks for many names and pays a hash lookup for each)."""
        if self._index is None:
            names = self._map[self._names_at : self._names_at + 32 * self.count]
            self._index = {names[o : o + 32]: i for i, o in enumerate(range(0, len(names), 32))}
        return self._index

    def block_info(self, block: int) -> tuple[int, int, int]:
        """(offset in the pack, stored size, raw size of its stream) of a block."""
        if not 0 <= block < self.nblocks:
            raise CorruptPackError(f"pack index {self.idx_path} names block {block} of {self.nblocks}", path=self.idx_path)
        b = self._blocks[block]
        if self.version == 1:
            return b
        return b[0], b[1] + b[3], b[2]

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[tuple[str, Located]]:
        """Every object, in hash order."""
        for raw, where in self.records():
            yield _PREFIX + raw.hex(), Located(*where)

    def records(self) -> Iterator[tuple[bytes, tuple[int, int, int, int]]]:
        """(raw name, (block, slot or offset, length, spaces)) of every object, in hash
        order, unpacked in bulk (merges and sweeps walk whole indexes)."""
        m = self._map
        names = m[self._names_at : self._names_at + 32 * self.count]
        raws = (names[i : i + 32] for i in range(0, len(names), 32))
        if self.version == 1:
            return zip(raws, _WHERE_V1.iter_unpack(m[self._where_at : self._where_at + _WHERE_V1.size * self.count]))
        firsts, nblocks, slots = self._firsts, self.nblocks, self.slots

        def wheres() -> Iterator[tuple[int, int, int, int]]:  # one loop, not a call per record
            for w in struct.unpack_from(f">{self.count}I", m, self._where_at):
                ordinal = w >> 3
                if ordinal >= slots:
                    yield (nblocks, 0, -1, w & 7)
                else:
                    b = bisect_right(firsts, ordinal) - 1
                    yield (b, ordinal - firsts[b], -1, w & 7)

        return zip(raws, wheres())

    def objects_by_block(self) -> list[list[tuple[int, int, bytes, int]]]:
        """For each block, its objects as (slot or offset, length, raw name, spaces) in
        the order they lie: a repack reads each block once and cuts it up."""
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

    def _span(self, block: int, file_size: int) -> tuple[int, int]:
        """(offset, stored size) of a block, what the index claims checked against the
        limits and the file's size (``file_size``) before anything is read."""
        offset, size, raw = self.block_info(block)
        where = f"pack {self.path} block {block}"
        if raw > MAX_BLOCK or size > MAX_STORED:
            raise CorruptPackError(f"{where} claims {max(raw, size)} bytes, more than a block may hold", path=self.path)
        if self.version == 2 and self._blocks[block][3] > MAX_BLOCK:
            raise CorruptPackError(
                f"{where} claims {self._blocks[block][3]} side bytes, more than a block may hold", path=self.path
            )
        if offset < len(PACK_MAGIC) or offset + size > file_size - _SUM:
            raise CorruptPackError(f"pack {self.path} ends inside block {block}", path=self.path)
        return offset, size

    def read_block_raw(self, block: int) -> bytes:
        """A block's stored bytes, as they are (its zstd frame, then its side bytes):
        what the index claims is checked against the limits and the file's size
        before anything is read."""
        fd = self._pack_fd()
        offset, size = self._span(block, os.fstat(fd).st_size)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise CorruptPackError(f"pack {self.path} ends inside block {block}", path=self.path)
        return data

    def read_block(self, block: int) -> Block | _FlatBlock:
        """A block decompressed (its size bounded by the index before any allocation),
        ready to give its objects by :class:`Located` ``offset``/``length``."""
        data = self.read_block_raw(block)
        where = f"pack {self.path} block {block}"
        if self.version == 1:
            raw = self._blocks[block][2]
            return _FlatBlock(decompress_block(data, raw, where=where, path=self.path), where=where, path=self.path)
        _, zsize, raw, side, _, count = self._blocks[block]
        stream = decompress_block(data[:zsize], raw, where=where, path=self.path)
        return Block(stream, data[zsize:], count, where=where, path=self.path)

    def stored_blocks(self, start: int, stop: int) -> list[tuple[int, memoryview]]:
        """(block number, stored bytes) of blocks ``start`` to ``stop`` (excluded) of a
        format-2 pack, read by one ``pread`` (each block a view of its bytes, not a
        copy): what a read-ahead hands its worker (:meth:`decompress_blocks`). Best
        effort: a block that fails a check :meth:`read_block_raw` makes is left out, all
        of them when the read fails, for :meth:`read_block` to refuse when its reader
        comes to it."""
        out: list[tuple[int, memoryview]] = []
        if self.version != 2 or not 0 <= start < stop <= self.nblocks:
            return out
        try:
            fd = self._pack_fd()
            file_size = os.fstat(fd).st_size
            spans = []
            for b in range(start, stop):
                with contextlib.suppress(CorruptPackError):
                    spans.append((b, *self._span(b, file_size)))
            if not spans:
                return out
            first, end = spans[0][1], max(offset + size for _, offset, size in spans)
            if end - first > (stop - start) * MAX_STORED:
                return out  # blocks not laid out in order: each read by itself
            data = memoryview(os.pread(fd, end - first, first))
        except (CorruptPackError, OSError):
            return out
        for b, offset, size in spans:
            stored = data[offset - first : offset - first + size] if offset >= first else data[:0]
            if len(stored) == size:
                out.append((b, stored))
        return out

    def decompress_blocks(self, stored: list[tuple[int, memoryview]]) -> dict[int, Block]:
        """The blocks :meth:`stored_blocks` read, by number, decompressed by one call that
        lets go of the interpreter lock for them all: what a read-ahead's worker does (a
        thread that took the lock back after each block would wait for it each time,
        while the reader holds it). Best effort as :meth:`stored_blocks` is: a block that
        fails a check of :meth:`read_block`'s is left out (a frame that does not state
        its size too: read by itself, bounded)."""
        out: dict[int, Block] = {}
        frames: list[bytes | bytearray | memoryview] = []
        sizes: list[int] = []
        rest: list[tuple[int, bytes, int, str]] = []
        for b, data in stored:
            _, zsize, raw, _, _, count = self._blocks[b]
            where = f"pack {self.path} block {b}"
            try:
                if zsize > len(data) or check_frame(data[:zsize], raw, where=where, path=self.path) != raw:
                    continue
            except CorruptPackError:
                continue
            frames.append(data[:zsize])
            sizes.append(raw)
            rest.append((b, bytes(data[zsize:]), count, where))
        if not frames:
            return out
        try:
            streams = _decompressor().multi_decompress_to_buffer(
                frames, decompressed_sizes=struct.pack(f"={len(sizes)}Q", *sizes), threads=0)
        except zstandard.ZstdError:
            return out
        for i, (b, side, count, where) in enumerate(rest):
            stream = streams[i]
            if len(stream) == sizes[i]:
                with contextlib.suppress(CorruptPackError):
                    out[b] = Block(stream.tobytes(), side, count, where=where, path=self.path)
        return out

    def read(self, loc: Located) -> bytes:
        """One object's bytes (not checked against its name: the caller does that)."""
        return self.read_block(loc.block).object(loc.offset, loc.length)

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

    def check_pack_checksum(self, held: tuple[int, bytes] | None = None) -> None:
        """Read the whole pack and compare its checksum with its trailer and the index.
        ``held``: (offset, bytes) of the pack the caller read already (a merge's blocks),
        hashed as they are, not read again."""
        h = blake3.blake3()
        fd = self._pack_fd()
        size = os.fstat(fd).st_size
        if size < len(PACK_MAGIC) + _SUM:
            raise CorruptPackError(f"pack {self.path} is too short ({size} bytes)", path=self.path)
        magic = PACK_MAGIC if self.version == 2 else PACK_MAGIC_V1
        pos, end = 0, size - _SUM
        at, data = held if held is not None and 0 < held[0] and held[0] + len(held[1]) <= end else (end, b"")
        while pos < end:
            if pos == at and data:
                chunk = data
            else:
                chunk = os.pread(fd, min(1 << 22, (at if pos < at else end) - pos), pos)
            if not chunk:
                raise CorruptPackError(f"pack {self.path} could not be read to its end", path=self.path)
            if pos == 0 and chunk[: len(magic)] != magic:
                raise CorruptPackError(f"pack {self.path} does not start with the pack magic", path=self.path)
            h.update(chunk)
            pos += len(chunk)
        trailer = os.pread(fd, _SUM, end)
        digest = h.digest()
        if digest != trailer:
            raise CorruptPackError(f"pack {self.path} fails its checksum", path=self.path)
        if digest != self.pack_sum:
            raise CorruptPackError(f"pack {self.path} is not the pack its index {self.idx_path} describes", path=self.path)


@functools.cache
def _ahead_pool() -> ThreadPoolExecutor:
    """The one worker that decompresses blocks ahead (:meth:`PackSet.reading_ahead`),
    made when first asked for."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentsession-read-ahead")


#: One zstd decompression context per thread (a context is not to be shared between
#: threads), kept for every block the thread reads: making one costs about as much as
#: decompressing a quarter of a block of text (15 us against ~40 for 256 KiB), paid twice
#: a block by a listing that reads the session twice.
_DECOMPRESSORS = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx = getattr(_DECOMPRESSORS, "dctx", None)
    if dctx is None:
        dctx = _DECOMPRESSORS.dctx = zstandard.ZstdDecompressor()
    return dctx


def check_frame(data: bytes | memoryview, raw: int, *, where: str, path: str) -> int:
    """The size a block's zstd frame declares (-1: none), refused unless it is the
    index's ``raw``, which no block may exceed: checked before anything is allocated."""
    if raw > MAX_BLOCK:
        raise CorruptPackError(f"{where} claims {raw} bytes, more than a block may hold", path=path)
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        raise CorruptPackError(f"{where} is not a zstd frame", path=path) from None
    if declared not in (raw, -1):
        raise CorruptPackError(f"{where} declares {declared} bytes where the index says {raw}", path=path)
    return int(declared)


def decompress_block(data: bytes, raw: int, *, where: str, path: str) -> bytes:
    check_frame(data, raw, where=where, path=path)
    try:
        out = _decompressor().decompress(data, max_output_size=raw)
    except zstandard.ZstdError as exc:
        raise CorruptPackError(f"{where} does not decompress: {exc}", path=path) from None
    if len(out) != raw:
        raise CorruptPackError(f"{where} decompresses to {len(out)} bytes, not {raw}", path=path)
    return out


class PackWriter:
    """Write one pack and its index: objects are added in the order they should
    sit (a session's objects together compress best), then :meth:`finish`
    makes both files durable and renames them into ``pack_dir``.

    ``encode`` stores envelopes and random base64 runs compactly (see the module
    docstring) and puts a block's envelopes after its other objects (alike
    things together compress better): what a full repack does. Writers on an
    append's path leave it off, since it costs a regular expression per object.
    ``threads`` compresses that many blocks at once beside the caller (zstd
    lets go of the interpreter lock while it works); blocks are written in order.
    """

    def __init__(self, pack_dir: str, tmp_dir: str, *, level: int = 3, block_target: int = BLOCK_TARGET,
                 encode: bool = False, threads: int = 0):
        self.pack_dir = pack_dir
        self.tmp_dir = tmp_dir
        # Capped so that no block can outgrow what a reader accepts (MAX_BLOCK): a
        # block is this target, or one object, plus what envelopes outweigh their
        # estimate (ENVELOPE_SIZE) by.
        self.block_target = min(block_target, MAX_TARGET)
        self.encode = encode
        self.level = level
        self._cctx = compressor(level)
        self._compress_all = _compress_many(self._cctx)
        # Blocks cut and not yet compressed (no pool): (stream, side bytes, first, count),
        # and their streams' bytes.
        self._cut_blocks: list[tuple[bytes, bytes, int, int]] = []
        self._cut_bytes = 0
        self._pool = None
        if threads > 0:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pack-compress")
            self._threads = threads
            self._local_cctx = threading.local()
        self._inflight: list = []  # (future of the zstd frame, (stream, side bytes, first, count)), in order
        self._tmp = os.path.join(tmp_dir, f"pack-{os.getpid()}-{os.urandom(6).hex()}")
        self._fd = self._open_pack()
        self._hash = blake3.blake3()
        self._out: list[bytes] = []  # compressed bytes not yet written (see WRITE_BUFFER)
        self._out_len = 0
        self._pos = 0
        # raw name -> its index record's number, ordinal << 3 | spaces (an ordinal of -1
        # until its block is cut, when encoding): one integer, no object the collector
        # tracks (a checkpoint's pack is written on a worker thread while appends go on),
        # and a merge takes a pack's records over as they are, shifted, in one update.
        self._objects: dict[bytes, int] = {}
        self._blocks: list[tuple[int, int, int, int, int, int]] = []
        self._slots = 0  # ordinals given out to blocks already cut
        # The block being filled: its objects' bytes (plain) or (raw, spaces, data, envelope
        # match) (encoding; slots are given when the block is cut).
        self._pending: list = []
        self._buf_len = 0
        self._write(PACK_MAGIC)

    def _open_pack(self) -> int:
        """The pack's temp file in ``tmp_dir``, created (the directory too if need be)."""
        try:
            return os.open(self._tmp + ".pack", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            os.makedirs(self.tmp_dir, exist_ok=True)
            return os.open(self._tmp + ".pack", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

    def _seal_pack(self, pack_sum: bytes) -> None:
        """End the pack's temp file with its checksum, make it durable and close it."""
        write_all(self._fd, pack_sum)
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1

    def __contains__(self, name: str) -> bool:
        return _raw(name) in self._objects

    def __len__(self) -> int:
        return len(self._objects)

    #: Compressed bytes are gathered up to this much before one write: a writer
    #: on a worker thread then gives up the interpreter lock a few times per
    #: pack, not once per block (each hand-back can wait a switch interval).
    WRITE_BUFFER = 8 << 20
    #: What an envelope of the common form (of up to ENVELOPE_COUNTED bytes) is
    #: counted as towards a block's size when ``encode`` is on: about what its
    #: encoded form takes. Anything else counts its own size.
    ENVELOPE_SIZE = 48
    ENVELOPE_COUNTED = 256

    def _write(self, data: bytes, held: int = 0) -> None:
        """Buffer ``data``, counted as ``held`` bytes when it holds more memory than its
        length (a zstd frame comes in a buffer of its block's bound: a block of 256 KiB
        compressed to 26 bytes still holds 256 KiB)."""
        self._out.append(data)
        self._out_len += max(len(data), held)
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
            self._objects[raw] = known | spaces
            return
        if not self.encode:
            if self._buf_len and self._buf_len + len(data) > self.block_target:
                self._cut()
            self._check_room()
            self._objects[raw] = ((self._slots + len(self._pending)) << 3) | spaces
            self._pending.append(data)
            self._buf_len += len(data)
        else:
            m = FAST_ENVELOPE.fullmatch(data) if data[:12] == b'{"content":"' else None
            size = self.ENVELOPE_SIZE if m is not None and len(data) <= self.ENVELOPE_COUNTED else len(data)
            if self._buf_len and self._buf_len + size > self.block_target:
                self._cut()
            self._check_room()
            self._objects[raw] = _UNCUT | spaces  # its ordinal is given when its block is cut
            self._pending.append((raw, spaces, data, m))
            self._buf_len += size
        if self._buf_len >= self.block_target:
            self._cut()

    def add_many(self, names: Sequence[str], spaces: bytes, datas: Sequence[bytes]) -> None:
        """Add objects in order, as :meth:`add` does each: each one's name (the caller
        vouches it is its hash), space bits and bytes. Plain blocks, and none of the
        objects here already or twice among them (a checkpoint's), take a few steps of
        Python for all, not several each: a checkpoint's pack is written on a worker
        thread beside the appends, and each of its steps holds the lock they wait for."""
        blob = _raw_names(names, spaces, datas)
        raws = [blob[i : i + 32] for i in range(0, len(blob), 32)]
        first = self._slots + len(self._pending)  # (plain: an object's ordinal is given as it comes)
        taken = dict(zip(raws, map(operator.or_, range(first << 3, (first + len(raws)) << 3, 8), spaces)))
        if self.encode or len(taken) != len(raws) or not self._objects.keys().isdisjoint(taken):
            for raw, bits, data in zip(raws, spaces, datas):
                self.add_raw(raw, bits, data)
            return
        self._check_room(len(raws))
        self._objects.update(taken)
        self._fill(datas)

    def _fill(self, datas: Sequence[bytes]) -> None:
        """Plain objects, their names recorded: each goes into the block being filled,
        which is cut before an object that would take it past the target and once it
        reaches it (as :meth:`add_raw` does one). Where each block ends is found by
        bisection over the objects' running sizes, and its objects are taken as a slice:
        no step of Python per object (:func:`_block_stops`)."""
        ends = list(itertools.accumulate(map(len, datas), initial=0))  # ends[k]: the bytes of datas[:k]
        start = 0
        for stop in _block_stops(ends, self._buf_len, self.block_target):
            self._pending.extend(datas[start:stop])
            self._cut()
            start = stop
        self._pending.extend(datas[start:])  # the block left open
        self._buf_len += ends[-1] - ends[start]

    def _check_room(self, more: int = 1) -> None:
        if self._slots + len(self._pending) + more > MAX_OBJECTS:
            raise StoreError(f"a pack holds at most {MAX_OBJECTS} objects")

    def copy_pack(self, pack: Pack) -> None:
        """Copy every block of another pack as it is (a merge need not recompress: a
        slot's back references stay within its block), and take over its index
        records with their ordinals shifted. A pack of the first format is read
        and its objects added one by one."""
        self._cut()
        if not pack.nblocks:
            return
        if pack.version == 1:
            pack.check_pack_checksum()  # (see below)
            for b, objs in enumerate(pack.objects_by_block()):
                if objs:
                    blk = pack.read_block(b)
                    for offset, length, raw, spaces in objs:
                        self.add_raw(raw, spaces, blk.object(offset, length))
            self._cut()
            return
        self._collect(wait=True)
        start = pack.block_info(0)[0]
        last = pack.block_info(pack.nblocks - 1)
        end = last[0] + last[1]
        data = os.pread(pack._pack_fd(), end - start, start)
        if len(data) != end - start:
            raise CorruptPackError(f"pack {pack.path} ends inside its blocks", path=pack.path)
        # A merge removes the packs it copies: their bytes are checked first (the blocks
        # just read, hashed as they are), so a damaged pack is never copied unread and
        # deleted, but stays for fsck and `pack` (its sound copies elsewhere still serve).
        pack.check_pack_checksum((start, data))
        shift = self._pos - start
        base = self._slots
        self._check_room(pack.slots)
        self._blocks.extend(
            (off + shift, zsize, raw, side, first + base, count) for off, zsize, raw, side, first, count in pack._blocks
        )
        self._slots += pack.slots
        self._write(data)
        objects = self._objects
        names = pack._map[pack._names_at : pack._names_at + 32 * pack.count]
        wheres = struct.unpack_from(f">{pack.count}I", pack._map, pack._where_at)
        if wheres and max(wheres) >> 3 >= pack.slots:
            raise CorruptPackError(
                f"pack index {pack.idx_path} names slot {max(wheres) >> 3} of {pack.slots}", path=pack.idx_path
            )
        raws = [names[i : i + 32] for i in range(0, len(names), 32)]
        shift = base << 3  # (a record's ordinal moved by ``base``, its spaces kept)
        taken = dict(zip(raws, [w + shift for w in wheres]))
        if len(taken) == len(raws) and objects.keys().isdisjoint(taken):
            objects.update(taken)  # the common case, in one step: no name is here twice
            return
        for raw, w in zip(raws, wheres):  # a name here already: its first record, every space it came in
            known = objects.get(raw)
            objects[raw] = known | (w & 7) if known is not None else w + shift

    def _cut(self) -> None:
        """Close the block being filled: give its objects their slots (envelopes last
        when encoding), encode them, and hand the stream to zstd."""
        pending = self._pending
        count = len(pending)
        if not count:  # (not the byte count: an empty object still needs its slot)
            return
        self._pending, self._buf_len = [], 0
        side: list[bytes] = []  # (encoding only)
        first = self._slots
        if self.encode:
            objects = self._objects
            kinds = bytearray(count)
            lens = [0] * count
            side_lens = [0] * count
            payloads: list[bytes] = []
            order = [o for o in pending if o[3] is None]
            plain = len(order)  # contents may point back only to these
            order += [o for o in pending if o[3] is not None]
            local = {o[0]: slot for slot, o in enumerate(order)}
            depth: dict[int, int] = {}
            contents = SPACE_BITS["contents"]
            for slot, (raw, spaces, data, m) in enumerate(order):
                objects[raw] = ((first + slot) << 3) | (objects[raw] & 7)
                payload = None
                if m is not None:
                    payload = _encode_envelope(m, slot, local, depth, plain)
                    kinds[slot] = KIND_ENVELOPE
                elif spaces & contents and len(data) >= 64:
                    cut = encode_side(data)
                    if cut is not None:
                        payload, extra = cut
                        kinds[slot] = KIND_SIDE
                        side.append(extra)
                        side_lens[slot] = len(extra)
                if payload is None:
                    payload = data
                payloads.append(payload)
                lens[slot] = len(payload)
            tables = (bytes(kinds), struct.pack(f">{count}I", *lens), struct.pack(f">{count}I", *side_lens))
            stream = b"".join((*tables, *payloads))
        else:
            stream = plain_stream(pending)  # plain: ordinals were given as they came
        side_bytes = b"".join(side)
        if len(stream) > MAX_BLOCK or len(side_bytes) > MAX_BLOCK:  # (cannot happen: see MAX_TARGET; never write one)
            raise StoreError(f"a block of {len(stream)} + {len(side_bytes)} bytes is more than a reader accepts")
        self._slots += count
        self._hand(stream, side_bytes, first, count)

    def _hand(self, stream: bytes, side: bytes, first: int, count: int) -> None:
        """A cut block's stream to zstd: on this thread, or on the pool, written in order."""
        if self._pool is None:
            self._cut_blocks.append((stream, side, first, count))
            self._cut_bytes += len(stream)
            if self._cut_bytes >= self.COMPRESS_BYTES:
                self._compress_cut()
            return
        self._inflight.append((self._pool.submit(self._compress, stream), (len(stream), side, first, count)))
        self._collect(wait=False)

    #: Without a pool, blocks are compressed this many bytes of them at once, in one call
    #: that lets go of the interpreter lock once (:func:`_compress_many`): a checkpoint's
    #: pack, written on a worker thread beside appends, then takes the lock back once,
    #: not once a block (each time it does, an append that let it go waits it out).
    COMPRESS_BYTES = 4 << 20

    def _compress_cut(self) -> None:
        """Compress the blocks cut so far and write them, in order."""
        blocks, self._cut_blocks, self._cut_bytes = self._cut_blocks, [], 0
        if blocks:
            for frame, (stream, side, first, count) in zip(self._compress_all([job[0] for job in blocks]), blocks, strict=True):
                self._put_block(frame, len(stream), side, first, count)

    def _compress(self, stream: bytes) -> bytes:
        cctx = getattr(self._local_cctx, "cctx", None)
        if cctx is None:
            cctx = self._local_cctx.cctx = compressor(self.level)
        return cctx.compress(stream)

    def _collect(self, *, wait: bool) -> None:
        """Write the compressed blocks that are ready, in order (all of them when
        ``wait``; else waiting only while too many are in flight)."""
        if wait:
            self._compress_cut()
        inflight = self._inflight
        while inflight and (wait or inflight[0][0].done() or len(inflight) > 2 * self._threads):
            future, job = inflight.pop(0)
            self._put_block(future.result(), *job)

    def _put_block(self, frame: bytes, raw: int, side: bytes, first: int, count: int) -> None:
        """Write a block: its zstd frame, of a stream of ``raw`` bytes, then its side bytes."""
        self._blocks.append((self._pos, len(frame), raw, len(side), first, count))
        self._write(frame, raw)
        if side:
            self._write(side)

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._inflight = []
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def finish(self) -> str:
        """Seal, fsync and rename into place; return the index's path. A pack of
        no objects is refused (and its temp file removed): nothing would find it."""
        if not len(self):
            self.abort()
            raise StoreError("refusing to write an empty pack")
        self._cut()
        self._collect(wait=True)
        self._shutdown()
        return self._publish(self._end_pack(), *self._index())

    def _end_pack(self) -> bytes:
        """Write what is buffered and the pack's checksum, make it durable; its checksum."""
        self._drain()
        pack_sum = self._hash.digest()
        self._seal_pack(pack_sum)
        return pack_sum

    def _publish(self, pack_sum: bytes, count: int, records: bytes) -> str:
        """Write the index of the pack ended (its ``count`` records, laid out by
        :func:`~.packindex.records`), make it durable and rename both into place; the
        index's path."""
        idx = index_bytes(count, records, self._blocks, pack_sum)
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

    def _index(self) -> tuple[int, bytes]:
        """The index's records (their count, :func:`~.packindex.records`): the raw names
        in order, and each one's slot and spaces."""
        names = sorted(self._objects)
        return len(names), packindex.records(names, list(map(self._objects.__getitem__, names)))

    def abort(self) -> None:
        self._shutdown()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for ext in (".pack", ".idx"):
            try:
                os.unlink(self._tmp + ext)
            except FileNotFoundError:
                pass


class StreamPackWriter(PackWriter):
    """A :class:`PackWriter` (plain blocks) for objects taken as they come over a long
    pass that may yet be refused, an import's. The pack is written in place in
    ``tmp_dir`` (the store's scratch, as any pack writer's is) and nothing else sees it
    until :meth:`finish` renames it into ``pack_dir``: a refused import removes it
    (:meth:`abort`); one a crash leaves is a temporary file that ``fsck`` notes and a
    sweep removes once it is old. No table of names is kept beside the pass's own state:
    each object's raw name goes to an anonymous file, read back by :meth:`finish`, and
    its spaces to a byte string (its slot is its place in that file: one byte an object
    held, where a table costs about 210). An object added twice is found when the index
    is sorted: its first slot is named, the later copy left a slot no record names (as a
    merge may leave them; a repack drops it). Objects come one by one or many at once
    (:meth:`add_many`: an import's stage hands them over a batch at a time, so the pass
    pays a few appends an object).

    With ``threads`` (one is used), a thread of the writer's own takes the cut blocks'
    streams, :data:`HAND_AT` at a time, compresses them, writes the frames (a MiB at a
    time) and hashes them, in order: the pass's thread only cuts blocks, and waits only
    when :data:`IN_FLIGHT` batches are handed over and not yet written (its memory stays
    bounded when zstd falls behind). That thread ends the pack (its checksum, its fsync)
    while :meth:`finish` sorts the index."""

    WRITE_BUFFER = 1 << 20
    #: Without its thread, each block is compressed as it is cut: an import's memory stays
    #: bounded by its block, not by a batch of them.
    COMPRESS_BYTES = 0
    #: Blocks handed to the writer's thread at once (a wake-up of it a batch, not a block),
    #: and batches handed over and not yet written, at most.
    HAND_AT = 4
    IN_FLIGHT = 2
    #: The fewest objects whose index :meth:`end` has a process of its own sort (where the
    #: environment lets a pass take a helper process): its start (a few milliseconds of the
    #: other core) is worth it past tens of thousands of names, which take this process
    #: about half a microsecond each to sort (0.1 s for an import of 100,000 entries).
    SORT_ASIDE_AT = 1 << 16
    #: How many names that process is told of at once (:meth:`_note`), once started.
    NOTE_EVERY = 1 << 13

    def __init__(self, pack_dir: str, tmp_dir: str, *, level: int = STREAM_LEVEL, threads: int = 0):
        import tempfile

        super().__init__(pack_dir, tmp_dir, level=level)
        # each object's raw name, 32 bytes, in slot order (written a MiB at a time)
        self._names = tempfile.TemporaryFile(buffering=1 << 20)
        self._spaces = bytearray()  # each object's space bits, in slot order
        self._thread: threading.Thread | None = None
        self._ended: bytes | BaseException | None = None  # what the thread's end of the pack gave
        self._told = self._aborting = False  # the thread told to end the pack; an abort under way
        self._sorter: subprocess.Popen[bytes] | None = None  # the process sorting the index (see _note)
        self._noted = 0  # the names it was told of
        self._sort_here = threads <= 0  # whether the index is sorted here (no process started, or given up)
        if threads > 0:
            import queue

            self._batch: list[_Job] = []  # blocks cut (or taken ready) and not yet handed over
            self._jobs: queue.SimpleQueue[list[_Job] | None] = queue.SimpleQueue()
            self._room = threading.Semaphore(self.IN_FLIGHT)
            self._thread = threading.Thread(target=self._run, name="pack-compress", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        """The writer's thread: the batches of blocks handed over, as many as are waiting
        at once, compressed, written and hashed, then (at None) the pack ended, unless it
        is being aborted; the first failure is kept, and the blocks after it only counted off."""
        jobs, compress = self._jobs, self._compress_all
        while True:
            batches = [jobs.get()]
            while not jobs.empty():
                batches.append(jobs.get_nowait())
            end = batches[-1] is None  # (the last thing ever put)
            blocks = [job for batch in batches if batch is not None for job in batch]
            if blocks and not (self._aborting or isinstance(self._ended, BaseException)):
                try:
                    # a stream to compress (raw -1), or a frame made ready elsewhere (add_ready)
                    frames = iter(compress([job[0] for job in blocks if job[1] < 0]))
                    for data, raw, side, first, count in blocks:
                        if raw < 0:
                            data, raw = next(frames), len(data)
                        self._put_block(data, raw, side, first, count)
                except BaseException as exc:
                    self._ended = exc
            del blocks
            if len(batches) > end:
                self._room.release(len(batches) - end)
            if end:
                break
        if not (self._aborting or isinstance(self._ended, BaseException)):
            try:
                self._ended = self._end_pack()
            except BaseException as exc:
                self._ended = exc

    def _hand(self, stream: bytes, side: bytes, first: int, count: int) -> None:
        if self._thread is None:
            super()._hand(stream, side, first, count)
            return
        self._batch.append((stream, -1, side, first, count))
        if len(self._batch) >= self.HAND_AT:
            self._hand_batch()

    def _hand_batch(self) -> None:
        """The blocks gathered to the thread (waiting while :data:`IN_FLIGHT` batches are)."""
        batch, self._batch = self._batch, []
        if not batch:
            return
        self._room.acquire()
        if isinstance(self._ended, BaseException):
            raise StoreError(f"writing the pack {self._tmp}.pack failed: {self._ended}") from self._ended
        self._jobs.put(batch)

    def _stop(self) -> bytes | None:
        """Wait for the thread (told to end the pack, or to stop); the pack's checksum when
        it ended it. A failure of the thread's is raised here."""
        thread, self._thread = self._thread, None
        if thread is None:
            return None
        if not self._told:
            self._jobs.put(None)
        thread.join()
        ended, self._ended = self._ended, None
        if isinstance(ended, BaseException):
            raise StoreError(f"writing the pack {self._tmp}.pack failed: {ended}") from ended
        return ended

    def end(self) -> None:
        """No more objects come: the writer's thread ends the pack now (its last blocks,
        its checksum, its fsync) beside what the caller does next, and :meth:`finish`
        then only sorts the index and publishes both (without a thread, it does it all)."""
        if self._thread is None or self._told:
            return
        self._tell_end()

    def _tell_end(self) -> None:
        """The last blocks handed to the writer's thread, and it told to end the pack; the
        process sorting the index (:meth:`_note`) told the last names."""
        self._cut()
        self._hand_batch()
        self._jobs.put(None)
        self._told = True
        self._note(last=True)

    def _note(self, last: bool = False) -> None:
        """Of :data:`SORT_ASIDE_AT` objects or more (where the environment lets a pass take
        a helper process), the index is sorted by a process of its own (:mod:`.packindex`
        run as a script, ``python -I -S``, on a descriptor of the names file), on the core
        the import's line helper leaves it, a run at a time as the names come: it is told
        of them :data:`NOTE_EVERY` at a time, and at the end (``last``) of their count, the
        space bits written after them, so that at :meth:`finish` the records are there or
        nearly. The notes never wait: one the pipe has no room for is given up with the
        process (the index is then sorted here)."""
        count = len(self._spaces)
        if self._sort_here or (not last and count - self._noted < self.NOTE_EVERY):
            return
        if self._sorter is None:
            if count < self.SORT_ASIDE_AT:
                self._sort_here = last
                return
            from ...format import parallel

            self._sort_here = True
            # (allowed as a large file's pass is given a helper: not under
            # AGENTSESSION_VERIFY_PROCESSES=1, nor for a process with one core)
            if not parallel.wanted(parallel.MIN_BYTES, None):
                return
            import subprocess  # (here: a large pack's writer needs it, head and list do not)

            try:
                self._sorter = subprocess.Popen(
                    [sys.executable, "-I", "-S", packindex.__file__, str(self._names.fileno())],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    pass_fds=(self._names.fileno(),), env=parallel.heap_env(),
                )
            except (OSError, ValueError):
                return
            self._sort_here = False
            assert self._sorter.stdin is not None
            os.set_blocking(self._sorter.stdin.fileno(), False)
        proc = self._sorter
        assert proc is not None and proc.stdin is not None
        try:
            if last:
                self._names.write(self._spaces)
            self._names.flush()
            if os.write(proc.stdin.fileno(), packindex.NOTE.pack(-count if last else count)) != packindex.NOTE.size:
                raise BlockingIOError
        except OSError:  # (no room, or it went: the index is sorted here)
            self._sorter = None
            self._sort_here = True
            _end_process(proc)
            return
        self._noted = count
        if last:
            _close(proc.stdin)

    def _sorted_aside(self) -> tuple[int, bytes] | None:
        """The records :meth:`_note`'s process wrote, once it has ended (None when there is
        none, or it failed or wrote anything but records for these objects)."""
        proc, self._sorter = self._sorter, None
        if proc is None:
            return None
        import subprocess

        from ...format import parallel

        try:
            proc.wait(timeout=parallel.STALL)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _end_process(proc)
        if proc.returncode != 0:
            return None
        fd, at = self._names.fileno(), 33 * len(self)
        head = os.pread(fd, packindex.COUNT.size, at)
        if len(head) != packindex.COUNT.size:
            return None
        (count,) = packindex.COUNT.unpack(head)
        size = _FANOUT.size + 36 * count
        records = os.pread(fd, size, at + packindex.COUNT.size) if 0 < count <= len(self) else b""
        return (count, records) if len(records) == size else None

    def finish(self) -> str:
        if not len(self):
            self.abort()
            raise StoreError("refusing to write an empty pack")
        if self._thread is None:
            return super().finish()
        if not self._told:
            self._tell_end()  # the thread ends the pack (its last blocks, checksum, fsync) ...
        index = self._index()  # ... while this one sorts the index (or :meth:`end`'s process did)
        pack_sum = self._stop()
        assert pack_sum is not None
        return self._publish(pack_sum, *index)

    def abort(self) -> None:
        self._aborting = True
        if self._sorter is not None:
            _end_process(self._sorter)
            self._sorter = None
        try:
            self._stop()
        except StoreError:
            pass  # (the pack is being removed: why its writing failed is moot)
        self._names.close()
        super().abort()

    def __contains__(self, name: str) -> bool:
        raise TypeError("a StreamPackWriter keeps no table of its names")

    def __len__(self) -> int:
        return len(self._spaces)

    def add_raw(self, raw: bytes, spaces: int, data: bytes) -> None:
        self._take(raw, bytes((spaces,)), (data,))

    def add_many(self, names: Sequence[str], spaces: bytes, datas: Sequence[bytes]) -> None:
        """Add objects in order: each one's name (the caller vouches it is its hash), space
        bits and bytes. The names are made raw in one step, not one call each."""
        self._take(_raw_names(names, spaces, datas), spaces, datas)

    def _take(self, raws: bytes, spaces: bytes, datas: Sequence[bytes]) -> None:
        """Objects whose raw names (32 bytes each) and space bits are given, into blocks
        (:meth:`PackWriter._fill`), their names and spaces recorded."""
        self._check_open()
        self._check_room(len(spaces))
        self._names.write(raws)
        self._spaces += spaces
        self._fill(datas)
        self._note()

    def add_ready(self, blocks: Sequence[ReadyBlock]) -> None:
        """Add blocks made and compressed elsewhere (an import's helper process, with
        :func:`ready_blocks`: objects it vouches are named by their hashes), after the
        block being filled, which is cut first. Each is written as it came, its objects
        given the next slots; a frame that does not declare its stream's size is refused."""
        self._check_open()
        self._cut()
        self._compress_cut()  # (without the thread: the blocks cut so far written first)
        for frame, raw, raws, spaces in blocks:
            count = len(spaces)
            if not count or len(raws) != 32 * count or not 0 < raw <= MAX_BLOCK or _frame_size(frame) != raw:
                raise StoreError(f"a ready block of {count} objects, {len(raws)} bytes of names and {raw} bytes "
                                 f"(its frame says {_frame_size(frame)}) handed to a pack writer")
            self._check_room(count)
            self._names.write(raws)
            self._spaces += spaces
            first, self._slots = self._slots, self._slots + count
            if self._thread is None:
                self._put_block(frame, raw, b"", first, count)
                continue
            self._batch.append((frame, raw, b"", first, count))
            if len(self._batch) >= self.HAND_AT:
                self._hand_batch()
        self._note()

    def _check_open(self) -> None:
        if self._told:
            raise StoreError(f"objects added to the pack {self._tmp}.pack after its end")

    def copy_pack(self, pack: Pack) -> None:
        raise TypeError("a StreamPackWriter takes objects, not packs")

    def _index(self) -> tuple[int, bytes]:
        """The records (their count, :func:`~.packindex.records`) from the names read back,
        as :func:`~.packindex.slot_records` makes them: by the process :meth:`_note`
        started, when it answered, else here."""
        aside = self._sorted_aside()
        if aside is not None:
            self._names.close()
            return aside
        self._names.seek(0)
        count = len(self._spaces)
        data = self._names.read(32 * count)  # (the space bits may follow: see _note)
        self._names.close()
        if len(data) != 32 * count:
            raise StoreError(f"the names of a pack being written read back as {len(data)} bytes, not {32 * count}")
        return packindex.slot_records(data, self._spaces)


def _end_process(proc: subprocess.Popen[bytes]) -> None:
    """Kill a process this module started (unless it has ended) and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdin is not None:
        _close(proc.stdin)


def _close(pipe: IO[bytes]) -> None:
    try:
        pipe.close()
    except OSError:  # (a note it never read: nothing lost)
        pass


#: A block handed to the writer's thread: (a stream to compress, -1) or (its frame, the
#: stream's size), then its side bytes, its first slot and its count of objects.
_Job = tuple[bytes, int, bytes, int, int]

def compressor(level: int = STREAM_LEVEL) -> zstandard.ZstdCompressor:
    """A pack writer's zstd context: frames that declare their size, no checksum of their
    own (the pack's covers them)."""
    return zstandard.ZstdCompressor(level=level, write_checksum=False)


def plain_stream(payloads: Sequence[bytes]) -> bytes:
    """A plain block's stream: its tables (every kind 0, the lengths, no side bytes), then
    the objects as they are."""
    count = len(payloads)
    return b"".join((bytes(count), struct.pack(f">{count}I", *map(len, payloads)), bytes(4 * count), *payloads))


def _block_stops(ends: list[int], held: int, target: int) -> Iterator[int]:
    """Where plain blocks close among objects of running sizes ``ends`` (``ends[k]``: the
    bytes of the first ``k``), the block being filled holding ``held`` bytes already: the
    number of objects taken when each closes. A block closes before an object that would
    take it past ``target`` (unless it would be empty: a big object is a block of its
    own) and once it reaches it; what follows the last stop is left open. Found by
    bisection over ``ends``: no step of Python per object."""
    count, start = len(ends) - 1, 0
    while True:
        base = ends[start] - held  # ends[k + 1] - base: the block's bytes once object k is in it
        stop = bisect_left(ends, base + target, start + 1)  # object stop - 1 reaches the target
        if stop > count:  # none does: the block stays open
            return
        if ends[stop] - base > target and (stop - 1 > start or held):
            stop -= 1  # the object that would take it past the target begins the next block
        yield stop
        start, held = stop, 0


def ready_blocks(raws: bytes, spaces: bytes, datas: Sequence[bytes], cctx: zstandard.ZstdCompressor) -> list[ReadyBlock]:
    """Objects (raw names, space bits, bytes; none above :data:`MAX_PACKED`) made into
    plain blocks as :class:`StreamPackWriter` cuts them, the last one closed where they
    end, and compressed with ``cctx`` (:func:`compressor`): what
    :meth:`StreamPackWriter.add_ready` takes. An import's helper process makes them."""
    if not datas:
        return []
    stops = [0, *_block_stops(list(itertools.accumulate(map(len, datas), initial=0)), 0, BLOCK_TARGET)]
    if stops[-1] != len(datas):
        stops.append(len(datas))
    streams = [plain_stream(datas[a:b]) for a, b in itertools.pairwise(stops)]
    frames = _compress_many(cctx)(streams)
    return [(bytes(frame), len(stream), raws[32 * a : 32 * b], spaces[a:b])
            for frame, stream, (a, b) in zip(frames, streams, itertools.pairwise(stops), strict=True)]


def _frame_size(frame: bytes) -> int:
    """The stream size a zstd frame declares (-1 when it declares none or is no frame)."""
    try:
        return zstandard.frame_content_size(frame)
    except zstandard.ZstdError:
        return -1


def _compress_many(cctx: zstandard.ZstdCompressor) -> Callable[[list[bytes]], Sequence[Any]]:
    """Each stream compressed as :meth:`~zstandard.ZstdCompressor.compress` makes its frame
    (the same bytes). zstandard's C backend does them all in one call that lets go of the
    interpreter lock once (``multi_compress_to_buffer``): a thread compressing beside a
    busy one waits for the lock once a batch, not once a block (each wait can be the
    switch interval, 5 ms, while a block takes about 1 ms to compress)."""
    many = getattr(cctx, "multi_compress_to_buffer", None)
    if many is None:
        return lambda streams: [cctx.compress(stream) for stream in streams]
    return lambda streams: list(many(streams, threads=0)) if streams else []


class PackSet:
    """The packs of one store, found by listing ``objects/pack`` and listed again
    when a lookup misses and the directory has changed (another process packed,
    merged or swept). Decompressed blocks are kept in a small LRU cache, since
    reading a session reads its objects in the order they were packed."""

    CACHE_BLOCKS = 16
    #: Blocks a read-ahead's worker decompresses at once (:meth:`Pack.decompress_blocks`):
    #: each batch costs it two waits for the interpreter lock (to start, and after the
    #: call), however many blocks it holds. The next batch is asked for when the reader
    #: comes to the last one asked, so the worker has a batch's time to read it: two
    #: batches held at most beside the cache (8 MiB of the usual blocks; 32 a batch held
    #: 35 MB more at show's peak, 16 about 16).
    AHEAD_BLOCKS = 16
    #: The longest stride (in slots) between two objects of one bulk read that
    #: :meth:`read_many` takes for a run and follows into another block: a session's
    #: objects lie a slot or two apart, an object staged apart (a label's) far on.
    RUN_STRIDE = 64
    #: A directory changed this recently may change again without its mtime
    #: moving (timestamps come from a coarse clock, or whole seconds on some
    #: filesystems): until it is older, a miss lists it again (git's "racy" rule).
    RACY_NS = 2_000_000_000

    def __init__(self, pack_dir: str):
        self.dir = pack_dir
        self.packs: list[Pack] = []
        self._seen: int | None = None  # mtime_ns of the directory when last listed
        self._racy = False  # listed within RACY_NS of that mtime: not to be trusted
        self._cache: OrderedDict[tuple[str, int], Block | _FlatBlock] = OrderedDict()
        #: Packs found unreadable when listed (name -> why); skipped by reads.
        self.bad: dict[str, str] = {}
        self._lock = threading.RLock()
        #: (pack, space bits) -> (the ordinal of the object a bulk read found last, the
        #: stride between the last two): where :meth:`read_many` looks first.
        self._runs: dict[tuple[str, int], tuple[int, int]] = {}
        #: Readers in :meth:`reading_ahead`, by space bits; (pack, block) -> the worker's
        #: batch that reads it, until a read takes it; (pack, space bits) -> the block
        #: after the last one asked for by the reads of those spaces.
        self._ahead_readers: dict[int, int] = {}
        self._batches: dict[tuple[str, int], Future[dict[int, Block]]] = {}
        self._ahead_end: dict[tuple[str, int], int] = {}

    @contextlib.contextmanager
    def reading_ahead(self, bits: int) -> Iterator[None]:
        """While in it, a bulk read (:meth:`read_many`) of the spaces of ``bits`` that
        comes to a block has the blocks after it decompressed on a worker thread, a batch
        at a time, which any read that comes to them takes instead of decompressing them:
        for a reader that works on what one read gives before it asks for the next (a
        listing), its work then overlaps the decompression (which lets go of the
        interpreter lock). Reads of other spaces meanwhile (a label's content among
        envelopes) ask for nothing ahead, so they do not move the read-ahead away from
        the reader's. What was read ahead and not taken is dropped when the last reader
        leaves."""
        with self._lock:
            self._ahead_readers[bits] = self._ahead_readers.get(bits, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._ahead_readers[bits] -= 1
                if not self._ahead_readers[bits]:
                    del self._ahead_readers[bits]
                if not self._ahead_readers:
                    for batch in self._batches.values():
                        batch.cancel()
                    self._batches.clear()
                    self._ahead_end.clear()

    def _read_ahead(self, pack: Pack, block_no: int, bits: int) -> None:
        """A bulk read of the spaces of ``bits`` came to ``block_no``: when what was asked
        of the worker for them ends within a batch of it, ask for the next batch; what
        lies behind it is dropped (a reader that skips blocks leaves none held)."""
        with self._lock:
            # (a read that comes back to the run after an object lying further on finds the
            # batches between still held: only what lies a batch behind is dropped)
            for key in [k for k in self._batches if k[0] == pack.name and k[1] < block_no - self.AHEAD_BLOCKS]:
                del self._batches[key]
            end = self._ahead_end.get((pack.name, bits), 0)
            if block_no + self.AHEAD_BLOCKS < end:
                return
            start = max(end, block_no + 1)
            stop = min(start + self.AHEAD_BLOCKS, pack.nblocks)
            if start >= stop:
                return
            stored = pack.stored_blocks(start, stop)  # (one read: the worker then takes the lock back once)
            batch = _ahead_pool().submit(pack.decompress_blocks, stored)
            for b in range(start, stop):
                self._batches[(pack.name, b)] = batch
            self._ahead_end[(pack.name, bits)] = stop

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
                self.bad[key] = store_relative(str(exc), os.path.dirname(os.path.dirname(self.dir)))  # (a read's error says it)
                continue
            self.bad.pop(key, None)
        # Packs gone from the listing are not closed here: another thread may be
        # reading one this moment; each closes itself when no longer referenced.
        # Biggest first: most lookups are answered by the first pack asked.
        packs.sort(key=lambda p: -p.count)
        changed = [p.name for p in packs] != [p.name for p in self.packs]
        self.packs = packs
        return changed

    def locate(self, name: str, skip: Collection[str] = ()) -> tuple[Pack, Located] | None:
        """The first pack (biggest first) naming ``name``, and where; packs named in
        ``skip`` passed over (a read whose copy there is damaged looks on)."""
        if self._seen is None:
            self.refresh()
        packs = self.packs
        if not packs:
            return None
        raw = _raw(name)  # (once, not once a pack: a miss asks every one)
        for p in packs:
            if skip and p.name in skip:
                continue
            loc = p.find_raw(raw)
            if loc is not None:
                return p, loc
        return None

    def read(self, pack: Pack, loc: Located) -> bytes:
        return self._block(pack, loc.block).object(loc.offset, loc.length)

    def read_many(self, raws: list[bytes], bits: int) -> list[bytes | None]:
        """Each object's bytes (by raw name) as a pack holds it in a space of ``bits``,
        checked against its name, or None (held by no pack of the current format, its
        block unreadable, or its bytes not its name: the caller's one-object read then
        says why). What a projection reads: its objects lie in the order they are
        asked, a stride apart (an entry's content, then its envelope), so each one is
        first looked for where the one before was found plus that stride (kept from one
        call to the next), the guess proved by the hash every object is checked against
        anyway, and looked up in the index only when it misses; each block is taken from
        the cache or decompressed once per call however many of its objects are asked."""
        if self._seen is None:
            self.refresh()
        out: list[bytes | None] = [None] * len(raws)
        left: Sequence[int] = range(len(raws))
        sha256 = hashlib.sha256
        ahead = bits if bits in self._ahead_readers else 0
        for pack in self.packs:
            if not left:
                break
            if pack.version != 2:
                continue  # the first format's objects are read one by one
            m, where_at = pack._map, pack._where_at
            firsts, nslots, nblocks = pack._firsts, pack.slots, pack.nblocks
            last, stride = self._runs.get((pack.name, bits), (-1, 0))
            missed = []
            unread: set[int] = set()  # blocks that could not be read: tried once for all their objects
            lo = hi = 0  # the ordinals [lo, hi) of the block at hand
            block: Block | None = None
            # the block's slot table, held apart: a plain slot (almost every one) is then
            # a slice here, not a call (two calls an object were a tenth of a show's reads)
            kinds: bytes = b""
            starts: list[int] = []
            ends: list[int] = []
            stream = b""
            for i in left:
                raw = raws[i]
                data = None
                guess = last + stride
                # a guess is followed within the block at hand or a run's short stride on
                # (into the next block); a long stride is a jump to an object that lay apart
                # (an import stages a label's objects apart from the run it belongs to):
                # the run goes on after it, so the index is asked, no block read for it
                if 0 <= guess < nslots and (lo <= guess < hi or 0 < stride <= self.RUN_STRIDE):
                    if not lo <= guess < hi:
                        b = bisect_right(firsts, guess) - 1
                        lo, hi = firsts[b], (firsts[b + 1] if b + 1 < nblocks else nslots)
                        block = self._block_or_none(pack, b, unread, ahead)
                        kinds, starts, ends, stream = _table(block)
                    s = guess - lo
                    if s < len(kinds):
                        kind = kinds[s]
                        data = stream[starts[s] : ends[s]] if kind == KIND_PLAIN else self._slot(block, s)  # type: ignore[arg-type]
                        if data is not None and (sha256(data).digest() != raw or not _in_space(kind, data, bits)):
                            data = None
                if data is not None:
                    last = guess
                    out[i] = data
                    continue
                # as find does: a dict of the index's names once a pack is asked often, else a
                # binary search a name (a small session's export in a big store builds no dict)
                index = pack._index
                if index is None:
                    pack._finds += 1
                    if pack._finds > pack.DICT_AFTER:
                        index = pack.index()
                j = index.get(raw) if index is not None else pack.position(raw)
                if j is None:
                    missed.append(i)
                    continue
                (w,) = _WHERE.unpack_from(m, where_at + 4 * j)
                if not w & bits:
                    missed.append(i)
                    continue
                ordinal = w >> 3
                if ordinal >= nslots:
                    continue  # names no block
                if last >= 0:
                    stride = ordinal - last
                last = ordinal
                if not lo <= ordinal < hi:
                    b = bisect_right(firsts, ordinal) - 1
                    lo, hi = firsts[b], (firsts[b + 1] if b + 1 < nblocks else nslots)
                    block = self._block_or_none(pack, b, unread, ahead)
                    kinds, starts, ends, stream = _table(block)
                s = ordinal - lo
                if s >= len(kinds):
                    continue
                data = stream[starts[s] : ends[s]] if kinds[s] == KIND_PLAIN else self._slot(block, s)  # type: ignore[arg-type]
                if data is not None and sha256(data).digest() == raw:
                    out[i] = data
            self._runs[(pack.name, bits)] = (last, stride)
            left = missed
        return out

    def _block_or_none(self, pack: Pack, block_no: int, unread: set[int], ahead: int) -> Block | None:
        """:meth:`_block` for a bulk read: None for a block that cannot be read (tried once
        a call, for all its objects; each one's own read says why) or of the first format.
        ``ahead``: the space bits of a read that reads ahead (:meth:`reading_ahead`), or 0."""
        if block_no in unread:
            return None
        if ahead:
            self._read_ahead(pack, block_no, ahead)
        try:
            got: Block | _FlatBlock = self._block(pack, block_no)
        except (CorruptPackError, OSError):
            unread.add(block_no)
            return None
        return got if isinstance(got, Block) else None

    @staticmethod
    def _slot(block: Block, slot: int) -> bytes | None:
        """The object of an encoded slot (a plain one :meth:`read_many` slices itself), or
        None when it does not decode."""
        try:
            return block.object(slot)
        except CorruptPackError:
            return None

    def _block(self, pack: Pack, block_no: int) -> Block | _FlatBlock:
        """A block through the cache (read and kept when it is not there)."""
        key = (pack.name, block_no)
        with self._lock:  # a checkpoint's worker thread reads and writes packs too
            block = self._cache.get(key)
            if block is not None:
                self._cache.move_to_end(key)
                return block
            batch = self._batches.pop(key, None)
        if batch is not None:  # read ahead (waited for, when the worker is on it)
            try:
                block = batch.result().get(block_no)
            except Exception:  # cancelled, or what decompress_blocks let through: read here, which says what is wrong
                block = None
        if block is None:
            block = pack.read_block(block_no)
        with self._lock:
            self._cache[key] = block
            if len(self._cache) > self.CACHE_BLOCKS:
                self._cache.popitem(last=False)
        return block

    def close(self) -> None:
        for p in self.packs:
            p.close()
        self.packs = []
        self._cache.clear()
        self._batches.clear()
        self._seen = None


_ENVELOPE_HEAD = b'{"content":"'


def index_bytes(count: int, records: bytes, blocks: Sequence[tuple[int, ...]], pack_sum: bytes) -> bytes:
    """A format-2 index: its ``count`` records as :func:`~.packindex.records` lays them out
    (fan-out, names ascending, each one's ordinal << 3 | spaces), the pack's block records
    and its checksum, then the index's own checksum."""
    body = b"".join([
        IDX_MAGIC,
        _HEAD.pack(count, len(blocks)),
        records,
        b"".join(_BLOCK.pack(*b) for b in blocks),
        pack_sum,
    ])
    return body + blake3.blake3(body).digest()


def index_pack(path: str, tmp_dir: str) -> int:
    """Write the lost index of a whole format-2 pack from the pack itself, as git's
    index-pack does; the number of objects it names.

    Everything an index holds is in its pack: the blocks (walked by
    :func:`salvage_pack`), their slots, and each object's bytes, which are hashed for
    its name; only the spaces are not, and they are told as a bulk read tells them
    (an envelope is an entry; anything an envelope of the pack names as its content
    is a content; anything else both a content and a blob). A pack that does not read
    whole, fails its checksum or is not named by it raises :class:`CorruptPackError`:
    an index would vouch for bytes that do not hold. An index that appears meanwhile
    (a writer publishes its pack and index in two steps) is left as it is."""
    problems: list[str] = []
    blocks: list[tuple[int, ...]] = []
    found: list[tuple[bytes, int]] = []  # (name, spaces) by ordinal; the bytes are not kept
    contents: set[bytes] = set()  # what the pack's envelopes name as their content
    for raw, bits, data in salvage_pack(path, problems, blocks=blocks):
        found.append((raw, bits))
        if bits & SPACE_BITS["entries"] and (c := envelope_content(data)) and is_hash(c):
            contents.add(bytes.fromhex(c[7:]))
    if problems:
        raise CorruptPackError(f"{problems[0]}", path=path)
    if not pack_file_sound(path):
        raise CorruptPackError(f"pack {path} fails its checksum", path=path)
    with open(path, "rb") as f:
        f.seek(-_SUM, os.SEEK_END)
        pack_sum = f.read(_SUM)
    if os.path.basename(path) != f"pack-{pack_sum.hex()}.pack":
        raise CorruptPackError(f"pack {path} is not named by its checksum (pack-{pack_sum.hex()[:12]}…)", path=path)
    records: dict[bytes, int] = {}
    for ordinal, (raw, bits) in enumerate(found):
        if raw in contents and bits != SPACE_BITS["entries"]:
            bits = SPACE_BITS["contents"] | (bits & SPACE_BITS["entries"])
        if raw not in records:  # a repeat (a merge keeps both slots): the index names the first
            records[raw] = ordinal << 3 | bits
    names = sorted(records)
    data = index_bytes(len(names), packindex.records(names, [records[n] for n in names]), blocks, pack_sum)
    final = path[: -len(".pack")] + ".idx"
    os.makedirs(tmp_dir, exist_ok=True)
    tmp = os.path.join(tmp_dir, f"index-{os.getpid()}-{os.urandom(6).hex()}.idx")
    try:
        write_new_file(tmp, data, durable=True)
        try:
            os.link(tmp, final)  # never over an index a writer published meanwhile
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links
            if not os.path.exists(final):
                os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(os.path.dirname(final))
    return len(names)


def _table(block: Block | None) -> tuple[bytes, list[int], list[int], bytes]:
    """A block's slot kinds, starts, ends and stream (none for no block), as
    :meth:`PackSet.read_many` reads them."""
    if block is None:
        return b"", [], [], b""
    return block.kinds, block.starts, block.ends, block.stream


def _in_space(kind: int, data: bytes, bits: int) -> bool:
    """Whether an object found where a bulk read guessed it is of a space of ``bits``, by
    :func:`_spaces_of`'s rule with its test cut to the bytes' first member (an envelope's
    ``content``, which no content holds): a guess is proved by the name, this is the rest."""
    env = kind == KIND_ENVELOPE or data.startswith(_ENVELOPE_HEAD)
    return bool(bits & (SPACE_BITS["entries"] if env else SPACE_BITS["contents"] | SPACE_BITS["blobs"]))


_ALL_SPACES = SPACE_BITS["entries"] | SPACE_BITS["contents"] | SPACE_BITS["blobs"]


def _spaces_of(kind: int, data: bytes) -> int:
    """The spaces of an object read from a pack without its index (which alone records
    them): an envelope slot, or bytes of an envelope's form, is an entry; anything else
    is filed as both a content and a blob. A name is the hash of its bytes in any
    space (every read checks it), so a name in one space too many serves nothing wrong."""
    if kind == KIND_ENVELOPE or FAST_ENVELOPE.fullmatch(data):
        return SPACE_BITS["entries"]
    if data.startswith(b"{") and envelope_content(data) is not None:
        return _ALL_SPACES  # an envelope of another form (parents, ...), or a content shaped like one
    return SPACE_BITS["contents"] | SPACE_BITS["blobs"]


def salvage_pack(
    path: str, problems: list[str], *, blocks: list[tuple[int, ...]] | None = None
) -> Iterator[tuple[bytes, int, bytes]]:
    """Every object a format-2 pack file still holds, read without its index: (raw
    name, spaces, bytes), each name the SHA-256 of the bytes.

    The pack's blocks are walked from its magic: each zstd frame declares its size
    (bounded by :data:`MAX_BLOCK` before anything is decompressed), the stream's
    slot table says how many side bytes follow it. A block that does not read ends
    the walk (the blocks after it cannot be found); what could not be read is added
    to ``problems``; each block read whole is added to ``blocks`` as its index record
    (offset, frame size, stream size, side bytes, first ordinal, slots). Used by
    ``pack`` to rebuild what a damaged or lost index held."""
    rel = path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        problems.append(f"pack {rel} cannot be opened: {exc.strerror}")
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"pack {rel} is not a regular file")
            return
        size = st.st_size
        head = os.pread(fd, len(PACK_MAGIC), 0)
        if head != PACK_MAGIC:
            problems.append(f"pack {rel} does not start with the format-2 pack magic; its objects cannot be found without its index")
            return
        pos, end, block, first = len(PACK_MAGIC), size - _SUM, 0, 0
        while pos < end:
            where = f"pack {rel} block {block} (offset {pos})"
            header = os.pread(fd, 18, pos)
            try:
                raw = zstandard.frame_content_size(header)
            except zstandard.ZstdError:
                problems.append(f"{where} is not a zstd frame; the rest of the pack cannot be read")
                return
            if raw < 0 or raw > MAX_BLOCK:
                problems.append(f"{where} declares {raw} bytes; the rest of the pack cannot be read")
                return
            dec = zstandard.ZstdDecompressor().decompressobj()
            out, at = [], pos
            got = 0
            try:
                while not dec.eof and at < end:
                    chunk = os.pread(fd, min(1 << 20, end - at), at)
                    if not chunk:
                        break
                    part = dec.decompress(chunk)
                    got += len(part)
                    if got > raw:
                        raise zstandard.ZstdError("more bytes than the frame declares")
                    out.append(part)
                    at += len(chunk) - len(dec.unused_data)
            except zstandard.ZstdError as exc:
                problems.append(f"{where} does not decompress ({exc}); the rest of the pack cannot be read")
                return
            stream = b"".join(out)
            if not dec.eof or len(stream) != raw or len(stream) < 0:
                problems.append(f"{where} ends early; the rest of the pack cannot be read")
                return
            count = _slot_count(stream)
            if count is None:
                problems.append(f"{where}: its slot table does not add up; the rest of the pack cannot be read")
                return
            side_len = sum(struct.unpack_from(f">{count}I", stream, 5 * count)) if count else 0
            if side_len > MAX_BLOCK or at + side_len > end:
                problems.append(f"{where} claims {side_len} side bytes; the rest of the pack cannot be read")
                return
            side = os.pread(fd, side_len, at)
            try:
                blk = Block(stream, side, count, where=where, path=path)
            except CorruptPackError as exc:
                problems.append(f"{exc}; the rest of the pack cannot be read")
                return
            if blocks is not None:
                blocks.append((pos, at - pos, raw, side_len, first, count))
            for slot in range(count):
                try:
                    data = blk.object(slot)
                except CorruptPackError as exc:
                    problems.append(str(exc))
                    continue
                yield hashlib.sha256(data).digest(), _spaces_of(blk.kinds[slot], data), data
            pos, block, first = at + side_len, block + 1, first + count
    finally:
        os.close(fd)


def _slot_count(stream: bytes) -> int | None:
    """How many slots a block's stream holds: the n whose table (9n bytes) and payload
    lengths add up to the stream. The stream does not record n; at most one n fits
    the common case, found by trying each (a block holds at most MAX_BLOCK // 9)."""
    size = len(stream)
    swap = sys.byteorder == "little"
    for n in range(1, min(size // 9, MAX_BLOCK // 9) + 1):
        if stream[n - 1] > KIND_SIDE:
            return None  # a kind byte that is not one: every larger n includes it too
        lengths = array.array("I", stream[n : 5 * n])
        if swap:
            lengths.byteswap()
        if 9 * n + sum(lengths) == size:
            return n
    return None


def pack_file_sound(path: str) -> bool:
    """Whether a pack file's bytes match its trailing checksum (read in bounded chunks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < len(PACK_MAGIC) + _SUM:
            return False
        h = blake3.blake3()
        pos, end = 0, st.st_size - _SUM
        while pos < end:
            chunk = os.pread(fd, min(1 << 22, end - pos), pos)
            if not chunk:
                return False
            h.update(chunk)
            pos += len(chunk)
        return h.digest() == os.pread(fd, _SUM, end)
    finally:
        os.close(fd)
