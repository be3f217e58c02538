"""The session log's line format and read_log's rule: a crash's loss versus damage."""

from __future__ import annotations

import blake3
import pytest

from agentsession_cas.backends.files.log import CHECKSUM_HEX, encode_record, read_log
from agentsession_cas.format.canonical import canonical_bytes

ENTRY = "sha256:" + "ab" * 32
CREATE = {"op": "create", "session": "s", "base": None, "mark": "record"}
APPEND = lambda seq, lazy=False: {"op": "append", "seq": seq, "entry": ENTRY[:-4] + f"{seq:04d}", **({"lazy": True} if lazy else {})}  # noqa: E731
COMMIT = {"op": "commit"}


def log(*records: dict) -> bytes:
    return b"".join(encode_record(r) for r in records)


def flip(data: bytes, line: int, at: int = 25) -> bytes:
    """Flip one bit inside the given (1-based) line, keeping its newline."""
    lines = data.split(b"\n")
    raw = bytearray(lines[line - 1])
    raw[at] ^= 0x02
    lines[line - 1] = bytes(raw)
    return b"\n".join(lines)


def test_line_format():
    line = encode_record({"op": "commit"})
    body = canonical_bytes({"op": "commit"})
    assert line == blake3.blake3(body).hexdigest(length=CHECKSUM_HEX // 2).encode() + b" " + body + b"\n"
    assert len(line.split(b" ", 1)[0]) == 16


def test_good_log_reads_whole():
    data = log(CREATE, APPEND(1), COMMIT, {"op": "head", "head": None}, {"op": "mark", "mark": "mirror"}, COMMIT)
    r = read_log(data)
    assert [x.op for x in r.records] == ["create", "append", "commit", "head", "mark", "commit"]
    assert [x.line for x in r.records] == [1, 2, 3, 4, 5, 6]
    assert r.records[1].get("seq") == 1 and r.records[1].get("missing", 7) == 7
    assert r.records[2].offset == len(log(CREATE, APPEND(1)))
    assert not r.damage and r.cut is None and r.sound_bytes == len(data) == r.size


def test_empty_log():
    r = read_log(b"")
    assert r.records == [] and not r.damage and r.cut is None


def test_torn_last_line_after_commit_is_cut():
    whole = log(CREATE, APPEND(1), COMMIT, APPEND(2, lazy=True))
    data = whole[:-7]
    r = read_log(data)
    assert not r.damage
    assert r.cut is not None and r.cut.line == 4 and "torn" in r.cut.reason
    assert [x.op for x in r.records] == ["create", "append", "commit"]
    assert r.sound_bytes == len(log(CREATE, APPEND(1), COMMIT))


def test_torn_line_after_create_only_is_cut():
    # create is written durably with the session, so it counts as a commit point
    r = read_log(log(CREATE, APPEND(1, lazy=True))[:-3])
    assert not r.damage and r.cut is not None and len(r.records) == 1


def test_missing_final_newline_of_a_good_record_is_torn():
    data = log(CREATE, COMMIT, APPEND(1))[:-1]
    r = read_log(data)
    assert r.cut is not None and r.cut.line == 3 and not r.damage


def test_bit_flip_before_last_commit_is_damage():
    data = flip(log(CREATE, APPEND(1), COMMIT, APPEND(2), COMMIT), 2)
    r = read_log(data)
    assert r.cut is None
    assert [d.line for d in r.damage] == [2] and "checksum" in r.damage[0].reason
    assert [x.op for x in r.records] == ["create"]


def test_bit_flip_in_checksum_is_damage():
    data = flip(log(CREATE, APPEND(1), COMMIT), 2, at=3)
    assert [d.line for d in read_log(data).damage] == [2]


def test_bit_flip_in_a_whole_uncommitted_record_is_damage_not_loss():
    # A crash cuts a tail short or leaves blocks unwritten; it does not flip bits in a whole line.
    data = flip(log(CREATE, APPEND(1), COMMIT, APPEND(2, lazy=True), APPEND(3, lazy=True)), 4)
    r = read_log(data)
    assert r.cut is None and [d.line for d in r.damage] == [4]


def test_zeroed_uncommitted_line_is_loss_with_later_records():
    lines = log(CREATE, COMMIT, APPEND(1, lazy=True), APPEND(2, lazy=True)).split(b"\n")
    lines[2] = b"\x00" * len(lines[2])
    r = read_log(b"\n".join(lines))
    assert not r.damage
    assert r.cut is not None and r.cut.line == 3 and "zero" in r.cut.reason
    assert [x.get("seq") for x in r.cut_records] == [2]
    assert [x.op for x in r.records] == ["create", "commit"]


def test_zeroed_line_before_commit_is_damage():
    lines = log(CREATE, APPEND(1), COMMIT).split(b"\n")
    lines[1] = b"\x00" * len(lines[1])
    r = read_log(b"\n".join(lines))
    assert r.cut is None and [d.line for d in r.damage] == [2]


def test_zeroed_line_then_flipped_whole_line_is_damage():
    lines = log(CREATE, COMMIT, APPEND(1, lazy=True), APPEND(2, lazy=True), APPEND(3, lazy=True)).split(b"\n")
    lines[2] = b"\x00" * len(lines[2])
    lines[3] = lines[3][:30] + bytes([lines[3][30] ^ 1]) + lines[3][31:]
    r = read_log(b"\n".join(lines))
    assert r.cut is None and [d.line for d in r.damage] == [3, 4]


def test_every_bad_line_is_reported_as_damage():
    data = flip(flip(log(CREATE, APPEND(1), APPEND(2), COMMIT), 2), 3)
    assert [d.line for d in read_log(data).damage] == [2, 3]


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"garbage line", "not a checksummed record"),
        (b"0123456789abcdef{\"op\":\"commit\"}", "not a checksummed record"),  # no space
    ],
)
def test_lines_that_are_no_record(raw, reason):
    data = log(CREATE) + raw + b"\n" + log(COMMIT)
    r = read_log(data)
    assert r.damage and r.damage[0].line == 2 and reason in r.damage[0].reason


def test_checksummed_non_json_and_unknown_op_are_damage():
    body = b"{not json"
    bad_json = blake3.blake3(body).hexdigest(length=8).encode() + b" " + body + b"\n"
    r = read_log(log(CREATE) + bad_json + log(COMMIT))
    assert "not JSON" in r.damage[0].reason
    r = read_log(log(CREATE) + encode_record({"op": "frobnicate"}) + log(COMMIT))
    assert "not a known record" in r.damage[0].reason
    # after the last commit, a whole line that is no record is damage too
    r = read_log(log(CREATE, COMMIT) + encode_record({"op": "frobnicate"}))
    assert r.damage and r.cut is None


# -- payloads and checkpoints --------------------------------------------------


def _line(body: bytes) -> bytes:
    return blake3.blake3(body).hexdigest(length=8).encode() + b" " + body + b"\n"


def test_payload_round_trips_and_is_covered_by_the_checksum():
    content, env = b'{"model":"m"}', b'{"content":"sha256:00","parent":null,"ts":"t","type":"config"}'
    line = encode_record(APPEND(1), payload=(content, env))
    record = canonical_bytes(APPEND(1))
    assert line.endswith(b" " + record + b"\t" + content + b"\t" + env + b"\n")
    assert line == _line(record + b"\t" + content + b"\t" + env)
    r = read_log(log(CREATE) + line + log(COMMIT))
    assert not r.damage and r.records[1].payload == (content, env)
    assert r.records[1].data == APPEND(1) and r.records[2].payload is None
    # a payload byte changed without the checksum is a bad line (damage before a commit)
    bad = line.replace(b'"model":"m"', b'"model":"n"')
    r = read_log(log(CREATE) + bad + log(COMMIT))
    assert [d.line for d in r.damage] == [2] and "checksum" in r.damage[0].reason


@pytest.mark.parametrize("tail", [b"\t{}", b"\t{}\t{}\t{}"])
def test_payload_of_other_than_two_objects_is_no_record(tail):
    body = canonical_bytes(APPEND(1)) + tail
    r = read_log(log(CREATE) + _line(body) + log(COMMIT))
    assert r.damage and r.damage[0].line == 2 and "payload" in r.damage[0].reason


def test_checkpoint_is_a_known_record_and_no_commit_point():
    r = read_log(log(CREATE, APPEND(1), COMMIT, {"op": "checkpoint"}))
    assert [x.op for x in r.records] == ["create", "append", "commit", "checkpoint"] and not r.damage
    # a torn line after a checkpoint that follows the last commit is still a crash's loss
    data = log(CREATE, COMMIT, APPEND(1, lazy=True), {"op": "checkpoint"}, APPEND(2, lazy=True))[:-5]
    r = read_log(data)
    assert not r.damage and r.cut is not None and r.cut.line == 5
    # and a bad line before a later commit is damage, a checkpoint between or not
    data = flip(log(CREATE, APPEND(1), {"op": "checkpoint"}, COMMIT), 2)
    assert [d.line for d in read_log(data).damage] == [2]


def test_torn_payload_is_cut_after_the_last_commit():
    line = encode_record(APPEND(1, lazy=True), payload=(b'{"a":1}', b'{"content":"x"}'))
    data = log(CREATE, COMMIT) + line[: line.index(b"\t") + 3]
    r = read_log(data)
    assert not r.damage and r.cut is not None and r.cut.line == 3 and "torn" in r.cut.reason


@pytest.mark.parametrize("head_moved", [True, False])
@pytest.mark.parametrize("head", [None, "sha256:" + "b" * 64])
@pytest.mark.parametrize("leaf_label", [True, False])
@pytest.mark.parametrize("lazy", [True, False])
def test_encode_append_is_encode_record(head_moved, head, leaf_label, lazy):
    """The hand-written append line (the hot path) is byte for byte the generic one."""
    from agentsession_cas.backends.files.log import ZERO_LINK, append_body, frame, record_body

    def encode_append(*args, payload, **kw):
        return frame(append_body(*args, payload=payload, **kw), ZERO_LINK)

    entry = "sha256:" + "a" * 64
    record = {"op": "append", "seq": 123456, "entry": entry}
    if head_moved:
        record["head"] = head
    if leaf_label:
        record["leaf_label"] = True
    if lazy:
        record["lazy"] = True
    payload = (b'{"x":1}', b'{"content":"sha256:' + b"c" * 64 + b'"}')
    line = encode_append(123456, entry, head, head_moved=head_moved, leaf_label=leaf_label, lazy=lazy, payload=payload)
    assert line == encode_record(record, payload=payload, prev=ZERO_LINK)
    assert append_body(123456, entry, head, head_moved=head_moved, leaf_label=leaf_label, lazy=lazy, payload=payload) \
        == record_body(record, payload)
    assert read_log(line).records[0].data == record
    bare = encode_append(123456, entry, head, head_moved=head_moved, leaf_label=leaf_label, lazy=lazy, payload=None)
    assert bare == encode_record(record, prev=ZERO_LINK)


# -- the chain: each line links to the one before it --------------------------------------

from agentsession_cas.backends.files.log import ZERO_LINK, encode_log, line_checksum  # noqa: E402


def chained(*records: dict) -> bytes:
    return encode_log(records)


def lines_of(data: bytes) -> list[bytes]:
    return [ln + b"\n" for ln in data.split(b"\n") if ln]


def test_chained_line_format():
    data = chained(CREATE, COMMIT)
    first, second = lines_of(data)
    assert first[17:34] == ZERO_LINK.encode() + b" "
    assert second[17:33] == first[:16], "the second line links to the first's checksum"
    covered = second[17:-1]
    assert second[:16] == blake3.blake3(covered).hexdigest(length=CHECKSUM_HEX // 2).encode()
    assert line_checksum(second) == second[:16].decode()
    r = read_log(data)
    assert [x.data for x in r.records] == [CREATE, COMMIT] and not r.damage
    assert r.records[1].checksum == second[:16].decode()


@pytest.mark.parametrize("case", ["removed", "swapped", "duplicated", "inserted-unlinked", "first-not-zero"])
def test_a_record_removed_moved_or_inserted_breaks_the_chain(case):
    lines = lines_of(chained(CREATE, APPEND(1), COMMIT, APPEND(2), COMMIT, APPEND(3), COMMIT))
    if case == "removed":
        del lines[3]
        bad = [4]
    elif case == "swapped":
        lines[3], lines[5] = lines[5], lines[3]
        bad = [4, 6]  # the line after a bad one is not judged by its link
    elif case == "duplicated":
        lines.insert(4, lines[3])
        bad = [5]
    elif case == "inserted-unlinked":
        lines.insert(3, encode_record(APPEND(9)))
        bad = [4]
    else:
        lines[0] = encode_record(CREATE, prev="1" * 16)
        bad = [1]
    r = read_log(b"".join(lines))
    assert [d.line for d in r.damage] == bad, r.damage
    assert all("out of place" in d.reason for d in r.damage if "checksum" not in d.reason)


def test_a_bad_line_does_not_make_the_next_out_of_place():
    """The line after a damaged one is not judged by its link (the damage may be in the
    checksum it links to), and a crash's zeroed line leaves the tail a crash's loss."""
    data = chained(CREATE, APPEND(1), COMMIT, APPEND(2), APPEND(3))
    lines = lines_of(data)
    raw = bytearray(lines[1])
    raw[3] ^= 0x01  # the checksum of the first append
    r = read_log(b"".join([lines[0], bytes(raw), *lines[2:]]))
    assert [d.line for d in r.damage] == [2]
    zeroed = lines[3][:-1].replace(lines[3][:-1], b"\x00" * (len(lines[3]) - 1)) + b"\n"
    r = read_log(b"".join([*lines[:3], zeroed, lines[4]]))
    assert not r.damage and r.cut is not None and r.cut.line == 4 and [x.data for x in r.cut_records] == [APPEND(3)]


def test_a_log_from_before_the_chain_reads_and_new_lines_chain_after_it(tmp_path):
    """An unlinked log (written before the chain) reads as it is; a writer appends linked
    lines after it; a line with no link after linked ones is out of place."""
    from agentsession_cas import Header
    from agentsession_cas.store import Store

    root = tmp_path / "store"
    st = Store.init(root)
    s = st.create(Header.new("old"))
    s.append({"type": "item", "item": {"type": "message", "role": "user", "content": "a"}, "ts": "2026-01-01T00:00:00Z"})
    st.close()
    path = root / "sessions" / "old" / "log"
    from storetools import line_body

    legacy = b"".join(encode_record_raw(line_body(ln)) for ln in lines_of(path.read_bytes()))
    path.write_bytes(legacy)
    assert all(ln[16:17] == b" " and ln[17:18] == b"{" for ln in lines_of(legacy))
    st = Store(root)
    s = st.session("old")
    s.append({"type": "item", "item": {"type": "message", "role": "user", "content": "b"}, "ts": "2026-01-01T00:00:01Z"})
    st.close()
    data = path.read_bytes()
    assert data.startswith(legacy)
    new = lines_of(data[len(legacy) :])
    assert new and new[0][17:33] == lines_of(legacy)[-1][:16]
    assert not read_log(data).damage
    assert len(Store(root, readonly=True).read("old")) == 2


def encode_record_raw(body: bytes) -> bytes:
    return blake3.blake3(body).hexdigest(length=CHECKSUM_HEX // 2).encode() + b" " + body + b"\n"


def test_fsck_names_a_removed_record(tmp_path):
    from agentsession_cas import Header
    from agentsession_cas.maintenance.fsck import fsck
    from agentsession_cas.store import Store

    root = tmp_path / "store"
    st = Store.init(root)
    s = st.create(Header.new("s"))
    for i in range(4):
        s.append({"type": "item", "item": {"type": "message", "role": "user", "content": f"m{i}"},
                  "ts": f"2026-01-01T00:00:0{i}Z"}, durable=True)
    st.close()
    path = root / "sessions" / "s" / "log"
    lines = lines_of(path.read_bytes())
    victim = next(i for i, ln in enumerate(lines) if b'"seq":2' in ln)
    del lines[victim]
    path.write_bytes(b"".join(lines))
    report = fsck(root)
    assert not report.ok
    assert any("out of place" in p.message and p.line == victim + 1 for p in report.errors), [str(p) for p in report.errors]
