"""RFC 0001 rules the format core read wrongly or not at all (session 43): a file of an
earlier minor read under a later minor's rules, ``parents`` checked as the RFC says, and
header rules verify and import agree on."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from agentsession_cas.format.canonical import canonical_bytes
from agentsession_cas.format.context import build_context, context_at
from agentsession_cas.format.reader import read_session_bytes
from agentsession_cas.format.rules import verify_session

TS = "2026-09-17T12:00:0{}Z"
MSG = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}


def h(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def make(type_: str, parent: str | None, n: int, *, parents=None, **body) -> dict:
    """An entry as a writer outside this library writes it (any ``parents`` as given)."""
    env = {"type": type_, "parent": parent, "ts": TS.format(n), "content": h(canonical_bytes(body))}
    if parents is not None:
        env["parents"] = parents
    e = {"type": type_, "parent": parent, "ts": TS.format(n), **body}
    if parents is not None:
        e["parents"] = parents
    e["id"] = h(canonical_bytes(env))
    return e


def header(fmt: str, n: int = 0, **extra) -> dict:
    return {"type": "session", "format": f"agentsession/{fmt}", "id": f"0191c4a8-0000-7000-8000-0000000000{n:02d}",
            "created_at": "2026-09-17T12:00:00Z", "payload": "openresponses/2026-04-24", **extra}


def file_bytes(*objs: dict) -> bytes:
    return b"".join(canonical_bytes(o) + b"\n" for o in objs)


def verified(data: bytes):
    return verify_session(read_session_bytes(data))


def codes(report) -> list[str]:
    return [p.code for p in report.problems]


# ---------------------------------------------------------------------------
# 1. a member a later minor defines is not read in a file of an earlier one


def _omit_file(fmt: str) -> bytes:
    """A config whose ``omit`` names the one item, and a response whose request_hash is
    the request with the item sent (as a file before 0.11, which defines no omit, reads it)."""
    u = make("item", None, 1, item=MSG)
    c = make("config", u["id"], 2, model="m", omit={"items": [u["id"]]})
    req = {"model": "m", "input": [MSG], "store": False}
    r = make("response", c["id"], 3, response_id="resp_1", request_hash=h(canonical_bytes(req)))
    return file_bytes(header(fmt), u, c, r)


@pytest.mark.parametrize("fmt", ["0.9", "0.10"])
def test_omit_is_not_read_in_a_file_before_0_11(fmt):
    report = verified(_omit_file(fmt))
    assert report.ok, report.problems
    sf = read_session_bytes(_omit_file(fmt))
    assert [c.entry.id for c in context_at(sf, sf.entries[-1].id).omitted] == []


def test_omit_is_read_in_a_0_11_file():
    report = verified(_omit_file("0.11"))
    assert not report.ok  # the same bytes under 0.11: the item is omitted, the hash mismatches


def _of_file(fmt: str) -> tuple[bytes, list]:
    """Three configs: c1 puts [a, b] in force, c2 [c], c3 keeps 2 ``of`` c1 (0.11) or, where
    ``of`` is a member the minor does not define, 2 of the list in force (which has 1)."""
    a = {"id": "a", "reason": "budget", "size": 1}
    b = {"id": "b", "reason": "budget", "size": 2}
    c = {"id": "c", "reason": "budget", "size": 3}
    c1 = make("config", None, 1, model="m", instructions_omitted=[a, b])
    c2 = make("config", c1["id"], 2, instructions_omitted=[c])
    c3 = make("config", c2["id"], 3, instructions_omitted=[{"keep": 2, "of": c1["id"]}])
    return file_bytes(header(fmt), c1, c2, c3), [a, b]


def test_an_omitted_keeps_of_is_read_from_0_11_only():
    data, ab = _of_file("0.11")
    assert build_context(read_session_bytes(data).entries, 11).settings.as_dict()["instructions_omitted"] == ab
    data, _ = _of_file("0.10")
    sf = read_session_bytes(data)
    omitted = context_at(sf, sf.entries[-1].id).settings.as_dict()["instructions_omitted"]
    assert omitted == [{"keep": 2, "of": sf.entries[0].id}]  # a keep past the list in force: kept as written


def _left_force_file(fmt: str) -> bytes:
    """A part ``p`` leaves force and comes back named by its hash alone (0.11: the text it
    had; before: a hash naming no part in force, unresolved, so the instructions fall back)."""
    c1 = make("config", None, 1, model="m", instructions_parts=[{"id": "p", "text": "P"}])
    c2 = make("config", c1["id"], 2, instructions_parts=[{"id": "q", "text": "Q"}])
    c3 = make("config", c2["id"], 3, instructions_parts=[{"id": "p", "hash": h(b"P")}])
    return file_bytes(header(fmt), c1, c2, c3)


def test_a_hash_names_a_part_out_of_force_from_0_11_only():
    sf = read_session_bytes(_left_force_file("0.11"))
    assert context_at(sf, sf.entries[-1].id).settings.instructions == "P"
    sf = read_session_bytes(_left_force_file("0.10"))
    assert [p.unresolved for p in context_at(sf, sf.entries[-1].id).settings.parts] == [True]


def test_a_store_imports_a_0_10_file_holding_omit(tmp_path: Path):
    from agentsession_cas import Store

    store = Store.init(tmp_path / "s")
    f = tmp_path / "f.jsonl"
    f.write_bytes(_omit_file("0.10"))
    session = store.import_file(f)
    assert store.export(session.id) == f.read_bytes()


# ---------------------------------------------------------------------------
# 2, 3. parents: never empty nor null, sorted


def _three() -> tuple[dict, dict, dict]:
    a = make("item", None, 1, item=MSG)
    b = make("item", a["id"], 2, item={**MSG, "content": [{"type": "input_text", "text": "b"}]})
    c = make("item", a["id"], 3, item={**MSG, "content": [{"type": "input_text", "text": "c"}]})
    return a, b, c


def _parents_file(refs) -> bytes:
    a, b, c = _three()
    d = make("item", a["id"], 4, parents=refs, item={**MSG, "content": [{"type": "input_text", "text": "d"}]})
    return file_bytes(header("0.14"), a, b, c, d)


def _ids() -> tuple[str, str]:
    _, b, c = _three()
    lo, hi = sorted([b["id"], c["id"]])
    return lo, hi


@pytest.mark.parametrize("refs", [[], None])
def test_an_empty_or_null_parents_is_a_parents_problem(refs, tmp_path: Path):
    """The envelope leaves an empty parents out, so a rewrite drops the member unnoticed:
    verify reports it, and import refuses rather than export other bytes."""
    a = make("item", None, 1, item=MSG)
    b = make("item", a["id"], 2, item=MSG, x=1)
    b["parents"] = refs  # (the id is the same with or without it)
    data = file_bytes(header("0.14"), a, b)
    assert codes(verified(data)) == ["parents"]
    from agentsession_cas import Store
    from agentsession_cas.errors import AgentSessionError

    store = Store.init(tmp_path / "s")
    f = tmp_path / "f.jsonl"
    f.write_bytes(data)
    with pytest.raises(AgentSessionError):
        store.import_file(f)


@pytest.mark.parametrize("refs", [[], None])
def test_a_store_append_of_an_empty_or_null_parents_is_refused(refs, tmp_path: Path):
    from agentsession_cas import Store
    from agentsession_cas.errors import AgentSessionError

    store = Store.init(tmp_path / "s")
    session = store.create(header("0.14"))
    with pytest.raises(AgentSessionError, match="parents"):
        session.append({"type": "item", "parent": None, "ts": TS.format(1), "parents": refs, "item": MSG})
    assert store.export(session.id).count(b"\n") == 1


def test_parents_references_must_be_sorted():
    lo, hi = _ids()
    assert codes(verified(_parents_file([{"entry": lo}, {"entry": hi}]))) == []
    assert codes(verified(_parents_file([{"entry": hi}, {"entry": lo}]))) == ["parents"]
    other = "sha256:" + "0" * 64
    assert codes(verified(_parents_file([{"entry": lo}, {"session": "zzz", "entry": other}]))) == []
    assert codes(verified(_parents_file([{"session": "zzz", "entry": other}, {"entry": lo}]))) == ["parents"]
    # a reference into another session by a name not a hash: the corpus's converge.jsonl
    # holds such (a session migrated from before 0.5 keeps its old ids), and verifies
    assert codes(verified(_parents_file([{"session": "01J-other", "entry": "c4"}]))) == []


def test_a_store_append_of_unsorted_parents_is_refused(tmp_path: Path):
    """The store appends the body it is given and hashes it as given: it does not reorder
    a member the caller wrote (the caller's id would not be the store's)."""
    from agentsession_cas import Store
    from agentsession_cas.errors import AgentSessionError

    a, b, c = _three()
    store = Store.init(tmp_path / "s")
    session = store.create(header("0.14"))
    for e in (a, b, c):
        session.append({k: v for k, v in e.items() if k != "id"})
    lo, hi = _ids()
    body = {"type": "item", "parent": a["id"], "ts": TS.format(4), "item": MSG}
    with pytest.raises(AgentSessionError, match="sorted"):
        session.append({**body, "parents": [{"entry": hi}, {"entry": lo}]})
    session.append({**body, "parents": [{"entry": lo}, {"entry": hi}]})


# ---------------------------------------------------------------------------
# 4. header rules verify and import share


def _leaf_base_file() -> bytes:
    a = make("item", None, 1, item={"type": "message", "role": "user", "content": []})
    lbl = make("label", a["id"], 2, target=a["id"], label="leaf")
    return file_bytes(header("0.10", base=lbl["id"]), a, lbl)


def test_a_base_that_is_a_leaf_label_is_a_base_problem(tmp_path: Path):
    from agentsession_cas import Store
    from agentsession_cas.errors import AgentSessionError

    assert codes(verified(_leaf_base_file())) == ["base"]
    f = tmp_path / "fork.jsonl"
    f.write_bytes(_leaf_base_file())
    store = Store.init(tmp_path / "s")
    with pytest.raises(AgentSessionError, match="line 3: base .* is a leaf label"):
        store.import_file(f)


@pytest.mark.parametrize("bad", [b'"\\udc80"', b"9007199254740993"])
def test_a_header_that_is_not_ijson_is_refused_by_verify_and_import_alike(bad, tmp_path: Path):
    from agentsession_cas import Store
    from agentsession_cas.errors import SessionFormatError
    from agentsession_cas.format.reader import verify_file

    a = make("item", None, 1, item=MSG)
    hdr = canonical_bytes(header("0.10"))[:-1] + b',"x":' + bad + b"}"
    f = tmp_path / "h.jsonl"
    f.write_bytes(hdr + b"\n" + canonical_bytes(a) + b"\n")
    with pytest.raises(SessionFormatError) as read:
        read_session_bytes(f.read_bytes(), source=str(f))
    assert [p.code for p in read.value.problems] == ["ijson"]
    with pytest.raises(SessionFormatError, match="line 1: header is not I-JSON"):
        verify_file(f)
    store = Store.init(tmp_path / "s")
    with pytest.raises(SessionFormatError, match=f"^{f}: line 1: header is not I-JSON"):
        store.import_file(f)


# ---------------------------------------------------------------------------
# 5. instructions beside instructions_parts equal the parts' join


def test_instructions_that_are_not_the_parts_join_are_a_problem():
    parts = [{"id": "a", "text": "A"}, {"id": "b", "text": "B"}]
    bad = make("config", None, 1, model="m", instructions="X", instructions_parts=parts)
    assert codes(verified(file_bytes(header("0.14"), bad))) == ["instructions-join"]
    good = make("config", None, 1, model="m", instructions="A\n\nB", instructions_parts=parts)
    assert codes(verified(file_bytes(header("0.14"), good))) == []
    # a part the path cannot rebuild: the string stands, as RFC 0001 says a reader takes it
    c0 = make("config", None, 1, model="m", instructions_parts=parts)
    unresolved = make("config", c0["id"], 2, instructions="X", instructions_parts=[{"keep": 3}])
    assert codes(verified(file_bytes(header("0.14"), c0, unresolved))) == []


# ---------------------------------------------------------------------------
# 6. a sidecar reference is a whole string value, exactly the URL


def test_only_a_whole_string_value_is_a_sidecar_reference(tmp_path: Path):
    from agentsession_cas.format.media import sidecar_names
    from agentsession_cas.format.reader import verify_file

    name = h(b"\x89PNG fake image")
    url = "sidecar:" + name
    assert sidecar_names(canonical_bytes({"image_url": url, "type": "input_image"})) == [name]
    assert sidecar_names(b'{"a": [ "' + url.encode() + b'" ]}') == [name]  # a line not canonical
    for text in ("what is " + url + "?", "id sidecar:sha256:" + "c" * 65, '"' + url + '"'):
        assert sidecar_names(canonical_bytes({"text": text})) == []
    assert sidecar_names(canonical_bytes({url: 1})) == []  # a member name is no value

    sid = "0191c4a8-0000-7000-8000-0000000000b4"
    img = make("item", None, 1, item={"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": url}]})
    txt = make("item", img["id"], 2, item={"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "what is sidecar:sha256:" + "ab" * 32 + "?"}]})
    f = tmp_path / "s.jsonl"
    f.write_bytes(file_bytes({**header("0.14", 4), "id": sid, "media": "sidecar"}, img, txt))
    (tmp_path / sid).mkdir()
    (tmp_path / sid / name[7:]).write_bytes(b"\x89PNG fake image")
    assert verify_file(f).problems == []
    (tmp_path / sid / name[7:]).unlink()
    assert [p.code for p in verify_file(f).problems] == ["missing-blob"]
