"""A session as the store holds it: header, base, head, record mark and the log of own entries.

The domain half of RFC 0002's session: what an append may do and what it
does (the rules, the head, the outcome the appender is told), prepared and
then committed as one step, over a :class:`~agentsession_cas.backends.base.SessionLog`
that keeps the records wherever its backend keeps them. Nothing here touches
a file: the state is replayed from the log's records (:mod:`.state`), and
every object is read through the backend's object store.

**Prepare, then commit.** :meth:`Session.prepare` takes one or more entries,
hashes them and checks them against the session's reduced state without
writing anything, and returns a :class:`PreparedBatch`; its ``commit()``
makes the whole batch durable and visible at once (one write of the log's
records), or nothing. :meth:`Session.append` is prepare plus commit of one
entry. Until the commit nothing a reader can see changes.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, get_args, overload

from ..backends.base import Append, FsckProblem, Mark, ObjectStore, Record, SessionLog
from ..errors import (
    HASH_FORM,
    AgentSessionError,
    AppendRefusedError,
    BadArgumentError,
    CorruptObjectError,
    HeadMovedError,
    IJSONError,
    MirrorError,
    NoSuchEntryError,
    NoSuchObjectError,
    Problem,
    ReadOnlyError,
    SessionDamagedError,
    StoreError,
    SupersededError,
    not_an_entry_id,
    not_an_object_name,
    quoted,
)
from ..format.canonical import canonical_bytes, loads, loads_flagged, needs_careful
from ..format.entry import FORMAT_WRITTEN, LEAF_LABEL, SYNTHETIC_RULE, Entry, Header, make_entry, parse_format, short_id
from ..format.hashing import (
    HASH_PREFIX,
    common_envelopes,
    envelope_content,
    is_hash,
    line_members,
    lines_from_objects,
    read_envelope,
)
from ..format.links import REL_CONTINUED_IN, successor_of
from ..format.media import sidecar_names
from ..format.timestamps import now_ts
from ..format.tree import Either, Tree, head_refusal
from ..lean import dataclass
from .own import OwnOrder, OwnSeqs
from .state import SessionState, committed_view, index_damage, replay
from .summary import SessionSummary, SummaryBuilder

if TYPE_CHECKING:
    from ..format.context import ContextHasher
    from ..format.rules import OpenRun, SessionChecker, Trial
    from .store import HeadAdjusted, Store

# The rule set (format/rules.py, with the context and record machinery) is imported
# where a session is checked or projected, not here: opening a session to read its
# head, list it or export it does not load it (issue 11, start-up).

__all__ = [
    "SYNTHETIC_REFUSED", "AppendResult", "PreparedBatch", "ProjectionOutline", "Session", "carries_synthetic",
    "entry_from_objects", "iter_up", "walk_up",
]

#: Why a store refuses a label carrying ``synthetic`` (see :func:`carries_synthetic`).
SYNTHETIC_REFUSED = SYNTHETIC_RULE


def carries_synthetic(type_: object, body: Mapping[str, Any]) -> bool:
    """RFC 0002 "Head": a ``label`` carrying ``synthetic`` marks a projection's own marker,
    never an entry of record, and a store refuses it: the one test an append, a pushed
    entry and an imported line are held to (an import discards the marker itself,
    ``synthetic: true``, and refuses any other such label)."""
    return type_ == "label" and body.get("synthetic") is not None


_DURABLE_ON_RESPONSES = frozenset({"response", "compaction", "branch_summary"})
#: Entries a writer appends between the summaries it hands the backend as it goes (see
#: Session._keep_summary): at most what ``list`` beside it reads of its session.
SUMMARY_EVERY = 1024
#: The entries a batch of one adds before its entry: none.
_NOTHING_ADDED: Mapping[str, Append] = MappingProxyType({})
_ENTRY_NAMING = ("target", "first_kept", "from", "queued_from")
_NAMING = frozenset(_ENTRY_NAMING + ("parents",))


def iter_up(entry_id: str, step: Callable[[str], tuple[Any, str | None]]) -> Iterator[Any]:
    """What ``step`` gives for each entry from ``entry_id`` up to its root (``step``
    returns the item and the parent's id), leaf first, as it is walked; a cycle in the
    parents is damaged objects, reported rather than looped on. The one ancestry
    walk: prefixes, paths, fork bases, repair and the server's path reads (a piece at
    a time) all go through it."""
    if not isinstance(entry_id, str):  # (None too: an ancestry is of an entry, and None names none)
        raise not_an_object_name(entry_id)
    seen: set[str] = set()
    current: str | None = entry_id
    while current is not None:
        if current in seen:
            raise StoreError(f"entry {current} is its own ancestor: the objects are damaged")
        seen.add(current)
        item, current = step(current)
        yield item


#: The marks a session may carry (RFC 0002: its record, or a mirror of it).
MARKS: tuple[Mark, ...] = get_args(Mark)


def durable_given(durable: object) -> None:
    """Refuse a ``durable=`` that is neither None (the sync policy's choice) nor a bool: a
    string ``"false"`` would otherwise be taken as true."""
    if durable is not None and durable.__class__ is not bool:
        raise BadArgumentError(f"durable is True, False or None (the store's sync policy), not {quoted(durable)}")


def expected_head_given(expected: object) -> None:
    """Refuse an expected head (a compare-and-swap's: :meth:`Session.set_head`'s, a push's,
    a ``declare_record``'s) that is neither None (no head) nor a full entry id: a short
    id or a typo is no head at all, and swapping from it would fail, or land a push's
    entries as a branch. The caller's mistake, said before anything is read or sent."""
    if expected is not None and not is_hash(expected):
        raise BadArgumentError(f"the expected head {quoted(expected)} is not an entry id ({HASH_FORM}) nor None (no head)")


def head_target_given(new: object) -> None:
    """Refuse a head target (:meth:`Session.set_head`'s ``new``, a push's ``head.to``) that
    is neither None (no head) nor an entry id, as ``head_target``: whether an entry id is
    one the session may take as its head is the session's to say (``head_refusal``)."""
    if new is not None and not is_hash(new):
        raise not_an_entry_id(new, rule="head", code="head_target")


def walk_up(entry_id: str, step: Callable[[str], tuple[Any, str | None]]) -> list[Any]:
    """:func:`iter_up`'s items in root-first order."""
    out = list(iter_up(entry_id, step))
    out.reverse()
    return out


def entry_from_objects(
    entry_id: str, env: Mapping[str, Any], body: Mapping[str, Any], careful: bool | None = None
) -> Entry:
    """The line an envelope and its body make: the body's members, the envelope's (less
    ``content``), and ``id``. ``careful`` as :func:`canonical.loads_flagged` says."""
    data = dict(body)
    data["type"] = env.get("type")
    data["parent"] = env.get("parent")
    if env.get("parents"):
        data["parents"] = env["parents"]
    data["ts"] = env.get("ts")
    data["id"] = entry_id
    entry = Entry(data, computed_id=entry_id, content_hash=env["content"])
    entry.careful = careful
    return entry


@dataclass
class AppendResult:
    """What an append did.

    ``outcome`` is ``continued`` (the head moved to the entry), ``branched``
    (the parent was not the head; nothing moved), ``no-op`` (the log already
    held the entry), ``head-moved`` (a ``leaf`` label moved the head to its
    target) or ``head-not-moved`` (a ``leaf`` label whose target may not
    hold the head). ``durable`` says whether it was committed before
    returning. ``unresolved`` lists references the store cannot resolve
    (RFC 0002: reported, never a condition of acceptance). ``findings`` are
    problems the rules report but a store does not refuse (a ``request_hash``
    that does not match: refusing would lose a model's output); ``notes`` the
    remarks ``verify`` would make at this entry (an ``of`` its path cannot
    resolve, an output naming no call), which fail nothing.
    """

    id: str
    outcome: str
    head: str | None
    durable: bool
    seq: int | None = None
    unresolved: list[str] = field(default_factory=list)
    note: str | None = None
    findings: list[Any] = field(default_factory=list)
    notes: list[Any] = field(default_factory=list)

    @property
    def head_moved(self) -> bool:
        return self.outcome in ("continued", "head-moved")

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "outcome": self.outcome,
            "head": self.head,
            "head_moved": self.head_moved,
            "durable": self.durable,
            "seq": self.seq,
            "unresolved": list(self.unresolved),
            "note": self.note,
            "findings": [f.as_dict() if hasattr(f, "as_dict") else f for f in self.findings],
            "notes": [n.as_dict() if hasattr(n, "as_dict") else n for n in self.notes],
        }


class _Planned(NamedTuple):
    """One entry of a prepared batch: the entry, its objects, and what it will do (a
    tuple: one is made an append, and a tuple's making costs less than a class's)."""

    entry: Entry
    content: bytes
    env: bytes
    result: AppendResult
    record: Append | None  # None for a no-op


#: A :class:`_Planned` made of a tuple of its five fields in one C call (the named tuple's
#: own ``__new__`` is a Python function: every append makes one).
_planned: Callable[[tuple[Entry, bytes, bytes, AppendResult, Append | None]], _Planned] = functools.partial(tuple.__new__, _Planned)


class PreparedBatch:
    """Entries checked against a session and ready to commit as one step.

    Made by :meth:`Session.prepare`; nothing is written until :meth:`commit`,
    which writes every append record at once (and makes them durable when any
    of them asks to be, or ``durable`` says so). A batch that is not committed
    is dropped by :meth:`discard`, or by the session's next write."""

    def __init__(self, session: Session, planned: list[_Planned], head: str | None, mark: Any):
        self.session = session
        self.planned = planned
        self.head = head
        self._mark = mark
        self.done = False

    @property
    def results(self) -> list[AppendResult]:
        return [p.result for p in self.planned]

    def __len__(self) -> int:
        return len(self.planned)

    def commit(self, *, durable: bool | None = None) -> list[AppendResult]:
        """Write the batch (one write of the log), committed when ``durable`` is True,
        or, by default, when any entry's sync policy asks for it. Returns each entry's
        result, in order."""
        durable_given(durable)
        self.session._commit_batch(self, durable)
        return self.results

    def discard(self) -> None:
        """Drop the batch: the session is as if it had never been prepared."""
        self.session._discard_batch(self)


class Session:
    """A session open for writing (held: one writer) or read as a snapshot."""

    def __init__(self, store: Store, session_id: str, log: SessionLog, header: Header, state: SessionState):
        self.store = store
        self.id = session_id
        self.log = log
        self.header = header
        self.state = state
        self.writable = log.writable
        self.recovered: list[FsckProblem] = []  # what opening recovered, as coded notes
        #: What an import held in place of the head its file names (RFC 0002: reported);
        #: None when it held that head, and for a session opened rather than imported.
        self.head_adjusted: HeadAdjusted | None = None
        #: What an import kept of the header and reports rather than refused (store policy
        #: ``keep``: ``header-member`` problems, as warnings); empty otherwise.
        self.header_findings: list[Problem] = []
        self._closed = False
        self._prefix: list[str] | None = [] if state.base is None else None
        self._prefix_set: frozenset[str] | None = None
        #: The prefix as the restored rules' state counts it, before it is read (:class:`_PrefixView`).
        self._prefix_view: _PrefixView | None = None
        #: The entry last found on no prefix by :meth:`on_prefix` (the prefix is fixed).
        self._off_prefix: str | None = None
        #: The format of whoever writes through this handle (RFC 0002: a header is raised to
        #: its writer's minor): the library's own, or, on a server, the ``Session-Format``
        #: of the client whose append it applies. ``_format_checked``: the one last raised to.
        self.writer_format = FORMAT_WRITTEN
        self._format_checked: str | None = None
        self._context_hashes: ContextHasher | None = None
        self._pending: PreparedBatch | None = None
        #: The rules' reduced state of the session (built on first need), and the
        #: entries of a batch being prepared, which the rules may need to read back.
        self._checker: SessionChecker | None = None
        self._staged: dict[str, Entry] = {}
        #: The rules' state the backend kept (:mod:`.rulestate`), until the first append reads it.
        self._rule_state: dict[str, Any] | None = None
        #: The records a snapshot was opened with (its committed view for exchange).
        self._records: list[dict[str, Any]] | None = None
        #: What ``list`` shows (:mod:`.summary`): the summary the backend kept, when it
        #: describes a prefix of this log, and a writer's builder, fed as it appends.
        self._summary_base: SessionSummary | None = None
        self._builder: SummaryBuilder | None = None
        #: How many entries the log held when a writer last kept its summary (see _keep_summary).
        self._summary_kept = 0
        #: The successor a continued_in link names (once known: see superseded_by).
        self._successor: str | None = None
        self._successor_known = False
        #: The entry types the header's ``records`` names, and the header they were read from.
        self._record_types: frozenset[str] = frozenset()
        self._record_types_of: Header | None = None

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def _open(cls, store: Store, session_id: str, *, writable: bool) -> Session:
        try:
            log, opened = store.backend.sessions.open(session_id, writable=writable)
        except SessionDamagedError as exc:
            raise exc.in_store(store.backend.public_url()) from None
        try:
            header = parse_header(session_id, opened.header)
            state = replay(opened.records)
            damage = [message for _, message in state.damage]
            why = index_damage(state, opened.head_index, opened.length_index, summary=opened.summary, rules=opened.rule_state)
            if why is not None:
                damage.append(why)
            if damage:
                raise SessionDamagedError(
                    damage[0], session=session_id, line=0, offset=0, path=store.backend.sessions.log_source(session_id),
                    store=store.backend.public_url(),
                )
        except BaseException:
            log.close()
            raise
        session = cls(store, session_id, log, header, state)
        session.recovered = list(opened.recovered)
        session._summary_base = _prefix_summary(session_id, state, opened.summary)
        session._summary_kept = len(state.log_order)
        if writable:
            session._rule_state = opened.rule_state
            session._builder = SummaryBuilder(header, copy.copy(session._summary_base))
            try:
                log.recover()
            except BaseException:
                log.close()
                raise
            log.set_indexes(state.head, state.mark)
        else:
            session._records = opened.records
        return session

    @classmethod
    def _created(cls, store: Store, session_id: str, log: SessionLog, header: Header, records: Sequence[Record]) -> Session:
        """A session just created whole: its state is what its records say (as the
        backend wrote them, when it folded them: ``SessionLog.created_records``)."""
        written, log.created_records = log.created_records, None
        state = replay(written if written is not None else (_data(r) for r in records))
        session = cls(store, session_id, log, header, state)
        session._builder = SummaryBuilder(header)
        return session

    # -- the state, as attributes -----------------------------------------------------------

    @property
    def base(self) -> str | None:
        return self.state.base

    @property
    def head(self) -> str | None:
        return self.state.head

    @property
    def mark(self) -> Mark:
        return self.state.mark

    @property
    def own(self) -> OwnSeqs:
        """Own entry id -> its sequence number."""
        return self.state.own

    @property
    def log_order(self) -> OwnOrder:
        return self.state.log_order

    @property
    def leaf_labels(self) -> set[str]:
        return self.state.leaf_labels

    @property
    def is_record(self) -> bool:
        return self.mark == "record"

    def is_committed(self, entry_id: str) -> bool:
        return self.state.is_committed(entry_id)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- reading ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.state.log_order)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.state.own

    def entry(self, entry_id: str) -> Entry:
        """An entry rebuilt from its envelope and content objects, both verified."""
        return self.store.entry(entry_id)

    def __iter__(self) -> Iterator[Entry]:
        """Own entries in log order."""
        yield from self.store.entries(self.state.log_order)

    entries = __iter__

    @property
    def prefix(self) -> list[str]:
        """The ids root..base (base included; empty without a base), read from the
        envelopes on first use: opening a fork costs its own log, not its base's depth."""
        if self._prefix is None:
            try:
                self._prefix = self.store.ancestry(self.base) if self.base is not None else []
            except (NoSuchObjectError, CorruptObjectError) as exc:
                raise StoreError(f"session {self.id}: its prefix cannot be read: {exc}") from None
            self._prefix_set = None
        return self._prefix

    @prefix.setter
    def prefix(self, ids: list[str]) -> None:
        self._prefix, self._prefix_set = list(ids), None

    def ancestry(self, entry_id: str) -> list[str]:
        """The ids root..``entry_id`` of an entry of this session, as
        :meth:`Store.ancestry` gives them: an own entry's path up to the base read in bulk
        along the log order (:meth:`Store.ancestry_along`), then the prefix the session
        holds (read once, kept); an entry on the prefix is a piece of it. An entry of
        neither is walked as :meth:`Store.ancestry` walks it."""
        if entry_id not in self.own:
            if self.base is not None and entry_id in self.prefix_set:
                prefix = self.prefix
                return prefix[: prefix.index(entry_id) + 1]
            return self.store.ancestry(entry_id)
        up, rest = self.store.ancestry_along(entry_id, self.log_order)
        up.reverse()
        if rest is None:
            return up
        above = self.prefix if rest == self.base else self.store.ancestry(rest)
        return [*above, *up]

    @property
    def prefix_set(self) -> frozenset[str]:
        if self._prefix_set is None:
            self._prefix_set = frozenset(self.prefix)
        return self._prefix_set

    def on_prefix(self, entry_id: str) -> bool:
        """Whether ``entry_id`` is on the prefix (root..base, base included). Until the
        prefix is read, an entry the object store does not hold is on none (a prefix's
        objects are stored, made durable when the fork was made): the common question,
        about an entry being appended, reads no envelope of the prefix."""
        base = self.state.base
        if base is None:
            return False
        if entry_id == base:
            return True
        if self._prefix is None:
            if entry_id == self._off_prefix:
                return False  # (an append asks of its entry several times: one look)
            if not self.store.objects.exists("entries", entry_id):
                self._off_prefix = entry_id
                return False
        return entry_id in self.prefix_set

    def _prefix_len(self) -> int:
        """How many entries the prefix holds: counted by the restored rules' state until
        the prefix is read."""
        if self._prefix is None and self._prefix_view is not None:
            return len(self._prefix_view)
        return len(self.prefix)

    def prefix_entries(self) -> list[Entry]:
        return list(self.store.entries(self.prefix))

    def context_hash(self, entry_id: str | None = None) -> str:
        """RFC 0002's context hash ("Prefix caching") at an entry of this session (its
        prefix or its own), by default at the head: the key a provider's prompt cache
        can use. Computed along the session once, when first asked, then kept up to
        date by every append of this handle, so each later append costs one step."""
        if self._context_hashes is None:
            from ..format.context import ContextHasher

            hasher = ContextHasher()
            for e in self.prefix_entries():
                hasher.feed(e)
            for eid in self.state.log_order:
                hasher.feed(self.entry(eid))
            self._context_hashes = hasher
        target = self.head if entry_id is None else entry_id
        if target is not None and target not in self._context_hashes:
            raise NoSuchEntryError(f"{target} is not an entry of session {self.id}")
        return self._context_hashes.get(target)

    def records(self) -> list[dict[str, Any]]:
        """The log's records as held now (the session's history)."""
        return self.store.backend.sessions.history(self.id).records

    def projection(self) -> bytes:
        """RFC 0002 "Projection to JSONL": header, prefix root first, own entries in log
        order, and a synthetic ``leaf`` label only when the resume rule over those lines
        would not name the head. Byte-stable. (:meth:`projection_lines` streams it.)"""
        from ..format.rules import gc_paused

        with gc_paused():
            return b"".join(self.projection_lines())

    def projection_lines(self) -> Iterator[bytes]:
        """:meth:`projection`, one line at a time, each built from the stored objects as
        it is reached (:func:`~agentsession_cas.format.hashing.line_from_objects`: the
        content's canonical bytes spliced, not parsed and encoded again). What it holds
        while it goes is bounded by the session's entry count, not its bytes: each
        entry's id and parent (for the resume rule, which decides the synthetic marker at
        the end), and a ``label`` entry's members."""
        for lines in self.projection_chunks():
            yield from lines

    def projection_chunks(self) -> Iterator[list[bytes]]:
        """:meth:`projection_lines` a chunk of lines at a time (what the walk reads at
        once): for a writer that joins them, without a step per line."""
        yield [self.header.canonical_line()]
        walk = _ProjectionWalk(self)
        for chunk in walk.chunks():
            yield lines_from_objects(chunk)
        marker = walk.marker()
        if marker is not None:
            yield [marker.canonical_line()]

    def projection_entries(self) -> Iterator[Entry]:
        """The entries of :meth:`projection_lines`, each what parsing its line gives
        (:func:`~agentsession_cas.format.hashing.line_members`: the content parsed once, no
        line made), the synthetic marker last when there is one: what a listing reads.
        Held while it goes: what :meth:`projection_lines` holds."""
        walk = _ProjectionWalk(self)
        for entry_id, env, content, _ in walk.objects():
            assert content is not None
            data, careful, item = line_members(entry_id, env, content)
            entry = Entry(data, computed_id=entry_id, content_hash=env["content"])
            entry.careful = careful
            entry.item_bytes = item
            yield entry
        marker = walk.marker()
        if marker is not None:
            data, careful = loads_flagged(marker.canonical_line())
            entry = Entry(data, computed_id=marker.id, content_hash=marker.content_hash)
            entry.careful = careful
            yield entry

    def projection_outline(self) -> ProjectionOutline:
        """The shape of the projection's entries (ids, parents, types, labels, the synthetic
        marker included) from the envelopes, reading only a ``label``'s content: what a
        listing needs before its first line, for the cost of the entry count. It names
        each entry's content too, so the listing then reads the contents alone
        (:meth:`ProjectionOutline.content`): every object is read once."""
        walk = _ProjectionWalk(self)
        out = ProjectionOutline()
        for chunk, members, parents, labels in walk.outline_chunks():
            out.extend(chunk, members, parents, labels)
        marker = walk.marker()
        if marker is not None:
            out.add(marker.id, marker.parent, marker.type, None, marker.data, marker.content_hash)
            out.marker = marker
        return out

    def _projection_ids(self) -> Iterator[str]:
        yield from self.prefix
        yield from self.state.log_order

    # -- the summary ----------------------------------------------------------------------

    def summary(self) -> SessionSummary:
        """What ``list`` shows of the session now. A writer's is kept current as it
        appends; otherwise only the entries since the summary the backend kept are read
        (all of them when it kept none)."""
        builder = self._builder
        if builder is None:
            builder = SummaryBuilder(self.header, copy.copy(self._summary_base))
        for entry in self.store.entries(self.state.log_order[builder.count :]):
            builder.feed(entry)
        if self.writable:
            self._builder = builder
        return copy.copy(builder.finish(head=self.head, base=self.base, mark=self.mark, seq=self.state.max_seq))

    def _summarize_created(self, entry: Entry) -> None:
        """Feed an own entry of a session created whole (import), in log order."""
        if self._builder is not None:
            self._builder.feed(entry)

    def _summarize(self, entry: Entry | None) -> None:
        """Feed an entry just written, when the builder has every one before it."""
        b = self._builder_at(len(self.state.log_order) - 1)
        if b is not None and entry is not None:
            b.feed(entry)

    def _builder_at(self, count: int) -> SummaryBuilder | None:
        """The summary's builder when it holds the first ``count`` own entries: every one
        before the next to feed it."""
        b = self._builder
        return b if b is not None and b.count == count else None

    # -- the rules ------------------------------------------------------------------------

    def rules(self) -> SessionChecker:
        """The session as the one rule set sees it (:class:`SessionChecker`): made on first
        need from the rules' state the backend kept and the own entries after it
        (:mod:`.rulestate`), or built from the prefix and every own entry in log order;
        then fed by every commit. What an append, an admission or a recorder is held to."""
        if self._checker is None:
            kept, self._rule_state = self._rule_state, None
            checker = self._restored_rules(kept) if kept is not None else None
            self._checker = checker if checker is not None else self._build_rules()
        return self._checker

    def _build_rules(self) -> SessionChecker:
        """The rules' state built from the prefix and every own entry, in log order."""
        from ..format.rules import SessionChecker, gc_paused

        checker = SessionChecker(self.header, loader=self._rules_entry)
        links: list[Entry] = []
        with gc_paused():
            checker.add_prefix(self.prefix_entries())
            for e in self.store.entries(self.state.log_order):
                checker.add(e, prefix=False)
                if e.type == "link":
                    links.append(e)
        if not self._successor_known:  # every own entry was read: the successor is free
            self._successor, self._successor_known = successor_of(links), True
        return checker

    def _restored_rules(self, kept: Mapping[str, Any]) -> SessionChecker | None:
        """The rules' state the backend kept, when it stands for a prefix of this log under
        this header, fed the own entries after it; None otherwise (a state of another
        form, a log repaired or cut since: the caller builds it)."""
        from . import rulestate

        state = self.state
        order = state.log_order
        if not rulestate.usable(kept, self.header, order, state.own):
            return None
        last_seq = state.own[kept["last"]] if kept["entries"] else 0  # (0: a fork's first state, its prefix alone)
        leaf_labels = [x for x in state.leaf_labels if state.own[x] <= last_seq]
        # A fork's prefix not read yet is not read for this: counted by the state (restore
        # checks that the entry it counts last is the base, where the state's tip is).
        view = _PrefixView(self, kept["order"] - kept["entries"]) if self._prefix is None and self.base is not None else None
        try:
            checker = rulestate.restore(kept, self.header, view if view is not None else self.prefix, order, state.own,
                                        leaf_labels, self._build_rules, self._rules_entry, on_prefix=view)
        except ValueError:
            return None  # a state whose checksum held but whose members are not of the form
        self._prefix_view = view
        for entry in self.store.entries(order[kept["entries"] :]):
            checker.add(entry, prefix=False)
        return checker

    def _kept_rules(self) -> dict[str, Any] | None:
        """The rules' state to keep at close (:func:`.rulestate.capture`), when one was made,
        standing at the head: where the next append most likely hangs."""
        if self._checker is None:
            return None
        from . import rulestate

        checker = self._checker
        if self.head is not None and self.head in checker and not rulestate.stand_at(checker, self.head):
            return None  # (the state of the last close stays: the next open feeds what came since)
        return rulestate.capture(checker, self.header, self._prefix_len(), self.state.log_order, self.state.own)

    def fork_rules(self, fork: Header) -> dict[str, Any] | None:
        """The rules' state a fork of this session at its head starts from, so that it
        need not read its prefix (:func:`.rulestate.fork_state`): made of this session's
        checker where one stands at the head, else of the state the backend kept, when
        either stands for the whole log. None when there is none, or it holds entries
        off the fork's path: the fork's rules are then built from its prefix."""
        from . import rulestate

        state = self.state
        if fork.base is None or fork.base != self.head:
            return None
        checker = self._checker
        kept = self._rule_state if self.writable else self.log.kept_rule_state()
        if checker is not None:
            path = checker.path.path
            at_head = not checker._trials and bool(path) and path[-1].id == self.head
            kept = rulestate.capture(checker, self.header, self._prefix_len(), state.log_order, state.own) if at_head else None
        elif kept is not None and not rulestate.usable(kept, self.header, state.log_order, state.own):
            kept = None
        if kept is None or kept["entries"] != len(state.log_order):
            return None
        return rulestate.fork_state(kept, fork, state.leaf_labels)

    def start_rules(self, kept: dict[str, Any]) -> None:
        """Start a new fork's rules from ``kept`` (:meth:`fork_rules` of its origin): its
        first append restores them, and the backend keeps them for the next open should
        the fork be let go before it appends."""
        self._rule_state = kept
        self.log.set_rule_state(kept)

    @property
    def superseded_by(self) -> str | None:
        """The session this one was continued in: the successor its last
        ``continued_in`` link names, or None. A superseded session refuses appends
        (:class:`SupersededError`). Found once, from the session's summary (which
        reads no entry while the summary the backend kept is current)."""
        if not self._successor_known:
            self._successor, self._successor_known = self.summary().continued_in, True
        return self._successor

    def _rules_entry(self, entry_id: str) -> Entry:
        staged = self._staged.get(entry_id)
        return staged if staged is not None else self.store.entry(entry_id)

    def adopt_rules(self, checker: SessionChecker) -> None:
        """Take the rules' state a caller built for this session's entries (exchange,
        which checked a new session's entries before creating it), instead of building
        it again on first need."""
        self._checker = checker

    def open_run(self) -> OpenRun | None:
        """The run open on the path to the head, with the end reason and pending calls
        its segment reads were it to end there (what a writer closing it writes)."""
        return self.rules().open_run(self.head)

    # -- writing: checks --------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"session {self.id} is closed")
        if self.log.stopped:
            raise StoreError(
                f"session {self.id} stopped writing ({self.log.stopped}); "
                "reopen it to recover from what the disk holds"
            )

    def _check_writable(self, what: str) -> None:
        self._check_open()
        if not self.writable:
            raise ReadOnlyError(f"session {self.id} is open read-only; cannot {what}")
        if self.mark != "record":
            raise MirrorError(f"session {self.id} is a mirror here; it refuses local {what} (only exchange moves it)")

    def _durable_for(self, entry: Entry, durable: bool | None) -> bool:
        if durable is not None:
            return durable
        type_ = entry.data.get("type")
        header = self.header
        if self._record_types_of is not header:  # the header's ``records``, read once per header
            self._record_types_of, self._record_types = header, frozenset(header.records)
        if type_ in self._record_types:
            return True  # RFC 0001: durable before the side effect it precedes
        policy = self.store.sync
        if policy == "always":
            return True
        if policy == "responses":
            if type_ in _DURABLE_ON_RESPONSES:
                return True
            item = entry.data.get("item")
            return type_ == "item" and isinstance(item, dict) and item.get("type") == "function_call_output"
        return False

    def _hash(self, entry: Entry | Mapping[str, Any], head: str | None) -> tuple[Entry, bytes, bytes]:
        """Fill ``parent`` and ``ts`` as an append does, hash, and hold the line to the
        line rules (:func:`~agentsession_cas.format.rules.check_line`: type, ts, I-JSON,
        reserved members, required members, a stated id) as ``verify`` would."""
        given = entry if entry.__class__ is Entry or isinstance(entry, Entry) else None
        if given is not None and "parent" in (d := given.data) and "ts" in d and d.get("id") == given.computed_id:
            data = d  # whole already, and an Entry's data is never changed: shared, not copied
        else:
            if entry.__class__ is not dict and not isinstance(entry, (Entry, Mapping)):
                raise AppendRefusedError(f"an entry is an Entry or a JSON object (a dict), not {type(entry).__name__}: "
                                         f"{quoted(entry)}", rule="json")
            data = dict(entry.data if isinstance(entry, Entry) else entry)
            if "parent" not in data:
                data["parent"] = head
            if "ts" not in data:
                data["ts"] = now_ts()
        careful: bool | None
        if given is not None and given.careful is not None and (data is given.data or given.data.get("ts") == data["ts"]):
            # Made or read by the format core, which walked it once already: its flag
            # says how to serialise (an Entry's data is not changed once made).
            careful = given.careful
        else:
            try:
                careful = needs_careful(data)
            except IJSONError as exc:
                raise AppendRefusedError(f"not I-JSON: {exc}", rule="ijson") from None
        check_line = _CHECK_LINE[0] if _CHECK_LINE else _rules_check_line()
        # The caller's own entry, whole and unchanged, is filled and kept rather than a
        # second object made for the same data (a long session keeps one per entry).
        own = given if given is not None and data is given.data and given.line is None else None
        built, problems = check_line(data, careful=careful, keep_objects=True, require_id=False, into=own)
        objects = built.objects if built is not None else None
        if built is not None:
            built.objects = None
        refused = problems
        if problems:
            # The rules' table: loaded with the rule set by what appends, not by head or list.
            from ..format.codes import RULES

            refused = [p for p in problems if RULES[p.code].store == "refuse"]
        if refused or built is None or objects is None:
            if own is not None:
                own.item_bytes = None
            raise _refusal(refused[0] if refused else problems[0])
        content, env = objects
        if own is not None and built is own:
            return own, content, env
        built.data["id"] = built.computed_id
        built.id = built.computed_id
        return built, content, env

    # -- writing: prepare and commit ----------------------------------------------------------

    def prepare(self, entries: Iterable[Entry | Mapping[str, Any]], *, durable: bool | None = None) -> PreparedBatch:
        """Hash and check entries, in order, against the session as it stands and the
        entries before them in the batch; write nothing. Each may leave ``parent`` (the
        head as the batch leaves it) and ``ts`` (now) to be filled. A refused entry
        raises :class:`AppendRefusedError` and the batch is not made. ``durable``
        overrides the store's sync policy for the whole batch."""
        if isinstance(entries, (str, bytes, bytearray, Mapping, Entry)) or not isinstance(entries, Iterable):
            raise BadArgumentError(f"prepare takes entries (an iterable of Entry or JSON objects), not one "
                                   f"{type(entries).__name__}: {quoted(entries)}")
        durable_given(durable)
        self._check_writable("appends")
        self._drop_pending()
        checker = self.rules()
        trial = checker.begin()
        try:
            return self._prepare(entries, durable, checker, trial)
        except BaseException:
            checker.rollback(trial)
            self._staged.clear()
            raise

    def _prepare(
        self, entries: Iterable[Entry | Mapping[str, Any]], durable: bool | None, checker: SessionChecker, trial: Trial
    ) -> PreparedBatch:
        state = self.state
        head = state.head
        added: dict[str, Append] = {}
        planned: list[_Planned] = []
        seq = state.max_seq
        successor = self.superseded_by
        for raw in entries:
            p = self._plan(raw, head, seq, added, successor, checker, durable)
            planned.append(p)
            record = p.record
            if record is None:
                continue
            added[record.entry] = record
            head, seq = record.head, record.seq
            # the rest of the batch is refused after a continued_in link, as after its commit
            successor = _continued_in(p.entry.data) or successor
        batch = PreparedBatch(self, planned, head, trial)
        self._pending = batch
        return batch

    def _plan(
        self, raw: Entry | Mapping[str, Any], head: str | None, seq: int, added: Mapping[str, Append],
        successor: str | None, checker: SessionChecker, durable: bool | None,
    ) -> _Planned:
        """One entry hashed and held to every rule, against the session as it stands, the
        entries ``added`` before it in its batch, the head ``head`` and the last sequence
        number ``seq`` they leave, and ``successor`` (the session a continued_in link
        names): what its append will do, or a refusal raised. It is added to ``checker``."""
        e, content, env = self._hash(raw, head)
        data = e.data
        type_ = data.get("type")
        eid = e.id
        if carries_synthetic(type_, data):
            raise AppendRefusedError(SYNTHETIC_REFUSED, rule="synthetic", code="synthetic", entry=eid)
        state = self.state
        own = state.own
        if eid in own or eid in added:
            seq_of = own.get(eid) or added[eid].seq
            return _Planned(e, content, env, AppendResult(eid, "no-op", head, durable=state.is_committed(eid), seq=seq_of), None)
        if successor is not None:
            raise SupersededError(
                f"session {self.id} was continued in {successor} (a continued_in link): it takes no more appends; "
                f"append to {successor}, the end of its chain",
                session=self.id, successor=successor,
            )
        parent = data.get("parent")
        if self._prefix is None and (parent == state.base or parent in own or parent in added):
            # Below the base: never on the prefix above it (an id hashes its parent's, so no
            # entry is an ancestor of its parent), and asked of no object by the rules either.
            self._off_prefix = eid
        elif state.base is not None and self.on_prefix(eid):  # (no base: on no prefix)
            raise AppendRefusedError(
                f"entry {eid} is {'the base' if eid == self.base else 'on the prefix above the base'}: "
                "an own entry hangs from the base or another own entry, and is not one of them",
                rule="base", code="base_rule", entry=eid,
            )
        # Every rule verify holds the session to, against the session as it stands
        # and the batch so far: the one rule set (format/rules.py).
        self._staged[eid] = e
        problems = checker.add(e, prefix=False)
        findings: list[Any] = []
        notes: list[Any] = []
        if problems:
            from ..format.codes import RULES

            refused = [p for p in problems if RULES[p.code].store == "refuse"]
            if refused:
                raise _refusal(refused[0])
            findings = [p for p in problems if RULES[p.code].store == "finding"]
            notes = [p for p in problems if RULES[p.code].store == "note"]
        outcome, new_head, note = "branched", head, None
        is_leaf_label = type_ == "label" and data.get("label") == LEAF_LABEL
        if is_leaf_label:
            target = data.get("target")
            if "target" in data and checker.tree.head_allowed(target):
                outcome, new_head = "head-moved", target
            else:
                outcome = "head-not-moved"
                note = f"label target {target} may not hold the head (not the base or an own entry, or a leaf label)"
        elif parent == head:
            outcome, new_head = "continued", eid
        seq += 1
        moved = new_head != head or outcome in ("continued", "head-moved")
        durable_now = self._durable_for(e, durable)
        # (positional: every append makes one, and keywords cost twice the call)
        record = Append(seq, eid, new_head, moved, is_leaf_label, not durable_now, (e.content_hash, content, env))
        unresolved = [] if _NAMING.isdisjoint(data) else self._unresolved(e, added)  # (the common entry names nothing)
        res = AppendResult(eid, outcome, new_head, durable_now, seq, unresolved, note, findings, notes)
        return _planned((e, content, env, res, record))

    def discard_prepared(self) -> None:
        """Drop a batch prepared and not committed (another write comes first)."""
        self._drop_pending()

    def _drop_pending(self) -> None:
        if self._pending is not None:
            self._discard_batch(self._pending)

    def _discard_batch(self, batch: PreparedBatch) -> None:
        if batch.done:
            return
        batch.done = True
        if self._pending is batch:
            self._pending = None
            if self._checker is not None:
                self._checker.rollback(batch._mark)
            self._staged.clear()

    def _commit_batch(self, batch: PreparedBatch, durable: bool | None) -> None:
        if batch.done:
            raise StoreError("this batch was committed or discarded already")
        if self._pending is not batch:
            raise StoreError("this batch is stale: the session was written since it was prepared")
        self._check_writable("appends")
        self._commit_checked(batch, durable)

    def _commit_checked(self, batch: PreparedBatch, durable: bool | None) -> None:
        """Write a batch that is the session's pending one, the session writable (what
        :meth:`_commit_batch` checks)."""
        try:
            self._write_planned(batch.planned, durable)
        except BaseException:
            batch.done = True
            self._pending = None
            self._checker_rollback(batch._mark)
            raise
        batch.done = True
        self._pending = None
        self._checker_commit(batch._mark)

    def _checker_commit(self, trial: Trial) -> None:
        if self._checker is not None:
            self._checker.commit(trial)
        self._staged.clear()

    def _checker_rollback(self, trial: Trial) -> None:
        if self._checker is not None:
            self._checker.rollback(trial)
        self._staged.clear()

    def _write_planned(self, planned: Sequence[_Planned], durable: bool | None) -> None:
        """Write the append records of ``planned`` (one write of the log), committed when
        ``durable`` says so or, when it is None, when any of them asks to be; then take
        them into the session's state."""
        records: Sequence[Append]
        if len(planned) == 1:  # (an append's write)
            one = planned[0].record
            if one is None:
                return
            records = (one,)
        else:
            records = [p.record for p in planned if p.record is not None]
            if not records:
                return
        if durable is None:
            commit = False
            for r in records:  # (a loop, not any() over a generator: one record, most often)
                if not r.lazy:
                    commit = True
                    break
        else:
            commit = durable
        if commit:
            for r in records:
                r.lazy = False
            for p in planned:
                if p.record is not None:
                    p.result.durable = True
        if self._format_checked is not self.writer_format:
            self._raise_format()
        note = self.log.write(records, commit=commit)
        state = self.state
        own, log_order = state.own, state.log_order
        hashes = self._context_hashes
        builder = self._builder_at(len(log_order))  # (fed these when it holds every one before them)
        for p in planned:
            if p.record is None:
                continue
            r = p.record
            if not own.add(r.entry, r.seq):  # (planned against this state: never own already)
                raise StoreError(f"entry {r.entry} was written twice")
            log_order.append(r.entry)
            if r.leaf_label:
                state.leaf_labels.add(r.entry)
            state.max_seq = r.seq
            if r.head_moved:
                state.head = r.head
            if hashes is not None:
                hashes.feed(p.entry)
            if builder is not None:
                builder.feed(p.entry)
            successor = _continued_in(p.entry.data)
            if successor is not None:
                self._successor, self._successor_known = successor, True
            if b"sidecar:" in p.content:  # (the common case names no blob: no call)
                p.result.unresolved.extend(self._hold_blobs(p.content))
        if commit:
            state.committed_seq = state.max_seq
            self._keep_summary()
        if note is not None:
            planned[-1].result.note = note

    def append(self, entry: Entry | Mapping[str, Any], *, durable: bool | None = None) -> AppendResult:
        """Append one entry (RFC 0002 "Append"); see :class:`AppendResult` for what it reports.

        ``parent`` defaults to the head and ``ts`` to now. ``durable`` overrides
        the store's sync policy for this append.
        """
        # prepare and commit of a batch of one, without the batch: its entry planned
        # as prepare plans each, written as commit writes a batch's
        if durable is not None and durable.__class__ is not bool:
            durable_given(durable)
        if self._closed or self.log.stopped or not self.writable or self.state.mark != "record":
            self._check_writable("appends")  # (which says why)
        if self._pending is not None:
            self._drop_pending()
        checker = self._checker if self._checker is not None else self.rules()
        trial = checker.begin()
        try:
            state = self.state
            successor = self._successor if self._successor_known else self.superseded_by
            p = self._plan(entry, state.head, state.max_seq, _NOTHING_ADDED, successor, checker, durable)
            self._write_planned((p,), None)
        except BaseException:
            self._checker_rollback(trial)
            raise
        self._checker_commit(trial)
        return p.result

    def _unresolved(self, e: Entry, added: Mapping[str, Any]) -> list[str]:
        """References RFC 0002 lets a store report and not refuse: ones it cannot resolve
        (among the session's own entries, the batch's so far, and the prefix)."""
        data = e.data
        if _NAMING.isdisjoint(data):
            return []
        names: list[str] = []
        if "parents" in data:
            for ref in e.parents:
                if ref.session is None or ref.session == self.id:
                    names.append(ref.entry)
        for member in _ENTRY_NAMING:
            v = data.get(member)
            if v.__class__ is str:
                names.append(v)
        if not names:
            return []
        own = self.state.own
        return [n for n in names if n not in own and n not in added and n != e.id and not self.on_prefix(n)]

    def _hold_blobs(self, content: bytes) -> list[str]:
        """Hold the blobs an appended content names by ``sidecar:`` URL, after its record
        is written (RFC 0002: an accepted append holds its objects; a sweep that looked
        before keeps a held file), and name those not here."""
        names = sidecar_names(content)
        if not names:
            return []
        missing = self.store.objects.hold([("blobs", b) for b in names], written=set(names))
        return [f"sidecar:{name}" for _, name in missing]

    def _raise_format(self) -> None:
        """RFC 0002: a writer of a later minor raises the header's format, durably, first:
        to the writer's minor (:attr:`writer_format`), not past it, so a reader of that
        minor still reads the session."""
        mine, theirs = parse_format(self.writer_format), self.header.format_version
        if theirs is not None and mine is not None and theirs < mine:
            data = dict(self.header.data, format=f"agentsession/{mine[0]}.{mine[1]}")
            self.log.set_header(canonical_bytes(data) + b"\n")
            self.header = Header(data)
        self._format_checked = self.writer_format

    def checkpoint(self) -> None:
        """Write out every object the log alone holds so far (a backend that batches
        them does so every 1024 appends and at close); other processes then find them."""
        if self.writable and not self._closed:
            self.log.checkpoint()

    def commit(self) -> None:
        """Make every append so far durable."""
        if not self.writable or self._closed:
            return
        self._check_open()
        self._drop_pending()
        if self.state.committed_seq >= self.state.max_seq:
            return
        self.log.commit()
        self.state.committed_seq = self.state.max_seq
        self.log.set_indexes(self.head, self.mark)
        self._keep_summary()

    def _keep_summary(self) -> None:
        """Just after a commit: every :data:`SUMMARY_EVERY` entries, hand the backend the
        summary as it is now, where the writer's builder has every entry (it then costs no
        read), so that ``list`` beside a writer that holds its session open for hours (a
        recorder, a server) reads at most that many entries, not all since it opened."""
        n = len(self.state.log_order)
        if n - self._summary_kept < SUMMARY_EVERY:
            return
        self._summary_kept = n
        if self._builder_at(n) is None:
            return
        try:
            self.log.keep_summary(self.summary().as_dict())
        except AgentSessionError:
            pass  # (an index: the one kept at close, or a reader, makes it again)

    def set_head(self, new: str | None, *, expected: str | None) -> None:
        """Compare-and-swap the head, durably. ``expected`` None means "no head"."""
        expected_head_given(expected)
        self._check_writable("head moves")
        self._drop_pending()
        if self.head != expected:
            raise HeadMovedError(
                f"the head of session {self.id} moved: it is {self.head or 'no head'}, not {expected or 'no head'}"
            )
        head_target_given(new)
        refusal = head_refusal(new, self.base, self.own, self.leaf_labels, self.id)
        if refusal is not None:
            raise AppendRefusedError(refusal[0], rule="head", code=refusal[1])
        self.log.write([{"op": "head", "head": new}], commit=True)
        self.state.head = new
        self.state.committed_seq = self.state.max_seq
        self.log.set_indexes(self.head, self.mark)

    def set_mark(self, mark: Mark) -> None:
        """Set the record mark (``record`` or ``mirror``), committed before it returns."""
        if mark not in MARKS:
            raise BadArgumentError(f"a mark is 'record' or 'mirror', not {quoted(mark)}")
        if not self.writable or self._closed:
            raise ReadOnlyError(f"session {self.id} is open read-only")
        self._check_open()
        self._drop_pending()
        self.log.write([{"op": "mark", "mark": mark}], commit=True)
        self.state.mark = mark
        self.state.committed_seq = self.state.max_seq
        self.log.set_indexes(self.head, self.mark)

    def close(self) -> None:
        """Commit, checkpoint and release the session. A session whose writes stopped (a
        failed fsync) writes nothing more: it only lets go, and the next open recovers
        from what the storage holds."""
        if self._closed:
            return
        try:
            self._drop_pending()
            if self.writable and not self.log.stopped:
                self.commit()
                try:
                    self.log.checkpoint()
                    self.log.set_indexes(self.head, self.mark)
                except OSError:
                    # Everything is committed, and the log holds the objects a checkpoint
                    # would write (their payloads) and what the indexes say: the next
                    # writing open writes them. An append acknowledged durable must not be
                    # reported failed (a retry would record it twice) because a full disk
                    # refused these copies.
                    pass
                try:
                    self.log.set_summary(self.summary().as_dict())
                except AgentSessionError:
                    pass  # an entry that does not read: fsck's to say; the summary is rebuilt later
                try:
                    kept = self._kept_rules()
                except AgentSessionError:
                    kept = None  # an entry the move to the head reads does not: the state is rebuilt later
                if kept is not None:
                    self.log.set_rule_state(kept)
        finally:
            self._closed = True
            self.log.close()
            self.store._forget(self)

    # -- exchange (agentsession_cas/exchange) ------------------------------------------
    # What a push, a fetch, a handover and a take-back need of a session. None of these
    # checks the record mark: they are how a mirror takes entries, head moves and marks
    # "only through exchange" (RFC 0002).

    def exchange_view(self) -> tuple[Sequence[str], str | None, Mark]:
        """(own entries in log order, head, mark) as last committed: what this session may
        serve to another store. A session open for writing is committed first, so that is
        all of it; a snapshot serves its log only through the last commit, since another
        process's working state is not the session's to serve yet. The entries are a copy
        of the state's order that spells an id only when asked (an incremental push reads
        its length and its last few, not the 100,000 ids of a long session)."""
        if self.writable and not self._closed:
            self.commit()
            return self.state.log_order.copy(), self.head, self.mark
        if self._records is None or self.state.committed_seq >= self.state.max_seq:
            return self.state.log_order.copy(), self.head, self.mark
        view = committed_view(self._records)
        return view.log_order, view.head, view.mark

    def exchange_objects(self, entry_id: str) -> tuple[str, bytes, bytes]:
        """(content hash, content bytes, envelope bytes) of an entry this session holds or
        builds on, verified against their names."""
        return self.exchange_objects_many([entry_id])[0]

    def exchange_objects_many(self, entry_ids: Sequence[str]) -> list[tuple[str, bytes, bytes]]:
        """:meth:`exchange_objects` of each entry, in order, in two bulk reads (envelopes,
        then contents: :meth:`ObjectStore.get_many`), as a projection reads them: a
        push's sender reads its whole closure."""
        objects = self.store.objects
        envs = objects.get_many("entries", entry_ids)
        chashes = []
        for entry_id, env in zip(entry_ids, envs):
            chash = envelope_content(env)
            if chash is None:
                raise CorruptObjectError(
                    f"envelope {entry_id} is not an envelope ({objects.where('entries', entry_id)})",
                    space="entries", name=entry_id, path=objects.where("entries", entry_id),
                )
            chashes.append(chash)
        return list(zip(chashes, objects.get_many("contents", chashes), envs))

    def exchange_admit(
        self,
        entries: list[tuple[str, bool]],
        *,
        known: Mapping[str, Entry] | None = None,
        head: str | None = None,
        move_head: bool = False,
        mark: Mark | None = None,
        header_format: str | None = None,
    ) -> list[str]:
        """Admit own entries through exchange, then move the head, then set the mark: one
        write, committed before it returns (a receiver commits what it admits, and a mark,
        before it acknowledges them). ``entries`` are (id, whether it is a ``leaf``
        label), every object already durable in the object store, parents before
        children, checked by the caller; ones the log holds are skipped. ``known``
        holds such of them as the caller has parsed (the summary is fed from it). A later
        ``header_format`` raises the header's format first, durably. Returns the ids
        appended."""
        self._check_open()
        if not self.writable:
            raise ReadOnlyError(f"session {self.id} is open read-only; cannot admit entries")
        self._drop_pending()
        if mark not in (None, "record", "mirror"):
            raise StoreError(f"mark must be 'record' or 'mirror', not {mark!r}")
        refusal = head_refusal(
            head, self.base, Either(self.own, {e for e, _ in entries}),
            Either(self.leaf_labels, {e for e, leaf in entries if leaf}), self.id,
        ) if move_head else None
        if refusal is not None:
            raise AppendRefusedError(refusal[0], rule="head", code=refusal[1])
        if header_format is not None:
            theirs, mine = parse_format(header_format), self.header.format_version
            if theirs is not None and mine is not None and mine < theirs:
                data = dict(self.header.data, format=header_format)
                self.log.set_header(canonical_bytes(data) + b"\n")
                self.header = Header(data)
        records: list[Record] = []
        added: list[Append] = []
        seen: set[str] = set()
        seq = self.state.max_seq
        for entry_id, leaf in entries:
            if entry_id in self.own or entry_id in seen:
                continue
            seen.add(entry_id)
            seq += 1
            rec = Append(seq, entry_id, None, head_moved=False, leaf_label=leaf, lazy=False)
            records.append(rec)
            added.append(rec)
        if move_head and head != self.head:
            records.append({"op": "head", "head": head})
        else:
            move_head = False
        if mark is not None and mark != self.mark:
            records.append({"op": "mark", "mark": mark})
        else:
            mark = None
        if not records:
            return []
        self.log.write(records, commit=True)
        state = self.state
        for rec in added:
            state.own[rec.entry] = rec.seq
            state.log_order.append(rec.entry)
            if rec.leaf_label:
                state.leaf_labels.add(rec.entry)
            if self._context_hashes is not None:
                # Kept up to date as append keeps it (parents come first: admitted in order).
                self._context_hashes.feed(self.entry(rec.entry))
            self._summarize(known.get(rec.entry) if known else None)
        state.max_seq = max(state.max_seq, seq)
        state.committed_seq = state.max_seq
        if move_head:
            state.head = head
        if mark is not None:
            state.mark = mark
        self.log.set_indexes(self.head, self.mark)
        if added:
            self._successor_known = False  # an admitted continued_in link is found on next need
            self._keep_summary()
        return [r.entry for r in added]

    def exchange_park(self) -> bool:
        """Let go of the hold, keeping what the session knows, so the next exchange into
        it need not read its log again (:meth:`exchange_resume`). False when the backend
        cannot park (the caller closes the session instead)."""
        self._drop_pending()
        if not self.log.park():
            return False
        self.store._forget(self)
        return True

    def exchange_resume(self) -> bool:
        """Take the hold again after :meth:`exchange_park` if nothing wrote the session
        meanwhile; False, holding nothing, when it changed (the caller opens it afresh).
        :class:`SessionLockedError` when another process holds it."""
        if self._closed or self.id in self.store._open:
            return False
        if not self.log.resume():
            return False
        self.store._open[self.id] = self
        return True

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session({self.id!r}, head={short_id(self.head)}, entries={len(self)}, mark={self.mark})"


class _PrefixView(Sequence[str]):
    """A fork's prefix as its restored rules ask it before it is read (reopening a fork
    reads none of its base's entries): its length as the kept state counts it, its last
    entry (the base), and membership (:meth:`Session.on_prefix`); any other entry of it
    is read from the envelopes then (:attr:`Session.prefix`)."""

    def __init__(self, session: Session, length: int):
        self.session, self.length = session, length

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, int) and i in (-1, self.length - 1) and self.session.base is not None:
            return self.session.base
        return self.session.prefix[i]

    def __contains__(self, entry_id: object) -> bool:
        return isinstance(entry_id, str) and self.session.on_prefix(entry_id)


_CHECK_LINE: list[Callable[..., Any]] = []


def _rules_check_line() -> Callable[..., Any]:
    """The rule set's line check, imported on the first append of a process (not when a
    session is only read), then kept: an import statement run per append costs more
    than the line check's own bookkeeping."""
    if not _CHECK_LINE:
        from ..format.rules import check_line

        _CHECK_LINE.append(check_line)
    return _CHECK_LINE[0]


def _continued_in(data: Mapping[str, Any]) -> str | None:
    """The session a ``continued_in`` link entry's members name, or None (any other entry)."""
    if data.get("type") == "link" and data.get("rel") == REL_CONTINUED_IN:
        session = data.get("session")
        if isinstance(session, str):
            return session
    return None


def _refusal(p: Problem) -> AppendRefusedError:
    """The refusal of an entry that breaks a rule: the rule's own words and code, and the
    protocol's code for the refusal (``bad_entry``, ``base_rule``, ``no_entry``, ...)."""
    from ..format.codes import RULES

    return AppendRefusedError(p.message, rule=p.code, code=RULES[p.code].error or "bad_entry", entry=p.entry)


def _data(record: Record) -> dict[str, Any]:
    return record.as_record() if isinstance(record, Append) else record


def parse_header(session_id: str, raw: bytes) -> Header:
    """A stored header, checked as far as opening needs (its own rules are the format's)."""
    try:
        header_obj = loads(raw)
    except (ValueError, AgentSessionError) as exc:
        raise StoreError(f"session {session_id}: header is unreadable: {exc}") from None
    if not isinstance(header_obj, dict) or header_obj.get("type") != "session":
        raise StoreError(f"session {session_id}: header is not a session header object")
    if header_obj.get("id") != session_id:
        raise StoreError(
            f"session {session_id}: its header names session {header_obj.get('id')!r}; the directory and the header disagree"
        )
    return Header(header_obj)


@overload
def envelope_parts(env_bytes: bytes, entry_id: str, objects: ObjectStore) -> tuple[dict[str, Any], bool | None]: ...
@overload
def envelope_parts(
    env_bytes: bytes, entry_id: str, objects: ObjectStore, *, tail: Literal[True]
) -> tuple[dict[str, Any], bytes | None]: ...
def envelope_parts(
    env_bytes: bytes, entry_id: str, objects: ObjectStore, *, tail: bool = False
) -> tuple[dict[str, Any], bool | bytes | None]:
    """An envelope parsed, checked to be one (a content hash named), and its careful
    flag, or with ``tail`` the bytes of its members but ``content`` when it is of the
    common form (:func:`~agentsession_cas.format.hashing.read_envelope`); an error names
    where ``objects`` keeps it (worked out only then: it costs a path per call)."""
    env, careful, why, members = read_envelope(env_bytes)
    if why is not None:
        where = objects.where("entries", entry_id)
        raise CorruptObjectError(f"envelope {entry_id} is not an envelope: {why} ({where})", space="entries", name=entry_id,
                                 path=where)
    return (env, members) if tail else (env, careful)


class _ProjectionWalk:
    """One walk over a session's projection entries (prefix root first, then the own
    entries in log order), keeping what the resume rule needs to decide the synthetic
    ``leaf`` marker at the end: each entry's id and parent, a label's members."""

    def __init__(self, session: Session):
        self.session = session
        self.stubs: list[tuple[str, str | None, Mapping[str, Any] | None]] = []
        self.leaf_labels = False
        self.head_ts: Any = None
        self.last: tuple[str, Any] | None = None

    #: Entries read at once: their envelopes, then their contents, each through one
    #: bulk read of the objects (what the walk holds beyond the ids is this many; 1024
    #: read no faster and held 15 MB more at the export's peak).
    CHUNK = 256

    def objects(self) -> Iterator[tuple[str, dict[str, Any], bytes, bytes | None]]:
        """(id, envelope, content bytes, the envelope's members but ``content`` as bytes
        when it is of the common form, else None) of each entry."""
        for chunk in self.chunks():
            yield from chunk

    def _id_chunks(self) -> Iterator[Sequence[str]]:
        """The projection's ids, :data:`CHUNK` at a time: the prefix's, then the log's."""
        step = self.CHUNK
        for ids in (self.session.prefix, self.session.state.log_order):
            for at in range(0, len(ids), step):
                yield ids[at : at + step]

    def _label(self, content: bytes) -> Mapping[str, Any] | None:
        """A label's members from its content (None when they are no object), noting
        whether it is a leaf label (or clears one): the resume rule then has to be run."""
        label = loads(content)
        if not isinstance(label, dict):
            return None
        self.leaf_labels = self.leaf_labels or label.get("label") in (LEAF_LABEL, None)
        return label

    def chunks(self) -> Iterator[list[tuple[str, dict[str, Any], bytes, bytes | None]]]:
        """:meth:`objects` a chunk at a time (:data:`CHUNK` entries), each chunk read
        in two bulk reads, its envelopes then its contents
        (:meth:`ObjectStore.get_many`: every object verified)."""
        session = self.session
        objects = session.store.objects
        get_many = objects.get_many
        head = session.head
        for chunk in self._id_chunks():
            envs = [envelope_parts(b, entry_id, objects, tail=True) for entry_id, b in zip(chunk, get_many("entries", chunk))]
            bodies = get_many("contents", [env["content"] for env, _ in envs])
            out = []
            stubs = self.stubs
            for entry_id, (env, members), content in zip(chunk, envs, bodies):
                parent = env.get("parent")
                label = self._label(content) if env.get("type") == "label" else None
                stubs.append((entry_id, parent if isinstance(parent, str) else None, label))
                if entry_id == head:
                    self.head_ts = env.get("ts")
                out.append((entry_id, env, content, members))
            if out:
                self.last = (out[-1][0], out[-1][1].get("ts"))
            yield out

    def outline_chunks(self) -> Iterator[tuple[Sequence[str], list[tuple[str, str, Any, str]], dict[int, Any], dict[int, Mapping[str, Any]]]]:
        """What an outline needs of each chunk's entries, from their envelopes (read in one
        bulk read, verified) and their labels' contents: the ids; each envelope's
        ``content``, ``parent`` (``""`` for null), ``ts`` and ``type``; by place in the
        chunk, the ``parents`` of those naming any and a label's members. A chunk of
        envelopes of the common form (all but a merge's) is read by one match
        (:func:`~agentsession_cas.format.hashing.common_envelopes`), any other envelope
        by itself, refused as :meth:`chunks` refuses it."""
        session = self.session
        objects = session.store.objects
        get_many = objects.get_many
        head = session.head
        stubs = self.stubs
        chunks: list[Sequence[str]] = []  # asked for, not yet taken

        def asked() -> Iterator[Sequence[str]]:
            for chunk in self._id_chunks():
                chunks.append(chunk)
                yield chunk

        for raw in objects.get_chunks("entries", asked()):
            chunk = chunks.pop(0)
            members: list[tuple[str, str, Any, str]] | None = common_envelopes(raw)
            parents: dict[int, Any] = {}
            if members is None:
                members = []
                for i, (entry_id, b) in enumerate(zip(chunk, raw)):
                    env, _ = envelope_parts(b, entry_id, objects, tail=True)
                    parent, ts, type_ = env.get("parent"), env.get("ts"), env.get("type")
                    members.append((env["content"], parent if isinstance(parent, str) else "", ts,
                                    type_ if isinstance(type_, str) else ""))
                    if env.get("parents") is not None:
                        parents[i] = env["parents"]
            del raw
            at = [i for i, m in enumerate(members) if m[3] == "label"]
            labels: dict[int, Mapping[str, Any]] = {}
            for i, content in zip(at, get_many("contents", [members[i][0] for i in at])):
                label = self._label(content)
                if label is not None:
                    labels[i] = label
            stubs.extend((entry_id, m[1] or None, labels.get(i)) for i, (entry_id, m) in enumerate(zip(chunk, members)))
            if head in chunk:
                self.head_ts = members[chunk.index(head)][2]
            if chunk:
                self.last = (chunk[-1], members[-1][2])
            yield chunk, members, parents, labels

    def marker(self) -> Entry | None:
        """The synthetic ``leaf`` label that ends the projection, when the resume rule over
        the entries walked would not name the head."""
        if self.last is None:
            return None
        session = self.session
        if self.leaf_labels:
            leaf = _resume_leaf(self.stubs, session.base, session.prefix[:-1])
        else:
            leaf = self.last[0]  # no leaf label, nor a clearing one: the last line is the leaf
        if leaf == session.head:
            return None
        ts = self.head_ts if session.head is not None else self.last[1]
        return make_entry("label", self.last[0], ts=ts, target=session.head, label=LEAF_LABEL, synthetic=True)


class ProjectionOutline:
    """The projection's entries as a listing needs them before printing one: position,
    id, parent, type, how many ``parents`` they name, children counted, labels by target,
    and the content each names. Held per entry: an id, a parent's position, a type shared
    among entries, the content's name as its 32 bytes."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        #: Each entry's content name, as the 32 bytes of its SHA-256, one after another.
        self.contents = bytearray()
        #: The synthetic ``leaf`` marker that ends the projection (its last entry), if any.
        self.marker: Entry | None = None
        #: The parent's position, or -1 for none; a parent not among the entries is kept in ``absent``.
        self.parent_at: list[int] = []
        self.absent: dict[int, str] = {}
        self.types: list[str] = []
        self.converges: dict[int, int] = {}
        self.children: dict[int, int] = {}
        #: target id -> the text of the last label naming it (as ``show`` marks it).
        self.labels: dict[str, str] = {}
        #: Each ``label`` entry's members, by position (the resume rule and ``show --graph`` read them).
        self.label_members: dict[int, Mapping[str, Any]] = {}
        self.index: dict[str, int] = {}
        self._types: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def add(
        self, entry_id: str, parent: Any, type_: Any, parents: Any, label: Mapping[str, Any] | None, content: str
    ) -> None:
        """One entry after those held: what :meth:`extend` does for many."""
        self.extend([entry_id], [(content, parent if isinstance(parent, str) else "", "", type_ if isinstance(type_, str) else "")],
                    {} if parents is None else {0: parents}, {} if label is None else {0: label})

    def extend(
        self, ids: Sequence[str], members: Sequence[tuple[str, str, Any, str]], parents: Mapping[int, Any],
        labels: Mapping[int, Mapping[str, Any]],
    ) -> None:
        """Entries after those held: their ids, each one's (content, parent or ``""``, ts,
        type) and, by place among them, the ``parents`` and a label's members of those that
        have them (:meth:`_ProjectionWalk.outline_chunks`)."""
        base = len(self.ids)
        self.ids.extend(ids)
        # an envelope names a content by hash (checked as it was read): 32 bytes each
        self.contents += bytes.fromhex("".join([m[0] for m in members]).replace(HASH_PREFIX, ""))
        index, absent, children, parent_at, types, interned = self.index, self.absent, self.children, self.parent_at, self.types, self._types
        for pos, entry_id, (_, parent, _, type_) in zip(range(base, base + len(ids)), ids, members):
            index[entry_id] = pos
            types.append(interned.setdefault(type_, type_))
            if parent:
                at = index.get(parent, -1)
                if at < 0:
                    absent[pos] = parent
                else:
                    children[at] = children.get(at, 0) + 1
                parent_at.append(at)
            else:
                parent_at.append(-1)
        for i, refs in parents.items():
            n = sum(1 for r in refs if isinstance(r, dict) and isinstance(r.get("entry"), str)) if isinstance(refs, list) else 0
            if n:
                self.converges[base + i] = n
        for i, label in labels.items():
            target = label.get("target")
            if members[i][3] == "label":
                self.label_members[base + i] = label
            if members[i][3] == "label" and isinstance(target, str):
                text = label.get("label")
                self.labels[target] = text if isinstance(text, str) else ""

    def content(self, pos: int) -> str:
        """The name of the content object of the entry at ``pos``."""
        return HASH_PREFIX + self.contents[32 * pos : 32 * pos + 32].hex()

    def parent(self, pos: int) -> str | None:
        at = self.parent_at[pos]
        return self.ids[at] if at >= 0 else self.absent.get(pos)

    def roots(self) -> int:
        """Entries whose parent is null or not among the entries."""
        return sum(1 for at in self.parent_at if at < 0)

    def leaves(self) -> int:
        return len(self.ids) - len(self.children)

    def path(self, entry_id: str) -> list[int]:
        """Positions from the root to ``entry_id``, following ``parent`` alone."""
        out: list[int] = []
        at = self.index[entry_id]
        seen: set[int] = set()
        while at >= 0 and at not in seen:
            seen.add(at)
            out.append(at)
            at = self.parent_at[at]
        out.reverse()
        return out


def _resume_leaf(
    stubs: Iterable[tuple[str, str | None, Mapping[str, Any] | None]], base: str | None, above_base: Sequence[str]
) -> str | None:
    """The resume rule over a projection's lines, from what :meth:`Session.projection_lines`
    kept of each (id, parent, a label's members): the format's :class:`Tree`, fed
    entries holding no more than the rule reads."""
    return _resume_tree(stubs, base, above_base).resume_leaf()


def _resume_tree(
    stubs: Iterable[tuple[str, str | None, Mapping[str, Any] | None]], base: str | None, above_base: Sequence[str],
) -> Tree:
    """The tree the resume rule reads (:func:`_resume_leaf`)."""
    entries = []
    for entry_id, parent, label in stubs:
        data: dict[str, Any] = dict(label) if label is not None else {}
        data.update(id=entry_id, parent=parent, type="label" if label is not None else "")
        entries.append(Entry(data, computed_id=entry_id, content_hash=""))
    return Tree(entries, base=base, prefix=above_base)


def _prefix_summary(session_id: str, state: SessionState, kept: Mapping[str, Any] | None) -> SessionSummary | None:
    """The summary a backend kept, when it describes a prefix of the log replayed: its
    count of entries within the log's, its last entry where the log has it. Anything
    else (a log repaired, cut, or another session's file) is a summary to rebuild."""
    if kept is None:
        return None
    s = SessionSummary.from_dict(kept)
    if s is None or s.id != session_id or s.entries > len(state.log_order) or s.seq > state.max_seq:
        return None
    if s.entries and state.log_order[s.entries - 1] != s.last_entry:
        return None
    return s
