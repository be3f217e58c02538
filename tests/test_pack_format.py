"""Pack format 2 (agentsession_cas/packs.py): slots, the compact encodings a full
repack uses (envelopes as back references, random base64 cut to a side area),
their exactness and their failure modes, threaded compression, and packs of
the first format still read, merged and repacked; the layout file's move from
1 to 2.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import struct
from pathlib import Path

import blake3
import pytest

import agentsession_cas.backends.files.packs as packs_mod
from agentsession_cas import Header
from agentsession_cas.backends.files.layout import LAYOUT
from agentsession_cas.backends.files.objects import FileObjects
from agentsession_cas.backends.files.packs import (
    KIND_ENVELOPE,
    KIND_PLAIN,
    KIND_SIDE,
    MAX_BLOCK,
    MAX_CHAIN,
    SPACE_BITS,
    Pack,
    PackSet,
    PackWriter,
    decode_side,
    encode_envelope,
    encode_side,
)
from agentsession_cas.errors import CorruptObjectError, CorruptPackError, LayoutError
from agentsession_cas.format.hashing import envelope_bytes, sha256_ref
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store

E, C, B = SPACE_BITS["entries"], SPACE_BITS["contents"], SPACE_BITS["blobs"]


def b64(rng: random.Random, n: int) -> str:
    return base64.b64encode(rng.randbytes(n)).decode()


def chain_objects(n: int, *, seed: int = 0, secret_every: int = 3) -> list[tuple[int, bytes, bytes]]:
    """(space bits, raw name, bytes) of ``n`` entries as a store packs them: each
    content, then its envelope, parent to parent; some contents carry random base64."""
    rng = random.Random(seed)
    out = []
    parent = None
    for i in range(n):
        body = {"item": {"type": "message", "text": f"turn {i} of the session, words words"}}
        if i % secret_every == 0:
            body["item"]["encrypted_content"] = b64(rng, rng.randint(48, 600))
        content = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        c = sha256_ref(content)
        env = envelope_bytes("item", parent, None, f"2026-11-30T07:{i // 60 % 60:02d}:{i % 60:02d}.{i:06d}Z", c)
        out.append((C, bytes.fromhex(c[7:]), content))
        out.append((E, hashlib.sha256(env).digest(), env))
        parent = sha256_ref(env)
    return out


def write(tmp: Path, objects, **kw) -> Path:
    w = PackWriter(str(tmp / "pack"), str(tmp / "tmp"), **kw)
    for spaces, raw, data in objects:
        w.add_raw(raw, spaces, data)
    return Path(w.finish())


def read_all(idx: Path, objects) -> None:
    p = Pack(str(idx))
    ps = PackSet(str(idx.parent))
    try:
        for spaces, raw, data in objects:
            loc = p.find("sha256:" + raw.hex())
            assert loc is not None and loc.spaces & spaces
            assert ps.read(p, loc) == data
    finally:
        ps.close()
        p.close()


def kinds_of(idx: Path) -> dict[int, int]:
    p = Pack(str(idx))
    try:
        counts: dict[int, int] = {}
        for b in range(p.nblocks):
            for k in p.read_block(b).kinds:
                counts[k] = counts.get(k, 0) + 1
        return counts
    finally:
        p.close()


def write_v1_pack(pack_dir: Path, objects, *, block_target: int = 4096) -> Path:
    """A pack of the first format, written as docs/storage-format.md describes it
    (each object's block, offset and length in the index; objects as they are)."""
    import zstandard

    body = bytearray(packs_mod.PACK_MAGIC_V1)
    blocks, where, buf = [], {}, []

    def flush():
        if buf:
            raw = b"".join(buf)
            frame = zstandard.ZstdCompressor(level=3).compress(raw)
            blocks.append((len(body), len(frame), len(raw)))
            body.extend(frame)
            buf.clear()

    for spaces, name, data in objects:
        if name in where:
            where[name][3] |= spaces
            continue
        if buf and sum(map(len, buf)) + len(data) > block_target:
            flush()
        where[name] = [len(blocks), sum(map(len, buf)), len(data), spaces]
        buf.append(data)
    flush()
    pack_sum = blake3.blake3(bytes(body)).digest()
    names = sorted(where)
    fanout, total = [], 0
    for i in range(256):
        total += sum(1 for n in names if n[0] == i)
        fanout.append(total)
    idx = b"".join([
        packs_mod.IDX_MAGIC_V1, struct.pack(">II", len(names), len(blocks)), struct.pack(">256I", *fanout),
        b"".join(names), b"".join(struct.pack(">IIIB", *where[n]) for n in names),
        b"".join(struct.pack(">QII", *b) for b in blocks), pack_sum,
    ])
    pack_dir.mkdir(parents=True, exist_ok=True)
    final = pack_dir / f"pack-{pack_sum.hex()}"
    (final.with_suffix(".pack")).write_bytes(bytes(body) + pack_sum)
    (final.with_suffix(".idx")).write_bytes(idx + blake3.blake3(idx).digest())
    return final.with_suffix(".idx")


# -- the encodings, one by one ------------------------------------------------------------


def test_random_base64_is_cut_exactly_and_nothing_else_is():
    rng = random.Random(1)
    secret = b64(rng, 300)
    data = json.dumps({"a": secret, "b": "words " * 20, "c": b64(rng, 90)}).encode()
    cut = encode_side(data)
    assert cut is not None
    payload, side = cut
    assert len(side) == 390 and secret.encode() not in payload
    assert decode_side(payload, side) == data
    keep = [
        json.dumps({"x": "A" * 400}).encode(),  # in the alphabet, not random: compresses where it is
        json.dumps({"x": "abcdefghij" * 12}).encode(),
        json.dumps({"x": "0123456789abcdef" * 8}).encode(),  # hex: zstd codes it in four bits a character
        json.dumps({"x": b64(rng, 96)[:-1]}).encode(),  # not a whole number of quads
        json.dumps({"x": "short " + b64(rng, 30)}).encode(),  # under 64 characters
        json.dumps({"x": b64(rng, 100)}).encode() + b"\xfa",  # holds the mark byte: never cut
    ]
    for d in keep:
        assert encode_side(d) is None, d[:40]
    # Bits that a decode would drop (a non-canonical last quad) keep the run where it is.
    odd = b64(rng, 96)[:-4] + "QR=="
    assert base64.b64encode(base64.b64decode(odd, validate=True)) != odd.encode()
    assert encode_side(json.dumps({"x": odd}).encode()) is None
    # The inverse refuses side bytes that do not fit.
    with pytest.raises(ValueError):
        decode_side(payload, side[:-1])
    with pytest.raises(ValueError):
        decode_side(payload, side + b"!")


def test_an_envelope_of_the_common_form_points_back_or_carries_its_hashes():
    content = sha256_ref(b"{}")
    parent = sha256_ref(b"parent")
    env = envelope_bytes("item", parent, None, "2026-11-30T07:00:00.5Z", content)
    local = {bytes.fromhex(content[7:]): 3, bytes.fromhex(parent[7:]): 1}
    depth: dict[int, int] = {}
    near = encode_envelope(env, 5, local, depth)
    assert near is not None and near[0] == 1 | 2 | 4 and len(near) < 40 and depth[5] == 1
    far = encode_envelope(env, 5, {}, {})
    assert far is not None and far[0] == 2 and bytes.fromhex(content[7:]) in far
    root = encode_envelope(envelope_bytes("config", None, None, "2026-11-30T07:00:00Z", content), 0, {}, {})
    assert root is not None and root[0] == 0
    # Other forms are stored as they are.
    merged = envelope_bytes("merge", parent, [parent, content], "2026-11-30T07:00:00Z", content)
    assert encode_envelope(merged, 5, local, {}) is None
    assert encode_envelope(b'{"content":"x"}', 0, {}, {}) is None
    # A parent whose chain in the block is already MAX_CHAIN long is named by hash.
    assert encode_envelope(env, 5, local, {1: MAX_CHAIN})[0] == 1 | 2


# -- packs written with encode=True -------------------------------------------------------


def test_an_encoded_pack_reads_every_object_back_exactly(tmp_path):
    objects = chain_objects(400)
    objects.append((B, hashlib.sha256(b"\xfa binary").digest(), b"\xfa binary"))
    blob_b64 = json.dumps({"x": b64(random.Random(3), 200)}).encode()  # a blob is never cut
    objects.append((B, hashlib.sha256(blob_b64).digest(), blob_b64))
    idx = write(tmp_path, objects, encode=True, block_target=16 << 10)
    kinds = kinds_of(idx)
    assert kinds[KIND_ENVELOPE] == 400 and kinds[KIND_SIDE] >= 100 and kinds[KIND_PLAIN] >= 200
    read_all(idx, objects)
    plain = write(tmp_path / "plain", objects, block_target=16 << 10)
    assert set(kinds_of(plain)) == {KIND_PLAIN}
    read_all(plain, objects)
    assert idx.with_suffix(".pack").stat().st_size < 0.8 * plain.with_suffix(".pack").stat().st_size


def test_envelopes_go_last_in_their_block_and_point_back_only(tmp_path):
    objects = chain_objects(50)
    idx = write(tmp_path, objects, encode=True, block_target=1 << 20)
    p = Pack(str(idx))
    try:
        assert p.nblocks == 1
        blk = p.read_block(0)
        kinds = bytes(blk.kinds)
        assert kinds.rstrip(bytes([KIND_ENVELOPE])) == kinds[:50] and kinds[50:] == bytes([KIND_ENVELOPE]) * 50
    finally:
        p.close()


def test_any_envelope_of_a_long_chain_reads_without_walking_the_block(tmp_path):
    objects = chain_objects(3000, secret_every=10**9)
    idx = write(tmp_path, objects, encode=True, block_target=64 << 20)
    p = Pack(str(idx))
    try:
        assert p.nblocks == 1
        last = p.find("sha256:" + objects[-1][1].hex())
        blk = p.read_block(0)
        assert blk.object(last.offset) == objects[-1][2]
        # Rebuilt: the one asked for and the parents back to the last anchor (a few
        # dozen, whatever the block holds).
        assert 1 <= len(blk.decoded) <= MAX_CHAIN + 1 <= 65
        for _, raw, data in reversed(objects):
            assert blk.object(p.find("sha256:" + raw.hex()).offset) == data
    finally:
        p.close()


def test_children_added_before_their_parents_name_them_by_hash(tmp_path):
    """A repack adds objects in the order older packs hold them, which need not be
    parent first: a reference may only point back, so these carry hashes."""
    objects = chain_objects(40, secret_every=10**9)
    pairs = [objects[i : i + 2] for i in range(0, len(objects), 2)]
    backwards = [o for pair in reversed(pairs) for o in reversed(pair)]  # envelope, then its content
    idx = write(tmp_path, backwards, encode=True, block_target=1 << 20)
    assert kinds_of(idx)[KIND_ENVELOPE] == 40
    read_all(idx, objects)


def test_threads_write_the_very_same_pack(tmp_path):
    objects = chain_objects(600)
    one = write(tmp_path / "a", objects, encode=True, block_target=8 << 10, level=5)
    two = write(tmp_path / "b", objects, encode=True, block_target=8 << 10, level=5, threads=2)
    assert one.name == two.name  # named by their checksum: the same bytes
    assert one.read_bytes() == two.read_bytes()
    assert one.with_suffix(".pack").read_bytes() == two.with_suffix(".pack").read_bytes()


def test_a_wrong_back_reference_is_never_served(tmp_path, monkeypatch):
    """A writer bug pointing an envelope at the wrong slot: the rebuilt bytes do not
    hash to the name, and the read says so (it never serves them)."""
    real = packs_mod._encode_envelope

    def off_by_one(m, slot, local, depth, plain):
        out = real(m, slot, local, depth, plain)
        if out is not None and out[0] & 1 and out[1] == 50:  # the content 50 slots back
            out = bytes([out[0], 49]) + out[2:]
        return out

    objects = chain_objects(50, secret_every=10**9)
    root = tmp_path / "store"
    Store.init(root).close()
    monkeypatch.setattr(packs_mod, "_encode_envelope", off_by_one)
    write(root / "objects", objects, encode=True, block_target=1 << 20)
    monkeypatch.undo()
    objs = FileObjects(str(root))
    try:
        first_env = objects[1]
        with pytest.raises(CorruptObjectError, match="does not hash to its name"):
            objs.get("entries", "sha256:" + first_env[1].hex())
        assert objs.get("contents", "sha256:" + objects[0][1].hex()) == objects[0][2]
    finally:
        objs.close()
    report = fsck(str(root))
    assert any(p.code == "corrupt-object" and first_env[1].hex() in p.message for p in report.problems)


@pytest.mark.parametrize("distance", [0, 10**6])
def test_a_reference_outside_the_block_does_not_decode(tmp_path, monkeypatch, distance):
    real = packs_mod._encode_envelope

    def bad(m, slot, local, depth, plain):
        out = real(m, slot, local, depth, plain)
        if out is not None and out[0] & 1:
            out = bytes([out[0]]) + packs_mod._varint(distance) + out[1 + len(packs_mod._varint(out[1])):]
        return out

    objects = chain_objects(5, secret_every=10**9)
    monkeypatch.setattr(packs_mod, "_encode_envelope", bad)
    idx = write(tmp_path, objects, encode=True, block_target=1 << 20)
    monkeypatch.undo()
    p = Pack(str(idx))
    try:
        loc = p.find("sha256:" + objects[1][1].hex())
        with pytest.raises(CorruptPackError, match=r"slot \d+ does not decode: content reference"):
            p.read(loc)
    finally:
        p.close()


def test_a_block_whose_slot_table_does_not_add_up_is_corrupt():
    stream = bytes([0, 0]) + struct.pack(">2I", 3, 3) + struct.pack(">2I", 0, 0) + b"abcdef"
    blk = packs_mod.Block(stream, b"", 2, where="w", path="p")
    assert blk.object(0) == b"abc" and blk.object(1) == b"def"
    with pytest.raises(CorruptPackError, match="does not add up"):
        packs_mod.Block(stream + b"!", b"", 2, where="w", path="p")
    with pytest.raises(CorruptPackError, match="does not add up"):
        packs_mod.Block(stream, b"side", 2, where="w", path="p")
    with pytest.raises(CorruptPackError, match="too short"):
        packs_mod.Block(stream[:10], b"", 2, where="w", path="p")
    with pytest.raises(CorruptPackError, match="no slot 2"):
        blk.object(2)
    odd = bytes([9]) + struct.pack(">I", 1) + struct.pack(">I", 0) + b"x"
    with pytest.raises(CorruptPackError, match="unknown slot kind 9"):
        packs_mod.Block(odd, b"", 1, where="w", path="p").object(0)


def test_an_index_claiming_a_huge_side_area_is_refused_before_reading_it(tmp_path):
    idx = write(tmp_path, chain_objects(20), encode=True)
    p = Pack(str(idx))
    blocks_at = p._blocks_at
    p.close()
    body = bytearray(idx.read_bytes()[:-32])
    row = list(packs_mod._BLOCK.unpack_from(body, blocks_at))
    row[3] = MAX_BLOCK + 1
    packs_mod._BLOCK.pack_into(body, blocks_at, *row)
    idx.write_bytes(bytes(body) + blake3.blake3(bytes(body)).digest())
    p = Pack(str(idx))
    try:
        with pytest.raises(CorruptPackError):
            p.read_block(0)
    finally:
        p.close()


# -- the store: repack, merges, the first format ------------------------------------------


def fill(store: Store, sid: str, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    s = store.create(Header.new(sid))
    for i in range(n):
        item = {"type": "reasoning", "id": f"rs_{rng.getrandbits(96):024x}", "summary": [],
                "encrypted_content": b64(rng, rng.randint(100, 900))}
        s.append({"type": "item", "item": item})
        s.append({"type": "item", "item": {"type": "message", "role": "assistant",
                                           "content": [{"type": "output_text", "text": f"answer {i}"}]}})
    s.close()


def test_pack_encodes_and_the_store_reads_the_same_sessions(tmp_path):
    root = tmp_path / "store"
    with Store.init(root, sync="never") as st:
        fill(st, "s1", 150)
        fill(st, "s2", 40, seed=1)
        before = {sid: st.read(sid).projection() for sid in ("s1", "s2")}
        st.pack()
    [idx] = sorted((root / "objects" / "pack").glob("*.idx"))
    kinds = kinds_of(idx)
    assert kinds.get(KIND_ENVELOPE, 0) >= 380 and kinds.get(KIND_SIDE, 0) >= 190
    with Store(root, readonly=True) as st:
        assert {sid: st.read(sid).projection() for sid in ("s1", "s2")} == before
    assert fsck(str(root)).ok


def test_first_format_packs_are_read_merged_and_repacked(tmp_path):
    root = tmp_path / "store"
    Store.init(root).close()
    old = chain_objects(120, seed=5)
    v1 = write_v1_pack(root / "objects" / "pack", old)
    assert Pack(str(v1)).version == 1
    objs = FileObjects(str(root))
    try:
        for spaces, raw, data in old:
            space = "entries" if spaces & E else "contents"
            assert objs.get(space, "sha256:" + raw.hex()) == data
        # A merge with a pack of the new format re-adds the old one's objects.
        new = chain_objects(30, seed=6)
        objs.write_pack([("entries" if s & E else "contents", "sha256:" + r.hex(), d) for s, r, d in new], merge=False)
        objs.packs.refresh(force=True)
        objs._copy_packs(list(objs.packs.packs))
        objs.packs.refresh(force=True)
        assert [p.version for p in objs.packs.packs] == [2]
        for spaces, raw, data in old + new:
            assert objs.get("entries" if spaces & E else "contents", "sha256:" + raw.hex()) == data
    finally:
        objs.close()
    # And a repack from the first format straight to the second.
    root2 = tmp_path / "store2"
    Store.init(root2).close()
    write_v1_pack(root2 / "objects" / "pack", old)
    report = fsck(str(root2))
    assert report.counts["packed"] == len(old)
    with Store(root2) as st:
        st.objects.repack()
    idxs = sorted((root2 / "objects" / "pack").glob("*.idx"))
    assert len(idxs) == 1 and Pack(str(idxs[0])).version == 2
    read_all(idxs[0], old)


def test_a_layout_1_store_opens_and_moves_to_layout_2_when_opened_for_writing(tmp_path):
    root = tmp_path / "store"
    with Store.init(root) as st:
        fill(st, "s", 3)
    (root / "layout").write_text("agentsession-cas 1\n")
    with Store(root, readonly=True) as st:
        assert len(st.read("s")) == 6
    assert (root / "layout").read_text() == "agentsession-cas 1\n"  # a reader writes nothing
    with Store(root) as st:
        assert len(st.read("s")) == 6
    assert (root / "layout").read_text() == LAYOUT + "\n" == "agentsession-cas 2\n"
    (root / "layout").write_text("agentsession-cas 3\n")
    with pytest.raises(LayoutError, match="newer or unknown"):
        Store(root)


# -- found in review: hostile shapes, bounds, merges, failures -----------------------------


def envelope_form_blobs(n: int) -> list[tuple[int, bytes, bytes]]:
    """Blobs (any bytes a caller stores) that look like envelopes whose content is
    the previous blob: a chain of contents through envelope-form objects."""
    out, prev = [], hashlib.sha256(b"start").hexdigest()
    for _ in range(n):
        data = b'{"content":"sha256:' + prev.encode() + b'","parent":null,"ts":"1","type":"t"}'
        out.append((B, hashlib.sha256(data).digest(), data))
        prev = hashlib.sha256(data).hexdigest()
    return out


def test_a_content_never_points_at_an_envelope_so_no_chain_of_contents_recurses(tmp_path):
    objects = envelope_form_blobs(1500)
    idx = write(tmp_path, objects, encode=True, block_target=4 << 20)
    p = Pack(str(idx))
    try:
        assert p.nblocks == 1
        last = p.find("sha256:" + objects[-1][1].hex())
        blk = p.read_block(0)  # a fresh block: nothing rebuilt yet
        assert blk.object(last.offset) == objects[-1][2]
        assert len(blk.decoded) == 1 and len(blk.names) == 0
    finally:
        p.close()


def test_a_content_reference_to_an_envelope_does_not_decode(tmp_path, monkeypatch):
    """What our writer never writes, a hostile one might: refused, not followed."""
    real = packs_mod._encode_envelope
    monkeypatch.setattr(packs_mod, "_encode_envelope", lambda m, slot, local, depth, plain: real(m, slot, local, depth, slot))
    objects = envelope_form_blobs(3)
    root = tmp_path / "store"
    Store.init(root).close()
    write(root / "objects", objects, encode=True)
    monkeypatch.undo()
    objs = FileObjects(str(root))
    try:
        with pytest.raises(CorruptPackError, match="content reference from slot 1 to an envelope"):
            objs.get("blobs", "sha256:" + objects[1][1].hex())
    finally:
        objs.close()
    report = fsck(str(root))
    assert any(p.code == "corrupt-object" and "does not decode" in p.message for p in report.problems)


def test_big_objects_that_start_like_envelopes_count_their_own_size(tmp_path):
    big = [b'{"content":"' + bytes([65 + i]) * (3 << 20) + b'"}' for i in range(3)]
    objects = [(B, hashlib.sha256(d).digest(), d) for d in big]
    idx = write(tmp_path, objects, encode=True, block_target=2 << 20)
    p = Pack(str(idx))
    try:
        assert p.nblocks == 3  # one each, not one block of three
    finally:
        p.close()
    read_all(idx, objects)


def test_envelope_payloads_that_are_malformed_do_not_decode():
    def block_of(payload: bytes, slot_payloads=(b"x",)) -> packs_mod.Block:
        payloads = list(slot_payloads) + [payload]
        n = len(payloads)
        kinds = bytes([KIND_PLAIN] * (n - 1) + [KIND_ENVELOPE])
        stream = kinds + struct.pack(f">{n}I", *map(len, payloads)) + bytes(4 * n) + b"".join(payloads)
        return packs_mod.Block(stream, b"", n, where="w", path="p")

    good = bytes([1]) + packs_mod._varint(1) + b"2026-11-30T07:00:00Z\x00item"
    assert block_of(good).object(1).startswith(b'{"content":"sha256:' + hashlib.sha256(b"x").hexdigest().encode())
    for payload, why in [
        (bytes([8]) + good[1:], "flags 8"),
        (bytes([4]) + good[1:], "flags 4"),
        (bytes([0]) + b"\x01" * 10, "cut short"),
        (bytes([1]) + b"\x80", "varint"),
        (bytes([1]) + packs_mod._varint(1) + b"no nul", "cut short"),
        (bytes([1]) + packs_mod._varint(5) + b"t\x00x", "content reference 5"),
    ]:
        with pytest.raises(CorruptPackError, match="does not decode") as refused:
            block_of(payload).object(1)
        assert why in str(refused.value), (why, str(refused.value))
    with pytest.raises(ValueError, match="varint"):
        decode_side(b"ab\xfa\x80", b"")
    with pytest.raises(ValueError, match="varint"):
        packs_mod.read_varint(b"\xff" * 12, 0)


@pytest.mark.parametrize("field,value,match", [
    (5, 2**32 - 1, "claims 4294967295 slots in one block"),
    (1, 2**32 - 1, r"claims \d+ bytes, more than a block may hold"),
    (0, 2**63 + 5, "ends inside block 0"),
    (3, MAX_BLOCK + 1, "side bytes"),
])
def test_an_index_claiming_too_much_is_refused_before_anything_is_allocated(tmp_path, field, value, match):
    idx = write(tmp_path, chain_objects(20), encode=True)
    p = Pack(str(idx))
    blocks_at = p._blocks_at
    p.close()
    body = bytearray(idx.read_bytes()[:-32])
    row = list(packs_mod._BLOCK.unpack_from(body, blocks_at))
    row[field] = value
    packs_mod._BLOCK.pack_into(body, blocks_at, *row)
    idx.write_bytes(bytes(body) + blake3.blake3(bytes(body)).digest())
    with pytest.raises(CorruptPackError, match=match):
        p = Pack(str(idx))
        try:
            p.read_block(0)
        finally:
            p.close()


def test_a_fanout_table_that_goes_down_is_refused(tmp_path):
    idx = write(tmp_path, chain_objects(20))
    body = bytearray(idx.read_bytes()[:-32])
    at = len(packs_mod.IDX_MAGIC) + 8 + 4 * 10
    struct.pack_into(">I", body, at, 2**31)  # slot 10 above slot 11
    idx.write_bytes(bytes(body) + blake3.blake3(bytes(body)).digest())
    with pytest.raises(CorruptPackError, match="fan-out"):
        Pack(str(idx))


def test_merging_encoded_packs_copies_their_blocks_and_side_bytes(tmp_path):
    a = chain_objects(120, seed=1)
    b = chain_objects(120, seed=2) + a[:30]  # the same objects in both: dead slots in the merge
    ia = write(tmp_path / "a", a, encode=True, block_target=16 << 10)
    ib = write(tmp_path / "b", b, encode=True, block_target=16 << 10)
    pa, pb = Pack(str(ia)), Pack(str(ib))
    try:
        w = PackWriter(str(tmp_path / "m" / "pack"), str(tmp_path / "m" / "tmp"))
        w.copy_pack(pa)
        w.copy_pack(pb)
        merged = Path(w.finish())
    finally:
        pa.close()
        pb.close()
    pm = Pack(str(merged))
    try:
        in_a, in_b = {r for _, r, _ in a}, {r for _, r, _ in b}
        assert pm.slots == len(in_a) + len(in_b) and pm.count == len(in_a | in_b)
        assert pm.slots - pm.count >= 30  # slots named by no record: the copies merged away
        assert kinds_of(merged)[KIND_SIDE] > 0
    finally:
        pm.close()
    read_all(merged, a + b)


def test_a_damaged_first_format_pack_is_left_out_of_merges_and_writes_go_on(tmp_path):
    root = tmp_path / "store"
    Store.init(root).close()
    v1 = write_v1_pack(root / "objects" / "pack", chain_objects(30, seed=9), block_target=1 << 20)
    data = bytearray(v1.with_suffix(".pack").read_bytes())
    data[20] ^= 0xFF  # inside block 0's frame; the index still reads
    v1.with_suffix(".pack").write_bytes(bytes(data))
    objs = FileObjects(str(root))
    try:
        for i in range(8):  # enough small packs to fill the smallest tier
            new = chain_objects(40, seed=100 + i)
            objs.write_pack([("entries" if s & E else "contents", "sha256:" + r.hex(), d) for s, r, d in new])
        names = sorted(p.name for p in objs.packs.packs)
        assert v1.stem in names and len(names) < 9  # the others merged; the damaged one left as it was
        assert v1.stem in objs._unmergeable
    finally:
        objs.close()


def test_a_failure_while_blocks_compress_on_threads_leaves_nothing_behind(tmp_path, monkeypatch):
    calls = []

    import zstandard

    def failing(self, stream):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        # A compressor per call: one ZstdCompressor is not safe to share between the
        # writer's threads (sharing one crashed the interpreter now and then).
        return zstandard.ZstdCompressor(level=1).compress(stream)

    monkeypatch.setattr(PackWriter, "_compress", failing)
    w = PackWriter(str(tmp_path / "pack"), str(tmp_path / "tmp"), encode=True, block_target=4 << 10, threads=2)
    with pytest.raises(OSError, match="No space left"):
        for spaces, raw, data in chain_objects(300):
            w.add_raw(raw, spaces, data)
        w.finish()
    w.abort()
    assert w._pool is None
    assert os.listdir(tmp_path / "tmp") == [] and not (tmp_path / "pack").exists()


def test_an_empty_object_and_one_object_in_two_spaces_encode_and_read(tmp_path):
    objects = chain_objects(10)
    empty = (C, hashlib.sha256(b"").digest(), b"")
    idx = write(tmp_path, objects + [empty, (E, objects[0][1], objects[0][2]), (B, objects[1][1], objects[1][2])],
                encode=True)
    read_all(idx, objects + [empty])
    p = Pack(str(idx))
    try:
        assert p.find("sha256:" + objects[0][1].hex()).spaces == C | E
        assert p.find("sha256:" + objects[1][1].hex()).spaces == E | B
    finally:
        p.close()


def test_a_layout_1_store_is_current_for_migrate(tmp_path):
    from agentsession_cas.backends.files.migrate import layout_state

    root = tmp_path / "store"
    Store.init(root).close()
    (root / "layout").write_text("agentsession-cas 1\n")
    assert layout_state(str(root)) == "current"


def test_migrate_says_a_layout_1_store_needs_nothing(tmp_path):
    from click.testing import CliRunner

    from agentsession_cli.main import main

    root = tmp_path / "store"
    Store.init(root).close()
    (root / "layout").write_text("agentsession-cas 1\n")
    r = CliRunner().invoke(main, ["--store", str(root), "migrate"])
    assert r.exit_code == 0, r.output
    assert "of layout 'agentsession-cas 1', which this release reads as it is" in r.output
    r = CliRunner().invoke(main, ["--store", str(root), "migrate", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["layout"] == "agentsession-cas 1"
    assert (root / "layout").read_text() == "agentsession-cas 1\n"  # asking changed nothing


def test_fsck_names_a_first_format_record_placed_past_its_block(tmp_path):
    root = tmp_path / "store"
    Store.init(root).close()
    objects = chain_objects(10, seed=4)
    v1 = write_v1_pack(root / "objects" / "pack", objects, block_target=1 << 20)
    p = Pack(str(v1))
    where_at = p._where_at
    p.close()
    body = bytearray(v1.read_bytes()[:-32])
    block, offset, length, spaces = struct.unpack_from(">IIIB", body, where_at)
    struct.pack_into(">IIIB", body, where_at, block, offset, 10**6, spaces)
    v1.write_bytes(bytes(body) + blake3.blake3(bytes(body)).digest())
    report = fsck(str(root))
    assert any(p.code == "bad-pack-index" and "past the end of block 0" in p.message for p in report.problems)
