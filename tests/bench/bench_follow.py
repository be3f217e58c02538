#!/usr/bin/env python3
"""Benchmark: what following a stored session costs a poll (``show -f``, session 37).

``exchange.following.follow_store`` polls a store on this machine every 0.1 s. On a
session of ``--entries`` entries (100,000 by default, small user messages appended by
one writer), in this process (the follower on a read-only handle of its own, as another
process has), with the follower's ``sleep`` replaced by a probe that
reads ``time.thread_time()`` and returns at once (the follower's thread: the writer's
background checkpoints and compactions, on threads of their own, are not the
follower's cost, and it starts none), twice: while the writer that made it
still holds it (a recorder writing: its log compacted only every 8 MB it grows, so it
holds up to that much of lines), and after it closed it (its log compacted to a snapshot):

* **idle poll**: the CPU time of one poll that finds nothing new (the median over
  ``--polls`` polls, after the session's entries were all given);
* **poll after an append**: the CPU time of a poll that finds one new entry (the writer,
  or a handle opened for it once the writer closed, appends it durably inside the
  probe, its own CPU time taken out), the median over ``--appends`` of them.

Both are printed with the session's size; the same run on a 1,000-entry session gives
the ratio the target is held to: a poll costs what changed, not the session's size
(target <= 2x; before session 37 a poll read the whole log, so it grew with the session).

Run: ``.venv/bin/python tests/bench/bench_follow.py [--quick | --entries N] [--backend file|memory|postgresql]``.
The exit status is 0 whatever is met, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
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
from agentsession_cas import Header  # noqa: E402
from agentsession_cas.exchange.following import follow_store  # noqa: E402
from agentsession_cas.store import Session, Store  # noqa: E402
from agentsession_cas.store.url import open_store  # noqa: E402

DEFAULT_ENTRIES, QUICK_ENTRIES, SMALL = 100_000, 10_000, 1_000
TARGET = 2.0  # x the same poll on a 1,000-entry session


def _entry(i: int) -> dict:
    return {"type": "item", "ts": "2026-09-17T12:00:00Z",
            "item": {"type": "message", "role": "user", "content": f"turn {i}"}}


def make_store(backend: str, where: str, entries: int) -> tuple[Store, Session]:
    """A store holding session s1 of ``entries`` entries, and its writer, still open."""
    if backend == "file":
        st = Store.init(os.path.join(where, f"st-{entries}"), sync="never")
    elif backend == "memory":
        st = open_store(f"memory:bench-follow-{entries}", create=True)
    else:
        import pg_server

        st = open_store(pg_server.store_url(f"bench_follow_{entries}_{os.getpid()}"), create=True)
    s = st.create(Header.new("s1", created_at="2026-09-17T12:00:00Z"))
    for i in range(entries):
        s.append(_entry(i))
    s.commit()
    return st, s


def follower_of(st: Store) -> Store:
    """Another handle on the store, read-only, as another process following it has: the
    writer's objects not yet checkpointed are only in its log (the file store's payloads)."""
    if st.backend.url.startswith("memory:"):
        return st
    return open_store(st.backend.url, readonly=True)


def measure(st: Store, writer: Session | None, entries: int, polls: int, appends: int) -> tuple[float, float]:
    """(median CPU seconds of an idle poll, of a poll finding one append)."""
    stamps: list[float] = []
    plan: list[str] = []  # what the next probe does: "idle" or "append"
    append_cpu: list[float] = []

    def probe(_interval: float) -> None:
        if plan and plan.pop(0) == "append":
            t = time.thread_time()
            if writer is not None:
                writer.append(_entry(entries), durable=True)
            else:
                with st.session("s1") as s:
                    s.append(_entry(entries), durable=True)
            append_cpu.append(time.thread_time() - t)
        stamps.append(time.thread_time())

    follower = follower_of(st)
    changes = follow_store(follower, "s1", sleep=probe)
    for _ in range(entries):
        next(changes)
    # Idle: the polls between stamps find nothing; the last probe appends so next() returns.
    stamps.clear()
    plan[:] = ["idle"] * polls + ["append"]
    next(changes)
    idle = [b - a for a, b in zip(stamps, stamps[1:])][: polls - 1]
    found = []
    for _ in range(appends):
        stamps.clear()
        append_cpu.clear()
        plan[:] = ["append"]
        t0 = time.thread_time()
        next(changes)
        found.append(time.thread_time() - t0 - append_cpu[0])
    changes.close()
    if follower is not st:
        follower.close()
    return statistics.median(idle), statistics.median(found)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=DEFAULT_ENTRIES)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_ENTRIES:,} entries")
    ap.add_argument("--backend", choices=("file", "memory", "postgresql"), default="file")
    ap.add_argument("--polls", type=int, default=51)
    ap.add_argument("--appends", type=int, default=15)
    args = ap.parse_args()
    entries = QUICK_ENTRIES if args.quick else args.entries
    if entries < 1 or args.polls < 3 or args.appends < 1:
        ap.error("--entries must be positive, --polls at least 3, --appends at least 1")
    print(f"# bench_follow: {agentsession_cas.__file__}, {platform.python_version()}, backend {args.backend}, "
          f"load {os.getloadavg()[0]:.2f}")
    rows: dict[tuple[str, int], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as where:
        for n in (SMALL, entries):
            st, writer = make_store(args.backend, where, n)
            try:
                rows["writer open", n] = measure(st, writer, n, args.polls, args.appends)
                writer.close()
                rows["writer closed", n] = measure(st, None, n + args.appends + 1, args.polls, args.appends)
            finally:
                st.close()
    print(f"{'session':>14}  {'entries':>9}  {'idle poll CPU':>14}  {'poll after an append':>21}")
    for (what, n), (idle, found) in rows.items():
        print(f"{what:>14}  {n:>9,}  {idle * 1e3:>11.3f} ms  {found * 1e3:>18.3f} ms")
    for what in ("writer open", "writer closed"):
        for i, poll in enumerate(("idle poll", "poll after an append")):
            small, big = rows[what, SMALL][i], rows[what, entries][i]
            ratio = big / small if small > 0 else float("inf")
            print(f"{what}, {poll}: {entries:,} / {SMALL:,} entries = {ratio:.2f}x (target <= {TARGET}x): "
                  f"{'MET' if ratio <= TARGET else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
