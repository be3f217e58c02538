"""The store's contract, one set of tests for every backend (RFC 0002, over the seam of
agentsession_cas/backends/base.py).

Every test takes ``make_store``, a factory of stores of one backend, and runs once per
backend in :data:`contract_helpers.BACKENDS`; tests between two stores (import,
exchange) take ``pair`` and run for every ordered pair of backends. A new backend
passes the same tests by adding one line to that list.

Conventions: a refusal is checked for its error class, its stable ``code`` (and an
append refusal's ``rule``), and for leaving the store exactly as it was
(:func:`contract_helpers.unchanged`: projections, log orders, heads, marks and log
records read afresh, and the writing handle's own view). Library bugs found here are
``xfail(strict=True)`` with a reason starting "BUG:", for the lead to fix.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agentsession_cas import LEAF_LABEL, Header, is_valid_ts, make_entry, read_session_bytes
from agentsession_cas.errors import (
    AgentSessionError,
    AppendRefusedError,
    BadNameError,
    BadRefNameError,
    CorruptObjectError,
    DanglingRefError,
    HeaderDiffersError,
    HeadMovedError,
    MirrorError,
    NoSuchObjectError,
    NoSuchRefError,
    NoSuchSessionError,
    NotRecordError,
    ReadOnlyError,
    RefConflictError,
    RefMovedError,
    SessionExistsError,
    SessionLockedError,
    StoreError,
)
from agentsession_cas.exchange import operations as ex
from agentsession_cas.exchange.local import open_transport
from agentsession_cas.exchange.transport import PushRequest
from agentsession_cas.format.codes import STORE_ONLY
from agentsession_cas.format.entry import short_id
from agentsession_cas.format.hashing import entry_objects, sha256_ref
from agentsession_cas.maintenance.check import verify_stored
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from agentsession_cas.store.refs import Refs
from agentsession_cas.store.url import open_store
from contract_helpers import (
    BACKENDS,
    StoreFactory,
    committed_in_log,
    domain_records,
    fingerprint,
    leaf,
    msg,
    remove_tree,
    scratch_root,
    ts,
    unchanged,
)
from storetools import count_entry_reads

UNHELD = "sha256:" + "0" * 64  # an entry id no store in these tests holds
TS0 = "2026-10-05T11:00:00Z"


# -- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _scratch_root() -> Iterator[str | None]:
    root = scratch_root()
    yield root
    if root is not None:
        remove_tree(root)


@pytest.fixture
def scratch(_scratch_root: str | None, tmp_path: Path) -> Iterator[Path]:
    """A directory this test owns for stores kept in files (see contract_helpers.scratch_root)."""
    if _scratch_root is None:
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(dir=_scratch_root))
    yield path
    remove_tree(path)


def _factory(kind, scratch: Path, request: pytest.FixtureRequest, role: str = "") -> StoreFactory:
    name = request.node.originalname
    why = kind.skips.get(name) or kind.skips.get(f"{name}[{role}]")
    if why is not None:
        pytest.skip(f"{kind}: {why}")
    factory = StoreFactory(kind, scratch)

    def close() -> None:
        errors = factory.close_all()
        assert not errors, f"closing the {kind} stores failed: {errors}"

    request.addfinalizer(close)
    return factory


@pytest.fixture(params=BACKENDS, ids=str)
def make_store(request: pytest.FixtureRequest, scratch: Path) -> StoreFactory:
    """A factory: ``make_store(name="a", sync=...)`` a fresh writable store of this
    backend; ``make_store.reopen(name, readonly=...)`` the same store opened again."""
    return _factory(request.param, scratch, request)


#: Every ordered pair, but a backend that says so (``pairs_with``) only meets those it names.
_PAIRS = [(a, b) for a in BACKENDS for b in BACKENDS
          if (a.pairs_with is None or b.name in a.pairs_with) and (b.pairs_with is None or a.name in b.pairs_with)]


@pytest.fixture(params=_PAIRS, ids=lambda p: f"{p[0]}-to-{p[1]}")
def pair(request: pytest.FixtureRequest, scratch: Path) -> tuple[StoreFactory, StoreFactory]:
    """Two factories, for a store of the first backend and one of the second (every
    ordered pair, the same backend twice included)."""
    src, dst = request.param
    return _factory(src, scratch, request, "first"), _factory(dst, scratch, request, "second")


@pytest.fixture
def remote_pair(pair: tuple[StoreFactory, StoreFactory]) -> tuple[StoreFactory, StoreFactory]:
    """A pair whose second backend the local transport reaches by URL (exchange)."""
    if not pair[1].kind.reachable:
        pytest.skip(f"the local transport does not reach a {pair[1].name} store")
    return pair


# -- small builders ---------------------------------------------------------------------


def chain(st: Store, sid: str = "s1", n: int = 3, **header_kw):
    """A fresh session with n continued messages; (session, their ids)."""
    s = st.create(Header.new(sid, **header_kw))
    return s, [s.append(msg(f"{sid} m{i}")).id for i in range(n)]


def fork_of(st: Store, n: int = 3, base_index: int = 1, sid: str = "f", **header_kw):
    """Origin ``a`` with n messages and a fork at ``ids[base_index]``, both with the
    header members given; (origin, ids, fork)."""
    a, ids = chain(st, "a", n, **header_kw)
    f = st.create(Header.new(sid, base=ids[base_index], **header_kw))
    return a, ids, f


def known_bug(request: pytest.FixtureRequest, when: bool, reason: str) -> None:
    """Mark this run of the test a known library bug (a strict xfail) when ``when``
    (the bug is one backend's: the others run it as a plain test)."""
    if when:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def refused(excinfo, code: str, rule: str | None = None) -> None:
    err = excinfo.value
    assert err.code == code, (err.code, str(err))
    if rule is not None:
        assert getattr(err, "rule", None) == rule, (getattr(err, "rule", None), str(err))


def ts_seconds(value: str) -> datetime:
    return datetime.fromisoformat(value[:19]).replace(tzinfo=UTC)


# =====================================================================================
# 1. Append outcomes (RFC 0002 "Append", "Head", "Durability and recovery")
# =====================================================================================


def test_append_defaults_parent_to_head_and_ts_to_now(make_store):
    """RFC 0002 "Append": ``parent`` defaults to the head (none at first: a root) and
    ``ts`` to now; each append that names the head continues it."""
    st = make_store()
    s = st.create(Header.new("s1"))
    before = datetime.now(UTC).replace(microsecond=0)
    r1 = s.append({"type": "item", "item": {"type": "message", "role": "user", "content": "hi"}})
    r2 = s.append({"type": "item", "item": {"type": "message", "role": "user", "content": "again"}})
    after = datetime.now(UTC)
    assert (r1.outcome, r2.outcome) == ("continued", "continued")
    assert r1.head_moved and r2.head_moved
    e1, e2 = st.entry(r1.id), st.entry(r2.id)
    assert e1.parent is None and e2.parent == r1.id
    for e in (e1, e2):
        assert is_valid_ts(e.ts)
        assert before - timedelta(seconds=1) <= ts_seconds(e.ts) <= after + timedelta(seconds=1)
    assert s.head == r2.id == r2.head
    assert s.log_order == [r1.id, r2.id]


def test_append_continued_branched_and_seq(make_store):
    """RFC 0002 "Append", "Ordering": an entry whose parent is the head continues it; one
    whose parent is not branches and moves nothing; every accepted append takes the
    next sequence number, branches included."""
    st = make_store()
    s, ids = chain(st, n=3)
    r = s.append(msg("branch", parent=ids[0]))
    assert r.outcome == "branched" and not r.head_moved
    assert r.head == ids[2] == s.head
    assert s.log_order == ids + [r.id]
    r2 = s.append(msg("continue"))
    assert r2.outcome == "continued" and st.entry(r2.id).parent == ids[2]
    seqs = [s.own[i] for i in s.log_order]
    assert seqs == list(range(1, 6))
    assert (r.seq, r2.seq) == (4, 5)


def test_append_no_op_when_log_holds_entry(make_store):
    """RFC 0002 "Append": an entry the log already holds is a no-op, reported as such,
    with its own sequence number, moving nothing and writing nothing; a committed one
    reports durable."""
    st = make_store()
    s, ids = chain(st, n=2)
    again = st.entry(ids[0])
    with unchanged(st, s):
        r = s.append(again)
    assert r.outcome == "no-op" and r.id == ids[0] and r.seq == 1
    assert r.head == ids[1] and not r.head_moved
    assert r.durable is True
    # the same entry given as a plain dict, its id stated
    with unchanged(st, s):
        r = s.append(dict(again.data))
    assert r.outcome == "no-op" and r.seq == 1


def test_no_op_of_uncommitted_entry_is_not_durable_until_commit(make_store):
    """RFC 0002 "Durability": a no-op says whether the entry it found is committed."""
    st = make_store(sync="never")
    s = st.create(Header.new("s1"))
    e = msg("lazy")
    r = s.append(e)
    assert r.durable is False
    assert s.append(dict(e, parent=None)).durable is False
    s.commit()
    again = s.append(dict(e, parent=None))
    assert again.outcome == "no-op" and again.durable is True


def test_leaf_label_moves_head_to_own_entry_target(make_store):
    """RFC 0002 "Head": a ``leaf`` label moves the head to its target (an own entry that is
    not a label), wherever the label itself hangs; the label joins the log."""
    st = make_store()
    s, ids = chain(st, n=3)
    r = s.append(leaf(ids[0], ids[2]))
    assert r.outcome == "head-moved" and r.head_moved
    assert s.head == ids[0] == r.head
    assert r.id in s.log_order and r.id in s.leaf_labels
    # hanging elsewhere than the head changes nothing about that
    r2 = s.append(leaf(ids[1], ids[2]))
    assert r2.outcome == "head-moved" and s.head == ids[1]


def test_leaf_label_moves_head_to_base(make_store):
    """RFC 0002 "Head": the base may hold the head, so a label naming it moves it there."""
    st = make_store()
    a, ids, f = fork_of(st)
    r1 = f.append(msg("own"))
    r = f.append(leaf(ids[1], r1.id))
    assert r.outcome == "head-moved" and f.head == ids[1]


@pytest.mark.parametrize("target_kind", ["unheld", "label", "prefix", "none-in-fork"])
def test_leaf_label_not_moving_head(make_store, target_kind):
    """RFC 0002 "Head": a ``leaf`` label whose target may not hold the head (neither the
    base nor an own entry, or a ``leaf`` label, or nothing in a session with a base) is
    accepted and moves nothing, and the outcome says so."""
    st = make_store()
    a, ids, f = fork_of(st, n=3, base_index=1)
    r1 = f.append(msg("own 1"))
    first_label = f.append(leaf(r1.id, r1.id))
    assert first_label.outcome == "head-moved"
    target = {"unheld": UNHELD, "label": first_label.id, "prefix": ids[0], "none-in-fork": None}[target_kind]
    head = f.head
    r = f.append(leaf(target, r1.id))
    assert r.outcome == "head-not-moved" and not r.head_moved
    assert f.head == head == r.head
    assert r.id in f.log_order and r.id in f.leaf_labels
    assert r.note


def test_leaf_label_to_none_moves_head_in_baseless_session(make_store):
    """RFC 0002 "Head": without a base, "no head" is a head the rule admits."""
    st = make_store()
    s, ids = chain(st, n=1)
    r = s.append(leaf(None, ids[0]))
    assert r.outcome == "head-moved" and s.head is None


def test_re_appended_leaf_label_is_no_op_and_moves_nothing(make_store):
    """RFC 0002 "Head": a ``leaf`` label the log holds is a no-op like any re-append."""
    st = make_store()
    s, ids = chain(st, n=2)
    label = leaf(ids[0], ids[1])
    assert s.append(label).outcome == "head-moved"
    s.set_head(ids[1], expected=ids[0])
    with unchanged(st, s):
        r = s.append(label)
    assert r.outcome == "no-op" and s.head == ids[1]


def test_null_parent_continues_a_session_with_no_head(make_store):
    """RFC 0002 "Append": a null-parent entry continues a session with no head, and is a
    branch (another root) once there is one; after the head is set back to none, it
    continues again."""
    st = make_store()
    s = st.create(Header.new("s1"))
    r1 = s.append(msg("root 1", parent=None))
    assert r1.outcome == "continued" and s.head == r1.id
    r2 = s.append(msg("root 2", parent=None))
    assert r2.outcome == "branched" and s.head == r1.id
    s.set_head(None, expected=r1.id)
    r3 = s.append(msg("root 3", parent=None))
    assert r3.outcome == "continued" and s.head == r3.id


def test_append_seq_increases_across_outcomes(make_store):
    """RFC 0002 "Ordering": the store assigns each accepted append the next sequence
    number; a no-op takes none."""
    st = make_store()
    s, ids = chain(st, n=2)
    results = [
        s.append(msg("c")),
        s.append(msg("b", parent=ids[0])),
        s.append(leaf(ids[0], ids[1])),
        s.append(st.entry(ids[0])),  # no-op
        s.append(msg("after")),
    ]
    seqs = [r.seq for r in results]
    assert seqs == [3, 4, 5, 1, 6]


def test_sync_always_commits_every_append(make_store):
    """RFC 0002 "Durability": under ``always`` each append returns committed, and says so."""
    st = make_store(sync="always")
    s, ids = chain(st, n=3)
    r = s.append(msg("x"))
    assert r.durable is True
    assert all(committed_in_log(s, i) for i in ids + [r.id])
    assert all(s.is_committed(i) for i in ids)


def test_sync_never_leaves_appends_uncommitted_until_commit(make_store):
    """RFC 0002 "Working state and commits": under ``never`` appends are accepted
    (visible, moving the head) and not committed until ``commit()``, which says nothing
    when there is nothing to commit."""
    st = make_store(sync="never")
    s, ids = chain(st, n=3)
    rs = [s.append(msg(f"lazy {i}")) for i in range(2)]
    assert not any(r.durable for r in rs)
    assert s.head == rs[-1].id
    assert not any(committed_in_log(s, r.id) for r in rs)
    snap = st.read("s1")
    assert snap.head == rs[-1].id and snap.log_order == ids + [r.id for r in rs]  # working state is visible
    snap.close()
    s.commit()
    assert all(committed_in_log(s, r.id) and s.is_committed(r.id) for r in rs)
    records = s.records()
    s.commit()  # nothing to commit: nothing written
    assert s.records() == records


@pytest.mark.parametrize(
    "entry, durable",
    [
        ({"type": "response", "status": "completed"}, True),
        ({"type": "item", "item": {"type": "function_call_output", "call_id": "c", "output": "o"}}, True),
        ({"type": "compaction", "summary": {"type": "message", "role": "user", "content": "s"}}, True),
        ({"type": "branch_summary", "summary": "s"}, True),
        ({"type": "item", "item": {"type": "message", "role": "user", "content": "q"}}, False),
        ({"type": "item", "item": {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}}, False),
    ],
)
def test_sync_responses(make_store, entry, durable):
    """RFC 0002 "Durability": under ``responses`` a response, a function call output, a
    compaction and a branch summary are committed before the append returns; others not."""
    st = make_store(sync="responses")
    s = st.create(Header.new("s1"))
    first = s.append(msg("first"))
    assert first.durable is False
    if entry["type"] == "compaction":
        entry = dict(entry, first_kept=first.id)  # on its path, as the rules ask
    r = s.append(dict(entry, ts=ts()))
    assert r.durable is durable
    assert committed_in_log(s, r.id) is durable
    # a commit covers the whole log so far, the earlier lazy append included
    assert committed_in_log(s, first.id) is durable


def test_sync_never_commits_record_types_the_header_names(make_store):
    """RFC 0002 "Append" (RFC 0001's writing discipline): an entry of a type the header
    names in ``records`` is committed before the append returns, whatever the policy."""
    st = make_store(sync="never")
    s = st.create(Header.new("s1", records=["custom"]))
    r1 = s.append(msg("lazy"))
    r2 = s.append({"type": "custom", "ts": ts(), "ns": "test", "data": "go"})
    assert (r1.durable, r2.durable) == (False, True)
    assert committed_in_log(s, r2.id)


@pytest.mark.parametrize("sync, override", [("never", True), ("always", False), ("responses", True)])
def test_per_append_durable_override(make_store, sync, override):
    """RFC 0002 "Durability": an append may ask to be committed (or not) whatever the
    store's policy, and the result says which it did."""
    st = make_store(sync=sync)
    s = st.create(Header.new("s1"))
    r = s.append(msg("x"), durable=override)
    assert r.durable is override
    assert committed_in_log(s, r.id) is override


def test_durable_appends_survive_reopen(make_store):
    """RFC 0002 "Durability": what an append acknowledged as committed is there when the
    store is opened again."""
    st = make_store(sync="never")
    s = st.create(Header.new("s1"))
    r1 = s.append(msg("a"), durable=True)
    s.close()
    st2 = make_store.reopen(readonly=True)
    snap = st2.read("s1")
    assert snap.log_order == [r1.id] and snap.head == r1.id and snap.is_committed(r1.id)
    snap.close()


def test_a_session_let_go_is_appended_to_and_listed_reading_none_of_its_entries(make_store, monkeypatch):
    """What a writer's close leaves with the backend (the summary ``list`` shows and the
    append rules' state, both checked against the log before use) lets the next writer
    judge its first append, and a reader summarise the session, reading none of the
    session's entries: an open costs what changed since, on every backend."""
    st = make_store()
    s, ids = chain(st, n=6)
    s.close()
    st.close()
    reads = count_entry_reads(monkeypatch)
    w = make_store.reopen().session("s1")
    assert w.append(msg("after the reopen")).outcome == "continued"
    assert reads == [], "the kept rules' state was not used"
    assert st_summary_entries(make_store, "s1") == 7  # the summary kept, and the one entry since
    assert len(reads) == 1
    w.close()
    reads.clear()
    assert st_summary_entries(make_store, "s1") == 7
    assert reads == [], "the kept summary was not used"


def test_an_imported_session_is_appended_to_reading_none_of_its_entries(make_store, monkeypatch, tmp_path):
    """An import keeps the append rules' state its own verify pass leaves, so the first
    append after it (in this process or after a reopen) reads none of the session."""
    st = make_store()
    s, ids = chain(st, "orig", n=6)
    path = tmp_path / "orig.jsonl"
    st.export_to("orig", path)
    st.delete("orig")
    st.import_file(path, record=True).close()
    st.close()
    reads = count_entry_reads(monkeypatch)
    w = make_store.reopen().session("orig")
    assert w.append(msg("after the import")).outcome == "continued"
    assert reads == [], "the import kept no rules' state"
    w.close()


def test_an_entrys_path_is_read_in_bulk_along_the_log(make_store, monkeypatch):
    """``Session.ancestry`` (what ``diff --session`` walks): an own entry's path read through
    a few bulk reads of the envelopes along the log order, never an envelope at a time, and
    the path :meth:`Store.ancestry` walks one envelope at a time, over branches, a root
    of a second tree, and a fork's own entries down to its prefix (read once, kept)."""
    st = make_store()
    a, ids = chain(st, "a", n=300)

    def line(first: str | None, n: int, what: str) -> list[str]:
        out: list[str] = []
        for i in range(n):
            out.append(a.append(msg(f"{what} {i}", parent=out[-1] if out else first)).id)
        return out

    side = line(ids[100], 2, "side")
    on = line(ids[-1], 40, "main again")
    second = line(None, 2, "second root")
    a.commit()
    f = st.fork("a", ids[200], session_id="f")
    fids = [f.append(msg(f"fork {i}")).id for i in range(50)]
    f.commit()
    wanted = {x: st.ancestry(x) for x in (on[-1], side[-1], ids[0], second[-1], ids[150], fids[-1], fids[0], ids[199])}
    assert wanted[on[-1]] == [*ids, *on] and wanted[side[-1]] == [*ids[:101], *side]
    assert wanted[fids[-1]] == [*ids[:201], *fids]
    f.prefix  # noqa: B018  # (the fork's prefix read, once, as a fork's open may)
    reads = count_entry_reads(monkeypatch)
    bulk: list[int] = []
    many = type(st.objects).get_many

    def get_many(self, space, names):  # type: ignore[no-untyped-def]
        bulk.append(len(names))
        return many(self, space, names)

    monkeypatch.setattr(type(st.objects), "get_many", get_many)
    for x, path in wanted.items():
        assert (f if x in fids or x == ids[199] else a).ancestry(x) == path, x
    assert reads == [], "an envelope read one at a time"
    assert len(bulk) <= 30 and sum(bulk) < 1000, bulk


def test_a_session_with_no_kept_state_is_read_in_bulk(make_store, monkeypatch):
    """A session whose rules' state and summary are gone (an index lost; an import whose
    verify pass did not end at the head) is read through :meth:`Store.entries`, a chunk of entries per bulk
    read, never one entry at a time, and judges appends as before."""
    st = make_store()
    s, ids = chain(st, n=6)
    s.close()
    st.close()
    calls: list[int] = []
    many = Store.entries

    def entries(self: Store, entry_ids):
        if entry_ids:  # (a session with no base asks for its empty prefix)
            calls.append(len(entry_ids))
        yield from many(self, entry_ids)

    alone: list[str] = []
    one = Store.entry
    monkeypatch.setattr(Store, "entries", entries)
    monkeypatch.setattr(Store, "entry", lambda self, eid: alone.append(eid) or one(self, eid))
    w = make_store.reopen().session("s1")
    w._rule_state = None  # as if none was kept
    w._builder = None
    w._summary_base = None
    r = w.append(msg("x", parent=ids[2]))
    assert r.outcome == "branched" and calls == [6], calls
    assert w.summary().entries == 7 and calls == [6, 7]
    assert len(alone) <= 1, alone  # (the parent an append names, at most)
    w.close()


def st_summary_entries(make_store: StoreFactory, sid: str) -> int:
    ro = make_store.reopen(readonly=True)
    try:
        return ro.summary(sid).entries
    finally:
        ro.close()


def test_append_raises_an_earlier_header_format(make_store):
    """RFC 0002 "Sessions": a writer of a later minor raises the header's ``format``,
    durably, before its append is accepted; nothing else of the header changes."""
    st = make_store()
    old = "agentsession/0.13"
    s = st.create(Header.new("s1", format=old))
    before = st.header("s1").data
    assert before["format"] == old
    s.append(msg("x"))
    after = st.header("s1").data
    assert after["format"] != old and {k: v for k, v in after.items() if k != "format"} == {
        k: v for k, v in before.items() if k != "format"
    }
    st.close()
    assert make_store.reopen(readonly=True).header("s1").data == after


def test_unresolved_leaf_target_reported(make_store):
    """RFC 0002 "Head": a label naming an entry the store cannot resolve is accepted and
    the reference reported."""
    st = make_store()
    s, ids = chain(st, n=1)
    r = s.append(leaf(UNHELD, ids[0]))
    assert r.outcome == "head-not-moved" and UNHELD in r.unresolved


def test_reader_beside_writer_sees_working_state(make_store):
    """RFC 0002 "Working state and commits": working state moves the head as any append
    does, and a reader of the session (another handle) sees it before it is committed."""
    st = make_store(sync="never")
    s, ids = chain(st, n=2)
    other = make_store.reopen(readonly=True)
    snap = other.read("s1")
    assert snap.log_order == ids and snap.head == ids[-1]
    assert other.export("s1") == st.export("s1") == s.projection()
    snap.close()


# =====================================================================================
# 2. Refusals, their codes, and a store left unchanged (RFC 0002 "Sessions", "Append",
#    "Head", "Exchange"; codes as RFC 0003 "Errors" names them)
# =====================================================================================


def test_refuse_parent_not_held(make_store):
    """RFC 0002 "Append": the store must hold the parent."""
    st = make_store()
    s, ids = chain(st, n=2)
    with unchanged(st, s), pytest.raises(AppendRefusedError) as ei:
        s.append(msg("orphan", parent=UNHELD))
    refused(ei, "no_entry", "parent")


def test_refuse_parent_held_by_another_session(make_store):
    """RFC 0002 "Sessions": an own entry hangs from the base or another own entry of this
    session; an entry of another session is not held by this one."""
    st = make_store()
    a, ids = chain(st, "a", n=2)
    b, _ = chain(st, "b", n=1)
    with unchanged(st, a, b), pytest.raises(AppendRefusedError) as ei:
        b.append(msg("across", parent=ids[0]))
    refused(ei, "no_entry", "parent")


def test_refuse_parent_on_prefix_above_base(make_store):
    """RFC 0002 "Sessions": branching above the base is a new session, not an append."""
    st = make_store()
    a, ids, f = fork_of(st, n=3, base_index=1)
    with unchanged(st, a, f), pytest.raises(AppendRefusedError) as ei:
        f.append(msg("above", parent=ids[0]))
    refused(ei, "base_rule", "base")


def test_refuse_null_parent_in_fork(make_store):
    """RFC 0002 "Append": a session with a base refuses a null parent."""
    st = make_store()
    a, ids, f = fork_of(st)
    with unchanged(st, a, f), pytest.raises(AppendRefusedError) as ei:
        f.append(msg("root", parent=None))
    refused(ei, "base_rule", "base")


@pytest.mark.parametrize("label", [LEAF_LABEL, "bookmark"])
def test_refuse_synthetic_label(make_store, label):
    """RFC 0002 "Head": a ``label`` carrying ``synthetic`` is a projection's marker; refused."""
    st = make_store()
    s, ids = chain(st, n=2)
    entry = {"type": "label", "label": label, "target": ids[0], "parent": ids[1], "ts": ts(), "synthetic": True}
    with unchanged(st, s), pytest.raises(AppendRefusedError) as ei:
        s.append(entry)
    refused(ei, "synthetic", "synthetic")
    assert STORE_ONLY["synthetic"] in str(ei.value)  # the rule's one wording, as `rules` lists it


def test_refuse_stated_id_that_differs(make_store):
    """RFC 0002 "Entries" / RFC 0001: a stated id must be the entry's hash."""
    st = make_store()
    s, ids = chain(st, n=1)
    with unchanged(st, s), pytest.raises(AppendRefusedError) as ei:
        s.append(msg("x", id=UNHELD))
    refused(ei, "bad_entry", "hash")


def test_refuse_id_not_sha256(make_store):
    """RFC 0001: an id is ``sha256:`` and the hex digest; another algorithm is refused."""
    st = make_store()
    s, ids = chain(st, n=1)
    with unchanged(st, s), pytest.raises(AppendRefusedError) as ei:
        s.append(msg("x", id="md5:" + "0" * 32))
    refused(ei, "bad_entry", "id")


@pytest.mark.parametrize("bad_ts", ["2026-10-05", "2026-10-05T12:00:00+00:00", "2026-10-05T12:00:00.500Z", 12])
def test_refuse_bad_ts(make_store, bad_ts):
    """RFC 0001: ``ts`` in its one admitted spelling; anything else is refused."""
    st = make_store()
    s, ids = chain(st, n=1)
    with unchanged(st, s), pytest.raises(AppendRefusedError) as ei:
        s.append(msg("x", ts=bad_ts))
    refused(ei, "bad_entry", "ts")


@pytest.mark.parametrize("content", ["sha256:" + "1" * 64, {"nested": True}, []], ids=["hash", "object", "list"])
def test_refuse_reserved_member_in_body(make_store, content):
    """RFC 0001 "Entry hash": a body may not carry ``content`` (the envelope's name for
    the body's hash) at top level, whatever its value."""
    st = make_store()
    s, ids = chain(st, n=1)
    with unchanged(st, s), pytest.raises(AppendRefusedError) as ei:
        s.append({"type": "x:note", "ts": ts(), "content": content})
    refused(ei, "bad_entry", "reserved")


@pytest.mark.parametrize(
    "value", [2**53 + 1, -(2**53 + 1), "\ud800", {"a\udc00": 1}, float("inf"), float("nan")], ids=repr
)
def test_refuse_non_i_json_value(make_store, value):
    """RFC 0001 "Entry hash": every hashed member is I-JSON: a whole number a double
    does not hold (2^53 + 1), a lone surrogate (in a value or a name), a non-finite
    number are refused."""
    st = make_store()
    s, ids = chain(st, n=1)
    with unchanged(st, s), pytest.raises(AppendRefusedError) as ei:
        s.append({"type": "x:note", "ts": ts(), "value": value})
    refused(ei, "bad_entry", "ijson")


@pytest.mark.parametrize("type_", ["note", "Item"])
def test_refuse_unknown_unnamespaced_type(make_store, type_):
    """RFC 0001: an entry type is a core type or namespaced (``ns:type``). (An entry of
    type ``session``, a second header, is refused too: see the rule test below.)"""
    st = make_store()
    s, ids = chain(st, n=1)
    with unchanged(st, s), pytest.raises(AppendRefusedError) as ei:
        s.append({"type": type_, "ts": ts(), "text": "x"})
    refused(ei, "bad_entry", "type")
    assert s.append({"type": f"x:{type_}", "ts": ts(), "text": "x"}).outcome == "continued"


def _mirror(st: Store, sid: str = "s1"):
    """A session this store holds as a mirror (imported without record=True); its ids."""
    s, ids = chain(st, sid, n=2)
    data = st.export(sid)
    st.delete(sid)
    m = st.import_bytes(data)
    assert m.mark == "mirror"
    return m, ids


def test_refuse_local_append_on_mirror(make_store):
    """RFC 0002 "Exchange", one store of record: a mirror refuses a local append (and a
    prepared batch) and a local head move."""
    st = make_store()
    m, ids = _mirror(st)
    with unchanged(st, m):
        with pytest.raises(MirrorError) as ei:
            m.append(msg("x"))
        refused(ei, "mirror")
        with pytest.raises(MirrorError) as ei:
            m.prepare([msg("x")])
        refused(ei, "mirror")
        with pytest.raises(MirrorError) as ei:
            m.set_head(ids[0], expected=ids[1])
        refused(ei, "mirror")


def test_refuse_writes_on_read_only_store(make_store):
    """A store opened read-only takes no hold and writes nothing: every write is
    refused with ``read_only``."""
    st = make_store()
    s, ids = chain(st, n=2)
    data = st.export("s1")
    Refs(st).update("chat/x", "s1", expected=None)
    s.close()
    ro = make_store.reopen(readonly=True)
    snap = ro.session("s1")  # a snapshot on a read-only store
    attempts = {
        "create": lambda: ro.create(Header.new("s2")),
        "append": lambda: snap.append(msg("x")),
        "prepare": lambda: snap.prepare([msg("x")]),
        "set_head": lambda: snap.set_head(ids[0], expected=ids[1]),
        "set_mark": lambda: snap.set_mark("mirror"),
        "delete": lambda: ro.delete("s1"),
        "import": lambda: ro.import_bytes(data.replace(b'"id":"s1"', b'"id":"s9"', 1)),
        "put_blob": lambda: ro.put_blob(b"blob"),
        "ref update": lambda: Refs(ro).update("chat/y", "s1", expected=None),
        "ref delete": lambda: Refs(ro).delete("chat/x", expected="s1"),
    }
    for what, attempt in attempts.items():
        with unchanged(ro), pytest.raises(ReadOnlyError) as ei:
            attempt()
        assert ei.value.code == "read_only", what
    assert Refs(ro).get("chat/x").session == "s1"


def test_refuse_second_writer_of_a_session(make_store):
    """RFC 0002 "Append": a store may hold a session for one writer at a time; a second
    writer (another store handle on the same store) is refused at once, and can write
    once the first lets go."""
    st = make_store()
    s, ids = chain(st, n=1)
    other = make_store.reopen()
    with unchanged(st, s):
        with pytest.raises(SessionLockedError) as ei:
            other.session("s1")
        refused(ei, "session_locked")
        with pytest.raises(SessionLockedError) as ei:
            other.delete("s1")
        refused(ei, "session_locked")
    s.close()
    s2 = other.session("s1")
    assert s2.append(msg("second")).outcome == "continued"


def test_refuse_create_of_existing_id(make_store):
    """RFC 0002 "A log per session": creation fails if the id is held."""
    st = make_store()
    s, ids = chain(st, n=1)
    with unchanged(st, s), pytest.raises(SessionExistsError) as ei:
        st.create(Header.new("s1", created_at=TS0))
    refused(ei, "session_exists")
    assert st.header("s1").data["created_at"] != TS0


def test_refuse_open_of_missing_session(make_store):
    """A session the store does not hold: ``no_session`` for open, read, header, delete."""
    st = make_store()
    chain(st, n=1)
    for attempt in (lambda: st.session("nope"), lambda: st.read("nope"), lambda: st.header("nope"),
                    lambda: st.delete("nope"), lambda: st.export("nope")):
        with unchanged(st), pytest.raises(NoSuchSessionError) as ei:
            attempt()
        refused(ei, "no_session")


def test_refuse_bad_session_id(make_store):
    """A session id is 1 to 200 of ``[A-Za-z0-9._-]``, not ``.`` or ``..``."""
    st = make_store()
    for sid in ("../x", "a/b", ".", "..", "x" * 201, "a b"):
        with unchanged(st), pytest.raises(BadNameError) as ei:
            st.create(Header.new(sid))
        refused(ei, "bad_name")
    with unchanged(st), pytest.raises(AgentSessionError):
        st.create(Header.new(""))


def test_create_as_mirror(make_store):
    """RFC 0002 "Exchange": a created session is the record unless created otherwise."""
    st = make_store()
    m = st.create(Header.new("m"), record=False)
    assert m.mark == "mirror"
    with pytest.raises(MirrorError):
        m.append(msg("x"))
    assert st.create(Header.new("r")).mark == "record"


def _line_problem_codes(entry: dict) -> set[str]:
    """The codes ``verify`` (the reader) reports for the line ``entry`` in a file."""
    header = Header.new("v").canonical_line()
    line = json.dumps(entry, ensure_ascii=True).encode() + b"\n"
    sf = read_session_bytes(header + line)
    return {p.code for p in sf.problems if p.line == 2}


_BAD_LINES = {
    "ts": {"type": "x:n", "parent": None, "ts": "2026-10-05", "id": UNHELD},
    "reserved": {"type": "x:n", "parent": None, "ts": TS0, "content": "x", "id": UNHELD},
    "ijson": {"type": "x:n", "parent": None, "ts": TS0, "v": 2**53 + 1, "id": UNHELD},
    "type": {"type": "note", "parent": None, "ts": TS0, "id": UNHELD},
    "hash": {"type": "x:n", "parent": None, "ts": TS0, "id": UNHELD},
    "md5-id": {"type": "x:n", "parent": None, "ts": TS0, "id": "md5:" + "0" * 32},
    "synthetic": {"type": "label", "label": LEAF_LABEL, "target": None, "synthetic": True, "parent": None, "ts": TS0},
    "bad-hex-id": {"type": "x:n", "parent": None, "ts": TS0, "id": "sha256:" + "A" * 64},
    "session-type": {"type": "session", "parent": None, "ts": TS0, "id": UNHELD},
}


@pytest.mark.parametrize("entry", list(_BAD_LINES.values()), ids=list(_BAD_LINES))
def test_refusal_rule_is_the_code_verify_reports(make_store, entry):
    """errors.AppendRefusedError: ``rule`` is the code ``verify`` reports for the same
    bytes, so a caller can match an append's refusal against a file's problems. (The
    synthetic marker is no problem in a file, where it belongs: there, only the store
    refuses it.)"""
    st = make_store()
    s = st.create(Header.new("s1"))
    with unchanged(st, s), pytest.raises(AppendRefusedError) as ei:
        s.append(dict(entry))
    codes = _line_problem_codes(entry)
    if ei.value.rule == "synthetic":
        assert "synthetic" not in codes
        return
    assert ei.value.rule in codes, (ei.value.rule, codes)


def test_open_of_a_store_never_made_is_refused(make_store, request):
    """``open_store(url, create=False)`` opens the store the URL names; ``create=True``
    makes one where there is none. Without it, a URL naming no store is refused (the
    file backend: ``layout``), rather than a new empty store handed back as if it were
    the one meant."""
    url = make_store.url("never-made")
    with pytest.raises(AgentSessionError):
        open_store(url)
    with pytest.raises(AgentSessionError):
        open_store(url, readonly=True)


# =====================================================================================
# 3. Prepare / commit (one step: RFC 0002 "Durability and recovery", a single point
#    of acceptance; Session.prepare's docstring)
# =====================================================================================


def _batch_entries(parent: str | None, n: int = 3):
    """n entries, each hanging from the one before (the first from ``parent``)."""
    out = []
    for i in range(n):
        e = make_entry("item", parent, ts=ts(), item={"type": "message", "role": "user", "content": f"batch {i}"})
        out.append(e)
        parent = e.id
    return out


def test_prepare_writes_nothing_and_commit_shows_all_at_once(make_store):
    """Nothing of a prepared batch is visible before commit (to the writer's own state,
    to another reader, in the object store); its commit shows every entry at once."""
    st = make_store()
    s, ids = chain(st, n=1)
    entries = _batch_entries(ids[0])
    reader = make_store.reopen(readonly=True)
    before = fingerprint(reader)
    with unchanged(st, s):
        batch = s.prepare(entries)
        assert len(batch) == 3
        assert fingerprint(reader) == before
        for e in entries:
            with pytest.raises(NoSuchObjectError):
                st.cat_object(e.id)
    results = batch.commit()
    assert [r.outcome for r in results] == ["continued"] * 3
    assert [r.id for r in results] == [e.id for e in entries]
    assert [r.seq for r in results] == [2, 3, 4]
    assert s.head == entries[-1].id and s.log_order == ids + [e.id for e in entries]
    snap = reader.read("s1")
    assert snap.log_order == ids + [e.id for e in entries] and snap.head == entries[-1].id
    snap.close()
    assert reader.export("s1") == st.export("s1")


def test_prepare_defaults_parents_along_the_batch(make_store):
    """Entries that leave ``parent`` out hang from the head as the batch leaves it."""
    st = make_store()
    s, ids = chain(st, n=1)
    results = s.prepare([msg("p1"), msg("p2"), msg("p3")]).commit()
    assert [st.entry(r.id).parent for r in results] == [ids[0], results[0].id, results[1].id]
    assert s.head == results[-1].id


def test_prepare_discard_leaves_nothing(make_store):
    """A discarded batch is as if it had never been prepared, and cannot be committed."""
    st = make_store()
    s, ids = chain(st, n=1)
    entries = _batch_entries(ids[0])
    with unchanged(st, s):
        batch = s.prepare(entries)
        batch.discard()
        with pytest.raises(StoreError):
            batch.commit()
    r = s.append(msg("after"))
    assert r.outcome == "continued" and r.seq == 2


def test_prepare_refused_entry_refuses_the_whole_batch(make_store):
    """One refused entry in a batch refuses the batch: nothing of it is written."""
    st = make_store()
    s, ids = chain(st, n=1)
    good = _batch_entries(ids[0], 2)
    bad = msg("orphan", parent=UNHELD)
    with unchanged(st, s), pytest.raises(AppendRefusedError) as ei:
        s.prepare([good[0], bad, good[1]])
    refused(ei, "no_entry", "parent")
    for e in good:
        assert e.id not in s.own
    assert s.append(msg("after")).seq == 2


@pytest.mark.parametrize("sync, durable_entry", [
    ("responses", {"type": "response", "status": "completed"}),
    ("never", {"type": "custom", "ns": "test", "data": "go"}),  # a type the header names in records
])
def test_prepare_batch_with_a_durable_entry_commits_all(make_store, sync, durable_entry):
    """A batch is one write: when any of its entries must be committed, all are."""
    st = make_store(sync=sync)
    s, ids = chain(st, n=1, records=["custom"])
    results = s.prepare([msg("a"), dict(durable_entry, ts=ts()), msg("b")]).commit()
    assert all(r.durable for r in results)
    assert all(committed_in_log(s, r.id) for r in results + [s.append(st.entry(ids[0]))])


def test_prepare_lazy_batch_and_durable_override(make_store):
    """Under ``never`` a batch of plain entries is not committed, unless the batch (at
    prepare or at commit) asks to be."""
    st = make_store(sync="never")
    s, ids = chain(st, n=1)
    lazy = s.prepare([msg("a"), msg("b")]).commit()
    assert not any(r.durable for r in lazy) and not any(committed_in_log(s, r.id) for r in lazy)
    forced = s.prepare([msg("c")], durable=True).commit()
    assert forced[0].durable and committed_in_log(s, forced[0].id)
    assert all(committed_in_log(s, r.id) for r in lazy)  # a commit covers the log so far
    at_commit = s.prepare([msg("d")]).commit(durable=True)
    assert at_commit[0].durable and committed_in_log(s, at_commit[0].id)


@pytest.mark.parametrize("write", ["append", "prepare", "set_head", "commit"])
def test_prepare_stale_batch_cannot_commit(make_store, write):
    """A batch prepared before the session was written (or another batch prepared) is
    stale: its commit is refused and writes nothing."""
    st = make_store(sync="never")
    s, ids = chain(st, n=2)
    batch = s.prepare(_batch_entries(ids[1]))
    if write == "append":
        s.append(msg("meanwhile"))
    elif write == "prepare":
        s.prepare([msg("other batch")])
    elif write == "set_head":
        s.set_head(ids[0], expected=ids[1])
    else:
        s.commit()
    with unchanged(st, s), pytest.raises(StoreError):
        batch.commit()
    assert not any(r.id in s.own for r in batch.results)


def test_prepare_batch_no_op_and_repeat_within_batch(make_store):
    """A batch entry the log holds, or that the batch holds already, is a no-op."""
    st = make_store()
    s, ids = chain(st, n=1)
    e = _batch_entries(ids[0], 1)[0]
    results = s.prepare([st.entry(ids[0]), e, e]).commit()
    assert [r.outcome for r in results] == ["no-op", "continued", "no-op"]
    assert [r.seq for r in results] == [1, 2, 2]
    assert s.log_order == ids + [e.id]


# =====================================================================================
# 4. Head compare-and-swap (RFC 0002 "Head", "Durability": a durable head move)
# =====================================================================================


def test_set_head_moves_with_right_expectation(make_store):
    """RFC 0002 "Head": moving the head back is how a session branches back; the next
    append hangs from it."""
    st = make_store()
    s, ids = chain(st, n=3)
    s.set_head(ids[0], expected=ids[2])
    assert s.head == ids[0]
    r = s.append(msg("new child"))
    assert r.outcome == "continued" and st.entry(r.id).parent == ids[0]
    assert s.log_order == ids + [r.id]  # the old path stays as an abandoned branch


def test_set_head_wrong_expectation_moves_nothing(make_store):
    """RFC 0002 "Head": the compare-and-swap fails if the head is not the expected one."""
    st = make_store()
    s, ids = chain(st, n=3)
    for expected in (ids[0], None, UNHELD):
        with unchanged(st, s), pytest.raises(HeadMovedError) as ei:
            s.set_head(ids[1], expected=expected)
        refused(ei, "head_moved")
    assert s.head == ids[2]


def test_set_head_refuses_a_leaf_label(make_store):
    """RFC 0002 "Head": the head never rests on a ``leaf`` label."""
    st = make_store()
    s, ids = chain(st, n=2)
    label = s.append(leaf(ids[1], ids[1])).id
    with unchanged(st, s), pytest.raises(AppendRefusedError) as ei:
        s.set_head(label, expected=ids[1])
    refused(ei, "head_target")


@pytest.mark.parametrize("target", ["unheld", "prefix", "other-session"])
def test_set_head_refuses_target_not_base_or_own(make_store, target):
    """RFC 0002 "Head": the target is the base or an own entry; RFC 0003: ``no_entry``."""
    st = make_store()
    a, ids, f = fork_of(st, n=3, base_index=1)
    own = f.append(msg("own")).id
    t = {"unheld": UNHELD, "prefix": ids[0], "other-session": ids[2]}[target]
    with unchanged(st, a, f), pytest.raises(AppendRefusedError) as ei:
        f.set_head(t, expected=own)
    refused(ei, "no_entry")


def test_set_head_refuses_none_in_fork_and_non_id(make_store):
    """RFC 0002 "Head": "no head" only without a base; a target is an entry id."""
    st = make_store()
    a, ids, f = fork_of(st)
    own = f.append(msg("own")).id
    for target in (None, "not-an-id"):
        with unchanged(st, a, f), pytest.raises(AppendRefusedError) as ei:
            f.set_head(target, expected=own)
        refused(ei, "head_target")
    f.set_head(ids[1], expected=own)  # the base may hold it
    assert f.head == ids[1]


def test_set_head_none_and_back_in_baseless_session(make_store):
    """RFC 0002 "Head": "no head" is a valid expected value and target without a base."""
    st = make_store()
    s, ids = chain(st, n=2)
    s.set_head(None, expected=ids[1])
    assert s.head is None
    s.set_head(ids[0], expected=None)
    assert s.head == ids[0]


def test_set_head_is_durable(make_store):
    """RFC 0002 "Durability": a head move by compare-and-swap is committed before it
    returns (under ``never`` too), and survives close and reopen."""
    st = make_store(sync="never")
    s, ids = chain(st, n=3)
    s.set_head(ids[0], expected=ids[2])
    assert committed_in_log(s, ids[2])  # the commit covers the lazy appends before it
    assert domain_records(s)[-1] == {"op": "commit"}
    st.close()
    st2 = make_store.reopen()
    s2 = st2.session("s1")
    assert s2.head == ids[0] and s2.log_order == ids


# =====================================================================================
# 5. Forks (RFC 0002 "Sessions", "Projection to JSONL")
# =====================================================================================


def test_fork_head_prefix_and_projection(make_store):
    """RFC 0002 "Sessions": a fork's head starts at its base; its prefix is root..base,
    nothing copied; its projection carries the prefix and reads back whole."""
    st = make_store()
    a, ids, f = fork_of(st, n=3, base_index=1)
    assert f.base == ids[1] == f.head
    assert f.prefix == ids[:2] and len(f) == 0 and f.log_order == []
    assert [e.id for e in f.prefix_entries()] == ids[:2]
    assert [e.id for e in st.path_to(ids[1])] == ids[:2]
    sf = read_session_bytes(st.export("f"))
    assert not sf.problems
    assert sf.header.base == ids[1] and [e.id for e in sf.entries] == ids[:2]
    own = f.append(msg("own"))
    assert own.outcome == "continued" and st.entry(own.id).parent == ids[1]
    sf = read_session_bytes(st.export("f"))
    assert [e.id for e in sf.entries] == ids[:2] + [own.id]
    assert sf.tree.resume_leaf() == own.id


def test_fork_of_a_fork_and_base_on_a_prefix(make_store):
    """RFC 0002 "Sessions": a fork's base may be another fork's own entry (its prefix is
    the whole path) or an entry on another session's prefix."""
    st = make_store()
    a, ids, f = fork_of(st, n=3, base_index=1)
    rf = f.append(msg("f1")).id
    g = st.create(Header.new("g", base=rf))
    assert g.prefix == ids[:2] + [rf] and g.head == rf
    h = st.create(Header.new("h", base=ids[0]))
    assert h.prefix == [ids[0]]


def test_fork_survives_reopen(make_store):
    """A fork's base, head and prefix are what its own log says, after reopen too."""
    st = make_store(sync="never")
    a, ids, f = fork_of(st)
    r = f.append(msg("own"))
    st.close()
    ro = make_store.reopen(readonly=True)
    g = ro.read("f")
    assert g.base == ids[1] and g.prefix == ids[:2] and g.head == r.id and g.log_order == [r.id]
    g.close()


def test_fork_base_not_held_refused(make_store):
    """RFC 0002 "Sessions": a store refuses a fork whose base it does not hold."""
    st = make_store()
    chain(st, "a", n=1)
    with unchanged(st), pytest.raises(StoreError):
        st.create(Header.new("f", base=UNHELD))
    assert "f" not in st


def test_fork_base_a_leaf_label_refused(make_store):
    """RFC 0002 "Sessions": the base is the first head, so never a ``leaf`` label."""
    st = make_store()
    a, ids = chain(st, "a", n=2)
    label = a.append(leaf(ids[0], ids[1])).id
    with unchanged(st, a), pytest.raises(StoreError):
        st.create(Header.new("f", base=label))
    assert "f" not in st


def test_fork_media_mismatch_refused(make_store):
    """RFC 0002 "Sessions": a fork's media equals that of the session owning its base."""
    st = make_store()
    a, ids = chain(st, "a", n=1, media="sidecar")
    for media in (None, "inline"):
        with unchanged(st, a), pytest.raises(StoreError):
            st.create(Header.new("f", base=ids[0], media=media))
    assert st.create(Header.new("f", base=ids[0], media="sidecar")).head == ids[0]


@pytest.mark.parametrize("case", ["unheld", "leaf", "media"])
def test_fork_refusal_codes(make_store, case):
    """RFC 0003 "Errors": a base the store does not hold is ``no_entry``; a base that is a
    ``leaf`` label, or a fork whose media differs from the origin's, is ``bad_base``
    (errors.py: where RFC 0003 names a code for a refusal, the code is that one)."""
    st = make_store()
    a, ids = chain(st, "a", n=2, media="sidecar")
    if case == "unheld":
        header, code = Header.new("f", base=UNHELD, media="sidecar"), "no_entry"
    elif case == "leaf":
        label = a.append(leaf(ids[0], ids[1])).id
        header, code = Header.new("f", base=label, media="sidecar"), "bad_base"
    else:
        header, code = Header.new("f", base=ids[0], media="inline"), "bad_base"
    with pytest.raises(AgentSessionError) as ei:
        st.create(header)
    refused(ei, code)


def test_fork_own_entries_hang_from_base(make_store):
    """RFC 0002 "Sessions": a fork's own entries hang from its base or each other; the
    origin's entries below the base (not on the prefix) are not the fork's."""
    st = make_store()
    a, ids, f = fork_of(st, n=3, base_index=1)
    r1 = f.append(msg("f1", parent=ids[1]))
    r2 = f.append(msg("f2", parent=r1.id))
    r3 = f.append(msg("f3", parent=ids[1]))
    assert [r.outcome for r in (r1, r2, r3)] == ["continued", "continued", "branched"]
    with unchanged(st, a, f), pytest.raises(AppendRefusedError) as ei:
        f.append(msg("below", parent=ids[2]))
    refused(ei, "no_entry", "parent")


def test_fork_commits_origin_through_base_first(make_store):
    """RFC 0002 "Sessions": a store commits the log that holds the base, through the base,
    before it creates the fork."""
    st = make_store(sync="never")
    a, ids = chain(st, "a", n=3)
    assert not committed_in_log(a, ids[1])
    f = st.create(Header.new("f", base=ids[1]))
    assert committed_in_log(a, ids[1]) and f.head == ids[1]


def test_fork_at_entry_another_writer_has_not_committed_is_refused(make_store):
    """RFC 0002 "Sessions": a fork's recovery reads only its own log, so a base still in
    another writer's working state (which a crash could take) is not forked from."""
    st = make_store(sync="never")
    a, ids = chain(st, "a", n=2)
    other = make_store.reopen()
    with unchanged(other), pytest.raises(StoreError):
        other.create(Header.new("f", base=ids[1]))
    assert "f" not in other
    a.commit()
    f = other.create(Header.new("f", base=ids[1]))
    assert f.head == ids[1] and f.prefix == ids


def test_fork_from_a_prefix_after_origin_deleted(make_store):
    """RFC 0002 "Deletion and retention": a prefix outlives its origin: an entry on a
    fork's prefix is still held, and may be a new fork's base."""
    st = make_store()
    a, ids, f = fork_of(st, n=3, base_index=1)
    st.delete("a")
    g = st.create(Header.new("g", base=ids[0]))
    assert g.prefix == [ids[0]] and g.head == ids[0]
    assert [e.id for e in read_session_bytes(st.export("g")).entries] == [ids[0]]
    with pytest.raises(StoreError):  # not on any prefix or log now
        st.create(Header.new("h", base=ids[2]))


# =====================================================================================
# 6. Projection and import round trips (RFC 0002 "Projection to JSONL")
# =====================================================================================


def _rich_session(st: Store, sid: str = "s1"):
    """A session with a branch, a genuine leaf label and a head that is not the last
    line: (session, ids)."""
    s, ids = chain(st, sid, n=3)
    b = s.append(msg("branch", parent=ids[0])).id
    lab = s.append(leaf(ids[1], ids[2])).id  # a genuine leaf label: head -> ids[1]
    assert s.head == ids[1]
    return s, ids + [b, lab]


@pytest.mark.parametrize("record", [False, True])
def test_export_import_round_trip(pair, record):
    """RFC 0002 "Projection to JSONL": export then import into a fresh store (of this
    backend or another) gives the same entries, log order and head, and an export of
    byte-identical lines; the import is a mirror unless declared the record."""
    src_f, dst_f = pair
    src, dst = src_f(), dst_f()
    s, ids = _rich_session(src)
    data = src.export("s1")
    m = dst.import_bytes(data, record=record)
    assert m.mark == ("record" if record else "mirror")
    assert m.head == s.head and m.log_order == s.log_order and m.leaf_labels == s.leaf_labels
    assert dst.export("s1") == data
    assert dst.header("s1").data == src.header("s1").data
    # the imported session behaves as the record or mirror it is; its log numbers its
    # own entries from 1, in file order
    assert [m.own[i] for i in m.log_order] == list(range(1, len(ids) + 1))
    if record:
        r = m.append(msg("more"))
        assert r.outcome == "continued" and r.seq == len(ids) + 1
    else:
        with pytest.raises(MirrorError):
            m.append(msg("more"))


def test_export_with_head_not_last_writes_and_import_discards_a_synthetic_marker(pair):
    """RFC 0002 "Projection to JSONL" step 4: a head the resume rule would not find is
    named by a synthetic ``leaf`` label carrying the head's ``ts``; an import takes the
    head from it and discards it; a second export is the same bytes."""
    src_f, dst_f = pair
    src, dst = src_f(), dst_f()
    s, ids = chain(src, n=3)
    s.set_head(ids[0], expected=ids[2])
    data = src.export("s1")
    sf = read_session_bytes(data)
    marker = sf.entries[-1]
    assert marker.type == "label" and marker.data.get("synthetic") is True
    assert marker.data["target"] == ids[0] and marker.parent == ids[2]
    assert marker.ts == src.entry(ids[0]).ts
    assert src.export("s1") == data  # byte-stable
    m = dst.import_bytes(data)
    assert m.head == ids[0] and m.log_order == ids and marker.id not in m.own
    assert dst.export("s1") == data


def test_export_no_marker_when_resume_rule_finds_head(make_store):
    """RFC 0002 "Projection to JSONL": no marker when the last own entry is the head."""
    st = make_store()
    s, ids = chain(st, n=2)
    sf = read_session_bytes(st.export("s1"))
    assert [e.id for e in sf.entries] == ids


def test_export_import_fork_round_trip(pair):
    """RFC 0002 "Projection to JSONL": a fork's projection carries its prefix, so it
    imports into a store that holds nothing of its origin, as the same fork."""
    src_f, dst_f = pair
    src, dst = src_f(), dst_f()
    a, ids, f = fork_of(src, n=3, base_index=1)
    own = [f.append(msg("f1")).id, f.append(msg("f2")).id]
    data = src.export("f")
    m = dst.import_bytes(data, record=True)
    assert m.base == ids[1] and m.prefix == ids[:2] and m.log_order == own and m.head == own[-1]
    assert dst.export("f") == data
    assert dst.list() == ["f"]


def test_export_import_fork_at_base_round_trip(pair):
    """A fork with no own entries, and one whose head went back to its base."""
    src_f, dst_f = pair
    src, dst = src_f(), dst_f()
    a, ids, f = fork_of(src)
    g = src.create(Header.new("g", base=ids[1]))
    own = g.append(msg("g1")).id
    g.set_head(ids[1], expected=own)
    for sid, head in (("f", ids[1]), ("g", ids[1])):
        data = src.export(sid)
        m = dst.import_bytes(data)
        assert m.head == head
        assert dst.export(sid) == data


def test_export_import_empty_session(pair):
    """A session with no entries yet projects to its header alone and imports back."""
    src_f, dst_f = pair
    src, dst = src_f(), dst_f()
    src.create(Header.new("s1"))
    data = src.export("s1")
    assert data.count(b"\n") == 1
    m = dst.import_bytes(data)
    assert m.head is None and m.log_order == []
    assert dst.export("s1") == data


def test_export_to_and_import_file_with_sidecar_media(pair, tmp_path):
    """RFC 0002 "Media", "Projection to JSONL" step 5: a sidecar session exports its blobs
    beside the file and an import brings them back, verified."""
    src_f, dst_f = pair
    src, dst = src_f(), dst_f()
    s = src.create(Header.new("s1", media="sidecar"))
    blob = src.put_blob(b"\x89PNG fake image bytes")
    r = s.append({"type": "item", "ts": ts(), "item": {"type": "message", "role": "user",
                  "content": [{"type": "input_image", "image_url": f"sidecar:{blob}"}]}})
    assert r.unresolved == []
    path = tmp_path / "out" / "s1.jsonl"
    path.parent.mkdir()
    src.export_to("s1", path)
    assert (path.parent / "s1" / blob[len("sha256:"):]).read_bytes() == b"\x89PNG fake image bytes"
    m = dst.import_file(path)
    assert m.log_order == [r.id] and dst.blob(blob) == b"\x89PNG fake image bytes"
    assert dst.export("s1") == path.read_bytes()


def test_import_of_existing_id_refused(make_store):
    """RFC 0002 "Projection to JSONL": a store holding a session with that id refuses."""
    st = make_store()
    s, ids = chain(st, n=2)
    data = st.export("s1")
    s.append(msg("later"))
    with unchanged(st, s), pytest.raises(SessionExistsError) as ei:
        st.import_bytes(data)
    refused(ei, "session_exists")


def test_import_of_file_failing_its_hash_refused(make_store):
    """RFC 0002 "Projection to JSONL": an importer verifies each line's hash and refuses
    a file in which one fails; nothing is created."""
    src = make_store("src")
    dst = make_store("dst")
    chain(src, n=3)
    data = src.export("s1")
    tampered = data.replace(b"s1 m1", b"s1 mX", 1)
    assert tampered != data
    with unchanged(dst), pytest.raises(AgentSessionError) as ei:
        dst.import_bytes(tampered)
    assert "hash" in {p.code for p in getattr(ei.value, "problems", [])}, str(ei.value)
    assert "s1" not in dst


def _marked_file(synthetic: object, child: bool) -> tuple[bytes, str]:
    """A baseless session file of two items and a ``leaf`` label naming the first,
    carrying ``synthetic`` as given, with an item hanging from the label when ``child``;
    and the label's id."""
    h = Header.new("marked")
    e1 = make_entry("item", None, ts="2026-10-05T12:00:00Z", item={"type": "message", "role": "user", "content": "one"})
    e2 = make_entry("item", e1.id, ts="2026-10-05T12:00:01Z", item={"type": "message", "role": "user", "content": "two"})
    lab = make_entry("label", e2.id, ts=e1.ts, label=LEAF_LABEL, target=e1.id, synthetic=synthetic)
    data = h.canonical_line() + e1.canonical_line() + e2.canonical_line() + lab.canonical_line()
    if child:
        data += make_entry("item", lab.id, ts="2026-10-05T12:00:03Z",
                           item={"type": "message", "role": "user", "content": "three"}).canonical_line()
    return data, lab.id


def _import_refused_as_synthetic(st, tmp_path, data: bytes, how: str):  # type: ignore[no-untyped-def]
    """Import ``data`` (as bytes, or from a file) and expect the ``synthetic`` refusal,
    the store left as it was and no session made; the refusal's ExceptionInfo."""
    path = tmp_path / "marked.jsonl"
    path.write_bytes(data)
    with unchanged(st), pytest.raises(AgentSessionError) as ei:
        st.import_bytes(data) if how == "bytes" else st.import_file(path)
    refused(ei, "synthetic")
    assert "marked" not in st
    return ei


@pytest.mark.parametrize("how", ["bytes", "file"])
def test_import_refuses_an_entry_hanging_from_a_synthetic_marker(make_store, tmp_path, how):
    """RFC 0002 "Projection to JSONL": an import discards a synthetic marker, which is no
    entry; so an entry the file hangs from it would name a parent the store does not hold
    ("Entries": a store MUST NOT accept one). Refused, nothing created. (It was taken:
    the child joined the log under a parent no store held, and its export read nowhere.)"""
    st = make_store()
    data, marker = _marked_file(True, child=True)
    ei = _import_refused_as_synthetic(st, tmp_path, data, how)
    assert short_id(marker) in str(ei.value)
    plain, _ = _marked_file(True, child=False)  # the marker as a projection writes it: discarded
    s = st.import_bytes(plain)
    assert len(s.log_order) == 2 and s.head == s.log_order[0]


@pytest.mark.parametrize("how", ["bytes", "file"])
@pytest.mark.parametrize("synthetic", [False, "yes"])
def test_import_refuses_a_label_carrying_synthetic_that_is_no_marker(make_store, tmp_path, how, synthetic):
    """RFC 0002 "Head": a store MUST refuse a ``label`` entry carrying ``synthetic``. A
    file's label carrying it other than as the projection's marker (``true``) is refused
    at import with the code an append and a push give, not held as an entry no append
    could have made and no push could carry."""
    st = make_store()
    data, _ = _marked_file(synthetic, child=False)
    ei = _import_refused_as_synthetic(st, tmp_path, data, how)
    assert STORE_ONLY["synthetic"] in str(ei.value)


def _item(parent: str | None, text: str, n: int):  # type: ignore[no-untyped-def]
    return make_entry("item", parent, ts=f"2026-10-05T13:00:{n:02d}Z", item={"type": "message", "role": "user",
                                                                            "content": text})


def _leaf_entry(parent: str | None, target: str | None, n: int):  # type: ignore[no-untyped-def]
    return make_entry("label", parent, ts=f"2026-10-05T13:00:{n:02d}Z", label=LEAF_LABEL, target=target)


def _head_file(case: str) -> tuple[bytes, str, str | None]:
    """A file whose resume rule lands on a ``leaf`` label (which no head may rest on), and
    that label's id and the head the store holds: its nearest ancestor that is not one
    (``own``, ``after-mark``), the base (``base``), or none in a baseless session (``root``)."""
    if case == "base":  # a fork's only own entry a label naming a prefix entry (not in force)
        p1 = _item(None, "p1", 1)
        p2 = _item(p1.id, "p2", 2)
        lab = _leaf_entry(p2.id, p1.id, 3)
        return Header.new("adj", base=p2.id).canonical_line() + b"".join(
            e.canonical_line() for e in (p1, p2, lab)), lab.id, p2.id
    if case == "root":  # a baseless session's only entry a label naming what the file lacks
        lab = _leaf_entry(None, UNHELD, 1)
        return Header.new("adj").canonical_line() + lab.canonical_line(), lab.id, None
    e1 = _item(None, "one", 1)
    e2 = _item(e1.id, "two", 2)
    if case == "own":  # the last line a label naming what the file lacks
        lab = _leaf_entry(e2.id, UNHELD, 3)
        entries = [e1, e2, lab]
        held = e2.id
    else:  # after-mark: a label in force names e1; the newest entry below e1 after it is a label naming nothing held
        mark = _leaf_entry(e2.id, e1.id, 3)
        lab = _leaf_entry(e1.id, UNHELD, 4)
        entries = [e1, e2, mark, lab]
        held = e1.id
    return Header.new("adj").canonical_line() + b"".join(e.canonical_line() for e in entries), lab.id, held


@pytest.mark.parametrize("how", ["bytes", "file"])
@pytest.mark.parametrize("case", ["own", "after-mark", "base", "root"])
def test_import_reports_the_head_it_holds_in_place_of_the_files(make_store, tmp_path, how, case):
    """RFC 0002 "Projection to JSONL": an import's head is what RFC 0001's resume rule
    gives, held to the head rule: when the rule names a ``leaf`` label the head is its
    nearest ancestor that is not one, the base when none lies above the base, no head in
    a baseless session with none, "and the store reports any of these". The imported
    session says so (``head_adjusted``: the entry the file's rule named, the head held,
    why); it held the same head silently before."""
    st = make_store()
    data, named, held = _head_file(case)
    path = tmp_path / "adj.jsonl"
    path.write_bytes(data)
    s = st.import_bytes(data) if how == "bytes" else st.import_file(path)
    assert s.head == held == read_session_bytes(data).leaf  # (what a reader of the file resumes at)
    adjusted = s.head_adjusted
    assert adjusted is not None
    assert (adjusted.named, adjusted.held, adjusted.why) == (named, held, "leaf_label")
    assert adjusted.as_dict() == {"named": named, "held": held, "why": "leaf_label", "message": adjusted.message}
    assert short_id(named) in adjusted.message
    assert (short_id(held) if held else "no head") in adjusted.message
    s.close()
    assert st.read("adj").head == held


@pytest.mark.parametrize("how", ["bytes", "file"])
@pytest.mark.parametrize("case", ["rich", "marker", "fork-at-base", "empty", "root-label"])
def test_import_reports_no_adjustment_when_it_holds_the_files_head(make_store, tmp_path, how, case):
    """An import that holds the head the file's rule names reports nothing: a genuine
    ``leaf`` label in force, a projection's marker, a fork with no own entries (the rule
    names the base, which a head may rest on), a header alone, a label naming the root
    of a baseless session."""
    src, dst = make_store("src"), make_store("dst")
    if case == "rich":
        s, _ = _rich_session(src)
    elif case == "marker":
        s, ids = chain(src, n=3)
        s.set_head(ids[0], expected=ids[2])
    elif case == "fork-at-base":
        _, _, s = fork_of(src)
    elif case == "empty":
        s = src.create(Header.new("s1"))
    else:
        s, ids = chain(src, n=2)
        s.append(leaf(None, ids[1]))
    data = src.export(s.id)
    path = tmp_path / "same.jsonl"
    path.write_bytes(data)
    m = dst.import_bytes(data) if how == "bytes" else dst.import_file(path)
    assert m.head == s.head
    assert m.head_adjusted is None


def test_import_of_redacted_file_refused(make_store):
    """RFC 0002 "Projection to JSONL": a header carrying ``redacted`` is refused."""
    src, dst = make_store("src"), make_store("dst")
    chain(src, n=1)
    data = src.export("s1")
    head, rest = data.split(b"\n", 1)
    redacted = head[:-1] + b',"redacted":true}\n' + rest
    with unchanged(dst), pytest.raises(AgentSessionError):
        dst.import_bytes(redacted)


def test_import_fork_with_held_base_of_other_media_refused(make_store):
    """RFC 0002 "Projection to JSONL": an import is held to a fork's media rule when the
    store holds a session whose own entries include the base."""
    src, dst = make_store("src"), make_store("dst")
    o = src.create(Header.new("o", media="sidecar"))
    base = o.append(msg("base")).id
    g = src.create(Header.new("g", base=base, media="sidecar"))
    g.append(msg("g own"))
    data = src.export("g")
    other_media = data.replace(b'"media":"sidecar"', b'"media":"inline"', 1)
    assert other_media != data
    dst.import_bytes(src.export("o"), record=True).close()
    with unchanged(dst), pytest.raises(AgentSessionError):
        dst.import_bytes(other_media)
    assert dst.import_bytes(data).base == base


def test_import_fork_with_format_earlier_than_the_base_owner_refused(make_store):
    """RFC 0002 "Sessions": a fork's header names a format no earlier than that of the
    session whose own entries include its base (its prefix was written under that one);
    an import is held to the checks a create and a push are ("Projection to JSONL"),
    with the code a create gives (``bad_base``)."""
    src, dst = make_store("src"), make_store("dst")
    o = src.create(Header.new("o"))
    base = o.append(msg("base")).id
    g = src.create(Header.new("g", base=base))
    g.append(msg("g own"))
    data = src.export("g")
    written = src.header("o").format
    assert written == src.header("g").format != "agentsession/0.5"
    earlier = data.replace(f'"format":"{written}"'.encode(), b'"format":"agentsession/0.5"', 1)
    assert earlier != data
    dst.import_bytes(src.export("o"), record=True).close()
    with unchanged(dst), pytest.raises(AgentSessionError) as ei:
        dst.import_bytes(earlier)
    refused(ei, "bad_base")
    assert "g" not in dst
    assert dst.import_bytes(data).base == base


def test_context_hash_agrees_across_stores_and_forks(pair):
    """RFC 0002 "Prefix caching": the context hash at an entry depends on the path to it
    alone: the same in an imported copy (of either backend), and a fork's at its base is
    its origin's there."""
    src_f, dst_f = pair
    src, dst = src_f(), dst_f()
    a, ids, f = fork_of(src, n=3, base_index=1)
    assert f.context_hash() == a.context_hash(ids[1]) != a.context_hash()
    own = f.append(msg("own")).id
    m = dst.import_bytes(src.export("f"))
    assert m.context_hash() == f.context_hash(own) and m.context_hash(ids[0]) == a.context_hash(ids[0])


# =====================================================================================
# 7. Refs (RFC 0002 refs, docs/refs.md; RFC 0003 "Refs" codes)
# =====================================================================================


@pytest.fixture
def refs_store(make_store):
    st = make_store()
    for sid in ("s1", "s2", "s3"):
        st.create(Header.new(sid)).close()
    return st


def test_ref_create_get_resolve(refs_store):
    refs = Refs(refs_store)
    u = refs.update("chat/slack/C1", "s1", expected=None)
    assert u.created and u.changed and (u.old, u.new) == (None, "s1")
    assert refs.get("chat/slack/C1").session == "s1"
    assert refs.resolve("chat/slack/C1") == "s1"
    assert refs.state(refs.get("chat/slack/C1")) == "ok"
    assert "chat/slack/C1" in refs and "chat/slack/C2" not in refs
    assert refs.names() == ["chat/slack/C1"] and refs.names("chat/") == ["chat/slack/C1"]
    again = refs.update("chat/slack/C1", "s1", expected="s1")
    assert not again.changed


def test_ref_compare_and_swap(refs_store):
    """A ref moves only from the expected session; a wrong expectation is ``ref_moved``
    carrying what it holds, and writes nothing."""
    refs = Refs(refs_store)
    refs.update("r", "s1", expected=None)
    u = refs.update("r", "s2", expected="s1")
    assert u.changed and (u.old, u.new) == ("s1", "s2")
    for expected in ("s1", None, "s3"):
        with unchanged(refs_store), pytest.raises(RefMovedError) as ei:
            refs.update("r", "s3", expected=expected)
        refused(ei, "ref_moved")
        assert ei.value.current == "s2"
    assert refs.resolve("r") == "s2"
    with pytest.raises(RefMovedError) as ei:
        refs.update("absent", "s1", expected="s1")
    assert ei.value.current is None


def test_ref_delete_with_expectation(refs_store):
    refs = Refs(refs_store)
    refs.update("r", "s1", expected=None)
    with pytest.raises(RefMovedError) as ei:
        refs.delete("r", expected="s2")
    refused(ei, "ref_moved")
    assert refs.get("r").session == "s1"
    u = refs.delete("r", expected="s1")
    assert u.deleted and refs.get("r") is None and refs.names() == []
    with pytest.raises(RefMovedError) as ei:
        refs.delete("r", expected="s1")
    assert ei.value.current is None
    with pytest.raises(NoSuchRefError) as ei:
        refs.resolve("r")
    refused(ei, "no_ref")


@pytest.mark.parametrize("name", ["", "/a", "a/", "a//b", ".", "a/..", "a.", "con", "a b", "é", "x" * 201])
def test_ref_name_rules(refs_store, name):
    refs = Refs(refs_store)
    with pytest.raises(BadRefNameError) as ei:
        refs.update(name, "s1", expected=None)
    refused(ei, "ref_name")
    assert refs.names() == []


@pytest.mark.parametrize("held, new", [("a", "a/b"), ("a/b", "a"), ("chat/x", "Chat/y"), ("chat", "CHAT")])
def test_ref_name_conflicts(refs_store, held, new):
    """A ref under a ref, and a name differing from a held one only in case, conflict."""
    refs = Refs(refs_store)
    refs.update(held, "s1", expected=None)
    with pytest.raises(RefConflictError) as ei:
        refs.update(new, "s2", expected=None)
    refused(ei, "ref_name")
    assert refs.names() == [held]


def test_ref_to_missing_session_refused(refs_store):
    refs = Refs(refs_store)
    with pytest.raises(NoSuchSessionError) as ei:
        refs.update("r", "nope", expected=None)
    refused(ei, "no_session")
    assert refs.names() == []


def test_ref_dangling_after_delete(refs_store):
    """A ref whose session was deleted is dangling: its state says so, and resolving it
    raises ``ref_dangling`` naming the session."""
    refs = Refs(refs_store)
    refs.update("r", "s1", expected=None)
    refs_store.delete("s1")
    ref = refs.get("r")
    assert ref.session == "s1" and refs.state(ref) == "dangling"
    with pytest.raises(DanglingRefError) as ei:
        refs.resolve("r")
    refused(ei, "ref_dangling")
    assert ei.value.session == "s1" and ei.value.state == "dangling"


def test_ref_replaced_after_delete_and_create(refs_store):
    """A ref set to a session deleted and created again under its id does not reach the
    new one: its state is ``replaced``."""
    refs = Refs(refs_store)
    refs.update("r", "s1", expected=None)
    refs_store.delete("s1")
    refs_store.create(Header.new("s1", created_at=TS0)).close()
    assert refs.state(refs.get("r")) == "replaced"
    with pytest.raises(DanglingRefError) as ei:
        refs.resolve("r")
    assert ei.value.state == "replaced"
    # re-adopted by deleting it and setting it again, or (docs/refs.md) by an ordinary
    # compare-and-swap to the same id, which writes the new incarnation's ident
    refs.delete("r", expected="s1")
    refs.update("r", "s1", expected=None)
    assert refs.resolve("r") == "s1"
    refs_store.delete("s1")
    refs_store.create(Header.new("s1", created_at="2026-10-05T11:30:00Z")).close()
    assert refs.state(refs.get("r")) == "replaced"
    u = refs.update("r", "s1", expected="s1")
    assert u.changed and refs.resolve("r") == "s1"


def test_refs_survive_reopen(make_store):
    st = make_store()
    st.create(Header.new("s1")).close()
    Refs(st).update("a/b", "s1", expected=None)
    st.close()
    ro = make_store.reopen(readonly=True)
    assert Refs(ro).resolve("a/b") == "s1" and Refs(ro).names() == ["a/b"]


def test_refs_are_store_wide_across_handles(make_store):
    """RFC 0002 refs: one set of names per store, seen by every handle, each change a
    compare-and-swap over all of them."""
    st = make_store()
    for sid in ("s1", "s2"):
        st.create(Header.new(sid)).close()
    other = make_store.reopen()
    Refs(st).update("chat/a", "s1", expected=None)
    assert Refs(other).resolve("chat/a") == "s1"
    with pytest.raises(RefMovedError) as ei:
        Refs(other).update("chat/a", "s2", expected=None)
    assert ei.value.current == "s1"
    with pytest.raises(RefConflictError):
        Refs(other).update("chat/a/b", "s2", expected=None)
    Refs(other).update("chat/a", "s2", expected="s1")
    assert Refs(st).resolve("chat/a") == "s2"



# =====================================================================================
# 8. Exchange between stores (RFC 0002 "Exchange between stores")
# =====================================================================================


def _snapshot_of(st: Store, sid: str):
    snap = st.read(sid)
    try:
        return snap.mark, snap.head, list(snap.log_order)
    finally:
        snap.close()


def test_push_creates_mirror_and_moves_head(remote_pair):
    """RFC 0002 "Exchange": a push to a store lacking the session creates it from the
    pushed header, admits the closure, and moves its head; it lands as a mirror."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s, ids = chain(a, n=3)
    r = ex.push(a, b_f.url("b"), "s1")
    assert r.created and r.entries == 3 and r.outcome == "fast-forward" and r.head_moved
    assert (r.head_before, r.head_after, r.mark) == (None, ids[-1], "mirror")
    assert _snapshot_of(b, "s1") == ("mirror", ids[-1], ids)
    assert b.export("s1") == a.export("s1")
    assert s.mark == "record"


def test_a_header_a_store_took_before_the_member_rule_still_moves_and_continues(remote_pair):
    """docs/rules.md "Header members": a session whose header a store took before the
    rule (created_at "yesterday", cwd null: written here as the old create wrote it)
    still pushes, fetches back, exports, imports and continues, its header kept byte for
    byte and each step warning (7b290e7, which refused it everywhere, failed each)."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    bad = Header(dict(Header.new("old").data, created_at="yesterday", cwd=None))
    try:
        s = a._create(a._defaulted_header(bad), own=[], head=None, record=True)
    except AgentSessionError:
        pytest.skip(f"{a_f.name}: no way to write a header but through the store's create, which makes it")
    s.append(msg("m0"))
    s.close()
    want = a.header("old").canonical_line()
    warned = ["created_at \"yesterday\"", "cwd null"]
    r = ex.push(a, b_f.url("b"), "old")
    assert r.created and all(any(w in n and "kept as written" in n for n in r.notes) for w in warned)
    assert b.header("old").canonical_line() == want
    c = a_f("c")
    r = ex.fetch(c, b_f.url("b"), "old")
    assert r.created and all(any(w in n for n in r.notes) for w in warned)
    assert c.header("old").canonical_line() == want
    d = a_f("d")
    imported = d.import_bytes(c.export("old"), record=True)
    assert [p.code for p in imported.header_findings] == ["header-member"] * 2
    imported.close()
    assert d.header("old").canonical_line() == want
    new = d.continue_session("old", successor_id="next")
    assert "cwd" not in new.header.data and new.header.member_problems() == []
    new.close()
    report = fsck(d)
    assert report.ok and [w.code for w in report.warnings if w.session == "old"] == ["header-member"] * 2


def test_push_incremental(remote_pair):
    """RFC 0002 "Exchange": a later push carries what the remote lacks, and moves the head
    by compare-and-swap from the head last seen there."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s, ids = chain(a, n=2)
    ex.push(a, b_f.url("b"), "s1")
    more = [s.append(msg(f"more {i}")).id for i in range(2)]
    r = ex.push(a, b_f.url("b"), "s1")
    assert not r.created and r.entries == 2 and r.outcome == "fast-forward"
    assert (r.head_before, r.head_after) == (ids[-1], more[-1])
    assert _snapshot_of(b, "s1") == ("mirror", more[-1], ids + more)
    assert b.export("s1") == a.export("s1")
    again = ex.push(a, b_f.url("b"), "s1")
    assert again.entries == 0 and not again.head_moved


def test_push_fork_carries_prefix(remote_pair):
    """RFC 0002 "Exchange": a push carries the prefix, so the receiver holds the base."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    _, ids, f = fork_of(a)
    own = f.append(msg("own")).id
    ex.push(a, b_f.url("b"), "f")
    assert b.list() == ["f"]
    assert _snapshot_of(b, "f") == ("mirror", own, [own])
    assert b.export("f") == a.export("f")


def test_push_from_mirror_refused(remote_pair):
    """RFC 0002 "Exchange": a push from a store that is not the record is refused."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    m, ids = _mirror(a)
    with unchanged(b), pytest.raises(NotRecordError) as ei:
        ex.push(a, b_f.url("b"), "s1")
    refused(ei, "not_record")
    assert "s1" not in b


def test_push_of_different_session_under_held_id_refused(remote_pair):
    """RFC 0002 "Exchange": a receiver holding another session (another header) under the
    id refuses the push; nothing is sent."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    chain(a, n=2)
    other, _ = chain(b, n=1, created_at=TS0)
    other.close()
    with unchanged(b), pytest.raises(HeaderDiffersError) as ei:
        ex.push(a, b_f.url("b"), "s1")
    refused(ei, "header_differs")


def test_push_wrong_expectation_lands_as_branch(remote_pair):
    """RFC 0002 "Exchange": the entries land whether or not the head moves; a wrong
    expected head leaves them in the log and says the head did not move."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s, ids = chain(a, n=2)
    ex.push(a, b_f.url("b"), "s1")
    new = s.append(msg("new")).id
    r = ex.push(a, b_f.url("b"), "s1", expected=ids[0])
    assert r.outcome == "refused" and not r.head_moved and r.entries == 1
    assert _snapshot_of(b, "s1") == ("mirror", ids[-1], ids + [new])
    forced = ex.push(a, b_f.url("b"), "s1", expected=ids[0], force=True)
    assert forced.forced and _snapshot_of(b, "s1")[1] == new


def test_fetch_into_third_store(remote_pair):
    """RFC 0002 "Exchange": any store may fetch from any holder, a mirror included; the
    fetched session is a mirror with the same projection."""
    a_f, b_f = remote_pair
    a = a_f("a")
    b_f("b")  # the remote (a store must be there to push to)
    c = a_f("c")
    s, ids = chain(a, n=3)
    ex.push(a, b_f.url("b"), "s1")
    r = ex.fetch(c, b_f.url("b"), "s1")
    assert r.created and r.entries == 3 and r.head_after == ids[-1]
    assert _snapshot_of(c, "s1") == ("mirror", ids[-1], ids)
    assert c.export("s1") == a.export("s1")
    # a later fetch brings what is new, and moves the mirror's head
    more = s.append(msg("more")).id
    ex.push(a, b_f.url("b"), "s1")
    r = ex.fetch(c, b_f.url("b"), "s1")
    assert r.entries == 1 and _snapshot_of(c, "s1") == ("mirror", more, ids + [more])


def test_fetch_moves_a_mirror_head_that_it_descends_from(remote_pair):
    """RFC 0002 "Exchange": a fetch moves a mirror's head to the fetched head when that
    descends from the mirror's (here: after a handover, the old sender follows)."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s, ids = chain(a, n=2)
    ex.handover(a, b_f.url("b"), "s1")
    s.close()
    bs = b.session("s1")
    new = bs.append(msg("at b")).id
    bs.close()
    r = ex.fetch(a, b_f.url("b"), "s1")
    assert r.entries == 1 and r.head_after == new
    assert _snapshot_of(a, "s1") == ("mirror", new, ids + [new])


def test_fetch_does_not_move_a_record_head(remote_pair):
    """RFC 0002 "Exchange": a record's head moves only by its own writers: a fetch into the
    record admits nothing it holds already and moves nothing, and says so."""
    a_f, b_f = remote_pair
    a = a_f("a")
    b_f("b")
    s, ids = chain(a, n=3)
    ex.push(a, b_f.url("b"), "s1")
    s.set_head(ids[0], expected=ids[2])
    with unchanged(a, s):
        r = ex.fetch(a, b_f.url("b"), "s1")
    assert not r.head_moved and r.head_after == ids[0]


def test_fetch_from_a_stale_mirror_moves_nothing(remote_pair):
    """RFC 0002 "Exchange": a fetch from a mirror whose head is behind the fetcher's moves
    nothing and says so."""
    a_f, b_f = remote_pair
    a = a_f("a")
    b_f("b")
    c = a_f("c")
    s, ids = chain(a, n=2)
    ex.push(a, b_f.url("b"), "s1")  # b: stale from here on
    more = s.append(msg("more")).id
    ex.push(a, a_f.url("c"), "s1")  # c: up to date
    r = ex.fetch(c, b_f.url("b"), "s1")
    assert not r.head_moved and r.entries == 0
    assert _snapshot_of(c, "s1") == ("mirror", more, ids + [more])


def test_handover(remote_pair):
    """RFC 0002 "Exchange": a handover makes the remote the record, then the sender a
    mirror; the sender then refuses local appends and the remote takes them."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s, ids = chain(a, n=2)
    r = ex.handover(a, b_f.url("b"), "s1")
    assert r.handover and r.mark == "record"
    assert s.mark == "mirror" and _snapshot_of(a, "s1")[0] == "mirror"
    assert _snapshot_of(b, "s1") == ("record", ids[-1], ids)
    with pytest.raises(MirrorError):
        s.append(msg("x"))
    with pytest.raises(NotRecordError):
        ex.push(a, b_f.url("b"), "s1")
    bs = b.session("s1")
    assert bs.append(msg("at b")).outcome == "continued"


def test_declare_record_here(remote_pair):
    """RFC 0002 "Exchange": a mirror whose record deleted the session may declare itself
    the record, guarded by the head it believes it holds."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s, ids = chain(a, n=2)
    ex.push(a, b_f.url("b"), "s1")
    a.delete("s1")
    with unchanged(b), pytest.raises(HeadMovedError) as ei:
        ex.declare_record(b, "s1", expected=ids[0])
    refused(ei, "head_moved")
    d = ex.declare_record(b, "s1", expected=ids[-1])
    assert d.mark == "record"
    bs = b.session("s1")
    assert bs.mark == "record" and bs.append(msg("b goes on")).outcome == "continued"


def test_declare_record_at_remote(remote_pair):
    """RFC 0003 "Record": declare-record carried to a remote, guarded by its head."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s, ids = chain(a, n=2)
    ex.push(a, b_f.url("b"), "s1")
    a.delete("s1")
    d = ex.declare_record(a, "s1", remote=b_f.url("b"))
    assert d.mark == "record"
    assert _snapshot_of(b, "s1") == ("record", ids[-1], ids)


def test_take_back(remote_pair):
    """RFC 0002 "Exchange": taking a session back is a handover the other way: this store
    fetches what the remote's writers added, becomes the record, the remote a mirror."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s, ids = chain(a, n=2)
    ex.handover(a, b_f.url("b"), "s1")
    bs = b.session("s1")
    new = bs.append(msg("written at b")).id
    bs.close()
    r = ex.take_back(a, b_f.url("b"), "s1")
    assert r.handover and r.mark == "record"
    local = a.session("s1")
    assert local.mark == "record" and local.head == new and local.log_order == ids + [new]
    assert _snapshot_of(b, "s1") == ("mirror", new, ids + [new])
    assert local.append(msg("back home")).outcome == "continued"
    assert a.export("s1") != b.export("s1")
    ex.push(a, b_f.url("b"), "s1")
    assert a.export("s1") == b.export("s1")


def test_exchange_with_itself_refused(make_store):
    """Exchange is between two stores: a store is not its own remote."""
    st = make_store()
    chain(st, n=1)
    with unchanged(st), pytest.raises(StoreError):
        ex.push(st, make_store.url("a"), "s1")


def test_push_carries_leaf_labels_and_head(remote_pair):
    """RFC 0002 "Exchange": a ``leaf`` label among pushed entries is an entry like any
    other; the remote's head is the pushed head (moved by the compare-and-swap), not
    where the label would take it on its own."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s, ids = _rich_session(a)
    s.set_head(ids[2], expected=ids[1])
    ex.push(a, b_f.url("b"), "s1")
    snap = b.read("s1")
    assert snap.head == ids[2] and snap.log_order == s.log_order and snap.leaf_labels == s.leaf_labels
    snap.close()
    assert b.export("s1") == a.export("s1")


@pytest.mark.parametrize("held", [False, True])
def test_push_of_a_synthetic_label_refused_as_an_append_refuses_it(make_store, held):
    """RFC 0002 "Head": a store MUST refuse a ``label`` carrying ``synthetic``; a push's
    receiver refuses it as an append does (``synthetic``, RFC 0003's code for it, rule
    ``synthetic``), over every transport (a local one; HTTP, whose problem body carries
    the code), to a session it lacks or holds. It was ``bad_entry`` for a push."""
    if not make_store.kind.reachable:
        pytest.skip(f"the local transport does not reach a {make_store.name} store")
    b = make_store("b")
    s, ids = chain(b, "ref", n=1)
    label = {"type": "label", "label": LEAF_LABEL, "target": ids[0], "parent": ids[0], "ts": ts(), "synthetic": True}
    with pytest.raises(AppendRefusedError) as by_append:
        s.append(dict(label))
    src = Store("memory:")
    p, pids = chain(src, "p1", n=1)
    sent = []
    for eid in pids:
        env = src.objects.get("entries", eid)
        chash = json.loads(env)["content"]
        sent += [("contents", chash, src.objects.get("contents", chash)), ("entries", eid, env)]
    lid, chash, content, env = entry_objects(dict(label, parent=pids[0], target=pids[0]))
    sent += [("contents", chash, content), ("entries", lid, env)]
    header = dict(src.header("p1").data)
    transport = open_transport(make_store.url("b"))
    try:
        if held:
            ex.push(src, transport, "p1")
        transport.put_objects(sent, len(sent))
        with unchanged(b), pytest.raises(AppendRefusedError) as by_push:
            transport.push(PushRequest(header=header, prefix=[], entries=pids + [lid], to=pids[0],
                                       expected=pids[0] if held else None))
    finally:
        transport.close()
        src.close()
    assert (by_push.value.code, by_push.value.rule) == (by_append.value.code, by_append.value.rule)
    refused(by_push, "synthetic", "synthetic")
    assert by_push.value.entry == lid
    assert ("p1" in b) == held


def test_push_raises_the_remote_header_format(remote_pair):
    """RFC 0002 "Exchange": a held session's header may differ in ``format`` alone; the
    receiver keeps the later of the two."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s = a.create(Header.new("s1", format="agentsession/0.13"))
    ex.push(a, b_f.url("b"), "s1")
    assert b.header("s1").data["format"] == "agentsession/0.13"
    s.append(msg("raises it here"))
    ex.push(a, b_f.url("b"), "s1")
    assert b.header("s1").data["format"] == a.header("s1").data["format"] != "agentsession/0.13"


def test_push_serves_only_what_a_writer_committed(remote_pair):
    """RFC 0002 "Exchange": a sender that cannot commit the session (a read-only store
    beside its writer) serves only what that writer committed."""
    a_f, b_f = remote_pair
    a, b = a_f("a", sync="never"), b_f("b")
    s = a.create(Header.new("s1"))
    committed = [s.append(msg(f"c{i}")).id for i in range(2)]
    s.commit()
    lazy = s.append(msg("working state")).id
    ro = a_f.reopen("a", readonly=True)
    r = ex.push(ro, b_f.url("b"), "s1")
    assert r.entries == 2
    assert _snapshot_of(b, "s1") == ("mirror", committed[-1], committed)
    assert lazy not in committed


def test_fetch_serves_only_what_a_writer_committed(remote_pair):
    """RFC 0002 "Exchange": a holder serves a fetch from what its writer last committed,
    never its working state."""
    b_f, a_f = remote_pair  # fetch from a store of the second backend into the first
    a, c = a_f("a", sync="never"), b_f("c")
    s = a.create(Header.new("s1"))
    committed = [s.append(msg(f"c{i}")).id for i in range(2)]
    s.commit()
    s.append(msg("working state"))
    r = ex.fetch(c, a_f.url("a"), "s1")
    assert r.entries == 2
    assert _snapshot_of(c, "s1") == ("mirror", committed[-1], committed)


def test_push_to_a_session_held_at_the_remote_is_refused(remote_pair):
    """RFC 0002 "Append": one writer at a time, at a receiver too: a push into a session
    another handle holds there is refused and changes nothing."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s, ids = chain(a, n=1)
    ex.push(a, b_f.url("b"), "s1")
    held = b.session("s1")
    s.append(msg("more"))
    with unchanged(b, held), pytest.raises(SessionLockedError) as ei:
        ex.push(a, b_f.url("b"), "s1")
    refused(ei, "session_locked")


def test_push_with_ref(remote_pair):
    """A push may carry refs naming the pushed session, each moved at the remote by
    compare-and-swap."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    chain(a, n=1)
    Refs(a).update("chat/x", "s1", expected=None)
    r = ex.push(a, b_f.url("b"), "s1", refs=["chat/x"])
    assert [(x.name, x.moved) for x in r.refs] == [("chat/x", True)]
    assert Refs(b).resolve("chat/x") == "s1"


def test_declare_record_on_a_record_changes_nothing(make_store):
    """RFC 0002 "Exchange": declaring a record that already is one changes nothing."""
    st = make_store()
    s, ids = chain(st, n=1)
    with unchanged(st, s):
        d = ex.declare_record(st, "s1")
    assert d.mark == "record"


def test_push_to_a_remote_never_made_is_refused(remote_pair, request):
    """A push names its remote by URL; a URL where no store is refuses the push
    (``transport``), and nothing is made there."""
    a_f, b_f = remote_pair
    a = a_f("a")
    chain(a, n=1)
    url = b_f.url("never-made")
    with unchanged(a), pytest.raises(AgentSessionError) as ei:
        ex.push(a, url, "s1")
    refused(ei, "transport")


@pytest.mark.parametrize("new_log", ["longer", "same-length"])
def test_kept_transport_after_remote_session_replaced(remote_pair, request, new_log):
    """RFC 0002 "Exchange", "A log per session": a transport kept open between pushes (a
    recorder's) must not write into a session that was deleted and created again at the
    remote meanwhile: the next push meets the new session's header (``header_differs``),
    and that session is left exactly as its writer left it, readable."""
    a_f, b_f = remote_pair
    a, b = a_f("a"), b_f("b")
    s, ids = chain(a, n=2)
    transport = open_transport(b_f.url("b"))
    try:
        ex.push(a, transport, "s1")
        snap = b.read("s1")
        pushed = len(snap.records())
        snap.close()
        b.delete("s1")
        other = b.create(Header.new("s1", created_at=TS0))
        target = pushed + (1 if new_log == "longer" else 0)
        while len(other.records()) < target - 1:
            other.append(msg(f"other {len(other.records())}"), durable=False)
        other.commit()
        other.close()
        s.append(msg("more"))
        with unchanged(b), pytest.raises(HeaderDiffersError):
            ex.push(a, transport, "s1")
    finally:
        transport.close()
    assert b.header("s1").data["created_at"] == TS0
    b.session("s1").close()  # opens for writing: not damaged


# =====================================================================================
# 9. Recovery semantics without a crash (RFC 0002 "Durability and recovery",
#    "A log per session")
# =====================================================================================


def test_close_and_reopen_keeps_state_and_seq_continues(make_store):
    """The state is what the log says: head, mark, log order and leaf labels are the same
    after close and reopen, and sequence numbers continue after the highest used."""
    st = make_store()
    s, ids = _rich_session(st)
    m, mids = _mirror(st, "m1")
    state = (s.head, s.mark, list(s.log_order), set(s.leaf_labels), dict(s.own))
    mstate = (m.head, m.mark, list(m.log_order))
    st.close()
    st2 = make_store.reopen()
    s2, m2 = st2.session("s1"), st2.session("m1")
    assert (s2.head, s2.mark, s2.log_order, s2.leaf_labels, s2.own) == state
    assert (m2.head, m2.mark, m2.log_order) == mstate
    r = s2.append(msg("after reopen"))
    assert r.seq == max(state[4].values()) + 1 and r.outcome == "continued"


def test_lazy_appends_committed_at_close(make_store):
    """RFC 0002 "Working state and commits": closing commits the working state."""
    st = make_store(sync="never")
    s, ids = chain(st, n=3)
    assert not any(committed_in_log(s, i) for i in ids)
    st.close()
    st2 = make_store.reopen()
    s2 = st2.session("s1")
    assert s2.log_order == ids and s2.head == ids[-1]
    assert all(s2.is_committed(i) and committed_in_log(s2, i) for i in ids)


def test_session_close_commits_and_releases(make_store):
    """A session's own close commits it and lets another writer in."""
    st = make_store(sync="never")
    s, ids = chain(st, n=2)
    s.close()
    assert s.closed
    with pytest.raises(StoreError):
        s.append(msg("closed"))
    other = make_store.reopen()
    s2 = other.session("s1")
    assert s2.log_order == ids and all(committed_in_log(s2, i) for i in ids)


def test_mark_survives_reopen(make_store):
    """RFC 0002 "Durability": a record mark is committed before it is acknowledged."""
    st = make_store(sync="never")
    s, ids = chain(st, n=1)
    s.set_mark("mirror")
    assert domain_records(s)[-1] == {"op": "commit"}
    st.close()
    st2 = make_store.reopen()
    assert st2.session("s1").mark == "mirror"


def test_deleted_session_is_gone_and_id_reusable(make_store):
    """RFC 0002 "A log per session": a deletion is one step after which nothing of the
    session is read; a session created afterwards under the id starts from nothing."""
    st = make_store()
    s, ids = chain(st, n=3)
    chain(st, "other", n=1)
    st.delete("s1")
    assert "s1" not in st and st.list() == ["other"]
    with pytest.raises(NoSuchSessionError):
        st.session("s1")
    with pytest.raises(NoSuchSessionError):
        st.read("s1")
    with pytest.raises(StoreError):
        s.append(msg("to a deleted session"))
    fresh = st.create(Header.new("s1", created_at=TS0))
    assert fresh.head is None and fresh.log_order == [] and fresh.records()[1:] == []
    r = fresh.append(msg("s1 m0"))  # not the old entry: another ts
    assert r.seq == 1 and r.outcome == "continued" and fresh.log_order == [r.id]
    st.close()
    st2 = make_store.reopen(readonly=True)
    snap = st2.read("s1")
    assert snap.log_order == [r.id] and st2.header("s1").data["created_at"] == TS0
    snap.close()


def test_deleted_session_same_entries_start_over(make_store):
    """A session created again under a deleted id does not hold the old entries: an
    entry that was the old session's is a fresh append, not a no-op."""
    st = make_store()
    hdr = Header.new("s1", created_at=TS0)
    s = st.create(hdr)
    e = msg("same")
    first = s.append(e)
    st.delete("s1")
    s2 = st.create(Header.new("s1", created_at=TS0))
    again = s2.append(dict(e, parent=None))
    assert again.id == first.id and again.outcome == "continued" and again.seq == 1


def test_delete_of_session_closed_in_another_handle(make_store):
    """A session no one holds is deleted from any handle; it is gone from all."""
    st = make_store()
    s, ids = chain(st, n=1)
    s.close()
    other = make_store.reopen()
    other.delete("s1")
    assert "s1" not in st and st.list() == []


def test_session_handle_is_shared_within_a_store(make_store):
    """A store hands out one writing handle per session; closing it lets the store (or
    another) open the session again."""
    st = make_store()
    s, ids = chain(st, n=1)
    assert st.session("s1") is s
    s.close()
    s2 = st.session("s1")
    assert s2 is not s and s2.log_order == ids
    assert s2.append(msg("again")).seq == 2


# =====================================================================================
# 10. Listing and reading (RFC 0002 "Entries", "Verification")
# =====================================================================================


def test_list_sorted_and_contains(make_store):
    st = make_store()
    for sid in ("b", "a", "c-1", "B", "a.2"):
        st.create(Header.new(sid)).close()
    assert st.list() == sorted(["b", "a", "c-1", "B", "a.2"])
    assert "a" in st and "c-1" in st and "zz" not in st
    for bad in ("../a", "", None, 5, "a/b"):
        assert bad not in st


def test_read_snapshot_takes_no_hold(make_store):
    """A read is a snapshot taking no hold: it is served while a writer holds the session,
    does not stop that writer, and refuses writes itself."""
    st = make_store()
    s, ids = chain(st, n=2)
    other = make_store.reopen()
    snap = other.read("s1")
    assert snap.log_order == ids and snap.head == ids[-1]
    r = s.append(msg("writer goes on"))
    assert r.outcome == "continued"
    assert snap.log_order == ids  # a snapshot: as it was read
    with pytest.raises(ReadOnlyError):
        snap.append(msg("from a snapshot"))
    snap.close()
    s.close()
    snap2 = st.read("s1")  # a snapshot does not keep a writer out either
    w = other.session("s1")
    assert w.log_order == ids + [r.id]
    snap2.close()


def test_entry_path_to_and_cat_object(make_store):
    """Entries are rebuilt from their envelope and content objects, each verified."""
    st = make_store()
    s, ids = chain(st, n=3)
    e = st.entry(ids[2])
    assert e.id == ids[2] and e.parent == ids[1] and e.data["item"]["content"] == "s1 m2"
    assert [x.id for x in st.path_to(ids[2])] == ids
    space, env = st.cat_object(ids[1])
    assert space == "entries" and sha256_ref(env) == ids[1]
    space, content = st.cat_object(e.content_hash)
    assert space == "contents" and sha256_ref(content) == e.content_hash
    assert st.cat_object(ids[1], "entries") == ("entries", env)
    with pytest.raises(NoSuchObjectError) as ei:
        st.entry(UNHELD)
    refused(ei, "no_object")
    with pytest.raises(NoSuchObjectError):
        st.cat_object(UNHELD)
    with pytest.raises(NoSuchObjectError):
        st.cat_object(ids[1], "contents")
    with pytest.raises(AgentSessionError):
        st.cat_object("not-a-hash")


def _put_corrupt(st: Store, space: str, name: str, data: bytes) -> None:
    """Store bytes under a name they do not hash to (through the seam)."""
    assert sha256_ref(data) != name
    st.objects.put(space, name, data, durable=True)


def test_objects_are_verified_when_read(make_store):
    """RFC 0002 "Durability": an object whose bytes do not hash to its name is never
    served: not as a blob, an entry, a content or on a path."""
    st = make_store()
    # a blob
    name = sha256_ref(b"the real bytes")
    _put_corrupt(st, "blobs", name, b"other bytes")
    with pytest.raises(CorruptObjectError):
        st.blob(name)
    with pytest.raises(CorruptObjectError):
        st.cat_object(name)
    # an entry whose envelope is corrupt, and one below it on a path
    e1 = make_entry("item", None, ts=ts(), item={"type": "message", "role": "user", "content": "one"})
    e2 = make_entry("item", e1.id, ts=ts(), item={"type": "message", "role": "user", "content": "two"})
    for e in (e1, e2):
        _, chash, content, env = entry_objects(dict(e.data))
        st.objects.put("contents", chash, content, durable=True)
        if e is e1:
            _put_corrupt(st, "entries", e.id, env.replace(b"20", b"21", 1))
        else:
            st.objects.put("entries", e.id, env, durable=True)
    assert st.entry(e2.id).id == e2.id
    with pytest.raises(CorruptObjectError):
        st.entry(e1.id)
    with pytest.raises(CorruptObjectError):
        st.path_to(e2.id)
    # a content that is corrupt
    e3 = make_entry("item", None, ts=ts(), item={"type": "message", "role": "user", "content": "three"})
    _, chash, content, env = entry_objects(dict(e3.data))
    _put_corrupt(st, "contents", chash, content.replace(b"three", b"THREE"))
    st.objects.put("entries", e3.id, env, durable=True)
    with pytest.raises(CorruptObjectError):
        st.entry(e3.id)


def test_put_blob_and_blob(make_store):
    """RFC 0002 "Media": a blob is an object under its own hash, held once."""
    st = make_store()
    name = st.put_blob(b"some media")
    assert name == sha256_ref(b"some media")
    assert st.put_blob(b"some media") == name  # idempotent
    assert st.blob(name) == b"some media"
    assert st.cat_object(name) == ("blobs", b"some media")
    with pytest.raises(NoSuchObjectError):
        st.blob(sha256_ref(b"never stored"))
    st.close()
    ro = make_store.reopen(readonly=True)
    assert ro.blob(name) == b"some media"


def test_unresolved_sidecar_blob_reported_not_refused(make_store):
    """RFC 0002 "Append": a reference the store cannot resolve is reported, never a
    condition of acceptance."""
    st = make_store()
    s = st.create(Header.new("s1", media="sidecar"))
    missing = sha256_ref(b"not here")
    r = s.append({"type": "item", "ts": ts(), "item": {"type": "message", "role": "user",
                  "content": [{"type": "input_image", "image_url": f"sidecar:{missing}"}]}})
    assert r.outcome == "continued" and r.unresolved == [f"sidecar:{missing}"]


def _image(name: str) -> dict:
    return {"type": "item", "ts": ts(), "item": {"type": "message", "role": "user",
            "content": [{"type": "input_image", "image_url": f"sidecar:{name}"}]}}


def test_verify_holds_a_sidecar_blob_the_store_lacks_to_the_export(make_store):
    """RFC 0001 File: a sidecar is part of the session. A blob an append named and the
    store lacks (RFC 0002: reported, not refused) fails ``verify ID`` (its export cannot
    carry it: ``missing-blob``, naming the blob and the line) and is a warning to fsck,
    which fails nothing for it; once the blob is put, both are clean."""

    st = make_store()
    s = st.create(Header.new("s1", media="sidecar"))
    held, missing = st.put_blob(b"held image"), sha256_ref(b"an image never put")
    s.append(msg("look"))
    s.append(_image(held))
    s.append(_image(missing))
    check = verify_stored(st, "s1", as_export=True)
    [p] = check.problems
    assert (p["code"], p["where"], p["object"], p["line"]) == ("missing-blob", "media", missing, 4)
    assert missing in p["message"] and "line 4" in p["message"]
    lenient = verify_stored(st, "s1")  # as fsck holds it
    media = [(n["code"], n["severity"], n["object"]) for n in lenient.notes if n["where"] == "media"]
    assert lenient.ok and media == [("missing-blob", "warning", missing)]
    if make_store.name != "http":  # (fsck is local maintenance: RFC 0003 carries none)
        report = fsck(st, deep=True)
        assert not report.errors, report.errors
        assert [(w.code, w.session, w.object) for w in report.warnings] == [("missing-blob", "s1", missing)]
    assert st.put_blob(b"an image never put") == missing
    assert verify_stored(st, "s1", as_export=True).ok
    assert not [n for n in verify_stored(st, "s1").notes if n["where"] == "media"]


def test_verify_and_fsck_name_a_corrupt_sidecar_blob(make_store):
    """A sidecar blob whose bytes do not hash to its name is ``corrupt-object`` to
    ``verify ID`` (where: media) and an error to fsck, with or without ``--deep``,
    naming the session it hurts, and not also a ``missing-blob`` warning."""

    st = make_store()
    s = st.create(Header.new("s1", media="sidecar"))
    name = sha256_ref(b"the real image")
    _put_corrupt(st, "blobs", name, b"other bytes")
    s.append(_image(name))
    for as_export in (True, False):
        [p] = verify_stored(st, "s1", as_export=as_export).problems
        assert (p["code"], p["where"], p["object"], p["space"]) == ("corrupt-object", "media", name, "blobs")
    for deep in (False, True):
        report = fsck(st, deep=deep)
        assert "s1" in {e.session for e in report.errors if e.code == "corrupt-object" and e.object == name}, report.errors
        assert not [w for w in report.warnings if w.code == "missing-blob"], report.warnings


def test_fsck_leaves_a_kept_request_hash_to_deep(make_store):
    """A response whose ``request_hash`` does not rebuild is kept, a finding (refusing
    would lose what a model returned; docs/rules.md), and fails ``verify ID``. Plain
    fsck holds a store to what it enforces, so it is no error there on any backend (the
    memory and PostgreSQL walks, which verify each projection, called it one where the
    file walk did not); ``fsck --deep`` reports it, as ``verify`` does."""

    st = make_store()
    s = st.create(Header.new("s1"))
    s.append({"type": "config", "ts": ts(), "config": {"model": "m", "instructions": "hi"}})
    s.append(msg("q"))
    wrong = "sha256:" + "0" * 64
    res = s.append({"type": "response", "ts": ts(), "response": {"id": "r1", "model": "m", "status": "completed"},
                    "request_hash": wrong})
    assert [f.code for f in res.findings] == ["request_hash"]
    assert [p["code"] for p in verify_stored(st, "s1", as_export=True).problems] == ["request_hash"]
    plain = fsck(st)
    assert not plain.errors, plain.errors
    deep = fsck(st, deep=True)
    assert [(e.code, e.session) for e in deep.errors] == [("request_hash", "s1")], deep.errors
    assert wrong in deep.errors[0].message


def test_header_and_session_iteration(make_store):
    st = make_store()
    s, ids = chain(st, n=2, harness={"name": "h", "version": "1"})
    assert st.header("s1").data["harness"] == {"name": "h", "version": "1"}
    assert [e.id for e in s] == ids and len(s) == 2 and ids[0] in s and UNHELD not in s


def test_read_only_store_session_beside_a_writer(make_store):
    """A read-only store's ``session()`` is a snapshot taking no hold, served while a
    writer holds the session."""
    st = make_store()
    s, ids = chain(st, n=1)
    ro = make_store.reopen(readonly=True)
    snap = ro.session("s1")
    assert snap.log_order == ids and not snap.writable
    assert s.append(msg("writer")).outcome == "continued"
    with pytest.raises(ReadOnlyError):
        snap.set_head(None, expected=ids[0])


def test_put_replaces_a_corrupt_copy(make_store):
    """RFC 0002 "Durability": content addressing makes a rewrite harmless: storing an
    object over a corrupt copy of it leaves the sound bytes, served from then on."""
    st = make_store()
    name = sha256_ref(b"sound")
    _put_corrupt(st, "blobs", name, b"torn")
    with pytest.raises(CorruptObjectError):
        st.blob(name)
    assert not st.objects.held("blobs", name)
    st.objects.put("blobs", name, b"sound", durable=True)
    assert st.blob(name) == b"sound" and st.objects.held("blobs", name)


# =====================================================================================
# 11. Retention (RFC 0002 "Deletion and retention"): what a sweep must keep
# =====================================================================================


def test_sweep_keeps_what_logs_and_prefixes_name(make_store):
    """RFC 0002 "Deletion and retention": a sweep never drops an entry a log names or one
    on a prefix (the base included), nor the contents and blobs they name; what nothing
    retains may go."""
    st = make_store()
    a, ids, f = fork_of(st, n=3, base_index=1, media="sidecar")
    own = f.append(msg("own")).id
    blob = st.put_blob(b"media of b")
    b = st.create(Header.new("b", media="sidecar"))
    rb = b.append({"type": "item", "ts": ts(), "item": {"type": "message", "role": "user",
                   "content": [{"type": "input_image", "image_url": f"sidecar:{blob}"}]}}).id
    kept_blob = st.put_blob(b"media of f")
    rf = f.append({"type": "item", "ts": ts(), "item": {"type": "message", "role": "user",
                   "content": [{"type": "input_image", "image_url": f"sidecar:{kept_blob}"}]}}).id
    export_f = st.export("f")
    st.delete("a")
    st.delete("b")
    f.close()
    st.sweep(grace=0)
    for eid in ids[:2] + [own, rf]:
        st.entry(eid)  # envelope and content, verified
    assert st.blob(kept_blob) == b"media of f"
    assert st.export("f") == export_f
    for gone in (ids[2], rb):
        with pytest.raises(NoSuchObjectError):
            st.cat_object(gone)
    with pytest.raises(NoSuchObjectError):
        st.blob(blob)


def test_sweep_keeps_working_state(make_store):
    """RFC 0002 "Deletion and retention": an accepted append holds its objects, committed
    or not; a sweep beside its writer (another handle) keeps them."""
    st = make_store(sync="never")
    s, ids = chain(st, n=2)
    export = st.export("s1")
    other = make_store.reopen()
    other.sweep(grace=0, force=True)  # beside its writer, on purpose
    assert all(st.entry(i).id == i for i in ids)
    s.close()
    assert st.export("s1") == export


def test_sweep_spares_an_unnamed_object_younger_than_the_grace(make_store):
    """RFC 0002 "Deletion and retention": an object no log names may belong to an append
    not yet accepted, so a store MUST NOT sweep one younger than its grace period; once
    older (here a grace of 0) it may go. Objects a deleted session alone named, too."""
    st = make_store()
    s, ids = chain(st, "gone", n=2)
    s.close()
    st.delete("gone")
    loose = st.put_blob(b"named by no content")
    young = st.sweep(grace=3600)
    assert young.repack.dropped == 0
    assert st.blob(loose) == b"named by no content"
    for eid in ids:
        assert st.cat_object(eid)[0] == "entries"
    old = st.sweep(grace=0)
    assert old.repack.dropped >= 1 + 2 * len(ids)
    with pytest.raises(NoSuchObjectError):
        st.blob(loose)
    for eid in ids:
        with pytest.raises(NoSuchObjectError):
            st.cat_object(eid)


def test_scan_gives_every_object_of_the_spaces_asked(make_store):
    """`scan` (a bulk pass: grep) yields every object of each space asked, with its bytes;
    a caller may meet one twice, never miss one the store holds."""
    st = make_store()
    s = st.create(Header.new("scan"))
    ids = [s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"m{i}"}}).id
           for i in range(5)]
    s.close()
    st.objects.put("blobs", sha256_ref(b"blob"), b"blob", durable=True)
    got: dict[tuple[str, str], bytes] = {}
    for space, name, data in st.objects.scan(("entries", "contents")):
        assert space in ("entries", "contents")
        got[(space, name)] = data
    assert {n for sp, n in got if sp == "entries"} >= set(ids)
    for (space, name), data in got.items():
        assert data == st.objects.get(space, name)
    contents = {n for sp, n in got if sp == "contents"}
    assert contents == set(st.objects.names("contents"))
    assert not any(sp == "blobs" for sp, _ in got)
