"""``list`` from session summaries (agentsession_cas/store/summary.py): what it shows, that it
reads no log while summaries are current, that a stale one costs only what was appended
since, its filters and order, and that a bad summary file is only an index to rebuild."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

import agentsession_cas.backends.files.sessions as files_sessions
from agentsession_cas import Header
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from agentsession_cas.store.summary import SessionSummary, parse_when, seconds, select
from storetools import count_entry_reads


def _main():
    from agentsession_cli.main import main as m

    return m


def cli(store: Path, *args: str):
    return CliRunner().invoke(_main(), ["--store", str(store), *args], catch_exceptions=False)


def item(text: str, ts: str) -> dict:
    return {"type": "item", "ts": ts, "item": {"type": "message", "role": "user", "content": text}}


def make(st: Store, sid: str, *, day: int, harness: str = "claw", cwd: str = "/w/proj", model: str = "m1",
         title: str | None = None, n: int = 2) -> None:
    s = st.create(Header.new(sid, created_at=f"2026-03-{day:02d}T08:00:00.5Z", harness={"name": harness, "version": "2"},
                             cwd=cwd))
    s.append({"type": "config", "model": model, "ts": f"2026-03-{day:02d}T08:00:01Z"})
    for i in range(n):
        s.append(item(f"hi {i}", f"2026-03-{day:02d}T09:00:0{i}.123456789Z"))
    if title is not None:
        s.append({"type": "info", "name": title, "ts": f"2026-03-{day:02d}T10:00:00Z"})
    s.close()


@pytest.fixture
def store(tmp_path) -> Path:
    root = tmp_path / "store"
    st = Store.init(root)
    make(st, "a", day=1, title="Refactor auth")
    make(st, "b", day=3, harness="other", cwd="/w/elsewhere", model="m2")
    make(st, "c", day=2, cwd="/w/proj/sub", n=4)
    st.close()
    return root


def test_list_shows_what_a_person_looks_for_newest_first(store):
    rows = json.loads(cli(store, "list", "--json").stdout)
    assert [r["session"] for r in rows] == ["b", "c", "a"]
    a = rows[2]
    assert a["title"] == "Refactor auth" and a["model"] == "m1" and a["harness"] == "claw 2" and a["cwd"] == "/w/proj"
    assert a["created"] == "2026-03-01T08:00:00Z", "seconds, not fractions"
    assert a["last_activity"] == "2026-03-01T10:00:00Z"
    assert a["entries"] == 4 and a["mark"] == "record" and a["head"].startswith("sha256:")
    text = cli(store, "list").stdout.splitlines()
    assert text[0].split() == ["ID", "TITLE", "MODEL", "HARNESS", "CREATED", "ACTIVE", "ENTRIES", "HEAD", "MARK"]
    assert text[3].startswith("a ") and "Refactor auth" in text[3]


def test_a_long_session_id_does_not_push_the_other_columns_off_the_line(store):
    """Ids run to 200 characters: one that long is cut (as a long title is) so ENTRIES,
    HEAD and MARK stay on every row; what is printed of it is a prefix that names it."""
    long_id = "imported-from-a-harness-that-names-sessions-verbosely-" + "x" * 90
    with Store(str(store)) as st:
        make(st, long_id, day=4)
    text = cli(store, "list").stdout.splitlines()
    assert all(line.split()[-1] == "record" for line in text[1:]), text  # MARK, never cut away
    [row] = [line for line in text if line.startswith("imported-")]
    shown = row.split()[0]
    assert shown.endswith("…") and len(shown) < 50 and long_id.startswith(shown[:-1])
    assert cli(store, "rev-parse", shown[:-1]).stdout.strip() == long_id
    assert json.loads(cli(store, "list", "--json").stdout)[0]["session"] == long_id  # whole in JSON


@pytest.mark.parametrize(
    ("args", "ids"),
    [
        (["--limit", "2"], ["b", "c"]),
        (["--harness", "claw"], ["c", "a"]),
        (["--harness", "claw 2"], ["c", "a"]),
        (["--harness", "cla"], []),
        (["--cwd", "/w/proj"], ["c", "a"]),
        (["--cwd", "/w/proj/sub"], ["c"]),
        (["--cwd", "/w/pro"], []),
        (["--after", "2026-03-02"], ["b", "c"]),
        (["--before", "2026-03-02T09:00:03Z"], ["a"]),
        (["--before", "2026-03-02T09:00:04Z"], ["c", "a"]),
        (["--after", "2026-03-02", "--before", "2026-03-03"], ["c"]),
    ],
)
def test_filters(store, args, ids):
    assert [r["session"] for r in json.loads(cli(store, "list", "--json", *args).stdout)] == ids


def test_a_bad_date_is_one_clear_error(store):
    r = cli(store, "list", "--after", "yesterday-ish")
    # a usage error, as a bad value click refuses (docs/cli.md "Options"): exit 2, the option named
    assert r.exit_code == 2 and "Invalid value for '--after'" in r.stderr and "not a date" in r.stderr


def test_current_summaries_are_listed_without_reading_any_log(store, monkeypatch):
    def no_log(*a, **k):
        raise AssertionError("list read a log")

    monkeypatch.setattr(files_sessions, "read_log", no_log)
    rows = json.loads(cli(store, "list", "--json").stdout)
    assert [r["entries"] for r in rows] == [3, 5, 4]


def test_a_stale_summary_reads_only_the_entries_appended_since(store, monkeypatch):
    # Append as another writer would, then crash before close (no new summary).
    st = Store(store)
    s = st.session("a")
    s.append(item("later", "2026-03-09T00:00:00Z"))
    s.append({"type": "info", "name": "Renamed", "ts": "2026-03-09T00:00:01Z"})
    s.commit()
    from storetools import crash

    crash(st)
    reads = count_entry_reads(monkeypatch)
    ro = Store(store, readonly=True)
    s = ro.summary("a")
    assert (s.entries, s.title, s.last_activity) == (6, "Renamed", "2026-03-09T00:00:01Z")
    assert len(reads) == 2, "only the two entries appended since the summary was kept"


def test_a_damaged_or_foreign_summary_is_rebuilt_never_an_error(store):
    (store / "sessions" / "a" / "summary").write_bytes(b"garbage\n")
    (store / "sessions" / "c" / "summary").write_bytes((store / "sessions" / "b" / "summary").read_bytes())
    rows = {r["session"]: r for r in json.loads(cli(store, "list", "--json").stdout)}
    assert rows["a"]["title"] == "Refactor auth" and rows["c"]["entries"] == 5 and rows["c"]["model"] == "m1"


def test_fsck_warns_of_a_current_summary_that_disagrees_with_its_log(store):
    from agentsession_cas.backends.files.log import checked_body, checksummed_line
    from agentsession_cas.format.canonical import canonical_bytes, loads

    path = store / "sessions" / "a" / "summary"
    data = loads(checked_body(path.read_bytes()))
    data["summary"]["entries"] = 99
    log = store / "sessions" / "a" / "log"
    st = log.stat()
    path.write_bytes(checksummed_line(canonical_bytes(data)))
    assert data["log"] == [str(st.st_ino), str(st.st_size), str(st.st_mtime_ns)]
    report = fsck(store)
    assert [p.code for p in report.warnings] == ["stale-summary"]
    assert "entries" in report.warnings[0].message


def test_summary_is_kept_by_every_backend_the_same(tmp_path):
    for url in (str(tmp_path / "f"), "memory:summary-test"):
        st = Store.init(url) if not url.startswith("memory:") else Store(url_backend(url))
        make(st, "x", day=4, title="T")
        kept = st.backend.sessions.summary("x")
        assert kept is not None and kept[1], url
        s = st.summary("x")
        assert (s.title, s.entries, s.model) == ("T", 4, "m1")
        w = st.session("x")
        w.append(item("more", "2026-03-04T11:00:00Z"))
        assert st.backend.sessions.summary("x")[1] is False, "a write makes the kept one stale"
        assert st.summary("x").entries == 5
        w.close()
        assert st.backend.sessions.summary("x")[1]
        st.close()


def url_backend(url: str):
    from agentsession_cas.backends import open_backend

    return open_backend(url, create=True)


def test_parse_when_and_seconds():
    now = datetime(2026, 3, 10, 12, 0, 0, tzinfo=UTC)
    assert parse_when("3d", now=now) == "2026-03-07T12:00:00Z"
    assert parse_when("90m", now=now) == "2026-03-10T10:30:00Z"
    assert parse_when("2026-03-02") == "2026-03-02T00:00:00Z"
    assert parse_when("2026-03-02T03:04Z") == "2026-03-02T03:04:00Z"
    assert parse_when("2026-03-02 03:04:05") == "2026-03-02T03:04:05Z"
    for bad in ("2026-13-01", "soon", "3 days", ""):
        with pytest.raises(ValueError):
            parse_when(bad)
    assert seconds("2026-03-02T03:04:05.123Z") == "2026-03-02T03:04:05Z"
    assert seconds("2026-03-02T03:04:05Z") == "2026-03-02T03:04:05Z"


def test_from_dict_refuses_what_is_no_summary():
    assert SessionSummary.from_dict({"id": "x", "entries": "3"}) is None
    assert SessionSummary.from_dict({"id": 3}) is None
    assert SessionSummary.from_dict({"id": "x", "title": ["no"]}) is None
    assert SessionSummary.from_dict({"id": "x", "entries": 2, "continued_in": None, "bogus": 1}) == SessionSummary(id="x", entries=2)
    # each member checked with continued_in present (without it every dict is refused first)
    for bad in ({"entries": "3"}, {"id": 3}, {"id": None}, {"title": ["no"]}, {"head": 5}, {"continued_in": 1},
                {"seq": True}, {"entries": 2.0}, {"created": {"at": 1}}):
        assert SessionSummary.from_dict({"id": "x", "continued_in": None, **bad}) is None, bad
    assert SessionSummary.from_dict({"continued_in": None, "entries": 1}) is None  # no id
    assert select([SessionSummary(id="z", created="2026-01-01T00:00:00Z"), SessionSummary(id="y")]) [0].id == "z"


def hold_open_and_append(st: Store, sid: str, n: int):
    """A writer (a recorder, a server) that keeps its session open: ``n`` items, a commit
    after every fifth, never closed."""
    s = st.create(Header.new(sid, created_at="2026-03-05T08:00:00Z"))
    for i in range(n):
        s.append(item(f"turn {i}", f"2026-03-05T09:{i // 60:02d}:{i % 60:02d}Z"))
        if i % 5 == 4:
            s.commit()
    s.commit()
    return s


def test_a_writer_that_holds_its_session_open_keeps_its_summary_as_it_goes(tmp_path, monkeypatch):
    """``list`` beside a writer that holds its session for hours reads at most SUMMARY_EVERY
    entries, not every one appended since the writer opened it (none kept before close)."""
    import agentsession_cas.store.session as session_mod

    monkeypatch.setattr(session_mod, "SUMMARY_EVERY", 8)
    st = Store.init(tmp_path / "s")
    writer = hold_open_and_append(st, "w", 22)
    reads = count_entry_reads(monkeypatch)
    ro = Store(tmp_path / "s", readonly=True)
    s = ro.summary("w")
    assert (s.entries, s.last_activity) == (22, "2026-03-05T09:00:21Z")
    assert 0 < len(reads) <= 8, reads
    ro.close()
    writer.close()
    assert st.backend.sessions.summary("w")[1], "the one kept at close is current"
    st.close()
    # A lazy writer that never commits keeps none as it goes: a summary of records a crash
    # may take back is never kept.
    st = Store.init(tmp_path / "lazy", sync="never")
    s = st.create(Header.new("z", created_at="2026-03-05T08:00:00Z"))
    for i in range(20):
        s.append(item(f"turn {i}", f"2026-03-05T09:00:{i:02d}Z"))
    assert st.backend.sessions.summary("z") is None
    s.close()
    st.close()
