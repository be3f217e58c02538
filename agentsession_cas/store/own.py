"""A session's own entries as its state holds them: the log order, and each one's sequence number.

What a compacted log's snapshot names stays as the snapshot's digests
(:class:`~agentsession_cas.backends.digests.EntryDigests`, 32 bytes an id, and
the runs of their sequence numbers); what came after it is kept as Python
objects, a few. So opening a session of 100,000 entries for one append makes
no object per entry (issue 11), while every reader still sees a sequence of
ids and a mapping of them to their numbers, as a list and a dict give them.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

from ..backends.digests import EntryDigests, SeqRuns

__all__ = ["OwnOrder", "OwnSeqs", "own_of"]

_NONE = EntryDigests(b"")


class OwnOrder(Sequence[str]):
    """The own entries in log order: those of the snapshot, then those appended since."""

    __slots__ = ("snap", "tail", "_n")

    def __init__(self, snap: EntryDigests = _NONE, tail: Iterable[str] = ()):
        self.snap = snap
        self.tail: list[str] = list(tail)
        self._n = len(snap)  # (the snapshot is fixed: counted once, not at every append's len)

    def __len__(self) -> int:
        return self._n + len(self.tail)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        n = len(self.snap)
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1 or not n:
                return [self[k] for k in range(start, stop, step)] if n else self.tail[i]
            return [*self.snap.spell(min(start, n), min(stop, n)), *self.tail[max(start - n, 0) : max(stop - n, 0)]]
        if i < 0:
            i += len(self)
        if i < n:
            if i < 0:
                raise IndexError("own entry index out of range")
            return self.snap[i]
        return self.tail[i - n]

    def __iter__(self) -> Iterator[str]:
        yield from self.snap
        yield from self.tail

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.tail or self.snap.position(entry_id) >= 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (list, tuple, OwnOrder)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # (mutable, as a list)

    def append(self, entry_id: str) -> None:
        self.tail.append(entry_id)

    def copy(self) -> OwnOrder:
        return OwnOrder(self.snap, self.tail)

    def __repr__(self) -> str:
        return f"<OwnOrder of {len(self)}>"


class OwnSeqs(Mapping[str, int]):
    """Own entry id -> its sequence number: the snapshot's (by their place in it), then
    those set since. An id is set once (the replay and an append skip an own one)."""

    __slots__ = ("snap", "seqs", "tail", "_n")

    def __init__(self, snap: EntryDigests = _NONE, seqs: Sequence[int] = (), tail: Mapping[str, int] | None = None):
        if len(seqs) != len(snap):
            raise ValueError(f"{len(seqs)} sequence numbers for {len(snap)} entries")
        self.snap = snap
        self.seqs = seqs if isinstance(seqs, (array, SeqRuns)) else array("q", seqs)
        self.tail: dict[str, int] = dict(tail or {})
        #: The snapshot's count (fixed): with none, a question about an id is the tail's alone.
        self._n = len(snap)

    def get(self, entry_id: Any, default: Any = None) -> Any:
        v = self.tail.get(entry_id)
        if v is not None or not self._n:
            return default if v is None else v
        p = self.snap.position(entry_id)
        return self.seqs[p] if p >= 0 else default

    def __getitem__(self, entry_id: str) -> int:
        v = self.get(entry_id)
        if v is None:
            raise KeyError(entry_id)
        return v

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.tail or (self._n > 0 and self.snap.position(entry_id) >= 0)

    def __setitem__(self, entry_id: str, seq: int) -> None:
        if not self.add(entry_id, seq):
            raise KeyError(f"{entry_id} is an own entry already")

    def add(self, entry_id: str, seq: int) -> bool:
        """Set ``entry_id``'s number unless it is own already (False then): the replay's
        step, one look-up per append record."""
        tail = self.tail
        if entry_id in tail or (self._n > 0 and self.snap.position(entry_id) >= 0):
            return False
        tail[entry_id] = seq
        return True

    def __len__(self) -> int:
        return self._n + len(self.tail)

    def __iter__(self) -> Iterator[str]:
        yield from self.snap
        yield from self.tail

    def copy(self) -> OwnSeqs:
        return OwnSeqs(self.snap, self.seqs, self.tail)

    def __repr__(self) -> str:
        return f"<OwnSeqs of {len(self)}>"


def own_of(entries: Sequence[str], seqs: Sequence[int]) -> tuple[OwnOrder, OwnSeqs] | None:
    """The own entries a snapshot names (ids and their numbers, in log order), or None when
    one is not an entry id or is named twice."""
    try:
        snap = EntryDigests.of(entries)
        own = OwnSeqs(snap, seqs)
    except ValueError:
        return None
    if snap.first_repeat() is not None:
        return None
    return OwnOrder(snap), own
