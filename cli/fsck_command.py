"""fsck: walk the whole store and report every problem.

Exit codes (docs/fsck.md): 0 nothing is damaged (warnings and notes may be
printed); 1 a problem was found, or the store could not be walked (one line
on stderr); 2 a usage error.
"""

from __future__ import annotations

import sys

import click

from agentsession_cas.maintenance.fsck import FsckProblem, fsck

from .common import echo, emit_json, json_option, number, one_line
from .store_commands import store_root
from .terminal import progressing


def finding_line(p: FsckProblem) -> str:
    """One line per finding: severity, code, and a message that names what and where."""
    text = f"{p.severity}: {p.code}: {one_line(p.message)}"
    if p.file and p.file not in p.message:
        text += f" ({p.file})"
    return text


def summary_line(counts: dict) -> str:
    """What the walk counted, in the words of the store it walked: a store directory's
    copies packed and loose; a database's (or the memory store's) objects per space, with
    no pack words; through an HTTP client, which walks no objects, none of either (nor the
    log records where none were counted)."""
    parts = []
    if "objects" in counts:
        if "packs" in counts:
            held = (f"{number(counts.get('packed', 0))} packed in {number(counts['packs'])} pack(s), "
                    f"{number(counts.get('loose', 0))} loose")
        else:
            held = ", ".join(f"{number(counts.get(space, 0))} {space}" for space in ("entries", "contents", "blobs"))
        parts.append(f"{number(counts['objects'])} object(s) verified ({held})")
    parts.append(f"{number(counts.get('sessions', 0))} session(s)")
    if "log_records" in counts:
        parts.append(f"{number(counts['log_records'])} log record(s)")
    if counts.get("deep_checked") is not None:
        parts.append(f"{number(counts['deep_checked'])} session(s) verified in depth")
    u = counts.get("unreferenced")
    unreferenced = "not counted (the store cannot be swept from here)" if u is None else (
        f"{number(u.get('entries', 0))} entries, {number(u.get('contents', 0))} contents, {number(u.get('blobs', 0))} blobs")
    return f"fsck: {', '.join(parts)}; unreferenced: {unreferenced}"


def run_fsck(as_json: bool, *, deep: bool = False, root: str | None = None) -> int:
    """Walk the store (``--store``, else the default) and print what was found; return
    the exit status (0 clean, 1 problems). `verify` with no argument calls this."""
    with progressing("fsck") as bar:
        report = fsck(root or store_root(), deep=deep, progress=bar.phase if bar is not None and not as_json else None)
    counts = report.counts
    if as_json:
        emit_json(report.as_dict())
        return 0 if report.ok else 1
    for p in report.errors + report.warnings:
        echo(finding_line(p))
    for p in report.notes:
        echo(f"agentsession: note: {p.code}: {one_line(p.message)}", err=True)
    echo(summary_line(counts))
    echo(f"fsck: {number(len(report.errors))} problem(s), {number(len(report.warnings))} warning(s)")
    return 0 if report.ok else 1


@click.command("fsck")
@json_option()
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
