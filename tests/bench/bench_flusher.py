#!/usr/bin/env python3
"""Benchmark: the HTTP store's flusher, many sessions through one store handle (session 36).

1. **one handle, many writers**: ``--writers`` (8) threads share one store handle
   (``open_store(url, sync="never")``, the server ``--sync never``), each appending
   lazily to a session of its own for ``--seconds``, then committing. Printed: appends
   a second, and the CPU per append of this process (``time.process_time``: the
   writers, the flusher's threads and httpx) and of the server (``/proc/<pid>/stat``).
   What the flusher's workers cost next to the one thread it was.
2. **a batch held up**: two sessions through one handle; the server's answer to the
   first one's batch is held back (``--hold`` seconds, as a server's ``Retry-After``
   would hold a retry), and the other's lazy append is timed from its append to its
   batch's answer. With one flusher thread it waited out the hold; now it does not.

Run: ``.venv/bin/python tests/bench/bench_flusher.py [--writers N] [--seconds S] [--hold S] [--runs N]``.
The servers are real processes on loopback; medians of ``--runs`` (3).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

from agentsession_cas import Header, open_store  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402
from server_helpers import ServerProcess  # noqa: E402


def _msg(tag: str, n: int) -> dict:
    return {"type": "item", "ts": "2026-09-17T12:00:01Z",
            "item": {"type": "message", "role": "user", "content": f"{tag} {n}"}}


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def many_writers(server: ServerProcess, writers: int, seconds: float, run: int) -> tuple[float, float, float]:
    """(appends/s, client CPU ms per append, server CPU ms per append)."""
    counts = [0] * writers
    with open_store(server.url, sync="never") as st:
        sessions = [st.create(Header.new(f"w{run}-{i}", created_at="2026-09-17T12:00:00Z")) for i in range(writers)]
        start = threading.Barrier(writers + 1)
        stop = [0.0]

        def work(i: int) -> None:
            s, n = sessions[i], 0
            start.wait()
            while time.perf_counter() < stop[0]:
                s.append(_msg(s.id, n))
                n += 1
            s.commit()
            counts[i] = n

        threads = [threading.Thread(target=work, args=(i,)) for i in range(writers)]
        for t in threads:
            t.start()
        assert server.proc is not None
        cpu0, srv0, t0 = time.process_time(), server_cpu(server.proc.pid), time.perf_counter()
        stop[0] = t0 + seconds
        start.wait()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        cpu, srv = time.process_time() - cpu0, server_cpu(server.proc.pid) - srv0
        for s in sessions:
            s.close()
    total = sum(counts)
    return total / elapsed, cpu / total * 1000, srv / total * 1000


def held_up(server: ServerProcess, hold: float, run: int) -> float:
    """Seconds from the second session's lazy append to its batch's answer while the
    first session's batch waits ``hold`` seconds for its answer."""
    with open_store(server.url, sync="never") as st:
        a = st.create(Header.new(f"a{run}", created_at="2026-09-17T12:00:00Z"))
        b = st.create(Header.new(f"b{run}", created_at="2026-09-17T12:00:00Z"))
        client = st.backend.http._http
        send = client.request
        held, answered = threading.Event(), threading.Event()

        def request(method, url, **kwargs):  # type: ignore[no-untyped-def]
            response = send(method, url, **kwargs)
            if method == "POST" and str(url).endswith(f"/sessions/a{run}/entries") and not held.is_set():
                held.set()
                time.sleep(hold)
            if str(url).endswith(f"/sessions/b{run}/entries"):
                answered.set()
            return response

        client.request = request  # type: ignore[method-assign]
        a.append(_msg("a", 0))
        held.wait(60)
        t0 = time.perf_counter()
        b.append(_msg("b", 0))
        answered.wait(60)
        took = time.perf_counter() - t0
        a.commit()
        b.commit()
        a.close()
        b.close()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--hold", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-flusher-") as tmp:
        Store.init(Path(tmp) / "st").close()
        with ServerProcess(Path(tmp) / "st", extra=("--sync", "never")) as server:
            rows = [many_writers(server, args.writers, args.seconds, run) for run in range(args.runs)]
            waits = [held_up(server, args.hold, run) for run in range(args.runs)]
    rate, cpu, srv = (statistics.median(r[i] for r in rows) for i in range(3))
    print(f"one handle, {args.writers} writers: {rate:,.0f} appends/s; CPU per append: client {cpu:.3f} ms, "
          f"server {srv:.3f} ms (medians of {args.runs}; load {os.getloadavg()[0]:.1f})")
    print(f"a batch held up {args.hold:g} s: another session's lazy append answered after "
          f"{statistics.median(waits) * 1000:,.1f} ms (median of {args.runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
