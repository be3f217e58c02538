"""The OpenTelemetry projection (RFC 0001 "Projections"): OTLP/JSON spans, parsed with
the OpenTelemetry protobuf definitions, and the links the RFC names."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agentsession_cas import Header, SessionBuilder, read_session, read_session_bytes
from agentsession_cas.format.otel import SPAN_KIND_CLIENT, otlp_request, span_id, trace_id
from agentsession_cas.format.timestamps import ts_unix_nanos
from agentsession_cli.main import main

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus" / "sessions"
FIXTURES = REPO / "fixtures"
EXPECTED = json.loads((FIXTURES / "otel" / "delegate.json").read_text())

_IDS = ("traceId", "spanId", "parentSpanId")


def _proto_json(value: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex; the proto3 JSON mapping json_format
    reads takes bytes as base64. Convert, as an OTLP receiver does."""
    if isinstance(value, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in _IDS else _proto_json(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_proto_json(v) for v in value]
    return value


def parse(doc: dict) -> ExportTraceServiceRequest:
    return json_format.Parse(json.dumps(_proto_json(doc)), ExportTraceServiceRequest())


def spans_of(doc: dict) -> list[dict]:
    (rs,) = doc["resourceSpans"]
    (ss,) = rs["scopeSpans"]
    return ss["spans"]


def attrs(span: dict) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


def links(span: dict) -> list[tuple[str, str, str]]:
    """(rel, linked span id, entry id) per link."""
    out = []
    for link in span.get("links", []):
        a = {x["key"]: x["value"]["stringValue"] for x in link["attributes"]}
        out.append((a["agentsession.link.rel"], link["spanId"], a["agentsession.entry.id"]))
    return out


def _sessions() -> list[Path]:
    out = sorted(FIXTURES.glob("*.jsonl")) + sorted((FIXTURES / "projections").glob("*.jsonl"))
    if CORPUS.is_dir():
        out += [p for p in sorted(CORPUS.glob("*.jsonl")) if p.stem != "unsupported-format"]
    return out


@pytest.mark.parametrize("path", _sessions(), ids=lambda p: p.stem)
def test_every_session_parses_as_an_export_trace_service_request(path):
    sf = read_session(path)
    doc = otlp_request(sf)
    msg = parse(doc)
    (rs,) = msg.resource_spans
    spans = rs.scope_spans[0].spans
    assert spans[0].name == "session"
    ids = {s.span_id for s in spans}
    assert len(ids) == len(spans)
    for s in spans:
        assert len(s.trace_id) == 16 and len(s.span_id) == 8
        assert s.end_time_unix_nano >= s.start_time_unix_nano
        a = {kv.key: kv.value.string_value for kv in s.attributes}
        assert a["session.id"] == sf.header.id
        if s is not spans[0]:
            assert a["agentsession.entry.id"] in sf.tree
            assert s.parent_span_id in ids
    # Deterministic: the same session gives the same trace.
    assert otlp_request(sf) == doc


def test_the_spans_and_links_of_the_delegate_fixture_match_the_hand_written_table():
    path = FIXTURES / "projections" / "delegate.jsonl"
    sf = read_session(path)
    by_line = {f"@{i + 2}": e.id for i, e in enumerate(sf.entries)}
    doc = otlp_request(sf)
    parse(doc)
    spans = spans_of(doc)
    assert all(s["traceId"] == trace_id(sf.header.id) for s in spans)
    got = []
    for s in spans:
        a = attrs(s)
        got.append({
            "name": s["name"],
            "entry": a.get("agentsession.entry.id"),
            "parent": s.get("parentSpanId"),
            "links": [[rel, entry] for rel, _, entry in links(s)],
        })
    key_of = {span_id(e): f"@{line}" for line, e in ((k[1:], v) for k, v in by_line.items())}
    key_of[span_id(f"session:{sf.header.id}")] = "session"
    rev = {v: k for k, v in by_line.items()}
    shown = [{"name": g["name"], "entry": rev.get(g["entry"]), "parent": key_of.get(g["parent"]),
              "links": [[rel, rev.get(e, e)] for rel, e in g["links"]]} for g in got]
    assert shown == EXPECTED["spans"]
    # Each link's span id is the span of the entry it names (or of the last span
    # before a branch point).
    ids = {s["spanId"] for s in spans}
    for s in spans:
        for rel, sid, entry in links(s):
            assert sid in ids, (s["name"], rel)
            if rel != "branched_from":
                assert sid == span_id(entry)


def test_times_are_the_entries_own():
    sf = read_session(FIXTURES / "projections" / "delegate.jsonl")
    spans = spans_of(otlp_request(sf))
    chat = next(s for s in spans if s["name"] == "chat gpt-5")
    response = next(e for e in sf.entries if e.type == "response")
    # latency_ms 900 before the response entry's ts
    assert int(chat["endTimeUnixNano"]) == ts_unix_nanos(response.ts)
    assert int(chat["endTimeUnixNano"]) - int(chat["startTimeUnixNano"]) == 900_000_000
    assert chat["kind"] == SPAN_KIND_CLIENT
    assert attrs(chat)["gen_ai.usage.input_tokens"] == "100"
    tool = [s for s in spans if s["name"] == "execute_tool delegate"]
    output = next(e for e in sf.entries if e.type == "item" and e.data["item"]["type"] == "function_call_output")
    assert int(tool[1]["endTimeUnixNano"]) == ts_unix_nanos(output.ts)
    assert attrs(tool[1])["agentsession.call.output.entry.id"] == output.id


def test_decisions_are_events_of_the_tool_span_and_a_call_without_dispatch_gets_one_span():
    sf = read_session(CORPUS / "runs.jsonl") if CORPUS.is_dir() else pytest.skip("corpus absent")
    spans = spans_of(otlp_request(sf))
    tools = [s for s in spans if s["name"] == "execute_tool bash"]
    verdicts = [[{a["key"]: a["value"]["stringValue"] for a in ev["attributes"]}["agentsession.decision.verdict"]
                 for ev in s.get("events", [])] for s in tools]
    # call_2 proceed+dispatch, call_3 rejected (never dispatched: a span from call to
    # output), call_1 held then dispatched by the resume.
    assert sorted(map(tuple, verdicts)) == [("hold",), ("proceed",), ("reject",)]
    runs = [s for s in spans if s["name"] == "run"]
    assert [attrs(r)["agentsession.run.reason"] for r in runs] == ["input_required", "done"]
    assert [attrs(r)["agentsession.run.source"] for r in runs] == ["input", "resume"]


def test_the_first_span_after_a_branch_links_the_branched_from_entry():
    b = SessionBuilder(Header.new("otel-branch", created_at="2026-09-17T12:00:00Z"))
    b.append("config", ts="2026-09-17T12:00:00Z", model="m")
    q = b.append("item", ts="2026-09-17T12:00:01Z", item={"type": "message", "role": "user", "content": []})
    b.append("response", ts="2026-09-17T12:00:02Z", response_id="r1", model="m")
    alt = b.branch(q.id, "response", ts="2026-09-17T12:00:03Z", response_id="r2", model="m")
    b.branch(alt.id, "response", ts="2026-09-17T12:00:04Z", response_id="r3", model="m")
    sf = read_session_bytes(b.to_bytes(), source="x")
    spans = {attrs(s).get("agentsession.entry.id"): s for s in spans_of(otlp_request(sf))}
    session_span = span_id("session:otel-branch")
    assert links(spans[alt.id]) == [("branched_from", session_span, q.id)]
    r3 = sf.entries[-1].id
    assert links(spans[r3]) == [("previous_turn", span_id(alt.id), alt.id)]


def test_at_limits_the_spans_to_one_path_and_the_command_writes_otlp_json(tmp_path):
    path = FIXTURES / "projections" / "delegate.jsonl"
    sf = read_session(path)
    alt = sf.entries[-2].id
    doc = otlp_request(sf, at=alt)
    names = [s["name"] for s in spans_of(doc)]
    assert names == ["session", "run", "chat gpt-5"]
    r = CliRunner().invoke(main, ["export", "--format", "otel", str(path)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == otlp_request(sf)
    out = tmp_path / "trace.json"
    r = CliRunner().invoke(main, ["export", "--format", "otel", "--at", alt[7:20], "-o", str(out), str(path)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text()) == doc
    parse(doc)


def test_span_times_read_the_admitted_ts_form_only():
    assert ts_unix_nanos("1970-01-01T00:00:01.5Z") == 1_500_000_000
    assert ts_unix_nanos("2026-09-17T12:00:02.000000001Z") == 1_789_646_402_000_000_001
    assert ts_unix_nanos("2026-09-17T12:00:02.50Z") is None  # not the admitted spelling
    assert ts_unix_nanos("1969-12-31T23:59:59Z") is None
    assert ts_unix_nanos(None) is None
