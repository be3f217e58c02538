"""fsck: walk the whole store and report every problem.

Exit codes (docs/fsck.md): 0 nothing is damaged (warnings and notes may be
printed); 1 a problem was found, or the store could not be walked (one line
on stderr); 2 a usage error.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import click

from agentsession_cas.maintenance.fsck import FsckProblem, fsck

from .common import echo, emit_json, one_line
from .store_commands import store_root


def _progress(as_json: bool) -> tuple[Callable[[str], None] | None, Callable[[], None]]:
    """A phase line on stderr, redrawn at most ten times a second, only on a terminal
    and never under --json; and the function that clears it."""
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    if as_json or not tty:
        return None, lambda: None
    last = [0.0]

    def show(message: str) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.1:
            last[0] = now
            click.echo(f"\r\x1b[Kfsck: {one_line(message)}", err=True, nl=False)

    def clear() -> None:
        click.echo("\r\x1b[K", err=True, nl=False)

    return show, clear


def _line(p: FsckProblem) -> str:
    """One line per finding: severity, code, and a message that names what and where."""
    text = f"{p.severity}: {p.code}: {one_line(p.message)}"
    if p.file and p.file not in p.message:
        text += f" ({p.file})"
    return text


def run_fsck(as_json: bool, *, deep: bool = False, root: str | None = None) -> int:
    """Walk the store (``--store``, else the default) and print what was found; return
    the exit status (0 clean, 1 problems). `verify` with no argument calls this."""
    progress, clear = _progress(as_json)
    try:
        report = fsck(root or store_root(), deep=deep, progress=progress)
    finally:
        clear()
    counts = report.counts
    deep_checked = counts.get("deep_checked")
    if as_json:
        emit_json(report.as_dict())
        return 0 if report.ok else 1
    for p in report.errors + report.warnings:
        echo(_line(p))
    for p in report.notes:
        echo(f"agentsession: note: {p.code}: {one_line(p.message)}", err=True)
    u = counts.get("unreferenced", {})
    echo(
        f"fsck: {counts.get('objects', 0):,} object(s) verified ({counts.get('packed', 0):,} packed in "
        f"{counts.get('packs', 0)} pack(s), {counts.get('loose', 0):,} loose), {counts.get('sessions', 0)} session(s), "
        f"{counts.get('log_records', 0):,} log record(s)"
        + (f", {deep_checked} session(s) verified in depth" if deep_checked is not None else "")
        + f"; unreferenced: {u.get('entries', 0)} entries, {u.get('contents', 0)} contents, {u.get('blobs', 0)} blobs"
    )
    echo(f"fsck: {len(report.errors)} problem(s), {len(report.warnings)} warning(s)")
    return 0 if report.ok else 1


@click.command("fsck")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--deep", is_flag=True, help="Also verify each sound session as `verify ID` does (slower: reads every projection).")
def fsck_cmd(as_json: bool, deep: bool) -> None:
    """Check the whole store, as `git fsck --full` does; exit 1 if anything is damaged.

    Every object (loose and packed) is hashed against its name; every pack and
    index checksum checked; every session's log checksums, every entry a log or
    prefix needs (with its content), the parent, parents, base and head rules,
    and HEAD and mark against the log. Objects nothing retains are counted, not
    reported. Problems and warnings are printed one a line (stdout), notes on
    stderr. Reads only: safe beside writers. See docs/fsck.md.
    """
    sys.exit(run_fsck(as_json, deep=deep))


COMMANDS: list[click.Command] = [fsck_cmd]
