"""Sweeps (agentsession_cas/sweep.py, `agentsession sweep`): RFC 0002 "Deletion
and retention" to the letter, the grace period, dry runs, damaged logs, staged
imports, and safety beside writers in other processes (real ones, and
deterministic interleavings made by patching the points between a sweep's
snapshot and its removals)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import agentsession_cas.backends.files as files_backend
import agentsession_cas.backends.files.objects as objects_mod
import agentsession_cas.backends.files.sweep as files_sweep
import agentsession_cas.maintenance.sweep as sweep_mod
from agentsession_cas import Header
from agentsession_cas.backends.files.objects import PACK_BATCH, FileObjects
from agentsession_cas.errors import StoreError
from agentsession_cas.format.hashing import sha256_ref
from agentsession_cas.maintenance.sweep import DEFAULT_GRACE, parse_duration
from agentsession_cas.store import Store
from agentsession_cli.main import main

HERE = Path(__file__).resolve().parent
WORKER = HERE / "sweep_worker.py"
MONTH = 30 * 86400

_TICK = iter(range(10**9))


def ts() -> str:
    n = next(_TICK)
    return f"2026-10-05T{(n // 3600) % 24:02d}:{(n // 60) % 60:02d}:{n % 60:02d}.5Z"


def msg(text: str, **kw) -> dict:
    return {"type": "item", "ts": ts(), "item": {"type": "message", "role": "user", "content": text}, **kw}


def image(blob: str, text: str = "look") -> dict:
    return {"type": "item", "ts": ts(), "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": text}, {"type": "input_image", "image_url": f"sidecar:{blob}"}]}}


def cli(root: Path, *args: str, input: str | None = None):
    return CliRunner().invoke(main, ["--store", str(root), *args], input=input, catch_exceptions=False)


def held(root: Path, space: str, name: str) -> bool:
    o = FileObjects(str(root))
    try:
        return o.is_sound(space, name)
    finally:
        o.close()


def objects_of(st: Store, ids: list[str]) -> set[tuple[str, str]]:
    """(space, name) of the envelopes and contents of these entries."""
    out = set()
    for i in ids:
        out.add(("entries", i))
        out.add(("contents", st.entry(i).content_hash))
    return out


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under the store with its bytes (None for a directory) and mtime."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            out[os.path.relpath(p, root)] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read() + b"@" + str(os.stat(p).st_mtime_ns).encode()
    return out


def age_all(root: Path, seconds: float = MONTH) -> None:
    """Make every object file (loose or pack) old."""
    t = time.time_ns() - int(seconds * 1e9)
    for dirpath, _, filenames in os.walk(root / "objects"):
        for f in filenames:
            os.utime(os.path.join(dirpath, f), ns=(t, t))


def exports(root: Path) -> dict[str, bytes]:
    with Store(str(root), readonly=True) as rd:
        return {sid: rd.export(sid) for sid in rd.list()}


def check_sessions(root: Path, expected: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """Every session opens, verifies (`agentsession verify ID`) and exports."""
    got = exports(root)
    if expected is not None:
        assert got == expected
    for sid in got:
        r = cli(root, "verify", sid)
        assert r.exit_code == 0, (sid, r.stdout, r.stderr)
    return got


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "store"
    Store.init(r).close()
    return r


def sweep_json(root: Path, *args: str) -> dict:
    r = cli(root, "sweep", "--json", *args)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


# -- durations ---------------------------------------------------------------------


def test_parse_duration():
    assert [parse_duration(t) for t in ("0", "90s", "15m", "12h", "14d", "2w", "45")] == [
        0, 90, 900, 43200, 14 * 86400, 14 * 86400, 45]
    assert DEFAULT_GRACE == 14 * 86400
    for bad in ("", "1.5h", "-3d", "3y", "d", "1 d 2h"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_bad_grace_is_a_usage_error(root):
    r = cli(root, "sweep", "--grace", "soon")
    assert r.exit_code == 2 and "--grace" in r.stderr


def test_a_read_only_store_only_dry_runs_and_a_busy_one_is_refused(root):
    from agentsession_cas.backends.files.locks import FileLock

    with Store(str(root), readonly=True) as rd:
        with pytest.raises(StoreError):
            rd.sweep(grace=0)
        assert rd.sweep(grace=0, dry_run=True).repack.dry_run
    with FileLock(str(root / "pack.lock")):
        with Store(str(root)) as st:
            with pytest.raises(StoreError, match="another process is packing or sweeping"):
                st.sweep(grace=0, wait=0.1)


@pytest.mark.parametrize("sid", ["pack", "refs", "layout"])
def test_a_session_named_like_a_store_lock_holds_only_its_own_lock(root, sid):
    """A session's writer lock is ``locks/<id>.lock``; the pack lock lived at
    ``locks/pack.lock`` too, so holding a session named ``pack`` stalled every pack
    and sweep (and deadlocked one in the same process). Names of other root files
    are tried too."""
    with Store(str(root)) as st:
        held = st.create(Header.new(sid))
        held.append(msg("held open while the store is maintained"), durable=True)
        assert st.sweep(wait=0).repack is not None
        assert st.pack(wait=0) is not None
        held.append(msg("still ours"), durable=True)
        held.close()
        assert [e.type for e in st.open(sid).entries()] == ["item", "item"]


def _one_session_and_garbage(root: Path) -> None:
    with Store(str(root)) as st:
        st.create(Header.new("live")).append(msg("stays"))
        g = st.create(Header.new("gone"))
        for i in range(3):
            g.append(msg(f"goes {i}"))
        g.close()
        st.delete("gone")


def test_progress_only_on_a_terminal_and_never_under_json(root, monkeypatch):
    from agentsession_cli import terminal

    _one_session_and_garbage(root)
    age_all(root)
    monkeypatch.setattr(terminal, "isatty", lambda stream: True)  # a terminal, and every operation slow
    monkeypatch.setattr(terminal, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(terminal, "PROGRESS_EVERY", 0.0)
    r = cli(root, "pack", "--json")
    assert r.exit_code == 0 and r.stderr == ""
    r = cli(root, "pack")
    assert r.exit_code == 0 and "\r\x1b[Kpacking: 100% (" in r.stderr and r.stderr.endswith("\r\x1b[K")  # cleared
    age_all(root)
    r = cli(root, "sweep", "--grace", "0", "--dry-run", "--json")
    assert r.exit_code == 0 and r.stderr == ""
    r = cli(root, "sweep", "--grace", "0", "--dry-run")
    assert r.exit_code == 0, r.stderr
    # the retention phase first (reading logs, then objects), then the count, on one line
    assert r.stderr.index("\r\x1b[Ksweeping: read 1 session log(s), 0 staged") < r.stderr.index(
        "\r\x1b[Ksweeping: 100% (") and r.stderr.endswith("\r\x1b[K")
    r = cli(root, "sweep", "--grace", "0", "--json")
    assert r.exit_code == 0 and r.stderr == ""
    monkeypatch.setattr(terminal, "isatty", lambda stream: False)  # a pipe
    age_all(root)
    for args in (("pack",), ("sweep", "--grace", "0")):
        r = cli(root, *args)
        assert r.exit_code == 0 and r.stderr == ""


def test_an_error_after_progress_starts_on_a_line_of_its_own(root, monkeypatch):
    from agentsession_cli import terminal

    _one_session_and_garbage(root)
    monkeypatch.setattr(terminal, "isatty", lambda stream: True)  # a terminal, and every operation slow
    monkeypatch.setattr(terminal, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(terminal, "PROGRESS_EVERY", 0.0)
    monkeypatch.setenv("NO_COLOR", "1")  # the placement of the lines is checked, not their colour
    real = FileObjects._repack_one
    calls = []

    def failing(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(*a, **kw)

    monkeypatch.setattr(FileObjects, "_repack_one", staticmethod(failing))
    r = cli(root, "pack")
    assert r.exit_code == 1
    # the progress line is cleared, then the error is printed where it began
    assert r.stderr.startswith("\r\x1b[Kpacking: ") and "\r\x1b[Kagentsession: error: pack failed: " in r.stderr
    assert r.stderr.rsplit("\r\x1b[K", 1)[-1].startswith("agentsession: error: pack failed: ")


def test_the_summary_counts_files_left_young(root):
    _one_session_and_garbage(root)
    r = cli(root, "sweep")  # the default grace: every file is minutes old
    assert r.exit_code == 0, r.stderr
    dry = sweep_json(root, "--dry-run")
    n = dry["young_files"]
    assert n > 0 and dry["young_unit"] == "file"
    assert r.stdout.startswith("removed 0 object(s), 0 bytes; kept 0 (retained by 1 session(s), grace 14d); "
                               f"left {n:,} file(s) younger than the grace period as they are; ")


# -- retention -------------------------------------------------------------------------


def test_a_deleted_sessions_objects_go_and_a_live_ones_stay(root):
    st = Store(str(root))
    live = st.create(Header.new("live"))
    live_ids = [live.append(msg(f"live {i}")).id for i in range(6)]
    gone = st.create(Header.new("gone"))
    gone_ids = [gone.append(msg(f"gone {i}")).id for i in range(6)]
    gone_ids.append(gone.append(msg("live 2")).id)  # a content the live session shares
    st.close()
    with Store(str(root), readonly=True) as rd:
        live_objs = objects_of(rd, live_ids)
        gone_objs = objects_of(rd, gone_ids)
    before = exports(root)
    shared = live_objs & gone_objs
    assert len(shared) == 1
    with Store(str(root)) as st:
        st.delete("gone")
    del before["gone"]
    age_all(root)
    out = sweep_json(root, "--grace", "0")
    assert set(out["dropped_names"]) == {n for _, n in gone_objs - live_objs}
    assert out["dropped"] == len(gone_objs - live_objs) and out["dropped_bytes"] > 0
    assert out["sessions"] == 1 and out["staged"] == 0 and out["dry_run"] is False
    assert out["retained"]["entries"] == len(live_ids)
    for sp, n in gone_objs - live_objs:
        assert not held(root, sp, n), n
    for sp, n in live_objs:
        assert held(root, sp, n), n
    check_sessions(root, before)
    # What stays is one pack; nothing is loose.
    assert len(list((root / "objects" / "pack").glob("*.idx"))) == 1
    assert not [p for p in (root / "objects").glob("*/??/*") if p.is_file()]
    # A second sweep finds nothing more; the text summary says so.
    r = cli(root, "sweep", "--grace", "0")
    assert r.exit_code == 0 and r.stderr == ""
    assert r.stdout.startswith("removed 0 object(s), 0 bytes; kept ") and "retained by 1 session(s), grace 0)" in r.stdout


def test_a_name_in_upper_case_in_a_kept_log_retains_nothing(root):
    """A log repair kept aside may name what is no object name (upper-case hex): it names
    no object, and the sweep goes on, removing what nothing else names (it stopped with
    ``bad_name`` on the name, saying neither which log nor what to do)."""
    from agentsession_cas.backends.files.log import encode_log

    st = Store(str(root))
    rec = st.create(Header.new("rec"))
    ids = [rec.append(msg(f"rec {i}")).id for i in range(3)]
    keeper = st.create(Header.new("keeper"))
    keeper.append(msg("kept"))
    st.close()
    with Store(str(root), readonly=True) as rd:
        rec_objs = objects_of(rd, ids)
    with Store(str(root)) as st:
        st.delete("rec")
    (root / "sessions" / "keeper" / "log.damaged-1").write_bytes(encode_log([
        {"op": "create", "session": "keeper", "base": "sha256:" + ids[1][7:].upper()},
        {"op": "append", "seq": 1, "entry": "sha256:" + ids[2][7:].upper()},
    ]))
    age_all(root)
    out = sweep_json(root, "--grace", "0")
    assert set(out["dropped_names"]) == {n for _, n in rec_objs}
    for sp, n in rec_objs:
        assert not held(root, sp, n), n


def test_abandoned_branches_and_uncommitted_appends_are_kept(root):
    st = Store(str(root), sync="never")
    s = st.create(Header.new("tree"))
    a = [s.append(msg(f"a{i}")).id for i in range(4)]
    s.commit()
    b1 = s.append(msg("b1", parent=a[0]))
    assert b1.outcome == "branched"
    b2 = s.append(msg("b2", parent=b1.id))
    leaf = s.append({"type": "label", "label": "leaf", "target": a[3], "parent": a[3], "ts": ts()})
    s.commit()
    s.close()
    st.close()
    with Store(str(root), readonly=True) as rd:
        objs = objects_of(rd, a + [b1.id, b2.id, leaf.id])
    before = exports(root)
    age_all(root)
    out = sweep_json(root, "--grace", "0")
    assert out["dropped"] == 0
    for sp, n in objs:
        assert held(root, sp, n)
    check_sessions(root, before)


def test_a_fork_keeps_its_prefix_when_its_origin_is_deleted(root):
    st = Store(str(root))
    o = st.create(Header.new("origin"))
    oids = [o.append(msg(f"origin {i}")).id for i in range(6)]
    o.close()
    f = st.create(Header.new("fork", base=oids[3]))
    fids = [f.append(msg(f"fork {i}")).id for i in range(3)]
    f.close()
    st.close()
    with Store(str(root), readonly=True) as rd:
        prefix = objects_of(rd, oids[:4])
        tail = objects_of(rd, oids[4:])
        own = objects_of(rd, fids)
    before = exports(root)
    with Store(str(root)) as st:
        st.delete("origin")
    del before["origin"]
    age_all(root)
    out = sweep_json(root, "--grace", "0")
    assert set(out["dropped_names"]) == {n for _, n in tail}
    for sp, n in prefix | own:
        assert held(root, sp, n), n
    for sp, n in tail:
        assert not held(root, sp, n), n
    check_sessions(root, before)
    with Store(str(root), readonly=True) as rd:
        assert [e.id for e in rd.read("fork").prefix_entries()] == oids[:4]


def test_contents_and_sidecar_blobs_follow_retention(root):
    st = Store(str(root))
    kept_blob = st.put_blob(b"\x89PNG kept")
    inline_blob = st.put_blob(b"\x89PNG named from a session without sidecar media")
    gone_blob = st.put_blob(b"\x89PNG only the deleted session named it")
    unnamed = st.put_blob(b"\x89PNG nobody ever named it")
    m = st.create(Header.new("media", media="sidecar"))
    m.append(image(kept_blob))
    m.close()
    i = st.create(Header.new("inline"))
    i.append(image(inline_blob))
    i.close()
    g = st.create(Header.new("gone-media", media="sidecar"))
    g.append(image(gone_blob, "bye"))
    g.close()
    st.objects.put("contents", sha256_ref(b'{"orphan":true}'), b'{"orphan":true}', durable=True)
    st.close()
    before = exports(root)
    with Store(str(root)) as st:
        st.delete("gone-media")
    del before["gone-media"]
    age_all(root)
    out = sweep_json(root, "--grace", "0")
    dropped = set(out["dropped_names"])
    assert {gone_blob, unnamed, sha256_ref(b'{"orphan":true}')} <= dropped
    assert kept_blob not in dropped and inline_blob not in dropped
    assert held(root, "blobs", kept_blob) and held(root, "blobs", inline_blob)
    assert not held(root, "blobs", gone_blob) and not held(root, "blobs", unnamed)
    assert out["retained"]["blobs"] == 2
    check_sessions(root, before)
    # export with its sidecar directory still works
    assert cli(root, "export", "media", "-o", str(root.parent / "m.jsonl")).exit_code == 0
    assert (root.parent / "media" / kept_blob[7:]).read_bytes() == b"\x89PNG kept"


def test_a_blob_named_from_a_session_without_sidecar_media_is_retained(root):
    """RFC 0002 retains a blob any retained content names by a sidecar: URL,
    whatever the media of the session the content belongs to."""
    st = Store(str(root))
    named = st.put_blob(b"\x89PNG named")
    unnamed = st.put_blob(b"\x89PNG unnamed")
    s = st.create(Header.new("inline"))
    s.append(image(named))
    s.close()
    st.close()
    before = exports(root)
    age_all(root)
    out = sweep_json(root, "--grace", "0")
    assert out["dropped_names"] == [unnamed]
    assert held(root, "blobs", named) and not held(root, "blobs", unnamed)
    check_sessions(root, before)


def _shift_ages(root: Path, seconds: float) -> None:
    """Every object file (and tmp/ entry) ``seconds`` older: time passing."""
    for top in ("objects", "tmp"):
        for dirpath, _, filenames in os.walk(root / top):
            for f in filenames:
                p = os.path.join(dirpath, f)
                t = os.stat(p).st_mtime_ns - int(seconds * 1e9)
                os.utime(p, ns=(t, t))


def test_garbage_goes_under_sweeps_more_frequent_than_the_grace_period(root):
    """Weekly sweeps with the default two weeks' grace, while a session is written
    every week: garbage young at one sweep must not be made young again by it."""
    st = Store(str(root))
    g = st.create(Header.new("gone"))
    gids = [g.append(msg(f"gone {i}")).id for i in range(5)]
    g.close()
    st.close()
    with Store(str(root), readonly=True) as rd:
        garbage = objects_of(rd, gids)
    with Store(str(root)) as st:
        st.delete("gone")
    _shift_ages(root, 3 * 86400)
    dropped: list[int] = []
    for week in range(4):
        with Store(str(root)) as st:
            s = st.session("live") if "live" in st else st.create(Header.new("live"))
            for i in range(3):
                s.append(msg(f"live {week} {i}"))
        with Store(str(root)) as st:
            dropped.append(st.sweep().repack.dropped)
        _shift_ages(root, 7 * 86400)
    assert sum(dropped) == len(garbage) and dropped[:2] == [0, 0], dropped  # at 17 days, not before
    for sp, n in garbage:
        assert not held(root, sp, n)
    check_sessions(root)


def test_grace_keeps_young_unretained_objects(root):
    st = Store(str(root))
    g = st.create(Header.new("gone"))
    ids = [g.append(msg(f"gone {i}")).id for i in range(8)]
    g.close()
    p = st.create(Header.new("gone-packed"))
    pids = [p.append(msg(f"packed {i}")).id for i in range(PACK_BATCH)]
    p.close()  # its checkpoint: one pack
    st.close()
    with Store(str(root), readonly=True) as rd:
        old = objects_of(rd, ids[:4])
        young = objects_of(rd, ids[4:])
        packed = objects_of(rd, pids)
    with Store(str(root)) as st:
        st.delete("gone")
        st.delete("gone-packed")
    o = FileObjects(str(root))
    t = time.time_ns() - int(MONTH * 1e9)
    for sp, n in old:
        os.utime(o.path(sp, n), ns=(t, t))
    t = time.time_ns() - int(3600 * 1e9)  # an hour old: younger than the default grace
    for sp, n in young:
        os.utime(o.path(sp, n), ns=(t, t))
    o.close()
    packs = list((root / "objects" / "pack").glob("*.pack"))
    assert len(packs) == 1  # packed's objects; young (a day) as a file
    t = time.time_ns() - int(86400 * 1e9)
    os.utime(packs[0], ns=(t, t))
    out = sweep_json(root)  # the default: 14 days
    assert out["grace_seconds"] == 14 * 86400
    assert set(out["dropped_names"]) == {n for _, n in old}
    assert out["young_files"] == len(young) + 1  # the young loose files and the pack, left as they are
    for sp, n in young | packed:
        assert held(root, sp, n)
    out = sweep_json(root, "--grace", "2h")
    assert set(out["dropped_names"]) == {n for _, n in packed}  # a day old: past 2h
    for sp, n in young:
        assert held(root, sp, n)
    out = sweep_json(root, "--grace", "30m")
    assert set(out["dropped_names"]) == {n for _, n in young}


def test_dry_run_lists_and_changes_nothing(root, monkeypatch):
    st = Store(str(root))
    g = st.create(Header.new("gone"))
    gids = [g.append(msg(f"gone {i}")).id for i in range(5)]
    g.close()
    live = st.create(Header.new("live"))
    live.append(msg("stay"))
    live.close()
    st.close()
    with Store(str(root), readonly=True) as rd:
        gone_objs = objects_of(rd, gids)
    with Store(str(root)) as st:
        st.delete("gone")
    # Enough small packs and loose objects that a writing close would merge and pack.
    o = FileObjects(str(root))
    for k in range(objects_mod.MERGE_FANIN):
        o.write_pack([("blobs", sha256_ref(b"%d-%d" % (k, j)), b"%d-%d" % (k, j)) for j in range(PACK_BATCH)], merge=False)
    o.close()
    monkeypatch.setattr(files_backend, "AUTO_PACK_LOOSE", 1)
    garbage = {n for _, n in gone_objs} | {sha256_ref(b"%d-%d" % (k, j)) for k in range(objects_mod.MERGE_FANIN) for j in range(PACK_BATCH)}
    age_all(root)
    snap = tree(root)
    r = cli(root, "sweep", "--dry-run", "--grace", "0")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert set(lines[:-1]) == garbage and len(lines) == len(garbage) + 1
    assert lines[-1].startswith(f"would remove {len(garbage):,} object(s), ")
    assert tree(root) == snap
    out = sweep_json(root, "--dry-run", "--grace", "0")
    assert out["dry_run"] is True and set(out["dropped_names"]) == garbage
    assert out["dropped_bytes"] == sum(len(b"%d-%d" % (k, j)) for k in range(objects_mod.MERGE_FANIN) for j in range(PACK_BATCH)) + sum(
        len(FileObjects(str(root)).get(sp, n)) for sp, n in gone_objs)
    assert tree(root) == snap
    # The real thing removes exactly what the dry run listed.
    out = sweep_json(root, "--grace", "0")
    assert set(out["dropped_names"]) == garbage


def test_a_damaged_log_stops_the_sweep(root):
    st = Store(str(root))
    s = st.create(Header.new("hurt"))
    for i in range(4):
        s.append(msg(f"hurt {i}"))
    s.close()
    g = st.create(Header.new("gone"))
    g.append(msg("garbage"))
    g.close()
    st.close()
    with Store(str(root)) as st:
        st.delete("gone")
    log = root / "sessions" / "hurt" / "log"
    data = bytearray(log.read_bytes())
    second = data.index(b"\n") + 1
    data[second + 30] ^= 0x01  # a committed record, not a torn tail
    log.write_bytes(bytes(data))
    age_all(root)
    snap = tree(root)
    for args in (("--grace", "0"), ("--grace", "0", "--dry-run"), ("--json",)):
        r = cli(root, "sweep", *args)
        assert r.exit_code == 1
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1
        # under --json the error is one JSON object on stderr (docs/cli.md, "JSON output")
        text = json.loads(lines[0])["error"]["message"] if "--json" in args else lines[0]
        assert "--json" not in args or json.loads(lines[0])["error"]["code"] == "session_damaged"
        assert "--json" in args or text.startswith("agentsession: error: ")
        assert "sessions/hurt/log is damaged" in text and "agentsession repair hurt" in text
        assert tree(root) == snap


def _cut_at_a_record(log: Path) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:3]))  # create, two appends: the later ones and their commits gone


@pytest.mark.parametrize("damage", ["no log", "empty log", "log cut at a record"])
def test_a_log_that_lost_what_head_names_stops_the_sweep(root, damage):
    """A session whose log is gone, empty, or cut short at a record boundary (every line
    left reads: only HEAD shows the loss) holds entries no record names any more, which
    `repair` takes back from objects/ while they are there: a sweep removing them would
    lose them for good. It refuses as it does for a damaged log, naming the session and
    the repair, and leaves the store as it was; after the repair it sweeps."""
    st = Store(str(root))
    s = st.create(Header.new("hurt"))
    ids = [s.append(msg(f"hurt {i}")).id for i in range(4)]
    s.close()
    st.close()
    log = root / "sessions" / "hurt" / "log"
    if damage == "no log":
        log.unlink()
    elif damage == "empty log":
        log.write_bytes(b"")
    else:
        _cut_at_a_record(log)
    age_all(root)
    snap = tree(root)
    for args in (("--grace", "0"), ("--grace", "0", "--dry-run", "--json")):
        r = cli(root, "sweep", *args)
        assert r.exit_code == 1, (args, r.stdout)
        text = json.loads(r.stderr)["error"]["message"] if "--json" in args else r.stderr
        assert "--json" not in args or json.loads(r.stderr)["error"]["code"] == "session_damaged"
        assert "sessions/hurt" in text and "agentsession repair hurt" in text, text
        assert tree(root) == snap
    assert cli(root, "repair", "hurt", "--yes").exit_code == 0
    assert cli(root, "sweep", "--grace", "0").exit_code == 0
    with Store(str(root), readonly=True) as st:
        assert st.read("hurt").log_order == ids  # every entry taken back, none swept


def test_a_pack_cut_short_stops_the_sweep_naming_it_relative_to_the_store(root):
    """A pack cut short: the contents in it cannot be read, so a sweep cannot tell what
    blobs they name. It refuses (code corrupt_pack), naming the pack relative to the
    store and what to run first (`pack` copies what reads and sets it aside), and leaves
    the store as it was; after `pack` it sweeps."""
    with Store(str(root)) as st:
        s = st.create(Header.new("big"))
        for i in range(80):
            s.append(msg(f"big {i}"), durable=False)
        s.close()
        st.pack()
        st.put_blob(b"a blob: the sweep reads every retained content for the blobs it names")
    [pack] = list((root / "objects" / "pack").glob("pack-*.pack"))
    pack.write_bytes(pack.read_bytes()[: pack.stat().st_size // 2])
    age_all(root)
    snap = tree(root)
    r = cli(root, "sweep", "--grace", "0", "--dry-run", "--json")
    assert r.exit_code == 1, r.stdout
    error = json.loads(r.stderr)["error"]
    assert error["code"] == "corrupt_pack", error
    assert f"objects/pack/{pack.name}" in error["message"] and str(root) not in error["message"], error
    assert "agentsession pack" in error["message"], error
    assert tree(root) == snap
    cli(root, "pack")
    assert cli(root, "sweep", "--grace", "0").exit_code == 0


def test_a_torn_tail_does_not_stop_the_sweep(root):
    st = Store(str(root))
    s = st.create(Header.new("torn"))
    ids = [s.append(msg(f"t {i}")).id for i in range(3)]
    s.close()
    st.close()
    with open(root / "sessions" / "torn" / "log", "ab") as f:
        f.write(b"0123456789abcdef {\"op\":\"app")  # a crash mid-append
    age_all(root)
    out = sweep_json(root, "--grace", "0")
    assert out["dropped"] == 0
    with Store(str(root), readonly=True) as rd:
        for sp, n in objects_of(rd, ids):
            assert held(root, sp, n)


def test_a_crashed_atomic_write_beside_a_session_file_goes_once_old(root):
    """A crash between writing a `.tmp-*` file and renaming it over a session's header,
    summary, rules or log leaves it beside them, where fsck notes it and nothing read
    it since: a sweep removes it once it is older than an hour (and the grace), as it
    does tmp/'s leftovers, and says so; a young one may be a write in progress."""
    st = Store(str(root))
    s = st.create(Header.new("s1"))
    s.append(msg("hi"))
    s.close()
    st.close()
    sdir = root / "sessions" / "s1"
    old = sdir / ".tmp-999-0123456789ab"
    old.write_bytes(b"half a summary")
    t = time.time_ns() - int(3 * 3600 * 1e9)
    os.utime(old, ns=(t, t))
    young = sdir / ".tmp-999-ba9876543210"
    young.write_bytes(b"a summary being written")
    before = {p.name: p.read_bytes() for p in sdir.iterdir() if not p.name.startswith(".tmp-")}
    out = sweep_json(root, "--grace", "0", "--dry-run")
    assert out["tmp_removed"] == [] and old.exists()  # a dry run removes nothing
    out = sweep_json(root, "--grace", "0")
    assert out["tmp_removed"] == [os.path.join("sessions", "s1", old.name)]
    assert not old.exists() and young.exists()
    assert {p.name: p.read_bytes() for p in sdir.iterdir() if not p.name.startswith(".tmp-")} == before


def test_a_staged_import_in_tmp_retains_its_objects(root):
    st = Store(str(root))
    g = st.create(Header.new("imp"))
    ids = [g.append(msg(f"imported {i}")).id for i in range(5)]
    g.close()
    st.close()
    with Store(str(root), readonly=True) as rd:
        objs = objects_of(rd, ids)
    # An import in flight: its staged log written, its objects present, not yet renamed in.
    stage = root / "tmp" / f"imp-{os.getpid()}-beef0001"
    shutil.copytree(root / "sessions" / "imp", stage)
    with Store(str(root)) as st:
        st.delete("imp")
    age_all(root)
    out = sweep_json(root, "--grace", "0")
    assert out["staged"] == 1 and out["dropped"] == 0
    assert stage.is_dir() and out["tmp_removed"] == []  # younger than an hour: left alone
    for sp, n in objs:
        assert held(root, sp, n)
    # A crashed import's stage, hours old, goes; objects it named stay for that sweep.
    t = time.time_ns() - int(3 * 3600 * 1e9)
    for p in [stage, *stage.iterdir()]:
        os.utime(p, ns=(t, t))
    stray = root / "tmp" / "pack-123-abcdef.pack"
    stray.write_bytes(b"half a pack")
    os.utime(stray, ns=(t, t))
    fresh = root / "tmp" / "pack-124-abcdef.pack"
    fresh.write_bytes(b"a pack being written")
    out = sweep_json(root, "--grace", "0")
    assert sorted(out["tmp_removed"]) == sorted([os.path.join("tmp", stage.name), os.path.join("tmp", stray.name)])
    assert not stage.exists() and not stray.exists() and fresh.exists()
    for sp, n in objs:
        assert held(root, sp, n)
    # With the stage gone, the next sweep takes them.
    out = sweep_json(root, "--grace", "0")
    assert set(out["dropped_names"]) == {n for _, n in objs}


def test_sweep_refuses_a_tmp_that_is_a_symlink_to_elsewhere(root, tmp_path):
    """tmp/ replaced by a link to an outside directory: a sweep would remove that
    directory's old files. It refuses, naming the link, and removes nothing anywhere."""
    outside = tmp_path / "someone-elses"
    outside.mkdir()
    old = outside / "precious.txt"
    old.write_text("keep me")
    t = time.time_ns() - int(30 * 86400 * 1e9)
    os.utime(old, ns=(t, t))
    shutil.rmtree(root / "tmp")
    os.symlink(outside, root / "tmp")
    before = sorted(p.name for p in (root / "objects").rglob("*"))
    r = cli(root, "sweep", "--grace", "0")
    assert r.exit_code == 1 and "symbolic link" in r.stderr and str(root / "tmp") in r.stderr
    assert old.read_text() == "keep me"
    assert sorted(p.name for p in (root / "objects").rglob("*")) == before


def test_a_stage_renamed_into_place_while_the_sweep_lists_is_retained(root, monkeypatch):
    """The import's rename from tmp/ to sessions/ can land between the sweep's
    listing of one directory and of the other: it must be seen in one of them."""
    st = Store(str(root))
    g = st.create(Header.new("imp"))
    ids = [g.append(msg(f"imported {i}")).id for i in range(5)]
    g.close()
    st.close()
    with Store(str(root), readonly=True) as rd:
        objs = objects_of(rd, ids)
    stage = root / "tmp" / f"imp-{os.getpid()}-beef0002"
    shutil.copytree(root / "sessions" / "imp", stage)
    with Store(str(root)) as st:
        st.delete("imp")
    age_all(root)
    real = os.listdir
    state = {"done": False}

    def listdir(path="."):
        out = real(path)
        if not state["done"] and os.fspath(path) in (str(root / "sessions"), str(root / "tmp")):
            state["done"] = True
            os.rename(stage, root / "sessions" / "imp")  # the import lands now
        return out

    monkeypatch.setattr(files_sweep.os, "listdir", listdir)
    with Store(str(root)) as st:
        res = st.sweep(grace=0)
    monkeypatch.undo()
    assert state["done"]
    assert res.repack.dropped == 0, res.repack.dropped_names
    for sp, n in objs:
        assert held(root, sp, n)
    check_sessions(root)


def test_retention_reads_each_block_once(root, monkeypatch):
    """An imported session's records carry no payloads, so a sweep reads its
    envelopes for their contents: in the order they lie, not in hash order."""
    st = Store(str(root), sync="never")
    s = st.create(Header.new("src"))
    for i in range(1500):
        s.append(msg(f"entry {i} " + "words " * (i % 30)))
    st.close()
    data = exports(root)["src"]
    with Store(str(root)) as st:
        st.delete("src")
        st.import_bytes(data, record=True)
    o = FileObjects(str(root))
    o.pack_loose()
    o.close()
    import agentsession_cas.backends.files.packs as packs_mod

    monkeypatch.setattr(packs_mod.PackSet, "CACHE_BLOCKS", 1)
    reads = []
    real = packs_mod.Pack.read_block
    monkeypatch.setattr(packs_mod.Pack, "read_block", lambda self, b: reads.append(b) or real(self, b))
    with Store(str(root), readonly=True) as rd:
        blocks = sum(p.nblocks for p in (rd.objects.packs.refresh(force=True), rd.objects.packs.packs)[1])
        assert blocks >= 3
        ret = sweep_mod.retained(rd, blobs=True)
    assert len(ret.envelopes) == 1500 and len(ret.contents) == 1500
    assert len(reads) <= 2 * blocks + 2, (len(reads), blocks)


# -- beside writers -----------------------------------------------------------------------


def _garbage_store(root: Path) -> tuple[tuple[str, str, bytes], tuple[str, str, bytes]]:
    """A store holding one unretained loose object and one unretained packed one,
    both old; returns them."""
    o = FileObjects(str(root))
    loose = ("contents", sha256_ref(b'{"loose":1}'), b'{"loose":1}')
    o.put(*loose, durable=True)
    batch = [("contents", sha256_ref(b'{"packed":%d}' % i), b'{"packed":%d}' % i) for i in range(PACK_BATCH)]
    o.write_pack(batch)
    o.close()
    age_all(root)
    return loose, batch[0]


@pytest.mark.parametrize("how", ["put", "put_many", "write_pack"])
def test_an_object_re_put_after_the_snapshot_survives(root, monkeypatch, how):
    loose, packed = _garbage_store(root)
    writer = FileObjects(str(root))  # another process, which found both before the sweep began
    assert writer.is_packed(*packed[:2]) and writer.exists(*loose[:2])
    real = sweep_mod.retained

    def retained_then_write(store, *args, **kw):
        ret = real(store, *args, **kw)  # the logs are read: the writer's record comes after
        for obj in (loose, packed):
            if how == "put":
                writer.put(*obj, durable=True)
            elif how == "put_many":
                writer.put_many([obj], dedup=False)
            else:
                writer.write_pack([obj] + [("blobs", sha256_ref(b"%d" % i), b"%d" % i) for i in range(PACK_BATCH)])
        return ret

    monkeypatch.setattr(sweep_mod, "retained", retained_then_write)
    with Store(str(root)) as st:
        st.sweep(grace=0)
    writer.close()
    assert held(root, *loose[:2]) and held(root, *packed[:2])


@pytest.mark.parametrize("what", ["loose", "packed"])
def test_an_object_re_put_as_the_sweep_removes_its_file_survives(root, monkeypatch, what):
    """The writer's touch lands at the last moment: after the sweep compared the
    file's mtime with its snapshot, just before the file goes."""
    loose, packed = _garbage_store(root)
    obj = loose if what == "loose" else packed
    writer = FileObjects(str(root))
    assert writer.is_sound(*obj[:2])
    o = FileObjects(str(root))
    target = o.path(*loose[:2]) if what == "loose" else str(next((root / "objects" / "pack").glob("*.idx")))
    o.close()
    real = os.unlink
    state = {"done": False}

    def unlink(path, *a, **kw):
        p = os.fspath(path)
        if not state["done"] and (p == target or os.path.basename(p).startswith("drop-")):
            state["done"] = True
            writer.put(*obj, durable=True)
        return real(path, *a, **kw)

    monkeypatch.setattr(objects_mod.os, "unlink", unlink)
    with Store(str(root)) as st:
        st.sweep(grace=0)
    monkeypatch.undo()
    writer.close()
    assert state["done"]
    assert held(root, *obj[:2])


def _origin(root: Path, n: int = 6) -> list[str]:
    """A session "origin" of n entries, every object file a month old."""
    with Store(str(root)) as st:
        o = st.create(Header.new("origin"))
        ids = [o.append(msg(f"origin {i}")).id for i in range(n)]
    age_all(root)
    return ids


def test_a_fork_made_while_the_sweep_reads_keeps_its_prefix_when_its_origin_goes(root, monkeypatch):
    """The sweep has listed sessions/; then another process forks the origin and deletes
    it before the sweep reads the origin's log. The fork's log is the only one left that
    retains the prefix (old objects, past any grace period): the sweep must read it."""
    oids = _origin(root)
    with Store(str(root), readonly=True) as rd:
        prefix = objects_of(rd, oids[:4])
        tail = objects_of(rd, oids[4:])
    real = os.listdir
    state = {"done": False}

    def listdir(path="."):
        out = real(path)
        if not state["done"] and os.fspath(path) == str(root / "sessions"):
            state["done"] = True
            with Store(str(root)) as other:
                other.create(Header.new("fork", base=oids[3])).close()
                other.delete("origin")
        return out

    monkeypatch.setattr(files_sweep.os, "listdir", listdir)
    with Store(str(root)) as st:
        res = st.sweep()  # the default grace: the origin's objects are a month old
    monkeypatch.undo()
    assert state["done"]
    assert set(res.repack.dropped_names) == {n for _, n in tail}
    for sp, n in prefix:
        assert held(root, sp, n), n
    check_sessions(root)


def test_a_session_deleted_while_the_sweep_reads_does_not_stop_it(root, monkeypatch):
    """A delete lands between the sweep's read of a session's log and its look for the
    logs repair set aside beside it."""
    with Store(str(root)) as st:
        st.create(Header.new("a")).append(msg("in a"))
        st.create(Header.new("b")).append(msg("in b"))
    age_all(root)
    real = files_sweep.read_log
    state = {"done": False}

    def read_log(data):
        out = real(data)
        if not state["done"]:
            state["done"] = True
            with Store(str(root)) as other:
                other.delete("a")
        return out

    monkeypatch.setattr(files_sweep, "read_log", read_log)
    with Store(str(root)) as st:
        res = st.sweep(grace=0)
    monkeypatch.undo()
    assert state["done"] and res.repack.ok and res.repack.dropped == 0  # what a named stays this once
    assert sweep_json(root, "--grace", "0")["dropped"] == 2  # and goes at the next sweep


def test_a_sweep_between_a_forks_check_and_its_log_keeps_its_prefix(root, monkeypatch):
    oids = _origin(root)
    with Store(str(root), readonly=True) as rd:
        prefix = objects_of(rd, oids[:4])
    real = Store._prefix_for_base

    def checked_then_swept(self, header, owner):
        ids = real(self, header, owner)  # the origin holds the base: checked
        self.delete("origin")
        with Store(str(root)) as sweeper:
            sweeper.sweep()  # the default grace
        return ids

    monkeypatch.setattr(Store, "_prefix_for_base", checked_then_swept)
    with Store(str(root)) as st:
        try:
            st.create(Header.new("fork", base=oids[3])).close()
        except StoreError:
            return  # refusing the fork is right too
    monkeypatch.undo()
    for sp, n in prefix:
        assert held(root, sp, n), n
    check_sessions(root)


def test_a_blob_an_append_names_during_a_sweep_survives(root, monkeypatch):
    with Store(str(root)) as st:
        blob = st.put_blob(b"\x89PNG put long ago, named by nothing yet")
        st.create(Header.new("media", media="sidecar")).append(msg("no image yet"))
    age_all(root)
    writer = Store(str(root))
    s = writer.session("media")
    real = sweep_mod.retained
    appended = {}

    def retained_then_append(store, *args, **kw):
        ret = real(store, *args, **kw)  # the logs are read: the append's record comes after
        appended["result"] = s.append(image(blob))
        return ret

    monkeypatch.setattr(sweep_mod, "retained", retained_then_append)
    with Store(str(root)) as st:
        st.sweep()  # the default grace: the blob is a month old
    monkeypatch.undo()
    writer.close()
    assert f"sidecar:{blob}" in appended["result"].unresolved or held(root, "blobs", blob)


def _start(root: Path, sid: str, policy: str, seconds: float, seed: int, genfile: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(root), sid, policy, str(seconds), str(seed), str(genfile)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


@pytest.mark.slow
def test_sweeps_beside_writers_in_other_processes(root, tmp_path):
    sys.path.insert(0, str(HERE))
    from sweep_worker import POOL, pool_body

    genfile = tmp_path / "generation"
    stop = genfile.with_name(genfile.name + ".stop")  # the workers' GENFILE.stop
    genfile.write_text("0")

    def garbage(gen: int) -> None:
        """This generation's pool bodies as content objects no session retains."""
        with Store(str(root)) as st:
            g = st.create(Header.new(f"garbage-{gen}"))
            for i in range(len(POOL)):
                g.append({"type": "item", "ts": ts(), "item": {"type": "message", "role": "user", "content": pool_body(i, gen)}})
            g.close()
            st.delete(f"garbage-{gen}")

    garbage(0)
    workers = [_start(root, "w-never", "never", 5.0, 1, genfile), _start(root, "w-always", "always", 5.0, 2, genfile)]
    sweeps = 0
    try:
        while any(w.poll() is None for w in workers):
            sweeps += 1
            garbage(sweeps)
            tmp = genfile.with_suffix(".tmp")
            tmp.write_text(str(sweeps))
            os.replace(tmp, genfile)  # writers now append this generation's bodies
            with Store(str(root)) as st:
                st.sweep(grace=0, force=True)  # writers run beside it on purpose
            if sweeps == 3:  # the writers go on until then, however slow this machine
                stop.write_text("")
    finally:
        stop.write_text("")
        outs = [w.communicate(timeout=60) for w in workers]
    for w, (_, err) in zip(workers, outs):
        assert w.returncode == 0, err.decode()
    counts: dict[str, int] = {}
    for out, _ in outs:
        line = out.decode().strip()
        assert line.startswith("DONE "), line
        for kv in line.split()[1:]:
            k, v = kv.split("=")
            counts[k] = int(v)
    assert sweeps >= 3
    # One more sweep with nothing running, then everything is checked.
    with Store(str(root)) as st:
        res = st.sweep(grace=0)
    assert res.repack.problems == []
    got = check_sessions(root)
    assert set(got) == set(counts)
    with Store(str(root), readonly=True) as rd:
        for sid, n in counts.items():
            assert len(rd.read(sid)) == n, sid


def test_a_sweep_with_a_short_grace_refuses_while_a_writer_holds_a_session(tmp_path):
    """A grace under an hour does not protect objects a writer or a push has sent but not
    yet recorded: such a sweep refuses, naming the sessions held, while any writer holds
    one, unless --force (issue 16: `sweep --grace 0` beside pushes lost the first
    push's objects)."""
    from click.testing import CliRunner

    from agentsession_cas.errors import WritersActiveError
    from agentsession_cli.main import main

    root = tmp_path / "store"
    Store.init(str(root)).close()
    writer = Store(str(root))
    s = writer.create(Header.new("busy"))
    s.append({"type": "config", "model": "m", "ts": "2026-10-05T12:00:00Z"})
    try:
        r = CliRunner().invoke(main, ["--store", str(root), "sweep", "--grace", "0"])
        assert r.exit_code == 1 and "a writer holds 1 session(s): busy" in r.output and "--force" in r.output
        with Store(str(root)) as st:
            with pytest.raises(WritersActiveError) as info:
                st.sweep(grace=0)
            assert info.value.code == "writers_active"
            assert st.sweep(grace=0, dry_run=True).repack.dropped == 0  # a dry run removes nothing: allowed
            assert st.sweep(grace=3600).repack.problems == []  # a grace that covers writers: allowed
        r = CliRunner().invoke(main, ["--store", str(root), "sweep", "--grace", "0", "--force"])
        assert r.exit_code == 0, r.output
    finally:
        s.close()
        writer.close()
    r = CliRunner().invoke(main, ["--store", str(root), "sweep", "--grace", "0"])
    assert r.exit_code == 0, r.output  # no writer now
