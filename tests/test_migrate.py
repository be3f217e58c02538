"""`agentsession migrate`: stores of the earlier journal layout, converted in place.

The old stores come from fixtures/old_layout.py, a writer of the earlier
layout of the project's own that keeps the truth (what the earlier writer
held in memory) beside the bytes; the tests compare a migration's result
with that truth, then use the migrated store as any other.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import read_session_bytes
from agentsession_cas.backends.files import migrate as mig
from agentsession_cas.backends.files.layout import LAYOUT
from agentsession_cas.backends.files.log import read_log
from agentsession_cas.backends.files.migrate import crc32c, layout_state, migrate, read_journal
from agentsession_cas.backends.files.objects import SPACES, FileObjects
from agentsession_cas.errors import LayoutError, MigrationBusyError, MigrationError, MirrorError
from agentsession_cas.store import Store
from agentsession_cli import migrate_command, terminal
from agentsession_cli.main import main

REPO = Path(__file__).resolve().parents[1]


def _load_old_layout():
    spec = importlib.util.spec_from_file_location("fixtures_old_layout", REPO / "fixtures" / "old_layout.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


old_layout = _load_old_layout()


def cli(store: Path, *args: str, input: str | None = None):
    return CliRunner().invoke(main, ["--store", str(store), *args], input=input, catch_exceptions=False)


def tree(root: Path) -> dict[str, object]:
    """Every name under root and what it holds (bytes, link target, or a directory)."""
    out: dict[str, object] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = p.read_bytes()
    return out


def outcome(root: Path) -> tuple[dict[str, object], dict[str, set[str]]]:
    """A migrated store, made comparable across runs: files outside objects/ (trash names
    without their time stamps; tmp/ and locks/ left out), and every object name per space
    however it is held (loose or packed)."""
    files: dict[str, object] = {}
    for rel, value in tree(root).items():
        if rel.startswith(("objects", "tmp", "locks")):
            continue
        if rel.startswith("trash/"):
            parts = rel.split("/")
            parts[1] = re.sub(r"-[0-9]+$", "", parts[1])
            rel = "/".join(parts)
        files[rel] = value
    objects = FileObjects(str(root))
    try:
        names = {space: set(objects.names(space)) for space in SPACES}
    finally:
        objects.close()
    return files, names


@pytest.fixture
def old(tmp_path) -> old_layout.OldLayoutStore:
    return old_layout.build_scenario(tmp_path / "store")


@contextmanager
def held(path: Path, mode: str = "ex"):
    """A real process holding a flock, as a writer of the earlier layout does."""
    code = (
        "import fcntl, sys\n"
        "f = open(sys.argv[1], 'a')\n"
        "fcntl.flock(f, fcntl.LOCK_EX if sys.argv[2] == 'ex' else fcntl.LOCK_SH)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(path), mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"held\n"
        yield
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


# -- the earlier layout's bytes -----------------------------------------------------------


def test_crc32c_vectors():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
    # The examples go-cas-internals gives for the record format.
    assert crc32c(b'{"op":"create","session":"demo"') == 0x89359704
    assert crc32c(b'{"op":"mark","session":"demo","mark":"record"') == 0xEBA139EA
    assert crc32c(b'{"op":"sync","session":"s"') == 0x77659C0F


def test_the_generator_writes_records_as_the_earlier_writer_did():
    assert old_layout.record_line({"op": "create", "session": "demo"}) == b'{"op":"create","session":"demo","crc":"89359704"}\n'
    line = old_layout.record_line(
        {"lazy": True, "size": 612, "seq": 3, "head": "sha256:" + "b" * 64, "entry": "sha256:" + "a" * 64,
         "session": "s", "op": "append", "base": None, "mark": ""}
    )
    assert line.startswith(b'{"op":"append","session":"s","entry":"sha256:' + b"a" * 64 + b'","head":"sha256:')
    assert b',"seq":3,"size":612,"lazy":true,"crc":"' in line


def test_read_journal_tells_torn_from_damaged():
    rec = old_layout.record_line
    good1 = rec({"op": "create", "session": "a"})
    good2 = rec({"op": "mark", "session": "a", "mark": "record"})
    bad = bytearray(rec({"op": "head", "session": "a", "head": "sha256:" + "c" * 64}))
    bad[30] ^= 0x01  # a bit flip inside a whole line
    unchecked = b'{"op":"sync","session":"a"}\n'  # the earliest releases wrote no checksum
    data = good1 + good2[:20] + good2 + bytes(bad) + unchecked + b"\n" + rec({"op": "delete", "session": "a"})[:-10]
    jr = read_journal(data)
    assert [r.op for r in jr.records] == ["create", "mark", "sync"]
    assert [(f.line, f.kind) for f in jr.torn] == [(2, "torn"), (6, "torn")]  # before a record; the tail
    assert jr.torn[0].session is None and jr.torn[1].session == "a"
    assert [(f.line, f.kind, f.reason) for f in jr.damaged] == [(3, "damaged", "checksum mismatch")]
    assert jr.records[1].offset == len(good1) + 20  # the record after the torn bytes, where it starts


@pytest.mark.parametrize(
    "line, reason",
    [
        (b'{"op":"frobnicate","session":"a"}\n', "unknown operation"),
        (b'{"op":"create","session":"../x"}\n', "unusable session id"),
        (b'{"op":"append","session":"a","entry":"sha1:00"}\n', "not a sha256: hash"),
        (b'{"op":"mark","session":"a","mark":"maybe"}\n', "neither record nor mirror"),
        (b'{"op":"create","session":"a","crc":"089359704"}\n', "malformed checksum"),
        (b"garbage\n", "no record"),
    ],
)
def test_read_journal_damage_kinds(line, reason):
    jr = read_journal(line)
    assert not jr.records and len(jr.damaged) == 1 and reason in jr.damaged[0].reason


# -- opening an unmigrated store ----------------------------------------------------------


@pytest.mark.parametrize("readonly", [True, False])
def test_opening_an_old_store_says_to_migrate(old, readonly):
    before = tree(old.root)
    with pytest.raises(LayoutError, match=r"earlier layout .*run `agentsession migrate`"):
        Store(old.root, readonly=readonly)
    assert tree(old.root) == before


def test_the_cli_says_to_migrate(old):
    result = cli(old.root, "list")
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "agentsession migrate" in lines[0]


def test_an_empty_directory_is_no_store(tmp_path):
    with pytest.raises(LayoutError, match="no store at"):
        Store(tmp_path)
    with pytest.raises(MigrationError, match="no store at"):
        migrate(tmp_path)


def test_an_init_that_stopped_before_its_layout_file_is_not_the_earlier_layout(tmp_path):
    Store.init(tmp_path / "s").close()
    (tmp_path / "s" / "layout").unlink()
    assert layout_state(str(tmp_path / "s")) == "none"
    with pytest.raises(LayoutError, match="no store at"):
        Store(tmp_path / "s")


# -- the migration --------------------------------------------------------------------------


def test_migration_keeps_every_session_as_the_earlier_writer_held_it(old):
    expected = old.expected()
    journal = (old.root / "journal").read_bytes()
    report = migrate(old.root)
    assert report.status == "migrated" and not report.resumed
    root = old.root
    assert (root / "layout").read_text() == LAYOUT + "\n"
    assert os.readlink(root / "journal") == "layout/journal"
    assert (root / "migrated" / "journal").read_bytes() == journal
    with Store(root, readonly=True) as store:
        assert store.list() == sorted(expected)
        for sid, want in expected.items():
            s = store.read(sid)
            assert s.log_order == want["entries"], sid
            assert (s.base, s.head, s.mark) == (want["base"], want["head"], want["mark"]), sid
            assert s.header.media == want["media"]
    actions = {s.id: s.action for s in report.sessions}
    assert actions == {
        "alpha": "rebuild", "beta": "rebuild", "epsilon": "rebuild", "media": "rebuild", "mirror": "rebuild",
        "delta": "set-aside", "unfinished": "set-aside", "gamma": "gone",
    }
    assert sorted(re.sub(r"-[0-9]+$", "", n) for n in os.listdir(root / "trash")) == ["delta", "unfinished"]
    assert not (root / "sessions" / "gamma").exists()
    # The torn records (one before a later record on its line, one at the end) are skipped.
    assert [(f.session, f.kind) for f in report.torn] == [("alpha", "torn"), ("epsilon", "torn")]
    # The earlier layout's leftovers are gone; what it shared with ours is converted.
    for name in ("checkpoint", "journal.lock", "objects/pruned", "sessions/alpha/record"):
        assert not (root / name).exists(), name
    for p in (root / "objects" / "pack").iterdir():  # only our packs, if any, remain there
        assert not p.read_bytes().startswith((b"CASPACK", b"CASIDX")), p
    assert (root / "sessions" / "mirror" / "mark").read_text() == "mirror\n"
    assert (root / "sessions" / "alpha" / "HEAD").read_text() == expected["alpha"]["head"] + "\n"


def test_the_new_logs_are_what_our_recovery_reads(old):
    expected = old.expected()
    lost = dict(old.lost)
    migrate(old.root)
    for sid in expected:
        data = (old.root / "sessions" / sid / "log").read_bytes()
        lr = read_log(data)
        assert not lr.damage and lr.cut is None
        ops = [r.op for r in lr.records]
        assert ops[0] == "create" and ops[-1] == "commit", sid
        assert lr.records[0].get("session") == sid and lr.records[0].get("base") == expected[sid]["base"]
        seqs = [r.get("seq") for r in lr.records if r.op in ("append", "loss")]
        assert seqs == list(range(1, len(seqs) + 1))
        losses = [r.get("entry") for r in lr.records if r.op == "loss"]
        assert losses == lost.get(sid, []), sid
    with Store(old.root, readonly=True) as store:
        alpha = store.read("alpha")
        labels = [e.id for e in alpha if e.is_leaf_label]
        assert len(labels) == 1 and alpha.leaf_labels == set(labels)
    # A record of the head moves is kept: alpha's head moved by a head record, a leaf
    # label and a head record back.
    ops = [r.op for r in read_log((old.root / "sessions" / "alpha" / "log").read_bytes()).records]
    assert ops.count("head") == 2


def test_after_migration_every_session_verifies_exports_and_appends(old):
    expected = old.expected()
    migrate(old.root)
    for sid in expected:
        result = cli(old.root, "verify", sid)
        assert result.exit_code == 0, (sid, result.stdout, result.stderr)
        exported = cli(old.root, "export", sid)
        assert exported.exit_code == 0
        sf = read_session_bytes(exported.stdout_bytes, source=sid)
        assert not sf.all_problems()
        own = [e.id for e in sf.entries if not e.synthetic][-len(expected[sid]["entries"]):]
        assert own == expected[sid]["entries"]
    with Store(old.root) as store:
        alpha = store.session("alpha")
        result = alpha.append({"type": "item", "ts": "2026-04-01T00:00:00Z",
                               "item": {"type": "message", "role": "user", "content": "after the migration"}})
        assert result.outcome == "continued" and result.durable
        assert alpha.header.format != old_layout.OLD_FORMAT  # raised by this release's first append
        with pytest.raises(MirrorError):
            store.session("mirror").append({"type": "item", "ts": "2026-04-01T00:00:00Z",
                                            "item": {"type": "message", "role": "user", "content": "no"}})
        beta = store.session("beta")
        beta.set_head(expected["beta"]["base"], expected=expected["beta"]["head"])
    with Store(old.root, readonly=True) as store:
        assert store.read("alpha").head == result.id
        assert store.read("beta").head == expected["beta"]["base"]
    out = old.root.parent / "media.jsonl"
    with Store(old.root, readonly=True) as store:
        store.export_to("media", out)
    blob = old.blobs[0]
    assert (old.root.parent / "media" / blob[7:]).read_bytes() == b"\x89PNG\r\n\x1a\n not really an image"
    assert FileObjects(str(old.root)).get("blobs", blob) == (old.root.parent / "media" / blob[7:]).read_bytes()


def test_an_old_writer_fails_rather_than_writes(old):
    journal = old.root / "journal"
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    fd = os.open(journal, flags, 0o600)  # before: an old writer commits here
    os.close(fd)

    def stop_after(point):
        if point == "tombstone":
            raise RuntimeError("stop")

    orig = mig._reached
    mig._reached = stop_after
    try:
        with pytest.raises(RuntimeError):
            migrate(old.root)
    finally:
        mig._reached = orig
    with pytest.raises(FileNotFoundError):  # tombstone in place, no layout yet
        os.open(journal, flags, 0o600)
    with pytest.raises(LayoutError, match="did not finish.*run `agentsession migrate` to finish it"):
        Store(old.root, readonly=True)
    migrate(old.root)
    with pytest.raises(NotADirectoryError):  # through the layout file
        os.open(journal, flags, 0o600)
    assert not (old.root / "layout" / "journal").exists() and (old.root / "layout").is_file()


def test_migration_is_idempotent(old):
    migrate(old.root)
    before = tree(old.root)
    report = migrate(old.root)
    assert report.status == "current" and not report.sessions
    assert tree(old.root) == before
    result = cli(old.root, "migrate")
    assert result.exit_code == 0 and "nothing to migrate" in result.stdout
    assert tree(old.root) == before


def test_dry_run_changes_nothing_and_decides_as_the_migration_does(old, tmp_path):
    before = tree(old.root)
    dry = migrate(old.root, dry_run=True)
    assert dry.status == "dry-run" and tree(old.root) == before
    result = cli(old.root, "migrate", "--dry-run")
    assert result.exit_code == 0 and "dry run: nothing changed" in result.stdout
    assert tree(old.root) == before
    real = migrate(old.root)
    assert [(s.id, s.action, s.head, s.mark, s.entries, s.lost) for s in dry.sessions] == [
        (s.id, s.action, s.head, s.mark, s.entries, s.lost) for s in real.sessions
    ]


# -- crashes and resumption -------------------------------------------------------------


def _points(build, where: Path) -> list[str]:
    seen: list[str] = []
    orig = mig._reached
    mig._reached = seen.append
    try:
        migrate(build(where).root)
    finally:
        mig._reached = orig
    return seen


@pytest.mark.parametrize("scenario", ["build_scenario", "build_compacted"])
def test_a_crash_after_any_step_is_finished_by_running_again(tmp_path, scenario):
    build = getattr(old_layout, scenario)
    reference_store = build(tmp_path / "reference")
    migrate(reference_store.root)
    reference = outcome(reference_store.root)
    points = _points(build, tmp_path / "points")
    assert len(points) >= 12 and points[0] == "locked" and points[-1] == "cleanup"
    assert [p for p in points if p.startswith("session:")] == [f"session:{s}" for s in sorted(
        set(reference_store.expected()) | reference_store.set_aside | reference_store.gone)]
    for n, point in enumerate(points):
        store = build(tmp_path / f"crash{n}")

        def crash(reached, point=point):
            if reached == point:
                raise OSError(f"injected crash after {point}")

        orig = mig._reached
        mig._reached = crash
        try:
            with pytest.raises(OSError, match="injected"):
                migrate(store.root)
        finally:
            mig._reached = orig
        state = layout_state(str(store.root))
        assert state in ("old", "partial"), point
        with pytest.raises(LayoutError, match="agentsession migrate"):
            Store(store.root, readonly=True)
        report = migrate(store.root)
        assert report.status == "migrated", point
        assert report.resumed == (point not in ("locked", "planned")), point  # it wrote nothing before those
        assert outcome(store.root) == reference, point
        assert migrate(store.root).status == "current"


@pytest.mark.parametrize(
    "scenario, name, nth",
    [
        ("build_scenario", "log", 1),
        ("build_scenario", "log", 3),
        ("build_scenario", "log", 5),  # five sessions are rebuilt
        ("build_compacted", "log", 2),
        ("build_compacted", "HEAD", 1),  # after its log, before its indexes
    ],
)
def test_a_failure_inside_a_step_is_finished_by_running_again(tmp_path, monkeypatch, scenario, name, nth):
    """A write fails part way through the sessions step (the disk is full)."""
    build = getattr(old_layout, scenario)
    reference_store = build(tmp_path / "reference")
    migrate(reference_store.root)
    store = build(tmp_path / "store")
    calls = []
    real = mig.write_atomic

    def failing(path, data, **kwargs):
        if os.path.basename(path) == name:
            calls.append(path)
            if len(calls) == nth:
                raise OSError(28, "No space left on device", path)
        return real(path, data, **kwargs)

    monkeypatch.setattr(mig, "write_atomic", failing)
    with pytest.raises(OSError, match="No space"):
        migrate(store.root)
    monkeypatch.setattr(mig, "write_atomic", real)
    rebuilt = [s.id for s in migrate(store.root).sessions if s.action == "migrated"]
    assert len(rebuilt) == (nth - 1 if name == "log" else nth)
    assert outcome(store.root) == outcome(reference_store.root)


def test_a_failure_while_moving_an_old_pack_leaves_nothing_behind(tmp_path, monkeypatch):
    reference_store = old_layout.build_scenario(tmp_path / "reference")
    migrate(reference_store.root)
    store = old_layout.build_scenario(tmp_path / "store")
    real = os.replace

    def failing(src, dst, *a, **kw):
        if str(src).endswith(".pack") and "objects" in str(src):
            raise OSError(5, "Input/output error", src)  # the index has moved, the pack has not
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(mig.os, "replace", failing)
    with pytest.raises(OSError):
        migrate(store.root)
    monkeypatch.setattr(mig.os, "replace", real)
    migrate(store.root)
    assert outcome(store.root) == outcome(reference_store.root)
    assert not (store.root / "migrated" / "packs").exists()


@pytest.mark.parametrize("point", ["kept-journal", "tombstone", "packs-staged", "session:beta", "cleanup"])
def test_a_killed_process_is_finished_by_running_again(tmp_path, point):
    """A real process death (no cleanup runs, the kernel drops its locks)."""
    reference_store = old_layout.build_scenario(tmp_path / "reference")
    migrate(reference_store.root)
    store = old_layout.build_scenario(tmp_path / "store")
    code = (
        "import os, sys\n"
        "from agentsession_cas.backends.files import migrate as m\n"
        "m._reached = lambda p: os._exit(137) if p == sys.argv[2] else None\n"
        "m.migrate(sys.argv[1])\n"
        "sys.exit(0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(store.root), point], cwd=REPO, timeout=60)
    assert proc.returncode == 137
    # Until the tombstone replaces it, the journal is still the earlier layout's.
    assert layout_state(str(store.root)) == ("old" if point == "kept-journal" else "partial")
    result = cli(store.root, "migrate", "--yes")
    assert result.exit_code == 0, result.stderr
    assert "finishing a migration that did not" in result.stdout
    assert outcome(store.root) == outcome(reference_store.root)


# -- refusals: nothing changed -------------------------------------------------------------


def test_refuses_while_an_old_writer_holds_a_session(old):
    before = tree(old.root)
    with held(old.root / "locks" / "beta"):
        with pytest.raises(MigrationBusyError, match="session beta"):
            migrate(old.root)
        assert tree(old.root) == before
        result = cli(old.root, "migrate")
        assert result.exit_code == migrate_command.EXIT_BUSY
        assert result.stderr.count("\n") == 1 and "stop every writer" in result.stderr
        result = cli(old.root, "migrate", "--json")
        assert result.exit_code == migrate_command.EXIT_BUSY
        refusal = json.loads(result.stdout)
        assert refusal["status"] == "busy" and refusal["code"] == "migration_busy"  # every refusal names its code
        assert tree(old.root) == before
    assert migrate(old.root).status == "migrated"


def test_refuses_while_an_old_sweep_runs_or_a_commit_does_not_finish(old):
    before = tree(old.root)
    with held(old.root / "gc.lock"):
        with pytest.raises(MigrationBusyError, match="gc.lock"):
            migrate(old.root)
    with held(old.root / "sweep.lock", "sh"):  # a writer between its objects and its commit
        with pytest.raises(MigrationBusyError, match="sweep.lock"):
            migrate(old.root, lock_wait=0.2)
    assert tree(old.root) == before


def test_refuses_a_resumed_migration_while_an_old_writer_holds_a_session(old):
    orig = mig._reached
    mig._reached = lambda p: (_ for _ in ()).throw(OSError("stop")) if p == "session:alpha" else None
    try:
        with pytest.raises(OSError):
            migrate(old.root)
    finally:
        mig._reached = orig
    with held(old.root / "locks" / "epsilon"):
        with pytest.raises(MigrationBusyError):
            migrate(old.root)


def test_refuses_a_damaged_journal_unless_told(old):
    data = bytearray((old.root / "journal").read_bytes())
    line_start = data.index(b'{"op":"head"')
    data[line_start + 40] ^= 0x02  # a bit flip in alpha's first head move
    (old.root / "journal").write_bytes(bytes(data))
    before = tree(old.root)
    with pytest.raises(MigrationError, match=r"journal line 9 .*damaged.*--skip-damaged.*nothing was changed"):
        migrate(old.root)
    result = cli(old.root, "migrate")
    assert result.exit_code == 1 and "journal line 9" in result.stderr
    dry = cli(old.root, "migrate", "--dry-run")
    assert dry.exit_code == 1 and "would refuse" in dry.stdout and "journal line 9" in dry.stdout
    assert tree(old.root) == before
    result = cli(old.root, "migrate", "--skip-damaged", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert [d["line"] for d in report["journal"]["damaged"]] == [9]
    with Store(old.root, readonly=True) as store:
        # Without its first head move, alpha's later records still name its head.
        assert store.read("alpha").head == old.expected()["alpha"]["head"]


def test_refuses_when_a_committed_entry_has_lost_its_objects(old):
    entry = old.expected()["mirror"]["entries"][0]
    old.object_path("entries", entry).unlink()
    before = tree(old.root)
    with pytest.raises(MigrationError) as info:
        migrate(old.root)
    msg = str(info.value)
    assert "session mirror" in msg and entry in msg and "is committed but" in msg and "is missing" in msg
    assert "nothing was changed" in msg
    assert tree(old.root) == before


def test_refuses_a_fork_whose_prefix_does_not_read(old):
    # beta's base lies in alpha's pack: corrupt that object in the pack.
    pack = next((old.root / "objects" / "pack").glob("*.pack"))
    data = bytearray(pack.read_bytes())
    cfg = old.expected()["alpha"]["entries"][0]
    at = data.index(bytes.fromhex(cfg[7:])) + 33
    data[at + 5] ^= 0x01
    pack.write_bytes(bytes(data))
    with pytest.raises(MigrationError, match="session alpha: entry .* is committed but") as info:
        migrate(old.root)
    # Every session that needs it is named (the first in the message, all in problems).
    problems = info.value.problems
    assert [p["message"].split(":")[0] for p in problems] == ["session alpha", "session beta"]
    assert "the prefix of base" in problems[1]["message"]
    # each in the one problem shape, with a code and the session it is about
    assert [(p["code"], p["session"], p["where"]) for p in problems] == [
        ("missing-object", "alpha", "sessions/alpha"), ("missing-object", "beta", "sessions/beta")]
    r = CliRunner().invoke(main, ["--store", str(old.root), "migrate", "--dry-run", "--json"])
    assert r.exit_code == 1
    assert [(p["code"], p["session"]) for p in json.loads(r.stdout)["problems"]] == [
        ("missing-object", "alpha"), ("missing-object", "beta")]


def test_a_damaged_pack_nothing_needs_is_kept_aside(tmp_path):
    s = old_layout.OldLayoutStore(tmp_path / "store")
    s.create("keep")
    s.append("keep", "config", model="k")
    s.create("gone")
    e = s.append("gone", "config", model="g")
    s.delete("gone")
    pack = s.pack([e.id])
    data = bytearray(pack.read_bytes())
    data[-40] ^= 0x01  # inside the last object, before the checksum
    pack.write_bytes(bytes(data))
    report = migrate(s.root)
    assert report.packs[0]["problem"] and "checksum" in report.packs[0]["problem"]
    assert report.kept == ["migrated/journal", f"migrated/packs/{pack.name}"]
    assert (s.root / "migrated" / "packs" / pack.name).read_bytes() == bytes(data)
    assert not list((s.root / "objects" / "pack").glob("pack-*"))
    with Store(s.root, readonly=True) as store:
        assert store.list() == ["keep"]


@pytest.mark.parametrize(
    "damage, needle",
    [
        ("later-log", "per-session format of a later release"),
        ("base", "the journal's create (line 1) names base none"),
        ("header", "its header is not a session header"),
    ],
)
def test_refuses_sessions_it_cannot_rebuild_faithfully(tmp_path, damage, needle):
    s = old_layout.OldLayoutStore(tmp_path / "store")
    s.create("a")
    cfg = s.append("a", "config", model="m")
    sdir = s.root / "sessions" / "a"
    if damage == "later-log":
        (sdir / "log").write_bytes(b'{"op":"create","session":"a","crc":"0"}\n')
    elif damage == "base":
        header = json.loads((sdir / "header").read_bytes())
        header["base"] = cfg.id
        (sdir / "header").write_text(json.dumps(header) + "\n")
    else:
        (sdir / "header").write_text('{"type":"session","id":"b"}\n')
    before = tree(s.root)
    with pytest.raises(MigrationError, match=re.escape(needle)):
        migrate(s.root)
    assert tree(s.root) == before


def test_refuses_a_layout_it_does_not_know(tmp_path):
    (tmp_path / "layout").write_text("cas 3\n")
    with pytest.raises(MigrationError, match="'cas 3'"):
        migrate(tmp_path)
    # The reference library's current layout is another migration's (test_migrate_reference.py).
    (tmp_path / "layout").write_text("cas 2\n")
    with pytest.raises(MigrationError, match="reference library's layout"):
        migrate(tmp_path)


# -- the journal's subtler records ---------------------------------------------------------


def test_a_lazy_append_the_crash_took_takes_every_later_record_with_it(tmp_path):
    s = old_layout.OldLayoutStore(tmp_path / "store")
    s.create("a")
    cfg = s.append("a", "config", model="m")
    x = s.append("a", "item", item=old_layout.user("x"), lazy=True)
    y = s.append("a", "item", item=old_layout.user("y"))  # durable, hangs from x
    s.set_head("a", y.id)
    s.set_mark("a", "mirror")
    s.object_path("entries", x.id).unlink()
    report = migrate(s.root)
    plan = report.sessions[0]
    assert [loss["entry"] for loss in plan.lost] == [x.id, y.id]
    with Store(s.root, readonly=True) as store:
        a = store.read("a")
        assert a.log_order == [cfg.id] and a.head == cfg.id and a.mark == "record"
    assert cli(s.root, "verify", "a").exit_code == 0


def test_a_compacted_journal(tmp_path):
    s = old_layout.build_compacted(tmp_path / "store")
    expected = s.expected()
    report = migrate(s.root)
    assert report.compacted
    with Store(s.root, readonly=True) as store:
        for sid, want in expected.items():
            got = store.read(sid)
            assert (got.log_order, got.head, got.mark) == (want["entries"], want["head"], want["mark"]), sid
    notes = {p.id: " ".join(p.notes) for p in report.sessions}
    assert "compacted journal" in notes["c1"] and "settled record" in notes["c2"]
    assert "past the journal's settled count" in notes["c2"]
    for sid in expected:
        assert cli(s.root, "verify", sid).exit_code == 0


def test_a_store_that_never_wrote_a_journal(tmp_path):
    s = old_layout.build_compacted(tmp_path / "store")
    (s.root / "journal").unlink()
    expected = s.expected()
    assert layout_state(str(s.root)) == "old"
    report = migrate(s.root)
    assert report.journal is None and (s.root / "migrated" / "journal").read_bytes() == b""
    with Store(s.root, readonly=True) as store:
        for sid, want in expected.items():
            got = store.read(sid)
            assert (got.log_order, got.head, got.mark) == (want["entries"], want["head"], want["mark"]), sid


# -- the command ---------------------------------------------------------------------------


def test_cli_json(old):
    result = cli(old.root, "migrate", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    report = json.loads(result.stdout)
    assert report["status"] == "migrated" and report["layout"] == LAYOUT
    assert {s["id"]: s["action"] for s in report["sessions"]}["delta"] == "set-aside"
    assert [t["session"] for t in report["journal"]["torn"]] == ["alpha", "epsilon"]
    assert report["objects"]["blobs_copied"] == old.blobs
    assert report["kept"] == ["migrated/journal"]
    again = json.loads(cli(old.root, "migrate", "--json").stdout)
    assert again["status"] == "current"


def test_cli_text(old):
    result = cli(old.root, "migrate")
    assert result.exit_code == 0
    out = result.stdout
    assert out.startswith(f"migrated the store at {old.root} to layout {LAYOUT!r}\n")
    assert re.search(r"^rebuild +alpha: 8 entries, head [0-9a-f]{12}, record$", out, re.M)
    assert re.search(r"^set-aside +delta: the journal deleted it", out, re.M)
    assert re.search(r"^lost +beta: [0-9a-f]{12}: a lazy append whose objects are gone", out, re.M)
    assert re.search(r"^skipped +journal line \d+ \(offset \d+, session epsilon\): cut short", out, re.M)
    assert re.search(r"^kept +migrated/journal", out, re.M)


def test_cli_asks_on_a_terminal(old, monkeypatch):
    monkeypatch.setattr(migrate_command, "_stdin_is_tty", lambda: True)
    before = tree(old.root)
    result = cli(old.root, "migrate", input="n\n")
    assert result.exit_code == 1 and "not confirmed" in result.stderr
    assert tree(old.root) == before
    result = cli(old.root, "migrate", "--dry-run")  # a dry run never asks
    assert result.exit_code == 0 and "Migrate the store" not in result.stderr
    result = cli(old.root, "migrate", input="y\n")
    assert result.exit_code == 0 and "Migrate the store" in result.stderr
    assert layout_state(str(old.root)) == "current"


def test_cli_yes_skips_the_question(old, monkeypatch):
    monkeypatch.setattr(migrate_command, "_stdin_is_tty", lambda: True)
    result = cli(old.root, "migrate", "--yes")
    assert result.exit_code == 0 and result.stderr == ""


def test_cli_progress_only_on_a_terminal(old, tmp_path, monkeypatch):
    result = cli(old.root, "migrate")  # stderr is no terminal here
    assert result.exit_code == 0 and result.stderr == ""
    other = old_layout.build_scenario(tmp_path / "other")
    monkeypatch.setattr(terminal, "isatty", lambda stream: True)  # a terminal, and every operation slow
    monkeypatch.setattr(terminal, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(terminal, "PROGRESS_EVERY", 0.0)
    result = cli(other.root, "migrate")
    assert result.exit_code == 0
    assert "migrate: session 1/8: alpha" in result.stderr
    third = old_layout.build_scenario(tmp_path / "third")
    result = cli(third.root, "migrate", "--json")  # silent under --json
    assert result.exit_code == 0 and result.stderr == ""


def test_cli_failure_part_way_says_to_run_again(old, monkeypatch):
    def crash(point):
        if point == "session:beta":
            raise PermissionError(13, "Permission denied", str(old.root / "sessions" / "beta" / "log"))

    monkeypatch.setattr(mig, "_reached", crash)
    result = cli(old.root, "migrate")
    assert result.exit_code == 1
    assert "run `agentsession migrate` again to finish it" in result.stderr
    monkeypatch.setattr(mig, "_reached", lambda point: None)
    assert cli(old.root, "migrate").exit_code == 0


def test_the_generator_runs_as_a_script(tmp_path):
    out = tmp_path / "s"
    proc = subprocess.run([sys.executable, str(REPO / "fixtures" / "old_layout.py"), str(out)], capture_output=True)
    assert proc.returncode == 0 and (out / "journal").is_file()
    assert layout_state(str(out)) == "old"


def test_no_stdin_or_stderr_at_all_is_no_terminal(old, monkeypatch):
    """A daemon may run with no stdin (None) or a closed one: that is no terminal, and
    the migration proceeds without asking instead of failing."""
    closed = open(os.devnull)
    closed.close()
    for stream in (None, closed):
        monkeypatch.setattr(sys, "stdin", stream)
        monkeypatch.setattr(sys, "stderr", stream)
        assert migrate_command._stdin_is_tty() is False
        assert terminal.isatty(stream) is False
    monkeypatch.undo()
    assert cli(old.root, "migrate").exit_code == 0
