"""Media by ``sidecar:`` URL (RFC 0001 "File"): the one pattern, and the sidecar directory.

An item names a sidecar blob as ``sidecar:sha256:<hex>``, the hash being the
blob's; beside a session's file the blob is the file ``<hex>`` in a
directory named after the session. Every module that follows media (import,
export, push, sweep, fsck, migrate) finds the names here, so they agree.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from ..fsutil import write_atomic, write_output

__all__ = [
    "SIDECAR",
    "SIDECAR_BYTES",
    "read_sidecar",
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


def read_sidecar(directory: str, name: str) -> bytes:
    """The bytes of blob ``name`` in a sidecar directory (OSError when absent); the
    caller verifies them against the name."""
    with open(sidecar_path(directory, name), "rb") as f:
        return f.read()


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
