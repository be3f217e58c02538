"""Opening a store by URL: the one place that knows which backend serves which scheme.

``open_store`` takes what ``--store`` and ``AGENTSESSION_STORE`` take: a plain
path or a ``file:`` URL (a store directory), ``memory:`` (a new store in this
process's memory) or ``memory:NAME`` (one shared by name within the process).
Any other scheme is refused with a one-line error naming those served.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

from ..errors import UnsupportedError
from .store import Store, default_store_path

__all__ = ["SCHEMES", "open_store", "store_url_kind"]

#: The URL schemes this release serves (a plain path is a directory too).
SCHEMES = ("file", "memory")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


def store_url_kind(url: str) -> tuple[str, str]:
    """(scheme, the rest): ``file`` and a path for a path or ``file:`` URL, ``memory``
    and a name (maybe empty); UnsupportedError for a scheme not served."""
    m = _SCHEME.match(url)
    if m is None or len(m.group(1)) == 1:  # no scheme, or a Windows drive letter
        return "file", url
    scheme = m.group(1).lower()
    if scheme == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise UnsupportedError(f"store {url!r}: a file: URL names no host (or localhost), not {parts.netloc!r}")
        return "file", os.fsdecode(unquote_to_bytes(parts.path))
    if scheme == "memory":
        return "memory", url[len("memory:"):]
    served = ", ".join(f"{s}:" for s in SCHEMES)
    raise UnsupportedError(f"store {url!r}: this release serves no {scheme}: stores; it serves a path, {served}")


def open_store(url: str | os.PathLike[str] | None = None, *, create: bool = False, readonly: bool = False, **kwargs: Any) -> Store:
    """Open the store ``url`` names (default: ``$AGENTSESSION_STORE``, else ``~/.agent/cas``).

    ``create`` makes the store where there is none (``agentsession init``);
    ``readonly`` opens it without taking any hold or writing anything;
    other keywords go to :class:`Store` (``sync``)."""
    text = os.fspath(url) if url is not None else default_store_path()
    kind, rest = store_url_kind(text)
    if kind == "memory":
        from ..backends.memory import MemoryBackend

        return Store(MemoryBackend(rest or None, readonly=readonly), **kwargs)
    from ..backends.files import FileBackend

    if create:
        backend, _ = FileBackend.init(rest, readonly=readonly)
    else:
        backend = FileBackend(rest, readonly=readonly)
    return Store(backend, **kwargs)
