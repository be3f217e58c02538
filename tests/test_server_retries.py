"""The HTTP client's retries against a server that says when to come back (RFC 9110
Retry-After, which this server sends with every 503 it answers for a full table of
Idempotency-Keys): the wait it asks is honoured, within a bound the caller sets
(``AGENTSESSION_RETRY_WAIT``), and a wait past it is given up at once with the
server's error; a follow refused for the server's stream limit, or dropped, is opened
again by the same rule, from its last event. Nothing here sleeps: each transport's ``sleep`` and ``clock`` are
replaced, and the server is httpx's MockTransport (a real server at the end).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from email.utils import format_datetime
from itertools import islice

import httpx
import pytest

from agentsession_cas import Header
from agentsession_cas.errors import StoreError, TransportError
from agentsession_cas.exchange.following import follow_remote
from agentsession_cas.exchange.http_client import RETRY_WAIT_ENV, RETRY_WAIT_S, HttpTransport
from agentsession_cas.exchange.wire import end_frame, object_frame
from agentsession_cas.format.hashing import sha256_ref

#: The injected wall clock (seconds since the epoch), for the HTTP-date form.
NOW = 1_800_000_000.0
BUSY = {"type": "urn:agentsession:problem:store_fault", "title": "store fault", "status": 503,
        "code": "store_fault", "library_code": "store_fault", "detail": "this server remembers 5 Idempotency-Keys"}


def _transport(answers: list[httpx.Response | Callable[[httpx.Request], httpx.Response]],
               **kwargs: float) -> tuple[HttpTransport, list[float], list[str]]:
    """A transport to a mock server that gives ``answers`` in turn (the last one again once
    they run out); what it slept, and the requests sent."""
    slept: list[float] = []
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.method} {request.url.path}")
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        return answer(request) if callable(answer) else answer

    t = HttpTransport("http://store.test/", token="t", **kwargs)
    t._http.close()
    t._http = httpx.Client(base_url=t.url + "v1", transport=httpx.MockTransport(handler))
    t.sleep = slept.append
    t.clock = lambda: NOW
    return t, slept, sent


def _busy(retry_after: str | None) -> httpx.Response:
    return httpx.Response(503, json=BUSY, headers={"Retry-After": retry_after} if retry_after else {})


def test_a_retry_waits_as_long_as_the_servers_retry_after_asks():
    """It waited its fixed schedule (0.05 s, then 0.2 s...) whatever the server said, so a
    503 whose Retry-After named when a key would be free was sent again too soon and
    refused again until the retries ran out. Both forms of Retry-After are read: seconds,
    and an HTTP-date (against the wall clock)."""
    date = format_datetime(datetime.fromtimestamp(NOW + 30, tz=UTC), usegmt=True)
    t, slept, sent = _transport([_busy("7"), _busy(date), _busy(None), httpx.Response(201, json={"ok": 1})])
    assert t.request("POST", "/sessions", safe=False, keyed=True, json={}).json() == {"ok": 1}
    assert slept == [7.0, 30.0, 0.5] and len(sent) == 4  # no Retry-After: the schedule's own wait
    # A Retry-After shorter than the schedule's wait, or unreadable, does not shorten it.
    t, slept, _ = _transport([_busy("0"), _busy("soon"), httpx.Response(200, json={})])
    t.request("GET", "/", safe=True)
    assert slept == [0.05, 0.2]


def test_a_wait_past_the_callers_bound_is_given_up_at_once_with_the_servers_error(monkeypatch):
    """A server whose table of keys is full for this token asks for up to 20 minutes. The
    client gives up, without waiting, when a wait would take its retries' waits past the
    bound (``AGENTSESSION_RETRY_WAIT``, else 60 s; ``retry_wait=`` on the transport), and
    raises the server's error, its code kept, saying why it was not sent again."""
    assert RETRY_WAIT_S == 60
    t, slept, sent = _transport([_busy("1200")])
    with pytest.raises(StoreError) as caught:
        t.request("POST", "/sessions", safe=False, keyed=True, json={})
    assert caught.value.code == "store_fault" and caught.value.status == 503
    message = str(caught.value)
    assert message.startswith("remote http://store.test/ (store_fault): this server remembers"), message
    assert "1200 s" in message and "60 s" in message and RETRY_WAIT_ENV in message, message
    assert slept == [] and len(sent) == 1
    # The bound is on all of one request's waits: 40 s, then another 40 s would pass 60.
    t, slept, sent = _transport([_busy("40")])
    with pytest.raises(StoreError, match="Retry-After"):
        t.request("GET", "/", safe=True)
    assert slept == [40.0] and len(sent) == 2
    # The caller's bound: the environment's, else the transport's argument.
    monkeypatch.setenv(RETRY_WAIT_ENV, "1500")
    t, slept, _ = _transport([_busy("1200"), httpx.Response(200, json={})])
    t.request("GET", "/", safe=True)
    assert slept == [1200.0]
    t, slept, _ = _transport([_busy("7")], retry_wait=5)
    with pytest.raises(StoreError, match="past this client's bound of 5 s"):
        t.request("GET", "/", safe=True)
    assert slept == []
    monkeypatch.setenv(RETRY_WAIT_ENV, "soon")
    with pytest.raises(TransportError, match=f"{RETRY_WAIT_ENV}='soon'"):
        HttpTransport("http://store.test/")


def test_a_dropped_connection_is_retried_on_the_schedule_within_the_bound():
    """No answer, no Retry-After: the fixed schedule, as before, its waits counted in the
    bound too (a bound of 0 sends nothing again)."""
    def drop(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    t, slept, sent = _transport([drop, drop, httpx.Response(200, json={})])
    t.request("GET", "/", safe=True)
    assert slept == [0.05, 0.2] and len(sent) == 3
    t, slept, sent = _transport([drop], retry_wait=0)
    with pytest.raises(TransportError, match="got no answer"):
        t.request("GET", "/", safe=True)
    assert slept == [] and len(sent) == 1


def test_a_batch_read_refused_busy_waits_as_the_server_asks():
    """A batch read (``POST /v1/objects/read``) answered 503 is asked again too, after the
    Retry-After its answer names, and past the bound gives up with the server's error."""
    data = b'{"x":1}'
    name = sha256_ref(data)
    caps = httpx.Response(200, json={"protocol": "agentsession-store/1", "features": {"object_read": True},
                                     "limits": {}})
    body = object_frame("contents", name, data) + end_frame(1)
    t, slept, sent = _transport([caps, _busy("3"), httpx.Response(200, content=body)])
    assert list(t.get_objects([("contents", name)])) == [("contents", name, data)]
    assert slept == [3.0] and sent == ["GET /v1/", "POST /v1/objects/read", "POST /v1/objects/read"]
    t, slept, sent = _transport([caps, _busy("600")])
    with pytest.raises(StoreError, match=r"\(store_fault\).*600 s"):
        list(t.get_objects([("contents", name)]))
    assert slept == []


def test_a_token_over_its_share_is_told_at_once_and_others_write_on(tmp_path):
    """The whole chain against a real server: a token that holds its share of the
    Idempotency-Key table (here 1) gets a 503 whose Retry-After is some 20 minutes; the
    client gives that up at once with the server's error (code and detail), and another
    token's keyed write goes through."""
    from agentsession_cas.store import Store
    from server_helpers import TOKENS, ServerProcess, token_file

    Store.init(tmp_path / "st").close()
    with ServerProcess(tmp_path / "st", auth=token_file(tmp_path), extra=("--max-idempotency-keys-per-token", "1")) as server:
        def create(who: str, sid: str) -> HttpTransport:
            t = HttpTransport(server.url, token=TOKENS[who][0])
            t.sleep = lambda s: pytest.fail(f"slept {s} s")
            t.request("POST", "/sessions", safe=False, keyed=True, json=Header.new(sid).data)
            return t

        create("team-a", "a-1").close()
        with pytest.raises(StoreError) as caught:
            create("team-a", "a-2")
        assert caught.value.code == "store_fault" and "(store_fault): this token (team-a)" in str(caught.value)
        assert "past this client's bound of 60 s" in str(caught.value)
        create("team-b", "b-1").close()


# -- a follow (GET …/follow): refused for the server's stream limit, or dropped ------------

STREAMS_FULL = dict(BUSY, detail="this server has 1 follow streams open, its limit; one ends within 7 s: try again then")


def _streams_full(retry_after: str) -> httpx.Response:
    return httpx.Response(503, json=STREAMS_FULL, headers={"Retry-After": retry_after})


def _frames(*frames: dict, cut: bool = False) -> httpx.Response:
    """A follow's answer: NDJSON events; ``cut``: the connection drops after them."""
    lines = [json.dumps(f).encode() + b"\n" for f in frames]

    class Stream(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield from lines
            if cut:
                raise httpx.ReadError("connection reset by peer")

    return httpx.Response(200, stream=Stream(), headers={"Content-Type": "application/x-ndjson"})


def _head(cursor: str, leaf: str) -> dict:
    return {"event": "head", "id": f"{cursor}.0", "data": {"leaf": leaf, "cursor": cursor}}


SNAPSHOT = {"event": "snapshot", "id": "c1.0", "data": {"incarnation": "i1", "records": []}}


def _follow(t: HttpTransport, sent_ids: list[str | None], count: int) -> list:
    """The first ``count`` changes of following session s1 through ``t``; the Last-Event-ID
    each connection sent goes to ``sent_ids``."""
    def handler(request: httpx.Request) -> httpx.Response:
        sent_ids.append(request.headers.get("last-event-id"))
        return inner(request)

    inner = t._http._transport.handle_request  # type: ignore[attr-defined]
    t._http = httpx.Client(base_url=t.url + "v1", transport=httpx.MockTransport(handler))
    changes = follow_remote(t, "s1")
    try:
        return [(c.kind, c.head) for c in islice(changes, count)]
    finally:
        changes.close()


def test_a_follow_refused_for_the_stream_limit_waits_as_the_server_asks_and_resumes():
    """A follow the server refuses because its follow streams are at their limit (503,
    ``Retry-After``: when the oldest open one ends) was raised at once, however short
    the wait asked. It is asked again after that wait, under the same bound as any
    request's retries, counted afresh once the stream brought events; a stream that
    ended (the server's age limit) is opened again at once; every new connection
    resumes after the last event seen (Last-Event-ID)."""
    end = {"event": "end", "id": "c2.1", "data": {"reason": "max_stream_age", "cursor": "c2"}}
    t, slept, _ = _transport([_streams_full("7"), _frames(SNAPSHOT, _head("c2", "sha256:a1"), end),
                              _streams_full("5"), _frames(_head("c3", "sha256:a2"))], retry_wait=10)
    ids: list[str | None] = []
    assert _follow(t, ids, 2) == [("head", "sha256:a1"), ("head", "sha256:a2")]
    assert slept == [7.0, 5.0]  # 12 s in all, past the bound of 10: the second wait counted afresh
    assert ids == [None, None, "c2.1", "c2.1"]


def test_a_follow_refused_past_the_bound_gives_up_at_once_with_the_servers_error():
    """A wait past the bound is not waited: the server's error (its code, its detail) is
    raised at once, saying what the server asked and the client's bound."""
    t, slept, sent = _transport([_streams_full("1200")])
    with pytest.raises(StoreError) as caught:
        _follow(t, [], 1)
    assert caught.value.code == "store_fault" and caught.value.status == 503
    message = str(caught.value)
    assert "(store_fault): this server has 1 follow streams open" in message, message
    assert "asked to wait 1200 s (Retry-After)" in message and "bound of 60 s" in message, message
    assert RETRY_WAIT_ENV in message and slept == [] and len(sent) == 1


def test_a_dropped_follow_resumes_from_its_last_event_on_the_retry_schedule():
    """A stream that drops is opened again from the last event seen, after the retry
    schedule's wait (through the transport's sleep, which the caller may replace: it
    was ``time.sleep`` itself), and one that keeps dropping gives up after the retries,
    saying so; one that brings nothing before it ends counts as dropped."""
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    t, slept, _ = _transport([_frames(SNAPSHOT, _head("c2", "sha256:a1"), cut=True), refused,
                              _frames(_head("c3", "sha256:a2"))])
    ids: list[str | None] = []
    assert _follow(t, ids, 2) == [("head", "sha256:a1"), ("head", "sha256:a2")]
    assert slept == [0.05, 0.2] and ids == [None, "c2.0", "c2.0"]
    t, slept, sent = _transport([lambda _: _frames()])  # (a new answer each time)
    with pytest.raises(TransportError, match=r"follow ended before any event.*given up after 4 retries"):
        _follow(t, [], 1)
    assert slept == [0.05, 0.2, 0.5, 1.0] and len(sent) == 5
    t, slept, sent = _transport([refused], retry_wait=0)
    with pytest.raises(TransportError, match="dropped.*connection refused"):
        _follow(t, [], 1)
    assert slept == [] and len(sent) == 1


def test_a_follows_keep_alive_line_is_passed_over():
    """An idle NDJSON follow gets an empty line every 15 s (the server's keep-alive, so
    intermediaries keep it open); the follower read it as an event and failed with a
    JSON decoding error, ending ``show -f --remote`` on a session idle for 15 s."""
    class Stream(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield json.dumps(_head("c2", "sha256:a1")).encode() + b"\n"
            yield b"\n"
            yield json.dumps(_head("c3", "sha256:a2")).encode() + b"\n"

    t, slept, _ = _transport([httpx.Response(200, stream=Stream())])
    assert _follow(t, [], 2) == [("head", "sha256:a1"), ("head", "sha256:a2")] and slept == []
