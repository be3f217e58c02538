"""A throwaway PostgreSQL server for the tests: initdb into a temporary directory, listening
only on a Unix socket there, stopped and removed at exit.

:func:`shared` starts one per test process on first use (about a second), and every
store the tests make is a schema of its own in one database (:func:`store_url`), which
costs a few milliseconds. A test that kills the server (the crash tests) starts a
:class:`PgServer` of its own. Nothing here skips: where PostgreSQL's binaries are
missing or the server does not start, the test fails and says why (``make test``
installs PostgreSQL where it is missing).

Run as root (CI), initdb refuses to; the server then runs as the ``postgres`` user
(or ``nobody``), in a directory given to it.
"""

from __future__ import annotations

import atexit
import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["PgServer", "pg_bindir", "shared", "store_url", "fresh_schema", "sql"]

DATABASE = "agentsession_test"
USER = "agentsession"
#: Settings for a test server: fast (no fsync: nothing here outlives the machine) unless
#: a test asks for a durable one.
FAST = ("fsync=off", "full_page_writes=off", "synchronous_commit=on")


def pg_bindir() -> Path:
    """Where initdb, pg_ctl and postgres are: PATH, /usr/local/bin, or the newest
    /usr/lib/postgresql/*/bin. RuntimeError (a failure, not a skip) when nowhere."""
    found = shutil.which("initdb")
    if found and os.path.exists(os.path.join(os.path.dirname(found), "pg_ctl")):
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if candidates:
        return Path(candidates[-1]).parent
    raise RuntimeError("PostgreSQL's initdb was not found (PATH, /usr/lib/postgresql/*/bin): `make test` installs it "
                       "(apt-get install postgresql); the PostgreSQL tests need a server")


def _run_as() -> str | None:
    """The user to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root with no postgres or nobody user to run PostgreSQL as")


class PgServer:
    """One PostgreSQL server in a directory of its own, on a Unix socket there."""

    def __init__(self, *, durable: bool = False, settings: tuple[str, ...] = (), base: str | None = None):
        """``durable``: fsync as a production server does, in ``base`` (default /var/tmp),
        for benchmarks; else fast, in memory (/dev/shm) where there is one."""
        self.bindir = pg_bindir()
        if base is None:
            base = "/dev/shm" if not durable and os.access("/dev/shm", os.W_OK) else "/var/tmp"
        # Not under pytest's basetemp: that is root's alone, and the server may be another user.
        self.dir = Path(tempfile.mkdtemp(prefix="agentsession-pg-", dir=base))
        self.data = self.dir / "data"
        self.socket = self.dir
        self.user = _run_as()
        self.settings = (() if durable else FAST) + tuple(settings)
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        os.chmod(self.dir, 0o700)
        self._initdb()
        self.start()
        self._watch()
        self.psql(f"CREATE DATABASE {DATABASE}", db="postgres")

    def _watch(self) -> None:
        """A watchdog that outlives this process by a second at most: a test run killed
        (SIGKILL, or SIGTERM from ``timeout``, which skips atexit) leaves no server
        running and no directory behind. It stops the server whose pid file is there."""
        script = (
            'while kill -0 "$1" 2>/dev/null; do sleep 1; done; '
            'if [ -f "$2/data/postmaster.pid" ]; then kill -QUIT "$(head -n1 "$2/data/postmaster.pid")" 2>/dev/null; '
            'sleep 2; fi; rm -rf "$2"'
        )
        subprocess.Popen(["sh", "-c", script, "pg-watchdog", str(os.getpid()), str(self.dir)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)

    def _cmd(self, args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(args, user=self.user, capture_output=True, text=True, cwd=self.dir, **kw)  # type: ignore[call-overload]
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
        return res

    def _initdb(self) -> None:
        self._cmd([str(self.bindir / "initdb"), "-D", str(self.data), "-U", USER, "-A", "trust", "-E", "UTF8",
                   "--locale=C", "--no-sync"])

    def start(self) -> None:
        opts = ["-k", str(self.socket), "-c", "listen_addresses=", "-c", "max_connections=400",
                "-c", "shared_buffers=64MB"]
        for s in self.settings:
            opts += ["-c", s]
        try:
            self._cmd([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "-l", str(self.dir / "log"),
                       "-o", " ".join(opts), "start"])
        except RuntimeError as exc:
            log = (self.dir / "log").read_text(errors="replace")[-1500:] if (self.dir / "log").exists() else ""
            raise RuntimeError(f"{exc}\nserver log:\n{log}") from None

    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        """Kill the server as a crash would (SIGKILL to the postmaster, then its children)."""
        pid = self.pid()
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        os.kill(pid, signal.SIGKILL)
        for k in kids:
            try:
                os.kill(int(k), signal.SIGKILL)
            except ProcessLookupError:
                pass
        # The next start must find none of them holding the shared memory: wait until
        # every one is gone (a condition, not a delay).
        deadline = time.monotonic() + 30
        for p in [pid, *map(int, kids)]:
            while _alive(p):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL process {p} survived SIGKILL for 30 s")
                time.sleep(0.01)
        # A killed postmaster no process reaps (a container's init may not) stays a zombie
        # whose pid makes the next start believe it runs: its lock files go, as after a reboot.
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        for lock in self.socket.glob(".s.PGSQL.*.lock"):
            lock.unlink(missing_ok=True)

    def stop(self) -> None:
        if self.data.exists() and (self.data / "postmaster.pid").exists():
            subprocess.run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                           user=self.user, capture_output=True, cwd=self.dir)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def psql(self, statement: str, db: str = DATABASE) -> None:
        import psycopg

        with psycopg.connect(self.conninfo(db), autocommit=True) as c:
            c.execute(statement.encode())

    def conninfo(self, db: str = DATABASE) -> str:
        return f"postgresql://{USER}@/{db}?host={self.socket}"

    def store_url(self, schema: str) -> str:
        return f"postgresql://{USER}@/{DATABASE}?host={self.socket}&schema={schema}"


def _alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (a killed child of ours not yet reaped
    is gone for the server's purposes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


_SHARED: PgServer | None = None
_LOCK = threading.Lock()
_COUNTER = itertools.count()


def shared() -> PgServer:
    """The test process's server, started on first use and removed at exit."""
    global _SHARED
    with _LOCK:
        if _SHARED is None:
            _SHARED = PgServer()
            atexit.register(_SHARED.remove)
        return _SHARED


def store_url(name: str) -> str:
    """The URL of a store in its own schema on the shared server (made by ``create=True``)."""
    clean = "".join(ch if ch.isalnum() else "_" for ch in name.lower())
    return shared().store_url(f"t_{clean}"[:63])


def fresh_schema(prefix: str = "s") -> str:
    """A store URL no test used yet in this process."""
    return store_url(f"{prefix}_{os.getpid()}_{next(_COUNTER)}")


def sql(url: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run SQL in the schema of the store at ``url``, as an operator (or damage) would."""
    import psycopg

    from agentsession_cas.backends.postgresql.database import parse_url

    conninfo, schema_name = parse_url(url)
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute(f"SET search_path TO {schema_name}")
        cur = c.execute(statement, params)
        return cur.fetchall() if cur.description is not None else []
