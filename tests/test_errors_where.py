"""Errors of the library's public methods say what was given and what is expected, with a
code of the one hierarchy (agentsession_cas/errors.py), the same on every backend: an
entry that is no entry, a header that is no header, a name that is no object name."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from agentsession_cas import Header
from agentsession_cas.errors import (
    AgentSessionError,
    AppendRefusedError,
    BadArgumentError,
    BadNameError,
    SessionFormatError,
)
from agentsession_cas.store.url import open_store
from contract_helpers import BACKENDS

#: Every backend but HTTP (whose client refuses what the server refuses: tested there).
LOCAL = [b for b in BACKENDS if b.name in ("file", "memory", "postgresql")]
ENTRY = {"type": "item", "item": {"type": "message", "role": "user", "content": "hi"}, "ts": "2026-12-04T02:00:00Z"}


@pytest.fixture(params=LOCAL, ids=str)
def st(request, tmp_path: Path):
    store = open_store(request.param.url(tmp_path, f"ew{uuid.uuid4().hex[:10]}", "a"), create=True)
    yield store
    store.close()


@pytest.mark.parametrize("given, kind", [("hello", "str"), (42, "int"), (None, "NoneType"), (b"{}", "bytes"),
                                         ([("type", "item")], "list")])
def test_an_append_of_what_is_no_entry_is_a_bad_entry_saying_what_was_given(st, given, kind):
    s = st.create(Header.new("s1"))
    s.append(ENTRY)
    with pytest.raises(AppendRefusedError) as caught:
        s.append(given)
    exc = caught.value
    assert isinstance(exc, AgentSessionError) and exc.code == "bad_entry" and exc.rule == "json"
    assert f"an entry is an Entry or a JSON object (a dict), not {kind}" in str(exc)
    assert repr(given)[:20] in str(exc)
    assert len(s) == 1  # nothing appended, and the session takes appends still
    s.append(dict(ENTRY, ts="2026-12-04T02:00:01Z"))
    assert len(s) == 2


@pytest.mark.parametrize("given, kind", [("hello", "str"), (ENTRY, "dict"), (42, "int"), (None, "NoneType")])
def test_prepare_of_one_entry_or_a_string_says_it_takes_several(st, given, kind):
    """What is no iterable of entries is the caller's argument of the wrong type
    (``bad_argument``, as every other), not an entry the rules refused (``bad_entry``,
    which it was before session 40); an entry in the batch that is none stays that."""
    s = st.create(Header.new("s1"))
    with pytest.raises(BadArgumentError) as caught:
        s.prepare(given)
    assert caught.value.code == "bad_argument"
    assert f"prepare takes entries (an iterable of Entry or JSON objects), not one {kind}" in str(caught.value)
    with pytest.raises(AppendRefusedError, match="an entry is an Entry or a JSON object"):
        s.prepare([ENTRY, "hello"])
    assert len(s) == 0


def test_a_create_of_what_is_no_header_is_a_bad_argument_saying_what_was_given(st):
    """A str where a header is wanted is the caller's argument of the wrong type
    (``bad_argument``), not a session file that does not read (``bad_file``, before session 40)."""
    with pytest.raises(BadArgumentError) as caught:
        st.create("hello")  # type: ignore[arg-type]
    assert caught.value.code == "bad_argument" and not isinstance(caught.value, SessionFormatError)
    assert "a header is a Header or a JSON object (a dict), not str: 'hello'" in str(caught.value)
    assert st.list() == []


@pytest.mark.parametrize("name", ["junk", "sha256:zz", 42, None, "sha256:" + "A" * 64])
def test_a_name_that_is_no_object_name_is_bad_name_on_every_read(st, name):
    s = st.create(Header.new("s1"))
    s.append(ENTRY)
    reads = {
        "Store.entry": lambda: st.entry(name), "Store.envelope": lambda: st.envelope(name),
        "Store.blob": lambda: st.blob(name), "Store.cat_object": lambda: st.cat_object(name),
        "Store.ancestry": lambda: st.ancestry(name), "Store.path_to": lambda: st.path_to(name),
        "Store.entries": lambda: list(st.entries([name])), "Session.entry": lambda: s.entry(name),
        "Session.ancestry": lambda: s.ancestry(name),
    }
    for what, read in reads.items():
        with pytest.raises(BadNameError) as caught:
            read()
        assert caught.value.code == "bad_name", what
        assert str(caught.value) == f"{name!r} is not an object name (sha256: and 64 lowercase hex digits)", what


def test_the_damage_hint_names_the_store_that_is_damaged(tmp_path, monkeypatch):
    """`agentsession repair SESSION` repairs the store the search finds (here: another
    one, in the working directory), not the damaged one `--store` named: the hint names it."""
    import shlex

    from click.testing import CliRunner

    from agentsession_cas.store import Store
    from agentsession_cli.main import main

    here = tmp_path / "work"
    Store.init(here).close()  # the store a bare command finds, from here
    monkeypatch.chdir(here)
    damaged = tmp_path / "the store's dir"
    with Store.init(damaged) as st:
        s = st.create(Header.new("s1"))
        for i in range(3):
            s.append(dict(ENTRY, ts=f"2026-12-04T02:00:0{i}Z"))
    log = damaged / "sessions" / "s1" / "log"
    data = bytearray(log.read_bytes())
    line2 = data.index(b"\n") + 1
    data[line2] = ord("0") if data[line2] != ord("0") else ord("1")  # the first append's checksum fails
    log.write_bytes(bytes(data))
    r = CliRunner().invoke(main, ["--store", str(damaged), "append", "s1"], input='{"type": "item"}')
    assert r.exit_code == 1
    assert f"run `agentsession --store {shlex.quote(str(damaged))} repair s1`" in r.stderr, r.stderr
    # and that command repairs it
    r = CliRunner().invoke(main, shlex.split(f"--store {shlex.quote(str(damaged))} repair s1"))
    assert r.exit_code == 0, r.output


def test_verify_of_a_stored_session_with_no_entries_speaks_of_the_session(st):
    from agentsession_cas.format.rules import empty_problem
    from agentsession_cas.maintenance.check import verify_stored

    st.create(Header.new("nothing")).close()
    check = verify_stored(st, "nothing", as_export=True)
    [p] = check.notes  # a note: a header alone is a session just created (docs/rules.md)
    assert check.problems == [] and (p["code"], p["severity"]) == ("empty", "note")
    assert p["message"] == empty_problem(stored=True).message == \
        "the session holds no entries: its projection would be a header alone"
    assert "file" not in p["message"]
    quiet = verify_stored(st, "nothing")  # fsck's view: a store may hold a session with none yet
    assert quiet.problems == [] and quiet.notes == []


def test_verify_of_a_file_with_no_entries_still_speaks_of_the_file(tmp_path):
    from agentsession_cas.format.reader import verify_file

    path = tmp_path / "empty.jsonl"
    from agentsession_cas.format.writer import write_session

    write_session(path, Header.new("nothing"), [])
    report = verify_file(path)
    [p] = report.notes
    assert report.ok and report.problems == []
    assert (p.code, p.severity, p.message) == ("empty", "note", "the file holds a header and no entries")
