#!/usr/bin/env python3
"""Benchmark: what a server's follow costs in CPU now that cursors carry a state check
(session 38).

In this process, on a file store session of ``--entries`` entries (100,000 by default,
small user messages, a commit every 100, then closed: compacted), the server's follow
machinery (``server.follow``: ``Tails``, ``load_view``, ``Stream``) is timed by
``time.process_time()``, each the median of ``--runs``:

* **first read**: a server's first read of the session (``Tails.read``: the log read
  whole and, since session 38, its state replayed and its entries hashed);
* **snapshot**: a follow's ``snapshot`` event made (every record's line with its cursor,
  entries inline up to 4 MiB);
* **resume**: a follow resumed from the cursor at the end (the state up to it replayed,
  and since session 38 checked; since session 39 taken as a follower's, whose records
  since the last commit are looked at for a lazy append);
* **append**: what one durable append costs the server's follow machinery: the tail's
  read of it and one stream's ``appended`` event (the median of ``--appends``).

It runs on this tree's ``agentsession_cas``, whatever its API (the cursor's form
changed): run it in two trees to compare. ``.venv/bin/python
tests/bench/bench_follow_cursor.py [--quick | --entries N]``; exit status 0.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
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
from agentsession_cas.server import follow  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402


def _entry(i: int) -> dict:
    return {"type": "item", "ts": "2026-09-17T12:00:00Z", "item": {"type": "message", "role": "user", "content": f"turn {i}"}}


def _cpu(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.process_time()
    fn()
    return time.process_time() - t


def _stream(st: Store, tails: follow.Tails) -> follow.Stream:
    async def run(fn, *args):  # type: ignore[no-untyped-def]
        return fn(*args)

    return follow.Stream(st, "s1", False, False, run, follow.Changes(), tails, 3600.0)


def _resume(stream: follow.Stream, view: follow.LogView, cursor: str) -> None:
    if "back" in inspect.signature(stream.resume).parameters:  # (session 39: a follower's cursor)
        assert stream.resume(cursor, view, back=True)
    elif hasattr(stream, "resume"):  # (session 38)
        assert stream.resume(cursor, view)
    else:
        pos = follow.resume_position(cursor, view)  # type: ignore[attr-defined]
        assert pos is not None
        stream.position, stream.ident = pos, view.ident
    assert stream.since(view) == []


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--appends", type=int, default=50)
    args = ap.parse_args()
    if args.quick:
        args.entries = 10_000
    print(f"agentsession_cas from {os.path.dirname(agentsession_cas.__file__)}; load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="bench-follow-cursor-") as tmp:
        st = Store.init(Path(tmp) / "st", sync="never")
        s = st.create(Header.new("s1", created_at="2026-09-17T12:00:00Z"))
        for i in range(args.entries):
            s.append(_entry(i))
            if i % 100 == 99:
                s.commit()
        s.close()
        s = st.session("s1")
        first, snap, resume = [], [], []
        for _ in range(args.runs):
            tails = follow.Tails(st)
            first.append(_cpu(lambda: tails.read(s)))  # noqa: B023
            view = follow.load_view(st, tails, "s1", False)
            stream = _stream(st, tails)
            frames: list[bytes] = []
            snap.append(_cpu(lambda: frames.append(stream.whole("snapshot", view))))  # noqa: B023
            cursor = json.loads(frames[0])["id"]
            resume.append(_cpu(lambda: _resume(_stream(st, tails), view, cursor)))  # noqa: B023
        tails = follow.Tails(st)
        view = follow.load_view(st, tails, "s1", False)
        stream = _stream(st, tails)
        stream.whole("snapshot", view)
        per_append = []
        for i in range(args.appends):
            s.append(_entry(10**7 + i), durable=True)

            def wake() -> None:
                got = stream.since(follow.load_view(st, tails, "s1", False))
                assert any(b"appended" in x for x in got)

            per_append.append(_cpu(wake))
        s.close()
        st.close()
    ms = 1000.0
    print(f"{args.entries:,} entries, median of {args.runs} (append: of {args.appends}), CPU ms:")
    print(f"  first read {statistics.median(first) * ms:9.1f}")
    print(f"  snapshot   {statistics.median(snap) * ms:9.1f}")
    print(f"  resume     {statistics.median(resume) * ms:9.1f}")
    print(f"  append     {statistics.median(per_append) * ms:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
