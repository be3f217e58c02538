"""Exchange over HTTP (RFC 0003): push, fetch, handover, declare-record and take-back with
an ``http://`` remote, from the command line and the library, against a real server;
what a push must upload; forged objects and entries; a dropped connection retried
under its Idempotency-Key.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from agentsession_cas import Header
from agentsession_cas.errors import (
    AuthError,
    HeadMovedError,
    MissingObjectsError,
    NoSuchObjectError,
    NotRecordError,
    ScopeError,
    SessionReplacedError,
    TransportError,
)
from agentsession_cas.exchange import http_client
from agentsession_cas.exchange import operations as ex
from agentsession_cas.exchange.http_client import HttpTransport, http_url, token_for
from agentsession_cas.exchange.recorder import Recorder
from agentsession_cas.format.canonical import canonical_bytes
from agentsession_cas.format.hashing import sha256_ref
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from agentsession_cli.main import main
from server_helpers import TOKENS, ServerProcess, token_file
from server_helpers import served as served  # a fixture; "as served" marks it used on purpose (F401, F811)

TS = "2026-09-17T12:00:00Z"


def user(text: str, n: int = 0) -> dict:
    return {"type": "item", "ts": f"2026-09-17T12:{n // 60 % 60:02d}:{n % 60:02d}Z",
            "item": {"type": "message", "role": "user", "content": text}}


def record(st: Store, sid: str, n: int, **header) -> list[str]:
    s = st.create(Header.new(sid, created_at=TS, **header))
    ids = [s.append({"type": "config", "ts": TS, "model": "m1"}).id]
    ids += [s.append(user(f"{sid} turn {i}", i)).id for i in range(n)]
    return ids


def cli(st: Path, *args: str, token: str | None = "all"):
    env = {"AGENTSESSION_TOKEN": TOKENS[token][0]} if token else {"AGENTSESSION_TOKEN": ""}
    return CliRunner().invoke(main, ["--store", str(st), *args], env=env, catch_exceptions=False)


def ok(result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def test_http_urls_are_normalised():
    assert http_url("HTTP://Example.COM:80") == "http://example.com/"
    assert http_url("https://h:8443/base") == "https://h:8443/base/"
    assert http_url("http://[::1]:9/") == "http://[::1]:9/"
    for bad in ("http:///x", "http://h/?q=1", "http://u:p@h/"):
        with pytest.raises(TransportError):
            http_url(bad)


def test_push_fetch_handover_take_back_over_http_from_the_command_line(served, tmp_path):
    a = tmp_path / "a"
    st = Store.init(a)
    ids = record(st, "s1", 3)
    st.close()
    url = served.url
    out = json.loads(ok(cli(a, "push", "s1", url, "--json")))
    assert out["created"] is True and out["entries"] == 4 and out["head"]["outcome"] == "fast-forward"
    assert out["objects"] == 8 and out["remote"] == url
    with served.client("all") as c:
        facts = c.get("/v1/sessions/s1").json()
        assert facts["mark"] == "mirror" and facts["head"] == ids[-1] and facts["length"] == 4
    # Incremental: only what is new is sent.
    with Store(a) as st:
        new = st.session("s1").append(user("more", 9)).id
    out = json.loads(ok(cli(a, "push", "s1", url, "--json")))
    assert out["objects"] == 2 and out["entries"] == 1 and out["head"]["after"] == new
    again = json.loads(ok(cli(a, "push", "s1", url, "--json")))
    assert again["objects"] == 0 and again["entries"] == 0 and again["head"]["outcome"] == "unchanged"
    # Fetch from the server into a third store: a mirror of the same bytes.
    b = tmp_path / "b"
    Store.init(b).close()
    fetched = json.loads(ok(cli(b, "fetch", "s1", url, "--json")))
    assert fetched["created"] is True and fetched["head"]["after"] == new and fetched["mark"] == "mirror"
    with Store(a) as sa, Store(b) as sb:
        assert sb.export("s1") == sa.export("s1")
    # Hand the record over to the server, then take it back.
    out = ok(cli(a, "handover", "s1", url))
    assert "the remote is now the record of s1" in out
    with served.client("all") as c:
        assert c.get("/v1/sessions/s1").json()["mark"] == "record"
    r = cli(a, "push", "s1", url)
    assert r.exit_code == 1 and "mirror" in r.stderr
    out = ok(cli(a, "take-back", "s1", url))
    assert "this store is now the record of s1" in out
    with served.client("all") as c:
        assert c.get("/v1/sessions/s1").json()["mark"] == "mirror"
    # The server is a mirror again: declare-record there (its record is gone, say).
    out = json.loads(ok(cli(a, "declare-record", "s1", "--remote", url, "--json")))
    assert out["changed"] is True and out["mark"] == "record"
    r = cli(a, "declare-record", "s1", "--remote", url, "--expect", "")
    assert r.exit_code == 0  # already the record: nothing to declare
    served.stop()
    with Store(served.store) as st:
        assert fsck(st).ok


def test_tokens_and_scopes_reach_the_command_line(served, tmp_path):
    a = tmp_path / "a"
    st = Store.init(a)
    record(st, "s1", 1)
    st.close()
    r = cli(a, "push", "s1", served.url, token=None)
    assert r.exit_code == 1 and "bearer token" in r.stderr
    r = cli(a, "push", "s1", served.url, token="reader")
    assert r.exit_code == 1 and "'exchange' scope" in r.stderr
    r = cli(a, "push", "s1", served.url, "--json", token="reader")
    assert json.loads(r.stderr)["error"]["code"] == "scope"
    r = cli(a, "push", "s1", served.url, "--ref", "x/y", token="pusher")
    assert r.exit_code == 1 and "no such ref here" in r.stderr
    with Store(a) as st:
        from agentsession_cas.store.refs import Refs

        Refs(st).update("x/y", "s1", expected=None)
    r = cli(a, "push", "s1", served.url, "--ref", "x/y", token="pusher")
    assert r.exit_code == 1 and "'refs' scope" in r.stderr
    with pytest.raises(AuthError):
        HttpTransport(served.url, token="wrong-token-0000000000").missing({"entries": []})
    with pytest.raises(ScopeError):
        HttpTransport(served.url, token=TOKENS["reader"][0]).put_objects([("contents", sha256_ref(b"{}"), b"{}")], 1)


def test_a_push_uploads_what_the_caller_may_not_read_even_when_the_server_holds_it(served, tmp_path):
    a = Store.init(tmp_path / "a")
    record(a, "a-1", 2)
    record(a, "b-1", 2)  # its config entry is a-1's (same bytes, same hash)
    record(a, "a-2", 2)
    a.close()
    first = ex.push(Store(tmp_path / "a"), HttpTransport(served.url, token=TOKENS["team-a"][0]), "a-1")
    assert first.objects == 6
    # Team b cannot read a-1: the shared config is reported missing to it, and uploaded.
    other = ex.push(Store(tmp_path / "a"), HttpTransport(served.url, token=TOKENS["team-b"][0]), "b-1")
    assert other.objects == 6
    # Team a can: the shared config is not sent again.
    again = ex.push(Store(tmp_path / "a"), HttpTransport(served.url, token=TOKENS["team-a"][0]), "a-2")
    assert again.objects == 4


def test_a_push_naming_an_object_it_did_not_upload_and_may_not_read_is_missing_object(served, tmp_path):
    a = Store.init(tmp_path / "a")
    ids = record(a, "a-1", 1)
    header = dict(a.header("a-1").data)
    a.close()
    ex.push(Store(tmp_path / "a"), HttpTransport(served.url, token=TOKENS["team-a"][0]), "a-1")
    # Team b names a-1's entries in a push of its own session, uploading nothing.
    forged = dict(header, id="b-9")
    with served.client("team-b") as c:
        body = {"header": forged, "entries": ids, "prefix": [], "head": {"expected": None, "to": ids[-1]}, "mark": "mirror"}
        r = c.post("/v1/sessions/b-9/push", json=body)
        assert r.status_code == 409 and r.json()["code"] == "missing_object"
        assert r.json()["missing"]["entries"] == ids
        assert c.get("/v1/sessions/b-9").status_code == 404
    with pytest.raises(MissingObjectsError):
        HttpTransport(served.url, token=TOKENS["team-b"][0]).push(ex.PushRequest(
            header=forged, prefix=[], entries=ids, to=ids[-1], expected=None))


def test_a_forged_entry_is_bad_entry(served):
    # An envelope whose bytes hash to its name but are not the canonical form of its
    # values (a space after a colon): the object is sound, the entry is not.
    content = canonical_bytes({"model": "m"})
    chash = sha256_ref(content)
    env = b'{"content": "' + chash.encode() + b'","parent":null,"ts":"' + TS.encode() + b'","type":"config"}'
    eid = sha256_ref(env)
    header = Header.new("s9", created_at=TS).data
    with served.client("all") as c:
        assert c.put(f"/v1/objects/contents/{chash}", content=content).status_code == 204
        assert c.put(f"/v1/objects/entries/{eid}", content=env).status_code == 204
        r = c.post("/v1/sessions/s9/push", json={"header": header, "entries": [eid], "prefix": [],
                                                  "head": {"expected": None, "to": eid}, "mark": "mirror"})
        assert r.status_code == 422 and r.json()["code"] == "bad_entry", r.text
        assert c.get("/v1/sessions/s9").status_code == 404


def test_only_the_record_pushes_and_a_handover_whose_head_moved_is_refused(served, tmp_path):
    a = Store.init(tmp_path / "a")
    record(a, "s1", 1)
    a.close()
    remote = HttpTransport(served.url, token=TOKENS["all"][0])
    ex.push(Store(tmp_path / "a"), remote, "s1")
    b = Store.init(tmp_path / "b")
    ex.fetch(b, remote, "s1")
    with pytest.raises(NotRecordError):
        ex.push(b, remote, "s1")
    with pytest.raises(HeadMovedError):
        remote.declare_record("s1", head="sha256:" + "5" * 64)
    b.close()


def test_the_recorder_pushes_to_an_http_remote(served, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTSESSION_TOKEN", TOKENS["all"][0])
    rec = Recorder.open(tmp_path / "local", "r1", harness="test", remote=served.url, ref="chat/r1")
    rec.record("config", model="m")
    rec.close()
    with served.client("all") as c:
        assert c.get("/v1/sessions/r1").json()["length"] == 1
        assert c.get("/v1/refs/chat/r1").json()["target"]["session"] == "r1"


# -- a connection dropped after the server acted, before its answer arrived ---------------


class DroppingProxy:
    """A TCP proxy on loopback that forwards to the server, and drops the client's
    connection instead of returning the answer to the first request whose line contains
    ``marker`` (the server has acted; the client never hears)."""

    def __init__(self, upstream: str, marker: bytes):
        parts = httpx.URL(upstream)
        self.upstream = (parts.host, parts.port)
        self.marker = marker
        self.dropped = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        up = socket.create_connection(self.upstream)
        armed = [False]

        def back() -> None:
            try:
                while data := up.recv(65536):
                    if armed[0] and self.dropped == 0:
                        self.dropped += 1
                        client.shutdown(socket.SHUT_RDWR)
                        client.close()
                        return
                    client.sendall(data)
            except OSError:
                pass

        threading.Thread(target=back, daemon=True).start()
        try:
            while data := client.recv(65536):
                if self.marker in data and self.dropped == 0:
                    armed[0] = True
                up.sendall(data)
        except OSError:
            pass
        finally:
            up.close()

    def close(self) -> None:
        self.sock.close()


def test_a_push_whose_answer_was_lost_is_retried_under_its_key_and_lands_once(served, tmp_path):
    a = Store.init(tmp_path / "a")
    ids = record(a, "s1", 2)
    a.close()
    proxy = DroppingProxy(served.url, b"/push HTTP/1.1")
    try:
        result = ex.push(Store(tmp_path / "a"), HttpTransport(proxy.url, token=TOKENS["all"][0]), "s1")
    finally:
        proxy.close()
    assert proxy.dropped == 1
    assert result.head_after == ids[-1] and result.outcome == "fast-forward" and result.entries == 3
    with served.client("all") as c:
        log = [x for x in c.get("/v1/sessions/s1/log").text.splitlines()]
        assert len(log) == 1 + 3 + 1  # three entries, the head move, the end frame


def _fetched_by(monkeypatch, served, tmp_path, name: str, *, object_read: bool = True) -> tuple[list[str], Store]:
    """Fetch s1 (5 entries, recorded and pushed here first) from the server into a new
    store ``name``, recording the requests the transport sends."""
    a = tmp_path / "src"
    if not a.exists():
        st = Store.init(a)
        record(st, "s1", 4)
        st.close()
        ok(cli(a, "push", "s1", served.url))
    sent: list[str] = []
    request, stream = HttpTransport.request, HttpTransport._read_stream

    def counted(self, method, path, **kwargs):
        sent.append(f"{method} {path}")
        return request(self, method, path, **kwargs)

    def counted_stream(self, asked):
        sent.append("POST /objects/read " + ",".join(f"{k}:{len(v)}" for k, v in asked.items()))
        return stream(self, asked)

    def caps(self):
        got = request(self, "GET", "/", safe=True).json()
        got["features"]["object_read"] = object_read
        return got

    monkeypatch.setattr(HttpTransport, "request", counted)
    monkeypatch.setattr(HttpTransport, "_read_stream", counted_stream)
    monkeypatch.setattr(HttpTransport, "capabilities", caps)
    b = Store.init(tmp_path / name)
    with HttpTransport(served.url, token=TOKENS["all"][0]) as t:
        result = ex.fetch(b, t, "s1")
    assert result.entries == 5 and result.objects == 10
    return sent, b


def test_a_fetch_reads_its_objects_in_batches_where_the_server_offers_them(served, tmp_path, monkeypatch):
    sent, b = _fetched_by(monkeypatch, served, tmp_path, "b")
    assert [r for r in sent if r.startswith("GET /objects/")] == []
    assert [r for r in sent if r.startswith("POST /objects/read")] == ["POST /objects/read entries:5",
                                                                      "POST /objects/read contents:5"]
    # A server that does not offer it is read one GET an object, to the same bytes.
    sent, c = _fetched_by(monkeypatch, served, tmp_path, "c", object_read=False)
    assert len([r for r in sent if r.startswith("GET /objects/")]) == 10
    assert not [r for r in sent if r.startswith("POST /objects/read")]
    with Store(tmp_path / "src") as sa:
        assert b.export("s1") == c.export("s1") == sa.export("s1")
    b.close()
    c.close()


def _pushed_envelopes(served, tmp_path: Path) -> list[tuple[str, str]]:
    """A session of 4 entries recorded and pushed to ``served``: its path's envelopes there."""
    st = Store.init(tmp_path / "a")
    record(st, "s1", 4)
    st.close()
    ok(cli(tmp_path / "a", "push", "s1", served.url))
    with served.client("all") as c:
        path = [json.loads(x) for x in c.get("/v1/sessions/s1/path").text.splitlines()][:-1]
    return [("entries", f["entry"]) for f in path]


def test_a_batch_read_cut_part_way_is_asked_again_for_the_rest(served, tmp_path, monkeypatch):
    wanted = _pushed_envelopes(served, tmp_path)
    stream = HttpTransport._read_stream
    asked: list[int] = []

    def cut_once(self, names):
        asked.append(sum(len(v) for v in names.values()))
        for n, item in enumerate(stream(self, names)):
            if len(asked) == 1 and n == 2:
                raise TransportError("cut")
            yield item

    monkeypatch.setattr(HttpTransport, "_read_stream", cut_once)
    with HttpTransport(served.url, token=TOKENS["all"][0]) as t:
        got = list(t.get_objects(wanted))
        assert [(s, n) for s, n, _ in got] == wanted and asked == [5, 3]
        # One the server does not serve (here: no session holds it) is named, as a 404 would be.
        absent = sha256_ref(b'{"nowhere":1}')
        with pytest.raises(NoSuchObjectError, match=absent):
            list(t.get_objects([*wanted, ("contents", absent)]))
    # Over a real socket: the first answer dropped whole, the read is sent again.
    monkeypatch.setattr(HttpTransport, "_read_stream", stream)
    proxy = DroppingProxy(served.url, b"/objects/read HTTP/1.1")
    try:
        with HttpTransport(proxy.url, token=TOKENS["all"][0]) as t:
            assert [(s, n) for s, n, _ in t.get_objects(wanted)] == wanted
    finally:
        proxy.close()
    assert proxy.dropped == 1


def test_a_batch_read_of_several_batches_asks_for_the_next_while_the_last_is_taken(served, tmp_path, monkeypatch):
    """Session 42: the next batch is read (on a worker thread) while the caller takes the
    one before, so the server's work overlaps the caller's; the objects still come in the
    order asked, and one the server does not serve in a later batch is still named."""
    wanted = _pushed_envelopes(served, tmp_path)
    stream = HttpTransport._read_stream
    asked: list[int] = []

    def counted(self, names):
        asked.append(sum(len(v) for v in names.values()))
        yield from stream(self, names)

    monkeypatch.setattr(HttpTransport, "_read_stream", counted)
    monkeypatch.setattr(http_client, "READ_BATCH", 2)
    with HttpTransport(served.url, token=TOKENS["all"][0]) as t:
        objects = t.get_objects(wanted)
        first = next(objects)
        deadline = time.monotonic() + 10
        while len(asked) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert asked == [2, 2]  # the second batch asked for while the first is being taken
        got = [first, *objects]
        assert [(s, n) for s, n, _ in got] == wanted and asked == [2, 2, 1]
        absent = sha256_ref(b'{"nowhere":1}')
        with pytest.raises(NoSuchObjectError, match=absent):
            list(t.get_objects([*wanted, ("contents", absent)]))


def test_a_batch_read_stopped_early_does_not_wait_for_the_batch_read_ahead(served, tmp_path, monkeypatch):
    """A caller that stops taking objects (an error storing a batch, an interrupt) closes
    the read at once: it did wait for the whole batch being read ahead (a reviewer: 3 s
    for a slow second batch). Forced: the second batch's stream is held until after the
    close, so a close that waits for it would see it finished."""
    import threading

    wanted = _pushed_envelopes(served, tmp_path)
    stream = HttpTransport._read_stream
    release, held, state = threading.Event(), threading.Event(), {"finished": False}

    def slow_second(self, names):
        if state.setdefault("calls", 0) == 1:  # the batch read ahead: held until released
            state["calls"] += 1
            held.set()
            release.wait(60)
            yield from stream(self, names)
            state["finished"] = True
            return
        state["calls"] += 1
        yield from stream(self, names)

    monkeypatch.setattr(HttpTransport, "_read_stream", slow_second)
    monkeypatch.setattr(http_client, "READ_BATCH", 2)
    with HttpTransport(served.url, token=TOKENS["all"][0]) as t:
        objects = t.get_objects(wanted)
        next(objects)
        assert held.wait(60)  # the second batch is being read ahead, and held
        objects.close()  # returns without waiting for it
        assert not state["finished"]
        release.set()


def test_the_server_serves_https_with_its_own_certificate(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=120)
    Store.init(tmp_path / "served").close()
    a = Store.init(tmp_path / "a")
    ids = record(a, "s1", 1)
    a.close()
    with ServerProcess(tmp_path / "served", auth=token_file(tmp_path),
                       extra=("--tls-cert", str(cert), "--tls-key", str(key))) as server:
        assert server.url.startswith("https://127.0.0.1:")
        remote = HttpTransport(server.url, token=TOKENS["all"][0], verify=str(cert))
        with Store(tmp_path / "a") as st:
            assert ex.push(st, remote, "s1").head_after == ids[-1]
        with pytest.raises(TransportError):  # a client that does not trust the certificate
            HttpTransport(server.url, token=TOKENS["all"][0]).session_header("s1")


def test_a_token_comes_from_the_environment_or_the_remotes_file(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTSESSION_TOKEN", raising=False)
    remotes = tmp_path / "remotes.json"
    remotes.write_text(json.dumps({"remotes": {"http://127.0.0.1:9/": {"token": "from-the-file"}}}))
    monkeypatch.setenv("AGENTSESSION_REMOTES", str(remotes))
    assert token_for("http://127.0.0.1:9/") == "from-the-file"
    assert token_for("http://127.0.0.1:10/") is None
    monkeypatch.setenv("AGENTSESSION_TOKEN", "from-the-environment")
    assert token_for("http://127.0.0.1:9/") == "from-the-environment"
    monkeypatch.delenv("AGENTSESSION_TOKEN")
    remotes.write_text("{not json")
    with pytest.raises(TransportError):
        token_for("http://127.0.0.1:9/")


def test_a_remote_that_does_not_answer_is_one_error_line(tmp_path):
    a = tmp_path / "a"
    st = Store.init(a)
    record(st, "s1", 1)
    st.close()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    r = cli(a, "push", "s1", f"http://127.0.0.1:{port}/")
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "got no answer" in lines[0]


def test_a_mark_change_names_the_incarnation_it_saw(served, tmp_path):
    a = Store.init(tmp_path / "a")
    record(a, "s1", 1)
    a.close()
    remote = HttpTransport(served.url, token=TOKENS["all"][0])
    with Store(tmp_path / "a") as st:
        ex.handover(st, remote, "s1")
    view = remote.session_view("s1")  # the transport has seen this incarnation
    with served.client("all") as c:
        held = c.post("/v1/sessions/s1/lease", json={"ttl_ms": 60_000}).json()
        c.delete("/v1/sessions/s1", headers={"Lease-Token": str(held["token"])})
        c.post("/v1/sessions", json=Header.new("s1", created_at="2026-09-30T00:00:00Z").data)
    with pytest.raises(SessionReplacedError):
        remote.release_record("s1", head=view.head)
