"""Every Python example in README.md and docs/ runs as written.

Each ```python block runs in a fresh interpreter, in a temp directory that
holds the repository's ``fixtures/`` (as a link), with ``HOME`` pointed there
so ``~/.agent/cas`` and the other stores an example makes land in it. A block
that is a listing rather than a program is fenced ```text instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _examples() -> list[tuple[str, int, str]]:
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, m in enumerate(_BLOCK.finditer(doc.read_text())):
            out.append((str(doc.relative_to(ROOT)), i, m.group(1)))
    return out


EXAMPLES = _examples()


def test_there_are_examples_to_run():
    assert len(EXAMPLES) >= 6


@pytest.mark.parametrize(("doc", "n", "code"), EXAMPLES, ids=[f"{d}#{n}" for d, n, _ in EXAMPLES])
def test_the_example_runs_as_written(doc, n, code, tmp_path):
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    env = {k: v for k, v in os.environ.items() if k != "AGENTSESSION_STORE"}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{doc} example {n} failed:\n{r.stderr}"


def test_the_example_script_runs(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "record_and_push.py"), str(tmp_path / "ex")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
