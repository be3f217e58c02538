"""Storage backends behind one seam (:mod:`.base`): files (:mod:`.files`), memory
(:mod:`.memory`) and PostgreSQL (:mod:`.postgresql`).

:func:`open_backend` is the one place that knows which backend serves which
store URL: a plain path or a ``file:`` URL (a store directory), ``memory:``
(a new store in this process's memory), ``memory:NAME`` (one shared by
name within the process), ``postgresql://…`` (``postgres://`` too: a
store in a PostgreSQL database, with the ``postgresql`` extra installed), or
``http://…``/``https://…`` (a store served by ``agentsession serve``, RFC 0003,
with the ``server`` extra: :mod:`.remote`).
Any other scheme is refused with a one-line error naming those served.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes, urlsplit

from ..errors import UnsupportedError
from .base import Append, Backend, Capabilities, LogOpen, ObjectStore, RefStore, RemoteStore, SessionLog, SessionStore
from .files import FileBackend

if TYPE_CHECKING:
    from .memory import MemoryBackend
    from .postgresql import PostgresBackend


def __getattr__(name: str) -> Any:
    """``MemoryBackend`` and ``PostgresBackend`` on first use: a command on a store
    directory loads neither (nor psycopg)."""
    if name == "MemoryBackend":
        from .memory import MemoryBackend

        return MemoryBackend
    if name == "PostgresBackend":
        from .postgresql import PostgresBackend

        return PostgresBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_STORE",
    "SCHEMES",
    "Append",
    "Backend",
    "Capabilities",
    "FileBackend",
    "LogOpen",
    "MemoryBackend",
    "PostgresBackend",
    "ObjectStore",
    "RefStore",
    "RemoteStore",
    "SessionLog",
    "SessionStore",
    "default_store_path",
    "open_backend",
    "store_url_kind",
]

#: Where a store is when nothing says (``--store``, ``AGENTSESSION_STORE``).
DEFAULT_STORE = "~/.agent/cas"
#: The URL schemes this release serves (a plain path is a directory too).
SCHEMES = ("file", "memory", "postgresql", "http", "https")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


def default_store_path() -> str:
    """``$AGENTSESSION_STORE``, else ``~/.agent/cas``."""
    return os.path.expanduser(os.environ.get("AGENTSESSION_STORE") or DEFAULT_STORE)


def store_url_kind(url: str) -> tuple[str, str]:
    """(scheme, the rest): ``file`` and a path for a path or ``file:`` URL, ``memory``
    and a name (maybe empty), ``postgresql`` or ``http`` and the whole URL; UnsupportedError for a
    scheme not served."""
    m = _SCHEME.match(url)
    if m is None or len(m.group(1)) == 1:  # no scheme, or a Windows drive letter
        return "file", url
    scheme = m.group(1).lower()
    if scheme == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise UnsupportedError(f"store {url!r}: a file: URL names no host (or localhost), not {parts.netloc!r}")
        if not parts.path:  # (not the working directory: a path says so, "." or "file:.")
            raise UnsupportedError(f"store {url!r}: a file: URL names no path; give the store's directory")
        return "file", os.fsdecode(unquote_to_bytes(parts.path))
    if scheme == "memory":
        return "memory", url[len("memory:"):]
    if scheme in ("postgresql", "postgres"):
        return "postgresql", url
    if scheme in ("http", "https"):
        return "http", url
    served = ", ".join(f"{s}:" for s in SCHEMES)
    raise UnsupportedError(f"store {url!r}: this release serves no {scheme}: stores; it serves a path, {served}")


def open_backend(url: str | os.PathLike[str], *, create: bool = False, readonly: bool = False) -> Backend:
    """The backend a store URL (or path) names; ``create`` makes the store where there is none."""
    kind, rest = store_url_kind(os.fspath(url))
    if kind == "memory":
        from .memory import MemoryBackend

        return MemoryBackend(rest or None, readonly=readonly, create=create)
    if kind == "postgresql":
        from .postgresql import PostgresBackend  # loaded only for a postgresql:// store

        return PostgresBackend(rest, readonly=readonly, create=create)
    if kind == "http":
        try:
            from .remote import RemoteBackend  # loaded only for an http(s):// store (httpx: the server extra)
        except ImportError as exc:
            raise UnsupportedError(
                f"store {url!r}: an HTTP store needs the server extra: pip install 'agentsession-cas[server]' ({exc})"
            ) from None
        return RemoteBackend(rest, readonly=readonly, create=create)
    if create:
        backend, _ = FileBackend.init(rest, readonly=readonly)
        return backend
    return FileBackend(rest, readonly=readonly)
