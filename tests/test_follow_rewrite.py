"""A follow across a rewrite of the log it follows (RFC 0003, Following: "a cursor the
server can no longer resume from ... gets a reset, never a silent skip").

The file store rewrites a log as it compacts it (at a writer's close, or while writing)
and as ``repair`` rebuilds it; either writes a log with another record count, so a
position counted in the old log names another record in the new one. A server's open
follow stream and a follower reconnecting with a cursor from before the rewrite must
each get every entry exactly once, in commit order, or a ``reset`` to rebuild from.

The server's stream (``server.follow.Stream``) is driven here in this process: its
store work runs at once, and each wakeup is given by the test after its writes, so
nothing sleeps and nothing races.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from pathlib import Path
from typing import Any

import pytest

from agentsession_cas import Header
from agentsession_cas.backends.files import sessions as files_sessions
from agentsession_cas.errors import NoSuchSessionError
from agentsession_cas.exchange.following import follow_remote, follow_store
from agentsession_cas.format.canonical import canonical_bytes
from agentsession_cas.format.hashing import sha256_ref
from agentsession_cas.maintenance.repair import repair_session
from agentsession_cas.server.follow import Changes, Stream, Tails, load_view
from agentsession_cas.store import Store
from storetools import crash

TS = "2026-09-17T12:00:00Z"


def user(text: str, n: int = 0) -> dict:
    return {"type": "item", "ts": f"2026-09-17T12:{n // 60 % 60:02d}:{n % 60:02d}Z",
            "item": {"type": "message", "role": "user", "content": text}}


class Follow:
    """One follow stream of the server over ``st``, driven in this process: ``next()``
    takes an event already due (the first ones), ``wake()`` tells the stream of a write
    (what the server's write routes do) and takes every event it sends for it."""

    def __init__(self, st: Store, sid: str, *, durable: bool = False, after: str | None = None) -> None:
        self.sid = sid
        self.changes = Changes()
        self.tails = Tails(st)
        self.loop = asyncio.new_event_loop()

        async def run(fn: Any, *args: Any) -> Any:
            return fn(*args)

        self.stream = Stream(st, sid, durable, False, run, self.changes, self.tails, 3600.0)
        first = load_view(st, self.tails, sid, durable)
        self.gen = self.stream.events(first, after)
        self.task: asyncio.Future | None = None

    def _pending(self) -> asyncio.Future:
        if self.task is None:
            self.task = asyncio.ensure_future(self.gen.__anext__(), loop=self.loop)
        return self.task

    def _waiting(self) -> bool:
        return self.sid in self.changes._events  # (the stream waits on its session's event)

    def next(self) -> dict:
        return self.loop.run_until_complete(self._next())

    async def _next(self) -> dict:
        task = self._pending()
        for _ in range(1000):
            if task.done():
                self.task = None
                return json.loads(task.result())
            assert not self._waiting(), "no event was due"
            await asyncio.sleep(0)
        raise AssertionError("the stream sent nothing")

    def wake(self) -> list[dict]:
        return self.loop.run_until_complete(self._wake())

    async def _wake(self) -> list[dict]:
        out: list[dict] = []
        task = self._pending()
        for _ in range(1000):
            if self._waiting():
                break
            await asyncio.sleep(0)
        assert not task.done(), "an event came before the write was told"
        self.changes.notify(self.sid)
        for _ in range(10000):
            if task.done():
                self.task = None
                try:
                    out.append(json.loads(task.result()))
                except StopAsyncIteration:
                    return out
                task = self._pending()
            elif self._waiting():
                return out
            await asyncio.sleep(0)
        raise AssertionError("the stream did not wait again")

    def close(self) -> None:
        async def done() -> None:
            if self.task is not None:
                self.task.cancel()
                await asyncio.gather(self.task, return_exceptions=True)
            await self.gen.aclose()

        self.loop.run_until_complete(done())
        self.loop.close()


def appended(events: list[dict]) -> list[str]:
    return [e["data"]["entry"] for e in events if e["event"] == "appended"]


def _recorded(st: Store, n: int, sid: str = "s1") -> list[str]:
    """Session ``sid``, n durable appends (a commit record after each)."""
    s = st.create(Header.new(sid, created_at=TS))
    return [s.append(user(f"turn {i}", i), durable=True).id for i in range(n)]


def _compact(st: Store, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewrite s1's log as a compaction does: its writer's checkpoint (while writing) or its
    close. Either way its records are fewer after (a commit record after each append is
    folded into one snapshot)."""
    before = len(st.backend.sessions.history("s1").records)
    if how == "while writing":
        monkeypatch.setattr(files_sessions, "COMPACT_WHILE_WRITING", 1)
        st.session("s1").checkpoint()
    else:
        monkeypatch.setattr(files_sessions, "COMPACT_AT_CLOSE", 1)
        st.session("s1").close()
    after = st.backend.sessions.history("s1").records
    assert len(after) < before and any(r["op"] == "head" for r in after), "no compaction ran"


def test_a_compaction_keeps_the_state_a_cursor_checks(tmp_path, monkeypatch):
    """What a cursor checks (``Told``: the own entries in order, the head, the highest
    sequence number) is the same at the end of a log's records before a compaction and
    after it, whether the snapshot is read expanded (as history gives it) or as itself."""
    from agentsession_cas.backends.files.log import read_log
    from agentsession_cas.server.follow import Told

    def check(records: list[dict]) -> str:
        told = Told()
        for i, rec in enumerate(records):
            told.apply(rec, i)
        return told.check()

    st = Store.init(tmp_path / "st", sync="never")
    ids = _recorded(st, 10)
    s = st.session("s1")
    s.set_head(ids[4], expected=ids[-1])
    s.commit()
    before = st.backend.sessions.history("s1").records
    _compact(st, "while writing", monkeypatch)
    after = st.backend.sessions.history("s1").records
    raw = [r.data for r in read_log((tmp_path / "st" / "sessions" / "s1" / "log").read_bytes(), expand=False).records]
    assert [r["op"] for r in raw] == ["create", "snapshot"]
    assert check(before) == check(after) == check(raw)
    assert check(before[:-3]) != check(before)  # (and it tells states apart)
    st.close()


@pytest.mark.parametrize("durable", [False, True], ids=["live", "durable"])
@pytest.mark.parametrize("how", ["while writing", "at close"])
def test_an_open_follow_across_a_compaction_gets_each_entry_once(tmp_path, monkeypatch, how, durable):
    """The follower read 21 records (10 appends, each with its commit); a compaction folds
    them into 14, and 4 more appends make 22. The stream's position (21) is inside the new
    log: it sent only the last commit, and none of the 4 entries. Now it finds where it is
    in the new log (the state it had told, which the compaction keeps) and sends the 4."""
    st = Store.init(tmp_path / "st", sync="never")
    ids = _recorded(st, 10)
    follow = Follow(st, "s1", durable=durable)
    snap = follow.next()
    assert snap["event"] == "snapshot" and [r["entry"] for r in snap["data"]["records"]] == ids
    _compact(st, how, monkeypatch)
    s = st.session("s1")
    new = [s.append(user(f"after {i}", 20 + i), durable=True).id for i in range(4)]
    events = follow.wake()
    assert [e["event"] for e in events if e["event"] not in ("appended", "committed")] == []
    assert appended(events) == new
    # and it goes on from there
    later = s.append(user("later", 30), durable=True).id
    assert appended(follow.wake()) == [later]
    follow.close()
    st.close()


def test_a_reconnect_with_a_cursor_from_before_a_compaction_resumes_or_resets(tmp_path, monkeypatch):
    """Cursors from before a compaction: the one at the end of what was read resumes at the
    same place in the new log (exactly the entries after it); one from inside what the
    compaction folded cannot be placed there, and gets a reset with the whole session;
    one of the earlier form (``<position>-<incarnation>``, no state) gets a reset too.
    Before, each was taken as a position in the new log: the first sent nothing of the new
    entries, the second entries the follower had already had."""
    st = Store.init(tmp_path / "st", sync="never")
    ids = _recorded(st, 10)
    follow = Follow(st, "s1")
    snap = follow.next()
    follow.close()
    end_cursor = snap["id"]
    inside = snap["data"]["records"][4]["cursor"]  # after ids[4]
    old_form = "-".join(end_cursor.split(".")[0].split("-")[:2])
    _compact(st, "while writing", monkeypatch)
    s = st.session("s1")
    new = [s.append(user(f"after {i}", 20 + i), durable=True).id for i in range(4)]

    resumed = Follow(st, "s1", after=end_cursor)
    got = [resumed.next() for _ in range(len(new) + 1)]
    # (a place found elsewhere than the cursor counts: what the follower was told as not
    # durable is not known, so the next commit is said: test_follow_committed.py)
    assert [e["event"] for e in got] == ["appended", "committed", "appended", "appended", "appended"]
    assert appended(got) == new
    resumed.close()

    for cursor in (inside, old_form):
        again = Follow(st, "s1", after=cursor)
        reset = again.next()
        assert reset["event"] == "reset", cursor
        assert [r["entry"] for r in reset["data"]["records"] if "entry" in r] == ids + new
        again.close()
    st.close()


def test_a_log_read_after_a_cursor_from_before_a_compaction_is_not_another_records(tmp_path, monkeypatch):
    """``GET …/log?after=``'s cursors are the follow's: the log read after a cursor from
    before a compaction gives exactly what came after it, or ``session_replaced``."""
    from agentsession_cas.errors import SessionReplacedError
    from agentsession_cas.server.app import _log_lines

    st = Store.init(tmp_path / "st", sync="never")
    ids = _recorded(st, 10)
    s = st.session("s1")
    header = dict(s.header.data)
    lines = [json.loads(x) for x in _log_lines("s1", s.records(), header, False, None)]
    end_cursor = lines[-1]["cursor"]
    inside = lines[4]["cursor"]
    assert [x["entry"] for x in lines[:-1]] == ids
    _compact(st, "while writing", monkeypatch)
    s = st.session("s1")
    new = [s.append(user(f"after {i}", 20 + i), durable=True).id for i in range(4)]
    after = [json.loads(x) for x in _log_lines("s1", s.records(), header, False, end_cursor)]
    assert [x.get("entry") for x in after[:-1]] == new
    with pytest.raises(SessionReplacedError):
        _log_lines("s1", s.records(), header, False, inside)
    st.close()


def _damaged_and_repaired(root: Path, writer: Store, drop_from: int) -> None:
    """The log of s1 (written by ``writer``, which then dies: the entries' objects only in
    the log's lines) damaged at its append ``drop_from`` (its line zeroed), then repaired:
    that entry and the ones after it (its descendants) are dropped."""
    crash(writer)
    data = bytearray((root / "sessions" / "s1" / "log").read_bytes())
    starts = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A][:-1]
    lines = [(a, data.index(b"\n", a)) for a in starts]
    appends = [(a, b) for a, b in lines if b'"op":"append"' in bytes(data[a:b]).split(b"\t")[0]]
    a, b = appends[drop_from]
    data[a:b] = b"\0" * (b - a)
    (root / "sessions" / "s1" / "log").write_bytes(bytes(data))
    with Store(root) as st:
        report = repair_session(st, "s1")
    assert report.repaired and len(report.dropped) > 0


def test_a_follow_of_a_log_repaired_to_drop_what_it_sent_gets_a_reset(tmp_path):
    """A repair drops entries the follower was sent (6 read; 3 dropped, then 5 more
    appended, so the new log is longer than the position the follower held): the open
    stream gets a reset with the session as it now is, and so does a reconnect with a
    cursor from before the repair; before, each sent the records after the old position
    in the new log, as if nothing had been dropped."""
    root = tmp_path / "st"
    writer = Store.init(root, sync="never")
    ids = _recorded(writer, 6)
    server = Store(root, readonly=True)  # (a server reading another process's writes)
    follow = Follow(server, "s1")
    snap = follow.next()
    assert [r["entry"] for r in snap["data"]["records"]] == ids
    server.session("s1").close()  # (its snapshot let go: the next read opens the log again)
    _damaged_and_repaired(root, writer, 3)
    with Store(root) as st:
        s = st.session("s1")
        kept = list(s.log_order)
        assert kept == ids[:3]
        new = [s.append(user(f"after {i}", 20 + i), durable=True).id for i in range(5)]
    assert len(Store(root, readonly=True).backend.sessions.history("s1").records) > len(snap["data"]["records"]) * 2
    events = follow.wake()
    assert appended(events) == [] and [e["event"] for e in events][:1] == ["reset"]
    assert [r["entry"] for r in events[0]["data"]["records"]] == kept + new
    follow.close()
    server.session("s1").close()
    again = Follow(server, "s1", after=snap["id"])
    reset = again.next()
    assert reset["event"] == "reset" and [r["entry"] for r in reset["data"]["records"]] == kept + new
    again.close()
    server.close()


# -- the client side: follow_remote, follow_store -----------------------------------------


def _entry_obj(text: str, parent: str | None, n: int) -> tuple[str, dict, dict]:
    content = {"item": {"type": "message", "role": "user", "content": text}}
    chash = sha256_ref(canonical_bytes(content))
    env = {"type": "item", "ts": f"2026-09-17T12:00:{n:02d}Z", "parent": parent, "content": chash}
    return sha256_ref(canonical_bytes(env)), env, content


class Frames:
    """A transport whose follow stream sends the frames given, then ends."""

    url = "http://test/"

    def __init__(self, frames: list[dict]) -> None:
        self.frames = frames

    def stream_lines(self, path: str, params: Any = None, headers: Any = None) -> Any:
        for frame in self.frames:
            yield json.dumps(frame)


def _whole(kind: str, cursor: str, entries: list[tuple[str, dict, dict]], incarnation: str = "sha256:i1") -> dict:
    records = [{"seq": i + 1, "entry": e, "head": e, "outcome": "continued", "durable": True, "cursor": f"{cursor}{i}"}
               for i, (e, _, _) in enumerate(entries)]
    return {"event": kind, "id": f"{cursor}.0", "data": {
        "session": "s1", "incarnation": incarnation, "head": entries[-1][0] if entries else None, "records": records,
        "entries": {e: {"envelope": env, "content": c} for e, env, c in entries}, "inline": True}}


def _appended(cursor: str, entry: tuple[str, dict, dict]) -> dict:
    e, env, c = entry
    return {"event": "appended", "id": f"{cursor}.0",
            "data": {"entry": e, "head": e, "envelope": env, "content": c, "cursor": cursor, "durable": True}}


def _chain(n: int, start: int = 0, parent: str | None = None) -> list[tuple[str, dict, dict]]:
    out = []
    for i in range(n):
        e = _entry_obj(f"turn {start + i}", parent, start + i)
        out.append(e)
        parent = e[0]
    return out


def test_follow_remote_takes_a_reset_of_the_same_session_mid_stream():
    """A ``reset`` mid-stream of the session followed (the log rewritten): when it holds
    every entry given so far, in order, only the entries after them are given; when it
    does not (a repair dropped some), a ``reset`` change says what was given is void, and
    the session's entries are given afresh. Before, any reset after the first snapshot
    ended the follow as if the session had been replaced (``NoSuchSessionError``)."""
    a = _chain(3)
    b = _chain(2, 3, a[-1][0])
    frames = [_whole("snapshot", "c1-", a[:2]), _appended("c2", a[2]), _whole("reset", "c3-", a + b)]
    got = list(follow_remote(Frames(frames), "s1"))
    assert [(c.kind, c.entry.id if c.entry else None) for c in got] == [("appended", e[0]) for e in a + b]

    other = _chain(2, 10, a[0][0])  # a[1], a[2] dropped; two others after a[0]
    frames = [_whole("snapshot", "c1-", a), _whole("reset", "c3-", [a[0], *other])]
    got = list(follow_remote(Frames(frames), "s1"))
    kinds = [(c.kind, c.entry.id if c.entry else None) for c in got]
    assert kinds[:3] == [("appended", e[0]) for e in a]
    assert kinds[3] == ("reset", None) and got[3].head == other[-1][0]
    assert kinds[4:] == [("appended", e[0]) for e in [a[0], *other]]

    # Another incarnation is still another session.
    frames = [_whole("snapshot", "c1-", a), _whole("reset", "c3-", a, incarnation="sha256:i2")]
    with pytest.raises(NoSuchSessionError, match="replaced"):
        list(follow_remote(Frames(frames), "s1"))


def test_a_local_follow_of_a_log_repaired_to_drop_what_it_gave_says_reset(tmp_path):
    """``show -f`` on a store: a repair drops entries the follower gave (3 of 6), then 5 are
    appended. The follower says ``reset`` and gives the session afresh; before, it gave
    what lay past the count it had given in the new order, skipping the first new ones."""
    root = tmp_path / "st"
    writer = Store.init(root, sync="never")
    ids = _recorded(writer, 6)
    follower = Store(root, readonly=True)
    new: list[str] = []

    def rewrite(_interval: float) -> None:
        if new:
            return
        _damaged_and_repaired(root, writer, 3)
        with Store(root) as st:
            s = st.session("s1")
            new.extend(s.append(user(f"after {i}", 20 + i), durable=True).id for i in range(5))

    changes = follow_store(follower, "s1", sleep=rewrite)
    assert [next(changes).entry.id for _ in ids] == ids
    reset = next(changes)
    assert reset.kind == "reset" and reset.entry is None and reset.head == new[-1]
    rest = [next(changes) for _ in range(3 + 5)]
    assert [c.entry.id for c in rest] == ids[:3] + new
    changes.close()
    follower.close()


# -- PostgreSQL and memory ----------------------------------------------------------------


def test_a_memory_logs_resume_note_keeps_no_deleted_session_alive():
    """The memory backend's note of where a read ended named the session's data itself: a
    server's Tails (256 sessions) kept a deleted session's records alive. It names them
    weakly now, and still tells another incarnation apart."""
    st = Store("memory:")
    _recorded(st, 2)
    st.session("s1").close()
    sessions = st.backend.sessions
    got = sessions.history_since("s1", 0)
    data = weakref.ref(sessions.data.sessions["s1"])
    st.delete("s1")
    import gc

    gc.collect()
    assert data() is None, "the note kept the deleted session's data"
    _recorded(st, 1)
    again = sessions.history_since("s1", got.total, got.resume)
    assert again.whole and [r["op"] for r in again.records] == [r["op"] for r in sessions.history("s1").records][got.total:]
    st.close()


def test_the_servers_tails_let_go_of_a_deleted_session(tmp_path):
    """A session deleted through the server: its Tail (the records read, the handle) goes
    from the server's cache at once, not when 256 others push it out."""
    from starlette.testclient import TestClient

    from agentsession_cas.server.app import ServerState, create_app

    state = ServerState(Store.init(tmp_path / "st", sync="never"), None)
    with TestClient(create_app(state)) as c:
        assert c.post("/v1/sessions", json=Header.new("s1", created_at=TS).data).status_code == 201
        held = c.post("/v1/sessions/s1/lease", json={"holder": "test", "ttl_ms": 60_000}).json()
        assert c.get("/v1/sessions/s1").json()["cursor"]
        assert "s1" in state.tails._tails
        assert c.delete("/v1/sessions/s1", headers={"Lease-Token": str(held["token"])}).status_code == 200
        assert "s1" not in state.tails._tails
    state.store.close()


def test_a_postgresql_log_rewritten_to_the_same_length_is_read_whole(tmp_path):
    """A repair writes a session's log rows anew in one transaction (the old ones set
    aside); one that leaves the log as long as it was, ending in the same record (a repair
    ends with a commit and a checkpoint, as many logs do), was not seen by the next
    incremental read: the session's row said the same length, so it read nothing. Now the
    read notes the last row's version, which a rewrite replaces, and reads the log whole."""
    import psycopg

    import pg_server
    from agentsession_cas.backends.postgresql.database import parse_url
    from agentsession_cas.store.url import open_store

    url = pg_server.fresh_schema("fr")
    st = open_store(url, create=True)
    s = st.create(Header.new("s1", created_at=TS))
    s.append(user("one", 1))
    s.append(user("two", 2))
    s.commit()
    s.close()
    sessions = st.backend.sessions
    first = sessions.history_since("s1", 0)
    assert [r["op"] for r in first.records][-2:] == ["append", "commit"]
    conninfo, schema = parse_url(url)
    with psycopg.connect(conninfo) as c:
        c.execute(f"SET search_path TO {schema}")
        (key,) = c.execute("SELECT key FROM sessions WHERE id = 's1'").fetchone()
        rows = c.execute("SELECT pos, op, seq, hash, content, record FROM log WHERE session = %s ORDER BY pos",
                         [key]).fetchall()
        commit = rows[-1][1:]
        rows = [*rows[:-2], (rows[-2][0], *commit), rows[-1]]  # "two" dropped: a commit in its place
        c.execute("DELETE FROM log WHERE session = %s", [key])
        for row in rows:
            c.execute("INSERT INTO log (session, pos, op, seq, hash, content, record) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                      [key, *row])
    got = sessions.history_since("s1", first.total, first.resume)
    assert got.whole and got.total == first.total
    assert got.records == sessions.history("s1").records[first.total:]
    again = sessions.history_since("s1", 0)
    assert [r["op"] for r in again.records][-2:] == ["commit", "commit"]
    st.close()
