"""RFC 0001 conformance probes of the format core, section by section.

Each test names the RFC 0001 rule it probes. Where the library could share code
with what it is checked against, the check is written again here from the RFC's
text (canonical JSON by the ``rfc8785`` package, hashes by ``hashlib``, the
resume rule and the context algorithm by small oracles below), so a probe does
not pass by agreeing with itself.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentsession_cas import Header, entry_hashes, read_session_bytes
from agentsession_cas.errors import IJSONError, NormalisationError
from agentsession_cas.format.canonical import canonical_bytes, loads
from agentsession_cas.format.context import context_at
from agentsession_cas.format.normalise import normalise, normalise_json
from agentsession_cas.format.reader import split_lines, verify_bytes
from agentsession_cas.format.rules import verify_requests
from agentsession_cas.format.timestamps import is_valid_ts, normalise_ts

SID = "0199c000-0000-7000-8000-0000000000f1"
ENVELOPE = ("id", "type", "parent", "parents", "ts")


def ts(n: int) -> str:
    return f"2026-10-05T10:{n // 60 % 60:02d}:{n % 60:02d}Z"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def jcs(value: Any) -> bytes:
    """RFC 8785 by the ``rfc8785`` package; a whole number beyond 2**53 the whole-number
    rule admits is the double it rounds to (the package refuses integers from 2**53)."""
    return rfc8785.dumps(_doubles(value))


def _doubles(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int) and abs(v) >= 2**53:
        return float(v)
    if isinstance(v, dict):
        return {k: _doubles(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_doubles(x) for x in v]
    return v


def ref_hashes(entry: dict[str, Any]) -> tuple[str, str]:
    """RFC 0001 "Entry hash", from its text: (id, content hash)."""
    body = {k: v for k, v in entry.items() if k not in ENVELOPE}
    content = sha(jcs(body))
    env: dict[str, Any] = {"type": entry["type"], "parent": entry.get("parent"), "ts": entry["ts"], "content": content}
    if entry.get("parents"):
        env["parents"] = entry["parents"]
    return sha(jcs(env)), content


def header_line(**extra: Any) -> bytes:
    return Header.new(SID, created_at=ts(0), **extra).canonical_line()


def codes(data: bytes) -> list[tuple[str, int | None]]:
    return [(p.code, p.line) for p in read_session_bytes(data, source="t.jsonl").all_problems()]


def lines_of(objs: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(o, ensure_ascii=False).encode() + b"\n" for o in objs)


def rehash(obj: dict[str, Any]) -> dict[str, Any]:
    obj = {k: v for k, v in obj.items() if k != "id"}
    obj["id"] = ref_hashes(obj)[0]
    return obj


def item(text: str, role: str = "user") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def straight(n: int = 3) -> list[dict[str, Any]]:
    """A config and ``n - 1`` items, as plain objects with their ids."""
    out: list[dict[str, Any]] = []
    parent = None
    for i in range(n):
        obj: dict[str, Any] = {"type": "config", "model": "m"} if i == 0 else {"type": "item", "item": item(f"m{i}")}
        obj.update(parent=parent, ts=ts(i))
        obj = rehash(obj)
        out.append(obj)
        parent = obj["id"]
    return out


# ---------------------------------------------------------------------------
# Entry hash: canonical JSON (RFC 8785) and the I-JSON test


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("-0", b"0"),
        ("-0.0", b"0"),
        ("1e21", b"1e+21"),
        ("1E21", b"1e+21"),
        ("1e20", b"100000000000000000000"),
        ("5e-324", b"5e-324"),
        ("4.9e-324", b"5e-324"),
        ("1e-400", b"0"),  # rounds to zero: finite, the rounding expected
        ("1e-7", b"1e-7"),
        ("0.000001", b"0.000001"),
        ("1.0", b"1"),
        ("0.1", b"0.1"),
        ("1e23", b"1e+23"),  # not exact, but the canonical rendering of its double
        ("1.5e300", b"1.5e+300"),
        ("9007199254740992", b"9007199254740992"),
        ("1152921504606847000", b"1152921504606847000"),  # 2**60's canonical rendering
        ("1152921504606846976", b"1152921504606847000"),  # 2**60 itself
        ("18446744073709551616", b"18446744073709552000"),
    ],
)
def test_numbers_render_as_rfc8785_and_pass_the_rule(text, expected):
    """RFC 0001 Entry hash: numbers in canonical form; the whole-number rule's admitted cases."""
    assert canonical_bytes(loads(text)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "9007199254740993",
        "-9007199254740993",
        "9007199254740993.0",
        "9.007199254740993e15",
        "90071992547409930e-1",
        "100000000000000000000001",
        "1.50000000000000001e300",  # whole, and not the rendering of its double
        "123456789012345678901234567890",
        "1e400",
        "-1e400",
        "1" + "0" * 5000,
    ],
)
def test_numbers_the_rule_rejects(text):
    """RFC 0001 Entry hash: 9007199254740993 "however it is spelled", and the non-finite."""
    with pytest.raises(IJSONError):
        canonical_bytes(loads(f'{{"n":{text}}}'))


@pytest.mark.parametrize(
    "text",
    ['{"a":1,"a":2}', '{"a":1,"\\u0061":2}', '{"x":[{"b":1,"b":1}]}', '{"\\ud83d\\ude00":1,"😀":2}'],
)
def test_repeated_member_names_are_refused_however_spelled(text):
    """RFC 0001 Entry hash: no object repeats a member name (by value, escapes decoded)."""
    with pytest.raises(IJSONError):
        loads(text)


@pytest.mark.parametrize("text", ['"\\ud83d"', '"a\\udc00b"', '{"\\ud800":1}', '["\\ude00\\ud83d"]'])
def test_lone_surrogates_are_refused_when_hashed(text):
    """RFC 0001 Entry hash: no string holds a lone surrogate (escaped ones included)."""
    with pytest.raises(IJSONError):
        canonical_bytes(loads(text))


def test_member_names_sort_by_utf16_code_units():
    """RFC 0001 Entry hash: members sorted by UTF-16 code units, which code-point order
    does not give for a name holding a supplementary character."""
    value = {"\uffff": 1, "\U0001f600": 2, "\ue000": 3, "a": 4}
    assert canonical_bytes(value) == jcs(value)
    assert canonical_bytes(value).decode().index("\U0001f600") < canonical_bytes(value).decode().index("\ue000")


_KEYS = st.one_of(
    st.text(max_size=5),
    st.sampled_from(["item", "a", "zz", "iten", "itel", "\U0001f600", "\uffff", "\ue000", "é", "Item", "\x7f", "\u2028"]),
)
_NUMS = st.one_of(
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([2**60, 10**21, 10**20, -(2**63), 1152921504606847000, 5e-324, -0.0]),
)
_LEAF = st.one_of(st.none(), st.booleans(), _NUMS, st.text(max_size=8))
_VALUES = st.recursive(_LEAF, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(_KEYS, c, max_size=4)), max_leaves=15)
_BODY = st.dictionaries(_KEYS.filter(lambda k: k not in (*ENVELOPE, "content")), _VALUES, max_size=5)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(_BODY, st.dictionaries(_KEYS, _VALUES, max_size=4), st.sampled_from(["canonical", "unicode", "ascii", "spaced"]))
def test_a_line_hashes_as_rfc8785_says_however_it_is_spelled(body, it, spelling):
    """RFC 0001 Entry hash: a reader computes both hashes from the line's own members in
    canonical form, whatever bytes the line carries; and writes the entry back as the
    canonical form of the same members (preservation is of members, not bytes)."""
    entry = {"type": "item", "parent": None, "ts": ts(1), **body, "item": it}
    entry["id"], content = ref_hashes(entry)
    if spelling == "canonical":
        line = jcs(entry)
    elif spelling == "unicode":
        line = json.dumps(entry, ensure_ascii=False).encode()
    elif spelling == "ascii":
        line = json.dumps(entry).encode()
    else:
        line = json.dumps(entry, separators=(" , ", " : ")).encode()
    sf = read_session_bytes(header_line() + line + b"\n", source="t.jsonl")
    assert sf.all_problems() == []
    (e,) = sf.entries
    assert (e.id, e.content_hash) == (entry["id"], content)
    assert e.canonical_line() == jcs(entry) + b"\n"


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_VALUES)
def test_parse_of_serialise_is_the_value(value):
    """parse(serialise(x)) == x, and serialising again gives the same bytes."""
    data = canonical_bytes(value)
    assert canonical_bytes(loads(data)) == data
    assert data == jcs(value)


# ---------------------------------------------------------------------------
# Entry hash: a writer normalises what the test rejects, and refuses what it cannot


@pytest.mark.parametrize("digits", ["1" + "0" * 5000, "-1" + "0" * 5000, "1" + "0" * 400])
def test_normalise_json_refuses_a_huge_whole_number_as_not_finite(digits):
    """RFC 0001 Entry hash: "a number that is not finite in binary64 ... a writer MUST NOT
    write: it refuses the entry", with the library's refusal (NormalisationError), not
    the interpreter's limit on converting long digit strings (a bare ValueError)."""
    with pytest.raises(NormalisationError, match="not finite"):
        normalise_json(b'{"n":' + digits.encode() + b"}")


def test_normalise_refuses_a_huge_whole_number_held_decoded():
    """The same for a body a writer holds decoded: an int beyond binary64 is refused."""
    with pytest.raises(NormalisationError, match="not finite"):
        normalise({"n": 10**5000})
    with pytest.raises(NormalisationError, match="not finite"):
        normalise({"n": [-(10**400)]})


def test_normalise_rounds_a_whole_number_and_records_its_digits():
    """RFC 0001 Entry hash: rounded to binary64 and written canonically, `was` its digits."""
    value, found = normalise_json(b'{"n":9007199254740993,"s":"\\ud83d"}')
    assert canonical_bytes(value) == b'{"n":9007199254740992,"s":"\xef\xbf\xbd"}'
    assert found == [{"at": "/n", "was": "9007199254740993"}, {"at": "/s", "was": '"\\ud83d"'}]


def test_normalise_substitutes_one_replacement_per_maximal_subpart():
    """RFC 0001 Entry hash: each maximal subpart of an ill-formed UTF-8 sequence becomes one
    U+FFFD (Unicode 3.9's table 3-8 example), `raw` the source bytes in padded base64."""
    raw = b'"a\xf1\x80\x80\xe1\x80\xc2b\x80c\x80\xbfd"'
    value, found = normalise_json(b'{"t":' + raw + b"}")
    assert value == {"t": "a\ufffd\ufffd\ufffdb\ufffdc\ufffd\ufffdd"}
    assert found == [{"at": "/t", "raw": base64.b64encode(raw).decode()}]


# ---------------------------------------------------------------------------
# Entry envelope: ts


@pytest.mark.parametrize(
    "value",
    [
        "2026-09-17T12:00:02.5Z",
        "2026-09-17T12:00:00Z",
        "2026-09-17T12:00:00.123456789Z",
        "2026-09-17T12:00:00.000000001Z",
        "2024-02-29T23:59:59Z",
    ],
)
def test_ts_admitted(value):
    """RFC 0001 Entry envelope: the one spelling of ts."""
    assert is_valid_ts(value)


@pytest.mark.parametrize(
    "value",
    [
        "2026-09-17T12:00:02.50Z",  # trailing zero
        "2026-09-17T12:00:00.0Z",  # a zero fraction
        "2026-09-17T12:00:00.Z",
        "2026-09-17T12:00:00.1234567891Z",  # ten digits
        "2026-09-17T12:00:60Z",  # a leap second
        "2026-09-17T12:00:00+00:00",  # an offset
        "2026-09-17T13:00:00+01:00",
        "2026-09-17t12:00:00z",
        "2026-09-17 12:00:00Z",
        "2026-02-29T12:00:00Z",
        "2026-09-17T24:00:00Z",
        "２０２６-09-17T12:00:00Z",
        "2026-09-17T12:00:00Z\n",
    ],
)
def test_ts_other_spellings_are_reported_as_a_hash_failure_is(value):
    """RFC 0001 Entry envelope: "A reader MUST report any other spelling as it reports a
    hash that fails" (the line is reported, with the ts code)."""
    assert not is_valid_ts(value)
    objs = straight(2)
    objs[1] = rehash({**objs[1], "ts": value})
    assert ("ts", 3) in codes(header_line() + lines_of(objs))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-09-17T13:00:00+01:00", "2026-09-17T12:00:00Z"),
        ("2026-09-17T12:00:00.1234567891Z", "2026-09-17T12:00:00.123456789Z"),
        ("2016-12-31T23:59:60.5Z", "2016-12-31T23:59:59.5Z"),
        ("2017-01-01T00:59:60+01:00", "2016-12-31T23:59:59Z"),
        ("2026-09-17T12:00:00.000Z", "2026-09-17T12:00:00Z"),
        ("2026-09-17t12:00:00.10z", "2026-09-17T12:00:00.1Z"),
    ],
)
def test_ts_migrated_to_the_one_form(value, expected):
    """RFC 0001 Versioning: UTC with the instant unchanged, the fraction truncated to nine
    digits, a second 60 written as 59 with the same fraction."""
    assert normalise_ts(value) == expected


# ---------------------------------------------------------------------------
# File: lines


def test_crlf_line_endings_read_as_lf():
    """RFC 0001 File: lines terminated by LF; a CR before it is JSON whitespace, and both
    hashes are over the canonical form, so the entries verify and the leaf is the same."""
    data = header_line() + lines_of(straight(3))
    sf = read_session_bytes(data.replace(b"\n", b"\r\n"), source="t")
    assert sf.all_problems() == [] and sf.leaf == read_session_bytes(data, source="t").leaf


def test_a_final_line_without_newline_that_parses_is_an_entry():
    """RFC 0001 File: only a final line that does not parse is tolerated and reported."""
    objs = straight(3)
    sf = read_session_bytes((header_line() + lines_of(objs))[:-1], source="t")
    assert sf.all_problems() == [] and sf.leaf == objs[-1]["id"]


def test_a_final_line_cut_short_is_tolerated_and_reported():
    objs = straight(3)
    data = header_line() + lines_of(objs)
    sf = read_session_bytes(data[:-20], source="t")
    assert [(p.code, p.line) for p in sf.all_problems()] == [("truncated", 4)]
    assert sf.leaf == objs[1]["id"]


def test_an_empty_line_in_the_middle_is_reported():
    """RFC 0001 File: every later line MUST be an entry."""
    objs = straight(3)
    data = header_line() + lines_of(objs[:1]) + b"\n" + lines_of(objs[1:])
    assert codes(data) == [("json", 3)]


def test_a_bom_before_an_entry_is_reported():
    objs = straight(2)
    data = header_line() + b"\xef\xbb\xbf" + lines_of(objs)
    assert codes(data) == [("json", 2)]


def test_a_huge_line_verifies():
    objs = straight(1)
    big = rehash({"type": "item", "parent": objs[0]["id"], "ts": ts(1), "item": item("x" * (3 << 20))})
    data = header_line() + lines_of([*objs, big])
    assert codes(data) == []
    assert verify_bytes(data, source="t").ok


def test_a_parent_later_in_the_file_is_reported():
    """RFC 0001 Entry envelope: a parent MUST appear earlier in the file than any child."""
    objs = straight(3)
    data = header_line() + lines_of([objs[0], objs[2], objs[1]])
    assert codes(data) == [("parent", 3)]


def test_a_cycle_through_misstated_ids_ends():
    """Entries claiming ids that name each other as parent: reported, and a path ends."""
    objs = straight(2)
    x, y = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    a = {"type": "item", "id": x, "parent": y, "ts": ts(5), "item": item("a")}
    b = {"type": "item", "id": y, "parent": x, "ts": ts(6), "item": item("b")}
    sf = read_session_bytes(header_line() + lines_of([*objs, a, b]), source="t")
    assert [(p.code, p.line) for p in sf.all_problems()] == [("hash", 4), ("parent", 4), ("hash", 5)]
    assert [e.id for e in sf.tree.path(y)] == [x, y]


def test_a_repeated_id_is_the_same_entry_reported():
    """RFC 0001 Entry hash: a reader meeting an id a second time treats the line as that
    same entry and reports the repeat (respelled or not)."""
    objs = straight(3)
    respelled = json.dumps(objs[1], separators=(", ", ": ")).encode() + b"\n"
    sf = read_session_bytes(header_line() + lines_of(objs) + respelled, source="t")
    assert [(p.code, p.line) for p in sf.all_problems()] == [("duplicate", 5)]
    assert [e.id for e in sf.entries] == [o["id"] for o in objs]


@pytest.mark.parametrize(
    ("id_", "code"),
    [
        ("sha512:" + "0" * 64, "id"),
        ("SHA256:" + "0" * 64, "id"),
        ("sha256:" + "A" * 64, "id"),
        ("sha256:" + "0" * 63, "id"),
        ("sha256:" + "0" * 64, "hash"),
    ],
)
def test_an_id_of_another_form_is_refused(id_, code):
    """RFC 0001 Entry hash: `sha256:` is the only prefix, and a reader MUST refuse another."""
    objs = straight(2)
    objs[1]["id"] = id_
    assert codes(header_line() + lines_of(objs)) == [(code, 3)]


def test_a_body_carrying_content_is_reported():
    """RFC 0001 Entry hash: a body MUST NOT carry a top-level member by a reserved name."""
    objs = straight(2)
    objs[1]["content"] = "x"
    assert codes(header_line() + lines_of(objs)) == [("reserved", 3)]


def test_a_nested_content_member_is_fine():
    objs = straight(2)
    objs[1] = rehash({**objs[1], "meta": {"content": 1, "id": 2, "ts": 3}})
    assert codes(header_line() + lines_of(objs)) == []


def test_an_empty_parents_is_left_out_of_the_envelope():
    """RFC 0001 Entry hash: `parents` is in the envelope only when present and non-empty."""
    objs = straight(2)
    with_empty = {**objs[1], "parents": []}
    assert entry_hashes(with_empty)[0] == objs[1]["id"]


# ---------------------------------------------------------------------------
# Preservation and namespaced types


def test_unknown_members_at_every_depth_are_kept_and_hashed_as_given():
    """RFC 0001 Entry envelope: a member this document does not define is preserved by a
    rewriter and hashed as the line holds it, at every depth."""
    objs = straight(2)
    env = rehash({"type": "env", "parent": objs[1]["id"], "ts": ts(3), "cwd": "/w",
                  "workspace": {"kind": "container", "ref": "sha256:" + "a" * 64, "host": "h1", "x-inst": [1.5, None]},
                  "harness_note": {"\U0001f600": "kept"}})
    data = header_line() + lines_of([*objs, env])
    sf = read_session_bytes(data, source="t")
    assert sf.all_problems() == []
    assert json.loads(sf.entries[-1].canonical_line()) == env
    assert sf.canonical_bytes().split(b"\n")[3] == jcs(env)


@pytest.mark.parametrize("type_", ["acme:note", "a:b:c", "Acme.Corp:x-y"])
def test_extension_entries_are_kept_and_contribute_nothing(type_):
    """RFC 0001 Namespaced types: readers preserve extension entries, do not fail on them,
    and treat one they do not know as not in context."""
    objs = straight(3)
    ext = rehash({"type": type_, "parent": objs[-1]["id"], "ts": ts(4), "item": item("not sent"), "summary": item("no")})
    data = header_line() + lines_of([*objs, ext])
    sf = read_session_bytes(data, source="t")
    assert sf.all_problems() == [] and sf.leaf == ext["id"]
    assert context_at(sf, ext["id"]).request_hash() == context_at(sf, objs[-1]["id"]).request_hash()


def test_an_unknown_type_that_is_not_namespaced_is_reported():
    """RFC 0001 Conformance: the negative case "an unknown type"."""
    objs = straight(2)
    bad = rehash({"type": "note", "parent": objs[-1]["id"], "ts": ts(4)})
    assert codes(header_line() + lines_of([*objs, bad])) == [("type", 4)]


# ---------------------------------------------------------------------------
# File: the resume rule, against an oracle written from its sentence


def resume_oracle(objs: list[dict[str, Any]], base: str | None = None) -> str | None:
    """RFC 0001 File, read literally: the newest entry in file order that descends from
    the entry the last `leaf` label in force names and was written after that label, the
    label itself excepted; that entry itself when nothing follows it; the last entry of
    the file when no label is in force. A leaf so found that is itself a `leaf` label
    resolves to its nearest ancestor that is not one."""
    by_id = {o["id"]: o for o in objs}
    order = [o["id"] for o in objs]
    prefix: set[str] = set()
    if base is not None:
        for o in objs:
            if o["id"] == base:
                break
            prefix.add(o["id"])

    def leaf_label(o: dict[str, Any]) -> bool:
        return o["type"] == "label" and o.get("label") == "leaf"

    def in_force(o: dict[str, Any]) -> bool:
        if "target" not in o:
            return False
        t = o["target"]
        if t is None:
            return base is None
        return isinstance(t, str) and t in by_id and t not in prefix and not leaf_label(by_id[t])

    marks: list[dict[str, Any]] = []
    for o in objs:
        if o["type"] != "label":
            continue
        if leaf_label(o):
            if in_force(o):
                marks.append(o)
        elif o.get("label") is None:
            marks = [m for m in marks if m.get("target") != o.get("target")]

    def descends(eid: str, anc: str | None) -> bool:
        seen = set()
        cur: str | None = eid
        while cur is not None and cur in by_id and cur not in seen:
            if cur == anc:
                return True
            seen.add(cur)
            cur = by_id[cur].get("parent")
        return anc is None

    if not objs:
        return None
    if not marks:
        found: str | None = order[-1]
    else:
        mark = marks[-1]
        after = order[order.index(mark["id"]) + 1:]
        cands = [e for e in after if e != mark["target"] and descends(e, mark["target"])]
        found = cands[-1] if cands else mark["target"]
    while found is not None and leaf_label(by_id[found]):
        found = by_id[found].get("parent")
    return found


def _random_labelled(rnd: random.Random) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for i in range(rnd.randint(1, 14)):
        roll = rnd.random()
        parent = rnd.choice([o["id"] for o in objs]) if objs and rnd.random() < 0.9 else None
        if objs and roll < 0.3:
            target = rnd.choice([o["id"] for o in objs] + [None, "sha256:" + "9" * 64])
            value = rnd.choice(["leaf", "leaf", None, "checkpoint"])
            o = {"type": "label", "parent": parent, "ts": ts(i), "target": target, "label": value}
        else:
            o = {"type": "item", "parent": parent, "ts": ts(i), "item": item(f"t{i}")}
        objs.append(rehash(o))
    return objs


@pytest.mark.parametrize("seed", range(300))
def test_resume_rule_agrees_with_its_sentence(seed):
    """RFC 0001 File: the resume rule over random trees of items and labels (leaf labels
    naming entries, the root, nothing held, other labels; clearing labels)."""
    objs = _random_labelled(random.Random(seed))
    sf = read_session_bytes(header_line() + lines_of(objs), source="t")
    assert sf.leaf == resume_oracle(objs)


# ---------------------------------------------------------------------------
# Context building and the request hash, against an oracle written from the RFC


def _settings_after(s: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """RFC 0001 config, step 2: a delta applied (replace, tools, extra's null deletion)."""
    if c.get("replace") is True:
        s = {"tools": [], "extra": {}}
    s = {**s, "tools": list(s["tools"]), "extra": dict(s["extra"])}
    if isinstance(c.get("model"), str) and c["model"]:
        s["model"] = c["model"]
    if isinstance(c.get("instructions"), str):
        s["instructions"] = c["instructions"]
    for k in ("reasoning", "text"):
        if c.get(k) is not None:
            s[k] = c[k]
    for name in c.get("tools_removed") or []:
        s["tools"] = [t for t in s["tools"] if t.get("name") != name]
    for tool in c.get("tools_added") or []:
        names = [t.get("name") for t in s["tools"]]
        if tool.get("name") in names:
            s["tools"][names.index(tool["name"])] = tool
        else:
            s["tools"].append(tool)
    for k, v in (c.get("extra") or {}).items():
        if v is None:
            s["extra"].pop(k, None)
        else:
            s["extra"][k] = v
    return s


def context_oracle(path: list[dict[str, Any]]) -> bytes:
    """RFC 0001 Context building, steps 1-5, over a root-first path: the canonical request."""
    comp = max((i for i, e in enumerate(path) if e["type"] == "compaction"), default=None)
    s: dict[str, Any] = {"tools": [], "extra": {}}
    start = 0
    if comp is not None:
        cp = path[comp]["config"]
        s = {"tools": list(cp.get("tools", [])), "extra": dict(cp.get("extra", {}))}
        for k in ("model", "instructions", "reasoning", "text"):
            if k in cp:
                s[k] = cp[k]
        start = comp + 1
    for e in path[start:]:
        if e["type"] == "config":
            s = _settings_after(s, e)

    def contributes(e: dict[str, Any]) -> list[Any]:
        if e["type"] == "item":
            return [e["item"]]
        if e["type"] == "branch_summary":
            return [e["summary"]]
        return []

    items: list[Any] = []
    if comp is None:
        for e in path:
            items += contributes(e)
    else:
        c = path[comp]
        fk = [e["id"] for e in path].index(c["first_kept"])
        items = [c["summary"], *c.get("pinned", [])]
        for e in path[fk:comp] + path[comp + 1:]:
            items += contributes(e)
    req = dict(s["extra"])
    req.pop("previous_response_id", None)
    for k in ("model", "instructions", "reasoning", "text"):
        if s.get(k) not in (None, "", {}):
            req[k] = s[k]
    if s["tools"]:
        req["tools"] = s["tools"]
    req["input"] = items
    req["store"] = False
    return jcs(req)


def request_context_oracle(path: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """RFC 0001 Request context of a response: the path with its own output items removed."""
    response = path[-1]
    rid = response.get("response_id")
    drop: set[int] = set()
    if rid:
        for i in range(len(path) - 2, -1, -1):
            e = path[i]
            if e["type"] != "item":
                continue
            if e.get("response") != rid:
                break
            drop.add(i)
    return [e for i, e in enumerate(path[:-1]) if i not in drop]


_TOOLS = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in ("a", "b", "c")]


def _random_session(rnd: random.Random) -> tuple[bytes, list[dict[str, Any]]]:
    """A session of random context and record entries on random branches, each response's
    request_hash computed by the oracle."""
    objs: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}

    def path_to(eid: str | None) -> list[dict[str, Any]]:
        out = []
        while eid is not None:
            out.append(by_id[eid])
            eid = by_id[eid]["parent"]
        return out[::-1]

    def add(o: dict[str, Any]) -> dict[str, Any]:
        o = rehash(o)
        objs.append(o)
        by_id[o["id"]] = o
        return o

    leaf: str | None = None
    resp = 0
    for i in range(rnd.randint(3, 40)):
        if objs and rnd.random() < 0.12:
            leaf = rnd.choice(objs)["id"]  # a branch
        base: dict[str, Any] = {"parent": leaf, "ts": ts(i)}
        roll = rnd.random()
        if leaf is None or roll < 0.12:
            c: dict[str, Any] = {"type": "config"}
            if rnd.random() < 0.7:
                c["model"] = rnd.choice(["m1", "m2", ""])
            if rnd.random() < 0.4:
                c["instructions"] = rnd.choice(["Be brief.", "", "Sé breve \U0001f600"])
            if rnd.random() < 0.3:
                c["reasoning"] = rnd.choice([{"effort": "low"}, {}, None])
            if rnd.random() < 0.4:
                c["tools_added"] = rnd.sample(_TOOLS, rnd.randint(0, 2))
            if rnd.random() < 0.3:
                c["tools_removed"] = rnd.sample(["a", "b", "c", "z"], rnd.randint(0, 2))
            if rnd.random() < 0.4:
                c["extra"] = {rnd.choice(["temperature", "store", "previous_response_id", "top_p", "\U0001f600", "input_x"]):
                              rnd.choice([0.2, None, 1e21, True, "x"])}
            if rnd.random() < 0.1:
                c["replace"] = True
            o = add({**base, **c})
        elif roll < 0.45:
            o = add({**base, "type": "item", "item": item(f"u{i}")})
        elif roll < 0.65:
            # a model call: output items (maybe interleaved with records), then the response
            resp += 1
            rid = f"resp_{resp}"
            for k in range(rnd.randint(0, 3)):
                if rnd.random() < 0.3:
                    leaf = add({"type": rnd.choice(["custom", "acme:guard", "info"]), "parent": leaf, "ts": ts(i),
                                "name": f"x{k}"})["id"]
                elif rnd.random() < 0.1:  # context entries among the outputs: they stay in the request context
                    extra = rnd.choice([{"type": "config", "model": f"m{k}"},
                                        {"type": "branch_summary", "from": objs[0]["id"], "summary": item(f"bs{k}")}])
                    leaf = add({**extra, "parent": leaf, "ts": ts(i)})["id"]
                leaf = add({"type": "item", "parent": leaf, "ts": ts(i), "item": item(f"o{resp}.{k}", "assistant"),
                            "response": rid})["id"]
            r: dict[str, Any] = {"type": "response", "parent": leaf, "ts": ts(i)}
            if rnd.random() < 0.9:
                r["response_id"] = rid
            probe = {**r, "id": "probe"}
            r["request_hash"] = sha(context_oracle(request_context_oracle(path_to(leaf) + [probe])))
            o = add(r)
        elif roll < 0.75:
            on_path = path_to(leaf)
            summary = item(f"summary {i}", "assistant")
            if rnd.random() < 0.5:
                o = add({**base, "type": "branch_summary", "from": rnd.choice(objs)["id"], "summary": summary})
            else:
                fk = rnd.choice(on_path)
                pins = [e["item"] for e in on_path[: on_path.index(fk)] if e["type"] == "item"][: rnd.randint(0, 2)]
                cp: dict[str, Any] = {"model": "m3", "tools": rnd.sample(_TOOLS, rnd.randint(0, 3)), "extra": {"top_p": 0.5}}
                comp: dict[str, Any] = {**base, "type": "compaction", "first_kept": fk["id"], "summary": summary, "config": cp}
                if pins:
                    comp["pinned"] = pins
                o = add(comp)
        else:
            o = add({**base, "type": rnd.choice(["info", "custom", "env", "acme:x"]), "name": f"r{i}"})
        leaf = o["id"]
    return header_line() + lines_of(objs), objs


@pytest.mark.parametrize("seed", range(120))
def test_contexts_and_request_hashes_agree_with_the_algorithm(seed):
    """RFC 0001 Context building, Request context of a response, Request hash: over random
    branching sessions (configs with replace, tools and extra's null deletion, compactions
    with pins, branch summaries, records and extensions interleaved with output items),
    the context at every entry is the oracle's request, and every request_hash the oracle
    wrote verifies, read whole and in the one streamed pass."""
    data, objs = _random_session(random.Random(seed))
    sf = read_session_bytes(data, source="t")
    assert sf.all_problems() == []
    by_id = {o["id"]: o for o in objs}

    def path_to(eid: str) -> list[dict[str, Any]]:
        out = []
        cur: str | None = eid
        while cur is not None:
            out.append(by_id[cur])
            cur = by_id[cur]["parent"]
        return out[::-1]

    for o in objs:
        assert context_at(sf, o["id"]).request_bytes() == context_oracle(path_to(o["id"])), o["id"]
    report = verify_requests(sf)
    responses = sum(1 for o in objs if o["type"] == "response")
    assert (report.verified, report.failed) == (responses, 0), [c.as_dict() for c in report.checks if c.failed]
    streamed = verify_bytes(data, source="t")
    assert streamed.ok and streamed.request_report().verified == responses


# ---------------------------------------------------------------------------
# The corpus: every good file's lines verify by the RFC's hashes written here again


def test_corpus_ids_recomputed_from_the_rfc(corpus):
    """RFC 0001 Conformance: every entry's content hash and id recomputed."""
    for path in sorted((corpus / "sessions").glob("*.jsonl")):
        if path.stem in ("corrupt-middle", "duplicate-id", "missing-id", "truncated", "unsupported-format"):
            continue
        raw = split_lines(path.read_bytes())[1:]
        sf = read_session_bytes(path.read_bytes(), source=str(path))
        held = {e.id: e for e in sf.entries}
        for line in raw:
            obj = json.loads(line)
            assert ref_hashes(obj)[0] == obj["id"], (path.name, obj["id"])
            assert held[obj["id"]].content_hash == ref_hashes(obj)[1]


# ---------------------------------------------------------------------------
# Header `redacted`: the redactor is a rewriter, and keeps what it does not define


def test_redaction_keeps_the_members_of_a_parents_reference_it_does_not_define():
    """RFC 0001 Entry envelope: a member this document does not define inside an object it
    does is preserved by any tool that rewrites the file; the redactor re-points a
    reference into this file (Header `redacted`) and keeps the rest of it as written, a
    reference into another session whole (a `session` of another type included)."""
    from agentsession_cas.format.redact import RedactOptions, redact

    objs = straight(3)
    other = "0199c000-0000-7000-8000-0000000000f2"
    merged = rehash({
        "type": "item", "parent": objs[2]["id"], "ts": ts(5), "item": item("merged /home/alice"),
        "parents": [
            {"entry": objs[1]["id"], "via": "worker-2"},
            {"entry": "sha256:" + "7" * 64, "session": other, "x-attempt": 2},
            {"entry": "sha256:" + "8" * 64, "session": 7},
        ],
    })
    sf = read_session_bytes(header_line() + lines_of([*objs, merged]), source="t")
    assert sf.all_problems() == []
    done = redact(sf, RedactOptions(home="/home/alice"))
    out = read_session_bytes(done.data, source="r")
    assert [p.code for p in out.all_problems()] == []
    last = out.entries[-1].data
    assert last["item"]["content"][0]["text"] == "merged ~"
    assert sorted(last["parents"], key=json.dumps) == sorted([
        {"entry": done.ids[objs[1]["id"]], "via": "worker-2"},
        {"entry": "sha256:" + "7" * 64, "session": other, "x-attempt": 2},
        {"entry": "sha256:" + "8" * 64, "session": 7},
    ], key=json.dumps)


def test_redaction_rewrites_the_text_of_a_parents_reference_and_points_this_session_at_the_copy():
    """The members a reference keeps are text like any other: a secret or a home path in
    one is redacted (kept whole, they leaked past ``--secret``). A reference that names
    this session by its id names the redacted copy's id, which holds the re-pointed entry
    (it named the original session by an id that session does not hold)."""
    from agentsession_cas.format.redact import RedactOptions, redact

    objs = straight(3)
    other = "0199c000-0000-7000-8000-0000000000f2"
    merged = rehash({
        "type": "item", "parent": objs[2]["id"], "ts": ts(5), "item": item("merged"),
        "parents": [
            {"entry": objs[1]["id"], "session": SID, "x-token": "sk-live-0123", "x-tree": "/home/alice/wt"},
            {"entry": "sha256:" + "7" * 64, "session": other, "x-cmd": "cd /home/alice && deploy sk-live-0123"},
        ],
    })
    sf = read_session_bytes(header_line() + lines_of([*objs, merged]), source="t")
    assert sf.all_problems() == []
    done = redact(sf, RedactOptions(home="/home/alice", secrets=[r"sk-live-\w+"]))
    assert b"sk-live" not in done.data and b"/home/alice" not in done.data
    out = read_session_bytes(done.data, source="r")
    assert [p.code for p in out.all_problems()] == []
    assert sorted(out.entries[-1].data["parents"], key=json.dumps) == sorted([
        {"entry": done.ids[objs[1]["id"]], "session": done.session_id, "x-token": "REDACTED", "x-tree": "~/wt"},
        {"entry": "sha256:" + "7" * 64, "session": other, "x-cmd": "cd ~ && deploy REDACTED"},
    ], key=json.dumps)


# ---------------------------------------------------------------------------
# run: the end reason's cascade and the start's source, shape by shape from the RFC


def _call(cid: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": cid, "name": "a", "arguments": "{}"}


class _Path:
    """A straight path written with the RFC's entries, for the run cascade."""

    def __init__(self, records: tuple[str, ...] = ("run", "dispatch", "decision")):
        self.objs: list[dict[str, Any]] = []
        self.records = records
        self.calls: dict[str, str] = {}
        self.add("config", model="m")

    def add(self, type_: str, **body: Any) -> str:
        parent = self.objs[-1]["id"] if self.objs else None
        obj = rehash({"type": type_, "parent": parent, "ts": ts(len(self.objs)), **body})
        self.objs.append(obj)
        return obj["id"]

    def start(self, run: str, source: str = "input") -> None:
        self.add("run", run_id=run, phase="start", source=source)

    def user(self, text: str = "hi") -> None:
        self.add("item", item=item(text))

    def model(self, rid: str, *calls: str, text: str | None = None, **response: Any) -> None:
        if text is not None:
            self.add("item", item=item(text, "assistant"), response=rid)
        for cid in calls:
            self.calls[cid] = self.add("item", item=_call(cid), response=rid)
        self.add("response", response_id=rid, **response)

    def output(self, cid: str) -> None:
        self.add("item", item={"type": "function_call_output", "call_id": cid, "output": "ok"})

    def dispatch(self, cid: str) -> None:
        self.add("dispatch", call_id=cid, target=self.calls[cid])

    def decide(self, cid: str, verdict: str, **more: Any) -> None:
        self.add("decision", call_id=cid, target=self.calls[cid], verdict=verdict, **more)

    def end(self, run: str, reason: str, pending: tuple[str, ...] = ()) -> None:
        self.add("run", run_id=run, phase="end", reason=reason, pending=list(pending))

    def read(self):
        data = header_line(records=list(self.records)) + lines_of(self.objs)
        return read_session_bytes(data, source="t.jsonl"), verify_bytes(data, source="t.jsonl")


def _cascade(build) -> tuple[list[tuple[str, tuple[str, ...]]], list[str]]:
    p = _Path()
    build(p)
    sf, report = p.read()
    from agentsession_cas.format.rules import analyze_runs

    runs = analyze_runs(sf).runs
    return [(r.computed_reason, r.pending) for r in runs], [x.code for x in report.problems]


@pytest.mark.parametrize(
    ("name", "reason", "pending"),
    [
        ("done", "done", ()),
        ("error", "error", ("c1",)),  # the call the failed response made is pending
        ("held", "input_required", ("c1",)),
        ("held-after-dispatch", "input_required", ("c1",)),
        ("in-flight", "aborted", ("c1",)),
        ("incomplete", "aborted", ()),
        ("stopped", "stopped", ()),
        ("nothing", "aborted", ()),
        ("held-and-in-flight", "aborted", ("c1", "c2")),
    ],
)
def test_run_end_reason_is_the_first_step_of_the_cascade_its_segment_matches(name, reason, pending):
    """RFC 0001 run: error (the last response's error), input_required (a held call, none
    in flight), aborted (a pending call, or an incomplete last response), done (the last
    response made no call), stopped (the calls answered, no response after), aborted
    (anything left); a written end that agrees verifies."""

    def build(p: _Path) -> None:
        p.start("r1")
        p.user()
        if name == "done":
            p.model("resp1", text="hello")
        elif name == "error":
            p.model("resp1", "c1", error={"code": "server_error", "message": "x"})
        elif name == "held":
            p.model("resp1", "c1")
            p.decide("c1", "hold", by="policy")
        elif name == "held-after-dispatch":
            p.model("resp1", "c1")
            p.dispatch("c1")
            p.decide("c1", "hold", by="human")
        elif name == "in-flight":
            p.model("resp1", "c1")
            p.dispatch("c1")
        elif name == "incomplete":
            p.model("resp1", text="cut", incomplete={"reason": "max_output_tokens"})
        elif name == "stopped":
            p.model("resp1", "c1")
            p.dispatch("c1")
            p.output("c1")
        elif name == "held-and-in-flight":
            p.model("resp1", "c1", "c2")
            p.decide("c1", "hold")
            p.dispatch("c2")
        p.end("r1", reason, pending)

    runs, problems = _cascade(build)
    assert runs == [(reason, pending)]
    assert problems == []


def test_a_written_end_that_the_segment_contradicts_is_reported():
    """RFC 0001 run: "when the written value is computable and the two disagree the segment
    is authoritative"; error and interrupted are written values and stand."""

    def build(reason: str):
        def go(p: _Path) -> None:
            p.start("r1")
            p.user()
            p.model("resp1", text="hello")
            p.end("r1", reason)

        return go

    assert _cascade(build("stopped"))[1] == ["run-reason"]
    assert _cascade(build("interrupted"))[1] == []
    assert _cascade(build("error"))[1] == []


def test_a_resume_takes_up_a_held_call_and_ends_stopped():
    """RFC 0001 run: `resume` when the segment's first output, decision or dispatch takes up
    a call left without an output; `stopped` reads the response before the segment."""

    def build(source: str):
        def go(p: _Path) -> None:
            p.start("r1")
            p.user()
            p.model("resp1", "c1")
            p.decide("c1", "hold", by="human")
            p.end("r1", "input_required", ("c1",))
            p.start("r2", source)
            p.user("approved")  # a message before the take-up does not change the shape
            p.decide("c1", "proceed", by="human")
            p.dispatch("c1")
            p.output("c1")
            p.end("r2", "stopped")

        return go

    runs, problems = _cascade(build("resume"))
    assert runs == [("input_required", ("c1",)), ("stopped", ())] and problems == []
    assert _cascade(build("input"))[1] == ["run-source"]


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("dispatch after reject", "dispatch-after-reject"),
        ("dispatch after answer", "dispatch-after-answer"),
        ("dispatch after output", "dispatch-after-output"),
        ("decision after reject", "decision-after-reject"),
        ("reject after dispatch", "reject-after-dispatch"),
        ("reject after output", "decision-after-output"),
        ("target names another call", "bad-target"),
        ("repeated call_id", "call-id-repeated"),
        ("empty call_id", "call-id-empty"),
        ("output without a promised dispatch", "dispatch-missing"),
    ],
)
def test_the_conformance_suites_negative_record_cases(case, code):
    """RFC 0001 Conformance: each a file broken in one way, reported for that reason."""
    p = _Path()
    p.user()
    if case == "repeated call_id":
        p.model("resp1", "c1")
        p.output("c1")
        p.model("resp2", "c1")
    elif case == "empty call_id":
        p.model("resp1", "")
    else:
        p.model("resp1", "c1", "c2")
        if case == "dispatch after reject":
            p.decide("c1", "reject", reason="no")
            p.dispatch("c1")
        elif case == "dispatch after answer":
            p.dispatch("c1")
            p.decide("c1", "answer", reason="done elsewhere")
            p.dispatch("c1")
        elif case == "dispatch after output":
            p.dispatch("c1")
            p.output("c1")
            p.dispatch("c1")
        elif case == "decision after reject":
            p.decide("c1", "reject", reason="no")
            p.decide("c1", "hold")
        elif case == "reject after dispatch":
            p.dispatch("c1")
            p.decide("c1", "reject", reason="no")
        elif case == "reject after output":
            p.dispatch("c1")
            p.output("c1")
            p.decide("c1", "reject", reason="no")
        elif case == "target names another call":
            p.add("dispatch", call_id="c1", target=p.calls["c2"])
        elif case == "output without a promised dispatch":
            p.output("c1")
    sf, report = p.read()
    assert code in {x.code for x in report.problems}, [str(x) for x in report.problems]


def test_a_parents_reference_with_a_session_of_another_type_names_no_entry_of_this_file():
    """RFC 0001 Convergence: `session` MAY be omitted when the entry is in this file; one
    present names another session. The tree rule (which checks only references into this
    file) and Entry.parents (which every other reader of the references uses: the store's
    unresolved names, a fork's base check, repair) read such a reference alike."""
    objs = straight(2)
    far = "sha256:" + "8" * 64
    merged = rehash({"type": "item", "parent": objs[1]["id"], "ts": ts(5), "item": item("m"),
                     "parents": [{"entry": far, "session": 7}]})
    sf = read_session_bytes(header_line() + lines_of([*objs, merged]), source="t")
    assert sf.all_problems() == []  # not checked as this file's
    (ref,) = sf.entries[-1].parents
    assert ref.entry == far and ref.session is not None and ref.session != SID


@pytest.mark.parametrize(("sid", "named"), [("5", 5), ("true", True), ("1.5", 1.5), ("100000.0", 1e5)])
def test_a_parents_session_of_another_type_is_another_session_whatever_this_one_is_named(sid, named):
    """The JSON text of a `session` that is no string could be a session id ("5" for 5):
    the store read such a reference as naming this session, refusing its fork (a base
    below a merge) where the tree rule read it as another session's."""
    from agentsession_cas import open_store

    store = open_store(f"memory:parents-{sid}", create=True)
    s = store.create(Header.new(sid))
    s.append({"type": "item", "item": item("a")})
    far = "sha256:" + "8" * 64
    r = s.append({"type": "item", "item": item("b"), "parents": [{"entry": far, "session": named}]})
    assert r.unresolved == []
    (ref,) = store.entry(r.id).parents
    assert ref.session != sid
    fork = store.fork(sid, r.id, session_id="f")
    assert fork.base == r.id


@pytest.mark.parametrize("seed", range(150))
def test_resume_rule_agrees_with_its_sentence_in_a_fork(corpus, seed):
    """RFC 0001 File: in a file with a base, a `leaf` label naming an entry on the prefix
    above the base, or the root, is not in force; own entries and labels at random below
    the corpus's fork."""
    path = corpus / "sessions" / "fork.jsonl"
    raw = split_lines(path.read_bytes())
    header = json.loads(raw[0])
    objs = [json.loads(line) for line in raw[1:]]
    base = header["base"]
    prefix = [o["id"] for o in objs[: [o["id"] for o in objs].index(base)]]
    rnd = random.Random(seed)
    own = [o["id"] for o in objs[len(prefix):]]
    for i in range(rnd.randint(1, 10)):
        parent = rnd.choice(own)
        if rnd.random() < 0.35:
            target = rnd.choice(own + prefix + [None, base])
            o = {"type": "label", "parent": parent, "ts": f"2026-09-17T13:00:{i:02d}Z", "target": target,
                 "label": rnd.choice(["leaf", "leaf", None])}
        else:
            o = {"type": "item", "parent": parent, "ts": f"2026-09-17T13:00:{i:02d}Z", "item": item(f"f{i}")}
        o = rehash(o)
        objs.append(o)
        own.append(o["id"])
    sf = read_session_bytes(raw[0] + b"\n" + lines_of(objs), source="fork.jsonl")
    assert sf.all_problems() == []
    assert sf.leaf == resume_oracle(objs, base)


@pytest.mark.parametrize(
    ("at", "ok"),
    [("", True), ("/", True), ("/a/0", True), ("/a~1b/~0", True), ("//x", True),
     ("a", False), ("/a~2", False), ("/a~", False), ("/~x/b", False)],
)
def test_normalised_at_is_an_rfc6901_pointer(at, ok):
    """RFC 0001 Entry hash: `at` is an RFC 6901 JSON Pointer relative to the body; in one,
    "~" is escaped as "~0" or "~1" and stands nowhere else. A reader reports another."""
    from agentsession_cas.format.normalise import check_normalised, pointer

    assert (check_normalised([{"at": at, "was": "1"}]) is None) is ok
    assert check_normalised([{"at": pointer(["a~/b", "~1", ""]), "was": "1"}]) is None


@pytest.mark.parametrize("processes", [False, True])
def test_a_huge_line_verifies_in_the_streamed_pass(tmp_path, processes):
    """RFC 0001 File: one JSON object per line, whatever its length: a line longer than the
    streamed reader's blocks and buffer, in the middle and as a last line without LF."""
    from agentsession_cas.format.reader import verify_file

    objs = straight(2)
    big = rehash({"type": "item", "parent": objs[-1]["id"], "ts": ts(3), "item": item("x" * (5 << 20))})
    after = rehash({"type": "item", "parent": big["id"], "ts": ts(4), "item": item("y")})
    for n, data in enumerate([header_line() + lines_of([*objs, big, after]), (header_line() + lines_of([*objs, big]))[:-1]]):
        path = tmp_path / f"huge{n}.jsonl"
        path.write_bytes(data)
        report = verify_file(path, processes=processes)
        assert report.ok and report.entries == (4 if n == 0 else 3), [str(p) for p in report.problems]
