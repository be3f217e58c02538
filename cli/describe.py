"""One-line descriptions of entries for people reading ``show`` output."""

from __future__ import annotations

import json
import re
from typing import Any

from agentsession_cas import Entry, short_id
from agentsession_cas.format.context import Settings, tool_name

from .common import plural, size

_WS = re.compile(r"\s+")
WIDTH = 72


def quote(text: str, width: int = WIDTH) -> str:
    """Collapse whitespace, cut to ``width`` characters with an ellipsis, and quote."""
    # " ".join(t.split()) is _WS.sub(" ", t).strip(): \s and str.split take the same characters.
    # A long text's first characters are all a summary shows: when a head of it collapses
    # to more than ``width`` of them, the rest of it cannot change what is shown. A short
    # head is tried first (most texts hold no long run of white space), then a longer one.
    collapsed = None
    for head_size in (2 * width, 8 * width):
        if len(text) <= head_size:
            break
        head = " ".join(text[:head_size].split())
        if len(head) > width:
            collapsed = head
            break
    if collapsed is None:
        collapsed = " ".join(text.split())
    if len(collapsed) > width:
        collapsed = collapsed[: width - 1] + "\u2026"
    return _json_string(collapsed)


#: ``json.dumps(text, ensure_ascii=False)`` of a string, without an encoder made per call
#: (show quotes a summary for every entry).
_json_string = json.encoder.encode_basestring


def _item_text(item: dict[str, Any]) -> str | None:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [str(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if parts:
            return " ".join(parts)
    return None


def describe_item(item: Any) -> str:
    if not isinstance(item, dict):
        return "-"
    kind = item.get("type")
    if kind == "message":
        text = _item_text(item)
        if text is not None:
            return f"{item.get('role', '?')}: {quote(text)}"
        content = item.get("content")
        if isinstance(content, list) and content:
            kinds = ", ".join(str(p.get("type")) for p in content if isinstance(p, dict))
            return f"{item.get('role', '?')}: [{kinds}]"
        return f"{item.get('role', '?')}: (empty)"
    if kind == "function_call":
        return f"call {item.get('name')}({quote(str(item.get('arguments', '')), 40)})"
    if kind == "function_call_output":
        out = item.get("output")
        text = out if isinstance(out, str) else json.dumps(out, ensure_ascii=False)
        return f"output {item.get('call_id')}: {quote(text)}"
    if kind == "reasoning":
        summary = item.get("summary")
        if isinstance(summary, list):
            texts = [str(s["text"]) for s in summary if isinstance(s, dict) and isinstance(s.get("text"), str)]
            if texts:
                return f"reasoning: {quote(' '.join(texts))}"
        return "reasoning (encrypted)" if item.get("encrypted_content") else "reasoning"
    return str(kind)


def _trigger(t: dict[str, Any]) -> str:
    out = str(t.get("kind", "?"))
    if isinstance(t.get("ref"), str):
        out += f" {t['ref'][:24]}"
    if isinstance(t.get("source"), str):
        out += f" via {t['source']}"
    return out


def _describe_config(d: dict[str, Any]) -> str:
    parts = []
    if d.get("replace") is True:
        parts.append("replace")
    if "model" in d:
        parts.append(f"model {d['model']}")
    if isinstance(d.get("instructions"), str):
        parts.append(f"instructions {quote(d['instructions'], 40)}")
    if isinstance(d.get("instructions_parts"), list):
        names = []
        for el in d["instructions_parts"]:
            if not isinstance(el, dict):
                names.append("?")
            elif isinstance(el.get("id"), str) and el["id"]:
                if isinstance(el.get("text"), str):
                    names.append(f"{el['id']}({size(len(el['text'].encode('utf-8', 'surrogatepass')))})")
                elif "hash" in el:
                    names.append(f"{el['id']}=")
                else:
                    names.append(f"{el['id']}({size(0)})")
            elif isinstance(el.get("keep"), int):
                names.append(f"+{el['keep']}")
            else:
                names.append("?")
        parts.append(f"instructions [{', '.join(names)}]")
    omitted = d.get("instructions_omitted")
    if isinstance(omitted, list):
        if not omitted:
            parts.append("omitted cleared")
        else:
            names = []
            for el in omitted:
                if isinstance(el, dict) and isinstance(el.get("id"), str) and el["id"]:
                    names.append(f"{el['id']} ({el.get('reason', '?')})")
                elif isinstance(el, dict) and isinstance(el.get("keep"), int):
                    names.append(f"+{el['keep']}" + (f" of {short_id(el['of'])}" if isinstance(el.get("of"), str) else ""))
                else:
                    names.append("?")
            parts.append("omitted " + ", ".join(names))
    omit = d.get("omit")
    if isinstance(omit, dict):
        words = _omit_words(omit)
        parts.append("omit " + (", ".join(words) if words else "cleared"))
    if d.get("reasoning") is not None:
        parts.append("reasoning")
    if d.get("text") is not None:
        parts.append("text")
    added = d.get("tools_added")
    for tool in added if isinstance(added, list) else []:
        if isinstance(tool, dict):
            parts.append(f"+{tool.get('name')}")
    removed = d.get("tools_removed")
    for tool in removed if isinstance(removed, list) else []:
        parts.append(f"-{tool}")
    if isinstance(d.get("extra"), dict):
        parts.extend(f"extra.{k}" for k in sorted(d["extra"]))
    return ", ".join(parts) or "no change"


def _omit_words(omit: dict[str, Any]) -> list[str]:
    words = []
    if isinstance(omit.get("reasoning"), str):
        words.append(f"reasoning {omit['reasoning']}")
    if isinstance(omit.get("items"), list) and omit["items"]:
        words.append(plural(len(omit['items']), "item"))
    outputs = omit.get("outputs")
    if isinstance(outputs, dict):
        n = len(outputs["items"]) if isinstance(outputs.get("items"), list) else 0
        words.append(f"outputs of {plural(n, 'item')}")
    images = omit.get("images")
    if isinstance(images, dict):
        if "before" in images:
            words.append(f"images before {short_id(images['before'])}")
        else:
            words.append(f"images but the last {images.get('keep')}")
    return words


def settings_rows(settings: Settings) -> list[tuple[str, str]]:
    """The settings in force, one (key, value) row each, for the context block of ``show``."""
    rows = [("model", settings.model or "-")]
    rows.append(("instructions", quote(settings.instructions or "")))
    if settings.parts:
        shown = []
        for p in settings.parts:
            if p.unresolved:
                written = p.written
                if isinstance(written, dict) and isinstance(written.get("id"), str):
                    shown.append(f"{written['id']} unresolved")
                elif isinstance(written, dict) and isinstance(written.get("keep"), int):
                    shown.append(f"keep {written['keep']} unresolved")
                else:
                    shown.append("- unresolved")
            else:
                size = len((p.text or "").encode("utf-8", "surrogatepass"))
                shown.append(f"{p.id} {size}B" + (f" from {p.source}" if p.source else ""))
        rows.append(("parts", ", ".join(shown)))
    if settings.omitted:
        shown = []
        for o in settings.omitted:
            data = o.data
            if not o.unresolved:
                shown.append(f"{data['id']} {data.get('size', '?')}B ({data.get('reason', '?')})")
            elif isinstance(data, dict) and isinstance(data.get("keep"), int):
                of = data.get("of")
                shown.append(f"keep {data['keep']}" + (f" of {short_id(of)}" if isinstance(of, str) else "") + " unresolved")
            else:
                shown.append("- unresolved")
        rows.append(("omitted", ", ".join(shown)))
    if not settings.omit.zero:
        rows.append(("omit", ", ".join(_omit_words(settings.omit.as_dict()))))
    if settings.reasoning not in (None, {}):
        rows.append(("reasoning", _WS.sub(" ", json.dumps(settings.reasoning, ensure_ascii=False))))
    if settings.text not in (None, {}):
        rows.append(("text", _WS.sub(" ", json.dumps(settings.text, ensure_ascii=False))))
    if settings.tools:
        rows.append(("tools", ", ".join(tool_name(t) or "?" for t in settings.tools)))
    if settings.extra:
        rows.append(("extra", ", ".join(sorted(settings.extra))))
    return rows


def describe(entry: Entry, verbose: bool = False, *, item: str | None = None) -> str:
    """A one-line summary of an entry, by type; ``item``: an item entry's
    :func:`describe_item`, when the caller made it already."""
    t = entry.type
    d = entry.data
    if t == "item":
        out = describe_item(d.get("item")) if item is None else item
        if isinstance(d.get("response"), str):
            out += f" ({d['response']})"
        if isinstance(d.get("source"), dict):
            out += f" from {_trigger(d['source'])}"
        return ("hidden " + out) if d.get("visible") is False else out
    if t == "response":
        given = d.get("usage")
        usage: dict[str, Any] = given if isinstance(given, dict) else {}
        out = f"{d.get('response_id', '-')} {d.get('model') or '-'} {d.get('status', '')}".rstrip()
        if usage.get("input_tokens") is not None:
            out += f" {usage.get('input_tokens')}+{usage.get('output_tokens')} tokens"
        if isinstance(d.get("request_hash"), str):
            out += f" hash {d['request_hash'][:18]}\u2026"
        if isinstance(d.get("attempts"), int) and d["attempts"] > 1:
            out += f" {d['attempts']} attempts"
        error = d.get("error")
        if isinstance(error, dict):
            out += f" error {quote(str(error.get('message', '')), 40)}"
        return out
    if t == "config":
        return _describe_config(d)
    if t == "compaction":
        out = f"first kept {short_id(d.get('first_kept'))}; {describe_item(d.get('summary'))}"
        if isinstance(d.get("pinned"), list) and d["pinned"]:
            out += f"; {len(d['pinned'])} pinned"
        if isinstance(d.get("tokens_before"), int):
            out += f" ({d['tokens_before']} tokens before)"
        return out
    if t == "branch_summary":
        return f"from {short_id(d.get('from'))}; {describe_item(d.get('summary'))}"
    if t == "label":
        if d.get("label") is None:
            return f"{short_id(d.get('target'))} cleared"
        target = "root" if d.get("target") is None else short_id(d.get("target"))
        return f"{target} = {d.get('label')}" + (" (synthetic)" if entry.synthetic else "")
    if t == "info":
        return f"name {quote(str(d['name']))}" if "name" in d else "info"
    if t == "outcome":
        out = str(d.get("kind", "outcome"))
        if "target" in d:
            out += f" on {short_id(d.get('target'))}"
        if "score" in d:
            out += f" score {d['score']}"
        if "pass" in d:
            out += " pass" if d["pass"] else " fail"
        if isinstance(d.get("label"), str):
            out += f" {d['label']}"
        return out
    if t == "link":
        return f"{d.get('rel')} {d.get('session')}" + (f" via {d['call_id']}" if "call_id" in d else "")
    if t == "run":
        run_id = d.get("run_id", "")
        if d.get("phase") == "end":
            out = f"end {run_id} {d.get('reason', '')}".rstrip()
            pending = d.get("pending")
            if isinstance(pending, list) and pending:
                out += " pending " + ",".join(map(str, pending))
            return out
        return f"{d.get('phase', 'start')} {run_id} {d.get('source', '')}".rstrip()
    if t == "dispatch":
        return f"{d.get('call_id')} to tool"
    if t == "decision":
        return f"{d.get('verdict')} {d.get('call_id')}"
    if t == "queued":
        return f"{d.get('mode', 'queued')} {describe_item(d.get('item'))}"
    if t == "env":
        return f"cwd {d['cwd']}" if "cwd" in d else "env"
    body = entry.body
    if t == "custom":
        data = body.get("data")
        ns = body.get("ns", "no ns")  # optional: nothing requires it
        if verbose:
            return f"{ns} {_WS.sub(' ', json.dumps(data, ensure_ascii=False))}"
        n = len(json.dumps(data, ensure_ascii=False).encode()) if data is not None else 0
        return f"{ns} ({size(n)})" if data is not None else f"{ns} (no data)"
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    if verbose:
        return f"extension {raw}"
    return f"extension ({size(len(raw.encode()))})"
