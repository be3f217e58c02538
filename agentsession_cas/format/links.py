"""Sessions that refer to sessions (RFC 0001 ``link``, header ``parent_session``,
``spawned_by``): the relations, derived subsession ids, link constructors, and the
queries a reader asks of a path (the callees of its calls, the judges of its entries,
the successor a session was continued in).

Everything here reads one session alone. What needs the other session's header (a
child naming this parent and call, an origin holding a fork's base) is the store's,
in :mod:`agentsession_cas.store.links`; a file's verify notes that it was not checked.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import EntryError, Problem
from ..lean import dataclass
from .entry import Entry, Header, short_id

__all__ = [
    "CalleeLink",
    "LINK_RELS",
    "REL_CONTINUED_IN",
    "REL_FORK_OF",
    "REL_JUDGED_BY",
    "REL_PEER",
    "REL_SUBSESSION",
    "callees",
    "continued_in_link",
    "derivation_attempt",
    "derived_note",
    "fork_of_link",
    "judged_by_link",
    "judges",
    "link_entry",
    "link_notes",
    "nil_uuid5",
    "own_entries",
    "render_links",
    "store_note",
    "peer_link",
    "subsession_id",
    "subsession_link",
    "successor_of",
]

#: The relations RFC 0001 names for a ``link``.
REL_SUBSESSION = "subsession"
REL_FORK_OF = "fork_of"
REL_CONTINUED_IN = "continued_in"
#: The reference library's two further relations: a judged session names its judge's
#: session (``judged_by``, with the judged entry as ``target``), and a callee whose work
#: outlives the call that reached it (``peer``).
REL_JUDGED_BY = "judged_by"
REL_PEER = "peer"
LINK_RELS = (REL_SUBSESSION, REL_FORK_OF, REL_CONTINUED_IN, REL_JUDGED_BY, REL_PEER)

#: RFC 0001 derives a subsession's id as a UUIDv5 under the nil namespace.
_NIL = uuid.UUID(int=0)


def nil_uuid5(name: str) -> str:
    """A UUIDv5 under the nil namespace: how the format derives a session's id from
    another's (a subsession's, a redacted session's)."""
    return str(uuid.uuid5(_NIL, name))


def subsession_id(parent_session: str, call_id: str, attempt: int = 0) -> str:
    """The id RFC 0001 recommends for the subsession the call ``call_id`` of session
    ``parent_session`` spawned: a UUIDv5 under the nil namespace over
    ``<parent>/<call_id>``, or ``<parent>/<call_id>/<n>`` for the n-th retry (n >= 1)."""
    if not isinstance(parent_session, str) or not parent_session:
        raise EntryError("a subsession's id derives from its parent's session id, which is empty")
    if not isinstance(call_id, str) or not call_id:
        raise EntryError("a subsession's id derives from a call_id, which is never empty (RFC 0001 item)")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise EntryError(f"attempt {attempt!r} is not a whole number from 0")
    name = f"{parent_session}/{call_id}" if attempt == 0 else f"{parent_session}/{call_id}/{attempt}"
    return nil_uuid5(name)


def derivation_attempt(child: str, parent_session: str, call_id: str, attempts: int) -> int | None:
    """The attempt (0 for the first) whose derived id ``child`` is, among the first
    ``attempts`` (at least one); None when it is none of them."""
    if not parent_session or not call_id:
        return None
    for n in range(max(1, attempts)):
        if subsession_id(parent_session, call_id, n) == child:
            return n
    return None


# ---------------------------------------------------------------------------
# constructors: the bodies of link entries (append them, or pass to make_entry)


def link_entry(rel: str, session: str, *, call_id: str | None = None, target: str | None = None, **extra: Any) -> dict[str, Any]:
    """A ``link`` entry's body: ``rel`` and the ``session`` it names, and the ``call_id``
    and ``target`` when given. ``parent`` and ``ts`` are the append's to fill."""
    if not isinstance(rel, str) or not rel:
        raise EntryError("a link carries its relation, rel, as a non-empty string (RFC 0001 link)")
    if not isinstance(session, str) or not session:
        raise EntryError(f"a {rel} link names a session: give its id")
    body: dict[str, Any] = {"type": "link", "rel": rel, "session": session}
    if call_id is not None:
        if not isinstance(call_id, str) or not call_id:
            raise EntryError("a link's call_id is never empty (RFC 0001 item)")
        body["call_id"] = call_id
    if target is not None:
        body["target"] = target
    body.update(extra)
    return body


def subsession_link(session: str, call_id: str) -> dict[str, Any]:
    """The link a parent writes when it dispatches the call ``call_id`` that spawns
    ``session`` (RFC 0001 link: before the dispatch, before the child exists)."""
    if not call_id:
        raise EntryError("a subsession link names the call that spawned the child: give its call_id")
    return link_entry(REL_SUBSESSION, session, call_id=call_id)


def fork_of_link(origin: str) -> dict[str, Any]:
    """The link a fork writes naming the session it was made from (RFC 0001 Header,
    ``parent_session``: the header may name either session when the base lies on
    another fork's prefix; this link names the one)."""
    return link_entry(REL_FORK_OF, origin)


def continued_in_link(successor: str) -> dict[str, Any]:
    """The link that retires a session in favour of ``successor`` (RFC 0003 Continue):
    once held, a store refuses further appends to the session."""
    return link_entry(REL_CONTINUED_IN, successor)


def judged_by_link(judge: str, target: str | None = None) -> dict[str, Any]:
    """The link a judged session writes naming its judge's session, with the entry
    judged (the one the judge's ``outcome`` targets) when there is one."""
    return link_entry(REL_JUDGED_BY, judge, target=target)


def peer_link(call_id: str, session: str) -> dict[str, Any]:
    """The link for a callee whose work outlives the call ``call_id`` and keeps its own
    record (``session``)."""
    return link_entry(REL_PEER, session, call_id=call_id)


# ---------------------------------------------------------------------------
# queries over a path or a session's entries


def _links(entries: Iterable[Entry], rels: Sequence[str]) -> list[Entry]:
    return [e for e in entries if e.type == "link" and e.get("rel") in rels and isinstance(e.get("session"), str)]


def successor_of(entries: Iterable[Entry]) -> str | None:
    """The successor a session was continued in: the session its last ``continued_in``
    link names (entries in file or log order), or None when it was not continued."""
    found = _links(entries, (REL_CONTINUED_IN,))
    return found[-1].get("session") if found else None


@dataclass(frozen=True, slots=True)
class CalleeLink:
    """A session a call on the path reached: the ``link`` entry, its relation
    (``subsession`` or ``peer``), the session it names, the call, the item entry of
    that ``function_call`` on the path (None when the path holds none) and the
    ``dispatch`` of the call that the link belongs to (the first after the link, or
    else the last before it; None when the path records none)."""

    link: str
    rel: str
    session: str
    call_id: str | None
    call: str | None
    dispatch: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"link": self.link, "rel": self.rel, "session": self.session, "call_id": self.call_id,
                "call": self.call, "dispatch": self.dispatch}


def _call_id_of(e: Entry) -> str | None:
    item = e.get("item")
    if e.type == "item" and isinstance(item, dict) and item.get("type") == "function_call":
        cid = item.get("call_id")
        return cid if isinstance(cid, str) else None
    return None


def callees(path: Sequence[Entry], call_id: str | None = None) -> list[CalleeLink]:
    """The sessions the calls on a root-first path spawned or reached: every
    ``subsession`` and ``peer`` link on it, in path order (only those of ``call_id``
    when given). A link carrying ``cancel_sent`` is a notice about another link, not
    a callee, and is passed over."""
    calls: dict[str, str] = {}
    dispatches: list[tuple[int, str, str]] = []
    for i, e in enumerate(path):
        cid = _call_id_of(e)
        if cid is not None:
            calls.setdefault(cid, e.id)
        elif e.type == "dispatch" and isinstance(e.get("call_id"), str):
            dispatches.append((i, e.get("call_id"), e.id))
    out: list[CalleeLink] = []
    for i, e in enumerate(path):
        if e.type != "link" or e.get("rel") not in (REL_SUBSESSION, REL_PEER) or "cancel_sent" in e.data:
            continue
        session, cid = e.get("session"), e.get("call_id")
        if not isinstance(session, str) or (call_id is not None and cid != call_id):
            continue
        cid = cid if isinstance(cid, str) else None
        after = [d for j, c, d in dispatches if c == cid and j > i]
        before = [d for j, c, d in dispatches if c == cid and j < i]
        dispatch = after[0] if after else before[-1] if before else None
        out.append(CalleeLink(e.id, e.get("rel"), session, cid, calls.get(cid) if cid else None, dispatch))
    return out


def judges(path: Sequence[Entry], target: str | None = None) -> list[Entry]:
    """The ``judged_by`` links on a root-first path, in path order: the sessions that
    judged what the path holds, each naming the entry judged in ``target`` when its
    writer named one. With ``target``, only the judges of that entry."""
    found = _links(path, (REL_JUDGED_BY,))
    return found if target is None else [e for e in found if e.get("target") == target]


# ---------------------------------------------------------------------------
# what a file alone can check


def own_entries(header: Header, entries: Sequence[Entry]) -> list[Entry]:
    """The entries a session appended itself: those after its base (every entry when
    the header names no base; none when the file does not hold its base, as the rule
    set reads a file: every entry until the base has come is on the prefix)."""
    base = header.base
    if base is None:
        return list(entries)
    for i, e in enumerate(entries):
        if e.id == base:
            return list(entries[i + 1:])
    return []


def derived_note(header: Header, link: Entry, earlier: Sequence[Entry]) -> Problem | None:
    """The ``link-derived`` note for a ``link`` entry that follows ``earlier`` own links:
    a subsession link whose session is not an id RFC 0001 recommends deriving. The
    k-th subsession link of a call may name attempt 0 to k-1 (a retry is the next
    attempt). None when the link is not a subsession link or its id derives."""
    # The rules' table is loaded where a link is checked, not by head or list, which
    # import this module with the store.
    from .codes import problem

    cid = link.get("call_id")
    session = link.get("session")
    if (link.get("rel") != REL_SUBSESSION or not isinstance(cid, str) or not cid or not isinstance(session, str)
            or not isinstance(header.id, str)):
        return None
    k = 1 + sum(1 for e in earlier if e.get("rel") == REL_SUBSESSION and e.get("call_id") == cid)
    if derivation_attempt(session, header.id, cid, k) is not None:
        return None
    return problem(
        link.line, "link-derived",
        f"link {short_id(link.id)}: subsession {session} of call {cid} is not the UUIDv5 of "
        f"{header.id}/{cid}[/n] RFC 0001 recommends, so a reader cannot find it from the call alone",
        link.id,
    )


def store_note(links: Sequence[Entry]) -> list[Problem]:
    """The ``link-store`` note, once for a file whose own entries link other sessions."""
    from .codes import problem

    named = [e for e in links if e.type == "link" and e.get("rel") in LINK_RELS and isinstance(e.get("session"), str)]
    if not named:
        return []
    return [problem(
        None, "link-store",
        f"{len(named)} link(s) name other sessions; a file names no store, so the sessions they name are "
        "checked against their headers only by verify of a stored session",
    )]


def link_notes(header: Header, own: Sequence[Entry]) -> list[Problem]:
    """What verify of a file says about the links among its own entries (the prefix
    excluded: its links are the origin's): each :func:`derived_note`, then the
    :func:`store_note`. :class:`~agentsession_cas.format.rules.SessionChecker` says
    the same one entry at a time."""
    links = [e for e in own if e.type == "link"]
    out: list[Problem] = []
    for i, e in enumerate(links):
        found = derived_note(header, e, links[:i])
        if found is not None:
            out.append(found)
    return out + store_note(links)


def render_links(found_callees: Sequence[CalleeLink], found_judges: Sequence[Entry],
                 held: Callable[[str], bool] | None = None) -> list[str]:
    """The lines ``show --runs`` prints after the runs: the callees of the path's calls
    and the judges of its entries. ``held`` says whether a store holds a session (a
    file names no store: None leaves it unsaid)."""
    def where(session: str) -> str:
        if held is None:
            return ""
        return "" if held(session) else "  (not in this store: never started, or kept elsewhere)"

    out = [f"callees on the path: {len(found_callees)}"]
    for c in found_callees:
        line = f"  {c.call_id or '-'} -> {c.rel} {c.session}  link {short_id(c.link)}"
        if c.call is not None:
            line += f", call {short_id(c.call)}"
        if c.dispatch is not None:
            line += f", dispatch {short_id(c.dispatch)}"
        out.append(line + where(c.session))
    out.append(f"judges on the path: {len(found_judges)}")
    for j in found_judges:
        target = j.get("target")
        line = f"  {j.get('session')}" + (f" judging {short_id(target)}" if isinstance(target, str) else " judging the session")
        out.append(line + f"  link {short_id(j.id)}" + where(j.get("session")))
    return out
