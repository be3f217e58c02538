"""Following over the wire (RFC 0003, Following): NDJSON and server-sent events against a
real server, each event read as it comes (no sleeping: a read blocks until the
server sends), resumption by cursor and Last-Event-ID, reset, and the terminal
error when a followed session is deleted.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsession_cas import Header
from agentsession_cas.format.canonical import canonical_bytes
from agentsession_cas.format.hashing import sha256_ref
from agentsession_cas.store import Store
from server_helpers import TOKENS, ServerProcess
from server_helpers import served as served  # a fixture; "as served" marks it used on purpose (F401, F811)
from storetools import interruptible
from test_server import create, lease, recorded, user


def ndjson_events(response) -> Iterator[dict]:
    for line in response.iter_lines():
        if line.strip():
            yield json.loads(line)


def sse_events(response) -> Iterator[dict]:
    event: dict = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if not line:
            if event:
                yield event
            event = {}
            continue
        name, _, value = line.partition(": ")
        event[name] = json.loads(value) if name == "data" else value


def append(c, sid, token, *entries, commit=False):
    body = b"".join(json.dumps(e).encode() + b"\n" for e in entries)
    r = c.post(f"/v1/sessions/{sid}/entries", content=body, params={"commit": str(commit).lower()},
               headers={"Lease-Token": str(token)})
    assert r.status_code == 200 and r.json()["stopped"] is None, r.text
    return [x["id"] for x in r.json()["results"]]


def test_a_follower_sees_each_change_with_its_durability(served):
    with served.client("all") as c, served.client("reader") as f:
        held, ids = recorded(c, "s1", 2)
        with f.stream("GET", "/v1/sessions/s1/follow", headers={"Accept": "application/x-ndjson"}) as r:
            assert r.headers["content-type"].startswith("application/x-ndjson")
            events = ndjson_events(r)
            snap = next(events)
            assert snap["event"] == "snapshot"
            data = snap["data"]
            assert [x["entry"] for x in data["records"]] == ids and data["head"] == ids[-1] and data["inline"]
            for eid, obj in data["entries"].items():
                assert sha256_ref(canonical_bytes(obj["envelope"])) == eid
            # A lazy append: appended, not durable, with its content inline; then committed.
            (lazy,) = append(c, "s1", held["token"], user("lazy", 5))
            ev = next(events)
            assert ev["event"] == "appended" and ev["data"]["entry"] == lazy and ev["data"]["durable"] is False
            assert ev["data"]["head"] == lazy and ev["data"]["outcome"] == "continued"
            assert ev["data"]["content"]["item"]["content"] == "lazy"
            assert ev["id"] == ev["data"]["cursor"] + ".0"
            c.post("/v1/sessions/s1/commit", headers={"Lease-Token": str(held["token"])})
            ev = next(events)
            assert ev["event"] == "committed"
            # A head move no append explains is a head event.
            c.put("/v1/sessions/s1/head", json={"expected": lazy, "to": ids[0]},
                  headers={"Lease-Token": str(held["token"])})
            ev = next(events)
            assert ev["event"] == "head" and ev["data"] == {"leaf": ids[0], "durable": True, "cursor": ev["data"]["cursor"]}
            # A durable append is durable when it is sent, and needs no committed event.
            (durable,) = append(c, "s1", held["token"], user("durable", 6), commit=True)
            ev = next(events)
            assert ev["event"] == "appended" and ev["data"]["entry"] == durable and ev["data"]["durable"] is True
            # Deleted under a live follow: an error event, no_session, and the stream ends.
            c.delete("/v1/sessions/s1", headers={"Lease-Token": str(held["token"])})
            ev = next(events)
            assert ev["event"] == "error" and ev["data"]["code"] == "no_session"
            assert next(events, None) is None


def test_server_sent_events_resume_after_the_last_event_id(served):
    with served.client("all") as c:
        held, ids = recorded(c, "s1", 1)
        with c.stream("GET", "/v1/sessions/s1/follow") as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r)
            snap = next(events)
            assert snap["event"] == "snapshot"
            new = append(c, "s1", held["token"], user("a", 1), commit=True)
            first = next(events)
            assert first["event"] == "appended" and first["data"]["entry"] == new[0]
        # Two more while nobody follows; a follower resuming after the last id it saw gets
        # exactly those, in order, and no snapshot.
        later = append(c, "s1", held["token"], user("b", 2), user("c", 3), commit=True)
        with c.stream("GET", "/v1/sessions/s1/follow", headers={"Last-Event-ID": first["id"]}) as r:
            events = sse_events(r)
            got = [next(events), next(events)]
        assert [e["event"] for e in got] == ["appended", "appended"]
        assert [e["data"]["entry"] for e in got] == later
        # `after` takes a cursor; Last-Event-ID wins when both are sent.
        with c.stream("GET", "/v1/sessions/s1/follow", params={"after": "0-0000000000000000"},
                      headers={"Last-Event-ID": got[0]["id"]}) as r:
            assert next(sse_events(r))["data"]["entry"] == later[1]


def test_a_cursor_that_cannot_be_resumed_gets_a_reset(served):
    with served.client("all") as c:
        held, ids = recorded(c, "s1", 1)
        with c.stream("GET", "/v1/sessions/s1/follow", params={"after": "junk"}) as r:
            ev = next(sse_events(r))
            assert ev["event"] == "reset" and [x["entry"] for x in ev["data"]["records"]] == ids
        with c.stream("GET", "/v1/sessions/s1/follow") as r:
            old_cursor = next(sse_events(r))["id"]
        # Deleted and created again under its id: an old cursor is of another session.
        c.delete("/v1/sessions/s1", headers={"Lease-Token": str(held["token"])})
        create(c, "s1", created_at="2026-09-19T00:00:00Z")
        with c.stream("GET", "/v1/sessions/s1/follow", headers={"Last-Event-ID": old_cursor}) as r:
            ev = next(sse_events(r))
            assert ev["event"] == "reset" and ev["data"]["records"] == []
            assert ev["data"]["incarnation"] != old_cursor


def test_a_durable_follow_sends_only_committed_records(served):
    with served.client("all") as c:
        held, ids = recorded(c, "s1", 1)
        lease_token = held["token"]
        with c.stream("GET", "/v1/sessions/s1/follow", params={"durable": "true"},
                      headers={"Accept": "application/x-ndjson"}) as r:
            events = ndjson_events(r)
            assert next(events)["event"] == "snapshot"
            (lazy,) = append(c, "s1", lease_token, user("lazy", 4))
            ev = next(events)
            # The server commits what its writer accepted before it serves a durable read.
            assert ev["event"] == "appended" and ev["data"]["entry"] == lazy and ev["data"]["durable"] is True


def test_following_needs_read_and_a_session(served):
    with served.client("all") as c:
        create(c, "a-1")
        lease(c, "a-1")
    with served.client("team-b") as b:
        r = b.get("/v1/sessions/a-1/follow")
        assert r.status_code == 403 and r.json()["code"] == "scope"
    with served.client("all") as c:
        r = c.get("/v1/sessions/none/follow")
        assert r.status_code == 404 and r.json()["code"] == "no_session"


# -- agentsession show -f ---------------------------------------------------------------------


class Lines:
    """A process's stdout lines, read by a thread; ``next()`` waits for the next one."""

    def __init__(self, proc):
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [self.q.put(x.decode()) for x in iter(proc.stdout.readline, b"")], daemon=True).start()

    def next(self) -> str:
        return self.q.get(timeout=60)


def _show_f(args, env=None):
    return interruptible([sys.executable, "-m", "agentsession_cas", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=dict(os.environ, **(env or {})))


def test_show_f_follows_a_remote_session_until_interrupted(served):
    with served.client("all") as c:
        held, ids = recorded(c, "s1", 1)
        proc = _show_f(["show", "-f", "s1", "--remote", served.url], {"AGENTSESSION_TOKEN": TOKENS["reader"][0]})
        out = Lines(proc)
        try:
            assert out.next().startswith(ids[0][7:19])
            assert out.next().startswith(ids[1][7:19])
            (new,) = append(c, "s1", held["token"], user("followed", 7), commit=True)
            line = out.next()
            assert line.startswith(new[7:19]) and "followed" in line and "(head)" in line
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 130


def test_show_f_follows_a_local_session(tmp_path):
    st = Store.init(tmp_path / "st")
    s = st.create(Header.new("s1", created_at="2026-09-17T12:00:00Z"))
    first = s.append({"type": "config", "ts": "2026-09-17T12:00:00Z", "model": "m"}, durable=True).id
    s.close()
    proc = _show_f(["--store", str(tmp_path / "st"), "show", "-f", "s1", "--json"])
    out = Lines(proc)
    try:
        assert json.loads(out.next())["entry"]["id"] == first
        with st.session("s1") as s:
            new = s.append(user("later", 3), durable=True).id
        got = json.loads(out.next())
        assert got["change"] == "appended" and got["entry"]["id"] == new and got["head"] == new
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        st.close()


def test_following_a_ref_sends_its_target_and_each_change(served):
    with served.client("all") as c:
        held, _ = recorded(c, "s1", 1)
        recorded(c, "s2", 1)
        with c.stream("GET", "/v1/refs/chat/one", params={"view": "follow"}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r)
            assert next(events)["data"] == {"name": "chat/one", "target": None, "state": "live"}
            c.put("/v1/refs/chat/one", json={"expected": None, "next": "s1"})
            ev = next(events)
            assert ev["event"] == "target" and ev["data"]["target"] == {"session": "s1", "entry": ""}
            assert ev["data"]["state"] == "live"
            # The ref did not move, but its session went: live to dangling is an event.
            c.delete("/v1/sessions/s1", headers={"Lease-Token": str(held["token"])})
            assert next(events)["data"]["state"] == "dangling"
            c.put("/v1/refs/chat/one", json={"expected": "s1", "next": "s2"})
            ev = next(events)
            assert ev["data"]["target"]["session"] == "s2" and ev["data"]["state"] == "live"
            c.put("/v1/refs/chat/one", json={"expected": "s2", "next": None})
            assert next(events)["data"]["target"] is None


def _one_session(tmp_path) -> Path:
    """A store holding session s1 with one entry: what a follow is opened on."""
    with Store.init(tmp_path / "st") as st:
        st.create(Header.new("s1", created_at="2026-09-17T12:00:00Z")).append(
            {"type": "config", "ts": "2026-09-17T12:00:00Z", "model": "m"})
    return tmp_path / "st"


def test_follow_streams_are_bounded_in_number_and_age(tmp_path):
    with ServerProcess(_one_session(tmp_path), extra=("--max-streams", "1", "--max-stream-age", "1")) as server, \
            server.client() as c:
        limits = c.get("/v1/").json()["limits"]
        assert limits["max_streams"] == 1 and limits["max_stream_age_s"] == 1
        with c.stream("GET", "/v1/sessions/s1/follow") as r:
            events = sse_events(r)
            snap = next(events)
            assert snap["event"] == "snapshot"
            busy = c.get("/v1/sessions/s1/follow")
            assert busy.status_code == 503 and busy.json()["code"] == "store_fault"
            # when to come back: by the open stream's age limit (1 s), at least a second
            assert busy.headers["Retry-After"] == "1" and "within 1 s" in busy.json()["detail"]
            end = next(events)  # the stream's age runs out: an end event with the cursor to resume from
            assert end["event"] == "end" and end["data"]["reason"] == "max_stream_age"
            assert end["data"]["cursor"] == snap["id"].rsplit(".", 1)[0]
            assert next(events, None) is None


def test_a_server_that_stops_ends_its_open_follow_streams_with_an_end_event(tmp_path):
    """SIGTERM with follows open (SSE, NDJSON, a ref's): each ends at once with an ``end``
    event, reason ``shutdown`` (a session's with the cursor to resume from, on the next
    server), and the stream is then complete. Before, uvicorn's graceful shutdown waited
    for them (5 s, its limit) and then cut them: no end event, a torn stream."""
    server = ServerProcess(_one_session(tmp_path), extra=("--max-stream-age", "3600")).start()
    try:
        with server.client() as c, c.stream("GET", "/v1/sessions/s1/follow") as sse, \
                c.stream("GET", "/v1/sessions/s1/follow", headers={"Accept": "application/x-ndjson"}) as nd, \
                c.stream("GET", "/v1/refs/chat/one", params={"view": "follow"}) as ref:
            sse_iter, nd_iter, ref_iter = sse_events(sse), ndjson_events(nd), sse_events(ref)
            snap = next(sse_iter)
            assert snap["event"] == "snapshot" and next(nd_iter)["event"] == "snapshot"
            assert next(ref_iter)["event"] == "target"
            assert server.stop() == 143
            end = next(sse_iter)
            assert end["event"] == "end" and end["data"] == {"reason": "shutdown", "cursor": snap["id"].rsplit(".", 1)[0]}
            assert next(sse_iter, None) is None
            end = next(nd_iter)
            assert end["event"] == "end" and end["data"]["reason"] == "shutdown"
            assert next(nd_iter, None) is None
            end = next(ref_iter)
            assert end["event"] == "end" and end["data"] == {"reason": "shutdown"}
            assert next(ref_iter, None) is None
    finally:
        server.stop()


def test_a_follower_refused_for_the_stream_limit_is_told_when_one_ends(tmp_path):
    """Retry-After on the stream limit's 503: when the oldest open stream reaches its age
    limit, the latest it ends (the HTTP client waits that long before it asks again)."""
    with ServerProcess(_one_session(tmp_path), extra=("--max-streams", "1", "--max-stream-age", "10")) as server, \
            server.client() as c:
        with c.stream("GET", "/v1/sessions/s1/follow") as r:
            events = sse_events(r)  # (kept: letting go of it closes the stream)
            assert next(events)["event"] == "snapshot"
            busy = c.get("/v1/sessions/s1/follow")
            assert busy.status_code == 503
            wait = int(busy.headers["Retry-After"])  # (no sooner than a second, no later than the age)
            assert 1 <= wait <= 10 and f"within {wait} s" in busy.json()["detail"]


def test_show_f_refused_for_the_stream_limit_says_the_wait_past_its_bound(tmp_path):
    """``show -f --remote`` on a server whose follow streams are at their limit: a wait
    the server asks within the client's bound is waited (tests/test_server_retries.py,
    where nothing sleeps); one past it ends the command at once with the server's error,
    naming its code, the wait asked and the bound (it printed the server's detail alone,
    the same whatever the wait)."""
    with ServerProcess(_one_session(tmp_path), extra=("--max-streams", "1", "--max-stream-age", "10")) as server, \
            server.client() as c:
        with c.stream("GET", "/v1/sessions/s1/follow") as r:
            events = sse_events(r)  # (kept: letting go of it closes the stream)
            assert next(events)["event"] == "snapshot"
            done = subprocess.run([sys.executable, "-m", "agentsession_cas", "show", "-f", "s1", "--remote", server.url],
                                  capture_output=True, timeout=60,
                                  env=dict(os.environ, AGENTSESSION_RETRY_WAIT="0.5"))
    err = done.stderr.decode()
    assert done.returncode == 1 and done.stdout == b"", err
    assert "(store_fault): this server has 1 follow streams open" in err, err
    assert "the server asked to wait" in err and "(Retry-After), past this client's bound of 0.5 s" in err, err


def _entry(n: int) -> dict:
    return user(f"tail {n}", n)


def test_a_logs_tail_is_read_from_where_the_last_read_ended(tmp_path):
    """``history_since`` (what a follower's wakeup reads): the records after the first
    ``start``, the same as a whole read's, and on the file store read from the byte where
    the last read ended while the log is the same file and its lines chain on; another
    file, a cut or a damaged line is read whole."""
    with Store.init(tmp_path / "st", sync="never") as st:
        sessions = st.backend.sessions
        s = st.create(Header.new("t1", created_at="2026-09-17T12:00:00Z"))
        s.append(_entry(0), durable=True)
        first = sessions.history_since("t1", 0)
        assert first.records == sessions.history("t1").records and first.total == len(first.records)
        assert first.resume is not None
        for n in range(1, 4):
            s.append(_entry(n))
        s.commit()
        whole = sessions.history("t1").records
        got = sessions.history_since("t1", first.total, first.resume)
        assert got.records == whole[first.total:] and got.total == len(whole)
        ino, offset, count, _ = got.resume
        assert (count, offset) == (len(whole), (tmp_path / "st" / "sessions" / "t1" / "log").stat().st_size)
        # Nothing new: nothing read.
        again = sessions.history_since("t1", got.total, got.resume)
        assert again.records == [] and again.total == got.total and again.resume == got.resume
        # A note for another count is not used: the log is read whole.
        assert sessions.history_since("t1", 2, got.resume).records == whole[2:]
        log = tmp_path / "st" / "sessions" / "t1" / "log"
        s.close()
    # A damaged line after the point: the tail read refuses it, and the whole read says
    # what history says (the damage is not served as records).
    with log.open("ab") as f:
        f.write(b"0123456789abcdef not a record\n")
    with Store(tmp_path / "st", readonly=True) as ro:
        history = ro.backend.sessions.history("t1")
        tail = ro.backend.sessions.history_since("t1", got.total, got.resume)
        assert tail.records == history.records[got.total:] and tail.total == len(history.records)
        assert tail.resume is None  # a damaged log gives no point to read on from


def test_the_servers_tails_follow_a_log_and_start_again_for_another_handle(tmp_path):
    """The server's per-session :class:`Tails`: each read takes what was written since and
    ends as a whole read would; a session deleted and made again (another handle) is read
    afresh, and a durable view stops at the last commit."""
    from agentsession_cas.server.follow import Tails, load_view

    with Store.init(tmp_path / "st", sync="never") as st:
        tails = Tails(st)
        s = st.create(Header.new("t2", created_at="2026-09-17T12:00:00Z"))
        s.append(_entry(0), durable=True)
        view = load_view(st, tails, "t2", False)
        assert view.records[: view.end] == s.records()
        s.append(_entry(1))
        lazy = load_view(st, tails, "t2", False)
        assert lazy.records is view.records  # the same tail, grown
        assert lazy.records[: lazy.end] == s.records() and lazy.end == len(s.records())
        assert lazy.last_commit < lazy.end - 1
        s.commit()
        durable = load_view(st, tails, "t2", True)
        assert durable.end == len(s.records()) and durable.last_commit == durable.end - 1
        st.delete("t2")
        again = st.create(Header.new("t2", created_at="2026-09-17T12:00:00Z"))
        for n in range(5):
            again.append(_entry(10 + n))
        fresh = load_view(st, tails, "t2", False)
        assert fresh.records is not view.records and fresh.records[: fresh.end] == again.records()


def test_a_snapshot_too_big_to_send_inline_is_read_in_batches(tmp_path, monkeypatch):
    """Past the bytes a snapshot carries inline the follower reads the entries itself: in
    batch reads, a chunk of entries at a time, each entry verified, in log order (it sent
    two GETs an entry)."""
    from itertools import islice

    from agentsession_cas.exchange import following
    from agentsession_cas.exchange.http_client import HttpTransport

    st = Store.init(tmp_path / "st")
    s = st.create(Header.new("big", created_at="2026-09-17T12:00:00Z"))
    ids = [s.append({"type": "config", "ts": "2026-09-17T12:00:00Z", "model": "m"}).id]
    for i in range(6):  # 6 x 1 MB: past the 4 MiB a snapshot carries inline
        ids.append(s.append(user("x" * (1 << 20) + str(i), i)).id)
    s.close()
    st.close()
    monkeypatch.setattr(following, "SNAPSHOT_CHUNK", 4)
    sent: list[str] = []
    request, stream = HttpTransport.request, HttpTransport._read_stream
    monkeypatch.setattr(HttpTransport, "request", lambda self, m, p, **k: (sent.append(f"{m} {p}"), request(self, m, p, **k))[1])
    monkeypatch.setattr(HttpTransport, "_read_stream", lambda self, asked: (sent.append(f"read {sorted(asked)}"), stream(self, asked))[1])
    with ServerProcess(tmp_path / "st") as server, HttpTransport(server.url) as t:
        changes = following.follow_remote(t, "big")
        got = list(islice(changes, len(ids)))
        changes.close()
    assert [c.entry.id for c in got] == ids
    assert got[3].entry.data["item"]["content"].endswith("x2")
    assert not [r for r in sent if r.startswith("GET /objects/")]
    # (the first records came inline, as far as they fit; the rest a chunk of 4 at a time)
    assert 1 <= sent.count("read ['entries']") == sent.count("read ['contents']") <= 2


def test_following_a_local_session_yields_its_first_entry_before_reading_the_rest(tmp_path, monkeypatch):
    """A local follow reads a long session's entries a chunk at a time as they are taken
    (bulk reads), so its first entry comes before the rest are read; and it sees the
    entries committed after, then stops when the session goes."""
    from agentsession_cas.errors import NoSuchSessionError
    from agentsession_cas.exchange.following import follow_store

    st = Store.init(tmp_path / "st")
    s = st.create(Header.new("long", created_at="2026-09-17T12:00:00Z"))
    ids = [s.append(user(f"turn {i}", i)).id for i in range(700)]
    s.close()
    reads: list[int] = []
    get_many = st.objects.get_many
    monkeypatch.setattr(st.objects, "get_many", lambda space, names: (reads.append(len(names)), get_many(space, names))[1])
    changes = follow_store(st, "long", interval=0, sleep=lambda _: None)
    first = next(changes)
    assert first.entry.id == ids[0] and sum(reads) < 700  # one chunk's envelopes and contents, not the session's
    rest = [next(changes) for _ in range(699)]
    assert [c.entry.id for c in rest] == ids[1:]
    s = st.session("long")
    new = s.append(user("later", 800), durable=True).id
    s.close()
    assert next(changes).entry.id == new
    st.delete("long")
    with pytest.raises(NoSuchSessionError):
        next(changes)
    st.close()


def test_a_follow_woken_often_without_an_event_still_sends_its_keep_alive(monkeypatch):
    """The keep-alive is due 15 s after the last byte sent, not after the last wake: a
    request on the session that makes no event (a lease's renewal every 10 s) woke the
    stream and reset its timer, so it sent nothing for good and a follower took it for
    dead. Forced: a fake clock a second a look, and every wait woken at once."""
    import asyncio
    import types

    from agentsession_cas.server import follow as follow_mod

    clock = [0.0]

    def tick() -> float:
        clock[0] += 1.0
        return clock[0]

    monkeypatch.setattr(follow_mod.time, "monotonic", tick)

    class Woken:
        closing = False

        def event(self, session_id: str) -> asyncio.Event:
            e = asyncio.Event()
            e.set()  # a renewal: woken, nothing new
            return e

    async def run(fn, *args):
        return types.SimpleNamespace(ident="i", end=0)

    fake = types.SimpleNamespace(
        resume=lambda after, first, back: True, max_resume=None, position=0, since=lambda view: [],
        max_age_s=100.0, started=0.0, changes=Woken(), run=run, store=None, tails=None, session_id="s",
        durable=False, ident="i", sse=False, cursor=lambda: "c",
        frame=lambda kind, data, cursor: f"{kind}\n".encode())

    async def collect() -> list[bytes]:
        return [chunk async for chunk in follow_mod.Stream.events(fake, types.SimpleNamespace(end=0), "c")]

    out = asyncio.run(collect())
    assert out[-1] == b"end\n"
    assert out.count(b"\n") >= 3, out  # a keep-alive every 15 s of the 100 s stream
