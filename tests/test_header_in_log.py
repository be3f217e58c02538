"""The log holds the session's header (its create record, then a header record at each
change), so the header file is an index: a flipped, foreign or unparsable header file is
never served, fsck warns of it, a writing open rewrites it, and repair takes the log's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header
from agentsession_cas.backends.files.log import header_of, read_log
from agentsession_cas.format.canonical import canonical_bytes
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from agentsession_cli.main import main


def msg(text: str) -> dict:
    return {"type": "item", "item": {"type": "message", "role": "user", "content": text}, "ts": "2026-01-01T00:00:00Z"}


def make(root: Path, big: bool = False) -> bytes:
    st = Store.init(root)
    s = st.create(Header.new("s1", harness={"name": "h", "version": "1"}, cwd="/w/é"))
    for i in range(60 if big else 3):
        s.append(msg(f"m{i}" + ("x" * 2000 if big else "")))
    st.close()
    return (root / "sessions" / "s1" / "header").read_bytes()


@pytest.mark.parametrize("big", [False, True], ids=["plain-log", "compacted-log"])
def test_the_log_holds_the_header(tmp_path, big):
    root = tmp_path / "store"
    header = make(root, big)
    records = read_log((root / "sessions" / "s1" / "log").read_bytes(), expand=False).records
    assert records[0].data["header"]["id"] == "s1"
    assert canonical_bytes(header_of(records)) + b"\n" == header


@pytest.mark.parametrize("damage", ["flip", "foreign", "unparsable", "empty"])
def test_a_damaged_header_file_is_never_served_and_is_rewritten(tmp_path, damage):
    root = tmp_path / "store"
    header = make(root)
    path = root / "sessions" / "s1" / "header"
    if damage == "flip":
        path.write_bytes(header.replace(b'"h"', b'"H"'))
    elif damage == "foreign":
        path.write_bytes(header.replace(b'"s1"', b'"s2"'))
    elif damage == "unparsable":
        path.write_bytes(b'{"type":"sess')
    else:
        path.write_bytes(b"")
    export = CliRunner().invoke(main, ["--store", str(root), "export", "s1"])
    assert export.exit_code == 0, export.output
    assert export.stdout_bytes.split(b"\n", 1)[0] + b"\n" == header
    # read alone (refs name a session's incarnation by it): the log's too, never the file's
    with Store(root, readonly=True) as st:
        assert canonical_bytes(st.header("s1").data) + b"\n" == header
    report = fsck(root)
    assert [p.code for p in report.warnings] == ["stale-header"] and not report.errors
    with Store(root) as st:
        s = st.session("s1")
        assert any(n.code == "stale-header" and "header file differs" in n.message for n in s.recovered)
    assert path.read_bytes() == header
    assert fsck(root).ok and not fsck(root).warnings


def test_a_header_change_is_logged_and_survives_a_stale_file(tmp_path):
    """A header raised by exchange (a later format) is a header record: the file written
    after it may be lost, and the log's newer header is what is served."""
    root = tmp_path / "store"
    old = make(root)
    with Store(root) as st:
        s = st.session("s1")
        data = dict(s.header.data, title_hint="newer")
        s.log.set_header(canonical_bytes(data) + b"\n")
    path = root / "sessions" / "s1" / "header"
    new = path.read_bytes()
    assert b"newer" in new
    recs = read_log((root / "sessions" / "s1" / "log").read_bytes()).records
    assert [r.op for r in recs][-2:] == ["header", "commit"]
    path.write_bytes(old)  # as if the file's rename was lost
    ro = Store(root, readonly=True).read("s1")
    assert ro.header.data.get("title_hint") == "newer"


def test_repair_takes_the_header_from_the_log(tmp_path):
    root = tmp_path / "store"
    header = make(root)
    (root / "sessions" / "s1" / "header").write_bytes(b"garbage")
    log = root / "sessions" / "s1" / "log"
    lines = log.read_bytes().split(b"\n")
    bad = bytearray(lines[2])
    bad[40] ^= 1
    lines[2] = bytes(bad)
    log.write_bytes(b"\n".join(lines))
    r = CliRunner().invoke(main, ["--store", str(root), "repair", "s1", "--yes", "--json"])
    assert r.exit_code == 0, r.output
    assert (root / "sessions" / "s1" / "header").read_bytes() == header
    assert fsck(root).ok
    assert json.loads(r.stdout)["session"] == "s1"
