"""Log compaction (files backend): a ``snapshot`` record in place of the records a commit
and a checkpoint cover, so a closed log carries no second copy of its objects and an open
reads one line for them (docs/storage-format.md, "Compaction")."""

from __future__ import annotations

import binascii
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import agentsession_cas.backends.files.log as log_module
import agentsession_cas.backends.files.sessions as files_sessions
from agentsession_cas import Header, make_entry
from agentsession_cas.backends.files.log import (
    encode_record,
    expand_snapshot,
    make_snapshot,
    read_log,
    read_snapshot_ids,
    record_body,
    run_snapshot,
    snapshot_ids_file,
    with_digests,
)
from agentsession_cas.errors import SessionDamagedError
from agentsession_cas.exchange import operations as ex
from agentsession_cas.exchange.local import LocalTransport
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from agentsession_cas.store.state import replay

BIG = "x" * 2000  # an entry of about 2 KB: 40 of them pass the close threshold


def msg(text: str) -> dict:
    return {"type": "item", "item": {"type": "message", "role": "user", "content": text + BIG}, "ts": "2026-01-01T00:00:00Z"}


def log_of(root: Path, sid: str = "s1") -> bytes:
    return (root / "sessions" / sid / "log").read_bytes()


def ops(root: Path, sid: str = "s1") -> list[str]:
    return [r.op for r in read_log(log_of(root, sid), expand=False).records]


def state_of(session) -> tuple:
    return (list(session.log_order), dict(session.own), session.head, session.mark, set(session.leaf_labels),
            session.state.max_seq, session.state.committed_seq)


def fill(st: Store, sid: str = "s1", n: int = 60):
    s = st.create(Header.new(sid))
    for i in range(n):
        s.append(msg(f"m{i}"))
    return s


def test_close_compacts_a_grown_log_into_one_snapshot(tmp_path):
    root = tmp_path / "store"
    st = Store.init(root)
    s = fill(st)
    before = state_of(s)
    projection = s.projection()
    packed_before = len(log_of(root))
    st.close()
    assert ops(root) == ["create", "snapshot"]
    data = log_of(root)
    assert b"\t" not in data, "no payload is left in the log"
    assert len(data) < packed_before / 10
    ro = Store(root, readonly=True).read("s1")
    assert state_of(ro) == before
    assert ro.projection() == projection
    # History still reads as appends, in order, each with its sequence number.
    hist = ro.records()
    assert [r["entry"] for r in hist if r["op"] == "append"] == before[0]
    assert [r["seq"] for r in hist if r["op"] == "append"] == list(range(1, 61))
    assert fsck(root).ok


def test_a_small_log_is_left_as_it_is(tmp_path):
    root = tmp_path / "store"
    st = Store.init(root)
    fill(st, n=3)
    st.close()
    assert "snapshot" not in ops(root)


def test_an_import_writes_its_log_compacted_and_its_close_leaves_it(tmp_path):
    """A session created whole (an import) has its objects durable before it is visible:
    a log of 64 KiB or more is written as create and one snapshot, which the close does
    not read back nor rewrite; a small one keeps its records one by one."""
    root = tmp_path / "store"
    st = Store.init(root)
    s = st.create(Header.new("s1"))
    for i in range(700):  # about 700 appends: past the 64 KiB an append-per-line log would take
        s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"m{i}"},
                  "ts": "2026-01-01T00:00:00Z"})
    data = s.projection()
    st.close()
    for sid, copy in (("big", data), ("small", data[: data.index(b"\n", data.index(b"\n") + 1) + 1])):
        copy = copy.replace(b'"id":"s1"', f'"id":"{sid}"'.encode(), 1)
        with Store(root) as st:
            imported = st.import_bytes(copy, record=True)
            ident = (root / "sessions" / sid / "log").stat()
            before = state_of(imported)
        after = (root / "sessions" / sid / "log").stat()
        assert (after.st_ino, after.st_size, after.st_mtime_ns) == (ident.st_ino, ident.st_size, ident.st_mtime_ns)
        ro = Store(root, readonly=True).read(sid)
        assert state_of(ro) == before and ro.projection() == copy
        assert [r["entry"] for r in ro.records() if r["op"] == "append"] == before[0]
    assert ops(root, "big") == ["create", "snapshot"] and len(log_of(root, "big")) < 50 * 701
    assert ops(root, "small") == ["create", "append", "head", "commit"]
    assert fsck(root).ok
    with Store(root) as st:  # a record imported compacted takes appends as any other
        st.session("big").append({"type": "item", "item": {"type": "message", "role": "user", "content": "next"}})
    assert ops(root, "big")[:2] == ["create", "snapshot"] and "append" in ops(root, "big")
    assert fsck(root).ok


def test_appends_after_a_snapshot_and_a_second_compaction(tmp_path):
    root = tmp_path / "store"
    st = Store.init(root)
    fill(st)
    st.close()
    st = Store(root)
    s = st.session("s1")
    first = s.log_order[0]
    s.append(make_entry("label", s.head, ts="2026-01-01T00:00:01Z", target=first, label="leaf"))
    s.set_head(first, expected=s.head)
    for i in range(40):
        s.append(msg(f"again{i}"))
    before = state_of(s)
    st.close()
    assert ops(root) == ["create", "snapshot"]
    ro = Store(root, readonly=True).read("s1")
    assert state_of(ro) == before
    assert len(ro.leaf_labels) == 1
    hist = ro.records()
    assert any(r["op"] == "head" and r["head"] == first for r in hist)
    assert fsck(root, deep=True).ok


def test_compaction_while_writing_keeps_the_uncommitted_tail(tmp_path, monkeypatch):
    """A lazy writer compacts at a checkpoint; appends not yet committed stay in the log
    with their payloads, after the snapshot, and a crash then loses none of the rest."""
    monkeypatch.setattr(files_sessions, "COMPACT_WHILE_WRITING", 4096)
    monkeypatch.setattr(files_sessions, "CHECKPOINT_ENTRIES", 16)
    root = tmp_path / "store"
    st = Store.init(root, sync="never")
    s = st.create(Header.new("s1"))
    for i in range(100):
        s.append(msg(f"m{i}"))
        if i % 7 == 0:
            s.commit()
    assert "snapshot" in ops(root), "a compaction ran while writing"
    s.commit()
    before = state_of(s)
    s.append(msg("uncommitted"))
    # Kill: the lazy append's record may or may not be in the log; nothing committed is lost.
    from storetools import crash

    crash(st)
    st = Store(root)
    s = st.session("s1")
    assert s.log_order[: len(before[0])] == before[0]
    st.close()
    assert fsck(root).ok


def test_lazy_appends_that_commit_nothing_never_reread_the_log(tmp_path, monkeypatch):
    """Only committed records fold: a stream of lazy appends with no commit gives a
    compaction nothing to do, so no checkpoint reads the log to find that out (it once
    read the whole log at every checkpoint, a cost growing with the stream). The commit
    at the end lets the checkpoints of the close compact (from what the writer holds:
    no read either)."""
    monkeypatch.setattr(files_sessions, "COMPACT_WHILE_WRITING", 4096)
    monkeypatch.setattr(files_sessions, "CHECKPOINT_ENTRIES", 16)
    reads: list[str] = []
    real = files_sessions.read_dense

    def counting(path, *args, **kwargs):
        if str(path).endswith("log"):
            reads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(files_sessions, "read_dense", counting)
    root = tmp_path / "store"
    st = Store.init(root, sync="never")
    s = st.create(Header.new("s1"))
    for i in range(100):
        s.append(msg(f"m{i}"))
    assert reads == [], "checkpoints of uncommitted appends read the log"
    s.commit()
    st.close()
    assert ops(root)[:2] == ["create", "snapshot"]
    st = Store(root)
    assert len(st.session("s1").log_order) == 100
    st.close()
    assert fsck(root).ok


def test_exchange_serves_a_compacted_session_from_a_reader(tmp_path):
    root, remote = tmp_path / "a", tmp_path / "b"
    st = Store.init(root)
    fill(st)
    st.close()
    Store.init(remote).close()
    reader = Store(root, readonly=True)
    assert ops(root) == ["create", "snapshot"]
    ex.push(Store(root), remote, "s1")
    assert Store(remote, readonly=True).read("s1").projection() == reader.read("s1").projection()


def test_a_session_taken_by_push_is_compacted_and_keeps_its_summary_and_rules(tmp_path, monkeypatch):
    """The appends a push brings carry no payload (their objects were made durable first),
    so no checkpoint writes them: a ``checkpoint`` record says so, and the receiving log
    folds into a snapshot like any other. Before, such a log was never compacted, and every
    close of it (each push into it) read all its records to find nothing to fold. The
    transport's close keeps the summary ``list`` reads and the rules' state too."""
    root, remote = tmp_path / "a", tmp_path / "b"
    st = Store.init(root, sync="never")
    s = fill(st, n=700)  # (700 appends without payload: past the close's threshold, 64 KiB)
    Store.init(remote).close()
    with LocalTransport(str(remote)) as tr:
        ex.push(st, tr, "s1", session=s)
        assert ops(remote) == ["create", "snapshot"]
        # Pushes of a few entries: the log grows by their records, and each close reads
        # no record back (compaction waits until the growth is worth a fold).
        reads: list[int] = []
        real = files_sessions.checkpoint_covers
        monkeypatch.setattr(files_sessions, "checkpoint_covers", lambda recs: reads.append(1) or real(recs))
        for i in range(3):
            s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"short {i}"}})
            ex.push(st, tr, "s1", session=s)
        assert reads == []
    assert ops(remote)[:2] == ["create", "snapshot"] and "append" in ops(remote)
    assert (remote / "sessions" / "s1" / "summary").is_file() and (remote / "sessions" / "s1" / "rules").is_file()
    st.close()
    mirror = Store(remote, readonly=True).read("s1")
    assert mirror.projection() == Store(root, readonly=True).read("s1").projection()
    assert fsck(Store(remote, readonly=True)).ok


def test_sweep_keeps_what_a_snapshot_names(tmp_path):
    root = tmp_path / "store"
    st = Store.init(root)
    fill(st)
    st.close()
    st = Store(root)
    st.sweep(grace=0)
    st.close()
    ro = Store(root, readonly=True).read("s1")
    assert len(list(ro)) == 60
    assert fsck(root).ok


def test_a_damaged_snapshot_line_is_damage_naming_it(tmp_path):
    root = tmp_path / "store"
    st = Store.init(root)
    fill(st)
    st.close()
    path = root / "sessions" / "s1" / "log"
    data = bytearray(path.read_bytes())
    second = data.index(b"\n") + 1
    data[second + 40] ^= 1  # inside the snapshot's base64 ids
    path.write_bytes(bytes(data))
    with pytest.raises(SessionDamagedError) as info:
        Store(root, readonly=True).read("s1")
    assert info.value.line == 2


def _seqs_reversed(snap: dict) -> dict:
    return dict(snap, seqs=list(reversed(snap["seqs"])))


def _an_entry_twice(snap: dict) -> dict:
    entries = list(snap["entries"])
    return dict(snap, entries=[*entries[:-1], entries[len(entries) // 2]])


@pytest.mark.parametrize("alter, why", [
    (_seqs_reversed, "snapshot record holds sequence numbers out of order"),
    # (its ids are held as their digests, not a dict of them: the repeat is still found)
    (_an_entry_twice, "a snapshot naming an entry twice"),
])
def test_a_snapshot_that_decodes_badly_is_damage(tmp_path, alter, why):
    """Its checksum matches (a writer's bug or a hostile file): still refused."""
    root = tmp_path / "store"
    st = Store.init(root)
    fill(st)
    st.close()
    lr = read_log(log_of(root), expand=False)
    create, snap = lr.records[0].data, lr.records[1].data
    (root / "sessions" / "s1" / "log").write_bytes(encode_record(create) + encode_record(alter(snap)))
    with pytest.raises(SessionDamagedError, match=why):
        Store(root, readonly=True).read("s1")


_WORKER = textwrap.dedent(
    """
    import os, signal, sys
    import agentsession_cas.fsutil as fsutil
    from agentsession_cas.store import Store
    root, when = sys.argv[1], sys.argv[2]
    replace = os.replace
    def dying_replace(src, dst):
        # The compaction's switch: die just before it, or just after it.
        if dst.endswith(os.sep + "log"):
            if when == "after":
                replace(src, dst)
            os.kill(os.getpid(), signal.SIGKILL)
        replace(src, dst)
    fsutil.os.replace = dying_replace
    st = Store(root)
    st.session("s1")
    st.close()
    """
)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_during_compaction_loses_nothing(tmp_path, when):
    """Killed just before or just after the new log replaces the old: either log is the
    whole session (the rename is the switch)."""
    root = tmp_path / "store"
    st = Store.init(root)
    s = fill(st)
    s.commit()
    before = state_of(s)
    projection = s.projection()
    # Leave it as a killed writer would (committed, not compacted) for the worker to close.
    from storetools import crash

    s.checkpoint()
    crash(st)
    proc = subprocess.run([sys.executable, "-c", _WORKER, str(root), when], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    expected_ops = ["create", "snapshot"] if when == "after" else None
    if expected_ops:
        assert ops(root) == expected_ops
    else:
        assert "snapshot" not in ops(root)
    st = Store(root)
    s = st.session("s1")
    assert state_of(s)[:6] == before[:6]
    assert s.projection() == projection
    st.close()
    assert fsck(root).ok


# -- the snapshot's records replay to the same state as the records it replaced -----------

_IDS = [f"sha256:{i:064x}" for i in range(1, 13)]


@hs.composite
def _logs(draw):
    create = {"op": "create", "session": "s", "base": None, "mark": draw(hs.sampled_from(["record", "mirror"]))}
    records: list[dict] = []
    seq = 0
    own: list[str] = []
    for _ in range(draw(hs.integers(0, 25))):
        kind = draw(hs.sampled_from(["append", "append", "append", "head", "mark", "loss", "commit", "checkpoint"]))
        if kind == "append":
            seq += draw(hs.integers(1, 2))
            entry = draw(hs.sampled_from(_IDS))
            rec = {"op": "append", "entry": entry, "seq": seq, "head": entry}
            if draw(hs.booleans()) and own:
                rec["leaf_label"] = True
                rec["head"] = own[-1]
            if entry not in own:
                own.append(entry)
            records.append(rec)
        elif kind == "head" and own:
            records.append({"op": "head", "head": draw(hs.sampled_from(own))})
        elif kind == "mark":
            records.append({"op": "mark", "mark": draw(hs.sampled_from(["record", "mirror"]))})
        elif kind == "loss":
            seq += 1
            records.append({"op": "loss", "entry": None, "seq": seq})
        elif kind in ("commit", "checkpoint"):
            records.append({"op": kind, **({"seq": seq} if kind == "checkpoint" else {})})
    records.append({"op": "commit"})
    return create, records


def _key(state) -> tuple:
    return (state.base, state.head, state.mark, state.own, state.log_order, state.leaf_labels,
            state.max_seq, state.committed_seq, [c for c, _ in state.damage])


@given(_logs())
@settings(max_examples=300, deadline=None)
def test_snapshot_replays_to_the_state_of_the_records_it_replaces(log):
    create, records = log
    whole = replay([create, *records])
    snap = make_snapshot(create, records)
    # As an open loads it (the decoded record), and as history reads it (expanded) ...
    loaded = replay([create, snap])
    expanded = replay([create, *expand_snapshot(snap)])
    # ... and after a trip through the log's bytes.
    lr = read_log(encode_record(create) + encode_record(snap), expand=False)
    assert not lr.damage
    tripped = replay([r.data for r in lr.records])
    if whole.damage:
        return  # a compaction never runs over a log that does not replay cleanly
    assert _key(loaded) == _key(whole)
    assert _key(expanded) == _key(whole)
    assert _key(tripped) == _key(whole)
    # A snapshot of a snapshot (a second compaction) is the same snapshot.
    again = make_snapshot(create, [snap])
    assert {k: v for k, v in again.items()} == snap
    # Appends as the rows a writer holds of them (Append's fields, the offset after) fold the same.
    rows = [(r["seq"], r["entry"], r.get("head"), "head" in r, bool(r.get("leaf_label")), False, 0)
            if r["op"] == "append" else r for r in records]
    assert make_snapshot(create, rows) == snap


@pytest.mark.parametrize("shape", ["plain", "leaf labels", "a repeat", "an append after", "no head record"])
def test_a_created_sessions_snapshot_from_its_digests_is_make_snapshots(shape):
    """A session created whole (an import) has its snapshot made from its ids' digests
    (run_snapshot), not from a row per append: the line it writes is the one make_snapshot
    writes of the same records, and it replays the same; with an id twice, or records after
    that append, it is make_snapshot's own."""
    from agentsession_cas.backends.digests import EntryDigests

    ids = [make_entry("info", None, ts="2026-01-01T00:00:00Z", name=f"e{i}").id for i in range(40)]
    if shape == "a repeat":
        ids.append(ids[3])
    labels = {ids[5], ids[17]} if shape == "leaf labels" else set()
    create = {"op": "create", "session": "s1", "base": None, "mark": "mirror"}
    after: list[dict] = [] if shape == "no head record" else [{"op": "head", "head": ids[-2]}]
    if shape == "an append after":
        after.append({"op": "append", "seq": 41, "entry": ids[0]})
    after.append({"op": "commit"})
    rows = [(seq, eid, None, False, eid in labels, False) for seq, eid in enumerate(ids, start=1)]
    want = with_digests(make_snapshot(create, [*rows, *after]))
    got = with_digests(run_snapshot(create, EntryDigests.of(ids), labels, after))
    assert record_body(got) == record_body(want)
    assert _key(replay([create, got])) == _key(replay([create, want]))


def test_repair_of_a_compacted_log_with_a_damaged_line_after_its_snapshot(tmp_path):
    """Repair reads a snapshot as the appends it stands for: a bad line after it costs
    nothing the snapshot holds."""
    from agentsession_cas.maintenance.repair import repair_session

    root = tmp_path / "store"
    st = Store.init(root)
    fill(st)
    st.close()
    st = Store(root)
    s = st.session("s1")
    for i in range(3):
        s.append(msg(f"late{i}"))
    want = list(s.log_order)
    st.close()
    path = root / "sessions" / "s1" / "log"
    lines = path.read_bytes().split(b"\n")
    assert read_log(path.read_bytes(), expand=False).records[1].op == "snapshot"
    # Flip a byte in the first record after the snapshot (an append of "late0").
    third = bytearray(lines[2])
    third[30] ^= 1
    lines[2] = bytes(third)
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(SessionDamagedError):
        Store(root, readonly=True).read("s1")
    st = Store(root)
    report = repair_session(st, "s1")
    st.close()
    assert report.damaged
    ro = Store(root, readonly=True).read("s1")
    assert list(ro.log_order) == want
    assert fsck(root).ok


def _write_a_session(root: Path) -> None:
    """Durable and lazy appends, commits, head moves, a mark change and a branch, with
    compaction while writing and at close."""
    st = Store.init(root, sync="never")
    s = st.create(Header.new("s1", created_at="2026-01-01T00:00:00Z"))
    first = None
    for i in range(120):
        r = s.append(msg(f"m{i}"), durable=(i % 11 == 0))
        first = first or r.id
        if i % 9 == 0:
            s.commit()
        if i == 50:
            s.set_head(first, expected=s.head)
        if i == 51:
            s.set_head(s.log_order[-1], expected=s.head)
        if i == 70:
            s.set_mark("mirror")
            s.set_mark("record")
    s.commit()
    st.close()
    st = Store(root)
    s = st.session("s1")
    for i in range(30):
        s.append(msg(f"again {i}"))
    st.close()


def test_the_close_of_a_lazy_stream_folds_the_log_once(tmp_path, monkeypatch):
    """The close's checkpoint waits for the one an append left in flight, then writes
    its own: it folds once, after both (a fold after each read the log's records twice,
    at the close of a long lazy stream nearly all of them; issue 10)."""
    monkeypatch.setattr(files_sessions, "COMPACT_WHILE_WRITING", 4096)
    monkeypatch.setattr(files_sessions, "COMPACT_AT_CLOSE", 1)
    monkeypatch.setattr(files_sessions, "CHECKPOINT_ENTRIES", 16)
    folds: list[int] = []
    real = files_sessions.make_snapshot

    def counting(*args, **kwargs):
        folds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(files_sessions, "make_snapshot", counting)
    root = tmp_path / "store"
    st = Store.init(root, sync="never")
    s = st.create(Header.new("s1"))
    for i in range(20):  # the 16th leaves a checkpoint in flight; four appends after it
        s.append(msg(f"m{i}"))
    s.commit()
    assert folds == []
    st.close()
    assert folds == [1], "the close folded the log more than once"
    assert ops(root) == ["create", "snapshot"]
    st = Store(root)
    assert len(st.session("s1").log_order) == 20
    st.close()
    assert fsck(root).ok


def test_compaction_from_what_the_writer_holds_writes_what_reading_the_log_would(tmp_path, monkeypatch):
    """A writer folds the records it knows it wrote (no read of the log back); the log it
    leaves is byte for byte the one a compaction reading the log writes."""
    monkeypatch.setattr(files_sessions, "COMPACT_WHILE_WRITING", 8192)
    monkeypatch.setattr(files_sessions, "CHECKPOINT_ENTRIES", 16)
    reads: list[int] = []  # logs read back by a compaction
    compacting: list[bool] = []
    real_read = files_sessions.read_dense
    real_compact = files_sessions.FileSessionLog._compact

    def counting(path, *args, **kwargs):
        if compacting and str(path).endswith("log"):
            reads.append(1)
        return real_read(path, *args, **kwargs)

    def watched(self, *, final):
        compacting.append(True)
        try:
            return real_compact(self, final=final)
        finally:
            compacting.pop()

    monkeypatch.setattr(files_sessions, "read_dense", counting)
    monkeypatch.setattr(files_sessions.FileSessionLog, "_compact", watched)
    _write_a_session(tmp_path / "held")
    assert reads == [], "the writer read its log back to compact it"

    def from_the_file(self, *, final):
        self._held = None  # as if nothing were known: read the log
        return watched(self, final=final)

    monkeypatch.setattr(files_sessions.FileSessionLog, "_compact", from_the_file)
    _write_a_session(tmp_path / "read")
    assert reads, "the reference run read the log"
    assert log_of(tmp_path / "held") == log_of(tmp_path / "read")
    assert ops(tmp_path / "held").count("snapshot") == 1
    assert fsck(tmp_path / "held").ok


# -- the ids side file: a snapshot's ids kept raw beside the log ---------------------------


def _ids_path(root: Path, sid: str = "s1") -> Path:
    return root / "sessions" / sid / files_sessions.IDS_FILE


def _snapshot_line_checksum(root: Path, sid: str = "s1") -> str:
    return read_log(log_of(root, sid), expand=False).records[1].checksum


@pytest.fixture
def small_ids_worth(monkeypatch):
    """Side files for snapshots of a few ids (a real one is kept from 4,096 ids up)."""
    monkeypatch.setattr(files_sessions, "_IDS_WORTH", 32)


def _closed_with_ids(tmp_path: Path) -> tuple[Path, tuple]:
    """A store whose session was filled and closed (its log compacted, its ids kept
    beside it), and the session's state before the close."""
    root = tmp_path / "store"
    st = Store.init(root)
    before = state_of(fill(st))
    st.close()
    return root, before


def _no_base64_decoding(monkeypatch):
    """The log module's base64 decoding refused (the rules file's is another module's)."""
    class NoDecoding:
        Error = binascii.Error

        @staticmethod
        def a2b_base64(*_a, **_k):
            raise AssertionError("the snapshot's base64 was decoded though its ids file holds them")
    monkeypatch.setattr(log_module, "binascii", NoDecoding)


def test_a_compaction_keeps_its_snapshot_ids_beside_the_log_and_an_open_reads_them(tmp_path, monkeypatch, small_ids_worth):
    root = tmp_path / "store"
    st = Store.init(root)
    s = fill(st)
    before = state_of(s)
    st.close()
    kept = read_snapshot_ids(_ids_path(root).read_bytes())
    assert kept is not None and kept.line == _snapshot_line_checksum(root)
    assert kept.raw == b"".join(bytes.fromhex(e[len("sha256:"):]) for e in before[0])
    with monkeypatch.context() as m:
        _no_base64_decoding(m)
        ro = Store(root, readonly=True).read("s1")
        assert state_of(ro) == before
        # An append after it, and its close (no new compaction: too little grew).
        st = Store(root)
        st.session("s1").append(msg("after"))
        st.close()
    report = fsck(root)
    assert report.ok and not report.problems


def test_an_import_writes_its_snapshot_ids_too(tmp_path, monkeypatch, small_ids_worth):
    src = tmp_path / "src"
    st = Store.init(src)
    s = st.create(Header.new("s1"))
    for i in range(700):  # (an import writes its log compacted from 64 KiB of append lines up)
        s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"m{i}"}})
    st.close()
    text = Store(src, readonly=True).read("s1").projection()
    dst = tmp_path / "dst"
    st = Store.init(dst)
    st.import_bytes(text)
    st.close()
    assert ops(dst) == ["create", "snapshot"]
    assert read_snapshot_ids(_ids_path(dst).read_bytes()).line == _snapshot_line_checksum(dst)
    with monkeypatch.context() as m:
        _no_base64_decoding(m)
        assert Store(dst, readonly=True).read("s1").projection() == text


def _flip_a_digest_byte(data: bytes, root: Path) -> bytes:
    return data[:-5] + bytes([data[-5] ^ 1]) + data[-4:]


def _another_line(data: bytes, root: Path) -> bytes:
    """The same ids, checksummed right, but naming another snapshot line."""
    kept = read_snapshot_ids(data)
    return snapshot_ids_file("0123456789abcdef", kept.raw)


def _one_id_fewer(data: bytes, root: Path) -> bytes:
    kept = read_snapshot_ids(data)
    return snapshot_ids_file(kept.line, kept.raw[:-32])


def _torn(data: bytes, root: Path) -> bytes:
    return data[: len(data) // 2]


@pytest.mark.parametrize("alter", [_flip_a_digest_byte, _another_line, _one_id_fewer, _torn, lambda d, r: b""])
def test_a_damaged_or_stale_ids_file_is_not_used(tmp_path, small_ids_worth, alter):
    """An index, never trusted past its checksums: the open decodes the log's own base64
    and gets the same session; nothing is refused."""
    root, before = _closed_with_ids(tmp_path)
    path = _ids_path(root)
    path.write_bytes(alter(path.read_bytes(), root))
    assert state_of(Store(root, readonly=True).read("s1")) == before
    st = Store(root)
    st.session("s1").append(msg("after"))
    st.close()
    assert fsck(root).ok


def test_an_ids_file_vouches_only_for_ids_named_once():
    one, two = bytes(range(32)), bytes(range(1, 33))
    assert snapshot_ids_file("0" * 16, one + two) is not None
    assert snapshot_ids_file("0" * 16, one + two + one) is None


def test_a_snapshot_line_read_sliced_reads_as_the_whole_line(tmp_path):
    """The ids cut out of the line's bytes give the record the whole-line parse gives;
    a line the cut does not fit (an escape in the ids) goes the whole way."""
    root = tmp_path / "store"
    st = Store.init(root)
    fill(st)
    st.close()
    line = log_of(root).split(b"\n")[1]

    def parsed(raw: bytes, sliced: bool):
        out = log_module._parse_line(raw, sliced=sliced)
        if isinstance(out, str):
            return out
        data = dict(out[0], entries=list(out[0]["entries"]), seqs=list(out[0]["seqs"]))
        return data, out[1], out[2]

    assert parsed(line, True) == parsed(line, False)
    body = line[2 * 16 + 2 :]
    escaped = body.replace(b'{"entries":"', b'{"entries":"\\u0041', 1)  # (not base64 once decoded)
    framed = log_module.frame(escaped, line[17:33].decode()).rstrip(b"\n")
    assert parsed(framed, True) == parsed(framed, False)
    assert "base64" in parsed(framed, True)


def test_fsck_warns_of_an_ids_file_that_names_the_snapshot_line_but_not_its_ids(tmp_path, small_ids_worth):
    """The one case an open cannot see (it trusts a file whose checksums hold and which
    names its snapshot line): fsck compares it with the line and says so."""
    root, before = _closed_with_ids(tmp_path)
    path = _ids_path(root)
    kept = read_snapshot_ids(path.read_bytes())
    path.write_bytes(snapshot_ids_file(kept.line, kept.raw[32:] + kept.raw[:32]))  # (rotated: as many ids)
    report = fsck(root)
    assert [p.code for p in report.problems] == ["stale-ids"] and report.problems[0].severity == "warning"
    assert "sessions/s1/ids" in str(report.problems[0].file)
    path.unlink()
    assert fsck(root).ok and not fsck(root).problems
    assert state_of(Store(root, readonly=True).read("s1")) == before
