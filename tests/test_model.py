"""A model-based test of the store: random sequences of operations, every backend against one model.

The contract suite (tests/test_contract.py) holds each RFC 0002 rule to one written-down
case; this drives *sequences* of operations nobody wrote down. A hypothesis
``RuleBasedStateMachine`` applies each step through the public Python API
(``open_store``, ``Store``, ``Session``, ``Refs``, ``fsck``) to a store of each backend
side by side (a file store and a memory store; a file store and one served over HTTP;
PostgreSQL too in the ``slow`` variant),
and after every step checks that they agree with each other and with a plain model kept
here:

- each session's projection bytes (export) identical on every backend, its lines the
  model's prefix and own entries in log order (and a synthetic marker, when the head is
  not where the resume rule lands);
- the log as ``Store.history`` gives it, replayed: log order, head, mark, leaf labels and
  sequence numbers, the same on every backend and the model's; header and base the model's;
  what an open writing handle believes, the model's;
- every refused operation refused on every backend with the same error class and
  ``.code`` (and, where the model knows the rule, the one it predicts), the stores left
  as they were (the next check compares them with the model, which did not move);
- ``fsck`` clean (no error, no warning) on every backend after every maintenance step
  (reopen, pack, sweep);
- an export imported again (under another id) exports byte-identically;
- after a sweep (grace 0, no writer holding a session) every live session exports the
  bytes it exported before.

The operations: create (record or mirror), append items (durable and lazy, at the
head or branching, again as a no-op, an entry of another session), labels (``leaf``
labels that move the head or do not, a plain label, a synthetic one, refused), a batch
prepared then committed or discarded, head compare-and-swap, fork at an entry, close and
reopen a handle, commit, reopen the whole store, export and import as a new session,
delete, refs (create, move, delete, by compare-and-swap; set again to the session they
name, after it was deleted, or deleted and created again: each ref's state, ``ok``,
``dangling`` or ``replaced``, held to the model's), pack, sweep and fsck.

Deterministic: the conftest's ``ci`` profile (derandomize, no database); every id,
``ts`` and ``created_at`` comes from a counter of the run, so the same examples run
every time. No timing is checked. ``HYPOTHESIS_PROFILE=explore`` draws fresh examples,
ten times as many, to look for new failures.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, event, settings
from hypothesis import strategies as hs
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agentsession_cas import LEAF_LABEL, Header
from agentsession_cas.backends import memory as memory_backend
from agentsession_cas.errors import (
    AgentSessionError,
    AppendRefusedError,
    BadBaseError,
    DanglingRefError,
    HeadMovedError,
    MirrorError,
    NoSuchSessionError,
    RefMovedError,
    SessionExistsError,
    WritersActiveError,
)
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Session, Store
from agentsession_cas.store.refs import Refs
from agentsession_cas.store.state import replay
from contract_helpers import BACKENDS, BackendKind, StoreFactory, remove_tree, scratch_root

KINDS = {k.name: k for k in BACKENDS}
UNHELD = "sha256:" + "0" * 64  # an entry id no store holds
T0 = datetime(2026, 10, 5, 12, 0, 0, tzinfo=UTC)

#: A request_hash no path rebuilds (a response kept with a finding: append_call).
WRONG_REQUEST_HASH = "sha256:" + "0" * 64
#: Session ids: created and forked sessions take these, imported ones ``IMPORT_IDS``; a
#: pool this small has ids taken again after a delete (a ref then finds it "replaced").
SESSION_IDS = ("s0", "s1", "s2", "s3")
IMPORT_IDS = ("i0", "i1")
#: Ref names, two of which conflict ("chat" beside "chat/a"; "Chat" beside "chat").
REF_NAMES = ("main", "chat/a", "chat", "Chat")
TEXTS = ("hi", "again", "ok", "why?", "done")

#: Which entry of a session a step names (an index into the choices, wrapped).
pick = hs.integers(min_value=0, max_value=31)


# -- the model --------------------------------------------------------------------------


@dataclass
class MEntry:
    parent: str | None
    leaf: bool  # a ``leaf`` label (never holds the head)
    data: dict[str, Any]  # what was appended, with its id: appended again, a no-op


@dataclass
class MSession:
    header: dict[str, Any]
    base: str | None
    prefix: list[str]  # root..base
    own: list[str] = field(default_factory=list)  # log order
    head: str | None = None
    mark: str = "record"
    open: bool = True  # a writing handle is held (in every store alike)


@dataclass
class Model:
    sessions: dict[str, MSession] = field(default_factory=dict)
    entries: dict[str, MEntry] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    #: The header of the session each ref was set to (its incarnation: RFC 0002 Refs).
    ref_headers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def ref_state(self, name: str) -> str:
        """``ok``, ``dangling`` (its session gone) or ``replaced`` (another session under
        its id: a header the ref was not set to), as :meth:`Refs.state` says."""
        s = self.sessions.get(self.refs[name])
        if s is None:
            return "dangling"
        return "ok" if s.header == self.ref_headers[name] else "replaced"

    def set_ref(self, name: str, session: str) -> None:
        self.refs[name] = session
        self.ref_headers[name] = self.sessions[session].header

    def leaf_labels(self, sid: str) -> set[str]:
        return {e for e in self.sessions[sid].own if self.entries[e].leaf}

    def may_hold_head(self, sid: str, target: str | None) -> bool:
        """RFC 0002's head rule, as the model states it: the base, or an own entry that
        is not a leaf label; no head only in a session without a base."""
        s = self.sessions[sid]
        if target is None:
            return s.base is None
        return target == s.base or (target in s.own and not self.entries[target].leaf)

    def path_to(self, eid: str) -> list[str]:
        out = []
        cur: str | None = eid
        while cur is not None:
            out.append(cur)
            cur = self.entries[cur].parent
        return out[::-1]


# -- running one operation on every store ------------------------------------------------


@dataclass(frozen=True)
class Refused:
    """Every store refused the operation alike: the error class and code."""

    cls: type
    code: str
    message: str


class Machine(RuleBasedStateMachine):
    """The stores of :attr:`kinds` side by side, and the model. Subclasses name the kinds."""

    kinds: tuple[str, ...] = ("file", "memory")
    #: Kinds whose store is a server's, reached over RFC 0003: local maintenance (sweep)
    #: is not carried, so the machine checks it is refused there and runs it elsewhere.
    served: frozenset[str] = frozenset({"http"})

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(dir=_SCRATCH.root))
        self.factories = [StoreFactory(KINDS[k], self.root) for k in self.kinds]
        self.stores: list[Store] = [f(sync="never") for f in self.factories]
        self.model = Model()
        self.tick = 0
        self.maintained = False  # a maintenance step ran: fsck must be clean after it

    def teardown(self) -> None:
        errors: list[BaseException] = []
        for f in self.factories:
            errors += f.close_all()
            if f.kind.name == "memory":
                memory_backend._REGISTRY.pop(f.url()[len("memory:"):], None)
            elif f.kind.name == "postgresql":
                _drop_schema(f.url())
            if f.kind.release is not None:
                f.kind.release(self.root, f.tag)  # a served store's server side
        remove_tree(self.root)
        event(f"entries appended: {len(self.model.entries) // 10 * 10}+")
        assert not errors, errors

    # -- helpers ----------------------------------------------------------------------

    def ts(self) -> str:
        self.tick += 1
        return (T0 + timedelta(seconds=self.tick)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def each(self, op: Callable[[Store], Any], stores: Sequence[Store] | None = None) -> list[Any] | Refused:
        """``op`` on every store (or on ``stores``): the results, or :class:`Refused` when every
        store refused it with the same error class and code (anything else fails the test)."""
        results: list[Any] = []
        errors: list[BaseException | None] = []
        stores = self.stores if stores is None else stores
        kinds = [k for k, st in zip(self.kinds, self.stores, strict=True) if st in stores]
        for store in stores:
            before = self.fingerprint(store)
            try:
                results.append(op(store))
                errors.append(None)
            except AgentSessionError as exc:
                results.append(None)
                errors.append(exc)
                assert self.fingerprint(store) == before, f"a refused operation changed the store: {exc}"
        outcomes = [(type(e), e.code) if isinstance(e, AgentSessionError) else None for e in errors]
        assert all(k == outcomes[0] for k in outcomes), (
            f"the backends {kinds} disagree: " + "; ".join(
                f"{name}: {'accepted' if e is None else f'{type(e).__name__}({e.code}): {e}'}"  # type: ignore[attr-defined]
                for name, e in zip(kinds, errors, strict=True)))
        first = errors[0]
        caller = sys._getframe(1).f_code.co_name
        caller = sys._getframe(2).f_code.co_name if caller == "same" else caller
        if isinstance(first, AgentSessionError):
            event(f"{caller}: refused, {first.code}")
            return Refused(type(first), first.code, str(first))
        event(f"{caller}: done")
        return results

    def fingerprint(self, store: Store) -> Any:
        """What a store holds, read afresh (each session's log records, less the file
        backend's own ``checkpoint`` records, which say nothing of the session; its refs)
        and what each writing handle believes: what a refusal must leave as it was."""
        logs = {sid: [r for r in store.history(sid).records if r.get("op") != "checkpoint"] for sid in store.list()}
        handles = {sid: (h.head, list(h.log_order), h.mark, h.state.max_seq)
                   for sid in store.list() if (h := store.opened(sid)) is not None}
        return logs, handles, [r.as_dict() for r in Refs(store).list()]

    def same(self, op: Callable[[Store], Any], view: Callable[[Any], Any] = lambda r: r) -> Any:
        """``op`` on every store, its results (seen through ``view``) the same on every one:
        the first store's result, or :class:`Refused`."""
        got = self.each(op)
        if isinstance(got, Refused):
            return got
        views = [view(r) for r in got]
        assert all(v == views[0] for v in views), f"the backends {self.kinds} disagree: {views}"
        return got[0]

    def expect_refused(self, got: Any, cls: type, code: str | None = None) -> None:
        assert isinstance(got, Refused), f"expected {cls.__name__} on every backend, every backend accepted: {got}"
        assert issubclass(got.cls, cls), (got, cls)
        if code is not None:
            assert got.code == code, got

    def live(self) -> list[str]:
        return sorted(self.model.sessions)

    def record_sessions(self) -> list[str]:
        return [s for s in self.live() if self.model.sessions[s].mark == "record"]

    def choose(self, items: Sequence[Any], i: int) -> Any:
        return items[i % len(items)]

    def handle(self, store: Store, sid: str) -> Session:
        """The writing handle of ``sid``, which :meth:`opened` opened."""
        held = store.opened(sid)
        assert held is not None, (store, sid)
        return held

    def opened(self, sid: str) -> None:
        """Open a writing handle on ``sid`` in every store (as a harness holds one), unless
        one is open: a step of its own, so an operation refused after it changes nothing."""
        if not self.model.sessions[sid].open:
            got = self.each(lambda st: st.session(sid))
            assert not isinstance(got, Refused), got
            self.model.sessions[sid].open = True

    # -- sessions -------------------------------------------------------------------------

    @initialize(n=hs.integers(min_value=0, max_value=4), record=hs.booleans())
    def start(self, n: int, record: bool) -> None:
        """A session to work on from the first step: s0, record (mostly) or mirror, with a
        few messages when it is a record."""
        self.create(0, record or n > 0, False)
        for k in range(n):
            self.append_message(0, 0, "head", TEXTS[k], "user", None)

    @initialize(at=pick, n=hs.integers(min_value=0, max_value=2))
    def start_fork(self, at: int, n: int) -> None:
        """A fork of s0 (when it has entries) from the first step, s1, with a message or
        two of its own: so prefixes, bases and what a fork shares are there to work on."""
        if "s0" not in self.model.sessions or not self.model.sessions["s0"].own:
            return
        self.fork(0, at, "own", 1)
        if "s1" in self.model.sessions:
            for k in range(n):
                self.append_message(1, 0, "head", TEXTS[k], "assistant", None)

    @initialize(set_ref=hs.booleans())
    def start_ref(self, set_ref: bool) -> None:
        """A ref to s0 from the first step (refs are otherwise set by a step drawn among
        some thirty), so what a ref meets later (its session deleted, created again) is
        drawn."""
        if set_ref and "s0" in self.model.sessions:
            self.update_ref("main", "s0", None)

    @rule(i=pick, record=hs.booleans(), records_header=hs.booleans())
    def create(self, i: int, record: bool, records_header: bool) -> None:
        self.create_id(self.choose(SESSION_IDS, i), record, records_header)

    def create_id(self, sid: str, record: bool, records_header: bool) -> None:
        header = Header.new(sid, created_at=self.ts(), **({"records": ["run"]} if records_header else {}))
        got = self.each(lambda st: st.create(header, record=record))
        if sid in self.model.sessions:
            self.expect_refused(got, SessionExistsError, "session_exists")
            return
        assert not isinstance(got, Refused), got
        self.model.sessions[sid] = MSession(dict(header.data), None, [], mark="record" if record else "mirror")

    @precondition(lambda self: self.model.sessions)
    @rule(i=pick, at=pick, how=hs.sampled_from(["head", "own", "base", "prefix", "label", "unheld"]), j=pick)
    def fork(self, i: int, at: int, how: str, j: int) -> None:
        origin = self.choose(self.live(), i)
        o = self.model.sessions[origin]
        sid = self.choose(SESSION_IDS, j)
        leaf_labels = self.model.leaf_labels(origin)
        choices = {
            "head": [o.head],
            "own": [e for e in o.own if e not in leaf_labels],
            "base": [o.base] if o.base else [],
            "prefix": o.prefix[:-1],
            "label": sorted(leaf_labels),
            "unheld": [UNHELD],
        }[how]
        if not choices:
            return
        base = self.choose(choices, at)
        created_at = self.ts()
        got = self.each(lambda st: st.fork(origin, base, session_id=sid, header={"created_at": created_at}))
        # in the order the store checks: the base on the origin, the id free, the base's kind
        if base is None:
            self.expect_refused(got, BadBaseError, "bad_base")  # no head to fork at
            return
        if base == UNHELD:
            self.expect_refused(got, AgentSessionError, "no_entry")
            return
        if sid in self.model.sessions:
            self.expect_refused(got, SessionExistsError, "session_exists")
            return
        if base in leaf_labels:
            self.expect_refused(got, BadBaseError, "bad_base")
            return
        if isinstance(got, Refused) and got.code == "bad_base" and "not yet committed" in got.message:
            # RFC 0002: a fork's base is committed; the origin's lazy appends are not yet
            assert base in o.own, got
            return
        assert not isinstance(got, Refused), got
        header = {**o.header, "id": sid, "created_at": created_at, "base": base, "parent_session": origin}
        header = {k: v for k, v in header.items() if k in ("type", "format", "id", "created_at", "payload", "base",
                                                          "parent_session", "media")}
        self.model.sessions[sid] = MSession(header, base, self.model.path_to(base), head=base)

    @precondition(lambda self: self.model.sessions)
    @rule(i=pick)
    def delete(self, i: int) -> None:
        self.delete_id(self.choose(self.live(), i))

    def delete_id(self, sid: str) -> None:
        served = [st for kind, st in zip(self.kinds, self.stores, strict=True) if kind in self.served]
        if served and self.model.sessions[sid].mark == "mirror":
            # RFC 0003: deleting takes a lease and a mirror is never leased, so only the
            # mirror's record deletes it; a client's delete is refused, nothing changed
            self.expect_refused(self.each(lambda st: st.delete(sid), served), MirrorError, "mirror")
            return
        got = self.each(lambda st: st.delete(sid))
        assert not isinstance(got, Refused), got
        del self.model.sessions[sid]

    @rule(i=pick)
    def delete_absent(self, i: int) -> None:
        sid = self.choose(SESSION_IDS + IMPORT_IDS, i)
        if sid in self.model.sessions:
            return
        self.expect_refused(self.each(lambda st: st.delete(sid)), NoSuchSessionError, "no_session")

    @precondition(lambda self: any(sid in self.model.sessions for sid in self.model.refs.values()))
    @rule(i=pick, record=hs.booleans(), readopt=hs.booleans())
    def recreate(self, i: int, record: bool, readopt: bool) -> None:
        """A session a ref names, deleted and created again under its id (another
        incarnation: the ref is ``replaced``), and (``readopt``) the ref set again to it
        at once: RFC 0003 Refs' same-target update of a dangling ref, which a run of
        separate steps (a ref set, its session deleted, created again, the ref updated)
        reached too seldom to be drawn in the ``ci`` profile's examples. An imported
        session's id comes back as a session created empty."""
        sid = self.choose(sorted({s for s in self.model.refs.values() if s in self.model.sessions}), i)
        self.delete_id(sid)
        if sid in self.model.sessions:
            event("recreate: the session kept (a mirror a client may not delete)")
            return
        self.create_id(sid, record, False)
        if readopt:
            name = self.choose(sorted(n for n, target in self.model.refs.items() if target == sid), i)
            self.update_ref(name, sid, sid)

    # -- appends --------------------------------------------------------------------------

    def append_and_check(self, sid: str, entry: dict[str, Any], durable: bool | None,
                         predicted: str | None, refusal: tuple[type, str | None] | None = None,
                         may_refuse: bool = False) -> None:
        """Append ``entry`` to ``sid`` on every store: the outcome and head the model
        predicts (``predicted`` None: the model does not say whether the rules admit it,
        every backend must agree), or the refusal it predicts. ``may_refuse``: the rules
        the model does not keep (calls, runs) may refuse it; when they do not, it does
        what the model predicts."""
        s = self.model.sessions[sid]
        expected_head = self.expected_head
        if s.mark != "record":
            refusal = (MirrorError, "mirror")
        self.opened(sid)
        got = self.same(lambda st: self.handle(st, sid).append(entry, durable=durable),
                        lambda r: (r.id, r.outcome, r.head, r.durable, r.seq, r.note))
        if refusal is not None:
            self.expect_refused(got, refusal[0], refusal[1])
            return
        if (predicted is None or may_refuse) and isinstance(got, Refused):
            assert got.cls is AppendRefusedError, got
            return
        assert not isinstance(got, Refused), f"refused, where the model predicts {predicted}: {got}"
        event(f"append: {got.outcome}")
        if predicted is not None:
            assert got.outcome == predicted, (got.outcome, predicted)
        if got.outcome == "no-op":
            assert got.id in s.own and got.head == s.head, got
            return
        assert got.seq == len(s.own) + 1, (got.seq, len(s.own))
        if got.outcome == "continued":
            expected_head = got.id
        assert got.head == expected_head, (got.outcome, got.head, expected_head)
        parent = entry.get("parent", s.head)
        is_leaf = entry.get("type") == "label" and entry.get("label") == LEAF_LABEL
        self.model.entries.setdefault(got.id, MEntry(parent, is_leaf, dict(entry, id=got.id, parent=parent)))
        s.own.append(got.id)
        s.head = got.head

    #: The head the model predicts after the next append (see :meth:`predict`).
    expected_head: str | None = None

    def predict(self, sid: str, parent: str | None, *, leaf_target: Any = "-") -> tuple[str | None, Any]:
        """(outcome, refusal) the model predicts for an entry hanging from ``parent``; and
        sets :attr:`expected_head`. ``leaf_target`` is a leaf label's target."""
        s = self.model.sessions[sid]
        if s.base is not None and parent is None or parent in s.prefix and parent != s.base:
            return None, (AppendRefusedError, "base_rule")
        if parent is not None and parent != s.base and parent not in s.own:
            return None, (AppendRefusedError, None)
        if leaf_target != "-":
            if self.model.may_hold_head(sid, leaf_target):
                self.expected_head = leaf_target
                return "head-moved", None
            self.expected_head = s.head
            return "head-not-moved", None
        if parent == s.head:
            self.expected_head = None  # the new entry: set once its id is known
            return "continued", None
        self.expected_head = s.head
        return "branched", None

    def parent_choice(self, sid: str, how: str, i: int) -> tuple[bool, str | None]:
        """(found, parent) for a choice of parent: at the head, another own entry, the
        base, on the prefix above it, unheld, an entry of another session."""
        s = self.model.sessions[sid]
        others = sorted({e for o in self.model.sessions.values() for e in o.own} - set(s.own) - set(s.prefix))
        choices = {"head": [s.head], "own": s.own, "base": [s.base] if s.base else [], "prefix": s.prefix[:-1],
                   "unheld": [UNHELD], "other": others, "root": [None]}[how]
        if not choices:
            return False, None
        return True, self.choose(choices, i)

    @precondition(lambda self: self.model.sessions)
    @rule(i=pick, j=pick, how=hs.sampled_from(["head", "head", "head", "own", "base", "prefix", "unheld", "other",
                                               "root"]),
          text=hs.sampled_from(TEXTS), role=hs.sampled_from(["user", "assistant"]),
          durable=hs.sampled_from([None, True, False]))
    def append_message(self, i: int, j: int, how: str, text: str, role: str, durable: bool | None) -> None:
        sid = self.choose(self.live(), i)
        found, parent = self.parent_choice(sid, how, j)
        if not found:
            return
        entry = {"type": "item", "item": {"type": "message", "role": role, "content": text}, "ts": self.ts(),
                 "parent": parent}
        predicted, refusal = self.predict(sid, parent)
        self.append_and_check(sid, entry, durable, predicted, refusal)

    @precondition(lambda self: self.record_sessions())
    @rule(i=pick, n=hs.integers(min_value=1, max_value=4), text=hs.sampled_from(TEXTS),
          durable=hs.sampled_from([None, True, False]))
    def append_at_head(self, i: int, n: int, text: str, durable: bool | None) -> None:
        """The common append: messages continuing a record session's head, one by one."""
        at = self.live().index(self.choose(self.record_sessions(), i))
        for k in range(n):
            self.append_message(at, 0, "head", text, "user" if k % 2 else "assistant", durable)

    @precondition(lambda self: self.model.sessions)
    @rule(i=pick, j=pick, k=pick, to=hs.sampled_from(["own", "base", "none", "label", "prefix", "unheld"]),
          hang=hs.sampled_from(["head", "own"]), durable=hs.sampled_from([None, True, False]))
    def append_leaf_label(self, i: int, j: int, k: int, to: str, hang: str, durable: bool | None) -> None:
        sid = self.choose(self.live(), i)
        s = self.model.sessions[sid]
        labels = self.model.leaf_labels(sid)
        choices = {"own": [e for e in s.own if e not in labels], "base": [s.base], "none": [None],
                   "label": sorted(labels), "prefix": s.prefix[:-1], "unheld": [UNHELD]}[to]
        found, parent = self.parent_choice(sid, hang, k)
        if not choices or not found:
            return
        tgt = self.choose(choices, j)
        entry = {"type": "label", "label": LEAF_LABEL, "target": tgt, "parent": parent, "ts": self.ts()}
        predicted, refusal = self.predict(sid, parent, leaf_target=tgt)
        self.append_and_check(sid, entry, durable, predicted, refusal)

    @precondition(lambda self: self.model.sessions)
    @rule(i=pick, kind=hs.sampled_from(["function_call", "function_call_output", "response", "response_hash"]),
          call=hs.sampled_from(["c1", "c2"]), durable=hs.sampled_from([None, False]))
    def append_call(self, i: int, kind: str, call: str, durable: bool | None) -> None:
        """A function call, its output, or a response, at the head: the call and run rules
        (which the model does not keep) admit or refuse it alike on every backend. A
        response may carry a request_hash its path does not rebuild: kept, a finding, which
        plain fsck leaves to --deep on every backend (the invariant after maintenance)."""
        sid = self.choose(self.live(), i)
        s = self.model.sessions[sid]
        if kind == "response":
            entry: dict[str, Any] = {"type": "response", "status": "completed"}
        elif kind == "response_hash":
            entry = {"type": "response", "status": "completed", "request_hash": WRONG_REQUEST_HASH}
        elif kind == "function_call":
            entry = {"type": "item", "item": {"type": "function_call", "call_id": call, "name": "f", "arguments": "{}"}}
        else:
            entry = {"type": "item", "item": {"type": "function_call_output", "call_id": call, "output": "o"}}
        entry.update(parent=s.head, ts=self.ts())
        predicted, refusal = self.predict(sid, s.head)
        self.append_and_check(sid, entry, durable, predicted, refusal, may_refuse=True)

    @precondition(lambda self: self.model.sessions)
    @rule(i=pick, j=pick, name=hs.sampled_from(["bookmark", "review"]))
    def append_plain_label(self, i: int, j: int, name: str) -> None:
        """A label that is not ``leaf``: an entry like any other, continuing the head."""
        sid = self.choose(self.live(), i)
        s = self.model.sessions[sid]
        targets = s.own + ([s.base] if s.base else [])
        if not targets:
            return
        entry = {"type": "label", "label": name, "target": self.choose(targets, j), "parent": s.head, "ts": self.ts()}
        predicted, refusal = self.predict(sid, s.head)
        self.append_and_check(sid, entry, None, predicted, refusal)

    @precondition(lambda self: self.record_sessions())
    @rule(i=pick, synthetic=hs.sampled_from([True, False, "yes"]))
    def append_synthetic_label(self, i: int, synthetic: Any) -> None:
        """A label carrying ``synthetic`` (a projection's marker): refused, code synthetic."""
        sid = self.choose(self.record_sessions(), i)
        s = self.model.sessions[sid]
        entry = {"type": "label", "label": LEAF_LABEL, "target": s.head, "parent": s.head, "ts": self.ts(),
                 "synthetic": synthetic}
        self.append_and_check(sid, entry, None, None, (AppendRefusedError, "synthetic"))

    @precondition(lambda self: any(self.model.sessions[s].own for s in self.live()))
    @rule(i=pick, j=pick)
    def append_again(self, i: int, j: int) -> None:
        """An entry the session's log holds, appended again: a no-op (RFC 0002 "Append")."""
        sid = self.choose([s for s in self.live() if self.model.sessions[s].own], i)
        eid = self.choose(self.model.sessions[sid].own, j)
        self.expected_head = self.model.sessions[sid].head
        self.append_and_check(sid, dict(self.model.entries[eid].data), None, "no-op")

    @precondition(lambda self: self.model.sessions)
    @rule(i=pick, n=hs.integers(min_value=1, max_value=3), commit=hs.booleans(), text=hs.sampled_from(TEXTS))
    def prepare_batch(self, i: int, n: int, commit: bool, text: str) -> None:
        """A batch of continued messages, prepared (nothing written), then committed (all
        visible at once) or discarded (nothing changed)."""
        sid = self.choose(self.live(), i)
        s = self.model.sessions[sid]
        entries = [{"type": "item", "item": {"type": "message", "role": "user", "content": f"{text} {k}"},
                    "ts": self.ts()} for k in range(n)]

        def run(st: Store) -> list[tuple[str, str, str | None]]:
            batch = self.handle(st, sid).prepare(entries)
            out = [(r.id, r.outcome, r.head) for r in batch.results]
            if commit:
                batch.commit()
            else:
                batch.discard()
            return out

        self.opened(sid)
        got = self.same(run)
        if s.mark != "record":
            self.expect_refused(got, MirrorError, "mirror")
            return
        assert not isinstance(got, Refused), got
        assert [o for _, o, _ in got] == ["continued"] * n, got
        if commit:
            parent = s.head
            for (eid, _, head), e in zip(got, entries, strict=True):
                self.model.entries.setdefault(eid, MEntry(parent, False, dict(e, id=eid, parent=parent)))
                s.own.append(eid)
                parent = s.head = head

    # -- the head ---------------------------------------------------------------------------

    @precondition(lambda self: self.model.sessions)
    @rule(i=pick, j=pick, to=hs.sampled_from(["own", "own", "base", "none", "label", "unheld", "prefix"]),
          expected_right=hs.booleans())
    def set_head(self, i: int, j: int, to: str, expected_right: bool) -> None:
        """Head compare-and-swap (RFC 0002 "Head"): to an earlier entry, the base, none."""
        sid = self.choose(self.live(), i)
        s = self.model.sessions[sid]
        labels = self.model.leaf_labels(sid)
        choices = {"own": [e for e in s.own if e not in labels], "base": [s.base] if s.base else [],
                   "none": [None], "label": sorted(labels), "unheld": [UNHELD], "prefix": s.prefix[:-1]}[to]
        if not choices:
            return
        new = self.choose(choices, j)
        if expected_right:
            expected = s.head
        else:
            wrong = [e for e in [None, *s.own, UNHELD] if e != s.head]
            expected = self.choose(wrong, j)
        self.opened(sid)
        got = self.each(lambda st: self.handle(st, sid).set_head(new, expected=expected))
        if s.mark != "record":
            self.expect_refused(got, MirrorError, "mirror")
        elif not expected_right:
            self.expect_refused(got, HeadMovedError, "head_moved")
        elif not self.model.may_hold_head(sid, new):
            self.expect_refused(got, AppendRefusedError, "head_target" if new is None or new in labels else "no_entry")
        else:
            assert not isinstance(got, Refused), got
            s.head = new

    # -- handles and the store --------------------------------------------------------------

    @precondition(lambda self: any(s.open for s in self.model.sessions.values()))
    @rule(i=pick)
    def close_handle(self, i: int) -> None:
        self.close(self.choose([s for s in self.live() if self.model.sessions[s].open], i))

    def close(self, sid: str) -> None:
        got = self.each(lambda st: self.handle(st, sid).close())
        assert not isinstance(got, Refused), got
        self.model.sessions[sid].open = False

    @precondition(lambda self: self.model.sessions)
    @rule(i=pick)
    def open_handle(self, i: int) -> None:
        sid = self.choose(self.live(), i)
        self.opened(sid)

    @precondition(lambda self: any(s.open for s in self.model.sessions.values()))
    @rule(i=pick)
    def commit(self, i: int) -> None:
        sid = self.choose([s for s in self.live() if self.model.sessions[s].open], i)
        got = self.each(lambda st: self.handle(st, sid).commit())
        assert not isinstance(got, Refused), got

    @rule()
    def reopen_store(self) -> None:
        """Close every store (every handle committed and released) and open it again
        (files: a new ``open_store`` on the directory; memory: the named store again)."""
        for f, st in zip(self.factories, self.stores, strict=True):
            st.close()
            f.opened.remove(st)
        self.stores = [f.reopen(sync="never") for f in self.factories]
        for s in self.model.sessions.values():
            s.open = False
        self.maintained = True

    # -- export and import ------------------------------------------------------------------

    @precondition(lambda self: self.model.sessions)
    @rule(i=pick, j=pick, record=hs.booleans())
    def export_import(self, i: int, j: int, record: bool) -> None:
        """Export a session, import the bytes under another id; the import exports the
        same bytes (lossless both ways), and holds the same entries, head and base."""
        sid = self.choose(self.live(), i)
        new = self.choose(IMPORT_IDS, j)
        data = self.same(lambda st: st.export(sid))
        assert not isinstance(data, Refused), data
        first, _, rest = data.partition(b"\n")
        header = json.loads(first)
        header["id"] = new
        renamed = Header(header).canonical_line() + rest
        got = self.same(lambda st: st.import_bytes(renamed, record=record),
                        lambda s: (s.id, s.head, s.base, list(s.log_order), s.head_adjusted))
        if b'"request_hash":"' + WRONG_REQUEST_HASH.encode() in rest:
            # A response kept with a request_hash its path does not rebuild (append_call):
            # the store kept it, but an import refuses it, as verify fails it (docs/rules.md:
            # refusing a file loses nothing), alike on every backend.
            event("export_import: refused, a kept request_hash finding")
            assert isinstance(got, Refused) and got.code == "bad_file" and "MISMATCH" in got.message, got
            return
        if new in self.model.sessions:
            self.expect_refused(got, SessionExistsError, "session_exists")
            return
        assert not isinstance(got, Refused), f"a store's own export, renamed, was refused: {got}"
        o = self.model.sessions[sid]
        self.model.sessions[new] = MSession(header, o.base, list(o.prefix), list(o.own), o.head,
                                            "record" if record else "mirror")
        adjusted = got.head_adjusted
        if adjusted is not None:
            # The resume rule over a store's own export lands on a leaf label only where the
            # label is the last line and out of force (its target a leaf label, or on the
            # prefix, or unheld): RFC 0001 resolves it to its nearest ancestor that is not
            # one, which is the head (else the projection would carry a marker), and the
            # import reports the step (RFC 0002 "Projection to JSONL"). Nothing is lost.
            event("export_import: head_adjusted reported")
            assert (adjusted.why, adjusted.named, adjusted.held) == ("leaf_label", o.own[-1], o.head), adjusted
            assert self.model.entries[adjusted.named].leaf, adjusted
        exported = self.same(lambda st: st.export(new))
        assert exported == renamed, "an export imported again does not export the same bytes"

    # -- refs -------------------------------------------------------------------------------

    @rule(i=pick, j=pick, expected_right=hs.booleans(), to_deleted=hs.booleans())
    def ref_update(self, i: int, j: int, expected_right: bool, to_deleted: bool) -> None:
        name = self.choose(REF_NAMES, i)
        targets = self.live() if not to_deleted else [s for s in SESSION_IDS if s not in self.model.sessions]
        if not targets:
            return
        session = self.choose(targets, j)
        current = self.model.refs.get(name)
        expected = current if expected_right else self.choose([s for s in (None, *SESSION_IDS) if s != current], j)
        self.update_ref(name, session, expected)

    @precondition(lambda self: self.model.refs)
    @rule(i=pick)
    def ref_update_same(self, i: int) -> None:
        """A ref set again to the session it names (expected right): nothing changes while
        it is ``ok``; a ``dangling`` one is refused (no such session); a ``replaced`` one is
        where the library and RFC 0003 part (:meth:`update_ref`)."""
        name = self.choose(sorted(self.model.refs), i)
        self.update_ref(name, self.model.refs[name], self.model.refs[name])

    def update_ref(self, name: str, session: str, expected: str | None) -> None:
        current = self.model.refs.get(name)
        state = self.model.ref_state(name) if current is not None else None

        def op(st: Store) -> Any:
            return Refs(st).update(name, session, expected=expected)

        if expected != current:
            self.expect_refused(self.same(op), RefMovedError, "ref_moved")
            return
        if session not in self.model.sessions:
            event(f"update_ref: to a deleted session, the ref {state or 'absent'}")
            self.expect_refused(self.same(op), NoSuchSessionError, "no_session")
            return
        if session == current and state == "replaced":
            # RFC 0003 Refs: "a same-target update on a dangling ref is refused with
            # ref_dangling" (another session now holding its id is dangling there), "a ref
            # is re-adopted by deleting it and setting it again"; the library re-adopts it by
            # this very update, writing the new incarnation's ident (docs/refs.md).
            event("update_ref: same target, replaced")
            local = [st for kind, st in zip(self.kinds, self.stores, strict=True) if kind not in self.served]
            served = [st for st in self.stores if st not in local]
            for st in served:
                self.expect_refused(self.each(op, [st]), DanglingRefError, "ref_dangling")
                readopted = self.each(lambda st: (Refs(st).delete(name, expected=session),
                                                  Refs(st).update(name, session, expected=None))[1], [st])
                assert not isinstance(readopted, Refused), readopted
                assert (readopted[0].old, readopted[0].new, readopted[0].changed) == (None, session, True)
            if local:
                got = self.each(op, local)
                assert not isinstance(got, Refused), got
                assert all((u.old, u.new, u.changed) == (session, session, True) for u in got), got
            self.model.set_ref(name, session)
            return
        got = self.same(op, lambda u: (u.name, u.old, u.new, u.changed))
        if not isinstance(got, Refused):
            assert got.changed == (session != current or state != "ok"), (got, state)
            self.model.set_ref(name, session)
        else:
            assert got.code == "ref_name" and current is None, got  # a name beside one it conflicts with

    @precondition(lambda self: self.model.refs)
    @rule(i=pick, expected_right=hs.booleans())
    def ref_delete(self, i: int, expected_right: bool) -> None:
        name = self.choose(sorted(self.model.refs), i)
        current = self.model.refs[name]
        expected = current if expected_right else self.choose([s for s in SESSION_IDS if s != current], i)
        got = self.same(lambda st: Refs(st).delete(name, expected=expected), lambda u: (u.old, u.new, u.changed))
        if not expected_right:
            self.expect_refused(got, RefMovedError, "ref_moved")
            return
        assert not isinstance(got, Refused), got
        del self.model.refs[name]
        del self.model.ref_headers[name]

    # -- maintenance ------------------------------------------------------------------------

    @rule()
    def pack(self) -> None:
        got = self.each(lambda st: st.pack())
        assert not isinstance(got, Refused), got
        self.maintained = True

    @rule(close_first=hs.booleans())
    def sweep(self, close_first: bool) -> None:
        """``sweep`` with grace 0: refused while a writer holds a session; else it removes
        nothing a live session needs (every one exports what it did before)."""
        if close_first:
            for sid in self.live():
                if self.model.sessions[sid].open:
                    self.close(sid)
        local = [st for kind, st in zip(self.kinds, self.stores, strict=True) if kind not in self.served]
        for kind, st in zip(self.kinds, self.stores, strict=True):
            if kind in self.served:
                # RFC 0003 carries no sweep (the server's own maintenance): refused, the
                # store as it was (a grace of 0 is refused first: no client can tell
                # whether a writer holds a session of the server's)
                self.expect_refused(self.each(lambda st: st.sweep(grace=0), [st]), AgentSessionError)
        if any(s.open for s in self.model.sessions.values()):
            self.expect_refused(self.each(lambda st: st.sweep(grace=0), local), WritersActiveError, "writers_active")
            return
        before = [{sid: st.export(sid) for sid in self.live()} for st in local]
        got = self.each(lambda st: st.sweep(grace=0), local)
        assert not isinstance(got, Refused), got
        after = [{sid: st.export(sid) for sid in self.live()} for st in local]
        assert after == before, "a sweep changed what a live session exports"
        self.maintained = True

    @rule()
    def run_fsck(self) -> None:
        self.maintained = True

    # -- the invariants -----------------------------------------------------------------------

    @invariant()
    def fsck_clean_after_maintenance(self) -> None:
        if not self.maintained:
            return
        self.maintained = False
        for kind, st in zip(self.kinds, self.stores, strict=True):
            report = fsck(st)
            bad = [f"{p.severity} {p.code}: {p.message}" for p in report.problems if p.severity in ("error", "warning")]
            assert not bad, f"fsck of the {kind} store: {bad}"

    @invariant()
    def stores_agree_with_the_model(self) -> None:
        m = self.model
        for kind, st in zip(self.kinds, self.stores, strict=True):
            assert st.list() == self.live(), (kind, st.list(), self.live())
        exports = []
        for sid in self.live():
            s = m.sessions[sid]
            data = self.same(lambda st, sid=sid: st.export(sid))
            assert not isinstance(data, Refused), data
            exports.append(data)
            lines = data.splitlines()
            assert json.loads(lines[0]) == s.header, (sid, lines[0], s.header)
            ids = [json.loads(line)["id"] for line in lines[1:]]
            last = json.loads(lines[-1]) if len(lines) > 1 else {}
            if last.get("synthetic") is True:
                ids = ids[:-1]
            assert ids == s.prefix + s.own, (sid, "projection", ids, s.prefix + s.own)
            leaf_labels = m.leaf_labels(sid)
            for kind, st in zip(self.kinds, self.stores, strict=True):
                history = st.history(sid)
                assert not history.damage, (kind, sid, history.damage)
                state = replay(history.records)
                seen = (state.base, state.head, state.mark, list(state.log_order), state.leaf_labels,
                        [state.own[e] for e in state.log_order])
                # every accepted append takes the next sequence number (RFC 0002 "Ordering")
                want = (s.base, s.head, s.mark, s.own, leaf_labels, list(range(1, len(s.own) + 1)))
                assert seen == want, (kind, sid, seen, want)
                assert st.header(sid).data == s.header, (kind, sid)
                held = st.opened(sid)
                assert (held is not None) == s.open, (kind, sid, "handle held", held, s.open)
                if held is not None:
                    assert (held.head, list(held.log_order), held.mark, held.base) == (s.head, s.own, s.mark, s.base)
        for kind, st in zip(self.kinds, self.stores, strict=True):
            refs = {r.name: r.session for r in Refs(st).list()}
            assert refs == m.refs, (kind, refs, m.refs)
        states = self.same(lambda st: [(r.name, Refs(st).state(r)) for r in Refs(st).list()])
        assert not isinstance(states, Refused)
        assert states == [(name, m.ref_state(name)) for name in sorted(m.refs)], (states, m.refs)


def _drop_schema(url: str) -> None:
    import pg_server

    schema = url.rsplit("schema=", 1)[1]
    pg_server.shared().psql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


class _Scratch:
    """A tmpfs directory for the file stores of this module's runs (contract_helpers.scratch_root)."""

    root: str | None = None


_SCRATCH = _Scratch()

#: ``AGENTSESSION_MODEL_NO_SHRINK=1``: report a failure as found, not shrunk (shrinking a
#: long sequence can take hypothesis its five minutes), for a quick look while exploring.
_NO_SHRINK: dict[str, Any] = ({"phases": [Phase.explicit, Phase.generate], "report_multiple_bugs": False}
                              if os.environ.get("AGENTSESSION_MODEL_NO_SHRINK") else {})


@pytest.fixture(scope="module", autouse=True)
def _scratch(tmp_path_factory: pytest.TempPathFactory):
    root = scratch_root()
    _SCRATCH.root = root if root is not None else str(tmp_path_factory.mktemp("model"))
    yield
    shutil.rmtree(_SCRATCH.root, ignore_errors=True)
    _SCRATCH.root = None


# -- the runs ---------------------------------------------------------------------------------




def _scaled(n: int) -> int:
    """``n`` examples under the ``ci`` profile (whose default is 100), as many more under
    a profile that asks for more (``explore``: 1,000, so ten times ``n``)."""
    return max(1, n * settings.default.max_examples // 100)


class FileAndMemory(Machine):
    kinds = ("file", "memory")


TestFileAndMemory = FileAndMemory.TestCase
TestFileAndMemory.settings = settings(max_examples=_scaled(40), stateful_step_count=40, **_NO_SHRINK)


class FileAndHttp(Machine):
    """A file store beside a file store served over RFC 0003 (tests/http_store.py): what
    the protocol carries behaves as the library does locally. Sweep is not carried
    (refused there), a client's delete of a mirror is refused (never leased), and a ref
    set again to its session created anew is refused ``ref_dangling`` (RFC 0003 Refs),
    where the library re-adopts it (:meth:`Machine.update_ref`)."""

    kinds = ("file", "http")


TestFileAndHttp = FileAndHttp.TestCase
TestFileAndHttp.settings = settings(max_examples=_scaled(15), stateful_step_count=30, **_NO_SHRINK)


class FileMemoryPostgresql(Machine):
    kinds = ("file", "memory", "postgresql")


TestFileMemoryPostgresql = pytest.mark.slow(FileMemoryPostgresql.TestCase)
TestFileMemoryPostgresql.settings = settings(max_examples=_scaled(25), stateful_step_count=50, **_NO_SHRINK)



@pytest.mark.parametrize("machine", [FileAndMemory, FileAndHttp], ids=["memory", "http"])
def test_a_ref_meets_its_session_deleted_and_created_again(machine, monkeypatch):
    """The steps RFC 0003 Refs parts from the library on, driven in order (the machine
    draws them, seldom): a ref to s0; s0 deleted and created again, the ref set again to
    it (the library re-adopts the new incarnation; a server refuses ``ref_dangling``, and
    the ref is re-adopted there by deleting it and setting it again); s0 deleted, the ref
    set again to it (no such session: the client asks before the server would say
    ``ref_dangling``). Before session 39 the machine held every backend to one outcome,
    and the file and HTTP stores disagreed at the second step."""
    monkeypatch.setattr(sys.modules[__name__], "event", lambda *_: None)  # (outside a hypothesis run)
    m = machine()
    try:
        m.start(0, True)
        m.start_ref(True)
        m.stores_agree_with_the_model()
        m.recreate(0, True, True)
        assert m.model.ref_state("main") == "ok"
        m.stores_agree_with_the_model()
        m.delete(0)
        assert m.model.ref_state("main") == "dangling"
        m.ref_update_same(0)
        m.stores_agree_with_the_model()
    finally:
        m.teardown()


__all__ = ["BackendKind", "Machine"]
