"""The records of a pack's index (its fan-out, sorted names and where each lies), made
from its objects' names: with the standard library alone, so that a large import's are
sorted by a process of its own (this file run as a script, ``python -I -S``: no package,
no site, started in milliseconds) on the core its line helper has left, as the names
come and while the importing process writes the session
(:class:`~.packs.StreamPackWriter`). The layout is
:mod:`~.packs`' (``docs/storage-format.md``); the same functions make it in process.
"""

from __future__ import annotations

import itertools
import operator
import os
import struct
import sys
from bisect import bisect_left

#: The fan-out table: objects whose first byte <= i, for each byte i.
FANOUT = struct.Struct(">256I")
#: What the script writes before the records: how many there are.
COUNT = struct.Struct(">I")


def records(names: list[bytes], wheres: list[int]) -> bytes:
    """An index's fan-out, names and records (``names`` sorted; ``wheres[i]``: the ordinal
    of ``names[i]`` shifted by 3, or'ed with its space bits), as they lie in the index."""
    # objects whose first byte <= i: those sorting before the byte after i
    fanout = [bisect_left(names, bytes((i + 1,))) for i in range(255)] + [len(names)]
    return b"".join((FANOUT.pack(*fanout), b"".join(names), struct.pack(f">{len(names)}I", *wheres)))


def slot_records(data: bytes, spaces: bytes | bytearray) -> tuple[int, bytes]:
    """The records (their count, :func:`records`) of the objects whose raw names (32 bytes
    each) are ``data`` in slot order, each one's space bits in ``spaces``: the slots sorted
    by name (a stable sort: a repeat's first copy first), no tuple made of each; an object
    that came more than once is one record with every space its copies came in."""
    raws = split_names(data)
    return ordered_records(raws, sorted(range(len(raws)), key=raws.__getitem__), spaces)


def split_names(data: bytes) -> list[bytes]:
    """Raw names (32 bytes each, one after the other) as a list."""
    return [data[i : i + 32] for i in range(0, len(data) - len(data) % 32, 32)]


def ordered_records(raws: list[bytes], order: list[int], spaces: bytes | bytearray) -> tuple[int, bytes]:
    """:func:`slot_records` of the names ``raws``, ``order`` their slots in runs each
    sorted by name (one run: the whole order): the runs merged by a stable sort (Python's
    merges sorted runs in far less than it sorts), repeats made one."""
    order.sort(key=raws.__getitem__)
    names = list(map(raws.__getitem__, order))
    names, wheres = merge_repeats(names, [slot << 3 | spaces[slot] for slot in order])
    return len(names), records(names, wheres)


def merge_repeats(names: list[bytes], wheres: list[int]) -> tuple[list[bytes], list[int]]:
    """Sorted records (the copies of a name in slot order) with a name repeated made one
    each: the first copy's slot, with every space the copies came in. Only the repeats
    are visited, the rest copied in slices: a file may hold a few identical contents
    among 100,000 entries."""
    again = list(itertools.compress(range(1, len(names)), map(operator.eq, names, itertools.islice(names, 1, None))))
    if not again:
        return names, wheres
    first, last = 0, -2
    for i in again:  # a run of copies at j, j + 1, ...: every one after j is in again
        if i != last + 1:
            first = i - 1
        wheres[first] |= wheres[i] & 7
        last = i
    kept: list[bytes] = []
    out: list[int] = []
    start = 0
    for i in again:
        kept += names[start:i]
        out += wheres[start:i]
        start = i + 1
    kept += names[start:]
    out += wheres[start:]
    return kept, out


#: A note on the script's input: how many names the file holds so far (their count), or,
#: negated, that no more come and their space bits follow them.
NOTE = struct.Struct(">q")
#: The fewest new names sorted as a run of their own (the rest wait for the next note).
RUN = 1 << 14


def main(argv: list[str]) -> int:
    """``packindex.py FD``: the names of objects (32 bytes each, in slot order) read from the
    file open as descriptor FD as its writer notes them on this process's input
    (:data:`NOTE`), sorted a run at a time as they come; at the last note, the space bits
    after the names read and the runs merged, their records' count (:data:`COUNT`) and
    :func:`records` written into that file after them. At offsets, never moving the
    descriptor's own offset (its writer's). Exit 1 when the input ends before the last
    note, or the file holds less than noted."""
    fd = int(argv[1])
    notes = sys.stdin.buffer
    raws: list[bytes] = []
    order: list[int] = []  # the slots of the names sorted so far, in sorted runs
    while True:
        note = notes.read(NOTE.size)
        if len(note) != NOTE.size:
            return 1  # (the writer stopped: it sorts the names itself, if it wants them)
        (count,) = NOTE.unpack(note)
        last = count < 0
        count = abs(count)
        if count > len(raws):
            data = _pread(fd, 32 * (count - len(raws)), 32 * len(raws))
            if data is None:
                return 1
            raws += split_names(data)
        if last or len(raws) - len(order) >= RUN:
            order += sorted(range(len(order), len(raws)), key=raws.__getitem__)
        if last:
            break
    spaces = _pread(fd, count, 32 * count)
    if spaces is None or count != len(raws):
        return 1
    n, body = ordered_records(raws, order, spaces)
    out = memoryview(COUNT.pack(n) + body)
    at = 0
    while at < len(out):
        at += os.pwrite(fd, out[at:], 33 * count + at)
    return 0


def _pread(fd: int, size: int, at: int) -> bytes | None:
    """``size`` bytes of the file at ``at`` (None when it holds fewer)."""
    pieces, got = [], 0
    while got < size:
        piece = os.pread(fd, size - got, at + got)
        if not piece:
            return None
        pieces.append(piece)
        got += len(piece)
    return b"".join(pieces)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
