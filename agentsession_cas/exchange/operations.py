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
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..backends.files.fsutil import fsync_paths
from ..backends.files.objects import PACK_BATCH
from ..errors import (
    AgentSessionError,
    AppendRefusedError,
    BadNameError,
    BadObjectError,
    CorruptObjectError,
    CorruptPackError,
    EntryError,
    HandoverIncompleteError,
    HeaderDiffersError,
    HeadMovedError,
    IJSONError,
    IncompletePushError,
    MissingObjectsError,
    NoSuchObjectError,
    NoSuchSessionError,
    NotRecordError,
    ReadOnlyError,
    RefMovedError,
    SessionFormatError,
    SessionLockedError,
    StoreError,
    TimestampError,
    TransportError,
)
from ..format.canonical import loads_flagged
from ..format.entry import Entry, Header, parse_format, short_id
from ..format.hashing import RESERVED_MEMBERS, entry_objects, is_hash, sha256_ref
from ..format.names import check_session_id
from ..format.reader import CORE_TYPES
from ..format.timestamps import check_ts
from ..store.core import Session, Store
from ..store.refs import Refs, check_ref_name, header_ident
from .transport import (
    SPACES,
    Admission,
    DeclareResult,
    PushRequest,
    RefPush,
    RefResult,
    Remembered,
    RemoteState,
    SessionView,
    Transport,
    check_space,
    open_transport,
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

_SIDECAR = re.compile(r"sidecar:(sha256:[0-9a-f]{64})")
_ENVELOPE_KEYS = frozenset({"content", "parent", "parents", "ts", "type"})
#: Bytes of objects a push keeps in memory between reading them (to learn the
#: closure) and sending them; past this it reads them again instead.
SEND_CACHE_BYTES = 256 * 1024 * 1024
#: How far up ``parent_session`` a receiver looks for the session holding a new
#: fork's base before it searches the store (as the reference does).
_ORIGIN_HOPS = 64


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: "Not given" for an expected head, where None means "no head".
UNSET: Any = _Unset()

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


# -- admission: the checks an append makes, on objects already in the store ----------


@dataclass
class _Checked:
    """An entry whose objects the receiver holds, checked as an append is."""

    id: str
    parent: str | None
    leaf: bool
    content: str
    blobs: tuple[str, ...]
    entry: Entry | None = None


def _refuse(entry_id: str, why: str) -> AppendRefusedError:
    return AppendRefusedError(f"entry {entry_id} refused: {why}")


def _check_entry(
    store: Store, entry_id: str, missing: dict[str, list[str]], *, keep: bool = False
) -> _Checked | None:
    """Read an entry's two objects from ``store`` and check them as an append would:
    every hash recomputed from the parsed values (so the bytes are canonical I-JSON),
    no reserved member in the body, a known or namespaced type, the one ``ts``
    spelling, no ``synthetic`` label. A missing or corrupt object is added to
    ``missing`` (None returned); anything else wrong raises AppendRefusedError."""
    if not is_hash(entry_id):
        raise AppendRefusedError(f"{entry_id!r} is not an entry id (sha256: and 64 lowercase hex digits)")
    objects = store.objects
    try:
        env_bytes = objects.get("entries", entry_id)
    except (NoSuchObjectError, CorruptObjectError, CorruptPackError):
        missing["entries"].append(entry_id)
        return None
    try:
        env, env_careful = loads_flagged(env_bytes)
    except (ValueError, AgentSessionError) as exc:
        raise _refuse(entry_id, f"its envelope is not I-JSON ({exc})") from None
    if not isinstance(env, dict) or not set(env) <= _ENVELOPE_KEYS or not is_hash(env.get("content")):
        raise _refuse(entry_id, "its envelope is not {content, parent, [parents], ts, type}")
    chash = env["content"]
    try:
        content = objects.get("contents", chash)
    except (NoSuchObjectError, CorruptObjectError, CorruptPackError):
        missing["contents"].append(chash)
        return None
    try:
        body, careful = loads_flagged(content)
    except (ValueError, AgentSessionError) as exc:
        raise _refuse(entry_id, f"its content is not I-JSON ({exc})") from None
    if not isinstance(body, dict):
        raise _refuse(entry_id, "its content is not a JSON object")
    reserved = sorted(RESERVED_MEMBERS & body.keys())
    if reserved:
        raise _refuse(entry_id, f"its body carries the reserved member {reserved[0]!r}")
    type_ = env.get("type")
    if not isinstance(type_, str) or type_ == "session" or (type_ not in CORE_TYPES and ":" not in type_):
        raise _refuse(entry_id, f"type {type_!r} is neither a core type of RFC 0001 nor namespaced (ns:type)")
    parent = env.get("parent")
    if parent is not None and not is_hash(parent):
        raise _refuse(entry_id, f"parent {parent!r} is not an entry id")
    try:
        check_ts(env.get("ts"))
    except TimestampError as exc:
        raise _refuse(entry_id, str(exc)) from None
    data = dict(body)
    data["type"], data["parent"], data["ts"] = type_, parent, env["ts"]
    if "parents" in env:
        data["parents"] = env["parents"]
    try:
        computed, computed_content, _, _ = entry_objects(data, parsed=True, careful=bool(careful or env_careful))
    except (EntryError, IJSONError, UnicodeEncodeError) as exc:
        raise _refuse(entry_id, str(exc)) from None
    if computed != entry_id or computed_content != chash:
        raise _refuse(entry_id, "its objects are not in canonical form (the hashes of the parsed values differ)")
    if type_ == "label" and body.get("synthetic") is not None:
        raise _refuse(entry_id, "a label carrying 'synthetic' is a projection's marker; a store refuses it")
    leaf = type_ == "label" and body.get("label") == "leaf"
    blobs: tuple[str, ...] = ()
    if b"sidecar:" in content:
        blobs = tuple(sorted(set(_SIDECAR.findall(content.decode("utf-8")))))
    entry = None
    if keep:
        data["id"] = entry_id
        entry = Entry(data, computed_id=entry_id, content_hash=chash)
    return _Checked(entry_id, parent, leaf, chash, blobs, entry)


def _missing_message(session_id: str, missing: Mapping[str, Sequence[str]]) -> str:
    parts = [f"{len(v)} {space}" for space, v in missing.items() if v]
    first = next(v[0] for v in missing.values() if v)
    return f"push of session {session_id} names objects the receiver lacks ({', '.join(parts)}; first {first}); nothing was admitted"


def _order(new: list[_Checked]) -> list[_Checked]:
    """Parents before children, otherwise keeping the sender's order (which already is
    one, for an honest sender: its own appends needed each parent first)."""
    new_ids = {c.id for c in new}
    placed: set[str] = set()
    waiting: dict[str, list[_Checked]] = {}
    out: list[_Checked] = []
    for c in new:
        if c.parent in new_ids and c.parent not in placed:
            waiting.setdefault(c.parent, []).append(c)  # type: ignore[arg-type]
            continue
        stack = [c]
        while stack:
            x = stack.pop()
            out.append(x)
            placed.add(x.id)
            stack.extend(reversed(waiting.pop(x.id, [])))
    if waiting:  # a cycle cannot be built from hashes; only damage gets here
        first = next(iter(waiting.values()))[0]
        raise _refuse(first.id, "its parent chain never reaches the base or a root")
    return out


# -- the receiving side --------------------------------------------------------------


class StoreEndpoint:
    """A store as the far end of an exchange: RFC 0002's rules for receiving a push,
    serving a fetch, and changing a mark, over one :class:`Store`.

    :class:`~agentsession_cas.transport.LocalTransport` calls it in process; a
    server (RFC 0003) would call the same methods per request. With
    ``own_store`` the endpoint opened the store itself: sessions it receives into
    are parked between calls (no lock held, nothing read again while their files
    are unchanged), and :meth:`close` closes the store.
    """

    def __init__(self, store: Store, *, own_store: bool = False):
        self.store = store
        self._own = own_store
        self._parked: dict[str, tuple[Session, Any]] = {}
        self._snapshots: dict[str, Session] = {}
        #: Objects this endpoint made durable since the last push it received.
        self._written: set[str] = set()

    def close(self) -> None:
        self._parked.clear()
        self._snapshots.clear()
        if self._own:
            self.store.close()

    # -- sessions ------------------------------------------------------------------

    def _session(self, session_id: str) -> Session | None:
        """The session open for writing (locked, recovered), or None when absent."""
        parked = self._parked.pop(session_id, None)
        if parked is not None and parked[0].exchange_resume(parked[1]):
            return parked[0]
        if session_id not in self.store:
            return None
        return self.store.session(session_id)

    def _release(self, session: Session) -> None:
        """Park the session (own store) or leave it open with the store's owner."""
        if not self._own:
            return
        try:
            self._parked[session.id] = (session, session.exchange_park())
        except (OSError, AgentSessionError):
            try:
                session.close()
            except (OSError, AgentSessionError):
                pass

    def _require_writable(self) -> None:
        if self.store.readonly:
            raise ReadOnlyError(f"the store at {self.store.root} is open read-only; it receives nothing")

    # -- objects --------------------------------------------------------------------

    def _has(self, space: str, name: str) -> bool:
        """Held and sound: packed (durable and checksummed), or a loose copy that hashes
        to its name (a torn one is reported missing, so the sender replaces it)."""
        objects = self.store.objects
        if objects.is_packed(space, name):
            return True
        if not os.path.exists(objects.path(space, name)):
            return objects.exists(space, name)  # packed by another process since we looked
        return objects.is_sound(space, name)

    def missing(self, wanted: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
        """Of ``{space: [hash, ...]}``, those this store lacks, or holds only torn."""
        out: dict[str, list[str]] = {}
        for space, names in wanted.items():
            check_space(space)
            lacking = []
            for name in dict.fromkeys(names):
                if not is_hash(name):
                    raise BadNameError(f"{name!r} is not an object name (sha256: and 64 lowercase hex digits)")
                if not self._has(space, name):
                    lacking.append(name)
            out[space] = lacking
        return out

    def put_objects(self, items: Iterable[tuple[str, str, bytes]], count: int) -> None:
        """Store sent objects, each verified against its name first, durably: one pack
        for a batch of :data:`~agentsession_cas.objects.PACK_BATCH` or more (streamed),
        else loose files. A bad one stops the batch; nothing of a pack is kept then."""
        self._require_writable()
        names: list[str] = []

        def verified() -> Iterator[tuple[str, str, bytes]]:
            for space, name, data in items:
                check_space(space)
                if not is_hash(name) or sha256_ref(data) != name:
                    raise BadObjectError(f"{space} object sent as {name} does not hash to that name; nothing was stored")
                names.append(name)
                yield space, name, data

        if count >= PACK_BATCH:
            self.store.objects.write_pack(verified())
        else:
            self.store.objects.put_many(list(verified()))
        # Counted as made durable here only once the whole batch is: a batch that failed
        # may have left none of them durable, and the next push then syncs what it finds.
        self._written.update(names)

    def get_objects(
        self, wanted: Iterable[tuple[str, str]], *, session: str | None = None
    ) -> Iterator[tuple[str, str, bytes]]:
        """Serve objects by name; those a session holds only in its log are served from
        there (``session`` names it). :class:`NoSuchObjectError` for one held nowhere."""
        pending: dict[str, bytes] | None = None
        for space, name in wanted:
            check_space(space)
            try:
                yield space, name, self.store.objects.get(space, name)
                continue
            except NoSuchObjectError:
                if space == "blobs" or session is None:
                    raise
            if pending is None:
                pending = self._pending(session)
            data = pending.get(name)
            if data is None:
                raise NoSuchObjectError(f"no {space} object {name} in the store at {self.store.root}")
            yield space, name, data

    def _pending(self, session_id: str) -> dict[str, bytes]:
        s = self._snapshots.get(session_id) or self.store._open.get(session_id)
        if s is None:
            return {}
        return s.exchange_pending()

    def session_view(self, session_id: str) -> SessionView:
        """The session as last committed here: header, mark, head, own entries in log
        order and prefix. A session another process is writing is served as its
        writer last committed it, never its working state."""
        check_session_id(session_id)
        parked = self._parked.pop(session_id, None)
        if parked is not None:
            try:
                resumed = parked[0].exchange_resume(parked[1])
            except SessionLockedError:
                resumed = False  # another process writes it now: read what it committed
            if resumed:
                s = parked[0]
                try:
                    entries, head, mark = s.exchange_view()
                    return SessionView(session_id, dict(s.header.data), mark, head, entries, list(s.prefix))
                finally:
                    self._release(s)
        s = self.store._open.get(session_id) or self.store.read(session_id)
        entries, head, mark = s.exchange_view()
        if not s.writable:
            self._snapshots[session_id] = s
        return SessionView(session_id, dict(s.header.data), mark, head, entries, list(s.prefix))

    def session_header(self, session_id: str) -> dict[str, Any] | None:
        """The header held under ``session_id`` (one small file read), or None."""
        check_session_id(session_id)
        for s in (self.store._open.get(session_id), self._parked.get(session_id, (None,))[0]):
            if s is not None and not s._closed:
                return dict(s.header.data)
        try:
            with open(os.path.join(self.store.session_dir(session_id), "header"), "rb") as f:
                raw = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            data, _ = loads_flagged(raw)
        except (ValueError, AgentSessionError) as exc:
            raise StoreError(f"session {session_id}: its header here is unreadable: {exc}") from None
        if not isinstance(data, dict):
            raise StoreError(f"session {session_id}: its header here is not a JSON object")
        return data

    def get_ref(self, name: str) -> str | None:
        ref = Refs(self.store).get(check_ref_name(name))
        return ref.session if ref is not None else None

    # -- receiving a push (or a fetch's admission) ---------------------------------------

    def receive(self, req: PushRequest, *, fetch: bool = False) -> Admission:
        """Admit a pushed closure, then take the head step, then the ref steps.

        Refused with nothing changed: a header this store cannot hold or that
        differs from the one it holds under that id (:class:`HeaderDiffersError`),
        an entry an append would refuse or that breaks the parent rule
        (:class:`AppendRefusedError`), objects it lacks
        (:class:`MissingObjectsError`), a partial push to a store lacking what it
        builds on (:class:`IncompletePushError`), and a handover whose head would
        not move (:class:`HeadMovedError`). Otherwise the entries land, committed,
        whether or not the head moves; the :class:`Admission` says which.
        ``fetch`` applies the fetch rule to the head instead of the push rule.
        """
        self._require_writable()
        header = Header(dict(req.header))
        problems = header.problems()
        if problems:
            raise SessionFormatError("pushed header", problems)
        session_id = check_session_id(header.id)
        if header.is_legacy:
            raise StoreError(f"session {session_id}: format {header.format} is before hashed ids; it cannot be exchanged")
        if header.data.get("redacted") is not None:
            raise StoreError(f"session {session_id} is redacted: a record to read, not one a store holds (RFC 0002)")
        if req.mark not in ("mirror", "record"):
            raise StoreError(f"a push asks for the mark 'mirror' or 'record', not {req.mark!r}")
        handover = req.mark == "record" and not fetch
        written, self._written = self._written, set()
        held: list[Session] = []
        session = self._session(session_id)
        if session is not None:
            held.append(session)
        try:
            return self._receive(req, header, session, handover=handover, fetch=fetch, written=written, held=held)
        finally:
            for s in held:
                self._release(s)

    def _receive(
        self, req: PushRequest, header: Header, session: Session | None, *, handover: bool, fetch: bool,
        written: set[str], held: list[Session],
    ) -> Admission:
        store = self.store
        session_id = header.id
        base = header.base
        missing: dict[str, list[str]] = {space: [] for space in SPACES}
        prefix_checked: list[_Checked] = []
        if session is None:
            if not req.complete:
                raise IncompletePushError(
                    f"this store does not hold session {session_id}; the push must carry the whole closure"
                )
            prefix_checked = self._check_prefix(header, req.prefix, missing)
            own: Mapping[str, int] = {}
            leaf_labels: set[str] = set()
            current = base
            mark_here = "record" if handover else "mirror"
        else:
            if header_ident(session.header.data) != header_ident(header.data):
                raise HeaderDiffersError(
                    f"this store holds another session under the id {session_id}: the headers differ apart from "
                    "'format', and two sessions alike only in id are not one session"
                )
            own, leaf_labels, current, mark_here = session.own, session.leaf_labels, session.head, session.mark
        # Admission: every own entry this log lacks, checked as an append is.
        checked: list[_Checked] = []
        seen: set[str] = set()
        for entry_id in req.entries:
            if entry_id in own or entry_id in seen:
                continue
            seen.add(entry_id)
            c = _check_entry(store, entry_id, missing)
            if c is not None:
                checked.append(c)
        for c in prefix_checked + checked:
            for blob in c.blobs:
                if not self._has("blobs", blob):
                    missing["blobs"].append(blob)
        if any(missing.values()):
            raise MissingObjectsError(
                _missing_message(session_id, missing),
                missing={k: list(dict.fromkeys(v)) for k, v in missing.items() if v},
            )
        new_ids = {c.id for c in checked}
        for c in checked:
            p = c.parent
            if p is None:
                if base is None:
                    continue
                raise _refuse(c.id, f"session {session_id} has a base; an own entry cannot be a root")
            if p == base or p in own or p in new_ids:
                continue
            if not req.complete:
                raise IncompletePushError(
                    f"entry {c.id}'s parent {p} is not in this store's log of session {session_id}; "
                    "the push must carry the whole closure"
                )
            raise _refuse(
                c.id,
                f"its parent {p} is neither the base, an own entry of session {session_id}, nor (without a base) null",
            )
        ordered = _order(checked)
        # The head step, decided before anything is written.
        to = req.to
        leafs = {c.id for c in checked if c.leaf}
        if to is None:
            if base is not None:
                raise AppendRefusedError(f"the pushed head of session {session_id} is empty, but the session has a base")
        elif not (to == base or to in own or to in new_ids):
            raise AppendRefusedError(f"the pushed head {to} is neither the base nor an own entry of session {session_id}")
        elif to in leafs or to in leaf_labels:
            raise AppendRefusedError(f"the pushed head {to} is a leaf label; the head never rests on one")
        outcome, why = "unchanged", None
        if to != current:
            if fetch:
                if mark_here == "record" and session is not None:
                    outcome = "not-moved"
                    why = f"this store is the record for session {session_id}; its head moves only by its own writers"
                elif self._descends(session, {c.id: c.parent for c in checked}, to, current):
                    outcome = "fast-forward"
                else:
                    outcome = "not-moved"
                    why = (
                        f"the fetched head {to} does not descend from this store's head {current}: "
                        "the source is behind (a stale mirror) or on another line"
                    )
            elif req.expected == current:
                descends = self._descends(session, {c.id: c.parent for c in checked}, to, current)
                outcome = "fast-forward" if descends else "moved"
            elif req.force:
                outcome, why = "forced", f"forced over head {current or 'none'}, not the expected {req.expected or 'none'}"
            else:
                outcome = "refused"
                why = f"the receiver's head is {current or 'none'}, not the expected {req.expected or 'none'}"
        if (
            handover and outcome == "refused" and session is not None and mark_here == "record"
            and self._descends(session, {c.id: c.parent for c in checked}, current, to)
        ):
            # This store took the record in an earlier attempt whose answer was lost, and its
            # writers went on from the head handed over: the handover is done, and the sender
            # finishes it by clearing its own mark. Its writers' head is not moved back.
            outcome = "not-moved"
            why = (
                f"this store is already the record of session {session_id} and its head {current} descends "
                f"from the pushed head {to or 'none'}: the handover was done, and its writers went on"
            )
        if handover and outcome == "refused":
            raise HeadMovedError(
                f"handover of session {session_id} refused before anything landed: {why}; two stores each believe "
                "they are the record, or the remote moved since you last saw it"
            )
        move = outcome in ("fast-forward", "moved", "forced")
        # Writing: objects durable first (those this endpoint did not just write may be
        # another process's, not yet synced), then the log records, committed.
        self._secure_objects(session_id, prefix_checked + ordered, written)
        created = session is None
        if session is None:
            # Created a mirror even for a handover: the record mark is written below, in the
            # one commit that admits the entries and moves the head, never on a session
            # holding nothing yet (a crash between the two leaves an empty mirror here).
            session = Session.exchange_create(store, header, prefix=list(req.prefix), record=False)
            held.append(session)
        appended = session.exchange_admit(
            [(c.id, c.leaf) for c in ordered],
            head=to,
            move_head=move,
            mark="record" if handover else None,
            header_format=header.format,
        )
        refs = [self._ref_step(session_id, r) for r in req.refs]
        return Admission(
            session=session_id,
            created=created,
            admitted=len(appended),
            previous=current,
            head=session.head,
            outcome=outcome,
            why=why,
            mark=session.mark,
            refs=refs,
        )

    def _check_prefix(self, header: Header, prefix: list[str], missing: dict[str, list[str]]) -> list[_Checked]:
        """A new session's prefix, root..base: held (sent), checked as entries, one chain
        ending at the base, the base no leaf label, no merge off the path, and the media
        (and format) of a session here whose own entries hold the base."""
        base = header.base
        if base is None:
            if prefix:
                raise AppendRefusedError(f"session {header.id} has no base, yet the push carries a prefix")
            return []
        if not prefix or prefix[-1] != base:
            raise AppendRefusedError(f"the pushed prefix of session {header.id} does not end at its base {base}")
        checked = [_check_entry(self.store, e, missing, keep=True) for e in prefix]
        if any(c is None for c in checked):
            return []  # reported as missing by the caller
        path: list[_Checked] = checked  # type: ignore[assignment]
        expect: str | None = None
        for c in path:
            if c.parent != expect:
                raise AppendRefusedError(
                    f"the pushed prefix of session {header.id} is not one chain from a root to the base "
                    f"(entry {c.id} has parent {c.parent}, not {expect})"
                )
            expect = c.id
        if path[-1].leaf:
            raise AppendRefusedError(f"base {short_id(base)} is a leaf label; the base is a fork's first head")
        Store._check_prefix_readable([c.entry for c in path], header.data.get("parent_session"))  # type: ignore[misc]
        holder = self._holder(header)
        if holder is not None:
            owner_id, owner_header = holder
            if owner_header.media != header.media:
                raise StoreError(
                    f"media {header.media!r} differs from {owner_header.media!r} of session {owner_id}, which holds the base"
                )
            fmt, owner_fmt = parse_format(header.format), parse_format(owner_header.format)
            if fmt and owner_fmt and fmt < owner_fmt:
                raise StoreError(f"a fork's format {header.format} may not be earlier than {owner_header.format} of {owner_id}")
        return path

    def _holder(self, header: Header) -> tuple[str, Header] | None:
        """The session here whose own entries hold the base: looked for up
        ``parent_session`` first, then through the store (what creating a fork costs)."""
        base = header.base
        seen: set[str] = set()
        sid = header.data.get("parent_session")
        for _ in range(_ORIGIN_HOPS):
            if not isinstance(sid, str) or sid in seen:
                break
            seen.add(sid)
            try:
                check_session_id(sid)
                if sid not in self.store:
                    break
                s = self.store._open.get(sid) or self.store.read(sid)
            except AgentSessionError:
                break
            if base in s.own:
                return sid, s.header
            sid = s.header.data.get("parent_session")
        found = self.store._holder_of(base)  # type: ignore[arg-type]
        if found is not None and base in found[3].own:
            return found[0], found[1]
        return None

    def _descends(self, session: Session | None, parents: Mapping[str, str | None], to: str | None, ancestor: str | None) -> bool:
        """Whether ``to`` has ``ancestor`` on its path (a head of none, or the base, is
        every own entry's ancestor). Walks up from ``to``: what it reads is the path
        between the two, which for an incremental push is what was pushed."""
        if to == ancestor:
            return True
        if session is None or ancestor is None or ancestor == session.base:
            return True
        current: str | None = to
        while current is not None and current != session.base:
            if current == ancestor:
                return True
            if current in parents:
                current = parents[current]
            elif current in session.own:
                current = session.entry(current).parent
            else:
                return False
        return False

    def _secure_objects(self, session_id: str, checked: list[_Checked], written: set[str]) -> None:
        """Just before the log records that name them: touch every file holding an object
        the push names, so a sweep running now spares it (a sweep keeps a file touched
        since its snapshot, and one it moved aside first is found gone here, which is
        reported as missing and admits nothing); and make durable the loose objects this
        push did not write, which another process may have written and not yet synced
        (RFC 0002's commit covers "one already present"). Packs are durable before they
        are visible."""
        objects = self.store.objects
        touched: set[str] = set()
        sync: list[str] = []
        missing: dict[str, list[str]] = {}
        for c in checked:
            for space, name in (("entries", c.id), ("contents", c.content), *(("blobs", b) for b in c.blobs)):
                path = objects.freshen(space, name, touched=touched)
                if path is None:
                    missing.setdefault(space, []).append(name)
                elif name not in written and path == objects.path(space, name):
                    sync.append(path)  # loose, and not written by this push
        if missing:
            raise MissingObjectsError(_missing_message(session_id, missing), missing=missing)
        if sync:
            fsync_paths(sync)

    def _ref_step(self, session_id: str, r: RefPush) -> RefResult:
        """One ref's compare-and-swap at the receiver; a refusal is reported, not raised,
        and undoes nothing (RFC 0003)."""
        if r.next != session_id:
            return RefResult(r.name, False, None, f"a pushed ref must name the pushed session {session_id}, not {r.next}")
        refs = Refs(self.store)
        try:
            update = refs.update(r.name, r.next, expected=r.expected)
        except RefMovedError as exc:
            if exc.current == r.next:
                return RefResult(r.name, True, r.next, None, False)  # already there: a retried push
            return RefResult(r.name, False, exc.current, str(exc))
        except AgentSessionError as exc:
            current = None
            try:
                held = refs.get(r.name)
                current = held.session if held is not None else None
            except AgentSessionError:
                pass
            return RefResult(r.name, False, current, str(exc))
        return RefResult(r.name, True, update.new, None, update.changed)

    # -- marks ------------------------------------------------------------------------

    def declare_record(self, session_id: str, *, head: Any = UNSET) -> DeclareResult:
        """Make this store the record of a session it holds as a mirror (RFC 0002: the
        record deleted it without handing it over, or this is the only copy), if its
        head is ``head`` (UNSET: whatever it is). Committed before it returns."""
        self._require_writable()
        session = self._session(check_session_id(session_id))
        if session is None:
            raise NoSuchSessionError(f"no such session: {session_id}")
        try:
            if session.mark == "record":
                return DeclareResult(session_id, False, session.head, session.mark)
            if head is not UNSET and session.head != head:
                raise HeadMovedError(
                    f"the head of session {session_id} here is {session.head or 'none'}, not {head or 'none'} "
                    "as expected; nothing was declared"
                )
            session.set_mark("record")
            return DeclareResult(session_id, True, session.head, session.mark)
        finally:
            self._release(session)

    def release_record(self, session_id: str, *, head: str | None) -> DeclareResult:
        """Give up the record mark (the far side of a take-back): only while this store
        holds the mark and its head is ``head``; committed before it returns. A store
        that is not the record has nothing to release (:class:`NotRecordError`, as RFC
        0003's handover to a client is refused): the record is elsewhere, and the store
        taking it back must not become a second one. A retried take-back does not ask
        twice: it finds this store a mirror already and finishes."""
        self._require_writable()
        session = self._session(check_session_id(session_id))
        if session is None:
            raise NoSuchSessionError(f"no such session: {session_id}")
        try:
            if session.mark != "record":
                raise NotRecordError(
                    f"this store holds session {session_id} as a mirror, not its record; it has no mark to give up"
                )
            if session.head != head:
                raise HeadMovedError(
                    f"the head of session {session_id} at the record is {session.head or 'none'}, not "
                    f"{head or 'none'}: its writers went on since it was fetched; the record stays there"
                )
            session.set_mark("mirror")
            return DeclareResult(session_id, True, session.head, session.mark)
        finally:
            self._release(session)


# -- the initiating side ----------------------------------------------------------------


def _check_expected(expected: Any) -> Any:
    """An expected head as given: UNSET, None (no head), or a full entry id. Anything else
    (a short id, a typo) is refused before anything is sent, rather than posted as an
    expectation no head can meet, which would land the entries as a branch."""
    if expected is UNSET or expected is None:
        return expected
    if not isinstance(expected, str) or not is_hash(expected):
        raise BadNameError(
            f"expected head {expected!r} is not an entry id (sha256: and 64 lowercase hex digits; '' for no head)"
        )
    return expected


def _transport(remote: Transport | str | os.PathLike) -> tuple[Transport, bool]:
    if isinstance(remote, Transport):
        return remote, False
    return open_transport(remote), True


def _not_self(store: Store, transport: Transport) -> None:
    if transport.is_store(store.root):
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
            raise ReadOnlyError(f"the store at {store.root} is open read-only; a {what} changes its mark")
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

    for entry_id in ids:
        chash, content, env = session.exchange_objects(entry_id)
        out.content_of.setdefault(chash, entry_id)
        add("contents", chash, content)
        if b"sidecar:" in content:
            for blob in sorted(set(_SIDECAR.findall(content.decode("utf-8")))):
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

    def items() -> Iterator[tuple[str, str, bytes]]:
        for space, name in todo:
            data = closure.cache.get(name)
            if data is None:
                if space == "entries":
                    data = session.exchange_objects(name)[2]
                elif space == "contents":
                    data = session.exchange_objects(closure.content_of[name])[1]
                else:
                    data = store.objects.get("blobs", name)
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
    delta = (
        state is not None
        and there is not None
        and 0 < state.pushed <= len(entries)
        and entries[state.pushed - 1] == state.last
    )
    ref_pushes = _ref_pushes(store, remembered, session_id, refs)
    result = ExchangeResult(what, session_id, transport.url, expected=exp, to=head)
    adm = None
    for complete in ([False, True] if delta else [True]):
        start = 0 if complete else state.pushed  # type: ignore[union-attr]
        ids = (list(sess.prefix) if complete else []) + entries[start:]
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
            header=header, prefix=list(sess.prefix) if complete else [], entries=entries[start:],
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
    remembered: Remembered, session_id: str, ident: str, entries: list[str], adm: Admission, fresh: str | None
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
        raise ReadOnlyError(f"the store at {store.root} is open read-only; a fetch writes to it")
    check_session_id(session_id)
    view = transport.session_view(session_id)
    endpoint = StoreEndpoint(store)
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
    result = ExchangeResult("fetch", session_id, transport.url, to=view.head)
    # Envelopes first (small, kept), then the contents they name, then blobs.
    envs: dict[str, bytes] = {}
    lacking = [e for e in need if not endpoint._has("entries", e)]
    total_hint = len(lacking)
    for _, name, data in _verified(transport.get_objects([("entries", e) for e in lacking], session=session_id)):
        envs[name] = data
    contents: list[str] = []
    for e in need:
        data = envs.get(e)
        if data is None:
            try:
                data = store.objects.get("entries", e)
            except (NoSuchObjectError, CorruptObjectError, CorruptPackError):
                continue  # the admission below names it
        try:
            env, _ = loads_flagged(data)
            chash = env.get("content") if isinstance(env, dict) else None
        except (ValueError, AgentSessionError):
            chash = None
        if is_hash(chash):
            contents.append(chash)
    contents = list(dict.fromkeys(contents))
    lacking_contents = [c for c in contents if not endpoint._has("contents", c)]
    total_hint += len(lacking_contents)
    blobs: set[str] = set()
    counted = [0, 0]

    def scanned(items: Iterable[tuple[str, str, bytes]]) -> Iterator[tuple[str, str, bytes]]:
        for space, name, data in _verified(items):
            if space == "contents" and b"sidecar:" in data:
                blobs.update(_SIDECAR.findall(data.decode("utf-8", "replace")))
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
    fetched_contents = set(lacking_contents)
    for c in contents:
        if c in fetched_contents:
            continue
        try:
            data = store.objects.get("contents", c)
        except (NoSuchObjectError, CorruptObjectError, CorruptPackError):
            continue
        if b"sidecar:" in data:
            blobs.update(_SIDECAR.findall(data.decode("utf-8", "replace")))
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
            expected = transport.session_view(session_id).head
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
        raise ReadOnlyError(f"the store at {store.root} is open read-only; a take-back changes its mark")
    check_session_id(session_id)
    notes: list[str] = []
    if session_id in store:
        local = store.session(session_id)
        if local.mark == "record":
            view = transport.session_view(session_id)
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
