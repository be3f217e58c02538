"""The commands over a session file (or a stored session by id): show, verify, hash-object."""

from __future__ import annotations

import os
import sys

import click

from agentsession_cas import (
    AgentSessionError,
    EntryError,
    SessionFile,
    SessionFormatError,
    entry_hashes,
    loads,
    short_id,
)
from agentsession_cas.errors import ContextError
from agentsession_cas.format.context import (
    NULL_CONTEXT_HASH,
    Context,
    build_context,
    context_hashes,
)
from agentsession_cas.format.reader import split_lines
from agentsession_cas.format.rules import RULES, VerifyReport, verify_session
from agentsession_cas.format.runs import render_runs

from . import fsck_command, store_commands
from .common import echo, emit_json, plural, table
from .describe import describe, describe_item, settings_rows

# ---------------------------------------------------------------------------
# show


def _children_counts(sf: SessionFile) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in sf.entries:
        if e.parent is not None:
            counts[e.parent] = counts.get(e.parent, 0) + 1
    return counts


def _context_at(sf: SessionFile, leaf: str | None) -> tuple[Context | None, str | None]:
    """The context at the leaf (the empty context at the universal root), or why not."""
    try:
        return build_context(sf.tree.path(leaf) if leaf is not None else []), None
    except ContextError as exc:
        return None, str(exc)


def _print_context(leaf: str | None, ctx: Context | None, error: str | None, context_hash: str) -> None:
    at = short_id(leaf) if leaf is not None else "the root"
    if ctx is None:
        echo(f"context at {at}: not built: {error}")
        return
    echo(f"context at {at}: {plural(len(ctx.items), 'item')} from {plural(len(ctx.entries), 'entry', 'entries')}")
    rows = [[k, v] for k, v in settings_rows(ctx.settings)]
    rows.append(["context hash", context_hash])
    for line in table(rows):
        echo("  " + line)
    for i, (item, entry) in enumerate(zip(ctx.items, ctx.item_entries), start=1):
        echo(f"  {i:>3}  {short_id(entry.id)}  {describe_item(item)}")
    for o in ctx.omitted:
        echo(f"  left out ({o.reason})  {short_id(o.entry.id)}  {describe_item(o.entry.get('item'))}")
    for r in ctx.replaced:
        what = f"{r.parts} image part(s)" if r.reason == "images" else "its output"
        echo(f"  placeholder ({r.reason})  {short_id(r.entry.id)}  {what} sent as placeholder text")


@click.command()
@click.argument("file", metavar="FILE|ID", type=str)  # not click.Path: its stat() of a name holding NUL raised ValueError
@click.option("--leaf", "leaf_name", metavar="ID", help="Entry to treat as the leaf: a full id, a legacy id or a unique hex prefix.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("-v", "--verbose", is_flag=True, help="Show the data of custom and extension entries.")
@click.option("--runs", "show_runs", is_flag=True, help="Also print the runs on the leaf's path: reasons, calls and their states.")
@click.option("-n", "--first", "first", type=click.IntRange(min=0), metavar="N", help="List only the first N entries (the text listing).")
@click.option("--tail", "last", type=click.IntRange(min=0), metavar="N", help="List only the last N entries (the text listing).")
def show(
    file: str, leaf_name: str | None, as_json: bool, verbose: bool, show_runs: bool, first: int | None, last: int | None
) -> None:
    """Print a session's entries in file order, then the context at its leaf.

    The context is what a model call appended at the leaf (or at --leaf ID)
    would be sent: the settings in force, then each item with the entry it
    came from, and the items the omit setting leaves out.

    FILE|ID is a session file, a session id in the store, or a path inside
    a session's directory in a store. A stored session is shown as its
    projection (what `export` prints) would be.
    """
    target = store_commands.locate(file, files=True)
    if target.kind == "file":
        sf = store_commands.read_file_arg(file)
    else:
        sf = store_commands.projection_file(target)
        file = sf.source
    leaf = sf.resolve(leaf_name).id if leaf_name else sf.leaf
    path = [e.id for e in sf.tree.path(leaf)] if leaf is not None else []
    ctx, ctx_error = _context_at(sf, leaf)
    # Every entry's context hash for --json; for text, the leaf's alone (its path).
    chashes = context_hashes(sf.entries if as_json else sf.tree.path(leaf) if leaf is not None else [])
    leaf_hash = chashes.get(leaf, NULL_CONTEXT_HASH) if leaf is not None else NULL_CONTEXT_HASH
    truncated = (
        {"line": sf.truncated.line, "error": sf.truncated.message} if sf.truncated is not None else None
    )
    # The runs on the leaf's path, with the record problems the one check of the file finds on it.
    runs = verify_session(sf).runs_report(leaf) if (show_runs or as_json) and sf.entries else None
    if as_json:
        emit_json(
            {
                "source": file,
                "header": sf.header.data,
                "migrated": sf.migrated,
                "entries": [
                    {
                        "id": e.id,
                        "type": e.type,
                        "parent": e.parent,
                        "line": e.line,
                        "content_hash": e.content_hash,
                        **({"context_hash": chashes[e.id]} if e.id in chashes else {}),
                        **({"legacy_id": e.legacy_id} if e.legacy_id else {}),
                    }
                    for e in sf.entries
                ],
                "leaf": leaf,
                "path": path,
                "context": ctx.as_dict() if ctx is not None else None,
                **({"context_error": ctx_error} if ctx_error is not None else {}),
                "context_hash": leaf_hash,
                "runs": runs.as_dict() if runs is not None else None,
                "truncated": truncated,
                "problems": [p.as_dict() for p in sf.problems],
            }
        )
        return
    h = sf.header
    tree = sf.tree
    info = [["session", h.id or "-"], ["format", f"{h.format} ({h.payload or '-'})" + (" migrated in memory" if sf.migrated else "")]]
    if h.created_at:
        info.append(["created", str(h.created_at)])
    if h.harness:
        info.append(["harness", f"{h.harness.get('name', '')} {h.harness.get('version', '')}".strip()])
    if h.data.get("cwd"):
        info.append(["cwd", str(h.data["cwd"])])
    if h.data.get("parent_session"):
        info.append(["parent", str(h.data["parent_session"])])
    if h.base:
        info.append(["base", short_id(h.base)])
    if h.records:
        info.append(["records", ", ".join(h.records)])
    if "media" in h.data:
        info.append(["media", h.media])
    info.append(
        [
            "entries",
            f"{len(sf.entries)} in {len(tree.roots())} root(s), {len(tree.leaves())} leaf(s), leaf {short_id(leaf)}",
        ]
    )
    for line in table([[k, v] for k, v in info]):
        echo(line)
    if sf.entries:
        counts = _children_counts(sf)
        labels: dict[str, str] = {}
        for e in sf.entries:
            if e.type == "label" and isinstance(e.get("target"), str):
                labels[e.get("target")] = e.label or ""
        rows = [["LINE", "ID", "PARENT", "TYPE", "SUMMARY"]]
        listed = sf.entries
        if first is not None:
            listed = listed[:first]
        if last is not None:
            listed = listed[len(listed) - last:] if last else []
        for e in listed:
            marks = []
            if counts.get(e.id, 0) > 1:
                marks.append(f"fork\u00d7{counts[e.id]}")
            if counts.get(e.id, 0) == 0:
                marks.append("leaf")
            if labels.get(e.id):
                marks.append(f"[{labels[e.id]}]")
            if e.parents:
                marks.append(f"converges {len(e.parents)}")
            summary = describe(e, verbose)
            if marks:
                summary += "  " + " ".join(marks)
            rows.append([str(e.line), short_id(e.id), short_id(e.parent), e.type, summary])
        echo()
        for line in table(rows):
            echo(line)
        if len(listed) < len(sf.entries):
            echo(f"({len(listed):,} of {plural(len(sf.entries), 'entry', 'entries')} listed)")
    echo()
    if leaf is None:
        echo("leaf -  (the universal root: the next entry is a root)" if sf.entries else "leaf -  (no entries)")
    else:
        how = "given" if leaf_name else "by the resume rule"
        echo(f"leaf {short_id(leaf)}  ({how}; {plural(len(path), 'entry', 'entries')} on its path)")
    if sf.entries:
        echo()
        _print_context(leaf, ctx, ctx_error, leaf_hash)
    if runs is not None:
        echo()
        for line in render_runs(runs):
            echo(line)
    if sf.problems or sf.truncated is not None:
        echo()
    for p in sf.problems:
        echo(f"problem: {p}")
    if sf.truncated is not None:
        echo(f"truncated: {sf.truncated} (not loaded)")


# ---------------------------------------------------------------------------
# verify


def _summary(sf: SessionFile, report: VerifyReport) -> str:
    if sf.migrated:
        how = f"migrated from {sf.header.format}: ids assigned in memory, not checked"
    else:
        how = "each id checked against its hash"
    counts = report.counts()
    return (
        f"{plural(len(sf.entries), 'entry', 'entries')} read, {how}; {len(report.problems)} problem(s); "
        f"{counts['responses']} response(s): {counts['verified']} request hash(es) verified, "
        f"{counts['without_hash']} without a hash, {counts['failed']} failed; {report.runs_checked} run(s) checked"
    )


@click.command()
@click.argument("file", metavar="[FILE|ID]", required=False, type=str)  # as show: no stat() of a name holding NUL
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def verify(file: str | None, as_json: bool) -> None:
    """Check a session file or a stored session; exit 1 on any problem.

    For a file: each entry's id is recomputed from its members, its ts form
    and I-JSON checked, and the parent, parents and base rules applied; then
    the request of every response is rebuilt from its path and its
    request_hash checked (a response without one is counted, never called
    verified), and every compaction's first_kept is looked up on its path.
    For a stored session (an id, or a path inside its directory): its log
    checksums, every object it needs present and hashing to its name, then
    its projection as a file. With no argument: the whole store, as `fsck`.
    """
    if file is None:
        sys.exit(fsck_command.run_fsck(as_json))
    target = store_commands.locate(file, files=True)
    if target.kind == "session":
        store_commands.verify_session(target, as_json)
        return
    arg, file = file, ("<stdin>" if file == "-" else file)  # what messages name
    try:
        sf = store_commands.read_file_arg(arg)
    except SessionFormatError as exc:
        problems = exc.problems
        if as_json:
            emit_json({"source": file, "ok": False, "entries": 0, "migrated": False,
                        "problems": [p.as_dict() for p in problems], "notes": []})
        else:
            for p in problems:
                echo(f"{file}: {p}")
        sys.exit(1)
    report = verify_session(sf)
    if as_json:
        emit_json(report.as_dict())
        sys.exit(0 if report.ok else 1)
    for p in report.problems:  # line, tree and context problems; a failed request hash is its response's line
        if p.code not in ("request_hash", "empty") and RULES[p.code].scope != "record":
            echo(f"{file}: {p}")
    for p in report.of_scope("record"):
        echo(f"{file}: records  ERROR {p}")
    for c in report.requests:
        echo(f"{file}: response {short_id(c.entry.id)}: {c.message()}")
    for note in report.notes:
        echo(f"{file}: note: {note}")
    if report.empty:
        echo(f"nothing to verify: {file} holds a header and no entries")
        sys.exit(1)
    echo(f"{file}: {_summary(sf, report)}")
    sys.exit(0 if report.ok else 1)


# ---------------------------------------------------------------------------
# hash-object


@click.command("hash-object")
@click.argument("file", default="-", type=str)  # no stat() of a name holding NUL
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of text.")
def hash_object(file: str, as_json: bool) -> None:
    """Print the computed id and content hash of each entry line in FILE (or stdin).

    A header line is skipped. Each output line is `ID CONTENT_HASH`, and
    `!` is appended when the line states a different id. A line that cannot
    be hashed is reported on stderr with its number, and the exit is 1.
    """
    if file == "-":
        data = sys.stdin.buffer.read()
    else:
        if os.path.isdir(file):
            raise IsADirectoryError(21, "is a directory", file)
        with open(file, "rb") as f:
            data = f.read()
    results = []
    failed = 0
    for lineno, raw in enumerate(split_lines(data), start=1):
        if not raw.strip():
            continue
        try:
            obj = loads(raw.decode("utf-8"))
            if not isinstance(obj, dict):
                raise EntryError("the line is not a JSON object")
            if obj.get("type") == "session":
                continue
            eid, chash = entry_hashes(obj, parsed=True)
        except (ValueError, AgentSessionError) as exc:
            reason = "not valid UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc)
            echo(f"agentsession: line {lineno}: {reason}", err=True)
            failed += 1
            continue
        stated = obj.get("id")
        results.append({"line": lineno, "id": eid, "content_hash": chash, "stated_id": stated, "matches": stated == eid})
    if as_json:
        emit_json(results)
    else:
        for r in results:
            flag = "" if r["matches"] or r["stated_id"] is None else "  !"
            echo(f"{r['id']} {r['content_hash']}{flag}")
    if failed:
        sys.exit(1)


COMMANDS: list[click.Command] = [show, verify, hash_object]
