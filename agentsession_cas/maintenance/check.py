"""Checking a stored session, for any backend: what ``verify ID`` reports and what fsck asks of every session.

A stored session is verified in three layers, each the one place for its
rule: its **log** (what the backend reads of it, and :func:`replay` of its
records, with its indexes checked against it), its **objects** (every entry
its log and prefix need, present and hashing to its name), and its
**projection**, verified as any file is by the format core's rules. A session
whose log or objects are damaged is still walked, naming every object that
is missing or corrupt, so an operator knows what ``repair`` will face.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import field
from itertools import chain
from typing import TYPE_CHECKING, Any

from ..backends.base import FsckProblem, FsckReport
from ..errors import (
    AgentSessionError,
    CorruptObjectError,
    NoSuchObjectError,
    NoSuchSessionError,
    SessionDamagedError,
    SessionFormatError,
    store_relative,
)
from ..format import parallel
from ..format.entry import short_id
from ..format.hashing import lines_from_objects
from ..format.media import SidecarNames
from ..format.reader import verify_lines
from ..format.results import VerifyReport
from ..format.rules import RULES, empty_problem
from ..lean import dataclass
from ..progress import Progress
from ..store.links import check_links
from ..store.session import _ProjectionWalk
from ..store.state import SessionState, index_damage, replay, stale_head

if TYPE_CHECKING:
    from ..store.session import Session
    from ..store.store import Store

__all__ = ["StoredCheck", "check_sessions", "findings", "verify_stored"]


@dataclass
class StoredCheck:
    """What verifying one stored session found: problems and notes (each a JSON-ready dict
    of the shared problem shape: ``code``, ``severity``, ``where``, ``line``, ``entry``,
    ``message``; ``file`` where the backend names one), and counts."""

    session: str
    problems: list[dict[str, Any]] = field(default_factory=list)
    notes: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


#: Where a stored session's problem is said to be, by the scope of its rule.
_WHERE = {"context": "requests", "record": "records", "link": "links", "store": "links"}


def _problem(where: str, code: str, message: str, line: int | None = None, entry: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"code": code, "severity": "error", "where": where, "line": line, "entry": entry, "message": message, **extra}


def _note(where: str, code: str, message: str, line: int | None = None, entry: str | None = None, **extra: Any) -> dict[str, Any]:
    return {**_problem(where, code, message, line, entry, **extra), "severity": "note"}


def _finding(where: str, f: FsckProblem) -> dict[str, Any]:
    """A backend's finding (a log's fault, what an open recovered) in verify's shape, its code fsck's."""
    made = _note if f.severity == "note" else _problem
    return made(where, f.code, _one_line(f.message), f.line, f.object if f.space == "entries" else None, file=f.file)


def _object_problem(store: Store, exc: Exception, context: str, entry: str, log_line: int | None = None) -> dict[str, Any]:
    """An object the session needs that does not read, coded as fsck codes the same fault
    (docs/fsck.md): a copy that does not hash to its name is ``corrupt-object``; an entry
    whose envelope reads but whose content is not held, ``missing-content``; any other
    entry with no sound copy (absent, or in a pack that does not read), ``missing-object``."""
    extra: dict[str, Any] = {"log_line": log_line}
    if isinstance(exc, CorruptObjectError):
        path = store_relative(exc.path, store.root)  # (a finding names a file relative to the store)
        extra = {"object": exc.name, "space": exc.space, "path": path, "file": path}
        code = "corrupt-object"
    elif isinstance(exc, NoSuchObjectError) and store.objects.exists("entries", entry):
        code = "missing-content"
    else:
        code = "missing-object"
    what = _one_line(str(exc))
    if not isinstance(exc, (CorruptObjectError, NoSuchObjectError)):
        what = f"entry {entry}: {what}"
    return _problem("objects", code, f"{what}; {context}", entry=entry, **extra)


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


def verify_stored(
    store: Store, session_id: str, *, as_export: bool = False, progress: Progress | None = None
) -> StoredCheck:
    """Verify a stored session: its log reads and replays, its indexes agree with it,
    every object it needs is sound, the sidecar blobs its items name (``media:
    sidecar``) are held and sound, and its projection verifies as a file.
    ``as_export=True`` (``verify ID``) holds the session to what ``verify`` of its export
    says: a session with no entry is ``empty`` (nothing was checked), and a blob the store
    lacks is ``missing-blob`` (the export cannot carry it). fsck keeps the default: a
    store may hold a session with no entry yet, and an append naming a blob it lacks
    (RFC 0002: reported as unresolved, never refused), which is then a warning.
    ``progress(lines, total)`` is called as the projection is verified
    (:mod:`agentsession_cas.progress`)."""
    out = StoredCheck(session_id, stats={"entries": 0, "prefix": 0, "records": 0})
    history, state = _replayed(store, session_id)
    out.stats["records"] = len(history.records) if history.tail_from is None else history.tail_from
    # The log's faults and remarks carry fsck's codes (docs/fsck.md): one fault, one code.
    out.problems.extend(_finding("log", f) for f in history.damage)
    if history.tail is not None:
        out.notes.append(_note("log", "log-tail", history.tail, file=history.source))
    if not history.damage:  # (a log that does not read replays to what its damage already says)
        for code, why in state.damage:
            out.problems.append(_problem("log", code, why, file=history.source))
        lost = index_damage(state, history.head_index, history.length_index, summary=history.summary)
        if lost is not None:
            out.problems.append(_problem("log", "log-cut", lost, file=history.source))
        elif (stale := stale_head(state, history.head_index)) is not None:
            out.problems.append(_problem("session", "stale-head", stale, entry=history.head_index))
    if out.problems:
        _careful(store, session_id, history, state, out, as_export=as_export)
        return out
    # The log is sound: its records are let go while the projection is verified (a
    # session's worth of them, a third of the pass's memory); the careful path, taken
    # only when the projection cannot be read, reads the log again.
    source = history.source
    del history, state
    session: Session | None = None
    try:
        session = store.read(session_id)
    except SessionDamagedError as exc:
        out.problems.append(_problem("log", "log-damage", _one_line(exc.why), file=source))
    except AgentSessionError:
        session = None  # the careful path below says why
    if session is not None:
        named = SidecarNames() if session.header.media == "sidecar" else None
        try:
            report = _verify_projection(session, progress, named)
        except AgentSessionError:
            report = None  # an object the projection needs is missing or corrupt: the careful path names it
        if report is not None:
            out.notes.extend(_finding("session", f) for f in session.recovered)
            out.stats["entries"], out.stats["prefix"] = len(session), len(session.prefix)
            _check_projection(session, report, out, as_export=as_export)
            _check_blobs(store, named, out, as_export=as_export)
            session.close()
            return out
        session.close()
    history, state = _replayed(store, session_id)
    _careful(store, session_id, history, state, out, as_export=as_export)
    return out


def _replayed(store: Store, session_id: str) -> tuple[Any, SessionState]:
    """The log as held (its history) and what its records up to any uncommitted tail replay to."""
    history = store.backend.sessions.history(session_id)
    return history, replay(history.records if history.tail_from is None else history.records[: history.tail_from])


def _careful(store: Store, session_id: str, history: Any, state: SessionState, out: StoredCheck, *, as_export: bool) -> None:
    """Name every object the log and the prefix need that is missing or corrupt."""
    records = history.records if history.tail_from is None else history.records[: history.tail_from]
    positions = history.positions
    line_of: dict[str, int | None] = {}
    for i, r in enumerate(records):
        if r.get("op") == "append" and isinstance(r.get("entry"), str):
            line_of.setdefault(r["entry"], positions[i][0] if positions else None)
    committed = set(state.log_order[: sum(1 for e in state.log_order if state.is_committed(e))])
    for entry in state.log_order:
        line = line_of.get(entry)
        # (a backend that does not number its log's lines: the record said in words)
        at = f"log line {line}" if line is not None else "the log"
        needed = f"needed by log line {line}" if line is not None else "needed by the log's append of it"
        try:
            store.entry(entry)
        except (AgentSessionError, ValueError) as exc:
            if entry not in committed and isinstance(exc, (NoSuchObjectError, CorruptObjectError)):
                out.notes.append(_note("log", "dropped-on-open", f"{at}: an uncommitted append whose objects are not "
                                       f"sound ({_one_line(str(exc))}); the next writing open drops it", line, entry))
            else:
                out.problems.append(_object_problem(store, exc, needed, entry, line))
    out.stats["entries"] = len(state.log_order)
    base = state.base
    if base is not None:
        current: str | None = base
        walked: set[str] = set()
        while current is not None and current not in walked:
            at = current
            walked.add(at)
            try:
                current = store.entry(at).parent
            except (AgentSessionError, ValueError) as exc:
                out.problems.append(_object_problem(store, exc, f"on the prefix of base {short_id(base)}", at))
                break
        else:
            if current is not None:
                out.problems.append(_problem("objects", "broken-chain", f"entry {current} is its own ancestor on the prefix",
                                             entry=current))
        out.stats["prefix"] = len(walked)
    if not out.problems:
        # The objects are sound yet the session did not read: say why.
        try:
            s = store.read(session_id)
            try:
                named = SidecarNames() if s.header.media == "sidecar" else None
                _check_projection(s, _verify_projection(s, None, named), out, as_export=as_export)
                _check_blobs(store, named, out, as_export=as_export)
            finally:
                s.close()
        except AgentSessionError as exc:
            out.problems.append(_problem("session", "session", _one_line(str(exc))))
    else:
        out.notes.append(_note("session", "not-checked", "the projection was not checked: the log or the objects are damaged"))


def _verify_projection(
    session: Session, progress: Progress | None = None, named: SidecarNames | None = None
) -> VerifyReport | SessionFormatError:
    """The projection verified as a file is (the one rule set: the same problems, codes and
    notes ``verify FILE`` gives of its export), as its lines are made, an entry the
    checker goes back to read again from the store; or the error of a projection that
    has no header to read. Raises the error of an object it cannot read.

    Its lines are those :meth:`Session.projection_chunks` makes: the header's, each of the
    walk's entries', the marker's. For a session large enough for a helper process
    (:func:`~agentsession_cas.format.parallel.wanted`, judged on its first objects'
    bytes), the helper is handed the entries' objects as the packs hold them and makes
    and checks their lines (``LineHelper.built``), so this process reads the objects
    and runs the rules that need the lines in order. ``named`` is told each entry's
    content with its line, for the sidecar blobs they name."""
    walk = _ProjectionWalk(session)
    chunks = walk.chunks()
    opening: list[list[_Walked]] = []
    size = 0
    for chunk in chunks:  # enough to judge by, as verify_lines judges a projection's lines
        opening.append(chunk)
        size += sum(len(content) for _, _, content, _ in chunk)
        if size >= parallel.MIN_BYTES:
            break

    def walked() -> Iterator[list[_Walked]]:
        line = 2  # (the header's is the first)
        for chunk in chain(_drained(opening), chunks):
            if named is not None:
                for _, _, content, _ in chunk:
                    named.add(content, line)
                    line += 1
            yield chunk

    helper = parallel.LineHelper(built=True) if parallel.wanted(size, None) and not session.header.is_legacy else None

    def lines() -> Iterator[bytes]:
        yield session.header.canonical_line()
        if helper is None:
            yield from (line for chunk in walked() for line in lines_from_objects(chunk))
        else:
            yield from helper.built(_objects_blocks(walked()))
        marker = walk.marker()
        if marker is not None:
            if helper is not None:
                helper.known.append(None)  # (a line made here: checked here)
            yield marker.canonical_line()

    try:
        if helper is not None:
            helper.start()
        return verify_lines(lines(), source=session.id, loader=session.store.entry, progress=progress,
                            total=len(session.prefix) + len(session), known=None if helper is None else helper.known)
    except SessionFormatError as exc:
        return exc
    finally:
        if helper is not None:
            helper.close()


def _drained(chunks: list[list[_Walked]]) -> Iterator[list[_Walked]]:
    """The chunks, each let go of as it is passed on (8 MB of objects)."""
    while chunks:
        yield chunks.pop(0)


#: One entry as the projection's walk reads it: (id, envelope, content, the envelope's members but content).
_Walked = tuple[str, dict[str, Any], bytes, "bytes | None"]


def _objects_blocks(chunks: Iterator[list[_Walked]]) -> Iterator[parallel.ObjectsBlock]:
    """Each chunk of the walk as the helper is handed it (its objects' bytes), with what
    makes their lines here (:func:`lines_from_objects`, the projection's one maker)."""
    for chunk in chunks:
        def make(which: Sequence[int], chunk: list[_Walked] = chunk) -> list[bytes]:
            return lines_from_objects([chunk[i] for i in which])

        yield [(entry_id, content, members) for entry_id, _, content, members in chunk], make


def _check_projection(session: Session, report: VerifyReport | SessionFormatError, out: StoredCheck, *, as_export: bool) -> None:
    if isinstance(report, SessionFormatError):
        out.problems.extend({**p.as_dict(), "where": "projection"} for p in report.problems)
        return
    for p in report.problems:
        if RULES[p.code].store == "keep" and not as_export:
            continue  # (fsck: a header a store keeps as it was stored, which fsck's pass over the headers says)
        out.problems.append({**p.as_dict(), "where": _WHERE.get(RULES[p.code].scope, "projection")})
    # What a file could not check, the store does: the sessions its links name.
    for p in report.notes:
        if p.code == "empty":
            if not as_export:
                continue  # (fsck: a store may hold a session with no entry yet)
            p = empty_problem(stored=True)  # (said of the session, not of a file)
        if p.code != "link-store":
            out.notes.append({**p.as_dict(), "where": _WHERE.get(RULES[p.code].scope, "projection")})
    for p in check_links(session.store, report.header, report.links):
        out.problems.append({**p.as_dict(), "where": "links"})
    out.stats["requests"] = report.counts()
    out.stats["runs_checked"] = report.runs_checked
    if not session.state.may_hold_head(session.head):
        out.problems.append(_problem(
            "session", "head-rule", f"the head {session.head or 'none'} is not the base or an own entry that is not a leaf label",
            entry=session.head,
        ))


def _check_blobs(store: Store, named: SidecarNames | None, out: StoredCheck, *, as_export: bool) -> None:
    """Each sidecar blob the projection's lines name, read (and so verified against its
    name) from the store: a corrupt copy is ``corrupt-object``, as any object's; one the
    store lacks is ``missing-blob``, a problem when held to the export (which cannot be
    written without it), else a warning (see :func:`verify_stored`)."""
    if named is None:
        return
    for name, line in sorted(named.first.items(), key=lambda kv: (kv[1], kv[0])):
        try:
            store.objects.get("blobs", name)
        except CorruptObjectError as exc:
            path = store_relative(exc.path, store.root)
            out.problems.append(_problem("media", "corrupt-object", f"{_one_line(str(exc))}; named by projection line {line}",
                                         line, object=name, space="blobs", path=path, file=path))
        except NoSuchObjectError as exc:
            said = f"sidecar blob {name}, named by projection line {line}, is not held: {_one_line(str(exc))}"
            if as_export:
                out.problems.append(_problem("media", "missing-blob", f"{said}; the export cannot carry it", line, object=name,
                                             space="blobs"))
            else:
                out.notes.append({**_problem("media", "missing-blob", said, line, object=name, space="blobs"),
                                  "severity": "warning"})


def findings(check: StoredCheck) -> list[FsckProblem]:
    """A stored session's problems as fsck's findings (the shape fsck, pack, sweep and
    stats print), each naming the session."""
    sid = check.session
    # (a log's fault keeps its place in the log; a projection's line is no place in the store)
    return [FsckProblem("error", p["code"], f"session {sid}: {p['message']}", session=sid,
                        object=p.get("entry") or p.get("object"), space=p.get("space"), file=p.get("file"),
                        line=p.get("line") if p.get("where") == "log" else None)
            for p in check.problems]


def _kept_finding(code: str) -> bool:
    """Whether a store keeps an entry that breaks the rule ``code`` and reports it, where
    the rule is found by what the entry's path records (``request_hash``). The media's
    findings are not among them: a blob lacking or corrupt is the walk's to say."""
    rule = RULES.get(code)
    return rule is not None and rule.store == "finding" and rule.scope == "context"


def check_sessions(store: Store, report: FsckReport, *, progress: Callable[[str], None] | None = None) -> None:
    """fsck's walk over the seam: every session verified as :func:`verify_stored` does,
    and held, as the file walk holds it, to what a store enforces: what the rule table
    has a store keep and report (``request_hash``: store policy ``finding``) is
    ``--deep``'s to report, as ``verify`` does, not damage. A session with damage too
    is reported whole, since ``--deep`` passes by a session the walk found damaged."""
    ids = store.list()
    report.counts["sessions"] = len(ids)
    for i, sid in enumerate(ids, start=1):
        if progress:
            progress(f"session {i}/{len(ids)}: {sid}")
        try:
            check = verify_stored(store, sid)
        except NoSuchSessionError:
            report.counts["sessions"] -= 1  # deleted since it was listed: nothing to check
            continue
        found = findings(check)
        if all(_kept_finding(p.code) for p in found):
            found = []  # only what the store keeps: --deep's to say (a damaged session's is said here)
        report.problems.extend(found)
        for n in check.notes:  # verify's remarks and warnings, with their codes, as --deep's
            report.add(n["severity"], n["code"], f"session {sid}: {n['message']}", session=sid, file=n.get("file"),
                       object=n.get("object"), space=n.get("space"))
