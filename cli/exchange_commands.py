"""push, fetch, handover, declare-record, take-back: exchange between stores.

Each command works on ``--store`` (the local store) and a REMOTE given as a
store's path or a ``file://`` URL; the work is :mod:`agentsession_cas.exchange.operations`'s.
What moved is printed on stdout (text, or ``--json``); a progress line goes to
stderr, and only when stderr is a terminal (cli/terminal.py). Exit status: 0 done (a head
already in place, or a fetch whose head may not move, included: a note on
stderr says why); 1 refused or failed, including a push whose head did not
move (its entries landed as a branch; the result is printed first); 2 usage.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from agentsession_cas import exchange
from agentsession_cas.errors import BadNameError, HeadMovedError, NoSuchSessionError
from agentsession_cas.exchange.operations import UNSET, ExchangeResult, Progress
from agentsession_cas.format.entry import short_id
from agentsession_cas.format.names import check_ref_name, check_session_id, full_entry_id, is_session_id
from agentsession_cas.store import Store
from agentsession_cas.store.names import resolve_entry, resolve_session

from .common import Parsed, echo, emit_json, fail, json_option, note, plural, size
from .store_commands import write_store
from .terminal import progressing


def _head(h: str | None) -> str:
    return short_id(h) if h is not None else "none"


def _run(label: str, action: Callable[[Progress | None], ExchangeResult]) -> ExchangeResult:
    """The transfer, with the one progress line (cli/terminal.py) on a terminal."""
    with progressing(label, "objects") as bar:
        return action(bar)


def _parse_ref(text: str) -> str | tuple[str, str | None]:
    """NAME, or NAME:EXPECTED (EXPECTED empty: the ref must be absent there), each
    checked by the one rule for its kind: NAME a ref name, EXPECTED a session id (what a
    ref holds). A colon is in no ref name and no session id, so the split is unambiguous."""
    name, colon, expected = text.partition(":")
    check_ref_name(name)
    if not colon:
        return name
    if expected:
        try:
            check_session_id(expected)
        except BadNameError as exc:
            raise BadNameError(f"EXPECTED, what the ref holds, is a session id ('' for none): {exc}") from None
    return name, (expected or None)


#: --ref NAME[:EXPECTED] of push, fetch and handover, checked as the command line is read.
REF = Parsed("NAME[:EXPECTED]", _parse_ref)


def _expect(value: str | None, store: Store, session_id: str) -> Any:
    """--expect as given: UNSET when absent, None for '', a full entry id as it stands (it
    names the remote's head, which this store need not hold), and any other name of an
    entry resolved by the one rule among the entries the session holds here; where this
    store holds no session of that id (declare-record --remote), a usage error, before
    the remote is asked anything."""
    if value is None:
        return UNSET
    if value == "":
        return None
    full = full_entry_id(value)
    if full is not None:
        return full
    if session_id in store:
        with store.read(session_id) as s:
            return resolve_entry(s, value)
    raise click.BadParameter(
        f"{value!r} is not a full entry id (sha256: and 64 lowercase hex digits, or the 64 digits; '' for no head), "
        f"and a prefix or legacy_id names an entry this store holds: it holds no session {session_id}",
        param_hint="'--expect'",
    )


def _local(store: Store, name: str, *, strict: bool = True) -> str:
    """A session named as everywhere (id, unique prefix, ref); with ``strict=False`` a
    name this store does not know is passed on as it is (a fetch names the remote's)."""
    try:
        return resolve_session(store, name)
    except NoSuchSessionError:
        if strict:
            raise
        return name


def _session_first(store: Store, command: str, name: str, remote: str, *, strict: bool = True) -> str:
    """:func:`_local`, where a REMOTE given before the ID (git's order, ``git push REMOTE
    REF``) is said to be so, with the command in our order, rather than refused as a
    session id that is not usable or not held: the first word names a store (a URL, a
    path, a directory) and the second could be a session id, which the first cannot be
    or this store does not hold."""
    try:
        found = _local(store, name, strict=strict)
        if strict or found != name:
            return found
        check_session_id(name)  # (what the remote would refuse: said here, with the hint)
        return name
    except (BadNameError, NoSuchSessionError):
        if _names_store(name) and not _names_store(remote) and is_session_id(remote):
            raise click.UsageError(
                f"{command} takes the session first, then the remote: agentsession {command} {remote} {name}"
            ) from None
        raise


def _names_store(text: str) -> bool:
    return "://" in text or text.startswith(("/", "./", "../", "~")) or os.path.isdir(text)


def _report(result: ExchangeResult, as_json: bool) -> None:
    """Print what moved; a refused head exits 1 after the result is printed."""
    if as_json:
        emit_json(result.as_dict())
    else:
        verb = {"push": "pushed", "handover": "handed over", "fetch": "fetched", "take-back": "took back"}[result.action]
        direction = "to" if result.action in ("push", "handover") else "from"
        moved = "received" if result.action in ("fetch", "take-back") else "sent"
        created = ""
        if result.created:
            created = ", session created there" if direction == "to" else ", session created here"
        echo(
            f"{verb} {result.session} {direction} {result.remote}: {plural(result.objects, 'object')}, "
            f"{size(result.bytes)} {moved}, {plural(result.entries, 'entry', 'entries')} admitted{created}"
        )
        if result.outcome == "unchanged":
            echo(f"head: {_head(result.head_after)} (unchanged)")
        else:
            echo(f"head: {_head(result.head_before)} -> {_head(result.head_after)} ({result.outcome})")
        for r in result.refs:
            if r.moved:
                echo(f"ref {r.name}: {r.current}" + ("" if r.changed else " (already)"))
            else:
                echo(f"ref {r.name}: not moved: {r.why}")
        if result.action == "handover" and result.handover:
            echo(f"the remote is now the record of {result.session}; this store holds it as a mirror")
        if result.action == "take-back" and result.handover:
            echo(f"this store is now the record of {result.session}; the remote holds it as a mirror")
    for text in result.notes:
        note(text)
    if result.outcome == "refused":
        there = result.head_before or "''"  # '' is how --expect says "no head"
        fail(
            f"head not moved: {result.why}; the entries landed there as a branch. Push again with "
            f"--expect {there} to move it from there, or --force",
            code=HeadMovedError.code,
        )
    if result.outcome == "not-moved":
        note(f"head not moved: {result.why}")
    for r in result.refs:
        if not r.moved:
            note(f"ref {r.name} not moved: {r.why}")


_REF_HELP = "A ref naming the session to move too, as NAME or NAME:EXPECTED (repeatable)."


@click.command()
@click.argument("session_id", metavar="ID")
@click.argument("remote", metavar="REMOTE")
@click.option("--expect", "expected", metavar="HEAD", help="The remote head you expect ('' for none); default: the last one seen there.")
@click.option("--force", is_flag=True, help="Move the remote head whatever it is (reported as forced).")
@click.option("--handover", is_flag=True, help="Make the remote the record and this store a mirror.")
@click.option("--ref", "refs", type=REF, multiple=True, metavar="NAME[:EXPECTED]", help=_REF_HELP)
@json_option()
def push(session_id: str, remote: str, expected: str | None, force: bool, handover: bool, refs: tuple[str | tuple[str, str | None], ...], as_json: bool) -> None:
    """Push session ID, of which this store is the record, to REMOTE (a store's path or URL, or an http(s) server).

    Sends only the objects the remote lacks, has it admit the entries (a
    session it lacks is created there as a mirror), then moves its head by
    compare-and-swap from the head last seen there. A head that moved
    meanwhile is not moved: the entries land as a branch and the command
    exits 1.
    """
    with write_store() as store:
        session_id = _session_first(store, "push", session_id, remote)
        expect = _expect(expected, store, session_id)
        result = _run("sending objects", lambda bar: exchange.push(
            store, remote, session_id, expected=expect, force=force, handover=handover,
            refs=list(refs), progress=bar,
        ))
    _report(result, as_json)


@click.command()
@click.argument("session_id", metavar="ID")
@click.argument("remote", metavar="REMOTE")
@click.option("--ref", "refs", type=REF, multiple=True, metavar="NAME[:EXPECTED]",
              help="A ref of the remote naming the session to set here too (repeatable).")
@json_option()
def fetch(session_id: str, remote: str, refs: tuple[str | tuple[str, str | None], ...], as_json: bool) -> None:
    """Fetch session ID from REMOTE, which may be its record or a mirror.

    A session this store lacks is created as a mirror. Its head moves to the
    fetched head only when this store is a mirror and that head descends from
    its own; otherwise a note says why it did not (exit 0).
    """
    with write_store() as store:
        session_id = _session_first(store, "fetch", session_id, remote, strict=False)
        result = _run("receiving objects", lambda bar: exchange.fetch(
            store, remote, session_id, refs=list(refs), progress=bar,
        ))
    _report(result, as_json)


@click.command()
@click.argument("session_id", metavar="ID")
@click.argument("remote", metavar="REMOTE")
@click.option("--expect", "expected", metavar="HEAD", help="The remote head you expect ('' for none); default: the last one seen there.")
@click.option("--ref", "refs", type=REF, multiple=True, metavar="NAME[:EXPECTED]", help=_REF_HELP)
@json_option()
def handover(session_id: str, remote: str, expected: str | None, refs: tuple[str | tuple[str, str | None], ...], as_json: bool) -> None:
    """Hand session ID over to REMOTE: push it, make the remote the record, then make this store a mirror.

    The remote's mark is committed before this store clears its own, so a
    failure between the two leaves two records, never none; running the
    command again finishes it.
    """
    with write_store() as store:
        session_id = _session_first(store, "handover", session_id, remote)
        expect = _expect(expected, store, session_id)
        result = _run("sending objects", lambda bar: exchange.handover(
            store, remote, session_id, expected=expect, refs=list(refs), progress=bar,
        ))
    _report(result, as_json)


@click.command("declare-record")
@click.argument("session_id", metavar="ID")
@click.option("--remote", metavar="REMOTE", help="Declare REMOTE the record instead of this store.")
@click.option("--expect", "expected", metavar="HEAD", help="The head the store must hold ('' for none).")
@json_option()
def declare_record(session_id: str, remote: str | None, expected: str | None, as_json: bool) -> None:
    """Make a store the record of session ID, which it holds as a mirror.

    For a session whose record deleted it without handing it over, or whose
    only copy is a mirror. With --expect, refused if the head moved.
    """
    with write_store() as store:
        if remote is None:
            session_id = _local(store, session_id)
        result = exchange.declare_record(store, session_id, expected=_expect(expected, store, session_id), remote=remote)
    where = "here" if remote is None else f"at {remote}"
    if as_json:
        emit_json({**result.as_dict(), "remote": remote})
        return
    if result.changed:
        echo(f"{session_id} is now the record {where} (head {_head(result.head)})")
    else:
        note(f"{session_id} already is the record {where}; nothing was written")


@click.command("take-back")
@click.argument("session_id", metavar="ID")
@click.argument("remote", metavar="REMOTE")
@json_option()
def take_back(session_id: str, remote: str, as_json: bool) -> None:
    """Take the record of session ID back from REMOTE: fetch, declare it here, release it there.

    This store declares itself the record before the remote gives up its
    mark, so a failure between leaves two records, never none; running the
    command again finishes it.
    """
    with write_store() as store:
        session_id = _session_first(store, "take-back", session_id, remote, strict=False)
        result = _run("receiving objects", lambda bar: exchange.take_back(store, remote, session_id, progress=bar))
    _report(result, as_json)


COMMANDS: list[click.Command] = [push, fetch, handover, declare_record, take_back]
