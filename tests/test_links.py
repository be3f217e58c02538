"""Sessions that refer to sessions (issue 15): derived subsession ids, links checked
against the store, forks naming their origin, continuation, callees and judges;
through the library and the command."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import Header, make_entry, open_store, read_session_bytes, verify_session
from agentsession_cas.errors import BaseNotHeldError, ContinuationError, EntryError, SupersededError
from agentsession_cas.format.links import (
    callees,
    continued_in_link,
    fork_of_link,
    judged_by_link,
    judges,
    link_entry,
    peer_link,
    subsession_id,
    subsession_link,
    successor_of,
)
from agentsession_cas.maintenance.check import verify_stored
from agentsession_cas.maintenance.fsck import fsck
from agentsession_cas.store import Store
from agentsession_cas.store.links import callees_held, judges_held
from agentsession_cli.main import main

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "sessions"
_N = iter(range(10**9))


def mem() -> Store:
    return open_store(f"memory:links-{next(_N)}", create=True)


def user(text: str = "hi") -> dict:
    return {"type": "item", "item": {"type": "message", "role": "user", "content": text}}


def call(call_id: str) -> dict:
    return {"type": "item", "item": {"type": "function_call", "call_id": call_id, "name": "delegate", "arguments": "{}"}}


def cli(store, *args, input=None):
    return CliRunner().invoke(main, ["--store", str(store), *args], input=input, catch_exceptions=False)


# ---------------------------------------------------------------------------
# derived ids and constructors


def uuid5_by_hand(name: str) -> str:
    """RFC 9562 UUIDv5 written out: SHA-1 of the namespace's 16 bytes and the name,
    the first 16 bytes with version 5 and the RFC 4122 variant."""
    digest = bytearray(hashlib.sha1(bytes(16) + name.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(digest)))


def test_subsession_ids_derive_as_the_rfc_says():
    parent = "01995b2a-0000-7000-8000-00000000000c"
    assert subsession_id(parent, "call_a") == uuid5_by_hand(f"{parent}/call_a")
    assert subsession_id(parent, "call_a", 1) == uuid5_by_hand(f"{parent}/call_a/1")
    assert subsession_id(parent, "call_a", 2) == uuid5_by_hand(f"{parent}/call_a/2")
    assert len({subsession_id(parent, "call_a", n) for n in range(3)}) == 3
    assert uuid.UUID(subsession_id(parent, "call_a")).version == 5
    for bad in [("", "c"), (parent, ""), (parent, "c", -1), (parent, "c", True)]:
        with pytest.raises(EntryError):
            subsession_id(*bad)


def test_link_constructors():
    assert subsession_link("kid", "call_1") == {"type": "link", "rel": "subsession", "session": "kid", "call_id": "call_1"}
    assert fork_of_link("o") == {"type": "link", "rel": "fork_of", "session": "o"}
    assert continued_in_link("next") == {"type": "link", "rel": "continued_in", "session": "next"}
    assert judged_by_link("j", "sha256:" + "a" * 64)["target"] == "sha256:" + "a" * 64
    assert "target" not in judged_by_link("j")
    assert peer_link("call_2", "far")["rel"] == "peer"
    for bad in [lambda: link_entry("", "s"), lambda: link_entry("fork_of", ""), lambda: subsession_link("s", ""),
                lambda: link_entry("subsession", "s", call_id="")]:
        with pytest.raises(EntryError):
            bad()


# ---------------------------------------------------------------------------
# a file: what it can check, and the note that the rest needs a store


def parent_file(child: str, sid: str = "p1") -> bytes:
    st = mem()
    s = st.create(Header.new(sid))
    s.append(user())
    s.append(call("call_a"))
    s.append(subsession_link(child, "call_a"))
    return s.projection()


def test_a_file_notes_a_child_id_not_derived_and_that_links_need_a_store():
    report = verify_session(read_session_bytes(parent_file("not-derived")))
    assert report.ok
    assert sorted(p.code for p in report.notes) == ["link-derived", "link-store"]
    derived = next(p for p in report.notes if p.code == "link-derived")
    assert derived.line == 4 and "not-derived" in derived.message and "call_a" in derived.message

    report = verify_session(read_session_bytes(parent_file(subsession_id("p1", "call_a"))))
    assert [p.code for p in report.notes] == ["link-store"]


def test_a_retry_may_name_the_next_attempt_only():
    st = mem()
    s = st.create(Header.new("p1"))
    s.append(user())
    s.append(call("call_a"))
    s.append(subsession_link(subsession_id("p1", "call_a"), "call_a"))
    r = s.append(subsession_link(subsession_id("p1", "call_a", 1), "call_a"))
    assert r.notes == []
    r = s.append(subsession_link(subsession_id("p1", "call_a", 5), "call_a"))  # the third link: attempts 0..2
    assert [p.code for p in r.notes] == ["link-derived"]


@pytest.mark.skipif(not CORPUS.is_dir(), reason="reference corpus not found")
def test_the_corpus_subsession_links_are_noted_and_pass_a_store():
    data = (CORPUS / "converge.jsonl").read_bytes()
    report = verify_session(read_session_bytes(data))
    assert report.ok
    assert [p.code for p in report.notes].count("link-derived") == 2  # its children's ids are not derived
    st = mem()
    s = st.import_bytes(data)
    check = verify_stored(st, s.id)
    assert check.ok  # the children are absent: they never started, which passes
    assert sum("is not the UUIDv5" in n["message"] for n in check.notes) == 2
    assert not any("names no store" in n["message"] for n in check.notes)  # the store did check them


# ---------------------------------------------------------------------------
# a stored session: links checked against the sessions they name


def linked_parent(st: Store, sid: str = "p1", call_id: str = "call_a") -> str:
    """A session that called ``call_id`` and linked the subsession it spawns (derived
    id, which it returns), as a parent writes it at dispatch."""
    kid = subsession_id(sid, call_id)
    p = st.create(Header.new(sid))
    p.append(user())
    p.append(call(call_id))
    p.append(subsession_link(kid, call_id))
    return kid


def test_a_subsession_naming_another_parent_or_call_fails_verify_and_fsck_deep(tmp_path):
    st = Store.init(tmp_path / "st")
    kid = linked_parent(st)
    st.session("p1").close()
    assert verify_stored(st, "p1").ok  # the child never started: passes
    c = st.create(Header.new(kid, parent_session="p9", spawned_by="call_b"))
    c.append(user("x"))
    c.close()
    check = verify_stored(st, "p1")
    assert [(p["where"], p["code"]) for p in check.problems] == [("links", "link-parent")]
    message = check.problems[0]["message"]
    assert "parent_session is p9, not p1" in message and "spawned_by is call_b" in message
    report = fsck(st, deep=True)
    assert [e.code for e in report.errors] == ["link-parent"]
    st.close()
    r = cli(tmp_path / "st", "verify", "p1")
    assert r.exit_code == 1 and "parent_session is p9" in r.stdout


def test_a_subsession_that_agrees_passes():
    st = mem()
    kid = linked_parent(st)
    c = st.create(Header.new(kid, parent_session="p1", spawned_by="call_a"))
    c.append(user("x"))
    assert verify_stored(st, "p1").ok and not fsck(st, deep=True).errors


def test_a_fork_of_link_to_a_session_not_holding_the_base_fails():
    st = mem()
    a = st.create(Header.new("a"))
    a.append(user())
    b = st.create(Header.new("b"))
    b.append(user("other"))
    f = st.create(Header.new("f", base=a.head))
    f.append(fork_of_link("b"))
    check = verify_stored(st, "f")
    assert [p["code"] for p in check.problems] == ["link-fork"]
    g = st.create(Header.new("g", base=a.head))
    g.append(fork_of_link("a"))
    assert verify_stored(st, "g").ok
    h = st.create(Header.new("h", base=g.head))  # a fork made at an entry on another fork's prefix
    h.append(fork_of_link("g"))
    assert verify_stored(st, "h").ok


# ---------------------------------------------------------------------------
# forks name their origin


def test_a_fork_fills_parent_session_from_the_session_holding_its_base():
    st = mem()
    a = st.create(Header.new("a"))
    a.append(user())
    f = st.create(Header.new("f", base=a.head))
    assert f.header.data["parent_session"] == "a"
    g = st.create(Header.new("g", base=a.head, parent_session="elsewhere"))
    assert g.header.data["parent_session"] == "elsewhere"  # provenance the caller gave is kept


def test_store_fork_names_its_origin_and_can_write_the_link():
    st = mem()
    a = st.create(Header.new("a", media="sidecar"))
    first = a.append(user()).id
    a.append(user("two"))
    f = st.fork("a", first, session_id="f", link=True)
    assert f.base == first and f.header.data["parent_session"] == "a" and f.header.media == "sidecar"
    [link] = list(f)
    assert link.type == "link" and link.get("rel") == "fork_of" and link.get("session") == "a"
    assert f.head == link.id
    plain = st.fork("a")
    assert plain.base == a.head and len(plain) == 0 and plain.header.data["parent_session"] == "a"
    with pytest.raises(BaseNotHeldError):
        st.fork("a", "sha256:" + "0" * 64)


def test_create_base_link_on_the_command(tmp_path):
    path = tmp_path / "st"
    st = Store.init(path)
    a = st.create(Header.new("a"))
    head = a.append(user()).id
    st.close()
    r = cli(path, "create", "--base", head, "--id", "f", "--link", "--json")
    assert r.exit_code == 0, r.output
    st = open_store(str(path))
    f = st.read("f")
    assert f.header.data["parent_session"] == "a"
    assert [(e.type, e.get("rel"), e.get("session")) for e in f] == [("link", "fork_of", "a")]
    r = cli(path, "create", "--id", "x", "--link")
    assert r.exit_code != 0 and "give --base" in r.output


# ---------------------------------------------------------------------------
# continuation


def test_a_superseded_session_refuses_appends(tmp_path):
    st = Store.init(tmp_path / "st")
    old = st.create(Header.new("old"))
    old.append(user())
    assert old.superseded_by is None
    link = continued_in_link("new")
    r = old.append(link)
    assert old.superseded_by == "new"
    with pytest.raises(SupersededError) as exc:
        old.append(user("more"))
    assert exc.value.code == "superseded" and exc.value.successor == "new" and "new" in str(exc.value)
    assert old.append(old.entry(r.id)).outcome == "no-op"  # the link itself again: nothing new
    st.close()
    # the refusal holds for a later process, which finds the link in the log
    st = open_store(str(tmp_path / "st"))
    s = st.session("old")
    with pytest.raises(SupersededError):
        s.append(user("again"))
    assert len(s) == 2
    st.close()
    r = cli(tmp_path / "st", "append", "old", input=json.dumps(user("cli")))
    assert r.exit_code == 1 and "continued in new" in r.stderr


def test_a_batch_that_continues_refuses_what_follows_the_link():
    st = mem()
    s = st.create(Header.new("old"))
    s.append(user())
    with pytest.raises(SupersededError):
        s.prepare([continued_in_link("new"), user("after")])
    assert s.superseded_by is None and len(s) == 1  # nothing was written
    s.prepare([continued_in_link("new")]).commit()
    assert s.superseded_by == "new"


def test_resolve_current_follows_the_chain_with_a_bound_and_refuses_a_cycle():
    st = mem()
    for sid in ("a", "b", "c"):
        st.create(Header.new(sid)).append(user(sid))
    st.session("a").append(continued_in_link("b"))
    st.session("b").append(continued_in_link("c"))
    found = st.resolve_current("a")
    assert (found.current, found.chain, found.missing, found.moved) == ("c", ["a", "b", "c"], None, True)
    assert st.resolve_current("c").chain == ["c"] and not st.resolve_current("c").moved
    with pytest.raises(ContinuationError, match="past 1"):
        st.resolve_current("a", limit=1)
    st.session("c").append(continued_in_link("a"))
    with pytest.raises(ContinuationError, match="cycle: a -> b -> c -> a") as exc:
        st.resolve_current("a")
    assert exc.value.code == "continuation"
    st2 = mem()
    st2.create(Header.new("x")).append(user())
    st2.session("x").append(continued_in_link("gone"))
    assert st2.resolve_current("x").as_dict() == {"current": "x", "chain": ["x"], "missing": "gone"}


def test_the_summary_names_the_successor_and_one_without_the_member_is_rebuilt():
    from agentsession_cas.store.summary import SessionSummary

    st = mem()
    s = st.create(Header.new("old"))
    s.append(user())
    s.append(continued_in_link("new"))
    assert st.summary("old").continued_in == "new"
    kept = st.summary("old").as_dict()
    assert SessionSummary.from_dict(kept) is not None
    del kept["continued_in"]
    assert SessionSummary.from_dict(kept) is None  # a summary that cannot say is rebuilt from the log


def test_list_show_and_export_say_where_a_session_went(tmp_path):
    path = tmp_path / "st"
    st = Store.init(path)
    for sid in ("a", "b", "c"):
        st.create(Header.new(sid)).append(user(sid))
    st.session("a").append(continued_in_link("b"))
    st.session("b").append(continued_in_link("c"))
    st.close()
    out = cli(path, "list").stdout
    header, *rows = out.splitlines()
    assert header.endswith("CONTINUED IN")
    by_id = {r.split()[0]: r.split() for r in rows}
    assert by_id["a"][-1] == "b" and by_id["b"][-1] == "c" and by_id["c"][-1] == "-"
    listed = json.loads(cli(path, "list", "--json").stdout)
    assert {r["session"]: r["continued_in"] for r in listed} == {"a": "b", "b": "c", "c": None}
    assert [r["session"] for r in json.loads(cli(path, "list", "--current", "--json").stdout)] == ["c"]
    shown = cli(path, "show", "a").stdout
    assert "continued in  b (superseded: takes no more appends); the chain's current session is c" in shown
    data = json.loads(cli(path, "show", "a", "--json").stdout)
    assert data["continued_in"] == "b" and data["current"] == "c"
    r = cli(path, "export", "a")
    assert r.exit_code == 0
    assert "session a was continued in b; the chain's current session is c" in r.stderr
    assert read_session_bytes(r.stdout_bytes).header.id == "a"
    assert "continued" not in cli(path, "export", "c").stderr


# ---------------------------------------------------------------------------
# callees and judges


def test_callees_and_judges_of_a_path_through_the_library_and_show_runs(tmp_path):
    path = tmp_path / "st"
    st = Store.init(path)
    kid = subsession_id("p", "call_a")
    p = st.create(Header.new("p"))
    p.append(user())
    fc = p.append(call("call_a")).id
    link = p.append(subsession_link(kid, "call_a")).id
    dispatch = p.append({"type": "dispatch", "call_id": "call_a", "target": fc}).id
    p.append(peer_link("call_a", "far-away"))
    p.append({"type": "item", "item": {"type": "function_call_output", "call_id": "call_a", "output": "done"}})
    judged = p.head
    p.append(judged_by_link("judge-1", judged))
    p.append(judged_by_link("judge-2"))
    st.create(Header.new(kid, parent_session="p", spawned_by="call_a")).append(user("sub"))
    j = st.create(Header.new("judge-1", base=judged))
    verdict = j.append({"type": "outcome", "kind": "eval", "target": judged, "score": 0.9, "pass": True}).id

    path_entries = st.path_to(p.head)
    found = callees(path_entries)
    assert [(c.rel, c.session, c.call_id, c.call, c.dispatch, c.link) for c in found] == [
        ("subsession", kid, "call_a", fc, dispatch, link),
        ("peer", "far-away", "call_a", fc, dispatch, found[1].link),
    ]
    assert callees(path_entries, "call_zzz") == []
    assert [e.get("session") for e in judges(path_entries)] == ["judge-1", "judge-2"]
    assert [e.get("session") for e in judges(path_entries, judged)] == ["judge-1"]
    assert [(h.callee.session, h.held) for h in callees_held(p)] == [(kid, True), ("far-away", False)]
    assert judges_held(p, target=judged) == [
        {"link": judges(path_entries, judged)[0].id, "session": "judge-1", "target": judged, "held": True, "outcomes": [verdict]}
    ]
    st.close()

    out = cli(path, "show", "p", "--runs").stdout
    assert "callees on the path: 2" in out
    assert f"call_a -> subsession {kid}" in out and "far-away" in out and "not in this store" in out
    assert "judges on the path: 2" in out and "judge-1 judging" in out and "judge-2 judging the session" in out
    data = json.loads(cli(path, "show", "p", "--json").stdout)
    assert [(c["session"], c["held"]) for c in data["callees"]] == [(kid, True), ("far-away", False)]
    assert [j["session"] for j in data["judges"]] == ["judge-1", "judge-2"]


def test_successor_of_takes_the_last_continued_in_link():
    base = {"parent": None, "ts": "2026-10-05T11:00:00Z"}
    entries = [make_entry("link", None, ts=base["ts"], rel="continued_in", session="one"),
               make_entry("link", None, ts=base["ts"], rel="fork_of", session="x"),
               make_entry("link", None, ts=base["ts"], rel="continued_in", session="two")]
    assert successor_of(entries) == "two"
    assert successor_of(entries[:2]) == "one"
    assert successor_of(entries[1:2]) is None


def test_continue_session_rolls_over_with_the_settings_in_force():
    from agentsession_cas.errors import MirrorError
    from agentsession_cas.format.context import build_context

    st = mem()
    old = st.create(Header.new("old", harness={"name": "h", "version": "1"}, cwd="/w", records=["run"]))
    old.append({"type": "config", "model": "m", "instructions_parts": [{"id": "p", "text": "Be brief.", "source": "product"}],
                "tools_added": [{"type": "function", "name": "t"}], "extra": {"temperature": 0.1}})
    old.append(user())
    summary = {"type": "message", "role": "system", "content": "so far: hi"}
    new = st.continue_session("old", successor_id="new", summary=summary)
    assert new.header.data["parent_session"] == "old" and new.header.data["cwd"] == "/w"
    assert new.header.data["harness"] == {"name": "h", "version": "1"} and new.header.records == ["run"]
    before = build_context(st.path_to(old.head)).settings
    after = build_context(st.path_to(new.head))
    assert after.settings.request_members() == before.request_members()
    assert [(p.id, p.source) for p in after.settings.parts] == [("p", "product")]
    assert after.items == [summary]
    assert old.superseded_by == "new" and st.resolve_current("old").current == "new"
    with pytest.raises(SupersededError):
        st.continue_session("old")
    assert verify_stored(st, "new").ok and verify_stored(st, "old").ok
    # a session that cannot take the link (a mirror here) keeps no successor
    mirror = st.import_bytes(parent_file("k", "m1")).id
    with pytest.raises(MirrorError):
        st.continue_session(mirror, successor_id="orphan")
    assert "orphan" not in st


def test_a_child_whose_header_cannot_be_read_fails_the_parents_link(tmp_path):
    st = Store.init(tmp_path / "st")
    kid = linked_parent(st)
    st.create(Header.new(kid, parent_session="p1", spawned_by="call_a")).append(user("x"))
    st.close()
    (tmp_path / "st" / "sessions" / kid / "header").write_bytes(b"not json\n")
    # the log holds the header too (and is served where the file is damaged): lose both
    (tmp_path / "st" / "sessions" / kid / "log").write_bytes(b"")
    st = open_store(str(tmp_path / "st"))
    check = verify_stored(st, "p1")
    assert [p["code"] for p in check.problems] == ["link-parent"] and "cannot be read" in check.problems[0]["message"]


def test_a_fork_at_an_append_not_yet_committed(tmp_path):
    """The origin is open here with a lazy append at its head: the fork is made there,
    the store committing the base first (RFC 0002), and it reads back whole."""
    st = Store.init(tmp_path / "st", sync="never")
    a = st.create(Header.new("a"))
    a.append(user())
    head = a.append(user("lazy")).id
    assert not a.is_committed(head)
    f = st.fork("a", session_id="f")
    assert f.base == head and f.header.data["parent_session"] == "a"
    st.close()
    assert verify_stored(open_store(str(tmp_path / "st")), "f").ok
