"""pack and sweep: keeping a store's objects compact and free of garbage.

Both hold the store's pack lock for their whole run; both write one new pack
and remove what it replaced only once it is durable. Exit status: 0 done, 1
refused or failed (one line on stderr), 2 bad usage.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from agentsession_cas.backends.files.objects import RepackResult
from agentsession_cas.errors import AgentSessionError
from agentsession_cas.maintenance.sweep import DEFAULT_GRACE, parse_duration

from . import terminal
from .common import DURATION, echo, emit_json, fail, json_option, number, one_line, os_code, os_message, plural, size
from .store_commands import read_store, write_store


def _report_problems(res: RepackResult, as_json: bool) -> None:
    """Problems on stderr (unless the JSON document, which holds them, was printed), then
    exit 1 if there were any: the work was done for everything else, but the store holds
    something damaged (run fsck)."""
    if not as_json:
        for n in res.notes:
            echo(f"agentsession: note: {n.code}: {one_line(n.message)}", err=True)
        for p in res.problems + res.unread():
            echo(f"agentsession: error: {p.code}: {one_line(p.message)}", err=True)
    if not res.ok:
        sys.exit(1)


@click.command()
@json_option()
def pack(as_json: bool) -> None:
    """Move every loose object and every pack into one new pack, recompressed.

    Each object is verified against its name as it is copied; a corrupt one is
    reported and left where it was, never copied. The old packs and loose files
    are removed only once the new pack is durable.
    """
    progress = terminal.progress("packing", "objects")
    try:
        try:
            with write_store() as store:
                res = store.pack(progress=progress)
        finally:
            if progress:
                progress.end()  # a line an error interrupted: the error goes on a line of its own
    except AgentSessionError as exc:
        fail(str(exc), code=exc.code, as_json=as_json)
    except OSError as exc:
        fail(f"pack failed: {os_message(exc)}", code=os_code(exc), as_json=as_json)
    if as_json:
        emit_json(res.as_dict())
    else:
        echo(
            f"packed {plural(res.objects, 'object')} from {number(res.packs_before)} pack(s) and "
            f"{plural(res.loose_before, 'loose file')} into {number(res.packs_after)} pack(s): "
            f"{size(res.bytes_before)} -> {size(res.bytes_after)}"
        )
    _report_problems(res, as_json)


@click.command()
@click.option("--grace", "grace_text", type=DURATION, default=None, metavar="DURATION",
              help="Keep anything younger than this (0, 90s, 15m, 12h, 14d, 2w). Default 14d.")
@click.option("--dry-run", is_flag=True, help="List what would go and the bytes it would free; change nothing.")
@click.option("--force", is_flag=True,
              help="Sweep with a grace under 1h even while writers hold sessions (their objects in flight may go).")
@json_option()
def sweep(grace_text: str | None, dry_run: bool, force: bool, as_json: bool) -> None:
    """Remove objects nothing retained names (RFC 0002 "Deletion and retention").

    An envelope stays while any session's log or prefix names it, a content
    while a retained envelope names it, a blob while a retained content names
    it by a sidecar: URL; abandoned branches are in logs and always stay;
    nothing younger than the grace period goes. What stays of the files older
    than the grace period is repacked into one pack; younger files are left
    as they are.
    """
    grace = DEFAULT_GRACE if grace_text is None else parse_duration(grace_text)  # (DURATION judged it)
    progress = terminal.progress("sweeping", "objects")
    try:
        try:
            # A dry run opens the store read-only: a writing store's close packs loose
            # objects and merges packs, and a dry run changes nothing.
            with (read_store() if dry_run else write_store()) as store:
                res = store.sweep(
                    grace=grace, dry_run=dry_run, force=force, progress=progress, phase=progress.phase if progress else None
                )
        finally:
            if progress:
                progress.end()  # a line an error interrupted: the error goes on a line of its own
    except AgentSessionError as exc:
        fail(str(exc), code=exc.code, as_json=as_json)
    except OSError as exc:
        fail(f"sweep failed: {os_message(exc)}", code=os_code(exc), as_json=as_json)
    r = res.repack
    if as_json:
        data: dict[str, Any] = res.as_dict()
        emit_json(data)
    else:
        verb = "would remove" if dry_run else "removed"
        if dry_run:
            for name in r.dropped_names:
                echo(name, fit=None)
        echo(
            f"{verb} {number(r.dropped)} object(s), {size(r.dropped_bytes)}; kept {number(r.objects)} "
            f"(retained by {number(res.sessions)} session(s)"
            + (f" and {number(res.staged)} staged" if res.staged else "")
            + f", grace {grace_text or '14d'})"
            + (f"; left {number(res.young_files)} {res.young_unit}(s) younger than the grace period as they are"
               if res.young_files else "")
            + ("" if dry_run else f"; {size(r.bytes_before)} -> {size(r.bytes_after)}")
        )
        for path in res.tmp_removed:
            echo(f"removed leftover {path}")
    _report_problems(r, as_json)


COMMANDS: list[click.Command] = [pack, sweep]
