"""Hostile and damaged packs: an index lost or damaged is rebuilt from its intact pack
by `pack`; a damaged pack is copied from and set aside; claims are bounded (issue 16)."""

from __future__ import annotations

import struct
from pathlib import Path

import zstandard
from damage import invoke

from agentsession_cas.backends.files.objects import FileObjects
from agentsession_cas.backends.files.packs import MAX_BLOCK, PACK_MAGIC, salvage_pack
from agentsession_cas.maintenance.fsck import fsck


def the_pack(root: Path) -> tuple[Path, Path]:
    idx = sorted((root / "objects" / "pack").glob("pack-*.idx"))
    assert len(idx) == 1, idx
    return idx[0].with_suffix(".pack"), idx[0]


def packed_names(root: Path) -> dict[str, bytes]:
    objs = FileObjects(str(root))
    try:
        objs.packs.refresh(force=True)
        (p,) = objs.packs.packs
        return {name: objs.get(space, name) for name, space in ((n, _space(loc.spaces)) for n, loc in p)}
    finally:
        objs.close()


def _space(bits: int) -> str:
    return "entries" if bits & 1 else "contents" if bits & 2 else "blobs"


def test_pack_rebuilds_the_objects_of_a_damaged_index_from_its_pack(store):
    root, info = store
    before = packed_names(root)
    pack, idx = the_pack(root)
    data = bytearray(idx.read_bytes())
    data[len(data) // 2] ^= 0x01
    idx.write_bytes(bytes(data))
    report = fsck(root)
    bad = [p for p in report.errors if p.code == "bad-pack-index"]
    assert bad and "`agentsession pack` rebuilds" in str(bad[0])
    r = invoke(root, "pack")
    assert r.exit_code == 0, r.output
    assert not idx.exists() and not pack.exists()  # the whole pack read: both go
    objs = FileObjects(str(root))
    try:
        for name, data in before.items():
            space = "entries" if data.startswith(b'{"content":') else None
            if space:
                assert objs.get("entries", name) == data
        assert objs.get("entries", info["bigsrc"][7])
    finally:
        objs.close()
    after = fsck(root)
    assert after.ok, [str(p) for p in after.problems]


def test_a_lost_index_is_rebuilt_by_pack(store):
    """An index of the right magic and nothing else: its pack's objects are hidden
    until `pack` reads them from the pack itself."""
    root, info = store
    pack, idx = the_pack(root)
    idx.write_bytes(b"ASIDX\x00\x00\x02" + b"\x00" * 40)
    objs = FileObjects(str(root))
    try:
        missing = [n for n in info["bigsrc"] if not objs.is_packed("entries", n)]
    finally:
        objs.close()
    assert missing, "the damaged index should hide the pack's objects"
    assert invoke(root, "pack").exit_code == 0
    objs = FileObjects(str(root))
    try:
        assert all(objs.is_packed("entries", n) for n in info["bigsrc"])
    finally:
        objs.close()
    assert fsck(root).ok


def test_a_damaged_pack_is_copied_from_and_set_aside(store):
    root, info = store
    pack, idx = the_pack(root)
    data = bytearray(pack.read_bytes())
    data[len(data) - 40] ^= 0x01  # the last block's bytes
    pack.write_bytes(bytes(data))
    assert not fsck(root).ok
    r = invoke(root, "pack")
    assert r.exit_code == 1  # it says what it could not copy
    aside = sorted(p.name for p in (root / "objects" / "pack").iterdir() if ".damaged-" in p.name)
    assert len(aside) == 2, aside  # the pack and its index, kept for an operator
    report = fsck(root)
    assert not any(p.code in ("bad-pack", "bad-pack-index") for p in report.errors)
    assert any(p.code == "damaged-pack-kept" for p in report.problems if p.severity == "note")
    # what the pack lost, the sessions' repair restores from their logs' payloads
    for sid in {p.session for p in report.errors if p.session}:
        assert invoke(root, "repair", "--yes", sid).exit_code == 0
    assert fsck(root).ok


def _pack_file(tmp_path: Path, frame: bytes, tail: bytes = b"") -> str:
    path = tmp_path / "pack-x.pack"
    path.write_bytes(PACK_MAGIC + frame + tail + b"\x00" * 32)
    return str(path)


def test_salvage_refuses_a_frame_that_declares_gigabytes_before_decompressing(tmp_path):
    # A frame header that declares 4 GiB of content: refused from the header alone.
    big = zstandard.ZstdCompressor().compress(b"x" * 1000)
    header = bytearray(big)
    params = zstandard.get_frame_parameters(bytes(header))
    assert params.content_size == 1000
    bomb = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    stream = bomb.compress(b"\0" * (1 << 20)) + bomb.flush()  # no declared size
    problems: list[str] = []
    assert list(salvage_pack(_pack_file(tmp_path, stream), problems)) == []
    assert problems and "declares" in problems[0]


def test_salvage_reads_a_block_and_bounds_its_slot_table(tmp_path):
    payload = b'{"a":1}'
    stream = bytes([0]) + struct.pack(">I", len(payload)) + struct.pack(">I", 0) + payload
    frame = zstandard.ZstdCompressor().compress(stream)
    problems: list[str] = []
    got = list(salvage_pack(_pack_file(tmp_path, frame), problems))
    assert problems == [] and len(got) == 1 and got[0][2] == payload and got[0][1] == 6
    assert MAX_BLOCK > 0
