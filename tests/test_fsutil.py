"""Reading the small files a store keeps (fsutil.read_small, read_prefix): whole, within
the limit, and without a buffer of the limit's size."""

from __future__ import annotations

import errno
import os
import threading
import tracemalloc

import pytest

from agentsession_cas import fsutil
from agentsession_cas.fsutil import NotAFileError, read_prefix, read_small


def test_a_small_file_is_read_whole_and_a_big_one_refused(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"abc\n")
    assert read_small(str(p), 16) == b"abc\n" and read_small(str(p), 4) == b"abc\n"
    with pytest.raises(NotAFileError):
        read_small(str(p), 3)
    assert read_prefix(str(p), 2) == b"ab" and read_prefix(str(p), 100) == b"abc\n"
    (tmp_path / "e").write_bytes(b"")
    assert read_small(str(tmp_path / "e"), 10) == b""


def test_no_buffer_of_the_limit_is_allocated(tmp_path):
    """A 16 MB limit once allocated 16 MB for each read of a 40-byte file."""
    p = tmp_path / "f"
    p.write_bytes(b"x" * 40)
    tracemalloc.start()
    try:
        assert read_small(str(p), 16 << 20) == b"x" * 40
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("limit", [10, 1000])
def test_a_file_grown_since_it_was_looked_at_is_read_on_to_the_limit(tmp_path, monkeypatch, limit):
    p = tmp_path / "f"
    p.write_bytes(b"y" * 100)
    real = os.fstat

    def smaller(fd):  # as if the file had 5 bytes when it was looked at
        st = real(fd)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, 5,
                               st.st_atime, st.st_mtime, st.st_ctime))

    monkeypatch.setattr(fsutil.os, "fstat", smaller)
    assert read_prefix(str(p), limit) == b"y" * min(limit, 100)


@pytest.mark.parametrize("pooled", [False, True])
def test_parallel_fsyncs_reach_every_path_and_raise_the_first_error(monkeypatch, pooled):
    """A process's first rounds run on threads of their own (no concurrent.futures at
    start-up), later ones on the pool: either way every path is fsynced, and a failure on
    any thread is the caller's error, raised after every thread is done."""
    monkeypatch.setattr(fsutil, "_ROUNDS", fsutil._ROUNDS_BEFORE_POOL if pooled else 0)
    done: list[str] = []
    lock = threading.Lock()

    def fsync(path: str) -> None:
        with lock:
            done.append(path)
        if path == "c":
            raise OSError(errno.EIO, "Input/output error", path)

    fsutil._each(fsync, ["a", "b"])
    assert sorted(done) == ["a", "b"]
    done.clear()
    with pytest.raises(OSError) as failed:
        fsutil._each(fsync, ["a", "b", "c", "d"])
    assert failed.value.errno == errno.EIO and failed.value.filename == "c"
    assert sorted(done) == ["a", "b", "c", "d"]
    if pooled:
        assert fsutil._POOL is not None
