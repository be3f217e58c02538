"""A caller's bad argument is the caller's mistake (``BadArgumentError``, code
``bad_argument``), never the store's (``store_fault``), nor a raw ``TypeError``, nor a
silent answer."""

from __future__ import annotations

import pytest

from agentsession_cas import BadArgumentError, Header
from agentsession_cas.errors import BadNameError, ReadOnlyError, StoreError
from agentsession_cas.exchange.wire import error_from_problem, problem_body, wire_status
from agentsession_cas.store import Store

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
                                  "the expected head is an entry id (sha256: and 64 lowercase hex digits) or None"),
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
