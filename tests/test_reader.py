"""Reading and verifying: synthetic sessions built with the writer, then tampered with line by line."""

from __future__ import annotations

import json

import pytest

from agentsession_cas import (
    Header,
    NoSuchEntryError,
    ParentRef,
    SessionBuilder,
    SessionFormatError,
    entry_hashes,
    make_entry,
    read_session,
    read_session_bytes,
)
from agentsession_cas.errors import AmbiguousNameError, BadNameError
from agentsession_cas.format.reader import split_lines

SID = "0199c000-0000-7000-8000-000000000001"


def ts(n: int) -> str:
    return f"2026-10-05T10:{n // 60:02d}:{n % 60:02d}Z"


def build(n: int = 4, **header) -> SessionBuilder:
    """A straight session of ``n`` entries: a config, then items."""
    b = SessionBuilder(Header.new(SID, created_at=ts(0), **header))
    b.append("config", ts=ts(0), model="gpt-5")
    for i in range(1, n):
        b.append("item", ts=ts(i), item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"m{i}"}]})
    return b


def objs(b: SessionBuilder) -> list[dict]:
    """The file's lines as objects, header first."""
    return [json.loads(line) for line in split_lines(b.to_bytes())]


def dump(objects: list) -> bytes:
    return b"".join(json.dumps(o, ensure_ascii=False).encode() + b"\n" for o in objects)


def rehash(obj: dict) -> dict:
    """Give a tampered object the id its members hash to."""
    obj = {k: v for k, v in obj.items() if k != "id"}
    obj["id"] = entry_hashes(obj)[0]
    return obj


def codes(s) -> list[tuple[str, int | None]]:
    return [(p.code, p.line) for p in s.all_problems()]


def read(data: bytes):
    return read_session_bytes(data, source="test.jsonl")


# -- the baseline --------------------------------------------------------------------


def test_untampered_reads_clean():
    b = build()
    s = read(b.to_bytes())
    assert codes(s) == [] and s.ok
    assert [e.id for e in s.entries] == [e.id for e in b.entries]
    assert [e.line for e in s.entries] == [2, 3, 4, 5]
    # json.dumps (not canonical) spelling changes nothing
    assert codes(read(dump(objs(b)))) == []


def test_read_session_from_disk(tmp_path):
    b = build()
    path = tmp_path / "s.jsonl"
    b.write(path)
    s = read_session(path)
    assert s.ok and s.source == str(path)
    with pytest.raises(IsADirectoryError):
        read_session(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_session(tmp_path / "absent.jsonl")


# -- ids and hashes ---------------------------------------------------------------------


def test_changed_member_fails_its_hash():
    o = objs(build())
    o[2]["item"]["content"][0]["text"] = "tampered"
    s = read(dump(o))
    assert codes(s) == [("hash", 3)]
    assert s.all_problems()[0].entry == o[2]["id"]
    # the entry is still known by its stated id, so its child is not also reported
    assert s.entries[1].id == o[2]["id"] and not s.entries[1].verified
    assert not s.ok


@pytest.mark.parametrize("member", ["type", "parent", "ts", "model"])
def test_changed_envelope_member_fails_the_hash(member):
    o = objs(build(2))
    e = o[2] if member != "model" else o[1]
    line = 3 if member != "model" else 2
    e[member] = {"type": "config", "parent": None, "ts": "2026-10-05T11:00:00Z", "model": "other"}[member]
    s = read(dump(o))
    assert ("hash", line) in codes(s)


def test_added_parents_fails_the_hash():
    o = objs(build(3))
    o[3]["parents"] = [{"entry": o[1]["id"]}]
    assert codes(read(dump(o))) == [("hash", 4)]


@pytest.mark.parametrize(
    "mangle",
    [
        lambda i: "sha512:" + i[7:],
        lambda i: "SHA256:" + i[7:],
        lambda i: "sha256:" + i[7:].upper(),
        lambda i: i[7:],
        lambda i: i[:-1],
        lambda i: i + "0",
        lambda i: "",
    ],
    ids=["other-prefix", "upper-prefix", "upper-hex", "no-prefix", "short", "long", "empty"],
)
def test_malformed_id_is_refused(mangle):
    o = objs(build())
    o[2]["id"] = mangle(o[2]["id"])
    s = read(dump(o))
    # reported once, on its line; its child names the true hash and is not blamed
    assert codes(s) == [("id", 3)]


def test_non_string_id_is_refused():
    o = objs(build())
    o[2]["id"] = 12
    assert ("id", 3) in codes(read(dump(o)))


def test_missing_id_is_reported_and_the_entry_known_by_its_hash():
    o = objs(build())
    true_id = o[2].pop("id")
    s = read(dump(o))
    assert codes(s) == [("id", 3)]
    assert s.entries[1].id == true_id


@pytest.mark.parametrize(
    "bad",
    [
        "2026-10-05T10:00:01.500Z",  # trailing zero
        "2026-10-05T10:00:01.0Z",  # zero fraction
        "2026-10-05T10:00:01.1234567891Z",  # ten digits
        "2026-10-05T10:00:01+00:00",  # offset, not Z
        "2026-10-05T12:00:01+02:00",
        "2026-10-05t10:00:01Z",  # lowercase t
        "2026-10-05T10:00:01z",  # lowercase z
        "2026-10-05 10:00:01Z",  # space
        "2026-10-05T10:00:60Z",  # leap second written as 60
        "2026-02-30T10:00:01Z",  # no such day
        "2026-10-05T10:00Z",  # no seconds
        "",
        1760000000,
        None,
    ],
)
def test_bad_ts_spelling_is_reported_like_a_failed_hash(bad):
    o = objs(build())
    o[2]["ts"] = bad
    o[2] = rehash(o[2])  # the hash agrees with the line: only the spelling is wrong
    o[3]["parent"] = o[2]["id"]
    o[3] = rehash(o[3])
    o[4]["parent"] = o[3]["id"]
    o[4] = rehash(o[4])
    s = read(dump(o))
    assert codes(s) == [("ts", 3)]
    assert not s.ok


@pytest.mark.parametrize("good", ["2026-10-05T10:00:01.5Z", "2026-10-05T10:00:01.123456789Z", "2026-10-05T23:59:59Z"])
def test_admitted_ts_spellings_read_clean(good):
    b = SessionBuilder(Header.new(SID, created_at=ts(0)))
    b.append("config", ts=good, model="m")
    assert codes(read(b.to_bytes())) == []


def test_body_carrying_content_is_reserved():
    o = objs(build())
    o[2]["content"] = "a body member the envelope reserves"
    s = read(dump(o))
    assert codes(s) == [("reserved", 3)]
    assert s.all_problems()[0].entry == o[2]["id"]
    # the line is not loaded, and its child is not blamed for it
    assert [e.line for e in s.entries] == [2, 4, 5]


def test_entry_without_type_or_ts():
    o = objs(build())
    del o[2]["type"]
    del o[3]["ts"]
    s = read(dump(o))
    assert [c for c, _ in codes(s)] == ["entry", "entry"]
    assert [line for _, line in codes(s)] == [3, 4]


# -- I-JSON ---------------------------------------------------------------------------------


def _raw_line(o: list, index: int, text: str) -> bytes:
    lines = split_lines(dump(o))
    lines[index] = text.encode()
    return b"\n".join(lines) + b"\n"


def test_duplicate_member_name_is_not_ijson():
    o = objs(build())
    text = json.dumps(o[2])
    text = text[:-1] + ', "type": "item"}'
    s = read(_raw_line(o, 2, text))
    assert codes(s) == [("ijson", 3)]
    assert "repeated" in s.all_problems()[0].message
    # its child names its (parseable) id and is not blamed
    assert [e.line for e in s.entries] == [2, 4, 5]


def test_nested_duplicate_member_name_is_not_ijson():
    o = objs(build())
    text = json.dumps(o[2]).replace('"role": "user"', '"role": "user", "role": "user"')
    assert codes(read(_raw_line(o, 2, text))) == [("ijson", 3)]


@pytest.mark.parametrize("number", ["9007199254740993", "-9007199254740993", "9007199254740993.0", "90071992547409930e-1", "1e400", "NaN", "Infinity"])
def test_number_that_fails_the_ijson_test(number):
    o = objs(build())
    text = json.dumps(o[2])[:-1] + f', "n": {number}}}'
    assert codes(read(_raw_line(o, 2, text))) == [("ijson", 3)]


@pytest.mark.parametrize("number", ["9007199254740992", "1e20", "0.1", "1152921504606847000", "-0", "1E2", "2.50"])
def test_number_the_ijson_test_admits(number):
    from agentsession_cas.format.canonical import loads

    o = objs(build(2))
    text = json.dumps(o[2])[:-1] + f', "n": {number}}}'
    # the stated id is the hash of the line's own members, however the number is spelled
    text = text.replace(o[2]["id"], entry_hashes(loads(text), parsed=True)[0])
    assert codes(read(_raw_line(o, 2, text))) == []


def test_lone_surrogate_is_not_ijson():
    o = objs(build())
    text = json.dumps(o[2])[:-1] + ', "s": "\\ud800"}'
    assert codes(read(_raw_line(o, 2, text))) == [("ijson", 3)]


# -- parents (convergence) ---------------------------------------------------------------------


def _converging(refs_for) -> tuple[list, bytes]:
    """A session whose 4th entry carries ``parents`` given by ``refs_for(entries)``."""
    b = build(3)
    e = make_entry("item", b.entries[-1].id, ts=ts(10), parents=refs_for(b.entries), item={"type": "message", "role": "user", "content": []})
    return b.entries + [e], b.header.canonical_line() + b"".join(x.canonical_line() for x in b.entries + [e])


def test_parents_naming_an_earlier_entry_is_fine():
    _, data = _converging(lambda es: [ParentRef(es[0].id), ParentRef("sha256:" + "0" * 64, session="other")])
    s = read(data)
    assert codes(s) == []
    assert s.entries[-1].parents == [ParentRef(s.entries[0].id), ParentRef("sha256:" + "0" * 64, "other")]


def test_parents_repeating_parent():
    _, data = _converging(lambda es: [ParentRef(es[-1].id)])
    assert codes(read(data)) == [("parents", 5)]


def test_parents_naming_one_entry_twice():
    _, data = _converging(lambda es: [ParentRef(es[0].id), ParentRef(es[0].id)])
    assert codes(read(data)) == [("parents", 5)]


def test_parents_naming_an_entry_in_this_session_by_its_id_is_checked():
    _, data = _converging(lambda es: [ParentRef("sha256:" + "1" * 64, session=SID)])
    assert codes(read(data)) == [("parents", 5)]


def test_parents_naming_a_later_entry():
    b = build(3)
    later = make_entry("item", b.entries[0].id, ts=ts(20), item={"n": "later"})
    conv = make_entry("item", b.entries[-1].id, ts=ts(21), parents=[ParentRef(later.id)], item={"n": "conv"})
    entries = b.entries + [conv, later]
    s = read(b.header.canonical_line() + b"".join(e.canonical_line() for e in entries))
    assert codes(s) == [("parents", 5)]


def test_parents_not_an_array_or_without_entry():
    o = objs(build(3))
    o[3]["parents"] = {"entry": o[1]["id"]}
    assert codes(read(dump(o))) == [("entry", 4)]  # cannot even be hashed
    o = objs(build(3))
    o[3]["parents"] = [{"session": "x"}]
    o[3] = rehash(o[3])
    assert codes(read(dump(o))) == [("parents", 4)]


# -- parent ---------------------------------------------------------------------------


def test_parent_appearing_later():
    o = objs(build())
    o[3], o[4] = o[4], o[3]
    s = read(dump(o))
    assert codes(s) == [("parent", 4)]
    assert s.all_problems()[0].entry == o[3]["id"]


def test_parent_unknown():
    o = objs(build())
    o[3]["parent"] = "sha256:" + "a" * 64
    o[3] = rehash(o[3])
    o[4]["parent"] = o[3]["id"]
    o[4] = rehash(o[4])
    assert codes(read(dump(o))) == [("parent", 4)]


def test_missing_parent_member():
    o = objs(build())
    del o[3]["parent"]
    o[3] = rehash(o[3])
    o[4]["parent"] = o[3]["id"]
    o[4] = rehash(o[4])
    assert codes(read(dump(o))) == [("parent", 4)]


def test_several_roots_in_a_baseless_file_are_fine():
    b = build(2)
    b.branch(None, "config", ts=ts(30), model="other")
    s = read(b.to_bytes())
    assert codes(s) == [] and len(s.tree.roots()) == 2


# -- line structure ---------------------------------------------------------------------


def test_second_header_line():
    o = objs(build())
    o.insert(3, dict(o[0]))
    s = read(dump(o))
    assert codes(s) == [("entry", 4)]
    assert "header" in s.all_problems()[0].message
    assert len(s.entries) == 4


@pytest.mark.parametrize("line", ["[1, 2]", '"an entry"', "42", "null", "true"])
def test_non_object_line(line):
    o = objs(build())
    s = read(_raw_line(o, 2, line))
    assert codes(s)[0] == ("json", 3)
    assert 3 not in [e.line for e in s.entries]


def test_blank_middle_line_is_an_error_naming_its_line():
    lines = split_lines(build().to_bytes())
    lines.insert(3, b"")
    s = read(b"\n".join(lines) + b"\n")
    assert codes(s) == [("json", 4)]
    assert s.truncated is None
    assert len(s.entries) == 4


def test_truncated_final_line_is_tolerated_and_the_prefix_loads():
    data = build().to_bytes()
    cut = data[: len(data) - 30]
    s = read(cut)
    assert s.problems == []
    assert codes(s) == [("truncated", 5)]
    assert [e.line for e in s.entries] == [2, 3, 4]
    assert not s.ok
    with pytest.raises(SessionFormatError):
        s.raise_for_problems()


def test_truncated_final_line_with_its_lf():
    # a last line that does not parse but got its LF written is tolerated the same way
    data = build().to_bytes()
    s = read(data[: len(data) - 30] + b"\n")
    assert codes(s) == [("truncated", 5)]


@pytest.mark.parametrize("how", ["bytes", "file", "helper", "lines"])
def test_a_bad_last_line_is_called_cut_short_only_without_its_lf(tmp_path, how):
    """RFC 0001 File: the reader tolerates and reports a final line that does not parse.
    Only one the file ends without a newline was cut short (a crash mid-write); one that
    ends with LF is worded as a line that does not parse. Each reading path passes
    whether the last line was terminated."""
    from agentsession_cas.format.reader import verify_file, verify_lines

    data = build().to_bytes()
    cut = data[: len(data) - 30]

    def message(raw: bytes) -> str:
        if how == "bytes":
            found = read(raw).all_problems()
        elif how in ("file", "helper"):  # (read by this process, or with the helper process)
            path = tmp_path / "s.jsonl"
            path.write_bytes(raw)
            found = verify_file(path, processes=how == "helper").problems
        else:
            found = verify_lines(raw.splitlines(keepends=True), source="s").problems
        (p,) = [p for p in found if p.code == "truncated"]
        assert p.line == 5
        return p.message

    assert message(cut).startswith("the last line was cut short: does not parse as JSON")
    assert message(cut + b"\n").startswith("the last line does not parse as JSON")


def test_final_line_without_lf_that_is_complete_reads_fine():
    data = build().to_bytes()
    assert data.endswith(b"\n")
    s = read(data[:-1])
    assert codes(s) == [] and s.ok
    assert len(s.entries) == 4


def test_header_only_file_has_no_entries_and_is_ok():
    """A header alone is a session just created (RFC 0001, RFC 0002 import): read clean,
    as verify and import take it (``empty`` is a note)."""
    b = build()
    for data in (b.header.canonical_line(), b.header.canonical_line()[:-1]):
        s = read(data)
        assert s.entries == [] and codes(s) == []
        assert s.ok
        assert s.leaf is None
        s.raise_for_problems()


def test_invalid_utf8_in_a_middle_line():
    lines = split_lines(build().to_bytes())
    lines[2] = lines[2].replace(b"m1", b"m\xff\xfe")
    assert b"\xff" in lines[2]
    s = read(b"\n".join(lines) + b"\n")
    assert codes(s) == [("json", 3)]
    assert "UTF-8" in s.all_problems()[0].message
    # its child is not blamed: the broken line's id could still be found
    assert [e.line for e in s.entries] == [2, 4, 5]


def test_invalid_utf8_in_the_final_line_is_truncation():
    lines = split_lines(build().to_bytes())
    lines[-1] = lines[-1][:40] + b"\xe2\x82"
    s = read(b"\n".join(lines))
    assert codes(s) == [("truncated", 5)]


def test_a_byte_order_mark_is_named_as_one():
    """A file saved "UTF-8 with BOM" (RFC 0001: UTF-8, I-JSON, which carries no byte
    order mark) is told so, at its line, not as JSON that expects a value."""
    data = b"\xef\xbb\xbf" + build().to_bytes()
    with pytest.raises(SessionFormatError) as info:
        read(data)
    (p,) = info.value.problems
    assert (p.code, p.line) == ("header", 1)
    assert "UTF-8 byte order mark" in p.message and "Expecting value" not in p.message
    lines = split_lines(build().to_bytes())
    lines[2] = b"\xef\xbb\xbf" + lines[2]
    s = read(b"\n".join(lines) + b"\n")
    assert codes(s) == [("json", 3)]
    assert "UTF-8 byte order mark" in s.all_problems()[0].message


def test_crlf_line_endings_are_tolerated_as_whitespace():
    # JSON allows the CR as trailing whitespace; nothing hashed changes
    data = build().to_bytes().replace(b"\n", b"\r\n")
    assert codes(read(data)) == []


# -- the header ---------------------------------------------------------------------------------


def _with_header(header: bytes) -> bytes:
    lines = split_lines(build().to_bytes())
    return header + b"\n" + b"\n".join(lines[1:]) + b"\n"


def _header_error(data: bytes) -> list[tuple[str, int | None]]:
    with pytest.raises(SessionFormatError) as info:
        read(data)
    return [(p.code, p.line) for p in info.value.problems]


def test_empty_file_is_refused():
    assert _header_error(b"") == [("header", 1)]


@pytest.mark.parametrize("header", [b"not json", b'{"type":"session",', b"\xff\xfe", b"[1,2]", b'"session"'])
def test_header_not_a_json_object(header):
    assert _header_error(_with_header(header)) == [("header", 1)]


def test_header_not_of_type_session():
    h = json.loads(build().header.canonical_line())
    h["type"] = "config"
    assert _header_error(_with_header(json.dumps(h).encode())) == [("header", 1)]


def test_first_line_an_entry_is_not_a_header():
    lines = split_lines(build().to_bytes())
    assert _header_error(b"\n".join(lines[1:])) == [("header", 1)]


@pytest.mark.parametrize("fmt", ["agentsession/0.x", "agentsession-0.5", "agentsession/0", "agentsession/0.5.1", "0.5", 5, None])
def test_bad_format_string(fmt):
    h = json.loads(build().header.canonical_line())
    h["format"] = fmt
    assert _header_error(_with_header(json.dumps(h).encode())) == [("format", 1)]


def test_missing_format():
    h = json.loads(build().header.canonical_line())
    del h["format"]
    assert _header_error(_with_header(json.dumps(h).encode())) == [("format", 1)]


@pytest.mark.parametrize("fmt", ["agentsession/0.15", "agentsession/0.99", "agentsession/1.0", "agentsession/2.3"])
def test_unsupported_format(fmt):
    h = json.loads(build().header.canonical_line())
    h["format"] = fmt
    assert _header_error(_with_header(json.dumps(h).encode())) == [("format", 1)]


@pytest.mark.parametrize("minor", [5, 9, 10, 11, 14])
def test_supported_hashed_minors_read_as_they_stand(minor):
    h = json.loads(build().header.canonical_line())
    h["format"] = f"agentsession/0.{minor}"
    s = read(_with_header(json.dumps(h).encode()))
    assert codes(s) == [] and not s.migrated


def test_header_without_id_and_with_bad_base_or_media():
    for change in ({"id": ""}, {"base": "c0000001"}, {"media": "attached"}):
        h = json.loads(build().header.canonical_line())
        h.update(change)
        assert _header_error(_with_header(json.dumps(h).encode())) == [("header", 1)]


def test_header_unknown_members_are_kept():
    b = build(2, cwd="/x", **{"acme:ws": {"host": "h", "n": [1, 2.5]}})
    s = read(b.to_bytes())
    assert s.header.data["acme:ws"] == {"host": "h", "n": [1, 2.5]}
    assert s.canonical_bytes() == b.to_bytes()


# -- base and prefix ---------------------------------------------------------------------------


def _forked(own: int = 2, at: int = 2):
    """An origin session and a fork of it at entry ``at``, with ``own`` entries of its own."""
    origin = build(5)
    base = origin.entries[at]
    fork = SessionBuilder(
        Header.new("0199c000-0000-7000-8000-000000000002", created_at=ts(50), base=base.id, parent_session=SID),
        prefix=origin.entries[: at + 1],
    )
    for i in range(own):
        fork.append("item", ts=ts(51 + i), item={"n": f"own {i}"})
    return origin, fork


def test_fork_reads_clean():
    origin, fork = _forked()
    s = read(fork.to_bytes())
    assert codes(s) == []
    assert s.tree.prefix == frozenset(e.id for e in origin.entries[:2])
    assert s.leaf == fork.entries[-1].id


def test_fork_with_nothing_of_its_own_resumes_at_its_base():
    _, fork = _forked(own=0)
    s = read(fork.to_bytes())
    assert codes(s) == [] and s.leaf == fork.header.base


def test_prefix_that_is_not_a_path():
    origin, fork = _forked()
    # a sibling slipped into the prefix: the file no longer opens with the path to the base
    stray = make_entry("item", origin.entries[0].id, ts=ts(40), item={"n": "stray"})
    entries = fork.entries[:1] + [stray] + fork.entries[1:]
    s = read(fork.header.canonical_line() + b"".join(e.canonical_line() for e in entries))
    # the stray looks like the next step; the break shows at the entry after it
    assert codes(s) == [("base", 4)]


def test_prefix_not_starting_at_a_root():
    origin, fork = _forked()
    entries = fork.entries[1:]  # drop the root
    s = read(fork.header.canonical_line() + b"".join(e.canonical_line() for e in entries))
    assert codes(s) == [("parent", 2), ("base", 2)]


def test_base_absent_from_the_file():
    origin, _ = _forked()
    h = Header.new("0199c000-0000-7000-8000-000000000003", created_at=ts(50), base="sha256:" + "b" * 64)
    s = read(h.canonical_line() + b"".join(e.canonical_line() for e in origin.entries))
    assert codes(s) == [("base", None)]
    assert "sha256:" + "b" * 64 in s.all_problems()[0].message


def test_own_entry_hanging_from_the_prefix():
    origin, fork = _forked(own=1)
    wrong = make_entry("item", origin.entries[0].id, ts=ts(60), item={"n": "from the prefix"})
    s = read(fork.to_bytes() + wrong.canonical_line())
    assert codes(s) == [("base", 6)]


def test_second_root_in_a_based_file():
    _, fork = _forked(own=1)
    root = make_entry("config", None, ts=ts(61), model="m")
    s = read(fork.to_bytes() + root.canonical_line())
    assert codes(s) == [("base", 6)]


def test_own_entries_may_branch_among_themselves():
    _, fork = _forked(own=2)
    fork.branch(fork.entries[-2].id, "item", ts=ts(70), item={"n": "own branch"})
    fork.branch(fork.header.base, "item", ts=ts(71), item={"n": "from the base"})
    assert codes(read(fork.to_bytes())) == []


# -- resolve --------------------------------------------------------------------------------


def test_resolve_by_full_id_and_prefix():
    b = build(20)
    s = read(b.to_bytes())
    e = s.entries[5]
    assert s.resolve(e.id) is e
    assert s.resolve(e.id[:19]) is e
    assert s.resolve(e.id[7:19]) is e
    assert s.resolve(e.id[7:]) is e


def test_resolve_ambiguous_prefix():
    """A prefix of 4 digits two ids share (the file grown until two do) is ``ambiguous``,
    listing both, as the store's names say it (format.names.resolve_entry_name)."""
    b = build(1500)
    s = read(b.to_bytes())
    firsts: dict[str, list[str]] = {}
    for e in s.entries:
        firsts.setdefault(e.id[7:11], []).append(e.id)
    shared, ids = next((d, ids) for d, ids in firsts.items() if len(ids) > 1)  # 1,500 ids over 65,536: one repeats
    with pytest.raises(AmbiguousNameError, match=r"is the start of \d entry ids in test.jsonl: ") as info:
        s.resolve(shared)
    assert info.value.candidates == sorted(ids) and info.value.code == "ambiguous"
    with pytest.raises(AmbiguousNameError):
        s.resolve("sha256:" + shared)


@pytest.mark.parametrize("name", ["sha256:" + "f" * 64, "ffff" * 4, "c0000001"])
def test_resolve_unknown(name):
    s = read(build(3).to_bytes())
    if any(e.id.startswith("sha256:" + name[-16:]) for e in s.entries):  # pragma: no cover
        pytest.skip("astronomically unlikely")
    with pytest.raises(NoSuchEntryError, match=f"no such entry: {name} "):
        s.resolve(name)


@pytest.mark.parametrize("name", ["zzz", "", "sha256:", "abc", "sha256:abc", "ABCD", "g" * 5])
def test_resolve_refuses_what_is_no_name(name):
    """Fewer than 4 hex digits, or not lowercase hex (and no legacy_id): ``bad_name``,
    whatever the file holds (the old reader took any length, and answered no_entry)."""
    s = read(build(3).to_bytes())
    with pytest.raises(BadNameError, match="is not an entry id nor a prefix of one") as info:
        s.resolve(name)
    assert info.value.code == "bad_name"


def test_resolve_by_legacy_id():
    s = read(_legacy_file())
    e = s.resolve("i1")
    assert e.legacy_id == "i1" and e.id.startswith("sha256:")
    assert s.resolve(e.id) is e


# -- migration of files before 0.5 ---------------------------------------------------------------


LEGACY_SID = "0199c000-0000-7000-8000-0000000000aa"


def _legacy_lines() -> list[dict]:
    msg = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    return [
        {"type": "session", "format": "agentsession/0.4", "id": LEGACY_SID, "created_at": "2026-09-17T12:00:00Z", "payload": "openresponses/2026-04-24"},
        {"type": "config", "id": "c1", "parent": None, "ts": "2026-09-17T14:00:00+02:00", "model": "gpt-5"},
        {"type": "item", "id": "i1", "parent": "c1", "ts": "2026-09-17T07:00:01.500-05:00", "item": msg},
        {"type": "response", "id": "r1", "parent": "i1", "ts": "2026-09-17T12:00:01.1234567891234Z", "response_id": "resp_1"},
        {"type": "label", "id": "l1", "parent": "r1", "ts": "2026-09-17t12:00:02z", "target": "i1", "label": "checkpoint"},
        {"type": "queued", "id": "q1", "parent": "l1", "ts": "2026-12-31T23:59:60.25Z", "item": msg},
        {"type": "item", "id": "i2", "parent": "q1", "ts": "2026-09-17T12:00:04Z", "item": msg, "queued_from": "q1", "response": "r1"},
        {"type": "compaction", "id": "k1", "parent": "i2", "ts": "2026-09-17T12:00:05Z", "first_kept": "i2", "summary": msg},
        {"type": "branch_summary", "id": "b1", "parent": "k1", "ts": "2026-09-17T12:00:06Z", "from": "r1", "summary": msg},
        {"type": "item", "id": "j1", "parent": "b1", "ts": "2026-09-17T12:00:07Z", "item": msg,
         "parents": [{"entry": "i1"}, {"entry": "x9", "session": "0199c000-0000-7000-8000-0000000000bb"}, {"entry": "r1", "session": LEGACY_SID}]},
        {"type": "outcome", "id": "o1", "parent": "j1", "ts": "2026-09-17T12:00:08Z", "target": "zz-nowhere", "label": "thumbs_up"},
    ]


def _legacy_file() -> bytes:
    return dump(_legacy_lines())


def test_legacy_file_is_migrated():
    s = read(_legacy_file())
    assert s.migrated
    assert codes(s) == []
    assert [e.legacy_id for e in s.entries] == ["c1", "i1", "r1", "l1", "q1", "i2", "k1", "b1", "j1", "o1"]
    assert all(e.id.startswith("sha256:") and e.verified for e in s.entries)
    new = {e.legacy_id: e.id for e in s.entries}
    by_old = {e.legacy_id: e for e in s.entries}
    # ts in the one admitted form: offsets to UTC, fraction truncated to nine digits, second 60 as 59
    assert by_old["c1"].ts == "2026-09-17T12:00:00Z"
    assert by_old["i1"].ts == "2026-09-17T12:00:01.5Z"
    assert by_old["r1"].ts == "2026-09-17T12:00:01.123456789Z"
    assert by_old["l1"].ts == "2026-09-17T12:00:02Z"
    assert by_old["q1"].ts == "2026-12-31T23:59:59.25Z"
    # parent and every entry-naming member rewritten to the new ids
    assert [e.parent for e in s.entries] == [None] + [e.id for e in s.entries[:-1]]
    assert by_old["l1"].target == new["i1"]
    assert by_old["i2"].get("queued_from") == new["q1"]
    assert by_old["k1"].get("first_kept") == new["i2"]
    assert by_old["b1"].get("from") == new["r1"]
    # an item's response is a provider's response_id, never rewritten
    assert by_old["i2"].get("response") == "r1"
    # parents: into this file rewritten, into another session kept as written
    assert by_old["j1"].get("parents") == [
        {"entry": new["i1"]},
        {"entry": "x9", "session": "0199c000-0000-7000-8000-0000000000bb"},
        {"entry": new["r1"], "session": LEGACY_SID},
    ]
    # unresolvable references keep their strings and are reported in `unresolved`
    assert by_old["o1"].target == "zz-nowhere"
    notes = [(p.line, p.code) for p in s.unresolved]
    assert notes == [(10, "unresolved"), (11, "unresolved")]
    assert "x9" in s.unresolved[0].message and "zz-nowhere" in s.unresolved[1].message
    # the leaf, by the resume rule, is the last entry
    assert s.leaf == s.entries[-1].id


def test_migration_is_deterministic_and_verifies_as_written():
    a = read(_legacy_file())
    b = read(_legacy_file())
    assert [e.id for e in a.entries] == [e.id for e in b.entries]
    # the migrated entries, written as a native file, read clean to the same ids
    native = Header.new(LEGACY_SID, created_at="2026-09-17T12:00:00Z")
    again = read(native.canonical_line() + b"".join(e.canonical_line() for e in a.entries))
    assert codes(again) == [] and not again.migrated
    assert [e.id for e in again.entries] == [e.id for e in a.entries]


def test_migrated_ids_commit_to_the_legacy_id():
    lines = _legacy_lines()
    other = [dict(o) for o in lines]
    other[1]["id"] = "c1-renamed"
    other[2]["parent"] = "c1-renamed"
    a, b = read(dump(lines)), read(dump(other))
    assert a.entries[0].id != b.entries[0].id
    assert a.entries[1].id != b.entries[1].id  # the child's id commits to its parent's


def test_legacy_parent_that_names_nothing():
    lines = _legacy_lines()[:4]
    lines[3]["parent"] = "nope"
    s = read(dump(lines))
    assert s.migrated
    assert codes(s) == [("parent", 4)]


def test_legacy_bad_ts_is_reported():
    lines = _legacy_lines()[:3]
    lines[2]["ts"] = "yesterday"
    s = read(dump(lines))
    assert codes(s) == [("ts", 3)]


def test_legacy_file_never_rewritten(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_bytes(_legacy_file())
    read_session(path)
    assert path.read_bytes() == _legacy_file()


@pytest.mark.parametrize("minor", [1, 2, 3, 4])
def test_every_pre_hash_minor_is_migrated(minor):
    lines = _legacy_lines()
    lines[0]["format"] = f"agentsession/0.{minor}"
    s = read(dump(lines))
    assert s.migrated and codes(s) == []


def test_legacy_body_with_content_is_noted_unresolved_not_dropped():
    """RFC 0001 Versioning: a pre-0.5 body with a reserved name is reported as
    unresolved; the entry still migrates and its children still find it."""
    from agentsession_cas import read_session_bytes

    lines = [
        b'{"type":"session","format":"agentsession/0.4","id":"old","created_at":"2026-09-17T12:00:00Z","payload":"openresponses/2026-04-24"}',
        b'{"type":"item","id":"a1","parent":null,"ts":"2026-09-17T12:00:01Z","content":"legacy text","item":{"type":"message"}}',
        b'{"type":"item","id":"a2","parent":"a1","ts":"2026-09-17T14:00:02+02:00","item":{"type":"message"}}',
    ]
    sf = read_session_bytes(b"\n".join(lines) + b"\n")
    assert sf.migrated
    assert sf.problems == []
    assert [e.legacy_id for e in sf.entries] == ["a1", "a2"]
    assert sf.entries[1].parent == sf.entries[0].id
    assert sf.entries[1].ts == "2026-09-17T12:00:02Z"
    assert [(p.line, p.code) for p in sf.unresolved] == [(2, "unresolved")]
    assert "content" in sf.unresolved[0].message


def test_read_restores_the_collector_state():
    """The reader pauses the cyclic collector for a read and puts it back as it was."""
    import gc

    from agentsession_cas import read_session_bytes

    data = b'{"type":"session","format":"agentsession/0.14","id":"g","created_at":"2026-09-17T12:00:00Z","payload":"p"}\n'
    assert gc.isenabled()
    read_session_bytes(data + b"{broken\n")
    assert gc.isenabled()
    gc.disable()
    try:
        read_session_bytes(data)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_migrated_file_is_never_rewritten():
    from agentsession_cas import AgentSessionError, read_session_bytes

    data = (
        b'{"type":"session","format":"agentsession/0.4","id":"old","created_at":"2026-09-17T12:00:00Z","payload":"p"}\n'
        b'{"type":"item","id":"a1","parent":null,"ts":"2026-09-17T12:00:01Z","item":{}}\n'
    )
    sf = read_session_bytes(data)
    assert sf.migrated
    with pytest.raises(AgentSessionError, match="never rewritten"):
        sf.canonical_bytes()


def test_keep_objects_keeps_exactly_the_bytes_a_store_writes(tmp_path):
    """read_session(keep_objects=True) keeps each entry's content and envelope bytes
    (what an import writes); they are entry_objects' bytes, and hash to the entry."""
    from agentsession_cas import Header, SessionBuilder
    from agentsession_cas.format.hashing import entry_objects, sha256_ref

    b = SessionBuilder(Header.new("keep-objects"))
    b.append("config", ts="2026-10-05T09:00:00Z", model="m", extra={"temperature": 0.2, "big": 10**17})
    b.append("item", ts="2026-10-05T09:00:01Z", item={"type": "message", "role": "user", "content": "h\u00e9 \U0001f600"})
    path = tmp_path / "k.jsonl"
    b.write(path)
    kept = read_session(path, keep_objects=True)
    plain = read_session(path)
    for e, p in zip(kept.entries, plain.entries):
        assert p.objects is None
        content, env = e.objects
        _, chash, want_content, want_env = entry_objects(p.data)
        assert (content, env) == (want_content, want_env)
        assert sha256_ref(content) == e.content_hash == chash and sha256_ref(env) == e.id
