"""RFC 0002 "Deletion and retention" and "Media", held against every backend.

The contract suite's sweep tests (tests/test_contract.py, section 11) cover the core of
the rule; these cover what it implies and the sweep's own promises, on every backend the
suite runs (``make_store``: file, memory, PostgreSQL, and HTTP):

- abandoned branches, branches off the head and leaf labels are in the log, so kept
  (no sweep by reachability from heads);
- a prefix that spans two deleted sessions (a fork of a fork) is kept whole, and so are
  the contents and ``sidecar:`` blobs its entries name;
- a content (and the blob it names) shared with a deleted session stays; a blob named
  only by a session's working state stays;
- objects put ahead of an append are spared by the grace, and the append, once
  accepted, holds them again (written back after a sweep took them);
- refs retain nothing and are left as they were, and so do remote-tracking records;
- the report: ``--dry-run`` names exactly what the sweep then removes, the counts say
  what was retained (checked against the sessions read through the API), fsck counts
  as unreferenced what a sweep removes, and a sweep stopped midway leaves a sound store.

Sweep is not carried by RFC 0003, so on the HTTP backend the sweep runs where an
operator runs it: on the store the server serves (in this process, under the server's
lock); objects are then read through a fresh client, whose cache is empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import http_store
import test_contract
from agentsession_cas import Header
from agentsession_cas.errors import NoSuchObjectError, WritersActiveError
from agentsession_cas.exchange.local import remote_url
from agentsession_cas.exchange.operations import fetch, push
from agentsession_cas.format.hashing import entry_objects, sha256_ref
from agentsession_cas.format.media import sidecar_names
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.maintenance.repair import repair_session
from agentsession_cas.maintenance.sweep import SAFE_GRACE, SweepResult
from agentsession_cas.store import Store
from agentsession_cas.store.refs import Refs
from agentsession_cli.main import main
from contract_helpers import StoreFactory, leaf, msg, ts

SPACES = ("entries", "contents", "blobs")

# The contract suite's fixtures: a store of each backend (test_contract.py).
_scratch_root = test_contract._scratch_root
scratch = test_contract.scratch
make_store = test_contract.make_store


# -- where a sweep runs, and what it leaves --------------------------------------------


def served(make_store: StoreFactory, st: Store, name: str = "a") -> Store:
    """The store as an operator's sweep (another process) opens it: another handle on
    it; for the HTTP backend, the directory the server serves, opened beside the server
    (sweep is local maintenance, not carried by RFC 0003). One handle per test and store."""
    kept = _operators.setdefault(id(make_store), {})
    if name in kept:
        return kept[name]
    if make_store.name == "http":
        key = f"{make_store.tag}-{name}"
        assert http_store._app(key) is not None, "the HTTP store was never reached"
        op = Store(http_store._PATHS[key])
        make_store.opened.append(op)
    else:
        op = make_store.reopen(name)
    kept[name] = op
    return op


_operators: dict[int, dict[str, Store]] = {}


@pytest.fixture(autouse=True)
def _forget_operators() -> Iterator[None]:
    yield
    _operators.clear()


def sweep(make_store: StoreFactory, st: Store, name: str = "a", **kw: Any) -> SweepResult:
    """A sweep as an operator runs it (:func:`served`). The HTTP server holds the sessions
    it served open (leases), so a short grace there is forced: the test is the only writer."""
    if make_store.name == "http":
        kw.setdefault("force", True)
    return served(make_store, st, name).sweep(**kw)


def held(st: Store) -> dict[str, set[str]]:
    """Every object name the store holds, per space."""
    return {space: set(st.objects.names(space)) for space in SPACES}


def readable(st: Store, name: str) -> bool:
    try:
        st.cat_object(name)
    except NoSuchObjectError:
        return False
    return True


def image(blob: str, **kw: Any) -> dict[str, Any]:
    """A user message naming ``blob`` by a ``sidecar:`` URL."""
    return {"type": "item", "ts": ts(), "item": {"type": "message", "role": "user",
            "content": [{"type": "input_image", "image_url": f"sidecar:{blob}"}]}, **kw}


def written(st: Store, header: Header, *entries: str | dict[str, Any]) -> list[str]:
    """Create a session, append each entry (a text: a user message), close it; the ids."""
    s = st.create(header)
    ids = [s.append(msg(e) if isinstance(e, str) else e).id for e in entries]
    s.close()
    return ids


def exports(st: Store) -> dict[str, bytes]:
    return {sid: st.export(sid) for sid in st.list()}


# -- what logs and prefixes retain -----------------------------------------------------


def test_abandoned_branches_off_head_appends_and_leaf_labels_are_kept(make_store):
    """RFC 0002: a store MUST NOT sweep by reachability from heads; a session's abandoned
    branches are in its log and are its record. A head moved back, an append under a
    parent that is not the head, and a leaf label all leave entries off the head's path."""
    st = make_store()
    s = st.create(Header.new("s"))
    m = [s.append(msg(f"m{i}")).id for i in range(3)]
    s.set_head(m[0], expected=m[2])  # m1, m2: an abandoned branch
    n1 = s.append(msg("after the move")).id
    side = s.append(msg("a branch", parent=m[1])).id
    assert s.head == n1
    label = s.append(leaf(m[1], n1)).id  # the head goes to m1; n1 and the label are off it
    assert s.head == m[1]
    s.close()
    before = exports(st)
    res = sweep(make_store, st, grace=0)
    assert res.repack.dropped == 0
    fresh = make_store.reopen()
    for eid in m + [n1, side, label]:
        assert fresh.entry(eid).id == eid
    assert exports(fresh) == before


def test_a_fork_of_a_fork_keeps_its_whole_prefix_when_both_origins_go(make_store):
    """RFC 0002: a store MUST NOT sweep an entry on any session's prefix, the base
    included; a prefix may run through the own entries of two deleted sessions (a fork
    made at an own entry of another fork). What no log and no prefix needs goes."""
    st = make_store()
    a_ids = written(st, Header.new("a"), *(f"a{i}" for i in range(4)))
    f_ids = written(st, Header.new("f", base=a_ids[1]), *(f"f{i}" for i in range(3)))
    [g_own] = written(st, Header.new("g", base=f_ids[1]), "g0")
    export_g = st.export("g")
    st.delete("a")
    st.delete("f")
    res = sweep(make_store, st, grace=0)
    prefix = a_ids[:2] + f_ids[:2]
    fresh = make_store.reopen()
    for eid in prefix + [g_own]:
        assert fresh.entry(eid).id == eid
    assert fresh.export("g") == export_g
    where = served(make_store, st)
    for gone in a_ids[2:] + f_ids[2:]:
        assert not readable(where, gone), gone
    assert res.sessions == 1
    assert res.retained_envelopes == len(prefix) + 1


def test_blobs_named_on_a_prefix_are_kept_when_its_session_goes(make_store):
    """RFC 0002: a media blob is retained while any retained content names it through a
    ``sidecar:`` URL: a content on a fork's prefix (its base's included) is retained, so
    the blobs it names stay when the session that appended it is deleted."""
    st = make_store()
    above, at_base, below = (st.put_blob(f"blob {i}".encode()) for i in range(3))
    ids = written(st, Header.new("a", media="sidecar"), image(above), image(at_base), image(below))
    written(st, Header.new("f", base=ids[1], media="sidecar"), "own")
    export_f = st.export("f")
    st.delete("a")
    sweep(make_store, st, grace=0)
    fresh = make_store.reopen()
    assert fresh.blob(above) == b"blob 0"
    assert fresh.blob(at_base) == b"blob 1"
    assert fresh.export("f") == export_f
    where = served(make_store, st)
    assert not readable(where, below) and not readable(where, ids[2])


def test_a_content_shared_with_a_deleted_session_stays_with_its_blob(make_store):
    """RFC 0002: a content is retained while any retained envelope names it; identical
    bodies in two sessions are one content, so deleting one session takes its envelope
    and leaves the content (and the blob it names) to the other."""
    st = make_store()
    blob = st.put_blob(b"shared media")
    body = image(blob)
    [gone_id] = written(st, Header.new("gone", media="sidecar"), dict(body, ts=ts()))
    [live_id] = written(st, Header.new("live", media="sidecar"), dict(body, ts=ts()))
    content = st.envelope(live_id)["content"]
    assert st.envelope(gone_id)["content"] == content
    st.delete("gone")
    sweep(make_store, st, grace=0)
    fresh = make_store.reopen()
    assert fresh.entry(live_id).id == live_id
    assert fresh.cat_object(content)[0] == "contents"
    assert fresh.blob(blob) == b"shared media"
    assert not readable(served(make_store, st), gone_id)


def test_a_blob_named_only_by_working_state_is_kept(make_store):
    """RFC 0002: an accepted append holds its objects, committed or not; a blob its
    content names is retained with it, so a sweep beside the writer (another handle)
    keeps a blob only an uncommitted append names."""
    st = make_store(sync="never")
    blob = st.put_blob(b"uncommitted media")
    s = st.create(Header.new("s", media="sidecar"))
    eid = s.append(image(blob), durable=False).id
    st.history("s")  # (over HTTP a read sends what the writer holds: the server has the append, uncommitted)
    sweep(make_store, st, grace=0, force=True)  # beside its writer, on purpose
    assert st.blob(blob) == b"uncommitted media"
    assert st.entry(eid).id == eid
    s.close()
    assert make_store.reopen().blob(blob) == b"uncommitted media"


def test_fsck_retains_a_blob_named_only_by_working_state(make_store):
    """fsck's retention is the sweep's: beside a writer whose log alone holds a content
    naming a blob (not yet written to the objects), fsck counts the blob retained and a
    sweep keeps it."""
    st = make_store(sync="never")
    blob = st.put_blob(b"uncommitted media")
    s = st.create(Header.new("s", media="sidecar"))
    s.append(image(blob), durable=False)
    st.history("s")  # (as above: over HTTP, the server now has the append)
    report = fsck(served(make_store, st))
    assert report.counts["unreferenced"] == {space: 0 for space in SPACES}
    res = sweep(make_store, st, grace=0, force=True)
    assert blob not in res.repack.dropped_names
    s.close()


def test_objects_put_ahead_of_an_append_are_spared_then_written_back(make_store):
    """RFC 0002: an object no log names may belong to an append not yet accepted, so a
    sweep spares it while younger than the grace; and when the store accepts the append
    it MUST hold that append's objects, writing back any a sweep took."""
    st = make_store()
    s = st.create(Header.new("s"))
    root = s.append(msg("root")).id
    entry = msg("ahead", parent=root)
    eid, content, body, env = entry_objects(entry)
    st.objects.put("contents", content, body)
    st.objects.put("entries", eid, env)
    young = sweep(make_store, st, grace=3600, force=True)  # s is held: a grace of an hour is safe
    assert young.repack.dropped == 0
    assert readable(served(make_store, st), eid)
    sweep(make_store, st, grace=0, force=True)  # the append is not yet accepted: they go
    assert not readable(served(make_store, st), eid)
    assert s.append(entry).id == eid  # accepted: its objects are written back
    s.close()
    res = sweep(make_store, st, grace=0)
    assert res.repack.dropped == 0
    fresh = make_store.reopen()
    assert fresh.entry(eid).id == eid
    assert fresh.cat_object(content)[0] == "contents"


def test_refs_retain_nothing_and_survive_a_sweep(make_store):
    """RFC 0002: retention is over logs and prefixes. A named ref names a session, not
    objects: a ref to a deleted session keeps none of its objects, and a sweep leaves
    the refs as they were (the dangling one still dangling)."""
    st = make_store()
    ids = written(st, Header.new("s"), "m0", "m1")
    written(st, Header.new("t"), "t0")
    refs = Refs(st)
    refs.update("chat/gone", "s", expected=None)
    refs.update("chat/kept", "t", expected=None)
    st.delete("s")
    before = {name: refs.get(name) for name in ("chat/gone", "chat/kept")}
    sweep(make_store, st, grace=0)
    where = served(make_store, st)
    for eid in ids:
        assert not readable(where, eid)
    fresh = Refs(make_store.reopen())
    assert {name: fresh.get(name) for name in before} == before
    assert fresh.state(fresh.get("chat/kept")) == "ok"
    assert fresh.state(fresh.get("chat/gone")) == "dangling"


def test_remote_tracking_records_retain_nothing(make_store, tmp_path):
    """RFC 0002: retention is over logs and prefixes. What a store remembers of a remote
    (the head a push or a fetch saw there, the last entry pushed: ``exchange/remembered.py``)
    is a hint, not a log: once the sessions are deleted here, a sweep removes the objects
    only those records name and leaves the records as they were; fsck finds the store
    sound, names none of those objects (a record naming an object the store lacks is no
    damage) and counts none unreferenced once they are gone."""
    st = make_store()
    far_path = str(tmp_path / "far")
    with Store.init(far_path) as far:
        pulled = written(far, Header.new("pulled"), "p0", "p1")
    pushed = written(st, Header.new("pushed"), "s0", "s1")
    written(st, Header.new("kept"), "k0")
    assert push(st, far_path, "pushed").head_moved
    sids = ["pushed"]
    if make_store.name != "http":  # (a store served over HTTP takes a session only by a push to it)
        assert fetch(st, far_path, "pulled").head_moved
        sids.append("pulled")
    else:
        pulled = []
    url = remote_url(far_path)
    records = {sid: st.backend.remotes.get(url, "sessions", sid) for sid in sids}
    assert records["pushed"]["head"] == pushed[-1] and records["pushed"]["last"] == pushed[-1]
    assert not pulled or records["pulled"]["head"] == pulled[-1]
    gone = set(pushed + pulled)
    gone |= {st.envelope(e)["content"] for e in gone}
    for sid in sids:
        st.delete(sid)
    sweep(make_store, st, grace=0)
    where = served(make_store, st)
    for name in gone:
        assert not readable(where, name), name
    assert {sid: st.backend.remotes.get(url, "sessions", sid) for sid in records} == records
    report = fsck(where)
    assert report.ok, [p.message for p in report.errors]
    assert not [p for p in report.problems if p.object in gone], report.problems
    assert report.counts["unreferenced"] == {space: 0 for space in SPACES}


# -- the sweep's report and its soundness ----------------------------------------------


def garbage(st: Store) -> dict[str, Any]:
    """A store with something of each kind a sweep keeps and removes: a live session and
    a fork whose origin is deleted (sidecar media on both sides), a deleted session with
    a blob of its own, and objects no content names. Returns the ids."""
    b_live, b_gone, b_prefix = (st.put_blob(f"media {i}".encode()) for i in range(3))
    a_ids = written(st, Header.new("a", media="sidecar"), "a0", image(b_prefix), "a2")
    f_ids = written(st, Header.new("f", base=a_ids[1], media="sidecar"), image(b_live))
    d_ids = written(st, Header.new("d", media="sidecar"), "d0", image(b_gone))
    st.delete("a")
    st.delete("d")
    loose_blob = st.put_blob(b"named by nothing")
    loose_body = b'{"item":{"content":"loose","role":"user","type":"message"}}'
    st.objects.put("contents", sha256_ref(loose_body), loose_body)
    return {"kept": a_ids[:2] + f_ids + [b_live, b_prefix], "gone": [a_ids[2]] + d_ids + [b_gone, loose_blob,
            sha256_ref(loose_body)]}


def test_dry_run_names_exactly_what_the_sweep_removes(make_store):
    """`sweep --dry-run` changes nothing and names what a real sweep then removes, with
    the same counts; the real sweep removes exactly the objects it names (no more), and
    a second sweep finds nothing left to remove."""
    st = make_store()
    ids = garbage(st)
    where = served(make_store, st)
    before = held(where)
    dry = sweep(make_store, st, grace=0, dry_run=True)
    assert held(where) == before
    real = sweep(make_store, st, grace=0)
    assert dry.repack.dropped_names == real.repack.dropped_names
    assert (dry.repack.dropped, dry.repack.dropped_bytes) == (real.repack.dropped, real.repack.dropped_bytes)
    assert (dry.sessions, dry.retained_envelopes, dry.retained_contents, dry.retained_blobs) == (
        real.sessions, real.retained_envelopes, real.retained_contents, real.retained_blobs)
    after = held(where)
    removed = set().union(*before.values()) - set().union(*after.values())
    assert removed == set(real.repack.dropped_names)
    assert real.repack.dropped == len(real.repack.dropped_names)
    assert set(ids["gone"]) <= removed and not set(ids["kept"]) & removed
    again = sweep(make_store, st, grace=0)
    assert again.repack.dropped == 0 and again.repack.dropped_names == []


def test_the_counts_say_what_the_sessions_retain(make_store):
    """A sweep's report counts the sessions whose logs it read and what they retain: the
    envelopes of every log and prefix, the contents they name and the blobs those name,
    as read through the API, session by session."""
    st = make_store()
    garbage(st)
    envelopes: set[str] = set()
    for sid in st.list():
        r = st.read(sid)
        envelopes.update(r.log_order)
        envelopes.update(r.prefix)
    contents = {st.envelope(e)["content"] for e in envelopes}
    blobs = {b for c in contents for b in sidecar_names(st.cat_object(c, "contents")[1])}
    res = sweep(make_store, st, grace=0)
    assert res.sessions == len(st.list()) == 1
    assert (res.retained_envelopes, res.retained_contents, res.retained_blobs) == (
        len(envelopes), len(contents), len(blobs))
    assert res.as_dict()["retained"] == {"entries": len(envelopes), "contents": len(contents), "blobs": len(blobs)}


def test_fsck_counts_as_unreferenced_what_a_sweep_removes(make_store):
    """fsck's retention sets are the sweep's (docs/fsck.md, 6.): the objects it counts
    unreferenced, per space, are the ones a sweep past its grace removes."""
    st = make_store()
    garbage(st)
    where = served(make_store, st)
    report = fsck(where)
    assert report.ok
    before = held(where)
    sweep(make_store, st, grace=0)
    after = held(where)
    assert report.counts["unreferenced"] == {space: len(before[space] - after[space]) for space in SPACES}
    assert fsck(where).counts["unreferenced"] == {space: 0 for space in SPACES}


def test_the_fsck_command_says_the_unreferenced_counts_on_every_backend(make_store):
    """`agentsession fsck` prints the unreferenced objects per space wherever the store
    lives, the same line and the same ``--json`` counts, run where the store is (for the
    HTTP backend: on the directory the server serves, as sweep is; through the client,
    which cannot sweep, the line says they are not counted rather than 0)."""
    st = make_store()
    garbage(st)
    want = fsck(served(make_store, st)).counts["unreferenced"]
    assert want["entries"] and want["contents"] and want["blobs"], want
    url = http_store._PATHS[f"{make_store.tag}-a"] if make_store.name == "http" else make_store.url()
    runner = CliRunner()
    res = runner.invoke(main, ["--store", url, "fsck", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["counts"]["unreferenced"] == want
    res = runner.invoke(main, ["--store", url, "fsck"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    line = f"; unreferenced: {want['entries']} entries, {want['contents']} contents, {want['blobs']} blobs\n"
    assert line in res.output, res.output
    if make_store.name == "http":  # through the client, which cannot sweep: not counted, and not said to be 0
        res = runner.invoke(main, ["--store", make_store.url(), "fsck"], catch_exceptions=False)
        assert "; unreferenced: not counted" in res.output, res.output
        res = runner.invoke(main, ["--store", make_store.url(), "fsck", "--json"], catch_exceptions=False)
        assert "unreferenced" not in json.loads(res.output)["counts"], res.output


def test_fsck_counts_what_a_damaged_log_retains(make_store):
    """fsck reports a damaged log and still counts what nothing retains: what of the log
    reads retains its objects (a sweep refuses the store until the session is repaired)."""
    if make_store.name not in ("file", "postgresql"):
        pytest.skip(f"{make_store.name}: no log to damage from outside")
    st = make_store()
    written(st, Header.new("hurt"), *(f"hurt {i}" for i in range(4)))
    written(st, Header.new("gone"), "gone 0")
    st.delete("gone")
    _damage_second_append(make_store, st, "hurt", at=3)  # create, append, commit, append
    report = fsck(make_store.reopen())
    assert not report.ok
    # the deleted session's entry and content, and the damaged record's (which no read names)
    assert report.counts["unreferenced"] == {"entries": 2, "contents": 2, "blobs": 0}


class _Stop(Exception):
    pass


def test_a_sweep_stopped_midway_leaves_the_store_sound(make_store, monkeypatch):
    """A sweep that stops partway (here at its first progress call: a file store while
    it copies what it keeps, a PostgreSQL store after its first batch of deletions) has
    removed nothing retained: fsck finds no error, every session exports as before, and
    the next sweep removes the rest."""
    from agentsession_cas.backends.postgresql import maintenance

    monkeypatch.setattr(maintenance, "SWEEP_BATCH", 2)
    st = make_store()
    ids = garbage(st)
    before = exports(st)
    where = served(make_store, st)

    def stop(done: int, total: int) -> None:
        raise _Stop

    try:
        sweep(make_store, st, grace=0, progress=stop)
    except _Stop:
        pass
    report = fsck(where)
    assert report.ok, [p.message for p in report.errors]
    fresh = make_store.reopen()
    assert exports(fresh) == before
    for name in ids["kept"]:
        assert fresh.cat_object(name)
    sweep(make_store, st, grace=0)
    for name in ids["gone"]:
        assert not readable(where, name), name
    assert fsck(where).ok


def test_a_short_grace_sweep_refuses_beside_a_writer(make_store):
    """docs/reliability.md "Sweeping beside writers": a grace under SAFE_GRACE does not
    protect what a writer has sent and not yet recorded (RFC 0002: only its age protects
    an object no log names yet), so such a sweep refuses while a writer holds a session,
    naming it, and changes nothing; a dry run, a longer grace or ``force`` go ahead."""
    st = make_store()
    loose = st.put_blob(b"sent, not yet named")
    s = st.create(Header.new("held"))
    s.append(msg("m0"))
    where = served(make_store, st)
    before = held(where)
    with pytest.raises(WritersActiveError) as info:
        where.sweep(grace=0)
    assert info.value.code == "writers_active" and "held" in str(info.value)
    assert held(where) == before
    assert where.sweep(grace=0, dry_run=True).repack.dropped_names == [loose]
    assert where.sweep(grace=SAFE_GRACE).repack.dropped == 0
    s.close()
    if make_store.name != "http":  # (the server holds the sessions it served: a lease ends, not a close)
        assert where.sweep(grace=0).repack.dropped_names == [loose]


def test_a_session_made_again_under_its_id_retains_nothing_of_the_old(make_store):
    """RFC 0002: a session is deleted in one step, and one created afterwards under the
    same id starts from nothing: the old log's entries are no longer retained by it."""
    st = make_store()
    old_ids = written(st, Header.new("s"), "old 0", "old 1")
    st.delete("s")
    new_ids = written(st, Header.new("s"), "new 0", "new 1")
    export = st.export("s")
    res = sweep(make_store, st, grace=0)
    where = served(make_store, st)
    for eid in old_ids:
        assert not readable(where, eid), eid
    fresh = make_store.reopen()
    assert [fresh.entry(e).id for e in new_ids] == new_ids
    assert fresh.export("s") == export
    assert res.retained_envelopes == len(new_ids)


def test_a_compacted_log_retains_every_entry_it_folded(make_store):
    """A log compacted into a snapshot (the file backend at close, PostgreSQL's states)
    still retains every own entry, abandoned branches included, and a fork made from it
    keeps its prefix once it is deleted."""
    st = make_store()
    s = st.create(Header.new("big"))
    ids = [s.append(msg(f"m{i}")).id for i in range(80)]
    s.set_head(ids[40], expected=ids[-1])  # ids[41:] abandoned
    s.close()
    s = st.session("big")
    more = [s.append(msg(f"n{i}")).id for i in range(3)]
    s.close()
    f = st.create(Header.new("f", base=ids[60]))  # on the abandoned branch
    f_own = f.append(msg("f0")).id
    f.close()
    before = exports(st)
    assert sweep(make_store, st, grace=0).repack.dropped == 0
    st.delete("big")
    res = sweep(make_store, st, grace=0)
    fresh = make_store.reopen()
    assert fresh.export("f") == before["f"]
    assert res.retained_envelopes == 61 + 1
    where = served(make_store, st)
    for eid in ids[61:] + more:
        assert not readable(where, eid), eid
    assert fresh.entry(f_own).id == f_own


def _damage_second_append(make_store: StoreFactory, st: Store, sid: str, at: int = 2) -> None:
    """Make the log's record ``at`` (from 0: the create, then each append and its commit)
    unreadable, as damage would."""
    if make_store.name == "file":
        log = Path(st.root or "") / "sessions" / sid / "log"
        data = log.read_bytes()
        lines = data.split(b"\n")
        lines[at] = b"x" * len(lines[at])
        log.write_bytes(b"\n".join(lines))
    else:
        from test_postgresql import sql

        sql(make_store.url(), "UPDATE log SET record = '{not json' WHERE pos = %s "
            "AND session = (SELECT key FROM sessions WHERE id = %s)", [at + 1, sid])


def test_what_a_repair_kept_aside_goes_with_its_session(make_store):
    """What a repair kept aside of a damaged log (the file backend's ``log.damaged-*``,
    PostgreSQL's ``log_aside``) retains what it names while the session is kept, and goes
    with the session when it is deleted (RFC 0002: entries no remaining log names may
    then be swept); the sweep then counts no session for it."""
    if make_store.name not in ("file", "postgresql"):
        pytest.skip(f"{make_store.name}: no log to damage from outside")
    st = make_store()
    ids = written(st, Header.new("hurt"), *(f"hurt {i}" for i in range(4)))
    written(st, Header.new("keep"), "keep")
    _damage_second_append(make_store, st, "hurt")
    report = repair_session(st, "hurt")
    assert report.repaired and report.damaged_log
    kept = sweep(make_store, st, grace=0)
    assert all(readable(served(make_store, st), e) for e in ids)
    assert kept.sessions == 2  # (what a repair kept aside is no session of its own)
    st.delete("hurt")
    res = sweep(make_store, st, grace=0)
    assert res.sessions == 1
    where = served(make_store, st)
    for eid in ids:
        assert not readable(where, eid), eid


def test_media_is_held_once_and_kept_in_the_form_the_session_was_written_in(make_store):
    """RFC 0002 "Media": a blob is one object however many items name it; a store MUST
    NOT convert between a data URL and a sidecar blob (a projection carries media as the
    session was written); a blob goes with the last content naming it by ``sidecar:``,
    and a data URL, part of its content, retains no blob."""
    st = make_store()
    blob = st.put_blob(b"image bytes")
    assert st.put_blob(b"image bytes") == blob
    side = st.create(Header.new("side", media="sidecar"))
    side.append(image(blob))
    side.append(image(blob))
    side.close()
    data_url = "data:image/png;base64,aW1hZ2UgYnl0ZXM="  # the same bytes, inline
    inline = st.create(Header.new("inline", media="inline"))
    inline.append({"type": "item", "ts": ts(), "item": {"type": "message", "role": "user",
                   "content": [{"type": "input_image", "image_url": data_url}]}})
    inline.close()
    where = served(make_store, st)
    assert held(where)["blobs"] == {blob}
    side_export, inline_export = st.export("side"), st.export("inline")
    assert side_export.count(f"sidecar:{blob}".encode()) == 2 and b"data:" not in side_export
    assert data_url.encode() in inline_export and b"sidecar:" not in inline_export
    res = sweep(make_store, st, grace=0)
    assert res.retained_blobs == 1 and res.repack.dropped == 0
    st.delete("side")
    res = sweep(make_store, st, grace=0)
    assert res.repack.dropped_names.count(blob) == 1 and res.retained_blobs == 0
    assert held(where)["blobs"] == set()
    assert make_store.reopen().export("inline") == inline_export


def test_postgresql_streams_the_logs_in_one_snapshot(make_store, monkeypatch):
    """A PostgreSQL store's logs are read as they stream (two server-side cursors in one
    read-only repeatable-read transaction), not fetched whole before the first session's
    source: a sweep's memory does not grow with the store. While the first source is in
    hand the read is still open on the server; a session made and one deleted meanwhile
    are read as the snapshot had them (the deleted one read, the new one not); rows kept
    aside join their session's source, or (of a session gone) make one of their own, a
    row at a time."""
    if make_store.name != "postgresql":
        pytest.skip(f"{make_store.name}: no server-side read of the logs")
    import agentsession_cas.backends.postgresql as pg
    from test_postgresql import sql

    st = make_store()
    ids = {sid: written(st, Header.new(sid), f"{sid} turn") for sid in ("s0", "s1", "s2")}
    # Rows kept aside: of s1, and of sessions gone (an older release deleted a session
    # without them) keyed before and after every session held: each merged in its place.
    aside = {"s1": "sha256:" + "1" * 64, "before": "sha256:" + "2" * 64, "after": "sha256:" + "3" * 64}
    for key, entry in (("(SELECT key FROM sessions WHERE id = 's1')", aside["s1"]),
                       ("-1", aside["before"]), ("(SELECT max(key) + 100 FROM sessions)", aside["after"])):
        sql(make_store.url(), f"INSERT INTO log_aside (session, id, kept, pos, record) SELECT {key}, 'x', now(), 1, %s",
            [json.dumps({"op": "append", "seq": 1, "entry": entry})])
    monkeypatch.setattr(pg, "RETENTION_BATCH", 1, raising=False)
    backend = st.backend
    sources = backend.retention_sources()
    first = next(sources)
    reading = backend.db.query(
        "SELECT query FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'")
    assert any("retention_log" in q for (q,) in reading), reading
    late = written(st, Header.new("late"), "late turn")
    st.delete("s2")
    read = [first, *sources]
    named = [sorted(r["entry"] for r in src.records if r.get("op") == "append") for src in read]
    assert sorted(named) == sorted([[aside["before"]], ids["s0"], sorted(ids["s1"] + [aside["s1"]]), ids["s2"], [aside["after"]]])
    assert not {e for n in named for e in n} & set(late)


def test_the_rule_reads_objects_a_chunk_at_a_time(make_store, monkeypatch):
    """What the retention rule must read of the objects (the contents of envelopes no
    log's row said, the ``sidecar:`` names of contents) it reads through ``get_many``, a
    chunk at a time, not one ``get`` per object: on PostgreSQL one read each was a query
    per envelope, minutes of sweep for a 100,000-entry store (an import's log rows name no
    content)."""
    if make_store.name in ("memory", "http"):
        pytest.skip(f"{make_store.name}: get_many is get of each name (nothing to save)")
    st = make_store()
    s = st.create(Header.new("big"))
    for i in range(300):
        s.append(msg(f"turn {i}"), durable=False)
    s.close()
    st.import_bytes(st.export("big").replace(b'"id":"big"', b'"id":"copy"'), source="copy")
    where = served(make_store, st)
    objects = where.objects
    calls = {"get": 0, "get_many": 0}
    for name in calls:
        original = getattr(objects, name)

        def counted(*args: Any, _name: str = name, _original: Any = original) -> Any:
            calls[_name] += 1
            return _original(*args)

        monkeypatch.setattr(objects, name, counted)
    dry = sweep(make_store, st, grace=0, dry_run=True)
    assert dry.retained_envelopes == 300 and dry.retained_contents == 300
    assert calls["get"] < 10, calls
