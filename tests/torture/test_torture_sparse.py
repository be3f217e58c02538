"""A session log with holes (issue 16): a sparse file whose size says gigabytes but
whose bytes were never written. Its holes read as zeros; a log reader that read them
would hold gigabytes. ``fsutil.read_dense`` reads what was written and one NUL for each
hole of a megabyte or more; no record holds a NUL, so the log's reader finds the hole
where it starts, as the damage or the torn tail it is.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, make_entry
from agentsession_cas.errors import SessionDamagedError
from agentsession_cas.fsutil import HOLE_LIMIT, NotAFileError, read_dense
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.maintenance.repair import repair_session
from agentsession_cas.store import Store
from agentsession_cli.main import main

SID = "holes"
GIB = 1 << 30


def item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def build(root: Path, n: int = 4) -> list[str]:
    with Store.init(root) as st:
        s = st.create(Header.new(SID))
        return [s.append(make_entry("item", s.head, item=item(f"entry {i}")).data).id for i in range(n)]


def log_of(root: Path) -> Path:
    return root / "sessions" / SID / "log"


def cli(root: Path, *args: str):
    return CliRunner().invoke(main, ["--store", str(root), *args])


def peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_read_dense_reads_what_was_written_and_one_nul_per_hole(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"written\n")
    with open(p, "r+b") as f:
        f.truncate(4 * GIB)
    before = peak_kib()
    data = read_dense(str(p))
    assert data.startswith(b"written\n") and data.endswith(b"\0")
    assert len(data) < 2 * HOLE_LIMIT  # the written block (zero-filled to its end) and one NUL
    with open(p, "r+b") as f:
        f.seek(2 * GIB)
        f.write(b"after the hole\n")
    data = read_dense(str(p))
    assert data.startswith(b"written\n") and b"\0after the hole\n" in data.rstrip(b"\0") + b"\n"
    assert peak_kib() - before < 64 * 1024  # KiB: nothing near a gigabyte was held
    # A dense file is read whole, zeros and all; a small hole reads as its zeros.
    q = tmp_path / "dense"
    q.write_bytes(b"a" * 10_000 + bytes(5000) + b"b\n")
    assert read_dense(str(q)) == q.read_bytes()
    r = tmp_path / "small-hole"
    with open(r, "wb") as f:
        f.write(b"x")
        f.seek(HOLE_LIMIT // 4)
        f.write(b"y")
    assert read_dense(str(r)) == r.read_bytes()


def test_read_dense_refuses_what_is_no_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    os.symlink("/dev/zero", tmp_path / "zero")
    (tmp_path / "target").write_bytes(b"x\n")
    os.symlink(tmp_path / "target", tmp_path / "link")
    for name in ("fifo", "zero", "link"):
        with pytest.raises(NotAFileError):
            read_dense(str(tmp_path / name))
    with pytest.raises(IsADirectoryError):
        read_dense(str(tmp_path))


def test_a_log_with_a_hole_to_its_end_is_a_torn_tail(tmp_path):
    """The committed records are served as they are; the next writing open drops the
    tail (the hole goes with it) and writing goes on; fsck names the tail, then is clean."""
    root = tmp_path / "s"
    ids = build(root)
    expected = cli(root, "export", SID).stdout_bytes
    size = log_of(root).stat().st_size
    with open(log_of(root), "r+b") as f:
        f.truncate(8 * GIB)
    before = peak_kib()
    r = cli(root, "export", SID)
    assert r.exit_code == 0 and r.stdout_bytes == expected
    report = fsck(Store(root))
    assert report.ok and any("tail after the last commit" in p.message for p in report.problems), report.as_dict()
    with Store(root) as st:
        s = st.open(SID)
        assert s.head == ids[-1]
        s.append(make_entry("item", s.head, item=item("after the hole")).data)
    assert log_of(root).stat().st_size < size + 4096  # rewritten without the hole
    assert peak_kib() - before < 256 * 1024
    assert fsck(Store(root)).ok


def test_a_hole_inside_the_log_is_damage_that_repair_mends(tmp_path):
    """Records after a hole come after bytes no writer wrote: the session is damaged
    (reads say where), and repair keeps every entry HEAD proves."""
    root = tmp_path / "s"
    ids = build(root)
    lines = log_of(root).read_bytes().splitlines(keepends=True)
    with open(log_of(root), "wb") as f:  # the create record, a gigabyte never written, the rest
        f.write(lines[0])
        f.seek(GIB)
        f.write(b"\n" + b"".join(lines[1:]))
    with pytest.raises(SessionDamagedError) as exc:
        Store(root).open(SID)
    assert "log line" in str(exc.value)
    r = cli(root, "export", SID)
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert not fsck(Store(root)).ok
    with Store(root) as st:
        report = repair_session(st, SID, confirm=lambda rep: True)
    assert report.head == ids[-1]
    with Store(root) as st:
        assert [e.id for e in st.open(SID)][-len(ids):] == ids
    assert fsck(Store(root)).ok
    assert not any(os.path.getsize(p) > GIB // 2 and p.endswith("log") for p in map(str, root.rglob("log")))


@pytest.mark.parametrize("how", ["fifo", "link"])
def test_sweep_refuses_while_a_log_cannot_be_read(tmp_path, how):
    """A session whose log is no regular file is not a session without a log: its
    objects may be named by records nobody can read, so nothing is swept."""
    root = tmp_path / "s"
    build(root)
    log = log_of(root)
    saved = tmp_path / "log.saved"
    os.rename(log, saved)
    if how == "fifo":
        os.mkfifo(log)
    else:
        os.symlink(saved, log)
    r = cli(root, "sweep", "--grace", "0")
    assert r.exit_code != 0 and f"sessions/{SID}" in r.output and "repair" in r.output, r.output
    log.unlink()
    os.rename(saved, log)
    report = fsck(Store(root))
    assert report.ok, report.as_dict()
    assert cli(root, "export", SID).exit_code == 0


def test_a_loose_entry_with_a_hole_is_corrupt_without_being_read(tmp_path, monkeypatch):
    """An entry or a content is canonical JSON, never a run of NULs: a loose one with a
    hole is refused by reads and by fsck from its extents, never hashed through."""
    import agentsession_cas.backends.files.fsck as fsck_module
    import agentsession_cas.backends.files.objects as objects_module

    root = tmp_path / "s"
    with Store.init(root) as st:  # loose objects: never packed
        s = st.create(Header.new(SID))
        eid = s.append(make_entry("item", None, item=item("loose")).data).id
    path = root / "objects" / "entries" / eid.removeprefix("sha256:")[:2] / eid.removeprefix("sha256:")[2:]
    assert path.exists()
    with open(path, "r+b") as f:
        f.truncate(GIB)
    hashed: list[str] = []

    def no_hash(p):
        hashed.append(p)
        raise AssertionError(f"hashed {p}")

    monkeypatch.setattr(objects_module, "hash_file", no_hash)
    monkeypatch.setattr(fsck_module, "hash_file", no_hash)
    r = cli(root, "cat-object", eid)
    assert r.exit_code != 0 and "corrupt" in r.output and "Traceback" not in r.output, r.output
    report = fsck(Store(root))
    assert any(p.code == "corrupt-object" and "hole" in p.message for p in report.errors), report.as_dict()
    assert not hashed
