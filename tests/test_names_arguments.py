"""A caller's bad argument is the caller's mistake (``BadArgumentError``, code
``bad_argument``), never the store's (``store_fault``), nor a raw ``TypeError``, nor a
silent answer; and the exchange commands check the names they are given before any
store or network work (docs/cli.md "Naming sessions and entries")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from agentsession_cas import BadArgumentError, Header
from agentsession_cas.backends.files.objects import PACK_BATCH
from agentsession_cas.errors import BadNameError, ReadOnlyError, StoreError
from agentsession_cas.exchange.wire import error_from_problem, problem_body, wire_status
from agentsession_cas.format.hashing import sha256_ref
from agentsession_cas.store import Store
from agentsession_cli.main import main

ITEM = {"type": "item", "item": {"type": "message", "role": "user", "content": "hi"}}


@pytest.fixture
def st():
    with Store.init("memory:") as store:
        yield store


def _session(st: Store):
    s = st.create(Header.new("s1"))
    s.append(ITEM)
    return s


# Each public method given a value of the wrong type, out of range or not one it names:
# (what, call, the words the error says). Each raised store_fault, a raw TypeError, or
# answered as if nothing were wrong, before.
BAD_ARGUMENTS = {
    "Session.set_mark junk": (lambda st, s: s.set_mark("junk"), "a mark is 'record' or 'mirror', not 'junk'"),
    "Session.set_mark None": (lambda st, s: s.set_mark(None), "a mark is 'record' or 'mirror', not None"),
    "Store sync": (lambda st, s: Store("memory:", sync="bogus"), "unknown sync policy 'bogus'"),
    "Store.put_blob str": (lambda st, s: st.put_blob("text"), "a blob is bytes, not str: 'text'"),
    "Store.import_bytes str": (lambda st, s: st.import_bytes("text"), "import_bytes takes a session file's bytes, not str"),
    "Store.cat_object space": (lambda st, s: st.cat_object(s.head, "media"), "unknown object space 'media'"),
    "Store.entries str": (lambda st, s: list(st.entries(s.head)), "entries takes a sequence of entry ids, not str"),
    "Store.fork header": (lambda st, s: st.fork("s1", header=[("id", "x")]), "a fork's header members are a JSON object"),
    "Store.fork header, origin absent": (lambda st, s: st.fork("ghost", header=[("id", "x")]),
                                         "a fork's header members are a JSON object"),
    "Store.export_to None": (lambda st, s: st.export_to("s1", None), "export_to writes to a path (str or os.PathLike), not NoneType"),
    "Store.continue_session summary": (lambda st, s: st.continue_session("s1", summary="done"),
                                       "a summary is an item, a JSON object (a dict), not str"),
    "Store.resolve_current limit -1": (lambda st, s: st.resolve_current("s1", limit=-1),
                                       "limit is a whole number of links, 0 or more, not -1"),
    "Store.resolve_current limit str": (lambda st, s: st.resolve_current("s1", limit="9"),
                                        "limit is a whole number of links, 0 or more, not '9'"),
    "Session.append durable str": (lambda st, s: s.append(dict(ITEM, ts="2026-12-04T05:00:00Z"), durable="false"),
                                   "durable is True, False or None"),
    "Session.prepare durable int": (lambda st, s: s.prepare([dict(ITEM, ts="2026-12-04T05:00:00Z")], durable=0),
                                    "durable is True, False or None"),
    "PreparedBatch.commit durable": (lambda st, s: s.prepare([dict(ITEM, ts="2026-12-04T05:00:00Z")]).commit(durable="no"),
                                     "durable is True, False or None"),
    "Session.set_head expected": (lambda st, s: s.set_head(s.head, expected="abcd"),
                                  "the expected head 'abcd' is not an entry id (sha256: and 64 lowercase hex digits) "
                                  "nor None (no head)"),
}


@pytest.mark.parametrize("what", sorted(BAD_ARGUMENTS))
def test_a_bad_argument_is_the_callers_mistake(st, what):
    s = _session(st)
    call, words = BAD_ARGUMENTS[what]
    before = (s.head, len(s), s.mark, st.list())
    with pytest.raises(BadArgumentError) as caught:
        call(st, s)
    err = caught.value
    assert err.code == "bad_argument" and err.status == 400 and isinstance(err, ValueError)
    assert not isinstance(err, StoreError)  # (not the store's fault: a caller catching StoreError is not told so)
    assert words in str(err), str(err)
    assert (s.head, len(s), s.mark, st.list()) == before  # nothing written


def test_a_bad_mark_is_said_before_read_only(tmp_path):
    Store.init(tmp_path / "s").close()
    with Store.init(tmp_path / "s") as st:
        _session(st)
    with Store(tmp_path / "s", readonly=True) as ro:
        s = ro.session("s1")
        with pytest.raises(BadArgumentError):
            s.set_mark("junk")
        with pytest.raises(ReadOnlyError):
            s.set_mark("mirror")


@pytest.mark.parametrize("walk", ["Store.ancestry", "Store.path_to", "Store.ancestry_up", "Session.ancestry"])
def test_the_ancestry_of_none_is_no_name_not_an_empty_path(st, walk):
    """``Store.ancestry(None)`` answered ``[]``, as if None were a root's parent: now the
    read by a name that is no name, as ``Store.entry(None)`` is (``bad_name``)."""
    s = _session(st)
    call = {"Store.ancestry": lambda: st.ancestry(None), "Store.path_to": lambda: st.path_to(None),
            "Store.ancestry_up": lambda: list(st.ancestry_up(None)), "Session.ancestry": lambda: s.ancestry(None)}[walk]
    with pytest.raises(BadNameError) as caught:
        call()
    assert caught.value.code == "bad_name"
    assert str(caught.value) == "None is not an object name (sha256: and 64 lowercase hex digits)"


def test_good_arguments_still_pass(st):
    s = _session(st)
    s.set_mark("mirror")
    s.set_mark("record")
    r = s.append(dict(ITEM, ts="2026-12-04T05:00:01Z"), durable=False)
    s.prepare([dict(ITEM, ts="2026-12-04T05:00:02Z")], durable=None).commit(durable=True)
    s.set_head(r.id, expected=s.head)
    assert st.resolve_current("s1", limit=0).current == "s1"
    assert st.cat_object(s.head, "entries")[0] == "entries"
    assert st.blob(st.put_blob(bytearray(b"x"))) == b"x"
    assert [e.id for e in st.entries((s.head,))] == [s.head]


def test_bad_argument_crosses_the_wire_as_itself():
    """Over RFC 0003 the code is the protocol's fallback (``store_fault``, which has no
    code for a malformed request, as for ``bad_name``), the status 400, and the client
    raises the same class from ``library_code``."""
    exc = BadArgumentError("a mark is 'record' or 'mirror', not 'junk'")
    body = problem_body(exc)
    assert (body["code"], body["library_code"], body["status"], wire_status(exc)) == (
        "store_fault", "bad_argument", 400, 400)
    back = error_from_problem(400, body, where="remote http://x")
    assert type(back) is BadArgumentError and back.code == "bad_argument" and back.status == 400


# -- the exchange commands: names checked before any work ------------------------------------

SID = "s1"


def cli(store: Path, *args: str):
    return CliRunner().invoke(main, ["--store", str(store), *args], catch_exceptions=False)


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every file of a store but its lock files, by path."""
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and "locks" not in p.parts}


@pytest.fixture
def pushed(tmp_path):
    """A store holding session s1 (a record of 2 entries, ref chat/one) pushed to a remote."""
    a, b = tmp_path / "a", tmp_path / "b"
    with Store.init(a) as st:
        s = st.create(Header.new(SID))
        ids = [s.append(dict(ITEM, ts=f"2026-12-04T05:00:0{i}Z")).id for i in range(2)]
    Store.init(b).close()
    assert cli(a, "ref", "update", "chat/one", SID).exit_code == 0
    assert cli(a, "push", SID, str(b)).exit_code == 0
    return a, b, ids


@pytest.mark.parametrize("argv, words", [
    (["push", SID, "{b}", "--ref", "chat//one"], "invalid ref name 'chat//one'"),
    (["push", SID, "{b}", "--ref", "con"], "names a Windows device"),
    (["push", SID, "{b}", "--ref", "chat/one:../x"], "EXPECTED, what the ref holds, is a session id"),
    (["handover", SID, "{b}", "--ref", ":s1"], "invalid ref name ''"),
    (["fetch", SID, "{b}", "--ref", "chat/one:a b"], "session id 'a b' is not usable"),
    (["declare-record", "nope", "--remote", "{b}", "--expect", "abcd"],
     "'abcd' is not a full entry id (sha256: and 64 lowercase hex digits, or the 64 digits; '' for no head)"),
])
def test_a_bad_ref_or_expected_head_is_a_usage_error_before_any_work(pushed, argv, words):
    """--ref NAME[:EXPECTED] went to the library unchecked (a bad name refused after the
    objects were sent, exit 1); --expect of a session this store lacks went to the remote
    as it was. Both are now usage errors (exit 2, code usage), the remote untouched."""
    a, b, _ = pushed
    argv = [str(b) if x == "{b}" else x for x in argv]
    snap = tree_snapshot(b)
    r = cli(a, *argv, "--json")
    assert r.exit_code == 2 and r.stdout == "", (argv, r.stderr)
    err = json.loads(r.stderr)["error"]
    assert err["code"] == "usage" and words in err["message"], err
    assert tree_snapshot(b) == snap
    r = cli(a, *argv)
    assert r.exit_code == 2 and "Invalid value for '--" in r.stderr and "Traceback" not in r.stderr


def test_good_refs_and_expected_heads_still_pass(pushed):
    a, b, ids = pushed
    with Store(a) as st:
        head = st.session(SID).append(dict(ITEM, ts="2026-12-04T05:00:09Z")).id
    r = cli(a, "push", SID, str(b), "--ref", "chat/one:", "--expect", ids[-1][7:], "--json")  # 64 digits: the full id
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["head"]["expected"], out["head"]["after"]) == (ids[-1], head)
    assert [(x["name"], x["moved"]) for x in out["refs"]] == [("chat/one", True)]
    r = cli(a, "fetch", SID, str(b), "--ref", f"chat/one:{SID}", "--json")
    assert r.exit_code == 0, r.stderr
    # declare-record --remote of a session this store lacks: a full id goes to the remote as it stands
    c = a.parent / "c"
    Store.init(c).close()
    r = cli(c, "declare-record", SID, "--remote", str(b), "--expect", "sha256:" + "0" * 64, "--json")
    assert r.exit_code == 1 and json.loads(r.stderr)["error"]["code"] == "head_moved", r.stderr


# -- create --base: an entry named as everywhere, among every entry the store holds ------------


def test_create_base_takes_a_unique_prefix_of_any_sessions_entry(pushed):
    """``create --base`` took a full id only (a prefix was refused as a base no session
    holds); now the one rule, among the entries of every session."""
    a, _, ids = pushed
    with Store(a) as st:
        st.fork(SID, ids[0], session_id="s2")  # s2 holds ids[0] on its prefix: one entry, one candidate
    for name, new in ((ids[0][7:15], "f1"), (ids[1][:15], "f2"), (ids[1][7:], "f3")):
        r = cli(a, "create", "--id", new, "--base", name, "--json")
        assert r.exit_code == 0, (name, r.stderr)
        assert json.loads(r.stdout)["base"] == json.loads(r.stdout)["head"] == (ids[0] if new == "f1" else ids[1])


@pytest.mark.parametrize("name, code, words", [
    ("abc", "bad_name", "'abc' is not an entry id nor a prefix of one (4 to 64 lowercase hex digits, with or without "
                        "sha256:), for an entry in the store at "),
    ("m0", "bad_name", "'m0' is not an entry id nor a prefix of one"),
    ("ffffffff", "no_entry", "no such entry: ffffffff (no id or id prefix in the store at "),
    ("sha256:" + "f" * 64, "no_entry", "is not an entry this store holds"),
])
def test_create_base_refuses_as_the_one_rule_does(pushed, name, code, words):
    a, _, ids = pushed
    if any(i.startswith("sha256:ffffffff") for i in ids):  # pragma: no cover
        pytest.skip("astronomically unlikely")
    r = cli(a, "create", "--id", "f9", "--base", name, "--json")
    assert r.exit_code == 1, r.stderr
    err = json.loads(r.stderr)["error"]
    assert err["code"] == code and words in err["message"], err
    with Store(a, readonly=True) as st:
        assert "f9" not in st


def test_create_base_prefix_of_two_entries_is_ambiguous_across_sessions(tmp_path):
    """Two different entries sharing a prefix are ambiguous wherever they are held (here
    in two sessions), listing both."""
    root = tmp_path / "s"
    seen: dict[str, str] = {}
    with Store.init(root) as st:
        i = 0
        while True:
            s = st.create(Header.new(f"s{i}"))
            eid = s.append(dict(ITEM, ts="2026-12-04T05:00:00Z", item={**ITEM["item"], "content": f"m{i}"})).id
            if eid[7:11] in seen:
                shared, pair = eid[7:11], sorted([seen[eid[7:11]], eid])
                break
            seen[eid[7:11]] = eid
            i += 1
    r = cli(root, "create", "--id", "fork", "--base", shared, "--json")
    assert r.exit_code == 1
    err = json.loads(r.stderr)["error"]
    assert err["code"] == "ambiguous" and err["candidates"] == pair
    assert err["message"].startswith(f"{shared} is the start of 2 entry ids in the store at ")


# -- a name that is no object name: one wording, one code, wherever it is given --------------

#: A hostile name: the old wordings (``{name!r}``) sent all 10,000 characters back.
LONG = "x" * 10_000


def test_a_long_name_that_is_no_object_name_is_cut_alike_on_every_route(tmp_path):
    """The server's object routes, its ``missing`` parse and a batch upload's frame
    spelled the wording out again with ``!r``: a 10,000-character name came back whole.
    Now each raises ``errors.not_an_object_name``, cut by ``quoted()``."""
    from starlette.testclient import TestClient

    from agentsession_cas.errors import not_an_object_name
    from agentsession_cas.server.app import ServerState, create_app

    want = str(not_an_object_name(LONG))
    assert len(want) < 200 and "(10000 characters)" in want
    state = ServerState(Store.init(tmp_path / "srv"), None)
    with TestClient(create_app(state), base_url="http://testserver/v1") as c:
        answers = {
            "GET object": c.get(f"/objects/entries/{LONG}"),
            "PUT object": c.put(f"/objects/media/{LONG}", content=b"x"),
            "missing": c.post("/objects/missing", json={"entries": [LONG]}),
            # (a frame's line is at most 200 bytes: a name of 150 is cut all the same)
            "batch upload": c.post("/objects", content=f"media {LONG[:150]} 1\nx".encode()),
        }
    framed = f"object frame 0: {not_an_object_name(LONG[:150])}"
    assert "(150 characters)" in framed
    for what, r in answers.items():
        body = r.json()
        assert (r.status_code, body["library_code"]) == (400, "bad_name"), (what, body)
        assert body["detail"] == (want if what != "batch upload" else framed), what


def test_a_name_that_is_no_object_name_is_bad_name_at_the_endpoint_and_every_put(tmp_path):
    """``StoreEndpoint.missing`` says it by the one helper; a put of a name that is no
    object name is ``bad_name`` on every backend: the memory store kept it as given, and
    PostgreSQL's rows said ``no_object``, as if the name were merely absent."""
    from agentsession_cas.backends.postgresql.objects import object_rows
    from agentsession_cas.errors import not_an_object_name
    from agentsession_cas.exchange.endpoint import StoreEndpoint

    with Store.init("memory:") as mem, Store.init(tmp_path / "f") as files:
        with pytest.raises(BadNameError) as caught:
            StoreEndpoint(mem).missing({"entries": [LONG]})
        assert str(caught.value) == str(not_an_object_name(LONG))
        for objects in (mem.backend.objects, files.backend.objects):
            for name in ("junk", "sha256:" + "A" * 64):
                with pytest.raises(BadNameError) as caught:
                    objects.put("blobs", name, b"x")
                assert str(caught.value) == str(not_an_object_name(name)), objects
                with pytest.raises(BadNameError) as caught:
                    objects.put_many([("blobs", name, b"x")])
                assert str(caught.value) == str(not_an_object_name(name)), objects
        assert list(mem.backend.objects.names("blobs")) == []
        # A batch big enough to be one pack: the pack's index holds raw digests, so an
        # upper-case name was taken as the lower-case one, and "junk" was a ValueError.
        for objects in (mem.backend.objects, files.backend.objects):
            for name in ("junk", "sha256:" + "A" * 64):
                batch = [("blobs", sha256_ref(b"%d" % i), b"%d" % i) for i in range(PACK_BATCH)]
                batch.insert(PACK_BATCH // 2, ("blobs", name, b"x"))
                with pytest.raises(BadNameError) as caught:
                    objects.put_many(batch, count=len(batch))
                assert str(caught.value) == str(not_an_object_name(name)), objects
        assert list(files.backend.objects.names("blobs")) == []  # (the pack was not made)
    for name in ("junk", "sha256:" + "A" * 64):
        with pytest.raises(BadNameError) as caught:
            object_rows([("blobs", name, b"x")], None)  # type: ignore[arg-type]  (refused before any is encoded)
        assert caught.value.code == "bad_name" and str(caught.value) == str(not_an_object_name(name))


# -- a header that is no header, entries that are no entries: the caller's argument ----------


@pytest.mark.parametrize("given", ["hello", 42, None, ["id", "s1"]])
def test_create_of_what_is_no_header_is_a_bad_argument_before_read_only(tmp_path, given):
    """``Store.create("hello")`` was ``bad_file`` (a SessionFormatError, as if a file did not
    read); it is an argument of the wrong type, said before the store's mode is."""
    with Store.init("memory:") as st:
        with pytest.raises(BadArgumentError) as caught:
            st.create(given)  # type: ignore[arg-type]
        assert caught.value.code == "bad_argument" and st.list() == []
        assert f"a header is a Header or a JSON object (a dict), not {type(given).__name__}" in str(caught.value)
    Store.init(tmp_path / "s").close()
    with Store(tmp_path / "s", readonly=True) as ro:
        with pytest.raises(BadArgumentError):
            ro.create(given)  # type: ignore[arg-type]
        with pytest.raises(ReadOnlyError):
            ro.create(Header.new("s1"))


@pytest.mark.parametrize("given", [42, None, "hello", ITEM])
def test_prepare_of_what_is_no_iterable_of_entries_is_a_bad_argument(st, given):
    """``prepare(42)`` was ``bad_entry`` (an AppendRefusedError, rule ``json``), as if an entry
    were refused; it is the caller's argument of the wrong type. Nothing is written."""
    s = _session(st)
    before = (s.head, len(s))
    with pytest.raises(BadArgumentError) as caught:
        s.prepare(given)  # type: ignore[arg-type]
    assert caught.value.code == "bad_argument" and not isinstance(caught.value, StoreError)
    assert "prepare takes entries (an iterable of Entry or JSON objects)" in str(caught.value)
    assert (s.head, len(s)) == before
    assert s.prepare([dict(ITEM, ts="2026-12-04T05:00:03Z")]).results[0].outcome == "continued"


# -- an expected head that is no entry id: one check, one code ---------------------------------


@pytest.mark.parametrize("expected", ["abcd", "", 42, "sha256:" + "A" * 64])
def test_a_malformed_expected_head_is_one_mistake_wherever_it_is_given(tmp_path, expected):
    """A push's and ``declare_record``'s ``expected=`` said ``bad_name`` where ``set_head``
    said ``bad_argument`` for the same mistake; now the one check (``bad_argument``), with
    the one wording, before anything is sent."""
    from agentsession_cas import exchange as ex

    a, b = tmp_path / "a", tmp_path / "b"
    Store.init(b).close()
    with Store.init(a) as st:
        s = st.create(Header.new(SID))
        s.append(ITEM)
        messages = []
        for call in (lambda: s.set_head(s.head, expected=expected),
                     lambda: ex.push(st, b, SID, expected=expected),
                     lambda: ex.declare_record(st, SID, expected=expected)):
            with pytest.raises(BadArgumentError) as caught:
                call()
            assert caught.value.code == "bad_argument"
            messages.append(str(caught.value))
    assert len(set(messages)) == 1 and "is not an entry id" in messages[0], messages
    with Store(b, readonly=True) as far:
        assert far.list() == []  # nothing was sent


# -- create --base ID: a session stands for its head -------------------------------------------


def _created(a: Path, *argv: str) -> dict:
    r = cli(a, "create", *argv, "--json")
    assert r.exit_code == 0, (argv, r.stderr)
    out = json.loads(r.stdout)
    with Store(a, readonly=True) as st:
        out["parent_session"] = st.read(out["session"]).header.data.get("parent_session")
    return out


def test_create_base_takes_a_session_id_for_its_head(pushed):
    """``create --base s1`` was refused (``'s1' is not an entry id nor a prefix``): a session's
    id now names its head, as git takes a branch where a commit is wanted, and the session
    named is the fork's parent_session (and its fork_of link's), even where its head is an
    entry another session holds (a fork with no entries of its own: head = base)."""
    a, _, ids = pushed
    out = _created(a, "--id", "f1", "--base", SID, "--link")
    assert (out["base"], out["parent_session"]) == (ids[-1], SID)
    with Store(a) as st:
        st.fork(SID, ids[0], session_id="bare")  # its head is its base, an entry of s1
    out = _created(a, "--id", "f2", "--base", "bare")
    assert (out["base"], out["head"], out["parent_session"]) == (ids[0], ids[0], "bare")
    assert _created(a, "--id", "f3", "--base", ids[0][7:15])["parent_session"] == SID  # an entry: its holder


def test_create_base_of_a_session_with_no_head_says_so(pushed):
    a, _, _ = pushed
    with Store(a) as st:
        st.create(Header.new("empty"))
    r = cli(a, "create", "--id", "f9", "--base", "empty", "--json")
    assert r.exit_code == 1, r.stderr
    err = json.loads(r.stderr)["error"]
    assert err["code"] == "bad_base" and err["message"] == "session empty has no head to fork at; name an entry"
    with Store(a, readonly=True) as st:
        assert "f9" not in st


def test_create_base_that_is_a_session_and_another_entry_is_ambiguous(pushed):
    """A session id of hex digits that is also the start of another entry's id is refused
    (code ``ambiguous``), naming both: neither reading wins silently. ``sha256:`` before the
    digits names the entry; the head's id the session; both naming one entry is no ambiguity."""
    a, _, ids = pushed
    both = ids[1][7:15]
    with Store(a) as st:
        st.fork(SID, ids[0], session_id=both)  # its head: ids[0]; its id: the start of ids[1]
        st.fork(SID, ids[0], session_id=ids[0][7:15])  # its id the start of its own head
    r = cli(a, "create", "--id", "f9", "--base", both, "--json")
    assert r.exit_code == 1, r.stderr
    err = json.loads(r.stderr)["error"]
    assert err["code"] == "ambiguous" and err["candidates"] == sorted([ids[0], ids[1]]), err
    assert err["message"].startswith(f"{both} is both a session in the store at "), err
    assert f"(its head: {ids[0]}) and the start of an entry id: {ids[1]}; give the head's id" in err["message"]
    with Store(a, readonly=True) as st:
        assert "f9" not in st
    assert _created(a, "--id", "f1", "--base", "sha256:" + both)["base"] == ids[1]
    assert _created(a, "--id", "f2", "--base", ids[0])["base"] == ids[0]
    out = _created(a, "--id", "f3", "--base", ids[0][7:15])
    assert (out["base"], out["parent_session"]) == (ids[0], ids[0][7:15])


@pytest.mark.parametrize("n", [2, PACK_BATCH])
@pytest.mark.parametrize("bad", [None, b"sha256:" + b"0" * 64, 5])
def test_a_name_that_is_no_string_is_bad_name_in_a_batch_of_any_size(tmp_path, n, bad):
    """A pack-sized batch checks its names over them all at once (``all_hashes`` joins
    them): a name that is no string was a raw TypeError there, and bad_name in a small
    batch (reviewer V9)."""
    with Store.init(tmp_path / "s") as st:
        items = [("contents", sha256_ref(b"%d" % i), b"%d" % i) for i in range(n)]
        items[n // 2] = ("contents", bad, b"zz")  # type: ignore[assignment]
        with pytest.raises(BadNameError):
            st.objects.put_many(items, count=n)  # type: ignore[arg-type]
