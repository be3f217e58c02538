#!/usr/bin/env python3
"""Benchmark: what a fork costs, by the depth of its base, on each backend.

Issue 13's brief, second task: a fork should cost what it adds, not its base's
depth. This measures where that stands. A store (a directory, and a PostgreSQL
schema on a throwaway server of its own, ``tests/pg_server.py``) holds the
deterministic benchmark session (``bench_verify.generate``, 100,000 entries by
default) and a session of 10 entries; each run is a child process that opens
the store, forks a session at its head (``Store.fork``) and appends one entry
to the fork (its first append builds the rules' state at the base, or
starts from the origin's), closes it, then opens it again and appends once
more. Each origin is first left as a recorder leaves it (an entry appended,
then closed: the rules' state kept where the backend keeps one). Each child
reports its wall time, CPU time (for PostgreSQL the server's processes' CPU
is added) and peak resident memory; the figure is the
deep session's fork against the 10-entry one's, each the best of ``--repeat``.
No target is set here: the figures say what a fork's depth costs.

Run: ``.venv/bin/python tests/bench/bench_fork.py [--quick | --entries N] [--repeat R]
[--backends files,postgresql]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE), str(HERE.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

import agentsession_cas  # noqa: E402
from agentsession_cas.store.url import open_store  # noqa: E402
from bench_pack import _body, resume_path  # noqa: E402
from bench_postgresql import _server_cpu  # noqa: E402
from bench_verify import SESSION_ID, generate  # noqa: E402

DEFAULT_ENTRIES, QUICK_ENTRIES = 100_000, 10_000
SMALL = 10
BACKENDS = ("files", "postgresql")

#: One fork in a child of its own (its peak memory is its own): open, fork at the head,
#: append one entry, close; prints wall and CPU seconds, and the peak resident bytes.
_CHILD = """
import json, sys, time
sys.path[:0] = [{root!r}]
from agentsession_cas.store.url import open_store
target, origin, fork_id, body = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
t0, c0 = time.perf_counter(), time.process_time()
with open_store(target, sync="never") as st:
    f = st.fork(origin, session_id=fork_id)
    t1, c1 = time.perf_counter(), time.process_time()
    f.append(body)
    f.close()
t2, c2 = time.perf_counter(), time.process_time()
with open_store(target, sync="never") as st:
    f = st.session(fork_id)
    f.append(body)  # (its parent is the head now: another entry)
    f.close()
t3, c3 = time.perf_counter(), time.process_time()
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would be the parent's.
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps([t1 - t0, c1 - c0, t2 - t1, c2 - c1, t3 - t2, c3 - c2, hwm * 1024]))
"""


def fork_once(target: str, origin: str, fork_id: str, body: dict, server=None) -> list[float]:
    """[fork seconds, fork CPU, first append seconds, its CPU, reopen and append seconds, its
    CPU, peak bytes] of one child; the server's CPU (PostgreSQL) is added to the whole, split
    in proportion to the client's."""
    s0 = _server_cpu(server)
    out = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT)), target, origin, fork_id, json.dumps(body)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"a fork failed:\n{out.stderr}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    server_cpu = _server_cpu(server) - s0
    client = got[1] + got[3] + got[5]
    for at in (1, 3, 5):
        got[at] += server_cpu * (got[at] / client if client else 1 / 3)
    return got


def _own_id(data: bytes, n: int) -> bytes:
    """A generated session's bytes under a session id of its own (the generator names one)."""
    header, rest = data.split(b"\n", 1)
    return header.replace(SESSION_ID.encode(), f"01995b2a-0000-7000-8000-0000000000{n:02d}".encode()) + b"\n" + rest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"{QUICK_ENTRIES:,} entries")
    size.add_argument("--entries", type=int, default=None, help=f"entries of the deep session (default {DEFAULT_ENTRIES:,})")
    ap.add_argument("--repeat", type=int, default=3, help="forks of each session; the best is reported")
    ap.add_argument("--seed", type=int, default=20260917, help="generator seed")
    ap.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated subset of {','.join(BACKENDS)}")
    args = ap.parse_args(argv)
    count = QUICK_ENTRIES if args.quick else (args.entries or DEFAULT_ENTRIES)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or any(b not in BACKENDS for b in backends):
        ap.error(f"--backends takes names among {','.join(BACKENDS)}")
    print(f"bench_fork: agentsession-cas {agentsession_cas.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs (shared: times vary)", flush=True)
    deep, entries, leaf = generate(count, args.seed)
    header = deep.split(b"\n", 1)[0] + b"\n"
    # The deep session's path alone, a session of its own: a log with no branch, whose kept
    # state a fork at its head starts from (the deep session's has branches: it cannot).
    linear = _own_id(header + b"".join(e.canonical_line() for e in resume_path(entries, leaf)), 11)
    small = _own_id(generate(SMALL, args.seed + 1)[0], 10)
    sessions = {"deep": deep, "linear": linear, "small": small}
    item = _body(next(e for e in entries if e.type == "item"))
    # An entry body per origin (its own time): the linear origin's path is the deep one's, and
    # the same body on the same parent would be one entry, stored already when the other forks.
    bodies = {label: dict(item, ts=f"2026-12-01T00:00:0{i}Z") for i, label in enumerate(sessions)}
    base = ROOT / ".bench-tmp"
    base.mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-fork-", dir=base)
    os.chmod(tmp, 0o755)
    server = None
    try:
        for backend in backends:
            if backend == "files":
                target = os.path.join(tmp, "files")
            else:
                import pg_server

                server = pg_server.PgServer(durable=True, base=tmp)
                target = server.store_url("forks")
            with open_store(target, create=True, sync="never") as st:
                sids = {name: st.import_bytes(data, source=name, record=True).id for name, data in sessions.items()}
                depth = {name: len(st.read(sid).log_order) + 1 for name, sid in sids.items()}  # (and the recorder's entry)
            with open_store(target, sync="never") as st:
                # Each origin as a recorder leaves it: an entry appended, then let go (its
                # rules' state kept where the backend keeps one, which a fork starts from).
                for label, sid in sids.items():
                    st.session(sid).append(bodies[label])
            print(f"\n{backend}: forks at the head of a session of {count:,} entries (deep: with branches; linear: its "
                  f"path alone) and of one of {SMALL}, each forked, appended to, reopened and appended to in a child "
                  f"process, best of {args.repeat}", flush=True)
            best: dict[str, list[float]] = {}
            for r in range(args.repeat):
                for label, sid in sids.items():
                    got = fork_once(target, sid, f"fork-{label}-{r}-{time.monotonic_ns()}", bodies[label],
                                    server if backend == "postgresql" else None)
                    best[label] = [min(a, b) for a, b in zip(best[label], got)] if label in best else list(got)
            for label, got in best.items():
                t_fork, c_fork, t_app, c_app, t_re, c_re, peak = got
                print(f"  {label:6} {depth[label]:>7,} entries: fork {t_fork:6.2f} s (CPU {c_fork:5.2f}), first append "
                      f"{t_app:6.2f} s (CPU {c_app:5.2f}), reopen and append {t_re:6.2f} s (CPU {c_re:5.2f}), "
                      f"peak {peak / 1e6:6.1f} MB", flush=True)
            s = best["small"]
            for label in ("deep", "linear"):
                d = best[label]
                print(f"  {label} / small: time {(d[0] + d[2] + d[4]) / (s[0] + s[2] + s[4]):.1f}x, "
                      f"CPU {(d[1] + d[3] + d[5]) / (s[1] + s[3] + s[5]):.1f}x, first append and reopen CPU "
                      f"{(d[3] + d[5]) / max(s[3] + s[5], 1e-3):.1f}x, "
                      f"peak memory {d[6] / s[6]:.2f}x ({(d[6] - s[6]) / 1e6:+.1f} MB)", flush=True)
            if server is not None:
                server.remove()
                server = None
    finally:
        if server is not None:
            server.remove()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
