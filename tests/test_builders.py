"""Writer helpers (issue 15): config entries from a request and deltas between
settings, compaction and branch-summary builders, normalising what is not I-JSON,
and typed constructors for env, outcome, queued (and draining), withdrawal; each
checked by appending what it builds and reading the session back."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsession_cas import Header, open_store, read_session_bytes, verify_session
from agentsession_cas.errors import AppendRefusedError, EntryError, NormalisationError
from agentsession_cas.format.builders import (
    branch_summary,
    compaction,
    compaction_from,
    compaction_keeping,
    config_delta,
    config_from_request,
    drain,
    env,
    outcome,
    queued,
    settings_of,
    withdrawal,
)
from agentsession_cas.format.context import EMPTY_SETTINGS, build_context, canonical_request, request_hash_for, text_hash
from agentsession_cas.format.normalise import check_normalised, normalise, normalise_json, normalised_body
from agentsession_cas.format.rules import analyze_runs
from agentsession_cas.format.runs import inbox_of
from agentsession_cas.store import Store

_N = iter(range(10**9))
TOOL_A = {"type": "function", "name": "a", "parameters": {"type": "object"}}
TOOL_B = {"type": "function", "name": "b", "parameters": {"type": "object"}}


def mem() -> Store:
    return open_store(f"memory:builders-{next(_N)}", create=True)


def user(text: str = "hi") -> dict:
    return {"type": "item", "item": {"type": "message", "role": "user", "content": text}}


def said(text: str) -> dict:
    return {"type": "item", "item": {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}}


# ---------------------------------------------------------------------------
# config


REQUEST = {"model": "gpt-5", "instructions": "Be brief.", "tools": [TOOL_A], "reasoning": {"effort": "low"},
           "temperature": 0.2, "input": [{"type": "message", "role": "user", "content": "x"}], "store": True,
           "previous_response_id": "resp_0"}


def test_a_config_from_a_request_rebuilds_the_request_it_came_from():
    body = config_from_request(REQUEST)
    assert body == {"type": "config", "model": "gpt-5", "instructions": "Be brief.", "tools_added": [TOOL_A],
                    "reasoning": {"effort": "low"}, "extra": {"temperature": 0.2}}
    sent = {k: v for k, v in REQUEST.items() if k != "previous_response_id"} | {"store": False}
    assert canonical_request(EMPTY_SETTINGS.apply(body), REQUEST["input"]) == sent
    parts = [{"id": "product", "text": "Be brief.", "source": "product"}, {"id": "agentsmd", "text": "Use tabs."}]
    with_parts = config_from_request({**REQUEST, "instructions": None}, parts=parts)
    assert with_parts["instructions"] == "Be brief.\n\nUse tabs." and with_parts["instructions_parts"] == parts
    with pytest.raises(EntryError, match="joined"):
        config_from_request(REQUEST, parts=parts)
    with pytest.raises(EntryError, match="twice"):
        config_from_request({}, parts=[{"id": "x", "text": ""}, {"id": "x", "text": "y"}])


def check_delta(before, request, **kw):
    delta = config_delta(before, request, **kw)
    after = before if delta is None else before.apply(delta)
    target = settings_of(request, parts=kw.get("parts"))
    assert after.request_members() == target.request_members()
    if kw.get("parts") is not None:
        assert [(p.id, p.text, p.source) for p in after.parts] == [(p["id"], p["text"], p.get("source")) for p in kw["parts"]]
    return delta


def test_config_deltas_say_only_what_changed_and_rebuild_the_request():
    before = settings_of(REQUEST)
    assert check_delta(before, REQUEST) is None
    assert check_delta(before, {**REQUEST, "model": "gpt-5-mini"}) == {"type": "config", "model": "gpt-5-mini"}
    tool_a2 = {**TOOL_A, "description": "new"}
    assert check_delta(before, {**REQUEST, "tools": [tool_a2, TOOL_B]}) == {"type": "config", "tools_added": [tool_a2, TOOL_B]}
    assert check_delta(before, {**REQUEST, "tools": []}) == {"type": "config", "tools_removed": ["a"]}
    assert check_delta(before, {**REQUEST, "temperature": None, "top_p": 1}) == {
        "type": "config", "extra": {"top_p": 1, "temperature": None}}
    # what a delta cannot say (reasoning cleared, tools reordered) is written whole
    full = check_delta(before, {**REQUEST, "reasoning": None})
    assert full["replace"] is True and "reasoning" not in full
    two = settings_of({**REQUEST, "tools": [TOOL_A, TOOL_B]})
    assert check_delta(two, {**REQUEST, "tools": [TOOL_B, TOOL_A]})["replace"] is True
    omitted = [{"id": "m/1", "reason": "budget", "size": 20}]
    assert check_delta(before, REQUEST, omitted=omitted) == {"type": "config", "instructions_omitted": omitted}
    assert check_delta(before.apply({"instructions_omitted": omitted}), REQUEST, omitted=omitted) is None


def parts_of(n: int, changed: dict | None = None, drop: int | None = None) -> list[dict]:
    out = [{"id": f"m{i}", "text": (changed or {}).get(i, f"part {i}")} for i in range(1, n + 1)]
    return [p for i, p in enumerate(out, start=1) if i != drop]


def test_parts_deltas_are_the_rfc_examples():
    before = settings_of({}, parts=parts_of(126))
    delta = check_delta(before, {}, parts=parts_of(126, changed={61: "new"}))
    assert delta == {"type": "config", "instructions_parts": [{"keep": 60}, {"id": "m61", "text": "new"}, {"keep": 65}]}
    delta = check_delta(before, {}, parts=parts_of(126, drop=61))
    assert delta == {"type": "config",
                     "instructions_parts": [{"keep": 60}, {"id": "m62", "hash": text_hash("part 62")}, {"keep": 64}]}
    assert check_delta(before, {}, parts=parts_of(126)) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), unique=True, max_size=6),
       st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), unique=True, max_size=6),
       st.sets(st.sampled_from(["a", "b", "c", "d", "e", "f"])), st.booleans())
def test_any_parts_delta_rebuilds_the_parts(old, new, changed, sourced):
    before = settings_of({}, parts=[{"id": i, "text": f"t{i}"} for i in old])
    parts = [{"id": i, "text": f"t{i}" + ("*" if i in changed else ""), **({"source": "s"} if sourced and i == "a" else {})}
             for i in new]
    check_delta(before, {}, parts=parts)


def test_config_entries_built_here_verify_on_a_path():
    s = mem().create(Header.new("cfg"))
    s.append(config_from_request(REQUEST))
    s.append(user())
    before = build_context(s.store.path_to(s.head)).settings
    s.append(config_delta(before, {**REQUEST, "model": "gpt-5-mini", "tools": [TOOL_B]}))
    s.append(said("ok"))
    path = s.store.path_to(s.head)
    ctx = build_context(path)
    assert ctx.settings.model == "gpt-5-mini" and [t["name"] for t in ctx.settings.tools] == ["b"]
    response = {"type": "response", "response_id": "r1"}
    s.append({**response, "request_hash": request_hash_for(path, response)})
    report = verify_session(read_session_bytes(s.projection()))
    assert report.ok and report.counts()["verified"] == 1


# ---------------------------------------------------------------------------
# compaction and branch summary


SUMMARY = {"type": "message", "role": "system", "content": "earlier: a greeting and two questions"}


def conversation():
    s = mem().create(Header.new("c"))
    s.append(config_from_request({"model": "m"}))
    ids = [s.append(user("u1")).id, s.append(said("a1")).id, s.append(user("u2")).id,
           s.append(said("a2")).id, s.append(user("u3")).id]
    return s, ids


def test_a_compaction_keeps_what_it_says_in_the_order_it_was_sent():
    s, (u1, a1, u2, a2, u3) = conversation()
    path = s.store.path_to(s.head)
    body = compaction(path, u2, SUMMARY, pinned=[a1, u1], tokens_before=500)
    assert body["first_kept"] == u2 and body["tokens_before"] == 500
    assert body["pinned"] == [s.entry(u1).get("item"), s.entry(a1).get("item")]  # request order, not the order given
    assert body["config"] == {"model": "m"}
    s.append(body)
    ctx = build_context(s.store.path_to(s.head))
    assert [i.get("content") for i in ctx.items][:3] == [SUMMARY["content"], "u1", s.entry(a1).get("item")["content"]]
    assert len(ctx.items) == 6
    assert verify_session(read_session_bytes(s.projection())).ok
    # a second fold: the first's summary cannot be first_kept or pinned, only restated
    path = s.store.path_to(s.head)
    with pytest.raises(EntryError, match="not an entry the context at the tip keeps"):
        compaction(path, s.head, SUMMARY)
    with pytest.raises(EntryError, match="not an item entry"):
        compaction(path, u3, SUMMARY, pinned=[s.head])
    again = compaction(path, u3, SUMMARY, pinned=[u2])
    assert again["pinned"] == [s.entry(u2).get("item")]


def test_compaction_refusals_and_index_forms():
    s, (u1, a1, u2, a2, u3) = conversation()
    path = s.store.path_to(s.head)
    with pytest.raises(EntryError, match="not before first_kept"):
        compaction(path, u2, SUMMARY, pinned=[a2])
    with pytest.raises(EntryError, match="not an entry the context"):
        compaction(path, "sha256:" + "0" * 64, SUMMARY)
    with pytest.raises(EntryError, match="an item"):
        compaction(path, u2, {"content": "no type"})
    s.append(compaction(path, u2, SUMMARY))
    later = s.store.path_to(s.head)
    with pytest.raises(EntryError, match="not in the context at the tip"):
        compaction(later, u3, SUMMARY, pinned=[u1])  # folded away by the first compaction
    path = path  # the request at the old tip had five items: u1 a1 u2 a2 u3
    assert compaction_from(path, 2, SUMMARY)["first_kept"] == u2
    assert compaction_keeping(path, 1, SUMMARY)["first_kept"] == u3
    with pytest.raises(EntryError):
        compaction_from(path, 5, SUMMARY)
    with pytest.raises(EntryError):
        compaction_keeping(path, 0, SUMMARY)


def test_a_branch_summary_hangs_where_the_new_branch_continues():
    s, (u1, a1, u2, a2, u3) = conversation()
    body = branch_summary(a1, u3, SUMMARY)
    assert body == {"type": "branch_summary", "parent": a1, "from": u3, "summary": SUMMARY}
    r = s.append(body)
    assert r.outcome == "branched"
    ctx = build_context(s.store.path_to(r.id))
    assert ctx.items[-1] == SUMMARY
    with pytest.raises(EntryError):
        branch_summary(u3, u3, SUMMARY)


# ---------------------------------------------------------------------------
# normalising


def test_normalising_json_bytes_as_the_rfc_says():
    raw = b'{"a":"x\\ud83dy","n":9007199254740993,"bad":"ok\xf0\x9f\x98!","two":"\xff\xfe","fine":[1,2.5,"\\u00e9"]}'
    value, found = normalise_json(raw)
    assert value["a"] == "x\ufffdy" and value["n"] == 9007199254740992
    assert value["bad"] == "ok\ufffd!"  # a cut 4-byte sequence is one maximal subpart: one U+FFFD
    assert value["two"] == "\ufffd\ufffd"
    assert value["fine"] == [1, 2.5, "\u00e9"]
    assert found == [
        {"at": "/a", "was": '"x\\ud83dy"'},
        {"at": "/bad", "raw": base64.b64encode(b'"ok\xf0\x9f\x98!"').decode()},
        {"at": "/n", "was": "9007199254740993"},
        {"at": "/two", "raw": "Iv/+Ig=="},
    ]
    assert normalise_json(b'{"ok": [1, "x", null, true]}') == ({"ok": [1, "x", None, True]}, [])
    for bad, words in [(b'{"a":1e400}', "not finite"), (b'{"a":1,"a":2}', "repeated"), (b'{"a":NaN}', "not a JSON value"),
                       (b'{"\\ud800":1}', "member name"), (b'{"a":1} x', "follows")]:
        with pytest.raises(NormalisationError, match=words):
            normalise_json(bad)


def test_normalising_a_decoded_value_and_the_pointer_order():
    value, found = normalise({"a/b": ["\ud83d"], "x~": 2**63 + 1, "\uffff": "\udc00", "\U0001F600": "\ud800", "ok": 2**60})
    assert value["a/b"] == ["\ufffd"] and value["x~"] == float(2**63) and value["ok"] == 2**60
    # sorted by UTF-16 code units: the astral name (a surrogate pair, D83D...) before U+FFFF
    assert [n["at"] for n in found] == ["/a~1b/0", "/x~0", "/\U0001F600", "/\uffff"]
    assert found[0]["was"] == '"\\ud83d"' and found[1]["was"] == str(2**63 + 1)
    with pytest.raises(NormalisationError):
        normalise({"f": float("inf")})


def test_a_normalised_body_is_appended_and_the_next_request_carries_the_normalised_form():
    s = mem().create(Header.new("n"))
    s.append(config_from_request({"model": "m"}))
    s.append(user())
    cut = said("cut \ud83d")
    with pytest.raises(AppendRefusedError):
        s.append(cut)  # not I-JSON: refused, and the harness had no way to record it
    body = normalised_body(cut)
    assert body["normalised"] == [{"at": "/item/content/0/text", "was": '"cut \\ud83d"'}]
    s.append(body)
    from_bytes = normalised_body(b'{"type":"item","item":{"type":"message","role":"assistant","content":"\xff"}}')
    assert from_bytes["normalised"][0]["raw"] == base64.b64encode(b'"\xff"').decode()
    s.append(from_bytes)
    path = s.store.path_to(s.head)
    assert build_context(path).items[-2]["content"][0]["text"] == "cut \ufffd"
    response = {"type": "response", "response_id": "r"}
    s.append({**response, "request_hash": request_hash_for(path, response)})
    report = verify_session(read_session_bytes(s.projection()))
    assert report.ok and report.counts()["verified"] == 1
    assert normalised_body(user()) == user()
    with pytest.raises(NormalisationError, match="already"):
        normalised_body(body)


# ---------------------------------------------------------------------------
# typed constructors


def test_env_outcome_and_their_refusals():
    e = env("/w", vcs={"system": "git", "revision": "abc", "dirty": True}, read={"a.py": "sha256:" + "a" * 64},
            tools={"git": "2.47"}, workspace={"kind": "container", "ref": "sha256:" + "b" * 64, "host": "h1"})
    assert e == {"type": "env", "cwd": "/w", "vcs": {"system": "git", "revision": "abc", "dirty": True},
                 "files": {"read": {"a.py": "sha256:" + "a" * 64}}, "tools": {"git": "2.47"},
                 "workspace": {"kind": "container", "ref": "sha256:" + "b" * 64, "host": "h1"}}
    assert env() == {"type": "env"}
    with pytest.raises(EntryError):
        env(workspace={"kind": "vm"})
    o = outcome("eval", "sha256:" + "c" * 64, score=0.9, passed=True, label="rubric-1", details={"n": 3})
    assert o == {"type": "outcome", "kind": "eval", "target": "sha256:" + "c" * 64, "score": 0.9, "pass": True,
                 "label": "rubric-1", "details": {"n": 3}}
    for bad in [lambda: outcome("great", "x"), lambda: outcome("test", ""), lambda: outcome("test", "x", score=float("nan")),
                lambda: outcome("test", "x", score=True)]:
        with pytest.raises(EntryError):
            bad()
    s = mem().create(Header.new("o"))
    target = s.append(user()).id
    s.append(env("/w"))
    s.append(outcome("test", target, passed=False))
    assert verify_session(read_session_bytes(s.projection())).ok


def test_queued_and_drain_empty_the_inbox():
    s = mem().create(Header.new("q", records=["run", "dispatch", "decision", "queued"]))
    s.append({"type": "run", "run_id": "r1", "phase": "start", "source": "input"})
    s.append(user())
    q = s.append(queued(user("steer me")["item"], "steer", trigger={"kind": "human", "ref": "slack:1", "source": "gw"},
                        ref="inbox-1"))
    assert [i.entry for i in inbox_of(s.store.path_to(s.head))] == [q.id]
    d = drain(s.entry(q.id))
    assert d == {"type": "item", "item": user("steer me")["item"], "queued_from": q.id,
                 "source": {"kind": "human", "ref": "slack:1", "source": "gw"}}
    s.append(d)
    assert inbox_of(s.store.path_to(s.head)) == []
    with pytest.raises(EntryError):
        queued(user()["item"], "later")
    with pytest.raises(EntryError):
        drain(s.entry(s.head))
    assert verify_session(read_session_bytes(s.projection())).ok


def test_a_withdrawal_follows_its_dispatch_and_verifies():
    s = mem().create(Header.new("w", records=["run", "dispatch", "decision"]))
    s.append({"type": "run", "run_id": "r1", "phase": "start", "source": "input"})
    s.append(user())
    call = s.append({"type": "item", "item": {"type": "function_call", "call_id": "call_1", "name": "rm", "arguments": "{}"}}).id
    s.append({"type": "dispatch", "call_id": "call_1", "target": call})
    w = withdrawal("call_1", call, "the sandbox was gone", by="policy")
    assert w == {"type": "decision", "call_id": "call_1", "target": call, "verdict": "reject",
                 "reason": "the sandbox was gone", "withdrawn": True, "by": "policy"}
    s.append(w)  # a reject after a dispatch is refused, but not a withdrawal: the hand-off was never made
    s.append({"type": "dispatch", "call_id": "call_1", "target": call})  # so the call may be handed off again
    s.append({"type": "item", "item": {"type": "function_call_output", "call_id": "call_1", "output": "removed"}})
    sf = read_session_bytes(s.projection())
    assert verify_session(sf).ok
    runs = analyze_runs(sf)
    assert json.dumps(runs.as_dict()).count('"withdrawn": true') >= 2  # the dispatch and its withdrawal, marked
    with pytest.raises(AppendRefusedError):
        s.append({**w, "reason": "too late"})  # after the output, nothing is withdrawn
    for bad in [lambda: withdrawal("", call, "r"), lambda: withdrawal("c", call, ""), lambda: withdrawal("c", call, "r", by="cat")]:
        with pytest.raises(EntryError):
            bad()


# ---------------------------------------------------------------------------
# the recorder writes a model call's items as one prepared batch


def test_the_recorder_writes_a_calls_items_as_one_batch(tmp_path):
    from agentsession_cas.exchange.recorder import Recorder

    with Recorder.open(str(tmp_path / "st"), session_id="rec", records=["run", "dispatch", "decision"]) as rec:
        rec.config(model="m")
        rec.user("go")
        head = rec.head
        good = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}
        bad = {"type": "function_call", "call_id": "", "name": "t", "arguments": "{}"}  # an empty call_id is refused
        with pytest.raises(AppendRefusedError):
            rec.items([good, bad], response="r1")
        assert rec.head == head and len(rec.session) == 2  # neither was written
        results = rec.items([good, {**bad, "call_id": "call_1"}], response="r1")
        assert [r.outcome for r in results] == ["continued", "continued"] and rec.pending_calls() == ["call_1"]
        rec.response("r1", model="m")
    sf = read_session_bytes(open_store(str(tmp_path / "st")).export("rec"))
    report = verify_session(sf)
    assert report.ok and report.counts()["verified"] == 1


def test_the_reader_holds_normalised_to_its_shape():
    assert check_normalised(normalised_body(said("cut \ud83d"))["normalised"]) is None
    assert check_normalised(normalise_json(b'{"a":"\xff","b":"\\ud800"}')[1]) is None
    for bad, words in [({"at": "/a"}, "not an array"), ([1], "not an object"), ([{"at": "a", "was": "1"}], "Pointer"),
                       ([{"at": "/a", "was": 1}], "not a string"), ([{"at": "/a", "raw": "not base64!"}], "neither"),
                       ([{"at": "/a", "raw": "YQ"}], "neither"),  # unpadded: one response, two hashes
                       ([{"at": "/b", "was": "1"}, {"at": "/a", "was": "2"}], "not sorted")]:
        assert words in (check_normalised(bad) or ""), bad
    s = mem().create(Header.new("bad-norm"))
    with pytest.raises(AppendRefusedError) as exc:
        s.append({**user(), "normalised": [{"at": "/b", "was": "1"}, {"at": "/a", "was": "2"}]})
    assert exc.value.rule == "normalised"
