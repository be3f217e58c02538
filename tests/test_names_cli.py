"""One rule for entry names, one habit for option values, one meaning for ``-n``, one
``--json`` help: across every command that takes them (docs/cli.md "Naming sessions and
entries" and "Options")."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from agentsession_cas import Header, SessionBuilder
from agentsession_cli.common import JSON_HELP
from agentsession_cli.main import LAZY_COMMANDS, main

SID = "0199d000-0000-7000-8000-000000000038"


def cli(store: Path, *args: str):
    return CliRunner().invoke(main, ["--store", str(store), *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """A session file of entries with legacy ids (m0, m1, ...), grown until two ids share
    their first 4 hex digits; the store that imported it (a record) and a remote it was
    pushed to. Returns (store, file, remote, head id, ambiguous prefix, its candidates)."""
    root = tmp_path_factory.mktemp("names")
    b = SessionBuilder(Header.new(SID, created_at="2026-12-04T00:00:00Z"))
    seen: dict[str, list[str]] = {}
    i = 0
    while not any(len(v) > 1 for v in seen.values()):
        e = b.append("item", ts="2026-12-04T00:00:01Z", legacy_id=f"m{i}",
                     item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"m{i}"}]})
        seen.setdefault(e.id[7:11], []).append(e.id)
        i += 1
    shared, candidates = next((k, sorted(v)) for k, v in seen.items() if len(v) > 1)
    path = root / "s.jsonl"
    path.write_bytes(b.to_bytes())
    store, remote = root / "store", root / "remote"
    for where in (store, remote):
        assert cli(where, "init").exit_code == 0
    assert cli(store, "import", "--record", str(path)).exit_code == 0
    assert cli(store, "push", SID, str(remote)).exit_code == 0
    return store, path, remote, b.leaf, shared, candidates


# Each command that takes an entry name, as argv with NAME where the name goes, and what
# in its --json output says which entry it resolved (None: exit 0 says it, the entry
# being the head, the only one the command accepts there).
COMMANDS = {
    "show FILE --leaf": (["show", "{file}", "--leaf", "NAME", "--json"], "leaf"),
    "show ID --leaf": (["show", SID, "--leaf", "NAME", "--json"], "leaf"),
    "export FILE --at": (["export", "{file}", "--format", "atif", "--at", "NAME"], None),
    "export ID --at": (["export", SID, "--format", "otel", "--at", "NAME"], None),
    "rev-parse": (["rev-parse", SID, "NAME", "--json"], "entry"),
    "head NEW": (["head", SID, "NAME", "--expect", "{head}", "--json"], "head"),
    "head --expect": (["head", SID, "{head}", "--expect", "NAME", "--json"], "previous"),
    "diff --session": (["diff", "--session", SID, "NAME", "{head}", "--json"], "a"),
    "push --expect": (["push", SID, "{remote}", "--expect", "NAME", "--json"], None),
    "declare-record --expect": (["declare-record", SID, "--expect", "NAME", "--json"], None),
}


def _argv(named, command: str, name: str) -> tuple[list[str], str | None]:
    store, path, remote, head, _, _ = named
    argv, member = COMMANDS[command]
    fill = {"{file}": str(path), "{head}": head, "{remote}": str(remote)}
    return [name if a == "NAME" else fill.get(a, a) for a in argv], member


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("kind", ["full id", "64 digits", "unique prefix", "sha256: prefix", "legacy id"])
def test_every_command_takes_every_name_of_an_entry(named, command, kind):
    store, _, _, head, _, _ = named
    name = {"full id": head, "64 digits": head[7:], "unique prefix": head[7:17], "sha256: prefix": head[:17],
            "legacy id": None}[kind]
    if name is None:
        name = json.loads(cli(store, "show", SID, "--json").stdout)["entries"][-1]["legacy_id"]
    argv, member = _argv(named, command, name)
    r = cli(store, *argv)
    assert r.exit_code == 0, (argv, r.stderr)
    if member is not None:
        assert json.loads(r.stdout)[member] == head


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("kind", ["short", "not hex", "ambiguous", "no match", "unheld full id"])
def test_every_command_refuses_alike(named, command, kind):
    """The same code, and the same words but for where it looked, from every command
    (show --leaf and export --at answered `no_entry` for an ambiguous prefix, took any
    length, and knew no short name from a missing one; rev-parse, head and push knew no
    legacy id and passed a full id they did not hold)."""
    store, path, _, head, shared, candidates = named
    absent = next(p for p in ("0000", "1111", "2222", "3333") if not head[7:].startswith(p))
    name, code, words = {
        "short": (head[7:10], "bad_name", f"'{head[7:10]}' is not an entry id nor a prefix of one"),
        "not hex": ("XYZW", "bad_name", "'XYZW' is not an entry id nor a prefix of one"),
        "ambiguous": (shared, "ambiguous", f"{shared} is the start of {len(candidates)} entry ids in "),
        "no match": (absent * 2, "no_entry", f"no such entry: {absent * 2} (no id, legacy_id or id prefix in "),
        "unheld full id": ("sha256:" + "3" * 64, "no_entry", "no such entry: sha256:3333"),
    }[kind]
    if kind == "no match" and any(c.startswith("sha256:" + absent * 2) for c in candidates):  # pragma: no cover
        pytest.skip("astronomically unlikely")
    if "--expect" in command and command != "head --expect" and kind == "unheld full id":
        pytest.skip("push and declare-record pass a full id on: it may be a head this store lacks (--remote)")
    argv, _ = _argv(named, command, name)
    where = str(path) if "FILE" in command else f"session {SID}"
    r = cli(store, *argv, *([] if "--json" in argv else ["--json"]) if not command.startswith("export") else ())
    assert r.exit_code == 1, (argv, r.stdout, r.stderr)
    if command.startswith("export"):  # (--json goes with --format jsonl alone, and --at with atif and otel)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("agentsession: error: ") and words in lines[0], lines
        assert where in lines[0]
        return
    err = json.loads(r.stderr.strip().splitlines()[-1])["error"]
    assert err["code"] == code and words in err["message"], (argv, err)
    assert where in err["message"]
    if code == "ambiguous":
        assert err["candidates"] == candidates


# -- option values: one habit ---------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["list", "--after", "yesterday"],  # ours (it exited 1, code bad_option)
    ["list", "--before", "2026-13-45"],
    ["list", "-n", "x"],  # click's
    ["list", "--limit", "-1"],
    ["sweep", "--grace", "3x"],  # ours
    ["export", SID, "--secret", "("],  # ours (it exited 1, code redaction)
    ["export", SID, "--format", "pdf"],  # click's
    ["show", SID, "-n", "-2"],
    ["show", SID, "--tail", "many"],
    ["migrate", "--wait", "soon"],
    ["export", SID, "--format", "atif", "--json"],  # options that do not go together (they exited 1, code usage)
    ["export", SID, "--at", "abcd"],
    ["create", "--link"],
])
def test_a_bad_option_value_is_a_usage_error_whoever_refuses_it(named, argv):
    store = named[0]
    r = cli(store, *argv, *([] if "--json" in argv else ["--json"]))
    assert r.exit_code == 2 and r.stdout == "", (argv, r.stderr)
    assert json.loads(r.stderr)["error"]["code"] == "usage"
    if "--json" not in argv:
        r = cli(store, *argv)
        assert r.exit_code == 2 and "Error: " in r.stderr and "Traceback" not in r.stderr


def test_serve_refuses_a_bad_listen_address_as_usage(tmp_path):
    r = CliRunner().invoke(main, ["--store", str(tmp_path / "s"), "serve", "--listen", "nonsense"])
    assert r.exit_code == 2 and "Invalid value for '--listen': 'nonsense': expected HOST:PORT" in r.stderr


def test_good_values_still_pass(named):
    store = named[0]
    assert cli(store, "list", "--after", "3d", "--before", "2999-01-01", "--json").exit_code == 0
    assert cli(store, "sweep", "--grace", "14d", "--dry-run", "--json").exit_code == 0


# -- -n: a count, wherever it is a flag ------------------------------------------------------


def _commands() -> list[tuple[str, click.Command]]:
    out = []
    for name in LAZY_COMMANDS:
        cmd = main.get_command(click.Context(main), name)
        assert cmd is not None
        subs = cmd.commands.items() if isinstance(cmd, click.Group) else [("", cmd)]
        out.extend(((f"{name} {sub}".strip(), c) for sub, c in subs))
    return out


def test_each_short_flag_means_one_thing():
    """A short flag is one option (by its long name) wherever a command has it; ``-n`` is a
    count (``list --limit``, ``show --first``), never a dry run (``migrate -n`` was)."""
    meaning: dict[str, set[str]] = {}
    for _name, cmd in _commands():
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.hidden:
                continue
            for short in (o for o in p.opts if len(o) == 2):
                meaning.setdefault(short, set()).add("count" if short == "-n" and not p.is_flag else
                                                     max(p.opts, key=len))
    assert meaning["-n"] == {"count"}, meaning["-n"]
    for short, names in meaning.items():
        assert len(names) == 1, (short, names)


def test_migrate_still_takes_its_old_n(named):
    r = cli(named[0], "migrate", "-n", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["status"] == "current"
    assert "-n" not in cli(named[0], "migrate", "--help").stdout.split("--dry-run")[0].split("Options:")[-1]


# -- --json: one wording ---------------------------------------------------------------------


def test_every_json_option_has_the_one_help():
    helps = {}
    for name, cmd in _commands():
        for p in cmd.params:
            if isinstance(p, click.Option) and "--json" in p.opts:
                helps[name] = p.help
    assert len(helps) >= 25
    odd = {n: h for n, h in helps.items() if not (h or "").startswith(JSON_HELP)}
    assert not odd, odd


@pytest.mark.parametrize("argv", [["show", "{id}"], ["verify", "{short}"], ["log", "{short}"], ["export", "{id}"],
                                  ["head", "{short}"], ["rev-parse", "{id}"]])
def test_an_entry_id_where_a_session_is_asked_for_is_named_as_one(named, argv):
    """An id pasted from `show` or `log` where a session is asked for: the error says it
    names an entry (and what prints one), not only that no file or session has that name."""
    store, _, _, head, _, _ = named
    r = cli(store, *[a.format(id=head, short=head[:15]) for a in argv])
    assert r.exit_code == 1
    assert "it names an entry or object, not a session (`agentsession cat-object` prints one)" in r.output
    if argv[0] in ("show", "verify", "rev-parse"):  # (the commands of the three kinds with --json)
        err = json.loads(cli(store, *[a.format(id=head, short=head[:15]) for a in argv], "--json").stderr)["error"]
        assert err["code"] == ("bad_name" if argv[0] == "rev-parse" else "no_session")


def test_a_session_whose_header_file_is_lost_is_a_candidate_of_every_name(tmp_path):
    """A session whose header file is lost is held still (``list`` shows it damaged): a
    prefix naming it and another is ambiguous (``delete`` took the other), its own id is
    its damage (not the longer id it begins), and ``grep`` over the store reports it
    rather than calling the store searched."""
    store = tmp_path / "st"
    assert cli(store, "init").exit_code == 0
    for sid in ("task-1", "task-10", "task-2"):
        assert cli(store, "create", "--id", sid).exit_code == 0
    r = CliRunner().invoke(main, ["--store", str(store), "append", "task-1"],
                           input='{"type":"custom","data":"needle"}', catch_exceptions=False)
    assert r.exit_code == 0, r.output
    (store / "sessions" / "task-1" / "header").unlink()
    r = cli(store, "rev-parse", "task", "--json")
    assert r.exit_code == 1 and json.loads(r.output)["error"]["code"] == "ambiguous"
    assert cli(store, "delete", "task").exit_code == 1
    assert sorted(p.name for p in (store / "sessions").iterdir()) == ["task-1", "task-10", "task-2"]
    for name in ("task-1", "task-"):
        r = cli(store, "rev-parse", name, "--json")
        assert r.exit_code == 1, name
        assert json.loads(r.output)["error"]["code"] == ("session_damaged" if name == "task-1" else "ambiguous")
    assert cli(store, "rev-parse", "task-2").output.strip() == "task-2"
    r = cli(store, "grep", "needle", "--json")
    assert r.exit_code == 1 and json.loads(r.output)["error"]["session"] == "task-1"
    assert cli(store, "ref", "update", "task-1", "task-2").exit_code == 0  # a ref of its id's name
    r = cli(store, "grep", "needle", "--json")
    assert r.exit_code == 1 and json.loads(r.output)["error"]["session"] == "task-1"
