"""Session and entry names (agentsession_cas.store.names), on the file and memory stores."""

from __future__ import annotations

import pytest

from agentsession_cas import Header, make_entry, open_store, read_session_bytes
from agentsession_cas.errors import AgentSessionError, AmbiguousNameError, BadNameError, NoSuchEntryError, NoSuchSessionError
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
        assert resolve_entry(s, ids[1][7:]) == ids[1]  # 64 digits without sha256:
        # fewer than 4 digits, or not lowercase hex: no name at all (bad_name), whatever the session holds
        for name in (ids[1][7:10], "XYZW", "ABCD", "", "sha256:", "sha256:" + ids[1][7:9]):
            with pytest.raises(BadNameError, match="not an entry id nor a prefix") as info:
                resolve_entry(s, name)
            assert info.value.code == "bad_name" and "in session s1" in str(info.value)
        absent = next(p for p in ("0000", "1111", "2222", "3333") if not any(i[7:].startswith(p) for i in ids))
        with pytest.raises(NoSuchEntryError, match=f"no such entry: {absent} \\(no id, legacy_id or id prefix in session s1\\)"):
            resolve_entry(s, absent)


def test_a_full_id_the_session_does_not_hold_is_no_entry(store):
    """A full id names an entry only when the session holds it, as a file's does (the
    store's resolver passed any full id on: `rev-parse s1 sha256:333...` printed it)."""
    _session(store, "s1", 2)
    with store.read("s1") as s:
        with pytest.raises(NoSuchEntryError, match="no such entry: sha256:3333"):
            resolve_entry(s, "sha256:" + "3" * 64)


def test_a_fork_names_the_entries_of_its_prefix(store):
    ids = _session(store, "s1", 3)
    store.create(Header.new("fork", base=ids[1], created_at="2026-09-17T12:00:00Z")).commit()
    with store.read("fork") as s:
        assert resolve_entry(s, ids[0]) == ids[0] and resolve_entry(s, ids[1][7:15]) == ids[1]
        with pytest.raises(NoSuchEntryError):
            resolve_entry(s, ids[2])  # after the base: not the fork's


def _legacy_session(store, sid: str, n: int) -> list[str]:
    """A session whose entries carry legacy_id (as one imported from a file before 0.5):
    m0, m1, ..."""
    s = store.create(Header.new(sid, created_at="2026-09-17T12:00:00Z"))
    ids = []
    for i in range(n):
        e = make_entry("item", s.head, item={"type": "message", "role": "user", "content": f"m{i}"},
                       ts="2026-09-17T12:00:01Z", legacy_id=f"m{i}")
        ids.append(s.append(e.data).id)
    s.commit()
    return ids


def test_entry_names_by_legacy_id(store):
    """A stored session's entries answer to their legacy_id, as a file's do (the store's
    resolver knew none); a short legacy id is looked for before a name is refused."""
    ids = _legacy_session(store, "old", 3)
    with store.read("old") as s:
        assert resolve_entry(s, "m2") == ids[2]
        assert resolve_entry(s, ids[0][7:12]) == ids[0]
        with pytest.raises(BadNameError, match="nor the legacy_id of an entry in session old"):
            resolve_entry(s, "m9")
    # a fork of it names the prefix's legacy ids too
    store.create(Header.new("old-fork", base=ids[1], created_at="2026-09-17T12:00:00Z")).commit()
    with store.read("old-fork") as s:
        assert resolve_entry(s, "m1") == ids[1]


def test_the_file_and_the_store_name_entries_alike(store, tmp_path):
    """One rule: the same names give the same entry, or the same code and words (the
    session's name aside), from a session file and from the store holding it."""
    ids = _legacy_session(store, "same", 4)
    with store.read("same") as s:
        sf = read_session_bytes(s.projection(), source="same.jsonl")
        names = [ids[3], ids[3][7:], ids[3][7:15], "sha256:" + ids[3][7:15], "m3", "m7", "abc", "ABCD", "",
                 next(p for p in ("0000", "1111", "2222") if not any(i[7:].startswith(p) for i in ids)),
                 "sha256:" + "3" * 64]
        for name in names:
            try:
                from_store: object = resolve_entry(s, name)
            except AgentSessionError as exc:  # (compared below)
                from_store = (type(exc), exc.code, str(exc).replace("session same", "same.jsonl"))
            try:
                from_file: object = sf.resolve(name).id
            except AgentSessionError as exc:
                from_file = (type(exc), exc.code, str(exc))
            assert from_store == from_file, name


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
        with pytest.raises(AmbiguousNameError, match=f"{pair[0][7:11]} is the start of 2 entry ids in session s1: ") as info:
            resolve_entry(s, pair[0][7:11])
        assert info.value.candidates == pair and info.value.code == "ambiguous"
        sf = read_session_bytes(s.projection(), source="s1.jsonl")
        with pytest.raises(AmbiguousNameError, match=f"{pair[0][7:11]} is the start of 2 entry ids in s1.jsonl: ") as info:
            sf.resolve(pair[0][7:11])  # the file's answer: the same (it was no_entry)
        assert info.value.candidates == pair
        assert resolve_entry(s, pair[0][:20]) == pair[0] or pair[0][:20] == pair[1][:20]
