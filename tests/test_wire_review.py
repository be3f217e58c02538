"""What session 43's review of the wire found (client, server and exchange over RFC 0003),
each checked here, in process (Starlette's TestClient behind an httpx MockTransport, or a
few lines of socket server where a silence or an endless body must be forced):

1. a ref update was not replayed under its Idempotency-Key: the client's own move, its
   answer lost and the update sent again, came back as ``ref_moved``;
2. a fetch of one session could admit another, served in its place, and report success;
3. the client read a push's answer by this server's extra members (``outcome``,
   ``previous``), not RFC 0003's ``moved``/``forced``: a refused head went unreported;
4. a fork's path read at its head crossed the base into an origin the caller may not read;
5. a follow's stream had no read timeout: a silent server hung the follower for good;
6. an object GET and an NDJSON answer were read whole, with no bound.
"""

from __future__ import annotations

import json
import socket
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette")

with warnings.catch_warnings():  # this starlette asks for another httpx package; this one serves
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from agentsession_cas import Header
from agentsession_cas.errors import TransportError
from agentsession_cas.exchange import fetch, http_client, push
from agentsession_cas.exchange.following import follow_remote
from agentsession_cas.exchange.http_client import HttpTransport
from agentsession_cas.exchange.local import LocalTransport
from agentsession_cas.server.app import Limits, ServerState, create_app
from agentsession_cas.server.auth import load_tokens
from agentsession_cas.store import Store
from server_helpers import TOKENS, token_file

TS = "2026-09-17T12:00:00Z"


def user(text: str) -> dict[str, Any]:
    return {"type": "item", "ts": TS, "item": {"type": "message", "role": "user", "content": text}}


def recorded(directory: Path, sid: str, text: str) -> Store:
    st = Store.init(directory, sync="never")
    s = st.create(Header.new(sid, created_at=TS))
    s.append(user(text))
    s.commit()
    return st


@pytest.fixture
def app(tmp_path: Path) -> Iterator[TestClient]:
    state = ServerState(Store.init(tmp_path / "served", sync="never"), None, Limits(max_stream_age_s=0))
    with TestClient(create_app(state)) as client:
        yield client
    state.store.close()


def through(app: TestClient, route: Any = None) -> HttpTransport:
    """A client whose requests reach ``app`` through ``route(request)`` (default: as sent),
    which may rewrite the request, drop it or change the answer."""

    def send(req: httpx.Request) -> httpx.Response:
        r = app.request(req.method, req.url.raw_path.decode(), content=req.content, headers=dict(req.headers))
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    t = HttpTransport("http://store.example/", token="x")
    t.sleep = lambda s: None
    t._http = httpx.Client(base_url=t.url + "v1", transport=httpx.MockTransport(
        (lambda req: route(req, send)) if route is not None else send))
    return t


class SocketServer:
    """A loopback HTTP/1.1 server answering each request with ``answer(path, conn)``."""

    def __init__(self, answer: Any):
        self.answer = answer
        self.paths: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                data = b""
                while b"\r\n\r\n" not in data:
                    got = conn.recv(65536)
                    if not got:
                        return
                    data += got
                path = data.split(b" ")[1].decode()
                self.paths.append(path)
                if not self.answer(path, conn, self.stop):
                    return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def send_json(conn: socket.socket, body: Any, ctype: str = "application/json") -> bool:
    data = json.dumps(body).encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (ctype.encode(), len(data)) + data)
    return True


# -- 1. a ref update replayed under its key ---------------------------------------------------


def test_a_ref_update_is_replayed_under_its_key_and_a_lost_answer_is_no_refusal(app):
    app.post("/v1/sessions", json=Header.new("s1", created_at=TS).data)
    key = {"Idempotency-Key": "k-0001"}
    first = app.put("/v1/refs/chat/main", json={"expected": None, "next": "s1"}, headers=key)
    again = app.put("/v1/refs/chat/main", json={"expected": None, "next": "s1"}, headers=key)
    assert first.status_code == 200
    assert again.status_code == 200 and again.headers["idempotent-replay"] == "true"
    assert again.content == first.content
    # A read is never replayed, whatever it carries: it reads the ref as it is now.
    assert app.get("/v1/refs/chat/main", headers={"Idempotency-Key": "k-read"}).json()["target"]["session"] == "s1"
    app.put("/v1/refs/chat/main", json={"expected": "s1", "next": None})
    assert app.get("/v1/refs/chat/main", headers={"Idempotency-Key": "k-read"}).status_code == 404

    # The client as the HTTP store sends it (keyed), its first answer lost on the way back.
    lost = []

    def route(req: httpx.Request, send: Any) -> httpx.Response:
        answer = send(req)
        if req.method == "PUT" and not lost:
            lost.append(answer)
            raise httpx.ReadError("the connection dropped after the server answered")
        return answer

    t = through(app, route)
    t.request("PUT", "/refs/chat/other", safe=False, keyed=True, json={"expected": None, "next": "s1"})
    assert len(lost) == 1 and lost[0].status_code == 200
    assert app.get("/v1/refs/chat/other").json()["target"]["session"] == "s1"


# -- 2. a fetch answered about another session -------------------------------------------------


def test_a_fetch_answered_about_another_session_is_refused_before_anything_is_written(tmp_path, app):
    src = recorded(tmp_path / "src", "s2", "s2's turn")
    push(src, LocalTransport(str(tmp_path / "served")), "s2")

    class Hostile(LocalTransport):
        """A remote that answers about s2 when asked about s1."""

        def session_view(self, session_id: str) -> Any:
            return super().session_view("s2")

        def get_objects(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("nothing is read of a session refused")

    local = Store.init(tmp_path / "local", sync="never")
    with pytest.raises(TransportError, match="answered about session 's2' when asked for s1"):
        fetch(local, Hostile(str(tmp_path / "served")), "s1")
    assert local.list() == []

    # Over HTTP: a router that sends /sessions/s1... to /sessions/s2...
    def route(req: httpx.Request, send: Any) -> httpx.Response:
        path = req.url.raw_path.decode().replace("/sessions/s1", "/sessions/s2")
        return send(httpx.Request(req.method, "http://store.example" + path, content=req.content,
                                  headers=req.headers))

    local2 = Store.init(tmp_path / "local2", sync="never")
    with pytest.raises(TransportError, match="answered about session 's2' when asked for s1"):
        fetch(local2, through(app, route), "s1")
    assert local2.list() == []
    # The same remote fetched as what it is holds s2.
    assert fetch(local2, through(app, route), "s2").entries == 1
    # The HTTP client's own reads (a store over HTTP reads a header so) refuse it too,
    # before the other session's incarnation is remembered as s1's.
    t = through(app, route)
    for read in (t.session_header, t.session_view):
        with pytest.raises(TransportError, match="answered about session 's2' when asked for s1"):
            read("s1")
        assert "s1" not in t._seen


# -- 3. a push's answer read by RFC 0003's members -------------------------------------------


def rfc_only(req: httpx.Request, send: Any) -> httpx.Response:
    """The server's answer to a push cut down to the members RFC 0003 names."""
    r = send(req)
    if req.url.path.endswith("/push") and r.status_code == 200:
        j = r.json()
        j["head"] = {k: j["head"][k] for k in ("moved", "forced", "current", "why")}
        body = {k: j[k] for k in ("admitted", "created", "head", "mark", "refs")}
        return httpx.Response(200, headers={"content-type": "application/json"}, content=json.dumps(body).encode())
    return r


def test_a_push_is_read_by_the_rfcs_members_so_a_refused_head_is_reported(tmp_path, app):
    a, b = recorded(tmp_path / "a", "s1", "line A"), recorded(tmp_path / "b", "s1", "line B")
    first = push(a, through(app, rfc_only), "s1")
    assert first.outcome == "fast-forward" and first.head_moved and not first.refused
    assert push(a, through(app, rfc_only), "s1").outcome == "unchanged"
    # B's line is another: its compare-and-swap is refused (moved: false), and said so.
    second = push(b, through(app, rfc_only), "s1")
    assert second.outcome == "refused" and second.refused and not second.head_moved
    assert second.head_after == first.head_after and second.head_before == first.head_after
    forced = push(b, through(app, rfc_only), "s1", force=True)
    assert forced.outcome == "forced" and forced.head_after == b.session("s1").head


def test_a_push_answer_without_the_rfcs_moved_is_no_push_answer(tmp_path, app):
    a = recorded(tmp_path / "a", "s1", "line A")

    def bare(req: httpx.Request, send: Any) -> httpx.Response:
        r = send(req)
        if req.url.path.endswith("/push") and r.status_code == 200:
            j = r.json()
            del j["head"]["moved"]  # the extras alone are not an RFC 0003 answer
            return httpx.Response(200, headers={"content-type": "application/json"}, content=json.dumps(j).encode())
        return r

    with pytest.raises(TransportError, match="is not a push's answer"):
        push(a, through(app, bare), "s1")


# -- 4. a fork's path across an origin the caller may not read ------------------------------


def h(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[who][0]}"}


def write(c: TestClient, sid: str, text: str, who: str = "all", **fork: Any) -> str:
    """Session ``sid`` created (a fork where ``fork`` says) and one user turn appended, as ``who``."""
    assert c.post("/v1/sessions", json=Header.new(sid, created_at=TS, **fork).data, headers=h(who)).status_code == 201
    tok = c.post(f"/v1/sessions/{sid}/lease", json={"ttl_ms": 60000}, headers=h(who)).json()["token"]
    r = c.post(f"/v1/sessions/{sid}/entries", content=json.dumps(user(text)).encode(), params={"commit": "true"},
               headers={**h(who), "Lease-Token": str(tok)})
    assert r.status_code == 200, r.text
    return str(r.json()["results"][0]["id"])


def test_a_forks_path_is_no_entry_wherever_it_crosses_into_an_origin_the_caller_may_not_read(tmp_path):
    state = ServerState(Store.init(tmp_path / "st", sync="never"), load_tokens(token_file(tmp_path)), Limits(max_stream_age_s=0))

    with TestClient(create_app(state)) as c:
        base = write(c, "b-secret", "TEAM B SECRET PLAN", "team-b")
        own = write(c, "a-fork", "a's own turn", base=base, parent_session="b-secret")  # an admin's fork
        # A fork of that fork, in a's space: its prefix crosses a-fork into b-secret too.
        write(c, "a-fork2", "a's second turn", base=own, parent_session="a-fork")
        mine = write(c, "a-mine", "a's first", "team-a")
        write(c, "a-mine-fork", "a's fork of its own", "team-a", base=mine, parent_session="a-mine")
        for sid in ("a-fork", "a-fork2"):
            for params in ({}, {"leaf": base}, {"contents": "none"}):
                r = c.get(f"/v1/sessions/{sid}/path", params=params, headers=h("team-a"))
                assert r.status_code == 404 and r.json()["code"] == "no_entry", (sid, params, r.text)
                assert "TEAM B" not in r.text
            assert c.head(f"/v1/sessions/{sid}/path", headers=h("team-a")).status_code == 404
        # Its own fork of its own session reads whole; the admin reads the others whole.
        r = c.get("/v1/sessions/a-mine-fork/path", headers=h("team-a"))
        assert r.status_code == 200 and r.text.count('"entry"') == 2
        r = c.get("/v1/sessions/a-fork2/path", headers=h("all"))
        assert r.status_code == 200 and "TEAM B SECRET PLAN" in r.text and r.text.count('"entry"') == 3
    state.store.close()


def test_a_forks_named_origin_must_hold_its_base(tmp_path):
    """``parent_session`` is provenance the writer states: a fork whose header names a
    session the caller may read, but whose base that session does not hold (it lies on
    another tenant's prefix), is no_entry across the base, never its origin's word taken;
    a same-tenant fork, and one with no ``parent_session`` (the store names it), read."""
    state = ServerState(Store.init(tmp_path / "st", sync="never"), load_tokens(token_file(tmp_path)), Limits(max_stream_age_s=0))

    with TestClient(create_app(state)) as c:
        secret = write(c, "b-secret", "TEAM B SECRET PLAN", "team-b")
        write(c, "a-fork", "a's own turn", base=secret, parent_session="b-secret")  # the admin's fork
        mine = write(c, "a-mine", "a's first", "team-a")
        r = c.post("/v1/sessions", json=Header.new("a-sneak", created_at=TS, base=secret, parent_session="a-mine").data,
                   headers=h("team-a"))
        assert r.status_code == 201, r.text
        r = c.get("/v1/sessions/a-sneak/path", headers=h("team-a"))
        assert r.status_code == 404 and "TEAM B SECRET PLAN" not in r.text, r.text
        write(c, "a-f", "a's fork turn", "team-a", base=mine, parent_session="a-mine")
        write(c, "a-g", "a's other fork turn", "team-a", base=mine)
        for sid in ("a-f", "a-g"):
            r = c.get(f"/v1/sessions/{sid}/path", headers=h("team-a"))
            assert r.status_code == 200 and r.text.count('"entry"') == 2, (sid, r.text)
    state.store.close()


def test_a_forks_origin_named_twice_absent_or_gone_vouches_for_nothing(tmp_path):
    """An origin the chain names twice (the fork itself, a cycle), one never created, or
    one deleted cannot vouch for the prefix the fork crosses: a scoped caller gets
    no_entry (each read another tenant's prefix); a same-tenant fork of a sound origin
    reads whole."""
    state = ServerState(Store.init(tmp_path / "st", sync="never"), load_tokens(token_file(tmp_path)), Limits(max_stream_age_s=0))
    with TestClient(create_app(state)) as c:
        secret = write(c, "b-secret", "TEAM B SECRET PLAN", "team-b")
        write(c, "a-fork", "a's own turn", base=secret, parent_session="b-secret")  # the admin's fork
        for sid, named in (("a-self", "a-self"), ("a-x", "a-y"), ("a-y", "a-x"), ("a-ghost", "a-never-was")):
            r = c.post("/v1/sessions", json=Header.new(sid, created_at=TS, base=secret, parent_session=named).data,
                       headers=h("team-a"))
            assert r.status_code == 201, r.text
        for sid in ("a-self", "a-x", "a-ghost"):
            r = c.get(f"/v1/sessions/{sid}/path", headers=h("team-a"))
            assert r.status_code == 404 and "TEAM B SECRET PLAN" not in r.text, (sid, r.text)
        mine = write(c, "a-orig", "a's own", "team-a")
        write(c, "a-fk", "a's fork turn", "team-a", base=mine, parent_session="a-orig")
        assert c.get("/v1/sessions/a-fk/path", headers=h("team-a")).status_code == 200
    state.store.close()


# -- 5. a silent follow stream ----------------------------------------------------------------


def test_a_follow_stream_gone_silent_is_dropped_and_opened_again(monkeypatch):
    """A server (or a half-open connection) that sends a follow's headers and then nothing,
    not even the keep-alive due every 15 s: past the read timeout the stream counts as
    dropped and is opened again, as the retry rules say, and the follower is told at the
    end; never a follower blocked for good. The timeout is set short for the test."""

    def answer(path: str, conn: socket.socket, stop: threading.Event) -> bool:
        if path == "/v1/":
            return send_json(conn, {"features": {}, "limits": {}})
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
        stop.wait()  # never another byte
        return False

    server = SocketServer(answer)
    t = HttpTransport(server.url, token="x", retry_wait=5)
    t.sleep = lambda s: None
    t.follow_read_timeout = 0.2
    outcome: list[BaseException] = []

    def follower() -> None:
        try:
            next(follow_remote(t, "s1"))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=follower, daemon=True)
    thread.start()
    thread.join(20)
    try:
        assert not thread.is_alive(), "the follower is still blocked on a silent stream"
        assert len(outcome) == 1 and isinstance(outcome[0], TransportError), outcome
        assert "dropped" in str(outcome[0]) and f"given up after {http_client.RETRIES} retries" in str(outcome[0])
        assert server.paths.count(server.paths[-1]) == http_client.RETRIES + 1
    finally:
        server.close()
        t.close()


def test_a_follows_read_timeout_is_a_few_keep_alive_intervals():
    assert 30 <= http_client.FOLLOW_READ_TIMEOUT_S <= 90  # 15 s keep-alives (RFC 0003): a few of them
    assert HttpTransport("http://store.example/", token="x").follow_read_timeout == http_client.FOLLOW_READ_TIMEOUT_S


# -- 6. an object GET and an NDJSON answer, bounded -------------------------------------------


def endless(pulled: list[int], chunk: bytes, count: int) -> Iterator[bytes]:
    for _ in range(count):
        pulled[0] += 1
        yield chunk


def test_an_object_get_is_streamed_and_refused_past_the_servers_object_limit():
    pulled = [0]

    def send(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/":
            return httpx.Response(200, json={"features": {}, "limits": {"max_object_bytes": 256 * 1024}})
        return httpx.Response(200, headers={"content-type": "application/octet-stream"},
                              content=endless(pulled, b"x" * 65536, 64))  # 4 MiB for one object

    t = HttpTransport("http://store.example/", token="x")
    t._http = httpx.Client(base_url=t.url + "v1", transport=httpx.MockTransport(send))
    name = "sha256:" + "ab" * 32
    with pytest.raises(TransportError, match="answered more than 262144 bytes"):
        list(t.get_objects([("entries", name)]))
    assert pulled[0] <= 5  # stopped just past the limit, the rest never read
    # The client's own cap holds when the server publishes none, or a larger one.
    t._caps = {"features": {}, "limits": {}}
    t.max_object_bytes = 100_000
    with pytest.raises(TransportError, match="answered more than 100000 bytes"):
        t.get_object("contents", name)


def test_an_ndjson_answer_is_read_a_line_at_a_time_and_refuses_a_line_past_its_bound(monkeypatch):
    monkeypatch.setattr(http_client, "_LINE_SLACK", 1000, raising=False)
    pulled = [0]
    frames = b'{"id":"s1"}\n{"id":"s2"}\n{"end":true}\n'

    def send(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/sessions":
            return httpx.Response(200, headers={"content-type": "application/x-ndjson"},
                                  content=iter([frames[:5], frames[5:]]))
        return httpx.Response(200, headers={"content-type": "application/x-ndjson"},
                              content=endless(pulled, b"x" * 4096, 256))  # one line of 1 MiB, no end

    t = HttpTransport("http://store.example/", token="x")
    t._http = httpx.Client(base_url=t.url + "v1", transport=httpx.MockTransport(send))
    t.max_object_bytes = 1000
    assert [f.get("id") for f in t.ndjson("/sessions")] == ["s1", "s2", None]
    with pytest.raises(TransportError, match="a line passes 3000 bytes"):
        t.ndjson("/sessions/s1/log")
    assert pulled[0] <= 2
