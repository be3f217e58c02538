"""A full disk (issue 16): a store on a small tmpfs the test mounts (as root; skipped
with the reason where it cannot), filled to the last byte. Import, pack and sweep fail
with the no_space code and a message saying so; the store reads as before and fsck is
clean once space returns; writing resumes without repair."""

from __future__ import annotations

import json
import os
from pathlib import Path

from damage import invoke

TS = "2026-10-05T12:00:0{}Z"


def item(i: int) -> bytes:
    return json.dumps({"type": "item", "ts": TS.format(i), "item": {"type": "message", "role": "user", "content": f"turn {i}"}}).encode()


def fill(mnt: Path) -> Path:
    """Take every free byte of the device (written through, so nothing waits in a buffer)."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        block = b"\0" * 4096
        while True:
            try:
                if os.write(fd, block) == 0:
                    break
            except OSError:
                break
    finally:
        os.close(fd)
    return filler


def _append(root: Path, sid: str, data: bytes):
    from click.testing import CliRunner

    from agentsession_cli.main import main

    return CliRunner().invoke(main, ["--store", str(root), "append", sid], input=data)


def three_turns(root: Path, sid: str) -> bytes:
    """A new store at ``root`` holding session ``sid`` of three turns; its export."""
    assert invoke(root, "init").exit_code == 0
    assert invoke(root, "create", "--id", sid).exit_code == 0
    for i in range(3):
        assert _append(root, sid, item(i)).exit_code == 0
    return invoke(root, "export", sid).stdout_bytes


def test_maintenance_and_import_on_a_full_disk_fail_clearly_and_lose_nothing(small_disk, tmp_path):
    root = small_disk / "store"
    before = three_turns(root, "s1")
    session = tmp_path / "in.jsonl"
    session.write_bytes(before.replace(b'"id":"s1"', b'"id":"imp"', 1))
    filler = fill(small_disk)
    for cmd in (("import", str(session)), ("pack",), ("sweep", "--grace", "0", "--force")):
        r = invoke(root, *cmd)
        assert r.exit_code == 1, (cmd, r.output)
        assert "no space left on the device" in r.output, (cmd, r.output)
        assert "Traceback" not in r.output and "internal error" not in r.output
        j = invoke(root, *cmd[:1], "--json", *cmd[1:])
        assert '"no_space"' in j.output, (cmd, j.output)
        assert invoke(root, "export", "s1").stdout_bytes == before  # still reads, the same
    filler.unlink()
    fs = invoke(root, "fsck")
    assert fs.exit_code == 0, fs.output
    assert invoke(root, "export", "s1").stdout_bytes == before
    # writing resumes, without repair
    assert _append(root, "s1", item(5)).exit_code == 0
    assert invoke(root, "import", str(session)).exit_code == 0
    assert invoke(root, "pack").exit_code == 0
    assert invoke(root, "fsck").exit_code == 0


def test_an_append_that_fails_on_a_full_disk_has_not_committed(small_disk):
    """Either the append fails and nothing is committed, or it is committed and succeeds:
    a checkpoint the full disk refuses at close leaves the objects in the log (payloads)."""
    root = small_disk / "store"
    assert invoke(root, "init").exit_code == 0
    assert invoke(root, "create", "--id", "s1").exit_code == 0
    assert _append(root, "s1", item(0)).exit_code == 0
    before = invoke(root, "export", "s1").stdout_bytes
    filler = fill(small_disk)
    r = _append(root, "s1", item(1))
    filler.unlink()
    after = invoke(root, "export", "s1").stdout_bytes
    if r.exit_code != 0:
        assert "no space" in r.output
        assert after == before, "the append failed but its entry was committed"
    else:
        assert len(after.splitlines()) == len(before.splitlines()) + 1


def test_a_push_into_a_full_store_fails_clearly_and_loses_nothing(small_disk, tmp_path):
    """The receiving store is on the full device, the sender elsewhere: the push fails
    with no_space, the receiver reads as before and fsck is clean once space returns,
    and the same push then completes without repair."""
    remote = small_disk / "store"
    before = three_turns(remote, "there")
    source = tmp_path / "source"
    assert invoke(source, "init").exit_code == 0
    assert invoke(source, "create", "--id", "s1").exit_code == 0
    for i in range(6):
        big = json.dumps({"type": "item", "ts": TS.format(i), "item": {"type": "message", "role": "user",
                                                                      "content": f"turn {i} " + os.urandom(20000).hex()}})
        assert _append(source, "s1", big.encode()).exit_code == 0
    filler = fill(small_disk)
    r = invoke(source, "push", "s1", str(remote))
    assert r.exit_code == 1, r.output
    assert "no space left on the device" in r.output, r.output
    assert "Traceback" not in r.output and "internal error" not in r.output
    j = invoke(source, "push", "--json", "s1", str(remote))
    assert j.exit_code == 1 and '"no_space"' in j.output, j.output
    assert invoke(remote, "export", "there").stdout_bytes == before  # still reads, the same
    filler.unlink()
    fs = invoke(remote, "fsck")
    assert fs.exit_code == 0, fs.output
    assert invoke(remote, "export", "there").stdout_bytes == before
    # the push completes now, without repair, and the receiver holds it whole
    r = invoke(source, "push", "s1", str(remote))
    assert r.exit_code == 0, r.output
    assert invoke(remote, "export", "s1").stdout_bytes == invoke(source, "export", "s1").stdout_bytes
    assert _append(remote, "there", item(7)).exit_code == 0
    assert invoke(remote, "fsck").exit_code == 0
