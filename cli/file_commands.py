"""The commands over a session file (or a stored session by id): show, verify, hash-object."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import IO, Any

import click

from agentsession_cas import (
    AgentSessionError,
    EntryError,
    SessionFile,
    SessionFormatError,
    entry_hashes,
    short_id,
)
from agentsession_cas.errors import ContextError, ContinuationError, Problem
from agentsession_cas.format.codes import problem
from agentsession_cas.format.context import (
    NULL_CONTEXT_HASH,
    ContextBuilder,
    ContextHasher,
    build_context,
)
from agentsession_cas.format.entry import Entry, Header
from agentsession_cas.format.links import CalleeLink, render_links, successor_of
from agentsession_cas.format.reader import Parking, split_lines, verify_bytes, verify_file
from agentsession_cas.format.results import Context, RunsReport, VerifyReport
from agentsession_cas.format.rules import RULES, parse_line
from agentsession_cas.format.runs import render_runs
from agentsession_cas.store import Session
from agentsession_cas.store.session import ProjectionOutline
from agentsession_cas.store.showing import OnEntry, PathWalk, ShowRead, path_links

from . import fsck_command, store_commands, terminal
from .common import (
    JsonStream,
    Made,
    echo,
    echo_lines,
    emit_json,
    fail,
    indented,
    json_option,
    number,
    plural,
    read_stdin,
    table,
    table_line,
    when,
    whole_pass,
)
from .common import note as say_note
from .describe import describe, describe_item, settings_rows
from .terminal import paint, progressing, visible
from .terminal import start_pager as page

# ---------------------------------------------------------------------------
# show


def _follow(name: str, remote: str | None, as_json: bool, verbose: bool) -> None:
    """show -f: each committed entry of a session as one line, as it commits, from a store
    (read every tenth of a second, what was written since) or a server (its durable follow
    stream; a store opened over HTTP is followed so too)."""
    # Exchange and its transports are loaded only by a follow: `show FILE` stays light.
    from agentsession_cas.exchange.following import follow_remote, follow_store
    from agentsession_cas.exchange.local import open_transport
    from agentsession_cas.store.names import resolve_session
    from agentsession_cas.store.url import open_store

    if remote is not None and remote[:8].lower().startswith(("http://", "https://")):
        changes = follow_remote(open_transport(remote), name)
    else:
        store = open_store(remote, readonly=True) if remote is not None else store_commands.read_store()
        changes = follow_store(store, resolve_session(store, name))
    for change in changes:
        e = change.entry
        if as_json:
            echo(json.dumps({"change": change.kind, "session": change.session, "head": change.head,
                             "entry": e.data if e is not None else None}, ensure_ascii=True, separators=(",", ":")),
                 fit=None)  # one JSON document a line
        elif e is not None:
            marks = "  (head)" if change.head == e.id else ""
            echo(f"{short_id(e.id)}  {short_id(e.parent)}  {e.type:<10} {describe(e, verbose)}{marks}")
        elif change.kind == "reset":
            echo(f"-- the log was rewritten (a repair, records taken back): the lines above are void; its entries follow afresh "
                 f"(head {short_id(change.head)})")
        else:
            echo(f"head -> {short_id(change.head)}")


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


#: How a context item's description is held until the context is printed (a lone surrogate too).
_SAID = ("utf-8", "surrogatepass")


def _print_context(leaf: str | None, ctx: Context | None, error: str | None, context_hash: str,
                   said: Mapping[str, bytes] | None = None, read: Callable[[], None] | None = None) -> None:
    """The context's settings and items. ``said``: an entry's id -> the
    :func:`describe_item` of the item it puts in the context (an item entry's item, a
    branch summary's summary), made as the entry was listed (an item sent as it was
    recorded is not read again), in UTF-8 (:data:`_SAID`: held for every item of a long
    path, it takes half a text's room); ``read()`` is called after any other item is read
    (a stored session's entries, parked, are parked again)."""
    at = short_id(leaf) if leaf is not None else "the root"
    if ctx is None:
        echo(f"context at {at}: not built: {error}")
        return
    echo(f"context at {at}: {plural(len(ctx.items), 'item')} from {plural(len(ctx.entries), 'entry', 'entries')}")
    rows = [[k, v] for k, v in settings_rows(ctx.settings)]
    rows.append(["context hash", context_hash])
    for line in table(rows):
        echo("  " + line)

    replaced = {r.entry.id for r in ctx.replaced}

    def lines() -> Iterator[str]:
        for i, entry in enumerate(ctx.item_entries):
            held = said.get(entry.id) if said is not None and entry.id not in replaced else None
            text = held.decode(*_SAID) if held is not None else None
            if text is None:
                text = describe_item(ctx.items[i])
                if read is not None:
                    read()
            yield f"  {i + 1:>3}  {short_id(entry.id)}  {text}"

    echo_lines(lines())
    echo_lines(f"  left out ({o.reason})  {short_id(o.entry.id)}  {describe_item(o.entry.get('item'))}" for o in ctx.omitted)
    for r in ctx.replaced:
        what = f"{r.parts} image part(s)" if r.reason == "images" else "its output"
        echo(f"  placeholder ({r.reason})  {short_id(r.entry.id)}  {what} sent as placeholder text")


@click.command()
@click.argument("file", metavar="FILE|ID", type=str)  # not click.Path: its stat() of a name holding NUL raised ValueError
@click.option("--leaf", "leaf_name", metavar="ID", help="Entry to treat as the leaf: a full id, a legacy id or a unique hex prefix.")
@json_option()
@click.option("-v", "--verbose", is_flag=True, help="Show the data of custom and extension entries.")
@click.option("--runs", "show_runs", is_flag=True, help="Also print the runs on the leaf's path: reasons, calls and their states.")
@click.option("-n", "--first", "first", type=click.IntRange(min=0), metavar="N", help="List only the first N entries (the text listing).")
@click.option("--tail", "last", type=click.IntRange(min=0), metavar="N", help="List only the last N entries (the text listing).")
@click.option("-f", "--follow", is_flag=True, help="Follow the stored session ID: print its entries, then each one as it commits, until interrupted.")
@click.option("--remote", metavar="REMOTE", help="With -f: follow ID at REMOTE (an http(s):// server or a store's path).")
@click.option("--graph", is_flag=True, help=(
    "Draw the entry tree as `git log --graph` does, oldest first: one line per entry (type and "
    "summary), branches in lanes, labels, the fork's base and the head marked."))
def show(
    file: str, leaf_name: str | None, as_json: bool, verbose: bool, show_runs: bool, first: int | None, last: int | None,
    follow: bool, remote: str | None, graph: bool,
) -> None:
    """Print a session's entries in file order, then the context at its leaf.

    The context is what a model call appended at the leaf (or at --leaf ID)
    would be sent: the settings in force, then each item with the entry it
    came from, and the items the omit setting leaves out.

    FILE|ID is a session file (- for standard input), a session
    id in the store, or a path inside a session's directory in a store. A stored session is shown as its
    projection (what `export` prints) would be.

    With --graph, the entries are drawn as a tree instead (docs/cli.md).
    """
    if graph:
        given = [opt for opt, value in (("--leaf", leaf_name), ("--runs", show_runs), ("-n", first), ("--tail", last),
                                        ("-f", follow), ("--remote", remote)) if value not in (None, False)]
        if given:
            raise click.UsageError(f"--graph draws every entry and no context: it does not go with {', '.join(given)}")
        _draw_graph(file, as_json, verbose)
        return
    if remote is not None and not follow:
        raise click.UsageError("--remote goes with -f (follow)")
    if follow:
        _follow(file, remote, as_json, verbose)
        return
    target = store_commands.locate(file, files=True)
    if target.kind == "session":
        _, session = store_commands.open_target(target, files=True)
        if _show_session(session, target.session_id or target.arg, leaf_name, as_json, verbose, first, last, show_runs):
            return
    if as_json:
        _show_json(target, file, leaf_name)
        return
    _show_read(target, file, leaf_name, verbose, show_runs, first, last)


@whole_pass
def _show_session(session: Session, source: str, leaf_name: str | None, as_json: bool, verbose: bool,
                  first: int | None, last: int | None, runs: bool) -> bool:
    """show of a stored session in one walk, no verify first (docs/cli.md: what show trusts
    of a store), the leaf known before it (:func:`_stored_leaf`); False, nothing printed,
    when only the entries resolve the ``--leaf`` name (then it is read as a file is)."""
    outline = session.projection_outline()
    known, leaf = _stored_leaf(session, outline, leaf_name)
    if not known:
        return False
    if as_json:
        _show_json_stored(session, outline, leaf, source)
    else:
        page()
        _show_stored(session, outline, leaf, leaf_name, verbose, first, last, runs)
    return True


def _stored_leaf(session: Session, outline: ProjectionOutline, name: str | None) -> tuple[bool, str | None]:
    """The leaf of a stored session, known before its one walk: the head (the projection's
    resume rule names it: its marker sees to it), or the entry a full id names; not known
    (False) for another name, a prefix or a ``legacy_id``, which only the entries resolve
    (then the session is read as a file is)."""
    if name is None:
        return True, session.head if len(outline) else None
    return (True, name) if name in outline.index else (False, None)


def _current(session: Session, successor: str | None) -> str | None:
    """The chain's current session when the session was continued in ``successor``."""
    if successor is None:
        return None
    try:
        return session.store.resolve_current(session.id).current
    except ContinuationError as exc:
        say_note(str(exc))
        return None


def _read(target: store_commands.Target, file: str, *, hashes: bool = False,
          on_start: Callable[[Header], None] | None = None, on_entry: OnEntry | None = None,
          paths: bool = True) -> tuple[ShowRead, Session | None]:
    """The session ``show`` names, read once as ``verify`` reads it (:mod:`agentsession_cas.store.showing`),
    with the stored session when it is one; a file's with ``paths=False`` by the line and
    tree rules alone (:func:`~agentsession_cas.store.showing.read_file`'s)."""
    from agentsession_cas.store import showing

    if target.kind == "file":
        if file == "-":
            with progressing("reading", "lines") as bar:
                return showing.read_bytes(read_stdin(), source="<stdin>", hashes=hashes, on_start=on_start,
                                          on_entry=on_entry, progress=bar), None
        with progressing("reading", "bytes") as bar:
            return showing.read_file(file, hashes=hashes, on_start=on_start, on_entry=on_entry, progress=bar,
                                     paths=paths), None
    _, session = store_commands.open_target(target, files=True)
    with progressing("reading", "lines") as bar:
        return showing.read_stored(session, source=target.session_id or target.arg, hashes=hashes, on_start=on_start,
                                   on_entry=on_entry, progress=bar), session


def _continued(read: ShowRead, session: Session | None) -> tuple[str | None, str | None, Callable[[str], bool] | None]:
    """Where the session went (its own ``continued_in`` links), the chain's current session
    when a store says, and whether the store holds a session (None for a file)."""
    successor = successor_of(read.links)
    if session is None:
        return successor, None, None
    return successor, _current(session, successor), session.store.__contains__


@whole_pass
def _show_json(target: store_commands.Target, file: str, leaf_name: str | None) -> None:
    """show --json of a file, or of a stored session whose ``--leaf`` only its entries resolve
    (:func:`_show_json_stored` has the rest): the document written as the session is read,
    the entries as they come (a ``--leaf`` name is known good only at the end: then the
    document is spooled first)."""
    out = JsonStream(spool=leaf_name is not None)
    source = file if target.kind == "file" else target.session_id or target.arg
    read, session = _read(target, file, hashes=True, on_start=lambda header: _json_start(out, source, header),
                          on_entry=lambda e, chash: out.item(_json_row(e, chash)))
    out.close_list()
    report, outline = read.report, read.outline
    assert report is not None and read.hashes is not None
    leaf = read.leaf(leaf_name)
    on_path = outline.path(leaf) if leaf is not None else []
    leaf_hash = read.hashes.get(leaf) if leaf in read.hashes else NULL_CONTEXT_HASH
    read.hashes = None  # (every entry's was written: the leaf's is all that is left to say)
    parking = read.parking()
    # the path walked again for its runs, its entries parked as they go; the checker then
    # stands on it, its context builder holding the context at the leaf
    runs = report.runs_report(leaf, settle=parking.settle, tidy=parking.tidy, path=read.path_entries(on_path)) if len(outline) else None
    try:
        ctx, ctx_error = report.context_at(leaf, hold_items=False), None
    except ContextError as exc:
        ctx, ctx_error = None, str(exc)
    out.member("leaf", leaf)
    out.member("path", [outline.ids[p] for p in on_path])
    out.tidy = parking.tidy  # each item of the context read, its entry parked again
    _json_end(out, ctx, ctx_error, leaf_hash, lambda: runs, _continued(read, session), path_links(read, on_path),
              read.truncated, read.problems)


def _json_start(out: JsonStream, source: str, header: Header) -> None:
    """show --json's members before the entries, and the entries' list opened."""
    out.member("source", source)
    out.member("header", header.data)
    out.member("migrated", header.is_legacy)
    out.open_list("entries")


def _json_row(e: Entry, chash: str | None) -> dict[str, object]:
    """An entry's row in show --json (its context hash None: its path is cut)."""
    legacy = e.legacy_id
    return {"id": e.id, "type": e.type, "parent": e.parent, "line": e.line, "content_hash": e.content_hash,
            **({"context_hash": chash} if chash is not None else {}), **({"legacy_id": legacy} if legacy else {})}


def _json_end(
    out: JsonStream, ctx: Context | None, ctx_error: str | None, leaf_hash: str, runs: Callable[[], RunsReport | None],
    continued: tuple[str | None, str | None, Callable[[str], bool] | None],
    links: tuple[list[CalleeLink], list[Entry]], truncated: Problem | None, problems: list[Problem],
    items: Callable[[Context], Sequence[object]] | None = None,
) -> None:
    """show --json's members after the leaf and its path, and the document's end; ``runs()``
    made once the context is written (its calls and the context's items not held at once);
    ``items(ctx)``: the context's items as written, when not ``ctx.items``."""
    context = ctx.as_dict(lazy=True) if ctx is not None else None
    if context is not None and items is not None:
        context["items"] = items(ctx)  # type: ignore[arg-type]
    out.member("context", context)
    if ctx_error is not None:
        out.member("context_error", ctx_error)
    out.member("context_hash", leaf_hash)
    report = runs()
    out.member("runs", report.as_dict(lazy=True) if report is not None else None)
    successor, current, held = continued
    out.member("continued_in", successor)
    if current is not None:
        out.member("current", current)
    found_callees, found_judges = links
    out.member("callees", [{**c.as_dict(), **({"held": held(c.session)} if held else {})} for c in found_callees])
    out.member("judges", [{"link": j.id, "session": j.get("session"), "target": j.get("target"),
                           **({"held": held(j.get("session"))} if held else {})} for j in found_judges])
    out.member("truncated", {"line": truncated.line, "error": truncated.message} if truncated is not None else None)
    out.member("problems", [p.as_dict() for p in problems])
    out.end()


def _context_of(builder: ContextBuilder) -> tuple[Context | None, str | None]:
    """The context a builder standing at the leaf holds (its items read from their entries
    as written), or why it cannot be built."""
    try:
        return builder.context(hold_items=False), None
    except ContextError as exc:
        return None, str(exc)


def _show_json_stored(session: Session, outline: ProjectionOutline, leaf: str | None, source: str) -> None:
    """show --json of a stored session in one walk over its projection's entries, each
    read once (``listing_entries``): its row written as it is read, with its context hash
    (every entry fed to one hasher), and the entries on the leaf's path, with the calls
    and dispatches off it, given to a :class:`~agentsession_cas.store.showing.PathWalk`
    (the record rules along the path, the context there); then the context, the runs and
    the links from where the walk left them. No verify first: docs/cli.md says why."""
    from agentsession_cas.store.showing import ASIDE, OutlineHashes
    from agentsession_cas.store.views import listing_entries

    out = JsonStream()
    _json_start(out, source, session.header)
    n = len(outline)
    path = outline.path(leaf) if leaf is not None else []
    on_path = set(path)
    walk = PathWalk(session, outline, path)
    hasher = ContextHasher(OutlineHashes(outline))
    texts = _ItemTexts(outline)
    types, take, add, item, keep = outline.types, hasher.take, walk.add, out.item, texts.add
    bar = terminal.progress("reading", "entries")
    for pos, e in listing_entries(session, outline, range(n)):
        if bar is not None and pos % 1024 == 0:
            bar(pos, n)
        e.line = pos + 2
        item(_json_row(e, take(e)))
        t = types[pos]
        if pos in on_path:
            if t == "item":
                keep(pos, e.data["item"])  # (before the walk parks it)
            add(pos, e, t, True)
        elif t in ASIDE:
            add(pos, e, t, False)
    if bar is not None:
        bar.end()
    out.close_list()
    leaf_hash = hasher.get(leaf) if leaf is not None and leaf in hasher else NULL_CONTEXT_HASH
    del hasher, on_path  # (every entry's hash was written: the leaf's is all that is left to say)
    ctx, ctx_error = _context_of(walk.builder)
    out.member("leaf", leaf)
    out.member("path", [outline.ids[p] for p in path])
    out.tidy = walk.parking.tidy  # each item of the context read, its entry parked again
    successor = session.superseded_by
    _json_end(out, ctx, ctx_error, leaf_hash, lambda: walk.runs(leaf, source) if n else None,
              (successor, _current(session, successor), session.store.__contains__), walk.links(), None, [],
              items=texts.items)


class _ItemTexts:
    """The JSON text of each ``item`` entry's item on a stored session's path, made as the
    walk reads the entry (``indented``'s) and spooled to a temporary file, by position:
    the context's items are then written from there (:class:`~cli.common.Made`) instead
    of each entry read back from the store and its item made again (reading them back
    was half of ``show --json``'s time on a long session: its context is most of the
    document). What is held is two numbers a position; an item whose text was not made
    (one ``indented`` declines), or any other contribution (a compaction's summary or
    pins, a branch summary), is read from its entry as before."""

    WINDOW = 1 << 20  # bytes written, and read back, at once

    def __init__(self, outline: ProjectionOutline) -> None:
        from array import array

        self._outline = outline
        self._at = array("q", bytes(8 * len(outline)))
        self._size = array("l", bytes(array("l").itemsize * len(outline)))  # (0: no text)
        self._file: IO[bytes] | None = None
        self._parts: list[bytes] = []
        self._end = self._written = 0
        self._window, self._window_at = b"", 0
        self._off = False  # (the spool failed: every item is read from its entry, as before it)

    def add(self, pos: int, item: object) -> None:
        if self._off:
            return
        text = indented(item)
        if text is None:
            return
        raw = text.encode("utf-8")
        self._at[pos], self._size[pos] = self._end, len(raw)
        self._end += len(raw)
        self._parts.append(raw)
        if self._end - self._written >= self.WINDOW:
            self._flush()

    def _flush(self) -> None:
        try:
            if self._file is None:
                import tempfile  # (with the random module it brings: only when there is something to spool)

                self._file = tempfile.TemporaryFile()
            self._file.write(b"".join(self._parts))
            self._file.flush()  # (read back by pread, beneath the file object's buffer)
        except OSError:
            self._give_up()
            return
        self._parts.clear()
        self._written = self._end

    def _give_up(self) -> None:
        """No spool (its directory full, unwritable, a file size limit): every item is
        then read from its entry, as when no text is made, the same bytes written; a
        shortcut's failure is never the command's."""
        self._off = True
        self._parts.clear()
        self._window = b""
        self.close()

    def text(self, pos: int) -> str | None:
        size = self._size[pos]
        if not size or self._off:
            return None
        at = self._at[pos]
        start = at - self._window_at
        if start < 0 or start + size > len(self._window):
            if self._file is None:  # (less than a window made: held, never written out)
                self._window, self._window_at = b"".join(self._parts), 0
                start = at
            else:
                if self._parts:
                    self._flush()
                if self._off:  # (the flush just failed)
                    return None
                try:
                    self._window, self._window_at = os.pread(self._file.fileno(), max(size, self.WINDOW), at), at
                except OSError:
                    self._give_up()
                    return None
                start = 0
        return self._window[start : start + size].decode("utf-8")

    def items(self, ctx: Context) -> Sequence[object]:
        """The context's items, each made ahead where its text was (a held list, as an
        omit in force makes, is written as it is)."""
        if isinstance(ctx.items, list):
            self.close()  # (no text is read: the spool goes now)
            return ctx.items
        return _MadeItems(ctx, self)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _MadeItems(Sequence[object]):
    """:meth:`_ItemTexts.items`: each item read from its entry only when no text was made
    of it (an ``item`` entry's contribution is always its ``item``: another type's is
    its summary or a pin)."""

    def __init__(self, ctx: Context, texts: _ItemTexts) -> None:
        self._ctx, self._texts = ctx, texts

    def __len__(self) -> int:
        return len(self._ctx.items)

    def __getitem__(self, i: Any) -> Any:  # (the stream iterates; an index reads the entry)
        return self._ctx.items[i]

    def __iter__(self) -> Iterator[object]:
        items, texts = self._ctx.items, self._texts
        index, types = texts._outline.index, texts._outline.types
        for i, e in enumerate(self._ctx.item_entries):  # (an entry's id: no wake)
            pos = index.get(e.id)
            text = texts.text(pos) if pos is not None and types[pos] == "item" else None
            yield items[i] if text is None else Made(text, functools.partial(items.__getitem__, i))
        texts.close()


@whole_pass
def _show_read(target: store_commands.Target, file: str, leaf_name: str | None, verbose: bool, show_runs: bool,
               first: int | None, last: int | None) -> None:
    """show's text of a file, or of a stored session whose ``--leaf`` only its entries
    resolve: read once as ``verify`` reads it (an outline of the entries kept, not the
    entries), then the entries listed and those on the leaf's path read again, each row
    printed as its entry is read."""
    # (only the runs report reads the record rules; every context hash is taken as read, where
    # the entry's item was hashed for its id, to keep the leaf's)
    read, session = _read(target, file, hashes=True, paths=show_runs)
    if not show_runs:
        read.release()  # (what is held then is the outline, and the path's stubs as it is listed)
    outline = read.outline
    leaf = read.leaf(leaf_name)
    assert read.hashes is not None
    leaf_hash = read.hashes.get(leaf) if leaf in read.hashes else NULL_CONTEXT_HASH
    read.hashes = None
    n = len(outline)
    successor, current, held = _continued(read, session)
    page()
    _print_info(read.header, read.migrated, n, outline.roots(), outline.leaves(), leaf, successor=successor, current=current)
    path = _print_listing(outline, leaf, leaf_name, verbose, first, last, read.entries, read.listing_parking(), read.lines,
                          leaf_hash=leaf_hash)
    if show_runs and n:
        report = read.report
        assert report is not None
        parking = read.parking()
        runs = report.runs_report(leaf, settle=parking.settle, tidy=parking.tidy, path=read.path_entries(path))
        _print_runs(runs, path_links(read, path), held)
    problems, truncated = read.problems, read.truncated
    if problems or truncated is not None:
        echo()
    for p in problems:
        echo(f"{paint('problem:', 'bad')} {p}")
    if truncated is not None:
        echo(f"{paint('truncated:', 'bad')} {truncated} (not loaded)")


def _print_runs(runs: RunsReport, links: tuple[list[CalleeLink], list[Entry]], held: Callable[[str], bool] | None) -> None:
    """show --runs's text after the context: the runs report, then the path's callees and judges
    (a batch of lines a write: a long path's report is tens of thousands of lines)."""
    echo()
    echo_lines(render_runs(runs))
    echo()
    echo_lines(render_links(*links, held))


_ROW_HEADER = ["LINE", "ID", "PARENT", "TYPE", "SUMMARY"]


def _graph_marks(e: Entry, head: str | None, base: str | None, labels: dict[str, list[str]]) -> list[str]:
    marks = []
    if e.id == head:
        marks.append("(head)")
    if base is not None and e.id == base:
        marks.append("(base)")
    marks.extend(f"[{text}]" for text in labels.get(e.id, ()))
    return marks


@whole_pass
def _draw_graph(file: str, as_json: bool, verbose: bool) -> None:
    """show --graph: the entry tree of a session file or a stored session, drawn as
    ``git log --graph`` draws commits (:func:`agentsession_cas.store.views.graph_lanes`).
    The lanes come from an outline of the entries (ids, parents, children, labels: a
    stored session's from its envelopes, a file's from reading it once as ``verify``
    does); then each entry is read again and its line written as it comes (its summary is
    all the drawing reads of it)."""
    from agentsession_cas.store.views import graph_lanes, listing_entries

    target = store_commands.locate(file, files=True)
    entries: Callable[[Sequence[int]], Iterable[tuple[int, Entry]]]
    if target.kind == "file":
        read, _ = _read(target, file, paths=False)
        read.release()  # (the drawing reads the outline and the entries again, not the verify's facts)
        outline, header, head, entries = read.outline, read.header, read.leaf(), read.entries
    else:
        _, session = store_commands.open_target(target, files=True)
        outline, header = session.projection_outline(), session.header
        head = session.head if len(outline) else None  # the projection's resume rule names the head (its marker sees to it)
        entries = functools.partial(listing_entries, session, outline)
    base = header.base
    labels: dict[str, list[str]] = {}
    for members in outline.label_members.values():
        target_id, text = members.get("target"), members.get("label")
        if isinstance(target_id, str) and isinstance(text, str):
            labels.setdefault(target_id, []).append(text)
    ids = outline.ids
    children = {ids[at]: count for at, count in outline.children.items()}
    rows = list(graph_lanes(((entry_id, outline.parent(pos)) for pos, entry_id in enumerate(ids)), children))
    everything = range(len(outline))
    if as_json:
        out = JsonStream()
        out.member("session", header.id)
        out.member("head", head)
        out.member("base", base)
        out.open_list("entries")
        for pos, e in entries(everything):
            lanes, branch, collapse = rows[pos]
            out.item({"id": e.id, "parent": e.parent, "type": e.type, "summary": describe(e, verbose), "graph": lanes,
                      **({"branch": branch} if branch is not None else {}),
                      **({"collapse": collapse} if collapse is not None else {}),
                      "marks": _graph_marks(e, head, base, labels)})
        out.close_list()
        out.end()
        return
    page()
    width = max((len(lanes) for lanes, _, _ in rows), default=0)

    def lines() -> Iterator[str]:
        for pos, e in entries(everything):
            lanes, branch, collapse = rows[pos]
            if branch is not None:
                yield branch
            marks = " ".join(_graph_marks(e, head, base, labels))
            summary = describe(e, verbose)
            # the summary gives way to the marks: the line is cut in the summary, never in them
            room = terminal.width() - len(lanes.ljust(width)) - 2 - 12 - 2 - 11 - (len(marks) + 2 if marks else 0)
            summary = terminal.cut(summary, max(8, room))
            line = f"{lanes.ljust(width)}  {paint(short_id(e.id), 'id')}  {e.type:<10} {summary}"
            yield f"{line}  {paint(marks, 'head')}" if marks else line
            if collapse is not None:
                yield collapse

    echo_lines(lines(), fit="cut")


def _show_stored(session: Session, outline: ProjectionOutline, leaf: str | None, leaf_name: str | None, verbose: bool,
                 first: int | None, last: int | None, runs: bool) -> None:
    """``show`` of a stored session, streamed: what the text shows of its projection, as
    ``show`` of the exported file would, without holding the file. First the outline
    from the envelopes (ids, parents, types, labels, the contents they name: what the
    head of the listing and the column widths need), then the contents of the entries
    listed or on the leaf's path (:func:`_print_listing`), and with ``runs`` the calls
    and dispatches off it, for the runs report a
    :class:`~agentsession_cas.store.showing.PathWalk` makes in that same walk."""
    from agentsession_cas.store.views import listing_entries

    n = len(outline)
    successor = session.superseded_by
    _print_info(session.header, False, n, outline.roots(), outline.leaves(), leaf, successor=successor,
                current=_current(session, successor))
    store = session.store
    walk = PathWalk(session, outline, outline.path(leaf) if leaf is not None else []) if runs and n else None
    _print_listing(outline, leaf, leaf_name, verbose, first, last, lambda wanted: listing_entries(session, outline, wanted),
                   Parking(lambda e: store.entry(e.id).data), walk=walk)
    if walk is not None:
        _print_runs(walk.runs(leaf, session.id), walk.links(), store.__contains__)


def _print_listing(
    outline: ProjectionOutline, leaf: str | None, leaf_name: str | None, verbose: bool, first: int | None, last: int | None,
    entries: Callable[[Sequence[int]], Iterable[tuple[int, Entry]]], parking: Parking, lines: Sequence[int] | None = None,
    walk: PathWalk | None = None, leaf_hash: str | None = None,
) -> list[int]:
    """The listing, the leaf and the context at it, from an outline of the entries (what
    the head of the listing and the column widths need) and ``entries(positions)``, which
    reads the entries listed or on the leaf's path, in order: each row printed as its
    entry is read (every entry is read once); the entries on the leaf's path are kept for
    the context, which the context algorithm must hold anyway, parked (``parking``:
    Entry.park, their objects read again if the algorithm consults one or its item is
    printed), so what is held grows by an entry's ids, not its bytes. ``lines``: each
    position's line, when not its position + 2 (a file's). ``walk``: a stored session's
    :class:`~agentsession_cas.store.showing.PathWalk`, given the path's entries (it pushes
    them to its context builder, and parks them) and the calls and dispatches off it.
    ``leaf_hash``: the context hash at the leaf, when the read took it (else it is taken
    along the path here). Returns the path."""
    from agentsession_cas.store.showing import ASIDE, OutlineHashes

    n = len(outline)
    path = outline.path(leaf) if leaf is not None else []
    on_path = set(path)
    listed = _listed(n, first, last)
    builder = walk.builder if walk is not None else ContextBuilder()
    # (beside a walk's record state, the path's hashes are packed by their place; alone, a dict is quicker)
    hasher = ContextHasher(OutlineHashes(outline)) if walk is not None else ContextHasher()
    said: dict[str, bytes] = {}  # the item an entry puts in the context, described (an item's for its row too)
    rows = _Listing(outline, listed, verbose, lines) if n else None
    bar = terminal.progress("reading", "entries")
    types, ids, parent_at, absent = outline.types, outline.ids, outline.parent_at, outline.absent
    push, feed, settle = builder.push, hasher.feed, parking.settle
    # The path's entries are fed to the context hash in order, each one's parent the entry
    # fed before it: all of them, unless its root names a parent that is not among the
    # entries (then none, as context_hashes skips an entry whose parent it was not fed).
    feeding = leaf_hash is None and bool(path) and absent.get(path[0]) is None
    wanted: Sequence[int] = listed if len(listed) == n else sorted(on_path.union(listed))
    if walk is not None and len(wanted) < n:
        wanted = sorted(set(wanted).union(pos for pos, t in enumerate(types) if t in ASIDE))
    if walk is not None:
        parking = walk.parking
    for count, (pos, e) in enumerate(entries(wanted)):
        if bar is not None and count % 1024 == 0:
            bar(count, len(wanted))
        # the entry's type and parent, as the outline holds them (the entry took its own from there)
        t, up = types[pos], parent_at[pos]
        parent = ids[up] if up >= 0 else absent.get(pos)
        item = describe_item(e.data.get("item")) if t == "item" else None
        if rows is not None and pos in listed:
            rows.add(pos, e, parent, item, bar)
        if pos in on_path:
            if item is not None:
                said[e.id] = item.encode(*_SAID)
            elif t == "branch_summary":  # its summary is its item in the context
                said[e.id] = describe_item(e.data.get("summary")).encode(*_SAID)
            if feeding:
                feed(e)
            if walk is not None:
                e.line = pos + 2 if lines is None else lines[pos]
                walk.add(pos, e, t, True)
            else:
                push(e, t)
            if walk is None and pos < n - 1:  # not the last: it may be the synthetic marker, which no store holds
                settle(e)
        elif walk is not None and t in ASIDE:
            e.line = pos + 2 if lines is None else lines[pos]
            walk.add(pos, e, t, False)
    if rows is not None:
        rows.flush(bar)
        _print_listed(len(listed), n)
    elif bar is not None:
        bar.end()
    _print_leaf(leaf, leaf_name, len(path), bool(n))
    if n:
        try:
            ctx, error = builder.context(hold_items=False), None
        except ContextError as exc:
            ctx, error = None, str(exc)
        if leaf_hash is None:
            leaf_hash = hasher.get(leaf) if leaf is not None and leaf in hasher else NULL_CONTEXT_HASH
        echo()
        _print_context(leaf, ctx, error, leaf_hash, said, parking.tidy)
    return path


class _Listing:
    """The rows of a stored session's listing, made as its entries are read and printed
    a batch at a time. The column widths are known from the outline before the first
    row, so each row is one line made at once: an id's short form a slice of its hash,
    a type padded once for all the entries of that type, the summary cut to what the
    other columns leave (the line is then fitted to the width as any is)."""

    def __init__(self, outline: ProjectionOutline, listed: range, verbose: bool, lines: Sequence[int] | None = None):
        self.outline, self.verbose = outline, verbose
        #: Each position's line (a file's, which may skip lines it did not load; a projection's is its position + 2).
        self.line: Callable[[int], int] = (lambda pos: pos + 2) if lines is None else lines.__getitem__
        ids, shown = outline.ids, slice(listed.start, listed.stop)
        # a store names every entry by its hash: the short form is a slice (short_id checks each)
        self.hashed = _all_hashes(ids) and _all_hashes(list(outline.absent.values()))
        if self.hashed:
            parented = max(outline.parent_at[shown], default=-1) >= 0 or any(i in listed for i in outline.absent)
            id_width, parent_width = 12 if listed else 0, 12 if parented else 1
        else:
            id_width = max((len(short_id(ids[i])) for i in listed), default=0)
            parent_width = max((len(short_id(outline.parent(i))) for i in listed), default=0)
        widths = [
            max(len(_ROW_HEADER[0]), len(str(self.line(listed[-1]))) if listed else 0),
            max(len(_ROW_HEADER[1]), id_width),
            max(len(_ROW_HEADER[2]), parent_width),
            max([len(_ROW_HEADER[3])] + [len(t) for t in set(outline.types[shown])]),
        ]
        self.widths = widths
        self.summary_width = max(8, terminal.width() - sum(widths) - 8)  # the summary takes what is left
        self.type_cells = {t: t + " " * (widths[3] - len(visible(t))) for t in set(outline.types)}
        # (a parent's short form is as wide as its column: 12, when any row has a parent)
        self.no_parent = "-".ljust(widths[2])
        self.rows: list[str] = []
        echo()
        echo(table_line(_ROW_HEADER, widths), fit="cut")

    def add(self, pos: int, e: Entry, parent: str | None, item: str | None, bar: terminal.Progress | None) -> None:
        """The row of the entry at ``pos`` (its ``parent``, and ``item``, its item's
        :func:`describe_item` when it has one, as the caller found them)."""
        outline = self.outline
        children = outline.children.get(pos, 0)
        summary = describe(e, self.verbose, item=item)
        if children != 1 or e.id in outline.labels or pos in outline.converges:
            marks = _marks(children, outline.labels.get(e.id), outline.converges.get(pos, 0))
            if marks:
                summary += "  " + " ".join(marks)
        room = self.summary_width
        if "\x1b" in summary:
            summary = terminal.cut(summary, room)
        elif len(summary) > room:
            summary = summary[: room - 1] + "\u2026"
        if self.hashed:
            w = self.widths
            line = str(self.line(pos))
            self.rows.append(
                f"{line}{' ' * (w[0] - len(line))}  {e.id[7:19]}  {parent[7:19] if parent is not None else self.no_parent}  "
                f"{self.type_cells[outline.types[pos]]}  {summary}".rstrip()
            )
        else:
            cells = [str(self.line(pos)), short_id(e.id), short_id(parent), outline.types[pos], summary]
            self.rows.append(table_line(cells, self.widths))
        if len(self.rows) >= _BATCH:
            self.flush(bar)

    def flush(self, bar: terminal.Progress | None) -> None:
        if bar is not None:
            bar.end()
        echo_lines(self.rows, fit="cut")
        self.rows.clear()


def _all_hashes(names: list[str]) -> bool:
    """Whether every name is an entry hash (one match over each few thousand of them)."""
    return all(_HASHES.fullmatch("\n".join(names[at : at + 4096])) for at in range(0, len(names), 4096))


_HASHES = re.compile(r"sha256:[0-9a-f]{64}(?:\nsha256:[0-9a-f]{64})*")

#: Rows of a stored session's listing printed at once.
_BATCH = 1024


def _print_info(
    h: Header, migrated: bool, entries: int, roots: int, leaves: int, leaf: str | None,
    *, successor: str | None = None, current: str | None = None,
) -> None:
    info = [["session", h.id or "-"], ["format", f"{h.format} ({h.payload or '-'})" + (" migrated in memory" if migrated else "")]]
    if h.created_at:
        info.append(["created", when(str(h.created_at))])
    if h.harness:
        info.append(["harness", f"{h.harness.get('name', '')} {h.harness.get('version', '')}".strip()])
    if h.data.get("cwd"):
        info.append(["cwd", str(h.data["cwd"])])
    if h.data.get("parent_session"):
        info.append(["parent", str(h.data["parent_session"])])
    if h.base:
        info.append(["base", short_id(h.base)])
    if successor is not None:
        went = f"{successor} (superseded: takes no more appends)"
        if current is not None and current != successor:
            went += f"; the chain's current session is {current}"
        info.append(["continued in", went])
    if h.records:
        info.append(["records", ", ".join(h.records)])
    if "media" in h.data:
        info.append(["media", h.media])
    info.append(["entries", f"{number(entries)} in {number(roots)} root(s), {number(leaves)} leaf(s), leaf {short_id(leaf)}"])
    for line in table([[k, v] for k, v in info]):
        echo(line)


def _listed(n: int, first: int | None, last: int | None) -> range:
    """Which entries the listing shows: -n N the first N, --tail N the last N (of those)."""
    listed = range(n)
    if first is not None:
        listed = listed[:first]
    if last is not None:
        listed = listed[len(listed) - last:] if last else listed[:0]
    return listed


def _marks(children: int, label: str | None, converges: int) -> list[str]:
    marks = []
    if children > 1:
        marks.append(f"fork\u00d7{children}")
    if children == 0:
        marks.append("leaf")
    if label:
        marks.append(f"[{label}]")
    if converges:
        marks.append(f"converges {converges}")
    return marks


def _row(e: Entry, marks: list[str], verbose: bool, item: str | None = None) -> list[str]:
    summary = describe(e, verbose, item=item)
    if marks:
        summary += "  " + " ".join(marks)
    return [str(e.line), short_id(e.id), short_id(e.parent), e.type, summary]


def _print_listed(listed: int, entries: int) -> None:
    if listed < entries:
        echo(f"({number(listed)} of {plural(entries, 'entry', 'entries')} listed)")


def _print_leaf(leaf: str | None, leaf_name: str | None, path_length: int, has_entries: bool) -> None:
    echo()
    if leaf is None:
        echo("leaf -  (the universal root: the next entry is a root)" if has_entries else "leaf -  (no entries)")
    else:
        how = "given" if leaf_name else "by the resume rule"
        echo(f"leaf {short_id(leaf)}  ({how}; {plural(path_length, 'entry', 'entries')} on its path)")


# ---------------------------------------------------------------------------
# verify


def _summary(report: VerifyReport) -> str:
    if report.migrated:
        how = f"migrated from {report.header.format}: ids assigned in memory, not checked"
    elif report.header.data.get("redacted") is True:
        how = "each id checked against its hash: this redacted file's, never the original's"
    else:
        how = "each id checked against its hash"
    counts = {k: number(v) for k, v in report.counts().items()}
    failed = f"{counts['failed']} failed"
    if "redacted" in counts:
        failed += f", {counts['redacted']} not rebuilt (redacted)"
    return (
        f"{plural(report.entries, 'entry', 'entries')} read, {how}; {number(len(report.problems))} problem(s); "
        f"{counts['responses']} response(s): {counts['verified']} request hash(es) verified, "
        f"{counts['without_hash']} without a hash, {failed}; {number(report.runs_checked)} run(s) checked"
    )


@click.command()
@click.argument("file", metavar="[FILE|ID]", required=False, type=str)  # as show: no stat() of a name holding NUL
@json_option()
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; the exit status says (0 sound, 1 not).")
@click.option("-v", "--verbose", is_flag=True, help="Also print one line per response whose request hash checked.")
@whole_pass
def verify(file: str | None, as_json: bool, quiet: bool, verbose: bool) -> None:
    """Check a session file or a stored session; exit 1 on any problem.

    For a file (- for standard input): each entry's id is recomputed from its members, its ts form
    and I-JSON checked, and the parent, parents and base rules applied; then
    the request of every response is rebuilt from its path and its
    request_hash checked (a response without one is counted, never called
    verified), and every compaction's first_kept is looked up on its path.
    For a stored session (an id, or a path inside its directory): its log
    checksums, every object it needs present and hashing to its name, then
    its projection as a file. With no argument: the whole store, as `fsck`.

    Text output is the problems, the notes and a summary line; a failed
    request hash is a problem; -v adds a line for every response checked.
    """
    if not quiet:
        _verify(file, as_json, verbose)
        return
    # Nothing printed, the exit status alone: the checks run as they would.
    terminal.settings().quiet = True  # no progress line either
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        _verify(file, as_json, verbose)


def _verify(file: str | None, as_json: bool, verbose: bool) -> None:
    if file is None:
        sys.exit(fsck_command.run_fsck(as_json))
    target = store_commands.locate(file, files=True)
    if target.kind == "session":
        store_commands.verify_session(target, as_json)
        return
    arg, file = file, ("<stdin>" if file == "-" else file)  # what messages name
    try:
        # one pass over the file as it is read: every rule, each entry once (issue 11)
        if arg == "-":
            with progressing("verifying", "lines") as bar:
                report = verify_bytes(read_stdin(), source="<stdin>", progress=bar)
        else:
            with progressing("verifying", "bytes") as bar:
                report = verify_file(arg, progress=bar)
    except SessionFormatError as exc:
        problems = exc.problems
        if as_json:
            emit_json({"source": file, "ok": False, "entries": 0, "migrated": False,
                        "problems": [p.as_dict() for p in problems], "notes": []})
        else:
            for p in problems:
                echo(f"{file}: {paint(str(p), 'bad')}")
        sys.exit(1)
    if as_json:
        emit_json(report.as_dict())
        sys.exit(0 if report.ok else 1)
    for p in report.problems:  # line, tree and context problems; a failed request hash is its response's line
        if p.code != "request_hash" and RULES[p.code].scope != "record":
            echo(f"{file}: {paint(str(p), 'bad')}")
    for p in report.of_scope("record"):
        echo(f"{file}: records  {paint('ERROR', 'bad')} {p}")
    for c in report.requests:
        if verbose or c.failed:
            echo(f"{file}: response {short_id(c.entry.id)}: {c.message()}")
    for note in report.notes:
        echo(f"{file}: note: {note}")
    echo(f"{file}: {_summary(report)}")
    sys.exit(0 if report.ok else 1)


# ---------------------------------------------------------------------------
# hash-object


@click.command("hash-object")
@click.argument("file", default="-", type=str)  # no stat() of a name holding NUL
@json_option()
def hash_object(file: str, as_json: bool) -> None:
    """Print the computed id and content hash of each entry line in FILE (or stdin).

    A header line is skipped. Each output line is `ID CONTENT_HASH`, and
    `!` is appended when the line states a different id. A line that cannot
    be hashed is reported on stderr with its number, and the exit is 1.
    """
    if file == "-":
        data = read_stdin()
    else:
        if os.path.isdir(file):
            raise IsADirectoryError(21, "is a directory", file)
        with open(file, "rb") as f:
            data = f.read()
    results = []
    failed: list[Problem] = []
    lines = split_lines(data)
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        obj, _, found, _ = parse_line(raw, line=lineno, last=lineno == len(lines),  # worded as verify words it
                                      terminated=data.endswith(b"\n"))
        if obj is not None and obj.get("type") == "session":
            continue
        try:
            if obj is None:
                raise EntryError(found.message if found is not None else "the line does not read")
            eid, chash = entry_hashes(obj, parsed=True)
        except (ValueError, AgentSessionError) as exc:
            failed.append(found if found is not None else problem(lineno, "entry", str(exc)))
            if not as_json:
                echo(f"agentsession: line {lineno}: {exc}", err=True)
            continue
        stated = obj.get("id")
        results.append({"line": lineno, "id": eid, "content_hash": chash, "stated_id": stated, "matches": stated == eid})
    if as_json:
        emit_json(results)
        if failed:  # what could not be hashed: the error object, with each line's problem
            fail(f"{plural(len(failed), 'line')} could not be hashed; the first, line {failed[0].line}: "
                 f"{failed[0].message}", code=SessionFormatError.code, problems=[p.as_dict() for p in failed])
    else:
        for r in results:
            flag = "" if r["matches"] or r["stated_id"] is None else "  !"
            echo(f"{r['id']} {r['content_hash']}{flag}", fit=None)  # two full hashes a script reads
    if failed:
        sys.exit(1)


COMMANDS: list[click.Command] = [show, verify, hash_object]
