"""Views over stored sessions (issue 14): ``diff`` and ``grep``. The views themselves are
:mod:`agentsession_cas.store.views`; this module parses and prints."""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from agentsession_cas.errors import SessionDamagedError
from agentsession_cas.format.entry import Entry, short_id
from agentsession_cas.store.names import resolve_entry, resolve_session
from agentsession_cas.store.views import Diff, diff_paths, diff_sequences, grep_store

from .common import JsonStream, echo, emit_json, json_option, number, one_line, plural, size, table
from .describe import describe
from .fsck_command import finding_line
from .store_commands import read_store
from .terminal import color_on, paint
from .terminal import start_pager as page

# ---------------------------------------------------------------------------
# diff


_SIGN_COLOUR = {"-": "bad", "+": "good", "=": "dim"}


def _entry_row(sign: str, e: Entry) -> str:
    return paint(f"{sign} {short_id(e.id)}  {e.type:<10} {describe(e)}", _SIGN_COLOUR[sign])


def _entry_json(e: Entry) -> dict[str, Any]:
    return {"entry": e.id, "parent": e.parent, "type": e.type, "summary": describe(e)}


@click.command()
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--session", "session_name", metavar="S",
              help="A and B are entries of session S (ids or unique prefixes): compare their paths.")
@json_option()
def diff(a: str, b: str, session_name: str | None, as_json: bool) -> None:
    """Compare two sessions, or two entries' paths: the common prefix, then what only each holds.

    Two sessions (A and B name sessions) are compared entry by entry in
    projection order (a fork's prefix first, then its own entries): the run
    of entries both start with, then the rest of each. With --session S, A
    and B are entries of S and their paths from the root are compared: the
    path to their last common ancestor, then each one's own steps.

    Lines after the common prefix start with `-` for an entry only A holds,
    `+` for one only B holds, and `=` for one both hold elsewhere. The exit
    status is 0 whether they differ or not (as git diff); `same` in --json says.
    """
    store = read_store()
    if session_name is not None:
        with store.read(resolve_session(store, session_name)) as s:
            names = (resolve_entry(s, a), resolve_entry(s, b))
            sid = s.id
            # (each path read in bulk along the session's log order, its prefix read once)
            result: Diff = diff_paths(s.ancestry(names[0]), s.ancestry(names[1]))
        sides: dict[str, Any] = {"session": sid, "a": names[0], "b": names[1]}
    else:
        ids = (resolve_session(store, a), resolve_session(store, b))
        seqs = []
        for sid in ids:
            with store.read(sid) as s:
                seqs.append([*s.prefix, *s.log_order])
        result = diff_sequences(seqs[0], seqs[1])
        sides = {"a": ids[0], "b": ids[1]}
    if as_json:
        # emit_json's bytes, a row at a time, the rows' entries read in bulk (Store.entries):
        # 100,000 rows made whole peaked at 454 megabytes. Spooled: an entry that does not read
        # leaves nothing on standard output, as before.
        out = JsonStream(spool=True)
        for key, value in sides.items():
            out.member(key, value)
        out.member("same", result.same)
        out.member("common", len(result.common))
        out.member("last_common", result.common[-1] if result.common else None)
        for key, rest in (("only_a", result.only_a), ("only_b", result.only_b)):
            out.open_list(key)
            for e in store.entries(rest):
                out.item(_entry_json(e))
            out.close_list()
        out.member("shared", sorted(result.shared))
        out.end()
        return
    page()
    last = f", up to {short_id(result.common[-1])}" if result.common else ""
    echo(f"a {sides['a']}")
    echo(f"b {sides['b']}")
    echo(f"common prefix: {plural(len(result.common), 'entry', 'entries')}{last}")
    for sign, rest in (("-", result.rest_a), ("+", result.rest_b)):
        listed = [e for e in rest if sign == "-" or e not in result.shared]  # (a shared one listed once, under A)
        for e in store.entries(listed):  # (read in bulk)
            echo(_entry_row("=" if e.id in result.shared else sign, e), fit="cut")


# ---------------------------------------------------------------------------
# grep


@click.command()
@click.argument("pattern")
@click.argument("sessions", metavar="[SESSION...]", nargs=-1)
@click.option("--type", "types", metavar="TYPE", multiple=True, help="Search only entries of this type (repeatable).")
@click.option("-i", "--ignore-case", is_flag=True, help="Match upper and lower case alike.")
@click.option("-l", "--files-with-matches", "list_only", is_flag=True, help="Print only the sessions that match.")
@json_option()
def grep(pattern: str, sessions: tuple[str, ...], types: tuple[str, ...], ignore_case: bool, list_only: bool,
         as_json: bool) -> None:
    """Search entries' text for a regular expression; exit 1 when nothing matches.

    The text of an entry is what a person reads in it: messages, tool calls'
    names and arguments, their outputs, reasoning summaries, a compaction's
    summary, a config's instructions, a custom entry's data. Each session's
    own entries are searched (a fork's prefix belongs to the session it was
    forked from), the given SESSIONs or, with none, every session of the
    store. A match prints SESSION:ENTRY:TYPE:FIELD: LINE.
    """
    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise click.BadParameter(f"not a regular expression: {exc}", param_hint="PATTERN") from None
    store = read_store()
    if not sessions:
        # Every session held: one whose header file is lost is its damage (exit 1), as a
        # damaged log is, where leaving it out would call a store searched that was not.
        for sid in store.backend.sessions.lost_headers():
            lost = store.backend.sessions.header_lost(sid)
            if lost is not None:  # (not a name to resolve: a ref may be called so)
                raise SessionDamagedError.header_lost(sid, lost, store.backend.public_url())
    ids = [resolve_session(store, name) for name in sessions] if sessions else sorted(store.list())
    found: list[dict[str, Any]] = []
    matched = False
    if not as_json:
        page()
    for m in grep_store(store, ids, regex, types=types, first=list_only):
        matched = True
        sid = m.session
        if list_only:
            if as_json:
                found.append({"session": sid})
            else:
                echo(sid, fit=None)
            continue
        if as_json:
            found.append(m.as_dict())
        else:
            text = regex.sub(lambda hit: paint(hit.group(), "match"), one_line(m.text)) if color_on() else one_line(m.text)
            echo(f"{paint(sid, 'head')}:{paint(short_id(m.entry), 'id')}:{m.type}:{m.field}: {text}", fit="cut")
    if as_json:
        emit_json(found)
    sys.exit(0 if matched else 1)


# ---------------------------------------------------------------------------
# stats


@click.command()
@click.option("--by-session", is_flag=True, help="Also print each session's entries, bytes and what it shares.")
@json_option()
def stats(by_session: bool, as_json: bool) -> None:
    """Print the store's objects, logical versus stored bytes, and how much sessions share.

    Logical bytes are what the sessions would be as files (each session's
    projection entry lines; a fork's prefix counted in the fork too);
    stored bytes what the objects take (loose files and packs). Distinct
    bytes count each entry once, however many sessions hold it; the dedup
    ratio is logical over distinct.
    """
    from agentsession_cas.maintenance.stats import store_stats

    result = store_stats(read_store())
    if as_json:
        emit_json(result.as_dict(by_session=by_session))
        sys.exit(0 if result.ok else 1)
    page()
    rows = [["" if i else "objects", f"{space} {number(result.objects[space])} in {size(result.object_bytes[space])}"]
            for i, space in enumerate(result.objects)]
    rows += [["sessions", number(len(result.sessions))], ["logical", size(result.logical_bytes)]]
    if result.stored is None:
        rows.append(["stored", "not known for this backend"])
    else:
        parts = ", ".join(f"{kind} {size(n)}" for kind, n in result.stored.items())
        rows.append(["stored", f"{size(sum(result.stored.values()))}: {parts}"])
    dedup = f"; dedup {result.dedup:.2f}x" if result.dedup is not None else ""
    rows.append(["distinct", f"{plural(result.distinct_entries, 'entry', 'entries')}, {size(result.distinct_bytes)}"])
    rows.append(["shared", f"{plural(result.shared_entries, 'entry', 'entries')} held by more than one session{dedup}"])
    for line in table(rows):
        echo(line)
    if by_session and result.sessions:
        echo()
        head = [["SESSION", "ENTRIES", "OWN", "LOGICAL", "SHARED"]]
        body = [[s.session, number(s.entries), number(s.own), size(s.logical_bytes),
                 f"{number(s.shared_entries)}, {size(s.shared_bytes)}"] for s in result.sessions]
        for line in table(head + body, shrink=0):
            echo(line, fit="cut")
    # What did not read is left out of the figures above: a problem found and reported,
    # one line each as fsck prints it.
    if result.problems:
        echo()
        for p in result.problems:
            echo(finding_line(p))
        sys.exit(1)


COMMANDS: list[click.Command] = [diff, grep, stats]
