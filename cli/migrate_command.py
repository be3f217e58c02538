"""migrate: convert a store of the earlier journal layout in place.

Exit codes (docs/migrate.md): 0 migrated, or nothing to migrate, or a dry run
that found nothing in the way; 1 refused (nothing changed), not confirmed, or
failed part way (run it again to finish); 2 a usage error; 3 a process of the
earlier layout holds one of the store's locks.
"""

from __future__ import annotations

import sys

import click

from agentsession_cas import short_id
from agentsession_cas.backends.files.layout import LAYOUT
from agentsession_cas.backends.files.migrate import MigrationReport, SessionPlan, layout_state, layout_text
from agentsession_cas.backends.files.migrate_reference import migrate_store
from agentsession_cas.errors import AgentSessionError, LayoutError, MigrationBusyError, MigrationError
from agentsession_cas.store.url import store_url_kind

from . import terminal
from .common import echo, emit_json, fail, json_option, one_line, os_code, os_message, plural
from .store_commands import store_root

#: Exit status when a writer of the earlier layout holds a lock (retry once it has stopped).
EXIT_BUSY = 3


def _stdin_is_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):  # no stdin at all (a daemon), or a closed one
        return False


def _session_line(s: SessionPlan) -> str:
    if s.action in ("rebuild", "migrated"):
        on = f" on base {short_id(s.base)}" if s.base else ""
        text = f"{s.id}: {plural(s.entries, 'entry', 'entries')}{on}, head {short_id(s.head) or 'none'}, {s.mark}"
        if s.action == "migrated":
            text += " (rebuilt by an earlier run)"
    else:
        text = f"{s.id}: {s.reason}"
        if s.trash:
            text += f" ({s.trash})"
    return text


def _print_report(report: MigrationReport) -> None:
    if report.status == "dry-run":
        echo(f"would migrate the store at {report.root} to layout {report.layout!r} (dry run: nothing changed)")
    elif report.status == "would-refuse":
        echo(f"would refuse to migrate the store at {report.root} (dry run: nothing changed):")
    else:
        resumed = ", finishing a migration that did not" if report.resumed else ""
        echo(f"migrated the store at {report.root} to layout {report.layout!r}{resumed}")
    for s in report.sessions:
        echo(f"{s.action:<10} {_session_line(s)}")
        for lost in s.lost:
            echo(f"{'lost':<10} {s.id}: {short_id(lost['entry'])}: {lost['why']}")
        for n in s.notes:
            echo(f"{'note':<10} {s.id}: {n}")
    for f in report.torn:
        echo(f"{'skipped':<10} {f} (a torn write: never committed)")
    for f in report.damaged:
        echo(f"{'skipped':<10} {f} (damaged; --skip-damaged)" if not report.problems else f"{'damaged':<10} {f}")
    unpack = "to unpack" if report.status in ("dry-run", "would-refuse") else "unpacked"
    for p in report.packs:
        echo(f"{'pack':<10} {p['pack']}: {plural(p['objects'], 'object')} {unpack}" + (f"; {p['problem']}" if p["problem"] else ""))
    if report.blobs_copied:
        echo(f"{'blobs':<10} {plural(len(report.blobs_copied), 'media blob')} copied from objects/contents to objects/blobs")
    for name in report.blobs_missing:
        echo(f"{'missing':<10} media blob {name}: named by a session, held nowhere (left unresolved, as before)")
    for problem in report.problems:
        echo(f"{'problem':<10} {problem.code}: {problem.message}")
    for r in report.refs:
        target = f"-> {r['session']}" if r["session"] else "deleted by its log's last record"
        echo(f"{'ref':<10} {r['name']} {target}" + (f" ({r['note']})" if r["note"] else ""))
    for k in report.kept:
        echo(f"{'kept':<10} {k} (remove it once you no longer need it)")


@click.command("migrate")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation (only a terminal is asked).")
@click.option("--dry-run", is_flag=True, help="Say what would be done, and change nothing.")
@click.option("-n", "dry_run_n", is_flag=True, hidden=True)  # --dry-run's spelling before session 38: -n is a count now
@click.option(
    "--skip-damaged",
    is_flag=True,
    help="Migrate even when the journal has damaged lines (not a crash's torn tail), without them.",
)
@click.option(
    "--wait",
    "lock_wait",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for a commit of the earlier layout in flight.",
)
@json_option()
def migrate_cmd(yes: bool, dry_run: bool, dry_run_n: bool, skip_damaged: bool, lock_wait: float, as_json: bool) -> None:
    """Convert a store of the earlier journal layout, or of the reference library's,
    to this release's layout, in place.

    Every session's log is rebuilt from the store-wide journal; heads, marks
    and objects are kept; the journal is kept as migrated/journal and replaced
    by a tombstone so that a writer of the earlier version fails rather than
    writes; the layout file is written last. Stop every writer of the earlier
    version and take a copy first. Running it again finishes a migration that
    was interrupted, and does nothing to a migrated store. A store of the
    reference library's layout has each session's log rebuilt from itself (kept
    as migrated/logs/<id>) and its refs rewritten (docs/migrate.md).

    A postgresql:// store's schema is upgraded to this release's version in one
    transaction instead (--dry-run lists the statements it would run).

    \b
    Exit codes: 0 migrated (or nothing to migrate); 1 refused with nothing
    changed, not confirmed, or stopped part way (run it again); 2 usage;
    3 a process of the earlier layout holds a lock of the store.
    """
    dry_run = dry_run or dry_run_n
    root = store_root()
    if store_url_kind(root)[0] == "postgresql":
        _migrate_postgresql(root, dry_run=dry_run, as_json=as_json)
        return
    state = layout_state(root)
    if state == "current":
        found = layout_text(root) or LAYOUT
        if as_json:
            emit_json(MigrationReport(root, "current", found).as_dict())
        elif found == LAYOUT:
            echo(f"nothing to migrate: the store at {root} is already of layout {LAYOUT!r}")
        else:
            echo(f"nothing to migrate: the store at {root} is of layout {found!r}, which this release reads as "
                 f"it is (its next writable open moves it to {LAYOUT!r})")
        return
    if not dry_run and not yes and _stdin_is_tty() and state in ("old", "partial", "reference"):
        what = "Finish migrating" if state == "partial" else "Migrate"
        if not click.confirm(
            f"{what} the store at {root} in place to layout {LAYOUT!r}? "
            "Every writer of the earlier version must be stopped, and a copy taken first",
            default=False,
            err=True,
        ):
            fail("migration not confirmed; nothing changed", code="not_confirmed")
    bar = terminal.progress("migrate")
    try:
        try:
            report = migrate_store(root, dry_run=dry_run, skip_damaged=skip_damaged, lock_wait=lock_wait,
                                   progress=bar.phase if bar is not None else None)
        finally:
            if bar is not None:
                bar.end()
    except MigrationError as exc:
        code = EXIT_BUSY if isinstance(exc, MigrationBusyError) else 1
        if as_json:
            emit_json({
                "store": root,
                "status": "busy" if code == EXIT_BUSY else "refused",
                "code": exc.code,
                "error": one_line(str(exc)),
                "problems": exc.problems,
            })
            sys.exit(code)
        echo(f"agentsession: error: {one_line(str(exc))}", err=True)
        sys.exit(code)
    except OSError as exc:
        # Every step is atomic and a rerun passes over what is done, so say how to finish.
        fail(f"{os_message(exc)}; the migration stopped part way: run `agentsession migrate` again to finish it",
             code=os_code(exc))
    if as_json:
        emit_json(report.as_dict())
    else:
        _print_report(report)
    if report.status == "would-refuse":
        sys.exit(1)


def _migrate_postgresql(url: str, *, dry_run: bool, as_json: bool) -> None:
    """A PostgreSQL store's schema upgraded in one transaction (docs/postgresql.md). The
    backend is imported here, for a postgresql:// store alone, as `serve` imports the
    server: it needs psycopg, the `postgresql` extra, which `migrate` of a store directory
    does not (it failed with an internal error where the extra was not installed)."""
    from agentsession_cas.backends.postgresql import migrate_store as migrate_postgresql

    try:
        plan = migrate_postgresql(url, dry_run=dry_run)
    except AgentSessionError as exc:
        fail(str(exc), code=exc.code)
    if as_json:
        emit_json(plan.as_dict())
    elif plan.status == "current":
        echo(f"nothing to migrate: the store at {plan.url} has schema version {plan.found}, this release's")
    elif plan.status == "dry-run":
        echo(f"would upgrade the store at {plan.url} from schema version {plan.found} to {plan.target}, "
             f"in one transaction (dry run: nothing changed):")
        for statement in plan.statements:
            echo(f"  {' '.join(statement.split())};")
    elif plan.status == "migrated":
        echo(f"upgraded the store at {plan.url} from schema version {plan.found} to {plan.target} "
             f"({plural(len(plan.statements), 'statement')}, one transaction)")
    elif plan.status == "no-store":
        fail(str(LayoutError.no_store(f"no store at {plan.url}", plan.url)), code=LayoutError.code)
    elif plan.status == "newer":
        fail(f"the store at {plan.url} has schema version {plan.found}, newer than this release's {plan.target}: "
             "upgrade agentsession-cas", code=LayoutError.code)
    else:
        fail(f"the store at {plan.url} changed while migrate ran (schema version {plan.found} no more); run it again",
             code=MigrationError.code)


COMMANDS: list[click.Command] = [migrate_cmd]
