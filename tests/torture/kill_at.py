"""Run the command and SIGKILL it at its N-th writing step (issue 16's crash tests).

``python kill_at.py N COUNT_FILE ARGS...`` runs ``agentsession ARGS...`` in this process
and counts every step that changes the filesystem: an open for writing, a rename or
replace, a remove, a directory made or removed, a truncate, a link (an audit hook), and
each ``os.write`` and ``os.fsync`` (wrapped before the package is imported: the log's
records are written through one descriptor, so its appends are steps too).
At step N (before it happens) the process sends itself SIGKILL: no handler, no cleanup,
no buffered write flushed, as a power cut or the OOM killer would. With N = 0 it kills
nothing and writes the number of steps it counted to COUNT_FILE, so a test can spread
its kills over every step of a run instead of guessing at moments in time.

With ``TORTURE_REMOUNT_RO=MOUNTPOINT`` in the environment, step N remounts that
filesystem read-only instead of killing (the kernel refuses while a file on it is open
for writing: then each later step tries again); the step at which it took is written
to COUNT_FILE (0: never), and the command runs on, to meet the read-only store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
STEPS = {
    "os.rename", "os.replace", "os.remove", "os.unlink", "os.mkdir", "os.rmdir", "os.truncate",
    "os.link", "os.symlink", "shutil.rmtree", "shutil.move",
}


def main() -> None:
    at = int(sys.argv[1])
    count_file = sys.argv[2]
    args = sys.argv[3:]
    seen = 0
    remount = os.environ.get("TORTURE_REMOUNT_RO")
    made_ro = 0
    busy = False

    def hook(event: str, hargs: tuple) -> None:
        nonlocal seen, made_ro, busy
        if busy:
            return
        if event == "open":
            _, mode, flags = hargs
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & WRITE_FLAGS
            )
            if not writing:
                return
        elif event not in STEPS:
            return
        seen += 1
        if remount and at and seen >= at and not made_ro:
            busy = True
            try:
                done = subprocess.run(["mount", "-o", "remount,ro", remount], capture_output=True)
            finally:
                busy = False
            if done.returncode == 0:
                made_ro = seen
        elif seen == at and not remount:
            os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)

    def counted(real):  # type: ignore[no-untyped-def]
        def step(*a):  # type: ignore[no-untyped-def]
            hook("os.write", ())
            return real(*a)
        return step

    for name in ("write", "pwrite", "fsync", "fdatasync"):
        if hasattr(os, name):
            setattr(os, name, counted(getattr(os, name)))
    STEPS.add("os.write")
    from agentsession_cli.main import main as command

    try:
        command(args, prog_name="agentsession", standalone_mode=True)
    finally:
        if at == 0 or remount:
            total = made_ro if remount else seen  # before the open below, which the hook counts too
            busy = True
            with open(count_file, "w") as f:
                f.write(str(total))


if __name__ == "__main__":
    main()
