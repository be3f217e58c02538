"""Loose objects: canonical bytes named by their SHA-256, in three spaces.

``objects/entries/<2 hex>/<62 hex>`` holds envelopes, ``objects/contents/...``
bodies, ``objects/blobs/...`` media blobs. Every read hashes the bytes and
compares them with the name, so a corrupt object is never served; the
error names the object and its path. Writing is idempotent: an object
already present is not rewritten, since its name is its content.

Durability is the caller's choice per write. ``put(..., durable=False)``
leaves the file unsynced and returns its path, which a commit later
fsyncs together with its directory (:func:`fsync_paths`).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

from .errors import AgentSessionError, CorruptObjectError, NoSuchObjectError
from .hashing import HASH_PREFIX, is_hash

__all__ = ["SPACES", "ObjectStore", "fsync_paths", "fsync_dir"]

#: The three hash spaces RFC 0002 names, and their directories.
SPACES = ("entries", "contents", "blobs")

_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="agentsession-fsync")
    return _POOL


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
SYNCFS_BATCH = 64


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # swept or packed meanwhile: nothing is owed for it here
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_paths(files: Iterable[str]) -> None:
    """Fsync files, then the directories holding them, each once.

    The fsyncs run on a small thread pool so a journaling filesystem can
    batch them; files before directories, so a name never becomes durable
    ahead of its bytes.
    """
    files = list(dict.fromkeys(files))
    if not files:
        return
    dirs = list(dict.fromkeys(os.path.dirname(f) for f in files))
    if len(files) == 1:
        _fsync_file(files[0])
    else:
        list(_pool().map(_fsync_file, files))
    if len(dirs) == 1:
        fsync_dir(dirs[0])
    else:
        list(_pool().map(fsync_dir, dirs))


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
        hexd = name[len(HASH_PREFIX) :]
        return os.path.join(self.dir, space, hexd[:2], hexd[2:])

    def relpath(self, space: str, name: str) -> str:
        return os.path.relpath(self.path(space, name), self.root)

    def exists(self, space: str, name: str) -> bool:
        return os.path.exists(self.path(space, name))

    def get(self, space: str, name: str) -> bytes:
        """The object's bytes, verified against its name."""
        path = self.path(space, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise NoSuchObjectError(f"no {space} object {name} ({self.relpath(space, name)})") from None
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
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
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
        """Store many objects durably at once (a checkpoint): new files are created and
        written, then every file (new, or present from another writer) and every
        directory is fsynced on the pool, each once, holding the descriptors open so
        no file is opened twice."""
        fds: list[int] = []
        dirs: dict[str, None] = {}
        try:
            for space, name, data in items:
                path = self.path(space, name)
                try:
                    fd = self._create(path)
                except FileExistsError:
                    if not (os.path.getsize(path) == len(data) and self.is_sound(space, name)):
                        self._replace(path, data, durable=True)
                        continue
                    fd = os.open(path, os.O_RDONLY)  # someone else's copy: ours to make durable too
                    fds.append(fd)
                    dirs[os.path.dirname(path)] = None
                    continue
                fds.append(fd)
                dirs[os.path.dirname(path)] = None
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            if _syncfs is not None and len(fds) >= SYNCFS_BATCH:
                # One call makes every file and directory of the filesystem durable:
                # far cheaper than hundreds of fsyncs for a checkpoint's batch, at the
                # price of also flushing what else is dirty on that filesystem.
                _syncfs(fds[0])
                return
            if len(fds) > 1:
                list(_pool().map(os.fsync, fds))
            elif fds:
                os.fsync(fds[0])
            if len(dirs) > 1:
                list(_pool().map(fsync_dir, dirs))
            elif dirs:
                fsync_dir(next(iter(dirs)))
        finally:
            for fd in fds:
                os.close(fd)

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
        """Replace a torn or corrupt copy: a temp file renamed over it."""
        os.makedirs(self.tmp, exist_ok=True)
        tmp = os.path.join(self.tmp, f"obj-{os.getpid()}-{os.urandom(6).hex()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        if durable:
            fsync_dir(os.path.dirname(path))
            return None
        return path

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
