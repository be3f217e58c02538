"""A hunt on the RFC 0003 server and its client (session 40, F6): hostile and malformed
requests, and a server answering garbage. Each test names what it found broken; the
server's answers must be well-formed problems with the table's status and code, never
a 500, and must change nothing; the client must raise this library's errors, never a
parser's or httpx's, and leave nothing half-written.

One real server serves the module (``hunt``); the client's tests talk to a small HTTP
server in a thread that answers what each test asks (``garbage``).
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from agentsession_cas import Header
from agentsession_cas.errors import PROTOCOL_CODES, AgentSessionError, TransportError
from agentsession_cas.exchange import fetch
from agentsession_cas.exchange.following import follow_remote
from agentsession_cas.exchange.http_client import HttpTransport
from agentsession_cas.exchange.wire import FrameReader
from agentsession_cas.store import Store
from server_helpers import ServerProcess, token_file
from test_server import append, create, lease, lines, problem, recorded

TS = "2026-09-17T12:00:00Z"


@pytest.fixture(scope="module")
def hunt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("hunt")
    Store.init(root / "served").close()
    with ServerProcess(root / "served", auth=token_file(root), extra=("--sync", "never")) as server:
        yield server


def header(sid: str, **extra: Any) -> dict[str, Any]:
    return dict(Header.new(sid, created_at=TS).data, **extra)


def state(c: httpx.Client) -> tuple[Any, ...]:
    """What the store holds, as a caller sees it: each session's facts and every ref."""
    sessions = []
    for row in lines(c.get("/v1/sessions"))[:-1]:
        facts = c.get(f"/v1/sessions/{row['id']}").json()
        sessions.append((row["id"], facts["head"], facts["length"], facts["mark"], facts["leased"]))
    refs = [(r["name"], r["target"]["session"]) for r in lines(c.get("/v1/refs"))[:-1]]
    return tuple(sessions), tuple(refs)


def refused(response: httpx.Response) -> dict[str, Any]:
    """A well-formed refusal: a 4xx problem body whose code is the protocol's and whose
    status is the answer's (501 for a feature this server lacks is a refusal too)."""
    assert 400 <= response.status_code < 500 or response.status_code == 501, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/problem+json", response.text
    body = response.json()
    assert body["code"] in PROTOCOL_CODES and body["status"] == response.status_code and body["detail"], body
    return body


# -- hostile bodies ---------------------------------------------------------------------------

#: Bodies no route takes: past the nesting bound, NaN and infinities, a repeated member,
#: a number past binary64, bytes that are no UTF-8, and JSON of the wrong shape.
HOSTILE = {
    "deep": b"[" * 100_000,
    "deep object": b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
    "NaN": b'{"x": NaN}',
    "Infinity": b'{"x": -Infinity}',
    "repeated member": b'{"id": "dup-1", "id": "dup-2", "created_at": "2026-09-17T12:00:00Z"}',
    "1e400": b'{"x": 1e400}',
    "not UTF-8": b"\xff\xfe{}",
    "a list": b"[1, 2]",
    "a number": b"5",
    "cut": b'{"header": {',
}


def test_hostile_json_bodies_are_refused_and_change_nothing(hunt):
    """A body nested 100,000 deep was a RecursionError inside the parser (500 on every
    JSON route); NaN, infinities and 1e400 in a created header were the store's own
    fault (500), and a repeated "id" created the session named last."""
    with hunt.client("all") as c:
        recorded(c, "hostile-1", 1)
        create(c, "hostile-2")
        token = lease(c, "hostile-2")["token"]
        before = state(c)
        routes: list[tuple[str, str, dict[str, str]]] = [
            ("POST", "/v1/sessions", {}),
            ("POST", "/v1/sessions?lease_ttl_ms=60000", {}),
            ("POST", "/v1/objects/missing", {}),
            ("POST", "/v1/objects/read", {}),
            ("POST", "/v1/sessions/hostile-1/push", {}),
            ("POST", "/v1/sessions/hostile-1/handover", {}),
            ("POST", "/v1/sessions/hostile-1/record", {}),
            ("POST", "/v1/sessions/hostile-1/lease", {}),
            ("PUT", "/v1/sessions/hostile-2/lease", {"Lease-ID": "x"}),
            ("PUT", "/v1/sessions/hostile-2/head", {"Lease-Token": str(token)}),
            ("PUT", "/v1/refs/hostile/ref", {}),
        ]
        for method, path, headers in routes:
            for what, body in HOSTILE.items():
                r = c.request(method, path, content=body, headers=headers)
                assert r.status_code != 500, (method, path, what, r.text)
                refused(r)
        # An append's lines are entries: each hostile line stops the batch, nothing lands.
        for what, body in HOSTILE.items():
            r = c.post("/v1/sessions/hostile-2/entries", content=body, headers={"Lease-Token": str(token)})
            assert r.status_code == 200 and r.json()["results"] == [] and r.json()["stopped"]["index"] == 0, (what, r.text)
        assert state(c) == before
        problem(c.get("/v1/sessions/dup-1"), 404, "no_session")
        problem(c.get("/v1/sessions/dup-2"), 404, "no_session")


def test_a_header_that_is_not_i_json_is_bad_entry(hunt):
    """A whole number past 2**53 in a header (I-JSON's bound) was refused by the store as
    its own fault, a 500, on a create and on a push alike."""
    big = header("big-1", x=12345678901234567890123)
    with hunt.client("all") as c:
        problem(c.post("/v1/sessions", json=big), 422, "bad_entry")
        r = c.post("/v1/sessions/big-1/push", json={"header": big, "entries": [], "prefix": [],
                                                   "head": {"expected": None, "to": None}, "mark": "mirror"})
        problem(r, 422, "bad_entry")
        problem(c.get("/v1/sessions/big-1"), 404, "no_session")


def test_whole_numbers_in_a_query_are_ascii_digits(hunt):
    """'\u00b2'.isdigit() is true and int() refuses it: ``limit=\u00b2`` was a 500, and
    ``lease_ttl_ms=\u00b2`` (or 5,000 digits) a 500 after the session had been created,
    unleased. A lease_ttl_ms of 0 made a lease of 1 ms, where an acquire refuses 0."""
    with hunt.client("all") as c:
        problem(c.get("/v1/sessions", params={"limit": "\u00b2"}), 400, "store_fault")
        for ttl in ("\u00b2", "9" * 5000, "0", "-1", "1.5"):
            problem(c.post("/v1/sessions", params={"lease_ttl_ms": ttl}, json=header("ttl-1")), 400, "store_fault")
            problem(c.get("/v1/sessions/ttl-1"), 404, "no_session")
        assert c.post("/v1/sessions", params={"lease_ttl_ms": "60000"}, json=header("ttl-1")).status_code == 201


def test_a_lease_id_of_any_bytes_is_lease_lost(hunt):
    """secrets.compare_digest refuses a str holding anything but ASCII: a Lease-ID header
    of other bytes made renew and release answer 500."""
    with hunt.client("all") as c:
        create(c, "lid-1")
        held = lease(c, "lid-1")
        for method in ("PUT", "DELETE"):
            problem(c.request(method, "/v1/sessions/lid-1/lease", headers={"Lease-ID": "\u00e9\u00e8".encode()}),
                    409, "lease_lost")
        assert c.put("/v1/sessions/lid-1/lease", headers={"Lease-ID": held["lease_id"]}).status_code == 200


def test_a_renewal_refuses_a_ttl_it_cannot_take(hunt):
    """An acquire refuses a ttl_ms that is no positive whole number; a renewal ignored a
    string and took 0 or less as a lease of 1 ms, which ended it at once."""
    with hunt.client("all") as c:
        create(c, "renew-1")
        held = lease(c, "renew-1", ttl_ms=60_000)
        for ttl in ("60000", -5, 0, 1.5, True, None):
            r = c.put("/v1/sessions/renew-1/lease", headers={"Lease-ID": held["lease_id"]}, json={"ttl_ms": ttl})
            problem(r, 400, "store_fault")
        assert c.get("/v1/sessions/renew-1").json()["leased"] is True
        r = c.put("/v1/sessions/renew-1/lease", headers={"Lease-ID": held["lease_id"]}, json={"ttl_ms": 30_000})
        assert r.status_code == 200 and r.json()["ttl_ms"] == 30_000


def _push(sid: str, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"header": header(sid), "entries": [], "prefix": [],
                            "head": {"expected": None, "to": None}, "mark": "mirror"}
    body.update(over)
    return body


def test_a_push_of_the_wrong_shape_is_refused_whole(hunt):
    """A push whose ``refs`` was no list was a 500; a ref with no name (or a name that is
    a number) was pushed as the ref "None" (or "5"); ``"force": "false"`` was a force
    (``bool("false")``), and ``"complete": "no"`` complete. Each is refused before
    anything lands."""
    cases = [
        (_push("shape-1", refs=5), 400, "store_fault"),
        (_push("shape-1", refs="abc"), 400, "store_fault"),
        (_push("shape-1", refs=[{"next": "shape-1", "expected": None}]), 400, "ref_name"),
        (_push("shape-1", refs=[{"name": 5, "next": "shape-1", "expected": None}]), 400, "ref_name"),
        (_push("shape-1", refs=[{"name": "shape/r", "expected": None}]), 422, "bad_ref_target"),
        (_push("shape-1", head={"expected": None, "to": None, "force": "false"}), 400, "store_fault"),
        (_push("shape-1", complete="no"), 400, "store_fault"),
    ]
    with hunt.client("all") as c:
        for body, status, code in cases:
            problem(c.post("/v1/sessions/shape-1/push", json=body), status, code)
        problem(c.get("/v1/sessions/shape-1"), 404, "no_session")
        for name in ("None", "5", "shape/r"):
            problem(c.get(f"/v1/refs/{name}"), 404, "no_ref")
        # The same push, well formed, lands with its ref.
        r = c.post("/v1/sessions/shape-1/push", json=_push("shape-1", refs=[{"name": "shape/r", "expected": None,
                                                                               "next": "shape-1"}]))
        assert r.status_code == 200 and r.json()["refs"][0]["moved"] is True, r.text


def test_a_ref_prefix_that_breaks_the_rules_is_ref_name(hunt):
    """RFC 0003, Conventions: "A name that breaks the rules is ref_name on a read as on a
    write". A listing's bad prefix was a 200 whose stream ended in an error frame."""
    with hunt.client("all") as c:
        for prefix in ("a\0b", "\u00e9", "a b", "x" * 300):
            problem(c.get("/v1/refs", params={"prefix": prefix}), 400, "ref_name")
        assert lines(c.get("/v1/refs", params={"prefix": "no/such/"}))[-1] == {"end": True, "count": 0}


def test_a_path_off_a_route_by_a_slash_is_a_problem_not_a_redirect(hunt):
    """Starlette answered /v1 and /v1/sessions/ with a 307 to the other spelling: no
    RFC 0003 answer (errors are problem bodies), and one a client following it would send
    a write again to."""
    with hunt.client("all") as c:
        for method, path in (("GET", "/v1"), ("GET", "/v1/sessions/"), ("POST", "/v1/sessions/"),
                             ("GET", "/v1/sessions/slash-1/"), ("PUT", "/v1/objects/entries/")):
            r = c.request(method, path, json=header("slash-1"))
            problem(r, 404, "unsupported")
        problem(c.get("/v1/sessions/slash-1"), 404, "no_session")


# -- a hand loop over every route --------------------------------------------------------------

IDS = ["fuzz-1", "..", "a%2Fb", "a\0b", "\u00e9", "x" * 300, "fuzz-none", "%00", "."]
BODIES = [b"", b"{}", b"[]", b"null", b"\"x\"", b"{\"expected\": 5, \"to\": []}", b"{\"ttl_ms\": \"x\"}",
          b"{\"to\": \"client\", \"head\": {}}", b"{\"basis\": 1}", b"{\"entries\": {}}", b"{\"header\": []}",
          b"\x00\x01", HOSTILE["deep"], HOSTILE["NaN"], b"{\"type\": \"item\"}\n[1]\n"]
HEADERS = [{}, {"Lease-Token": "\u00b2".encode()}, {"Lease-Token": "-1"}, {"Lease-ID": b"\xff"},
           {"If-Incarnation": "sha256:" + "0" * 64}, {"If-Incarnation": "\u00e9".encode()},
           {"Session-Format": "agentsession/0.\u00b2".encode()}, {"Session-Format": "agentsession/1.0"},
           {"Idempotency-Key": "\u00e9".encode()}, {"Content-Type": "text/html"},
           {"Last-Event-ID": "\u00b2-\u00b2-\u00b2".encode()}]
ROUTES = [
    ("GET", "/v1/sessions/{id}"), ("DELETE", "/v1/sessions/{id}"), ("GET", "/v1/sessions/{id}/log?after={q}"),
    ("GET", "/v1/sessions/{id}/log?durable={q}"), ("GET", "/v1/sessions/{id}/path?leaf={q}"),
    ("GET", "/v1/sessions/{id}/path?contents={q}"), ("POST", "/v1/sessions/{id}/push"),
    ("POST", "/v1/sessions/{id}/handover"), ("POST", "/v1/sessions/{id}/record"), ("POST", "/v1/sessions/{id}/lease"),
    ("PUT", "/v1/sessions/{id}/lease"), ("DELETE", "/v1/sessions/{id}/lease"),
    ("POST", "/v1/sessions/{id}/entries?commit={q}"),
    ("POST", "/v1/sessions/{id}/commit"), ("PUT", "/v1/sessions/{id}/head"), ("GET", "/v1/refs/{id}"),
    ("PUT", "/v1/refs/{id}"), ("GET", "/v1/refs/{id}?view={q}"), ("GET", "/v1/refs?prefix={q}"),
    ("GET", "/v1/sessions?limit={q}"), ("GET", "/v1/sessions?after={q}"), ("GET", "/v1/sessions?extra={q}"),
    ("POST", "/v1/objects/missing"), ("POST", "/v1/objects/read"), ("POST", "/v1/objects"),
    ("GET", "/v1/objects/{q}/{id}"), ("PUT", "/v1/objects/{q}/{id}"), ("PATCH", "/v1/sessions/{id}"),
    ("GET", "/v1/sessions/{id}/nothing"),
]
QUERIES = ["", "\u00b2", "9" * 40, "-1", "true", "x:NaN", "a:[" + "[" * 600, "sha256:" + "0" * 64, "log", "contents",
           "%00", "0-0000000000000000-0000000000000000"]


def test_a_seeded_loop_of_malformed_requests_is_answered_by_problems_only(hunt):
    """Every route, with hostile ids, bodies, headers and query values, drawn by a seeded
    generator: every answer that is not a success is a well-formed problem (never a 5xx
    but 501), and nothing the loop sends changes the store (its one real session is leased
    by the test, so no write of the loop's may land on it). A create, whose body may be any
    header, and a lease break, which always succeeds, are the tests' above."""
    rng = random.Random(40)
    with hunt.client("all") as c:
        recorded(c, "fuzz-1", 2)  # leased by this client: the loop has no token for it
        before = state(c)
        for _ in range(600):
            method, path = rng.choice(ROUTES)
            url = path.replace("{id}", quote(rng.choice(IDS), safe="")).replace("{q}", quote(rng.choice(QUERIES), safe=""))
            body = rng.choice(BODIES) if method in ("POST", "PUT") else b""
            r = c.request(method, url, content=body, headers=rng.choice(HEADERS))
            if r.status_code < 400:
                continue
            assert r.status_code != 500, (method, url, body[:60], r.text)
            refused(r)
        assert state(c) == before


# -- streams ------------------------------------------------------------------------------------


def test_a_refs_follow_counts_against_the_stream_limit(tmp_path):
    """RFC 0003, Security: a server SHOULD bound the number of open streams. A ref's
    follow was not counted against ``max_streams``: any number could be opened."""
    Store.init(tmp_path / "st").close()
    with ServerProcess(tmp_path / "st", extra=("--max-streams", "1")) as server, server.client() as c:
        create(c, "s1")
        with c.stream("GET", "/v1/refs/r?view=follow") as first:
            held = first.iter_lines()  # (held: a dropped iterator closes the stream)
            assert next(held).startswith("id: 0")
            for path in ("/v1/refs/other?view=follow", "/v1/sessions/s1/follow"):
                r = c.get(path, timeout=10)  # (a stream served instead would time out)
                problem(r, 503, "store_fault")
                assert int(r.headers["retry-after"]) >= 1
        for _ in range(100):  # the server ends the closed stream at once (a disconnect)
            with c.stream("GET", "/v1/refs/other?view=follow") as again:
                if again.status_code == 200:
                    break
            time.sleep(0.05)
        else:
            raise AssertionError("the closed follow still counted")


# -- the client, against a server answering garbage ---------------------------------------------

Answer = Callable[[BaseHTTPRequestHandler], None]


class _Garbage:
    """A small HTTP server whose every answer is ``self.answer``'s."""

    def __init__(self) -> None:
        self.answer: Answer = lambda h: _send(h, 404, b"")
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_any(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                if size:
                    self.rfile.read(size)
                owner.answer(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def transport(self) -> HttpTransport:
        t = HttpTransport(self.url, token="t", retry_wait=0)
        t._caps = {"features": {"object_read": True, "object_batch": True}, "limits": {}}
        return t


def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str = "application/json",
          headers: dict[str, str] | None = None, *, cut: bool = False) -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body) + (100 if cut else 0)))
    h.end_headers()
    h.wfile.write(body)
    if cut:  # the connection drops before the body it announced
        h.wfile.flush()
        h.close_connection = True
        h.connection.shutdown(socket.SHUT_RDWR)


@pytest.fixture(scope="module")
def garbage() -> Iterator[_Garbage]:
    g = _Garbage()
    yield g
    g.server.shutdown()
    g.server.server_close()


def _calls(t: HttpTransport, fresh: HttpTransport) -> dict[str, Callable[[], Any]]:
    """Each call of the transport (``fresh`` for the capabilities, which ``t`` holds)."""
    return {
        "capabilities": fresh.capabilities,
        "session_header": lambda: t.session_header("s1"),
        "session_view": lambda: t.session_view("s1"),
        "missing": lambda: t.missing({"entries": ["sha256:" + "0" * 64]}),
        "get_ref": lambda: t.get_ref("r"),
        "declare_record": lambda: t.declare_record("s1", head=None),
        "get_objects": lambda: list(t.get_objects([("entries", "sha256:" + "0" * 64)])),
    }


GARBAGE: dict[str, Answer] = {
    "an HTML page": lambda h: _send(h, 200, b"<html>maintenance</html>", "text/html"),
    "a JSON list": lambda h: _send(h, 200, b"[1, 2]"),
    "lines that are no objects": lambda h: _send(h, 200, b"[1]\n\"x\"\n", "application/x-ndjson"),
    "an error frame that is a string": lambda h: _send(h, 200, b"{\"error\": \"boom\"}\n", "application/x-ndjson"),
    "a redirect": lambda h: _send(h, 307, b"", headers={"Location": "http://127.0.0.1:1/elsewhere"}),
    "a cut body": lambda h: _send(h, 200, b"{\"head\"", cut=True),
    "a problem of the wrong shape": lambda h: _send(h, 409, b"{\"code\": 5}", "application/problem+json"),
    "a 503 with Retry-After": lambda h: _send(h, 503, b"busy", "text/plain", {"Retry-After": "3600"}),
}


@pytest.mark.parametrize("what", list(GARBAGE))
def test_a_server_answering_garbage_is_a_library_error(garbage, what):
    """Every transport call raises this library's error whatever the server answers: a
    200 that is no JSON object was the parser's JSONDecodeError (or an AttributeError on
    a list), a stream's garbage line the same, and a redirect was taken for the answer
    (its empty body then read as a cut stream, or a JSONDecodeError)."""
    garbage.answer = GARBAGE[what]
    t, fresh = garbage.transport(), HttpTransport(garbage.url, token="t", retry_wait=0)
    try:
        for name, call in _calls(t, fresh).items():
            if name == "capabilities" and what == "an error frame that is a string":
                continue  # (a JSON object: capabilities that claim nothing)
            with pytest.raises(AgentSessionError) as caught:
                call()
                raise AssertionError(f"{name} took {what}")
            if what == "a redirect":
                assert caught.type is TransportError and "307" in str(caught.value), (name, caught.value)
                assert "127.0.0.1:1/elsewhere" in str(caught.value)
    finally:
        t.close()
        fresh.close()


def test_a_follow_of_garbage_is_a_library_error(garbage):
    """A follow's stream line that is no JSON object (or an event whose data is none) was
    a JSONDecodeError (an AttributeError) out of the library's follow."""
    for body in (b"<html>\n", b"[1]\n", b"{\"event\": \"appended\", \"data\": [1]}\n",
                 b"{\"event\": \"error\", \"data\": {\"status\": \"x\", \"code\": \"no_session\"}}\n"):
        garbage.answer = lambda h, body=body: _send(h, 200, body, "application/x-ndjson")
        t = garbage.transport()
        try:
            with pytest.raises(AgentSessionError):
                next(follow_remote(t, "s1"))
        finally:
            t.close()


def test_a_batch_reads_error_frame_of_garbage_is_a_library_error():
    """A batch read's ``error`` frame whose body is no JSON was a JSONDecodeError, and one
    whose ``status`` is no number a ValueError."""
    for chunk in (b"error 5\nxxxxx", b"error 14\n{\"status\":\"x\"}", b"error 2\n[]"):
        reader = FrameReader(where="remote x", max_object=1 << 20)
        with pytest.raises(AgentSessionError):
            list(reader.feed(chunk))


def test_a_fetch_from_a_server_answering_garbage_leaves_nothing_behind(garbage, tmp_path: Path):
    """A fetch that fails on the server's garbage writes nothing into the fetching store."""
    for what in ("an HTML page", "a redirect", "a cut body", "lines that are no objects"):
        garbage.answer = GARBAGE[what]
        with Store.init(tmp_path / what.replace(" ", "-")) as local:
            with pytest.raises(AgentSessionError):
                fetch(local, garbage.url, "s1")
            assert local.list() == []


def test_a_refused_push_answer_of_the_wrong_shape_is_a_library_error(garbage):
    """A push's 200 whose members are not a push's answer (``head`` a string) was an
    AttributeError."""
    garbage.answer = lambda h: _send(h, 200, json.dumps({"head": "x", "admitted": 1, "refs": []}).encode())
    t = garbage.transport()
    try:
        from agentsession_cas.exchange.transport import PushRequest

        req = PushRequest(header=header("s1"), prefix=[], entries=[], to=None, expected=None, force=False,
                          mark="mirror", refs=[], complete=True)
        with pytest.raises(TransportError):
            t.push(req)
    finally:
        t.close()


def test_appends_under_a_lease_still_work(hunt):
    """(What the hunt's fixes touch, used as the library uses it: a lease, an append, a
    renewal without a ttl, a commit.)"""
    with hunt.client("all") as c:
        create(c, "ok-1")
        held = lease(c, "ok-1")
        assert append(c, "ok-1", held["token"], {"type": "config", "ts": TS, "model": "m"}, commit=True).status_code == 200
        assert c.put("/v1/sessions/ok-1/lease", headers={"Lease-ID": held["lease_id"]}).status_code == 200
        assert c.post("/v1/sessions/ok-1/commit", headers={"Lease-Token": str(held["token"])}).status_code == 200
