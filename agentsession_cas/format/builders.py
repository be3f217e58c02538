"""Writer helpers: the bodies of entries a harness appends, built so they verify
(RFC 0001 ``config``, ``compaction``, ``branch_summary``, ``env``, ``outcome``,
``queued``, ``decision``). Each returns a plain ``dict`` (an entry without ``parent``
and ``ts``, which the append fills), and refuses, with :class:`EntryError`, what the
format would not accept; links are :mod:`agentsession_cas.format.links`', and
normalising a value that is not I-JSON is :mod:`agentsession_cas.format.normalise`'s.

The config helpers are checked against the context algorithm itself: a delta is
applied to the settings it was made from, and when the result would not rebuild the
request (a member a delta cannot clear, tools in another order) the helper writes the
full settings with ``replace: true`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ContextError, EntryError
from .canonical import canonical_bytes
from .context import EMPTY_SETTINGS, PART_SEPARATOR, Settings, build_context, text_hash, tool_name
from .entry import Entry, short_id
from .runs import DECIDERS, QUEUE_MODES

__all__ = [
    "OUTCOME_KINDS",
    "WORKSPACE_KINDS",
    "branch_summary",
    "compaction",
    "compaction_from",
    "compaction_keeping",
    "config_delta",
    "config_from_request",
    "config_from_settings",
    "drain",
    "env",
    "outcome",
    "queued",
    "settings_of",
    "withdrawal",
]

#: The members of a request that are settings of their own; every other member but
#: ``input``, ``store`` and ``previous_response_id`` (which the canonical request sets
#: and drops) is passed through in ``extra``.
_SETTINGS = ("model", "instructions", "tools", "reasoning", "text")
_NOT_CARRIED = ("input", "store", "previous_response_id")
OUTCOME_KINDS = ("feedback", "test", "task", "tool_error", "eval", "custom")
WORKSPACE_KINDS = ("local", "container", "remote")


def _item(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
        raise EntryError(f"{what} is an item: an object with a type")
    return dict(value)


def _parts(parts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out, seen = [], set()
    for p in parts:
        pid, text = p.get("id"), p.get("text", "")
        if not isinstance(pid, str) or not pid:
            raise EntryError("an instruction part has an id: a non-empty string")
        if pid in seen:
            raise EntryError(f"instruction part {pid!r} is named twice; a list names each id once")
        if not isinstance(text, str):
            raise EntryError(f"instruction part {pid!r}: its text is a string")
        seen.add(pid)
        el: dict[str, Any] = {"id": pid, "text": text}
        if p.get("source") is not None:
            el["source"] = p["source"]
        out.append(el)
    return out


# ---------------------------------------------------------------------------
# config


def config_from_request(
    request: Mapping[str, Any],
    *,
    parts: Sequence[Mapping[str, Any]] | None = None,
    omitted: Sequence[Mapping[str, Any]] | None = None,
    replace: bool = False,
) -> dict[str, Any]:
    """The ``config`` entry carrying a request's full settings, as the first entry on a
    root should: ``model``, ``instructions`` (or, with ``parts``, the instruction parts,
    each ``{id, text, source?}``, and their join), ``tools`` as ``tools_added``,
    ``reasoning``, ``text``, and every other member but ``input``, ``store`` and
    ``previous_response_id`` in ``extra``. ``omitted`` is the ``instructions_omitted``
    list; ``replace`` discards what the path had in force."""
    body: dict[str, Any] = {"type": "config"}
    if replace:
        body["replace"] = True
    if isinstance(request.get("model"), str) and request["model"]:
        body["model"] = request["model"]
    if parts is not None:
        written = _parts(parts)
        joined = PART_SEPARATOR.join(p["text"] for p in written)
        given = request.get("instructions")
        if given is not None and given != joined:
            raise EntryError("the request's instructions are not its parts joined with a blank line (RFC 0001 config)")
        body["instructions"] = joined
        body["instructions_parts"] = written
    elif isinstance(request.get("instructions"), str) and request["instructions"]:
        body["instructions"] = request["instructions"]
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        body["tools_added"] = list(tools)
    for name in ("reasoning", "text"):
        if request.get(name) not in (None, {}):
            body[name] = request[name]
    extra = {k: v for k, v in request.items() if k not in _SETTINGS and k not in _NOT_CARRIED and v is not None}
    if extra:
        body["extra"] = extra
    if omitted is not None:
        body["instructions_omitted"] = [dict(o) for o in omitted]
    return body


def config_from_settings(settings: Settings) -> dict[str, Any]:
    """The ``config`` entry putting ``settings`` in force on a root, whole: what a
    session continued from another writes first, so its first request rebuilds."""
    d = settings.as_dict()
    body: dict[str, Any] = {"type": "config"}
    for name in ("model", "instructions", "instructions_parts", "instructions_omitted", "omit", "reasoning", "text"):
        if name in d:
            body[name] = d[name]
    if "tools" in d:
        body["tools_added"] = d["tools"]
    if "extra" in d:
        body["extra"] = d["extra"]
    return body


def settings_of(request: Mapping[str, Any], *, parts: Sequence[Mapping[str, Any]] | None = None) -> Settings:
    """The settings a request puts in force (what :func:`config_from_request` records)."""
    return EMPTY_SETTINGS.apply(config_from_request(request, parts=parts))


def _parts_delta(before: Settings, written: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The whole ordered list of parts for a delta (RFC 0001 "Instructions as parts"):
    a changed or new part with its text, an unchanged one by hash, and a run of
    unchanged parts where the list in force has them next by ``keep``. None when the
    parts in force are these already."""
    old = [p for p in (before.parts or ()) if not p.unresolved]
    if before.parts is not None and len(old) == len(before.parts) and \
            [(p.id, p.text or "", p.source) for p in old] == [(w["id"], w["text"], w.get("source")) for w in written]:
        return None
    index = {p.id: i for i, p in enumerate(before.parts or ()) if p.id is not None and not p.unresolved}
    in_force = list(before.parts or ())
    out: list[dict[str, Any]] = []
    cursor, run = 0, 0
    for w in written:
        i = index.get(w["id"])
        same = i is not None and (in_force[i].text or "") == w["text"] and in_force[i].source == w.get("source")
        if same and i == cursor:
            run += 1
            cursor += 1
            continue
        if run:
            out.append({"keep": run})
            run = 0
        if same:
            out.append({"id": w["id"], "hash": text_hash(w["text"])})
        else:
            out.append(w)
        if i is not None:
            cursor = i + 1
    if run:
        out.append({"keep": run})
    return out


def config_delta(
    before: Settings,
    request: Mapping[str, Any],
    *,
    parts: Sequence[Mapping[str, Any]] | None = None,
    omitted: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """The ``config`` delta that takes the settings in force (``before``, e.g.
    ``build_context(path).settings``) to those of ``request`` (with ``parts``, its
    instructions as parts), or None when nothing changes. ``omitted``, when given, is
    the ``instructions_omitted`` list now in force (written whole when it changed).
    Checked by applying it: where a delta cannot say the change, the full settings are
    written with ``replace: true``."""
    target = settings_of(request, parts=parts)
    body: dict[str, Any] = {"type": "config"}
    if target.model != before.model and target.model:
        body["model"] = target.model
    if parts is not None:
        delta = _parts_delta(before, _parts(parts))
        if delta is not None:
            body["instructions_parts"] = delta
    elif target.instructions != before.instructions or before.parts is not None:
        if target.instructions is not None:
            body["instructions"] = target.instructions
    old_tools = {tool_name(t): t for t in before.tools}
    new_tools = {tool_name(t): t for t in target.tools}
    removed = [n for n in old_tools if n not in new_tools]
    added = [t for n, t in new_tools.items() if n not in old_tools or canonical_bytes(old_tools[n]) != canonical_bytes(t)]
    if removed:
        body["tools_removed"] = removed
    if added:
        body["tools_added"] = added
    for name in ("reasoning", "text"):
        if getattr(target, name) is not None and getattr(target, name) != getattr(before, name):
            body[name] = getattr(target, name)
    extra = {k: v for k, v in target.extra.items() if k not in before.extra or before.extra[k] != v}
    extra.update({k: None for k in before.extra if k not in target.extra})
    if extra:
        body["extra"] = extra
    if omitted is not None and [dict(o) for o in omitted] != [o.data for o in before.omitted]:
        body["instructions_omitted"] = [dict(o) for o in omitted]
    after = before.apply(body)
    wrong = after.request_members() != target.request_members()
    if parts is not None and after.parts is not None:
        wrong = wrong or [(p.id, p.text or "", p.source) for p in after.parts] != \
            [(p.id, p.text or "", p.source) for p in (target.parts or ())]
    if omitted is not None:
        wrong = wrong or [o.data for o in after.omitted] != [dict(o) for o in omitted]
    if wrong:
        full = config_from_request(request, parts=parts, omitted=omitted, replace=True)
        if omitted is None and before.omitted:
            full["instructions_omitted"] = [o.data for o in before.omitted]
        return full
    return body if len(body) > 1 else None


# ---------------------------------------------------------------------------
# compaction and branch summary


def compaction(
    path: Sequence[Entry],
    first_kept: str,
    summary: Mapping[str, Any],
    *,
    pinned: Sequence[str] = (),
    tokens_before: int | None = None,
    usage: Any = None,
) -> dict[str, Any]:
    """The ``compaction`` to append at the end of ``path`` (root first): entries from
    ``first_kept`` on are kept, ``summary`` replaces what came before, and the item
    entries ``pinned`` names are kept verbatim, in the order the request carried them.
    ``first_kept`` must be in the context at the tip (not a compaction, whose summary
    a later fold drops: restate it as this one's summary), and each pinned entry an
    ``item`` entry of that context before ``first_kept`` (RFC 0001: a copy of what was
    sent, never a new input). ``config`` is the checkpoint of the settings in force."""
    if not path:
        raise EntryError("a compaction folds a path: this one is empty")
    ctx = build_context(path)
    summary = _item(summary, "a compaction's summary")
    selected = [e.id for e in ctx.entries]
    if first_kept not in selected or next(e for e in ctx.entries if e.id == first_kept).type == "compaction":
        raise EntryError(f"first_kept {short_id(first_kept)} is not an entry the context at the tip keeps "
                         "(a compaction's summary and pins are not: restate them)")
    at = {eid: i for i, eid in enumerate(e.id for e in path)}
    order = {e.id: i for i, e in enumerate(ctx.item_entries) if e.type == "item"}
    picked: list[Entry] = []
    for eid in dict.fromkeys(pinned):
        e = next((x for x in path if x.id == eid), None)
        if e is None or e.type != "item":
            raise EntryError(f"pinned {short_id(eid)} is not an item entry on the path")
        if at[eid] >= at[first_kept]:
            raise EntryError(f"pinned {short_id(eid)} is not before first_kept {short_id(first_kept)}: it is kept already")
        if eid not in order:
            raise EntryError(f"pinned {short_id(eid)} is not in the context at the tip: pinning it would send what was not sent")
        picked.append(e)
    picked.sort(key=lambda e: order[e.id])
    body: dict[str, Any] = {"type": "compaction", "first_kept": first_kept, "summary": summary}
    if picked:
        body["pinned"] = [e.get("item") for e in picked]
    body["config"] = ctx.settings.as_dict()
    if tokens_before is not None:
        body["tokens_before"] = tokens_before
    if usage is not None:
        body["usage"] = usage
    return body


def compaction_from(path: Sequence[Entry], index: int, summary: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    """:func:`compaction` for a caller that split the request's input at ``index``: the
    items from ``index`` on are kept (``first_kept`` is the entry of that item)."""
    try:
        ctx = build_context(path)
    except ContextError as exc:
        raise EntryError(f"the context at the tip does not build: {exc}") from None
    if not 0 <= index < len(ctx.items):
        raise EntryError(f"index {index} is not an item of the request (it has {len(ctx.items)})")
    return compaction(path, ctx.item_entries[index].id, summary, **kw)


def compaction_keeping(path: Sequence[Entry], kept: int, summary: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    """:func:`compaction` keeping the last ``kept`` items of the request."""
    n = len(build_context(path).items)
    if not 0 < kept <= n:
        raise EntryError(f"cannot keep {kept} of the request's {n} items")
    return compaction_from(path, n - kept, summary, **kw)


def branch_summary(continue_at: str, left: str, summary: Mapping[str, Any], *, usage: Any = None) -> dict[str, Any]:
    """The ``branch_summary`` that carries context across a branch switch: appended
    under ``continue_at`` (where the new branch continues: its ``parent``), naming the
    leaf that was ``left`` in ``from``."""
    if continue_at == left:
        raise EntryError("a branch summary leaves one branch for another: from and parent are the same entry")
    body: dict[str, Any] = {"type": "branch_summary", "parent": continue_at, "from": left,
                            "summary": _item(summary, "a branch summary's summary")}
    if usage is not None:
        body["usage"] = usage
    return body


# ---------------------------------------------------------------------------
# record entries


def env(
    cwd: str | None = None,
    *,
    vcs: Mapping[str, Any] | None = None,
    read: Mapping[str, str] | None = None,
    written: Mapping[str, str] | None = None,
    tools: Mapping[str, str] | None = None,
    workspace: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An ``env`` snapshot: the working directory, the version control state, the files
    read and written (path -> content hash), tool versions, and the workspace (``kind``
    one of local, container, remote; ``ref`` a string; other members kept)."""
    body: dict[str, Any] = {"type": "env"}
    if cwd is not None:
        body["cwd"] = cwd
    if vcs is not None:
        body["vcs"] = dict(vcs)
    files = {k: dict(v) for k, v in (("read", read), ("written", written)) if v}
    if files:
        body["files"] = files
    if tools:
        body["tools"] = dict(tools)
    if workspace is not None:
        ws = dict(workspace)
        if ws.get("kind") not in WORKSPACE_KINDS:
            raise EntryError(f"workspace kind {ws.get('kind')!r} is not one of {', '.join(WORKSPACE_KINDS)}")
        if "ref" in ws and not isinstance(ws["ref"], str):
            raise EntryError("a workspace's ref is one string")
        body["workspace"] = ws
    return body


def outcome(
    kind: str,
    target: str,
    *,
    score: float | None = None,
    passed: bool | None = None,
    label: str | None = None,
    details: Any = None,
) -> dict[str, Any]:
    """An ``outcome``: a judgement of the session up to ``target`` (an entry on a path
    of the session, usually the last of the range judged), with a finite ``score`` on
    the judge's scale (named by ``label``), a verdict ``passed`` (written ``pass``) and
    ``details``."""
    if kind not in OUTCOME_KINDS:
        raise EntryError(f"outcome kind {kind!r} is not one of {', '.join(OUTCOME_KINDS)}")
    if not isinstance(target, str) or not target:
        raise EntryError("an outcome's target names an entry (RFC 0001 outcome)")
    body: dict[str, Any] = {"type": "outcome", "kind": kind, "target": target}
    if score is not None:
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise EntryError(f"an outcome's score is a finite number, not {score!r}")
        body["score"] = score
    if passed is not None:
        body["pass"] = bool(passed)
    if label is not None:
        body["label"] = label
    if details is not None:
        body["details"] = details
    return body


def queued(
    item: Mapping[str, Any],
    mode: str,
    *,
    trigger: Mapping[str, Any] | None = None,
    ref: str | None = None,
) -> dict[str, Any]:
    """A ``queued`` input: accepted while a run was in flight (``steer``) or to wait for
    it to end (``followup``), before it is appended; ``trigger`` says how it arrived
    (``kind``, ``ref``, ``source`` and members of the harness's own)."""
    if mode not in QUEUE_MODES:
        raise EntryError(f"queued mode {mode!r} is not one of {', '.join(QUEUE_MODES)}")
    body: dict[str, Any] = {"type": "queued", "item": _item(item, "a queued input"), "mode": mode}
    if trigger is not None:
        body["trigger"] = dict(trigger)
    if ref is not None:
        body["ref"] = ref
    return body


def drain(entry: Entry) -> dict[str, Any]:
    """The ``item`` entry that takes a queued input into the conversation: its item,
    ``source`` the trigger the queued entry held (whole), ``queued_from`` its id."""
    if entry.type != "queued":
        raise EntryError(f"entry {short_id(entry.id)} is a {entry.type}, not a queued input")
    body: dict[str, Any] = {"type": "item", "item": _item(entry.get("item"), "a queued input"), "queued_from": entry.id}
    if isinstance(entry.get("trigger"), Mapping):
        body["source"] = dict(entry.get("trigger"))
    return body


def withdrawal(call_id: str, target: str, reason: str, *, by: str | None = None) -> dict[str, Any]:
    """The reject that withdraws a dispatch: the writer wrote the dispatch of call
    ``call_id`` (held by the item entry ``target``) and then did not hand the call to
    its tool. Appended directly after that dispatch, before any other decision,
    dispatch or output of the call; ``reason`` says why."""
    if not call_id:
        raise EntryError("a withdrawal names its call: call_id is never empty")
    if not isinstance(reason, str) or not reason:
        raise EntryError("a withdrawal says why the hand-off was not made: give a reason")
    if by is not None and by not in DECIDERS:
        raise EntryError(f"by {by!r} is not one of {', '.join(DECIDERS)}")
    body: dict[str, Any] = {"type": "decision", "call_id": call_id, "target": target, "verdict": "reject",
                            "reason": reason, "withdrawn": True}
    if by is not None:
        body["by"] = by
    return body
