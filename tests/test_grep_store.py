"""`grep` over a whole store in one bulk pass (store/views.py ``grep_store``): the
shortcut rules entries out by a literal every match must hold, tested on the stored
bytes; it must find exactly what reading every entry finds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentsession_cas import Header
from agentsession_cas.store import Store
from agentsession_cas.store.views import Match, grep_entries, grep_store, required_literal

TS = "2026-09-17T12:00:00Z"

TEXTS = [
    "Name a Prime number",
    'She said "hi" and left',
    "back\\slash and tab\there",
    "line one\nline two: prime",
    "Kelvin \u212a and long \u017f, caf\u00e9 CAF\u00c9",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "only \u212a here",  # a Kelvin sign, and no k: found by "k" ignoring case (Unicode rules)
    "long \u017f",  # a long s, and no s
]


def msg(role: str, text: str) -> dict:
    return {"type": "message", "role": role, "content": text}


def fill(st: Store) -> None:
    """Sessions with every text, structured call arguments and outputs, a shared content
    (the same message in two sessions), a fork, and custom and config entries."""
    a = st.create(Header.new("a"))
    a.append({"type": "config", "ts": TS, "model": "m", "instructions": "Be brief.\nAnswer in English."})
    for t in TEXTS:
        a.append({"type": "item", "ts": TS, "item": msg("user", t)})
    a.append({"type": "item", "ts": TS, "item": {"type": "function_call", "call_id": "c1", "name": "lookup",
                                                 "arguments": {"q": "primes", "limit": 1.0, "quote": 'a "b"'}}})
    a.append({"type": "item", "ts": TS, "item": {"type": "function_call_output", "call_id": "c1",
                                                 "output": {"rows": [2, 3, 5], "note": "prime list"}}})
    a.append({"type": "custom", "ts": TS, "custom_type": "x:note", "data": {"k": "custom prime"}})
    b = st.create(Header.new("b"))
    for t in TEXTS[:2]:
        b.append({"type": "item", "ts": TS, "item": msg("user", t)})
    f = st.fork("a", a.head, session_id="f")
    f.append({"type": "item", "ts": TS, "item": msg("assistant", "forked prime reply")})


PATTERNS = [
    ("prime", 0), ("Prime", re.I), ("PRIME", re.I), ("^line", 0), ("two: prime$", 0), (r"prime\b", 0),
    ('said "hi"', 0), ('"hi"', 0), (r"back\\slash", 0), ("tab\there", 0), ("one\nline", 0), ("k", re.I),
    ("\u212a", 0), ("s", re.I), ("CAF\u00c9", re.I), ("caf\u00e9", 0), ("\u8a9e\u306e", 0), ("limit", 0),
    (r'"q":"primes"', 0), ("1.0", 0), ('a \\"b', 0), ("rows", 0), ("custom", 0), ("English", 0),
    ("x|prime", 0), (".", 0), ("nothing at all", 0), ("(?i)name", 0), ("pri(me)", 0), ("p.ime", 0),
]


def naive(st: Store, sessions: list[str], pattern: re.Pattern[str]) -> list[Match]:
    out: list[Match] = []
    for sid in sessions:
        with st.read(sid) as s:
            out.extend(grep_entries(sid, s, pattern))
    return out


@pytest.fixture(params=["loose", "packed"])
def store(request, tmp_path) -> Path:
    root = tmp_path / "store"
    with Store.init(str(root)) as st:
        fill(st)
    if request.param == "packed":
        with Store(str(root)) as st:
            st.pack()
        assert not list((root / "objects" / "contents").glob("*/*"))
    return root


@pytest.mark.parametrize(("text", "flags"), PATTERNS)
def test_the_bulk_search_finds_what_reading_every_entry_finds(store, text, flags):
    pattern = re.compile(text, flags)
    with Store(str(store), readonly=True) as st:
        sessions = sorted(st.list())
        assert list(grep_store(st, sessions, pattern)) == naive(st, sessions, pattern)
        # grep -l's search: each session's first match, the rest of it not searched
        firsts = {}
        for m in naive(st, sessions, pattern):
            firsts.setdefault(m.session, m)
        assert list(grep_store(st, sessions, pattern, first=True)) == list(firsts.values())


def test_required_literal_is_a_run_every_match_holds_without_escaped_characters():
    def lit(text: str, flags: int = 0) -> object:
        found = required_literal(re.compile(text, flags))
        return None if found is None else (found.pattern, found.flags & re.I)

    assert lit("prime") == (re.escape(b"prime"), 0)
    assert lit(r"prime\b") == (re.escape(b"prime"), 0)
    assert lit("ab?cdef") == (re.escape(b"cdef"), 0)  # the optional b cuts the run
    assert lit('said "hi" now') == (re.escape(b"said "), 0)  # a quote is escaped in the stored bytes
    assert lit("x|prime") is None and lit(".") is None and lit("") is None
    assert lit("Prime", re.I) == ("Prime", re.I)  # case-insensitive: a text test (Unicode case rules)
    assert lit("(?i)name") == ("name", re.I)
    assert lit("caf\u00e9") == (re.escape("caf\u00e9".encode()), 0)


def test_entries_only_a_log_holds_are_searched_too(tmp_path):
    """A writer's lazy appends not yet checkpointed have objects only its log holds: the
    scan does not see them, and they are read and searched all the same."""
    root = tmp_path / "store"
    with Store.init(str(root), sync="never") as st:
        s = st.create(Header.new("live"))
        s.append({"type": "item", "ts": TS, "item": msg("user", "unseen prime")})
        pattern = re.compile("unseen")
        got = list(grep_store(st, ["live"], pattern))
        assert [m.text for m in got] == ["unseen prime"]


def test_a_corrupt_pack_is_an_error_not_a_silent_miss(tmp_path):
    """A content the scan cannot read is not ruled out: the verified read meets the damage."""
    root = tmp_path / "store"
    with Store.init(str(root)) as st:
        fill(st)
        st.pack()
    pack_file = next((root / "objects" / "pack").glob("pack-*.pack"))
    data = bytearray(pack_file.read_bytes())
    for i in range(64, len(data) - 64, 7):
        data[i] ^= 0xFF
    pack_file.write_bytes(bytes(data))
    from agentsession_cas.errors import AgentSessionError

    with Store(str(root), readonly=True) as st, pytest.raises(AgentSessionError):
        list(grep_store(st, sorted(st.list()), re.compile("prime")))


def test_a_store_that_cannot_list_its_objects_is_searched_entry_by_entry(tmp_path, monkeypatch):
    """A store over HTTP lists no objects (RFC 0003): grep reads every entry instead."""
    from agentsession_cas.errors import UnsupportedError

    root = tmp_path / "store"
    with Store.init(str(root)) as st:
        fill(st)

    def no_scan(self, spaces):
        raise UnsupportedError("this store does not list its objects")
        yield  # a generator, as scan is

    with Store(str(root), readonly=True) as st:
        pattern = re.compile("prime")
        sessions = sorted(st.list())
        expected = naive(st, sessions, pattern)
        monkeypatch.setattr(type(st.backend.objects), "scan", no_scan)
        assert expected and list(grep_store(st, sessions, pattern)) == expected
