"""Strange files where the store expects its own (issue 16): a FIFO, a symbolic link to
/dev/zero or out of the store, a directory, a sparse file of gigabytes.

Every command of a set (reads, fsck, and the writers: append, repair, pack, sweep,
delete) is played against a copy of the store holding one such file. Each must end
quickly (an alarm turns a hang into a failure), without a traceback, either giving the
pristine store's bytes or failing with an error; memory stays bounded; and nothing
outside the store is written, removed or followed for writing.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
from pathlib import Path

import pytest
from damage import files_of, invoke, is_traceback, reads

STRANGE = ("fifo", "devzero", "outside", "directory", "sparse")
#: The kinds of file to replace (the lock is skipped: a lock file is opened, never read).
KINDS = ("loose object", "pack", "pack index", "layout", "ref", "log (committed)", "HEAD", "mark", "header", "summary")
#: An index rebuilt from the log when it does not read: fsck may pass it (harmless).
HARMLESS = {"summary"}
#: Cases not played yet (none: a sparse log is read without its holes, fsutil.read_dense).
KNOWN_GAPS: set[tuple[str, str]] = set()
#: A log's committed records followed by a gigabyte never written reads as a crash leaves
#: it (on XFS, a size past what reached the disk reads as zeros): a torn tail that no
#: reader serves, that fsck names without failing, and that the next writing open drops.
TORN_TAIL = {("log (committed)", "sparse")}
#: A command has this long; the slowest here takes well under a second on a store this small.
ALARM = 20


class Hung(BaseException):
    """Not an Exception: a handler catching those must not swallow the alarm."""


def _alarm(signum, frame):
    raise Hung()


def make_strange(path: Path, how: str, outside: Path) -> None:
    data = path.read_bytes()
    if how == "sparse" and path.parent.parent.name in ("entries", "contents", "blobs"):
        data = b""  # a loose object of gigabytes, none of its bytes written
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "devzero":
        os.symlink("/dev/zero", path)
    elif how == "outside":
        target = outside / ("victim-" + path.name)
        target.write_bytes(b"outside bytes, not the store's\n")
        os.symlink(target, path)
    elif how == "directory":
        path.mkdir()
        (path / "inner").write_bytes(data)
    elif how == "sparse":
        with open(path, "wb") as f:
            f.write(data)
            f.truncate(1 << 30)  # 1 GiB, of which a few bytes are written


def snapshot(outside: Path) -> dict[str, tuple[int, int, bytes]]:
    out = {}
    for p in sorted(outside.rglob("*")):
        st = p.lstat()
        out[str(p)] = (st.st_mtime_ns, st.st_size, p.read_bytes() if p.is_file() else b"")
    return out


def writes(info: dict) -> list[tuple[str, ...]]:
    return [
        ("repair", "--yes", "rec"),
        ("repair", "--yes", "mirror"),
        ("pack",),
        ("sweep", "--grace", "0"),
        ("delete", "fork"),
    ]


def play_one(root: Path, info: dict, kind: str, how: str, outside: Path, base: dict) -> list[str]:
    target = root / files_of(root, info)[kind].relative_to(root)
    make_strange(target, how, outside)
    before = snapshot(outside)
    failures = []
    old = signal.signal(signal.SIGALRM, _alarm)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        for i, cmd in enumerate([("fsck",), *reads(info), *writes(info), ("fsck",)]):
            signal.setitimer(signal.ITIMER_REAL, ALARM, 1.0)  # and again each second, should one be swallowed
            try:
                r = invoke(root, *cmd)
            except Hung:
                failures.append(f"{kind}/{how}: {' '.join(cmd)} hung")
                continue
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if isinstance(r.exception, Hung):
                failures.append(f"{kind}/{how}: {' '.join(cmd)} hung")
                continue
            if is_traceback(r):
                failures.append(f"{kind}/{how}: {' '.join(cmd)} traceback: {r.exception!r} {r.output[-300:]}")
            elif cmd in base and r.exit_code == 0 and r.stdout_bytes != base[cmd].stdout_bytes:
                failures.append(f"{kind}/{how}: {' '.join(cmd)} served other bytes")
            elif i == 0 and (kind, how) in TORN_TAIL:
                if "tail after the last commit" not in r.output:
                    failures.append(f"{kind}/{how}: fsck does not name the torn tail: {r.output[-300:]}")
            elif i == 0 and r.exit_code == 0 and how != "directory" and kind not in HARMLESS:  # the first fsck
                failures.append(f"{kind}/{how}: fsck exit 0: {r.output[-300:]}")
            if r.exit_code != 0 and not (r.output.strip() and "agentsession:" in r.output or "error" in r.output):
                failures.append(f"{kind}/{how}: {' '.join(cmd)} failed without saying why: {r.output[-200:]!r}")
    finally:
        signal.signal(signal.SIGALRM, old)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    if grown > 512 * 1024:  # KiB: a 1 GiB file read whole would show here
        failures.append(f"{kind}/{how}: memory grew by {grown // 1024} MiB")
    if snapshot(outside) != before:
        failures.append(f"{kind}/{how}: something outside the store changed")
    if how == "outside" and os.path.islink(target) and not os.readlink(target).startswith(str(outside)):
        failures.append(f"{kind}/{how}: the link was rewritten to point elsewhere")
    return failures


@pytest.fixture(scope="module")
def baseline(rich_store):
    root, info = rich_store
    return {cmd: invoke(root, *cmd) for cmd in reads(info)}


@pytest.mark.parametrize("how", STRANGE)
def test_strange_files_where_the_store_expects_its_own(rich_store, baseline, tmp_path, how):
    pristine, info = rich_store
    failures = []
    for kind in KINDS:
        if (kind, how) in KNOWN_GAPS:
            continue
        root = tmp_path / f"store-{kind.replace(' ', '_')}"
        shutil.copytree(pristine, root, symlinks=True)
        outside = tmp_path / f"outside-{kind.replace(' ', '_')}"
        outside.mkdir()
        (outside / "old-file").write_bytes(b"an outside file, older than any grace\n")
        os.utime(outside / "old-file", (1, 1))
        failures += play_one(root, info, kind, how, outside, baseline)
        shutil.rmtree(root, ignore_errors=True)
    assert not failures, "\n".join(failures)
