"""The store commands: plumbing over :class:`agentsession_cas.store.core.Store`.

Read-only commands open the store with ``readonly=True`` (no lock, nothing
written), so they work beside a process that is writing. Writing commands
open a writing store and close it, which commits, before they print.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import click

from agentsession_cas import Header, SessionFile, loads, read_session_bytes, short_id
from agentsession_cas.backends.files.log import read_log
from agentsession_cas.errors import (
    AgentSessionError,
    BadNameError,
    CorruptObjectError,
    IJSONError,
    LayoutError,
    NoSuchObjectError,
    NoSuchSessionError,
    SessionFormatError,
)
from agentsession_cas.format.context import verify_requests
from agentsession_cas.format.names import check_session_id
from agentsession_cas.format.runs import verify_records
from agentsession_cas.store.core import Session, Store, default_store_path, payload_entry

from .common import echo, emit_json, fail, note, one_line, table, write_bytes

_HEX64 = re.compile(r"[0-9a-f]{64}")


# ---------------------------------------------------------------------------
# the store and what an argument names


def store_root() -> str:
    """The store the command works on: ``--store``, else $AGENTSESSION_STORE, else ~/.agent/cas."""
    ctx = click.get_current_context()
    obj = ctx.find_root().obj or {}
    path = obj.get("store")
    return os.path.abspath(os.path.expanduser(path)) if path else default_store_path()


def read_store(root: str | None = None) -> Store:
    return Store(root or store_root(), readonly=True)


def write_store(root: str | None = None) -> Store:
    return Store(root or store_root())


@dataclass
class Target:
    """What a ``show``/``verify``/``export`` argument names: a file, or a session of a store."""

    kind: str  # "file" or "session"
    arg: str
    root: str | None = None
    session_id: str | None = None
    via_path: bool = False


def session_of_path(path: str) -> tuple[str, str] | None:
    """(store root, session id) when ``path`` is ``<store>/sessions/<id>`` or lies inside it.

    Walks up from the path to the first directory holding a ``layout`` file.
    """
    for p in dict.fromkeys([os.path.abspath(path), os.path.realpath(path)]):
        a = p
        while True:
            if os.path.isfile(os.path.join(a, "layout")):
                rel = os.path.relpath(p, a).split(os.sep)
                if len(rel) >= 2 and rel[0] == "sessions" and rel[1] not in (".", ".."):
                    return a, rel[1]
                break
            parent = os.path.dirname(a)
            if parent == a:
                break
            a = parent
    return None


def locate(arg: str, *, files: bool) -> Target:
    """The rule: an existing path outside any session directory is a file; a path inside
    ``<store>/sessions/<id>/`` is that session, read through the store it lies in;
    anything else is a session id in ``--store`` (or, when ``files`` and it cannot be
    one, a file that is missing)."""
    if os.path.lexists(arg):
        found = session_of_path(arg)
        if found is not None:
            return Target("session", arg, found[0], found[1], via_path=True)
        return Target("file", arg)
    if os.sep in arg or (os.altsep and os.altsep in arg):
        return Target("file", arg)
    if files:
        try:
            check_session_id(arg)
        except BadNameError:
            return Target("file", arg)
    return Target("session", arg, store_root(), arg)


def open_target(target: Target, *, files: bool) -> tuple[Store, Session]:
    """Open a located session read-only, with errors worded for what the argument could be."""
    assert target.session_id is not None and target.root is not None
    try:
        store = read_store(target.root)
        session = store.read(target.session_id)
    except LayoutError as exc:
        if files and not target.via_path:
            fail(f"{target.arg}: no such file, nor a session: {exc}")
        raise
    except NoSuchSessionError:
        if files and not target.via_path:
            fail(f"{target.arg}: no such file, nor a session of the store at {target.root}")
        raise
    if target.via_path:
        note(f"{target.arg} lies in session {target.session_id} of the store at {target.root}; reading that session")
    return store, session


def _dir_size(path: str) -> int:
    total = 0
    try:
        with os.scandir(path) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except OSError:
        pass
    return total


def _stdin_json(what: str) -> Any:
    raw = sys.stdin.buffer.read()
    if not raw.strip():
        fail(f"no {what} on stdin: give one JSON object")
    try:
        return loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        fail(f"stdin is not UTF-8; {what} is one JSON object")
    except (ValueError, IJSONError) as exc:
        fail(f"stdin is not a JSON object ({what}): {exc}")


# ---------------------------------------------------------------------------
# init, list


@click.command()
def init() -> None:
    """Create the store (or find the one there) and print its path."""
    store = Store.init(store_root())
    store.close()
    echo(store.root)


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of text.")
def list_sessions(as_json: bool) -> None:
    """List the store's sessions: id, created, own entries, head, mark, size.

    A session that cannot be read (a damaged log) is listed with mark
    `damaged`, reported on stderr, and the exit status is 1.
    """
    store = read_store()
    rows: list[dict[str, Any]] = []
    failed = 0
    for sid in store.list():
        size = _dir_size(store.session_dir(sid))
        try:
            s = store.read(sid)
        except NoSuchSessionError:
            continue  # deleted meanwhile
        except AgentSessionError as exc:
            failed += 1
            echo(f"agentsession: error: {one_line(str(exc))}", err=True)
            rows.append({"id": sid, "created": None, "entries": None, "head": None, "base": None,
                         "mark": "damaged", "size": size, "error": one_line(str(exc))})
            continue
        rows.append({"id": sid, "created": s.header.created_at, "entries": len(s), "head": s.head,
                     "base": s.base, "mark": s.mark, "size": size})
    if as_json:
        emit_json(rows)
    elif rows:
        lines = [["ID", "CREATED", "ENTRIES", "HEAD", "MARK", "SIZE"]]
        for r in rows:
            lines.append([
                r["id"],
                str(r["created"] or "-"),
                "-" if r["entries"] is None else str(r["entries"]),
                short_id(r["head"]),
                r["mark"],
                str(r["size"]),
            ])
        for line in table(lines):
            echo(line)
    if failed:
        sys.exit(1)


# ---------------------------------------------------------------------------
# log


def _head_cell(data: dict[str, Any]) -> str:
    if "head" not in data:
        return "-"
    return "none" if data["head"] is None else short_id(data["head"])


def _detail(data: dict[str, Any]) -> str:
    op = data.get("op")
    parts = []
    if op == "create":
        parts.append(f"mark {data.get('mark')}")
        if data.get("base"):
            parts.append(f"base {short_id(data['base'])}")
    elif op == "mark":
        parts.append(str(data.get("mark")))
    elif op == "loss":
        parts.append("dropped by recovery" + (f": log line {data['line']}: {data['reason']}" if data.get("reason") else ""))
    if data.get("leaf_label"):
        parts.append("leaf label")
    if data.get("lazy"):
        parts.append("lazy")
    return ", ".join(parts)


@click.command("log")
@click.argument("session_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of records instead of text.")
def log_cmd(session_id: str, as_json: bool) -> None:
    """Print a session's log records: line, op, seq, entry, head.

    A damaged line is reported on stderr (with its line) and the exit is 1;
    the good records before it are still printed.
    """
    store = read_store()
    check_session_id(session_id)
    if session_id not in store:
        raise NoSuchSessionError(f"no such session: {session_id}")
    try:
        with open(os.path.join(store.session_dir(session_id), "log"), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        data = b""
    lr = read_log(data)
    if as_json:
        emit_json([{"line": r.line, "offset": r.offset, "op": r.op, **r.data} for r in lr.records])
    else:
        rows = [["LINE", "OP", "SEQ", "ENTRY", "HEAD", "DETAIL"]]
        for r in lr.records:
            d = r.data
            rows.append([
                str(r.line),
                r.op,
                str(d["seq"]) if "seq" in d else "-",
                short_id(d["entry"]) if isinstance(d.get("entry"), str) else "-",
                _head_cell(d) if r.op in ("append", "head") else "-",
                _detail(d),
            ])
        for line in table(rows):
            echo(line)
    if lr.cut is not None:
        note(
            f"session {session_id}: log line {lr.cut.line}: {lr.cut.reason}: an uncommitted tail "
            f"({1 + len(lr.cut_records)} line(s)), a write in progress or a crash's loss that the next writing open drops"
        )
    for d in lr.damage:
        echo(f"agentsession: error: session {session_id}: log line {d.line} (offset {d.offset}): {d.reason}", err=True)
    if lr.damage:
        sys.exit(1)


# ---------------------------------------------------------------------------
# verify (a stored session)


def _problem(where: str, code: str, message: str, line: int | None = None, entry: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"where": where, "line": line, "code": code, "message": message, "entry": entry, **extra}


def _object_problem(exc: AgentSessionError, context: str, entry: str | None, log_line: int | None = None) -> dict[str, Any]:
    extra: dict[str, Any] = {"log_line": log_line}
    if isinstance(exc, CorruptObjectError):
        extra = {"object": exc.name, "space": exc.space, "path": exc.path}
    code = "corrupt-object" if isinstance(exc, CorruptObjectError) else "missing-object"
    return _problem("objects", code, f"{one_line(str(exc))}; {context}", entry=entry, **extra)


def check_session(store: Store, session_id: str) -> tuple[list[dict[str, Any]], list[str], dict[str, Any]]:
    """Verify a stored session: its log reads, every object it needs is present and hashes
    to its name, and its projection verifies as a file. Returns (problems, notes, stats)."""
    problems: list[dict[str, Any]] = []
    notes: list[str] = []
    stats: dict[str, Any] = {"entries": 0, "prefix": 0, "records": 0}
    sdir = store.session_dir(session_id)
    try:
        with open(os.path.join(sdir, "log"), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        data = b""
    lr = read_log(data)
    stats["records"] = len(lr.records)
    for d in lr.damage:
        problems.append(_problem("log", "log", f"log line {d.line} (offset {d.offset}): {d.reason}", line=d.line))
    if lr.cut is not None:
        notes.append(
            f"log line {lr.cut.line}: {lr.cut.reason}: an uncommitted tail, which the next writing open drops"
        )
    if not lr.records or lr.records[0].op != "create":
        problems.append(_problem("log", "log", "the log does not begin with a create record", line=1))

    if not problems:
        # The fast path: the library reads every object as it projects, verifying each.
        try:
            session = store.read(session_id)
            projection = session.projection()
        except AgentSessionError:
            session = None  # the careful path below says why
        if session is not None:
            notes.extend(session.recovered)
            stats["entries"], stats["prefix"] = len(session), len(session.prefix)
            _check_projection(session, projection, problems, notes, stats)
            return problems, notes, stats

    # The careful path: name every object that is missing or corrupt.
    last_commit = max((i for i, r in enumerate(lr.records) if r.op in ("commit", "create")), default=-1)
    last_checkpoint = max((i for i, r in enumerate(lr.records) if r.op in ("checkpoint", "create")), default=-1)
    base = None
    seen: set[str] = set()
    for i, r in enumerate(lr.records):
        if r.op == "create":
            base = r.get("base")
        if r.op != "append":
            continue
        entry = r.get("entry")
        if not isinstance(entry, str) or entry in seen:
            continue
        seen.add(entry)
        try:
            store.entry(entry)
        except (NoSuchObjectError, CorruptObjectError) as exc:
            if i > last_checkpoint and r.payload is not None and payload_entry(entry, r.payload) is not None:
                continue  # held in the log until the next checkpoint writes it to objects/
            if i > last_commit:
                notes.append(f"log line {r.line}: an uncommitted append whose objects are not sound ({one_line(str(exc))}); "
                             "the next writing open drops it")
            else:
                problems.append(_object_problem(exc, f"needed by log line {r.line}", entry, r.line))
        except (AgentSessionError, ValueError) as exc:
            problems.append(_problem("objects", "object", f"entry {entry}: {one_line(str(exc))}; needed by log line {r.line}", entry=entry))
    stats["entries"] = len(seen)
    if isinstance(base, str):
        current: str | None = base
        walked: set[str] = set()
        while current is not None and current not in walked:
            walked.add(current)
            try:
                current = store.entry(current).parent
            except (NoSuchObjectError, CorruptObjectError) as exc:
                problems.append(_object_problem(exc, f"on the prefix of base {short_id(base)}", current))
                break
            except (AgentSessionError, ValueError) as exc:
                problems.append(_problem("objects", "object", f"entry {current}: {one_line(str(exc))}", entry=current))
                break
        else:
            if current is not None:
                problems.append(_problem("objects", "prefix", f"entry {current} is its own ancestor on the prefix", entry=current))
        stats["prefix"] = len(walked)
    if not problems:
        # The objects are sound yet the session did not read: say why.
        try:
            session = store.read(session_id)
            _check_projection(session, session.projection(), problems, notes, stats)
        except AgentSessionError as exc:
            problems.append(_problem("session", "session", one_line(str(exc))))
    else:
        notes.append("the projection was not checked: the log or the objects are damaged")
    return problems, notes, stats


def _check_projection(
    session: Session, projection: bytes, problems: list[dict[str, Any]], notes: list[str], stats: dict[str, Any] | None = None
) -> None:
    try:
        sf = read_session_bytes(projection, source=session.id)
    except SessionFormatError as exc:
        problems.extend({"where": "projection", **p.as_dict()} for p in exc.problems)
        return
    for p in sf.all_problems():
        problems.append({"where": "projection", **p.as_dict()})
    notes.extend(str(p) for p in sf.unresolved)
    # Every response's request rebuilt and its request_hash checked (agentsession_cas.format.context).
    requests = verify_requests(sf)
    problems.extend({"where": "requests", **p.as_dict()} for p in requests.problems)
    notes.extend(str(p) for p in requests.notes)
    # The record rules and every run end against its segment (agentsession_cas.format.runs).
    records = verify_records(sf)
    problems.extend({"where": "records", **p.as_dict()} for p in records.problems)
    notes.extend(str(p) for p in records.notes)
    if stats is not None:
        stats["requests"] = requests.counts()
        stats["runs_checked"] = records.runs_checked
    head = session.head
    if head is None:
        ok = session.base is None
    else:
        ok = head == session.base or (head in session.own and head not in session.leaf_labels)
    if not ok:
        problems.append(_problem("session", "head", f"the head {head or 'none'} is not the base or an own entry that is not a leaf label", entry=head))


def verify_session(target: Target, as_json: bool) -> None:
    store = _open_for_verify(target)
    sid = target.session_id
    assert sid is not None
    problems, notes, stats = check_session(store, sid)
    ok = not problems
    if as_json:
        emit_json({
            "source": target.arg,
            "store": store.root,
            "session": sid,
            "ok": ok,
            "entries": stats["entries"],
            "prefix": stats["prefix"],
            "records": stats["records"],
            "requests": stats.get("requests"),
            "runs_checked": stats.get("runs_checked"),
            "problems": problems,
            "notes": notes,
        })
        sys.exit(0 if ok else 1)
    for p in problems:
        where = f"line {p['line']}: " if p["where"] == "projection" and p["line"] is not None else ""
        echo(f"{sid}: {where}{p['message']}")
    for n in notes:
        echo(f"{sid}: note: {n}")
    echo(
        f"{sid}: {stats['records']} log record(s), {stats['entries']} own entries and {stats['prefix']} on the prefix, "
        f"objects checked against their names; {len(problems)} problem(s)"
        + (
            f"; {stats['requests']['responses']} response(s): {stats['requests']['verified']} request hash(es) verified, "
            f"{stats['requests']['without_hash']} without a hash, {stats['requests']['failed']} failed"
            if stats.get("requests")
            else ""
        )
        + (f"; {stats['runs_checked']} run(s) checked" if stats.get("runs_checked") is not None else "")
    )
    sys.exit(0 if ok else 1)


def _open_for_verify(target: Target) -> Store:
    """Like :func:`open_target`, but a damaged session is still verified (not refused)."""
    assert target.session_id is not None and target.root is not None
    try:
        store = read_store(target.root)
    except LayoutError as exc:
        if not target.via_path:
            fail(f"{target.arg}: no such file, nor a session: {exc}")
        raise
    if target.session_id not in store:
        if not target.via_path:
            fail(f"{target.arg}: no such file, nor a session of the store at {target.root}")
        raise NoSuchSessionError(f"no such session: {target.session_id}")
    if target.via_path:
        note(f"{target.arg} lies in session {target.session_id} of the store at {target.root}; verifying that session")
    return store


def projection_file(target: Target) -> SessionFile:
    """The projection of a located session, read as a file (for ``show``)."""
    _, session = open_target(target, files=True)
    return read_session_bytes(session.projection(), source=target.session_id or target.arg)


# ---------------------------------------------------------------------------
# export, import


@click.command()
@click.argument("session", metavar="ID")
@click.option("-o", "--output", metavar="FILE", help="Write the projection (and sidecar media beside it) to FILE.")
def export(session: str, output: str | None) -> None:
    """Print a session's projection (RFC 0002) to stdout, or write it to FILE.

    ID may also be a path inside the session's directory in a store.
    """
    target = locate(session, files=False)
    if target.kind == "file":
        if not os.path.lexists(target.arg):
            fail(f"{target.arg}: no such file, nor a session")
        fail(f"{target.arg} is not a session of a store (give a session id or a path inside <store>/sessions/<id>/)")
    store, s = open_target(target, files=False)
    if output is None or output == "-":
        write_bytes(s.projection())
    else:
        store.export_to(s.id, output)


@click.command("import")
@click.argument("file", type=click.Path(dir_okay=True, readable=False))
@click.option("--record", is_flag=True, help="Hold it as a record (appendable here), not a mirror.")
def import_cmd(file: str, record: bool) -> None:
    """Import a session file; print the new session's id.

    The session is a mirror (it refuses local appends and head moves)
    unless --record is given.
    """
    with write_store() as store:
        session = store.import_file(file, record=record)
        sid = session.id
    echo(sid)


# ---------------------------------------------------------------------------
# create, append, head


@click.command()
@click.option("--base", metavar="H", help="Fork from entry H, which the store holds.")
@click.option("--header", "header_file", metavar="FILE", help="Take the header from FILE (a JSON object; - for stdin).")
@click.option("--id", "new_id", metavar="ID", help="The session id (default: a new uuid, or the header's).")
def create(base: str | None, header_file: str | None, new_id: str | None) -> None:
    """Create a session (a record) and print its id."""
    if header_file is not None:
        if header_file == "-":
            data = _stdin_json("header")
        else:
            with open(header_file, "rb") as f:
                raw = f.read()
            try:
                data = loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                fail(f"{header_file}: not UTF-8; a header is one JSON object")
            except (ValueError, IJSONError) as exc:
                fail(f"{header_file}: not a JSON object: {exc}")
        if not isinstance(data, dict):
            fail(f"{header_file}: the header must be a JSON object")
        data = dict(data)
        if new_id is not None:
            data["id"] = new_id
        elif "id" not in data:
            data["id"] = str(uuid.uuid4())
        if base is not None:
            data["base"] = base
        header = Header(data)
    else:
        header = Header.new(str(uuid.uuid4()) if new_id is None else new_id, base=base)
    with write_store() as store:
        sid = store.create(header).id
    echo(sid)


_OUTCOME_NOTES = {
    "branched": "the parent is not the head: the entry starts a branch and the head stays at {head}",
    "no-op": "the log already holds this entry; nothing was written",
}


@click.command()
@click.argument("session_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the append's result as a JSON object.")
def append(session_id: str, as_json: bool) -> None:
    """Append one entry, given as a JSON object on stdin, and print its id.

    The entry may carry its id (it must match the hash) or not; `parent`
    defaults to the head and `ts` to now. The append is committed before
    the command exits.
    """
    obj = _stdin_json("entry")
    if not isinstance(obj, dict):
        fail("stdin holds JSON but not an object; an entry is one JSON object")
    with write_store() as store:
        session = store.session(session_id)
        for message in session.recovered:
            note(message)
        result = session.append(obj)
    if as_json:
        emit_json(result.as_dict())
        return
    echo(result.id)
    if result.outcome in _OUTCOME_NOTES:
        note(_OUTCOME_NOTES[result.outcome].format(head=short_id(result.head) if result.head else "none"))
    if result.note:
        note(result.note)
    for ref in result.unresolved:
        note(f"unresolved reference {ref} (kept; a store reports it and does not refuse)")


@click.command()
@click.argument("session_id", metavar="ID")
@click.argument("new", metavar="[NEW]", required=False)
@click.option("--expect", "expected", metavar="OLD", help="The head you expect (compare-and-swap); '' for no head.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of text.")
def head(session_id: str, new: str | None, expected: str | None, as_json: bool) -> None:
    """Print a session's head (nothing when it has none), or move it with NEW --expect OLD.

    NEW '' sets no head (only a session without a base may have none).
    """
    if new is None:
        if expected is not None:
            raise click.UsageError("--expect goes with NEW, the head to set")
        current = read_store().read(session_id).head
        if as_json:
            emit_json({"session": session_id, "head": current})
        elif current is not None:
            echo(current)
        return
    if expected is None:
        raise click.UsageError("moving the head needs --expect OLD (the head you expect; '' for no head)")
    with write_store() as store:
        session = store.session(session_id)
        for message in session.recovered:
            note(message)
        session.set_head(new or None, expected=expected or None)
        moved_to = session.head
    if as_json:
        emit_json({"session": session_id, "head": moved_to, "previous": expected or None})


# ---------------------------------------------------------------------------
# cat-object, delete


@click.command("cat-object")
@click.argument("name", metavar="HASH")
@click.option("-t", "show_space", is_flag=True, help="Print the object's space (entries, contents, blobs) instead.")
def cat_object(name: str, show_space: bool) -> None:
    """Print an object's bytes, verified against its name (sha256:<64 hex>)."""
    if _HEX64.fullmatch(name):
        name = "sha256:" + name
    space, data = read_store().cat_object(name)
    if show_space:
        echo(space)
    else:
        write_bytes(data)


@click.command()
@click.argument("session_id", metavar="ID")
def delete(session_id: str) -> None:
    """Delete a session (its objects stay; other sessions may share them)."""
    with write_store() as store:
        store.delete(session_id)


COMMANDS = [init, list_sessions, log_cmd, export, import_cmd, create, append, head, cat_object, delete]
