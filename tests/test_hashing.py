"""Entry hashing (RFC 0001 "Entry hash"): content hash over the body, id over the envelope.

The independent oracle is ``hashlib.sha256`` over ``rfc8785.dumps``; the
reference corpus (written by the Go implementation) supplies ids to match.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsession_cas.errors import EntryError, IJSONError
from agentsession_cas.format.canonical import canonical_bytes as _cb
from agentsession_cas.format.canonical import loads, loads_flagged
from agentsession_cas.format.hashing import (
    ENVELOPE_MEMBERS,
    RESERVED_MEMBERS,
    all_hashes,
    body_of,
    content_hash,
    entry_hashes,
    entry_objects,
    entry_objects_item,
    envelope_hash,
    envelope_object,
    is_hash,
    sha256_ref,
)

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
SESSIONS = CORPUS / "sessions"

# Files whose every entry line carries the id its members hash to (README:
# the broken ones are broken for reasons of their own, some of them hashing).
GOOD = ["basic", "branch", "compaction", "converge", "extensions", "fork", "handback", "instructions",
        "omit", "pinned", "queued", "runs"]


def need_corpus() -> None:
    if not SESSIONS.is_dir():
        pytest.skip(f"reference corpus not present at {SESSIONS}")


def corpus_entries(name: str) -> list[tuple[bytes, dict]]:
    need_corpus()
    path = SESSIONS / f"{name}.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    lines = [line for line in path.read_bytes().split(b"\n") if line]
    return [(line, loads(line)) for line in lines[1:]]  # line 1 is the header


def ref(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oracle_hashes(entry: dict) -> tuple[str, str]:
    """(id, content hash) computed straight from the RFC text with rfc8785."""
    body = {k: v for k, v in entry.items() if k not in ("id", "type", "parent", "parents", "ts")}
    chash = ref(rfc8785.dumps(body))
    env = {"type": entry["type"], "parent": entry.get("parent"), "ts": entry["ts"], "content": chash}
    if entry.get("parents"):
        env["parents"] = entry["parents"]
    return ref(rfc8785.dumps(env)), chash


# --------------------------------------------------------------------------
# The corpus


def test_basic_corpus_ids_recompute():
    entries = corpus_entries("basic")
    assert len(entries) >= 5
    for line, obj in entries:
        computed, chash = entry_hashes(obj, parsed=True)
        assert computed == obj["id"], line
        assert entry_hashes(obj) == (computed, chash)
        assert oracle_hashes(obj) == (computed, chash)
        assert is_hash(computed) and is_hash(chash)
        assert chash == content_hash(body_of(obj))


def test_basic_corpus_known_first_entry():
    entries = corpus_entries("basic")
    _, first = entries[0]
    assert first["type"] == "config" and first["parent"] is None
    assert entry_hashes(first)[0] == "sha256:315d501de2a8de2894e81df8b33412d172347001eab703c2676ae43cb2e0c17a"


@pytest.mark.parametrize("name", GOOD)
def test_good_corpus_ids_recompute(name):
    entries = corpus_entries(name)
    for line, obj in entries:
        assert entry_hashes(obj, parsed=True)[0] == obj["id"], line


def test_corpus_converge_has_parents_and_they_count():
    entries = corpus_entries("converge")
    with_parents = [obj for _, obj in entries if obj.get("parents")]
    assert with_parents, "converge.jsonl has no entry with parents"
    for obj in with_parents:
        stripped = {k: v for k, v in obj.items() if k != "parents"}
        assert entry_hashes(stripped)[0] != obj["id"]
        assert entry_hashes(obj)[0] == obj["id"]


def test_corpus_tampering_is_detected():
    entries = corpus_entries("basic")
    _, obj = entries[1]
    for mutate in (
        lambda o: o.__setitem__("ts", o["ts"].replace("Z", ".1Z")),
        lambda o: o.__setitem__("parent", None),
        lambda o: o.__setitem__("type", "custom"),
        lambda o: o.__setitem__("legacy_id", "x"),
        lambda o: o["item"].__setitem__("role", "assistant"),
        lambda o: o.__setitem__("parents", [o["parent"]]),
    ):
        changed = copy.deepcopy(obj)
        mutate(changed)
        assert entry_hashes(changed)[0] != obj["id"]


# --------------------------------------------------------------------------
# Envelope and body


ENTRY = {
    "type": "item",
    "id": "sha256:" + "0" * 64,
    "parent": "sha256:" + "1" * 64,
    "ts": "2026-09-17T12:00:01Z",
    "item": {"role": "user", "content": [{"type": "input_text", "text": "hi \U0001f600"}], "type": "message"},
    "extra": {"n": 1.5},
}


def test_entry_hashes_match_oracle():
    assert entry_hashes(ENTRY) == oracle_hashes(ENTRY)


def test_body_is_everything_but_the_envelope():
    body = body_of(ENTRY)
    assert set(body) == {"item", "extra"}
    assert not ENVELOPE_MEMBERS & set(body)
    assert body is not ENTRY and "id" in ENTRY  # the entry itself is left alone


def test_content_hash_is_of_canonical_body_bytes():
    _, chash = entry_hashes(ENTRY)
    assert chash == ref(rfc8785.dumps({"item": ENTRY["item"], "extra": ENTRY["extra"]}))
    # Order of members does not matter.
    reordered = dict(reversed(list(ENTRY.items())))
    assert entry_hashes(reordered) == entry_hashes(ENTRY)


def test_envelope_hash_is_of_canonical_envelope_bytes():
    _, chash = entry_hashes(ENTRY)
    env = f'{{"content":"{chash}","parent":"{ENTRY["parent"]}","ts":"{ENTRY["ts"]}","type":"item"}}'.encode()
    assert envelope_hash("item", ENTRY["parent"], None, ENTRY["ts"], chash) == ref(env)
    assert entry_hashes(ENTRY)[0] == ref(env)


def test_root_parent_is_null_in_the_envelope():
    root = {k: v for k, v in ENTRY.items() if k != "parent"}
    explicit = dict(root, parent=None)
    assert entry_hashes(root) == entry_hashes(explicit)
    _, chash = entry_hashes(root)
    env = f'{{"content":"{chash}","parent":null,"ts":"{ENTRY["ts"]}","type":"item"}}'.encode()
    assert entry_hashes(root)[0] == ref(env)


def test_stated_id_does_not_enter_the_hash():
    other = dict(ENTRY, id="sha256:" + "f" * 64)
    no_id = {k: v for k, v in ENTRY.items() if k != "id"}
    assert entry_hashes(other) == entry_hashes(ENTRY) == entry_hashes(no_id)


def test_every_member_outside_the_envelope_counts():
    base_id, base_c = entry_hashes(ENTRY)
    for changed in (
        dict(ENTRY, unknown_member=None),
        dict(ENTRY, extra={"n": 1.25}),
        dict(ENTRY, extra={"n": 1.5, "host": "x"}),
    ):
        new_id, new_c = entry_hashes(changed)
        assert new_c != base_c and new_id != base_id


def test_envelope_members_change_id_not_content():
    base_id, base_c = entry_hashes(ENTRY)
    for changed in (
        dict(ENTRY, ts="2026-09-17T12:00:01.5Z"),
        dict(ENTRY, type="custom"),
        dict(ENTRY, parent=None),
        dict(ENTRY, parents=["sha256:" + "2" * 64]),
    ):
        new_id, new_c = entry_hashes(changed)
        assert new_c == base_c
        assert new_id != base_id


def test_numbers_hash_by_value():
    a = loads('{"type":"x","parent":null,"ts":"2026-01-01T00:00:00Z","n":1.0,"m":1e2}')
    b = loads('{"type":"x","parent":null,"ts":"2026-01-01T00:00:00Z","n":1,"m":100}')
    assert entry_hashes(a, parsed=True) == entry_hashes(b, parsed=True)


# --------------------------------------------------------------------------
# parents


def test_empty_parents_hashes_like_absent():
    absent = {k: v for k, v in ENTRY.items()}
    empty = dict(ENTRY, parents=[])
    assert entry_hashes(empty) == entry_hashes(absent)
    assert entry_hashes(dict(ENTRY, parents=None)) == entry_hashes(absent)
    _, chash = entry_hashes(ENTRY)
    assert envelope_hash("item", None, [], ENTRY["ts"], chash) == envelope_hash("item", None, None, ENTRY["ts"], chash)
    assert "parents" not in envelope_object("item", None, [], ENTRY["ts"], chash)


def test_non_empty_parents_are_in_the_envelope():
    parents = ["sha256:" + "2" * 64, {"entry": "b0000006", "session": "s"}]
    entry = dict(ENTRY, parents=parents)
    computed, chash = entry_hashes(entry)
    assert envelope_object("item", ENTRY["parent"], parents, ENTRY["ts"], chash)["parents"] == parents
    assert (computed, chash) == oracle_hashes(entry)
    assert computed != entry_hashes(ENTRY)[0]
    # Order of parents matters (an array).
    assert entry_hashes(dict(ENTRY, parents=list(reversed(parents))))[0] != computed


@pytest.mark.parametrize("parents", ["sha256:" + "2" * 64, {"entry": "x"}, 5, True])
def test_parents_must_be_an_array(parents):
    with pytest.raises(EntryError, match="parents"):
        entry_hashes(dict(ENTRY, parents=parents))


# --------------------------------------------------------------------------
# Reserved names and envelope member types


def test_reserved_content_in_body_refused():
    with pytest.raises(EntryError, match="content"):
        entry_hashes(dict(ENTRY, content="sha256:" + "3" * 64))
    with pytest.raises(EntryError):
        entry_hashes(dict(ENTRY, content=None))
    with pytest.raises(EntryError):
        body_of({"type": "x", "content": {}})
    # Only at top level: a nested "content" is an ordinary member.
    assert entry_hashes(ENTRY)  # ENTRY["item"] holds "content"


def test_reserved_members():
    assert RESERVED_MEMBERS == {"id", "type", "parent", "parents", "ts", "content"}
    assert ENVELOPE_MEMBERS == {"id", "type", "parent", "parents", "ts"}


@pytest.mark.parametrize(
    "change,match",
    [
        ({"type": None}, "type"),
        ({"type": ""}, "type"),
        ({"type": 5}, "type"),
        ({"parent": 5}, "parent"),
        ({"parent": ["sha256:" + "1" * 64]}, "parent"),
    ],
)
def test_envelope_member_types(change, match):
    with pytest.raises(EntryError, match=match):
        entry_hashes(dict(ENTRY, **change))


def test_missing_members():
    with pytest.raises(EntryError, match="type"):
        entry_hashes({k: v for k, v in ENTRY.items() if k != "type"})
    with pytest.raises(EntryError, match="ts"):
        entry_hashes({k: v for k, v in ENTRY.items() if k != "ts"})


def test_body_must_be_ijson():
    with pytest.raises(IJSONError):
        entry_hashes(dict(ENTRY, big=9007199254740993))
    with pytest.raises(IJSONError):
        entry_hashes(dict(ENTRY, s="\ud83d"))
    with pytest.raises(IJSONError):
        entry_hashes(dict(ENTRY, m={1: 2}))
    with pytest.raises(IJSONError):
        entry_hashes(dict(ENTRY, ts="2026-01-01T00:00:00Z\ud800"))


# --------------------------------------------------------------------------
# Hash spelling


def test_sha256_ref():
    assert sha256_ref(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert sha256_ref(b"abc") == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


@pytest.mark.parametrize(
    "value",
    [
        "sha256:" + "0" * 64,
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "sha256:" + "0123456789abcdef" * 4,
    ],
)
def test_is_hash_accepts(value):
    assert is_hash(value)


@pytest.mark.parametrize(
    "value",
    [
        "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85F",
        "SHA256:" + "0" * 64,
        "sha512:" + "0" * 64,
        "sha512:" + "0" * 128,
        "sha1:" + "0" * 40,
        "sha256-" + "0" * 64,
        "sha256:" + "0" * 63,
        "sha256:" + "0" * 65,
        "sha256:",
        "0" * 64,
        "sha256:" + "g" * 64,
        "sha256: " + "0" * 63,
        "sha256:" + "0" * 64 + "\n",
        " sha256:" + "0" * 64,
        "sha256:" + "\uff10" * 64,  # FULLWIDTH DIGIT ZERO
        "",
        None,
        b"sha256:" + b"0" * 64,
        12,
    ],
)
def test_is_hash_refuses(value):
    assert not is_hash(value)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.text(max_size=80),
        st.builds(
            lambda prefix, digits: prefix + digits,
            st.sampled_from(["sha256:", "sha256:", "sha512:", "Sha256:", "sha256", ""]),
            st.text("0123456789abcdefABCDEFg\uff10", min_size=62, max_size=66),
        ),
    )
)
def test_is_hash_property(s):
    expected = (
        len(s) == 71 and s.startswith("sha256:") and all(c in "0123456789abcdef" for c in s[7:])
    )
    assert is_hash(s) == expected


# -- the envelope fast path ---------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    type_=st.text(min_size=1),
    parent=st.one_of(st.none(), st.text()),
    ts=st.text(),
)
def test_envelope_fast_path_matches_canonical_bytes(type_, parent, ts):
    content = "sha256:" + "ab" * 32
    try:
        expected = sha256_ref(_cb(envelope_object(type_, parent, None, ts, content)))
    except Exception as exc:  # a lone surrogate: both paths must refuse it alike
        with pytest.raises(type(exc)):
            envelope_hash(type_, parent, None, ts, content)
        return
    assert envelope_hash(type_, parent, None, ts, content) == expected


@pytest.mark.parametrize(
    "env",
    [
        {"content": "sha256:" + "a" * 64, "parent": None, "ts": "2026-10-05T09:00:00Z", "type": "item"},
        {"content": "sha256:" + "a" * 64, "parent": "sha256:" + "b" * 64, "ts": "2026-10-05T09:00:00.5Z", "type": "acme:probe"},
        {"content": "sha256:" + "a" * 64, "parent": None, "parents": [{"entry": "sha256:" + "c" * 64}], "ts": "2026-10-05T09:00:00Z", "type": "item"},
        {"content": "sha256:" + "a" * 64, "parent": None, "ts": "2026-10-05T09:00:00Z", "type": "caf\u00e9:x"},
        {"content": "sha256:" + "a" * 64, "parent": None, "ts": "2026-10-05T09:00:00Z", "type": 'q"uote'},
    ],
)
def test_parse_envelope_fast_form_agrees_with_json(env):
    from agentsession_cas.format.canonical import loads
    from agentsession_cas.format.hashing import parse_envelope

    data = _cb(env)
    parsed, careful = parse_envelope(data)
    assert parsed == loads(data) == env
    assert careful is False or careful is None or careful is True


@pytest.mark.parametrize(
    "env",
    [
        {"content": "sha256:" + "a" * 64, "parent": None, "ts": "2026-10-05T09:00:00Z", "type": "item"},
        {"content": "sha256:" + "a" * 64, "parent": "sha256:" + "b" * 64, "ts": "2026-10-05T09:00:00Z", "type": "x:y"},
        {"content": "sha256:" + "a" * 64, "parent": None, "parents": [{"entry": "sha256:" + "c" * 64}], "ts": "t", "type": "item"},
        {"content": "sha256:" + "a" * 64, "parent": None, "parents": [], "ts": "t", "type": "item"},
        {"content": "sha256:" + "A" * 64, "parent": None, "ts": "t", "type": "item"},
        {"content": "sha256:" + "a" * 64, "parent": "sha256:b", "ts": "t", "type": "item"},
        {"content": "sha256:" + "a" * 64, "parent": None, "ts": 5, "type": "item"},
        {"content": "sha256:" + "a" * 64, "parent": None, "ts": "t"},
        {"content": "sha256:" + "a" * 64, "parent": None, "ts": "t", "type": "item", "extra": 1},
        ["not", "an", "object"],
    ],
)
def test_checked_envelope_says_what_envelope_defect_says(env):
    """The common form is taken as an envelope by its match alone: for every object, the
    verdict is the rule's (envelope_defect) on the parsed object."""
    from agentsession_cas.format.canonical import loads
    from agentsession_cas.format.hashing import checked_envelope, envelope_defect

    data = _cb(env)
    parsed, _, why = checked_envelope(data)
    assert parsed == loads(data)
    assert why == envelope_defect(loads(data))


def test_common_envelopes_read_a_chunk_as_read_envelope_reads_each():
    """Envelopes read by one match over a chunk give what read_envelope gives each one of
    the common form, and nothing when any one is of another form (parents, a member out
    of the form, a line break or a byte outside ASCII: bytes no store writes, which the
    caller then reads one by one)."""
    from agentsession_cas.format.hashing import common_envelopes, read_envelope

    h = "sha256:" + "a" * 64
    common = [
        _cb({"content": h, "parent": None, "ts": "2026-10-05T09:00:00Z", "type": "item"}),
        _cb({"content": "sha256:" + "c" * 64, "parent": "sha256:" + "b" * 64, "ts": "2026-10-05T09:00:00.5Z", "type": "x:y"}),
    ]
    got = common_envelopes(common)
    assert got is not None and len(got) == len(common)
    for data, (content, parent, ts, type_) in zip(common, got):
        env, _, why, _ = read_envelope(data)
        assert why is None and env == {"content": content, "parent": parent or None, "ts": ts, "type": type_}
    others = [
        _cb({"content": h, "parent": None, "parents": [{"entry": "sha256:" + "c" * 64}], "ts": "t", "type": "item"}),
        _cb({"content": h, "parent": None, "ts": "t", "type": "it\u00e9m"}),
        _cb({"content": h, "parent": None, "ts": "t", "type": "item", "extra": 1}),
        common[0] + b"\n" + common[1],  # two envelopes' lines in one object
        common[0][:-1] + b" }",
        b"x" + common[0],
    ]
    for other in others:
        assert common_envelopes([common[0], other, common[1]]) is None, other
    assert common_envelopes([]) is None


# -- the item's bytes, a piece of the content's ------------------------------------------

_JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**53) + 1, 2**53 - 1), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
_JSON = st.recursive(_JSON_LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)
# Member names around "item": ones sorting before it (the assembly is not used), after it,
# non-ASCII, and names that merely start with it.
_NAMES = st.sampled_from(["from_link", "response", "items", "item2", "a:x", "z:y", "\u00e9t\u00e9", "\U0001f600", "itel"])


@settings(max_examples=300, deadline=None)
@given(item=st.dictionaries(st.text(max_size=6), _JSON, max_size=4), others=st.dictionaries(_NAMES, _JSON, max_size=3))
def test_content_assembled_around_the_item_is_the_canonical_form(item, others):
    """entry_objects_item assembles the content from the item's bytes when the other
    member names allow: byte for byte what rfc8785 gives for the whole body, and the
    item's bytes are rfc8785's of the item."""
    entry = {"type": "item", "parent": None, "ts": "2026-01-01T00:00:00Z", "item": item, **others}
    entry_id, chash, content, env, item_bytes = entry_objects_item(entry)
    assert content == rfc8785.dumps(body_of(entry))
    assert (entry_id, chash, content, env) == entry_objects(entry)
    assert chash == "sha256:" + hashlib.sha256(content).hexdigest()
    if item_bytes is not None:
        assert item_bytes == rfc8785.dumps(item)
    if all(k > "item" and k.isascii() for k in others):
        assert item_bytes is not None, "the common shape takes the assembled path"


@settings(max_examples=300, deadline=None)
@given(item=st.dictionaries(st.text(max_size=6), _JSON, max_size=4), others=st.dictionaries(_NAMES, _JSON, max_size=3),
       stated=st.booleans())
def test_item_bytes_cut_from_a_proven_line_are_the_encoded_ones(item, others, stated):
    """Given the line its object was parsed from, proven canonical, entry_objects_item makes
    the content of the line's members and cuts the item's bytes from it: the same objects
    as encoding them, and the item's canonical bytes (also where other member names keep
    the encoding path from assembling the content around them)."""
    from agentsession_cas.format.canonical import loads_canonical

    entry = {"type": "item", "parent": None, "ts": "2026-01-01T00:00:00Z", "item": item, **others}
    if stated:
        entry["id"] = entry_objects(entry)[0]
    try:
        raw = rfc8785.dumps(entry)
    except Exception:
        return  # a value rfc8785 does not take (a lone surrogate)
    obj, careful, proven = loads_canonical(raw)
    line = raw if proven else None
    *objects, item_bytes = entry_objects_item(obj, parsed=True, careful=careful, line=line)
    *encoded, encoded_item = entry_objects_item(entry)
    assert objects == encoded
    assert item_bytes == (rfc8785.dumps(item) if proven else encoded_item)
    if not proven:
        return
    for other in ({**entry, "item": [1, item]}, {k: v for k, v in entry.items() if k != "item"}):  # no item object
        raw = rfc8785.dumps(other)
        obj, careful, proven = loads_canonical(raw)
        assert proven
        assert entry_objects_item(obj, parsed=True, careful=careful, line=raw) == entry_objects_item(other)


@settings(max_examples=300, deadline=None)
@given(item=st.dictionaries(st.sampled_from(["response", "type"]) | st.text(max_size=4), _JSON, max_size=4),
       response=_JSON | st.dictionaries(st.just("response"), _JSON, max_size=2))
def test_line_members_cut_the_item_of_an_item_entry_and_its_response(item, response):
    """The members of a stored item entry with its response, read by line_members: the
    item's bytes it cuts are the item's canonical bytes, whatever the item and the response
    hold (members named ``response`` in either), and the members are the line's."""
    from agentsession_cas.format import hashing
    from agentsession_cas.format.canonical import loads
    from agentsession_cas.format.hashing import line_from_objects, line_members

    try:
        content = rfc8785.dumps({"item": item, "response": response})
    except Exception:
        return  # a value rfc8785 does not take (a lone surrogate)
    entry_id, env = "sha256:" + "d" * 64, {"parent": None, "ts": "2026-01-01T00:00:00Z", "type": "item"}
    data, _, item_bytes = line_members(entry_id, env, content)
    assert data == loads(line_from_objects(entry_id, env, content))
    assert item_bytes is None or item_bytes == rfc8785.dumps(item)
    if isinstance(response, str) and hashing._parse_stored(content)[1] is None:  # proved compact: cut
        assert item_bytes is not None


def test_item_bytes_absent_without_an_item_object():
    for entry in (
        {"type": "label", "parent": None, "ts": "2026-01-01T00:00:00Z", "target": None, "label": "x"},
        {"type": "item", "parent": None, "ts": "2026-01-01T00:00:00Z", "item": [1, 2]},
    ):
        *_, item_bytes = entry_objects_item(entry)
        assert item_bytes is None


# ---------------------------------------------------------------------------
# an entry's line from its two objects, by splicing (export and show stream with it)

_PARENTS = st.one_of(st.none(), st.just([]), st.lists(
    st.fixed_dictionaries({"entry": st.just("sha256:" + "c" * 64)}, optional={"session": st.text(max_size=4)}),
    min_size=1, max_size=2))


def _line_of(entry: dict) -> tuple[bytes, bytes]:
    """(line_from_objects of the entry's stored objects, rfc8785's line of the entry with its id),
    the line made each way it can be (from the parsed envelope; from the envelope's bytes,
    alone and in a batch) and all three asserted equal."""
    from agentsession_cas.format.hashing import line_from_objects, line_size, lines_from_objects, read_envelope

    entry_id, _, content, env_bytes = entry_objects(entry)
    env, _, why, members = read_envelope(env_bytes)
    assert why is None
    expected = rfc8785.dumps({**{k: v for k, v in entry.items() if k != "parents" or v}, "id": entry_id}) + b"\n"
    got = line_from_objects(entry_id, env, content)
    assert line_from_objects(entry_id, env, content, members) == got
    assert lines_from_objects([(entry_id, env, content, members)] * 3) == [got] * 3
    if members is not None:  # its length from the objects' sizes, as stats sums it
        assert line_size(entry_id, len(content), members) == len(got)
    return got, expected


@settings(max_examples=400, deadline=None)
@given(
    item=st.one_of(st.dictionaries(st.text(max_size=6), _JSON, max_size=4), _JSON),
    others=st.dictionaries(_NAMES, _JSON, max_size=3),
    with_item=st.booleans(),
    parent=st.sampled_from([None, "sha256:" + "a" * 64]),
    parents=_PARENTS,
    ts=st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01T00:00:00.5Z", "2026-01-01T00:00:00.123456789Z"]),
    type_=st.sampled_from(["item", "response", "ns:x"]),
)
def test_line_from_objects_is_the_canonical_line(item, others, with_item, parent, parents, ts, type_):
    """Whatever the body (an item object or not, names before and after it, non-ASCII
    and astral names, floats and big numbers) and the envelope (parents or not), the
    spliced line is byte for byte rfc8785's of the whole entry with its id."""
    entry = {"type": type_, "parent": parent, "ts": ts, **others}
    if with_item:
        entry["item"] = item
    if parents is not None:
        entry["parents"] = parents
    got, expected = _line_of(entry)
    assert got == expected


def test_line_from_objects_splices_the_common_shapes():
    """The common item entry takes the written-out splice, an item with other members
    around it the general one; neither falls back to encoding the whole body."""
    from agentsession_cas.format import hashing

    calls = []
    original = hashing.canonical_bytes

    def spy(value, **kw):
        calls.append(value)
        return original(value, **kw)

    big = {"type": "function_call_output", "call_id": "c1", "output": "x" * 5000}
    shapes = [
        {"type": "item", "parent": None, "ts": "2026-01-01T00:00:00Z", "item": big},
        {"type": "item", "parent": "sha256:" + "a" * 64, "ts": "2026-01-01T00:00:00.5Z", "item": big, "response": "r1"},
        {"type": "item", "parent": None, "ts": "2026-01-01T00:00:00Z", "item": big, "attempt": 2, "zeta": [1.5]},
    ]
    for entry in shapes:
        entry_id, _, content, env_bytes = entry_objects(entry)
        env, _ = hashing.parse_envelope(env_bytes)
        calls.clear()
        hashing.canonical_bytes = spy
        try:
            got = hashing.line_from_objects(entry_id, env, content)
        finally:
            hashing.canonical_bytes = original
        assert got == _line_of(entry)[1]
        assert all("item" not in value for value in calls), "the item was encoded again"


def test_line_from_objects_over_the_corpus():
    """Every entry of the reference corpus's good files: its stored objects give back its line."""
    from agentsession_cas.format.entry import Entry
    from agentsession_cas.format.hashing import line_from_objects, parse_envelope

    for name in GOOD:
        for raw, obj in corpus_entries(name):
            entry_id, _, content, env_bytes = entry_objects(obj)
            env, _ = parse_envelope(env_bytes)
            entry = Entry.from_dict(obj)
            assert line_from_objects(entry_id, env, content) == entry.canonical_line() == raw + b"\n", (name, entry_id)


def test_lines_from_bytes_cut_the_content_where_its_names_say():
    """The line made of the objects' bytes puts ``id``, ``parent``, ``ts`` and ``type``
    among the content's members by name (before, between and after them), and where a
    name it cuts at occurs twice (a nested member of that name) or is not plain it
    encodes around the parse instead: the same line every way."""
    nested = {"type": "message", "ts": "x", "parent": "y", "content": [{"type": "t", "id": "z"}]}
    bodies = [
        {"item": nested},
        {"item": nested, "response": "r1"},
        {"error": None, "incomplete": None, "model": "m", "request_hash": "sha256:" + "b" * 64, "status": "ok",
         "usage": {"input_tokens": 3, "ts": 1}},
        {"aa": 1, "zz": {"type": [1]}},  # a name cut at ("zz") holds a nested "type": found once all the same
        {"a": {"ts": 1}, "ts2": {"b": 1, "ts2": 1}},  # ",\"ts2\":" occurs twice: no cut by search
        {"a": 1, "p-q": 2},  # a name cut at that is not plain
        {},
        {"item": "\u2028 \\\" \U0001f600 \u00e9"},
    ]
    from agentsession_cas.format import hashing

    for i, body in enumerate(bodies):
        for parent in (None, "sha256:" + "a" * 64):
            entry = {"type": "ns:x", "parent": parent, "ts": "2026-01-01T00:00:00Z", **body}
            got, expected = _line_of(entry)
            assert got == expected, body
            # the first four and the last two are made of bytes; the two between are encoded
            entry_id, _, content, env_bytes = entry_objects(entry)
            cut = hashing._line_of_bytes(entry_id, content, hashing.read_envelope(env_bytes)[3], hashing._UNPARSED)
            assert (cut is None) == (i in (4, 5)), body


def _names_by_json(text: bytes):
    """The slow path's answer: the top-level names ``json.loads`` finds, None for no object or no JSON."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return tuple(value) if isinstance(value, dict) else None


#: Texts json.loads admits and orjson does not, or that are no JSON, no object, or not one value.
_ODD_TEXTS = [b'{"a":"\\ud800"}', b'{"a":NaN}', b'{"big":123456789012345678901234567890,"z":1}', b'{"a":1,"a":2,"b":3}',
              b'{"a":1e400}', b"[1]", b'"s"', b"{", b"", b'{"a":1},{"b":2}', b'{"\xff":1}', b'\xef\xbb\xbf{"a":1}',
              b' {"b": [1, {"c": 2}] , "a" : null} ', b'{"x":"\xed\xa0\x80"}', b'{"a":[{}', b'{}]}', b"{}"]


@settings(max_examples=400, deadline=None)
@given(body=st.dictionaries(st.text(max_size=6) | _NAMES, _JSON, max_size=5), cut=st.integers(0, 400),
       byte=st.integers(0, 255), odd=st.lists(st.sampled_from(_ODD_TEXTS), max_size=3))
def test_content_names_agree_with_json_loads(body, cut, byte, odd):
    """The names a line is cut by (orjson's parse, json.loads's where orjson refuses) are
    json.loads's, one by one and in a batch: for a canonical body, the same body with a
    byte changed (a damaged content: no JSON, or other JSON), and texts only json.loads
    admits; a batch holding a text that is not one value leaves every text to its own parse."""
    from agentsession_cas.format import hashing

    canonical = rfc8785.dumps(body)
    assert hashing._names(canonical) == _names_by_json(canonical) == tuple(sorted(body, key=lambda k: k.encode("utf-16-be")))
    changed = bytearray(canonical)
    changed[cut % len(changed)] = byte
    texts = [canonical, bytes(changed), *odd]
    for text in texts:
        assert hashing._names(text) == _names_by_json(text), text
    batch = hashing._names_each(texts)
    if hashing._UNPARSED in batch:  # each text then takes its own parse (asserted above)
        assert batch == [hashing._UNPARSED] * len(texts)
        assert not all(_is_json(text) for text in texts)
    else:
        assert batch == [_names_by_json(text) for text in texts]


def _strict(text: bytes):
    """loads_flagged's answer, or the class of what it raises."""
    try:
        return loads_flagged(text)
    except Exception as exc:  # the class is the answer compared
        return type(exc)


@settings(max_examples=400, deadline=None)
@given(body=st.dictionaries(st.text(max_size=6) | _NAMES, _JSON | st.integers(-(2**53) + 1, 2**53 - 1), max_size=5), cut=st.integers(0, 400),
       byte=st.integers(0, 255), odd=st.sampled_from(_ODD_TEXTS + [b'{"n":1e+21}', b'{"n":1.0}', b'{"n":100000000000000000000}',
                                                                    b'{"b":1,"a":2}', b'{"a":' + b"[" * 300 + b"]" * 300 + b"}"]))
def test_stored_content_parse_is_the_strict_parse(body, cut, byte, odd):
    """A stored content's parse (orjson's, proved by encoding it again) gives the strict
    parse's value (the same members, numbers of the same type and value), its flag or
    None, and raises as it raises: for canonical bodies (big integers and floats among
    them), the same with a byte changed, and texts orjson reads otherwise or refuses."""
    from agentsession_cas.format import hashing

    changed = bytearray(rfc8785.dumps(body))
    changed[cut % len(changed)] = byte
    for text in (rfc8785.dumps(body), bytes(changed), odd):
        expected = _strict(text)
        try:
            got = hashing._parse_stored(text)
        except Exception as exc:
            assert expected is type(exc), text
            continue
        assert not isinstance(expected, type), text
        assert got[1] in (expected[1], None) and repr(got[0]) == repr(expected[0]), text
        assert json.dumps(got[0]) == json.dumps(expected[0]), text  # ints stay ints, floats floats


def _is_json(text: bytes) -> bool:
    """Whether the text is one JSON value, alone and as an array's element (no byte order mark)."""
    try:
        json.loads(text)
        json.loads(b"[" + text + b"]")
    except ValueError:
        return False
    return True


def test_lines_from_objects_parse_a_batch_no_content_can_split():
    """A batch is parsed as one array joined by a separator drawn at random: a content
    that is two values (``1,2``), or two that open and close one value between them,
    cannot shift the others' parses; the batch is then taken one by one, and a content
    that is no JSON object is refused as one would be alone."""
    from agentsession_cas.format import hashing

    good = {"type": "item", "parent": None, "ts": "2026-01-01T00:00:00Z", "item": {"a": [1, {"b": "c"}]}}
    entry_id, _, content, env_bytes = entry_objects(good)
    env, _, _, members = hashing.read_envelope(env_bytes)
    line = hashing.line_from_objects(entry_id, env, content)
    assert hashing._names_each([content, b'{"a":1},{"b":2}', content]) == [hashing._UNPARSED] * 3
    assert hashing._names_each([content, b'{"a":[{}', b'{}]}', content]) == [hashing._UNPARSED] * 4
    assert hashing._names_each([content, b'{"z":1}', b"[1]"]) == [tuple(json.loads(content)), ("z",), None]
    # a forged separator is only a string to the parse
    forged = b'{"x":1},"' + b"0" * 32 + b'",{"y":2}'
    assert hashing._names_each([content, forged]) == [hashing._UNPARSED] * 2
    assert hashing.lines_from_objects([(entry_id, env, content, members)] * 2) == [line, line]
    with pytest.raises(EntryError):
        hashing.lines_from_objects([(entry_id, env, content, members), (entry_id, env, b"[1]", members)])
    with pytest.raises(ValueError):
        hashing.lines_from_objects([(entry_id, env, content, members), (entry_id, env, b'{"a":1},{"b":2}', members)])


# ---------------------------------------------------------------------------
# a line as read: parsed strictly, its flag handed on (what verify and import do)

_SPELLED_NUMBERS = ["1e21", "1E2", "-0", "1.0", "-0.0", "5e-7", "123456789012345678", "0.1", "2.5E+3"]


def _spelled(value, rnd) -> str:
    """``value`` as some other writer may spell it: members in another order, spaces,
    characters escaped or not."""
    if isinstance(value, dict):
        keys = list(value)
        rnd.shuffle(keys)
        sep = rnd.choice([":", ": ", " : "])
        return "{" + rnd.choice([",", ", "]).join(json.dumps(k, ensure_ascii=rnd.random() < 0.5) + sep + _spelled(value[k], rnd) for k in keys) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_spelled(v, rnd) for v in value) + "]"
    return json.dumps(value, ensure_ascii=rnd.random() < 0.5)


@settings(max_examples=300, deadline=None)
@given(
    item=st.dictionaries(st.text(max_size=6), _JSON, max_size=4),
    others=st.dictionaries(_NAMES, _JSON, max_size=3),
    number=st.sampled_from(_SPELLED_NUMBERS),
    seed=st.integers(0, 2**16),
)
def test_a_parsed_line_hashes_as_its_value_however_spelled(item, others, number, seed):
    """The objects of a line parsed strictly and hashed with the parse's flag (the reader's
    path: parsed=True, careful as loads_flagged says) are rfc8785's of the body, whatever
    the line's spelling: members reordered, spaces, escapes, numbers such as 1e21, 1E2,
    -0 or 1.0; a lone surrogate is refused by both."""
    import random

    entry = {"type": "item", "parent": None, "ts": "2026-01-01T00:00:00Z", "item": item, **others}
    line = _spelled(entry, random.Random(seed))
    line = line[:-1] + ',"n":' + number + "}"  # a number as written, not as Python would
    try:
        obj, careful = loads_flagged(line)
    except IJSONError:
        return  # refused at the parse (a whole number a double does not hold): nothing to hash
    try:
        expected = rfc8785.dumps(body_of(obj))
    except Exception:  # a lone surrogate: ours must refuse it too
        with pytest.raises(IJSONError):
            entry_objects_item(obj, parsed=True, careful=careful)
        return
    entry_id, chash, content, env, item_bytes = entry_objects_item(obj, parsed=True, careful=careful)
    assert content == expected
    assert chash == "sha256:" + hashlib.sha256(content).hexdigest()
    assert env == rfc8785.dumps(envelope_object("item", None, None, "2026-01-01T00:00:00Z", chash))
    assert (entry_id, chash) == entry_hashes(obj)
    if item_bytes is not None:
        assert item_bytes == rfc8785.dumps(obj["item"])


@pytest.mark.parametrize("value", [object(), {"k": object()}, b"bytes"])
def test_what_no_encoder_renders_is_refused_as_the_careful_path_refuses_it(value):
    """canonical_bytes given careful=False (the fast encoders' path) for what is no JSON
    says what is wrong as the reference serialiser does (an IJSONError), never writes it."""
    from agentsession_cas.format.canonical import canonical_bytes

    with pytest.raises(IJSONError) as fast:
        canonical_bytes({"v": value}, parsed=True, careful=False)
    with pytest.raises(IJSONError) as careful:
        canonical_bytes({"v": value}, parsed=True, careful=True)
    assert str(fast.value) == str(careful.value)


@pytest.mark.parametrize("where", ['"item":{"text":"a\\ud800b"}', '"item":{"\\udc00":1}', '"item":{},"note":"\\ud83d"'])
def test_a_parsed_line_with_a_lone_surrogate_is_refused(where):
    obj, careful = loads_flagged('{"type":"item","parent":null,"ts":"2026-01-01T00:00:00Z",' + where + "}")
    with pytest.raises(IJSONError, match="lone surrogate"):
        entry_objects_item(obj, parsed=True, careful=careful)


@pytest.mark.parametrize("type_, parent, ts", [
    ("item", None, "2026-01-01T00:00:00Z"),
    ("ns:type", "sha256:" + "a" * 64, "2026-01-01T00:00:00.5Z"),
    ("tab\there \"quoted\" back\\slash", "not a hash", "\x00\x1f\x7f"),
    ("café 日本語 🙂", "naïve", "ünï"),
])
def test_envelope_bytes_of_the_common_form_are_rfc8785s(type_, parent, ts):
    """The common form (no parents, a string ts) is written straight: the bytes RFC 8785
    gives the envelope object, whatever its strings hold (escapes, controls, non-ASCII)."""
    from agentsession_cas.format.hashing import envelope_bytes, envelope_object

    content = "sha256:" + "c" * 64
    assert envelope_bytes(type_, parent, None, ts, content) == rfc8785.dumps(envelope_object(type_, parent, None, ts, content))


_HASHLIKE = st.one_of(
    st.builds(lambda b: "sha256:" + hashlib.sha256(b).hexdigest(), st.binary(max_size=8)),
    # one character changed, added or taken out of a hash: a near miss of every kind
    st.builds(lambda b, at, c: (lambda h: h[:at % 72] + c + h[at % 72 + 1:])("sha256:" + hashlib.sha256(b).hexdigest()),
              st.binary(max_size=8), st.integers(0, 80), st.sampled_from(["", "A", "g", "0", "f", ":", "\n", "é", "ss"])),
    st.text(max_size=80),
)


@given(st.lists(_HASHLIKE, max_size=6))
@settings(max_examples=400, deadline=None)
def test_all_hashes_is_is_hash_of_each(names):
    """The bulk test over many names answers as is_hash of each one would."""
    assert all_hashes(names) == all(is_hash(n) for n in names)


def test_all_hashes_finds_one_character_changed_anywhere():
    """Each character of a hash among others changed for a hex digit, an upper-case one, a
    letter past ``f``, or the prefix's own characters: every such name is refused, and
    only those still hashes pass."""
    good = [sha256_ref(bytes([i])) for i in range(3)]
    for at in range(71):
        for char in "0fAg:s\n":
            changed = good[1][:at] + char + good[1][at + 1:]
            assert all_hashes([good[0], changed, good[2]]) == is_hash(changed), (at, char)
    assert all_hashes(good) and all_hashes([]) and not all_hashes([good[0] + "0"]) and not all_hashes(["", good[0]])
