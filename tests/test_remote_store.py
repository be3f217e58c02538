"""A store over HTTP (``open_store("http://…")``, agentsession_cas/backends/remote.py): what the
contract suite does not say about it. The contract suite runs every store rule against it
(contract_helpers.BACKENDS, "http"); these tests cover what is the remote backend's own:
leases as the writer's hold, fencing, the object cache, tokens, the command's --store and
AGENTSESSION_STORE, and the refusals of what the protocol does not carry. Real servers
(``agentsession serve`` processes, server_helpers.ServerProcess), nothing mocked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from agentsession_cas import Header
from agentsession_cas.backends import remote
from agentsession_cas.errors import (
    AuthError,
    LeaseLostError,
    MirrorError,
    NoSuchObjectError,
    ScopeError,
    SessionLockedError,
    TransportError,
    UnsupportedError,
)
from agentsession_cas.store import Store
from agentsession_cas.store.refs import Refs
from agentsession_cas.store.url import open_store
from server_helpers import TOKENS
from server_helpers import served as served  # a fixture; "as served" marks it used on purpose (F401, F811)


def _msg(text: str) -> dict:
    return {"type": "item", "item": {"type": "message", "role": "user", "content": text}}


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AGENTSESSION_TOKEN", TOKENS["all"][0])
    return TOKENS["all"][0]


def test_a_session_written_over_http_is_the_servers(served, token, tmp_path):
    """Appends through the remote store land on the server's store: after the server
    stops, its directory holds the same session, entry for entry."""
    with open_store(served.url) as st:
        s = st.create(Header.new("chat-1"))
        ids = [s.append(_msg(f"m{i}")).id for i in range(5)]
        assert s.head == ids[-1] and s.mark == "record"
        exported = st.export("chat-1")
    served.stop()
    with Store(served.store, readonly=True) as local:
        snap = local.read("chat-1")
        assert snap.log_order == ids and snap.head == ids[-1]
        assert local.export("chat-1") == exported


def test_a_writer_holds_a_lease_and_a_second_is_refused(served, token):
    """A writable open is a lease: another client's open is ``session_locked`` until the
    first closes (and releases it)."""
    a, b = open_store(served.url), open_store(served.url)
    try:
        s = a.create(Header.new("chat-2"))
        s.append(_msg("one"))
        with pytest.raises(SessionLockedError):
            b.session("chat-2")
        with served.client("all") as c:
            assert c.get("/v1/sessions/chat-2").json()["leased"] is True
        s.close()
        s2 = b.session("chat-2")
        assert s2.append(_msg("two")).outcome == "continued"
    finally:
        a.close()
        b.close()


def test_a_broken_lease_fences_the_old_writer(served, token):
    """RFC 0003 fencing: once an admin breaks the lease, the old handle's next write is
    ``lease_lost`` and lands nothing."""
    with open_store(served.url) as st:
        s = st.create(Header.new("chat-3"))
        first = s.append(_msg("before")).id
        with served.client("all") as c:
            assert c.post("/v1/sessions/chat-3/lease/break").json()["broken"] is True
        with pytest.raises(LeaseLostError):
            s.append(_msg("after"))
    with open_store(served.url, readonly=True) as ro:
        assert ro.read("chat-3").log_order == [first]


def test_objects_are_cached(served, token):
    """An object read once is served from the handle's cache: the second read of an entry
    asks the server nothing."""
    with open_store(served.url) as st:
        s = st.create(Header.new("chat-4"))
        eid = s.append(_msg("cached")).id
    with open_store(served.url, readonly=True) as ro:
        calls: list[str] = []
        http = ro.backend.http._http  # type: ignore[attr-defined]
        http.event_hooks["request"].append(lambda request: calls.append(request.url.path))
        assert ro.entry(eid).id == eid
        fetched = [p for p in calls if "/objects/" in p]
        assert len(fetched) == 2  # its envelope and its content
        calls.clear()
        assert ro.entry(eid).id == eid
        assert not [p for p in calls if "/objects/" in p]


def test_many_objects_are_read_in_batches_and_one_missing_is_named(served, token):
    """An export over HTTP reads its objects a batch at a time (``POST /v1/objects/read``),
    not a GET each: the same bytes for a fraction of the requests."""
    with open_store(served.url) as st:
        s = st.create(Header.new("chat-5"))
        for i in range(40):
            s.append(_msg(f"turn {i}"))
    with open_store(served.url, readonly=True) as ro:
        calls: list[str] = []
        ro.backend.http._http.event_hooks["request"].append(lambda request: calls.append(request.url.path))  # type: ignore[attr-defined]
        exported = ro.export("chat-5")
        assert len(exported.splitlines()) == 41
        assert not [p for p in calls if "/objects/entries/" in p or "/objects/contents/" in p]
        assert 1 <= len([p for p in calls if p.endswith("/objects/read")]) <= 4
        absent = "sha256:" + "0" * 64
        with pytest.raises(NoSuchObjectError, match=f"no contents object {absent}"):
            ro.objects.get_many("contents", [absent, "sha256:" + "1" * 64])
    with open_store(served.url, readonly=True) as ro:
        assert ro.export("chat-5") == exported  # read again, uncached


def test_grep_over_http_reads_the_entries_in_batches(served, token):
    """A store over HTTP cannot be scanned, so grep reads every entry: a chunk at a time in
    batch reads, not a GET an object."""
    from agentsession_cas.store.views import grep_store

    with open_store(served.url) as st:
        s = st.create(Header.new("chat-6"))
        for i in range(30):
            s.append(_msg(f"needle {i}" if i % 10 == 3 else f"hay {i}"))
    with open_store(served.url, readonly=True) as ro:
        calls: list[str] = []
        ro.backend.http._http.event_hooks["request"].append(lambda request: calls.append(request.url.path))  # type: ignore[attr-defined]
        import re

        found = [m.text for m in grep_store(ro, ["chat-6"], re.compile("needle"))]
        assert found == ["needle 3", "needle 13", "needle 23"]
        assert not [p for p in calls if "/objects/entries/" in p or "/objects/contents/" in p]


def test_refs_compare_and_swap_over_http(served, token):
    """A ref change sends what was read as ``expected``: two clients that both saw the ref
    absent cannot both create it."""
    with open_store(served.url) as st:
        st.create(Header.new("chat-5")).close()
        st.create(Header.new("chat-6")).close()
        Refs(st).update("conv/x", "chat-5", expected=None)
        assert Refs(st).resolve("conv/x") == "chat-5"
        with pytest.raises(Exception) as ei:
            Refs(st).update("conv/x", "chat-6", expected=None)
        assert ei.value.code == "ref_moved"  # type: ignore[attr-defined]
        Refs(st).update("conv/x", "chat-6", expected="chat-5")
        assert Refs(st).resolve("conv/x") == "chat-6"


def test_tokens_and_scopes_apply(served, monkeypatch, tmp_path):
    """No token is 401 ``auth`` at open; a read-only token reads and cannot write."""
    monkeypatch.delenv("AGENTSESSION_TOKEN", raising=False)
    monkeypatch.setenv("AGENTSESSION_REMOTES", str(tmp_path / "no-remotes.json"))
    with pytest.raises(AuthError):
        open_store(served.url)
    monkeypatch.setenv("AGENTSESSION_TOKEN", TOKENS["all"][0])
    with open_store(served.url) as st:
        st.create(Header.new("chat-7")).append(_msg("x"))
    monkeypatch.setenv("AGENTSESSION_TOKEN", TOKENS["reader"][0])
    with open_store(served.url) as st:
        assert st.list() == ["chat-7"]
        with pytest.raises(ScopeError):
            st.session("chat-7")


def test_a_refused_head_is_the_error_its_status_says(served, monkeypatch, tmp_path):
    """An object's ``exists`` is a HEAD, whose answer has no problem body: a token without
    the scope got TransportError ("without a problem body"), not the ScopeError a GET's
    403 gives."""
    monkeypatch.setenv("AGENTSESSION_REMOTES", str(tmp_path / "no-remotes.json"))
    monkeypatch.setenv("AGENTSESSION_TOKEN", TOKENS["all"][0])
    with open_store(served.url) as st:
        entry = st.create(Header.new("chat-h")).append(_msg("x")).id
    monkeypatch.setenv("AGENTSESSION_TOKEN", TOKENS["nobody"][0])
    with open_store(served.url) as st, pytest.raises(ScopeError):
        st.objects.exists("entries", entry)


@pytest.mark.parametrize("status, error", [(401, "AuthError"), (403, "ScopeError"), (501, "UnsupportedError")])
def test_a_bodiless_answer_to_a_head_is_the_error_its_status_names(status, error):
    """RFC 0003 gives each of these statuses one code, so a HEAD's answer (no problem body)
    says its error by its status alone: a 501 (a server that offers no objects) was a
    TransportError where the same answer to a GET is UnsupportedError. Any other status
    without a body stays a TransportError."""
    import httpx

    from agentsession_cas import errors as E
    from agentsession_cas.exchange.http_client import HttpTransport

    def answering(code: int) -> HttpTransport:
        t = HttpTransport("http://example.invalid/", token="x")
        t._http = httpx.Client(base_url=t.url + "v1", transport=httpx.MockTransport(lambda req: httpx.Response(code)))
        return t

    name = "/objects/entries/sha256:" + "0" * 64
    with pytest.raises(getattr(E, error)) as caught:
        answering(status).request("HEAD", name, safe=True, ok=(404,))
    assert f"HTTP {status} to a HEAD" in str(caught.value)
    with pytest.raises(E.TransportError):
        answering(502).request("HEAD", name, safe=True, ok=(404,))


def test_what_the_protocol_does_not_carry_is_refused(served, token):
    """Sweep and listing objects are the server's maintenance: ``unsupported``, and the
    store is left as it was."""
    with open_store(served.url) as st:
        st.create(Header.new("chat-8")).append(_msg("x"))
        with pytest.raises(UnsupportedError):
            st.sweep(grace=0, force=True)
        with pytest.raises(UnsupportedError):
            list(st.objects.names("entries"))
        assert len(st.read("chat-8")) == 1


def test_a_refused_delete_of_a_held_mirror_leaves_the_handle_held(served, token):
    """RFC 0003: a mirror is never leased, so a client's delete of one is refused
    (``mirror``); the refusal changes nothing, the client's handle on it included (it
    was closed and forgotten before the server answered; the model test found it)."""
    with open_store(served.url) as st:
        st.create(Header.new("chat-m"), record=False)
        held = st.session("chat-m")
        with pytest.raises(MirrorError):
            st.delete("chat-m")
        assert st.opened("chat-m") is held and not held.closed
        assert st.list() == ["chat-m"]
        held.close()
    with open_store(served.url) as st:  # a record's held handle is deleted as before
        s = st.create(Header.new("chat-r"))
        s.append(_msg("x"))
        st.delete("chat-r")
        assert st.opened("chat-r") is None and s.closed and "chat-r" not in st.list()


def test_no_server_there_is_refused(tmp_path):
    """A URL where no server answers is refused at open, as a directory with no store is."""
    with pytest.raises(TransportError):
        open_store("http://127.0.0.1:9/")


def test_the_command_takes_an_http_store(served, token, tmp_path):
    """``--store URL`` and ``AGENTSESSION_STORE`` name a served store to the command."""
    env = dict(os.environ, AGENTSESSION_TOKEN=token)

    def run(*args: str, stdin: str | None = None, store: bool = True) -> subprocess.CompletedProcess[str]:
        pre = ["--store", served.url] if store else []
        return subprocess.run([sys.executable, "-m", "agentsession_cas", *pre, *args], input=stdin, text=True,
                              capture_output=True, env=env, timeout=120)

    with open_store(served.url) as st:
        st.create(Header.new("chat-9")).close()
    r = run("append", "chat-9", stdin=json.dumps(_msg("from the command")))
    assert r.returncode == 0, r.stderr
    eid = r.stdout.strip()
    env["AGENTSESSION_STORE"] = served.url
    r = run("head", "chat-9", store=False)
    assert r.returncode == 0 and eid in r.stdout, r.stderr
    r = run("export", "chat-9", store=False)
    assert r.returncode == 0 and "from the command" in r.stdout, r.stderr


def test_the_server_side_log_matches_the_clients_records(served, token):
    """The records a client replays (from the log read) give the state the server holds:
    head, order, leaf labels and what is committed."""
    with open_store(served.url, sync="never") as st:
        s = st.create(Header.new("chat-10"))
        a = s.append(_msg("a")).id
        b = s.append(_msg("b")).id
        s.set_head(a, expected=b)
        c = s.append(_msg("c"), durable=False).id
        snap = st.read("chat-10")
        assert (snap.head, snap.log_order) == (c, [a, b, c])
        assert snap.is_committed(b) and not snap.is_committed(c)
        s.commit()
        assert st.read("chat-10").is_committed(c)


def _posts(st) -> list[str]:
    """A list that fills with the paths of the appends the handle sends from now on."""
    calls: list[str] = []
    http = st.backend.http._http
    http.event_hooks["request"].append(
        lambda request: calls.append(request.url.params.get("commit", "")) if request.url.path.endswith("/entries") else None
    )
    return calls


def test_lazy_appends_are_held_and_sent_in_one_batch(served, token, monkeypatch):
    """With ``sync="never"`` a writer holds its lazy appends and sends them together, one
    ``POST …/entries`` of several lines (RFC 0003's batch form): another client sees them
    once sent; the writer's own read of the session sends them first."""
    monkeypatch.setattr(remote, "FLUSH_DELAY_S", 3600.0)  # only what the test does sends them
    with open_store(served.url, sync="never") as st, open_store(served.url, readonly=True) as other:
        posts = _posts(st)
        s = st.create(Header.new("batch-1"))
        results = [s.append(_msg(f"m{i}")) for i in range(4)]
        assert not any(r.durable for r in results) and posts == []
        ids = [r.id for r in results]
        assert len(other.read("batch-1")) == 0  # held by the writer: not on the server yet
        assert st.read("batch-1").log_order == ids  # the writer's backend sends before it reads
        assert posts == ["false"]
        snap = other.read("batch-1")
        assert snap.log_order == ids and not snap.is_committed(ids[-1])
        s.commit()
        assert other.read("batch-1").is_committed(ids[-1])


def test_a_full_batch_a_durable_append_and_a_commit_send_what_is_held(served, token, monkeypatch):
    monkeypatch.setattr(remote, "FLUSH_DELAY_S", 3600.0)
    monkeypatch.setattr(remote, "BATCH_ENTRIES", 4)
    with open_store(served.url, sync="never") as st, open_store(served.url, readonly=True) as other:
        posts = _posts(st)
        s = st.create(Header.new("batch-2"))
        ids = [s.append(_msg(f"m{i}")).id for i in range(6)]
        assert posts == ["false"] and other.read("batch-2").log_order == ids[:4]  # the full batch went
        durable = s.append(_msg("durable"), durable=True)
        assert durable.durable and posts == ["false", "true"]  # the two held, then it, one request
        snap = other.read("batch-2")
        assert snap.log_order == [*ids, durable.id] and snap.is_committed(durable.id)
        s.append(_msg("lazy again"))
        s.commit()
        assert posts == ["false", "true", "true"] and len(other.read("batch-2")) == 8


def test_a_held_append_is_sent_soon_without_another_call(served, token):
    """The backend's flusher sends what a writer holds after a short delay, so a follower
    sees a lazy append though its writer does nothing more (the read blocks until the
    server sends the frame: no sleeping)."""
    with open_store(served.url, sync="never") as st, served.client("all") as f:
        s = st.create(Header.new("batch-4"))
        s.append(_msg("first"), durable=True)
        with f.stream("GET", "/v1/sessions/batch-4/follow", headers={"Accept": "application/x-ndjson"}) as r:
            events = (json.loads(line) for line in r.iter_lines() if line.strip())
            assert next(events)["event"] == "snapshot"
            lazy = s.append(_msg("lazy"))
            ev = next(events)
            assert ev["event"] == "appended" and ev["data"]["entry"] == lazy.id and ev["data"]["durable"] is False


def test_held_appends_the_server_refuses_are_reported_not_lost(served, token, monkeypatch):
    """Lazy appends held when the lease is broken: the call that sends them raises
    ``lease_lost`` naming what was not stored, and so does every later call of the
    session (close included); the server holds what it acknowledged before."""
    monkeypatch.setattr(remote, "FLUSH_DELAY_S", 3600.0)
    with open_store(served.url, sync="never") as st:
        s = st.create(Header.new("batch-3"))
        first = s.append(_msg("durable"), durable=True).id
        s.append(_msg("held"))
        with served.client("all") as c:
            assert c.post("/v1/sessions/batch-3/lease/break").json()["broken"] is True
        with pytest.raises(LeaseLostError, match="1 append.* were sent and 0 stored"):
            s.commit()
        with pytest.raises(LeaseLostError):
            s.append(_msg("after"))
        with pytest.raises(LeaseLostError):
            s.close()
    with open_store(served.url, readonly=True) as ro:
        assert ro.read("batch-3").log_order == [first]


def test_a_failure_of_the_flusher_is_raised_at_the_next_call(served, token, monkeypatch):
    monkeypatch.setattr(remote, "FLUSH_DELAY_S", 3600.0)
    with open_store(served.url, sync="never") as st:
        s = st.create(Header.new("batch-5"))
        s.append(_msg("held"))
        with served.client("all") as c:
            c.post("/v1/sessions/batch-5/lease/break").raise_for_status()
        s.log._flush_due()  # what the flusher does once the delay has passed: it keeps the failure
        with pytest.raises(LeaseLostError, match="were sent and 0 stored"):
            s.append(_msg("next"))
        with pytest.raises(LeaseLostError):
            s.close()


def test_an_append_and_a_head_move_whose_answers_were_lost_land_once(served, token):
    """RFC 0003, Conventions, Retries: a client that does not know whether a write landed
    retries it, and the server returns the first outcome for a repeated Idempotency-Key.
    The HTTP store sent appends and head moves bare and never again, so a dropped answer
    (the server had acted) was an error to the caller, and the handle stopped, though the
    write had landed. Now each carries a key and is sent again: the append is in the log
    once, with its first outcome, and the head move's retry is its first success, not
    `head_moved`."""
    from test_server_exchange import DroppingProxy

    with open_store(served.url) as st:
        st.create(Header.new("chat-r")).close()

    def through(marker: bytes, work):
        proxy = DroppingProxy(served.url, marker)
        try:
            with open_store(proxy.url) as st, st.session("chat-r") as s:
                out = work(s)
        finally:
            proxy.close()
        assert proxy.dropped == 1
        return out

    a, b = through(b"POST /v1/sessions/chat-r/entries?", lambda s: [s.append(_msg(m)).id for m in ("a", "b")])
    c = through(b"PUT /v1/sessions/chat-r/head HTTP/1.1",
                lambda s: (s.set_head(a, expected=b), s.append(_msg("c")).id)[1])
    with served.client("all") as http:
        log = [json.loads(x) for x in http.get("/v1/sessions/chat-r/log").text.splitlines()][:-1]
        facts = http.get("/v1/sessions/chat-r").json()
    assert [(x.get("entry"), x.get("outcome"), x["head"]) for x in log] == [
        (a, "continued", a), (b, "continued", b), (None, None, a), (c, "continued", c)]
    assert facts["head"] == c and facts["length"] == 3


@contextmanager
def _flusher_waiting_to_retry(st, monkeypatch) -> Iterator[threading.Event]:
    """The next batch the backend's flusher sends gets no answer, and the flusher's wait
    before sending it again lasts until the event yielded is set (no clock: the wait is
    held open, as a server's long Retry-After would hold it)."""
    waiting, go = threading.Event(), threading.Event()
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if threading.current_thread().name != "agentsession-remote-flush":
            return real_sleep(seconds)
        waiting.set()
        assert go.wait(60)

    monkeypatch.setattr(time, "sleep", sleep)
    st.backend.http.sleep = sleep
    client = st.backend.http._http
    send = client.request
    dropped: list[str] = []

    def drop_once(method, url, **kwargs):
        if method == "POST" and str(url).endswith("/entries") and not dropped:
            dropped.append(str(url))
            raise httpx.ConnectError("dropped before it was sent")
        return send(method, url, **kwargs)

    monkeypatch.setattr(client, "request", drop_once)
    try:
        yield waiting
    finally:
        go.set()


def _answered_at_once(call) -> list:
    """``call``'s result, run in a thread that must be done long before the flusher's wait
    ends (it ends only when the test says)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(call()))
    t.start()
    t.join(20)
    assert out, "the call waited for the flusher's retry"
    return out


def test_a_lazy_append_is_answered_while_the_flusher_waits_to_send_a_batch_again(served, token, monkeypatch):
    """The flusher sent a handle's held appends, and waited before each retry, with the
    handle's lock held: the writer's next lazy append, which is answered at once by the
    rule set, waited for the whole retry (up to a server's Retry-After within the
    client's bound, a minute by default). Now only sends wait for sends (the server
    must see the log in order); a lazy append is held meanwhile and goes after them."""
    with open_store(served.url, sync="never") as st:
        s = st.create(Header.new("batch-6"))
        with _flusher_waiting_to_retry(st, monkeypatch) as waiting:
            first = s.append(_msg("first"))
            assert waiting.wait(60)  # the flusher took "first", lost its answer, and waits
            (second,) = _answered_at_once(lambda: s.append(_msg("second")))
            assert not second.durable
        s.commit()  # after the flusher's batch has landed, then "second"
    with open_store(served.url, readonly=True) as ro:
        snap = ro.read("batch-6")
        assert snap.log_order == [first.id, second.id] and snap.is_committed(second.id)


def test_appends_held_while_a_failing_batch_waited_are_named_by_its_failure(served, token, monkeypatch):
    """When the batch the flusher was sending fails (here its lease was broken while it
    waited to send it again), the appends answered meanwhile are never sent: the
    handle's failure says how many, at its next call and every later one."""
    with open_store(served.url, sync="never") as st:
        s = st.create(Header.new("batch-7"))
        with _flusher_waiting_to_retry(st, monkeypatch) as waiting:
            s.append(_msg("first"))
            assert waiting.wait(60)
            _answered_at_once(lambda: s.append(_msg("second")))
            with served.client("all") as c:
                c.post("/v1/sessions/batch-7/lease/break").raise_for_status()
        with pytest.raises(LeaseLostError, match=r"1 append\(s\) .* were sent and 0 stored, and 1 held since was not sent"):
            s.commit()
        with pytest.raises(LeaseLostError):
            s.close()
    with open_store(served.url, readonly=True) as ro:
        assert len(ro.read("batch-7")) == 0


@contextmanager
def _answer_held_back(st, monkeypatch, session: str) -> Iterator[threading.Event]:
    """The server's answer to the next batch of ``session``'s appends is held back until
    the block ends (the request waits on an event: no clock); the event yielded is set
    once that batch was sent."""
    held, go = threading.Event(), threading.Event()
    client = st.backend.http._http
    send = client.request

    def hold(method, url, **kwargs):
        response = send(method, url, **kwargs)
        if method == "POST" and str(url).endswith(f"/sessions/{session}/entries") and not held.is_set():
            held.set()
            assert go.wait(60)
        return response

    monkeypatch.setattr(client, "request", hold)
    try:
        yield held
    finally:
        go.set()


@pytest.mark.parametrize("how", ["answer held back", "waiting to send it again"])
def test_a_batch_held_up_does_not_hold_up_another_sessions(served, token, monkeypatch, how):
    """The backend's flusher sent each due handle's batch in turn on its one thread, so
    while one session's batch waited (for an answer, or to be sent again: a server's
    Retry-After, up to the client's bound, a minute by default) every other session's
    held appends waited behind it. Now each due handle's batch is sent on a task of its
    own: the other session's batch reaches the server meanwhile, and the held-up one
    lands after, in its log's order."""
    with open_store(served.url, sync="never") as st, served.client("all") as c:
        a, b = st.create(Header.new("flush-a")), st.create(Header.new("flush-b"))
        b_sent = threading.Event()  # set by the hook once b's batch has its answer
        st.backend.http._http.event_hooks["response"].append(
            lambda response: b_sent.set() if response.request.url.path.endswith("/flush-b/entries") else None)
        hold = (_answer_held_back(st, monkeypatch, "flush-a") if how == "answer held back"
                else _flusher_waiting_to_retry(st, monkeypatch))
        with hold as held:
            a1 = a.append(_msg("a1"))
            assert held.wait(60)  # the flusher took a's batch, and it is held up
            a2 = a.append(_msg("a2"))  # (held for a's next batch)
            b1 = b.append(_msg("b1"))  # due in 5 ms, sent by the flusher alone
            assert b_sent.wait(30), "b's batch waited behind a's"
            log = [json.loads(line) for line in c.get("/v1/sessions/flush-b/log").text.splitlines()]
            assert [x["entry"] for x in log if "entry" in x] == [b1.id]
            # a, due again, is not given to a second worker (it would wait there for the
            # first): the workers are the one held up and two idle, however many appends
            b_sent.clear()
            for n in range(3):
                a.append(_msg(f"a{n + 3}"))
                b.append(_msg(f"b{n + 2}"))
                assert b_sent.wait(30)
                b_sent.clear()
            assert len(st.backend.flusher._workers) <= 3
        a.commit()
        b.commit()
    with open_store(served.url, readonly=True) as ro:
        assert ro.read("flush-a").log_order[:2] == [a1.id, a2.id] and ro.read("flush-b").log_order[0] == b1.id
        assert (len(ro.read("flush-a")), len(ro.read("flush-b"))) == (5, 4)
