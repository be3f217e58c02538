"""The damage table: one byte of one file at a time, flipped, zeroed or cut, on a copy
of a store holding loose and packed objects, a fork, a sidecar blob, a mirror and a ref.

For each damage the command is asked, in process (click's runner, so a traceback is an
exception we see): ``fsck`` must fail naming the file (or the damage must be harmless:
every read gives the pristine bytes and fsck is clean); ``show``, ``export``, ``log``,
``cat-object``, ``ref show`` and ``list`` must give the pristine output or fail; nothing
may end in a traceback; ``repair --yes`` of each session fsck names, then ``pack`` when
fsck names a pack, must leave fsck clean with every read as it was, where the bytes
survive somewhere (a log's payload, another copy).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner, Result

from agentsession_cli.main import main

OPS = ("flip", "zero", "cut")

#: Reads that still differ from the pristine store, by (file kind, damage, command), and
#: why: each names the change that closes it (outside the torture suite's files). Empty:
#: the last one (``log`` of a log cut short listing what was left, exit 0) is closed.
KNOWN_GAPS: dict[tuple[str, str, str], str] = {}


def invoke(root: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--store", str(root), *args], catch_exceptions=True)


def is_traceback(r: Result) -> bool:
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        return True
    return "internal error" in r.output or "Traceback" in r.output


def reads(info: dict) -> list[tuple[str, ...]]:
    """The read commands whose output is compared with the pristine store's."""
    out: list[tuple[str, ...]] = []
    for sid in ("rec", "fork", "side", "bigsrc", "mirror"):
        out += [("show", sid), ("export", sid), ("log", sid), ("head", sid)]
    out += [("cat-object", info["rec"][5]), ("cat-object", info["bigsrc"][7]), ("cat-object", info["blob"])]
    out += [("cat-object", c) for c in info.get("contents", [])]
    out += [("ref", "show", "chat/one"), ("list",)]
    return out


def read_all(root: Path, info: dict) -> dict[tuple[str, ...], Result]:
    return {cmd: invoke(root, *cmd) for cmd in reads(info)}


def damaged(path: Path, op: str, at: int) -> bytes:
    data = bytearray(path.read_bytes())
    if op == "flip":
        data[at] ^= 0x01
    elif op == "zero":
        data[at] = 0 if data[at] else 0x30
    else:
        del data[at:]
    return bytes(data)


def positions(size: int, many: bool) -> list[int]:
    if size == 0:
        return []
    cand = [0, size // 2, size - 1] if not many else [0, 1, 5, 12, size // 4, size // 2, 3 * size // 4, size - 33, size - 2, size - 1]
    return sorted({p for p in cand if 0 <= p < size})


@dataclass
class Row:
    kind: str
    tried: int = 0
    found: int = 0
    harmless: int = 0
    wrong: int = 0
    tracebacks: int = 0
    saved: int = 0
    unsaved: int = 0
    known: int = 0
    failures: list[str] = field(default_factory=list)


def files_of(root: Path, info: dict) -> dict[str, Path]:
    """One file of each kind the store keeps."""
    h = info["rec"][5].split(":", 1)[1]
    idx = sorted((root / "objects" / "pack").glob("pack-*.idx"))[0]
    return {
        "loose object": root / "objects" / "entries" / h[:2] / h[2:],
        "pack": idx.with_suffix(".pack"),
        "pack index": idx,
        "log (committed)": root / "sessions" / "rec" / "log",
        "log (tail)": root / "sessions" / "fork" / "log",
        "HEAD": root / "sessions" / "rec" / "HEAD",
        "mark": root / "sessions" / "mirror" / "mark",
        "header": root / "sessions" / "rec" / "header",
        "layout": root / "layout",
        "ref": root / "refs" / "chat%one",
        "lock": root / "locks" / "rec.lock",
        "summary": root / "sessions" / "rec" / "summary",
    }


def tail_positions(path: Path, many: bool) -> list[int]:
    """Positions inside the last record of a log (its tail)."""
    data = path.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    n = len(data)
    cand = [start, start + 1, (start + n) // 2, n - 2, n - 1] if many else [start, (start + n) // 2, n - 1]
    return sorted({p for p in cand if start <= p < n})


def damages(root: Path, info: dict, many: bool) -> Iterator[tuple[str, Path, str, int]]:
    for kind, path in files_of(root, info).items():
        if kind == "lock":
            # A lock holds no bytes: its damage is bytes where none belong.
            yield kind, path, "garbage", 0
            continue
        size = path.stat().st_size
        pos = tail_positions(path, many) if kind == "log (tail)" else positions(size, many)
        if kind == "log (committed)":  # records before the last commit: the first half of rec's log
            pos = sorted({size * k // 24 for k in (range(12) if many else (0, 3, 6, 9))})
        for op in OPS:
            for at in pos:
                yield kind, path, op, at


def fsck_names(out: str, root: Path, path: Path) -> bool:
    rel = str(path.relative_to(root))
    parts = rel.split("/")
    if rel in out:
        return True
    if parts[0] == "sessions":  # session files: the session and the file
        return parts[1] in out and (parts[2] in out or "log" in out)
    if parts[0] == "objects" and parts[1] != "pack":
        return (parts[2] + parts[3]) in out
    if parts[0] == "objects":
        return parts[2].rsplit(".", 1)[0] in out
    return False


def sessions_named(out: str) -> list[str]:
    return [s for s in ("rec", "fork", "side", "bigsrc", "mirror") if f"{s}:" in out or f"session {s}" in out or f"sessions/{s}/" in out]


def play(pristine: Path, info: dict, work: Path, many: bool = False, only: Callable[[str], bool] | None = None) -> dict[str, Row]:
    base = read_all(pristine, info)
    rows: dict[str, Row] = {}
    copy = work / "copy"
    for kind, path, op, at in damages(pristine, info, many):
        if only is not None and not only(kind):
            continue
        row = rows.setdefault(kind, Row(kind))
        row.tried += 1
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(pristine, copy, symlinks=True)
        target = copy / path.relative_to(pristine)
        if op == "garbage":
            target.write_bytes(b"\x00garbage\xff" * 3)
        else:
            target.write_bytes(damaged(path, op, at))
        what = f"{kind} {op}@{at} ({path.relative_to(pristine)})"
        fs = invoke(copy, "fsck")
        tb = is_traceback(fs)
        got = read_all(copy, info)
        wrong = []
        for cmd, r in got.items():
            tb = tb or is_traceback(r)
            b = base[cmd]
            if r.exit_code == 0 and r.stdout_bytes != b.stdout_bytes:
                if kind == "log (tail)" and cmd[0] == "log" and _records_prefix(r.stdout, b.stdout):
                    continue  # the damaged tail's records are left out, as a crash's would be: nothing served wrongly
                if (kind, op, cmd[0]) in KNOWN_GAPS:
                    row.known += 1
                    row.failures.append(f"{what}: known gap: {' '.join(cmd)} {KNOWN_GAPS[(kind, op, cmd[0])]}")
                    continue
                wrong.append(" ".join(cmd))
        same = not wrong and all(r.exit_code == base[c].exit_code for c, r in got.items())
        if fs.exit_code != 0 and fsck_names(fs.output, copy, target):
            row.found += 1
        elif kind == "log (tail)" and "log-tail" in fs.output and fsck_names(fs.output, copy, target):
            # A damaged tail after the last commit is what a crash leaves: fsck notes it (exit 0)
            # and the next writing open drops it; nothing committed is in it.
            row.found += 1
        elif fs.exit_code == 0 and same:
            row.harmless += 1
        else:
            row.failures.append(f"{what}: fsck exit {fs.exit_code} not naming the file: {fs.output.strip()[:300]}")
        if wrong:
            row.wrong += 1
            row.failures.append(f"{what}: served wrongly by {wrong}")
        if tb:
            row.tracebacks += 1
            row.failures.append(f"{what}: traceback")
        if fs.exit_code == 0 and "log-tail" not in fs.output:
            continue
        # pack when fsck names a pack, then repair each session fsck then names
        if "bad-pack" in fs.output:
            r = invoke(copy, "pack")
            if is_traceback(r):
                row.tracebacks += 1
                row.failures.append(f"{what}: pack traceback")
            fs = invoke(copy, "fsck")
        for sid in sessions_named(fs.output):
            r = invoke(copy, "repair", "--yes", sid)
            if is_traceback(r):
                row.tracebacks += 1
                row.failures.append(f"{what}: repair {sid} traceback")
        after = invoke(copy, "fsck")
        # a repaired log is rewritten: its records' lines are not the same, its entries are
        again = {c: r for c, r in read_all(copy, info).items() if c[0] != "log"}
        if after.exit_code == 0 and all(
            (r.exit_code == 0) == (base[c].exit_code == 0) and (r.exit_code != 0 or r.output == base[c].output) for c, r in again.items()
        ):
            row.saved += 1
        else:
            row.unsaved += 1
            bad = [" ".join(c) for c, r in again.items() if r.exit_code != base[c].exit_code or (r.exit_code == 0 and r.output != base[c].output)]
            row.failures.append(f"{what}: not saved by repair: fsck {after.exit_code} {after.output.strip()[:200]!r}; reads differ: {bad[:6]}")
    return rows


def _records_prefix(got: str, base: str) -> bool:
    """Whether a log listing holds the first records of another (columns re-aligned)."""
    g = [ln.split() for ln in got.splitlines()]
    b = [ln.split() for ln in base.splitlines()]
    return len(g) < len(b) and g == b[: len(g)]


def table(rows: dict[str, Row]) -> str:
    head = (f"{'file':<18} {'tried':>5} {'found':>5} {'harmless':>8} {'served wrongly':>14} {'tracebacks':>10} "
            f"{'saved':>5} {'not saved':>9} {'known gap':>9}")
    lines = [head, "-" * len(head)]
    tot = Row("total")
    for r in rows.values():
        lines.append(f"{r.kind:<18} {r.tried:>5} {r.found:>5} {r.harmless:>8} {r.wrong:>14} {r.tracebacks:>10} {r.saved:>5} "
                     f"{r.unsaved:>9} {r.known:>9}")
        for f in ("tried", "found", "harmless", "wrong", "tracebacks", "saved", "unsaved", "known"):
            setattr(tot, f, getattr(tot, f) + getattr(r, f))
    lines.append(f"{'total':<18} {tot.tried:>5} {tot.found:>5} {tot.harmless:>8} {tot.wrong:>14} {tot.tracebacks:>10} "
                 f"{tot.saved:>5} {tot.unsaved:>9} {tot.known:>9}")
    return "\n".join(lines)
