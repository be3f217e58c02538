"""A durable append over HTTP waits for its fsync without the server's lock (session 42).

The server orders every write under one lock; a durable append's fsync used to be
waited for under it, so the commits of writers of different sessions (each its own
log) queued one after another for the disk. The log's commit is now written under the
lock and its fsync waited for after it is let go (``SessionLog.syncs_deferred``), so
those fsyncs overlap; each append is still answered only once the fsync covering it
has returned. These tests force the interleaving: one session's fsync is held while
another session's durable append goes through.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from agentsession_cas import Header
from agentsession_cas.server.app import ServerState, create_app
from agentsession_cas.store import Store


def _entry(n: int) -> bytes:
    return json.dumps({"type": "item", "ts": "2026-09-17T12:00:01Z",
                       "item": {"type": "message", "role": "user", "content": f"hello {n}"}}).encode()


def _leased(c: TestClient, sid: str) -> str:
    c.post("/v1/sessions", json=Header.new(sid, created_at="2026-09-17T12:00:00Z").data).raise_for_status()
    r = c.post(f"/v1/sessions/{sid}/lease", json={"ttl_ms": 60_000})
    r.raise_for_status()
    return str(r.json()["token"])


def _append(c: TestClient, sid: str, token: str, n: int, out: dict[str, object]) -> None:
    out[sid] = c.post(f"/v1/sessions/{sid}/entries", content=_entry(n), params={"commit": "true"},
                      headers={"Lease-Token": token})


class _HeldFsync:
    """``os.fsync`` held for one file (by inode) until released; every fsync counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False):
        self.real = os.fsync
        self.inode: int | None = None
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = fail
        self.calls: list[int] = []
        monkeypatch.setattr(os, "fsync", self)

    def __call__(self, fd: int) -> None:
        ino = os.fstat(fd).st_ino
        self.calls.append(ino)
        if ino == self.inode:
            self.entered.set()
            assert self.release.wait(30)
            if self.fail:
                raise OSError(5, "Input/output error")
        self.real(fd)


def test_a_durable_append_is_answered_after_its_fsync_and_others_go_on_meanwhile(tmp_path: Path, monkeypatch):
    state = ServerState(Store.init(tmp_path / "st", sync="always"), None)
    with TestClient(create_app(state)) as c:
        ta, tb = _leased(c, "a"), _leased(c, "b")
        held = _HeldFsync(monkeypatch)
        held.inode = os.stat(tmp_path / "st" / "sessions" / "a" / "log").st_ino
        got: dict[str, object] = {}
        first = threading.Thread(target=_append, args=(c, "a", ta, 0, got))
        first.start()
        try:
            _interleaved(c, tb, held, first, got)
        finally:
            held.release.set()  # (a failed assertion must not leave a's fsync held)
        first.join(20)
        ra = got["a"]
        assert ra.status_code == 200 and ra.json()["results"][0]["durable"] is True  # type: ignore[attr-defined]
        assert ra.json()["stopped"] is None  # type: ignore[attr-defined]
    with Store(tmp_path / "st") as st:
        assert len(st.read("a")) == 1 and len(st.read("b")) == 1


def _interleaved(c: TestClient, tb: str, held: _HeldFsync, first: threading.Thread, got: dict[str, object]) -> None:
    """While a's fsync is held: b's durable append goes through the lock and its own
    fsync, and a is not answered."""
    assert held.entered.wait(30), "session a's append never reached its fsync"
    # a's fsync is held: b's durable append goes through the lock and its own fsync.
    second = threading.Thread(target=_append, args=(c, "b", tb, 0, got))
    second.start()
    second.join(10)
    assert not second.is_alive(), "b's durable append waited for a's fsync (the lock held across it)"
    rb = got["b"]
    assert rb.status_code == 200 and rb.json()["results"][0]["durable"] is True  # type: ignore[attr-defined]
    # ... and a is not answered before its fsync returns.
    assert first.is_alive() and "a" not in got


def test_a_deferred_fsync_that_fails_is_a_failed_append_and_stops_the_session(tmp_path: Path, monkeypatch):
    """As a failed fsync in line: the append is answered as the server's failure, and the
    session takes no more writes until reopened."""
    state = ServerState(Store.init(tmp_path / "st", sync="always"), None)
    with TestClient(create_app(state)) as c:
        ta = _leased(c, "a")
        held = _HeldFsync(monkeypatch, fail=True)
        held.inode = os.stat(tmp_path / "st" / "sessions" / "a" / "log").st_ino
        held.release.set()
        got: dict[str, object] = {}
        _append(c, "a", ta, 0, got)
        r = got["a"]
        assert r.status_code == 500, r.text  # type: ignore[attr-defined]
        assert "Input/output error" in r.json()["detail"]  # type: ignore[attr-defined]
        held.inode = None
        _append(c, "a", ta, 1, got)
        r = got["a"]
        assert r.status_code == 500 and r.json()["code"] == "store_fault"  # type: ignore[attr-defined]
        assert "stopped writing after an fsync failed" in r.json()["detail"]  # type: ignore[attr-defined]


def test_a_commit_an_fsync_begun_after_it_covered_makes_none_of_its_own(tmp_path: Path, monkeypatch):
    """Group commit within one log: two commits written under the lock, then both waited
    for; the later one's fsync covers the earlier, which makes no second."""
    with Store.init(tmp_path / "st") as st:
        s = st.create(Header.new("a", created_at="2026-09-17T12:00:00Z"))
        held = _HeldFsync(monkeypatch)
        with s.log.syncs_deferred() as first:
            s.append(json.loads(_entry(0)), durable=True)
        with s.log.syncs_deferred() as second:
            s.append(json.loads(_entry(1)), durable=True)
        assert first.owed and second.owed and held.calls == []  # nothing waited for yet
        second.sync()
        assert len(held.calls) == 1
        first.sync()
        assert len(held.calls) == 1  # covered by the second's
        assert not first.owed and not second.owed


def test_head_is_not_written_before_the_deferred_fsync_of_its_commit(tmp_path: Path, monkeypatch):
    """HEAD may lag the log, never lead it: a commit whose fsync is deferred leaves it as
    it was (the next commit or close sets it)."""
    with Store.init(tmp_path / "st") as st:
        s = st.create(Header.new("a", created_at="2026-09-17T12:00:00Z"))
        s.append(json.loads(_entry(0)), durable=True)
        s.commit()
        head_file = tmp_path / "st" / "sessions" / "a" / "HEAD"
        before = head_file.read_text() if head_file.exists() else ""
        r = s.append(json.loads(_entry(1)), durable=False)
        held = _HeldFsync(monkeypatch)
        with s.log.syncs_deferred() as owed:
            s.commit()
        assert owed.owed and held.calls == []
        assert (head_file.read_text() if head_file.exists() else "") == before
        owed.sync()
        assert len(held.calls) == 1
    assert head_file.read_text().strip() == r.head  # set at close
