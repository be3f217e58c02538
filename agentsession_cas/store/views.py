"""Views of sessions people reach for (issue 14): the entry tree as a graph, the
difference of two sessions or two entries' paths, and a text search over entries.

No printing: each view returns rows or records the command prints as text or JSON.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any

from ..errors import UnsupportedError
from ..format.canonical import canonical_bytes
from ..format.entry import Entry
from ..format.hashing import envelope_content, line_members
from ..format.tree import Tree
from ..lean import dataclass

if TYPE_CHECKING:
    from .session import ProjectionOutline, Session
    from .store import Store

__all__ = [
    "GraphRow", "graph_rows", "graph_lanes", "listing_entries", "Diff", "diff_sequences", "diff_paths", "entry_texts", "Match", "grep_entries",
    "grep_store", "required_literal",
]


# ---------------------------------------------------------------------------
# the graph


@dataclass
class GraphRow:
    """One line of the graph: ``lanes`` is the drawing left of the entry (``*`` marks it);
    ``branch`` a connector line drawn before it when it starts a branch, ``collapse`` one
    drawn after it when its lane ends left of open ones, which move left (else None)."""

    entry: Entry
    lanes: str
    branch: str | None = None
    collapse: str | None = None


def _draw(lanes: Sequence[str | None], at: int, mark: str) -> str:
    cells = [mark if i == at else ("|" if lane is not None else " ") for i, lane in enumerate(lanes)]
    return " ".join(cells).rstrip()


def graph_rows(entries: Sequence[Entry]) -> list[GraphRow]:
    """The entries in file order, each in a lane as ``git log --graph`` draws them
    (:func:`graph_lanes`)."""
    tree = Tree(entries)
    children = {e.id: len(tree.children(e.id)) for e in entries}
    lanes = graph_lanes(((e.id, e.parent) for e in entries), children)
    return [GraphRow(e, drawn, branch, collapse) for e, (drawn, branch, collapse) in zip(entries, lanes)]


def graph_lanes(
    entries: Iterable[tuple[str, str | None]], children: Mapping[str, int]
) -> Iterator[tuple[str, str | None, str | None]]:
    """The drawing of each entry, given as (id, parent) in file order with how many
    children each has (``children``: an id it lacks has none), as ``git log --graph``
    draws commits (oldest first): (its lanes, a branch line before it or None, a collapse
    line after it or None; :class:`GraphRow`'s). An entry continues its parent's lane
    when it is the parent's last child; an earlier child opens a lane to the right (the
    branch line ``|\\`` before it), which closes after its last entry (the lanes right of
    it moving left: ``/``). A root (or an entry whose parent is not among them) starts a
    lane of its own. Only ``parent`` is followed, as the tree does. What it holds is the
    lanes open and the children still to come: a listing draws each entry as it reads it."""
    remaining = dict(children)
    lanes: list[str | None] = []
    for entry_id, parent in entries:
        branch = None
        at = lanes.index(parent) if parent is not None and parent in lanes else -1
        if at >= 0:
            assert parent is not None
            remaining[parent] -= 1
            if remaining[parent] > 0:
                # an earlier child: a new lane to the right, joined to the parent's
                src = at
                at = _free_lane(lanes, after=src)
                branch = _connector(lanes, src, at)
        else:
            at = _free_lane(lanes, after=-1)
        lanes[at] = entry_id
        drawn, collapse = _draw(lanes, at, "*"), None
        if remaining.get(entry_id, 0) == 0:
            # the lane ends here; the lanes right of it move one left (`` /``)
            if any(lane is not None for lane in lanes[at + 1:]):
                collapse = _collapse(lanes, at)
            del lanes[at]
        yield drawn, branch, collapse


def _connector(lanes: Sequence[str | None], src: int, to: int) -> str:
    """The line ``|\\`` that joins lane ``src`` to the lane ``to`` a branch opens right of it
    (``_`` under the lanes it passes)."""
    cells = [" "] * (2 * len(lanes))
    for i, lane in enumerate(lanes):
        if lane is not None or i == src:
            cells[2 * i] = "|"
    for k in range(2 * src + 1, 2 * to - 1):
        if cells[k] == " ":
            cells[k] = "_"
    cells[2 * to - 1] = "\\"
    return "".join(cells).rstrip()


def _collapse(lanes: Sequence[str | None], gone: int) -> str:
    """The line after lane ``gone`` ends: the lanes left of it go on (``|``), those right
    of it move one lane left (``/``)."""
    cells = [" "] * (2 * len(lanes))
    for i, lane in enumerate(lanes):
        if lane is None:
            continue
        if i < gone:
            cells[2 * i] = "|"
        elif i > gone:
            cells[2 * i - 1] = "/"
    return "".join(cells).rstrip()


def _free_lane(lanes: list[str | None], *, after: int) -> int:
    """The first free lane right of ``after`` (made at the end when none is), marked taken."""
    for i in range(after + 1, len(lanes)):
        if lanes[i] is None:
            return i
    lanes.append(None)
    return len(lanes) - 1


# ---------------------------------------------------------------------------
# the listing


#: Contents read at once by :func:`listing_entries` (as the projection's walk reads them).
LISTING_CHUNK = 256


def listing_entries(session: Session, outline: ProjectionOutline, positions: Iterable[int]) -> Iterator[tuple[int, Entry]]:
    """The entries at ``positions`` (ascending) of the projection ``outline`` (made by
    ``session.projection_outline()``), each with its position: what ``show`` lists and
    the context reads. The outline read the envelopes; here only the contents are read,
    in bulk, a chunk at a time (:meth:`~agentsession_cas.backends.base.ObjectStore.get_chunks`:
    a file store decompresses the next blocks while the caller works on a chunk; each
    object verified against its name, a damaged one refused as any read refuses it),
    each parsed once (:func:`~agentsession_cas.format.hashing.line_members`),
    so every object of the session is read once. Each entry holds its content's members,
    its ``id``, ``parent`` and ``type``; not ``ts`` nor ``parents``, which the outline does
    not keep (no listing prints them). The synthetic marker is the outline's own."""
    ids, types, content = outline.ids, outline.types, outline.content
    parent_at, absent = outline.parent_at, outline.absent
    marker_at = len(ids) - 1 if outline.marker is not None else -1
    chunks: list[tuple[list[int], list[str]]] = []  # (positions, contents) asked for, not yet taken
    marked: list[int] = []

    def names() -> Iterator[list[str]]:
        chunk: list[int] = []
        for pos in positions:
            if pos == marker_at:  # the last: no store holds it
                marked.append(pos)
                break
            chunk.append(pos)
            if len(chunk) == LISTING_CHUNK:
                chunks.append((chunk, [content(p) for p in chunk]))
                yield chunks[-1][1]
                chunk = []
        if chunk:
            chunks.append((chunk, [content(p) for p in chunk]))
            yield chunks[-1][1]

    for bodies in session.store.objects.get_chunks("contents", names()):
        at_chunk, named = chunks.pop(0)
        for at, name, body in zip(at_chunk, named, bodies):
            up = parent_at[at]
            env = {"parent": ids[up] if up >= 0 else absent.get(at), "type": types[at]}
            data, careful, item = line_members(ids[at], env, body)
            entry = Entry(data, computed_id=ids[at], content_hash=name)
            entry.careful, entry.item_bytes = careful, item
            yield at, entry
    if marked:
        yield marker_at, outline.marker  # type: ignore[misc]


# ---------------------------------------------------------------------------
# diff


@dataclass
class Diff:
    """Two sequences of entry ids compared: the ``common`` prefix both start with, then
    each side's rest; ``shared`` names the ids of a rest that the other side holds too
    (elsewhere than in the common prefix), the rest's others are held by one side alone."""

    common: list[str]
    rest_a: list[str]
    rest_b: list[str]
    shared: set[str] = field(default_factory=set)

    @property
    def only_a(self) -> list[str]:
        return [e for e in self.rest_a if e not in self.shared]

    @property
    def only_b(self) -> list[str]:
        return [e for e in self.rest_b if e not in self.shared]

    @property
    def same(self) -> bool:
        return not self.rest_a and not self.rest_b


def diff_sequences(a: Sequence[str], b: Sequence[str]) -> Diff:
    """The common prefix of ``a`` and ``b``, then what follows it on each side."""
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    rest_a, rest_b = list(a[n:]), list(b[n:])
    shared = set(rest_a) & set(rest_b)
    return Diff(list(a[:n]), rest_a, rest_b, shared)


def diff_paths(path_a: Sequence[str], path_b: Sequence[str]) -> Diff:
    """Two entries' paths (root first): the path to their last common ancestor, then each
    entry's own steps below it. (Two paths of one tree share exactly a prefix.)"""
    return diff_sequences(path_a, path_b)


# ---------------------------------------------------------------------------
# grep


def _json_text(value: Any) -> str:
    """A structured value's text as the store holds it (canonical JSON): what a search
    finds in it is then found in the stored bytes too (see :func:`grep_store`)."""
    return canonical_bytes(value).decode("utf-8")


def _item_texts(item: Any, where: str) -> Iterator[tuple[str, str]]:
    """(field, text) of what a person reads in an item: a message's text parts, a tool
    call's name and arguments, a call's output, reasoning's summary and text."""
    if not isinstance(item, dict):
        return
    kind = item.get("type")
    content = item.get("content")
    if isinstance(content, str):
        yield f"{where}.content", content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield f"{where}.content", part["text"]
    for key in ("name", "arguments", "input", "action"):
        value = item.get(key)
        if isinstance(value, str):
            yield f"{where}.{key}", value
        elif value is not None and key != "name":
            yield f"{where}.{key}", _json_text(value)
    out = item.get("output")
    if isinstance(out, str):
        yield f"{where}.output", out
    elif out is not None:
        yield f"{where}.output", _json_text(out)
    if kind == "reasoning":
        for key in ("summary", "content"):
            parts = item.get(key)
            for part in parts if isinstance(parts, list) else []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield f"{where}.{key}", part["text"]


def entry_texts(entry: Entry) -> Iterator[tuple[str, str]]:
    """The text of an entry a search looks at, as (field, text): the items it carries
    (an item, a queued item, a compaction's or branch summary's summary), a config's
    instructions, a custom entry's data as JSON. Ids, hashes and times are not text."""
    t, d = entry.type, entry.data
    if t in ("item", "queued"):
        yield from _item_texts(d.get("item"), "item")
    elif t in ("compaction", "branch_summary"):
        yield from _item_texts(d.get("summary"), "summary")
    elif t == "config":
        if isinstance(d.get("instructions"), str):
            yield "instructions", d["instructions"]
    elif t == "custom":
        data = entry.body.get("data")
        if data is not None:
            yield "data", _json_text(data)
    elif t == "info" and isinstance(d.get("name"), str):
        yield "name", d["name"]


@dataclass
class Match:
    """One line of an entry's text that matched."""

    session: str
    entry: str
    type: str
    field: str
    line: int  # within the field's text, from 1
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {"session": self.session, "entry": self.entry, "type": self.type, "field": self.field,
                "line": self.line, "text": self.text}


def grep_entries(session: str, entries: Iterable[Entry], pattern: re.Pattern[str], *,
                 types: Sequence[str] = ()) -> Iterator[Match]:
    """Every line of the entries' text (:func:`entry_texts`) that ``pattern`` matches,
    entries in the order given; ``types`` (when any) keeps only entries of those types."""
    for e in entries:
        if types and e.type not in types:
            continue
        for where, text in entry_texts(e):
            if pattern.search(text) is None:
                continue
            lines = text.splitlines() or [text]
            found = [(n, line) for n, line in enumerate(lines, start=1) if pattern.search(line) is not None]
            # a pattern that spans lines matches the text and no one line: show where it starts
            for n, line in found or [(1, lines[0])]:
                yield Match(session, e.id, e.type, where, n, line)


# -- a search over a whole store ---------------------------------------------------------

#: Characters canonical JSON writes escaped inside a string: a text holding one is not
#: found verbatim in the stored bytes.
_ESCAPED = frozenset('"\\') | frozenset(chr(c) for c in range(0x20))


def required_literal(pattern: re.Pattern[str]) -> re.Pattern[Any] | None:
    """A test every entry whose text ``pattern`` matches passes on its stored content
    bytes, or None when the pattern yields none (then every entry is searched).

    It is the longest run of plain characters every match must hold (top-level
    literals of the parsed pattern, cut at anything else), without the characters
    canonical JSON escapes: such a run in an entry's text (a string member, or a
    structured value's canonical JSON) lies verbatim in the canonical bytes of its
    content. Case-insensitive patterns test the decoded text, as Unicode case rules
    need; others the bytes."""
    try:
        from re import _constants as sre_constants  # type: ignore[attr-defined]
        from re import _parser as sre_parser  # type: ignore[attr-defined]

        parsed = sre_parser.parse(pattern.pattern, pattern.flags)
        literal = sre_constants.LITERAL
    except Exception:  # the parser is CPython's own: without it, no shortcut
        return None
    best, run = "", []
    for op, arg in list(parsed) + [(None, None)]:
        if op is literal and chr(arg) not in _ESCAPED:
            run.append(chr(arg))
            continue
        if len(run) > len(best):
            best = "".join(run)
        run = []
    if not best:
        return None
    if pattern.flags & re.IGNORECASE:
        return re.compile(re.escape(best), re.IGNORECASE)
    return re.compile(re.escape(best.encode("utf-8")))


def _passes(test: re.Pattern[Any], data: bytes) -> bool:
    if isinstance(test.pattern, str):
        return test.search(data.decode("utf-8", "replace")) is not None
    return test.search(data) is not None


def grep_store(store: Store, sessions: Sequence[str], pattern: re.Pattern[str], *,
               types: Sequence[str] = (), first: bool = False) -> Iterator[Match]:
    """:func:`grep_entries` over each session's own entries, sessions in the order given,
    costing one bulk pass over the store's objects rather than a lookup per entry.
    ``first``: only each session's first match (``grep -l``: the rest is not searched).

    Where the pattern has a :func:`required_literal`, the objects are scanned in bulk
    (:meth:`~agentsession_cas.backends.base.ObjectStore.scan`): envelopes for their
    content, contents for the literal, each distinct content tested once however many
    entries share it. Only entries whose content passes, or which the scan did not see
    (an object only a log holds, a block that does not read), are read and searched,
    through the verified path: a scan rules out, it never shows."""
    order: list[str] = list(dict.fromkeys(sessions))
    test = required_literal(pattern)
    candidates: set[str] | None = None
    own: dict[str, list[str]] = {}
    if test is not None:
        for sid in order:
            with store.read(sid) as s:
                own[sid] = list(s.log_order)
        try:
            candidates = _candidates(store, {eid for ids in own.values() for eid in ids}, test)
        except UnsupportedError:
            candidates = None  # a store that cannot list its objects (one over HTTP): read every entry
    for sid in order:
        if candidates is not None and candidates.isdisjoint(own[sid]):
            continue  # nothing of it can match: not opened again
        with store.read(sid) as s:
            ids = s.log_order if candidates is None else [eid for eid in s.log_order if eid in candidates]
            # (read a chunk at a time in bulk reads: a store over HTTP, which cannot be
            # scanned, answered a GET an object, 39 s for 10,000 entries)
            for m in grep_entries(sid, store.entries(list(ids)), pattern, types=types):
                yield m
                if first:
                    break


def _candidates(store: Store, wanted: set[str], test: re.Pattern[Any]) -> set[str]:
    """The entries of ``wanted`` a search must read: those whose content passes ``test``,
    and those the scan could not rule out (not seen, or their envelope not read). One
    pass over envelopes and contents in the order they lie; a content is tested once
    however many entries hold it, whichever of an entry's two objects comes first."""
    unseen = set(wanted)
    passed: set[str] = set()
    failed: set[str] = set()
    waiting: dict[str, list[str]] = {}  # content not yet tested -> entries holding it
    out: set[str] = set()
    for space, name, data in store.backend.objects.scan(("entries", "contents")):
        if space == "entries":
            if name not in unseen:
                continue
            content = envelope_content(data)
            if content is None:
                continue  # left unseen: the verified read says what is wrong
            unseen.discard(name)
            if content in passed:
                out.add(name)
            elif content not in failed:
                waiting.setdefault(content, []).append(name)
        elif name not in passed and name not in failed:
            if _passes(test, data):
                passed.add(name)
                out.update(waiting.pop(name, ()))
            else:
                failed.add(name)
                waiting.pop(name, None)
    out.update(unseen)
    for held in waiting.values():  # contents the scan did not see
        out.update(held)
    return out
