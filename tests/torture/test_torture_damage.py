"""The damage table (issue 16): every kind of file the store keeps, damaged one byte at
a time (flipped, zeroed, cut), played through the command (see damage.py).

The quick test tries the first, middle and last byte of each file; the slow one ten
positions. Both print the table and hold the store to what docs/reliability.md says."""

from __future__ import annotations

import pytest

from damage import Row, play, table

#: Damage the store cannot save by itself, and why (docs/reliability.md says the same):
#: the file is the only copy of what it holds.
UNSAVEABLE = {
    "header": "a session's header is held nowhere else",
    "layout": "every command refuses the store (a newer release's layout is not guessed at)",
    "ref": "a ref file is the only record of what it names",
}
#: Damage that is not yet found: the header has no checksum. The lead's change (a checksum
#: in the header file, backends/files/sessions.py) closes it; until then a flipped byte
#: inside a header's values is served.
NOT_YET_FOUND = {"header"}


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
def test_damage_table_many_positions(rich_store, tmp_path):
    root, info = rich_store
    check(play(root, info, tmp_path, many=True))
