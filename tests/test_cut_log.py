"""A session log cut short at a record boundary: committed appends gone, every remaining
record sound, HEAD still naming the last entry.

A checksum per record cannot see this; the head index can. HEAD is written only after
the log is committed, so it may lag the log but never lead it: an index naming an entry
the log does not hold means committed records were lost. ``verify`` and ``fsck`` report
it, the session refuses writes (no append may reuse the lost sequence numbers or rewrite
HEAD over the evidence), and ``repair`` takes back every entry HEAD proves through the
objects, with sequence numbers after every one the log ever used.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, make_entry
from agentsession_cas.errors import SessionDamagedError
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.maintenance.repair import repair_session
from agentsession_cas.store import Store
from agentsession_cli.main import main
from storetools import line_body

SID = "cut"


def item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def build(root: Path, n: int = 5) -> tuple[list[str], list[bytes]]:
    """A session of ``n`` continued durable appends, closed (objects checkpointed);
    returns the entry ids and the log's lines."""
    with Store.init(root) as st:
        s = st.create(Header.new(SID))
        ids = [s.append(make_entry("item", s.head, item=item(f"entry {i}")).data).id for i in range(n)]
    lines = (root / "sessions" / SID / "log").read_bytes().splitlines(keepends=True)
    return ids, lines


def cli(root: Path, *args: str, input: str | None = None):
    return CliRunner().invoke(main, ["--store", str(root), *args], input=input)


def kept_appends(lines: list[bytes]) -> list[str]:
    out = []
    for line in lines:
        body = json.loads(line_body(line).split(b"\t", 1)[0])
        if body["op"] == "append":
            out.append(body["entry"])
    return out


def test_every_record_boundary_cut(tmp_path):
    ids, lines = build(tmp_path / "template")
    assert (tmp_path / "template" / "sessions" / SID / "HEAD").read_text().strip() == ids[-1]
    damaged_cuts = 0
    for k in range(1, len(lines)):
        root = tmp_path / f"cut{k}"
        _copy_store(tmp_path / "template", root)
        (root / "sessions" / SID / "log").write_bytes(b"".join(lines[:k]))
        left = kept_appends(lines[:k])
        if ids[-1] in left:
            # Only records after the last append went (its commit, a checkpoint): nothing
            # HEAD names is missing, and the session opens (an uncommitted tail at worst).
            with Store(root) as st:
                assert st.session(SID).log_order == ids
            continue
        damaged_cuts += 1
        # verify reports it, naming the loss
        r = cli(root, "verify", SID)
        assert r.exit_code == 1 and "lost committed records" in r.output, (k, r.output)
        # fsck reports it, naming HEAD
        report = fsck(root)
        assert not report.ok and [p.code for p in report.errors] == ["log-cut"], (k, report.errors)
        assert report.errors[0].file == f"sessions/{SID}/HEAD"
        # no write: an append is refused, and nothing in the session changed
        before = {p.name: p.read_bytes() for p in (root / "sessions" / SID).iterdir()}
        with Store(root) as st, pytest.raises(SessionDamagedError):
            st.session(SID)
        r = cli(root, "append", SID, input=json.dumps({"type": "item", "item": item("more")}))
        assert r.exit_code == 1 and "repair" in r.output
        assert {p.name: p.read_bytes() for p in (root / "sessions" / SID).iterdir()} == before
        # repair takes back every entry HEAD proves, and the sequence goes on after them
        with Store(root) as st:
            report_r = repair_session(st, SID)
        assert report_r.repaired
        assert [x.entry for x in report_r.recovered] == ids[len(left):]
        assert all(x.how == "head" for x in report_r.recovered)
        with Store(root) as st:
            s = st.session(SID)
            assert s.log_order == ids and s.head == ids[-1]
            res = s.append(make_entry("item", s.head, item=item("after repair")).data)
            assert res.seq == len(ids) + 1 and res.outcome == "continued"
        assert fsck(root).ok
        assert cli(root, "verify", SID).exit_code == 0
    last_append = max(i for i, line in enumerate(lines) if kept_appends([line]))
    assert damaged_cuts == last_append  # every cut before the last append's line


def test_a_lagging_head_index_is_no_damage(tmp_path):
    """HEAD behind the log (a crash before the index was rewritten) is what a lag looks
    like: the session opens and rewrites it."""
    root = tmp_path / "store"
    ids, _ = build(root)
    (root / "sessions" / SID / "HEAD").write_text(ids[1] + "\n")
    with Store(root) as st:
        assert st.session(SID).head == ids[-1]
    assert (root / "sessions" / SID / "HEAD").read_text().strip() == ids[-1]


def test_an_unreadable_head_index_is_rebuilt_not_damage(tmp_path):
    root = tmp_path / "store"
    ids, _ = build(root)
    (root / "sessions" / SID / "HEAD").write_bytes(b"\x00garbage\n")
    with Store(root) as st:
        assert st.session(SID).head == ids[-1]


def _copy_store(src: Path, dst: Path) -> None:
    import shutil

    shutil.copytree(src, dst)


def _cut_after_and_repair(root: Path, entry: str):
    """Cut the session's log just after the line appending ``entry``, then repair it."""
    log = root / "sessions" / SID / "log"
    lines = log.read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if kept_appends([line]) == [entry]) + 1
    log.write_bytes(b"".join(lines[:cut]))
    with Store(root) as st:
        return repair_session(st, SID)


def test_a_cut_that_took_a_branch_gives_no_number_of_it_again(tmp_path):
    """A(1), B(2) off A, C(3) off A (the head); the log cut after A's append. HEAD proves
    C, not B, and B's number was given out: C comes back numbered after every number the
    summary says the log spent (4), never as 2 (B's); the next append takes 5. When the
    entries HEAD proves are exactly the numbers lost (the linear cut of
    test_every_record_boundary_cut), they take those numbers back."""
    root = tmp_path / "s"
    with Store.init(root) as st:
        s = st.create(Header.new(SID))
        a = s.append(make_entry("item", None, item=item("a")).data).id
        b = s.append(make_entry("item", a, item=item("b")).data)
        c = s.append(make_entry("item", a, item=item("c")).data)
        s.set_head(c.id, expected=b.id)
        assert (b.seq, c.seq) == (2, 3) and s.head == c.id
    report = _cut_after_and_repair(root, a)
    assert [(x.entry, x.how, x.seq) for x in report.recovered] == [(c.id, "head", 4)]
    assert report.seq == 4
    with Store(root) as st:
        s = st.session(SID)
        assert s.head == c.id
        assert s.append(make_entry("item", s.head, item=item("after")).data).seq == 5
    assert fsck(root).ok


def test_a_summary_older_than_the_log_gives_no_lost_number_again(tmp_path):
    """The summary is written at a close: a writer that appended after it and died left it
    older than the log. A(1), B(2) off A, closed (the summary says 2, last B); then C(3)
    off A as the head, and no close; the log cut after A. C is one entry for the one
    number the summary says was lost, but that number was B's: the summary's last entry
    is not HEAD's, so C is numbered after it (reviewer V9)."""
    root = tmp_path / "s"
    with Store.init(root) as st:
        s = st.create(Header.new(SID))
        a = s.append(make_entry("item", None, item=item("a")).data).id
        b = s.append(make_entry("item", a, item=item("b")).data)
    summary = (root / "sessions" / SID / "summary").read_bytes()
    with Store(root) as st:
        s = st.session(SID)
        c = s.append(make_entry("item", a, item=item("c")).data)
        s.set_head(c.id, expected=b.id)
        s.commit()
    (root / "sessions" / SID / "summary").write_bytes(summary)  # as if the writer died before its close
    report = _cut_after_and_repair(root, a)
    assert [(x.entry, x.how) for x in report.recovered] == [(c.id, "head")]
    assert report.recovered[0].seq == 3 and report.seq == 3
