"""A follower taken up from its cursor is told what was committed while it was away
(RFC 0003, Following: "the server MUST send [a ``committed``] when a commit covers records
it sent as not durable").

An open stream says ``committed`` when it passes the commit that covers what it sent as
not durable. A follower that reconnects (``Last-Event-ID`` or ``after``) is a new stream:
it used to start knowing of nothing sent as not durable, so a commit made while the
follower was away, or after it came back, was never told, and the follower held those
records as not durable for good. The server's stream is driven here in this process
(``test_follow_rewrite.Follow``): nothing sleeps and nothing races.
"""

from __future__ import annotations

import json

import pytest

from agentsession_cas.backends.files import sessions as files_sessions
from agentsession_cas.exchange.following import follow_remote
from agentsession_cas.server.app import _log_lines
from agentsession_cas.server.follow import parse_cursor
from agentsession_cas.store import Store
from test_follow_rewrite import Follow, Frames, _appended, _chain, _recorded, _whole, user


def position(event_or_cursor: dict | str) -> int:
    cursor = event_or_cursor if isinstance(event_or_cursor, str) else event_or_cursor["id"]
    parsed = parse_cursor(cursor)
    assert parsed is not None
    return parsed[0]


def _told_lazy(st: Store, source: str, n: int = 2) -> tuple[str, str]:
    """s1 with ``n`` durable appends, then a lazy one that a follower is told of as not
    durable, through ``source``: a follow stream, then dropped, or a log read. Returns the
    lazy entry and the cursor the follower resumes from."""
    _recorded(st, n)
    s = st.session("s1")
    if source == "follow":
        follow = Follow(st, "s1")
        assert follow.next()["event"] == "snapshot"
        lazy = s.append(user("lazy", 5), durable=False).id
        (ev,) = follow.wake()
        assert ev["event"] == "appended" and ev["data"]["entry"] == lazy and ev["data"]["durable"] is False
        follow.close()  # (the connection drops)
        return lazy, ev["id"]
    lazy = s.append(user("lazy", 5), durable=False).id
    lines = [json.loads(x) for x in _log_lines("s1", s.records(), dict(s.header.data), False, None)]
    assert lines[-2]["entry"] == lazy and lines[-2]["durable"] is False
    return lazy, lines[-1]["cursor"]


@pytest.mark.parametrize("durable", [False, True], ids=["live", "durable"])
@pytest.mark.parametrize("source", ["follow", "log"])
def test_a_commit_made_while_the_follower_was_away_is_told_on_resume(tmp_path, source, durable):
    """Told of a lazy append as not durable, away while it was committed, back with its
    cursor: the first event is ``committed``, its cursor at or past the lazy append's;
    nothing else is due. Before, the resumed stream passed over the commit record in
    silence (it knew of nothing sent as not durable)."""
    st = Store.init(tmp_path / "st", sync="never")
    _lazy, cursor = _told_lazy(st, source)
    st.session("s1").commit()
    resumed = Follow(st, "s1", after=cursor, durable=durable)
    ev = resumed.next()
    assert ev["event"] == "committed", ev
    assert position(ev) >= position(cursor) and ev["id"].startswith(ev["data"]["cursor"] + ".")
    assert resumed.wake() == []  # (and it is told once)
    resumed.close()
    st.close()


def test_a_commit_made_after_the_follower_came_back_is_told(tmp_path):
    """Back with its cursor before the commit: nothing is due, and the commit, when it
    comes, is told. Before, the resumed stream never said it."""
    st = Store.init(tmp_path / "st", sync="never")
    _lazy, cursor = _told_lazy(st, "follow")
    resumed = Follow(st, "s1", after=cursor)
    assert resumed.wake() == []
    st.session("s1").commit()
    events = resumed.wake()
    assert [e["event"] for e in events] == ["committed"] and position(events[0]) > position(cursor)
    resumed.close()
    st.close()


@pytest.mark.parametrize("n", [2, 4])
def test_a_commit_and_a_compaction_while_the_follower_was_away(tmp_path, monkeypatch, n):
    """Away while the lazy append was committed, the writer's log compacted at its close
    (its records counted anew) and one more lazy append made: back, the follower is told
    ``committed`` before that append, which comes as not durable. After 2 durable appends
    the compacted log has as many records as before and the follower's place is its
    cursor's; after 4 it has fewer, the cursor's position names the later append, and the
    place is found by the state the follower was told (past the commit: the ``committed``
    comes at that place)."""
    st = Store.init(tmp_path / "st", sync="never")
    lazy, cursor = _told_lazy(st, "follow", n)
    monkeypatch.setattr(files_sessions, "COMPACT_AT_CLOSE", 1)
    s = st.session("s1")
    s.commit()
    before = [r["op"] for r in s.records()]
    s.close()
    s = st.session("s1")
    after = [r["op"] for r in s.records()]
    assert after != before and after.count("commit") == 1, "no compaction ran"
    later = s.append(user("later", 6), durable=False).id
    resumed = Follow(st, "s1", after=cursor)
    first, second = resumed.next(), resumed.next()
    assert first["event"] == "committed", first
    assert second["event"] == "appended" and second["data"]["entry"] == later and second["data"]["durable"] is False
    assert position(second) > position(first)
    assert resumed.wake() == []
    resumed.close()
    # Back again from the ``committed`` itself: it is not said twice.
    again = Follow(st, "s1", after=first["id"])
    assert again.next() == second
    again.close()
    st.close()


def test_a_follower_told_nothing_not_durable_is_told_no_commit_on_resume(tmp_path):
    """Durable appends only: a resume from the snapshot's id, or from an ``appended`` sent
    as durable (its cursor before the append's commit record: the two were written, and
    read, together), sends no ``committed``; nor does a durable append after."""
    st = Store.init(tmp_path / "st", sync="never")
    _recorded(st, 3)
    follow = Follow(st, "s1")
    snap = follow.next()
    s = st.session("s1")
    durable = s.append(user("durable", 6), durable=True).id
    (ev,) = follow.wake()
    assert (ev["event"], ev["data"]["entry"], ev["data"]["durable"]) == ("appended", durable, True)
    follow.close()
    s.commit()
    from_appended = Follow(st, "s1", after=ev["id"])
    assert from_appended.wake() == []
    from_snapshot = Follow(st, "s1", after=snap["id"])
    assert [(e["event"], e["data"].get("entry")) for e in [from_snapshot.next()]] == [("appended", durable)]
    assert from_snapshot.wake() == []
    new = s.append(user("more", 7), durable=True).id
    for resumed in (from_appended, from_snapshot):
        events = resumed.wake()
        assert [(e["event"], e["data"].get("entry"), e["data"].get("durable")) for e in events] == [("appended", new, True)]
        resumed.close()
    st.close()


def test_follow_remote_passes_over_a_committed_event():
    """The library's remote follow reads the durable stream, whose changes are committed
    already: a ``committed`` there (one a resume sends) gives no change, and the follow
    goes on with the events after it."""
    a = _chain(3)
    frames = [_whole("snapshot", "c1-", a[:2]), {"event": "committed", "id": "c2.0", "data": {"cursor": "c2"}},
              _appended("c3", a[2])]
    got = list(follow_remote(Frames(frames), "s1"))
    assert [(c.kind, c.entry.id if c.entry else None) for c in got] == [("appended", e[0]) for e in a]


def test_an_open_stream_that_finds_its_place_past_the_commit_says_committed(tmp_path, monkeypatch):
    """An open stream told of a lazy append; the append committed, the log compacted to
    fewer records (the stream finds its place by its state, past the commit record) and
    one more lazy append made: the stream says ``committed`` before that append. Before,
    it said it only when nothing came after the commit, so here never."""
    st = Store.init(tmp_path / "st", sync="never")
    _recorded(st, 4)
    follow = Follow(st, "s1")
    assert follow.next()["event"] == "snapshot"
    s = st.session("s1")
    lazy = s.append(user("lazy", 5), durable=False).id
    assert [(e["event"], e["data"]["durable"]) for e in follow.wake()] == [("appended", False)]
    monkeypatch.setattr(files_sessions, "COMPACT_AT_CLOSE", 1)
    s.commit()
    s.close()
    s = st.session("s1")
    later = s.append(user("later", 6), durable=False).id
    events = follow.wake()
    assert [(e["event"], e["data"].get("entry")) for e in events] == [("committed", None), ("appended", later)]
    assert lazy != later
    follow.close()
    st.close()


def test_a_cursor_with_digits_that_are_not_ascii_is_no_cursor():
    """A cursor comes from the client (``Last-Event-ID``, ``after``): digits ``int`` does
    not take ('²' is a digit to ``str.isdigit``) are no cursor of this server's, never a
    ValueError inside a stream already answering."""
    from agentsession_cas.server.follow import _event_index

    tag, check = "a" * 16, "b" * 16
    assert parse_cursor(f"3-{tag}-{check}") is not None
    assert parse_cursor(f"²-{tag}-{check}") is None
    assert parse_cursor(f"٣-{tag}-{check}") is None  # (an Arabic-Indic three: decimal, not ASCII)
    assert _event_index(f"3-{tag}-{check}.1") == 1
    assert _event_index(f"3-{tag}-{check}.²") == 0
