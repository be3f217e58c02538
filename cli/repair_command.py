"""repair: rewrite a damaged session log from the records that read.

Exit codes (docs/repair.md): 0 repaired, or nothing to repair, or a dry run
printed; 1 a refusal or an error (the session is locked by another process,
cannot be repaired, does not exist, or the confirmation was declined), with
one line on stderr and nothing written; 2 a usage error.
"""

from __future__ import annotations

import sys

import click

from agentsession_cas.backends.base import FsckProblem
from agentsession_cas.backends.files.repair import RepairReport
from agentsession_cas.maintenance.repair import plan_repair, repair_session, repair_target

from . import terminal
from .common import echo, emit_json, fail, json_option, number, one_line, plural, size
from .store_commands import read_store, write_store


def _on_terminal() -> bool:
    """Whether a person can be asked: the answer is read from stdin."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def report_lines(rep: RepairReport) -> list[str]:
    """The plan (or what was done) as text, one fact a line, labels padded to nine columns."""
    out: list[str] = []
    if not rep.damaged:
        if not rep.stale_indexes and not rep.restorable and not rep.unrestorable and not rep.notes:
            return [f"session {rep.session} is not damaged: {rep.why}; nothing to repair"]
        lines = [f"session {rep.session} is not damaged: {rep.why}; what it leads to is not all sound"]
        done = "rewritten" if rep.indexes_fixed else "to rewrite"
        for name, said, value in rep.stale_indexes:
            shown = "missing" if said is None else repr(said or "no head")
            lines.append(f"{name:<9}said {shown}, the log says {value or 'no head'!r}: {done}")
        done = "restored" if rep.objects_restored else "to restore"
        for space, name in rep.restorable:
            lines.append(f"{'object':<9}{space} {name}: missing or corrupt in objects/, whole in the log: {done}")
        for space, name in rep.unrestorable:
            lines.append(f"{'object':<9}{space} {name}: missing or corrupt in objects/, and no copy in the log: "
                         "a repair cannot restore it")
        if rep.unrestorable:
            lines.append(f"{'note':<9}`agentsession verify {rep.session}` names what needs them; a store that holds "
                         "the session whole can give them back (fetch it from there)")
        lines.extend(_note_line(n) for n in rep.notes)
        return lines
    out.append(f"{'session':<9}{rep.session}: {one_line(rep.why)}")
    for d in rep.damage:
        legible = f"; still legible: append of {', '.join(d.legible)}" if d.legible else ""
        out.append(f"{'damaged':<9}line {d.line} (offset {d.offset}, {size(d.length)}): {d.reason}{legible}")
    if rep.create_rebuilt:
        out.append(f"{'create':<9}rebuilt from the header")
    out.append(f"{'kept':<9}{plural(len(rep.kept), 'entry', 'entries')}, {number(len(rep.recovered))} of them recovered from what the damage hid")
    for r in rep.recovered:
        if r.how == "salvaged":
            how = f"salvaged from damaged line {r.line}: its record or its payload still reads there, and its objects are whole"
        elif r.how == "snapshot":
            how = "named by the kept snapshot (PostgreSQL) that stands for the rows the log lost; its objects are whole"
        elif r.how == "head":
            how = "named by HEAD (or on its path), which no record holds: the log lost committed records; its objects are whole"
        else:
            how = "hidden by the damage: a kept record names it and its objects are whole in objects/"
        out.append(f"{'recovered':<9} {r.entry} seq {r.seq}: {how}")
    for dropped in rep.dropped:
        where = []
        if dropped.seq is not None:
            where.append(f"seq {dropped.seq}")
        if dropped.line is not None:
            where.append(f"line {dropped.line}")
        at = f" ({', '.join(where)})" if where else ""
        out.append(f"{'dropped':<9}{dropped.entry}{at}: {dropped.reason}: {one_line(dropped.message)}")
    out.append(f"{'head':<9}{rep.head or 'none'}, {rep.head_note}")
    out.append(f"{'mark':<9}{rep.mark}")
    out.append(f"{'seq':<9}{rep.seq} (no sequence number up to it is given out again)")
    out.extend(_note_line(n) for n in rep.notes)
    return out


def _note_line(n: FsckProblem) -> str:
    return f"{'note':<9}{n.code}: {one_line(n.message)}"


@click.command("repair")
@click.argument("session_id", metavar="ID")
@click.option("--dry-run", is_flag=True, help="Print what would be kept, recovered and dropped; write nothing.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation (for scripts).")
@json_option()
def repair(session_id: str, dry_run: bool, yes: bool, as_json: bool) -> None:
    """Rewrite a damaged session's log from the records that read.

    Records that read are kept; entries the damage hid are recovered only
    where their objects prove them; appends that cannot be kept (objects
    missing, parent not kept) are dropped and listed. The damaged log is
    kept in the session directory as log.damaged-<UTC time>. The session's
    lock is taken: a session another process holds is refused. On a
    terminal it asks first (--yes skips the question); without one it
    proceeds. A session that is not damaged is left as it is (exit 0).
    See docs/repair.md.
    """
    bar = terminal.progress("repair")
    progress = bar.phase if bar is not None else None

    def clear() -> None:
        """Take the phase line away (before a question, a result or an error line)."""
        if bar is not None:
            bar.end()

    if dry_run:
        try:
            with read_store() as store:
                rep = plan_repair(store, repair_target(store, session_id), progress=progress)
        finally:
            clear()
        _print(rep, as_json, dry_run=True)
        return

    def confirm(plan: RepairReport) -> bool:
        clear()
        for line in report_lines(plan):
            echo(line, err=True)
        try:
            return click.confirm(f"Rewrite the log of session {plan.session} as above?", default=False, err=True)
        except click.Abort:
            return False

    ask = not yes and _on_terminal()
    try:
        with write_store() as store:
            session_id = repair_target(store, session_id)
            rep = repair_session(store, session_id, confirm=confirm if ask else None, progress=progress)
    finally:
        clear()
    if rep.cancelled:
        if as_json:
            emit_json(rep.as_dict() | {"dry_run": False})
        fail(f"repair of session {session_id} cancelled; nothing written", code="not_confirmed")
    _print(rep, as_json, dry_run=False, shown=ask)


def _print(rep: RepairReport, as_json: bool, *, dry_run: bool, shown: bool = False) -> None:
    if as_json:
        emit_json(rep.as_dict() | {"dry_run": dry_run})
        return
    if not shown or not rep.damaged:  # after a confirmation the plan is on the screen already
        for line in report_lines(rep):
            echo(line)
    if not rep.damaged:
        return
    if dry_run:
        echo("dry run: nothing written")
    else:
        echo(f"repaired; the damaged log is kept as {rep.damaged_log or '(none: there was no log)'} until you remove it")


COMMANDS: list[click.Command] = [repair]
