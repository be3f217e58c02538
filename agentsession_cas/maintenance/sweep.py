"""Sweeping a store: removing what nothing retained names (RFC 0002 "Deletion and retention").

Retention follows references all the way down, as git's collector follows a
commit to its tree to its blobs, and never reachability from heads:

- an **envelope** is retained while any session's log names it (every
  append record, abandoned branches and uncommitted appends included) or it
  lies on a session's prefix (root..base);
- a **content** while a retained envelope names it;
- a **blob** while a retained content names it by a ``sidecar:`` URL (a content
  only a log's own copy holds yet, before a checkpoint writes it out, is read
  there: :attr:`RetentionSource.blobs`).

This module is the rule (:class:`Retention`: each log folded in as it is read, then
references followed down; :func:`retained` over a list of logs) and the command's entry point
(:func:`sweep`). Where the logs are read from, how objects age and what
removing one means are the backend's: the file backend reads the logs in
``sessions/``, those being staged in ``tmp/`` and those ``repair`` kept aside
(:mod:`agentsession_cas.backends.files.sweep`). Nothing younger than the grace
period goes, whatever names it: a file (loose object or pack) written or
touched within it is left as it is, not even rewritten, so the unretained
objects in it go on ageing. What is kept of the older files is repacked into
one pack; what is dropped is removed only after that pack is durable.

Safety beside writers in other processes (the file backend):

- a sweep holds the store's pack lock (``pack.lock``), so it never
  runs beside another sweep, a ``pack`` or a writer's pack merge;
- it decides over a snapshot of the packs and loose files taken first, and
  reads the logs after it: an append whose record reaches a log before the
  logs are read is retained, and one after it lands its objects in a new
  pack (checkpoints write whole packs) or a new loose file, neither of which
  is in the snapshot;
- while a pass over the logs finds a session deleted before its log could be
  read, it lists ``tmp/`` and ``sessions/`` again and reads every directory
  it has not read yet: a fork made of that session meanwhile holds the only
  log naming its prefix, and is read before anything is decided;
- a writer that finds an object already present touches ("freshens") the
  file holding it, as git does; a sweep does not remove a file whose mtime
  changed since the snapshot, so the object survives even with ``--grace 0``.
  The sweep first moves the file aside and reads its mtime there: a touch
  before the move is seen (the file is put back), and a writer touching it
  after the move finds it gone and writes the object again.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any, Protocol

from ..backends.base import SPACES, Names, ObjectStore, RepackResult, Retained, RetentionSource
from ..errors import (
    AgentSessionError,
    CorruptObjectError,
    CorruptPackError,
    NoSuchObjectError,
    ReadOnlyError,
    WritersActiveError,
    store_relative,
)
from ..format.canonical import loads
from ..format.hashing import HASH_PREFIX, envelope_content, raw_hash
from ..format.media import sidecar_names
from ..lean import dataclass

if TYPE_CHECKING:
    from ..store.store import Store

__all__ = [
    "DEFAULT_GRACE", "SAFE_GRACE", "EnvelopeBytes", "Names", "RawNames", "Retained", "Retention", "RetentionSource",
    "RetentionObjects", "StoredObjects", "SweepResult", "parse_duration", "retain_prefixes", "retained", "sweep", "unreferenced",
]

#: Two weeks, as git's gc.pruneExpire.
DEFAULT_GRACE = 14 * 24 * 3600.0
#: A grace shorter than this does not cover a writer in flight: the objects a push
#: sent before its session is made, or an append's objects before its record lands,
#: are named by nothing yet and only their age protects them. Such a sweep refuses
#: while any writer holds a session of the store, unless forced.
SAFE_GRACE = 3600.0

_DURATION = re.compile(r"(\d+)([smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``0``, ``90s``, ``15m``, ``12h``, ``14d``, ``2w`` (a bare number is seconds)."""
    m = _DURATION.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a duration (such as 0, 90s, 15m, 12h, 14d, 2w)")
    return float(int(m.group(1)) * _UNITS[m.group(2)])


class RetentionObjects(Protocol):
    """What the retention rule reads of the objects, by raw 32-byte digest (the rule holds
    names so, :class:`Names`): the contents a set of envelopes name (those no log's copy
    said), the parent of one envelope (a prefix, walked up: its digest, or the name as it
    is when it is no object name, which names nothing further), and the blobs a set of
    contents names by ``sidecar:`` URL. An object missing or corrupt names nothing in the
    bulk reads; :meth:`parent_of` raises :class:`NoSuchObjectError` or
    :class:`CorruptObjectError` for it. A reader holding the objects' bytes gets all three
    from :class:`EnvelopeBytes`; the file backend's fsck walk, which holds its envelopes
    parsed and its contents' ``sidecar:`` names found, answers from those."""

    def content_names(self, entries: Collection[bytes]) -> Iterable[bytes]: ...

    def parent_of(self, entry: bytes) -> bytes | str | None: ...

    def blob_names(self, contents: Collection[bytes]) -> Iterable[bytes]: ...


class EnvelopeBytes:
    """:class:`RetentionObjects` over a subclass's ``read_order(raws)`` (the order to read
    them in), ``envelope(raw)`` (its bytes, verified) and ``sidecars(raw)`` (a content's
    ``sidecar:`` names), each raising :class:`NoSuchObjectError` or
    :class:`CorruptObjectError` for an object missing or corrupt. An envelope's content is
    read by the one reading of an envelope (:func:`envelope_content`, most with no parse),
    its parent parsed (only a prefix's entries are asked it); bytes that are no envelope
    name neither. A log may name what is no object name (``sha256:`` and 64 lowercase hex
    digits, :func:`is_hash`; a damaged log kept aside, a hostile writer): it names no
    object, so the rule holds it aside (:attr:`Names.odd`) and asks nothing of it. A
    reader that can read many objects at once overrides :meth:`envelopes_of` and
    :meth:`sidecars_of` (:class:`StoredObjects`)."""

    def read_order(self, raws: Iterable[bytes]) -> list[bytes]:
        raise NotImplementedError

    def envelope(self, raw: bytes) -> bytes:
        raise NotImplementedError

    def sidecars(self, raw: bytes) -> list[str]:
        raise NotImplementedError

    def content_names(self, entries: Collection[bytes]) -> Iterator[bytes]:
        for data in self.envelopes_of(entries):
            c = envelope_content(data)
            if c:
                yield bytes.fromhex(c[7:])  # (a name envelope_content gives is an object name)

    def envelopes_of(self, raws: Collection[bytes]) -> Iterator[bytes]:
        """The bytes of each of ``raws`` that is held sound, in :meth:`read_order`."""
        for raw in self.read_order(raws):
            try:
                yield self.envelope(raw)
            except (NoSuchObjectError, CorruptObjectError):
                continue

    def sidecars_of(self, raws: Collection[bytes]) -> Iterator[list[str]]:
        """The ``sidecar:`` names of each of ``raws`` that is held sound, in :meth:`read_order`."""
        for raw in self.read_order(raws):
            try:
                yield self.sidecars(raw)
            except (NoSuchObjectError, CorruptObjectError):
                continue

    def parent_of(self, entry: bytes) -> bytes | str | None:
        data = self.envelope(entry)  # (missing or corrupt: raised as it is)
        try:
            env = loads(data)
        except (ValueError, AgentSessionError):
            return None
        parent = env.get("parent") if isinstance(env, dict) else None
        return (raw_hash(parent) or parent) if isinstance(parent, str) else None

    def blob_names(self, contents: Collection[bytes]) -> Iterator[bytes]:
        for names in self.sidecars_of(contents):
            yield from map(bytes.fromhex, (name[7:] for name in names))  # (a sidecar: URL names an object name)


class Retention:
    """RFC 0002's retention, read one log at a time: :meth:`add` folds a log in (the
    envelopes it names, the contents its own copy says, the bases of its prefix, the
    blobs its copy's contents name) and keeps none of its records, so a walk over a
    store of millions of records holds one log's at a time; :meth:`finish` then follows
    references down through the objects (each prefix walked up from its base, the
    contents of envelopes no log's copy said, the blobs every retained content names).
    Names are held as raw digests (:class:`Names`), converted once as a log is read.

    An envelope is retained while any log names it or it lies on a prefix, a content
    while a retained envelope names it, a blob while a retained content names it by a
    ``sidecar:`` URL. This class is that rule; :func:`retained` and :func:`unreferenced`
    are it over a list of logs, fsck's file walk adds each log as it reads it, and
    :func:`retain_prefixes` adds prefixes to what it retained (a PostgreSQL store's
    forks made within the grace)."""

    __slots__ = ("ret", "bases", "said", "progress")

    def __init__(self, *, progress: Callable[[str], None] | None = None) -> None:
        self.ret = Retained()
        self.bases: list[str] = []
        self.said: set[bytes] = set()  # envelopes whose content their log's own copy gave
        self.progress = progress

    def add(self, src: RetentionSource) -> None:
        """Fold in one log (its records are not kept)."""
        ret, bases = self.ret, self.bases
        appended: list[str] = []
        for d in src.records:
            op = d.get("op")
            if op == "append":
                entry = d.get("entry")
                if isinstance(entry, str):
                    appended.append(entry)
            elif op == "create" and isinstance(d.get("base"), str):
                bases.append(d["base"])
        # (each name converted once, all of a log's together: no Python call per record)
        raws = ret.envelopes.update(appended)
        if src.contents:
            said = list(map(src.contents.get, appended))
            ret.contents.update(list(filter(None, said)))
            self.said.update(filter(None, itertools.compress(raws, said)))
        ret.blobs.update(src.blobs)  # named by contents its log alone holds yet
        if src.staged:
            ret.staged += 1
        else:
            ret.sessions += 1
        if self.progress and (ret.sessions + ret.staged) % 256 == 0:
            self.progress(f"reading logs: {ret.sessions + ret.staged:,} read")

    def finish(self, objects: RetentionObjects, *, blobs: bool = True) -> Retained:
        """What the logs added retain, following references down through ``objects``;
        ``blobs=False`` (the store holds no blob to decide over) reads no content for
        ``sidecar:`` URLs. Called once: the logs added are then spent."""
        ret, progress = self.ret, self.progress
        envelopes, contents = ret.envelopes.raws, ret.contents.raws
        if progress:
            progress(f"read {ret.sessions} session log(s), {ret.staged} staged")
        _walk_prefixes(ret.envelopes, self.bases, objects)
        # Contents of retained envelopes (those whose log copy did not already say; when
        # no copy said any, as of compacted logs, the set itself: a copy of it is as big).
        unsaid = envelopes - self.said if self.said else envelopes
        self.bases, self.said = [], set()
        if progress and unsaid:
            progress(f"reading {len(unsaid):,} envelope(s) for their contents")
        contents.update(objects.content_names(unsaid))
        del unsaid
        # Blobs: any retained content may name one (RFC 0002 sets no condition on the
        # session's media), so contents are read whenever the store holds a blob.
        if blobs:
            if progress and contents:
                progress(f"reading {len(contents):,} content(s) for the blobs they name")
            ret.blobs.raws.update(objects.blob_names(contents))
        return ret

    def unreferenced(self, sound: Mapping[str, Collection[str]], objects: RetentionObjects) -> dict[str, int]:
        """How many of the objects ``sound`` names (per space: those held whose bytes hash
        to their name; :class:`RawNames` where the caller holds raw digests) nothing the
        logs added retains: what a sweep with a grace of 0 would remove. Finishes the
        retention (blobs read only where ``sound`` holds some)."""
        ret = self.finish(objects, blobs=bool(sound.get("blobs")))
        kept: dict[str, Names] = {"entries": ret.envelopes, "contents": ret.contents, "blobs": ret.blobs}
        counts: dict[str, int] = {}
        for space in SPACES:
            names = sound.get(space, ())
            # (each name once: those held less those retained, kept in no set: a set of those
            # retained would hold a digest per object; raw digests, as the walks hold them,
            # looked up with no Python call per name)
            found = (map(kept[space].raws.__contains__, names.raws) if isinstance(names, RawNames)
                     else map(kept[space].__contains__, names))
            counts[space] = len(names) - sum(found)
        return counts


def _walk_prefixes(envelopes: Names, bases: Iterable[str], objects: RetentionObjects) -> list[bytes]:
    """The rule's prefix walk: from each base up until an entry already retained (whose
    ancestors its own session's log and prefix retain in turn), each added to
    ``envelopes``; those added (by digest) returned."""
    raws, odd = envelopes.raws, envelopes.odd
    added: list[bytes] = []
    for base in bases:
        current: bytes | str | None = raw_hash(base) or base
        while current is not None and current not in raws:
            if isinstance(current, str):
                odd.add(current)  # no object name: it names no parent
                break
            raws.add(current)
            added.append(current)
            try:
                current = objects.parent_of(current)
            except (NoSuchObjectError, CorruptObjectError):
                break  # missing: fsck's business; nothing above it can be read either
    return added


def retain_prefixes(ret: Retained, bases: Iterable[str], objects: RetentionObjects, *, blobs: bool) -> None:
    """Add to what :meth:`Retention.finish` retained the prefixes root..base of ``bases``
    by the rule's own walk, with the contents of the envelopes that adds and, where
    ``blobs`` (the store holds some), the blobs those new contents name: a PostgreSQL
    store's forks made within the grace, whose ``holds`` rows keep their prefixes."""
    added = _walk_prefixes(ret.envelopes, bases, objects)
    if not added:
        return
    contents = ret.contents.raws
    new = [c for c in objects.content_names(added) if c not in contents]
    contents.update(new)
    if blobs and new:
        ret.blobs.raws.update(objects.blob_names(new))


def _added(
    store: Store, sources: Iterable[RetentionSource] | None, progress: Callable[[str], None] | None,
) -> Retention:
    """A :class:`Retention` with ``sources`` added as they come (by default every log the
    backend holds)."""
    retention = Retention(progress=progress)
    for src in store.backend.retention_sources() if sources is None else sources:
        retention.add(src)
    return retention


def retained(
    store: Store,
    sources: Iterable[RetentionSource] | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    blobs: bool = True,
    objects: RetentionObjects | None = None,
) -> Retained:
    """RFC 0002's retention (:class:`Retention`), following references down from every log
    to blobs. ``sources`` are the logs to honour (by default every one the backend holds),
    each folded in as it comes and dropped; ``blobs=False`` (the store holds no blob to
    decide over) skips reading contents for ``sidecar:`` URLs. ``objects`` is where
    envelopes and contents are read (by default through the store; fsck hands what its
    walk over every object read, so nothing is read twice)."""
    return _added(store, sources, progress).finish(objects if objects is not None else StoredObjects(store.objects, store.root), blobs=blobs)


def unreferenced(
    store: Store,
    sound: Mapping[str, Collection[str]],
    sources: Iterable[RetentionSource] | None = None,
    *,
    objects: RetentionObjects | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, int]:
    """How many of the objects ``sound`` names (per space: those held whose bytes hash to
    their name) nothing retains: what a sweep with a grace of 0 would remove, by
    :meth:`Retention.unreferenced` over ``sources`` (by default every log the backend
    holds). fsck's ``counts["unreferenced"]`` on a backend whose walk does not count them
    itself."""
    return _added(store, sources, progress).unreferenced(sound, objects if objects is not None else StoredObjects(store.objects, store.root))


class RawNames:
    """Raw 32-byte digests (as fsck's walks keep them) seen as the names of a space,
    counted by :meth:`Retention.unreferenced` against the digests the rule holds, with no
    name made."""

    __slots__ = ("raws",)

    def __init__(self, raws: Collection[bytes]) -> None:
        self.raws = raws

    def __len__(self) -> int:
        return len(self.raws)

    def __iter__(self) -> Iterator[str]:
        return map(HASH_PREFIX.__add__, map(bytes.hex, self.raws))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and raw_hash(name) in self.raws


class StoredObjects(EnvelopeBytes):
    """A store's objects as retention reads them: a pack that does not read stops the
    sweep (what its envelopes and contents name cannot be told, and a sweep never
    guesses), naming it relative to the store (``root``) and what to run first."""

    def __init__(self, objects: ObjectStore, root: str | None = None):
        self.objects, self.root = objects, root

    def read_order(self, raws: Iterable[bytes]) -> list[bytes]:
        return [bytes.fromhex(name[7:]) for name in self.objects.read_order(map(HASH_PREFIX.__add__, map(bytes.hex, raws)))]

    def envelope(self, raw: bytes) -> bytes:
        return self.get("entries", raw)

    def sidecars(self, raw: bytes) -> list[str]:
        return sidecar_names(self.get("contents", raw))

    def envelopes_of(self, raws: Collection[bytes]) -> Iterator[bytes]:
        return self._sound("entries", raws)

    def sidecars_of(self, raws: Collection[bytes]) -> Iterator[list[str]]:
        return map(sidecar_names, self._sound("contents", raws))

    def _sound(self, space: Any, raws: Collection[bytes]) -> Iterator[bytes]:
        """The bytes of each of ``raws`` the store holds sound, read a chunk at a time
        (:meth:`ObjectStore.get_many`: a pack's block, or one query of the database, for
        many objects; one read each was a query per envelope on PostgreSQL, minutes for a
        100,000-entry store), in the store's read order; a chunk holding one missing or
        corrupt is read again one by one, passing that one by, as :class:`EnvelopeBytes`
        does."""
        order = self.objects.read_order(map(HASH_PREFIX.__add__, map(bytes.hex, raws)))
        for i in range(0, len(order), _SOUND_CHUNK):
            chunk = order[i:i + _SOUND_CHUNK]
            try:
                yield from self._read(self.objects.get_many, space, chunk)
                continue
            except (NoSuchObjectError, CorruptObjectError):
                pass
            for name in chunk:
                try:
                    yield self._read(self.objects.get, space, name)
                except (NoSuchObjectError, CorruptObjectError):
                    continue

    def get(self, space: Any, raw: bytes) -> bytes:
        return self._read(self.objects.get, space, HASH_PREFIX + raw.hex())

    def _read(self, read: Callable[[Any, Any], Any], space: Any, names: Any) -> Any:
        """``read(space, names)`` (a get, or a get_many), a pack that does not read named
        relative to the store, with what to run first."""
        try:
            return read(space, names)
        except CorruptPackError as exc:
            raise CorruptPackError(
                f"{store_relative(str(exc), self.root)}: a sweep cannot tell what the {space} in it name; run "
                "`agentsession pack` first (it copies what of the pack reads and sets it aside)", path=exc.path,
            ) from None


#: Objects :class:`StoredObjects` reads at once for the retention rule.
_SOUND_CHUNK = 1024


@dataclass
class SweepResult:
    """What a sweep removed (or, dry, would remove), and what it kept."""

    repack: RepackResult
    grace: float
    sessions: int
    staged: int
    retained_envelopes: int
    retained_contents: int
    retained_blobs: int
    tmp_removed: list[str] = field(default_factory=list)
    #: Files (or objects: ``young_unit``) younger than the grace period, left as they were.
    young_files: int = 0
    #: What ``young_files`` counts: ``file`` (a file store's packs and loose files) or ``object``.
    young_unit: str = "file"

    def as_dict(self) -> dict[str, Any]:
        d = self.repack.as_dict()
        d.update(
            grace_seconds=self.grace,
            sessions=self.sessions,
            staged=self.staged,
            retained={"entries": self.retained_envelopes, "contents": self.retained_contents, "blobs": self.retained_blobs},
            tmp_removed=self.tmp_removed,
            young_files=self.young_files,
            young_unit=self.young_unit,
        )
        return d


def sweep(
    store: Store,
    *,
    grace: float = DEFAULT_GRACE,
    dry_run: bool = False,
    wait: float = 60.0,
    progress: Callable[[int, int], None] | None = None,
    phase: Callable[[str], None] | None = None,
    force: bool = False,
) -> SweepResult:
    """Remove every object nothing retained names and older than ``grace`` seconds
    (repacking what stays, where the backend packs). ``progress(done, total)`` is
    called as objects are copied, ``phase(text)`` as retention is read (logs,
    envelopes, contents) before that. The backend decides over a snapshot taken
    before the logs are read (see the module docstring). A ``grace`` under
    :data:`SAFE_GRACE` refuses while a writer holds any session (``force`` overrides)."""
    backend = store.backend
    if store.readonly and not dry_run:
        raise ReadOnlyError(f"{store.describe()} is open read-only; a sweep removes objects")
    if grace < SAFE_GRACE and not dry_run and not force:
        held = backend.writers_holding()
        if held is None or held:
            who = "whether a writer holds a session cannot be told here" if held is None else (
                f"a writer holds {len(held)} session(s): {', '.join(held[:5])}{' ...' if len(held) > 5 else ''}")
            raise WritersActiveError(
                f"refusing to sweep with a grace of {grace:g}s: {who}, and a grace under {SAFE_GRACE:g}s does not "
                "protect the objects a writer or a push has sent but not yet recorded; wait for the writers, "
                "use a longer grace, or --force to take that risk"
            )

    def compute(holds_blobs: bool) -> Retained:
        return retained(store, backend.retention_sources(), blobs=holds_blobs, progress=phase)

    repack, young, tmp_removed, ret = backend.sweep_objects(
        compute, grace=grace, dry_run=dry_run, wait=wait, progress=progress
    )
    return SweepResult(
        repack=repack,
        grace=grace,
        sessions=ret.sessions,
        staged=ret.staged,
        retained_envelopes=len(ret.envelopes),
        retained_contents=len(ret.contents),
        retained_blobs=len(ret.blobs),
        tmp_removed=tmp_removed,
        young_files=young,
        young_unit=backend.young_unit,
    )
