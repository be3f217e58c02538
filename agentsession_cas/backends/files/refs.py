"""Refs in a store directory: ``refs/<name with / as %>``, one small file each, under ``refs.lock``.

Each file is the ref's record as canonical JSON and LF, then ``sha256:<hex>`` of
that line and LF (so a flipped byte is found, never served as another session),
written to ``tmp/``, fsynced and renamed into place (the directory fsynced). A
file of one line (written before the checksum) is still read. The store-wide lock
``refs.lock`` is held by every change, since a creation's conflict check
spans every name; reads take none. On a file system that ignores case, the
file of ``Chat`` is the file of ``chat``: a file holding another spelling
is another ref, not this one.

Each change is also a line of ``refs.log`` (canonical JSON and LF, appended and
fsynced under the same lock, after the ref file is durable): the refs' history
RFC 0003 serves as a ref's log. A crash between the two loses the line, never a
move; a torn last line (a crash inside the append) is not read. A ref's log and fsck
read the file by one rule (:func:`read_refs_log`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ...errors import AgentSessionError, BadRefNameError, StoreError
from ...format.canonical import canonical_bytes, loads
from ...format.names import check_ref_name
from ...fsutil import NotAFileError, fsync_dir, read_regular, read_small, write_all, write_atomic
from ...lean import dataclass
from ..base import RefStore
from .locks import FileLock, LockTimeout

__all__ = ["FileRefs", "LOCK_TIMEOUT", "RefsLog", "read_refs_log", "ref_file_bytes", "ref_file_name"]

#: How long a writer waits for another's ref update before giving up. Updates hold the
#: lock for a read, a file write and two fsyncs, so a wait this long means a stuck process.
LOCK_TIMEOUT = 30.0
#: The file-name spelling of ``/``; no ref name can hold it, so the mapping is one to one.
_SLASH = "%"
#: The second line of a ref file: the SHA-256 of the first (record) line, LF included.
_SUM_PREFIX = b"sha256:"
#: A ref file is a name (at most 200 bytes), a session id, an ident and a checksum: a
#: longer one is not a ref file.
_MAX_REF_FILE = 4096


def ref_file_name(name: str) -> str:
    """The file in ``refs/`` that holds the ref ``name`` (``/`` written as ``%``)."""
    return check_ref_name(name).replace("/", _SLASH)


def ref_file_bytes(record: Mapping[str, Any]) -> bytes:
    """A ref file's bytes: the record's canonical JSON line, then its checksum line."""
    line = canonical_bytes(dict(record)) + b"\n"
    return line + _SUM_PREFIX + hashlib.sha256(line).hexdigest().encode() + b"\n"


def _checked(raw: bytes, path: str) -> bytes:
    """The record line of a ref file, its checksum line checked (a file of one line,
    written before refs had one, is taken as it is)."""
    first, nl, rest = raw.partition(b"\n")
    if not nl or not rest:
        return raw
    line = first + nl
    want = _SUM_PREFIX + hashlib.sha256(line).hexdigest().encode() + b"\n"
    if rest != want:
        raise StoreError(f"ref file {path} is damaged: its record does not match its checksum line")
    return first


def _name_of_file(file_name: str) -> str | None:
    name = file_name.replace(_SLASH, "/")
    try:
        return check_ref_name(name)
    except BadRefNameError:
        return None


def _end_last_line(fd: int, size: int) -> None:
    """Make the refs' log end with a whole line before a move is appended: a crash (or a
    full disk) left an append without its newline, which the reader takes only as the
    last line, and the next move, appended to it, would make one line of the two, which
    no history read gets past. A last line that reads as a move (cut just before its
    newline) gets its newline; one that does not (torn, never read) is cut off, so
    nothing a history showed is lost. Called under the refs lock."""
    end, chunk = size, 65536
    while end > 0:
        start = max(0, end - chunk)
        data = os.pread(fd, end - start, start)
        at = data.rfind(b"\n")
        if at >= 0:
            cut = start + at + 1
            break
        end = start
    else:
        cut = 0
    if _move_of(os.pread(fd, size - cut, cut)) is not None:
        write_all(fd, b"\n")
    else:
        os.ftruncate(fd, cut)


class FileRefs(RefStore):
    def __init__(self, root: str):
        self.root = root
        self.dir = os.path.join(root, "refs")

    def where(self, name: str) -> str:
        return os.path.join(self.dir, ref_file_name(name))

    def get(self, name: str) -> dict[str, Any] | None:
        path = self.where(name)
        try:
            raw = read_small(path, _MAX_REF_FILE)
        except FileNotFoundError:
            return None
        except NotAFileError as exc:
            raise StoreError(f"ref file {path} is damaged: {exc}") from None
        except IsADirectoryError:
            raise StoreError(f"ref file {path} is a directory; refs/ holds one file per ref") from None
        raw = _checked(raw, path)
        try:
            data = loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, AgentSessionError) as exc:
            raise StoreError(f"ref file {path} is damaged: not a JSON object ({exc})") from None
        if not isinstance(data, dict):
            raise StoreError(f"ref file {path} is damaged: not a JSON object")
        held = data.get("name")
        if not isinstance(held, str):
            raise StoreError(f"ref file {path} is damaged: 'name' is {held!r}, not a ref name")
        if held.lower() != name.lower():
            raise StoreError(f"ref file {path} is damaged: it holds the ref {held!r}, not {name!r}")
        if held != name:
            return None  # another spelling a case-insensitive file system maps here
        return data

    def names(self, prefix: str = "") -> list[str]:
        try:
            files = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        want = prefix.replace("/", _SLASH)
        out = []
        for file_name in files:
            if file_name.startswith(want):
                name = _name_of_file(file_name)
                if name is not None:
                    out.append(name)
        out.sort()
        return out

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The store-wide refs lock. Its file is made by the first write and never
        removed, as a session's lock file is."""
        lock = FileLock(os.path.join(self.root, "refs.lock"), timeout=LOCK_TIMEOUT)
        try:
            lock.acquire()
        except LockTimeout:
            raise StoreError(
                f"the refs of the store at {self.root} stayed locked for {LOCK_TIMEOUT:g}s by another process"
            ) from None
        try:
            yield
        finally:
            lock.release()

    def put(self, name: str, record: Mapping[str, Any]) -> None:
        if not os.path.isdir(self.dir):
            os.makedirs(self.dir, exist_ok=True)
            fsync_dir(self.root)  # the new directory's name, before any ref in it
        tmp = os.path.join(self.root, "tmp")
        os.makedirs(tmp, exist_ok=True)
        write_atomic(self.where(name), ref_file_bytes(record), durable=True, tmp_dir=tmp)

    def delete(self, name: str) -> None:
        try:
            os.unlink(self.where(name))
        except FileNotFoundError:
            return
        fsync_dir(self.dir)

    keeps_moves = True

    def record_move(self, name: str, move: Mapping[str, Any]) -> None:
        path = os.path.join(self.root, "refs.log")
        made = not os.path.exists(path)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StoreError(f"the refs' log {path} is not a regular file; the ref moved, its history was not kept")
            if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
                _end_last_line(fd, st.st_size)
            write_all(fd, canonical_bytes(dict(move, name=name)) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        if made:
            fsync_dir(self.root)

    def moves(self, name: str) -> list[dict[str, Any]] | None:
        log = read_refs_log(self.root)
        if log.bad:
            raise log.damage(log.bad[0])
        return [move for _, move in log.moves if move.get("name") == name]


@dataclass
class RefsLog:
    """``refs.log`` as read: each line that reads, with its number (from 1); the lines
    that do not (before the last), each damage; and a torn last line (an append a crash
    cut, no LF after it), which is not read and is no damage."""

    path: str
    moves: list[tuple[int, dict[str, Any]]]
    bad: list[int]
    torn: int | None = None

    def damage(self, line: int) -> StoreError:
        """What reading the history says of a line that does not read (naming the file
        whole, as the ref files' errors do; fsck names it relative to the store)."""
        return StoreError(f"the refs' log {self.path} line {line} does not read as a JSON object")


def read_refs_log(root: str) -> RefsLog:
    """The refs' history of the store at ``root``, read by the one rule both a ref's log
    and fsck use: a line reads when it is a JSON object; one that does not is damage,
    except a last line without its LF (a torn append), which is skipped. A file that is
    not a regular one is a :class:`StoreError` naming it; no file is an empty history."""
    path = os.path.join(root, "refs.log")
    try:
        data = read_regular(path)  # (no link followed: the store makes none, a move's append refuses one)
    except FileNotFoundError:
        return RefsLog(path, [], [])
    except NotAFileError as exc:
        raise StoreError(f"the refs' log {path} cannot be read: {exc}") from None
    except OSError as exc:
        raise StoreError(f"the refs' log {path} cannot be read: {exc.strerror}") from None
    lines = data.split(b"\n")
    out = RefsLog(path, [], [])
    for n, line in enumerate(lines, start=1):
        if not line:
            continue
        move = _move_of(line)
        if move is not None:
            out.moves.append((n, move))
        elif n == len(lines):  # a torn last line: an append a crash cut
            out.torn = n
        else:
            out.bad.append(n)
    return out


def _move_of(line: bytes) -> dict[str, Any] | None:
    """A line of ``refs.log`` as a move, or None when it does not read (a JSON object)."""
    try:
        move = loads(line)
    except (ValueError, AgentSessionError):
        return None
    return move if isinstance(move, dict) else None

