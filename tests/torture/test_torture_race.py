"""Maintenance racing work (issue 16): pack, sweep at the default grace and fsck in loops
while processes append, push in, fork and delete (race.py plays it). Afterwards every
acknowledged operation is whole and fsck is clean; fsck run during the race reports no
problem either (a live writer is not damage)."""

from __future__ import annotations

import pytest

from race import play

SECONDS = 12.0


@pytest.mark.slow
def test_pack_sweep_and_fsck_racing_appends_pushes_forks_and_deletes(tmp_path):
    root = tmp_path / "store"
    from agentsession_cas.store import Store

    Store.init(root).close()
    race = play(str(root), tmp_path, SECONDS, (("pack",), ("sweep",)))
    print(race.figures())
    assert not race.failures, "\n".join(race.failures[:20])
