"""Session and entry names (agentsession_cas.store.names), on the file and memory stores."""

from __future__ import annotations

import pytest

from agentsession_cas import Header, make_entry, open_store
from agentsession_cas.errors import AmbiguousNameError, BadNameError, NoSuchEntryError, NoSuchSessionError
from agentsession_cas.store.names import resolve_entry, resolve_session
from agentsession_cas.store.refs import Refs


@pytest.fixture(params=["files", "memory"])
def store(request, tmp_path):
    url = str(tmp_path / "store") if request.param == "files" else f"memory:names-{tmp_path.name}"
    with open_store(url, create=True) as st:
        yield st


def _session(store, sid: str, n: int) -> list[str]:
    s = store.create(Header.new(sid, created_at="2026-09-17T12:00:00Z"))
    ids = []
    for i in range(n):
        e = make_entry("item", s.head, item={"type": "message", "role": "user", "content": f"m{i}"}, ts="2026-09-17T12:00:01Z")
        ids.append(s.append(e.data).id)
    s.commit()
    return ids


def test_session_names(store):
    _session(store, "abcd-one", 1)
    _session(store, "abce-two", 1)
    Refs(store).update("chat/x", "abce-two", expected=None)
    assert resolve_session(store, "abcd-one") == "abcd-one"
    assert resolve_session(store, "abcd") == "abcd-one"
    assert resolve_session(store, "ref:chat/x") == "abce-two"
    assert resolve_session(store, "chat/x") == "abce-two"
    with pytest.raises(NoSuchSessionError, match="no id, ref or id prefix"):
        resolve_session(store, "abc")  # too short to be a prefix
    with pytest.raises(BadNameError, match="not usable"):
        resolve_session(store, "../etc")
    _session(store, "abcd-three", 0)
    with pytest.raises(AmbiguousNameError) as info:
        resolve_session(store, "abcd")
    assert info.value.candidates == ["abcd-one", "abcd-three"] and info.value.code == "ambiguous"


def test_an_id_wins_over_a_ref_of_the_same_name(store):
    _session(store, "main", 0)
    _session(store, "other", 0)
    Refs(store).update("main", "other", expected=None)
    assert resolve_session(store, "main") == "main"
    assert resolve_session(store, "ref:main") == "other"


def test_entry_names(store):
    ids = _session(store, "s1", 3)
    with store.read("s1") as s:
        assert resolve_entry(s, ids[1]) == ids[1]
        assert resolve_entry(s, ids[1][7:11]) == ids[1]
        assert resolve_entry(s, ids[1][:13]) == ids[1]
        with pytest.raises(NoSuchEntryError, match="not an entry id nor a prefix"):
            resolve_entry(s, ids[1][7:10])
        with pytest.raises(NoSuchEntryError, match="not an entry id nor a prefix"):
            resolve_entry(s, "XYZW")
        absent = next(p for p in ("0000", "1111", "2222", "3333") if not any(i[7:].startswith(p) for i in ids))
        with pytest.raises(NoSuchEntryError, match="no entry of session s1"):
            resolve_entry(s, absent)


def test_an_ambiguous_entry_prefix_lists_the_candidates():
    """Entries are appended until two share their first four hex digits (about 300 by
    the birthday bound; bounded at 5,000), and that prefix is refused naming both."""
    with open_store("memory:names-ambiguous", create=True) as store:
        s = store.create(Header.new("s1", created_at="2026-09-17T12:00:00Z"))
        seen: dict[str, str] = {}
        pair = None
        for i in range(5000):
            e = make_entry("item", s.head, item={"type": "message", "role": "user", "content": f"m{i}"}, ts="2026-09-17T12:00:01Z")
            eid = s.append(e.data).id
            if eid[7:11] in seen:
                pair = sorted([seen[eid[7:11]], eid])
                break
            seen[eid[7:11]] = eid
        assert pair is not None
        with pytest.raises(AmbiguousNameError) as info:
            resolve_entry(s, pair[0][7:11])
        assert info.value.candidates == pair
        assert resolve_entry(s, pair[0][:20]) == pair[0] or pair[0][:20] == pair[1][:20]
