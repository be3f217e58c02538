"""ref list/show/update/delete: named refs to sessions (agentsession_cas.store.refs).

list and show open the store read-only (no lock, nothing written); update
and delete are compare-and-swaps, durable when the command exits 0. A
wrong expectation exits 1 with one line saying what the ref holds now.
"""

from __future__ import annotations

from typing import Any

import click

from agentsession_cas.errors import AgentSessionError, NoSuchRefError, RefMovedError
from agentsession_cas.store.refs import Ref, Refs

from .common import echo, emit_json, fail, json_option, note, table
from .store_commands import read_store, write_store
from .terminal import start_pager as page

_STATE_TEXT = {
    "ok": "ok",
    "dangling": "dangling: the session is not in the store",
    "replaced": "replaced: the session was deleted and created again since the ref was set",
}


def _row(refs: Refs, ref: Ref) -> dict[str, Any]:
    return {**ref.as_dict(), "state": refs.state(ref)}


@click.group("ref")
def ref() -> None:
    """Named refs: store-wide names (chat/slack/C123) for sessions.

    A ref moves only by compare-and-swap: update and delete name the session
    they expect the ref to hold, and refuse, writing nothing, when it holds
    another. Exit status: 0 done; 1 refused (moved, bad or conflicting name,
    no such session or ref); 2 usage.
    """


@ref.command("list", short_help="List the refs whose name begins with PREFIX: name, session, state.")
@click.argument("prefix", metavar="[PREFIX]", required=False, default="")
@json_option()
def list_refs(prefix: str, as_json: bool) -> None:
    """List the refs whose name begins with PREFIX, in name order: name, session, state.

    STATE is ok, dangling (the session is gone) or replaced (deleted and
    created again since the ref was set). A ref file that cannot be read
    stops the listing after what was read, with exit status 1.
    """
    refs = Refs(read_store())
    rows: list[dict[str, Any]] = []
    error: AgentSessionError | None = None
    try:
        for r in refs.iter(prefix):
            rows.append(_row(refs, r))
    except AgentSessionError as exc:
        error = exc
    if as_json:
        emit_json(rows)
    elif rows:
        lines = [["NAME", "SESSION", "STATE"]] + [[r["name"], r["session"], r["state"]] for r in rows]
        page()
        for line in table(lines):
            echo(line, fit="cut")
    if error is not None:
        fail(str(error), code=error.code)


@ref.command("show", short_help="Print a ref: the session it names and that session's state.")
@click.argument("name")
@json_option()
def show_ref(name: str, as_json: bool) -> None:
    """Print a ref: its name, the session it names, and that session's state.

    A dangling ref is shown (exit 0); a missing one is an error (exit 1).
    """
    refs = Refs(read_store())
    found = refs.get(name)
    if found is None:
        raise NoSuchRefError(f"no such ref: {name}")
    row = _row(refs, found)
    if as_json:
        emit_json(row)
        return
    for line in table([["ref", name], ["session", found.session], ["state", _STATE_TEXT[row["state"]]]]):
        echo(line)


def _expected(value: str | None) -> str | None:
    return value or None


@ref.command("update", short_help="Point the ref NAME at SESSION, by compare-and-swap.")
@click.argument("name")
@click.argument("session_id", metavar="SESSION")
@click.option(
    "--expect",
    "expected",
    metavar="OLD",
    help="The session the ref holds now (compare-and-swap). Omitted or '': the ref must not exist yet.",
)
@json_option()
def update_ref(name: str, session_id: str, expected: str | None, as_json: bool) -> None:
    """Point the ref NAME at SESSION, if it holds OLD (or, without --expect, does not exist).

    SESSION must be a session the store holds. A new name must not be under
    another ref, have one under it, or differ only in case from one.
    """
    try:
        with write_store() as store:
            result = Refs(store).update(name, session_id, expected=_expected(expected))
    except RefMovedError as exc:
        if exc.expected is None and exc.current is not None:
            fail(f"{exc}; to move it, pass --expect {exc.current}", code=exc.code)
        raise
    if not result.changed:
        note(f"ref {name} already holds session {session_id}; nothing was written")
    if as_json:
        emit_json(result.as_dict())


@ref.command("delete", short_help="Delete the ref NAME (the session it names stays).")
@click.argument("name")
@click.option(
    "--expect",
    "expected",
    metavar="OLD",
    help="The session the ref holds now (compare-and-swap). Omitted: whatever it holds when read.",
)
@json_option()
def delete_ref(name: str, expected: str | None, as_json: bool) -> None:
    """Delete the ref NAME (the session it names stays).

    With --expect OLD the ref is deleted only if it holds OLD. Without it,
    the command reads the ref and deletes it if it still holds that session.
    """
    if expected == "":
        raise click.UsageError("--expect for delete names the session the ref holds; it cannot be empty")
    with write_store() as store:
        refs = Refs(store)
        if expected is None:
            current = refs.get(name)
            if current is None:
                raise NoSuchRefError(f"no such ref: {name}")
            expected = current.session
        result = refs.delete(name, expected=expected)
    if as_json:
        emit_json(result.as_dict())


COMMANDS: list[click.Command] = [ref]
