"""The HTTP client's retries against a server that says when to come back (RFC 9110
Retry-After, which this server sends with every 503 it answers for a full table of
Idempotency-Keys): the wait it asks is honoured, within a bound the caller sets
(``AGENTSESSION_RETRY_WAIT``), and a wait past it is given up at once with the
server's error. Nothing here sleeps: each transport's ``sleep`` and ``clock`` are
replaced, and the server is httpx's MockTransport (a real server at the end).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import format_datetime

import httpx
import pytest

from agentsession_cas import Header
from agentsession_cas.errors import StoreError, TransportError
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
