"""The command loads only what the subcommand it runs needs (issue: start-up cost)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from agentsession_cli.main import LAZY_COMMANDS, main

MODULES = sorted({module for module, _ in LAZY_COMMANDS.values()})


def test_the_lazy_table_names_every_command_where_it_is_defined():
    defined = {}
    for name in MODULES:
        module = importlib.import_module(f"agentsession_cli.{name}")
        for command in module.COMMANDS:
            assert isinstance(command, click.Command)
            defined[command.name] = (name, command.get_short_help_str(limit=1000))
    assert defined == LAZY_COMMANDS


def test_every_command_resolves_through_the_group():
    ctx = click.Context(main)
    assert set(main.list_commands(ctx)) >= set(LAZY_COMMANDS)
    for name in LAZY_COMMANDS:
        assert main.get_command(ctx, name).name == name
    assert main.get_command(ctx, "no-such-command") is None


def _loaded_after(argv: list[str]) -> set[str]:
    code = (
        "import sys\n"
        "from agentsession_cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith(('agentsession_cas', 'agentsession_cli'))), file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(r.stderr.split())


def test_version_and_help_load_no_store_and_no_format_core():
    for argv in (["--version"], ["--help"]):
        loaded = _loaded_after(argv)
        assert loaded <= {"agentsession_cas", "agentsession_cas.errors", "agentsession_cas.lean", "agentsession_cli",
                          "agentsession_cli.main", "agentsession_cli.common", "agentsession_cli.terminal"}, (argv, sorted(loaded))


def test_a_store_command_does_not_load_exchange_or_the_file_commands(tmp_path):
    loaded = _loaded_after(["--store", str(tmp_path / "s"), "init"])
    assert "agentsession_cli.store_commands" in loaded
    assert not any(m.startswith(("agentsession_cli.exchange", "agentsession_cli.file_commands")) for m in loaded), sorted(loaded)


#: The rule set and what only checking and reading files need: never loaded by a command
#: that checks no rule (issue 11, start-up).
RULE_MACHINERY = ("agentsession_cas.format.rules", "agentsession_cas.format.context", "agentsession_cas.format.runs")
FILE_READING = ("agentsession_cas.format.reader", "agentsession_cas.format.legacy")
ELSEWHERE = ("agentsession_cas.maintenance", "agentsession_cas.exchange", "agentsession_cas.backends.memory",
             "agentsession_cli.file_commands", "agentsession_cli.exchange")


def _small_store(tmp_path) -> tuple[str, str]:
    from agentsession_cas import Header
    from agentsession_cas.store import Store

    root = str(tmp_path / "s")
    with Store.init(root) as st:
        s = st.create(Header.new("startup-s"))
        s.append({"type": "item", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
        s.append({"type": "label", "target": None, "label": "x"})
    return root, "startup-s"


def _loaded_by(argv: list[str], stdin: bytes = b"") -> set[str]:
    code = (
        "import sys\n"
        "from agentsession_cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith(('agentsession_cas', 'agentsession_cli'))), file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, check=True)
    return set(r.stderr.decode().split())


def _loads_any(loaded: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if m.startswith(prefixes))


def test_head_and_list_load_no_rule_set_nor_reader(tmp_path):
    root, sid = _small_store(tmp_path)
    for argv in (["head", sid], ["list"], ["head", sid, "--json"]):
        loaded = _loaded_by(["--store", root, *argv])
        assert "agentsession_cas.store.session" in loaded  # the store was opened
        assert not _loads_any(loaded, RULE_MACHINERY + FILE_READING + ELSEWHERE), (argv, _loads_any(loaded, RULE_MACHINERY + FILE_READING + ELSEWHERE))


def test_export_streams_without_the_rule_set(tmp_path):
    root, sid = _small_store(tmp_path)
    loaded = _loaded_by(["--store", root, "export", sid])
    assert not _loads_any(loaded, RULE_MACHINERY + FILE_READING + ELSEWHERE)


def test_append_loads_the_rules_but_no_reader_nor_maintenance(tmp_path):
    root, sid = _small_store(tmp_path)
    loaded = _loaded_by(["--store", root, "append", sid], stdin=b'{"type":"config","model":"m"}')
    assert "agentsession_cas.format.rules" in loaded  # an append is held to the rule set
    assert not _loads_any(loaded, FILE_READING + ELSEWHERE)


def _run_script(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """The installed script's run() with ``argv``, an exit handler that says it ran."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('finalized', file=sys.stderr))\n"
        "from agentsession_cli.main import run\n"
        f"sys.argv = ['agentsession', *{argv!r}]\n"
        "run()\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_the_script_ends_at_once_after_an_import_and_only_then(tmp_path):
    """The installed script ends its process at once (no exit handler, no freeing of the
    interpreter's objects) once an import has exited 0: its output written whole, the
    session durable and readable by the next process. A refused import, another command,
    or main() called by a program that goes on after it, end as any process does."""
    store = str(tmp_path / "s")
    assert _run_script(["--store", store, "init"]).stderr.endswith("finalized\n")
    fixture = str(Path(__file__).resolve().parents[1] / "fixtures" / "basic.jsonl")
    r = _run_script(["--store", store, "import", "--json", fixture])
    assert r.returncode == 0 and "finalized" not in r.stderr
    sid = json.loads(r.stdout)["session"]
    assert _run_script(["--store", store, "verify", sid]).returncode == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(Path(fixture).read_bytes() + b"{not json}\n{}\n")
    r = _run_script(["--store", str(tmp_path / "t"), "import", str(bad)])
    assert r.returncode == 1 and r.stderr.endswith("finalized\n")
    assert _run_script(["--store", str(tmp_path / "u"), "init"]).returncode == 0
    code = (
        "import sys\n"
        "from agentsession_cli.main import main\n"
        "try:\n"
        f"    main(['--store', {str(tmp_path / 'u')!r}, 'import', {fixture!r}])\n"
        "except SystemExit as exc:\n"
        "    print('went on', exc.code)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.endswith("went on 0\n")


#: The rules' table (``format.codes``, its ``Rule`` rows built at import), loaded where an
#: entry, a header or a link is checked: an append loads it with the rule set, head and list
#: check nothing. ``format.normalise``, only for an entry that records normalising.
NOT_FOR_READING = ("agentsession_cas.format.codes", "agentsession_cas.format.normalise", "agentsession_cas.format.results")
NOT_FOR_APPENDING = ("agentsession_cas.format.normalise", "agentsession_cas.format.results")


def test_head_list_and_append_load_nothing_they_do_not_use(tmp_path):
    """Start-up (issue 11): ``concurrent.futures`` brings ``logging`` (a few ms), which only
    a long writer's fsync and checkpoint pools need; no lock package is imported (the file
    backend's flock is its own, ``backends/files/locks.py``); ``shutil`` (which brings bz2
    and lzma), ``tempfile`` and ``subprocess`` are loaded only where a command uses them
    (a terminal's width, a long ``--json``, a large pack's sorter, a search for libcrypto);
    nor is what checks rules a command does not check (``NOT_FOR_READING``)."""
    root, sid = _small_store(tmp_path)
    entry = tmp_path / "entry.json"
    entry.write_text('{"type":"config","model":"m"}')
    unwanted = ("logging", "concurrent.futures", "filelock", "shutil", "tempfile", "subprocess")
    for argv, stdin, ours in ((["head", sid], None, NOT_FOR_READING), (["list"], None, NOT_FOR_READING),
                              (["append", sid], str(entry), NOT_FOR_APPENDING)):
        code = (
            "import sys\n"
            + (f"sys.stdin = open({stdin!r})\n" if stdin else "")
            + "from agentsession_cli.main import main\n"
            "try:\n"
            f"    main({['--store', root, *argv]!r})\n"
            "except SystemExit as exc:\n"
            "    assert not exc.code, exc.code\n"
            f"print(' '.join(m for m in {unwanted + ours!r} if m in sys.modules), file=sys.stderr)\n"
        )
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert r.stderr.split() == [], (argv, r.stderr)


def test_append_builds_no_class_only_a_report_uses(tmp_path):
    """Every ``@dataclass`` costs start-up (its methods compiled at import): what only a
    report holds (a built context, a runs report, a verify report: ``format/results.py``)
    is not made by an append, which checks its entry and reports none of them."""
    from agentsession_cas.format import results

    root, sid = _small_store(tmp_path)
    entry = tmp_path / "entry.json"
    entry.write_text('{"type":"config","model":"m"}')
    code = (
        "import dataclasses, sys\n"
        "made = []\n"
        "standard = dataclasses._process_class\n"
        "def counted(cls, *args):\n"
        "    made.append(cls.__qualname__)\n"
        "    return standard(cls, *args)\n"
        "dataclasses._process_class = counted\n"
        f"sys.stdin = open({str(entry)!r})\n"
        "from agentsession_cli.main import main\n"
        "try:\n"
        f"    main({['--store', root, 'append', sid]!r})\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print(' '.join(made), file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    made = set(r.stderr.split())
    assert "AppendResult" in made  # (the count saw the append's own classes)
    assert not made & set(results.__all__), sorted(made & set(results.__all__))


def test_what_moved_to_results_is_importable_where_it_was():
    """The classes moved to ``format/results.py`` are the same objects from the modules
    that held them before (and from the package), loaded on first use."""
    import agentsession_cas
    from agentsession_cas.format import context, results, rules, runs

    where = {context: ("Context", "OmittedItem", "ReplacedItem", "RequestReport"),
             runs: ("CallEvent", "CallInfo", "QueuedInfo", "RecordsCheck", "RunInfo", "RunsReport"),
             rules: ("VerifyReport",)}
    assert sorted(n for names in where.values() for n in names) == sorted(results.__all__)
    for module, names in where.items():
        for name in names:
            assert getattr(module, name) is getattr(results, name), (module.__name__, name)
            assert name in module.__all__
    for name in ("Context", "RequestReport", "CallInfo", "RunInfo", "RunsReport", "RecordsCheck", "VerifyReport"):
        assert getattr(agentsession_cas, name) is getattr(results, name)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        context.Nothing  # noqa: B018
