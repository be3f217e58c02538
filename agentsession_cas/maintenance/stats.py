"""``stats``: what a store holds and how much its sessions share (issue 14).

Two measures of size. **Logical** bytes are what the sessions would be as files:
the sum, over every session, of the bytes of its projection's entry lines (a fork's
prefix counted in the fork too; the header and a synthetic ``leaf`` marker not).
**Stored** bytes are what the objects take where the backend keeps them (loose files
and packs for a store directory). Sessions share entries (a fork holds its base's
path; an imported copy holds the same entries): each distinct entry's line is
counted once in ``distinct_bytes``, and ``dedup`` is logical over distinct.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import field
from typing import TYPE_CHECKING, Any

from ..backends.base import SPACES
from ..format.hashing import line_from_objects
from ..lean import dataclass

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["SessionStats", "StoreStats", "store_stats"]


@dataclass
class SessionStats:
    """One session: the entries of its projection (``own`` of them in its log), their
    bytes, and how many of them another session holds too."""

    session: str
    entries: int = 0
    own: int = 0
    logical_bytes: int = 0
    shared_entries: int = 0
    shared_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"session": self.session, "entries": self.entries, "own": self.own,
                "logical_bytes": self.logical_bytes, "shared_entries": self.shared_entries,
                "shared_bytes": self.shared_bytes}


@dataclass
class StoreStats:
    """The store: objects and their bytes per space, logical versus stored bytes, sharing."""

    objects: dict[str, int] = field(default_factory=dict)
    object_bytes: dict[str, int] = field(default_factory=dict)
    stored: dict[str, int] | None = None
    sessions: list[SessionStats] = field(default_factory=list)
    distinct_entries: int = 0
    distinct_bytes: int = 0
    shared_entries: int = 0

    @property
    def logical_bytes(self) -> int:
        return sum(s.logical_bytes for s in self.sessions)

    @property
    def stored_bytes(self) -> int | None:
        return sum(self.stored.values()) if self.stored is not None else None

    @property
    def dedup(self) -> float | None:
        """Logical bytes per distinct entry byte (1.0: nothing shared); None for no entries."""
        return self.logical_bytes / self.distinct_bytes if self.distinct_bytes else None

    def as_dict(self, *, by_session: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "objects": {space: {"count": self.objects[space], "bytes": self.object_bytes[space]} for space in self.objects},
            "sessions": len(self.sessions),
            "logical_bytes": self.logical_bytes,
            "stored_bytes": self.stored_bytes,
            "stored": self.stored,
            "distinct_entries": self.distinct_entries,
            "distinct_bytes": self.distinct_bytes,
            "shared_entries": self.shared_entries,
            "dedup": round(self.dedup, 3) if self.dedup is not None else None,
        }
        if by_session:
            out["by_session"] = [s.as_dict() for s in self.sessions]
        return out


def store_stats(store: Store) -> StoreStats:
    """Count the objects of each space (each read, so verified), the stored bytes the
    backend reports, and every session's projection entries, each distinct entry's
    line measured once. Objects are read in the backend's cheapest order (a pack's
    blocks one after another), never in the order names come."""
    out = StoreStats()
    objects = store.objects
    for space in SPACES:
        count = size = 0
        for name in objects.read_order(objects.names(space)):
            count += 1
            size += len(objects.get(space, name))
        out.objects[space], out.object_bytes[space] = count, size
    out.stored = objects.stored_bytes()
    holders: dict[str, int] = {}
    held: list[tuple[SessionStats, list[str]]] = []
    for sid in sorted(store.list()):
        with store.read(sid) as s:
            ids = [*s.prefix, *s.log_order]
            stats = SessionStats(sid, entries=len(ids), own=len(s.log_order))
        for entry_id in set(ids):
            holders[entry_id] = holders.get(entry_id, 0) + 1
        held.append((stats, ids))
        out.sessions.append(stats)
    line_bytes = _line_bytes(store, holders)
    for stats, ids in held:
        for entry_id in ids:
            n = line_bytes[entry_id]
            stats.logical_bytes += n
            if holders[entry_id] > 1:
                stats.shared_entries += 1
                stats.shared_bytes += n
    out.distinct_entries = len(line_bytes)
    out.distinct_bytes = sum(line_bytes.values())
    out.shared_entries = sum(1 for n in holders.values() if n > 1)
    return out


def _line_bytes(store: Store, entry_ids: Iterable[str]) -> dict[str, int]:
    """The length of each entry's canonical line, from its envelope and content objects
    (envelopes first, then contents, each in the backend's read order)."""
    objects = store.objects
    envelopes = {eid: store.envelope(eid) for eid in objects.read_order(entry_ids)}
    by_content: dict[str, list[str]] = {}
    for eid, env in envelopes.items():
        by_content.setdefault(env["content"], []).append(eid)
    out: dict[str, int] = {}
    for name in objects.read_order(by_content):
        content = objects.get("contents", name)
        for eid in by_content[name]:
            out[eid] = len(line_from_objects(eid, envelopes[eid], content))
    return out
