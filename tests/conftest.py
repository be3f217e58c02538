"""Shared fixtures: the reference corpus (beside this repository) and the project's own fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"
FIXTURES = REPO / "fixtures"


@pytest.fixture(scope="session")
def corpus() -> Path:
    """The reference corpus (../shared/corpus); the test is skipped when it is absent."""
    if not (CORPUS / "sessions").is_dir():
        pytest.skip(f"reference corpus not found at {CORPUS}; these tests need ../shared/corpus")
    return CORPUS


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The repository's own fixtures/ directory (written by fixtures/generate.py)."""
    return FIXTURES
