#!/usr/bin/env python3
"""Benchmark: what the rules' pass over a session file holds at its end, by line.

Generates the ``bench_verify`` session (seeded), writes it to a temporary file, runs
``verify_file`` on it (the pass ``verify FILE`` and ``import FILE`` make) under
tracemalloc, and prints, with the pass's report still alive, what is held: in all and
an entry, then the lines that allocated the most of it (bytes and objects an entry).
A figure of memory, not of time: the machine's load does not move it.

Run: ``.venv/bin/python tests/bench/bench_pass_state.py [--quick | --entries N]
[--seed S] [--top K] [--one-process]``. tests/bench/README.md, session 36.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from agentsession_cas.format.reader import verify_file  # noqa: E402
from bench_verify import DEFAULT_ENTRIES, QUICK_ENTRIES, generate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=DEFAULT_ENTRIES)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_ENTRIES:,} entries")
    ap.add_argument("--seed", type=int, default=20260917, help="generator seed (bench_commands.py's)")
    ap.add_argument("--top", type=int, default=15, help="lines shown")
    ap.add_argument("--one-process", action="store_true", help="the line rules in this process, not the helper")
    args = ap.parse_args(argv)
    count = QUICK_ENTRIES if args.quick else args.entries
    data, _, _ = generate(count, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "session.jsonl"
        path.write_bytes(data)
        del data
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        t = time.process_time()
        report = verify_file(path, objects=False, processes=False if args.one_process else None)
        cpu = time.process_time() - t
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        tracemalloc.stop()
    if not report.ok:
        print("INVALID: the generated session does not verify clean")
        return 1
    n = report.entries
    print(f"pass over {n:,} entries: holds {held / 1e6:.1f} MB at its end, {held / n:.0f} bytes an entry "
          f"(CPU {cpu:.1f} s, traced)")
    for stat in snapshot.statistics("lineno")[: args.top]:
        frame = stat.traceback[0]
        where = frame.filename.split("agentsession_cas/")[-1]
        print(f"  {stat.size / n:7.1f} B {stat.count / n:5.2f} objects an entry  {where}:{frame.lineno}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
