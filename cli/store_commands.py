"""The store commands: plumbing over :class:`agentsession_cas.store.Store`.

Read-only commands open the store with ``readonly=True`` (no lock, nothing
written), so they work beside a process that is writing. Writing commands
open a writing store and close it, which commits, before they print.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import sys
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from agentsession_cas.backends.files.layout import find_store, layout_text
from agentsession_cas.errors import (
    AgentSessionError,
    BadNameError,
    ContinuationError,
    DanglingRefError,
    IJSONError,
    LayoutError,
    NoSuchSessionError,
    OutputError,
    RedactionError,
    quoted,
)
from agentsession_cas.format.canonical import loads
from agentsession_cas.format.entry import Header, kept_member_note, short_id
from agentsession_cas.format.links import fork_of_link
from agentsession_cas.format.names import check_session_id, names_an_entry
from agentsession_cas.lean import dataclass
from agentsession_cas.store import Session, Store, default_store_path
from agentsession_cas.store.names import REF_PREFIX, resolve_base, resolve_entry, resolve_object, resolve_session
from agentsession_cas.store.refs import Refs
from agentsession_cas.store.url import open_store, store_url_kind

if TYPE_CHECKING:
    from agentsession_cas.format.reader import SessionFile

from agentsession_cas.progress import Progress

from . import terminal
from .common import (
    SECRET,
    JsonStream,
    echo,
    emit_json,
    end_at_once_after,
    fail,
    json_option,
    note,
    number,
    plural,
    read_stdin,
    table,
    whole_pass,
    write_bytes,
    write_stream,
)
from .terminal import paint, progressing, stdout_is_tty
from .terminal import start_pager as page

_HEX64 = re.compile(r"[0-9a-f]{64}")

#: The code of a refusal that is no library error: standard input or a header file that
#: is no JSON object. (Options that do not go together are a click.UsageError: exit 2, code usage.)
BAD_INPUT = "bad_input"


# The reader, the rule set and the maintenance checks are imported by the commands that
# use them: head, list and append do not load them (tests/test_cli_startup.py).

# ---------------------------------------------------------------------------
# the store and what an argument names


def store_root() -> str:
    """The store the command works on: ``--store``; else the store found walking up from
    the working directory (a store, or a ``.agentsession`` store inside a directory, as
    git finds ``.git``); else $AGENTSESSION_STORE; else ~/.agent/cas (a path, made
    absolute, or a store URL as ``open_store`` takes it)."""
    ctx = click.get_current_context()
    obj = ctx.find_root().obj or {}
    given = obj.get("store") or find_store(os.getcwd()) or default_store_path()
    kind, rest = store_url_kind(given)
    if kind == "file" and rest == given:
        return os.path.abspath(os.path.expanduser(given))
    return given


def read_store(root: str | None = None) -> Store:
    return open_store(root or store_root(), readonly=True)


def write_store(root: str | None = None) -> Store:
    return open_store(root or store_root())


def refuse_output_in_store(output: str | None) -> None:
    """``-o`` naming a path inside a store would replace the store's own files (a
    session's log, a pack, the layout): refused before anything is read or written. A
    file beside a store kept in a project (``project/.agentsession``) is not inside it."""
    if output is None or output == "-":
        return
    target = os.path.realpath(output)  # where the write would land (a symlink's target)
    root = find_store(target if os.path.isdir(target) else os.path.dirname(target))
    if root is not None and (target + os.sep).startswith(os.path.realpath(root) + os.sep):
        raise OutputError(f"cannot write {output}: it lies inside the store at {root}; write it outside the store")


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
    one, a file that is missing). ``-`` is standard input, read as a file."""
    if arg == "-":
        return Target("file", arg)
    if arg.startswith(REF_PREFIX) and not os.path.lexists(arg):
        return Target("session", arg, store_root(), arg)
    if os.path.lexists(arg):
        found = session_of_path(arg)
        if found is not None:
            return Target("session", arg, found[0], found[1], via_path=True)
        return Target("file", arg)
    if os.sep in arg or (os.altsep and os.altsep in arg):
        if not os.path.lexists(arg) and _names_a_ref(arg):
            fail(f"{arg}: no such file; a name holding / is read as a path here: to name the ref, write ref:{arg}",
                 code=NoSuchSessionError.code)
        return Target("file", arg)
    if files:
        try:
            check_session_id(arg)
        except BadNameError as exc:
            if "\x00" in arg:  # no path holds NUL: neither a file nor a session
                raise BadNameError(f"{quoted(arg)} is no file (a path cannot hold NUL) and {exc}") from None
            if names_an_entry(arg):  # an id pasted from show or log: no file, and no session's name
                fail(f"{arg}: no such file, nor a session{names_an_entry(arg)}", code=NoSuchSessionError.code)
            return Target("file", arg)
    return Target("session", arg, store_root(), arg)


def _names_a_ref(name: str) -> bool:
    """Whether the store holds a ref ``name`` (only to say how to write one: never raises)."""
    try:
        with read_store() as store:
            Refs(store).resolve(name)
        return True
    except (AgentSessionError, OSError):
        return False


def open_target(target: Target, *, files: bool) -> tuple[Store, Session]:
    """Open a located session read-only, with errors worded for what the argument could be."""
    assert target.session_id is not None and target.root is not None
    try:
        store = read_store(target.root)
        if not target.via_path:
            target.session_id = resolve_session(store, target.session_id)
        session = store.read(target.session_id)
    except LayoutError as exc:
        if files and not target.via_path:
            fail(f"{target.arg}: no such file, nor a session: {exc}", code=exc.code)
        raise
    except DanglingRefError:
        raise  # a ref that names a session no more: say so, not "no such file"
    except NoSuchSessionError as exc:
        if files and not target.via_path:
            fail(f"{target.arg}: no such file, nor a session of the store at {target.root}", code=exc.code)
        raise
    if target.via_path:
        note(f"{target.arg} lies in session {target.session_id} of the store at {target.root}; reading that session")
    return store, session


def read_file_arg(file: str, progress: Progress | None = None) -> SessionFile:
    """A session file named on the command line; ``-`` reads standard input."""
    from agentsession_cas.format.reader import read_session, read_session_bytes  # the rule set: not for head or list

    if file == "-":
        return read_session_bytes(read_stdin(), source="<stdin>", progress=progress)
    return read_session(file, progress=progress)


def _stdin_json(what: str) -> Any:
    raw = read_stdin()
    if not raw.strip():
        fail(f"no {what} on stdin: give one JSON object", code=BAD_INPUT)
    return _json_object(raw, "stdin", what)


def _json_object(raw: bytes, where: str, what: str) -> Any:
    """``raw`` (stdin's or a file's bytes) parsed as the JSON ``what`` is, or the command's
    error naming ``where``; a byte order mark is named as import and verify name it."""
    if raw.startswith(b"\xef\xbb\xbf"):
        from agentsession_cas.format.rules import BOM_WORDS  # (here: head and list load no rule set)

        fail(f"{where} {BOM_WORDS} ({what} is one JSON object)", code=BAD_INPUT)
    try:
        return loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        fail(f"{where} is not UTF-8; {what} is one JSON object", code=BAD_INPUT)
    except (ValueError, IJSONError) as exc:
        fail(f"{where} is not a JSON object ({what}): {exc}", code=BAD_INPUT)


# ---------------------------------------------------------------------------
# init, list


@click.command()
@json_option()
def init(as_json: bool) -> None:
    """Create the store (or find the one there) and say which, with its path."""
    root = store_root()
    kind, _ = store_url_kind(root)
    existed = kind == "file" and layout_text(root) is not None
    store = open_store(root, create=True)
    store.close()
    if kind == "postgresql":
        existed = not getattr(store.backend, "created", True)
    where = store.root or store.url
    if as_json:
        emit_json({"store": where, "created": not existed})
    else:
        echo(f"{'found' if existed else 'created'} store at {where}", fit=None)  # a path to copy whole


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
@json_option()
def log_cmd(session_id: str, as_json: bool) -> None:
    """Print a session's log records: line, op, seq, entry, head.

    A damaged line is reported on stderr (with its line) and the exit is 1;
    the good records before it are still printed.
    """
    store = read_store()
    session_id = resolve_session(store, session_id)
    history = store.history(session_id)
    records = history.records if history.tail_from is None else history.records[: history.tail_from]
    positions: list[tuple[int, int | None]] = (
        list(history.positions) if history.positions else [(i + 1, None) for i in range(len(records))]
    )
    if as_json:  # a record at a time (emit_json's bytes): never the whole document (220 megabytes at 100,000 entries)
        out = JsonStream(array=True)
        for d, (at, offset) in zip(records, positions):
            out.item({"line": at, "offset": offset, **d})
        out.end()
    else:
        page()
        rows = [["LINE", "OP", "SEQ", "ENTRY", "HEAD", "DETAIL"]]
        for d, (number, _) in zip(records, positions):
            op = d.get("op")
            rows.append([
                str(number),
                str(op),
                str(d["seq"]) if "seq" in d else "-",
                short_id(d["entry"]) if isinstance(d.get("entry"), str) else "-",
                _head_cell(d) if op in ("append", "head") else "-",
                _detail(d),
            ])
        for line in table(rows):
            echo(line, fit="cut")
    if history.tail is not None:
        note(f"session {session_id}: {history.tail}")
    if history.damage and as_json:
        # the records that read are on stdout; the damage is the error, with its code, and
        # each fault is a problem with the code fsck gives it
        fail(f"session {session_id}: {history.damage[0].message}", code="session_damaged",
             problems=[{**p.as_dict(), "where": "log", "session": session_id} for p in history.damage])
    for p in history.damage:
        echo(f"agentsession: error: session {session_id}: {p.message}", err=True)
    if history.damage:
        sys.exit(1)


# ---------------------------------------------------------------------------
# verify (a stored session)


def verify_session(target: Target, as_json: bool) -> None:
    store = _open_for_verify(target)
    sid = target.session_id
    assert sid is not None
    from agentsession_cas.maintenance.check import verify_stored

    with progressing("verifying", "lines") as bar:
        check = verify_stored(store, sid, as_export=True, progress=bar)  # as verify of its export says
    problems, notes, stats = check.problems, check.notes, check.stats
    ok = check.ok
    if as_json:
        emit_json({
            "source": target.arg,
            "store": store.root or store.url,
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
        echo(f"{sid}: {paint(where + p['message'], 'bad')}")
    for n in notes:
        echo(f"{sid}: note: {n['message']}")
    requests = {k: number(v) for k, v in (stats.get("requests") or {}).items()}
    echo(
        f"{sid}: {number(stats['records'])} log record(s), {number(stats['entries'])} own entries and "
        f"{number(stats['prefix'])} on the prefix, objects checked against their names; {number(len(problems))} problem(s)"
        + (
            f"; {requests['responses']} response(s): {requests['verified']} request hash(es) verified, "
            f"{requests['without_hash']} without a hash, {requests['failed']} failed"
            if requests
            else ""
        )
        + (f"; {number(stats['runs_checked'])} run(s) checked" if stats.get("runs_checked") is not None else "")
    )
    sys.exit(0 if ok else 1)


def _open_for_verify(target: Target) -> Store:
    """Like :func:`open_target`, but a damaged session is still verified (not refused)."""
    assert target.session_id is not None and target.root is not None
    try:
        store = read_store(target.root)
    except LayoutError as exc:
        if not target.via_path:
            fail(f"{target.arg}: no such file, nor a session: {exc}", code=exc.code)
        raise
    if not target.via_path:
        try:
            target.session_id = resolve_session(store, target.session_id)
        except DanglingRefError:
            raise  # as in open_target
        except NoSuchSessionError as exc:
            fail(f"{target.arg}: no such file, nor a session of the store at {target.root}", code=exc.code)
    if target.session_id not in store:
        raise NoSuchSessionError(f"no such session: {target.session_id}")
    if target.via_path:
        note(f"{target.arg} lies in session {target.session_id} of the store at {target.root}; verifying that session")
    return store


def projection_file(target: Target, progress: Progress | None = None) -> SessionFile:
    """The projection of a located session, read as a file (for ``show``)."""
    from agentsession_cas.format.reader import read_session_bytes

    _, session = open_target(target, files=True)
    return read_session_bytes(session.projection(), source=target.session_id or target.arg, progress=progress)


# ---------------------------------------------------------------------------
# export, import


@click.command()
@click.argument("session", metavar="ID")
@click.option("-o", "--output", metavar="FILE", help="Write the projection (and sidecar media beside it) to FILE.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "atif", "otel"]), default="jsonl", show_default=True,
              help="jsonl: the session file; atif: one ATIF document per path (a line each, or files in the "
                   "directory -o names); otel: the session as OTLP JSON spans (docs/projections.md).")
@click.option("--at", metavar="ENTRY", help="With --format atif or otel: the path to this entry only.")
@click.option("--redact-home", is_flag=True, help="Replace the home directory with ~ in every text (a redacted file).")
@click.option("--redact-env", is_flag=True, help="Empty every env entry, keeping its place (a redacted file).")
@click.option("--secret", "secrets", type=SECRET, metavar="REGEX", multiple=True,
              help="Replace each match with REDACTED (repeatable; a redacted file).")
@json_option("A summary, on stderr when the projection goes to stdout.")
@whole_pass
def export(session: str, output: str | None, fmt: str, at: str | None, redact_home: bool, redact_env: bool,
           secrets: tuple[str, ...], as_json: bool) -> None:
    """Print a session's projection (RFC 0002) to stdout, or write it to FILE.

    ID may also be a path inside the session's directory in a store, and, with
    --format atif or otel, a session file. With --redact-home, --redact-env or
    --secret the output is a redacted session file (RFC 0001): every hash and
    id recomputed, entry references re-pointed, the header marked redacted,
    with a session id of its own. It verifies against itself, never as the
    original, and no store imports it.
    """
    redacting = bool(redact_home or redact_env or secrets)
    refuse_output_in_store(output)
    if fmt != "jsonl":
        if as_json:
            raise click.UsageError(f"--json summarises the jsonl projection; --format {fmt} prints JSON itself")
        if redacting:
            raise click.UsageError(f"--redact-home, --redact-env and --secret write a redacted session file; --format "
                                   f"{fmt} would embed subsessions unredacted: export the redacted file, then project it")
        from agentsession_cas.format.reader import read_session_bytes

        from .projection_export import export_projection  # the reader and the projections: not for jsonl

        located = locate(session, files=True)
        if located.kind == "file":
            return export_projection(read_file_arg(located.arg), None, located.arg, fmt, at, output)
        store, s = open_target(located, files=True)
        return export_projection(read_session_bytes(s.projection(), source=s.id), store, session, fmt, at, output)
    if at is not None:
        raise click.UsageError("--at builds the projection at one entry: give it with --format atif or otel")
    target = locate(session, files=False)
    if target.kind == "file":
        if not os.path.lexists(target.arg):
            fail(f"{target.arg}: no such file, nor a session", code=NoSuchSessionError.code)
        fail(f"{target.arg} is not a session of a store (give a session id or a path inside <store>/sessions/<id>/)",
             code=NoSuchSessionError.code)
    options = None
    if redacting:
        from agentsession_cas.format.redact import RedactOptions

        home = None
        if redact_home:
            home = os.path.expanduser("~")
            if home == "~" or not os.path.isabs(home):
                fail("--redact-home: no home directory is known (set HOME)", code=RedactionError.code)
        options = RedactOptions(home=home, env=redact_env, secrets=secrets)
        options.rewriter()  # a bad pattern is refused before anything is read
    store, s = open_target(target, files=False)
    _say_where_it_went(store, s)
    if options is not None:
        from agentsession_cas.format.media import write_projection
        from agentsession_cas.format.reader import read_session_bytes
        from agentsession_cas.format.redact import redact

        data = s.projection()
        done = redact(read_session_bytes(data, source=s.id), options)
        note(f"redacted: {plural(len(done.ids), 'entry', 'entries')} rewritten as session {done.session_id}; "
             "it verifies against itself, never as the original")
        if output is None or output == "-":
            write_bytes(done.data)
        else:
            write_projection(output, done.data, done.session_id, store.export_blobs(s.id, data))
        if as_json:
            _export_summary(done.session_id, None, output, len(done.data))
        return
    if output is None or output == "-":
        written = [0]

        def joined(progress: Progress | None, total: int) -> Iterator[bytes]:
            done = 0
            for lines in s.projection_chunks():
                data = b"".join(lines)
                written[0] += len(data)
                done += len(lines)
                if progress is not None:
                    progress(done, max(total, done))
                yield data

        # a progress line only when the bytes go elsewhere than the terminal it is drawn on
        with progressing("exporting", "entries") as bar:
            write_stream(joined(None if stdout_is_tty() else bar, 1 + len(s.prefix) + len(s)))
        if as_json:
            _export_summary(s.id, s.head, None, written[0])
    else:
        with progressing("exporting", "entries") as bar:
            skipped = store.export_to(s.id, output, progress=bar)
        if skipped:
            note(f"{skipped} sidecar blob{'s' if skipped != 1 else ''} not written: {output} is not a regular file, "
                 "so there is no directory beside it")
        if as_json:
            st = os.stat(output)
            _export_summary(s.id, s.head, output, st.st_size if stat.S_ISREG(st.st_mode) else None)


def _export_summary(session: str, head: str | None, output: str | None, size: int | None) -> None:
    """export --json: one object on stdout when the projection went to a file, on stderr
    when it went to stdout (the bytes are the output there)."""
    summary = {"session": session, "head": head, "output": output, "bytes": size}
    if output is None or output == "-":
        click.echo(json.dumps(summary, ensure_ascii=False), err=True)
    else:
        emit_json(summary)


def _say_where_it_went(store: Store, s: Session) -> None:
    """A note naming the successor of a superseded session (and the chain's current one)."""
    successor = s.superseded_by
    if successor is None:
        return
    try:
        chain = store.resolve_current(s.id)
    except ContinuationError as exc:
        note(f"session {s.id} was continued in {successor}; {exc}")
        return
    where = f"session {s.id} was continued in {successor}"
    if chain.current != successor:
        where += f"; the chain's current session is {chain.current}"
    if chain.missing is not None:
        where += f" (which names {chain.missing}, not in this store)"
    note(where + "; this is the superseded record")


@click.command("import")
@click.argument("file", type=str)  # no stat() of a name holding NUL
@click.option("--record", is_flag=True, help="Hold it as a record (appendable here), not a mirror.")
@json_option()
@whole_pass
def import_cmd(file: str, record: bool, as_json: bool) -> None:
    """Import a session file; print the new session's id.

    FILE may be - for standard input.
    The session is a mirror (it refuses local appends and head moves)
    unless --record is given. When the file's resume rule lands where no
    head may rest (a leaf label), a note says so and names the head held.
    """
    from agentsession_cas.format.reader import read_if_stream  # the rule set: not for head or list

    with write_store() as store:
        # a file is read by bytes (as verify FILE), standard input, or a file that is no regular
        # file (a pipe, a FIFO: it can be read only once), held whole and read by lines: read
        # once the store is open, so a wrong --store leaves the stream for the next try
        held = read_stdin() if file == "-" else read_if_stream(file)
        with progressing("importing", "bytes" if held is None else "lines") as bar:
            session = _import_into(store, file, held, record, bar)
        adjusted = session.head_adjusted
        kept = session.header_findings
        facts = {"session": session.id, "entries": len(session), "prefix": len(session.prefix),
                 "head": session.head, "mark": session.mark,
                 "head_adjusted": adjusted.as_dict() if adjusted is not None else None,
                 "warnings": [dict(p.as_dict(), severity="warning") for p in kept]}  # (kept: fsck's severity)
    if as_json:
        emit_json(facts)
    else:
        echo(str(facts["session"]), fit=None)
        source = "<stdin>" if file == "-" else file
        if adjusted is not None:
            note(f"{source}: {adjusted.message}")
        for p in kept:
            note(kept_member_note(source, p))
    end_at_once_after()  # the session and its objects are durable, the store closed


def _import_into(store: Store, file: str, held: bytes | None, record: bool, bar: Any) -> Session:
    """The session ``import`` makes, from bytes already read (standard input, a pipe) or the file."""
    if held is not None:
        return store.import_bytes(held, record=record, source="<stdin>" if file == "-" else file, progress=bar)
    return store.import_file(file, record=record, progress=bar)


# ---------------------------------------------------------------------------
# create, append, head


@click.command()
@click.option("--base", metavar="H",
              help="Fork from entry H (its id, or a unique prefix of 4+ hex digits), which the store holds, "
                   "or from the head of session H.")
@click.option("--header", "header_file", metavar="FILE", help="Take the header from FILE (a JSON object; - for stdin).")
@click.option("--id", "new_id", metavar="ID", help="The session id (default: a new uuid, or the header's).")
@click.option("--link", "fork_link", is_flag=True,
              help="With --base: also append a fork_of link naming the session the fork was made from.")
@json_option()
def create(base: str | None, header_file: str | None, new_id: str | None, fork_link: bool, as_json: bool) -> None:
    """Create a session (a record) and print its id.

    --base H is an entry (its id or a unique prefix) or a session's id, for its
    head. A fork whose header names no parent_session gets the session named,
    or the one holding the entry; --link also records that session in a
    fork_of link, the fork's first entry.

    \b
    Example (a fork of session ID at its head, to try another turn from there):
      agentsession create --id ID-retry --base ID --link
    """
    if fork_link and base is None:
        raise click.UsageError("--link records the session a fork was made from: give --base")
    if new_id is not None:
        check_session_id(new_id)  # (before the header: '--id ""' is a bad id, not a header without one)
    if header_file is not None:
        if header_file == "-":
            data = _stdin_json("header")
        else:
            with open(header_file, "rb") as f:
                data = _json_object(f.read(), header_file, "a header")
        if not isinstance(data, dict):
            fail(f"{header_file}: the header must be a JSON object", code=BAD_INPUT)
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
        if base is not None:  # (a session's head, or an entry named among every entry the store holds)
            entry, of = resolve_base(store, base)
            data = {**header.data, "base": entry}
            if of is not None and data.get("parent_session") is None:
                data["parent_session"] = of  # the session named, which the store's holder of a prefix entry is not
            header = Header(data)
        s = store.create(header)
        if fork_link:
            origin = s.header.data.get("parent_session")
            if not isinstance(origin, str) or not origin:
                fail("--link: the header's parent_session is not a session id", code=BadNameError.code)
            s.append(fork_of_link(origin))
        facts = {"session": s.id, "base": s.base, "head": s.head, "mark": s.mark}
    if as_json:
        emit_json(facts)
    else:
        echo(str(facts["session"]), fit=None)


_OUTCOME_NOTES = {
    "branched": "the parent is not the head: the entry starts a branch and the head stays at {head}",
    "no-op": "the log already holds this entry; nothing was written",
}


@click.command()
@click.argument("session_id", metavar="ID")
@json_option()
def append(session_id: str, as_json: bool) -> None:
    """Append one entry, given as a JSON object on stdin, and print its id.

    The entry may carry its id (it must match the hash) or not; `parent`
    defaults to the head and `ts` to now. The append is committed before
    the command exits.

    \b
    Example (a user message, appended at the head of session ID):
      echo '{"type": "item", "item": {"type": "message", "role": "user", "content": "hi"}}' \\
        | agentsession append ID
    """
    if terminal.isatty(sys.stdin):  # a person is to type the entry: a name naming no session is said first
        with read_store() as store:
            resolve_session(store, session_id)
    obj = _stdin_json("entry")
    if not isinstance(obj, dict):
        fail("stdin holds JSON but not an object; an entry is one JSON object", code=BAD_INPUT)
    with write_store() as store:
        session = store.session(resolve_session(store, session_id))
        for p in session.recovered:
            note(f"{p.code}: {p.message}")
        result = session.append(obj)
    if as_json:
        emit_json(result.as_dict())
        return
    echo(result.id, fit=None)
    if result.outcome in _OUTCOME_NOTES:
        note(_OUTCOME_NOTES[result.outcome].format(head=short_id(result.head) if result.head else "none"))
    if result.note:
        note(result.note)
    for ref in result.unresolved:
        note(f"unresolved reference {ref} (kept; a store reports it and does not refuse)")
    for f in result.findings:
        note(f"{f.code}: {f.message} (stored, as a store keeps a model's output; verify counts it as failed)")
    for n in result.notes:
        note(f"{n.code}: {n.message}")


@click.command()
@click.argument("session_id", metavar="ID")
@click.argument("new", metavar="[NEW]", required=False)
@click.option("--expect", "expected", metavar="OLD", help="The head you expect (compare-and-swap); '' for no head.")
@json_option()
def head(session_id: str, new: str | None, expected: str | None, as_json: bool) -> None:
    """Print a session's head (nothing when it has none), or move it with NEW --expect OLD.

    NEW '' sets no head (only a session without a base may have none).
    """
    if new is None:
        if expected is not None:
            raise click.UsageError("--expect goes with NEW, the head to set")
        store = read_store()
        session_id = resolve_session(store, session_id)
        current = store.read(session_id).head
        if as_json:
            emit_json({"session": session_id, "head": current})
        elif current is not None:
            echo(current, fit=None)
        return
    if expected is None:
        raise click.UsageError("moving the head needs --expect OLD (the head you expect; '' for no head)")
    with write_store() as store:
        session_id = resolve_session(store, session_id)
        session = store.session(session_id)
        for p in session.recovered:
            note(f"{p.code}: {p.message}")
        # NEW and OLD: full ids or unique prefixes of entries the session holds.
        new_id = resolve_entry(session, new) if new else None
        expected_id = resolve_entry(session, expected) if expected else None
        session.set_head(new_id, expected=expected_id)
        moved_to = session.head
    if as_json:
        emit_json({"session": session_id, "head": moved_to, "previous": expected_id})


# ---------------------------------------------------------------------------
# cat-object, delete


@click.command("cat-object")
@click.argument("name", metavar="HASH")
@click.option("-t", "show_space", is_flag=True, help="Print the object's space (entries, contents, blobs) instead.")
@json_option()
def cat_object(name: str, show_space: bool, as_json: bool) -> None:
    """Print an object's bytes, verified against its name (sha256:<64 hex>, or a unique prefix of 4+ hex digits)."""
    if _HEX64.fullmatch(name):
        name = "sha256:" + name
    store = read_store()
    name = resolve_object(store, name)
    space, data = store.cat_object(name)
    if as_json:
        out: dict[str, Any] = {"object": name, "space": space, "size": len(data)}
        if space == "blobs":
            out["base64"] = base64.b64encode(data).decode("ascii")
        else:
            out["json"] = loads(data)  # envelopes and contents are canonical JSON, verified above
        emit_json(out)
    elif show_space:
        echo(space, fit=None)
    else:
        write_bytes(data)


@click.command()
@click.argument("session_id", metavar="ID")
@json_option()
def delete(session_id: str, as_json: bool) -> None:
    """Delete a session (its objects stay; other sessions may share them).

    Prints what was deleted, and warns of refs that named the session (they
    dangle now; `ref delete` removes one).
    """
    with write_store() as store:
        session_id = resolve_session(store, session_id)
        head: str | None = None
        try:
            snapshot = store.read(session_id)
            head = snapshot.head
            snapshot.close()
        except NoSuchSessionError:
            raise
        except AgentSessionError:
            pass  # a damaged session is deleted all the same; its head is not known
        store.delete(session_id)
        dangling = sorted(r.name for r in Refs(store).list() if r.session == session_id)
    if as_json:
        emit_json({"session": session_id, "deleted": True, "head": head, "dangling_refs": dangling})
        return
    echo(f"deleted {session_id} (head {head or 'none'})", fit=None)
    for name in dangling:
        note(f"ref {name} named {session_id} and dangles now; `agentsession ref delete {name}` removes it")


@click.command("rev-parse")
@click.argument("name", metavar="SESSION")
@click.argument("entry", metavar="[ENTRY]", required=False)
@json_option()
def rev_parse(name: str, entry: str | None, as_json: bool) -> None:
    """Print the session id a name resolves to (and an entry's full id)."""
    store = read_store()
    sid = resolve_session(store, name)
    entry_id = None
    if entry is not None:
        with store.read(sid) as s:
            entry_id = resolve_entry(s, entry)
    if as_json:
        emit_json({"session": sid, "entry": entry_id})
        return
    echo(sid, fit=None)
    if entry_id is not None:
        echo(entry_id, fit=None)


COMMANDS = [init, log_cmd, export, import_cmd, create, append, head, cat_object, delete, rev_parse]
