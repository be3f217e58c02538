"""Faults found by trying the operator's commands by hand (session 40's hunt over repair,
migrate, fsck, import and verify), each held here to what the docs promise.

- A session file that is no regular file (``import <(zcat s.jsonl.gz)``, a FIFO): it
  can be read once. ``import`` read its header in one open and the entries in another,
  so a pipe gave "the file is empty: no header" and a FIFO waited for ever; ``verify``
  read a branch's lines again where they lay and ended in "Illegal seek". It is read
  whole now, as standard input is (``reader.read_if_stream``, ``verify_file``).
- ``migrate`` echoed a journal's or a reference log's values whole in its refusal (a
  5 MB mark was a 5 MB message, twice in ``--json``): cut to one short line now, as
  every other error quotes what it was given (``errors.quoted``).
- PostgreSQL's fsck named every log row after a missing position as missing too (one
  row gone from a log of 13 was eight ``log-gap`` errors): one gap is one finding.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

import pg_server
from agentsession_cas import Header, make_entry
from agentsession_cas.backends.files.migrate_reference import migrate_store
from agentsession_cas.backends.postgresql.database import parse_url
from agentsession_cas.errors import MigrationError
from agentsession_cas.format.reader import verify_file
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from agentsession_cas.store.url import open_store
from agentsession_cli.main import main
from test_media_check import exported  # noqa: F401  (the fixture: a sidecar session's export)
from test_migrate import old_layout
from test_migrate_reference import reference_layout

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def cli(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def pipe_path(data: bytes) -> tuple[str, int]:
    """A path that reads ``data`` from a pipe, as a shell's ``<(cat FILE)`` gives one
    (the whole of it sits in the pipe's buffer: no writer need run beside the read)."""
    assert len(data) < 60_000
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    return f"/dev/fd/{r}", r


# -- a session file that is no regular file ---------------------------------------------


def test_import_of_a_pipe_reads_it_once(tmp_path):
    root = tmp_path / "store"
    Store.init(root).close()
    data = (FIXTURES / "basic.jsonl").read_bytes()
    path, fd = pipe_path(data)
    try:
        r = cli("--store", str(root), "import", path, "--json")
    finally:
        os.close(fd)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["entries"] == 7
    with Store(root, readonly=True) as st:
        assert st.export(out["session"]) == data


def test_show_and_the_library_import_of_a_pipe_read_it_once(tmp_path):
    """``show <(cat f)`` opened the file for its header and again for the rest (the second
    open found nothing: 'the header does not parse'); ``Store.import_file`` of a pipe did
    the same for a library caller. Both now read such a file once, as standard input."""
    data = (FIXTURES / "branches.jsonl").read_bytes()
    path, fd = pipe_path(data)
    try:
        piped = cli("show", path)
    finally:
        os.close(fd)
    assert piped.exit_code == 0, piped.output
    assert piped.stdout == cli("show", str(FIXTURES / "branches.jsonl")).stdout
    path, fd = pipe_path(data)
    try:
        with Store.init(tmp_path / "store") as st:
            session = st.import_file(path)
            assert st.export(session.id) == data
    finally:
        os.close(fd)


def test_import_of_a_fifo_reads_it_once(tmp_path):
    """A FIFO opened a second time waits for a writer: the import must not open it twice.
    (So that the old fault fails rather than hangs, a second writer opens and closes the
    FIFO whenever a reader waits on it once the bytes were written: a second open then
    finds it empty.)"""
    root = tmp_path / "store"
    Store.init(root).close()
    data = (FIXTURES / "basic.jsonl").read_bytes()
    fifo = tmp_path / "session.fifo"
    os.mkfifo(fifo)
    done = threading.Event()

    def writer() -> None:
        with open(fifo, "wb") as f:
            f.write(data)
        while not done.wait(0.02):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO while no reader waits
            except OSError:
                pass

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        r = cli("--store", str(root), "import", str(fifo), "--json")
    finally:
        done.set()
        t.join(10)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["entries"] == 7


def test_import_of_a_fifo_into_no_store_leaves_the_fifo_unread(tmp_path):
    """A wrong ``--store`` is refused before the FIFO is opened: its writer's bytes wait for
    the next try instead of being read and dropped (the import read the stream first)."""
    data = (FIXTURES / "basic.jsonl").read_bytes()
    fifo = tmp_path / "session.fifo"
    os.mkfifo(fifo)
    t = threading.Thread(target=lambda: fifo.write_bytes(data), daemon=True)
    t.start()  # waits in open() until a reader opens the FIFO
    r = cli("--store", str(tmp_path / "nowhere"), "import", str(fifo))
    assert r.exit_code != 0 and "store" in r.output, r.output
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # never waits, whether a writer waits or not
    try:
        t.join(10)  # the writer, let in by this reader, writes and closes
        assert not t.is_alive()
        got = b""
        while chunk := os.read(fd, 1 << 16):
            got += chunk
    finally:
        os.close(fd)
    assert got == data


def test_verify_of_a_pipe_holding_branches(tmp_path):
    """Checking a branch's entries reads lines again; from a pipe they are held instead."""
    data = (FIXTURES / "branches.jsonl").read_bytes()
    path, fd = pipe_path(data)
    try:
        report = verify_file(path)
    finally:
        os.close(fd)
    assert report.ok and report.entries == verify_file(FIXTURES / "branches.jsonl").entries
    path, fd = pipe_path(data)
    try:
        r = cli("verify", path)
    finally:
        os.close(fd)
    assert r.exit_code == 0 and "0 problem(s)" in r.stdout, r.output


# -- migrate quotes what the files it reads say ------------------------------------------


def test_migrate_cuts_a_huge_journal_value_to_one_line(tmp_path):
    root = tmp_path / "old"
    old_layout.build_scenario(root)
    journal = root / "journal"
    lines = journal.read_bytes().split(b"\n")
    lines.insert(3, b'{"op":"mark","session":"alpha","mark":"' + b"x" * 1_000_000 + b'"}')
    journal.write_bytes(b"\n".join(lines))
    r = cli("--store", str(root), "migrate", "--json")
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert out["status"] == "refused"
    assert [p["code"] for p in out["problems"]][:1] == ["log-damage"]
    assert "1000000 characters" in out["problems"][0]["message"]
    assert max(len(p["message"]) for p in out["problems"]) < 400, [len(p["message"]) for p in out["problems"]]
    assert len(out["error"]) < 2000
    assert len(r.stdout) < 20_000


def test_migrate_of_a_reference_store_cuts_huge_values_in_logs_and_refs(tmp_path):
    root = tmp_path / "ref"
    reference_layout.build_reference_scenario(root)
    log = root / "sessions" / "alpha" / "log"
    huge = "s" * 300_000
    log.write_bytes(log.read_bytes() + reference_layout.ref_log_line({"op": "mark", "session": huge, "mark": "record"}))
    (root / "refs" / "wide").write_text(f"{huge}\n")
    with pytest.raises(MigrationError) as caught:
        migrate_store(str(root))
    problems = caught.value.problems
    assert {"log-damage", "bad-ref"} <= {p["code"] for p in problems}, problems
    assert all(len(p["message"]) < 400 for p in problems), [p["message"][:100] for p in problems]
    assert len(str(caught.value)) < 2000


# -- PostgreSQL: one gap in a log, one finding ---------------------------------------------


def test_postgresql_fsck_names_a_missing_log_position_once():
    url = pg_server.fresh_schema("hunt_gap")
    with open_store(url, create=True) as st:
        s = st.create(Header.new("s1"))
        for i in range(6):
            s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"m{i}"}})
        s.close()
        import psycopg

        conninfo, schema = parse_url(url)
        with psycopg.connect(conninfo, autocommit=True) as c:
            c.execute(f"SET search_path TO {schema}")
            c.execute("DELETE FROM log WHERE pos = 5")
        gaps = [p for p in fsck(st).problems if p.code == "log-gap"]
    assert [(p.line, p.message) for p in gaps] == [(6, "session s1: log position 5 is missing (next is 6)")]


def test_migrate_of_a_store_path_that_is_a_file_is_refused_as_no_store(tmp_path):
    """Every command says `no store` of a --store that is a file; migrate said
    "PATH/journal: Not a directory" (os_error), where its refusal report is due."""
    path = tmp_path / "session.jsonl"
    path.write_bytes((FIXTURES / "basic.jsonl").read_bytes())
    r = cli("--store", str(path), "migrate", "--json")
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert (out["status"], out["code"]) == ("refused", "migration") and "no store" in out["error"], out
    assert path.read_bytes() == (FIXTURES / "basic.jsonl").read_bytes()


def test_a_lock_file_that_is_a_directory_is_named_so_not_a_session_file(tmp_path):
    """Every EISDIR was "is a directory, not a session file", a lock's too: only a session
    file named where one is read says that (the reader's own error)."""
    root = tmp_path / "store"
    with Store.init(root) as st:
        st.create(Header.new("s1"))
    lock = root / "locks" / "s1.lock"
    lock.unlink()
    lock.mkdir()
    r = cli("--store", str(root), "repair", "s1", "--yes")
    assert r.exit_code == 1
    assert "s1.lock: Is a directory" in r.output and "session file" not in r.output, r.output
    r = cli("--store", str(root), "import", str(tmp_path))
    assert r.exit_code == 1 and "is a directory, not a session file" in r.output, r.output


# -- repair of a compacted log whose snapshot line is damaged -------------------------------


def test_repair_keeps_what_a_damaged_snapshot_line_still_proves(tmp_path):
    """A compaction folds a session's appends into one snapshot line (every id, 32 bytes
    in base64). One flipped byte in it lost, at repair, every entry HEAD's path does not
    reach (an abandoned branch), named nowhere (not in `dropped`, no note), and a sweep
    then removed their objects; the numbers HEAD's path was taken back under ran into
    the ones the snapshot had given out. The ids the line still spells whole, proved
    by their objects, are kept now (`salvaged`), each at its place."""
    root = tmp_path / "store"
    with Store.init(root) as st:
        s = st.create(Header.new("big"))
        ids = [s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"m{i}"}}).id
               for i in range(700)]
        branch = s.append(make_entry("item", ids[10], item={"type": "message", "role": "user", "content": "aside"}).data)
        assert branch.outcome == "branched"
        tail = [s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"t{i}"}}).id
                for i in range(3)]
    log = root / "sessions" / "big" / "log"
    lines = log.read_bytes().split(b"\n")
    assert b'{"entries":"' in lines[1], "the log was not compacted"
    with Store(root, readonly=True) as st:
        want = st.read("big").log_order
    assert want == ids + [branch.id] + tail
    broken = bytearray(lines[1])
    broken[2000] ^= 1  # inside the base64 of the ids: one entry's id no longer reads
    log.write_bytes(b"\n".join([lines[0], bytes(broken), *lines[2:]]))
    r = cli("--store", str(root), "repair", "big", "--json", "--yes")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["repaired"] and out["dropped"] == [], out["dropped"]
    with Store(root, readonly=True) as st:
        got = st.read("big")
        assert got.head == tail[-1]
        assert set(got.log_order) == set(want)  # the branch too
        assert [e for e in got.log_order if e in set(ids)] == ids  # in their order
    assert out["seq"] >= len(want)
    assert fsck(root).ok
    assert cli("--store", str(root), "verify", "big").exit_code == 0


def test_repair_of_a_session_whose_header_is_gone_everywhere_does_not_send_the_operator_back_to_repair(tmp_path):
    """The header file gone and the log's create record (which holds the header) damaged
    too: nothing says what the session is, and repair refuses, as repair.md says. It
    refused with the damage's own advice, "run `agentsession repair s1`": the command
    the operator had just run. It names what is missing and what to do now."""
    root = tmp_path / "store"
    with Store.init(root) as st:
        s = st.create(Header.new("s1"))
        s.append({"type": "item", "item": {"type": "message", "role": "user", "content": "hi"}})
    sdir = root / "sessions" / "s1"
    (sdir / "header").unlink()
    data = bytearray((sdir / "log").read_bytes())
    data[60] ^= 1  # inside the create record: its checksum fails
    (sdir / "log").write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in sdir.iterdir()}
    r = cli("--store", str(root), "repair", "s1", "--yes", "--json")
    assert r.exit_code == 1
    err = json.loads(r.stderr)["error"]
    assert "repair s1`" not in err["message"] and "header" in err["message"], err
    assert {p.name: p.read_bytes() for p in sdir.iterdir()} == before


# -- a damaged snapshot line, again: what a review of the repair above found ----------------


def _msg(text: str) -> dict:
    return {"type": "item", "item": {"type": "message", "role": "user", "content": text}}


def _big_state(root: Path) -> tuple[str | None, dict[str, int | None]]:
    """The session's head, and each entry's sequence number, in log order."""
    with Store(root, readonly=True) as st:
        s = st.read("big")
        return s.head, {e: s.state.own.get(e) for e in s.log_order}


def _damaged_snapshot(root: Path, *places: int, flip: bool = False) -> None:
    """Change bytes of the compacted log's snapshot line (its second): each to ``!`` (no
    base64 character), or with ``flip`` its low bit."""
    log = root / "sessions" / "big" / "log"
    lines = log.read_bytes().split(b"\n")
    assert b'"op":"snapshot"' in lines[1], "the log was not compacted"
    broken = bytearray(lines[1])
    for at in places:
        broken[at] = broken[at] ^ 1 if flip else 0x21
    log.write_bytes(b"\n".join([lines[0], bytes(broken), *lines[2:]]))


def _compacted_with_a_branch(root: Path, at: int) -> str:
    """A session of 700 entries and one more off entry ``at`` (an abandoned branch), closed
    (its log compacted); the branch's id."""
    with Store.init(root) as st:
        s = st.create(Header.new("big"))
        ids = [s.append(_msg(f"m{i}")).id for i in range(700)]
        return s.append(make_entry("item", ids[at], item={"type": "message", "role": "user", "content": "aside"}).data).id


def _repaired(root: Path) -> dict:
    r = cli("--store", str(root), "repair", "big", "--json", "--yes")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("where", ["an id", "the checksum"])
def test_repair_of_a_damaged_snapshot_keeps_the_head_the_log_set(tmp_path, where):
    """The head moved back (set_head) and a branch grew from there before the log was
    compacted. The entries taken back from the damaged snapshot each continued the head
    as an append does, so the head ended on the abandoned branch's last entry: the live
    branch changed silently. The snapshot's own ``head`` member still reads: the head
    goes there."""
    root = tmp_path / "store"
    with Store.init(root) as st:
        s = st.create(Header.new("big"))
        ids = [s.append(_msg(f"m{i}")).id for i in range(700)]
        s.set_head(ids[5], expected=ids[-1])
        live = s.append(_msg("the live branch, from m5")).id
    head0, own0 = _big_state(root)
    assert head0 == live
    _damaged_snapshot(root, 2000 if where == "an id" else 3, flip=True)  # (the checksum: the record reads whole)
    _repaired(root)
    head1, own1 = _big_state(root)
    assert head1 == live and own1 == own0


@pytest.mark.parametrize("damaged", [(1000,), (1000, 5000), (46 + 4 * 3210,)])  # (the last: one group across two ids)
def test_repair_of_a_snapshot_with_ids_it_cannot_spell_keeps_an_abandoned_branch(tmp_path, damaged):
    """An id the damaged line no longer spells comes back (hidden) where a kept entry
    names it, and needs a number too. The line's numbers were counted by the ids it still
    spelled (plus one): with two such ids the first got none ('no-seq'), every entry after
    it was dropped, and the branch off the path was lost. The line's ids are counted by
    its base64's length, and each is numbered as the line's ``seqs`` say."""
    root = tmp_path / "store"
    branch = _compacted_with_a_branch(root, 600)
    _, own0 = _big_state(root)
    _damaged_snapshot(root, *damaged)
    out = _repaired(root)
    _, own1 = _big_state(root)
    assert branch in own1 and own1 == own0, out["dropped"][:3]
    assert out["dropped"] == [] and out["seq"] == 701
    assert [n["code"] for n in out["notes"]] == ["snapshot-ids-unread"]


def test_repair_of_a_damaged_snapshot_says_what_it_could_not_spell(tmp_path):
    """The last id of a compacted log (a branch's entry, off HEAD's path, that nothing
    names) lies in the damaged base64 group: it cannot come back. The report said nothing
    of it, and every kept entry was numbered one higher (its number given to another).
    Now a note says how many ids of the line did not read, and each kept entry keeps its
    number; the lost one's is spent."""
    root = tmp_path / "store"
    branch = _compacted_with_a_branch(root, 10)
    _, own0 = _big_state(root)
    log = root / "sessions" / "big" / "log"
    line = log.read_bytes().split(b"\n")[1]
    _damaged_snapshot(root, line.index(b'"', line.index(b'{"entries":"') + 12) - 3, flip=True)
    out = _repaired(root)
    _, own1 = _big_state(root)
    assert set(own0) - set(own1) == {branch}
    assert all(own1[e] == own0[e] for e in own1) and out["seq"] == 701
    notes = [n for n in out["notes"] if n["code"] == "snapshot-ids-unread"]
    assert notes and "held 701 entries, and 1 of their ids" in notes[0]["message"], out["notes"]


def test_migrate_cuts_a_huge_settled_count(tmp_path):
    """The settled-count refusal quoted the journal's value whole: a 1 MB ``seq`` was a
    1 MB problem."""
    root = tmp_path / "old"
    old_layout.build_scenario(root)
    journal = root / "journal"
    journal.write_bytes(journal.read_bytes().rstrip(b"\n") + b"\n"
                        + b'{"op":"settled","session":"alpha","seq":"' + b"9" * 1_000_000 + b'"}\n')
    r = cli("--store", str(root), "migrate", "--json")
    assert r.exit_code == 1
    assert max(len(p["message"]) for p in json.loads(r.stdout)["problems"]) < 400


def test_verify_of_a_sidecar_file_through_a_pipe_leaves_its_media_unchecked_as_a_stream_does(exported):  # noqa: F811
    """A pipe (``/dev/fd/N``) has no directory of blobs beside it: its media is unchecked,
    as standard input's is, not reported missing from ``/dev/fd/<session id>/``."""
    from agentsession_cas.format.reader import verify_bytes

    out, _ = exported
    data = out.read_bytes()
    r, w = os.pipe()
    os.write(w, data)  # (under the pipe's buffer: no writer thread needed)
    os.close(w)
    try:
        report = verify_file(f"/dev/fd/{r}")
    finally:
        os.close(r)
    stream = verify_bytes(data, source="<stdin>")
    assert report.ok and [p.code for p in report.problems] == [p.code for p in stream.problems] == []
    assert "media-unchecked" in [n.code for n in report.notes]


def test_an_append_after_a_damaged_snapshot_in_its_damaged_region_keeps_the_head(tmp_path):
    """The snapshot's head was put back after everything its damaged region took back, so
    an append after the snapshot, damaged with it (one region), lost the head to the
    snapshot's: the head went back to m699 with nothing said (reviewer V9). It is put
    back at the snapshot line's own place, before the lines after it."""
    root = tmp_path / "store"
    with Store.init(root) as st:
        s = st.create(Header.new("big"))
        for i in range(700):
            s.append(_msg(f"m{i}"))
    with Store(root) as st:
        d = st.session("big").append(_msg("after the compaction")).id
    head0, own0 = _big_state(root)
    assert head0 == d
    log = root / "sessions" / "big" / "log"
    lines = log.read_bytes().split(b"\n")
    l1, l2 = bytearray(lines[1]), bytearray(lines[2])
    l1[3] ^= 1  # both lines' checksums: every record still reads whole, one damaged region
    l2[3] ^= 1
    log.write_bytes(b"\n".join([lines[0], bytes(l1), bytes(l2), *lines[3:]]))
    _repaired(root)
    head1, own1 = _big_state(root)
    assert head1 == d and own1 == own0
