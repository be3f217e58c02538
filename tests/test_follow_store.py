"""Following a stored session (``show -f``, ``exchange.following.follow_store``): what a
poll costs and what it keeps, on every backend.

Nothing sleeps: the follower's ``sleep`` is a script that counts the polls and makes
the writes a test wants between two of them, and the reads a poll makes are counted
(the store's snapshot opens, the backend's whole-log reads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentsession_cas import Header
from agentsession_cas.errors import NoSuchSessionError
from agentsession_cas.exchange.following import Change, follow_store
from agentsession_cas.store import Store
from contract_helpers import BACKENDS, StoreFactory

#: The backends a follower polls (a store over HTTP is followed by its server's stream:
#: tests/test_follow_remote_store.py).
POLLED = [kind for kind in BACKENDS if kind.name != "http"]


def user(text: str, n: int = 0) -> dict:
    return {"type": "item", "ts": f"2026-09-17T12:{n // 60 % 60:02d}:{n % 60:02d}Z",
            "item": {"type": "message", "role": "user", "content": text}}


@pytest.fixture(params=POLLED, ids=str)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    assert not factory.close_all()


class Script:
    """The follower's sleep: counts polls and runs, after poll ``n``, what ``at[n]`` says."""

    def __init__(self) -> None:
        self.polls = 0
        self.at: dict[int, Callable[[], None]] = {}

    def __call__(self, _interval: float) -> None:
        self.polls += 1
        action = self.at.pop(self.polls, None)
        if action is not None:
            action()


class Reads:
    """Counts a store's snapshot opens and its backend's whole-log reads."""

    def __init__(self, st: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opens = self.wholes = 0
        read, history = st.read, st.backend.sessions.history

        def counted_read(session_id: str):  # type: ignore[no-untyped-def]
            self.opens += 1
            return read(session_id)

        def counted_history(session_id: str):  # type: ignore[no-untyped-def]
            self.wholes += 1
            return history(session_id)

        monkeypatch.setattr(st, "read", counted_read)
        monkeypatch.setattr(st.backend.sessions, "history", counted_history)


def _session(st: Store, n: int, sid: str = "s1") -> list[str]:
    s = st.create(Header.new(sid, created_at="2026-09-17T12:00:00Z"))
    ids = [s.append(user(f"turn {i}", i)).id for i in range(n)]
    s.close()
    return ids


def test_an_idle_poll_reads_nothing_of_the_log(stores, monkeypatch):
    """Polls with nothing written read no log and open no snapshot (before, each poll
    opened the session and read its whole log: 100,000 entries ten times a second); the
    next append is read alone. On PostgreSQL an idle poll is one query of the session's
    row; on the file store one fstat of the log (counted here: no whole read)."""
    st = stores()
    ids = _session(st, 30)
    reads = Reads(st, monkeypatch)
    script = Script()
    later: list[str] = []

    def append() -> None:
        with st.session("s1") as s:
            later.append(s.append(user("later", 99), durable=True).id)

    script.at[6] = append
    changes = follow_store(st, "s1", sleep=script)
    assert [next(changes).entry.id for _ in ids] == ids
    first = (reads.opens, reads.wholes)
    assert first[0] == 1  # the first read opens the session (its checks) once
    got = next(changes)  # after five idle polls and the one that finds the append
    assert got.kind == "appended" and got.entry.id == later[0] and got.head == later[0]
    assert script.polls == 6
    assert (reads.opens, reads.wholes) == first, "an idle poll read the log"
    changes.close()


def test_entries_come_once_in_commit_order_and_unexplained_head_moves_are_told(stores):
    """What a poll reports is what it did: each committed entry once, in log order, an
    uncommitted one only once committed, and a head move no append explains (the head
    set back) as a ``head`` change."""
    st = stores(sync="never")  # (an append is committed when it asks, or at commit())
    ids = _session(st, 3)
    script = Script()
    w = st.session("s1")
    lazy: list[str] = []

    script.at[1] = lambda: lazy.append(w.append(user("lazy", 10)).id)  # written, not committed
    script.at[3] = w.commit
    script.at[5] = lambda: (w.set_head(ids[1], expected=lazy[0]), w.commit())
    changes = follow_store(st, "s1", sleep=script)
    assert [next(changes).entry.id for _ in ids] == ids
    got = next(changes)
    assert script.polls == 3 and got.entry.id == lazy[0]  # not at poll 1 or 2: not committed
    moved = next(changes)
    assert moved == Change("head", "s1", ids[1])
    w.close()
    changes.close()


def test_a_writer_elsewhere_is_followed_though_its_objects_are_only_in_its_log(stores):
    """The writer is another handle (as another process is): the entries it appends are
    read though their objects are still only in its log (the file store's payloads, until
    a checkpoint), which a poll that reads only the new lines takes from them."""
    st = stores(sync="never")
    ids = _session(st, 2)
    follower = stores.reopen(readonly=True)
    w = st.session("s1")
    script = Script()
    new: list[str] = []
    script.at[1] = lambda: new.extend(w.append(user(f"more {i}", i), durable=True).id for i in range(3))
    changes = follow_store(follower, "s1", sleep=script)
    assert [next(changes).entry.id for _ in ids] == ids
    got = [next(changes) for _ in range(3)]
    assert [c.entry.id for c in got] == new and got[1].entry.data["item"]["content"] == "more 1"
    changes.close()
    w.close()


def test_an_append_read_before_its_commit_is_read_once_committed(stores):
    """A first read finds a writer's append written but not committed (its objects only in
    the writer's log); a later poll reads only the commit, and the entry is read then."""
    st = stores(sync="never")
    ids = _session(st, 1)
    follower = stores.reopen(readonly=True)
    w = st.session("s1")
    lazy = w.append(user("lazy", 5)).id
    script = Script()
    script.at[1] = w.commit
    changes = follow_store(follower, "s1", sleep=script)
    assert next(changes).entry.id == ids[0]
    got = next(changes)
    assert got.entry.id == lazy and script.polls == 1
    changes.close()
    w.close()


def test_a_followed_session_deleted_or_created_again_ends_the_follow(stores):
    st = stores()
    _session(st, 2)
    script = Script()
    script.at[2] = lambda: st.delete("s1")
    changes = follow_store(st, "s1", sleep=script)
    next(changes), next(changes)
    with pytest.raises(NoSuchSessionError, match="deleted while followed"):
        next(changes)

    _session(st, 2, "s2")
    script = Script()

    def again() -> None:
        st.delete("s2")
        s = st.create(Header.new("s2", created_at="2026-09-17T13:00:00Z"))
        s.append(user("another", 1))
        s.close()

    script.at[2] = again
    changes = follow_store(st, "s2", sleep=script)
    next(changes), next(changes)
    with pytest.raises(NoSuchSessionError, match="created again while followed"):
        next(changes)


def test_a_log_compacted_while_followed_is_read_afresh_and_nothing_repeats(tmp_path, monkeypatch):
    """The file store compacts a log (a snapshot record in place of the records a
    checkpoint covers: another file, other positions) as its writers close: the follower's
    next poll is told (``whole``), reads the log afresh and gives only the entries it had
    not given."""
    st = Store.init(tmp_path / "st", sync="never")
    _session(st, 2)
    reads = Reads(st, monkeypatch)
    script = Script()
    written: list[str] = []

    def burst(n: int) -> Callable[[], None]:
        def go() -> None:
            for i in range(8):  # ~8 KiB an entry: a writer's close past 64 KiB compacts
                with st.session("s1") as s:
                    written.append(s.append(user(f"{n}.{i} " + "x" * 8192, i), durable=True).id)
        return go

    for poll in range(1, 12):
        script.at[poll] = burst(poll)
    changes = follow_store(st, "s1", sleep=script)
    got = [next(changes).entry.id for _ in range(2 + 8 * 11)]
    assert got[2:] == written and len(set(got)) == len(got)
    assert reads.opens > 1  # the log was compacted under the follower, and read afresh
    assert st.backend.sessions.history_since("s1", 0).records[1]["op"] == "append"  # (expanded snapshot)
    changes.close()
    st.close()


@pytest.fixture(params=BACKENDS, ids=str)
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory(request.param, tmp_path)
    yield factory
    errors = factory.close_all()
    if request.param.release is not None:
        request.param.release(tmp_path, factory.tag)
    assert not errors


def test_history_since_gives_the_records_after_start_and_says_when_it_read_whole(any_store):
    """The seam's ``history_since`` on every backend: the records after ``start`` are
    those of a whole read; read on from its note (``whole`` false) only while the note
    is the log's, and whole again for another incarnation of the session."""
    st = any_store()
    sessions = st.backend.sessions
    _session(st, 2)
    first = sessions.history_since("s1", 0)
    assert first.whole and first.records == sessions.history("s1").records and first.total == len(first.records)
    with st.session("s1") as s:
        s.append(user("more", 5), durable=True)
    whole = sessions.history("s1").records
    got = sessions.history_since("s1", first.total, first.resume)
    assert got.records == whole[first.total:] and got.total == len(whole)
    idle = sessions.history_since("s1", got.total, got.resume)
    assert idle.records == [] and idle.total == got.total
    if any_store.kind.name != "http":  # (over HTTP the log is read whole: a server follows it itself)
        assert not got.whole and not idle.whole
    st.delete("s1")
    _session(st, 1)
    again = sessions.history_since("s1", idle.total, idle.resume)
    assert again.whole and again.records == sessions.history("s1").records[idle.total:]
