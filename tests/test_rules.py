"""The one rule set (agentsession_cas.format.rules): the table, every rule from both
drivers (a whole-file verify and entries added one at a time), trials, the
required members, and the two decisions on what "before" means."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentsession_cas import (
    RULES,
    AgentSessionError,
    Header,
    SessionBuilder,
    SessionChecker,
    SessionFormatError,
    analyze_runs,
    make_entry,
    read_session_bytes,
    verify_session,
)
from agentsession_cas.format import rules as rules_module
from agentsession_cas.format.codes import STORE_ONLY
from agentsession_cas.format.context import ContextBuilder
from agentsession_cas.format.hashing import entry_hashes
from agentsession_cas.format.legacy import migrate_entry
from agentsession_cas.format.reader import split_lines
from agentsession_cas.format.rules import (
    CORE_TYPES,
    PathChecker,
    TreeState,
    check_line,
    parse_line,
    problem,
    read_header,
    unloaded_claims,
)

PACKAGE = Path(__file__).resolve().parents[1] / "agentsession_cas"
SID = "s-rules"
T0 = "2026-10-05T11:00:00Z"
BAD_HASH = "sha256:" + "e" * 64


# ---------------------------------------------------------------------------
# the two drivers


def key(p):
    return (p.line if p.line is not None else -1, p.code, p.message, p.entry or "", p.severity)


def whole(data: bytes) -> list[tuple]:
    """Every problem and note a file verify reports, one pass in file order."""
    try:
        sf = read_session_bytes(data)
    except SessionFormatError as exc:
        return sorted(key(p) for p in exc.problems)
    report = verify_session(sf)
    return sorted(key(p) for p in report.problems + report.notes)


def one_by_one(data: bytes) -> list[tuple]:
    """The same file fed one line at a time, as a store appends: each line parsed and
    its line rules checked, then the entry added to a SessionChecker; then finish."""
    lines = split_lines(data)
    try:
        header = read_header(lines[0], "<bytes>")
    except SessionFormatError as exc:
        return sorted(key(p) for p in exc.problems)
    checker = SessionChecker(header)
    out = []
    assigned: dict[str, str] = {}
    for n, raw in enumerate(lines[1:], start=2):
        obj, careful, found, claims = parse_line(raw, line=n, last=n == len(lines))
        if found is not None:
            out.append(found)
        for c in claims:
            checker.tree.mark_broken(c)
        if obj is None:
            continue
        if header.is_legacy:
            new, notes = migrate_entry(obj, n, assigned, header.id)
            out += notes
            if isinstance(obj.get("id"), str) and "id" in new:
                assigned.setdefault(obj["id"], new["id"])
            obj = new
        entry, found_line = check_line(obj, line=n, careful=careful, migrated=header.is_legacy)
        out += found_line
        for c in unloaded_claims(obj, entry):
            checker.tree.mark_broken(c)
        if entry is not None:
            out += checker.add(entry)
    out += checker.finish()
    return sorted(key(p) for p in out)


def agree(data: bytes) -> list[tuple]:
    a, b = whole(data), one_by_one(data)
    assert a == b
    return a


def codes(found: list[tuple]) -> list[str]:
    return sorted(p[1] for p in found)


# ---------------------------------------------------------------------------
# building sessions


class S:
    """A session written the way a harness writes one (see tests/test_runs.py)."""

    def __init__(self, records=("run", "dispatch", "decision"), fmt=None, base=None, prefix=(), **header):
        h = Header.new(SID, records=list(records) if records else None, created_at=T0, base=base, **header)
        if fmt is not None:
            h.data["format"] = fmt
        self.b = SessionBuilder(h, prefix=prefix)
        self.n = 0

    def ts(self) -> str:
        self.n += 1
        return f"2026-10-05T11:{self.n // 60 % 60:02d}:{self.n % 60:02d}.{self.n // 3600 + 1}Z"

    def add(self, type_, **body):
        return self.b.append(type_, ts=self.ts(), **body)

    def at(self, parent, type_, **body):
        e = self.b.branch(parent.id if parent is not None else None, type_, ts=self.ts(), **body)
        self.b.leaf = e.id
        return e

    def start(self, run_id="r1", source="input", **kw):
        return self.add("run", run_id=run_id, phase="start", source=source, **kw)

    def end(self, run_id="r1", reason="done", pending=(), **kw):
        return self.add("run", run_id=run_id, phase="end", reason=reason, pending=list(pending), **kw)

    def user(self, text="hi"):
        return self.add("item", item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})

    def call(self, call_id, rid="resp_1"):
        return self.add("item", response=rid, item={"type": "function_call", "call_id": call_id, "name": "bash", "arguments": "{}"})

    def say(self, rid, text="done"):
        return self.add("item", response=rid, item={"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})

    def response(self, rid="resp_1", **kw):
        return self.add("response", response_id=rid, model="gpt-5", **kw)

    def output(self, call_id, text="ok"):
        return self.add("item", item={"type": "function_call_output", "call_id": call_id, "output": text})

    def decide(self, call, verdict, **kw):
        cid = kw.pop("call_id", call.get("item")["call_id"])
        if verdict == "reject":
            kw.setdefault("reason", "not allowed")
        return self.add("decision", call_id=cid, target=call.id, verdict=verdict, **kw)

    def dispatch(self, call, **kw):
        cid = kw.pop("call_id", call.get("item")["call_id"])
        return self.add("dispatch", call_id=cid, target=call.id, **kw)

    def bytes(self) -> bytes:
        return self.b.to_bytes()

    def lines(self) -> list[bytes]:
        return split_lines(self.bytes())


def with_line(data: bytes, obj: dict, *, rehash: bool = True, at: int | None = None) -> bytes:
    """The file with one more line holding ``obj`` (its id computed unless told not to)."""
    obj = dict(obj)
    if rehash:
        obj["id"] = entry_hashes(obj)[0]
    lines = split_lines(data)
    raw = json.dumps(obj, ensure_ascii=False).encode()
    if at is None:
        lines.append(raw)
    else:
        lines.insert(at, raw)
    return b"\n".join(lines) + b"\n"


def _session_with_call(**kw):
    s = S(**kw)
    s.user()
    c = s.call("c1")
    s.response()
    return s, c


def _leaf(s):
    return s.b.entries[-1].id


# One file per rule, each breaking it (and possibly others); together they hold every code.


def case_header():
    return b'{"type":"nope"}\n'


def case_format():
    h = Header.new(SID, created_at=T0)
    h.data["format"] = "agentsession/9.0"
    return h.canonical_line()


def case_empty():
    return Header.new(SID, created_at=T0).canonical_line()


def case_header_member():
    s = S()
    s.user()
    lines = s.lines()
    header = json.loads(lines[0])
    lines[0] = json.dumps(dict(header, created_at="yesterday", cwd=None)).encode()
    return b"\n".join(lines) + b"\n"


def case_json():
    s = S()
    s.user()
    s.user("b")
    lines = s.lines()
    lines[1] = lines[1][:-5] + b"!!!!}"
    return b"\n".join(lines) + b"\n"


def case_truncated():
    s = S()
    s.user()
    s.user("b")
    return s.bytes()[:-20]


def case_ijson():
    s = S()
    s.user()
    return s.bytes() + b'{"type":"item","parent":null,"ts":"2026-10-05T11:00:09Z","item":{"n":1,"n":2}}\n'


def case_entry():
    s = S()
    s.user()
    data = s.bytes() + b'{"id":"x","parent":null,"ts":"2026-10-05T11:00:09Z"}\n'
    return data + Header.new("again", created_at=T0).canonical_line()


def case_type():
    s = S()
    s.user()
    return with_line(s.bytes(), {"type": "weird", "parent": _leaf(s), "ts": s.ts()})


def case_reserved():
    s = S()
    s.user()
    return with_line(s.bytes(), {"type": "custom", "parent": _leaf(s), "ts": s.ts(), "ns": "x", "content": 1}, rehash=False)


def case_id():
    s = S()
    s.user()
    data = with_line(s.bytes(), {"type": "info", "parent": _leaf(s), "ts": s.ts(), "name": "no id"}, rehash=False)
    return with_line(data, {"type": "info", "parent": None, "ts": s.ts(), "name": "x", "id": "my-own-id\n"}, rehash=False)


def case_hash():
    s = S()
    s.user()
    return with_line(s.bytes(), {"type": "info", "parent": _leaf(s), "ts": s.ts(), "name": "x", "id": BAD_HASH}, rehash=False)


def case_ts():
    s = S()
    s.user()
    return with_line(s.bytes(), {"type": "info", "parent": _leaf(s), "ts": "2026-10-05T11:00:09+00:00", "name": "x"})


def case_missing_member():
    s = S()
    s.user()
    data = with_line(s.bytes(), {"type": "item", "parent": _leaf(s), "ts": s.ts(), "visible": True})
    data = with_line(data, {"type": "item", "parent": _leaf(s), "ts": s.ts(), "item": "text"})
    data = with_line(data, {"type": "outcome", "parent": _leaf(s), "ts": s.ts(), "kind": "test", "pass": True})
    return with_line(data, {"type": "outcome", "parent": _leaf(s), "ts": s.ts(), "target": 7})


def case_unresolved():
    lines = [
        b'{"type":"session","format":"agentsession/0.4","id":"old","created_at":"2026-09-17T12:00:00Z","payload":"openresponses/2026-04-24"}',
        b'{"type":"item","id":"a1","parent":null,"ts":"2026-09-17T12:00:01Z","item":{"type":"message"}}',
        b'{"type":"label","id":"a2","parent":"a1","ts":"2026-09-17T12:00:02Z","target":"nowhere\\n","label":"x"}',
    ]
    return b"\n".join(lines) + b"\n"


def case_normalised():
    """A normalised member out of order (RFC 0001: sorted by at, so two writers
    normalising one response write one content hash)."""
    s = S()
    s.add("item", item={"type": "message", "role": "assistant", "content": "a\ufffd b\ufffd"},
          normalised=[{"at": "/item/content", "was": '"b"'}, {"at": "/item", "was": '"a"'}])
    return s.bytes()


def case_links():
    """A subsession link whose child id is not derived from parent/call (a note), and
    links at all (a note that a file cannot check the sessions they name)."""
    s = S()
    s.user()
    s.call("call_a")
    s.add("link", rel="subsession", session="child-not-derived", call_id="call_a")
    return s.bytes()


def case_redacted():
    s = S(redacted=True, records=None)
    s.add("config", model="m")
    s.user()
    s.say("r1")
    s.response("r1", request_hash=BAD_HASH)  # the original's request: noted, not failed
    return s.bytes()


def case_duplicate():
    s = S()
    s.user()
    lines = s.lines()
    return b"\n".join(lines + [lines[1]]) + b"\n"


def case_parent():
    s = S()
    s.user()
    return with_line(s.bytes(), {"type": "info", "parent": BAD_HASH, "ts": s.ts(), "name": "orphan"})


def case_parents():
    s = S()
    u = s.user()
    return with_line(s.bytes(), {"type": "info", "parent": u.id, "ts": s.ts(), "name": "x",
                                 "parents": [{"entry": u.id}, {"entry": "later\n"}, {"entry": "later\n"}]})


def case_base():
    origin = S(records=None)
    origin.user()
    base = origin.user("b")
    s = S(base=base.id, prefix=origin.b.entries)
    s.user("own")
    data = with_line(s.bytes(), {"type": "info", "parent": origin.b.entries[0].id, "ts": s.ts(), "name": "x"})
    return with_line(data, {"type": "info", "parent": None, "ts": s.ts(), "name": "y"})


def case_base_missing():
    s = S(base=BAD_HASH)
    s.b.leaf = None
    s.user()
    return s.bytes()


def case_call_ids():
    s = S()
    s.user()
    first = s.call("dup")
    s.call("")
    r = s.response()
    s.dispatch(first)
    s.output("dup")
    s.at(r, "item", item={"type": "message", "role": "user", "content": "again"})
    s.call("dup", rid="resp_2")
    return s.bytes()


def case_targets_and_order():
    s, c = _session_with_call()
    u = s.b.entries[0]
    s.add("dispatch", call_id="c1", target=u.id)       # bad-target
    s.decide(c, "reject")
    s.dispatch(c)                                      # dispatch-after-reject
    s.decide(c, "hold")                                # decision-after-reject
    s2, c2 = _session_with_call()
    s2.dispatch(c2)
    s2.decide(c2, "answer")
    s2.dispatch(c2)                                    # dispatch-after-answer
    s2.decide(c2, "proceed")                           # decision-after-answer
    return s.bytes(), s2.bytes()


def case_after_output():
    s, c = _session_with_call()
    s.dispatch(c)
    s.output("c1")
    s.dispatch(c)                                      # dispatch-after-output
    s.decide(c, "answer")                              # decision-after-output
    return s.bytes()


def case_reject_after_dispatch():
    s, c = _session_with_call()
    s.dispatch(c)
    s.decide(c, "reject")
    return s.bytes()


def case_answer_not_dispatched():
    s, c = _session_with_call()
    s.decide(c, "answer")
    return s.bytes()


def case_dispatch_missing():
    s, _ = _session_with_call()
    s.output("c1")
    return s.bytes()


def case_runs():
    s = S(fmt="agentsession/0.8")
    s.start("r1")
    s.user()
    a = s.call("a")
    s.response()
    s.decide(a, "hold")
    s.end("r1", reason="done", pending=[])              # run-reason, run-pending; 0.8: before-0.9, end-rule
    s.start("r2", source="resume")
    s.user("nothing taken up")
    s.end("r2", reason="aborted")                       # run-source (source-rule)
    s.end("ghost", reason="done")                       # run-end-unmatched
    s.start("r3")
    s.start("r4")                                       # run-not-ended
    s.output("nobody")                                  # orphan-output
    s.add("run", run_id="r4", phase="middle")           # record-malformed
    s.add("item", item={"type": "message", "role": "user", "content": "x"}, from_link="nowhere")  # bad-from-link
    s.end("r4", reason="error", ref="stopped here")
    s.start("r5", source="resume")
    s.user("open, nothing taken up yet")                # run-source-open at the leaf
    return s.bytes()


def case_early_09():
    s, c = _session_with_call(fmt="agentsession/0.9")
    s.decide(c, "reject")
    s.dispatch(c)
    return s.bytes()


def case_context():
    s = S(records=None)
    s.add("config", model="m")
    q = s.user()
    s.say("r1")
    s.response("r1", request_hash=BAD_HASH)            # request_hash
    s.add("compaction", first_kept="zzzz", summary={"type": "message", "role": "system", "content": "s"},
          config={"model": "m"})                       # first_kept
    s.add("config", instructions_omitted=[{"keep": 1, "of": "sha256:" + "0" * 64}])  # of
    assert q
    return s.bytes()


CASES = {
    name[5:]: fn for name, fn in sorted(globals().items()) if name.startswith("case_") and callable(fn)
}


def _files():
    for name, fn in CASES.items():
        made = fn()
        for i, data in enumerate(made if isinstance(made, tuple) else (made,)):
            yield f"{name}-{i}", data


FILES = dict(_files())


@pytest.mark.parametrize("name", sorted(FILES))
def test_both_drivers_agree_on_every_case(name):
    found = agree(FILES[name])
    assert found, "each case breaks something"
    for _, _, message, _, _ in found:
        assert "\n" not in message and "\x1b" not in message


def test_every_rule_is_provoked_by_some_case():
    seen = {code for data in FILES.values() for code in codes(agree(data))}
    # The store-scope rules need another session's header: tests/test_links.py provokes them;
    # the media rules, the files beside a session's: tests/test_media_check.py.
    wanted = {c for c, r in RULES.items() if r.scope not in ("store", "media")}
    assert seen == wanted, sorted(wanted ^ seen)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("header-0", ["header"]),
        ("format-0", ["format"]),
        ("empty-0", ["empty"]),
        ("header_member-0", ["header-member", "header-member"]),
        ("json-0", ["json"]),
        ("truncated-0", ["truncated"]),
        ("ijson-0", ["ijson"]),
        ("entry-0", ["entry", "entry"]),
        ("type-0", ["type"]),
        ("reserved-0", ["reserved"]),
        ("id-0", ["id", "id"]),
        ("hash-0", ["hash"]),
        ("ts-0", ["ts"]),
        ("missing_member-0", ["missing-member"] * 4),
        ("redacted-0", ["redacted", "redacted-request"]),
        ("links-0", ["link-derived", "link-store"]),
        ("normalised-0", ["normalised"]),
        ("duplicate-0", ["duplicate"]),
        ("parent-0", ["parent"]),
        ("reject_after_dispatch-0", ["reject-after-dispatch"]),
        ("answer_not_dispatched-0", ["answer-not-dispatched"]),
        ("dispatch_missing-0", ["dispatch-missing"]),
        ("after_output-0", ["decision-after-output", "dispatch-after-output"]),
        ("call_ids-0", ["call-id-empty", "call-id-repeated"]),
        ("early_09-0", ["dispatch-after-reject", "early-0.9"]),
        ("context-0", ["first_kept", "of", "request_hash"]),
        ("base_missing-0", ["base"]),
    ],
)
def test_each_case_breaks_its_rule(name, expected):
    assert codes(agree(FILES[name])) == sorted(expected)


def test_the_record_case_holds_each_run_rule_once():
    found = codes(agree(FILES["runs-0"]))
    for code in ("run-reason", "run-pending", "run-source", "run-end-unmatched", "run-not-ended", "orphan-output",
                 "record-malformed", "bad-from-link", "run-source-open", "before-0.9", "end-rule", "source-rule"):
        assert found.count(code) == 1, code


# ---------------------------------------------------------------------------
# the table


def test_the_table_is_closed_and_consistent():
    for code, rule in RULES.items():
        assert rule.code == code
        assert rule.severity in ("error", "note")
        assert rule.scope in ("line", "tree", "record", "context", "link", "media", "store")
        assert rule.store in ("refuse", "finding", "keep", "note")
        assert (rule.store == "refuse") == (rule.error is not None)
        assert rule.error in (None, "bad_entry", "base_rule", "call_id_repeated", "no_entry", "format")
        assert rule.severity == "error" or rule.store == "note"
        assert rule.summary and rule.section.startswith("RFC 000")
    assert [c for c, r in RULES.items() if r.store == "finding"] == ["request_hash", "missing-blob", "blob-hash"]
    assert [c for c, r in RULES.items() if r.store == "keep"] == ["header-member"]
    assert RULES["call-id-repeated"].error == "call_id_repeated"
    assert RULES["base"].error == "base_rule" and RULES["parent"].error == "no_entry"


def test_an_unknown_code_cannot_be_reported():
    with pytest.raises(AgentSessionError, match="no rule"):
        problem(1, "no-such-rule", "x")
    p = problem(3, "orphan-output", "x", "e")
    assert p.severity == "note" and p.as_dict()["severity"] == "note"
    assert problem(3, "hash", "x").severity == "error"


def _literal_codes() -> set[str]:
    """Every string literal passed as a rule code in the package: the first argument of
    report()/_report()/_keep() after the entry, or the second of problem()."""
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name == "Problem" and "format" in path.parts and path.name != "codes.py":
                raise AssertionError(f"{path}: a Problem made without the table (use codes.problem)")
            for kw in node.keywords:  # a store's refusal names its rule: AppendRefusedError(..., rule="...")
                if kw.arg == "rule" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    found.add(kw.value.value)
            index = {"problem": 1, "report": 1, "_report": 1, "_keep": 1}.get(name or "")
            if index is None or len(node.args) <= index:
                continue
            arg = node.args[index]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
    return found


def test_every_code_the_package_names_is_in_the_table():
    names = _literal_codes()
    assert names, "the scan found the calls"
    # A store's refusals name a rule of the table or one of the store's own (a synthetic
    # label, a head move), listed beside it.
    assert names <= set(RULES) | set(STORE_ONLY), sorted(names - set(RULES) - set(STORE_ONLY))
    assert set(STORE_ONLY) <= names and not set(STORE_ONLY) & set(RULES)
    # and the few codes chosen at run time are the table's too
    assert {"run-source-open", "run-source", "truncated", "json", "ijson"} <= names


def test_docs_list_every_record_code():
    text = (PACKAGE.parent / "docs" / "runs.md").read_text()
    for code, rule in RULES.items():
        if rule.scope == "record":
            assert f"`{code}`" in text, code


# ---------------------------------------------------------------------------
# line rules


def test_check_line_on_a_good_line_and_its_members():
    e = make_entry("item", None, ts=T0, item={"type": "message", "role": "user", "content": "x"})
    entry, found = check_line(dict(e.data), line=2)
    assert found == [] and entry is not None and entry.id == e.id and entry.line == 2
    entry, found = check_line(dict(e.data), line=2, keep_objects=True)
    assert found == [] and entry is not None and entry.objects is not None


def test_required_members_are_line_rules():
    base = {"parent": None, "ts": T0}
    for obj, words in [
        ({"type": "item", **base}, "has no 'item'"),
        ({"type": "item", "item": [1], **base}, "not an object"),
        ({"type": "outcome", "kind": "test", **base}, "has no 'target'"),
        ({"type": "outcome", "target": None, **base}, "not an entry id"),
    ]:
        obj["id"] = entry_hashes(obj)[0]
        entry, found = check_line(obj, line=5)
        assert entry is not None, "the entry still loads: the store refuses it, a reader reports it"
        assert [(p.code, p.line, p.entry) for p in found] == [("missing-member", 5, obj["id"])]
        assert words in found[0].message
        assert RULES["missing-member"].store == "refuse"
    # what the RFC does not require is not asked for: an item of any type, an outcome's kind
    ok = {"type": "outcome", "target": "x", **base}
    ok["id"] = entry_hashes(ok)[0]
    assert check_line(ok)[1] == []
    # the envelope's parent is the tree's: a line without one is a root, and says so once
    bare = {"type": "info", "ts": T0}
    bare["id"] = entry_hashes(bare)[0]
    assert check_line(bare)[1] == []


def test_a_line_with_no_parent_member_is_not_also_a_base_problem():
    origin = S(records=None)
    base = origin.user()
    s = S(base=base.id, prefix=origin.b.entries)
    data = with_line(s.bytes(), {"type": "info", "ts": s.ts(), "name": "no parent"})
    assert codes(agree(data)) == ["parent"]


def test_parse_line_and_claims():
    obj, careful, found, claims = parse_line(b'{"type":"info"}', line=2)
    assert obj == {"type": "info"} and found is None and claims == ()
    h = "sha256:" + "a" * 64
    _, _, found, claims = parse_line(b'{"id" : "' + h.encode() + b'", oops', line=3)
    assert found is not None and found.code == "json" and claims == (h,)
    _, _, found, claims = parse_line(b'{"id":"' + h.encode() + b'", oops', line=3, last=True)
    assert found is not None and found.code == "truncated" and claims == ()


def test_header_problems_come_from_the_table():
    with pytest.raises(SessionFormatError) as info:
        read_header(b'{"type":"session","format":"agentsession/0.x","id":"a","created_at":"x","payload":"p","media":"odd\\n"}', "f")
    got = [(p.code, p.severity) for p in info.value.problems]
    assert got == [("format", "error"), ("header", "error")]
    assert all("\n" not in p.message for p in info.value.problems)


# ---------------------------------------------------------------------------
# tree rules


def test_tree_state_base_rule_and_head():
    origin = S(records=None)
    a = origin.user()
    base = origin.user("b")
    header = Header.new(SID, created_at=T0, base=base.id)
    tree = TreeState(header)
    assert tree.add(a) == [] and tree.in_prefix and not tree.head_allowed(base.id)
    assert tree.add(base) == [] and not tree.in_prefix and tree.prefix == [a.id]
    own = make_entry("info", base.id, ts=T0, name="own")
    mark = make_entry("label", own.id, ts=T0, target=own.id, label="leaf")
    assert tree.add(own) == [] and tree.add(mark) == []
    assert tree.head_allowed(base.id) and tree.head_allowed(own.id)
    assert not tree.head_allowed(mark.id) and not tree.head_allowed(a.id) and not tree.head_allowed(None)
    stray = make_entry("info", a.id, ts=T0, name="from the prefix")
    assert [p.code for p in tree.add(stray)] == ["base"]
    assert [p.code for p in tree.add(own)] == ["duplicate"]
    baseless = TreeState(Header.new(SID, created_at=T0))
    assert baseless.head_allowed(None)
    baseless.add(a)
    assert baseless.head_allowed(a.id)


def test_a_parent_not_held_is_reported_once_not_also_as_the_base_rule():
    origin = S(records=None)
    base = origin.user()
    s = S(base=base.id, prefix=origin.b.entries)
    s.user()
    data = with_line(s.bytes(), {"type": "info", "parent": BAD_HASH, "ts": s.ts(), "name": "x"})
    assert codes(agree(data)) == ["parent"]


# ---------------------------------------------------------------------------
# the path: file order, repositioning, the decisions


def test_an_answer_is_excused_only_by_a_dispatch_written_before_it():
    """Decision (docs/runs.md): "dispatched elsewhere" is a dispatch for the call earlier
    in file (log) order, off the path. One written later does not excuse the answer."""
    s, c = _session_with_call()
    resp = s.b.entries[-1]
    answer = s.decide(c, "answer")                      # the record says the call never started
    s.at(resp, "dispatch", call_id="c1", target=c.id)   # a dispatch on another branch, written after
    found = agree(s.bytes())
    assert [(p[1], p[3]) for p in found] == [("answer-not-dispatched", answer.id)]
    # written the other way round, the off-path dispatch stands for one on the path
    s, c = _session_with_call()
    resp = s.b.entries[-1]
    s.dispatch(c)
    s.output("c1")
    s.at(resp, "decision", call_id="c1", target=c.id, verdict="answer")
    assert agree(s.bytes()) == []
    report = analyze_runs(read_session_bytes(s.bytes()))
    assert report.calls[0].state == "answered" and report.calls[0].dispatched_elsewhere


def test_a_resume_open_at_a_leaf_is_a_note_and_fine_for_an_incremental_writer():
    s = S()
    s.start("r1")
    s.user()
    a = s.call("a")
    s.response()
    s.decide(a, "hold")
    s.end("r1", reason="input_required", pending=["a"])
    checker = SessionChecker(read_session_bytes(s.bytes()).header)
    for e in s.b.entries:
        assert [p for p in checker.add(e) if p.severity == "error"] == []
    start = s.start("r2", source="resume")
    typed = s.user("yes, go ahead")                    # the approval a person typed, before the take-up
    assert checker.add(start) == [] and checker.add(typed) == []
    assert [(p.code, p.entry) for p in checker.finish() if p.code == "run-source-open"] == [("run-source-open", start.id)]
    # the take-up comes: the source stands, and nothing was ever an error
    d = s.decide(a, "proceed", by="human")
    assert checker.add(d) == []
    assert agree(s.bytes()) == []


def test_open_run_gives_the_end_a_writer_must_write():
    s = S()
    s.start("r1")
    s.user()
    a = s.call("a")
    s.response()
    s.decide(a, "hold")
    checker = SessionChecker(read_session_bytes(s.bytes()).header)
    for e in s.b.entries:
        checker.add(e)
    run = checker.open_run()
    assert run is not None and (run.run_id, run.reason, run.pending) == ("r1", "input_required", ("a",))
    end = s.end("r1", reason=run.reason, pending=run.pending)
    assert checker.add(end) == [] and checker.open_run() is None
    assert agree(s.bytes()) == []


def test_a_later_response_cannot_name_a_mismatch():
    """The other-response diagnosis looks at responses checked before, in file order:
    a later one cannot change the words of a problem already given."""

    def build(first_hash):
        p = S(records=None)
        p.add("config", model="m")
        p.user("q")
        p.say("r1")
        p.response("r1", request_hash=first_hash)
        p.user("q2")
        p.say("r2")
        right = ContextBuilder().extend(p.b.entries).request_hash_for("r2")
        p.response("r2", request_hash=right)
        return p, right

    _, right_for_r2 = build(None)
    p, _ = build(right_for_r2)  # the first response records the second's request
    found = agree(p.bytes())
    assert [f[1] for f in found] == ["request_hash"]
    assert "rebuilt for response" not in found[0][2]
    checks = verify_session(read_session_bytes(p.bytes())).requests
    assert [(c.status, c.reason) for c in checks] == [("mismatch", None), ("ok", None)]


def test_repositioning_over_deep_branches_finds_what_a_linear_check_finds():
    s = S()
    s.start("r1")
    s.user()
    a = s.call("a")
    left = s.response()
    for i in range(5):
        s.user(f"left {i}")
    s.at(left, "decision", call_id="a", target=a.id, verdict="hold")
    for i in range(5):
        s.user(f"right {i}")
    tip = s.b.entries[-1]
    s.at(s.b.entries[8], "item", item={"type": "message", "role": "user", "content": "back left"})
    s.at(tip, "run", run_id="r1", phase="end", reason="done", pending=[])
    found = agree(s.bytes())
    assert codes(found) == ["run-pending", "run-reason"]


def test_a_cut_path_is_cut_for_every_entry_below_it():
    s = S(records=None)
    s.add("config", model="m")
    s.user()
    s.say("r1")
    s.response("r1", request_hash=BAD_HASH)
    lines = s.lines()
    del lines[2]  # the user message: everything below is cut
    data = b"\n".join(lines) + b"\n"
    found = agree(data)
    assert codes(found) == ["parent", "request_hash"]
    assert "its path is cut" in [f for f in found if f[1] == "request_hash"][0][2]


def test_an_entry_naming_itself_as_parent_is_a_cut_root():
    obj = {"type": "info", "ts": T0, "name": "self", "id": BAD_HASH, "parent": BAD_HASH}
    data = with_line(Header.new(SID, created_at=T0).canonical_line(), obj, rehash=False)
    assert codes(agree(data)) == ["hash", "parent"]


def test_untrusted_values_stay_on_one_line():
    s = S()
    s.user()
    weird = "x\n\x1b[2J"
    data = with_line(s.bytes(), {"type": "info", "parent": weird, "ts": s.ts(), "name": "x", "id": weird}, rehash=False)
    data = with_line(data, {"type": "dispatch", "parent": weird, "ts": s.ts(), "call_id": weird, "target": weird})
    data = with_line(data, {"type": "info", "parent": _leaf(s), "ts": weird, "name": "x"})
    data = with_line(data, {"type": weird, "parent": _leaf(s), "ts": s.ts()})
    found = agree(data)
    assert found
    for f in found:
        assert "\n" not in f[2] and "\x1b" not in f[2], f


# ---------------------------------------------------------------------------
# trials


def _state(checker: SessionChecker) -> tuple:
    """What the checker holds, as plain values."""
    path = checker.path
    w = path.walker
    return (
        sorted(checker.tree.held.items()),
        sorted(checker.tree.own),
        list(checker.tree.prefix),
        checker.tree.in_prefix,
        sorted(checker.tree.leaf_labels),
        dict(path.seq),
        [e.id for e in path.path],
        [e.id for e in path.builder.path],
        [e.id for e in w.path],
        {k: list(v) for k, v in w.dispatch_nodes.items()},
        {k: v.id for k, v in w.first_call.items()},
        w.calls_checked,
        sorted(w.starts_seen),
        sorted(w.ends_seen),
        sorted(w.foreign),
        {k: (c.status, c.detail) for k, c in path.requests.items()},
        [key(p) for p in checker.problems],
        [key(p) for p in checker.notes],
        sorted(path._seen),
        dict(path._rebuilt),
        path._budget,
        checker.open_run(),
    )


def _trial_session():
    s = S()
    s.add("config", model="m")
    s.start("r1")
    s.user()
    a = s.call("a")
    first = s.response()
    s.decide(a, "hold")
    s.end("r1", reason="input_required", pending=["a"])
    kept = len(s.b.entries)
    # what a trial adds: a resume taking the call up on a new branch, a dispatch, a repeated
    # call id, a response with a wrong hash, a problem on an old entry (the start's source)
    start = s.start("r2", source="input")
    s.decide(a, "proceed")
    s.dispatch(a)
    s.call("a", rid="resp_9")
    s.response("resp_9", request_hash=BAD_HASH)
    s.at(first, "dispatch", call_id="a", target=a.id)
    tried = s.b.entries[kept:]
    return s, kept, tried, first, a, start


def test_rollback_restores_every_fact_and_later_adds_see_nothing_of_it():
    s, kept, tried, first, a, start = _trial_session()
    header = read_session_bytes(s.bytes()).header
    base_entries = s.b.entries[:kept]
    # the continuation that really lands: an output under the end, then a new run
    cont = S()
    cont.b = SessionBuilder(header, prefix=base_entries)
    cont.b.leaf = base_entries[-1].id
    cont.n = 100
    cont.start("r3", source="resume")
    cont.decide(a, "reject")
    cont.output("a", "not allowed")
    cont.call("a", rid="resp_3")  # a repeat of the id: the rolled-back repeat must not have claimed it
    landed = cont.b.entries[kept:]

    plain = SessionChecker(header)
    for e in base_entries:
        plain.add(e)
    before = _state(plain)
    trial = SessionChecker(header)
    for e in base_entries:
        trial.add(e)
    assert _state(trial) == before
    mark = trial.begin()
    brought = [p.code for e in tried for p in trial.add(e)]
    assert {"run-source", "call-id-repeated", "request_hash"} <= set(brought)
    trial.rollback(mark)
    assert _state(trial) == before
    for e in landed:
        assert trial.add(e) == plain.add(e)
    assert _state(trial) == _state(plain)
    assert trial.finish() == plain.finish()


def test_commit_keeps_the_adds_and_trials_nest_last_first():
    s, kept, tried, *_ = _trial_session()
    header = read_session_bytes(s.bytes()).header
    straight = SessionChecker(header)
    for e in s.b.entries:
        straight.add(e)
    checker = SessionChecker(header)
    for e in s.b.entries[:kept]:
        checker.add(e)
    outer = checker.begin()
    checker.add(tried[0])
    inner = checker.begin()
    for e in tried[1:3]:
        checker.add(e)
    with pytest.raises(AgentSessionError):
        checker.commit(outer)
    checker.rollback(inner)
    again = checker.begin()
    for e in tried[1:]:
        checker.add(e)
    checker.commit(again)
    checker.commit(outer)
    assert _state(checker) == _state(straight)
    with pytest.raises(AgentSessionError):
        checker.rollback(outer)
    assert checker.tree._trial_ids is None and checker.path._trial is None


@st.composite
def _trials(draw):
    ops = draw(_session_ops())
    s = _play(ops)
    n = len(s.b.entries)
    i = draw(st.integers(0, n))
    j = draw(st.integers(i, n))
    return s, i, j


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_trials())
def test_property_a_rolled_back_trial_leaves_no_trace(t):
    s, i, j = t
    entries = s.b.entries
    header = read_session_bytes(s.bytes()).header
    plain = SessionChecker(header)
    trial = SessionChecker(header)
    for e in entries[:i]:
        plain.add(e)
        trial.add(e)
    mark = trial.begin()
    for e in entries[i:j]:
        trial.add(e)
    trial.rollback(mark)
    assert _state(trial) == _state(plain)


# ---------------------------------------------------------------------------
# property: the drivers agree on any session


@st.composite
def _session_ops(draw):
    return draw(st.lists(
        st.tuples(
            st.sampled_from(["user", "call", "call", "respond", "respond-bad", "dispatch", "hold", "proceed", "reject",
                             "answer", "output", "start", "start-resume", "end", "branch", "compact", "config-of"]),
            st.integers(0, 10**6),
        ),
        min_size=1,
        max_size=30,
    ))


def _play(ops) -> S:
    s = S()
    s.add("config", model="m")
    calls: list = []
    k = 0
    for op, pick in ops:
        entries = s.b.entries
        if op == "user":
            s.user(f"u{pick % 7}")
        elif op == "call":
            k += 1
            calls.append(s.call(f"c{pick % 9}", rid=f"resp_{k}"))
        elif op in ("respond", "respond-bad"):
            k += 1
            s.say(f"resp_{k}")
            try:
                good = ContextBuilder().extend(_path(s)).request_hash_for(f"resp_{k}")
            except Exception:
                good = BAD_HASH
            s.response(f"resp_{k}", request_hash=good if op == "respond" else BAD_HASH)
        elif op in ("dispatch", "hold", "proceed", "reject", "answer") and calls:
            c = calls[pick % len(calls)]
            if op == "dispatch":
                s.dispatch(c)
            else:
                s.decide(c, op)
        elif op == "output" and calls:
            s.output(calls[pick % len(calls)].get("item")["call_id"])
        elif op in ("start", "start-resume"):
            s.start(f"r{pick % 4}", source="resume" if op == "start-resume" else "input")
        elif op == "end":
            s.end(f"r{pick % 4}", reason=["done", "aborted", "input_required", "stopped"][pick % 4])
        elif op == "branch":
            s.b.leaf = entries[pick % len(entries)].id
        elif op == "compact":
            path = _path(s)
            fk = path[pick % len(path)].id if pick % 5 else "nowhere"
            s.add("compaction", first_kept=fk, summary={"type": "message", "role": "system", "content": "s"},
                  config={"model": "m"})
        elif op == "config-of":
            s.add("config", instructions_omitted=[{"keep": 1, "of": entries[pick % len(entries)].id}])
    return s


def _path(s: S) -> list:
    by_id = {e.id: e for e in s.b.entries}
    out = []
    x = s.b.leaf
    while x is not None:
        out.append(by_id[x])
        x = by_id[x].parent
    return out[::-1]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_session_ops())
def test_property_one_at_a_time_is_the_whole_file(ops):
    s = _play(ops)
    data = s.bytes()
    agree(data)
    # and the path view reports, for its path, what the whole check found on it
    sf = read_session_bytes(data)
    report = verify_session(sf)
    runs = analyze_runs(sf)
    on_path = set(e.id for e in sf.tree.path(sf.leaf)) if sf.leaf else set()
    expected = [key(p) for p in report.problems if p.entry in on_path and RULES[p.code].scope == "record"]
    assert sorted(key(p) for p in runs.problems) == sorted(expected)


def test_path_checker_with_a_loader_matches_the_default():
    s = _play([("call", 1), ("respond", 0), ("branch", 1), ("user", 2), ("dispatch", 0), ("branch", 3),
               ("output", 0), ("start-resume", 1), ("user", 1)])
    entries = s.b.entries
    header = read_session_bytes(s.bytes()).header
    by_id = {e.id: e for e in entries}
    loads: list[str] = []

    def loader(entry_id: str):
        loads.append(entry_id)
        return by_id[entry_id]

    a, b = PathChecker(header), PathChecker(header, loader=loader)
    for e in entries:
        assert a.add(e) == b.add(e)
    assert a.finish() == b.finish()
    assert loads, "moving back to a branch left loaded its entries"


def _path_state(path: PathChecker) -> tuple:
    """What the path checker holds along its path (walker and builder), as plain values."""
    w, b = path.walker, path.builder
    run = w.run
    return (
        [e.id for e in path.path],
        {eid: path._depth_at(eid) for eid in path.order},
        [e.id for e in w.path],
        sorted(w.on_path),
        list(w.last_resp),
        {k: (c.call_id, c.output.id if c.output is not None else None, list(c.events))
         for k, c in w.calls.items()},
        {k: [c.entry.id for c in w.stack(k)] for k in w.by_call_id},
        [c.entry.id for c in w.call_order],
        w.open_calls,
        None if run is None else (run.start.id, [c.entry.id for c in run.calls], sorted(run.call_keys), run.nonempty,
                                  run.out_or_decision, run.takeup),
        len(w._undo),
        list(w._marks),
        [e.id for e in b.path],
        {eid: b.index.get(eid) for eid in path.order},
        list(b._models),
        (b.settings.model, b.settings.request_split(), repr(b.settings.omit), b.settings.omitted),
        b.compaction,
        b.error,
        [(pos, kind, model, index) for pos, kind, model, index in b._raw.items],
        [(m[1], m[3]) for m in b._raw.marks],
        len(b._undo),
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_session_ops(), st.integers(0, 10**6))
@example([("user", 1), ("call", 2), ("compact", 1), ("user", 3), ("config-of", 2), ("respond", 0), ("user", 4)], 2)
def test_property_a_bulk_pop_is_as_many_pops(ops, pick):
    s = _play(ops)
    entries = s.b.entries
    header = read_session_bytes(s.bytes()).header
    one, bulk = PathChecker(header), PathChecker(header)
    for e in entries:
        one.add(e)
        bulk.add(e)
    keep = pick % (len(one.path) + 1)
    tip = one.path[-1].id
    while len(one.path) > keep:
        one._pop()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rules_module, "_FEW_POPS", 0)  # every move of the bulk checker pops at once
        bulk._pop_to(keep)
        assert _path_state(bulk) == _path_state(one)
        one._goto(tip)
        bulk._goto(tip)
        assert _path_state(bulk) == _path_state(one)
        assert bulk.open_run() == one.open_run()
        bulk._goto(None)
        while one.path:
            one._pop()
        assert _path_state(bulk) == _path_state(one)


def test_core_types_are_the_rfcs():
    assert CORE_TYPES == {"item", "response", "config", "compaction", "branch_summary", "run", "dispatch",
                          "decision", "queued", "label", "info", "env", "outcome", "link", "custom"}


def test_docs_rules_table_is_the_table():
    text = (PACKAGE.parent / "docs" / "rules.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    want = [f"| `{r.code}` | {r.severity} | {r.scope} | {r.store} | {r.error or '-'} | {r.summary} | {r.section} |"
            for r in RULES.values()]
    assert rows == want


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"a":"x', "does not parse as JSON: Unterminated string starting at column 6"),
        ('{"a" 1}', "does not parse as JSON: Expecting ':' delimiter at column 6"),
    ],
)
def test_a_json_failure_is_worded_once(text, said):
    """The parser's own words, with the column said once ("starting at at column" was shown)."""
    from agentsession_cas.format.rules import describe_json_error

    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        assert describe_json_error(exc) == said
    else:
        raise AssertionError("the text parsed")


@pytest.mark.parametrize("value", [[], None])
def test_an_empty_or_null_parents_is_a_problem_not_a_member_dropped(tmp_path, value):
    """RFC 0001: a writer MUST omit an empty ``parents``. The id hashes an empty or null one
    as absent and a store keeps no member its envelope leaves out, so such a line came back
    from import and export without it (verify said nothing): now verify reports it, and an
    import and a store's append refuse it, where a line without the member is taken."""
    from agentsession_cas.store import Store

    header = Header.new("s-parents", created_at="2026-09-17T12:00:00Z")
    first = make_entry("item", parent=None, ts="2026-09-17T12:00:00Z",
                       item={"type": "message", "role": "user", "content": "hi"})
    body: dict = {"type": "item", "parent": first.id, "ts": "2026-09-17T12:00:01Z",
                  "item": {"type": "message", "role": "user", "content": "x"}}
    line = dict(body, parents=value)
    line["id"] = entry_hashes(line)[0]
    assert line["id"] == entry_hashes(body)[0]  # (hashed as absent)
    data = b"".join(json.dumps(o, separators=(",", ":")).encode() + b"\n" for o in (header.data, first.data, line))
    problems = [p for p in read_session_bytes(data).all_problems() if p.code == "parents"]
    assert problems and ("empty" in problems[0].message or "null" in problems[0].message)
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    with Store.init(tmp_path / "st") as st:
        with pytest.raises(AgentSessionError):
            st.import_file(str(path))
        assert st.list() == []
        s = st.create(Header.new("s2"))
        s.append(dict(first.data))
        with pytest.raises(AgentSessionError):
            s.append({k: v for k, v in line.items() if k != "id"})
        assert len(s) == 1
        s.append({k: v for k, v in body.items()})
        assert len(s) == 2
        s.close()
