"""The damage table (issue 16): every kind of file the store keeps, damaged one byte at
a time (flipped, zeroed, cut), played through the command (see damage.py).

The quick test tries the first, middle and last byte of each file; the slow one ten
positions. Both print the table and hold the store to what docs/reliability.md says."""

from __future__ import annotations

import json

import pytest
from damage import Row, files_of, invoke, play, table

#: Damage the store cannot save by itself, and why (docs/reliability.md says the same):
#: the file is the only copy of what it holds.
UNSAVEABLE = {
    "layout": "every command refuses the store (a newer release's layout is not guessed at)",
    "ref": "a ref file is the only record of what it names",
}
#: Damage that is not yet found. (The header was here until every read of a header,
#: ``Store.header`` included, took the log's where the file disagrees: the file is an
#: index of the log, so a damaged one is harmless, warned of, and rewritten.)
NOT_YET_FOUND: set[str] = set()
#: The slow table is played in parts, so a parallel run spreads the longest test of the
#: suite over its workers; together they hold every kind (the test checks it).
PARTS = (
    ("loose object", "HEAD", "lock"),
    ("pack", "layout", "ref"),
    ("pack index", "log (tail)", "summary"),
    ("log (committed)", "mark", "header"),
)


def check(rows: dict[str, Row]) -> None:
    print()
    print(table(rows))
    for row in rows.values():
        problems = [f for f in row.failures if row.kind not in NOT_YET_FOUND and row.kind not in UNSAVEABLE
                    and "known gap" not in f]
        problems += [f for f in row.failures if row.kind in UNSAVEABLE and "not saved by repair" not in f
                     and row.kind not in NOT_YET_FOUND]
        assert row.tracebacks == 0, row.failures
        if row.kind in NOT_YET_FOUND:
            continue
        assert row.wrong == 0, row.failures
        assert row.found + row.harmless == row.tried, row.failures
        if row.kind not in UNSAVEABLE:
            assert row.saved == row.found, row.failures
        assert not problems, problems


def test_damage_table_quick(rich_store, tmp_path):
    root, info = rich_store
    check(play(root, info, tmp_path, many=False, only=lambda k: k != "log (tail)"))


def test_damage_table_log_tail(rich_store, tmp_path):
    root, info = rich_store
    check(play(root, info, tmp_path, many=False, only=lambda k: k == "log (tail)"))


@pytest.mark.slow
@pytest.mark.parametrize("part", PARTS, ids=lambda kinds: kinds[0])
def test_damage_table_many_positions(rich_store, tmp_path, part):
    root, info = rich_store
    assert set().union(*PARTS) == set(files_of(root, info)), "a kind of file is in no part of the table"
    check(play(root, info, tmp_path, many=True, only=lambda k: k in part))


def test_log_of_a_log_cut_at_a_record_boundary_reports_the_loss(store):
    """Every line left reads and chains, so only HEAD shows the loss: `log` must not
    list what is left as the whole history with exit 0 (it did: issue 16)."""
    root, _ = store
    log = root / "sessions" / "rec" / "log"
    lines = log.read_bytes().splitlines(keepends=True)
    whole = invoke(root, "log", "rec")
    assert whole.exit_code == 0, whole.output
    log.write_bytes(b"".join(lines[: len(lines) // 2]))
    r = invoke(root, "log", "rec")
    assert r.exit_code == 1, r.output
    assert "does not hold" in r.stderr and "cut short" in r.stderr, r.stderr
    assert len(r.stdout.splitlines()) > 1  # the records that are left are still listed
    j = invoke(root, "log", "--json", "rec")
    assert j.exit_code == 1
    err = json.loads(j.stderr.strip().splitlines()[-1])["error"]
    assert err["code"] == "session_damaged" and err["problems"][0]["where"] == "log", err
    # verify and fsck say the same; repair takes the lost entries back and `log` is clean again
    assert invoke(root, "verify", "rec").exit_code == 1
    assert invoke(root, "fsck").exit_code == 1
    assert invoke(root, "repair", "--yes", "rec").exit_code == 0
    assert invoke(root, "log", "rec").exit_code == 0
