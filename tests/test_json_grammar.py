"""One output grammar for --json (docs/cli.md, "JSON output"): every command takes it; what
it prints on stdout is one JSON document; a problem has the same members wherever it
appears (code, severity, where, line, entry, message); an error is one JSON object on
stderr carrying the error's code, stdout left empty; a session is named `session`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from agentsession_cli.main import LAZY_COMMANDS, main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROBLEM_KEYS = {"code", "severity", "where", "line", "entry", "message"}
#: Commands that print no JSON of their own: a server runs until stopped.
NOT_JSON = {"serve"}


def leaf_commands() -> set[str]:
    ctx = click.Context(main)
    out: set[str] = set()
    for name in LAZY_COMMANDS:
        cmd = main.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            out |= {f"{name} {sub}" for sub in cmd.commands}
        else:
            out.add(name)
    return out - NOT_JSON


def problems_in(doc: Any) -> Iterator[dict]:
    """Every object listed under a `problems` member, at any depth."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == "problems" and isinstance(v, list):
                yield from v  # each must be an object: the test asserts the shape of what comes
            else:
                yield from problems_in(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from problems_in(v)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("grammar")
    a, b = tmp / "a", tmp / "b"
    run = CliRunner()

    def do(store: Path, *args: str, input: str | None = None) -> str:
        r = run.invoke(main, ["--store", str(store), *args], input=input)
        assert r.exit_code == 0, (args, r.output)
        return r.stdout.strip()

    do(a, "init")
    do(b, "init")
    imported = do(a, "import", "--record", str(FIXTURES / "branches.jsonl"))
    do(a, "create", "--id", "rec")
    do(a, "append", "rec", input='{"type":"config","model":"m"}')
    do(a, "append", "rec", input='{"type":"item","item":{"type":"message","role":"user","content":"hi"}}')
    do(a, "ref", "update", "team/x", "rec")
    head = json.loads(do(a, "head", "--json", "rec"))["head"]
    return {"a": a, "b": b, "imported": imported, "head": head, "tmp": tmp}


def cases(w: dict[str, Any]) -> dict[str, list[str]]:
    """Each command with --json, run in this order against the world."""
    a, b, tmp = str(w["a"]), str(w["b"]), w["tmp"]
    return {
        "init": ["--store", str(tmp / "c"), "init", "--json"],
        "list": ["--store", a, "list", "--json"],
        "log": ["--store", a, "log", "--json", "rec"],
        "show": ["--store", a, "show", "--json", "rec"],
        "verify": ["--store", a, "verify", "--json", "rec"],
        "hash-object": ["hash-object", "--json", str(FIXTURES / "basic.jsonl")],
        "export": ["--store", a, "export", "--json", "rec", "-o", str(tmp / "out.jsonl")],
        "import": ["--store", a, "import", "--json", str(FIXTURES / "basic.jsonl")],
        "create": ["--store", a, "create", "--json", "--id", "made"],
        "append": ["--store", a, "append", "--json", "made"],
        "head": ["--store", a, "head", "--json", "rec"],
        "cat-object": ["--store", a, "cat-object", "--json", w["head"]],
        "rev-parse": ["--store", a, "rev-parse", "--json", "ref:team/x"],
        "ref list": ["--store", a, "ref", "list", "--json"],
        "ref show": ["--store", a, "ref", "show", "--json", "team/x"],
        "ref update": ["--store", a, "ref", "update", "--json", "team/y", "rec"],
        "ref delete": ["--store", a, "ref", "delete", "--json", "team/y"],
        "push": ["--store", a, "push", "--json", "rec", b],
        "fetch": ["--store", b, "fetch", "--json", w["imported"], a],
        "handover": ["--store", a, "handover", "--json", "made", b],
        "take-back": ["--store", a, "take-back", "--json", "made", b],
        "declare-record": ["--store", b, "declare-record", "--json", w["imported"]],
        "repair": ["--store", a, "repair", "--json", "--dry-run", "rec"],
        "delete": ["--store", a, "delete", "--json", "made"],
        "pack": ["--store", a, "pack", "--json"],
        "sweep": ["--store", a, "sweep", "--json", "--dry-run"],
        "fsck": ["--store", a, "fsck", "--json"],
        "migrate": ["--store", a, "migrate", "--json", "--dry-run"],
        "diff": ["--store", a, "diff", "--json", "rec", w["imported"]],
        "grep": ["--store", a, "grep", "--json", "hi"],
        "stats": ["--store", a, "stats", "--json"],
    }


def test_every_command_has_a_case():
    """A new command joins the table (or NOT_JSON, saying why): the grammar covers it."""
    missing = leaf_commands() - set(cases({"a": "a", "b": "b", "imported": "i", "head": "h", "tmp": Path("t")}))
    # Commands another module adds later are checked by their own tests until listed here.
    assert not missing, missing


def test_every_command_prints_one_json_document_with_the_one_problem_shape(world):
    run = CliRunner()
    for name, argv in cases(world).items():
        r = run.invoke(main, argv, input='{"type":"item","item":{"type":"message","role":"user","content":"x"}}')
        assert r.exit_code in (0, 1), (name, r.output)
        doc = json.loads(r.stdout)  # exactly one document: json.loads refuses trailing text
        for p in problems_in(doc):
            assert isinstance(p, dict) and PROBLEM_KEYS <= set(p), (name, p)
            assert p["severity"] in ("error", "warning", "note"), (name, p)
        if r.exit_code == 1 and not list(problems_in(doc)):
            # a failure with no problem listed still says why, as an error on stderr
            assert json.loads(r.stderr.strip().splitlines()[-1])["error"]["code"], (name, r.stderr)


def test_a_damaged_store_gives_its_problems_in_the_one_shape(tmp_path):
    """pack, sweep and fsck of a store holding a corrupt object: each problem is an
    object with a code (never a bare string), the exit status 1, stderr silent."""
    store = tmp_path / "s"
    run = CliRunner()
    for argv in (["init"], ["import", str(FIXTURES / "basic.jsonl")]):
        assert run.invoke(main, ["--store", str(store), *argv]).exit_code == 0
    loose = sorted((store / "objects" / "entries").glob("*/*"))[0]
    loose.write_bytes(loose.read_bytes().replace(b'"', b"'", 1))
    for argv in (["fsck", "--json"], ["sweep", "--json", "--dry-run", "--grace", "0"], ["pack", "--json"]):
        r = run.invoke(main, ["--store", str(store), *argv])
        assert r.exit_code == 1, (argv, r.output)
        doc = json.loads(r.stdout)
        found = list(problems_in(doc))
        assert found, (argv, doc)
        for p in found:
            assert isinstance(p, dict) and PROBLEM_KEYS <= set(p), (argv, p)
        assert ("corrupt-object", str(loose.relative_to(store))) in {(p["code"], p["file"]) for p in found}, (argv, found)
        assert r.stderr == "", (argv, r.stderr)


def test_listings_name_each_session_by_session(world):
    """`list --json` rows name their session `session`, as every other document does."""
    rows = json.loads(CliRunner().invoke(main, ["--store", str(world["a"]), "list", "--json"]).stdout)
    assert rows and all("session" in r and "id" not in r for r in rows), rows


def test_export_to_stdout_puts_its_summary_on_stderr(world):
    r = CliRunner().invoke(main, ["--store", str(world["a"]), "export", "--json", "rec"])
    assert r.exit_code == 0
    assert r.stdout.splitlines()[0].startswith('{"created_at"')  # the projection itself
    summary = json.loads(r.stderr)
    assert summary["session"] == "rec" and summary["bytes"] == len(r.stdout_bytes) and summary["output"] is None


@pytest.mark.parametrize("argv", [
    ["log", "--json", "no-such-session"],  # (list --after nonsense: a usage error now, exit 2: test_names_cli.py)
    ["head", "--json", "no-such-session"],
    ["cat-object", "--json", "ffff"],
    ["verify", "--json", "no-such-session"],
    ["export", "--json", "no-such-session"],
])
def test_an_error_under_json_is_one_object_on_stderr_with_its_code(world, argv):
    r = CliRunner().invoke(main, ["--store", str(world["a"]), *argv])
    assert r.exit_code == 1, r.output
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    err = json.loads(lines[0])["error"]
    assert err["code"] and err["message"]
