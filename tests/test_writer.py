"""Writing: round trips through the reader, canonical lines, atomic files, and make_entry's rules."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentsession_cas.format.writer as writer_module
from agentsession_cas import (
    FORMAT_WRITTEN,
    Entry,
    EntryError,
    Header,
    ParentRef,
    SessionBuilder,
    TimestampError,
    canonical_bytes,
    format_ts,
    loads,
    make_entry,
    read_session,
    read_session_bytes,
    session_bytes,
    write_session,
)
from agentsession_cas.format.hashing import RESERVED_MEMBERS
from agentsession_cas.format.reader import split_lines

EPOCH = datetime(2026, 10, 5, 12, 0, 0, tzinfo=UTC)
SID = "0199e000-0000-7000-8000-000000000001"

# -- strategies --------------------------------------------------------------------------------

names = st.text(min_size=0, max_size=8)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["😀", "ﬁ", "\u2028", "\x00", "é", "\U0010ffff", "𝄞x"]),
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(names, children, max_size=4),
    max_leaves=12,
)
bodies = st.dictionaries(names.filter(lambda k: k not in RESERVED_MEMBERS), values, max_size=5)
types = st.sampled_from(["item", "config", "response", "custom", "acme:note", "x:y", "info", "outcome"])

# An op is (kind, index, type, body); index picks a parent or a target among what exists.
ops = st.lists(
    st.tuples(
        st.sampled_from(["append", "append", "append", "branch", "mark", "checkpoint"]),
        st.integers(min_value=0, max_value=10**6),
        types,
        bodies,
        st.integers(min_value=0, max_value=999_999_999),
    ),
    min_size=1,
    max_size=25,
)


def _build(operations, based: bool) -> SessionBuilder:
    """Play ``operations`` on a builder as a harness would.

    A branch that does not move the builder's leaf is followed by a `leaf`
    label re-marking the builder's leaf, as a projection records a head
    that is not the last line; marks never name a leaf label, nor (in a
    based session) the prefix above the base or the universal root.
    """
    prefix: list[Entry] = []
    base = None
    if based:
        parent = None
        for i in range(3):
            e = make_entry("item", parent, ts=EPOCH - timedelta(days=1, seconds=-i), item={"prefix": i})
            prefix.append(e)
            parent = e.id
        base = parent
    b = SessionBuilder(Header.new(SID, created_at="2026-10-05T12:00:00Z", base=base), prefix=prefix)
    above_base = {e.id for e in prefix[:-1]}
    for i, (kind, pick, type_, body, nanos) in enumerate(operations):
        # what RFC 0001 requires of the type (rules.py "missing-member"): an item its item, an outcome its target
        if type_ == "item" and not isinstance(body.get("item"), dict):
            body = {**body, "item": {"type": "message", "n": i}}
        elif type_ == "outcome" and not isinstance(body.get("target"), str):
            body = {**body, "target": b.entries[pick % len(b.entries)].id if b.entries else "sha256:" + "0" * 64}
        ts = EPOCH + timedelta(seconds=3 * i)
        t0 = format_ts(ts, nanos)
        t1 = format_ts(ts + timedelta(seconds=1), nanos)
        own = [e for e in b.entries if e.id not in above_base]
        if kind == "append" or (kind == "branch" and not own):
            b.append(type_, ts=t0, **body)
        elif kind == "branch":
            parent = own[pick % len(own)].id
            b.branch(parent, type_, ts=t0, **body)
            if b.leaf != b.entries[-1].id:
                b.mark_leaf(b.leaf, ts=t1)
        elif kind == "mark":
            candidates = [e.id for e in own if not e.is_leaf_label]
            if not based:
                candidates.append(None)
            if candidates:
                b.mark_leaf(candidates[pick % len(candidates)], ts=t0)
        else:  # a bookmark that is not `leaf`: a record entry, appended under the leaf
            target = b.entries[pick % len(b.entries)].id if b.entries else None
            b.append("label", ts=t0, target=target, label="checkpoint")
    return b


# -- round trip ----------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.booleans())
def test_round_trip_same_entries_and_leaf(operations, based):
    b = _build(operations, based)
    data = b.to_bytes()
    s = read_session_bytes(data)
    assert s.all_problems() == [], [str(p) for p in s.all_problems()]
    assert [e.id for e in s.entries] == [e.id for e in b.entries]
    # the same members (compared canonically: 2**60 as a float reads back as the int its rendering spells)
    assert [canonical_bytes(e.data) for e in s.entries] == [canonical_bytes(e.data) for e in b.entries]
    assert [e.canonical_line() for e in s.entries] == [e.canonical_line() for e in b.entries]
    assert s.header.data == b.header.data
    assert s.leaf == b.leaf
    # and written again, byte for byte
    assert s.canonical_bytes() == data


@settings(max_examples=40, deadline=None)
@given(ops)
def test_written_lines_are_canonical(operations):
    data = _build(operations, False).to_bytes()
    assert data.endswith(b"\n")
    for line in split_lines(data):
        assert line == canonical_bytes(loads(line))
        assert b"\n" not in line


@settings(max_examples=60, deadline=None)
@given(bodies, types)
def test_entry_hash_does_not_depend_on_member_order(body, type_):
    e = make_entry(type_, None, ts="2026-10-05T12:00:00Z", **body)
    reordered = make_entry(type_, None, ts="2026-10-05T12:00:00Z", **dict(reversed(list(body.items()))))
    assert e.id == reordered.id
    assert Entry.from_dict(loads(e.canonical_line())).id == e.id


def test_round_trip_sample_is_not_vacuous():
    # the property above sees branches, marks and a leaf that is not the last line
    b = SessionBuilder(Header.new(SID, created_at="2026-10-05T12:00:00Z"))
    r = b.append("item", ts="2026-10-05T12:00:00Z", item={"n": 0})
    b.append("item", ts="2026-10-05T12:00:01Z", item={"n": 1})
    b.mark_leaf(r.id, ts="2026-10-05T12:00:02Z")
    new = b.append("item", ts="2026-10-05T12:00:03Z", item={"n": 2})
    b.branch(r.id, "item", ts="2026-10-05T12:00:04Z", item={"n": 3})
    # the file's rule: the newest entry under the marked branch written after the
    # label, so a branch inside it moves the leaf the file gives ...
    assert read_session_bytes(b.to_bytes()).leaf == b.entries[-1].id != b.leaf
    # ... and a head that stays where it was needs a leaf label saying so
    b.mark_leaf(b.leaf, ts="2026-10-05T12:00:05Z")
    s = read_session_bytes(b.to_bytes())
    assert b.leaf == new.id == s.leaf
    assert s.leaf != s.entries[-1].id


# -- the builder ------------------------------------------------------------------------------------


def test_builder_moves_the_leaf_as_rfc_0001_says():
    b = SessionBuilder(Header.new(SID, created_at="2026-10-05T12:00:00Z"))
    assert b.leaf is None
    a = b.append("config", ts="2026-10-05T12:00:00Z", model="m")
    assert b.leaf == a.id and a.parent is None
    c = b.append("item", ts="2026-10-05T12:00:01Z", item={})
    assert b.leaf == c.id and c.parent == a.id
    side = b.branch(a.id, "item", ts="2026-10-05T12:00:02Z", item={"side": 1})
    assert b.leaf == c.id  # an append elsewhere is a branch: the leaf does not move
    under = b.branch(c.id, "item", ts="2026-10-05T12:00:03Z", item={"under": 1})
    assert b.leaf == under.id  # under the leaf: it moves
    m = b.mark_leaf(side.id, ts="2026-10-05T12:00:04Z")
    assert b.leaf == side.id
    assert m.parent == under.id and m.target == side.id and m.is_leaf_label
    nxt = b.append("item", ts="2026-10-05T12:00:05Z", item={})
    assert nxt.parent == side.id
    b.mark_leaf(None, ts="2026-10-05T12:00:06Z")
    assert b.leaf is None
    root = b.append("config", ts="2026-10-05T12:00:07Z", model="m")
    assert root.parent is None


def test_builder_refuses_duplicates_and_unknown_parents():
    b = SessionBuilder(Header.new(SID, created_at="2026-10-05T12:00:00Z"))
    b.append("config", ts="2026-10-05T12:00:00Z", model="m")
    with pytest.raises(EntryError):
        b.branch(None, "config", ts="2026-10-05T12:00:00Z", model="m")  # the same entry again
    with pytest.raises(EntryError):
        b.branch("sha256:" + "0" * 64, "item", ts="2026-10-05T12:00:01Z", item={})
    assert len(b.entries) == 1


def test_builder_with_a_prefix_starts_at_the_base():
    p = make_entry("config", None, ts="2026-10-05T11:00:00Z", model="m")
    b = SessionBuilder(Header.new(SID, created_at="2026-10-05T12:00:00Z", base=p.id), prefix=[p])
    assert b.leaf == p.id
    e = b.append("item", ts="2026-10-05T12:00:00Z", item={})
    assert e.parent == p.id
    assert read_session_bytes(b.to_bytes()).all_problems() == []


def test_header_new():
    h = Header.new(SID, created_at="2026-10-05T12:00:00Z", harness={"name": "h", "version": "1"}, records=["run"], **{"acme:x": [1]})
    assert h.data["type"] == "session" and h.format == FORMAT_WRITTEN
    assert h.data["acme:x"] == [1] and h.records == ["run"]
    assert "base" not in h.data and "media" not in h.data
    assert h.problems() == []
    assert Header.new(SID).created_at.endswith("Z")


# -- write_session is atomic ------------------------------------------------------------------------


def _session():
    b = SessionBuilder(Header.new(SID, created_at="2026-10-05T12:00:00Z"))
    b.append("config", ts="2026-10-05T12:00:00Z", model="m")
    b.append("item", ts="2026-10-05T12:00:01Z", item={"text": "hé"})
    return b


def test_write_session_writes_the_bytes(tmp_path):
    b = _session()
    path = tmp_path / "s.jsonl"
    write_session(path, b.header, b.entries)
    assert path.read_bytes() == session_bytes(b.header, b.entries) == b.to_bytes()
    assert os.listdir(tmp_path) == ["s.jsonl"]
    assert read_session(path).ok


def test_write_session_uses_a_temp_file_in_the_same_directory(tmp_path, monkeypatch):
    seen = []
    real = os.replace

    def spy(src, dst):
        seen.append((os.fspath(src), os.fspath(dst), open(src, "rb").read()))
        return real(src, dst)

    monkeypatch.setattr(writer_module.os, "replace", spy)
    b = _session()
    path = tmp_path / "sub" / "s.jsonl"
    path.parent.mkdir()
    write_session(path, b.header, b.entries)
    [(src, dst, data)] = seen
    assert os.path.dirname(os.path.abspath(src)) == str(path.parent)
    assert src != dst and os.path.abspath(dst) == str(path)
    assert data == b.to_bytes()  # whole before the rename
    assert os.listdir(path.parent) == ["s.jsonl"]


def test_write_session_replaces_an_existing_file(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"old contents\n")
    held = open(path, "rb")  # a reader that opened the old file keeps it whole
    b = _session()
    write_session(path, b.header, b.entries)
    assert path.read_bytes() == b.to_bytes()
    assert held.read() == b"old contents\n"
    held.close()
    assert os.listdir(tmp_path) == ["s.jsonl"]


def test_write_session_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    b = _session()
    write_session("rel.jsonl", b.header, b.entries)
    assert (tmp_path / "rel.jsonl").read_bytes() == b.to_bytes()
    assert os.listdir(tmp_path) == ["rel.jsonl"]


@pytest.mark.parametrize("fail_at", ["replace", "fsync"])
def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch, fail_at):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"old\n")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer_module.os, fail_at, boom)
    b = _session()
    with pytest.raises(OSError):
        write_session(path, b.header, b.entries)
    assert path.read_bytes() == b"old\n"
    assert os.listdir(tmp_path) == ["s.jsonl"]


def test_unwritable_entry_leaves_nothing(tmp_path):
    b = _session()
    bad = Entry({"type": "item", "parent": None, "ts": "2026-10-05T12:00:00Z", "x": float("nan")}, computed_id="sha256:" + "0" * 64, content_hash="x")
    path = tmp_path / "s.jsonl"
    with pytest.raises(ValueError):
        write_session(path, b.header, b.entries + [bad])
    assert os.listdir(tmp_path) == []


def test_builder_write(tmp_path):
    b = _session()
    b.write(tmp_path / "w.jsonl")
    assert (tmp_path / "w.jsonl").read_bytes() == b.to_bytes()


# -- make_entry ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(RESERVED_MEMBERS - {"parent", "parents", "ts"}))
def test_make_entry_refuses_reserved_body_names(name):
    with pytest.raises(EntryError, match="reserved"):
        make_entry("item", None, ts="2026-10-05T12:00:00Z", **{name: "x"})


def test_reserved_names_are_those_of_rfc_0001():
    assert RESERVED_MEMBERS == {"id", "type", "parent", "parents", "ts", "content"}


def test_reserved_names_nested_are_fine():
    e = make_entry("item", None, ts="2026-10-05T12:00:00Z", item={"content": [], "id": "x", "type": "message"})
    assert e.verified and e.body == {"item": {"content": [], "id": "x", "type": "message"}}


def test_make_entry_sorts_parents():
    a, b, c = ("sha256:" + d * 64 for d in "abc")
    given_order = [
        ParentRef(c, session="s2"),
        {"entry": b, "session": "s1"},
        ParentRef(c),
        ParentRef(a, session="s2"),
        {"entry": a},
        ParentRef(b, session="s10"),
    ]
    e = make_entry("item", None, ts="2026-10-05T12:00:00Z", parents=given_order, item={})
    # without `session` first, then by session, then by entry
    assert e.data["parents"] == [
        {"entry": a},
        {"entry": c},
        {"entry": b, "session": "s1"},
        {"entry": b, "session": "s10"},
        {"entry": a, "session": "s2"},
        {"entry": c, "session": "s2"},
    ]
    again = make_entry("item", None, ts="2026-10-05T12:00:00Z", parents=list(reversed(given_order)), item={})
    assert again.id == e.id


def test_make_entry_omits_empty_parents():
    e = make_entry("item", None, ts="2026-10-05T12:00:00Z", parents=[], item={})
    assert "parents" not in e.data
    assert e.id == make_entry("item", None, ts="2026-10-05T12:00:00Z", item={}).id


@pytest.mark.parametrize(
    "bad",
    [
        "2026-10-05T12:00:00.500Z",
        "2026-10-05T12:00:00.0Z",
        "2026-10-05T12:00:00+00:00",
        "2026-10-05T12:00:00",
        "2026-10-05t12:00:00z",
        "2026-10-05T12:00:60Z",
        "2026-10-05T12:00:00.1234567891Z",
        "yesterday",
        "",
        12,
    ],
)
def test_make_entry_refuses_a_bad_ts(bad):
    with pytest.raises(TimestampError):
        make_entry("item", None, ts=bad, item={})


def test_make_entry_spells_datetimes_the_admitted_way():
    aware = datetime(2026, 10, 5, 14, 0, 1, 500000, tzinfo=timezone(timedelta(hours=2)))
    assert make_entry("item", None, ts=aware, item={}).ts == "2026-10-05T12:00:01.5Z"
    naive = datetime(2026, 10, 5, 12, 0, 1)
    assert make_entry("item", None, ts=naive, item={}).ts == "2026-10-05T12:00:01Z"
    now = make_entry("item", None, item={})
    assert now.ts.endswith("Z") and now.ts.startswith("20")


def test_make_entry_is_hashed_and_verified():
    e = make_entry("item", None, ts="2026-10-05T12:00:00Z", item={"n": 1})
    assert e.verified and e.id == e.data["id"] == e.computed_id
    assert e.content_hash.startswith("sha256:") and len(e.content_hash) == 71
    with pytest.raises(EntryError):
        Entry.from_dict({**e.data, "id": "sha256:" + "0" * 64})


def test_make_entry_refuses_what_ijson_refuses():
    from agentsession_cas import IJSONError

    for bad in (float("nan"), float("inf"), 2**53 + 1, "\ud800", {1: "x"}):
        with pytest.raises((IJSONError, EntryError)):
            make_entry("item", None, ts="2026-10-05T12:00:00Z", x=bad)


def test_mark_leaf_refuses_the_root_in_a_based_session_and_unknown_targets():
    from agentsession_cas import EntryError, Header, SessionBuilder, make_entry

    root = make_entry("item", None, ts="2026-10-05T12:00:00Z", item={"n": 0})
    b = SessionBuilder(Header.new("fork-x", created_at="2026-10-05T12:00:00Z", base=root.id), prefix=[root])
    with pytest.raises(EntryError, match="universal root"):
        b.mark_leaf(None, ts="2026-10-05T12:00:01Z")
    with pytest.raises(EntryError, match="not in the session"):
        b.mark_leaf("sha256:" + "0" * 64, ts="2026-10-05T12:00:01Z")
    assert b.entries == [root]
