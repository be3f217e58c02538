"""``stats``: what a store holds and how much its sessions share (issue 14).

Two measures of size. **Logical** bytes are what the sessions would be as files:
the sum, over every session, of the bytes of its projection's entry lines (a fork's
prefix counted in the fork too; the header and a synthetic ``leaf`` marker not).
**Stored** bytes are what the objects take where the backend keeps them (loose files
and packs for a store directory). Sessions share entries (a fork holds its base's
path; an imported copy holds the same entries): each distinct entry's line is
counted once in ``distinct_bytes``, and ``dedup`` is logical over distinct.

On a damaged store the figures are what could be counted: an object that does not
read is left out of its space's count, a session that does not read out of the
sessions, an entry whose objects do not read out of every byte count; each is a
problem in fsck's shape and codes (``problems``), so the command exits 1 with the
figures printed rather than with none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import field
from typing import TYPE_CHECKING, Any

from ..backends.base import SPACES, FsckProblem, Space
from ..errors import AgentSessionError, CorruptObjectError, CorruptPackError, NoSuchObjectError, store_relative
from ..format.hashing import line_from_objects, line_size
from ..lean import dataclass
from ..store.session import envelope_parts
from .check import findings, verify_stored

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
    #: What did not read, so the figures above leave it out (fsck's shape and codes).
    problems: list[FsckProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

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
            "ok": self.ok,
            "problems": [p.as_dict() for p in self.problems],
        }
        if by_session:
            out["by_session"] = [s.as_dict() for s in self.sessions]
        return out


def store_stats(store: Store) -> StoreStats:
    """Count the objects of each space (each read, so verified), the stored bytes the
    backend reports, and every session's projection entries, each distinct entry's
    line measured once. The objects are read in one pass in the backend's cheapest
    order (:meth:`~agentsession_cas.backends.base.ObjectStore.read_all`: a pack's blocks
    one after another, each once), which gives the envelopes and the contents' sizes
    the lines are measured from (:func:`~agentsession_cas.format.hashing.line_size`):
    no object is read twice, no line is made. What does not read is left out of the
    figures and named in ``problems``."""
    out = StoreStats()
    objects = store.objects
    holders: dict[str, int] = {}
    held: list[tuple[SessionStats, list[str]]] = []
    in_logs: dict[str, int] = {}  # the lines of entries only an open log holds, measured while it is open
    for sid in sorted(store.list()):
        try:
            with store.read(sid) as s:
                ids = [*s.prefix, *s.log_order]
                stats = SessionStats(sid, entries=len(ids), own=len(s.log_order))
                if any(p.code == "in-log-only" for p in s.recovered):
                    # A writer that did not close (a crash, or one writing now): its last
                    # appends are in its log, not yet in objects/, and served from the log
                    # only while this session is open.
                    pending = [e for e in s.log_order if e not in in_logs and not objects.exists("entries", e)]
                    in_logs.update(_line_bytes(store, pending, {}, {})[0])
        except AgentSessionError as exc:
            found = findings(verify_stored(store, sid))  # the damage named as fsck names it
            out.problems.extend(found or [FsckProblem("error", exc.code, f"session {sid}: {exc}", session=sid)])
            continue
        for entry_id in set(ids):
            holders[entry_id] = holders.get(entry_id, 0) + 1
        held.append((stats, ids))
        out.sessions.append(stats)
    for sid in store.backend.sessions.unlisted():
        out.problems.append(FsckProblem(
            "error", "missing-header", f"session {sid} has no header file (sessions/{sid}/header): the store does not "
            "list it, and its entries are left out of the figures (`agentsession repair` writes it again from its "
            "log)", session=sid, file=f"sessions/{sid}/header"))
    envelopes: dict[str, tuple[str, bytes | None]] = {}  # of the entries held: (content, members of the common form)
    sizes: dict[str, int] = {}  # every content's size
    bad_packs: dict[str, tuple[str, int]] = {}  # a pack that does not read: why, and how many objects it keeps from the count
    count: dict[str, int] = dict.fromkeys(SPACES, 0)
    size: dict[str, int] = dict.fromkeys(SPACES, 0)
    for space, name, got in objects.read_all(SPACES):
        if isinstance(got, CorruptPackError):
            why, n = bad_packs.get(got.path, (store_relative(str(got), store.root), 0))
            bad_packs[got.path] = (why, n + 1)
            continue
        if isinstance(got, Exception):
            out.problems.append(_object_fault(store, space, name, got))
            continue
        count[space] += 1
        size[space] += len(got)
        if space == "contents":
            sizes[name] = len(got)
        elif space == "entries" and name in holders:
            with contextlib.suppress(AgentSessionError, ValueError):  # (read again below, which says why)
                env, members = envelope_parts(got, name, objects, tail=True)
                envelopes[name] = (env["content"], members)
    out.objects, out.object_bytes = count, size
    for path, (why, n) in bad_packs.items():
        out.problems.append(FsckProblem("error", "bad-pack", f"{why}: {n:,} object(s) in it do not read and are left out of "
                                        "the figures", file=store_relative(path, store.root)))
    out.stored = objects.stored_bytes()
    line_bytes, unread = _line_bytes(store, [e for e in holders if e not in in_logs], envelopes, sizes)
    line_bytes.update(in_logs)
    for stats, ids in held:
        for entry_id in ids:
            length = line_bytes.get(entry_id)
            if length is None:
                code, why = unread[entry_id]
                out.problems.append(FsckProblem(
                    "error", code, f"session {stats.session}: entry {entry_id} has no sound copy ({why}); its line "
                    "is left out of the figures", session=stats.session, object=entry_id, space="entries"))
                continue
            stats.logical_bytes += length
            if holders[entry_id] > 1:
                stats.shared_entries += 1
                stats.shared_bytes += length
    out.distinct_entries = len(line_bytes)
    out.distinct_bytes = sum(line_bytes.values())
    out.shared_entries = sum(1 for eid, n in holders.items() if n > 1 and eid in line_bytes)
    return out


def _object_fault(store: Store, space: Space, name: str, exc: Exception) -> FsckProblem:
    """An object that did not read, coded as fsck codes it: a copy that does not hash
    to its name, or one that cannot be read at all."""
    code = ("corrupt-object" if isinstance(exc, CorruptObjectError)
            else "missing-object" if isinstance(exc, NoSuchObjectError) else "unreadable")
    try:
        where: str | None = store.objects.where(space, name)
    except (AgentSessionError, OSError):
        where = None
    return FsckProblem("error", code, f"{space} object {name} does not read: {store_relative(str(exc), store.root)}",
                       object=name, space=space, file=where)


def _line_bytes(
    store: Store, entry_ids: Iterable[str], envelopes: dict[str, tuple[str, bytes | None]], sizes: dict[str, int]
) -> tuple[dict[str, int], dict[str, tuple[str, str]]]:
    """The length of each entry's canonical line, from its envelope's members and its
    content's size as the pass over the objects found them; and each entry whose
    objects do not read, with the code fsck gives that and why. An envelope the pass did
    not give (not found, not sound, held by a log only) or of another form than the
    common one (a merge's, whose line is made), and a content it did not size, are read
    here by name, which serves them or says what is wrong."""
    objects = store.objects
    unread: dict[str, tuple[str, str]] = {}
    out: dict[str, int] = {}
    for eid in entry_ids:
        content_name, members = envelopes.get(eid, ("", None))
        size = sizes.get(content_name)
        if members is not None and size is not None:
            out[eid] = line_size(eid, size, members)
            continue
        try:
            env = store.envelope(eid)
        except (AgentSessionError, OSError, ValueError) as exc:
            unread[eid] = ("missing-object", store_relative(str(exc), store.root))
            continue
        try:
            content = objects.get("contents", env["content"])
        except (AgentSessionError, OSError) as exc:
            unread[eid] = ("missing-content", store_relative(str(exc), store.root))
            continue
        out[eid] = len(line_from_objects(eid, env, content))
    return out, unread
