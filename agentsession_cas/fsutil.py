"""Filesystem durability in one place: fsyncs of files and directories, and atomic writes.

A name becomes durable only when its directory is fsynced, and bytes only when
their file is; every writer in the project goes through these helpers so the
order (file, then directory) is right everywhere.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .errors import OutputError

if TYPE_CHECKING:  # the pool is made on first use: a command that fsyncs nothing does not load it
    from concurrent.futures import ThreadPoolExecutor

__all__ = [
    "ATOMIC_TMP", "Spill",
    "NotAFileError", "batched", "fsync_dir", "fsync_paths", "has_hole", "read_dense", "read_whole", "start_writeback", "write_all",
    "write_atomic", "write_chunks", "write_output",
]

_POOL: ThreadPoolExecutor | None = None
#: How many times this process has fsynced paths in parallel (see :func:`_each`).
_ROUNDS = 0
#: The rounds run on threads of their own before the pool is made.
_ROUNDS_BEFORE_POOL = 8


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="agentsession-fsync")
    return _POOL


def _each(fsync: Callable[[str], None], paths: list[str]) -> None:
    """``fsync`` every path at once, on threads, the first error raised.

    A process's first few rounds run on a thread each (started and joined here): a
    command that makes one append (its objects, their directories, the log) need not
    import concurrent.futures and logging, about 5 ms of its start-up. A process that
    comes back for more gets the pool, whose threads stay."""
    global _ROUNDS
    if len(paths) == 1:
        fsync(paths[0])
        return
    _ROUNDS += 1
    if _ROUNDS > _ROUNDS_BEFORE_POOL or len(paths) > 16:
        list(_pool().map(fsync, paths))
        return
    import threading

    errors: list[BaseException] = []

    def run(path: str) -> None:
        try:
            fsync(path)
        except BaseException as exc:  # handed to the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(path,), name="agentsession-fsync") for path in paths[1:]]
    for t in threads:
        t.start()
    try:
        fsync(paths[0])
    finally:
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


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
    _each(_fsync_file, files)
    _each(fsync_dir, dirs)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte (os.write may write fewer than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


#: What :func:`batched` gathers before one write: few system calls, little held.
WRITE_BATCH = 1 << 20


def batched(chunks: Iterable[bytes], size: int = WRITE_BATCH) -> Iterator[bytes]:
    """Small pieces (a stream's lines) gathered into writes of about ``size`` bytes."""
    held: list[bytes] = []
    n = 0
    for chunk in chunks:
        held.append(chunk)
        n += len(chunk)
        if n >= size:
            yield b"".join(held)
            held, n = [], 0
    if held:
        yield b"".join(held)


def write_chunks(fd: int, data: bytes | Iterable[bytes]) -> None:
    """:func:`write_all` of bytes, or of an iterable of pieces as they come (batched)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        write_all(fd, bytes(data) if not isinstance(data, bytes) else data)
        return
    for chunk in batched(data):
        write_all(fd, chunk)


def write_new_file(path: str, data: bytes | Iterable[bytes], *, durable: bool) -> None:
    """Create ``path`` (``O_EXCL``: ``FileExistsError`` when it exists) holding ``data``,
    fsynced when ``durable``; the descriptor is closed whatever happens, and a file left
    half written is the caller's to remove."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_chunks(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


#: The prefix of :func:`write_atomic`'s temp files, beside their target (fsck notes one,
#: a sweep removes one a crash left once it is old).
ATOMIC_TMP = ".tmp-"


def write_atomic(path: str, data: bytes | Iterable[bytes], *, durable: bool, tmp_dir: str | None = None) -> None:
    """Write ``data`` (bytes, or pieces streamed as they come) to a temp file (beside ``path``, or in ``tmp_dir`` on the same
    filesystem) and rename it over ``path``: a reader sees the old bytes or the new,
    never a mix. When ``durable``, the file is fsynced before the rename and the
    directory after it."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(tmp_dir or directory, f"{ATOMIC_TMP}{os.getpid()}-{os.urandom(6).hex()}")
    try:
        write_new_file(tmp, data, durable=durable)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        fsync_dir(directory)


def write_output(path: str, data: bytes | Iterable[bytes], *, durable: bool = True) -> bool:
    """Write ``data`` to a file the user named, as a user expects of an output path.

    A regular file (or a new one) is replaced atomically, as :func:`write_atomic`
    does; a symlink is followed, so its target is written and the link stays. Anything
    else that exists (a terminal, a pipe, ``/dev/stdout``, a FIFO, ``/dev/null``) is
    opened and written as a stream: renaming over it would replace the device with a
    file. Returns True for a regular file, False for a stream. Errors are
    :class:`~agentsession_cas.errors.OutputError` naming ``path``, never a temp name.
    """
    try:
        st = os.stat(path)  # follows symlinks: what a write would reach
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None
    try:
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise OutputError(f"cannot write {path}: it is a directory")
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(path, "wb") as f:
                write_chunks(f.fileno(), data)
            return False
        target = os.path.realpath(path)  # a symlink's target (a dangling one's too)
        directory = os.path.dirname(target) or "."
        if not os.path.isdir(directory):
            raise OutputError(f"cannot write {path}: directory {os.path.dirname(path) or '.'} does not exist")
        write_atomic(target, data, durable=durable)
        return True
    except OutputError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _load_sync_file_range() -> Any:
    """libc's sync_file_range(2) (Linux), or None. Looked up on first use: ctypes and
    the library search cost a command that writes nothing tens of milliseconds."""
    try:
        import ctypes

        try:
            fn = ctypes.CDLL(None, use_errno=True).sync_file_range  # libc is loaded already
        except (OSError, AttributeError):
            import ctypes.util

            fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).sync_file_range
    except (OSError, AttributeError, ImportError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE: Any = ...  # not looked up yet
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int) -> bool:
    """Ask the kernel to start writing a file's dirty pages now, without waiting and
    without any durability promise (sync_file_range with SYNC_FILE_RANGE_WRITE), so a
    later fsync has little left to do. False where the platform cannot."""
    global _SYNC_FILE_RANGE
    if _SYNC_FILE_RANGE is ...:
        _SYNC_FILE_RANGE = _load_sync_file_range()
    if _SYNC_FILE_RANGE is None:
        return False
    return _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) == 0


#: One read's size: most objects and logs take one.
_READ = 1 << 20


class NotAFileError(OSError):
    """A path a store reads as a file is a FIFO, a device or a socket (put there by
    someone else): reading it could block forever or never end."""


def read_whole(path: str) -> bytes:
    """A whole regular file, in as few reads as it takes (a short read of a regular file
    is its end, so most objects take one read and no fstat). Opened non-blocking, so a
    FIFO without a writer reads as empty instead of hanging; a long read is checked to
    be of a regular file (``/dev/zero`` never ends) and bounded by its size."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        data = os.read(fd, _READ)
        if not data and not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotAFileError(f"{path} is not a regular file")
        if len(data) == _READ:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotAFileError(f"{path} is not a regular file")
            chunks = [data]
            left = st.st_size - len(data)
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 24))):
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
    finally:
        os.close(fd)
    return data


#: A hole (a range of a sparse file never written) at least this long is not read: it holds
#: only zeros, and a session log's records hold no NUL byte (canonical JSON escapes them).
HOLE_LIMIT = 1 << 20


def read_dense(path: str) -> bytes:
    """A file the store appends to (a session log), read whole as :func:`read_small` opens
    one (non-blocking, no final symbolic link followed, a regular file only, else
    :class:`NotAFileError`), except the holes of a sparse file: a hole of at least
    :data:`HOLE_LIMIT` bytes reads as one NUL byte. What was written is read whatever its
    size; a log truncated to gigabytes of nothing costs what its written bytes cost.

    Bytes after such a hole come at offsets smaller than on disk by the hole's length
    less one. A log's reader finds the NUL (no record holds one) and stops trusting what
    follows, so those offsets serve only to name damage already found."""
    fd, st = _open_regular(path)
    try:
        if st.st_blocks * 512 >= st.st_size:  # no room for a hole worth skipping: read it all
            return _pread_all(fd, 0, st.st_size)
        chunks: list[bytes] = []
        for start, end, hole in _regions(fd, st.st_size):
            if not hole:
                chunks.append(_pread_all(fd, start, end - start))
            else:
                chunks.append(b"\0" if end - start >= HOLE_LIMIT else bytes(end - start))
        return b"".join(chunks)
    finally:
        os.close(fd)


def has_hole(path: str, at_least: int = HOLE_LIMIT) -> bool:
    """Whether the file holds a hole (a range never written) of ``at_least`` bytes: found
    from the file's extents, nothing read. What a reader checks before hashing a file
    whose kind never holds a run of NUL bytes (an entry, a content: canonical JSON)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_blocks * 512 + at_least > st.st_size:
            return False
        return any(hole and end - start >= at_least for start, end, hole in _regions(fd, st.st_size))
    finally:
        os.close(fd)


def _regions(fd: int, size: int) -> Iterator[tuple[int, int, bool]]:
    """(start, end, is_hole) for each range of the file, by SEEK_DATA and SEEK_HOLE (a
    filesystem without them reports one range of data)."""
    pos = 0
    while pos < size:
        try:
            data_at = min(os.lseek(fd, pos, os.SEEK_DATA), size)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            data_at = size  # a hole runs to the end
        if data_at > pos:
            yield pos, data_at, True
        if data_at >= size:
            return
        hole_at = min(os.lseek(fd, data_at, os.SEEK_HOLE), size)
        yield data_at, hole_at, False
        pos = hole_at


def _pread_all(fd: int, offset: int, length: int) -> bytes:
    """``length`` bytes from ``offset`` (fewer where the file ends sooner)."""
    chunks = []
    while length > 0 and (chunk := os.pread(fd, min(length, 1 << 24), offset)):
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(chunks)


def read_prefix(path: str, limit: int) -> bytes:
    """The first ``limit`` bytes (or fewer) of a file the store keeps, opened as
    :func:`read_small` opens one (non-blocking, no final symbolic link followed, a
    regular file only), whatever its size."""
    return _read_regular(path, limit, whole=False)


def read_regular(path: str) -> bytes:
    """A file the store keeps that grows without bound (``refs.log``), read whole, opened
    as :func:`read_small` opens one (non-blocking, no final symbolic link followed, a
    regular file only), with its errors."""
    return _read_regular(path, sys.maxsize, whole=False)


def read_small(path: str, limit: int) -> bytes:
    """A small file the store keeps (layout, a ref), read whole: opened non-blocking and
    without following a final symbolic link (the store makes none), checked to be a
    regular file, and refused past ``limit`` bytes before anything is read (a sparse
    file of gigabytes is not read). :class:`NotAFileError` says which of these it is;
    FileNotFoundError and IsADirectoryError pass as they are."""
    return _read_regular(path, limit, whole=True)


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    """A descriptor of a regular file and its stat: opened non-blocking, no final link
    followed; a link, a FIFO, a device or a socket is :class:`NotAFileError`, a directory
    IsADirectoryError (the descriptor closed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotAFileError(f"{path} is a symbolic link; the store makes none") from None
        raise
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
        if not stat.S_ISREG(st.st_mode):
            raise NotAFileError(f"{path} is not a regular file (a FIFO, a device or a socket)")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_regular(path: str, limit: int, *, whole: bool) -> bytes:
    fd, st = _open_regular(path)
    try:
        if whole and st.st_size > limit:
            raise NotAFileError(f"{path} is {st.st_size} bytes; a file of its kind is at most {limit}")
        # One read of the size the file has (and a byte more, to see it grew), not of
        # ``limit`` bytes: a buffer of the limit is allocated whole (tracemalloc counts it;
        # a strict overcommit refuses it). A short read of a regular file is its end.
        out = os.read(fd, min(limit, st.st_size + 1))
        if len(out) <= st.st_size or len(out) >= limit:
            return out
        chunks = [out]  # it grew since it was looked at: on to the limit
        want = limit - len(out)
        while want > 0 and (chunk := os.read(fd, min(want, 1 << 20))):
            chunks.append(chunk)
            want -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def hash_file(path: str) -> tuple[bytes, int]:
    """SHA-256 of a file read in chunks (a big file is never held whole), and its size.
    Opened non-blocking: a FIFO reads as empty instead of hanging."""
    h = hashlib.sha256()
    size = 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while chunk := os.read(fd, 1 << 22):
            h.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return h.digest(), size


class Spill:
    """Objects (space, name, bytes) written in order to an anonymous temporary file and
    read back once in the same order: what a one-pass import holds of a file's objects
    between checking them and handing them to the store, so its memory does not grow
    with the file. The file lives in the system's temporary directory (``TMPDIR``) and
    is gone when closed or when the process ends. ``len()`` is how many were added."""

    _LENGTHS = 4  # bytes of each length field

    def __init__(self) -> None:
        import tempfile

        self._f = tempfile.TemporaryFile(buffering=1 << 20)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, space: str, name: str, data: bytes) -> None:
        head = f"{space} {name}".encode()
        self._f.write(len(head).to_bytes(self._LENGTHS, "big") + len(data).to_bytes(self._LENGTHS, "big"))
        self._f.write(head)
        self._f.write(data)
        self._count += 1

    def add_entry(self, content: str, entry: str, objects: tuple[bytes, bytes]) -> None:
        """An entry's content and envelope (:meth:`add` of each, in that order)."""
        self.add("contents", content, objects[0])
        self.add("entries", entry, objects[1])

    def end(self) -> None:
        """No more objects come: nothing to do before they are read back."""

    def __iter__(self) -> Iterator[tuple[Any, str, bytes]]:
        f = self._f
        f.flush()
        f.seek(0)
        n = self._LENGTHS
        for _ in range(self._count):
            lengths = f.read(2 * n)
            head = f.read(int.from_bytes(lengths[:n], "big")).decode("utf-8")
            data = f.read(int.from_bytes(lengths[n:], "big"))
            space, _, name = head.partition(" ")
            yield space, name, data

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
