"""What a store directory remembers of its remotes: ``remotes/<key>/``.

``<key>`` is 32 hex digits of the SHA-256 of the remote's normalised URL,
written beside its state in ``remotes/<key>/remote``; ``sessions/<id>`` and
``refs/<file>`` hold one record each, canonical JSON and LF, replaced
atomically and durably. A file that does not read is treated as absent:
all of it is a hint a push re-learns.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any, Literal

from ...errors import AgentSessionError
from ...format.canonical import canonical_bytes, loads
from ...format.names import check_session_id
from ...fsutil import fsync_dir, write_atomic
from ..base import RemoteStore
from .refs import ref_file_name

__all__ = ["FileRemotes", "remote_key"]

Kind = Literal["sessions", "refs"]


def remote_key(url: str) -> str:
    """The directory name of a remote's remembered state: 32 hex digits of the SHA-256
    of its normalised URL (the URL itself is written beside it)."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:32]


class FileRemotes(RemoteStore):
    def __init__(self, root: str, *, readonly: bool):
        self.root = root
        self.readonly = readonly

    def _path(self, url: str, kind: Kind, name: str) -> str:
        file_name = check_session_id(name) if kind == "sessions" else ref_file_name(name)
        return os.path.join(self.root, "remotes", remote_key(url), kind, file_name)

    def get(self, url: str, kind: Kind, name: str) -> dict[str, Any] | None:
        try:
            with open(self._path(url, kind, name), "rb") as f:
                data = loads(f.read().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, AgentSessionError):
            return None
        return data if isinstance(data, dict) else None

    def put(self, url: str, kind: Kind, name: str, record: Mapping[str, Any]) -> None:
        if self.readonly:
            return  # a hint: a read-only store re-learns it next time
        path = self._path(url, kind, name)
        remote_dir = os.path.join(self.root, "remotes", remote_key(url))
        tmp = os.path.join(self.root, "tmp")
        for d in (os.path.join(self.root, "remotes"), remote_dir, os.path.dirname(path)):
            if not os.path.isdir(d):
                os.makedirs(d, exist_ok=True)
                fsync_dir(os.path.dirname(d))
        url_file = os.path.join(remote_dir, "remote")
        if not os.path.exists(url_file):
            write_atomic(url_file, canonical_bytes({"url": url}) + b"\n", durable=True, tmp_dir=tmp)
        write_atomic(path, canonical_bytes(dict(record)) + b"\n", durable=True, tmp_dir=tmp)

    def delete(self, url: str, kind: Kind, name: str) -> None:
        if self.readonly:
            return
        path = self._path(url, kind, name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        fsync_dir(os.path.dirname(path))
