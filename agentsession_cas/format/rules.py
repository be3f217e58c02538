"""The rules a session is checked against, in one place (RFC 0001, RFC 0002, RFC 0003 "Errors").

Every consumer asks this module: the file reader, ``agentsession verify`` and
``show``, and (done by the store's own code) a store's append, import, push,
fsck and repair. A rule broken is a :class:`~agentsession_cas.errors.Problem`
whose ``code`` is a row of :data:`RULES` (the table, as data, in
:mod:`~agentsession_cas.format.codes`, re-exported here), which says how heavy it
is, where it is found, and what a store does with an entry that brings it.
:func:`problem` is the one way a problem is made, and it refuses a code the table
does not hold, so nothing can report a rule nobody listed.

The rules come in four scopes, each with one implementation:

* **line**: what one line says on its own (:func:`check_line`): I-JSON, a
  known or namespaced type, the id against the hash of the members, the ``ts``
  form, no reserved member in the body, the members a core type requires.
* **tree**: where an entry hangs (:class:`TreeState`, fed one entry at a
  time): its parent held before it, its ``parents``, the base and prefix rule,
  a repeated id.
* **record** and **context**: what the entries on a path say together
  (:class:`PathChecker`): runs, calls, decisions and dispatches (the record
  half, :class:`~agentsession_cas.format.runs.RecordWalker`), and the context
  algorithm with every ``request_hash`` and ``first_kept`` (the context half,
  :class:`~agentsession_cas.format.context.ContextBuilder`). It is fed entries in
  file order, which is a store's log order, and keeps itself positioned on the
  path to the last entry: an entry whose parent is elsewhere makes it pop to
  the common ancestor and push down the parent's path, so a verdict never
  depends on whether entries are checked as they are appended or as a whole
  file. A linear session costs one push per entry; a file that alternates
  between deep branches costs the distance moved each time.

:class:`SessionChecker` puts the tree and path parts together for a writer or a
store, with trials (:meth:`SessionChecker.begin`, ``rollback``, ``commit``)
for a prepare that may be abandoned. :func:`verify_session` is what a file
verify reports, computed in one pass over the entries in file order.
"""

from __future__ import annotations

import gc
import json
import re
import weakref
from array import array
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import AgentSessionError, EntryError, IJSONError, Problem, SessionFormatError
from ..lean import dataclass
from .canonical import loads, loads_flagged
from .codes import RULES, ErrorCode, Rule, Scope, StorePolicy, problem, rule_of
from .context import DIAGNOSE_LIMIT, ContextBuilder, RequestCheck, check_tip
from .entry import CORE_TYPES, LEAF_LABEL, Entry, Header, header_or_error, is_entry_type, short_id, shown_id
from .entry import shown_value as _show
from .hashing import ReservedMemberError, entry_hashes, entry_objects_item, is_hash
from .links import derived_note, link_notes, own_entries, store_note
from .runs import Inbox, RecordWalker, RunReason, format_notes, open_source_message
from .timestamps import is_valid_ts
from .tree import head_may_rest

if TYPE_CHECKING:  # the reader builds on this module; the reports are in results.py, loaded on first use (below)
    from .reader import SessionFile
    from .results import RecordsCheck, RequestReport, RunsReport, VerifyReport
else:
    def __getattr__(name: str) -> Any:
        """``VerifyReport``, moved to ``results.py`` (loaded only by what reports it),
        importable from here as before."""
        if name == "VerifyReport":
            from .results import VerifyReport

            return VerifyReport
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "CORE_TYPES",
    "RULES",
    "Rule",
    "Scope",
    "StorePolicy",
    "ErrorCode",
    "problem",
    "empty_problem",
    "rule_of",
    "parse_line",
    "line_failure",
    "read_header",
    "describe_json_error",
    "unloaded_claims",
    "check_line",
    "clean_entry",
    "TreeState",
    "PathChecker",
    "SessionChecker",
    "Trial",
    "OpenRun",
    "VerifyReport",
    "verify_report",
    "verify_session",
    "gc_paused",
    "analyze_path",
    "analyze_runs",
    "verify_records",
    "verify_requests",
]



@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector for a bulk pass over a session (a read, a check,
    a projection, a log replay): such a pass allocates a few objects per entry and
    no reference cycles, and the collector would otherwise rescan the growing
    heap again and again (about a fifth of a 100,000-entry read). It is
    restored as it was, whatever happens."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


# ---------------------------------------------------------------------------
# line rules


_CLAIMED_ID = re.compile(rb'"id"\s*:\s*"(sha256:[0-9a-f]{64})"')
_NO_CLAIMS: tuple[str, ...] = ()


#: What a text saved "UTF-8 with BOM" is told, wherever JSON is read (a line, a header,
#: an entry or header on stdin): RFC 0001's lines are I-JSON, which carries none.
BOM_WORDS = "begins with a UTF-8 byte order mark (U+FEFF), which JSON text does not carry; save it as UTF-8 without one"


def describe_json_error(exc: Exception) -> str:
    """Why a line (or the header) does not parse, in words."""
    if isinstance(exc, UnicodeDecodeError):
        return f"is not valid UTF-8 (byte {exc.start})"
    if isinstance(exc, json.JSONDecodeError):
        if exc.pos == 0 and exc.doc[:1] == "\ufeff":
            return BOM_WORDS
        # Some of the parser's messages end in "at" already ("Unterminated string starting at").
        msg = exc.msg[:-3] if exc.msg.endswith(" at") else exc.msg
        return f"does not parse as JSON: {msg} at column {exc.colno}"
    return f"does not parse as JSON: {exc}"


def parse_line(
    raw: bytes, *, line: int, last: bool = False, terminated: bool = False,
) -> tuple[dict[str, Any] | None, bool, Problem | None, tuple[str, ...]]:
    """One entry line parsed, as I-JSON: ``(object, careful, problem, claims)``.

    ``object`` is None when the line is no JSON object; the problem says why
    (``truncated`` for the ``last`` line of a file, which a reader tolerates, worded as
    cut short only when the file ends without a newline, ``terminated`` False; else
    ``json`` or ``ijson``). ``claims`` are the ids such a line seems to claim, found by
    a plain search (any spelling, every candidate, since a nested member may also be
    named ``id``), so its children do not report a missing parent for a fault reported
    already. ``careful`` is the parse's flag (see ``canonical.loads_flagged``)."""
    try:
        obj, careful = loads_flagged(raw.decode("utf-8"))
    except ValueError as exc:  # IJSONError, JSONDecodeError, UnicodeDecodeError
        found, claims = line_failure(raw, exc, line=line, last=last, terminated=terminated)
        return None, False, found, claims
    if not isinstance(obj, dict):
        found, claims = line_failure(raw, None, line=line, last=last, terminated=terminated)
        return None, False, found, claims
    return obj, careful, None, _NO_CLAIMS


def line_failure(
    raw: bytes, exc: Exception | None, *, line: int, last: bool = False, terminated: bool = False,
) -> tuple[Problem, tuple[str, ...]]:
    """The problem of a line :func:`parse_line` cannot read, and the ids it claims: the
    parse's exception, or None for JSON that is no object. (A bulk reader parses
    inline and comes here only when a line fails.) The ``last`` line of a file is
    tolerated (``truncated``, RFC 0001 File) whether or not a newline ends it
    (``terminated``), and said to be cut short only when none does: a line that got
    its newline written was not cut by a crash."""
    if exc is None:
        return problem(line, "json", "the line is not a JSON object"), _NO_CLAIMS
    if isinstance(exc, IJSONError):
        return problem(line, "ijson", f"not I-JSON: {exc}"), _claims(raw)
    if last:
        if terminated:
            return problem(line, "truncated", f"the last line {describe_json_error(exc)}"), _NO_CLAIMS
        return problem(line, "truncated", f"the last line was cut short: {describe_json_error(exc)}"), _NO_CLAIMS
    return problem(line, "json", f"the line {describe_json_error(exc)}"), _claims(raw)


def _claims(raw: bytes) -> tuple[str, ...]:
    return tuple(m.group(1).decode("ascii") for m in _CLAIMED_ID.finditer(raw))


def unloaded_claims(obj: Mapping[str, Any], entry: Entry | None) -> tuple[str, ...]:
    """After :func:`check_line`: the id to hold as broken (see :meth:`TreeState.mark_broken`)
    when the entry could not be loaded under the id its line claims. A line that
    cannot be hashed claims its stated id; one whose stated id is not a hash at all
    is loaded under it, and its children name the hash it should have carried."""
    stated = obj.get("id")
    if entry is None:
        type_ = obj.get("type")
        if isinstance(stated, str) and isinstance(type_, str) and type_ and type_ != "session":
            return (stated,)
        return _NO_CLAIMS
    if stated is not None and stated != entry.computed_id and not is_hash(stated):
        return (entry.computed_id,)
    return _NO_CLAIMS


def read_header(raw: bytes, source: str) -> Header:
    """The first line as a header; :class:`SessionFormatError` when it cannot be one."""
    try:
        obj = loads(raw.decode("utf-8"))
    except (ValueError, IJSONError) as exc:
        raise SessionFormatError(source, [problem(1, "header", f"the header {describe_json_error(exc)}")]) from None
    return header_or_error(obj, source)


_TS_FORM = "is not in the admitted form (UTC, 'T' and 'Z', fraction only when non-zero, no trailing zeros, at most nine digits)"


def _required(type_: str, obj: Mapping[str, Any]) -> list[str]:
    """What a core entry lacks of what RFC 0001 requires of its type, in words: an
    item's ``item``, an outcome's ``target``, a label's ``target`` and ``label`` (each
    may be null: the universal root, a clearing label, but never absent: a label
    names what it marks), a link's ``rel``. (The envelope's members are the hash's
    and the tree's; the record entries' required members and closed values are
    ``record-malformed``, judged with the path they are read against.)"""
    out = []
    if type_ == "item":
        if "item" not in obj:
            out.append("item entry has no 'item', which RFC 0001 requires (item)")
        elif not isinstance(obj["item"], dict):
            out.append(f"item entry's 'item' is {_show(obj['item'])}, not an object: it must be an item of the payload profile (RFC 0001 item)")
    elif type_ == "outcome":
        if "target" not in obj:
            out.append("outcome has no 'target', which RFC 0001 requires (outcome): the entry it judges")
        elif not isinstance(obj["target"], str):
            out.append(f"outcome target {_show(obj['target'])} is not an entry id (RFC 0001 outcome)")
    elif type_ == "label":
        for member in ("target", "label"):
            if member not in obj:
                out.append(f"label has no '{member}' (RFC 0001 label: a label names the entry it marks, and the label; "
                           "either may be null, never absent)")
            elif obj[member] is not None and not isinstance(obj[member], str):
                out.append(f"label {member} {_show(obj[member])} is neither a string nor null (RFC 0001 label)")
    elif type_ == "link":
        if not isinstance(obj.get("rel"), str):
            out.append(f"link rel {_show(obj.get('rel'))} is not a string: a link says how it relates to the session it names (RFC 0001 link)")
    return out


def check_line(
    obj: dict[str, Any],
    *,
    line: int | None = None,
    careful: bool | None = None,
    keep_objects: bool = False,
    migrated: bool = False,
    require_id: bool = True,
    raw: bytes | None = None,
    into: Entry | None = None,
) -> tuple[Entry | None, list[Problem]]:
    """The line rules of one parsed entry line: the entry (None when it cannot be
    hashed, or is no entry at all) and every line rule it breaks.

    ``careful`` is the parse's flag (see ``canonical.loads_flagged``);
    ``keep_objects`` keeps the content and envelope bytes on ``Entry.objects``
    for a caller that stores them next; ``migrated`` is for an object migrated from
    before 0.5, which may carry ``content`` (reported as unresolved instead);
    ``require_id=False`` for an entry a store is given to append, whose id it computes
    (a stated one is still held to the hash); ``raw``, the line's bytes when
    ``canonical.loads_canonical`` proved them its canonical form (an item's bytes are
    then cut from them, not encoded); ``into``, the caller's own entry of ``obj`` (its
    ``data``, hashed as here), given back rather than a second one made (a store's append
    of the entry it was handed)."""
    type_ = obj.get("type")
    if not isinstance(type_, str) or not type_:
        return None, [problem(line, "entry", "the entry has no string 'type'")]
    if type_ == "session":
        return None, [problem(line, "entry", "a second header: only the first line may be of type 'session'")]
    out: list[Problem] = []
    if not is_entry_type(type_):
        out.append(problem(line, "type", f"unknown entry type {_show(type_)}: neither a core type nor namespaced (ns:type)"))
    stated = obj.get("id")
    objects = None
    item_bytes = None
    try:
        if keep_objects and not migrated:
            if "ts" not in obj:
                raise EntryError("entry has no 'ts'")  # entry_objects hashes a missing ts as null
            computed, chash, content, env, item_bytes = entry_objects_item(obj, parsed=True, careful=careful, line=raw)
            objects = (content, env)
        else:
            computed, chash = entry_hashes(obj, parsed=True, careful=careful, allow_reserved=migrated)
    except (EntryError, IJSONError) as exc:
        named = stated if isinstance(stated, str) else None
        if isinstance(exc, ReservedMemberError):
            out.append(problem(line, "reserved", str(exc), named))
        elif isinstance(exc, EntryError):
            out.append(problem(line, "entry", str(exc), named))
        else:
            out.append(problem(line, "ijson", f"not I-JSON: {exc}", named))
        return None, out
    if stated == computed:
        computed = stated  # the common case: the line's id is the hash of its members (one string held for both)
    elif stated is None:
        if require_id:
            out.append(problem(line, "id", f"the entry has no id (its members hash to {computed})", computed))
    elif not is_hash(stated):
        out.append(problem(line, "id", f"id {_show(stated)} is not sha256: followed by 64 lowercase hex digits"))
    else:
        out.append(problem(line, "hash", f"id {stated} does not match the hash of the entry's members ({computed})", stated))
    ts = obj.get("ts")
    if not is_valid_ts(ts):
        out.append(problem(line, "ts", f"ts {_show(ts)} {_TS_FORM}"))
    if "normalised" in obj:
        from .normalise import check_normalised  # (rare: an entry that records normalising; not loaded for the others)

        wrong = check_normalised(obj["normalised"])
        if wrong is not None:
            out.append(problem(line, "normalised", wrong, stated if isinstance(stated, str) else computed))
    if (
        (type_ == "item" and obj.get("item").__class__ is not dict)
        or (type_ == "outcome" and not isinstance(obj.get("target"), str))
        or type_ == "label"
        or (type_ == "link" and not isinstance(obj.get("rel"), str))
    ):
        for lack in _required(type_, obj):
            out.append(problem(line, "missing-member", lack, stated if isinstance(stated, str) else computed))
    return _entry(obj, computed, chash, line, careful, objects, item_bytes if objects is not None else None, into), out


def _entry(
    obj: dict[str, Any], computed: str, chash: str, line: int | None, careful: bool | None,
    objects: tuple[bytes, bytes] | None, item_bytes: bytes | None, into: Entry | None = None,
) -> Entry:
    if into is not None and into.data is obj and into.computed_id == computed and into.content_hash == chash:
        entry = into  # (its hashes are these already: nothing of it changes but what follows)
        entry.line = line
    else:
        entry = Entry(obj, computed_id=computed, content_hash=chash, line=line)
    entry.careful = careful  # the parse's flag, so a later serialisation skips the scan
    entry.objects = objects
    if item_bytes is not None or entry is not into:  # (a caller's own entry keeps what it has)
        entry.item_bytes = item_bytes
    return entry


def clean_entry(
    obj: dict[str, Any], content_hash: str, *, line: int | None, item_bytes: bytes | None,
    objects: tuple[bytes, bytes] | None = None,
) -> Entry:
    """The entry :func:`check_line` makes of a line it finds nothing wrong with, parsed from
    bytes proven canonical (``careful`` False), when that check was run elsewhere (the
    helper process of :mod:`~agentsession_cas.format.parallel`, which gave the content
    hash, the item's bytes and, for an import, the two objects): its id is then the hash
    of its members. ``line`` is None for an entry from no file's line (a pushed one)."""
    return _entry(obj, obj["id"], content_hash, line, False, objects, item_bytes)


# ---------------------------------------------------------------------------
# tree rules


class TreeState:
    """Where each entry hangs, fed one entry at a time in file (log) order.

    It holds what the tree rules need and nothing of the entries themselves: the
    ids held (with the line each was read from, for a repeat's message), the
    prefix above the base and the session's own entries, the ids of lines that
    could not be read (so their children do not report a missing parent for a
    fault reported already), and which entries are ``leaf`` labels (a base or a
    head never rests on one). A store uses the same object for its append's parent
    rule: an own entry hangs from the base, from an own entry, or from null when
    there is no base.
    """

    def __init__(self, header: Header, *, above: Container[str] | None = None, held: dict[str, Any] | None = None):
        self.session = header.id
        self.base = header.base
        #: The prefix, base included, when the caller holds it already and does not
        #: feed it (fsck: a lookup it fills only when an entry names something not
        #: own); None when the prefix comes first in the order, as in a file.
        self.above = above
        #: id -> the line it was read from (None: not read from a file); ``held``, an
        #: empty dict the caller reads too (a reader's map of where each entry is).
        self.held: dict[str, int | None] = held if held is not None else {}
        #: Ids of lines that could not be read (a reader's; a store has none).
        self.broken: set[str] = set()
        #: Still reading the path to the base.
        self.in_prefix = self.base is not None and above is None
        self._prefix_prev: str | None = None
        #: The prefix, base excluded, in order.
        self.prefix: list[str] = []
        #: Entries after the base (kept with a base only: without one, every entry held is own).
        self.own: set[str] = set()
        self.leaf_labels: set[str] = set()
        # Ids added while a trial is open, for a rollback.
        self._trial_ids: list[str] | None = None

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.held

    def __len__(self) -> int:
        return len(self.held)

    def _known(self, entry_id: str) -> bool:
        """Held, or on a prefix the caller holds; an unreadable line's id counts too,
        so its children do not report again a fault reported already."""
        if entry_id in self.held or entry_id in self.broken:
            return True
        return self.above is not None and entry_id in self.above

    def mark_broken(self, entry_id: str) -> None:
        """An id a line claims that could not be read."""
        self.broken.add(entry_id)

    def check(self, entry: Entry) -> list[Problem]:
        """The tree rules the entry would break were it added now, holding nothing: a
        planner's question (repair: may this entry be kept where it stands?)."""
        return self.add(entry, hold=False)

    def add(self, entry: Entry, hold: bool = True) -> list[Problem]:
        """The tree rules the entry breaks; it is held from now on, unless its id is held
        already, which is the same entry again (the first is kept). ``hold=False`` is
        :meth:`check`. (One method: every entry of a read or an append comes here.)"""
        eid = entry.id
        held = self.held
        if eid in held or (self.above is not None and eid in self.above):
            first = held.get(eid)
            where = f"line {first}" if first is not None else "an earlier entry"
            return [problem(entry.line, "duplicate", f"id {shown_id(eid)} repeats {where}; read as the same entry", eid)]
        out: list[Problem] = []
        data = entry.data
        parent = data.get("parent")
        if parent is None or parent not in held:
            self._parent(entry, out)
        if "parents" in data:
            self._parents(entry, out)
        if self.base is not None:
            self._base(entry, out, hold)
        if hold:
            held[eid] = entry.line
            if data.get("label") == LEAF_LABEL and data.get("type") == "label":
                self.leaf_labels.add(eid)
            if self._trial_ids is not None:
                self._trial_ids.append(eid)
        return out

    def _parent(self, entry: Entry, out: list[Problem]) -> None:
        # (A parent that is neither a string nor null never hashes: check_line's "entry".)
        data = entry.data
        parent = data.get("parent")
        if "parent" not in data:
            out.append(problem(entry.line, "parent", "the entry has no 'parent' (null for a root)", entry.id))
        elif parent is not None and not self._known(parent):
            out.append(problem(entry.line, "parent", f"parent {_show(parent)} does not appear earlier in the session", entry.id))

    def _parents(self, entry: Entry, out: list[Problem]) -> None:
        refs = entry.data.get("parents")
        line, eid = entry.line, entry.id
        if refs is None or refs == []:
            # RFC 0001: a writer MUST omit an empty one. The id hashes it as absent, and a
            # store holds no member the envelope leaves out, so a line that carries one
            # would come back from a round trip without it: refused here, not altered.
            if "parents" in entry.data:
                out.append(problem(line, "parents", f"'parents' is {'null' if refs is None else 'empty'}: a writer "
                                   "omits the member when it names no entry", eid))
            return
        if not isinstance(refs, list):
            out.append(problem(line, "parents", "'parents' is not an array", eid))
            return
        seen: set[str] = set()
        for ref in refs:
            if not isinstance(ref, dict) or not isinstance(ref.get("entry"), str):
                out.append(problem(line, "parents", "a 'parents' reference has no string 'entry'", eid))
                continue
            target = ref["entry"]
            session = ref.get("session")
            if target == entry.parent:
                out.append(problem(line, "parents", f"'parents' repeats the parent {shown_id(target)}", eid))
            if target in seen:
                out.append(problem(line, "parents", f"'parents' names {shown_id(target)} twice", eid))
            seen.add(target)
            if (session is None or session == self.session) and not self._known(target):
                out.append(problem(line, "parents", f"'parents' names {_show(target)}, which does not appear earlier in this session", eid))

    def _base(self, entry: Entry, out: list[Problem], hold: bool) -> None:
        """The file opens with the path to the base; every own entry hangs from it."""
        base = self.base
        assert base is not None
        if self.in_prefix:
            if entry.parent != self._prefix_prev:
                expected = "null (the root)" if self._prefix_prev is None else _show(self._prefix_prev)
                out.append(problem(
                    entry.line,
                    "base",
                    f"the file must open with the path to base {short_id(base)}: "
                    f"this entry's parent is {_show(entry.parent)}, expected {expected}",
                    entry.id,
                ))
            if not hold:
                return
            self._prefix_prev = entry.id
            if entry.id == base:
                self.in_prefix = False
            else:
                self.prefix.append(entry.id)
            return
        parent = entry.parent
        if parent is None and "parent" not in entry.data:
            pass  # no parent member at all: the parent rule's, reported once
        elif parent is None:
            out.append(problem(
                entry.line,
                "base",
                "an own entry must hang from the base or another own entry; its parent is null, and a session "
                "with a base has its one root on the prefix",
                entry.id,
            ))
        elif parent != base and parent not in self.own and parent is not None and self._known(parent) and parent not in self.broken:
            # (a parent not held at all is the parent rule's, reported once)
            out.append(problem(
                entry.line,
                "base",
                f"an own entry must hang from the base or another own entry; its parent {_show(parent)} "
                "is on the prefix above the base",
                entry.id,
            ))
        if hold:
            self.own.add(entry.id)

    def finish(self) -> list[Problem]:
        """The tree rules of the file as a whole: a base named and never held."""
        if self.base is not None and self.in_prefix and self.held:
            return [problem(None, "base", f"the header names base {self.base}, which the file does not hold")]
        return []

    def head_allowed(self, target: str | None) -> bool:
        """May the session's head (the leaf) rest on ``target``: the base, or an own
        entry that is not a ``leaf`` label; null only without a base (RFC 0002 Head)."""
        if target == self.base and self.in_prefix:
            return False
        return head_may_rest(target, self.base, self.own if self.base is not None else self.held, self.leaf_labels)

    # -- trials -----------------------------------------------------------------

    def _snapshot(self) -> tuple[int, bool, str | None, int]:
        if self._trial_ids is None:
            self._trial_ids = []
        return len(self._trial_ids), self.in_prefix, self._prefix_prev, len(self.prefix)

    def _restore(self, mark: tuple[int, bool, str | None, int]) -> None:
        n, self.in_prefix, self._prefix_prev, prefix = mark
        ids = self._trial_ids or []
        for eid in ids[n:]:
            del self.held[eid]
            self.own.discard(eid)
            self.leaf_labels.discard(eid)
        del ids[n:]
        del self.prefix[prefix:]

    def _settle(self) -> None:
        """No trial is open any more: stop keeping the ids added."""
        self._trial_ids = None


# ---------------------------------------------------------------------------
# record and context rules along the path


class OpenRun(NamedTuple):
    """The run open at the tip of the path, and what its segment reads so far: the
    end a writer closing it here agrees with (the ``reason`` by the RFC's cascade,
    and the ``pending`` calls)."""

    run_id: str | None
    start: str
    reason: RunReason
    why: str
    pending: tuple[str, ...]


class _PathIndex:
    """A :class:`PathChecker`'s context builder's ``index`` (id -> place on the path, for
    the entries on it): the checker's :meth:`PathChecker._depth_at`, since the builder's
    path is the checker's. The builder's writes to it are let go: nothing is kept. (The
    checker is reached through a weak reference: it holds the builder, which holds this.)"""

    __slots__ = ("_checker",)

    def __init__(self, checker: weakref.ref[PathChecker]):
        self._checker = checker

    def get(self, key: Any, default: Any = None) -> Any:
        checker = self._checker()
        assert checker is not None  # the builder lives only as long as its checker
        d = checker._depth_at(key) if isinstance(key, str) else None
        return default if d is None else d

    def __getitem__(self, key: Any) -> int:
        d = self.get(key)
        if d is None:
            raise KeyError(key)
        return d

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None

    def __setitem__(self, key: Any, value: int) -> None:
        pass

    def __delitem__(self, key: Any) -> None:
        pass

    def clear(self) -> None:
        pass

    def update(self, *args: Any) -> None:
        pass


#: Pops :meth:`PathChecker._pop_to` makes one by one; more are undone at once.
_FEW_POPS = 8


#: What :meth:`PathChecker._snapshot` notes, to go back to: (order, trial, tip, problems,
#: notes, seen, rebuilt, budget, calls_checked), the lengths and values then. A plain
#: tuple: every append makes one, and a tuple is made in one step.
_PathMark = tuple[int, int, str | None, int, int, int, int, int, int]


class PathChecker:
    """The record and context rules, fed entries in file (log) order.

    It stays positioned on the path to the last entry added. :meth:`add` moves to
    the entry's parent (popping back to the common ancestor and pushing down the
    parent's path, the entries loaded by ``loader``, a dict of every entry added
    when none is given) and pushes the entry into the record walker and the context
    builder, returning the problems that brought: whichever entry each names, such as
    a run start's ``run-source`` found when the entry taking a call up arrives.
    Pushing an entry again (when the path comes back to it) finds nothing new, and
    nothing is reported twice. A ``response`` has its ``request_hash`` checked when
    it is first pushed, and the :class:`RequestCheck` is kept (:attr:`requests`).

    An entry whose parent was never added is the root of a cut path: its responses,
    and those below it, cannot be rebuilt and are ``error`` checks.

    ``requests=False`` rebuilds no request (no :class:`RequestCheck` is made): for a
    caller that reports no context rule, ``show`` of a stored session, which feeds the
    checker one path (:meth:`add`) and the calls and dispatches off it (:meth:`aside`)
    in one walk, then asks :meth:`report_here`.
    """

    def __init__(self, header: Header, *, loader: Callable[[str], Entry] | None = None, requests: bool = True):
        self.header = header
        self._rebuild = requests
        #: Each entry's place in the order added.
        self.seq: dict[str, int] = {}
        self._order: list[str] = []
        self._loader = loader
        self._entries: dict[str, Entry] | None = {} if loader is None else None
        #: The parent each entry hangs from on its path, as the parent's place in the order
        #: (-1: a root, cut or not), by the entry's place as :attr:`_depths` (:meth:`_parent_of`).
        self._parents: array[int] = array("i")
        #: Parents of entries the order's arrays do not number (a restored checker's).
        self._parent: dict[str, str | None] = {}
        #: Why the path from each cut root cannot be rebuilt.
        self._cut: dict[str, str] = {}
        # The walker reports through a weak reference: a bound method would make the two a
        # cycle, which a pass run with the collector paused (gc_paused) never frees.
        me = weakref.ref(self)

        def report(entry: Entry, code: str, message: str) -> None:
            checker = me()
            assert checker is not None  # the walker lives only as long as its checker
            checker._report(entry, code, message)

        self.walker = RecordWalker(header, report=report, seq=self.seq)
        self.builder = ContextBuilder()
        # The builder's path is this checker's, pushed and popped with it: where an entry
        # stands on it is read off the checker's depths, not kept in a map of its own.
        self.builder.index = _PathIndex(me)  # type: ignore[assignment]  # (what the builder asks of a dict)
        self.path: list[Entry] = []
        #: Each entry's depth on its path (fixed: its parent's and one), by its place in
        #: the order (``seq``) less :attr:`_depths_from` (the place of the first entry these
        #: arrays number: 0, but a restored checker's first added): an entry stands on the path when
        #: the path holds it at that depth (:meth:`_depth_at`). Machine integers, written
        #: once an entry, never undone by a pop: not a map of the path's ids kept in step
        #: with every move (a long linear path held an int and a map slot an entry).
        self._depths: array[int] = array("i")
        self._depths_from = 0
        #: Depths of entries the order's array does not number (a restored checker's tip).
        self._depth: dict[str, int] = {}
        #: Every response's check, in the order added.
        self.requests: dict[str, RequestCheck] = {}
        self._rebuilt: dict[str, str] = {}  # a request hash that verified -> the response it verified for
        self._budget = DIAGNOSE_LIMIT
        #: Every problem of severity error found, and every note, in the order found.
        self.problems: list[Problem] = []
        self.notes: list[Problem] = []
        #: The file-level notes of the last :meth:`finish`.
        self.file_notes: list[Problem] = []
        self._seen: set[tuple[str, str]] = set()
        self._seen_log: list[tuple[str, str]] = []
        #: How many of :attr:`_seen_log` came before :meth:`finish` (None until it ran):
        #: what :meth:`finish` reports is the file's end, not a session's state.
        self.seen_before_finish: int | None = None
        self._out: list[Problem] | None = None
        #: entry id -> (start, run id) of a resume run open there that has taken nothing up
        self._open: dict[str, tuple[Entry, str | None]] = {}
        self._trial: list[Entry] | None = None  # entries added while a trial is open

    @property
    def order(self) -> Sequence[str]:
        """The ids added, in the order added (a trial's undone adds gone)."""
        return self._order

    # -- reporting ----------------------------------------------------------------

    def _report(self, entry: Entry, code: str, message: str) -> None:
        """A rule broken at ``entry``, in the record rules' words: ``<type> <id>: ...``."""
        self._keep(entry, code, _at(entry, message))

    def _keep(self, entry: Entry, code: str, message: str) -> None:
        key = (entry.id, code)
        if key in self._seen:
            return
        self._seen.add(key)
        self._seen_log.append(key)
        p = problem(entry.line, code, message, entry.id)
        (self.notes if p.severity == "note" else self.problems).append(p)
        if self._out is not None:
            self._out.append(p)

    # -- moving along the tree ----------------------------------------------------------

    def _load(self, entry_id: str) -> Entry:
        if self._entries is not None:
            return self._entries[entry_id]
        assert self._loader is not None
        return self._loader(entry_id)

    def _push(self, e: Entry, t: Any = None) -> None:
        """Push ``e`` (of type ``t``, read from it when not given) on the path."""
        if t is None:
            t = e.data.get("type")
        self.builder.push(e, t)  # (first: its index reads the path, which does not hold ``e`` yet)
        self.path.append(e)
        w = self.walker
        w.push(e, t)
        if t == "response" or t == "compaction" or t == "config":  # (the rest bring nothing more here)
            self._pushed(e, t)
        run = w.run
        if run is not None and w.open_unjudged() is not None:
            self._open[e.id] = (run.start, run.run_id)

    def _pushed(self, e: Entry, t: str) -> None:
        """What pushing a response, a compaction or a config found beyond the walker's: a
        response's request hash, a ``first_kept`` naming nothing, an ``of`` unresolved."""
        b = self.builder
        if t == "response":
            if e.id not in self.requests and self._rebuild:
                self._check_response(e)
        elif t == "compaction":
            if b.error is not None:
                self._keep(e, "first_kept", b.error)
        elif b.unresolved_of is not None:
            self._keep(e, "of", f"config {shown_id(e.id)}: an omitted keep names the list of config "
                       f"{json.dumps(b.unresolved_of)}, which its path cannot resolve; the element is kept as "
                       "written, which is not corruption")

    def _depth_at(self, entry_id: str) -> int | None:
        """Where ``entry_id`` stands on the path (its depth), None when it is not on it."""
        s = dict.get(self.seq, entry_id)  # (a plain lookup: a restored order's entries are not numbered here)
        d: int | None = None
        if s is not None:
            i = s - self._depths_from
            if 0 <= i < len(self._depths):
                d = self._depths[i]
        if d is None:
            d = self._depth.get(entry_id)
        path = self.path
        if d is None or not 0 <= d < len(path) or path[d].id != entry_id:
            return None
        return d

    def _parent_of(self, entry_id: str) -> str | None:
        """The parent ``entry_id`` (an entry added) hangs from on its path: None for a root."""
        i = self.seq[entry_id] - self._depths_from
        if 0 <= i < len(self._parents):
            p = self._parents[i]
            return None if p < 0 else self._order[p]
        return self._parent[entry_id]

    def _pop(self) -> None:
        self.path.pop()
        self.walker.pop()
        self.builder.pop()

    def _pop_to(self, keep: int) -> None:
        """Pop the path down to its first ``keep`` entries: what as many :meth:`_pop` do,
        undone at once past a few (a close stands a long branch back at the head: 90,000
        pops one by one cost a third of it)."""
        path = self.path
        if len(path) - keep <= _FEW_POPS:
            while len(path) > keep:
                self._pop()
            return
        del path[keep:]
        self.walker.pop_to(keep)
        self.builder.pop_to(keep)

    def _goto(self, target: str | None) -> None:
        """Reposition so that ``target`` (None: nothing) is the tip of the path."""
        path = self.path
        if target is None:
            self._pop_to(0)
            return
        if path and path[-1].id == target:
            return
        d = self._depth_at(target)
        if d is not None:
            self._pop_to(d + 1)
            return
        chain: list[str] = []
        x: str | None = target
        while x is not None:
            d = self._depth_at(x)
            if d is not None:
                break
            chain.append(x)
            x = self._parent_of(x)
        self._pop_to(d + 1 if d is not None else 0)
        for eid in reversed(chain):
            self._push(self._load(eid))

    def _check_response(self, e: Entry) -> None:
        check = check_tip(self.builder, self._cut.get(self.path[0].id), diagnose=self._budget > 0)
        if check.status == "mismatch":
            self._budget -= 1
            if check.reason is None and isinstance(check.recorded, str) and check.recorded in self._rebuilt:
                # only a response added before this one: a later one cannot change the words
                other = self._rebuilt[check.recorded]
                check.reason, check.detail = "other-response", f"the request rebuilt for response {shown_id(other)}"
        elif check.status == "ok" and check.computed is not None:
            self._rebuilt.setdefault(check.computed, e.id)
        self.requests[e.id] = check
        if check.failed:
            if self.header.data.get("redacted") is True:
                # RFC 0001: a redacted file's request_hash is the original's request.
                self._keep(e, "redacted-request", f"response {shown_id(e.id)}: {check.message()}; the file is redacted, "
                                                  "so its request_hash names the original's request, not this path's")
            else:
                self._keep(e, "request_hash", f"response {shown_id(e.id)}: {check.message()}")

    # -- feeding --------------------------------------------------------------------

    def add(self, entry: Entry, *, prefix: bool = False) -> list[Problem]:
        """Check ``entry``, the next in file (log) order, where it hangs; ``prefix`` for an
        entry of a fork's prefix (the path to the base, the base included), which the
        header's ``records`` promise does not cover. Returns the problems it brought
        (notes among them). An id added already is ignored: it is the same entry."""
        eid = entry.id
        seq = self.seq
        if eid in seq:
            return []
        out: list[Problem] = []
        self._out = out
        try:
            data = entry.data
            parent = data.get("parent")
            if parent.__class__ is not str:
                parent = entry.parent  # (Entry.parent's reading of anything else)
            held = parent is not None and parent in seq  # before this entry is: it may name itself
            order = self._order
            depths = self._depths
            if not depths:
                self._depths_from = len(order)
            seq[eid] = len(order)
            order.append(eid)
            depths.append(-1)  # (its depth once the path stands at its parent)
            parents = self._parents
            parents.append(-1)
            if self._entries is not None:
                self._entries[eid] = entry
            if self._trial is not None:
                self._trial.append(entry)
            path = self.path
            if held:
                if not path or path[-1].id != parent:  # (a linear session: the parent is the tip)
                    self._goto(parent)
                parents[-1] = seq[path[-1].id]  # (the parent, now the tip)
            else:
                if parent is not None:
                    self._cut[eid] = f"its path is cut: parent {shown_id(parent)} of line {entry.line} is not in the file"
                self._goto(None)
            depths[-1] = len(path)
            t = data.get("type")
            if prefix:
                self.walker.foreign.add(eid)
            if t == "item" or t == "dispatch":  # (the types the session-wide call facts read)
                self.walker.register(entry, t)
            self._push(entry, t)
        finally:
            self._out = None
        return out

    def aside(self, entry: Entry, *, prefix: bool = False) -> None:
        """An entry off the one path a caller feeds (:meth:`add`), in file order among
        its entries: its place in the order and what it brings to the session-wide facts
        (a call's id, a dispatch), without moving the path. An entry no path entry hangs
        from (a caller's guarantee): nothing is pushed, nor parented."""
        eid = entry.id
        if eid in self.seq:
            return
        if not self._depths:
            self._depths_from = len(self._order)
        self.seq[eid] = len(self._order)
        self._order.append(eid)
        self._depths.append(-1)  # (never on the path)
        self._parents.append(-1)
        if prefix:
            self.walker.foreign.add(eid)
        t = entry.data.get("type")
        if t == "item" or t == "dispatch":
            self.walker.register(entry, t)

    def add_all(self, entries: Iterable[Entry]) -> None:
        """Add a whole session in file order; in a session with a base, every entry until
        the base has come, and the base, is the prefix."""
        base = self.header.base
        add = self.add
        if base is None:
            for e in entries:
                add(e)
            return
        prefix = True
        for e in entries:
            add(e, prefix=prefix)
            if e.id == base:
                prefix = False

    def finish(self) -> list[Problem]:
        """What can be said once every entry is in: a resume run open at a leaf with no
        call taken up (``run-source-open``, once a run), and which rules the file's
        format declares when record rules are broken. Returns both (also kept on
        :attr:`notes` and :attr:`file_notes`)."""
        out: list[Problem] = []
        self._out = out
        if self.seen_before_finish is None:
            self.seen_before_finish = len(self._seen_log)
        try:
            if self._open:
                parents = set(self._parents)
                seq = self.seq
                for eid, (start, run_id) in list(self._open.items()):
                    if seq[eid] not in parents:
                        self._report(start, "run-source-open", open_source_message(run_id))
        finally:
            self._out = None
        codes = {p.code for p in self.problems if RULES[p.code].scope == "record"}
        self.file_notes = [problem(None, code, message) for code, message in format_notes(self.header, codes)]
        return out + self.file_notes

    # -- views ------------------------------------------------------------------------

    def open_run(self, at: str | None | object = ...) -> OpenRun | None:
        """The run open at the tip (or at entry ``at``, moving there: None is the
        universal root), with the reason and pending list its segment reads were it to
        end there; None when no run is open."""
        if at is not ...:
            self._goto(at)  # type: ignore[arg-type]
        w = self.walker
        run = w.run
        if run is None:
            return None
        reason, why, pending, _ = w.reason(run, len(w.path) - 1)
        return OpenRun(run.run_id, run.start.id, reason, why, tuple(c.call_id for c in pending))

    def report(self, leaf: str | None, *, source: str = "", settle: Callable[[Entry], None] | None = None,
               tidy: Callable[[], None] | None = None, path: Iterable[Entry] | None = None) -> RunsReport:
        """Runs, calls, the inbox and the record problems on the path to ``leaf`` (None:
        the universal root): the problems found for entries on it, in the words the
        whole check used, and a resume run open at the leaf noted, not judged. The path
        is walked again from its root, each entry loaded; ``settle(entry)`` is given each
        once it is pushed and ``tidy()`` is called after each call is described (a
        caller's :class:`~agentsession_cas.format.reader.Parking`, so a long path, or
        its calls, are not held whole). ``path``: the path's entries, root first, as the
        caller reads them (in bulk, in order), in place of each loaded by id. The checker
        stands on the path after."""
        w = self.walker
        self._goto(None)
        w.collect_runs = True
        w.runs = []
        try:
            chain: list[str] = []
            x = leaf
            while x is not None:
                chain.append(x)
                x = self._parent_of(x)
            inbox = Inbox()  # fed as the path is pushed: each entry read once
            given = iter(path) if path is not None else None
            for eid in reversed(chain):
                e = self._load(eid) if given is None else next(given)
                if e.id != eid:
                    raise AgentSessionError(f"the path given to the runs report has {shown_id(e.id)} where {shown_id(eid)} is")
                self._push(e)
                inbox.feed(e)
                if settle is not None:
                    settle(e)
            return self.report_here(leaf, inbox, source=source, tidy=tidy)
        finally:
            w.collect_runs = False
            w.runs = []

    def report_here(self, leaf: str | None, inbox: Inbox, *, source: str = "",
                    tidy: Callable[[], None] | None = None) -> RunsReport:
        """:meth:`report` of the path the checker stands on, ``leaf`` its tip, once it was
        pushed with the walker collecting runs (``walker.collect_runs``) and ``inbox`` fed
        it: what :meth:`report` makes after its walk, and what a caller that fed the
        checker that path in its one walk asks for. A run open at the leaf is closed
        there."""
        from .results import RunsReport  # (loaded where a report is made: not by an append)

        w = self.walker
        open_note: Problem | None = None
        run = w.run
        if run is not None:
            w._close(run, None, "leaf")
            if w.open_unjudged() is not None:
                start = run.start
                open_note = problem(start.line, "run-source-open", _at(start, open_source_message(run.run_id)), start.id)
        path_length = len(self.path)
        runs = list(w.runs)
        calls = []
        for c in w.call_order:
            calls.append(w.info(c))
            if tidy is not None:
                tidy()
        def here(p: Problem) -> bool:
            return p.entry is not None and self._depth_at(p.entry) is not None and RULES[p.code].scope == "record"

        problems = _by_line_code([p for p in self.problems if here(p)])
        notes = [p for p in self.notes if here(p) and p.code != "run-source-open"]
        if open_note is not None:
            notes.append(open_note)
        notes = _by_line_code(notes)
        notes += [problem(None, code, message) for code, message in format_notes(self.header, {p.code for p in problems})]
        return RunsReport(
            source=source,
            leaf=leaf,
            path_length=path_length,
            records=tuple(self.header.records),
            runs=runs,
            calls=calls,
            inbox=inbox.queued(),
            problems=problems,
            notes=notes,
        )

    # -- trials -----------------------------------------------------------------------

    def _snapshot(self) -> _PathMark:
        if self._trial is None:
            self._trial = []
        return (
            len(self._order),
            len(self._trial),
            self.path[-1].id if self.path else None,
            len(self.problems),
            len(self.notes),
            len(self._seen_log),
            len(self._rebuilt),
            self._budget,
            self.walker.calls_checked,
        )

    def _restore(self, mark: _PathMark) -> None:
        """Undo every add since ``mark``: the path returns to its tip then, and every
        session-wide fact those adds registered is forgotten."""
        n, trial, tip, problems, notes, seen, rebuilt, budget, calls_checked = mark
        seq = self.seq
        while self.path and seq[self.path[-1].id] >= n:
            self._pop()
        gone = (self._trial or [])[trial:]
        for e in gone:
            eid = e.id
            del seq[eid]
            self._cut.pop(eid, None)
            self.requests.pop(eid, None)
            self._open.pop(eid, None)
            if self._entries is not None:
                self._entries.pop(eid, None)
        self.walker.forget(gone, calls_checked)
        del self._order[n:]
        del self._depths[max(0, n - self._depths_from):]
        del self._parents[max(0, n - self._depths_from):]
        if self._trial is not None:
            del self._trial[trial:]
        while len(self._rebuilt) > rebuilt:
            self._rebuilt.popitem()
        for key in self._seen_log[seen:]:
            self._seen.discard(key)
        del self._seen_log[seen:]
        del self.problems[problems:]
        del self.notes[notes:]
        self._budget = budget
        self._goto(tip)

    def _settle(self) -> None:
        self._trial = None


def empty_problem(stored: bool = False) -> Problem:
    """The one ``empty`` note: a file that holds a header and no entries, or (``stored``)
    a stored session that holds none, whose projection would be that file. A note, not
    an error: RFC 0001's session is a header, a base or none, a head and the entries,
    and RFC 0002 imports such a file as a session with no head (a session just created)."""
    if stored:
        return problem(None, "empty", "the session holds no entries: its projection would be a header alone")
    return problem(None, "empty", "the file holds a header and no entries")


def _header_notes(header: Header) -> list[Problem]:
    """What the header alone says about the checks: a redacted file verifies itself only."""
    if header.data.get("redacted") is True:
        return [problem(1, "redacted", "the header says the file was redacted: its hashes verify this file, never the original")]
    return []


def _at(entry: Entry, message: str) -> str:
    """A message about one entry, as the record rules word it: ``<type> <id>: <message>``."""
    return f"{entry.type} {shown_id(entry.id)}: {message}"


def _by_line_code(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0, p.code))


def _by_line(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0))


# ---------------------------------------------------------------------------
# the two put together


@dataclass(slots=True)  # not frozen: a rebuilt checker gives a trial its own marks
class Trial:
    """A mark :meth:`SessionChecker.begin` returns: what to go back to."""

    tree: tuple[int, bool, str | None, int]
    path: _PathMark
    problems: int
    notes: int
    links: int


class SessionChecker:
    """The tree, record and context rules of one session, fed entries one at a time
    in file (log) order: what a writer or a store consults before it appends.

    :meth:`add` returns every problem the entry brings (tree, record and context;
    the line rules are :func:`check_line`'s), and the state moves on even when
    there are some, as a verifier goes on. A store that prepares an append and may
    abandon it opens a trial: ``mark = checker.begin()``, then ``add``, then
    ``checker.commit(mark)`` to keep the adds or ``checker.rollback(mark)`` to
    undo every one of them, after which the checker behaves as if they never came.
    Trials nest and end last first.

    ``loader`` fetches an entry by id for the path checker when it moves to a
    branch it left (a dict of every entry added when None).
    """

    def __init__(self, header: Header, *, loader: Callable[[str], Entry] | None = None):
        self.header = header
        self.tree = TreeState(header)
        self.path = PathChecker(header, loader=loader)
        self.problems: list[Problem] = []
        self.notes: list[Problem] = []
        self._trials: list[Trial] = []
        #: The session's own link entries, for the link notes of :meth:`finish`.
        self._links: list[Entry] = []

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.tree

    def add(self, entry: Entry, *, prefix: bool | None = None) -> list[Problem]:
        """Check ``entry`` where it hangs. ``prefix`` says whether it is on a fork's
        prefix (the path to the base, the base included), which the header's
        ``records`` promise does not cover; None reads it off the order: every entry
        until the base has come is on the prefix, as in a file."""
        tree = self.tree
        if entry.id in tree.held:
            out = tree.add(entry)  # the same entry again: reported, and nothing else
        else:
            on_prefix = tree.in_prefix if prefix is None else prefix
            out = tree.add(entry)
            found = self.path.add(entry, prefix=on_prefix)
            if found:
                out.extend(found)
            if entry.data.get("type") == "link" and not on_prefix:
                derived = derived_note(self.header, entry, self._links)
                if derived is not None:
                    out.append(derived)
                self._links.append(entry)
        if out:
            self._keep(out)
        return out

    def add_prefix(self, entries: Iterable[Entry]) -> list[Problem]:
        """Feed a fork's prefix, the path to the base with the base, before any own entry."""
        out: list[Problem] = []
        for e in entries:
            out.extend(self.add(e, prefix=True))
        return out

    def finish(self) -> list[Problem]:
        """The rules of the session as a whole, once every entry is in: a base never held,
        no entry at all, the header's members of another form (``header-member``), and
        the notes of :meth:`PathChecker.finish` and the header."""
        out = self.header.member_problems() + self.tree.finish()
        if not len(self.tree):
            out.append(empty_problem())
        out += self.path.finish() + _header_notes(self.header) + store_note(self._links)
        return out

    def _keep(self, problems: list[Problem]) -> None:
        for p in problems:
            (self.notes if p.severity == "note" else self.problems).append(p)

    def open_run(self, at: str | None | object = ...) -> OpenRun | None:
        """The run open at the tip of the last entry's path, or at entry ``at`` (see
        :meth:`PathChecker.open_run`)."""
        return self.path.open_run(at)

    @property
    def requests(self) -> dict[str, RequestCheck]:
        return self.path.requests

    # -- trials -----------------------------------------------------------------------

    def begin(self) -> Trial:
        """Open a trial: every add from now on can be undone by :meth:`rollback`."""
        trial = Trial(self.tree._snapshot(), self.path._snapshot(), len(self.problems), len(self.notes), len(self._links))
        self._trials.append(trial)
        return trial

    def _end(self, trial: Trial) -> None:
        if not self._trials or self._trials[-1] is not trial:
            raise AgentSessionError("trials end last first: this one is not the innermost open")
        self._trials.pop()
        if not self._trials:
            self.tree._settle()
            self.path._settle()

    def commit(self, trial: Trial) -> None:
        """Keep every add since ``trial`` began."""
        self._end(trial)

    def rollback(self, trial: Trial) -> None:
        """Undo every add since ``trial`` began: the tree, the path and every session-wide
        fact (call ids, dispatches, counts, problems reported) are as they were."""
        if not self._trials or self._trials[-1] is not trial:
            raise AgentSessionError("trials end last first: this one is not the innermost open")
        self.path._restore(trial.path)
        self.tree._restore(trial.tree)
        del self.problems[trial.problems:]
        del self.notes[trial.notes:]
        del self._links[trial.links:]
        self._end(trial)


# ---------------------------------------------------------------------------
# verifying a file


def verify_session(sf: SessionFile) -> VerifyReport:
    """Every rule a session file breaks, in one pass over its entries in file order.

    The line and tree rules were applied as the file was read (``sf.problems``, by
    :func:`check_line` and :class:`TreeState`); here a :class:`PathChecker` is fed
    every entry once, for the record and context rules. The result is kept on ``sf``,
    so ``verify_requests``, ``verify_records`` and ``analyze_runs`` over one file
    share it."""
    from .results import VerifyReport  # (loaded where a report is made: not by an append)

    cached = sf._verified
    if isinstance(cached, VerifyReport) and cached.entries == len(sf.entries):
        return cached
    checker = PathChecker(sf.header)
    with gc_paused():
        checker.add_all(sf.entries)
        checker.finish()
    report = verify_report(sf.source, sf.header, len(sf.entries), sf.migrated, sf.all_problems(), sf.unresolved, checker,
                           own_entries(sf.header, sf.entries))
    sf._verified = report
    return report


def verify_report(
    source: str,
    header: Header,
    entries: int,
    migrated: bool,
    read: list[Problem],
    unresolved: list[Problem],
    checker: PathChecker,
    links: Sequence[Entry] = (),
) -> VerifyReport:
    """The report of a verify, once the entries were read (``read``: the line and tree
    problems, truncation included, in line order; ``unresolved``: migration notes) and
    fed to ``checker``, which has finished; ``links``: the session's own ``link``
    entries, for the notes only a store can settle): what :func:`verify_session` and a
    streamed verify of a file (``reader.verify_file``) both report."""
    from .results import VerifyReport  # (loaded where a report is made: not by an append)

    context = _by_line([p for p in checker.problems if RULES[p.code].scope == "context"])
    records = _by_line_code([p for p in checker.problems if RULES[p.code].scope == "record"])
    problems = _by_line(header.member_problems() + read + context + records)
    context_notes = _by_line([p for p in checker.notes if RULES[p.code].scope == "context"])
    record_notes = _by_line_code([p for p in checker.notes if RULES[p.code].scope == "record"])
    notes = [empty_problem()] if not entries else []
    notes += list(unresolved) + context_notes + record_notes + checker.file_notes + _header_notes(header)
    notes += link_notes(header, links)
    w = checker.walker
    return VerifyReport(
        source=source,
        header=header,
        entries=entries,
        migrated=migrated,
        problems=problems,
        notes=notes,
        requests=list(checker.requests.values()),
        runs_checked=len(w.starts_seen),
        ends_checked=len(w.ends_seen),
        calls_checked=w.calls_checked,
        _checker=checker,
        links=[e for e in links if e.type == "link"],
    )


# ---------------------------------------------------------------------------
# views over verify_session, for callers that want one part


def analyze_path(
    header: Header,
    path: Sequence[Entry],
    *,
    entries: Sequence[Entry] | None = None,
    source: str = "",
) -> RunsReport:
    """Runs, calls and record rules along ``path`` (root first).

    ``entries`` is the whole session in file (log) order, for the rules that span
    branches (call ids unique, a dispatch elsewhere standing for one on the
    path); it defaults to the path. The session is checked once through
    :class:`~agentsession_cas.format.rules.PathChecker`, and the problems are
    those it finds for entries on the path: the words ``verify`` prints.
    """
    all_entries = list(entries) if entries is not None else list(path)
    with gc_paused():
        checker = PathChecker(header)
        checker.add_all(all_entries)
        checker.finish()
        return checker.report(path[-1].id if path else None, source=source)


def analyze_runs(session_file: SessionFile, leaf: str | None = None) -> RunsReport:
    """Runs and calls on the path from the root to ``leaf`` (an entry id; the
    resume rule's leaf when None), with every record rule broken on it."""
    if leaf is None:
        leaf = session_file.leaf
    elif leaf not in session_file.tree:
        session_file.tree.path(leaf)  # raises NoSuchEntryError, as it always did
    with gc_paused():
        return verify_session(session_file).runs_report(leaf)


def verify_records(session_file: SessionFile) -> RecordsCheck:
    """The record rules on every path of the session: call ids, targets, the order
    of decisions, dispatches and outputs, the ``records`` promise, every run's
    source, and every run end against its segment (a view of
    :func:`~agentsession_cas.format.rules.verify_session`)."""
    return verify_session(session_file).records_check()


def verify_requests(sf: Any) -> RequestReport:
    """Every ``response`` of a session file checked (every branch, the prefix included),
    with every compaction's ``first_kept``: the context part of
    :func:`~agentsession_cas.format.rules.verify_session`, which checks the session in
    one pass in file order, each request hash extending the one before it on the path,
    so the work is linear in the session's size however many responses it holds."""
    return verify_session(sf).request_report()
