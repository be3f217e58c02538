"""Maintenance racing work (issue 16): pack, sweep at the default grace and fsck in loops
while processes append, push in, fork and delete (race.py plays it). Afterwards every
acknowledged operation is whole and fsck is clean; fsck run during the race reports no
problem either (a live writer is not damage)."""

from __future__ import annotations

import pytest
from race import play, play_threads

SECONDS = 8.0


@pytest.mark.slow
def test_pack_sweep_and_fsck_racing_appends_pushes_forks_and_deletes(tmp_path):
    root = tmp_path / "store"
    from agentsession_cas.store import Store

    Store.init(root).close()
    race = play(str(root), tmp_path, SECONDS, (("pack",), ("sweep",)))
    print(race.figures())
    assert not race.failures, "\n".join(race.failures[:20])


@pytest.mark.slow
def test_the_race_over_postgresql(tmp_path):
    """The same race with the store in PostgreSQL (a throwaway server): the workers, the
    pushes and the maintenance commands reach it by its URL."""
    import pg_server
    from agentsession_cas.store.url import open_store

    url = pg_server.store_url(f"race_{tmp_path.name}")
    open_store(url, create=True).close()
    race = play(url, tmp_path, SECONDS, (("pack",), ("sweep",)))
    print(race.figures())
    assert not race.failures, "\n".join(race.failures[:20])



@pytest.mark.slow
def test_the_race_over_the_memory_backend(tmp_path):
    """A memory store is reached only by this process: the workers are threads, and pack,
    sweep and fsck run through the library, each in a loop of its own."""
    from agentsession_cas.store import Store

    url = f"memory:race-{tmp_path.name}"
    keep = Store.init(url)  # the named store lives while a handle does
    try:
        race = play_threads(url, tmp_path, SECONDS)
    finally:
        keep.close()
    print(race.figures())
    assert not race.failures, "\n".join(race.failures[:20])


# -- what the race found, each path forced ---------------------------------------------------


def _session(store, sid: str, n: int = 2):  # type: ignore[no-untyped-def]
    from agentsession_cas import Header, make_entry

    s = store.create(Header.new(sid))
    for i in range(n):
        s.append(make_entry("item", s.head, item={"type": "message", "role": "user", "content": f"{sid} {i}"}).data)
    return s


@pytest.mark.parametrize("url", ["memory:race-listed-then-deleted", "postgresql"])
def test_fsck_passes_over_a_session_deleted_after_it_listed_it(url, monkeypatch):
    """fsck lists the sessions, then checks each: one deleted in between was 'no such
    session' and fsck exited 1 (seen racing deletes over PostgreSQL)."""
    from agentsession_cas.maintenance.fsck import fsck
    from agentsession_cas.store import Store
    from agentsession_cas.store.url import open_store

    if url == "postgresql":
        import pg_server

        url = pg_server.fresh_schema("race_listed")
    store = open_store(url, create=True)
    try:
        _session(store, "kept").close()
        listed = store.list()
        monkeypatch.setattr(Store, "list", lambda self: [*listed, "gone-meanwhile"])
        report = fsck(store)
        assert report.ok, [p.message for p in report.errors]
        assert report.counts["sessions"] == 1
    finally:
        store.close()


def test_postgresql_fsck_reads_the_rows_in_one_snapshot(monkeypatch):
    """An append committed between fsck's read of the session rows and of a log's rows
    was 'its row says N log record(s), the log holds N+2' (seen racing appenders)."""
    import pg_server
    from agentsession_cas.backends.postgresql import fsck as pgfsck
    from agentsession_cas.store.url import open_store

    url = pg_server.fresh_schema("race_snapshot")
    store = open_store(url, create=True)
    writer = _session(store, "busy")
    other = open_store(url)
    try:
        real_conn = store.backend.db.conn
        appended = []

        class Conn:
            def __init__(self, c):  # type: ignore[no-untyped-def]
                self.c = c

            def __getattr__(self, name):  # type: ignore[no-untyped-def]
                return getattr(self.c, name)

            def execute(self, statement, *a, **kw):  # type: ignore[no-untyped-def]
                out = self.c.execute(statement, *a, **kw)
                if isinstance(statement, str) and statement.startswith("SELECT key, id, head") and not appended:
                    out = out.fetchall()  # the session rows are read: now a writer commits an append
                    from agentsession_cas import make_entry

                    appended.append(writer.append(make_entry(
                        "item", writer.head, item={"type": "message", "role": "user", "content": "meanwhile"}).data))
                    return _Rows(out)
                return out

        class _Rows:
            def __init__(self, rows):  # type: ignore[no-untyped-def]
                self.rows = rows

            def fetchall(self):  # type: ignore[no-untyped-def]
                return self.rows

        from contextlib import contextmanager

        @contextmanager
        def conn():  # type: ignore[no-untyped-def]
            with real_conn() as c:
                yield Conn(c)

        monkeypatch.setattr(store.backend.db, "conn", conn)
        from agentsession_cas.backends.base import FsckReport

        report = FsckReport("pg")
        pgfsck._check_rows(store.backend.db, report, lambda raw: None)  # (content columns: not this test's)
        assert appended, "the forced append did not happen"
        assert report.ok, [p.message for p in report.errors]
    finally:
        writer.close()
        other.close()
        store.close()


def test_a_snapshot_beside_a_live_writer_is_not_damage(tmp_path, monkeypatch):
    """A reader read the log, then HEAD: a writer committing between the two left HEAD
    naming an entry the reader's log lacked, and `show`/`export`/`log` called the session
    damaged ("the log has lost committed records"), seen racing a fork against an
    appender. Forced: the writer commits right after the reader's read of the log."""
    from agentsession_cas import make_entry
    from agentsession_cas.backends.files import sessions as files_sessions
    from agentsession_cas.store import Store

    root = tmp_path / "store"
    writer_store = Store.init(root)
    w = _session(writer_store, "live")
    w.commit()
    reader = Store(root)
    real = files_sessions.read_dense
    fired = []

    def read_then_write(path, *a, **kw):  # type: ignore[no-untyped-def]
        data = real(path, *a, **kw)
        if str(path).endswith("/live/log") and len(fired) < 2:
            entry = make_entry("item", w.head, item={"type": "message", "role": "user", "content": f"x{len(fired)}"})
            fired.append(w.append(entry.data, durable=False))
            w.commit()  # the log's commit, then HEAD
        return data

    monkeypatch.setattr(files_sessions, "read_dense", read_then_write)
    try:
        snap = reader.read("live")  # was SessionDamagedError
        snap.close()
        history = reader.history("live")  # `log ID`: the same order
        assert len(fired) == 2
        assert not history.damage, history.damage
    finally:
        monkeypatch.undo()
        w.close()
        writer_store.close()
        reader.close()


def test_a_memory_put_waits_for_a_sweep_deciding_under_the_lock():
    """A sweep of the memory backend decides under the store's lock; a put from another
    thread changed its dicts meanwhile ("dictionary changed size during iteration", seen
    racing). Forced: the lock is held as a sweep holds it; the put must wait for it."""
    import threading

    from agentsession_cas.format.hashing import sha256_ref
    from agentsession_cas.store import Store

    store = Store.init("memory:race-put-waits")
    try:
        objects = store.backend.objects
        done = threading.Event()
        data = b"an object"
        worker = threading.Thread(target=lambda: (objects.put("blobs", sha256_ref(data), data), done.set()))
        with store.backend.data.lock:  # what sweep_objects holds while it walks the dicts
            worker.start()
            assert not done.wait(0.5), "the put changed the objects while the sweep held the lock"
        assert done.wait(30)
        worker.join()
        assert objects.get("blobs", sha256_ref(data)) == data
    finally:
        store.close()
