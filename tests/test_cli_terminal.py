"""The command on a terminal (issue 14): the pager, colour, widths, the one number and
size format, progress lines, and the codes refusals carry.

No real terminal is needed: ``terminal.isatty`` is the one test every decision asks,
so replacing it forces the terminal path; a "slow" operation is forced by a progress
delay of zero, never by sleeping.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies

from agentsession_cas import Header
from agentsession_cas.exchange import operations as ex
from agentsession_cas.store import Store
from agentsession_cli import terminal
from agentsession_cli.common import number, plural, size, when
from agentsession_cli.main import main

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
TS = "2026-09-17T12:00:00.123456Z"
ESC = "\x1b["


def cli(*argv: str, input: str | None = None):
    return CliRunner().invoke(main, list(argv), input=input, catch_exceptions=False)


def user(text: str) -> dict:
    return {"type": "item", "ts": TS, "item": {"type": "message", "role": "user", "content": text}}


@pytest.fixture(autouse=True)
def _plain(monkeypatch):
    """Each test starts as a pipe would: no COLUMNS, no NO_COLOR, no pager chosen."""
    for name in ("COLUMNS", "NO_COLOR", "PAGER", "AGENTSESSION_PAGER", "LESS", "TERM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(terminal, "FALLBACK_WIDTH", 100)  # as shipped (conftest widens it for the suite)


@pytest.fixture
def tty(monkeypatch):
    """Standard output and standard error are terminals, 60 columns wide."""
    monkeypatch.setattr(terminal, "isatty", lambda stream: True)
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(0, 0): os.terminal_size((60, 24)))


@pytest.fixture
def slow(monkeypatch):
    """Every operation counts as slow: progress is drawn from the first report."""
    monkeypatch.setattr(terminal, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(terminal, "PROGRESS_EVERY", 0.0)


@pytest.fixture
def world(tmp_path) -> dict:
    """A store `a` with session `long` (1,100 entries, a long title, a long path in its
    header) and `talk` (a branch); an empty store `b`; a session file."""
    root = tmp_path / "a"
    with Store.init(str(root)) as st:
        s = st.create(Header.new("long", cwd="/very/long/working/directory/" + "d" * 80))
        s.append({"type": "config", "ts": TS, "model": "m1", "instructions": "Be brief. " * 30})
        for i in range(1100):
            s.append(user(f"message number {i} " + "word " * 40))
        t = st.create(Header.new("talk"))
        ask = t.append(user("Name a prime number")).id
        t.append({"type": "item", "ts": TS, "item": {"type": "message", "role": "assistant", "content": "7 is prime."}})
        t.append({"type": "item", "ts": TS, "parent": ask,
                  "item": {"type": "message", "role": "assistant", "content": "Eleven."}})
    Store.init(str(tmp_path / "b")).close()
    return {"a": str(root), "b": str(tmp_path / "b"), "file": str(FIXTURES / "branches.jsonl"), "tmp": tmp_path}


# -- one number, size and time format ---------------------------------------------


def test_numbers_sizes_and_times_have_one_format():
    assert number(1234567) == "1,234,567"
    assert plural(1, "entry", "entries") == "1 entry" and plural(1024, "object") == "1,024 objects"
    assert size(1) == "1 byte" and size(1023) == "1,023 bytes"
    assert size(1536) == "1,536 bytes (1.5 KiB)"
    assert size(5 * (1 << 20)) == "5,242,880 bytes (5.0 MiB)"
    assert size(3 * (1 << 40)).endswith("(3.0 TiB)")
    assert when("2026-09-17T12:00:00.123456Z") == "2026-09-17T12:00:00Z" and when(None) == "-"


def test_every_command_formats_counts_and_sizes_with_the_one_helper():
    """No command formats a size or a count its own way: the helpers of cli/common.py
    are the only place a unit or a thousands separator is written."""
    for path in sorted((REPO / "cli").glob("*.py")):
        if path.name in ("common.py", "terminal.py"):
            continue
        for line in path.read_text().splitlines():
            if "help=" in line:
                continue  # an option's help may name a unit
            assert not re.search(r"KiB|MiB|GiB|\bkB\b|\bMB\b|\d\}?B\)", line), (path.name, line)
            assert not re.search(r":,\}|:,\.|:,d\}", line), (path.name, line)  # f"{n:,}" belongs to number()


def test_show_and_list_print_counts_with_separators_and_times_to_the_second(world):
    out = cli("--store", world["a"], "show", "--tail", "1", "long").stdout
    assert re.search(r"entries +1,101 in 1 root\(s\)", out) and "(1 of 1,101 entries listed)" in out
    out = cli("--store", world["a"], "list").stdout
    assert "1,101" in out and "2026-09-17T12:00:00Z" in out and ".123" not in out


def test_stats_pack_and_push_print_sizes_alike(world):
    out = cli("--store", world["a"], "stats").stdout
    assert re.search(r"logical +[\d,]+ bytes \(\d+\.\d (KiB|MiB)\)", out), out
    out = " ".join(cli("--store", world["a"], "pack").stdout.split())
    assert re.search(r"packed [\d,]+ objects .*: [\d,]+ bytes \(.*iB\) -> [\d,]+ bytes \(.*iB\)", out), out
    out = " ".join(cli("--store", world["a"], "push", "talk", world["b"]).stdout.split())
    assert re.search(r"pushed talk to \S+: 6 objects, [\d,]+ bytes (\(\d+\.\d KiB\) )?sent, 3 entries admitted", out), out


# -- widths ------------------------------------------------------------------------


def _commands(world) -> list[list[str]]:
    a = ["--store", world["a"]]
    return [
        [*a, "show", "long"], [*a, "show", "--graph", "talk"], [*a, "show", world["file"]], [*a, "list"],
        [*a, "log", "long"], [*a, "verify", "long"], [*a, "verify", world["file"]], [*a, "stats", "--by-session"],
        [*a, "diff", "long", "talk"], [*a, "grep", "number 7"], [*a, "fsck"], [*a, "ref", "list"],
    ]


def test_no_human_line_is_wider_than_100_columns_off_a_terminal(world):
    for argv in _commands(world):
        r = cli(*argv)
        assert r.exit_code in (0, 1), (argv, r.output)
        wide = [line for line in r.stdout.splitlines() if len(line) > 100]
        assert not wide, (argv, wide[:3])
    # a wrapped line loses nothing: the words read as before
    out = cli("--store", world["a"], "verify", "long").stdout
    assert "objects checked against their names; 0 problem(s)" in " ".join(out.split())


def test_lines_fit_the_terminal_and_columns_sets_the_width(world, tty, monkeypatch):
    for argv in _commands(world):
        r = cli("--no-pager", *argv)
        assert r.exit_code in (0, 1), (argv, r.output)
        wide = [line for line in r.stdout.splitlines() if len(terminal.visible(line)) > 60]
        assert not wide, (argv, wide[:3])
    monkeypatch.setenv("COLUMNS", "200")
    out = cli("--no-pager", "--store", world["a"], "show", "--tail", "3", "long").stdout
    assert max(len(terminal.visible(line)) for line in out.splitlines()) > 100


def test_ids_and_hashes_for_scripts_are_never_cut(world):
    out = cli("hash-object", world["file"]).stdout
    assert all(len(line) >= 2 * 71 + 1 for line in out.splitlines())
    full = cli("--store", world["a"], "head", "talk").stdout.strip()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", full)


def test_wrap_and_cut_keep_what_they_must():
    assert terminal.wrap("a " * 10, 100) == ["a " * 10]
    lines = terminal.wrap("word " * 50, 40)
    assert all(len(line) <= 40 for line in lines) and " ".join(" ".join(lines).split()) == " ".join(["word"] * 50)
    assert terminal.wrap("x" * 95, 40) == ["x" * 40, "  " + "x" * 38, "  " + "x" * 17]
    assert terminal.cut("abcdef", 4) == "abc…"
    coloured = terminal.cut("\x1b[33mabcdef\x1b[0m", 4)
    assert terminal.visible(coloured) == "abc…" and coloured.endswith("\x1b[0m")


def test_wrap_ends_on_a_lead_wider_than_the_line():
    """A line of spaces, or one whose lead is wider than the width, is wrapped (it looped
    for ever: the indent of the next line alone did not fit)."""
    assert terminal.wrap(" " * 120, 100) == [""]
    assert terminal.wrap(" " * 20 + "abc", 8) == [" " * 20 + "a", " " * 22 + "b", " " * 22 + "c"]


@settings(max_examples=3000, deadline=None)
@given(strategies.text(alphabet=" ab\u00e9x", max_size=60), strategies.integers(min_value=1, max_value=24),
       strategies.sampled_from(["  ", "", " "]))
def test_wrap_of_a_plain_line_is_the_word_fill(line, columns, indent):
    """A line without colour codes is wrapped a line at a time (``rfind`` of the last space
    that fits): the same lines as the word-by-word fill, runs of spaces, leads wider than
    the width and words wider than a line included."""
    assert terminal._wrap_plain(line, columns, indent) == terminal._wrap_words(line, columns, indent)
    assert terminal.wrap(line, columns, indent) == ([line] if len(line) <= columns else terminal._wrap_words(line, columns, indent))


# -- colour ------------------------------------------------------------------------


def test_colour_on_a_terminal_only_and_never_with_no_color(world, tty, monkeypatch):
    argv = ["--no-pager", "--store", world["a"], "show", "--graph", "talk"]
    assert ESC in cli(*argv).stdout
    assert ESC not in cli("--color=never", *argv).stdout
    assert ESC not in cli(*argv, "--color", "never").stdout  # after the subcommand too
    assert ESC not in cli(*argv[:-1], "--json", "talk").stdout
    monkeypatch.setenv("NO_COLOR", "1")
    assert ESC not in cli(*argv).stdout
    assert ESC in cli("--color=always", *argv).stdout


def test_no_colour_off_a_terminal_unless_asked(world):
    argv = ["--store", world["a"], "diff", "long", "talk"]
    assert ESC not in cli(*argv).stdout
    assert ESC in cli("--color=always", *argv).stdout
    r = cli("--store", world["a"], "show", "nosuch")
    assert ESC not in r.stderr
    r = cli("--color=always", "--store", world["a"], "grep", "prime")
    assert f"{ESC}1;31mprime{ESC}0m" in r.stdout


# -- the pager ---------------------------------------------------------------------

PAGER = """import os, sys
data = sys.stdin.read()
with open(sys.argv[1], "w") as f:
    f.write("LESS=" + os.environ.get("LESS", "") + "\\n" + data)
"""


@pytest.fixture
def pager(tmp_path, monkeypatch) -> Path:
    """AGENTSESSION_PAGER set to a program that keeps what it is sent (and its LESS)."""
    script = tmp_path / "pager.py"
    script.write_text(PAGER)
    out = tmp_path / "paged.txt"
    monkeypatch.setenv("AGENTSESSION_PAGER", f"{sys.executable} {script} {out}")
    return out


def test_long_output_goes_through_the_pager_on_a_terminal(world, tty, pager):
    r = cli("--store", world["a"], "show", "talk")
    assert r.exit_code == 0 and r.stdout == ""
    paged = pager.read_text()
    assert paged.startswith("LESS=FRX\n") and re.search("session +talk", paged) and "context at" in paged
    for argv in (["log", "talk"], ["list"], ["diff", "long", "talk"], ["grep", "prime"], ["stats"],
                 ["show", "--graph", "talk"]):
        pager.unlink()
        r = cli("--store", world["a"], *argv)
        assert r.stdout == "" and pager.exists(), argv


def test_the_pager_is_not_used_off_a_terminal_under_json_or_with_no_pager(world, tty, pager, monkeypatch):
    for argv in (["--no-pager", "show", "talk"], ["show", "talk", "--no-pager"], ["show", "--json", "talk"]):
        r = cli("--store", world["a"], *argv)
        assert r.stdout and not pager.exists(), argv
    monkeypatch.setenv("AGENTSESSION_PAGER", "cat")
    assert "session" in cli("--store", world["a"], "show", "talk").stdout
    monkeypatch.setenv("AGENTSESSION_PAGER", "")
    assert "session" in cli("--store", world["a"], "show", "talk").stdout


def test_pager_off_a_terminal_is_never_started(world, pager):
    r = cli("--store", world["a"], "show", "talk")
    assert "session" in r.stdout and not pager.exists()


def test_pager_variable_precedence_and_a_shell_command(world, tty, tmp_path, monkeypatch):
    out = tmp_path / "via-pager.txt"
    monkeypatch.setenv("PAGER", f"cat > {out}")  # a shell command: run by the shell, as git does
    monkeypatch.setenv("LESS", "R")
    assert cli("--store", world["a"], "log", "talk").stdout == ""
    assert "append" in out.read_text()
    monkeypatch.setenv("AGENTSESSION_PAGER", "cat")  # AGENTSESSION_PAGER wins over PAGER
    assert "append" in cli("--store", world["a"], "log", "talk").stdout
    monkeypatch.delenv("AGENTSESSION_PAGER")
    monkeypatch.setenv("PAGER", "no-such-pager-program")
    assert "append" in cli("--store", world["a"], "log", "talk").stdout  # a missing pager: no pager


# -- progress ----------------------------------------------------------------------

DRAWN = re.compile(r"\r\x1b\[K([a-z]+): ")


def _drawn(stderr: str) -> list[str]:
    return DRAWN.findall(stderr)


def test_progress_on_a_terminal_for_each_long_command(world, tty, slow, tmp_path, monkeypatch):
    a = ["--no-pager", "--store", world["a"]]
    exported = str(tmp_path / "long.jsonl")
    cases = {
        "exporting": [*a, "export", "long", "-o", exported],
        "importing": ["--store", world["b"], "import", exported],
        "verifying": [*a, "verify", exported],
        "reading": [*a, "show", "--tail", "2", "long"],
        "packing": [*a, "pack"],
        "sweeping": [*a, "sweep", "--grace", "0", "--dry-run"],
        "fsck": [*a, "fsck"],
    }
    for label, argv in cases.items():
        r = cli(*argv)
        assert r.exit_code == 0, (label, r.output)
        assert label in _drawn(r.stderr), (label, r.stderr[-300:])
        assert r.stderr.rstrip("\n").endswith("\r\x1b[K"), (label, r.stderr[-100:])  # cleared at the end
        progress_lines = [x for x in r.stderr.split("\r\x1b[K") if x]
        assert all(len(x) < 60 for x in progress_lines), progress_lines[:3]
    r = cli(*a, "verify", "long")
    assert "verifying" in _drawn(r.stderr)
    r = cli(*a, "export", "long")  # the projection to the terminal itself: no line drawn over it
    assert r.stderr == "" and r.stdout.count("\n") == 1102
    monkeypatch.setattr(terminal, "isatty", lambda stream: stream is sys.stderr)  # stdout to a file or pipe
    r = cli(*a, "export", "long")
    assert "exporting" in _drawn(r.stderr) and r.stdout.count("\n") == 1102


def test_progress_for_push_fetch_and_migrate(world, tty, slow, tmp_path):
    r = cli("--store", world["a"], "push", "long", world["b"])
    assert r.exit_code == 0 and "sending objects" in r.stderr and "% (" in r.stderr and " objects)" in r.stderr
    r = cli("--store", str(tmp_path / "c"), "init")
    r = cli("--store", str(tmp_path / "c"), "fetch", "long", world["b"])
    assert r.exit_code == 0 and "receiving objects" in r.stderr
    sys.path.insert(0, str(REPO))
    try:
        from fixtures.reference_layout import build_reference_scenario
    finally:
        sys.path.remove(str(REPO))
    build_reference_scenario(tmp_path / "ref")
    r = cli("--store", str(tmp_path / "ref"), "migrate", "--yes")
    assert r.exit_code == 0 and "migrate" in _drawn(r.stderr), r.stderr


def test_no_progress_off_a_terminal_under_json_or_when_quick(world, tty, slow, tmp_path, monkeypatch):
    r = cli("--store", world["a"], "verify", "--json", "long")
    assert "\r" not in r.stderr
    r = cli("--store", world["a"], "pack", "--json")
    assert "\r" not in r.stderr
    monkeypatch.setattr(terminal, "PROGRESS_DELAY", 1.0)
    now = [100.0]
    monkeypatch.setattr(terminal, "clock", lambda: now[0])  # no time passes: the work is quick
    assert "\r" not in cli("--no-pager", "--store", world["a"], "verify", "long").stderr
    monkeypatch.setattr(terminal, "isatty", lambda stream: False)
    monkeypatch.setattr(terminal, "PROGRESS_DELAY", 0.0)
    assert "\r" not in cli("--store", world["a"], "pack").stderr


def test_the_progress_line_waits_a_second_then_redraws_at_most_ten_times_a_second(monkeypatch, capsys):
    now = [0.0]
    monkeypatch.setattr(terminal, "clock", lambda: now[0])
    monkeypatch.setattr(terminal, "isatty", lambda stream: True)
    terminal.configure()
    bar = terminal.progress("working", "items")
    assert bar is not None
    bar(1, 10)
    assert capsys.readouterr().err == ""  # under a second: nothing
    now[0] = 1.5
    bar(2, 10)
    bar(3, 10)  # the same instant: not redrawn
    now[0] = 1.7
    bar(4, 10)
    bar.end()
    assert capsys.readouterr().err == "\r\x1b[Kworking:  20% (2/10 items)\r\x1b[Kworking:  40% (4/10 items)\r\x1b[K"


def test_the_library_reports_progress_through_its_hook(world, tmp_path):
    from agentsession_cas.format.reader import read_session, verify_file

    seen: list[tuple[int, int]] = []
    with Store(world["a"], readonly=True) as st:
        st.export_to("long", tmp_path / "x.jsonl", progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (1102, 1102) and len(seen) == 2  # every 1,024 lines and at the end
    seen.clear()
    read_session(tmp_path / "x.jsonl", progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (1101, 1101)
    seen.clear()
    verify_file(tmp_path / "x.jsonl", progress=lambda d, t: seen.append((d, t)))
    assert seen[-1][0] == seen[-1][1] == os.path.getsize(tmp_path / "x.jsonl")


# -- refusals carry their codes ----------------------------------------------------


def test_a_refused_push_says_head_moved_under_json(tmp_path):
    a, b = Store.init(str(tmp_path / "a")), Store.init(str(tmp_path / "b"))
    s = a.create(Header.new("s1"))
    first = s.append(user("one")).id
    s.append(user("two"))
    s.commit()
    ex.push(a, str(tmp_path / "b"), "s1")
    s.append(user("three"))
    s.commit()
    a.close()
    b.close()
    r = cli("--store", str(tmp_path / "a"), "push", "s1", str(tmp_path / "b"), "--expect", first, "--json")
    assert r.exit_code == 1
    err = json.loads(r.stderr)["error"]
    assert err["code"] == "head_moved" and err["message"].startswith("head not moved:")


def test_refusals_carry_a_specific_code(world, tmp_path):
    a = ["--store", world["a"]]
    cases = {
        "no_session": [*a, "show", "nosuch", "--json"],
        "bad_input": [*a, "append", "talk", "--json"],
        "os_error": ["-C", str(tmp_path / "missing"), "list", "--json"],
    }
    for code, argv in cases.items():
        r = cli(*argv, input="not json")
        assert r.exit_code == 1, (code, r.output)
        assert json.loads(r.stderr.strip().splitlines()[-1])["error"]["code"] == code, (code, r.stderr)
    # options that do not go together, and an option's value refused: usage, exit 2 (docs/cli.md "Options")
    for argv in ([*a, "export", "talk", "--at", "abcd", "--json"], [*a, "list", "--after", "yesterday-ish", "--json"]):
        r = cli(*argv)
        assert r.exit_code == 2 and json.loads(r.stderr)["error"]["code"] == "usage", (argv, r.stderr)


def test_every_refusal_in_the_command_names_its_code():
    """fail() takes no default code: each call names one, and none is the generic 'error'."""
    for path in sorted((REPO / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "fail":
                codes = [k.value for k in node.keywords if k.arg == "code"]
                assert codes, f"{path.name}:{node.lineno}: fail() without code="
                assert not (isinstance(codes[0], ast.Constant) and codes[0].value == "error"), f"{path.name}:{node.lineno}"


def test_a_usage_error_under_json_is_json_too(world):
    r = cli("--store", world["a"], "head", "talk", "abcd", "--json")  # NEW without --expect
    assert r.exit_code == 2
    err = json.loads(r.stderr)["error"]
    assert err["code"] == "usage" and "--expect" in err["message"]
    r = cli("--store", world["a"], "head", "talk", "abcd")
    assert r.exit_code == 2 and r.stderr.startswith("Usage:")


def test_verify_quiet_draws_no_progress(world, tty, slow):
    r = cli("--store", world["a"], "verify", "-q", "long")
    assert r.exit_code == 0 and r.stdout == "" and r.stderr == ""
    assert "verifying" in _drawn(cli("--store", world["a"], "verify", "long").stderr)


def test_echo_lines_writes_a_batch_at_a_time_and_fits_each_line(monkeypatch, capsys):
    """echo_lines prints what echo would, line by line (cut or wrapped to the width), in
    writes of ECHO_BATCH texts: never one write a line, never every line held at once."""
    import click

    from agentsession_cli import common

    writes: list[str] = []
    real = click.echo
    monkeypatch.setattr(click, "echo", lambda text, **kw: writes.append(text) or real(text, **kw))
    batch = common.ECHO_BATCH
    lines = [f"line {i} " + "x" * (i % 160) for i in range(2 * batch + 88)]  # some longer than any width
    common.echo_lines(lines, fit="cut")
    out = capsys.readouterr().out
    assert len(writes) == 3 and [w.count("\n") + 1 for w in writes] == [batch, batch, 88]
    assert out.splitlines() == [common.cut(line) for line in lines]  # each fitted as echo fits it
    common.echo_lines(["a " * 30], fit="wrap")
    assert capsys.readouterr().out.splitlines() == common.wrap("a " * 30)


@settings(max_examples=2000, deadline=None)
@given(strategies.text(alphabet=" \n\tab\u00e9\u3000", max_size=700), strategies.sampled_from([40, 72, 3]))
def test_quote_is_the_whole_text_collapsed_then_cut(text, width):
    """A summary's quote looks at a head of a long text only when the head alone decides
    what is shown: the same as collapsing the whole text's white space and cutting it."""
    from agentsession_cli.describe import quote

    whole = " ".join(text.split())
    assert quote(text, width) == json.dumps(whole if len(whole) <= width else whole[: width - 1] + "\u2026", ensure_ascii=False)


def test_a_remote_given_before_the_session_is_named_so(tmp_path):
    """Git's order (`git push REMOTE REF`) where ours is ID then REMOTE: a usage error that
    gives the command back in our order, not a refusal of the path as a session id."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with Store.init(a) as st:
        st.create(Header.new("talk")).append(user("hi"))
    Store.init(b).close()
    for command in ("push", "fetch", "handover", "take-back"):
        r = cli("--store", a, command, b, "talk")
        assert r.exit_code == 2, (command, r.output)
        assert f"{command} takes the session first, then the remote: agentsession {command} talk {b}" in r.output
    r = cli("--store", a, "push", "talk", b)
    assert r.exit_code == 0 and "pushed talk" in r.output, r.output
    # a first word that names no store is refused as before
    r = cli("--store", a, "push", "no-such", "talk")
    assert r.exit_code == 1 and "no such session" in r.output and "takes the session first" not in r.output, r.output
    r = cli("--store", a, "fetch", "/no/such dir", b)
    assert r.exit_code == 1 and "not usable" in r.output and "takes the session first" not in r.output, r.output
