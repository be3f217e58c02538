"""The receiving side of exchange: RFC 0002's rules for admitting a push, serving a
fetch and changing a mark, over one :class:`~agentsession_cas.store.Store`.

:class:`~.local.LocalTransport` calls :class:`StoreEndpoint` in process; a
server (RFC 0003) calls the same methods per request.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from ..backends.base import SPACES, ObjectStore, Space
from ..errors import (
    AgentSessionError,
    AppendRefusedError,
    BadObjectError,
    CorruptObjectError,
    CorruptPackError,
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
    not_an_entry_id,
    not_an_object_name,
)
from ..format import parallel
from ..format.canonical import loads_flagged
from ..format.entry import Entry, Header, short_id
from ..format.hashing import is_hash, lines_of_bytes, read_envelope, sha256_ref
from ..format.media import sidecar_names
from ..format.names import check_ref_name, check_session_id
from ..format.reader import Parking
from ..format.rules import RULES, SessionChecker, Trial, check_line, clean_entry, gc_paused
from ..format.tree import Either, head_refusal
from ..lean import dataclass
from ..store.refs import Refs, header_ident
from ..store.session import SYNTHETIC_REFUSED, Session, carries_synthetic
from ..store.store import Store, check_fork_of, check_new_header
from ..store.summary import summary_form
from .transport import Admission, DeclareResult, PushRequest, RefPush, RefResult, SessionView, check_space

__all__ = ["UNSET", "StoreEndpoint"]

_ENVELOPE_KEYS = frozenset({"content", "parent", "parents", "ts", "type"})
#: How far up ``parent_session`` a receiver looks for the session holding a new
#: fork's base before it searches the store (as the reference does).
_ORIGIN_HOPS = 64


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: "Not given" for an expected head, where None means "no head".
UNSET: Any = _Unset()


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


def _refuse(entry_id: str, why: str, rule: str | None = None, code: str | None = None) -> AppendRefusedError:
    """A pushed entry refused under ``rule``, with the code an append gives it: the rule
    table's for a rule a file has (:data:`RULES`), else ``code`` (a rule only a store
    holds, as ``synthetic``), else ``bad_entry``."""
    known = RULES.get(rule) if rule is not None else None
    code = (known.error if known is not None else None) or code or "bad_entry"
    return AppendRefusedError(f"entry {entry_id} refused: {why}", rule=rule, code=code, entry=entry_id)


#: Entries whose objects an admission reads in one bulk read of each space.
_CHUNK = 256
#: The bytes of sent envelopes and contents a receiver keeps between storing them and
#: the push naming them (its admission's check then reads none back); past this, read.
#: Reading them back costs no CPU a local fetch or push of 100,000 entries shows (the
#: admission reads a chunk at a time, from the packs just written), and 256 MiB held
#: about 100 MB more at their peak: a small push is kept whole, a big one mostly read.
SENT_KEPT_BYTES = 32 * 1024 * 1024
#: The bytes of lines handed to the line rules' helper process at once (the reader's size).
_BLOCK = 1 << 20
_UNREADABLE = (NoSuchObjectError, CorruptObjectError, CorruptPackError)


@dataclass
class _Read:
    """An entry's objects as read for its check: its parsed envelope (None with no
    refusal: read it alone, one object at a time), the refusal its envelope earns, its
    content's bytes (None: read it alone), its envelope's members but ``content`` when it
    is of the common form (:func:`read_envelope`), and its line made of the two objects'
    bytes (b"" when they do not make one: checked here, never by the helper) with the
    content as parsed to make it (used only as the helper's word vouches for it)."""

    id: str
    parsed: tuple[dict[str, Any], bool, str] | None
    refusal: AppendRefusedError | None = None
    content: bytes | None = None
    members: bytes | None = None
    line: bytes = b""
    body: dict[str, Any] | None = None


def _check_entries(
    store: Store, entry_ids: Sequence[str], missing: dict[str, list[str]], *, keep: bool = False,
    sent: dict[str, bytes] | None = None,
) -> Iterator[_Checked | None]:
    """Read each entry's two objects from ``store`` and hold them to the line rules an
    append holds an entry to (:func:`check_line`), every hash recomputed from the parsed
    values (so the bytes are canonical I-JSON), and no ``synthetic`` label: in order, a
    :class:`_Checked` each, or None for an entry with an object missing or corrupt (added
    to ``missing``); anything else wrong raises AppendRefusedError with the rule's code,
    when that entry's turn comes. ``sent``: objects this receiver just stored, by name
    (their bytes hashed to it then), taken from there (and out of it) rather than read back.

    The line rules run first on the line each entry's two objects make
    (:func:`lines_of_bytes`), as the helper process of an import applies them to a line
    (:func:`parallel.answer`): an entry found clean, with the content hash its envelope
    names, is taken as found; any other is checked from its objects as they are, so
    every refusal is the one-process refusal. A push big enough for it
    (:func:`parallel.wanted`, on its size as its first chunk shows it) has that first
    look taken on the helper process itself (:class:`parallel.LineHelper`), beside
    this one's work; a block it did not answer in time is looked at here."""
    objects = store.objects
    reads = _reads(objects, entry_ids, sent or {})
    first = list(itertools.islice(reads, _CHUNK))
    size = sum(len(r.line) for r in first) * len(entry_ids) // max(1, len(first))
    if not parallel.wanted(size, None):
        for r in itertools.chain(first, reads):
            yield _verdict(objects, r, parallel.answer(r.line) if r.line else None, missing, keep)
        return
    pending: deque[_Read] = deque()

    def blocks() -> Iterator[tuple[bytes, list[bytes]]]:
        lines: list[bytes] = []
        held = 0
        for r in itertools.chain(first, reads):
            pending.append(r)
            lines.append(r.line)
            held += len(r.line)
            if held >= _BLOCK:
                yield b"\n".join(lines), lines
                lines, held = [], 0
        if lines:
            yield b"\n".join(lines), lines

    with parallel.LineHelper() as helper:
        for _ in helper.lines(blocks()):
            r, known = pending.popleft(), helper.known.popleft()
            if known is None and r.line:
                known = parallel.answer(r.line)  # (a block taken here; or a line not clean, looked at again)
            yield _verdict(objects, r, known, missing, keep)


def _verdict(
    objects: ObjectStore, r: _Read, known: parallel.Known, missing: dict[str, list[str]], keep: bool
) -> _Checked | None:
    """The entry as the line rules' answer on its line says (:data:`parallel.Known`): clean
    with the content hash its envelope names, taken as it is; else checked here."""
    if known is not None and r.parsed is not None and known[0] == r.parsed[2]:
        return _clean(r, known, keep)
    return _check_read(objects, r, missing, keep)


def _reads(objects: ObjectStore, entry_ids: Sequence[str], sent: dict[str, bytes]) -> Iterator[_Read]:
    """Each entry's objects, read a chunk at a time by two bulk reads (envelopes, then
    contents: :meth:`ObjectStore.get_many`) as a projection reads them, those in ``sent``
    taken from there; a chunk one of whose objects does not read is read an object at a
    time when its turn comes, so that ``missing`` names each one."""
    for at in range(0, len(entry_ids), _CHUNK):
        chunk = entry_ids[at : at + _CHUNK]
        envs: list[bytes] | None = None
        if all(map(is_hash, chunk)):
            try:
                envs = _get_many(objects, "entries", chunk, sent)
            except _UNREADABLE:
                pass
        if envs is None:  # (an id that is none, an object that does not read: each in its turn)
            yield from (_Read(entry_id, None) for entry_id in chunk)
            continue
        reads = [_envelope_of(entry_id, env) for entry_id, env in zip(chunk, envs)]
        names = [r.parsed[2] for r in reads if r.parsed is not None]
        try:
            found = dict(zip(names, _get_many(objects, "contents", names, sent)))
        except _UNREADABLE:
            found = {}  # (each read alone: missing names each one)
        lineable: list[tuple[str, bytes, bytes]] = []
        for r in reads:
            if r.parsed is not None:
                r.content = found.get(r.parsed[2])
                if r.content is not None and r.members is not None and b"\n" not in r.content:
                    lineable.append((r.id, r.content, r.members))
        try:
            lines = iter(lines_of_bytes(lineable))
        except (ValueError, RecursionError):  # (whatever it is, the check here meets it again)
            lines = iter([(None, None)] * len(lineable))
        for r in reads:
            if r.content is not None and r.members is not None and b"\n" not in r.content:
                line, r.body = next(lines)
                r.line = line[:-1] if line is not None else b""
        yield from reads


def _get_many(objects: ObjectStore, space: Space, names: Sequence[str], sent: dict[str, bytes]) -> list[bytes]:
    """:meth:`ObjectStore.get_many`, those in ``sent`` taken from there (and let go: what
    the admission has read it holds no longer, so what it keeps of the checked entries
    grows as the kept objects shrink; an object named again is read from the store)."""
    pop = sent.pop
    got = [pop(name, None) for name in names]
    if None not in got:
        return got  # type: ignore[return-value]  # no None in it
    rest = iter(objects.get_many(space, [name for name, data in zip(names, got) if data is None]))
    return [data if data is not None else next(rest) for data in got]


def _check_read(objects: ObjectStore, r: _Read, missing: dict[str, list[str]], keep: bool) -> _Checked | None:
    """The entry checked here, from what :func:`_reads` read of it."""
    if r.refusal is not None:
        raise r.refusal
    if r.parsed is None:
        return _check_one(objects, r.id, missing, keep)
    return _checked_with(objects, r.id, r.parsed, r.content, missing, keep)


def _check_one(objects: ObjectStore, entry_id: str, missing: dict[str, list[str]], keep: bool) -> _Checked | None:
    if not is_hash(entry_id):
        raise not_an_entry_id(entry_id)
    try:
        env_bytes = objects.get("entries", entry_id)
    except _UNREADABLE:
        missing["entries"].append(entry_id)
        return None
    r = _envelope_of(entry_id, env_bytes)
    if r.refusal is not None:
        raise r.refusal
    assert r.parsed is not None
    return _checked_with(objects, entry_id, r.parsed, None, missing, keep)


def _envelope_of(entry_id: str, env_bytes: bytes) -> _Read:
    """An envelope parsed and held to its form, or the refusal it earns."""
    try:
        env, _, _, members = read_envelope(env_bytes)
    except (ValueError, AgentSessionError):
        members = None  # (refused below)
    if members is not None:  # the common form: an envelope by its match alone
        return _Read(entry_id, (env, False, env["content"]), members=members)
    try:
        env, env_careful = loads_flagged(env_bytes)
    except (ValueError, AgentSessionError) as exc:
        return _Read(entry_id, None, _refuse(entry_id, f"its envelope is not I-JSON ({exc})"))
    if not isinstance(env, dict) or not set(env) <= _ENVELOPE_KEYS or not is_hash(env.get("content")):
        return _Read(entry_id, None, _refuse(entry_id, "its envelope is not {content, parent, [parents], ts, type}"))
    return _Read(entry_id, (env, env_careful, env["content"]))


def _checked_with(
    objects: ObjectStore, entry_id: str, parsed: tuple[dict[str, Any], bool, str], content: bytes | None,
    missing: dict[str, list[str]], keep: bool,
) -> _Checked | None:
    """The entry checked from its parsed envelope and its content's bytes (read here when
    not given)."""
    env, env_careful, chash = parsed
    if content is None:
        try:
            content = objects.get("contents", chash)
        except _UNREADABLE:
            missing["contents"].append(chash)
            return None
    try:
        body, careful = loads_flagged(content)
    except (ValueError, AgentSessionError) as exc:
        raise _refuse(entry_id, f"its content is not I-JSON ({exc})") from None
    if not isinstance(body, dict):
        raise _refuse(entry_id, "its content is not a JSON object")
    type_ = env.get("type")
    data = dict(body)
    data["type"], data["parent"], data["ts"] = type_, env.get("parent"), env.get("ts")
    if "parents" in env:
        data["parents"] = env["parents"]
    # The line rules an append holds an entry to (format/rules.py), on the parsed values:
    # objects that hash to their names yet are not the canonical bytes of those values
    # are refused too.
    built, problems = check_line(data, careful=bool(careful or env_careful), keep_objects=True, require_id=False)
    refused = [p for p in problems if RULES[p.code].store == "refuse"]
    if refused or built is None:
        p = refused[0] if refused else problems[0]
        raise _refuse(entry_id, p.message, p.code)
    if built.computed_id != entry_id or built.content_hash != chash:
        raise _refuse(entry_id, "its objects are not in canonical form (the hashes of the parsed values differ)", "hash")
    built.objects = None
    return _admitted(entry_id, built, body, content, keep)


def _clean(r: _Read, known: tuple[str, int, int, Any], keep: bool) -> _Checked:
    """The entry the helper found clean: its line, proven canonical (and so holding no
    value the parse that made it might misread), holds nothing the line rules refuse,
    and its members hash to its id and to the content hash its envelope names (so each
    object is the canonical form of what the line holds)."""
    chash, start, end, _ = known
    assert r.parsed is not None and r.content is not None
    env = r.parsed[0]
    data = r.body if r.body is not None else orjson.loads(r.content)
    data["type"], data["parent"], data["ts"], data["id"] = env["type"], env["parent"], env["ts"], r.id
    entry = clean_entry(data, chash, line=None, item_bytes=r.line[start:end] if end else None)  # (from no file's line)
    return _admitted(r.id, entry, data, r.content, keep)


def _admitted(entry_id: str, built: Entry, body: Mapping[str, Any], content: bytes, keep: bool) -> _Checked:
    """An entry that passed the line rules, held to what a store adds (no ``synthetic``
    label; ``body``: its content's members, or the line's)."""
    type_ = built.type
    if carries_synthetic(type_, body):
        raise _refuse(entry_id, SYNTHETIC_REFUSED, "synthetic", "synthetic")  # as an append refuses it
    leaf = type_ == "label" and body.get("label") == "leaf"
    blobs = tuple(sidecar_names(content))
    entry = None
    if keep:
        built.data["id"] = built.id = entry_id
        entry = built
    return _Checked(entry_id, built.parent, leaf, built.content_hash, blobs, entry)


def _rule_refusal(checker: SessionChecker, c: _Checked) -> AppendRefusedError | None:
    """The entry added to the rule set; the refusal a refusing rule makes, or None."""
    assert c.entry is not None
    problems = checker.add(c.entry, prefix=False)
    refused = [p for p in problems if RULES[p.code].store == "refuse"]
    if not refused:
        return None
    p = refused[0]
    return AppendRefusedError(
        f"entry {c.id} refused: {p.message}", rule=p.code, code=RULES[p.code].error or "bad_entry", entry=c.id
    )


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
        if c.parent is not None and c.parent in new_ids and c.parent not in placed:
            waiting.setdefault(c.parent, []).append(c)
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


def _noted(names: Iterable[str], asked: deque[tuple[str, ...]]) -> Iterator[tuple[str, ...]]:
    """``names`` in chunks of :data:`_CHUNK`, each noted in ``asked`` as it is taken (for
    the caller to pair it with what a reader of the chunks gives back for it)."""
    it = iter(names)
    while chunk := tuple(itertools.islice(it, _CHUNK)):
        asked.append(chunk)
        yield chunk


class StoreEndpoint:
    """A store as the far end of an exchange: RFC 0002's rules for receiving a push,
    serving a fetch, and changing a mark, over one :class:`Store`.

    :class:`~agentsession_cas.transport.LocalTransport` calls it in process; a
    server (RFC 0003) would call the same methods per request. With
    ``own_store`` the endpoint opened the store itself: sessions it receives into
    are parked between calls (no lock held, nothing read again while their files
    are unchanged), and :meth:`close` closes the store. With ``keep_sent`` it keeps
    the envelopes and contents it is sent for the push that names them (a transport
    in process, a fetch: the push follows at once), which then checks them from
    memory; a server, whose clients may upload and never push, does not.
    """

    def __init__(self, store: Store, *, own_store: bool = False, keep_sent: bool = False):
        self.store = store
        self._own = own_store
        self._keep_sent = keep_sent
        self._parked: dict[str, Session] = {}
        self._snapshots: dict[str, Session] = {}
        #: Objects this endpoint made durable since the last push it received.
        self._written: set[str] = set()
        #: Of those, the envelopes and contents kept by name (their bytes verified then,
        #: up to :data:`SENT_KEPT_BYTES`): the push that names them checks them from here
        #: rather than reading them back.
        self._sent: dict[str, bytes] = {}
        self._sent_bytes = 0

    def close(self) -> None:
        for s in self._parked.values():
            try:
                # Held again (when nothing wrote it meanwhile), so that its close keeps what
                # a writer's close keeps: the summary ``list`` reads, the rules' state.
                s.exchange_resume()
            except (OSError, AgentSessionError):
                pass
        for s in list(self._parked.values()) + list(self._snapshots.values()):
            try:
                s.close()
            except (OSError, AgentSessionError):
                pass
        self._parked.clear()
        self._snapshots.clear()
        if self._own:
            self.store.close()

    # -- sessions ------------------------------------------------------------------

    def _session(self, session_id: str) -> Session | None:
        """The session open for writing (locked, recovered), or None when absent."""
        parked = self._parked.pop(session_id, None)
        if parked is not None:
            if parked.exchange_resume():
                return parked
            parked.close()
        if session_id not in self.store:
            return None
        return self.store.session(session_id)

    def _release(self, session: Session) -> None:
        """Park the session (own store) or leave it open with the store's owner."""
        if not self._own:
            return
        try:
            if session.exchange_park():
                self._parked[session.id] = session
                return
        except (OSError, AgentSessionError):
            pass
        try:
            session.close()
        except (OSError, AgentSessionError):
            pass

    def _require_writable(self) -> None:
        if self.store.readonly:
            raise ReadOnlyError(f"{self.store.describe()} is open read-only; it receives nothing")

    # -- objects --------------------------------------------------------------------

    def _has(self, space: Space, name: str) -> bool:
        """Held and sound, as the backend answers it (what is held need not be sent)."""
        return self.store.objects.held(space, name)

    def missing(self, wanted: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
        """Of ``{space: [hash, ...]}``, those this store lacks, or holds only torn."""
        out: dict[str, list[str]] = {}
        for given, names in wanted.items():
            space = check_space(given)
            asked = list(dict.fromkeys(names))
            for name in asked:
                if not is_hash(name):
                    raise not_an_object_name(name)
            out[space] = self._lacking(space, asked)
        return out

    def put_objects(self, items: Iterable[tuple[str, str, bytes]], count: int) -> None:
        """Store sent objects, each verified against its name first, durably: one pack
        for a batch of :data:`~agentsession_cas.objects.PACK_BATCH` or more (streamed),
        else loose files. A bad one stops the batch; nothing of a pack is kept then."""
        self._require_writable()
        names: list[str] = []
        kept: dict[str, bytes] = {}
        room = [SENT_KEPT_BYTES - self._sent_bytes]

        def verified() -> Iterator[tuple[Space, str, bytes]]:
            for given, name, data in items:
                space = check_space(given)
                if sha256_ref(data) != name:  # (so a name that is no hash is refused too)
                    raise BadObjectError(f"{space} object sent as {name} does not hash to that name; nothing was stored")
                names.append(name)
                if self._keep_sent and space != "blobs" and len(data) <= room[0]:
                    kept[name] = data
                    room[0] -= len(data)
                yield space, name, data

        self.store.objects.put_many(verified(), count=count)
        # Counted as made durable here only once the whole batch is: a batch that failed
        # may have left none of them durable, and the next push then syncs what it finds.
        self._written.update(names)
        self._sent.update(kept)
        self._sent_bytes = SENT_KEPT_BYTES - room[0]

    def get_objects(
        self, wanted: Iterable[tuple[str, str]], *, session: str | None = None
    ) -> Iterator[tuple[str, str, bytes]]:
        """Serve objects by name (those a session's log holds until its next checkpoint
        included, while this endpoint holds the session or a snapshot of it).
        :class:`NoSuchObjectError` for one held nowhere."""
        objects = self.store.objects
        for given, run in itertools.groupby(wanted, key=lambda w: w[0]):
            space = check_space(given)
            asked: deque[tuple[str, ...]] = deque()
            try:
                for datas in objects.get_chunks(space, _noted((name for _, name in run), asked)):  # (each chunk read in bulk)
                    yield from ((space, name, data) for name, data in zip(asked.popleft(), datas, strict=True))
            except NoSuchObjectError:
                for name in asked[0]:  # the chunk again, one at a time, to name the one held nowhere
                    try:
                        objects.get(space, name)
                    except NoSuchObjectError:
                        raise NoSuchObjectError(f"no {space} object {name} in {self.store.describe()}") from None
                raise

    def _lacking(self, space: Space, names: Sequence[str]) -> list[str]:
        """Of ``names``, in order, those not held and sound here (:meth:`_has` of each, asked
        of the backend at once)."""
        return [name for name, here in zip(names, self.store.objects.held_many(space, names)) if not here]

    def session_view(self, session_id: str) -> SessionView:
        """The session as last committed here: header, mark, head, own entries in log
        order and prefix. A session another process is writing is served as its
        writer last committed it, never its working state."""
        check_session_id(session_id)
        parked = self._parked.pop(session_id, None)
        if parked is not None:
            try:
                resumed = parked.exchange_resume()
            except SessionLockedError:
                resumed = False  # another process writes it now: read what it committed
            if resumed:
                try:
                    entries, head, mark = parked.exchange_view()
                    return SessionView(session_id, dict(parked.header.data), mark, head, list(entries),
                                       list(parked.prefix))
                finally:
                    self._release(parked)
            parked.close()
        s = self.store.opened(session_id) or self.store.read(session_id)
        entries, head, mark = s.exchange_view()
        if not s.writable:
            old = self._snapshots.pop(session_id, None)
            if old is not None:
                old.close()
            self._snapshots[session_id] = s  # kept: it serves what its log holds
        return SessionView(session_id, dict(s.header.data), mark, head, list(entries), list(s.prefix))

    def session_header(self, session_id: str) -> dict[str, Any] | None:
        """The header held under ``session_id`` (one small file read), or None."""
        check_session_id(session_id)
        for s in (self.store.opened(session_id), self._parked.get(session_id)):
            if s is not None and not s.closed:
                return dict(s.header.data)
        try:
            return dict(self.store.header(session_id).data)
        except NoSuchSessionError:
            return None

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
        check_new_header(header, "pushed header")
        session_id = check_session_id(header.id)
        if header.data.get("redacted") is not None:
            raise StoreError(f"session {session_id} is redacted: a record to read, not one a store holds (RFC 0002)")
        if req.mark not in ("mirror", "record"):
            raise StoreError(f"a push asks for the mark 'mirror' or 'record', not {req.mark!r}")
        handover = req.mark == "record" and not fetch
        written, self._written = self._written, set()
        sent, self._sent, self._sent_bytes = self._sent, {}, 0
        held: list[Session] = []
        session = self._session(session_id)
        if session is not None:
            held.append(session)
        try:
            with gc_paused():  # a bulk pass: many acyclic objects per entry (see gc_paused)
                return self._receive(req, header, session, handover=handover, fetch=fetch, written=written, sent=sent,
                                     held=held)
        finally:
            for s in held:
                self._release(s)

    def _receive(
        self, req: PushRequest, header: Header, session: Session | None, *, handover: bool, fetch: bool,
        written: set[str], sent: dict[str, bytes], held: list[Session],
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
            prefix_checked = self._check_prefix(header, req.prefix, missing, sent)
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
        todo: list[str] = []
        for entry_id in req.entries:
            if entry_id in own or entry_id in seen:
                continue
            seen.add(entry_id)
            todo.append(entry_id)
        # A session this store lacks has the rules run as its entries are checked (a full
        # push: beside the helper's line checks), a refusal kept for its turn below.
        # Each entry the rules took is kept in its summary form, and the rules' own copy on
        # their path is parked past a window (read back from the store, which holds its
        # objects already, if a rule consults it again): what a whole session's admission
        # holds grows by an id an entry, not by the entry (a fetch of 100,000 entries).
        fed: tuple[SessionChecker, AppendRefusedError | None] | None = None
        parking = Parking(lambda e: store.entry(e.id).data)
        if session is None:
            fed = self._new_rules(header, prefix_checked), None
        for c in _check_entries(store, todo, missing, keep=True, sent=sent):
            if c is not None:
                checked.append(c)
                if fed is not None and fed[1] is None:
                    fed = fed[0], _rule_refusal(fed[0], c)
                    if fed[1] is None and c.entry is not None:
                        whole, c.entry = c.entry, summary_form(c.entry)
                        parking.settle(whole)
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
        if not req.complete:
            # A partial push whose entries hang from something this log lacks: the sender
            # sends the whole closure instead. (The parent and base rules themselves are
            # the rule set's, below.)
            for c in checked:
                p = c.parent
                if p is not None and p != base and p not in own and p not in new_ids:
                    raise IncompletePushError(
                        f"entry {c.id}'s parent {p} is not in this store's log of session {session_id}; "
                        "the push must carry the whole closure"
                    )
        ordered = _order(checked)
        # The head step, decided before anything is written.
        to = req.to
        leafs = {c.id for c in checked if c.leaf}
        refusal = head_refusal(to, base, Either(own, new_ids), Either(leafs, leaf_labels), session_id)
        if refusal is not None:  # (a push's head refusals are all head_target: RFC 0003's table)
            raise AppendRefusedError(f"the pushed head: {refusal[0]}", rule="head", code="head_target")
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
                "they are the record, or the remote moved since you last saw it",
                current=current,
            )
        move = outcome in ("fast-forward", "moved", "forced")
        # Every rule verify holds the session to, for the entries admitted in order: the
        # one rule set, as an append is held to it. Nothing is written before this.
        if fed is not None and any(a is not b for a, b in zip(ordered, checked)):
            fed = None  # (reordered: the rules run again, in admission order, on the whole entries)
            for c in ordered:
                c.entry = store.entry(c.id)
        checker, trial = self._check_rules(session, header, prefix_checked, ordered, fed)
        try:
            # Writing: objects durable first (those this endpoint did not just write may
            # be another process's, not yet synced), then the log records, committed.
            self._secure_objects(session_id, prefix_checked + ordered, written)
            created = session is None
            if session is None:
                # Created a mirror even for a handover: the record mark is written below, in
                # the one commit that admits the entries and moves the head, never on a
                # session holding nothing yet (a crash between the two leaves an empty mirror).
                session = store.exchange_create(header, prefix=list(req.prefix), record=False)
                held.append(session)
            appended = session.exchange_admit(
                [(c.id, c.leaf) for c in ordered],
                known={c.id: c.entry for c in ordered if c.entry is not None},
                head=to,
                move_head=move,
                mark="record" if handover else None,
                header_format=header.format,
            )
        except BaseException:
            if trial is not None:
                checker.rollback(trial)
            raise
        if trial is not None:
            checker.commit(trial)
        else:
            session.adopt_rules(checker)
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

    def _new_rules(self, header: Header, prefix: list[_Checked]) -> SessionChecker:
        """The one rule set for a session this store lacks: from the pushed header and prefix."""
        checker = SessionChecker(header, loader=self.store.entry)
        checker.add_prefix(c.entry for c in prefix if c.entry is not None)
        return checker

    def _check_rules(
        self, session: Session | None, header: Header, prefix: list[_Checked], ordered: list[_Checked],
        fed: tuple[SessionChecker, AppendRefusedError | None] | None = None,
    ) -> tuple[SessionChecker, Trial | None]:
        """Hold the admitted entries, in admission order, to the one rule set: the
        session's own reduced state (in a trial the caller commits once the records are
        written), or, for a session this store lacks, a new one from the pushed header
        and prefix (``fed``: that one, fed already in this order, and the refusal it
        met). A refusing rule refuses the push with its code, nothing written."""
        if fed is not None:
            checker, refusal = fed
            if refusal is not None:
                raise refusal
            return checker, None  # (each entry kept in its summary form as the rules took it)
        if session is None:
            checker = self._new_rules(header, prefix)
            trial: Trial | None = None
        else:
            session.discard_prepared()
            checker = session.rules()
            trial = checker.begin()
        try:
            for c in ordered:
                refusal = _rule_refusal(checker, c)
                if refusal is not None:
                    raise refusal
                assert c.entry is not None
                c.entry = summary_form(c.entry)  # checked: only what the summary reads is kept
        except BaseException:
            if trial is not None:
                checker.rollback(trial)
            raise
        return checker, trial

    def _check_prefix(
        self, header: Header, prefix: list[str], missing: dict[str, list[str]], sent: dict[str, bytes]
    ) -> list[_Checked]:
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
        checked = list(_check_entries(self.store, prefix, missing, keep=True, sent=sent))
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
        Store.check_prefix_readable([c.entry for c in path if c.entry is not None], header.data.get("parent_session"))
        holder = self._holder(header)
        if holder is not None:
            check_fork_of(header, *holder)
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
                held = self.store.opened(sid)
                s = held or self.store.read(sid)
            except AgentSessionError:
                break
            try:
                if base in s.own:
                    return sid, s.header
                sid = s.header.data.get("parent_session")
            finally:
                if held is None:
                    s.close()
        assert base is not None
        found = self.store.holder_of(base)
        if found is None:
            return None
        found.close()
        return (found.session, found.header) if found.owns else None

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
        names: list[tuple[Space, str]] = []
        for c in checked:
            names.append(("entries", c.id))
            names.append(("contents", c.content))
            names.extend(("blobs", b) for b in c.blobs)
        lost = self.store.objects.hold(names, written=written)
        if lost:
            missing: dict[str, list[str]] = {}
            for space, name in lost:
                missing.setdefault(space, []).append(name)
            raise MissingObjectsError(_missing_message(session_id, missing), missing=missing)

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
                    "as expected; nothing was declared",
                    current=session.head,
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
                    f"{head or 'none'}: its writers went on since it was fetched; the record stays there",
                    current=session.head,
                )
            session.set_mark("mirror")
            return DeclareResult(session_id, True, session.head, session.mark)
        finally:
            self._release(session)


