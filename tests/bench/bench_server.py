#!/usr/bin/env python3
"""Benchmark: the store over HTTP (RFC 0003, issue 12), against same-run baselines.

1. **push over HTTP**: the generated coding-agent session of ``bench_verify.py``
   (``--entries``, 100,000; ``--quick`` 2,000), held as a record, pushed whole to a
   server over an empty store, against the same push to an empty store on this
   machine (``LocalTransport``). Target: HTTP / local <= 2.
2. **appends under a lease over HTTP**: ``--writers`` (16) threads, each with its
   own session and lease, for ``--seconds``. Lazy: each thread a store handle
   (``open_store(url, sync="never")``, the server ``--sync never``) appending as a
   harness does; the handle sends its lazy appends in batches, and the time runs
   until every writer has committed (every acknowledged append is then read back).
   Durable: one ``POST …/entries?commit=true`` per append. Targets: lazy >= 2,000
   appends/s; durable >= half the local durable rate (one process appending with
   ``durable=True`` to a store on the same disk).
3. **follow latency**: a follower on a session while a writer appends with
   ``?commit=true``: the time from sending an append to the follower's frame for
   it. Target: p99 <= 50 ms.

A missed target is a measurement, not a failure (exit 0); 1 when something the
numbers depend on fails. The servers are real processes on loopback.

Run: ``.venv/bin/python tests/bench/bench_server.py [--quick | --entries N] [--writers N] [--seconds S]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

import httpx  # noqa: E402

from agentsession_cas import Header, open_store  # noqa: E402
from agentsession_cas.exchange import push  # noqa: E402
from agentsession_cas.exchange.http_client import HttpTransport, no_delay_transport  # noqa: E402
from agentsession_cas.store import Store  # noqa: E402
from bench_verify import generate  # noqa: E402
from server_helpers import ServerProcess  # noqa: E402


def push_ratio(tmp: Path, entries: int) -> tuple[float, float]:
    data, _, _ = generate(entries, 7)
    src = tmp / "session.jsonl"
    src.write_bytes(data)
    with Store.init(tmp / "a") as a:
        sid = a.import_file(src, record=True).id
    Store.init(tmp / "local").close()
    t0 = time.perf_counter()
    with Store(tmp / "a") as a:
        r = push(a, str(tmp / "local"), sid)
    local = time.perf_counter() - t0
    assert r.entries == entries, r.entries
    Store.init(tmp / "served").close()
    with ServerProcess(tmp / "served") as server:
        t0 = time.perf_counter()
        with Store(tmp / "a") as a:
            r = push(a, HttpTransport(server.url), sid)
        http = time.perf_counter() - t0
        assert r.entries == entries, r.entries
    return local, http


def line(n: int, tag: str) -> bytes:
    return json.dumps({"type": "item", "ts": "2026-09-17T12:00:01Z",
                       "item": {"type": "message", "role": "user", "content": f"{tag} {n}"}}).encode()


def in_threads(writers: int, seconds: float, body: Callable[[int, Callable[[], bool]], int]) -> tuple[list[int], float]:
    """``body(i, running)`` in ``writers`` threads: each sets up, calls ``running()`` (which
    waits until every thread is set up, and is then true for ``seconds``) in its loop and
    returns its count. Returns the counts and the seconds until the last thread ended."""
    counts = [0] * writers
    start = threading.Barrier(writers + 1)
    stop = [time.perf_counter() + 3600]
    failed: list[BaseException] = []

    def work(i: int) -> None:
        waited = [False]

        def running() -> bool:
            if not waited[0]:  # the first call: wait for the others
                start.wait()
                waited[0] = True
            return time.perf_counter() < stop[0]

        try:
            counts[i] = body(i, running)
        except BaseException as exc:
            failed.append(exc)
            start.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    stop[0] = t0 + seconds
    for t in threads:
        t.join()
    if failed:
        raise SystemExit(f"a writer failed: {failed[0]!r}")
    return counts, time.perf_counter() - t0


def lazy_appends(url: str, writers: int, seconds: float) -> float:
    """``writers`` threads, each a store handle of its own (``open_store(url, sync="never")``)
    appending to its own session under its lease as a harness would; the library holds
    lazy appends and sends them in batches. Timed until every writer has committed, and
    every acknowledged append is then read back from the server."""

    def body(i: int, running: Callable[[], bool]) -> int:
        with open_store(url, sync="never") as st:
            s = st.create(Header.new(f"bench-l-{i}", created_at="2026-09-17T12:00:00Z"))
            n = 0
            while running():
                s.append(json.loads(line(n, s.id)))
                n += 1
            s.commit()
            return n

    counts, elapsed = in_threads(writers, seconds, body)
    with open_store(url, readonly=True) as st:
        for i in range(writers):
            held = len(st.read(f"bench-l-{i}"))
            if held != counts[i]:
                raise SystemExit(f"session bench-l-{i}: {counts[i]} appends acknowledged, {held} on the server")
    return sum(counts) / elapsed


def durable_appends(url: str, writers: int, seconds: float) -> float:
    """``writers`` threads appending one entry per ``POST …/entries?commit=true`` (each
    durable before it is answered, so nothing is held), each to its own session."""

    def body(i: int, running: Callable[[], bool]) -> int:
        with httpx.Client(base_url=url.rstrip("/"), timeout=60, transport=no_delay_transport()) as c:
            sid = f"bench-d-{i}"
            c.post("/v1/sessions", json=Header.new(sid, created_at="2026-09-17T12:00:00Z").data).raise_for_status()
            token = str(c.post(f"/v1/sessions/{sid}/lease", json={"ttl_ms": 600_000}).json()["token"])
            n = 0
            while running():
                r = c.post(f"/v1/sessions/{sid}/entries", content=line(n, sid), params={"commit": "true"},
                           headers={"Lease-Token": token})
                if r.status_code != 200 or r.json()["stopped"] is not None:
                    raise SystemExit(f"append refused: {r.text}")
                n += 1
            return n

    counts, elapsed = in_threads(writers, seconds, body)
    return sum(counts) / elapsed


def local_durable(tmp: Path, seconds: float) -> float:
    with Store.init(tmp / "durable") as st:
        s = st.create(Header.new("d", created_at="2026-09-17T12:00:00Z"))
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            s.append(json.loads(line(n, "d")), durable=True)
            n += 1
        return n / (time.perf_counter() - t0)


def follow_latency(url: str, count: int) -> tuple[list[float], list[float]]:
    """(sorted latencies from sending each append to the follower's frame for it, sorted
    round trips of the appends themselves: their commit, an fsync, is inside both)."""
    got: dict[str, float] = {}
    ready = threading.Event()
    with httpx.Client(base_url=url.rstrip("/"), timeout=60, transport=no_delay_transport()) as c:
        c.post("/v1/sessions", json=Header.new("f", created_at="2026-09-17T12:00:00Z").data).raise_for_status()
        token = str(c.post("/v1/sessions/f/lease", json={"ttl_ms": 600_000}).json()["token"])

        def follower() -> None:
            with httpx.Client(base_url=url.rstrip("/"), timeout=httpx.Timeout(60, read=None)) as f, \
                    f.stream("GET", "/v1/sessions/f/follow", headers={"Accept": "application/x-ndjson"}) as r:
                for raw in r.iter_lines():
                    if not raw.strip():
                        continue
                    ev = json.loads(raw)
                    if ev["event"] == "snapshot":
                        ready.set()
                    elif ev["event"] == "appended":
                        got[ev["data"]["entry"]] = time.perf_counter()
                        if len(got) == count:
                            return

        t = threading.Thread(target=follower)
        t.start()
        ready.wait(60)
        sent: dict[str, float] = {}
        trips: list[float] = []
        for n in range(count):
            t0 = time.perf_counter()
            r = c.post("/v1/sessions/f/entries", content=line(n, "f"), params={"commit": "true"},
                       headers={"Lease-Token": token})
            trips.append(time.perf_counter() - t0)
            sent[r.json()["results"][0]["id"]] = t0
        t.join(120)
    return sorted(got[e] - sent[e] for e in sent if e in got), sorted(trips)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--follows", type=int, default=500)
    args = ap.parse_args()
    if args.quick:
        args.entries, args.seconds, args.follows = 2_000, 3.0, 100
    tmp = Path(tempfile.mkdtemp(prefix="bench-server-", dir=ROOT / ".bench-tmp" if (ROOT / ".bench-tmp").is_dir() else None))
    try:
        local, http = push_ratio(tmp, args.entries)
        print(f"push of {args.entries:,} entries: local {local:.2f} s, over HTTP {http:.2f} s: "
              f"ratio {http / local:.2f} (target <= 2)")
        Store.init(tmp / "served-never").close()
        with ServerProcess(tmp / "served-never", extra=("--sync", "never")) as server:
            rate = lazy_appends(server.url, args.writers, args.seconds)
        print(f"lazy appends over HTTP, {args.writers} writers: {rate:,.0f}/s (target >= 2,000)")
        Store.init(tmp / "served-always").close()
        with ServerProcess(tmp / "served-always", extra=("--sync", "always")) as server:
            rate = durable_appends(server.url, args.writers, args.seconds)
        base = local_durable(tmp, args.seconds)
        print(f"durable appends over HTTP, {args.writers} writers: {rate:,.0f}/s; local durable "
              f"{base:,.0f}/s: ratio {rate / base:.2f} (target >= 0.5)")
        Store.init(tmp / "served-follow").close()
        with ServerProcess(tmp / "served-follow", extra=("--sync", "never")) as server:
            lat, trips = follow_latency(server.url, args.follows)
        if len(lat) != args.follows:
            print(f"the follower saw {len(lat)} of {args.follows} appends", file=sys.stderr)
            return 1

        def p99(xs: list[float]) -> float:
            return xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1000

        print(f"follow latency, append sent to frame received: median {statistics.median(lat) * 1000:.1f} ms, "
              f"p99 {p99(lat):.1f} ms (target <= 50); the append's own round trip (its fsync "
              f"included): median {statistics.median(trips) * 1000:.1f} ms, p99 {p99(trips):.1f} ms")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
