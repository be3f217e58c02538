"""fsck: a whole-store walk (agentsession_cas/fsck.py) and the `fsck` command.

One store is built per module (loose objects, a pack, a fork, a mirror, a
sidecar session with a blob, a ref) and copied for each test, which then
damages its copy one way and checks the finding is named precisely: code,
session, object, file, line. Concurrency is tested with real writer
processes (tests/crash_worker.py) appending while fsck runs.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, make_entry
from agentsession_cas.backends.files.fsck import writer_holds
from agentsession_cas.backends.files.log import encode_record, read_log
from agentsession_cas.backends.files.objects import FileObjects
from agentsession_cas.backends.files.packs import Pack
from agentsession_cas.errors import StoreError
from agentsession_cas.format.hashing import entry_objects
from agentsession_cas.format.writer import write_session
from agentsession_cas.maintenance.fsck import FsckReport, fsck
from agentsession_cas.store import Store
from agentsession_cas.store.refs import Refs
from agentsession_cli import terminal
from agentsession_cli.fsck_command import run_fsck
from agentsession_cli.main import main
from storetools import chained_after

WORKER = Path(__file__).with_name("crash_worker.py")
_TICK = itertools.count()


def ts() -> str:
    n = next(_TICK)
    return f"2026-10-05T12:{(n // 60) % 60:02d}:{n % 60:02d}.{n % 1000000:06d}1Z"


def msg(text: str, **kw) -> dict:
    d = {"type": "item", "item": {"type": "message", "role": "user", "content": text}, "ts": ts()}
    d.update(kw)
    return d


# -- the store every test copies ------------------------------------------------------------


def build(root: Path, tmp: Path) -> dict:
    """rec: 6 durable appends (loose objects); fork: from rec's 4th entry; side: a sidecar
    session with a blob; bigsrc: 40 lazy appends (one pack at close); mirror: an import."""
    info: dict = {}
    with Store.init(root) as st:
        s = st.create(Header.new("rec"))
        ids = [s.append({"type": "config", "model": "m", "ts": ts()}).id]
        for i in range(5):
            ids.append(s.append(msg(f"turn {i}")).id)
        s.close()
        info["rec"] = ids
        f = st.create(Header.new("fork", base=ids[3]))
        info["fork"] = [f.append(msg("fork turn", parent=ids[3])).id]
        f.close()
        side = st.create(Header.new("side", media="sidecar"))
        blob = st.put_blob(b"\x89PNG not really an image")
        info["blob"] = blob
        side_ids = [side.append({"type": "config", "model": "m", "ts": ts()}).id]
        image = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": f"sidecar:{blob}"}]}
        side_ids.append(side.append(msg("img", item=image)).id)
        side.close()
        info["side"] = side_ids
        b = st.create(Header.new("bigsrc"))
        info["bigsrc"] = [b.append(msg(f"big {i}"), durable=False).id for i in range(40)]
        b.close()
        entries = []
        parent = None
        for i in range(5):
            e = make_entry("item", parent, ts=ts(), item={"type": "message", "role": "user", "content": f"mirrored {i}"})
            entries.append(e)
            parent = e.id
        path = tmp / "mirror.jsonl"
        write_session(path, Header.new("mirror"), entries)
        st.import_file(path)
        info["mirror"] = [e.id for e in entries]
        Refs(st).update("chat/one", "rec", expected=None)
    return info


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    base = tmp_path_factory.mktemp("fsck-built")
    root = base / "store"
    info = build(root, base)
    return root, info


@pytest.fixture
def store(built, tmp_path) -> tuple[Path, dict]:
    root, info = built
    copy = tmp_path / "store"
    shutil.copytree(root, copy, symlinks=True)
    return copy, info


def loose(root: Path, space: str, name: str) -> Path:
    h = name.split(":", 1)[1]
    return root / "objects" / space / h[:2] / h[2:]


def the_pack(root: Path) -> tuple[Path, Path]:
    idx = sorted((root / "objects" / "pack").glob("pack-*.idx"))
    assert len(idx) == 1, idx
    return idx[0].with_suffix(".pack"), idx[0]


def content_of(root: Path, entry: str) -> str:
    env = json.loads(FileObjects(str(root)).get("entries", entry))
    return env["content"]


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


def errors(report: FsckReport, code: str | None = None) -> list:
    return [p for p in report.errors if code is None or p.code == code]


def log_line_of(root: Path, sid: str, entry: str) -> int:
    for r in read_log((root / "sessions" / sid / "log").read_bytes()).records:
        if r.op == "append" and r.get("entry") == entry:
            return r.line
    raise AssertionError(f"{entry} not in the log of {sid}")


def append_raw(root: Path, sid: str, *lines: bytes) -> None:
    """Append whole records, each framed anew to follow the log's last line (the chain);
    bytes that are no whole line (a torn write) are appended as they are."""
    path = root / "sessions" / sid / "log"
    data = b"".join(lines)
    if data.endswith(b"\n"):
        data = chained_after(path.read_bytes(), data)
    with open(path, "ab") as f:
        f.write(data)


def put_entry(root: Path, data: dict) -> tuple[str, bytes, bytes]:
    """Write an entry's two objects straight to objects/ (bypassing every rule)."""
    eid, chash, content, env = entry_objects(data)
    objs = FileObjects(str(root))
    objs.put("contents", chash, content, durable=False)
    objs.put("entries", eid, env, durable=False)
    objs.close()
    return eid, content, env


def snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            out[str(p.relative_to(root))] = (st.st_mode, st.st_mtime_ns, st.st_size,
                                             None if p.is_dir() or p.is_symlink() else p.read_bytes())
    st = os.lstat(root)
    out["."] = (st.st_mode, st.st_mtime_ns)
    return out


def cli(root: Path, *args: str):
    return CliRunner().invoke(main, ["--store", str(root), *args], catch_exceptions=False)


# -- a clean store --------------------------------------------------------------------------


def test_a_clean_store_is_clean(store):
    root, info = store
    report = fsck(root)
    assert report.ok and report.problems == [], [str(p) for p in report.problems]
    c = report.counts
    assert c["packs"] == 1 and c["packed"] == 80 and c["blocks"] >= 1
    assert c["loose"] > 0 and c["objects"] == c["loose"] + c["packed"]
    assert c["sessions"] == 5 and c["refs"] == 1
    assert c["spaces"]["blobs"] == 1
    assert c["unreferenced"] == {"entries": 0, "contents": 0, "blobs": 0}
    # Every entry of every session is counted in its space, each once.
    own = sum(len(info[k]) for k in ("rec", "fork", "side", "bigsrc", "mirror"))
    assert c["spaces"]["entries"] == own


def test_fsck_writes_nothing(store):
    root, info = store
    # Damage of several kinds, so the walk takes its error paths too.
    flip(loose(root, "entries", info["rec"][5]), 10)
    (root / "sessions" / "rec" / "HEAD").write_text(info["rec"][1] + "\n")
    append_raw(root, "fork", b"0123456789abcdef {\"op\":\"app")
    (root / "stray-file").write_text("x")
    time.sleep(0.01)
    before = snapshot(root)
    fsck(root)
    cli(root, "fsck")
    cli(root, "fsck", "--json", "--deep")
    assert snapshot(root) == before


# -- objects --------------------------------------------------------------------------------


def test_a_flipped_byte_in_a_loose_object(store):
    root, info = store
    entry = info["rec"][2]
    path = loose(root, "entries", entry)
    flip(path, 20)
    report = fsck(root)
    [bad] = errors(report, "corrupt-object")
    assert bad.object == entry and bad.space == "entries"
    assert bad.file == str(path.relative_to(root))
    # The sessions that need it are named too: rec's log line, and the fork's prefix.
    missing = {p.session: p for p in errors(report, "missing-object")}
    assert missing["rec"].object == entry and missing["rec"].line == log_line_of(root, "rec", entry)
    assert "corrupt" in missing["rec"].message
    assert missing["fork"].object == entry and "prefix" in missing["fork"].message
    assert set(missing) == {"rec", "fork"}


def test_a_flipped_byte_in_a_pack_block(store):
    root, info = store
    pack_path, idx_path = the_pack(root)
    pack = Pack(str(idx_path))
    offset, size, _ = pack.block_info(0)
    pack.close()
    flip(pack_path, offset + size // 2)
    report = fsck(root)
    rel = str(pack_path.relative_to(root))
    assert any(p.code == "bad-pack" and p.file == rel for p in report.errors)
    named = [p for p in report.errors if p.code in ("bad-block", "corrupt-object") and p.file == rel]
    assert named and all(p.block == 0 for p in named)
    assert {p.session for p in errors(report, "missing-object")} == {"bigsrc"}


def test_a_flipped_byte_in_a_pack_index(store):
    root, info = store
    pack_path, idx_path = the_pack(root)
    flip(idx_path, idx_path.stat().st_size // 2)
    report = fsck(root)
    [bad] = errors(report, "bad-pack-index")
    assert bad.file == str(idx_path.relative_to(root)) and "checksum" in bad.message
    missing = errors(report, "missing-object")
    assert {p.session for p in missing} == {"bigsrc"} and len(missing) == 40


def test_a_truncated_pack(store):
    root, info = store
    pack_path, _ = the_pack(root)
    with open(pack_path, "r+b") as f:
        f.truncate(pack_path.stat().st_size // 2)
    report = fsck(root)
    rel = str(pack_path.relative_to(root))
    [cut] = errors(report, "truncated-pack")
    assert cut.file == rel and "cut short" in cut.message
    assert any(p.code == "bad-pack" and p.file == rel for p in report.errors)


def test_an_index_without_its_pack_and_a_pack_without_its_index(store):
    root, info = store
    pack_path, idx_path = the_pack(root)
    orphan = pack_path.with_name("pack-" + "ab" * 32 + ".pack")
    shutil.copy(pack_path, orphan)
    pack_path.unlink()
    report = fsck(root)
    [gone] = errors(report, "missing-pack")
    assert gone.file == str(pack_path.relative_to(root))
    # the copy holds objects the sessions need and no read finds: an error, naming them
    [lost] = errors(report, "missing-index")
    assert lost.file == str(orphan.relative_to(root))


def test_a_pack_whose_index_is_lost_is_named_where_its_objects_are_needed(store):
    """The .idx of a pack deleted: its objects are in the pack, which no read finds
    without it. fsck says so where it hurts (each missing object: the pack that holds
    it) and at the pack (how many objects only it holds, and that `pack` rebuilds its
    index); a copy whose every object is held elsewhere stays a warning."""
    root, info = store
    pack_path, idx_path = the_pack(root)
    idx_path.unlink()
    report = fsck(root)
    rel = str(pack_path.relative_to(root))
    [lost] = errors(report, "missing-index")
    assert lost.file == rel and "agentsession pack" in lost.message and "rebuilds its index" in lost.message
    missing = errors(report, "missing-object")
    assert missing and all(f"{rel}, which has no index, holds it" in p.message for p in missing)
    assert {p.session for p in missing} == {"bigsrc"}
    assert not [p for p in report.warnings if p.code == "pack-without-index"]
    assert CliRunner().invoke(main, ["--store", str(root), "pack"]).exit_code == 0
    report = fsck(root)
    assert report.ok and not report.warnings, report.problems
    # a copy of a sound pack, without its index: nothing is lost, a warning
    [pack_path] = list((root / "objects" / "pack").glob("*.pack"))
    shutil.copy(pack_path, pack_path.with_name("pack-" + "cd" * 32 + ".pack"))
    report = fsck(root)
    assert report.ok and [p.code for p in report.warnings] == ["pack-without-index"]


def test_an_object_a_log_needs_is_deleted(store):
    root, info = store
    entry = info["mirror"][2]
    loose(root, "entries", entry).unlink()
    report = fsck(root)
    [p] = errors(report)
    assert (p.code, p.session, p.object, p.space) == ("missing-object", "mirror", entry, "entries")
    assert p.line == log_line_of(root, "mirror", entry) and p.file == "sessions/mirror/log"
    assert "which has no copy: not in objects/" in p.message


def test_a_pack_directory_that_cannot_be_listed_is_an_error_and_the_walk_goes_on(store):
    root, info = store
    pack_dir = root / "objects" / "pack"
    shutil.rmtree(pack_dir)
    pack_dir.write_bytes(b"not a directory")
    report = fsck(root)
    first = report.errors[0]
    assert (first.code, first.file) == ("unreadable", "objects/pack")
    assert "cannot be listed" in first.message
    # the sessions were still checked: bigsrc's entries were in the pack
    assert any(p.code == "missing-object" and p.session == "bigsrc" for p in report.errors)
    r = cli(root, "fsck")
    assert r.exit_code == 1 and r.stdout.startswith("error: unreadable: objects/pack cannot be listed")


def test_a_missing_content(store):
    root, info = store
    entry = info["rec"][4]
    content = content_of(root, entry)
    loose(root, "contents", content).unlink()
    report = fsck(root)
    found = {(p.code, p.session) for p in report.errors}
    assert ("missing-content", "rec") in found
    [p] = [p for p in report.errors if p.session == "rec"]
    assert p.object == entry and content in p.message and p.line == log_line_of(root, "rec", entry)
    # The content is on the fork's prefix too (rec's 5th entry is not: the base is the 4th).
    assert "fork" not in {p.session for p in report.errors}


def test_a_broken_prefix_is_named_for_the_fork(store):
    root, info = store
    loose(root, "entries", info["rec"][0]).unlink()
    report = fsck(root)
    fork = [p for p in report.errors if p.session == "fork"]
    assert len(fork) == 1 and fork[0].object == info["rec"][0]
    assert "path from its base" in fork[0].message


# -- logs and indexes -----------------------------------------------------------------------


def test_a_damaged_log_line(store):
    root, info = store
    log = root / "sessions" / "rec" / "log"
    lines = log.read_bytes().split(b"\n")
    offset = len(lines[0]) + 1 + len(lines[1]) + 1  # line 3
    flip(log, offset + 30)
    report = fsck(root)
    damage = errors(report, "log-damage")
    assert [(p.session, p.line, p.offset, p.file) for p in damage] == [("rec", 3, offset, "sessions/rec/log")]
    assert "checksum" in damage[0].message
    assert any(p.code == "not-checked" and p.session == "rec" for p in report.notes)
    assert [p.code for p in report.errors] == ["log-damage"]  # the readable records' objects are all there


def test_a_torn_tail_is_a_writer_or_a_crash_not_damage(store):
    root, info = store
    append_raw(root, "rec", encode_record({"op": "append", "seq": 99, "entry": info["rec"][0]})[:25])
    report = fsck(root)
    assert report.ok, [str(p) for p in report.errors]
    [tail] = [p for p in report.notes if p.code == "log-tail"]
    assert tail.session == "rec" and tail.line == len(read_log((root / "sessions/rec/log").read_bytes()).records) + 1


def test_an_uncommitted_append_without_objects_is_dropped_not_damage(store):
    root, info = store
    ghost = "sha256:" + "7" * 64
    append_raw(root, "rec", encode_record({"op": "append", "seq": 50, "entry": ghost, "lazy": True}))
    report = fsck(root)
    assert report.ok, [str(p) for p in report.errors]
    [p] = [p for p in report.notes if p.code == "dropped-on-open"]
    assert p.object == ghost and p.session == "rec"


def test_a_stale_head(store):
    root, info = store
    (root / "sessions" / "rec" / "HEAD").write_text(info["rec"][1] + "\n")
    report = fsck(root)
    [p] = report.errors
    assert (p.code, p.session, p.file) == ("stale-head", "rec", "sessions/rec/HEAD")
    assert info["rec"][1] in p.message and info["rec"][5] in p.message


def test_a_stale_mark_and_a_missing_head(store):
    root, info = store
    (root / "sessions" / "mirror" / "mark").write_text("record\n")
    (root / "sessions" / "fork" / "HEAD").unlink()
    report = fsck(root)
    assert {(p.code, p.session) for p in report.errors} == {("stale-mark", "mirror"), ("stale-head", "fork")}
    assert "missing" in [p for p in report.errors if p.session == "fork"][0].message


def test_an_index_a_writer_has_not_rewritten_yet_is_a_lag(store):
    root, info = store
    with Store(root) as st:
        s = st.session("rec")
        s.append(msg("durable, HEAD not rewritten until close"), durable=True)
        assert writer_holds(str(root), "rec") is True
        report = fsck(root)
        assert report.ok, [str(p) for p in report.errors]
        assert [p.session for p in report.notes if p.code == "index-lag"] == ["rec"]
    assert writer_holds(str(root), "rec") is False
    assert fsck(root).problems == []


def test_an_index_left_behind_by_a_crash_is_a_lag(store):
    """A writer killed after durable appends leaves HEAD behind; the log shows it never
    closed (appends after its last checkpoint), so fsck does not call that damage."""
    root, info = store
    subprocess.run([sys.executable, str(WORKER), "lazy", str(root), "rec", "3"], check=True, capture_output=True, timeout=60)
    report = fsck(root)
    assert report.ok, [str(p) for p in report.errors]
    assert report.counts["in_log_only"] == 3
    assert [p.session for p in report.notes if p.code == "index-lag"] == ["rec"]


def test_a_torn_object_the_log_still_carries_is_a_note(store):
    root, info = store
    out = subprocess.run([sys.executable, str(WORKER), "lazy", str(root), "rec", "2"], check=True,
                         capture_output=True, timeout=60, text=True)
    entry = out.stdout.split()[2]
    path = loose(root, "entries", entry)
    path.write_bytes(b'{"content":"sha2')  # a checkpoint cut short while writing this file
    report = fsck(root)
    assert report.ok, [str(p) for p in report.errors]
    [torn] = [p for p in report.notes if p.code == "torn-object"]
    assert torn.object == entry and torn.file == str(path.relative_to(root)) and "sessions/rec/log" in torn.message


def test_a_loose_object_read_while_being_written_is_not_damage(store, monkeypatch):
    """A checkpoint of few objects writes loose files in place, then its record: the walk
    may read a file half written and the log after the checkpoint record. The file is
    read once more at the end, whole by then, and nothing is reported."""
    import agentsession_cas.backends.files.fsck as fsck_module

    root, info = store
    path = loose(root, "entries", info["rec"][3])
    whole = path.read_bytes()
    path.write_bytes(whole[:20])
    walk_sessions = fsck_module._Walk.walk_sessions

    def writer_finishes_first(self):
        path.write_bytes(whole)
        walk_sessions(self)

    monkeypatch.setattr(fsck_module._Walk, "walk_sessions", writer_finishes_first)
    report = fsck(root)
    assert report.problems == [], [str(p) for p in report.problems]


def test_a_checkpoint_covers_appends_by_sequence_number(store):
    """A checkpoint runs beside later appends, so its record may follow appends it does
    not cover: their objects are in their payloads only, which is no damage. An append
    it covers must have its objects in objects/."""
    root, info = store
    data = msg("appended while the checkpoint ran", parent=info["rec"][5])
    eid, chash, content, env = entry_objects(data)  # objects/ never gets them
    append_raw(root, "rec", encode_record({"op": "append", "seq": 7, "entry": eid}, payload=(content, env)),
               encode_record({"op": "checkpoint", "seq": 6}), encode_record({"op": "commit"}))
    report = fsck(root)
    assert report.ok, [str(p) for p in report.errors]
    assert report.counts["in_log_only"] == 1
    append_raw(root, "rec", encode_record({"op": "checkpoint", "seq": 7}))
    [p] = fsck(root).errors
    assert (p.code, p.session, p.object) == ("missing-object", "rec", eid)


# -- rules ---------------------------------------------------------------------------------


def test_the_parent_rule(store):
    root, info = store
    # An entry of rec hung in mirror: its parent is not in mirror.
    eid, content, env = put_entry(root, msg("misplaced", parent=info["rec"][1]))
    append_raw(root, "mirror", encode_record({"op": "append", "seq": 6, "entry": eid}, payload=(content, env)),
               encode_record({"op": "commit"}))
    # A root in a fork.
    rid, rc, renv = put_entry(root, msg("a root in a fork", parent=None))
    append_raw(root, "fork", encode_record({"op": "append", "seq": 2, "entry": rid}, payload=(rc, renv)),
               encode_record({"op": "commit"}))
    report = fsck(root)
    # The codes are the rule set's (format/rules.py), as verify of the session (and of its
    # export) names them: a parent not earlier in the session is `parent`, a root in a fork `base`.
    [p] = errors(report, "parent")
    assert p.session == "mirror" and p.object == eid and p.line == log_line_of(root, "mirror", eid)
    assert info["rec"][1] in p.message and "does not appear earlier in the session" in p.message
    [b] = errors(report, "base")
    assert b.session == "fork" and b.object == rid and "its parent is null" in b.message


def test_a_parent_on_the_prefix_above_the_base(store):
    root, info = store
    eid, content, env = put_entry(root, msg("from above the base", parent=info["rec"][1]))
    append_raw(root, "fork", encode_record({"op": "append", "seq": 2, "entry": eid}, payload=(content, env)),
               encode_record({"op": "commit"}))
    [p] = errors(fsck(root), "base")
    assert p.session == "fork" and "on the prefix above the base" in p.message


def test_the_parents_rule(store):
    root, info = store
    rec = info["rec"]
    data = msg("converges", parent=rec[5], parents=[{"entry": rec[5]}, {"entry": "sha256:" + "1" * 64}])
    eid, content, env = put_entry(root, data)
    append_raw(root, "rec", encode_record({"op": "append", "seq": 7, "entry": eid}, payload=(content, env)),
               encode_record({"op": "commit"}))
    found = [p.message for p in errors(fsck(root), "parents")]
    assert len(found) == 2
    assert any("repeats the parent" in m for m in found)
    assert any("does not appear earlier in this session" in m for m in found)


def test_the_head_rule(store):
    root, info = store
    above = info["rec"][1]  # on the fork's prefix, neither its base nor an own entry
    append_raw(root, "fork", encode_record({"op": "head", "head": above}), encode_record({"op": "commit"}))
    (root / "sessions" / "fork" / "HEAD").write_text(above + "\n")
    [p] = fsck(root).errors
    assert (p.code, p.session) == ("head-rule", "fork") and above in p.message


def _set_header(root: Path, sid: str, header: dict) -> None:
    """A header written into the log (its create record) and its file, as a writer would."""
    from agentsession_cas.backends.files.log import encode_log
    from agentsession_cas.format.canonical import canonical_bytes

    log = root / "sessions" / sid / "log"
    recs = read_log(log.read_bytes(), expand=False).records
    recs[0].data["header"] = header
    log.write_bytes(encode_log([(r.data, r.payload) for r in recs]))
    (root / "sessions" / sid / "header").write_bytes(canonical_bytes(header) + b"\n")


def test_a_fork_with_a_base_of_other_media(store):
    root, info = store
    header = json.loads((root / "sessions" / "fork" / "header").read_text())
    header["media"] = "sidecar"
    _set_header(root, "fork", header)
    [p] = fsck(root).errors
    assert (p.code, p.session, p.object) == ("bad-base", "fork", info["rec"][3])
    assert "sidecar" in p.message and "rec" in p.message


def test_a_bad_header(store):
    """A header file that no longer parses: the log holds the header, so the file is a
    stale index (a warning; served from the log, rewritten by a writing open). A log
    written before logs held the header has only the file: then it is an error."""
    root, info = store
    (root / "sessions" / "side" / "header").write_text("{not json\n")
    report = fsck(root)
    assert not report.errors and [(p.code, p.file) for p in report.warnings] == [("stale-header", "sessions/side/header")]
    log = root / "sessions" / "side" / "log"
    recs = read_log(log.read_bytes(), expand=False).records
    del recs[0].data["header"]
    from agentsession_cas.backends.files.log import encode_log

    log.write_bytes(encode_log([(r.data, r.payload) for r in recs]))
    [p] = fsck(root).errors
    assert (p.code, p.session, p.file) == ("bad-header", "side", "sessions/side/header")


# -- the rest of the store ------------------------------------------------------------------


def test_stray_names_are_warnings(store):
    root, info = store
    (root / "notes.txt").write_text("x")
    (root / "objects" / "entries" / "zz").mkdir()
    (root / "objects" / "contents" / "00" / "not-an-object").write_text("x")
    (root / "sessions" / "rec" / "extra").write_text("x")
    (root / "refs" / "bad%%name").write_text("x")
    (root / "sessions" / "empty").mkdir()
    report = fsck(root)
    assert report.ok
    strays = sorted(p.file for p in report.warnings if p.code == "stray")
    assert strays == ["notes.txt", "objects/contents/00/not-an-object", "objects/entries/zz", "refs/bad%%name",
                      "sessions/empty", "sessions/rec/extra"]


def test_object_and_pack_names_in_upper_case_are_stray(store):
    """An object name is lowercase hex (format/hashing.py ``is_hash``): a loose file or a
    pack named in upper case is no object of the store, a stray name as any other, and
    none of its objects is counted."""
    root, info = store
    before = fsck(root).counts
    f = next(p for p in sorted((root / "objects" / "entries").glob("??/*")) if p.is_file())
    upper_file = f.with_name(f.name.upper())  # (62 hex digits: some of them letters)
    shutil.copy(f, upper_file)
    pack, idx = the_pack(root)
    shutil.copy(idx, idx.with_name("pack-" + idx.name[5:-4].upper() + ".idx"))
    shutil.copy(pack, pack.with_name("pack-" + pack.name[5:-5].upper() + ".pack"))
    report = fsck(root)
    assert report.ok
    strays = sorted(p.file for p in report.warnings if p.code == "stray")
    assert strays == sorted([os.path.relpath(upper_file, root), f"objects/pack/pack-{idx.name[5:-4].upper()}.idx",
                             f"objects/pack/pack-{pack.name[5:-5].upper()}.pack"])
    assert report.counts["objects"] == before["objects"] and report.counts["unreferenced"] == before["unreferenced"]


def test_progress_only_on_a_terminal_and_never_under_json(store, capsys, monkeypatch):
    root, info = store
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setattr(terminal, "PROGRESS_DELAY", 0.0)  # every operation slow
    monkeypatch.setattr(terminal, "PROGRESS_EVERY", 0.0)
    assert run_fsck(False, root=str(root)) == 0
    err = capsys.readouterr().err
    assert "\r\x1b[Kfsck: " in err and err.endswith("\r\x1b[K")  # drawn, then cleared
    assert run_fsck(True, root=str(root)) == 0
    assert capsys.readouterr().err == ""


def test_a_damaged_ref_and_a_dangling_one(store):
    root, info = store
    with Store(root) as st:
        Refs(st).update("chat/two", "side", expected=None)
        st.delete("side")
    (root / "refs" / "chat%one").write_text("garbage")
    report = fsck(root)
    [bad] = report.errors
    assert (bad.code, bad.file) == ("bad-ref", "refs/chat%one")
    assert [(p.code, p.session) for p in report.notes if p.code.endswith("-ref")] == [("dangling-ref", "side")]


def test_a_garbled_refs_log_line_is_an_error_as_reading_a_refs_history_finds_it(store):
    """fsck reads refs.log by the rule a ref's log reads it by (refs.py read_refs_log):
    each line before the last that does not read is an error naming the file (relative
    to the store) and the line, which Refs.log fails on; a torn last line is a note, which
    no read takes. fsck said nothing of a garbled line, and exited 0."""
    root, info = store
    with Store(root) as st:
        st.create(Header.new("s2")).close()
        Refs(st).update("chat/one", "s2", expected="rec")
        Refs(st).update("chat/two", "s2", expected=None)
    path = root / "refs.log"
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 3
    garbled = [b"z" + lines[0][1:], lines[1], b"[" + lines[2][1:]]
    path.write_bytes(b"".join(garbled) + lines[2][:-9])
    report = fsck(root)
    bad = errors(report)
    assert [(p.code, p.file, p.line) for p in bad] == [("bad-refs-log", "refs.log", 1), ("bad-refs-log", "refs.log", 3)]
    assert str(root) not in bad[0].message and "refs.log line 1 does not read" in bad[0].message
    assert [(p.code, p.file, p.line) for p in report.notes if p.file == "refs.log"] == [("log-tail", "refs.log", 4)]
    with Store(root) as st, pytest.raises(StoreError, match="line 1 does not read"):
        Refs(st).log("chat/one")
    path.write_bytes(b"".join(lines) + lines[2][:-9])  # a torn last line alone: read past, no error
    report = fsck(root)
    assert report.ok and [p.line for p in report.notes if p.file == "refs.log"] == [4]
    with Store(root) as st:
        assert [m["new"] for m in Refs(st).log("chat/one")] == ["s2", "rec"]
    path.unlink()
    path.mkdir()  # no file a read can take: an error, as a ref's log refuses it
    assert [(p.code, p.file) for p in errors(fsck(root))] == [("bad-refs-log", "refs.log")]


def test_unreferenced_objects_are_counted_as_sweep_would_see_them(store):
    from agentsession_cas.maintenance.sweep import retained

    root, info = store
    with Store(root) as st:
        st.delete("side")
    report = fsck(root)
    assert report.ok
    # side's two entries and its blob go; of its contents only the message's, since its
    # config body ({"model":"m"}) is rec's too, whose envelope still retains it.
    assert report.counts["unreferenced"] == {"entries": 2, "contents": 1, "blobs": 1}
    st = Store(root, readonly=True)
    try:
        ret = retained(st)
        held = {space: set(st.objects.names(space)) for space in ("entries", "contents", "blobs")}
    finally:
        st.close()
    assert report.counts["unreferenced"] == {
        "entries": len(held["entries"] - ret.envelopes),
        "contents": len(held["contents"] - ret.contents),
        "blobs": len(held["blobs"] - ret.blobs),
    }


def test_a_log_repair_set_aside_retains_what_it_names_as_sweep_sees_it(tmp_path):
    """Entries a repair dropped (their parent lost) whose objects are whole stay named by
    the damaged log kept aside; a sweep keeps them, so fsck does not count them."""
    from agentsession_cas.maintenance.repair import repair_session
    from agentsession_cas.maintenance.sweep import retained

    root = tmp_path / "store"
    with Store.init(root) as st:
        s = st.create(Header.new("hurt"))
        ids = [s.append(msg(f"hurt {i}")).id for i in range(5)]
    log = root / "sessions" / "hurt" / "log"
    rec = next(r for r in read_log(log.read_bytes()).records if r.op == "append" and r.get("entry") == ids[2])
    data = bytearray(log.read_bytes())
    end = data.index(b"\n", rec.offset)
    data[rec.offset:end] = b"\x00" * (end - rec.offset)  # its record and payload gone
    log.write_bytes(bytes(data))
    loose(root, "entries", ids[2]).unlink()  # and its envelope: nothing proves it
    with Store(root) as st:
        report = repair_session(st, "hurt")
    assert {d.entry for d in report.dropped} == set(ids[2:])
    rd = Store(root, readonly=True)
    try:
        ret = retained(rd)
        held = {space: set(rd.objects.names(space)) for space in ("entries", "contents", "blobs")}
    finally:
        rd.close()
    assert set(ids[3:]) <= ret.envelopes  # the sweep keeps them (the kept damaged log names them)
    report = fsck(root)
    assert report.ok
    assert report.counts["unreferenced"] == {
        "entries": len(held["entries"] - ret.envelopes),
        "contents": len(held["contents"] - ret.contents),
        "blobs": len(held["blobs"] - ret.blobs),
    } == {"entries": 0, "contents": 1, "blobs": 0}  # the lost entry's content: nothing names it


def test_a_missing_sidecar_blob_is_a_warning(store):
    root, info = store
    loose(root, "blobs", info["blob"]).unlink()
    report = fsck(root)
    assert report.ok
    [w] = [p for p in report.warnings if p.code == "missing-blob"]
    assert (w.session, w.object) == ("side", info["blob"])


# -- the command ----------------------------------------------------------------------------


def test_cli_clean_exit_0(store):
    root, info = store
    r = cli(root, "fsck")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == "fsck: 0 problem(s), 0 warning(s)"
    assert "80 packed in 1 pack(s)" in r.stdout and "5 session(s)" in r.stdout
    assert "\r" not in r.stderr  # no progress without a terminal


def test_cli_problems_exit_1_one_line_each(store):
    root, info = store
    path = loose(root, "entries", info["mirror"][1])
    flip(path, 3)
    (root / "stray").write_text("x")
    r = cli(root, "fsck")
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    rel = str(path.relative_to(root))
    assert any(line.startswith("error: corrupt-object: ") and rel in line and info["mirror"][1] in line for line in lines)
    assert any(line.startswith("error: missing-object: session mirror: log line") for line in lines)
    assert any(line.startswith("warning: stray: stray") for line in lines)
    assert lines[-1] == "fsck: 2 problem(s), 1 warning(s)"


def test_cli_json_shape(store):
    root, info = store
    (root / "sessions" / "rec" / "HEAD").write_text("\n")
    r = cli(root, "fsck", "--json")
    assert r.exit_code == 1
    data = json.loads(r.stdout)
    assert set(data) == {"store", "ok", "problems", "warnings", "notes", "counts"}
    assert data["ok"] is False and data["store"] == str(root)
    [p] = data["problems"]
    assert p == {"severity": "error", "code": "stale-head", "where": "sessions/rec/HEAD", "entry": None,
                 "message": p["message"], "session": "rec", "object": None,
                 "space": None, "file": "sessions/rec/HEAD", "line": None, "offset": None, "block": None}
    assert data["counts"]["objects"] > 0 and data["counts"]["unreferenced"]["entries"] == 0
    with Store(root) as st:
        st.session("rec")  # a writing open rewrites HEAD from the log
    clean = cli(root, "fsck", "--json")
    assert clean.exit_code == 0 and json.loads(clean.stdout)["problems"] == []


def test_cli_usage_and_no_store(tmp_path):
    r = CliRunner().invoke(main, ["--store", str(tmp_path / "nothing"), "fsck", "--bogus"])
    assert r.exit_code == 2
    r = CliRunner().invoke(main, ["--store", str(tmp_path / "nothing"), "fsck"])
    assert r.exit_code == 1 and r.stderr.startswith("agentsession: error: ") and len(r.stderr.splitlines()) == 1


def test_run_fsck_for_verify_without_an_argument(store, capsys):
    root, info = store
    assert run_fsck(False, root=str(root)) == 0
    assert "0 problem(s)" in capsys.readouterr().out
    flip(loose(root, "contents", content_of(root, info["rec"][0])), 4)
    assert run_fsck(True, root=str(root)) == 1
    data = json.loads(capsys.readouterr().out)
    assert {p["code"] for p in data["problems"]} >= {"corrupt-object", "missing-content"}


def test_cli_deep_verifies_what_the_walk_does_not_read(store):
    """The walk checks structure; --deep also reads each session as `verify ID` does, so an
    entry whose ts is not in the admitted form (a rule of the file format) is found."""
    root, info = store
    assert cli(root, "fsck", "--deep").exit_code == 0
    data = msg("bad ts", parent=info["rec"][5])
    data["ts"] = "yesterday"
    eid, content, env = put_entry(root, data)
    append_raw(root, "rec", encode_record({"op": "append", "seq": 7, "entry": eid, "head": eid}, payload=(content, env)),
               encode_record({"op": "commit"}))
    (root / "sessions" / "rec" / "HEAD").write_text(eid + "\n")
    assert cli(root, "fsck").exit_code == 0
    r = cli(root, "fsck", "--deep", "--json")
    assert r.exit_code == 1
    [p] = json.loads(r.stdout)["problems"]
    assert p["session"] == "rec" and "ts" in p["message"]


# -- beside writers in other processes ------------------------------------------------------


def _spawn(root: Path, sid: str, policy: str, every: int, seed: int, out: Path) -> subprocess.Popen:
    with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, str(WORKER), "append", str(root), sid, policy, str(every), str(seed), "1000000"],
            stdout=stdout, stderr=stderr,
        )


def _ready(proc: subprocess.Popen, out: Path) -> None:
    deadline = time.monotonic() + 60
    while b"READY" not in out.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(out.with_suffix(".err").read_text(errors="replace")[-2000:])
        time.sleep(0.01)


def test_fsck_beside_writers_in_other_processes(store, tmp_path):
    """Two processes append (one lazily with commits now and then, one durably) while
    fsck runs again and again: it must never report damage, torn last lines, lagging
    indexes and payload-only entries included. Then the writers are killed (a crash):
    what a crash leaves is not damage either."""
    root, info = store
    procs = [
        (_spawn(root, "rec", "never", 3, 1, tmp_path / "w1.out"), tmp_path / "w1.out"),
        (_spawn(root, "live", "always", 0, 2, tmp_path / "w2.out"), tmp_path / "w2.out"),
    ]
    try:
        for proc, out in procs:
            _ready(proc, out)
        runs, saw_writer = 0, False

        def acked() -> int:
            return sum(out.read_bytes().count(b"ACK A") for _, out in procs)

        # Six seconds and five runs at least, and on until a run saw a writer at work and
        # the writers acknowledged 20 appends: a slow machine runs longer, not less.
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline or runs < 5 or not (saw_writer and acked() > 20):
            if time.monotonic() > deadline + 300:
                break
            report = fsck(root)
            runs += 1
            assert report.ok, [str(p) for p in report.errors]
            if report.counts["in_log_only"] or any(p.code in ("index-lag", "log-tail") for p in report.notes):
                saw_writer = True
            for proc, out in procs:
                assert proc.poll() is None, out.with_suffix(".err").read_text(errors="replace")[-2000:]
        assert saw_writer, "no run saw a writer at work; the test proved nothing"
        assert acked() > 20
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
    report = fsck(root)
    assert report.ok, [str(p) for p in report.errors]


_HALF_WRITER = r"""
import os, sys
path, line, cut = sys.argv[1], open(sys.argv[2], "rb").read(), int(sys.argv[3])
first, rest = line[:cut], line[cut:]
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
os.write(fd, first)
os.write(1, b"HALF\n")
sys.stdin.readline()
os.write(fd, rest)
os.close(fd)
os.write(1, b"DONE\n")
"""


def test_a_line_being_written_by_another_process_is_not_damage(store, tmp_path):
    """A writer process stops in the middle of a log line (as a reader sees one being
    written): fsck reports the torn tail as a note, never as damage; once the line is
    whole, the append is there and read from its payload."""
    root, info = store
    rec = info["rec"]
    data = msg("x" * 200_000, parent=rec[5])
    eid, chash, content, env = entry_objects(data)
    line = encode_record({"op": "append", "seq": 7, "entry": eid, "head": eid}, payload=(content, env))
    line += encode_record({"op": "commit"})
    line = chained_after((root / "sessions" / "rec" / "log").read_bytes(), line)
    (tmp_path / "line").write_bytes(line)
    with subprocess.Popen(
        [sys.executable, "-c", _HALF_WRITER, str(root / "sessions" / "rec" / "log"), str(tmp_path / "line"), str(len(line) // 2)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    ) as proc:
        try:
            assert proc.stdout.readline() == b"HALF\n"
            report = fsck(root)
            assert report.ok, [str(p) for p in report.errors]
            assert [p.code for p in report.notes if p.session == "rec"] == ["log-tail"]
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == b"DONE\n"
        finally:
            proc.kill()
    report = fsck(root)
    assert report.ok, [str(p) for p in report.errors]
    assert report.counts["in_log_only"] == 1
    assert [p.code for p in report.notes] == ["index-lag"]  # HEAD: rewritten by the next writing open


def test_verify_without_an_argument_is_fsck(tmp_path):
    """`agentsession verify` with no session walks the whole store, as `fsck` does,
    with the same output and exit status."""
    from click.testing import CliRunner

    from agentsession_cas import Header
    from agentsession_cas.store import Store
    from agentsession_cli.main import main

    root = tmp_path / "store"
    with Store.init(root) as st:
        s = st.create(Header.new("v1"))
        s.append({"type": "item", "item": {"type": "message", "role": "user", "content": "hi"}})
    runner = CliRunner()
    as_verify = runner.invoke(main, ["--store", str(root), "verify"])
    as_fsck = runner.invoke(main, ["--store", str(root), "fsck"])
    assert as_verify.exit_code == as_fsck.exit_code == 0
    assert as_verify.output == as_fsck.output and "0 problem(s)" in as_verify.output
    # damage: the same exit 1 from both
    log = root / "sessions" / "v1" / "log"
    data = bytearray(log.read_bytes())
    data[30] ^= 0x01
    log.write_bytes(bytes(data))
    assert runner.invoke(main, ["--store", str(root), "verify"]).exit_code == 1
    assert runner.invoke(main, ["--store", str(root), "fsck"]).exit_code == 1


def test_a_backend_that_keeps_no_line_numbers_names_the_append_not_line_none():
    """A store that does not number its log's lines (memory, PostgreSQL) still says which
    record needs a lost object, in words: never "needed by log line None"; and the notes
    of its walk carry a code that says what they are, not "note"."""
    from agentsession_cas.maintenance.check import verify_stored
    from agentsession_cas.store.url import open_store

    with open_store("memory:fsck-no-lines", create=True) as st:
        s = st.create(Header.new("m"))
        first = s.append(msg("one")).id
        s.append(msg("two"))
        s.close()
        del st.backend.objects.data.objects[("entries", first)]
        check = verify_stored(st, "m")
        [p] = check.problems
        assert p["code"] == "missing-object" and p["entry"] == first, p
        assert "None" not in p["message"] and "needed by the log's append of it" in p["message"]
        report = fsck(st)
        assert report.notes and all(n.code != "note" for n in report.notes), report.notes


def _cut_log_at_a_record(root: Path, sid: str, keep: int) -> None:
    log = root / "sessions" / sid / "log"
    log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:keep]))


def _pack_cut_short(root: Path) -> None:
    pack, _ = the_pack(root)
    pack.write_bytes(pack.read_bytes()[: pack.stat().st_size // 2])


#: One fault each, and the session whose `verify ID` must name it as fsck does.
_FAULTS = {
    "log line flipped": ("rec", lambda root, info: flip(root / "sessions/rec/log", 300)),
    "log empty": ("rec", lambda root, info: (root / "sessions/rec/log").write_bytes(b"")),
    "log cut at a record": ("rec", lambda root, info: _cut_log_at_a_record(root, "rec", 4)),
    "head record naming no append": ("rec", lambda root, info: append_raw(
        root, "rec", encode_record({"op": "head", "head": "sha256:" + "ab" * 32, "seq": 99}))),
    "content deleted": ("rec", lambda root, info: loose(root, "contents", content_of(root, info["rec"][2])).unlink()),
    "envelope deleted": ("fork", lambda root, info: loose(root, "entries", info["rec"][1]).unlink()),
    "envelope flipped": ("rec", lambda root, info: flip(loose(root, "entries", info["rec"][2]), 20)),
    "pack cut short": ("bigsrc", lambda root, info: _pack_cut_short(root)),
    "log missing": ("rec", lambda root, info: (root / "sessions/rec/log").unlink()),
    "parent rule": ("mirror", lambda root, info: _hang(root, "mirror", 6, info["rec"][1])),
    "parents rule": ("rec", lambda root, info: _hang(root, "rec", 7, info["rec"][5], parents=[{"entry": info["rec"][5]}])),
    "base rule": ("fork", lambda root, info: _hang(root, "fork", 2, None)),
}


def _hang(root: Path, sid: str, seq: int, parent: str | None, **kw) -> None:
    """A committed append of an entry hung from ``parent`` (bypassing every rule)."""
    eid, content, env = put_entry(root, msg(f"hung from {parent}", parent=parent, **kw))
    append_raw(root, sid, encode_record({"op": "append", "seq": seq, "entry": eid}, payload=(content, env)),
               encode_record({"op": "commit"}))


@pytest.mark.parametrize("fault", sorted(_FAULTS))
def test_verify_id_names_a_fault_with_the_code_fsck_gives_it(store, fault):
    """One fault, one machine code: what `verify ID` reports of a damaged session is
    named as fsck names it (docs/fsck.md's table), so a script matches one code."""
    root, info = store
    sid, damage = _FAULTS[fault]
    damage(root, info)
    fsck_codes = {p["code"] for p in json.loads(cli(root, "fsck", "--json").stdout)["problems"]}
    r = cli(root, "verify", sid, "--json")
    assert r.exit_code == 1, r.output
    verify_codes = [p["code"] for p in json.loads(r.stdout)["problems"]]
    assert verify_codes and set(verify_codes) <= fsck_codes, (verify_codes, fsck_codes)


#: A remark each, and the session whose `verify ID` must give it as fsck does.
_REMARKS = {
    "torn tail": ("rec", lambda root, info: append_raw(
        root, "rec", encode_record({"op": "append", "seq": 99, "entry": info["rec"][0]})[:25])),
    "uncommitted append without objects": ("rec", lambda root, info: append_raw(
        root, "rec", encode_record({"op": "append", "seq": 50, "entry": "sha256:" + "7" * 64, "lazy": True}))),
    "header file stale": ("side", lambda root, info: (root / "sessions/side/header").write_text("{not json\n")),
}


@pytest.mark.parametrize("remark", sorted(_REMARKS))
def test_verify_id_gives_its_notes_coded_as_fsck_gives_them(store, remark):
    """`verify ID --json` prints its notes as objects of the shared problem shape (code,
    severity, where, line, entry, message), with the code fsck gives the same remark
    (a warning of fsck's counts: a stale header file is one); they were bare strings."""
    root, info = store
    sid, make = _REMARKS[remark]
    make(root, info)
    found = json.loads(cli(root, "fsck", "--json").stdout)
    fsck_codes = {p["code"] for p in found["notes"] + found["warnings"] if p["session"] == sid}
    r = cli(root, "verify", sid, "--json")
    assert r.exit_code == 0, r.output
    notes = json.loads(r.stdout)["notes"]
    assert notes and all(isinstance(n, dict) for n in notes), notes
    for n in notes:
        assert {"code", "severity", "where", "line", "entry", "message"} <= set(n), n
        assert n["severity"] == "note" and n["code"] in fsck_codes, (n, fsck_codes)
