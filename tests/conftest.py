"""Shared fixtures: the reference corpus (beside this repository) and the project's own fixtures."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"
FIXTURES = REPO / "fixtures"

# Property tests: the same examples on every run (a seed per test, no example database, no
# deadline, no speed health check), so a CI run cannot fail on a draw or a slow moment that
# the previous one did not have. ``HYPOTHESIS_PROFILE=explore`` draws fresh examples (and
# more of them) when looking for new failures; a failure it finds becomes a test's
# ``@example``. Loaded here, before the test modules: their ``@settings`` inherit it.
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Memory-backed temp space for the stores tests make, when the machine has room.
_SHM = Path("/dev/shm")
_SHM_NEEDED = 4 << 30


def pytest_configure(config: pytest.Config) -> None:
    """Put the tests' temp directories in memory (/dev/shm) unless told where.

    The suite makes thousands of small stores, each a few hundred directories and
    many fsyncs; on a virtual disk that is most of its time (seven times the whole
    run, measured). Nothing a test checks depends on the disk itself: a killed
    writer's data survives in the page cache either way, and the fsync-failure
    paths are forced. ``--basetemp`` (or ``AGENTSESSION_TEST_DISK=1``) keeps them on disk.
    """
    if config.option.basetemp or os.environ.get("AGENTSESSION_TEST_DISK") or hasattr(config, "workerinput"):
        return
    try:
        if not _SHM.is_dir() or shutil.disk_usage(_SHM).free < _SHM_NEEDED:
            return
        base = tempfile.mkdtemp(prefix="agentsession-tests-", dir=_SHM)
    except OSError:
        return
    config.option.basetemp = base
    config._agentsession_shm = base  # type: ignore[attr-defined]
    # Subprocesses and tempfile users (benchmarks' helpers, workers) follow.
    os.environ["TMPDIR"] = base
    tempfile.tempdir = None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Free the memory when every test passed; keep the stores of a failed run to look at."""
    base = getattr(session.config, "_agentsession_shm", None)
    if base is None:
        return
    if exitstatus == 0 or not any(Path(base).iterdir()):
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"\nthe failed run's temp directories are kept in {base}")


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


@pytest.fixture(autouse=True, scope="session")
def _output_on_one_line():
    """Human output is fitted to the width (docs/cli.md "Human output"): the suite reads
    each reported item on one line, so the command runs in it as off a terminal 10,000
    columns wide, whatever COLUMNS the shell exported. tests/test_cli_terminal.py checks
    the fitting itself (100 columns off a terminal, a forced terminal's width)."""
    from agentsession_cli import terminal

    # for the whole session (module fixtures run the command too), with a patch of its own
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("COLUMNS", raising=False)
        patch.setattr(terminal, "FALLBACK_WIDTH", 10_000)
        yield


@pytest.fixture(autouse=True)
def _a_fresh_terminal_run():
    """Each test starts as a new run of the command does (cli/main.py configures the
    terminal's settings per run): a test that calls a command's function directly
    (run_fsck, say) would otherwise inherit what the last run in this worker decided
    (--json, a pager, the width), and pass or fail by which test ran before it."""
    from agentsession_cli import terminal

    terminal.configure()
    yield
