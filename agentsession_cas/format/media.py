"""Media by ``sidecar:`` URL (RFC 0001 "File"): the one pattern, and the sidecar directory.

An item names a sidecar blob as ``sidecar:sha256:<hex>``, the hash being the
blob's; beside a session's file the blob is the file ``<hex>`` in a
directory named after the session. Every module that follows media (import,
export, push, sweep, fsck, migrate) finds the names here, so they agree.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ..fsutil import write_atomic, write_output

if TYPE_CHECKING:
    from ..errors import Problem

__all__ = [
    "SIDECAR",
    "SIDECAR_BYTES",
    "SidecarNames",
    "check_sidecars",
    "sidecar_blob",
    "sidecar_dir",
    "sidecar_names",
    "sidecar_path",
    "write_projection",
    "write_sidecars",
]

#: A sidecar URL in text; group 1 is the blob's name (``sha256:<hex>``).
SIDECAR = re.compile(r"sidecar:(sha256:[0-9a-f]{64})")
#: The same over bytes (a content object's canonical JSON).
SIDECAR_BYTES = re.compile(rb"sidecar:(sha256:[0-9a-f]{64})")


def sidecar_names(content: bytes) -> list[str]:
    """The blob names a content (canonical JSON bytes) refers to, sorted, each once."""
    if b"sidecar:" not in content:
        return []
    return sorted({m.decode("ascii") for m in SIDECAR_BYTES.findall(content)})


def sidecar_dir(file_path: str | os.PathLike[str], session_id: str) -> str:
    """The directory beside a session's file that holds its sidecar blobs."""
    return os.path.join(os.path.dirname(os.path.abspath(os.fspath(file_path))), session_id)


def sidecar_path(directory: str, name: str) -> str:
    """Where blob ``name`` lies in a sidecar directory: the file named by its hex digest."""
    return os.path.join(directory, name[7:])


def sidecar_blob(directory: str | None, name: str, line: int | None = None, *, keep: bool = True) -> tuple[bytes | None, Problem | None]:
    """Blob ``name`` read from a sidecar directory and verified against its name (RFC 0001
    File: a reader verifies a blob as it verifies a content), the one check of a file's
    blob that ``verify FILE`` and import both make: its bytes (None unless ``keep``: a
    check alone reads it a piece at a time), or the problem, ``missing-blob`` (no file
    there, or none that reads; ``directory`` None: a stream, with none beside it) or
    ``blob-hash``, naming the file and ``line``, the first line naming the blob."""
    import hashlib

    from .codes import problem  # (the rules' table: not loaded by a command that checks no blob)

    if directory is None:
        return None, problem(line, "missing-blob", f"sidecar blob {name} is missing: a stream has no sidecar directory beside it")
    where = sidecar_path(directory, name)
    digest = hashlib.sha256()
    pieces: list[bytes] = []
    try:
        with open(where, "rb") as f:
            while piece := f.read(1 << 20):
                digest.update(piece)
                if keep:
                    pieces.append(piece)
    except OSError as exc:
        why = "no such file" if isinstance(exc, FileNotFoundError) else f"it cannot be read: {exc.strerror or exc}"
        return None, problem(line, "missing-blob", f"sidecar blob {name} is missing: {where}: {why}")
    if "sha256:" + digest.hexdigest() != name:
        return None, problem(line, "blob-hash", f"sidecar blob {where} does not hash to its name {name}")
    return (b"".join(pieces) if keep else None), None


class SidecarNames:
    """The blobs a sidecar session's lines name, each with the first line naming it, as
    a reader passes over the lines (a line's bytes searched only when they hold ``sidecar:``)."""

    __slots__ = ("first",)

    def __init__(self) -> None:
        self.first: dict[str, int] = {}

    def add(self, raw: bytes, line: int) -> None:
        if b"sidecar:" in raw:
            for name in sidecar_names(raw):
                self.first.setdefault(name, line)

    def add_block(self, joined: bytes, lines: list[bytes], first_line: int) -> None:
        """A block of lines (``joined``: them with their LFs), the first numbered ``first_line``."""
        if b"sidecar:" in joined:
            for i, raw in enumerate(lines):
                self.add(raw, first_line + i)


def check_sidecars(directory: str | None, named: Mapping[str, int]) -> list[Problem]:
    """Each blob ``named`` (name: the first line naming it) checked beside a file, by
    :func:`sidecar_blob`: the problems, in line order."""
    found = [sidecar_blob(directory, name, line, keep=False)[1] for name, line in sorted(named.items(), key=lambda kv: (kv[1], kv[0]))]
    return [p for p in found if p is not None]


def write_projection(
    path: str | os.PathLike[str], data: bytes | Iterable[bytes], session_id: str, blobs: dict[str, bytes]
) -> int:
    """A projection (bytes, or lines as they come) written to ``path`` (see
    :func:`~agentsession_cas.fsutil.write_output`: a regular file atomically and durably,
    a symlink's target, a device or pipe as a stream), and its sidecar blobs beside the
    file in ``<dir>/<session id>/<hex>`` (RFC 0001): ``blobs`` as it is once ``data``
    has been written, so a stream of lines may fill it as it goes. Returns how many blobs were not written because the output is a
    stream, which has no directory beside it."""
    path = os.fspath(path)
    if not write_output(path, data, durable=True):
        return len(blobs)
    if blobs:
        write_sidecars(sidecar_dir(os.path.realpath(path), session_id), blobs)
    return 0


def write_sidecars(directory: str, blobs: dict[str, bytes]) -> None:
    """Write blobs beside a projection, each atomically, named by its hex digest."""
    os.makedirs(directory, exist_ok=True)
    for name, data in blobs.items():
        write_atomic(os.path.join(directory, name[7:]), data, durable=True)
