"""What the format core's builders and checks give back, for the commands that report it:
the :class:`Context` a model call receives (``ContextBuilder.context``), the runs and
calls on a path (:class:`RunsReport`, ``show --runs``), and what a verify found
(:class:`VerifyReport`, with its :class:`RequestReport` and :class:`RecordsCheck`).

The machinery that makes them (``context.py``, ``runs.py``, ``rules.py``) imports this
module only where it makes one, so a command that checks an append and reports nothing
(``agentsession append``) never builds these classes: each ``@dataclass`` costs start-up
(``tests/test_cli_startup.py``). Each name stays importable from the module that made
it before (``format.context.Context``, ``format.runs.RunsReport``,
``format.rules.VerifyReport``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, Literal

from ..errors import Problem
from ..lean import dataclass
from .codes import RULES, Scope
from .context import REASON_IMAGES, RequestCheck, Settings, canonical_request, request_bytes
from .entry import Entry, Header
from .hashing import sha256_ref
from .runs import WRITTEN_REASONS, CallState, RunReason, RunSource, _same_ids

if TYPE_CHECKING:  # the checker a verify report keeps; it makes this module's classes
    from .rules import PathChecker

__all__ = [
    "Context",
    "OmittedItem",
    "ReplacedItem",
    "RequestReport",
    "CallEvent",
    "CallInfo",
    "RunInfo",
    "QueuedInfo",
    "RunsReport",
    "RecordsCheck",
    "VerifyReport",
]


# ---------------------------------------------------------------------------
# a context (format.context)


@dataclass(frozen=True)
class OmittedItem:
    """An item entry the request leaves out, and why (``items`` or ``other_models``)."""

    entry: Entry
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"entry": self.entry.id, "reason": self.reason}


@dataclass(frozen=True)
class ReplacedItem:
    """An item entry the request sends with a placeholder in place of part of it:
    its output (``outputs``) or ``parts`` image parts (``images``)."""

    entry: Entry
    reason: str
    parts: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"entry": self.entry.id, "reason": self.reason}
        if self.reason == REASON_IMAGES:
            out["parts"] = self.parts
        return out


@dataclass
class Context:
    """What a model call at a point on a path receives, with where each item came from."""

    settings: Settings
    #: A list, or with ``ContextBuilder.context(hold_items=False)`` the items read from
    #: their entries as each is asked for (:class:`_Items`).
    items: Sequence[Any]
    #: The entries the algorithm selected, in order: after a compaction, the compaction,
    #: then the kept entries from ``first_kept`` up to it, then everything after.
    entries: list[Entry]
    #: Aligned with ``items``: the entry each item came from (a compaction once for its
    #: summary and once per pinned item).
    item_entries: list[Entry]
    omitted: list[OmittedItem] = field(default_factory=list)
    replaced: list[ReplacedItem] = field(default_factory=list)

    def request(self) -> dict[str, Any]:
        return canonical_request(self.settings, self.items)

    def request_bytes(self) -> bytes:
        return request_bytes(self.settings, self.items)

    def request_hash(self) -> str:
        return sha256_ref(self.request_bytes())

    def as_dict(self, *, lazy: bool = False) -> dict[str, Any]:
        """The shape of a corpus context file's value: ``settings``, ``items``,
        ``entries``, ``item_entries``, and ``omitted``/``replaced`` when any. ``lazy``:
        ``items`` as the context holds them (read from their entries one at a time when it
        was built with ``hold_items=False``), for a writer that writes them one by one."""
        out: dict[str, Any] = {
            "settings": self.settings.as_dict(),
            "items": self.items if lazy else list(self.items),
            "entries": [e.id for e in self.entries],
            "item_entries": [e.id for e in self.item_entries],
        }
        if self.omitted:
            out["omitted"] = [o.as_dict() for o in self.omitted]
        if self.replaced:
            out["replaced"] = [r.as_dict() for r in self.replaced]
        return out


# ---------------------------------------------------------------------------
# runs and calls on a path (format.runs)


@dataclass(frozen=True)
class CallEvent:
    """One thing that happened to a call on the path: a decision, a dispatch or an output."""

    kind: str  # "decision" | "dispatch" | "output"
    entry: str
    line: int | None
    verdict: str | None = None
    by: str | None = None
    reason: str | None = None
    args_rewritten: bool = False
    idempotency_key: str | None = None
    #: A dispatch withdrawn by the reject that directly follows it, or that reject.
    withdrawn: bool = False

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "entry": self.entry, "line": self.line}
        if self.kind == "decision":
            d.update(verdict=self.verdict, by=self.by, reason=self.reason, args_rewritten=self.args_rewritten)
        if self.kind == "dispatch":
            d["idempotency_key"] = self.idempotency_key
        if self.withdrawn:
            d["withdrawn"] = True
        return d


@dataclass(frozen=True)
class CallInfo:
    """A call as the path holds it at one point (a run's end, or the leaf)."""

    call_id: str
    name: str | None
    arguments: str | None
    entry: str
    line: int | None
    state: CallState
    #: Made after the base (the header's ``records`` promise covers it).
    own: bool
    events: tuple[CallEvent, ...]
    output: str | None
    #: A dispatch for the call exists in the session off this path.
    dispatched_elsewhere: bool = False

    @property
    def pending(self) -> bool:
        return self.output is None

    @property
    def dispatches(self) -> tuple[CallEvent, ...]:
        return tuple(e for e in self.events if e.kind == "dispatch" and not e.withdrawn)

    @property
    def idempotency_key(self) -> str | None:
        """The key of the last dispatch that was not withdrawn."""
        ds = self.dispatches
        return ds[-1].idempotency_key if ds else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
            "entry": self.entry,
            "line": self.line,
            "state": self.state,
            "own": self.own,
            "output": self.output,
            "dispatched_elsewhere": self.dispatched_elsewhere,
            "events": [e.as_dict() for e in self.events],
        }


@dataclass(frozen=True)
class RunInfo:
    """One run's segment on the path, what its entries record and what the segment says."""

    run_id: str | None
    start: str
    start_line: int | None
    #: The end entry, or None when the run has none on the path.
    end: str | None
    end_line: int | None
    #: How the segment closes: "end", "start" (the next run's start, with no end),
    #: or "leaf" (open at the end of the path).
    closed_by: Literal["end", "start", "leaf"]
    source: str | None
    computed_source: RunSource
    ref: str | None
    trigger: Any
    recorded_reason: str | None
    recorded_pending: tuple[str, ...] | None
    end_ref: str | None
    computed_reason: RunReason
    #: Why the cascade gave ``computed_reason``, in words.
    computed_why: str
    pending: tuple[str, ...]
    calls: tuple[CallInfo, ...]
    #: The segment holds no context entry, response, dispatch or decision.
    empty: bool
    #: False for a run open at the leaf that has taken no call up: its source is
    #: judged when it takes one up or ends, not before (``run-source-open``).
    source_judged: bool = True

    @property
    def reason_agrees(self) -> bool | None:
        """Whether the written reason stands against the segment (None without an end)."""
        if self.end is None:
            return None
        if self.recorded_reason in WRITTEN_REASONS:
            return True
        return self.recorded_reason == self.computed_reason

    @property
    def pending_agrees(self) -> bool | None:
        if self.end is None:
            return None
        if self.recorded_pending is None:
            return False
        return _same_ids(self.recorded_pending, self.pending)

    @property
    def source_agrees(self) -> bool:
        if not self.source_judged or self.source == self.computed_source:
            return True
        return self.source == "resume" and self.empty

    @property
    def agrees(self) -> bool | None:
        """The end agrees with the segment (None when the run has no end on the path)."""
        if self.end is None:
            return None
        return bool(self.reason_agrees and self.pending_agrees)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "start": self.start,
            "start_line": self.start_line,
            "end": self.end,
            "end_line": self.end_line,
            "closed_by": self.closed_by,
            "source": self.source,
            "computed_source": self.computed_source,
            "source_agrees": self.source_agrees,
            "source_judged": self.source_judged,
            "ref": self.ref,
            "trigger": self.trigger,
            "recorded_reason": self.recorded_reason,
            "recorded_pending": list(self.recorded_pending) if self.recorded_pending is not None else None,
            "end_ref": self.end_ref,
            "computed_reason": self.computed_reason,
            "computed_why": self.computed_why,
            "pending": list(self.pending),
            "agrees": self.agrees,
            "empty": self.empty,
            "calls": [c.as_dict() for c in self.calls],
        }


@dataclass(frozen=True)
class QueuedInfo:
    """A queued input the harness still owes the conversation (the inbox a resume drains)."""

    entry: str
    line: int | None
    mode: str | None
    item: Any
    trigger: Any
    ref: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "line": self.line, "mode": self.mode, "item": self.item,
                "trigger": self.trigger, "ref": self.ref}


@dataclass
class RunsReport:
    """Runs and calls on one path, and every record rule broken on it."""

    source: str
    leaf: str | None
    path_length: int
    records: tuple[str, ...]
    runs: list[RunInfo]
    #: Every call on the path, in path order, with its state at the leaf.
    calls: list[CallInfo]
    inbox: list[QueuedInfo]
    problems: list[Problem]
    notes: list[Problem]

    @property
    def pending(self) -> list[CallInfo]:
        """Calls with no output at the leaf: what a resume answers."""
        return [c for c in self.calls if c.pending]

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self, *, lazy: bool = False) -> dict[str, Any]:
        """The report as ``show --runs --json`` prints it; ``lazy``: its runs and calls
        as sequences made one element at a time as they are read, for a writer that
        writes them one by one (a long path's calls are never all made at once)."""
        return {
            "source": self.source,
            "leaf": self.leaf,
            "path_length": self.path_length,
            "records": list(self.records),
            "runs": _Each(self.runs, RunInfo.as_dict) if lazy else [r.as_dict() for r in self.runs],
            "calls": _Each(self.calls, CallInfo.as_dict) if lazy else [c.as_dict() for c in self.calls],
            "pending": [c.call_id for c in self.pending],
            "inbox": [q.as_dict() for q in self.inbox],
            "problems": [p.as_dict() for p in self.problems],
            "notes": [p.as_dict() for p in self.notes],
            "ok": self.ok,
        }


class _Each(Sequence[Any]):
    """``make`` of each element of ``of``, made as it is read."""

    __slots__ = ("_of", "_make")

    def __init__(self, of: Sequence[Any], make: Callable[[Any], Any]) -> None:
        self._of, self._make = of, make

    def __len__(self) -> int:
        return len(self._of)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._make(x) for x in self._of[i]]
        return self._make(self._of[i])

    def __iter__(self) -> Iterator[Any]:
        return map(self._make, self._of)


@dataclass
class RecordsCheck:
    """The record rules checked on every path of a session (what ``verify`` reports)."""

    source: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    #: Distinct runs (start entries) on any path.
    runs_checked: int = 0
    #: Distinct run ends compared with their segments.
    ends_checked: int = 0
    #: Distinct function calls.
    calls_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs_checked": self.runs_checked,
            "ends_checked": self.ends_checked,
            "calls_checked": self.calls_checked,
            "problems": [p.as_dict() for p in self.problems],
            "notes": [p.as_dict() for p in self.notes],
            "ok": self.ok,
        }


# ---------------------------------------------------------------------------
# what a verify found (format.rules)


@dataclass
class RequestReport:
    """Every response of a session checked, in file order, with what else the walk found."""

    checks: list[RequestCheck] = field(default_factory=list)
    #: Compactions whose ``first_kept`` names no entry on their path, and failed checks.
    problems: list[Problem] = field(default_factory=list)
    #: Remarks that are not failures (an omitted list named by an ``of`` the path cannot resolve).
    notes: list[Problem] = field(default_factory=list)

    @property
    def verified(self) -> int:
        return sum(1 for c in self.checks if c.status == "ok")

    @property
    def without_hash(self) -> int:
        return sum(1 for c in self.checks if c.status == "no-hash")

    @property
    def failed(self) -> int:
        return sum(1 for c in self.checks if c.failed)

    @property
    def ok(self) -> bool:
        return not self.problems

    def counts(self) -> dict[str, int]:
        return {"responses": len(self.checks), "verified": self.verified, "without_hash": self.without_hash, "failed": self.failed}


@dataclass
class VerifyReport:
    """Everything ``agentsession verify FILE`` reports, from one pass in file order."""

    source: str
    header: Header
    entries: int
    migrated: bool
    #: Every problem of severity error: line and tree (from the read), context and
    #: record, by line (on one line in that order, records by code).
    problems: list[Problem]
    #: Every note: migration, context, record, the file's format, redaction.
    notes: list[Problem]
    #: Every response's request check, in file order.
    requests: list[RequestCheck]
    runs_checked: int
    ends_checked: int
    calls_checked: int
    _checker: PathChecker = field(repr=False)
    #: The session's own ``link`` entries, for a store to check what the file cannot.
    links: list[Entry] = field(default_factory=list, repr=False)
    #: Parks again what the pass parked and a later read woke (a streamed verify's).
    _tidy: Callable[[], None] | None = field(default=None, repr=False)

    def tidy(self) -> None:
        """Park again the entries the pass had parked that reading the report woke since
        (a runs report reads the calls of the session), so a caller asking much of it
        after the pass does not hold them all (``show --runs`` of a long session)."""
        if self._tidy is not None:
            self._tidy()

    @property
    def empty(self) -> bool:
        """The file holds a header and no entries: nothing verified."""
        return self.entries == 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def of_scope(self, *scopes: Scope, notes: bool = False) -> list[Problem]:
        """The problems (or notes) of the given scopes, in report order."""
        return [p for p in (self.notes if notes else self.problems) if RULES[p.code].scope in scopes]

    def counts(self) -> dict[str, int]:
        """Responses by their request check. In a redacted file a request that does not
        rebuild is counted ``redacted``, not ``failed`` (RFC 0001: its hash is the
        original's)."""
        checks = self.requests
        failed = sum(1 for c in checks if c.failed)
        out = {
            "responses": len(checks),
            "verified": sum(1 for c in checks if c.status == "ok"),
            "without_hash": sum(1 for c in checks if c.status == "no-hash"),
            "failed": failed,
        }
        if self.header.data.get("redacted") is True:
            out["failed"], out["redacted"] = 0, failed
        return out

    def request_report(self) -> RequestReport:
        """The context part: request checks, context problems and notes."""
        return RequestReport(
            checks=list(self.requests),
            problems=self.of_scope("context"),
            notes=self.of_scope("context", notes=True),
        )

    def records_check(self) -> RecordsCheck:
        """The record part: record problems, record notes (the file's format notes last) and counts."""
        return RecordsCheck(
            source=self.source,
            problems=self.of_scope("record"),
            notes=self.of_scope("record", notes=True),
            runs_checked=self.runs_checked,
            ends_checked=self.ends_checked,
            calls_checked=self.calls_checked,
        )

    def runs_report(self, leaf: str | None, *, settle: Callable[[Entry], None] | None = None,
                    tidy: Callable[[], None] | None = None, path: Iterable[Entry] | None = None) -> RunsReport:
        """Runs and calls on the path to ``leaf``, with the record problems this report
        holds for entries on it (``show --runs``); ``settle``, ``tidy`` and ``path`` as
        :meth:`PathChecker.report`'s."""
        return self._checker.report(leaf, source=self.source, settle=settle, tidy=tidy, path=path)

    def context_at(self, leaf: str | None, *, hold_items: bool = True) -> Context:
        """The context at ``leaf`` (None: the universal root), from the checker's builder
        moved there (after :meth:`runs_report` of the same leaf it stands there already);
        ``hold_items`` as :meth:`ContextBuilder.context`'s. Raises
        :class:`~agentsession_cas.errors.ContextError` as ``build_context`` does."""
        checker = self._checker
        checker._goto(leaf)
        return checker.builder.context(hold_items=hold_items)

    def entry(self, entry_id: str) -> Entry:
        """An entry of the session read again (from the file, the store, or the entries
        held when there is neither), as the checker reads one it went back to."""
        return self._checker._load(entry_id)

    def as_dict(self) -> dict[str, Any]:
        """The object ``verify --json`` prints."""
        problems = [p.as_dict() for p in self.problems]
        records = self.records_check().as_dict()
        return {
            "source": self.source,
            "ok": self.ok,
            "entries": self.entries,
            "migrated": self.migrated,
            "requests": self.counts(),
            "responses": [c.as_dict() for c in self.requests],
            "records": records,
            "problems": problems,
            "notes": [p.as_dict() for p in self.notes],
        }
