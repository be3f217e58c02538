"""verify ID with the line rules in a helper process, as verify FILE has them
(format/parallel.py through reader.verify_lines): what a stored session's check finds
is what one process finds, for every session the corpus and the fixtures import into."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_parallel import forced  # noqa: F401 - a fixture

from agentsession_cas.errors import AgentSessionError
from agentsession_cas.format import parallel
from agentsession_cas.maintenance.check import verify_stored
from agentsession_cas.store import Store

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _check(store: Store, sid: str) -> tuple:
    c = verify_stored(store, sid)
    return c.problems, c.notes, c.stats


def test_a_stored_session_verifies_the_same_with_the_helper(forced, tmp_path, monkeypatch):
    _, counted = forced  # the helper's answers used from the first block; small blocks
    paths = sorted(CORPUS.glob("**/*.jsonl")) + sorted(FIXTURES.glob("**/*.jsonl"))
    sids = []
    with Store.init(str(tmp_path / "st")) as st:
        for p in paths:
            try:
                sids.append(st.import_file(str(p)).id)
            except (AgentSessionError, OSError, ValueError):
                continue  # (a file the import refuses)
    assert len(sids) > 10
    with Store(str(tmp_path / "st"), readonly=True) as st:
        for sid in sids:
            monkeypatch.setenv(parallel.ENV, "1")
            alone = _check(st, sid)
            monkeypatch.setenv(parallel.ENV, "2")
            assert _check(st, sid) == alone, sid
    assert counted[0] > 200  # the helper's answers were used


@pytest.mark.parametrize("said, used", [("1", False), ("2", True)])
def test_the_helper_is_taken_as_a_file_takes_it(tmp_path, monkeypatch, said, used):
    """AGENTSESSION_VERIFY_PROCESSES decides for a stored session as for a file."""
    started: list[int] = []
    real_start = parallel.LineHelper.start
    monkeypatch.setattr(parallel.LineHelper, "start", lambda self: (started.append(1), real_start(self))[1])
    monkeypatch.setenv(parallel.ENV, said)
    with Store.init(str(tmp_path / "st")) as st:
        sid = st.import_file(str(FIXTURES / "branches.jsonl")).id
        assert verify_stored(st, sid).ok
    assert bool(started) is used
