"""Shell completion (cli/completion.py): subcommands, session ids and ref:NAME where a
session is taken, ref names for `ref show|update|delete`, files beside sessions for
`show FILE|ID`; a missing store completes nothing rather than failing."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cli.main import main


def complete(line: str, env: dict | None = None) -> list[tuple[str, str]]:
    words = line.split(" ")
    cword = len(words) - 1
    result = CliRunner().invoke(
        main, [], prog_name="agentsession",
        env={"_AGENTSESSION_COMPLETE": "bash_complete", "COMP_WORDS": line, "COMP_CWORD": str(cword), **(env or {})},
    )
    assert result.exit_code == 0, result.output
    return [tuple(x.split(",", 1)) for x in result.stdout.splitlines() if x]  # type: ignore[misc]


@pytest.fixture
def store(tmp_path) -> Path:
    root = tmp_path / "store"
    run = CliRunner()
    for args in (["init"], ["create", "--id", "alpha"], ["create", "--id", "alto"], ["create", "--id", "beta"],
                 ["ref", "update", "team/x", "alpha"], ["ref", "update", "solo", "beta"]):
        assert run.invoke(main, ["--store", str(root), *args]).exit_code == 0
    return root


def test_subcommands(store):
    assert ("plain", "verify") in complete("agentsession ver")


def test_session_ids_and_refs(store):
    assert complete(f"agentsession --store {store} head al") == [("plain", "alpha"), ("plain", "alto")]
    assert complete(f"agentsession --store {store} push ref:t") == [("plain", "ref:team/x")]
    got = complete(f"agentsession --store {store} show b")
    assert ("plain", "beta") in got and ("file", "b") in got, "show takes a file too"
    assert complete(f"agentsession --store {store} ref show t") == [("plain", "team/x")]


def test_the_store_is_found_as_a_command_finds_it(store):
    assert complete("agentsession head be", env={"AGENTSESSION_STORE": str(store)}) == [("plain", "beta")]
    assert complete(f"agentsession -C {store} head be") == [("plain", "beta")]


def test_no_store_completes_nothing(tmp_path):
    assert complete(f"agentsession --store {tmp_path / 'none'} head a") == []
