"""The records of a pack's index (its fan-out, sorted names and where each lies), made
from its objects' names: with the standard library alone, so that a large import's are
sorted by a process of its own (this file run as a script, ``python -I -S``: no package,
no site, started in milliseconds) on the core its line helper has left, while the
importing process writes the session (:class:`~.packs.StreamPackWriter`). The layout is
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
    count = len(spaces)
    raws = [data[i : i + 32] for i in range(0, 32 * count, 32)]
    order = sorted(range(count), key=raws.__getitem__)
    names = list(map(raws.__getitem__, order))
    del raws
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


def main(argv: list[str]) -> int:
    """``packindex.py FD COUNT``: the names of COUNT objects (32 bytes each, in slot order)
    then their space bits (a byte each), read from the file open as descriptor FD at its
    start; their records' count (:data:`COUNT`) and :func:`records` written into that
    file after them. At offsets, never moving the descriptor's own offset (its writer's)."""
    fd, count = int(argv[1]), int(argv[2])
    want = 33 * count
    pieces, got = [], 0
    while got < want:
        piece = os.pread(fd, want - got, got)
        if not piece:
            return 1  # (cut short: the writer makes them itself)
        pieces.append(piece)
        got += len(piece)
    data = b"".join(pieces)
    del pieces
    n, body = slot_records(data[: 32 * count], data[32 * count :])
    out = memoryview(COUNT.pack(n) + body)
    at = 0
    while at < len(out):
        at += os.pwrite(fd, out[at:], want + at)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
