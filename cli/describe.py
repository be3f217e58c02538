"""One-line descriptions of entries for people reading ``show`` output."""

from __future__ import annotations

import json
import re
from typing import Any

from agentsession_cas import Entry, short_id

_WS = re.compile(r"\s+")
WIDTH = 72


def quote(text: str, width: int = WIDTH) -> str:
    """Collapse whitespace, cut to ``width`` characters with an ellipsis, and quote."""
    text = _WS.sub(" ", text).strip()
    if len(text) > width:
        text = text[: width - 1] + "\u2026"
    return json.dumps(text, ensure_ascii=False)


def _item_text(item: dict[str, Any]) -> str | None:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
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
            texts = [s.get("text") for s in summary if isinstance(s, dict) and isinstance(s.get("text"), str)]
            if texts:
                return f"reasoning: {quote(' '.join(texts))}"
        return "reasoning (encrypted)" if item.get("encrypted_content") else "reasoning"
    return str(kind)


def describe(entry: Entry, verbose: bool = False) -> str:
    """A one-line summary of an entry, by type."""
    t = entry.type
    d = entry.data
    if t == "item":
        out = describe_item(d.get("item"))
        if isinstance(d.get("response"), str):
            out += f" ({d['response']})"
        return out
    if t == "response":
        usage = d.get("usage") if isinstance(d.get("usage"), dict) else {}
        out = f"{d.get('response_id', '-')} {d.get('model') or '-'} {d.get('status', '')}".rstrip()
        if usage.get("input_tokens") is not None:
            out += f" {usage.get('input_tokens')}+{usage.get('output_tokens')} tokens"
        if isinstance(d.get("request_hash"), str):
            out += f" hash {d['request_hash'][:18]}\u2026"
        return out
    if t == "config":
        parts = []
        if d.get("replace"):
            parts.append("replace")
        if "model" in d:
            parts.append(f"model {d['model']}")
        if isinstance(d.get("instructions"), str):
            parts.append(f"instructions {quote(d['instructions'], 40)}")
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
    if t == "compaction":
        return f"first kept {short_id(d.get('first_kept'))}; {describe_item(d.get('summary'))}"
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
        if verbose:
            return f"{body.get('ns')} {_WS.sub(' ', json.dumps(data, ensure_ascii=False))}"
        size = len(json.dumps(data, ensure_ascii=False).encode()) if data is not None else 0
        return f"{body.get('ns')} ({size} bytes)" if data is not None else f"{body.get('ns')} (no data)"
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    if verbose:
        return f"extension {raw}"
    return f"extension ({len(raw.encode())} bytes)"
