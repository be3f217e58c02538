"""Loose objects: canonical bytes named by their SHA-256, in three spaces.

``objects/entries/<2 hex>/<62 hex>`` holds envelopes, ``objects/contents/...``
bodies, ``objects/blobs/...`` media blobs. Every read hashes the bytes and
compares them with the name, so a corrupt object is never served; the
error names the object and its path. Writing is idempotent: an object
already present is not rewritten, since its name is its content.

Durability is the caller's choice per write. ``put(..., durable=False)``
leaves the file unsynced and returns its path for the caller to make
durable later; ``put_many`` writes a batch (a checkpoint, an import) and
makes it durable at once.
"""

from __future__ import annotations

import hashlib
import os
from typing import Iterable, Iterator

from .errors import AgentSessionError, CorruptObjectError, NoSuchObjectError
from .fsutil import fsync_dir, fsync_paths, write_all, write_atomic
from .hashing import HASH_PREFIX, is_hash

__all__ = ["SPACES", "ObjectStore", "fsync_paths", "fsync_dir"]

_READ = 1 << 20
#: The three hash spaces RFC 0002 names, and their directories.
SPACES = ("entries", "contents", "blobs")

def _load_syncfs():
    """libc's syncfs(2) (Linux), or None where it is not to be had."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        if fn(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return syncfs


_syncfs = _load_syncfs() if os.environ.get("AGENTSESSION_NO_SYNCFS") is None else None
#: From this many objects on, a batch is made durable with one syncfs(2) of the
#: store's filesystem rather than an fsync per file and directory.
SYNCFS_BATCH = 256


class ObjectStore:
    """The loose objects of one store, under ``<root>/objects``."""

    def __init__(self, root: str):
        self.root = root
        self.dir = os.path.join(root, "objects")
        self.tmp = os.path.join(root, "tmp")

    def path(self, space: str, name: str) -> str:
        """Where the loose object ``name`` of ``space`` lives (the name is checked first)."""
        if space not in SPACES:
            raise AgentSessionError(f"unknown object space {space!r}")
        if not is_hash(name):
            raise AgentSessionError(f"{name!r} is not an object name (sha256: and 64 lowercase hex digits)")
        return f"{self.dir}{os.sep}{space}{os.sep}{name[7:9]}{os.sep}{name[9:]}"

    def relpath(self, space: str, name: str) -> str:
        return os.path.relpath(self.path(space, name), self.root)

    def exists(self, space: str, name: str) -> bool:
        return os.path.exists(self.path(space, name))

    def get(self, space: str, name: str) -> bytes:
        """The object's bytes, verified against its name."""
        path = self.path(space, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise NoSuchObjectError(f"no {space} object {name} ({self.relpath(space, name)})") from None
        try:
            # A short read of a regular file is its end; most objects take one read.
            data = os.read(fd, _READ)
            if len(data) == _READ:
                chunks = [data]
                while chunk := os.read(fd, _READ):
                    chunks.append(chunk)
                data = b"".join(chunks)
        finally:
            os.close(fd)
        if HASH_PREFIX + hashlib.sha256(data).hexdigest() != name:
            raise CorruptObjectError(
                f"corrupt object: {space} object {name} does not hash to its name ({self.relpath(space, name)})",
                space=space,
                name=name,
                path=path,
            )
        return data

    def is_sound(self, space: str, name: str) -> bool:
        """True when the object is present and hashes to its name."""
        try:
            self.get(space, name)
        except (NoSuchObjectError, CorruptObjectError):
            return False
        return True

    def put(self, space: str, name: str, data: bytes, *, durable: bool) -> str | None:
        """Store ``data`` under ``name`` unless a sound copy is there already.

        Returns the path the caller owes an fsync for when ``durable`` is
        False (None when written durably). The caller guarantees ``name`` is
        the hash of ``data``. A new object is created under its own name
        (``O_EXCL``) and written in place: nothing names it until its append's
        record is written, and a copy a crash tore is detected by its hash
        and replaced by the next put.
        """
        path = self.path(space, name)
        try:
            fd = self._create(path)
        except FileExistsError:
            if os.path.getsize(path) == len(data) and self.is_sound(space, name):
                if durable:
                    # Another process may have written it and not yet committed.
                    fsync_paths([path])
                    return None
                return path
            return self._replace(path, data, durable=durable)
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            raise
        os.close(fd)
        if durable:
            fsync_dir(os.path.dirname(path))
            return None
        return path

    def put_many(self, items: list[tuple[str, str, bytes]]) -> None:
        """Store many objects durably at once (a checkpoint, an import): new files are
        created and written, then every file (new, or present from another writer)
        and every directory is made durable: by one syncfs(2) for a big batch, else
        by an fsync of each file and then each directory on the pool."""
        paths: list[str] = []
        for space, name, data in items:
            path = self.path(space, name)
            try:
                fd = self._create(path)
            except FileExistsError:
                if not (os.path.getsize(path) == len(data) and self.is_sound(space, name)):
                    self._replace(path, data, durable=False)
                paths.append(path)  # someone else's copy may not be durable yet: ours to make so
                continue
            try:
                write_all(fd, data)
            except BaseException:
                os.close(fd)
                try:
                    os.unlink(path)  # no partial object under its name
                except FileNotFoundError:
                    pass
                raise
            os.close(fd)
            paths.append(path)
        if not paths:
            return
        if _syncfs is not None and len(paths) >= SYNCFS_BATCH:
            # One call makes every file and directory of the filesystem durable: far
            # cheaper than hundreds of fsyncs, at the price of also flushing whatever
            # else is dirty on that filesystem.
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                _syncfs(fd)
            finally:
                os.close(fd)
            return
        fsync_paths(paths)

    def make_fanout(self) -> None:
        """Create every ``<2 hex>`` directory of every space, once, and fsync them into
        place: later objects then never pay for a new directory."""
        for space in SPACES:
            base = os.path.join(self.dir, space)
            os.makedirs(base, exist_ok=True)
            for i in range(256):
                os.makedirs(os.path.join(base, f"{i:02x}"), exist_ok=True)
            fsync_dir(base)

    def _create(self, path: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            return os.open(path, flags, 0o644)
        except FileNotFoundError:
            directory = os.path.dirname(path)
            os.makedirs(directory, exist_ok=True)
            # The new fan-out directory's own name lives in the space directory.
            fsync_dir(os.path.dirname(directory))
            return os.open(path, flags, 0o644)

    def _replace(self, path: str, data: bytes, *, durable: bool) -> str | None:
        """Replace a torn or corrupt copy: a temp file in tmp/ renamed over it."""
        os.makedirs(self.tmp, exist_ok=True)
        write_atomic(path, data, durable=durable, tmp_dir=self.tmp)
        return None if durable else path

    def names(self, space: str) -> Iterator[str]:
        """Every loose object name in a space (for fsck and sweeps)."""
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
