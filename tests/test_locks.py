"""The file backend's lock (``backends/files/locks.py``): an exclusive flock(2) that two
lock objects in one process, or two processes, never both hold; a wait that ends in
LockTimeout; and a file that is made once and never removed."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time

import pytest

from agentsession_cas.backends.files.locks import FileLock, LockTimeout
from agentsession_cas.errors import StoreError
from storetools import refuse_to_wait


def test_two_lock_objects_in_one_process_exclude_each_other(tmp_path, monkeypatch):
    path = str(tmp_path / "a.lock")
    first, second = FileLock(path, timeout=0), FileLock(path, timeout=0)
    first.acquire()
    assert first.is_locked and not second.is_locked
    monkeypatch.setattr(time, "sleep", refuse_to_wait)  # timeout 0: tried once, never waited
    with pytest.raises(LockTimeout, match="a.lock is locked"):
        second.acquire()
    assert not second.is_locked
    first.acquire()  # (taking a lock this object holds is a no-op)
    first.release()
    assert not first.is_locked
    second.acquire()
    assert second.is_locked
    second.release()
    second.release()  # (a release of a lock not held is a no-op)
    assert os.path.isfile(path)  # made once, never removed


def test_a_wait_ends_when_the_holder_lets_go_or_at_its_timeout(tmp_path):
    path = str(tmp_path / "b.lock")
    holder = FileLock(path)
    holder.acquire()
    with pytest.raises(LockTimeout):
        FileLock(path).acquire(timeout=0.05)
    let_go = threading.Timer(0.05, holder.release)
    let_go.start()
    waiter = FileLock(path, timeout=60)
    waiter.acquire()  # waits for the release (bounded by the timer, not by a clock in the test)
    let_go.join()
    assert waiter.is_locked and not holder.is_locked
    waiter.release()


def test_a_lock_another_process_holds_by_flock_is_respected_and_ours_by_it(tmp_path, monkeypatch):
    """Any flock(2) holder counts (an earlier release took these locks through filelock,
    which is flock too), and another process's flock sees ours."""
    path = str(tmp_path / "c.lock")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, os, fcntl; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
         "print('READY', flush=True); sys.stdin.readline()", path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "READY"
        with monkeypatch.context() as m:
            m.setattr(time, "sleep", refuse_to_wait)
            with pytest.raises(LockTimeout):
                FileLock(path, timeout=0).acquire()
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
    with FileLock(path, timeout=0) as ours:
        assert ours.is_locked
        probe = subprocess.run(
            [sys.executable, "-c",
             "import sys, os, fcntl\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    print('HELD')\n", path],
            capture_output=True, text=True, timeout=30,
        )
        assert probe.stdout.strip() == "HELD", probe


def test_a_dropped_lock_object_lets_the_lock_go(tmp_path):
    path = str(tmp_path / "d.lock")
    lock = FileLock(path)
    lock.acquire()
    del lock  # as a process that dies: nothing stays held
    with FileLock(path, timeout=0):
        pass


def test_a_lock_file_that_cannot_be_opened_raises_the_os_error_unwrapped(tmp_path):
    """The command names an OSError by its errno (read_only, no_space, permission): the
    lock hands it on as it came, naming the file."""
    with pytest.raises(FileNotFoundError) as missing:
        FileLock(str(tmp_path / "missing" / "e.lock")).acquire()
    assert missing.value.filename == str(tmp_path / "missing" / "e.lock")
    target = tmp_path / "target"
    target.write_bytes(b"")
    os.symlink(target, tmp_path / "link.lock")
    with pytest.raises(OSError) as link:  # (O_NOFOLLOW: a link is not followed)
        FileLock(str(tmp_path / "link.lock")).acquire()
    assert link.value.errno == errno.ELOOP


def _read_only_device(real_open):  # type: ignore[no-untyped-def]
    """os.open as on a read-only mount: any open for writing is EROFS."""
    def fake(path, flags, *args):  # type: ignore[no-untyped-def]
        if flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real_open(path, flags, *args)
    return fake


def test_on_a_read_only_device_an_existing_lock_file_is_locked_through_a_read_only_descriptor(tmp_path, monkeypatch):
    """As filelock did: a reader of a store on a read-only mount still takes the lock
    (flock takes a read-only descriptor), and still excludes another holder."""
    path = str(tmp_path / "f.lock")
    with FileLock(path):
        pass  # made while writable
    monkeypatch.setattr(os, "open", _read_only_device(os.open))
    first = FileLock(path, timeout=0)
    first.acquire()
    assert first.is_locked
    monkeypatch.setattr(time, "sleep", refuse_to_wait)
    with pytest.raises(LockTimeout):
        FileLock(path, timeout=0).acquire()
    first.release()
    with pytest.raises(OSError) as erofs:  # a lock file that is missing cannot be made: EROFS, as it came
        FileLock(str(tmp_path / "g.lock")).acquire()
    assert erofs.value.errno == errno.EROFS


def test_a_filesystem_without_flock_is_a_store_error_naming_the_lock_file(tmp_path, monkeypatch):
    import fcntl

    def no_flock(fd, op):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    path = str(tmp_path / "h.lock")
    with pytest.raises(StoreError, match="cannot lock .*h.lock: No locks available"):
        FileLock(path).acquire()
