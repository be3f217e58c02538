"""How one store reaches another for exchange: the :class:`Transport` interface, the
local-path implementation, and what a store remembers of each remote.

Exchange (RFC 0002 "Exchange between stores") is written once, in
:mod:`agentsession_cas.exchange`, against :class:`Transport`. A transport is
the far store as the near one sees it, in the calls RFC 0003 defines over
HTTP, so a network transport can implement it later without changing the
exchange logic:

=====================================  =========================================
Transport                              RFC 0003
=====================================  =========================================
``missing(wanted)``                    ``POST /v1/objects/missing``
``put_objects(items, count)``          ``PUT /v1/objects/{space}/{hash}`` each
``get_objects(wanted, session=...)``   ``GET /v1/objects/{space}/{hash}`` each
``session_header(id)``                 ``GET /v1/sessions/{id}`` (its header)
``session_view(id)``                   ``GET .../log?durable=true`` and ``path``
``push(request)``                      ``POST /v1/sessions/{id}/push``
``declare_record(id, head=...)``       ``POST /v1/sessions/{id}/record``
``release_record(id, head=...)``       ``POST /v1/sessions/{id}/handover``
``get_ref(name)``                      ``GET /v1/refs/{name}``
=====================================  =========================================

:class:`LocalTransport` reaches a store on a path (a directory, or a
``file://`` URL): it opens that store in this process and serves each call
through :class:`~agentsession_cas.exchange.StoreEndpoint`, the receiving
rules, exactly as a server would. :class:`Remembered` is the per-remote state
a store keeps (``remotes/<key>/`` in the store directory, see
``docs/storage-format.md``): the remote head each session last saw there,
how much of its log the remote is known to hold, and the refs it last saw.
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote_to_bytes, urlsplit

from ..backends.files.fsutil import fsync_dir, write_atomic
from ..errors import AgentSessionError, LayoutError, SessionLockedError, StoreError, TransportError
from ..format.canonical import canonical_bytes, loads
from ..format.hashing import is_hash
from ..format.names import check_session_id
from ..store.refs import check_ref_name, ref_file_name

if TYPE_CHECKING:  # exchange imports this module; the endpoint is imported where it is used
    from ..store.core import Store
    from .operations import StoreEndpoint

__all__ = [
    "Admission",
    "DeclareResult",
    "LocalTransport",
    "PushRequest",
    "RefPush",
    "RefResult",
    "Remembered",
    "RemoteState",
    "SessionView",
    "Transport",
    "open_transport",
    "remote_key",
    "remote_url",
]

#: The object spaces, as exchange names them (RFC 0003 calls ``blobs`` ``media``).
SPACES = ("entries", "contents", "blobs")


# -- what crosses between stores -------------------------------------------------


@dataclass
class SessionView:
    """A session as its holder serves it, from one committed view (RFC 0003's
    ``log?durable=true`` and ``path``): what a fetcher reads."""

    id: str
    header: dict[str, Any]
    mark: str
    head: str | None
    #: Own entries, in the holder's log order.
    entries: list[str]
    #: The prefix: root..base, base included; empty without a base.
    prefix: list[str]


@dataclass(frozen=True)
class RefPush:
    """A ref to move at the receiver, by compare-and-swap from ``expected`` (None:
    the ref must be absent) to ``next``, which must be the pushed session."""

    name: str
    expected: str | None
    next: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "expected": self.expected, "next": self.next}


@dataclass
class RefResult:
    """What a ref step did at the receiver. ``moved`` is also true when the ref was
    already at ``next`` (a retried push is safe); ``current`` is what it holds now."""

    name: str
    moved: bool
    current: str | None
    why: str | None = None
    changed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "moved": self.moved, "changed": self.changed, "current": self.current, "why": self.why}


@dataclass
class PushRequest:
    """A push as RFC 0003 posts it, once the objects are sent.

    ``entries`` are own entry ids in the sender's log order: all of them when
    ``complete``, or only those the sender believes new to the receiver
    (then ``prefix`` is empty, and a receiver lacking what they build on
    refuses with :class:`~agentsession_cas.errors.IncompletePushError`, and
    the sender pushes again with the whole closure). ``mark`` is the
    receiver's resulting mark: ``mirror``, or ``record`` for a handover.
    """

    header: dict[str, Any]
    prefix: list[str]
    entries: list[str]
    to: str | None
    expected: str | None
    force: bool = False
    mark: str = "mirror"
    refs: list[RefPush] = field(default_factory=list)
    complete: bool = True

    @property
    def session(self) -> str:
        return str(self.header.get("id"))


@dataclass
class Admission:
    """The receiver's answer to a push (or to a fetch's admission in the fetcher).

    ``outcome`` is ``unchanged`` (the head already was ``to``),
    ``fast-forward`` (moved by a compare-and-swap that matched, to a
    descendant of the old head), ``moved`` (the compare-and-swap matched, the
    new head is not a descendant: the record moved its head back or to
    another branch), ``forced`` (``force`` moved a head that was not the
    expected one), ``refused`` (a push whose expectation was wrong: the
    entries landed as a branch and the head stayed) or ``not-moved`` (a fetch
    that may not move the head: ``why`` says which rule).
    """

    session: str
    created: bool
    admitted: int
    previous: str | None
    head: str | None
    outcome: str
    why: str | None
    mark: str
    refs: list[RefResult] = field(default_factory=list)

    @property
    def moved(self) -> bool:
        return self.outcome in ("fast-forward", "moved", "forced")

    @property
    def forced(self) -> bool:
        return self.outcome == "forced"


@dataclass
class DeclareResult:
    """What a declare-record did: whether the mark changed, and the head it held."""

    session: str
    changed: bool
    head: str | None
    mark: str

    def as_dict(self) -> dict[str, Any]:
        return {"session": self.session, "changed": self.changed, "head": self.head, "mark": self.mark}


# -- the interface ---------------------------------------------------------------


class Transport(ABC):
    """The far store of an exchange, as the near one reaches it.

    Every call is the far store's to decide under its own rules (RFC 0002 and
    0003): nothing here trusts the caller beyond what those documents let a
    receiver take on the sender's word. Errors are the library's
    (:class:`~agentsession_cas.errors.AgentSessionError` subclasses), as a
    network transport would map RFC 0003's problem codes onto them.
    """

    #: The remote's URL, normalised: the same remote always gives the same string.
    url: str

    @property
    def key(self) -> str:
        """The name this remote's remembered state goes under (:func:`remote_key`)."""
        return remote_key(self.url)

    def is_store(self, root: str) -> bool:
        """True when the far store is the store at ``root`` (pushing to oneself is refused)."""
        return False

    @abstractmethod
    def missing(self, wanted: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
        """Of ``{space: [hash, ...]}``, the objects the far store lacks (or holds torn),
        in the same shape."""

    @abstractmethod
    def put_objects(self, items: Iterable[tuple[str, str, bytes]], count: int) -> None:
        """Send ``count`` objects ``(space, hash, bytes)``; each is verified against its
        name there (:class:`~agentsession_cas.errors.BadObjectError` otherwise) and is
        durable when this returns. Nothing names them until a push does."""

    @abstractmethod
    def get_objects(
        self, wanted: Iterable[tuple[str, str]], *, session: str | None = None
    ) -> Iterator[tuple[str, str, bytes]]:
        """Read objects ``(space, hash)`` from the far store, as ``(space, hash, bytes)``.
        ``session`` names the session they belong to, whose log may hold them until its
        writer checkpoints. The caller verifies every hash."""

    @abstractmethod
    def session_header(self, session_id: str) -> dict[str, Any] | None:
        """The header of the session the far store holds under this id, or None: what a
        sender checks before it sends anything, so a push of another session under a
        held id is refused with the far store left exactly as it was."""

    @abstractmethod
    def session_view(self, session_id: str) -> SessionView:
        """The session as last committed there (:class:`NoSuchSessionError` if absent)."""

    @abstractmethod
    def push(self, request: PushRequest) -> Admission:
        """Admit a pushed closure and take the head and ref steps (RFC 0002's receive)."""

    @abstractmethod
    def declare_record(self, session_id: str, *, head: str | None) -> DeclareResult:
        """Make the far store the record of a session it holds as a mirror, if its head
        is ``head`` (:class:`HeadMovedError` otherwise)."""

    @abstractmethod
    def release_record(self, session_id: str, *, head: str | None) -> DeclareResult:
        """Have the far store give up the record mark (a take-back), if it holds the
        mark (:class:`NotRecordError` otherwise: the record is elsewhere) and its head
        is ``head`` (:class:`HeadMovedError` otherwise); committed before it returns.
        The answer's ``mark`` is what the caller believes: ``mirror`` once released."""

    @abstractmethod
    def get_ref(self, name: str) -> str | None:
        """The session the far store's ref ``name`` names, or None when it has none."""

    def close(self) -> None:
        """Let go of whatever the transport holds open."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- naming remotes --------------------------------------------------------------


def remote_url(remote: str | os.PathLike) -> str:
    """The normalised URL of a remote given as a path or a ``file://`` URL:
    ``file://`` and the percent-encoded real path, so two spellings of one
    directory (relative, through a symlink, percent-encoded) are one remote.

    A URL's percent-escapes decode to the path's exact bytes (a name that is not
    UTF-8 included), and a URL carrying a query or a fragment is refused rather
    than cut short there: a literal ``#`` or ``?`` in a ``file://`` URL would
    otherwise silently name another directory (RFC 8089 wants them encoded)."""
    text = os.fspath(remote)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "://" in text or text.lower().startswith("file:/"):
        parts = urlsplit(text)
        if parts.scheme != "file":
            raise TransportError(
                f"remote {text!r}: no transport for {parts.scheme}:// here; a remote is a store's path or a file:// URL"
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


def remote_key(url: str) -> str:
    """The directory name of a remote's remembered state: 32 hex digits of the SHA-256
    of its normalised URL (the URL itself is written beside it)."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:32]


def open_transport(remote: str | os.PathLike, **kwargs: Any) -> Transport:
    """A transport to ``remote``: a path or a ``file://`` URL (:class:`LocalTransport`).
    Other schemes are refused with :class:`TransportError` until a transport exists."""
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

    def __init__(self, remote: str | os.PathLike, *, sync: str = "always"):
        self.url = remote_url(remote)
        self.root = url_path(self.url)
        self._sync = sync
        self._endpoint: StoreEndpoint | None = None

    def _serve(self) -> StoreEndpoint:
        if self._endpoint is None:
            from ..store.core import Store
            from .operations import StoreEndpoint

            try:
                store = Store(self.root, sync=self._sync)
            except LayoutError as exc:
                raise TransportError(f"remote {self.url}: {exc}") from None
            except NotADirectoryError:
                raise TransportError(f"remote {self.url}: not a directory, so no store") from None
            self._endpoint = StoreEndpoint(store, own_store=True)
        return self._endpoint

    def is_store(self, root: str) -> bool:
        try:
            return os.path.samefile(self.root, root)
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


# -- what a store remembers of its remotes ------------------------------------------


@dataclass
class RemoteState:
    """What a store remembers of one session at one remote.

    ``head`` is the remote head this store's line is known to contain (the
    expected value of the next push's compare-and-swap); ``pushed`` how many
    of this store's own entries, in its log order, the remote is known to
    hold, ``last`` the id of the last of them (so a log that changed is
    noticed); ``ident`` the session's incarnation (``refs.header_ident``),
    so a session deleted and created again under its id starts afresh.
    """

    session: str
    ident: str
    head: str | None
    pushed: int = 0
    last: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"head": self.head, "ident": self.ident, "last": self.last, "pushed": self.pushed, "session": self.session}


class Remembered:
    """The remembered state of one remote in one store: ``remotes/<key>/`` holds
    ``remote`` (the URL), ``sessions/<id>`` (a :class:`RemoteState`) and
    ``refs/<file>`` (the session a ref named there when last seen). Each file is
    canonical JSON and LF, replaced atomically and durably; a file that does not
    read is treated as absent, since all of it is a hint a push re-learns."""

    def __init__(self, store: Store, url: str):
        self.store = store
        self.url = url
        self.dir = os.path.join(store.root, "remotes", remote_key(url))

    def _read(self, path: str) -> dict[str, Any] | None:
        try:
            with open(path, "rb") as f:
                data = loads(f.read().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, AgentSessionError):
            return None
        return data if isinstance(data, dict) else None

    def _write(self, path: str, data: dict[str, Any]) -> None:
        if self.store.readonly:
            return
        self._ensure(os.path.dirname(path))
        write_atomic(path, canonical_bytes(data) + b"\n", durable=True, tmp_dir=os.path.join(self.store.root, "tmp"))

    def _ensure(self, directory: str) -> None:
        """Make ``remotes/<key>/`` and ``directory`` (each new one fsynced into its
        parent) and the ``remote`` file naming the URL."""
        for d in (os.path.join(self.store.root, "remotes"), self.dir, directory):
            if not os.path.isdir(d):
                os.makedirs(d, exist_ok=True)
                fsync_dir(os.path.dirname(d))
        url_file = os.path.join(self.dir, "remote")
        if not os.path.exists(url_file):
            write_atomic(url_file, canonical_bytes({"url": self.url}) + b"\n", durable=True,
                         tmp_dir=os.path.join(self.store.root, "tmp"))

    def get(self, session_id: str, ident: str) -> RemoteState | None:
        """The state remembered for ``session_id``, if it is of the incarnation ``ident``."""
        data = self._read(os.path.join(self.dir, "sessions", check_session_id(session_id)))
        if data is None or data.get("session") != session_id or data.get("ident") != ident:
            return None
        head, last, pushed = data.get("head"), data.get("last"), data.get("pushed")
        if head is not None and not is_hash(head):
            return None
        if last is not None and not is_hash(last):
            return None
        if not isinstance(pushed, int) or isinstance(pushed, bool) or pushed < 0:
            return None
        return RemoteState(session_id, ident, head, pushed, last)

    def set(self, state: RemoteState) -> None:
        self._write(os.path.join(self.dir, "sessions", check_session_id(state.session)), state.as_dict())

    def get_ref(self, name: str) -> str | None:
        data = self._read(os.path.join(self.dir, "refs", ref_file_name(name)))
        if data is None or data.get("name") != name:
            return None
        session = data.get("session")
        return session if isinstance(session, str) else None

    def set_ref(self, name: str, session: str | None) -> None:
        check_ref_name(name)
        path = os.path.join(self.dir, "refs", ref_file_name(name))
        if session is None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            fsync_dir(os.path.dirname(path))
            return
        self._write(path, {"name": name, "session": session})


def check_space(space: object) -> str:
    if space not in SPACES:
        raise StoreError(f"unknown object space {space!r}: one of {', '.join(SPACES)}")
    return space  # type: ignore[return-value]
