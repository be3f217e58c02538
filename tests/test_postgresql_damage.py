"""PostgreSQL damage and races a reviewer proved (session 43): a sweep beside a fork whose
origin was deleted, a refused open that kept a snapshot of the damaged log, log rows whose
index columns disagree with their record, and a duplicated append row.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import pg_server
from agentsession_cas import Header
from agentsession_cas.backends.postgresql import PostgresBackend
from agentsession_cas.backends.postgresql import sessions as pg_sessions
from agentsession_cas.errors import SessionDamagedError, SweepRefusedError
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.maintenance.repair import repair_session
from agentsession_cas.maintenance.sweep import sweep
from agentsession_cas.store import Store
from agentsession_cas.store.url import open_store
from pg_server import sql


@pytest.fixture
def url() -> Iterator[str]:
    """A PostgreSQL store in a schema of its own, on the tests' server."""
    url = pg_server.fresh_schema("damage")
    open_store(url, create=True).close()
    yield url


def msg(text: str) -> dict[str, Any]:
    return {"type": "item", "item": {"type": "message", "role": "user", "content": text}}


def build(url: str, sid: str = "S", n: int = 3) -> list[str]:
    with open_store(url) as st:
        s = st.create(Header.new(sid))
        ids = [s.append(msg(f"{sid} {i}"), durable=True).id for i in range(n)]
        s.close()
    return ids


def codes(st: Store) -> list[str]:
    return [p.code for p in fsck(st).problems if p.severity == "error"]


@pytest.mark.parametrize("batch", [500, 2])
def test_a_sweep_keeps_the_prefix_of_a_fork_committed_while_it_ran_after_its_origin_went(
        url: str, monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    """The fork read its origin's prefix; the origin is deleted before the sweep reads the
    logs, and the fork commits after: no log read names the prefix, and the holds row the
    sweep read came before the fork's. Each delete batch reads the holds again under the
    barrier (it deleted the prefix: the fork's base was gone), and what a new hold retains
    is kept by every later batch too (batches of 2: the prefix spans several; the first
    mend filtered only the batch that found the hold)."""
    from agentsession_cas.backends.postgresql import maintenance as pg_maintenance

    monkeypatch.setattr(pg_maintenance, "SWEEP_BATCH", batch)
    build(url, "A")
    build(url, "B", 1)
    sql(url, "UPDATE objects SET born = now() - interval '30 days'")  # written long before the grace
    forker, deleter, sweeper = open_store(url), open_store(url), open_store(url)
    go, in_create = threading.Event(), threading.Event()
    create = pg_sessions.PgSessions.create

    def slow_create(self: Any, session_id: str, *args: Any, **kwargs: Any) -> Any:
        if session_id == "F":  # the prefix read, the fork's transaction not begun
            in_create.set()
            go.wait(30)
        return create(self, session_id, *args, **kwargs)

    monkeypatch.setattr(pg_sessions.PgSessions, "create", slow_create)
    made: list[str] = []

    def fork() -> None:
        f = forker.fork("A", session_id="F")
        f.close()
        made.append(f.id)

    t = threading.Thread(target=fork)
    t.start()
    assert in_create.wait(30)
    sources = PostgresBackend.retention_sources

    def racing(self: Any, **kwargs: Any) -> Iterator[Any]:
        deleter.delete("A")  # the origin goes before the logs are read
        logs = sources(self, **kwargs)
        first = next(logs)  # the logs' snapshot taken
        go.set()
        t.join(30)  # the fork commits after it
        yield first
        yield from logs

    monkeypatch.setattr(PostgresBackend, "retention_sources", racing)
    sweep(sweeper)
    monkeypatch.setattr(PostgresBackend, "retention_sources", sources)
    assert made == ["F"]
    with open_store(url) as st:
        f = st.open("F")
        assert st.objects.exists("entries", f.base)
        f.close()
        assert codes(st) == []
    for st in (forker, deleter, sweeper):
        st.close()


def test_a_refused_writing_open_keeps_no_snapshot_of_the_damaged_log(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The open read the log for its next snapshot before the domain replayed it; the
    refusal closed the handle, whose close kept a snapshot of the damaged records, which
    every later open trusted (the session then read as sound and took appends)."""
    monkeypatch.setattr(pg_sessions, "COMPACT_AT_CLOSE", 0)  # (any records since make a snapshot at close)
    build(url, n=4)
    sql(url, "DELETE FROM states")
    bogus = "sha256:" + "ab" * 32
    sql(url, "UPDATE log SET op = 'head', record = %s WHERE pos = 5", [json.dumps({"op": "head", "head": bogus})])
    with open_store(url) as st:
        for _ in range(2):
            with pytest.raises(SessionDamagedError, match="head move"):
                st.open("S")
    assert sql(url, "SELECT kind FROM states WHERE kind = 2") == []


def _damage_columns(url: str, case: str) -> None:
    if case == "op":  # an append's row says commit: a sweep keyed on the column skipped its entry
        sql(url, "UPDATE log SET op = 'commit' WHERE pos = 2")
    elif case == "hash":  # row 4's hash column names row 2's entry, its record its own
        sql(url, "UPDATE log SET hash = (SELECT hash FROM log WHERE pos = 2) WHERE pos = 4")
    else:  # row 2's content column names row 4's entry's content
        sql(url, "UPDATE log SET content = (SELECT content FROM log WHERE pos = 4) WHERE pos = 2")


@pytest.mark.parametrize("case", ["op", "hash", "content"])
def test_log_row_columns_that_disagree_with_the_record_are_found_fixed_and_never_trusted_by_a_sweep(
        url: str, case: str) -> None:
    """A log row's op, seq, hash and content columns index its record (and its entry's
    envelope): fsck names any that disagree (log-row; the content column was not checked),
    repair sets them to what the record and envelope say, and a sweep reads the record,
    never the columns: it refuses the store on op, seq or hash columns that disagree (as
    on a record that does not read) and reads each envelope for its content. Until session
    43 a sweep trusted them and deleted an entry's objects its log names."""
    build(url)
    sql(url, "UPDATE objects SET born = now() - interval '30 days'")  # written before the grace
    _damage_columns(url, case)
    with open_store(url) as st:
        assert "log-row" in codes(st)
        if case == "content":
            assert sweep(st).repack.dropped == 0  # (it reads the envelope, not the column)
        else:
            with pytest.raises(SweepRefusedError, match="log row"):
                sweep(st)
        report = repair_session(st, "S")
        assert report.indexes_fixed and not report.damaged, report.stale_indexes
        assert codes(st) == []
        assert sweep(st).repack.dropped == 0
        assert codes(st) == []


@pytest.mark.parametrize("case", ["same seq", "new seq", "seq spent"])
def test_a_repeated_append_row_is_damage_every_reader_refuses_and_repair_drops(url: str, case: str) -> None:
    """A log holds one append row of each entry and each sequence number (RFC 0002's
    reference schema keys its log on (session, seq) and (session, hash); no writer writes
    a repeat: a re-append is a no-op). A row copied in (the last append's or an earlier
    one's, with its number or a new one) or an append given a number spent before it is
    log-order damage: verify and fsck name it, every open and a sweep refuse the session,
    and repair drops the row. Until session 43 it went unreported and every open moved
    the head back to the repeated entry, where the next append continued."""
    ids = build(url, n=4)
    if case == "seq spent":  # row 6 (the append of entry 2) given entry 1's number
        record = json.loads(sql(url, "SELECT record FROM log WHERE pos = 6")[0][0])
        sql(url, "UPDATE log SET seq = 2, record = %s WHERE pos = 6", [json.dumps({**record, "seq": 2})])
    else:  # rows 10 and 11: a copy of row 4 (the append of entry 1, which moved the head) and a commit
        record = json.loads(sql(url, "SELECT record FROM log WHERE pos = 4")[0][0])
        if case == "new seq":
            record["seq"] = 5
        sql(url, "INSERT INTO log SELECT session, 10, op, %s, hash, content, %s FROM log WHERE pos = 4",
            [record["seq"], json.dumps(record)])
        sql(url, "INSERT INTO log SELECT session, 11, op, seq, hash, content, record FROM log WHERE pos = 9")
        sql(url, "UPDATE sessions SET last_pos = 11")
    with open_store(url) as st:
        assert "log-order" in codes(st)
        with pytest.raises(SessionDamagedError, match="second time|spent"):
            st.open("S")
        with pytest.raises(SessionDamagedError, match="second time|spent"):
            st.read("S")
        with pytest.raises(SweepRefusedError, match="second time|spent"):
            sweep(st)
        report = repair_session(st, "S")
        assert report.repaired
        assert codes(st) == []
        s = st.open("S")
        assert set(s.log_order) == set(ids)
        if case != "seq spent":
            assert s.head == ids[-1]
        s.append(msg("after"), durable=True)
        s.close()


def test_a_parked_handle_is_not_resumed_after_another_writer_held_the_session(url):
    """A parked handle (the server's, between two exchanges) resumes only if no one held
    the session since: a repair bumps the fence and may give the log back at its length,
    rewritten, and the handle's state would then append onto a log it does not describe."""
    build(url)
    with open_store(url) as st:
        s = st.session("S")
        assert s.exchange_park()
        assert s.exchange_resume()  # nothing happened meanwhile
        assert s.exchange_park()
        with open_store(url) as other:
            other.session("S").close()  # another writer's hold (as a repair's), no row written
        assert not s.exchange_resume()
        s.close()
        with st.session("S") as again:
            again.append(msg("after"), durable=True)
