"""The append rules' state of a session, kept beside its log so an append need not read the session (issue 11).

An append is admitted only as ``verify`` would accept it, so a writer holds the
session in the one rule set (:class:`~agentsession_cas.format.rules.SessionChecker`),
and building that from the entries costs the whole session. :func:`capture` takes
what the rules need to judge the *next* entries at the tip of the path they stand
on, without the entries themselves: the tree's ids are the log's (the replay's
``own`` and the prefix), and of the path only its depth, the calls that may still
be named (each call id whose stack on the path holds a call without its output or
one the open run took up), the open run, the last response, the dispatches naming
those calls, the call ids of the session, the problems reported (each is reported
once) and the diagnosis budget. :func:`restore` makes a :class:`RestoredChecker` of
it, positioned at that tip.

The context builder's running request hash is kept too (``context``: its SHA-256
state at the tip, and before the run of output items the tip ends, through
:mod:`~agentsession_cas.format.resumable`, with the request's members around the
items), so a ``response`` appended at the tip is judged without its path: where this
machine's SHA-256 state cannot be read, none is kept. What is not kept is never
guessed: the entries of the path above its tip stand as *hollow* entries. Any rule
that reads what was not kept (a mismatched request hash that verified for a response
before the tip, which its words name: only the hashes' keys are kept; a compaction, a ``config``, a walk back over the path, a move to another
branch, a call whose output came long ago) raises :class:`NeedsRebuild`
inside the checker, which then builds the whole state from the session, as it
always did, replays the entries it was given since it was restored (reopening the
trials open), and answers from that: its verdicts are a rebuilt checker's by
construction, the restored state only saves the work where it holds the answer.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..backends.digests import DigestTable
from ..errors import ContextError
from ..format import resumable
from ..format.context import ContextBuilder, Settings, _Raw, replay_settings, walk_outputs
from ..format.entry import Entry, Header
from ..format.rules import OpenRun, PathChecker, SessionChecker, TreeState, Trial
from ..format.runs import RecordWalker, _Call, _Run, output_calls

if TYPE_CHECKING:
    from ..format.results import VerifyReport

__all__ = [
    "NeedsRebuild", "RestoredChecker", "VERSION", "capture", "capture_pass", "check_form", "fork_state", "header_key", "restore", "stand_at",
    "usable",
]

#: The version of the state's form; another one is rebuilt, never read.
VERSION = 2
#: The forms read: version 1 kept each call id whole (``first_call``), and is read by
#: taking their keys (rebuilding a big session's state costs seconds, once per session).
READ_VERSIONS = (1, 2)
#: Bytes of a call id's key (:func:`call_key`).
CALL_KEY = 8
#: The most config and compaction entries whose ids the state keeps to replay the settings
#: in force (a path with more keeps none: a config below its tip rebuilds).
SETTINGS_KEPT = 256


class NeedsRebuild(Exception):
    """A rule asked a restored checker for what its state did not keep."""


#: What a restored checker answers by rebuilding: a question its state does not hold.
#: (A state whose members are not of the form is refused whole by :func:`restore`, so a
#: TypeError or KeyError in a rule is a slip of the code, never taken for "rebuild".)
_REBUILD = (NeedsRebuild,)


class _Hollow:
    """An entry of the restored path whose members were not kept: any use of it is a
    question the restored state cannot answer."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        raise NeedsRebuild(f"an entry of the path above the tip ({name})")

    def __getitem__(self, index: Any) -> Any:
        raise NeedsRebuild("the path above the tip")

    def __index__(self) -> int:  # (the walker's depth of the last response above the tip)
        raise NeedsRebuild("the path above the tip")


HOLLOW: Any = _Hollow()


class _Partial:
    """An entry of which the state kept the id and the members the rules read of it
    (a run's start, the last response, a call, a link); any other member asked for
    is a question for the rebuilt state."""

    __slots__ = ("id", "_type", "_members")
    line = None  # a stored entry was read from no file line

    def __init__(self, entry_id: str, type_: str | None = None, members: Mapping[str, Any] | None = None):
        self.id = entry_id
        self._type = type_
        self._members = members or {}

    @property
    def type(self) -> str:
        if self._type is None:
            raise NeedsRebuild(f"the type of entry {self.id}")
        return self._type

    def get(self, key: str, default: Any = None) -> Any:
        if key in self._members:
            v = self._members[key]
            return default if v is None else v
        raise NeedsRebuild(f"member {key} of entry {self.id}")

    def __getattr__(self, name: str) -> Any:  # data, parent, ...: not kept
        raise NeedsRebuild(f"{name} of entry {self.id}")


_MISS = object()


class _Restored:
    """The test the restored containers share: is an id one of the entries the state
    stands for (the prefix, and the own entries up to the state's last), which the
    containers need not hold, rather than one fed since (which they do)."""

    def __init__(self, fed: dict[str, Any], prefix: Container[str], own_seq: Mapping[str, int], last_seq: int):
        self.fed, self.prefix, self.own_seq, self.last_seq = fed, prefix, own_seq, last_seq

    def __call__(self, key: Any) -> bool:
        if dict.__contains__(self.fed, key) or not isinstance(key, str):
            return False
        return self.own_seq.get(key, self.last_seq + 1) <= self.last_seq or key in self.prefix


class _Known(dict):
    """A map the restored checker holds for the tip and the entries fed since: a miss
    on an entry the state stands for is a question for the rebuilt state (``what`` it
    asked, in words)."""

    restored: _Restored
    what = "{}"

    def get(self, key: Any, default: Any = None) -> Any:
        v = dict.get(self, key, _MISS)
        if v is _MISS:
            if self.restored(key):
                raise NeedsRebuild(self.what.format(key))
            return default
        return v


class _Seq(_Known):
    """Each entry's place in the order fed (the path checker's and the walker's map):
    an entry the state stands for is known to be there, and only the tip's place is
    asked. Not a copy of 100,000 ids per open."""

    what = "the place of {} in the order"

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self.restored(key)

    def __missing__(self, key: Any) -> Any:
        if self.restored(key):
            raise NeedsRebuild(self.what.format(key))
        raise KeyError(key)


class _Order:
    """The ids in the order fed (the path checker's list): the prefix, the first ``n`` own
    entries of the log (read from the session's own order, not copied: 100,000 ids are
    100,000 strings), then those fed since, which alone a rollback takes back."""

    def __init__(self, prefix: Sequence[str], own: Sequence[str], n: int):
        self.prefix, self.own, self.n = prefix, own, n
        self.fed: list[str] = []

    def __len__(self) -> int:
        return len(self.prefix) + self.n + len(self.fed)

    def __getitem__(self, i: int) -> str:
        p, n = len(self.prefix), self.n
        if i < 0:
            i += p + n + len(self.fed)
        if not 0 <= i < p + n + len(self.fed):
            raise IndexError("order index out of range")
        if i < p:
            return self.prefix[i]
        return self.own[i - p] if i < p + n else self.fed[i - p - n]

    def append(self, entry_id: str) -> None:
        self.fed.append(entry_id)

    def __delitem__(self, at: slice) -> None:
        start = at.start - len(self.prefix) - self.n
        if start < 0 or at.stop is not None or at.step is not None:
            raise NeedsRebuild("a rollback above the restored tip")
        del self.fed[start:]


class _Above(list):
    """The tree's prefix above the base, of a restored fork whose prefix was not read: only
    its length is asked (a trial's mark), and nothing is added to it (the prefix is in)."""

    def __init__(self, length: int):
        super().__init__()
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __delitem__(self, at: Any) -> None:
        if not (isinstance(at, slice) and at.start == self.length and at.stop is None):
            raise NeedsRebuild("the prefix above the base")


class _OwnSince(set):
    """The tree's own entries of a fork: those the state stands for (known from the log)
    and those added since (held here, which alone a rollback discards)."""

    restored: _Restored

    def __contains__(self, key: object) -> bool:
        return set.__contains__(self, key) or (
            isinstance(key, str) and self.restored.own_seq.get(key, self.restored.last_seq + 1) <= self.restored.last_seq)


class _Held(dict):
    """The tree's ids (id -> the line it was read from): the entries the state stands
    for, known from the log, and those fed since."""

    restored: _Restored

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self.restored(key)

    def get(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        return None if self.restored(key) else default

    def __len__(self) -> int:
        raise NeedsRebuild("the number of entries")


class _Calls(_Known):
    """The walker's calls on the path by entry id: the kept ones and those pushed since;
    a miss on an entry the state stands for may be a call it did not keep."""

    what = "call {} on the path"

    def __init__(self, items: Iterable[tuple[str, Any]], restored: _Restored):
        super().__init__(items)
        self.restored = restored


class _ByCallId(dict):
    """The last call on the path by call id (its stack linked below it): every stack of a
    call id in use kept whole; a miss on a call id the session used before the tip may be
    one not kept."""

    def __init__(self, items: Iterable[tuple[str, Any]], first_call: _FirstCall):
        super().__init__(items)
        self.first_call = first_call

    def _check(self, key: Any) -> None:
        if not dict.__contains__(self, key) and not dict.__contains__(self.first_call, key) \
                and self.first_call.used_before(key):
            raise NeedsRebuild(f"the calls of call id {key!r} on the path")

    def get(self, key: Any, default: Any = None) -> Any:
        self._check(key)
        return dict.get(self, key, default)


def call_key(call_id: str) -> bytes:
    """What the state keeps of a call id the session used: 8 bytes of its BLAKE2b. Two ids
    may share one, so a key found is a question for the rebuilt state, never an answer."""
    return hashlib.blake2b(call_id.encode("utf-8", "surrogatepass"), digest_size=CALL_KEY).digest()


class _FirstCall(dict):
    """Each call id's first function call, for those used since the tip (id -> entry); of
    those used before it only their keys are kept (``kept``): whether one of them was
    used, and where, is asked of the rebuilt state (only a repeat asks)."""

    kept: DigestTable

    def used_before(self, key: Any) -> bool:
        return isinstance(key, str) and self.kept.find(call_key(key)) >= 0

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        if self.used_before(key):
            raise NeedsRebuild(f"whether call id {key!r} was used before the tip")
        return False


class _Verified(dict):
    """The request hashes that verified, each with the first response it verified for (the
    path checker's map, which words a mismatch "the request rebuilt for response ..."):
    those since the tip, and of those before it only their keys (``kept``). A key found
    is a question for the rebuilt state, which alone names that response."""

    #: None: a state written before the keys were kept, which cannot tell.
    kept: DigestTable | None

    def _before(self, key: Any) -> bool:
        if self.kept is None:
            raise NeedsRebuild("the request hashes verified before the tip")
        return isinstance(key, str) and self.kept.find(call_key(key)) >= 0

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        if self._before(key):
            raise NeedsRebuild("the response a request hash verified for before the tip")
        return False

    def setdefault(self, key: str, default: Any = None) -> Any:
        if not dict.__contains__(self, key) and self._before(key):
            return None  # (one before the tip verified for it first: that one stands)
        return dict.setdefault(self, key, default)


class _OnPath(dict):
    """The entries on the path that the state names (the dispatches of the calls kept)
    and those pushed since; ``off`` the dispatches it knows lie elsewhere."""

    def __init__(self, items: Iterable[tuple[str, Any]], off: set[str], restored: _Restored):
        super().__init__(items)
        self.off, self.restored = off, restored

    def __contains__(self, key: object) -> bool:
        if dict.__contains__(self, key):
            return True
        if key in self.off or not self.restored(key):
            return False
        raise NeedsRebuild(f"whether {key} is on the path")

    def get(self, key: Any, default: Any = None) -> Any:
        return dict.__getitem__(self, key) if key in self else default


class _Parents(dict):
    """Each entry's parent on its path: known for the entries added since the tip."""

    def __missing__(self, key: Any) -> Any:
        raise NeedsRebuild(f"the parent of {key}")


class _NoBuilder:
    """The context builder a restored checker does not have (its hash state cannot be
    kept): pushes and pops go by, any question is for the rebuilt state."""

    __slots__ = ()

    def push(self, entry: Any, t: Any = None) -> None:  # as ContextBuilder.push is called
        pass

    def pop(self) -> None:
        return None

    def pop_to(self, keep: int) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        raise NeedsRebuild(f"the context along the path ({name})")


#: The contributions above a restored tip: hollow (its entry is the path's first, whose
#: members were not kept).
_HOLLOW_PLACED = (0, "item", None, 0)


class _RestoredBuilder(ContextBuilder):
    """The context builder at a restored tip: the running request hash kept at the tip
    (and before the run of output items it ends: ``run``, that run's response, its
    contributions and whether a compaction or branch summary lies in it), the settings'
    members around the items, the contributions above the tip hollow. It answers the
    request hash of a response appended below the tip; any other question (a setting
    changed, the items themselves) is for the rebuilt state."""

    floor: int
    run: tuple[str | None, int, bool]
    #: The config and compaction entries the settings in force fold (None: not kept), read
    #: with ``loader`` and replayed at the first config below the tip (``replayed``).
    settings_ids: list[str] | None
    loader: Callable[[str], Entry]
    replayed = False
    #: The request's members before its items that the kept hash states began with.
    before: bytes

    def push(self, entry: Entry, t: Any = None) -> None:
        if t is None:
            t = entry.data.get("type")
        if t == "compaction":
            raise NeedsRebuild("a compaction below the restored tip (the items it keeps)")
        if t == "config" and not self.replayed:
            if self.settings_ids is None:
                raise NeedsRebuild("a config below the restored tip (the settings in force were not kept)")
            settings = replay_settings([self.loader(i) for i in self.settings_ids])
            if settings.request_split() != self.settings.request_split() or settings.model != self.settings.model:
                raise NeedsRebuild("the settings in force, replayed, are not those the state kept")
            self.settings, self.replayed = settings, True
        super().push(entry, t)
        if t == "config" and (not self.settings.omit.zero or self.settings.request_split()[0] != self.before):
            # The request hash restarts from the first item, which lies above the tip.
            raise NeedsRebuild("a config changing the request's members before its items, or its omit")

    def settings_ids_now(self) -> list[str] | None:
        """:attr:`settings_ids` with the configs pushed below the tip since."""
        if self.settings_ids is None:
            return None
        path = self.path
        # (from the tip down only: a scan of the path above it costs a close ~5 ms at 100,000)
        return [*self.settings_ids, *(path[i].id for i in self.settings_positions(self.floor))]

    def _outputs(self, end: int, rid: str | None) -> tuple[int, bool]:
        if rid is None:
            return 0, False
        k, slow, crossed, through = walk_outputs(self.path, end, self.floor, rid)
        if slow:
            raise NeedsRebuild("a response's output items across a compaction or branch summary")
        if not through:
            return k, False
        x, c, run_slow = self.run
        if x != rid:
            return k, False  # the walk ends at the last item above the tip
        if crossed or run_slow:
            raise NeedsRebuild("a response's output items across a compaction or branch summary")
        return k + c, False

    def context(self, *, apply_omit: bool = True, hold_items: bool = True) -> Any:
        raise NeedsRebuild("the context along the path")

    def selected_entries(self) -> list[Entry]:
        raise NeedsRebuild("the context along the path")


class _RestoredWalker(RecordWalker):
    """The record walker at a restored tip: whether a response's outputs hold a function
    call is walked below the tip and taken from ``tip_outputs`` above it (the response the
    run of outputs the tip ends names, and whether one of them is a call)."""

    floor: int
    tip_outputs: tuple[str | None, bool] | None

    def _response(self, e: Entry, depth: int) -> None:
        if e.id in self.has_calls:
            return
        rid = e.data.get("response_id")
        if not isinstance(rid, str):
            self.has_calls[e.id] = False
            return
        found, through = output_calls(self.path, depth, self.floor, rid)
        if through:
            if self.tip_outputs is None:
                raise NeedsRebuild("the output items above the restored tip")
            found = found or (self.tip_outputs[0] == rid and self.tip_outputs[1])
        self.has_calls[e.id] = found


class _RestoredPath(PathChecker):
    """A :class:`PathChecker` standing at the restored tip: it moves down from there and
    back up to it, never above it (``floor``: the depth of the tip)."""

    floor = 0

    def _pop(self) -> None:
        if len(self.path) <= self.floor:
            raise NeedsRebuild("a move above the restored tip")
        super()._pop()

    def _pop_to(self, keep: int) -> None:
        if keep < self.floor:
            raise NeedsRebuild("a move above the restored tip")
        super()._pop_to(keep)

    def finish(self) -> list[Any]:
        raise NeedsRebuild("the whole session's notes")

    def report(self, leaf: str | None, *, source: str = "", settle: Any = None, tidy: Any = None, path: Any = None) -> Any:
        raise NeedsRebuild("a report of the path")


class RestoredChecker(SessionChecker):
    """A :class:`SessionChecker` restored from :func:`capture`'s state. Wherever that
    state lacks an answer it becomes the checker ``rebuild`` makes (the whole session,
    as committed: every entry added outside a trial, or in a trial committed, must be
    in it), with the entries of the open trials added again and the trials reopened;
    from then on it is that checker."""

    _rebuild: Callable[[], SessionChecker]
    _added: list[tuple[Entry, bool | None]]
    _marks: list[int]

    def _become(self) -> None:
        full = self._rebuild()
        opened = list(zip(self._marks, self._trials, strict=True))
        k = 0
        for i, item in enumerate([*self._added, None]):
            while k < len(opened) and opened[k][0] == i:
                # The caller holds the trial objects: they take the rebuilt checker's marks.
                fresh, old = full.begin(), opened[k][1]
                old.tree, old.path, old.problems, old.notes, old.links = (
                    fresh.tree, fresh.path, fresh.problems, fresh.notes, fresh.links)
                full._trials[-1] = old
                k += 1
            if item is not None and item[0].id not in full:  # (one committed since is in the log)
                full.add(item[0], prefix=item[1])
        self.__dict__.clear()
        self.__dict__.update(full.__dict__)
        self.__class__ = SessionChecker  # type: ignore[assignment]

    def add(self, entry: Entry, *, prefix: bool | None = None) -> list[Any]:
        try:
            out = super().add(entry, prefix=prefix)
        except _REBUILD:
            self._become()
            return self.add(entry, prefix=prefix)
        self._added.append((entry, prefix))
        return out

    def finish(self) -> list[Any]:
        self._become()
        return self.finish()

    def open_run(self, at: str | None | object = ...) -> OpenRun | None:
        try:
            return super().open_run(at)
        except _REBUILD:
            self._become()
            return self.open_run(at)

    @property
    def requests(self) -> Any:
        self._become()
        return self.requests

    def begin(self) -> Trial:
        trial = super().begin()
        self._marks.append(len(self._added))
        return trial

    def commit(self, trial: Trial) -> None:
        super().commit(trial)
        self._marks.pop()
        if not self._marks:
            # Kept: what ``rebuild`` builds holds it from now on (a commit of the log).
            self._added.clear()

    def rollback(self, trial: Trial) -> None:
        try:
            super().rollback(trial)
        except _REBUILD:
            self._become()
            self.rollback(trial)
            return
        del self._added[self._marks.pop():]


# ---------------------------------------------------------------------------
# capture


def header_key(header: Header) -> str:
    """What ties a state to the header it was built under (``records``, ``redacted``
    and the base are the header's): the SHA-256 of its canonical line."""
    return hashlib.sha256(header.canonical_line()).hexdigest()


def stand_at(checker: SessionChecker, entry_id: str) -> bool:
    """Move ``checker``'s path to ``entry_id`` (an entry it holds), where the state is
    then taken; False when a restored checker cannot go there without rebuilding (it is
    then left unusable: only for a checker about to be let go)."""
    try:
        checker.path._goto(entry_id)
    except _REBUILD:
        return False
    return True


def _call_form(call: Any) -> list[Any]:
    out = call.output
    return [call.entry.id, call.call_id, call.depth, call.own, out.id if out is not None else None,
            [list(ev) for ev in call.events]]


def capture(
    checker: SessionChecker, header: Header, prefix: int, own: Sequence[str], own_seq: Mapping[str, int]
) -> dict[str, Any] | None:
    """The state of ``checker`` (fed the ``prefix`` entries of the prefix and exactly the
    own entries ``own``, in log order, with no trial open) that :func:`restore` needs, as
    a JSON object; None when there is nothing worth keeping (no own entry) or the
    checker does not stand for that log."""
    if checker._trials or not own:
        return None
    prefix_leaf_labels = [x for x in checker.tree.leaf_labels if x not in own_seq]
    return _capture(checker.path, checker._links, prefix_leaf_labels, header, prefix, own, own_seq[own[-1]])


def capture_pass(
    report: VerifyReport, header: Header, prefix: Sequence[str], own: Sequence[str], leaf_labels: Collection[str]
) -> dict[str, Any] | None:
    """:func:`capture` of the checker an import's verify pass leaves (``report``
    of the file whose entries are the session's ``prefix`` and ``own``, in log order, the
    leaf labels among them ``leaf_labels``), so that an imported session's first append
    need not build the rules from every entry. None unless the pass's path stands at the
    last own entry under the very header the session gets (a file whose header a store
    completes, or whose order the log does not keep, is left to be built: never guessed).
    The appends of a session created whole are numbered from 1
    (:class:`~agentsession_cas.backends.base.CreatedRecords`)."""
    if not own or report.header.data != header.data:
        return None
    from ..format.codes import RULES  # (what refuses: a kept header member leaves the rules' state sound)

    if any(RULES[p.code].store != "keep" for p in report.problems):
        return None
    held = set(prefix)
    prefix_leaf_labels = [x for x in leaf_labels if x in held]
    return _capture(report._checker, report.links, prefix_leaf_labels, header, len(prefix), own, len(own))


def _capture(
    path: PathChecker, links: Sequence[Entry], prefix_leaf_labels: Iterable[str], header: Header, prefix: int,
    own: Sequence[str], last_seq: int,
) -> dict[str, Any] | None:
    if not path.path or len(path.order) != prefix + len(own) or path.order[-1] != own[-1]:
        return None
    w = path.walker
    on_path = w.on_path
    live: set[str] = set()
    for call in dict.values(w.calls):
        if call.output is None:
            live.add(call.call_id)
    run = w.run
    if run is not None:
        live.update(c.call_id for c in run.calls)
    if dict.get(w.by_call_id, "") is not None:
        live.add("")
    stacks = {cid: [_call_form(c) for c in w.stack(cid)] for cid in sorted(live)}
    nodes = {}
    for cid in live:
        for c in w.stack(cid):
            got = w.dispatch_nodes.get(c.entry.id)
            if got:
                nodes[c.entry.id] = [[at, d, dict.__contains__(on_path, d)] for at, d in got]
    at = w.last_resp[-1] if w.last_resp else None
    last_form = None
    if at is not None:
        resp = w.path[at]
        last_form = [resp.id, at, resp.get("error") is not None, resp.get("incomplete") is not None,
                     bool(w.has_calls.get(resp.id, False))]
    run_form = None
    if run is not None:
        start = run.start
        run_form = {"start": start.id, "source": start.get("source"), "run_id": start.get("run_id"), "depth": run.depth,
                    "calls": [c.entry.id for c in run.calls], "nonempty": run.nonempty,
                    "out_or_decision": run.out_or_decision, "takeup": list(run.takeup) if run.takeup else None}
    seq = path.seq
    # (a pass over a file has finished: what that reported is the file's end, not the session's)
    finished = path.seen_before_finish
    seen = path._seen if finished is None else path._seen_log[:finished]
    # The call ids as their keys in one string: a session's call ids are most of the state,
    # and as strings they cost an open and a close more than the rest of it (issue 11).
    first = w.first_call
    keys = first.kept.raw if isinstance(first, _FirstCall) else b""
    keys += b"".join([call_key(cid) for cid in dict.keys(first)])
    # (the request hashes that verified, as keys; unknown when a restored state did not know them)
    verified = path._rebuilt
    verified_form: str | None = None
    if not isinstance(verified, _Verified) or verified.kept is not None:
        verified_keys = verified.kept.raw if isinstance(verified, _Verified) and verified.kept is not None else b""
        verified_keys += b"".join([call_key(h) for h in dict.keys(verified)])
        verified_form = base64.b64encode(verified_keys).decode("ascii")
    return {
        "version": VERSION,
        "header": header_key(header),
        "entries": len(own),
        "last": own[-1],
        "last_seq": last_seq,
        "order": len(path.order),
        "tip": path.path[-1].id,
        "tip_at": seq[path.path[-1].id],
        "depth": len(path.path),
        "cut": dict(path._cut),
        "budget": path._budget,
        "seen": sorted([eid, code] for eid, code in seen),
        "prefix_leaf_labels": sorted(prefix_leaf_labels),
        "links": [[e.id, e.get("rel") if isinstance(e.get("rel"), str) else None,
                   e.get("call_id") if isinstance(e.get("call_id"), str) else None] for e in links],
        "calls_checked": w.calls_checked,
        "call_ids": base64.b64encode(keys).decode("ascii"),
        "stacks": stacks,
        "dispatches": nodes,
        "open_calls": w.open_calls,
        "run": run_form,
        "last_response": last_form,
        "context": _context_form(path),
        "verified": verified_form,
        "outputs": _outputs_form(w),
    }


def _context_form(path: PathChecker) -> dict[str, Any] | None:
    """What the context builder holds at the tip that the request hash of a response
    appended below it needs: the SHA-256 state after every contribution, and after those
    before the run of output items the tip ends (a response of that run excludes them),
    the settings' members around the items, the tip's run and the path's root (a cut
    root words its responses' checks). None where that is not all a request needs (an
    omit in force, a compaction whose kept range is broken) or the state cannot be read."""
    b = path.builder
    if not isinstance(b, ContextBuilder) or not path.path or b.error is not None or not b.settings.omit.zero:
        return None
    if not resumable.available():
        return None
    try:
        run = _tip_run(b)
        n = len(b._raw.items)
        before, after = b.settings.request_split()
        marks = []
        for upto in sorted({n, n - run[1]}) if not run[2] else [n]:
            _, _, _, count, h = b._raw.kept_mark(upto, b.settings)
            state = resumable.state_of(h)
            if state is None:
                return None
            marks.append([upto, count, state])
        if isinstance(b, _RestoredBuilder):
            settings_ids = b.settings_ids_now()
        else:
            settings_ids = [b.path[i].id for i in b.settings_positions()]
        if settings_ids is not None and len(settings_ids) > SETTINGS_KEPT:
            settings_ids = None
        return {"root": path.path[0].id, "n": n, "model": b.settings.model, "before": before.decode("utf-8"),
                "after": after.decode("utf-8"), "marks": marks, "run": list(run), "settings": settings_ids}
    except (NeedsRebuild, ContextError, UnicodeDecodeError):
        return None


def _last_item_response(path: Sequence[Any], stop: int) -> tuple[str | None, bool]:
    """The ``response`` the last item of ``path[stop:]`` names (None: not a string), and
    whether there was none there (the walk reached ``stop``)."""
    for i in range(len(path) - 1, stop - 1, -1):
        d = path[i].data
        if d.get("type") == "item":
            x = d.get("response")
            return (x if isinstance(x, str) else None), False
    return None, True


def _tip_run(b: ContextBuilder) -> tuple[str | None, int, bool]:
    """The run of output items the path ends: the response the last item on the path names
    (None: it names none, or there is no item), how many contributions that response's
    outputs make there, and whether a compaction or branch summary lies among them or after
    them (a request walking back over them is rebuilt)."""
    if isinstance(b, _RestoredBuilder):
        x, through = _last_item_response(b.path, b.floor)
        if through:
            x = b.run[0]
    else:
        x, _ = _last_item_response(b.path, 0)
    if not x:
        return None, 0, False
    try:
        k, slow = b._outputs(len(b.path), x)
    except NeedsRebuild:  # (a restored builder's: the walk crosses a compaction or branch summary)
        return x, 0, True
    return x, k, slow


def _outputs_form(w: RecordWalker) -> list[Any] | None:
    """What the walker's check of the next response needs of the run of output items the
    path ends: the response the last item names, and whether one of its outputs there is a
    function call; None when a restored walker does not know."""
    kept: tuple[str | None, bool] | None = (None, False)
    stop = 0
    if isinstance(w, _RestoredWalker):
        kept, stop = w.tip_outputs, w.floor
    x, through = _last_item_response(w.path, stop)
    if through:
        return None if kept is None else list(kept)
    if x is None:
        return [None, False]
    found, through = output_calls(w.path, len(w.path), stop, x)
    if through:
        if kept is None:
            return None
        found = found or (kept[0] == x and kept[1])
    return [x, found]


def fork_state(data: Mapping[str, Any], fork: Header, own_leaf_labels: Iterable[str]) -> dict[str, Any] | None:
    """The state a fork at the origin's head starts from, made of the origin's kept state
    ``data`` (checked by :func:`usable` against the origin's whole log: it stands at the
    head) rather than of its prefix's entries: every entry the origin's state counts
    becomes the fork's prefix, none of them own. Only where that is the state a checker
    fed the fork's prefix would hold: the origin's path is every entry it counts (a
    linear session: then the fork's prefix, root to base, is the origin's entries in the
    order fed). The calls the origin made are the fork's prefix's (not its own, which a
    ``records`` promise reads), its own links none of the fork's, its ``own_leaf_labels``
    prefix leaf labels. A fork that promises less than its origin (``Store.fork`` does
    not copy ``records``) keeps the reports its origin's promise made on these entries
    among those made once: they are on the prefix, never reported again. None otherwise:
    the fork's rules are then built from its prefix."""
    if data.get("depth") != data.get("order") or data.get("tip_at") != data.get("order", 0) - 1:
        return None  # a branch or a rollback in the origin: its state holds entries off the fork's path
    if fork.base != data.get("tip"):
        return None
    state = dict(data)
    state.update(
        header=header_key(fork),
        entries=0,
        last=None,
        last_seq=0,
        links=[],
        prefix_leaf_labels=sorted({*data["prefix_leaf_labels"], *own_leaf_labels}),
        stacks={cid: [[*form[:3], False, *form[4:]] for form in forms] for cid, forms in data["stacks"].items()},
    )
    return state


# ---------------------------------------------------------------------------
# restore


def usable(data: Any, header: Header, own: Sequence[str], own_seq: Mapping[str, int]) -> bool:
    """Whether a kept state stands for a prefix of this log under this header: its form's
    version, the header's key, and its last own entry where the log has it, with the
    same sequence number (a repaired or cut log, or another session's file, is not)."""
    if not isinstance(data, dict) or data.get("version") not in READ_VERSIONS or data.get("header") != header_key(header):
        return False
    n, last = data.get("entries"), data.get("last")
    if n == 0 and type(n) is int:  # a fork's first state (:func:`fork_state`): its prefix alone
        return last is None and data.get("last_seq") == 0
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= len(own) or own[n - 1] != last:
        return False
    return own_seq.get(last) == data.get("last_seq")


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_list(v: Any, n: int | None = None) -> bool:
    return type(v) is list and (n is None or len(v) == n)


def _str_or_none(v: Any) -> bool:
    return v is None or type(v) is str


def check_form(data: Mapping[str, Any], count: int) -> None:
    """Raise ValueError unless every member :func:`restore` reads is of the form
    :func:`capture` writes (a state of ``count`` entries in order): a state whose checksum
    held is still not trusted to be one, and what is not of the form is rebuilt."""

    def member(name: str) -> Any:
        return data.get(name)

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(f"the state's {what} is not of the form")

    for name in ("entries", "last_seq", "order", "tip_at", "depth", "budget", "open_calls", "calls_checked"):
        need(_is_int(member(name)), name)
    need((type(member("last")) is str or (member("last") is None and member("entries") == 0)) and type(member("tip")) is str,
         "last or tip")
    cut = member("cut")
    need(type(cut) is dict and all(type(v) is str for v in cut.values()), "cut")
    seen = member("seen")
    need(_is_list(seen) and all(_is_list(x, 2) and type(x[0]) is str and type(x[1]) is str for x in seen), "seen")
    labels = member("prefix_leaf_labels")
    need(_is_list(labels) and all(type(x) is str for x in labels), "prefix_leaf_labels")
    links = member("links")
    need(_is_list(links) and all(_is_list(x, 3) and type(x[0]) is str and _str_or_none(x[1]) and _str_or_none(x[2])
                                 for x in links), "links")
    if member("version") == 1:
        first = member("first_call")
        need(_is_list(first, 2) and _is_list(first[0]) and all(type(c) is str for c in first[0]), "first_call")
    else:
        need(type(member("call_ids")) is str, "call_ids")
    stacks = member("stacks")
    need(type(stacks) is dict and all(_is_list(forms) for forms in stacks.values()), "stacks")
    calls: set[str] = set()
    for forms in stacks.values():
        for form in forms:
            need(_is_list(form, 6) and type(form[0]) is str and type(form[1]) is str and _is_int(form[2])
                 and type(form[3]) is bool and _str_or_none(form[4]) and _is_list(form[5]), "stacks' calls")
            need(all(_is_list(ev, 4) and type(ev[0]) is str and type(ev[1]) is str and _str_or_none(ev[2])
                     and type(ev[3]) is bool for ev in form[5]), "stacks' events")
            calls.add(form[0])
    dispatches = member("dispatches")
    need(type(dispatches) is dict and all(
        _is_list(nodes) and all(_is_list(x, 3) and _is_int(x[0]) and type(x[1]) is str and type(x[2]) is bool for x in nodes)
        for nodes in dispatches.values()), "dispatches")
    last = member("last_response")
    need(last is None or (_is_list(last, 5) and type(last[0]) is str and _is_int(last[1])
                          and all(type(x) is bool for x in last[2:])), "last_response")
    run = member("run")
    if run is not None:
        need(type(run) is dict and type(run.get("start")) is str and _is_int(run.get("depth"))
             and _is_list(run.get("calls")) and all(c in calls for c in run["calls"])
             and type(run.get("nonempty")) is bool and type(run.get("out_or_decision")) is bool
             and "source" in run and "run_id" in run, "run")
        takeup = run.get("takeup")
        need(takeup is None or (_is_list(takeup, 2) and takeup[0] in ("input", "resume") and type(takeup[1]) is str),
             "run's takeup")
    need(member("verified") is None or type(member("verified")) is str, "verified")
    outputs = member("outputs")
    need(outputs is None or (_is_list(outputs, 2) and _str_or_none(outputs[0]) and type(outputs[1]) is bool), "outputs")
    context = member("context")
    if context is not None:
        need(type(context) is dict and type(context.get("root")) is str and _is_int(context.get("n"))
             and context["n"] >= 0 and _str_or_none(context.get("model")) and type(context.get("before")) is str
             and type(context.get("after")) is str, "context")
        run, marks = context.get("run"), context.get("marks")
        need(_is_list(run, 3) and _str_or_none(run[0]) and _is_int(run[1]) and 0 <= run[1] <= context["n"]
             and type(run[2]) is bool, "context's run")
        need(_is_list(marks) and 1 <= len(marks) <= 2 and all(
            _is_list(m, 3) and _is_int(m[0]) and 0 <= m[0] <= context["n"] and _is_int(m[1]) and 0 <= m[1] <= m[0]
            for m in marks), "context's marks")
        need({m[0] for m in marks} == ({context["n"]} if run[2] else {context["n"], context["n"] - run[1]}),
             "context's marks")
        ids = context.get("settings")
        need(ids is None or (_is_list(ids) and len(ids) <= SETTINGS_KEPT and all(type(i) is str for i in ids)),
             "context's settings")


def _restore_builder(context: Mapping[str, Any], depth: int, tip: _Partial, loader: Callable[[str], Entry]) -> _RestoredBuilder:
    """The context builder :func:`_context_form`'s ``context`` stands for, at a tip of
    ``depth`` (ValueError on a hash state not of the form); ``loader`` reads the entries
    the settings in force fold."""
    b = _RestoredBuilder()
    b.settings_ids = context.get("settings")
    b.loader = loader
    b.floor = depth
    b.path = [HOLLOW] * (depth - 1) + [tip]
    if depth > 1:
        b.path[0] = _Partial(context["root"])  # type: ignore[call-overload]
    b._models = [None] * depth
    b._undo = [(None, 0)] * depth
    settings = Settings()
    settings.model = context["model"]
    before, after = context["before"].encode("utf-8"), context["after"].encode("utf-8")
    settings._split = (before, after)
    b.settings, b.before = settings, before
    n = context["n"]
    raw = _Raw(b.path, [_HOLLOW_PLACED] * n)
    for upto, count, state in context["marks"]:
        raw.marks.append(((before,), upto, _HOLLOW_PLACED if upto else None, count, resumable.load_state(state)))
    b._raw = raw
    x, c, slow = context["run"]
    b.run = (x, c, slow)
    return b


def restore(
    data: Mapping[str, Any],
    header: Header,
    prefix: Sequence[str],
    own: Sequence[str],
    own_seq: Mapping[str, int],
    leaf_labels: Iterable[str],
    rebuild: Callable[[], SessionChecker],
    loader: Callable[[str], Entry],
    *,
    on_prefix: Container[str] | None = None,
) -> RestoredChecker:
    """The checker :func:`capture`'s ``data`` stands for (checked by :func:`usable`), fed
    the prefix and the first ``data["entries"]`` of ``own`` (the log's own entries in
    order, ``own_seq`` their sequence numbers); the caller feeds the rest at once.
    ``on_prefix`` answers whether an id is on the prefix where the caller can without
    listing it (a fork's prefix not read: ``prefix`` then reads it only when indexed).
    Raises ValueError on a state that is not of the form (:func:`check_form`)."""
    n = data["entries"]
    ids = _Order(prefix, own, n)
    count = len(ids)
    check_form(data, count)
    depth, tip, tip_at = data["depth"], data["tip"], data["tip_at"]
    if data["order"] != count or not (isinstance(tip_at, int) and 0 <= tip_at < count and ids[tip_at] == tip):
        raise ValueError("the state counts other entries, or its tip is not one of them")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError("the state's path has no tip")
    checker = SessionChecker(header, loader=loader)
    checker.__class__ = RestoredChecker
    assert isinstance(checker, RestoredChecker)
    checker._rebuild, checker._added, checker._marks = rebuild, [], []
    checker._links = [_Partial(i, "link", {"rel": rel, "call_id": cid}) for i, rel, cid in data["links"]]  # type: ignore[misc]

    path = checker.path
    path.__class__ = _RestoredPath
    assert isinstance(path, _RestoredPath)
    seq = _Seq({tip: tip_at})
    restored = seq.restored = _Restored(seq, frozenset(prefix) if on_prefix is None else on_prefix, own_seq,
                                        own_seq[own[n - 1]] if n else 0)
    path.seq = path.walker.seq = seq
    path._order = ids  # type: ignore[assignment]

    tree: TreeState = checker.tree
    held = _Held()
    held.restored = _Restored(held, restored.prefix, own_seq, restored.last_seq)
    tree.held = held
    tree.in_prefix = False
    tree._prefix_prev = header.base
    tree.prefix = list(prefix[:-1]) if on_prefix is None else _Above(len(prefix) - 1)
    if header.base is not None:
        since = tree.own = _OwnSince()
        since.restored = restored
    tree.leaf_labels = set(leaf_labels) | set(data["prefix_leaf_labels"])

    path.floor = depth
    path._parent = _Parents()
    path._cut = dict(data["cut"])
    path._budget = data["budget"]
    path._seen = {(eid, code) for eid, code in data["seen"]}
    path._seen_log = sorted(path._seen)
    verified = _Verified()
    verified.kept = None
    if data.get("verified") is not None:
        try:
            verified.kept = DigestTable(binascii.a2b_base64(data["verified"], strict_mode=True), CALL_KEY)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"the state's verified keys are not of the form: {exc}") from None
    path._rebuilt = verified
    tip_entry = _Partial(tip)
    path.path = [HOLLOW] * (depth - 1) + [tip_entry]
    path._depth = {tip: depth - 1}
    context = data.get("context")
    if context is None or not resumable.available():
        path.builder = _NoBuilder()  # type: ignore[assignment]
    else:
        path.builder = _restore_builder(context, depth, tip_entry, loader)
        if depth > 1:
            path.path[0] = _Partial(context["root"])  # type: ignore[call-overload]  # (a response's check asks whether its root was cut)

    w = path.walker
    w.__class__ = _RestoredWalker
    assert isinstance(w, _RestoredWalker)
    w.floor = depth
    outputs = data.get("outputs")
    w.tip_outputs = (outputs[0], outputs[1]) if outputs is not None else None
    w.calls_checked = data["calls_checked"]
    first = _FirstCall()
    try:
        keys = (b"".join([call_key(c) for c in data["first_call"][0]]) if data["version"] == 1
                else binascii.a2b_base64(data["call_ids"], strict_mode=True))
        first.kept = DigestTable(keys, CALL_KEY)
    except binascii.Error as exc:
        raise ValueError(f"the state's call_ids are not base64: {exc}") from None
    w.first_call = first
    w.path = [HOLLOW] * (depth - 1) + [tip_entry]
    calls: dict[str, _Call] = {}
    tops: dict[str, _Call] = {}
    for cid, forms in data["stacks"].items():
        below = None
        for entry_id, call_id, cdepth, own_call, output, events in forms:
            call = _Call(_Partial(entry_id, "item"), call_id, cdepth, own_call, below)  # type: ignore[arg-type]
            call.output = _Partial(output, "item") if output is not None else None  # type: ignore[assignment]
            call.events = tuple((kind, eid, verdict, withdraws) for kind, eid, verdict, withdraws in events)
            calls[entry_id] = below = call
        if below is not None:
            tops[cid] = below
    w.calls = _Calls(calls.items(), restored)
    w.by_call_id = _ByCallId(tops.items(), first)
    on: dict[str, Any] = {}
    off: set[str] = set()
    dispatches: dict[str, list[tuple[int, str]]] = {}
    for target, nodes in data["dispatches"].items():
        dispatches[target] = [(at, d) for at, d, _ in nodes]
        for _, d, on_path in nodes:
            if on_path:
                on[d] = _Partial(d, "dispatch")
            else:
                off.add(d)
    w.dispatch_nodes = dispatches
    w.on_path = _OnPath(on.items(), off, restored)
    w.open_calls = data["open_calls"]
    last = data["last_response"]
    tip_last: Any = None
    if last is not None:
        rid, rdepth, error, incomplete, has_calls = last
        if not (0 <= rdepth < depth and (rdepth < depth - 1 or rid == tip)):
            raise ValueError("the state's last response is not on its path")
        # The walker finds the last response on its path by depth: there, in place of a
        # hollow entry (or as the tip, when the tip is the response).
        resp: Any = _Partial(rid, "response", {"error": True if error else None, "incomplete": True if incomplete else None})
        w.path[rdepth] = resp
        if rdepth == depth - 1:
            path.path[-1] = resp
        tip_last = rdepth
        w.has_calls[rid] = has_calls
    w.last_resp = [HOLLOW] * (depth - 1) + [tip_last]
    run_form = data["run"]
    if run_form is not None:
        run = _Run.__new__(_Run)
        run.start = _Partial(run_form["start"], "run", {"source": run_form["source"], "run_id": run_form["run_id"]})  # type: ignore[assignment]
        rid = run_form["run_id"]
        run.run_id = rid if isinstance(rid, str) else None
        run.depth = run_form["depth"]
        run.calls = [calls[c] for c in run_form["calls"]]
        run.call_keys = set(run_form["calls"])
        run.nonempty = run_form["nonempty"]
        run.out_or_decision = run_form["out_or_decision"]
        takeup = run_form["takeup"]
        run.takeup = (takeup[0], takeup[1]) if takeup is not None else None
        w.run = run
    return checker
