"""A transport to a store this process can open: a directory, a ``file://`` URL, or a
named ``memory:`` store, served through :class:`~.endpoint.StoreEndpoint` as a server
would serve it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..errors import LayoutError, SessionLockedError, TransportError
from .endpoint import StoreEndpoint
from .transport import Admission, DeclareResult, PushRequest, SessionView, Transport, remote_url, url_path

__all__ = ["LocalTransport", "open_transport"]


def open_transport(remote: str | os.PathLike[str], **kwargs: Any) -> Transport:
    """A transport to ``remote``: a path, a ``file://`` URL or a named ``memory:`` store
    (:class:`LocalTransport`). Other schemes are refused with :class:`TransportError`."""
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
            from ..store.url import open_store

            try:
                store = open_store(self.root if self.root is not None else self.url, sync=self._sync)
            except LayoutError as exc:
                raise TransportError(f"remote {self.url}: {exc}") from None
            except NotADirectoryError:
                raise TransportError(f"remote {self.url}: not a directory, so no store") from None
            self._endpoint = StoreEndpoint(store, own_store=True)
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


