"""The command loads only what the subcommand it runs needs (issue: start-up cost)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import click

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
        assert loaded <= {"agentsession_cas", "agentsession_cas.errors", "agentsession_cli",
                          "agentsession_cli.main", "agentsession_cli.common"}, (argv, sorted(loaded))


def test_a_store_command_does_not_load_exchange_or_the_file_commands(tmp_path):
    loaded = _loaded_after(["--store", str(tmp_path / "s"), "init"])
    assert "agentsession_cli.store_commands" in loaded
    assert not any(m.startswith(("agentsession_cli.exchange", "agentsession_cli.file_commands")) for m in loaded), sorted(loaded)
