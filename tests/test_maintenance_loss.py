"""Maintenance never destroys the only sound copy of an object: a sweep beside a pack
whose index does not read, a writer's pack merge beside a damaged pack, a sweep
interrupted mid-drop, and auto-pack and reads beside a damaged packed copy (the
reviewer's reproductions of session 43, /tmp/rev-maint bug6, bug6b, bug2b, bug1b, bug3)."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import agentsession_cas.backends.files.objects as objects_mod
import agentsession_cas.backends.files.sessions as sessions_mod
from agentsession_cas import Header
from agentsession_cas.backends.files.objects import FileObjects
from agentsession_cas.backends.files.packs import Pack
from agentsession_cas.errors import CorruptPackError
from agentsession_cas.format.hashing import sha256_ref
from agentsession_cas.store import Store
from agentsession_cli.main import main

MONTH = 30 * 86400
PRECIOUS = ("contents", sha256_ref(b'{"text":"precious"}'), b'{"text":"precious"}')


def cli(root: Path, *args: str):
    return CliRunner().invoke(main, ["--store", str(root), *args], catch_exceptions=False)


def item(text: str, blob: str | None = None) -> dict:
    content: list[dict] = [{"type": "input_text", "text": text}]
    if blob is not None:
        content.append({"type": "input_image", "image_url": f"sidecar:{blob}"})
    return {"type": "item", "item": {"type": "message", "role": "user", "content": content}}


def age_all(root: Path) -> None:
    t = time.time_ns() - MONTH * 10**9
    for dirpath, _, filenames in os.walk(root / "objects"):
        for f in filenames:
            os.utime(os.path.join(dirpath, f), ns=(t, t))


def tree(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = Path(p).read_bytes()
    return out


def pack_files(root: Path, ext: str) -> list[Path]:
    return sorted((root / "objects" / "pack").glob(f"pack-*{ext}"))


def flip(path: Path, at: int, bit: int = 1) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= bit
    path.write_bytes(bytes(data))


def damage_block(idx: str, name: str) -> None:
    """Flip a bit of the zstd frame header of the block holding ``name``: it no longer decompresses."""
    pk = Pack(idx)
    off, _, _ = pk.block_info(pk.find(name).block)
    pk.close()
    flip(Path(idx[: -len(".idx")] + ".pack"), off + 4, 0x40)


def verifies(root: Path, sid: str) -> bool:
    return cli(root, "verify", sid).exit_code == 0


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "store"
    Store.init(r).close()
    return r


# -- 1. a sweep beside a pack whose index does not read --------------------------------


def test_a_sweep_refuses_while_a_packs_index_is_damaged(root, monkeypatch):
    """A month-old pack whose index has one bit flipped: reads skip the pack, so the
    retention rule read none of its envelopes, and the sweep removed every content they
    named and then the pack (exit 0). It refuses now, dry or not (code corrupt_pack,
    naming the index relative to the store and `pack`), changing nothing; after `pack`
    (which reads the pack without its index) it sweeps and the session is whole."""
    monkeypatch.setattr(sessions_mod, "COMPACT_AT_CLOSE", 1)  # no payload copies left in the log
    with Store(str(root)) as st:
        s = st.create(Header.new("s1"))
        for i in range(5):
            s.append(item(f"m{i}"))
        s.close()
        st.pack()
    age_all(root)
    [idx] = pack_files(root, ".idx")
    flip(idx, 1100)
    before = tree(root)
    for args in (["--dry-run"], []):
        r = cli(root, "sweep", "--json", *args)
        assert r.exit_code == 1, (args, r.stdout)
        error = json.loads(r.stderr)["error"]
        assert error["code"] == "corrupt_pack", error
        assert f"objects/pack/{idx.name}" in error["message"] and str(root) not in error["message"], error
        assert "agentsession pack" in error["message"], error
        assert tree(root) == before
    assert cli(root, "pack").exit_code == 0
    assert cli(root, "sweep").exit_code == 0
    assert verifies(root, "s1")
    assert cli(root, "fsck").exit_code == 0


def test_a_blob_in_a_pack_whose_index_is_damaged_survives_a_sweep(root, monkeypatch):
    """The blob alone in a pack whose index is damaged, the session that names it sound
    and loose: the retention walk found no blob to read contents for (it looked only at
    readable packs), and the salvaged blob went with its pack."""
    monkeypatch.setattr(sessions_mod, "COMPACT_AT_CLOSE", 1)
    with Store(str(root)) as st:
        blob = st.put_blob(b"\x89PNG fake image bytes" * 10)
        st.pack()
        [idx] = pack_files(root, ".idx")
        s = st.create(Header.new("s1"))
        s.append(item("look", blob))
        s.close()
    age_all(root)
    flip(idx, -40)
    before = tree(root)
    r = cli(root, "sweep")
    assert r.exit_code == 1 and "agentsession pack" in r.stderr, r.stderr
    assert tree(root) == before
    assert cli(root, "pack").exit_code == 0
    assert cli(root, "sweep").exit_code == 0
    with Store(str(root), readonly=True) as st:
        assert st.blob(blob) == b"\x89PNG fake image bytes" * 10


def test_a_sweep_refuses_while_a_pack_without_an_index_does_not_read(root, monkeypatch):
    """A pack that lost its index and fails its checksum is not indexed again (no index
    vouches for bytes that do not hold): its envelopes cannot be read, so the contents
    they name, loose beside it, went as unretained. The sweep refuses instead."""
    monkeypatch.setattr(sessions_mod, "COMPACT_AT_CLOSE", 1)
    with Store(str(root)) as st:
        s = st.create(Header.new("s1"))
        ids = [s.append(item(f"m{i}")).id for i in range(5)]
        s.close()
        st.pack()
        contents = [("contents", e.content_hash) for e in map(st.entry, ids)]
        o = FileObjects(str(root))
        o.put_many([(sp, n, o.get(sp, n)) for sp, n in contents], dedup=False)  # loose copies too
        o.close()
    age_all(root)
    [idx] = pack_files(root, ".idx")
    [pack] = pack_files(root, ".pack")
    idx.unlink()
    flip(pack, pack.stat().st_size - 1)  # its trailer: the pack fails its checksum
    before = tree(root)
    r = cli(root, "sweep", "--json")
    assert r.exit_code == 1, r.stdout
    error = json.loads(r.stderr)["error"]
    assert error["code"] == "corrupt_pack" and f"objects/pack/{pack.name}" in error["message"], error
    assert str(root) not in error["message"], error
    assert tree(root) == before


# -- 2. a writer's pack merge beside a damaged pack -------------------------------------


def _damaged_tier(root: Path) -> str:
    """Seven small packs, the biggest (P1) holding PRECIOUS in a block that no longer
    decompresses; returns P1's index path."""
    o = FileObjects(str(root))
    rnd = random.Random(1)
    filler = [rnd.randbytes(20000) for _ in range(10)]
    p1 = o.write_pack([PRECIOUS] + [("blobs", sha256_ref(d), d) for d in filler], merge=False)
    for k in range(6):
        o.write_pack([("contents", sha256_ref(b'{"n":%d,"k":%d}' % (i, k)), b'{"n":%d,"k":%d}' % (i, k))
                      for i in range(5)], merge=False)
    o.close()
    damage_block(p1, PRECIOUS[1])
    return p1


def test_a_writers_merge_keeps_a_damaged_pack_and_the_sound_copy(root):
    """A writer finds PRECIOUS's packed copy corrupt and writes a sound one in a new pack
    (its batch is big), whose publication merges the smallest tier: the merge copied the
    damaged pack's blocks unchecked, named PRECIOUS by the damaged pack's record and
    deleted every source, the sound copy's pack among them. The damaged pack now stays
    out of the merge (its checksum fails), fsck still says so, and PRECIOUS reads."""
    p1 = _damaged_tier(root)
    w = FileObjects(str(root))
    with pytest.raises(CorruptPackError):
        w.get(*PRECIOUS[:2])
    w.write_pack([PRECIOUS] + [("contents", sha256_ref(b'{"w":%d}' % i), b'{"w":%d}' % i) for i in range(3)])
    w.close()
    assert os.path.exists(p1) and os.path.exists(p1[: -len(".idx")] + ".pack")
    r = FileObjects(str(root))
    try:
        assert r.get(*PRECIOUS[:2]) == PRECIOUS[2]
    finally:
        r.close()
    res = cli(root, "fsck")
    assert res.exit_code == 1 and "fails its checksum" in res.output, res.output
    cli(root, "pack")  # (exit 1: it names the damaged block it could not copy)
    assert cli(root, "cat-object", PRECIOUS[1]).output.strip() == PRECIOUS[2].decode()


def test_a_merge_of_sound_packs_still_merges(root):
    """(The check costs no merge: eight sound small packs become one.)"""
    o = FileObjects(str(root))
    items = [[("contents", sha256_ref(b'{"n":%d,"k":%d}' % (i, k)), b'{"n":%d,"k":%d}' % (i, k)) for i in range(5)]
             for k in range(8)]
    for batch in items:
        o.write_pack(batch, merge=False)
    assert o.merge_small_packs(max_tier=0)
    assert len(pack_files(root, ".idx")) == 1
    assert all(o.get(*obj[:2]) == obj[2] for batch in items for obj in batch)
    o.close()


# -- 3. a sweep interrupted mid-drop ------------------------------------------------------


class Killed(BaseException):
    pass


def _garbage_loose(root: Path) -> tuple[str, str, bytes]:
    obj = ("contents", sha256_ref(b'{"loose":1}'), b'{"loose":1}')
    o = FileObjects(str(root))
    o.put(*obj, durable=True)
    o.close()
    age_all(root)
    return obj


def _kill_at_the_drops_stat(monkeypatch, name: str) -> None:
    real = os.stat

    def stat(p, *a, **kw):
        b = os.path.basename(os.fspath(p))
        if b.startswith("drop-") and b.endswith(name[9:]):
            raise Killed()
        return real(p, *a, **kw)

    monkeypatch.setattr(objects_mod.os, "stat", stat)


def test_a_sweep_interrupted_after_moving_a_loose_file_aside_puts_it_back(root, monkeypatch):
    """Interrupted (Ctrl-C, SIGTERM) between moving a loose file into tmp/ and reading
    its mtime there: the file was left in tmp/ and lost (only a pack was ever put back).
    The move is rolled back on the way out."""
    obj = _garbage_loose(root)
    _kill_at_the_drops_stat(monkeypatch, obj[1])
    with Store(str(root)) as st, pytest.raises(Killed):
        st.sweep(grace=0)
    monkeypatch.undo()
    assert os.listdir(root / "tmp") == []
    o = FileObjects(str(root))
    assert o.get(*obj[:2]) == obj[2]
    o.close()


def _killed_sweep_left_aside(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, bytes]:
    """A garbage loose object a sweep moved aside into tmp/ and was killed outright after
    (no way out ran): the object, for the caller to find put back."""
    obj = _garbage_loose(root)
    _kill_at_the_drops_stat(monkeypatch, obj[1])
    monkeypatch.setattr(objects_mod, "_put_back", lambda aside, path: None, raising=False)  # (killed: no rollback)
    with Store(str(root)) as st, pytest.raises(Killed):
        st.sweep(grace=0)
    monkeypatch.undo()
    return obj


@pytest.mark.parametrize("then", ["pack", "sweep --dry-run", "auto-pack"])
def test_a_loose_file_a_killed_sweep_left_aside_is_put_back(root, monkeypatch, then):
    """Killed outright (no way out runs) right after the move: the next holder of the pack
    lock puts the loose file back, as it puts back a pack, so nothing retained since is
    lost (a writer naming it again finds it, and an unretained one goes at a later sweep)."""
    obj = _killed_sweep_left_aside(root, monkeypatch)
    [left] = os.listdir(root / "tmp")
    assert left.startswith("drop-"), left
    if then == "auto-pack":
        o = FileObjects(str(root))
        o.pack_loose()
        o.close()
    else:
        assert cli(root, *then.split()).exit_code == 0  # (a dry run holds the lock too; a sweep would
        # then remove the file as the garbage it is)
    assert os.listdir(root / "tmp") == []
    o = FileObjects(str(root))
    assert o.get(*obj[:2]) == obj[2]
    o.close()
    assert cli(root, "fsck").exit_code == 0


# -- 4. auto-pack and reads beside a damaged packed copy -----------------------------------


def _damaged_big_pack(root: Path) -> str:
    o = FileObjects(str(root))
    p = o.write_pack([PRECIOUS] + [("contents", sha256_ref(b'{"n":%d}' % i), b'{"n":%d}' % i) for i in range(100)],
                     merge=False)
    o.close()
    damage_block(p, PRECIOUS[1])
    return p


def test_auto_pack_keeps_the_one_sound_copy_readable(root):
    """A writer puts PRECIOUS loose beside its damaged packed copy; its close's auto-pack
    moved the loose copy into a new pack and unlinked it because a pack (the damaged one)
    named it. Reads looked only in the first pack naming it, so PRECIOUS no longer read.
    A read now looks on to every pack naming it, and only a copy a pack holds sound is
    taken for the loose one."""
    _damaged_big_pack(root)
    w = FileObjects(str(root))
    w.put(*PRECIOUS, durable=True)
    assert w.get(*PRECIOUS[:2]) == PRECIOUS[2]
    moved, idx = w.pack_loose()
    assert moved == 1 and idx is not None
    w.close()
    r = FileObjects(str(root))
    try:
        assert r.get(*PRECIOUS[:2]) == PRECIOUS[2]
        assert r.get_many("contents", [PRECIOUS[1]]) == [PRECIOUS[2]]
        assert r.held("contents", PRECIOUS[1])
    finally:
        r.close()
    res = cli(root, "cat-object", PRECIOUS[1])
    assert res.exit_code == 0 and res.output.strip() == PRECIOUS[2].decode(), res.output


def test_a_read_takes_the_sound_copy_of_another_pack(root):
    """A damaged copy in the biggest pack, a sound one in a smaller pack: served."""
    _damaged_big_pack(root)
    o = FileObjects(str(root))
    o.write_pack([PRECIOUS, ("contents", sha256_ref(b'{"x":1}'), b'{"x":1}')], merge=False)
    o.close()
    r = FileObjects(str(root))
    try:
        assert r.get(*PRECIOUS[:2]) == PRECIOUS[2]
        assert r.is_packed(*PRECIOUS[:2])
    finally:
        r.close()


def test_auto_pack_drops_a_loose_repeat_of_a_soundly_packed_object(root):
    """A checkpoint's loose repeat of an object a pack holds sound (common since a small
    checkpoint no longer looks in the packs) goes at auto-pack, not into a new pack."""
    o = FileObjects(str(root))
    batch = [("contents", sha256_ref(b'{"p":%d}' % i), b'{"p":%d}' % i) for i in range(70)]
    o.write_pack(batch, merge=False)
    o.put_many(batch[:3], dedup=False)
    assert all(os.path.exists(o.path(*obj[:2])) for obj in batch[:3])
    moved, idx = o.pack_loose()
    assert moved == 3 and idx is None
    assert not any(os.path.exists(o.path(*obj[:2])) for obj in batch[:3])
    assert all(o.get(*obj[:2]) == obj[2] for obj in batch)
    o.close()


def test_cat_object_names_a_damaged_pack_relative_to_the_store(root):
    """The one copy in a damaged block: `cat-object` names the pack relative to the store,
    as every other command does (it named the absolute path)."""
    p = _damaged_big_pack(root)
    r = CliRunner().invoke(main, ["--store", str(root), "cat-object", PRECIOUS[1]])
    assert r.exit_code == 1, r.output
    assert f"objects/pack/{os.path.basename(p)[: -len('.idx')]}.pack" in r.stderr and str(root) not in r.stderr, r.stderr


def test_a_loose_file_a_killed_sweep_left_aside_is_put_back_without_hard_links(root, monkeypatch):
    """On a filesystem without hard links the put-back renames the file back: the link it
    tried failed there, and every later pack, sweep and big import stopped on it."""
    import errno

    obj = _killed_sweep_left_aside(root, monkeypatch)

    def no_link(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    r = cli(root, "sweep", "--dry-run")
    assert r.exit_code == 0, r.output
    assert os.listdir(root / "tmp") == []
    o = FileObjects(str(root))
    assert o.get(*obj[:2]) == obj[2]
    o.close()


def test_an_append_naming_an_object_touches_every_copy_a_sweep_could_take(root):
    """``freshen`` (a writer naming an object it did not just write) touches every pack
    naming it and a loose copy, not the first pack alone: the first may hold a damaged
    copy a read passes over, and a sweep spares only what was touched."""
    o = FileObjects(str(root))
    first = o.write_pack([PRECIOUS] + [("contents", sha256_ref(b'{"n":%d}' % i), b'{"n":%d}' % i)
                                       for i in range(100)], merge=False)
    second = o.write_pack([PRECIOUS] + [("contents", sha256_ref(b'{"m":%d}' % i), b'{"m":%d}' % i)
                                        for i in range(70)], merge=False, dedup=False)
    o.close()
    assert first is not None and second is not None
    first, second = first[: -len(".idx")] + ".pack", second[: -len(".idx")] + ".pack"
    then = time.time() - 30 * 86400
    for p in (first, second):
        os.utime(p, (then, then))
    o = FileObjects(str(root))
    assert o.freshen(*PRECIOUS[:2]) is not None
    o.close()
    assert all(os.stat(p).st_mtime > then + 86400 for p in (first, second))


def test_a_damaged_index_whose_pack_is_gone_stops_no_sweep(root):
    """An index that does not read and has no pack beside it names objects no read could
    give: nothing to lose, so the sweep goes on, the index reported as damage met (it
    refused for good, and `pack`, which it advised, leaves such an index alone)."""
    o = FileObjects(str(root))
    idx = o.write_pack([("contents", sha256_ref(b'{"n":%d}' % i), b'{"n":%d}' % i) for i in range(100)], merge=False)
    o.close()
    assert idx is not None
    os.unlink(idx[: -len(".idx")] + ".pack")
    data = bytearray(Path(idx).read_bytes())
    data[40] ^= 0xFF
    Path(idx).write_bytes(bytes(data))
    r = cli(root, "sweep")
    assert "removed" in r.output and "cannot tell" not in r.output, r.output  # it swept (exit 1: damage met)
    assert cli(root, "fsck").exit_code == 1


def test_a_drop_whose_put_back_fails_is_never_cleaned_out_of_tmp(root, monkeypatch):
    """A put-back that fails (EIO, a full disk) stops nothing, and the drop stays in tmp/
    for the next one: the sweep's clean-up of old tmp/ leftovers passes over drops (a
    drop keeps its object's own mtime, old, and may be the one copy of a held object)."""
    import errno

    obj = _killed_sweep_left_aside(root, monkeypatch)
    [left] = os.listdir(root / "tmp")
    real = os.link

    def link(src, dst, *args, **kwargs):
        if os.path.basename(os.fspath(src)).startswith("drop-"):
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link)
    cli(root, "sweep", "--grace", "0", "--force")
    assert os.listdir(root / "tmp") == [left]
    monkeypatch.setattr(os, "link", real)
    assert cli(root, "pack").exit_code == 0  # the next holder puts it back
    assert os.listdir(root / "tmp") == []
    o = FileObjects(str(root))
    assert o.get(*obj[:2]) == obj[2]
    o.close()
