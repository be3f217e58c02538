"""Exchange between stores (RFC 0002): push, fetch, handover, declare-record, take-back.

Two and three stores in temp directories, the library and the commands, and real
processes for the concurrent pushes and for a handover killed between its steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, read_session_bytes
from agentsession_cas.backends.files.remotes import remote_key
from agentsession_cas.errors import (
    AppendRefusedError,
    BadArgumentError,
    BadObjectError,
    HandoverIncompleteError,
    HeaderDiffersError,
    HeadMovedError,
    IncompletePushError,
    MirrorError,
    MissingObjectsError,
    NoSuchObjectError,
    NoSuchSessionError,
    NotRecordError,
    ReadOnlyError,
    StoreError,
    TransportError,
)
from agentsession_cas.exchange import endpoint
from agentsession_cas.exchange import operations as ex
from agentsession_cas.exchange.endpoint import StoreEndpoint
from agentsession_cas.exchange.local import LocalTransport, remote_url
from agentsession_cas.exchange.remembered import Remembered
from agentsession_cas.exchange.transport import PushRequest, RefPush
from agentsession_cas.format import parallel
from agentsession_cas.format.canonical import canonical_bytes
from agentsession_cas.format.hashing import entry_objects, sha256_ref
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from agentsession_cas.store.refs import Refs, header_ident
from agentsession_cli.main import main

REPO = Path(__file__).resolve().parents[1]
TS = "2026-09-17T12:00:00Z"


# -- helpers ------------------------------------------------------------------------


def store(tmp_path: Path, name: str) -> Store:
    return Store.init(tmp_path / name)


def user(text: str, n: int = 0) -> dict:
    return {"type": "item", "ts": f"2026-09-17T12:{n // 60 % 60:02d}:{n % 60:02d}Z",
            "item": {"type": "message", "role": "user", "content": text}}


def record(st: Store, sid: str, n: int, *, base: str | None = None, tag: str = "", **header) -> list[str]:
    """Create a record session: a config (unless a fork) then n user items; return own ids."""
    s = st.create(Header.new(sid, created_at=TS, base=base, **header))
    ids = []
    if base is None:
        ids.append(s.append({"type": "config", "ts": TS, "model": "m1"}).id)
    for i in range(n):
        ids.append(s.append(user(f"{sid}{tag} turn {i}", i)).id)
    return ids


def more(st: Store, sid: str, n: int, tag: str) -> list[str]:
    s = st.session(sid)
    return [s.append(user(f"{tag} {i}", i)).id for i in range(n)]


def count_objects(st: Store) -> int:
    return sum(1 for space in ("entries", "contents", "blobs") for _ in st.objects.names(space))


def tree_snapshot(root: Path, *, skip: tuple[str, ...] = ("tmp", "locks")) -> dict[str, bytes]:
    """Every file under a store (but temp and lock files), by relative path."""
    out = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel.split(os.sep)[0] in skip:
            continue
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.join(rel, f)] = fh.read()
    return out


def sessions_snapshot(root: Path) -> dict[str, bytes]:
    """What a store says about its sessions and refs (objects aside)."""
    return {k: v for k, v in tree_snapshot(root).items() if not k.startswith("objects")}


def reopen(path: Path, sid: str):
    return Store(path, readonly=True).read(sid)


def cli(st: Path | str, *args: str):
    return CliRunner().invoke(main, ["--store", str(st), *args], catch_exceptions=False)


def ok(result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


@pytest.fixture
def ab(tmp_path):
    a, b = store(tmp_path, "a"), store(tmp_path, "b")
    yield a, b, tmp_path / "b"
    a.close()
    b.close()


# -- push ---------------------------------------------------------------------------


def test_first_push_creates_a_mirror_that_projects_the_same(ab):
    a, b, broot = ab
    ids = record(a, "s1", 4)
    r = ex.push(a, broot, "s1")
    assert (r.created, r.entries, r.objects, r.outcome) == (True, 5, 10, "fast-forward")
    assert r.head_before is None and r.head_after == ids[-1] and r.mark == "mirror"
    assert r.bytes == sum(len(a.cat_object(i)[1]) + len(a.cat_object(a.entry(i).content_hash)[1]) for i in ids)
    got = reopen(broot, "s1")
    assert got.mark == "mirror" and got.head == ids[-1] and got.log_order == ids
    assert got.header.data == a.read("s1").header.data
    assert Store(broot).export("s1") == a.export("s1")


def test_a_mirror_refuses_local_appends_and_head_moves(ab):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    ex.push(a, broot, "s1")
    with Store(broot) as b2:
        s = b2.session("s1")
        with pytest.raises(MirrorError):
            s.append(user("local"))
        with pytest.raises(MirrorError):
            s.set_head(ids[0], expected=ids[-1])
    assert reopen(broot, "s1").log_order == ids


def test_incremental_push_sends_only_what_is_new(ab):
    a, b, broot = ab
    record(a, "s1", 5)
    ex.push(a, broot, "s1")
    before = count_objects(Store(broot))
    new = more(a, "s1", 3, "later")
    r = ex.push(a, broot, "s1")
    assert (r.objects, r.entries, r.complete, r.created) == (6, 3, False, False)
    assert count_objects(Store(broot)) == before + 6
    assert reopen(broot, "s1").log_order[-3:] == new


def test_pushing_twice_is_a_no_op_the_second_time(ab):
    a, b, broot = ab
    record(a, "s1", 3)
    ex.push(a, broot, "s1")
    snap = tree_snapshot(broot)
    r = ex.push(a, broot, "s1")
    assert (r.objects, r.bytes, r.entries, r.outcome, r.head_moved) == (0, 0, 0, "unchanged", False)
    assert tree_snapshot(broot) == snap


def test_shared_content_is_sent_once(ab):
    a, b, broot = ab
    s = a.create(Header.new("s1", created_at=TS))
    s.append({"type": "config", "ts": TS, "model": "m"})
    for i in range(3):  # one body, three envelopes
        s.append({"type": "item", "ts": f"2026-09-17T12:00:0{i + 1}Z", "item": {"type": "message", "role": "user", "content": "same"}})
    r = ex.push(a, broot, "s1")
    assert (r.entries, r.objects) == (4, 4 + 2)


def test_a_push_cut_short_between_creating_the_session_and_moving_its_head_finishes_when_run_again(ab, monkeypatch):
    """The remote lost the session: a push creates it there (its entries land, its head
    none, the remembered head being stale), then moves the head from none in a second
    request. Cut short between the two (the device went read-only, found by the torture
    test), the push run again finds the session holding the entries with no head: it
    moves the head from none, since no head there can be lost."""
    a, b, broot = ab
    ids = record(a, "s1", 3)
    ex.push(a, broot, "s1")
    Store(broot).delete("s1")
    real = ex._push_request
    calls: list[int] = []

    def second_fails(*args, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise OSError(30, "Read-only file system", "forced")
        return real(*args, **kw)

    monkeypatch.setattr(ex, "_push_request", second_fails)
    with pytest.raises(OSError):
        ex.push(a, broot, "s1")
    monkeypatch.undo()
    assert reopen(broot, "s1").head is None and reopen(broot, "s1").log_order == ids
    r = ex.push(a, broot, "s1")
    assert r.outcome == "fast-forward" and r.head_after == ids[-1], r
    assert any("no head" in n for n in r.notes), r.notes
    assert reopen(broot, "s1").head == ids[-1]
    assert Store(broot, readonly=True).export("s1") == a.export("s1")


def test_push_after_the_remote_lost_the_session_sends_the_whole_closure(ab):
    a, b, broot = ab
    ids = record(a, "s1", 3)
    ex.push(a, broot, "s1")
    Store(broot).delete("s1")
    ids += more(a, "s1", 2, "more")
    r = ex.push(a, broot, "s1")
    assert r.complete and r.created and r.entries == len(ids)
    # The head this store remembered there is stale: the session is created anew, head and all.
    assert r.outcome == "fast-forward" and r.head_after == ids[-1], r
    assert any("no longer held" in n for n in r.notes)
    got = reopen(broot, "s1")
    assert got.log_order == ids and got.head == ids[-1]
    assert Store(broot, readonly=True).export("s1") == a.export("s1")


def test_push_to_a_remote_whose_packed_copies_are_corrupt_sends_them_again(ab):
    """The remote holds the objects only in a pack whose bytes were damaged: 'missing'
    must not trust the pack index, or the push is refused forever for objects the
    receiver says it has. The sound copies sent land loose beside the pack and serve."""
    a, b, broot = ab
    ids = record(a, "s1", 3)
    ex.push(a, broot, "s1")
    fork_ids = record(a, "s2", 2, base=ids[-1])  # its prefix is s1's entries
    b.close()
    rb = Store(broot)
    rb.pack()
    rb.close()
    [pack] = [p for p in broot.rglob("*") if p.is_file() and p.suffix == ".pack"]
    data = bytearray(pack.read_bytes())
    for at in range(32, len(data) - 64, 7):
        data[at] ^= 0x55
    pack.write_bytes(bytes(data))
    with Store(broot) as rb:
        assert not any(rb.objects.held("entries", i) for i in ids)
    r = ex.push(a, broot, "s2")
    assert r.complete and r.created and r.outcome == "fast-forward", r
    with Store(broot) as rb:
        assert rb.export("s2") == a.export("s2")
        assert all(rb.objects.held("entries", i) for i in ids + fork_ids)


def test_exchange_commands_take_session_names_and_entry_prefixes(tmp_path):
    """push, fetch and repair name a session as every command does (unique id prefix,
    ref); push --expect takes an entry prefix of the session's own entries."""
    a, b = tmp_path / "a", tmp_path / "b"
    with Store.init(a) as st:
        ids = record(st, "sess-one", 2)
    Store.init(b).close()
    ok(cli(a, "ref", "update", "chat/one", "sess-one"))
    ok(cli(a, "push", "sess", str(b)))
    with Store.init(a) as st:
        ids += more(st, "sess-one", 1, "more")
    r = cli(a, "push", "ref:chat/one", str(b), "--expect", ids[-2][7:15])  # the head pushed before
    assert r.exit_code == 0, r.stderr
    with Store(b, readonly=True) as sb:
        assert sb.read("sess-one").head == ids[-1]
    one_error = cli(a, "push", "nope", str(b))
    assert one_error.exit_code == 1 and "no such session: nope" in one_error.stderr
    c = tmp_path / "c"
    Store.init(c).close()
    ok(cli(c, "fetch", "sess-one", str(b)))  # a name this store does not know goes to the remote as it is
    assert "not damaged" in ok(cli(c, "repair", "sess"))


def test_remembered_state_is_what_the_storage_format_says(ab):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    ex.push(a, broot, "s1")
    url = remote_url(broot)
    assert url == "file://" + os.path.realpath(broot)
    key = remote_key(url)
    assert len(key) == 32 and key == __import__("hashlib").sha256(url.encode()).hexdigest()[:32]
    d = Path(a.root) / "remotes" / key
    assert (d / "remote").read_bytes() == canonical_bytes({"url": url}) + b"\n"
    ident = header_ident(a.read("s1").header.data)
    want = {"head": ids[-1], "ident": ident, "last": ids[-1], "pushed": len(ids), "session": "s1"}
    assert (d / "sessions" / "s1").read_bytes() == canonical_bytes(want) + b"\n"
    state = Remembered(a, url).get("s1", ident)
    assert (state.head, state.pushed, state.last) == (ids[-1], 3, ids[-1])
    assert Remembered(a, url).get("s1", "sha256:" + "0" * 64) is None  # another incarnation


def test_remote_urls_name_one_store_however_spelled(tmp_path):
    b = store(tmp_path, "b")
    os.symlink(tmp_path / "b", tmp_path / "link")
    spelled = [str(tmp_path / "b"), "file://" + str(tmp_path / "b"), str(tmp_path / "link"),
               "file://localhost" + str(tmp_path / "b") + "/"]
    assert len({remote_url(s) for s in spelled}) == 1
    for bad in ("http://example.com/x", "file://host/x", "", "s3://bucket"):
        with pytest.raises(TransportError):
            remote_url(bad)
    b.close()


@pytest.mark.parametrize("url", ["file://", "file:", "file://localhost"])
def test_a_store_url_naming_no_path_is_refused_not_taken_for_the_working_directory(tmp_path, monkeypatch, url):
    """``--store file://`` named no directory, and opened (or with ``init`` made) a store in
    the working directory; now it is refused, naming what it lacks."""
    from agentsession_cas.errors import UnsupportedError
    from agentsession_cas.store.url import open_store

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsupportedError, match="names no path"):
        open_store(url, create=True)
    assert list(tmp_path.iterdir()) == []


def test_a_remote_that_is_no_store_is_refused(tmp_path):
    a = store(tmp_path, "a")
    record(a, "s1", 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TransportError, match="no store"):
        ex.push(a, tmp_path / "empty", "s1")
    with pytest.raises(TransportError, match="this store itself"):
        ex.push(a, a.root, "s1")
    a.close()


def test_only_the_record_may_push(ab):
    a, b, broot = ab
    record(a, "s1", 1)
    ex.push(a, broot, "s1")
    c = Store.init(Path(a.root).parent / "c")
    ex.fetch(c, broot, "s1")
    snap = tree_snapshot(broot)
    with pytest.raises(NotRecordError):
        ex.push(c, broot, "s1")
    assert tree_snapshot(broot) == snap
    c.close()


def test_a_session_another_process_is_writing_is_pushed_as_last_committed(tmp_path):
    a = store(tmp_path, "a")
    ids = record(a, "s1", 2)
    a.close()
    worker = subprocess.Popen([sys.executable, str(REPO / "tests" / "crash_worker.py"), "hold", str(tmp_path / "a"), "s1"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = worker.stdout.readline().split()
        assert line[0] == "READY"
        lazy = line[1]
        b = store(tmp_path, "b")
        with Store(tmp_path / "a") as a2:
            r = ex.push(a2, tmp_path / "b", "s1")  # the session is locked: a snapshot serves
            assert r.entries == len(ids)
        assert reopen(tmp_path / "b", "s1").log_order == ids and lazy not in reopen(tmp_path / "b", "s1").own
        c = store(tmp_path, "c")
        ex.fetch(c, tmp_path / "a", "s1")
        assert lazy not in c.read("s1").own and c.read("s1").head == ids[-1]
        with Store(tmp_path / "a") as a3, pytest.raises(Exception, match="locked"):
            ex.handover(a3, tmp_path / "b", "s1")
        # Had the writer pushed further than the snapshot holds, the snapshot pushes nothing,
        # and its older head does not move the remote's back.
        with Store(tmp_path / "a") as a4:
            url = remote_url(tmp_path / "b")
            ident = header_ident(a4.read("s1").header.data)
            state = Remembered(a4, url).get("s1", ident)
            Remembered(a4, url).set(type(state)("s1", ident, lazy, state.pushed + 1, lazy))
            snap = tree_snapshot(tmp_path / "b")
            r = ex.push(a4, tmp_path / "b", "s1")
            assert (r.objects, r.entries) == (0, 0) and "already pushed" in r.notes[0]
            assert tree_snapshot(tmp_path / "b") == snap
    finally:
        worker.stdin.write("\n")
        worker.stdin.flush()
        worker.wait(timeout=30)
    b.close()
    c.close()


# -- the head: compare-and-swap --------------------------------------------------------


def test_two_records_are_revealed_by_the_compare_and_swap(tmp_path):
    a, b, c = store(tmp_path, "a"), store(tmp_path, "b"), store(tmp_path, "c")
    ids = record(a, "s1", 2)
    ex.push(a, tmp_path / "b", "s1")
    # C takes a copy and declares itself the record (as if A were gone), then goes on.
    ex.fetch(c, tmp_path / "b", "s1")
    ex.declare_record(c, "s1")
    c_new = more(c, "s1", 2, "from c")
    assert ex.push(c, tmp_path / "b", "s1").outcome == "fast-forward"
    # A was not gone: it goes on too, and its push finds the head moved.
    a_new = more(a, "s1", 2, "from a")
    r = ex.push(a, tmp_path / "b", "s1")
    assert r.outcome == "refused" and not r.head_moved and r.entries == 2
    assert r.head_before == c_new[-1] and r.head_after == c_new[-1] and r.expected == ids[-1]
    assert "not the expected" in r.why
    got = reopen(tmp_path / "b", "s1")
    assert got.head == c_new[-1] and set(a_new) <= set(got.own)  # A's line is a branch there
    # A's remembered head is not advanced by a refusal: pushing again is refused again.
    assert ex.push(a, tmp_path / "b", "s1").outcome == "refused"
    for s in (a, b, c):
        s.close()


def test_a_wrong_expectation_leaves_a_branch_and_force_is_told_apart(ab):
    a, b, broot = ab
    ids = record(a, "s1", 3)
    ex.push(a, broot, "s1")
    new = more(a, "s1", 1, "x")
    r = ex.push(a, broot, "s1", expected=ids[0])
    assert (r.outcome, r.entries, r.head_after, r.forced) == ("refused", 1, ids[-1], False)
    assert new[0] in reopen(broot, "s1").own and reopen(broot, "s1").head == ids[-1]
    r = ex.push(a, broot, "s1", expected=ids[0], force=True)
    assert (r.outcome, r.forced, r.head_moved, r.entries, r.head_after) == ("forced", True, True, 0, new[0])
    more(a, "s1", 1, "y")
    r = ex.push(a, broot, "s1", force=True)  # the expectation was right: no force was needed
    assert (r.outcome, r.forced) == ("fast-forward", False)


def test_a_head_moved_back_by_the_record_is_moved_not_fast_forwarded(ab):
    a, b, broot = ab
    ids = record(a, "s1", 3)
    ex.push(a, broot, "s1")
    a.session("s1").set_head(ids[1], expected=ids[-1])
    r = ex.push(a, broot, "s1")
    assert (r.outcome, r.head_after, r.entries) == ("moved", ids[1], 0)
    branch = more(a, "s1", 1, "branch")
    r = ex.push(a, broot, "s1")
    assert (r.outcome, r.head_after) == ("fast-forward", branch[0])


def test_a_leaf_label_pushed_is_an_entry_and_the_head_moves_only_by_the_swap(ab):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    ex.push(a, broot, "s1")
    s = a.session("s1")
    label = s.append({"type": "label", "ts": TS, "label": "leaf", "target": ids[0]})
    assert label.outcome == "head-moved" and s.head == ids[0]
    r = ex.push(a, broot, "s1")
    got = reopen(broot, "s1")
    assert r.outcome == "moved" and got.head == ids[0] and label.id in got.leaf_labels
    assert Store(broot).export("s1") == a.export("s1")


def test_the_later_format_travels_and_an_unreadable_one_is_refused(ab):
    a, b, broot = ab
    header = Header.new("s1", created_at=TS)
    header.data["format"] = "agentsession/0.13"
    a.create(header)
    ex.push(a, broot, "s1")
    assert reopen(broot, "s1").header.format == "agentsession/0.13"
    a.session("s1").append({"type": "config", "ts": TS, "model": "m"})  # a 0.14 writer raises it
    r = ex.push(a, broot, "s1")
    assert r.entries == 1 and reopen(broot, "s1").header.format == "agentsession/0.14"
    later = dict(a.read("s1").header.data, id="s2", format="agentsession/0.99")
    with LocalTransport(broot) as t, pytest.raises(Exception, match="unsupported format"):
        t.push(PushRequest(header=later, prefix=[], entries=[], to=None, expected=None))
    assert "s2" not in Store(broot)


# -- fetch ---------------------------------------------------------------------------


def test_fetch_from_a_mirror_makes_a_mirror_and_fast_forwards(tmp_path):
    a, b, c = store(tmp_path, "a"), store(tmp_path, "b"), store(tmp_path, "c")
    ids = record(a, "s1", 2)
    ex.push(a, tmp_path / "b", "s1")
    r = ex.fetch(c, tmp_path / "b", "s1")
    assert (r.created, r.entries, r.objects, r.outcome, r.mark) == (True, 3, 6, "fast-forward", "mirror")
    assert r.head_after == ids[-1]
    new = more(a, "s1", 2, "n")
    ex.push(a, tmp_path / "b", "s1")
    r = ex.fetch(c, tmp_path / "b", "s1")
    assert (r.entries, r.objects, r.outcome, r.head_after) == (2, 4, "fast-forward", new[-1])
    assert c.export("s1") == a.export("s1")
    r = ex.fetch(c, tmp_path / "b", "s1")
    assert (r.entries, r.objects, r.outcome) == (0, 0, "unchanged")
    for s in (a, b, c):
        s.close()


def test_a_stale_mirrors_fetch_moves_nothing_and_says_so(tmp_path):
    a, b, c = store(tmp_path, "a"), store(tmp_path, "b"), store(tmp_path, "c")
    record(a, "s1", 2)
    ex.push(a, tmp_path / "b", "s1")  # B stops here
    new = more(a, "s1", 2, "n")
    ex.push(a, tmp_path / "c", "s1")  # C is ahead
    snap = sessions_snapshot(tmp_path / "c")
    r = ex.fetch(c, tmp_path / "b", "s1")
    assert (r.entries, r.objects, r.outcome, r.head_after) == (0, 0, "not-moved", new[-1])
    assert "does not descend" in r.why
    assert sessions_snapshot(tmp_path / "c") == snap
    for s in (a, b, c):
        s.close()


def test_a_fetch_into_the_record_admits_entries_and_leaves_its_head(tmp_path):
    a, b = store(tmp_path, "a"), store(tmp_path, "b")
    ids = record(a, "s1", 2)
    ex.push(a, tmp_path / "b", "s1")
    ex.declare_record(b, "s1")  # two records: B goes on by itself
    theirs = more(b, "s1", 1, "b")
    r = ex.fetch(a, tmp_path / "b", "s1")
    assert (r.entries, r.outcome) == (1, "not-moved") and "its head moves only by its own writers" in r.why
    assert a.session("s1").head == ids[-1] and theirs[0] in a.session("s1").own
    a.close()
    b.close()


def test_fetch_of_a_session_the_remote_lacks(ab):
    a, b, broot = ab
    with pytest.raises(NoSuchSessionError):
        ex.fetch(a, broot, "nope")


# -- forks ---------------------------------------------------------------------------


def test_a_push_of_a_fork_carries_the_prefix(ab):
    a, b, broot = ab
    origin = record(a, "o", 4)
    fork = record(a, "f", 2, base=origin[2], parent_session="o")
    r = ex.push(a, broot, "f")
    assert r.created and r.entries == 2 and r.objects == 2 * (3 + 2)
    got = reopen(broot, "f")
    assert got.base == origin[2] and got.prefix == origin[:3] and got.log_order == fork
    assert "o" not in Store(broot)  # the prefix is held without its session
    assert Store(broot).export("f") == a.export("f")
    r = ex.push(a, broot, "o")  # the origin later: only what the fork did not bring
    assert r.objects == 2 * 2 and r.entries == 5
    assert Store(broot).export("o") == a.export("o")


def test_a_fork_whose_media_differs_from_the_held_origin_is_refused(ab):
    a, b, broot = ab
    origin = record(a, "o", 2)
    ex.push(a, broot, "o")
    # A fork header claiming other media than its origin: build it through the endpoint.
    header = Header.new("f", created_at=TS, base=origin[1], media="sidecar").data
    with pytest.raises(StoreError, match="media") as ei:
        LocalTransport(broot).push(PushRequest(header=header, prefix=origin[:2], entries=[], to=origin[1], expected=origin[1]))
    assert ei.value.code == "bad_base"  # as a create and an import of the same fork say, not a store fault
    assert "f" not in Store(broot)


def test_a_fork_whose_format_is_earlier_than_the_held_origin_is_refused(ab):
    """RFC 0002 "Sessions": a fork's format is no earlier than that of the session whose
    own entries include its base; a push is refused as a create is (``bad_base``)."""
    a, b, broot = ab
    origin = record(a, "o", 2)
    ex.push(a, broot, "o")
    assert Store(broot).header("o").format != "agentsession/0.5"
    header = Header.new("f", created_at=TS, base=origin[1]).data
    header["format"] = "agentsession/0.5"
    with pytest.raises(StoreError, match="format") as ei:
        LocalTransport(broot).push(PushRequest(header=header, prefix=origin[:2], entries=[], to=origin[1], expected=origin[1]))
    assert ei.value.code == "bad_base"
    assert "f" not in Store(broot)


# -- refused pushes leave the remote as it was -------------------------------------------


def test_a_different_header_under_the_same_id_is_refused_before_anything_is_sent(ab):
    a, b, broot = ab
    record(a, "s1", 2)
    record(b, "s1", 1, tag="other", cwd="/elsewhere")  # another session under the same id
    b.close()
    snap = tree_snapshot(broot)
    with pytest.raises(HeaderDiffersError):
        ex.push(a, broot, "s1")
    assert tree_snapshot(broot) == snap
    # The receiver refuses it too, whatever a sender checked.
    header = dict(a.read("s1").header.data)
    with pytest.raises(HeaderDiffersError):
        LocalTransport(broot).push(PushRequest(header=header, prefix=[], entries=[], to=None, expected=None))
    assert sessions_snapshot(broot) == {k: v for k, v in snap.items() if not k.startswith("objects")}


def test_a_fetch_of_another_session_under_a_held_id_is_refused_before_anything_is_fetched(tmp_path):
    a, c = store(tmp_path, "a"), store(tmp_path, "c")
    record(a, "s1", 2)
    record(c, "s1", 1, cwd="/elsewhere")
    before = count_objects(c)
    with pytest.raises(HeaderDiffersError):
        ex.fetch(c, tmp_path / "a", "s1")
    assert count_objects(c) == before and len(c.read("s1")) == 2
    a.close()
    c.close()


def test_a_torn_object_at_the_receiver_is_reported_missing_and_replaced(ab, monkeypatch):
    a, b, broot = ab
    ids = record(a, "s1", 3)  # 8 objects: sent as loose files

    def boom(point: str) -> None:
        if point == "push:objects-sent":
            raise OSError("interrupted")

    monkeypatch.setattr(ex, "_fault", boom)
    with pytest.raises(OSError):
        ex.push(a, broot, "s1")
    monkeypatch.undo()
    torn = Path(Store(broot).objects.path("entries", ids[1]))
    torn.write_bytes(torn.read_bytes()[:10])  # what a crash can leave of a loose file
    r = ex.push(a, broot, "s1")
    assert r.objects == 1 and r.entries == 4
    assert Store(broot).export("s1") == a.export("s1")


def test_objects_swept_before_the_push_named_them_are_sent_again(ab, monkeypatch):
    a, b, broot = ab
    ids = record(a, "s1", 3)

    def boom(point: str) -> None:
        if point == "push:objects-sent":
            raise OSError("interrupted")

    monkeypatch.setattr(ex, "_fault", boom)
    with pytest.raises(OSError):
        ex.push(a, broot, "s1")  # the objects are there, named by no log
    objects = Store(broot).objects
    old = 1_000_000_000 * 10**9  # 2001: far older than any grace period
    for i in ids:
        os.utime(objects.path("entries", i), ns=(old, old))

    def sweep_one(point: str) -> None:  # a sweep takes one of them before the push names it
        if point == "push:objects-sent":
            os.unlink(objects.path("entries", ids[2]))

    monkeypatch.setattr(ex, "_fault", sweep_one)
    r = ex.push(a, broot, "s1")
    assert (r.objects, r.entries) == (1, 4)  # reported missing, sent again, admitted
    assert Store(broot).export("s1") == a.export("s1")
    # Every file the push named and did not write was touched first, so a sweep spares it.
    assert all(os.stat(objects.path("entries", i)).st_mtime_ns > old for i in ids)


def _raw_entry(data: dict) -> tuple[str, list[tuple[str, str, bytes]]]:
    entry_id, chash, content, env = entry_objects(data)
    return entry_id, [("contents", chash, content), ("entries", entry_id, env)]


@pytest.fixture(params=["here", "helper"])
def checked(request, monkeypatch):
    """Where an admission's line rules run: in this process (a small push), or on the
    helper process (:mod:`~agentsession_cas.format.parallel`), forced whatever the size,
    its answers waited for, a few lines a block. A list of the entries checked here."""
    if request.param == "helper":
        monkeypatch.setenv(parallel.ENV, "2")
        monkeypatch.setattr(parallel, "WAIT", True)
        monkeypatch.setattr(endpoint, "_BLOCK", 512)
    else:
        monkeypatch.setenv(parallel.ENV, "1")
    here: list[str] = []
    real = endpoint._check_read

    def counted(objects, r, missing, keep):
        here.append(r.id)
        return real(objects, r, missing, keep)

    monkeypatch.setattr(endpoint, "_check_read", counted)
    return here


def test_a_push_checked_on_the_helper_admits_what_one_process_admits(tmp_path, monkeypatch):
    a, b, c = store(tmp_path, "a"), store(tmp_path, "b"), store(tmp_path, "c")
    ids = record(a, "s1", 30)
    s = a.session("s1")
    ids.append(s.append({"type": "label", "ts": TS, "parent": ids[-1], "target": ids[3], "label": "seen"}).id)
    ids.append(s.append(user("after the label", 31)).id)
    s.close()
    monkeypatch.setenv(parallel.ENV, "1")
    ex.push(a, tmp_path / "c", "s1")
    monkeypatch.setenv(parallel.ENV, "2")
    monkeypatch.setattr(parallel, "WAIT", True)
    monkeypatch.setattr(endpoint, "_BLOCK", 512)
    here: list[str] = []
    real = endpoint._check_read
    monkeypatch.setattr(endpoint, "_check_read", lambda objects, r, *args: here.append(r.id) or real(objects, r, *args))
    r = ex.push(a, tmp_path / "b", "s1")
    assert (r.entries, r.outcome) == (len(ids), "fast-forward")
    assert here == []  # every entry as the helper found it
    one, helped = Store(tmp_path / "c", readonly=True), Store(tmp_path / "b", readonly=True)
    assert helped.export("s1") == one.export("s1") == a.export("s1")
    assert helped.read("s1").summary() == one.read("s1").summary()
    for st in (a, b, c, one, helped):
        st.close()


def test_a_new_sessions_rule_refusal_waits_for_its_turn_and_a_reordered_push_is_admitted(ab, checked):
    """A session the receiver lacks has its rules run as its entries are checked: a rule
    refusal still comes after every entry's line rules and the objects' presence, and a
    push naming children before their parents is admitted in admission order."""
    a, b, broot = ab
    ids = record(a, "s1", 3)
    header = dict(a.read("s1").header.data)
    orphan, objs = _raw_entry({"type": "item", "parent": "sha256:" + "ab" * 32, "ts": TS,
                               "item": {"type": "message", "role": "user", "content": "orphan"}})
    odd, odd_objs = _raw_entry({"type": "notcore", "parent": ids[-1], "ts": TS, "x": 1})
    snap = sessions_snapshot(broot)
    with LocalTransport(broot) as t:
        sent = [(space, name, data) for e in ids for space, name, data in _raw_objects(a, e)]
        t.put_objects(sent + objs + odd_objs, len(sent) + 4)
        with pytest.raises(AppendRefusedError, match="unknown entry type"):
            t.push(PushRequest(header=header, prefix=[], entries=ids + [orphan, odd], to=ids[-1], expected=None))
        with pytest.raises(AppendRefusedError, match="does not appear earlier in the session"):
            t.push(PushRequest(header=header, prefix=[], entries=ids + [orphan], to=ids[-1], expected=None))
        with pytest.raises(MissingObjectsError):
            t.push(PushRequest(header=header, prefix=[], entries=ids + [orphan, "sha256:" + "cd" * 32], to=ids[-1],
                               expected=None))
        assert sessions_snapshot(broot) == snap
        adm = t.push(PushRequest(header=header, prefix=[], entries=list(reversed(ids)), to=ids[-1], expected=None))
    assert (adm.admitted, adm.outcome) == (len(ids), "fast-forward")
    assert reopen(broot, "s1").log_order == ids and Store(broot).export("s1") == a.export("s1")


def test_a_whole_sessions_admission_holds_its_entries_parked_not_whole(ab, monkeypatch):
    """A fetch (or push) of a session the receiver lacks keeps each entry in its summary
    form once the rules took it, and the rules' own copies parked past their window (read
    back from the store if a rule consults one): what it holds grows by an id an entry,
    not by the entries (a fetch of 100,000 entries held them all)."""
    a, b, broot = ab
    ids = record(a, "s1", 60)
    settled: list = []
    seen: list = []
    settle, check_rules = endpoint.Parking.settle, StoreEndpoint._check_rules
    monkeypatch.setattr(endpoint.Parking, "WINDOW", 8)
    monkeypatch.setattr(endpoint.Parking, "settle", lambda self, e, n=0: (settled.append(e), settle(self, e, n))[1])

    def spied(self, session, header, prefix, ordered, fed=None):
        seen.extend(c.entry for c in ordered)
        return check_rules(self, session, header, prefix, ordered, fed)

    monkeypatch.setattr(StoreEndpoint, "_check_rules", spied)
    result = ex.fetch(b, a.root, "s1")
    assert result.entries == len(ids) == len(settled) == len(seen)
    assert [e.parked for e in settled] == [True] * (len(ids) - 8) + [False] * 8
    assert all("item" not in e.data for e in seen)  # the summary forms: no item's members
    assert b.export("s1") == a.export("s1")


def _raw_objects(st: Store, entry_id: str) -> list[tuple[str, str, bytes]]:
    env = st.objects.get("entries", entry_id)
    chash = json.loads(env)["content"]
    return [("contents", chash, st.objects.get("contents", chash)), ("entries", entry_id, env)]


def test_a_push_breaking_the_parent_rule_is_refused_and_changes_no_session(ab, checked):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    ex.push(a, broot, "s1")
    snap = sessions_snapshot(broot)
    orphan, objs = _raw_entry({"type": "item", "parent": "sha256:" + "ab" * 32, "ts": TS,
                               "item": {"type": "message", "role": "user", "content": "orphan"}})
    t = LocalTransport(broot)
    t.put_objects(objs, len(objs))
    header = dict(a.read("s1").header.data)
    with pytest.raises(AppendRefusedError, match="does not appear earlier in the session"):
        t.push(PushRequest(header=header, prefix=[], entries=ids + [orphan], to=ids[-1], expected=ids[-1]))
    # A partial push (the sender thinks the rest is there) is told to send it all instead.
    with pytest.raises(IncompletePushError):
        t.push(PushRequest(header=header, prefix=[], entries=[orphan], to=ids[-1], expected=ids[-1], complete=False))
    t.close()
    assert sessions_snapshot(broot) == snap


@pytest.mark.parametrize("bad", [
    {"type": "label", "label": "leaf", "target": None, "synthetic": True},  # (a label without target is refused as such)
    {"type": "label", "label": "leaf", "synthetic": True},
    {"type": "notcore", "x": 1},
    {"type": "item", "ts": "2026-09-17T12:00:00.000Z", "item": {}},
])
def test_entries_an_append_would_refuse_are_refused_by_a_push(ab, bad, checked):
    a, b, broot = ab
    ids = record(a, "s1", 1)
    ex.push(a, broot, "s1")
    snap = sessions_snapshot(broot)
    data = {"parent": ids[-1], "ts": TS, **bad}
    entry_id, objs = _raw_entry(data)
    with LocalTransport(broot) as t:
        t.put_objects(objs, len(objs))
        with pytest.raises(AppendRefusedError) as by_push:
            t.push(PushRequest(header=dict(a.read("s1").header.data), prefix=[], entries=ids + [entry_id],
                               to=ids[-1], expected=ids[-1]))
    assert sessions_snapshot(broot) == snap
    # refused as the append refuses it: the same code and rule (a synthetic label was
    # bad_entry for a push, synthetic for an append)
    with pytest.raises(AppendRefusedError) as by_append:
        a.session("s1").append(dict(data))
    assert (by_push.value.code, by_push.value.rule) == (by_append.value.code, by_append.value.rule)
    assert by_push.value.entry == entry_id
    if "target" in bad:
        assert by_push.value.code == "synthetic"


def test_non_canonical_objects_are_refused(ab, checked):
    a, b, broot = ab
    ids = record(a, "s1", 1)
    ex.push(a, broot, "s1")
    content = b'{"item": {"type":"message"}}'  # hashes fine, but is not canonical JSON
    chash = sha256_ref(content)
    env = canonical_bytes({"content": chash, "parent": ids[-1], "ts": TS, "type": "item"})
    eid = sha256_ref(env)
    with LocalTransport(broot) as t:
        t.put_objects([("contents", chash, content), ("entries", eid, env)], 2)
        with pytest.raises(AppendRefusedError, match="canonical"):
            t.push(PushRequest(header=dict(a.read("s1").header.data), prefix=[], entries=ids + [eid],
                               to=eid, expected=ids[-1]))
    assert reopen(broot, "s1").log_order == ids


def test_objects_that_do_not_hash_to_their_names_are_refused(ab):
    a, b, broot = ab
    before = count_objects(b)
    items = [("contents", sha256_ref(b"x%d" % i), b"x%d" % i) for i in range(70)]
    items[50] = ("contents", sha256_ref(b"good"), b"evil")
    with LocalTransport(broot) as t:
        for batch in (items, items[45:55]):  # a pack, and loose files
            with pytest.raises(BadObjectError):
                t.put_objects(batch, len(batch))
    assert count_objects(Store(broot)) == before


def test_a_pushed_ref_must_name_the_pushed_session_and_a_read_only_store_receives_nothing(ab):
    a, b, broot = ab
    ids = record(a, "s1", 1)
    record(a, "s2", 1)
    ex.push(a, broot, "s2")
    ex.push(a, broot, "s1")
    header = dict(a.read("s1").header.data)
    with LocalTransport(broot) as t:
        adm = t.push(PushRequest(header=header, prefix=[], entries=ids, to=ids[-1], expected=ids[-1],
                                 refs=[RefPush("chat/a", None, "s2"), RefPush("chat/b", None, "s1")]))
    assert [(r.name, r.moved) for r in adm.refs] == [("chat/a", False), ("chat/b", True)]
    assert "must name the pushed session" in adm.refs[0].why and Refs(Store(broot)).get("chat/a") is None
    endpoint = StoreEndpoint(Store(broot, readonly=True))
    with pytest.raises(ReadOnlyError):
        endpoint.receive(PushRequest(header=header, prefix=[], entries=ids, to=ids[-1], expected=ids[-1]))
    with pytest.raises(ReadOnlyError):
        endpoint.put_objects([], 0)
    assert endpoint.session_view("s1").entries == ids  # a read-only store still serves


def test_a_push_naming_objects_the_receiver_lacks_admits_nothing(ab):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    snap = sessions_snapshot(broot)
    with LocalTransport(broot) as t, pytest.raises(MissingObjectsError) as err:
        t.push(PushRequest(header=dict(a.read("s1").header.data), prefix=[], entries=ids, to=ids[-1], expected=None))
    assert set(err.value.missing["entries"]) == set(ids)
    assert sessions_snapshot(broot) == snap


def test_an_interrupted_transfer_leaves_both_stores_valid_and_a_rerun_completes(ab, monkeypatch):
    a, b, broot = ab
    ids = record(a, "s1", 40)  # 82 objects: sent as a pack

    def boom(point: str) -> None:
        if point == "push:objects-sent":
            raise OSError("the link went down")

    monkeypatch.setattr(ex, "_fault", boom)
    with pytest.raises(OSError):
        ex.push(a, broot, "s1")
    assert "s1" not in Store(broot) and count_objects(Store(broot)) == 82
    assert a.read("s1").mark == "record" and a.read("s1").head == ids[-1]
    assert fsck(broot).problems == [] and fsck(a.root).ok  # both stores valid (a is open: its HEAD index may lag)
    assert Remembered(a, remote_url(broot)).get("s1", header_ident(a.read("s1").header.data)) is None
    # Later, with the session there, an interruption after the objects changes no log.
    monkeypatch.undo()
    ex.push(a, broot, "s1")
    new = more(a, "s1", 3, "late")
    snap = sessions_snapshot(broot)
    monkeypatch.setattr(ex, "_fault", boom)
    with pytest.raises(OSError):
        ex.push(a, broot, "s1")
    assert sessions_snapshot(broot) == snap and reopen(broot, "s1").head == ids[-1]
    assert fsck(broot).problems == []
    monkeypatch.undo()
    r = ex.push(a, broot, "s1")
    assert (r.objects, r.entries, r.outcome) == (0, 3, "fast-forward")  # the objects were there
    assert reopen(broot, "s1").log_order == ids + new


def test_an_unresolved_sidecar_blob_stops_a_push_before_anything_is_sent(ab):
    a, b, broot = ab
    s = a.create(Header.new("m1", created_at=TS, media="sidecar"))
    blob = a.put_blob(b"\x89PNG fake image bytes")
    missing = sha256_ref(b"never stored")
    s.append({"type": "item", "ts": TS, "item": {"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": f"sidecar:{blob}"}]}})
    ex.push(a, broot, "m1")
    assert Store(broot).blob(blob) == b"\x89PNG fake image bytes"
    out = Path(a.root).parent / "out"
    out.mkdir()
    Store(broot).export_to("m1", out / "m1.jsonl")  # the mirror projects with its media
    assert (out / "m1" / blob[7:]).read_bytes() == b"\x89PNG fake image bytes"
    s.append({"type": "item", "ts": TS, "item": {"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": f"sidecar:{missing}"}]}})
    snap = tree_snapshot(broot)
    with pytest.raises(StoreError, match="unresolved blob"):
        ex.push(a, broot, "m1")
    assert tree_snapshot(broot) == snap


# -- handover, declare-record, take-back ---------------------------------------------------


def test_handover_makes_the_remote_the_record_and_this_store_a_mirror(ab):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    r = ex.handover(a, broot, "s1")
    assert r.handover and r.mark == "record" and r.action == "handover"
    assert a.session("s1").mark == "mirror" and reopen(broot, "s1").mark == "record"
    assert reopen(broot, "s1").head == a.session("s1").head == ids[-1]  # the remote holds this store's line
    with pytest.raises(MirrorError):
        a.session("s1").append(user("no"))
    with pytest.raises(NotRecordError):
        ex.push(a, broot, "s1")
    with Store(broot) as b2:
        b2.session("s1").append(user("the new record writes"))
    with pytest.raises(NotRecordError):  # a handover done is not done again
        ex.handover(a, broot, "s1")


def test_a_handover_whose_head_would_not_move_is_refused_before_anything_lands(ab):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    ex.push(a, broot, "s1")
    more(a, "s1", 1, "a")
    snap = sessions_snapshot(broot)
    with pytest.raises(HeadMovedError, match="before anything landed"):
        ex.handover(a, broot, "s1", expected=ids[0])
    assert sessions_snapshot(broot) == snap and a.session("s1").mark == "record"


def test_a_handover_failing_between_its_steps_leaves_two_records_and_a_retry_finishes(ab, monkeypatch):
    a, b, broot = ab
    record(a, "s1", 2)

    def boom(point: str) -> None:
        if point == "handover:between":
            raise OSError("power cut")

    monkeypatch.setattr(ex, "_fault", boom)
    with pytest.raises(OSError):
        ex.handover(a, broot, "s1")
    assert a.session("s1").mark == "record" and reopen(broot, "s1").mark == "record"  # two, never none
    monkeypatch.undo()
    r = ex.handover(a, broot, "s1")
    assert r.handover and (r.objects, r.entries, r.outcome) == (0, 0, "unchanged")
    assert a.session("s1").mark == "mirror" and reopen(broot, "s1").mark == "record"
    ops = [(rec["op"], rec.get("mark")) for rec in reopen(broot, "s1").records()]
    # Created a mirror; the record mark written in the one commit that admitted the entries
    # and moved the head (never on a session holding nothing); the retry wrote no mark. The
    # checkpoint after it says the appends' objects are in objects/ (they came before them).
    assert ops == [("create", "mirror")] + [("append", None)] * 3 + [
        ("head", None), ("mark", "record"), ("commit", None), ("checkpoint", None)]


def test_a_failed_clear_is_reported_as_two_records(ab, monkeypatch):
    a, b, broot = ab
    record(a, "s1", 1)
    s = a.session("s1")

    def fail(mark: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(s, "set_mark", fail)
    with pytest.raises(HandoverIncompleteError, match="two records"):
        ex.handover(a, broot, "s1")
    assert reopen(broot, "s1").mark == "record"


HANDOVER_KILLED = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    from agentsession_cas.exchange import operations as ex
    from agentsession_cas.store import Store

    def die(point):
        if point == "handover:between":
            os.kill(os.getpid(), signal.SIGKILL)

    ex._fault = die
    with Store({a!r}) as a:
        ex.handover(a, {b!r}, "s1")
    print("not killed")
""")


def test_a_handover_killed_between_its_steps_and_retried_finishes(tmp_path):
    a, b = store(tmp_path, "a"), store(tmp_path, "b")
    ids = record(a, "s1", 3)
    a.close()
    b.close()
    script = HANDOVER_KILLED.format(repo=str(REPO), a=str(tmp_path / "a"), b=str(tmp_path / "b"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert reopen(tmp_path / "a", "s1").mark == "record"
    assert reopen(tmp_path / "b", "s1").mark == "record" and reopen(tmp_path / "b", "s1").head == ids[-1]
    assert fsck(tmp_path / "a").ok and fsck(tmp_path / "b").ok
    result = cli(tmp_path / "a", "handover", "s1", str(tmp_path / "b"), "--json")
    data = json.loads(ok(result))
    assert data["handover"] and data["head"]["outcome"] == "unchanged" and data["entries"] == 0
    assert reopen(tmp_path / "a", "s1").mark == "mirror" and reopen(tmp_path / "b", "s1").mark == "record"


def test_declare_record_here_and_at_a_remote(ab):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    ex.push(a, broot, "s1")
    with pytest.raises(HeadMovedError):
        ex.declare_record(b, "s1", expected=ids[0])
    assert b.read("s1").mark == "mirror"
    d = ex.declare_record(b, "s1", expected=ids[-1])
    assert d.changed and b.read("s1").mark == "record"
    assert not ex.declare_record(b, "s1").changed  # already the record
    c = Store.init(Path(a.root).parent / "c")
    ex.fetch(c, broot, "s1")
    c.close()  # the fetch left the session open in c, as any command would until it exits
    with pytest.raises(HeadMovedError):
        ex.declare_record(a, "s1", remote=Path(a.root).parent / "c", expected=ids[0])
    d = ex.declare_record(a, "s1", remote=Path(a.root).parent / "c")
    assert d.changed and reopen(Path(a.root).parent / "c", "s1").mark == "record"


def test_take_back_fetches_what_the_remote_added_and_moves_the_record_here(ab):
    a, b, broot = ab
    record(a, "s1", 2)
    ex.handover(a, broot, "s1")
    with Store(broot) as b2:
        added = [b2.session("s1").append(user(f"remote {i}", i)).id for i in range(2)]
    r = ex.take_back(a, broot, "s1")
    assert r.action == "take-back" and r.handover and r.entries == 2 and r.head_after == added[-1]
    assert a.session("s1").mark == "record" and reopen(broot, "s1").mark == "mirror"
    mine = more(a, "s1", 1, "back home")
    assert ex.push(a, broot, "s1").outcome == "fast-forward"  # the head seen at take-back is expected
    assert reopen(broot, "s1").head == mine[0]


def test_take_back_interrupted_between_its_steps_is_finished_by_a_retry(ab, monkeypatch):
    a, b, broot = ab
    record(a, "s1", 2)
    ex.handover(a, broot, "s1")

    def boom(point: str) -> None:
        if point == "take-back:between":
            raise OSError("lost")

    monkeypatch.setattr(ex, "_fault", boom)
    with pytest.raises(OSError):
        ex.take_back(a, broot, "s1")
    assert a.session("s1").mark == "record" and reopen(broot, "s1").mark == "record"  # two, never none
    monkeypatch.undo()
    r = ex.take_back(a, broot, "s1")
    assert r.handover and a.session("s1").mark == "record" and reopen(broot, "s1").mark == "mirror"
    r = ex.take_back(a, broot, "s1")
    assert not r.handover and "nothing to take back" in r.notes[0]


def test_take_back_when_the_remote_writers_went_on_leaves_one_record_there(ab, monkeypatch):
    a, b, broot = ab
    record(a, "s1", 2)
    ex.handover(a, broot, "s1")

    def remote_writes(point: str) -> None:
        if point == "take-back:between":
            with Store(broot) as b2:
                b2.session("s1").append(user("still writing"))

    monkeypatch.setattr(ex, "_fault", remote_writes)
    with pytest.raises(HeadMovedError, match="mirror of session s1 again"):
        ex.take_back(a, broot, "s1")
    assert a.session("s1").mark == "mirror" and reopen(broot, "s1").mark == "record"


def test_take_back_from_a_mirror_is_refused(tmp_path):
    a, b, c = store(tmp_path, "a"), store(tmp_path, "b"), store(tmp_path, "c")
    record(a, "s1", 1)
    ex.push(a, tmp_path / "b", "s1")
    with pytest.raises(NotRecordError):
        ex.take_back(c, tmp_path / "b", "s1")
    assert c.read("s1").mark == "mirror"
    for s in (a, b, c):
        s.close()


# -- refs travel when asked ----------------------------------------------------------------


def test_refs_travel_with_a_push_by_compare_and_swap(ab):
    a, b, broot = ab
    record(a, "s1", 1)
    record(a, "s2", 1, tag="next")
    refs = Refs(a)
    refs.update("chat/C1", "s1", expected=None)
    r = ex.push(a, broot, "s1", refs=["chat/C1"])
    assert [(x.name, x.moved, x.current) for x in r.refs] == [("chat/C1", True, "s1")]
    assert Refs(Store(broot)).resolve("chat/C1") == "s1"
    # The conversation goes on in s2: the ref moves from s1 there, as remembered.
    refs.update("chat/C1", "s2", expected="s1")
    r = ex.push(a, broot, "s2", refs=["chat/C1"])
    assert r.refs[0].moved and Refs(Store(broot)).resolve("chat/C1") == "s2"
    assert ex.push(a, broot, "s2", refs=["chat/C1"]).refs[0].moved  # a retried push is safe
    # Someone moved the ref there: refused, reported, and the entries land anyway.
    Refs(Store(broot)).update("chat/C1", "s1", expected="s2")
    more(a, "s2", 1, "x")
    r = ex.push(a, broot, "s2", refs=["chat/C1"])
    assert r.entries == 1 and not r.refs[0].moved and r.refs[0].current == "s1" and "moved" in r.refs[0].why
    r = ex.push(a, broot, "s2", refs=[("chat/C1", "s1")])
    assert r.refs[0].moved and Refs(Store(broot)).resolve("chat/C1") == "s2"
    with pytest.raises(StoreError, match="not the pushed session"):
        ex.push(a, broot, "s1", refs=["chat/C1"])
    with pytest.raises(StoreError, match="no such ref"):
        ex.push(a, broot, "s1", refs=["nope"])


def test_refs_travel_with_a_fetch(tmp_path):
    a, b = store(tmp_path, "a"), store(tmp_path, "b")
    record(a, "s1", 1)
    Refs(a).update("chat/C1", "s1", expected=None)
    r = ex.fetch(b, tmp_path / "a", "s1", refs=["chat/C1", "chat/none"])
    assert [(x.name, x.moved) for x in r.refs] == [("chat/C1", True), ("chat/none", False)]
    assert Refs(b).resolve("chat/C1") == "s1"
    a.close()
    b.close()


# -- receiving into a parked session -----------------------------------------------------


def test_a_long_lived_transport_notices_a_session_changed_by_someone_else(tmp_path):
    a, b, c = store(tmp_path, "a"), store(tmp_path, "b"), store(tmp_path, "c")
    record(a, "s1", 2)
    t = LocalTransport(tmp_path / "b")
    ex.push(a, t, "s1")  # the session at B is now parked in t, unlocked
    view = t.session_view("s1")
    assert (view.head, view.mark, view.entries) == (a.read("s1").head, "mirror", a.read("s1").log_order)
    # Meanwhile another process's exchange changes B's session: a handover from elsewhere.
    ex.fetch(c, tmp_path / "b", "s1")
    ex.declare_record(b, "s1")
    theirs = more(b, "s1", 1, "b")
    b.close()
    mine = more(a, "s1", 2, "a")
    r = ex.push(a, t, "s1")
    assert r.outcome == "refused" and r.head_after == theirs[0]  # it read the session again
    t.close()
    got = reopen(tmp_path / "b", "s1")
    seqs = [rec.get("seq") for rec in got.records() if rec["op"] == "append"]
    assert len(seqs) == len(set(seqs)) == 6 and set(mine) <= set(got.own)
    a.close()
    c.close()


def test_progress_is_reported_per_object(ab):
    a, b, broot = ab
    record(a, "s1", 9)
    seen = []
    r = ex.push(a, broot, "s1", progress=lambda done, total: seen.append((done, total)))
    assert seen == [(i, 20) for i in range(1, 21)] and r.objects == 20


# -- real processes ---------------------------------------------------------------------------


def test_concurrent_pushes_of_two_forks_sharing_a_prefix(tmp_path):
    a, b = store(tmp_path, "a"), store(tmp_path, "b")
    origin = record(a, "o", 120)  # the prefix alone is 2 x 100 objects: packs, in both processes
    forks = {f: record(a, f, 30, base=origin[100], parent_session="o", tag=f) for f in ("f1", "f2")}
    a.close()
    b.close()
    cmd = [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from agentsession_cli.main import main; main(sys.argv[2:])"]
    procs = [subprocess.Popen(cmd + [str(REPO), "--store", str(tmp_path / "a"), "push", f, str(tmp_path / "b"), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for f in forks]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert json.loads(out)["created"] is True
    a2, b2 = Store(tmp_path / "a", readonly=True), Store(tmp_path / "b", readonly=True)
    for f, own in forks.items():
        got = b2.read(f)
        assert got.log_order == own and got.prefix == origin[:101]
        assert b2.export(f) == a2.export(f)
        read_session_bytes(b2.export(f)).raise_for_problems()
    assert fsck(tmp_path / "b").problems == []


# -- the commands ------------------------------------------------------------------------------


def test_push_and_fetch_commands_print_what_moved(tmp_path):
    for n in ("a", "b", "c"):
        ok(cli(tmp_path / n, "init"))
    a = Store(tmp_path / "a")
    ids = record(a, "s1", 2)
    a.close()
    r = cli(tmp_path / "a", "push", "s1", str(tmp_path / "b"))
    out = ok(r)
    assert f"pushed s1 to file://{tmp_path}/b: 6 objects" in out and "3 entries admitted, session created there" in out
    assert f"head: none -> {ids[-1][7:19]} (fast-forward)" in out
    assert r.stderr == ""  # no progress bar off a terminal
    data = json.loads(ok(cli(tmp_path / "a", "push", "s1", "file://" + str(tmp_path / "b"), "--json")))
    assert data["objects"] == 0 and data["head"]["outcome"] == "unchanged" and data["head"]["after"] == ids[-1]
    out = ok(cli(tmp_path / "c", "fetch", "s1", str(tmp_path / "b")))
    assert "fetched s1 from" in out and "session created here" in out
    data = json.loads(ok(cli(tmp_path / "c", "fetch", "s1", str(tmp_path / "b"), "--json")))
    assert set(data) >= {"objects", "bytes", "entries", "head", "mark", "refs"} and data["mark"] == "mirror"


def test_a_refused_push_prints_the_result_and_exits_1(tmp_path):
    a, b = store(tmp_path, "a"), store(tmp_path, "b")
    ids = record(a, "s1", 2)
    ex.push(a, tmp_path / "b", "s1")
    more(a, "s1", 1, "x")
    a.close()
    b.close()
    r = cli(tmp_path / "a", "push", "s1", str(tmp_path / "b"), "--expect", ids[0], "--json")
    assert r.exit_code == 1
    assert json.loads(r.stdout)["head"]["outcome"] == "refused"
    err = json.loads(r.stderr)["error"]  # under --json, the error is JSON on stderr too
    assert err["message"].startswith("head not moved:") and f"--expect {ids[-1]}" in err["message"]
    r = cli(tmp_path / "a", "push", "s1", str(tmp_path / "b"), "--expect", ids[0], "--force")
    assert r.exit_code == 0 and "(forced)" in r.stdout


def test_handover_declare_record_and_take_back_commands(tmp_path):
    a, b = store(tmp_path, "a"), store(tmp_path, "b")
    record(a, "s1", 1)
    Refs(a).update("chat/x", "s1", expected=None)
    a.close()
    b.close()
    out = ok(cli(tmp_path / "a", "handover", "s1", str(tmp_path / "b"), "--ref", "chat/x:"))
    assert "the remote is now the record of s1" in out and "ref chat/x: s1" in out
    r = cli(tmp_path / "a", "push", "s1", str(tmp_path / "b"))
    assert r.exit_code == 1 and "only its record may push" in r.stderr
    out = ok(cli(tmp_path / "a", "take-back", "s1", str(tmp_path / "b")))
    assert "this store is now the record of s1" in out
    r = cli(tmp_path / "b", "declare-record", "s1", "--expect", "")
    assert r.exit_code == 1 and "not none as expected" in r.stderr
    assert json.loads(ok(cli(tmp_path / "b", "declare-record", "s1", "--json")))["changed"] is True
    r = cli(tmp_path / "b", "declare-record", "s1")
    assert r.exit_code == 0 and "already is the record" in r.stderr


def test_command_errors_are_one_line(tmp_path):
    st = store(tmp_path, "a")
    record(st, "s1", 1)  # held here: the push's name resolves, and the transport is what fails
    st.close()
    for args, needle in [
        (("fetch", "s1", str(tmp_path / "a2")), "no store"),
        (("push", "nope", str(tmp_path / "a2")), "no such session: nope"),
        (("push", "s1", "ftp://example.com/store"), "no transport for ftp"),
        (("fetch", "s1", str(tmp_path / "a")), "this store itself"),
        (("take-back", "../x", str(tmp_path / "a2")), "not usable"),
    ]:
        (tmp_path / "a2").mkdir(exist_ok=True)
        r = cli(tmp_path / "a", *args)
        assert r.exit_code == 1, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("agentsession: error: ") and needle in lines[0], (args, r.stderr)
    r = cli(tmp_path / "a", "push", "s1")
    assert r.exit_code == 2


def test_a_progress_bar_is_drawn_on_a_terminal_only(tmp_path, monkeypatch):
    from agentsession_cli import terminal

    a, b = store(tmp_path, "a"), store(tmp_path, "b")
    record(a, "s1", 150)  # 302 objects
    a.close()
    b.close()
    monkeypatch.setattr(terminal, "isatty", lambda stream: True)  # stderr a terminal, the push slow
    monkeypatch.setattr(terminal, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(terminal, "PROGRESS_EVERY", 0.0)
    r = cli(tmp_path / "a", "--no-pager", "push", "s1", str(tmp_path / "b"))
    assert r.exit_code == 0 and "302 objects" in r.stdout
    assert "\r\x1b[Ksending objects: " in r.stderr and "100% (302/302 objects)" in r.stderr
    assert r.stderr.endswith("\r\x1b[K")  # cleared before the result


# -- remotes named oddly --------------------------------------------------------------------


def test_a_file_url_with_a_query_or_fragment_is_refused_not_truncated(tmp_path):
    store(tmp_path, "x").close()
    (tmp_path / "x#y").mkdir()
    for url in (f"file://{tmp_path}/x#y", f"file://{tmp_path}/x?y", f"file://{tmp_path}/x?"):
        with pytest.raises(TransportError, match="query or fragment"):
            remote_url(url)
    # percent-encoded, the same characters name the directory they spell
    assert remote_url(f"file://{tmp_path}/x%23y") == "file://" + str(tmp_path) + "/x%23y"
    assert remote_url(f"file:{tmp_path}/x") == remote_url(tmp_path / "x")  # RFC 8089's short form


def test_odd_characters_in_a_remote_name_the_very_directory(tmp_path):
    a = store(tmp_path, "a")
    record(a, "s1", 1)
    raw = os.fsencode(str(tmp_path)) + b"/caf\xe9 #%?"  # not UTF-8, with a space, '#', '%' and '?'
    Store.init(os.fsdecode(raw)).close()
    url = remote_url(os.fsdecode(raw))
    assert url == "file://" + str(tmp_path) + "/caf%E9%20%23%25%3F"
    assert remote_url(url) == url  # the URL names the same store as the path
    r = ex.push(a, url, "s1")
    assert r.created and "s1" in Store(os.fsdecode(raw))
    r = ex.push(a, os.fsdecode(raw), "s1")
    assert (r.objects, r.outcome) == (0, "unchanged")  # one remote, one remembered state
    assert len(os.listdir(Path(a.root) / "remotes")) == 1
    with pytest.raises(TransportError, match="NUL"):
        remote_url(f"file://{tmp_path}/a%00b")
    a.close()


def test_a_remote_that_is_a_file_is_refused_in_one_line(tmp_path):
    a = store(tmp_path, "a")
    record(a, "s1", 1)
    a.close()
    (tmp_path / "f").write_text("not a store")
    with Store(tmp_path / "a") as a2, pytest.raises(TransportError, match="not a directory"):
        ex.push(a2, tmp_path / "f", "s1")
    r = cli(tmp_path / "a", "push", "s1", str(tmp_path / "f"))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "not a directory" in r.stderr
    r = cli(tmp_path / "a", "push", "s1", f"file://{tmp_path}/a%00b")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "internal error" not in r.stderr


# -- the expected head ------------------------------------------------------------------------


def test_a_refused_push_remembers_no_head_it_never_saw(ab):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    bogus = "sha256:" + "1" * 64
    r = ex.push(a, broot, "s1", expected=bogus)  # the session is created there; its head stays none
    assert (r.created, r.outcome, r.head_after) == (True, "refused", None)
    state = Remembered(a, remote_url(broot)).get("s1", header_ident(a.read("s1").header.data))
    assert state.head != bogus and state.pushed == len(ids)
    r = ex.push(a, broot, "s1")  # expects the head the created session has: none, which it is
    assert (r.outcome, r.head_after) == ("fast-forward", ids[-1])


def test_an_expected_head_that_is_no_entry_id_is_refused_before_anything_is_sent(ab):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    ex.push(a, broot, "s1")
    more(a, "s1", 1, "x")
    snap = tree_snapshot(broot)
    with pytest.raises(BadArgumentError, match="not an entry id"):  # (as set_head's: bad_name before session 40)
        ex.push(a, broot, "s1", expected=ids[-1][:19])  # a short id is not a head
    with pytest.raises(BadArgumentError, match="not an entry id"):
        ex.declare_record(b, "s1", expected="abc")
    assert tree_snapshot(broot) == snap
    a.close()
    r = cli(a.root, "push", "s1", str(broot), "--expect", "abc")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "not an entry id" in r.stderr
    assert tree_snapshot(broot) == snap


def test_a_refused_push_says_how_to_expect_no_head(tmp_path):
    a, b = store(tmp_path, "a"), store(tmp_path, "b")
    record(a, "s1", 1)
    a.close()
    b.close()
    r = cli(tmp_path / "a", "push", "s1", str(tmp_path / "b"), "--expect", "sha256:" + "2" * 64)
    assert r.exit_code == 1 and "--expect '' to move it" in r.stderr


# -- marks: never none ----------------------------------------------------------------------


class _Downgrading(LocalTransport):
    """A far store that admits a handover's entries but answers without the record mark
    (an older server, or one that refused the mark): the sender must keep its own."""

    def push(self, request):
        adm = super().push(PushRequest(**{**request.__dict__, "mark": "mirror"}))
        return adm


def test_a_handover_the_receiver_did_not_mark_leaves_the_sender_the_record(ab):
    a, b, broot = ab
    record(a, "s1", 2)
    with _Downgrading(broot) as t, pytest.raises(StoreError, match="keeps the record"):
        ex.handover(a, t, "s1")
    assert a.session("s1").mark == "record" and reopen(broot, "s1").mark == "mirror"  # one record, never none


def test_a_release_answered_without_clearing_the_mark_is_not_taken_for_one(ab):
    a, b, broot = ab
    record(a, "s1", 2)
    ex.handover(a, broot, "s1")

    class Stubborn(LocalTransport):
        def release_record(self, session_id, *, head):
            return ex.DeclareResult(session_id, False, head, "record")

    with Stubborn(broot) as t, pytest.raises(HandoverIncompleteError, match="two records"):
        ex.take_back(a, t, "s1")
    assert a.session("s1").mark == "record" and reopen(broot, "s1").mark == "record"
    assert ex.take_back(a, broot, "s1").handover  # a retry finishes it
    assert reopen(broot, "s1").mark == "mirror"


def test_a_handovers_mark_lands_with_its_entries_and_head(ab, monkeypatch):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    from agentsession_cas.store import Session

    def crash(self, *args, **kwargs):  # the receiver dies after creating the session, before admitting
        raise OSError("power cut")

    monkeypatch.setattr(Session, "exchange_admit", crash)
    with pytest.raises(OSError):
        ex.handover(a, broot, "s1")
    monkeypatch.undo()
    got = reopen(broot, "s1")
    assert (got.mark, got.head, len(got)) == ("mirror", None, 0)  # not a record of nothing
    assert a.session("s1").mark == "record"
    r = ex.handover(a, broot, "s1")
    assert r.handover and reopen(broot, "s1").mark == "record" and reopen(broot, "s1").head == ids[-1]
    assert a.session("s1").mark == "mirror"


def test_a_retried_handover_finishes_after_the_new_record_wrote(ab, monkeypatch):
    a, b, broot = ab
    record(a, "s1", 2)

    def lost(point: str) -> None:
        if point == "handover:between":
            raise OSError("power cut")

    monkeypatch.setattr(ex, "_fault", lost)
    with pytest.raises(OSError):
        ex.handover(a, broot, "s1")
    monkeypatch.undo()
    with Store(broot) as b2:  # the new record's writers go on before the retry
        theirs = b2.session("s1").append(user("the new record writes")).id
    r = ex.handover(a, broot, "s1")
    assert r.handover and r.outcome == "not-moved" and "already the record" in r.why
    assert a.session("s1").mark == "mirror" and reopen(broot, "s1").mark == "record"
    assert reopen(broot, "s1").head == theirs  # its writers' head is not moved back


def test_a_handover_to_a_record_that_went_another_way_is_still_refused(ab):
    a, b, broot = ab
    record(a, "s1", 2)
    ex.push(a, broot, "s1")
    with Store(broot) as b2:
        ex.declare_record(b2, "s1")
        more(b2, "s1", 1, "b")
    more(a, "s1", 1, "a")  # two records, on two lines: no handover can settle it
    with pytest.raises(HeadMovedError):
        ex.handover(a, broot, "s1")
    assert a.session("s1").mark == "record"


def test_a_retried_take_back_finishes_after_the_remote_wrote(ab, monkeypatch):
    a, b, broot = ab
    record(a, "s1", 2)
    ex.handover(a, broot, "s1")

    def lost(point: str) -> None:
        if point == "take-back:between":
            raise OSError("lost")

    monkeypatch.setattr(ex, "_fault", lost)
    with pytest.raises(OSError):
        ex.take_back(a, broot, "s1")
    monkeypatch.undo()
    with Store(broot) as b2:  # the remote is still a record, and its writers go on
        theirs = b2.session("s1").append(user("still writing")).id
    r = ex.take_back(a, broot, "s1")
    assert r.handover and r.head_after == theirs
    assert a.session("s1").mark == "record" and a.session("s1").head == theirs
    assert reopen(broot, "s1").mark == "mirror"


def test_a_release_by_a_store_that_is_not_the_record_is_refused(ab):
    a, b, broot = ab
    ids = record(a, "s1", 1)
    ex.push(a, broot, "s1")
    with pytest.raises(NotRecordError):
        StoreEndpoint(b).release_record("s1", head=ids[-1])
    assert b.read("s1").mark == "mirror"


# -- refs on a fetch ---------------------------------------------------------------------------


def test_a_fetch_does_not_move_a_local_ref_that_names_another_session(tmp_path):
    a, c = store(tmp_path, "a"), store(tmp_path, "c")
    record(a, "s1", 1)
    record(a, "s2", 1, tag="next")
    record(c, "mine", 1)
    Refs(a).update("chat/x", "s1", expected=None)
    Refs(c).update("chat/x", "mine", expected=None)
    r = ex.fetch(c, tmp_path / "a", "s1", refs=["chat/x"])
    assert not r.refs[0].moved and r.refs[0].current == "mine" and Refs(c).get("chat/x").session == "mine"
    r = ex.fetch(c, tmp_path / "a", "s1", refs=[("chat/x", "mine")])  # said explicitly: moved
    assert r.refs[0].moved and Refs(c).get("chat/x").session == "s1"
    # Tracking: the remote's ref moves on, and this one follows it from what it last saw there.
    Refs(a).update("chat/x", "s2", expected="s1")
    r = ex.fetch(c, tmp_path / "a", "s2", refs=["chat/x"])
    assert r.refs[0].moved and Refs(c).get("chat/x").session == "s2"
    a.close()
    c.close()


def test_objects_of_a_refused_batch_are_not_counted_as_written(ab):
    a, b, broot = ab
    endpoint = StoreEndpoint(b)
    good = [("contents", sha256_ref(b"g%d" % i), b"g%d" % i) for i in range(3)]
    with pytest.raises(BadObjectError):
        endpoint.put_objects(good + [("contents", sha256_ref(b"a"), b"b")], 4)
    assert endpoint._written == set()  # the next push fsyncs whatever of them it finds
    endpoint.put_objects(good, 3)
    assert endpoint._written == {name for _, name, _ in good}


# -- a push whose answer was lost ---------------------------------------------------------------


def _lose_the_answer(monkeypatch) -> None:
    def lost(point: str) -> None:
        if point == "push:acknowledged":
            raise OSError("killed before the head was remembered")

    monkeypatch.setattr(ex, "_fault", lost)


def test_a_push_whose_answer_was_lost_does_not_refuse_the_next(ab, monkeypatch):
    a, b, broot = ab
    ids = record(a, "s1", 2)
    assert ex.push(a, broot, "s1").head_after == ids[-1]
    second = more(a, "s1", 2, "second")
    _lose_the_answer(monkeypatch)
    with pytest.raises(OSError):
        ex.push(a, broot, "s1")  # the remote moved to second[-1]; this store still remembers ids[-1]
    monkeypatch.undo()
    assert reopen(broot, "s1").head == second[-1]
    third = more(a, "s1", 1, "third")
    r = ex.push(a, broot, "s1")
    assert (r.outcome, r.head_before, r.head_after, r.expected) == ("fast-forward", second[-1], third[0], second[-1])
    assert "answer was lost" in r.notes[0]
    assert ex.push(a, broot, "s1").outcome == "unchanged"


def test_a_head_another_store_moved_is_still_refused_after_a_lost_answer(ab, monkeypatch):
    a, b, broot = ab
    ids = record(a, "s1", 3)
    ex.push(a, broot, "s1")
    with Store(broot) as b2:  # another record moves the remote's head back along this line
        ex.declare_record(b2, "s1")
        b2.session("s1").set_head(ids[1], expected=ids[-1])
    more(a, "s1", 1, "mine")
    r = ex.push(a, broot, "s1")
    assert r.outcome == "refused" and reopen(broot, "s1").head == ids[1]
    r = ex.push(a, broot, "s1", expected=ids[0])  # an expectation given is never second-guessed
    assert r.outcome == "refused" and not r.notes


# -- defects outside this module's files (store.py), shown and left to its owner ---------------------


def test_entries_admitted_by_exchange_have_a_context_hash_on_the_open_handle(tmp_path):
    a, c = store(tmp_path, "a"), store(tmp_path, "c")
    record(a, "s1", 1)
    ex.push(a, tmp_path / "c", "s1")
    c.close()
    c = Store(tmp_path / "c")
    mirror = c.session("s1")
    mirror.context_hash()  # asked once: kept up to date from here
    new = more(a, "s1", 1, "later")
    ex.fetch(c, tmp_path / "a", "s1")  # admitted into the same open handle
    assert mirror.head == new[0]
    assert mirror.context_hash() == Store(tmp_path / "c", readonly=True).read("s1").context_hash()
    a.close()
    c.close()


def test_a_local_fetch_reads_the_remote_objects_in_bulk_and_names_one_held_nowhere(tmp_path, monkeypatch):
    """A store endpoint serves objects a chunk at a time (``get_many``, a pack's block read
    once for all its objects), not one ``get`` each; and asks "held?" of many at once. One
    the remote lacks is still named, with the remote, as before."""
    from agentsession_cas.backends.files.objects import FileObjects

    a, b = store(tmp_path, "a"), store(tmp_path, "b")
    record(a, "s", 300)
    a.close()
    Store(tmp_path / "a").pack()
    gets: list[str] = []
    helds: list[str] = []
    real_get, real_held = FileObjects.get, FileObjects.held
    monkeypatch.setattr(FileObjects, "get", lambda self, space, name: gets.append(name) or real_get(self, space, name))
    monkeypatch.setattr(FileObjects, "held", lambda self, space, name: helds.append(name) or real_held(self, space, name))
    ex.fetch(b, tmp_path / "a", "s")
    assert len(reopen(tmp_path / "b", "s").projection().splitlines()) == 302
    assert len(gets) < 20 and helds == [], (len(gets), len(helds))
    # An object the remote lacks: named, and nothing of the session is made here.
    c = store(tmp_path, "c")
    with Store(tmp_path / "a") as src:
        victim = list(src.read("s").own)[4]
        content = read_envelope_content(src, victim)
    monkeypatch.setattr(FileObjects, "get", lambda self, space, name: (
        real_get(self, space, name) if name != content else _raise_missing(space, name)))
    monkeypatch.setattr(FileObjects, "get_many", lambda self, space, names: [self.get(space, n) for n in names])
    with pytest.raises(NoSuchObjectError, match=f"no contents object {content} in "):
        ex.fetch(c, tmp_path / "a", "s")
    assert "s" not in c
    b.close()
    c.close()


def read_envelope_content(st: Store, entry_id: str) -> str:
    from agentsession_cas.format.hashing import envelope_content

    return envelope_content(st.objects.get("entries", entry_id))


def _raise_missing(space: str, name: str):
    raise NoSuchObjectError(f"no {space} object {name} (gone)")


@pytest.mark.parametrize("budget", [0, 20_000])
def test_a_push_past_its_send_cache_reads_again_in_bulk_and_lets_go_of_what_it_sent(tmp_path, monkeypatch, budget):
    """What a push's closure did not keep (past ``SEND_CACHE_BYTES``) is read again a chunk
    of entries at a time (``Session.exchange_objects_many``), never an entry at a time (a
    100,000-entry push with none kept took 29 s of CPU against 19 s); what it kept is let
    go of as it is sent; the receiver in this process takes each kept object out as its
    admission reads it. The remote holds the session whole either way."""
    from agentsession_cas.store import Session

    a, b = store(tmp_path, "a"), store(tmp_path, "b")
    record(a, "s", 600)
    monkeypatch.setattr(ex, "SEND_CACHE_BYTES", budget)
    ones: list[str] = []
    closures: list = []
    one, closure_of = Session.exchange_objects, ex._closure
    monkeypatch.setattr(Session, "exchange_objects", lambda self, entry_id: ones.append(entry_id) or one(self, entry_id))
    monkeypatch.setattr(ex, "_closure", lambda *args: closures.append(closure_of(*args)) or closures[-1])
    kept: list[dict] = []
    receive = StoreEndpoint._receive

    def watched(self, *args, sent, **kw):  # type: ignore[no-untyped-def]
        kept.append(sent)
        return receive(self, *args, sent=sent, **kw)

    monkeypatch.setattr(StoreEndpoint, "_receive", watched)
    r = ex.push(a, tmp_path / "b", "s")
    assert r.entries == 601 and ones == []  # (a config, then 600 items)
    assert closures and closures[0].cache == {}, "what the closure kept was not let go as it was sent"
    assert kept and kept[0] == {}, "the receiver kept what its admission had read"
    with Store(tmp_path / "a", readonly=True) as src:
        assert reopen(tmp_path / "b", "s").projection() == src.read("s").projection()
    a.close()
    b.close()
