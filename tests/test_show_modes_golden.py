"""What every mode of ``show`` prints, pinned byte for byte (issue 11: show streams): ``--json``,
``--runs``, ``--graph`` (text and ``--json``), ``--leaf`` (text and ``--json``) and the plain text,
of session files and of the same sessions stored, for the project's fixtures, a generated
coding-agent session, files a reader reports problems in (truncated, a line damaged, a line
lost), a file of a format before hashed ids (migrated in memory) and, when it is there, the
reference corpus. Scripts parse ``--json``: a change to how show reads a session must print
the same bytes. Regenerate (``AGENTSESSION_GOLDEN=write``) only for a change meant to alter
the output, and read the diff. (The plain text of a stored session is pinned by
test_show_golden.py.)"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header
from agentsession_cas.format.reader import read_session
from agentsession_cas.store import Store
from agentsession_cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
from bench_verify import generate
from test_cli_store import LEGACY_LINES

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden" / "show-modes"
CORPUS = REPO.parent / "shared" / "corpus" / "sessions"
FIXTURES = ["basic", "branches", "extensions", "root-leaf", "fork-origin", "fork", "truncated"]
CORPUS_FILES = sorted(CORPUS.glob("*.jsonl")) + sorted(CORPUS.glob("v0.4/*.jsonl")) if CORPUS.is_dir() else []

LEGACY = [*LEGACY_LINES, {  # a file before hashed ids, and an entry more (a branch)
    "type": "item", "id": "i2", "parent": "i1", "ts": "2026-09-17T12:00:03Z",
    "item": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]}}]


def _files(tmp: Path) -> dict[str, Path]:
    """Every session file pinned, by name."""
    files = {name: REPO / "fixtures" / f"{name}.jsonl" for name in FIXTURES}
    files["generated"] = tmp / "generated.jsonl"
    files["generated"].write_bytes(generate(50, 7)[0])
    lines = (REPO / "fixtures" / "branches.jsonl").read_bytes().splitlines(keepends=True)
    files["damaged"] = tmp / "damaged.jsonl"  # a line's text altered (its id no longer its hash), a line lost
    altered = lines[3].replace(b'"text":"', b'"text":"altered ', 1)
    assert altered != lines[3]
    files["damaged"].write_bytes(b"".join(lines[:3] + [altered] + lines[4:6] + lines[7:]))
    files["legacy"] = tmp / "legacy.jsonl"
    files["legacy"].write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in LEGACY))
    for path in CORPUS_FILES:
        files[f"corpus-{path.parent.name}-{path.stem}" if path.parent != CORPUS else f"corpus-{path.stem}"] = path
    return files


def _modes(path: Path) -> list[list[str]]:
    """show's options pinned for a session: every mode, and --leaf at an entry mid-file."""
    modes = [[], ["--json"], ["--runs"], ["--graph"], ["--graph", "--json"], ["-v", "--tail", "3", "--runs"]]
    try:
        entries = read_session(path).entries
    except Exception:  # (a file with no header: each mode says so)
        entries = []
    if entries:
        mid = entries[len(entries) // 2].id
        modes += [["--leaf", mid[7:19]], ["--leaf", mid, "--json"], ["--leaf", mid, "--runs"]]
    return modes


WHEN = "2026-09-17T12:00:00Z"  # every time fixed: the bytes pinned are the same each run


def _user(text: str) -> dict:
    return {"type": "item", "ts": WHEN,
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def _header(sid: str, **kw: str) -> Header:
    return Header.new(sid, created_at=WHEN, **kw)


#: Stored sessions of the shapes only a store makes (test_streaming.py's): a head moved
#: back (a synthetic marker ends the projection), a fork of it, a leaf label of its own,
#: one cleared by a null label, an empty one, one back at the universal root, a fork with
#: no entry of its own; and one whose runs report reads entries off the head's path (a
#: stored session's --runs and --json walk the path and only the calls and dispatches off
#: it): a call on the head's path dispatched on a branch the head left (the dispatch
#: stands for one on the path), a call off the path, a run open at the head.
STORED = ["moved", "fork-of-moved", "labelled", "cleared", "empty", "rooted", "bare-fork", "dispatched-aside"]


def _stored_shapes(st: Store) -> None:
    moved = st.create(_header("moved"))
    ids = [moved.append(_user(f"turn {i}")).id for i in range(5)]
    moved.set_head(ids[2], expected=ids[-1])
    fork = st.create(_header("fork-of-moved", base=ids[3]))
    fork.append(_user("on the fork"))
    labelled = st.create(_header("labelled"))
    a = labelled.append(_user("a")).id
    labelled.append(_user("b"))
    labelled.append({"type": "label", "ts": WHEN, "target": a, "label": "leaf"})
    cleared = st.create(_header("cleared"))
    c = cleared.append(_user("c")).id
    cleared.append({"type": "label", "ts": WHEN, "target": c, "label": "leaf"})
    cleared.append({"type": "label", "ts": WHEN, "target": c, "label": None})
    cleared.append(_user("d"))
    st.create(_header("empty"))
    rooted = st.create(_header("rooted"))
    r2 = [rooted.append(_user(f"r{i}")).id for i in range(2)]
    rooted.set_head(None, expected=r2[-1])
    st.create(_header("bare-fork", base=ids[1]))
    aside = st.create(_header("dispatched-aside", records=["dispatch", "run"]))
    run = aside.append({"type": "run", "ts": WHEN, "phase": "start", "run_id": "r1", "source": "input"}).id
    asked = aside.append({**_user("list the files"), "parent": run}).id
    call = aside.append({"type": "item", "ts": WHEN, "parent": asked, "item": {
        "type": "function_call", "call_id": "c1", "name": "ls", "arguments": '{"path": "."}'}}).id
    aside.append({"type": "dispatch", "ts": WHEN, "parent": call, "target": call, "call_id": "c1"})
    other = aside.append({"type": "item", "ts": WHEN, "parent": asked, "item": {
        "type": "function_call", "call_id": "c2", "name": "cat", "arguments": '{"path": "a"}'}}).id
    aside.append({**_user("once more"), "parent": other})
    aside.set_head(aside.append({**_user("and again"), "parent": call}).id, expected=aside.head)


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> tuple[Path, dict[str, Path], dict[str, str]]:
    """The files, and a store holding those a store takes (their ids by name) and the
    shapes only a store makes."""
    tmp = tmp_path_factory.mktemp("modes")
    files = _files(tmp)
    root = tmp / "store"
    ids: dict[str, str] = {}
    with Store.init(root) as st:
        for name in ["fork-origin", *sorted(n for n in files if n != "fork-origin")]:
            try:
                ids[name] = st.import_file(files[name]).id
            except Exception:
                continue  # refused (a damaged file): pinned as a file only
        _stored_shapes(st)
    for name in STORED:
        ids[name] = name
        with Store(root) as st:
            files[name] = tmp / f"{name}.jsonl"  # its projection, for the entry --leaf names
            files[name].write_bytes(st.read(name).projection())
    return root, files, ids


def _run(*args: str) -> str:
    r = CliRunner().invoke(main, ["--no-pager", *args], env={"COLUMNS": "100", "NO_COLOR": "1"})
    return f"exit {r.exit_code}\n{r.stdout}"


@pytest.mark.parametrize("name", [*FIXTURES, "generated", "damaged", "legacy", *STORED,
                                  *(f"corpus-{p.parent.name}-{p.stem}" if p.parent != CORPUS else f"corpus-{p.stem}"
                                    for p in CORPUS_FILES)])
def test_every_mode_prints_the_pinned_bytes(sessions, name):
    root, files, ids = sessions
    path = files[name]
    out = []
    for opts in _modes(path):
        if name not in STORED:
            text = _run("show", str(path), *opts).replace(json.dumps(str(path))[1:-1], "<FILE>")
            out.append(f"### show FILE {' '.join(opts)}\n{text}")
        if name in ids:
            out.append(f"### show ID {' '.join(opts)}\n{_run('--store', str(root), 'show', ids[name], *opts)}")
    text = "".join(out)
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("AGENTSESSION_GOLDEN") == "write":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_bytes(text.encode("utf-8"))
    assert golden.read_bytes().decode("utf-8") == text, f"show's output differs from {golden}"
