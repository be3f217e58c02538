"""What session 40's server hunt found and left (session 41, srv), each checked here:

1. a ``%2F`` in a path segment was decoded before routing (``/v1/sessions/a%2Flog`` read
   the log of ``a``): now the segment is refused as what its place holds;
2. a path read of a session with no entry carried no head and no cursor (RFC 0003: the
   first line carries them; with no line, the ``end`` frame does, as a log read's);
3. follows were counted against ``max_streams`` only once their body began: requests
   admitted together passed the limit (a forced interleaving, no sleeps);
4. a resume was not bounded: it replayed every record since its cursor, two object
   reads each; past ``max_resume_records`` it is a ``reset`` now;
5. a ``HEAD`` of a GET route did the GET's whole work (a follow's HEAD held a stream);
6. a push's ``expected`` (and a head move's, a handover's, a declare's) was checked by
   the server's own rule (``bad_name``) where the library's is ``expected_head_given``
   (``bad_argument``);
7. "is not an entry id" was written out in three places (a 10,000-character id came back
   whole): ``errors.not_an_entry_id``;
8. "unknown object space" was four classes and codes: ``errors.unknown_object_space``.

In process (Starlette's TestClient, or the ASGI app driven by hand where the order of
two requests must be forced), except one check of the raw path through a real server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from agentsession_cas import Header
from agentsession_cas.backends.files.objects import SPACES as FILE_SPACES
from agentsession_cas.errors import (
    AppendRefusedError,
    BadArgumentError,
    not_an_entry_id,
    unknown_object_space,
)
from agentsession_cas.exchange import transport as transport_module
from agentsession_cas.exchange.endpoint import StoreEndpoint
from agentsession_cas.exchange.transport import PushRequest
from agentsession_cas.format.hashing import sha256_ref
from agentsession_cas.server import app as app_module
from agentsession_cas.server.app import Api, Limits, ServerState, create_app
from agentsession_cas.server.follow import MAX_RESUME_RECORDS, Tails
from agentsession_cas.store import Store
from agentsession_cas.store.refs import Refs
from agentsession_cas.store.session import Session, expected_head_given
from server_helpers import ServerProcess
from test_server import TS, append, create, lease, lines, problem, recorded

#: A hostile value: a wording that quotes it whole sends all 10,000 characters back.
LONG = "x" * 10_000


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerState, TestClient]]:
    state = ServerState(Store.init(tmp_path / "st"), None, Limits(max_stream_age_s=0))
    with TestClient(create_app(state)) as client:
        yield state, client


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """A follow's NDJSON events, keep-alives left out."""
    return [json.loads(x) for x in response.text.splitlines() if x.strip()]


def library_problem(response: httpx.Response, status: int, library_code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert body["library_code"] == library_code and body["status"] == status, body
    return body


# -- 1. an encoded slash --------------------------------------------------------------------


def test_an_encoded_slash_in_a_path_segment_is_refused_before_routing(served, tmp_path):
    """``/v1/sessions/s1%2Flog`` was routed as ``/v1/sessions/s1/log`` (a 200: the log of
    s1), and ``/v1/sessions/a%2Fb/log`` as four segments (a 404 no route): each is a bad
    session id now, and an object's or a ref's segment so too, as its place says."""
    _, c = served
    recorded(c, "s1", 1)
    held = "sha256:" + "0" * 64
    for method, path in (("GET", "/v1/sessions/s1%2Flog"), ("GET", "/v1/sessions/s1%2flog"),
                         ("GET", "/v1/sessions/a%2Fb/log"), ("GET", "/v1/sessions/s1%2F"),
                         ("POST", "/v1/sessions/s1%2Flease"), ("DELETE", "/v1/sessions/s1%2Flease"),
                         ("GET", "/v1/sessions/s1%2Ffollow")):
        body = library_problem(c.request(method, path), 400, "bad_name")
        assert body["code"] == "store_fault" and "session id" in body["detail"], (path, body)
    library_problem(c.get(f"/v1/objects/entries%2Fx/{held}"), 400, "bad_argument")
    library_problem(c.get(f"/v1/objects/entries/sha256%2F{'0' * 64}"), 400, "bad_name")
    problem(c.get("/v1/refs/a%2Fb"), 400, "ref_name")
    problem(c.get("/v1/%2Fsessions"), 404, "unsupported")
    r = c.head("/v1/sessions/s1%2Flog")
    assert r.status_code == 400 and r.content == b""
    # What is encoded and no slash is decoded as before: an id spelled with %31 is s1.
    assert lines(c.get("/v1/sessions/s%31/log"))[0]["session"]["id"] == "s1"
    # A real server hands the path as sent (uvicorn's raw_path) too.
    Store.init(tmp_path / "real").close()
    with ServerProcess(tmp_path / "real") as server, server.client() as rc:
        create(rc, "s1")
        library_problem(rc.get("/v1/sessions/s1%2Flog"), 400, "bad_name")
        assert rc.get("/v1/sessions/s1/log").status_code == 200


# -- 2. an empty path read ------------------------------------------------------------------


def test_an_empty_path_read_carries_the_head_and_cursor_in_its_end_frame(served):
    """RFC 0003, Reading: "The first line also carries the head and cursor the path was
    read at, and the incarnation, so a client can follow from it with no gap". A session
    with no entry has no first line, and its end frame said neither."""
    _, c = served
    made = create(c, "e1")
    facts = c.get("/v1/sessions/e1").json()
    for contents in ("all", "since-fold", "none"):
        got = lines(c.get("/v1/sessions/e1/path", params={"contents": contents}))
        assert got == [{"end": True, "count": 0, "incarnation": made["incarnation"], "head": None,
                        "cursor": facts["cursor"], "contents": "all" if contents == "since-fold" else contents}]
    # The log read says so already, its end frame carrying the session when no line does:
    # a session with no entry, and a read past the end alike.
    empty = lines(c.get("/v1/sessions/e1/log"))
    assert len(empty) == 1 and empty[0]["cursor"] == facts["cursor"] and empty[0]["session"]["head"] is None
    token = lease(c, "e1")["token"]
    head = append(c, "e1", token, {"type": "config", "ts": TS, "model": "m1"}, commit=True).json()["head"]
    cursor = lines(c.get("/v1/sessions/e1/log"))[-1]["cursor"]
    past = lines(c.get("/v1/sessions/e1/log", params={"after": cursor}))
    assert len(past) == 1 and past[0]["cursor"] == cursor and past[0]["session"]["head"] == head


# -- 3. follows counted at admission --------------------------------------------------------


def _scope(target: str, method: str = "GET") -> dict[str, Any]:
    path, _, query = target.partition("?")
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
            "headers": [(b"host", b"testserver"), (b"accept", b"application/x-ndjson")],
            "client": ("127.0.0.1", 1), "server": ("testserver", 80)}


@pytest.mark.parametrize("first", ["/v1/sessions/s1/follow", "/v1/refs/r?view=follow"])
def test_follows_admitted_together_cannot_pass_max_streams(tmp_path, monkeypatch, first):
    """A follow was counted against ``max_streams`` when its body began, after its
    session was read: two follows admitted together both passed the check while the
    first read. Forced here: the first admitted follow's read waits until the second has
    its answer. With one stream allowed, the second is refused (503), and the first's
    place is given back when its follower leaves."""
    state = ServerState(Store.init(tmp_path / "st"), None, Limits(max_streams=1))
    state.store.create(Header.new("s1", created_at=TS)).close()
    app = create_app(state)
    real_work = Api.work
    second_answered = asyncio.Event()
    calls = 0

    async def gated(self: Api, fn: Callable[..., Any], *args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first follow's read of its session, after its admission
            await asyncio.wait_for(second_answered.wait(), 30)
        return await real_work(self, fn, *args)

    monkeypatch.setattr(Api, "work", gated)

    async def run() -> list[int]:
        statuses: list[int] = []
        both = asyncio.Event()
        gone = asyncio.Event()

        def request(target: str) -> Any:
            asked = False

            async def receive() -> dict[str, Any]:
                nonlocal asked
                if not asked:
                    asked = True
                    return {"type": "http.request", "body": b"", "more_body": False}
                await gone.wait()
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])
                    second_answered.set()
                    if len(statuses) == 2:
                        both.set()

            return app(_scope(target), receive, send)

        a = asyncio.ensure_future(request(first))
        await asyncio.sleep(0)  # (a admitted and waiting in its read before b is sent)
        b = asyncio.ensure_future(request("/v1/sessions/s1/follow"))
        await asyncio.wait_for(both.wait(), 30)
        gone.set()  # both followers leave
        await asyncio.wait_for(asyncio.gather(a, b), 30)
        return statuses

    statuses = asyncio.run(run())
    assert sorted(statuses) == [200, 503], statuses
    assert statuses == [503, 200]  # (b answered while a read: refused at its admission)
    assert state.streams == 0 and state.stream_starts == []


def test_a_refused_or_failed_follow_gives_its_place_back(served):
    """A follow refused after its admission (no such session) holds no place."""
    state, c = served
    problem(c.get("/v1/sessions/none-1/follow"), 404, "no_session")
    problem(c.get("/v1/sessions/bad%20id/follow"), 400, "store_fault")
    assert state.streams == 0 and state.stream_starts == []


# -- 4. resumes bounded -----------------------------------------------------------------------


def test_a_resume_further_behind_than_the_bound_is_a_reset(tmp_path):
    """RFC 0003: a server SHOULD bound "the work a resume may cost". A resume replayed
    every record since its cursor (an event and two object reads each, built at once in
    the event loop); past ``max_resume_records`` it is a ``reset``, the session afresh
    (what a new follower's ``snapshot`` costs), and within it the records as before."""
    state = ServerState(Store.init(tmp_path / "st"), None, Limits(max_stream_age_s=0, max_resume_records=2))
    with TestClient(create_app(state)) as c:
        assert c.get("/v1/").json()["limits"]["max_resume_records"] == 2
        _, ids = recorded(c, "s1", 4)  # create, config and four items, a commit: 7 records
        log = lines(c.get("/v1/sessions/s1/log"))[:-1]
        nd = {"Accept": "application/x-ndjson"}
        near = events(c.get("/v1/sessions/s1/follow", params={"after": log[3]["cursor"]}, headers=nd))
        kinds = [e["event"] for e in near if e["event"] != "committed"]  # (a follower back is told the commit)
        assert kinds == ["appended", "end"] and near[0]["data"]["entry"] == ids[4]
        far = events(c.get("/v1/sessions/s1/follow", params={"after": log[0]["cursor"]}, headers=nd))
        assert [e["event"] for e in far if e["event"] != "committed"] == ["reset", "end"]
        assert [r["entry"] for r in far[0]["data"]["records"]] == ids
        # A log read's resume costs no more than the log read itself: not bounded.
        assert len(lines(c.get("/v1/sessions/s1/log", params={"after": log[0]["cursor"]}))) == len(ids)
    assert Limits().as_dict()["max_resume_records"] is MAX_RESUME_RECORDS is None  # (off unless set)


def test_by_default_a_resume_replays_from_its_cursor_however_far_back(tmp_path):
    """RFC 0003: "the server resumes after exactly that event". A reset for a cursor it can
    resume from makes the client drop what it derived and costs the whole session (a line
    per record and the oldest entries inline), more than the replay for most resumes, so
    the bound is the operator's choice (``--max-resume-records``), off by default."""
    state = ServerState(Store.init(tmp_path / "st"), None, Limits(max_stream_age_s=0))
    with TestClient(create_app(state)) as c:
        assert c.get("/v1/").json()["limits"]["max_resume_records"] is None
        _, ids = recorded(c, "s1", 4)
        log = lines(c.get("/v1/sessions/s1/log"))[:-1]
        nd = {"Accept": "application/x-ndjson"}
        far = events(c.get("/v1/sessions/s1/follow", params={"after": log[0]["cursor"]}, headers=nd))
        got = [e for e in far if e["event"] == "appended"]
        assert "reset" not in [e["event"] for e in far] and [e["data"]["entry"] for e in got] == ids[1:]


# -- 5. HEAD --------------------------------------------------------------------------------


def test_head_refuses_what_its_get_refuses_from_the_query_or_the_backend(tmp_path, monkeypatch):
    """A HEAD answers the status its GET answers: a log read's ``after`` that is no cursor
    is 400, and a ref's history on a backend that keeps none (PostgreSQL) 501 (both were
    200 when the HEAD returned before these checks)."""
    from agentsession_cas.backends.files.refs import FileRefs
    from agentsession_cas.store.refs import Refs

    st = Store.init(tmp_path / "st")
    state = ServerState(st, None, Limits(max_stream_age_s=0))
    with TestClient(create_app(state)) as c:
        recorded(c, "s1", 1)
        Refs(st).update("r", "s1", expected=None)
        for method in ("GET", "HEAD"):
            assert c.request(method, "/v1/sessions/s1/log", params={"after": "x"}).status_code == 400
            # the session's checks first, as the GET makes them: no session, another incarnation
            assert c.request(method, "/v1/sessions/nope/log", params={"after": "x"}).status_code == 404
            assert c.request(method, "/v1/sessions/s1/log", params={"after": "x"},
                             headers={"If-Incarnation": "sha256:" + "0" * 64}).status_code == 409
            assert c.request(method, "/v1/refs/r", params={"view": "log"}).status_code == 200
        monkeypatch.setattr(FileRefs, "keeps_moves", False)  # a backend that keeps no ref history
        for method in ("GET", "HEAD"):
            assert c.request(method, "/v1/refs/r", params={"view": "log"}).status_code == 501


def test_head_answers_what_its_get_answers_without_reading_the_log_or_opening_a_stream(tmp_path):
    """Two statuses a GET decides before its body that a HEAD answered 200 to (a reviewer's
    finding): a log read's ``after`` of another incarnation (its tag says so, no log read)
    is 409 ``session_replaced``; a follow (a session's, a ref's) at ``max_streams`` is the
    503 with ``Retry-After``, and the HEAD takes no place."""
    from agentsession_cas.server.app import _StreamSlot

    st = Store.init(tmp_path / "st")
    state = ServerState(st, None, Limits(max_stream_age_s=0, max_streams=1))
    with TestClient(create_app(state)) as c:
        recorded(c, "s1", 1)
        pos, _tag, check = lines(c.get("/v1/sessions/s1/log"))[-1]["cursor"].split("-")
        other = f"{pos}-{'f' * 16}-{check}"
        for method in ("GET", "HEAD"):
            r = c.request(method, "/v1/sessions/s1/log", params={"after": other})
            assert r.status_code == 409, method
        problem(c.get("/v1/sessions/s1/log", params={"after": other}), 409, "session_replaced")
        assert c.head("/v1/sessions/s1/follow").status_code == 200  # below the limit: no place taken
        assert state.streams == 0
        held = _StreamSlot(state)  # the one place taken
        try:
            for route in ("/v1/sessions/s1/follow", "/v1/refs/r?view=follow"):
                for method in ("GET", "HEAD"):
                    r = c.request(method, route)
                    assert r.status_code == 503 and r.headers["Retry-After"], (method, route)
            assert state.streams == 1
        finally:
            held.release()


def test_head_answers_the_headers_without_the_body_work(served, monkeypatch):
    """Starlette routes HEAD to a GET route's handler, which did the GET's work and sent
    its body for nothing: a HEAD of a follow held a stream (until its age limit, counted
    against ``max_streams``), of a log read the whole log, of an object its bytes. Now a
    HEAD checks what the status depends on and answers the GET's headers only."""
    state, c = served
    _, ids = recorded(c, "s1", 2)
    Refs(state.store).update("r", "s1", expected=None)
    counts: dict[str, int] = {}

    def counted(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] = counts.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    counted(app_module, "load_view")
    counted(Session, "records")
    counted(Store, "ancestry_up")
    counted(Store, "summary")
    counted(Tails, "cursor")
    counted(Refs, "log")
    counted(type(state.store.objects), "get")
    envelope = c.get(f"/v1/objects/entries/{ids[0]}")
    assert envelope.status_code == 200
    counts.clear()
    routes = ["/v1/sessions/s1", "/v1/sessions/s1/log", "/v1/sessions/s1/log?durable=true", "/v1/sessions/s1/path",
              "/v1/sessions/s1/follow", "/v1/sessions", "/v1/refs", "/v1/refs/r?view=log", "/v1/refs/r?view=follow",
              "/v1/"]
    for route in routes:
        r = c.head(route)
        assert counts == {}, (route, counts)
        assert r.status_code == 200 and r.content == b"", (route, r.status_code)
        if route != "/v1/":  # (a body made all the same, the capabilities', has its length said)
            assert r.headers.get("content-length", "0") == "0", route
    assert state.streams == 0
    # An object's HEAD asks whether the caller may be told it is held (which may read it:
    # one held only by an open log), and does not read it to send it.
    assert c.get(f"/v1/objects/entries/{ids[0]}").status_code == 200
    read_by_get, counts["get"] = counts["get"], 0
    assert c.head(f"/v1/objects/entries/{ids[0]}").status_code == 200
    assert counts["get"] == read_by_get - 1, (counts, read_by_get)
    counts.clear()
    # The headers a GET answers with: who the session is, and the media type.
    for route in ("/v1/sessions/s1", "/v1/sessions/s1/log", "/v1/sessions/s1/path"):
        got, head = c.get(route), c.head(route)
        assert head.headers["incarnation"] == got.headers["incarnation"], route
        assert head.headers["content-type"] == got.headers["content-type"], route
    assert c.head(f"/v1/objects/entries/{ids[0]}").headers["cache-control"] == envelope.headers["cache-control"]
    # What a GET refuses, a HEAD refuses alike, with no body.
    for route in ("/v1/sessions/none-1", "/v1/sessions/none-1/log", "/v1/sessions/none-1/follow",
                  "/v1/objects/entries/" + "sha256:" + "1" * 64):
        r = c.head(route)
        assert r.status_code == 404 and r.content == b"", route
    assert counts.get("load_view") is None and state.streams == 0


# -- 6. one expected-head rule --------------------------------------------------------------


def test_an_expected_head_over_http_is_refused_by_the_librarys_rule(served):
    """The server checked a push's ``head.expected`` (and a head move's ``expected``, a
    handover's and a declare's ``head``) by its own ``_opt_hash``: ``bad_name`` with its
    own words, where the library refuses the same value locally as ``bad_argument``
    (``store.session.expected_head_given``). One rule now, one code, one message."""
    state, c = served
    held, ids = recorded(c, "s1", 1)
    token = {"Lease-Token": str(held["token"])}
    with pytest.raises(BadArgumentError) as local:
        expected_head_given("abcd")
    want = str(local.value)
    header = c.get("/v1/sessions/s1").json()["header"]
    answers = {
        "push": c.post("/v1/sessions/s1/push", json={"header": header, "entries": ids, "prefix": [],
                                                     "head": {"expected": "abcd", "to": ids[-1]}}),
        "head": c.put("/v1/sessions/s1/head", json={"expected": "abcd", "to": ids[0]}, headers=token),
        "handover": c.post("/v1/sessions/s1/handover", json={"to": "client", "head": "abcd"}, headers=token),
        "record": c.post("/v1/sessions/s1/record", json={"basis": "sole_copy", "head": "abcd"}, headers=token),
    }
    for what, r in answers.items():
        assert library_problem(r, 400, "bad_argument")["detail"] == want, what
    # A head target that is no entry id is head_target, as Session.set_head says it.
    with pytest.raises(BadArgumentError):
        expected_head_given(5)
    s = state.store.session("s1")
    with pytest.raises(AppendRefusedError) as local_to:
        s.set_head("abcd", expected=s.head)
    for r in (c.put("/v1/sessions/s1/head", json={"expected": ids[-1], "to": "abcd"}, headers=token),
              c.put("/v1/sessions/s1/head", json={"expected": ids[-1], "to": []}, headers=token)):
        problem(r, 422, "head_target")
    assert problem(c.put("/v1/sessions/s1/head", json={"expected": ids[-1], "to": "abcd"}, headers=token), 422,
                   "head_target")["detail"] == str(local_to.value)
    r = c.post("/v1/sessions/s1/push", json={"header": header, "entries": ids, "prefix": [],
                                             "head": {"expected": ids[-1], "to": "abcd"}})
    problem(r, 422, "head_target")
    assert c.get("/v1/sessions/s1").json()["head"] == ids[-1]


# -- 7. one wording for "not an entry id" ---------------------------------------------------


def test_an_entry_id_that_is_none_is_said_by_one_helper(served, tmp_path):
    """The server's push, the exchange's receiver and the session's head move each wrote
    the wording out, the first two with ``!r``: a 10,000-character id came back whole.
    Each says ``errors.not_an_entry_id`` now, cut by ``quoted()``."""
    state, c = served
    want = str(not_an_entry_id(LONG))
    assert len(want) < 200 and "(10000 characters)" in want
    header = Header.new("p1", created_at=TS).data
    r = c.post("/v1/sessions/p1/push", json={"header": header, "entries": [LONG], "prefix": [],
                                             "head": {"expected": None, "to": None}})
    assert problem(r, 422, "bad_entry")["detail"] == want
    with Store.init(tmp_path / "local") as local:
        with pytest.raises(AppendRefusedError) as received:
            StoreEndpoint(local).receive(PushRequest(header=header, prefix=[], entries=[LONG], to=None, expected=None))
        assert str(received.value) == want and received.value.code == "bad_entry"
        s = local.create(Header.new("h1", created_at=TS))
        with pytest.raises(AppendRefusedError) as moved:
            s.set_head(LONG, expected=None)
        assert str(moved.value) == want and moved.value.code == "head_target"


# -- 8. one refusal of an unknown object space ------------------------------------------------


def test_an_unknown_object_space_is_one_error_everywhere(served, tmp_path):
    """"unknown object space" was a StoreError (the exchange's transport, a 500 over
    HTTP), a BadNameError (the wire), a BadArgumentError (the store) and a bare
    AgentSessionError (the file backend, code ``error``): one helper now, one class and
    code (``bad_argument``), answered 400 by the server."""
    _, c = served
    held = "sha256:" + "0" * 64
    r = c.get(f"/v1/objects/trees/{held}")
    body = library_problem(r, 400, "bad_argument")
    assert body["detail"] == str(unknown_object_space("trees", ["entries", "contents", "media"]))
    library_problem(c.put(f"/v1/objects/trees/{held}", content=b"x"), 400, "bad_argument")
    library_problem(c.post("/v1/objects/missing", json={"trees": [held]}), 400, "bad_argument")
    library = str(unknown_object_space("trees", FILE_SPACES))
    with Store.init(tmp_path / "local") as local:
        calls = {
            "transport": lambda: transport_module.check_space("trees"),
            "store": lambda: local.cat_object(sha256_ref(b"x"), "trees"),  # type: ignore[arg-type]
            "files": lambda: local.backend.objects.path("trees", sha256_ref(b"x")),  # type: ignore[attr-defined]
        }
        for what, call in calls.items():
            with pytest.raises(BadArgumentError) as caught:
                call()
            assert caught.value.code == "bad_argument" and str(caught.value) == library, what
