"""`agentsession migrate` of a store of the reference library's current layout ('cas 2').

The stores come from fixtures/reference_layout.py, a writer of that layout of the
project's own (written from go-cas-internals sections 1 to 3 and 8.4) that keeps
the truth beside the bytes; the tests compare a migration's result with it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentsession_cas import read_session_bytes
from agentsession_cas.backends.files import migrate as mig
from agentsession_cas.backends.files.layout import LAYOUT, layout_state
from agentsession_cas.backends.files.log import read_log
from agentsession_cas.backends.files.migrate_reference import migrate_reference, migrate_store, read_session_log
from agentsession_cas.backends.files.objects import FileObjects
from agentsession_cas.errors import LayoutError, MigrationBusyError, MigrationError, MirrorError
from agentsession_cas.store import Store
from agentsession_cas.store.refs import Refs
from test_migrate import cli, held, outcome, tree

REPO = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"fixtures_{name}", REPO / "fixtures" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


reference_layout = _load("reference_layout")
old_layout = _load("old_layout")


@pytest.fixture
def ref(tmp_path):
    return reference_layout.build_reference_scenario(tmp_path / "store")


# -- the layout's bytes, as the generator writes them ----------------------------------------


def test_the_generator_writes_the_layout_the_document_describes(ref):
    root = ref.root
    assert (root / "layout").read_bytes() == b"cas 2\n"
    assert os.readlink(root / "journal") == "layout/journal"
    assert (root / "refs" / "team%beta").read_text() == f"beta - {ref.ident('beta')}\n"
    # Every record line of every log is checksummed, but the damage the scenario plants.
    planted = {"eta": "torn", "zeta": "tail", "mirror": "newline"}
    for sid in ref.sessions:
        data = (root / "sessions" / sid / "log").read_bytes() if (root / "sessions" / sid / "log").exists() else b""
        lr = read_session_log(sid, data)
        assert [f.kind for f in lr.faults] == ([planted[sid]] if sid in planted else []), sid
        if data:
            assert lr.records[0].op == "create" and lr.records[1].op == "mark"
    assert b'"lazy":true' in (root / "sessions" / "beta" / "log").read_bytes()


def test_reading_a_session_log_by_the_reference_rules():
    line = reference_layout.record_line
    a = line({"op": "create", "session": "s"})
    b = line({"op": "mark", "session": "s", "mark": "record"})
    # An unterminated last line of whole records counts.
    assert [r.op for r in read_session_log("s", a + b[:-1]).records] == ["create", "mark"]
    # A record without a checksum is damage in a session log (the journal accepted one).
    lr = read_session_log("s", a + b'{"op":"sync","session":"s"}\n')
    assert [f.kind for f in lr.faults] == ["damaged"] and "without a checksum" in lr.faults[0].reason
    # Damage without a zero byte is damage; with zero bytes in every damaged line, a tail.
    lr = read_session_log("s", a + b"garbage\n" + b)
    assert [f.kind for f in lr.faults] == ["damaged"] and lr.cut_line is None
    lr = read_session_log("s", a + b"\x00\x00\x00\n" + b)
    assert [f.kind for f in lr.faults] == ["tail"] and lr.cut_line == 2 and [r.op for r in lr.records] == ["create"]
    # A record of another session is damage.
    assert read_session_log("t", a).faults[0].kind == "damaged"
    # A journal-only operation is no session log record.
    lr = read_session_log("s", a + line({"op": "delete", "session": "s"}))
    assert "no session log holds" in lr.faults[0].reason


# -- naming it, before a migration ----------------------------------------------------------------


def test_fsck_and_every_command_name_the_layout_instead_of_calling_it_unreadable(ref):
    before = tree(ref.root)
    assert layout_state(str(ref.root)) == "reference"
    result = cli(ref.root, "fsck")
    assert result.exit_code == 1
    assert "reference library's layout ('cas 2'" in result.stderr and "run `agentsession migrate`" in result.stderr
    with pytest.raises(LayoutError, match="reference library's layout"):
        Store(ref.root, readonly=True)
    assert cli(ref.root, "list").exit_code == 1
    assert tree(ref.root) == before


# -- the migration ----------------------------------------------------------------------


def test_migration_keeps_every_session_as_the_reference_writer_held_it(ref):
    expected = ref.expected()
    logs = {sid: (ref.root / "sessions" / sid / "log").read_bytes() for sid in expected}
    report = migrate_store(ref.root)
    assert report.status == "migrated" and not report.resumed
    root = ref.root
    assert (root / "layout").read_text() == LAYOUT + "\n"
    with Store(root, readonly=True) as store:
        assert store.list() == sorted(expected)
        for sid, want in expected.items():
            s = store.read(sid)
            assert s.log_order == want["entries"], sid
            assert (s.base, s.head, s.mark) == (want["base"], want["head"], want["mark"]), sid
            assert s.header.media == want["media"]
    assert {s.id: s.action for s in report.sessions} == {
        **{sid: "rebuild" for sid in expected}, "unfinished": "set-aside"}
    assert [re.sub(r"-[0-9]+$", "", n) for n in os.listdir(root / "trash")] == ["unfinished"]
    # The reference logs are kept byte for byte; its recovery leftovers are moved aside.
    for sid, data in logs.items():
        assert (root / "migrated" / "logs" / sid).read_bytes() == data
    assert sorted(os.listdir(root / "migrated" / "sessions" / "theta")) == [
        "cut-1700000000000000000", "damaged-1700000000000000001"]
    assert sorted(os.listdir(root / "sessions" / "theta")) == ["HEAD", "header", "log", "mark"]
    assert not (root / "sessions" / "alpha" / "summary").exists()
    # Losses: the lazy append a crash took, the one its recovery recorded, the tail.
    lost = {s.id: [x["entry"] for x in s.lost] for s in report.sessions if s.lost}
    assert lost == ref.lost
    for sid, entries in ref.lost.items():
        records = read_log((root / "sessions" / sid / "log").read_bytes()).records
        assert [r.get("entry") for r in records if r.op == "loss"] == entries
    assert [f.session for f in report.torn] == ["eta", "zeta"]
    # Media blobs moved to our space; the pack unpacked and gone.
    objects = FileObjects(str(root))
    try:
        assert objects.get("blobs", ref.blobs[0]).startswith(b"\x89PNG")
    finally:
        objects.close()
    assert not any(n.endswith(".pack") for n in os.listdir(root / "objects" / "pack"))


def test_refs_are_rewritten_and_a_recorded_update_is_made(ref):
    report = migrate_store(ref.root)
    assert sorted((r["name"], r["session"]) for r in report.refs) == [
        ("main", "alpha"), ("moved", "mirror"), ("team/beta", "beta")]
    with Store(ref.root, readonly=True) as store:
        refs = Refs(store)
        assert {r.name: (r.session, refs.state(r)) for r in refs.list()} == {
            "main": ("alpha", "ok"), "moved": ("mirror", "ok"), "team/beta": ("beta", "ok")}
        assert refs.get("team/beta").ident == ref.ident("beta")
    assert sorted(os.listdir(ref.root / "migrated" / "ref-logs")) == ["gone", "main", "moved", "team%beta"]
    assert not (ref.root / "logs").exists()


def test_after_migration_fsck_is_clean_and_every_session_verifies_exports_and_appends(ref):
    expected = ref.expected()
    migrate_store(ref.root)
    result = cli(ref.root, "fsck", "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["ok"], result.stdout
    assert [p for p in report["problems"] if p["severity"] != "note"] == []
    for sid in expected:
        verified = cli(ref.root, "verify", sid)
        assert verified.exit_code == 0, (sid, verified.stdout, verified.stderr)
        exported = cli(ref.root, "export", sid)
        assert exported.exit_code == 0
        assert not read_session_bytes(exported.stdout_bytes, source=sid).all_problems()
    with Store(ref.root) as store:
        alpha = store.session("alpha")
        result = alpha.append({"type": "item", "ts": "2026-04-01T00:00:00Z",
                               "item": {"type": "message", "role": "user", "content": "after the migration"}})
        assert result.outcome == "continued" and result.durable
        assert alpha.header.format != old_layout.OLD_FORMAT
        with pytest.raises(MirrorError):
            store.session("mirror").append({"type": "item", "ts": "2026-04-01T00:00:00Z",
                                            "item": {"type": "message", "role": "user", "content": "no"}})
    out = ref.root.parent / "media.jsonl"
    with Store(ref.root, readonly=True) as store:
        store.export_to("media", out)
    assert (ref.root.parent / "media" / ref.blobs[0][7:]).read_bytes().startswith(b"\x89PNG")


def test_the_command_migrates_and_says_what_it_did(ref):
    result = cli(ref.root, "migrate", "--yes")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "migrated the store at" in out and "rebuild    alpha: 7 entries" in out
    assert "ref        moved -> mirror (its log's last record moved it from alpha to mirror)" in out
    assert "kept       migrated/logs" in out
    again = cli(ref.root, "migrate")
    assert again.exit_code == 0 and "nothing to migrate" in again.stdout


def test_dry_run_changes_nothing_and_decides_as_the_migration_does(ref):
    before = tree(ref.root)
    dry = migrate_reference(ref.root, dry_run=True)
    assert dry.status == "dry-run" and tree(ref.root) == before
    result = cli(ref.root, "migrate", "--dry-run", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["status"] == "dry-run"
    assert tree(ref.root) == before
    real = migrate_reference(ref.root)
    assert [(s.id, s.action, s.head, s.mark, s.entries, s.lost) for s in dry.sessions] == [
        (s.id, s.action, s.head, s.mark, s.entries, s.lost) for s in real.sessions]


# -- refusals: nothing changed ---------------------------------------------------------------------


def test_damage_in_the_middle_of_a_log_refuses_and_skip_damaged_migrates_without_it(ref):
    log = ref.root / "sessions" / "alpha" / "log"
    lines = log.read_bytes().split(b"\n")
    n = len(lines) - 1  # the last record: the head move back to a2b
    assert lines[n - 1].startswith(b'{"op":"head"')
    lines[n - 1] = lines[n - 1].replace(b'"seq":', b'"seq":1')  # the checksum no longer matches
    log.write_bytes(b"\n".join(lines))
    before = tree(ref.root)
    with pytest.raises(MigrationError, match=f"sessions/alpha/log line {n} .*checksum mismatch.*--skip-damaged"):
        migrate_store(ref.root)
    assert tree(ref.root) == before
    result = cli(ref.root, "migrate", "--json")
    assert result.exit_code == 1 and json.loads(result.stdout)["status"] == "refused"
    report = migrate_store(ref.root, skip_damaged=True)
    alpha = next(s for s in report.sessions if s.id == "alpha")
    assert any(f"line {n}" in note and "--skip-damaged" in note for note in alpha.notes)
    # Without the head move, the head is where the leaf label left it.
    assert alpha.head == ref.sessions["alpha"].entries[3] and alpha.head != ref.sessions["alpha"].head
    assert cli(ref.root, "verify", "alpha").exit_code == 0


def test_a_pinned_ref_and_a_committed_append_without_objects_refuse(ref, tmp_path):
    ref.set_ref("pinned", "alpha", pin=ref.sessions["alpha"].entries[0])
    before = tree(ref.root)
    with pytest.raises(MigrationError, match="ref pinned pins entry"):
        migrate_store(ref.root)
    assert tree(ref.root) == before

    other = reference_layout.build_reference_scenario(tmp_path / "other")
    gone = other.sessions["epsilon"].entries[-1]
    other.object_path("entries", gone).unlink()
    before = tree(other.root)
    with pytest.raises(MigrationError, match=f"session epsilon: entry {gone} \\(log line [0-9]+\\) is committed but"):
        migrate_store(other.root)
    assert tree(other.root) == before


def test_a_process_holding_a_session_refuses_the_migration_as_busy(ref):
    before = tree(ref.root)
    with held(ref.root / "locks" / "beta"):
        with pytest.raises(MigrationBusyError, match="session beta"):
            migrate_store(ref.root)
        result = cli(ref.root, "migrate", "--yes")
        assert result.exit_code == 3
    assert tree(ref.root) == before
    assert migrate_store(ref.root).status == "migrated"


# -- crashes and resumption ---------------------------------------------------------------------


def test_a_crash_after_any_step_is_finished_by_running_again(tmp_path):
    build = reference_layout.build_reference_scenario
    clean = build(tmp_path / "clean")
    migrate_store(clean.root)
    expected = outcome(clean.root)
    seen: list[str] = []
    orig = mig._reached
    mig._reached = seen.append
    try:
        migrate_store(build(tmp_path / "points").root)
    finally:
        mig._reached = orig
    assert seen[0] == "locked" and seen[-1] == "cleanup" and "refs" in seen
    assert [p for p in seen if p.startswith("session:")] == [f"session:{s}" for s in sorted(
        set(clean.expected()) | clean.set_aside)]
    for n, point in enumerate(seen):
        store = build(tmp_path / f"crash{n}")

        def crash(reached, point=point):
            if reached == point:
                raise OSError(f"injected crash after {point}")

        mig._reached = crash
        try:
            with pytest.raises(OSError, match="injected"):
                migrate_store(store.root)
        finally:
            mig._reached = orig
        assert layout_state(str(store.root)) == "reference", point
        hint = "did not finish" if point not in ("locked", "planned") else "only once migrated"
        with pytest.raises(LayoutError, match=hint):
            Store(store.root, readonly=True)
        report = migrate_store(store.root)
        assert report.status == "migrated", point
        assert report.resumed == (point not in ("locked", "planned")), point
        assert outcome(store.root) == expected, point
        assert migrate_store(store.root).status == "current"
    assert mig._reached is orig


@pytest.mark.parametrize("point", ["packs-staged", "session:epsilon", "refs"])
def test_a_killed_process_is_finished_by_running_again(tmp_path, point):
    clean = reference_layout.build_reference_scenario(tmp_path / "clean")
    migrate_store(clean.root)
    store = reference_layout.build_reference_scenario(tmp_path / "store")
    code = (
        "import os, sys\n"
        "from agentsession_cas.backends.files import migrate as m, migrate_reference as r\n"
        "m._reached = lambda p: os._exit(137) if p == sys.argv[2] else None\n"
        "r.migrate_store(sys.argv[1])\n"
        "sys.exit(0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(store.root), point], cwd=REPO, timeout=60)
    assert proc.returncode == 137
    result = cli(store.root, "migrate", "--yes")
    assert result.exit_code == 0, result.stderr
    assert "finishing a migration that did not" in result.stdout
    assert outcome(store.root) == outcome(clean.root)
