"""A store made read-only under a running command (issue 16).

The store lives on a small tmpfs the test mounts (as root; skipped with the reason
elsewhere). The command runs under kill_at.py with TORTURE_REMOUNT_RO: at a writing
step drawn at random the filesystem is remounted read-only (the kernel allows it only
while no file on it is open for writing, so it takes at that step or a later one), and
the command runs on into it. (Not sweep: it holds its lock file open for writing from
start to end, so the kernel never lets the filesystem go read-only under it.) It must fail in one clear line (no traceback, the store's
words for a read-only device), the store must read as before while read-only, and once
writable again fsck is clean and writing resumes without repair: the same command run
again succeeds."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from damage import invoke

KILL_AT = Path(__file__).with_name("kill_at.py")
POINTS = 4  # writing steps drawn per command besides the first (fixed seed)


def item(i: int, text: str = "") -> bytes:
    return json.dumps({"type": "item", "ts": f"2026-10-05T12:00:{i:02d}Z",
                       "item": {"type": "message", "role": "user", "content": f"turn {i} {text}"}}).encode()


def append(root: Path, sid: str, data: bytes):  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from agentsession_cli.main import main

    return CliRunner().invoke(main, ["--store", str(root), "append", sid], input=data)


def remount(mnt: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True, capture_output=True)


def build(root: Path, tmp: Path) -> dict[str, list[str]]:
    """A store with two sessions, one packed; a session file to import; a store to push from."""
    assert invoke(root, "init").exit_code == 0
    for sid in ("s1", "s2"):
        assert invoke(root, "create", "--id", sid).exit_code == 0
        for i in range(4):
            assert append(root, sid, item(i)).exit_code == 0
    assert invoke(root, "pack").exit_code == 0
    assert append(root, "s1", item(5)).exit_code == 0  # and a loose one
    src = tmp / "src"
    assert invoke(src, "init").exit_code == 0
    assert invoke(src, "create", "--id", "pushed").exit_code == 0
    for i in range(12):
        assert append(src, "pushed", item(i, "x" * 2000)).exit_code == 0
    (tmp / "imp.jsonl").write_bytes(invoke(src, "export", "pushed").stdout_bytes.replace(b'"id":"pushed"', b'"id":"imp"', 1))
    return {
        "append": ["--store", str(root), "append", "s1"],
        "import": ["--store", str(root), "import", str(tmp / "imp.jsonl")],
        "pack": ["--store", str(root), "pack"],
        "push into": ["--store", str(src), "push", "pushed", str(root)],
        "sweep": ["--store", str(root), "sweep", "--grace", "0", "--force"],
    }


def outcome(command: str, root: Path, want: dict[str, bytes], done: bool, tmp: Path) -> list[str]:
    """What differs from "the command's work is whole when it succeeded, absent when it
    failed" (a push may leave part of the session, as RFC 0002 orders its steps)."""
    bad = []
    for sid, data in want.items():
        got = invoke(root, "export", sid).stdout_bytes
        if command == "append" and sid == "s1":
            lines = got.splitlines()
            if got != data and not (done and lines[:-1] == data.splitlines() and b"turn 30" in lines[-1]):
                bad.append(f"s1 holds {len(lines)} line(s): the append is {'not whole' if done else 'there though it failed'}")
        elif got != data:
            bad.append(f"{sid} reads otherwise")
    if command == "import":
        got = invoke(root, "export", "imp")
        if done and got.stdout_bytes != (tmp / "imp.jsonl").read_bytes():
            bad.append("the import succeeded, the session is not whole")
        if not done and got.exit_code == 0:
            bad.append("the import failed, the session is there")
    if command == "push into" and done:
        if invoke(root, "export", "pushed").stdout_bytes != invoke(tmp / "src", "export", "pushed").stdout_bytes:
            bad.append("the push succeeded, the session is not whole")
    return bad


def run(args: list[str], at: int, count: Path, mnt: Path | None, stdin: bytes | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if mnt is not None:
        env["TORTURE_REMOUNT_RO"] = str(mnt)
    return subprocess.run([sys.executable, str(KILL_AT), str(at), str(count), *args], input=stdin,
                          capture_output=True, env=env, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["append", "import", "pack", "push into"])
def test_a_store_made_read_only_under_a_running_command(small_disk, tmp_path, command):
    mnt = small_disk
    pristine = tmp_path / "pristine"  # built off the tmpfs, copied onto it for each run
    commands = build(pristine, tmp_path)
    sessions = ("s1", "s2")
    want = {sid: invoke(pristine, "export", sid).stdout_bytes for sid in sessions}
    stdin = item(30) if command == "append" else None
    root = mnt / "store"

    def fresh() -> list[str]:
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(pristine, root, symlinks=True)
        return [a.replace(str(pristine), str(root)) for a in commands[command]]

    count = tmp_path / "count"
    probe = run(fresh(), 0, count, None, stdin)
    assert probe.returncode == 0, probe.stderr.decode()[-500:]
    total = int(count.read_text())
    # the first writing step (read-only before the command writes anything), then steps at random
    points = sorted({1, *random.Random(f"ro-{command}").sample(range(2, total + 1), min(POINTS, total - 1))})
    failures: list[str] = []
    took = refused = 0
    for at in points:
        args = fresh()
        r = run(args, at, count, mnt, stdin)
        made_ro = int(count.read_text() or 0)
        out = (r.stdout + r.stderr).decode(errors="replace")
        where = f"step {at} (read-only from {made_ro or 'never'}, exit {r.returncode})"
        try:
            took += made_ro > 0
            refused += r.returncode != 0
            if r.returncode != 0 and ("read-only" not in out or "Traceback" in out or "internal error" in out
                                      or len(r.stderr.decode().strip().splitlines()) != 1):
                failures.append(f"{where}: not one clear line: {out[-400:]}")
            if r.returncode != 0 and not made_ro:
                failures.append(f"{where}: failed on a writable store: {out[-300:]}")
            # the store reads, still read-only: what the command did is whole or absent
            failures += [f"{where}: {w}" for w in outcome(command, root, want, r.returncode == 0, tmp_path)]
        finally:
            remount(mnt, "rw")
        fs = invoke(root, "fsck")
        if fs.exit_code != 0:
            failures.append(f"{where}: fsck once writable: {fs.output[-400:]}")
        if r.returncode != 0:  # writing resumes without repair: the command run again succeeds
            again = subprocess.run([sys.executable, "-m", "agentsession_cas", *args], input=stdin, capture_output=True, timeout=120)
            if again.returncode != 0:
                failures.append(f"{where}: the command run again: {again.stderr.decode()[-300:]}")
            failures += [f"{where}, run again: {w}" for w in outcome(command, root, want, True, tmp_path)]
        if append(root, "s2", item(40)).exit_code != 0:
            failures.append(f"{where}: writing does not resume")
        fs = invoke(root, "fsck")
        if fs.exit_code != 0:
            failures.append(f"{where}: fsck after writing resumed: {fs.output[-400:]}")
    print(f"{command}: {total} writing steps, read-only under {took} of {len(points)} runs drawn, {refused} refused "
          f"in one line, {took - refused} done whole first, {len(failures)} failure(s)")
    assert took >= 1, "the filesystem never became read-only under the command: the test proved nothing"
    assert not failures, "\n".join(failures)


def test_every_command_on_a_read_only_store_says_so(small_disk, tmp_path):
    """The plain case: a store on a read-only mount. Reads work; each write is one line
    naming the read-only device, with the code read_only under --json."""
    root = small_disk / "store"
    commands = build(root, tmp_path)
    want = invoke(root, "export", "s1").stdout_bytes
    remount(small_disk, "ro")
    try:
        assert invoke(root, "export", "s1").stdout_bytes == want
        assert invoke(root, "fsck").exit_code == 0
        for name, args in commands.items():
            stdin = item(30) if name == "append" else None
            r = subprocess.run([sys.executable, "-m", "agentsession_cas", *args], input=stdin, capture_output=True, timeout=120)
            err = r.stderr.decode()
            assert r.returncode == 1, (name, err)
            assert "read-only" in err and "Traceback" not in err, (name, err)
            j = subprocess.run([sys.executable, "-m", "agentsession_cas", *args[:3], "--json", *args[3:]], input=stdin,
                               capture_output=True, timeout=120)
            assert json.loads(j.stderr.decode().strip().splitlines()[-1])["error"]["code"] == "read_only", (name, j.stderr)
    finally:
        remount(small_disk, "rw")
    assert invoke(root, "fsck").exit_code == 0
    assert append(root, "s1", item(31)).exit_code == 0


# -- what the read-only runs found, each path forced (no mount needed) -----------------------


def _erofs(*a, **kw):  # type: ignore[no-untyped-def]
    raise OSError(30, "Read-only file system", "forced")


def test_an_append_committed_before_the_device_refused_its_indexes_succeeds(tmp_path, monkeypatch):
    """HEAD and mark are written after the log's commit: a device refusing them failed
    the committed append (exit 1; a retry records it twice). Now the index lags the
    log until the next writing open, and the append succeeds."""
    from agentsession_cas.backends.files import sessions as files_sessions

    root = tmp_path / "store"
    assert invoke(root, "init").exit_code == 0
    assert invoke(root, "create", "--id", "s1").exit_code == 0
    assert append(root, "s1", item(1)).exit_code == 0
    before = (root / "sessions" / "s1" / "HEAD").read_bytes()
    from agentsession_cas import make_entry
    from agentsession_cas.store import Store

    with monkeypatch.context() as m, Store(root) as store:
        m.setattr(files_sessions, "write_atomic", _erofs)
        s = store.open("s1")
        s.append(make_entry("item", s.head, item={"type": "message", "role": "user", "content": "two"}).data)
        s.commit()  # committed in the log; HEAD refused: raised OSError before
        moved = s.head
        s.set_head(moved, expected=moved)  # a head step commits, then writes HEAD: the same
        s.close()
    assert (root / "sessions" / "s1" / "HEAD").read_bytes() == before  # lagging, as after a crash
    fs = invoke(root, "fsck")  # says so, as after a crash, and nothing else
    assert fs.exit_code == 1 and "stale-head" in fs.output and "1 problem(s)" in fs.output, fs.output
    assert len(invoke(root, "export", "s1").stdout_bytes.splitlines()) == 3  # the log is the record
    assert append(root, "s1", item(3)).exit_code == 0  # the next writer sets it from the log, no repair
    assert invoke(root, "fsck").exit_code == 0
    assert (root / "sessions" / "s1" / "HEAD").read_text().strip() == invoke(root, "head", "s1").stdout.split()[0]


def test_a_writing_close_whose_packing_the_device_refuses_fails_nothing(tmp_path, monkeypatch):
    """A writing close packs loose objects once there are many and merges small packs:
    a device refusing that failed the append before it (exit 1 though committed)."""
    from agentsession_cas.backends.files.objects import FileObjects

    root = tmp_path / "store"
    assert invoke(root, "init").exit_code == 0
    assert invoke(root, "create", "--id", "s1").exit_code == 0
    with monkeypatch.context() as m:
        m.setattr(FileObjects, "merge_small_packs", _erofs)
        r = append(root, "s1", item(1))
    assert r.exit_code == 0, r.output
    assert invoke(root, "fsck").exit_code == 0
    assert len(invoke(root, "export", "s1").stdout_bytes.splitlines()) == 2
