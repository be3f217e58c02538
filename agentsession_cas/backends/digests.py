"""Entry ids held as their raw SHA-256 digests: one bytes object for all of them (issue 11).

A compacted log's snapshot names a session's own entries as 32-byte digests
(``docs/storage-format.md``). Spelled out as one Python string each, 100,000 of
them cost 12 MB, and the replay's dict of their sequence numbers as much again;
kept as the snapshot's bytes they cost 32 bytes each. :class:`EntryDigests` is
that sequence of ids, spelling an id only when it is read. Whether and where an
id is one of them is found without an object per id: by scanning the bytes for
the first few asked (:data:`SCANS`), then through an open-addressing table (4
bytes a slot, at most half of the slots used). :meth:`DigestTable.repeated`
finds an id named twice.
:class:`SeqRuns` holds their sequence numbers as the snapshot writes them: runs
of consecutive numbers (one run, most often), not a number each.
"""

from __future__ import annotations

import os
import sys
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from typing import overload

__all__ = ["DIGEST", "PREFIX", "DigestTable", "EntryDigests", "SeqRuns"]

#: Bytes of a digest, and what spells one as an entry id.
DIGEST = 32
PREFIX = "sha256:"
_ID_LEN = len(PREFIX) + 2 * DIGEST
_M64 = (1 << 64) - 1
#: The table's multiplier, odd and this process's own: ids are hashes a writer can grind
#: (an entry's content is theirs), so which slot one takes must not be theirs to choose.
_KEY = int.from_bytes(os.urandom(8), "little") | 1
#: Ids spelled at once when iterating (one hex string of them, then sliced).
_CHUNK = 4096
#: Look-ups answered by scanning the bytes (a third of a millisecond for 100,000 ids)
#: before the table is built (a dozen milliseconds): an append asks about ten.
SCANS = 32


def _digest(entry_id: object) -> bytes | None:
    """The 32 bytes an entry id spells, or None for anything that is not an entry id
    (in lowercase hex, as the format writes one)."""
    if not isinstance(entry_id, str) or len(entry_id) != _ID_LEN or not entry_id.startswith(PREFIX):
        return None
    text = entry_id[len(PREFIX):]
    try:
        d = bytes.fromhex(text)
    except ValueError:
        return None
    return d if len(d) == DIGEST and d.hex() == text else None


class DigestTable:
    """Fixed-width digests concatenated, in order, and how one is found: scanned for, then
    (past :data:`SCANS` of them) through the open-addressing table, slot -> place + 1
    (0: empty), from its first 8 bytes times the key, probing linearly."""

    __slots__ = ("raw", "width", "_n", "_table", "_shift", "_repeat", "_checked", "_scanned")

    def __init__(self, raw: bytes, width: int = DIGEST, *, unrepeated: bool = False):
        """``unrepeated``: the caller knows no digest stands twice (checked when the bytes
        were written, and bound to them by a checksum since): :meth:`repeated` trusts it."""
        if width < 8 or width % 8 or len(raw) % width:
            raise ValueError(f"{len(raw)} bytes are no whole number of {width}-byte digests")
        self.raw, self.width = raw, width
        self._n = len(raw) // width
        self._table: array[int] | None = None
        self._shift = 64
        self._repeat: int | None = None
        self._checked = unrepeated
        #: What the scans found (an append asks about the same few ids again and again).
        self._scanned: dict[bytes, int] = {}

    def __len__(self) -> int:
        return self._n

    def find(self, d: bytes) -> int:
        """The (first) place of digest ``d``, or -1."""
        if len(d) != self.width or not self._n:
            return -1
        if self._table is None:
            at = self._scanned.get(d)
            if at is not None:
                return at
            if len(self._scanned) < SCANS:
                at = self._scanned[d] = self._scan(d)
                return at
        table = self._table if self._table is not None else self._build()
        mask = len(table) - 1
        raw, width = self.raw, self.width
        s = ((int.from_bytes(d[:8], sys.byteorder) * _KEY) & _M64) >> self._shift
        while j := table[s]:
            if raw.startswith(d, (j - 1) * width):
                return j - 1
            s = (s + 1) & mask
        return -1

    def _scan(self, d: bytes) -> int:
        raw, width = self.raw, self.width
        at = raw.find(d)
        while at >= 0 and at % width:  # (found across two digests)
            at = raw.find(d, at + 1)
        return at // width if at >= 0 else -1

    def repeated(self) -> int | None:
        """The place of a digest that stands earlier too, or None. Their first 8 bytes all
        differ (a set of them, in C: half the table's cost), or the table finds it."""
        if not self._checked:
            self._checked = True
            if self._table is None and len(set(memoryview(self.raw).cast("Q")[:: self.width // 8])) < self._n:
                self._build()
        return self._repeat

    def _build(self) -> array[int]:
        n = self._n
        bits = max(4, (2 * n).bit_length())
        table = array("I", bytes(4 << bits))
        mask, shift = (1 << bits) - 1, 64 - bits
        raw, key, width = self.raw, _KEY, self.width
        words = memoryview(raw).cast("Q")[:: width // 8]
        for i, w in enumerate(words, 1):
            s = ((w * key) & _M64) >> shift
            while j := table[s]:
                if words[j - 1] == w and raw[(j - 1) * width : j * width] == raw[(i - 1) * width : i * width]:
                    if self._repeat is None:
                        self._repeat = i - 1
                    break
                s = (s + 1) & mask
            else:
                table[s] = i
        self._table, self._shift, self._checked = table, shift, True
        return table


class EntryDigests(DigestTable, Sequence[str]):
    """Entry ids (``sha256:<hex>``) as the concatenation of their digests, in order."""

    __slots__ = ()

    def __init__(self, raw: bytes, *, unrepeated: bool = False):
        super().__init__(raw, DIGEST, unrepeated=unrepeated)

    @classmethod
    def of(cls, ids: Sequence[str]) -> EntryDigests:
        """The digests of entry ids (each checked to be one: ValueError otherwise)."""
        if isinstance(ids, EntryDigests):
            return ids
        out = bytearray()
        for e in ids:
            d = _digest(e)
            if d is None:
                raise ValueError(f"{e!r} is not an entry id")
            out += d
        return cls(bytes(out))

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            if step != 1:
                return [self[k] for k in range(start, stop, step)]
            return list(self.spell(start, stop))
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("entry digest index out of range")
        return PREFIX + self.raw[i * DIGEST : (i + 1) * DIGEST].hex()

    def __iter__(self) -> Iterator[str]:
        return self.spell(0, self._n)

    def spell(self, start: int, stop: int) -> Iterator[str]:
        """The ids from ``start`` to ``stop``, spelled a chunk at a time."""
        raw = self.raw
        for lo in range(start, stop, _CHUNK):
            hexed = raw[lo * DIGEST : min(stop, lo + _CHUNK) * DIGEST].hex()
            yield from [PREFIX + hexed[k : k + 2 * DIGEST] for k in range(0, len(hexed), 2 * DIGEST)]

    def __contains__(self, entry_id: object) -> bool:
        return self.position(entry_id) >= 0

    def position(self, entry_id: object) -> int:
        """Where ``entry_id`` stands (its first place), or -1 when it is not one of them."""
        if not self._n:  # (a log with no snapshot: the replay asks this of every append)
            return -1
        d = _digest(entry_id)
        return -1 if d is None else self.find(d)

    def first_repeat(self) -> str | None:
        """An id named twice, or None (what a snapshot must not hold)."""
        at = self.repeated()
        return None if at is None else self[at]


class SeqRuns(Sequence[int]):
    """Increasing numbers as ``[first, count]`` runs of consecutive ones (checked by the
    caller), read as the sequence they stand for."""

    __slots__ = ("_firsts", "_starts", "_n")

    def __init__(self, runs: Sequence[Sequence[int]]):
        self._firsts = array("q", [first for first, _ in runs])
        self._starts = array("q")  # the place of each run's first number
        n = 0
        for _, count in runs:
            self._starts.append(n)
            n += count
        self._n = n

    def __len__(self) -> int:
        return self._n

    def runs(self) -> list[list[int]]:
        """The ``[first, count]`` runs they were given as."""
        ends = [*self._starts[1:], self._n]
        return [[first, end - start] for first, start, end in zip(self._firsts, self._starts, ends)]

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("sequence number index out of range")
        r = bisect_right(self._starts, i) - 1
        return self._firsts[r] + i - self._starts[r]

    def __iter__(self) -> Iterator[int]:
        ends = [*self._starts[1:], self._n]
        for first, start, end in zip(self._firsts, self._starts, ends):
            yield from range(first, first + end - start)
