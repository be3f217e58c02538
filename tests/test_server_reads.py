"""The server's long reads do not hold its lock for their whole length.

The server does its store work under one lock (`ServerState.lock`). A path read of a
long session is walked and sent a piece at a time, each piece its own hold of the lock,
so other sessions' writers get in between; a log read makes its lines outside the lock.
A failure once a path's stream has begun is its last frame (RFC 0003, Streams). These
run the application in this process (starlette's test client) so the lock can be
watched: which hold of it each store read happened in.
"""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path

import httpx
import pytest

pytest.importorskip("starlette")

with warnings.catch_warnings():  # this starlette asks for another httpx package; this one serves
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from agentsession_cas import Header
from agentsession_cas.errors import StoreError
from agentsession_cas.exchange.http_client import HttpTransport
from agentsession_cas.server import app as server_app
from agentsession_cas.server.app import ServerState, create_app
from agentsession_cas.store import Store
from agentsession_cas.store.url import open_store

ENTRIES = 700  # three pieces of a path read (256 entries each)


class WatchedLock:
    """A re-entrant lock that numbers its outermost holds and says whether it is held."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.depth = 0
        self.holds = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            if self.depth == 0:
                self.holds += 1
            self.depth += 1
        return got

    def release(self) -> None:
        self.depth -= 1
        self._lock.release()

    def __enter__(self) -> WatchedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@pytest.fixture
def served(tmp_path: Path):
    store = Store.init(str(tmp_path / "store"), sync="never")
    s = store.create(Header.new("long", created_at="2026-09-17T12:00:00Z"))
    for n in range(ENTRIES):
        s.append({"type": "item", "ts": f"2026-09-17T12:{n // 60 % 60:02d}:{n % 60:02d}Z",
                  "item": {"type": "message", "role": "user", "content": f"line {n}"}})
    s.commit()
    ids = list(s.own)
    store.close()
    state = ServerState(open_store(str(tmp_path / "store")), None)
    lock = WatchedLock()
    state.lock = lock  # type: ignore[assignment]
    with TestClient(create_app(state)) as client:
        yield client, state, lock, ids
    state.store.close()


def frames(response) -> list[dict]:
    assert response.status_code == 200, response.text
    return [json.loads(x) for x in response.text.splitlines() if x.strip()]


def test_a_long_path_is_read_a_piece_at_a_time_each_its_own_hold_of_the_lock(served, monkeypatch):
    client, state, lock, ids = served
    reads: list[tuple[int, int]] = []  # (hold, entries read) of each bulk envelope read
    real = state.store.objects.get_many

    def get_many(space, names):
        assert lock.depth > 0, "a store read outside the server's lock"
        if space == "entries":
            reads.append((lock.holds, len(names)))
        return real(space, names)

    monkeypatch.setattr(state.store.objects, "get_many", get_many)
    got = frames(client.get("/v1/sessions/long/path"))
    assert got[-1] == {"end": True, "count": ENTRIES, "incarnation": got[0]["incarnation"]}
    assert [f["entry"] for f in got[:-1]] == ids
    assert got[0]["head"] == ids[-1] and got[0]["contents"] == "all"
    assert [n for _, n in reads] == [256, 256, ENTRIES - 512]
    holds = [h for h, _ in reads]
    assert len(set(holds)) == len(holds), f"two pieces were read in one hold of the lock: {reads}"


def test_a_failure_after_the_path_stream_began_is_its_last_frame(served, monkeypatch):
    client, state, lock, ids = served
    real = state.store.objects.get_many
    calls = {"entries": 0}

    def get_many(space, names):
        if space == "entries":
            calls["entries"] += 1
            if calls["entries"] == 2:
                raise StoreError("the second piece's objects are gone (forced)")
        return real(space, names)

    monkeypatch.setattr(state.store.objects, "get_many", get_many)
    got = frames(client.get("/v1/sessions/long/path"))
    assert [f["entry"] for f in got[:-1]] == ids[:256]
    assert "end" not in got[-1]
    assert got[-1]["error"]["code"] == "store_fault" and "forced" in got[-1]["error"]["detail"], got[-1]
    # the project's client raises it rather than taking the first piece for the path
    calls["entries"] = 0
    transport = HttpTransport("http://testserver/", token="x")

    def relay(req: httpx.Request) -> httpx.Response:
        r = client.request(req.method, req.url.raw_path.decode(), headers=dict(req.headers))
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    transport._http = httpx.Client(base_url=transport.url + "v1", transport=httpx.MockTransport(relay))
    with pytest.raises(StoreError, match="forced"):
        transport.ndjson("/sessions/long/path")


def test_a_log_read_makes_its_lines_outside_the_lock(served, monkeypatch):
    client, state, lock, ids = served
    held: list[int] = []
    real = server_app.log_line

    def log_line(*args, **kw):
        held.append(lock.depth)
        return real(*args, **kw)

    monkeypatch.setattr(server_app, "log_line", log_line)
    got = frames(client.get("/v1/sessions/long/log"))
    assert [f["entry"] for f in got if "entry" in f] == ids
    assert got[-1]["end"] is True
    assert held and set(held) == {0}, "a log's lines were made under the server's lock"


def test_a_held_objects_reach_asks_the_sessions_holding_it_not_every_session(tmp_path, monkeypatch):
    """Whether a caller may read an object is asked first of the sessions last seen
    holding it (each brought up to date), so a GET of a held object in a store of many
    sessions lists none of them; an object no such session holds still looks at every
    session the caller may read (one created meanwhile, say), and a session deleted
    no longer makes its objects reachable."""
    from agentsession_cas.server.auth import LOCAL, Principal

    store = Store.init(tmp_path / "store")
    ids = {}
    for sid in ("a-1", "a-2", "b-1"):
        s = store.create(Header.new(sid, created_at="2026-09-17T12:00:00Z"))
        ids[sid] = s.append({"type": "item", "ts": "2026-09-17T12:00:00Z",
                             "item": {"type": "message", "role": "user", "content": sid}}).id
        s.close()
    state = ServerState(store, None)
    listed = []
    real_list = store.list
    monkeypatch.setattr(store, "list", lambda *a, **k: (listed.append(1), real_list(*a, **k))[1])
    assert state.reachable(LOCAL, "entries", ids["a-2"])  # the first question looks at every session
    listed.clear()
    assert state.reachable(LOCAL, "entries", ids["b-1"]) and state.reachable(LOCAL, "entries", ids["a-1"])
    assert listed == []
    team_a = Principal("team-a", frozenset({"read"}), "a-")
    assert not state.reachable(team_a, "entries", ids["b-1"])  # held, but by a session it may not read
    # A session created since the last look: its objects are found by looking at every session.
    s = store.create(Header.new("a-3", created_at="2026-09-17T12:00:00Z"))
    new = s.append({"type": "item", "ts": "2026-09-17T12:00:00Z",
                    "item": {"type": "message", "role": "user", "content": "new"}}).id
    s.close()
    assert state.reachable(team_a, "entries", new)
    # Deleted: its holder hint is asked again and no longer answers.
    state.session("a-1").close()
    store.delete("a-1")
    state.reach.forget("a-1")
    assert not state.reachable(LOCAL, "entries", ids["a-1"])
    store.close()


def test_a_closure_pushed_again_proves_only_what_the_session_lacks(tmp_path, monkeypatch):
    """A push naming entries the pushed session already holds here (a sender that lost
    what it knew of this server sends its whole closure) proves only the new ones: the
    held ones are reachable through that very session, so their envelopes are not read."""
    from agentsession_cas.exchange import operations as ex

    src = Store.init(tmp_path / "src")
    s = src.create(Header.new("s1", created_at="2026-09-17T12:00:00Z"))
    for i in range(20):
        s.append({"type": "item", "ts": "2026-09-17T12:00:00Z", "item": {"type": "message", "role": "user", "content": f"{i}"}})
    s.close()
    state = ServerState(Store.init(tmp_path / "srv"), None)
    with TestClient(create_app(state), base_url="http://testserver/v1") as client:
        def transport() -> HttpTransport:
            t = HttpTransport("http://testserver/")
            t._http = client
            return t

        assert ex.push(src, transport(), "s1").entries == 20
        s = src.session("s1")
        new = s.append({"type": "item", "ts": "2026-09-17T12:00:00Z", "item": {"type": "message", "role": "user", "content": "new"}}).id
        s.close()
        read: list[str] = []
        real_get = state.store.objects.get
        monkeypatch.setattr(state.store.objects, "get",
                            lambda space, name: (read.append(name) if space == "entries" else None, real_get(space, name))[1])
        prove = server_app.Api._prove
        monkeypatch.setattr(server_app.Api, "_prove",
                            lambda self, *args: (read.clear(), prove(self, *args), read.append("end"))[1])
        monkeypatch.setattr(ex, "Remembered", lambda *a: type("Forgot", (), {"get": lambda *a: None, "set": lambda *a: None,
                                                                              "get_ref": lambda *a: None, "set_ref": lambda *a: None})())
        # A sender that remembers nothing of this server reads what its log holds first, and
        # sends only what it lacks: the new entry's two objects.
        result = ex.push(src, transport(), "s1")
        assert not result.complete and result.entries == 1 and result.objects == 2 and result.head_after == new
        assert read[: read.index("end") + 1] == [new, "end"]
        # One that sends its whole closure anyway (a client that does not look first) has
        # only the new entry proven: its envelope alone is read to prove it.
        s = src.session("s1")
        newer = s.append({"type": "item", "ts": "2026-09-17T12:00:00Z", "item": {"type": "message", "role": "user", "content": "newer"}}).id
        s.close()
        monkeypatch.setattr(ex, "_held_there", lambda *a: 0)
        result = ex.push(src, transport(), "s1")
        assert result.complete and result.entries == 1 and result.head_after == newer
        assert read[: read.index("end") + 1] == [newer, "end"]
    src.close()
    state.store.close()
