"""The torture suite's shared store: built once per session, copied for each case."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from test_fsck import build


@pytest.fixture(scope="session")
def rich_store(tmp_path_factory) -> tuple[Path, dict]:
    """Loose and packed objects, a fork, a sidecar blob, a mirror and a ref (test_fsck.build)."""
    base = tmp_path_factory.mktemp("torture-built")
    root = base / "store"
    info = build(root, base)
    return root, info


@pytest.fixture
def store(rich_store, tmp_path) -> tuple[Path, dict]:
    root, info = rich_store
    copy = tmp_path / "store"
    shutil.copytree(root, copy, symlinks=True)
    return copy, info


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs of the test's own (root only; skipped with the reason elsewhere)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
