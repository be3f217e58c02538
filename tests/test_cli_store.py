"""The store commands of `agentsession`: output shapes, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, make_entry, read_session, short_id
from agentsession_cas.store import Store
from agentsession_cli.main import main
from storetools import interruptible

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
CORPUS = REPO.parent / "shared" / "corpus" / "sessions"
needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"reference corpus not found at {CORPUS}")
EXE = Path(sys.executable).parent / "agentsession"

CONFIG = {"type": "config", "ts": "2026-09-17T12:00:00Z", "model": "m1"}


def user(text: str, ts: str = "2026-09-17T12:00:01Z") -> dict:
    return {"type": "item", "ts": ts, "item": {"type": "message", "role": "user", "content": text}}


def cli(store: Path | str | None, *args: str, input: bytes | str | None = None, env: dict | None = None):
    argv = (["--store", str(store)] if store is not None else []) + list(args)
    return CliRunner().invoke(main, argv, input=input, env=env, catch_exceptions=False)


def ok(result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def one_error(result, *needles: str) -> str:
    """Exit 1, nothing on stdout, exactly one `agentsession: error:` line on stderr."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentsession: error: "), result.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def store(tmp_path) -> Path:
    path = tmp_path / "store"
    assert ok(cli(path, "init")).strip() == f"created store at {path}"
    return path


def new_session(store: Path, sid: str = "s1", entries: int = 2) -> list[str]:
    """Create a record session holding a config and user turns; return the entry ids."""
    assert ok(cli(store, "create", "--id", sid)).strip() == sid
    ids = [ok(cli(store, "append", sid, input=json.dumps(CONFIG))).strip()]
    for i in range(1, entries):
        ids.append(ok(cli(store, "append", sid, input=json.dumps(user(f"turn {i}", f"2026-09-17T12:00:0{i}Z")))).strip())
    return ids


def object_path(store: Path, space: str, name: str) -> Path:
    hexd = name.split(":", 1)[1]
    return store / "objects" / space / hexd[:2] / hexd[2:]


def flip_byte(path: Path, at: int = 5) -> None:
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


# -- init, --store, env -------------------------------------------------------


def test_init_creates_a_store_and_is_idempotent(tmp_path):
    path = tmp_path / "a" / "store"
    assert ok(cli(path, "init")).strip() == f"created store at {path}"
    assert (path / "layout").is_file()
    assert ok(cli(path, "init")).strip() == f"found store at {path}"
    assert json.loads(ok(cli(path, "init", "--json"))) == {"store": str(path), "created": False}
    other = tmp_path / "b"
    assert json.loads(ok(cli(other, "init", "--json"))) == {"store": str(other), "created": True}


def test_store_from_environment(tmp_path):
    path = tmp_path / "envstore"
    assert ok(cli(None, "init", env={"AGENTSESSION_STORE": str(path)})).strip() == f"created store at {path}"
    assert ok(cli(None, "list", "--json", env={"AGENTSESSION_STORE": str(path)})).strip() == "[]"


def test_store_found_walking_up_and_global_options_after_the_subcommand(tmp_path, monkeypatch):
    """With no --store, the store is the working directory or its nearest ancestor
    that is one (or holds one as .agentsession), before $AGENTSESSION_STORE; --store
    and -C DIR work before or after the subcommand."""
    project = tmp_path / "project"
    inner = project / "src" / "deep"
    inner.mkdir(parents=True)
    ok(cli(project / ".agentsession", "init"))
    elsewhere = tmp_path / "env-store"
    ok(cli(elsewhere, "init"))
    ok(cli(project / ".agentsession", "create", "--id", "here"))
    env = {"AGENTSESSION_STORE": str(elsewhere)}
    monkeypatch.chdir(inner)
    assert [r["session"] for r in json.loads(ok(cli(None, "list", "--json", env=env)))] == ["here"]
    assert ok(cli(None, "init", env=env)).strip() == f"found store at {project / '.agentsession'}"
    # a directory merely holding a file called layout is not a store
    monkeypatch.chdir(tmp_path)
    (tmp_path / "layout").write_text("a page layout\n")
    assert json.loads(ok(cli(None, "list", "--json", env=env))) == []
    # --store and -C after the subcommand
    assert [r["session"] for r in json.loads(ok(cli(None, "list", "--json", "--store", str(project / ".agentsession"))))] == ["here"]
    assert [r["session"] for r in json.loads(ok(cli(None, "list", "-C", str(inner), "--json", env=env)))] == ["here"]
    assert [r["session"] for r in json.loads(ok(cli(None, "-C", str(project), "list", "--json", env=env)))] == ["here"]
    one_error(cli(None, "-C", str(tmp_path / "nowhere"), "list"), "nowhere")
    # an empty -C is no change of directory, as git's (it was "cannot change to : ...")
    monkeypatch.chdir(inner)
    assert [r["session"] for r in json.loads(ok(cli(None, "-C", "", "list", "--json", env=env)))] == ["here"]


def test_an_empty_store_option_is_a_usage_error_not_the_default_store(tmp_path, store):
    """`--store "$UNSET"` names no store: a usage error (exit 2), never the store found by
    the search or $AGENTSESSION_STORE, which a `delete` there would then change."""
    ok(cli(store, "create", "--id", "s1"))
    env = {"AGENTSESSION_STORE": str(store)}
    for args in (["--store", "", "delete", "s1"], ["delete", "s1", "--store="], ["--store=", "delete", "--json", "s1"]):
        r = cli(None, *args, env=env)
        assert r.exit_code == 2, (args, r.output)
        assert "--store" in r.stderr and "empty" in r.stderr and r.stdout == ""
    assert json.loads(r.stderr)["error"]["code"] == "usage"
    assert ok(cli(store, "head", "s1")) == ""  # still there


@pytest.mark.parametrize("args", [["list"], ["log", "s1"], ["head", "s1"], ["import", str(FIXTURES / "basic.jsonl")]])
def test_no_store_is_one_line_error(tmp_path, args):
    """The hint makes the store the command was given: a bare `agentsession init` would
    make the one the search finds (~/.agent/cas), not this one."""
    one_error(cli(tmp_path / "none", *args), "no store at", f"create one with `agentsession --store {tmp_path / 'none'} init`")


def test_no_store_hint_is_a_command_that_makes_that_store(tmp_path):
    """The hint, read as a shell reads it, makes the store the command named (quoted)."""
    where = tmp_path / "my store's dir"
    line = one_error(cli(where, "list"), "no store at")
    words = shlex.split(line.split("create one with `", 1)[1].rstrip("`"))
    assert words == ["agentsession", "--store", str(where), "init"]
    assert ok(cli(None, *words[1:])).strip() == f"created store at {where}"
    assert ok(cli(where, "list")) == ""


def test_newer_layout_is_refused(store):
    (store / "layout").write_text("agentsession-cas 99\n")
    one_error(cli(store, "list"), "layout")


# -- create, append, head, log, list -----------------------------------------


def test_create_append_log_list_head(store):
    ids = new_session(store, "s1", 3)
    assert ok(cli(store, "head", "s1")).strip() == ids[-1]
    assert json.loads(ok(cli(store, "head", "--json", "s1"))) == {"session": "s1", "head": ids[-1]}

    records = json.loads(ok(cli(store, "log", "--json", "s1")))
    # each `append` is its own process: a durable append (record + commit), then the
    # checkpoint its close makes; the next open finds the log clean and adds nothing
    assert [r["op"] for r in records] == ["create"] + ["append", "commit", "checkpoint"] * 3
    assert [r["line"] for r in records] == list(range(1, 11))
    for e in ids:  # the close's checkpoint wrote every object
        assert object_path(store, "entries", e).is_file()
    appends = [r for r in records if r["op"] == "append"]
    assert [(r["seq"], r["entry"], r["head"]) for r in appends] == [(i + 1, e, e) for i, e in enumerate(ids)]
    assert records[0]["mark"] == "record"

    text = ok(cli(store, "log", "s1")).splitlines()
    assert text[0].split() == ["LINE", "OP", "SEQ", "ENTRY", "HEAD", "DETAIL"]
    assert text[2].split()[:5] == ["2", "append", "1", ids[0][7:19], ids[0][7:19]]

    listed = json.loads(ok(cli(store, "list", "--json")))
    assert len(listed) == 1
    row = listed[0]
    assert {"session", "created", "entries", "head", "mark", "size"} <= set(row)
    assert (row["session"], row["entries"], row["head"], row["mark"]) == ("s1", 3, ids[-1], "record")
    assert row["size"] > 0 and row["created"]
    lines = ok(cli(store, "list")).splitlines()
    assert lines[0].split() == ["ID", "TITLE", "MODEL", "HARNESS", "CREATED", "ACTIVE", "ENTRIES", "HEAD", "MARK"]
    assert lines[1].split()[0] == "s1" and lines[1].split()[-3:] == ["3", ids[-1][7:19], "record"]


def test_create_generates_an_id_and_refuses_a_held_one(store):
    sid = ok(cli(store, "create")).strip()
    assert len(sid) == 36 and sid.count("-") == 4
    assert ok(cli(store, "head", sid)) == ""  # a new baseless session has no head
    one_error(cli(store, "create", "--id", sid), "already exists")


def test_create_from_header_file(store, tmp_path):
    hfile = tmp_path / "h.json"
    hfile.write_text(json.dumps({"type": "session", "format": "agentsession/0.14", "id": "from-file",
                                 "created_at": "2026-09-17T12:00:00Z", "payload": "openresponses/2026-04-24"}))
    assert ok(cli(store, "create", "--header", str(hfile))).strip() == "from-file"
    assert ok(cli(store, "create", "--header", str(hfile), "--id", "other")).strip() == "other"
    hfile.write_text("{not json")
    one_error(cli(store, "create", "--header", str(hfile)), "not a JSON object")
    hfile.write_bytes(b'\xef\xbb\xbf{"id": "bom"}')
    one_error(cli(store, "create", "--header", str(hfile)), f"{hfile} begins with a UTF-8 byte order mark")
    hfile.write_text("[1]")
    one_error(cli(store, "create", "--header", str(hfile)), "must be a JSON object")


def test_create_fork_from_base(store):
    ids = new_session(store, "s1", 3)
    assert ok(cli(store, "create", "--id", "fork", "--base", ids[1])).strip() == "fork"
    assert ok(cli(store, "head", "fork")).strip() == ids[1]
    out = json.loads(ok(cli(store, "append", "--json", "fork", input=json.dumps(user("forked")))))
    assert out["outcome"] == "continued"
    shown = json.loads(ok(cli(store, "show", "--json", "fork")))
    assert [e["id"] for e in shown["entries"]] == ids[:2] + [out["id"]]
    assert shown["header"]["base"] == ids[1]
    ok(cli(store, "verify", "fork"))
    one_error(cli(store, "create", "--id", "f2", "--base", "sha256:" + "0" * 64), "base")


def test_append_json_shape_and_stated_id(store):
    ids = new_session(store, "s1", 1)
    e = make_entry("item", ids[0], ts="2026-09-17T12:00:05Z", item={"type": "message", "role": "user", "content": "x"})
    out = json.loads(ok(cli(store, "append", "--json", "s1", input=e.canonical_line())))
    assert {"id", "outcome", "head", "head_moved", "durable", "unresolved"} <= set(out)
    assert (out["id"], out["outcome"], out["head"], out["head_moved"], out["durable"]) == (e.id, "continued", e.id, True, True)
    # the same entry again is a no-op, reported as such
    again = cli(store, "append", "s1", input=e.canonical_line())
    assert ok(again).strip() == e.id and "already holds" in again.stderr
    # a stated id that is not the entry's hash is refused
    data = dict(e.data, id="sha256:" + "1" * 64)
    one_error(cli(store, "append", "s1", input=json.dumps(data)), "does not match the hash")


def test_append_branch_is_reported_and_head_stays(store):
    ids = new_session(store, "s1", 2)
    r = cli(store, "append", "--json", "s1", input=json.dumps(dict(user("other"), parent=ids[0])))
    out = json.loads(ok(r))
    assert out["outcome"] == "branched" and out["head_moved"] is False and out["head"] == ids[1]
    text = cli(store, "append", "s1", input=json.dumps(dict(user("third"), parent=ids[0])))
    assert "branch" in text.stderr
    assert ok(cli(store, "head", "s1")).strip() == ids[1]


def test_append_leaf_label_moves_the_head(store):
    ids = new_session(store, "s1", 2)
    label = {"type": "label", "ts": "2026-09-17T12:00:09Z", "target": ids[0], "label": "leaf"}
    out = json.loads(ok(cli(store, "append", "--json", "s1", input=json.dumps(label))))
    assert out["outcome"] == "head-moved" and out["head"] == ids[0]
    synthetic = dict(label, synthetic=True, ts="2026-09-17T12:00:10Z")
    one_error(cli(store, "append", "s1", input=json.dumps(synthetic)), "synthetic")


@pytest.mark.parametrize(
    "stdin, needle",
    [
        ("{bad", "not a JSON object"),
        ("", "no entry on stdin"),
        ("[1, 2]", "not an object"),
        ('{"type": "item", "ts": "yesterday"}', "is not in the admitted form"),
        (b"\xff\xfe", "not UTF-8"),
        ('{"type": "item"}\n{"type": "item"}', "not a JSON object"),
        (b'\xef\xbb\xbf{"type": "custom", "data": 1}', "stdin begins with a UTF-8 byte order mark"),
    ],
)
def test_append_bad_input_is_one_line(store, stdin, needle):
    new_session(store, "s1", 1)
    log = store / "sessions" / "s1" / "log"
    before = log.read_bytes()
    one_error(cli(store, "append", "s1", input=stdin), needle)
    assert log.read_bytes() == before  # nothing written (not even a rewrite on open)
    ops = [r["op"] for r in json.loads(ok(cli(store, "log", "--json", "s1")))]
    assert ops == ["create", "append", "commit", "checkpoint"]


def test_log_json_is_emit_json_of_the_records_byte_for_byte(store, tmp_path):
    """log --json is streamed a record at a time: the bytes are emit_json's of the whole
    list (its indentation, key order and non-ASCII text as it is), for a log that holds an
    import's appends, a header member beyond ASCII, head moves and checkpoints; and for a
    damaged log, the records that read, then the error."""
    from agentsession_cas.backends.files.log import encode_record

    src = tmp_path / "café.jsonl"
    data = FIXTURES.joinpath("branches.jsonl").read_bytes().replace(b'"cwd":"/home/u/proj"', rb'"cwd":"/home/\u00fc/caf\u00e9"')
    src.write_bytes(data)
    sid = ok(cli(store, "import", str(src))).strip()
    ids = new_session(store, "s1", 3)
    ok(cli(store, "head", "s1", ids[0], "--expect", ids[-1]))

    def expected(session: str) -> str:
        with Store(store, readonly=True) as st:
            h = st.history(session)
        assert h.positions
        return json.dumps([{"line": n, "offset": o, **d} for d, (n, o) in zip(h.records, h.positions)],
                          ensure_ascii=False, indent=2) + "\n"

    assert "ü" in expected(sid)
    for session in (sid, "s1"):
        assert ok(cli(store, "log", "--json", session)) == expected(session)
    log = store / "sessions" / "s1" / "log"
    log.write_bytes(log.read_bytes() + encode_record({"op": "commit"})[:-3] + b"xx\n" + encode_record({"op": "commit"}))
    want = expected("s1")
    r = cli(store, "log", "--json", "s1")
    assert r.exit_code == 1 and r.stdout == want and '"code": "session_damaged"' in r.stderr.replace('":"', '": "')


@pytest.mark.parametrize("value", [[], [{"a": 1, "b": None}], [{"h": {"x": ["é", 2.5]}, "n": 2**70}, "s", [1, []]]])
def test_the_json_stream_of_a_list_writes_what_emit_json_writes(value, capsys):
    from agentsession_cli.common import JsonStream, emit_json

    emit_json(value)
    whole = capsys.readouterr().out
    out = JsonStream(array=True)
    for v in value:
        out.item(v)
    out.end()
    assert capsys.readouterr().out == whole


def test_append_parent_rule(store):
    new_session(store, "s1", 1)
    one_error(cli(store, "append", "s1", input=json.dumps(dict(user("x"), parent="sha256:" + "2" * 64))), "does not appear earlier")


def test_head_compare_and_swap(store):
    ids = new_session(store, "s1", 2)
    one_error(cli(store, "head", "s1", ids[0], "--expect", ids[0]), "moved")
    one_error(cli(store, "head", "s1", ids[0], "--expect", ""), "moved")
    assert ok(cli(store, "head", "s1", ids[0], "--expect", ids[1])) == ""
    assert ok(cli(store, "head", "s1")).strip() == ids[0]
    out = json.loads(ok(cli(store, "head", "--json", "s1", "", "--expect", ids[0])))
    assert out == {"session": "s1", "head": None, "previous": ids[0]}
    assert ok(cli(store, "head", "s1")) == ""
    assert ok(cli(store, "head", "s1", ids[1], "--expect", "")) == ""
    assert ok(cli(store, "head", "s1")).strip() == ids[1]
    one_error(cli(store, "head", "s1", "sha256:" + "3" * 64, "--expect", ids[1]), "no such entry: sha256:333")
    one_error(cli(store, "head", "s1", "nonsense", "--expect", ids[1]), "not an entry id")
    ops = [r["op"] for r in json.loads(ok(cli(store, "log", "--json", "s1")))]
    assert ops.count("head") == 3


def test_head_usage_errors_exit_2(store):
    ids = new_session(store, "s1", 1)
    r = cli(store, "head", "s1", ids[0])
    assert r.exit_code == 2 and "--expect" in r.stderr
    r = cli(store, "head", "s1", "--expect", ids[0])
    assert r.exit_code == 2


# -- mirrors, import, export -------------------------------------------------


def test_import_is_a_mirror_that_refuses_appends_and_head_moves(store):
    sid = ok(cli(store, "import", str(FIXTURES / "basic.jsonl"))).strip()
    sf = read_session(FIXTURES / "basic.jsonl")
    assert sid == sf.header.id
    assert json.loads(ok(cli(store, "list", "--json")))[0]["mark"] == "mirror"
    one_error(cli(store, "append", sid, input=json.dumps(user("x"))), "mirror", "refuses")
    head = ok(cli(store, "head", sid)).strip()
    one_error(cli(store, "head", sid, sf.entries[0].id, "--expect", head), "mirror")
    one_error(cli(store, "import", str(FIXTURES / "basic.jsonl")), "already exists")


def test_import_record_accepts_appends(store):
    sid = ok(cli(store, "import", "--record", str(FIXTURES / "basic.jsonl"))).strip()
    out = json.loads(ok(cli(store, "append", "--json", sid, input=json.dumps(user("more")))))
    assert out["outcome"] == "continued"


def test_import_notes_the_head_it_holds_in_place_of_the_files(store, tmp_path):
    """RFC 0002 "Projection to JSONL": a file whose resume rule lands on a ``leaf`` label
    (here its last line, naming what the file lacks) is held at the label's nearest
    ancestor that is not one, "and the store reports" it: a note on stderr naming the
    file, the entry its rule names and the head held; ``head_adjusted`` under --json
    (null when the import holds the file's head). It was imported without a word."""
    e1 = make_entry("item", None, ts="2026-09-17T12:00:00Z", item={"type": "message", "role": "user", "content": "a"})
    e2 = make_entry("item", e1.id, ts="2026-09-17T12:00:01Z", item={"type": "message", "role": "user", "content": "b"})
    lab = make_entry("label", e2.id, ts="2026-09-17T12:00:02Z", label="leaf", target="sha256:" + "0" * 64)
    data = Header.new("adj").canonical_line() + b"".join(e.canonical_line() for e in (e1, e2, lab))
    path = tmp_path / "adj.jsonl"
    path.write_bytes(data)
    r = cli(store, "import", str(path))
    assert ok(r).strip() == "adj"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"agentsession: note: {path}: "), r.stderr
    assert "leaf label" in lines[0] and short_id(lab.id) in lines[0] and short_id(e2.id) in lines[0], lines[0]
    assert ok(cli(store, "head", "adj")).strip() == e2.id
    ok(cli(store, "delete", "adj"))
    r = cli(store, "import", "--json", "-", input=data)
    facts = json.loads(ok(r))
    assert facts["head"] == e2.id
    assert {k: facts["head_adjusted"][k] for k in ("named", "held", "why")} == {
        "named": lab.id, "held": e2.id, "why": "leaf_label"}
    assert short_id(lab.id) in facts["head_adjusted"]["message"]
    r = cli(store, "import", "--json", str(FIXTURES / "basic.jsonl"))
    assert json.loads(ok(r))["head_adjusted"] is None and "note" not in r.stderr


def test_import_refusals_are_one_line(store, tmp_path):
    one_error(cli(store, "import", str(tmp_path / "nope.jsonl")), "no such file")
    one_error(cli(store, "import", str(FIXTURES / "truncated.jsonl")), "cut short")


def test_import_of_a_bad_last_line_with_its_lf_is_not_called_cut_short(store, tmp_path):
    """A last line that ends with LF and does not parse was not cut short: the import's
    refusal words it as the line it is (the file without the LF is "cut short")."""
    data = (FIXTURES / "truncated.jsonl").read_bytes()
    assert not data.endswith(b"\n")
    path = tmp_path / "lf.jsonl"
    path.write_bytes(data + b"\n")
    err = one_error(cli(store, "import", str(path)), "the last line does not parse as JSON")
    assert "cut short" not in err


def test_export_import_round_trip(store, tmp_path):
    ids = new_session(store, "s1", 3)
    ok(cli(store, "head", "s1", ids[1], "--expect", ids[2]))  # a head the resume rule would not name
    out = tmp_path / "s1.jsonl"
    assert ok(cli(store, "export", "s1", "-o", str(out))) == ""
    stdout = cli(store, "export", "s1").stdout_bytes
    assert stdout == out.read_bytes()
    ok(cli(str(store), "verify", str(out)))
    ok(cli(store, "delete", "s1"))
    assert ok(cli(store, "import", "--record", str(out))).strip() == "s1"
    assert ok(cli(store, "head", "s1")).strip() == ids[1]
    assert cli(store, "export", "s1").stdout_bytes == out.read_bytes()
    second = tmp_path / "other" / "store"
    ok(cli(second, "init"))
    ok(cli(second, "import", str(out)))
    assert cli(second, "export", "s1").stdout_bytes == out.read_bytes()


@pytest.mark.parametrize("fmt", ["jsonl", "atif", "otel"])
def test_export_output_inside_a_store_is_refused(store, tmp_path, fmt):
    """-o naming a path inside a store would replace the store's own files: the export of
    a session written over its own log (exit 0, the session gone), over a pack, over the
    layout. Refused before anything is written (code `output`); a file beside a store kept
    in a project (`project/.agentsession`) is fine."""
    new_session(store, "s1", 2)
    log = store / "sessions" / "s1" / "log"
    pack = store / "objects" / "pack"
    ok(cli(store, "pack"))
    before = {p: p.read_bytes() for p in [log, store / "layout", *pack.iterdir()]}
    targets = [log, store / "layout", next(pack.glob("*.pack")), store / "new.jsonl", store / "tmp" / "x"]
    if fmt == "atif":  # -o names a directory for its documents
        targets = [store, store / "sessions" / "s1", store / "docs"]
    for target in targets:
        r = cli(store, "export", "--format", fmt, "s1", "-o", str(target))
        one_error(r, f"cannot write {target}: it lies inside the store at {store}")
        r = cli(store, "export", "--format", fmt, "s1", "-o", str(target), *(["--json"] if fmt == "jsonl" else []))
        assert r.exit_code == 1
    assert {p: p.read_bytes() for p in before} == before and not (store / "new.jsonl").exists()
    assert not (store / "docs").exists()
    project = tmp_path / "project"
    ok(cli(project / ".agentsession", "init"))
    ok(cli(project / ".agentsession", "import", str(FIXTURES / "basic.jsonl")))
    out = project / ("docs" if fmt == "atif" else "out.jsonl")
    ok(cli(project / ".agentsession", "export", "--format", fmt, "0199b000-0000-7000-8000-000000000001", "-o", str(out)))
    assert out.exists()


def test_export_output_writes_what_the_path_names(store, tmp_path):
    """-o replaces a regular file atomically, but writes a symlink's target (the link
    stays), and writes a device or a pipe as a stream (never renamed over); a missing
    directory or a directory is an error naming the user's path, never a temp name."""
    import stat
    import threading

    new_session(store, "s1", 2)
    expected = cli(store, "export", "s1").stdout_bytes

    target = tmp_path / "real.jsonl"
    target.write_bytes(b"old bytes\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    ok(cli(store, "export", "s1", "-o", str(link)))
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == expected

    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "made.jsonl")
    ok(cli(store, "export", "s1", "-o", str(dangling)))
    assert dangling.is_symlink() and (tmp_path / "made.jsonl").read_bytes() == expected

    # /dev/stdout on a pipe: the bytes arrive on stdout, and /dev/stdout is not replaced.
    r = subprocess.run([str(EXE), "--store", str(store), "export", "s1", "-o", "/dev/stdout"], capture_output=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected
    assert not stat.S_ISREG(os.lstat("/dev/stdout").st_mode)
    ok(cli(store, "export", "s1", "-o", os.devnull))
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    ok(cli(store, "export", "s1", "-o", str(fifo)))
    reader.join(timeout=30)
    assert got == [expected] and stat.S_ISFIFO(os.lstat(fifo).st_mode)

    missing = tmp_path / "nodir" / "x.jsonl"
    line = one_error(cli(store, "export", "s1", "-o", str(missing)), str(missing), "does not exist")
    assert ".tmp-" not in line
    one_error(cli(store, "export", "s1", "-o", str(tmp_path)), str(tmp_path), "is a directory")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")) == []


def test_write_session_follows_a_symlink(tmp_path):
    from agentsession_cas import Header, write_session

    target = tmp_path / "t.jsonl"
    target.write_bytes(b"")
    link = tmp_path / "l.jsonl"
    link.symlink_to(target)
    header = Header.new("w1", created_at="2026-09-17T12:00:00Z")
    write_session(link, header, [])
    assert link.is_symlink() and target.read_bytes() == header.canonical_line()


LEGACY_LINES = [
    {"type": "session", "format": "agentsession/0.4", "id": "0199c000-0000-7000-8000-0000000000aa",
     "created_at": "2026-09-17T12:00:00Z", "payload": "openresponses/2026-04-24"},
    {"type": "config", "id": "c1", "parent": None, "ts": "2026-09-17T14:00:00+02:00", "model": "gpt-5"},
    {"type": "item", "id": "i1", "parent": "c1", "ts": "2026-09-17T12:00:01Z",
     "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}},
    {"type": "label", "id": "l1", "parent": "i1", "ts": "2026-09-17T12:00:02Z", "target": "i1", "label": "checkpoint"},
]


def _jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def test_import_migrates_a_file_from_before_hashed_ids(store, tmp_path):
    """RFC 0001 Versioning: a pre-0.5 file is migrated as the reader migrates it (ids
    hashed, legacy_id kept) and held under the current format; its export verifies and
    names the same entries verify of the old file did."""
    old = tmp_path / "old.jsonl"
    old.write_bytes(_jsonl(LEGACY_LINES))
    sid = LEGACY_LINES[0]["id"]
    assert ok(cli(store, "import", str(old))).strip() == sid
    migrated = read_session(old)
    out = tmp_path / "new.jsonl"
    ok(cli(store, "export", sid, "-o", str(out)))
    sf = read_session(out)
    assert sf.problems == [] and not sf.migrated
    assert sf.header.format_version > migrated.header.format_version
    assert [e.id for e in sf.entries] == [e.id for e in migrated.entries]
    assert [e.legacy_id for e in sf.entries] == ["c1", "i1", "l1"]
    ok(cli(store, "verify", sid))
    ok(cli(store, "fsck", "--deep"))


def test_import_refuses_a_legacy_file_migration_cannot_resolve(store, tmp_path):
    """One holding a reference migration cannot rewrite must never be re-emitted as 0.5
    or later (RFC 0001): refused, naming the line, and the store is unchanged."""
    lines = [dict(x) for x in LEGACY_LINES]
    lines[2]["content"] = "a member 0.5 reserves"
    old = tmp_path / "old.jsonl"
    old.write_bytes(_jsonl(lines))
    r = cli(store, "import", str(old))
    line = one_error(r, "line 3", "content", "re-emitted")
    assert str(old) in line
    assert ok(cli(store, "list", "--json")).strip() == "[]"


def test_an_empty_session_verifies_as_its_export_does(store, tmp_path):
    """verify ID and verify of the export agree on a session with no entry (both note
    'empty' and exit 0: a session just created); fsck holds it clean."""
    ok(cli(store, "create", "--id", "e1"))
    stored = cli(store, "verify", "e1")
    out = tmp_path / "e1.jsonl"
    ok(cli(store, "export", "e1", "-o", str(out)))
    as_file = cli(store, "verify", str(out))
    assert stored.exit_code == as_file.exit_code == 0
    assert "no entries" in stored.stdout and "no entries" in as_file.stdout
    said = json.loads(cli(store, "verify", "e1", "--json").stdout)
    assert said["problems"] == [] and [n["code"] for n in said["notes"]] == ["empty"]
    ok(cli(store, "fsck", "--deep"))


def test_dash_reads_standard_input(store):
    """`-` is standard input wherever a file is read: verify, show, import."""
    data = (FIXTURES / "basic.jsonl").read_bytes()
    r = cli(None, "verify", "-", input=data)
    assert r.exit_code == 0 and r.stdout.splitlines()[-1].startswith("<stdin>: 7 entries read")
    assert ok(cli(None, "show", "-", input=data)).startswith("session  0199b000-0000-7000-8000-000000000001")
    sid = ok(cli(store, "import", "-", input=data)).strip()
    assert cli(store, "export", sid).stdout_bytes == data
    bad = cli(None, "verify", "-", input=data[:-5])
    assert bad.exit_code == 1 and "<stdin>" in bad.output


def test_import_progress_counts_in_the_unit_it_names(store, monkeypatch):
    """`import FILE` reads the file by bytes (as `verify FILE`) and said `lines` of the
    file's size (`100,123,623/100,123,623 lines`); from standard input it counts lines."""
    from agentsession_cli import terminal

    monkeypatch.setattr(terminal, "isatty", lambda stream: stream is sys.stderr)
    monkeypatch.setattr(terminal, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(terminal, "PROGRESS_EVERY", 0.0)
    path = FIXTURES / "branches.jsonl"
    size, lines = path.stat().st_size, len(path.read_bytes().splitlines())
    r = cli(store, "import", str(path))
    assert r.exit_code == 0, r.output
    assert f"importing: 100% ({size:,}/{size:,} bytes)" in r.stderr, r.stderr
    other = Store.init(str(store.parent / "other"))
    other.close()
    r = cli(store.parent / "other", "import", "-", input=path.read_bytes())
    assert r.exit_code == 0, r.output
    assert f"importing: 100% ({lines - 1:,}/{lines - 1:,} lines)" in r.stderr, r.stderr


def test_exit_statuses_for_a_closed_pipe_and_ctrl_c(store, tmp_path):
    """A reader that goes away (`| head`) ends the command quietly with 141, as git
    does; Ctrl-C with 130 and no traceback. The interrupt is forced (a SIGINT sent
    while the command waits on its standard input), not timed."""
    import signal

    new_session(store, "s1", 3)
    env = dict(os.environ, AGENTSESSION_STORE=str(store))
    p = subprocess.Popen([str(EXE), "export", "s1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert p.stdout is not None
    p.stdout.close()  # the reader is gone before the first byte is written
    assert p.wait(timeout=60) == 141
    assert p.stderr is not None and b"Traceback" not in p.stderr.read()

    p = interruptible([str(EXE), "verify", "-"], stdin=subprocess.PIPE, stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert p.stdin is not None and p.stderr is not None
    p.stdin.write(b'{"type":"session"')  # it is reading standard input, which stays open
    p.stdin.flush()
    deadline = 0
    while deadline < 600 and not _reading_stdin(p.pid):
        deadline += 1
        subprocess.run(["sleep", "0.05"])
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) == 130
    err = p.stderr.read()
    assert b"Traceback" not in err and b"Aborted" not in err


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["PYTHONUNBUFFERED", "buffered"])
def test_output_to_a_non_blocking_pipe_arrives_whole(store, unbuffered):
    """A parent may hand the command a pipe set O_NONBLOCK, where a write takes only what
    fits. The command waits for the pipe and writes the rest, as git does. It used to
    print the first 4 KiB of a 10 KiB JSON document and exit 0 under PYTHONUNBUFFERED
    (Python's text layer drops what an unbuffered write did not take), and fail with
    BlockingIOError without it. Forced, not timed: the pipe holds 4 KiB, less than one
    write, and is read only once full, so a write is always cut short and then refused."""
    import fcntl

    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        pytest.skip("no F_SETPIPE_SZ on this platform")
    env = dict(os.environ, AGENTSESSION_STORE=str(store), PYTHONUNBUFFERED=unbuffered)
    sid = ok(cli(store, "import", str(FIXTURES / "branches.jsonl"))).strip()
    for args, want in [
        (["show", "--json", str(FIXTURES / "branches.jsonl")], None),  # one text write of 10 KiB
        (["export", sid], (FIXTURES / "branches.jsonl").read_bytes()),  # raw bytes, 5 KiB
    ]:
        if want is None:
            want = subprocess.run([str(EXE), *args], env=env, capture_output=True, check=True).stdout
        assert len(want) > 4096
        r, w = os.pipe()
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
        fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
        p = subprocess.Popen([str(EXE), *args], stdout=w, stderr=subprocess.PIPE, env=env)
        os.close(w)
        while _pipe_holds(r) < 4096 and p.poll() is None:  # read only once the pipe is full
            subprocess.run(["sleep", "0.05"])
        with os.fdopen(r, "rb") as f:
            got = f.read()
        assert p.stderr is not None
        err = p.stderr.read()
        assert p.wait(timeout=60) == 0, err
        assert got == want and err == b"", (args, len(got), len(want), err)


@pytest.mark.parametrize("unbuffered", ["1", ""], ids=["PYTHONUNBUFFERED", "buffered"])
def test_a_full_standard_output_is_one_error_line_naming_it(store, unbuffered):
    """Standard output on a full device (/dev/full): exit 1 and one error line that names
    standard output, not the store (whose device is fine), and no "Exception ignored"
    traceback from the retry of the buffered rest at exit (exit 120)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    sid = ok(cli(store, "import", str(FIXTURES / "branches.jsonl"))).strip()
    env = dict(os.environ, AGENTSESSION_STORE=str(store), PYTHONUNBUFFERED=unbuffered)
    for args in (["list"], ["export", sid], ["show", "--json", sid]):
        with open("/dev/full", "wb") as full:
            r = subprocess.run([str(EXE), *args], stdout=full, stderr=subprocess.PIPE, env=env)
        assert r.returncode == 1, (args, r.stderr)
        (line,) = r.stderr.decode().splitlines()
        if "--json" in args:
            error = json.loads(line)["error"]
            assert error["code"] == "no_space", error
            line = "agentsession: error: " + error["message"]
        assert line.startswith("agentsession: error: no space left on the device holding standard output"), line


def _pipe_holds(fd: int) -> int:
    """The bytes waiting in the pipe ``fd`` reads (FIONREAD)."""
    import fcntl
    import termios

    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)


def _reading_stdin(pid: int) -> bool:
    """The process is blocked reading its standard input: its main thread is in read(2)
    (number 0 on x86-64) on fd 0, which only the command's own read of `-` does (start-up
    reads its modules through other descriptors), so a SIGINT then lands in our handler."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            parts = f.read().split()
        return parts[0] == "0" and int(parts[1], 16) == 0
    except (OSError, IndexError, ValueError):
        return False


def test_python_dash_m_runs_the_command():
    r = subprocess.run([sys.executable, "-m", "agentsession_cas", "verify", str(FIXTURES / "basic.jsonl")], capture_output=True)
    assert r.returncode == 0 and b"7 entries read" in r.stdout


def test_create_and_import_say_what_they_made_under_json(store, tmp_path):
    out = json.loads(ok(cli(store, "create", "--id", "c1", "--json")))
    assert out == {"session": "c1", "base": None, "head": None, "mark": "record"}
    data = (FIXTURES / "basic.jsonl").read_bytes()
    got = json.loads(ok(cli(store, "import", "-", "--json", input=data)))
    sf = read_session(FIXTURES / "basic.jsonl")
    assert got == {"session": str(sf.header.id), "entries": len(sf.entries), "prefix": 0, "head": sf.entries[-1].id, "mark": "mirror",
                   "head_adjusted": None, "warnings": []}


def test_sessions_and_entries_are_named_as_git_names_revisions(store):
    """A session by id, unique id prefix (4 or more), ref:NAME or a bare ref name; an
    entry by full id or unique prefix of 4+ hex digits; an ambiguous prefix is an error
    listing the candidates; rev-parse prints what a name resolves to."""
    ids = new_session(store, "abcd-one", 3)
    new_session(store, "abce-two", 1)
    ok(cli(store, "ref", "update", "chat/main", "abcd-one"))
    for name in ("abcd-one", "abcd", "ref:chat/main", "chat/main"):
        assert ok(cli(store, "rev-parse", name)).strip() == "abcd-one", name
        assert ok(cli(store, "head", name)).strip() == ids[-1], name
    line = one_error(cli(store, "rev-parse", "abc"), "no such session: abc")
    assert "the store at" in line
    line = one_error(cli(store, "rev-parse", "abc-"), "no such session")
    # a ref's name that no ref holds: the ref is what is missing, not a bad session id
    line = one_error(cli(store, "rev-parse", "chat/other"), "no such session: chat/other (no ref of that name in")
    assert "not usable" not in line and json.loads(cli(store, "log", "chat/other", "--json").stderr)["error"]["code"] == "no_session"
    one_error(cli(store, "rev-parse", "a b"), "session id 'a b' is not usable")
    ok(cli(store, "create", "--id", "abcd-three"))
    line = one_error(cli(store, "rev-parse", "abcd"), "abcd is the start of 2 session ids", "abcd-one", "abcd-three")
    r = cli(store, "rev-parse", "abcd", "--json")
    err = json.loads(r.stderr)["error"]
    assert err["code"] == "ambiguous" and err["candidates"] == ["abcd-one", "abcd-three"]

    short = ids[0][7:13]
    assert ok(cli(store, "rev-parse", "ref:chat/main", short)).splitlines() == ["abcd-one", ids[0]]
    assert json.loads(ok(cli(store, "rev-parse", "chat/main", "sha256:" + short, "--json"))) == {"session": "abcd-one", "entry": ids[0]}
    one_error(cli(store, "rev-parse", "abcd-one", ids[0][7:10]), "not an entry id nor a prefix")
    one_error(cli(store, "rev-parse", "abcd-one", "ffff" if not ids[0][7:].startswith("ffff") else "eeee"), "no such entry: ", "in session abcd-one")
    # head moves by prefixes too; show, log, export and delete take the names
    ok(cli(store, "head", "chat/main", ids[1][7:15], "--expect", ids[2][7:15]))
    assert ok(cli(store, "head", "abcd-one")).strip() == ids[1]
    assert ok(cli(store, "export", "ref:chat/main")) == ok(cli(store, "export", "abcd-one"))
    assert ok(cli(store, "log", "chat/main", "--json")) == ok(cli(store, "log", "abcd-one", "--json"))
    assert "abcd-one" in ok(cli(store, "show", "ref:chat/main"))
    ok(cli(store, "verify", "ref:chat/main"))
    # show, verify and export read a name holding / as a path: a missing one that is a
    # ref says how to write it, rather than a bare "no such file"
    for command in ("show", "verify", "export"):
        one_error(cli(store, command, "chat/main"), "chat/main: no such file", "write ref:chat/main")
    assert ok(cli(store, "delete", "abce")).startswith("deleted abce-two ")


def test_show_first_and_tail_limit_the_listing(store):
    path = str(FIXTURES / "basic.jsonl")
    sf = read_session(FIXTURES / "basic.jsonl")

    def listed(*args: str) -> list[str]:
        out = ok(cli(None, "show", *args, path)).splitlines()
        start = next(i for i, ln in enumerate(out) if ln.startswith("LINE "))
        return [ln.split()[1] for ln in out[start + 1:] if ln and not ln.startswith("(")][: len(sf.entries)]

    short = [e.id[7:19] for e in sf.entries]
    assert listed("-n", "2")[:2] == short[:2] and "(2 of 7 entries listed)" in ok(cli(None, "show", "-n", "2", path))
    assert listed("--tail", "1")[0] == short[-1]
    assert "entries listed" not in ok(cli(None, "show", path))
    assert cli(None, "show", "-n", "-1", path).exit_code == 2


def test_export_refuses_a_plain_file(store):
    one_error(cli(store, "export", str(FIXTURES / "basic.jsonl")), "not a session of a store")


# -- cat-object, delete ------------------------------------------------------


def test_cat_object(store):
    ids = new_session(store, "s1", 1)
    env = cli(store, "cat-object", ids[0]).stdout_bytes
    envelope = json.loads(env)
    assert envelope["type"] == "config" and envelope["parent"] is None
    assert ok(cli(store, "cat-object", "-t", ids[0])).strip() == "entries"
    assert ok(cli(store, "cat-object", "-t", envelope["content"][7:])).strip() == "contents"
    assert json.loads(cli(store, "cat-object", envelope["content"]).stdout_bytes) == {"model": "m1"}
    one_error(cli(store, "cat-object", "sha256:" + "4" * 64), "no object")
    one_error(cli(store, "cat-object", "../../etc/passwd"), "not an object name")
    flip_byte(object_path(store, "entries", ids[0]))
    one_error(cli(store, "cat-object", ids[0]), "corrupt object", ids[0], "objects/entries/")


def test_delete(store):
    ids = new_session(store, "s1", 1)
    assert ok(cli(store, "delete", "s1")) == f"deleted s1 (head {ids[-1]})\n"
    assert json.loads(ok(cli(store, "list", "--json"))) == []
    one_error(cli(store, "delete", "s1"), "no such session: s1")


def test_delete_says_which_refs_dangle_and_takes_a_damaged_session(store):
    ids = new_session(store, "s1", 2)
    new_session(store, "s2", 1)
    ok(cli(store, "ref", "update", "chat/a", "s1"))
    ok(cli(store, "ref", "update", "chat/b", "s2"))
    r = cli(store, "delete", "s1")
    assert r.exit_code == 0 and r.stdout == f"deleted s1 (head {ids[-1]})\n"
    assert "ref chat/a named s1 and dangles now" in r.stderr and "chat/b" not in r.stderr
    log = store / "sessions" / "s2" / "log"
    data = bytearray(log.read_bytes())
    data[5] ^= 0x20  # the create record's checksum no longer holds: the session does not read
    log.write_bytes(bytes(data))
    out = json.loads(ok(cli(store, "delete", "s2", "--json")))
    assert out == {"session": "s2", "deleted": True, "head": None, "dangling_refs": ["chat/b"]}


# -- errors common to the session commands -----------------------------------


@pytest.mark.parametrize(
    "args",
    [["log", "ghost"], ["export", "ghost"], ["head", "ghost"], ["delete", "ghost"], ["show", "ghost"], ["verify", "ghost"]],
)
def test_unknown_session_is_one_line(store, args):
    """The error names the session and the store it was looked for in."""
    one_error(cli(store, *args), "ghost", f"the store at {store}")


def test_a_session_id_the_store_holds_is_refused_naming_the_store(store):
    """import of a file twice, or create --id of a held id: the error says where it is held."""
    ok(cli(store, "import", str(FIXTURES / "basic.jsonl")))
    one_error(cli(store, "import", str(FIXTURES / "basic.jsonl")), "already exists in the store at", str(store))
    ok(cli(store, "create", "--id", "s1"))
    one_error(cli(store, "create", "--id", "s1"), f"session s1 already exists in the store at {store}")


def test_unknown_session_for_a_ref_names_the_store(store):
    one_error(cli(store, "ref", "update", "chat/x", "ghost"), "no such session: ghost", f"(none in the store at {store})")


def test_unknown_session_for_append(store):
    one_error(cli(store, "append", "ghost", input="{}"), "no such session: ghost")


def test_append_at_a_terminal_refuses_an_unknown_session_before_the_entry_is_typed(store, monkeypatch):
    """At a terminal the person typed the entry, ended it with Ctrl-D, and only then heard
    that the session name was mistyped: now the name is resolved first, and standard input
    is not read (no "reading standard input" note)."""
    from agentsession_cli import terminal

    new_session(store, "s1", 1)
    monkeypatch.setattr(terminal, "isatty", lambda stream: stream is sys.stdin)
    one_error(cli(store, "append", "ghost", input=json.dumps(user("hi"))), "no such session: ghost")
    r = cli(store, "append", "s1", input=json.dumps(user("hi")))
    assert r.exit_code == 0 and r.stderr == "agentsession: note: reading standard input (end it with Ctrl-D)\n"


@pytest.mark.parametrize("args", [["log", "../x"], ["head", "../x"], ["delete", "../x"], ["log", ".."], ["create", "--id", "a/b"],
                                  ["create", "--id", ""], ["create", "--id", "", "--header", "-"]])
def test_bad_session_id_is_refused_before_any_path(store, args):
    one_error(cli(store, *args), "not usable")


def test_bad_session_id_for_append(store):
    one_error(cli(store, "append", "../x", input=json.dumps(CONFIG)), "not usable")


def test_show_and_verify_a_missing_plain_name(store, monkeypatch):
    monkeypatch.chdir(store)  # ("../x" beside the store, not beside wherever the tests run)
    one_error(cli(store, "show", "ghost"), "no such file, nor a session")
    one_error(cli(store, "verify", "../x"), "no such file")


# -- locks: a writer beside the CLI ------------------------------------------


def test_locked_session_refuses_a_second_writer_and_readers_still_work(store):
    ids = new_session(store, "s1", 2)
    with Store(store) as held:
        held.session("s1").append(user("held", "2026-09-17T12:00:08Z"), durable=False)
        one_error(cli(store, "append", "s1", input=json.dumps(user("x"))), "locked by another process")
        one_error(cli(store, "head", "s1", ids[0], "--expect", ids[1]), "locked by another process")
        one_error(cli(store, "delete", "s1"), "locked by another process")
        # read-only commands take no lock
        assert json.loads(ok(cli(store, "list", "--json")))[0]["entries"] == 3
        ok(cli(store, "show", "s1"))
        ok(cli(store, "log", "s1"))
        ok(cli(store, "export", "s1"))
        ok(cli(store, "verify", "s1"))
        assert ok(cli(store, "head", "s1")).strip() != ids[1]
        # other sessions of the store can be written meanwhile
        new_session(store, "s2", 1)
    assert ok(cli(store, "append", "s1", input=json.dumps(user("after", "2026-09-17T12:00:09Z")))).startswith("sha256:")


# -- show and verify of stored sessions ---------------------------------------


def test_show_stored_session_is_its_projection_shown(store, tmp_path):
    ids = new_session(store, "s1", 3)
    out = tmp_path / "p.jsonl"
    ok(cli(store, "export", "s1", "-o", str(out)))
    as_session = json.loads(ok(cli(store, "show", "--json", "s1")))
    as_file = json.loads(ok(cli(store, "show", "--json", str(out))))
    assert as_session["source"] == "s1"
    as_file["source"] = "s1"
    assert as_session["runs"]["source"] == "s1"
    as_file["runs"]["source"] = "s1"
    assert as_session == as_file
    assert as_session["leaf"] == ids[-1]
    text = ok(cli(store, "show", "s1"))
    assert "session  s1" in text and f"leaf {ids[-1][7:19]}" in text


def test_show_verify_export_through_a_path_inside_the_session_dir(store, tmp_path):
    ids = new_session(store, "s1", 2)
    sdir = store / "sessions" / "s1"
    elsewhere = tmp_path / "no-such-store"  # the path's own store is used, not --store
    for path in (sdir, sdir / "log", sdir / "header"):
        r = cli(elsewhere, "show", "--json", str(path))
        assert json.loads(ok(r))["leaf"] == ids[-1]
        assert "session s1" in r.stderr and "note:" in r.stderr
        r = cli(elsewhere, "verify", str(path))
        assert "0 problem(s)" in ok(r) and "note:" in r.stderr
    assert cli(elsewhere, "export", str(sdir / "HEAD")).stdout_bytes == cli(store, "export", "s1").stdout_bytes
    one_error(cli(store, "verify", str(store / "objects")), "is a directory")


def test_verify_json_shape(store):
    new_session(store, "s1", 2)
    out = json.loads(ok(cli(store, "verify", "--json", "s1")))
    assert out["ok"] is True and out["session"] == "s1" and out["entries"] == 2
    assert out["problems"] == [] and out["store"] == str(store)
    ok(cli(store, "create", "--id", "empty"))
    r = cli(store, "verify", "--json", "empty")  # as verify of its export: a session just created
    assert r.exit_code == 0 and json.loads(r.stdout)["ok"] is True


@pytest.mark.parametrize("space", ["entries", "contents"])
def test_verify_names_a_bit_flipped_object(store, space):
    ids = new_session(store, "s1", 3)
    name = ids[1]
    if space == "contents":
        name = json.loads(cli(store, "cat-object", ids[1]).stdout_bytes)["content"]
    path = object_path(store, space, name)
    flip_byte(path)
    r = cli(store, "verify", "s1")
    assert r.exit_code == 1
    assert f"corrupt object: {space} object {name}" in r.stdout and str(path.relative_to(store)) in r.stdout
    assert "1 problem(s)" in r.stdout
    out = json.loads(cli(store, "verify", "--json", "s1").stdout)
    assert out["ok"] is False
    [p] = out["problems"]
    rel = str(path.relative_to(store))  # (a finding names a file relative to the store)
    assert (p["code"], p["object"], p["space"], p["path"], p["file"]) == ("corrupt-object", name, space, rel, rel)
    # and it is never served: refused with its code, naming it and where it lies
    one_error(cli(store, "show", "s1"), "corrupt object", name, str(path.relative_to(store)))
    one_error(cli(store, "export", "s1"), "corrupt object", name)
    refused = cli(store, "show", "--json", "s1")
    assert refused.exit_code == 1 and json.loads(refused.stderr)["error"]["code"] == "corrupt_object"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_an_object_that_is_no_regular_file_is_corrupt_not_a_hang(store, kind):
    """A FIFO where a loose object belongs would block a read forever, and a link to
    /dev/zero would never end: both are reported as a corrupt object, at once."""
    ids = new_session(store, "s1", 2)
    path = object_path(store, "entries", ids[0])
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    for args in (["cat-object", ids[0]], ["export", "s1"]):
        r = subprocess.run([str(EXE), "--store", str(store), *args], capture_output=True, timeout=60)
        assert r.returncode == 1, r
        assert b"not a regular file" in r.stderr and ids[0].encode() in r.stderr


def test_verify_of_a_damaged_session_names_it_once(store):
    """A head record naming an entry no append holds (its checksum good): verify says
    what is wrong as `ID: record N: ...`, naming the session once, with the code fsck gives
    the same fault (head-rule)."""
    from agentsession_cas.backends.files.log import encode_record

    new_session(store, "s1", 2)
    log = store / "sessions" / "s1" / "log"
    from storetools import chained_after

    with open(log, "ab") as f:
        f.write(chained_after(log.read_bytes(), encode_record({"op": "head", "head": "sha256:" + "ab" * 32, "seq": 99})))
    r = cli(store, "verify", "s1")
    assert r.exit_code == 1
    first = r.stdout.splitlines()[0]
    assert first.startswith("s1: record ") and "which no append of the log holds" in first, first
    assert first.count("s1") == 1
    codes = [p["code"] for p in json.loads(cli(store, "verify", "s1", "--json").stdout)["problems"]]
    assert codes == ["head-rule"]
    assert "refuses writes until repaired" in cli(store, "export", "s1").stderr


def test_repair_rewrites_stale_indexes_of_a_whole_log(store):
    """A mirror's HEAD and mark files changed behind the store's back: fsck reports
    them, and repair (which no writer's open would do for a mirror) rewrites them to
    what the log says; a dry run says so and writes nothing."""
    sid = ok(cli(store, "import", str(FIXTURES / "basic.jsonl"))).strip()
    log = [r["entry"] for r in json.loads(ok(cli(store, "log", sid, "--json"))) if r.get("entry")]
    sdir = store / "sessions" / sid
    (sdir / "HEAD").write_text(log[2] + "\n")
    (sdir / "mark").write_text("record\n")
    r = cli(store, "fsck")
    assert r.exit_code == 1 and "stale-head" in r.stdout and f"agentsession repair {sid}" in r.stdout
    dry = ok(cli(store, "repair", "--dry-run", sid))
    assert "to rewrite" in dry and (sdir / "mark").read_text() == "record\n"
    out = json.loads(ok(cli(store, "repair", "--json", "--yes", sid)))
    assert out["damaged"] is False and out["indexes_fixed"] is True
    assert [x["file"] for x in out["stale_indexes"]] == ["HEAD", "mark"]
    assert (sdir / "HEAD").read_text() == log[-1] + "\n" and (sdir / "mark").read_text() == "mirror\n"
    ok(cli(store, "fsck"))
    assert "nothing to repair" in ok(cli(store, "repair", "--yes", sid))


def test_repair_writes_back_a_lost_header_file_from_the_log(store):
    """A session directory whose header file is gone (its log whole, and holding the
    header): the store lists it no more and fsck says so (missing-header); repair, which
    refused it as no session, writes the file again from the log (a dry run only says
    so), and the session is listed, read and clean again."""
    sid = ok(cli(store, "import", str(FIXTURES / "basic.jsonl"))).strip()
    header = store / "sessions" / sid / "header"
    held = header.read_bytes()
    header.unlink()
    r = cli(store, "fsck")
    assert r.exit_code == 1 and "missing-header" in r.stdout
    named = cli(store, "show", sid)  # named, it is damaged, and the advice repairs this store
    assert named.exit_code == 1 and f"agentsession --store {store} repair {sid}" in named.stderr, named.stderr
    dry = cli(store, "repair", "--dry-run", sid)
    assert dry.exit_code == 0 and "header" in dry.stdout and "to rewrite" in dry.stdout, (dry.stdout, dry.stderr)
    assert not header.exists()
    out = json.loads(ok(cli(store, "repair", "--json", "--yes", sid)))
    assert out["damaged"] is False and out["indexes_fixed"] is True, out
    assert "header" in [x["file"] for x in out["stale_indexes"]]
    assert header.read_bytes() == held
    ok(cli(store, "fsck"))
    assert sid in ok(cli(store, "list"))


@pytest.mark.parametrize("how", ["corrupt", "missing"])
def test_repair_restores_an_object_from_the_log_payload(store, how):
    """A loose object corrupt or gone while the log still carries it whole: export
    refuses, repair writes it back from the log (a dry run only says so), export works."""
    ids = new_session(store, "s1", 3)
    content = json.loads(cli(store, "cat-object", ids[1]).stdout_bytes)["content"]
    path = object_path(store, "contents", content)
    if how == "corrupt":
        flip_byte(path)
    else:
        path.unlink()
    assert cli(store, "export", "s1").exit_code == 1
    assert "to restore" in ok(cli(store, "repair", "--dry-run", "s1"))
    assert cli(store, "export", "s1").exit_code == 1
    out = json.loads(ok(cli(store, "repair", "--json", "--yes", "s1")))
    assert out["restorable"] == [{"space": "contents", "name": content}] and out["objects_restored"] is True
    ok(cli(store, "export", "s1"))
    ok(cli(store, "fsck"))


def test_verify_names_a_missing_object(store):
    ids = new_session(store, "s1", 2)
    object_path(store, "entries", ids[0]).unlink()
    r = cli(store, "verify", "s1")
    assert r.exit_code == 1 and f"no entries object {ids[0]}" in r.stdout


def test_verify_and_log_report_a_damaged_log_line(store):
    new_session(store, "s1", 3)
    log = store / "sessions" / "s1" / "log"
    data = bytearray(log.read_bytes())
    second = data.index(b"\n") + 1
    data[second + 30] ^= 0x01  # inside line 2, before the last commit
    log.write_bytes(bytes(data))
    r = cli(store, "verify", "s1")
    assert r.exit_code == 1 and "log line 2" in r.stdout and "checksum" in r.stdout
    out = json.loads(cli(store, "verify", "--json", "s1").stdout)
    assert [(p["where"], p["line"]) for p in out["problems"]] == [("log", 2)]
    r = cli(store, "log", "s1")
    assert r.exit_code == 1 and "log line 2" in r.stderr and r.stdout.splitlines()[1].split()[1] == "create"
    r = cli(store, "list", "--json")
    row = json.loads(r.stdout)[0]
    assert r.exit_code == 1 and row["mark"] == "damaged" and "log line 2" in row["error"]
    assert row["code"] == "session_damaged" and r.stderr == ""  # under --json the row is the report, with its code
    r = cli(store, "list")
    assert r.exit_code == 1 and r.stderr.startswith("agentsession: error: session s1 is damaged: log line 2")
    one_error(cli(store, "append", "s1", input=json.dumps(user("x"))), "damaged", "log line 2")
    one_error(cli(store, "show", "s1"), "damaged")


def test_verify_torn_tail_is_a_note_not_a_problem(store):
    new_session(store, "s1", 2)
    log = store / "sessions" / "s1" / "log"
    with open(log, "ab") as f:
        f.write(b"0123456789abcdef {\"op\":\"app")
    r = cli(store, "verify", "s1")
    assert ok(r) and "note:" in r.stdout and "uncommitted" in r.stdout
    r = cli(store, "log", "s1")
    assert ok(r) and "note:" in r.stderr


# -- the reference corpus ------------------------------------------------------


GOOD = ["basic", "branch", "compaction", "converge", "extensions", "fork", "handback", "instructions",
        "omit", "pinned", "queued", "runs"]


@needs_corpus
def test_corpus_files_import_verify_and_export_in_order(tmp_path):
    for name in GOOD:
        store = tmp_path / name
        ok(cli(store, "init"))
        src = CORPUS / f"{name}.jsonl"
        sid = ok(cli(store, "import", str(src))).strip()
        sf = read_session(src)
        assert sid == sf.header.id
        ok(cli(store, "verify", sid))
        exported = read_session_from_bytes(cli(store, "export", sid).stdout_bytes)
        want = [e.id for e in sf.entries if not (e.type == "label" and e.synthetic)]
        got = [e.id for e in exported.entries if not (e.type == "label" and e.synthetic)]
        assert got == want, name
        assert exported.leaf == (ok(cli(store, "head", sid)).strip() or None), name


def read_session_from_bytes(data: bytes):
    from agentsession_cas import read_session_bytes

    return read_session_bytes(data, source="<export>")


# -- the installed console script --------------------------------------------


def test_console_script_store_round(tmp_path):
    if not EXE.exists():
        pytest.skip(f"console script not installed at {EXE}")
    store = tmp_path / "store"
    env = dict(os.environ, AGENTSESSION_STORE=str(store))
    run = lambda *a, **kw: subprocess.run([str(EXE), *a], capture_output=True, env=env, **kw)  # noqa: E731
    assert run("init").returncode == 0
    r = run("import", str(FIXTURES / "branches.jsonl"))
    assert r.returncode == 0, r.stderr
    sid = r.stdout.decode().strip()
    listed = json.loads(run("list", "--json").stdout)
    assert [s["session"] for s in listed] == [sid]
    r = run("verify", str(store / "sessions" / sid / "log"))
    assert r.returncode == 0 and b"note:" in r.stderr
    r = run("append", sid, input=b"{}")
    assert r.returncode == 1 and r.stderr.decode().startswith("agentsession: error:") and b"Traceback" not in r.stderr
    r = run("head", sid, "x")
    assert r.returncode == 2


def test_console_script_lock_across_processes(tmp_path):
    if not EXE.exists():
        pytest.skip(f"console script not installed at {EXE}")
    store = tmp_path / "store"
    ok(cli(store, "init"))
    new_session(store, "s1", 1)
    with Store(store) as held:
        held.session("s1")
        r = subprocess.run([str(EXE), "--store", str(store), "append", "s1"], input=json.dumps(user("x")).encode(),
                           capture_output=True, timeout=30)
        assert r.returncode == 1
        assert r.stderr.decode().strip() == "agentsession: error: session s1 is locked by another process"
        r = subprocess.run([str(EXE), "--store", str(store), "show", "s1"], capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr


def test_create_with_an_empty_id_is_refused_not_replaced(tmp_path):
    from click.testing import CliRunner

    from agentsession_cli.main import main

    store = str(tmp_path / "st")
    assert CliRunner().invoke(main, ["--store", store, "init"]).exit_code == 0
    r = CliRunner().invoke(main, ["--store", store, "create", "--id", ""])
    assert r.exit_code == 1
    assert "error" in r.output
    assert CliRunner().invoke(main, ["--store", store, "list", "--json"]).output.strip() == "[]"


def test_append_says_a_request_hash_finding_and_a_note(store):
    """A response whose request_hash does not match is stored and said (verify fails it);
    an output naming no call is taken with verify's note."""
    new_session(store, "s1", 1)
    bad = {"type": "response", "ts": "2026-09-17T12:00:05Z", "response_id": "r1", "request_hash": "sha256:" + "ab" * 32}
    r = cli(store, "append", "s1", input=json.dumps(bad))
    assert r.exit_code == 0 and "request_hash: " in r.stderr and "MISMATCH" in r.stderr and "stored" in r.stderr
    out = json.loads(ok(cli(store, "append", "--json", "s1", input=json.dumps(
        {"type": "item", "ts": "2026-09-17T12:00:06Z", "item": {"type": "function_call_output", "call_id": "x", "output": "o"}}))))
    assert [n["code"] for n in out["notes"]] == ["orphan-output"] and out["findings"] == []
    v = cli(store, "verify", "s1")
    assert v.exit_code == 1 and "MISMATCH" in v.output


def test_cat_object_takes_a_unique_prefix_and_json(store):
    """As `git cat-file` takes a short id: 4+ hex digits naming one object of any space; a
    prefix naming several is `ambiguous`, listing them; --json gives the parsed object."""
    from agentsession_cas.store import Store

    for f in ("basic", "branches", "extensions"):
        ok(cli(store, "import", str(FIXTURES / f"{f}.jsonl")))
    st = Store(store, readonly=True)
    names = sorted({n for sp in ("entries", "contents", "blobs") for n in st.objects.names(sp)})
    by4: dict[str, list[str]] = {}
    for n in names:
        by4.setdefault(n[7:11], []).append(n)
    unique = next(v[0] for v in by4.values() if len(v) == 1)
    assert ok(cli(store, "cat-object", unique[7:13])).encode() == st.cat_object(unique)[1]
    out = json.loads(ok(cli(store, "cat-object", "--json", "sha256:" + unique[7:12])))
    space, data = st.cat_object(unique)
    assert (out["object"], out["space"], out["size"]) == (unique, space, len(data)) and out["json"] == json.loads(data)
    # Two blobs whose names share their first 4 hex digits (found by trying, deterministic).
    import hashlib

    seen: dict[str, bytes] = {}
    for i in range(100_000):
        data = b"blob %d" % i
        p4 = hashlib.sha256(data).hexdigest()[:4]
        if p4 in seen and p4 not in by4:
            pair = [seen[p4], data]
            break
        seen.setdefault(p4, data)
    with Store(store) as w:
        for data in pair:
            w.objects.put("blobs", "sha256:" + hashlib.sha256(data).hexdigest(), data)
    line = one_error(cli(store, "cat-object", p4), "is the start of 2 objects")
    assert all(hashlib.sha256(d).hexdigest() in line for d in pair)
    assert json.loads(ok(cli(store, "cat-object", "--json", "sha256:" + hashlib.sha256(pair[0]).hexdigest())))["base64"]
    one_error(cli(store, "cat-object", "abc"), "not an object name nor a prefix")
    absent = next(f"{i:04x}" for i in range(1 << 16) if f"{i:04x}" not in by4)
    one_error(cli(store, "cat-object", absent), "starts with")


def _help_example(command: str) -> str:
    """The shell lines under `Example` in a command's help."""
    lines = ok(cli(None, command, "--help")).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Example"))
    block = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        block.append(line.strip())
    return "\n".join(block)


@pytest.mark.parametrize("command", ["append", "create"])
def test_the_help_example_runs_as_written(store, tmp_path, command):
    """The examples `append --help` and `create --help` give run, ID being a session's id
    (they were added with this test: neither help had one)."""
    ids = new_session(store, "s1", 2)
    example = re.sub(r"\bID\b", "s1", _help_example(command))
    env = {**os.environ, "AGENTSESSION_STORE": str(store), "PATH": f"{EXE.parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", example], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, (example, r.stderr)
    with Store(store, readonly=True) as st:
        if command == "append":
            assert st.read("s1").head == r.stdout.strip() and len(st.read("s1")) == 3
        else:
            assert st.read("s1-retry").base == ids[-1]


def test_migrate_of_a_store_directory_needs_no_postgresql_driver(store, tmp_path):
    """Without the `postgresql` extra (psycopg not installed), `migrate --help` and `migrate`
    of a store directory work: they failed with `internal error (ModuleNotFoundError: No
    module named 'psycopg')`, the command's module importing the PostgreSQL backend."""
    code = (
        "import sys; sys.modules['psycopg'] = None  # as where the extra is not installed\n"
        "from agentsession_cli.main import main\n"
        "main(sys.argv[1:])\n"
    )
    for args in (["migrate", "--help"], ["--store", str(store), "migrate", "-y"]):
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0 and "internal error" not in r.stderr, (args, r.stdout, r.stderr)
    assert r.stdout.startswith("nothing to migrate"), r.stdout


def test_a_postgresql_store_without_the_driver_says_which_extra_to_install(tmp_path):
    """Without the `postgresql` extra, `--store postgresql://…` is refused with the extra
    to install (code `unsupported`), not `internal error (ModuleNotFoundError ...)`: the
    backend's sessions module imported psycopg unguarded."""
    code = (
        "import sys; sys.modules['psycopg'] = None  # as where the extra is not installed\n"
        "from agentsession_cli.main import main\n"
        "main(sys.argv[1:])\n"
    )
    r = subprocess.run([sys.executable, "-c", code, "--store", "postgresql://localhost/none", "list", "--json"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "internal error" not in r.stderr and "agentsession-cas[postgresql]" in r.stderr, r.stderr
    assert json.loads(r.stderr)["error"]["code"] == "unsupported", r.stderr
