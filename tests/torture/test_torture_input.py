"""Hostile input (issue 16): names that look like paths or carry NUL, newlines, 10,000
characters or non-ASCII; entries of 10 MB, nesting 100,000 deep, a million members,
invalid UTF-8, a BOM, CRLF, duplicate keys, NaN. Each is a one-line error naming the
rule, in bounded memory, the store unchanged; a valid 10 MB entry round-trips."""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from damage import invoke, is_traceback

from agentsession_cas import Header
from agentsession_cas.format.names import is_session_id

TS = "2026-10-05T12:00:00Z"

NAMES = [
    "../../etc/passwd", "/etc/passwd", "a/../../b", "..", ".", "x\x00y", "x\ny", "é-session", "x" * 10_000,
    "sha256:../../" + "0" * 58, "sha256:" + "0" * 63 + "\n", "sha256:" + "G" * 64, "-rf", "",
]


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    out = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath) / name
            if name.endswith(".lock") or name == "summary":
                # lock files are made empty by any writing open and hold nothing; a summary is
                # an index a writing open rebuilds when its log's identity (inode) differs, as
                # a copied store's does (compared through `list` instead)
                continue
            out[str(p.relative_to(root))] = (p.stat().st_size, p.read_bytes())
    return out


def one_line_error(r) -> str:
    assert not is_traceback(r), (r.exception, r.output[-500:])
    assert r.exit_code != 0, r.output[:300]
    err = [ln for ln in r.output.splitlines() if ln.startswith("agentsession: error") or ln.startswith("Error")]
    assert err, r.output[-500:]
    assert len(err[0]) < 2000, err[0][:300]  # the input is not echoed whole
    return err[0]


@pytest.mark.parametrize("name", NAMES, ids=lambda n: repr(n[:20]))
def test_hostile_names_are_refused_in_one_line_and_change_nothing(store, name):
    root, info = store
    before = tree(root)
    for cmd in (("show", name), ("export", name), ("log", name), ("head", name), ("delete", name), ("repair", "--yes", name),
                ("cat-object", name), ("ref", "show", name), ("ref", "update", name, "rec"), ("create", "--id", name)):
        r = invoke(root, *cmd)
        if cmd[0] == "create" and is_session_id(name):
            assert r.exit_code == 0  # a strange but valid id ("-rf"): made as asked, nothing else
            continue
        one_line_error(r)
    if is_session_id(name):
        invoke(root, "delete", "--", name)
    assert tree(root) == before


def hostile_lines() -> dict[str, bytes]:
    item = {"type": "item", "ts": TS, "item": {"type": "message", "role": "user", "content": "x"}}
    line = json.dumps(item).encode()
    return {
        "10 MB string in a bad place": b'{"type":"item","ts":"' + b"9" * (10 << 20) + b'"}',
        "nesting 100,000 deep": b'{"type":"item","ts":"' + TS.encode() + b'","item":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "a million members": b'{"type":"item","ts":"' + TS.encode() + b'","item":{' + b",".join(b'"k%d":0' % i for i in range(1_000_000)) + b"}}",
        "invalid UTF-8": line.replace(b'"x"', b'"\xff\xfe"'),
        "BOM": b"\xef\xbb\xbf" + line,
        "CRLF": line + b"\r\n",
        "duplicate keys": line[:-1] + b',"type":"config"}',
        "NaN": line.replace(b'"x"', b"NaN"),
        "lone surrogate": line.replace(b'"x"', b'"\\ud800"'),
        "huge number": line.replace(b'"x"', b"1" + b"0" * 5000),
    }


#: Hostile in size or shape but admitted by the format.
VALID = {"a million members", "CRLF"}


@pytest.mark.parametrize("what", list(hostile_lines()))
def test_hostile_entries_are_refused_in_one_line_and_change_nothing(store, what):
    root, info = store
    data = hostile_lines()[what]
    before = tree(root)
    listed = invoke(root, "list").stdout_bytes
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = _append(root, data)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    assert grown < 1024 * 1024, f"{what}: memory grew by {grown // 1024} MiB"  # KiB
    if what in VALID:
        # The format admits it (RFC 0001 sets no bound on members; JSON whitespace may end
        # an object given on stdin): the store admits what verify accepts.
        assert r.exit_code == 0, r.output[-300:]
        return
    err = one_line_error(r)
    assert tree(root) == before, f"{what}: the store changed ({err})"
    assert invoke(root, "list").stdout_bytes == listed


def _append(root: Path, data: bytes):
    from click.testing import CliRunner

    from agentsession_cli.main import main

    return CliRunner().invoke(main, ["--store", str(root), "append", "rec"], input=data)


def hostile_files() -> Iterator[tuple[str, bytes, bytes]]:
    """(what, the line, a session file holding it) for each line the format refuses: the
    file's header is sound, so an import reads as far as the line (line 2) to refuse it."""
    header = Header.new("imp", created_at="2026-10-05T12:00:00Z").canonical_line()
    for what, data in hostile_lines().items():
        if what not in VALID:
            yield what, data, header + data + b"\n"


def test_hostile_session_files_are_refused_by_import(store, tmp_path):
    root, info = store
    before = tree(root)
    for what, _, data in hostile_files():
        path = tmp_path / "in.jsonl"
        path.write_bytes(data)
        r = invoke(root, "import", str(path))
        assert "line 1" not in one_line_error(r), what  # refused at the hostile line, not at the header
        assert tree(root) == before, what
    for name in NAMES[:8]:
        path = tmp_path / "named.jsonl"
        path.write_bytes(json.dumps({"format": "agent-session/1", "id": name, "created_at": TS}).encode() + b"\n")
        r = invoke(root, "import", str(path))
        one_line_error(r)
        assert tree(root) == before, name


def test_a_valid_10mb_entry_round_trips(store):
    root, info = store
    text = "y" * (10 << 20)
    item = {"type": "item", "ts": TS, "item": {"type": "message", "role": "user", "content": text}}
    r = _append(root, json.dumps(item).encode())
    assert r.exit_code == 0, r.output[-500:]
    eid = r.output.strip().splitlines()[-1]
    out = invoke(root, "export", "rec")
    assert out.exit_code == 0
    last = json.loads(out.stdout_bytes.splitlines()[-1])
    assert last["id"] == eid and last["item"]["content"] == text
    assert invoke(root, "fsck").exit_code == 0
