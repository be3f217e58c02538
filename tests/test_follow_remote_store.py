"""Following a session of a store opened over HTTP (``--store http://… show -f ID``):
through the server's follow stream, not by polling the log over the wire, with what a
follow of the same session in a local store gives.

The server is the tests' in-process one (tests/http_store.py: uvicorn on a loopback
port); nothing sleeps: the follower's ``sleep`` fails the test if it is called at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import http_store
from agentsession_cas import Header
from agentsession_cas.exchange.following import follow_store
from agentsession_cas.store import Store
from agentsession_cas.store.url import open_store
from contract_helpers import BACKENDS, StoreFactory, msg

TS = "2026-09-17T12:00:00Z"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[StoreFactory]:
    http = next(kind for kind in BACKENDS if kind.name == "http")
    factory = StoreFactory(http, tmp_path)
    yield factory
    errors = factory.close_all()
    http_store.release(tmp_path, factory.tag)
    assert not errors


def no_sleep(_interval: float) -> None:
    raise AssertionError("the follow polled: a store over HTTP is followed by its server's stream")


def _record(st: Store) -> list[str]:
    """Session s1: three messages, the head set back to the second (a head no append
    explains), committed."""
    s = st.create(Header.new("s1", created_at="2026-09-17T12:00:00Z"))
    ids = [s.append(msg(f"turn {i}", ts=TS), durable=True).id for i in range(3)]
    s.set_head(ids[1], expected=ids[2])
    s.commit()
    s.close()
    return ids


def _seen(changes: Iterator, n: int) -> list[tuple]:
    return [(c.kind, c.head, c.entry.id if c.entry is not None else None) for c in (next(changes) for _ in range(n))]


def test_a_store_over_http_is_followed_by_the_servers_stream_with_a_local_follows_changes(served, tmp_path):
    """The same session recorded in a local store and in one over HTTP: following each
    gives the same changes (each entry with the head, then the head no append explains),
    the HTTP one from the server's stream (no poll: ``sleep`` is never called; before, it
    read the whole log over HTTP every 0.1 s); an append committed later comes the same."""
    remote = served()
    ids = _record(remote)
    local = Store.init(tmp_path / "local", sync="never")
    assert _record(local) == ids
    polls: list[float] = []
    local_changes = follow_store(local, "s1", sleep=polls.append)
    remote_changes = follow_store(remote, "s1", sleep=no_sleep)
    want = _seen(local_changes, 4)
    assert want[-1] == ("head", ids[1], None) and want[0] == ("appended", ids[1], ids[0])
    assert _seen(remote_changes, 4) == want

    writer = open_store(remote.backend.url)
    with writer.session("s1") as s:
        new = s.append(msg("later", ts=TS), durable=True).id
    with local.session("s1") as s:
        assert s.append(msg("later", ts=TS), durable=True).id == new
    assert _seen(remote_changes, 1) == _seen(local_changes, 1) == [("appended", new, new)]
    remote_changes.close()
    local_changes.close()
    writer.close()
    local.close()


def test_show_f_of_a_store_over_http_prints_what_a_local_store_s_prints(served, tmp_path):
    """``agentsession --store URL show -f ID`` (the command, a process of its own) prints
    the lines ``--store DIR show -f ID`` prints for the same session."""
    import signal

    from test_server_follow import Lines, _show_f

    remote = served()
    _record(remote)
    local = Store.init(tmp_path / "local")
    _record(local)
    local.close()
    out = {}
    for name, where in (("remote", remote.backend.url), ("local", str(tmp_path / "local"))):
        proc = _show_f(["--store", where, "show", "-f", "s1"])
        lines = Lines(proc)
        try:
            out[name] = [lines.next() for _ in range(4)]
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 130
    assert out["remote"] == out["local"] and out["local"][-1].startswith("head -> ")


def test_an_empty_session_tells_no_head_until_its_first_entry(served, tmp_path):
    """A session with no entry and no head: nothing to tell, locally or over HTTP (a local
    follow gave a head change to no head, ``head -> -``, which a remote one did not)."""
    remote = served()
    local = Store.init(tmp_path / "local", sync="never")
    for st in (remote, local):
        st.create(Header.new("s1", created_at=TS)).close()
    script: list[float] = []

    def append_once(_interval: float) -> None:
        script.append(_interval)
        if len(script) == 1:
            with local.session("s1") as s:
                s.append(msg("first", ts=TS), durable=True)

    local_changes = follow_store(local, "s1", sleep=append_once)
    first = next(local_changes)
    assert first.kind == "appended" and first.entry.data["item"]["content"] == "first"
    with open_store(remote.backend.url) as writer, writer.session("s1") as s:
        s.append(msg("first", ts=TS), durable=True)
    remote_changes = follow_store(remote, "s1", sleep=no_sleep)
    assert _seen(remote_changes, 1) == [("appended", first.entry.id, first.entry.id)]
    local_changes.close()
    remote_changes.close()
    local.close()


def test_show_f_tells_a_reset_as_such_in_text(tmp_path, monkeypatch):
    """A ``reset`` change (the log rewritten under the follow, the entries following
    afresh) printed as a line saying so, not as a head move (it printed ``head -> X``)."""
    from click.testing import CliRunner

    from agentsession_cas.exchange import following
    from agentsession_cli.main import main

    st = Store.init(tmp_path / "st")
    ids = _record(st)
    st.close()
    e = Store(tmp_path / "st", readonly=True).entry(ids[0])

    def scripted(_store, sid, **_kw):
        yield following.Change("appended", sid, ids[0], e)
        yield following.Change("reset", sid, ids[0])
        yield following.Change("appended", sid, ids[0], e)

    monkeypatch.setattr(following, "follow_store", scripted)
    r = CliRunner().invoke(main, ["--store", str(tmp_path / "st"), "show", "-f", "s1"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert len(lines) == 3 and lines[0] == lines[2] and not lines[1].startswith("head -> "), lines
    assert "rewritten" in lines[1] and "void" in lines[1], lines
