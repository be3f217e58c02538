"""Objects: canonical bytes named by their SHA-256, in three spaces, loose or packed.

``objects/entries/<2 hex>/<62 hex>`` holds envelopes, ``objects/contents/...``
bodies, ``objects/blobs/...`` media blobs; ``objects/pack/`` holds packs
(:mod:`agentsession_cas.packs`). A read finds an object in a pack or loose,
transparently, and hashes the bytes against the name either way, so a
corrupt object is never served; the error names the object and its file.
Writing is idempotent: an object already present is not rewritten, since
its name is its content.

Durability is the caller's choice per write. ``put(..., durable=False)``
leaves the file unsynced and returns its path for the caller to make
durable later; ``put_many`` writes a batch (a checkpoint, an import) and
makes it durable at once: as one pack when the batch is big enough to be
worth one, else as loose files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import itertools
import os
import re
import struct
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

from ...errors import (
    AgentSessionError,
    CorruptObjectError,
    CorruptPackError,
    NoSuchObjectError,
    StoreError,
    not_an_object_name,
    store_relative,
    unknown_object_space,
)
from ...format.hashing import HASH_PREFIX, all_hashes, envelope_content, is_hash
from ...fsutil import (
    NotAFileError,
    fsync_dir,
    fsync_paths,
    has_hole,
    hash_file,
    read_whole,
    write_atomic,
    write_new_file,
)
from ...lean import dataclass
from ..base import FsckProblem, ObjectStore, ReadyBlock, RepackResult, Space
from .locks import PACK_LOCK, FileLock, LockTimeout
from .packs import (
    BLOCK_TARGET,
    MAX_PACKED,
    SPACE_BITS,
    Block,
    Pack,
    PackSet,
    PackWriter,
    StreamPackWriter,
    decompress_block,
    index_pack,
    pack_file_sound,
    salvage_pack,
)

__all__ = ["SPACES", "FileObjects", "RepackResult", "fsync_paths", "fsync_dir"]


#: The three hash spaces RFC 0002 names, and their directories.
SPACES = ("entries", "contents", "blobs")
#: Temp names of loose objects being written: the process, a token drawn once (a name a
#: crashed process with the same pid left in tmp/ is not taken again) and a count.
_TMP_TOKEN = os.urandom(4).hex()
_TMP_COUNT = itertools.count()
#: What a filesystem without hard links says to os.link.
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV})
_T = TypeVar("_T")

#: From this many objects on, a batch is written as one pack instead of loose files.
PACK_BATCH = 64
#: Objects :meth:`FileObjects.write_pack` hands its pack writer at once (a checkpoint's
#: 2,048 in one step; an import's stream a bounded piece at a time).
_ADD_CHUNK = 4096
#: Pack size tiers start here and grow by MERGE_FANIN; that many packs in one
#: tier are merged into one.
TIER_BASE = 1 << 20
MERGE_FANIN = 8
#: Packs are merged on their own (without recompressing) while the merge copies
#: no more than this many bytes; bigger merges are left to ``pack``.
AUTO_MERGE_MAX = 64 * 1024 * 1024
#: A full repack (``pack``, sweeps) compresses harder and in bigger blocks than
#: a writer's checkpoint, with envelopes and random base64 stored compactly: it
#: runs seldom and its pack is read for a long time. Level 13 is where zstd's
#: binary-tree search starts; blocks of 2 MiB cost about 2 ms to read cold.
REPACK_LEVEL = 13
REPACK_BLOCK = 2 << 20
#: Blocks a repack compresses at once (zstd runs beside the interpreter).
REPACK_THREADS = max(1, min(4, os.cpu_count() or 1))
#: From this many objects on, a batch streamed into a pack (a push's, an import's spill)
#: has its blocks compressed on a thread beside the caller, whose own work (verifying
#: what was sent, cutting blocks) then overlaps zstd's, where two cores are there.
THREADED_BATCH = 16384
#: From this many names on, :meth:`FileObjects.held_many` lists a space's loose objects
#: once (a listing per fan-out directory) instead of looking for each name's file.
LIST_LOOSE = 1024
#: A store with about this many loose objects packs them when a writer closes
#: (git's gc.auto is 6700).
AUTO_PACK_LOOSE = 4096


def _space_of(spaces: int) -> str | None:
    """The first space an index record's bits name (an object named in two is one's bytes)."""
    return next((space for space, bit in SPACE_BITS.items() if spaces & bit), None)


def _freshen(path: str) -> bool:
    """Touch a file holding an object someone is writing again (as git freshens
    objects): a sweep's grace period then counts from now, and a sweep does not
    remove a file touched since it looked. False when the file is gone.

    The new mtime is later than the old one even when the clock has not moved
    since (file times come from a coarse clock): a sweep compares them exactly."""
    try:
        old = os.stat(path).st_mtime_ns
        new = max(time.time_ns(), old + 1)
        try:
            os.utime(path, ns=(new, new))
        except PermissionError:
            os.utime(path)  # not the file's owner: "now" needs only write access
    except OSError:
        return False  # gone, or not to be touched: the caller writes the object again
    return True


#: ``AGENTSESSION_READ_AHEAD=0``: no block is decompressed ahead on a worker thread
#: (:meth:`FileObjects.get_chunks`): the same reads on the reader's thread alone.
READ_AHEAD_ENV = "AGENTSESSION_READ_AHEAD"

#: A loose object bigger than this is hashed in chunks before it is read whole.
HASH_FIRST = 64 << 20


class FileObjects(ObjectStore):
    """The objects of one store directory, under ``<root>/objects``, loose or packed.

    Objects a session's log holds and a checkpoint has not yet written here
    (appends of a session open in this process, or restored from payloads by a
    snapshot) are served from that log: each such log registers itself while it
    holds any (:meth:`register`)."""

    def __init__(self, root: str):
        self.root = root
        self._logs: weakref.WeakSet[Any] = weakref.WeakSet()  # FileSessionLog handles holding objects not yet here
        self.dir = os.path.join(root, "objects")
        self.tmp = os.path.join(root, "tmp")
        self.pack_dir = os.path.join(self.dir, "pack")
        self.packs = PackSet(self.pack_dir)
        #: Set once this handle has written an object: only then does a writer's
        #: close look at whether loose objects or small packs want packing.
        self.wrote = False
        #: Packs a merge found unreadable (by name): left out of later merges in this process.
        self._unmergeable: set[str] = set()

    def close(self) -> None:
        self.packs.close()

    def path(self, space: str, name: str) -> str:
        """Where the loose object ``name`` of ``space`` lives (the name is checked first)."""
        if space not in SPACES:
            raise unknown_object_space(space, SPACES)
        if not is_hash(name):
            raise not_an_object_name(name)
        return f"{self.dir}{os.sep}{space}{os.sep}{name[7:9]}{os.sep}{name[9:]}"

    def relpath(self, space: str, name: str) -> str:
        return os.path.relpath(self.path(space, name), self.root)

    def exists(self, space: str, name: str) -> bool:
        if self._packed(space, name) is not None or os.path.exists(self.path(space, name)):
            return True
        self.packs.refresh()  # (looked up again whatever it says: see _get)
        return self._packed(space, name) is not None

    def is_packed(self, space: str, name: str) -> bool:
        return self._packed(space, name) is not None

    def _packed(self, space: str, name: str) -> tuple[Pack, object] | None:
        found = self.packs.locate(name)
        if found is not None and found[1].spaces & SPACE_BITS[space]:
            return found
        return None

    def _packed_copies(self, space: str, name: str) -> Iterator[tuple[Pack, Any]]:
        """Every pack naming the object in ``space``, biggest first (:meth:`_packed`'s is
        the first): where a read looks on when a copy is damaged."""
        seen: set[str] = set()
        while (found := self.packs.locate(name, seen)) is not None:
            seen.add(found[0].name)
            if found[1].spaces & SPACE_BITS[space]:
                yield found

    def _sound_packed(self, space: str, name: str) -> tuple[tuple[Pack, Any], bytes] | AgentSessionError | None:
        """The first packed copy that reads and hashes to its name (where, and its bytes);
        else, when every pack naming it holds a damaged copy, the first one's error; None
        when no pack names it. A damaged copy never hides a sound one in another pack (a
        writer that found a copy corrupt writes a sound one, in a pack when its batch is big)."""
        error: AgentSessionError | None = None
        for found in self._packed_copies(space, name):
            got = self._get_packed(space, name, *found)
            if isinstance(got, bytes):
                return found, got
            error = error or got
        return error

    def _packed_sound(self, space: str, name: str) -> tuple[Pack, object] | None:
        """Where a pack holds the object and its copy reads and hashes to its name: a
        writer that finds it there need not write it, a receiver need not be sent it. A
        corrupt packed copy counts as absent, so a sound loose copy is written beside it
        (and served first, see :meth:`_get`); a pack index is no proof of the bytes."""
        got = self._sound_packed(space, name)
        return got[0] if isinstance(got, tuple) else None

    def _held_packed(self, space: str, name: str, fresh: dict[str, bool]) -> bool:
        """A pack holds a sound copy of the object and that pack was freshened (once per
        pack: ``fresh`` maps a pack's path to whether it still was there): a batch being
        packed need not hold the object again. False when it must (no sound packed copy,
        or its pack swept away meanwhile)."""
        found = self._packed_sound(space, name)
        if found is None:
            return False
        there = fresh.get(found[0].path)
        if there is None:
            there = fresh[found[0].path] = _freshen(found[0].path)
        return there

    def get(self, space: str, name: str) -> bytes:
        """The object's bytes, from a pack or a loose file (or a log that holds it until
        its next checkpoint), verified against its name."""
        try:
            return self._get(space, name)
        except (NoSuchObjectError, CorruptObjectError):
            # Not in objects/ yet, or a loose copy that does not hash (a crash's leftover,
            # or one a writer on a filesystem without hard links is writing in place): a
            # reader that holds a log carrying the object takes the log's copy.
            for log in self._logs:
                data = log.pending_object(space, name)
                if data is not None:
                    return data  # checked against its name when it was taken in
            raise

    def get_many(self, space: str, names: Sequence[str]) -> list[bytes]:
        """:meth:`get` of each name, in order, each hashed against its name: the packed
        ones read in bulk (:meth:`PackSet.read_many`, which checks them), any other
        (loose, held by a log, damaged, not a name at all) by :meth:`get`, which says
        what is wrong."""
        bits = SPACE_BITS.get(space)
        if bits is None or not names or not all_hashes(names):
            return [self.get(space, name) for name in names]
        got = self.packs.read_many([bytes.fromhex(name[7:]) for name in names], bits)
        if None in got:
            return [data if data is not None else self.get(space, name) for name, data in zip(names, got)]
        return got  # type: ignore[return-value]  # no None in it

    def get_chunks(self, space: str, chunks: Iterable[Sequence[str]]) -> Iterator[list[bytes]]:
        """:meth:`get_many` of each chunk, with the packs' blocks after the one each read
        comes to decompressed on a worker thread meanwhile (:meth:`PackSet.reading_ahead`),
        when this process may run on two cores or more and :data:`READ_AHEAD_ENV` is not
        ``0``: a listing formats one chunk while the next ones' blocks are decompressed."""
        from ...format.parallel import _cores  # (the one place that counts them)

        if space not in SPACE_BITS or _cores() < 2 or os.environ.get(READ_AHEAD_ENV, "").strip() == "0":
            yield from (self.get_many(space, names) for names in chunks)
            return
        with self.packs.reading_ahead(SPACE_BITS[space]):
            for names in chunks:
                yield self.get_many(space, names)

    def register(self, log: Any) -> None:
        """A log now holds objects not yet written here: serve them from it (while the
        log is open and referenced)."""
        self._logs.add(log)

    def unregister(self, log: Any) -> None:
        self._logs.discard(log)

    def pending_names(self) -> set[str]:
        """The names of objects held only in logs open here (a sweep keeps them)."""
        out: set[str] = set()
        for log in self._logs:
            for entry_id, (chash, _, _) in log.unmaterialized.items():
                out.update((entry_id, chash))
            for entry_id, (content, _) in log.payloads.items():
                out.update((entry_id, HASH_PREFIX + hashlib.sha256(content).hexdigest()))
        return out

    def _get(self, space: str, name: str) -> bytes:
        bits = SPACE_BITS.get(space)
        if bits is not None and is_hash(name):
            # The common read, in as few calls as it takes: a packed copy that hashes to
            # its name (a bulk reader, export or exchange, makes one per object).
            hit = self.packs.locate(name)
            if hit is not None and hit[1].spaces & bits:
                try:
                    data = self.packs.read(*hit)
                except CorruptPackError:
                    data = None
                if data is not None and HASH_PREFIX + hashlib.sha256(data).hexdigest() == name:
                    return data
        path = self.path(space, name)  # the name checked; anything else as it always was
        got = self._sound_packed(space, name)
        if isinstance(got, tuple):
            return got[1]
        if got is not None:
            # Every packed copy corrupt: a sound loose one may still be there.
            try:
                return self._get_loose(space, name, path)
            except NoSuchObjectError:
                raise got from None
        try:
            return self._get_loose(space, name, path)
        except NoSuchObjectError:
            # Packed (or merged, or swept and repacked) by another process since we looked?
            # Looked up again whatever refresh() says: it says whether the listing changed
            # just now, and another thread of ours (a checkpoint's worker publishing its
            # pack) may have listed the new pack since our lookup missed it.
            self.packs.refresh()
            got = self._sound_packed(space, name)
            if isinstance(got, tuple):
                return got[1]
            if got is not None:
                raise got from None
            if not self.packs.bad:
                raise
            # Not "no such object" alone: a pack that could not be read may hold it.
            unread = "; ".join(f"objects/pack/{k}.pack ({why})" for k, why in sorted(self.packs.bad.items()))
            exc = NoSuchObjectError(f"no {space} object {name} ({self.relpath(space, name)}); it may be in a pack "
                                    f"that could not be read: {unread}")
            exc.unread = unread
            raise exc from None

    def _get_packed(self, space: str, name: str, pack: Pack, loc: object) -> bytes | AgentSessionError:
        """The packed copy's bytes, or the error that says why they cannot be served."""
        try:
            data = self.packs.read(pack, loc)  # type: ignore[arg-type]
        except CorruptPackError as exc:  # (named relative to the store, as the object's own error is)
            return CorruptPackError(store_relative(str(exc), self.root), path=exc.path)
        if HASH_PREFIX + hashlib.sha256(data).hexdigest() != name:
            return CorruptObjectError(
                f"corrupt object: {space} object {name} in {os.path.relpath(pack.path, self.root)} "
                "does not hash to its name",
                space=space,
                name=name,
                path=pack.path,
            )
        return data

    def _get_loose(self, space: str, name: str, path: str) -> bytes:
        try:
            if os.lstat(path).st_size > HASH_FIRST and (
                (space != "blobs" and has_hole(path)) or HASH_PREFIX + hash_file(path)[0].hex() != name
            ):
                # A big file (a sparse one of gigabytes put there) is hashed in chunks and
                # refused before it is held whole; an entry or a content (canonical JSON,
                # never a run of NULs) with a hole is refused before it is read at all.
                raise CorruptObjectError(
                    f"corrupt object: {space} object {name} does not hash to its name ({self.relpath(space, name)})",
                    space=space, name=name, path=path,
                )
            data = read_whole(path)
        except FileNotFoundError:
            raise NoSuchObjectError(f"no {space} object {name} ({self.relpath(space, name)})") from None
        except NotAFileError:
            raise CorruptObjectError(
                f"corrupt object: {space} object {name} is not a regular file ({self.relpath(space, name)})",
                space=space, name=name, path=path,
            ) from None
        if HASH_PREFIX + hashlib.sha256(data).hexdigest() != name:
            raise CorruptObjectError(
                f"corrupt object: {space} object {name} does not hash to its name ({self.relpath(space, name)})",
                space=space,
                name=name,
                path=path,
            )
        return data

    def freshen(self, space: str, name: str, *, touched: set[str] | None = None) -> str | None:
        """Touch the file holding an object (its pack, or its loose file), as a writer does
        before it names an object it did not just write (exchange admitting objects sent
        earlier): a sweep's grace period then counts from now, and a sweep keeps a file
        touched since its snapshot. Returns that file's path, or None when the object is
        not here (any more), which the caller treats as missing. A pack whose path is in
        ``touched`` is not touched again (the caller touched it for another object)."""
        for _ in range(2):
            # Every copy is touched, not the first pack's alone: that copy may be a damaged
            # one a read passes over for a sound one in another pack or a loose file, and a
            # sweep spares only what was touched.
            held: str | None = None
            for pack, _ in self._packed_copies(space, name):
                if (touched is not None and pack.path in touched) or _freshen(pack.path):
                    if touched is not None:
                        touched.add(pack.path)
                    held = held or pack.path
            path = self.path(space, name)
            if os.path.exists(path) and _freshen(path):
                held = held or path
            if held is not None:
                return held
            if not self.packs.refresh():
                break
        return None

    def is_sound(self, space: str, name: str) -> bool:
        """True when the object is present and hashes to its name."""
        try:
            self.get(space, name)
        except (NoSuchObjectError, CorruptObjectError, CorruptPackError):
            return False
        return True

    def _loose_sound(self, space: str, name: str, path: str) -> bool:
        try:
            self._get_loose(space, name, path)
        except (NoSuchObjectError, CorruptObjectError):
            return False
        return True

    def put(self, space: str, name: str, data: bytes, *, durable: bool = True) -> str | None:  # type: ignore[override]
        """Store ``data`` under ``name`` unless a sound copy is there already.

        Returns the path the caller owes an fsync for when ``durable`` is
        False (None when written durably). The caller guarantees ``name`` is
        the hash of ``data``. A new object appears under its own name whole
        (:meth:`_write_new`), and a copy a crash tore is detected by its hash
        and replaced by the next put.
        """
        self.wrote = True
        path = self.path(space, name)
        found = self._packed_sound(space, name)
        if found is not None:
            if _freshen(found[0].path):
                return None  # packs are durable before they are visible
            self.packs.refresh()  # swept or merged away meanwhile: write it again
        try:
            self._write_new(path, data, durable=durable)
        except FileExistsError:
            if self._loose_same(space, name, path, data) and _freshen(path):
                if durable:
                    # Another process may have written it and not yet committed.
                    fsync_paths([path])
                    return None
                return path
            return self._replace(path, data, durable=durable)
        if durable:
            fsync_dir(os.path.dirname(path))
            return None
        return path

    def _loose_same(self, space: str, name: str, path: str, data: bytes) -> bool:
        """The loose file is there, whole and sound (False when it vanished meanwhile)."""
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return False
        return size == len(data) and self._loose_sound(space, name, path)

    def put_many(
        self, items: Iterable[tuple[str, str, bytes]], *, count: int | None = None, dedup: bool = True
    ) -> None:
        """Store many objects durably at once (a checkpoint, an import, a push). A batch
        of :data:`PACK_BATCH` objects or more becomes one pack (two files, two fsyncs),
        streamed from ``items`` when ``count`` says it is that big. A smaller one becomes
        loose files, created and written, then every file (new, or present from another
        writer) and its directory fsynced on the pool. ``dedup=False`` skips looking for
        each object in the packs first, for a pack and for loose files alike (a
        checkpoint's objects are new but for the odd repeat, which the next pack or
        auto-pack drops; looking would open every pack's index, so a close's cost
        would grow with the number of packs). Handed this store's :meth:`stage`, it makes the
        stage's pack visible, then stores the objects the pack does not hold."""
        self.wrote = True
        if isinstance(items, PackStage):
            items.seal()  # an import's pack made durable and visible; what it does not hold follows
            count = len(items)
        if count is not None and count >= PACK_BATCH:
            from ...format.parallel import _cores  # (the one place that counts them)

            self.write_pack(items, dedup=dedup, threads=1 if count >= THREADED_BATCH and _cores() >= 2 else 0)
            return
        items = list(items)
        if len(items) >= PACK_BATCH:
            self.write_pack(items, dedup=dedup)
            return
        paths: list[str] = []
        for space, name, data in items:
            found = self._packed_sound(space, name) if dedup else None
            if found is not None:
                if _freshen(found[0].path):
                    continue  # packs are durable before they are visible
                self.packs.refresh()  # swept or merged away meanwhile: write it loose
            path = self.path(space, name)
            try:
                self._write_new(path, data, durable=False)
            except FileExistsError:
                if not (self._loose_same(space, name, path, data) and _freshen(path)):
                    self._replace(path, data, durable=False)
            paths.append(path)  # a copy another writer made may not be durable yet: ours to make so
        if not paths:
            return
        fsync_paths(paths)

    def held(self, space: Space, name: str) -> bool:
        """Held and sound: a packed copy or a loose one that reads and hashes to its name
        (a torn or corrupt one is reported missing, so a sender sends a sound copy)."""
        if self._packed_sound(space, name) is not None:
            return True
        if not os.path.exists(self.path(space, name)):
            # Packed by another process since we looked?
            self.packs.refresh()  # (looked up again whatever it says: see _get)
            return self._packed_sound(space, name) is not None
        return self.is_sound_here(space, name)

    def held_many(self, space: Space, names: Sequence[str]) -> list[bool]:
        """:meth:`held` of each name, in order, with the pack list looked at again once for
        all the names found nowhere (not once each) and, for many names, the loose files
        listed once (:data:`LIST_LOOSE`) rather than looked for one at a time."""
        loose = set(self.loose_names(space)) if len(names) >= LIST_LOOSE else None
        listed = self.packs.packs  # (the listing the lookups below see; a relisting makes another list)
        out: list[bool] = []
        absent: list[int] = []
        for i, name in enumerate(names):
            if self._packed_sound(space, name) is not None:
                out.append(True)
            elif name not in loose if loose is not None else not os.path.exists(self.path(space, name)):
                out.append(False)
                absent.append(i)
            else:
                out.append(self.is_sound_here(space, name))
        if absent:  # packed by another process since we looked? (whatever refresh says: see _get)
            self.packs.refresh()
        if absent and self.packs.packs is not listed:
            for i in absent:
                out[i] = self._packed_sound(space, names[i]) is not None
        return out

    def hold(self, names: Iterable[tuple[Space, str]], *, written: set[str] = frozenset()) -> list[tuple[Space, str]]:  # type: ignore[assignment]
        """Just before a log record names them: touch every file holding one of the
        objects, so a sweep running now spares it (a sweep keeps a file touched since
        its snapshot, and one it moved aside first is found gone here: reported
        missing); and make durable the loose objects not in ``written``, which another
        process may have written and not yet synced (RFC 0002's commit covers "one
        already present"). Packs are durable before they are visible."""
        touched: set[str] = set()
        sync: list[str] = []
        missing: list[tuple[Space, str]] = []
        for space, name in names:
            path = self.freshen(space, name, touched=touched)
            if path is None:
                missing.append((space, name))
            elif name not in written and path == self.path(space, name):
                sync.append(path)  # loose, and not written by the caller
        if sync:
            fsync_paths(sync)
        return missing

    def read_order(self, names: Iterable[str]) -> list[str]:
        """``names`` in the order their bytes lie (pack, block, offset; loose ones last),
        so reading them all decompresses each block once, not once per object."""
        packs = self.packs
        rank = {p.name: i for i, p in enumerate(packs.packs)}

        def where(name: str) -> tuple[Any, ...]:
            found = packs.locate(name)
            if found is None:
                return (len(rank), 0, 0, name)
            pack, loc = found
            return (rank.get(pack.name, len(rank)), loc.block, loc.offset, name)

        return sorted(names, key=where)

    def where(self, space: Space, name: str) -> str:
        found = self._packed(space, name)
        if found is not None:
            return os.path.relpath(found[0].path, self.root)
        return self.relpath(space, name)

    def entry_sound(self, entry_id: object) -> bool:
        """An entry's envelope and its content are both here and sound (what recovery
        asks of an uncommitted append)."""
        if not isinstance(entry_id, str) or not is_hash(entry_id):
            return False
        try:
            env = self._get("entries", entry_id)
            chash = envelope_content(env)
            return chash is not None and self.is_sound_here("contents", chash)
        except (NoSuchObjectError, CorruptObjectError, CorruptPackError):
            return False

    def is_sound_here(self, space: str, name: str) -> bool:
        """Sound in objects/ itself (not merely held by a log open in this process)."""
        try:
            self._get(space, name)
        except (NoSuchObjectError, CorruptObjectError, CorruptPackError):
            return False
        return True

    def secure_prefix(self, prefix: Iterable[tuple[str, str]]) -> None:
        """A new fork's prefix (entry id, content hash), root to base: make each object
        durable here (one may so far be held only in a log open in this process) and
        touch the files holding them, so a sweep that read the logs before the fork's
        log named its base keeps them. One gone refuses the fork."""
        touched: set[str] = set()
        for eid, chash in prefix:
            for space, name in (("entries", eid), ("contents", chash)):
                if not self.exists(space, name):
                    try:
                        data = self.get(space, name)  # held by a log open here
                    except NoSuchObjectError:
                        data = None
                    if data is not None:
                        self.put(space, name, data, durable=True)
                if self.freshen(space, name, touched=touched) is None:
                    raise StoreError(
                        f"prefix entry {eid[7:19]} of the fork's base was swept while the fork was "
                        "being made; nothing was created (the base's session was deleted meanwhile?)"
                    )

    def make_fanout(self) -> None:
        """Create every ``<2 hex>`` directory of every space, once, and fsync them into
        place: later objects then never pay for a new directory."""
        for space in SPACES:
            base = os.path.join(self.dir, space)
            os.makedirs(base, exist_ok=True)
            for i in range(256):
                os.makedirs(os.path.join(base, f"{i:02x}"), exist_ok=True)
            fsync_dir(base)

    def _write_new(self, path: str, data: bytes, *, durable: bool) -> None:
        """Create a loose object whole or not at all; ``FileExistsError`` when its name is
        taken. The bytes go to a file in ``tmp/`` (fsynced when ``durable``), which is then
        hard-linked under the object's name: the link, like ``O_EXCL``, fails on a name
        that exists, and no reader in another process ever meets a half-written object
        (a checkpoint writes objects that readers can already name: the log carries
        them). A filesystem without hard links gets the file created in place, ``O_EXCL``."""
        tmp = os.path.join(self.tmp, f".obj-{os.getpid()}-{_TMP_TOKEN}-{next(_TMP_COUNT)}")
        try:
            try:
                write_new_file(tmp, data, durable=durable)
            except FileNotFoundError:  # no tmp/ yet
                os.makedirs(self.tmp, exist_ok=True)
                write_new_file(tmp, data, durable=durable)
            try:
                self._in_fanout(path, lambda: os.link(tmp, path))
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise  # FileExistsError among them: the name is taken
                self._write_in_place(path, data, durable=durable)
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    def _write_in_place(self, path: str, data: bytes, *, durable: bool) -> None:
        try:
            self._in_fanout(path, lambda: write_new_file(path, data, durable=durable))
        except FileExistsError:
            raise  # someone else's copy: left as it is
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # no partial object under its name
            raise

    @staticmethod
    def _in_fanout(path: str, make: Callable[[], _T]) -> _T:
        """``make()`` of a name in its fan-out directory, which is created (and made
        durable in its space directory) first when it is missing."""
        try:
            return make()
        except FileNotFoundError:
            directory = os.path.dirname(path)
            os.makedirs(directory, exist_ok=True)
            # The new fan-out directory's own name lives in the space directory.
            fsync_dir(os.path.dirname(directory))
            return make()

    def _replace(self, path: str, data: bytes, *, durable: bool) -> str | None:
        """Replace a torn or corrupt copy: a temp file in tmp/ renamed over it."""
        os.makedirs(self.tmp, exist_ok=True)
        write_atomic(path, data, durable=durable, tmp_dir=self.tmp)
        return None if durable else path

    def names(self, space: str) -> Iterator[str]:
        """Every object name in a space, loose or packed, each once."""
        seen: set[str] = set()
        bit = SPACE_BITS[space]
        self.packs.refresh()
        for pack in self.packs.packs:
            for name, loc in pack:
                if loc.spaces & bit and name not in seen:
                    seen.add(name)
                    yield name
        for name in self.loose_names(space):
            if name not in seen:
                yield name

    def names_starting(self, digits: str) -> set[str]:
        """(See the base class.) Each pack's index searched by its fan-out table and sorted
        names, and the one loose fan-out directory of each space the digits fall in."""
        out: set[str] = set()
        known = 0
        for space in SPACES:
            known |= SPACE_BITS[space]
        self.packs.refresh()
        for pack in self.packs.packs:
            out.update(name for name, spaces in pack.starting_with(digits) if spaces & known)
        for space in SPACES:
            try:
                rests = os.listdir(os.path.join(self.dir, space, digits[:2]))
            except (FileNotFoundError, NotADirectoryError):
                continue
            names = (HASH_PREFIX + digits[:2] + rest for rest in rests if rest.startswith(digits[2:]))
            out.update(name for name in names if is_hash(name))
        return out

    def scan(self, spaces: Sequence[Space]) -> Iterator[tuple[Space, str, bytes]]:
        """Every object of the spaces with its bytes, unverified (see the base class): each
        pack block holding one is decompressed once, in the order blocks lie, and a
        block holding none is not read; then the loose ones. A pack or block that does
        not read is left out (fsck names it; a caller reading through ``get`` meets it)."""
        bits = [(space, SPACE_BITS[space]) for space in spaces]
        mask = 0
        for _, bit in bits:
            mask |= bit
        self.packs.refresh()
        for pack in list(self.packs.packs):
            by_block: dict[int, list[tuple[int, int, bytes, int]]] = {}
            try:
                for raw, (block, offset, length, held) in pack.records():
                    if held & mask:
                        by_block.setdefault(block, []).append((offset, length, raw, held))
            except (CorruptPackError, struct.error):
                continue
            for number in sorted(by_block):
                try:
                    block_data = pack.read_block(number)
                except (CorruptPackError, OSError):
                    continue
                for offset, length, raw, held in by_block[number]:
                    try:
                        data = block_data.object(offset, length)
                    except CorruptPackError:
                        continue
                    name = HASH_PREFIX + raw.hex()
                    for space, bit in bits:
                        if held & bit:
                            yield space, name, data
        for space, _ in bits:
            for name in self.loose_names(space):
                try:
                    yield space, name, self._get_loose(space, name, self.path(space, name))
                except (AgentSessionError, OSError):
                    continue

    def read_all(self, spaces: Sequence[Space]) -> Iterator[tuple[Space, str, bytes | Exception]]:
        """Every object of the spaces, each once, verified (see the base class): each pack
        block holding one decompressed once, in the order blocks lie, and its objects
        hashed in place, with no lookup by name. An object whose packed copy does not
        read or hash (unless another pack's does), and every loose one, is read by
        :meth:`get`, which takes a sound copy where there is one and else raises the
        error that names the fault."""
        bits = [(space, SPACE_BITS[space]) for space in spaces]
        mask = 0
        for _, bit in bits:
            mask |= bit
        done: dict[str, set[bytes]] = {space: set() for space in spaces}
        later: dict[str, list[bytes]] = {space: [] for space in spaces}
        sha256 = hashlib.sha256
        self.packs.refresh()
        for pack in list(self.packs.packs):
            by_block: dict[int, list[tuple[int, int, bytes, int]]] = {}
            for raw, (number, slot, length, held) in pack.records():
                if held & mask:
                    by_block.setdefault(number, []).append((slot, length, raw, held))
            for number in sorted(by_block):
                try:
                    block: Any = pack.read_block(number)
                except (CorruptPackError, OSError):
                    block = None
                for slot, length, raw, held in by_block[number]:
                    data: bytes | None = None
                    if block is not None:
                        with contextlib.suppress(CorruptPackError):
                            data = block.object(slot, length)
                    sound = data is not None and sha256(data).digest() == raw
                    for space, bit in bits:
                        if not held & bit:
                            continue
                        if not sound:
                            later[space].append(raw)
                        elif raw not in done[space]:
                            done[space].add(raw)
                            yield space, HASH_PREFIX + raw.hex(), data  # type: ignore[misc]  # sound: bytes
        for space, _ in bits:
            seen = done[space]
            rest = [HASH_PREFIX + raw.hex() for raw in later[space] if raw not in seen]
            rest.extend(name for name in self.loose_names(space) if bytes.fromhex(name[7:]) not in seen)
            for name in self.read_order(dict.fromkeys(rest)):
                try:
                    yield space, name, self.get(space, name)
                except (AgentSessionError, OSError) as exc:
                    yield space, name, exc

    def loose_names(self, space: str) -> Iterator[str]:
        """Every loose object name in a space (for packing, fsck and sweeps)."""
        base = os.path.join(self.dir, space)
        try:
            fans = sorted(os.listdir(base))
        except FileNotFoundError:
            return
        for fan in fans:
            if len(fan) != 2:
                continue
            try:
                rests = sorted(os.listdir(os.path.join(base, fan)))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for rest in rests:
                name = HASH_PREFIX + fan + rest
                if is_hash(name):
                    yield name

    # -- packing ------------------------------------------------------------------

    def _pack_lock(self) -> FileLock:
        """The store-wide lock of whatever removes packs or loose copies (merges,
        ``pack``, sweeps); writing a new pack needs none."""
        return FileLock(os.path.join(self.root, PACK_LOCK))

    def write_pack(
        self, items: Iterable[tuple[str, str, bytes]], *, level: int = 3, merge: bool = True, dedup: bool = True,
        threads: int = 0,
    ) -> str | None:
        """Write the objects not already packed as one new pack, durably, then merge
        small packs if that is cheap. Objects too big to pack are written loose.
        Returns the new index's path (None when there was nothing to write).
        ``threads``: the pack writer's (blocks compressed beside the caller)."""
        self.wrote = True
        writer = PackWriter(self.pack_dir, self.tmp, level=level, threads=threads)
        big: list[tuple[str, str, bytes]] = []
        try:
            fresh: dict[str, bool] = {}  # pack path -> freshened (False: gone meanwhile)
            source = iter(items)
            # A chunk at a time, handed to the writer at once (PackWriter.add_many): a
            # checkpoint's pack, written beside appends, so takes a few steps an object.
            while chunk := list(itertools.islice(source, _ADD_CHUNK)):
                _check_names(chunk)
                kept = chunk
                if dedup or max([len(data) for _, _, data in chunk]) > MAX_PACKED:
                    kept = []
                    for space, name, data in chunk:
                        if len(data) > MAX_PACKED:
                            big.append((space, name, data))
                            continue
                        if dedup and self._held_packed(space, name, fresh):
                            continue  # (one swept away meanwhile is written again here)
                        kept.append((space, name, data))
                if kept:
                    writer.add_many([name for _, name, _ in kept], bytes([SPACE_BITS[space] for space, _, _ in kept]),
                                    [data for _, _, data in kept])
            if not len(writer):
                writer.abort()
                idx = None
            else:
                idx = writer.finish()
        except BaseException:
            writer.abort()
            raise
        for space, name, data in big:
            self.put(space, name, data, durable=True)
        if idx is not None:
            self._published(merge=merge)
        return idx

    def _published(self, *, merge: bool) -> None:
        """A new pack is in place: seen by this store's reads, and small packs merged."""
        self.packs.refresh(force=True)
        if merge:
            # Only the smallest tier here: a writer pays for merges of a few MiB at
            # most; bigger ones wait for a writer's close or for ``pack``.
            self.merge_small_packs(max_tier=0)

    def stage(self) -> PackStage:
        """An import's objects, written into a new pack as its pass accepts them
        (:class:`PackStage`)."""
        return PackStage(self)

    def merge_small_packs(self, *, max_bytes: int = AUTO_MERGE_MAX, max_tier: int | None = None) -> bool:
        """Merge packs by size tier, as a log-structured merge does: packs fall in
        tiers by compressed size (under 1 MiB, 8 MiB, 64 MiB, ...); when a tier
        holds :data:`MERGE_FANIN` packs they become one pack of the next tier. A
        store written by many checkpoints so keeps O(log n) packs and copies each
        byte O(log n) times. Blocks are copied as they are, not recompressed.
        Returns False (merging nothing) when another process is packing; merges
        that would copy more than ``max_bytes``, or merge packs above tier
        ``max_tier``, are left to ``pack``."""
        lock = self._pack_lock()
        try:
            lock.acquire(timeout=0)
        except LockTimeout:
            return False
        merged = False
        try:
            self._undo_interrupted_drops()
            while True:
                self.packs.refresh(force=True)
                tiers: dict[int, list[tuple[int, Pack]]] = {}
                for p in self.packs.packs:
                    if p.name in self._unmergeable:
                        continue
                    size = os.fstat(p._pack_fd()).st_size
                    tier, limit = 0, TIER_BASE
                    while size >= limit:
                        tier, limit = tier + 1, limit * MERGE_FANIN
                    tiers.setdefault(tier, []).append((size, p))
                full = [
                    t for t in sorted(tiers)
                    if len(tiers[t]) >= MERGE_FANIN and (max_tier is None or t <= max_tier)
                ]
                if not full:
                    return merged
                group = tiers[full[0]]
                if sum(size for size, _ in group) > max_bytes:
                    return merged
                packs = [p for _, p in sorted(group, key=lambda sp: sp[0], reverse=True)]
                try:
                    self._copy_packs(packs)
                except CorruptPackError as exc:
                    # A pack that does not read whole (a damaged block of the first
                    # format, which a merge must decompress) stays as it is: its sound
                    # blocks still serve reads, fsck names it, `pack` rewrites what reads.
                    bad = {p.name for p in packs if getattr(exc, "path", None) in (p.path, p.idx_path)}
                    self._unmergeable |= bad or {p.name for p in packs}
                    continue
                merged = True
        finally:
            lock.release()

    def _copy_packs(self, packs: list[Pack]) -> str:
        """One pack holding every block of ``packs``, then the old ones removed
        (their index first, so no reader finds a pack without its index)."""
        writer = PackWriter(self.pack_dir, self.tmp)
        try:
            for pack in packs:
                writer.copy_pack(pack)
            idx = writer.finish()
        except BaseException:
            writer.abort()
            raise
        new_name = os.path.basename(idx)[: -len(".idx")]
        for pack in packs:
            if pack.name != new_name:
                self._remove_pack(pack)
        fsync_dir(self.pack_dir)
        self.packs.refresh(force=True)
        return idx

    def _remove_pack(self, pack: Pack) -> None:
        for path in (pack.idx_path, pack.path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def estimate_loose(self) -> int:
        """About how many loose objects there are, from one fan-out directory per
        space (git's ``gc --auto`` counts objects/17 the same way)."""
        total = 0
        for space in ("entries", "contents"):
            try:
                total += len(os.listdir(os.path.join(self.dir, space, "17")))
            except FileNotFoundError:
                pass
        return total * 256

    def pack_loose(self, *, level: int = 3) -> tuple[int, str | None]:
        """Move every loose object (of a size worth packing) into one new pack; the
        loose copies are removed only once the pack is durable. Returns the count
        moved and the new index path; (0, None) without waiting when another
        process holds the pack lock (a sweep or ``pack`` can take long, and this
        runs when a writer closes: it packs next time)."""
        lock = self._pack_lock()
        try:
            lock.acquire(timeout=0)
        except LockTimeout:
            return 0, None
        try:
            self._undo_interrupted_drops()
            moved: list[tuple[str, str]] = []  # into the new pack
            held: list[tuple[str, str]] = []  # a sound copy in a pack already (freshened)
            fresh: dict[str, bool] = {}

            def loose() -> Iterator[tuple[str, str, bytes]]:
                for space in SPACES:
                    for name in self.loose_names(space):
                        path = self.path(space, name)
                        try:
                            data = self._get_loose(space, name, path)
                        except (NoSuchObjectError, CorruptObjectError):
                            continue  # gone meanwhile, or corrupt: fsck reports it, we do not pack it
                        if len(data) > MAX_PACKED:
                            continue
                        if self._held_packed(space, name, fresh):
                            held.append((space, name))
                            continue
                        moved.append((space, name))
                        yield space, name, data

            idx = self.write_pack(loose(), level=level, merge=False, dedup=False)
            # A loose copy goes only where a sound copy is durable: in the pack just
            # written (its own index says so), or in a pack whose copy was read sound
            # above. A pack merely naming the object (its copy damaged) is no copy.
            new = Pack(idx) if idx is not None else None
            try:
                gone = held + [(space, name) for space, name in moved
                               if new is not None and (loc := new.find(name)) is not None and loc.spaces & SPACE_BITS[space]]
            finally:
                if new is not None:
                    new.close()
            for space, name in gone:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(space, name))
            self.packs.refresh(force=True)
        finally:
            lock.release()
        return len(moved) + len(held), idx

    # -- repacking ------------------------------------------------------------------

    def repack(
        self,
        *,
        keep: Callable[[str, int, float], bool] | None = None,
        dry_run: bool = False,
        level: int = REPACK_LEVEL,
        block_target: int = REPACK_BLOCK,
        wait: float = 60.0,
        progress: Callable[[int, int], None] | None = None,
    ) -> RepackResult:
        """Rewrite every pack and loose object into one new pack, recompressed, each
        object verified against its name on the way; then remove what it replaced.

        ``keep(name, spaces, mtime)`` decides, for a sweep, which objects stay
        (``mtime`` is that of the file holding the object: its pack, or the loose
        file); objects it rejects are dropped. Objects that fail their hash, and
        packs that cannot be read whole, are reported and left where they are (a
        pack holding one is not removed), never copied. ``dry_run`` reads and
        decides but writes and removes nothing. Objects too big to pack stay loose
        (and are removed when ``keep`` rejects them).
        """
        with self.exclusive(wait):
            lost = self.index_lost(dry_run)
            return lost.joined(self._repack(keep, dry_run, level=level, block_target=block_target, progress=progress))

    def index_lost(self, dry_run: bool) -> RepackResult:
        """Under the pack lock: write again the index of every pack that has none (lost to
        a person or a disk, or a writer's crash between its two renames), from the pack
        itself (:func:`index_pack`), so the pack's objects are found and repacked; a
        dry run only says which. A pack that does not read whole is left as it is and
        named: no index is written to vouch for it."""
        out = RepackResult(dry_run=dry_run)
        try:
            names = set(os.listdir(self.pack_dir))
        except FileNotFoundError:
            return out
        for n in sorted(names):
            if not (n.startswith("pack-") and n.endswith(".pack")) or n[: -len(".pack")] + ".idx" in names:
                continue
            path = os.path.join(self.pack_dir, n)
            rel = os.path.relpath(path, self.root)
            if dry_run:
                out.note("pack-without-index", f"{rel} has no index; a pack or sweep writes it again from the pack", file=rel)
                continue
            try:
                count = index_pack(path, self.tmp)
            except FileNotFoundError:
                continue  # removed since the listing
            except CorruptPackError as exc:
                out.problems.append(self._problem(
                    "bad-pack", f"{exc}; it has no index, and none is written for a pack that does not read whole: "
                    "left in place (fsck names what only it holds)", path))
                continue
            out.note("index-rebuilt", f"{rel[: -len('.pack')]}.idx was missing: the index was rebuilt from its pack "
                     f"({count:,} objects)", file=f"{rel[: -len('.pack')]}.idx")
        if out.notes and not dry_run:
            self.packs.refresh(force=True)
        return out

    @contextmanager
    def exclusive(self, wait: float) -> Iterator[None]:
        """Hold the store's pack lock for a whole repack or sweep, waiting up to
        ``wait`` seconds for another to finish, else a clear error."""
        lock = self._pack_lock()
        try:
            lock.acquire(timeout=wait)
        except LockTimeout:
            raise StoreError(
                f"another process is packing or sweeping this store (it holds {os.path.join(self.root, PACK_LOCK)})"
            ) from None
        try:
            self._undo_interrupted_drops()
            yield
        finally:
            lock.release()

    def stored_bytes(self) -> dict[str, int]:
        """Loose files and packs (with their indexes) on disk."""
        snap = self.snapshot()
        loose = sum(st.st_size for *_, st in snap.loose)
        return {"loose": loose, "packs": snap.size() - loose}

    def snapshot(self) -> Snapshot:
        """The packs and loose files there are now, with their mtimes: what a repack
        or sweep decides over (anything written later is not touched)."""
        self.packs.refresh(force=True)
        packs = []
        for p in self.packs.packs:
            try:
                packs.append((p, os.stat(p.path).st_mtime_ns))
            except FileNotFoundError:
                continue
        packs.sort(key=lambda pm: (pm[1], pm[0].name))
        loose: list[tuple[str, str, str, os.stat_result]] = []
        for space in SPACES:
            for name in self.loose_names(space):
                path = self.path(space, name)
                try:
                    loose.append((space, name, path, os.stat(path)))
                except FileNotFoundError:
                    continue
        return Snapshot(packs, loose, dict(self.packs.bad))

    def _repack(
        self,
        keep,
        dry_run: bool,
        *,
        snapshot: Snapshot | None = None,
        level: int = REPACK_LEVEL,
        block_target: int = REPACK_BLOCK,
        progress=None,
    ) -> RepackResult:
        """The repack itself; the caller holds the pack lock."""
        snap = snapshot or self.snapshot()
        res = RepackResult(dry_run=dry_run)
        packs = [p for p, _ in snap.packs]
        loose = snap.loose
        res.bad_packs = {key: store_relative(why, self.root) for key, why in snap.bad.items()}
        res.packs_before = len(packs)
        res.loose_before = len(loose)
        res.bytes_before = sum(os.stat(p.path).st_size + os.stat(p.idx_path).st_size for p in packs) + sum(
            st.st_size for *_, st in loose
        )
        total = sum(p.count for p in packs) + len(loose)
        done = 0
        writer = None if dry_run else PackWriter(
            self.pack_dir, self.tmp, level=level, block_target=block_target, encode=True, threads=REPACK_THREADS
        )
        kept: set[bytes] = set()
        dropped: dict[bytes, int] = {}
        keep_packs: list[Pack] = []  # packs not to remove: they hold what could not be read
        unsound: list[Pack] = []  # packs failing their checksum whose every object read whole
        torn: list[tuple[str, str, str]] = []  # loose objects that did not hash when read
        sha256 = hashlib.sha256
        try:
            for pack in packs:
                mtime = os.fstat(pack._pack_fd()).st_mtime
                try:
                    blocks = pack.objects_by_block()
                except CorruptPackError as exc:
                    res.problems.append(self._problem("bad-pack-index", str(exc), exc.path))
                    keep_packs.append(pack)
                    continue
                intact = True
                for b, objs in enumerate(blocks):
                    if not objs:
                        continue
                    try:
                        block = pack.read_block(b)
                    except CorruptPackError as exc:
                        res.problems.append(self._problem("bad-block", f"{exc}; its objects not copied", pack.path, block=b))
                        intact = False
                        continue
                    for offset, length, raw, spaces in objs:
                        try:
                            data = block.object(offset, length)
                        except CorruptPackError as exc:
                            res.problems.append(self._problem(
                                "corrupt-object", f"{exc}; not copied", pack.path, block=b, raw=raw, spaces=spaces))
                            intact = False
                            continue
                        if sha256(data).digest() != raw:
                            res.problems.append(self._problem(
                                "corrupt-object", f"{_space_of(spaces)} object {HASH_PREFIX}{raw.hex()} in "
                                f"{os.path.relpath(pack.path, self.root)} (block {b}) does not hash to its name; not copied",
                                pack.path, block=b, raw=raw, spaces=spaces))
                            intact = False
                            continue
                        self._repack_one(writer, keep, raw, spaces, data, mtime, kept, dropped, res)
                    done += len(objs)
                    if progress:
                        progress(done, total)
                if not intact:
                    keep_packs.append(pack)
                    continue
                try:  # (its bytes are in the page cache: they were just read)
                    pack.check_pack_checksum()
                except CorruptPackError as exc:
                    # Damage outside its objects' blocks: nothing is lost, it goes as a sound
                    # pack would (its objects are in the new one), but not silently.
                    unsound.append(pack)
                    res.note("bad-pack", f"{store_relative(str(exc), self.root)}, but every object in it read whole: "
                             + ("they would be copied and it replaced" if dry_run else "they are in the new pack, which replaces it"),
                             file=os.path.relpath(pack.path, self.root))
            # A pack whose index does not open: its objects are read from the pack itself
            # (the index rebuilt, in effect, into the new pack).
            salvaged: list[tuple[str, bool]] = []
            for key in sorted(snap.bad):
                path = os.path.join(self.pack_dir, key + ".pack")
                if not os.path.lexists(path):
                    continue
                found: list[str] = []
                mtime = os.lstat(path).st_mtime
                for raw, spaces, data in salvage_pack(path, found):
                    self._repack_one(writer, keep, raw, spaces, data, mtime, kept, dropped, res)
                whole = not found and pack_file_sound(path)
                res.problems.extend(self._problem("bad-pack", why, path) for why in found)
                if not dry_run:
                    res.note("index-rebuilt", f"objects/pack/{key}.idx was damaged: the objects of its pack were read "
                             "without it" + ("" if whole else " (not all of them: the pack is damaged too)"),
                             file=f"objects/pack/{key}.idx")
                salvaged.append((key, whole))
            loose_done: list[tuple[str, int]] = []
            for space, name, path, st in loose:
                raw = bytes.fromhex(name[7:])
                spaces = SPACE_BITS[space]
                if st.st_size > MAX_PACKED:
                    if keep is not None and raw not in kept and not keep(name, spaces, st.st_mtime):
                        dropped[raw] = dropped.get(raw, 0) + st.st_size
                        loose_done.append((path, st.st_mtime_ns))
                    continue
                try:
                    data = self._get_loose(space, name, path)
                except NoSuchObjectError:
                    continue
                except CorruptObjectError:
                    torn.append((space, name, path))  # judged at the end of the pass
                    continue
                self._repack_one(writer, keep, raw, spaces, data, st.st_mtime, kept, dropped, res)
                loose_done.append((path, st.st_mtime_ns))
                done += 1
                if progress:
                    progress(done, total)
            # A corrupt copy of an object another copy gave whole (a loose one, another pack's)
            # lost nothing: it is still said, as a note, and fails nothing.
            for p in [p for p in res.problems if p.code == "corrupt-object" and p.object and is_hash(p.object)
                      and bytes.fromhex(p.object[len(HASH_PREFIX):]) in kept]:
                res.problems.remove(p)
                res.notes.append(dataclasses.replace(p, severity="note", message=f"{p.message}; a sound copy was packed"))
            res.objects = len(kept)
            res.dropped = len(dropped)
            res.dropped_bytes = sum(dropped.values())
            res.dropped_names = sorted(HASH_PREFIX + raw.hex() for raw in dropped)
            if dry_run:
                self._judge_torn(torn, res)
                return res
            assert writer is not None
            if keep is not None and not dropped and not res.problems and len(packs) == 1 and not loose and not keep_packs \
                    and not unsound:
                # A sweep over one sound pack that drops nothing: rewriting it changes nothing.
                writer.abort()
                writer = None
                res.pack = packs[0].name
                res.packs_after, res.bytes_after = 1, res.bytes_before
                return res
            if len(writer):
                idx = writer.finish()
                res.pack = os.path.basename(idx)[: -len(".idx")]
            else:
                writer.abort()
            writer = None
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        self._judge_torn(torn, res)
        # The new pack is durable; only now does anything go, and nothing a writer
        # freshened since the snapshot (it is writing an object that file holds).
        os.makedirs(self.tmp, exist_ok=True)
        for pack, mtime in snap.packs:
            if pack in keep_packs or pack.name == res.pack:
                continue
            if not self._remove_untouched(pack.path, mtime, index=pack.idx_path):
                rel = os.path.relpath(pack.path, self.root)
                res.note("kept-touched", f"{rel} was touched by a writer meanwhile; kept", file=rel)
        for key, whole in salvaged:
            res.bad_packs.pop(key, None)  # read without its index: removed or set aside below, not left in place
            if key == res.pack:
                continue  # the new pack is these very bytes, renamed over it with a sound index
            if whole:  # every object it held is in the new pack: the bad index and its pack go
                for ext in (".idx", ".pack"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.pack_dir, key + ext))
            else:
                self._set_aside(key, res)
        for pack in keep_packs:
            if pack.name != res.pack:
                self._set_aside(pack.name, res)
        for path, mtime in loose_done:
            self._remove_untouched(path, mtime)
        fsync_dir(self.pack_dir) if os.path.isdir(self.pack_dir) else None
        for space in SPACES:
            base = os.path.join(self.dir, space)
            if os.path.isdir(base):
                fsync_dir(base)
        self.packs.refresh(force=True)
        res.bytes_after = sum(os.stat(p.path).st_size + os.stat(p.idx_path).st_size for p in self.packs.packs) + sum(
            os.stat(self.path(sp, n)).st_size for sp in SPACES for n in self.loose_names(sp)
        )
        res.packs_after = len(self.packs.packs)
        return res

    def _judge_torn(self, torn: list[tuple[str, str, str]], res: RepackResult) -> None:
        """Read once more, at the end of the pass, each loose object that did not hash
        when the pass read it. On a filesystem without hard links a writer creates a new
        object under its own name and writes it in place (:meth:`_write_new`), so one
        read half written while the pack was made is whole by now: it stays loose, for
        the next pack. One still torn is
        damage (or a crash's leftover, which the next put of it replaces): left in
        place and reported, as fsck reports it."""
        for space, name, path in torn:
            try:
                self._get_loose(space, name, path)
            except NoSuchObjectError:
                continue  # swept or replaced meanwhile
            except CorruptObjectError:
                res.problems.append(self._problem(
                    "corrupt-object", f"{space} object {name} does not hash to its name ({os.path.relpath(path, self.root)}); "
                    "left in place", path, raw=bytes.fromhex(name[7:]), spaces=SPACE_BITS[space]))
                continue
            res.note("being-written", f"{space} object {name} was being written while the pack was made; left loose for "
                     "the next pack", object=name, space=space, file=os.path.relpath(path, self.root))

    def _problem(self, code: str, message: str, path: str, *, block: int | None = None,
                 raw: bytes | None = None, spaces: int = 0) -> FsckProblem:
        """A repack's finding, in fsck's shape and codes: the file relative to the store
        (in the message too), and the object and block where one is known."""
        rel = os.path.relpath(path, self.root)
        return FsckProblem("error", code, message.replace(path, rel), file=rel, block=block,
                           object=None if raw is None else HASH_PREFIX + raw.hex(), space=_space_of(spaces))

    def _set_aside(self, key: str, res: RepackResult) -> None:
        """Move a damaged pack and its index out of the readers' sight (renamed
        ``.damaged-<UTC time>``, kept for an operator to read), once what of them reads
        is durable in the new pack: a damaged pack kept in place is an fsck error no
        command clears. Its objects no copy holds show as missing, for ``repair``."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for ext in (".idx", ".pack"):  # the index first: the pack is then invisible
            path = os.path.join(self.pack_dir, key + ext)
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, f"{path}.damaged-{stamp}")
        fsync_dir(self.pack_dir)
        res.note("damaged-pack-kept", f"objects/pack/{key}.pack is damaged: what of it read was copied; it is set aside as "
                 f".damaged-{stamp}", file=f"objects/pack/{key}.pack.damaged-{stamp}")

    def _remove_untouched(self, path: str, mtime_ns: int, *, index: str | None = None) -> bool:
        """Remove a file a repack or sweep decided over unless a writer touched it since
        (its mtime moved); False when it was kept.

        The file is first moved aside into ``tmp/`` and its mtime read there: a
        writer that touches it before the move is seen (the file is put back), and
        one that comes after finds it gone and writes its object again. Comparing
        in place and then unlinking would lose an object a writer touched between
        the two. ``index`` (a pack's) is removed once the pack is known untouched."""
        # (a loose object's drop name says its space and whole name: see DROPPED_LOOSE)
        where = os.path.relpath(path, self.dir).split(os.sep)
        own = f"{where[0]}-{where[1]}{where[2]}" if len(where) == 3 and where[0] in SPACES else os.path.basename(path)
        aside = os.path.join(self.tmp, f"drop-{os.getpid()}-{os.urandom(6).hex()}-{own}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return True
        try:
            touched = os.stat(aside).st_mtime_ns != mtime_ns
        except BaseException:
            _put_back(aside, path)  # interrupted (Ctrl-C, SIGTERM) before it was decided: rolled back
            raise
        if touched:
            _put_back(aside, path)
            return False
        if index is not None:
            try:
                os.unlink(index)
            except FileNotFoundError:
                pass
        os.unlink(aside)
        return True

    def _undo_interrupted_drops(self) -> None:
        """Put back a pack that a repack or sweep killed mid-drop left in ``tmp/`` (under
        the pack lock, which every dropper holds, so none is in flight). A pack is moved
        aside before its index is removed (:meth:`_remove_untouched`: the move is what
        tells a writer's touch), so a crash between the two left an index whose pack is
        missing, an fsck error that no command cleared. The drop is rolled back, not
        finished: the crash may have come before the pack was found untouched, and a
        pack put back is at worst copies of what the new pack holds, dropped again by
        the next repack."""
        try:
            names = os.listdir(self.tmp)
        except FileNotFoundError:
            return
        moved = False
        for name in names:
            m = DROPPED_LOOSE.fullmatch(name)
            if m is not None:
                # A loose object moved aside (a kill before its mtime was compared, or
                # before it was removed): back under its name, unless a writer wrote it again.
                aside, target = os.path.join(self.tmp, name), self.path(m.group(1), HASH_PREFIX + m.group(2))
                try:
                    self._in_fanout(target, partial(_put_back, aside, target))
                except OSError:
                    pass  # left for the next one (fsck notes it): no reason to stop this pack or merge
                continue
            m = DROPPED_PACK.fullmatch(name)
            if m is None:
                continue
            key = m.group(1)
            pack, index = os.path.join(self.pack_dir, key + ".pack"), os.path.join(self.pack_dir, key + ".idx")
            if os.path.exists(index) and not os.path.exists(pack):
                os.rename(os.path.join(self.tmp, name), pack)
                moved = True
        if moved:
            fsync_dir(self.pack_dir)
            self.packs.refresh(force=True)

    @staticmethod
    def _repack_one(writer, keep, raw, spaces, data, mtime, kept, dropped, res) -> None:
        if raw in kept:
            if writer is not None:
                writer.add_raw(raw, spaces, data)  # merges the space bits
            return
        if keep is not None and not keep(HASH_PREFIX + raw.hex(), spaces, mtime):
            dropped.setdefault(raw, len(data))
            return
        dropped.pop(raw, None)  # a second copy that is kept (a younger one) wins
        kept.add(raw)
        if writer is not None:
            writer.add_raw(raw, spaces, data)


#: A pack a drop moved aside (:meth:`FileObjects._remove_untouched`): ``drop-<pid>-<12 hex>-<pack>.pack``.
DROPPED_PACK = re.compile(r"drop-[0-9]+-[0-9a-f]{12}-(pack-[0-9a-f]{64})\.pack")
#: A loose object a drop moved aside: ``drop-<pid>-<12 hex>-<space>-<64 hex of its name>``.
DROPPED_LOOSE = re.compile(r"drop-[0-9]+-[0-9a-f]{12}-(entries|contents|blobs)-([0-9a-f]{64})")


def _put_back(aside: str, path: str) -> None:
    """Undo a drop's move: the file back under its name (left as it is when a writer
    wrote a new copy there meanwhile), and made durable there. On a filesystem without
    hard links, by a rename (over a copy a writer made meanwhile at worst: the same bytes)."""
    try:
        os.link(aside, path)
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        if not os.path.lexists(path):
            os.rename(aside, path)
            fsync_dir(os.path.dirname(path))
            return
    os.unlink(aside)
    fsync_dir(os.path.dirname(path))

#: The space of each space bit, and an entry's two objects' bits (its content, then its envelope).
_SPACE_OF_BITS = {bits: space for space, bits in SPACE_BITS.items()}
_ENTRY_SPACES = bytes((SPACE_BITS["contents"], SPACE_BITS["entries"]))


class PackStage:
    """An import's objects written into a new pack as the file's pass accepts them,
    compressed on a thread beside the pass: one write of each object, where a spill wrote
    it, read it back and packed it. The pack (:class:`StreamPackWriter`) is written in
    ``tmp/`` and made visible only when the stage is handed to
    :meth:`FileObjects.put_many` (a session's create does, once its staged log names the
    objects, so a sweep never takes them for garbage); closed before, it is removed and
    the store is as it was (a crash leaves it in ``tmp/``, a temporary file as any
    writer's: ``fsck`` notes it and a sweep removes it once it is old).

    :meth:`add` only gathers an object (its name and bytes appended to two lists, its
    space bits to a byte string), :meth:`add_entry` an entry's two; a
    :data:`BATCH_BYTES` batch at a time goes to the writer in one call
    (:meth:`StreamPackWriter.add_many`), so the pass pays a few appends an entry.
    What :meth:`put_many` would not pack is spilled instead, and iterating the stage
    gives it, stored as any batch is: the objects of an import of fewer than
    :data:`PACK_BATCH` (loose files, as any small batch), one a pack holds already
    (freshened, or written again if swept meanwhile) and one too big to pack. In a store
    that had no pack when the stage began none is looked in (one another writer adds
    meanwhile may then share an object with this one: a repeat, which a repack drops)."""

    #: Threads compressing the pack's blocks beside the pass (0: the caller's thread, which
    #: a test measuring the import's own memory uses, since what blocks are in flight at a
    #: given moment depends on timing).
    THREADS = 1
    #: The bytes of objects gathered before they are handed on: a block's worth.
    BATCH_BYTES = BLOCK_TARGET

    def __init__(self, objects: FileObjects):
        from ...fsutil import Spill

        self._objects = objects
        self._rest = Spill()
        self._first: Spill | None = Spill()  # the first objects, until there are PACK_BATCH
        self._writer: StreamPackWriter | None = None
        self._done = self._ended = False  # stored or closed; told no more objects come
        self._spaces = bytearray()  # the batch being gathered: each object's space bits,
        self._names: list[str] = []  # name
        self._datas: list[bytes] = []  # and bytes
        self._held = 0
        objects.packs.refresh()
        self._dedup = bool(objects.packs.packs)

    def add(self, space: str, name: str, data: bytes) -> None:
        self._check_open()
        self._spaces.append(SPACE_BITS[space])
        self._names.append(name)
        self._datas.append(data)
        self._held += len(data)
        if self._held >= self.BATCH_BYTES:
            self._flush()

    def add_entry(self, content: str, entry: str, objects: tuple[bytes, bytes]) -> None:
        self._check_open()
        self._spaces += _ENTRY_SPACES
        self._names += (content, entry)
        self._datas += objects
        self._held += len(objects[0]) + len(objects[1])
        if self._held >= self.BATCH_BYTES:
            self._flush()

    def add_ready(self, blocks: Sequence[ReadyBlock]) -> None:
        """Blocks of entries' objects made and compressed by the import's helper process
        (:func:`~.packs.ready_blocks`), written after what came before them. In a store
        that had packs, a block holding an object one of them holds is opened and its
        objects taken one by one, as :meth:`add` takes them (that one is not packed again)."""
        self._check_open()
        if self._dedup:
            blocks = [block for block in blocks if not self._opened(block)]
        if not blocks:
            return
        self._flush()
        if self._writer is None:
            self._start()
        assert self._writer is not None
        self._writer.add_ready(blocks)

    def _check_open(self) -> None:
        if self._done or self._ended:
            raise StoreError("objects added to an import's stage after its end, or after it was stored or closed")

    def end(self) -> None:
        """No more objects come (the import's pass is over): its pack's last blocks are
        compressed and the pack made durable now, still in ``tmp/``, beside what the
        import does next; :meth:`seal` then only indexes it and makes it visible."""
        self._check_open()
        self._flush()
        self._ended = True
        if self._writer is not None:
            self._writer.end()

    def _opened(self, block: ReadyBlock) -> bool:
        """Whether a ready block holds an object a pack of the store holds, and was then
        opened, its objects added one by one."""
        frame, raw, raws, spaces = block
        names = [HASH_PREFIX + raws[i : i + 32].hex() for i in range(0, len(raws), 32)]
        packed = self._objects._packed_sound
        if not any(packed(_SPACE_OF_BITS[bits], name) is not None for bits, name in zip(spaces, names)):
            return False
        where = "a block of an import's helper"
        objects = Block(decompress_block(frame, raw, where=where, path=self._objects.tmp), b"", len(names),
                        where=where, path=self._objects.tmp)
        for slot, (bits, name) in enumerate(zip(spaces, names)):
            self.add(_SPACE_OF_BITS[bits], name, objects.object(slot))
        return True

    def _flush(self) -> None:
        """Hand the batch on: to the writer (begun once there are :data:`PACK_BATCH`
        objects), what it would not pack to the spill of the rest."""
        spaces, names, datas, held = bytes(self._spaces), self._names, self._datas, self._held
        self._spaces, self._names, self._datas, self._held = bytearray(), [], [], 0
        if not names:
            return
        if self._dedup or (held > MAX_PACKED and max(map(len, datas)) > MAX_PACKED):
            packed, kept = self._objects._packed_sound, []
            for bits, name, data in zip(spaces, names, datas):
                space = _SPACE_OF_BITS[bits]
                if len(data) > MAX_PACKED or (self._dedup and packed(space, name) is not None):
                    self._rest.add(space, name, data)
                else:
                    kept.append((bits, name, data))
            spaces = bytes(bits for bits, _, _ in kept)
            names, datas = [name for _, name, _ in kept], [data for _, _, data in kept]
        if self._writer is None:
            first = self._first
            assert first is not None
            if len(first) + len(names) < PACK_BATCH:
                for bits, name, data in zip(spaces, names, datas):
                    first.add(_SPACE_OF_BITS[bits], name, data)
                return
            self._start()
        assert self._writer is not None
        if names:
            self._writer.add_many(names, spaces, datas)

    def _start(self) -> None:
        """Enough objects for a pack: the writer begins, the first ones written into it."""
        first, self._first = self._first, None
        assert first is not None
        self._writer = writer = StreamPackWriter(self._objects.pack_dir, self._objects.tmp, threads=self.THREADS)
        for space, name, data in first:
            writer.add(space, name, data)
        first.close()

    def __len__(self) -> int:
        return len(self._rest) + (len(self._first) if self._first is not None else 0) + len(self._names)

    def __iter__(self) -> Iterator[tuple[Any, str, bytes]]:
        yield from self._rest
        if self._first is not None:
            yield from self._first

    def seal(self) -> None:
        """Make the pack durable and visible (none when too few objects came for one)."""
        if self._done:
            raise StoreError("an import's stage stored twice, or after it was closed")
        self._flush()
        self._done = True
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        self._objects._published(merge=True)

    def close(self) -> None:
        self._done = True
        self._spaces, self._names, self._datas, self._held = bytearray(), [], [], 0
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        if self._first is not None:
            self._first.close()
        self._rest.close()


@dataclass
class Snapshot:
    """Packs (with their mtimes), loose files (with their stat) and unreadable packs."""

    packs: list[tuple[Pack, int]]
    loose: list[tuple[str, str, str, os.stat_result]]
    bad: dict[str, str]

    def size(self) -> int:
        """Bytes on disk of these files (packs with their indexes)."""
        total = sum(st.st_size for *_, st in self.loose)
        for p, _ in self.packs:
            for path in (p.path, p.idx_path):
                total += os.stat(path).st_size if os.path.exists(path) else 0
        return total


def _check_names(items: Sequence[tuple[str, str, bytes]]) -> None:
    """Refuse a batch naming an object by what is no object name, or a space there is
    not, as :meth:`FileObjects.path` refuses one loose object: a pack's index holds the
    raw digest, so an upper-case name would be taken as the lower-case one, and anything
    else would stop the writer with a raw ValueError."""
    names = [name for _, name, _ in items]
    for name in names:
        if not isinstance(name, str):  # (all_hashes joins the names: strings only)
            raise not_an_object_name(name)
    if not all_hashes(names):
        raise not_an_object_name(next(name for name in names if not is_hash(name)))
    for space in {space for space, _, _ in items} - SPACE_BITS.keys():
        raise unknown_object_space(space, SPACES)

