"""The ATIF projection (RFC 0001 "Projections", ATIF): a path as one ATIF v1.8 document.

One document per root-to-leaf path, or at any entry (:func:`trajectory_at`), so the
document a judge's score names can be rebuilt after the leaf has moved on. The steps
are the context the algorithm builds at the entry (a fold's summary, then what it
kept, then what followed), so they come from
:class:`~agentsession_cas.format.context.ContextBuilder`; the metrics total every
model call on the whole path. What has no step of its own travels in ``extra``
(``run``, ``calls``, ``queued``, the raw items), so nothing the path says is lost.
``docs/projections.md`` gives the mapping row by row, and the decisions where the
RFC leaves one to the projection.

This module builds plain JSON values (dicts); it imports no ATIF library. The tests
validate what it builds with the ``atif`` package's Pydantic models.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import ContextError
from ..lean import dataclass
from .context import ContextBuilder
from .entry import Entry, Header
from .reader import SessionFile

__all__ = [
    "ATIF_SCHEMA_VERSION",
    "ChildResolver",
    "document_name",
    "trajectories",
    "trajectory_at",
]

ATIF_SCHEMA_VERSION = "ATIF-v1.8"

#: Given a child session's id and the leaf a parent's output named (or None: the
#: projection chooses), the child's file and the entry to build its document at, or
#: None when the child cannot be found (a file names no store).
ChildResolver = Callable[[str, "str | None"], "tuple[SessionFile, str] | None"]

#: Record entries with no step and no place of their own: kept, raw, in the
#: document's top-level ``extra.records`` so the projection loses none of them.
_PLAIN_RECORDS = frozenset(("label", "info", "env", "outcome", "custom"))


_NOT_CARRIED = frozenset(("id", "parent", "parents"))


def _body(entry: Entry, drop: Sequence[str] = ()) -> dict[str, Any]:
    """An entry's members with its id as ``entry`` and without ``parent``/``parents``
    (the document's order says where it was): how a record travels in an ``extra``."""
    out: dict[str, Any] = {"entry": entry.id}
    for k, v in entry.data.items():
        if k not in _NOT_CARRIED and k not in drop:
            out[k] = v
    return out


def _text(parts: Any, kinds: Sequence[str]) -> str:
    """The texts of a content list (parts whose ``type`` is one of ``kinds``), joined by
    blank lines; a string is itself."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        return ""
    texts = [p["text"] for p in parts if isinstance(p, dict) and p.get("type") in kinds and isinstance(p.get("text"), str)]
    return "\n\n".join(texts)


_MESSAGE_TEXT = ("input_text", "output_text", "text", "summary_text", "refusal")


def _item_text(item: Any) -> str:
    """What a person reads of an item: a message's texts, a summary's, a refusal."""
    if not isinstance(item, dict):
        return ""
    if item.get("type") == "message":
        return _text(item.get("content"), _MESSAGE_TEXT) or _refusal(item.get("content"))
    if item.get("type") == "compaction":
        return _text(item.get("summary"), _MESSAGE_TEXT) or ""
    for key in ("content", "summary", "output"):
        t = _text(item.get(key), _MESSAGE_TEXT)
        if t:
            return t
    return ""


def _refusal(parts: Any) -> str:
    if isinstance(parts, list):
        return "\n\n".join(p["refusal"] for p in parts if isinstance(p, dict) and isinstance(p.get("refusal"), str))
    return ""


def _reasoning_text(item: Mapping[str, Any]) -> str:
    """A reasoning item's readable part: its summary, else its content's texts."""
    return _text(item.get("summary"), ("summary_text",)) or _text(item.get("content"), ("reasoning_text", "text"))


def _arguments(raw: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """ATIF wants an object; a call's ``arguments`` is a JSON string. One that is not an
    object is kept as written in the tool call's ``extra``."""
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value, None
    return {}, {"arguments": raw}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage_metrics(usage: Any) -> dict[str, Any] | None:
    """ATIF step metrics from an Open Responses ``usage`` (the raw usage rides in
    ``extra``, so provider members survive)."""
    if not isinstance(usage, dict):
        return None
    m: dict[str, Any] = {}
    if _int(usage.get("input_tokens")) is not None:
        m["prompt_tokens"] = usage["input_tokens"]
    if _int(usage.get("output_tokens")) is not None:
        m["completion_tokens"] = usage["output_tokens"]
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and _int(details.get("cached_tokens")) is not None:
        m["cached_tokens"] = details["cached_tokens"]
    m["extra"] = {"usage": usage}
    return m


def _attempts(response: Entry) -> int:
    n = _int(response.data.get("attempts"))
    return n if n is not None and n > 0 else 1


@dataclass
class _Totals:
    prompt: int = 0
    completion: int = 0
    cached: int = 0
    seen: bool = False

    def add(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self.seen = True
        self.prompt += _int(usage.get("input_tokens")) or 0
        self.completion += _int(usage.get("output_tokens")) or 0
        details = usage.get("input_tokens_details")
        if isinstance(details, dict):
            self.cached += _int(details.get("cached_tokens")) or 0


class _Builder:
    """One document: the steps in order, with where each call and run lands."""

    def __init__(self, sf: SessionFile, leaf: Entry, resolve_child: ChildResolver | None, depth: int):
        self.sf = sf
        self.leaf = leaf
        self.resolve_child = resolve_child
        self.depth = depth
        self.steps: list[dict[str, Any]] = []
        #: call_id -> the agent step whose output holds the call
        self.call_step: dict[str, dict[str, Any]] = {}
        #: response_id -> the agent step its output opened (until the response closes it)
        self.open_agent: dict[str, Any] | None = None
        self.open_response: str | None = None
        self.top_extra: dict[str, Any] = {}
        #: Run records (and queued inputs) waiting for the next step their segment produces.
        self.waiting_runs: list[dict[str, Any]] = []
        self.runs_by_id: dict[str, dict[str, Any]] = {}
        self.waiting_queued: list[dict[str, Any]] = []
        self.subagents: list[dict[str, Any]] = []
        #: call_id -> the subsession link naming it
        self.links: dict[str, Entry] = {}
        #: Every run record in the runs' own order, and those that produced no step
        #: (by id()): they travel in the document's top-level ``extra``.
        self.all_runs: list[dict[str, Any]] = []
        self.stepless: set[int] = set()

    # -- steps ----------------------------------------------------------------

    def _new_step(self, entry: Entry, source: str, message: Any, **members: Any) -> dict[str, Any]:
        step: dict[str, Any] = {"step_id": len(self.steps) + 1, "timestamp": entry.ts, "source": source, "message": message}
        step.update({k: v for k, v in members.items() if v is not None})
        extra: dict[str, Any] = step.setdefault("extra", {})
        extra.setdefault("entry", entry.id)
        if self.waiting_runs:
            extra["run"] = self.waiting_runs
            self.waiting_runs = []
        if self.waiting_queued:
            extra["queued"] = self.waiting_queued
            self.waiting_queued = []
        self.steps.append(step)
        return step

    def _close_agent(self) -> None:
        self.open_agent = None
        self.open_response = None

    def _item(self, e: Entry) -> None:
        item = e.data.get("item")
        if not isinstance(item, dict):
            return
        rid = e.data.get("response")
        if isinstance(rid, str):
            self._agent_output(e, item, rid)
            return
        self._close_agent()
        kind = item.get("type")
        if kind == "function_call_output":
            self._observation(e, item)
            return
        role = item.get("role") if kind == "message" else None
        extra: dict[str, Any] = {"entry": e.id, "item": item}
        for member in ("source", "queued_from", "visible"):
            if member in e.data:
                extra[member] = e.data[member]
        if role == "user":
            self._new_step(e, "user", _item_text(item), extra=extra)
        elif role in ("system", "developer"):
            self._new_step(e, "system", _item_text(item), extra=extra)
        elif role == "assistant":
            # Written by the harness, not returned by a model call: no inference.
            self._new_step(e, "agent", _item_text(item), extra=extra, llm_call_count=0)
        else:
            self._new_step(e, "system", _item_text(item), extra=extra)

    def _agent_output(self, e: Entry, item: dict[str, Any], rid: str) -> None:
        step = self.open_agent
        if step is None or self.open_response != rid:
            step = self._new_step(e, "agent", "", extra={"entry": e.id, "response_id": rid, "items": []})
            self.open_agent, self.open_response = step, rid
        step["extra"]["items"].append({"entry": e.id, "item": item})
        kind = item.get("type")
        if kind == "message":
            text = _item_text(item)
            step["message"] = f"{step['message']}\n\n{text}" if step["message"] and text else step["message"] or text
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text:
                prev = step.get("reasoning_content")
                step["reasoning_content"] = f"{prev}\n\n{text}" if prev else text
        elif kind == "function_call":
            call_id = item.get("call_id")
            if isinstance(call_id, str) and call_id:
                args, extra = _arguments(item.get("arguments"))
                call: dict[str, Any] = {"tool_call_id": call_id, "function_name": str(item.get("name") or ""), "arguments": args}
                if extra is not None:
                    call["extra"] = extra
                step.setdefault("tool_calls", []).append(call)
                self.call_step[call_id] = step

    def _response(self, e: Entry) -> None:
        rid = e.data.get("response_id")
        step = self.open_agent if isinstance(rid, str) and rid == self.open_response else None
        if step is None:
            # A model call with no output on the path (an error, an empty turn).
            step = self._new_step(e, "agent", "", extra={"entry": e.id})
        step["extra"]["response"] = _body(e)
        model = e.data.get("model")
        if isinstance(model, str) and model:
            step["model_name"] = model
        metrics = _usage_metrics(e.data.get("usage"))
        if metrics is not None:
            step["metrics"] = metrics
        step["llm_call_count"] = _attempts(e)
        self._close_agent()

    def _observation(self, e: Entry, item: dict[str, Any]) -> None:
        call_id = item.get("call_id")
        output = item.get("output")
        content: Any = output if isinstance(output, str) else _text(output, _MESSAGE_TEXT) or json.dumps(output, ensure_ascii=False)
        result: dict[str, Any] = {"content": content, "extra": {"entry": e.id, "item": item}}
        if "parents" in e.data:
            result["extra"]["parents"] = e.data["parents"]
        step = self.call_step.get(call_id) if isinstance(call_id, str) else None
        if step is None or not isinstance(call_id, str):
            # The call is not in the document (before a fold, or never made on this
            # path): the output is a system step, its call named in extra.
            result["extra"]["call_id"] = call_id
            self._new_step(e, "system", "", observation={"results": [result]}, extra={"entry": e.id})
            return
        result["source_call_id"] = call_id
        self._subagent(e, call_id, result)
        step.setdefault("observation", {"results": []})["results"].append(result)

    def _subagent(self, e: Entry, call_id: str, result: dict[str, Any]) -> None:
        """The output of a call that spawned a subsession names the child's trajectory:
        the leaf ``parents`` names, or one the projection chooses (and says so)."""
        link = self.links.get(call_id)
        if link is None:
            return
        child = link.data.get("session")
        if not isinstance(child, str):
            return
        named = [p.entry for p in e.parents if p.session == child]
        leaf = named[-1] if named else None
        ref: dict[str, Any] = {"session_id": child, "extra": {"link": link.id, "leaf_chosen": leaf is None}}
        found = self.resolve_child(child, leaf) if self.resolve_child is not None and self.depth < _MAX_DEPTH else None
        if found is not None:
            child_sf, child_leaf = found
            doc = trajectory_at(child_sf, child_leaf, resolve_child=self.resolve_child, _depth=self.depth + 1)
            tid = doc["trajectory_id"]
            ref["trajectory_id"] = tid
            if all(s.get("trajectory_id") != tid for s in self.subagents):
                self.subagents.append(doc)
        else:
            ref["trajectory_path"] = document_name(child, leaf, None)
            if leaf is not None:
                ref["extra"]["leaf"] = leaf
        result["subagent_trajectory_ref"] = [ref]

    def _fold(self, e: Entry) -> None:
        self._close_agent()
        summary = e.data.get("summary")
        extra: dict[str, Any] = {"entry": e.id, "type": e.type, "summary": summary}
        for member in ("pinned", "usage", "first_kept", "from", "tokens_before"):
            if member in e.data:
                extra[member] = e.data[member]
        self._new_step(e, "system", _item_text(summary), is_copied_context=True, extra=extra)

    def _run(self, e: Entry) -> None:
        run_id = e.data.get("run_id")
        phase = e.data.get("phase")
        key = run_id if isinstance(run_id, str) else e.id
        if phase == "start":
            rec: dict[str, Any] = {"run_id": run_id, "source": e.data.get("source"), "start": e.id}
            if "ref" in e.data:
                rec["trigger"] = e.data["ref"]
            if "trigger" in e.data:
                rec["arrival"] = e.data["trigger"]
            self.runs_by_id[key] = rec
            self.waiting_runs.append(rec)
            self.all_runs.append(rec)
            self._close_agent()
        elif phase == "end":
            rec = self.runs_by_id.pop(key, {})
            if not rec:
                # Its start is before the fold: the end alone is in the document.
                rec.update(run_id=run_id)
                self.all_runs.append(rec)
                self.stepless.add(id(rec))
            elif any(r is rec for r in self.waiting_runs):
                # Its segment produced no step (a refusal on resume, say).
                self.waiting_runs = [r for r in self.waiting_runs if r is not rec]
                self.stepless.add(id(rec))
            rec["end"] = e.id
            rec["reason"] = e.data.get("reason")
            if "ref" in e.data:
                rec["cause"] = e.data["ref"]
            if "pending" in e.data:
                rec["pending"] = e.data["pending"]

    def _call_record(self, e: Entry) -> None:
        call_id = e.data.get("call_id")
        if not isinstance(call_id, str):
            return
        step = self.call_step.get(call_id)
        holder = step.setdefault("extra", {}) if step is not None else self.top_extra
        calls = holder.setdefault("calls", {})
        rec = calls.setdefault(call_id, {})
        body = _body(e, drop=("call_id",))
        if e.type == "decision":
            rec.setdefault("decisions", []).append(body)
        else:
            rec.setdefault("dispatches", []).append(body)
            rec.setdefault("dispatch", body)

    def build(self) -> dict[str, Any]:
        sf, leaf = self.sf, self.leaf
        path = sf.tree.path(leaf.id)
        builder = ContextBuilder().extend(path)
        if builder.error is not None:
            raise ContextError(builder.error)
        shown = builder.selected_entries()
        shown_ids = {e.id for e in shown}
        records: list[dict[str, Any]] = []
        other_links: list[dict[str, Any]] = []
        continued: str | None = None
        for e in path:
            if e.type == "link" and e.data.get("rel") == "subsession" and isinstance(e.data.get("call_id"), str):
                self.links.setdefault(e.data["call_id"], e)
        compaction = builder.compaction[0] if builder.compaction is not None else None
        for e in shown:
            t = e.type
            if t == "item":
                self._item(e)
            elif t == "response":
                self._response(e)
            elif t == "compaction":
                if compaction is not None and path[compaction] is e:
                    self._fold(e)
                else:
                    records.append(_body(e))  # an earlier fold the last one kept: no context
            elif t == "branch_summary":
                self._fold(e)
            elif t == "run":
                self._run(e)
            elif t in ("decision", "dispatch"):
                self._call_record(e)
            elif t == "queued":
                self.waiting_queued.append(_body(e))
            elif t == "link":
                body = _body(e)
                other_links.append(body)
                if e.data.get("rel") == "continued_in" and isinstance(e.data.get("session"), str):
                    continued = e.data["session"]
            elif t == "config":
                continue
            else:
                records.append(_body(e))
        # A call handed to its tool once keeps its one dispatch; the list says "more than once".
        for holder in [s.get("extra", {}) for s in self.steps] + [self.top_extra]:
            for rec in holder.get("calls", {}).values():
                if len(rec.get("dispatches", ())) < 2:
                    rec.pop("dispatches", None)
        # Runs and queued inputs no step followed travel at the top level.
        self.stepless.update(id(r) for r in self.waiting_runs)
        if self.stepless:
            self.top_extra["run"] = [r for r in self.all_runs if id(r) in self.stepless]
        if self.waiting_queued:
            self.top_extra["queued"] = self.waiting_queued

        totals = _Totals()
        model_calls = 0
        hidden_calls = 0
        for e in path:
            if e.type == "response":
                totals.add(e.data.get("usage"))
                model_calls += _attempts(e)
                if e.id not in shown_ids:
                    hidden_calls += _attempts(e)
            elif e.type in ("compaction", "branch_summary"):
                totals.add(e.data.get("usage"))
        final: dict[str, Any] = {"total_steps": len(self.steps) + hidden_calls, "extra": {"model_calls": model_calls}}
        if totals.seen:
            final.update(total_prompt_tokens=totals.prompt, total_completion_tokens=totals.completion,
                         total_cached_tokens=totals.cached)

        header = sf.header
        given = header.data.get("harness")
        harness: dict[str, Any] = given if isinstance(given, dict) else {}
        settings = builder.settings
        agent: dict[str, Any] = {
            "name": str(harness.get("name") or "unknown"),
            "version": str(harness.get("version") or "unknown"),
        }
        if settings.model:
            agent["model_name"] = settings.model
        if settings.tools:
            agent["tool_definitions"] = [t for t in settings.tools if isinstance(t, dict)]
        doc: dict[str, Any] = {
            "schema_version": ATIF_SCHEMA_VERSION,
            "session_id": header.id,
            "trajectory_id": leaf.id,
            "agent": agent,
            "steps": self.steps,
        }
        if hidden_calls:
            folded = "call" if hidden_calls == 1 else "calls"
            doc["notes"] = (
                f"total_steps counts the {len(self.steps)} steps shown and {hidden_calls} model {folded} a compaction "
                "replaced, which the steps do not show; final_metrics total every model call on the path."
            )
        doc["final_metrics"] = final
        if continued is not None:
            doc["continued_trajectory_ref"] = document_name(continued, None, None)
        top = self.top_extra
        top["header"] = header.data
        top["settings"] = settings.as_dict()
        if records:
            top["records"] = records
        if other_links:
            top["links"] = other_links
        doc["extra"] = top
        if self.subagents:
            doc["subagent_trajectories"] = self.subagents
        return doc


#: How deep embedded subsessions go (a child that links back would loop).
_MAX_DEPTH = 8


def trajectory_at(
    sf: SessionFile,
    entry_id: str,
    *,
    resolve_child: ChildResolver | None = None,
    _depth: int = 0,
) -> dict[str, Any]:
    """The ATIF document of the path from the root to ``entry_id`` (its
    ``trajectory_id``). Raises NoSuchEntryError for an entry the file lacks and
    ContextError when the path's last compaction cannot be applied."""
    entry = sf.resolve(entry_id)
    return _Builder(sf, entry, resolve_child, _depth).build()


def trajectories(sf: SessionFile, *, resolve_child: ChildResolver | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """One ``(file name, document)`` per leaf of the session, the resume leaf's first
    (named ``<session>.json``), then the other leaves in file order
    (``<session>_<leaf hex>.json``). The prefix of a fork is not a leaf of its own."""
    current = sf.leaf
    tree = sf.tree
    leaves: list[str] = []
    for found in tree.leaves():
        # A ``leaf`` label marks a branch; the path it ends is its parent's.
        e: Entry | None = found
        while e is not None and e.is_leaf_label:
            e = tree.get(e.parent) if e.parent is not None else None
        if e is not None and e.id not in tree.prefix and e.id not in leaves:
            leaves.append(e.id)
    if current is not None and current in leaves:
        leaves.remove(current)
        leaves.insert(0, current)
    for leaf in leaves:
        yield document_name(sf.header.id, leaf, current), trajectory_at(sf, leaf, resolve_child=resolve_child)


def document_name(session_id: str, leaf: str | None, current: str | None) -> str:
    """The file a document is written to: ``<session>.json`` for the current leaf's
    path (and for a reference to a session's current path), ``<session>_<hex>.json``
    for another leaf, by the first 16 hex digits of its id."""
    if leaf is None or leaf == current:
        return f"{session_id}.json"
    return f"{session_id}_{leaf.removeprefix('sha256:')[:16]}.json"


def header_of(doc: Mapping[str, Any]) -> Header:
    """The session header a document carries in its ``extra`` (for a reader)."""
    return Header(dict(doc["extra"]["header"]))
