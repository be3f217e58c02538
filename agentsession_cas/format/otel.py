"""The OpenTelemetry projection (RFC 0001 "Projections", OpenTelemetry): a session as spans.

:func:`otlp_request` builds one OTLP/JSON ``ExportTraceServiceRequest`` (the body an
OTLP/HTTP collector takes at ``/v1/traces``) holding a span for the session, one per
run, one per model call (``chat <model>``) and one per hand-off of a call to its
tool (``execute_tool <name>``). Every span carries ``session.id`` and the id of the
entry it stands for. The links are the ones the RFC names: a tool span to the
inference span whose output held the call, an inference span to the previous
turn's, a re-dispatch to the dispatch before it, and the first span after a branch
to the branched-from entry.

Ids are derived, not random, so the same session always gives the same trace: the
trace id is the session id's 16 bytes (a UUID) or the first 16 bytes of its SHA-256,
a span id the first 8 bytes of the SHA-256 of the entry id it stands for. Times are
the entries' own ``ts``. ``docs/projections.md`` has the span table.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import field, replace
from typing import Any

from .. import __version__
from ..lean import dataclass
from .entry import Entry
from .reader import SessionFile
from .timestamps import ts_unix_nanos

__all__ = ["SPAN_KIND_CLIENT", "SPAN_KIND_INTERNAL", "otlp_request", "span_id", "trace_id"]

#: OTLP's ``Span.SpanKind`` numbers (OTLP/JSON writes enums as integers).
SPAN_KIND_INTERNAL = 1
SPAN_KIND_CLIENT = 3
_STATUS_ERROR = 2

SCOPE = "agentsession-cas"


def trace_id(session_id: str) -> str:
    """The trace of a session: its UUID's bytes, else the SHA-256 of its id, as 32 hex."""
    try:
        return uuid.UUID(session_id).hex
    except ValueError:
        return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def span_id(key: str) -> str:
    """The span standing for an entry (or ``session:<id>``): 16 hex of the key's SHA-256."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        v: dict[str, Any] = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    elif isinstance(value, list):
        v = {"arrayValue": {"values": [{"stringValue": str(x)} for x in value]}}
    else:
        v = {"stringValue": str(value)}
    return {"key": key, "value": v}


@dataclass
class _Span:
    key: str
    name: str
    kind: int
    start: int
    end: int
    parent: str | None
    attrs: dict[str, Any]
    links: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def as_dict(self, trace: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "traceId": trace,
            "spanId": span_id(self.key),
            "name": self.name,
            "kind": self.kind,
            "startTimeUnixNano": str(self.start),
            "endTimeUnixNano": str(max(self.end, self.start)),
            "attributes": [_attr(k, v) for k, v in self.attrs.items() if v is not None],
        }
        if self.parent is not None:
            out["parentSpanId"] = span_id(self.parent)
        if self.events:
            out["events"] = self.events
        if self.links:
            out["links"] = self.links
        if self.error is not None:
            out["status"] = {"code": _STATUS_ERROR, "message": self.error}
        return out


@dataclass(frozen=True)
class _State:
    """What the path up to an entry says, for the spans below it (shared, copied on change)."""

    run: tuple[str | None, str] | None = None  # (run_id, start entry id)
    previous_response: str | None = None
    last_span: str | None = None  # key of the latest span on the path
    dispatch_of: Mapping[str, str] = field(default_factory=dict)  # call_id -> its latest dispatch
    decisions: Mapping[str, tuple[Entry, ...]] = field(default_factory=dict)  # awaiting a dispatch
    outputs: tuple[tuple[str, Entry], ...] = ()  # (response id, item entry) of the open model call
    branch: tuple[str, str | None] | None = None  # (branched-from entry, its last span key)


class _Projection:
    def __init__(self, sf: SessionFile, scope: set[str] | None):
        self.sf = sf
        self.header = sf.header
        self.sid = sf.header.id
        self.trace = trace_id(self.sid)
        origin = sf.header.data.get("parent_session")
        self.origin_trace = trace_id(origin) if isinstance(origin, str) and origin else self.trace
        self.scope = scope
        self.session_key = f"session:{self.sid}"
        self.spans: dict[str, _Span] = {}
        self.producer: dict[str, str] = {}  # call_id -> response entry whose output held it
        self.calls: dict[str, Entry] = {}  # call_id -> the function_call item entry
        self._events: dict[str, dict[str, Any]] = {}  # decision entry id -> its span event
        base = sf.header.base
        ids = [e.id for e in sf.entries]
        self.prefix: set[str] = set(ids[: ids.index(base) + 1]) if base is not None and base in ids else set()

    def _ts(self, e: Entry) -> int:
        return ts_unix_nanos(e.ts) or 0

    def _link(self, key: str, rel: str, entry: str) -> dict[str, Any]:
        return {
            "traceId": self.origin_trace if entry in self.prefix else self.trace,
            "spanId": span_id(key),
            "attributes": [_attr("agentsession.link.rel", rel), _attr("agentsession.entry.id", entry)],
        }

    def _add(self, st: _State, span: _Span, entry: Entry) -> _State:
        """Emit a span for ``entry`` (when it is the session's own and in scope), with the
        branch link the path owes, and return the state after it."""
        if entry.id in self.prefix or (self.scope is not None and entry.id not in self.scope):
            return replace(st, last_span=span.key, branch=None)
        if st.branch is not None:
            point, key = st.branch
            span.links.insert(0, self._link(key or self.session_key, "branched_from", point))
        self.spans[span.key] = span
        return replace(st, last_span=span.key, branch=None)

    def _parent(self, st: _State) -> str:
        return st.run[1] if st.run is not None else self.session_key

    def _attrs(self, e: Entry, **more: Any) -> dict[str, Any]:
        return {"session.id": self.sid, "agentsession.entry.id": e.id, "agentsession.entry.type": e.type, **more}

    def step(self, st: _State, e: Entry) -> _State:
        t, d = e.type, e.data
        if t == "run" and d.get("phase") == "start":
            run_id = d.get("run_id") if isinstance(d.get("run_id"), str) else None
            span = _Span(e.id, "run", SPAN_KIND_INTERNAL, self._ts(e), self._ts(e), self.session_key,
                         self._attrs(e, **{"agentsession.run.id": run_id, "agentsession.run.source": d.get("source"),
                                           "agentsession.run.trigger": d.get("ref")}))
            return self._add(replace(st, run=(run_id, e.id)), span, e)
        if t == "run" and d.get("phase") == "end":
            if st.run is not None and st.run[0] == d.get("run_id"):
                run = self.spans.get(st.run[1])
                if run is not None:
                    run.end = max(run.end, self._ts(e))
                    run.attrs["agentsession.run.reason"] = d.get("reason")
                    run.attrs["agentsession.run.end.entry.id"] = e.id
                    if d.get("ref") is not None:
                        run.attrs["agentsession.run.cause"] = d.get("ref")
                return replace(st, run=None)
            return st
        if t == "item":
            return self._item(st, e)
        if t == "response":
            return self._response(st, e)
        if t == "decision":
            call_id = d.get("call_id")
            if not isinstance(call_id, str):
                return st
            event = {"timeUnixNano": str(self._ts(e)), "name": "decision",
                     "attributes": [_attr(k, v) for k, v in (("agentsession.entry.id", e.id), ("agentsession.decision.verdict", d.get("verdict")),
                                                           ("agentsession.decision.by", d.get("by")), ("agentsession.decision.reason", d.get("reason")))
                                    if v is not None]}
            held = st.dispatch_of.get(call_id)
            if held is not None and held in self.spans:
                self.spans[held].events.append(event)
                return st
            decisions = dict(st.decisions)
            decisions[call_id] = (*decisions.get(call_id, ()), e)
            self._events[e.id] = event
            return replace(st, decisions=decisions)
        if t == "dispatch":
            return self._dispatch(st, e)
        return st

    def _item(self, st: _State, e: Entry) -> _State:
        item = e.data.get("item")
        if not isinstance(item, dict):
            return st
        rid = e.data.get("response")
        kind = item.get("type")
        call_id = item.get("call_id")
        if kind == "function_call" and isinstance(call_id, str):
            self.calls.setdefault(call_id, e)
        if isinstance(rid, str):
            outputs = st.outputs if st.outputs and st.outputs[-1][0] == rid else ()
            return replace(st, outputs=(*outputs, (rid, e)))
        st = replace(st, outputs=()) if st.outputs else st
        if kind == "function_call_output" and isinstance(call_id, str):
            key = st.dispatch_of.get(call_id)
            span = self.spans.get(key) if key is not None else None
            if span is not None:
                span.end = max(span.end, self._ts(e))
                span.attrs["agentsession.call.output.entry.id"] = e.id
                return st
            if key is None:
                # A call no dispatch handed over (a writer that records none): one span
                # from the call to its output.
                call = self.calls.get(call_id)
                start = self._ts(call) if call is not None else self._ts(e)
                span = self._tool_span(st, e, call_id, start)
                span.end = self._ts(e)
                span.attrs["agentsession.call.output.entry.id"] = e.id
                return self._add(st, span, e)
        return st

    def _tool_span(self, st: _State, e: Entry, call_id: str, start: int) -> _Span:
        call = self.calls.get(call_id)
        name = call.data["item"].get("name") if call is not None else None
        span = _Span(e.id, f"execute_tool {name}" if name else "execute_tool", SPAN_KIND_INTERNAL, start, start,
                     self._parent(st),
                     self._attrs(e, **{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                                       "gen_ai.tool.call.id": call_id,
                                       "agentsession.call.entry.id": call.id if call is not None else None}))
        producer = self.producer.get(call_id)
        if producer is not None:
            span.links.append(self._link(producer, "produced_by", producer))
        for d in st.decisions.get(call_id, ()):
            span.events.append(self._events[d.id])
        return span

    def _dispatch(self, st: _State, e: Entry) -> _State:
        call_id = e.data.get("call_id")
        if not isinstance(call_id, str):
            return st
        span = self._tool_span(st, e, call_id, self._ts(e))
        if e.data.get("idempotency_key") is not None:
            span.attrs["agentsession.dispatch.idempotency_key"] = e.data["idempotency_key"]
        before = st.dispatch_of.get(call_id)
        if before is not None:
            span.links.append(self._link(before, "previous_dispatch", before))
        dispatch_of = dict(st.dispatch_of)
        dispatch_of[call_id] = e.id
        decisions = {k: v for k, v in st.decisions.items() if k != call_id}
        return self._add(replace(st, dispatch_of=dispatch_of, decisions=decisions), span, e)

    def _response(self, st: _State, e: Entry) -> _State:
        d = e.data
        rid = d.get("response_id")
        outputs = [o for r, o in st.outputs if r == rid] if isinstance(rid, str) else []
        for o in outputs:
            item = o.data.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call" and isinstance(item.get("call_id"), str):
                self.producer.setdefault(item["call_id"], e.id)
        end = self._ts(e)
        latency = d.get("latency_ms")
        if isinstance(latency, int) and not isinstance(latency, bool) and latency >= 0:
            start = end - latency * 1_000_000
        else:
            start = self._ts(outputs[0]) if outputs else end
        model = d.get("model") if isinstance(d.get("model"), str) else None
        given = d.get("usage")
        usage: dict[str, Any] = given if isinstance(given, dict) else {}
        span = _Span(e.id, f"chat {model}" if model else "chat", SPAN_KIND_CLIENT, start, end, self._parent(st),
                     self._attrs(e, **{"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                       "gen_ai.response.model": model, "gen_ai.response.id": rid,
                                       "gen_ai.usage.input_tokens": usage.get("input_tokens"),
                                       "gen_ai.usage.output_tokens": usage.get("output_tokens"),
                                       "agentsession.response.attempts": d.get("attempts")}))
        if d.get("error") is not None:
            span.error = str(d["error"].get("message") if isinstance(d["error"], dict) else d["error"])
        if st.previous_response is not None:
            span.links.append(self._link(st.previous_response, "previous_turn", st.previous_response))
        return self._add(replace(st, previous_response=e.id, outputs=()), span, e)

    def build(self) -> dict[str, Any]:
        tree = self.sf.tree
        states: dict[str, _State] = {}
        start_state = _State()
        for e in self.sf.entries:
            if self.scope is not None and e.id not in self.scope:
                continue
            parent = e.parent
            st = states.get(parent, start_state) if parent is not None else start_state
            siblings = tree.children(parent)
            if len(siblings) > 1 and siblings[0] is not e and parent is not None:
                # A later child of a branch point: its first span links back to it.
                st = replace(st, branch=(parent, st.last_span))
            states[e.id] = self.step(st, e)
        created = ts_unix_nanos(self.header.data.get("created_at"))
        times = [s.start for s in self.spans.values()] + [s.end for s in self.spans.values()]
        start = created if created is not None else min(times, default=0)
        session = _Span(self.session_key, "session", SPAN_KIND_INTERNAL, start, max(times, default=start), None,
                        {"session.id": self.sid, "agentsession.harness": _harness(self.header.data.get("harness"))})
        spans = [session.as_dict(self.trace)] + [s.as_dict(self.trace) for s in self.spans.values()]
        harness = self.header.data.get("harness")
        service = harness.get("name") if isinstance(harness, dict) and isinstance(harness.get("name"), str) else "agentsession"
        return {
            "resourceSpans": [{
                "resource": {"attributes": [_attr("service.name", service)]},
                "scopeSpans": [{"scope": {"name": SCOPE, "version": __version__}, "spans": spans}],
            }]
        }


def _harness(value: Any) -> str | None:
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        version = value.get("version")
        return f"{value['name']} {version}" if isinstance(version, str) else value["name"]
    return None


def otlp_request(sf: SessionFile, *, at: str | None = None) -> dict[str, Any]:
    """The session (or, with ``at``, the path from the root to that entry) as an OTLP/JSON
    ``ExportTraceServiceRequest``. Trace and span ids are hex, as OTLP/JSON writes them."""
    scope = {e.id for e in sf.tree.path(sf.resolve(at).id)} if at is not None else None
    return _Projection(sf, scope).build()
