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
from agentsession_cas.errors import SessionDamagedError
from agentsession_cas.maintenance.fsck import fsck
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


def test_a_sweep_keeps_the_prefix_of_a_fork_committed_while_it_ran_after_its_origin_went(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fork read its origin's prefix; the origin is deleted before the sweep reads the
    logs, and the fork commits after: no log read names the prefix, and the holds row the
    sweep read came before the fork's. Each delete batch reads the holds again under the
    barrier (it deleted the prefix: the fork's base was gone)."""
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
