"""RFC 0003 conformance points a review found untested or broken (session 33): each test
names the RFC's words it holds the server to. A real server per test, as in
tests/test_server.py; nothing is mocked at the HTTP layer.
"""

from __future__ import annotations

from agentsession_cas import Header
from server_helpers import served as served  # a fixture; "as served" marks it used on purpose (F401, F811)
from test_server import append, create, lease, lines, problem, user

TS = "2026-09-17T12:00:00Z"


def _push(c, sid: str, refs: list[dict]):
    """A push of an empty session (header only) carrying ``refs``."""
    return c.post(f"/v1/sessions/{sid}/push", json={
        "header": Header.new(sid, created_at=TS).data, "entries": [], "prefix": [],
        "head": {"expected": None, "to": None}, "mark": "mirror", "refs": refs,
    })


def test_a_ref_held_for_another_tenants_session_is_neither_shown_nor_moved(served):
    """Security considerations: knowing a name is not authorization. A ref a caller may not
    read resolves as no_ref; an update or a push's ref step must neither tell it the
    target nor move the ref off a session it may not touch (a push named it `expected`
    and moved team-b's ref to team-a's session)."""
    with served.client("team-b") as b:
        create(b, "b-1")
        assert b.put("/v1/refs/shared/x", json={"expected": None, "next": "b-1"}).status_code == 200
    with served.client("team-a") as a:
        create(a, "a-1")
        problem(a.get("/v1/refs/shared/x"), 404, "no_ref")
        # An update: refused, and the answer does not name the target.
        r = a.put("/v1/refs/shared/x", json={"expected": None, "next": "a-1"})
        problem(r, 403, "scope")
        assert "b-1" not in r.text
        # A push's ref step: refused in the 200, the target withheld.
        r = _push(a, "a-2", [{"name": "shared/x", "expected": None, "next": "a-2"}])
        assert r.status_code == 200, r.text
        assert "b-1" not in r.text
        (ref,) = r.json()["refs"]
        assert ref["moved"] is False and ref["current"] is None and ref["why"]
        # A push naming the other tenant's session as `expected` is refused whole, as an
        # update naming it is, before anything lands.
        r = _push(a, "a-3", [{"name": "shared/x", "expected": "b-1", "next": "a-3"}])
        problem(r, 403, "scope")
        problem(a.get("/v1/sessions/a-3"), 404, "no_session")
    with served.client("team-b") as b:
        assert b.get("/v1/refs/shared/x").json()["target"]["session"] == "b-1"


def test_the_log_and_the_path_carry_the_incarnation_header(served):
    """Conventions: "Every response about one session carries its incarnation (an
    `Incarnation` header, and a member in JSON bodies)"."""
    with served.client("all") as c:
        ident = create(c, "s1")["incarnation"]
        token = lease(c, "s1")["token"]
        assert append(c, "s1", token, user("hi"), commit=True).status_code == 200
        for path in ("/v1/sessions/s1/log", "/v1/sessions/s1/log?durable=true", "/v1/sessions/s1/path",
                     "/v1/sessions/s1/path?contents=none"):
            r = c.get(path)
            lines(r)
            assert r.headers.get("incarnation") == ident, path


def test_a_create_refused_for_its_lease_ttl_creates_nothing(served):
    """Sessions, Create: a refused create lands nothing (a bad `lease_ttl_ms` was refused
    400 after the session had been created, so its retry found it made and unleased)."""
    with served.client("all") as c:
        r = c.post("/v1/sessions?lease_ttl_ms=soon", json=Header.new("s1", created_at=TS).data)
        problem(r, 400, "store_fault")
        problem(c.get("/v1/sessions/s1"), 404, "no_session")
        r = c.post("/v1/sessions?lease_ttl_ms=60000", json=Header.new("s1", created_at=TS).data)
        assert r.status_code == 201 and r.json()["lease"]["token"] >= 1, r.text


def test_a_head_compare_and_swap_that_fails_names_the_current_head(served):
    """Writing, Head: "It is `head_moved` with the current head on a mismatch" (the body
    carried it only in its prose)."""
    with served.client("all") as c:
        create(c, "s1")
        token = lease(c, "s1")["token"]
        head = append(c, "s1", token, user("hi"), commit=True).json()["head"]
        r = c.put("/v1/sessions/s1/head", json={"expected": None, "to": head}, headers={"Lease-Token": str(token)})
        assert problem(r, 409, "head_moved")["current"] == head
        r = c.put("/v1/sessions/s1/head", json={"expected": head, "to": None}, headers={"Lease-Token": str(token)})
        assert r.status_code == 200, r.text
        r = c.put("/v1/sessions/s1/head", json={"expected": head, "to": head}, headers={"Lease-Token": str(token)})
        body = problem(r, 409, "head_moved")
        assert "current" in body and body["current"] is None
        # Writing, Record: a declare-record whose head is not this server's is head_moved,
        # and says the head it holds.
        assert _push(c, "m1", []).json()["mark"] == "mirror"
        r = c.post("/v1/sessions/m1/record", json={"basis": "sole_copy", "head": head})
        body = problem(r, 409, "head_moved")
        assert "current" in body and body["current"] is None


def test_head_moved_carries_the_current_head_across_the_wire_and_back():
    """The client rebuilds `current` from the problem body, and the exchange's own
    head_moved refusals (declare-record, take-back) say it too."""
    from agentsession_cas.errors import HeadMovedError
    from agentsession_cas.exchange.wire import error_from_problem, problem_body

    for current in ("sha256:" + "a" * 64, None):
        body = problem_body(HeadMovedError("moved", current=current))
        assert body["code"] == "head_moved" and body["current"] == current
        back = error_from_problem(409, body, where="remote x")
        assert isinstance(back, HeadMovedError) and back.knows_current and back.current == current
    # Raised without it (the store's own compare-and-swap), the body says nothing of it.
    assert "current" not in problem_body(HeadMovedError("moved"))
    assert not error_from_problem(409, problem_body(HeadMovedError("moved")), where="remote x").knows_current


def test_a_listing_filters_and_orders_as_the_librarys_list_does(tmp_path):
    """Sessions, List: "the reference library's summaries ... newest first", the filter
    matching "as the library does" (Non-goals: "Listing is the reference library's
    `List` with its filter"). The server kept a second copy of the rules: it ordered by
    `created_at` as a string, compared `after`/`before` with `created_at` as strings
    ("12:00:00Z" sorts after "12:00:00.5Z"), matched `cwd` exactly and `harness` by name
    only. Now the answer is store.summary.select's, the one rule `agentsession list` uses."""
    from agentsession_cas.store import Store
    from agentsession_cas.store.summary import select
    from server_helpers import ServerProcess

    st = Store.init(tmp_path / "st")
    # Created in one order, active in another; one continued in a successor.
    specs = [("s-a", "2026-09-17T12:00:00.5Z", "/w", "h", "2026-09-20T08:00:00Z"),
             ("s-b", "2026-09-17T12:00:00Z", "/w/sub", "h", "2026-09-18T08:00:00Z"),
             ("s-c", "2026-09-19T00:00:00Z", "/x", "other", None),
             ("s-d", "2026-09-16T00:00:00Z", "/w", "h", "2026-09-21T00:00:00Z")]
    for sid, created, cwd, harness, active in specs:
        s = st.create(Header.new(sid, created_at=created, cwd=cwd, harness={"name": harness, "version": "1"}))
        if active is not None:
            s.append({"type": "config", "ts": active, "model": "m"})
        s.close()
    s = st.open("s-b")
    s.append({"type": "link", "ts": "2026-09-18T08:00:00Z", "rel": "continued_in", "session": "s-a"})
    s.close()
    summaries = [st.summary(sid) for sid in st.list()]
    st.close()
    asks = [{}, {"cwd": "/w"}, {"harness": "h"}, {"harness": "h 1"}, {"after": "2026-09-18T00:00:00Z"},
            {"before": "2026-09-19T00:00:00Z"}, {"after": "2026-09-17T12:00:00.5Z", "before": "2026-09-20T09:00:00Z"},
            {"after": "2026-09-18T02:00:00+02:00"}, {"current": "true"}, {"limit": "2"}]
    with ServerProcess(tmp_path / "st") as server, server.client() as c:
        for ask in asks:
            got = [x["id"] for x in lines(c.get("/v1/sessions", params=ask))[:-1]]
            kw = {k: v for k, v in ask.items() if k in ("cwd", "harness")}
            for k in ("after", "before"):
                if k in ask:
                    kw[k] = {"2026-09-18T02:00:00+02:00": "2026-09-18T00:00:00Z"}.get(ask[k], ask[k])
            want = [x.id for x in select(summaries, **kw, current="current" in ask,
                                         limit=int(ask["limit"]) if "limit" in ask else None)]
            assert got == want, (ask, got, want)
        named = {x["id"]: x for x in lines(c.get("/v1/sessions", params={"with_names": "true"}))[:-1]}
        assert named["s-b"]["superseded_by"] == "s-a" and named["s-a"]["superseded_by"] is None
        problem(c.get("/v1/sessions", params={"after": "yesterday"}), 400, "store_fault")


def test_a_refusal_the_client_raises_names_the_remote_and_the_code(served):
    """Errors: "A client branches on `code`" and a person reads the message: every
    problem the HTTP client raises says which remote answered and its code (a fetch of
    a session the server lacks read `no such session: x`, as a local miss does)."""
    from agentsession_cas.errors import NoSuchSessionError, ScopeError
    from agentsession_cas.exchange.http_client import HttpTransport
    from server_helpers import TOKENS

    with HttpTransport(served.url, token=TOKENS["team-a"][0]) as http:
        for sid, cls, code in (("a-none", NoSuchSessionError, "no_session"), ("b-1", ScopeError, "scope")):
            try:
                http.session_view(sid)
            except cls as exc:
                assert served.url in str(exc) and code in str(exc), str(exc)
                assert exc.code == code
            else:
                raise AssertionError(f"{sid}: no error")


def test_an_append_or_a_head_move_on_a_mirror_is_mirror_not_lease_lost(served):
    """Writing, Append: refusals are ... "`mirror` on a session held as a mirror"; Errors:
    `mirror` is "a local append, head move or mark change on a mirror". A mirror cannot be
    leased, so the fence answered first and every such write read `lease_lost`, which
    tells a writer to acquire again (it never can) rather than that the record is
    elsewhere."""
    with served.client("all") as c:
        assert _push(c, "m1", []).json()["mark"] == "mirror"
        problem(c.post("/v1/sessions/m1/lease", json={"ttl_ms": 1000}), 409, "mirror")
        r = c.post("/v1/sessions/m1/entries", content=b'{"type":"config","model":"m"}\n', headers={"Lease-Token": "1"})
        problem(r, 409, "mirror")
        r = c.put("/v1/sessions/m1/head", json={"expected": None, "to": None}, headers={"Lease-Token": "1"})
        problem(r, 409, "mirror")


def test_a_lease_whose_answer_was_lost_is_asked_again_under_its_key(served, tmp_path, monkeypatch):
    """Conventions, Retries: a write that is not idempotent by hash takes an
    `Idempotency-Key`, and the server returns the first outcome for a repeated key. An
    acquire is such a write; the HTTP store sent it bare and never again, so a lost
    answer left the session leased to no one who knew the lease (session_locked for 5
    minutes) and the open failed. Now it is sent under a key and asked again."""
    from agentsession_cas.store.url import open_store
    from server_helpers import TOKENS
    from test_server_exchange import DroppingProxy

    monkeypatch.setenv("AGENTSESSION_TOKEN", TOKENS["all"][0])
    with served.client("all") as c:
        create(c, "s1")
    proxy = DroppingProxy(served.url, b"POST /v1/sessions/s1/lease HTTP/1.1")
    try:
        with open_store(proxy.url) as st:
            s = st.session("s1")
            s.append(user("after a lost answer"))
            s.close()
    finally:
        proxy.close()
    assert proxy.dropped == 1
    with served.client("all") as c:
        facts = c.get("/v1/sessions/s1").json()
        assert facts["length"] == 1 and facts["leased"] is False


def test_the_bound_on_remembered_idempotency_keys_is_published(served):
    """Conventions, Retries: the first outcome of a key is kept "for at least the lease's
    longest TTL"; this server also keeps at most a number of them (docs/server.md,
    Limits), and says so in its capabilities, where it said nothing of it."""
    with served.client("all") as c:
        limits = c.get("/v1/").json()["limits"]
    assert limits["idempotency_keys"] >= 1 and limits["idempotency_ttl_ms"] > limits["max_lease_ttl_ms"]


def test_if_incarnation_is_checked_by_a_lease_break_too(served):
    """Conventions: "A request MAY send `If-Incarnation`, and a server MUST refuse with
    `session_replaced` when it differs." Every route about one session checked it but
    `lease/break`, which broke the lease of whatever session held the id."""
    with served.client("all") as c:
        create(c, "s1")
        token = lease(c, "s1")["token"]
        other = "sha256:" + "0" * 64
        r = c.post("/v1/sessions/s1/lease/break", headers={"If-Incarnation": other})
        problem(r, 409, "session_replaced")
        assert c.get("/v1/sessions/s1").json()["leased"] is True
        assert append(c, "s1", token, user("still mine")).status_code == 200
        r = c.post("/v1/sessions/s1/lease/break", headers={"If-Incarnation": r.headers.get("incarnation") or
                                                           c.get("/v1/sessions/s1").json()["incarnation"]})
        assert r.status_code == 200 and r.json()["broken"] is True


def test_a_follow_that_ends_in_an_error_event_raises_the_error_it_carries():
    """Following / Conventions: a failure after the status line is an `error` frame
    carrying the problem body, and a client branches on `code`. The client raised every
    error event as no_session ("gone"), a store fault at the server included."""
    import json as _json

    import pytest

    from agentsession_cas.errors import NoSuchSessionError, StoreError
    from agentsession_cas.exchange.following import follow_remote

    class Fake:
        url = "http://store.example/"

        def __init__(self, problem: dict):
            self.problem = problem

        def stream_lines(self, path, *, params, headers):
            yield _json.dumps({"event": "error", "id": "0-0.0", "data": self.problem})

    fault = {"type": "urn:agentsession:problem:store_fault", "status": 500, "code": "store_fault",
             "library_code": "corrupt", "detail": "object sha256:00 is damaged"}
    with pytest.raises(StoreError) as got:
        list(follow_remote(Fake(fault), "s1"))
    assert not isinstance(got.value, NoSuchSessionError) and got.value.code == "corrupt"
    assert "damaged" in str(got.value) and "http://store.example/" in str(got.value)
    gone = {"status": 404, "code": "no_session", "library_code": "no_session", "detail": "session s1 was deleted"}
    with pytest.raises(NoSuchSessionError, match="deleted"):
        list(follow_remote(Fake(gone), "s1"))


def test_a_header_of_a_format_the_server_does_not_read_is_format(served):
    """Errors: `format` 422 is "a format the server does not read"; Exchange: a push's "format
    it does not read is `format`". A create or push naming a later format answered
    `store_fault` (bad_file), and one before 0.5 (before hashed ids, which no store
    holds) `store_fault` 500, a failure "the client cannot fix"."""
    with served.client("all") as c:
        for fmt in ("agentsession/0.99", "agentsession/1.0", "agentsession/0.4", "garbage"):
            header = dict(Header.new("s1", created_at=TS).data, format=fmt)
            body = problem(c.post("/v1/sessions", json=header), 422, "format")
            assert fmt in body["detail"], body
            r = c.post("/v1/sessions/s1/push", json={"header": header, "entries": [], "prefix": [],
                                                     "head": {"expected": None, "to": None}, "mark": "mirror"})
            assert fmt in problem(r, 422, "format")["detail"]
        problem(c.get("/v1/sessions/s1"), 404, "no_session")


def test_the_client_treats_a_stream_without_its_end_frame_as_cut_never_as_short():
    """Conventions: "A stream that stops without either [an end or an error frame] was
    cut, and a client MUST treat it as an error and never as a short result." (No test
    held the client to it; the server side is held by test_server_reads.)"""
    import httpx
    import pytest

    from agentsession_cas.errors import StoreError, TransportError
    from agentsession_cas.exchange.http_client import HttpTransport

    bodies = {
        "/v1/sessions": b'{"id":"s1"}\n',  # cut: no end frame
        "/v1/refs": b'{"name":"a"}\n{"error":{"status":500,"code":"store_fault","library_code":"corrupt","detail":"bad ref"}}\n',
        "/v1/sessions/s1/log": b'{"seq":1,"entry":"sha256:00","head":null,"cursor":"1-x"}\n',
    }

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=bodies[request.url.path], headers={"Content-Type": "application/x-ndjson"})

    http = HttpTransport("http://store.example/")
    http._http = httpx.Client(base_url=http.url + "v1", transport=httpx.MockTransport(answer))
    with http:
        with pytest.raises(TransportError, match="cut before its end frame"):
            http.ndjson("/sessions")
        with pytest.raises(StoreError, match="bad ref") as got:
            http.ndjson("/refs")
        assert got.value.code == "corrupt"
        with pytest.raises(TransportError, match="cut"):
            http.session_view("s1")


def test_a_lease_ttl_is_capped_and_only_its_lease_id_renews_it(served):
    """Leases: "The server MAY cap `ttl_ms`" (the cap is published, and holds on a renew
    as on an acquire); "a numeric token alone never" renews or releases."""
    with served.client("all") as c:
        cap = c.get("/v1/").json()["limits"]["max_lease_ttl_ms"]
        create(c, "s1")
        r = c.post("/v1/sessions/s1/lease", json={"ttl_ms": cap * 10})
        assert r.status_code == 201 and r.json()["ttl_ms"] == cap
        held = r.json()
        r = c.put("/v1/sessions/s1/lease", headers={"Lease-ID": held["lease_id"]}, json={"ttl_ms": cap * 10})
        assert r.status_code == 200 and r.json()["ttl_ms"] == cap
        problem(c.put("/v1/sessions/s1/lease", headers={"Lease-Token": str(held["token"])}), 409, "lease_lost")
        problem(c.delete("/v1/sessions/s1/lease", headers={"Lease-Token": str(held["token"])}), 409, "lease_lost")
        assert c.get("/v1/sessions/s1").json()["leased"] is True


def test_the_size_a_snapshot_inlines_entries_up_to_is_published(served):
    """Following: a `snapshot` or `reset` carries the entries inline "up to the size a
    server publishes, past which the client reads `path`". The server had such a size
    and did not publish it."""
    with served.client("all") as c:
        limits = c.get("/v1/").json()["limits"]
    assert limits["snapshot_inline_bytes"] > 0


def test_a_fork_whose_base_the_caller_may_not_read_is_no_entry_as_if_it_did_not_exist(served):
    """Sessions, Create: "The base MUST be an entry of a session the caller may read; one
    held elsewhere is `no_entry`, as if it did not exist." (Held by the server; no test
    asked it of another tenant's entry.)"""
    with served.client("team-b") as b:
        create(b, "b-1")
        token = lease(b, "b-1")["token"]
        base = append(b, "b-1", token, user("b's"), commit=True).json()["head"]
    with served.client("team-a") as a:
        held = problem(a.post("/v1/sessions", json=Header.new("a-f", created_at=TS, base=base).data), 404, "no_entry")
        absent = problem(a.post("/v1/sessions", json=Header.new("a-g", created_at=TS, base="sha256:" + "e" * 64).data),
                         404, "no_entry")
        assert held["detail"].replace(base, "X") == absent["detail"].replace("sha256:" + "e" * 64, "X")
        problem(a.get("/v1/sessions/a-f"), 404, "no_session")


# -- session 34: the three deviations docs/server.md listed, closed ----------------------


def _serve_cli(store, *args: str, timeout: float = 30):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "agentsession_cas", "--store", str(store), "serve", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_a_network_listen_without_tls_is_refused_naming_the_flags(tmp_path):
    """Security considerations: "A deployment MUST authenticate and authorize every
    request, over TLS". `serve --auth FILE --listen 0.0.0.0:PORT` served plain HTTP to the
    network; now the library refuses it before binding (insecure_listen), naming the flags
    that make it a deployment the RFC allows."""
    from agentsession_cas.errors import AgentSessionError
    from agentsession_cas.server.auth import load_tokens
    from agentsession_cas.server.run import serve
    from agentsession_cas.store import Store
    from server_helpers import token_file

    tokens = load_tokens(str(token_file(tmp_path)))

    def ready(url: str) -> None:
        raise AssertionError(f"it served plain HTTP at {url}")

    for listen in ("0.0.0.0:0", "[::]:0", "store.example:443"):
        store = Store.init(tmp_path / f"st-{len(listen)}")
        try:
            try:
                serve(store, listen=listen, tokens=tokens, ready=ready)
            except AgentSessionError as exc:
                refusal = exc
            else:
                raise AssertionError("served")
        finally:
            store.close()
        assert refusal.code == "insecure_listen", refusal
        assert "--tls-cert" in str(refusal) and "--behind-tls-proxy" in str(refusal) and listen in str(refusal)
    # The command says so, before it opens the store, and exits non-zero.
    r = _serve_cli(tmp_path / "st-9", "--auth", str(token_file(tmp_path)), "--listen", "0.0.0.0:0")
    assert r.returncode == 1 and "--tls-cert" in r.stderr and "--behind-tls-proxy" in r.stderr, r.stderr


def test_behind_a_tls_proxy_the_operator_says_so_and_the_server_tells(tmp_path):
    """With `--behind-tls-proxy` the operator states that TLS ends at a proxy in front: the
    server listens beyond loopback, and its startup line and capabilities say which mode
    it runs in (`tls`: "proxy"; "none" on loopback; "server" with its own certificate)."""
    from agentsession_cas.store import Store
    from server_helpers import ServerProcess, token_file

    Store.init(tmp_path / "st").close()
    with ServerProcess(tmp_path / "st", auth=token_file(tmp_path),
                       extra=("--listen", "0.0.0.0:0", "--behind-tls-proxy", "--max-idempotency-keys", "7",
                              "--max-idempotency-keys-per-token", "3")) as server:
        with server.client("reader") as c:
            caps = c.get("/v1/").json()
            assert caps["tls"] == "proxy" and caps["limits"]["idempotency_keys"] == 7
            assert caps["limits"]["idempotency_keys_per_token"] == 3
        assert server.url.startswith("http://0.0.0.0:")
    assert b"TLS at a proxy in front" in b"".join(server.stderr)
    with ServerProcess(tmp_path / "st", auth=token_file(tmp_path)) as server, server.client("reader") as c:
        caps = c.get("/v1/").json()
        assert caps["tls"] == "none"
        assert caps["limits"]["idempotency_keys_per_token"] == caps["limits"]["idempotency_keys"] // 4  # the default share
    # The flag does not lift the need for tokens, nor go with a certificate of its own.
    r = _serve_cli(tmp_path / "st", "--listen", "0.0.0.0:0", "--behind-tls-proxy")
    assert r.returncode == 1 and "--auth" in r.stderr
    r = _serve_cli(tmp_path / "st", "--auth", str(token_file(tmp_path)), "--behind-tls-proxy",
                   "--tls-cert", "c.pem", "--tls-key", "k.pem")
    assert r.returncode == 1 and "--behind-tls-proxy" in r.stderr


def test_a_full_idempotency_table_refuses_new_keys_and_forgets_no_live_one(tmp_path):
    """Conventions, Retries: "the server MUST return the first outcome for a repeated key
    for at least the lease's longest TTL". Past its count the table forgot its oldest key
    however young, so a retry of it acted again; now a new key is refused with a
    retryable 503 (store_fault, Retry-After) while every key is live, and a key is
    forgotten only once `idempotency_ttl_ms` has passed."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from agentsession_cas.server.app import Limits, ServerState, create_app
    from agentsession_cas.store import Store

    state = ServerState(Store.init(tmp_path / "srv"), None, Limits(idempotency_keys=2))
    unfilled = {k: v for k, v in Header.new("x", created_at=TS).data.items() if k != "id"}
    with TestClient(create_app(state), base_url="http://testserver/v1") as c:
        def create_keyed(key: str):
            return c.post("/sessions", json=unfilled, headers={"Idempotency-Key": key})

        first = create_keyed("k1")
        assert first.status_code == 201 and create_keyed("k2").status_code == 201
        full = create_keyed("k3")
        problem(full, 503, "store_fault")
        assert int(full.headers["retry-after"]) >= 1 and "idempotency" in full.json()["detail"].lower()
        assert len(lines(c.get("/sessions"))) == 3  # k3 did nothing: two sessions and the end frame
        # The oldest key is still honoured: its retry gets the first answer, not a new session.
        again = create_keyed("k1")
        assert again.status_code == 201 and again.headers["idempotent-replay"] == "true"
        assert again.json()["session"] == first.json()["session"]
        # Once the oldest is past the expiry (aged here, not waited for), a new key is taken.
        oldest = next(iter(state.replies))
        state.replies[oldest].at -= state.limits.idempotency_ttl_ms / 1000 + 1
        assert create_keyed("k3").status_code == 201
        problem(create_keyed("k1"), 503, "store_fault")  # k1 forgotten (not replayed), the table full again
    state.store.close()


def test_one_token_over_its_share_of_idempotency_keys_leaves_the_others_writing(tmp_path):
    """The table of first answers is bounded for all tokens together, and a token that
    filled it refused every other token's keyed writes until its keys expired (20 min).
    Now each token holds at most its share (`idempotency_keys_per_token`): past it, its
    new keys are refused (503 store_fault, Retry-After the seconds until ITS oldest key
    expires, not the table's oldest) while other tokens keep writing, and its own
    retries of a remembered key still get their first answers (RFC 0003, Retries)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from agentsession_cas.server.app import Limits, ServerState, create_app
    from agentsession_cas.server.auth import load_tokens
    from agentsession_cas.store import Store
    from server_helpers import TOKENS, token_file

    limits = Limits(idempotency_keys=5, idempotency_keys_per_token=2)
    state = ServerState(Store.init(tmp_path / "srv"), load_tokens(token_file(tmp_path)), limits)
    ttl = limits.idempotency_ttl_ms / 1000
    with TestClient(create_app(state), base_url="http://testserver/v1") as c:
        def create_keyed(who: str, sid: str, key: str):
            return c.post("/sessions", json=Header.new(sid, created_at=TS).data,
                          headers={"Idempotency-Key": key, "Authorization": f"Bearer {TOKENS[who][0]}"})

        assert c.get("/", headers={"Authorization": f"Bearer {TOKENS['reader'][0]}"}).json()["limits"][
            "idempotency_keys_per_token"] == 2
        # team-b's key is the table's oldest (aged: its Retry-After would be some 200 s).
        assert create_keyed("team-b", "b-1", "k1").status_code == 201
        state.replies[next(iter(state.replies))].at -= ttl - 200
        first = create_keyed("team-a", "a-1", "k1")
        assert first.status_code == 201 and create_keyed("team-a", "a-2", "k2").status_code == 201
        over = create_keyed("team-a", "a-3", "k3")
        problem(over, 503, "store_fault")
        assert ttl - 5 <= int(over.headers["retry-after"]) <= ttl  # team-a's oldest, not team-b's
        assert "team-a" in over.json()["detail"] and "2" in over.json()["detail"]
        assert create_keyed("team-a", "a-1", "k1").headers["idempotent-replay"] == "true"
        # The other tokens keep writing, up to their share and the table's bound.
        assert create_keyed("team-b", "b-2", "k2").status_code == 201
        assert create_keyed("all", "c-1", "k1").status_code == 201
        full = create_keyed("all", "c-2", "k2")  # five keys held: the table is full
        problem(full, 503, "store_fault")
        assert 195 <= int(full.headers["retry-after"]) <= 200  # the table's oldest (team-b's first)
        # Once the keys expire (aged, not waited for), team-a writes again.
        for stored in state.replies.values():
            stored.at -= ttl + 1
        assert create_keyed("team-a", "a-3", "k3").status_code == 201
    state.store.close()
