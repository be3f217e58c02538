"""A file the process may not read (issue 16).

The suite runs as root, whom no mode stops, so the commands here run as an unprivileged
user (``setpriv`` to uid and gid 65534, no groups) over a copy of the rich store that
user owns, with one file of each kind the store keeps made mode 000. Every command ends
within its time limit without a traceback: it gives the pristine output, or fails in
one line that says permission was denied and names the file; ``fsck`` fails naming it,
or the file is harmless (a summary: an index rebuilt from the log, every read the same).
Skipped with the reason where setpriv is missing or the user cannot run the package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from damage import files_of, invoke

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


#: Runs each command line it is given (JSON on stdin) in this one process, through the
#: command's own entry point (click's runner: a traceback is an exception it reports),
#: and prints each one's exit status, stdout and stderr: one process per file kind
#: instead of one per command.
RUNNER = """
import json, sys
from click.testing import CliRunner
from agentsession_cli.main import main
out = []
for args in json.load(sys.stdin):
    r = CliRunner().invoke(main, args)
    tb = r.exception is not None and not isinstance(r.exception, SystemExit)
    out.append([r.exit_code, r.stdout, r.stderr + ("Traceback: " + repr(r.exception) if tb else "")])
json.dump(out, sys.stdout)
"""


def as_nobody(root: Path, cmds: list[tuple[str, ...]]) -> list[subprocess.CompletedProcess]:
    """Each command run as the unprivileged user, in one process of its own (limited)."""
    # as wide as the suite's own runs (tests/conftest.py), so outputs compare line for line
    env = dict(os.environ, COLUMNS="10000")
    p = subprocess.run([*AS_NOBODY, sys.executable, "-c", RUNNER], capture_output=True, text=True, timeout=120,
                       input=json.dumps([["--store", str(root), *c] for c in cmds]), env=env)
    assert p.returncode == 0, p.stderr[-800:]
    return [subprocess.CompletedProcess(list(c), rc, out, err) for c, (rc, out, err) in zip(cmds, json.loads(p.stdout))]


@pytest.fixture
def nobody_dir():
    """A directory the unprivileged user can reach and owns (tmp_path's parents are 0700)."""
    if os.geteuid() != 0:
        pytest.skip("the suite is not root: a mode-000 file is unreadable to it already, and no other user can be taken")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv(1) is not installed: no way to run a command as an unprivileged user")
    probe = subprocess.run([*AS_NOBODY, sys.executable, "-c", "import agentsession_cli.main"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"uid {NOBODY} cannot run the package here: {probe.stderr.strip()[-200:]}")
    # not under the tests' temp directory (mode 0700, root's): a world-searchable one
    base = next((b for b in ("/dev/shm", "/tmp") if os.path.isdir(b) and os.stat(b).st_mode & 0o001), None)
    if base is None:
        pytest.skip("no world-searchable temporary directory (/dev/shm, /tmp) for the unprivileged user")
    d = Path(tempfile.mkdtemp(prefix="agentsession-unreadable-", dir=base))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def reads(info: dict, kind: str) -> list[tuple[str, ...]]:
    sid = {"mark": "mirror"}.get(kind, "rec")
    return [("fsck",), ("list",), ("show", sid), ("export", sid), ("log", sid), ("head", sid),
            ("cat-object", info["rec"][5]), ("cat-object", info["bigsrc"][7]), ("ref", "show", "chat/one")]


@pytest.mark.slow
def test_a_file_the_process_may_not_read_is_a_clear_error(rich_store, nobody_dir):
    pristine, info = rich_store
    failures: list[str] = []
    tried = clear = same = harmless = 0
    for kind, path in files_of(pristine, info).items():
        if kind in ("log (tail)", "lock"):  # the same file kinds as "log (committed)"; a lock holds nothing
            continue
        root = nobody_dir / "store"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(pristine, root, symlinks=True)
        for dirpath, dirnames, filenames in os.walk(root):
            for n in [*dirnames, *filenames]:
                os.lchown(os.path.join(dirpath, n), NOBODY, NOBODY)
        os.lchown(root, NOBODY, NOBODY)
        target = root / path.relative_to(pristine)
        os.chmod(target, 0)
        rel = str(target.relative_to(root))
        fsck_clean, others_same = False, True
        cmds = reads(info, kind)
        for cmd, r in zip(cmds, as_nobody(root, cmds)):
            tried += 1
            what = f"{kind} ({rel}) unreadable: {' '.join(cmd)} exit {r.returncode}"
            text = r.stdout + r.stderr
            if "Traceback" in text or "internal error" in text:
                failures.append(f"{what}: a traceback: {text[-500:]}")
                continue
            if cmd[0] == "fsck":
                if r.returncode == 0:
                    fsck_clean = True  # harmless only if every read below is the pristine one
                elif rel not in text and target.name not in text:
                    failures.append(f"{what}: fsck does not name the unreadable file: {text[-400:]}")
                else:
                    clear += 1
                continue
            if r.returncode == 0:
                want = invoke(pristine, *cmd)
                if r.stdout != want.stdout:
                    failures.append(f"{what}: output differs from the pristine store's: {r.stdout[-300:]!r}")
                else:
                    same += 1
            else:
                others_same = False
                err = r.stderr.strip().splitlines()
                if len(err) != 1 or "permission denied" not in err[0].lower():
                    failures.append(f"{what}: not one clear line: {r.stderr[-400:]}")
                else:
                    clear += 1
        if fsck_clean and not others_same:
            failures.append(f"{kind} ({rel}) unreadable: fsck exit 0, yet a read fails")
        harmless += fsck_clean and others_same
    print(f"unreadable files: {tried} commands tried, {same} gave the pristine output, {clear} a clear error, "
          f"{harmless} file kind(s) harmless (an index rebuilt from the log), {len(failures)} failure(s)")
    assert not failures, "\n".join(failures)


def test_an_object_missing_beside_a_pack_that_could_not_be_read_says_so(store, monkeypatch):
    """An unreadable pack left its objects "no object X" (issue 16: "an unreadable pack is
    reported as 'no entries object'"), as if lost; the error now names the pack and why.
    Forced: the pack's open raises PermissionError (root reads any mode)."""
    from agentsession_cas.backends.files import packs

    root, info = store

    def denied(self, path, *a, **kw):  # type: ignore[no-untyped-def]
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(packs.Pack, "__init__", denied)
    packed = info["bigsrc"][7]
    r = invoke(root, "cat-object", packed)
    assert r.exit_code == 1
    assert "could not be read" in r.output and "Permission denied" in r.output and "pack-" in r.output, r.output
    j = invoke(root, "cat-object", "--json", packed)
    assert '"no_object"' in j.output
