"""A PostgreSQL log gap loses nothing the objects prove: a position missing from a session's
log table (fsck's ``log-gap``: a row deleted) is damage, as a record removed from a file
log is. Every open refuses it, ``verify ID`` fails on it (the one rule fsck uses,
``sessions.log_gaps``), a sweep refuses the store while it lasts (the lost record may be the
only one naming an entry), and repair reads it as a damaged line of the shared planner
(``files/repair.py``), which takes back what a kept record or the row's head names, numbers
it as for a damaged file log, and rewrites the rows so fsck is clean after.

Until session 41 repair left such rows as they were, saying so in a note, so the session
stayed broken; a sweep then counted the lost entry's objects unreferenced and deleted them
(the entry gone for good); and ``verify ID`` passed a session missing a commit row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import pg_server
from agentsession_cas import Header, make_entry
from agentsession_cas.backends.postgresql import sessions as pg_sessions
from agentsession_cas.errors import SessionDamagedError, StoreError
from agentsession_cas.maintenance.check import verify_stored
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.maintenance.repair import repair_session
from agentsession_cas.store import Store
from agentsession_cas.store.url import open_store
from agentsession_cli.main import main
from pg_server import sql
from storetools import line_body


@pytest.fixture
def store() -> Iterator[Store]:
    """A PostgreSQL store in a schema of its own, on the tests' server."""
    with open_store(pg_server.fresh_schema("gap"), create=True) as st:
        yield st


@pytest.fixture
def url(store: Store) -> str:
    return store.url


def item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def build(st: Store, sid: str = "s1", n: int = 4) -> list[str]:
    """A session of n continued durable appends: rows create, then (append, commit) each."""
    s = st.create(Header.new(sid, created_at="2026-12-04T10:00:00Z"))
    ids = [s.append(make_entry("item", s.head, ts=f"2026-12-04T10:00:0{i}Z", item=item(f"{sid} entry {i}")).data).id
           for i in range(n)]
    s.close()
    return ids


def delete_row(url: str, pos: int, sid: str = "s1") -> None:
    gone = sql(url, "DELETE FROM log WHERE session = (SELECT key FROM sessions WHERE id = %s) AND pos = %s RETURNING op",
               [sid, pos])
    assert len(gone) == 1


def seqs(st: Store, sid: str = "s1") -> list[int]:
    s = st.read(sid)
    try:
        return [s.own[e] for e in s.log_order]
    finally:
        s.close()


def assert_refused_by_sweep(st: Store, url: str, sid: str = "s1") -> None:
    """A sweep, dry or not, refuses the store naming the session and saying to repair it,
    and deletes nothing."""
    before = sql(url, "SELECT count(*) FROM objects")
    for dry_run in (True, False):
        with pytest.raises(StoreError, match=rf"session {sid} has a damaged log \(log position \d+ is missing.*"
                                             rf"agentsession repair {sid}") as refused:
            st.sweep(grace=0, dry_run=dry_run)
        assert (refused.value.code, getattr(refused.value, "session", None)) == ("session_damaged", sid)
    assert sql(url, "SELECT count(*) FROM objects") == before


def assert_whole(st: Store, ids: list[str], sid: str = "s1") -> None:
    """fsck is clean, verify ID passes, a sweep keeps every entry, and a writer goes on."""
    report = fsck(st)
    assert report.ok and not report.warnings, report.as_dict()
    assert verify_stored(st, sid, as_export=True).problems == []
    st.sweep(grace=0)
    assert all(st.entry(e).id == e for e in ids)
    s = st.session(sid)
    try:
        assert s.log_order == ids
        nxt = s.append(make_entry("item", s.head, item=item("after the repair")).data)
        assert s.own[nxt.id] == max(s.own[e] for e in ids) + 1
    finally:
        s.close()


# Rows of build(n=4): 1 create; 2 append seq 1, 3 commit; 4 append 2, 5 commit; 6 append 3,
# 7 commit; 8 append 4, 9 commit.
CASES = {
    # a middle append: the next entry names it as its parent (hidden), with its own number
    "middle-append": (4, [1, 2, 3, 4]),
    # the last append, its commit left: the row's head names it; it is numbered after the
    # number its lost row may have spent, as for a damaged file log's last line
    "last-append": (8, [1, 2, 3, 5]),
    # a commit row: nothing is lost but the record; the rows are rewritten whole
    "commit": (5, [1, 2, 3, 4]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_gap_is_damage_until_repair_takes_back_what_the_objects_prove(store, url, case):
    pos, numbers = CASES[case]
    ids = build(store)
    delete_row(url, pos)
    # fsck: one finding, at the row after the gap, as before
    found = [(p.code, p.line, p.message) for p in fsck(store).errors]
    assert found == [("log-gap", pos + 1, f"session s1: log position {pos} is missing (next is {pos + 1})")], found
    # verify ID fails on it (a missing commit row passed)
    problems = verify_stored(store, "s1", as_export=True).problems
    assert [(p["code"], p["line"]) for p in problems] == [("log-gap", pos + 1)], problems
    # every open refuses it, pointing to repair
    for open_it in (store.read, store.session):
        with pytest.raises(SessionDamagedError, match=f"log position {pos} is missing.*repair s1"):
            open_it("s1")
    # a sweep refuses the store and deletes nothing
    assert_refused_by_sweep(store, url)
    report = repair_session(store, "s1")
    assert report.damaged and report.repaired and not report.dropped
    assert report.kept == ids and report.head == ids[-1]
    assert [d.line for d in report.damage] == [pos] and "missing" in report.damage[0].reason
    assert any(n.code == "log-gap" and n.line == pos + 1 for n in report.notes), report.notes
    assert seqs(store) == numbers
    # the rows are rewritten: positions 1..N, the row's length theirs; the old rows kept aside
    rows = sql(url, "SELECT pos FROM log ORDER BY pos")
    assert [p for (p,) in rows] == list(range(1, len(rows) + 1))
    assert sql(url, "SELECT last_pos FROM sessions") == [(len(rows),)]
    assert sql(url, "SELECT count(*) FROM log_aside") == [(8,)]
    assert_whole(store, ids)


def test_two_gaps_one_of_two_rows_each_named_once(store, url):
    """A run of missing positions is one gap; each gap is one finding, and the repair takes
    back what each lost, numbered as for damaged file lines."""
    ids = build(store)
    for pos in (4, 5, 8):
        delete_row(url, pos)
    found = [(p.code, p.line, p.message) for p in fsck(store).errors]
    assert found == [("log-gap", 6, "session s1: log positions 4 to 5 are missing (next is 6)"),
                     ("log-gap", 9, "session s1: log position 8 is missing (next is 9)")], found
    report = repair_session(store, "s1")
    assert report.repaired and report.kept == ids and [d.line for d in report.damage] == [4, 5, 8]
    assert [r.how for r in report.recovered] == ["hidden", "head"]
    assert seqs(store) == [1, 2, 3, 5]
    assert_whole(store, ids)


def test_a_gap_in_a_fork(store, url):
    """A fork's own append lost at a gap comes back (its child names it), its prefix untouched."""
    base_ids = build(store)
    f = store.fork("s1", base_ids[1], session_id="f1")
    fork_ids = [f.append(make_entry("item", f.head, item=item(f"fork entry {i}")).data).id for i in range(3)]
    f.close()
    delete_row(url, 4, "f1")  # the fork's second append (rows: create, append, commit, append, ...)
    assert [p.code for p in fsck(store).errors] == ["log-gap"]
    assert_refused_by_sweep(store, url, "f1")
    report = repair_session(store, "f1")
    assert report.repaired and report.kept == fork_ids and [r.how for r in report.recovered] == ["hidden"]
    assert seqs(store, "f1") == [1, 2, 3]
    s = store.read("f1")
    assert s.prefix == base_ids[:2]
    s.close()
    assert_whole(store, fork_ids, "f1")
    assert_whole(store, base_ids, "s1")


def test_an_entry_named_only_by_the_lost_row_waits_for_repair(store, url):
    """The case that lost data: an entry whose append row went, named by no other record but
    the row's head. The sweep refused nothing and deleted its objects; now it refuses until
    the repair takes the entry back from the objects, and keeps it after."""
    ids = build(store, n=2)
    s = store.session("s1")
    s.set_head(ids[0], expected=ids[1])  # a branch: its entry names ids[0], and the head moves to it
    branch = s.append(make_entry("item", ids[0], item=item("a branch")).data).id
    s.close()
    ((pos,),) = sql(url, "SELECT pos FROM log WHERE op = 'append' AND seq = 3")
    delete_row(url, pos)
    assert_refused_by_sweep(store, url)
    assert store.objects.exists("entries", branch)
    report = repair_session(store, "s1")
    assert report.repaired and branch in report.kept and report.head == branch
    assert_whole(store, [*ids, branch])


def test_a_gap_in_rows_a_kept_snapshot_stands_for(store, url, monkeypatch):
    """An open that starts from a kept snapshot reads none of the rows it stands for, and
    still reads the session right; verify, a sweep and repair read every row, and find the gap."""
    monkeypatch.setattr(pg_sessions, "COMPACT_AT_CLOSE", 1)
    ids = build(store)
    assert sql(url, "SELECT count(*) FROM states WHERE kind = 2") == [(1,)]
    delete_row(url, 4)
    assert [p["code"] for p in verify_stored(store, "s1", as_export=True).problems] == ["log-gap"]
    assert_refused_by_sweep(store, url)
    report = repair_session(store, "s1")
    assert report.repaired and report.kept == ids
    assert sql(url, "SELECT count(*) FROM states WHERE kind = 2") == [(0,)]
    assert_whole(store, ids)


def test_the_command_line_names_the_gap_and_repairs_it(store, url):
    ids = build(store)
    delete_row(url, 4)

    def run(*argv: str) -> Any:
        return CliRunner().invoke(main, list(argv), env={"AGENTSESSION_STORE": url}, catch_exceptions=False)

    r = run("verify", "s1")
    assert r.exit_code == 1 and "log position 4 is missing (next is 5)" in r.output, r.output
    r = run("sweep", "--grace", "0")
    assert r.exit_code == 1 and "agentsession repair s1" in r.output, r.output
    r = run("repair", "-y", "s1")
    assert r.exit_code == 0 and "recovered" in r.output and "log-gap" in r.output, r.output
    assert run("verify", "s1").exit_code == 0
    assert store.read("s1").log_order == ids


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_file_backend_repairs_the_same_record_removed_to_the_same_entries(store, url, tmp_path: Path, case):
    """The planner is shared: a file log with the same record removed (its chain then broken
    at the line after) is repaired to the same entries, numbers and head."""
    pos, numbers = CASES[case]
    ids = build(store)
    delete_row(url, pos)
    repair_session(store, "s1")
    assert fsck(store).ok
    files = Store.init(tmp_path / "files")
    try:
        fids = build(files)
        assert fids == ids  # (the same entries: ids hash what they hold)
        log = tmp_path / "files" / "sessions" / "s1" / "log"
        lines = [ln for ln in log.read_bytes().split(b"\n") if ln]
        assert len(lines) >= 9 and b'"op":"create"' in line_body(lines[0])
        del lines[pos - 1]
        log.write_bytes(b"".join(ln + b"\n" for ln in lines))
        report = repair_session(files, "s1")
        assert report.repaired and report.kept == ids and report.head == ids[-1]
        assert seqs(files) == numbers == seqs(store)
    finally:
        files.close()


# -- session 41's second round: what a kept snapshot and the session's row prove ---------------


def side_leaf_under_a_snapshot(st: Store, url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], str]:
    """Rows 1 create, 2..7 three appends and commits, 8 the append of a side leaf (parent
    ids[1], the head left on ids[2]), 9 its commit; a snapshot kept at row 9."""
    monkeypatch.setattr(pg_sessions, "COMPACT_AT_CLOSE", 1)
    ids = build(st, n=3)
    s = st.session("s1")
    leaf = s.append(make_entry("item", ids[1], item=item("a side leaf")).data).id
    assert s.head == ids[2]
    s.close()
    assert sql(url, "SELECT pos FROM states WHERE kind = 2") == [(9,)]
    assert sql(url, "SELECT pos FROM log WHERE op = 'append' AND seq = 4") == [(8,)]
    return ids, leaf


@pytest.mark.parametrize("how", ["deleted", "garbled"])
def test_an_entry_a_kept_snapshot_names_comes_back_with_its_number(store, url, monkeypatch, how):
    """The side leaf's append row, among the rows a trusted snapshot stands for, is lost (a
    gap) or no record: nothing but the snapshot names the leaf. Repair planned from the rows
    only, dropped the snapshot and rewrote the log without the leaf, saying nothing, and the
    next sweep deleted its objects; now it plans from the snapshot (an open's proof) and
    the rows after it, and the leaf comes back with its own number, listed as recovered."""
    ids, leaf = side_leaf_under_a_snapshot(store, url, monkeypatch)
    if how == "deleted":
        delete_row(url, 8)
    else:
        sql(url, "UPDATE log SET record = 'not a record' WHERE pos = 8")
    with store.read("s1") as s:  # (the open starts from the snapshot: it reads the leaf)
        assert leaf in s.log_order and s.head == ids[2]
    if how == "deleted":
        assert_refused_by_sweep(store, url)
    report = repair_session(store, "s1")
    assert report.repaired and not report.dropped
    assert report.kept == [*ids, leaf] and report.head == ids[2]
    assert [(r.entry, r.seq, r.how) for r in report.recovered] == [(leaf, 4, "snapshot")]
    assert [d.line for d in report.damage] == [8] and "kept snapshot" in report.damage[0].reason
    store.sweep(grace=0)
    assert store.objects.exists("entries", leaf)
    assert seqs(store) == [1, 2, 3, 4]
    with store.read("s1") as s:
        assert s.head == ids[2]
    assert_whole(store, [*ids, leaf])


def test_a_snapshot_that_says_other_than_the_rows_names_what_it_held(store, url, monkeypatch):
    """A snapshot the rows under it that read contradict (a row holding a record it lacks) is
    not planned from: the rows are, and each entry it names that the plan does not keep is
    listed in a note, never dropped without a word."""
    ids, leaf = side_leaf_under_a_snapshot(store, url, monkeypatch)
    delete_row(url, 8)
    sql(url, """UPDATE log SET record = '{"op":"mark","mark":"record"}', op = 'mark' WHERE pos = 5""")
    report = repair_session(store, "s1")
    assert report.repaired and report.kept == ids and leaf not in report.kept
    notes = [n for n in report.notes if n.code == "snapshot-disagrees"]
    assert len(notes) == 1 and leaf in notes[0].message and "1 is not kept" in notes[0].message, report.notes


def test_a_lost_head_record_leaves_the_head_where_the_session_row_says(store, url):
    """The head moved to a side branch and back; the row moving it back is lost. The replay
    of the rows left ends on the branch; the session's row, written with the rows, names the
    main line's tip: the head stays there, with a note (it moved to the branch, silently)."""
    ids = build(store)
    s = store.session("s1")
    s.set_head(ids[1], expected=ids[3])
    branch = s.append(make_entry("item", ids[1], item=item("a side branch")).data).id
    s.set_head(ids[3], expected=branch)
    s.close()
    ((pos,),) = sql(url, "SELECT max(pos) FROM log WHERE op = 'head'")
    delete_row(url, pos)
    report = repair_session(store, "s1")
    assert report.repaired and report.head == ids[3] and report.kept == [*ids, branch]
    assert [n.code for n in report.notes if n.code == "head-from-row"] == ["head-from-row"], report.notes
    assert "session's row" in report.head_note
    with store.read("s1") as s:
        assert s.head == ids[3]
    assert fsck(store).ok and verify_stored(store, "s1", as_export=True).problems == []


def test_a_lost_mark_record_leaves_the_mark_the_session_row_says(store, url):
    """A mirror's mark row lost: the replay says record (locally writable); the session's row
    says mirror, and the repair keeps it, with a note (it made the session writable, silently)."""
    ids = build(store)
    s = store.session("s1")
    s.set_mark("mirror")
    s.close()
    ((pos,),) = sql(url, "SELECT max(pos) FROM log WHERE op = 'mark'")
    delete_row(url, pos)
    report = repair_session(store, "s1")
    assert report.repaired and report.mark == "mirror" and report.kept == ids
    assert any(n.code == "mark-from-row" for n in report.notes), report.notes
    assert sql(url, "SELECT mark FROM sessions") == [("mirror",)]
    with store.read("s1") as s:
        assert s.mark == "mirror"
    assert fsck(store).ok


def test_the_session_row_does_not_win_where_no_lost_row_can_explain_it(store, url):
    """The row's head and mark stand over the replay only where a line the damage took lies
    after the last head move (mark) that reads: a commit row lost before every append that
    moved the head, or a mark row that still reads after the gap, say the row is what is
    wrong (a second fault), and the replay stands; so do rows past the row's length (the row
    is older than the log), whatever the gap."""
    ids = build(store)
    delete_row(url, 3)  # a commit row: appends at rows 4, 6 and 8 each moved the head after it
    sql(url, "UPDATE sessions SET head = %s", [ids[0]])
    report = repair_session(store, "s1")
    assert report.repaired and report.head == ids[3] and not any(n.code == "head-from-row" for n in report.notes)
    with store.read("s1") as s:
        assert s.head == ids[3]
    assert fsck(store).ok


def test_a_mark_that_reads_after_the_gap_stands_over_the_row(store, url):
    ids = build(store)
    s = store.session("s1")
    s.set_mark("mirror")
    s.close()
    delete_row(url, 3)
    sql(url, "UPDATE sessions SET mark = 'record'")  # the row says otherwise than the mark row that reads
    report = repair_session(store, "s1")
    assert report.repaired and report.mark == "mirror" and report.kept == ids
    assert not any(n.code == "mark-from-row" for n in report.notes)
    assert sql(url, "SELECT mark FROM sessions") == [("mirror",)]


def test_rows_past_the_row_length_leave_the_replay_s_head(store, url):
    """A head row past a stale last_pos, and a gap: the row's head is older than the log's."""
    ids = build(store)
    s = store.session("s1")
    s.set_head(ids[1], expected=ids[3])
    s.close()
    ((last,),) = sql(url, "SELECT max(pos) FROM log")
    sql(url, "UPDATE sessions SET last_pos = 9, head = %s", [ids[3]])
    delete_row(url, 3)
    report = repair_session(store, "s1")
    assert report.repaired and report.head == ids[1], (last, report.head)
    assert not any(n.code == "head-from-row" for n in report.notes)
    assert fsck(store).ok


def test_a_snapshot_the_gap_leaves_untrusted_still_names_what_the_plan_loses(store, url, monkeypatch):
    """A gap over the row a kept snapshot ends at leaves it untrusted (an open would not
    read it), so the repair plans from the rows; an entry only the snapshot names was lost
    without a word. The note says it, by name."""
    monkeypatch.setattr(pg_sessions, "COMPACT_AT_CLOSE", 1)
    ids = build(store, n=3)
    s = store.session("s1")
    leaf = s.append(make_entry("item", ids[1], item=item("a side leaf")).data).id
    s.close()
    monkeypatch.setattr(pg_sessions, "COMPACT_AT_CLOSE", 10**9)
    s = store.session("s1")
    s.append(make_entry("item", s.head, item=item("more")).data)
    s.close()
    ((end,),) = sql(url, "SELECT pos FROM states WHERE kind = 2")
    for pos in (end - 1, end):  # the leaf's append and its commit, the row the snapshot ends at
        delete_row(url, pos)
    report = repair_session(store, "s1")
    notes = [n.message for n in report.notes if n.code == "snapshot-disagrees"]
    assert len(notes) == 1 and "not trusted" in notes[0] and leaf in notes[0], report.notes


def test_rows_past_the_row_length_are_named_beside_a_gap(store, url):
    """A gap and a row past the session row's length: fsck named only the gap; both now."""
    build(store)
    delete_row(url, 4)
    sql(url, "INSERT INTO log (session, pos, op, record) SELECT session, 10, 'commit', '{\"op\":\"commit\"}' FROM log "
             "WHERE pos = 9")
    found = sorted((p.code, p.line) for p in fsck(store).errors)
    assert found == [("log-gap", 5), ("log-length", None)], found
    report = repair_session(store, "s1")
    assert report.repaired
    assert fsck(store).ok


def test_the_file_backend_keeps_the_replay_where_head_and_mark_records_are_removed(tmp_path: Path):
    """The file backend's HEAD is written after the log, so a HEAD naming a kept entry the
    replay left is no proof the log moved there last: its repair keeps the replay's head and
    mark (docs/repair.md, "Where the indexes disagree with the replay"); pinned here beside
    the PostgreSQL tests above, which keep the session row's."""
    files = Store.init(tmp_path / "files")
    try:
        ids = build(files)
        s = files.session("s1")
        s.set_head(ids[1], expected=ids[3])
        branch = s.append(make_entry("item", ids[1], item=item("a side branch")).data).id
        s.set_head(ids[3], expected=branch)
        s.set_mark("mirror")
        s.close()
        log = tmp_path / "files" / "sessions" / "s1" / "log"
        lines = [ln for ln in log.read_bytes().split(b"\n") if ln]
        lines = [ln for ln in lines if b'"op":"mark"' not in ln]
        del lines[max(i for i, ln in enumerate(lines) if b'"op":"head"' in ln)]
        log.write_bytes(b"".join(ln + b"\n" for ln in lines))
        assert (tmp_path / "files" / "sessions" / "s1" / "HEAD").read_text().strip() == ids[3]
        report = repair_session(files, "s1")
        assert report.repaired and report.kept == [*ids, branch]
        assert (report.head, report.mark) == (branch, "record")
        assert not [n for n in report.notes if n.code in ("head-from-row", "mark-from-row")]
    finally:
        files.close()


def test_an_imported_session_s_snapshot_proves_a_branch_leaf(store, url, tmp_path: Path, monkeypatch):
    """An import keeps its snapshot at once (its first open reads none of its rows): a
    branch leaf's append row lost under it comes back from it at repair, as above."""
    monkeypatch.setattr(pg_sessions, "_SNAPSHOT_CREATED", 1)
    files = Store.init(tmp_path / "files")
    try:
        ids = build(files, "big", n=6)
        s = files.session("big")
        leaf = s.append(make_entry("item", ids[2], item=item("a side leaf")).data).id
        s.close()
        data = files.export("big")
    finally:
        files.close()
    store.import_bytes(data).close()
    assert sql(url, "SELECT count(*) FROM states WHERE kind = 2") == [(1,)]
    delete_row(url, *sql(url, "SELECT pos FROM log WHERE record LIKE %s", [f'%"entry":"{leaf}"%'])[0], sid="big")
    with store.read("big") as s:
        assert leaf in s.log_order
    report = repair_session(store, "big")
    assert report.repaired and report.kept == [*ids, leaf] and not report.dropped
    assert [(r.entry, r.how) for r in report.recovered] == [(leaf, "snapshot")]
    store.sweep(grace=0)
    assert store.objects.exists("entries", leaf)
    assert fsck(store).ok and verify_stored(store, "big", as_export=True).problems == []
    with store.read("big") as s:  # (an import is a mirror: no local append to try)
        assert s.log_order == [*ids, leaf] and s.head == ids[-1] and s.mark == "mirror"


def test_the_log_command_numbers_each_record_by_its_row_after_a_gap(store, url):
    """``agentsession log`` of a gapped PostgreSQL log: each record keeps its row's number
    (the line a finding names), where it was numbered by its place among the records that
    read, so every record after the gap was named one row early."""
    build(store)
    rows = [pos for (pos,) in sql(url, "SELECT pos FROM log WHERE session = (SELECT key FROM sessions WHERE id = 's1') "
                                  "ORDER BY pos", [])]
    delete_row(url, 3)
    r = CliRunner().invoke(main, ["--store", url, "log", "s1", "--json"])
    assert r.exit_code == 1  # (the gap is damage, said with its code)
    import json

    lines = [d["line"] for d in json.loads(r.stdout)]
    assert lines == [p for p in rows if p != 3]
    text = CliRunner().invoke(main, ["--store", url, "log", "s1"]).stdout.splitlines()[1:]
    assert [int(t.split()[0]) for t in text] == lines
