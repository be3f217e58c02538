"""The file backend's locks: an exclusive ``flock(2)`` on a file that is never removed.

A session's writer lock (``locks/<id>.lock``), the pack lock (``pack.lock``, at the
root, where no session's lock can be) and the refs lock (``refs.lock``) are each an exclusive ``flock`` on a small file,
taken on a descriptor of the lock object's own. A ``flock`` belongs to an open file
description, so two lock objects exclude each other in one process as in two, and
a process that dies holds nothing. The files are made by the first taker and never
unlinked: a lock on a file another process had unlinked would be a lock on nothing.

Written here rather than taken from the ``filelock`` package, which the store used
to take: these few lines cost nothing to import, where filelock's recent releases
(3.3x, 4.x) took 35 to 70 ms of CPU to import (logging, inspect, asyncio and more),
paid by every command that writes, against a start-up budget of 100 ms
(``tests/bench/bench_startup.py``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from types import TracebackType

from ...errors import StoreError

__all__ = ["PACK_LOCK", "FileLock", "LockTimeout"]

#: The store-wide lock of whatever removes packs or loose copies (``pack``, sweeps, a
#: writer's pack merge), at the root: in ``locks/`` it was ``locks/pack.lock``, the
#: writer lock of a session named ``pack`` (or ``PACK`` where names fold case).
PACK_LOCK = "pack.lock"

#: The first pause between tries of a lock that is waited for; it doubles up to
#: :data:`_MAX_DELAY`.
_FIRST_DELAY = 0.005
_MAX_DELAY = 0.1


class LockTimeout(Exception):
    """The lock stayed held by another for as long as the taker would wait. Internal:
    each caller says in the store's own error who holds what."""


class FileLock:
    """An exclusive lock on ``path``, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, path: str, timeout: float = -1.0):
        self.path = path
        #: How long :meth:`acquire` waits by default: 0 tries once, a negative wait is
        #: for as long as it takes.
        self.timeout = timeout
        self._fd: int | None = None

    @property
    def is_locked(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float | None = None) -> None:
        """Take the lock, waiting up to ``timeout`` seconds (this lock's default when
        None); LockTimeout when it stays held. Taking a lock this object holds is a no-op."""
        if self._fd is not None:
            return
        wait = self.timeout if timeout is None else timeout
        deadline = None if wait < 0 else time.monotonic() + wait
        fd = _open(self.path)
        try:
            delay = _FIRST_DELAY
            while not _try(fd, self.path):
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockTimeout(f"{self.path} is locked by another holder")
                pause = delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))
                time.sleep(pause)
                delay = min(delay * 2, _MAX_DELAY)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        """Let the lock go (closing its descriptor lets the ``flock`` go); a no-op when not held."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def __del__(self) -> None:  # a lock object dropped while held lets the lock go, as a dead process does
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _open(path: str) -> int:
    """A descriptor to lock ``path`` by, creating the file when it is missing.

    On a read-only filesystem (or a lock file the caller may not write) an existing
    lock file is opened for reading: ``flock`` takes a read-only descriptor as well, so
    a reader still excludes a writer on another mount of the same store and the command
    goes on to meet the read-only device where it writes, with the store's own words
    for it. The OSError is raised as it came, unwrapped, so the command can name it
    (``read_only``, ``no_space``, ``permission``) as it names any other."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            raise exc from None


def _try(fd: int, path: str) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):  # (EWOULDBLOCK is EAGAIN on Linux)
            return False
        # (A filesystem without flock: refused, not taken as held by nobody.)
        raise StoreError(f"cannot lock {path}: {exc.strerror or exc} (the store needs a filesystem with flock)") from None
    return True
