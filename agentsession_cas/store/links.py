"""Links checked against the store, and chains of continuation (RFC 0001 ``link``,
RFC 0002 Sessions, RFC 0003 Continue): what needs another session's header.

The rules are rows of the one table (``link-parent``, ``link-fork``; scope
``store``); this module applies them for ``verify ID`` and ``fsck --deep``
(through :func:`agentsession_cas.maintenance.check.verify_stored`). A link to a
session the store does not hold passes: a subsession link is written before the
child exists, so a missing child is one that never started (RFC 0001 link).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any

from ..errors import AgentSessionError, BadArgumentError, ContinuationError, NoSuchSessionError, Problem, quoted
from ..format.entry import Entry, Header, short_id
from ..format.links import REL_FORK_OF, REL_SUBSESSION, CalleeLink, callees, judges
from ..lean import dataclass

if TYPE_CHECKING:
    from .session import Session
    from .store import Store

__all__ = ["Chain", "CHAIN_LIMIT", "HeldCallee", "callees_held", "check_links", "judges_held", "resolve_current"]

#: How many continuations :func:`resolve_current` follows before it gives up: a chain
#: longer than this is taken as damage (a store cannot tell it from a cycle it has not
#: closed yet), as the reference bounds its walks of forks.
CHAIN_LIMIT = 64


def _header_or_none(store: Store, session_id: str) -> Header | None:
    """The header of a session the store holds, None when it holds none; a header
    that cannot be read raises (the caller reports it)."""
    if session_id not in store:
        return None
    try:
        return store.header(session_id)
    except NoSuchSessionError:
        return None


def check_links(store: Store, header: Header, own: Sequence[Entry]) -> list[Problem]:
    """Every link among a session's own entries checked against the session it names,
    where the store holds it: a subsession's header names this session as its
    ``parent_session`` and the link's call as ``spawned_by`` (``link-parent``); a
    ``fork_of`` origin holds this fork's base (``link-fork``). A link on a fork's prefix
    is the origin's, checked there. A named session that cannot be read is reported
    under the same code, since the link cannot be checked."""
    from ..format.codes import problem  # (the rules' table: for verify, not for head or list)

    out: list[Problem] = []
    for e in own:
        if e.type != "link" or not isinstance(e.get("session"), str):
            continue
        rel, target = e.get("rel"), e.get("session")
        where = f"link {short_id(e.id)} -> {rel} {target}"
        if rel == REL_SUBSESSION:
            try:
                child = _header_or_none(store, target)
            except AgentSessionError as exc:
                out.append(problem(e.line, "link-parent", f"{where}: its header cannot be read ({exc})", e.id))
                continue
            if child is None:
                continue  # the child never started (RFC 0001 link): nothing to disagree with
            wrong = []
            if child.data.get("parent_session") != header.id:
                wrong.append(f"its parent_session is {_shown(child.data.get('parent_session'))}, not {header.id}")
            if e.get("call_id") is not None and child.data.get("spawned_by") != e.get("call_id"):
                wrong.append(f"its spawned_by is {_shown(child.data.get('spawned_by'))}, not the link's call {e.get('call_id')}")
            if wrong:
                out.append(problem(e.line, "link-parent", f"{where}: " + "; ".join(wrong), e.id))
        elif rel == REL_FORK_OF and header.base is not None and target in store:
            try:
                holds = _holds(store, target, header.base)
            except AgentSessionError as exc:
                out.append(problem(e.line, "link-fork", f"{where}: that session cannot be read ({exc})", e.id))
                continue
            if not holds:
                out.append(problem(e.line, "link-fork", f"{where}: that session does not hold this fork's base "
                                                         f"{short_id(header.base)} (in its own entries or on its prefix)", e.id))
    return out


def _shown(value: Any) -> str:
    return "absent" if value is None else str(value)


def _holds(store: Store, session_id: str, entry_id: str) -> bool:
    """Whether a session holds an entry: among its own entries, its base, or above it."""
    try:
        s = store.read(session_id)
    except NoSuchSessionError:
        return False
    try:
        return entry_id in s or entry_id == s.base or entry_id in s.prefix_set
    finally:
        s.close()


# ---------------------------------------------------------------------------
# continuation


@dataclass
class Chain:
    """Where a chain of continuations ends: ``chain`` the sessions followed, the first
    named and the ``current`` last; ``missing`` the successor the last link names when
    this store does not hold it."""

    current: str
    chain: list[str] = field(default_factory=list)
    missing: str | None = None

    @property
    def moved(self) -> bool:
        """At least one continuation was followed."""
        return len(self.chain) > 1

    def as_dict(self) -> dict[str, Any]:
        return {"current": self.current, "chain": self.chain, "missing": self.missing}


def resolve_current(store: Store, session_id: str, *, limit: int = CHAIN_LIMIT) -> Chain:
    """The current session of the chain ``session_id`` starts: its ``continued_in``
    links followed to a session that was not continued. Raises
    :class:`ContinuationError` for a cycle, or a chain longer than ``limit`` links (a whole
    number, 0 or more: anything else is :class:`BadArgumentError`)."""
    if limit.__class__ is not int or limit < 0:
        raise BadArgumentError(f"limit is a whole number of links, 0 or more, not {quoted(limit)}")
    chain = [session_id]
    seen = {session_id}
    current = session_id
    while True:
        s = store.read(current)
        try:
            nxt = s.superseded_by
        finally:
            s.close()
        if nxt is None:
            return Chain(current, chain)
        if nxt in seen:
            raise ContinuationError(f"the continuations from {session_id} form a cycle: {' -> '.join(chain + [nxt])}")
        if len(chain) > limit:
            raise ContinuationError(f"the continuations from {session_id} run past {limit} sessions; "
                                    "a chain that long is taken as damage")
        if nxt not in store:
            return Chain(current, chain, missing=nxt)
        chain.append(nxt)
        seen.add(nxt)
        current = nxt


# ---------------------------------------------------------------------------
# callees and judges of a stored session


@dataclass(frozen=True)
class HeldCallee:
    """A callee link and whether this store holds the session it names."""

    callee: CalleeLink
    held: bool

    def as_dict(self) -> dict[str, Any]:
        return {**self.callee.as_dict(), "held": self.held}


def _path(session: Session, leaf: str | None) -> list[Entry]:
    at = session.head if leaf is None else leaf
    return [] if at is None else session.store.path_to(at)


def callees_held(session: Session, *, leaf: str | None = None, call_id: str | None = None) -> list[HeldCallee]:
    """The sessions the calls on the path to ``leaf`` (the head by default) spawned or
    reached (:func:`~agentsession_cas.format.links.callees`), each said held or not."""
    return [HeldCallee(c, c.session in session.store) for c in callees(_path(session, leaf), call_id)]


def judges_held(session: Session, *, leaf: str | None = None, target: str | None = None) -> list[dict[str, Any]]:
    """The judges of the path to ``leaf`` (the head by default; only those of entry
    ``target`` when given): each ``judged_by`` link with the session it names, the
    entry judged, whether the store holds that session and the ``outcome`` entries in
    it whose ``target`` is the entry judged."""
    out: list[dict[str, Any]] = []
    store = session.store
    for link in judges(_path(session, leaf), target):
        judge, judged = link.get("session"), link.get("target")
        held = judge in store
        outcomes: list[str] = []
        if held and judged is not None:
            j = store.read(judge)
            try:
                outcomes = [e.id for e in j if e.type == "outcome" and e.get("target") == judged]
            finally:
                j.close()
        out.append({"link": link.id, "session": judge, "target": judged, "held": held, "outcomes": outcomes})
    return out
