"""A transport to a store this process can open: a directory, a ``file://`` URL, or a
named ``memory:`` store, served through :class:`~.endpoint.StoreEndpoint` as a server
would serve it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, unquote_to_bytes, urlsplit

from ..errors import LayoutError, SessionLockedError, TransportError
from ..store.url import open_store
from .endpoint import StoreEndpoint
from .transport import Admission, DeclareResult, PushRequest, SessionView, Transport

__all__ = ["LocalTransport", "open_transport", "remote_url", "url_path"]


def remote_url(remote: str | os.PathLike[str]) -> str:
    """The normalised URL of a remote given as a path, a ``file://`` URL or a named
    ``memory:`` store: for a directory ``file://`` and the percent-encoded real
    path, so two spellings of one directory (relative, through a symlink,
    percent-encoded) are one remote.

    A URL's percent-escapes decode to the path's exact bytes (a name that is not
    UTF-8 included), and a URL carrying a query or a fragment is refused rather
    than cut short there: a literal ``#`` or ``?`` in a ``file://`` URL would
    otherwise silently name another directory (RFC 8089 wants them encoded)."""
    text = os.fspath(remote)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if text.startswith("memory:"):
        if len(text) == len("memory:"):
            raise TransportError("remote 'memory:' names no store: a memory remote is memory:NAME")
        return text
    if text.startswith(("postgresql://", "postgres://")):
        return text  # a store in a database, opened by its URL as it stands
    if "://" in text or text.lower().startswith("file:/"):
        parts = urlsplit(text)
        if parts.scheme != "file":
            raise TransportError(
                f"remote {text!r}: no transport for {parts.scheme}:// here; a remote is a store's path, a file:// URL "
                "or an http:// or https:// server"
            )
        if parts.netloc not in ("", "localhost"):
            raise TransportError(f"remote {text!r}: a file:// URL names no host (or localhost), not {parts.netloc!r}")
        if parts.query or parts.fragment or "?" in text or "#" in text:
            raise TransportError(
                f"remote {text!r}: a file:// URL names a directory and carries no query or fragment; "
                "write '?' as %3F and '#' as %23, or give the path itself"
            )
        path = os.fsdecode(unquote_to_bytes(parts.path))
        if not path:
            raise TransportError(f"remote {text!r} names no path")
    else:
        if not text:
            raise TransportError("the remote is empty: give a store's path or a file:// URL")
        path = os.path.expanduser(text)
    if "\0" in path:
        raise TransportError(f"remote {text!r}: a path holds no NUL character")
    return "file://" + quote(os.fsencode(os.path.realpath(os.path.abspath(path))))


def url_path(url: str) -> str:
    """The local path a normalised ``file://`` URL names (its exact bytes)."""
    return os.fsdecode(unquote_to_bytes(urlsplit(url).path))




def open_transport(remote: str | os.PathLike[str], **kwargs: Any) -> Transport:
    """A transport to ``remote``: a path, a ``file://`` URL or a named ``memory:`` store
    (:class:`LocalTransport`), or an ``http://``/``https://`` server
    (:class:`~.http_client.HttpTransport`). Other schemes are refused with
    :class:`TransportError`."""
    text = os.fspath(remote)
    if isinstance(text, str) and text[:8].lower().startswith(("http://", "https://")):
        try:
            # httpx comes with the server extra: a store that never names an HTTP remote
            # does not need it, so the import waits for the first one that does.
            from .http_client import HttpTransport
        except ImportError as exc:
            raise TransportError(
                f"remote {text!r}: an HTTP remote needs the server extra: pip install 'agentsession-cas[server]' ({exc})"
            ) from None
        return HttpTransport(text)
    return LocalTransport(remote, **kwargs)


class LocalTransport(Transport):
    """A store on this machine, opened in this process and served through
    :class:`~agentsession_cas.exchange.StoreEndpoint` as a server would serve it.

    The far store is opened once, when first needed, and kept open until
    :meth:`close`; the endpoint keeps the sessions it received into parked (no
    lock held between calls), so a recorder pushing every few turns through
    one transport pays for what it sends and not for the remote session's
    size.
    """

    def __init__(self, remote: str | os.PathLike[str], *, sync: str = "always"):
        self.url = remote_url(remote)
        self.root = url_path(self.url) if self.url.startswith("file:") else None
        self._sync = sync
        self._endpoint: StoreEndpoint | None = None

    def _serve(self) -> StoreEndpoint:
        if self._endpoint is None:
            try:
                store = open_store(self.root if self.root is not None else self.url, sync=self._sync)
            except LayoutError as exc:
                raise TransportError(f"remote {self.url}: {exc}") from None
            except NotADirectoryError:
                raise TransportError(f"remote {self.url}: not a directory, so no store") from None
            self._endpoint = StoreEndpoint(store, own_store=True, keep_sent=True)
        return self._endpoint

    def is_store(self, store: Any) -> bool:
        if self.root is None or store.root is None:
            return self.url == store.url
        try:
            return os.path.samefile(self.root, store.root)
        except OSError:
            return False

    def missing(self, wanted: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
        return self._serve().missing(wanted)

    def put_objects(self, items: Iterable[tuple[str, str, bytes]], count: int) -> None:
        self._serve().put_objects(items, count)

    def get_objects(
        self, wanted: Iterable[tuple[str, str]], *, session: str | None = None
    ) -> Iterator[tuple[str, str, bytes]]:
        return self._serve().get_objects(wanted, session=session)

    def session_header(self, session_id: str) -> dict[str, Any] | None:
        return self._serve().session_header(session_id)

    def session_view(self, session_id: str) -> SessionView:
        return self._serve().session_view(session_id)

    def push(self, request: PushRequest) -> Admission:
        with self._there():
            return self._serve().receive(request)

    def declare_record(self, session_id: str, *, head: str | None) -> DeclareResult:
        with self._there():
            return self._serve().declare_record(session_id, head=head)

    def release_record(self, session_id: str, *, head: str | None) -> DeclareResult:
        with self._there():
            return self._serve().release_record(session_id, head=head)

    @contextmanager
    def _there(self) -> Iterator[None]:
        """Say which store a locked session is in: "locked by another process" alone
        reads as this store's session."""
        try:
            yield
        except SessionLockedError as exc:
            raise SessionLockedError(f"at the remote {self.url}: {exc}") from None

    def get_ref(self, name: str) -> str | None:
        return self._serve().get_ref(name)

    def close(self) -> None:
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.close()

    def __repr__(self) -> str:
        return f"LocalTransport({self.url!r})"


