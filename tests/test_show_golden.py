"""What ``show`` prints, pinned byte for byte: the text listing and context of the project's
fixture sessions and of a generated coding-agent session (branches, labels, configs, long
texts wrapped and cut), as a stored session (the streamed listing) and as a file, at the
fallback width and a narrow one. A change to how show reads, describes, cuts or wraps must
print the same bytes; regenerate the files (``AGENTSESSION_GOLDEN=write``) only for a change
meant to alter the output, and read the diff."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas.store import Store
from agentsession_cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
from bench_verify import SESSION_ID, generate

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden" / "show"
FIXTURES = ["basic", "branches", "extensions", "root-leaf", "fork-origin"]
#: (name, show's options, COLUMNS)
VIEWS = [("", [], "100"), ("-v-tail", ["-v", "--tail", "4"], "100"), ("-narrow", [], "60")]


def _show(*args: str, columns: str) -> str:
    r = CliRunner().invoke(main, ["--no-pager", *args], env={"COLUMNS": columns, "NO_COLOR": "1"}, catch_exceptions=False)
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return r.stdout


def _check(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("AGENTSESSION_GOLDEN") == "write":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    assert path.read_bytes().decode("utf-8") == text, f"show's output differs from {path}"


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> tuple[Path, dict[str, Path], dict[str, str]]:
    """A store holding the fixtures and the generated session, and the files they came from."""
    tmp = tmp_path_factory.mktemp("golden")
    files = {name: REPO / "fixtures" / f"{name}.jsonl" for name in FIXTURES}
    files["generated"] = tmp / "generated.jsonl"
    files["generated"].write_bytes(generate(400, 4)[0])
    root = tmp / "store"
    ids = {}
    with Store.init(root) as st:
        for name, path in files.items():
            ids[name] = st.import_file(path).id
    assert ids["generated"] == SESSION_ID
    return root, files, ids


@pytest.mark.parametrize("name", [*FIXTURES, "generated"])
@pytest.mark.parametrize("view", VIEWS, ids=[v[0] or "plain" for v in VIEWS])
def test_show_prints_the_pinned_text(stored, name, view):
    """A stored session (streamed) and its file print the same pinned bytes."""
    root, files, ids = stored
    suffix, opts, columns = view
    as_stored = _show("--store", str(root), "show", ids[name], *opts, columns=columns)
    _check(f"{name}{suffix}", as_stored)
    assert _show("show", str(files[name]), *opts, columns=columns) == as_stored
