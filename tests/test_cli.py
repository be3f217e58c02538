"""The agentsession command: output shapes, exit codes and one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from agentsession_cas import Header, SessionBuilder, make_entry
from agentsession_cli.main import main

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus" / "sessions"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
needs_corpus = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"reference corpus not found at {CORPUS}")

TS = "2026-09-17T12:00:0{}Z"


def run(*args: str, input: bytes | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def build(tmp_path: Path, name: str = "s.jsonl") -> tuple[Path, SessionBuilder]:
    b = SessionBuilder(Header.new("sess-1", created_at="2026-09-17T12:00:00Z"))
    b.append("config", ts=TS.format(0), model="m1")
    b.append("item", ts=TS.format(1), item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
    b.append("item", ts=TS.format(2), item={"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]})
    path = tmp_path / name
    b.write(path)
    return path, b


# -- verify -----------------------------------------------------------------


def test_verify_clean_file_exits_0(tmp_path):
    path, b = build(tmp_path)
    r = run("verify", str(path))
    assert r.exit_code == 0, r.output
    assert "3 entries read, each id checked against its hash; 0 problem(s)" in r.output


def test_verify_json_reports_problems_with_lines(tmp_path):
    path, b = build(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"hi"', b'"HI"')  # content changed, id kept
    path.write_bytes(b"".join(lines))
    r = run("verify", "--json", str(path))
    assert r.exit_code == 1
    out = json.loads(r.output)
    assert out["ok"] is False
    assert [(p["line"], p["code"]) for p in out["problems"]] == [(3, "hash")]


def test_verify_bad_ts_is_reported_like_a_bad_hash(tmp_path):
    path, b = build(tmp_path)
    # A second entry whose ts is spelled with an offset: its id is computed over that spelling.
    obj = dict(make_entry("item", b.leaf, ts=TS.format(3), item={"type": "message", "role": "user", "content": []}).data)
    obj["ts"] = "2026-09-17T12:00:03+00:00"
    from agentsession_cas.format.hashing import entry_hashes
    obj["id"] = entry_hashes(obj)[0]
    with open(path, "ab") as f:
        f.write(json.dumps(obj).encode() + b"\n")
    r = run("verify", str(path))
    assert r.exit_code == 1
    assert 'line 5: ts "2026-09-17T12:00:03+00:00" is not in the admitted form' in r.output


def test_verify_header_only_is_a_session_with_a_note(tmp_path):
    """A header alone is a session just created, which import takes: verify notes it and
    succeeds (it said 'nothing to verify' and exit 1 while import took the file)."""
    path = tmp_path / "h.jsonl"
    path.write_bytes(Header.new("x", created_at="2026-09-17T12:00:00Z").canonical_line())
    r = run("verify", str(path))
    assert r.exit_code == 0
    assert "note: the file holds a header and no entries" in r.output and "0 problem(s)" in r.output


@needs_corpus
@pytest.mark.parametrize(
    "name, expected",
    [
        ("bad-parent.jsonl", "line 4: parent sha256:9b1aa7"),
        ("duplicate-id.jsonl", "line 11: id f27ee964a736 repeats line 3"),
        ("missing-id.jsonl", "line 3: the entry has no id"),
        ("corrupt-middle.jsonl", "line 3: the line does not parse as JSON"),
        # (its last line was cut mid-write but ends with LF: not worded as cut short)
        ("truncated.jsonl", "line 10: the last line does not parse as JSON"),
        ("unsupported-format.jsonl", "line 1: unsupported format agentsession/1.0"),
        ("bad-base-parent.jsonl", "line 10: an own entry must hang from the base"),
        ("bad-parents.jsonl", "line 3: 'parents' names sha256:78270f"),
    ],
)
def test_verify_refuses_each_broken_corpus_file_for_its_reason(name, expected):
    r = run("verify", str(CORPUS / name))
    assert r.exit_code == 1
    assert expected in r.output


@needs_corpus
def test_verify_migrated_file_says_so():
    r = run("verify", str(CORPUS / "v0.4" / "basic.jsonl"))
    assert r.exit_code == 0, r.output
    assert "migrated from agentsession/0.1" in r.output


@needs_corpus
@pytest.mark.parametrize("name", ["basic", "branch", "fork", "converge", "extensions", "runs"])
def test_verify_good_corpus_files(name):
    r = run("verify", str(CORPUS / f"{name}.jsonl"))
    assert r.exit_code == 0, r.output


# -- show -------------------------------------------------------------------


def test_show_json_shape(tmp_path):
    path, b = build(tmp_path)
    r = run("show", "--json", str(path))
    assert r.exit_code == 0
    out = json.loads(r.output)
    assert out["header"]["id"] == "sess-1"
    assert [e["line"] for e in out["entries"]] == [2, 3, 4]
    assert [e["id"] for e in out["entries"]] == [e.id for e in b.entries]
    assert out["entries"][1]["parent"] == b.entries[0].id
    assert out["leaf"] == b.leaf
    assert out["truncated"] is None
    assert out["path"] == [e.id for e in b.entries]


def test_show_reports_truncation_and_still_shows_prefix(tmp_path):
    path, b = build(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 20])  # cut the last line in half
    r = run("show", "--json", str(path))
    assert r.exit_code == 0
    out = json.loads(r.output)
    assert out["truncated"]["line"] == 4
    assert len(out["entries"]) == 2
    text = run("show", str(path)).output
    assert "truncated: line 4" in text


def test_show_text_lists_entries_and_leaf(tmp_path):
    path, b = build(tmp_path)
    r = run("show", str(path))
    assert r.exit_code == 0
    assert "LINE  ID" in r.output
    assert b.entries[1].id[7:19] in r.output
    assert 'user: "hi"' in r.output
    assert f"leaf {b.leaf[7:19]}" in r.output


def test_show_names_a_custom_entry_without_ns_without_printing_none(tmp_path):
    """`ns` is optional on a `custom` entry (nothing requires it): its row says so, never
    Python's `None` (`-v` too)."""
    path, b = build(tmp_path)
    b.append("custom", data={"k": 1})
    b.append("custom", ns="acme", data={"k": 1})
    b.write(path)
    for verbose in ([], ["-v"]):
        rows = [line for line in run("show", *verbose, str(path)).output.splitlines() if " custom " in line]
        assert len(rows) == 2 and "None" not in rows[0] and "acme" in rows[1], rows
        assert "no ns" in rows[0]


def test_show_leaf_option_accepts_prefix_and_refuses_unknown(tmp_path):
    path, b = build(tmp_path)
    first = b.entries[0].id
    r = run("show", "--json", "--leaf", first[7:15], str(path))
    assert json.loads(r.output)["leaf"] == first
    r = CliRunner().invoke(main, ["show", "--leaf", "deadbeef", str(path)])
    assert r.exit_code == 1
    assert "no such entry: deadbeef" in r.output


def test_show_leaf_errors_name_the_file_searched(tmp_path):
    """A `--leaf` that names no entry, or several, says where it was looked for."""
    path = FIXTURES / "branches.jsonl"  # two of its entries' ids start with 1 (11524a74…, 1916159c…)
    r = CliRunner().invoke(main, ["show", "--leaf", "deadbeef", str(path)])
    assert r.exit_code == 1 and f"no such entry: deadbeef (no id, legacy_id or id prefix in {path})" in r.stderr
    r = CliRunner().invoke(main, ["show", "--leaf", "1", str(path)])  # fewer than 4 digits: no name at all
    assert r.exit_code == 1 and "'1' is not an entry id nor a prefix of one" in r.stderr and str(path) in r.stderr


@needs_corpus
def test_show_legacy_id_as_leaf():
    r = run("show", "--json", "--leaf", "r0000001", str(CORPUS / "basic.jsonl"))
    out = json.loads(r.output)
    assert out["leaf"].startswith("sha256:f2a302d")
    assert len(out["path"]) == 5


# -- hash-object ------------------------------------------------------------


def test_hash_object_prints_id_and_content_hash(tmp_path):
    path, b = build(tmp_path)
    r = run("hash-object", str(path))
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert lines == [f"{e.id} {e.content_hash}" for e in b.entries]


def test_hash_object_reads_stdin_and_flags_a_stated_id_that_differs(tmp_path):
    e = make_entry("item", None, ts=TS.format(1), item={"type": "message"})
    obj = dict(e.data, id="sha256:" + "0" * 64)
    r = run("hash-object", "-", input=json.dumps(obj).encode() + b"\n")
    assert r.exit_code == 0
    assert r.output.strip() == f"{e.id} {e.content_hash}  !"


def test_hash_object_bad_line_is_named_and_exits_1():
    good = make_entry("item", None, ts=TS.format(1), item={"type": "message"})
    data = good.canonical_line() + b'{"type":"item","parent":null,"ts":"2026-09-17T12:00:01Z","a":1,"a":2}\n'
    r = CliRunner().invoke(main, ["hash-object"], input=data)
    assert r.exit_code == 1
    assert "line 2:" in r.stderr and "repeated" in r.stderr
    # --json: the lines that hashed on stdout, and one error object with each line's problem
    r = CliRunner().invoke(main, ["hash-object", "--json"], input=data)
    assert r.exit_code == 1
    assert [h["id"] for h in json.loads(r.stdout)] == [good.id]
    error = json.loads(r.stderr)["error"]
    assert error["code"] == "bad_file" and error["message"].startswith("1 line could not be hashed; the first, line 2:")
    assert [(p["line"], p["code"]) for p in error["problems"]] == [(2, "ijson")]


def test_hash_object_words_a_bad_line_as_the_reader_does(tmp_path):
    """A line that cannot be hashed is worded by the reader's one rule (`verify` says the
    same): a cut-short last line is called so, and a parse error names its column, not
    the parser's "line 1 column N (char M)" of a one-line document."""
    path, b = build(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(2, b'{"type":"item", oops}\n')
    lines[-1] = lines[-1][:30]
    path.write_bytes(b"".join(lines))
    r = CliRunner().invoke(main, ["hash-object", str(path)])
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [
        "agentsession: line 3: the line does not parse as JSON: Expecting property name enclosed in double quotes at column 17",
        f"agentsession: line {len(lines)}: the last line was cut short: does not parse as JSON: "
        "Unterminated string starting at column 7",
    ]
    assert len(r.stdout.splitlines()) == len(lines) - 3  # the header and the two bad lines give none


@pytest.mark.parametrize("argv", [["hash-object"], ["verify", "-"], ["show", "-"]])
def test_reading_standard_input_at_a_terminal_says_so(monkeypatch, argv):
    """A bare `hash-object` (its FILE defaults to standard input) at a terminal waited
    without a word: a note now says what it reads and how to end it. Off a terminal
    (a pipe, a file) nothing is said."""
    from agentsession_cli import terminal

    data = (FIXTURES / "basic.jsonl").read_bytes()
    quiet = CliRunner().invoke(main, argv, input=data)
    assert quiet.exit_code == 0 and quiet.stderr == ""
    monkeypatch.setattr(terminal, "isatty", lambda stream: stream is sys.stdin)
    r = CliRunner().invoke(main, argv, input=data)
    assert r.exit_code == 0 and r.stdout == quiet.stdout
    assert r.stderr == "agentsession: note: reading standard input (end it with Ctrl-D)\n"


# -- errors -----------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["--colour", "never", "list", "--json"],  # an option of the group misspelt
    ["--color", "sometimes", "list", "--json"],  # a bad value of one
])
def test_a_usage_error_of_the_group_under_json_is_json_too(argv):
    """Under --json a usage error is one JSON object with code `usage` on stderr (exit 2),
    whether the group's options or the subcommand's are wrong: the group's were printed
    as click's text."""
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    err = json.loads(r.stderr)["error"]
    assert err["code"] == "usage" and ("--colour" in err["message"] or "sometimes" in err["message"])


@pytest.mark.parametrize("command", ["show", "verify", "hash-object"])
def test_missing_file_is_one_line_exit_1(tmp_path, command):
    r = CliRunner().invoke(main, [command, str(tmp_path / "nope.jsonl")])
    assert r.exit_code == 1
    assert r.output.strip() == f"agentsession: error: {tmp_path / 'nope.jsonl'}: no such file"


@pytest.mark.parametrize("command", ["show", "verify", "hash-object", "import"])
def test_an_empty_file_name_is_named_in_the_error(tmp_path, command):
    """`show "$UNSET"`: the error says which name was missing, quoted, not a bare "no such file"."""
    assert CliRunner().invoke(main, ["--store", str(tmp_path / "s"), "init"]).exit_code == 0
    r = CliRunner().invoke(main, ["--store", str(tmp_path / "s"), command, ""])
    assert r.exit_code == 1
    assert r.output.strip() == "agentsession: error: '': no such file"


@pytest.mark.parametrize("command", ["show", "verify", "hash-object"])
def test_directory_is_one_line_exit_1(tmp_path, command):
    r = CliRunner().invoke(main, [command, str(tmp_path)])
    assert r.exit_code == 1
    assert "is a directory" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("content", [b"\x00\x01\xff\xfe binary", b"not json at all\n", b"[1,2]\n", b""])
def test_unreadable_headers_are_one_line_exit_1(tmp_path, content):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    for command in ("show", "verify"):
        r = CliRunner().invoke(main, [command, str(path)])
        assert r.exit_code == 1, (command, r.output)
        assert "line 1:" in r.output
        assert "Traceback" not in r.output


def test_installed_console_script_runs(tmp_path):
    """The `agentsession` entry point is installed and exits with the library's status."""
    path, b = build(tmp_path)
    exe = Path(sys.executable).with_name("agentsession")
    if not exe.exists():
        pytest.skip(f"console script not installed beside {sys.executable}")
    ok = subprocess.run([str(exe), "verify", str(path)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    missing = subprocess.run([str(exe), "show", str(tmp_path / "x")], capture_output=True, text=True)
    assert missing.returncode == 1
    assert missing.stderr.strip().endswith("no such file")
    assert "Traceback" not in missing.stderr
    usage = subprocess.run([str(exe), "show"], capture_output=True, text=True)
    assert usage.returncode == 2


# -- hostile input found in review: one line, non-zero, never a traceback or a hang


HEADER = b'{"type":"session","format":"agentsession/0.14","id":"h","created_at":"2026-09-17T12:00:00Z","payload":"p"}\n'


@pytest.mark.parametrize("command", ["show", "verify", "hash-object"])
def test_deeply_nested_line_is_an_error_not_a_traceback(tmp_path, command):
    path = tmp_path / "deep.jsonl"
    deep = b'{"type":"item","parent":null,"ts":"2026-09-17T12:00:01Z","x":' + b"[" * 5000 + b"]" * 5000 + b"}\n"
    path.write_bytes(HEADER + deep + b"[" * 100000 + b"]" * 100000 + b"\n")
    r = CliRunner().invoke(main, [command, str(path)])
    assert r.exit_code == 1 or command == "show", r.output
    assert "Traceback" not in r.output
    assert not isinstance(r.exception, RecursionError)


def test_show_terminates_on_a_self_parented_leaf_label(tmp_path):
    fake = "sha256:" + "1" * 64
    line = json.dumps({"type": "label", "id": fake, "parent": fake, "ts": "2026-09-17T12:00:01Z", "target": fake, "label": "leaf"})
    path = tmp_path / "loop.jsonl"
    path.write_bytes(HEADER + line.encode() + b"\n")
    r = run("show", "--json", str(path))
    assert r.exit_code == 0
    assert json.loads(r.output)["leaf"] is None


def test_lone_surrogates_outside_hashed_members_print_escaped(tmp_path):
    path = tmp_path / "s.jsonl"
    header = HEADER.replace(b'"id":"h"', b'"id":"s\\ud800"')
    e = make_entry("item", None, ts=TS.format(1), item={"type": "message"})
    bad = dict(e.data, id="x\ud800")
    path.write_bytes(header + json.dumps(bad).encode() + b"\n" + json.dumps(bad).encode() + b"\n")
    for args in (["show", str(path)], ["show", "--json", str(path)], ["verify", str(path)], ["verify", "--json", str(path)]):
        r = CliRunner().invoke(main, args)
        assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)
        assert "Traceback" not in r.output


def test_odd_config_members_do_not_break_show(tmp_path):
    path = tmp_path / "c.jsonl"
    e = make_entry("config", None, ts=TS.format(1), tools_removed=5, tools_added={"a": 1})
    path.write_bytes(HEADER + e.canonical_line())
    r = run("show", str(path))
    assert r.exit_code == 0
    assert "no change" in r.output


def test_a_parent_holding_a_newline_cannot_fake_a_second_line(tmp_path):
    path = tmp_path / "nl.jsonl"
    e = make_entry("item", "x\nfake.jsonl: 3 entries read; 0 problem(s)", ts=TS.format(1), item={})
    path.write_bytes(HEADER + e.canonical_line())
    r = run("verify", str(path))
    assert r.exit_code == 1
    problem_lines = [line for line in r.output.splitlines() if "fake.jsonl" in line]
    assert len(problem_lines) == 1 and "does not appear earlier" in problem_lines[0]


def test_unknown_core_type_is_a_problem_but_namespaced_is_not(tmp_path):
    path = tmp_path / "t.jsonl"
    a = make_entry("frobnicate", None, ts=TS.format(1), x=1)
    b = make_entry("acme:frobnicate", a.id, ts=TS.format(2), x=1)
    path.write_bytes(HEADER + a.canonical_line() + b.canonical_line())
    out = json.loads(run("verify", "--json", str(path)).output)
    assert [(p["line"], p["code"]) for p in out["problems"]] == [(2, "type")]


def test_header_without_created_at_or_payload_is_refused(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_bytes(b'{"type":"session","format":"agentsession/0.14","id":"h"}\n' + make_entry("item", None, ts=TS.format(1)).canonical_line())
    r = run("verify", str(path))
    assert r.exit_code == 1
    assert "created_at" in r.output and "payload" in r.output


# -- help -------------------------------------------------------------------


def _every_command() -> list[tuple[str, click.Command]]:
    """Each subcommand, and each of a group's, by the words that run it."""
    out: list[tuple[str, click.Command]] = []
    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None, name
        out.append((name, command))
        if isinstance(command, click.Group):
            out.extend((f"{name} {sub}", command.get_command(ctx, sub)) for sub in command.list_commands(ctx))
    return out


@pytest.mark.parametrize(("name", "command"), _every_command(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_help_names_its_values_as_the_docs_do(name, command):
    """An option's value is named for what it is (N, WHEN, DIR, as README.md and docs/cli.md
    write them), never click's type name (`--after TEXT`, `--limit INTEGER RANGE`)."""
    r = run(*name.split(), "--help")
    assert r.exit_code == 0, r.output
    options = r.output.split("Options:", 1)[1]
    for word in ("TEXT", "INTEGER", "FLOAT", "RANGE", "BOOLEAN", "FILENAME", "DIRECTORY"):
        assert not re.search(rf"^\s+-.*\b{word}\b", options, re.M), (name, word, options)


def test_a_group_lists_its_commands_with_whole_summaries():
    """`ref --help` lists each subcommand with a whole line, not one cut with `...`."""
    r = run("ref", "--help")
    listed = r.output.split("Commands:", 1)[1].strip().splitlines()
    assert [line.split()[0] for line in listed] == ["delete", "list", "show", "update"]
    assert not any(line.rstrip().endswith("...") for line in listed), listed


@pytest.mark.parametrize(("typed", "meant"), [("shw", "'show'"), ("lst", "'list'"), ("verfy", "'verify'")])
def test_a_mistyped_command_names_the_one_meant(typed, meant):
    """As git's "did you mean": click looks only among the commands it has loaded, and the
    command loads none until one runs (LAZY_COMMANDS), so it suggested nothing."""
    r = CliRunner().invoke(main, [typed, "x"])
    assert r.exit_code == 2 and f"No such command '{typed}'. Did you mean {meant}?" in r.stderr
    r = CliRunner().invoke(main, [typed, "--json"])
    assert r.exit_code == 2 and json.loads(r.stderr)["error"] == {"code": "usage", "message": f"No such command '{typed}'. Did you mean {meant}?"}
    r = CliRunner().invoke(main, ["xyzzy"])
    assert r.exit_code == 2 and r.stderr.strip().endswith("Error: No such command 'xyzzy'.")


@pytest.mark.parametrize("command", ["import", "show", "verify"])
def test_the_help_of_a_file_reader_says_dash_is_standard_input(command):
    """README.md writes `import FILE|-`; the help said nothing of `-`."""
    text = " ".join(run(command, "--help").output.split())
    assert "- for standard input" in text, text
