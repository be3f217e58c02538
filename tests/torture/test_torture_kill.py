"""Crashes in maintenance (issue 16): SIGKILL at random moments of pack, sweep, repair,
import, push, fetch and migrate, each a process of the command on a copy of a small
store. A moment is a writing step of the run (kill_at.py counts them: opens for
writing, renames, removes, writes, fsyncs), drawn at random with a fixed seed, so every
kill lands inside the work and the same kills are played on every machine. Afterwards fsck is clean, or names what `pack` and `repair` then fix (for
migrate: what running it again finishes); no committed entry is lost (every session
exports as before; an import, push or fetch killed is absent or whole)."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from damage import invoke

KILLS = 24  # per command; the seeds are fixed, the steps spread over each run

#: Each command as (the store it runs in, its arguments): ``root`` is a copy of the
#: rich store, ``remote`` a store of its own (empty, or what the push left there).
COMMANDS = {
    "pack": lambda root, remote, file: (root, ["pack"]),
    "sweep": lambda root, remote, file: (root, ["sweep", "--grace", "0", "--force"]),
    "repair": lambda root, remote, file: (root, ["repair", "--yes", "bigsrc"]),
    "import": lambda root, remote, file: (root, ["import", str(file)]),
    "push": lambda root, remote, file: (root, ["push", "bigsrc", str(remote)]),
    "fetch": lambda root, remote, file: (remote, ["fetch", "bigsrc", str(root)]),
}


KILL_AT = Path(__file__).with_name("kill_at.py")


def steps(root: Path, args: list[str], tmp_path: Path) -> int:
    """Run the command whole, counting its writing steps (kill_at.py)."""
    count = tmp_path / "steps"
    p = subprocess.run([sys.executable, str(KILL_AT), "0", str(count), "--store", str(root), *args],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    assert p.returncode == 0, p.stderr.decode()[-500:]
    return int(count.read_text())


def run_killed(root: Path, args: list[str], at: int) -> bool:
    """Run the command and SIGKILL it at its ``at``-th writing step; True when it was
    killed (a run that took another path may end first)."""
    p = subprocess.run([sys.executable, str(KILL_AT), str(at), "-", "--store", str(root), *args],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return p.returncode == -signal.SIGKILL


def kill_points(total: int, seed: str) -> list[int]:
    """Up to KILLS distinct steps of a run of ``total``, spread at random (fixed seed);
    every step when there are no more than KILLS."""
    if total <= KILLS:
        return list(range(1, total + 1))
    return sorted(random.Random(seed).sample(range(1, total + 1), KILLS))


SESSIONS = ("rec", "fork", "side", "bigsrc", "mirror", "imp")


def heal(root: Path, sessions: tuple[str, ...] | list[str] = SESSIONS) -> str:
    """What an operator does after a crash: fsck, then pack and repair what it names."""
    fs = invoke(root, "fsck")
    if fs.exit_code == 0:
        return fs.output
    if "pack" in fs.output.split("problem(s)")[0]:
        invoke(root, "pack")
    for sid in sessions:
        if f"session {sid}" in fs.output or f"sessions/{sid}/" in fs.output:
            invoke(root, "repair", "--yes", sid)
    return invoke(root, "fsck").output


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_sigkill_in_maintenance_loses_no_committed_entry(rich_store, tmp_path, command):
    pristine, info = rich_store
    base = {sid: invoke(pristine, "export", sid).stdout_bytes for sid in ("rec", "fork", "side", "bigsrc", "mirror")}
    file = tmp_path / "imp.jsonl"
    file.write_bytes(base["rec"].replace(b'"id":"rec"', b'"id":"imp"', 1))
    remote = tmp_path / "remote"
    invoke(remote, "init")

    def fresh(k: object) -> tuple[Path, Path]:
        root, rem = tmp_path / f"k{k}", tmp_path / f"r{k}"
        shutil.copytree(pristine, root, symlinks=True)
        shutil.copytree(remote, rem, symlinks=True)
        if command == "repair":  # something to repair: bigsrc's log cut short at a record boundary
            log = root / "sessions" / "bigsrc" / "log"
            lines = log.read_bytes().splitlines(keepends=True)
            log.write_bytes(b"".join(lines[: len(lines) // 2]))
        return root, rem

    # the run whole, its writing steps counted: the kills are spread over them
    total = steps(*COMMANDS[command](*fresh("probe"), file), tmp_path)
    points = kill_points(total, f"kill-{command}")
    failures = []
    killed = partial = 0
    for k in points:
        root, rem = fresh(k)
        killed += run_killed(*COMMANDS[command](root, rem, file), k)
        out = heal(root)
        if "0 problem(s)" not in out:
            failures.append(f"kill {k}: fsck after healing: {out[-400:]}")
        for sid, want in base.items():
            got = invoke(root, "export", sid)
            if got.stdout_bytes != want:
                failures.append(f"kill {k}: {sid} exports otherwise ({got.output[-200:]})")
        if command == "import":
            got = invoke(root, "export", "imp")
            if got.exit_code == 0 and got.stdout_bytes != file.read_bytes():
                failures.append(f"kill {k}: the import is neither absent nor whole")
        if command in ("push", "fetch"):
            # RFC 0002: a receiver creates the session, admits the entries, then moves the
            # head; a kill between leaves the session with part of them (each whole and
            # committed, fsck clean), and the same push or fetch run again completes it.
            if invoke(rem, "fsck").exit_code != 0 and "0 problem(s)" not in heal(rem):
                failures.append(f"kill {k}: the receiver is damaged after healing")
            got = invoke(rem, "export", "bigsrc")
            if got.exit_code == 0 and got.stdout_bytes != base["bigsrc"]:
                partial += 1
                store, args = COMMANDS[command](root, rem, file)
                again = invoke(store, *args)
                if again.exit_code != 0 or invoke(rem, "export", "bigsrc").stdout_bytes != base["bigsrc"]:
                    failures.append(f"kill {k}: the {command} run again does not complete the session: {again.output[-300:]}")
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(rem, ignore_errors=True)
    print(f"{command}: {total} writing steps, {killed} of {len(points)} runs killed at one"
          + (f" ({partial} left the session in part, completed by running it again)" if partial else "")
          + f", {len(failures)} failure(s)")
    assert killed >= min(len(points), 3), f"only {killed} of {len(points)} runs were killed: the test proved little"
    assert not failures, "\n".join(failures)


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sigkill_in_migrate_loses_no_committed_entry(tmp_path):
    """A store of the earlier layout (fixtures/old_layout.py), its migration killed at spread
    steps: running `migrate --yes` again finishes it, fsck is clean (or healed by repair)
    and every session exports as the migration run whole makes it."""
    pristine = tmp_path / "old"
    subprocess.run([sys.executable, str(REPO / "fixtures" / "old_layout.py"), str(pristine)], check=True,
                   stdout=subprocess.DEVNULL)
    reference = tmp_path / "reference"
    shutil.copytree(pristine, reference, symlinks=True)
    total = steps(reference, ["migrate", "--yes"], tmp_path)
    assert invoke(reference, "fsck").exit_code == 0
    sids = sorted(s["session"] for s in json.loads(invoke(reference, "list", "--json").stdout))
    assert len(sids) >= 4
    want = {sid: invoke(reference, "export", sid).stdout_bytes for sid in sids}
    points = kill_points(total, "kill-migrate")
    failures = []
    killed = 0
    for k in points:
        root = tmp_path / f"k{k}"
        shutil.copytree(pristine, root, symlinks=True)
        killed += run_killed(root, ["migrate", "--yes"], k)
        again = invoke(root, "migrate", "--yes")  # what the operator does next: finish it
        if again.exit_code != 0:
            failures.append(f"kill {k}: migrate again: {again.output[-300:]}")
            continue
        out = heal(root, sids)
        if "0 problem(s)" not in out:
            failures.append(f"kill {k}: fsck after healing: {out[-400:]}")
        got = sorted(s["session"] for s in json.loads(invoke(root, "list", "--json").stdout))
        if got != sids:
            failures.append(f"kill {k}: sessions {got}, not {sids}")
        for sid, data in want.items():
            r = invoke(root, "export", sid)
            if r.stdout_bytes != data:
                failures.append(f"kill {k}: {sid} exports otherwise ({r.output[-200:]})")
        shutil.rmtree(root, ignore_errors=True)
    print(f"migrate: {total} writing steps, {killed} of {len(points)} runs killed at one, {len(failures)} failure(s)")
    assert killed >= min(len(points), 3), f"only {killed} of {len(points)} runs were killed: the test proved little"
    assert not failures, "\n".join(failures)
