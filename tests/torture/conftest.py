"""The torture suite's shared store: built once per session, copied for each case."""

from __future__ import annotations

import shutil
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
