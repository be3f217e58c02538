"""Loose objects: three spaces, fan-out paths, verified reads, idempotent puts that mend torn files."""

from __future__ import annotations

import hashlib
import os

import pytest

from agentsession_cas.backends.files.objects import SPACES, FileObjects, fsync_paths
from agentsession_cas.errors import AgentSessionError, CorruptObjectError, NoSuchObjectError


def name_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def objs(tmp_path) -> FileObjects:
    return FileObjects(str(tmp_path))


def test_spaces():
    assert SPACES == ("entries", "contents", "blobs")


def test_path_layout(objs, tmp_path):
    n = name_of(b"x")
    hexd = n[7:]
    for space in SPACES:
        assert objs.path(space, n) == os.path.join(str(tmp_path), "objects", space, hexd[:2], hexd[2:])
        assert objs.relpath(space, n) == os.path.join("objects", space, hexd[:2], hexd[2:])
    assert len(hexd[2:]) == 62


@pytest.mark.parametrize("bad", ["sha256:../../etc/passwd", "sha256:" + "A" * 64, "md5:" + "0" * 64, "", "sha256:" + "0" * 63])
def test_bad_names_refused_before_a_path(objs, bad):
    with pytest.raises(AgentSessionError):
        objs.path("entries", bad)
    with pytest.raises(AgentSessionError):
        objs.put("entries", bad, b"x", durable=False)


def test_unknown_space_refused(objs):
    with pytest.raises(AgentSessionError):
        objs.path("trees", name_of(b"x"))


def test_put_get_round_trip_and_spaces_apart(objs):
    data = b'{"a":1}'
    n = name_of(data)
    assert objs.put("contents", n, data, durable=True) is None
    assert objs.get("contents", n) == data
    assert objs.exists("contents", n) and not objs.exists("entries", n)
    with pytest.raises(NoSuchObjectError) as ei:
        objs.get("entries", n)
    assert objs.relpath("entries", n) in str(ei.value)
    assert list(objs.names("contents")) == [n] and list(objs.names("entries")) == []


def test_put_lazy_returns_path_owed(objs):
    data = b"lazy"
    n = name_of(data)
    p = objs.put("blobs", n, data, durable=False)
    assert p == objs.path("blobs", n)
    # already present and sound: not rewritten, still owed an fsync by a lazy writer
    ino = os.stat(p).st_ino
    assert objs.put("blobs", n, data, durable=False) == p
    assert objs.put("blobs", n, data, durable=True) is None
    assert os.stat(p).st_ino == ino
    fsync_paths([p, p, p + "-gone"])  # duplicates and a missing file are fine


def test_get_verifies_and_names_the_object(objs):
    data = b"important bytes"
    n = name_of(data)
    objs.put("entries", n, data, durable=True)
    p = objs.path("entries", n)
    with open(p, "r+b") as f:
        f.seek(3)
        f.write(b"X")
    with pytest.raises(CorruptObjectError) as ei:
        objs.get("entries", n)
    e = ei.value
    assert e.space == "entries" and e.name == n and e.path == p
    assert n in str(e) and objs.relpath("entries", n) in str(e)
    assert not objs.is_sound("entries", n)


@pytest.mark.parametrize("damage", ["short", "zeros", "same-size-flip", "empty"])
def test_put_replaces_a_torn_or_corrupt_object(objs, damage):
    data = b"0123456789" * 10
    n = name_of(data)
    objs.put("contents", n, data, durable=True)
    p = objs.path("contents", n)
    bad = {
        "short": data[:40],
        "zeros": b"\x00" * len(data),
        "same-size-flip": b"1" + data[1:],
        "empty": b"",
    }[damage]
    with open(p, "wb") as f:
        f.write(bad)
    assert not objs.is_sound("contents", n)
    objs.put("contents", n, data, durable=False)
    assert objs.get("contents", n) == data


def test_put_leaves_no_temp_files(objs, tmp_path):
    for i in range(5):
        d = f"obj {i}".encode()
        objs.put("blobs", name_of(d), d, durable=i % 2 == 0)
    # new objects are created under their own names; a torn copy is replaced through tmp/
    torn = objs.path("blobs", name_of(b"obj 0"))
    with open(torn, "wb") as f:
        f.write(b"obj")
    objs.put("blobs", name_of(b"obj 0"), b"obj 0", durable=False)
    assert objs.get("blobs", name_of(b"obj 0")) == b"obj 0"
    assert not (tmp_path / "tmp").exists() or os.listdir(tmp_path / "tmp") == []


def test_names_skips_strays(objs, tmp_path):
    d = b"one"
    n = name_of(d)
    objs.put("entries", n, d, durable=False)
    (tmp_path / "objects" / "entries" / "zz-not-a-fan").mkdir()
    (tmp_path / "objects" / "entries" / n[7:9] / "short").write_bytes(b"")
    assert list(objs.names("entries")) == [n]


def test_fsync_paths_many_dirs(objs):
    paths = []
    for i in range(20):
        d = f"many {i}".encode()
        paths.append(objs.put("contents", name_of(d), d, durable=False))
    fsync_paths(paths)
    fsync_paths([])


@pytest.mark.parametrize("big", [True, False])
def test_put_many_stores_every_object_soundly_either_way(objs, tmp_path, monkeypatch, big):
    """A checkpoint's batch: new objects stored, a torn loose one replaced or bypassed,
    a present one kept; a big batch as one pack (a handful of fsyncs, no loose files),
    a small one as loose files each fsynced."""
    from agentsession_cas.backends.files import objects as objects_module

    calls = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd))[1])
    n = objects_module.PACK_BATCH + 6 if big else objects_module.PACK_BATCH - 1
    datas = [f"batch {i}".encode() for i in range(n)]
    objs.make_fanout()  # as Store.init does: no directory is new during the batch
    objs.put("contents", name_of(datas[0]), datas[0], durable=True)  # already present
    torn = objs.path("contents", name_of(datas[1]))
    with open(torn, "wb") as f:
        f.write(b"bat")
    calls.clear()
    objs.put_many([("contents", name_of(d), d) for d in datas])
    for d in datas:
        assert objs.get("contents", name_of(d)) == d
    packs = os.listdir(os.path.join(objs.dir, "pack")) if os.path.isdir(os.path.join(objs.dir, "pack")) else []
    loose_new = [d for d in datas[2:] if os.path.exists(objs.path("contents", name_of(d)))]
    if big:
        assert len(calls) <= 4  # the pack, its index, the pack directory
        assert len([p for p in packs if p.endswith(".idx")]) == 1
        assert loose_new == []
    else:
        assert len(calls) >= len(datas) - 1
        assert packs == []
        assert len(loose_new) == len(datas) - 2


@pytest.mark.parametrize("read", ["get", "exists", "held", "held_many"])
def test_a_lookup_that_missed_finds_an_object_another_thread_listed_meanwhile(tmp_path, monkeypatch, read):
    """An object read while another process packs it (a sweep's repack, a merge) and
    removes its loose copy: the lookup misses the old pack listing, then the loose file.
    The reader lists the packs again, but asked refresh() whether the listing changed
    *just now*: a thread of its own (a checkpoint's worker publishing its pack) had
    listed the new pack in between, so the answer was no, and the object was reported
    missing (a writer's fork then failed: test_sweeps_beside_writers_in_other_processes)."""
    data = b'{"x":1}'
    name = name_of(data)
    reader = FileObjects(str(tmp_path))
    reader.put("contents", name, data)
    reader.packs.refresh(force=True)  # its listing: no pack holds it yet
    other = FileObjects(str(tmp_path))
    other.write_pack([("contents", name, data)], merge=False)
    os.unlink(reader.path("contents", name))
    original = reader._get_loose

    def loose_after_another_thread_listed(*args):
        reader.packs.refresh()  # (the other thread: it lists the new pack first)
        return original(*args)

    monkeypatch.setattr(reader, "_get_loose", loose_after_another_thread_listed)
    real_exists = os.path.exists

    def exists_after_another_thread_listed(path):
        if path == reader.path("contents", name):
            reader.packs.refresh()
        return real_exists(path)

    if read == "get":
        assert reader.get("contents", name) == data
        return
    monkeypatch.setattr(os.path, "exists", exists_after_another_thread_listed)
    if read == "exists":
        assert reader.exists("contents", name)
    elif read == "held":
        assert reader.held("contents", name)
    else:
        assert reader.held_many("contents", [name]) == [True]
