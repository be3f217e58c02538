"""Exchange between stores (RFC 0002): push, fetch, handover, declare-record, take-back.

A session moves between stores as a **push** (initiated by the sender, who
must be the session's record) or a **fetch** (initiated by the receiver;
any holder serves it). Both carry the session's closure: its own entries
and their contents, its prefix and theirs, and the sidecar blobs they name.
The receiver admits objects as an append does (every hash recomputed, the
entry rules checked, parents before children), merges the logs as a set,
and only then takes the second step, the head, by compare-and-swap; a
wrong expectation leaves the entries in the log as a branch and says the
head did not move. Everything the receiver admits, and a mark it sets, is
committed before it answers.

The two sides are written apart so a network transport can sit between
them (:mod:`agentsession_cas.transport`): the sender's logic is
:func:`push`, :func:`fetch`, :func:`take_back` and :func:`declare_record`;
the receiver's rules are :class:`StoreEndpoint`, which a local transport
calls in process and a server would call per request.

A sender remembers, per remote and session, the remote head its line
contains and how much of its log the remote holds
(:class:`~agentsession_cas.transport.Remembered`), so an incremental push
names, reads and sends only what is new, and its compare-and-swap expects
the head it last saw there. ``docs/exchange.md`` gives the rules and the
decisions taken where the RFC is silent.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import field, replace
from typing import Any

from ..backends.base import SPACES
from ..errors import (
    AgentSessionError,
    BadObjectError,
    CorruptObjectError,
    CorruptPackError,
    HandoverIncompleteError,
    HeaderDiffersError,
    HeadMovedError,
    IncompletePushError,
    MissingObjectsError,
    NoSuchObjectError,
    NoSuchSessionError,
    NotRecordError,
    ReadOnlyError,
    RefMovedError,
    SessionLockedError,
    StoreError,
    TransportError,
)
from ..format.entry import Header, kept_member_note
from ..format.hashing import envelope_content, sha256_ref
from ..format.media import sidecar_names
from ..format.names import check_session_id
from ..format.rules import gc_paused
from ..lean import dataclass
from ..store.refs import Refs, check_ref_name, header_ident
from ..store.session import Session, expected_head_given
from ..store.store import Store
from .endpoint import UNSET, StoreEndpoint
from .local import open_transport
from .remembered import Remembered, RemoteState
from .transport import (
    Admission,
    DeclareResult,
    PushRequest,
    RefPush,
    RefResult,
    SessionView,
    Transport,
    check_served_session,
)

__all__ = [
    "UNSET",
    "ExchangeResult",
    "StoreEndpoint",
    "declare_record",
    "fetch",
    "handover",
    "push",
    "take_back",
]

#: Bytes of objects a push keeps in memory between reading them (to learn the
#: closure) and sending them (each let go of as it is sent); past this it reads them
#: again, a chunk of entries at a time. Reading all again cost a local push of 100,000
#: entries about 2.5 s of CPU in 19 (an entry at a time, 10 s), so the push keeps them.
SEND_CACHE_BYTES = 256 * 1024 * 1024
#: Entries whose objects a push reads in one bulk read of each space.
_CHUNK = 256


Progress = Callable[[int, int], None]


def _fault(point: str) -> None:
    """A seam between the steps of an exchange, where tests inject a failure (or kill
    the process) to show what an interruption there leaves. Does nothing otherwise.

    Points: ``push:objects-sent`` (objects at the receiver, no log record yet),
    ``push:acknowledged`` (the receiver committed the push, the sender has not yet
    remembered the head it moved),
    ``handover:between`` (the receiver is the record, the sender not yet cleared),
    ``take-back:between`` (this store declared the record, the remote not yet cleared).
    """


# -- the result a sender reports --------------------------------------------------


@dataclass
class ExchangeResult:
    """What a push, fetch, handover or take-back did, from the initiator's side.

    ``objects`` and ``bytes`` are what crossed (sent by a push, received by a
    fetch); ``entries`` the entries that joined the receiving log;
    ``head_before``/``head_after`` the receiving head around the exchange;
    ``outcome`` as :class:`~agentsession_cas.transport.Admission` says
    (``fast-forward``, ``moved``, ``forced``, ``refused``, ``unchanged``,
    ``not-moved``); ``mark`` the receiver's mark after it.
    """

    action: str
    session: str
    remote: str
    objects: int = 0
    bytes: int = 0
    entries: int = 0
    created: bool = False
    head_before: str | None = None
    head_after: str | None = None
    expected: str | None = None
    to: str | None = None
    outcome: str = "unchanged"
    why: str | None = None
    mark: str = "mirror"
    handover: bool = False
    complete: bool = True
    refs: list[RefResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def head_moved(self) -> bool:
        return self.outcome in ("fast-forward", "moved", "forced")

    @property
    def forced(self) -> bool:
        return self.outcome == "forced"

    @property
    def refused(self) -> bool:
        return self.outcome == "refused"

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "session": self.session,
            "remote": self.remote,
            "objects": self.objects,
            "bytes": self.bytes,
            "entries": self.entries,
            "created": self.created,
            "head": {
                "before": self.head_before,
                "after": self.head_after,
                "expected": self.expected,
                "to": self.to,
                "moved": self.head_moved,
                "forced": self.forced,
                "outcome": self.outcome,
                "why": self.why,
            },
            "mark": self.mark,
            "handover": self.handover,
            "complete": self.complete,
            "refs": [r.as_dict() for r in self.refs],
            "notes": list(self.notes),
        }


# -- the initiating side ----------------------------------------------------------------


def _check_expected(expected: Any) -> Any:
    """An expected head as given: UNSET, None (no head), or a full entry id. Anything else
    (a short id, a typo) is refused before anything is sent, rather than posted as an
    expectation no head can meet, which would land the entries as a branch: by the one
    check ``set_head`` makes (:func:`~agentsession_cas.store.session.expected_head_given`,
    ``bad_argument``)."""
    if expected is not UNSET:
        expected_head_given(expected)
    return expected


def _transport(remote: Transport | str | os.PathLike) -> tuple[Transport, bool]:
    if isinstance(remote, Transport):
        return remote, False
    return open_transport(remote), True


def _not_self(store: Store, transport: Transport) -> None:
    if transport.is_store(store):
        raise TransportError(f"the remote {transport.url} is this store itself; exchange is between two stores")


def _sender_session(store: Store, session_id: str, given: Session | None, *, need_write: bool, what: str) -> Session:
    """The session to send: the caller's, else open for writing here (committed before it
    is served), else, when another process is writing it, a snapshot served as that
    writer last committed it (RFC 0002: a sender that cannot commit serves only that)."""
    if given is not None:
        return given
    check_session_id(session_id)
    if store.readonly:
        if need_write:
            raise ReadOnlyError(f"{store.describe()} is open read-only; a {what} changes its mark")
        return store.read(session_id)
    try:
        return store.session(session_id)
    except SessionLockedError:
        if need_write:
            raise SessionLockedError(
                f"session {session_id} is locked by another process; a {what} clears this store's mark, "
                "which needs the session: stop its writer first"
            ) from None
        return store.read(session_id)


def _ref_pushes(
    store: Store, remembered: Remembered, session_id: str, refs: Iterable[str | tuple[str, Any]]
) -> list[RefPush]:
    """The refs to send: each ref here must name the pushed session. The expected value
    at the remote is the one given, else the one last seen there, else absent."""
    out = []
    local = Refs(store)
    for item in refs:
        name, expected = (item, UNSET) if isinstance(item, str) else item
        check_ref_name(name)
        held = local.get(name)
        if held is None:
            raise StoreError(f"no such ref here: {name}; a pushed ref is one this store holds")
        if held.session != session_id:
            raise StoreError(f"ref {name} names session {held.session} here, not the pushed session {session_id}")
        if local.state(held) != "ok":
            raise StoreError(f"ref {name} is dangling here ({local.state(held)}); it is not pushed")
        if expected is UNSET:
            expected = remembered.get_ref(name)
        out.append(RefPush(name, expected, session_id))
    return out


@dataclass
class _Closure:
    """What a push names: objects by space in send order, the bytes read while learning
    them (within a budget), and where to read the rest again."""

    order: list[tuple[str, str]] = field(default_factory=list)
    cache: dict[str, bytes] = field(default_factory=dict)
    content_of: dict[str, str] = field(default_factory=dict)  # content hash -> an entry naming it
    cached_bytes: int = 0


def _closure(store: Store, session: Session, ids: Iterable[str]) -> _Closure:
    out = _Closure()
    seen: set[str] = set()

    def add(space: str, name: str, data: bytes | None) -> None:
        if name in seen:
            return
        seen.add(name)
        out.order.append((space, name))
        if data is not None and out.cached_bytes + len(data) <= SEND_CACHE_BYTES:
            out.cache[name] = data
            out.cached_bytes += len(data)

    listed = list(ids)
    for at in range(0, len(listed), _CHUNK):
        chunk = listed[at : at + _CHUNK]
        for entry_id, (chash, content, env) in zip(chunk, session.exchange_objects_many(chunk)):
            out.content_of.setdefault(chash, entry_id)
            add("contents", chash, content)
            if b"sidecar:" in content:
                for blob in sidecar_names(content):
                    if not store.objects.exists("blobs", blob):
                        raise StoreError(
                            f"session {session.id} names sidecar blob {blob}, which this store lacks; "
                            "a session with an unresolved blob cannot be pushed until the blob arrives"
                        )
                    add("blobs", blob, None)
            add("entries", entry_id, env)
    return out


def _send(
    store: Store, session: Session, transport: Transport, closure: _Closure, lacking: Mapping[str, Iterable[str]],
    progress: Progress | None,
) -> tuple[int, int]:
    """Send the objects the receiver lacks, in closure order; (count, bytes)."""
    want = {(space, name) for space, names in lacking.items() for name in names}
    todo = [(space, name) for space, name in closure.order if (space, name) in want]
    total = len(todo)
    sent = [0, 0]

    def reread(chunk: list[tuple[str, str]]) -> dict[str, bytes]:
        """The objects of ``chunk`` the cache let go of, read again in bulk: the entries
        they belong to, a chunk at a time (:meth:`Session.exchange_objects_many`)."""
        owners = list(dict.fromkeys(
            name if space == "entries" else closure.content_of[name]
            for space, name in chunk if space != "blobs" and name not in closure.cache
        ))
        got: dict[str, bytes] = {}
        for entry_id, (chash, content, env) in zip(owners, session.exchange_objects_many(owners) if owners else ()):
            got[entry_id] = env
            got[chash] = content
        return got

    def items() -> Iterator[tuple[str, str, bytes]]:
        cache = closure.cache
        for at in range(0, len(todo), 2 * _CHUNK):
            chunk = todo[at : at + 2 * _CHUNK]
            again = reread(chunk)
            for space, name in chunk:
                # Taken, not looked at: what is sent is let go, so the receiver's copy of it
                # (a transport in this process keeps what it is sent) replaces it rather
                # than adding to it, and the two hold about one closure between them.
                data = cache.pop(name, None)
                if data is None:
                    data = store.objects.get("blobs", name) if space == "blobs" else again[name]
                sent[0] += 1
                sent[1] += len(data)
                if progress is not None:
                    progress(sent[0], total)
                yield space, name, data

    if total:
        transport.put_objects(items(), total)
    return sent[0], sent[1]


def push(
    store: Store,
    remote: Transport | str | os.PathLike,
    session_id: str,
    *,
    expected: Any = UNSET,
    force: bool = False,
    handover: bool = False,
    refs: Iterable[str | tuple[str, Any]] = (),
    progress: Progress | None = None,
    session: Session | None = None,
) -> ExchangeResult:
    """Push a session this store is the record of to ``remote`` (a transport, a path
    or a ``file://`` URL).

    Only what the remote lacks is sent: the objects of the own entries it is
    not known to hold (the prefix too on a first push), as the remote itself
    reports them. The head moves by compare-and-swap from ``expected``: by
    default the remote head this store last saw there, or, the first time, the
    head a session the remote creates would have (its base, or none). ``force``
    moves it whatever it is, and is reported as forced. ``handover`` makes the
    remote the record and this store a mirror, in that order. ``refs`` names
    refs of this store naming the session, each as a name or ``(name,
    expected at the remote)``; ``progress(done, total)`` is called per object
    sent. ``session`` is the caller's open session (a recorder's).
    """
    expected = _check_expected(expected)
    transport, owned = _transport(remote)
    try:
        with gc_paused():  # a bulk pass: many acyclic objects per entry (see gc_paused)
            return _push(store, transport, session_id, expected=expected, force=force, handover=handover,
                         refs=refs, progress=progress, session=session)
    finally:
        if owned:
            transport.close()


def handover(store: Store, remote: Transport | str | os.PathLike, session_id: str, **kwargs: Any) -> ExchangeResult:
    """A push that makes the remote the record and then this store a mirror (RFC 0002):
    the remote's mark is committed before this store clears its own, so a failure
    between the two leaves two records and never none; running it again finishes."""
    return push(store, remote, session_id, handover=True, **kwargs)


def _held_there(transport: Transport, session_id: str, entries: Sequence[str]) -> int:
    """How many of ``entries`` (this log's order) the remote's log holds as its own first
    entries, read from its committed view: for a push to a remote that holds the session
    when this store remembers nothing of it (a new clone, the remote's URL spelled
    otherwise), so that only the rest is sent, not the whole closure (every object of a
    100,000-entry session asked after). 0 when its log is not a prefix of this one."""
    try:
        there = _served_view(transport, session_id).entries
    except NoSuchSessionError:
        return 0
    n = len(there)
    return n if 0 < n <= len(entries) and list(entries[:n]) == list(there) else 0


def _push(
    store: Store, transport: Transport, session_id: str, *, expected: Any, force: bool, handover: bool,
    refs: Iterable[str | tuple[str, Any]], progress: Progress | None, session: Session | None,
) -> ExchangeResult:
    _not_self(store, transport)
    what = "handover" if handover else "push"
    sess = _sender_session(store, session_id, session, need_write=handover, what=what)
    entries, head, mark = sess.exchange_view()
    if mark != "record":
        raise NotRecordError(
            f"this store holds session {session_id} as a mirror; only its record may push it "
            "(take it back, or declare-record if its record is gone)"
        )
    if handover and not sess.writable:
        raise ReadOnlyError(f"session {session_id} is open read-only here; a handover changes its mark")
    header = dict(sess.header.data)
    ident = header_ident(header)
    there = transport.session_header(session_id)
    if there is not None:
        check_served_session(transport.url, session_id, there)
    if there is not None and header_ident(there) != ident:
        raise HeaderDiffersError(
            f"the remote {transport.url} holds another session under the id {session_id} (the headers differ "
            "apart from 'format'); nothing was sent"
        )
    remembered = Remembered(store, transport.url)
    state = remembered.get(session_id, ident)
    if state is not None and not sess.writable and state.pushed > len(entries) and expected is UNSET and not force:
        # A snapshot of a session another process is writing, behind what that writer has
        # already pushed there: it holds nothing the remote lacks, and its older head must
        # not move the remote's back.
        result = ExchangeResult(what, session_id, transport.url, expected=state.head, to=head,
                                head_before=state.head, head_after=state.head)
        result.notes.append(
            f"this store's writer of session {session_id} (another process) has already pushed {state.pushed} "
            f"entries there, more than the {len(entries)} committed when this command read it: nothing to push"
        )
        return result
    exp = expected if expected is not UNSET else (state.head if state is not None else sess.base)
    held = 0  # how many of this log's first entries the remote holds: only the rest is sent
    if state is not None and there is not None and 0 < state.pushed <= len(entries) and entries[state.pushed - 1] == state.last:
        held = state.pushed
    elif state is None and there is not None:
        held = _held_there(transport, session_id, entries)
    ref_pushes = _ref_pushes(store, remembered, session_id, refs)
    result = ExchangeResult(what, session_id, transport.url, expected=exp, to=head, notes=_kept_notes(sess.header))
    adm = None
    for complete in ([False, True] if held else [True]):
        start = 0 if complete else held
        sent = list(entries[start:])  # (the ids spelled here only: an increment's few)
        ids = (list(sess.prefix) if complete else []) + sent
        closure = _closure(store, sess, ids)
        wanted: dict[str, list[str]] = {space: [] for space in SPACES}
        for space, name in closure.order:
            wanted[space].append(name)
        lacking = transport.missing(wanted)
        n, b = _send(store, sess, transport, closure, lacking, progress)
        result.objects += n
        result.bytes += b
        _fault("push:objects-sent")
        request = PushRequest(
            header=header, prefix=list(sess.prefix) if complete else [], entries=sent,
            to=head, expected=exp, force=force, mark="record" if handover else "mirror",
            refs=ref_pushes, complete=complete,
        )
        try:
            adm = _push_request(store, sess, transport, closure, request, progress, result)
        except IncompletePushError as exc:
            if complete:
                raise
            result.notes.append(f"the remote lacked what the objects sent build on ({exc}); sent the whole closure")
            continue
        result.complete = complete
        break
    assert adm is not None
    result.entries = adm.admitted
    result.created = adm.created
    first = adm
    if (
        adm.outcome == "refused" and expected is UNSET and adm.previous is None and exp is not None
        and (adm.created or adm.mark == "mirror")
    ):
        # The remote no longer held the session (deleted there, or a store put back from
        # an older copy): this push created it, with no head, and the head this store
        # remembers seeing there is stale. Only the head is still to move: from none. Or a
        # push that did so was cut short before that move (a mirror there with no head:
        # only exchange moves a mirror's head, so none is lost).
        if adm.created:
            result.notes.append(
                f"the remote no longer held session {session_id} (this store remembered its head there as {exp}); "
                "created it anew"
            )
        else:
            result.notes.append(
                f"the remote holds session {session_id} with no head (a push that created it there was cut short "
                f"before its head moved; this store remembered the head there as {exp}); moved it from none"
            )
        result.expected = None
        adm = _push_request(store, sess, transport, closure, replace(request, expected=None), progress, result)
    elif (
        adm.outcome == "refused" and expected is UNSET and adm.previous != exp
        and _on_own_line(sess, exp, adm.previous) and _on_own_line(sess, adm.previous, head)
    ):
        # The remote's head is an entry of this store's own line, ahead of the head this
        # store remembers seeing there and behind the one it pushes: a push of its own moved
        # it there and its answer was lost (a crash before the head was remembered). This
        # refusal showed the head; the second compare-and-swap expects it. A head another
        # store moved (its own entries, or back along this line) is not on this path.
        result.notes.append(
            f"the remote's head {adm.previous} is on this store's line past the one remembered there "
            f"({exp or 'none'}): an earlier push whose answer was lost moved it; moved on from there"
        )
        result.expected = adm.previous
        adm = _push_request(store, sess, transport, closure, replace(request, expected=adm.previous), progress, result)
    result.head_before, result.head_after = first.previous, adm.head
    result.outcome, result.why, result.mark, result.refs = adm.outcome, adm.why, adm.mark, adm.refs
    _fault("push:acknowledged")
    _remember_push(remembered, session_id, ident, entries, adm, sess.base)
    for r in adm.refs:
        if r.moved:
            remembered.set_ref(r.name, r.current)
    if handover:
        if adm.mark != "record":
            # RFC 0003: the sender clears its mark only on the receiver's word that its own is
            # committed. Clearing on anything less could leave no record at all.
            raise StoreError(
                f"the remote {transport.url} admitted session {session_id} but answered the handover with the mark "
                f"{adm.mark!r}, not 'record': this store keeps the record; nothing was handed over"
            )
        _fault("handover:between")
        try:
            sess.set_mark("mirror")
        except (OSError, AgentSessionError) as exc:
            raise HandoverIncompleteError(
                f"the remote {transport.url} is now the record of session {session_id}, but this store could not "
                f"clear its own mark ({exc}): two records, never none; run the handover again to finish"
            ) from exc
        result.handover = True
    return result


def _on_own_line(sess: Session, ancestor: str | None, descendant: str | None) -> bool:
    """Whether ``ancestor`` is on the path from ``descendant`` up to the session's base,
    through its own entries (the base, and no head, are on every path). Walks only the
    entries between the two when it is; used on a refused push, never on the hot path."""
    if ancestor == descendant or ancestor is None or ancestor == sess.base:
        return True
    current = descendant
    while current is not None and current != sess.base and current in sess.own:
        if current == ancestor:
            return True
        current = sess.entry(current).parent
    return False


def _remember_push(
    remembered: Remembered, session_id: str, ident: str, entries: Sequence[str], adm: Admission, fresh: str | None
) -> None:
    """After an acknowledged push: the remote holds all of this log, and its head is the
    one pushed, unless the push was refused; then the head believed before stays (what is
    on disk now: another process of this store may have pushed meanwhile), or, with none
    remembered, the head a freshly created session has (``fresh``, the default expectation
    without remembered state). Never the expectation the refused push was given: that is
    a head this store never saw there."""
    now = remembered.get(session_id, ident)
    pushed, last = len(entries), (entries[-1] if entries else None)
    if now is not None and now.pushed > pushed:
        pushed, last = now.pushed, now.last  # this store's writer got further meanwhile
    if adm.outcome == "refused":
        head = now.head if now is not None else fresh
    else:
        head = adm.head
    remembered.set(RemoteState(session_id, ident, head, pushed, last))


def _push_request(
    store: Store, sess: Session, transport: Transport, closure: _Closure, request: PushRequest,
    progress: Progress | None, result: ExchangeResult,
) -> Admission:
    """Post the push; if the remote reports objects missing that this push named (swept
    before the push named them, say), send those once and post again."""
    try:
        return transport.push(request)
    except MissingObjectsError as exc:
        ours = {name for _, name in closure.order}
        if not all(name in ours for names in exc.missing.values() for name in names):
            raise
        n, b = _send(store, sess, transport, closure, exc.missing, progress)
        result.objects += n
        result.bytes += b
        return transport.push(request)


def fetch(
    store: Store,
    remote: Transport | str | os.PathLike,
    session_id: str,
    *,
    refs: Iterable[str | tuple[str, Any]] = (),
    progress: Progress | None = None,
) -> ExchangeResult:
    """Fetch a session from any store that holds it into this one (RFC 0002).

    The remote serves what its writer last committed; this store admits it as a
    push is admitted (creating a mirror when it lacks the session), and moves
    its head to the fetched head only when it is a mirror and that head descends
    from its own (or it has none); otherwise the result says why it did not.
    ``refs`` names refs of the remote, each naming the session, to set here by
    compare-and-swap from the value given (``(name, expected)``) or the one
    this store holds now.
    """
    transport, owned = _transport(remote)
    try:
        return _fetch(store, transport, session_id, refs=refs, progress=progress)[0]
    finally:
        if owned:
            transport.close()


def _served_view(transport: Transport, session_id: str) -> SessionView:
    """The session as the remote serves it (:meth:`Transport.session_view`), every caller's
    one way to read it: an answer about another session than the one asked for (a broken
    router or proxy, a hostile remote) is refused before anything is written here."""
    view = transport.session_view(session_id)
    check_served_session(transport.url, session_id, view.header)
    return view


def _verified(items: Iterable[tuple[str, str, bytes]]) -> Iterator[tuple[str, str, bytes]]:
    for space, name, data in items:
        if sha256_ref(data) != name:
            raise BadObjectError(f"the remote served {space} object {name} with bytes that do not hash to it")
        yield space, name, data


def _fetch(
    store: Store, transport: Transport, session_id: str, *, refs: Iterable[str | tuple[str, Any]],
    progress: Progress | None,
) -> tuple[ExchangeResult, SessionView]:
    _not_self(store, transport)
    if store.readonly:
        raise ReadOnlyError(f"{store.describe()} is open read-only; a fetch writes to it")
    check_session_id(session_id)
    view = _served_view(transport, session_id)
    endpoint = StoreEndpoint(store, keep_sent=True)
    local = store.session(session_id) if session_id in store else None
    if local is not None and header_ident(local.header.data) != header_ident(view.header):
        raise HeaderDiffersError(
            f"this store holds another session under the id {session_id} than the remote {transport.url} does "
            "(the headers differ apart from 'format'); nothing was fetched"
        )
    own_here: Mapping[str, int] = local.own if local is not None else {}
    need = [e for e in view.entries if e not in own_here]
    if local is None:
        need = list(view.prefix) + need
    result = ExchangeResult("fetch", session_id, transport.url, to=view.head, notes=_kept_notes(Header(dict(view.header))))
    # Envelopes first (small, kept), then the contents they name, then blobs.
    envs: dict[str, bytes] = {}
    lacking = endpoint._lacking("entries", need)
    total_hint = len(lacking)
    for _, name, data in _verified(transport.get_objects([("entries", e) for e in lacking], session=session_id)):
        envs[name] = data
    contents: list[str] = []
    for e in need:
        held = envs.get(e)
        if held is None:
            try:
                held = store.objects.get("entries", e)
            except (NoSuchObjectError, CorruptObjectError, CorruptPackError):
                continue  # the admission below names it
        chash = envelope_content(held)
        if chash is not None:
            contents.append(chash)
    contents = list(dict.fromkeys(contents))
    lacking_contents = endpoint._lacking("contents", contents)
    total_hint += len(lacking_contents)
    blobs: set[str] = set()
    counted = [0, 0]

    def scanned(items: Iterable[tuple[str, str, bytes]]) -> Iterator[tuple[str, str, bytes]]:
        for space, name, data in _verified(items):
            if space == "contents" and b"sidecar:" in data:
                blobs.update(sidecar_names(data))
            counted[0] += 1
            counted[1] += len(data)
            if progress is not None:
                progress(counted[0], max(total_hint, counted[0]))
            yield space, name, data

    def received() -> Iterator[tuple[str, str, bytes]]:
        for name, data in envs.items():
            yield "entries", name, data
        yield from transport.get_objects([("contents", c) for c in lacking_contents], session=session_id)

    count = len(envs) + len(lacking_contents)
    if count:
        endpoint.put_objects(scanned(received()), count)
    envs.clear()  # (the endpoint keeps what it was sent, as far as it keeps any)
    fetched_contents = set(lacking_contents)
    for c in contents:
        if c in fetched_contents:
            continue
        try:
            data = store.objects.get("contents", c)
        except (NoSuchObjectError, CorruptObjectError, CorruptPackError):
            continue
        if b"sidecar:" in data:
            blobs.update(sidecar_names(data))
    lacking_blobs = sorted(b for b in blobs if not endpoint._has("blobs", b))
    if lacking_blobs:
        total_hint += len(lacking_blobs)
        endpoint.put_objects(scanned(transport.get_objects([("blobs", b) for b in lacking_blobs])), len(lacking_blobs))
    request = PushRequest(
        header=view.header, prefix=list(view.prefix), entries=list(view.entries), to=view.head,
        expected=None, mark="mirror", complete=True,
    )
    adm = endpoint.receive(request, fetch=True)
    result.objects, result.bytes = counted[0], counted[1]
    result.entries, result.created = adm.admitted, adm.created
    result.head_before, result.head_after = adm.previous, adm.head
    result.outcome, result.why, result.mark = adm.outcome, adm.why, adm.mark
    result.refs = [_fetch_ref(store, transport, session_id, item) for item in refs]
    # Remember the remote's head only when this store's line contains it.
    if adm.head == view.head:
        remembered = Remembered(store, transport.url)
        ident = header_ident(view.header)
        state = remembered.get(session_id, ident) or RemoteState(session_id, ident, None)
        state.head = view.head
        remembered.set(state)
    return result, view


def _kept_notes(header: Header) -> list[str]:
    """What an exchange says of a header it carries as the session has it, rather than
    refusing (store policy ``keep``: a member of another form than RFC 0001's, which a
    store made before the rule took): a warning each, the header sent byte for byte."""
    return [kept_member_note(f"session {header.id}", p) for p in header.member_problems()]


def _fetch_ref(store: Store, transport: Transport, session_id: str, item: str | tuple[str, Any]) -> RefResult:
    """Set this store's ref to the fetched session if the remote's ref names it, by
    compare-and-swap from ``expected`` when given, else from what the remote's ref named
    when this store last saw it (absent here: created). A ref here that was moved
    elsewhere since, or never followed that remote, names a session of this store's
    own choosing, and a fetch does not take it away unless told to (``NAME:EXPECTED``)."""
    name, expected = (item, UNSET) if isinstance(item, str) else item
    check_ref_name(name)
    there = transport.get_ref(name)
    if there != session_id:
        where = f"names session {there}" if there is not None else "is absent"
        return RefResult(name, False, None, f"the remote's ref {name} {where}, not the fetched session {session_id}")
    refs = Refs(store)
    remembered = Remembered(store, transport.url)
    given = expected is not UNSET
    if not given:
        held = refs.get(name)
        expected = None if held is None else remembered.get_ref(name)
    try:
        update = refs.update(name, session_id, expected=expected)
    except RefMovedError as exc:
        if exc.current == session_id:
            remembered.set_ref(name, session_id)
            return RefResult(name, True, session_id)
        why = str(exc)
        if not given:
            why = (
                f"ref {name} here names {exc.current}, not {expected or 'nothing'} (what the remote's ref named when "
                f"last seen): it is this store's own; give {name}:{exc.current} to move it"
            )
        return RefResult(name, False, exc.current, why)
    except AgentSessionError as exc:
        return RefResult(name, False, None, str(exc))
    remembered.set_ref(name, session_id)
    return RefResult(name, True, update.new, None, update.changed)


def declare_record(
    store: Store, session_id: str, *, expected: Any = UNSET, remote: Transport | str | os.PathLike | None = None
) -> DeclareResult:
    """Declare a store the record of a session it holds as a mirror (RFC 0002: its record
    deleted it without handing it over, or it is the only copy left).

    Without ``remote``, this store; with one, the remote store (RFC 0003's
    ``POST .../record``), guarded by the head the caller believes it holds:
    ``expected``, or by default the head the remote serves now. A head that
    moved is :class:`HeadMovedError` and nothing is declared; declaring a
    record that already is one changes nothing.
    """
    expected = _check_expected(expected)
    if remote is None:
        return StoreEndpoint(store).declare_record(session_id, head=expected)
    transport, owned = _transport(remote)
    try:
        _not_self(store, transport)
        if expected is UNSET:
            expected = _served_view(transport, session_id).head
        return transport.declare_record(session_id, head=expected)
    finally:
        if owned:
            transport.close()


def take_back(
    store: Store, remote: Transport | str | os.PathLike, session_id: str, *, progress: Progress | None = None
) -> ExchangeResult:
    """Take the record of a session back from the remote that holds it (RFC 0002's
    archive and take back; RFC 0003's server-to-client handover).

    Fetches what the remote's writers added, declares this store the record at
    the fetched head, then has the remote give up its mark at that same head.
    This store declares first, so a failure between the two leaves two records
    and never none, and running it again finishes. If the remote's head moved
    meanwhile, its writers went on: this store is made a mirror again and
    :class:`HeadMovedError` says so.
    """
    transport, owned = _transport(remote)
    try:
        return _take_back(store, transport, session_id, progress=progress)
    finally:
        if owned:
            transport.close()


def _take_back(store: Store, transport: Transport, session_id: str, *, progress: Progress | None) -> ExchangeResult:
    _not_self(store, transport)
    if store.readonly:
        raise ReadOnlyError(f"{store.describe()} is open read-only; a take-back changes its mark")
    check_session_id(session_id)
    notes: list[str] = []
    if session_id in store:
        local = store.session(session_id)
        if local.mark == "record":
            view = _served_view(transport, session_id)
            result = ExchangeResult("take-back", session_id, transport.url, head_before=local.head,
                                    head_after=local.head, to=view.head, mark="record")
            if view.mark != "record":
                result.notes.append("this store is the record already and the remote a mirror: nothing to take back")
                return result
            if view.head == local.head:
                _release(transport, session_id, view.head)
                result.handover = True
                result.notes.append("finished an interrupted take-back: the remote gave up its mark")
                _remember_head(store, transport, local)
                return result
            # Two records with their heads apart. If this store's head is on the remote's
            # line, a take-back was interrupted between its steps and the remote's writers
            # went on: nothing here is lost by following them, so this store steps back to
            # a mirror (one record again, the remote's) and takes the record back afresh.
            _, view = _fetch(store, transport, session_id, refs=(), progress=progress)
            if not StoreEndpoint(store)._descends(local, {}, view.head, local.head):
                raise StoreError(
                    f"both stores hold session {session_id} as its record, on lines apart (here "
                    f"{local.head or 'none'}, there {view.head or 'none'}): two records, which this command cannot "
                    "reconcile; continue one line as a fork (a session with a base) and hand the other over"
                )
            local.set_mark("mirror")
            notes.append(
                "finished an interrupted take-back: the remote's writers had gone on, so this store followed "
                "them as a mirror before taking the record back"
            )
    result, view = _fetch(store, transport, session_id, refs=(), progress=progress)
    result.action = "take-back"
    result.notes[:0] = notes
    if view.mark != "record":
        raise NotRecordError(
            f"the remote holds session {session_id} as a mirror, not its record; take it back from its record "
            "(or declare-record here if the record is gone)"
        )
    local = store.session(session_id)
    if local.head != view.head:
        raise StoreError(
            f"the fetch left this store's head of session {session_id} at {local.head or 'none'}, not the "
            f"remote's {view.head or 'none'} ({result.why or 'it did not move'}); nothing was taken back"
        )
    local.set_mark("record")  # two records from here: never none
    _fault("take-back:between")
    try:
        _release(transport, session_id, view.head)
    except (HeadMovedError, NotRecordError, SessionLockedError, NoSuchSessionError) as exc:
        local.set_mark("mirror")  # the remote is still the record, or another is: one record again
        raise type(exc)(f"{exc}; this store is a mirror of session {session_id} again; nothing was taken back") from None
    except (OSError, AgentSessionError) as exc:
        raise HandoverIncompleteError(
            f"this store is now the record of session {session_id}, but the remote {transport.url} could not be "
            f"made to give up its mark ({exc}): two records, never none; run take-back again to finish"
        ) from exc
    result.mark = local.mark
    result.handover = True
    _remember_head(store, transport, local)
    return result


def _release(transport: Transport, session_id: str, head: str | None) -> None:
    """Have the remote give up its record mark at ``head``, and believe it only when its
    answer says the mark is gone (a network transport maps what the server said)."""
    answer = transport.release_record(session_id, head=head)
    if answer.mark == "record":
        raise HandoverIncompleteError(
            f"the remote {transport.url} answered the release of session {session_id} still holding the record "
            "mark: two records, never none; run take-back again to finish"
        )


def _remember_head(store: Store, transport: Transport, session: Session) -> None:
    remembered = Remembered(store, transport.url)
    ident = header_ident(session.header.data)
    state = remembered.get(session.id, ident) or RemoteState(session.id, ident, None)
    state.head = session.head
    remembered.set(state)
