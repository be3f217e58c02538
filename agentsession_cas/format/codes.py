"""The rule table: every code a reader or a store reports, as data (RFC 0001, RFC 0002, RFC 0003 "Errors").

A rule broken is a :class:`~agentsession_cas.errors.Problem` whose ``code`` is
a row of :data:`RULES`; the row says how heavy it is, where it is found, and
what a store does with an entry that brings it. :func:`problem` is the one way
a problem is made, and it refuses a code the table does not hold. The
functions that apply the rows are in :mod:`agentsession_cas.format.rules`;
the table sits below every module of the format core, so each can report.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from ..errors import AgentSessionError, Problem, Severity
from ..lean import dataclass
from .entry import SYNTHETIC_RULE

__all__ = ["RULES", "STORE_ONLY", "ErrorCode", "Rule", "Scope", "StorePolicy", "problem", "rule_of"]

#: Where a rule is found: one line alone, where it hangs, what a path says, what the
#: session's links say of the sessions they name, the sidecar media its items name (beside
#: a file, or in a store), or what only a store can see (another session's header: checked by ``verify ID`` and
#: ``fsck --deep``, noted as unchecked by ``verify FILE``).
Scope = Literal["line", "tree", "record", "context", "link", "media", "store"]
#: What a store does with an entry that brings the rule: refuse it, store it and
#: report it, or only remark on it. ``keep`` is a header's: a header a store makes
#: (create, fork, continue, the recorder) is refused, one a session already has (an
#: import, a push, a fetch) is kept byte for byte and reported as a warning.
StorePolicy = Literal["refuse", "finding", "keep", "note"]
#: The RFC 0003 error a store's refusal carries.
ErrorCode = Literal["bad_entry", "base_rule", "call_id_repeated", "no_entry", "format"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of :data:`RULES`."""

    code: str
    severity: Severity
    scope: Scope
    store: StorePolicy
    #: The RFC 0003 error code of a store's refusal (None: a store never refuses for it).
    error: ErrorCode | None
    summary: str
    section: str


def _rules(*rows: Rule) -> Mapping[str, Rule]:
    table = {r.code: r for r in rows}
    assert len(table) == len(rows), "a code is listed twice"
    for r in rows:
        assert (r.store == "refuse") == (r.error is not None), r.code
        assert r.severity == "error" or r.store == "note", r.code
    return MappingProxyType(table)


def _line(code: str, summary: str, section: str, error: ErrorCode = "bad_entry") -> Rule:
    return Rule(code, "error", "line", "refuse", error, summary, section)


def _record(code: str, summary: str, section: str, error: ErrorCode = "bad_entry") -> Rule:
    return Rule(code, "error", "record", "refuse", error, summary, section)


def _note(code: str, scope: Scope, summary: str, section: str) -> Rule:
    return Rule(code, "note", scope, "note", None, summary, section)


#: Every code the format core reports, by code.
RULES: Mapping[str, Rule] = _rules(
    # -- one line ------------------------------------------------------------------
    _line("header", "the first line is a header: an object of type session with an id, created_at and payload", "RFC 0001 Header"),
    _line("format", "the header's format is agentsession/<major>.<minor>, of a version this reader reads", "RFC 0001 Versioning", "format"),
    Rule("header-member", "error", "line", "keep", None,
         "the header's members are of their RFC 0001 forms: created_at an RFC 3339 date-time, parent_session and "
         "spawned_by non-empty strings, cwd a non-empty string, records a list of entry types, harness an object "
         "whose name and version are strings", "RFC 0001 Header"),
    _note("empty", "line", "a file may hold a header and no entries: a session just created (RFC 0002 imports it "
          "with no head)", "RFC 0001 Terminology, RFC 0002 Projection to JSONL"),
    _line("json", "every line is one JSON object (UTF-8)", "RFC 0001 File"),
    _line("truncated", "the last line parses (a reader tolerates and reports one cut short)", "RFC 0001 File"),
    _line("ijson", "every hashed member is I-JSON", "RFC 0001 Entry hash"),
    _line("entry", "an entry has a string type, a ts and envelope members of the right types; only line 1 is a header", "RFC 0001 Entry envelope"),
    _line("type", "a type is a core type or namespaced (ns:type)", "RFC 0001 Core entry types, Namespaced types"),
    _line("reserved", "a body carries no member by a name the envelope reserves", "RFC 0001 Entry hash"),
    _line("id", "an entry's id is sha256: followed by 64 lowercase hex digits", "RFC 0001 Entry hash"),
    _line("hash", "an entry's id is the hash of its envelope over the hash of its body", "RFC 0001 Entry hash"),
    _line("ts", "ts is in the one admitted spelling", "RFC 0001 Entry envelope"),
    _line(
        "missing-member",
        "a core entry carries what its type requires: an item its item, an outcome its target, a label its target "
        "and label, a link its rel",
        "RFC 0001 item, outcome, label, link",
    ),
    _line("normalised", "an entry's normalised member is an array of {at, was or raw} records sorted by at", "RFC 0001 Entry hash"),
    _note("unresolved", "line", "a reference a file before 0.5 holds that migration could not rewrite", "RFC 0001 Versioning"),
    _note("redacted", "line", "the header says the file was redacted: its hashes verify it, never the original", "RFC 0001 Header"),
    # -- where an entry hangs --------------------------------------------------------
    Rule("duplicate", "error", "tree", "note", None, "an id appears once in a file; a repeat is read as the first (a store's re-append is a no-op)", "RFC 0001 Entry hash"),
    Rule("parent", "error", "tree", "refuse", "no_entry", "an entry has a parent, held before it, or null for a root", "RFC 0001 Entry envelope, RFC 0002 Entries"),
    Rule("parents", "error", "tree", "refuse", "bad_entry", "parents is an array of references naming earlier entries, not the parent, none twice; an empty or null one is refused (a writer omits it: the id hashes it as absent and a store keeps no such member, so a round trip would drop it)", "RFC 0001 Convergence, Entry hash"),
    Rule("base", "error", "tree", "refuse", "base_rule", "a file opens with the path to its base, and own entries hang from the base or each other", "RFC 0001 File, RFC 0002 Sessions"),
    # -- what a path records -----------------------------------------------------------
    _record("call-id-empty", "a function call's call_id is never empty", "RFC 0001 item"),
    _record("call-id-repeated", "a call_id names one function call in the session, on any branch", "RFC 0001 item", "call_id_repeated"),
    _record("bad-target", "a decision's or dispatch's target is a function call before it on the path, and its call_id that call's", "RFC 0001 dispatch, decision"),
    _record("dispatch-after-reject", "no dispatch follows a reject", "RFC 0001 decision"),
    _record("dispatch-after-answer", "no dispatch follows an answer", "RFC 0001 decision"),
    _record("dispatch-after-output", "no dispatch follows the call's output", "RFC 0001 dispatch"),
    _record("decision-after-reject", "no decision follows a reject", "RFC 0001 decision"),
    _record("decision-after-answer", "no decision follows an answer", "RFC 0001 decision"),
    _record("decision-after-output", "no reject or answer follows the call's output", "RFC 0001 decision"),
    _record("reject-after-dispatch", "a call that may have run is ended by answer, never reject", "RFC 0001 decision"),
    _record("answer-not-dispatched", "under a dispatch promise, an answer ends only a call dispatched before it", "RFC 0001 decision"),
    _record("dispatch-missing", "under a dispatch promise, a call that ran has a dispatch before its output", "RFC 0001 dispatch"),
    _record("run-reason", "a run end's reason is the one its segment reads (error and interrupted stand as written)", "RFC 0001 run"),
    _record("run-pending", "a run end lists the calls its segment leaves pending", "RFC 0001 run"),
    _record("run-source", "a run start's source is the shape of its segment", "RFC 0001 run"),
    _record("bad-from-link", "an item's from_link names a peer link before it on its path", "RFC 0001 0.14 link"),
    _record("record-malformed", "a run, dispatch, decision or queued entry carries its required members and closed values", "RFC 0001 run, dispatch, decision, queued"),
    _note("orphan-output", "record", "an output names no function call before it on the path", "RFC 0001 item"),
    _note("run-not-ended", "record", "under a run promise, a run starts while another is open on the path", "RFC 0001 run"),
    _note("run-end-unmatched", "record", "a run end closes no run open on the path", "RFC 0001 run"),
    _note("run-source-open", "record", "a resume run open at a leaf has taken no call up yet: its source is not judged until it does or ends", "RFC 0001 run"),
    _note("early-0.9", "record", "a 0.9 file breaking record rules may come from a writer released before 0.9 gained them", "RFC 0001 Changes since 0.8"),
    _note("before-0.9", "record", "a file of a minor before 0.9 was written under other record rules", "RFC 0001 Changes since 0.8"),
    _note("source-rule", "record", "no earlier release checked a run's written source", "RFC 0001 run"),
    _note("end-rule", "record", "a run's end reads differently before 0.8 and 0.9", "RFC 0001 Changes since 0.7, 0.8"),
    _note("link-derived", "link", "a subsession link names the UUIDv5 of <parent>/<call_id>[/<n>] RFC 0001 recommends", "RFC 0001 Header"),
    _note("link-store", "link", "the sessions a file's links name are checked only where a store holds them", "RFC 0001 link"),
    # -- what a path sends ----------------------------------------------------------------
    Rule("first_kept", "error", "context", "refuse", "bad_entry", "a compaction's first_kept names an entry on its path before it", "RFC 0001 compaction"),
    Rule("request_hash", "error", "context", "finding", None, "a response's request_hash is the hash of the request its path rebuilds", "RFC 0001 Request hash"),
    _note("redacted-request", "context", "in a redacted file a request_hash names the original's request, which the redacted path need not rebuild", "RFC 0001 Header"),
    _note("of", "context", "an omitted list named by an of the path cannot resolve is kept as written", "RFC 0001 config"),
    # -- the sidecar media a session's items name (format/media.py) ----------------------
    Rule("missing-blob", "error", "media", "finding", None,
         "a sidecar blob an item names lies beside the file (a store may hold an entry naming one it lacks, reported as "
         "unresolved, and then holds the session to this rule only in its export)", "RFC 0001 File, RFC 0002 Media"),
    Rule("blob-hash", "error", "media", "finding", None, "a sidecar blob's bytes hash to the name its reference gives",
         "RFC 0001 File"),
    _note("media-unchecked", "media", "the sidecar blobs of a session read from a stream are not checked: a stream has "
          "no directory beside it", "RFC 0001 File"),
    # -- what only a store sees: the sessions links name (store/links.py) ----------------
    Rule("link-parent", "error", "store", "note", None, "a subsession a link names, when held, names this session as parent_session and the link's call as spawned_by", "RFC 0001 Header, link"),
    Rule("link-fork", "error", "store", "note", None, "the session a fork_of link names, when held, holds the fork's base", "RFC 0002 Sessions"),
)


def rule_of(code: str) -> Rule:
    """The rule a code names; :class:`KeyError` for a code no rule has."""
    return RULES[code]


def problem(line: int | None, code: str, message: str, entry: str | None = None) -> Problem:
    """A problem of the rule ``code``, with its severity from the table.

    Raises :class:`AgentSessionError` for a code :data:`RULES` does not hold: a
    rule nobody listed cannot be reported."""
    rule = RULES.get(code)
    if rule is None:
        raise AgentSessionError(f"no rule has the code {code!r}: add it to agentsession_cas.format.codes.RULES")
    return Problem(line, code, message, entry, rule.severity)


#: The rules a store holds an entry or a head move to that a file has no counterpart
#: of (``AppendRefusedError.rule``), by code: verify of a file never reports them.
STORE_ONLY: Mapping[str, str] = MappingProxyType({
    "synthetic": SYNTHETIC_RULE,
    "head": "a head rests on the base or an own entry that is not a leaf label; on none only without a base (RFC 0002 Head)",
})
