"""`agentsession repair` (issue 6 "repair"): a damaged session log rewritten from what reads.

Damage is made the way tests/test_crash.py makes it: bytes of a closed
store's log are flipped, zeroed, overwritten with random bytes, or garbage is
appended, and objects are deleted. Each test then checks what repair keeps,
recovers and drops, that the session opens, verifies and projects afterwards,
and that nothing is written where nothing should be.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, make_entry, read_session_bytes
from agentsession_cas.backends.files.log import _checksum, encode_record, read_log, scan_log
from agentsession_cas.backends.files.repair import DAMAGED_PREFIX
from agentsession_cas.errors import SessionDamagedError, SessionLockedError, StoreError
from agentsession_cas.maintenance.repair import plan_repair, repair_session
from agentsession_cas.store import Store
from agentsession_cli import repair_command, terminal
from agentsession_cli.main import main
from storetools import crash, files, line_body, rechain, refuse_to_wait

SID = "s1"
#: Where a record line's JSON begins: its checksum, a space, its link, a space.
RECORD = 34


# -- helpers ------------------------------------------------------------------------------


def item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def build(root: Path, n: int = 6, sid: str = SID, *, checkpointed: bool = True) -> list[str]:
    """A session of n continued durable appends. ``checkpointed``: closed cleanly, so
    objects/ holds every entry; else the process "dies" first and only the log's
    payloads hold them."""
    st = Store.init(root)
    s = st.create(Header.new(sid))
    ids = [s.append(make_entry("item", s.head, item=item(f"{sid} entry {i}")).data).id for i in range(n)]
    if checkpointed:
        st.close()
    else:
        crash(st)
    return ids


def log_path(root: Path, sid: str = SID) -> Path:
    return root / "sessions" / sid / "log"


def split(data: bytes) -> list[tuple[int, int, bytes]]:
    """Our own reading of a log's lines (not log.py's): (start, end without LF, bytes)."""
    out, offset = [], 0
    while offset < len(data):
        end = data.find(b"\n", offset)
        end = len(data) if end < 0 else end
        out.append((offset, end, data[offset:end]))
        offset = end + 1
    return out


def line_of(root: Path, op: str, nth: int, sid: str = SID) -> tuple[int, int, bytes]:
    """The nth (0-based) line of the log holding a record with this op."""
    found = [ln for ln in split(log_path(root, sid).read_bytes()) if f'"op":"{op}"'.encode() in ln[2].split(b"\t")[0]]
    return found[nth]


def poke(root: Path, offset: int, value: int, sid: str = SID) -> None:
    data = bytearray(log_path(root, sid).read_bytes())
    assert data[offset] != value
    data[offset] = value
    log_path(root, sid).write_bytes(bytes(data))


def flip(root: Path, offset: int, mask: int = 0x01, sid: str = SID) -> None:
    data = log_path(root, sid).read_bytes()
    poke(root, offset, data[offset] ^ mask, sid)


def cli(root: Path, *args: str, input: str | None = None):
    return CliRunner().invoke(main, ["--store", str(root), *args], input=input, catch_exceptions=False)


def repair_json(root: Path, *args: str, sid: str = SID) -> dict:
    r = cli(root, "repair", "--json", *args, sid)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return json.loads(r.stdout)


def assert_damaged(root: Path, sid: str = SID) -> None:
    with pytest.raises(SessionDamagedError):
        Store(root, readonly=True).read(sid)


def assert_healthy(root: Path, ids: list[str], sid: str = SID, *, head: str | None = None) -> None:
    """The session opens (for writing too), replays the given entries, verifies and projects."""
    session = Store(root, readonly=True).read(sid)
    assert session.log_order == ids
    assert session.head == (ids[-1] if head is None else head)
    with Store(root) as st:
        s = st.session(sid)
        assert not s.recovered, s.recovered
    r = cli(root, "verify", sid)
    assert r.exit_code == 0, r.stdout + r.stderr
    sf = read_session_bytes(Store(root, readonly=True).export(sid))
    assert sf.problems == [] and [e.id for e in sf.entries if not e.synthetic] == session.prefix + ids


def seqs(root: Path, sid: str = SID) -> list[int]:
    return [Store(root, readonly=True).read(sid).own[e] for e in Store(root, readonly=True).read(sid).log_order]


def asides(root: Path, sid: str = SID) -> list[str]:
    return sorted(n for n in os.listdir(root / "sessions" / sid) if n.startswith(DAMAGED_PREFIX))


# -- scan_log ----------------------------------------------------------------------------------


def test_scan_log_gives_every_line_with_its_record_or_reason(tmp_path):
    good = encode_record({"op": "create", "session": "x", "base": None, "mark": "record"})
    commit = encode_record({"op": "commit"})
    bad = bytearray(commit)
    bad[20] ^= 0x01
    data = good + bytes(bad) + b"\x00" * 10 + b"\n" + commit + b"0123abc"
    lines = scan_log(data)
    assert [(ln.line, ln.offset) for ln in lines] == [(i + 1, s) for i, (s, _, _) in enumerate(split(data))]
    assert [ln.record.op if ln.record else None for ln in lines] == ["create", None, None, "commit", None]
    assert "checksum" in lines[1].reason and not lines[1].crash_like
    assert lines[2].crash_like and "zero" in lines[2].reason
    assert lines[4].crash_like and not lines[4].terminated and "torn" in lines[4].reason
    assert lines[3].end == len(data) - 7 and lines[4].end == len(data)
    # read_log, built on the same scan, still tells damage from a crash's loss
    assert [d.line for d in read_log(data).damage] == [2, 3, 5]


# -- what repair handles ---------------------------------------------------------------------------


@pytest.mark.parametrize("part", ["record", "payload", "checksum"])
def test_bit_flip_in_the_middle(tmp_path, part):
    root = tmp_path / "store"
    ids = build(root)
    start, end, raw = line_of(root, "append", 2)  # the third append, before later commits
    if part == "record":
        flip(root, start + RECORD + 3)  # inside the member name "entry": the record no longer reads at all,
        how = "salvaged"  # but its payload is whole, and an envelope whole in a log line is an append
    elif part == "payload":
        flip(root, start + raw.index(b"\t") + 10)  # inside its content object
        how = "salvaged"
    else:
        poke(root, start, ord("0") if raw[0:1] != b"0" else ord("1"))  # the checksum alone
        how = "salvaged"
    damaged = log_path(root).read_bytes()
    assert_damaged(root)
    out = repair_json(root, "--yes")
    assert out["damaged"] and out["repaired"] and not out["dry_run"]
    assert [d["line"] for d in out["damage"]] == [6]
    assert out["kept"] == 6 and out["dropped"] == []
    assert [(r["entry"], r["seq"], r["how"]) for r in out["recovered"]] == [(ids[2], 3, how)]
    assert out["head"] == ids[-1] and out["head_note"] == "as the log last named it"
    assert out["seq"] == 6 and out["mark"] == "record"
    assert_healthy(root, ids)
    assert seqs(root) == [1, 2, 3, 4, 5, 6]
    # the damaged log is kept aside, byte for byte, under a name that says what it is
    assert asides(root) == [os.path.basename(out["damaged_log"])]
    assert Path(out["damaged_log"]).read_bytes() == damaged
    # and the new log says a repair happened, naming it
    rec = [r for r in read_log(log_path(root).read_bytes()).records if r.op == "repair"]
    assert len(rec) == 1 and rec[0].get("damaged_log") == asides(root)[0] and rec[0].get("seq") == 6


@pytest.mark.parametrize("checkpointed", [True, False], ids=["objects-written", "payload-only"])
def test_a_flip_inside_an_entry_id_names_a_phantom_that_is_reported_not_kept(tmp_path, checkpointed):
    root = tmp_path / "store"
    ids = build(root, checkpointed=checkpointed)
    start, _, raw = line_of(root, "append", 2)
    at = raw.index(b"sha256:") + 7 + 5  # a hex digit of the entry id in the record
    poke(root, start + at, ord("0") if raw[at : at + 1] != b"0" else ord("1"))
    phantom = raw[raw.index(b"sha256:") : raw.index(b"sha256:") + 71].decode()
    phantom = phantom[: 7 + 5] + ("0" if raw[at : at + 1] != b"0" else "1") + phantom[7 + 6 :]
    out = repair_json(root, "--yes")
    assert [(d["entry"], d["reason"]) for d in out["dropped"]] == [(phantom, "objects-missing")]
    assert "may have changed the id" in out["dropped"][0]["message"]
    assert out["damage"][0]["legible"] == [phantom]
    # the real entry is proved by the next append naming it its parent, and its objects
    # whole (in objects/, or in the damaged line's payload); an envelope of a line whose
    # record names another entry is never taken for an entry on its own word
    assert [(r["entry"], r["how"]) for r in out["recovered"]] == [(ids[2], "hidden")]
    assert_healthy(root, ids)


def test_torn_block_in_the_middle(tmp_path):
    """A sector of the log overwritten with other bytes, across several records."""
    root = tmp_path / "store"
    ids = build(root, n=12)
    data = bytearray(log_path(root).read_bytes())
    rng = random.Random(6)
    at = len(data) // 3
    data[at : at + 1200] = bytes(rng.randrange(1, 256) for _ in range(1200))
    log_path(root).write_bytes(bytes(data))
    assert_damaged(root)
    out = repair_json(root, "--yes")
    assert out["kept"] == 12 and out["dropped"] == []
    assert out["recovered"] and {r["how"] for r in out["recovered"]} <= {"hidden", "salvaged"}
    assert_healthy(root, ids)
    # the numbers the torn records held are given back to the same entries
    assert seqs(root) == list(range(1, 13))


def test_zeroed_block_in_the_middle(tmp_path):
    root = tmp_path / "store"
    ids = build(root, n=8)
    first = line_of(root, "append", 2)
    last = line_of(root, "append", 4)
    data = bytearray(log_path(root).read_bytes())
    data[first[0] : last[1] + 1] = b"\x00" * (last[1] + 1 - first[0])  # three appends, newlines and all
    log_path(root).write_bytes(bytes(data))
    assert_damaged(root)
    out = repair_json(root, "--yes")
    assert [(r["entry"], r["seq"]) for r in out["recovered"]] == [(ids[2], 3), (ids[3], 4), (ids[4], 5)]
    assert out["kept"] == 8 and out["dropped"] == []
    assert_healthy(root, ids)
    assert seqs(root) == list(range(1, 9))


def test_garbage_appended_after_the_last_commit(tmp_path):
    root = tmp_path / "store"
    ids = build(root, n=3)
    clean = log_path(root).read_bytes()
    with open(log_path(root), "ab") as f:
        f.write(b"this is no record of ours\n")
    assert_damaged(root)
    out = repair_json(root, "--yes")
    assert [d["line"] for d in out["damage"]] == [len(split(clean)) + 1]
    assert out["kept"] == 3 and out["recovered"] == [] and out["dropped"] == []
    assert "may have moved the head" in out["head_note"]
    # a damaged last line may have been an append: its number is spent with it
    assert out["seq"] > 3
    assert_healthy(root, ids)
    new_log = log_path(root).read_bytes()
    assert new_log.startswith(clean)  # every record that read, as it was
    with Store(root) as st:
        r = st.session(SID).append(make_entry("item", ids[-1], item=item("after the repair")).data)
    assert r.seq == out["seq"] + 1


def zero_line(root: Path, start: int, end: int, sid: str = SID) -> None:
    """Zero a line's bytes, its newline kept: record and payload gone."""
    data = bytearray(log_path(root, sid).read_bytes())
    data[start:end] = b"\x00" * (end - start)
    log_path(root, sid).write_bytes(bytes(data))


def test_a_damaged_last_append_spends_its_sequence_number(tmp_path):
    root = tmp_path / "store"
    ids = build(root, n=6, checkpointed=False)  # its objects are only in the log
    start, end, _ = line_of(root, "append", 5)
    zero_line(root, start, end)  # before its commit: damage, and the only copy of the entry gone
    out = repair_json(root, "--yes")
    assert out["kept"] == 5 and out["recovered"] == []
    assert out["seq"] >= 6
    assert_healthy(root, ids[:5])
    with Store(root) as st:
        r = st.session(SID).append(make_entry("item", ids[4], item=item("next")).data)
    assert r.seq > 6, "sequence number 6 was given out once and must not be again"


@pytest.mark.parametrize("how", ["record", "checksum", "no mark index"])
def test_damage_in_the_create_record_is_rebuilt_from_the_header(tmp_path, how):
    root = tmp_path / "store"
    ids = build(root)
    start, _, raw = line_of(root, "create", 0)
    if how == "checksum":
        poke(root, start, ord("0") if raw[0:1] != b"0" else ord("1"))
    else:
        flip(root, start + raw.index(b'"op"') + 2)  # "op" -> "np": not a record
    if how == "no mark index":
        (root / "sessions" / SID / "mark").unlink()
    assert_damaged(root)
    out = repair_json(root, "--yes")
    assert out["create_rebuilt"] and out["kept"] == 6 and out["dropped"] == []
    assert [d["line"] for d in out["damage"]] == [1]
    if how == "no mark index":
        # nothing says which mark it had: the safer one, which refuses local writes
        assert out["mark"] == "mirror" and any(n["code"] == "create-rebuilt" and "mirror" in n["message"] for n in out["notes"])
    else:
        assert out["mark"] == "record"
    assert_healthy(root, ids)
    create = read_log(log_path(root).read_bytes()).records[0].data
    header = json.loads((root / "sessions" / SID / "header").read_bytes())
    assert create == {"op": "create", "session": SID, "base": None, "mark": out["mark"], "header": header}


def test_damaged_create_of_a_fork_takes_its_base_from_the_header(tmp_path):
    root = tmp_path / "store"
    ids = build(root, n=3)
    with Store(root) as st:
        f = st.create(Header.new("fork", base=ids[1]))
        own = [f.append(make_entry("item", f.head, item=item(f"fork {i}")).data).id for i in range(2)]
    start, _, raw = line_of(root, "create", 0, sid="fork")
    flip(root, start + raw.index(b'"base"') + 2, sid="fork")
    out = repair_json(root, "--yes", sid="fork")
    assert out["create_rebuilt"] and out["kept"] == 2
    session = Store(root, readonly=True).read("fork")
    assert session.base == ids[1] and session.prefix == ids[:2]
    assert_healthy(root, own, sid="fork")


def test_a_fork_whose_prefix_cannot_be_read_is_refused(tmp_path):
    root = tmp_path / "store"
    ids = build(root, n=3)
    with Store(root) as st:
        f = st.create(Header.new("fork", base=ids[1]))
        f.append(make_entry("item", f.head, item=item("fork 0")).data)
    flip(root, line_of(root, "append", 0, sid="fork")[0] + RECORD + 3, sid="fork")
    os.unlink(Store(root).objects.path("entries", ids[0]))
    before = files(root)
    r = cli(root, "repair", "--yes", "fork")
    assert r.exit_code == 1 and "the prefix above its base" in r.stderr and "cannot be read" in r.stderr
    assert files(root) == before


def test_a_head_record_still_legible_in_a_damaged_line_is_followed(tmp_path):
    root = tmp_path / "store"
    ids = build(root, n=4)
    with Store(root) as st:
        st.session(SID).set_head(ids[1], expected=ids[3])
    start, _, raw = line_of(root, "head", 0)
    poke(root, start, ord("0") if raw[0:1] != b"0" else ord("1"))  # its checksum only
    assert_damaged(root)
    out = repair_json(root, "--yes")
    assert out["head"] == ids[1] and out["head_note"] == "as the log last named it"
    assert out["kept"] == 4 and out["recovered"] == [] and out["dropped"] == []
    assert_healthy(root, ids, head=ids[1])


def test_damaged_create_and_unreadable_header_is_refused(tmp_path):
    root = tmp_path / "store"
    build(root)
    start, _, raw = line_of(root, "create", 0)
    flip(root, start + raw.index(b'"op"') + 2)
    (root / "sessions" / SID / "header").write_bytes(b"{not json\n")
    before = files(root)
    r = cli(root, "repair", "--yes", SID)
    assert r.exit_code == 1 and "header is unreadable" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert files(root) == before


def test_missing_log_is_rebuilt_from_the_header_and_what_head_proves(tmp_path):
    """The log gone whole: its create record is rebuilt from the header, and every entry
    HEAD names (walking its parents through objects/) is taken back, not lost."""
    root = tmp_path / "store"
    ids = build(root, n=2)
    log_path(root).unlink()
    out = repair_json(root, "--yes")
    assert out["create_rebuilt"] and out["kept"] == 2 and out["damaged_log"] is None
    assert [(r["entry"], r["how"]) for r in out["recovered"]] == [(ids[0], "head"), (ids[1], "head")]
    session = Store(root, readonly=True).read(SID)
    assert session.log_order == ids and session.head == ids[1] and session.mark == "record"


def test_sequence_numbers_the_summary_saw_given_out_are_not_given_again(tmp_path):
    """The log gone and HEAD naming an earlier entry: what HEAD proves is taken back, but
    the session's summary (an index, checksummed) says its log had given out more
    sequence numbers: those are spent too, so the next append does not reuse one a
    lost entry held (a mirror elsewhere may know it by that number). The two entries HEAD
    proves are not as many as the four numbers lost, so which number each held cannot
    be told: they are numbered after all four."""
    root = tmp_path / "store"
    ids = build(root, n=4)
    log_path(root).unlink()
    (root / "sessions" / SID / "HEAD").write_text(ids[1] + "\n")
    out = repair_json(root, "--yes")
    assert [(r["entry"], r["seq"]) for r in out["recovered"]] == [(ids[0], 5), (ids[1], 6)]
    assert out["seq"] == 6
    assert any(n["code"] == "seq-from-summary" and "up to 4" in n["message"] for n in out["notes"]), out["notes"]


def test_missing_log_and_no_head_is_rebuilt_as_an_empty_session(tmp_path):
    root = tmp_path / "store"
    build(root, n=2)
    log_path(root).unlink()
    (root / "sessions" / SID / "HEAD").write_bytes(b"\n")
    out = repair_json(root, "--yes")
    assert out["create_rebuilt"] and out["kept"] == 0 and out["damaged_log"] is None
    session = Store(root, readonly=True).read(SID)
    assert len(session) == 0 and session.mark == "record"


def test_missing_objects_are_reported_not_invented(tmp_path):
    """No checkpoint ran: the payloads in the log were the only copy of the entries."""
    root = tmp_path / "store"
    ids = build(root, n=6, checkpointed=False)
    start, end, _ = line_of(root, "append", 2)
    data = bytearray(log_path(root).read_bytes())
    data[start:end] = b"\x00" * (end - start)  # the third append's line, its newline kept
    log_path(root).write_bytes(bytes(data))
    out = repair_json(root, "--yes")
    assert out["kept"] == 2 and out["recovered"] == []
    dropped = {d["entry"]: d for d in out["dropped"]}
    assert set(dropped) == set(ids[2:])
    # the entry whose record is gone is named by its child, and its objects are nowhere
    assert dropped[ids[2]]["reason"] == "objects-missing" and dropped[ids[2]]["seq"] is None
    assert dropped[ids[3]]["reason"] == "parent-missing" and dropped[ids[3]]["because"] == ids[2]
    assert dropped[ids[4]]["reason"] == "parent-dropped" and dropped[ids[4]]["because"] == ids[3]
    assert dropped[ids[5]]["because"] == ids[4] and dropped[ids[5]]["seq"] == 6
    # nothing invented: no object of a dropped entry appears in objects/
    st = Store(root, readonly=True)
    for e in ids[2:]:
        assert not st.objects.exists("entries", e)
    assert out["head"] == ids[1]
    assert_healthy(root, ids[:2])
    # what was dropped is still in the kept damaged log, and only there
    assert all(e.encode() in Path(out["damaged_log"]).read_bytes() for e in ids[2:])
    with Store(root) as st:
        assert st.session(SID).append(make_entry("item", ids[1], item=item("next")).data).seq == 7


def test_an_imported_session_without_payloads_drops_what_objects_lack(tmp_path):
    root = tmp_path / "store"
    ids = build(root, n=4)
    with Store(root) as st:
        data = st.export(SID).replace(f'"id":"{SID}"'.encode(), b'"id":"imp"', 1)
        st.import_bytes(data, record=True)
    recs = read_log(log_path(root, "imp").read_bytes()).records
    assert all(r.payload is None for r in recs if r.op == "append")
    st = Store(root, readonly=True)
    os.unlink(st.objects.path("contents", st.entry(ids[2]).content_hash))
    start, _, _ = line_of(root, "commit", 0, sid="imp")
    flip(root, start + 20, sid="imp")  # damage elsewhere: the commit record
    out = repair_json(root, "--yes", sid="imp")
    dropped = {d["entry"]: (d["reason"], d["because"]) for d in out["dropped"]}
    assert dropped == {ids[2]: ("objects-missing", None), ids[3]: ("parent-dropped", ids[2])}
    assert_healthy(root, ids[:2], sid="imp")


def test_a_payload_that_does_not_hash_is_damage_and_whole_objects_take_its_place(tmp_path):
    root = tmp_path / "store"
    ids = build(root)
    start, end, raw = line_of(root, "append", 1)
    record, content, env = line_body(raw).split(b"\t")
    bad = b"\t".join([record, content.replace(b"entry 1", b"entry X"), env])
    data = log_path(root).read_bytes()
    log_path(root).write_bytes(rechain(data[:start] + _checksum(bad).encode() + b" " + bad + data[end:]))
    flip(root, line_of(root, "append", 4)[0] + RECORD + 3)  # and real damage elsewhere
    out = repair_json(root, "--yes")
    assert [d["line"] for d in out["damage"]] == [4, 10] and "payload" in out["damage"][0]["reason"]
    assert out["kept"] == 6 and out["dropped"] == []
    assert any(n["code"] == "bad-payload" and "take its place" in n["message"] for n in out["notes"])
    assert_healthy(root, ids)
    rec = next(r for r in read_log(log_path(root).read_bytes()).records if r.get("entry") == ids[1])
    assert rec.payload == (Store(root).objects.get("contents", Store(root).entry(ids[1]).content_hash),
                           Store(root).objects.get("entries", ids[1]))


def test_a_head_move_to_a_dropped_entry_whose_ancestry_is_lost_is_left_out(tmp_path):
    root = tmp_path / "store"
    st = Store.init(root)
    s = st.create(Header.new(SID))
    ids = [s.append(make_entry("item", s.head, item=item(f"e{i}")).data).id for i in range(4)]
    s.set_head(ids[2], expected=ids[3])
    label = s.append(make_entry("label", ids[2], target=ids[3], label="leaf").data)
    assert s.head == ids[3]
    crash(st)
    start, end, _ = line_of(root, "append", 1)
    data = bytearray(log_path(root).read_bytes())
    data[start:end] = b"\x00" * (end - start)
    log_path(root).write_bytes(bytes(data))
    out = repair_json(root, "--yes")
    assert out["kept"] == 1 and out["head"] == ids[0]
    assert {d["entry"] for d in out["dropped"]} == {ids[1], ids[2], ids[3], label.id}
    # the head record named ids[2]; what it hangs from (ids[1]) is nowhere whole, so the
    # head stays where the last kept move (the append of ids[0]) put it
    assert any(n["code"] == "head-left-out" and "head record" in n["message"] and "stays at" in n["message"]
               for n in out["notes"])
    assert out["head_note"] == f"where the last kept move put it; the log last named {ids[3][7:19]}, which is not kept"
    assert_healthy(root, ids[:1])


def test_a_head_named_by_a_dropped_entry_goes_to_its_nearest_kept_ancestor(tmp_path):
    """An imported session: its appends carry no head; one head record names the head."""
    root = tmp_path / "store"
    ids = build(root, n=5)
    with Store(root) as st:
        st.import_bytes(st.export(SID).replace(f'"id":"{SID}"'.encode(), b'"id":"imp"', 1), record=True)
    st = Store(root, readonly=True)
    os.unlink(st.objects.path("contents", st.entry(ids[2]).content_hash))  # its envelope stays
    flip(root, line_of(root, "append", 0, sid="imp")[0] + RECORD + 3, sid="imp")  # objects/ proves it again
    out = repair_json(root, "--yes", sid="imp")
    assert [(r["entry"], r["how"]) for r in out["recovered"]] == [(ids[0], "hidden")]
    assert out["kept"] == 2 and out["head"] == ids[1]
    assert out["head_note"] == f"its nearest ancestor that is kept; the log last named {ids[4][7:19]}, which is not kept"
    assert_healthy(root, ids[:2], sid="imp")


def test_an_entry_converging_on_a_dropped_one_is_dropped(tmp_path):
    root = tmp_path / "store"
    st = Store.init(root)
    s = st.create(Header.new(SID))
    a = s.append(make_entry("item", None, item=item("a")).data).id
    b = s.append(make_entry("item", a, item=item("b")).data).id
    c = s.append(make_entry("item", a, item=item("c"), parents=[{"entry": b}]).data).id
    d = s.append(make_entry("item", a, item=item("d")).data).id
    crash(st)
    start, end, _ = line_of(root, "append", 1)
    data = bytearray(log_path(root).read_bytes())
    data[start:end] = b"\x00" * (end - start)
    log_path(root).write_bytes(bytes(data))
    out = repair_json(root, "--yes")
    dropped = {x["entry"]: (x["reason"], x["because"]) for x in out["dropped"]}
    assert dropped[c] == ("converges-missing", b) and b in dropped
    assert out["kept"] == 2
    # b's append moved the head to b; b is gone, so the head is b's nearest kept ancestor
    assert out["head"] == a
    assert_healthy(root, [a, d], head=a)


# -- what repair never does ----------------------------------------------------------------------


def test_dry_run_changes_nothing(tmp_path):
    root = tmp_path / "store"
    ids = build(root, n=6, checkpointed=False)
    start, end, _ = line_of(root, "append", 3)
    zero_line(root, start, end)
    before = files(root)
    r = cli(root, "repair", "--dry-run", SID)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "dry run: nothing written"
    assert lines[0].startswith(f"session  {SID}: log line 8 ") and lines[0].count(SID) == 1, lines[0]
    assert any(ln.startswith("damaged  line 8 ") for ln in lines)
    assert any(ln.startswith("kept     3 entries") for ln in lines)
    assert sum(ln.startswith("dropped  ") for ln in lines) == 3  # the entry whose line is gone, and its two children
    assert any(ln.startswith(f"dropped  {ids[3]}: objects-missing: named by a record that reads") for ln in lines)
    assert any(ln.startswith(f"dropped  {ids[4]} (seq 5, line 10): parent-missing") for ln in lines)
    out = json.loads(cli(root, "repair", "--dry-run", "--json", SID).stdout)
    assert out["dry_run"] and out["damaged"] and not out["repaired"] and out["damaged_log"] is None
    assert files(root) == before, "a dry run wrote to the store"
    # and the plan is what the repair then does
    done = repair_json(root, "--yes")
    assert {k: done[k] for k in ("kept", "dropped", "recovered", "head", "seq")} == {
        k: out[k] for k in ("kept", "dropped", "recovered", "head", "seq")
    }


def test_an_undamaged_session_is_left_as_it_is(tmp_path):
    root = tmp_path / "store"
    build(root, n=3)
    with open(log_path(root), "ab") as f:
        f.write(b'0123456789abcdef {"entry":"sha256:12')  # a torn tail: recovery's work, not damage
    before = files(root / "sessions")
    r = cli(root, "repair", SID)
    assert r.exit_code == 0 and "is not damaged" in r.stdout and "nothing to repair" in r.stdout
    out = repair_json(root)
    assert out["damaged"] is False and out["repaired"] is False
    assert files(root / "sessions") == before


def test_repair_is_idempotent(tmp_path):
    root = tmp_path / "store"
    ids = build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    assert repair_json(root, "--yes")["repaired"]
    after = files(root / "sessions")
    again = repair_json(root, "--yes")
    assert again["damaged"] is False and again["repaired"] is False
    assert files(root / "sessions") == after
    assert len(asides(root)) == 1
    assert_healthy(root, ids)


def test_a_session_another_process_holds_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "store"
    ids = build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    lock = root / "locks" / f"{SID}.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, os, fcntl; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
         "print('READY', flush=True); sys.stdin.readline()", str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "READY"
        before = files(root / "sessions")
        with monkeypatch.context() as m:
            m.setattr(time, "sleep", refuse_to_wait)
            r = cli(root, "repair", "--yes", SID)
        assert r.exit_code == 1 and r.stdout == ""
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and "locked by another process" in err[0]
        with pytest.raises(SessionLockedError):
            repair_session(Store(root), SID)
        assert files(root / "sessions") == before
        # a dry run takes no lock: it still reports
        assert cli(root, "repair", "--dry-run", SID).exit_code == 0
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=30)
    assert repair_json(root, "--yes")["repaired"]
    assert_healthy(root, ids)


def test_a_session_open_in_this_process_is_refused(tmp_path):
    root = tmp_path / "store"
    build(root)
    with Store(root) as st:
        st.session(SID)
        with pytest.raises(StoreError, match="open in this process"):
            repair_session(st, SID)


def test_a_plan_that_does_not_read_back_changes_nothing(tmp_path, monkeypatch):
    """The new log is opened and projected from a staging directory before it replaces anything."""
    from agentsession_cas.backends.files import repair as repair_module

    root = tmp_path / "store"
    build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    real = repair_module.build_log

    def broken(report, name):  # loses an append: the replay no longer matches the plan
        data = real(report, name)
        lines = data.split(b"\n")
        i = next(i for i, ln in enumerate(lines) if b'"op":"append"' in ln)
        return b"\n".join(lines[:i] + lines[i + 1 :])

    monkeypatch.setattr(repair_module, "build_log", broken)
    before = files(root / "sessions")
    with pytest.raises(StoreError, match="does not read back"):
        repair_session(Store(root), SID)
    assert files(root / "sessions") == before
    assert os.listdir(root / "tmp") == []


def test_a_repair_interrupted_before_the_rename_is_finished_by_the_next(tmp_path, monkeypatch):
    root = tmp_path / "store"
    ids = build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    damaged = log_path(root).read_bytes()

    def fail(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        repair_session(Store(root), SID)
    monkeypatch.undo()
    assert log_path(root).read_bytes() == damaged and len(asides(root)) == 1
    report = repair_session(Store(root), SID)
    assert report.repaired and len(asides(root)) == 1  # the copy already kept is reused
    assert_healthy(root, ids)


# -- the command ---------------------------------------------------------------------------------


def test_on_a_terminal_it_asks_and_a_no_writes_nothing(tmp_path, monkeypatch):
    root = tmp_path / "store"
    ids = build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    monkeypatch.setattr(repair_command, "_on_terminal", lambda: True)
    before = files(root / "sessions")
    r = cli(root, "repair", SID, input="n\n")
    assert r.exit_code == 1 and "Rewrite the log of session s1" in r.stderr
    assert "kept     6 entries" in r.stderr and "cancelled; nothing written" in r.stderr
    assert r.stdout == ""
    r = cli(root, "repair", "--json", SID, input="\n")  # the default answer is no
    assert r.exit_code == 1 and json.loads(r.stdout)["cancelled"] is True
    assert files(root / "sessions") == before
    r = cli(root, "repair", SID, input="y\n")
    assert r.exit_code == 0 and r.stdout.startswith("repaired; the damaged log is kept as ")
    assert len(r.stdout.splitlines()) == 1  # the plan was shown before the question
    assert_healthy(root, ids)


@pytest.mark.parametrize("damage", ["garbled line", "cut log"])
def test_a_no_writes_nothing_when_the_header_file_is_lost_too(tmp_path, monkeypatch, damage):
    """A session whose header file is gone and whose log is damaged (a garbled line; or a
    log cut at a record boundary, which reads line by line but HEAD names an entry it
    lost): repair plans from the header the log holds, in memory, and writes the file only
    with the rest, after the confirmation. A no leaves the session and tmp/ as they were;
    it wrote the header back before it asked (and said "nothing written")."""
    root = tmp_path / "store"
    ids = build(root)
    if damage == "garbled line":
        flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    else:  # (the entry HEAD names is taken back from objects/)
        start = line_of(root, "append", 5)[0]
        log_path(root).write_bytes(log_path(root).read_bytes()[:start])
    header = root / "sessions" / SID / "header"
    held = header.read_bytes()
    header.unlink()
    before = files(root)
    asked: list = []
    with Store(root) as st:
        rep = repair_session(st, SID, confirm=lambda plan: asked.append(plan) or False)
    assert rep.cancelled and not rep.indexes_fixed and [p.damaged for p in asked] == [True]
    assert ("header", None, held.decode().strip()) in asked[0].stale_indexes
    assert files(root) == before and not header.exists() and os.listdir(root / "tmp") == []
    monkeypatch.setattr(repair_command, "_on_terminal", lambda: True)
    r = cli(root, "repair", SID, input="n\n")
    assert r.exit_code == 1 and "cancelled; nothing written" in r.stderr and files(root) == before
    with Store(root) as st:
        rep = repair_session(st, SID, confirm=lambda plan: True)
    assert rep.repaired and rep.indexes_fixed and header.read_bytes() == held
    assert_healthy(root, ids)


def test_yes_skips_the_question(tmp_path, monkeypatch):
    root = tmp_path / "store"
    build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    monkeypatch.setattr(repair_command, "_on_terminal", lambda: True)
    r = cli(root, "repair", "--yes", SID, input="")
    assert r.exit_code == 0 and "Rewrite the log" not in r.stderr
    assert r.stdout.splitlines()[-1].startswith("repaired; the damaged log is kept as ")


def test_without_a_terminal_it_proceeds_and_prints_what_it_did(tmp_path):
    root = tmp_path / "store"
    ids = build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    r = cli(root, "repair", SID)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("session  s1: log line 6")
    assert "refuses writes" not in lines[0]
    assert any(ln.startswith(f"recovered {ids[2]} seq 3: salvaged from damaged line 6") for ln in lines)
    assert any(ln.startswith(f"head     {ids[-1]}, as the log last named it") for ln in lines)
    assert "mark     record" in lines
    assert lines[-1].startswith(f"repaired; the damaged log is kept as {root}/sessions/s1/{DAMAGED_PREFIX}")


def test_command_errors(tmp_path):
    root = tmp_path / "store"
    build(root)
    r = cli(root, "repair")
    assert r.exit_code == 2
    r = cli(root, "repair", "nosuch")
    assert r.exit_code == 1 and "no such session: nosuch" in r.stderr
    r = cli(root, "repair", "../x")
    assert r.exit_code == 1 and "not usable" in r.stderr


def test_the_damage_message_names_the_repair_command(tmp_path):
    root = tmp_path / "store"
    build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    with pytest.raises(SessionDamagedError, match=r"run `agentsession --store \S+ repair s1`"):
        Store(root).session(SID)


def test_plan_reads_only_and_works_on_a_read_only_store(tmp_path):
    root = tmp_path / "store"
    build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    before = files(root)
    plan = plan_repair(Store(root, readonly=True), SID)
    assert plan.damaged and not plan.repaired and len(plan.kept) == 6
    assert files(root) == before


def test_progress_only_on_a_terminal_and_never_under_json(tmp_path, monkeypatch):
    root = tmp_path / "store"
    ids = build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    monkeypatch.setattr(terminal, "isatty", lambda stream: True)  # a terminal, and every operation slow
    monkeypatch.setattr(terminal, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(terminal, "PROGRESS_EVERY", 0.0)
    r = cli(root, "repair", "--dry-run", "--json", SID)
    assert r.exit_code == 0 and r.stderr == ""
    r = cli(root, "repair", "--dry-run", SID)
    assert r.exit_code == 0 and "\rrepair: " in r.stderr.replace("\x1b[K", "")
    assert r.stderr.replace("\x1b[K", "").endswith("\r")  # cleared at the end
    monkeypatch.setattr(terminal, "isatty", lambda stream: False)  # a pipe
    r = cli(root, "repair", "--dry-run", SID)
    assert r.exit_code == 0 and r.stderr == ""
    monkeypatch.setattr(terminal, "isatty", lambda stream: True)
    r = cli(root, "repair", "--json", SID)
    assert r.exit_code == 0 and r.stderr == "" and json.loads(r.stdout)["repaired"]
    assert_healthy(root, ids)


def test_an_error_after_progress_is_not_written_over_it(tmp_path, monkeypatch):
    """The phase line is taken away before the error line is printed."""
    from agentsession_cas.backends.files import repair as repair_module

    root = tmp_path / "store"
    build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    monkeypatch.setattr(terminal, "isatty", lambda stream: True)  # a terminal, and every operation slow
    monkeypatch.setattr(terminal, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(terminal, "PROGRESS_EVERY", 0.0)

    monkeypatch.setenv("NO_COLOR", "1")  # the placement of the lines is checked, not their colour

    def broken(report, name):
        raise StoreError("the log the repair built does not read back (a test)")

    monkeypatch.setattr(repair_module, "_check_staged", lambda *a: broken(None, None))
    r = cli(root, "repair", "--yes", SID)
    assert r.exit_code == 1
    err = r.stderr.replace("\x1b[K", "")
    assert err.startswith("\rrepair: ")
    assert err.endswith("\ragentsession: error: the log the repair built does not read back (a test)\n")


def test_the_plan_names_every_entry_it_keeps(tmp_path):
    """A damaged log cannot be listed with `log ID`; the dry run's JSON says which entries
    would be kept, with their sequence numbers, and the repair then keeps exactly those."""
    root = tmp_path / "store"
    ids = build(root, n=6, checkpointed=False)
    start, end, _ = line_of(root, "append", 3)
    zero_line(root, start, end)
    plan = json.loads(cli(root, "repair", "--dry-run", "--json", SID).stdout)
    assert [k["entry"] for k in plan["kept_entries"]] == ids[:3] and plan["kept"] == 3
    assert repair_json(root, "--yes")["kept_entries"] == plan["kept_entries"]
    session = Store(root, readonly=True).read(SID)
    assert [{"entry": e, "seq": session.own[e]} for e in session.log_order] == plan["kept_entries"]
    whole = repair_json(root)  # not damaged now: what it holds, all the same
    assert whole["damaged"] is False and whole["kept_entries"] == plan["kept_entries"]


def test_repair_rewrites_an_index_file_stale_by_one_stray_byte(tmp_path):
    """HEAD or mark whose value is right but whose final newline was damaged: fsck
    calls it stale (it compares bytes), so repair must rewrite it too; it said
    'not damaged' and the fsck error stayed (issue 16)."""
    from click.testing import CliRunner

    from agentsession_cas import Header
    from agentsession_cas.maintenance.fsck import fsck
    from agentsession_cli.main import main

    root = tmp_path / "store"
    with Store.init(root) as st:
        s = st.create(Header.new("s"))
        s.append({"type": "config", "model": "m", "ts": "2026-10-05T12:00:00Z"})
        s.close()
    for name in ("HEAD", "mark"):
        path = root / "sessions" / "s" / name
        good = path.read_bytes()
        path.write_bytes(good[:-1] + b"\x0b")
        report = fsck(root)
        assert [p.code for p in report.errors] == ["stale-head" if name == "HEAD" else "stale-mark"]
        assert "\\x0b" in str(report.errors[0]) or "\x0b" in str(report.errors[0])
        r = CliRunner().invoke(main, ["--store", str(root), "repair", "--yes", "s"])
        assert r.exit_code == 0, r.output
        assert path.read_bytes() == good
        assert fsck(root).ok


def test_a_whole_log_whose_object_is_lost_everywhere_is_not_called_fine(tmp_path):
    """A log that reads whole, an entry's envelope corrupt in objects/ and no copy in the
    log (an import's appends carry none): repair has nothing to rewrite, and says so,
    but not as if the session were sound: it names the object it cannot restore, and
    where to look. Nothing is written."""
    from click.testing import CliRunner

    from agentsession_cli.main import main

    root = tmp_path / "store"
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "basic.jsonl"
    assert CliRunner().invoke(main, ["--store", str(root), "init"]).exit_code == 0
    sid = CliRunner().invoke(main, ["--store", str(root), "import", str(fixture)]).stdout.strip()
    ids = [json.loads(line)["id"] for line in fixture.read_text().splitlines()[1:]]
    env = root / "objects" / "entries" / ids[1][7:9] / ids[1][9:]
    env.write_bytes(env.read_bytes().replace(b"item", b"itex"))
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "locks" not in p.parts}
    r = CliRunner().invoke(main, ["--store", str(root), "repair", "--yes", sid])
    assert r.exit_code == 0, r.output
    assert "nothing to repair" not in r.stdout
    assert f"entries {ids[1]}: missing or corrupt in objects/, and no copy in the log" in r.stdout
    assert f"verify {sid}" in r.stdout
    r = CliRunner().invoke(main, ["--store", str(root), "repair", "--json", "--dry-run", sid])
    out = json.loads(r.stdout)
    assert out["damaged"] is False and out["unrestorable"] == [{"space": "entries", "name": ids[1]}]
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "locks" not in p.parts} == before


def test_a_head_index_naming_an_entry_found_nowhere_is_not_said_to_have_lost_entries(tmp_path):
    """A byte of HEAD changed: it names an entry no record holds and no object proves.
    Repair keeps every entry (the log was whole) and says what it cannot tell (HEAD
    itself damaged, or records lost with their objects), not that entries were lost."""
    root = tmp_path / "store"
    ids = build(root)
    head = root / "sessions" / SID / "HEAD"
    good = head.read_bytes()
    head.write_bytes(good[:20] + (b"0" if good[20:21] != b"0" else b"1") + good[21:])  # still a hash
    out = repair_json(root, "--yes")
    assert [e["entry"] for e in out["kept_entries"]] == ids and out["dropped"] == []
    [note] = [n["message"] for n in out["notes"] if n["message"].startswith("HEAD names")]
    assert "lost" not in note.split(":")[0] and "entries between are lost" not in note, note
    assert "HEAD itself may be damaged" in note
    assert head.read_bytes() == good
    assert_healthy(root, ids)


def test_a_damaged_envelope_in_a_payload_is_not_taken_for_another_entry(tmp_path):
    """A flipped member name inside an append's payload envelope ("parent" -> "pasent")
    leaves a JSON object that hashes to some name: it is no envelope (its members are
    not an envelope's), so repair never salvages it as an entry of its own, and the
    append whose record still reads keeps its place (its objects are sound in objects/)."""
    root = tmp_path / "store"
    ids = build(root)
    start, end, raw = line_of(root, "append", 2)
    at = raw.rindex(b'"parent":')
    flip(root, start + at + 4)  # "parent" -> "pasent" (bit 1 of 'r')
    out = repair_json(root, "--yes")
    assert all(r["how"] != "salvaged" or r["entry"] in ids for r in out["recovered"]), out["recovered"]
    assert out["dropped"] == []
    assert_healthy(root, ids)


@pytest.mark.parametrize("checkpointed", [True, False], ids=["objects-written", "payload-only"])
@pytest.mark.parametrize("member", ["ts", "type"])
def test_a_damaged_envelope_that_still_reads_as_one_is_not_taken_for_an_entry(tmp_path, member, checkpointed):
    """A flip inside a value of an append's payload envelope (a digit of its ``ts``, a
    letter of its ``type``) leaves an envelope as well formed as before, hashing to a name
    no record gives: an entry nobody wrote. Where the line's record still reads (it names
    the real entry), that envelope is the damage: repair never keeps it as a recovered
    entry (it did, or failed its own read-back on the type), and keeps the real entry
    where its objects are whole elsewhere, else drops it and what hangs from it."""
    root = tmp_path / "store"
    ids = build(root, checkpointed=checkpointed)
    start, _, raw = line_of(root, "append", 2)
    at = raw.rindex(b'"ts":"') + len(b'"ts":"') + 3 if member == "ts" else raw.rindex(b'"type":"') + len(b'"type":"')
    flip(root, start + at)  # "2026" -> "2027"; "item" -> "htem"
    out = repair_json(root, "--yes")
    assert out["repaired"], out
    assert all(r["entry"] in ids for r in out["recovered"]), out["recovered"]
    if checkpointed:
        assert out["dropped"] == []
        assert_healthy(root, ids)
    else:
        assert [(d["entry"], d["reason"]) for d in out["dropped"]][0] == (ids[2], "objects-missing")
        assert {d["entry"] for d in out["dropped"]} == set(ids[2:])
        assert_healthy(root, ids[:2])


def test_envelope_defect_names_what_is_wrong():
    from agentsession_cas.format.hashing import envelope_defect

    h = "sha256:" + "a" * 64
    good = {"content": h, "parent": None, "ts": "2026-01-01T00:00:00Z", "type": "item"}
    assert envelope_defect(good) is None and envelope_defect({**good, "parents": [{"entry": h}]}) is None
    assert "lacks parent" in envelope_defect({k: v for k, v in good.items() if k != "parent"})
    assert "pasent" in envelope_defect({**{k: v for k, v in good.items() if k != "parent"}, "pasent": h, "parent": None})
    assert envelope_defect({**good, "content": "x"}) and envelope_defect({**good, "parents": []}) and envelope_defect([1])


def test_the_plan_gives_its_notes_coded(tmp_path):
    """`repair --json` prints its notes as objects of the shared problem shape (code,
    severity note, where, line, entry, message, and the session), as fsck, pack and sweep
    print theirs; they were bare strings. A rebuilt create record is `create-rebuilt`,
    a second create record fsck's `log-order`."""
    root = tmp_path / "store"
    build(root)
    start, _, raw = line_of(root, "create", 0)
    flip(root, start + raw.index(b'"op"') + 2)
    plan = repair_json(root, "--dry-run")
    assert plan["notes"] and all(isinstance(n, dict) for n in plan["notes"]), plan["notes"]
    for n in plan["notes"]:
        assert {"code", "severity", "where", "line", "entry", "message", "session"} <= set(n), n
        assert n["severity"] == "note" and n["session"] == SID
    assert [n["code"] for n in plan["notes"]] == ["create-rebuilt"]
    r = cli(root, "repair", "--dry-run", SID)
    assert "note     create-rebuilt: the create record is damaged" in r.stdout, r.stdout


@pytest.mark.parametrize("how", ["garbled", "another header"])
def test_a_header_file_that_differs_from_the_log_is_written_again_from_it(tmp_path, how):
    """The log holds the header (its create record): a header file that is not JSON, or
    that says something else, is a stale index of it (fsck's `stale-header`), served
    from the log already; repair writes it again from the log, as it does a lost one,
    says what the file said, and fsck is then clean. The session's log is untouched."""
    from agentsession_cas.maintenance.fsck import fsck

    root = tmp_path / "store"
    ids = build(root)
    path = root / "sessions" / SID / "header"
    good = path.read_bytes()
    if how == "garbled":
        path.write_bytes(b"{not json\n")
    else:
        path.write_bytes(good.replace(b'"type":"session"', b'"title":"edited","type":"session"'))
    assert [p.code for p in fsck(root).warnings] == ["stale-header"]
    log = log_path(root).read_bytes()
    plan = repair_json(root, "--dry-run")
    assert plan["damaged"] is False
    [stale] = plan["stale_indexes"]
    assert stale["file"] == "header" and stale["log"] == good.decode().strip() and stale["said"] != stale["log"]
    out = repair_json(root, "--yes")
    assert out["indexes_fixed"] and path.read_bytes() == good and log_path(root).read_bytes() == log
    report = fsck(root)
    assert report.ok and not report.warnings, [str(p) for p in report.problems]
    assert_healthy(root, ids)


def test_a_repairs_plan_a_kill_left_in_tmp_stops_no_sweep(tmp_path):
    """A repair of a session whose header file is lost plans from links to its files in
    ``tmp/repair-plan-*``; a kill there leaves them, the damaged log among them. That is
    no stage a sweep must honour (the session's own log is read as the session): the
    sweep goes on (it refused for good, the session repaired or not); the leftover goes
    once old, as any in tmp/."""
    root = tmp_path / "st"
    build(root)
    flip(root, line_of(root, "append", 2)[0] + RECORD + 3)
    left = root / "tmp" / "repair-plan-s1-1-00000000"
    left.mkdir(parents=True)
    os.link(log_path(root, SID), left / "log")
    (left / "header").write_bytes((root / "sessions" / SID / "header").read_bytes())
    assert cli(root, "repair", "--yes", SID).exit_code == 0
    r = cli(root, "sweep", "--grace", "0")
    assert r.exit_code == 0, r.output


def test_repair_of_a_lost_header_session_named_by_a_prefix(tmp_path):
    """``repair PREFIX`` of a session whose header file is lost repairs it, as its full id
    does: the prefix resolves to it (its damage), and the repair takes the id it names."""
    root = tmp_path / "st"
    build(root, sid="session-alpha")
    build(root, sid="other-1")
    (root / "sessions" / "session-alpha" / "header").unlink()
    r = cli(root, "repair", "--dry-run", "sess")
    assert r.exit_code == 0 and "session-alpha" in r.output, r.output
    assert cli(root, "repair", "--yes", "sess").exit_code == 0
    assert (root / "sessions" / "session-alpha" / "header").exists()
    assert cli(root, "verify", "session-alpha").exit_code == 0


def test_a_lost_header_repair_beside_an_index_that_is_no_file(tmp_path):
    """A session file that is no regular file (a directory where ``summary`` goes) is left
    out of the plan's links, as the open leaves it: the repair writes the header back."""
    root = tmp_path / "st"
    build(root)
    sdir = root / "sessions" / SID
    (sdir / "header").unlink()
    if (sdir / "summary").exists():
        (sdir / "summary").unlink()
    (sdir / "summary").mkdir()
    r = cli(root, "repair", "--yes", SID)
    assert r.exit_code == 0, r.output
    assert (sdir / "header").exists()
