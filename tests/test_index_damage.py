"""A session's indexes held to its log alike on every backend that keeps them apart from it:
the file backend's ``HEAD``, and PostgreSQL's session row (its ``head`` and its log length,
``last_pos``).

An index may lag the log, never lead it (``store.state.index_damage``): a log cut short at a
record boundary (records lost from its end, each remaining one sound) is refused by every
open with the same error and words, reported ``log-cut`` by ``verify ID`` and ``fsck``, and
taken back by ``repair``. A head index on a leaf label is no lag either (no head rests there:
``store.state.stale_head``): ``verify ID`` and ``fsck`` call it ``stale-head``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import pg_server
from agentsession_cas import Header
from agentsession_cas.errors import SessionDamagedError
from agentsession_cas.maintenance.check import verify_stored
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.maintenance.repair import repair_session
from agentsession_cas.store.url import open_store
from agentsession_cli.main import main
from contract_helpers import leaf, msg

SID = "s1"


class Damage:
    """One store of a backend, and the damage a test does to it below the API."""

    def __init__(self, backend: str, url: str):
        self.backend, self.url = backend, url

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        from agentsession_cas.backends.postgresql.database import parse_url

        conninfo, schema = parse_url(self.url)
        with psycopg.connect(conninfo, autocommit=True) as c:
            c.execute(f"SET search_path TO {schema}")
            cur = c.execute(statement, params)
            return cur.fetchall() if cur.description is not None else []

    def records(self) -> int:
        """How many records the session's log holds."""
        if self.backend == "file":
            return len((Path(self.url) / "sessions" / SID / "log").read_bytes().splitlines())
        return int(self.sql("SELECT count(*) FROM log")[0][0])

    def cut(self, keep: int) -> None:
        """The log cut at a record boundary: its first ``keep`` records kept, the rest lost
        (the indexes untouched, as the loss leaves them)."""
        if self.backend == "file":
            log = Path(self.url) / "sessions" / SID / "log"
            log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:keep]))
        else:
            self.sql("DELETE FROM log WHERE pos > %s", [keep])

    def set_head_index(self, head: str) -> None:
        if self.backend == "file":
            (Path(self.url) / "sessions" / SID / "HEAD").write_text(head + "\n")
        else:
            self.sql("UPDATE sessions SET head = %s", [head])

    def held(self) -> Any:
        """What the store holds of the session, below the API (to see that nothing was written)."""
        if self.backend == "file":
            sdir = Path(self.url) / "sessions" / SID
            return {p.name: p.read_bytes() for p in sdir.iterdir() if p.is_file()}
        return (self.sql("SELECT header, head, mark, last_pos FROM sessions"),
                self.sql("SELECT pos, record FROM log ORDER BY pos"),
                self.sql("SELECT kind, pos, data FROM states ORDER BY kind"))


@pytest.fixture(params=["file", "postgresql"])
def damage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Damage]:
    if request.param == "file":
        yield Damage("file", str(tmp_path / "store"))
        shutil.rmtree(tmp_path / "store", ignore_errors=True)
    else:
        yield Damage("postgresql", pg_server.fresh_schema("idx"))


def build(damage: Damage, body: Callable[[Any], list[str]]) -> list[str]:
    with open_store(damage.url, create=True) as st:
        s = st.create(Header.new(SID))
        ids = body(s)
        s.close()
    return ids


def appends(n: int) -> Callable[[Any], list[str]]:
    return lambda s: [s.append(msg(f"entry {i}")).id for i in range(n)]


def cli(damage: Damage, *args: str) -> Any:
    return CliRunner().invoke(main, list(args), env={"AGENTSESSION_STORE": damage.url})


def test_a_log_cut_at_a_record_is_refused_alike_and_repaired(damage):
    """Four appends (a create, then an append and a commit each); the log keeps the first
    append only. On PostgreSQL a writing open refused it as a store fault ('its row says
    the log has 9 record(s) ... run agentsession fsck'), list showed it whole from its kept
    summary, and fsck gave log-length and session-row beside log-cut: now every open
    refuses it as the file backend does, session_damaged with index_damage's words."""
    ids = build(damage, appends(4))
    damage.cut(3)
    before = damage.held()
    with open_store(damage.url) as st:
        whys = []
        for opening in (st.read, st.session):
            with pytest.raises(SessionDamagedError) as got:
                opening(SID)
            whys.append(got.value.why)
        assert whys[0] == whys[1] and ids[-1] in whys[0] and "lost committed records" in whys[0], whys
        check = verify_stored(st, SID)
        assert [(p["code"], p["where"]) for p in check.problems] == [("log-cut", "log")], check.problems
    assert damage.held() == before  # the refused writing open wrote nothing
    rows = json.loads(cli(damage, "list", "--json").stdout)
    assert [(r["session"], r["mark"], r.get("code")) for r in rows] == [(SID, "damaged", "session_damaged")], rows
    report = fsck(damage.url)
    assert [p.code for p in report.errors] == ["log-cut"], report.errors
    # repair takes back what the head index proves, and the session goes on after it
    with open_store(damage.url) as st:
        repaired = repair_session(st, SID)
        assert repaired.repaired and [x.entry for x in repaired.recovered] == ids[1:]
        s = st.session(SID)
        assert s.log_order == ids and s.head == ids[-1]
        assert s.append(msg("after the repair")).seq == len(ids) + 1
        s.close()
    assert fsck(damage.url).ok
    assert cli(damage, "verify", SID).exit_code == 0


def test_a_log_that_lost_only_its_last_commit_on_postgresql(tmp_path):
    """PostgreSQL keeps the log's length in the session's row (written in the append's
    transaction), so a log that lost only its last row (a commit: the head index still
    held) is a cut too, where the file backend has no index to see it by. It was read
    as sound by a reading open and verify ID and refused by a writing open as a store
    fault; fsck said log-length. Now it is the length index's log-cut everywhere, and
    repair sets the length to the log's (the last append adopted with a commit)."""
    damage = Damage("postgresql", pg_server.fresh_schema("idx"))
    ids = build(damage, appends(2))
    damage.cut(damage.records() - 1)
    with open_store(damage.url) as st:
        for opening in (st.read, st.session):
            with pytest.raises(SessionDamagedError, match="its length index says the log holds 5 record"):
                opening(SID)
        check = verify_stored(st, SID)
        assert [(p["code"], p["where"]) for p in check.problems] == [("log-cut", "log")], check.problems
    assert [p.code for p in fsck(damage.url).errors] == ["log-cut"]
    with open_store(damage.url) as st:
        assert repair_session(st, SID).repaired
        s = st.session(SID)
        assert s.log_order == ids and s.head == ids[-1]
        s.close()
    assert fsck(damage.url).ok


def test_verify_id_refuses_a_head_index_on_a_leaf_label(damage):
    """No head rests on a leaf label, so a head index naming one is no lag: fsck called it
    stale-head on the file backend (session-row on PostgreSQL) while verify ID passed it on
    both. Now both say stale-head, and only that; repair rewrites the index."""
    made: list[str] = []

    def body(s: Any) -> list[str]:
        ids = [s.append(msg(f"entry {i}")).id for i in range(3)]
        made.append(s.append(leaf(ids[1], ids[2])).id)  # the head moves to ids[1]
        return ids

    ids = build(damage, body)
    label = made[0]
    damage.set_head_index(label)
    with open_store(damage.url, readonly=True) as st:
        check = verify_stored(st, SID)
        assert [(p["code"], p["entry"]) for p in check.problems] == [("stale-head", label)], check.problems
        assert ids[1] in check.problems[0]["message"]
    r = cli(damage, "verify", SID, "--json")
    assert r.exit_code == 1 and [p["code"] for p in json.loads(r.stdout)["problems"]] == ["stale-head"], r.stdout
    assert [p.code for p in fsck(damage.url).errors] == ["stale-head"]
    with open_store(damage.url) as st:
        repair_session(st, SID)
    assert fsck(damage.url).ok
    assert cli(damage, "verify", SID).exit_code == 0


def test_a_lagging_head_index_still_passes_verify_id(damage):
    """A head index behind the log's head on an entry a head may rest on is a lag (a crash
    before the index was rewritten), not stale-head: verify ID passes it, as before."""
    ids = build(damage, appends(3))
    damage.set_head_index(ids[0])
    with open_store(damage.url, readonly=True) as st:
        assert verify_stored(st, SID).ok


def test_fsck_calls_a_leaf_label_head_stale_though_its_last_writer_did_not_close(tmp_path):
    """A HEAD may lag the log while its last writer did not close (fsck's index-lag note),
    but never onto a leaf label: fsck said index-lag there, now stale-head, as verify ID."""
    root = tmp_path / "store"
    script = (
        "import os, sys, json\n"
        "from agentsession_cas import Header\n"
        "from agentsession_cas.store import Store\n"
        "from contract_helpers import leaf, msg\n"
        "st = Store.init(sys.argv[1])\n"
        f"s = st.create(Header.new({SID!r}))\n"
        "ids = [s.append(msg(f'entry {i}')).id for i in range(3)]\n"
        "label = s.append(leaf(ids[1], ids[2])).id\n"
        "s.commit()\n"
        "print(json.dumps([ids, label]), flush=True)\n"
        "os._exit(0)  # no close: the log shows its last writer did not close\n"
    )
    tests = str(Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": tests}).stdout
    ids, label = json.loads(out)
    (root / "sessions" / SID / "HEAD").write_text(label + "\n")
    report = fsck(root)
    assert [(p.code, p.severity) for p in report.problems if p.code in ("stale-head", "index-lag")] == \
        [("stale-head", "error")], report.problems
