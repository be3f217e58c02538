"""How one store reaches another for exchange: the :class:`Transport` interface and what crosses it.

Exchange (RFC 0002 "Exchange between stores") is written once, in
:mod:`.operations`, against :class:`Transport`. A transport is the far store
as the near one sees it, in the calls RFC 0003 defines over HTTP:

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

:class:`~.local.LocalTransport` reaches a store this process can open (a
directory, a ``file://`` URL, a named ``memory:`` store) and serves each call
through :class:`~.endpoint.StoreEndpoint`, the receiving rules, exactly as a
server would.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any

from ..backends.base import SPACES, Space
from ..errors import TransportError, unknown_object_space
from ..lean import dataclass

if TYPE_CHECKING:
    from ..store.store import Store

__all__ = [
    "SPACES",
    "Admission",
    "DeclareResult",
    "PushRequest",
    "RefPush",
    "RefResult",
    "SessionView",
    "Transport",
    "check_served_session",
    "check_space",
]


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

    def is_store(self, store: Store) -> bool:
        """True when the far store is ``store`` itself (pushing to oneself is refused)."""
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

    def close(self) -> None:  # noqa: B027 - a hook: a transport may hold nothing open
        """Let go of whatever the transport holds open."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_space(space: object) -> Space:
    if space not in SPACES:
        raise unknown_object_space(space, SPACES)
    return space


def check_served_session(url: str, session_id: str, header: Mapping[str, Any]) -> None:
    """TransportError unless ``header`` (what the remote at ``url`` served as
    ``session_id``'s) is that session's: an answer about another session (a broken router
    or proxy, a hostile remote) is refused before anything of it is used or remembered."""
    served = header.get("id")
    if served != session_id:
        shown = served if isinstance(served, str) and len(served) <= 200 else type(served).__name__
        raise TransportError(
            f"the remote {url} answered about session {shown!r} when asked for {session_id}: "
            "its answer is refused and nothing of it is used"
        )
