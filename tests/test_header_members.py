"""The header's member forms (RFC 0001 Header), one policy (the rule ``header-member``,
store policy ``keep``): refused where a new header is made (``Store.create``, a fork,
``agentsession create``, the recorder) and an error to ``verify FILE``; kept byte for
byte and reported as a warning where a session already is (push, fetch, import,
``continue_session``, fsck). Commit 7b290e7 refused it everywhere and was reverted: a
store holding such a header from before could no longer push, fetch, re-import or
continue it. Also: ``list`` shows a ``created_at`` with an offset as its instant, and a
header-only file is a session (``empty`` is a note) for verify as for import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, make_entry
from agentsession_cas.errors import SessionFormatError
from agentsession_cas.exchange.operations import fetch, push
from agentsession_cas.exchange.recorder import Recorder
from agentsession_cas.format.codes import RULES
from agentsession_cas.format.reader import verify_bytes
from agentsession_cas.maintenance.check import verify_stored
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from agentsession_cli.main import main

USER = {"type": "item", "ts": "2026-09-17T12:00:01Z", "item": {"type": "message", "role": "user", "content": "hi"}}

#: (member, a value of another form, what the problem says).
WRONG = [
    ("created_at", "yesterday", 'header created_at "yesterday" is not an RFC 3339 date-time'),
    ("created_at", "2026-02-30T00:00:00Z", "is not an RFC 3339 date-time"),
    ("created_at", "2026-01-01T00:00:00+24:00", "is not an RFC 3339 date-time"),
    ("cwd", None, "header cwd null is not a non-empty string"),
    ("cwd", {"path": "/"}, 'header cwd {"path": "/"} is not a non-empty string'),
    ("parent_session", 5, "header parent_session 5 is not a non-empty string"),
    ("spawned_by", "", 'header spawned_by "" is not a non-empty string'),
    ("records", "run", 'header records "run" is not a list of entry types'),
    ("records", ["run", 3], "is not a list of entry types"),
    ("records", ["nonsense"], "is not a list of entry types"),
    ("harness", "h 1.0", 'header harness "h 1.0" is not an object whose name and version are strings'),
    ("harness", {"name": "h", "version": 1}, "is not an object whose name and version are strings"),
]
IDS = [f"{m}-{i}" for i, (m, _, _) in enumerate(WRONG)]


def cli(store: Path | None, *args: str, input: bytes | str | None = None):
    argv = (["--store", str(store)] if store is not None else []) + list(args)
    return CliRunner().invoke(main, argv, input=input, catch_exceptions=False)


def header_with(member: str, value: Any, sid: str = "old") -> Header:
    return Header(dict(Header.new(sid, created_at="2026-09-17T12:00:00Z", cwd="/w").data, **{member: value}))


def stored_the_old_way(st: Store, header: Header, entries: int = 2) -> None:
    """A session whose header a store took before the rule, written as the old
    ``Store.create`` wrote it (the header defaulted and created, no member checked)."""
    s = st._create(st._defaulted_header(header), own=[], head=None, record=True)
    for i in range(entries):
        s.append(dict(USER, item={"type": "message", "role": "user", "content": f"turn {i}"}))
    s.close()


def _line(parent: str | None) -> bytes:
    body = {k: v for k, v in USER.items() if k not in ("type", "ts")}
    return make_entry("item", parent, ts=USER["ts"], **body).canonical_line()


def raw_header(st: Store, sid: str) -> bytes:
    return st.header(sid).canonical_line()


def test_the_rule_is_in_the_table_with_store_policy_keep():
    rule = RULES["header-member"]
    assert (rule.severity, rule.scope, rule.store, rule.error) == ("error", "line", "keep", None)


@pytest.mark.parametrize("member, value, said", WRONG, ids=IDS)
def test_verify_file_reports_it_as_an_error_naming_member_and_value(tmp_path, member, value, said):
    data = header_with(member, value).canonical_line() + _line(None)
    report = verify_bytes(data, source="f")
    assert [p.code for p in report.problems] == ["header-member"] and not report.ok
    assert said in report.problems[0].message and report.problems[0].line == 1
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    r = cli(None, "verify", str(path))
    assert r.exit_code == 1 and said in r.stdout


@pytest.mark.parametrize("member, value, said", WRONG, ids=IDS)
def test_store_create_refuses_it_and_leaves_the_store_unchanged(tmp_path, member, value, said):
    with Store.init(tmp_path / "s") as st:
        with pytest.raises(SessionFormatError) as caught:
            st.create(header_with(member, value, "new"))
        assert said in str(caught.value) and "header-member" in [p.code for p in caught.value.problems]
        assert st.list() == []


def test_a_fork_refuses_a_member_the_caller_gives(tmp_path):
    with Store.init(tmp_path / "s") as st:
        s = st.create(Header.new("o"))
        s.append(USER)
        s.close()
        with pytest.raises(SessionFormatError, match="header spawned_by 7"):
            st.fork("o", session_id="f", header={"spawned_by": 7})
        assert st.list() == ["o"]


def test_a_given_header_keeps_its_findings_for_a_fork_as_for_a_root(tmp_path):
    """``Store.create(given=True)`` (a server's create for a client's import) keeps a
    member of another form and names it in ``header_findings``, a fork's header as a
    root's (a fork's findings were left empty)."""
    with Store.init(tmp_path / "s") as st:
        s = st.create(Header.new("o"))
        s.append(USER)
        base = s.head
        s.close()
        root = st.create(header_with("spawned_by", 7, "r"), given=True)
        fork_header = Header(dict(header_with("spawned_by", 7, "f").data, base=base))
        fork = st.create(fork_header, given=True)
        assert [p.code for p in root.header_findings] == ["header-member"]
        assert [p.code for p in fork.header_findings] == ["header-member"]
        assert "header spawned_by 7" in fork.header_findings[0].message
        root.close()
        fork.close()
        assert st.header("f").data["spawned_by"] == 7


def test_agentsession_create_refuses_it(tmp_path):
    store = tmp_path / "s"
    assert cli(store, "init").exit_code == 0
    header = tmp_path / "h.json"
    header.write_text(json.dumps({"id": "n1", "created_at": "yesterday", "payload": "openresponses/2026-04-24"}))
    r = cli(store, "create", "--header", str(header))
    assert r.exit_code != 0 and r.stdout == ""
    assert 'header created_at "yesterday" is not an RFC 3339 date-time' in r.stderr
    assert cli(store, "list", "--json").stdout.strip() == "[]"


def test_the_recorder_refuses_it(tmp_path):
    with Store.init(tmp_path / "s") as st:
        with pytest.raises(SessionFormatError, match='header created_at "yesterday"'):
            Recorder.open(st, "r1", created_at="yesterday")
        with pytest.raises(SessionFormatError, match="header records"):
            Recorder.open(st, "r2", records=["run", 5])
        assert st.list() == []


def test_every_rfc_3339_spelling_of_created_at_is_taken(tmp_path):
    with Store.init(tmp_path / "s") as st:
        for i, at in enumerate(["2026-10-05T10:00:00Z", "2026-10-05t10:00:00.25z", "2026-10-05 10:00:00+05:30",
                                "2016-12-31T23:59:60Z", "0000-01-01T00:00:00-00:00"]):
            st.create(Header.new(f"s{i}", created_at=at)).close()
            assert st.header(f"s{i}").created_at == at


# -- a store holding such a header from before -------------------------------------------


@pytest.fixture
def old(tmp_path) -> Path:
    """A store holding session ``old`` whose header has created_at "yesterday" and cwd null,
    written the way the old code allowed."""
    path = tmp_path / "old"
    with Store.init(path) as st:
        stored_the_old_way(st, Header(dict(Header.new("old").data, created_at="yesterday", cwd=None)))
    return path


WARNED = ['header created_at "yesterday" is not an RFC 3339 date-time', "header cwd null is not a non-empty string"]


def _warned(texts: list[str]) -> bool:
    return all(any(w in t and "kept as written" in t for t in texts) for w in WARNED)


def test_it_still_pushes_kept_byte_for_byte_with_a_warning(old, tmp_path):
    Store.init(tmp_path / "there").close()
    with Store(old) as st:
        want = raw_header(st, "old")
        result = push(st, tmp_path / "there", "old")
    assert result.created and _warned(result.notes)
    with Store(tmp_path / "there") as there:
        assert raw_header(there, "old") == want and len(there.read("old")) == 2


def test_it_still_fetches_kept_byte_for_byte_with_a_warning(old, tmp_path):
    Store.init(tmp_path / "here").close()
    with Store(tmp_path / "here") as here, Store(old) as st:
        want = raw_header(st, "old")
        result = fetch(here, old, "old")
        assert result.created and _warned(result.notes)
        assert raw_header(here, "old") == want and len(here.read("old")) == 2


def test_the_cli_push_says_the_warning(old, tmp_path):
    Store.init(tmp_path / "there").close()
    r = cli(old, "push", "old", str(tmp_path / "there"))
    assert r.exit_code == 0, r.output
    assert _warned(r.stderr.splitlines())


@pytest.mark.parametrize("how", ["file", "bytes"])
def test_its_export_imports_again_kept_byte_for_byte_with_a_warning(old, tmp_path, how):
    with Store(old) as st:
        data = st.export("old")
        want = raw_header(st, "old")
    path = tmp_path / "old.jsonl"
    path.write_bytes(data)
    with Store.init(tmp_path / "again") as again:
        s = again.import_file(path) if how == "file" else again.import_bytes(data)
        assert [p.code for p in s.header_findings] == ["header-member", "header-member"]
        assert raw_header(again, "old") == want and len(s) == 2
        s.close()


def test_the_cli_import_keeps_it_and_warns(old, tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_bytes(cli(old, "export", "old").stdout_bytes)
    again, again2 = tmp_path / "again", tmp_path / "again2"
    assert cli(again, "init").exit_code == cli(again2, "init").exit_code == 0
    r = cli(again, "import", str(path))
    assert r.exit_code == 0 and r.stdout.strip() == "old"
    assert _warned(r.stderr.splitlines())
    out = json.loads(cli(again2, "import", "--json", str(path)).stdout)
    assert [w["code"] for w in out["warnings"]] == ["header-member", "header-member"]
    assert {w["severity"] for w in out["warnings"]} == {"warning"}  # (kept: what fsck calls it, not an error)


def test_a_header_alone_imports_as_a_record_into_a_store_over_http(tmp_path, request):
    """A record with no entries reaches a server as its create route (a push carries
    entries): the route held the header to the rules of a header the store makes, and
    refused what the import of the same file keeps everywhere else."""
    import http_store
    from agentsession_cas.store.url import open_store

    path = tmp_path / "old.jsonl"
    path.write_bytes(header_with("cwd", None).canonical_line())
    url = http_store.served_url(tmp_path, request.node.name, "served")
    try:
        with open_store(url, create=True) as st:
            s = st.import_file(path, record=True)
            assert [p.code for p in s.header_findings] == ["header-member"] and s.mark == "record"
            s.close()
            assert st.header("old").data.get("cwd", "absent") is None
    finally:
        http_store.release(tmp_path, request.node.name)


def test_an_import_still_refuses_a_file_with_another_problem_too(tmp_path):
    data = header_with("cwd", None).canonical_line() + _line("sha256:" + "0" * 64)
    with Store.init(tmp_path / "s") as st:
        with pytest.raises(SessionFormatError) as caught:
            st.import_bytes(data)
        assert "parent" in {p.code for p in caught.value.problems}
        assert st.list() == []


def test_it_still_continues_into_a_successor_without_the_bad_member(old):
    with Store(old) as st:
        want = raw_header(st, "old")
        new = st.continue_session("old", successor_id="next")
        assert "cwd" not in new.header.data  # (null is no path: not copied into the header made)
        assert new.header.member_problems() == [] and new.header.data["parent_session"] == "old"
        new.close()
        assert raw_header(st, "old") == want
        assert st.summary("old").continued_in == "next"


def test_continue_still_copies_the_members_of_their_form(tmp_path):
    with Store.init(tmp_path / "s") as st:
        st.create(Header.new("a", cwd="/w", harness={"name": "h", "version": "1"}, records=["run"])).close()
        new = st.continue_session("a", successor_id="b")
        assert {k: new.header.data[k] for k in ("cwd", "harness", "records")} == \
            {"cwd": "/w", "harness": {"name": "h", "version": "1"}, "records": ["run"]}
        new.close()


@pytest.mark.parametrize("deep", [False, True])
def test_fsck_reports_it_as_a_warning_not_damage(old, deep):
    report = fsck(old, deep=deep)
    assert report.ok and not report.errors
    warned = [w for w in report.warnings if w.code == "header-member"]
    assert len(warned) == 2 and all(w.session == "old" for w in warned)
    assert _warned([w.message for w in warned])
    r = cli(old, "fsck", *(["--deep"] if deep else []))
    assert r.exit_code == 0 and "header-member" in r.output


def test_fsck_of_a_memory_store_says_it_once(tmp_path):
    with Store.init("memory:header-members") as st:
        stored_the_old_way(st, Header(dict(Header.new("old").data, cwd=None)))
        for deep in (False, True):
            report = fsck(st, deep=deep)
            assert report.ok and [w.code for w in report.warnings if w.code == "header-member"] == ["header-member"]


def test_verify_id_holds_it_to_what_verify_of_the_export_says(old, tmp_path):
    with Store(old) as st:
        check = verify_stored(st, "old", as_export=True)
        assert [p["code"] for p in check.problems] == ["header-member", "header-member"]
        assert verify_stored(st, "old").problems == []  # fsck's view: kept, said by fsck's pass over the headers
    assert cli(old, "verify", "old").exit_code == 1


# -- list: created_at with an offset -----------------------------------------------------


def test_list_shows_the_instant_a_created_at_with_an_offset_names(tmp_path):
    store = tmp_path / "s"
    with Store.init(store) as st:
        st.create(Header.new("o", created_at="2026-01-02T03:04:05+05:00")).close()
        st.create(Header.new("z", created_at="2026-01-01T23:00:00Z")).close()
        stored_the_old_way(st, Header(dict(Header.new("y").data, created_at="yesterday")), entries=0)
        assert st.summary("o").created == "2026-01-01T22:04:05Z"
        assert st.summary("y").created == "yesterday"  # no instant: as written
    listed = {s["session"]: s for s in json.loads(cli(store, "list", "--json").stdout)}
    assert listed["o"]["created"] == "2026-01-01T22:04:05Z"
    ids = [s["session"] for s in json.loads(cli(store, "list", "--json").stdout) if s["session"] in ("o", "z")]
    assert ids == ["z", "o"]  # z is the later instant


def test_a_summary_kept_with_the_old_cut_is_put_right_by_the_next_write(tmp_path):
    """A summary kept before session 41 holds an offset's created_at cut to Z (the wrong
    instant); the next writer builds its summary from the kept one, and now takes the
    header's instant over it."""
    from agentsession_cas.backends.files.log import checksummed_line
    from agentsession_cas.backends.files.sessions import read_summary
    from agentsession_cas.format.canonical import canonical_bytes, loads

    store = tmp_path / "s"
    with Store.init(store) as st:
        st.create(Header.new("o", created_at="2026-01-02T03:04:05+05:00")).append(USER)
    d = store / "sessions" / "o"
    kept = read_summary(str(d))
    assert kept is not None and kept[0]["created"] == "2026-01-01T22:04:05Z"
    raw = (d / "summary").read_bytes()
    data = loads(raw[raw.index(b" ") + 1:].rstrip(b"\n"))
    data["summary"]["created"] = "2026-01-02T03:04:05Z"  # as the old code cut it
    (d / "summary").write_bytes(checksummed_line(canonical_bytes(data)))
    assert json.loads(cli(store, "list", "--json").stdout)[0]["created"] == "2026-01-02T03:04:05Z"
    with Store(store) as st:
        st.session("o").append(dict(USER, ts="2026-09-17T12:00:02Z"))
    assert json.loads(cli(store, "list", "--json").stdout)[0]["created"] == "2026-01-01T22:04:05Z"


# -- a header alone ----------------------------------------------------------------------


def test_a_header_only_file_is_a_session_to_verify_and_to_import(tmp_path):
    """RFC 0001: a session is a header, a base or none, a head, and its entries; RFC 0002
    imports a baseless file with none as a session with no head. ``verify FILE`` said
    'empty' and failed while ``import`` took it: one rule now, a note."""
    path = tmp_path / "h.jsonl"
    path.write_bytes(Header.new("h", created_at="2026-09-17T12:00:00Z").canonical_line())
    report = verify_bytes(path.read_bytes())
    assert report.ok and report.problems == [] and [n.code for n in report.notes] == ["empty"]
    r = cli(None, "verify", str(path))
    assert r.exit_code == 0 and "no entries" in r.stdout
    assert json.loads(cli(None, "verify", "--json", str(path)).stdout)["ok"] is True
    store = tmp_path / "s"
    assert cli(store, "init").exit_code == 0
    assert cli(store, "import", str(path)).exit_code == 0
    r = cli(store, "verify", "h")
    assert r.exit_code == 0 and "no entries" in r.stdout


def test_an_import_that_keeps_a_member_keeps_the_rules_state_too(tmp_path):
    """The import's pass stands for the session's rules whatever its header's members
    say: a kept member left the state unsaved, so the first append built the rules
    from every entry again."""
    e = make_entry("item", None, ts="2026-09-17T12:00:01Z", item={"type": "message", "role": "user", "content": "hi"})
    (tmp_path / "f.jsonl").write_bytes(header_with("cwd", None).canonical_line() + e.canonical_line())
    with Store.init(tmp_path / "s") as st:
        st.import_file(tmp_path / "f.jsonl").close()
    assert (tmp_path / "s" / "sessions" / "old" / "rules").exists()
