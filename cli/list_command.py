"""``agentsession list``: the store's sessions from their summaries, newest first.

A session's summary (:mod:`agentsession_cas.store.summary`) is kept beside its log,
so listing reads no log while the summaries are current; a session written since
its summary is brought up to date from its log.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from agentsession_cas.errors import AgentSessionError, NoSuchSessionError, SessionDamagedError
from agentsession_cas.format.entry import short_id
from agentsession_cas.store.summary import select

from . import terminal
from .common import WHEN, echo, echo_lines, emit_json, json_option, number, one_line, table, when
from .store_commands import read_store
from .terminal import start_pager as page

#: The longest title the text listing prints whole.
TITLE_WIDTH = 40
#: The longest session id it prints whole (ids run to 200 characters): a longer one is cut
#: to a prefix and an ellipsis, so the columns after it stay on the line; the prefix names
#: the session wherever a command takes one (as a unique prefix), --json holds it whole.
ID_WIDTH = 40


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


#: The columns a narrow terminal (or the 100 columns of a pipe) goes without, in order:
#: what --json always holds, and what the other columns say enough without.
OPTIONAL_COLUMNS = ("CREATED", "HARNESS", "MODEL")
#: The narrowest a title is cut to before a column is left out.
TITLE_MIN = 12


def _narrowed(lines: list[list[str]]) -> list[list[str]]:
    """The table without the optional columns it cannot hold in the width, dropped one at a
    time (ID, ACTIVE, ENTRIES, HEAD and MARK always stay)."""
    names = list(lines[0])
    widths = [max(map(len, cells)) for cells in zip(*lines)]
    for name in OPTIONAL_COLUMNS:
        title = names.index("TITLE")
        need = sum(widths) - widths[title] + min(widths[title], TITLE_MIN) + 2 * (len(widths) - 1)
        if need <= terminal.width():
            break
        drop = names.index(name)
        del names[drop], widths[drop]
    if len(names) == len(lines[0]):
        return lines
    keep = [i for i, name in enumerate(lines[0]) if name in names]
    return [[r[i] for i in keep] for r in lines]


def _damaged(sid: str, exc: AgentSessionError, as_json: bool) -> dict[str, Any]:
    """A session that cannot be read, as its row (under --json the row is the report, with
    the error's code and the damaged file), else said on stderr."""
    if not as_json:
        echo(f"agentsession: error: {one_line(str(exc))}", err=True)
    row = {"session": sid, "mark": "damaged", "error": one_line(str(exc)), "code": exc.code}
    if isinstance(exc, SessionDamagedError) and exc.path:
        row["file"] = exc.path
    return row


@click.command("list")
@click.option("--limit", "-n", type=click.IntRange(min=0), metavar="N", help="Show at most N sessions (the newest).")
@click.option("--harness", metavar="NAME", help="Only sessions recorded by this harness (its name, or name and version).")
@click.option("--cwd", "cwd", metavar="DIR", help="Only sessions whose working directory is DIR or below it.")
@click.option("--after", type=WHEN, metavar="WHEN", help="Only sessions active at or after WHEN (2026-01-02, 2026-01-02T03:04Z, or an age: 3d).")
@click.option("--before", type=WHEN, metavar="WHEN", help="Only sessions last active before WHEN (same forms as --after).")
@click.option("--current", is_flag=True, help="Leave out sessions that were continued in a successor.")
@json_option()
def list_sessions(limit: int | None, harness: str | None, cwd: str | None, after: str | None, before: str | None,
                  current: bool, as_json: bool) -> None:
    """List the store's sessions, newest activity first: title, model, harness, times, entries, head, mark.

    Times are UTC to the second. Where the width (the terminal's, else 100
    columns) cannot hold every column, CREATED, then HARNESS, then MODEL are
    left out and TITLE is shortened (an ID over 40 characters is cut too); --json holds them all. A session continued in a successor (a
    continued_in link) is superseded: a CONTINUED IN column names the
    successor, and --current leaves it out. A session that cannot be read (a damaged log,
    a lost header file) is listed with mark `damaged`, reported on stderr (in its row, with the error's
    code, under --json), and the exit status is 1.
    """
    store = read_store()
    summaries = []
    damaged: list[dict[str, Any]] = []
    for sid in store.list():
        try:
            summaries.append(store.summary(sid))
        except NoSuchSessionError:
            continue  # deleted meanwhile
        except AgentSessionError as exc:
            damaged.append(_damaged(sid, exc, as_json))
    for sid in store.backend.sessions.lost_headers():  # held, but listed no more: damaged too
        damaged.append(_damaged(sid, SessionDamagedError.header_lost(sid, store.backend.sessions.header_lost(sid) or sid),
                                as_json))
    chosen = select(summaries, harness=harness, cwd=os.path.abspath(cwd) if cwd else None,
                    after=after, before=before, limit=limit, current=current)
    rows: list[dict[str, Any]] = []
    for s in chosen:
        row = s.as_dict()
        del row["last_entry"], row["seq"]
        row = {"session": row.pop("id"), **row}  # the JSON grammar names a session `session`
        if as_json:  # a directory walk per session: only where it is printed
            row["size"] = store.backend.sessions.size(s.id)
        rows.append(row)
    rows.extend(damaged)
    if as_json:
        emit_json(rows)
    elif rows:
        page()
        continued = any(r.get("continued_in") for r in rows)
        lines = [["ID", "TITLE", "MODEL", "HARNESS", "CREATED", "ACTIVE", "ENTRIES", "HEAD", "MARK"]
                 + (["CONTINUED IN"] if continued else [])]
        for r in rows:
            lines.append([
                _cut(r["session"], ID_WIDTH), one_line(_cut(r.get("title") or "-", TITLE_WIDTH)), r.get("model") or "-", r.get("harness") or "-",
                when(r.get("created")), when(r.get("last_activity")),
                "-" if r.get("entries") is None else number(r["entries"]),
                short_id(r.get("head")), r["mark"],
            ] + ([r.get("continued_in") or "-"] if continued else []))
        echo_lines(table(_narrowed(lines), shrink=1), fit="cut")  # the title gives way last
    if damaged:
        sys.exit(1)


COMMANDS: list[click.Command] = [list_sessions]
