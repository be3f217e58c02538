"""Every code block in README.md and docs/ runs as written.

Every fenced block names its language. Each ```python block runs in a fresh
interpreter and each ```sh block in bash (``set -e -o pipefail``: every command
must succeed), in a temp directory that holds the repository's ``fixtures/`` and
``.venv`` (as links), with ``HOME`` pointed there so ``~/.agent/cas`` and the
other stores an example makes land in it, the virtualenv's ``bin`` first on the
PATH, and no pager, colour or store chosen by the environment. Each ```json
block parses. A block that is a listing rather than a program (a synopsis,
output, a layout, or a command that needs what a test cannot make: a package
index, a database server elsewhere) is fenced ```text instead.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\S*)\n(.*?)^```", re.S | re.M)
LANGUAGES = {"python", "sh", "json", "text"}
#: Environment variables a reader's shell may hold that would change what a block does.
_UNSET = ("AGENTSESSION_STORE", "AGENTSESSION_PAGER", "PAGER", "COLUMNS", "NO_COLOR", "LESS")


def _blocks(language: str) -> list[tuple[str, int, str]]:
    out = []
    for doc in DOCS:
        found = [m.group(2) for m in _FENCE.finditer(doc.read_text()) if m.group(1) == language]
        out.extend((str(doc.relative_to(ROOT)), i, code) for i, code in enumerate(found))
    return out


EXAMPLES = _blocks("python")
SHELL = _blocks("sh")
JSON = _blocks("json")


def _workdir(tmp_path: Path) -> dict[str, str]:
    """The temp directory a block runs in, and its environment."""
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    venv = Path(sys.executable).parent.parent
    (tmp_path / ".venv").symlink_to(venv)
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT), PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    return env


def test_every_block_names_its_language():
    """A bare fence would be neither run nor marked as a listing: each says which it is."""
    for doc in DOCS:
        for m in _FENCE.finditer(doc.read_text()):
            assert m.group(1) in LANGUAGES, f"{doc.relative_to(ROOT)}: a block fenced ```{m.group(1)}: {m.group(2)[:60]!r}"


def test_there_are_shell_blocks_to_run():
    assert {doc for doc, _, _ in SHELL} >= {"README.md", "docs/cli.md"}


@pytest.mark.parametrize(("doc", "n", "code"), SHELL, ids=[f"{d}#sh{n}" for d, n, _ in SHELL])
def test_the_shell_block_runs_as_written(doc, n, code, tmp_path):
    env = _workdir(tmp_path)
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"{doc} shell block {n} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"


@pytest.mark.parametrize(("doc", "n", "code"), JSON, ids=[f"{d}#json{n}" for d, n, _ in JSON])
def test_the_json_block_parses(doc, n, code):
    json.loads(code)


def test_there_are_examples_to_run():
    assert len(EXAMPLES) >= 6


@pytest.mark.parametrize(("doc", "n", "code"), EXAMPLES, ids=[f"{d}#{n}" for d, n, _ in EXAMPLES])
def test_the_example_runs_as_written(doc, n, code, tmp_path):
    env = _workdir(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{doc} example {n} failed:\n{r.stderr}"


def test_the_example_script_runs(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "record_and_push.py"), str(tmp_path / "ex")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


_FAILURE = re.compile(r"\b(error|errors|refused|damaged|cannot|traceback|not moved)\b|\b[1-9][\d,]* (problem|failed)", re.I)


@pytest.mark.slow
def test_make_demo_ends_with_no_line_that_reads_as_a_failure():
    """`make demo` exits 0; the one step that fails on purpose (a damaged file) says so,
    and no other line reads as a failure; it ends saying how to put the command on the PATH."""
    r = subprocess.run(["make", "-s", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k not in _UNSET})
    assert r.returncode == 0, r.stdout + r.stderr
    sections = re.split(r"^== ", r.stdout, flags=re.M)
    # the steps that show a failure on purpose say so in their heading: a damaged file, a crash
    on_purpose = [s for s in sections if re.search(r"damaged|crash", s.split("\n")[0])]
    assert len(on_purpose) >= 2 and any("as it should" in s for s in on_purpose)
    for section in sections:
        if section not in on_purpose:
            bad = [line for line in section.splitlines() if _FAILURE.search(line)]
            assert not bad, (section.split("\n")[0], bad)
    assert sections[-1].startswith("done:") and 'export PATH="' in sections[-1]
