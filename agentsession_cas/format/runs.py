"""Runs and calls: what an agent did along a path, and the record rules (RFC 0001
``run``, ``dispatch``, ``decision``, ``queued``).

A path holds two stories beside the conversation. **Runs**: each ``run``
start opens a segment that its matching end closes, and the end's
``reason`` and ``pending`` list are shapes of that segment, which this
module recomputes in the RFC's order. **Calls**: each ``function_call``
item is a call, and the decisions, dispatches and output on the path say
what happened to it: never started, in flight, held, answered, rejected or
completed (``unknown`` where no promise in the header's ``records`` covers
the call).

:class:`RecordWalker` holds the record rules along one path: pushed and
popped, it is the record half of
:class:`~agentsession_cas.format.rules.PathChecker`, which feeds it a
session in file (log) order. The rules live there, in one table
(``agentsession_cas.format.rules.RULES``); this module says what each record
rule reads on a path, and in what words.

:func:`analyze_runs` reads one path (root to a leaf) into a
:class:`RunsReport`; :func:`render_runs` turns it into the lines
``show --runs`` prints. :func:`verify_records` is the record part of
:func:`~agentsession_cas.format.rules.verify_session`, which ``verify``
calls. Every broken rule is a :class:`~agentsession_cas.errors.Problem`
naming the entry (id and line) and the rule; ``docs/runs.md`` lists the
codes. Notes are problems of severity ``note``, remarks that fail nothing.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..errors import AgentSessionError
from .entry import ENTRY_ID, Entry, Header, short_id, shown_id

__all__ = [
    "CALL_STATES",
    "RUN_REASONS",
    "CallEvent",
    "CallInfo",
    "QueuedInfo",
    "RunInfo",
    "RunsReport",
    "RecordsCheck",
    "render_runs",
    "render_records_check",
]

if TYPE_CHECKING:  # (in results.py, loaded on first use: below)
    from .results import CallEvent, CallInfo, QueuedInfo, RecordsCheck, RunInfo, RunsReport
else:
    def __getattr__(name: str) -> Any:
        """What moved to ``results.py`` (loaded only by what reports it), importable from
        here as before."""
        if name in ("CallEvent", "CallInfo", "QueuedInfo", "RecordsCheck", "RunInfo", "RunsReport"):
            from . import results

            return getattr(results, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: What the path says happened to a call, as the JSON names them.
CallState = Literal["never_started", "in_flight", "held", "answered", "rejected", "completed", "unknown"]
CALL_STATES: tuple[CallState, ...] = get_args(CallState)
#: The closed set of run end reasons.
RunReason = Literal["done", "stopped", "interrupted", "input_required", "aborted", "error"]
RUN_REASONS: tuple[RunReason, ...] = get_args(RunReason)
#: The closed set of run start sources.
RunSource = Literal["input", "resume"]
#: Reasons a writer adds where the segment cannot show them; a written one stands.
WRITTEN_REASONS = ("error", "interrupted")
VERDICTS = ("proceed", "reject", "hold", "answer")
DECIDERS = ("human", "policy", "agent")
SOURCES: tuple[RunSource, ...] = get_args(RunSource)
QUEUE_MODES = ("steer", "followup")
#: Entry types that are in context, for the "empty run" test.
_CONTEXT_TYPES = frozenset(("item", "config", "compaction", "branch_summary"))


def _state_words(state: str) -> str:
    return state.replace("_", " ")


# ---------------------------------------------------------------------------
# the walker's live state


#: An output, decision or dispatch of a call: (kind, entry id, verdict, withdraws), the
#: last a reject carrying ``withdrawn`` that directly follows a dispatch of its call. A
#: tuple of atomic values, which the collector stops tracking: a long session keeps one
#: per output on its path.
_Event = tuple[str, str, str | None, bool]
_KIND, _EVENT_ENTRY, _VERDICT, _WITHDRAWS = range(4)


def _effective(events: Sequence[_Event]) -> list[_Event]:
    """The call's events with withdrawn hand-offs (a dispatch and the reject that
    withdraws it) taken out, as RFC 0001 0.14 reads them: never made."""
    out: list[_Event] = []
    for ev in events:
        if ev[_WITHDRAWS]:
            if out and out[-1][_KIND] == "dispatch":
                out.pop()
            continue
        out.append(ev)
    return out


class _Call:
    __slots__ = ("entry", "call_id", "depth", "own", "events", "output", "below", "said")

    def __init__(self, entry: Entry, call_id: str, depth: int, own: bool, below: _Call | None = None):
        self.entry = entry
        self.call_id = call_id
        self.depth = depth
        self.own = own
        self.events: tuple[_Event, ...] = ()  # (a tuple of them, untracked too)
        self.output: Entry | None = None
        #: The call with the same call_id below this one on the path (a stack of them, linked
        #: rather than a list per call id: a long session has as many call ids as calls).
        self.below = below
        #: The call's name and arguments, taken as it is pushed by a walker collecting runs
        #: (what the report prints of it: its entry, parked behind a long walk, is not woken).
        self.said: tuple[Any, Any] | None = None


class _Run:
    __slots__ = ("start", "depth", "run_id", "calls", "call_keys", "nonempty", "out_or_decision", "takeup")

    def __init__(self, start: Entry, depth: int):
        self.start = start
        self.depth = depth
        rid = start.get("run_id")
        self.run_id = rid if isinstance(rid, str) else None
        self.calls: list[_Call] = []
        self.call_keys: set[str] = set()
        self.nonempty = False
        self.out_or_decision = False
        #: The source the segment's first output, decision or dispatch shows, and why, once seen.
        self.takeup: tuple[RunSource, str] | None = None


def _same_ids(a: Iterable[str], b: Iterable[str]) -> bool:
    return sorted(a) == sorted(b)


def _q(value: Any) -> str:
    """An untrusted value for a message: JSON-quoted, so it stays on one line."""
    return json.dumps(value, ensure_ascii=False)


_WS = re.compile(r"\s+")


def _cut(text: str, width: int) -> str:
    """Whitespace collapsed, cut to ``width`` with an ellipsis, JSON-quoted."""
    text = _WS.sub(" ", text).strip()
    if len(text) > width:
        text = text[: width - 1] + "\u2026"
    return json.dumps(text, ensure_ascii=False)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _plain(text: str, width: int) -> str:
    """Whitespace collapsed, control characters escaped, cut to ``width``: for
    text shown unquoted, such as a call's JSON arguments."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", _WS.sub(" ", text).strip())
    if len(text) > width:
        text = text[: width - 1] + "\u2026"
    return text


# The kinds of RecordWalker's undo records (compared by identity: interned strings).
# The records a call and its output leave name the call by its entry id, not by object:
# a tuple of strings and integers is one the collector stops tracking, and a long
# linear session keeps them for every call on its path.
_UNDO_POP = "pop"  # (kind, list): pop the list's last element
_UNDO_SET = "set"  # (kind, obj, attribute, old value)
_UNDO_OPEN_CALLS = "open-calls"  # (kind, n): n calls were opened
_UNDO_CALL = "call"  # (kind, call entry id, its call_id): the call was pushed
_UNDO_EVENT = "event"  # (kind, call entry id): the call's last event came
_UNDO_OUTPUT = "output"  # (kind, call entry id): the call's output came
_UNDO_TAKE = "take"  # (kind, run, call entry id): the run took the call up
# The records of a call opened and of one closed by its output: one tuple each, shared by
# every call (a long linear session keeps them for every call on its path).
_OPENED_ONE = (_UNDO_OPEN_CALLS, 1)
_CLOSED_ONE = (_UNDO_OPEN_CALLS, -1)


def output_calls(path: Sequence[Any], end: int, stop: int, rid: str) -> tuple[bool, bool]:
    """Walk back from ``path[end - 1]`` to ``path[stop]`` over the output items of the
    response ``rid`` (entries that are not items passed over, the first item naming
    another response ending the walk): whether one of them is a function call, and
    whether the walk reached ``stop`` without ending (what lies above is yet to walk)."""
    found = False
    for i in range(end - 1, stop - 1, -1):
        d = path[i].data  # (the object itself: this walks back over every response's outputs)
        if d.get("type") != "item":
            continue
        if d.get("response") != rid:
            return found, False
        item = d.get("item")
        if isinstance(item, dict) and item.get("type") == "function_call":
            found = True
    return found, True


class RecordWalker:
    """The record rules along one path at a time.

    Entries are pushed in path order and popped in reverse; every change a push
    makes to the path's state is undone by its pop, so a caller that moves along
    a tree (a depth-first walk, or :class:`~agentsession_cas.format.rules.PathChecker`
    repositioning to each entry's parent in file order) serves every branch.

    Session-wide facts are not undone by a pop: each call id's first call, every
    dispatch with the call it names and its place in file order, the prefix, and
    what was counted. They are registered once per entry, in file (or log) order,
    by :meth:`register`, and only :meth:`forget` (a rolled-back trial) takes them
    back. A broken rule is handed to ``report(entry, code, message)``; the caller
    builds the problem, so its words are the same whichever driver pushed.
    """

    def __init__(
        self,
        header: Header,
        *,
        report: Callable[[Entry, str, str], None],
        seq: dict[str, int],
        collect_runs: bool = False,
    ):
        self.header = header
        records = header.records
        self.records = tuple(records)
        self.promise_dispatch = "dispatch" in records
        self.promise_run = "run" in records
        self.report = report
        #: Each registered entry's place in file (or log) order; the caller's map.
        self.seq = seq
        self.collect_runs = collect_runs

        # session-wide, in file order
        #: The prefix above (and including) the base: entries the ``records`` promise does not cover.
        self.foreign: set[str] = set()
        #: Dispatches by the call entry their ``target`` names: (file order, dispatch id).
        self.dispatch_nodes: dict[str, list[tuple[int, str]]] = {}
        #: The first function call with each call id.
        self.first_call: dict[str, Entry] = {}
        self.calls_checked = 0
        self.starts_seen: set[str] = set()
        self.ends_seen: set[str] = set()
        #: response entry id -> its output holds a function call (a fact of its path, fixed).
        self.has_calls: dict[str, bool] = {}

        # the path
        self.path: list[Entry] = []
        self.on_path: dict[str, Entry] = {}
        #: The depth of the last response on the path at each depth (None: none above it): an
        #: int each, not the entry, so the list holds nothing the collector walks.
        self.last_resp: list[int | None] = []
        #: The length of :attr:`_undo` before each push on the path: machine integers, not
        #: an int object and a list slot each (a long linear path keeps one per entry).
        self._marks: array[int] = array("q")
        #: What each push changed, as plain tuples ``(op, ...)`` that :meth:`pop` undoes:
        #: not closures, which cost a function, its cells and a tuple each, and every
        #: entry of a long linear session keeps its records while it is on the path
        #: (the collector rescans them; appends slowed by a third).
        self._undo: list[tuple] = []
        self.calls: dict[str, _Call] = {}  # function_call entry id -> call, on the path
        #: The last call on the path with each call_id (the others below it: ``_Call.below``).
        self.by_call_id: dict[str, _Call] = {}
        self.call_order: list[_Call] = []
        self.open_calls = 0
        self.run: _Run | None = None
        self.runs: list[RunInfo] = []  # closed runs, in path order (collect_runs only)

    # -- session-wide facts ---------------------------------------------------

    def register(self, e: Entry, t: Any = None) -> None:
        """An entry arrives in file order: the call-id rules (a call_id is never empty
        and names one function call in the session, on any branch), and its place
        among the dispatches of the call it names. ``t`` is its type, when known."""
        d = e.data
        if t is None:
            t = d.get("type")
        if t == "item":
            item = d.get("item")
            if not isinstance(item, dict) or item.get("type") != "function_call":
                return
            self.calls_checked += 1
            cid = item.get("call_id")
            if not isinstance(cid, str) or not cid:
                self.report(e, "call-id-empty", "function call has no call_id: nothing could name it, not its output, "
                            "a decision or a pending list (RFC 0001 item)")
            elif cid in self.first_call:
                first = self.first_call[cid]
                where = f"at line {first.line}" if first.line is not None else shown_id(first.id)
                self.report(e, "call-id-repeated", f"call ID {_q(cid)} repeated: the function call {where} has it, "
                            "and a call_id names one call in a session, on any branch (RFC 0001 item)")
            else:
                self.first_call[cid] = e
        elif t == "dispatch":
            target = d.get("target")
            if isinstance(target, str):
                self.dispatch_nodes.setdefault(target, []).append((self.seq[e.id], e.id))

    def stack(self, call_id: str) -> list[_Call]:
        """The calls on the path with ``call_id``, the first first (a plain lookup)."""
        out: list[_Call] = []
        call = dict.get(self.by_call_id, call_id)
        while call is not None:
            out.append(call)
            call = call.below
        out.reverse()
        return out

    def forget(self, entries: Sequence[Entry], calls_checked: int) -> None:
        """Take back what :meth:`register` and the pushes of ``entries`` (the last ones
        registered, in order) added to the session-wide facts."""
        for e in reversed(entries):
            eid = e.id
            self.foreign.discard(eid)
            self.starts_seen.discard(eid)
            self.ends_seen.discard(eid)
            self.has_calls.pop(eid, None)
            d = e.data
            t = d.get("type")
            if t == "item":
                item = d.get("item")
                cid = item.get("call_id") if isinstance(item, dict) else None
                if isinstance(cid, str) and self.first_call.get(cid) is e:
                    del self.first_call[cid]
            elif t == "dispatch":
                target = d.get("target")
                nodes = self.dispatch_nodes.get(target) if isinstance(target, str) else None
                if nodes and nodes[-1][1] == eid:
                    nodes.pop()
                    if not nodes:
                        del self.dispatch_nodes[target]  # type: ignore[arg-type]  # a str: nodes were found under it
        self.calls_checked = calls_checked

    def forward_only(self) -> None:
        """The walker is pushed down one path and never popped (``show`` of a stored session
        feeds it the leaf's path alone): no push is recorded to be undone (a few tuples an
        entry, held for the whole path). A pop after this raises."""
        self._undo = _Unrecorded()

    # -- undoable changes -------------------------------------------------------

    def _set(self, obj: Any, name: str, value: Any) -> None:
        old = getattr(obj, name)
        setattr(obj, name, value)
        self._undo.append((_UNDO_SET, obj, name, old))

    def _set_run(self, run: _Run | None) -> None:
        old = self.run
        self.run = run
        self._undo.append((_UNDO_SET, self, "run", old))

    def _add_open_calls(self, n: int) -> None:
        self.open_calls += n
        self._undo.append((_UNDO_OPEN_CALLS, n))

    # -- push / pop ---------------------------------------------------------

    def push(self, e: Entry, t: Any = None) -> None:
        """Push ``e`` (of type ``t``, read from it when not given) on the path."""
        if t is None:
            t = e.data.get("type")
        self._marks.append(len(self._undo))
        path = self.path
        depth = len(path)
        path.append(e)
        self.on_path[e.id] = e
        last_resp = self.last_resp
        last_resp.append(depth if t == "response" else (last_resp[-1] if last_resp else None))

        run = self.run
        if run is not None and not run.nonempty and (t in _CONTEXT_TYPES or t == "response"):
            self._set(run, "nonempty", True)
        if t == "item":
            self._item(e, depth)
        elif t == "decision":
            self._decision(e)
        elif t == "dispatch":
            self._dispatch(e)
        elif t == "run":
            self._run_entry(e, depth)
        elif t == "response":
            self._response(e, depth)
        elif t == "queued":
            self._queued(e)

    def pop(self) -> None:
        if self._undo.__class__ is _Unrecorded:
            raise AgentSessionError("a walker pushed forward only is never popped")
        self._unwind(self._marks.pop())
        e = self.path.pop()
        del self.on_path[e.id]
        self.last_resp.pop()

    def pop_to(self, keep: int) -> None:
        """Pop the path down to its first ``keep`` entries, as many :meth:`pop` would."""
        if keep >= len(self.path):
            return
        if self._undo.__class__ is _Unrecorded:
            raise AgentSessionError("a walker pushed forward only is never popped")
        marks = self._marks
        at = keep - len(self.path) + len(marks)  # (marks are the last entries': a path set whole has none)
        self._unwind(marks[at])
        del marks[at:]
        on_path, path = self.on_path, self.path
        if on_path.__class__ is dict and len(path) - keep > keep:
            # (more to drop than to keep, as a close standing at the head drops a long
            # branch: the map made again of the entries kept, in one step)
            on_path.clear()
            on_path.update(zip(map(ENTRY_ID, path[:keep]), path[:keep]))
        else:
            for e in path[keep:]:
                del on_path[e.id]
        del path[keep:]
        del self.last_resp[keep:]

    def _unwind(self, mark: int) -> None:
        """Undo every change recorded since the undo list was ``mark`` long, last first."""
        undo = self._undo
        if len(undo) <= mark:
            return
        ops = undo[mark:]
        del undo[mark:]
        calls = self.calls
        for op in reversed(ops):
            kind = op[0]
            if kind is _UNDO_OPEN_CALLS:
                self.open_calls -= op[1]
            elif kind is _UNDO_OUTPUT:
                calls[op[1]].output = None  # (a plain lookup, never a restored map's .get: the call is on the path)
            elif kind is _UNDO_EVENT:
                call = calls[op[1]]
                call.events = call.events[:-1]
            elif kind is _UNDO_CALL:
                below = calls.pop(op[1]).below
                if below is None:
                    del self.by_call_id[op[2]]
                else:
                    self.by_call_id[op[2]] = below
                self.call_order.pop()
            elif kind is _UNDO_POP:
                op[1].pop()
            elif kind is _UNDO_SET:
                setattr(op[1], op[2], op[3])
            else:  # _UNDO_TAKE
                run, key = op[1], op[2]
                run.call_keys.discard(key)
                run.calls.pop()

    # -- entries ----------------------------------------------------------------

    def _item(self, e: Entry, depth: int) -> None:
        data = e.data
        item = data.get("item")
        if "from_link" in data:
            self._from_link(e)
        if not isinstance(item, dict):
            return
        kind = item.get("type")
        # (the undo records of _add_open_calls and _set written in place: an item is most
        # of a session's entries, and a call or an output half of them)
        if kind == "function_call":
            cid = item.get("call_id")
            eid = e.id
            cid = cid if isinstance(cid, str) else ""
            call = _Call(e, cid, depth, eid not in self.foreign, self.by_call_id.get(cid))
            if self.collect_runs:
                call.said = (item.get("name"), item.get("arguments"))
            self.calls[eid] = call
            self.by_call_id[cid] = call
            self.call_order.append(call)
            self.open_calls += 1
            self._undo += ((_UNDO_CALL, eid, call.call_id), _OPENED_ONE)
            if self.run is not None:
                self._run_takes(self.run, call)
        elif kind == "function_call_output":
            cid = item.get("call_id")
            found = self.by_call_id.get(cid) if isinstance(cid, str) else None
            if found is None:
                self.report(e, "orphan-output", f"output for call {_q(cid)} names no function call before it on the path")
            else:
                if found.output is None:
                    if self.promise_dispatch and found.own:
                        eff = _effective(found.events)
                        ran = not any(ev[_KIND] == "decision" and ev[_VERDICT] in ("reject", "answer") for ev in eff)
                        if ran and not any(ev[_KIND] == "dispatch" for ev in eff):
                            self.report(
                                e,
                                "dispatch-missing",
                                f"call {_q(found.call_id)} has an output and no dispatch, though the header's records "
                                "promise dispatch: a promised dispatch is written before the tool runs (RFC 0001 dispatch)",
                            )
                    found.output = e
                    self.open_calls -= 1
                    self._undo += ((_UNDO_OUTPUT, found.entry.id), _CLOSED_ONE)
                self._event(found, ("output", e.id, None, False))
            if self.run is not None:
                self._segment_event(e, found)

    def _resolve_target(self, e: Entry) -> _Call | None:
        """The call a decision or dispatch names by ``target``; a ``target`` naming no
        call before it on the path is reported, and read as the latest call with its
        ``call_id``, as RFC 0001 lets a reader."""
        target = e.get("target")
        cid = e.get("call_id")
        if not isinstance(cid, str) or not cid:
            self.report(e, "record-malformed", f"{e.type} has no call_id, which RFC 0001 requires")
        call = self.calls.get(target) if isinstance(target, str) else None
        if call is None:
            self.report(
                e,
                "bad-target",
                f"target {_q(target)} names no function call before it on the path: a {e.type}'s target is the "
                "item entry holding its call (RFC 0001 dispatch, decision)",
            )
            return self.by_call_id.get(cid) if isinstance(cid, str) else None
        if isinstance(cid, str) and cid and call.call_id != cid:
            self.report(
                e,
                "bad-target",
                f"target names call {_q(call.call_id)} but call_id is {_q(cid)}: the call_id must be the target call's "
                "(RFC 0001 dispatch, decision)",
            )
        return call

    def _decision(self, e: Entry) -> None:
        verdict = e.get("verdict")
        if verdict not in VERDICTS:
            self.report(e, "record-malformed", f"verdict {_q(verdict)} is not one of {', '.join(VERDICTS)}")
            verdict = None
        by = e.get("by")
        if by is not None and by not in DECIDERS:
            self.report(e, "record-malformed", f"by {_q(by)} is not one of {', '.join(DECIDERS)}")
        if verdict == "reject" and not isinstance(e.get("reason"), str):
            self.report(e, "record-malformed", "a reject carries no reason, which RFC 0001 requires (it is the output the model saw)")
        call = self._resolve_target(e)
        if call is None:
            self._segment_event(e, None)
            return
        cid = _q(call.call_id)
        eff = _effective(call.events)
        rejected = any(ev[_KIND] == "decision" and ev[_VERDICT] == "reject" for ev in eff)
        answered = any(ev[_KIND] == "decision" and ev[_VERDICT] == "answer" for ev in eff)
        withdraws = (
            verdict == "reject"
            and e.get("withdrawn") is True
            and bool(call.events)
            and call.events[-1][_KIND] == "dispatch"
        )
        if rejected:
            self.report(e, "decision-after-reject", f"decision on call {cid} after its reject: no decision follows a reject (RFC 0001 decision)")
        elif answered:
            self.report(e, "decision-after-answer", f"decision on call {cid} after its answer: no decision follows an answer (RFC 0001 decision)")
        elif verdict in ("reject", "answer") and call.output is not None:
            self.report(
                e,
                "decision-after-output",
                f"{verdict} for call {cid} after its output at line {call.output.line}: the output ends the call (RFC 0001 decision)",
            )
        elif verdict == "reject" and not withdraws and any(ev[_KIND] == "dispatch" for ev in eff):
            self.report(
                e,
                "reject-after-dispatch",
                f"reject for call {cid}, which was dispatched: a call that may have run is ended by answer, never reject (RFC 0001 decision)",
            )
        elif (
            verdict == "answer"
            and self.promise_dispatch
            and call.own
            and not any(ev[_KIND] == "dispatch" for ev in eff)
            and not self._dispatched_elsewhere(call)
        ):
            self.report(
                e,
                "answer-not-dispatched",
                f"answer for call {cid}, which has no dispatch though the header's records promise dispatch: the record "
                "says it never started, and a call ended without running is rejected (RFC 0001 decision)",
            )
        self._event(call, ("decision", e.id, verdict, withdraws))
        self._segment_event(e, call)

    def _dispatch(self, e: Entry) -> None:
        key = e.get("idempotency_key")
        if key is not None and not isinstance(key, str):
            self.report(e, "record-malformed", "idempotency_key is not a string")
        call = self._resolve_target(e)
        if call is None:
            self._segment_event(e, None)
            return
        cid = _q(call.call_id)
        eff = _effective(call.events)
        if any(ev[_KIND] == "decision" and ev[_VERDICT] == "reject" for ev in eff):
            self.report(e, "dispatch-after-reject", f"dispatch for call {cid} after its reject: no dispatch follows a reject (RFC 0001 decision)")
        elif any(ev[_KIND] == "decision" and ev[_VERDICT] == "answer" for ev in eff):
            self.report(e, "dispatch-after-answer", f"dispatch for call {cid} after its answer: no dispatch follows an answer (RFC 0001 decision)")
        elif call.output is not None:
            self.report(
                e,
                "dispatch-after-output",
                f"dispatch for call {cid} after its output at line {call.output.line}: the output ends the call, and running "
                "the tool again is a new call (RFC 0001 dispatch)",
            )
        self._event(call, ("dispatch", e.id, None, False))
        self._segment_event(e, call)

    def _event(self, call: _Call, ev: _Event) -> None:
        call.events += (ev,)
        self._undo.append((_UNDO_EVENT, call.entry.id))

    def _dispatched_elsewhere(self, call: _Call) -> bool:
        """A dispatch naming the call was written before the tip of the path, in file
        (log) order, and is not on the path. RFC 0001 0.10 lets one stand for a
        dispatch on the path, for the answer rule and against the call having never
        started. One written later cannot: the record said, when the tip was written,
        that the call never started, and a verdict must not depend on whether the
        entries are checked as they arrive or the whole file at once."""
        nodes = self.dispatch_nodes.get(call.entry.id)
        if not nodes or not self.path:
            return False
        now = self.seq.get(self.path[-1].id, -1)
        on = self.on_path
        return any(at < now and d not in on for at, d in nodes)

    def _from_link(self, e: Entry) -> None:
        target = e.get("from_link")
        link = self.on_path.get(target) if isinstance(target, str) else None
        if link is None or link.type != "link" or link.get("rel") != "peer" or "cancel" in link.data:
            self.report(
                e,
                "bad-from-link",
                f"from_link {_q(target)} names no peer link before the item on its path (RFC 0001 0.14 link)",
            )

    def _queued(self, e: Entry) -> None:
        if not isinstance(e.get("item"), dict):
            self.report(e, "record-malformed", "queued entry has no item, which RFC 0001 requires")
        if e.get("mode") not in QUEUE_MODES:
            self.report(e, "record-malformed", f"mode {_q(e.get('mode'))} is not one of {', '.join(QUEUE_MODES)}")

    def _response(self, e: Entry, depth: int) -> None:
        """Whether this response's output holds a function call, found as RFC 0001
        "Request context of a response" finds output items: walking back over the
        path, skipping entries that are not items, while items name this response."""
        if e.id in self.has_calls:
            return  # a fact of the entry's path, found when it was first pushed
        rid = e.data.get("response_id")
        self.has_calls[e.id] = isinstance(rid, str) and output_calls(self.path, depth, 0, rid)[0]

    # -- runs -------------------------------------------------------------------

    def _run_takes(self, run: _Run, call: _Call) -> None:
        key = call.entry.id
        if key in run.call_keys:
            return
        run.call_keys.add(key)
        run.calls.append(call)
        self._undo.append((_UNDO_TAKE, run, key))

    def _segment_event(self, e: Entry, call: _Call | None) -> None:
        """An output, decision or dispatch inside a run: the run takes its call up,
        and the first one decides the run's source."""
        run = self.run
        if run is None:
            return
        if call is not None:
            self._run_takes(run, call)
        if e.type != "dispatch" and not run.out_or_decision:
            self._set(run, "out_or_decision", True)
        if run.takeup is None:
            # Judged now: "no output when the run began" is about the path before this entry.
            takeup: tuple[RunSource, str]
            if call is not None and call.depth < run.depth and (call.output is None or call.output is e):
                takeup = ("resume", f"its first output, decision or dispatch (line {e.line}) takes up call "
                          f"{_q(call.call_id)}, left without an output before the run")
            else:
                takeup = ("input", f"its first output, decision or dispatch (line {e.line}) takes up no call "
                          "left without an output before the run")
            self._set(run, "takeup", takeup)
            self._check_source(run)

    def _computed_source(self, run: _Run) -> tuple[RunSource, str]:
        """The source the segment shows, and why."""
        if run.takeup is None:
            return "input", "the segment takes up no call"
        return run.takeup

    def _check_source(self, run: _Run) -> None:
        """Judge a run's written source: when its segment takes a call up, and when the
        segment closes (an end, or the next run's start). A run open at the tip that
        has taken nothing up is not judged: a resume may add a message before it
        takes its call up (RFC 0001 run source), see :meth:`open_unjudged`."""
        start = run.start
        written = start.get("source")
        if written not in SOURCES:
            return  # reported as malformed at the start
        computed, why = self._computed_source(run)
        if written == computed:
            return
        if written == "resume" and not run.nonempty and run.takeup is None:
            return  # an empty run written resume is accepted as written (0.11, 0.14)
        self.report(
            start,
            "run-source",
            f"run {_q(run.run_id)} starts {written} but its segment reads {computed}: {why} (RFC 0001 run source)",
        )

    def open_unjudged(self) -> _Run | None:
        """The run open at the tip when its written source cannot be judged yet but would
        not stand were the run to end here: written ``resume``, nothing taken up, and
        something added (an empty resume stands as written)."""
        run = self.run
        if run is None or run.takeup is not None or not run.nonempty or run.start.get("source") != "resume":
            return None
        return run

    def _run_entry(self, e: Entry, depth: int) -> None:
        phase = e.get("phase")
        rid = e.get("run_id")
        if not isinstance(rid, str) or not rid:
            self.report(e, "record-malformed", "run entry has no run_id, which RFC 0001 requires")
        if phase == "start":
            if e.get("source") not in SOURCES:
                self.report(e, "record-malformed", f"run start source {_q(e.get('source'))} is not input or resume")
            if self.run is not None:
                open_run = self.run
                if self.promise_run:
                    self.report(
                        e,
                        "run-not-ended",
                        f"run {_q(rid)} starts while run {_q(open_run.run_id)} (line {open_run.start.line}) has no end on "
                        "the path; the header records runs, and the writer that continues a path closes the run open on it",
                    )
                self._close(open_run, None, "start")
            run = _Run(e, depth)
            self.starts_seen.add(e.id)
            self._set_run(run)
        elif phase == "end":
            reason = e.get("reason")
            if reason not in RUN_REASONS:
                self.report(e, "record-malformed", f"run end reason {_q(reason)} is not one of {', '.join(RUN_REASONS)}")
            pending = e.get("pending")
            if not isinstance(pending, list) or not all(isinstance(p, str) for p in pending):
                self.report(e, "record-malformed", "run end has no pending list of call ids, which RFC 0001 requires")
            current = self.run
            if current is not None and current.run_id is not None and current.run_id == rid:
                self._close(current, e, "end")
                self._set_run(None)
            else:
                self.report(
                    e,
                    "run-end-unmatched",
                    f"run end for {_q(rid)} closes no run open on the path"
                    + (f" (run {_q(current.run_id)} is open)" if current is not None else ""),
                )
        else:
            self.report(e, "record-malformed", f"run phase {_q(phase)} is neither start nor end")

    def reason(self, run: _Run, end_depth: int) -> tuple[RunReason, str, list[_Call], dict[str, CallState]]:
        """The RFC 0001 cascade over the run's segment (start..end_depth) and the path:
        the reason, why, the pending calls and every call's state."""
        at = self.last_resp[end_depth]
        path_last = self.path[at] if at is not None else None
        seg_last = path_last if at is not None and at > run.depth else None
        states = {c.entry.id: self.state(c) for c in run.calls}
        pending = [c for c in run.calls if c.output is None]
        if seg_last is not None and seg_last.get("error") is not None:
            return "error", "the segment's last response carries an error", pending, states
        held = [c for c in pending if states[c.entry.id] == "held"]
        flying = [c for c in pending if states[c.entry.id] == "in_flight"]
        if held and not flying:
            return "input_required", f"call {_q(held[0].call_id)} is held and no pending call is in flight", pending, states
        if pending:
            c = flying[0] if flying else pending[0]
            return "aborted", f"call {_q(c.call_id)} is pending, {_state_words(states[c.entry.id])}", pending, states
        if seg_last is not None and seg_last.get("incomplete") is not None:
            return "aborted", "the segment's last response is incomplete", pending, states
        if seg_last is not None and not self.has_calls.get(seg_last.id, False):
            return "done", "the segment's last response made no call", pending, states
        last_made_calls = path_last is not None and self.has_calls.get(path_last.id, False)
        if last_made_calls and self.open_calls == 0 and run.out_or_decision:
            return "stopped", "the last response made calls, every call has its output, and no model call followed", pending, states
        # step 6: anything left
        if seg_last is None and not run.out_or_decision:
            why = "the run neither called the model nor finished a call"
        elif self.open_calls:
            why = "a call on the path, left by an earlier run, is still without an output"
        else:
            why = "the last response on the path made no call and the segment has no response of its own"
        return "aborted", why, pending, states

    def _close(self, run: _Run, end: Entry | None, closed_by: Literal["end", "start", "leaf"]) -> None:
        """A run's segment closes: check its source and (with an end) its end, and
        keep it for the report. At the leaf (a report) the source is judged only
        when the run has taken a call up."""
        if closed_by != "leaf":
            self._check_source(run)
        if end is None and not self.collect_runs:
            return
        end_depth = len(self.path) - 1
        if closed_by == "start":
            end_depth = len(self.path) - 2  # the segment stops before the next start
        reason, why, pending, states = self.reason(run, end_depth)
        pending_ids = tuple(c.call_id for c in pending)
        if end is not None:
            self.ends_seen.add(end.id)
            written = end.get("reason")
            if written in RUN_REASONS and written not in WRITTEN_REASONS and written != reason:
                self.report(
                    end,
                    "run-reason",
                    f"run {_q(run.run_id)} ends {written} but its segment reads {reason}: {why} "
                    "(RFC 0001 run: the segment is authoritative)",
                )
            listed = end.get("pending")
            if isinstance(listed, list) and all(isinstance(p, str) for p in listed) and not _same_ids(listed, pending_ids):
                self.report(
                    end,
                    "run-pending",
                    f"run {_q(run.run_id)} lists pending {_q(sorted(listed))} but its segment leaves "
                    f"{_q(sorted(pending_ids))} without an output (RFC 0001 run: the segment is authoritative)",
                )
        if not self.collect_runs:
            return
        from .results import RunInfo  # (loaded where a report is made: not by an append)

        start = run.start
        listed = end.get("pending") if end is not None else None
        src, _ = self._computed_source(run)
        info = RunInfo(
            run_id=run.run_id,
            start=start.id,
            start_line=start.line,
            end=end.id if end is not None else None,
            end_line=end.line if end is not None else None,
            closed_by=closed_by,
            source=start.get("source") if isinstance(start.get("source"), str) else None,
            computed_source=src,
            ref=start.get("ref") if isinstance(start.get("ref"), str) else None,
            trigger=start.get("trigger"),
            recorded_reason=end.get("reason") if end is not None and isinstance(end.get("reason"), str) else None,
            recorded_pending=tuple(listed) if isinstance(listed, list) and all(isinstance(p, str) for p in listed) else None,
            end_ref=end.get("ref") if end is not None and isinstance(end.get("ref"), str) else None,
            computed_reason=reason,
            computed_why=why,
            pending=pending_ids,
            calls=tuple(self.info(c, states[c.entry.id]) for c in run.calls),
            empty=not run.nonempty and run.takeup is None,
            source_judged=closed_by != "leaf" or run.takeup is not None,
        )
        runs = self.runs
        runs.append(info)
        self._undo.append((_UNDO_POP, runs))

    # -- calls ------------------------------------------------------------------

    def state(self, call: _Call) -> CallState:
        """What the path says happened to the call (RFC 0001 dispatch, decision), at the tip."""
        if call.output is not None:
            return "completed"
        last_dispatch = -1
        latest_hold = -1
        for i, (kind, _, verdict, _) in enumerate(_effective(call.events)):
            if kind == "dispatch":
                last_dispatch = i
            elif kind == "decision":
                if verdict == "reject":
                    return "rejected"
                if verdict == "answer":
                    return "answered"
                if verdict == "hold":
                    latest_hold = i
                elif verdict == "proceed":
                    latest_hold = -1
        if latest_hold > last_dispatch:
            return "held"
        if last_dispatch >= 0:
            return "in_flight"
        if call.own and self.promise_dispatch and not self._dispatched_elsewhere(call):
            return "never_started"
        return "unknown"

    def info(self, call: _Call, state: CallState | None = None) -> CallInfo:
        from .results import CallEvent, CallInfo  # (loaded where a report is made: not by an append)

        said = call.said
        if said is None:
            item = call.entry.get("item")
            said = (item.get("name"), item.get("arguments")) if isinstance(item, dict) else (None, None)
        name, args = said
        withdrawn: set[int] = set()
        for i, ev in enumerate(call.events):
            if ev[_WITHDRAWS] and i > 0 and call.events[i - 1][_KIND] == "dispatch":
                withdrawn.update((i - 1, i))
        events = []
        for i, (kind, eid, verdict, _) in enumerate(call.events):
            d = self.on_path.get(eid)  # (an event's entry is on the path while the event stands)
            assert d is not None
            # (an output's members are not read: its entry, parked by a long walk, stays so)
            decision, dispatch = kind == "decision", kind == "dispatch"
            by, reason = (d.get("by"), d.get("reason")) if decision else (None, None)
            key = d.get("idempotency_key") if dispatch else None
            events.append(
                CallEvent(
                    kind=kind,
                    entry=d.id,
                    line=d.line,
                    verdict=verdict,
                    by=by if isinstance(by, str) else None,
                    reason=reason if isinstance(reason, str) else None,
                    args_rewritten=decision and verdict != "answer" and d.get("args") is not None,
                    idempotency_key=key if isinstance(key, str) else None,
                    withdrawn=i in withdrawn,
                )
            )
        return CallInfo(
            call_id=call.call_id,
            name=name if isinstance(name, str) else None,
            arguments=args if isinstance(args, str) else None,
            entry=call.entry.id,
            line=call.entry.line,
            state=state if state is not None else self.state(call),
            own=call.own,
            events=tuple(events),
            output=call.output.id if call.output is not None else None,
            dispatched_elsewhere=self._dispatched_elsewhere(call),
        )


class _Unrecorded(list[tuple]):
    """The undo list of a walker pushed forward only (:meth:`RecordWalker.forward_only`):
    what is appended to it is dropped."""

    def append(self, _: tuple) -> None:
        pass

    def __iadd__(self, _: Iterable[tuple]) -> _Unrecorded:  # type: ignore[override,misc]
        return self


def open_source_message(run_id: str | None) -> str:
    """The words of the ``run-source-open`` note, the same at every leaf that finds it."""
    return (
        f"run {_q(run_id)} starts resume and is open here with no call taken up: its source is judged when "
        "the run takes a call up or ends, and a message before the take-up is allowed (RFC 0001 run source)"
    )


# ---------------------------------------------------------------------------
# session-wide notes


def format_notes(header: Header, codes: Iterable[str]) -> list[tuple[str, str]]:
    """Remarks on which rules a file declares, when record rules are broken
    (``codes``: those broken): (code, message) pairs, for the file as a whole."""
    codes = set(codes)
    if not codes:
        return []
    out: list[tuple[str, str]] = []
    version = header.format_version
    minor = version[1] if version is not None and version[0] == 0 else None
    if minor == 9:
        out.append(("early-0.9", "draft 0.9 gained these rules after its first writers were released, so a 0.9 "
                    "file breaking them may come from such a writer rather than be corrupt"))
    elif minor is not None and minor < 9:
        out.append(("before-0.9", f"this file declares {header.format}, before 0.9 added the reject, target, "
                    "call_id and dispatch-after-output rules and counted calls an earlier run left among a run's; "
                    "it may have been written under the rules of its own minor"))
    if "run-source" in codes:
        out.append(("source-rule", "no earlier release checked a run's source as it is written, so a writer "
                    "that chose its own may disagree with the segment without the file being corrupt"))
    if "run-reason" in codes and minor is not None and minor < 9:
        out.append(("end-rule", "a run's end reads differently before 0.8 (a call held after its dispatch) "
                    "and before 0.9 (calls an earlier run left), so an end written under those minors may disagree"))
    return out


def inbox_of(path: Iterable[Entry]) -> list[QueuedInfo]:
    """Queued inputs with no item naming them in ``queued_from`` and no run end after them."""
    inbox = Inbox()
    for e in path:
        inbox.feed(e)
    return inbox.queued()


class Inbox:
    """:func:`inbox_of`, fed the path one entry at a time, root first (a walk that reads
    each entry once, as it pushes it, and parks it behind: ``show --runs``)."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: dict[str, Entry] = {}

    def feed(self, e: Entry) -> None:
        waiting = self.waiting
        if e.type == "queued":
            waiting[e.id] = e
        elif e.type == "item" and isinstance(e.get("queued_from"), str):
            waiting.pop(e.get("queued_from"), None)
        elif e.type == "run" and e.get("phase") == "end":
            waiting.clear()

    def queued(self) -> list[QueuedInfo]:
        from .results import QueuedInfo  # (loaded where a report is made: not by an append)

        return [
            QueuedInfo(
                entry=e.id,
                line=e.line,
                mode=e.get("mode") if isinstance(e.get("mode"), str) else None,
                item=e.get("item"),
                trigger=e.get("trigger"),
                ref=e.get("ref") if isinstance(e.get("ref"), str) else None,
            )
            for e in self.waiting.values()
        ]


# ---------------------------------------------------------------------------
# text for people


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(len(r) for r in rows))]
    out = []
    for r in rows:
        cells = [c.ljust(widths[i]) if i < len(r) - 1 else c for i, c in enumerate(r)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


_NAME = re.compile(r"[A-Za-z0-9_.:/@+-]+")


def _name(value: str | None) -> str:
    """An identifier from the file (a run or call id, a tool name): as is when it is
    plain, JSON-quoted otherwise, so it can neither break a line nor hide."""
    if value is None:
        return "-"
    return value if _NAME.fullmatch(value) else _q(value)


def _call_label(c: CallInfo) -> str:
    name = _name(c.name) if c.name is not None else "?"
    return f"{name}({_plain(c.arguments, 40)})" if c.arguments else f"{name}()"


def _history(c: CallInfo) -> str:
    parts = []
    for ev in c.events:
        if ev.kind == "decision":
            s = ev.verdict or "decision"
            if ev.by:
                s += f" by {ev.by}"
            if ev.reason:
                s += f" {_cut(ev.reason, 40)}"
            if ev.args_rewritten:
                s += " (args rewritten)"
        elif ev.kind == "dispatch":
            s = "dispatched"
            if ev.idempotency_key:
                s += f" key {_q(ev.idempotency_key)}"
        else:
            s = f"output (line {ev.line})"
        if ev.withdrawn:
            s += " [withdrawn]"
        parts.append(s)
    if c.dispatched_elsewhere and not c.dispatches:
        parts.append("dispatched off the path")
    return ", ".join(parts) if parts else "-"


def _call_rows(calls: Iterable[CallInfo]) -> list[list[str]]:
    return [[_name(c.call_id), _call_label(c), _state_words(c.state), _history(c)] for c in calls]


def _ids(ids: Iterable[str]) -> str:
    ids = list(ids)
    return ", ".join(_name(i) for i in ids) if ids else "none"


def _trigger(trigger: Any) -> str:
    if not isinstance(trigger, dict):
        return ""
    s = " ".join(_name(trigger[k]) for k in ("kind", "ref") if isinstance(trigger.get(k), str))
    if isinstance(trigger.get("source"), str):
        s += f" via {_name(trigger['source'])}"
    return s


def render_runs(report: RunsReport) -> list[str]:
    """The text ``show --runs`` prints: each run with its source and end, whether the
    segment agrees, and its calls with their states at the run's end; calls outside
    any run; the calls pending at the leaf; the inbox; problems and notes."""
    leaf = short_id(report.leaf)
    out = [
        f"runs on the path to {leaf}: {len(report.runs)} run(s), {len(report.calls)} call(s), "
        f"{len(report.pending)} pending"
    ]
    in_runs: set[str] = set()
    for r in report.runs:
        out.append("")
        head = f"run {_name(r.run_id)}  {_name(r.source)}"
        if r.ref is not None:
            head += f" ref {_q(r.ref)}"
        trig = _trigger(r.trigger)
        if trig:
            head += f" from {trig}"
        lines = f"lines {r.start_line}-{r.end_line}" if r.end_line is not None else f"from line {r.start_line}"
        out.append(f"{head}  ({lines})")
        if not r.source_agrees:
            out.append(f"  source {_name(r.source)}, but the segment reads {r.computed_source}  MISMATCH")
        if r.end is not None:
            end = f"  ended {_name(r.recorded_reason)}, pending {_ids(r.recorded_pending or ())}"
            if r.end_ref is not None:
                end += f", ref {_q(r.end_ref)}"
            if r.agrees:
                if r.recorded_reason in WRITTEN_REASONS and r.recorded_reason != r.computed_reason:
                    end += f"; written, standing over a segment that reads {r.computed_reason}"
                else:
                    end += "; the segment agrees"
            else:
                end += f"; the segment reads {r.computed_reason}, pending {_ids(r.pending)} ({r.computed_why})  MISMATCH"
            out.append(end)
        elif r.closed_by == "start":
            out.append(
                f"  no end: the next run starts; the segment reads {r.computed_reason}, pending {_ids(r.pending)}"
            )
        else:
            cut = "cut off (the header records runs)" if "run" in report.records else "open"
            out.append(
                f"  no end on the path: {cut}; the segment so far reads {r.computed_reason}, pending {_ids(r.pending)}"
            )
        if r.calls:
            out.extend(_table(_call_rows(r.calls), "    "))
        in_runs.update(c.entry for c in r.calls)
    outside = [c for c in report.calls if c.entry not in in_runs]
    if outside:
        out.append("")
        out.append("outside any run")
        out.extend(_table(_call_rows(outside), "    "))
    pending = report.pending
    if pending:
        out.append("")
        out.append(f"pending at {leaf}: {len(pending)} call(s)")
        rows = []
        for c in pending:
            note = f"key {_q(c.idempotency_key)}" if c.idempotency_key else ("dispatched off the path" if c.dispatched_elsewhere else "")
            rows.append([_name(c.call_id), _name(c.name) if c.name is not None else "?", _state_words(c.state), note])
        out.extend(_table(rows))
    if report.inbox:
        out.append("")
        out.append(f"inbox at {leaf}: {len(report.inbox)} queued input(s)")
        rows = []
        for q in report.inbox:
            text = _queued_text(q.item)
            extra = _trigger(q.trigger)
            rows.append([short_id(q.entry), _name(q.mode), text + (f" from {extra}" if extra else "") + (f" ref {_q(q.ref)}" if q.ref else "")])
        out.extend(_table(rows))
    if report.problems or report.notes:
        out.append("")
    for p in report.problems:
        out.append(f"problem: {p}")
    for p in report.notes:
        out.append(f"note: {p}")
    return out


def _queued_text(item: Any) -> str:
    if not isinstance(item, dict):
        return "-"
    content = item.get("content")
    if isinstance(content, str):
        return f"{item.get('role', '?')}: {_cut(content, 48)}"
    if isinstance(content, list):
        texts = [t for p in content if isinstance(p, dict) and isinstance(t := p.get("text"), str)]
        if texts:
            return f"{item.get('role', '?')}: {_cut(' '.join(texts), 48)}"
    return str(item.get("type", "-"))


def render_records_check(check: RecordsCheck) -> list[str]:
    """The lines ``verify`` prints for the record rules: one per broken rule
    (``records  ERROR line N: <type> <short id>: <rule>``), then the notes."""
    out = [f"records  ERROR {p}" for p in check.problems]
    out.extend(f"note: {p}" for p in check.notes)
    return out
